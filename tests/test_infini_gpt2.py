"""
CPU tests for model_infini_gpt2.py (Infini-attention on GPT-2, the paper's continual pre-training setting).

What holds against GPT-2 itself (transformers' GPT2LMHeadModel on the same weights, float32, 1e-5):
  - compressive_memory=False: the logits are GPT-2's, segment after segment, and the memory stays empty;
  - with the memory, on an empty memory (every input's first segment): Eq. 6 reads A_mem = 0, so the logits are those
    of GPT-2 whose head n's output is scaled by 1 - sigmoid(β_n) (its columns of c_proj's weight, not the bias);
  - later segments read the memory and differ from GPT-2.
Every layer's attention, over three segments, equals a slow reference written one token and one head at a time
(GPT-2's causal softmax attention + Eq. 3 over every earlier segment's keys and values + Eq. 6), for the linear and
delta updates, in float64 (1e-9; a broken property differs by O(1e-2)). The memory's functions themselves are
model_infini.py's (copies, kept identical by tests/test_copies.py) and tests/test_infini.py checks them alone.
"""

import functools

import pytest
import torch

import _model_tests
import model_infini_gpt2
import train
from _gpt2_util import hub_dir  # noqa: F401  (a fixture)
from _gpt2_util import train_resume_evaluate_sample, write_gpt2_dataset, write_tiny_gpt2
from _model_tests import (F64, V, assert_bf16_forward_backward, assert_greedy_generate_matches_forward,
                          assert_sampled_generate_matches_forward, differs, run_segments, tokens,
                          train_on_repeated_pattern)
from _train_util import flags
from model_infini_gpt2 import Config, Memory, Model, sample_next, sigma
from test_flops import counted_per_token
from test_infini import naive_delta_memory, naive_linear_attention

assert_close = functools.partial(_model_tests.assert_close, atol=1e-9, rtol=1e-7)   # float64 references
CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


def make_model(dtype=F64, seed=0, **overrides):
    """A tiny Infini-attention GPT-2 in eval mode, dropout off; its biases and LayerNorms random too (GPT-2's init
    makes them 0 and 1, where a bias in the wrong place would not show); overrides are Config fields."""
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, n_positions=16, seg_len=4, dropout=0.0,
                  init_std=0.3)
    fields.update(overrides)
    torch.manual_seed(seed)
    model = Model(Config(**fields))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('bias') or '.ln_' in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def spread_gates(model, values=(-1.0, 0.7)):
    """β per head away from gate_init, so that both sides of Eq. 6 enter with different weights."""
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.beta.copy_(torch.tensor(values[:model.config.n_head], dtype=block.attn.beta.dtype))


def load_hf(model, hf):
    """GPT2LMHeadModel's weights into model, Conv1D weights transposed (what pretrained.py does); -> model.
    Only the memory's β is left at its init."""
    own = model.state_dict()
    weights = {k: (v.t() if k.endswith(CONV1D) else v) for k, v in hf.state_dict().items() if k in own}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert sorted(missing) == [f'transformer.h.{n}.attn.beta' for n in range(model.config.n_layer)] and not unexpected
    return model


@pytest.fixture(scope='module')
def hf(tmp_path_factory):
    """A random GPT-2 (2 layers, 2 heads, n_embd 32, 64 positions) written in the hub format, as transformers has it."""
    return write_tiny_gpt2(tmp_path_factory.mktemp('gpt2'), vocab_size=V)


def from_hf(hf, **overrides):
    c = hf.config
    config = Config(vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                    n_positions=c.n_positions, layer_norm_epsilon=c.layer_norm_epsilon, dropout=0.0, seg_len=16,
                    **overrides)
    return load_hf(Model(config), hf).eval()


# -----------------------------------------------------------------------------------------------------------
# 1. GPT-2 itself


def test_parameter_names_are_gpt2s_and_the_memory_adds_only_beta():
    model = make_model()
    names = set(model.state_dict())
    betas = {f'transformer.h.{n}.attn.beta' for n in range(2)}
    gpt2 = names - betas
    assert betas <= names and 'lm_head.weight' in gpt2 and 'transformer.wpe.weight' in gpt2
    assert model.lm_head.weight is model.transformer.wte.weight                   # tied
    assert Model.gpt2_form is True
    assert set(model.lr_multipliers()) == betas


