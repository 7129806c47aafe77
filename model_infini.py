"""
Infini-attention (Munkhdalai, Faruqui and Gopal, 2024, "Leave No Context Behind: Efficient Infinite Context
Transformers with Infini-attention", arXiv 2404.07143), in one file.

The text is read one segment of `seg_len` tokens at a time. Every head of every layer uses the same queries, keys
and values twice (§2.1):
  1. Local attention: causal softmax attention inside the segment (Eq. 2), RoPE on its queries and keys.
  2. A compressive memory: a matrix M (D x D) and a normaliser z (D) that sum up every earlier segment. With
     σ = ELU + 1 (§2.1.2) and the *unrotated* queries and keys:
       retrieve (Eq. 3):        A_mem = σ(Q) M_{s-1} / (σ(Q) z_{s-1})
       update, linear (Eq. 4):  M_s = M_{s-1} + σ(K)ᵀ V,        z_s = z_{s-1} + Σ_t σ(K_t)
       update, delta (Eq. 5):   M_s = M_{s-1} + σ(K)ᵀ (V - σ(K) M_{s-1} / (σ(K) z_{s-1}))   (z as in Eq. 4)
     The segment retrieves first, then writes itself, so it reads only the segments before it.
A learned scalar β per head mixes the two ("long-term context injection", Eq. 6):
       A = sigmoid(β) ⊙ A_mem + (1 - sigmoid(β)) ⊙ A_dot
and the heads are concatenated and projected by W_O (§2.1.2). Training (§3, §4.1) unrolls the memory over 16
segments; the model never detaches it, train.py's `--bptt_segments=k` keeps the graph over k segments.

Equation numbers are the paper's: Eq. 1 (W_Q, W_K, W_V) and Eq. 2 (§2.1.1), Eqs. 3-6 (§2.1.2); the multi-head
output O = [A^1; ...; A^H] W_O, after Eq. 6, is cited by its section (§2.1.2).

Deviations and choices (also in the README):
  - An empty memory (M = 0, z = 0: Eq. 3 is 0/0) retrieves 0, known from a token count (no epsilon); the gate stays.
  - M and z are kept and computed in float32 with autocast off: a bf16 sum over thousands of tokens loses most terms.
  - Post-LN as model_xl.py (`pre_lnorm` for pre-LN); GPT-2 BPE, scaled tied embeddings, N(0, init_std) init.
  - β's initialisation and learning rate are not given: `gate_init`, `gate_lr_mult` (see Model.lr_multipliers).
  - σ is floored at SIGMA_FLOOR (see sigma).

Letters: B rows, T tokens of a segment (or of a generate() step), K = seg_len key slots of generate()'s open
segment, H heads, D = d_head, C = n_embd, L layers. tests/test_infini.py checks every layer against a per-token,
per-head reference.
"""

