"""
Speed of every model variant at one matched size: training tokens/s (forward + backward + AdamW, memory carried)
in eager fp32, bf16 autocast, torch.compile and compile + bf16; evaluation tokens/s; generation tokens/s with
the model's KV cache (on CUDA also replayed as a CUDA graph) against recomputing the open window through forward().

    python bench/speed.py                                   # CPU, the matched size, every variant present
    python bench/speed.py --variants=baseline,xl --steps=20
    python bench/speed.py --device=cuda --batch_size=32     # a GPU
    python bench/speed.py --profile=lamemo                  # + torch.profiler tables of one eager fp32 step
    python bench/speed.py --size=demo --parts=train,eval --modes=eager   # step times at config/*_demo.py's size
    python bench/speed.py --size=code --parts=train --modes=eager --out=bench/results/speed_code.json   # *_code_demo
    python bench/speed.py --vocab=256 --parts=train --out=bench/results/speed_bytes.json   # byte level (enwik8)
    python bench/speed.py --suite=gpt2                      # GPT-2 alone and its memory forms, at the demos' size

Background load from other processes moves absolute numbers, so everything runs in one process with the
variants and modes interleaved round by round (each round runs one step of every entry), and we report medians
over the timed rounds and ratios to the no-memory baseline measured in the same rounds (--suite=gpt2: GPT-2 alone).

Each training entry also gets its FLOP ratio (the baseline's flops_per_token / the model's: the speed ratio a
model would reach if every FLOP ran equally fast) and its achieved FLOP/s as a fraction of this machine's matmul
peak in the same dtype, measured in the same process (a CPU "MFU"). At the GPT-2 vocabulary the output layer and
its cross-entropy are most of every model's step; --vocab=256 measures where the memories do the work.
Compiled modes compile every variant with dynamic=False (common.compile_model says why).
"""

import dataclasses
import sys
import time

try:
    import resource                     # minor page faults per step (Unix); elsewhere they are not counted
except ImportError:
    resource = None
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MODES = {  # name: (compiled, autocast dtype)
    'eager': (False, 'float32'),
    'bf16': (False, 'bfloat16'),
    'compile': (True, 'float32'),
    'compile_bf16': (True, 'bfloat16'),
}


class Suite(NamedTuple):
    table: object            # () -> {variant: spec} (common.py's tables), called with sizes[size][1]
    sizes: dict              # {size name: (size fields, the table's arguments)}; the first is the default
    baseline: str            # the variant every ratio is to
    gen_seg_len: object      # generation's segment length: an int, or None for the size's seg_len


SUITES = {
    'xl': Suite(common.variant_table, common.SIZES, 'baseline', 512),    # Transformer-XL's files and their kin
    'gpt2': Suite(common.gpt2_variant_table, {'demo': (common.GPT2_DEMO_SIZE, {})}, 'gpt2', None),   # GPT-2's forms:
}                                               # generation within their learned positions (n_positions 128)