def test_without_the_memory_the_logits_are_gpt2s_segment_after_segment(hf):
    """compressive_memory=False: each segment of 16 tokens read at positions 0..15 gives GPT2LMHeadModel's logits on
    it, and nothing is written."""
    model = from_hf(hf, compressive_memory=False)
    idx = tokens(2, 48, seed=3)
    with torch.no_grad():
        logits, memory = run_segments(model, idx, model.init_memory(2, 'cpu'), 16)
        expected = torch.cat([hf(idx[:, s:s + 16]).logits for s in range(0, 48, 16)], dim=1)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    assert memory.length.tolist() == [0, 0] and not memory.M.any() and not memory.z.any()


def test_an_empty_memory_gives_gpt2_with_each_head_scaled_by_one_minus_its_gate(hf):
    """With the memory on, the first segment reads A_mem = 0 (Eq. 3 on M = 0, z = 0), so Eq. 6 gives
    (1 - sigmoid(β)) A_dot: GPT-2 whose head n's columns of c_proj.weight are scaled by 1 - sigmoid(β_n). The gate's
    init (gate_init = -4) keeps that within 2% of GPT-2; the next segment reads the memory and is not GPT-2's."""
    model = from_hf(hf)
    spread_gates(model, (-4.0, 0.5))
    idx = tokens(2, 32, seed=4)
    scaled = pytest.importorskip('transformers').GPT2LMHeadModel(hf.config).eval()
    scaled.load_state_dict(hf.state_dict())
    D = hf.config.n_embd // hf.config.n_head
    with torch.no_grad():
        for block, hf_block in zip(model.transformer.h, scaled.transformer.h):
            keep = (1 - block.attn.gate()).repeat_interleave(D)              # (C,) per input row of c_proj (Conv1D)
            hf_block.attn.c_proj.weight.mul_(keep[:, None])
        logits, memory = run_segments(model, idx, model.init_memory(2, 'cpu'), 16)
        first, gpt2_second = scaled(idx[:, :16]).logits, scaled(idx[:, 16:]).logits
    torch.testing.assert_close(logits[:, :16], first, atol=1e-5, rtol=0)
    assert differs(logits[:, 16:], gpt2_second)                               # the memory is read
    assert memory.length.tolist() == [32, 32]


# -----------------------------------------------------------------------------------------------------------
# 2. Every layer against a slow reference


@torch.no_grad()
def naive_attention(attn, x, history, rule, gate=None):
    """One InfiniAttention forward for one row, one (query, head) at a time. x (T, C): this segment's normalised
    layer input (ln_1's); history: [(T_s, C)] those of the earlier segments. gate: None = sigmoid(β); 'mem' or 'dot'
    = that side of Eq. 6 only. GPT-2's c_attn holds W_Q, W_K, W_V side by side, each with its bias."""
    T, C = x.shape
    H, D = attn.n_head, attn.d_head
    W, b = attn.c_attn.weight, attn.c_attn.bias

    def project(which, n, y):                       # which: 0 query, 1 key, 2 value; n: the head
        rows = slice(which * C + n * D, which * C + (n + 1) * D)
        return W[rows] @ y + b[rows]

    out = torch.empty_like(x)
    for i in range(T):
        heads = []
        for n in range(H):
            q = project(0, n, x[i])
            # GPT-2's causal softmax attention over positions 0..i of this segment (Eq. 2)
            prob = torch.softmax(torch.stack([q @ project(1, n, x[j]) / D ** 0.5 for j in range(i + 1)]), dim=0)
            A_dot = sum(p * project(2, n, x[j]) for p, j in zip(prob, range(i + 1)))
            # the memory: every earlier segment (Eq. 3 after Eq. 4 or 5)
            if not history:
                A_mem = torch.zeros(D, dtype=F64)
            elif rule == 'linear':
                A_mem = naive_linear_attention(q, [project(1, n, y) for s in history for y in s],
                                               [project(2, n, y) for s in history for y in s])
            else:
                M, z = naive_delta_memory([[(project(1, n, y), project(2, n, y)) for y in s] for s in history], D)
                A_mem = (sigma(q) @ M) / (sigma(q) @ z)
            g = {'mem': 1.0, 'dot': 0.0}.get(gate, torch.sigmoid(attn.beta[n]))
            heads.append(g * A_mem + (1 - g) * A_dot)
        out[i] = attn.c_proj.weight @ torch.cat(heads) + attn.c_proj.bias
    return out


