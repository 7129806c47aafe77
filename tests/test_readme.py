"""
The README's headline numbers against bench/results: every cell of its results tables ("Memory on code", every
model on SymPy as bytes, and "Start from GPT-2", the recipe on code), each validation loss mean ± std and each Δ ±
s.e., rounded as printed, the figures of the code section's prose (CODE_PROSE) and the pretrained model's loss; a
perturbed README fails. Also the install's torch index (the Makefile's TORCH_INDEX, .ci/run's override) and the
sizes of README.md and bench/README.md. Pure Python: reads README.md and the JSONs, no torch.
"""

import ast
import json
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / 'bench' / 'results'
README_MAX_BYTES = 15 * 1024
BENCH_README_MAX_BYTES = 20 * 1024

# "Start from GPT-2" (the recipe on code): row label -> (bench/demos.py --suite=code_gpt2's variant, its longdoc label)
CODE_GPT2_ROWS = {
    'GPT-2 alone (the control)': ('gpt2', 'gpt2'),
    '∞-former, N = 128, threshold 512': ('infformer', 'infformer'),
    '∞-former, sticky memories': ('infformer_sticky', 'infformer_sticky'),
    'Compressive, 128 slots at c = 2': ('compressive', 'compressive'),
    'Infini-attention, linear (2 × 4, BPTT)': ('infini_linear', 'infini_linear'),
    'Infini-attention, delta': ('infini_delta', 'infini_delta'),
    'control: GPT-2 alone fed as Infini': ('gpt2_2x4', 'gpt2_2x4'),
}
CODE_GPT2_HEADER = 'fine-tuned from the pretrained GPT-2'


@lru_cache(maxsize=None)
def load(name):
    return json.loads((RESULTS / name).read_text())


def number(text):
    """A printed number as Python reads it: '−0.028' -> '-0.028', '+0.225' -> '0.225'."""
    return text.strip().replace('−', '-').lstrip('+')


def decimals(text):
    return len(number(text).partition('.')[2])


def same(printed, value):
    """Whether `value` rounds to `printed` at the decimals printed ('0' for an exact zero)."""
    p = number(printed)
    if p == '0':
        return value == 0
    got = f'{value:.{decimals(p)}f}'
    return got == p or (float(got) == 0 and float(p) == 0)


def pm(cell):
    """'5.423 ± 0.017' -> ('5.423', '0.017'); a bare number -> (it, None)."""
    a, _, b = cell.partition('±')
    return a.strip(), (b.strip() or None)


def row_cells(line):
    """A markdown table row's cells: '| a | b |' -> ['a', 'b']."""
    return [c.strip() for c in line.strip().strip('|').split('|')]


def table(text, first_header):
    """The markdown table whose header row starts with `first_header`: (header cells, [row cells])."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f'| {first_header} |')), None)
    if start is None:
        return None, []
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith('|'):
            break
        rows.append(row_cells(line))
    return row_cells(lines[start]), rows


def check_cell(errors, where, cell, mean, std=None):
    value, spread = pm(cell)
    if not value:
        errors.append(f'{where}: empty, the JSON has {mean:.6f}')
    elif not same(value, mean):
        errors.append(f'{where}: {cell!r}, the JSON has {mean:.6f}')
    if std is not None and spread is not None and not same(spread, std):
        errors.append(f'{where}: {cell!r}, the JSON has ± {std:.6f}')
    if std is not None and spread is None and number(value) != '0':
        errors.append(f'{where}: {cell!r} has no ± (the JSON: {std:.6f})')


def known_rows(rows, known, known_name, table_name, errors):
    """(label, cells, known[label]) for each table row whose label is a key of known (a *_ROWS dict); an error for
    each other row and, once the rows are read, for each key of known no row has."""
    seen = set()
    for cells in rows:
        label = cells[0]
        if label not in known:
            errors.append(f'{table_name} table: row {label!r} is not in tests/test_readme.py {known_name}')
            continue
        seen.add(label)
        yield label, cells, known[label]
    errors += [f'{table_name} table: row {label!r} is missing' for label in known if label not in seen]


def pretrained_mismatches(text):
    """The pretrained model's loss in the prose ("the pretrained model: **x**")."""
    m = re.search(r'the pretrained model:\s+\*\*(\d\.\d+)\*\*', text)
    pretrained = load('demos_code_gpt2.json')['pretrained']['validation/loss']
    if m is None:
        return ['the pretrained model\'s loss ("the pretrained model: **x**") is not in the README']
    if not same(m.group(1), pretrained):
        return [f'the pretrained model: {m.group(1)}, the JSON has {pretrained:.6f}']
    return []


