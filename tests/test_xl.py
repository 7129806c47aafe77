"""
CPU tests for model_xl.py (Transformer-XL, SPEC §1 contract and §2).

Tiny configs throughout (2-3 layers, n_embd 16-32, vocab 97, seg_len 4-12). Exact properties are checked in
float64 (model.double()); the manual attention path takes its softmax in float32, so comparisons that involve it
use ~1e-6 tolerances, which are still far below the O(1e-2) differences a broken property produces.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from _model_tests import (F64, V, assert_close, assert_greedy_generate_matches_forward,
                          assert_sampled_generate_matches_forward, differs, run_segments, sinusoid, tokens,
                          train_on_repeated_pattern)
from _model_tests import assert_bf16_forward_backward
from model_xl import Config, Memory, Model, rel_shift, sample_next


def make_model(dtype=F64, seed=0, **overrides):
    """A tiny Transformer-XL in eval mode with dropout off; overrides are Config fields."""
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4, mem_len=6)
    fields.update(overrides)
    torch.manual_seed(seed)
    return Model(Config(**fields)).to(dtype).eval()


def empty_memory(model, batch_size, mem_len=None):
    """model.init_memory cast to the model's dtype (init_memory itself always gives float32, see
    test_init_memory_follows_model_dtype)."""
    memory = model.init_memory(batch_size, 'cpu', mem_len)
    return Memory(mem=memory.mem.to(model.r_w_bias.dtype), length=memory.length)


def random_memory(model, batch_size, lengths, seed=123):
    """A memory whose every slot (valid or not) holds random hidden states; lengths: valid slots per row."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    mem = torch.randn(c.n_layer, batch_size, c.mem_len, c.n_embd, generator=g, dtype=F64)
    return Memory(mem=mem.to(model.r_w_bias.dtype), length=torch.tensor(lengths, dtype=torch.long))


# -----------------------------------------------------------------------------------------------------------
# 1. rel_shift against the naive gather


@pytest.mark.parametrize('T, M', [(1, 0), (1, 5), (4, 0), (4, 3), (5, 7), (3, 1), (6, 6)])
def test_rel_shift_equals_naive_gather(T, M):
    K = M + T
    x = torch.randn(2, 3, T, K, generator=torch.Generator().manual_seed(T * 100 + M))
    y = rel_shift(x)
    assert y.shape == x.shape
    n_checked = 0
    for i in range(T):
        for j in range(K - T + i + 1):                 # every key at or before query i (position K-T+i)
            distance = (K - T + i) - j
            assert torch.equal(y[..., i, j], x[..., i, K - 1 - distance]), (i, j)
            n_checked += 1
    assert n_checked == T * (K - T) + T * (T + 1) // 2


# -----------------------------------------------------------------------------------------------------------
# 2. the whole relative attention against a slow loop