def attention_io(model, idx, seg):
    """Run idx in segments of seg tokens from an empty memory, recording every layer's attention input (ln_1's
    output) and output per segment -> ({n: [inputs]}, {n: [outputs]}), each (B, T, C)."""
    inputs = {n: [] for n in range(model.config.n_layer)}
    outputs = {n: [] for n in range(model.config.n_layer)}

    def record(n):
        def hook(module, args, out):
            inputs[n].append(args[0])
            outputs[n].append(out[0])
        return hook

    hooks = [block.attn.register_forward_hook(record(n)) for n, block in enumerate(model.transformer.h)]
    with torch.no_grad():
        run_segments(model, idx, model.init_memory(idx.size(0), 'cpu'), seg)
    for hook in hooks:
        hook.remove()
    return inputs, outputs


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_every_layer_equals_the_naive_reference_over_segments(rule):
    """Every layer, every segment of 3, both rows: GPT-2's local attention + retrieval from every earlier segment
    (for 'linear' the reference never builds M: it is linear attention over all earlier keys) + the gate."""
    model = make_model(memory_update=rule)
    spread_gates(model)
    seg = model.config.seg_len
    inputs, outputs = attention_io(model, tokens(2, 3 * seg), seg)
    for n, block in enumerate(model.transformer.h):
        for s in range(3):
            for b in range(2):
                history = [inputs[n][r][b] for r in range(s)]
                assert_close(outputs[n][s][b], naive_attention(block.attn, inputs[n][s][b], history, rule))


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_large_gates_give_memory_only_or_local_only(rule):
    seg = 4
    idx = tokens(2, 3 * seg)
    for beta, side in ((40.0, 'mem'), (-40.0, 'dot')):
        model = make_model(memory_update=rule)
        spread_gates(model, (beta, beta))
        inputs, outputs = attention_io(model, idx, seg)
        for n, block in enumerate(model.transformer.h):
            for s in (0, 2):
                history = [inputs[n][r][0] for r in range(s)]
                assert_close(outputs[n][s][0], naive_attention(block.attn, inputs[n][s][0], history, rule, side))


# -----------------------------------------------------------------------------------------------------------
# 3. The memory across segments: it matters, it is causal, it resets, gradient flows through it


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_causality_within_and_across_segments(rule):
    """Over three segments with the memory carried, the logits of position t have gradient from the token embeddings
    of every position <= t (those of earlier segments through the memory only) and from none after t."""
    seg, L = 4, 12
    model = make_model(memory_update=rule)
    spread_gates(model)
    embeddings = []                                        # wte's output of each segment, (B, seg, C)
    hook = model.transformer.wte.register_forward_hook(lambda module, args, out: embeddings.append(out))
    logits, _ = run_segments(model, tokens(2, L), model.init_memory(2, 'cpu'), seg)
    hook.remove()
    for t in (0, 2, 3, 5, 9, 11):
        grads = torch.autograd.grad(logits[:, t].sum(), embeddings, retain_graph=True, allow_unused=True)
        reach = torch.cat([torch.zeros(2, seg, dtype=F64) if g is None else g.abs().sum(-1) for g in grads], dim=1)
        assert (reach[:, t + 1:] == 0).all(), t                # (B, L): nothing after t
        assert (reach[:, :t + 1] > 0).all(), t                 # everything up to t, across segments too


def test_memory_matters_only_when_switched_on():
    """A memory filled from other text changes the logits; compressive_memory=False ignores the memory entirely."""
    idx = tokens(2, 4)
    for on in (True, False):
        model = make_model(compressive_memory=on)
        spread_gates(model)
        with torch.no_grad():
            full = make_model(compressive_memory=True)
            spread_gates(full)
            _, memory_a = run_segments(full, tokens(2, 8, seed=10), full.init_memory(2, 'cpu'), 4)
            _, memory_b = run_segments(full, tokens(2, 8, seed=11), full.init_memory(2, 'cpu'), 4)
            logits_a, logits_b, logits_empty = (model(idx, m)[0] for m in (memory_a, memory_b,
                                                                            model.init_memory(2, 'cpu')))
        for b in range(2):
            assert differs(logits_a[b], logits_b[b]) == on and differs(logits_a[b], logits_empty[b]) == on


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_reset_memory_row_equals_fresh_stream(rule):
    model = make_model(memory_update=rule)
    spread_gates(model)
    with torch.no_grad():
        _, memory = run_segments(model, tokens(3, 8, seed=5), model.init_memory(3, 'cpu'), 4)
        reset = model.reset_memory(memory, torch.tensor([False, True, False]))
        assert reset.length.tolist() == [8, 0, 8] and not reset.M[:, 1].any() and not reset.z[:, 1].any()
        idx = tokens(3, 4, seed=6)
        logits = model(idx, reset)[0]
        kept = model(idx, memory)[0]
        fresh = model(idx[1:2], model.init_memory(1, 'cpu'))[0]
    assert_close(logits[1:2], fresh, atol=1e-12, rtol=0)
    assert_close(logits[0::2], kept[0::2], atol=1e-12, rtol=0)
    assert differs(logits[1], kept[1])


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_loss_of_segment_s_reaches_segment_s_minus_1_through_the_memory(rule):
    """The memory is not detached (the paper backpropagates through it over an input): segment 2's loss gives
    gradient to segment 1's embeddings; a detached memory (train.py between bptt windows) cuts that path."""
    model = make_model(memory_update=rule).train()
    spread_gates(model)
    embeddings = []
    hook = model.transformer.wte.register_forward_hook(lambda mod, args, out: embeddings.append(out))
    idx = tokens(2, 9, seed=3)
    _, _, memory1, _ = model(idx[:, :4], model.init_memory(2, 'cpu'), targets=idx[:, 1:5])
    assert memory1.M.requires_grad and memory1.z.requires_grad
    _, loss2, _, _ = model(idx[:, 4:8], memory1, targets=idx[:, 5:9])
    detached = Memory(M=memory1.M.detach(), z=memory1.z.detach(), length=memory1.length)
    _, loss2_detached, _, _ = model(idx[:, 4:8], detached, targets=idx[:, 5:9])
    hook.remove()
    (grad,) = torch.autograd.grad(loss2, [embeddings[0]], retain_graph=True)
    assert grad.abs().sum() > 0
    assert torch.autograd.grad(loss2_detached, [embeddings[0]], allow_unused=True)[0] is None


