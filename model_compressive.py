"""
Compressive Transformer (Rae, Potapenko, Jayakumar, Lillicrap, ICLR 2020, "Compressive Transformers for
Long-Range Sequence Modelling", arXiv 1911.05507), in one file.

Transformer-XL (model_xl.py) forgets a hidden state once it leaves the memory of mem_len slots. The Compressive
Transformer keeps it in a second, coarser memory: per layer
  - m, the FIFO memory of the last n_m = `mem_len` layer inputs, exactly Transformer-XL's, and
  - cm, the compressed memory of n_cm = `cmem_len` slots: the states m evicts are compressed at rate
    c = `compression_rate` by a per-layer compression function f_c and appended to cm (oldest out first).
The segment attends to [cm ; m ; segment] with Transformer-XL's relative attention, so the attention span is
n_cm + n_m keys while the temporal range is c·n_cm + n_m positions (§3, "Temporal range").

Algorithm 1 (per layer i, segment h of n_s tokens):
    mem     = concat(cm_t, m_t)                          line 5
    ã       = multihead_attention(h, mem)                line 6, relative positions as Transformer-XL
    old_mem = m_t[:n_s]                                  line 8, the oldest memories, about to be forgotten
    new_cm  = f_c(old_mem)                               line 9, n_s/c compressed slots
    m_t+1   = concat(m_t, h)[-n_m:]                      line 10
    cm_t+1  = concat(cm_t, new_cm)[-n_cm:]               line 11
Compression functions f_c (§3.1, flag `compression`): max_pool / mean_pool (kernel = stride = c), conv (a 1D
convolution, kernel = stride = c), dilated_conv, most_used (keep the memories that received the most attention).
f_c is trained by a local auxiliary loss (§3.1, flag `recon_loss`), not by backpropagation through time:
`attention` (Algorithm 2: ‖attn(h, old_mem) − attn(h, f_c(old_mem))‖² with the layer's own attention weights,
h and old_mem under stop-gradient, so only f_c learns from it), `autoencoding` (‖old_mem − g(f_c(old_mem))‖² with
a learned decoder g), or `none`.

Reading order: Config → Memory → small blocks (copied from model_xl.py on purpose) → compression functions →
relative attention → block → model (init, forward, memory update with Algorithm 1 and 2, generate).

How this file makes Algorithm 1 fixed-shape (so torch.compile compiles once) and what it does at the edges:
  - Both memories of a layer live in ONE right-aligned buffer [cm ; m] with two valid-slot counts per row. The
    keys are the buffer's valid slots, contiguous, so relative distances never jump over empty slots; a
    compressed slot counts as one position, as in the paper (attention over the concatenation, line 5).
  - Only valid slots are ever compressed: what is compressed is what overflows m (n_m slots), so a memory that
    is still filling up at the start of a stream evicts nothing. With n_s <= n_m this is line 8's m_t[:n_s].
  - Remainder (n_s not a multiple of c, or an odd overflow while m fills up): m evicts whole groups of c only.
    The r = overflow mod c newest of the overflowing states stay in m (which has room for n_m + c − 1 slots
    when cmem_len > 0) and are compressed with the next eviction, in their FIFO order. So every state is
    compressed exactly once, in groups of c consecutive positions, and is attended throughout (raw, then
    compressed): nothing is duplicated or lost. With seg_len and mem_len multiples of c (every config here)
    r is always 0 and m holds exactly n_m slots, as in the paper.
  - cmem_len = 0 is Transformer-XL exactly (tested: same weights, same logits as model_xl.py).

Deliberate deviations (also listed in the README):
  - As model_xl.py: GPT-2 BPE tokens with a full tied softmax; pre_lnorm adds a final LayerNorm; fixed-shape
    memory with valid-slot counts.
  - The paper does not specify its dilated convolution; ours is described at DilatedConvCompression.
  - most_used ranks the states being evicted by their average attention (attention mass received, mean over
    heads, summed over every query that saw it, divided by the number of those queries) and keeps the
    ⌊n/c⌋ most used, in time order; it needs the attention weights, so it always runs the manual attention.
  - Algorithm 2's attn() is the layer's content attention (no positions, as the paper says) with the usual
    1/sqrt(d_head) scale; the losses are mean squared errors, summed over layers.
  - recon_loss='none': the compressed memory then keeps its graph (only through f_c, old_mem is stopped), so
    with train.py's --bptt_segments=k > 1 the LM loss trains f_c by backpropagation through time, the option
    the paper mentions and sets aside (§3.2); with k = 1 a learned f_c stays at its initialisation.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

COMPRESSIONS = ('max_pool', 'mean_pool', 'conv', 'dilated_conv', 'most_used')
RECON_LOSSES = ('attention', 'autoencoding', 'none')


@dataclass
class Config:
    # Transformer-XL's fields and defaults (the WikiText-103 base model), see model_xl.py
    vocab_size: int = 50304   # GPT-2's 50257 padded to a multiple of 64
    n_layer: int = 16
    n_head: int = 10
    n_embd: int = 410         # d_model
    d_head: int = 41          # per-head width; n_head * d_head need not equal n_embd
    d_inner: int = 2100       # position-wise feed-forward width
    dropout: float = 0.1      # on embeddings, attention output, feed-forward, final hidden states
    dropatt: float = 0.0      # on attention probabilities
    seg_len: int = 150        # n_s, tokens per segment
    mem_len: int = 150        # n_m, FIFO memory slots per layer; 0 = no memory (then nothing is compressed)
    clamp_len: int = 0        # relative distances above this share one embedding; 0 = no clamp
    same_length: bool = False  # every query attends to the same number (cmem_len + mem_len) of keys
    pre_lnorm: bool = False   # False: post-LN as in the paper; True: pre-LN (+ final LayerNorm)
    untie_r: bool = True      # True: u, v (r_w_bias, r_r_bias) per layer; False: one pair shared by all layers
    init_std: float = 0.02    # normal init of weights, as the Transformer-XL code
    use_sdpa: bool = True     # F.scaled_dot_product_attention (not with most_used, which needs the weights)
    # the Compressive Transformer's own
    cmem_len: int = 150       # n_cm, compressed memory slots per layer; 0 = Transformer-XL
    compression_rate: int = 3  # c: old memories per compressed slot (the paper: 3 on enwik8, 2 on PG-19)
    compression: str = 'conv'  # f_c: max_pool, mean_pool, conv, dilated_conv, most_used (§3.1; conv was best)
    recon_loss: str = 'attention'  # f_c's loss: attention (Algorithm 2, the paper's best), autoencoding, none
    recon_weight: float = 1.0  # loss = LM loss + recon_weight * reconstruction loss

    def __post_init__(self):
        for name in ('vocab_size', 'n_layer', 'n_head', 'n_embd', 'd_head', 'd_inner', 'seg_len',
                     'compression_rate'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ('mem_len', 'clamp_len', 'cmem_len'):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ('dropout', 'dropatt'):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.n_embd % 2:
            raise ValueError(f"n_embd must be even (sinusoid positions), got {self.n_embd}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}")
        if self.recon_loss not in RECON_LOSSES:
            raise ValueError(f"recon_loss must be one of {', '.join(RECON_LOSSES)}, got {self.recon_loss!r}")
        if not self.recon_weight >= 0.0:
            raise ValueError(f"recon_weight must be >= 0, got {self.recon_weight}")
        if self.cmem_len > 0 and self.mem_len == 0:
            raise ValueError("cmem_len > 0 needs mem_len > 0: the compressed memory is filled from the memory")


@dataclass
class Memory:
    """Fixed-shape recurrent state: shapes never change from step to step, so torch.compile compiles once.
    S = cmem_len + mem_len + (compression_rate - 1 if cmem_len else 0) slots per layer (see the module docstring
    for the c - 1 spare slots). Slot order is time order; the valid slots are the last cmem_length + mem_length."""
    mem: torch.Tensor          # (n_layer, B, S, n_embd) [cm ; m]: compressed memory, then each layer's input states
    cmem_length: torch.Tensor  # (B,) int64, valid compressed slots (<= cmem_len)
    mem_length: torch.Tensor   # (B,) int64, valid uncompressed slots (<= mem_len + c - 1)
    attn_mass: torch.Tensor    # (n_layer, B, S) attention received by each slot so far (mean over heads; most_used)
    attn_queries: torch.Tensor  # (B, S) how many queries have seen each slot (the mass's denominator)


# -----------------------------------------------------------------------------------------------------------
# Small blocks. These are shared by design with the other model files, which copy them verbatim.

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
def decode(step, idx, max_new_tokens, seg_len, temperature=1.0, top_k=None, callback=None):
    """The sampling loop of every model's generate(). The prompt idx (B, T0) goes through step() in pieces that
    never cross a segment boundary, then max_new_tokens tokens are sampled one at a time, each fed back through
    step(). step(tokens (B, T)) -> (B, V) logits of the last position; it keeps the model's cache.
    callback(tokens (B, 1)) is called after each sampled token (sample.py streams text with it)."""
    if idx.size(1) == 0:
        raise ValueError("generate needs at least one token in idx")
    for start in range(0, idx.size(1), seg_len):
        logits = step(idx[:, start:start + seg_len])
    for i in range(max_new_tokens):
        idx_next = sample_next(logits, temperature, top_k)
        idx = torch.cat([idx, idx_next], dim=1)
        if callback is not None:
            callback(idx_next)
        if i + 1 < max_new_tokens:
            logits = step(idx_next)
    return idx


# -----------------------------------------------------------------------------------------------------------
# Compression functions f_c (§3.1)


class Compression(nn.Module):
    """f_c^{(i)}, one layer's compression function. It maps groups of c consecutive old memories to one
    compressed memory each: groups (B, G, c, C) -> (B, G, C). Row b's real groups are its last n_new[b] (the
    rest is padding, so the shapes are fixed); usage (B, G*c) is the average attention each old memory received
    (most_used only).
      max_pool, mean_pool  pooling over time, kernel = stride = c (no parameters)
      conv                 Conv1d over time, kernel = stride = c, n_embd channels in and out
      dilated_conv         the paper gives no details; ours is a WaveNet-style tree over each group: ⌈log2 c⌉
                           Conv1d of kernel 2 with dilations 1, 2, 4, ... (ReLU between them) over the group
                           left-padded with zeros to 2^⌈log2 c⌉ positions, so its one output sees the c memories
      most_used            keep the n_new memories of the n_new·c with the highest usage, in time order
    """

    def __init__(self, config):
        super().__init__()
        self.kind, c, C = config.compression, config.compression_rate, config.n_embd
        if self.kind == 'conv':
            self.conv = nn.Conv1d(C, C, kernel_size=c, stride=c)
        elif self.kind == 'dilated_conv':
            levels = max(1, math.ceil(math.log2(c)))
            self.width = 2 ** levels
            self.convs = nn.ModuleList([nn.Conv1d(C, C, kernel_size=2, dilation=2 ** i) for i in range(levels)])

    def forward(self, groups, n_new, usage):
        if self.kind == 'max_pool':
            return groups.amax(2)
        if self.kind == 'mean_pool':
            return groups.mean(2)
        if self.kind == 'most_used':
            return self._most_used(groups, n_new, usage)
        B, G, c, C = groups.shape
        x = groups.reshape(B * G, c, C).transpose(1, 2)          # (B*G, C, c): channels first for Conv1d
        if self.kind == 'conv':
            x = self.conv(x)                                      # (B*G, C, 1)
        else:
            x = F.pad(x, (self.width - c, 0))                     # (B*G, C, 2^levels), zeros before the group
            for n, conv in enumerate(self.convs):
                x = conv(x)                                       # length shrinks by the dilation 2^n
                if n < len(self.convs) - 1:
                    x = F.relu(x)                                 # (B*G, C, 1) after the last level
        return x.reshape(B, G, C)

    @staticmethod
    def _most_used(groups, n_new, usage):
        """Rank the B x G*c candidates by usage (padding last, ties to the older one), keep each row's n_new best
        and write them, in time order, right-aligned into (B, G, C)."""
        B, G, c, C = groups.shape
        candidates = groups.reshape(B, G * c, C)
        position = torch.arange(G * c, device=groups.device).expand(B, -1)                 # (B, G*c)
        real = position >= ((G - n_new) * c)[:, None]
        order = torch.argsort(usage.masked_fill(~real, float('-inf')), dim=1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(1, order, position)                         # rank of each candidate
        keep = rank < n_new[:, None]                                                        # n_new per row
        slot = (G - n_new)[:, None] + keep.cumsum(1) - 1                                    # target slot, time order
        slot = torch.where(keep, slot, G)                                                   # the rest: slot G, dropped
        out = candidates.new_zeros(B, G + 1, C).scatter(1, slot[..., None].expand(-1, -1, C), candidates)
        return out[:, :G]


# -----------------------------------------------------------------------------------------------------------
# Relative attention over [compressed memory ; memory ; segment]


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


class RelMultiHeadAttn(nn.Module):
    """Multi-head attention with Transformer-XL relative positions (§3.3 of Dai et al.), its residual and
    LayerNorm: model_xl.py's, plus the attention mass each key receives (for most_used) and Algorithm 2's
    content attention."""

    def __init__(self, config):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.d_head
        self.n_head, self.d_head = H, D
        self.q_net = nn.Linear(C, H * D, bias=False)         # W_q
        self.kv_net = nn.Linear(C, 2 * H * D, bias=False)    # W_{k,E} and W_v
        self.r_net = nn.Linear(C, H * D, bias=False)         # W_{k,R}: the relative embeddings' own key projection
        self.o_net = nn.Linear(H * D, C, bias=False)
        self.layer_norm = nn.LayerNorm(C)
        self.drop = nn.Dropout(config.dropout)
        self.dropatt = nn.Dropout(config.dropatt)
        self.dropatt_p = config.dropatt
        self.scale = 1.0 / math.sqrt(D)
        self.pre_lnorm = config.pre_lnorm
        self.use_sdpa = config.use_sdpa

    def keys_values(self, h):
        """Keys and values (B, H, S, D) of hidden states h (B, S, C). A position's key and value depend on that
        position alone (positions enter only through R), so the memory's can be computed once and cached."""
        B, S, _ = h.shape
        if self.pre_lnorm:
            h = self.layer_norm(h)
        kv = self.kv_net(h).view(B, S, 2, self.n_head, self.d_head)
        k, v = kv.permute(2, 0, 3, 1, 4)                          # each (B, H, S, D)
        return k, v

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, need_usage=False):
        """
        h:        (B, T, C)     this segment's layer input
        mem_kv:   (k, v), each (B, H, S, D): keys and values of the S earlier positions ([cm ; m], line 5)
        r:        (K, C)        sinusoid R for distances K-1, ..., 0 (K = S + T)
        r_w_bias, r_r_bias: (H, D)  u and v
        attn_mask: (B, 1, T, K) bool, True where query i may attend key j
        need_usage: also return the attention mass each key received (manual path; for most_used)
        returns the layer's output (B, T, C), the keys and values of all K positions, and the usage (B, K) or None
        """
        B, T, C = h.shape
        H, D = self.n_head, self.d_head
        x = self.layer_norm(h) if self.pre_lnorm else h
        q = self.q_net(x).view(B, T, H, D).transpose(1, 2)       # (B, H, T, D)
        k_new, v_new = self.keys_values(h)
        k = torch.cat([mem_kv[0], k_new], dim=2)                  # (B, H, K, D)   [SG(cm ; m) ∘ h] W_{k,E}
        v = torch.cat([mem_kv[1], v_new], dim=2)                  # (B, H, K, D)
        K = k.size(2)
        r_k = self.r_net(r).view(K, H, D).transpose(0, 1)        # (H, K, D)      W_{k,R} R

        # terms (b) + (d): (q_i + v) · W_{k,R} R_{i-j}, computed for every distance then rel-shifted into place
        BD = torch.einsum('bhid,hjd->bhij', q + r_r_bias[:, None], r_k)   # (B, H, T, K), column c = distance K-1-c
        BD = rel_shift(BD)                                                # (B, H, T, K), column j = key j
        q_u = q + r_w_bias[:, None]                                       # terms (a) + (c): (q_i + u) · k_j

        usage = None
        if self.use_sdpa and not need_usage:
            # SDPA computes softmax(q_u k^T * scale + bias); the positional terms ride in the additive bias.
            bias = (BD * self.scale).masked_fill(~attn_mask, float('-inf')).to(k.dtype)
            attn_vec = F.scaled_dot_product_attention(q_u.to(k.dtype), k, v, attn_mask=bias,
                                                      dropout_p=self.dropatt_p if self.training else 0.0)
        else:
            AC = torch.einsum('bhid,bhjd->bhij', q_u, k)                  # (B, H, T, K)
            score = (AC + BD) * self.scale                                # A^rel / sqrt(d)
            score = score.masked_fill(~attn_mask, float('-inf'))
            prob = F.softmax(score.float(), dim=-1)
            if need_usage:
                usage = prob.detach().mean(1).sum(1)                      # (B, K) mass per key, mean over heads
            prob = self.dropatt(prob.to(v.dtype))
            attn_vec = torch.einsum('bhij,bhjd->bhid', prob, v)           # (B, H, T, D)

        attn_out = self.drop(self.o_net(attn_vec.transpose(1, 2).reshape(B, T, H * D)))   # (B, T, C)
        out = h + attn_out if self.pre_lnorm else self.layer_norm(h + attn_out)
        return out, (k, v), usage

    def content_attention(self, h, m, m_valid):
        """Algorithm 2, line 6: attn(h, m) = σ((hQ)(mK)ᵀ)(mV), the layer's content attention without positions,
        every weight under stop-gradient (line 5), so only whatever produced m can learn from it.
        h: (B, T, C) queries' states; m: (B, S, C) memories; m_valid: (B, S) bool. -> (B, H, T, D)"""
        B, T, C = h.shape
        S = m.size(1)
        H, D = self.n_head, self.d_head
        if self.pre_lnorm:
            ln = self.layer_norm
            h = F.layer_norm(h, (C,), ln.weight.detach(), ln.bias.detach(), ln.eps)
            m = F.layer_norm(m, (C,), ln.weight.detach(), ln.bias.detach(), ln.eps)
        q = F.linear(h, self.q_net.weight.detach()).view(B, T, H, D).transpose(1, 2)      # (B, H, T, D)
        kv = F.linear(m, self.kv_net.weight.detach()).view(B, S, 2, H, D)
        k, v = kv.permute(2, 0, 3, 1, 4)                                                   # each (B, H, S, D)
        score = torch.einsum('bhid,bhjd->bhij', q, k) * self.scale                         # (B, H, T, S)
        m_valid = m_valid | ~m_valid.any(1, keepdim=True)        # a row with nothing to compress: no NaN (unused)
        score = score.masked_fill(~m_valid[:, None, None, :], float('-inf'))
        return torch.einsum('bhij,bhjd->bhid', F.softmax(score.float(), dim=-1).to(v.dtype), v)


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = RelMultiHeadAttn(config)
        self.ff = PositionwiseFF(config.n_embd, config.d_inner, config.dropout, config.pre_lnorm)
        if config.cmem_len > 0:
            self.compress = Compression(config)                   # f_c^{(i)}
            if config.recon_loss == 'autoencoding':               # g: one compressed memory -> c memories
                self.decoder = nn.Linear(config.n_embd, config.compression_rate * config.n_embd)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, need_usage=False):
        h, kv, usage = self.attn(h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, need_usage)
        return self.ff(h), kv, usage


