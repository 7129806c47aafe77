"""GPT-2 with a compressed memory and an attention positional bias: the Compressive baseline of the ∞-former paper's
language-modelling experiments (Martins, Marinho, Martins, ACL 2022, "∞-former: Infinite Memory Transformer",
arXiv 2109.00301, §4.2 and Table 1), in one file.

§4.2 fine-tunes GPT-2 small (Radford et al. 2019) with input L = 512 and extends it "with a compressed memory
(compressive transformer) with a positional bias, based on Press et al. (2021)" of size 512. GPT-2's learned
positions (wpe) only place the n_positions tokens of one input, so they cannot place memory slots; the memory keys
get ALiBi's linear distance bias instead (Press, Smith, Lewis 2021, "Train Short, Test Long", arXiv 2108.12409).
Query i of the segment sits at S + i of the keys [cm ; m ; segment], S = n_cm + n_m memory slots, and scores key j as
    q_i·k_j / √D - m_h (S + i - j)    when j < S is a memory slot (`alibi`: ALiBi, Press et al. §3)
    q_i·k_j / √D                      when j is a token of the segment (GPT-2's own attention, positions 0..T-1)
with ALiBi's head slopes m_h = 2^(-8h/H), h = 1..H (H a power of 2; otherwise their interleaving, alibi_slopes).
Distances count one per slot, as the Compressive Transformer's relative positions do (model_compressive.py): the
newest memory slot is i + 1 away, a compressed slot counts one position, not c. Inside the segment there is no bias:
its tokens keep the learned positions GPT-2 was pretrained with. So with the memory empty the model is
GPT-2 exactly (tested against transformers' GPT2LMHeadModel); alibi=False leaves the memory slots unbiased.

The memory is the Compressive Transformer's (Rae et al. 2020; model_compressive.py, Algorithm 1): per layer, m the
last n_m = `mem_len` layer inputs and cm n_cm = `cmem_len` slots made by f_c (`compression`, rate c =
`compression_rate`) of the states that leave m, trained by the attention-reconstruction loss (Algorithm 2,
`recon_loss`). §4.2 names only the compressed memory, "of size 512", with the computational budget of the
∞-former's N = 512 basis functions. The authors' repository (deep-spin/infinite-former, finetune_gpt2/) ships the
∞-former's GPT-2 code but not this baseline's, only its switches: `compressive`, `compression_rate` 2
(infinite_memory_transformer/config.json), a trainer that adds the compression loss to the LM loss (weight 1) and
trains parameters named "compress" at learning_rate_ltm 2.5e-4 against GPT-2's 5e-5. Hence the defaults: mem_len = 0
(no FIFO: each segment's own layer inputs are compressed when it ends, as the authors' ∞-former GPT-2 hands each
segment to its long-term memory), cmem_len = 512, c = 2, conv, attention reconstruction, compress_lr_mult 5;
mem_len > 0 adds Rae et al.'s FIFO memory. Left out: most_used (it needs the attention weights, which the fused
attention does not give). f_c starts at init (N(0, init_std)), the loader filling only GPT-2's part.

Parameter names of the GPT-2 part are those of transformers' GPT2LMHeadModel (nn.Linear where it has Conv1D: the
loader transposes them); f_c and g live under transformer.h.{i}.compress / .decoder, which the loader leaves alone.

Letters: B rows, T segment tokens, S = n_cm + n_m memory slots, K = S + T keys, G compressed slots a segment makes,
c = compression_rate, H heads, D = n_embd / H, C = n_embd, L layers.
"""

import math
from dataclasses import dataclass, is_dataclass, replace
from functools import partial
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

COMPRESSIONS = ('max_pool', 'mean_pool', 'conv', 'dilated_conv')   # model_compressive.py's, less most_used
RECON_LOSSES = ('attention', 'autoencoding', 'none')


