"""
CPU tests for model_compressive_gpt2.py: GPT-2 + a compressed memory with ALiBi's bias on the memory slots (the
∞-former paper's Compressive baseline, §4.2).

With the memory empty the model is GPT-2: its logits equal transformers' GPT2LMHeadModel on the same weights (a tiny
random checkpoint written with save_pretrained, tests/_gpt2_util.py). With memory, the attention equals a naive one
written here (explicit scores, ALiBi's -m_h·distance on the memory slots, nothing on the segment's, one softmax over
[cm ; m ; segment]) in float64. The rest: the memory update (what f_c compresses), causality, the memory changing the
logits, the reconstruction loss training f_c and nothing else, generate() == forward(), the config and the
PG-19 config file.
"""

import inspect
import math
import runpy
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from _gpt2_util import hub_dir  # noqa: F401  (a fixture)
from _gpt2_util import train_resume_evaluate_sample, write_gpt2_dataset, write_tiny_gpt2
from _model_tests import (F64, V, assert_bf16_forward_backward, assert_close, assert_greedy_generate_matches_forward,
                          assert_sampled_generate_matches_forward, differs, run_segments, tokens,
                          train_on_repeated_pattern)
from model_compressive_gpt2 import COMPRESSIONS, Config, Model, alibi_slopes, sample_next
from test_compressive import grads, is_compression_param, random_memory   # the same Memory fields

ROOT = Path(__file__).resolve().parent.parent
CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


def make_model(dtype=F64, seed=0, **overrides):
    """A tiny model in eval mode, dropout off; overrides are Config fields. Four heads: ALiBi slopes 1/4 ... 1/256."""
    fields = dict(vocab_size=V, n_layer=2, n_head=4, n_embd=16, n_positions=16, seg_len=4, mem_len=0, cmem_len=4,
                  compression_rate=2, dropout=0.0)
    fields.update(overrides)
    torch.manual_seed(seed)
    model = Model(Config(**fields))
    with torch.no_grad():                                       # random biases and LayerNorms: a slip shows
        for name, p in model.named_parameters():
            if name.endswith('bias') or '.ln_' in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


# -----------------------------------------------------------------------------------------------------------
# 1. GPT-2: with the memory empty, transformers' logits


def load_transformers_gpt2(model, hf):
    """hf's weights into model: the same names, Conv1D's (in, out) weights transposed to nn.Linear's."""
    own = model.state_dict()
    weights = {k: v.t() if k.endswith(CONV1D) else v for k, v in hf.state_dict().items() if k in own}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all(is_compression_param(k) for k in missing), missing
    return model


@pytest.fixture(scope='module')
def tiny_gpt2(tmp_path_factory):
    return write_tiny_gpt2(tmp_path_factory.mktemp('gpt2'), n_layer=2, n_head=4, n_embd=32, n_positions=64)


@pytest.mark.parametrize('overrides', [dict(), dict(mem_len=8, cmem_len=8), dict(cmem_len=0), dict(alibi=False)],
                         ids=str)