def test_bf16_autocast_keeps_the_memory_in_float32():
    model = make_model(dtype=torch.float32)
    assert_bf16_forward_backward(model, ('M', 'z'))


def test_aux_reports_gates_and_lm_loss():
    model = make_model(n_layer=3)
    with torch.no_grad():
        for n, block in enumerate(model.transformer.h):
            block.attn.beta.copy_(torch.tensor([n - 1.0, 2.0 * n], dtype=F64))
    _, loss, _, aux = model(tokens(2, 4), model.init_memory(2, 'cpu'), targets=tokens(2, 4, seed=2))
    expected = torch.sigmoid(torch.tensor([[n - 1.0, 2.0 * n] for n in range(3)], dtype=F64))
    assert_close(aux['gate_head'], expected)
    assert_close(aux['gate'], expected.mean(dim=1))
    assert torch.equal(aux['lm_loss'], loss.detach())


# -----------------------------------------------------------------------------------------------------------
# 4. generate() equals forward() read segment by segment


def generate_setup(with_memory, rule, seg=4, B=2):
    model = make_model(dtype=torch.float32, memory_update=rule, init_std=0.5)
    spread_gates(model)
    memory = None
    if with_memory:
        with torch.no_grad():
            _, memory = run_segments(model, tokens(B, 8, seed=7), model.init_memory(B, 'cpu'), seg)
    return model, memory, memory if memory is not None else model.init_memory(B, 'cpu')


@pytest.mark.parametrize('rule', ['linear', 'delta'])
@pytest.mark.parametrize('with_memory', [False, True])
@pytest.mark.parametrize('prompt_len', [3, 9])
def test_generate_matches_segmentwise_forward(prompt_len, with_memory, rule):
    """Greedy (the logits it picked from, too) and sampled, across several memory writes."""
    model, memory, start = generate_setup(with_memory, rule)
    prompt = tokens(2, prompt_len, seed=prompt_len)
    assert_greedy_generate_matches_forward(model, prompt, 11, memory, start, 4, logits_atol=1e-5)
    assert_sampled_generate_matches_forward(model, prompt, 11, memory, start, 4, sample_next)


def test_generate_without_the_memory_matches_forward():
    model = make_model(dtype=torch.float32, compressive_memory=False, init_std=0.5)
    start = model.init_memory(2, 'cpu')
    assert_greedy_generate_matches_forward(model, tokens(2, 5), 9, None, start, 4, logits_atol=1e-5)


# -----------------------------------------------------------------------------------------------------------
# 5. Config, learning


@pytest.mark.parametrize('bad', [
    dict(n_layer=0), dict(n_head=0), dict(seg_len=0), dict(vocab_size=0), dict(n_positions=0),
    dict(n_embd=30, n_head=4), dict(seg_len=2048), dict(dropout=1.0), dict(memory_update='both'),
    dict(gate_lr_mult=-1.0), dict(gate_init=float('nan')), dict(init_std=0.0), dict(layer_norm_epsilon=0.0),
], ids=str)
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        Config(**bad)


