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


# A deep-spin/infinite-former-like finetune_gpt2/: a file of their transformers 4.5 package (relative imports of
# it), with each line vs_authors.EDITS changes, and the GPT-2 names copy_gpt2_weights maps.
GPT2_FILES = {
    'basis_functions.py': 'import torch\n',
    'continuous_softmax.py': 'import torch\n',
    'continuous_sparsemax.py': 'import torch\ntorch.autograd.set_detect_anomaly(True)\n',
    'configuration_gpt2.py': """from ...configuration_utils import PretrainedConfig


class GPT2Config(PretrainedConfig):
    def __init__(self, vocab_size=50257, n_embd=768, long_term_attention=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.n_embd, self.long_term_attention = vocab_size, n_embd, long_term_attention
""",
    'long_term_attention.py': """import torch.nn as nn
from entmax import Sparsemax
from .continuous_softmax import torch


class LongTermAttention(nn.Module):
    def __init__(self, length, target_len, attn_num_basis, n_embd, **kwargs):
        super().__init__()
        self.device = 'cuda'
        self.mem_threshold=2048
        self.nb_samples=512
        self.length, self.target_len = length, target_len
        self.proj_query = nn.Linear(n_embd, n_embd, bias=False)       # built, never read (as theirs)
        self.mu = nn.Linear(attn_num_basis, 1, bias=False)
""",
    'modeling_gpt2.py': """from functools import partial
import torch
import torch.nn as nn
from ...activations import ACT2FN
from ...file_utils import add_start_docstrings
from ...modeling_outputs import CausalLMOutputWithCrossAttentions
from ...modeling_utils import Conv1D, PreTrainedModel
from .configuration_gpt2 import GPT2Config
from .long_term_attention import LongTermAttention


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = Conv1D(3 * config.n_embd, config.n_embd)
        self.long_term_attention = partial(LongTermAttention, attn_num_basis=config.long_term_attention_basis,
                                           length=512,
                                           target_len=512, n_embd=config.n_embd,
                                           sticky_memories=config.sticky_memories,
                                           )()


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = Attention(config)


class GPT2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.h = nn.ModuleList([Block(config)])

    def get_input_embeddings(self):
        return self.wte


@add_start_docstrings('a docstring')
class GPT2LMHeadModel(PreTrainedModel):
    base_model_prefix = 'transformer'

    def __init__(self, config):
        super().__init__(config)
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.init_weights()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, Conv1D, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, labels=None):
        h = self.transformer.wte(input_ids)
        h = ACT2FN['gelu_new'](h + self.transformer.h[0].attn.c_attn(h)[..., :h.size(-1)])
        logits = self.lm_head(h)
        loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutputWithCrossAttentions(loss=loss, logits=logits), None
""",
}
GPT2_TINY = ['--gpt2_overrides=vocab_size=64,n_layer=1,n_embd=16,n_head=2,n_positions=8,seg_len=8,n_basis=16,'
             'n_samples=16,ltm_reset_len=24', '--batch_size=2', '--warmup=3', '--rounds=2']


def gpt2_checkout(tmp_path):
    folder = tmp_path / 'infinite-former' / 'finetune_gpt2' / 'src' / 'transformers' / 'models' / 'gpt2'
    folder.mkdir(parents=True)
    for name, text in GPT2_FILES.items():
        (folder / name).write_text(text)
    return tmp_path / 'infinite-former'


def test_the_gpt2_pair_loads_their_transformers_package_and_gets_our_size_and_weights(tmp_path):
    repo = gpt2_checkout(tmp_path)
    cfg = vs_authors.VsAuthorsConfig(infformer_gpt2_repo=str(repo), gpt2_overrides=GPT2_TINY[0].split('=', 1)[1])
    module = vs_authors.load_authors('infformer_gpt2', repo, 'cpu')
    theirs, mine = vs_authors.authors('infformer_gpt2', module, cfg), vs_authors.ours('infformer_gpt2', cfg)
    ltm = theirs.transformer.h[0].attn.long_term_attention
    assert (ltm.device, ltm.mem_threshold, ltm.nb_samples, ltm.length, ltm.target_len) == ('cpu', 24, 16, 8, 8)
    assert theirs.lm_head.weight is theirs.transformer.wte.weight             # tied, as transformers 4.5 ties
    copied = vs_authors.copy_gpt2_weights(theirs, mine)
    assert set(copied) == {'transformer.wte.weight', 'transformer.h.0.attn.c_attn.weight',
                           'transformer.h.0.attn.c_attn.bias', 'transformer.h.0.attn.ltm.mu_affine.weight'}
    assert torch.equal(mine.transformer.wte.weight, theirs.transformer.wte.weight)
    assert torch.equal(mine.transformer.h[0].attn.c_attn.weight, theirs.transformer.h[0].attn.c_attn.weight.t())
    assert not torch.is_anomaly_enabled() and 'authors_transformers' not in sys.modules


def test_times_the_authors_gpt2_beside_ours(tmp_path, capsys):
    repo, out = gpt2_checkout(tmp_path), tmp_path / 'vs.json'
    vs_authors.main([f'--infformer_gpt2_repo={repo}', f'--out={out}'] + GPT2_TINY)
    result = json.loads(out.read_text())
    r = result['results']['infformer_gpt2']
    assert r['authors']['eager']['tokens_per_s'] > 0 and r['nanomem']['eager']['tokens_per_s'] > 0
    assert result['size']['gpt2']['seg_len'] == 8 and result['size']['gpt2']['n_basis'] == 16
    folder = repo / 'finetune_gpt2' / 'src' / 'transformers' / 'models' / 'gpt2'
    assert all((folder / n).read_text() == t for n, t in GPT2_FILES.items())   # the checkout is not changed
    with pytest.raises(SystemExit):
        vs_authors.main([f'--infformer_gpt2_repo={repo}', '--gpt2_overrides=dropout=1'])
    assert "gpt2_overrides: 'dropout' is not one of" in capsys.readouterr().err
