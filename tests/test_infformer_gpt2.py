"""
CPU tests for model_infformer_gpt2.py: the ∞-former's §4.2 setting, GPT-2 + the continuous long-term memory.

1. GPT-2 itself: with the LTM off, or empty, the logits are transformers' GPT2LMHeadModel's on the same weights
   (a tiny random GPT-2 written with save_pretrained, tests/_gpt2_util.py), within 1e-5 in float32.
2. The authors' code: each layer's LTM contribution, over several segments with the memory carried, equals a port of
   deep-spin/infinite-former's finetune_gpt2 LongTermAttention (long_term_attention.py) on the same weights and
   inputs; so do the KL term, the sticky memories' histogram and their update.
3. The contract: the memory matters, causality, the KL term, loss going down, generate() == forward().
"""

import math
import re
from pathlib import Path

import pytest
import torch
import torch.distributions as dist

import train
from _gpt2_util import train_resume_evaluate_sample, write_gpt2_dataset, write_tiny_gpt2
from _train_util import flags, load
from configurator import read_config_file
from _model_tests import (V, assert_greedy_generate_matches_forward, assert_sampled_generate_matches_forward,
                          differs, run_segments, tokens, train_on_repeated_pattern)
from model_infformer_gpt2 import Config, Model, counter_uniforms, sample_next, sample_sticky_points

TINY = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64)     # write_tiny_gpt2's defaults
LTM = dict(seg_len=16, n_basis=16, n_samples=16, basis_widths='0.05,0.1', ltm_reset_len=48, dropout=0.0)


def make_model(seed=0, init_std=0.5, **overrides):
    """A tiny ∞-former GPT-2 (vocab V) in eval mode; overrides are Config fields."""
    fields = dict(TINY, vocab_size=V, **LTM, init_std=init_std)
    fields.update(overrides)
    torch.manual_seed(seed)
    return Model(Config(**fields)).eval()


def load_hf(model, hf):
    """HF GPT2LMHeadModel's weights into ours: the same names, Conv1D (in, out) weights transposed to nn.Linear's."""
    conv = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
    state = {k: v.t() if k.endswith(conv) else v for k, v in hf.state_dict().items()
             if not k.endswith(('.attn.bias', '.attn.masked_bias'))}              # the causal-mask buffers
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and missing and all('.ltm.' in k for k in missing)   # only the LTM stays at its init
    return model


@pytest.fixture(scope='module')
def hf_and_ours(tmp_path_factory):
    hf = write_tiny_gpt2(tmp_path_factory.mktemp('gpt2'))
    torch.manual_seed(1)
    ours = Model(Config(**TINY, **LTM))
    return hf, load_hf(ours, hf).eval()


# --- 1. GPT-2 itself ----------------------------------------------------------------------------------------


def test_ltm_off_gives_transformers_logits_segment_by_segment(hf_and_ours):
    hf, ours = hf_and_ours
    ours.config.ltm = False
    try:
        idx = torch.randint(0, 50257, (2, 48), generator=torch.Generator().manual_seed(0))
        memory = ours.init_memory(2, 'cpu')
        with torch.no_grad():
            for s in range(0, 48, 16):
                logits, _, memory, _ = ours(idx[:, s:s + 16], memory)   # memory carried, never read
                torch.testing.assert_close(logits, hf(idx[:, s:s + 16]).logits, atol=1e-5, rtol=0)
    finally:
        ours.config.ltm = True


def test_empty_ltm_gives_transformers_logits_and_a_full_one_changes_them(hf_and_ours):
    hf, ours = hf_and_ours
    idx = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first, _, memory, _ = ours(idx[:, :16], ours.init_memory(2, 'cpu'))
        second, _, _, _ = ours(idx[:, 16:], memory)
        reference = hf(idx[:, 16:]).logits
    torch.testing.assert_close(first, hf(idx[:, :16]).logits, atol=1e-5, rtol=0)
    assert differs(second, reference, atol=1e-3)     # the LTM now holds the first segment: GPT-2's logits move