@torch.no_grad()
def naive_rel_attn(attn, h, mem_h, length, u, v, clamp_len, same_length, pre_lnorm):
    """One RelMultiHeadAttn forward, one (query, key, head) at a time.
    h: (B, T, C) layer input; mem_h: (B, M, C) the memory (right-aligned, length[b] valid slots); u, v: (H, D).
    A^rel_{i,j} = (q_i + u)·k_j + (q_i + v)·W_{k,R} R_{i-j}, scaled by 1/sqrt(D), softmax over allowed keys."""
    B, T, C = h.shape
    M = mem_h.size(1)
    H, D = attn.n_head, attn.d_head
    W_q = attn.q_net.weight
    W_kE, W_v = attn.kv_net.weight.split(H * D)
    W_kR = attn.r_net.weight
    W_o = attn.o_net.weight
    norm = attn.layer_norm if pre_lnorm else (lambda x: x)
    out = torch.empty_like(h)
    for b in range(B):
        seq = torch.cat([mem_h[b], h[b]])                  # key positions 0 .. M+T-1; query i sits at M+i
        for i in range(T):
            heads = []
            for n in range(H):
                rows = slice(n * D, (n + 1) * D)
                q = W_q[rows] @ norm(h[b, i])
                scores, values = [], []
                for j in range(M + T):
                    distance = M + i - j
                    valid = j >= M - int(length[b])           # memory slots: only the last length[b]
                    if not valid or distance < 0 or (same_length and distance >= M):
                        continue
                    k = W_kE[rows] @ norm(seq[j])
                    R = sinusoid(min(distance, clamp_len) if clamp_len > 0 else distance, C)
                    score = (q + u[n]) @ k + (q + v[n]) @ (W_kR[rows] @ R)
                    scores.append(score / math.sqrt(D))
                    values.append(W_v[rows] @ norm(seq[j]))
                prob = torch.softmax(torch.stack(scores), dim=0)
                heads.append(sum(p * value for p, value in zip(prob, values)))
            attn_out = W_o @ torch.cat(heads)
            out[b, i] = h[b, i] + attn_out if pre_lnorm else attn.layer_norm(h[b, i] + attn_out)
    return out


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
@pytest.mark.parametrize('pre_lnorm', [False, True])
@pytest.mark.parametrize('same_length', [False, True])
@pytest.mark.parametrize('clamp_len', [0, 3])
def test_attention_equals_naive_reference(attn_kernel, pre_lnorm, same_length, clamp_len):
    model = make_model(attn_kernel=attn_kernel, pre_lnorm=pre_lnorm, same_length=same_length, clamp_len=clamp_len,
                       seg_len=4, mem_len=6, untie_r=True)
    with torch.no_grad():                              # make u and v matter as much as q
        model.r_w_bias.normal_(0.0, 1.0)
        model.r_r_bias.normal_(0.0, 1.0)
    memory = random_memory(model, 3, lengths=[2, 6, 0])   # partly valid, full, empty; garbage in invalid slots
    idx = tokens(3, 4)

    seen = {}
    hooks = [layer.attn.register_forward_hook(lambda mod, args, out, n=n: seen.__setitem__(n, (args[0], out[0])))
             for n, layer in enumerate(model.layers)]
    with torch.no_grad():
        model(idx, memory)
    for hook in hooks:
        hook.remove()

    for n, layer in enumerate(model.layers):
        h, out = seen[n]
        expected = naive_rel_attn(layer.attn, h, memory.mem[n], memory.length, model.r_w_bias[n],
                                  model.r_r_bias[n], clamp_len, same_length, pre_lnorm)
        assert_close(out, expected)


# -----------------------------------------------------------------------------------------------------------
# 3. segments with memory == one full forward


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
@pytest.mark.parametrize('pre_lnorm', [False, True])
@pytest.mark.parametrize('mem_len', [12, 15])
def test_segments_with_memory_equal_full_forward(attn_kernel, pre_lnorm, mem_len):
    L = 12
    model = make_model(attn_kernel=attn_kernel, pre_lnorm=pre_lnorm, seg_len=L, mem_len=mem_len, clamp_len=0)
    idx = tokens(2, L)
    with torch.no_grad():
        full, _, _, _ = model(idx, empty_memory(model, 2))
        for seg in (1, 3, 4, 6):                       # 12, 4, 3 and 2 segments
            segmented, _ = run_segments(model, idx, empty_memory(model, 2), seg)
            assert_close(segmented, full)


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
def test_without_memory_segments_differ_from_full_forward(attn_kernel):
    L, seg = 12, 4
    model = make_model(attn_kernel=attn_kernel, seg_len=L, mem_len=0)
    idx = tokens(2, L)
    with torch.no_grad():
        full, _, _, _ = model(idx, empty_memory(model, 2))
        segmented, _ = run_segments(model, idx, empty_memory(model, 2), seg)
    assert_close(segmented[:, :seg], full[:, :seg])         # the first segment has no history anyway
    for start in range(seg, L, seg):                        # every later segment lost its history
        assert differs(segmented[:, start:start + seg], full[:, start:start + seg])


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
def test_same_length_segments_equal_full_sliding_window(attn_kernel):
    """same_length with mem_len M makes every position see exactly the last M positions at every layer, so
    segments with a memory of M (< the history) reproduce the full forward; without same_length they do not."""
    L, M = 12, 5
    for same_length in (True, False):
        model = make_model(attn_kernel=attn_kernel, seg_len=L, mem_len=M, same_length=same_length)
        idx = tokens(2, L)
        with torch.no_grad():
            full, _, _, _ = model(idx, empty_memory(model, 2))
            segmented, _ = run_segments(model, idx, empty_memory(model, 2), 4)
        if same_length:
            assert_close(segmented, full)
        else:
            assert differs(segmented, full)