@dataclass
class Config:
    # GPT-2's fields, named and valued as transformers' GPT2Config (GPT-2 small)
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024   # learned positions; a segment uses 0..T-1
    layer_norm_epsilon: float = 1e-5
    seg_len: int = 512        # L, tokens per segment (≤ n_positions); the paper's input size
    dropout: float = 0.1      # GPT-2's embd_pdrop, attn_pdrop and resid_pdrop (all 0.1)
    init_std: float = 0.02    # GPT-2's initializer_range (the memory's parameters; GPT-2's own come loaded)
    # the compressed memory (Rae et al. 2020, model_compressive.py) and its positional bias (Press et al. 2021)
    cmem_len: int = 512       # n_cm, compressed slots per layer (§4.2: "a compressed memory of size 512")
    mem_len: int = 0          # n_m, FIFO memory slots per layer before compression (0: the segment is compressed)
    compression_rate: int = 2  # c: states per compressed slot (the authors' config.json)
    compression: str = 'conv'  # f_c: max_pool, mean_pool, conv, dilated_conv (Rae et al. §3.2; conv was best)
    recon_loss: str = 'attention'  # f_c's loss: attention (Algorithm 2), autoencoding, none (through time)
    recon_weight: float = 1.0  # loss = LM loss + recon_weight * reconstruction loss (the authors' trainer: 1)
    compress_lr_mult: float = 5.0  # f_c, g learn this much faster (the authors: learning_rate_ltm 2.5e-4 / 5e-5)
    alibi: bool = True        # ALiBi's distance bias -m_h (S + i - j) on memory slot j; False: memory unbiased

    @property
    def d_head(self):
        """D, each head's width (GPT-2 splits n_embd among its heads)."""
        return self.n_embd // self.n_head

    def __post_init__(self):
        lowest = dict.fromkeys(('vocab_size', 'n_layer', 'n_head', 'n_embd', 'n_positions', 'seg_len',
                                'compression_rate'), 1)
        for name, low in {**lowest, 'cmem_len': 0, 'mem_len': 0}.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.seg_len > self.n_positions:
            raise ValueError(f"seg_len ({self.seg_len}) must be <= n_positions ({self.n_positions}): GPT-2 places "
                             f"a segment's tokens with its learned positions 0..seg_len-1")
        for name, choices in (('compression', COMPRESSIONS), ('recon_loss', RECON_LOSSES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        for name in ('recon_weight', 'compress_lr_mult', 'init_std', 'layer_norm_epsilon'):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.cmem_len > 0 and (self.seg_len % self.compression_rate or self.mem_len % self.compression_rate):
            raise ValueError(f"seg_len ({self.seg_len}) and mem_len ({self.mem_len}) must be multiples of "
                             f"compression_rate ({self.compression_rate}): each segment evicts whole groups of c")


@dataclass
class Memory:
    """Fixed shapes (torch.compile compiles once): right-aligned, oldest first, valid slots the last `*_length`."""
    cmem: torch.Tensor          # (n_layer, B, cmem_len, n_embd) cm: the compressed memory
    cmem_length: torch.Tensor   # (B,) int64, valid compressed slots
    mem: torch.Tensor           # (n_layer, B, mem_len, n_embd) m: each layer's input states (none by default)
    mem_length: torch.Tensor    # (B,) int64, valid slots of m


class Compressed(NamedTuple):
    """Line 9 of one segment, every layer: what the reconstruction losses compare."""
    old_mem: torch.Tensor  # (L, B, G, c, C) the evicted states in groups of c, under stop-gradient
    n_new: torch.Tensor    # (B,) how many groups are real: the last n_new of the G (the rest is padding)
    new_cm: torch.Tensor   # (L, B, G, C) f_c(old_mem), with f_c's graph


@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it into the memory, in buffers of fixed shape,
    as model_xl.py's: K = S + seg_len slots, [concat(cm, m) ; tokens so far] at the right end, padding at the left;
    a step of T tokens slides every buffer by T."""
    key_valid: torch.Tensor  # (B, K) bool
    in_memory: torch.Tensor  # (K,) bool: the slot holds a memory slot (ALiBi's bias), not a token of the segment
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of the K slots
    hids: torch.Tensor       # (n_layer, B, seg_len, C) the layers' inputs h of the last seg_len tokens (lines 8, 10)
    t: torch.Tensor          # (1,) int64, the segment's tokens so far: the learned position of the next one


# -----------------------------------------------------------------------------------------------------------
# ALiBi's slopes (Press et al. 2021, §3)

def alibi_slopes(n_head):
    """m_h, h = 1..H: the geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8) when H is a power of 2; otherwise, as
    the authors' code, the slopes of the largest power of 2 below H, then every other slope of twice that many."""
    def geometric(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    below = 2 ** math.floor(math.log2(n_head))
    return torch.tensor(geometric(below) + geometric(2 * below)[0::2][:n_head - below])   # (H,)


# -----------------------------------------------------------------------------------------------------------
# Compression functions f_c (Rae et al. §3.2) and the memory update (Algorithm 1), as model_compressive.py

# Copied from model_compressive.py (Compression)
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


# Algorithm 1, lines 8-11, per layer, segment h of T tokens: old_mem = the T oldest of concat(m, h) (line 8), which
# with mem_len = 0 (the default) is h itself; new_cm = f_c(old_mem), T/c slots (9); m = concat(m, h)[-n_m:] (10);
# cm = concat(cm, new_cm)[-n_cm:] (11). Worked example (mem_len 0, cmem_len 4, seg_len 4, c 2; "k" the state of
# token k, f(a,b) the slot f_c makes of a and b): after tokens 0-3 cm = [_ _ f(0,1) f(2,3)]; after 4-7 cm =
# [f(0,1) f(2,3) f(4,5) f(6,7)]; after 8-11 [f(4,5) f(6,7) f(8,9) f(10,11)]; tokens 12-15 attend to those 4 slots
# (8 tokens back) and to themselves. model_compressive.py's docstring works the example with a FIFO m (mem_len > 0).
# The valid slots of concat(cm, m) are contiguous (cm fills only once m is full), so the slot distances are exact.

# Copied from model_compressive.py (right_aligned)
def right_aligned(n_slots, length):
    """(B, n_slots) bool: the valid slots of a right-aligned memory of n_slots holding length (B,) entries."""
    return torch.arange(n_slots, device=length.device)[None, :] >= (n_slots - length)[:, None]


# Copied from model_compressive.py (memory_valid)
def memory_valid(memory):
    """(B, S) bool: the valid slots of concat(cm, m), S = cmem_len + mem_len (contiguous: see above)."""
    return torch.cat([right_aligned(memory.cmem.size(2), memory.cmem_length),
                      right_aligned(memory.mem.size(2), memory.mem_length)], dim=1)


# Copied from model_compressive.py (push_fifo)
def push_fifo(slots, new):
    """concat(slots, new)[-n:] with n = slots.size(2) (lines 10 and 11), and the new.size(2) oldest slots, which
    fall out (line 8: old_mem = m_t[:n_s]). slots (L, B, n, ...), new (L, B, T, ...): states or per-slot values."""
    T = new.size(2)
    both = torch.cat([slots, new], dim=2)                         # (L, B, n+T, ...)
    return both[:, :, T:], both[:, :, :T]


# Copied from model_compressive.py (group_evicted)
def group_evicted(old_mem, n_old, rate):
    """Line 9's input: the T slots that fell out of m (L, B, T, ...), the last n_old (B,) real, as groups of c
    (L, B, T // c, c, ...), and how many (the last) are real; the oldest n_old mod c states are forgotten."""
    L, B, T = old_mem.shape[:3]
    G = T // rate
    return old_mem[:, :, T - G * rate:].reshape(L, B, G, rate, *old_mem.shape[3:]), n_old // rate


def update_memory(memory, hids, layers, rate, keep_graph=False):
    """Algorithm 1, lines 8-11, every layer at once (model_compressive.py's, without most_used's usage). hids
    (L, B, T, C): the segment's layer inputs h; layers: their f_c; keep_graph: new_cm keeps f_c's graph
    (recon_loss='none'). -> the new Memory and what line 9 did, for the reconstruction losses (None when n_cm = 0)."""
    T, n_cm, n_m = hids.size(2), memory.cmem.size(2), memory.mem.size(2)
    mem, old_mem = push_fifo(memory.mem, hids.detach().to(memory.mem.dtype))   # lines 10 and 8, SG(h)
    mem = mem.clone(memory_format=torch.contiguous_format)        # init_memory's strides, even with no slot (n_m = 0)
    mem_length = (memory.mem_length + T).clamp(max=n_m)
    n_old = memory.mem_length + T - mem_length                    # states that fell out of m (B,), right-aligned
    if n_cm == 0:                                                 # nothing kept beyond m
        return replace(memory, mem=mem, mem_length=mem_length), None
    groups, n_new = group_evicted(old_mem, n_old, rate)          # (L, B, G, c, C), n_new (B,) real groups
    new_cm = torch.stack([layer.compress(groups[n]) for n, layer in enumerate(layers)])
    new_cm = torch.where(right_aligned(groups.size(2), n_new)[None, :, :, None], new_cm, 0)   # line 9, (L, B, G, C)
    cmem, _ = push_fifo(memory.cmem, new_cm if keep_graph else new_cm.detach())          # line 11
    cmem_length = (memory.cmem_length + n_new).clamp(max=n_cm)
    return Memory(cmem.contiguous(), cmem_length, mem, mem_length), Compressed(groups, n_new, new_cm)


# -----------------------------------------------------------------------------------------------------------
# The auxiliary compression losses (Rae et al. §3.2): content attention, without ALiBi's bias

# Copied from model_compressive.py (content_attention)
def content_attention(q, k, v, key_valid, scale):
    """Algorithm 2, line 6: attn(h, m) = σ((hQ)(mK)ᵀ)(mV), the layer's content attention without positions, from
    the queries q = hQ (B, H, T, D) and the keys mK and values mV (B, H, S, D), key_valid (B, S). -> (B, H, T, D)"""
    key_valid = key_valid | ~key_valid.any(1, keepdim=True)      # a row with nothing to compress: no NaN (unused)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_valid[:, None, None, :], scale=scale)


# Copied from model_compressive.py (reconstruction_loss) with layer.attn.keys_values_sg -> layer.keys_values_sg
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
            prediction = content_attention(q, *layer.keys_values_sg(new_cm[n]), real, layer.attn.scale)
            error = (target - prediction).float().pow(2).mean((1, 2, 3))
        else:
            decoded = layer.decoder(new_cm[n]).view(B, G, rate, C)
            error = ((old_mem[n] - decoded).float().pow(2) * real[:, :, None, None]).sum((1, 2, 3))
            error = error / (n_new * rate * C).clamp(min=1)
        total = total + (error * rows).sum() / rows.sum().clamp(min=1)
    return total


# Copied from model_compressive.py (compression_flops)
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
# GPT-2's blocks (Radford et al. 2019; pre-LN), the attention reading [cm ; m ; segment]

class CausalSelfAttention(nn.Module):
    """GPT-2's multi-head attention (model_gpt2.py's) whose keys and values are those of the memory slots, then the
    segment's: softmax(q kᵀ/√D + ALiBi's bias) v."""

    # Copied from model_gpt2.py (CausalSelfAttention.__init__)
    def __init__(self, config):
        super().__init__()
        self.n_head, self.d_head = config.n_head, config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)   # W_Q, W_K, W_V side by side
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)       # W_O
        self.attn_dropout_p = config.dropout                        # on the attention probabilities
        self.resid_dropout = nn.Dropout(config.dropout)

    # Copied from model_gpt2.py (CausalSelfAttention.query_key_value)
    def query_key_value(self, x):
        """Queries, keys and values (B, H, T, D) of the layer's normalised input x (B, T, C)."""
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, self.d_head)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)                 # q, k, v: each (B, H, T, D)

    # Copied from model_gpt2.py (CausalSelfAttention.output)
    def output(self, y):
        """The heads' outputs y (B, H, T, D) merged and projected: the attention's contribution (B, T, C)."""
        B, H, T, D = y.shape
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, H * D)))

    @property
    def scale(self):
        """1/√D, the scale of every score (Algorithm 2's too)."""
        return self.d_head ** -0.5

    def keys_values(self, x, detach=False):
        """Keys and values (B, H, S, D) of normalised states x (B, S, C); detach: under stop-gradient (Algorithm 2,
        line 5). A slot's key depends on its own state alone, so the memory's are computed once a segment."""
        B, S, C = x.shape
        weight, bias = self.c_attn.weight[C:], self.c_attn.bias[C:]   # the rows of W_K and W_V
        if detach:
            weight, bias = weight.detach(), bias.detach()
        kv = F.linear(x, weight, bias).view(B, S, 2, self.n_head, self.d_head)
        return kv.permute(2, 0, 3, 1, 4).unbind(0)               # k, v: each (B, H, S, D)

    def forward(self, x, mem_kv, attn_bias):
        """x (B, T, C): ln_1 of the segment's layer input; mem_kv: keys, values (B, H, S, D) of [cm ; m] (line 5);
        attn_bias (B, H, T, K): ALiBi's bias, -inf where masked. -> out (B, T, C), (k, v) (B, H, K, D), q (B, H, T, D)
        """
        q, k, v = self.query_key_value(x)
        k = torch.cat([mem_kv[0], k], dim=2)                      # (B, H, K, D)  [SG(cm ; m) ∘ h] W_K
        v = torch.cat([mem_kv[1], v], dim=2)                      # (B, H, K, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias.to(q.dtype),   # softmax(q kᵀ/√D + bias) v
                                           dropout_p=self.attn_dropout_p if self.training else 0.0)
        return self.output(y), (k, v), q