# "Memory on code": row label -> (the run in demos_code.json or None, the label in the copy-distance JSON)
CODE_ROWS = {
    'no memory': ('baseline', 'baseline'),
    'XL, 128 slots': ('xl', 'xl'),
    'its weights, 512 slots': (None, 'xl_at512'),
    'LaMemo, 128 slots': ('lamemo', 'lamemo'),
    'Compressive, 128 + 192 at c = 2': ('compressive', 'compressive'),
    'Infini-attention, linear': ('infini_linear', 'infini_linear'),
    'Infini-attention, delta': ('infini_delta', 'infini_delta'),
    '∞-former, STM 128 + 150 RBFs': ('infformer', 'infformer'),
    '∞-former, sticky memories': ('infformer_sticky', 'infformer_sticky'),
    'control: XL trained with 512': ('xl_mem512', 'xl_mem512'),
    'control: Compressive, no compressed memory': ('compressive_no_cmem', 'compressive_no_cmem'),
    'control: none fed as Infini (2 × 4)': ('baseline_2x4', 'baseline_2x4'),
    'control: Infini linear, no BPTT': ('infini_linear_bptt1', 'infini_linear_bptt1'),
}
CODE_HEADER = 'every model on code (share of the bytes)'
# a row's key -> its ablation with the memory emptied (bench/demos.py CODE_ABLATIONS): the column 'emptied − as
# trained, BUCKET' reads its JSON's vs_as_trained
CODE_EMPTIED = {'xl': 'xl_nomem', 'xl_mem512': 'xl_mem512_nomem', 'lamemo': 'lamemo_nomem',
                'compressive': 'compressive_emptied', 'compressive_no_cmem': 'compressive_no_cmem_nomem',
                'infini_linear': 'infini_linear_emptied', 'infini_delta': 'infini_delta_emptied',
                'infini_linear_bptt1': 'infini_linear_bptt1_emptied', 'infformer': 'infformer_emptied',
                'infformer_sticky': 'infformer_sticky_emptied'}
CODE_TABLE = dict(name='code', header=CODE_HEADER, rows=CODE_ROWS, known_name='CODE_ROWS', demos='demos_code.json',
                  copy='longdoc_demos_code_copy_reach_with_xl_at512.json', baseline='baseline',
                  emptied=CODE_EMPTIED, ablation='longdoc_demos_code_{}_copy_reach.json', speed='speed_code.json')
CODE_GPT2_TABLE = dict(name='GPT-2', header=CODE_GPT2_HEADER, rows=CODE_GPT2_ROWS, known_name='CODE_GPT2_ROWS',
                       demos='demos_code_gpt2.json', copy='longdoc_demos_code_gpt2_copy_reach.json',
                       segment='longdoc_demos_code_gpt2_segment.json', baseline='gpt2')