@dataclass
class SpeedConfig:
    suite: str = 'xl'              # xl: common.variant_table(); gpt2: common.gpt2_variant_table() (GPT-2 and its forms)
    variants: str = 'all'          # comma-separated names from the suite's table, or all
    size: str = ''                 # xl: matched (common.CPU_SIZE, the default), demo (config/*_demo.py's size), code
                                   # (config/*_code_demo.py's, bytes) or gpu;
                                   # gpt2: demo (common.GPT2_DEMO_SIZE); '' = the suite's first
    vocab: int = 0                 # vocabulary size; 0 = the size's (GPT-2, 50304); 256 = byte level
    device: str = 'cpu'            # cpu, cuda, auto
    parts: str = 'train,eval,generate'   # what to measure (a subset runs faster)
    modes: str = 'eager,bf16,compile,compile_bf16'
    batch_size: int = 8
    warmup: int = 3                # untimed rounds first (compilation happens in them)
    steps: int = 10                # timed rounds: medians over these
    eval_modes: str = 'eager,bf16'  # train.py evaluates the uncompiled model
    gen_seg_len: int = 0           # generation: segment length of the generating models; 0 = the suite's (xl 512,
                                   # gpt2 the size's seg_len)
    gen_tokens: int = 32           # tokens generated per timing, after a prompt of gen_seg_len / 2 tokens
    gen_rounds: int = 3
    profile: str = ''              # variants to profile (torch.profiler, one eager fp32 training step)
    peak_size: int = 0             # n of the (n x n) products that measure the matmul peak (the MFU's denominator);
                                   # 0 = 1024 on a CPU, 8192 on a GPU (n = 1024 reached 48-73 TFLOP/s of an H200's ~790)
    out: str = str(common.RESULTS / 'speed.json')
    plot: bool = True              # write the plot (needs matplotlib)
    strict: bool = True            # a missing model file or Config field is an error (False: skip it)
    force_bf16: bool = False       # time the bf16 modes even on a CPU without native bf16 matmuls (hours)

    def __post_init__(self):
        if self.vocab < 0:
            raise ValueError(f"vocab must be >= 1 (or 0 for the size's vocabulary), got {self.vocab}")
        for name in ('batch_size', 'steps', 'gen_tokens', 'gen_rounds'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.gen_seg_len < 0:
            raise ValueError(f"gen_seg_len must be >= 1 (or 0 for the suite's), got {self.gen_seg_len}")
        if self.peak_size < 0:
            raise ValueError(f"peak_size must be >= 1 (or 0 for the device's default), got {self.peak_size}")
        if self.gen_tokens < 2:
            raise ValueError("gen_tokens must be >= 2 (the time per token is measured between tokens)")
        if self.suite not in SUITES:
            raise ValueError(f"suite must be one of {', '.join(SUITES)}, got {self.suite!r}")
        sizes = SUITES[self.suite].sizes
        self.size = self.size or next(iter(sizes))
        if self.size not in sizes:
            raise ValueError(f"size must be one of {', '.join(sizes)} (suite {self.suite}), got {self.size!r}")
        self.gen_seg_len = self.gen_seg_len or SUITES[self.suite].gen_seg_len or sizes[self.size][0]['seg_len']
        for field in ('modes', 'eval_modes'):
            for m in getattr(self, field).split(','):
                if m and m not in MODES:
                    raise ValueError(f"unknown mode {m!r} in {field}; known: {', '.join(MODES)}")
        for p in self.parts.split(','):
            if p not in ('train', 'eval', 'generate'):
                raise ValueError(f"unknown part {p!r} in parts; known: train, eval, generate")


# -----------------------------------------------------------------------------------------------------------
# Training and evaluation steps


class Entry:
    """One (variant, mode) timed in the rounds: its own memory and data, the variant's shared weights. A training step
    is train.py's: bptt_segments segments with the graph kept, one backward; the memory emptied every reset_every
    segments (0: never), in evaluation too."""

    def __init__(self, variant, mode, model, compiled, optimizer, dtype, device, device_type, batch_size,
                 bptt_segments=1, reset_every=0):
        self.variant, self.mode = variant, mode
        self.bptt_segments, self.reset_every = bptt_segments, reset_every
        self.model, self.compiled, self.optimizer = model, compiled, optimizer
        self.ctx = common.autocast(device_type, dtype)
        c = model.config
        self.memory = model.init_memory(batch_size, device)
        self.data = [common.random_tokens(batch_size, c.seg_len + 1, c.vocab_size, seed=i, device=device)
                     for i in range(4)]
        self.n = 0
        self.times = []
        self.faults = []                # minor page faults of each training step: fresh memory from the OS
        self.tokens = batch_size * c.seg_len                          # per segment
        self.everyone = torch.ones(batch_size, dtype=torch.bool, device=device)

    def batch(self):
        if self.reset_every and self.n and self.n % self.reset_every == 0:
            self.memory = self.model.reset_memory(self.memory, self.everyone)
        chunk = self.data[self.n % len(self.data)]
        self.n += 1
        return chunk[:, :-1], chunk[:, 1:]

    def train_step(self):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0
        total = 0.0
        for _ in range(self.bptt_segments):
            x, y = self.batch()
            with self.ctx:
                _, loss, self.memory, _ = self.compiled(x, self.memory, y)
            total = total + loss
        (total / self.bptt_segments).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.memory = common.train.detach_memory(self.memory)
        if resource:
            self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)

    @torch.no_grad()
    def eval_step(self):
        x, _ = self.batch()
        with self.ctx:
            _, _, self.memory, _ = self.model(x, self.memory)


