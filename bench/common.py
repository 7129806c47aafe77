"""
What every benchmark shares: the table of model variants at one matched size, building a variant through the
model contract (SPEC §1: model_<name>.py, Config(**fields), Model, init_memory, forward, generate), the device and
precision set-up (train.py's), timing helpers, and writing results.

A variant is a dict in the format of tests/_models.py: 'model' names model_<model>.py, the rest are its Config
fields. Every model of the repository is in the table, so a variant whose model file or Config field is missing is
an error (a one-line message); `--strict=False` skips it with a note instead (a fork that removed a model).
"""

import dataclasses
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import train  # noqa: E402  (train.py's flag parsing, device/dtype resolution, memory helpers)

RESULTS = Path(__file__).resolve().parent / 'results'

# The matched CPU size: 4 layers, d 256, 4 heads of 64, d_inner 1024, segment 128, GPT-2 vocabulary.
CPU_SIZE = dict(vocab_size=50304, n_layer=4, n_embd=256, n_head=4, d_head=64, d_inner=1024, seg_len=128)
# The size of the CPU demos (config/*_demo.py): 4 layers, d 128, 4 heads of 32, d_inner 512, segment 64, memory 64
# (compressed memory 32 at c = 2, n_basis 150): the step-time ratios quoted in the top-level README.
DEMO_SIZE = dict(vocab_size=50304, n_layer=4, n_embd=128, n_head=4, d_head=32, d_inner=512, seg_len=64)
# The size people train (bench/gpu_size.sh, on a GPU): 16 layers, d 1024, 16 heads of 64, d_inner 4096, segment 512,
# memory 512 (compressed memory 256 at c = 2, n_basis 512), GPT-2 vocabulary.
GPU_SIZE = dict(vocab_size=50304, n_layer=16, n_embd=1024, n_head=16, d_head=64, d_inner=4096, seg_len=512)
# The GPT-2 forms at the CPU demos' size: 4 layers, n_embd 128, 4 heads of 32 (GPT-2's MLP: 4 x 128 = the demos' d_inner
# 512), segment 64, learned positions up to 128, GPT-2's own 50,257-token vocabulary.
GPT2_DEMO_SIZE = dict(vocab_size=50257, n_layer=4, n_embd=128, n_head=4, n_positions=128, seg_len=64)
# The code suite's size (config/*_code_demo.py, bench/demos.py --suite=code): the demos' model on bytes, segment 128,
# memory 128 (compressed memory 192 at c = 2, n_basis 150): the cost in tokens/s of each memory on code.
CODE_SIZE = dict(vocab_size=256, n_layer=4, n_embd=128, n_head=4, d_head=32, d_inner=512, seg_len=128)
SIZES = {'matched': (CPU_SIZE, dict(mem_len=128, cmem_len=64, n_basis=128)),
         'demo': (DEMO_SIZE, dict(mem_len=64, cmem_len=32, n_basis=150)),
         'code': (CODE_SIZE, dict(mem_len=128, cmem_len=192, n_basis=150)),
         'gpu': (GPU_SIZE, dict(mem_len=512, cmem_len=256, n_basis=512))}


def variant_table(mem_len=128, cmem_len=64, n_basis=128):
    """Every model variant with the fields that make its memory (the size comes separately). Memory 128,
    compressed memory 64 at c = 2, n_basis 128 at the matched CPU size."""
    return {
        'baseline': dict(model='xl', mem_len=0),                      # Transformer-XL without memory
        'xl': dict(model='xl', mem_len=mem_len),
        'lamemo': dict(model='lamemo', mem_len=mem_len),
        'compressive': dict(model='compressive', mem_len=mem_len, cmem_len=cmem_len, compression_rate=2),
        'infini_linear': dict(model='infini', memory_update='linear'),
        'infini_delta': dict(model='infini', memory_update='delta'),
        'infformer': dict(model='infformer', mem_len=mem_len, n_basis=n_basis, n_samples=n_basis),
        'infformer_sticky': dict(model='infformer', mem_len=mem_len, n_basis=n_basis, n_samples=n_basis, sticky=True),
    }


