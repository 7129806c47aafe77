"""
lab/model_infformer_probes.py: the four probes of the ∞-former's read outside the paper (sigma_sq_init, mu_readout,
sigma_sq_anneal, ltm_read), each against a reference that shares no code with it, as tests/test_infformer.py checks
the paper's mechanism; with every flag at its default the lab model is model_infformer.py (same weights, same
outputs); --model=infformer_probes reaches it; its flops_per_token matches torch's count.
"""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import model_infformer as paper
import train
from _model_tests import (F64, V, assert_bf16_forward_backward, assert_greedy_generate_matches_forward, run_segments,
                          tokens)
from lab import model_infformer_probes as probes
from lab.model_infformer_probes import Config, Model
from model_infformer import evaluate_basis, gaussian_basis
from test_flops import SIZE, counted_per_token, r_projection

TINY = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0, seg_len=4,
            mem_len=4, n_basis=16, n_samples=12, basis_widths='0.05,0.1')


def make_model(dtype=F64, seed=0, module=None, **overrides):
    """A tiny ∞-former with the probes (module: another model file's Config and Model), in eval mode."""
    module = module or probes
    torch.manual_seed(seed)
    return module.Model(module.Config(**{**TINY, **overrides})).to(dtype).eval()


# -----------------------------------------------------------------------------------------------------------
# The lab model is the paper's where no probe is on, and train.py finds it


@pytest.mark.parametrize('fields', [dict(), dict(sticky=True, dropout=0.1, dropatt=0.1), dict(cnn_gate=False)])
def test_with_the_probes_off_it_is_the_paper_model(fields):
    """Same seed: the same weights under the same names; training steps (dropout, RNG reseeded) give the same
    logits, loss, aux and memory, to the bit."""
    lab, ref = make_model(torch.float32, **fields).train(), make_model(torch.float32, module=paper, **fields).train()
    assert lab.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in lab.state_dict().items())
    idx = tokens(2, 25, seed=3)
    memories = [m.init_memory(2, 'cpu') for m in (lab, ref)]
    for s in range(6):
        outs = []
        for n, model in enumerate((lab, ref)):
            torch.manual_seed(s)
            logits, loss, memories[n], aux = model(idx[:, 4 * s:4 * s + 4], memories[n], idx[:, 4 * s + 1:4 * s + 5])
            outs.append((logits, loss, aux, vars(memories[n])))
        (logits, loss, aux, memory), (logits_ref, loss_ref, aux_ref, memory_ref) = outs
        assert torch.equal(logits, logits_ref) and torch.equal(loss, loss_ref)
        assert aux.keys() == aux_ref.keys() and all(torch.equal(aux[k], aux_ref[k]) for k in aux)
        assert all(torch.equal(memory[k], memory_ref[k]) for k in memory)
    assert (memories[0].ltm_written > 0).all()


def test_probes_leave_out_the_maps_they_do_not_use():
    """The pointer has no μ map, the discrete read neither map; the other weights keep the paper's names.
    sigma_sq_anneal adds its count to the state dict and changes no weight (the same seed, the same values)."""
    ref = make_model(module=paper).state_dict()
    for fields, missing in ((dict(mu_readout='pointer'), ('mu_affine',)),
                            (dict(ltm_read='discrete'), ('mu_affine', 'sigma_affine')),
                            (dict(sigma_sq_anneal='1e-1,1e-3,1,4'), ())):
        state = make_model(**fields).state_dict()
        kept = {k for k in ref if not any(f'.{m}.' in k for m in missing)}
        assert kept == {k for k in state if not k.endswith('segments_trained')}, fields
        if not missing:
            assert all(torch.equal(state[k], ref[k]) for k in kept), fields
    assert make_model(sigma_sq_anneal='1e-1,1e-3,1,4').state_dict()['layers.0.attn.ltm.segments_trained'] == 0


def test_train_py_selects_the_probes_by_model_name():
    _, module, config, _ = train.parse_args(['--model=infformer_probes', '--mu_readout=pointer', '--sticky=True',
                                             '--sigma_sq_anneal=1e-2,1e-4,10,20', '--sigma_sq_init=1e-3'])
    assert module.__name__ == 'lab.model_infformer_probes'
    assert (config.mu_readout, config.sticky, config.anneal, config.sigma_sq_init) == ('pointer', True,
                                                                                       (1e-2, 1e-4, 10, 20), 1e-3)
    for flag in ('--mu_readout=pointer', '--ltm_read=discrete', '--sigma_sq_init=1e-3', '--sigma_sq_anneal=1,1,0,1'):
        with pytest.raises(train.UserError):                  # the paper's file has none of them
            train.parse_args(['--model=infformer', flag])


