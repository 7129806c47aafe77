"""
Transformer-XL's evaluation speed-up (Dai et al. 2019, §3.2 and Table 9): one trained model, evaluated two ways at
the same attention length L, on the same predicted positions of a held-out text.

    python train.py config/xl_bytes_demo.py --seed=1 --out_dir=out-xl-bytes-s1     # one run per seed
    python bench/evalspeed.py --runs=out-xl-bytes-s1,out-xl-bytes-s2,out-xl-bytes-s3

- memory reused (Transformer-XL): the text is read one segment of seg_len tokens at a time with mem_len = L
  cached positions per layer, so every token attends to L + (its place in the segment) keys, and each
  forward predicts seg_len new tokens;
- vanilla (Al-Rfou et al. 2019, the paper's baseline): every prediction recomputes the whole window of its L
  previous tokens from scratch, with no memory, and keeps one new position per forward. The windows of
  `window_batch` consecutive positions go through one forward (a batch), which is as fast as it can be done.

Both score the same `positions` targets, which start after max(lengths) tokens of the split so every method has
its full context. Reported per L and per run: seconds per predicted token of each, the speed-up (vanilla /
memory reused) and the bits per character (bits per byte on GPT-2 data) of each; over runs (seeds): mean and
spread. The speed-up should grow with L (the vanilla cost of a token grows with its window, the reused one's
only through the attention), as in the paper's Table 9 (363x at 800 to 1,874x at 3,800 on enwik8, on a GPU).

The two methods give the same logits where they must: with one layer, a segment of one token and a memory of L,
the memory holds exactly the embeddings the vanilla window of L + 1 tokens recomputes (tests/test_bench.py).
With more layers they differ by design: a cached state was computed from its own shorter context.
"""

import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import train  # noqa: E402


