"""
Transformer-XL (Dai et al., 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
arXiv 1901.02860), in one file.

Two ideas, both in the attention:
  1. Segment-level recurrence (§3.2). The text is read one segment of `seg_len` tokens at a time. Every layer
     keeps the input hidden states of the last `mem_len` positions it saw (its *memory*), with the gradient
     stopped, and the current segment attends to [memory ; segment]:
         h~_τ^{n-1} = [SG(m_τ^{n-1}) ∘ h_τ^{n-1}]
         q_τ^n = h_τ^{n-1} W_q,   k_τ^n = h~_τ^{n-1} W_{k,E},   v_τ^n = h~_τ^{n-1} W_v
  2. Relative positions (§3.3). Absolute positions would collide across segments, so the score between query i
     and key j only sees the distance i - j, through a fixed sinusoid R_{i-j}:
         A^rel_{i,j} = q_i·k_j  (a)  +  q_i·W_{k,R} R_{i-j}  (b)  +  u·k_j  (c)  +  v·W_{k,R} R_{i-j}  (d)
                     = (q_i + u)·k_j  +  (q_i + v)·W_{k,R} R_{i-j}
     u is `r_w_bias`, v is `r_r_bias`. (b)+(d) is computed for all distances at once and moved into place with
     the "rel-shift" trick (see `rel_shift`).

Deliberate deviations from the paper's code (also listed in the README):
  - GPT-2 BPE tokens with a full tied softmax instead of word-level adaptive input/softmax; no output bias.
  - pre-LN (`pre_lnorm=True`) adds a final LayerNorm before the output layer, as pre-LN models need.
  - A fixed-shape memory (mem_len slots, right-aligned) with a count of valid slots per row: a fresh stream is masked.

Letters: B rows, T tokens of the segment, M memory slots, K = M + T keys, H heads, D = d_head, C = n_embd.
Reading order: relative attention (R, rel-shift, attention, block), the model (memory, forward, generate), then
the generic blocks every model file copies. LaMemo (look-ahead memory) is model_lamemo.py.
"""

import importlib.util
import math
from dataclasses import dataclass, is_dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    # Defaults: the paper's WikiText-103 base model (16 layers, d 410, 10 heads of 41, d_inner 2100, seg=mem=150).
    vocab_size: int = 50304   # GPT-2's 50257 padded to a multiple of 64
    n_layer: int = 16
    n_head: int = 10
    n_embd: int = 410         # d_model
    d_head: int = 41          # per-head width; n_head * d_head need not equal n_embd
    d_inner: int = 2100       # position-wise feed-forward width
    dropout: float = 0.1      # on embeddings, attention output, feed-forward, final hidden states
    dropatt: float = 0.0      # on attention probabilities
    seg_len: int = 150        # tokens per segment (the paper's tgt_len)
    mem_len: int = 150        # memory positions kept per layer; 0 = the no-memory baseline
    clamp_len: int = 0        # relative distances above this share one embedding; 0 = no clamp
    same_length: bool = False  # every query attends to the same number (mem_len) of keys
    pre_lnorm: bool = False   # False: post-LN as in the paper; True: pre-LN (+ final LayerNorm)
    untie_r: bool = True      # True: u, v (r_w_bias, r_r_bias) per layer; False: one pair shared by all layers
    init_std: float = 0.02    # normal init of weights, as the paper's code
    attn_kernel: str = 'sdpa'  # 'sdpa': F.scaled_dot_product_attention, (b)+(d) as its bias; 'einsum': written out,
                               # the reference; 'triton': (b)+(d) inside flash-style tiles (rel_attention_triton.py)

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
        check_attn_kernel(self, ('sdpa', 'einsum', 'triton'))


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
    mem: torch.Tensor     # (n_layer, B, mem_len, n_embd) each layer's input hidden states, oldest first
    length: torch.Tensor  # (B,) int64, how many of the mem_len slots (the most recent ones) are valid


@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it into the memory, in buffers of fixed shape
    (forward() takes a whole segment in one call). K = M + seg_len slots, right-aligned as Memory's: [memory ; tokens
    so far] fill the right end and padding the left. A step of T tokens slides the window by T (decode() never lets a
    valid slot fall off), so every token's step has the same shapes and writes in place: decode() can capture it."""
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of the K slots
    hids: torch.Tensor       # (n_layer, B, seg_len, C) the layers' inputs of the last seg_len tokens: the memory to be
    r_k: list                # per layer W_{k,R} R (H, K, D) for the distances K-1, ..., 0