def test_empty_memory_gives_transformers_gpt2_logits(tiny_gpt2, overrides):
    """A fresh stream's first segment (and a shorter one) is GPT-2's, to 1e-5 in float32: the memory slots are all
    masked and the segment's keys carry no bias. With cmem_len = mem_len = 0 every segment is GPT-2 on its own."""
    transformers = pytest.importorskip('transformers')
    assert isinstance(tiny_gpt2, transformers.GPT2LMHeadModel)
    c = tiny_gpt2.config
    fields = dict(vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                  n_positions=c.n_positions, seg_len=16, dropout=0.0, cmem_len=8, mem_len=0)
    model = load_transformers_gpt2(Model(Config(**{**fields, **overrides})).eval(), tiny_gpt2)
    idx = torch.randint(0, c.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for T in (16, 5):
            ours, _, _, _ = model(idx[:, :T], model.init_memory(2, 'cpu'))
            assert_close(ours, tiny_gpt2(idx[:, :T]).logits, atol=1e-5, rtol=0)
        ours, memory = run_segments(model, idx, model.init_memory(2, 'cpu'), 16)
        alone = torch.cat([tiny_gpt2(piece).logits for piece in idx.split(16, dim=1)], dim=1)
    if model.config.cmem_len + model.config.mem_len == 0:
        assert_close(ours, alone, atol=1e-5, rtol=0)
    else:                                                       # the memory changes what follows the first segment
        assert differs(ours[:, 16:], alone[:, 16:], atol=1e-3)


# -----------------------------------------------------------------------------------------------------------
# 2. ALiBi's slopes and the attention over [cm ; m ; segment]


def press_slopes(n):
    """Press et al.'s get_slopes, as their code writes it (recursively)."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_slopes(2 * closest)[0::2][:n - closest]


@pytest.mark.parametrize('n_head', [1, 2, 4, 6, 8, 12, 16, 20, 25])
def test_alibi_slopes_are_press_et_al(n_head):
    assert_close(alibi_slopes(n_head).double(), torch.tensor(press_slopes(n_head), dtype=F64), atol=0, rtol=1e-6)


def test_alibi_slopes_of_gpt2_small():
    assert_close(alibi_slopes(12).double(), torch.tensor([2.0 ** -k for k in range(1, 9)]
                                                          + [2.0 ** -(k + 0.5) for k in range(4)], dtype=F64))


def naive_forward(model, idx, memory):
    """forward()'s logits from scratch, one (row, head, query) at a time: GPT-2's pre-LN blocks whose query i
    (at S + i in [cm ; m ; segment]) scores key j by q·k/√D - m_h·(S + i - j) for a valid memory slot j, q·k/√D for
    a segment token j <= S + i, then one softmax over those."""
    c = model.config
    B, T = idx.shape
    H, D, C = c.n_head, c.n_embd // c.n_head, c.n_embd
    n_cm, n_m = memory.cmem.size(2), memory.mem.size(2)
    S = n_cm + n_m
    slopes = press_slopes(H) if c.alibi else [0.0] * H
    tr = model.transformer
    h = tr.wte.weight[idx] + tr.wpe.weight[:T]                  # (B, T, C)
    for n, block in enumerate(tr.h):
        mem = torch.cat([memory.cmem[n], memory.mem[n]], dim=1)  # (B, S, C)
        out = torch.zeros_like(h)
        ln = lambda x: F.layer_norm(x, (C,), block.ln_1.weight, block.ln_1.bias, c.layer_norm_epsilon)  # noqa: E731
        W, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # (3C, C): W_Q, W_K, W_V
        for row in range(B):
            x = torch.cat([ln(mem[row]), ln(h[row])])            # (S + T, C)
            q = ln(h[row]) @ W[:C].T + b[:C]
            k = x @ W[C:2 * C].T + b[C:2 * C]
            v = x @ W[2 * C:].T + b[2 * C:]
            valid = ([s >= n_cm - memory.cmem_length[row] for s in range(n_cm)]       # right-aligned slots
                     + [s >= n_m - memory.mem_length[row] for s in range(n_m)] + [True] * T)
            heads = []
            for head in range(H):
                hs = slice(head * D, (head + 1) * D)
                rows = []
                for i in range(T):
                    scores, values = [], []
                    for j in range(S + T):
                        if not valid[j] or j > S + i:
                            continue
                        bias = -slopes[head] * (S + i - j) if j < S else 0.0
                        scores.append(q[i, hs] @ k[j, hs] / math.sqrt(D) + bias)
                        values.append(v[j, hs])
                    p = torch.stack(scores).exp()
                    rows.append((p[:, None] * torch.stack(values)).sum(0) / p.sum())
                heads.append(torch.stack(rows))                  # (T, D)
            y = torch.cat(heads, dim=1)                          # (T, C)
            out[row] = y @ block.attn.c_proj.weight.T + block.attn.c_proj.bias
        h = h + out
        h = h + block.mlp(block.ln_2(h))
    return F.linear(tr.ln_f(h), tr.wte.weight)


@pytest.mark.parametrize('mem_len, cmem_len, cmem_lengths, mem_lengths',
                         [(0, 4, [4, 2], [0, 0]), (4, 4, [4, 0], [4, 3]), (4, 0, [0, 0], [4, 1]),
                          (0, 4, [0, 0], [0, 0])])
@pytest.mark.parametrize('alibi', [True, False])
def test_attention_with_memory_equals_naive_reference(mem_len, cmem_len, cmem_lengths, mem_lengths, alibi):
    model = make_model(mem_len=mem_len, cmem_len=cmem_len, alibi=alibi)
    memory = random_memory(model, 2, cmem_lengths, mem_lengths)
    idx = tokens(2, 4, seed=5)
    with torch.no_grad():
        logits, _, _, _ = model(idx, memory)
        assert_close(logits, naive_forward(model, idx, memory), atol=1e-10, rtol=0)
        if sum(cmem_lengths) + sum(mem_lengths):
            assert differs(logits, naive_forward(model, idx, model.init_memory(2, 'cpu')))


def test_alibi_biases_the_memory_slots_only():
    """alibi on/off changes the logits with a memory and never without one (the segment's keys carry no bias);
    off, the memory slots are unbiased (equal scores for equal keys at any distance)."""
    on, off = make_model(alibi=True), make_model(alibi=False)
    idx = tokens(2, 4, seed=6)
    memory = random_memory(on, 2, [4, 2], [0, 0])
    with torch.no_grad():
        assert torch.equal(on(idx, on.init_memory(2, 'cpu'))[0], off(idx, off.init_memory(2, 'cpu'))[0])
        assert differs(on(idx, memory)[0], off(idx, memory)[0])
    key_valid = torch.ones(1, 8, dtype=torch.bool)
    in_memory = torch.arange(8) < 4
    bias = on._attn_bias(key_valid, in_memory, 4)[0]              # (H, T, K)
    slopes = alibi_slopes(4).double()
    assert torch.equal(bias[:, 2, 4:7], torch.zeros(4, 3, dtype=bias.dtype))             # the segment: 0
    assert_close(bias[:, 2, :4], -slopes[:, None] * torch.tensor([6.0, 5, 4, 3], dtype=F64), atol=1e-6, rtol=0)
    assert torch.isinf(bias[:, 2, 7]).all()                       # the future
    assert torch.equal(off._attn_bias(key_valid, in_memory, 4)[0][:, 2, :7], torch.zeros(4, 7, dtype=bias.dtype))


# -----------------------------------------------------------------------------------------------------------
# 3. The memory: what it holds, that it matters, causality


def test_each_segment_is_compressed_into_cm_without_a_fifo():
    """mem_len = 0 (the default): the segment's own layer inputs leave through f_c at its end; with mean_pool, layer
    0's new slots are the means of consecutive pairs of h^0 = wte + wpe, and cm keeps the last cmem_len."""
    model = make_model(compression='mean_pool', cmem_len=3)
    idx = tokens(2, 8, seed=2)
    tr = model.transformer
    memory = model.init_memory(2, 'cpu')
    with torch.no_grad():
        _, _, memory, _ = model(idx[:, :4], memory)
        h0 = tr.wte.weight[idx[:, :4]] + tr.wpe.weight[:4]        # (B, 4, C)
        assert memory.cmem_length.tolist() == [2, 2] and memory.mem.size(2) == 0
        assert_close(memory.cmem[0, :, 1:], h0.view(2, 2, 2, -1).mean(2), atol=1e-12, rtol=0)
        _, _, memory, _ = model(idx[:, 4:], memory)
        h0_next = tr.wte.weight[idx[:, 4:]] + tr.wpe.weight[:4]
    assert memory.cmem_length.tolist() == [3, 3]
    assert_close(memory.cmem[0], torch.cat([h0[:, 2:].mean(1, keepdim=True), h0_next.view(2, 2, 2, -1).mean(2)], 1),
                 atol=1e-12, rtol=0)


def test_with_a_fifo_memory_only_what_leaves_it_is_compressed():
    """mem_len > 0: m keeps the last mem_len layer inputs (Rae et al.'s Algorithm 1), what falls out goes to f_c."""
    model = make_model(compression='max_pool', mem_len=4, cmem_len=4)
    idx = tokens(1, 12, seed=3)
    tr = model.transformer
    with torch.no_grad():
        _, memory = run_segments(model, idx, model.init_memory(1, 'cpu'), 4)
    h0 = tr.wte.weight[idx] + tr.wpe.weight[torch.arange(12) % 4]
    assert memory.mem_length.tolist() == [4] and memory.cmem_length.tolist() == [4]
    assert_close(memory.mem[0, 0], h0[0, 8:], atol=1e-12, rtol=0)
    assert_close(memory.cmem[0, 0], h0[0, :8].view(4, 2, -1).amax(1), atol=1e-12, rtol=0)


def test_valid_memory_slots_matter_and_invalid_ones_do_not():
    model = make_model(mem_len=4, cmem_len=4)
    idx = tokens(2, 4, seed=7)
    memory = random_memory(model, 2, [2, 2], [4, 4])
    with torch.no_grad():
        base = model(idx, memory)[0]
        for field, slot, matters in (('cmem', 3, True), ('mem', 0, True), ('cmem', 1, False)):
            changed = getattr(memory, field).clone()
            changed[:, :, slot] += torch.randn(changed[:, :, slot].shape, dtype=F64)   # not a shift: ln_1 drops it
            logits = model(idx, replace(memory, **{field: changed}))[0]
            assert differs(logits, base) == matters, (field, slot)


def test_causality_within_and_across_segments():
    model = make_model(mem_len=4, cmem_len=4)
    idx = tokens(2, 16, seed=8)
    with torch.no_grad():
        base, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), 4)
        for t in (1, 6, 13):
            changed = idx.clone()
            changed[:, t] = (changed[:, t] + 1) % V
            logits, _ = run_segments(model, changed, model.init_memory(2, 'cpu'), 4)
            assert torch.equal(logits[:, :t], base[:, :t]), t
            assert differs(logits[:, t:], base[:, t:]), t


