"""
GPT-2 (Radford et al., 2019, "Language Models are Unsupervised Multitask Learners") read segment by segment, in one
file: the "GPT-2 alone" baseline of the ∞-former paper's language-modelling experiments (Martins et al., 2022, §4.2,
Table 1: GPT-2 small fine-tuned on WikiText-103 and on the first 2,000 books of PG-19 with inputs of L = 512 tokens).

The model is OpenAI's GPT-2, unchanged: learned absolute positions (wpe), pre-LN blocks, a GELU feed-forward four times
wide, a final LayerNorm and an output layer tied to the token embedding. What makes it a baseline for the memory models
is how it reads a long text: one segment of `seg_len` tokens at a time, each on its own, with positions 0..T-1. No
state crosses a segment, so every token sees only the tokens before it in its own segment; the memory forms
(model_infformer_gpt2.py, model_compressive_gpt2.py, model_infini_gpt2.py) add what this one lacks.
Its Memory holds nothing but a token count, so train.py and sample.py drive it as every other model.

`train.py --init_from=gpt2` (or gpt2-medium/-large/-xl, or gpt2:DIR) loads OpenAI's weights through pretrained.py:
the parameter names below are Hugging Face GPT2LMHeadModel's, and ours are nn.Linear where theirs are Conv1D (the
loader transposes). tests/test_gpt2.py checks the logits against transformers' GPT2LMHeadModel within 1e-5.

Letters: B rows, T tokens of the segment, K key slots, H heads, D = n_embd / n_head, C = n_embd, V = vocab_size.
Reading order: GPT-2's blocks (feed-forward, attention, block), which the memory forms copy, then the model (memory,
forward, generate), then the generic blocks every model file copies from model_xl.py.
"""

import math
from dataclasses import dataclass, is_dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    # Defaults: GPT-2 small (124M), with its Hugging Face GPT2Config names; --init_from=gpt2... sets the first six.
    vocab_size: int = 50257   # GPT-2's BPE, unpadded: the pretrained embedding has 50257 rows
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024   # learned positions: the longest segment the model can read
    layer_norm_epsilon: float = 1e-5
    seg_len: int = 512        # tokens per segment (the ∞-former paper's L = 512), <= n_positions
    dropout: float = 0.1      # GPT-2's embd_pdrop = attn_pdrop = resid_pdrop
    init_std: float = 0.02    # GPT-2's initializer_range, for a model trained from scratch

    def __post_init__(self):
        for name in ('vocab_size', 'n_layer', 'n_head', 'n_embd', 'n_positions', 'seg_len'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.seg_len > self.n_positions:
            raise ValueError(f"seg_len ({self.seg_len}) must be <= n_positions ({self.n_positions}): "
                             "GPT-2 has no position beyond n_positions - 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon}")


@dataclass
class Memory:
    """GPT-2 alone carries nothing across segments; a fixed-shape Memory still exists so train.py saves, resets and
    detaches it as every model's."""
    length: torch.Tensor  # (B,) int64, tokens read since the row was last emptied


@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it, in buffers of fixed shape (forward() takes
    a whole segment in one call). K = seg_len slots, right-aligned: the tokens so far fill the right end and padding
    the left. A step of T tokens slides the window by T (decode() never lets a valid slot fall off), so every token's
    step has the same shapes and writes in place: decode() can capture it."""
    t: torch.Tensor          # (1,) int64, the tokens so far: the position of the next one
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of the K slots


# -----------------------------------------------------------------------------------------------------------
# GPT-2's blocks, which the memory forms copy (tests/test_copies.py keeps them identical)

class MLP(nn.Module):
    """GPT-2's feed-forward: C -> 4C, GELU (its tanh approximation, HF's gelu_new), -> C, dropout."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate='tanh')))


class CausalSelfAttention(nn.Module):
    """GPT-2's multi-head attention: one projection c_attn to queries, keys and values, softmax(q kᵀ/√D) v, the
    heads merged and projected back by c_proj."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.d_head = config.n_head, config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)   # W_Q, W_K, W_V side by side
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)       # W_O
        self.attn_dropout_p = config.dropout                        # on the attention probabilities
        self.resid_dropout = nn.Dropout(config.dropout)

    def query_key_value(self, x):
        """Queries, keys and values (B, H, T, D) of the layer's normalised input x (B, T, C)."""
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, self.d_head)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)                 # q, k, v: each (B, H, T, D)

    def output(self, y):
        """The heads' outputs y (B, H, T, D) merged and projected: the attention's contribution (B, T, C)."""
        B, H, T, D = y.shape
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, H * D)))

    def forward(self, x, attn_mask=None, cache=None):
        """x (B, T, C): the layer's normalised input; cache: None, or keys, values (B, H, S, D) of S earlier slots;
        attn_mask: None (causal over the T keys), or (B, 1, T, S + T) bool, the keys each query sees.
        -> out (B, T, C), (k, v) of the S + T keys"""
        q, k, v = self.query_key_value(x)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)   # (B, H, S+T, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                           dropout_p=self.attn_dropout_p if self.training else 0.0)  # (B, H, T, D)
        return self.output(y), (k, v)


