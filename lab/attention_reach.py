"""
How far back a Transformer-XL checkpoint looks: per layer, the share of its attention on keys at each
distance behind the query, with the memory full. It tells the two reasons a longer memory can fail to pay apart:
a memory the heads do not attend to is not used; a memory they attend to without a lower loss dilutes.

    python lab/attention_reach.py --runs='xl:RUN,RUN;xl_mem512:RUN,RUN' --distances=128,256,640

--runs as in bench/longdoc.py (LABEL:RUN,RUN,...; a RUN is an out_dir or a checkpoint; a label's runs are seeds,
averaged). Each checkpoint (model xl) is read in eval mode with the explicit softmax (attn_kernel='einsum') and
--eval_mem_len (-1 = its own mem_len): --rows streams of the --split's tokens, from evenly spaced offsets, each fed
seg_len tokens at a time with the memory carried; after --warmup segments (-1 = until the memory is full), the
next --segments segments are measured. A forward hook on each layer's attention dropout (the identity in eval
mode) receives softmax(score) (B, H, T, K); key j of query i is at distance i + S - j (S = K - T memory slots).
The share of bucket [a, b) (--distances=128,256 -> [0,128) [128,256) [256,inf)) is the probability on keys at
distances a..b-1, averaged over queries, heads and rows (per head in the JSON). Every query's shares sum to 1.
Beside it, 'uniform': the shares of a head that spreads its attention evenly over every key it can see (i + S + 1
keys for query i), the reference for "looks locally" (shares above it at short distances) against "averages the
whole window" (shares near it).
Output: a table per layer, lab/results/attention_reach[_NAME].json.
"""

import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))   # bench/common.py and the benchmarks
import common  # noqa: E402
import longdoc  # noqa: E402
from common import train  # noqa: E402

LAB_RESULTS = Path(__file__).resolve().parent / 'results'     # the lab's results, beside its LOG


@dataclass
class ReachConfig:
    runs: str = ''                    # LABEL:RUN,RUN,... (repeat --runs, or ';' between groups)
    ckpt: str = 'ckpt.pt'             # the checkpoint file inside an out_dir
    split: str = 'validation'
    data_dir: str = ''                # '' = the data the checkpoint was trained on
    distances: str = '128,256,640'    # bucket edges of the distance behind the query
    eval_mem_len: int = -1            # -1 = the checkpoint's own mem_len
    rows: int = 4                     # streams read in parallel
    warmup: int = -1                  # segments read before measuring (-1 = ceil(mem_len / seg_len): memory full)
    segments: int = 32                # segments measured per row
    name: str = ''                    # lab/results/attention_reach_<name>.json

    def __post_init__(self):
        if self.rows < 1 or self.segments < 1 or self.warmup < -1 or self.eval_mem_len < -1:
            raise ValueError(f"rows and segments must be >= 1, warmup and eval_mem_len >= -1, got {self.rows}, "
                             f"{self.segments}, {self.warmup}, {self.eval_mem_len}")


def attention_by_distance(model, tokens, edges, warmup, segments):
    """tokens: (B, N) int64 streams. -> ((L, H, E + 1) shares of attention per layer, head and distance bucket,
    averaged over the measured queries and rows; (E + 1,) the shares of attention spread evenly over the visible
    keys)"""
    seg_len, n_edges = model.config.seg_len, len(edges)
    totals = torch.zeros(model.config.n_layer, model.config.n_head, n_edges + 1, dtype=torch.float64)
    uniform = torch.zeros(n_edges + 1, dtype=torch.float64)
    count, measuring = [0], [False]                              # queries measured; past the warm-up

    def hook(layer):
        def capture(module, inputs, output):
            if not measuring[0]:
                return
            prob = inputs[0].double()                                   # (B, H, T, K)
            T, K = prob.shape[-2:]
            dist = torch.arange(T)[:, None] + (K - T) - torch.arange(K)[None, :]   # (T, K): i + S - j
            bucket = torch.bucketize(dist.clamp(min=0), torch.tensor(edges), right=True)   # (T, K) in 0..E
            onehot = torch.nn.functional.one_hot(bucket, n_edges + 1).double()      # (T, K, E + 1)
            totals[layer] += torch.einsum('bhtk,tke->he', prob, onehot)
            if layer == 0:
                count[0] += prob.shape[0] * T
                visible = (dist >= 0).double()                             # (T, K): keys at or before the query
                uniform.add_(prob.shape[0] * torch.einsum('tk,tke->e', visible / visible.sum(1, keepdim=True),
                                                          onehot))
        return capture

    handles = [block.attn.dropatt.register_forward_hook(hook(n)) for n, block in enumerate(model.layers)]
    try:
        memory = model.init_memory(tokens.shape[0], tokens.device)
        with torch.no_grad():
            for s in range(warmup + segments):
                measuring[0] = s >= warmup
                _, _, memory, _ = model(tokens[:, s * seg_len:(s + 1) * seg_len], memory)
    finally:
        for h in handles:
            h.remove()
    return (totals / count[0]).numpy(), (uniform / count[0]).numpy()