def test_reset_memory_row_equals_fresh_stream():
    model = make_model()
    with torch.no_grad():
        _, memory = run_segments(model, tokens(2, 12, seed=9), model.init_memory(2, 'cpu'), 4)
        idx = tokens(2, 4, seed=10)
        reset = model(idx, model.reset_memory(memory, torch.tensor([True, False])))[0]
        assert torch.equal(reset[0], model(idx, model.init_memory(2, 'cpu'))[0][0])
        assert torch.equal(reset[1], model(idx, memory)[0][1])


# -----------------------------------------------------------------------------------------------------------
# 4. The reconstruction loss: present, trains f_c, leaves the LM's gradients alone


def two_segments_loss(model):
    idx = tokens(2, 9, seed=4)
    with torch.no_grad():
        _, _, memory, _ = model(idx[:, :4], model.init_memory(2, 'cpu'))
    _, loss, _, aux = model(idx[:, 4:8], memory, targets=idx[:, 5:9])
    return loss, aux


@pytest.mark.parametrize('recon_loss', ['attention', 'autoencoding'])
@pytest.mark.parametrize('mem_len', [0, 4])
def test_recon_loss_trains_only_f_c_and_leaves_lm_gradients_alone(recon_loss, mem_len):
    with_recon = make_model(recon_loss=recon_loss, recon_weight=0.7, mem_len=mem_len).train()
    without = make_model(recon_loss='none', mem_len=mem_len).train()
    without.load_state_dict(with_recon.state_dict(), strict=False)      # g exists only with autoencoding
    loss, aux = two_segments_loss(with_recon)
    lm_loss, lm_aux = two_segments_loss(without)
    assert torch.equal(aux['lm_loss'], lm_aux['lm_loss']) and 'recon_loss' not in lm_aux
    assert aux['recon_loss'] > 0
    assert_close(loss, aux['lm_loss'] + 0.7 * aux['recon_loss'], atol=1e-12, rtol=0)
    g_total, g_lm = grads(with_recon, loss), grads(without, lm_loss)
    trained = 0
    for name, _ in with_recon.named_parameters():
        if is_compression_param(name):
            assert g_lm.get(name) is None or not g_lm[name].any(), name        # no LM gradient reaches f_c
            assert g_total[name] is not None and g_total[name].abs().sum() > 0, name
            trained += 1
        else:
            assert torch.equal(g_total[name], g_lm[name]), name                # the same LM gradients
    assert trained == 2 * 2 * (2 if recon_loss == 'autoencoding' else 1)      # conv's and g's weight, bias, per layer


