"""Every model's flops_per_token (train.py's MFU, bench/speed.py's FLOP ratios) against torch's own count of one
training step: torch.utils.flop_counter.FlopCounterMode over forward + backward, with a full memory (detached, as
train.py's default bptt_segments=1), per token.

The counter sees every matrix product, convolution and attention kernel that autograd runs. flops_per_token counts
what runs once per token or once per stream; one thing it leaves out by design is W_{k,R} projecting R, which
runs once per batch for all its streams (4 FLOPs a multiply-add: R has no gradient), and which this test adds
back. Biases, norms and elementwise work are no matrix products and are in neither count."""

import dataclasses

import pytest
import torch

import train
from _model_tests import flop_counter

B = 8          # streams


def import_or_skip(name):
    if name not in train.available_models():
        pytest.skip(f"model_{name}.py is not in the repository")
    return train.import_model(name)
SIZE = dict(vocab_size=64, n_layer=2, n_head=2, n_embd=32, d_head=16, d_inner=64, seg_len=16,
            dropout=0.0, dropatt=0.0)

CASES = {   # name: (model file, Config fields)
    'xl_no_memory': ('xl', dict(mem_len=0)),
    'xl': ('xl', dict(mem_len=32)),
    'xl_manual_attention': ('xl', dict(mem_len=32, attn_kernel='einsum')),
    'lamemo': ('lamemo', dict(n_layer=3, mem_len=32)),
    'compressive': ('compressive', dict(mem_len=16, cmem_len=16, compression_rate=2)),
    'compressive_no_recon': ('compressive', dict(mem_len=16, cmem_len=16, compression_rate=2, recon_loss='none')),
    'compressive_no_cmem': ('compressive', dict(mem_len=16, cmem_len=0, recon_loss='none')),
    'infini_linear': ('infini', dict(memory_update='linear')),
    'infini_delta': ('infini', dict(memory_update='delta')),
    'infformer': ('infformer', dict(mem_len=16, n_basis=32, n_samples=24, basis_widths='0.05,0.1')),
    'infformer_sticky': ('infformer', dict(mem_len=16, n_basis=32, n_samples=24, basis_widths='0.05,0.1',
                                           sticky=True)),
    'infformer_no_gate': ('infformer', dict(mem_len=16, n_basis=32, n_samples=24, basis_widths='0.05,0.1',
                                            cnn_gate=False)),
    'infformer_bounded': ('infformer', dict(mem_len=16, n_basis=32, n_samples=24, basis_widths='0.05,0.1',
                                            unbounded=False)),
    'infformer_stm_only': ('infformer', dict(mem_len=16, n_basis=32, n_samples=24, basis_widths='0.05,0.1',
                                             ltm=False)),
    'gpt2': ('gpt2', dict(n_positions=16)),            # GPT-2 alone: SIZE's d_head, d_inner, dropatt are not its
}


def r_projection(name, config):
    """FLOPs per token of W_{k,R} R, once per batch: K distances per layer (LaMemo: also the M look-ahead distances
    of every layer but the last); forward and the weight's gradient."""
    c = config
    if not hasattr(c, 'mem_len'):
        return 0
    K = c.mem_len + getattr(c, 'cmem_len', 0) + c.seg_len
    positions = c.n_layer * K + ((c.n_layer - 1) * c.mem_len if name == 'lamemo' else 0)
    return 4 * positions * c.n_embd * c.n_head * c.d_head / (B * c.seg_len)


def counted_per_token(model, segments=4):
    """FlopCounterMode's count of one training step after `segments` steps filled the memory, per token."""
    c = model.config
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, c.vocab_size, (B, (segments + 1) * c.seg_len + 1), generator=g)
    memory = model.init_memory(B, 'cpu')
    with torch.no_grad():
        for s in range(segments):
            _, _, memory, _ = model(idx[:, s * c.seg_len:(s + 1) * c.seg_len], memory)
    x = idx[:, segments * c.seg_len:(segments + 1) * c.seg_len]
    y = idx[:, segments * c.seg_len + 1:(segments + 1) * c.seg_len + 1]
    counter = flop_counter()
    with counter:
        model(x, memory, targets=y)[1].backward()
    return counter.get_total_flops() / (B * c.seg_len)


@pytest.mark.parametrize('case', list(CASES))
def test_flops_per_token_matches_torch_flop_counter(case):
    name, fields = CASES[case]
    module = import_or_skip(name)
    torch.manual_seed(0)
    known = {f.name for f in dataclasses.fields(module.Config)}
    model = module.Model(module.Config(**{k: v for k, v in {**SIZE, **fields}.items() if k in known})).train()
    counted = counted_per_token(model) - r_projection(name, model.config)
    assert model.flops_per_token() == pytest.approx(counted, rel=1e-6), case


def test_the_counter_sees_the_memory():
    """The check above can fail: counted with twice the memory, XL's step grows by what flops_per_token(mem_len)
    says, and not by what the old count (every memory key and value at 6 FLOPs a multiply-add) said."""
    module = import_or_skip('xl')
    torch.manual_seed(0)
    small, large = (module.Model(module.Config(**{**SIZE, 'mem_len': m})).train() for m in (16, 32))
    grown = (counted_per_token(large) - r_projection('xl', large.config)
             - counted_per_token(small) + r_projection('xl', small.config))
    assert grown == pytest.approx(large.flops_per_token() - small.flops_per_token(), rel=1e-3)
    c = small.config
    old_count = 6 * c.n_layer * (3 * c.n_head * c.d_head + 2 * c.n_embd * c.n_head * c.d_head / c.seg_len) * 16
    assert grown != pytest.approx(old_count, rel=0.05)
