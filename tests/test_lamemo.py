"""
CPU tests for LaMemo's look-ahead memory, model_lamemo.py (SPEC §2, seed 002).

Tiny configs (1-2 layers, n_embd 16, vocab 97, seg_len 4). Exact properties are checked in float64
(model.double()); comparisons with a naive reference allow ~1e-5, the size of the merge's ε (1e-6, as the authors'
code) and of the float32 sinusoid, far below the O(1e-1) differences a broken property produces.
"""

import math

import pytest
import torch

import model_lamemo
import model_xl
from _model_tests import (F64, V, assert_close, assert_greedy_generate_matches_forward,
                          assert_sampled_generate_matches_forward, differs, run_segments, sinusoid, tokens,
                          train_on_repeated_pattern)
from _model_tests import assert_bf16_forward_backward
from model_lamemo import Config, Memory, Model, future_position_scores, lookahead_merge, sample_next


def make_model(dtype=F64, seed=0, **overrides):
    """A tiny LaMemo model in eval mode with dropout off."""
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4, mem_len=6)
    fields.update(overrides)
    torch.manual_seed(seed)
    return Model(Config(**fields)).to(dtype).eval()


def xl_twin(model):
    """Plain Transformer-XL (model_xl.py) with the same weights (everything but v+), on SDPA: its einsum path takes
    the softmax in float32, LaMemo's in float64 under model.double()."""
    config = model_xl.Config(**{**model.config.__dict__, 'attn_kernel': 'sdpa'})
    xl = model_xl.Model(config).to(model.r_w_bias.dtype).eval()
    state = {k: v for k, v in model.state_dict().items() if k != 'r_r_bias_future'}
    xl.load_state_dict(state)
    return xl


def refreshed_states(model, idx, memory):
    """The open segment (model_lamemo.OpenSegment) after the first tokens idx (B, T) of a segment, without dropout."""
    return model._open_segment(model.word_emb(idx), memory)[1]


def memory_inputs(model, idx, memory):
    """m^l (B, M, C), the memory input of every layer l, for the segment whose first tokens are idx (B, T): the
    stored m^0, then what each layer's refresh (Block.refresh) hands to the next."""
    inputs = [memory.mem[0]]

    def recording(refresh):
        def wrapped(*args):
            out = refresh(*args)
            inputs.append(out[0])
            return out
        return wrapped

    for layer in model.layers[:-1]:                              # the last layer refreshes nothing
        layer.refresh = recording(layer.refresh)
    try:
        refreshed_states(model, idx, memory)
    finally:
        for layer in model.layers[:-1]:
            del layer.refresh
    return inputs


# -----------------------------------------------------------------------------------------------------------
# 1. the pieces against naive references


@pytest.mark.parametrize('M,W', [(1, 1), (2, 2), (5, 3), (8, 8), (8, 3), (9, 4), (12, 4), (7, 2)])
def test_future_position_scores_equal_naive_dot_products(M, W):
    """y[i, j] = q_i · r_k[distance - 1] with the window key at position M - W + 1 + j, for every key on the
    query's right, in float64; the blockwise skew is checked for M a multiple of W and not."""
    g = torch.Generator().manual_seed(M * 10 + W)
    q = torch.randn(2, 3, M, 4, generator=g, dtype=F64)
    r_k = torch.randn(3, M, 4, generator=g, dtype=F64)
    y = future_position_scores(q, r_k, W)
    assert y.shape == (2, 3, M, W)
    checked = 0
    for i in range(M):
        for j in range(W):
            distance = (M - W + 1 + j) - i
            if distance >= 1:                          # keys at or left of the query are masked: not checked
                torch.testing.assert_close(y[..., i, j], (q[..., i, :] * r_k[:, distance - 1]).sum(-1),
                                           rtol=0, atol=1e-12)
                checked += 1
    assert checked == sum(min(W, M - i) for i in range(M))


