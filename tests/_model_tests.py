"""Helpers shared by the tests of the model files (tests/test_xl.py, test_lamemo.py, test_compressive.py,
test_infini.py, test_infformer.py): token batches, segment-by-segment forwards carrying the memory, float
comparisons, the sinusoid R written on its own, and the training loop of the loss-goes-down tests."""
import contextlib
import math
import sys

import torch

V = 97   # vocab size of every test model
F64 = torch.float64


def tokens(batch_size, length, seed=1):
    """Random token ids (batch_size, length) in [0, V), the same for the same seed."""
    return torch.randint(0, V, (batch_size, length), generator=torch.Generator().manual_seed(seed))


def run_segments(model, idx, memory, lengths):
    """Feed idx (B, T) in consecutive pieces of the given lengths (an int: all equal), carrying the memory.
    Returns the logits of all T positions (B, T, V) and the final memory."""
    if isinstance(lengths, int):
        lengths = [lengths] * math.ceil(idx.size(1) / lengths)
    logits, start = [], 0
    for n in lengths:
        piece_logits, _, memory, _ = model(idx[:, start:start + n], memory)
        logits.append(piece_logits)
        start += n
    return torch.cat(logits, dim=1), memory


def assert_close(a, b, atol=1e-6, rtol=1e-5):
    """torch.testing.assert_close with the tolerances of these tests (~1e-6: the float32 softmax of the manual path)."""
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


def differs(a, b, atol=1e-4):
    """Whether a and b differ by more than atol somewhere (no relative tolerance)."""
    return not torch.allclose(a, b, atol=atol, rtol=0)