import math
from dataclasses import dataclass, is_dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    # Defaults: the paper's long-context LM models (§4.1: 12 layers, 8 heads of 128, FFN 4096, segments of 2048).
    vocab_size: int = 50304   # GPT-2's 50257 padded to a multiple of 64
    n_layer: int = 12
    n_head: int = 8
    n_embd: int = 1024        # d_model
    d_head: int = 128         # d_key = d_value per head; n_head * d_head need not equal n_embd
    d_inner: int = 4096       # position-wise feed-forward width
    dropout: float = 0.1      # on embeddings, attention output, feed-forward, final hidden states
    dropatt: float = 0.0      # on the local attention probabilities
    seg_len: int = 2048       # tokens per segment (the paper's N)
    memory_update: str = 'linear'  # 'linear' (Eq. 4) or 'delta' (Eq. 5, "Linear + Delta")
    gate_init: float = 0.0    # initial β of every head: sigmoid(0) = 0.5 mixes memory and local attention evenly
    gate_lr_mult: float = 100.0  # β's learning rate = learning_rate * gate_lr_mult (see Model.lr_multipliers)
    rope_base: float = 10000.0  # RoPE θ_i = rope_base^(-2i/d_head) on the local attention's queries and keys
    pre_lnorm: bool = False   # False: post-LN (as model_xl.py); True: pre-LN (+ final LayerNorm)
    init_std: float = 0.02    # normal init of weights, as model_xl.py

    def __post_init__(self):
        for name in ('vocab_size', 'n_layer', 'n_head', 'n_embd', 'd_head', 'd_inner', 'seg_len'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ('dropout', 'dropatt'):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        rules = {'memory_update': (self.memory_update in ('linear', 'delta'), "'linear' or 'delta'"),
                 'd_head': (self.d_head % 2 == 0, "even (RoPE rotates pairs of dimensions)"),
                 'gate_lr_mult': (self.gate_lr_mult >= 0.0, ">= 0"), 'rope_base': (self.rope_base > 0.0, "> 0"),
                 'gate_init': (math.isfinite(self.gate_init), "finite"), 'init_std': (self.init_std > 0.0, "> 0")}
        for name, (ok, rule) in rules.items():
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


@dataclass
class Memory:
    """Fixed-shape recurrent state (torch.compile compiles once), not detached: train.py's bptt_segments is."""
    M: torch.Tensor       # (n_layer, B, n_head, d_head, d_head) the associative matrix of each head, Eq. 4/5
    z: torch.Tensor       # (n_layer, B, n_head, d_head) the normaliser of each head, Σ σ(K_t)
    length: torch.Tensor  # (B,) int64, tokens written into the memory since the row was last emptied (0 = empty)


@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it into the memory, in buffers of fixed shape
    (forward() takes a whole segment in one call). K = seg_len slots, right-aligned: the tokens so far fill the right
    end and padding the left. A step of T tokens slides the window by T (decode() never lets a valid slot fall off),
    so every token's step has the same shapes and writes in place: decode() can capture it. At the close the window
    holds exactly the segment's seg_len tokens, whose unrotated keys and values are written into the memory."""
    t: torch.Tensor          # (1,) int64, the tokens so far: the RoPE position of the next one
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k_rot, k, v), each (B, H, K, D): keys rotated and not, values of the K slots
    M: torch.Tensor          # (n_layer, B, H, D, D) M_{s-1}, the memory the segment reads (Eq. 3)
    z: torch.Tensor          # (n_layer, B, H, D) z_{s-1}
    has_memory: torch.Tensor  # (B, 1, 1, 1) bool


# -----------------------------------------------------------------------------------------------------------
# The compressive memory (§2.1.2). Everything here runs in the memory's dtype (float32) with autocast off.


SIGMA_FLOOR = 1e-15   # σ's smallest value: σ(q)·z >= 1e-30 cannot underflow float32 (smallest normal 1.2e-38)


def sigma(x):
    """σ = ELU + 1 (Katharopoulos et al., 2020): positive, so every key adds a positive amount to z. Written
    relu(x) + exp(min(x, 0)) and floored at SIGMA_FLOOR: F.elu(x) + 1 is exactly 0 in float32 below x ≈ -17, and a
    query with every coordinate there would read 0/0 = NaN in Eq. 3."""
    return F.relu(x) + torch.exp(x.clamp(min=math.log(SIGMA_FLOOR), max=0.0))


def memory_retrieve(sigma_q, M, z, has_memory):
    """Eq. 3: A_mem = σ(Q) M_{s-1} / (σ(Q) z_{s-1}). sigma_q (B, H, T, D), M (B, H, D, D), z (B, H, D), has_memory
    (B, 1, 1, 1) bool -> (B, H, T, D). An empty memory (0/0) divides by 1: 0, no NaN in the value or gradient."""
    numerator = sigma_q @ M                                       # (B, H, T, D), 0 for an empty memory
    denominator = sigma_q @ z.unsqueeze(-1)                       # (B, H, T, 1), > 0 once anything was written
    return numerator / torch.where(has_memory, denominator, torch.ones_like(denominator))


def update_memory(sigma_k, v, M, z, has_memory, rule):
    """Write a segment's keys and values: Eq. 4 (rule 'linear') or Eq. 5 (rule 'delta').
    sigma_k, v (B, H, T, D); M (B, H, D, D); z (B, H, D). Returns the new (M, z)."""
    if rule == 'delta':
        # Eq. 5: write only what M_{s-1} does not already return for these keys
        v = v - memory_retrieve(sigma_k, M, z, has_memory)
    M = M + sigma_k.transpose(-2, -1) @ v                         # (B, H, D, D)   σ(K)ᵀ V
    z = z + sigma_k.sum(dim=-2)                                   # (B, H, D)      Σ_t σ(K_t)
    return M, z


# -----------------------------------------------------------------------------------------------------------
# Rotary positions (Su et al., 2021): the paper's Figure 1 puts "PE" on the local attention only, not the memory.


