"""
Transformer-XL relative attention (Dai et al., 2019, §3.3) as Triton kernels in the style of flash attention: the
scores are never written to memory, and neither is the positional term. The model files' einsum path is the reference
(tests/test_rel_attention_triton.py checks forward and backward against it); this file is what `attn_kernel='triton'`
runs in model_xl.py, model_lamemo.py (the segment's attention), model_compressive.py and model_infformer.py (the STM).

The score of query i and key j (§3.3), with u = r_w_bias, v = r_r_bias and d = 1/sqrt(d_head):
    A^rel_{i,j} = (q_i + u)·k_j  (a)+(c)  +  (q_i + v)·W_{k,R} R_{i-j}  (b)+(d),      out_i = Σ_j softmax_j(d A^rel_i) v_j
Query i of the T sits at position K - T + i of the K = M + T keys; the distance to key j is K - T + i - j. The einsum
path scores (q_i + v) against every distance, (T, K), and rel-shifts it into place (model_xl.py's rel_shift); SDPA then
reads that as a (B, H, T, K) float bias, and its backward writes one.

Here one program owns a tile of BQ queries and walks over tiles of BK keys with the online softmax of flash attention.
r_k = W_{k,R} R (H, K, D) holds row c for distance K-1-c (the order project_positions gives), so query i and key j
need row c = j - i + T - 1. For queries i0..i0+BQ-1 and keys j0..j0+BK-1 these rows form one band,
    c = c0 + t,  c0 = j0 - i0 - BQ + T,  t = (j - j0) - (i - i0) + BQ - 1 in [0, BQ + BK - 2],
so the tile's (b)+(d) is ONE (BQ, D) x (D, BQ + BK - 1) product of (q + v) with the band, then a skew: entry (a, b)
of the tile is entry (a, b - a + BQ - 1) of the product (tl.gather). (a)+(c) is the usual (q + u) k^T. Rows of the band
outside 0..K-1 are distances outside 0..K-1: read as zeros and masked. clamp_len needs nothing here: R's rows are
already clamped when the model builds them.

The mask is the caller's own boolean (B, 1, T, K) (causal with memory, key_valid, same_length), read tile by tile
(a byte per score, against the two bytes of a bf16 bias per head). Keys in a query's future are masked whatever it
says (their band rows are the rel-shift's garbage), and key tiles wholly in the future of a query tile are skipped.

Backward (G = d · P ∘ (dP - δ), δ_i = Σ_j P_ij dP_ij - ∂L/∂lse_i, dP = dO vᵀ, as flash attention's):
    ∂(q+u) = G k,  ∂k = Gᵀ (q+u),  ∂v = Pᵀ dO,
    ∂(q+v)_i = Σ_j G_ij r_k[c(i,j)]:  the tile's G un-skewed into band space (G_band[a, t] = G[a, t + a - BQ + 1]),
                                       then one (BQ, BQ+BK-1) x (BQ+BK-1, D) product,
    ∂r_k[c] = Σ_b Σ_{i,j: c(i,j)=c} G_ij (q+v)_i:  G_bandᵀ (q+v) per tile, added into a float32 (H, K, D) with atomics
                                       (every batch row and every tile on the same diagonal adds to the same rows).
The model passes q + u and q + v as two inputs, so autograd sums their gradients into q, u (r_w_bias) and v (r_r_bias).
Two backward kernels: one per key tile (∂k, ∂v in registers), one per query tile (∂(q+u), ∂(q+v), and the atomics of
∂r_k), each recomputing the probabilities from the stored log-sum-exp.

Inputs bf16 (or float32); products accumulate in float32, the log-sum-exp is float32. Attention dropout (dropatt) is
not implemented: the models refuse attn_kernel='triton' with dropatt > 0. On the CPU the kernels run under Triton's
interpreter (TRITON_INTERPRET=1 before triton is imported), which is how the tests check them without a GPU.
"""

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get('TRITON_INTERPRET') == '1'   # read as triton.jit reads it, when this file is imported