def naive_softmax_attention(scores, values):
    """softmax over the keys (last dim of scores (..., K)), then the weighted sum of values (..., K, D)."""
    prob = torch.exp(scores - scores.max(-1, keepdim=True).values)
    prob = prob / prob.sum(-1, keepdim=True)
    return (prob[..., None] * values).sum(-2)


@pytest.mark.parametrize('offset', [0.0, 30.0, -30.0, 1000.0])
def test_merge_equals_one_softmax_over_old_and_new_keys(offset):
    """α-merge of two attentions over disjoint key sets, from their outputs and log-sum-exps only, equals one
    softmax over the union (ε = 0: exact in float64; the default ε = 1e-6 moves it by < 1e-5). offset shifts one
    side's scores far up or down: the merge must stay finite (e^1000 overflows even float64)."""
    g = torch.Generator().manual_seed(0)
    B, H, M, D, K_old, K_new = 2, 3, 5, 4, 7, 3
    s_old = torch.randn(B, H, M, K_old, generator=g, dtype=F64) * 3 + offset
    s_new = torch.randn(B, H, M, K_new, generator=g, dtype=F64) * 3
    v_old = torch.randn(B, H, M, K_old, D, generator=g, dtype=F64)
    v_new = torch.randn(B, H, M, K_new, D, generator=g, dtype=F64)
    old = naive_softmax_attention(s_old, v_old), torch.logsumexp(s_old, -1)
    new = naive_softmax_attention(s_new, v_new), torch.logsumexp(s_new, -1)
    joint = naive_softmax_attention(torch.cat([s_old, s_new], -1), torch.cat([v_old, v_new], -2))
    joint_lse = torch.logsumexp(torch.cat([s_old, s_new], -1), -1)

    vec, lse = lookahead_merge(*old, *new, eps=0.0)
    assert torch.isfinite(vec).all()
    assert_close(vec, joint, atol=1e-12, rtol=0)
    assert_close(lse, joint_lse, atol=1e-12, rtol=1e-14)
    vec_eps, _ = lookahead_merge(*old, *new)
    assert_close(vec_eps, joint, atol=1e-5, rtol=0)


def test_merge_detaches_the_old_side_only():
    g = torch.Generator().manual_seed(1)
    old_vec, new_vec = (torch.randn(1, 1, 3, 2, generator=g, requires_grad=True) for _ in range(2))
    old_lse, new_lse = (torch.randn(1, 1, 3, generator=g, requires_grad=True) for _ in range(2))
    vec, _ = lookahead_merge(old_vec, old_lse, new_vec, new_lse)
    grads = torch.autograd.grad(vec.sum(), [old_vec, old_lse, new_vec, new_lse], allow_unused=True)
    assert grads[0] is None and grads[1] is None                       # sg(C_old), sg(s_old)
    assert grads[2].abs().sum() > 0 and grads[3].abs().sum() > 0       # α keeps its gradient through s_new


@torch.no_grad()
def naive_layer0_memory_state(model, idx, P, S):
    """Layer 0's attention output for position P after the look-ahead of the segment starting at S (P < S), one
    (key, head) at a time: one softmax over every key 0..S, keys at or left of P with distance P - j and bias v,
    keys on its right with distance j - P and bias v+. (At layer 0 a position's key depends on its token only, so
    the union of what P attended when it was made and in every look-ahead window since is exactly 0..S.)
    Returns (B, H, D)."""
    c = model.config
    attn = model.layers[0].attn
    H, D = c.n_head, c.d_head
    u, v = model.r_w_bias[0], model.r_r_bias[0]
    v_future = model.r_r_bias_future[0]
    W_q = attn.q_net.weight
    W_k, W_v = attn.kv_net.weight.split(H * D)
    W_r = attn.r_net.weight
    norm = attn.layer_norm if c.pre_lnorm else (lambda x: x)
    emb = model.word_emb(idx)                                    # (B, L, C)
    out = torch.empty(idx.size(0), H, D, dtype=F64)
    for b in range(idx.size(0)):
        for n in range(H):
            rows = slice(n * D, (n + 1) * D)
            q = W_q[rows] @ norm(emb[b, P])
            scores, values = [], []
            for j in range(S + 1):
                distance, bias = (P - j, v[n]) if j <= P else (j - P, v_future[n])
                if c.clamp_len > 0:
                    distance = min(distance, c.clamp_len)
                k = W_k[rows] @ norm(emb[b, j])
                scores.append(((q + u[n]) @ k + (q + bias) @ (W_r[rows] @ sinusoid(distance, c.n_embd)))
                              / math.sqrt(D))
                values.append(W_v[rows] @ norm(emb[b, j]))
            out[b, n] = naive_softmax_attention(torch.stack(scores), torch.stack(values))
    return out


