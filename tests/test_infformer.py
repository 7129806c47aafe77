"""
CPU tests for model_infformer.py (∞-former, SPEC §1 contract and §5).

Tiny configs throughout (1-2 layers, n_embd 16, vocab 97, seg_len 4-8, N 16). The continuous-signal pieces (ridge
regression, E_p[ψ], the sticky histogram, one LTM write) are checked in float64 against slow references that share
no code with the model (least squares on an augmented system, numerical integration, loops).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import model_xl
from _model_tests import (F64, V, assert_greedy_generate_matches_forward, assert_sampled_generate_matches_forward,
                          differs, run_segments, tokens, train_on_repeated_pattern)
from _model_tests import assert_bf16_forward_backward
from model_infformer import (Config, Memory, Model, attention_histogram, evaluate_basis, expected_basis,
                             counter_uniforms, gaussian_basis, ridge_matrix, ridge_positions, sample_next,
                             sample_sticky_points)


def make_model(dtype=F64, seed=0, **overrides):
    """A tiny ∞-former in eval mode with dropout off; overrides are Config fields."""
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4, mem_len=4, n_basis=16, n_samples=12, basis_widths='0.05,0.1')
    fields.update(overrides)
    torch.manual_seed(seed)
    return Model(Config(**fields)).to(dtype).eval()


def reference_ridge(positions, values, basis_mu, basis_sigma, lam, pad_positions=()):
    """argmin_B Σ_i ‖Bᵀψ(t_i) − x_i‖² + λ‖B‖², with x = 0 at pad_positions, by least squares on the augmented
    system [Ψ; √λ I] B = [X; 0] (numpy, float64). positions (L,), values (L, e) -> B (N, e)."""
    t = np.concatenate([np.asarray(pad_positions, dtype=np.float64), np.asarray(positions, dtype=np.float64)])
    X = np.concatenate([np.zeros((len(pad_positions), values.shape[1])), np.asarray(values, dtype=np.float64)])
    mu, sd = basis_mu.numpy(), basis_sigma.numpy()
    Psi = np.exp(-0.5 * ((t[:, None] - mu[None]) / sd[None]) ** 2) / (sd[None] * math.sqrt(2 * math.pi))
    N = len(mu)
    A = np.concatenate([Psi, math.sqrt(lam) * np.eye(N)])
    b = np.concatenate([X, np.zeros((N, X.shape[1]))])
    return np.linalg.lstsq(A, b, rcond=None)[0]


def authors_pads(L):
    """The pad grid of ridge_matrix: spacing 1/L beyond both ends, up to -0.5 and 1.5."""
    k = np.arange(1, L // 2 + 1)
    return np.concatenate([-(k[::-1] - 0.5) / L, 1.0 + (k - 0.5) / L])


# -----------------------------------------------------------------------------------------------------------
# 1. The continuous signal: ridge regression (Eq. 5), E_p[ψ] (Eq. 11), sticky histogram and sampling (§3.3)


@pytest.mark.parametrize('pad', [False, True])
def test_ridge_matrix_equals_least_squares_reference(pad):
    L, e = 37, 5
    basis_mu, basis_sigma = gaussian_basis(20, (0.02, 0.08))
    positions = torch.rand(L, generator=torch.Generator().manual_seed(0), dtype=F64)
    X = torch.randn(L, e, generator=torch.Generator().manual_seed(1), dtype=F64)
    G = ridge_matrix(positions, basis_mu, basis_sigma, 0.7, pad=pad)                  # (L, N)
    B = reference_ridge(positions, X.numpy(), basis_mu, basis_sigma, 0.7, authors_pads(L) if pad else ())
    np.testing.assert_allclose((X.T @ G).T.numpy(), B, atol=1e-9, rtol=1e-7)


def test_ridge_reconstructs_smooth_signal_and_error_falls_with_n_basis():
    L = 256
    t = (torch.arange(L, dtype=F64) + 0.5) / L
    X = torch.stack([torch.sin(2 * math.pi * t), torch.cos(3 * math.pi * t) * t, torch.exp(-((t - 0.4) / 0.2) ** 2)], 1)
    errors = []
    for N in (8, 16, 32, 64):
        basis_mu, basis_sigma = gaussian_basis(N, (0.5 / N, 1.0 / N))                 # widths follow the spacing
        G = ridge_matrix(t, basis_mu, basis_sigma, 1e-3)
        recon = evaluate_basis(t, basis_mu, basis_sigma) @ (X.T @ G).T               # X̄(t_i) = Bᵀψ(t_i)
        errors.append(((recon - X) ** 2).mean().sqrt().item())
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.03 and errors[0] > 4 * errors[-1], errors     # (the pads pull the edges to 0)


def test_expected_basis_equals_numerical_integration():
    basis_mu, basis_sigma = gaussian_basis(12, (0.01, 0.05, 0.2))
    mu = torch.tensor([0.0, 0.3, 0.77, 1.0], dtype=F64)
    sigma_sq = torch.tensor([1e-4, 0.01, 0.3, 0.002], dtype=F64)
    t = torch.linspace(-4.0, 5.0, 200001, dtype=F64)
    closed = expected_basis(mu, sigma_sq, basis_mu, basis_sigma)                     # (4, N)
    for i in range(len(mu)):
        density = torch.exp(-0.5 * (t - mu[i]) ** 2 / sigma_sq[i]) / torch.sqrt(2 * math.pi * sigma_sq[i])
        numeric = torch.trapezoid(density[:, None] * evaluate_basis(t, basis_mu, basis_sigma), t, dim=0)
        torch.testing.assert_close(closed[i], numeric, atol=1e-7, rtol=1e-6)


def test_expected_basis_gradient_equals_autograd_through_the_formula():
    """E_p[ψ]'s values and gradients (∂φ/∂μ, ∂φ/∂σ²) equal those of N(μ; μ_j, σ² + σ_j²) written naively, for
    (B, H, T) densities and a random upstream gradient, and finite differences (gradcheck)."""
    g = torch.Generator().manual_seed(0)
    basis_mu, basis_sigma = gaussian_basis(12, (0.01, 0.05, 0.2))
    mu = torch.rand(2, 3, 5, generator=g, dtype=F64).requires_grad_()
    sigma_sq = (10 ** (-4 * torch.rand(2, 3, 5, generator=g, dtype=F64))).requires_grad_()
    upstream = torch.randn(2, 3, 5, 12, generator=g, dtype=F64)
    var = sigma_sq[..., None] + basis_sigma ** 2
    naive = torch.exp(-(mu[..., None] - basis_mu) ** 2 / (2 * var)) / torch.sqrt(2 * math.pi * var)
    naive_grads = torch.autograd.grad((naive * upstream).sum(), (mu, sigma_sq))
    closed = expected_basis(mu, sigma_sq, basis_mu, basis_sigma)
    torch.testing.assert_close(closed, naive, rtol=1e-12, atol=0)
    for ours, reference in zip(torch.autograd.grad((closed * upstream).sum(), (mu, sigma_sq)), naive_grads):
        torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12)
    small = (mu[0, :2, :3].detach().requires_grad_(), sigma_sq[0, :2, :3].detach().requires_grad_())
    assert torch.autograd.gradcheck(lambda m, s: expected_basis(m, s, basis_mu, basis_sigma), small)


def test_basis_in_float32_equals_float64_where_exp_underflows():
    """ψ(t) and E_p[ψ] far from every centre (exponents down to about -1e6, where float32's exp underflows) equal
    float64 on the same inputs to float32 precision; where float32 underflows, off by at most float32's smallest
    normal number times the normaliser 1/√(2π v) (≤ 200 here): below 1e-35."""
    g = torch.Generator().manual_seed(0)
    basis_mu, basis_sigma = (b.float() for b in gaussian_basis(64, (0.002, 0.01)))
    t = torch.rand(1000, generator=g)
    sigma_sq = 10 ** (-6 * torch.rand(1000, generator=g))
    for f, args in ((evaluate_basis, (t,)), (expected_basis, (t, sigma_sq))):
        single = f(*args, basis_mu, basis_sigma)
        exact = f(*(a.double() for a in args), basis_mu.double(), basis_sigma.double())
        assert (exact < 1e-38).float().mean() > 0.3                     # many entries are in the underflow range
        torch.testing.assert_close(single.double(), exact, rtol=1e-4, atol=1e-35)


def test_attention_histogram_equals_numerical_bin_masses_and_sums_to_one():
    g = torch.Generator().manual_seed(0)
    mu = torch.rand(2, 3, 5, generator=g, dtype=F64)                   # (B, H, T)
    sigma_sq = 10 ** (-3 * torch.rand(2, 3, 5, generator=g, dtype=F64))
    n_bins = 16
    hist = attention_histogram(mu, sigma_sq, n_bins)
    for b in range(2):
        expected = torch.zeros(n_bins, dtype=F64)
        for j in range(n_bins):                                        # ∫_{d_j} Σ_h Σ_i N(t; μ, σ²) dt, Eq. 16
            t = torch.linspace(j / n_bins, (j + 1) / n_bins, 20001, dtype=F64)
            var = sigma_sq[b]
            dens = torch.exp(-0.5 * (t[:, None, None] - mu[b]) ** 2 / var) / torch.sqrt(2 * math.pi * var)
            expected[j] = torch.trapezoid(dens.sum(dim=(1, 2)), t)
        torch.testing.assert_close(hist[b], expected, atol=1e-6, rtol=1e-4)
        p = hist[b] / hist[b].sum()
        assert abs(p.sum().item() - 1.0) < 1e-12


@pytest.mark.parametrize('source', ['torch.rand', 'counter_uniforms'])
def test_sticky_sampling_follows_histogram(source):
    """χ² goodness of fit of the sampled points' bins against the histogram, plus sorted output in [0, 1] and
    uniformity inside a bin; with torch's RNG and with the model's counter-based uniforms."""
    D, n = 8, 4000
    hist = torch.tensor([[0.0, 1.0, 3.0, 0.5, 0.0, 2.0, 0.25, 1.25], [1.0] * 8], dtype=F64)
    torch.manual_seed(0)
    u = torch.rand(2, n, dtype=F64) if source == 'torch.rand' else counter_uniforms(torch.tensor([12345, 7 << 20]), n)
    t = sample_sticky_points(hist, u)                                  # (2, n)
    assert t.shape == (2, n) and (t >= 0).all() and (t <= 1).all()
    assert (t[:, 1:] >= t[:, :-1]).all()                               # sorted
    for b in range(2):
        counts = torch.bincount((t[b] * D).long().clamp(max=D - 1), minlength=D).to(F64)
        expected = n * hist[b] / hist[b].sum()
        assert (counts[expected == 0] == 0).all()
        chi2 = (((counts - expected) ** 2)[expected > 0] / expected[expected > 0]).sum().item()
        assert chi2 < 24.3, (chi2, counts, expected)                   # 99.9% quantile of χ² with 7 dof
    within = (t[1] * D).frac()                                         # uniform inside the bins
    assert abs(within.mean().item() - 0.5) < 0.03 and abs(within.var().item() - 1 / 12) < 0.01
    t = sample_sticky_points(torch.tensor([[0.0, 0.0, 5.0, 0.0]], dtype=F64), u[:1, :100])
    assert ((t >= 0.5) & (t <= 0.75)).all()                            # one bin with mass: draws only there


def test_counter_uniforms_are_uniform_and_differ_between_states():
    u = counter_uniforms(torch.arange(64) * 2 ** 20 + 99, 500)         # (64, 500): 64 rows' draws
    assert (u >= 0).all() and (u < 1).all()
    counts = torch.bincount((u.flatten() * 20).long(), minlength=20).double()
    chi2 = ((counts - 1600) ** 2 / 1600).sum().item()
    assert chi2 < 43.8, chi2                                           # 99.9% quantile of χ² with 19 dof
    corr = torch.corrcoef(u)                                           # rows are not copies of each other
    assert corr.fill_diagonal_(0).abs().max() < 0.25
    torch.testing.assert_close(counter_uniforms(torch.tensor([5]), 7), counter_uniforms(torch.tensor([5]), 7))


def test_ridge_positions_and_buffers():
    cfg = Config(seg_len=6, n_basis=8, n_samples=5, basis_widths='0.05,0.1', tau=0.6, ridge_lambda=0.8)
    first, unbounded = ridge_positions(cfg)
    torch.testing.assert_close(first, torch.tensor([1, 3, 5, 7, 9, 11], dtype=F64) / 12)
    torch.testing.assert_close(unbounded, torch.tensor([0.12, 0.24, 0.36, 0.48, 0.6, 0.6 + 0.4 / 6, 0.6 + 0.8 / 6,
                                                        0.8, 0.6 + 1.6 / 6, 0.6 + 2 / 6, 1.0], dtype=F64))
    model = Model(cfg)
    basis_mu, basis_sigma = gaussian_basis(8, (0.05, 0.1))
    torch.testing.assert_close(model.long_term.G_unbounded, ridge_matrix(unbounded, basis_mu, basis_sigma, 0.8).float())
    psi_linear = evaluate_basis(torch.arange(1, 6) / 5, basis_mu, basis_sigma)
    torch.testing.assert_close(model.long_term.psi_linear, psi_linear.float())


# -----------------------------------------------------------------------------------------------------------
# 2. The LTM write (§3.2, §3.4) against a slow per-row reference


def random_memory(model, B, length, pending, written, seed=5):
    g = torch.Generator().manual_seed(seed)
    memory = model.init_memory(B, 'cpu')
    return Memory(mem=torch.randn(memory.mem.shape, generator=g, dtype=F64),
                  length=torch.tensor(length), ltm_pending=torch.tensor(pending),
                  ltm_B=torch.randn(memory.ltm_B.shape, generator=g, dtype=F64),
                  ltm_written=torch.tensor(written),
                  ltm_hist=torch.rand(memory.ltm_hist.shape, generator=g, dtype=F64), ltm_rng=memory.ltm_rng)


def gate_of(model, n):
    """Layer n's CNN gate X -> X̃ (Eq. 18), as LongTermMemory.write takes it."""
    return model.layers[n].attn.ltm.gated


@pytest.mark.parametrize('sticky', [False, True])
def test_ltm_write_equals_reference(sticky):
    """Rows: LTM already written, 4 vectors waiting (Eqs. 14-15, 5); empty LTM, 4 waiting (Eq. 5); written, 6 waiting
    (after segments shorter than seg_len: the oldest 4 go); written, only 3 waiting (no write, B unchanged).
    seg_len 4, so 7 waiting slots before the STM's 3. Sticky: the old signal is read at points drawn from the
    stored histogram (§3.3) instead of at m/M."""
    model = make_model(seg_len=4, mem_len=3, n_basis=10, n_samples=7, tau=0.6, ridge_lambda=0.7, sticky=sticky)
    c = model.config
    memory = random_memory(model, 4, length=[10, 10, 10, 10], pending=[4, 4, 6, 3], written=[1, 0, 1, 1])
    due = model.long_term.due(memory)
    write, slots, grow, written = due
    assert write.tolist() == [True, True, True, False] and grow.tolist() == [True, False, True, True]
    assert written.tolist() == [5, 4, 5, 1]                                          # vectors the LTM holds
    basis_mu, basis_sigma = gaussian_basis(10, c.widths)
    gate = model.layers[1].attn.ltm.gate
    got = model.long_term.write(1, memory, due, gate_of(model, 1))
    for b in range(4):
        pending = memory.ltm_pending[b].item()
        if pending < 4:
            torch.testing.assert_close(got[b], memory.ltm_B[1, b])
            continue
        x = memory.mem[1, b, 7 - pending:7 - pending + 4]                              # the oldest 4 waiting
        x = torch.sigmoid(gate(x.T[None]))[0].T * x                                    # Eq. 18, zero-padded conv
        if memory.ltm_written[b]:
            s = torch.arange(1, 8, dtype=F64) / 7                                      # read the old signal at m/M
            read = s
            if sticky:                                                                 # layer 1 of 2
                u = counter_uniforms(memory.ltm_rng[b:b + 1] * 2 + 1, 7)
                read = sample_sticky_points(memory.ltm_hist[1, b:b + 1] + 1e-12, u)[0]
                assert differs(read, s, atol=1e-3)
            x_past = evaluate_basis(read, basis_mu, basis_sigma) @ memory.ltm_B[1, b]
            t = torch.cat([s * 0.6, 0.6 + 0.4 * torch.arange(1, 5, dtype=F64) / 4])    # placed at m τ/M
            x = torch.cat([x_past, x])
        else:
            t = (torch.arange(4, dtype=F64) + 0.5) / 4
        expected = reference_ridge(t.numpy(), x.detach().numpy(), basis_mu, basis_sigma, 0.7, authors_pads(len(t)))
        np.testing.assert_allclose(got[b].detach().numpy(), expected, atol=1e-5, rtol=1e-5)


def test_unbounded_false_fits_new_vectors_alone():
    model = make_model(unbounded=False)
    memory = random_memory(model, 2, length=[8, 8], pending=[4, 4], written=[1, 0])
    due = model.long_term.due(memory)
    got = model.long_term.write(0, memory, due, gate_of(model, 0))
    model.config.unbounded = True
    grown = model.long_term.write(0, memory, due, gate_of(model, 0))
    torch.testing.assert_close(got[1], grown[1])                        # empty LTM: the same first fit
    assert differs(got[0], grown[0])                                    # otherwise the old signal is dropped


def test_ltm_written_when_vectors_leave_the_stm():
    for mem_len, first_written in ((4, 2), (8, 3), (0, 1), (6, 3)):
        model = make_model(seg_len=4, mem_len=mem_len)
        memory = model.init_memory(2, 'cpu')
        flags = []
        for s in range(5):
            _, _, memory, _ = model(tokens(2, 4, seed=s), memory)
            flags.append(memory.ltm_written.tolist())
        assert [f[0] > 0 for f in flags] == [s >= first_written for s in range(5)], (mem_len, flags)


@pytest.mark.parametrize('mem_len', [3, 0])
def test_every_vector_leaving_the_stm_is_written_once_in_order(mem_len):
    """Chunks of varying length (a short last segment, eval segments shorter than seg_len): the vectors the writes
    take, followed by those still waiting, are exactly the layer-0 inputs (the scaled token embeddings) of every
    position that has left the STM, each once, in order; each write takes seg_len of them."""
    model = make_model(n_layer=1, mem_len=mem_len)
    idx = tokens(1, 40)
    memory = model.init_memory(1, 'cpu')
    taken, pos = [], 0
    for T in (4, 2, 3, 1, 4, 4, 2, 1, 3, 4, 4, 2, 1, 1):
        write, slots, _, _ = model.long_term.due(memory)
        if write[0]:
            taken.append(memory.mem[0, 0, slots[0]])
        _, _, memory, _ = model(idx[:, pos:pos + T], memory)
        pos += T
    pending = memory.ltm_pending[0].item()
    assert 4 * len(taken) + pending == pos - mem_len and pending <= 7                  # at most 2 seg_len - 1 wait
    taken.append(memory.mem[0, 0, 7 - pending:7])
    torch.testing.assert_close(torch.cat(taken), model.word_emb(idx[0, :pos - mem_len]), atol=0, rtol=0)


# -----------------------------------------------------------------------------------------------------------
# 3. The LTM in the model: masking, dependence, gradients, KL


def test_forward_is_a_pure_function_of_tokens_and_memory_with_sticky_memories():
    model = make_model(sticky=True)
    _, memory = run_segments(model, tokens(2, 16, seed=2), model.init_memory(2, 'cpu'), 4)
    idx = tokens(2, 4, seed=6)
    a, _, mem_a, _ = model(idx, memory)
    torch.rand(100)                                                     # the global RNG plays no part
    b, _, mem_b, _ = model(idx, memory)
    assert torch.equal(a, b) and torch.equal(mem_a.ltm_B, mem_b.ltm_B)
    assert (mem_a.ltm_rng == memory.ltm_rng + 1).all()                  # advanced by the write


def test_ltm_term_is_masked_before_anything_was_written():
    model = make_model()
    memory = model.init_memory(2, 'cpu')
    junk = Memory(**{**memory.__dict__, 'ltm_B': torch.randn(memory.ltm_B.shape, dtype=F64) * 10})
    idx = tokens(2, 4)
    a, _, _, _ = model(idx, memory)
    b, _, _, _ = model(idx, junk)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    written = Memory(**{**junk.__dict__, 'ltm_written': torch.ones(2, dtype=torch.long)})
    c, _, _, _ = model(idx, written)
    assert differs(a, c)


def test_different_ltm_content_changes_logits_and_ltm_off_ignores_it():
    model = make_model()
    _, memory = run_segments(model, tokens(2, 24, seed=3), model.init_memory(2, 'cpu'), 4)
    assert (memory.ltm_written > 0).all()
    other = Memory(**{**memory.__dict__, 'ltm_B': memory.ltm_B.flip(1)})   # the rows swap their LTMs
    idx = tokens(2, 4, seed=9)
    a, _, _, _ = model(idx, memory)
    b, _, _, _ = model(idx, other)
    assert differs(a[0], b[0]) and differs(a[1], b[1])
    model.config.ltm = False
    a, _, _, _ = model(idx, memory)
    b, _, _, _ = model(idx, other)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_ltm_off_equals_transformer_xl_with_the_same_weights():
    """With ltm=False the model is model_xl.py's Transformer-XL: same weights, same logits segment by segment."""
    model = make_model(ltm=False, mem_len=6)
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4, mem_len=6)
    xl = model_xl.Model(model_xl.Config(**fields)).double().eval()
    missing, unexpected = xl.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all('.ltm.' in k for k in unexpected)
    idx = tokens(2, 20)
    ours, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), 4)
    xl_mem = xl.init_memory(2, 'cpu')
    theirs, _ = run_segments(xl, idx, model_xl.Memory(mem=xl_mem.mem.double(), length=xl_mem.length), 4)
    torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)