def copy_table_mismatches(text, spec):
    """A table by copy distance (the code suites'): per row, from spec's JSONs, the validation loss (spec['demos']:
    its runs' mean ± std), its difference to the baseline run ('− ...'), the loss with its memory emptied ('memory
    emptied': the demos JSON's evals), the Δ bits per byte ± s.e. over files and seeds at a segment's first 4 bytes
    ('segment start': spec['segment']) and in each copy-distance bucket (a header 'BUCKET SHARE%': spec['copy'], the
    share of the bytes in it checked too), the same weights with the memory emptied minus as trained in a bucket
    ('emptied − as trained, BUCKET': spec['ablation'] of spec['emptied'][key], its vs_as_trained), the training
    speed against the baseline ('train tok/s ...': spec['speed'], eager) and the seeds a row averages ('seeds'). A
    row with none of these has the cell empty."""
    errors, where = [], spec['name'] + ' table'
    header, rows = table(text, spec['header'])
    if header is None:
        return [f'the {where} (header "| {spec["header"]} |") is not in the README']
    demos = load(spec['demos'])
    runs, evals = demos['runs'], demos.get('evals', {})
    copy = load(spec['copy'])
    base_run = runs[spec['baseline']]['mean']
    buckets = {}
    for head in header[1:]:
        name, _, share = head.rpartition(' ')
        if not share.endswith('%'):
            continue
        row = next((b for b in copy['labels'][spec['baseline']]['buckets'] if b['bucket'] == name), None)
        if row is None:
            errors.append(f'{where}: no bucket {name!r} in {spec["copy"]}')
            continue
        buckets[head] = name
        if not same(share.rstrip('%'), 100 * row['share']):
            errors.append(f'{where}: {head!r}, the JSON has {100 * row["share"]:.2f}%')
    for label, cells, (run, key) in known_rows(rows, spec['rows'], spec['known_name'], spec['name'], errors):
        for head, cell in zip(header[1:], cells[1:]):
            at = f'{where}, {label!r}, {head!r}'
            if head == 'seeds':                     # the runs the row's copy-distance reading averages
                n = len(copy['labels'][key]['runs'])
                if cell != str(n) or (run is not None and len(runs[run]['seeds']) != n):
                    errors.append(f'{at}: {cell!r}, the JSONs have {n} (and {len(runs[run]["seeds"]) if run else n})')
            elif head.startswith('validation'):
                if run is not None:
                    check_cell(errors, at, cell, runs[run]['mean'], runs[run]['std'])
                elif cell:
                    errors.append(f'{at}: a validation loss where the JSON has none')
            elif head.startswith('− '):
                check_cell(errors, at, cell, runs[run]['mean'] - base_run)
            elif head == 'memory emptied':
                emptied = evals.get(f'{run}_emptied')
                if emptied is None:
                    if cell:
                        errors.append(f'{at}: {cell!r}, the JSON has no emptied evaluation')
                else:
                    check_cell(errors, at, cell, emptied['mean'], emptied['std'])
            elif head == 'segment start' or head in buckets:      # a Δ: the baseline's own is a bare 0
                source, name = (load(spec['segment']), '[0,4)') if head == 'segment start' else (copy, buckets[head])
                row = next(b for b in source['labels'][key]['buckets'] if b['bucket'] == name)
                check_cell(errors, at, cell, row['diff_bpc'],
                           row['diff_bpc_se_total'] if key != spec['baseline'] else None)
            elif head.startswith('emptied − as trained'):
                ablation = spec.get('emptied', {}).get(key)
                if ablation is None:
                    if cell:
                        errors.append(f'{at}: {cell!r}, but the row has no emptied reading')
                    continue
                name = re.search(r'\[\d+,(\d+|end)\)|first', head).group(0)
                source = spec['ablation'].format(ablation)
                row = next((b for b in load(source)['vs_as_trained'] if b['bucket'] == name), None)
                if row is None:
                    errors.append(f'{at}: no bucket {name!r} in {source} vs_as_trained')
                    continue
                check_cell(errors, at, cell, row['diff_bpc'], row['diff_bpc_se'])
            elif head.startswith('train tok/s'):
                speed = load(spec['speed'])['train'].get(run or '', {}).get('eager')
                if speed is None:
                    if cell:
                        errors.append(f'{at}: {cell!r}, but {spec["speed"]} has no such run')
                    continue
                check_cell(errors, at, cell.rstrip('×'), speed['ratio_to_baseline'])
            else:
                errors.append(f'{where}: column {head!r} has no check')
    return errors