def test_train_from_gpt2_dir_resumes_exactly_evaluates_and_samples(hf_and_ours, tmp_path):
    """train.py --init_from=gpt2:DIR --model=infformer_gpt2 (pretrained.py's loader): the checkpoint's
    GPT-2 part after a step at lr 0 is transformers' weights; 6 steps straight == 3, then a resume to 6 with the
    directory gone (bit-identical, dropout and sticky memories on); --eval_only; sample.py."""
    directory = tmp_path / 'gpt2'
    hf = write_tiny_gpt2(directory)
    data = write_gpt2_dataset(tmp_path / 'data')
    fields = dict(model='infformer_gpt2', **{k: v for k, v in LTM.items() if k != 'dropout'}, sticky=True)
    train.train(flags(data, tmp_path / 'lr0', fields, init_from=f'gpt2:{directory}', max_iters=1, learning_rate=0.0))
    saved = load(tmp_path / 'lr0' / 'ckpt.pt')['model']
    conv = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
    for name, p in hf.state_dict().items():
        if name in saved:
            assert torch.equal(saved[name], p.t() if name.endswith(conv) else p), name

    logged = train_resume_evaluate_sample(data, tmp_path, directory, fields)
    assert any(r.get('train/kl_loss', 0) > 0 for r in logged)                           # the KL term is logged


# --- 2. The authors' code -------------------------------------------------------------------------------------
# Ported from deep-spin/infinite-former, finetune_gpt2/src/transformers/models/gpt2/ (only what the comparison
# runs): long_term_attention.py LongTermAttention (__init__'s compute_G, its positions and the infinite-memory
# G_inf and samples; update_inf; value_function; score; forward's continuous softmax branch with affines and the KL),
# basis_functions.py GaussianBasisFunctions (evaluate, integrate_psi_gaussian) and continuous_softmax.py
# ContinuousSoftmaxFunction.forward (E_p[ψ] from theta). Changes: their constants (length = nb_samples = 512,
# mem_threshold 2048, device 'cuda') are arguments; G is computed in float64, as ours (theirs: float32); the sticky
# points are an argument (theirs: drawn with torch.distributions inside update_inf).


class AuthorsGaussianBasis:
    def __init__(self, mu, sigma):
        self.mu, self.sigma = mu.unsqueeze(0), sigma.unsqueeze(0)

    def _phi(self, t):
        return 1. / math.sqrt(2 * math.pi) * torch.exp(-.5 * t ** 2)

    def evaluate(self, t):
        return self._phi((t - self.mu) / self.sigma) / self.sigma

    def integrate_psi_gaussian(self, mu, sigma_sq):
        sigma = torch.sqrt(self.sigma ** 2 + sigma_sq)
        return self._phi((mu - self.mu) / sigma) / sigma


