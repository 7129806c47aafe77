"""
rel_attention_triton.py (attn_kernel='triton') against the einsum reference, forward and backward.

Without a GPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets before
anything imports triton): float32 within ~1e-5 of the reference, kernel by kernel and in every model that has the flag.
On a CUDA machine those cases skip and the GPU cases run the compiled kernels in bf16. Where triton is not installed,
only the Config checks run.
"""

import importlib
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from _model_tests import V, assert_greedy_generate_matches_forward, tokens
import model_compressive
import model_infformer
import model_lamemo
import model_xl
from model_xl import rel_shift

CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec('triton') is not None
kernel = importlib.import_module('rel_attention_triton') if HAS_TRITON else None   # interpreted without a GPU

NO_TRITON = 'triton is not installed (CUDA builds of torch ship it; requirements-test.txt for the interpreter)'
interpreted = pytest.mark.skipif(kernel is None or not kernel.INTERPRETED, reason=NO_TRITON if kernel is None else
                                 'interpreter cases: on a CUDA machine the GPU cases run instead')
on_gpu = pytest.mark.skipif(kernel is None or kernel.INTERPRETED or not CUDA,
                            reason=NO_TRITON if kernel is None else 'compiled kernels need a GPU')


def reference(q, u, vb, k, v, r_k, attn_mask, scale):
    """The einsum path of model_xl.py's RelMultiHeadAttn, in the inputs' dtype, with the log-sum-exp."""
    BD = rel_shift(torch.einsum('bhid,hjd->bhij', q + vb[:, None], r_k))
    score = (torch.einsum('bhid,bhjd->bhij', q + u[:, None], k) + BD) * scale
    score = score.masked_fill(~attn_mask, float('-inf'))
    return torch.einsum('bhij,bhjd->bhid', torch.softmax(score, -1), v), torch.logsumexp(score, -1)


def attn_mask(B, T, M, key_valid_from=None, window=None):
    """model_xl.py's mask: causal with M memory slots, the first key_valid_from[b] keys of row b invalid, and with
    window (same_length) distance < window."""
    i, j = torch.arange(T)[:, None], torch.arange(M + T)[None]
    allowed = (M + i - j >= 0) & ((M + i - j < window) if window else True)
    valid = torch.ones(B, M + T, dtype=torch.bool)
    for b, n in enumerate(key_valid_from or []):
        valid[b, :n] = False
    return (allowed[None] & valid[:, None])[:, None]             # (B, 1, T, K)


def inputs(B, H, T, M, D, dtype=torch.float32, device='cpu', seed=0):
    """q, u, v, k, v, r_k with the scale of a trained layer (entries ~1); q, k, v as the models' views of (B, T, H, D)
    (and r_k of (K, H, D)), whose strides differ from one another."""
    g = torch.Generator().manual_seed(seed)
    K = M + T
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)
    return [randn(B, T, H, D).transpose(1, 2), randn(H, D), randn(H, D), randn(B, K, H, D).transpose(1, 2),
            randn(B, K, 2 * H, D)[:, :, H:].transpose(1, 2), randn(K, H, D).transpose(0, 1)]


def outputs_and_grads(fn, leaves, mask, scale, seed=1):
    """fn's (out, lse) and the gradients of a random linear function of both w.r.t. leaves (q, u, v, k, v, r_k)."""
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    out, lse = fn(*leaves, mask, scale)
    g = torch.Generator().manual_seed(seed)
    w_out = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
    w_lse = torch.randn(lse.shape, generator=g, dtype=torch.float64).to(lse)
    finite = torch.isfinite(lse)                                   # a query that sees no key has lse -inf
    loss = (out.float() * w_out).sum() + torch.where(finite, lse * w_lse, 0).sum()
    return [out, lse] + list(torch.autograd.grad(loss, leaves))


NAMES = ['out', 'lse', 'd q', 'd u', 'd v (r_r_bias)', 'd k', 'd v', 'd r_k']


