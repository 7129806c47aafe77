"""
lab/ltm_resolution.py (how much of one token the ∞-former's LTM holds k writes later): its simulated write is the
model's own (LongTermMemory.write with the gate off, step by step), the positions it reads at are where the
unbounded update puts the tokens, and the measures behave: a sharp, dense basis identifies the newest tokens, the
σ² floor 1e-4 blurs what 1e-6 resolves, and identification falls with depth.
"""

import dataclasses

import pytest
import torch

import model_infformer as mif
from lab import ltm_resolution


def small_config(**kw):
    fields = dict(vocab_size=2, n_layer=1, n_head=2, n_embd=8, d_head=4, d_inner=16, seg_len=6, mem_len=6,
                  n_basis=24, n_samples=10, basis_widths='0.02,0.05', tau=0.6, ridge_lambda=0.5, cnn_gate=False)
    fields.update(kw)
    return mif.Config(**fields)


def test_write_signal_is_the_models_write():
    """Three writes of L vectors through LongTermMemory.write (gate off) give write_signal's B."""
    config = small_config()
    model = mif.Model(config).double()
    L, C = config.seg_len, config.n_embd
    g = torch.Generator().manual_seed(0)
    segments = [torch.randn(L, C, generator=g, dtype=torch.float64) for _ in range(3)]
    memory = model.init_memory(1, 'cpu')
    B = memory.ltm_B[0]
    for i, x in enumerate(segments):
        mem = torch.zeros_like(memory.mem)
        mem[0, 0, :L] = x
        memory = dataclasses.replace(memory, mem=mem, ltm_B=B[None])
        due = mif.LTMWrite(rows=torch.tensor([True]), slots=torch.arange(L)[None], grow=torch.tensor([i > 0]),
                           written=torch.tensor([(i + 1) * L]))
        B = model.long_term.write(0, memory, due, gated=lambda v: v)
    expected, positions, _ = ltm_resolution.write_signal(config, segments)
    torch.testing.assert_close(B[0], expected, rtol=1e-5, atol=1e-6)           # the model keeps float32 buffers
    t_first, t_unbounded = mif.ridge_positions(config)
    torch.testing.assert_close(positions[0], t_first * config.tau ** 2)
    torch.testing.assert_close(positions[1], t_unbounded[config.n_samples:] * config.tau)
    torch.testing.assert_close(positions[2], t_unbounded[config.n_samples:])


def test_measures():
    sharp = small_config(seg_len=16, n_basis=512, n_samples=512, basis_widths='0.002,0.004', tau=0.75,
                         ridge_lambda=1.0)
    rows = ltm_resolution.measure(sharp, depths=3, dim=32, trials=2, floors=[1e-4, 1e-6])
    assert rows[0]['recon_cos'] > 0.99 and rows[0]['identified@1e-06'] == 1.0
    assert rows[0]['rbf_per_token'] == pytest.approx(0.25 / 16 * 255)
    assert rows[0]['chance'] == pytest.approx(1 / (5 * 16))
    blurred = small_config(seg_len=64, n_basis=150, n_samples=150, basis_widths='0.005,0.01', tau=0.5)
    rows = ltm_resolution.measure(blurred, depths=4, dim=64, trials=2, floors=[1e-4, 1e-6])
    assert rows[0]['identified@0.0001'] < 0.9 < rows[0]['identified@1e-06']    # the floor, not the write, blurs
    ident = [rows[k]['identified@1e-06'] for k in range(5)]
    assert ident[0] > ident[2] > ident[4]


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    from _train_util import assert_bad_input_is_one_line
    assert_bad_input_is_one_line('lab/ltm_resolution.py', ltm_resolution.main, [f'--out={tmp_path}/x.json'], [
        (['--setting=nope'], 'setting'), (['--n_basis=63'], 'n_basis'), (['--floors=a'], 'floors'),
        (['--depths=0'], 'depths'), (['--tau=a'], 'tau'), (['--tau=1.5'], 'tau')], capsys)


def test_tau_sweep_trades_near_depths_for_far_ones(tmp_path):
    """--tau replaces the setting's τ, one result per (N, τ): a segment k writes back spans (1 - τ) τ^k of [0, 1], so
    a larger τ reconstructs the newest segment worse and one many writes back better."""
    import json
    out = tmp_path / 'tau.json'
    ltm_resolution.main(['--setting=sharp', '--n_basis=256', '--tau=0.6,0.9', '--depths=8', '--trials=1',
                         '--floors=1e-6', '--dim=32', f'--out={out}'])
    results = json.loads(out.read_text())['results']
    assert set(results) == {'sharp/N256/tau0.6', 'sharp/N256/tau0.9'}
    low, high = (results[f'sharp/N256/tau{t}'] for t in ('0.6', '0.9'))
    assert low['fields']['tau'] == 0.6 and high['fields']['tau'] == 0.9
    assert low['depths']['0']['recon_cos'] > high['depths']['0']['recon_cos']
    assert low['depths']['8']['recon_cos'] < high['depths']['8']['recon_cos']
