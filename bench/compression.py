"""
The Compressive Transformer's compression functions at byte level, on 3 seeds (Rae et al. 2020, Table 5 compares
them on enwik8): every f_c trained with the attention-reconstruction loss, and the no-compression control
(cmem_len = 0, which is Transformer-XL with the same FIFO memory, bit for bit).

    python data/gutenberg/prepare.py --tokenizer=bytes
    python bench/compression.py                                  # 6 variants x 3 seeds through train.py
    python bench/compression.py --variants=none,conv --seeds=1 --max_iters=200   # a quick look

Every run is `python train.py <base config> --compression=... --seed=...` in its own process (--jobs at a time,
one thread each), with the same data, size and token budget; its validation bpc is the last evaluation in its
log.jsonl. A run whose log already holds its final evaluation is not run again, so an interrupted benchmark picks
up where it stopped. Reported: bpc per run, then mean and sample standard deviation over seeds per variant.
"""

import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import train  # noqa: E402

# variant -> the flags that make it (on top of the base config)
VARIANTS = {
    'none': dict(cmem_len=0),                      # the control: no compressed memory (Transformer-XL)
    'max_pool': dict(compression='max_pool'),
    'mean_pool': dict(compression='mean_pool'),
    'most_used': dict(compression='most_used'),
    'dilated_conv': dict(compression='dilated_conv'),
    'conv': dict(compression='conv'),
}


@dataclass
class CompressionConfig:
    base: str = 'config/compressive_bytes_demo.py'   # size, data, schedule and recon_loss of every run
    variants: str = 'all'             # comma-separated names of VARIANTS, or all
    seeds: str = '1,2,3'
    max_iters: int = 0                # 0 = the base config's
    jobs: int = 2                     # runs at a time (each one thread)
    out_dir: str = 'out-compression'  # one out_dir per run inside
    out: str = str(common.RESULTS / 'compression.json')
    plot: bool = True

    def __post_init__(self):
        if self.jobs < 1 or self.max_iters < 0:
            raise ValueError("jobs must be >= 1 and max_iters >= 0")


def run_flags(cfg, variant, seed):
    flags = {**VARIANTS[variant], 'seed': seed, 'out_dir': str(Path(cfg.out_dir) / f'{variant}_s{seed}'),
             'device': 'cpu', 'compile': False}
    if cfg.max_iters:
        flags['max_iters'] = cfg.max_iters
    return [cfg.base] + [f'--{k}={v}' for k, v in flags.items()]


def final_eval(out_dir, max_iters):
    """The last evaluation record of a run that reached max_iters, else None."""
    log = Path(out_dir) / 'log.jsonl'
    if not log.exists():
        return None
    evals = [r for r in map(json.loads, log.read_text().splitlines()) if 'validation/loss' in r]
    return evals[-1] if evals and evals[-1]['step'] >= max_iters else None


def run_one(cfg, variant, seed, max_iters):
    args = run_flags(cfg, variant, seed)
    out_dir = Path(cfg.out_dir) / f'{variant}_s{seed}'
    if (record := final_eval(out_dir, max_iters)) is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        resume = ['--init_from=resume'] if (out_dir / 'ckpt.pt').exists() else []     # an unfinished run goes on
        env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
        with open(out_dir / 'stdout.txt', 'a') as f:
            code = subprocess.run([sys.executable, 'train.py'] + args + resume, cwd=train.REPO, env=env, stdout=f,
                                  stderr=subprocess.STDOUT).returncode
        if code != 0:
            tail = (out_dir / 'stdout.txt').read_text().strip().splitlines()[-1:]
            raise train.UserError(f"{variant} seed {seed} failed (exit {code}): {' '.join(tail)}")
        record = final_eval(out_dir, max_iters)
    bpc = record.get('validation/bpc', record.get('validation/bpb'))
    print(f"{variant:>12} seed {seed}: validation loss {record['validation/loss']:.4f}, bpc {bpc:.4f}", flush=True)
    return {'variant': variant, 'seed': seed, 'loss': record['validation/loss'], 'bpc': bpc,
            'command': ' '.join(['python', 'train.py'] + args)}


def summarize(runs, names):
    out = {}
    for name in names:
        bpc = np.array([r['bpc'] for r in runs if r['variant'] == name])
        out[name] = {'bpc_mean': float(bpc.mean()), 'bpc_std': float(bpc.std(ddof=1)) if len(bpc) > 1 else 0.0,
                     'seeds': len(bpc)}
    control = out.get('none')
    if control:
        for name, s in out.items():
            s['vs_none'] = s['bpc_mean'] - control['bpc_mean']
    return out


def table(summary, runs):
    seeds = sorted({r['seed'] for r in runs})
    lines = ['| f_c | ' + ' | '.join(f'seed {s}' for s in seeds) + ' | mean ± std | vs none |',
             '|---|' + '---|' * (len(seeds) + 2)]
    for name, s in sorted(summary.items(), key=lambda kv: kv[1]['bpc_mean']):
        per_seed = {r['seed']: r['bpc'] for r in runs if r['variant'] == name}
        cells = ' | '.join(f"{per_seed[x]:.4f}" if x in per_seed else '' for x in seeds)
        vs = f"{s['vs_none']:+.4f}" if 'vs_none' in s else ''
        lines.append(f"| {name} | {cells} | {s['bpc_mean']:.4f} ± {s['bpc_std']:.4f} | {vs} |")
    return '\n'.join(lines)


def plot_summary(summary, runs, path):
    import plot
    plt = plot._plt()
    names = sorted(summary, key=lambda n: summary[n]['bpc_mean'])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(len(names)), [summary[n]['bpc_mean'] for n in names],
           yerr=[summary[n]['bpc_std'] for n in names], capsize=4, color='#9ab')
    for i, n in enumerate(names):
        ys = [r['bpc'] for r in runs if r['variant'] == n]
        ax.plot([i] * len(ys), ys, 'k.', alpha=0.7)
    lo = min(r['bpc'] for r in runs)
    hi = max(r['bpc'] for r in runs)
    ax.set_ylim(lo - 0.5 * (hi - lo + 1e-3), hi + 0.5 * (hi - lo + 1e-3))
    ax.set_xticks(range(len(names)), names)
    ax.set(ylabel='validation bpc (lower is better)', title='compression functions, byte level (dots: seeds)')
    plot._save(fig, path)


def main(argv=None):
    def go(argv):
        cfg = common.parse(argv, CompressionConfig)
        names = list(VARIANTS) if cfg.variants == 'all' else cfg.variants.split(',')
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            raise train.UserError(f"unknown variant {unknown[0]!r}; known: {', '.join(VARIANTS)}")
        seeds = common.int_list(cfg.seeds, 'seeds')
        base = train.read_config_file(train.REPO / cfg.base if not Path(cfg.base).exists() else cfg.base)
        max_iters = cfg.max_iters or base.get('max_iters', train.TrainConfig.max_iters)
        jobs = [(n, s) for s in seeds for n in names]
        with ThreadPoolExecutor(cfg.jobs) as pool:
            runs = list(pool.map(lambda job: run_one(cfg, *job, max_iters), jobs))
        summary = summarize(runs, names)
        print(table(summary, runs))
        common.write_json(cfg.out, {'config': dataclasses.asdict(cfg), 'base': base, 'runs': runs,
                                    'summary': summary}, 'bench/compression.py', argv)
        if cfg.plot:
            common.try_plot(plot_summary, summary, runs, Path(cfg.out).with_suffix('.png'))
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
