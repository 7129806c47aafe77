"""
Every variant at the size people train, one process per variant: the steps bench/gpu_size.sh runs on a GPU.

    python bench/gpu_size.py --stage=fill --variants=xl      # compile every mode once (fills the compile caches)
    python bench/gpu_size.py --stage=time --variants=xl      # time the modes, profile a step if a target is missed
    python bench/gpu_size.py --stage=merge --out=FILE.json   # the per-variant JSONs -> ratios, targets, a table

The size (SIZES['gpu'] of bench/common.py): d_model 1024, 16 layers, 16 heads of 64, d_inner 4096, segment 512,
memory 512 (compressed 256 at c = 2, 512 basis functions), batch 8, GPT-2 vocabulary. Steps as bench/speed.py
times them (its Entry: forward, backward, fused AdamW, the memory carried), its modes interleaved round by round.
Modes: eager (fp32), compile_bf16 (torch.compile + bf16 autocast, as train.py on a GPU), graphs_bf16 (the same with
mode reduce-overhead: each step one CUDA-graph generation, as train.py's --compile_mode=reduce-overhead) and
blocks_bf16 (each layer block compiled, as --compile_blocks=True: its first step is the compile time it saves).
MFU is against an 8192^3 bf16 product measured in the same process. A profile (compiled, bf16) gives the GPU's busy
fraction: the kernels' time over the steps' wall time.
"""

import copy
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import speed  # noqa: E402

# name: (how it compiles: None eager, 'whole', 'graphs', 'blocks'; autocast dtype)
MODES = {'eager': (None, 'float32'), 'compile_bf16': ('whole', 'bfloat16'), 'graphs_bf16': ('graphs', 'bfloat16'),
         'blocks_bf16': ('blocks', 'bfloat16')}
# The targets (benchmark results, not tests): MFU of compile_bf16; every memory model's ratio to the baseline
# >= 0.9x its FLOP ratio; compile_bf16 >= 2x eager fp32; Infini's GPU busy >= 90% of its step.
MFU_TARGETS = {'baseline': 0.40, 'xl': 0.35}
# A dry run's size (DRY_RUN=1 bash bench/gpu_size.sh, on a CPU in seconds)
TINY_SIZE = dict(vocab_size=256, n_layer=2, n_embd=32, n_head=2, d_head=16, d_inner=64, seg_len=16)
SIZES = {**common.SIZES, 'tiny': (TINY_SIZE, dict(mem_len=16, cmem_len=8, n_basis=16))}
BUSY_TARGETS = {'infini_linear': 0.9, 'infini_delta': 0.9}


