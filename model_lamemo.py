"""
LaMemo (Ji et al., 2022, "LaMemo: Language Modeling with Look-Ahead Memory", NAACL, arXiv 2204.07341), in one file.

Transformer-XL (model_xl.py; read it first) keeps each layer's last M input states as the next segment's memory,
blind to the tokens on their right; LaMemo refreshes them at every step (§3). At layer l, with inputs m^l, h^l:
  1. Look-ahead attention (§3.1). The memory states issue queries q = m^l W_q and attend to the window K~, V~ of the
     W = min(T_prev, M) positions that ends at the segment's first token, each only to keys on its right:
         C^→ = Softmax_upper-triangle(Q K~ᵀ / √d) V~,    s^→ = the softmax's normaliser (kept as log s^→)
  2. Memory interpolation (§3.2). Each memory position stores C^← (its attention output before W_o, over every key
     it has attended so far) and that softmax's normaliser s^←. The two are merged, the stored side detached (sg):
         C^↔ = α sg(C^←) + (1 - α) C^→,    α = sg(s^←) / (sg(s^←) + s^→ + ε)
     which is one softmax over old ∪ new keys (tests/test_lamemo.py checks it); s^← + s^→ is stored for the next
     step. Seed 002's note swaps the arrows: the stored side is the detached one (SPEC §2, the authors' code).
  3. Disentangled relative positions (§3.3, Eq. 12). A look-ahead score uses the distance j - i to the right with its
     own bias v₊ (`r_r_bias_future`); u is shared with the causal direction:
         A^→_{i,j} = (q_i + u)·k_j + (q_i + v₊)·W_{k,R} R_{j-i},   j > i
  4. The refreshed states go through the rest of the layer (W_o, residual, LayerNorm, feed-forward) and become
     m^{l+1}; the segment's queries at layer l attend to [m^l ; h^l] (not m^{l+1}), as the authors' code. So only m^0
     (the embeddings) is stored, and C^←, log s^← for every layer but the last, which feeds nothing and has no v₊.
     A refreshed state has seen tokens up to the segment's first one, which every query sees too: nothing leaks.
Cited by section with the paper's symbols: its text was not at hand; only Eq. 12 is known (the authors' README).

Open details follow the authors' code (thu-coai/LaMemo, pytorch/mem_transformer.py, attn_type 3): u shared by both
directions; ε = 1e-6 added after subtracting the max; α keeps its gradient through s^→. Deviations from that code:
  - The window is the previous segment's length T_prev (stored), not the current one's: equal for equal segments.
  - untie_r applies to v₊ as to u and v (the code shares all three).
  - Invalid slots of a fresh stream are masked and refresh nothing.
  - The softmax is the manual one, or the segment's runs on rel_attention_triton.py (attn_kernel): LaMemo stores
    log-sum-exps, which SDPA does not return. The look-ahead (its own geometry, future distances) is always manual.

Letters: B rows, T segment tokens, M memory slots, W look-ahead window, K = M + T keys, H heads, D = d_head, C = n_embd.
"""

import importlib.util
import math
from dataclasses import dataclass, is_dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

LOOKAHEAD_EPS = 1e-6   # ε of α (§3.2), added after subtracting the max (the authors' code)


@dataclass
class Config:
    # Defaults: model_xl.py's, Transformer-XL's WikiText-103 base model (16 layers, d 410, 10 heads, seg=mem=150).
    vocab_size: int = 50304   # GPT-2's 50257 padded to a multiple of 64
    n_layer: int = 16
    n_head: int = 10
    n_embd: int = 410         # d_model
    d_head: int = 41          # per-head width; n_head * d_head need not equal n_embd
    d_inner: int = 2100       # position-wise feed-forward width
    dropout: float = 0.1      # on embeddings, attention output, feed-forward, final hidden states
    dropatt: float = 0.0      # on attention probabilities
    seg_len: int = 150        # tokens per segment (the paper's N)
    mem_len: int = 150        # memory positions kept per layer (the paper's M); 0 = the no-memory baseline
    clamp_len: int = 0        # relative distances (both directions) above this share one embedding; 0 = no clamp
    same_length: bool = False  # every query of the segment attends to the same number (mem_len) of keys
    pre_lnorm: bool = False   # False: post-LN as in the paper; True: pre-LN (+ final LayerNorm)
    untie_r: bool = True      # True: u, v, v₊ per layer; False: one set shared by all layers
    init_std: float = 0.02    # normal init of weights, as the paper's code
    attn_kernel: str = 'einsum'  # the segment's attention: einsum (written out) or triton (rel_attention_triton.py);
                                 # not sdpa, which returns no log s. The look-ahead is always the einsum

    def __post_init__(self):
        lowest = dict.fromkeys(('vocab_size', 'n_layer', 'n_head', 'n_embd', 'd_head', 'd_inner', 'seg_len'), 1)
        for name, low in {**lowest, 'mem_len': 0, 'clamp_len': 0}.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        for name in ('dropout', 'dropatt'):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.n_embd % 2:
            raise ValueError(f"n_embd must be even (sinusoid positions), got {self.n_embd}")
        check_attn_kernel(self, ('einsum', 'triton'))
        if self.n_layer < 2:
            raise ValueError("LaMemo needs n_layer >= 2: a layer's refreshed memory is the next layer's input")