class AuthorsLongTermAttention:
    """Their LongTermAttention(continuous=True, affines=True, mask=True, mask_type='cnn', infinite_memory=True,
    attn_func='softmax') on our layer's weights (proj_key, proj_value, attn_out, mask_net, mu, sigma)."""

    def __init__(self, ours, head_size, n_heads, length, attn_num_basis, nb_samples, mem_threshold, sticky,
                 sigma_0=.05, mu_0=-1):
        self.proj_key, self.proj_value, self.attn_out = ours.key_net, ours.value_net, ours.o_net
        self.mask_net, self.mu, self.sigma = ours.gate, ours.mu_affine, ours.sigma_affine
        self.head_size, self.n_head, self.attn_num_basis = head_size, n_heads, attn_num_basis
        self.length, self.nb_samples, self.mem_threshold = length, nb_samples, mem_threshold
        self.sticky_memories = sticky
        self.sigma_0, self.mu_0, self.tau, self.ridge_penalty = sigma_0, mu_0, 0.5, 0.5
        self.count, self.B_past, self.attn_past = 0, None, None
        f64 = torch.float64

        def compute_G(l, psi, positions, padding=True):
            F = psi.evaluate(positions.unsqueeze(1)).t()
            I = torch.eye(self.attn_num_basis, dtype=f64)
            G = F.t().matmul((F.matmul(F.t()) + self.ridge_penalty * I).inverse())
            if padding:
                if l % 2:
                    G = G[((l - 1) // 2):(-(l - 1) // 2), :]
                else:
                    G = G[(l // 2):-(l // 2), :]
            return G.float()

        sigmas = [.05, .1]   # (theirs: [.005, .01], as our default; the test's N = 16 wants wider ones)
        mu, sigma = torch.meshgrid(torch.linspace(0, 1, attn_num_basis // len(sigmas), dtype=f64),
                                   torch.tensor(sigmas, dtype=f64), indexing='ij')
        self.psi = AuthorsGaussianBasis(mu.flatten(), sigma.flatten())
        l = length
        shift = 1 / float(2 * l)
        positions = torch.linspace(-.5 + shift, 1.5 - shift, 2 * l, dtype=f64)
        self.G = compute_G(l, self.psi, positions)
        tm_tau = torch.arange(1, self.nb_samples + 1).to(f64)
        tm_l = torch.arange(self.nb_samples + 1, length + self.nb_samples + 1).to(f64)
        tm_tau = tm_tau * self.tau / self.nb_samples
        tm_l = self.tau + (1 - self.tau) * (tm_l - self.nb_samples) / length
        positions_inf = torch.cat([tm_tau, tm_l], 0)
        shift = 1 / float(2 * length + self.nb_samples)
        positions_pad = torch.linspace(-.5 + shift, 1.5 - shift, 2 * (length + self.nb_samples), dtype=f64)
        positions_inf = torch.cat([positions_pad[positions_pad < 0], positions_inf, positions_pad[positions_pad > 1]])
        self.samples = torch.cat([self.psi.evaluate(t / self.tau) for t in tm_tau], dim=0).float()
        self.G_inf = compute_G(self.nb_samples + length, self.psi, positions_inf)
        self.bins = torch.linspace(0, 1, 129)
        self.psi32 = AuthorsGaussianBasis(mu.flatten().float(), sigma.flatten().float())

    def value_function(self, x, inf=False):
        B = torch.matmul(x, self.G_inf if inf else self.G)   # [B,e,N]
        return B.permute(0, 2, 1)

    def update_inf(self, x, ts=None):
        if self.B_past is not None:
            if self.sticky_memories:
                n = dist.Normal(self.attn_past[0], self.attn_past[1])
                bins = self.bins.clone()
                bins[0] = -.000001
                bins[-1] = 1.000001
                p = (n.cdf(bins[1:].repeat(self.attn_past[0].size(1), x.size(0), 1).permute(2, 1, 0))
                     - n.cdf(bins[:-1].repeat(self.attn_past[0].size(1), x.size(0), 1).permute(2, 1, 0))).sum(-1) \
                    .transpose(1, 0)
                self.p = p / p.sum(-1).repeat(p.size(-1), 1).transpose(1, 0)
                samples = torch.stack([self.psi32.evaluate(t.unsqueeze(1)) for t in ts])   # (ts: given)
                xm_tau = self.B_past.transpose(-1, -2).matmul(samples.transpose(-1, -2))
            else:
                xm_tau = self.B_past.transpose(-1, -2).matmul(self.samples.transpose(-1, -2))
            x = torch.cat([xm_tau, x], dim=2)
            B = self.value_function(x, inf=True)
        else:
            B = self.value_function(x)
        self.B_past = B.detach()
        return B

    def forward(self, k, q, ts=None):
        batch_size, qlen, klen = k.size(0), q.size(2), k.size(1)
        self.d_head = self.head_size
        if self.count >= self.mem_threshold:
            self.B_past = None
            self.count = 0
        k = k.permute(0, 2, 1)
        k = k * torch.sigmoid(self.mask_net(k))
        B = self.update_inf(k, ts)
        self.count += klen
        keys = self.proj_key(B).view(batch_size, self.attn_num_basis, self.n_head, self.d_head).transpose(1, 2)
        values = self.proj_value(B).view(batch_size, self.attn_num_basis, self.n_head, self.d_head).transpose(1, 2)
        scores = torch.matmul(q / (self.d_head ** 0.5), keys.transpose(-1, -2))
        mu = torch.sigmoid(self.mu(scores))
        sigma_sq = torch.nn.functional.softplus(self.sigma(scores))
        mu = mu.view(-1)
        sigma_sq = torch.clamp(sigma_sq, min=1e-4).view(-1)
        if self.sticky_memories:
            self.attn_past = [mu.view(batch_size, -1), sigma_sq.view(batch_size, -1) ** (1 / 2)]
        sigma_0_sq = self.sigma_0 ** 2
        if self.mu_0 > 0:
            kl_reg = 1 / 2 * (sigma_sq.view(batch_size, -1) / sigma_0_sq
                              - torch.log(sigma_sq.view(batch_size, -1) / sigma_0_sq) - 1)
        else:
            kl_reg = 1 / 2 * (sigma_sq.view(batch_size, -1) / sigma_0_sq
                              - torch.log(sigma_sq.view(batch_size, -1) / sigma_0_sq) - 1
                              + (mu.view(batch_size, -1) - self.mu_0) ** 2 / sigma_0_sq)
        theta = torch.zeros(batch_size * self.n_head * qlen, 2)
        theta[:, 0] = mu / sigma_sq
        theta[:, 1] = -1. / (2. * sigma_sq)
        sigma_sq_ = (-.5 / theta[:, 1]).unsqueeze(1)                  # ContinuousSoftmaxFunction.forward
        r = self.psi32.integrate_psi_gaussian(theta[:, 0].unsqueeze(1) * sigma_sq_, sigma_sq_)
        r = r.view(batch_size, self.n_head, qlen, self.attn_num_basis).permute(0, 1, 3, 2)
        context = torch.matmul(values.transpose(-1, -2), r)
        context = context.permute(0, 3, 1, 2).contiguous().view(batch_size, qlen, self.n_head * self.d_head)
        return self.attn_out(context), kl_reg


def record_layers(model):
    """Forward hooks: per call, each layer's input (what its LTM stores), query and LTM contribution."""
    calls = []

    def block_hook(n):
        def hook(module, args):
            calls[-1].setdefault(n, {})['x'] = args[0].detach()
        return hook

    def ltm_hook(n):
        def hook(module, args, output):
            calls[-1][n].update(q=args[0].detach(), z=output[0].detach(), written=args[1].written)
        return hook

    for n, block in enumerate(model.transformer.h):
        block.register_forward_pre_hook(block_hook(n))
        block.attn.ltm.register_forward_hook(ltm_hook(n))
    return calls


@pytest.mark.parametrize('sticky', [False, True])
def test_ltm_contribution_equals_the_authors_long_term_attention_over_segments(sticky):
    """7 segments of 16 with threshold 48: writes grow the LTM 3 times, then it is emptied, then it grows again."""
    B, L = 1, 16                                     # their memory is one for the batch: one row keeps it simple
    model = make_model(sticky=sticky, init_std=0.2)
    c = model.config
    theirs = [AuthorsLongTermAttention(block.attn.ltm, c.d_head, c.n_head, L, c.n_basis, c.n_samples,
                                       c.ltm_reset_len, sticky) for block in model.transformer.h]
    calls = record_layers(model)
    idx = tokens(B, 7 * L, seed=3)
    memory = model.init_memory(B, 'cpu')
    for s in range(7):
        points = [sample_sticky_points(memory.ltm_hist[n] + 1e-12, counter_uniforms(memory.ltm_rng * c.n_layer + n,
                                                                                    c.n_samples))
                  for n in range(c.n_layer)]
        hist_before = memory.ltm_hist.clone()
        calls.append({})
        with torch.no_grad():
            _, _, memory, aux = model(idx[:, s * L:(s + 1) * L], memory, targets=idx[:, s * L:(s + 1) * L])
        kl_theirs = None
        for n, layer in enumerate(theirs):
            if s == 0:                                           # their Block.mem is None: no LTM term, no write
                assert not calls[s][n]['written'].any()
                continue
            with torch.no_grad():
                context, kl_reg = layer.forward(calls[s - 1][n]['x'], calls[s][n]['q'], points[n])
            torch.testing.assert_close(calls[s][n]['z'], context, atol=1e-5, rtol=1e-4)
            assert calls[s][n]['written'].all() and context.abs().max() > 1e-3
            kl_theirs = kl_reg if kl_theirs is None else kl_theirs + kl_reg
            if sticky and s in (2, 3, 5, 6):                  # a write that sampled the old signal
                torch.testing.assert_close(hist_before[n], layer.p.float(), atol=1e-5, rtol=1e-4)
        if s:
            torch.testing.assert_close(aux['kl_loss'], kl_theirs.mean(), rtol=1e-5, atol=0)   # the Trainer's mean
    assert memory.ltm_written.tolist() == [3 * L]     # written: 16, 32, 48, emptied: 16, 32, 48, as their count


def test_sticky_points_are_bin_left_edges_drawn_from_the_histogram():
    hist = torch.tensor([[0.0, 1.0, 0.0, 3.0]])
    t = sample_sticky_points(hist, counter_uniforms(torch.tensor([5]), 4000))
    assert set(t.flatten().tolist()) == {0.25, 0.75}              # the left edges of the bins with mass
    assert torch.equal(t, t.sort(dim=-1).values)
    assert abs((t == 0.75).float().mean().item() - 0.75) < 0.03


# --- The configs ---------------------------------------------------------------------------------------------
# §4.2's figures, then the authors' finetune_gpt2: README command, config.json, long_term_attention.py constants,
# training_args.py's learning_rate_ltm, and the Hugging Face Trainer defaults the command leaves in place.
SECTION_4_2 = dict(init_from='gpt2', seg_len=512, n_basis=512, ltm_reset_len=2048)
AUTHORS = dict(batch_size=1, gradient_accumulation_steps=1, eval_batch_size=1, beta1=0.9, beta2=0.999,
               kl_weight=1e-6, dropout=0.1, basis_widths='0.005,0.01', ridge_lambda=0.5, unbounded=True, tau=0.5,
               n_samples=512, sticky_bins=128, cnn_gate=True, sigma_0=0.05, mu_0=-1.0, sigma_sq_min=1e-4,
               ltm_lr_mult=5.0, learning_rate=5e-5, min_lr=0.0, warmup_iters=0, weight_decay=0.0, grad_clip=1.0)


@pytest.mark.parametrize('name, dataset', [('infformer_gpt2_pg19.py', 'pg19_2000'),     # prepare.py --books=2000
                                           ('infformer_gpt2_wt103.py', 'wikitext103')])
def test_configs_have_section_4_2_figures_and_the_authors_values(name, dataset):
    values = read_config_file(Path(__file__).resolve().parent.parent / 'config' / name)
    assert values['model'] == 'infformer_gpt2' and values['dataset'] == dataset
    assert {k: values[k] for k in {**SECTION_4_2, **AUTHORS}} == {**SECTION_4_2, **AUTHORS}
    fields = {k: v for k, v in values.items() if k in Config.__dataclass_fields__}
    Config(**fields)                                                # the model takes them
    assert all(getattr(Config(), k) == v for k, v in fields.items())   # and they are its defaults


# --- 3. The contract ----------------------------------------------------------------------------------------


def test_output_depends_on_earlier_segments_through_the_ltm_only():
    """Two different first segments, the same second: the second's logits differ with the LTM, not without it."""
    a, b, shared = tokens(2, 16, seed=1), tokens(2, 16, seed=2), tokens(2, 16, seed=3)
    for ltm, expect in ((True, True), (False, False)):
        model = make_model(ltm=ltm)
        with torch.no_grad():
            after_a, _ = run_segments(model, torch.cat([a, shared], 1), model.init_memory(2, 'cpu'), 16)
            after_b, _ = run_segments(model, torch.cat([b, shared], 1), model.init_memory(2, 'cpu'), 16)
        assert differs(after_a[:, 16:], after_b[:, 16:]) == expect


def test_causal_within_the_segment_with_a_full_ltm():
    model = make_model()
    with torch.no_grad():
        _, memory = run_segments(model, tokens(2, 32, seed=4), model.init_memory(2, 'cpu'), 16)
        x = tokens(2, 16, seed=5)
        y = x.clone()
        y[:, 9] = (y[:, 9] + 1) % V
        lx, _, _, _ = model(x, memory)
        ly, _, _, _ = model(y, memory)
    torch.testing.assert_close(lx[:, :9], ly[:, :9], atol=0, rtol=0)
    assert differs(lx[:, 9:], ly[:, 9:])


def test_kl_term_is_added_when_on_and_reaches_the_density_maps():
    x, y = tokens(2, 16, seed=6), tokens(2, 16, seed=7)
    model = make_model(kl_weight=1e-2)
    _, _, memory, aux = model(x, model.init_memory(2, 'cpu'), targets=y)
    assert aux['kl_loss'] == 0                                    # an empty LTM is not read: no KL
    _, loss, _, aux = model(x, memory, targets=y)
    assert aux['kl_loss'] > 0
    torch.testing.assert_close(loss.detach(), aux['lm_loss'] + 1e-2 * aux['kl_loss'])
    model.zero_grad()
    (loss - aux['lm_loss']).backward()                            # the KL term alone
    ltm = model.transformer.h[0].attn.ltm
    assert ltm.mu_affine.weight.grad.abs().sum() > 0 and ltm.sigma_affine.weight.grad.abs().sum() > 0
    off = make_model(kl_weight=0.0)
    _, _, memory, _ = off(x, off.init_memory(2, 'cpu'), targets=y)
    _, loss, _, aux = off(x, memory, targets=y)
    assert 'kl_loss' not in aux and torch.equal(loss.detach(), aux['lm_loss'])


def test_loss_goes_down_and_the_ltm_learns():
    model = make_model(init_std=0.02, seg_len=8, n_positions=16, n_samples=8).train()
    before = model.transformer.h[0].attn.ltm.key_net.weight.detach().clone()
    losses = train_on_repeated_pattern(model, steps=30)
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert differs(model.transformer.h[0].attn.ltm.key_net.weight, before, atol=1e-4)


def test_ltm_parameters_get_the_authors_learning_rate():
    model = make_model()
    multipliers = model.lr_multipliers()
    ltm_names = {n for n, _ in model.named_parameters() if '.attn.ltm.' in n}
    assert set(multipliers) == ltm_names and set(multipliers.values()) == {5.0}
    assert len(ltm_names) == 7 * model.config.n_layer          # W^K, W^V, W^O, μ, σ², the gate's weight and bias


@pytest.mark.parametrize('prompt_len', [3, 16, 21])
@pytest.mark.parametrize('sticky,with_memory', [(False, False), (False, True), (True, True)])
def test_greedy_generate_matches_segmentwise_forward(prompt_len, sticky, with_memory):
    """In float64, so the logits agree to 1e-8 (float32 rounding through the ridge fit of init_std=0.5 hidden states
    reaches ~1e-3)."""
    model = make_model(seg_len=8, n_samples=8, sticky=sticky, ltm_reset_len=24).double()
    start = model.init_memory(2, 'cpu')
    memory = None
    if with_memory:
        with torch.no_grad():
            _, memory = run_segments(model, tokens(2, 20, seed=7), start, 8)
        start = memory
    assert_greedy_generate_matches_forward(model, tokens(2, prompt_len, seed=prompt_len), 30, memory, start, 8,
                                           logits_atol=1e-8)


def test_sampled_generate_matches_segmentwise_forward():
    model = make_model(seg_len=8, n_samples=8, ltm_reset_len=24)
    assert_sampled_generate_matches_forward(model, tokens(2, 5, seed=5), 20, None, model.init_memory(2, 'cpu'), 8,
                                            sample_next)


@pytest.mark.parametrize('fields, message', [
    (dict(seg_len=128), 'seg_len (128) must be <= n_positions'),
    (dict(n_head=3), 'must be a multiple of n_head'),
    (dict(n_basis=15), 'n_basis must be a multiple'),
    (dict(tau=1.0), 'tau must be in'),
    (dict(basis_widths='a'), 'basis_widths must be'),
])
def test_bad_config_is_a_value_error(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Config(**{**TINY, **LTM, **fields})


@pytest.mark.parametrize('fields', [dict(), dict(sticky=True), dict(cnn_gate=False), dict(unbounded=False),
                                    dict(ltm=False)], ids=['default', 'sticky', 'no_gate', 'bounded', 'ltm_off'])
def test_flops_per_token_matches_torch_flop_counter(fields):
    """As tests/test_flops.py checks the other models: one training step with a full memory, per token."""
    from test_flops import counted_per_token
    model = make_model(vocab_size=64, n_samples=24, n_basis=32, **fields).train()
    assert model.flops_per_token() == pytest.approx(counted_per_token(model), rel=1e-6)