@dataclass
class SizeConfig:
    stage: str = 'time'            # fill, time or merge
    variants: str = 'all'
    size: str = 'gpu'              # gpu (the issue's); tiny, demo or matched (a dry run on a CPU)
    device: str = 'auto'
    batch_size: int = 8
    modes: str = 'eager,compile_bf16,graphs_bf16,blocks_bf16'
    warmup: int = 2                # untimed rounds (compilation happens in the first)
    steps: int = 5                 # timed rounds: medians over these
    profile: str = 'missed'        # missed: profile a variant that misses a target (or has a busy target); all; none
    profile_steps: int = 3
    backend: str = 'inductor'      # torch.compile's backend; eager: a dry run that traces without inductor's time
    peak_size: int = 0             # the measured product's n; 0 = 8192 on a GPU, 256 on a CPU
    results_dir: str = ''          # the per-variant JSONs (time) / where merge reads them
    attn_kernel: str = ''          # '' each model's default; sdpa, einsum or triton: every variant whose Config has it
    fill_log: str = ''             # merge: the fill stage's JSON lines (cold first steps), if any
    profiles: str = ''             # merge: the profiles' tables go here; '' = beside out, <out>_profiles.txt
    out: str = str(common.RESULTS / 'gpu_size.json')
    strict: bool = True

    def __post_init__(self):
        if self.stage not in ('fill', 'time', 'merge'):
            raise ValueError(f"stage must be fill, time or merge, got {self.stage!r}")
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {self.size!r}")
        for m in self.modes.split(','):
            if m not in MODES:
                raise ValueError(f"unknown mode {m!r}; known: {', '.join(MODES)}")
        if self.attn_kernel not in ('', 'sdpa', 'einsum', 'triton'):
            raise ValueError(f"attn_kernel must be '' (each model's default), sdpa, einsum or triton, got "
                             f"{self.attn_kernel!r}")
        if self.profile not in ('missed', 'all', 'none'):
            raise ValueError(f"profile must be missed, all or none, got {self.profile!r}")
        for name in ('batch_size', 'steps', 'profile_steps'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class GraphsEntry(speed.Entry):
    """A step replayed as CUDA graphs (compile mode reduce-overhead), as train.py's train_step does it: a new
    generation at every step, the carried memory copied out of the graphs' buffers."""

    def train_step(self):
        torch.compiler.cudagraph_mark_step_begin()
        super().train_step()
        self.memory = common.train.detach_memory(self.memory, copy=True)


def compile_for(mode, model, backend):
    """The callable a mode steps through, and the model whose weights it trains (blocks: a copy, compiled in place)."""
    how = MODES[mode][0]
    options = {} if backend == 'inductor' else {'backend': backend}
    if how is None:
        return model, model
    if how == 'blocks':
        model = copy.deepcopy(model)
        return common.train.compile_model(model, blocks=True, **options), model
    mode_name = 'reduce-overhead' if how == 'graphs' and backend == 'inductor' else 'default'
    return common.train.compile_model(model, mode_name, dynamic=False, **options), model


def entries_for(name, spec, size, cfg, device, device_type, modes):
    model, _ = common.build(spec, **size)
    model.to(device).train()
    out = []
    for mode in modes:
        compiled, owner = compile_for(mode, model, cfg.backend)
        cls = GraphsEntry if MODES[mode][0] == 'graphs' else speed.Entry
        out.append(cls(name, mode, owner, compiled, speed.make_optimizer(owner, device_type), MODES[mode][1], device,
                       device_type, cfg.batch_size))
    return model, out


def profile_busy(entry, steps, device_type):
    """torch.profiler over `steps` training steps after one untimed -> {'busy': the kernels' time over the steps' wall
    time (None on a CPU), 'kernels_per_step': device events a step (launches; None on a CPU), 'step_s',
    'table': the ops by device time, then by the host's time (a CPU: the host's only)}"""
    from torch.profiler import ProfilerActivity, profile
    cuda = device_type == 'cuda'
    entry.train_step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with common.Timer(device_type) as t:
            for _ in range(steps):
                entry.train_step()
    events = prof.key_averages()
    out = {'busy': None, 'kernels_per_step': None, 'step_s': t.seconds / steps}
    if cuda:                                   # kernels and copies: events that ran on the device, by their own time
        on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        out['busy'] = sum(e.self_device_time_total for e in on_device) / 1e6 / t.seconds
        out['kernels_per_step'] = sum(e.count for e in on_device) / steps
    out['table'] = events.table(sort_by='self_cpu_time_total', row_limit=20, max_name_column_width=60)   # the host
    if cuda:
        out['table'] = (events.table(sort_by='self_cuda_time_total', row_limit=25, max_name_column_width=60) +
                        '\n-- the host: by self CPU time\n' + out['table'])
    return out


def profile_or_why(entry, steps, device_type):
    """profile_busy, or why it failed (the profiler with CUDA graphs is the new part): a device call has one try, and
    the timings are already written."""
    try:
        return profile_busy(entry, steps, device_type)
    except Exception as e:                     # noqa: BLE001 (reported in the JSON and the profiles' file)
        return {'busy': None, 'kernels_per_step': None, 'error': f"{type(e).__name__}: {e}", 'table': str(e)}


def stage_fill(cfg, specs, size, device, device_type):
    """Compile each compiled mode of each variant (one step, one mode at a time), so that the timing stage's compiles
    hit the caches; prints the cold first step's seconds as a JSON line (contended: the script runs several at once)."""
    modes = [m for m in cfg.modes.split(',') if MODES[m][0]]
    for name, spec in specs.items():
        for mode in modes:
            _, (entry,) = entries_for(name, spec, size, cfg, device, device_type, [mode])
            with common.Timer(device_type) as t:
                entry.train_step()
            print(json.dumps({'variant': name, 'mode': mode, 'cold_first_step_s': round(t.seconds, 2)}), flush=True)
            del entry
            if device_type == 'cuda':
                torch.cuda.empty_cache()


def stage_time(cfg, specs, size, device, device_type, argv):
    """Time each variant's modes in rounds, measure the matmul peak, profile where a target is missed; one JSON per
    variant in results_dir."""
    results_dir = Path(cfg.results_dir or Path(cfg.out).parent / 'gpu_size_parts')
    modes = cfg.modes.split(',')
    for name, spec in specs.items():
        model, entries = entries_for(name, spec, size, cfg, device, device_type, modes)
        common.run_rounds(entries, lambda e: e.train_step(), cfg.warmup, cfg.steps, device_type, name)
        peak = speed.matmul_peak(device, device_type, sorted({MODES[m][1] for m in modes}),
                                 cfg.peak_size or (8192 if device_type == 'cuda' else 256))
        flops = {name: model.flops_per_token()}
        train = speed.summarise(entries)
        for mode, r in train[name].items():
            r['mfu'] = flops[name] * r['tokens_per_s'] / peak[MODES[mode][1]]
        part = {'variant': name, 'spec': spec, 'size': size, 'batch_size': cfg.batch_size,
                'n_params': sum(p.numel() for p in model.parameters()), 'flops_per_token': flops[name],
                'matmul_peak_flops': peak, 'train': train}
        base_path = results_dir / 'baseline.json'
        base = json.loads(base_path.read_text()) if base_path.exists() and name != 'baseline' else None
        missed = [k for k, ok in targets(merge_parts([p for p in (base, part) if p])).get(name, {}).items() if not ok]
        want = cfg.profile == 'all' or (cfg.profile == 'missed' and (missed or name in BUSY_TARGETS))
        common.write_json(results_dir / f'{name}.json', part, 'bench/gpu_size.py', argv)   # kept if profiling fails
        if want:                               # the compiled step, and the same as CUDA graphs where timed
            part['profile'] = {e.mode: dict(profile_or_why(e, cfg.profile_steps, device_type), missed=missed)
                               for e in entries if e.mode in ('compile_bf16', 'graphs_bf16')}
            common.write_json(results_dir / f'{name}.json', part, 'bench/gpu_size.py', argv)
        del model, entries
        if device_type == 'cuda':
            torch.cuda.empty_cache()


def merge_parts(parts):
    """Per-variant results -> {'train': {variant: {mode: ...}}, ...} with the ratios to the baseline (and its FLOP
    ratio) recomputed across processes, as speed.summarise makes them within one."""
    train = {p['variant']: p['train'][p['variant']] for p in parts}
    flops = {p['variant']: p['flops_per_token'] for p in parts}
    base = train.get('baseline', {})
    for name, modes in train.items():
        for mode, r in modes.items():
            if mode in base:
                r['ratio_to_baseline'] = r['tokens_per_s'] / base[mode]['tokens_per_s']
                r['flop_ratio'] = flops['baseline'] / flops[name]
                r['ratio_over_flop_ratio'] = r['ratio_to_baseline'] / r['flop_ratio']
    return {'train': train, 'flops_per_token': flops, 'generate': {},
            'profile': {p['variant']: p['profile'] for p in parts if 'profile' in p}}


def targets(result):
    """bench/speed.py's check_targets, and the issue's at this size: MFU (compile_bf16) of XL >= 35% and of the
    baseline >= 40%; every memory model's compile_bf16 ratio to the baseline >= 0.9x its FLOP ratio; compile_bf16 >= 2x
    eager fp32; Infini's GPU busy >= 90% of its step (where profiled)."""
    out = speed.check_targets(result)
    for name, modes in result['train'].items():
        t = out.setdefault(name, {})
        c = modes.get('compile_bf16', {})
        if name in MFU_TARGETS and 'mfu' in c:
            t[f'compile_bf16_mfu>={MFU_TARGETS[name]:.0%}'] = c['mfu'] >= MFU_TARGETS[name]
        if name != 'baseline' and 'ratio_over_flop_ratio' in c:
            t['compile_bf16_vs_flop_ratio>=0.9'] = c['ratio_over_flop_ratio'] >= 0.9
        if 'ratio_to_eager' in c:
            t['compile_bf16_vs_eager>=2'] = c['ratio_to_eager'] >= 2
        for mode, p in result.get('profile', {}).get(name, {}).items():
            if name in BUSY_TARGETS and p['busy'] is not None:
                t[f'{mode}_busy>={BUSY_TARGETS[name]:.0%}'] = p['busy'] >= BUSY_TARGETS[name]
    return out


def print_table(result):
    modes = list(dict.fromkeys(m for r in result['train'].values() for m in r))
    print("\ntraining tokens/s per mode (x baseline; MFU) first step s | busy: kernel time / step time (profiled)")
    for name, r in result['train'].items():
        cells = ' | '.join(f"{m} {r[m]['tokens_per_s']:,.0f} ({r[m].get('ratio_to_baseline', float('nan')):.2f}x; "
                           f"{r[m].get('mfu', float('nan')):.1%}) {r[m].get('first_step_s') or 0:.1f}s"
                           for m in modes if m in r)
        busy = ''.join(f" | {mode} busy {p['busy']:.0%}, {p['kernels_per_step']:,.0f} kernels a step"
                       for mode, p in result['profile'].get(name, {}).items() if p['busy'] is not None)
        flop = next((v['flop_ratio'] for v in r.values() if 'flop_ratio' in v), float('nan'))
        print(f"{name:16s} FLOP ratio {flop:.2f} | {cells}{busy}")
    for name, t in result['targets'].items():
        missed = [k for k, ok in t.items() if not ok]
        print(f"{'MISSED' if missed else 'met   '} {name}: {', '.join(missed) or ', '.join(t) or '(no target)'}")


def stage_merge(cfg, argv):
    results_dir = Path(cfg.results_dir or Path(cfg.out).parent / 'gpu_size_parts')
    names = list(common.variant_table()) if cfg.variants == 'all' else cfg.variants.split(',')
    parts = [json.loads((results_dir / f'{n}.json').read_text()) for n in names if (results_dir / f'{n}.json').exists()]
    if not parts:
        raise common.train.UserError(f"no per-variant results in {results_dir}")
    result = merge_parts(parts)
    result['targets'] = targets(result)
    result['parts'] = {p['variant']: {k: v for k, v in p.items() if k not in ('train', 'profile')} for p in parts}
    if cfg.fill_log and Path(cfg.fill_log).exists():
        for line in Path(cfg.fill_log).read_text().splitlines():
            if line.startswith('{'):
                r = json.loads(line)
                cold = result['parts'].get(r['variant'], {}).setdefault('cold_first_step_s', {})
                cold[r['mode']] = r['cold_first_step_s']
    tables = [f"== {name} ({mode}; busy {p['busy']}, {p['kernels_per_step']} kernels a step; missed: "
              f"{', '.join(p['missed']) or 'none'})\n{p.pop('table')}"
              for name, modes in result['profile'].items() for mode, p in modes.items()]
    if tables:
        profiles = Path(cfg.profiles or Path(cfg.out).with_name(Path(cfg.out).stem + '_profiles.txt'))
        profiles.write_text('\n'.join(tables))
        print(f"wrote {profiles}")
    common.write_json(cfg.out, {'config': dataclasses.asdict(cfg), **result}, 'bench/gpu_size.py', argv)
    print_table(result)
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv

    def go(argv):
        cfg = common.parse(argv, SizeConfig)
        if cfg.stage == 'merge':
            return stage_merge(cfg, argv)
        specs, _ = common.select(common.variant_table(**SIZES[cfg.size][1]), cfg.variants, cfg.strict)
        if cfg.attn_kernel:
            specs = {n: {**spec, 'attn_kernel': cfg.attn_kernel}
                     if 'attn_kernel' in common.config_fields(spec['model']) else spec for n, spec in specs.items()}
        device, device_type = common.setup(cfg.device)
        size = SIZES[cfg.size][0]
        if cfg.stage == 'fill':
            return stage_fill(cfg, specs, size, device, device_type)
        return stage_time(cfg, specs, size, device, device_type, argv)
    common.train.run_cli(go, argv)


if __name__ == '__main__':
    main()