def summarise(entries, flops=None, peak=None, baseline='baseline', train=True):
    """{variant: {mode: {tokens_per_s, step_s_median, first_step_s, ratio_to_baseline, ratio_to_eager}}}; with
    flops ({variant: flops_per_token}) and peak ({dtype: FLOP/s}) also flop_ratio (the baseline's FLOPs per token
    / the variant's), ratio_over_flop_ratio (1 = as fast as its FLOPs allow, next to the baseline) and mfu.
    train=False: evaluation steps (one segment each)."""
    out = {}
    for e in entries:
        t = common.median(e.times)
        r = out.setdefault(e.variant, {})[e.mode] = {
            'tokens_per_s': e.tokens * (e.bptt_segments if train else 1) / t, 'step_s_median': t, 'step_s': e.times,
            'first_step_s': getattr(e, 'first_step_s', None)}
        if e.faults:                    # over the timed steps (e.faults also holds the warm-up's)
            r['minor_faults_per_step'] = common.median(e.faults[-len(e.times):])
        if flops and peak:
            r['mfu'] = flops[e.variant] * r['tokens_per_s'] / peak[MODES[e.mode][1]]
    base = out.get(baseline, {})
    for name, modes in out.items():
        for mode, r in modes.items():
            if mode in base:
                r['ratio_to_baseline'] = r['tokens_per_s'] / base[mode]['tokens_per_s']
                if flops and baseline in flops:
                    r['flop_ratio'] = flops[baseline] / flops[name]
                    r['ratio_over_flop_ratio'] = r['ratio_to_baseline'] / r['flop_ratio']
        if 'eager' in modes:
            for mode, r in modes.items():
                r['ratio_to_eager'] = r['tokens_per_s'] / modes['eager']['tokens_per_s']
    return out


