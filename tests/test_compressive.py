"""
CPU tests for model_compressive.py (the Compressive Transformer, SPEC §1 contract and §3).

Tiny configs throughout (1-2 layers, n_embd 16, vocab 97, seg_len 2-8). Exact properties are checked in float64
(model.double()) against slow references written here: Algorithm 1 on Python lists, the compression functions by
hand, the relative attention one (query, key, head) at a time. The manual attention path takes its softmax in
float32, so comparisons that involve it use ~1e-6 tolerances.
"""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import model_xl
from _model_tests import (F64, V, assert_close, assert_greedy_generate_matches_forward, flop_counter,
                          assert_sampled_generate_matches_forward, differs, run_segments, sinusoid, tokens,
                          train_on_repeated_pattern)
from _models import TINY_MODELS
from _train_util import assert_one_line_error, flags, load, make_pattern_dataset, run_python
from model_compressive import (COMPRESSIONS, Compression, Config, Model, Usage, group_evicted, most_used,
                               push_fifo, right_aligned, sample_next, update_memory)


def make_model(dtype=F64, seed=0, **overrides):
    """A tiny Compressive Transformer in eval mode with dropout off; overrides are Config fields."""
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4, mem_len=6, cmem_len=4, compression_rate=2)
    fields.update(overrides)
    torch.manual_seed(seed)
    return Model(Config(**fields)).to(dtype).eval()


def random_memory(model, B, cmem_lengths, mem_lengths, seed=123):
    """A memory whose every slot (valid or not) holds random states, with the given valid counts per row."""
    m = model.init_memory(B, 'cpu')
    g = torch.Generator().manual_seed(seed)
    return replace(m, cmem=torch.randn(m.cmem.shape, generator=g, dtype=F64).to(m.cmem.dtype),
                   mem=torch.randn(m.mem.shape, generator=g, dtype=F64).to(m.mem.dtype),
                   cmem_length=torch.tensor(cmem_lengths), mem_length=torch.tensor(mem_lengths))


def is_compression_param(name):
    return '.compress.' in name or '.decoder.' in name


# -----------------------------------------------------------------------------------------------------------
# 1. Algorithm 1 (memory update) against a slow reference on Python lists


def reference_update(model, rows, hids, mem_len, usage=None):
    """Algorithm 1, lines 8-11, one row and one layer at a time, on lists of vectors: m keeps its last mem_len
    states, the ones that fall out are compressed in groups of c (the oldest n mod c of them forgotten: only a
    shorter segment or an init_memory mem_len that is not a multiple of c has any), cm keeps its last cmem_len.
    rows[b][n] = {'cm': [...], 'm': [...], 'use': [(mass, queries) per m entry]}; hids (L, B, T, C);
    usage: (L, B, S+T) mass and (B, S+T) queries this segment gave the keys [cm ; m ; h], for most_used."""
    c = model.config
    rate = c.compression_rate
    L, B, T, C = hids.shape
    for b in range(B):
        for n in range(L):
            row = rows[b][n]
            row['m'] = row['m'] + [hids[n, b, t] for t in range(T)]
            row['use'] = row['use'] + [(0.0, 0.0)] * T
            if usage is not None:                                  # m (old) and h are the last keys
                mass, queries = usage
                K = mass.size(-1)
                for k in range(len(row['m'])):
                    key = K - len(row['m']) + k
                    used, seen = row['use'][k]
                    row['use'][k] = (used + float(mass[n, b, key]), seen + float(queries[b, key]))
            e = max(0, len(row['m']) - mem_len)                   # evicted (line 8), the oldest first
            old, old_use = row['m'][:e], row['use'][:e]
            row['m'], row['use'] = row['m'][e:], row['use'][e:]
            if c.cmem_len == 0:
                continue
            n_new = e // rate
            old, old_use = old[e - n_new * rate:], old_use[e - n_new * rate:]   # the oldest e mod c forgotten
            if c.compression == 'most_used':
                average = [mass / max(q, 1.0) for mass, q in old_use]
                best = sorted(range(n_new * rate), key=lambda k: (-average[k], k))[:n_new]
                new_cm = [old[k] for k in sorted(best)]
            else:
                f_c = model.layers[n].compress
                new_cm = [f_c(torch.stack(old[g * rate:(g + 1) * rate])[None, None])[0, 0]
                          for g in range(n_new)]
            row['cm'] = (row['cm'] + new_cm)[-c.cmem_len:]


def right_aligned_buffer(model, rows, key, n_slots):
    """The right-aligned memory (L, B, n_slots, C) rows[b][n][key] should be, zeros elsewhere."""
    c = model.config
    out = torch.zeros(c.n_layer, len(rows), n_slots, c.n_embd, dtype=F64)
    for b, layers in enumerate(rows):
        for n, row in enumerate(layers):
            if row[key]:
                out[n, b, n_slots - len(row[key]):] = torch.stack(row[key])
    return out


CASES = [  # (seg_len, mem_len, cmem_len, c, init_memory's mem_len): seg_len and mem_len are multiples of c
    (4, 6, 4, 2, None), (4, 4, 3, 2, None), (6, 6, 5, 3, None), (6, 3, 6, 3, None), (8, 4, 6, 2, None),
    (4, 8, 5, 4, None), (4, 6, 0, 2, None), (3, 5, 4, 1, None), (4, 6, 4, 2, 5)]