# -----------------------------------------------------------------------------------------------------------
# 4. causality


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
@pytest.mark.parametrize('same_length', [False, True])
def test_causality_within_and_across_segments(attn_kernel, same_length):
    seg, L = 4, 12
    model = make_model(attn_kernel=attn_kernel, same_length=same_length, seg_len=seg, mem_len=8)
    idx = tokens(2, L)
    with torch.no_grad():
        base, _ = run_segments(model, idx, empty_memory(model, 2), seg)
        for t in (0, 2, 3, 5, 9, 11):
            changed = idx.clone()
            changed[:, t] = (changed[:, t] + 1) % V
            out, _ = run_segments(model, changed, empty_memory(model, 2), seg)
            assert_close(out[:, :t], base[:, :t], atol=1e-12, rtol=0)   # nothing before t may see token t
            assert differs(out[:, t], base[:, t])
            if t < seg:                                    # ...and the next segment sees it through the memory
                assert differs(out[:, seg:2 * seg], base[:, seg:2 * seg])


# -----------------------------------------------------------------------------------------------------------
# 5. memory dependence and reset_memory


def test_different_memory_gives_different_logits():
    model = make_model(seg_len=4, mem_len=6)
    idx = tokens(2, 4)
    with torch.no_grad():
        _, memory_a = run_segments(model, tokens(2, 8, seed=10), empty_memory(model, 2), 4)
        _, memory_b = run_segments(model, tokens(2, 8, seed=11), empty_memory(model, 2), 4)
        logits_a, _, _, _ = model(idx, memory_a)
        logits_b, _, _, _ = model(idx, memory_b)
        logits_empty, _, _, _ = model(idx, empty_memory(model, 2))
    for b in range(2):
        assert differs(logits_a[b], logits_b[b])
        assert differs(logits_a[b], logits_empty[b])


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
def test_reset_memory_row_equals_fresh_stream(attn_kernel):
    model = make_model(attn_kernel=attn_kernel, seg_len=4, mem_len=6)
    with torch.no_grad():
        _, memory = run_segments(model, tokens(3, 8, seed=5), empty_memory(model, 3), 4)
        mask = torch.tensor([False, True, False])
        reset = model.reset_memory(memory, mask)
        assert reset.mem.shape == memory.mem.shape and reset.mem.dtype == memory.mem.dtype
        assert reset.length.tolist() == [6, 0, 6]
        assert torch.equal(reset.mem[:, 1], torch.zeros_like(reset.mem[:, 1]))       # emptied
        assert torch.equal(reset.mem[:, 0::2], memory.mem[:, 0::2])                   # untouched
        idx = tokens(3, 4, seed=6)
        logits, _, new_memory, _ = model(idx, reset)
        kept_logits, _, kept_memory, _ = model(idx, memory)
        fresh_logits, _, fresh_memory, _ = model(idx[1:2], empty_memory(model, 1))
    assert_close(logits[1:2], fresh_logits, atol=1e-10, rtol=0)
    assert_close(new_memory.mem[:, 1:2], fresh_memory.mem, atol=1e-10, rtol=0)
    assert new_memory.length.tolist() == [6, 4, 6]
    for b in (0, 2):
        assert_close(logits[b], kept_logits[b], atol=1e-10, rtol=0)
        assert_close(new_memory.mem[:, b], kept_memory.mem[:, b], atol=1e-10, rtol=0)
    assert differs(logits[1], kept_logits[1])                 # the reset did change that row


# -----------------------------------------------------------------------------------------------------------
# 6. the memory carries no gradient