# Copied from model_xl.py (check_attn_kernel)
def check_attn_kernel(config, kernels):
    """The Config check of attn_kernel against the kernels this model's attention can run on."""
    if config.attn_kernel not in kernels:
        raise ValueError(f"attn_kernel must be one of {', '.join(kernels)}, got {config.attn_kernel!r}")
    if config.attn_kernel == 'triton' and config.dropatt > 0:
        raise ValueError(f"attn_kernel='triton' has no attention dropout: set dropatt=0 (got {config.dropatt}) "
                         f"or another attn_kernel")
    if config.attn_kernel == 'triton' and importlib.util.find_spec('triton') is None:
        raise ValueError("attn_kernel='triton' needs the triton package (CUDA builds of torch ship it)")


@dataclass
class Memory:
    """Fixed-shape recurrent state: shapes never change from step to step, so torch.compile compiles once."""
    mem: torch.Tensor       # (1, B, M, C) layer 0's memory: the embeddings of the last M positions, oldest first
    length: torch.Tensor    # (B,) int64, how many of the M slots (the most recent ones) are valid
    attn_vec: torch.Tensor  # (n_layer-1, B, H, M, D) C^← per layer but the last: the attention output before W_o
    attn_lse: torch.Tensor  # (n_layer-1, B, H, M) log s^←, float32 (or the model's dtype if wider)
    prev_len: torch.Tensor  # (B,) int64, the previous segment's length: the look-ahead window


@dataclass
class OpenSegment:
    """A segment until it becomes the memory, in buffers of fixed shape: forward() opens one on its T tokens and
    closes it; generate() opens one on a segment's first tokens (their look-ahead refreshes the memory) and steps the
    later ones in. S = T (forward) or seg_len (generate) token slots, K = M + S key slots, right-aligned as Memory's:
    [refreshed memory ; tokens so far] fill the right end and padding the left. A step of T tokens slides the window
    by T (decode() never lets a valid slot fall off), so every token's step has the same shapes and writes in place."""
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of [m^l ; tokens]
    emb: torch.Tensor        # (B, S, C) the embeddings h^0 of the last S tokens: layer 0's memory to be
    mem_states: tuple        # (C^↔, log s) (n_layer-1, B, H, M, D), (n_layer-1, B, H, M): the merged memory's
    seg_states: tuple        # (C, log s) (n_layer-1, B, H, S, D), (n_layer-1, B, H, S): the last S tokens'
    r_k: list                # per layer W_{k,R} R (H, M + seg_len, D) for the distances M + seg_len - 1, ..., 0


# -----------------------------------------------------------------------------------------------------------
# LaMemo: look-ahead positions and mask (§3.1, §3.3), interpolation (§3.2), memory update, attention both ways