# "Memory on code"'s prose: each figure it prints (a number, or a WORDS word, at {} in the text; its whitespace as one
# space) against the copy-distance JSONs, as the table's cells are; the calibration's bar is the (0.065 bits
# a byte at [128,640): 0.1 nats per GPT-2 token on this code)
CALIBRATION_BITS = 0.065
WORDS = {'half': 0.5}
REACH = '[128,640)'


def code_delta(key, bucket=REACH):
    return next(b['diff_bpc'] for b in load(CODE_TABLE['copy'])['labels'][key]['buckets'] if b['bucket'] == bucket)


def code_speed(run):
    return load(CODE_TABLE['speed'])['train'][run]['eager']['ratio_to_baseline']


def code_emptied(key, bucket=REACH):
    source = CODE_TABLE['ablation'].format(CODE_EMPTIED[key])
    return next(b['diff_bpc'] for b in load(source)['vs_as_trained'] if b['bucket'] == bucket)


CODE_PROSE = [
    ('XL read with 512 gains {}', lambda: [-code_delta('xl_at512')]),
    ('(≥ {} asked)', lambda: [CALIBRATION_BITS]),
    ('{} more than with 128', lambda: [code_delta('xl') - code_delta('xl_at512')]),
    ('copying adds {} to its gain on first occurrences',
     lambda: [code_delta('xl_at512', 'first') - code_delta('xl_at512')]),
    ('at {}–{} of its speed', lambda: sorted(code_speed(k) / code_speed('xl') for k in ('lamemo', 'infformer'))),
    ('Compressive gains {} of what its control',
     lambda: [code_delta('compressive') / code_delta('compressive_no_cmem')]),
    ('its memory, emptied, costs {}', lambda: [code_emptied('infini_linear')]),
    ("Sticky memories keep {} of the ∞-former's gain",
     lambda: [code_delta('infformer_sticky') / code_delta('infformer')]),
]


def prose_mismatches(text):
    """Each CODE_PROSE figure as printed against its value; and the calibration, as the prose says, holds."""
    flat, errors = ' '.join(text.split()), []
    for template, values in CODE_PROSE:
        pattern = r'([−+]?\d+(?:\.\d+)?|' + '|'.join(WORDS) + ')'
        m = re.search(pattern.join(re.escape(part) for part in template.split('{}')), flat)
        if m is None:
            errors.append(f'code prose: "{template}" is not in the README')
            continue
        for printed, value in zip(m.groups(), values()):
            if printed in WORDS:
                ok = round(value, 1) == WORDS[printed]
            else:
                ok = same(printed, value)
            if not ok:
                errors.append(f'code prose: "{template}" prints {printed}, the JSONs have {value:.4f}')
    if -code_delta('xl_at512') < CALIBRATION_BITS:
        errors.append(f'code prose: the calibration fails, {-code_delta("xl_at512"):.4f} < {CALIBRATION_BITS}')
    return errors


def mismatches(text):
    return (copy_table_mismatches(text, CODE_TABLE) + copy_table_mismatches(text, CODE_GPT2_TABLE)
            + pretrained_mismatches(text) + prose_mismatches(text))


README = (ROOT / 'README.md').read_text()


def test_readme_tables_match_results():
    errors = mismatches(README)
    assert not errors, '\n'.join(errors)


def test_readme_tables_are_read():
    """The parser reads every row of every table (a table it missed would check nothing)."""
    assert len(table(README, CODE_GPT2_HEADER)[1]) == len(CODE_GPT2_ROWS)
    assert len(table(README, CODE_HEADER)[1]) == len(CODE_ROWS)


def perturb(old, new):
    assert README.count(old) == 1, old
    return README.replace(old, new)


