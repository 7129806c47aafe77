"""
Pictures from the benchmarks' JSON and from train.py's log.jsonl files. matplotlib is an optional dependency of
bench/ only (`pip install matplotlib`).

    python bench/plot.py loss out-xl/log.jsonl out-mem0/log.jsonl --out=bench/results/loss.png
    python bench/plot.py speed bench/results/speed.json bench/results/speed_generate.json   # -> .../speed.png
    python bench/plot.py scaling bench/results/scaling.json
    python bench/plot.py recall bench/results/recall.json
    python bench/plot.py table bench/results/speed.json bench/results/recall.json   # markdown for the README
"""

import json
import statistics
import sys
from pathlib import Path


class NoMatplotlib(Exception):
    pass


def _plt():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        raise NoMatplotlib("matplotlib is not installed: `pip install matplotlib` for the plots "
                           "(the JSON results are written without it)") from None


def _save(fig, path, rect=None):
    """rect: the part of the figure the panels fill (tight_layout's), e.g. to leave room for a legend beside them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=120)
    fig.clf()
    import matplotlib.pyplot as plt
    plt.close(fig)
    print(f"wrote {path}")
    return path


def plot_loss(logs, out, labels=None):
    """Training loss (and validation loss, as markers) against tokens, one line per log.jsonl."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, log in enumerate(logs):
        records = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
        label = labels[i] if labels else Path(log).parent.name
        train = [r for r in records if 'train/loss' in r]
        x = [r.get('tokens', r['step']) for r in train]
        line, = ax.plot(x, [r['train/loss'] for r in train], label=f'{label} (train)', alpha=0.8)
        evals = [r for r in records if any(k.endswith('/loss') and not k.startswith('train') for k in r)]
        if evals and train:
            per_step = train[-1].get('tokens', train[-1]['step']) / train[-1]['step']
            key = next(k for k in evals[0] if k.endswith('/loss') and not k.startswith('train'))
            ax.plot([r['step'] * per_step for r in evals], [r[key] for r in evals], 'o', color=line.get_color(),
                    label=f'{label} ({key})')
    ax.set_xlabel('tokens' if logs else 'step')
    ax.set_ylabel('loss (nats/token)')
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out)


def plot_speed(paths, out):
    """Training tokens/s per variant and mode; generation tokens/s with the cache vs recomputing the window. paths:
    one speed.py JSON or several (e.g. a training run and a generation run), drawn in one figure."""
    plt = _plt()
    rs = [json.loads(Path(p).read_text()) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    train = {v: t for r in rs for v, t in r['train'].items()}
    gen = {v: g for r in rs for v, g in r.get('generate', {}).items()}
    panels = [k for k, d in (('train', train), ('generate', gen)) if d]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6 * max(1, len(panels)), 4.5), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    if 'train' in axes:
        ax, variants = axes['train'], list(train)
        modes = list(next(iter(train.values())))
        width = 0.8 / len(modes)
        for i, mode in enumerate(modes):
            ys = [train[v][mode]['tokens_per_s'] if mode in train[v] else 0 for v in variants]
            ax.bar([j + i * width for j in range(len(variants))], ys, width, label=mode)
        ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(variants))])
        ax.set_xticklabels(variants, rotation=30, ha='right')
        ax.set_ylabel('training tokens/s')
        r = next(r for r in rs if r['train'])
        ax.set_title(f"training, batch {r['config']['batch_size']} ({r['device']})")
        ax.legend(fontsize=8)
    if 'generate' in axes:
        ax, gv = axes['generate'], list(gen)
        ax.bar([j - 0.2 for j in range(len(gv))], [gen[v]['cached_tokens_per_s'] for v in gv], 0.4, label='KV cache')
        ax.bar([j + 0.2 for j in range(len(gv))], [gen[v]['recompute_tokens_per_s'] for v in gv], 0.4,
               label='recompute window')
        ax.set_yscale('log')
        ax.set_xticks(range(len(gv)))
        ax.set_xticklabels(gv, rotation=30, ha='right')
        ax.set_ylabel('generated tokens/s (log)')
        r = next(r for r in rs if r.get('generate'))
        ax.set_title(f"generation, seg {r['config']['gen_seg_len']}, batch 1 ({r['device']})")
        ax.legend(fontsize=8)
    return _save(fig, out)