def make_optimizer(model, device_type):
    """AdamW as train.py builds it (fused on CUDA)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device_type == 'cuda')


# -----------------------------------------------------------------------------------------------------------
# Generation: the model's cache against recomputing the open window


@torch.no_grad()
def generate_recompute(model, idx, max_new_tokens, memory=None, callback=None):
    """Greedy generation without a KV cache, through forward() only: every new token re-runs the open segment
    (the tokens since the last segment boundary) on top of the memory; a full segment becomes memory, as
    forward() would make it. The prompt is cut into segments from its start, as generate() cuts it."""
    T = model.config.seg_len
    memory = model.init_memory(idx.size(0), idx.device) if memory is None else memory
    window = idx
    while window.size(1) > T:
        _, _, memory, _ = model(window[:, :T], memory)
        window = window[:, T:]
    logits, _, next_memory, _ = model(window, memory)
    out = [idx]
    for i in range(max_new_tokens):
        token = logits[:, -1].argmax(-1, keepdim=True)                # (B, 1), temperature 0
        out.append(token)
        if callback is not None:
            callback(token)
        if i + 1 == max_new_tokens:
            break
        if window.size(1) == T:                                       # the segment is complete: it is memory now
            memory, window = next_memory, token
        else:
            window = torch.cat([window, token], dim=1)
        logits, _, next_memory, _ = model(window, memory)
    return torch.cat(out, dim=1)


def time_generation(fn, device_type):
    """Seconds per token between the first and the last sampled token (the prompt is not counted)."""
    stamps = []

    def callback(_):
        common.sync(device_type)
        stamps.append(time.perf_counter())
    tokens = fn(callback)
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), tokens


def bench_generation(specs, size, cfg, device, device_type):
    """Seconds per token of greedy generation after a prompt of gen_seg_len / 2 tokens: the model's cached decode
    step, on CUDA also that step replayed as a CUDA graph (generate(cuda_graph=True)), and recomputing the open
    segment through forward() (generate_recompute). All three must pick the same tokens."""
    dtype = common.train.resolve_dtype('auto', device_type)
    ctx = common.autocast(device_type, dtype)
    models = {}
    for name, spec in specs.items():
        model, _ = common.build(spec, **{**size, 'seg_len': cfg.gen_seg_len})
        models[name] = model.to(device).eval()
    vocab = next(iter(models.values())).config.vocab_size
    prompt = common.random_tokens(1, cfg.gen_seg_len // 2, vocab, seed=7, device=device)
    ways = {'cached': lambda model, cb: model.generate(prompt, cfg.gen_tokens, temperature=0.0, callback=cb),
            'recompute': lambda model, cb: generate_recompute(model, prompt, cfg.gen_tokens, callback=cb)}
    if device_type == 'cuda':
        ways['captured'] = lambda model, cb: model.generate(prompt, cfg.gen_tokens, temperature=0.0, callback=cb,
                                                            cuda_graph=True)
    times = {n: {way: [] for way in ways} for n in models}
    same = {}
    for r in range(cfg.gen_rounds + 1):                               # round 0 is a warm-up
        for name, model in models.items():
            tokens = {}
            for way, fn in ways.items():
                with ctx:
                    t, tokens[way] = time_generation(lambda cb: fn(model, cb), device_type)
                if r:
                    times[name][way].append(t)
            same[name] = all(torch.equal(tokens['recompute'], t) for t in tokens.values())
        print(f"generation round {r}/{cfg.gen_rounds}", flush=True)
    out = {}
    for name, t in times.items():
        tokens_per_s = {way: 1 / common.median(seconds) for way, seconds in t.items()}
        out[name] = {f'{way}_tokens_per_s': v for way, v in tokens_per_s.items()}
        out[name]['speedup'] = tokens_per_s['cached'] / tokens_per_s['recompute']
        if 'captured' in tokens_per_s:
            out[name]['speedup_captured'] = tokens_per_s['captured'] / tokens_per_s['recompute']
        out[name]['same_greedy_tokens'] = same[name]
    return out


# -----------------------------------------------------------------------------------------------------------


def profile_step(entry, path):
    """torch.profiler over two eager training steps: the ops that cost, by self time."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    entry.train_step()
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(2):
            entry.train_step()
    key = 'self_cuda_time_total' if torch.cuda.is_available() else 'self_cpu_time_total'
    table = prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=30, max_name_column_width=50)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(table)
    print(f"wrote {path}")


def peak_matrix_size(cfg, device_type):
    """n of the (n x n) products that measure the peak: --peak_size, else 1024 on a CPU and 8192 on a GPU (on an
    H200, 1024 x 1024 products reached 48-73 TFLOP/s of its ~790 bf16, which made every MFU look over 10x too high)."""
    return cfg.peak_size or (8192 if device_type == 'cuda' else 1024)


def matmul_peak(device, device_type, dtypes, n=1024, reps=10):
    """This machine's matmul FLOP/s per dtype: the median of reps (n, n) @ (n, n) products (2 n^3 FLOPs each),
    the denominator of the CPU MFU. {dtype name: FLOP/s}"""
    out = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        a @ b
        times = []
        for _ in range(reps):
            with common.Timer(device_type) as t:
                a @ b
            times.append(t.seconds)
        out[name] = 2 * n ** 3 / common.median(times)
    return out


def bf16_matmul_check(c, batch_size, device, device_type, reps=5):
    """Seconds of one (B*T, d_model) @ (d_model, d_inner) matmul in float32 and in bfloat16. CPUs without native
    bf16 (no AVX512-BF16 / AMX: oneDNN reports no bf16 support) fall back to a scalar kernel that is tens of times
    slower than float32, which makes the bf16 modes meaningless there (and hours long at the matched size)."""
    a = torch.randn(batch_size * c.seg_len, c.n_embd, device=device)
    b = torch.randn(c.n_embd, getattr(c, 'd_inner', 4 * c.n_embd), device=device)    # GPT-2's MLP: 4 x n_embd
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        with common.Timer(device_type) as t:
            for _ in range(reps):
                x @ y
        out[str(dtype).split('.')[-1]] = t.seconds / reps
    out['bf16_slowdown'] = out['bfloat16'] / out['float32']
    if device_type == 'cpu':
        out['onednn_bf16_supported'] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return out