def test_recall_py_trains_the_probes_with_the_variants_synthetic_setting(tmp_path):
    """bench/recall.py --overrides=model=infformer_probes,...: the variant's model file replaced by the lab's (its
    synthetic-task fields kept, --model= given once); with the probes off, the same accuracies and losses as the
    paper's file, to the bit."""
    import json
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'bench'))
    import recall
    from _models import TINY_MODELS
    spec = dict(TINY_MODELS['infformer'], sticky=False)
    cfg = recall.RecallConfig(overrides='model=infformer_probes,mu_readout=pointer')
    name, fields = recall.model_fields(spec, recall.RECALL_SIZE, cfg)
    assert name == 'infformer_probes' and fields['mu_readout'] == 'pointer' and fields['tau'] == 0.75
    assert recall.train_overrides(cfg) == []
    results = []
    for overrides in ('', 'model=infformer_probes'):
        out = tmp_path / (overrides or 'paper')
        cfg = recall.RecallConfig(tasks='passkey', tokens=1024, batch_size=2, seg_len=32, mem_len=16, depths='16,40',
                                  eval_episodes=2, out_dir=str(out), out=str(out / 'recall.json'), plot=False,
                                  overrides=overrides)
        recall.run(cfg, {'infformer': spec}, {'seg_len': 32})
        t = json.loads((out / 'recall.json').read_text())['tasks']['passkey']
        run = t['runs']['infformer'][str(cfg.seed)]
        assert sum(a.startswith('--model=') for a in run['train_argv']) == 1
        results.append((t['accuracy'], t['exact'], run['final']['train/loss']))
    assert results[0] == results[1]


@pytest.mark.parametrize('fields', [dict(mu_readout='pointer'), dict(ltm_read='discrete'),
                                    dict(ltm_read='discrete', cnn_gate=False)])
def test_flops_per_token_matches_torch_flop_counter(fields):
    """As tests/test_flops.py's ∞-former cases, with the probes that change the read's products."""
    torch.manual_seed(0)
    fields = {**SIZE, 'mem_len': 16, 'n_basis': 32, 'n_samples': 24, 'basis_widths': '0.05,0.1', **fields}
    model = Model(Config(**fields)).train()
    counted = counted_per_token(model) - r_projection('infformer_probes', model.config)
    assert model.flops_per_token() == pytest.approx(counted, rel=1e-6)


# -----------------------------------------------------------------------------------------------------------
# The probes, each against a reference


def test_greedy_generate_matches_segmentwise_forward_with_the_discrete_read():
    model = make_model(dtype=torch.float32, init_std=0.5, ltm_read='discrete')
    with torch.no_grad():
        _, memory = run_segments(model, tokens(2, 14, seed=7), model.init_memory(2, 'cpu'), 4)
    assert_greedy_generate_matches_forward(model, tokens(2, 9, seed=9), 14, memory, memory, 4, rng_seed=3)


def test_bf16_autocast_forward_backward_with_the_discrete_read():
    model = make_model(dtype=torch.float32, ltm_read='discrete').train()
    assert_bf16_forward_backward(model, ['ltm_B', 'mem'], all_grads=False)
    assert model.layers[0].attn.ltm.key_net.weight.grad is not None


def test_sigma_sq_init_starts_every_density_that_narrow():
    """sigma_sq_init sets Eq. 10's bias so that σ² = softplus(affine(scores)) starts at it for every layer (up to
    the scores' small contribution); 0 keeps the authors' bias 0 (σ² = softplus(0) ≈ 0.69)."""
    B, H, T, N, D = 2, 2, 3, 16, 8
    basis = gaussian_basis(N, (0.05, 0.1))
    zeros = torch.zeros(B, H, N, D, dtype=F64)                # zero keys: scores 0, σ² = softplus(bias) exactly
    read = paper.LTMRead(zeros, zeros, torch.ones(B, dtype=torch.bool), *basis)
    for init, expected in ((1e-3, 1e-3), (0.0, math.log(2))):
        model = make_model(sigma_sq_init=init)
        for layer in model.layers:
            with torch.no_grad():
                _, _, sigma_sq = layer.attn.ltm(torch.randn(B, H, T, D, dtype=F64), read)
            torch.testing.assert_close(sigma_sq, torch.full_like(sigma_sq, expected))
    with pytest.raises(ValueError, match='sigma_sq_init'):
        Config(sigma_sq_init=-1.0)