@pytest.mark.parametrize('compression', COMPRESSIONS)
@pytest.mark.parametrize('seg_len, mem_len, cmem_len, rate, init_mem_len', CASES)
def test_memory_update_equals_algorithm_1(compression, seg_len, mem_len, cmem_len, rate, init_mem_len):
    model = make_model(n_embd=8, d_head=4, seg_len=seg_len, mem_len=mem_len, cmem_len=cmem_len,
                       compression_rate=rate, compression=compression)
    c = model.config
    B, L = 3, c.n_layer
    memory = model.init_memory(B, 'cpu', mem_len=init_mem_len)
    n_m = memory.mem.size(2)
    S = cmem_len + n_m
    rows = [[{'cm': [], 'm': [], 'use': []} for _ in range(L)] for _ in range(B)]
    g = torch.Generator().manual_seed(0)
    for step in range(9):
        T = seg_len if step != 5 else max(1, seg_len - 1)           # one shorter segment
        if step == 4:                                                # reset row 1 mid-stream
            memory = model.reset_memory(memory, torch.tensor([False, True, False]))
            rows[1] = [{'cm': [], 'm': [], 'use': []} for _ in range(L)]
        hids = torch.randn(L, B, T, c.n_embd, generator=g, dtype=F64)
        usage = None
        if compression == 'most_used' and cmem_len:
            usage = (torch.rand(L, B, S + T, generator=g, dtype=F64),
                     torch.randint(1, 5, (B, S + T), generator=g).double())
        with torch.no_grad():
            memory, _ = update_memory(memory, hids, Usage(*usage) if usage else None, model.layers, rate)
        reference_update(model, rows, hids, n_m, usage)
        assert memory.mem.shape == (L, B, n_m, c.n_embd) and memory.cmem.shape == (L, B, cmem_len, c.n_embd)
        assert memory.mem.is_contiguous() and memory.cmem.is_contiguous()
        assert memory.cmem_length.tolist() == [len(r[0]['cm']) for r in rows]
        assert memory.mem_length.tolist() == [len(r[0]['m']) for r in rows]
        assert all(cl == 0 or ml == n_m for cl, ml in zip(memory.cmem_length.tolist(), memory.mem_length.tolist()))
        assert_close(memory.mem, right_aligned_buffer(model, rows, 'm', n_m), atol=1e-12, rtol=0)
        assert_close(memory.cmem, right_aligned_buffer(model, rows, 'cm', cmem_len), atol=1e-12, rtol=0)


def test_worked_example_of_the_docstring():
    """The module's worked example (n_s = 4, n_m = 8, n_cm = 4, c = 2) with the pure functions of Algorithm 1,
    the state of token k being the number k and f_c the mean, so f(a, b) = (a + b) / 2."""
    mem, cmem = torch.zeros(1, 1, 8), torch.zeros(1, 1, 4)
    mem_length, cmem_length = torch.tensor([0]), torch.tensor([0])
    expected_cm = {3: [0.5, 2.5], 4: [0.5, 2.5, 4.5, 6.5], 5: [4.5, 6.5, 8.5, 10.5]}
    for segment in range(1, 6):
        h = torch.arange(4 * (segment - 1), 4 * segment, dtype=torch.float)[None, None]   # (L, B, T)
        mem, old_mem = push_fifo(mem, h)                                                 # lines 10 and 8
        n_old = mem_length + 4 - (mem_length + 4).clamp(max=8)
        mem_length = (mem_length + 4).clamp(max=8)
        groups, n_new = group_evicted(old_mem, n_old, 2)                                 # (1, 1, 2, 2)
        new_cm = torch.where(right_aligned(2, n_new)[None], groups.mean(-1), 0)          # line 9
        cmem, _ = push_fifo(cmem, new_cm)                                                # line 11
        cmem_length = (cmem_length + n_new).clamp(max=4)
        m = mem[0, 0, 8 - int(mem_length):].tolist()
        cm = cmem[0, 0, 4 - int(cmem_length):].tolist()
        assert m == list(range(max(0, 4 * segment - 8), 4 * segment)), segment
        if segment <= 2:
            assert old_mem[0, 0, 4 - int(n_old):].tolist() == [] and cm == [], segment   # nothing falls out
        else:
            assert old_mem[0, 0].tolist() == list(range(4 * segment - 12, 4 * segment - 8)), segment   # m_t[:n_s]
            assert cm == expected_cm[segment], segment


@pytest.mark.parametrize('seg_len, mem_len, rate', [(4, 6, 2), (4, 4, 2), (6, 6, 3), (6, 3, 3), (8, 4, 4)])
def test_every_state_compressed_once_in_fifo_order(seg_len, mem_len, rate):
    """Tag stream position t with the one-hot vector e_t and compress by mean pooling: then each compressed slot
    must be the mean of c consecutive positions, the compressed positions must come in order and be older than
    everything in m, and cm·c + m must cover positions 0..t exactly once (nothing duplicated or lost)."""
    steps, B, L = 8, 2, 1
    C = steps * seg_len
    model = make_model(n_layer=L, n_embd=C, d_head=4, seg_len=seg_len, mem_len=mem_len, cmem_len=C,
                       compression_rate=rate, compression='mean_pool')
    memory = model.init_memory(B, 'cpu')
    eye = torch.eye(C, dtype=F64)
    for step in range(steps):
        hids = eye[step * seg_len:(step + 1) * seg_len].expand(L, B, -1, -1)
        n_before = memory.mem_length.clone()
        memory, _ = update_memory(memory, hids, None, model.layers, rate)
        if int(n_before[0]) + seg_len <= mem_len:
            assert memory.cmem_length.tolist() == [0, 0]          # a memory still filling up evicts nothing
        seen = (step + 1) * seg_len
        n_cm, n_m = int(memory.cmem_length[0]), int(memory.mem_length[0])
        cm, m = memory.cmem[0, 0, C - n_cm:], memory.mem[0, 0, mem_len - n_m:]
        assert n_cm * rate + n_m == seen and n_m == min(seen, mem_len)
        for k in range(n_cm):                                      # slot k = positions k*c ... k*c + c - 1
            expected = eye[k * rate:(k + 1) * rate].mean(0)
            assert torch.equal(cm[k], expected), (step, k)
        assert torch.equal(m, eye[seen - n_m:seen])                # m: the newest n_m positions, in order
        coverage = cm.sum(0) * rate + m.sum(0)
        assert torch.equal(coverage[:seen], torch.ones(seen, dtype=F64))   # each position exactly once


def test_shorter_segment_forgets_the_oldest_remainder():
    """A segment of T not a multiple of c (only the last, shorter one of a stream) evicts T states from a full m:
    ⌊T/c⌋ groups of the newest are compressed and the oldest T mod c forgotten, as f_c maps n memories to ⌊n/c⌋;
    the next full segment compresses whole groups again."""
    C = 20
    model = make_model(n_layer=1, n_embd=C, d_head=4, seg_len=4, mem_len=4, cmem_len=8, compression='mean_pool')
    memory = model.init_memory(1, 'cpu')
    eye = torch.eye(C, dtype=F64)
    for start, T in [(0, 4), (4, 4), (8, 3), (11, 4)]:
        memory, _ = update_memory(memory, eye[None, None, start:start + T], None, model.layers, 2)
    cm = memory.cmem[0, 0, 8 - int(memory.cmem_length[0]):]
    pairs = [(0, 1), (2, 3), (5, 6), (7, 8), (9, 10)]               # position 4 is forgotten
    assert torch.equal(cm, torch.stack([eye[list(p)].mean(0) for p in pairs]))
    assert torch.equal(memory.mem[0, 0], eye[11:15])