def test_recon_loss_none_trains_f_c_through_time_only():
    """recon_loss='none': in training the new compressed slots keep f_c's graph, so the next segment's LM loss (train.py
    --bptt_segments > 1) reaches f_c; its own segment's loss reaches it only through the weight-0 term; eval
    detaches."""
    model = make_model(recon_loss='none').train()
    idx = tokens(2, 9, seed=12)
    _, loss, memory, aux = model(idx[:, :4], model.init_memory(2, 'cpu'), targets=idx[:, 1:5])
    assert 'recon_loss' not in aux and memory.cmem.requires_grad
    f_c = [p for n, p in model.named_parameters() if is_compression_param(n)]
    assert not any(g.any() for g in torch.autograd.grad(loss, f_c, retain_graph=True))
    _, next_loss, _, _ = model(idx[:, 4:8], memory, targets=idx[:, 5:9])
    assert all(g.abs().sum() > 0 for g in torch.autograd.grad(next_loss, f_c))
    assert not model.eval()(idx[:, :4], model.init_memory(2, 'cpu'))[2].cmem.requires_grad   # with autograd on


def naive_content_attention(block, h, m):
    """Algorithm 2's attn(h, m) from scratch: softmax((ln h W_Q)(ln m W_K)ᵀ/√D)(ln m W_V) per head. -> (H, T, D)"""
    C, H = h.size(-1), block.attn.n_head
    D = C // H
    W, b = block.attn.c_attn.weight, block.attn.c_attn.bias
    h, m = block.ln_1(h), block.ln_1(m)
    q, k, v = [(x @ W[s].T + b[s]).view(-1, H, D).transpose(0, 1)
               for x, s in ((h, slice(0, C)), (m, slice(C, 2 * C)), (m, slice(2 * C, 3 * C)))]
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D), dim=-1) @ v