class RotaryEmbedding(nn.Module):
    """cos and sin of m θ_i for positions m = 0 .. n_positions-1 of a segment, θ_i = rope_base^(-2i/d_head), tabulated
    once (float64, kept in float32): computed in forward, torch.compile recomputes them for every row and head.
    start: an int, or a tensor of one element (generate()'s OpenSegment.t, which a captured step reads)."""

    def __init__(self, d_head, base, n_positions):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head))
        angles = torch.outer(torch.arange(n_positions, dtype=torch.float64), inv_freq)   # (n_positions, D/2)
        self.register_buffer('cos', angles.cos().float(), persistent=False)
        self.register_buffer('sin', angles.sin().float(), persistent=False)

    def forward(self, start, T):
        positions = start + torch.arange(T, device=self.cos.device)   # (T,)
        return self.cos[positions], self.sin[positions]            # (T, D/2) each


def apply_rope(x, cos, sin):
    """Rotate each pair (x_{2i}, x_{2i+1}) of x (B, H, T, D) by the angle m θ_i of its position m."""
    x1, x2 = x[..., 0::2], x[..., 1::2]                           # (B, H, T, D/2) each
    rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)   # (B, H, T, D/2, 2)
    return rotated.flatten(-2).to(x.dtype)                        # (B, H, T, D), pairs interleaved back