def test_forward_stores_each_layers_inputs_and_compresses_them():
    model = make_model(seg_len=4, mem_len=4, cmem_len=4, compression_rate=2, compression='mean_pool')
    inputs = {n: [] for n in range(2)}
    hooks = [layer.register_forward_pre_hook(lambda mod, args, n=n: inputs[n].append(args[0]))
             for n, layer in enumerate(model.layers)]
    memory = model.init_memory(2, 'cpu')
    with torch.no_grad():
        for s in range(2):
            _, _, memory, _ = model(tokens(2, 4, seed=s), memory)
    for hook in hooks:
        hook.remove()
    assert memory.cmem_length.tolist() == [2, 2] and memory.mem_length.tolist() == [4, 4]
    for n in range(2):
        first, second = inputs[n]
        assert torch.equal(memory.mem[n], second)                                  # m = the last segment
        assert_close(memory.cmem[n, :, 2:], first.view(2, 2, 2, -1).mean(2), atol=1e-15, rtol=0)


# -----------------------------------------------------------------------------------------------------------
# 2. each compression function on a hand-computed case


def groups_example():
    # B=1, G=2 groups of c=2 vectors with C=3 channels
    return torch.tensor([[[[1., -2., 3.], [4., 5., -6.]], [[0., 1., 1.], [2., -1., 0.]]]], dtype=F64)


def test_pooling_by_hand():
    x = groups_example()
    for kind, expected in [('max_pool', [[[4., 5., 3.], [2., 1., 1.]]]),
                           ('mean_pool', [[[2.5, 1.5, -1.5], [1., 0., 0.5]]])]:
        f_c = Compression(Config(n_embd=4, compression_rate=2, compression=kind))
        assert torch.equal(f_c(x), torch.tensor(expected, dtype=F64)), kind


def test_conv_by_hand():
    f_c = Compression(Config(n_embd=4, compression_rate=2, compression='conv')).double()
    C = 3
    f_c.conv = torch.nn.Conv1d(C, C, kernel_size=2, stride=2).double()
    W = torch.arange(C * C * 2, dtype=F64).view(C, C, 2) / 10 - 0.8            # (out, in, tap)
    bias = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    with torch.no_grad():
        f_c.conv.weight.copy_(W)
        f_c.conv.bias.copy_(bias)
    x = groups_example()
    out = f_c(x)
    for g in range(2):
        for o in range(C):
            expected = bias[o] + sum(W[o, i, t] * x[0, g, t, i] for i in range(C) for t in range(2))
            assert abs(out[0, g, o] - expected) < 1e-12


@pytest.mark.parametrize('rate', [2, 3, 4])
def test_dilated_conv_by_hand(rate):
    """Ours: kernel-2 convolutions with dilations 1, 2 (ReLU between) over the group left-padded to 2^levels."""
    C = 2
    f_c = Compression(Config(n_embd=C, seg_len=12, mem_len=12, compression_rate=rate,
                             compression='dilated_conv')).double()
    levels = max(1, math.ceil(math.log2(rate)))
    assert len(f_c.convs) == levels
    g = torch.Generator().manual_seed(rate)
    with torch.no_grad():
        for conv in f_c.convs:
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=g, dtype=F64))
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=g, dtype=F64))
    x = torch.randn(1, 1, rate, C, generator=g, dtype=F64)
    seq = [torch.zeros(C, dtype=F64)] * (2 ** levels - rate) + list(x[0, 0])   # zero-padded on the left
    for n, conv in enumerate(f_c.convs):
        d = 2 ** n
        seq = [conv.bias + conv.weight[:, :, 0] @ seq[t] + conv.weight[:, :, 1] @ seq[t + d]
               for t in range(len(seq) - d)]
        if n < levels - 1:
            seq = [s.clamp(min=0) for s in seq]
    assert len(seq) == 1
    assert_close(f_c(x)[0, 0], seq[0], atol=1e-12, rtol=0)
    if rate > 2:                                                   # every memory of the group matters
        for k in range(rate):
            y = x.clone()
            y[0, 0, k] += 1.0
            assert differs(f_c(y), f_c(x), atol=1e-9)


def test_most_used_by_hand():
    x = torch.arange(2 * 3 * 2 * 1, dtype=F64).view(2, 3, 2, 1)              # B=2, G=3, c=2, C=1: values = position
    usage = torch.tensor([[9., 9., 0.3, 0.1, 0.2, 0.5],                      # row 0: 2 real groups (positions 2-5)
                          [0.1, 0.9, 0.9, 0.2, 0.8, 0.1]], dtype=F64)         # row 1: 3 real groups, a tie at 1, 2
    out = most_used(x, torch.tensor([2, 3]), usage)
    # row 0: the 2 most used of positions 2..5 are 5 (0.5) and 2 (0.3), in time order; padding groups ignored
    assert out[0, :, 0].tolist() == [0., 2., 5.]
    # row 1: the 3 most used are 1, 2 (tie, both kept) and 4, in time order
    assert out[1, :, 0].tolist() == [7., 8., 10.]


# -----------------------------------------------------------------------------------------------------------
# 3. most_used: the usage kept in the Memory, and the most attended states survive


def test_usage_is_the_attention_mass_each_slot_received():
    model = make_model(compression='most_used', seg_len=4, mem_len=8, cmem_len=4)
    memory = model.init_memory(2, 'cpu')
    with torch.no_grad():
        _, _, memory, _ = model(tokens(2, 4), memory)
        S = memory.mem.size(2)
        assert memory.attn_queries[0, S - 4:].tolist() == [4., 3., 2., 1.]       # causal: 4, 3, 2, 1 queries
        assert_close(memory.attn_mass.sum(-1), torch.full((2, 2), 4., dtype=F64))  # each query gives mass 1
        _, _, memory, _ = model(tokens(2, 4, seed=2), memory)
    assert memory.attn_queries[0, S - 8:].tolist() == [8., 7., 6., 5., 4., 3., 2., 1.]
    assert_close(memory.attn_mass.sum(-1), torch.full((2, 2), 8., dtype=F64))
    assert (memory.attn_mass[:, :, S - 8:] > 0).all()