def test_gradient_reaches_ltm_parameters_but_not_past_segments():
    model = make_model().train()
    memory = model.init_memory(2, 'cpu')
    idx = tokens(2, 13)
    for s in range(0, 8, 4):
        _, _, memory, _ = model(idx[:, s:s + 4], memory)
    assert all(not v.requires_grad for v in memory.__dict__.values())   # the memory is detached
    _, loss, memory, aux = model(idx[:, 8:12], memory, targets=idx[:, 9:13])
    assert all(not v.requires_grad for v in memory.__dict__.values())
    loss.backward()
    for n in range(2):
        ltm = model.layers[n].attn.ltm
        for name, p in (('W_K', ltm.key_net.weight), ('W_V', ltm.value_net.weight),
                        ('mu affine', ltm.mu_affine.weight), ('sigma affine', ltm.sigma_affine.weight),
                        ('gate', ltm.gate.weight), ('output', ltm.o_net.weight)):
            assert p.grad is not None and p.grad.abs().sum() > 0, (n, name)


def test_kl_loss_is_in_the_loss_and_matches_formula():
    model = make_model(kl_weight=0.1, sigma_0=0.2)
    idx = tokens(2, 13)
    _, memory = run_segments(model, idx[:, :8], model.init_memory(2, 'cpu'), 4)
    captured = []
    hooks = [layer.attn.ltm.register_forward_hook(lambda m, i, o: captured.append(o[2])) for layer in model.layers]
    logits, loss, _, aux = model(idx[:, 8:12], memory, targets=idx[:, 9:13])
    for h in hooks:
        h.remove()
    s = torch.stack(captured) / 0.04                                   # σ² / σ₀², (L, B, H, T)
    kl = (0.5 * (s - torch.log(s) - 1)).mean(dim=(1, 2, 3)).sum()      # summed over layers, as the authors' code
    torch.testing.assert_close(aux['kl_loss'], kl)
    lm = F.cross_entropy(logits.view(-1, V), idx[:, 9:13].reshape(-1))
    torch.testing.assert_close(loss, lm + 0.1 * kl)
    # nothing written yet: no KL term
    _, loss, _, aux = model(idx[:, :4], model.init_memory(2, 'cpu'), targets=idx[:, 1:5])
    assert aux['kl_loss'].item() == 0.0 and torch.equal(loss, aux['lm_loss'])