def gpt2_variant_table():
    """GPT-2 alone and the three memory forms built on it, each memory at its demo-size setting. Infini-attention
    trains as config/infini_gpt2_pg19.py: the graph kept over 2 segments, the memory emptied every 2."""
    return {
        'gpt2': dict(model='gpt2'),                                   # GPT-2 alone: the reference of every ratio
        'infformer_gpt2': dict(model='infformer_gpt2', n_basis=64, n_samples=128, ltm_reset_len=512, sticky=False),
        'compressive_gpt2': dict(model='compressive_gpt2', cmem_len=64, mem_len=0, compression_rate=2),
        'infini_gpt2': dict(model='infini_gpt2', memory_update='linear', bptt_segments=2, reset_every=2),
    }


VARIANTS = list(variant_table())
ZERO_FIELDS = ('dropout', 'dropatt')     # benchmarks run without dropout; set where the Config has the field
TRAIN_FIELDS = ('bptt_segments', 'reset_every')   # train.py's flags a variant may carry: how it trains, not its Config


class Skip(Exception):
    """This variant cannot be built here (its model file or a Config field is missing)."""


def build(spec, seed=0, **overrides):
    """spec: {'model': name, **Config fields}; overrides win. -> (model, config). Raises Skip if the model file or
    a field does not exist. Dropout fields that the Config has are set to 0 unless given."""
    spec = {k: v for k, v in {**spec, **overrides}.items() if k not in TRAIN_FIELDS}
    name = spec.pop('model')
    fields = config_fields(name)
    missing = sorted(set(spec) - fields)
    if missing:
        raise Skip(f"model_{name}.py's Config has no field {', '.join(missing)}")
    for f in ZERO_FIELDS:
        if f in fields:
            spec.setdefault(f, 0.0)
    module = train.import_model(name)
    config = module.Config(**spec)
    torch.manual_seed(seed)
    return module.Model(config), config


def config_fields(name):
    """The Config fields of model_<name>.py; Skip if the file is not in the repository."""
    if name not in train.available_models():
        raise Skip(f"model_{name}.py is not in the repository")
    return {f.name for f in dataclasses.fields(train.import_model(name).Config)}


def select(table, names, strict=False):
    """The variants named in `names` (comma-separated string or list; 'all' = every one), built lazily by the
    caller. Returns (specs {name: spec}, skipped {name: reason}) after checking each can be built."""
    names = list(table) if names in ('all', '', None) else (names.split(',') if isinstance(names, str) else names)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise train.UserError(f"unknown variant {unknown[0]!r}; known: {', '.join(table)}")
    specs, skipped = {}, {}
    for n in names:
        try:
            build(table[n], **_probe_overrides(table[n]))
            specs[n] = table[n]
        except Skip as e:
            if strict:
                raise train.UserError(f"{n}: {e}")
            skipped[n] = str(e)
            print(f"skip {n}: {e}", file=sys.stderr)
    return specs, skipped


def _probe_overrides(spec):
    """Build a variant at a tiny size to see whether it exists (fields absent from the spec, that its Config has)."""
    tiny = dict(vocab_size=32, n_layer=2, n_embd=16, n_head=2, d_head=8, d_inner=16, seg_len=8, n_positions=8)
    fields = config_fields(spec['model'])
    return {k: v for k, v in tiny.items() if k not in spec and k in fields}


# -----------------------------------------------------------------------------------------------------------
# Device, precision, compile (as train.py does)


def compile_model(model):
    """torch.compile for a benchmark that compiles several models in one process. dynamic=False: once a model
    of one file has been compiled, a second model of the same file with another memory shape would otherwise be
    recompiled with automatic dynamic shapes, whose graph can be much slower (measured: XL compiled after the
    baseline ran at 0.66x its eager speed, with dynamic=False at 0.90-0.93x). train.py compiles one
    model whose shapes do not change, so it keeps the default."""
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)   # one graph per shape
    return torch.compile(model, dynamic=False)


def run_rounds(entries, step, warmup, steps, device_type, label):
    """Round-robin timing: every round runs step(e) once for every entry, so background load moves all of them
    alike; the first `warmup` rounds are not timed (compilation happens there: e.first_step_s keeps round 0).
    Round r starts at entry r mod n (round 0 in the given order), so no entry is always first after the previous
    round's last: a position effect (the first step of a round ran slower than the same step later in 3 of 4 runs
    of bench/speed.py) is spread over all entries instead of charged to one. Each entry collects its timed seconds
    in e.times."""
    for r in range(warmup + steps if entries else 0):
        t_round = time.perf_counter()
        k = r % len(entries)
        for e in entries[k:] + entries[:k]:
            with Timer(device_type) as t:
                step(e)
            if r >= warmup:
                e.times.append(t.seconds)
            elif r == 0:
                e.first_step_s = t.seconds
        print(f"{label} round {r + 1}/{warmup + steps}: {time.perf_counter() - t_round:.1f} s", flush=True)