def test_most_used_keeps_the_most_attended_states():
    """Give two of the four states about to be evicted a huge past usage: those two become the compressed
    memory, whatever this segment's attention."""
    model = make_model(compression='most_used', seg_len=4, mem_len=4, cmem_len=4, compression_rate=2)
    memory = model.init_memory(1, 'cpu')
    with torch.no_grad():
        _, _, memory, _ = model(tokens(1, 4), memory)
        favourite = [1, 3]                                          # the 2nd and 4th state of m
        memory.attn_mass[:, 0, favourite] = 100.0
        old = memory.mem[:, 0, favourite].clone()
        _, _, memory, _ = model(tokens(1, 4, seed=2), memory)
    assert memory.cmem_length.tolist() == [2]
    assert torch.equal(memory.cmem[:, 0, 2:], old)


# -----------------------------------------------------------------------------------------------------------
# 4. with cmem_len = 0 the model is model_xl.py


@pytest.mark.parametrize('overrides', [dict(), dict(attn_kernel='einsum'), dict(pre_lnorm=True, same_length=True),
                                       dict(clamp_len=3, untie_r=False)])
def test_cmem_len_0_equals_transformer_xl(overrides):
    fields = dict(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
                  seg_len=4, mem_len=6, **overrides)
    torch.manual_seed(0)
    xl = model_xl.Model(model_xl.Config(**fields)).double().eval()
    model = Model(Config(**fields, cmem_len=0)).double().eval()
    model.load_state_dict(xl.state_dict())                      # strict: the same parameter names
    assert set(model.state_dict()) == set(xl.state_dict())
    idx = tokens(2, 17)
    with torch.no_grad():
        xl_memory = xl.init_memory(2, 'cpu')
        memory = model.init_memory(2, 'cpu')
        for start in range(0, 17, 4):
            a, _, xl_memory, _ = xl(idx[:, start:start + 4], xl_memory)
            b, _, memory, _ = model(idx[:, start:start + 4], memory)
            assert torch.equal(a, b), start                     # identical, not merely close
            assert torch.equal(xl_memory.mem, memory.mem) and torch.equal(xl_memory.length, memory.mem_length)
    assert model.num_params() == xl.num_params() and model.flops_per_token() == xl.flops_per_token()


def test_transformer_xl_weights_load_apart_from_compression():
    torch.manual_seed(0)
    xl = model_xl.Model(model_xl.Config(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32))
    model = Model(Config(vocab_size=V, n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, cmem_len=4,
                         recon_loss='autoencoding'))
    missing, unexpected = model.load_state_dict(xl.state_dict(), strict=False)
    assert not unexpected and missing and all(is_compression_param(k) for k in missing)


# -----------------------------------------------------------------------------------------------------------
# 5. the attention over [cm ; m ; segment] against a slow loop


@torch.no_grad()
def naive_attention(attn, h, memory_h, n_valid, u, v, window, same_length):
    """One attention layer, one (query, key, head) at a time, over [cm ; m ; h]: memory_h (B, S, C) holds the
    concatenated memories right-aligned with n_valid[b] valid slots; distances count slots of the concatenation.
    A^rel_{i,j} = (q_i + u)·k_j + (q_i + v)·W_{k,R} R_{i-j}, scaled by 1/sqrt(D) (post-LN)."""
    B, T, C = h.shape
    S = memory_h.size(1)
    H, D = attn.n_head, attn.d_head
    W_kE, W_v = attn.kv_net.weight.split(H * D)
    out = torch.empty_like(h)
    for b in range(B):
        seq = torch.cat([memory_h[b], h[b]])
        for i in range(T):
            heads = []
            for n in range(H):
                rows = slice(n * D, (n + 1) * D)
                q = attn.q_net.weight[rows] @ h[b, i]
                scores, values = [], []
                for j in range(S + T):
                    distance = S + i - j
                    if j < S - int(n_valid[b]) or distance < 0 or (same_length and distance >= window):
                        continue
                    k = W_kE[rows] @ seq[j]
                    score = (q + u[n]) @ k + (q + v[n]) @ (attn.r_net.weight[rows] @ sinusoid(distance, C))
                    scores.append(score / math.sqrt(D))
                    values.append(W_v[rows] @ seq[j])
                prob = torch.softmax(torch.stack(scores), dim=0)
                heads.append(sum(p * value for p, value in zip(prob, values)))
            out[b, i] = attn.layer_norm(h[b, i] + attn.o_net.weight @ torch.cat(heads))
    return out


@pytest.mark.parametrize('attn_kernel', ['sdpa', 'einsum'])
@pytest.mark.parametrize('same_length', [False, True])
def test_attention_over_compressed_memory_equals_naive_loop(attn_kernel, same_length):
    model = make_model(n_layer=1, attn_kernel=attn_kernel, same_length=same_length, seg_len=4, mem_len=4, cmem_len=3,
                       compression_rate=2)
    memory = random_memory(model, 3, cmem_lengths=[3, 1, 0], mem_lengths=[4, 4, 2])
    h = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(7), dtype=F64)
    inputs = []
    hook = model.layers[0].attn.register_forward_hook(lambda mod, args, out: inputs.append((args[0], out[0])))
    model.word_emb.register_forward_hook(lambda mod, args, out: h)            # feed h as the layer input
    with torch.no_grad():
        model(tokens(3, 4), memory)
    hook.remove()
    layer_in, layer_out = inputs[0]
    assert torch.equal(layer_in, h)
    memory_h = torch.cat([memory.cmem[0], memory.mem[0]], dim=1)             # concat(cm, m), contiguous valid
    expected = naive_attention(model.layers[0].attn, h, memory_h, memory.cmem_length + memory.mem_length,
                               model.r_w_bias[0], model.r_r_bias[0], window=3 + 4, same_length=same_length)
    assert_close(layer_out, expected, atol=1e-6 if attn_kernel == 'einsum' else 1e-10, rtol=0)


# -----------------------------------------------------------------------------------------------------------
# 6. causality, memory dependence, reset