@pytest.mark.parametrize('sticky', [False, True])
def test_ltm_reset_len_empties_the_ltm_before_the_next_write(sticky):
    """ltm_reset_len (the authors' mem_threshold): a row whose LTM holds that many vectors starts its next write from
    an empty LTM, so the new LTM is the fit of the new vectors alone (Eq. 5) whatever the old one held; below the
    threshold nothing changes."""
    model = make_model(seg_len=4, mem_len=4, ltm_reset_len=8, sticky=sticky)
    idx = tokens(2, 28)
    memory, counts, before = model.init_memory(2, 'cpu'), [], []
    for s in range(7):
        before.append(memory)
        _, _, memory, _ = model(idx[:, 4 * s:4 * s + 4], memory)
        counts.append(memory.ltm_written.tolist())
    assert counts == [[n, n] for n in (0, 0, 4, 8, 4, 8, 4)]          # vectors held: emptied at 8, then 4 written
    model.config.ltm_reset_len = 0
    torch.testing.assert_close(model(idx[:, 12:16], before[3])[2].ltm_B, before[4].ltm_B, atol=0, rtol=0)   # 4 < 8
    kept_logits, _, kept, _ = model(idx[:, 16:20], before[4])        # without the reset the old signal stays
    model.config.ltm_reset_len = 8
    logits, _, after, _ = model(idx[:, 16:20], before[4])            # 8 held: this write starts from empty
    noise = torch.randn(before[4].ltm_B.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    junk = Memory(**{**before[4].__dict__, 'ltm_written': torch.zeros(2, dtype=torch.long), 'ltm_B': noise})
    junk_logits, _, from_junk, _ = model(idx[:, 16:20], junk)        # an empty LTM (written 0) with junk in B
    torch.testing.assert_close(logits, junk_logits, atol=0, rtol=0)
    torch.testing.assert_close(after.ltm_B, from_junk.ltm_B, atol=0, rtol=0)
    assert differs(after.ltm_B, kept.ltm_B) and differs(logits, kept_logits)


# -----------------------------------------------------------------------------------------------------------
# 4. The contract: causality, reset, fixed shapes, no recompiles, generate == forward, training


@pytest.mark.parametrize('mem_len,sticky', [(4, False), (0, False), (6, True)])
def test_causality_across_segments_and_the_ltm(mem_len, sticky):
    model = make_model(mem_len=mem_len, sticky=sticky)
    idx = tokens(2, 24)
    torch.manual_seed(0)
    ref, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), 4)
    for p in (5, 13, 22):
        changed = idx.clone()
        changed[:, p] = (changed[:, p] + 1) % V
        torch.manual_seed(0)
        out, _ = run_segments(model, changed, model.init_memory(2, 'cpu'), 4)
        torch.testing.assert_close(out[:, :p], ref[:, :p], atol=1e-12, rtol=0)
        assert differs(out[:, p:], ref[:, p:])