def test_attention_reconstruction_loss_equals_algorithm_2():
    """Σ_layers mean ‖attn(h, old_mem) − attn(h, f_c(old_mem))‖², h each layer's input, old_mem the segment (no
    FIFO)."""
    model = make_model(compression='mean_pool', recon_loss='attention').train()
    idx = tokens(2, 5, seed=11)
    hids = []
    hooks = [block.register_forward_pre_hook(lambda mod, args: hids.append(args[0])) for block in model.transformer.h]
    _, loss, memory, aux = model(idx[:, :4], model.init_memory(2, 'cpu'), targets=idx[:, 1:5])
    for hook in hooks:
        hook.remove()
    expected = 0.0
    for block, h in zip(model.transformer.h, hids):
        per_row = [(naive_content_attention(block, h[b], h[b])
                    - naive_content_attention(block, h[b], h[b].view(2, 2, -1).mean(1))).pow(2).mean()
                   for b in range(2)]
        expected = expected + sum(per_row) / 2
    assert_close(aux['recon_loss'], expected.detach().float(), atol=0, rtol=1e-5)   # the loss is taken in float32


def test_lr_multipliers_name_f_c_and_g():
    model = make_model(recon_loss='autoencoding', compress_lr_mult=5.0)
    multipliers = model.lr_multipliers()
    assert multipliers and set(multipliers) == {n for n, _ in model.named_parameters() if is_compression_param(n)}
    assert set(multipliers.values()) == {5.0}


# -----------------------------------------------------------------------------------------------------------
# 5. Training, generation, the contract


@pytest.mark.parametrize('mem_len', [0, 8])
def test_loss_goes_down_on_repeated_pattern(mem_len):
    model = make_model(dtype=torch.float32, n_embd=32, seg_len=8, n_positions=8, mem_len=mem_len, cmem_len=4).train()
    losses = train_on_repeated_pattern(model, 80, record='lm_loss')
    initial, final = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert final < 0.5 * initial, (initial, final)


def starting_memory(model, with_memory):
    """The memory generate() starts from (None: it makes an empty one) and the same for forward(): with_memory,
    after two segments of other tokens."""
    if not with_memory:
        return None, model.init_memory(2, 'cpu')
    seg = model.config.seg_len
    with torch.no_grad():
        _, memory = run_segments(model, tokens(2, 2 * seg, seed=8), model.init_memory(2, 'cpu'), seg)
    return memory, memory