# Copied from model_gpt2.py (MLP)
class MLP(nn.Module):
    """GPT-2's feed-forward: C -> 4C, GELU (its tanh approximation, HF's gelu_new), -> C, dropout."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate='tanh')))


class Block(nn.Module):
    """GPT-2's pre-LN block, x + attn(ln_1(x)) then x + mlp(ln_2(x)), with f_c (compress) and g (decoder)."""

    # Copied from model_gpt2.py (Block.__init__) with f_c (compress) and g (decoder, autoencoding) added
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)
        if config.cmem_len > 0:
            self.compress = Compression(config)                   # f_c^{(i)}
            if config.recon_loss == 'autoencoding':               # g: one compressed memory -> c memories
                self.decoder = nn.Linear(config.n_embd, config.compression_rate * config.n_embd)

    def keys_values(self, m):
        """Keys and values (B, H, S, D) of layer inputs m (B, S, C): the memory is stored before ln_1."""
        return self.attn.keys_values(self.ln_1(m))

    def keys_values_sg(self, m):
        """keys_values(m) with every weight under stop-gradient (Algorithm 2, line 5): only m's maker learns."""
        ln = self.ln_1
        return self.attn.keys_values(F.layer_norm(m, ln.normalized_shape, ln.weight.detach(), ln.bias.detach(),
                                                  ln.eps), detach=True)

    def forward(self, h, mem_kv, attn_bias):
        a, kv, q = self.attn(self.ln_1(h), mem_kv, attn_bias)
        h = h + a
        return h + self.mlp(self.ln_2(h)), kv, q