def tiles(forward, backward=None):
    """rel_attention's tiles from (block_q, block_k) of the forward and of the backward (4 warps, 2 stages)."""
    return tuple((*blocks, 4, 2) for blocks in (forward, backward or forward))


SMALL = tiles((16, 16))


# -----------------------------------------------------------------------------------------------------------
# 1. The kernel against the reference (interpreter, float32)


@interpreted
@pytest.mark.parametrize('B, H, T, M, D, mask_args', [
    (2, 2, 16, 0, 8, {}),                                        # one tile, no memory
    (2, 3, 37, 11, 12, {}),                                      # T, K, D not multiples of the tiles
    (1, 2, 16, 40, 16, {}),                                      # memory longer than the segment
    (3, 2, 20, 13, 8, dict(key_valid_from=[0, 5, 13])),         # a fresh stream's invalid memory slots
    (2, 2, 21, 17, 8, dict(key_valid_from=[3, 0], window=17)),  # same_length
    (1, 1, 5, 3, 4, {}),                                         # smaller than one tile
])
def test_kernel_equals_reference_forward_and_backward(B, H, T, M, D, mask_args):
    leaves = inputs(B, H, T, M, D)
    mask = attn_mask(B, T, M, **mask_args)
    got = outputs_and_grads(lambda *x: kernel.rel_attention(*x, tiles=SMALL), leaves, mask, 0.3)
    want = outputs_and_grads(reference, [x.double() for x in leaves], mask, 0.3)
    for name, a, b in zip(NAMES, got, want):
        assert a.dtype == torch.float32, name
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5, msg=name)


@interpreted
@pytest.mark.parametrize('forward, backward', [((16, 32), None), ((32, 16), None), ((64, 16), None),
                                               ((64, 64), (64, 16)), ((16, 64), (32, 32)), ((32, 128), (32, 32))])
def test_kernel_tiles_are_not_square(forward, backward):
    """block_q != block_k: a band of block_q + block_k - 1 rows in 2, 3 or 5 pieces of block_k (the ∂r_k kernel at
    square tiles of block_k); the forward at 64 or 128 keys: four blocks of 16 or 32 keys put side by side (T, K and
    the mask's invalid keys cut across them), its tiles other than the backward's."""
    leaves = inputs(2, 2, 40, 24, 8)
    mask = attn_mask(2, 40, 24, key_valid_from=[7, 0])
    want = outputs_and_grads(reference, [x.double() for x in leaves], mask, 0.25)
    got = outputs_and_grads(lambda *x: kernel.rel_attention(*x, tiles=tiles(forward, backward)), leaves, mask, 0.25)
    for name, a, b in zip(NAMES, got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5, msg=name)


@interpreted
def test_keys_in_a_querys_future_are_masked_whatever_the_mask_says():
    """Their (b)+(d) entries are the rel-shift's garbage: the kernel masks them itself (an all-True mask = causal)."""
    leaves = inputs(1, 2, 20, 6, 8)
    everything = torch.ones(1, 1, 20, 26, dtype=torch.bool)
    got = outputs_and_grads(lambda *x: kernel.rel_attention(*x, tiles=SMALL), leaves, everything, 0.3)
    want = outputs_and_grads(reference, [x.double() for x in leaves], attn_mask(1, 20, 6), 0.3)
    for name, a, b in zip(NAMES, got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5, msg=name)


@interpreted
def test_a_query_that_sees_no_key_gives_zero_and_finite_gradients():
    leaves = inputs(2, 1, 8, 4, 8)
    mask = attn_mask(2, 8, 4).clone()
    mask[1, :, 3] = False                                        # row 1's query 3 may see nothing
    out, lse, *grads = outputs_and_grads(lambda *x: kernel.rel_attention(*x, tiles=SMALL), leaves, mask,
                                         0.3)
    assert torch.equal(out[1, :, 3], torch.zeros_like(out[1, :, 3])) and torch.isneginf(lse[1, :, 3]).all()
    assert torch.isfinite(lse[0]).all() and all(torch.isfinite(g).all() for g in grads)
    want = outputs_and_grads(reference, [x.double() for x in leaves], mask, 0.3)
    torch.testing.assert_close(out[0].double(), want[0][0], atol=1e-5, rtol=1e-5)