def test_sigma_sq_anneal_caps_sigma_sq_on_a_geometric_schedule_of_training_segments():
    """sigma_sq_anneal='CAP0,CAP1,S0,S1' (outside the paper): σ² = min(Eq. 10, cap), the cap CAP0 for the first S0
    training segments, CAP0 (CAP1/CAP0)^((s - S0)/(S1 - S0)) at segment s, CAP1 from S1 on; only training forwards
    count (eval and generate read the cap), the count is in the state dict (resume), and σ² below the cap is
    Eq. 10's own, with its gradient."""
    cap0, cap1, s0, s1 = 1e-1, 1e-5, 2, 6
    model = make_model(sigma_sq_anneal=f'{cap0},{cap1},{s0},{s1}', sigma_sq_min=1e-6).train()
    B, H, T, N, D = 2, 2, 3, 16, 8
    basis = gaussian_basis(N, (0.05, 0.1))
    torch.manual_seed(2)
    keys = torch.randn(B, H, N, D, dtype=F64)
    read = paper.LTMRead(keys, keys, torch.ones(B, dtype=torch.bool), *basis)
    attn = model.layers[0].attn.ltm
    q = torch.randn(B, H, T, D, dtype=F64)
    uncapped = F.softplus(attn.sigma_affine(torch.einsum('bhid,bhnd->bhin', q, keys) * attn.scale)).squeeze(-1)
    for s in range(9):                                         # segment s of training: the cap, then one more counted
        cap = cap0 * (cap1 / cap0) ** min(max((s - s0) / (s1 - s0), 0.0), 1.0)
        _, _, sigma_sq = attn(q, read)
        torch.testing.assert_close(sigma_sq, uncapped.clamp(min=1e-6, max=cap))
        assert int(attn.segments_trained) == s + 1
    attn.eval()
    with torch.no_grad():
        attn(q, read)
    assert int(attn.segments_trained) == 9                    # eval reads, does not count
    assert 'layers.1.attn.ltm.segments_trained' in model.state_dict()
    attn.sigma_affine.bias.data.fill_(math.log(math.expm1(3e-6)))   # σ² under the cap keeps its gradient
    attn.train()
    attn(q, read)[2].sum().backward()
    assert attn.sigma_affine.bias.grad.abs() > 0
    assert 'segments_trained' not in ''.join(make_model().state_dict())   # off: no buffer, old checkpoints load
    for bad in ('1e-2,1e-6,2', '1e-6,1e-2,0,1', 'x,1,2,3', '1e-2,1e-6,5,5', '1e-2,1e-8,0,1'):
        with pytest.raises(ValueError, match='sigma_sq_anneal'):
            Config(sigma_sq_anneal=bad, sigma_sq_min=1e-6)


def test_pointer_readout_is_the_centres_under_softmax_and_points_at_the_matching_key():
    """mu_readout='pointer' (outside the paper): μ = Σ_j softmax(q·k_j/√d)_j μ_j, against a loop over basis
    functions; a query that matches one basis function's key far better than the rest puts μ on that centre,
    wherever it is; μ has a gradient into the keys; σ² stays Eq. 10."""
    model = make_model(mu_readout='pointer')
    attn = model.layers[0].attn.ltm
    assert attn.mu_affine is None
    B, H, T, N, D = 2, 2, 3, 16, 8
    basis = gaussian_basis(N, (0.05, 0.1))
    torch.manual_seed(1)
    q, keys = torch.randn(B, H, T, D, dtype=F64), torch.randn(B, H, N, D, dtype=F64)
    read = paper.LTMRead(keys, torch.randn(B, H, N, D, dtype=F64), torch.ones(B, dtype=torch.bool), *basis)
    with torch.no_grad():
        _, mu, sigma_sq = attn(q, read)
    for b, h, i in np.ndindex(B, H, T):
        s = [float(q[b, h, i] @ keys[b, h, j]) / math.sqrt(D) for j in range(N)]
        w = np.exp(np.array(s) - max(s))
        assert abs(float(mu[b, h, i]) - float((w / w.sum()) @ basis[0].numpy())) < 1e-12
    scores = torch.einsum('bhid,bhnd->bhin', q, keys) * attn.scale
    torch.testing.assert_close(sigma_sq, F.softplus(attn.sigma_affine(scores)).squeeze(-1).clamp(min=1e-4))
    target = 11                                                # one key along every query, norm 40; the rest / 100
    keys = 0.01 * keys
    keys[:, :, target] = 40 * q[:, :, 0] / q[:, :, 0].norm(dim=-1, keepdim=True)
    q = q[:, :, :1].expand(B, H, T, D)
    with torch.no_grad():
        _, mu, _ = attn(q, read._replace(keys=keys))
    torch.testing.assert_close(mu, torch.full_like(mu, float(basis[0][target])), atol=1e-6, rtol=0)
    keys = keys.detach().requires_grad_()                      # the keys (W^K) learn where μ points
    attn(torch.randn(B, H, T, D, dtype=F64), read._replace(keys=keys))[1].sum().backward()
    assert keys.grad.abs().sum() > 0
    with pytest.raises(ValueError, match='mu_readout'):
        Config(mu_readout='softmax')