@pytest.mark.parametrize('lengths', [[4, 4, 4], [4, 3, 4, 2]], ids=str)
@pytest.mark.parametrize('extra', [{}, dict(pre_lnorm=True, clamp_len=3, untie_r=False)], ids=str)
def test_refreshed_memory_equals_naive_joint_softmax_over_steps(lengths, extra):
    """The whole mechanism at layer 0 over several steps: after the look-ahead of each segment, every memory
    position's merged attention output equals one softmax over everything up to the segment's first token. This
    checks the window (previous segment's length, ending at the first token, keys on the right), the future
    distances with v+, the stored normalisers and the merge across steps: a window that skips or repeats a key,
    or a wrong distance or bias, fails it. mem_len holds the whole stream so nothing is evicted."""
    L = sum(lengths)
    model = make_model(mem_len=16, **extra)
    idx = tokens(2, L + 1, seed=4)
    memory = model.init_memory(2, 'cpu')
    start, checked = 0, 0
    with torch.no_grad():
        for n in lengths + [1]:
            M = memory.mem.size(2)
            merged = refreshed_states(model, idx[:, start:start + n], memory).mem_states[0][0]   # (B, H, M, D) layer 0
            for P in range(max(0, start - 5), start):            # the newest memory positions (slot M - start + P)
                expected = naive_layer0_memory_state(model, idx, P, start)
                assert_close(merged[:, :, M - start + P], expected, atol=1e-5, rtol=0)
                checked += 1
            _, _, memory, _ = model(idx[:, start:start + n], memory)
            start += n
    assert checked > 10


# -----------------------------------------------------------------------------------------------------------
# 2. what the refresh changes, and what it must not


def test_empty_memory_gives_transformer_xl_outputs():
    """A fresh stream has nothing to refresh: the first segment's logits are plain Transformer-XL's."""
    model = make_model()
    xl = xl_twin(model)
    idx = tokens(2, 4)
    with torch.no_grad():
        la_logits, _, la_memory, _ = model(idx, model.init_memory(2, 'cpu'))
        xl_logits, _, xl_memory, _ = xl(idx, xl.init_memory(2, 'cpu'))
    assert_close(la_logits, xl_logits, atol=1e-12, rtol=0)
    assert torch.equal(la_memory.mem[0], xl_memory.mem[0])      # layer 0's memory: the same embeddings


