"""
Transformer-XL relative attention (Dai et al., 2019, §3.3) as Triton kernels in the style of flash attention: the
scores are never written to memory, and neither is the positional term. The model files' einsum path is the reference
(tests/test_rel_attention_triton.py checks forward and backward against it); this file is what `attn_kernel='triton'`
runs in model_xl.py, model_lamemo.py (the segment's attention), model_compressive.py and model_infformer.py (the STM).

The score of query i and key j (§3.3), with u = r_w_bias, v = r_r_bias and d = 1/sqrt(d_head):
    A^rel_{i,j} = (q_i + u)·k_j  (a)+(c)  +  (q_i + v)·W_{k,R} R_{i-j}  (b)+(d),    out_i = Σ_j softmax_j(d A^rel_i) v_j
Query i of the T sits at position K - T + i of the K = M + T keys; the distance to key j is K - T + i - j. The einsum
path scores (q_i + v) against every distance, (T, K), and rel-shifts it into place (model_xl.py's rel_shift); SDPA then
reads that as a (B, H, T, K) float bias, and its backward writes one.

Here one program owns a tile of BQ queries and walks over tiles of BK keys with the online softmax of flash attention.
r_k = W_{k,R} R (H, K, D) holds row c for distance K-1-c (the order project_positions gives), so query i and key j
need row c = j - i + T - 1. For queries i0..i0+BQ-1 and keys j0..j0+BK-1 these rows form one band,
    c = c0 + t,  c0 = j0 - i0 - BQ + T,  t = (j - j0) - (i - i0) + BQ - 1 in [0, BQ + BK - 2],
so the tile's (b)+(d) is a product of (q + v) with the band, then a skew: entry (a, b) of the tile is entry (a, t) of
the product. The tile's keys are taken in blocks of W (the whole tile up to 32 keys, else 16), and the band in pieces
of W rows (piece m: rows c0 + m W ..): entry (a, b') of block n is column t' % W of piece n + t' // W's (BQ, W)
product, t' = b' - a + BQ - 1, so each piece's product is skewed with tl.gather along its rows of W and kept where it
belongs (NP = (BQ + W - 2) // W + 1 pieces a block), in a (BQ, BK / W, W) tile reshaped to (BQ, BK). A gather along
rows of W <= 32 reads one value a lane, so one shuffle a score; rows of 64 take two values a lane and the selects
between them, and a 64-wide band product and its gather did not fit in a thread's registers beside the rest (ptxas:
bench/attn_kernels.py --aot; lab/LOG.md); in blocks of 16, 64 keys do. Where a tile is one block, the forward walks the
key tiles left to right, and tile j0 + BK's band is tile j0's less its first piece plus one more, at the same gather
index: it makes each piece's product once and carries it, skewed, while the band holds it (one (BQ, D) x (D, BK)
product a tile, as (a)+(c) costs); in blocks, the carried pieces cost more registers than the products they save, and
each tile makes its own BK / W + NP - 1 (at 64 x 64: twice (a)+(c)'s flops), as the backward kernels (one block a
tile) make theirs. (a)+(c) is the usual (q + u) k^T. Rows of the band outside 0..K-1 are distances outside 0..K-1:
read as zeros and masked. clamp_len needs nothing here: R's rows are already clamped when the model builds them.

The mask is the caller's own boolean (B, 1, T, K) (causal with memory, key_valid, same_length), read tile by tile
(a byte per score, against the two bytes of a bf16 bias per head; the whole tile, future keys too, so that the reads
are vector loads: a load cut up by the causal test took 32 registers more, ptxas). Keys in a query's future are
masked whatever it says (their band rows are the rel-shift's garbage), and key tiles wholly in the future of a query
tile are skipped.

Backward (G = d · P ∘ (dP - δ), δ_i = Σ_j P_ij dP_ij - ∂L/∂lse_i, dP = dO vᵀ, as flash attention's):
    ∂k = Gᵀ (q+u),  ∂v = Pᵀ dO,
    ∂q = ∂(q+u) + ∂(q+v) = G k + Σ_j G_ij r_k[c(i,j)]:  the second term with the tile's G un-skewed into the pieces
                                       (G_m[a, s] = G[a, b] where column s of piece m is key b; one gather serves
                                       every piece), then a (BQ, BK) x (BK, D) product per piece, both in one
                                       accumulator,
    ∂u = Σ_b Σ_i ∂(q+u)_i = Σ_b Σ_j (Σ_i G_ij) k_j,   ∂v = Σ_b Σ_i ∂(q+v)_i = Σ_c (Σ_{c(i,j)=c} G_ij) r_k[c],
    ∂r_k[c] = Σ_b Σ_{i,j: c(i,j)=c} G_ij (q+v)_i:  G_mᵀ (q+v), summed over every batch row and every tile on the
                                       same diagonal (j0 - i0), which all cover the same rows of r_k.
Three backward kernels, each recomputing the probabilities from the stored log-sum-exp: one per key tile (∂k, ∂v and
Σ_i G_ij), one per query tile (∂q), one per diagonal of square tiles and head (∂r_k and G summed along each distance:
the band's two pieces of each diagonal, summed over batch rows and tiles in registers; the upper piece of diagonal n
covers the rows of the lower piece of n + 1, and the caller adds the two). ∂u and ∂v are then two small products.
∂r_k once came from the queries kernel with float32 atomics: their pointers and a second accumulator made it spill
(lab/LOG.md); the third kernel's recompute costs the flops of one more pass over the tiles, and no atomics.

Inputs bf16 (or float32); products accumulate in float32, the log-sum-exp is float32. Attention dropout (dropatt) is
not implemented: the models refuse attn_kernel='triton' with dropatt > 0. On the CPU the kernels run under Triton's
interpreter (TRITON_INTERPRET=1 before triton is imported), which is how the tests check them without a GPU; there
torch.compile leaves them out of its graph. On CUDA it traces them (user-written Triton kernels): not yet run.
"""

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