@triton.jit
def _tile_scores(qu, qv, K_ptr, R_ptr, MASK_ptr, i0, j0, offs_d, k_base, r_base, mask_base,
                 stride_kk, stride_rk, stride_mt, T, K, D, scale,
                 BQ: tl.constexpr, BK: tl.constexpr, NB: tl.constexpr, PRECISION: tl.constexpr):
    """d·A^rel of the queries i0..i0+BQ-1 against keys j0..j0+BK-1, masked to -inf: -> scores (BQ, BK), allowed,
    the key tile k (BK, BD) and the band of r_k (NB, BD) with its rows offs_c (NB,)."""
    offs_i = i0 + tl.arange(0, BQ)
    offs_j = j0 + tl.arange(0, BK)
    d_ok = offs_d[None, :] < D
    k = tl.load(K_ptr + k_base + offs_j[:, None] * stride_kk + offs_d[None, :],
                mask=(offs_j[:, None] < K) & d_ok, other=0.0)            # (BK, BD)
    score = tl.dot(qu, tl.trans(k), input_precision=PRECISION)        # (a) + (c): (q_i + u)·k_j
    offs_c = j0 - i0 - BQ + T + tl.arange(0, NB)               # the band's rows of r_k, c0 + t
    band = tl.load(R_ptr + r_base + offs_c[:, None] * stride_rk + offs_d[None, :],
                   mask=(offs_c[:, None] >= 0) & (offs_c[:, None] < K) & d_ok, other=0.0)   # (NB, BD)
    by_distance = tl.dot(qv, tl.trans(band), input_precision=PRECISION)   # (BQ, NB): (q_i + v)·W_{k,R} R_c
    skew = tl.arange(0, BK)[None, :] - tl.arange(0, BQ)[:, None] + BQ - 1      # (BQ, BK): t of entry (a, b)
    score = (score + tl.gather(by_distance, skew, 1)) * scale        # (b) + (d) moved into place
    allowed = ((K - T + offs_i[:, None] - offs_j[None, :]) >= 0) & (offs_i[:, None] < T) & (offs_j[None, :] < K)
    allowed = allowed & (tl.load(MASK_ptr + mask_base + offs_i[:, None] * stride_mt + offs_j[None, :],
                                 mask=allowed, other=0) != 0)           # the caller's mask
    return tl.where(allowed, score, float('-inf')), allowed, k, band, offs_c


@triton.jit
def _forward_kernel(QU, QV, K_ptr, V_ptr, R_ptr, MASK_ptr, OUT, LSE,
                    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kk, stride_rh, stride_rk,
                    stride_mb, stride_mh, stride_mt, stride_ob, stride_oh, stride_ot,
                    H, T, K, D, scale,
                    BQ: tl.constexpr, BK: tl.constexpr, NB: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr):
    i0, bh = tl.program_id(0) * BQ, tl.program_id(1)
    b, h = bh // H, bh % H
    offs_i, offs_d = i0 + tl.arange(0, BQ), tl.arange(0, BD)
    q_off = b * stride_qb + h * stride_qh + offs_i[:, None] * stride_qt + offs_d[None, :]
    q_ok = (offs_i[:, None] < T) & (offs_d[None, :] < D)
    qu = tl.load(QU + q_off, mask=q_ok, other=0.0)                    # (BQ, BD) q + u
    qv = tl.load(QV + q_off, mask=q_ok, other=0.0)                    # (BQ, BD) q + v
    k_base, r_base = b * stride_kb + h * stride_kh, h * stride_rh
    mask_base = b * stride_mb + h * stride_mh

    m_i = tl.full([BQ], float('-inf'), tl.float32)                     # running max of each row
    l_i = tl.zeros([BQ], tl.float32)                                   # running Σ exp
    acc = tl.zeros([BQ, BD], tl.float32)
    hi = tl.minimum(K, K - T + i0 + BQ)                                # keys past hi are in every query's future
    for j0 in range(0, hi, BK):
        score, allowed, k, band, offs_c = _tile_scores(
            qu, qv, K_ptr, R_ptr, MASK_ptr, i0, j0, offs_d, k_base, r_base, mask_base,
            stride_kk, stride_rk, stride_mt, T, K, D, scale, BQ, BK, NB, PRECISION)
        offs_j = j0 + tl.arange(0, BK)
        v = tl.load(V_ptr + k_base + offs_j[:, None] * stride_kk + offs_d[None, :],
                    mask=(offs_j[:, None] < K) & (offs_d[None, :] < D), other=0.0)
        m_new = tl.maximum(m_i, tl.max(score, 1))
        m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)         # a row with nothing allowed yet
        p = tl.exp(score - m_safe[:, None])                            # (BQ, BK), 0 where masked
        rescale = tl.exp(m_i - m_safe)
        l_i = l_i * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    empty = l_i == 0.0                                                 # a query that may see no key: out 0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_off = b * stride_ob + h * stride_oh + offs_i[:, None] * stride_ot + offs_d[None, :]
    tl.store(OUT + o_off, out.to(OUT.dtype.element_ty), mask=q_ok)
    lse = tl.where(empty, float('-inf'), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + bh * T + offs_i, lse, mask=offs_i < T)