@pytest.mark.parametrize('old,new', [
    ('| 1.5628 ± 0.0003 | −0.0054 |', '| 1.5628 ± 0.0003 | −0.0055 |'),                                # − GPT-2 alone
    ('| 1.6629 ± 0.0016 |', '| 1.6630 ± 0.0016 |'),                                                     # emptied
    ('| −0.187 ± 0.014 |', '| −0.187 ± 0.015 |'),                                                       # segment start
    ('| +0.121 ± 0.005 |', '| +0.122 ± 0.005 |'),                                                       # by copy distance
    ('[384,640) 4.5% |', '[384,640) 4.4% |'),                                                           # its share
    ('the pretrained model:\n**1.6286**', 'the pretrained model:\n**1.6287**'),
])
def test_perturbed_readme_fails(old, new):
    assert mismatches(perturb(old, new))


def nudge(cell, which=0, by=1):
    """cell with its `which`-th number moved by `by` in its last printed digit, sign and decimals kept:
    nudge('−0.274 ± 0.082') == '−0.273 ± 0.082', nudge('0.76×') == '0.77×'."""
    numbers = list(re.finditer(r'[−+]?\d+\.\d+', cell))
    m = numbers[which]
    d = decimals(m.group(0))
    value = float(number(m.group(0))) + by * 10 ** -d
    text = f'{value:{"+" if m.group(0)[0] in "−+" else ""}.{d}f}'.replace('-', '−')
    return cell[:m.start()] + text + cell[m.end():]


def edit_cell(text, first_header, label, head, edit):
    """text with the cell of row `label`, column `head` of the table under `first_header` replaced by edit(cell)
    (edit None: the row deleted)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f'| {first_header} |'))
    column = row_cells(lines[start]).index(head)
    for i in range(start + 2, len(lines)):
        row = row_cells(lines[i])
        if row[0] == label:
            if edit is None:
                del lines[i]
            else:
                row[column] = edit(row[column])
                lines[i] = '| ' + ' | '.join(row) + ' |'
            return '\n'.join(lines)
    raise AssertionError(f'no row {label!r}')


def code_column(prefix):
    return next(h for h in table(README, CODE_HEADER)[0] if h.startswith(prefix))


# the code table's cells a perturbation must be caught in: (row, column's start, edit of the cell)
CODE_PERTURBATIONS = [
    ('XL, 128 slots', 'validation', nudge),                                             # a mean
    ('LaMemo, 128 slots', 'validation', lambda c: nudge(c, 1)),                         # a std
    ('its weights, 512 slots', '[128,640)', nudge),                                     # XL long's Δ
    ('∞-former, STM 128 + 150 RBFs', '[128,640)', lambda c: nudge(c, 1)),               # an s.e.
    ('Infini-attention, linear', '[640,2048)', lambda c: c.replace('+', '−', 1)),      # a sign
    ('control: XL trained with 512', 'first', nudge),
    ('Compressive, 128 + 192 at c = 2', 'seeds', lambda c: str(int(c) + 1)),           # the seeds
    ('no memory', '[1,128)', lambda c: '−0.001'),                                       # the baseline's own 0
    ('XL, 128 slots', 'emptied', nudge),              # vs_as_trained, in bits (not nats)
    ('XL, 128 slots', 'emptied', lambda c: nudge(c, 1)),
    ('control: XL trained with 512', 'emptied', lambda c: ''),                          # a cell left empty
    ('its weights, 512 slots', 'emptied', lambda c: '+0.100 ± 0.010'),                  # where the JSON has none
    ('XL, 128 slots', 'train tok/s', nudge),
    ('no memory', 'train tok/s', lambda c: ''),
    ('control: Compressive, no compressed memory', 'seeds', None),                      # a row gone
]


@pytest.mark.parametrize('label,column,edit', CODE_PERTURBATIONS)
def test_perturbed_code_table_fails(label, column, edit):
    text = edit_cell(README, CODE_HEADER, label, code_column(column), edit)
    assert text != README
    assert copy_table_mismatches(text, CODE_TABLE), (label, column)


@pytest.mark.parametrize('old,new', [
    ('gains\n  0.41 (', 'gains\n  0.42 ('), ('0.13 more', '0.12 more'), ('adds 0.17', 'adds 0.18'),
    ('at 0.55–0.58 of', 'at 0.55–0.59 of'), ('Compressive gains half', 'Compressive gains 0.6'),
    ('costs 0.015', 'costs 0.016'), ('(≥ 0.065 asked)', '(≥ 0.06 asked)'), ('XL read with 512 gains', 'XL gains'),
    ('keep 0.68 of', 'keep 0.45 of'),
])
def test_perturbed_code_prose_fails(old, new):
    assert prose_mismatches(perturb(old, new))


def test_code_table_header_is_checked():
    head = next(line for line in README.splitlines() if line.startswith(f'| {CODE_HEADER} |'))
    for old, new in [('[128,640) 15%', '[128,640) 16%'),                                  # a share
                     ('emptied − as trained, [128,640)', 'emptied − as trained, [128,641)')]:   # no such bucket
        assert head.count(old) == 1, old
        assert copy_table_mismatches(README.replace(head, head.replace(old, new)), CODE_TABLE), (old, new)


def test_code_emptied_names_demos_ablations():
    """CODE_EMPTIED names bench/demos.py's CODE_ABLATIONS (read from its source: demos.py imports torch), each an
    ablation of its row's own run with the memory emptied: a renamed ablation is not read from a stale JSON."""
    tree = ast.parse((ROOT / 'bench' / 'demos.py').read_text())
    ablations = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                     and any(getattr(t, 'id', None) == 'CODE_ABLATIONS' for t in node.targets))
    for run, ablation in CODE_EMPTIED.items():
        assert ablation in ablations, ablation
        source, flags = ablations[ablation]
        assert source == run and flags in (['--eval_mem_len=0'], ['--reset_every=1']), (ablation, source, flags)