def test_memory_input_of_upper_layers_is_refreshed_by_the_tokens_on_its_right(monkeypatch):
    """After segment A, a perturbation of layer 0's stored memory at slot j changes layer 1's memory input at the
    slots i < j in the look-ahead window (they now see slot j) and at j itself, never at i > j (the look-ahead only
    looks right; what i saw on its left is stored). Layer 0's memory input is the stored embeddings, refreshed by
    nothing. With the merge switched off (α = 1) layer 1's memory input is plain Transformer-XL's memory; with it
    on, it differs."""
    model = make_model(seg_len=4, mem_len=6)
    xl = xl_twin(model)
    a, b = tokens(2, 4, seed=1), tokens(2, 4, seed=2)
    with torch.no_grad():
        _, _, memory, _ = model(a, model.init_memory(2, 'cpu'))
        _, _, xl_memory, _ = xl(a, xl.init_memory(2, 'cpu'))
        base = memory_inputs(model, b, memory)
        M, j = 6, 4                                             # slots 2..5 valid; window = slots 3..5 + first token
        perturbed = Memory(**{**memory.__dict__, 'mem': memory.mem.clone()})
        perturbed.mem[0, :, j] += torch.randn(2, 16, generator=torch.Generator().manual_seed(0), dtype=F64)
        perturbed_in = memory_inputs(model, b, perturbed)
    changed0 = [differs(perturbed_in[0][:, i], base[0][:, i]) for i in range(M)]
    assert changed0 == [i == j for i in range(M)]
    changed1 = [differs(perturbed_in[1][:, i], base[1][:, i]) for i in range(2, M)]
    assert changed1 == [True, True, True, False]                # slots 2, 3 (look right to 4), 4 itself; not 5

    valid = slice(2, M)
    assert differs(base[1][:, valid], xl_memory.mem[1][:, valid])
    monkeypatch.setattr(model_lamemo, 'lookahead_merge', lambda old_vec, old_lse, new_vec, new_lse: (old_vec, old_lse))
    with torch.no_grad():
        merge_off = memory_inputs(model, b, memory)
    assert_close(merge_off[1][:, valid], xl_memory.mem[1][:, valid], atol=1e-12, rtol=0)