def test_discrete_read_is_softmax_over_the_signal_at_the_M_points_and_every_point_gets_a_gradient():
    """ltm_read='discrete' (outside the paper): the keys and values are the signal X̄(m/M) = Bᵀψ(m/M) through W^K and
    W^V, and the read is Σ_m softmax(q·k_m/√d)_m v_m, against a loop over the points; unlike a Gaussian read,
    every point's key gets a gradient from one query; the model with it trains (the loss goes down) and refuses
    the Gaussian-only settings."""
    model = make_model(ltm_read='discrete')
    c, attn = model.config, model.layers[0].attn.ltm
    assert attn.mu_affine is None and attn.sigma_affine is None
    torch.manual_seed(2)
    B, H, T, D, M = 2, c.n_head, 3, c.d_head, c.n_samples
    memory = model.init_memory(B, 'cpu')
    memory.ltm_B.normal_()
    memory.ltm_written.fill_(c.seg_len)
    _, reads, _ = model.long_term.begin_segment(memory, [layer.attn.ltm for layer in model.layers])
    read = reads[0]
    ltm_B = memory.ltm_B[0]                                   # no vectors wait, so no write: the LTM as it was
    q = torch.randn(B, H, T, D, dtype=F64)
    with torch.no_grad():
        out, mu, _ = attn(q, read)
    Wk, Wv = attn.key_net.weight.detach().view(H, D, -1), attn.value_net.weight.detach().view(H, D, -1)
    expected = torch.zeros(B, T, H, D, dtype=F64)
    for b, h, i in np.ndindex(B, H, T):
        points = [(m + 1) / M for m in range(M)]
        xbar = [sum(float(evaluate_basis(torch.tensor(t, dtype=F64), model.long_term.basis_mu.double(),
                                         model.long_term.basis_sigma.double())[j]) * ltm_B[b, j]
                    for j in range(c.n_basis)) for t in points]
        s = torch.stack([q[b, h, i] @ (Wk[h] @ x) for x in xbar]) / math.sqrt(D)
        w = torch.softmax(s, 0)
        expected[b, i, h] = sum(w[m] * (Wv[h] @ xbar[m]) for m in range(M))
        assert abs(float(mu[b, h, i]) - float(w @ torch.tensor(points, dtype=F64))) < 1e-6
    with torch.no_grad():                                     # (the model's ψ(m/M) was rounded to float32 once)
        torch.testing.assert_close(out, attn.o_net(expected.reshape(B, T, H * D)), rtol=1e-5, atol=1e-6)
    keys = read.keys.detach().requires_grad_()
    attn(q[:, :, :1], read._replace(keys=keys))[0].square().sum().backward()
    assert (keys.grad.abs().sum(-1) > 0).all()                # every point of every head
    torch.manual_seed(0)
    model = make_model(ltm_read='discrete').train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    idx = torch.randint(0, V, (2, 4 * c.seg_len + 1))
    losses = []
    for _ in range(30):
        memory, total = model.init_memory(2, 'cpu'), 0.0
        for s in range(4):
            x, y = idx[:, s * c.seg_len:(s + 1) * c.seg_len], idx[:, s * c.seg_len + 1:(s + 1) * c.seg_len + 1]
            _, loss, memory, _ = model(x, memory, targets=y)
            total = total + loss
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(total.item())
    assert losses[-1] < 0.7 * losses[0]
    for bad in (dict(sticky=True), dict(sigma_sq_init=1e-3), dict(mu_readout='pointer'), dict(ltm_read='sparse')):
        with pytest.raises(ValueError, match='ltm_read'):
            Config(ltm_read=bad.pop('ltm_read', 'discrete'), **bad)