def plot_scaling(path, out):
    """Step time and peak memory against the history each model can use, log-log."""
    plt = _plt()
    r = json.loads(Path(path).read_text())
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, s in r['series'].items():
        xs = [p['history'] for p in s['points']]
        ax1.plot(xs, [p['step_s'] for p in s['points']], 'o-', label=f"{name} ({s['axis']})")
        mem = [p.get('peak_bytes') for p in s['points']]
        if all(m is not None for m in mem):
            ax2.plot(xs, [m / 2 ** 20 for m in mem], 'o-', label=f"{name} ({s['axis']})")
    for ax, ylabel in ((ax1, 'training step time (s)'), (ax2, 'peak memory of a step (MiB)')):
        ax.set_xscale('log', base=2)
        ax.set_yscale('log')
        ax.set_xlabel('history the model can use (tokens)')
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which='both')
        ax.legend(fontsize=7)
    ax1.set_title(f"batch {r['config']['batch_size']}, seg {r['size'].get('seg_len')} ({r['device']})")
    return _save(fig, out)


def plot_recall(path, out):
    """Heatmaps: accuracy per model (rows) and depth / length (columns), chance in the title."""
    plt = _plt()
    r = json.loads(Path(path).read_text())
    tasks = list(r.get('tasks', {}))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(6.5 * max(1, len(tasks)), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        t = r['tasks'][task]
        models = list(t['accuracy'])
        cols = [str(c) for c in t['columns']]
        grid = [[t['accuracy'][m].get(c, float('nan')) for c in cols] for m in models]
        im = ax.imshow(grid, vmin=0, vmax=1, cmap='viridis', aspect='auto')
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f'{v:.2f}', ha='center', va='center', color='w' if v < 0.6 else 'k', fontsize=8)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels(cols)
        ax.set_yticks(range(len(models)))
        ax.set_yticklabels(models)
        ax.set_xlabel(t['column_label'])
        ax.set_title(f"{task}: {t['metric']} (chance {t['chance']:.2f})")
        fig.colorbar(im, ax=ax)
    return _save(fig, out)


# -----------------------------------------------------------------------------------------------------------
# Markdown tables for bench/README.md (no matplotlib needed)


def _row(cells):
    return '| ' + ' | '.join(str(c) for c in cells) + ' |'


def table_speed(r):
    lines = []
    if r.get('bf16_skipped'):
        lines += [f"bf16 modes: {r['bf16_skipped']}", '']
    if r['train']:
        modes = list(next(iter(r['train'].values())))
        vs_eager = [m for m in modes if m != 'eager' and 'eager' in modes]
        lines += [_row(['variant'] + [f'train {m} tok/s (× baseline)' for m in modes]
                       + [f'{m} / eager' for m in vs_eager]), _row(['---'] * (len(modes) + len(vs_eager) + 1))]
        for v, t in r['train'].items():
            lines.append(_row([v] + [f"{t[m]['tokens_per_s']:,.0f} ({t[m].get('ratio_to_baseline', float('nan')):.2f})"
                                     for m in modes] + [f"{t[m]['ratio_to_eager']:.2f}" for m in vs_eager]))
    if r['eval']:
        modes = list(next(iter(r['eval'].values())))
        lines += ['', _row(['variant'] + [f'eval {m} tok/s (× baseline)' for m in modes]),
                  _row(['---'] * (len(modes) + 1))]
        for v, t in r['eval'].items():
            lines.append(_row([v] + [f"{t[m]['tokens_per_s']:,.0f} ({t[m].get('ratio_to_baseline', float('nan')):.2f})"
                                     for m in modes]))
    if r.get('generate'):
        lines += ['', _row(['variant', 'generate, KV cache (tok/s)', 'recompute the window (tok/s)', 'speed-up',
                            'same greedy tokens']), _row(['---'] * 5)]
        for v, g in r['generate'].items():
            lines.append(_row([v, f"{g['cached_tokens_per_s']:,.1f}", f"{g['recompute_tokens_per_s']:,.2f}",
                               f"{g['speedup']:.1f}×", g['same_greedy_tokens']]))
    return lines