def setup(device='cpu'):
    """-> (device, device_type). cuda: TF32 on, as train.py."""
    device, device_type = train.resolve_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return device, device_type


def autocast(device_type, dtype):
    return train.autocast_context(device_type, dtype)


def sync(device_type):
    if device_type == 'cuda':
        torch.cuda.synchronize()


class Timer:
    """Wall time of a block, synchronising the device first and last."""

    def __init__(self, device_type):
        self.device_type = device_type

    def __enter__(self):
        sync(self.device_type)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device_type)
        self.seconds = time.perf_counter() - self.t0


def median(xs):
    return statistics.median(xs) if xs else float('nan')


def random_tokens(batch_size, length, vocab_size, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, length), generator=g).to(device)


def memory_bytes(memory):
    return sum(v.numel() * v.element_size() for v in train.memory_to_dict(memory).values())


# -----------------------------------------------------------------------------------------------------------
# Flags and results


def parse(argv, config_cls):
    """--name=value flags (and config files) for a benchmark's dataclass, with train.py's parser and errors."""
    cfg, _, _, _ = train.parse_args(argv, train_cls=config_cls, allow_model_fields=False)
    return cfg


def cli(argv, config_cls, run, table, size):
    """A benchmark's command line: --flags into config_cls, the variants of table(cfg) named by --variants, then
    run(cfg, specs, size(cfg), argv, skipped). Bad input is one line on stderr and exit status 2."""
    def go(argv):
        cfg = parse(argv, config_cls)
        specs, skipped = select(table(cfg), cfg.variants, cfg.strict)
        run(cfg, specs, size(cfg), argv, skipped)
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


def override_items(overrides):
    """'a=1,b=0.002,0.004,c=x' -> [('a', '1'), ('b', '0.002,0.004'), ('c', 'x')]: an item without '=' continues
    the previous value (basis_widths is itself a comma-separated list)."""
    items = []
    for part in [p for p in overrides.split(',') if p]:
        if '=' in part:
            items.append(list(part.split('=', 1)))
        elif items:
            items[-1][1] += ',' + part
        else:
            raise train.UserError(f"overrides are field=value,..., got {overrides!r}")
    return [tuple(i) for i in items]


def int_list(value, name='value'):
    """'1,2,3' -> [1, 2, 3] (empty items skipped); anything else is a one-line error naming --name."""
    try:
        return [int(v) for v in value.split(',') if v]
    except ValueError:
        raise train.UserError(f"--{name} takes comma-separated integers, got {value!r}") from None


# An absolute path in a string: at its start or after a space, '=', ',', ';', ':' or a quote ('//', as in a URL, is
# not one)
ABSOLUTE_PATH = re.compile(r"""(?<![^\s=,;:"'])/(?!/)[^\s,;:"']+""")


def relative_paths(value, root=REPO):
    """value (JSON: dicts, lists, strings) with every absolute path in its strings and keys written relative to root,
    the repository ('../out-demos/xl' for /work/out-demos/xl beside a repository at /work/main): a result names the
    checkpoints, data and files it read and wrote from the repository, not as they were on the machine that ran it.
    Relative paths are kept as given (relative to where the command ran: the repository in every documented one)."""
    if isinstance(value, dict):
        return {relative_paths(k, root): relative_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [relative_paths(v, root) for v in value]
    if isinstance(value, str):
        return ABSOLUTE_PATH.sub(lambda m: os.path.relpath(m.group(), root), value)
    return value


def write_json(path, payload, script, argv):
    """The results as JSON, with the date, the torch version (and CUDA's, the GPU's name) and the command that made
    them; every path in them relative to the repository (relative_paths)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'torch': torch.__version__,
               'threads': torch.get_num_threads(), 'command': ' '.join(['python', script] + list(argv)), **payload}
    if torch.cuda.is_available():
        payload = {'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(), **payload}
    path.write_text(json.dumps(relative_paths(payload), indent=1) + '\n')
    print(f"wrote {path}")
    return path


def try_plot(draw, *args):
    """draw(*args) a benchmark's figure; without matplotlib say so and go on (the JSON is already written)."""
    import plot
    try:
        draw(*args)
    except plot.NoMatplotlib as e:
        print(f"no plot: {e}", file=sys.stderr)