@pytest.mark.parametrize('compression', ['conv', 'most_used'])
def test_causality_within_and_across_segments(compression):
    seg, L = 4, 16
    model = make_model(compression=compression, seg_len=seg, mem_len=4, cmem_len=4)
    idx = tokens(2, L)
    with torch.no_grad():
        base, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), seg)
        for t in (0, 2, 5, 9, 15):
            changed = idx.clone()
            changed[:, t] = (changed[:, t] + 1) % V
            out, _ = run_segments(model, changed, model.init_memory(2, 'cpu'), seg)
            assert_close(out[:, :t], base[:, :t], atol=1e-12, rtol=0)
            assert differs(out[:, t], base[:, t])
        # token 0 leaves m after segment 2: segment 3 sees it through cm only
        changed = idx.clone()
        changed[:, 0] = (changed[:, 0] + 1) % V
        out, memory = run_segments(model, changed[:, :8], model.init_memory(2, 'cpu'), seg)
        assert memory.cmem_length.tolist() == [2, 2]
        assert differs(model(idx[:, 8:12], memory)[0], base[:, 8:12], atol=1e-9)   # small at init, but real


def test_compressed_memory_is_attended_and_invalid_slots_are_not():
    model = make_model(seg_len=4, mem_len=4, cmem_len=4)
    memory = random_memory(model, 2, cmem_lengths=[2, 0], mem_lengths=[4, 3])
    idx = tokens(2, 4)
    with torch.no_grad():
        base = model(idx, memory)[0]
        changed = random_memory(model, 2, [2, 0], [4, 3])
        changed.cmem[:, 0, 3] += 1.0                                 # a valid compressed slot
        assert differs(model(idx, changed)[0][0], base[0]) and torch.equal(model(idx, changed)[0][1], base[1])
        changed = random_memory(model, 2, [2, 0], [4, 3])
        changed.cmem[:, 0, :2] += 100.0                              # the empty slots of cm
        changed.cmem[:, 1] += 100.0
        changed.mem[:, 1, 0] += 100.0                                # and of m
        assert torch.equal(model(idx, changed)[0], base)


def test_reset_memory_row_equals_fresh_stream():
    model = make_model(compression='most_used', seg_len=4, mem_len=4, cmem_len=4)
    with torch.no_grad():
        _, memory = run_segments(model, tokens(3, 16, seed=5), model.init_memory(3, 'cpu'), 4)
        reset = model.reset_memory(memory, torch.tensor([False, True, False]))
        assert reset.cmem_length.tolist() == [4, 0, 4] and reset.mem_length.tolist() == [4, 0, 4]
        for name in ('cmem', 'mem', 'attn_mass', 'attn_queries'):
            value = getattr(reset, name)
            assert not value[..., 1, :].any() if name == 'attn_queries' else not value[:, 1].any()
        idx = tokens(3, 4, seed=6)
        logits, _, _, _ = model(idx, reset)
        kept, _, _, _ = model(idx, memory)
        fresh, _, _, _ = model(idx[1:2], model.init_memory(1, 'cpu'))
    assert_close(logits[1:2], fresh, atol=1e-10, rtol=0)
    assert_close(logits[0::2], kept[0::2], atol=1e-10, rtol=0)
    assert differs(logits[1], kept[1])


# -----------------------------------------------------------------------------------------------------------
# 7. gradients: nothing into the past, the LM trains everything but f_c, the reconstruction loss only f_c


def two_segments_loss(model, recon_loss=None):
    """LM loss and reconstruction loss of the 3rd segment, after 2 that filled m and started compressing."""
    memory = model.init_memory(2, 'cpu')
    idx = tokens(2, 13, seed=4)
    with torch.no_grad():
        for start in (0, 4):
            _, _, memory, _ = model(idx[:, start:start + 4], memory, targets=idx[:, start + 1:start + 5])
    assert (memory.cmem_length > 0).all()                       # compression has happened
    _, loss, new_memory, aux = model(idx[:, 8:12], memory, targets=idx[:, 9:13])
    assert (new_memory.cmem_length > memory.cmem_length).all()  # and happens in this segment
    return loss, aux, new_memory


def grads(model, loss):
    params = dict(model.named_parameters())
    values = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {name: g for name, g in zip(params, values)}


@pytest.mark.parametrize('compression', ['conv', 'dilated_conv', 'mean_pool'])
@pytest.mark.parametrize('recon_loss', ['attention', 'autoencoding'])
def test_lm_gradients_unchanged_by_recon_loss_which_trains_only_f_c(compression, recon_loss):
    with_recon = make_model(compression=compression, recon_loss=recon_loss, recon_weight=0.7).train()
    without = make_model(compression=compression, recon_loss='none').train()
    without.load_state_dict(with_recon.state_dict(), strict=False)      # the decoder g exists only with autoencoding
    loss, aux, _ = two_segments_loss(with_recon)
    lm_loss, lm_aux, _ = two_segments_loss(without)
    assert torch.equal(aux['lm_loss'], lm_aux['lm_loss']) and 'recon_loss' not in lm_aux
    assert aux['recon_loss'] > 0
    assert_close(loss, aux['lm_loss'] + 0.7 * aux['recon_loss'], atol=1e-6, rtol=0)
    g_total, g_lm = grads(with_recon, loss), grads(without, lm_loss)
    trained_by_recon = 0
    for name, p in with_recon.named_parameters():
        assert p.requires_grad, name
        if is_compression_param(name):
            assert g_lm.get(name) is None or not g_lm[name].any(), name       # no LM gradient reaches f_c
            assert g_total[name] is not None and g_total[name].abs().sum() > 0, name
            trained_by_recon += 1
        else:
            assert torch.equal(g_total[name], g_lm[name]), name                # identical LM gradients
            assert g_total[name].abs().sum() > 0, name                         # and every one of them non-zero
    n_f_c = 0 if compression == 'mean_pool' else 2 * 2             # weight and bias per layer (dilated c=2: 1 level)
    assert trained_by_recon == n_f_c + (2 * 2 if recon_loss == 'autoencoding' else 0)


@pytest.mark.parametrize('recon_loss', ['attention', 'autoencoding'])
def test_recon_loss_reaches_nothing_but_f_c(recon_loss):
    model = make_model(compression='conv', recon_loss=recon_loss, seg_len=4, mem_len=4).train()
    memory = model.init_memory(2, 'cpu')
    idx = tokens(2, 13, seed=4)
    with torch.no_grad():
        _, _, memory, _ = model(idx[:, :4], memory)
    logits, loss, _, aux = model(idx[:, 4:8], memory, targets=idx[:, 5:9])
    lm_loss = F.cross_entropy(logits.float().view(-1, V), idx[:, 5:9].reshape(-1))
    assert_close(lm_loss, aux['lm_loss'], atol=0, rtol=0)
    recon = loss - lm_loss                                      # recon_weight * reconstruction loss, with its graph
    assert recon > 0
    for name, g in grads(model, recon).items():
        if is_compression_param(name):
            assert g is not None and g.abs().sum() > 0, name
        else:
            assert g is None or not g.any(), name