def drop_slow_bf16(cfg, modes, eval_modes, check):
    """On a CPU whose bf16 matmuls are > 3x slower than float32, the bf16 modes are dropped (unless
    --force_bf16=True) and the reason kept in the JSON."""
    if cfg.force_bf16 or check['bf16_slowdown'] <= 3:
        return modes, eval_modes, None
    reason = (f"this device has no native bf16 matmul (one bf16 matmul took {check['bf16_slowdown']:.0f}x the "
              f"float32 time): bf16 modes not timed (--force_bf16=True times them anyway)")
    print(reason, flush=True)
    keep = [m for m in MODES if MODES[m][1] == 'float32']
    return [m for m in modes if m in keep], [m for m in eval_modes if m in keep], reason


def run(cfg, specs, size, argv=(), skipped=None):
    device, device_type = common.setup(cfg.device)
    parts = cfg.parts.split(',')
    modes = [m for m in cfg.modes.split(',') if m] if 'train' in parts else []
    eval_modes = [m for m in cfg.eval_modes.split(',') if m] if 'eval' in parts else []
    models = {}
    for name, spec in specs.items():
        model, _ = common.build(spec, **size)
        model.to(device).train()
        models[name] = (model, common.compile_model(model) if any(MODES[m][0] for m in modes) else None,
                        make_optimizer(model, device_type))
    n_params = {name: sum(p.numel() for p in m.parameters()) for name, (m, _, _) in models.items()}
    flops = {name: m.flops_per_token() for name, (m, _, _) in models.items()}
    bf16_check, bf16_skipped = None, None
    if any(MODES[m][1] == 'bfloat16' for m in modes + eval_modes):       # only when a bf16 mode is asked for
        config = next(iter(models.values()))[0].config
        bf16_check = bf16_matmul_check(config, cfg.batch_size, device, device_type)
        modes, eval_modes, bf16_skipped = drop_slow_bf16(cfg, modes, eval_modes, bf16_check)

    def entries(mode_list, models=models):
        return [Entry(name, mode, m, c if MODES[mode][0] else m, opt, MODES[mode][1], device, device_type,
                      cfg.batch_size, *(specs[name].get(k, d) for k, d in (('bptt_segments', 1), ('reset_every', 0))))
                for mode in mode_list for name, (m, c, opt) in models.items()]

    train_entries = entries(modes)
    common.run_rounds(train_entries, Entry.train_step, cfg.warmup, cfg.steps, device_type, 'train')
    for m, _, _ in models.values():
        m.eval()
    eval_entries = entries(eval_modes)
    common.run_rounds(eval_entries, Entry.eval_step, min(cfg.warmup, 2), cfg.steps, device_type, 'eval')
    for m, _, _ in models.values():
        m.train()
    for name in [n for n in cfg.profile.split(',') if n]:
        if name in models:
            m, _, opt = models[name]
            profile_step(Entry(name, 'eager', m, m, opt, 'float32', device, device_type, cfg.batch_size),
                         Path(cfg.out).with_name(f'profile_{name}.txt'))
    peak = matmul_peak(device, device_type, sorted({MODES[m][1] for m in modes}),
                       peak_matrix_size(cfg, device_type)) if modes else {}
    baseline = SUITES[cfg.suite].baseline
    train_result = summarise(train_entries, flops, peak, baseline)
    eval_result = summarise(eval_entries, baseline=baseline, train=False)
    del models, train_entries, eval_entries                       # free the weights before generation
    generation = bench_generation(specs, size, cfg, device, device_type) if 'generate' in parts else {}

    result = {'config': dataclasses.asdict(cfg), 'size': size, 'specs': specs, 'skipped': skipped or {},
              'baseline': baseline, 'device': device, 'n_params': n_params, 'flops_per_token': flops,
              'matmul_peak_flops': peak, 'bf16_matmul': bf16_check, 'bf16_skipped': bf16_skipped,
              'train': train_result, 'eval': eval_result, 'generate': generation}
    result['targets'] = check_targets(result)
    common.write_json(cfg.out, result, 'bench/speed.py', argv)
    print_table(result)
    if not cfg.plot:
        return result
    try:
        import plot
        plot.plot_speed(cfg.out, Path(cfg.out).with_suffix('.png'))
    except plot.NoMatplotlib as e:
        print(e)
    return result


