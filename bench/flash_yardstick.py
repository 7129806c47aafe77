"""
The yardsticks of bench/attn_kernels.py --aot: a plain causal flash-attention forward in Triton and its ∂k, ∂v kernel
(no positional term, no caller's mask), tiled as rel_attention_triton.py's forward and keys kernel are, so that
ptxas's registers, spills and shared memory for them say what the relative attention's extra work costs. They are
compiled, never run: not product code.
"""

import triton
import triton.language as tl


@triton.jit
def flash_forward_kernel(Q, K_ptr, V_ptr, OUT, LSE, T, K, D, scale,
                         BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """out = softmax(scale q kᵀ) v and its log-sum-exp for one tile of BQ queries, causal with K - T memory keys."""
    i0, bh = tl.program_id(0) * BQ, tl.program_id(1)
    offs_i, offs_d = i0 + tl.arange(0, BQ), tl.arange(0, BD)
    q = tl.load(Q + (bh * T + offs_i[:, None]) * D + offs_d[None, :], mask=offs_i[:, None] < T, other=0.0)
    m_i = tl.full([BQ], float('-inf'), tl.float32)
    l_i = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, BD], tl.float32)
    for j0 in range(0, tl.minimum(K, K - T + i0 + BQ), BK):
        offs_j = j0 + tl.arange(0, BK)
        k = tl.load(K_ptr + (bh * K + offs_j[:, None]) * D + offs_d[None, :], mask=offs_j[:, None] < K, other=0.0)
        v = tl.load(V_ptr + (bh * K + offs_j[:, None]) * D + offs_d[None, :], mask=offs_j[:, None] < K, other=0.0)
        score = tl.dot(q, tl.trans(k)) * scale                              # (BQ, BK)
        allowed = (K - T + offs_i[:, None] - offs_j[None, :] >= 0) & (offs_j[None, :] < K)
        score = tl.where(allowed, score, float('-inf'))
        m_new = tl.maximum(m_i, tl.max(score, 1))
        p = tl.exp(score - m_new[:, None])
        rescale = tl.exp(m_i - m_new)
        l_i = l_i * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(OUT + (bh * T + offs_i[:, None]) * D + offs_d[None, :], (acc / l_i[:, None]).to(OUT.dtype.element_ty),
             mask=offs_i[:, None] < T)
    tl.store(LSE + bh * T + offs_i, m_i + tl.log(l_i), mask=offs_i < T)


@triton.jit
def flash_backward_keys_kernel(Q, K_ptr, V_ptr, DO, LSE, DELTA, DK, DV, T, K, D, scale,
                               BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """∂k = Gᵀ q and ∂v = Pᵀ dO for one tile of BK keys, over the tiles of BQ queries that see it
    (G = scale P ∘ (dP - δ), dP = dO vᵀ), causal with K - T memory keys: tiled as rel_attention_triton.py's keys
    kernel is."""
    j0, bh = tl.program_id(0) * BK, tl.program_id(1)
    offs_j, offs_d = j0 + tl.arange(0, BK), tl.arange(0, BD)
    k = tl.load(K_ptr + (bh * K + offs_j[:, None]) * D + offs_d[None, :], mask=offs_j[:, None] < K, other=0.0)
    v = tl.load(V_ptr + (bh * K + offs_j[:, None]) * D + offs_d[None, :], mask=offs_j[:, None] < K, other=0.0)
    dk = tl.zeros([BK, BD], tl.float32)
    dv = tl.zeros([BK, BD], tl.float32)
    for i0 in range(tl.maximum(j0 - (K - T), 0) // BQ * BQ, T, BQ):
        offs_i = i0 + tl.arange(0, BQ)
        q = tl.load(Q + (bh * T + offs_i[:, None]) * D + offs_d[None, :], mask=offs_i[:, None] < T, other=0.0)
        do = tl.load(DO + (bh * T + offs_i[:, None]) * D + offs_d[None, :], mask=offs_i[:, None] < T, other=0.0)
        lse = tl.load(LSE + bh * T + offs_i, mask=offs_i < T, other=0.0)
        delta = tl.load(DELTA + bh * T + offs_i, mask=offs_i < T, other=0.0)
        allowed = (K - T + offs_i[:, None] - offs_j[None, :] >= 0) & (offs_j[None, :] < K)
        p = tl.where(allowed, tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None]), 0.0)    # (BQ, BK)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        g = p * (tl.dot(do, tl.trans(v)) - delta[:, None]) * scale
        dk += tl.dot(tl.trans(g.to(q.dtype)), q)
    rows = (bh * K + offs_j[:, None]) * D + offs_d[None, :]
    tl.store(DK + rows, dk.to(DK.dtype.element_ty), mask=offs_j[:, None] < K)
    tl.store(DV + rows, dv.to(DV.dtype.element_ty), mask=offs_j[:, None] < K)