@interpreted
def test_bad_shapes_are_one_line_errors():
    q, u, vb, k, v, r_k = inputs(1, 2, 8, 4, 8)
    with pytest.raises(ValueError, match='do not fit'):
        kernel.rel_attention(q, u, vb, k, v, r_k[:, 1:], attn_mask(1, 8, 4), 0.3)
    with pytest.raises(ValueError, match='do not fit'):
        kernel.rel_attention(q, u[:, None], vb, k, v, r_k, attn_mask(1, 8, 4), 0.3)   # the model's u[:, None]
    for bad in [(16, 16, 4, 2), tiles((16, 24)), tiles((8, 16)), ((16, 16, 3, 2), (16, 16, 4, 2)),
                ((16, 16, 4, 0), (16, 16, 4, 2)), ((16, 16, 4), (16, 16, 4, 2)), tiles((16, 16)) * 2]:
        with pytest.raises(ValueError, match='tiles are'):
            kernel.rel_attention(q, u, vb, k, v, r_k, attn_mask(1, 8, 4), 0.3, tiles=bad)


# -----------------------------------------------------------------------------------------------------------
# 2. Every model with the flag equals its einsum path (interpreter, float32)

MODELS = {
    'xl': (model_xl, dict(mem_len=6)),
    'xl_same_length_clamp_pre_ln': (model_xl, dict(mem_len=6, same_length=True, clamp_len=3, pre_lnorm=True)),
    'xl_no_memory': (model_xl, dict(mem_len=0, untie_r=False)),
    'lamemo': (model_lamemo, dict(mem_len=6)),
    'lamemo_same_length_clamp': (model_lamemo, dict(mem_len=6, same_length=True, clamp_len=3)),
    'compressive': (model_compressive, dict(mem_len=4, cmem_len=4, compression_rate=2)),
    'compressive_most_used': (model_compressive, dict(mem_len=4, cmem_len=4, compression_rate=2,
                                                      compression='most_used', same_length=True)),
    'infformer': (model_infformer, dict(mem_len=6, n_basis=16, n_samples=16, basis_widths='0.05,0.1',
                                        sticky=True)),
}


def twins(module, overrides, **more):
    """The same model (float32, eval, dropout off) with attn_kernel 'einsum' and 'triton'."""
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4, **overrides, **more)
    models = []
    for name in ('einsum', 'triton'):
        torch.manual_seed(0)
        models.append(module.Model(module.Config(**fields, attn_kernel=name)).eval())
    with torch.no_grad():                                        # u and v as large as q, so that they matter
        for p in (models[0].r_w_bias, models[0].r_r_bias):
            p.normal_(0.0, 1.0)
    models[1].load_state_dict(models[0].state_dict())
    return models