def read_run(path, cfg, edges):
    ckpt = train.load_checkpoint(path)
    if ckpt['model_name'] != 'xl':
        raise train.UserError(f"{path} holds a {ckpt['model_name']!r} model; attention_reach reads model xl only")
    overrides = {'attn_kernel': 'einsum', 'dropatt': 0.0, 'dropout': 0.0}
    if cfg.eval_mem_len != -1:
        overrides['mem_len'] = cfg.eval_mem_len
    _, config, model = train.model_from_checkpoint(ckpt, path, overrides)
    model.eval()
    data = train.load_split(longdoc.run_data_dir(ckpt, cfg), cfg.split)
    warmup = cfg.warmup if cfg.warmup >= 0 else math.ceil(config.mem_len / config.seg_len)
    n = (warmup + cfg.segments) * config.seg_len
    if len(data) < cfg.rows * n:
        raise train.UserError(f"the {cfg.split} split has {len(data)} tokens, fewer than --rows x (warmup + "
                              f"segments) x seg_len = {cfg.rows * n}")
    starts = np.linspace(0, len(data) - n, cfg.rows).astype(np.int64)
    tokens = torch.from_numpy(np.stack([np.asarray(data[a:a + n], dtype=np.int64) for a in starts]))
    shares, uniform = attention_by_distance(model, tokens, edges, warmup, cfg.segments)
    return {'checkpoint': str(path), 'mem_len': config.mem_len, 'seg_len': config.seg_len, 'warmup': warmup,
            'shares': shares.tolist(), 'uniform': uniform.tolist()}


def main(argv=None):
    def go(argv):
        cfg = common.parse(longdoc.gather_runs_flags(argv), ReachConfig)
        labels = longdoc.parse_runs(cfg.runs)
        edges = longdoc.parse_buckets(cfg.distances)
        names = longdoc.bucket_names(edges)
        result = {'config': dataclasses.asdict(cfg), 'buckets': names, 'labels': {}}
        for label, runs in labels.items():
            reads = [read_run(longdoc.checkpoint_path(r, cfg.ckpt), cfg, edges) for r in runs]
            per_head = np.mean([r['shares'] for r in reads], axis=0)             # (L, H, E + 1)
            per_layer = per_head.mean(axis=1)
            result['labels'][label] = {'runs': reads, 'per_layer': per_layer.tolist(), 'per_head': per_head.tolist(),
                                       'per_layer_seed_std': np.std([np.mean(r['shares'], axis=1) for r in reads],
                                                                    axis=0, ddof=1).tolist() if len(reads) > 1
                                       else None}
            print(f"\n{label} (memory {reads[0]['mem_len']}, segment {reads[0]['seg_len']}, {len(reads)} runs): "
                  "share of attention by distance behind the query")
            print('| layer | ' + ' | '.join(names) + ' |\n|---|' + '---|' * len(names))
            for n, row in enumerate(per_layer):
                print(f'| {n} | ' + ' | '.join(f'{v:.3f}' for v in row) + ' |')
            result['labels'][label]['uniform'] = reads[0]['uniform']       # the same for every run of a label
            print('| uniform | ' + ' | '.join(f'{v:.3f}' for v in reads[0]['uniform']) + ' |')
        out = LAB_RESULTS / (f'attention_reach_{cfg.name}.json' if cfg.name else 'attention_reach.json')
        common.write_json(out, result, 'lab/attention_reach.py', argv)
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