def naive_content_attention(attn, h, m):
    """attn(h, m) of Algorithm 2, line 6, from scratch: softmax((hQ)(mK)ᵀ / sqrt(D)) (mV) per head with the layer's
    weights (pre-LN: its LayerNorm first). h (T, C), m (S, C) -> (H, T, D)"""
    if attn.pre_lnorm:
        h, m = attn.layer_norm(h), attn.layer_norm(m)
    H, D = attn.n_head, attn.d_head
    W_k, W_v = attn.kv_net.weight.split(H * D)
    q, k, v = [(x @ W.T).view(-1, H, D).transpose(0, 1) for x, W in ((h, attn.q_net.weight), (m, W_k), (m, W_v))]
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D), dim=-1) @ v


@pytest.mark.parametrize('overrides', [dict(), dict(pre_lnorm=True), dict(seg_len=8, mem_len=4)], ids=str)
def test_attention_reconstruction_loss_equals_algorithm_2(overrides):
    """Algorithm 2 written out, one layer and one row at a time: h (the layer's input) and old_mem (the states that
    leave m) projected afresh, new_cm = f_c(old_mem), the mean squared difference of attn(h, old_mem) and
    attn(h, new_cm); averaged over the rows that compress something (row 1, reset, may not), summed over layers.
    The model reuses its forward's projections instead. seg_len 8 > mem_len 4: old_mem holds some of h too."""
    model = make_model(compression='conv', recon_loss='attention', **overrides).train()
    c, B = model.config, 3
    T, rate = c.seg_len, c.compression_rate
    idx = tokens(B, 3 * T + 1, seed=4)
    with torch.no_grad():
        _, memory = run_segments(model, idx[:, :2 * T], model.init_memory(B, 'cpu'), T)
    memory = model.reset_memory(memory, torch.tensor([False, True, False]))
    inputs = []
    hooks = [layer.register_forward_pre_hook(lambda mod, args: inputs.append(args[0])) for layer in model.layers]
    _, _, _, aux = model(idx[:, 2 * T:3 * T], memory, targets=idx[:, 2 * T + 1:])
    for hook in hooks:
        hook.remove()
    expected = 0.0
    with torch.no_grad():
        for n, layer in enumerate(model.layers):
            errors = []
            for b in range(B):
                m = memory.mem[n, b, c.mem_len - int(memory.mem_length[b]):]          # the valid states of m
                states = torch.cat([m, inputs[n][b]])                                # concat(m, h)
                n_old = len(states) - c.mem_len                                      # line 8: they leave m
                G = max(0, n_old) // rate
                if G == 0:
                    continue
                old_mem = states[n_old - G * rate:n_old]                             # the oldest n_old mod c forgotten
                new_cm = layer.compress(old_mem.view(1, G, rate, -1))[0]                 # line 9
                target = naive_content_attention(layer.attn, inputs[n][b], old_mem)
                errors.append((target - naive_content_attention(layer.attn, inputs[n][b], new_cm)).pow(2).mean())
            expected += sum(errors) / len(errors)
    assert aux['recon_loss'] > 0
    assert_close(aux['recon_loss'].double(), expected, atol=0, rtol=1e-5)       # float32 softmax and error


def test_memory_is_detached_and_blocks_gradient_to_previous_segment():
    model = make_model().train()
    emb_outputs = []
    hook = model.word_emb.register_forward_hook(lambda mod, args, out: emb_outputs.append(out))
    idx = tokens(2, 13, seed=3)
    memory = model.init_memory(2, 'cpu')
    losses = []
    for start in (0, 4, 8):
        _, loss, memory, _ = model(idx[:, start:start + 4], memory, targets=idx[:, start + 1:start + 5])
        losses.append(loss)
        for name in ('cmem', 'mem', 'attn_mass', 'attn_queries'):
            assert getattr(memory, name).grad_fn is None and not getattr(memory, name).requires_grad
    hook.remove()
    assert memory.cmem_length.tolist() == [3, 3]
    g = torch.autograd.grad(losses[2], emb_outputs, allow_unused=True)
    assert g[0] is None and g[1] is None and g[2].abs().sum() > 0


def test_recon_loss_none_trains_f_c_through_time_only():
    """recon_loss='none': the compressed memory keeps f_c's graph (nothing else's) in training, so a later
    segment's LM loss reaches f_c, as train.py's --bptt_segments does; in eval it is detached."""
    model = make_model(compression='conv', recon_loss='none').train()
    loss, aux, memory = two_segments_loss(model)
    assert 'recon_loss' not in aux
    assert memory.cmem.requires_grad and not memory.mem.requires_grad
    idx = tokens(2, 5, seed=9)
    _, later_loss, _, _ = model(idx[:, :4], memory, targets=idx[:, 1:5])
    g = grads(model, later_loss)
    assert all(g[k] is not None and g[k].abs().sum() > 0 for k in g if is_compression_param(k))
    model.eval()
    with torch.no_grad():
        _, _, memory, _ = model(idx[:, :4], memory)
    assert not memory.cmem.requires_grad


# -----------------------------------------------------------------------------------------------------------
# 8. generate == forward, segment by segment, compression included


def generate_setup(with_memory, **overrides):
    """A tiny model, the memory to generate from (None: generate() makes an empty one) and the same memory for the
    reference forward; with_memory: after two segments of other tokens."""
    model = make_model(**overrides)
    seg = model.config.seg_len
    memory = None
    if with_memory:
        with torch.no_grad():
            _, memory = run_segments(model, tokens(2, 2 * seg, seed=8), model.init_memory(2, 'cpu'), seg)
    return model, memory, memory if memory is not None else model.init_memory(2, 'cpu')