@interpreted
@pytest.mark.parametrize('name', MODELS)
def test_model_with_triton_kernel_equals_einsum_path(name):
    """Three segments (the memory fills, some rows start fresh): logits, loss, the new memory and every gradient."""
    module, overrides = MODELS[name]
    einsum, triton = twins(module, overrides)
    idx = tokens(2, 12, seed=3)
    results = []
    for model in (einsum, triton):
        torch.manual_seed(7)                                      # the ∞-former's sticky memories draw samples
        memory, losses = model.init_memory(2, 'cpu'), 0
        logits = []
        for s in range(3):
            piece = idx[:, 4 * s:4 * s + 4]
            out, loss, memory, _ = model(piece, memory, targets=piece.roll(-1, 1))
            losses, memory = losses + loss, model.reset_memory(memory, torch.tensor([s == 1, False]))
            logits.append(out)
        grads = torch.autograd.grad(losses, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
        results.append((torch.cat(logits, 1), losses, memory, grads))
    (a_logits, a_loss, a_memory, a_grads), (b_logits, b_loss, b_memory, b_grads) = results
    torch.testing.assert_close(b_logits, a_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b_loss, a_loss, atol=1e-5, rtol=1e-5)
    for field, x in vars(a_memory).items():
        torch.testing.assert_close(getattr(b_memory, field), x, atol=1e-5, rtol=1e-5, msg=field)
    names = [n for n, p in einsum.named_parameters() if p.requires_grad]
    assert sum(g is not None for g in a_grads) > 10
    for n, x, y in zip(names, a_grads, b_grads):
        assert (x is None) == (y is None), n
        if x is not None:
            scale = x.abs().max().item()                          # u's and v's gradients are ~1e-6
            assert (y - x).abs().max().item() <= 1e-4 * scale + 1e-10, (n, (y - x).abs().max().item(), scale)


@interpreted
@pytest.mark.parametrize('name', ['xl', 'lamemo', 'compressive', 'infformer'])
def test_generate_with_triton_kernel_matches_forward(name):
    """generate() steps through the open segment's buffers (r_k and the keys sliced): as forward() does."""
    module, overrides = MODELS[name]
    _, model = twins(module, overrides)
    memory = model.init_memory(2, 'cpu')
    assert_greedy_generate_matches_forward(model, tokens(2, 3), 7, memory, memory, 4, rng_seed=0, logits_atol=1e-5)


@interpreted
def test_compiled_model_with_triton_kernel_equals_einsum_path():
    """torch.compile around attn_kernel='triton' (interpreted: the kernels run outside the graph): the same loss and
    gradients as the eager einsum path."""
    einsum, triton = twins(model_xl, dict(mem_len=6))
    idx = tokens(2, 4, seed=4)
    results = []
    for model, call in ((einsum, einsum), (triton, torch.compile(triton))):
        _, loss, _, _ = call(idx, model.init_memory(2, 'cpu'), targets=idx.roll(-1, 1))
        results.append((loss, torch.autograd.grad(loss, [model.r_r_bias, model.layers[0].attn.kv_net.weight])))
    (loss, grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, loss, atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled_grads, grads):
        torch.testing.assert_close(a, b, atol=1e-4 * b.abs().max().item(), rtol=1e-4)


# -----------------------------------------------------------------------------------------------------------
# 3. Config: bad combinations are one-line errors (no triton needed)


@pytest.mark.parametrize('module', [model_xl, model_lamemo, model_compressive, model_infformer],
                         ids=lambda m: m.__name__)
def test_attn_kernel_config_errors(module, monkeypatch):
    with pytest.raises(ValueError, match='attn_kernel must be one of'):
        module.Config(attn_kernel='flash')
    with pytest.raises(ValueError, match='no attention dropout'):
        module.Config(attn_kernel='triton', dropatt=0.1)
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *args: None if name == 'triton' else object())
    with pytest.raises(ValueError, match='needs the triton package'):
        module.Config(attn_kernel='triton', dropatt=0.0)


def test_lamemo_has_no_sdpa_path():
    """LaMemo stores the segment's log-sum-exps, which SDPA does not return."""
    with pytest.raises(ValueError, match="attn_kernel must be one of einsum, triton, got 'sdpa'"):
        model_lamemo.Config(attn_kernel='sdpa')


# -----------------------------------------------------------------------------------------------------------
# 4. On a GPU: the compiled kernels in bf16 against the float32 reference