@pytest.mark.parametrize('compression', COMPRESSIONS)
@pytest.mark.parametrize('seg_len, mem_len, cmem_len', [(4, 0, 4), (4, 4, 3), (2, 2, 4)])
@pytest.mark.parametrize('with_memory', [False, True])
def test_greedy_generate_matches_segmentwise_forward(compression, seg_len, mem_len, cmem_len, with_memory):
    """Across several segment boundaries (compression in the cache), from an empty or a used memory, with a prompt
    longer than a segment; the logits too, not only their argmax."""
    model = make_model(compression=compression, seg_len=seg_len, mem_len=mem_len, cmem_len=cmem_len)
    memory, start = starting_memory(model, with_memory)
    assert_greedy_generate_matches_forward(model, tokens(2, seg_len + 2, seed=3), 4 * seg_len, memory, start, seg_len,
                                           logits_atol=1e-10)


@pytest.mark.parametrize('alibi', [True, False])
def test_sampled_generate_matches_segmentwise_forward(alibi):
    model = make_model(seg_len=2, mem_len=2, cmem_len=3, alibi=alibi)
    memory, start = starting_memory(model, False)
    assert_sampled_generate_matches_forward(model, tokens(2, 3, seed=3), 12, memory, start, 2, sample_next)


def test_generate_rejects_empty_prompt():
    with pytest.raises(ValueError):
        make_model().generate(tokens(1, 0), 3)


@pytest.mark.parametrize('bad', [dict(seg_len=32, n_positions=16), dict(compression='most_used'),
                                 dict(recon_loss='mse'), dict(cmem_len=-1), dict(mem_len=3), dict(seg_len=5),
                                 dict(n_embd=18), dict(dropout=1.0), dict(compress_lr_mult=-1.0),
                                 dict(compression_rate=0)], ids=str)
def test_config_rejects_bad_values(bad):
    fields = dict(vocab_size=V, n_layer=1, n_head=4, n_embd=16, n_positions=16, seg_len=4, cmem_len=4)
    with pytest.raises(ValueError):
        Config(**{**fields, **bad})


def test_most_used_is_left_out_of_the_copied_compression():
    """model_compressive.py's most_used needs the attention weights, which the fused attention does not give: it is
    neither a compression here nor in Compression, which is a verbatim copy (tests/test_copies.py)."""
    import model_compressive
    import model_compressive_gpt2
    assert set(COMPRESSIONS) == set(model_compressive.COMPRESSIONS) - {'most_used'}
    assert 'most_used' not in inspect.getsource(model_compressive_gpt2.Compression)
    assert not hasattr(model_compressive_gpt2, 'most_used') and hasattr(model_compressive, 'most_used')


def test_config_defaults_are_gpt2_small_with_the_papers_memory():
    c = Config()
    assert (c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.n_positions, c.seg_len) == (50257, 12, 12, 768, 1024, 512)
    assert (c.cmem_len, c.mem_len, c.compression_rate, c.alibi) == (512, 0, 2, True)
    assert Model.gpt2_form


def test_forward_rejects_segment_longer_than_seg_len():
    model = make_model()
    with pytest.raises(ValueError):
        model(tokens(1, 5), model.init_memory(1, 'cpu'))


def test_bf16_autocast_forward_backward():
    model = make_model(dtype=torch.float32, dropout=0.1).train()
    assert_bf16_forward_backward(model, ('cmem', 'mem'))


@pytest.mark.parametrize('fields', [dict(), dict(mem_len=16), dict(recon_loss='none'), dict(recon_loss='autoencoding'),
                                    dict(cmem_len=0), dict(compression='dilated_conv', compression_rate=4),
                                    dict(compression='mean_pool')], ids=str)
def test_flops_per_token_matches_torch_flop_counter(fields):
    """One training step with a full memory, as tests/test_flops.py counts every other model's."""
    from test_flops import counted_per_token
    torch.manual_seed(0)
    size = dict(vocab_size=64, n_layer=2, n_head=2, n_embd=32, n_positions=16, seg_len=16, cmem_len=16, dropout=0.0)
    model = Model(Config(**{**size, **fields})).train()
    assert model.flops_per_token() == pytest.approx(counted_per_token(model), rel=1e-6)