@triton.jit
def _backward_keys_kernel(QU, QV, K_ptr, V_ptr, R_ptr, MASK_ptr, DO, LSE, DELTA, DK, DV,
                          stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kk, stride_rh, stride_rk,
                          stride_mb, stride_mh, stride_mt,
                          H, T, K, D, scale,
                          BQ: tl.constexpr, BK: tl.constexpr, NB: tl.constexpr, BD: tl.constexpr,
                          PRECISION: tl.constexpr):
    """∂k = Gᵀ (q + u), ∂v = Pᵀ dO for one tile of keys, over the query tiles that can see it."""
    j0, bh = tl.program_id(0) * BK, tl.program_id(1)
    b, h = bh // H, bh % H
    offs_j, offs_d = j0 + tl.arange(0, BK), tl.arange(0, BD)
    k_base, r_base = b * stride_kb + h * stride_kh, h * stride_rh
    mask_base = b * stride_mb + h * stride_mh
    kv_off = k_base + offs_j[:, None] * stride_kk + offs_d[None, :]
    kv_ok = (offs_j[:, None] < K) & (offs_d[None, :] < D)
    v = tl.load(V_ptr + kv_off, mask=kv_ok, other=0.0)
    dk = tl.zeros([BK, BD], tl.float32)
    dv = tl.zeros([BK, BD], tl.float32)
    first = tl.maximum(j0 - (K - T), 0) // BQ * BQ                   # earlier queries see none of these keys
    for i0 in range(first, T, BQ):
        offs_i = i0 + tl.arange(0, BQ)
        q_off = b * stride_qb + h * stride_qh + offs_i[:, None] * stride_qt + offs_d[None, :]
        q_ok = (offs_i[:, None] < T) & (offs_d[None, :] < D)
        qu = tl.load(QU + q_off, mask=q_ok, other=0.0)
        qv = tl.load(QV + q_off, mask=q_ok, other=0.0)
        do = tl.load(DO + q_off, mask=q_ok, other=0.0)
        lse = tl.load(LSE + bh * T + offs_i, mask=offs_i < T, other=0.0)
        lse = tl.where(lse == float('-inf'), 0.0, lse)               # a query that sees no key: its p is 0 anyway
        delta = tl.load(DELTA + bh * T + offs_i, mask=offs_i < T, other=0.0)
        score, allowed, k, band, offs_c = _tile_scores(
            qu, qv, K_ptr, R_ptr, MASK_ptr, i0, j0, offs_d, k_base, r_base, mask_base,
            stride_kk, stride_rk, stride_mt, T, K, D, scale, BQ, BK, NB, PRECISION)
        p = tl.where(allowed, tl.exp(score - lse[:, None]), 0.0)      # (BQ, BK) the probabilities
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)       # (BQ, BK)
        g = p * (dp - delta[:, None]) * scale                         # ∂L/∂A^rel
        dk += tl.dot(tl.trans(g.to(qu.dtype)), qu, input_precision=PRECISION)
    tl.store(DK + kv_off, dk.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def _backward_queries_kernel(QU, QV, K_ptr, V_ptr, R_ptr, MASK_ptr, DO, LSE, DELTA, DQU, DQV, DR,
                             stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kk, stride_rh, stride_rk,
                             stride_mb, stride_mh, stride_mt, stride_drh, stride_drk,
                             H, T, K, D, scale,
                             BQ: tl.constexpr, BK: tl.constexpr, NB: tl.constexpr, BD: tl.constexpr,
                             PRECISION: tl.constexpr):
    """∂(q + u) = G k and ∂(q + v) = G_band r_band for one tile of queries; ∂r_k += G_bandᵀ (q + v) with atomics."""
    i0, bh = tl.program_id(0) * BQ, tl.program_id(1)
    b, h = bh // H, bh % H
    offs_i, offs_d = i0 + tl.arange(0, BQ), tl.arange(0, BD)
    q_off = b * stride_qb + h * stride_qh + offs_i[:, None] * stride_qt + offs_d[None, :]
    q_ok = (offs_i[:, None] < T) & (offs_d[None, :] < D)
    qu = tl.load(QU + q_off, mask=q_ok, other=0.0)
    qv = tl.load(QV + q_off, mask=q_ok, other=0.0)
    do = tl.load(DO + q_off, mask=q_ok, other=0.0)
    lse = tl.load(LSE + bh * T + offs_i, mask=offs_i < T, other=0.0)
    lse = tl.where(lse == float('-inf'), 0.0, lse)
    delta = tl.load(DELTA + bh * T + offs_i, mask=offs_i < T, other=0.0)
    k_base, r_base = b * stride_kb + h * stride_kh, h * stride_rh
    mask_base = b * stride_mb + h * stride_mh
    dqu = tl.zeros([BQ, BD], tl.float32)
    dqv = tl.zeros([BQ, BD], tl.float32)
    unskew = tl.arange(0, NB)[None, :] + tl.arange(0, BQ)[:, None] - BQ + 1   # (BQ, NB): the key b of band entry t
    in_tile = (unskew >= 0) & (unskew < BK)
    unskew = tl.minimum(tl.maximum(unskew, 0), BK - 1)
    hi = tl.minimum(K, K - T + i0 + BQ)
    for j0 in range(0, hi, BK):
        score, allowed, k, band, offs_c = _tile_scores(
            qu, qv, K_ptr, R_ptr, MASK_ptr, i0, j0, offs_d, k_base, r_base, mask_base,
            stride_kk, stride_rk, stride_mt, T, K, D, scale, BQ, BK, NB, PRECISION)
        offs_j = j0 + tl.arange(0, BK)
        v = tl.load(V_ptr + k_base + offs_j[:, None] * stride_kk + offs_d[None, :],
                    mask=(offs_j[:, None] < K) & (offs_d[None, :] < D), other=0.0)
        p = tl.where(allowed, tl.exp(score - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        g = p * (dp - delta[:, None]) * scale                         # (BQ, BK) ∂L/∂A^rel
        dqu += tl.dot(g.to(k.dtype), k, input_precision=PRECISION)
        g_band = tl.where(in_tile, tl.gather(g, unskew, 1), 0.0)      # (BQ, NB) the skew undone
        dqv += tl.dot(g_band.to(band.dtype), band, input_precision=PRECISION)
        d_band = tl.dot(tl.trans(g_band.to(qv.dtype)), qv, input_precision=PRECISION)   # (NB, BD)
        tl.atomic_add(DR + h * stride_drh + offs_c[:, None] * stride_drk + offs_d[None, :], d_band,
                      mask=(offs_c[:, None] >= 0) & (offs_c[:, None] < K) & (offs_d[None, :] < D))
    tl.store(DQU + q_off, dqu.to(DQU.dtype.element_ty), mask=q_ok)
    tl.store(DQV + q_off, dqv.to(DQV.dtype.element_ty), mask=q_ok)


def _launch_shape(q_u, k, block_q, block_k):
    B, H, T, D = q_u.shape
    K = k.size(2)
    return B, H, T, K, D, triton.next_power_of_2(block_q + block_k - 1), max(16, triton.next_power_of_2(D))


def _precision(dtype):
    return 'ieee' if dtype == torch.float32 else 'tf32'   # float32 inputs: exact products, as the reference


class RelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_u, q_v, k, v, r_k, mask, scale, block_q, block_k):
        B, H, T, K, D, NB, BD = _launch_shape(q_u, k, block_q, block_k)
        out = torch.empty_like(q_u)
        lse = torch.empty(B, H, T, device=q_u.device, dtype=torch.float32)
        grid = (triton.cdiv(T, block_q), B * H)
        _forward_kernel[grid](q_u, q_v, k, v, r_k, mask, out, lse,
                              *q_u.stride()[:3], *k.stride()[:3], *r_k.stride()[:2], *mask.stride()[:3],
                              *out.stride()[:3], H, T, K, D, scale,
                              BQ=block_q, BK=block_k, NB=NB, BD=BD, PRECISION=_precision(q_u.dtype))
        ctx.save_for_backward(q_u, q_v, k, v, r_k, mask, out, lse)
        ctx.scale, ctx.block_q, ctx.block_k = scale, block_q, block_k
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q_u, q_v, k, v, r_k, mask, out, lse = ctx.saved_tensors
        B, H, T, K, D, NB, BD = _launch_shape(q_u, k, ctx.block_q, ctx.block_k)
        d_out = d_out.contiguous()
        delta = (d_out.float() * out.float()).sum(-1)                # (B, H, T) δ_i = Σ_j P_ij dP_ij
        if d_lse is not None:
            delta = delta - d_lse                                     # ∂lse_i/∂A_ij = P_ij
        delta = delta.contiguous()
        common = dict(BQ=ctx.block_q, BK=ctx.block_k, NB=NB, BD=BD, PRECISION=_precision(q_u.dtype))
        strides = (*q_u.stride()[:3], *k.stride()[:3], *r_k.stride()[:2], *mask.stride()[:3])
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        _backward_keys_kernel[(triton.cdiv(K, ctx.block_k), B * H)](
            q_u, q_v, k, v, r_k, mask, d_out, lse, delta, dk, dv, *strides, H, T, K, D, ctx.scale, **common)
        dq_u, dq_v = torch.empty_like(q_u), torch.empty_like(q_v)
        d_r = torch.zeros(r_k.shape, device=r_k.device, dtype=torch.float32)   # atomics add in float32
        _backward_queries_kernel[(triton.cdiv(T, ctx.block_q), B * H)](
            q_u, q_v, k, v, r_k, mask, d_out, lse, delta, dq_u, dq_v, d_r, *strides, *d_r.stride()[:2],
            H, T, K, D, ctx.scale, **common)
        return dq_u, dq_v, dk, dv, d_r.to(r_k.dtype), None, None, None, None


def rel_attention(q_u, q_v, k, v, r_k, attn_mask, scale, block_q=64, block_k=64):
    """softmax(scale · ((q+u) kᵀ + rel_shift((q+v) r_kᵀ)), masked) v and its log-sum-exp, in one kernel.
    q_u = q + u, q_v = q + v: (B, H, T, D); k, v: (B, H, K, D), the last T keys being the queries' own positions;
    r_k: (H, K, D) W_{k,R} R for the distances K-1, ..., 0; attn_mask: (B, 1, T, K) bool, True where allowed (keys in
    a query's future are masked whatever it says). Everything is cast to v's dtype.
    -> out (B, H, T, D) in v's dtype, lse (B, H, T) float32 (-inf for a query that may see no key; its out is 0)."""
    if q_u.device.type != 'cuda' and not INTERPRETED:
        raise ValueError(f"attn_kernel='triton' runs on CUDA tensors (on the CPU only under TRITON_INTERPRET=1), "
                         f"not on {q_u.device}")
    if INTERPRETED and v.dtype != torch.float32:
        raise ValueError(f"Triton's interpreter (the CPU) has no {v.dtype} arithmetic: attn_kernel='triton' on the CPU "
                         f"runs in float32 only")
    B, H, T, D = q_u.shape
    K = k.size(2)
    if r_k.shape != (H, K, D) or attn_mask.shape[-2:] != (T, K):
        raise ValueError(f"rel_attention: r_k {tuple(r_k.shape)} and attn_mask {tuple(attn_mask.shape)} do not fit "
                         f"{K} keys, {T} queries, {H} heads of {D}")
    # one layout for the kernels' shared strides: q_u, q_v, the output and its gradient; k and v; r_k and its gradient
    q_u, q_v, k, v, r_k = (x.to(v.dtype).contiguous() for x in (q_u, q_v, k, v, r_k))
    mask = attn_mask if attn_mask.stride(-1) == 1 else attn_mask.contiguous()
    mask = mask.expand(B, H, T, K)                                    # stride 0 over the heads: read, not copied
    return RelAttention.apply(q_u, q_v, k, v, r_k, mask, scale, block_q, block_k)