def test_reset_memory_row_equals_fresh_stream():
    model = make_model(sticky=True)
    _, memory = run_segments(model, tokens(2, 20, seed=4), model.init_memory(2, 'cpu'), 4)
    memory = model.reset_memory(memory, torch.tensor([True, False]))
    fresh = model.init_memory(1, 'cpu')
    for name, value in memory.__dict__.items():
        row = value[:, 0:1] if value.dim() >= 3 else value[0:1]         # (L, B, ...) or (B,)
        torch.testing.assert_close(row, getattr(fresh, name).to(value.dtype), msg=name)
    assert memory.ltm_written[1] > 0 and memory.ltm_B[:, 1].abs().sum() > 0
    idx = tokens(2, 12, seed=8)
    torch.manual_seed(0)
    out, _ = run_segments(model, idx, memory, 4)
    torch.manual_seed(0)
    alone, _ = run_segments(model, idx[:1], model.init_memory(1, 'cpu'), 4)
    torch.testing.assert_close(out[:1], alone, atol=1e-10, rtol=0)


def test_memory_shapes_fixed_after_5_and_500_segments():
    model = make_model(dtype=torch.float32, n_layer=1, sticky=True)
    memory = model.init_memory(2, 'cpu')
    shapes0 = {k: (v.shape, v.dtype) for k, v in memory.__dict__.items()}
    idx = tokens(2, 4 * 500)
    with torch.no_grad():
        for s in range(500):
            _, _, memory, _ = model(idx[:, 4 * s:4 * s + 4], memory)
            if s + 1 in (5, 500):
                assert {k: (v.shape, v.dtype) for k, v in memory.__dict__.items()} == shapes0
                assert all(v.is_contiguous() and torch.isfinite(v.float()).all() for v in memory.__dict__.values())
    assert all(dt in (torch.float32, torch.int64) for _, dt in shapes0.values())