# -----------------------------------------------------------------------------------------------------------
# 6. config/compressive_gpt2_pg19.py


def test_pg19_config_has_the_papers_and_authors_values():
    values = runpy.run_path(str(ROOT / 'config' / 'compressive_gpt2_pg19.py'))
    assert (values['model'], values['init_from'], values['dataset']) == ('compressive_gpt2', 'gpt2', 'pg19_2000')
    fields = {k: values[k] for k in Config.__dataclass_fields__ if k in values}
    c = Config(**fields)
    assert (c.seg_len, c.cmem_len, c.mem_len, c.compression_rate) == (512, 512, 0, 2)          # §4.2, config.json
    assert (values['batch_size'], values['learning_rate'], c.compress_lr_mult) == (1, 5e-5, 5.0)   # README, trainer
    assert values['learning_rate'] * c.compress_lr_mult == pytest.approx(2.5e-4)               # learning_rate_ltm
    assert (values['grad_clip'], values['weight_decay'], values['warmup_iters']) == (1.0, 0.0, 0)
    import train
    config = ROOT / 'config' / 'compressive_gpt2_pg19.py'
    cfg, module, model_cfg, given = train.parse_args([str(config)])
    assert module.Config is type(model_cfg) and model_cfg.cmem_len == 512 and cfg.init_from == 'gpt2'
    architecture = {'n_layer', 'n_head', 'n_embd', 'vocab_size', 'n_positions', 'layer_norm_epsilon'}   # config.json's
    assert not given & architecture
    from test_configs import FINETUNE_GPT2, followed_values    # config/gpt2_pg19.py's check: the authors' command
    values = followed_values(config)
    assert not {k: (values[k], v) for k, v in FINETUNE_GPT2.items() if values[k] != pytest.approx(v)}


# -----------------------------------------------------------------------------------------------------------
# 7. End to end from a GPT-2 checkpoint in the hub format (pretrained.py, --init_from=gpt2:DIR)


@pytest.fixture(scope='module')
def bpe_data_dir(tmp_path_factory):
    return write_gpt2_dataset(tmp_path_factory.mktemp('data'))


def test_loaded_through_pretrained_py_an_empty_memory_gives_transformers_logits(hub_dir):
    """--init_from=gpt2:DIR's loader (pretrained.py) fills the GPT-2 part and leaves f_c at init: the first segment of a
    fresh stream is transformers' GPT-2 within 1e-5; the next, reading the compressed memory, is not."""
    import pretrained
    import model_compressive_gpt2 as module
    directory, hf = hub_dir
    cfg = Config(seg_len=16, dropout=0.0, cmem_len=8)
    cfg, model, note, _ = pretrained.init_from_gpt2(f'gpt2:{directory}', 'compressive_gpt2', module, cfg,
                                                 {'seg_len', 'dropout', 'cmem_len'})
    assert (cfg.n_layer, cfg.n_embd, cfg.n_positions) == (2, 32, 64) and 'compress' in note
    model.eval()
    idx = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = run_segments(model, idx, model.init_memory(2, 'cpu'), 16)
        assert_close(ours[:, :16], hf(idx[:, :16]).logits, atol=1e-5, rtol=0)
        assert differs(ours[:, 16:], hf(idx[:, 16:]).logits, atol=1e-3)


def test_train_from_gpt2_resumes_exactly_then_evaluates_and_samples(hub_dir, bpe_data_dir, tmp_path):
    """From gpt2:DIR: 6 steps straight == 3 steps and a resume to 6 (weights, optimizer, memory, logs bit-identical,
    dropout on, the reconstruction loss logged); then --eval_only and sample.py on the run."""
    logged = train_resume_evaluate_sample(bpe_data_dir, tmp_path, hub_dir[0],
                                          dict(model='compressive_gpt2', seg_len=16, cmem_len=16), max_new_tokens=20)
    assert all(r['train/recon_loss'] > 0 for r in logged if 'train/loss' in r)