def test_nudge():
    assert nudge('−0.274 ± 0.082') == '−0.273 ± 0.082' and nudge('−0.274 ± 0.082', 1) == '−0.274 ± 0.083'
    assert nudge('1.1718 ± 0.0688') == '1.1719 ± 0.0688' and nudge('0.76×') == '0.77×'
    assert nudge('+0.365 ± 0.013') == '+0.366 ± 0.013' and nudge('−0.001') == '+0.000'


def test_rounding():
    assert same('−0.028', -0.02829) and not same('−0.028', -0.0285001) and same('+0.225', 0.2246)
    assert same('0', 0.0) and not same('0', 1e-9) and same('−0.000', 0.0001)


def test_readme_size():
    size = len(README.encode())
    assert size <= README_MAX_BYTES, f'README.md is {size} bytes, over {README_MAX_BYTES}: move text to lab/LOG.md'
    size = len((ROOT / 'bench' / 'README.md').read_bytes())
    assert size <= BENCH_README_MAX_BYTES, f'bench/README.md is {size} bytes, over {BENCH_README_MAX_BYTES}: move ' \
        'text to lab/LOG.md'


@pytest.mark.skipif(shutil.which('make') is None, reason='no make')
def test_torch_index():
    """Without a GPU, `make install` takes torch from PyTorch's CPU index (PyPI's Linux torch is the CUDA build);
    TORCH_INDEX= (as .ci/run, whose machine serves the CPU wheel itself) takes pip's own index."""
    env = {k: v for k, v in os.environ.items() if k not in ('TORCH_INDEX', 'MAKEFLAGS', 'MFLAGS', 'MAKELEVEL')}

    def dry(*args):                     # as a user's shell runs it (under .ci/run, TORCH_INDEX= is exported)
        cmd = ['make', '-n', '-s', 'install', 'PYTHON=python3', *args]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=30).stdout
    assert '--index-url https://download.pytorch.org/whl/cpu' in dry()
    assert '--index-url' not in dry('TORCH_INDEX=') and 'torch==2.13.0' in dry('TORCH_INDEX=')
    ci = (ROOT / '.ci' / 'run').read_text()
    override = re.search(r'(?m)^export TORCH_INDEX=$', ci)
    assert override and override.start() < ci.index('\nmake install-test')