@pytest.mark.parametrize('same_length', [False, True])
def test_causality_within_and_across_segments(same_length):
    """The refresh sees up to the segment's first token only: logits before position t never change with token t."""
    seg, L = 4, 14
    model = make_model(seg_len=seg, mem_len=8, same_length=same_length)
    idx = tokens(2, L)
    with torch.no_grad():
        base, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), seg)
        for t in (0, 2, 3, 4, 5, 8, 9, 12, 13):
            changed = idx.clone()
            changed[:, t] = (changed[:, t] + 1) % V
            out, _ = run_segments(model, changed, model.init_memory(2, 'cpu'), seg)
            assert_close(out[:, :t], base[:, :t], atol=1e-12, rtol=0)
            assert differs(out[:, t], base[:, t])
            nxt = (t // seg + 1) * seg
            if nxt < L:
                assert differs(out[:, nxt:], base[:, nxt:])      # ...later segments see it through the memory


def test_no_gradient_reaches_past_segments():
    model = make_model(seg_len=4, mem_len=6).train()
    emb_outputs = []
    hook = model.word_emb.register_forward_hook(lambda mod, args, out: emb_outputs.append(out))
    idx = tokens(2, 13, seed=3)
    memory = model.init_memory(2, 'cpu')
    _, _, memory1, _ = model(idx[:, 0:4], memory, targets=idx[:, 1:5])
    _, _, memory2, _ = model(idx[:, 4:8], memory1, targets=idx[:, 5:9])
    _, loss3, memory3, _ = model(idx[:, 8:12], memory2, targets=idx[:, 9:13])
    hook.remove()
    for m in (memory1, memory2, memory3):
        for name, value in m.__dict__.items():
            assert value.grad_fn is None and not value.requires_grad, name
    grads = torch.autograd.grad(loss3, emb_outputs, allow_unused=True, retain_graph=True)
    assert grads[0] is None and grads[1] is None                # nothing flows into earlier segments' graphs
    assert grads[2] is not None and grads[2].abs().sum() > 0
    loss3.backward()
    assert model.r_r_bias_future.grad.abs().sum() > 0           # v+ learns (through this step's refresh)


# -----------------------------------------------------------------------------------------------------------
# 3. the contract


def test_memory_shapes_fixed_lengths_saturate_and_reset():
    model = make_model(dtype=torch.float32, n_layer=3, seg_len=4, mem_len=10)
    c = model.config
    memory = model.init_memory(2, 'cpu')
    assert type(memory) is Memory

    def shapes(m):
        return {k: (v.shape, v.dtype, v.is_contiguous()) for k, v in m.__dict__.items()}

    first = shapes(memory)
    assert first == {'mem': ((1, 2, 10, 16), torch.float32, True), 'length': ((2,), torch.long, True),
                     'attn_vec': ((2, 2, 2, 10, 8), torch.float32, True),      # layers 0, 1: the last has no
                     'attn_lse': ((2, 2, 2, 10), torch.float32, True), 'prev_len': ((2,), torch.long, True)}
    lengths = []
    with torch.no_grad():
        for n in (4, 4, 3, 4, 1):
            _, _, memory, _ = model(tokens(2, n, seed=n), memory)
            assert shapes(memory) == first
            lengths.append(memory.length.tolist())
            if n == 4 and lengths == [[4, 4]]:               # the empty slots refreshed nothing: still empty
                assert memory.attn_vec[:, :, :, :6].abs().sum() == 0 and memory.attn_lse[:, :, :, :6].abs().sum() == 0
                assert memory.attn_vec[:, :, :, 6:].abs().min() > 0
    assert lengths == [[4, 4], [8, 8], [10, 10], [10, 10], [10, 10]]
    assert memory.prev_len.tolist() == [1, 1]
    assert model.init_memory(3, 'cpu', mem_len=7).attn_vec.shape == (c.n_layer - 1, 3, c.n_head, 7, c.d_head)


def test_reset_memory_row_equals_fresh_stream():
    model = make_model(seg_len=4, mem_len=6)
    with torch.no_grad():
        _, memory = run_segments(model, tokens(3, 8, seed=5), model.init_memory(3, 'cpu'), 4)
        reset = model.reset_memory(memory, torch.tensor([False, True, False]))
        assert type(reset) is Memory
        assert reset.length.tolist() == [6, 0, 6] and reset.prev_len.tolist() == [4, 0, 4]
        for name, value in reset.__dict__.items():
            rows = (lambda x, b: x[b]) if value.dim() == 1 else (lambda x, b: x[:, b])   # batch dim 0 or 1
            assert torch.equal(rows(value, 1), torch.zeros_like(rows(value, 1))), name      # emptied
            for b in (0, 2):
                assert torch.equal(rows(value, b), rows(getattr(memory, name), b)), name    # untouched
        idx = tokens(3, 4, seed=6)
        logits, _, new_memory, _ = model(idx, reset)
        kept_logits, _, _, _ = model(idx, memory)
        fresh_logits, _, fresh_memory, _ = model(idx[1:2], model.init_memory(1, 'cpu'))
    assert_close(logits[1:2], fresh_logits, atol=1e-10, rtol=0)
    assert_close(new_memory.attn_vec[:, 1:2], fresh_memory.attn_vec, atol=1e-10, rtol=0)
    assert_close(new_memory.attn_lse[:, 1:2], fresh_memory.attn_lse, atol=1e-10, rtol=0)
    for b in (0, 2):
        assert_close(logits[b], kept_logits[b], atol=1e-10, rtol=0)
    assert differs(logits[1], kept_logits[1])


def test_same_weights_as_transformer_xl_plus_v_future():
    """LaMemo is Transformer-XL's parameters plus v+: with the same weights the first segment (nothing to refresh)
    gives the same logits, later segments differ; more FLOPs per token."""
    model = make_model(dtype=torch.float32)
    xl = xl_twin(model)
    assert set(model.state_dict()) == set(xl.state_dict()) | {'r_r_bias_future'}
    assert model.r_r_bias_future.shape == (1, 2, 8)              # layer 0's: the last layer refreshes nothing
    idx = tokens(2, 12)
    with torch.no_grad():
        a, _ = run_segments(xl, idx, xl.init_memory(2, 'cpu'), 4)
        c, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), 4)
    assert_close(c[:, :4], a[:, :4]) and differs(c[:, 4:], a[:, 4:])
    assert model.num_params() == xl.num_params() + model.r_r_bias_future.numel()
    assert model.flops_per_token() > xl.flops_per_token()