def future_position_scores(q, r_k, W):
    """rel_shift's counterpart to the right (Eq. 12): scores (q_i + v₊)·W_{k,R} R_{j-i} of the M memory queries q
    (B, H, M, D), v₊ added, against the W window keys; r_k (H, M, D) is W_{k,R} R at distances 1..M. Out: y[..., i, j]
    = q_i · r_k[M - W + j - i], key j at position M - W + 1 + j of [memory ; segment] (distance <= 0: garbage, masked).
    Each block of W queries scores its 2W - 1 distances as one (W, 2W) product: O(M W), the authors' code O(M²)."""
    B, H, M, D = q.shape
    nb = -(-M // W)                                               # blocks of W queries
    q = F.pad(q, (0, 0, 0, nb * W - M)).view(B, H, nb, W, D)      # (B, H, nb, W, D), zero queries at the end
    # block a needs distance rows c0(a) .. c0(a) + 2W - 1, c0(a) = M - 2W + 1 - aW; rows outside 0..M-1 read zeros
    pad = (nb + 1) * W - M - 1                                    # zero rows before row 0
    r = F.pad(r_k, (0, 0, pad, 1))                                # (H, pad + M + 1, D)
    first = pad + M - 2 * W + 1 - W * torch.arange(nb, device=q.device)           # (nb,) c0(a) in r's rows
    rows = first[:, None] + torch.arange(2 * W, device=q.device)                   # (nb, 2W)
    r = r.index_select(1, rows.flatten()).view(H, nb, 2 * W, D)   # (H, nb, 2W, D)
    s = torch.einsum('bhaid,hacd->bhaic', q, r)                   # (B, H, nb, W, 2W)
    i = torch.arange(W, device=q.device)
    take = (W - 1 - i[:, None] + i[None, :]).expand(B, H, nb, W, W)                # y[i, j] = s[i, W - 1 - i + j]
    return s.gather(-1, take).reshape(B, H, nb * W, W)[:, :, :M]  # (B, H, M, W)


def look_ahead_mask(memory, W):
    """(B, 1, M, W): memory slot i may attend the window key at position p = M-W+1+j of [memory ; segment] when p
    is on its right (p > i: §3.1's upper triangle), valid, and not yet looked at: in the previous segment but not its
    first token (the end of the previous window), p > M - prev_len, or the segment's first token, p = M."""
    M, device = memory.mem.size(2), memory.length.device
    p = torch.arange(M - W + 1, M + 1, device=device)             # (W,)
    right = (p[None] > torch.arange(M, device=device)[:, None])[None]            # (1, M, W): p > i
    unseen = (p[None] > (M - memory.prev_len)[:, None]) | (p == M)[None]          # (B, W)
    valid = p[None] >= (M - memory.length)[:, None]                                 # (B, W)
    return (right & (unseen & valid)[:, None])[:, None]          # (B, 1, M, W)


def lookahead_merge(old_vec, old_lse, new_vec, new_lse, eps=LOOKAHEAD_EPS):
    """Memory interpolation (§3.2): C^↔ = α sg(C^←) + (1 - α) C^→, α = sg(s^←) / (sg(s^←) + s^→ + ε), from the log-sum-
    exps less their max (the authors' code). old_vec, new_vec (B, H, M, D); old_lse, new_lse (B, H, M) -> C^↔, log s."""
    old_vec, old_lse = old_vec.detach(), old_lse.detach()
    top = torch.maximum(old_lse, new_lse)
    s_old, s_new = (old_lse - top).exp(), (new_lse - top).exp()  # (B, H, M), the larger one is 1
    alpha = (s_old / (s_old + s_new + eps))[..., None]          # (B, H, M, 1)
    return alpha * old_vec + (1 - alpha) * new_vec, torch.logaddexp(old_lse, new_lse)


def update_memory(memory, seg):
    """The memory after the S tokens of seg (OpenSegment), detached: layer 0's memory rolls FIFO over their embeddings;
    every layer but the last keeps C and log s of the last M positions (old ones merged, new ones the tokens' own)."""
    M, T = memory.mem.size(2), seg.emb.size(1)

    def last_M(k, dtype):       # state k (0: C, 1: log s) of every layer but the last -> (n_layer-1, B, H, M, ...)
        both = torch.cat([seg.mem_states[k].to(dtype), seg.seg_states[k].to(dtype)], dim=3)   # M + T positions
        return both[:, :, :, T:].detach().contiguous()

    mem = torch.cat([memory.mem[0], seg.emb.to(memory.mem.dtype)], dim=1)[:, T:]   # (B, M, C)
    return Memory(mem=mem[None].detach().contiguous(), length=(memory.length + T).clamp(max=M),
                  attn_vec=last_M(0, memory.attn_vec.dtype), attn_lse=last_M(1, memory.attn_lse.dtype),
                  prev_len=torch.full_like(memory.prev_len, T))


# Copied from model_xl.py (RelMultiHeadAttn) with RelMultiHeadAttn->LookAheadAttn and forward() cut in pieces
class LookAheadAttn(nn.Module):
    """model_xl.py's RelMultiHeadAttn (same parameters and names) cut in pieces: forward() the segment's attention,
    look_ahead() the memory's (§3.1), both -> the output before W_o and its log s; output() W_o, LayerNorm."""

    def __init__(self, config):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.d_head
        self.n_head, self.d_head = H, D
        self.q_net = nn.Linear(C, H * D, bias=False)         # W_q
        self.kv_net = nn.Linear(C, 2 * H * D, bias=False)    # W_{k,E} and W_v
        self.r_net = nn.Linear(C, H * D, bias=False)         # W_{k,R}, for the distances of both directions
        self.o_net = nn.Linear(H * D, C, bias=False)
        self.layer_norm = nn.LayerNorm(C)
        self.drop = nn.Dropout(config.dropout)
        self.dropatt = nn.Dropout(config.dropatt)
        self.scale = 1.0 / math.sqrt(D)
        self.pre_lnorm = config.pre_lnorm
        self.attn_kernel = config.attn_kernel
        if config.attn_kernel == 'triton':   # the one import beyond torch, and only here: triton ships with CUDA torch
            from rel_attention_triton import rel_attention
            self.rel_attention = rel_attention

    # Copied from model_xl.py (RelMultiHeadAttn.keys_values)
    def keys_values(self, h):
        """Keys and values (B, H, S, D) of hidden states h (B, S, C). A position's key and value depend on that
        position alone (positions enter only through R), so the memory's can be computed once and cached."""
        B, S, _ = h.shape
        if self.pre_lnorm:
            h = self.layer_norm(h)
        kv = self.kv_net(h).view(B, S, 2, self.n_head, self.d_head)
        return kv.permute(2, 0, 3, 1, 4).unbind(0)               # k, v: each (B, H, S, D)

    # Copied from model_xl.py (RelMultiHeadAttn.project_positions)
    def project_positions(self, r):
        """W_{k,R} R (H, K, D) of the relative embeddings R (K, C): the keys of the distances (§3.3)."""
        return self.r_net(r).view(r.size(0), self.n_head, self.d_head).transpose(0, 1)

    def queries(self, h):                                         # (B, S, C) -> (B, H, S, D)
        B, S, _ = h.shape
        x = self.layer_norm(h) if self.pre_lnorm else h
        return self.q_net(x).view(B, S, self.n_head, self.d_head).transpose(1, 2)

    def softmax_with_lse(self, score, mask, v):
        """softmax(score) v with the log-sum-exp of every row (log s). score: (B, H, Q, K) already scaled; mask:
        (B, 1, Q, K) True where allowed; v: (B, H, K, D). -> (B, H, Q, D) and (B, H, Q) in float32 or wider."""
        score = score.to(torch.promote_types(score.dtype, torch.float32)).masked_fill(~mask, float('-inf'))
        prob, lse = torch.softmax(score, dim=-1), torch.logsumexp(score, dim=-1)   # (B, H, Q, K), (B, H, Q) log s
        return torch.einsum('bhij,bhjd->bhid', self.dropatt(prob.to(v.dtype)), v), lse

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask):
        """The segment's attention, as model_xl.py's. -> C (B, H, T, D), log s (B, H, T), (k, v) of [m^l ; h^l]."""
        q = self.queries(h)                                       # (B, H, T, D)
        k, v = (torch.cat([mem, new], dim=2) for mem, new in zip(mem_kv, self.keys_values(h)))   # (B, H, K, D) each
        r_k = self.project_positions(r) if r.dim() == 2 else r   # (H, K, D)  W_{k,R} R
        if self.attn_kernel == 'triton':                          # one kernel, which returns log s too
            vec, lse = self.rel_attention(q, r_w_bias, r_r_bias, k, v, r_k, attn_mask, self.scale)
            return vec, lse, (k, v)
        AC = torch.einsum('bhid,bhjd->bhij', q + r_w_bias[:, None], k)                 # (B, H, T, K)
        BD = rel_shift(torch.einsum('bhid,hjd->bhij', q + r_r_bias[:, None], r_k))     # (B, H, T, K)
        vec, lse = self.softmax_with_lse((AC + BD) * self.scale, attn_mask, v)
        return vec, lse, (k, v)

    def look_ahead(self, m, kv, r_future, r_w_bias, r_r_bias_future, mask):
        """Look-ahead attention (§3.1, §3.3) of the memory m^l (B, M, C) on the window M-W+1..M of kv (k, v) (B, H, M+T,
        D); r_future: (M, C) R at distances 1..M; mask (B, 1, M, W). -> C^→ (B, H, M, D), log s^→ (B, H, M)."""
        M, W = m.size(1), mask.size(-1)
        q = self.queries(m)                                       # (B, H, M, D)
        k, v = (t[:, :, M - W + 1:M + 1] for t in kv)             # (B, H, W, D) the window K~, V~
        r_k = self.project_positions(r_future)                    # (H, M, D)  W_{k,R} R_{1..M}
        AC = torch.einsum('bhid,bhjd->bhij', q + r_w_bias[:, None], k)                 # (B, H, M, W)
        BD = future_position_scores(q + r_r_bias_future[:, None], r_k, W)             # (B, H, M, W)
        return self.softmax_with_lse((AC + BD) * self.scale, mask, v)

    def output(self, h, vec):
        """W_o, dropout, residual and LayerNorm of attention outputs vec (B, H, S, D) for layer inputs h (B, S, C)."""
        B, S, _ = h.shape
        attn_out = self.drop(self.o_net(vec.transpose(1, 2).reshape(B, S, -1)))      # (B, S, C)
        return h + attn_out if self.pre_lnorm else self.layer_norm(h + attn_out)