@dataclass
class EvalSpeedConfig:
    runs: str = 'out-xl-bytes-demo'   # comma-separated out_dirs of trained model_xl.py checkpoints (one per seed)
    ckpt: str = 'ckpt.pt'
    lengths: str = '128,256,512,1024,2048'  # attention lengths L
    seg_len: int = 0                  # the memory-reused evaluation's segment; 0 = the checkpoint's seg_len
    positions: int = 512              # predicted tokens scored by both methods (the same ones)
    window_batch: int = 16            # vanilla windows per forward
    split: str = 'validation'
    data_dir: str = ''                # '' = the data the checkpoint was trained on
    device: str = 'cpu'
    out: str = str(common.RESULTS / 'evalspeed.json')
    plot: bool = True

    def __post_init__(self):
        for name in ('positions', 'window_batch'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seg_len < 0:
            raise ValueError(f"seg_len must be >= 0, got {self.seg_len}")


@torch.no_grad()
def memory_reused_nll(model, tokens, start, positions, mem_len, seg_len, device):
    """NLL (nats, per target) of tokens[start + 1 : start + 1 + positions] read as Transformer-XL evaluates: the
    prefix tokens[:start] first (not timed; its last segment ends at start), then the scored segments.
    -> (nll (positions,), seconds spent on the scored segments)"""
    assert start % seg_len == 0 and positions % seg_len == 0, (start, positions, seg_len)
    x = torch.from_numpy(tokens[:start + positions + 1].astype(np.int64)).to(device)[None]
    memory = model.init_memory(1, device, mem_len=mem_len)
    for s in range(0, start, seg_len):
        _, _, memory, _ = model(x[:, s:s + seg_len], memory)
    nll = []
    with common.Timer(device.split(':')[0]) as timer:
        for s in range(start, start + positions, seg_len):
            logits, _, memory, _ = model(x[:, s:s + seg_len], memory)
            nll.append(F.cross_entropy(logits[0].float(), x[0, s + 1:s + 1 + seg_len], reduction='none'))
    return torch.cat(nll).cpu(), timer.seconds


@torch.no_grad()
def vanilla_nll(model, tokens, start, positions, window, window_batch, device):
    """NLL of the same targets, each predicted from its `window` previous tokens recomputed from scratch with no
    memory (one new position per window; window_batch windows per forward). -> (nll (positions,), seconds)"""
    assert start + 1 >= window, (start, window)
    x = torch.from_numpy(tokens[:start + positions + 1].astype(np.int64)).to(device)
    nll = []
    with common.Timer(device.split(':')[0]) as timer:
        for first in range(start, start + positions, window_batch):
            ends = torch.arange(first, min(first + window_batch, start + positions), device=device) + 1
            idx = ends[:, None] - window + torch.arange(window, device=device)[None]      # (b, window) inputs
            memory = model.init_memory(len(ends), device, mem_len=0)
            logits, _, _, _ = model(x[idx], memory)
            nll.append(F.cross_entropy(logits[:, -1].float(), x[ends], reduction='none'))
    return torch.cat(nll).cpu(), timer.seconds


def load_run(out_dir, cfg, device, longest):
    """(model with seg_len >= the longest window, its seg_len, the split as train.py evaluates it: an EvalSet)."""
    path = Path(out_dir) / cfg.ckpt
    ckpt = train.load_checkpoint(path)
    if ckpt['model_name'] != 'xl':
        raise train.UserError(f"{path} holds a {ckpt['model_name']!r} model; the speed-up is measured for model_xl.py")
    trained_seg_len = ckpt['model_config']['seg_len']
    # seg_len only bounds a forward's length (positions are relative): the weights are the same
    _, _, model = train.model_from_checkpoint(ckpt, path, {'seg_len': max(trained_seg_len, longest)})
    model.eval().to(device)
    data_dir = Path(cfg.data_dir or ckpt['train_config']['data_dir']
                    or train.REPO / 'data' / ckpt['train_config']['dataset'])
    meta = train.load_meta(data_dir)
    evalset = train.eval_set(train.load_split(data_dir, cfg.split), meta, cfg.split, train.data_tokenizer(meta))
    return model, trained_seg_len, evalset


def bits(nll, targets, byte_lengths):
    """Summed NLL in bits per byte of text (per token where the tokenizer is unknown)."""
    n = len(targets) if byte_lengths is None else int(byte_lengths[targets].sum())
    return float(nll.double().sum()) / math.log(2) / n


def measure_run(out_dir, cfg, lengths, device):
    model, trained_seg_len, evalset = load_run(out_dir, cfg, device, max(lengths))
    tokens, byte_lengths, unit = evalset.data, evalset.byte_lengths, evalset.unit
    T = cfg.seg_len or trained_seg_len
    positions = math.ceil(cfg.positions / T) * T
    start = math.ceil(max(lengths) / T) * T                        # every method has its full context here
    if start + positions + 1 > len(tokens):
        raise train.UserError(f"the {cfg.split} split has {len(tokens):,} tokens, fewer than the "
                              f"{start + positions + 1:,} that lengths up to {max(lengths)} and {positions} positions need")
    targets = tokens[start + 1:start + 1 + positions].astype(np.int64)
    rows = []
    for L in lengths:
        reused, t_reused = memory_reused_nll(model, tokens, start, positions, L, T, device)
        vanilla, t_vanilla = vanilla_nll(model, tokens, start, positions, L, cfg.window_batch, device)
        rows.append({'length': L, 'seg_len': T, 'positions': positions,
                     'reused_s_per_token': t_reused / positions, 'vanilla_s_per_token': t_vanilla / positions,
                     'speedup': t_vanilla / t_reused,
                     f'reused_{unit}': bits(reused, targets, byte_lengths),
                     f'vanilla_{unit}': bits(vanilla, targets, byte_lengths)})
        r = rows[-1]
        print(f"{out_dir} L={L:>5}: memory reused {1e3 * r['reused_s_per_token']:.3f} ms/token, vanilla "
              f"{1e3 * r['vanilla_s_per_token']:.3f} ms/token, speed-up {r['speedup']:.1f}x | {unit} "
              f"{r[f'reused_{unit}']:.4f} / {r[f'vanilla_{unit}']:.4f}", flush=True)
    return rows, unit


def summarize(per_run, unit):
    """Mean and sample standard deviation over runs, per length."""
    out = []
    for i, first in enumerate(per_run[0]):
        row = {'length': first['length']}
        for key in ('speedup', 'reused_s_per_token', 'vanilla_s_per_token', f'reused_{unit}', f'vanilla_{unit}'):
            values = np.array([rows[i][key] for rows in per_run])
            row[key] = float(values.mean())
            row[key + '_std'] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        out.append(row)
    return out


def table(summary, unit, n_runs):
    lines = [f"| L | memory reused (ms/token) | vanilla (ms/token) | speed-up | {unit}, memory reused | "
             f"{unit}, vanilla |", "|---|---|---|---|---|---|"]
    pm = (lambda r, k, f: f"{r[k]:{f}} ± {r[k + '_std']:{f}}") if n_runs > 1 else (lambda r, k, f: f"{r[k]:{f}}")
    for r in summary:
        lines.append(f"| {r['length']:,} | {1e3 * r['reused_s_per_token']:.3f} | {1e3 * r['vanilla_s_per_token']:.2f} "
                     f"| {pm(r, 'speedup', '.1f')}x | {pm(r, f'reused_{unit}', '.4f')} | "
                     f"{pm(r, f'vanilla_{unit}', '.4f')} |")
    return '\n'.join(lines)


def plot_summary(summary, unit, path):
    import plot
    plt = plot._plt()
    L = [r['length'] for r in summary]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.errorbar(L, [r['speedup'] for r in summary], yerr=[r['speedup_std'] for r in summary], marker='o')
    a.set(xscale='log', yscale='log', xlabel='attention length L', ylabel='speed-up (vanilla / memory reused)',
          title='evaluation time per token')
    for key, label in ((f'reused_{unit}', 'memory reused (XL)'), (f'vanilla_{unit}', 'vanilla sliding window')):
        b.errorbar(L, [r[key] for r in summary], yerr=[r[key + '_std'] for r in summary], marker='o', label=label)
    b.set(xscale='log', xlabel='attention length L', ylabel=unit, title=f'{unit} on the same positions')
    b.legend()
    for ax in (a, b):
        ax.set_xticks(L, [str(x) for x in L])
        ax.minorticks_off()
    plot._save(fig, path)


def main(argv=None):
    def go(argv):
        cfg = common.parse(argv, EvalSpeedConfig)
        device, _ = common.setup(cfg.device)
        lengths = sorted(common.int_list(cfg.lengths, 'lengths'))
        if not lengths or lengths[0] < 1:
            raise train.UserError("--lengths must be >= 1")
        runs = [r for r in cfg.runs.split(',') if r]
        per_run, unit = [], None
        for out_dir in runs:
            rows, unit = measure_run(out_dir, cfg, lengths, device)
            per_run.append(rows)
        summary = summarize(per_run, unit)
        print(table(summary, unit, len(runs)))
        common.write_json(cfg.out, {'config': dataclasses.asdict(cfg), 'unit': unit, 'runs': dict(zip(runs, per_run)),
                                    'summary': summary}, 'bench/evalspeed.py', argv)
        if cfg.plot:
            common.try_plot(plot_summary, summary, unit, Path(cfg.out).with_suffix('.png'))
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
