"""Compressive Transformer (Rae, Potapenko, Jayakumar, Lillicrap, ICLR 2020, "Compressive Transformers for
Long-Range Sequence Modelling", arXiv 1911.05507), in one file.

Transformer-XL (model_xl.py) forgets a hidden state once it leaves its memory; the Compressive Transformer keeps it
in a second, coarser one. Per layer, m holds the last n_m = `mem_len` layer inputs (Transformer-XL's memory) and cm
n_cm = `cmem_len` compressed slots; the segment attends to [cm ; m ; h] with Transformer-XL's relative attention:
n_cm + n_m keys reach c·n_cm + n_m positions back (§3.3). cmem_len = 0 is model_xl.py exactly (tested).

Algorithm 1, per layer, segment h of n_s = `seg_len` tokens (the code cites its lines): h attends to
mem = concat(cm_t, m_t) (lines 5-6, relative positions as Transformer-XL); the oldest memories, old_mem = m_t[:n_s]
(8), become new_cm = f_c(old_mem), n_s/c slots, c = `compression_rate` (9); m_t+1 = concat(m_t, h)[-n_m:] (10);
cm_t+1 = concat(cm_t, new_cm)[-n_cm:] (11); worked example: the "Algorithm 1" section below. f_c (§3.2,
`compression`: max_pool, mean_pool, conv (kernel = stride = c), dilated_conv, most_used) learns from a local loss
(§3.2, `recon_loss`): `attention` (Algorithm 2), `autoencoding`, or `none` (the LM loss through time: Model.forward).

Deliberate deviations (also in the README):
  - As model_xl.py: BPE tokens, a full tied softmax, pre_lnorm's final LayerNorm, valid-slot counts.
  - A memory still filling up evicts nothing: nothing is compressed until m is full.
  - dilated_conv is ours (the paper gives no details): see Compression.
  - most_used ranks by average attention (mass received, mean over heads, per query that saw the slot).
  - Algorithm 2's attn() uses the 1/sqrt(d_head) scale; the losses are mean squared errors summed over layers.

Letters: B rows, T segment tokens (n_s), S = n_cm + n_m memory keys, K = S + T keys, G compressed slots a segment
makes, c = compression_rate, H heads, D = d_head, C = n_embd, L layers.
"""

