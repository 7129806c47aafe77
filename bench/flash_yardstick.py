"""
The yardstick of bench/attn_kernels.py --aot: a plain causal flash-attention forward in Triton (no positional term,
no caller's mask), tiled as rel_attention_triton.py's forward is, so that ptxas's registers, spills and shared memory
for it say what the relative attention's extra work costs. It is compiled, never run: not product code.
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
