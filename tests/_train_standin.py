"""A tiny stand-in model that follows the SPEC §1 contract but shares nothing with model_xl.py, to test train.py's
generic machinery (tests/test_train.py resolves --model=standin to this module).

It differs from Transformer-XL where train.py must not care: its Memory has other fields (a running state that
*carries gradient* -- the model never detaches it, train.py's bptt_segments decides -- and a segment counter),
it returns extra auxiliary losses, and it asks for a learning-rate multiplier on one parameter.

Every training-mode forward appends a record to TRACE (incoming state, counter, tokens); reset_memory appends its
mask to RESETS. The incoming state gets retain_grad(), so after backward a test can see where gradient arrived."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

TRACE = []
RESETS = []
GATE_LR_MULT = 10.0
CONST_AUX = 0.25
FLOAT_AUX = 0.75


@dataclass
class Config:
    vocab_size: int = 256
    n_layer: int = 1
    n_head: int = 1
    n_embd: int = 16
    dropout: float = 0.0
    seg_len: int = 8
    decay: float = 0.5            # state' = decay * state + mean of this segment's embeddings
    aux_weight: float = 0.1       # weight of the auxiliary loss (mean square of the new state)
    float_aux: bool = False       # also return a plain Python float in aux (SPEC: "dict of floats/tensors")

    def __post_init__(self):
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@dataclass
class Memory:
    state: torch.Tensor   # (B, n_embd) running summary of the stream, with its graph (no detach here)
    seen: torch.Tensor    # (B,) int64, segments read since this row's memory was last emptied


class Model(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.emb = nn.Embedding(config.vocab_size, C)
        self.mix = nn.Linear(C, C)
        self.gate = nn.Parameter(torch.zeros(C))
        self.head = nn.Linear(C, config.vocab_size)
        self.drop = nn.Dropout(config.dropout)

    def lr_multipliers(self):
        return {'gate': GATE_LR_MULT}

    def init_memory(self, batch_size, device, mem_len=None):
        return Memory(state=torch.zeros(batch_size, self.config.n_embd, device=device),
                      seen=torch.zeros(batch_size, dtype=torch.long, device=device))

    def reset_memory(self, memory, mask):
        RESETS.append(mask.detach().cpu().clone())
        keep = ~mask
        return Memory(state=memory.state * keep[:, None].to(memory.state.dtype), seen=memory.seen * keep)

    def forward(self, idx, memory, targets=None):
        if self.training and torch.is_grad_enabled():
            if memory.state.requires_grad:
                memory.state.retain_grad()
            TRACE.append({'state': memory.state, 'seen': memory.seen.clone(), 'idx': idx.clone()})
        x = self.drop(self.emb(idx))                                                      # (B, T, C)
        h = x + torch.sigmoid(self.gate) * torch.tanh(self.mix(memory.state))[:, None]     # (B, T, C)
        logits = self.head(h)                                                             # (B, T, V)
        new_memory = Memory(state=self.config.decay * memory.state + x.mean(1), seen=memory.seen + 1)
        loss, aux = None, {}
        if targets is not None:
            lm_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux_loss = new_memory.state.pow(2).mean()
            loss = lm_loss + self.config.aux_weight * aux_loss
            aux = {'lm_loss': lm_loss.detach(), 'aux_loss': aux_loss.detach(),
                   'const_aux': torch.tensor(CONST_AUX)}
            if self.config.float_aux:
                aux['float_aux'] = FLOAT_AUX
        return logits, loss, new_memory, aux

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None):
        memory = self.init_memory(idx.size(0), idx.device) if memory is None else memory
        for _ in range(max_new_tokens):
            logits, _, _, _ = self(idx[:, -self.config.seg_len:], memory)
            idx_next = logits[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, idx_next], dim=1)
            if callback is not None:
                callback(idx_next)
        return idx


class Evil:
    """Unpickling this runs code (it touches `marker`): a checkpoint holding one must be refused, not executed."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib
        return pathlib.Path.touch, (pathlib.Path(self.marker),)