# Copied from model_xl.py (Block) with RelMultiHeadAttn->LookAheadAttn, (C, log s) returned and refresh() added
class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = LookAheadAttn(config)
        self.ff = PositionwiseFF(config.n_embd, config.d_inner, config.dropout, config.pre_lnorm)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask):
        """The segment's tokens, as model_xl.py's Block. -> output (B, T, C), their (C, log s), (k, v)."""
        vec, lse, kv = self.attn(h, mem_kv, r, r_w_bias, r_r_bias, attn_mask)
        return self.ff(self.attn.output(h, vec)), (vec, lse), kv

    def refresh(self, m, old, kv, r_future, r_w_bias, r_r_bias_future, mask, mem_valid):
        """The memory's way through the layer: look-ahead attention, interpolation with the stored `old` (C^←, log s^←)
        (an invalid slot, mem_valid (B, M) False, keeps it), the rest of the layer. -> m^{l+1}, merged (C^↔, log s)."""
        vec, lse = lookahead_merge(*old, *self.attn.look_ahead(m, kv, r_future, r_w_bias, r_r_bias_future, mask))
        keep = mem_valid[:, None, :]                              # (B, 1, M)
        vec, lse = torch.where(keep[..., None], vec, old[0]), torch.where(keep, lse, old[1])
        return self.ff(self.attn.output(m, vec)), (vec, lse)