def table_scaling(r):
    lines = [_row(['variant', 'x axis', 'history (tokens): step time ms / peak MiB / state MiB', 'step time last/first',
                   'history last/first']), _row(['---'] * 5)]
    for v, s in r['series'].items():
        pts = '; '.join(f"{p['history']:,}: {p['step_s'] * 1e3:,.0f} / {p['peak_bytes'] / 2 ** 20:,.0f} / "
                        f"{p['state_bytes'] / 2 ** 20:,.1f}" for p in s['points'])
        lines.append(_row([v, s['axis'], pts, f"{s['step_time_ratio_last_to_first']:.2f}",
                           f"{s['history_ratio_last_to_first']:.0f}"]))
    return lines


def table_recall(r):
    lines = []
    for task, t in r['tasks'].items():
        cols = [str(c) for c in t['columns']]
        seeds = t.get('seeds', [None])
        lines += [f"{task}: {t['metric']} by {t['column_label']} (chance {t['chance']:.2f}); "
                  + (f"mean ± std over seeds {', '.join(map(str, seeds))}; " if len(seeds) > 1 else '')
                  + "in brackets: the same with the memory emptied before every segment", '',
                  _row(['variant'] + cols + ['final train loss', 'train time']), _row(['---'] * (len(cols) + 3))]
        for v, acc in t['accuracy'].items():
            empty, std = t['accuracy_memory_emptied'][v], t.get('accuracy_std', {}).get(v)
            runs = t['runs'][v] if 'seeds' in t else {'': t['runs'][v]}     # older files: one run per variant
            loss = statistics.mean(r['final'].get('train/loss', float('nan')) for r in runs.values())
            seconds = [r['train_seconds'] for r in runs.values() if 'train_seconds' in r]
            lines.append(_row([v] + [f"{acc[c]:.2f}" + (f" ± {std[c]:.2f}" if std and len(seeds) > 1 else '')
                                     + f" ({empty[c]:.2f})" for c in cols]
                              + [f"{loss:.3f}", f"{statistics.mean(seconds):.0f} s" if seconds else '']))
        for name, ref in t.get('window_reference', {}).items():
            lines.append(_row([f'counts of the last {name}'] + [f"{ref[c]:.2f}" for c in cols] + ['', '']))
        lines.append('')
    return lines


def table(paths):
    for p in paths:
        r = json.loads(Path(p).read_text())
        kind = 'speed' if 'train' in r else 'scaling' if 'series' in r else 'recall'
        lines = {'speed': table_speed, 'scaling': table_scaling, 'recall': table_recall}[kind](r)
        print(f"{p} ({r['date']}, torch {r['torch']}, {r['device']}):\n\n`{r['command']}`\n")
        print('\n'.join(lines) + '\n')


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == 'table':
        return table(argv[1:])
    if not argv or argv[0] not in ('loss', 'speed', 'scaling', 'recall'):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    kind, rest = argv[0], argv[1:]
    outs = [a.split('=', 1)[1] for a in rest if a.startswith('--out=')]
    paths = [a for a in rest if not a.startswith('--out=')]
    try:
        if kind == 'loss':
            plot_loss(paths, outs[0] if outs else 'bench/results/loss.png')
        else:
            if kind == 'speed':                  # several JSONs (training, generation): one figure
                return plot_speed(paths, outs[0] if outs else Path(paths[0]).with_suffix('.png'))
            fn = {'scaling': plot_scaling, 'recall': plot_recall}[kind]
            for p in paths:
                fn(p, outs[0] if outs else Path(p).with_suffix('.png'))
    except NoMatplotlib as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    main()
