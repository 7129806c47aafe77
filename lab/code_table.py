"""
The README's table of every model on code (bench/demos.py --suite=code), printed as markdown from bench/results:
per model its seeds, the validation loss (mean ± std over them), Δ bits per byte against no memory by copy distance
(± s.e. over files and seeds), the same weights with the memory emptied minus as trained at [128,640), and the
training speed against no memory (bench/results/speed_code.json). tests/test_readme.py checks every printed cell
against the same JSONs; this only saves copying them by hand.

    python bench/demos.py --suite=code --variants=all --seeds=1,2,3 --train=False --split=validation
    python bench/speed.py --size=code --parts=train,eval --modes=eager --eval_modes=eager \
        --out=bench/results/speed_code.json      # if speed_code.json is missing
    python lab/code_table.py                 # models with no kept run yet are left out
"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / 'bench' / 'results'
# row label -> (the run in demos_code.json or None, its label in the copy-distance JSON, its emptied ablation)
ROWS = {
    'no memory': ('baseline', 'baseline', None),
    'XL, 128 slots': ('xl', 'xl', 'xl_nomem'),
    'its weights, 512 slots': (None, 'xl_at512', None),
    'LaMemo, 128 slots': ('lamemo', 'lamemo', 'lamemo_nomem'),
    'Compressive, 128 + 192 at c = 2': ('compressive', 'compressive', 'compressive_emptied'),
    'Infini-attention, linear': ('infini_linear', 'infini_linear', 'infini_linear_emptied'),
    'Infini-attention, delta': ('infini_delta', 'infini_delta', 'infini_delta_emptied'),
    '∞-former, STM 128 + 150 RBFs': ('infformer', 'infformer', 'infformer_emptied'),
    '∞-former, sticky memories': ('infformer_sticky', 'infformer_sticky', 'infformer_sticky_emptied'),
    'control: XL trained with 512': ('xl_mem512', 'xl_mem512', 'xl_mem512_nomem'),
    'control: Compressive, no compressed memory': ('compressive_no_cmem', 'compressive_no_cmem',
                                                   'compressive_no_cmem_nomem'),
    'control: none fed as Infini (2 × 4)': ('baseline_2x4', 'baseline_2x4', None),
    'control: Infini linear, no BPTT': ('infini_linear_bptt1', 'infini_linear_bptt1', 'infini_linear_bptt1_emptied'),
}
BUCKETS = ('[1,128)', '[128,640)', '[640,2048)', 'first')
EMPTIED_AT = '[128,640)'


def signed(x, digits=3):
    return f'{x:+.{digits}f}'.replace('-', '−')


def load(name):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def need(name):
    table = load(name)
    if table is None:
        sys.exit(f'bench/results/{name} is missing: run the commands in this file\'s docstring first')
    return table


def main():
    runs = need('demos_code.json')['runs']
    copy = need('longdoc_demos_code_copy_reach_with_xl_at512.json')['labels']
    speed = need('speed_code.json')['train']
    share = {b['bucket']: b['share'] for b in copy['baseline']['buckets']}
    head = ' | '.join(f'{b} {100 * share[b]:.2g}%' for b in BUCKETS)
    lines = [f'| every model on code (share of the bytes) | seeds | validation nats/byte | {head} | emptied − as '
             f'trained, {EMPTIED_AT} | train tok/s vs none |', '|---' * (5 + len(BUCKETS)) + '|']
    for label, (run, key, ablation) in ROWS.items():
        if key not in copy or (run and runs.get(run, {}).get('mean') is None):
            print(f'left out: {label} (no kept run)', file=sys.stderr)
            continue
        loss = run and f'{runs[run]["mean"]:.4f}' + (f' ± {runs[run]["std"]:.4f}' if runs[run]['std'] else '')
        cells = [label, str(len(copy[key]['runs'])), loss or '']
        for b in copy[key]['buckets']:
            if b['bucket'] in BUCKETS:
                cells.append('0' if key == 'baseline' else f'{signed(b["diff_bpc"])} ± {b["diff_bpc_se_total"]:.3f}')
        emptied = load(f'longdoc_demos_code_{ablation}_copy_reach.json') if ablation else None
        row = emptied and next(r for r in emptied['vs_as_trained'] if r['bucket'] == EMPTIED_AT)
        cells.append(f'{signed(row["diff_bpc"])} ± {row["diff_bpc_se"]:.3f}' if row else '')
        fast = speed.get(run or '', {}).get('eager')
        cells.append(f'{fast["ratio_to_baseline"]:.2f}×' if fast else '')
        lines.append('| ' + ' | '.join(cells) + ' |')
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