def check_targets(result):
    """The targets: training tokens/s of every memory model >= 0.75x the baseline's (per mode);
    compile + bf16 >= 1.8x eager fp32 for every model; generation with the cache >= 5x recomputing (on CUDA the step
    replayed as a CUDA graph), with the same greedy tokens."""
    out, baseline = {}, result.get('baseline', 'baseline')
    for name in dict.fromkeys(list(result['train']) + list(result['generate'])):
        modes, t = result['train'].get(name, {}), {}
        if name != baseline:
            t.update({f'{mode}_vs_baseline>=0.75': r['ratio_to_baseline'] >= 0.75
                      for mode, r in modes.items() if 'ratio_to_baseline' in r})
        if 'compile_bf16' in modes and 'eager' in modes:
            t['compile_bf16_vs_eager>=1.8'] = modes['compile_bf16']['ratio_to_eager'] >= 1.8
        if name != baseline and 'ratio_over_flop_ratio' in modes.get('eager', {}):
            t['eager_vs_flop_ratio>=0.9'] = modes['eager']['ratio_over_flop_ratio'] >= 0.9
        base = result['train'].get(baseline, {})
        for compiled, plain in (('compile', 'eager'), ('compile_bf16', 'bf16')):
            if compiled in modes and plain in modes:
                gain = modes[compiled]['tokens_per_s'] / modes[plain]['tokens_per_s']
                t[f'{compiled}_vs_{plain}>=1'] = gain >= 1.0
                if name != baseline and compiled in base and plain in base:
                    base_gain = base[compiled]['tokens_per_s'] / base[plain]['tokens_per_s']
                    t[f'{compiled}_gain>=baseline'] = gain >= base_gain
        g = result['generate'].get(name)
        if g:                                                     # on CUDA the captured step is the cache's
            t['generate_cache>=5x'] = g.get('speedup_captured', g['speedup']) >= 5
            t['generate_same_tokens'] = g['same_greedy_tokens']
        out[name] = t
    return out


def print_table(result):
    modes = list(next(iter(result['train'].values())).keys()) if result['train'] else []
    print("\ntraining tokens/s (ratio to baseline / FLOP ratio, MFU) | eval tokens/s | generation cached / recompute"
          " (, captured: the step as a CUDA graph)")
    for name in dict.fromkeys(list(result['train']) + list(result['eval']) + list(result['generate'])):
        r = result['train'].get(name, {})
        cells = ' '.join(f"{m} {r[m]['tokens_per_s']:,.0f} ({r[m].get('ratio_to_baseline', float('nan')):.2f} / "
                         f"{r[m].get('flop_ratio', float('nan')):.2f}, {r[m].get('mfu', float('nan')):.1%})"
                         for m in modes if m in r)
        ev = ' '.join(f"{m} {v['tokens_per_s']:,.0f}" for m, v in result['eval'].get(name, {}).items())
        g = result['generate'].get(name)
        gen = f"{g['cached_tokens_per_s']:,.1f} / {g['recompute_tokens_per_s']:,.1f} ({g['speedup']:.1f}x)" if g else ''
        if g and 'captured_tokens_per_s' in g:
            gen += f", captured {g['captured_tokens_per_s']:,.1f} ({g['speedup_captured']:.1f}x)"
        print(f"{name:14s} {cells} | {ev} | {gen}")
    for name, t in result['targets'].items():
        missed = [k for k, ok in t.items() if not ok]
        if missed:
            print(f"MISSED {name}: {', '.join(missed)}")


def main(argv=None):
    def sizes(cfg):
        return SUITES[cfg.suite].sizes[cfg.size]
    common.cli(argv, SpeedConfig, run, table=lambda cfg: SUITES[cfg.suite].table(**sizes(cfg)[1]),
               size=lambda cfg: {**sizes(cfg)[0], **({'vocab_size': cfg.vocab} if cfg.vocab else {})})


if __name__ == '__main__':
    main()
