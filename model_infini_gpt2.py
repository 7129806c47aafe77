"""
Infini-attention on GPT-2 (Munkhdalai, Faruqui and Gopal, 2024, "Leave No Context Behind: Efficient Infinite Context
Transformers with Infini-attention", arXiv 2404.07143), in one file: the paper's LLM setting (§4.2), where the
compressive memory is added to the attention of an existing LLM and the model is continually pre-trained. Here the
existing LLM is OpenAI's GPT-2 (`train.py --init_from=gpt2`); config/infini_gpt2_pg19.py holds the run.

The text is read one segment of `seg_len` tokens at a time. Every head of every layer of GPT-2 uses its queries,
keys and values twice (§2.1):
  1. Local attention: GPT-2's own causal softmax attention inside the segment (Eq. 2), with GPT-2's learned
     positions 0 .. T-1 added to the segment's token embeddings, as GPT-2 reads a text of T tokens.
  2. A compressive memory: a matrix M (D x D) and a normaliser z (D) that sum up every earlier segment. With
     σ = ELU + 1 (§2.1.2):
       retrieve (Eq. 3):        A_mem = σ(Q) M_{s-1} / (σ(Q) z_{s-1})
       update, linear (Eq. 4):  M_s = M_{s-1} + σ(K)ᵀ V,        z_s = z_{s-1} + Σ_t σ(K_t)
       update, delta (Eq. 5):   M_s = M_{s-1} + σ(K)ᵀ (V - σ(K) M_{s-1} / (σ(K) z_{s-1}))   (z as in Eq. 4)
     The segment retrieves first, then writes itself, so it reads only the segments before it.
A learned scalar β per head mixes the two ("long-term context injection", Eq. 6):
       A = sigmoid(β) ⊙ A_mem + (1 - sigmoid(β)) ⊙ A_dot
and the heads are concatenated and projected by GPT-2's c_proj (W_O, §2.1.2). The paper trains through the memory
over each input (§4.1: 16 segments); the model never detaches it, train.py's `--bptt_segments=k` keeps the graph.

What differs from model_infini.py (Infini-attention on our Transformer from scratch), and why:
  - The positions. The paper's Figure 1 puts the positional encoding on the local attention only; with RoPE the
    memory takes the unrotated Q and K. GPT-2 adds its learned positions to the input of the first layer, so no
    query or key exists without them: the memory reads and writes GPT-2's own Q, K, V, and every segment's keys
    carry the same positions 0 .. T-1.
  - GPT-2's blocks: pre-LN, biases on c_attn and c_proj, GELU (tanh), learned positions, a final ln_f, the output
    layer tied to wte; parameter names are Hugging Face GPT2LMHeadModel's, so the loader fills them.
  - β's initialisation. The paper gives none, for training from scratch or for continual pre-training (as far as
    its text goes; the copy given to this project is a summary without §4). An Eq. 6 gate starts a pretrained model
    away from itself: with the memory empty (the first segment of every input) it gives (1 - sigmoid(β)) A_dot,
    GPT-2 with every head scaled down, by half at β = 0 (model_infini.py's init). Ours: gate_init = -4, so
    sigmoid(β) = 0.018 and each head starts at 98.2% of GPT-2's output (and reads the memory at 1.8%); gate_lr_mult
    lets Adam move β away from there at a fine-tuning learning rate (see Model.lr_multipliers).
  - A switch: compressive_memory=False leaves the memory out (A = A_dot, nothing read or written): exactly GPT-2.

As model_infini.py: an empty memory (M = 0, z = 0: Eq. 3 is 0/0) retrieves 0, known from a token count; M and z are
kept and computed in float32 with autocast off; σ is floored at SIGMA_FLOOR.

Letters: B rows, T tokens of a segment (or of a generate() step), K = seg_len key slots of generate()'s open
segment, H heads, D = n_embd / n_head, C = n_embd, L layers. tests/test_infini_gpt2.py checks every layer against a
per-token, per-head reference and the whole model against transformers' GPT2LMHeadModel.
"""