# -----------------------------------------------------------------------------------------------------------
# The model


class Model(nn.Module):
    # Copied from model_xl.py (Model.__init__) with r_r_bias_future (v₊) added
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        C, H, D = config.n_embd, config.n_head, config.d_head
        self.word_emb = ScaledEmbedding(config.vocab_size, C)
        self.pos_emb = PositionalEmbedding(C)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        n_bias = config.n_layer if config.untie_r else 1
        self.r_w_bias = nn.Parameter(torch.empty(n_bias, H, D))   # u, per layer (untie_r) or shared
        self.r_r_bias = nn.Parameter(torch.empty(n_bias, H, D))   # v
        # v₊ (§3.3), the bias of look-ahead distances; the last layer refreshes nothing and has none
        self.r_r_bias_future = nn.Parameter(torch.empty(config.n_layer - 1 if config.untie_r else 1, H, D))
        self.ln_f = nn.LayerNorm(C) if config.pre_lnorm else nn.Identity()
        self.apply(self._init_weights)
        for bias in (self.r_w_bias, self.r_r_bias, self.r_r_bias_future):
            nn.init.normal_(bias, 0.0, config.init_std)

    # Copied from model_xl.py (Model._init_weights)
    def _init_weights(self, module):
        # As the paper's code (weights_init with init='normal'): N(0, init_std) weights, zero biases,
        # LayerNorm gains N(1, init_std).
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, ScaledEmbedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.normal_(module.weight, 1.0, std)
            nn.init.zeros_(module.bias)

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams; mem_len overrides config.mem_len (a longer one at eval)."""
        c = self.config
        M = c.mem_len if mem_len is None else mem_len
        B, L, H, D = batch_size, c.n_layer - 1, c.n_head, c.d_head   # the last layer refreshes nothing
        dtype = self.word_emb.weight.dtype                       # float32 under autocast; the model's own if cast
        zeros, count = partial(torch.zeros, device=device, dtype=dtype), partial(torch.zeros, B, dtype=torch.long)
        return Memory(mem=zeros(1, B, M, c.n_embd), length=count(device=device), attn_vec=zeros(L, B, H, M, D),
                      prev_len=count(device=device),
                      attn_lse=zeros(L, B, H, M, dtype=torch.promote_types(dtype, torch.float32)))

    def reset_memory(self, memory, mask):
        """Empty the memory of the rows where mask (B,) is True, e.g. at a document boundary."""
        keep = ~mask            # (B,); as (B, 1, ..., 1) it broadcasts onto the batch dim of both (B,) and (L, B, ...)
        return Memory(**{name: x * keep.view(-1, *[1] * (x.dim() - 2)).to(x.dtype) for name, x in vars(memory).items()})

    # Copied from model_xl.py (Model._relative_positions) with K->pos_seq: any distances (the look-ahead's are 1..M)
    def _positions(self, pos_seq):
        """R at the given distances (clamped at clamp_len), with dropout as in the paper's code."""
        if self.config.clamp_len > 0:
            pos_seq = pos_seq.clamp(max=self.config.clamp_len)
        return self.drop(self.pos_emb(pos_seq).to(self.word_emb.weight.dtype))   # (K, C)

    # Copied from model_xl.py (Model._attn_mask)
    def _attn_mask(self, key_valid, T, mem_len):
        """key_valid: (B, K) bool over the K = S + T keys, the last T being the queries themselves.
        Query i sits at position S + i; it sees key j when j is valid and 0 <= (S + i) - j, and, with
        same_length, (S + i) - j < mem_len, so every query sees the same number of keys. -> (B, 1, T, K)"""
        S = key_valid.size(1) - T
        i = torch.arange(T, device=key_valid.device)[:, None]
        j = torch.arange(S + T, device=key_valid.device)[None, :]
        distance = S + i - j                                      # (T, K)
        allowed = distance >= 0                                   # causal
        if self.config.same_length:
            allowed = allowed & (distance < max(mem_len, 1))
        return (allowed[None] & key_valid[:, None, :])[:, None]  # (B, 1, T, K)

    # Copied from model_xl.py (Model._u_v) with _u_v->_biases, which adds v₊ (None for the last layer)
    def _biases(self, n):                                         # u, v and v₊ of layer n (no v₊ for the last)
        i = n if self.config.untie_r else 0
        return self.r_w_bias[i], self.r_r_bias[i], self.r_r_bias_future[i] if n < len(self.layers) - 1 else None

    def _open_segment(self, h, memory):
        """All layers for the first T tokens h^0 (B, T, C) of a segment, refreshing the memory on the way up (steps
        1-4 of the docstring). -> the last layer's output (B, T, C) and the OpenSegment of S = T token slots."""
        B, T, _ = h.shape
        M, device = memory.mem.size(2), h.device
        mem_valid = torch.arange(M, device=device)[None, :] >= (M - memory.length)[:, None]   # (B, M)
        key_valid = torch.cat([mem_valid, mem_valid.new_ones(B, T)], dim=1)                  # (B, M+T)
        attn_mask = self._attn_mask(key_valid, T, M)              # (B, 1, T, M+T)
        K_max = M + self.config.seg_len                           # generate() slices the longest segment's W_{k,R} R
        r = self._positions(torch.arange(K_max - 1, -1, -1.0, device=device))         # (K_max, C) distances K_max-1..0
        if M > 0:
            la_mask = look_ahead_mask(memory, min(self.config.seg_len, M))           # (B, 1, M, W)
            r_future = self._positions(torch.arange(1.0, M + 1, device=device))        # (M, C) distances 1..M
        m, emb = memory.mem[0], h                                 # (B, M, C) m^0, stored
        kv, r_k, mem_states, seg_states = [], [], [], []
        for n, layer in enumerate(self.layers):
            u, v, v_future = self._biases(n)
            r_k.append(layer.attn.project_positions(r))
            h, state, kv_n = layer(h, layer.attn.keys_values(m), r_k[n][:, -(M + T):], u, v, attn_mask)
            if v_future is not None:                              # the last layer has no next layer to refresh
                old = (memory.attn_vec[n], memory.attn_lse[n])    # (B, H, M, D), (B, H, M)
                if M > 0:
                    m, old = layer.refresh(m, old, kv_n, r_future, u, v_future, la_mask, mem_valid)   # m^{l+1}
                mem_states.append(old)
                seg_states.append(state)
            kv.append(kv_n)
        stacked = lambda states: tuple(torch.stack(x) for x in zip(*states))   # per layer (C, log s) -> over layers
        return h, OpenSegment(key_valid, kv, emb, stacked(mem_states), stacked(seg_states), r_k)

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len; memory: Memory. Returns (logits, loss, new_memory, aux)."""
        T = idx.size(1)
        if T > self.config.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={self.config.seg_len}")
        h, seg = self._open_segment(self.drop(self.word_emb(idx)), memory)           # (B, T, C)
        logits = F.linear(self.drop(self.ln_f(h)), self.word_emb.weight)            # (B, T, V), tied output layer
        new_memory = update_memory(memory, seg)
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
        return logits, loss, new_memory, aux

    # Copied from model_xl.py (Model.num_params)
    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs per token (MFU), memory detached: model_xl.py's count plus, per segment, the memory's way up
        (a multiply-add: 4 FLOPs on the stored m^0, 6 on a refreshed m^l): W_q, the look-ahead, W_o and FF over M."""
        c = self.config
        matrices = sum(p.numel() for n, p in self.named_parameters() if n.endswith('weight') and p.dim() > 1)
        M = c.mem_len if mem_len is None else mem_len
        T, K, C, HD, W, L = c.seg_len, M + c.seg_len, c.n_embd, c.n_head * c.d_head, min(c.seg_len, M), c.n_layer
        weights = 6 * (matrices - L * C * HD)           # every weight but W_{k,R}, once a token
        attention = 6 * 3 * L * HD * K
        memory = (4 + 6 * (L - 1)) * M * C * 2 * HD              # [m^l] W_{k,E}, W_v in every layer
        w_q = (4 + 6 * (L - 2)) * M * C * HD                      # the memory queries of layers 0 .. L-2
        refresh = (L - 1) * 6 * (M * (C * HD + 2 * C * c.d_inner) + 4 * HD * M * W)   # look-ahead, W_o, FF
        return weights + attention + (memory + w_q + refresh) / T

    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T) on memory, whose look-ahead refreshes it (_open_segment), in a new
        OpenSegment of seg_len token slots or in seg's buffers (decode() reuses them). -> logits (B, V) of the last
        token, the OpenSegment"""
        h, new = self._open_segment(self.drop(self.word_emb(tokens)), memory)
        pad = (0, 0, self.config.seg_len - tokens.size(1), 0)          # empty token slots on the left
        seg = refill(seg, OpenSegment(key_valid=F.pad(new.key_valid, pad[2:]),
                                      kv=[tuple(F.pad(x, pad) for x in xs) for xs in new.kv],
                                      emb=F.pad(new.emb, pad), mem_states=new.mem_states,
                                      seg_states=(F.pad(new.seg_states[0], pad), F.pad(new.seg_states[1], pad[2:])),
                                      r_k=new.r_k))
        return F.linear(self.ln_f(h[:, -1]), self.word_emb.weight), seg

    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg, which it updates in place: they attend to [refreshed
        memory ; earlier tokens] as in Transformer-XL. filled: as model_xl.py's (the step skips the seg_len - filled
        padding slots on the left; None: it reads them too, as a graph wants). -> logits (B, V) of the last"""
        T, S = tokens.size(1), 0 if filled is None else self.config.seg_len - filled   # S slots skipped
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K-S)
        attn_mask = self._attn_mask(key_valid, T, seg.key_valid.size(1) - self.config.seg_len)   # (B, 1, T, K-S)
        h = emb = self.drop(self.word_emb(tokens))                     # (B, T, C)
        states = []
        for n, layer in enumerate(self.layers):
            k, v = (x[:, :, S:] for x in seg.kv[n])                    # the slots it reads, less the T oldest below
            h, state, (k_new, v_new) = layer(h, (k[:, :, T:], v[:, :, T:]), seg.r_k[n][:, S:],
                                             *self._biases(n)[:2], attn_mask)                   # u, v
            k.copy_(k_new)
            v.copy_(v_new)
            states.append(state)
        seg.key_valid[:, S:] = key_valid
        seg.emb[:, S:] = torch.cat([seg.emb[:, S + T:], emb.to(seg.emb.dtype)], dim=1)
        for old, new in zip(seg.seg_states, zip(*states[:-1])):       # C, log s of every layer but the last
            old[:, :, :, S:] = torch.cat([old[:, :, :, S + T:], torch.stack(new).to(old.dtype)], dim=3)
        return F.linear(self.ln_f(h[:, -1]), self.word_emb.weight)    # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it."""
        return update_memory(memory, seg)

    # Copied from model_xl.py (Model.generate)
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None, cuda_graph=False):
        """Continue idx (B, T0) by max_new_tokens tokens after memory (optional; else a fresh one), as decode() says;
        callback(tokens (B, 1)) after each new token; cuda_graph: replay each token's step as one CUDA graph."""
        memory = self.init_memory(idx.size(0), idx.device) if memory is None else memory
        return decode(self, idx, memory, max_new_tokens, temperature, top_k, callback, cuda_graph)