@on_gpu
@pytest.mark.parametrize('T, M, D', [(512, 1024 - 512, 64), (300, 150, 41), (128, 0, 64)])
def test_compiled_kernel_in_bf16_is_within_bf16_rounding(T, M, D):
    B, H = 2, 4
    leaves = inputs(B, H, T, M, D, device='cuda')
    mask = attn_mask(B, T, M, key_valid_from=[M // 3, 0]).cuda()
    scale = D ** -0.5
    want = outputs_and_grads(reference, leaves, mask, scale)                          # float32
    got = outputs_and_grads(kernel.rel_attention, [x.bfloat16() for x in leaves], mask, scale)
    bf16 = outputs_and_grads(reference, [x.bfloat16() for x in leaves], mask, scale)   # the einsum path in bf16
    for name, a, b, c in zip(NAMES, got, want, bf16):
        error, baseline = (a.float() - b).abs().max().item(), (c.float() - b).abs().max().item()
        assert error <= 2 * baseline + 1e-3 * b.abs().max().item(), (name, error, baseline)


# Each model with the flag at a size where the tiles are full and the memory spans several of them (the
# interpreter's MODELS are too small for a GPU tile): compared with its einsum path under the same autocast
GPU_MODELS = {
    'xl': (model_xl, dict(mem_len=64)),
    'xl_same_length_clamp': (model_xl, dict(mem_len=96, same_length=True, clamp_len=80)),
    'lamemo': (model_lamemo, dict(mem_len=64)),
    'compressive': (model_compressive, dict(mem_len=32, cmem_len=32, compression_rate=2)),
    'infformer': (model_infformer, dict(mem_len=64, n_basis=32, n_samples=32)),
}


def trains_alike(module, overrides, kernels, device, autocast_dtype):
    """Two segments of one training step (the memory carried, row 1 reset between them) of the same model on each
    attn_kernel -> [(loss, {parameter name: gradient})] in the order of kernels."""
    fields = dict(vocab_size=V, n_layer=2, n_head=4, n_embd=64, d_head=16, d_inner=128, dropout=0.0, dropatt=0.0,
                  seg_len=64, **overrides)
    models = []
    for name in kernels:
        torch.manual_seed(0)
        models.append(module.Model(module.Config(**fields, attn_kernel=name)).to(device))
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    idx = tokens(4, 128, seed=5).to(device)
    results = []
    for model in models:
        memory = model.init_memory(4, device)
        with torch.autocast(device, autocast_dtype, enabled=autocast_dtype is not None):
            for s in range(2):
                piece = idx[:, 64 * s:64 * s + 64]
                _, loss, memory, _ = model(piece, memory, targets=piece.roll(-1, 1))
                memory = model.reset_memory(memory, torch.tensor([False, s == 0, False, False], device=device))
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    return results


@on_gpu
@pytest.mark.parametrize('name', GPU_MODELS)
def test_model_with_triton_kernel_trains_like_einsum_under_autocast(name):
    """One bf16-autocast training step: loss and every gradient of the two paths within bf16 rounding (and XL's
    SDPA path, today's default, likewise)."""
    module, overrides = GPU_MODELS[name]
    kernels = ('einsum', 'triton') + (('sdpa',) if module is model_xl else ())
    (loss, grads), *others = trains_alike(module, overrides, kernels, 'cuda', torch.bfloat16)
    for kernel_name, (other_loss, other_grads) in zip(kernels[1:], others):
        assert abs(other_loss - loss) < 1e-2 * abs(loss), (kernel_name, loss, other_loss)
        assert other_grads.keys() == grads.keys() and len(grads) > 10, kernel_name
        for n, g in grads.items():
            scale = g.abs().max().item() + 1e-12
            assert (other_grads[n] - g).abs().max().item() <= 5e-2 * scale, (kernel_name, n)


# -----------------------------------------------------------------------------------------------------------
# 5. What ptxas makes of each kernel at the tiles it ships (no GPU: compiled ahead of time for sm_90, sm_80, sm_100)

TARGETS = dict(sm_90=dict(smem=200 * 1024, regs={4: 168, 8: 128}), sm_80=dict(smem=100 * 1024, regs={}),
               sm_100=dict(smem=200 * 1024, regs={}))       # Blackwell: no register target
BUSY = dict(sm_90='wgmma ', sm_100='tcgen05.mma')            # the 64-row products of each, where there are any


def bench_attn_kernels():
    """bench/attn_kernels.py as a module (bench/ is not a package)."""
    import sys
    from pathlib import Path
    bench = str(Path(__file__).resolve().parent.parent / 'bench')
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module('attn_kernels')


@pytest.fixture(scope='module')
def ptxas_lines():
    """bench/attn_kernels.py --aot's lines, in a process of its own without the interpreter (a few minutes)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    if not HAS_TRITON:
        pytest.skip(NO_TRITON)
    root = Path(__file__).resolve().parent.parent
    env = {n: v for n, v in os.environ.items() if n != 'TRITON_INTERPRET'}
    proc = subprocess.run([sys.executable, str(root / 'bench' / 'attn_kernels.py'), '--aot=True'], cwd=root, env=env,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{')]
    if lines and lines[0].get('aot') == 'skipped':
        pytest.skip(lines[0]['reason'])                            # triton without its nvidia backend or ptxas
    return lines


# Where the kernels miss the targets today (ptxas, triton 3.8.0; lab/LOG.md 2026-11-28): listed, so that a
# kernel that gets worse fails, and one that gets better fails too until its line here goes. None at TILES now.
KNOWN_MISSES = set()


def test_kernels_at_the_shipped_tiles_meet_the_targets(ptxas_lines):
    """Every kernel on sm_90, sm_80 and sm_100 at its tiles: no spill, the registers and shared memory within the
    issue's targets (sm_90: <= 168 registers a thread at 4 warps, <= 128 at 8; shared memory within 200 KB on sm_90
    and sm_100, 100 KB on sm_80), but for KNOWN_MISSES. The yardstick (a plain flash forward at the same tiles) is
    measured beside them, and its ∂k, ∂v kernel (the keys kernel's tiles)."""
    attn_kernels = bench_attn_kernels()
    plan = attn_kernels.aot_plan(attn_kernels.AttnConfig(aot=True))   # each kernel at its TILES' (test above)
    assert len(ptxas_lines) == len(plan) == 6 * len(attn_kernels.AOT_ARCHS)
    misses = set()
    for line, (cc, name, tiles) in zip(ptxas_lines, plan):
        where = f"{line['kernel']} {line['arch']} tiles {line['tiles']}: {line}"
        assert (line['arch'], line['kernel'], line['tiles']) == (f'sm_{cc}', name, ','.join(map(str, tiles))), where
        assert line['regs'] > 0, where
        assert line['tensor_cores'], where                         # every product on the tensor cores
        if line['arch'] in BUSY and line['kernel'] in ('flash_yardstick', 'forward', 'backward_queries'):
            # tensor cores busy: products with the tile's 64 rows of queries as wgmma's (tcgen05's) rows (the keys
            # and ∂r_k kernels' accumulators have block_k rows: mma.sync)
            assert all(name.startswith(BUSY[line['arch']]) for name in line['tensor_cores']), where
        if line['kernel'].startswith('flash_yardstick'):
            continue
        target = TARGETS[line['arch']]
        checks = dict(spill=line['spill_stores'] == line['spill_loads'] == 0, smem=line['smem'] <= target['smem'],
                      regs=line['regs'] <= target['regs'].get(tiles[2], 255))
        misses |= {(line['kernel'], line['arch'], name) for name, ok in checks.items() if not ok}
    assert misses == KNOWN_MISSES, (f"missed now but not listed: {misses - KNOWN_MISSES}; listed but met now "
                                    f"(take them off KNOWN_MISSES): {KNOWN_MISSES - misses}")


def test_aot_compiles_each_kernel_at_its_tiles():
    """--aot's plan: per architecture the yardsticks beside their kernels, the forward's tiles for the forward, the
    backward's for the rest (∂r_k: POSITIONS_STAGES); --aot_tiles puts its entries in place of TILES' on every one."""
    attn_kernels = bench_attn_kernels()
    if kernel is None:
        pytest.skip(NO_TRITON)
    names = ['flash_yardstick', 'forward', 'flash_yardstick_keys', 'backward_keys', 'backward_queries',
             'backward_positions']
    plan = attn_kernels.aot_plan(attn_kernels.AttnConfig(aot=True))
    assert [name for _, name, _ in plan] == names * len(attn_kernels.AOT_ARCHS)
    for cc, name, tiles in plan:
        forward, backward = kernel.tiles_for(cc)
        want = forward if name in names[:2] else (*backward[:3], kernel.POSITIONS_STAGES) \
            if name == 'backward_positions' else backward
        assert tiles == want, (cc, name)
    plan = attn_kernels.aot_plan(attn_kernels.AttnConfig(aot=True, aot_tiles='64,64,4,2;32,64,8,3/16,16,4,1'))
    assert len(plan) == 2 * 6 * len(attn_kernels.AOT_ARCHS)
    assert {tiles for _, name, tiles in plan if name == 'forward'} == {(64, 64, 4, 2), (32, 64, 8, 3)}
    assert {tiles for _, name, tiles in plan if name == 'backward_keys'} == {(64, 64, 4, 2), (16, 16, 4, 1)}
    with pytest.raises(ValueError, match='aot_tiles'):
        attn_kernels.AttnConfig(aot=True, aot_tiles='64,48,4')


def test_tensor_core_instructions_are_read_from_the_ptx():
    ptx = '\n'.join(['\twgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f1, %f2}, %rd1, %rd2, p, 1, 1, 0, 1;',
                     '\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f3}, %rd3, %rd4, p, 1, 1, 0, 1;',
                     '\twgmma.fence.sync.aligned;', '\twgmma.commit_group.sync.aligned;',
                     '\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f5}, {%r1}, {%r2}, {%f6};',
                     '\twgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f7}, %rd5, %rd6, p, 1, 1, 0, 1;',
                     '\ttcgen05.mma.cta_group::1.kind::f16 [%r3], %rd7, %rd8, %r4, p;',        # sm_100's
                     '\ttcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%rd9];',
                     '\ttcgen05.ld.sync.aligned.32x32b.x64.b32 {%r5}, [%r6];'])
    assert bench_attn_kernels().tensor_core_instructions(ptx) == {
        'wgmma m64n16k16': 2, 'wgmma m64n64k16': 1, 'mma.sync m16n8k16': 1, 'tcgen05.mma': 1}
    assert bench_attn_kernels().tensor_core_instructions('\tfma.rn.f32 %f1, %f2, %f3, %f4;') == {}


def test_bench_times_the_shipped_tiles():
    """bench/attn_kernels.py's default --triton_tiles are TILES' (sm_90's, sm_80's, sm_100's), and its entries read
    back as rel_attention's tiles."""
    attn_kernels = bench_attn_kernels()
    if kernel is None:
        pytest.skip(NO_TRITON)
    shipped = [attn_kernels.tiles_entry(kernel.tiles_for(cc)) for cc in attn_kernels.AOT_ARCHS]
    assert attn_kernels.TRITON_TILES.split(';') == list(dict.fromkeys(shipped))
    assert [attn_kernels.parse_tiles(e) for e in shipped] == [kernel.tiles_for(cc) for cc in attn_kernels.AOT_ARCHS]
    assert attn_kernels.parse_tiles('32,64,8') == ((32, 64, 8, 2), (32, 64, 8, 2))
    for bad in ('32,64', '32,48,4', '8,16,4', '32,32,4/', '16,16,4/16,16,4/16,16,4', '16,16,4,x'):
        assert attn_kernels.parse_tiles(bad) is None, bad
    import re
    from pathlib import Path
    script = (Path(__file__).resolve().parent.parent / 'bench' / 'gpu_attn.sh').read_text()
    (entries,) = re.findall(r'^TILES=\$\{TILES:-(\S+)\}$', script, re.M)             # what gpu_attn.sh times
    assert entries.split(';')[:3] == shipped and all(map(attn_kernels.parse_tiles, entries.split(';')))


def test_each_gpu_gets_the_tiles_of_its_family():
    """Hopper its own, the data-centre Blackwells (tcgen05) theirs, every other GPU sm_80's."""
    if kernel is None:
        pytest.skip(NO_TRITON)
    assert kernel.tiles_for(90) == kernel.TILES[90]
    assert kernel.tiles_for(100) == kernel.tiles_for(103) == kernel.TILES[100]
    assert all(kernel.tiles_for(cc) == kernel.TILES[80] for cc in (75, 80, 86, 89, 110, 120, 121))