def sinusoid(distance, n_embd):
    """R_distance, computed on its own: [sin(d f_k) ; cos(d f_k)], f_k = 10000^(-2k/n_embd), in float64."""
    freqs = [10000.0 ** (-2.0 * k / n_embd) for k in range(n_embd // 2)]
    return torch.tensor([math.sin(distance * f) for f in freqs] + [math.cos(distance * f) for f in freqs],
                        dtype=F64)


def train_on_repeated_pattern(model, steps, batch_size=4, period=13, record='loss', check_lm_loss=False,
                              detach_memory=False):
    """AdamW (lr 3e-3) on B contiguous streams of one random period-`period` pattern, one model.config.seg_len
    segment a step, carrying the memory; returns the per-step losses.
    record: 'loss' (what is trained on) or 'lm_loss' (aux['lm_loss'], without auxiliary losses);
    check_lm_loss: assert at every step that aux['lm_loss'] equals the loss;
    detach_memory: detach every tensor of the memory after each step (a model whose memory keeps its graph)."""
    if record not in ('loss', 'lm_loss'):
        raise ValueError(f"record must be 'loss' or 'lm_loss', not {record!r}")
    seg, B = model.config.seg_len, batch_size
    torch.manual_seed(0)
    pattern = torch.randint(0, V, (period,))
    stream = pattern.repeat(steps * seg // period + 3)
    data = torch.stack([stream[b * 3:b * 3 + steps * seg + 1] for b in range(B)])   # B contiguous streams
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    memory = model.init_memory(B, 'cpu')
    losses = []
    for step in range(steps):
        x = data[:, step * seg:(step + 1) * seg]
        y = data[:, step * seg + 1:(step + 1) * seg + 1]
        _, loss, memory, aux = model(x, memory, targets=y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if detach_memory:
            memory = type(memory)(**{k: v.detach() for k, v in vars(memory).items()})
        losses.append((loss if record == 'loss' else aux['lm_loss']).item())
        if check_lm_loss:
            assert torch.equal(aux['lm_loss'], loss.detach())
    return losses


@contextlib.contextmanager
def recording_sample_next(model, logits_seen):
    """Within it, the logits model.generate() picks each token from (its model file's sample_next gets them) are
    appended to logits_seen."""
    module = sys.modules[type(model).__module__]
    sample_next = module.sample_next

    def recording(logits, *args):
        logits_seen.append(logits)
        return sample_next(logits, *args)

    module.sample_next = recording
    try:
        yield
    finally:
        module.sample_next = sample_next


def assert_greedy_generate_matches_forward(model, prompt, n_new, memory, start, seg, rng_seed=None, logits_atol=None):
    """generate(temperature=0) streams every new token to its callback and picks the argmax of forward()'s logits
    over the whole sequence, read segment by segment from the memory `start`. rng_seed: reseed before both, for a
    model whose memory update draws random numbers (the ∞-former's sticky memories). logits_atol: also compare the
    logits generate() picked from (those its model file's sample_next got) with forward()'s, to that tolerance."""
    B, P = prompt.shape
    streamed, picked_from = [], []
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    with contextlib.nullcontext() if logits_atol is None else recording_sample_next(model, picked_from):
        out = model.generate(prompt, n_new, temperature=0.0, memory=memory, callback=streamed.append)
    assert out.shape == (B, P + n_new) and torch.equal(out[:, :P], prompt)
    assert len(streamed) == n_new and all(t.shape == (B, 1) for t in streamed)
    assert torch.equal(torch.cat(streamed, dim=1), out[:, P:])               # the callback got every token
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    with torch.no_grad():
        logits, _ = run_segments(model, out, start, seg)
    assert torch.equal(logits[:, P - 1:-1].argmax(-1), out[:, P:])
    if logits_atol is not None:
        assert_close(torch.stack(picked_from, dim=1), logits[:, P - 1:-1], atol=logits_atol, rtol=0)
    return out


def assert_sampled_generate_matches_forward(model, prompt, n_new, memory, start, seg, sample_next):
    """Greedy continuations of a random model tend to loop on one or two tokens; sampling gives a varied one.
    Replaying the same RNG with sample_next(logits, 1.0) on forward()'s logits (the whole sequence so far, segment
    by segment) must pick the same tokens, which checks generate's cached logits at every step."""
    P = prompt.size(1)
    torch.manual_seed(42)
    out = model.generate(prompt, n_new, temperature=1.0, memory=memory)
    assert len(set(out[:, P:].flatten().tolist())) > 4
    torch.manual_seed(42)
    with torch.no_grad():
        for k in range(n_new):
            logits, _ = run_segments(model, out[:, :P + k], start, seg)
            assert torch.equal(sample_next(logits[:, -1], 1.0)[:, 0], out[:, P + k]), k
    return out


def assert_bf16_forward_backward(model, float32_fields, seg_len=4, all_grads=True):
    """Three segments under CPU bf16 autocast with the loss: autocast is really on (bf16 logits), the named memory
    fields stay float32, the summed loss is finite, and backward gives finite gradients to float32 weights (every
    weight with all_grads; otherwise those that get one)."""
    idx = tokens(2, 3 * seg_len + 1)
    memory = model.init_memory(2, 'cpu')
    total = 0
    with torch.autocast('cpu', dtype=torch.bfloat16):
        for start in range(0, 3 * seg_len, seg_len):
            logits, loss, memory, _ = model(idx[:, start:start + seg_len], memory,
                                            targets=idx[:, start + 1:start + seg_len + 1])
            assert logits.dtype == torch.bfloat16                                   # autocast is really on
            for name in float32_fields:
                assert getattr(memory, name).dtype == torch.float32, name
            total = total + loss
    assert torch.isfinite(total)
    total.backward()
    grads = [(n, p) for n, p in model.named_parameters() if all_grads or p.grad is not None]
    assert grads
    for name, p in grads:
        assert p.dtype == torch.float32 and p.grad is not None and torch.isfinite(p.grad).all(), name


def flop_counter():
    """torch.utils.flop_counter.FlopCounterMode that also counts the CPU build's fused attention kernel
    (F.scaled_dot_product_attention on CPU), which it does not know: q·k and p·v forward, twice that backward."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def forward(query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return 2 * sdpa_flop_count(query, key, value)          # dV, dP, dQ, dK

    aten = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward})