INTERPRETED = os.environ.get('TRITON_INTERPRET') == '1'   # read as triton.jit reads it, when this file is imported

# The tiles the kernels run at by default, per compute capability: the forward's and the backward's, each (block_q,
# block_k, num_warps, num_stages), chosen with ptxas (bench/attn_kernels.py --aot; tests/test_rel_attention_triton.py
# holds them to it; lab/LOG.md has the variants). sm_90: the forward at 64 x 64 over 4 warps (wgmma's 64 rows both
# ways, the band in blocks of 16 keys: 166 registers; triton 3.6.0 makes 189 of it), the backward at 64 queries x 16
# keys (at 64 x 64 the backward kernels need 237-255 registers at 8 warps, and a plain flash attention's ∂k, ∂v
# kernel, with no positional term at all, 200 at 4 warps and 159 at 8: bench/flash_yardstick.py; the keys and ∂r_k
# kernels make ∂k, ∂v and ∂r_k with mma.sync, 16 rows of keys). sm_100 and sm_103 (data-centre Blackwell): 64 x 16
# both ways (tcgen05 in the forward and ∂q; the 64 x 64 forward needs 255). sm_80 and every other GPU (sm_89, sm_120,
# ...): 32 x 32 over 4 warps, no spill on any. 2 stages of prefetch, but for the ∂r_k kernel (square tiles of the
# backward's block_k, POSITIONS_STAGES: the prefetch of its tiles made it spill). Not yet timed on a GPU.
TILES = {90: ((64, 64, 4, 2), (64, 16, 4, 2)), 100: ((64, 16, 4, 2), (64, 16, 4, 2)),
         80: ((32, 32, 4, 2), (32, 32, 4, 2))}
POSITIONS_STAGES = 1


def tiles_for(cc):
    """TILES' entry for compute capability cc (major * 10 + minor): sm_90's on Hopper, sm_100's on the data-centre
    Blackwells (100, 103: tcgen05), sm_80's on every other GPU."""
    return TILES[90 if cc == 90 else 100 if cc in (100, 103) else 80]


@triton.jit
def _rows(ptr, first, offs, n, offs_d, D):
    """Rows first + offs (only those in 0..n-1) of a row-major matrix of width D at ptr, zero elsewhere: (len, BD)."""
    ok = (offs[:, None] >= 0) & (offs[:, None] < n) & (offs_d[None, :] < D)
    return tl.load(ptr + (first + offs[:, None]) * D + offs_d[None, :], mask=ok, other=0.0)


@triton.jit
def _store_rows(ptr, first, offs, n, offs_d, D, x):
    """_rows' inverse: x into rows first + offs (those in 0..n-1), cast to ptr's dtype."""
    ok = (offs[:, None] < n) & (offs_d[None, :] < D)
    tl.store(ptr + (first + offs[:, None]) * D + offs_d[None, :], x.to(ptr.dtype.element_ty), mask=ok)