def test_memory_is_detached_and_blocks_gradient_to_previous_segment():
    model = make_model(seg_len=4, mem_len=6).train()
    emb_outputs = []
    hook = model.word_emb.register_forward_hook(lambda mod, args, out: emb_outputs.append(out))
    idx = tokens(2, 9, seed=3)
    memory = empty_memory(model, 2)
    _, loss1, memory1, _ = model(idx[:, 0:4], memory, targets=idx[:, 1:5])
    assert not memory1.mem.requires_grad and memory1.mem.grad_fn is None
    assert memory1.mem.is_leaf
    _, loss2, memory2, _ = model(idx[:, 4:8], memory1, targets=idx[:, 5:9])
    assert not memory2.mem.requires_grad and memory2.mem.grad_fn is None
    hook.remove()

    emb1, emb2 = emb_outputs
    assert emb1.requires_grad                                   # segment 1's embeddings are in a graph (loss1's)
    grad_emb1, grad_emb2 = torch.autograd.grad(loss2, [emb1, emb2], allow_unused=True)
    assert grad_emb1 is None                                    # ...but loss2 has no path to them
    assert grad_emb2 is not None and grad_emb2.abs().sum() > 0


# -----------------------------------------------------------------------------------------------------------
# 7. fixed memory shapes, length counter, masking of invalid slots


def test_memory_shapes_fixed_and_length_saturates():
    model = make_model(dtype=torch.float32, seg_len=4, mem_len=10, n_layer=3)
    c = model.config
    memory = model.init_memory(2, 'cpu')
    shapes = [(memory.mem.shape, memory.mem.dtype, memory.length.shape, memory.length.dtype)]
    lengths = [memory.length.tolist()]
    with torch.no_grad():
        for seg in (4, 4, 3, 4, 1):
            _, _, memory, _ = model(tokens(2, seg, seed=seg), memory)
            shapes.append((memory.mem.shape, memory.mem.dtype, memory.length.shape, memory.length.dtype))
            lengths.append(memory.length.tolist())
    assert all(s == shapes[0] for s in shapes), shapes
    assert shapes[0] == ((c.n_layer, 2, c.mem_len, c.n_embd), torch.float32, (2,), torch.long)
    assert [row[0] for row in lengths] == [0, 4, 8, 10, 10, 10]
    assert all(row[0] == row[1] for row in lengths)


def test_new_memory_holds_each_layers_last_inputs():
    model = make_model(seg_len=4, mem_len=6, n_layer=2)
    inputs = {n: [] for n in range(2)}
    hooks = [layer.register_forward_pre_hook(lambda mod, args, n=n: inputs[n].append(args[0]))
             for n, layer in enumerate(model.layers)]
    memory = empty_memory(model, 2)
    with torch.no_grad():
        _, _, memory, _ = model(tokens(2, 4, seed=1), memory)
        for n in range(2):                                  # 4 of 6 slots filled, right-aligned
            assert torch.equal(memory.mem[n, :, 2:], inputs[n][0])
            assert torch.equal(memory.mem[n, :, :2], torch.zeros_like(memory.mem[n, :, :2]))
        for seed in (2, 3):
            _, _, memory, _ = model(tokens(2, 4, seed=seed), memory)
    for hook in hooks:
        hook.remove()
    for n in range(2):                                      # the last 6 of 12 layer inputs, oldest first
        assert torch.equal(memory.mem[n], torch.cat(inputs[n], dim=1)[:, -6:])
    assert memory.length.tolist() == [6, 6]


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
@pytest.mark.parametrize('same_length', [False, True])
def test_invalid_memory_slots_are_masked(attn_kernel, same_length):
    model = make_model(attn_kernel=attn_kernel, same_length=same_length, seg_len=4, mem_len=6)
    idx = tokens(3, 4)
    clean = random_memory(model, 3, lengths=[0, 2, 6])
    valid = torch.arange(6)[None, :] >= 6 - clean.length[:, None]             # (B, M)
    clean.mem = clean.mem * valid[None, :, :, None]                           # zeros in invalid slots
    garbage = random_memory(model, 3, lengths=[0, 2, 6], seed=999)
    garbage.mem = torch.where(valid[None, :, :, None], clean.mem, 100 * garbage.mem)
    with torch.no_grad():
        logits_clean, _, new_clean, _ = model(idx, clean)
        logits_garbage, _, new_garbage, _ = model(idx, garbage)
        logits_fresh, _, _, _ = model(idx[:1], empty_memory(model, 1))
    assert_close(logits_garbage, logits_clean, atol=1e-10, rtol=0)
    assert_close(logits_clean[:1], logits_fresh, atol=1e-10, rtol=0)           # length 0 == fresh memory
    assert torch.equal(new_garbage.length, new_clean.length)
    assert new_clean.length.tolist() == [4, 6, 6]
    for b, n_valid in enumerate(new_clean.length.tolist()):                  # the valid parts agree
        assert_close(new_garbage.mem[:, b, -n_valid:], new_clean.mem[:, b, -n_valid:], atol=1e-10, rtol=0)