class InfiniAttention(nn.Module):
    """Multi-head Infini-attention (§2.1) with its residual and LayerNorm: local causal softmax attention with
    RoPE, retrieval from the compressive memory, and the per-head gate β (Eq. 6)."""

    def __init__(self, config):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.d_head
        self.n_head, self.d_head = H, D
        self.qkv_net = nn.Linear(C, 3 * H * D, bias=False)       # W_Q, W_K, W_V (Eq. 1), shared by both sides
        self.o_net = nn.Linear(H * D, C, bias=False)             # W_O (§2.1.2)
        self.beta = nn.Parameter(torch.full((H,), float(config.gate_init)))   # β of Eq. 6, one per head
        self.layer_norm = nn.LayerNorm(C)
        self.drop = nn.Dropout(config.dropout)
        self.dropatt_p = config.dropatt
        self.pre_lnorm = config.pre_lnorm

    def features(self, x):
        """σ of the memory's queries or keys (Eqs. 3-5); lab/model_infini_probes.py overrides it."""
        return sigma(x)

    def gate(self):
        return torch.sigmoid(self.beta)                           # (H,)

    def forward(self, h, M, z, has_memory, rope, attn_mask, cache=None):
        """h (B, T, C): the segment's layer input (or its next T tokens, in generate); M, z: M_{s-1} (B, H, D, D) and
        z_{s-1} (B, H, D); has_memory (B, 1, 1, 1) bool; rope: (cos, sin) (T, D/2) of these T positions; cache: None,
        or (k_rot, k, v) (B, H, S, D) of S earlier key slots; attn_mask: (T, S + T) or (B, 1, T, S + T) bool, the keys
        each query sees. -> out (B, T, C), (k_rot, k, v) of the S + T keys"""
        B, T, C = h.shape
        H, D = self.n_head, self.d_head
        x = self.layer_norm(h) if self.pre_lnorm else h
        qkv = self.qkv_net(x).view(B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                      # each (B, H, T, D), unrotated
        q_rot, k_rot = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k_rot, k, v = (torch.cat([old, new], dim=2) for old, new in zip(cache, (k_rot, k, v)))

        # local attention, Eq. 2: causal inside the segment
        A_dot = F.scaled_dot_product_attention(q_rot, k_rot, v, attn_mask=attn_mask,
                                               dropout_p=self.dropatt_p if self.training else 0.0)  # (B, H, T, D)

        # memory retrieval, Eq. 3, in the memory's dtype (float32 even under bf16 autocast)
        with torch.autocast(h.device.type, enabled=False):
            A_mem = memory_retrieve(self.features(q.to(M.dtype)), M, z, has_memory)   # (B, H, T, D)

        # Eq. 6: A = sigmoid(β) A_mem + (1 - sigmoid(β)) A_dot, per head, as one op: A_dot + g (A_mem - A_dot)
        g = self.gate().view(1, H, 1, 1)
        A = torch.lerp(A_dot.to(A_mem.dtype), A_mem, g).to(A_dot.dtype)   # (B, H, T, D)
        attn_out = self.drop(self.o_net(A.transpose(1, 2).reshape(B, T, H * D)))   # (B, T, C)   O (§2.1.2)
        out = h + attn_out if self.pre_lnorm else self.layer_norm(h + attn_out)
        return out, (k_rot, k, v)

    def update_memory(self, M, z, has_memory, k, v, rule):
        """Write the segment's unrotated keys and values k, v (B, H, T, D) into (M, z): Eq. 4 or 5, by the
        module's update_memory on σ(K), in the memory's dtype."""
        with torch.autocast(k.device.type, enabled=False):
            return update_memory(self.features(k.to(M.dtype)), v.to(M.dtype), M, z, has_memory, rule)


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = InfiniAttention(config)
        self.ff = PositionwiseFF(config.n_embd, config.d_inner, config.dropout, config.pre_lnorm)

    def forward(self, h, M, z, has_memory, rope, attn_mask, cache=None):
        h, kv = self.attn(h, M, z, has_memory, rope, attn_mask, cache)
        return self.ff(h), kv


# -----------------------------------------------------------------------------------------------------------
# The model


class Model(nn.Module):
    # Copied from model_xl.py (Model.__init__) with pos_emb, r_w_bias, r_r_bias (u, v) -> rope
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.word_emb = ScaledEmbedding(config.vocab_size, C)
        self.rope = RotaryEmbedding(config.d_head, config.rope_base, config.seg_len)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(C) if config.pre_lnorm else nn.Identity()
        self.apply(self._init_weights)

    # Copied from model_xl.py (Model._init_weights)
    # (β is a Parameter, not a module: it keeps gate_init)
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

    def lr_multipliers(self):
        """β learns gate_lr_mult times faster: Adam moves it about lr a step, Σ_t lr_t = 0.5 over the demo's 1000
        steps, which keeps sigmoid(β) in [0.38, 0.62] whatever the memory is worth; this lets it reach 0 or 1."""
        return {f'layers.{n}.attn.beta': self.config.gate_lr_mult for n in range(self.config.n_layer)}

    # --- memory -------------------------------------------------------------------------------------------

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams; mem_len (train.py's --eval_mem_len) is ignored: no length."""
        c = self.config
        dtype = self.word_emb.weight.dtype                       # float32 under autocast; the model's own if cast
        L, H, D = c.n_layer, c.n_head, c.d_head
        return Memory(M=torch.zeros(L, batch_size, H, D, D, device=device, dtype=dtype),
                      z=torch.zeros(L, batch_size, H, D, device=device, dtype=dtype),
                      length=torch.zeros(batch_size, dtype=torch.long, device=device))

    def reset_memory(self, memory, mask):
        """Empty the memory of the rows where mask (B,) is True, e.g. at a document boundary."""
        keep = ~mask
        return Memory(M=memory.M * keep[None, :, None, None, None].to(memory.M.dtype),
                      z=memory.z * keep[None, :, None, None].to(memory.z.dtype), length=memory.length * keep)

    def gates(self):
        """sigmoid(β) of every head, (n_layer, n_head), detached: how much each head reads from its memory."""
        return torch.stack([layer.attn.gate() for layer in self.layers]).detach()

    # --- forward ------------------------------------------------------------------------------------------

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len; memory: Memory. -> logits, loss, new_memory (with its graph), aux."""
        c = self.config
        B, T = idx.shape
        if T > c.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={c.seg_len}")
        has_memory = (memory.length > 0).view(B, 1, 1, 1)
        rope = self.rope(0, T)                                    # (T, D/2) x2
        causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()   # (T, T), Eq. 2 inside the segment

        h = self.drop(self.word_emb(idx))                         # (B, T, C)
        new_M, new_z = [], []
        for n, layer in enumerate(self.layers):
            h, (_, k, v) = layer(h, memory.M[n], memory.z[n], has_memory, rope, causal)   # retrieve (Eq. 3) ...
            M, z = layer.attn.update_memory(memory.M[n], memory.z[n], has_memory, k, v, c.memory_update)
            new_M.append(M)                                       # ... then update (Eq. 4 / 5)
            new_z.append(z)
        h = self.drop(self.ln_f(h))
        logits = F.linear(h, self.word_emb.weight)                # (B, T, V), tied output layer

        new_memory = Memory(M=torch.stack(new_M), z=torch.stack(new_z), length=memory.length + T)
        gates = self.gates()                                      # (L, H)
        aux = {'gate': gates.mean(dim=1), 'gate_head': gates}     # per layer (mean over heads), per head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
        return logits, loss, new_memory, aux

    # Copied from model_xl.py (Model.num_params)
    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs per token (MFU), memory detached (bptt_segments=1; tests/test_flops.py): 6 per weight use; the
        local attention (q·k, p·v over seg_len keys); the read σ(Q) M (Eq. 3: forward and the gradient to σ(Q)), the
        write σ(K)ᵀ V (Eq. 4) and delta's σ(K) M (Eq. 5), forward only: H*D*D each, their denominators H*D."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()      # the weights of products (biases,
                       if name.endswith('weight') and p.dim() > 1)        # norms and β take none)
        HD = c.n_head * c.d_head
        local = 6 * 2 * c.n_layer * HD * c.seg_len
        delta = 2 if c.memory_update == 'delta' else 0
        memory = (4 + 2 + delta) * c.n_layer * HD * c.d_head      # σ(Q) M, σ(K)ᵀ V, σ(K) M
        memory += (4 + delta) * c.n_layer * HD                     # the denominators σ(Q) z, σ(K) z
        return 6 * matrices + local + memory

    # --- generation ---------------------------------------------------------------------------------------

    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T) on memory, in a new OpenSegment or in seg's buffers (decode() reuses them).
        -> the logits (B, V) of the last token, the OpenSegment"""
        c, B = self.config, tokens.size(0)
        H, D = c.n_head, c.d_head
        kind = tokens.device.type                                       # the slots take the projections' dtype
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.word_emb.weight.dtype
        slots = torch.zeros(B, H, c.seg_len, D, dtype=dtype, device=tokens.device)   # (B, H, K, D), all padding
        seg = refill(seg, OpenSegment(t=torch.zeros(1, dtype=torch.long, device=tokens.device),
                                      key_valid=torch.zeros(B, c.seg_len, dtype=torch.bool, device=tokens.device),
                                      kv=[(slots.clone(), slots.clone(), slots.clone()) for _ in self.layers],
                                      M=memory.M.clone(), z=memory.z.clone(),
                                      has_memory=(memory.length > 0).view(B, 1, 1, 1)))
        return self.step(tokens, seg, tokens.size(1)), seg

    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg, which it updates in place. filled: as model_xl.py's (the
        step skips the seg_len - filled padding slots on the left; None: it reads them too, as a graph wants).
        -> logits (B, V) of the last"""
        T, S = tokens.size(1), 0 if filled is None else self.config.seg_len - filled   # S slots skipped
        K = self.config.seg_len - S                                    # the slots it reads
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K)
        causal = torch.ones(T, K, dtype=torch.bool, device=tokens.device).tril(K - T)   # query i sits at K - T + i
        attn_mask = (causal & key_valid[:, None, :])[:, None]         # (B, 1, T, K)
        rope = self.rope(seg.t, T)                                     # positions t .. t+T-1 of the segment
        h = self.drop(self.word_emb(tokens))                           # (B, T, C)
        for n, layer in enumerate(self.layers):
            cache = tuple(x[:, :, S + T:] for x in seg.kv[n])         # the slots it reads, less the T oldest
            h, kv = layer(h, seg.M[n], seg.z[n], seg.has_memory, rope, attn_mask, cache)
            for old, new in zip(seg.kv[n], kv):
                old[:, :, S:] = new
        seg.key_valid[:, S:] = key_valid
        seg.t.add_(T)
        return F.linear(self.ln_f(h[:, -1]), self.word_emb.weight)    # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it: their unrotated keys and values
        written into the memory they read (Eq. 4 / 5)."""
        c = self.config
        new_M, new_z = zip(*(layer.attn.update_memory(seg.M[n], seg.z[n], seg.has_memory, k, v, c.memory_update)
                             for n, (layer, (_, k, v)) in enumerate(zip(self.layers, seg.kv))))
        return Memory(M=torch.stack(new_M), z=torch.stack(new_z), length=memory.length + c.seg_len)

    # Copied from model_xl.py (Model.generate)
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None, cuda_graph=False):
        """Continue idx (B, T0) by max_new_tokens tokens after memory (optional; else a fresh one), as decode() says;
        callback(tokens (B, 1)) after each new token; cuda_graph: replay each token's step as one CUDA graph."""
        memory = self.init_memory(idx.size(0), idx.device) if memory is None else memory
        return decode(self, idx, memory, max_new_tokens, temperature, top_k, callback, cuda_graph)


# -----------------------------------------------------------------------------------------------------------
# Generic blocks, copied verbatim from model_xl.py (tests/test_copies.py keeps them identical).

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