def test_config_needs_two_layers():
    with pytest.raises(ValueError, match='n_layer >= 2'):
        Config(n_layer=1)
    Config(n_layer=2)


# -----------------------------------------------------------------------------------------------------------
# 3b. checkpoints made before LaMemo left model_xl.py (model 'xl', lookahead=True) are refused in one line


def test_old_lookahead_checkpoint_is_a_one_line_error_that_says_what_to_do(tmp_path):
    """What train.py saved for `--model=xl --lookahead=True` before LaMemo had its own file: a LaMemo model under
    model_name 'xl', with model_xl.py's lookahead and use_sdpa fields. It is not upgraded any more: loading it says
    to retrain with --model=lamemo or to use the last commit that loads it."""
    import train
    model = make_model(dtype=torch.float32)
    config = dict(vars(model.config), lookahead=True, use_sdpa=True)
    path = tmp_path / 'ckpt.pt'
    torch.save({'format': train.CKPT_FORMAT, 'model_name': 'xl', 'model_config': config,
                'model': model.state_dict()}, path)
    with pytest.raises(train.UserError) as e:
        train.load_checkpoint(path)
    message = str(e.value)
    assert '\n' not in message and str(path) in message
    for fragment in ('made by model_xl.py with --lookahead', 'retrain with --model=lamemo', 'commit b4b2c3e'):
        assert fragment in message, message
    torch.save({'format': train.CKPT_FORMAT, 'model_name': 'lamemo', 'model_config': vars(model.config),
                'model': model.state_dict()}, path)                   # the same model saved as LaMemo loads
    _, _, loaded = train.model_from_checkpoint(train.load_checkpoint(path))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


# Logits recorded from model_xl.py's LaMemo before it had its own file (Config(vocab_size=97, n_layer=2, n_head=2,
# n_embd=16, d_head=8, d_inner=32, dropout=0, dropatt=0, seg_len=4, mem_len=6, init_std=0.5), torch.manual_seed(0),
# float64, tokens(2, 11, seed=3) in segments of 4, 3, 4): a guard on the numerics across every rewrite since.
RECORDED_CONFIG = dict(vocab_size=97, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0,
                       dropatt=0.0, seg_len=4, mem_len=6, init_std=0.5)
RECORDED_LAST_LOGITS = [[-0.8143934538756438, -0.4398698267519663, -0.42489028703130666, 2.058603095985096,
                         1.1376662856702204, 1.231390110038821],
                        [-1.8067896059905453, -0.2592564511581238, 1.898234545423904, -0.2234660454883674,
                         0.6368992706314658, -0.37718144673822596]]


def test_recorded_logits_are_unchanged():
    """Same seed, same initialisation order, same computation: the logits LaMemo gave (hard-coded, float64) after
    two refreshes, one with a 3-token window. A Transformer-XL twin gives others."""
    torch.manual_seed(0)
    model = Model(Config(**RECORDED_CONFIG)).to(F64).eval()
    idx = tokens(2, 11, seed=3)
    with torch.no_grad():
        logits, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), [4, 3, 4])
        xl = xl_twin(model)
        xl_logits, _ = run_segments(xl, idx, xl.init_memory(2, 'cpu'), [4, 3, 4])
    expected = torch.tensor(RECORDED_LAST_LOGITS, dtype=F64)
    assert_close(logits[:, -1, :6], expected, atol=1e-9, rtol=0)
    assert differs(xl_logits[:, -1, :6], expected, atol=1e-3)