import importlib.util
import math
from dataclasses import dataclass, is_dataclass, replace
from functools import partial
from typing import NamedTuple

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
    seg_len: int = 150        # n_s, tokens per segment (a multiple of compression_rate, as every paper setting)
    mem_len: int = 150        # n_m, FIFO memory slots per layer (a multiple of compression_rate); 0 = no memory
    clamp_len: int = 0        # relative distances above this share one embedding; 0 = no clamp
    same_length: bool = False  # every query attends to the same number (cmem_len + mem_len) of keys
    pre_lnorm: bool = False   # False: post-LN as in the paper; True: pre-LN (+ final LayerNorm)
    untie_r: bool = True      # True: u, v (r_w_bias, r_r_bias) per layer; False: one pair shared by all layers
    init_std: float = 0.02    # normal init of weights, as the Transformer-XL code
    attn_kernel: str = 'sdpa'  # as model_xl.py's: sdpa, einsum or triton; a step that needs the attention weights
                               # (most_used) runs the einsum
    # the Compressive Transformer's own
    cmem_len: int = 150       # n_cm, compressed memory slots per layer; 0 = Transformer-XL
    compression_rate: int = 3  # c: old memories per compressed slot (the paper: 3 on enwik8, 2 on PG-19)
    compression: str = 'conv'  # f_c: max_pool, mean_pool, conv, dilated_conv, most_used (§3.2; conv was best)
    recon_loss: str = 'attention'  # f_c's loss: attention (Algorithm 2, the paper's best), autoencoding, none
    recon_weight: float = 1.0  # loss = LM loss + recon_weight * reconstruction loss

    def __post_init__(self):
        lowest = dict.fromkeys(('vocab_size', 'n_layer', 'n_head', 'n_embd', 'd_head', 'd_inner', 'seg_len'), 1)
        for name, low in {**lowest, 'compression_rate': 1, 'mem_len': 0, 'clamp_len': 0, 'cmem_len': 0}.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        for name in ('dropout', 'dropatt'):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.n_embd % 2:
            raise ValueError(f"n_embd must be even (sinusoid positions), got {self.n_embd}")
        check_attn_kernel(self, ('sdpa', 'einsum', 'triton'))
        for name, choices in (('compression', COMPRESSIONS), ('recon_loss', RECON_LOSSES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if not self.recon_weight >= 0.0:
            raise ValueError(f"recon_weight must be >= 0, got {self.recon_weight}")
        if self.cmem_len > 0 and self.mem_len == 0:
            raise ValueError("cmem_len > 0 needs mem_len > 0: the compressed memory is filled from the memory")
        if self.cmem_len > 0 and (self.seg_len % self.compression_rate or self.mem_len % self.compression_rate):
            raise ValueError(f"seg_len ({self.seg_len}) and mem_len ({self.mem_len}) must be multiples of "
                             f"compression_rate ({self.compression_rate}): each segment evicts whole groups of c")


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
    """Fixed shapes (torch.compile compiles once): right-aligned, oldest first, valid slots the last `*_length`."""
    cmem: torch.Tensor          # (n_layer, B, cmem_len, n_embd) cm: the compressed memory
    cmem_length: torch.Tensor   # (B,) int64, valid compressed slots
    mem: torch.Tensor           # (n_layer, B, mem_len, n_embd) m: each layer's input states, as Transformer-XL
    mem_length: torch.Tensor    # (B,) int64, valid slots of m
    attn_mass: torch.Tensor     # (n_layer, B, mem_len) attention m's slots received so far, mean over heads
    attn_queries: torch.Tensor  # (B, mem_len) how many queries have seen each slot of m (most_used only)


class Usage(NamedTuple):
    """The attention a segment's keys [cm ; m ; h] received (most_used), mean over heads; the queries that saw them."""
    mass: torch.Tensor     # (n_layer, B, K)
    queries: torch.Tensor  # (B, K)


class Compressed(NamedTuple):
    """Line 9 of one segment, every layer: what the reconstruction losses compare."""
    old_mem: torch.Tensor  # (L, B, G, c, C) the evicted states in groups of c, under stop-gradient
    n_new: torch.Tensor    # (B,) how many groups are real: the last n_new of the G (the rest is padding)
    new_cm: torch.Tensor   # (L, B, G, C) f_c(old_mem), with f_c's graph


@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it into the memory, in buffers of fixed shape,
    as model_xl.py's: K = S + seg_len slots, [concat(cm, m) ; tokens so far] at the right end (cm and m each right-
    aligned with its own length, hence a mask of valid slots), padding at the left; a step of T tokens slides by T."""
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of the K slots
    hids: torch.Tensor       # (n_layer, B, seg_len, C) the layers' inputs h of the last seg_len tokens (lines 8, 10)
    usage: Usage             # the attention the K slots received so far, sliding with them (most_used, else None)
    r_k: list                # per layer W_{k,R} R (H, K, D) for the distances K-1, ..., 0


# -----------------------------------------------------------------------------------------------------------
# Compression functions f_c (§3.2)

class Compression(nn.Module):
    """f_c^{(i)}, one layer's compression function: groups of c old memories (B, G, c, C) -> one compressed memory
    each (B, G, C).
      max_pool, mean_pool  pooling over time, kernel = stride = c (no parameters)
      conv                 Conv1d over time, kernel = stride = c, n_embd channels in and out
      dilated_conv         ours (the paper gives no details): a WaveNet-style tree, ⌈log2 c⌉ Conv1d of kernel 2,
                           dilations 1, 2, 4, ..., ReLU between, over the group left-padded to 2^⌈log2 c⌉ positions"""

    def __init__(self, config):
        super().__init__()
        self.kind, c, C = config.compression, config.compression_rate, config.n_embd
        if self.kind == 'conv':
            self.conv = nn.Conv1d(C, C, kernel_size=c, stride=c)
        elif self.kind == 'dilated_conv':
            levels = max(1, math.ceil(math.log2(c)))
            self.width = 2 ** levels
            self.convs = nn.ModuleList([nn.Conv1d(C, C, kernel_size=2, dilation=2 ** i) for i in range(levels)])

    def forward(self, groups):
        if self.kind == 'max_pool':
            return groups.amax(2)
        if self.kind == 'mean_pool':
            return groups.mean(2)
        B, G, c, C = groups.shape
        if self.kind == 'conv':   # Conv1d (kernel = stride = c) as one product over a group's c·C values, same weights:
            # a training step 1.08x faster under torch.compile than self.conv (1.03x eager; speed.py's matched size)
            weight = self.conv.weight.permute(0, 2, 1).reshape(C, c * C)
            return F.linear(groups.reshape(B, G, c * C), weight, self.conv.bias)   # (B, G, C)
        x = groups.reshape(B * G, c, C).transpose(1, 2)          # dilated_conv: (B*G, C, c), channels first
        x = F.pad(x, (self.width - c, 0))                         # (B*G, C, 2^levels), zeros before the group
        for level, conv in enumerate(self.convs):
            x = conv(x)                                           # length shrinks by the dilation 2^level
            if level < len(self.convs) - 1:
                x = F.relu(x)                                     # (B*G, C, 1) after the last level
        return x.reshape(B, G, C)

    def macs_per_slot(self):
        """Multiply-adds of one compressed slot, forward and backward: dilated_conv's level l has width + 1 - 2^(l+1)
        outputs; backward, every level's input but the first (old_mem, SG) gets a gradient too."""
        if self.kind == 'conv':
            return self.conv.weight.numel(), self.conv.weight.numel()
        if self.kind == 'dilated_conv':
            level = [conv.weight.numel() * (self.width + 1 - 2 ** (l + 1)) for l, conv in enumerate(self.convs)]
            return sum(level), sum(level) + sum(level[1:])
        return 0, 0                                               # no weights, nothing multiplied


def most_used(groups, n_new, usage):
    """f_c = most_used, without parameters: of the groups of c old memories (B, G, c, C), row b's real ones its last
    n_new[b], keep the n_new memories of the highest usage (B, G*c: each one's average attention; padding last, ties
    to the older), in time order. -> (B, G, C)"""
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
# The memory update: Algorithm 1, lines 8-11, as small pure functions on right-aligned, fixed-shape memories.
# Worked example: n_s = seg_len = 4, n_m = mem_len = 8, n_cm = cmem_len = 4, c = compression_rate = 2; one row
# of one layer; "k" is the state of token k, "_" an empty slot, f(a,b) the slot f_c makes of states a and b.
#   segments 1-2, tokens 0-7 m = [_ _ _ _ 0 1 2 3], then [0 1 2 3 4 5 6 7], full; only empty slots fall out
#   segment 3, tokens 8-11   concat(m, h) = [0 1 2 3 4 5 6 7 | 8 9 10 11]
#                            old_mem = the 4 that fall out = [0 1 2 3] = m_t[:n_s]               line 8
#                            groups of c: (0 1) (2 3) -> new_cm = [f(0,1) f(2,3)]                  line 9
#                            m = [4 5 6 7 8 9 10 11]                                             line 10
#                            cm = last 4 of [_ _ _ _ | f(0,1) f(2,3)] = [_ _ f(0,1) f(2,3)]       line 11
#   segment 4, tokens 12-15  old_mem = [4 5 6 7]; cm = [f(0,1) f(2,3) f(4,5) f(6,7)], full
#   segment 5, tokens 16-19  old_mem = [8 9 10 11]; cm = [f(4,5) f(6,7) f(8,9) f(10,11)]: f(0,1), f(2,3) are gone
#   segment 6 attends to [cm ; m ; h]: 4 + 8 memory keys reaching c·4 + 8 = 16 tokens back.
# cm fills only once m is full, and m stays full from then on, so the valid slots of concat(cm, m) are contiguous
# and every new_cm pushed into a non-empty cm is whole (no padding in between).


def right_aligned(n_slots, length):
    """(B, n_slots) bool: the valid slots of a right-aligned memory of n_slots holding length (B,) entries."""
    return torch.arange(n_slots, device=length.device)[None, :] >= (n_slots - length)[:, None]


def memory_valid(memory):
    """(B, S) bool: the valid slots of concat(cm, m), S = cmem_len + mem_len (contiguous: see above)."""
    return torch.cat([right_aligned(memory.cmem.size(2), memory.cmem_length),
                      right_aligned(memory.mem.size(2), memory.mem_length)], dim=1)


def push_fifo(slots, new):
    """concat(slots, new)[-n:] with n = slots.size(2) (lines 10 and 11), and the new.size(2) oldest slots, which
    fall out (line 8: old_mem = m_t[:n_s]). slots (L, B, n, ...), new (L, B, T, ...): states or per-slot values."""
    T = new.size(2)
    both = torch.cat([slots, new], dim=2)                         # (L, B, n+T, ...)
    return both[:, :, T:], both[:, :, :T]


def group_evicted(old_mem, n_old, rate):
    """Line 9's input: the T slots that fell out of m (L, B, T, ...), the last n_old (B,) real, as groups of c
    (L, B, T // c, c, ...), and how many (the last) are real; the oldest n_old mod c states are forgotten."""
    L, B, T = old_mem.shape[:3]
    G = T // rate
    return old_mem[:, :, T - G * rate:].reshape(L, B, G, rate, *old_mem.shape[3:]), n_old // rate


def update_memory(memory, hids, usage, layers, rate, keep_graph=False):
    """Algorithm 1, lines 8-11, every layer at once. hids (L, B, T, C): the segment's layer inputs h; usage (most_used,
    else None); layers: their f_c; keep_graph: new_cm keeps f_c's graph (recon_loss='none', see Model.forward).
    -> the new Memory and, for the reconstruction losses, what line 9 did (None when cmem_len = 0)."""
    T, n_cm, n_m = hids.size(2), memory.cmem.size(2), memory.mem.size(2)
    mem, old_mem = push_fifo(memory.mem, hids.detach().to(memory.mem.dtype))   # lines 10 and 8, SG(h)
    mem_length = (memory.mem_length + T).clamp(max=n_m)
    n_old = memory.mem_length + T - mem_length                    # states that fell out of m (B,), right-aligned
    if n_cm == 0:                                                 # Transformer-XL: they are forgotten
        return replace(memory, mem=mem.contiguous(), mem_length=mem_length), None
    attn_mass, attn_queries, old_usage = memory.attn_mass, memory.attn_queries, [None] * len(layers)
    if usage is not None:   # most_used's bookkeeping: m's running attention mass and query count, through the FIFO
        mass, seen = usage.mass[:, :, n_cm:], usage.queries[None, :, n_cm:]              # of the keys [m ; h]
        attn_mass, old_mass = push_fifo(attn_mass + mass[:, :, :n_m], mass[:, :, n_m:])
        attn_queries, old_seen = push_fifo(attn_queries[None] + seen[:, :, :n_m], seen[:, :, n_m:])
        attn_mass, attn_queries = attn_mass.contiguous(), attn_queries[0].contiguous()
        old_usage = group_evicted(old_mass / old_seen.clamp(min=1), n_old, rate)[0].flatten(2)   # (L, B, G*c) average
    groups, n_new = group_evicted(old_mem, n_old, rate)          # (L, B, G, c, C), n_new (B,) real groups
    if usage is None:
        new_cm = torch.stack([layer.compress(groups[n]) for n, layer in enumerate(layers)])
    else:                                                         # most_used: the most attended states, no f_c
        new_cm = torch.stack([most_used(groups[n], n_new, old_usage[n]) for n in range(len(layers))])
    new_cm = torch.where(right_aligned(groups.size(2), n_new)[None, :, :, None], new_cm, 0)   # line 9, (L, B, G, C)
    cmem, _ = push_fifo(memory.cmem, new_cm if keep_graph else new_cm.detach())          # line 11
    cmem_length = (memory.cmem_length + n_new).clamp(max=n_cm)
    return (Memory(cmem.contiguous(), cmem_length, mem.contiguous(), mem_length, attn_mass, attn_queries),
            Compressed(groups, n_new, new_cm))


# -----------------------------------------------------------------------------------------------------------
# The auxiliary compression losses (§3.2)

def content_attention(q, k, v, key_valid, scale):
    """Algorithm 2, line 6: attn(h, m) = σ((hQ)(mK)ᵀ)(mV), the layer's content attention without positions, from
    the queries q = hQ (B, H, T, D) and the keys mK and values mV (B, H, S, D), key_valid (B, S). -> (B, H, T, D)"""
    key_valid = key_valid | ~key_valid.any(1, keepdim=True)      # a row with nothing to compress: no NaN (unused)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_valid[:, None, None, :], scale=scale)


def reconstruction_loss(kind, layers, compressed, qkv, n_cm):
    """f_c's local loss (§3.2), summed over layers (Algorithm 2, line 8), averaged over the rows that compressed
    something; only f_c learns from it. compressed: this segment's line 9; qkv: per layer, the forward's queries
    (B, H, T, D), keys and values (B, H, n_cm + n_m + T, D) of [cm ; m ; h].
      attention     Algorithm 2: ‖attn(h, old_mem) − attn(h, new_cm)‖²
      autoencoding  ‖old_mem − g(new_cm)‖², g the layer's decoder"""
    old_mem, n_new, new_cm = compressed
    L, B, G, rate, C = old_mem.shape
    real = right_aligned(G, n_new)                                # (B, G) real groups
    rows, total = (n_new > 0).float(), 0.0                        # (B,) rows that compressed something
    for n, layer in enumerate(layers):
        if kind == 'attention':
            # the forward's projections, detached, are SG(h)SG(Q), SG(old_mem)SG(K), SG(old_mem)SG(V) (lines 3-5):
            # old_mem, the first T of [m ; h] (line 8), has keys n_cm ... n_cm+T, of which the last n_new·c are real
            q, k, v = (x.detach() for x in qkv[n])
            T = q.size(2)
            old = slice(n_cm, n_cm + T)
            target = content_attention(q, k[:, :, old], v[:, :, old], right_aligned(T, n_new * rate), layer.attn.scale)
            prediction = content_attention(q, *layer.attn.keys_values_sg(new_cm[n]), real, layer.attn.scale)
            error = (target - prediction).float().pow(2).mean((1, 2, 3))
        else:
            decoded = layer.decoder(new_cm[n]).view(B, G, rate, C)
            error = ((old_mem[n] - decoded).float().pow(2) * real[:, :, None, None]).sum((1, 2, 3))
            error = error / (n_new * rate * C).clamp(min=1)
        total = total + (error * rows).sum() / rows.sum().clamp(min=1)
    return total


def compression_flops(config, f_c):
    """Training FLOPs of f_c and its loss per layer and full segment (G = T/c slots), 2 a multiply-add; norms, softmax
    and pooling not counted, nor recon_loss='none''s gradients through time (--bptt_segments > 1)."""
    T, C, HD, c = config.seg_len, config.n_embd, config.n_head * config.d_head, config.compression_rate
    G = T // c
    forward, backward = f_c.macs_per_slot()             # (0, 0) for an f_c without weights: nothing to learn
    grad = 2 if backward > 0 and config.recon_loss != 'none' else 0   # FLOPs a multiply-add of a gradient to f_c
    flops = G * (2 * forward + grad * backward)         # f_c
    if config.recon_loss == 'autoencoding':
        flops += (2 + 2 + grad) * G * c * C * C         # g: forward, weight gradient, gradient to new_cm
    elif config.recon_loss == 'attention':              # Algorithm 2, the T queries' content attention:
        flops += 2 * 2 * T * T * HD                     # over old_mem (T keys), q·k and p·v: forward only (all SG)
        flops += (2 + grad) * 2 * G * C * HD            # new_cm's keys and values (weights SG): gradient to new_cm
        flops += (2 * 2 + 4 * grad) * T * G * HD        # over new_cm: q·k, p·v; backward dp, dk, dv, unused dq
    return flops


# -----------------------------------------------------------------------------------------------------------
# Relative attention over [compressed memory ; memory ; segment]

# Copied from model_xl.py (RelMultiHeadAttn) with forward(..., attn_mask) -> forward(..., attn_mask, need_usage),
# which also returns the queries (Algorithm 2) and the mass each key received (most_used), and keys_values_sg added
class RelMultiHeadAttn(nn.Module):
    # Copied from model_xl.py (RelMultiHeadAttn.__init__)
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

    def keys_values_sg(self, m):
        """keys_values(m) with every weight under stop-gradient (Algorithm 2, line 5): only m's maker learns."""
        B, S, C = m.shape
        if self.pre_lnorm:
            ln = self.layer_norm
            m = F.layer_norm(m, (C,), ln.weight.detach(), ln.bias.detach(), ln.eps)
        kv = F.linear(m, self.kv_net.weight.detach()).view(B, S, 2, self.n_head, self.d_head)
        return kv.permute(2, 0, 3, 1, 4).unbind(0)               # k, v: each (B, H, S, D)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, need_usage=False):
        """model_xl.py's arguments, mem_kv those of [cm ; m] (line 5); need_usage: also the attention mass each key
        received (manual path). -> out (B, T, C), (k, v) (B, H, K, D), the queries (B, H, T, D), usage (B, K) or None"""
        B, T, C = h.shape
        H, D = self.n_head, self.d_head
        x = self.layer_norm(h) if self.pre_lnorm else h
        q = self.q_net(x).view(B, T, H, D).transpose(1, 2)       # (B, H, T, D)
        k_new, v_new = self.keys_values(h)
        k = torch.cat([mem_kv[0], k_new], dim=2)                  # (B, H, K, D)   [SG(cm ; m) ∘ h] W_{k,E}
        v = torch.cat([mem_kv[1], v_new], dim=2)                  # (B, H, K, D)
        r_k = self.project_positions(r) if r.dim() == 2 else r   # (H, K, D)      W_{k,R} R

        q_u = q + r_w_bias[:, None]                                       # terms (a) + (c): (q_i + u) · k_j
        q_v = q + r_r_bias[:, None]                                       # terms (b) + (d): (q_i + v) · W_{k,R} R

        usage = None
        if self.attn_kernel == 'einsum' or need_usage:                    # the reference: §3.3 written out
            BD = torch.einsum('bhid,hjd->bhij', q_v, r_k)                 # (B, H, T, K), column c = distance K-1-c
            BD = rel_shift(BD)                                            # (B, H, T, K), column j = key j
            AC = torch.einsum('bhid,bhjd->bhij', q_u, k)                  # (B, H, T, K)
            score = (AC + BD) * self.scale                                # A^rel / sqrt(d)
            score = score.masked_fill(~attn_mask, float('-inf'))
            prob = F.softmax(score.float(), dim=-1)
            if need_usage:
                usage = prob.detach().mean(1).sum(1)                      # (B, K) mass per key, mean over heads
            prob = self.dropatt(prob.to(v.dtype))
            attn_vec = torch.einsum('bhij,bhjd->bhid', prob, v)           # (B, H, T, D)
        elif self.attn_kernel == 'sdpa':
            # SDPA computes softmax(q_u k^T * scale + bias); the positional terms ride in the additive bias.
            BD = rel_shift(torch.einsum('bhid,hjd->bhij', q_v, r_k))     # (B, H, T, K), as above
            bias = (BD * self.scale).masked_fill(~attn_mask, float('-inf')).to(k.dtype)
            attn_vec = F.scaled_dot_product_attention(q_u.to(k.dtype), k, v, attn_mask=bias,
                                                      dropout_p=self.dropatt_p if self.training else 0.0)
        else:                                                             # 'triton': the same, in one kernel
            # each tile of scores takes (b) + (d) from a band of r_k: no (T, K) scores or bias in memory
            attn_vec, _ = self.rel_attention(q, r_w_bias, r_r_bias, k, v, r_k, attn_mask, self.scale)   # (B, H, T, D)

        attn_out = self.drop(self.o_net(attn_vec.transpose(1, 2).reshape(B, T, H * D)))   # (B, T, C)
        out = h + attn_out if self.pre_lnorm else self.layer_norm(h + attn_out)
        return out, (k, v), q, usage


# Copied from model_xl.py (Block) with f_c (compress), g (decoder, autoencoding) and need_usage (queries, usage) added
class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = RelMultiHeadAttn(config)
        self.ff = PositionwiseFF(config.n_embd, config.d_inner, config.dropout, config.pre_lnorm)
        if config.cmem_len > 0:
            self.compress = Compression(config)                   # f_c^{(i)} (most_used: none, see most_used)
            if config.recon_loss == 'autoencoding':               # g: one compressed memory -> c memories
                self.decoder = nn.Linear(config.n_embd, config.compression_rate * config.n_embd)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, need_usage=False):
        h, kv, q, usage = self.attn(h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, need_usage)
        return self.ff(h), kv, q, usage