# -----------------------------------------------------------------------------------------------------------
# The model

class Model(nn.Module):
    gpt2_form = True          # transformers' GPT-2 names: the loader (--init_from=gpt2) fills this model

    # Copied from model_gpt2.py (Model.__init__) with ALiBi's slopes m_h added (a buffer)
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, C),               # token embedding, tied to lm_head
            wpe=nn.Embedding(config.n_positions, C),              # learned absolute positions
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(C, eps=config.layer_norm_epsilon),
        ))
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight         # tied, as GPT-2's
        slopes = alibi_slopes(config.n_head) if config.alibi else torch.zeros(config.n_head)
        self.register_buffer('alibi_slopes', slopes, persistent=False)   # m_h (H,); alibi=False: no bias
        self.apply(self._init_weights)

    # Copied from model_gpt2.py (Model._init_weights) with nn.Linear->(nn.Linear, nn.Conv1d): f_c's convolutions too
    def _init_weights(self, module):
        # As GPT-2's (HF GPT2PreTrainedModel): N(0, init_std) weights and embeddings, zero biases, LayerNorm 1 and 0,
        # and the projections into the residual stream (c_proj) N(0, init_std / sqrt(2 n_layer)).
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
        if isinstance(module, (nn.Linear, nn.Conv1d)) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, (CausalSelfAttention, MLP)):
            nn.init.normal_(module.c_proj.weight, 0.0, std / math.sqrt(2 * self.config.n_layer))
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    # Copied from model_gpt2.py (Model.embed)
    def embed(self, idx, pos):
        """h^0 (B, T, C) of the tokens idx (B, T) at the positions pos (T,): token + position embedding, dropout."""
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    # Copied from model_gpt2.py (Model.logits)
    def logits(self, h):
        """The output layer on the last block's output h (..., C): final LayerNorm, tied softmax weights."""
        return self.lm_head(self.transformer.ln_f(h))              # (..., V)

    def lr_multipliers(self):
        """f_c and g learn compress_lr_mult times faster, as the authors' trainer's learning_rate_ltm group."""
        return {name: self.config.compress_lr_mult for name, _ in self.named_parameters()
                if '.compress.' in name or '.decoder.' in name}

    # --- memory -------------------------------------------------------------------------------------------

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams (Algorithm 1, lines 1-2); mem_len overrides n_m, not n_cm."""
        L, B, C, n_cm = self.config.n_layer, batch_size, self.config.n_embd, self.config.cmem_len
        n_m = self.config.mem_len if mem_len is None else mem_len
        zeros = partial(torch.zeros, device=device, dtype=self.transformer.wte.weight.dtype)   # float32 under autocast
        return Memory(cmem=zeros(L, B, n_cm, C), cmem_length=zeros(B, dtype=torch.long), mem=zeros(L, B, n_m, C),
                      mem_length=zeros(B, dtype=torch.long))

    def reset_memory(self, memory, mask):
        """Empty both memories of the rows where mask (B,) is True, e.g. at a document boundary."""
        keep = (~mask).to(memory.mem.dtype)
        return Memory(memory.cmem * keep[None, :, None, None], memory.cmem_length * ~mask,
                      memory.mem * keep[None, :, None, None], memory.mem_length * ~mask)

    def _attn_bias(self, key_valid, in_memory, T):
        """The additive attention bias (B, H, T, K) over K keys, the last T the queries themselves: query i sits at
        K - T + i and sees key j when j is valid and not after it; a memory slot j (in_memory (K,)) gets ALiBi's
        -m_h (K - T + i - j), which is -m_h (S + i - j) in forward (K = S + T), a token of the segment nothing
        (GPT-2's learned positions place it); -inf elsewhere."""
        K = key_valid.size(1)
        i = torch.arange(T, device=key_valid.device)[:, None]
        j = torch.arange(K, device=key_valid.device)[None, :]
        distance = K - T + i - j                                  # (T, K)
        allowed = (distance >= 0)[None] & key_valid[:, None, :]  # (B, T, K) causal, valid
        bias = -self.alibi_slopes[:, None, None] * (distance * in_memory).float()   # (H, T, K)
        return bias[None].masked_fill(~allowed[:, None], float('-inf'))             # (B, H, T, K)

    # --- forward ------------------------------------------------------------------------------------------

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len. -> logits, LM loss + recon_weight * reconstruction loss, new_memory, aux"""
        config = self.config
        B, T = idx.shape
        if T > config.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={config.seg_len}")
        mem = torch.cat([memory.cmem, memory.mem], dim=2)         # (L, B, S, C) concat(cm, m), line 5
        S = mem.size(2)
        key_valid = torch.cat([memory_valid(memory), idx.new_ones(B, T, dtype=torch.bool)], dim=1)   # (B, S+T)
        in_memory = torch.arange(S + T, device=idx.device) < S                                       # (S+T,)
        attn_bias = self._attn_bias(key_valid, in_memory, T)     # (B, H, T, S+T)
        h = self.embed(idx, torch.arange(T, device=idx.device))  # (B, T, C)  h^(1) (line 3)
        hids, qkv = [], []
        for n, block in enumerate(self.transformer.h):            # line 4
            hids.append(h)                                        # layer n's input: its memory to be
            h, (k, v), q = block(h, block.keys_values(mem[n]), attn_bias)   # lines 6-7, 12
            qkv.append((q, k, v))                                 # Algorithm 2 reuses them
        logits = self.logits(h)                                   # (B, T, V)
        new_memory, compressed = update_memory(memory, torch.stack(hids), self.transformer.h,
                                               config.compression_rate,
                                               keep_graph=config.recon_loss == 'none' and self.training)
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
            if compressed is not None and config.recon_loss != 'none':
                recon_loss = reconstruction_loss(config.recon_loss, self.transformer.h, compressed, qkv,
                                                 config.cmem_len)
                aux['recon_loss'] = recon_loss.detach()
                loss = loss + config.recon_weight * recon_loss
            elif compressed is not None and self.training:
                # recon_loss='none': only the LM loss trains f_c, through time (--bptt_segments > 1). Where none
                # reaches it, DDP still waits: f_c joins with weight 0.
                loss = loss + 0.0 * sum(p.sum() for block in self.transformer.h for p in block.compress.parameters())
        return logits, loss, new_memory, aux

    # --- bookkeeping for train.py -------------------------------------------------------------------------

    # Copied from model_xl.py (Model.num_params)
    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs (forward + backward) per token, for MFU: 6 per use of a weight but wpe's and f_c's
        (wte's once, as the output layer); 6 per multiply-add of the attention over K = cmem_len + mem_len + seg_len
        keys (2 products of C·K); 6 per multiply-add of the memory's keys and values too (no gradient into the memory,
        but one into ln_1(memory), for ln_1's weights); f_c and its loss once per compressed slot (compression_flops).
        tests/test_compressive_gpt2.py checks it against torch's flop counter."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()      # the weights of products but f_c's
                       if name.endswith('weight') and p.dim() > 1         # and g's
                       and '.compress.' not in name and '.decoder.' not in name and 'wpe' not in name)
        S = (c.mem_len if mem_len is None else mem_len) + c.cmem_len
        T, C = c.seg_len, c.n_embd
        weights, attention = 6 * matrices, 6 * 2 * c.n_layer * C * (S + T)
        memory = 6 * c.n_layer * S * 2 * C * C / T                # ln_1([SG(cm) ; SG(m)]) W_K, W_V
        compression = c.n_layer * compression_flops(c, self.transformer.h[0].compress) / T if c.cmem_len > 0 else 0
        return weights + attention + memory + compression

    # --- generation ---------------------------------------------------------------------------------------

    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T) on memory, in a new OpenSegment or in seg's buffers (decode() reuses them):
        concat(cm, m)'s keys and values (line 5). -> logits (B, V) of the last, OpenSegment"""
        c, B = self.config, tokens.size(0)
        mem = torch.cat([memory.cmem, memory.mem], dim=2)             # (L, B, S, C) concat(cm, m)
        K, pad = mem.size(2) + c.seg_len, (0, 0, c.seg_len, 0)        # seg_len empty slots on the left
        kv = [block.keys_values(m) for block, m in zip(self.transformer.h, mem)]
        seg = refill(seg, OpenSegment(key_valid=F.pad(memory_valid(memory), pad[2:]),
                                      in_memory=torch.arange(K, device=tokens.device) >= c.seg_len,
                                      kv=[tuple(F.pad(x, pad) for x in xs) for xs in kv],
                                      hids=memory.mem.new_zeros(c.n_layer, B, c.seg_len, c.n_embd),
                                      t=torch.zeros(1, dtype=torch.long, device=tokens.device)))
        return self.step(tokens, seg, tokens.size(1)), seg

    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg, which it updates in place. filled: as model_xl.py's (the
        step skips the seg_len - filled padding slots on the left; None: it reads them too, as a graph wants).
        -> logits (B, V) of the last"""
        T, S = tokens.size(1), 0 if filled is None else self.config.seg_len - filled   # S slots skipped
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K-S)
        in_memory = F.pad(seg.in_memory[S + T:], (0, T))               # (K-S,) the T new slots: the segment's
        attn_bias = self._attn_bias(key_valid, in_memory, T)           # (B, H, T, K-S)
        h = self.embed(tokens, seg.t + torch.arange(T, device=tokens.device))   # positions t .. t+T-1
        hids = []
        for n, block in enumerate(self.transformer.h):
            hids.append(h)
            k, v = (x[:, :, S:] for x in seg.kv[n])                    # the slots it reads, less the T oldest below
            h, (k_new, v_new), _ = block(h, (k[:, :, T:], v[:, :, T:]), attn_bias)
            k.copy_(k_new)
            v.copy_(v_new)
        seg.key_valid[:, S:] = key_valid
        seg.in_memory[S:] = in_memory
        seg.hids[:, :, S:] = torch.cat([seg.hids[:, :, S + T:], torch.stack(hids).to(seg.hids.dtype)], dim=2)
        seg.t.add_(T)
        return self.logits(h[:, -1])                                   # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it (Algorithm 1, lines 8-11)."""
        return update_memory(memory, seg.hids, self.transformer.h, self.config.compression_rate)[0]

    # Copied from model_xl.py (Model.generate)
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None, cuda_graph=False):
        """Continue idx (B, T0) by max_new_tokens tokens after memory (optional; else a fresh one), as decode() says;
        callback(tokens (B, 1)) after each new token; cuda_graph: replay each token's step as one CUDA graph."""
        memory = self.init_memory(idx.size(0), idx.device) if memory is None else memory
        return decode(self, idx, memory, max_new_tokens, temperature, top_k, callback, cuda_graph)


# -----------------------------------------------------------------------------------------------------------
# Generic blocks copied verbatim from model_xl.py (tests/test_copies.py keeps them identical)

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