def test_different_memory_gives_different_logits_and_mem_len_override():
    model = make_model(seg_len=4, mem_len=6)
    idx = tokens(2, 4)
    with torch.no_grad():
        _, memory_a = run_segments(model, tokens(2, 8, seed=10), model.init_memory(2, 'cpu'), 4)
        _, memory_b = run_segments(model, tokens(2, 8, seed=11), model.init_memory(2, 'cpu'), 4)
        logits_a, _, _, _ = model(idx, memory_a)
        logits_b, _, _, _ = model(idx, memory_b)
        long_logits, _ = run_segments(model, tokens(2, 20, seed=12), model.init_memory(2, 'cpu', mem_len=12), 4)
        short_logits, _ = run_segments(model, tokens(2, 20, seed=12), model.init_memory(2, 'cpu'), 4)
    assert differs(logits_a, logits_b)
    assert differs(long_logits[:, 8:], short_logits[:, 8:])     # an eval memory longer than training's is used


# -----------------------------------------------------------------------------------------------------------
# 4. generate


def generate_setup(with_memory, mem_len, extra, seg=4, B=2):
    model = make_model(dtype=torch.float32, seg_len=seg, mem_len=mem_len, init_std=0.5, **extra)
    memory = None
    if with_memory:
        with torch.no_grad():
            _, memory = run_segments(model, tokens(B, 7, seed=7), model.init_memory(B, 'cpu'), [4, 3])
    start = memory if memory is not None else model.init_memory(B, 'cpu')
    return model, memory, start


@pytest.mark.parametrize('prompt_len', [3, 9])
@pytest.mark.parametrize('with_memory', [False, True])
@pytest.mark.parametrize('mem_len, extra', [(6, {}), (0, {}), (3, dict(same_length=True, clamp_len=2, pre_lnorm=True))],
                         ids=str)
def test_sampled_generate_matches_segmentwise_forward(prompt_len, with_memory, mem_len, extra):
    """Replaying the same RNG on forward()'s logits (the whole sequence so far, segment by segment) picks the same
    tokens, which checks generate's cached logits at every step, across segment boundaries and refreshes. The
    initial memory ends with a 3-token segment, so the first look-ahead window is 3 long."""
    seg, B = 4, 2
    model, memory, start = generate_setup(with_memory, mem_len, extra, seg, B)
    assert_sampled_generate_matches_forward(model, tokens(B, prompt_len, seed=prompt_len), 11, memory, start, seg,
                                            sample_next)


def test_greedy_generate_matches_segmentwise_forward():
    model, memory, start = generate_setup(True, 6, {})
    assert_greedy_generate_matches_forward(model, tokens(2, 5, seed=5), 9, memory, start, 4)


def test_generate_rejects_empty_prompt():
    with pytest.raises(ValueError):
        make_model().generate(tokens(2, 0), 3)


# -----------------------------------------------------------------------------------------------------------
# 5. training


def test_bf16_autocast_forward_backward():
    model = make_model(dtype=torch.float32, dropout=0.1, dropatt=0.1).train()
    assert_bf16_forward_backward(model, ['attn_vec', 'attn_lse'])


def test_loss_goes_down_on_repeated_pattern():
    seg, steps = 8, 100
    model = make_model(dtype=torch.float32, n_embd=32, d_head=16, d_inner=64, seg_len=seg, mem_len=seg).train()
    losses = train_on_repeated_pattern(model, steps, check_lm_loss=True)   # aux['lm_loss'] == loss at every step
    initial, final = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert final < 0.5 * initial, (initial, final)


def test_compiles_once():
    """3 training steps from an empty memory (0 -> 4 -> 8 valid slots): dynamo compiles the model once."""
    torch._dynamo.reset()
    model = make_model(dtype=torch.float32, seg_len=4, mem_len=8).train()
    compiled = torch.compile(model, backend='eager')    # dynamo's guards decide recompiles, not inductor
    memory = model.init_memory(2, 'cpu')
    idx = tokens(2, 13)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for start in (0, 4, 8):
            _, loss, memory, _ = compiled(idx[:, start:start + 4], memory, idx[:, start + 1:start + 5])
            loss.backward()
    assert memory.length.tolist() == [8, 8]
    torch._dynamo.reset()