# -----------------------------------------------------------------------------------------------------------
# The model


class Model(nn.Module):
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
        self.ln_f = nn.LayerNorm(C) if config.pre_lnorm else nn.Identity()
        # the output layer is the embedding matrix (tied), see forward
        self.apply(self._init_weights)
        nn.init.normal_(self.r_w_bias, 0.0, config.init_std)
        nn.init.normal_(self.r_r_bias, 0.0, config.init_std)

    def _init_weights(self, module):
        # As model_xl.py (the Transformer-XL code's weights_init): N(0, init_std) weights, zero biases,
        # LayerNorm gains N(1, init_std); the compression convolutions like the linear layers.
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, ScaledEmbedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.normal_(module.weight, 1.0, std)
            nn.init.zeros_(module.bias)

    # --- memory -------------------------------------------------------------------------------------------

    def _spare(self):
        """Extra FIFO slots for an overflow that is not a whole number of groups (module docstring)."""
        return self.config.compression_rate - 1 if self.config.cmem_len > 0 else 0

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams (Algorithm 1, lines 1-2). mem_len overrides config.mem_len
        (n_m, e.g. a longer one at eval); the compressed memory keeps cmem_len slots."""
        c = self.config
        M = c.mem_len if mem_len is None else mem_len
        S = c.cmem_len + M + self._spare()
        dtype = self.word_emb.weight.dtype                       # float32 under autocast; the model's own if cast
        return Memory(mem=torch.zeros(c.n_layer, batch_size, S, c.n_embd, device=device, dtype=dtype),
                      cmem_length=torch.zeros(batch_size, dtype=torch.long, device=device),
                      mem_length=torch.zeros(batch_size, dtype=torch.long, device=device),
                      attn_mass=torch.zeros(c.n_layer, batch_size, S, device=device, dtype=dtype),
                      attn_queries=torch.zeros(batch_size, S, device=device, dtype=dtype))

    def reset_memory(self, memory, mask):
        """Empty both memories of the rows where mask (B,) is True, e.g. at a document boundary."""
        keep = ~mask
        return Memory(mem=memory.mem * keep[None, :, None, None].to(memory.mem.dtype),
                      cmem_length=memory.cmem_length * keep, mem_length=memory.mem_length * keep,
                      attn_mass=memory.attn_mass * keep[None, :, None].to(memory.attn_mass.dtype),
                      attn_queries=memory.attn_queries * keep[:, None].to(memory.attn_queries.dtype))

    @staticmethod
    def _memory_valid(memory):
        """(B, S) bool: the valid slots of the [cm ; m] buffer, the last cmem_length + mem_length."""
        S = memory.mem.size(2)
        first = S - memory.cmem_length - memory.mem_length
        return torch.arange(S, device=first.device)[None, :] >= first[:, None]

    def _update_memory(self, memory, hids, usage, queries, recon):
        """Algorithm 1, lines 8-11, for every layer at once and with fixed shapes.
        hids: (L, B, T, C) this segment's layer inputs h. usage: (L, B, S+T) attention mass each key received in
        this segment and queries: (B, S+T) how many queries saw it (most_used only, else None). recon: compute
        the reconstruction loss. Returns the new Memory and the reconstruction loss (or None)."""
        c = self.config
        L, B, S, C = memory.mem.shape
        T = hids.size(2)
        N, rate = c.cmem_len, c.compression_rate
        M = S - N - self._spare()                                 # n_m (init_memory's mem_len)
        x = torch.cat([memory.mem, hids.detach().to(memory.mem.dtype)], dim=2)   # (L, B, S+T, C) [cm ; m ; h], SG
        n_m = memory.mem_length + T                               # uncompressed states in x, right-aligned (B,)
        if N == 0:                                                # Transformer-XL: keep the last M, drop the rest
            new_mem, n_cm, n_keep = self._pack(memory, x, x.new_zeros(L, B, 0, C), 0, 0, n_m.clamp(max=M))
            return Memory(new_mem.detach(), n_cm, n_keep, memory.attn_mass, memory.attn_queries), None

        # line 8: old_mem = the oldest states that overflow m, in whole groups of c (the rest stays in m)
        n_new = (n_m - M).clamp(min=0) // rate                    # compressed slots to add (B,)
        G = (T + rate - 1) // rate                                # the most there can be (overflow <= T + c - 1)
        group = torch.arange(G, device=x.device)[None, :] - (G - n_new)[:, None]   # (B, G) k-th group, < 0: padding
        index = ((S + T - n_m)[:, None, None] + group[..., None] * rate
                 + torch.arange(rate, device=x.device))           # (B, G, c) positions in x, oldest first
        index = index.clamp(min=0).view(1, B, G * rate)
        old_mem = torch.gather(x, 2, index[..., None].expand(L, -1, -1, C)).view(L, B, G, rate, C)

        average_usage = None
        if usage is not None:                                     # running mass / queries per slot, then this one's
            mass = torch.cat([memory.attn_mass, memory.attn_mass.new_zeros(L, B, T)], dim=2) + usage   # (L, B, S+T)
            seen = torch.cat([memory.attn_queries, memory.attn_queries.new_zeros(B, T)], dim=1) + queries  # (B, S+T)
            average_usage = torch.gather(mass / seen.clamp(min=1), 2, index.expand(L, -1, -1))        # (L, B, G*c)
        # line 9: new_cm = f_c(old_mem), per layer
        new_cm = torch.stack([layer.compress(old_mem[n], n_new, None if usage is None else average_usage[n])
                              for n, layer in enumerate(self.layers)])                                # (L, B, G, C)
        recon_loss = self._recon_loss(hids, old_mem, new_cm, n_new) if recon and c.recon_loss != 'none' else None

        # lines 10-11: m keeps its newest states, cm appends new_cm and keeps its last N
        keep_graph = c.recon_loss == 'none' and self.training     # f_c then learns by BPTT (module docstring)
        new_mem, n_cm, n_keep = self._pack(memory, x, new_cm if keep_graph else new_cm.detach(), n_new,
                                           N, n_m - n_new * rate)
        attn_mass, attn_queries = memory.attn_mass, memory.attn_queries
        if usage is not None:                                     # the new compressed slots start at zero
            attn_mass, _, _ = self._pack(memory, mass, mass.new_zeros(L, B, G), n_new, N, n_m - n_new * rate)
            attn_queries, _, _ = self._pack(memory, seen[None], seen.new_zeros(1, B, G), n_new, N,
                                            n_m - n_new * rate)
            attn_queries = attn_queries[0]
        return Memory(new_mem, n_cm, n_keep, attn_mass, attn_queries), recon_loss

    @staticmethod
    def _pack(memory, x, new_cm, n_new, N, n_keep):
        """Write the new right-aligned buffer [cm ; m] of S slots: the last N of [old cm ; new_cm] then the last
        n_keep uncompressed states of x. x: (L, B, S+T, ...) the old buffer followed by this segment's h;
        new_cm: (L, B, G, ...) right-aligned, n_new (B,) real. Works on vectors and on per-slot scalars.
        Returns (L, B, S, ...) with zeros in the empty slots, and the new counts n_cm, n_keep."""
        L, B, S_T = x.shape[:3]
        G = new_cm.size(2)
        S = memory.mem.size(2)
        cl, ml = memory.cmem_length, memory.mem_length
        n_cm = (cl + n_new).clamp(max=N)                          # (B,)
        p = torch.arange(S, device=x.device)[None, :] - (S - n_cm - n_keep)[:, None]   # (B, S) place in the result
        q = p + (cl + n_new - n_cm)[:, None]                      # place in [old cm ; new_cm] (the compressed part)
        from_cm = torch.where(q < cl[:, None], (S - ml - cl)[:, None] + q,        # an old compressed slot, in x
                              (S_T + G - n_new - cl)[:, None] + q)                # a new one, in new_cm
        from_m = (S_T - n_keep - n_cm)[:, None] + p               # an uncompressed state, in x
        index = torch.where(p < n_cm[:, None], from_cm, from_m)
        valid = p >= 0
        index = torch.where(valid, index, 0).view(1, B, S, *[1] * (x.dim() - 3))
        source = torch.cat([x, new_cm], dim=2)                    # (L, B, S+T+G, ...)
        out = torch.gather(source, 2, index.expand(L, -1, -1, *x.shape[3:]))
        valid = valid.view(1, B, S, *[1] * (x.dim() - 3))
        return torch.where(valid, out, 0).contiguous(), n_cm, n_keep

    def _recon_loss(self, hids, old_mem, new_cm, n_new):
        """§3.1's auxiliary losses, summed over layers (Algorithm 2, line 8), averaged over the rows that
        compressed something in this segment. old_mem (L, B, G, c, C) is under stop-gradient (line 4); new_cm
        (L, B, G, C) carries the graph of f_c, which is all this loss trains."""
        L, B, G, rate, C = old_mem.shape
        real = torch.arange(G, device=old_mem.device)[None, :] >= (G - n_new)[:, None]   # (B, G) real groups
        rows = (n_new > 0).float()
        total = 0.0
        for n, layer in enumerate(self.layers):
            if self.config.recon_loss == 'attention':             # Algorithm 2, h under stop-gradient (line 3)
                h = hids[n].detach()
                target = layer.attn.content_attention(h, old_mem[n].reshape(B, G * rate, C),
                                                      real.repeat_interleave(rate, dim=1))
                error = (target - layer.attn.content_attention(h, new_cm[n], real)).float().pow(2).mean((1, 2, 3))
            else:                                                 # auto-encoding: ‖old_mem − g(new_cm)‖²
                decoded = layer.decoder(new_cm[n]).view(B, G, rate, C)
                error = ((old_mem[n] - decoded).float().pow(2) * real[:, :, None, None]).sum((1, 2, 3))
                error = error / (n_new * rate * C).clamp(min=1)
            total = total + (error * rows).sum() / rows.sum().clamp(min=1)
        return total

    # --- attention geometry, shared by forward and generate (as model_xl.py) ----------------------------------

    def _relative_positions(self, K, device):
        """R for the distances K-1, ..., 0 (clamped at clamp_len), with dropout as in the paper's code."""
        pos_seq = torch.arange(K - 1, -1, -1.0, device=device)
        if self.config.clamp_len > 0:
            pos_seq = pos_seq.clamp(max=self.config.clamp_len)
        return self.drop(self.pos_emb(pos_seq).to(self.word_emb.weight.dtype))   # (K, C)

    def _attn_mask(self, key_valid, T, mem_len):
        """key_valid: (B, K) bool over the K = S + T keys, the last T being the queries themselves.
        Query i sits at position S + i; it sees key j when j is valid and 0 <= (S + i) - j, and, with
        same_length, (S + i) - j < mem_len, so every query sees the same number of keys. -> (B, 1, T, K)"""
        K = key_valid.size(1)
        S = K - T
        i = torch.arange(T, device=key_valid.device)[:, None]
        j = torch.arange(K, device=key_valid.device)[None, :]
        distance = S + i - j                                      # (T, K)
        allowed = distance >= 0                                   # causal
        if self.config.same_length:
            allowed = allowed & (distance < max(mem_len, 1))
        return (allowed[None] & key_valid[:, None, :])[:, None]  # (B, 1, T, K)

    def _u_v(self, i):
        n = i if self.config.untie_r else 0
        return self.r_w_bias[n], self.r_r_bias[n]

    def _needs_usage(self):
        return self.config.cmem_len > 0 and self.config.compression == 'most_used'

    # --- forward ------------------------------------------------------------------------------------------

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len; memory: Memory. Returns (logits, loss, new_memory, aux);
        loss = LM loss + recon_weight * reconstruction loss, aux: 'lm_loss' and 'recon_loss'."""
        B, T = idx.shape
        if T > self.config.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={self.config.seg_len}")
        S = memory.mem.size(2)
        K = S + T
        key_valid = torch.cat([self._memory_valid(memory), idx.new_ones(B, T, dtype=torch.bool)], dim=1)  # (B, K)
        attn_mask = self._attn_mask(key_valid, T, S - self._spare())   # (B, 1, T, K); window cmem_len + mem_len
        r = self._relative_positions(K, idx.device)               # (K, C)
        need_usage = self._needs_usage()

        h = self.drop(self.word_emb(idx))                         # (B, T, C)  h^(1) (line 3)
        hids, usage = [], []
        for n, layer in enumerate(self.layers):                   # line 4
            hids.append(h)                                        # layer n's input: its memory to be
            mem_kv = layer.attn.keys_values(memory.mem[n])        # (B, H, S, D) x2, keys/values of [cm ; m] (line 5)
            h, _, layer_usage = layer(h, mem_kv, r, *self._u_v(n), attn_mask, need_usage)   # lines 6-7, 12
            usage.append(layer_usage)
        h = self.drop(self.ln_f(h))
        logits = F.linear(h, self.word_emb.weight)                # (B, T, V), tied output layer

        queries = attn_mask.sum((1, 2)).to(memory.attn_queries.dtype) if need_usage else None   # (B, K)
        new_memory, recon_loss = self._update_memory(memory, torch.stack(hids),                  # lines 8-11
                                                     torch.stack(usage) if need_usage else None, queries,
                                                     recon=targets is not None)
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
            if recon_loss is not None:
                aux['recon_loss'] = recon_loss.detach()
                loss = loss + self.config.recon_weight * recon_loss
        return logits, loss, new_memory, aux

    # --- bookkeeping for train.py -------------------------------------------------------------------------

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs (forward + backward) per token, for MFU, as model_xl.py's with the cmem_len + mem_len
        memory keys; f_c's weights are counted once per token (about one compression input per token), the
        reconstruction loss is left out."""
        c = self.config
        M = (c.mem_len if mem_len is None else mem_len) + c.cmem_len
        T, K, HD = c.seg_len, M + c.seg_len, c.n_head * c.d_head
        attention = 6 * 3 * c.n_layer * HD * K
        per_segment = 6 * c.n_layer * (2 * M * c.n_embd * HD + K * c.n_embd * HD) / T
        return 6 * self.num_params() + attention + per_segment

    # --- generation ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None):
        """Continue idx (B, T0) by max_new_tokens tokens; memory (optional) holds what came before idx.
        Keys and values are cached: each new token costs one position's work. The open segment's layer inputs
        (and, for most_used, the attention its keys received) are kept too, and when seg_len tokens are complete
        the memory is updated by the same _update_memory as forward() (Algorithm 1, compression included).
        callback(tokens (B, 1)) is called after each sampled token (sample.py streams text with it)."""
        c = self.config
        B = idx.size(0)
        if memory is None:
            memory = self.init_memory(B, idx.device)
        L, S = c.n_layer, memory.mem.size(2)
        need_usage = self._needs_usage()
        cache = key_valid = hids = usage = queries = None
        seg_pos = 0                                                     # tokens of the open segment

        def open_segment():
            nonlocal cache, key_valid, hids, usage, queries, seg_pos
            cache = [layer.attn.keys_values(memory.mem[n]) for n, layer in enumerate(self.layers)]
            key_valid = self._memory_valid(memory)                      # (B, S)
            hids = [[] for _ in range(L)]
            usage = memory.attn_mass.new_zeros(L, B, S + c.seg_len)
            queries = memory.attn_queries.new_zeros(B, S + c.seg_len)
            seg_pos = 0

        def step(tokens):
            nonlocal memory, key_valid, seg_pos
            T = tokens.size(1)
            key_valid = torch.cat([key_valid, key_valid.new_ones(B, T)], dim=1)
            K = key_valid.size(1)
            attn_mask = self._attn_mask(key_valid, T, S - self._spare())
            r = self._relative_positions(K, tokens.device)
            h = self.drop(self.word_emb(tokens))
            for n, layer in enumerate(self.layers):
                hids[n].append(h)
                h, cache[n], layer_usage = layer(h, cache[n], r, *self._u_v(n), attn_mask, need_usage)
                if need_usage:
                    usage[n, :, :K] += layer_usage
            if need_usage:
                queries[:, :K] += attn_mask.sum((1, 2))
            seg_pos += T
            if seg_pos == c.seg_len:                                    # segment complete: update as forward()
                memory, _ = self._update_memory(memory, torch.stack([torch.cat(hs, dim=1) for hs in hids]),
                                                usage if need_usage else None, queries if need_usage else None,
                                                recon=False)
                open_segment()
            h = self.ln_f(h[:, -1])
            return F.linear(h, self.word_emb.weight)                   # (B, V) logits of the last position

        open_segment()
        return decode(step, idx, max_new_tokens, c.seg_len, temperature, top_k, callback)