# -----------------------------------------------------------------------------------------------------------
# Relative attention (§3.3): the sinusoid R, the rel-shift, u and v

class PositionalEmbedding(nn.Module):
    """The fixed sinusoid R of §3.3 (Vaswani et al.'s, without learnable parameters), evaluated at any positions."""

    def __init__(self, n_embd):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, n_embd, 2.0) / n_embd))
        self.register_buffer('inv_freq', inv_freq, persistent=False)

    def forward(self, pos_seq):                                   # pos_seq: (K,) float
        sinusoid = torch.outer(pos_seq, self.inv_freq)            # (K, n_embd/2)
        return torch.cat([sinusoid.sin(), sinusoid.cos()], -1)    # (K, n_embd)


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
    """Multi-head attention with Transformer-XL relative positions (§3.3), its residual and LayerNorm."""

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

    def keys_values(self, h):
        """Keys and values (B, H, S, D) of hidden states h (B, S, C). A position's key and value depend on that
        position alone (positions enter only through R), so the memory's can be computed once and cached."""
        B, S, _ = h.shape
        if self.pre_lnorm:
            h = self.layer_norm(h)
        kv = self.kv_net(h).view(B, S, 2, self.n_head, self.d_head)
        return kv.permute(2, 0, 3, 1, 4).unbind(0)               # k, v: each (B, H, S, D)

    def project_positions(self, r):
        """W_{k,R} R (H, K, D) of the relative embeddings R (K, C): the keys of the distances (§3.3)."""
        return self.r_net(r).view(r.size(0), self.n_head, self.d_head).transpose(0, 1)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask):
        """h (B, T, C): the segment's layer input; mem_kv: keys, values (B, H, S, D) of the S earlier positions (the
        memory, §3.2); r: R (K, C) for distances K-1, ..., 0 (K = S + T), or W_{k,R} R (H, K, D) (generate() projects
        once a segment); r_w_bias, r_r_bias (H, D): u, v; attn_mask (B, 1, T, K). -> out (B, T, C), (k, v) of K keys"""
        B, T, C = h.shape
        H, D = self.n_head, self.d_head
        x = self.layer_norm(h) if self.pre_lnorm else h
        q = self.q_net(x).view(B, T, H, D).transpose(1, 2)       # (B, H, T, D)
        k_new, v_new = self.keys_values(h)
        k = torch.cat([mem_kv[0], k_new], dim=2)                  # (B, H, K, D)   [SG(m) ∘ h] W_{k,E}
        v = torch.cat([mem_kv[1], v_new], dim=2)                  # (B, H, K, D)
        r_k = self.project_positions(r) if r.dim() == 2 else r   # (H, K, D)      W_{k,R} R

        q_u = q + r_w_bias[:, None]                                       # terms (a) + (c): (q_i + u) · k_j
        q_v = q + r_r_bias[:, None]                                       # terms (b) + (d): (q_i + v) · W_{k,R} R

        if self.attn_kernel == 'einsum':                                  # the reference: §3.3 written out
            BD = torch.einsum('bhid,hjd->bhij', q_v, r_k)                 # (B, H, T, K), column c = distance K-1-c
            BD = rel_shift(BD)                                            # (B, H, T, K), column j = key j
            AC = torch.einsum('bhid,bhjd->bhij', q_u, k)                  # (B, H, T, K)
            score = (AC + BD) * self.scale                                # A^rel / sqrt(d)
            score = score.masked_fill(~attn_mask, float('-inf'))
            prob = self.dropatt(F.softmax(score.float(), dim=-1).to(v.dtype))
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
        return out, (k, v)


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = RelMultiHeadAttn(config)
        self.ff = PositionwiseFF(config.n_embd, config.d_inner, config.dropout, config.pre_lnorm)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask):
        h, kv = self.attn(h, mem_kv, r, r_w_bias, r_r_bias, attn_mask)
        return self.ff(h), kv


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
        self.apply(self._init_weights)
        nn.init.normal_(self.r_w_bias, 0.0, config.init_std)
        nn.init.normal_(self.r_r_bias, 0.0, config.init_std)

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

    # --- memory -------------------------------------------------------------------------------------------

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams; mem_len overrides config.mem_len (a longer one at eval)."""
        c = self.config
        M = c.mem_len if mem_len is None else mem_len
        dtype = self.word_emb.weight.dtype                       # float32 under autocast; the model's own if cast
        return Memory(mem=torch.zeros(c.n_layer, batch_size, M, c.n_embd, device=device, dtype=dtype),
                      length=torch.zeros(batch_size, dtype=torch.long, device=device))

    def reset_memory(self, memory, mask):
        """Empty the memory of the rows where mask (B,) is True, e.g. at a document boundary."""
        keep = ~mask                                              # (B,)
        return Memory(mem=memory.mem * keep[None, :, None, None].to(memory.mem.dtype), length=memory.length * keep)

    def _update_memory(self, memory, hids):
        """§3.2: the new memory is the last mem_len positions of [old memory ; this segment's layer inputs],
        with the gradient stopped (SG). hids: n_layer tensors (B, T, C)."""
        M, T = memory.mem.size(2), hids[0].size(1)
        cat = torch.cat([memory.mem, torch.stack(hids).to(memory.mem.dtype)], dim=2)   # (L, B, M+T, C)
        # a copy in init_memory's strides, also at mem_len = 0, where .contiguous() would keep the empty view's
        # strides and torch.compile would compile forward a second time for them
        mem = cat[:, :, T:].detach().clone(memory_format=torch.contiguous_format)
        return Memory(mem=mem, length=(memory.length + T).clamp(max=M))

    # --- attention geometry, shared by forward and generate ------------------------------------------------

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
        S = key_valid.size(1) - T
        i = torch.arange(T, device=key_valid.device)[:, None]
        j = torch.arange(S + T, device=key_valid.device)[None, :]
        distance = S + i - j                                      # (T, K)
        allowed = distance >= 0                                   # causal
        if self.config.same_length:
            allowed = allowed & (distance < max(mem_len, 1))
        return (allowed[None] & key_valid[:, None, :])[:, None]  # (B, 1, T, K)

    def _u_v(self, i):
        n = i if self.config.untie_r else 0
        return self.r_w_bias[n], self.r_r_bias[n]

    # --- forward ------------------------------------------------------------------------------------------

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len; memory: Memory. Returns (logits, loss, new_memory, aux)."""
        B, T = idx.shape
        if T > self.config.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={self.config.seg_len}")
        M = memory.mem.size(2)
        mem_valid = torch.arange(M, device=idx.device)[None, :] >= (M - memory.length)[:, None]    # (B, M)
        key_valid = torch.cat([mem_valid, mem_valid.new_ones(B, T)], dim=1)                          # (B, K = M+T)
        attn_mask = self._attn_mask(key_valid, T, M)              # (B, 1, T, K)
        r = self._relative_positions(M + T, idx.device)           # (K, C)

        h = self.drop(self.word_emb(idx))                         # (B, T, C)  h^0
        hids = []
        for n, layer in enumerate(self.layers):
            hids.append(h)                                        # layer n's input becomes its next memory
            mem_kv = layer.attn.keys_values(memory.mem[n])        # (B, H, M, D) x2
            h, _ = layer(h, mem_kv, r, *self._u_v(n), attn_mask)
        logits = F.linear(self.drop(self.ln_f(h)), self.word_emb.weight)   # (B, T, V), tied output layer

        new_memory = self._update_memory(memory, hids)
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
        return logits, loss, new_memory, aux

    # --- bookkeeping for train.py -------------------------------------------------------------------------

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs (forward + backward) per token, for MFU, the memory detached (bptt_segments=1): 6 per use of
        a weight (2 forward, 2 for its input's gradient, 2 for its own); 6 per multiply-add of the attention over
        K = mem_len + seg_len keys (3 products of H*D*K: (a)+(c), (b)+(d), values); 4 per multiply-add of the memory's
        keys and values (no gradient into the memory). W_{k,R} R, once a batch, is not counted (tests/test_flops.py)."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()      # the weights of products (biases,
                       if name.endswith('weight') and p.dim() > 1)        # norms, u and v take none)
        M = c.mem_len if mem_len is None else mem_len
        T, K, C, HD = c.seg_len, M + c.seg_len, c.n_embd, c.n_head * c.d_head
        weights = 6 * (matrices - c.n_layer * C * HD)   # every weight but W_{k,R}, once a token
        attention = 6 * 3 * c.n_layer * HD * K
        memory = 4 * c.n_layer * M * C * 2 * HD / T               # [SG(m)] W_{k,E}, W_v
        return weights + attention + memory

    # --- generation ---------------------------------------------------------------------------------------

    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T) on memory, in a new OpenSegment or in seg's buffers (decode() reuses them).
        -> the logits (B, V) of the last token, the OpenSegment"""
        c, B, M = self.config, tokens.size(0), memory.mem.size(2)
        pad = (0, 0, c.seg_len, 0)                                     # seg_len empty slots on the left
        mem_valid = torch.arange(M, device=tokens.device)[None, :] >= (M - memory.length)[:, None]   # (B, M)
        kv = [layer.attn.keys_values(memory.mem[n]) for n, layer in enumerate(self.layers)]
        r = self._relative_positions(M + c.seg_len, tokens.device)    # (K, C)
        seg = refill(seg, OpenSegment(key_valid=F.pad(mem_valid, pad[2:]),
                                      kv=[tuple(F.pad(x, pad) for x in xs) for xs in kv],
                                      hids=memory.mem.new_zeros(c.n_layer, B, c.seg_len, c.n_embd),
                                      r_k=[layer.attn.project_positions(r) for layer in self.layers]))
        return self.step(tokens, seg, tokens.size(1)), seg

    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg, which it updates in place. filled: how many tokens the
        segment holds with these; the step then skips the seg_len - filled padding slots on the left (None: it reads
        them too, the same shapes at every token, as a graph wants). -> logits (B, V) of the last"""
        T, S = tokens.size(1), 0 if filled is None else self.config.seg_len - filled   # S slots skipped
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K-S)
        attn_mask = self._attn_mask(key_valid, T, seg.key_valid.size(1) - self.config.seg_len)   # (B, 1, T, K-S)
        h = self.drop(self.word_emb(tokens))                           # (B, T, C)
        hids = []
        for n, layer in enumerate(self.layers):
            hids.append(h)
            k, v = (x[:, :, S:] for x in seg.kv[n])                    # the slots it reads, less the T oldest below
            h, (k_new, v_new) = layer(h, (k[:, :, T:], v[:, :, T:]), seg.r_k[n][:, S:], *self._u_v(n), attn_mask)
            k.copy_(k_new)
            v.copy_(v_new)
        seg.key_valid[:, S:] = key_valid
        seg.hids[:, :, S:] = torch.cat([seg.hids[:, :, S + T:], torch.stack(hids).to(seg.hids.dtype)], dim=2)
        return F.linear(self.ln_f(h[:, -1]), self.word_emb.weight)    # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it."""
        return self._update_memory(memory, seg.hids.unbind(0))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None, cuda_graph=False):
        """Continue idx (B, T0) by max_new_tokens tokens after memory (optional; else a fresh one), as decode() says;
        callback(tokens (B, 1)) after each new token; cuda_graph: replay each token's step as one CUDA graph."""
        memory = self.init_memory(idx.size(0), idx.device) if memory is None else memory
        return decode(self, idx, memory, max_new_tokens, temperature, top_k, callback, cuda_graph)


# -----------------------------------------------------------------------------------------------------------
# Generic blocks, which the other model files copy verbatim (tests/test_copies.py keeps them identical)

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


class ScaledEmbedding(nn.Module):
    """Token embedding times sqrt(n_embd), as the Transformer-XL code's AdaptiveEmbedding with a single cluster.
    Its weight is tied to the output layer."""

    def __init__(self, vocab_size, n_embd):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, n_embd))
        self.scale = n_embd ** 0.5

    def forward(self, idx):
        return F.embedding(idx, self.weight) * self.scale


def sample_next(logits, temperature=1.0, top_k=None):
    """Sample one token per row from (B, V) logits; temperature 0 means greedy."""
    if temperature == 0.0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], float('-inf'))
    return torch.multinomial(F.softmax(logits.float(), dim=-1), num_samples=1)   # (B, 1)


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
