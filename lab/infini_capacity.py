"""
How many associative-recall pairs Infini-attention's compressive memory can give back, whatever the rest of the
model learns: the memory alone, trained on the assoc task of bench/recall.py in isolation.

    python lab/infini_capacity.py                                  # d_head 16 and 32, linear and delta, 3 seeds
    python lab/infini_capacity.py --d_head=32 --rules=linear --steps=500

The episodes are bench/recall.py's `assoc_episode` at depth d: d segments of 64 tokens (8 one-token pairs, SEP,
27 questions "k? v", padding) are written into the memory, one segment per write, with model_infini.py's own
`sigma`, `update_memory` (Eq. 4 linear, Eq. 5 delta) and `memory_retrieve` (Eq. 3); then each of the next segment's
4 scored questions reads the memory and names the value of its pair, written d segments back. What is learned is
everything the real model could choose: every token's key and value vectors (one free vector per token and head,
pair tokens included, so a pair's key may depend on its value), every question's query vector, and a two-layer
readout of the heads' reads. Only the memory is fixed. It is one layer's memory: the real model computes its keys,
values and queries from hidden states (which can also carry context), reads through a gate, and has one memory per
layer. Where this is low, one layer's memory cannot hold what the recall benchmark asks (capacity); where this is
high and the model is low, the model did not learn it (optimisation).

Training mixes depths 1 ... --max_depth uniformly (one depth per batch), as the recall benchmark's streams do, with
Adam and a cosine schedule; evaluation is on fresh episodes at every --depths. At depth d the memory holds
8 d pairs among 64 d tokens; the real model's memory of the recall size is n_head 2 × d_head 32 per layer.
"""

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))   # bench/common.py and the benchmarks
import common  # noqa: E402
import model_infini as mi  # noqa: E402  (common puts the repository on sys.path)
import recall  # noqa: E402
import train  # noqa: E402

LAB_RESULTS = Path(__file__).resolve().parent / 'results'     # the lab's results, beside its LOG