@triton.jit
def _piece(R_ptr, h, c0, m, K, D, W: tl.constexpr, BD: tl.constexpr):
    """Piece m of the band of r_k a tile needs, rows c0 + m W .. c0 + m W + W - 1: (W, BD); zero outside 0..K-1."""
    return _rows(R_ptr, h * K, c0 + m * W + tl.arange(0, W), K, tl.arange(0, BD), D)


@triton.jit
def _band_t(BQ: tl.constexpr, W: tl.constexpr):
    """t of each entry (a, b) of a tile's first W keys, b - a + BQ - 1: its row of the band (BQ, W)."""
    return tl.arange(0, W)[None, :] - tl.arange(0, BQ)[:, None] + BQ - 1


@triton.jit
def _skewed_piece(qv, piece, BQ: tl.constexpr, W: tl.constexpr, PRECISION: tl.constexpr):
    """A piece's product (q + v) pieceᵀ (one (BQ, D) x (D, W) product) skewed into a block of W keys (tl.gather along
    its rows): entry (a, b) is column t % W of it, which is the block's (b)+(d) where t // W is the piece's m."""
    product = tl.dot(qv, tl.trans(piece), input_precision=PRECISION)
    return tl.gather(product, _band_t(BQ, W) % W, 1)


@triton.jit
def _band_scores(qv, R_ptr, h, c0, K, D, BQ: tl.constexpr, BK: tl.constexpr, W: tl.constexpr, BD: tl.constexpr,
                 PRECISION: tl.constexpr):
    """(b)+(d) of the tile moved into place: entry (a, b) is (q_a + v)·r_k[c0 + t], t = b - a + BQ - 1 (BQ, BK),
    made as BK // W blocks of W keys side by side, (BQ, BK // W, W): entry (a, n, b') is that of piece n + t' // W,
    t' = b' - a + BQ - 1, each piece's skewed product kept where it belongs (a piece serves up to NP blocks)."""
    t = _band_t(BQ, W)                                                # t' of each (a, b')
    n = tl.arange(0, BK // W)[None, :, None]
    band = tl.zeros([BQ, BK // W, W], tl.float32)
    for m in tl.static_range(BK // W + (BQ + W - 2) // W):           # every piece of the band: BK // W + NP - 1
        skewed = _skewed_piece(qv, _piece(R_ptr, h, c0, m, K, D, W, BD), BQ, W, PRECISION)
        band = tl.where((t // W)[:, None, :] == m - n, skewed[:, None, :], band)
    return tl.reshape(band, (BQ, BK))


@triton.jit
def _tile_scores(qu, k, band_scores, MASK_ptr, i0, j0, mask_base, stride_mt, T, K, scale,
                 BQ: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr):
    """d·A^rel of the queries i0..i0+BQ-1 (qu = q + u, (BQ, BD)) against keys j0..j0+BK-1 (k, (BK, BD)), given the
    tile's (b)+(d) (band_scores, (BQ, BK)), -inf where masked: (BQ, BK)."""
    offs_i, offs_j = i0 + tl.arange(0, BQ), j0 + tl.arange(0, BK)
    score = tl.dot(qu, tl.trans(k), input_precision=PRECISION) + band_scores         # (a)+(c): (q_i + u)·k_j
    allowed = ((K - T + offs_i[:, None] - offs_j[None, :]) >= 0) & (offs_i[:, None] < T) & (offs_j[None, :] < K)
    inside = (offs_i[:, None] < T) & (offs_j[None, :] < K)
    allowed = allowed & (tl.load(MASK_ptr + mask_base + offs_i[:, None] * stride_mt + offs_j[None, :],
                                 mask=inside, other=0) != 0)                            # the caller's mask
    return tl.where(allowed, score * scale, float('-inf'))


@triton.jit
def _key_rows(K_ptr, V_ptr, bh, j0, K, D, BK: tl.constexpr, BD: tl.constexpr):
    """Keys j0..j0+BK-1: k, v (BK, BD)."""
    offs, offs_d = tl.arange(0, BK), tl.arange(0, BD)
    return _rows(K_ptr, bh * K + j0, offs, K - j0, offs_d, D), _rows(V_ptr, bh * K + j0, offs, K - j0, offs_d, D)


@triton.jit
def _query_rows(QU, QV, DO, LSE, DELTA, bh, i0, T, D, BQ: tl.constexpr, BD: tl.constexpr):
    """What the backward kernels read of queries i0..i0+BQ-1: q + u, q + v, dO (BQ, BD); lse (a query that sees no
    key: 0, its p is 0 anyway), δ (BQ,)."""
    offs, offs_d = tl.arange(0, BQ), tl.arange(0, BD)
    first = bh * T + i0
    lse = tl.load(LSE + first + offs, mask=i0 + offs < T, other=0.0)
    return (_rows(QU, first, offs, T - i0, offs_d, D), _rows(QV, first, offs, T - i0, offs_d, D),
            _rows(DO, first, offs, T - i0, offs_d, D), tl.where(lse == float('-inf'), 0.0, lse),
            tl.load(DELTA + first + offs, mask=i0 + offs < T, other=0.0))


@triton.jit
def _forward_kernel(QU, QV, K_ptr, V_ptr, R_ptr, MASK_ptr, OUT, LSE, stride_mb, stride_mt, H, T, K, D, scale,
                    BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr):
    """out and lse of one tile of queries, over the key tiles it can see (online softmax)."""
    W: tl.constexpr = BK if BK <= 32 else 16                           # the tile's keys in BK // W blocks of W
    i0, bh = tl.program_id(0) * BQ, tl.program_id(1)
    h, offs, offs_d = bh % H, tl.arange(0, BQ), tl.arange(0, BD)
    qu = _rows(QU, bh * T + i0, offs, T - i0, offs_d, D)               # (BQ, BD) q + u
    qv = _rows(QV, bh * T + i0, offs, T - i0, offs_d, D)               # (BQ, BD) q + v
    mask_base = (bh // H) * stride_mb
    m_i = tl.full([BQ], float('-inf'), tl.float32)                     # running max of each row
    l_i = tl.zeros([BQ], tl.float32)                                   # running Σ exp
    acc = tl.zeros([BQ, BD], tl.float32)
    hi = tl.minimum(K, K - T + i0 + BQ)                                # keys past hi are in every query's future
    # One block a tile: the key tiles go left to right, and the band of tile j0 + BK is that of j0 less its first
    # piece, plus one: each piece is multiplied and skewed once, when it enters, and carried while it stays (the
    # gather's index, t % W, is the same in every tile). carried: pieces 0 .. NP - 2 of the band of tile j0, skewed.
    NP: tl.constexpr = (BQ + W - 2) // W + 1
    t = _band_t(BQ, W)
    carried = ()
    if W == BK:
        for m in tl.static_range(NP - 1):
            carried = carried + (_skewed_piece(qv, _piece(R_ptr, h, T - i0 - BQ, m, K, D, W, BD), BQ, W, PRECISION),)
    for j0 in range(0, hi, BK):
        k, v = _key_rows(K_ptr, V_ptr, bh, j0, K, D, BK, BD)
        if W == BK:
            entering = _skewed_piece(qv, _piece(R_ptr, h, j0 - i0 - BQ + T, NP - 1, K, D, W, BD), BQ, W, PRECISION)
            band = entering
            for m in tl.static_range(NP - 1):
                band = tl.where(t // W == m, carried[m], band)
            carried = carried[1:] + (entering,)
        else:                                                          # blocks of 16: every piece made afresh
            band = _band_scores(qv, R_ptr, h, j0 - i0 - BQ + T, K, D, BQ, BK, W, BD, PRECISION)
        score = _tile_scores(qu, k, band, MASK_ptr, i0, j0, mask_base, stride_mt, T, K, scale, BQ, BK, PRECISION)
        m_new = tl.maximum(m_i, tl.max(score, 1))
        m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)         # a row with nothing allowed yet
        p = tl.exp(score - m_safe[:, None])                            # (BQ, BK), 0 where masked
        rescale = tl.exp(m_i - m_safe)
        l_i = l_i * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    empty = l_i == 0.0                                                 # a query that may see no key: out 0
    _store_rows(OUT, bh * T + i0, offs, T - i0, offs_d, D, acc / tl.where(empty, 1.0, l_i)[:, None])
    lse = tl.where(empty, float('-inf'), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + bh * T + i0 + offs, lse, mask=i0 + offs < T)


@triton.jit
def _backward_keys_kernel(QU, QV, K_ptr, V_ptr, R_ptr, MASK_ptr, DO, LSE, DELTA, DK, DV, G_KEYS, stride_mb,
                          stride_mt, H, T, K, D, scale, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
                          PRECISION: tl.constexpr):
    """∂k = Gᵀ (q + u), ∂v = Pᵀ dO and Σ_i G_ij (for ∂u) for one tile of keys, over the query tiles seeing it."""
    j0, bh = tl.program_id(0) * BK, tl.program_id(1)
    h, offs, offs_d = bh % H, tl.arange(0, BK), tl.arange(0, BD)
    k, v = _key_rows(K_ptr, V_ptr, bh, j0, K, D, BK, BD)
    mask_base = (bh // H) * stride_mb
    dk = tl.zeros([BK, BD], tl.float32)
    dv = tl.zeros([BK, BD], tl.float32)
    g_keys = tl.zeros([BK], tl.float32)
    first = tl.maximum(j0 - (K - T), 0) // BQ * BQ                   # earlier queries see none of these keys
    for i0 in range(first, T, BQ):
        qu, qv, do, lse, delta = _query_rows(QU, QV, DO, LSE, DELTA, bh, i0, T, D, BQ, BD)
        band = _band_scores(qv, R_ptr, h, j0 - i0 - BQ + T, K, D, BQ, BK, BK, BD, PRECISION)
        score = _tile_scores(qu, k, band, MASK_ptr, i0, j0, mask_base, stride_mt, T, K, scale, BQ, BK, PRECISION)
        p = tl.exp(score - lse[:, None])                              # (BQ, BK) the probabilities, 0 where masked
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)       # (BQ, BK)
        g = p * (dp - delta[:, None]) * scale                         # ∂L/∂A^rel
        dk += tl.dot(tl.trans(g.to(qu.dtype)), qu, input_precision=PRECISION)
        g_keys += tl.sum(g, 0)
    _store_rows(DK, bh * K + j0, offs, K - j0, offs_d, D, dk)
    _store_rows(DV, bh * K + j0, offs, K - j0, offs_d, D, dv)
    tl.store(G_KEYS + bh * K + j0 + offs, g_keys, mask=j0 + offs < K)


@triton.jit
def _band_ungather(g, BQ: tl.constexpr, BK: tl.constexpr):
    """The skew of the tile's G (BQ, BK) undone: gg[a, s] = G[a, b], b the key that column s of a piece meets in
    row a, b = (s + a + 1 - BQ) mod BK, and the piece (BQ, BK) that entry (a, s) belongs to, (b - a + BQ - 1 - s) / BK.
    Each (a, s) is some key's in exactly one piece: G_m = where(piece == m, gg, 0)."""
    a, s = tl.arange(0, BQ)[:, None], tl.arange(0, BK)[None, :]
    b = (s + a + 1 + BK - BQ % BK) % BK
    return tl.gather(g, b, 1), (b - a + BQ - 1 - s) // BK


@triton.jit
def _backward_queries_kernel(QU, QV, K_ptr, V_ptr, R_ptr, MASK_ptr, DO, LSE, DELTA, DQ, stride_mb, stride_mt,
                             H, T, K, D, scale, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
                             PRECISION: tl.constexpr):
    """∂q = ∂(q + u) + ∂(q + v) = G k + Σ_m G_m piece_m for one tile of queries, over the key tiles it can see,
    in one accumulator (two did not fit in the registers: lab/LOG.md)."""
    i0, bh = tl.program_id(0) * BQ, tl.program_id(1)
    h, offs, offs_d = bh % H, tl.arange(0, BQ), tl.arange(0, BD)
    qu, qv, do, lse, delta = _query_rows(QU, QV, DO, LSE, DELTA, bh, i0, T, D, BQ, BD)
    mask_base = (bh // H) * stride_mb
    dq = tl.zeros([BQ, BD], tl.float32)
    hi = tl.minimum(K, K - T + i0 + BQ)
    for j0 in range(0, hi, BK):
        k, v = _key_rows(K_ptr, V_ptr, bh, j0, K, D, BK, BD)
        band = _band_scores(qv, R_ptr, h, j0 - i0 - BQ + T, K, D, BQ, BK, BK, BD, PRECISION)
        score = _tile_scores(qu, k, band, MASK_ptr, i0, j0, mask_base, stride_mt, T, K, scale, BQ, BK, PRECISION)
        p = tl.exp(score - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        g = p * (dp - delta[:, None]) * scale                         # (BQ, BK) ∂L/∂A^rel
        dq += tl.dot(g.to(k.dtype), k, input_precision=PRECISION)
        gg, piece = _band_ungather(g, BQ, BK)
        for m in tl.static_range((BQ + BK - 2) // BK + 1):
            dq += tl.dot(tl.where(piece == m, gg, 0.0).to(qv.dtype), _piece(R_ptr, h, j0 - i0 - BQ + T, m, K, D, BK,
                                                                              BD), input_precision=PRECISION)
    _store_rows(DQ, bh * T + i0, offs, T - i0, offs_d, D, dq)


@triton.jit
def _backward_positions_kernel(QU, QV, K_ptr, V_ptr, R_ptr, MASK_ptr, DO, LSE, DELTA, DR, G_ROWS, stride_mb,
                               stride_mt, B, H, T, K, D, scale, S: tl.constexpr, BD: tl.constexpr,
                               PRECISION: tl.constexpr):
    """Σ G_mᵀ (q + v) over the tiles of one diagonal (j0 - i0 fixed) of one head, every batch row, at square tiles of
    S: the band's two pieces, (S, D) each, into DR[h, diagonal], and the sums of G_m's columns (G summed along each
    distance, for ∂v), (S,) each, into G_ROWS (no atomics: the caller adds pieces that overlap). The tiles of every
    batch row are one loop: nested loops spilled."""
    n, h = tl.program_id(0), tl.program_id(1)
    offs_d = tl.arange(0, BD)
    dd = (n + 1) * S - tl.cdiv(T, S) * S                              # j0 - i0 of this diagonal
    hi = tl.where(dd < K - T + S, tl.minimum(T, K - dd), 0)           # nothing if every tile is in the future
    d_lo = tl.zeros([S, BD], tl.float32)
    d_hi = tl.zeros([S, BD], tl.float32)
    g_lo = tl.zeros([S], tl.float32)
    g_hi = tl.zeros([S], tl.float32)
    r_lo = _piece(R_ptr, h, dd - S + T, 0, K, D, S, BD)              # the same two pieces for every tile of the
    r_hi = _piece(R_ptr, h, dd - S + T, 1, K, D, S, BD)              # diagonal: loaded once
    first_i0 = tl.maximum(-dd, 0)
    n_i0 = tl.cdiv(tl.maximum(hi - first_i0, 0), S)                   # the tiles of the diagonal in each batch row
    for m in range(0, B * n_i0):                                      # one loop over every batch row's tiles
        b, i0 = m // n_i0, first_i0 + (m % n_i0) * S
        bh = b * H + h
        qu, qv, do, lse, delta = _query_rows(QU, QV, DO, LSE, DELTA, bh, i0, T, D, S, BD)
        k, v = _key_rows(K_ptr, V_ptr, bh, i0 + dd, K, D, S, BD)
        band = tl.where(_band_t(S, S) // S == 0, _skewed_piece(qv, r_lo, S, S, PRECISION),
                        _skewed_piece(qv, r_hi, S, S, PRECISION))
        score = _tile_scores(qu, k, band, MASK_ptr, i0, i0 + dd, b * stride_mb, stride_mt, T, K, scale, S, S,
                             PRECISION)
        p = tl.exp(score - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        g = p * (dp - delta[:, None]) * scale
        gg, piece = _band_ungather(g, S, S)
        g_0, g_1 = tl.where(piece == 0, gg, 0.0), tl.where(piece == 1, gg, 0.0)
        d_lo += tl.dot(tl.trans(g_0.to(qv.dtype)), qv, input_precision=PRECISION)
        d_hi += tl.dot(tl.trans(g_1.to(qv.dtype)), qv, input_precision=PRECISION)
        g_lo += tl.sum(g_0, 0)
        g_hi += tl.sum(g_1, 0)
    first = (h * tl.num_programs(0) + n) * 2 * S
    _store_rows(DR, first, tl.arange(0, S), S, offs_d, D, d_lo)
    _store_rows(DR, first + S, tl.arange(0, S), S, offs_d, D, d_hi)
    tl.store(G_ROWS + first + tl.arange(0, S), g_lo)
    tl.store(G_ROWS + first + S + tl.arange(0, S), g_hi)


def _launch_shape(q_u, k):
    """B, H, T, K, D and BD (D padded to a power of two, at least 16, for tl.arange)."""
    B, H, T, D = q_u.shape
    K = k.size(2)
    return B, H, T, K, D, max(16, triton.next_power_of_2(D))


def _precision(dtype):
    return 'ieee' if dtype == torch.float32 else 'tf32'   # float32 inputs: exact products, as the reference


def _backward_positions(q_u, q_v, k, v, r_k, mask, d_out, lse, delta, scale, S, common):
    """∂r_k and G summed along each distance: _backward_positions_kernel at square tiles of S (block_k) writes each
    diagonal's two pieces of the band (rows c0(n) .. c0(n) + 2S - 1, c0(n) = (n + 1 - cdiv(T, S)) S - S + T), and the
    pieces that cover the same rows (the upper one of diagonal n, the lower one of n + 1) are added here.
    -> (H, K, D) in r_k's dtype, (H, K) float32."""
    B, H, T, K, D, _ = _launch_shape(q_u, k)
    n = triton.cdiv(T, S) + triton.cdiv(K, S) - 1                    # the diagonals that cross the (T, K) scores
    pieces = torch.empty(H, n, 2, S, D, device=r_k.device, dtype=torch.float32)
    g_pieces = torch.empty(H, n, 2, S, device=r_k.device, dtype=torch.float32)
    _backward_positions_kernel[(n, H)](q_u, q_v, k, v, r_k, mask, d_out, lse, delta, pieces, g_pieces, mask.stride(0),
                                       mask.stride(2), B, H, T, K, D, scale, S=S, BD=common['BD'],
                                       PRECISION=common['PRECISION'], num_warps=common['num_warps'],
                                       num_stages=POSITIONS_STAGES)
    first = triton.cdiv(T, S) * S - T                                 # row 0 of r_k, in those rows
    rows = F.pad(pieces[:, :, 0], (0, 0, 0, 0, 0, 1)) + F.pad(pieces[:, :, 1], (0, 0, 0, 0, 1, 0))   # (H, n + 1, S, D)
    g_rows = F.pad(g_pieces[:, :, 0], (0, 0, 0, 1)) + F.pad(g_pieces[:, :, 1], (0, 0, 1, 0))        # (H, n + 1, S)
    return (rows.reshape(H, (n + 1) * S, D)[:, first:first + K].to(r_k.dtype),
            g_rows.reshape(H, (n + 1) * S)[:, first:first + K])


class RelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, u, v_bias, k, v, r_k, mask, scale, tiles):
        q_u = (q + u[:, None]).to(v.dtype).contiguous()               # rounded once, as the model's own q + u
        q_v = (q + v_bias[:, None]).to(v.dtype).contiguous()
        B, H, T, K, D, BD = _launch_shape(q_u, k)
        out = torch.empty_like(q_u)
        lse = torch.empty(B, H, T, device=q_u.device, dtype=torch.float32)
        (block_q, block_k, num_warps, num_stages), backward_tiles = tiles
        _forward_kernel[(triton.cdiv(T, block_q), B * H)](
            q_u, q_v, k, v, r_k, mask, out, lse, mask.stride(0), mask.stride(2), H, T, K, D, scale, BQ=block_q,
            BK=block_k, BD=BD, PRECISION=_precision(q_u.dtype), num_warps=num_warps, num_stages=num_stages)
        ctx.save_for_backward(q_u, q_v, k, v, r_k, mask, out, lse)
        ctx.scale, ctx.tiles, ctx.dtypes = scale, backward_tiles, (q.dtype, u.dtype, v_bias.dtype)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q_u, q_v, k, v, r_k, mask, out, lse = ctx.saved_tensors
        block_q, block_k, num_warps, num_stages = ctx.tiles
        B, H, T, K, D, BD = _launch_shape(q_u, k)
        d_out = d_out.contiguous()
        delta = (d_out.float() * out.float()).sum(-1)                # (B, H, T) δ_i = Σ_j P_ij dP_ij
        if d_lse is not None:
            delta = delta - d_lse                                     # ∂lse_i/∂A_ij = P_ij
        delta = delta.contiguous()
        common = dict(BQ=block_q, BK=block_k, BD=BD, PRECISION=_precision(q_u.dtype),
                      num_warps=num_warps, num_stages=num_stages)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        g_keys = torch.empty(B, H, K, device=k.device, dtype=torch.float32)
        _backward_keys_kernel[(triton.cdiv(K, block_k), B * H)](
            q_u, q_v, k, v, r_k, mask, d_out, lse, delta, dk, dv, g_keys, mask.stride(0), mask.stride(2), H, T, K, D,
            ctx.scale, **common)
        dq = torch.empty_like(q_u)
        _backward_queries_kernel[(triton.cdiv(T, block_q), B * H)](
            q_u, q_v, k, v, r_k, mask, d_out, lse, delta, dq, mask.stride(0), mask.stride(2), H, T, K, D,
            ctx.scale, **common)
        d_r, g_rows = _backward_positions(q_u, q_v, k, v, r_k, mask, d_out, lse, delta, ctx.scale, block_k, common)
        d_u = torch.einsum('bhj,bhjd->hd', g_keys, k.float())        # Σ_b,i ∂(q+u)_i = Σ_b,j (Σ_i G_ij) k_j
        d_v_bias = torch.einsum('hc,hcd->hd', g_rows, r_k.float())   # Σ_b,i ∂(q+v)_i = Σ_c (Σ_c(i,j)=c G_ij) r_k[c]
        q_dtype, u_dtype, v_bias_dtype = ctx.dtypes
        return dq.to(q_dtype), d_u.to(u_dtype), d_v_bias.to(v_bias_dtype), dk, dv, d_r, None, None, None


def _tiles_ok(tiles):
    """(the forward's, the backward's), each (block_q, block_k, num_warps, num_stages): rel_attention's tiles?"""
    power_of_two = lambda x: isinstance(x, int) and x >= 1 and x & (x - 1) == 0
    return (isinstance(tiles, (tuple, list)) and len(tiles) == 2 and
            all(isinstance(each, (tuple, list)) and len(each) == 4 and all(map(power_of_two, each[:3])) and
                min(each[:2]) >= 16 and isinstance(each[3], int) and each[3] >= 1 for each in tiles))


def rel_attention(q, r_w_bias, r_r_bias, k, v, r_k, attn_mask, scale, tiles=None):
    """softmax(scale · ((q+u) kᵀ + rel_shift((q+v) r_kᵀ)), masked) v and its log-sum-exp, in one kernel.
    q: (B, H, T, D); r_w_bias (u), r_r_bias (v): (H, D); k, v: (B, H, K, D), the last T keys being the queries' own
    positions; r_k: (H, K, D) W_{k,R} R for the distances K-1, ..., 0; attn_mask: (B, 1, T, K) bool, True where
    allowed (keys in a query's future are masked whatever it says). q + u and q + v are made here and everything is
    cast to v's dtype. The backward makes ∂q in one accumulator, ∂u from Σ_i G_ij (the keys kernel) and ∂v from G
    summed along each distance (the ∂r_k kernel).
    tiles: (the forward's, the backward's), each (block_q, block_k, num_warps, num_stages): blocks powers of two
    >= 16, num_warps a power of two, num_stages >= 1 (the ∂r_k kernel: the backward's block_k square and
    POSITIONS_STAGES); None: TILES' for the device (not yet timed on a GPU).
    -> out (B, H, T, D) in v's dtype, lse (B, H, T) float32 (-inf for a query that may see no key; its out is 0)."""
    if q.device.type != 'cuda' and not INTERPRETED:
        raise ValueError(f"attn_kernel='triton' runs on CUDA tensors (on the CPU only under TRITON_INTERPRET=1), "
                         f"not on {q.device}")
    if INTERPRETED and v.dtype != torch.float32:
        raise ValueError(f"Triton's interpreter (the CPU) has no {v.dtype} arithmetic: attn_kernel='triton' on the CPU "
                         f"runs in float32 only")
    B, H, T, D = q.shape
    K = k.size(2)
    if (r_k.shape != (H, K, D) or r_w_bias.shape != (H, D) or r_r_bias.shape != (H, D) or attn_mask.dim() != 4
            or attn_mask.size(1) != 1 or attn_mask.shape[-2:] != (T, K)):
        raise ValueError(f"rel_attention: r_w_bias {tuple(r_w_bias.shape)}, r_r_bias {tuple(r_r_bias.shape)}, r_k "
                         f"{tuple(r_k.shape)} and attn_mask {tuple(attn_mask.shape)} do not fit {K} keys, {T} queries, "
                         f"{H} heads of {D}")
    # the kernels address q + u, q + v, k, v, r_k, the output and the gradients as contiguous (rows of D); the mask by
    # its strides over rows and queries (one mask for all heads)
    k, v, r_k = (x.to(v.dtype).contiguous() for x in (k, v, r_k))
    mask = attn_mask.expand(B, 1, T, K)
    mask = mask if mask.stride(-1) == 1 else mask.contiguous()
    if tiles is None:
        major, minor = torch.cuda.get_device_capability(q.device) if q.device.type == 'cuda' else (8, 0)
        tiles = tiles_for(major * 10 + minor)
    if not _tiles_ok(tiles):
        raise ValueError(f"rel_attention: tiles are (the forward's, the backward's), each (block_q, block_k, "
                         f"num_warps, num_stages): blocks powers of two >= 16, num_warps a power of two; got {tiles}")
    return _apply(q, r_w_bias, r_r_bias, k, v, r_k, mask, scale, tiles)


# torch.compile traces user-written Triton kernels on CUDA; the interpreter's Python it cannot, so there the kernels
# run outside the graph (a graph break around each call)
_apply = torch.compiler.disable(RelAttention.apply) if INTERPRETED else RelAttention.apply