# -----------------------------------------------------------------------------------------------------------
# 8. SDPA path == manual path


PATH_CONFIGS = [
    dict(),
    dict(same_length=True),
    dict(clamp_len=3),
    dict(pre_lnorm=True),
    dict(same_length=True, clamp_len=2, pre_lnorm=True),
    dict(untie_r=False, mem_len=0),
]


def sdpa_and_manual(overrides):
    overrides = dict(dict(seg_len=4, mem_len=6), **overrides)
    sdpa = make_model(attn_kernel='sdpa', **overrides)
    manual = make_model(attn_kernel='einsum', seed=1, **overrides)
    manual.load_state_dict(sdpa.state_dict())
    return sdpa, manual


@pytest.mark.parametrize('overrides', PATH_CONFIGS, ids=str)
def test_sdpa_equals_manual_eval(overrides):
    sdpa, manual = sdpa_and_manual(overrides)
    idx = tokens(2, 12)
    with torch.no_grad():
        logits_s, memory_s = run_segments(sdpa, idx, empty_memory(sdpa, 2), 4)
        logits_m, memory_m = run_segments(manual, idx, empty_memory(manual, 2), 4)
    assert_close(logits_m, logits_s)
    assert_close(memory_m.mem, memory_s.mem)


@pytest.mark.parametrize('overrides', PATH_CONFIGS, ids=str)
def test_sdpa_equals_manual_gradients(overrides):
    sdpa, manual = sdpa_and_manual(overrides)
    idx = tokens(2, 9)
    for model in (sdpa, manual):
        model.train()
        memory = empty_memory(model, 2)
        total = 0
        for start in (0, 4):
            _, loss, memory, _ = model(idx[:, start:start + 4], memory, targets=idx[:, start + 1:start + 5])
            total = total + loss
        total.backward()
    for (name, p_s), p_m in zip(sdpa.named_parameters(), manual.parameters()):
        assert p_s.grad is not None, name
        assert_close(p_m.grad, p_s.grad)


# -----------------------------------------------------------------------------------------------------------
# 9. generate


def generate_cases(test):
    """prompt shorter than, equal to and longer than seg_len (4); with and without an initial memory;
    mem_len 6 and 0; plain and same_length + clamp_len + pre-LN."""
    test = pytest.mark.parametrize('prompt_len', [3, 4, 9])(test)
    test = pytest.mark.parametrize('with_memory', [False, True])(test)
    test = pytest.mark.parametrize('mem_len', [6, 0])(test)
    return pytest.mark.parametrize('extra', [{}, dict(same_length=True, clamp_len=2, pre_lnorm=True)], ids=str)(test)


def generate_setup(with_memory, mem_len, extra, seg=4, B=2):
    # float32: generate without a memory uses init_memory, which is float32. A large init_std so the
    # continuation is not one token repeated (the tied embeddings favour copying the input at small init).
    model = make_model(dtype=torch.float32, seg_len=seg, mem_len=mem_len, init_std=0.5, **extra)
    memory = None
    if with_memory:
        with torch.no_grad():
            _, memory = run_segments(model, tokens(B, 7, seed=7), model.init_memory(B, 'cpu'), seg)
    start = memory if memory is not None else model.init_memory(B, 'cpu')   # for the reference forward
    return model, memory, start