def test_torch_compile_compiles_once():
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = make_model(dtype=torch.float32, n_layer=1, sticky=True)
    compiled = torch.compile(model, backend='eager')        # dynamo's guards decide recompiles, not inductor
    memory = model.init_memory(2, 'cpu')
    idx = tokens(2, 17)
    try:
        with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():   # (train.py's test: backward)
            for s in range(4):                                          # LTM empty, then written: no recompile
                _, loss, memory, _ = compiled(idx[:, 4 * s:4 * s + 4], memory, targets=idx[:, 4 * s + 1:4 * s + 5])
        assert (memory.ltm_written > 0).all()
        assert counters['stats']['unique_graphs'] == 1, dict(counters['stats'])
    finally:
        torch._dynamo.reset()


def generate_setup(with_memory, mem_len, sticky, B=2, seg=4, **overrides):
    model = make_model(dtype=torch.float32, mem_len=mem_len, sticky=sticky, init_std=0.5, **overrides)
    start = model.init_memory(B, 'cpu')
    memory = None
    if with_memory:
        with torch.no_grad():
            _, memory = run_segments(model, tokens(B, 14, seed=7), start, seg)
        start = memory
    return model, memory, start


@pytest.mark.parametrize('prompt_len', [3, 4, 9])
@pytest.mark.parametrize('with_memory,mem_len,sticky', [(False, 4, False), (True, 4, False), (True, 0, False),
                                                        (True, 6, True)])
