"""bench/vs_authors.py on a stand-in for an authors' checkout (their code is not in the repository): the edits are
made to what is loaded and not to the checkout, a checkout of another commit is a one-line error, and a run writes
both models' speeds."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))
import vs_authors  # noqa: E402

# A kimiyoung-like checkout: both lines vs_authors.EDITS changes fail on a CPU build of torch 2.x as written.
SOFTMAX = """import torch
CUDA_MAJOR = int(torch.version.cuda.split('.')[0])
"""
MODEL = """import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
sys.path.append('utils')
from proj_adaptive_softmax import CUDA_MAJOR


class MemTransformerLM(nn.Module):
    def __init__(self, n_token, n_layer, n_head, d_model, d_head, d_inner, dropout, dropatt, tgt_len=None,
                 mem_len=None, ext_len=None, cutoffs=(), **kwargs):
        super().__init__()
        self.emb, self.out, self.mem_len = nn.Embedding(n_token, d_model), nn.Linear(d_model, n_token), mem_len

    def forward(self, data, target, *mems):                  # (T, B) tokens, as theirs
        h = self.emb(data)
        mask = torch.ones(h.size(0), h.size(0)).byte()        # uint8: masked_fill refuses it since torch 2.0
        h = h + torch.zeros(h.size(0), h.size(0)).masked_fill(mask, 0.0).sum() + (mems[0].mean() if mems else 0)
        loss = F.cross_entropy(self.out(h).flatten(0, 1), target.flatten(), reduction='none').view_as(target)
        return [loss, h.detach()[-self.mem_len:]]
"""
TINY = ['--vocab=32', '--n_layer=1', '--n_embd=16', '--n_head=2', '--d_head=8', '--d_inner=16', '--seg_len=8',
        '--mem_len=8', '--n_basis=8', '--batch_size=2', '--warmup=3', '--rounds=2']


def checkout(tmp_path, model=MODEL):
    (tmp_path / 'xl' / 'pytorch' / 'utils').mkdir(parents=True)
    (tmp_path / 'xl' / 'pytorch' / 'utils' / 'proj_adaptive_softmax.py').write_text(SOFTMAX)
    (tmp_path / 'xl' / 'pytorch' / 'mem_transformer.py').write_text(model)
    return tmp_path / 'xl'


def test_times_the_authors_model_beside_ours_with_the_edits_made_in_memory_only(tmp_path):
    repo = checkout(tmp_path)
    out = tmp_path / 'vs.json'
    vs_authors.main([f'--xl_repo={repo}', f'--out={out}'] + TINY)
    r = json.loads(out.read_text())['results']['xl']
    theirs, mine = r['authors']['eager'], r['nanomem']['eager']
    assert theirs['tokens_per_s'] > 0 and mine['tokens_per_s'] > 0 and len(theirs['step_s']) == 2
    assert r['ratio']['eager'] == pytest.approx(mine['tokens_per_s'] / theirs['tokens_per_s'])
    assert theirs['parameters'] == 2 * 32 * 16 + 32               # the stand-in's embedding and output layer
    assert (repo / 'pytorch' / 'mem_transformer.py').read_text() == MODEL   # the checkout is not changed
    assert 'mem_transformer' not in sys.modules and 'proj_adaptive_softmax' not in sys.modules


def test_the_loaded_file_is_edited_and_each_edit_is_needed(tmp_path):
    module = vs_authors.load_authors('xl', checkout(tmp_path), 'cpu')
    model = module.MemTransformerLM(32, 1, 2, 16, 8, 16, 0.0, 0.0, mem_len=4)
    loss = model(torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, 2, dtype=torch.long))[0]
    assert loss.shape == (4, 2)
    with pytest.raises(RuntimeError):                             # unedited, the uint8 mask fails
        torch.zeros(2, 2).masked_fill(torch.ones(2, 2).byte(), 0.0)


@pytest.mark.parametrize('make, message', [
    (lambda tmp: tmp / 'empty', 'no folder pytorch/'),
    (lambda tmp: checkout(tmp, MODEL.replace('.byte()', '.bool()')), "expected '.byte()' to edit"),
])
def test_a_checkout_that_is_not_the_named_commit_is_a_one_line_error(tmp_path, capsys, make, message):
    repo = make(tmp_path)
    repo.mkdir(exist_ok=True)
    with pytest.raises(SystemExit) as e:
        vs_authors.main([f'--xl_repo={repo}', f'--out={tmp_path / "x.json"}'] + TINY)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_an_import_that_turns_on_anomaly_mode_is_refused(tmp_path):
    repo = checkout(tmp_path, MODEL + '\ntorch.autograd.set_detect_anomaly(True)\n')
    try:
        with pytest.raises(vs_authors.UserError, match='anomaly mode'):
            vs_authors.load_authors('xl', repo, 'cpu')
    finally:
        torch.autograd.set_detect_anomaly(False)


def test_bad_settings_are_one_line_errors(tmp_path, capsys):
    for flag, message in (('--warmup=2', 'warmup must be >= 3'), ('--n_embd=24', 'n_embd must equal'),
                          ('--modes=eager,fast', "unknown mode 'fast'"),
                          ('--xl_repo=', 'nothing to time')):
        with pytest.raises(SystemExit):
            vs_authors.main([flag, f'--out={tmp_path / "x.json"}'])
        assert message in capsys.readouterr().err