# -----------------------------------------------------------------------------------------------------------
# Blocks copied verbatim from model_xl.py (tests/test_copies.py keeps them identical)

# Copied from model_xl.py (PositionwiseFF)
class PositionwiseFF(nn.Module):
    """The feed-forward sublayer with its residual and LayerNorm (post-LN, or pre-LN when pre_lnorm)."""

    def __init__(self, n_embd, d_inner, dropout, pre_lnorm):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, d_inner), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(d_inner, n_embd), nn.Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(n_embd)
        self.pre_lnorm = pre_lnorm

    def forward(self, x):
        if self.pre_lnorm:
            return x + self.net(self.layer_norm(x))
        return self.layer_norm(x + self.net(x))


# Copied from model_xl.py (ScaledEmbedding)
class ScaledEmbedding(nn.Module):
    """Token embedding times sqrt(n_embd), as the Transformer-XL code's AdaptiveEmbedding with a single cluster.
    Its weight is tied to the output layer."""

    def __init__(self, vocab_size, n_embd):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, n_embd))
        self.scale = n_embd ** 0.5

    def forward(self, idx):
        return F.embedding(idx, self.weight) * self.scale


# Copied from model_xl.py (PositionalEmbedding)
class PositionalEmbedding(nn.Module):
    """The fixed sinusoid R of §3.3 (Vaswani et al.'s, without learnable parameters), evaluated at any positions."""

    def __init__(self, n_embd):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, n_embd, 2.0) / n_embd))
        self.register_buffer('inv_freq', inv_freq, persistent=False)

    def forward(self, pos_seq):                                   # pos_seq: (K,) float
        sinusoid = torch.outer(pos_seq, self.inv_freq)            # (K, n_embd/2)
        return torch.cat([sinusoid.sin(), sinusoid.cos()], -1)    # (K, n_embd)