def test_greedy_generate_matches_segmentwise_forward(prompt_len, with_memory, mem_len, sticky):
    model, memory, start = generate_setup(with_memory, mem_len, sticky)
    assert_greedy_generate_matches_forward(model, tokens(2, prompt_len, seed=prompt_len), 14, memory, start, 4,
                                           rng_seed=3)                 # sticky draws: the same RNG stream


@pytest.mark.parametrize('prompt_len', [3, 9])
def test_sampled_generate_matches_segmentwise_forward(prompt_len):
    """Replaying the sampling RNG on forward()'s logits picks the same tokens (sticky=False: generate's RNG is then
    used by sampling only)."""
    model, memory, start = generate_setup(True, 4, False)
    assert_sampled_generate_matches_forward(model, tokens(2, prompt_len, seed=prompt_len), 13, memory, start, 4,
                                            sample_next)


def test_generate_rejects_empty_prompt():
    with pytest.raises(ValueError):
        make_model().generate(torch.zeros(1, 0, dtype=torch.long), 3)


def test_bf16_autocast_forward_backward():
    model = make_model(dtype=torch.float32, sticky=True).train()
    assert_bf16_forward_backward(model, ['ltm_B', 'mem'], all_grads=False)
    assert model.layers[0].attn.ltm.key_net.weight.grad is not None