@pytest.mark.parametrize('compression', COMPRESSIONS)
@pytest.mark.parametrize('seg_len, mem_len, cmem_len, rate', [(4, 4, 3, 2), (2, 4, 4, 2), (6, 3, 2, 3)])
@pytest.mark.parametrize('with_memory', [False, True])
def test_greedy_generate_matches_segmentwise_forward(compression, seg_len, mem_len, cmem_len, rate, with_memory):
    """Across several segment boundaries (compression happening in the cache), from an empty or a used memory,
    with a prompt longer than a segment. The logits too, not only their argmax: at init the compressed memory moves
    them a little (most_used: the manual path's float32 softmax, 1e-6)."""
    model, memory, start = generate_setup(with_memory, compression=compression, seg_len=seg_len, mem_len=mem_len,
                                          cmem_len=cmem_len, compression_rate=rate)
    assert_greedy_generate_matches_forward(model, tokens(2, seg_len + 2, seed=3), 4 * seg_len, memory, start, seg_len,
                                           logits_atol=1e-6 if compression == 'most_used' else 1e-10)


@pytest.mark.parametrize('compression', ['conv', 'most_used'])
def test_sampled_generate_matches_segmentwise_forward(compression):
    model, memory, start = generate_setup(False, compression=compression, seg_len=2, mem_len=4, cmem_len=3,
                                          compression_rate=2)
    assert_sampled_generate_matches_forward(model, tokens(2, 3, seed=3), 12, memory, start, 2, sample_next)


def test_generate_rejects_empty_prompt():
    with pytest.raises(ValueError):
        make_model().generate(tokens(1, 0), 3)


# -----------------------------------------------------------------------------------------------------------
# 9. the contract: config, shapes, dtypes, compile, autocast, it learns