import math
from dataclasses import dataclass, is_dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    # GPT-2's fields, named and sized as Hugging Face's GPT2Config (GPT-2 small); the loader sets them from config.json
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024   # GPT-2's learned positions: the longest segment it can read
    layer_norm_epsilon: float = 1e-5
    dropout: float = 0.1      # GPT-2's embd_pdrop = attn_pdrop = resid_pdrop
    seg_len: int = 512        # tokens per segment (the paper's N), <= n_positions
    # Infini-attention's fields
    memory_update: str = 'linear'  # 'linear' (Eq. 4) or 'delta' (Eq. 5, "Linear + Delta")
    compressive_memory: bool = True  # False: no memory, A = A_dot: exactly GPT-2 read segment by segment
    gate_init: float = -4.0   # initial β of every head (the paper gives none): sigmoid(-4) = 0.018, near GPT-2
    gate_lr_mult: float = 100.0  # β's learning rate = learning_rate * gate_lr_mult (see Model.lr_multipliers)
    init_std: float = 0.02    # N(0, init_std) weights of a model not loaded from GPT-2 (GPT-2's initializer_range)

    def __post_init__(self):
        for name in ('vocab_size', 'n_layer', 'n_head', 'n_embd', 'n_positions', 'seg_len'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        rules = {'dropout': (0.0 <= self.dropout < 1.0, "in [0, 1)"),
                 'n_embd': (self.n_embd % self.n_head == 0, f"a multiple of n_head={self.n_head}"),
                 'seg_len': (self.seg_len <= self.n_positions, f"<= n_positions={self.n_positions}"),
                 'memory_update': (self.memory_update in ('linear', 'delta'), "'linear' or 'delta'"),
                 'layer_norm_epsilon': (self.layer_norm_epsilon > 0.0, "> 0"),
                 'gate_lr_mult': (self.gate_lr_mult >= 0.0, ">= 0"),
                 'gate_init': (math.isfinite(self.gate_init), "finite"), 'init_std': (self.init_std > 0.0, "> 0")}
        for name, (ok, rule) in rules.items():
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


@dataclass
class Memory:
    """Fixed-shape recurrent state (torch.compile compiles once), not detached: train.py's bptt_segments is."""
    M: torch.Tensor       # (n_layer, B, n_head, D, D) the associative matrix of each head, Eq. 4/5
    z: torch.Tensor       # (n_layer, B, n_head, D) the normaliser of each head, Σ σ(K_t)
    length: torch.Tensor  # (B,) int64, tokens written into the memory since the row was last emptied (0 = empty)


@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it into the memory, in buffers of fixed shape
    (forward() takes a whole segment in one call). K = seg_len slots, right-aligned: the tokens so far fill the right
    end and padding the left. A step of T tokens slides the window by T (decode() never lets a valid slot fall off),
    so every token's step has the same shapes and writes in place: decode() can capture it. At the close the window
    holds exactly the segment's seg_len tokens, whose keys and values are written into the memory."""
    t: torch.Tensor          # (1,) int64, the tokens so far: GPT-2's position of the next one
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of the K slots
    M: torch.Tensor          # (n_layer, B, H, D, D) M_{s-1}, the memory the segment reads (Eq. 3)
    z: torch.Tensor          # (n_layer, B, H, D) z_{s-1}
    has_memory: torch.Tensor  # (B, 1, 1, 1) bool


# -----------------------------------------------------------------------------------------------------------
# The compressive memory (§2.1.2). Everything here runs in the memory's dtype (float32) with autocast off.


SIGMA_FLOOR = 1e-15   # σ's smallest value: σ(q)·z >= 1e-30 cannot underflow float32 (smallest normal 1.2e-38)


# Copied from model_infini.py (sigma)
def sigma(x):
    """σ = ELU + 1 (Katharopoulos et al., 2020): positive, so every key adds a positive amount to z. Written
    relu(x) + exp(min(x, 0)) and floored at SIGMA_FLOOR: F.elu(x) + 1 is exactly 0 in float32 below x ≈ -17, and a
    query with every coordinate there would read 0/0 = NaN in Eq. 3."""
    return F.relu(x) + torch.exp(x.clamp(min=math.log(SIGMA_FLOOR), max=0.0))


# Copied from model_infini.py (memory_retrieve)
def memory_retrieve(sigma_q, M, z, has_memory):
    """Eq. 3: A_mem = σ(Q) M_{s-1} / (σ(Q) z_{s-1}). sigma_q (B, H, T, D), M (B, H, D, D), z (B, H, D), has_memory
    (B, 1, 1, 1) bool -> (B, H, T, D). An empty memory (0/0) divides by 1: 0, no NaN in the value or gradient."""
    numerator = sigma_q @ M                                       # (B, H, T, D), 0 for an empty memory
    denominator = sigma_q @ z.unsqueeze(-1)                       # (B, H, T, 1), > 0 once anything was written
    return numerator / torch.where(has_memory, denominator, torch.ones_like(denominator))


# Copied from model_infini.py (update_memory)
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
# GPT-2's layer with Infini-attention


class InfiniAttention(nn.Module):
    """GPT-2's multi-head causal self-attention (c_attn, c_proj) whose every head also reads the compressive memory
    (Eq. 3), mixed in by its gate β (Eq. 6). Without the memory (compressive_memory=False) it is GPT-2's attention."""

    # Copied from model_gpt2.py (CausalSelfAttention.__init__) with β and compressive_memory added
    def __init__(self, config):
        super().__init__()
        self.n_head, self.d_head = config.n_head, config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)   # W_Q, W_K, W_V side by side (Eq. 1)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)       # W_O (§2.1.2)
        self.attn_dropout_p = config.dropout                        # on the attention probabilities
        self.resid_dropout = nn.Dropout(config.dropout)
        self.beta = nn.Parameter(torch.full((config.n_head,), float(config.gate_init)),   # β of Eq. 6, one per head
                                 requires_grad=config.compressive_memory)   # unused without the memory (DDP)
        self.compressive_memory = config.compressive_memory

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

    def gate(self):
        return torch.sigmoid(self.beta)                           # (H,)

    def forward(self, x, M, z, has_memory, attn_mask, cache=None):
        """x (B, T, C): the layer's normalised input (ln_1's), the segment's or (in generate) its next T tokens';
        M, z: M_{s-1} (B, H, D, D) and z_{s-1} (B, H, D); has_memory (B, 1, 1, 1) bool; cache: None, or (k, v)
        (B, H, S, D) of S earlier key slots; attn_mask: (T, S + T) or (B, 1, T, S + T) bool, the keys each query
        sees. -> out (B, T, C), (k, v) of the S + T keys"""
        q, k, v = self.query_key_value(x)                         # each (B, H, T, D)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)   # (B, H, S+T, D)

        # local attention, Eq. 2: GPT-2's causal attention inside the segment
        A = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.attn_dropout_p if self.training else 0.0)  # (B, H, T, D)
        if self.compressive_memory:
            # memory retrieval, Eq. 3, in the memory's dtype (float32 even under bf16 autocast)
            with torch.autocast(x.device.type, enabled=False):
                A_mem = memory_retrieve(sigma(q.to(M.dtype)), M, z, has_memory)   # (B, H, T, D)
            # Eq. 6: A = sigmoid(β) A_mem + (1 - sigmoid(β)) A_dot, per head, as one op: A_dot + g (A_mem - A_dot)
            g = self.gate().view(1, self.n_head, 1, 1)
            A = torch.lerp(A.to(A_mem.dtype), A_mem, g).to(A.dtype)   # (B, H, T, D)
        return self.output(A), (k, v)                             # O = [A^1; ...; A^H] W_O (§2.1.2)

    def update_memory(self, M, z, has_memory, k, v, rule):
        """Write the segment's keys and values k, v (B, H, T, D) into (M, z): Eq. 4 or 5, by the module's
        update_memory on σ(K), in the memory's dtype."""
        with torch.autocast(k.device.type, enabled=False):
            return update_memory(sigma(k.to(M.dtype)), v.to(M.dtype), M, z, has_memory, rule)


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
    """GPT-2's pre-LN block with Infini-attention: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    # Copied from model_gpt2.py (Block.__init__) with CausalSelfAttention -> InfiniAttention
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = InfiniAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x, M, z, has_memory, attn_mask, cache=None):
        a, kv = self.attn(self.ln_1(x), M, z, has_memory, attn_mask, cache)
        x = x + a
        return x + self.mlp(self.ln_2(x)), kv


# -----------------------------------------------------------------------------------------------------------
# The model


class Model(nn.Module):
    gpt2_form = True   # train.py --init_from=gpt2... loads OpenAI's weights into it; β stays at gate_init

    # Copied from model_gpt2.py (Model.__init__)
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
        self.apply(self._init_weights)

    # Copied from model_gpt2.py (Model._init_weights) with CausalSelfAttention -> InfiniAttention
    # (β is a Parameter, not a module: it keeps gate_init)
    def _init_weights(self, module):
        # As GPT-2's (HF GPT2PreTrainedModel): N(0, init_std) weights and embeddings, zero biases, LayerNorm 1 and 0,
        # and the projections into the residual stream (c_proj) N(0, init_std / sqrt(2 n_layer)).
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, (InfiniAttention, MLP)):
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
        """β learns gate_lr_mult times faster: Adam moves a parameter about lr a step, and at a continual
        pre-training learning rate β would barely leave gate_init; this lets sigmoid(β) reach 0 or 1."""
        return {f'transformer.h.{n}.attn.beta': self.config.gate_lr_mult for n in range(self.config.n_layer)}

    # --- memory -------------------------------------------------------------------------------------------

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams; mem_len (train.py's --eval_mem_len) is ignored: no length."""
        c = self.config
        dtype = self.transformer.wte.weight.dtype                # float32 under autocast; the model's own if cast
        L, H, D = c.n_layer, c.n_head, c.n_embd // c.n_head
        return Memory(M=torch.zeros(L, batch_size, H, D, D, device=device, dtype=dtype),
                      z=torch.zeros(L, batch_size, H, D, device=device, dtype=dtype),
                      length=torch.zeros(batch_size, dtype=torch.long, device=device))

    # Copied from model_infini.py (Model.reset_memory)
    def reset_memory(self, memory, mask):
        """Empty the memory of the rows where mask (B,) is True, e.g. at a document boundary."""
        keep = ~mask
        return Memory(M=memory.M * keep[None, :, None, None, None].to(memory.M.dtype),
                      z=memory.z * keep[None, :, None, None].to(memory.z.dtype), length=memory.length * keep)

    def gates(self):
        """sigmoid(β) of every head, (n_layer, n_head), detached: how much each head reads from its memory."""
        return torch.stack([block.attn.gate() for block in self.transformer.h]).detach()

    def write_memory(self, memory, has_memory, kv, T):
        """The memory after a segment of T tokens whose keys and values per layer are kv: each written into the memory
        it read (Eq. 4 / 5). Without the compressive memory nothing is written, and the memory stays empty."""
        c = self.config
        if not c.compressive_memory:
            return memory
        new_M, new_z = zip(*(block.attn.update_memory(memory.M[n], memory.z[n], has_memory, k, v, c.memory_update)
                             for n, (block, (k, v)) in enumerate(zip(self.transformer.h, kv))))
        return Memory(M=torch.stack(new_M), z=torch.stack(new_z), length=memory.length + T)

    # --- forward ------------------------------------------------------------------------------------------

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len; memory: Memory. -> logits, loss, new_memory (with its graph), aux."""
        c = self.config
        B, T = idx.shape
        if T > c.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={c.seg_len}")
        has_memory = (memory.length > 0).view(B, 1, 1, 1)
        causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()   # (T, T), Eq. 2 inside the segment

        h = self.embed(idx, torch.arange(T, device=idx.device))  # (B, T, C), positions 0 .. T-1
        kv = []
        for n, block in enumerate(self.transformer.h):
            h, (k, v) = block(h, memory.M[n], memory.z[n], has_memory, causal)   # retrieve (Eq. 3) ...
            kv.append((k, v))
        logits = self.logits(h)                                   # (B, T, V)
        new_memory = self.write_memory(memory, has_memory, kv, T)   # ... then update (Eq. 4 / 5)

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
        """Training FLOPs per token (MFU), memory detached: 6 per weight use (wpe is a lookup, not a product; wte is
        used once, as the output layer); the local attention (q·k, p·v over seg_len keys); the read σ(Q) M (Eq. 3:
        forward and the gradient to σ(Q)), the write σ(K)ᵀ V (Eq. 4) and delta's σ(K) M (Eq. 5), forward only:
        H*D*D each, their denominators H*D."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()
                       if name.endswith('weight') and p.dim() > 1 and name != 'transformer.wpe.weight')
        D = c.n_embd // c.n_head
        local = 6 * 2 * c.n_layer * c.n_embd * c.seg_len
        if not c.compressive_memory:
            return 6 * matrices + local
        delta = 2 if c.memory_update == 'delta' else 0
        memory = (4 + 2 + delta) * c.n_layer * c.n_embd * D       # σ(Q) M, σ(K)ᵀ V, σ(K) M
        memory += (4 + delta) * c.n_layer * c.n_embd               # the denominators σ(Q) z, σ(K) z
        return 6 * matrices + local + memory

    # --- generation ---------------------------------------------------------------------------------------

    # Copied from model_gpt2.py (Model.open_segment) with the memory the segment reads (M, z, has_memory) added
    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T) on memory, in a new OpenSegment or in seg's buffers (decode() reuses them).
        -> the logits (B, V) of the last token, the OpenSegment"""
        c, B = self.config, tokens.size(0)
        kind = tokens.device.type                                       # the slots take the projections' dtype
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.lm_head.weight.dtype
        slots = torch.zeros(B, c.n_head, c.seg_len, c.n_embd // c.n_head, dtype=dtype, device=tokens.device)
        seg = refill(seg, OpenSegment(t=torch.zeros(1, dtype=torch.long, device=tokens.device),
                                      key_valid=torch.zeros(B, c.seg_len, dtype=torch.bool, device=tokens.device),
                                      kv=[(slots.clone(), slots.clone()) for _ in self.transformer.h],
                                      M=memory.M.clone(), z=memory.z.clone(),
                                      has_memory=(memory.length > 0).view(B, 1, 1, 1)))
        return self.step(tokens, seg, tokens.size(1)), seg

    # Copied from model_gpt2.py (Model.step) with the blocks reading the segment's memory (seg.M, seg.z, has_memory)
    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg, which it updates in place. filled: as model_xl.py's (the
        step skips the seg_len - filled padding slots on the left; None: it reads them too, as a graph wants).
        -> logits (B, V) of the last"""
        T, S = tokens.size(1), 0 if filled is None else self.config.seg_len - filled   # S slots skipped
        K = self.config.seg_len - S                                    # the slots it reads
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K)
        causal = torch.ones(T, K, dtype=torch.bool, device=tokens.device).tril(K - T)   # query i sits at K - T + i
        attn_mask = (causal & key_valid[:, None, :])[:, None]         # (B, 1, T, K)
        h = self.embed(tokens, seg.t + torch.arange(T, device=tokens.device))   # positions t .. t+T-1
        for n, block in enumerate(self.transformer.h):
            cache = tuple(x[:, :, S + T:] for x in seg.kv[n])         # the slots it reads, less the T oldest
            h, kv = block(h, seg.M[n], seg.z[n], seg.has_memory, attn_mask, cache)
            for old, new in zip(seg.kv[n], kv):
                old[:, :, S:] = new
        seg.key_valid[:, S:] = key_valid
        seg.t.add_(T)
        return self.logits(h[:, -1])                                   # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it: their keys and values written
        into the memory they read (Eq. 4 / 5)."""
        return self.write_memory(memory, seg.has_memory, seg.kv, self.config.seg_len)

    # Copied from model_xl.py (Model.generate)
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None, cuda_graph=False):
        """Continue idx (B, T0) by max_new_tokens tokens after memory (optional; else a fresh one), as decode() says;
        callback(tokens (B, 1)) after each new token; cuda_graph: replay each token's step as one CUDA graph."""
        memory = self.init_memory(idx.size(0), idx.device) if memory is None else memory
        return decode(self, idx, memory, max_new_tokens, temperature, top_k, callback, cuda_graph)


# -----------------------------------------------------------------------------------------------------------
# Generic blocks, copied verbatim from model_xl.py (tests/test_copies.py keeps them identical).

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