# Copied from model_xl.py (sample_next)
def sample_next(logits, temperature=1.0, top_k=None):
    """Sample one token per row from (B, V) logits; temperature 0 means greedy."""
    if temperature == 0.0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], float('-inf'))
    return torch.multinomial(F.softmax(logits.float(), dim=-1), num_samples=1)   # (B, 1)


# Copied from model_xl.py (decode)
def decode(model, idx, memory, max_new_tokens, temperature=1.0, top_k=None, callback=None, cuda_graph=False):
    """The sampling loop of every model's generate(). The prompt idx (B, T0) goes in as pieces that never cross a
    segment boundary, then max_new_tokens tokens are sampled one at a time (sample_next), each fed back. The model
    keeps the open segment in buffers of fixed shape (its OpenSegment): model.open_segment(memory, tokens, seg) starts
    one with its first tokens, model.step(tokens, seg, filled) adds the next, each returning the logits (B, V) of the
    last token, and model.close_segment(memory, seg) turns it into the memory once it holds seg_len tokens (here is
    the only place that counts them), as forward() does. Opening and closing happen once a segment, a step at every
    token. With cuda_graph the step is recorded once as a CUDA graph and replayed: it then reads every slot, the same
    shapes at every token; without, it reads only the slots in use (filled: the segment's tokens with these)."""
    if idx.size(1) == 0:
        raise ValueError("generate needs at least one token in idx")
    if cuda_graph and idx.device.type != 'cuda':
        raise ValueError(f"cuda_graph=True needs the model and idx on a CUDA device, not {idx.device}")
    seg_len, seg_pos, seg = model.config.seg_len, 0, None         # seg_pos: tokens of the open segment so far
    captured = CapturedStep(model.step) if cuda_graph else None

    def feed(tokens):
        nonlocal memory, seg_pos, seg
        if seg_pos == 0:
            logits, seg = model.open_segment(memory, tokens, seg)  # in seg's old buffers, which a graph reads
        elif captured:                                             # every slot, the same shapes at every token
            logits = captured(tokens, seg)
        else:                                                      # the slots in use
            logits = model.step(tokens, seg, seg_pos + tokens.size(1))
        seg_pos = (seg_pos + tokens.size(1)) % seg_len
        if seg_pos == 0:
            memory = model.close_segment(memory, seg)
        return logits

    for start in range(0, idx.size(1), seg_len):
        logits = feed(idx[:, start:start + seg_len])
    for i in range(max_new_tokens):
        idx_next = sample_next(logits, temperature, top_k)
        idx = torch.cat([idx, idx_next], dim=1)
        if callback is not None:
            callback(idx_next)
        if i + 1 < max_new_tokens:
            logits = feed(idx_next)
    return idx