@pytest.mark.parametrize('bad', [dict(cmem_len=-1), dict(compression_rate=0), dict(compression='avg'),
                                 dict(recon_loss='mse'), dict(recon_weight=-1.0), dict(mem_len=0, cmem_len=4),
                                 dict(dropout=1.0), dict(n_embd=15)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        Config(**bad)


@pytest.mark.parametrize('lengths', [dict(seg_len=5, mem_len=4), dict(seg_len=4, mem_len=5),
                                     dict(seg_len=6, mem_len=6, compression_rate=4)])
def test_config_requires_seg_len_and_mem_len_multiples_of_the_rate(lengths):
    fields = dict(dict(compression_rate=2), **lengths)
    with pytest.raises(ValueError, match=r'must be multiples of compression_rate') as error:
        Config(**fields)
    assert '\n' not in str(error.value)
    Config(**fields, cmem_len=0)                                      # Transformer-XL compresses nothing


def test_train_py_reports_a_length_that_is_not_a_multiple_in_one_line(tmp_path):
    values = dict(TINY_MODELS['compressive'], seg_len=7)
    proc = run_python(['train.py'] + flags(make_pattern_dataset(tmp_path / 'data', n_train=500, n_eval=100),
                                           tmp_path / 'out', values, max_iters=1))
    assert proc.returncode != 0
    assert_one_line_error(proc.stderr, 'seg_len (7) and mem_len (8) must be multiples of compression_rate (2)')


@pytest.mark.parametrize('bptt_segments', [1, 2])
def test_recon_loss_none_trains_under_ddp(tmp_path, bptt_segments):
    """With recon_loss='none' a learned f_c gets the LM loss's gradient only through time, never within
    --bptt_segments=1 or while the memory fills; 2-process gloo DDP (no find_unused_parameters) must still run."""
    values = dict(TINY_MODELS['compressive'], recon_loss='none', compression='conv')
    out_dir = tmp_path / 'out'
    proc = run_python(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py']
                      + flags(make_pattern_dataset(tmp_path / 'data', n_train=2000, n_eval=200), out_dir, values,
                              max_iters=3, bptt_segments=bptt_segments), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load(out_dir / 'ckpt.pt')['step'] == 3


def test_recon_loss_none_gives_f_c_a_gradient_at_every_step():
    """What DDP needs: with recon_loss='none' in training, f_c's parameters are in the loss's graph at every step,
    with a zero gradient where no BPTT path reaches them, and the loss value is the LM loss."""
    model = make_model(compression='conv', recon_loss='none').train()
    _, loss, _, aux = model(tokens(2, 4), model.init_memory(2, 'cpu'), targets=tokens(2, 4, seed=2))
    assert torch.equal(loss.detach(), aux['lm_loss'])
    for name, g in grads(model, loss).items():
        if is_compression_param(name):
            assert g is not None and not g.any(), name


def test_config_defaults_are_valid():
    c = Config()
    assert (c.cmem_len, c.compression, c.recon_loss) == (150, 'conv', 'attention')


def test_memory_fields_are_fixed_shape_float_or_int64():
    model = make_model(dtype=torch.float32, compression='most_used', seg_len=4, mem_len=4, cmem_len=3)
    memory = model.init_memory(2, 'cpu')
    spec = {k: (v.shape, v.dtype) for k, v in vars(memory).items()}
    assert all(dtype in (torch.float32, torch.long) for _, dtype in spec.values())
    with torch.no_grad():
        for T in (4, 4, 2, 4, 4, 1, 4):                                 # shorter segments too (T < c: no group)
            _, _, memory, _ = model(tokens(2, T, seed=T), memory)
            assert {k: (v.shape, v.dtype) for k, v in vars(memory).items()} == spec
            assert all(v.is_contiguous() for v in vars(memory).values())
    assert memory.cmem_length.tolist() == [3, 3]
    longer = model.init_memory(2, 'cpu', mem_len=10)                   # eval override: n_m only
    assert longer.mem.size(2) == 10 and longer.cmem.size(2) == 3 and longer.attn_mass.size(2) == 10
    model(tokens(2, 4), longer)


def test_forward_rejects_segment_longer_than_seg_len():
    model = make_model()
    with pytest.raises(ValueError):
        model(tokens(1, 5), model.init_memory(1, 'cpu'))


@pytest.mark.parametrize('compression', ['conv', 'most_used'])
def test_bf16_autocast_forward_backward(compression):
    model = make_model(dtype=torch.float32, compression=compression, dropout=0.1).train()
    idx = tokens(2, 13)
    memory = model.init_memory(2, 'cpu')
    total = 0
    with torch.autocast('cpu', dtype=torch.bfloat16):
        for start in (0, 4, 8):
            logits, loss, memory, aux = model(idx[:, start:start + 4], memory, targets=idx[:, start + 1:start + 5])
            assert memory.mem.dtype == torch.float32 and logits.dtype == torch.bfloat16
            total = total + loss
    assert torch.isfinite(total)
    total.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16], ids=str)
def test_init_memory_follows_model_dtype(dtype):
    model = make_model(dtype=dtype)
    memory = model.init_memory(2, 'cpu')
    assert memory.mem.dtype == dtype
    _, memory = run_segments(model, tokens(2, 12), memory, 4)
    assert memory.mem.dtype == dtype and memory.cmem_length.tolist() == [3, 3]
    model.generate(tokens(2, 3), 2, temperature=0.0)


def test_compiles_once_while_memory_fills_and_compression_starts():
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = make_model(dtype=torch.float32, n_layer=1, compression='most_used', recon_loss='attention',
                       seg_len=4, mem_len=4, cmem_len=3, dropout=0.1).train()
    compiled = torch.compile(model, backend='eager')    # dynamo's guards decide recompiles, not inductor
    memory = model.init_memory(2, 'cpu')
    idx = tokens(2, 25)
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            for start in range(0, 24, 4):                                 # empty, filling, compressing, full
                _, loss, memory, aux = compiled(idx[:, start:start + 4], memory, idx[:, start + 1:start + 5])
                loss.backward()
        assert counters['stats']['unique_graphs'] == 1, dict(counters['stats'])
    finally:
        torch._dynamo.reset()
    assert memory.cmem_length.tolist() == [3, 3]


@pytest.mark.parametrize('compression', ['conv', 'most_used'])
def test_loss_goes_down_on_repeated_pattern(compression):
    seg, steps = 8, 120
    model = make_model(dtype=torch.float32, compression=compression, n_embd=32, d_head=16, d_inner=64,
                       seg_len=seg, mem_len=seg, cmem_len=4).train()
    losses = train_on_repeated_pattern(model, steps, record='lm_loss')
    initial, final = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert final < 0.5 * initial, (initial, final)


def test_flops_per_token_counts_compressed_keys():
    model = make_model(seg_len=8, mem_len=8, cmem_len=8)
    assert model.flops_per_token() > make_model(seg_len=8, mem_len=8, cmem_len=0).flops_per_token()
    assert model.flops_per_token(mem_len=16) > model.flops_per_token()


def test_flops_per_token_counts_f_c_and_the_reconstruction_loss_by_hand():
    """2 layers, segments of T = 4 tokens, c = 2: each layer compresses G = 2 slots a segment; C = H·D = 16. Counted
    per layer and segment at 2 FLOPs a multiply-add, then per token: x 2 layers / 4 tokens."""
    def flops(**overrides):
        return make_model(seg_len=4, mem_len=4, cmem_len=4, compression_rate=2, **overrides).flops_per_token()

    def added(**overrides):                                       # what recon_loss adds to recon_loss='none'
        return flops(**overrides) - flops(**dict(overrides, recon_loss='none'))

    per_token = 2 / 4
    # conv f_c without a local loss: its (16, 16, 2) kernel once a slot, forward only: 2 * 2 * 512 (its weights are
    # not in 6 * num_params: they work once a slot, not once a token)
    assert flops(recon_loss='none') - flops(recon_loss='none', compression='mean_pool') == 2048 * per_token
    # Algorithm 2: f_c's weight gradient (2048); the 4 queries over the 4 states of old_mem, q·k and p·v, forward
    # only: 2 * (2*4*4*16) = 1024; new_cm's keys and values, forward and gradient to new_cm: 4 * (2*2*16*16) = 4096;
    # the queries over new_cm, q·k and p·v forward, dp, dk and dv backward, and dq, which SDPA's backward computes
    # though q is under stop-gradient: 6 * (2*4*2*16) = 1536
    assert added(recon_loss='attention') == (2048 + 1024 + 4096 + 1536) * per_token
    # autoencoding: f_c's weight gradient (2048) and g (16 -> 2*16 on each slot), forward, weight gradient and
    # gradient to new_cm: 3 * (2*2*16*32) = 6144
    assert added(recon_loss='autoencoding') == (2048 + 6144) * per_token
    # mean pooling learns nothing: Algorithm 2 runs forward only, 1024 + 2 * (2*2*16*16) + 2 * (2*4*2*16)
    assert added(recon_loss='attention', compression='mean_pool') == (1024 + 2048 + 512) * per_token
    # dilated_conv at c = 4: the group padded to 4, kernel-2 levels of 3 and 1 outputs, 2*16*16 each; backward: the
    # weight gradients and the gradient of the second level's input
    f_c = Compression(Config(n_embd=16, seg_len=4, mem_len=4, compression_rate=4, compression='dilated_conv'))
    assert f_c.macs_per_slot() == ((3 + 1) * 2 * 16 * 16, (3 + 1 + 1) * 2 * 16 * 16)


@pytest.mark.parametrize('overrides', [dict(compression='conv'), dict(compression='mean_pool'),
                                       dict(compression='dilated_conv', compression_rate=4, seg_len=8, mem_len=8),
                                       dict(compression='most_used', pre_lnorm=True)], ids=str)
@pytest.mark.parametrize('recon_loss', ['attention', 'autoencoding'])
def test_flops_of_f_c_and_its_loss_match_torch_flop_counter(recon_loss, overrides):
    """Against torch's FlopCounterMode over a training step (forward + backward) with a full memory: flops_per_token
    of one f_c against another and of recon_loss against 'none' differ as much as the counted steps do (the rest of
    the count is model_xl.py's, which this test does not check). G >= 2 slots: torch computes a product over a
    single key without a counted matrix product."""
    def both(**fields):                                           # (counted, flops_per_token) per token
        model = make_model(**dict(dict(seg_len=4, mem_len=4, cmem_len=4, compression_rate=2), **fields)).train()
        T = model.config.seg_len
        memory, idx = model.init_memory(3, 'cpu'), tokens(3, 5 * T + 1, seed=4)
        with torch.no_grad():
            _, memory = run_segments(model, idx[:, :4 * T], memory, T)          # m and cm full
        counter = flop_counter()
        with counter:
            model(idx[:, 4 * T:5 * T], memory, targets=idx[:, 4 * T + 1:])[1].backward()
        return counter.get_total_flops() / (3 * T), model.flops_per_token()

    counted, formula = both(recon_loss=recon_loss, **overrides)
    for baseline in (dict(overrides, recon_loss='none'),                      # the loss's share
                     dict(overrides, recon_loss=recon_loss, compression='max_pool')):   # f_c's share
        counted_baseline, formula_baseline = both(**baseline)
        assert counted - counted_baseline == formula - formula_baseline, baseline