@dataclasses.dataclass
class CapacityConfig:
    d_head: str = '16,32'            # memory width per head (the recall size: 32)
    n_head: int = 2                  # heads, each with its own memory (the recall size: 2)
    rules: str = 'linear,delta'      # Eq. 4, Eq. 5
    depths: str = '1,2,4,8'          # segments from the pair's write to its question, evaluated
    max_depth: int = 8               # training depths 1 ... max_depth
    steps: int = 4000
    batch_size: int = 64             # episodes per step (4 scored questions each)
    learning_rate: float = 1e-2      # 3e-3 had not converged at 3,000 steps; 3e-2 stayed at chance (lab/LOG.md)
    detach_writes: bool = False      # the written keys and values get no gradient from the reads, as the model's
                                     # with bptt_segments=1: they stay at their random init here
    eval_episodes: int = 512         # per depth
    seg_len: int = recall.RECALL_SIZE['seg_len']
    assoc_pairs: int = 8
    seeds: str = '0,1,2'
    out: str = str(LAB_RESULTS / 'infini_capacity.json')

    def __post_init__(self):
        for name in ('n_head', 'max_depth', 'steps', 'batch_size', 'eval_episodes', 'seg_len', 'assoc_pairs'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for r in self.rules.split(','):
            if r not in ('linear', 'delta'):
                raise ValueError(f"rules are linear and/or delta, got {r!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if (self.max_depth + 1) * self.assoc_pairs > recall.N_KEYS:
            raise ValueError(f"max_depth: {self.max_depth + 1} segments of {self.assoc_pairs} pairs need more than "
                             f"the {recall.N_KEYS} keys")


class IsolatedMemory(nn.Module):
    """Free key, value and query vectors per token and head, model_infini's memory, and a readout."""

    def __init__(self, n_head, d_head, rule, detach_writes=False, vocab=recall.ASSOC_VOCAB):
        super().__init__()
        self.n_head, self.d_head, self.rule, self.detach_writes = n_head, d_head, rule, detach_writes
        self.key = nn.Parameter(torch.randn(vocab, n_head, d_head) / math.sqrt(d_head))
        self.value = nn.Parameter(torch.randn(vocab, n_head, d_head) / math.sqrt(d_head))
        self.query = nn.Parameter(torch.randn(vocab, n_head, d_head) / math.sqrt(d_head))
        self.readout = nn.Sequential(nn.Linear(n_head * d_head, 256), nn.ReLU(), nn.Linear(256, recall.N_VALUES))

    def forward(self, written, questions):
        """written: (B, S, T) tokens of S segments, written one segment per step; questions: (B, Q) question
        tokens. -> (B, Q, N_VALUES) logits of the values."""
        B, S, T = written.shape
        H, D = self.n_head, self.d_head
        M = written.new_zeros(B, H, D, D, dtype=torch.float32)
        z = written.new_zeros(B, H, D, dtype=torch.float32)
        has_memory = torch.zeros(B, 1, 1, 1, dtype=torch.bool)
        key, value = (self.key.detach(), self.value.detach()) if self.detach_writes else (self.key, self.value)
        for s in range(S):
            k = mi.sigma(key[written[:, s]].transpose(1, 2))                        # (B, H, T, D) σ(K)
            v = value[written[:, s]].transpose(1, 2)                                 # (B, H, T, D)
            M, z = mi.update_memory(k, v, M, z, has_memory, self.rule)               # Eq. 4 / 5
            has_memory = torch.ones_like(has_memory)
        q = mi.sigma(self.query[questions].transpose(1, 2))                         # (B, H, Q, D) σ(Q)
        read = mi.memory_retrieve(q, M, z, has_memory)                               # (B, H, Q, D) Eq. 3
        return self.readout(read.transpose(1, 2).flatten(2))                         # (B, Q, N_VALUES)


def episodes(rng, depth, n, cfg):
    """n assoc episodes at `depth`: the tokens of the first `depth` segments (written), and the scored questions
    of the last segment with their values. -> (n, depth, T), (n, Q), (n, Q) int64 tensors"""
    T, written, questions, answers = cfg.seg_len, [], [], []
    for _ in range(n):
        body, targets = recall.eval_episode('assoc', rng, depth, cfg)
        at = np.flatnonzero(targets >= 0)                                            # the scored "k?" positions
        written.append(body[:depth * T].reshape(depth, T))
        questions.append(body[at])
        answers.append(targets[at] - recall.VALUE0)
    return tuple(torch.from_numpy(np.stack(a)).long() for a in (written, questions, answers))


def train_and_evaluate(cfg, d_head, rule, seed):
    """One memory trained from seed. -> {'accuracy': {depth: fraction}, 'final_train_loss': mean of the last 100}"""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = IsolatedMemory(cfg.n_head, d_head, rule, cfg.detach_writes)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * i / cfg.steps)))
    losses = []
    for step in range(cfg.steps):
        written, questions, answers = episodes(rng, int(rng.integers(1, cfg.max_depth + 1)), cfg.batch_size, cfg)
        loss = F.cross_entropy(model(written, questions).flatten(0, 1), answers.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    eval_rng = np.random.default_rng(seed + 10_000)
    accuracy = {}
    with torch.no_grad():
        for depth in common.int_list(cfg.depths, 'depths'):
            written, questions, answers = episodes(eval_rng, depth, cfg.eval_episodes, cfg)
            accuracy[depth] = (model(written, questions).argmax(-1) == answers).float().mean().item()
    return dict(accuracy=accuracy, final_train_loss=float(np.mean(losses[-100:])))


def main(argv=None):
    def go(argv):
        cfg = common.parse(argv, CapacityConfig)
        depths = common.int_list(cfg.depths, 'depths')
        if max(depths) > cfg.max_depth:
            raise train.UserError(f"--depths go up to {max(depths)} but --max_depth={cfg.max_depth} trains to "
                                  f"{cfg.max_depth} only")
        torch.set_num_threads(1)
        results = {}
        print(f"accuracy (chance {1 / recall.N_VALUES:.3f}) by depth in segments; {cfg.assoc_pairs} pairs and "
              f"{cfg.seg_len} tokens written per segment, {cfg.n_head} heads")
        seeds = common.int_list(cfg.seeds, 'seeds')
        print(f"{'rule':>7} {'d_head':>6} {'seed':>4}  " + '  '.join(f"{d:>5}" for d in depths) + "  train loss")
        for rule in cfg.rules.split(','):
            for d_head in common.int_list(cfg.d_head, 'd_head'):
                runs = {}
                for seed in seeds:
                    r = runs[seed] = train_and_evaluate(cfg, d_head, rule, seed)
                    print(f"{rule:>7} {d_head:>6} {seed:>4}  " + '  '.join(f"{r['accuracy'][d]:5.2f}" for d in depths)
                          + f"  {r['final_train_loss']:.3f}", flush=True)
                acc = {d: [runs[s]['accuracy'][d] for s in seeds] for d in depths}
                results[f'{rule}/d{d_head}'] = dict(runs=runs, mean={d: float(np.mean(a)) for d, a in acc.items()},
                                                    std={d: float(np.std(a)) for d, a in acc.items()})
        common.write_json(cfg.out, {'results': results}, 'lab/infini_capacity.py', argv)
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