# Copied from model_xl.py (refill)
def refill(seg, new):
    """new; or, when seg is an OpenSegment already, seg with new's values copied in (a captured step reads seg)"""
    if seg is None:
        return new

    def tensors(x):                                               # of a dataclass, list or tuple, in order
        if torch.is_tensor(x):
            return [x]
        items = vars(x).values() if is_dataclass(x) else x if isinstance(x, (list, tuple)) else []
        return [t for item in items for t in tensors(item)]

    for old, value in zip(tensors(seg), tensors(new), strict=True):
        old.copy_(value)
    return seg


# Copied from model_xl.py (CapturedStep)
class CapturedStep:
    """A model's step(tokens, seg) as a CUDA graph: one launch for the hundreds of kernels of a token, whose Python
    and launch overhead otherwise cost more than their arithmetic at batch 1. The first call runs the step, as the
    warm-up capture wants (on a side stream), then records it; later calls copy their tokens into the recorded input
    and replay. step must keep its shapes and write only into seg's buffers (OpenSegment)."""

    def __init__(self, step):
        self.step, self.graph = step, None

    def __call__(self, tokens, seg):
        if self.graph is not None:
            self.tokens.copy_(tokens)
            self.graph.replay()
            return self.logits
        # the weights' autocast copies are made inside the graph, not cached outside it (and freed under it)
        with torch.autocast('cuda', torch.get_autocast_dtype('cuda'), torch.is_autocast_enabled('cuda'),
                            cache_enabled=False):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                logits = self.step(tokens, seg)                   # this token's step, and the warm-up
            torch.cuda.current_stream().wait_stream(stream)
            self.tokens, self.graph = tokens.clone(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self.step(self.tokens, seg)         # recorded, not run
        return logits


# Copied from model_xl.py (rel_shift)
def rel_shift(x):
    """The rel-shift trick of the Transformer-XL code (its appendix B computes the same thing).

    In: x[..., i, c] = score of query i with the relative embedding of distance K-1-c (columns in the order of
    R_{K-1}, ..., R_0). Out: y[..., i, j] = score of query i with distance (K-T+i) - j, i.e. the distance between
    query i (which sits at position K-T+i of the K keys) and key j. Pad one zero column on the left, view the
    (T, K+1) block as (K+1, T), drop the first row, view back as (T, K). Entries with j > K-T+i (keys in the
    query's future) come out as garbage and must be masked, as they always are.
    """
    B, H, T, K = x.shape
    x_padded = torch.cat([x.new_zeros(B, H, T, 1), x], dim=-1)    # (B, H, T, K+1)
    x_padded = x_padded.view(B, H, K + 1, T)
    return x_padded[:, :, 1:].reshape(B, H, T, K)                 # y[i, j] = x[i, j + T-1-i]
