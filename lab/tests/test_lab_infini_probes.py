"""
lab/model_infini_probes.py: Infini-attention with the memory's feature map σ(s x), an ablation outside the paper.
The paper model's tests are tests/test_infini.py; its slow per-token reference (naive_layer) takes s too.
"""

from dataclasses import dataclass

import pytest
import torch

import configurator
import model_infini
from _model_tests import F64, V, run_segments, tokens
from lab import model_infini_probes
from test_infini import assert_layers_equal_naive_reference


def make_probe(seed=0, **overrides):
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4)
    fields.update(overrides)
    torch.manual_seed(seed)
    return model_infini_probes.Model(model_infini_probes.Config(**fields)).to(F64).eval()


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_layer_equals_naive_reference_with_scaled_features(rule):
    """With feature_scale s = 3 every layer, every segment equals the slow reference reading and writing with
    σ(s q), σ(s k)."""
    model = make_probe(memory_update=rule, feature_scale=3.0)
    assert_layers_equal_naive_reference(model, rule, pre_lnorm=False, feature_scale=3.0)


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_scale_one_is_the_paper_model_bit_for_bit_and_three_is_not(rule):
    """Same seed: the same weights as model_infini.py's Model; at s = 1 the same logits and memory to the bit."""
    torch.manual_seed(0)
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, seg_len=4, memory_update=rule)
    paper = model_infini.Model(model_infini.Config(**fields)).eval()
    idx = tokens(2, 12)
    expected, memory = run_segments(paper, idx, paper.init_memory(2, 'cpu'), 4)
    for s, same in ((1.0, True), (3.0, False)):
        torch.manual_seed(0)
        probe = model_infini_probes.Model(model_infini_probes.Config(**fields, feature_scale=s)).eval()
        assert all(torch.equal(a, b) for a, b in zip(paper.state_dict().values(), probe.state_dict().values()))
        logits, probe_memory = run_segments(probe, idx, probe.init_memory(2, 'cpu'), 4)
        assert (torch.equal(logits, expected) and torch.equal(probe_memory.M, memory.M)) == same


def test_attention_exposes_its_feature_scale():
    """Every layer's attention says its s (a checkpoint's reader need not reparse the config)."""
    model = make_probe(feature_scale=2.5)
    assert [layer.attn.feature_scale for layer in model.layers] == [2.5, 2.5]


@pytest.mark.parametrize('bad', [0.0, -1.0, float('inf'), float('nan')])
def test_config_rejects_bad_feature_scale(bad):
    with pytest.raises(ValueError):
        model_infini_probes.Config(feature_scale=bad)


def test_flag_selects_the_probe_and_the_paper_model_has_none():
    """--model=infini_probes finds lab/model_infini_probes.py and its flag; model_infini.py has no such flag."""
    _, module, config, _ = configurator.parse_args(['--model=infini_probes', '--feature_scale=4'], Flags)
    assert module is model_infini_probes and config.feature_scale == 4.0
    with pytest.raises(configurator.UserError):
        configurator.parse_args(['--model=infini', '--feature_scale=4'], Flags)


@dataclass
class Flags:
    """A script's flags: --model only."""
    model: str = 'infini'