class Block(nn.Module):
    """GPT-2's pre-LN block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x, attn_mask=None, cache=None):
        a, kv = self.attn(self.ln_1(x), attn_mask, cache)
        x = x + a
        return x + self.mlp(self.ln_2(x)), kv


# -----------------------------------------------------------------------------------------------------------
# The model


class Model(nn.Module):
    gpt2_form = True   # train.py --init_from=gpt2... loads OpenAI's weights into it (pretrained.py)

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

    def _init_weights(self, module):
        # As GPT-2's (HF GPT2PreTrainedModel): N(0, init_std) weights and embeddings, zero biases, LayerNorm 1 and 0,
        # and the projections into the residual stream (c_proj) N(0, init_std / sqrt(2 n_layer)).
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, (CausalSelfAttention, MLP)):
            nn.init.normal_(module.c_proj.weight, 0.0, std / math.sqrt(2 * self.config.n_layer))
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def embed(self, idx, pos):
        """h^0 (B, T, C) of the tokens idx (B, T) at the positions pos (T,): token + position embedding, dropout."""
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def logits(self, h):
        """The output layer on the last block's output h (..., C): final LayerNorm, tied softmax weights."""
        return self.lm_head(self.transformer.ln_f(h))              # (..., V)

    # --- memory -------------------------------------------------------------------------------------------

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams; mem_len (train.py's --eval_mem_len) is ignored: no memory."""
        return Memory(length=torch.zeros(batch_size, dtype=torch.long, device=device))

    def reset_memory(self, memory, mask):
        """Empty the memory of the rows where mask (B,) is True, e.g. at a document boundary."""
        return Memory(length=memory.length * ~mask)

    # --- forward ------------------------------------------------------------------------------------------

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len, read on their own at positions 0..T-1; memory: Memory (a token count).
        Returns (logits, loss, new_memory, aux)."""
        B, T = idx.shape
        if T > self.config.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={self.config.seg_len}")
        h = self.embed(idx, torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.transformer.h:
            h, _ = block(h)                                       # causal over the segment's T tokens
        logits = self.logits(h)                                   # (B, T, V)

        new_memory = Memory(length=memory.length + T)
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
        return logits, loss, new_memory, aux

    # --- bookkeeping for train.py -------------------------------------------------------------------------

    # Copied from model_xl.py (Model.num_params)
    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs (forward + backward) per token, for MFU: 6 per use of a weight (2 forward, 2 for its input's
        gradient, 2 for its own); 6 per multiply-add of the attention over the segment's seg_len keys (q·k and p·v,
        counted over every key as the kernels compute them). wpe is a lookup, no product (tests/test_flops.py)."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()      # the weights of products (biases,
                       if name.endswith('weight') and p.dim() > 1)        # norms take none; wte is lm_head's)
        matrices -= self.transformer.wpe.weight.numel()
        attention = 6 * 2 * c.n_layer * c.n_embd * c.seg_len
        return 6 * matrices + attention

    # --- generation ---------------------------------------------------------------------------------------

    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T), in a new OpenSegment or in seg's buffers (decode() reuses them); memory is
        not read: a segment starts afresh at position 0. -> the logits (B, V) of the last token, the OpenSegment"""
        c, B = self.config, tokens.size(0)
        kind = tokens.device.type                                       # the slots take the projections' dtype
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.lm_head.weight.dtype
        slots = torch.zeros(B, c.n_head, c.seg_len, c.n_embd // c.n_head, dtype=dtype, device=tokens.device)
        seg = refill(seg, OpenSegment(t=torch.zeros(1, dtype=torch.long, device=tokens.device),
                                      key_valid=torch.zeros(B, c.seg_len, dtype=torch.bool, device=tokens.device),
                                      kv=[(slots.clone(), slots.clone()) for _ in self.transformer.h]))
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
        h = self.embed(tokens, seg.t + torch.arange(T, device=tokens.device))   # positions t .. t+T-1
        for n, block in enumerate(self.transformer.h):
            cache = tuple(x[:, :, S + T:] for x in seg.kv[n])         # the slots it reads, less the T oldest
            h, kv = block(h, attn_mask, cache)
            for old, new in zip(seg.kv[n], kv):
                old[:, :, S:] = new
        seg.key_valid[:, S:] = key_valid
        seg.t.add_(T)
        return self.logits(h[:, -1])                                   # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it: only the count moves."""
        return Memory(length=memory.length + self.config.seg_len)

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