@generate_cases
def test_greedy_generate_matches_segmentwise_forward(prompt_len, with_memory, mem_len, extra):
    seg, B = 4, 2
    model, memory, start = generate_setup(with_memory, mem_len, extra, seg, B)
    assert_greedy_generate_matches_forward(model, tokens(B, prompt_len, seed=prompt_len), 11, memory, start, seg)


@generate_cases
def test_sampled_generate_matches_segmentwise_forward(prompt_len, with_memory, mem_len, extra):
    seg, B = 4, 2
    model, memory, start = generate_setup(with_memory, mem_len, extra, seg, B)
    assert_sampled_generate_matches_forward(model, tokens(B, prompt_len, seed=prompt_len), 11, memory, start, seg,
                                            sample_next)


def test_top_k_1_sampling_equals_greedy():
    model = make_model(dtype=torch.float32, seg_len=4, mem_len=6, init_std=0.5)
    prompt = tokens(2, 5)
    greedy = model.generate(prompt, 10, temperature=0.0)
    for temperature in (1.0, 0.7, 5.0):
        torch.manual_seed(0)
        assert torch.equal(model.generate(prompt, 10, temperature=temperature, top_k=1), greedy)


def test_generate_rejects_empty_prompt():
    model = make_model(dtype=torch.float32)
    with pytest.raises(ValueError):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 3)


# -----------------------------------------------------------------------------------------------------------
# 10. untie_r


def test_untie_r_parameter_counts():
    L, H, D = 3, 2, 8
    tied = make_model(n_layer=L, n_head=H, d_head=D, untie_r=False)
    untied = make_model(n_layer=L, n_head=H, d_head=D, untie_r=True)
    assert tuple(tied.r_w_bias.shape) == tuple(tied.r_r_bias.shape) == (1, H, D)
    assert tuple(untied.r_w_bias.shape) == tuple(untied.r_r_bias.shape) == (L, H, D)
    assert untied.num_params() - tied.num_params() == 2 * (L - 1) * H * D


@pytest.mark.parametrize('name', ['r_w_bias', 'r_r_bias'])
def test_untied_layer_uses_its_own_bias(name):
    model = make_model(n_layer=3, untie_r=True, init_std=0.3)
    idx, memory = tokens(2, 4), random_memory(model, 2, lengths=[3, 6])
    with torch.no_grad():
        base_logits, _, base, _ = model(idx, memory)
        getattr(model, name)[1] += 1.0                      # layer 1's u (or v)
        logits, _, new, _ = model(idx, memory)
    # new_memory.mem[n] holds layer n's input: layer 0's output must not move, layer 1's must
    assert torch.equal(new.mem[1], base.mem[1])
    assert differs(new.mem[2], base.mem[2])
    assert differs(logits, base_logits)


@pytest.mark.parametrize('name', ['r_w_bias', 'r_r_bias'])
def test_tied_bias_is_shared_by_all_layers(name):
    tied = make_model(n_layer=3, untie_r=False, init_std=0.3)
    untied = make_model(n_layer=3, untie_r=True, seed=5)
    state = tied.state_dict()
    for key in ('r_w_bias', 'r_r_bias'):                     # one shared pair == the same pair in every layer
        state[key] = state[key].expand(3, -1, -1).clone()
    untied.load_state_dict(state)
    idx, memory = tokens(2, 4), random_memory(tied, 2, lengths=[3, 6])
    with torch.no_grad():
        logits_t, _, base, _ = tied(idx, memory)
        logits_u, _, _, _ = untied(idx, memory)
        assert_close(logits_t, logits_u, atol=1e-12, rtol=0)
        getattr(tied, name)[0] += 1.0
        _, _, new, _ = tied(idx, memory)
    assert differs(new.mem[1], base.mem[1])                  # layer 0 uses the shared bias too


# -----------------------------------------------------------------------------------------------------------
# 11. config validation


