"""lab/recipe_probe.py: Infini's gates are sigmoid(β) as trained, and the ∞-former's LTM loudness is the RMS ratio of
the read Z_LTM to Z_T, zero when the read's output projection is zero."""

import json

import pytest
import torch

import train
from _gpt2_util import write_gpt2_dataset
from _train_util import flags
from lab import recipe_probe

SMALL = dict(n_layer=2, n_head=2, n_embd=16, n_positions=16, seg_len=8)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    return write_gpt2_dataset(tmp_path_factory.mktemp('data'))


def test_infini_gates_and_infformer_loudness(data, tmp_path, capsys):
    infini, infformer = tmp_path / 'infini', tmp_path / 'infformer'
    train.train(flags(data, infini, dict(model='infini_gpt2', gate_init=-2.0, **SMALL), max_iters=2))
    train.train(flags(data, infformer, dict(model='infformer_gpt2', n_basis=4, n_samples=4, **SMALL), max_iters=2))
    capsys.readouterr()
    recipe_probe.main([f'--runs={infini},{infformer}', '--segments=4', '--batch_size=2',
                       f'--out={tmp_path / "r.json"}'])
    lines = capsys.readouterr().out.strip().splitlines()[:2]
    written = json.loads((tmp_path / 'r.json').read_text())['runs']
    assert [json.loads(line.split(' ', 1)[1]) for line in lines] == list(written.values())
    assert lines[0].startswith(f'{infini} ') and lines[1].startswith(f'{infformer} ')
    gates = json.loads(lines[0].split(' ', 1)[1])['gate_mean_min_max']
    beta = train.load_checkpoint(infini / 'ckpt.pt')['model']['transformer.h.1.attn.beta']
    assert gates[1] == pytest.approx([torch.sigmoid(beta).mean().item(), torch.sigmoid(beta).min().item(),
                                      torch.sigmoid(beta).max().item()])
    assert 0.05 < gates[0][0] < 0.3                              # near sigmoid(-2) = 0.12 after 2 steps
    loud = json.loads(lines[1].split(' ', 1)[1])['ltm_rms_over_attention_rms']
    assert len(loud) == 2 and all(x > 0 for x in loud)
    _, _, model = train.model_from_checkpoint(train.load_checkpoint(infformer / 'ckpt.pt'))
    for block in model.transformer.h:
        torch.nn.init.zeros_(block.attn.ltm.o_net.weight)         # a silent read
    tokens = recipe_probe.load_split(data, 'validation')
    assert recipe_probe.ltm_loudness(model.eval(), tokens, 8, 4, 2) == [0.0, 0.0]