def test_loss_goes_down_on_repeated_pattern():
    seg, steps = 8, 120
    model = make_model(dtype=torch.float32, n_embd=32, d_head=16, d_inner=64, seg_len=seg, mem_len=seg,
                       sticky=True).train()
    # a period of 29, longer than the STM: the LTM can help
    losses = train_on_repeated_pattern(model, steps, period=29, record='lm_loss')
    initial, final = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert final < 0.5 * initial, (initial, final)


# -----------------------------------------------------------------------------------------------------------
# 5. Config


@pytest.mark.parametrize('bad', [dict(n_basis=15, basis_widths='0.1,0.2'), dict(basis_widths='a,b'),
                                 dict(basis_widths='0.1,-1'), dict(tau=1.0), dict(tau=0.0), dict(ridge_lambda=0.0),
                                 dict(n_samples=0), dict(sticky_bins=0), dict(kl_weight=-1.0), dict(sigma_0=0.0),
                                 dict(n_basis=2, basis_widths='0.1,0.2'), dict(mem_len=-1),
                                 dict(ltm_reset_len=-1)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        Config(**bad)


def test_config_parses_widths_and_defaults_are_valid():
    assert Config().widths == (0.005, 0.01)
    assert Config(basis_widths='0.01,0.05').widths == (0.01, 0.05)


def test_flops_per_token_grows_with_n_basis():
    assert make_model(n_basis=32).flops_per_token() > make_model(n_basis=16).flops_per_token() > 0


@pytest.mark.parametrize('floor', [1e-4, 1e-6])
def test_sigma_sq_is_floored_at_sigma_sq_min(floor):
    """Eq. 10's σ² never goes below sigma_sq_min (1e-4 the authors' LM code, 1e-6 their sorting code), and above
    the floor it is softplus(affine(scores)) unchanged."""
    import model_infformer
    model = make_model(sigma_sq_min=floor)
    attn = model.layers[0].attn.ltm
    B, H, T, N, D = 2, 2, 3, 16, 8
    q = torch.randn(B, H, T, D, dtype=F64)
    basis = gaussian_basis(N, (0.05, 0.1))
    read = model_infformer.LTMRead(torch.randn(B, H, N, D, dtype=F64), torch.randn(B, H, N, D, dtype=F64),
                                   torch.ones(B, dtype=torch.bool), *basis)
    with torch.no_grad():
        attn.sigma_affine.bias.fill_(-100.0)                      # softplus(-100) ~ 4e-44: below any floor
        _, _, sigma_sq = attn(q, read)
        assert torch.equal(sigma_sq, torch.full_like(sigma_sq, floor))
        attn.sigma_affine.bias.fill_(0.0)
        _, _, sigma_sq = attn(q, read)
        scores = torch.einsum('bhid,bhnd->bhin', q, read.keys) * attn.scale
        torch.testing.assert_close(sigma_sq, F.softplus(attn.sigma_affine(scores)).squeeze(-1))
    with pytest.raises(ValueError, match='sigma_sq_min'):
        Config(sigma_sq_min=0.0)