@pytest.mark.parametrize('bad', [
    dict(n_layer=0), dict(n_head=0), dict(seg_len=0), dict(vocab_size=0), dict(d_head=0), dict(d_inner=0),
    dict(dropout=1.5), dict(dropout=-0.1), dict(dropout=1.0), dict(dropatt=1.0),
    dict(n_embd=15), dict(mem_len=-1), dict(clamp_len=-2),
], ids=str)
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        Config(**bad)


def test_config_defaults_are_valid():
    c = Config()
    assert c.mem_len >= 0 and c.seg_len >= 1 and c.n_embd % 2 == 0
    Config(mem_len=0, dropout=0.0, clamp_len=0)              # edge values that are allowed


def test_is_transformer_xl_alone():
    """LaMemo's look-ahead memory is its own model file (model_lamemo.py), not a flag of this one."""
    with pytest.raises(TypeError):
        Config(lookahead=True)
    model = make_model()
    assert not hasattr(model, 'r_r_bias_future') and list(vars(model.init_memory(1, 'cpu'))) == ['mem', 'length']


def test_forward_rejects_segment_longer_than_seg_len():
    model = make_model(seg_len=4)
    with pytest.raises(ValueError):
        model(tokens(1, 5), empty_memory(model, 1))


# -----------------------------------------------------------------------------------------------------------
# 12. bf16 autocast on CPU


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
def test_bf16_autocast_forward_backward(attn_kernel):
    model = make_model(dtype=torch.float32, attn_kernel=attn_kernel, dropout=0.1, seg_len=4, mem_len=6).train()
    assert_bf16_forward_backward(model, ['mem'])


# -----------------------------------------------------------------------------------------------------------
# 13. it learns


def test_loss_goes_down_on_repeated_pattern():
    seg, steps = 8, 150
    model = make_model(dtype=torch.float32, n_embd=32, d_head=16, d_inner=64, seg_len=seg, mem_len=seg).train()
    losses = train_on_repeated_pattern(model, steps, check_lm_loss=True)   # aux['lm_loss'] == loss at every step
    initial, final = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert final < 0.5 * initial, (initial, final)


def test_loss_is_token_cross_entropy():
    model = make_model()
    idx, targets = tokens(2, 4), tokens(2, 4, seed=2)
    targets[0, 1] = -1                                       # ignored position
    logits, loss, _, aux = model(idx, empty_memory(model, 2), targets=targets)
    expected = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)
    assert_close(loss.double(), expected, atol=1e-6, rtol=0)       # the loss is taken in float32
    _, no_loss, _, no_aux = model(idx, empty_memory(model, 2))
    assert no_loss is None and 'lm_loss' not in no_aux


# -----------------------------------------------------------------------------------------------------------
# 14. flops


def test_flops_per_token_positive_and_grows_with_mem_len():
    model = make_model(seg_len=8, mem_len=8)
    flops = [model.flops_per_token(mem_len=m) for m in (0, 8, 64, 512)]
    assert flops[0] > 0                                     # the count itself: tests/test_flops.py
    assert all(a < b for a, b in zip(flops, flops[1:]))
    assert model.flops_per_token() == flops[1]               # default: config.mem_len
    assert make_model(seg_len=8, mem_len=64).flops_per_token() > model.flops_per_token()


# -----------------------------------------------------------------------------------------------------------
# Bugs found while writing these tests


@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16], ids=str)
def test_init_memory_follows_model_dtype(dtype):
    """A model cast with .double() / .to(torch.bfloat16) must run with its own init_memory: forward() and
    generate(memory=None) feed init_memory's float32 memory (and, for bf16, the float32 sinusoid R) into the
    layers' float64/bf16 Linear weights and crash. (Under autocast the parameters stay float32, so the memory
    does too, see test_bf16_autocast_forward_backward.)"""
    model = make_model(dtype=dtype)
    memory = model.init_memory(2, 'cpu')
    assert memory.mem.dtype == dtype
    logits, _, memory, _ = model(tokens(2, 4), memory)
    assert logits.dtype == dtype and memory.mem.dtype == dtype
    model.generate(tokens(2, 3), 2, temperature=0.0)