# -----------------------------------------------------------------------------------------------------------
# The model

class Model(nn.Module):
    # Copied from model_xl.py (Model.__init__)
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
        self.apply(self._init_weights)
        nn.init.normal_(self.r_w_bias, 0.0, config.init_std)
        nn.init.normal_(self.r_r_bias, 0.0, config.init_std)

    # Copied from model_xl.py (Model._init_weights) with nn.Linear->(nn.Linear, nn.Conv1d): f_c's convolutions too
    def _init_weights(self, module):
        # As the paper's code (weights_init with init='normal'): N(0, init_std) weights, zero biases,
        # LayerNorm gains N(1, init_std).
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

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams (Algorithm 1, lines 1-2); mem_len overrides n_m, not n_cm."""
        L, B, C, n_cm = self.config.n_layer, batch_size, self.config.n_embd, self.config.cmem_len
        n_m = self.config.mem_len if mem_len is None else mem_len
        zeros = partial(torch.zeros, device=device, dtype=self.word_emb.weight.dtype)   # float32 under autocast
        return Memory(cmem=zeros(L, B, n_cm, C), cmem_length=zeros(B, dtype=torch.long), mem=zeros(L, B, n_m, C),
                      mem_length=zeros(B, dtype=torch.long), attn_mass=zeros(L, B, n_m), attn_queries=zeros(B, n_m))

    def reset_memory(self, memory, mask):
        """Empty both memories of the rows where mask (B,) is True, e.g. at a document boundary."""
        keep = (~mask).to(memory.mem.dtype)
        return Memory(memory.cmem * keep[None, :, None, None], memory.cmem_length * ~mask,      # cm
                      memory.mem * keep[None, :, None, None], memory.mem_length * ~mask,        # m
                      memory.attn_mass * keep[None, :, None], memory.attn_queries * keep[:, None])   # most_used

    # Copied from model_xl.py (Model._relative_positions)
    def _relative_positions(self, K, device):
        """R for the distances K-1, ..., 0 (clamped at clamp_len), with dropout as in the paper's code."""
        pos_seq = torch.arange(K - 1, -1, -1.0, device=device)
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

    # Copied from model_xl.py (Model._u_v)
    def _u_v(self, i):
        n = i if self.config.untie_r else 0
        return self.r_w_bias[n], self.r_r_bias[n]

    def _need_usage(self):
        """most_used compresses by the attention each slot of m received: the attention must report it (Usage)."""
        return self.config.cmem_len > 0 and self.config.compression == 'most_used'

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len. -> logits, LM loss + recon_weight * reconstruction loss, new_memory, aux"""
        config = self.config
        B, T = idx.shape
        if T > config.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={config.seg_len}")
        mem = torch.cat([memory.cmem, memory.mem], dim=2)         # (L, B, S, C) concat(cm, m), line 5
        S = mem.size(2)
        key_valid = torch.cat([memory_valid(memory), idx.new_ones(B, T, dtype=torch.bool)], dim=1)  # (B, S+T)
        attn_mask = self._attn_mask(key_valid, T, S)              # (B, 1, T, S+T); window cmem_len + mem_len
        r = self._relative_positions(S + T, idx.device)           # (S+T, C)
        need_usage = self._need_usage()
        h = self.drop(self.word_emb(idx))                         # (B, T, C)  h^(1) (line 3)
        hids, qkv, usage = [], [], []
        for n, layer in enumerate(self.layers):                   # line 4
            hids.append(h)                                        # layer n's input: its memory to be
            mem_kv = layer.attn.keys_values(mem[n])               # (B, H, S, D) x2, keys/values of concat(cm, m)
            h, (k, v), q, layer_usage = layer(h, mem_kv, r, *self._u_v(n), attn_mask, need_usage)   # lines 6-7, 12
            qkv.append((q, k, v))                                 # Algorithm 2 reuses them
            usage.append(layer_usage)
        logits = F.linear(self.drop(self.ln_f(h)), self.word_emb.weight)   # (B, T, V), tied output layer
        usage = Usage(torch.stack(usage), attn_mask.sum((1, 2)).to(memory.attn_queries.dtype)) if need_usage else None
        new_memory, compressed = update_memory(memory, torch.stack(hids), usage, self.layers, config.compression_rate,
                                               keep_graph=config.recon_loss == 'none' and self.training)   # BPTT f_c
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
            if compressed is not None and config.recon_loss != 'none':
                recon_loss = reconstruction_loss(config.recon_loss, self.layers, compressed, qkv, config.cmem_len)
                aux['recon_loss'] = recon_loss.detach()
                loss = loss + config.recon_weight * recon_loss
            elif compressed is not None and self.training:
                # recon_loss='none': only the LM loss trains f_c, through time (§3.2, Table 5's "BPTT"; keep_graph).
                # Where none reaches it (--bptt_segments=1, a filling memory) DDP still waits: f_c joins with weight 0.
                loss = loss + 0.0 * sum(p.sum() for layer in self.layers for p in layer.compress.parameters())
        return logits, loss, new_memory, aux

    # Copied from model_xl.py (Model.num_params)
    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs (forward + backward) per token, for MFU: model_xl.py's count (its docstring) over cmem_len +
        mem_len memory keys, plus f_c and its loss once per compressed slot (compression_flops), not once per token."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()      # the weights of products but f_c's
                       if name.endswith('weight') and p.dim() > 1           # and g's (biases, norms, u and v take
                       and '.compress.' not in name and '.decoder.' not in name)   # none)
        S = (c.mem_len if mem_len is None else mem_len) + c.cmem_len
        T, K, C, HD = c.seg_len, S + c.seg_len, c.n_embd, c.n_head * c.d_head
        weights = 6 * (matrices - c.n_layer * C * HD)             # every other weight but W_{k,R}, once a token
        attention = 6 * 3 * c.n_layer * HD * K                    # (a)+(c), (b)+(d) and the values, over K keys
        memory = 4 * c.n_layer * S * C * 2 * HD / T               # [SG(cm) ; SG(m)]'s keys and values
        compression = c.n_layer * compression_flops(c, self.layers[0].compress) / T if c.cmem_len > 0 else 0
        return weights + attention + memory + compression

    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T) on memory, in a new OpenSegment or in seg's buffers (decode() reuses them):
        concat(cm, m)'s keys and values (line 5), W_{k,R} R, no usage yet. -> logits (B, V) of the last, OpenSegment"""
        c, B = self.config, tokens.size(0)
        mem = torch.cat([memory.cmem, memory.mem], dim=2)             # (L, B, S, C) concat(cm, m)
        K, pad = mem.size(2) + c.seg_len, (0, 0, c.seg_len, 0)        # seg_len empty slots on the left
        kv = [layer.attn.keys_values(m) for layer, m in zip(self.layers, mem)]
        r = self._relative_positions(K, tokens.device)               # (K, C)
        usage = None
        if self._need_usage():
            usage = Usage(memory.attn_mass.new_zeros(c.n_layer, B, K), memory.attn_queries.new_zeros(B, K))
        seg = refill(seg, OpenSegment(key_valid=F.pad(memory_valid(memory), pad[2:]),
                                      kv=[tuple(F.pad(x, pad) for x in xs) for xs in kv],
                                      hids=memory.mem.new_zeros(c.n_layer, B, c.seg_len, c.n_embd), usage=usage,
                                      r_k=[layer.attn.project_positions(r) for layer in self.layers]))
        return self.step(tokens, seg, tokens.size(1)), seg

    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg (lines 6-7, 12), which it updates in place; most_used: the
        mass each slot received slides with it. filled: as model_xl.py's (the step skips the seg_len - filled padding
        slots on the left; None: it reads them too, as a graph wants). -> logits (B, V) of the last"""
        T, S, usage = tokens.size(1), 0 if filled is None else self.config.seg_len - filled, seg.usage
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K-S)
        attn_mask = self._attn_mask(key_valid, T, seg.key_valid.size(1) - self.config.seg_len)   # (B, 1, T, K-S)
        h = self.drop(self.word_emb(tokens))                           # (B, T, C)
        hids, mass = [], []
        for n, layer in enumerate(self.layers):
            hids.append(h)
            k, v = (x[:, :, S:] for x in seg.kv[n])                    # the slots it reads, less the T oldest below
            h, (k_new, v_new), _, layer_usage = layer(h, (k[:, :, T:], v[:, :, T:]), seg.r_k[n][:, S:],
                                                      *self._u_v(n), attn_mask, usage is not None)
            k.copy_(k_new)
            v.copy_(v_new)
            mass.append(layer_usage)
        if usage is not None:                                          # the T oldest (padding) out, T zeros in
            usage.mass[:, :, S:] = F.pad(usage.mass[:, :, S + T:], (0, T)) + torch.stack(mass)
            usage.queries[:, S:] = F.pad(usage.queries[:, S + T:], (0, T)) + attn_mask.sum((1, 2))
        seg.key_valid[:, S:] = key_valid
        seg.hids[:, :, S:] = torch.cat([seg.hids[:, :, S + T:], torch.stack(hids).to(seg.hids.dtype)], dim=2)
        return F.linear(self.ln_f(h[:, -1]), self.word_emb.weight)    # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it (Algorithm 1, lines 8-11)."""
        return update_memory(memory, seg.hids, seg.usage, self.layers, self.config.compression_rate)[0]

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