def test_config_defaults_are_gpt2_small():
    c = Config()
    assert (c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.n_positions) == (50257, 12, 12, 768, 1024)
    assert torch.sigmoid(torch.tensor(c.gate_init)) < 0.02


def test_forward_rejects_segment_longer_than_seg_len():
    model = make_model()
    with pytest.raises(ValueError):
        model(tokens(1, 5), model.init_memory(1, 'cpu'))


@pytest.mark.parametrize('rule, on', [('linear', True), ('delta', True), ('linear', False)])
def test_flops_per_token_matches_torch_flop_counter(rule, on):
    """train.py's MFU count against torch's FlopCounterMode over one training step on a written memory
    (tests/test_flops.py's counter, which the other models' counts pass)."""
    torch.manual_seed(0)
    model = Model(Config(vocab_size=64, n_layer=2, n_head=2, n_embd=32, n_positions=16, seg_len=16, dropout=0.0,
                         memory_update=rule, compressive_memory=on)).train()
    assert model.flops_per_token() == pytest.approx(counted_per_token(model), rel=1e-6)


@pytest.mark.parametrize('rule', ['linear', 'delta'])
def test_loss_goes_down_on_repeated_pattern(rule):
    torch.manual_seed(0)
    model = Model(Config(vocab_size=V, n_layer=1, n_head=2, n_embd=32, n_positions=8, seg_len=8, dropout=0.0,
                         memory_update=rule)).train()
    losses = train_on_repeated_pattern(model, 120, detach_memory=True)
    assert sum(losses[-10:]) / 10 < 0.3 * sum(losses[:10]) / 10, (losses[:5], losses[-5:])


# -----------------------------------------------------------------------------------------------------------
# 6. From GPT-2's weights through pretrained.py and train.py (--init_from=gpt2:DIR), end to end


@pytest.fixture(scope='module')
def gpt2_data(tmp_path_factory):
    return write_gpt2_dataset(tmp_path_factory.mktemp('data'))


def test_loaded_through_pretrained_py_it_is_gpt2_without_the_memory_and_beta_stays_at_init(hub_dir):
    import pretrained
    directory, hf = hub_dir
    given = {'seg_len', 'dropout', 'compressive_memory'}
    for on in (False, True):
        config = Config(seg_len=16, dropout=0.0, compressive_memory=on)
        _, model, note, _ = pretrained.init_from_gpt2(f'gpt2:{directory}', 'infini_gpt2', model_infini_gpt2, config,
                                                   given)
        assert note.endswith('left at init: transformer.h.*.attn.beta')
        assert all(torch.equal(block.attn.beta, torch.full((2,), -4.0)) for block in model.transformer.h)
        idx = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits, _ = run_segments(model.eval(), idx, model.init_memory(2, 'cpu'), 16)
            expected = torch.cat([hf(idx[:, :16]).logits, hf(idx[:, 16:]).logits], dim=1)
        if not on:
            torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
        else:                                       # within 2% of each head: close to GPT-2, not equal
            assert differs(logits, expected, atol=1e-5) and not differs(logits, expected, atol=0.1)


def test_train_from_gpt2_resumes_exactly_then_evaluates_and_samples(hub_dir, gpt2_data, tmp_path):
    """As config/infini_gpt2_pg19.py trains (inputs of 2 segments, reset and trained through the memory), from
    gpt2:DIR: 6 steps straight == 3 steps, then a resume to 6 with the directory gone: bit-identical checkpoints
    and logs (dropout on, delta updates). Then --eval_only on the run and sample.py from it."""
    train_resume_evaluate_sample(gpt2_data, tmp_path, hub_dir[0], dict(model='infini_gpt2', seg_len=8,
                                 memory_update='delta'), bptt_segments=2, reset_every=2)


def test_eval_only_from_gpt2_without_the_memory_is_gpt2s_validation_loss(hub_dir, gpt2_data):
    """train.py --init_from=gpt2:DIR --eval_only=True: with compressive_memory=False the validation loss is
    model_gpt2.py's (which tests/test_gpt2.py checks against transformers); with the memory it is not."""
    directory, _ = hub_dir

    def loss(**model):
        return train.train(flags(gpt2_data, 'unused', dict(seg_len=16, **model), init_from=f'gpt2:{directory}',
                                 eval_only=True))['loss']
    gpt2 = loss(model='gpt2')
    assert loss(model='infini_gpt2', compressive_memory=False) == pytest.approx(gpt2, abs=1e-6)
    assert loss(model='infini_gpt2') != pytest.approx(gpt2, abs=1e-6)
