"""
Cost as the usable history grows: training step time (forward + backward + AdamW) and the peak memory of a step,
against the number of past tokens a model can draw on.

    XL, LaMemo                  memory length mem_len                     (attention over it: linear growth)
    Compressive                 mem_len + c * cmem_len as cmem_len grows  (linear growth)
    Infini, the ∞-former        tokens already read, 1k ... 64k           (a fixed-size state: must stay flat)

    python bench/scaling.py                                  # CPU, the matched size, every variant present
    python bench/scaling.py --variants=xl,infini_linear --histories=1024,8192
    python bench/scaling.py --device=cuda

Every point is a (model, memory) pair: its memory is first filled (XL, Compressive) or brought to the history
(Infini, ∞-former) by forward passes over random tokens, and every timed step starts from that same memory, so
the history stays what the label says. All points are timed round-robin in one process (medians over `steps`
rounds). Peak memory is what a step allocates above what was allocated before it (weights, optimizer state and
the memory itself excluded): torch.cuda's peak counter on a GPU, the profiler's allocation events on CPU.
"""

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

AXIS = {'xl': 'mem_len', 'lamemo': 'mem_len', 'compressive': 'cmem_len',
        'infini_linear': 'tokens read', 'infini_delta': 'tokens read', 'infformer': 'tokens read'}


@dataclass
class ScalingConfig:
    variants: str = 'xl,lamemo,compressive,infini_linear,infini_delta,infformer'
    device: str = 'cpu'
    batch_size: int = 8
    dtype: str = 'auto'            # auto: bfloat16 on CUDA, float32 on CPU (as train.py)
    compile: bool = False          # torch.compile every point's model (recompiles per memory shape)
    mem_lens: str = '128,256,512,1024,2048'
    cmem_lens: str = '64,128,256,512,1024'
    histories: str = '1024,2048,4096,8192,16384,32768,65536'
    warmup: int = 2
    steps: int = 5
    out: str = str(common.RESULTS / 'scaling.json')
    plot: bool = True              # write the plot (needs matplotlib)
    strict: bool = True            # a missing model file or Config field is an error (False: skip it)

    def __post_init__(self):
        for name in ('batch_size', 'steps'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ('mem_lens', 'cmem_lens', 'histories'):
            if any(int(v) < 1 for v in getattr(self, name).split(',') if v):
                raise ValueError(f"{name} must be positive integers, got {getattr(self, name)!r}")


class Point:
    def __init__(self, series, history, model, memory, optimizer, ctx, batch_size, device):
        self.series, self.history, self.model, self.memory = series, history, model, memory
        self.optimizer, self.ctx = optimizer, ctx
        self.compiled = model
        c = model.config
        self.data = common.random_tokens(batch_size, c.seg_len + 1, c.vocab_size, seed=history, device=device)
        self.times = []
        self.peak = None

    def step(self):
        x, y = self.data[:, :-1], self.data[:, 1:]
        with self.ctx:
            _, loss, _, _ = self.compiled(x, self.memory, y)      # the same memory every time: history stays fixed
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def advance(model, memory, n_tokens, ctx, seed, batch_size, device):
    """Read n_tokens of random text (whole segments) into the memory."""
    c = model.config
    B = batch_size
    was = model.training
    model.eval()
    for s in range(n_tokens // c.seg_len):
        x = common.random_tokens(B, c.seg_len, c.vocab_size, seed=seed + s, device=device)
        with ctx:
            _, _, memory, _ = model(x, memory)
    model.train(was)
    return memory


def clone(memory):
    return common.train.memory_from_dict(memory, {k: v.clone() for k, v in common.train.memory_to_dict(memory).items()})


def make_points(name, spec, size, cfg, device, ctx):
    """The (history, model, memory) points of one variant's series."""
    axis, points = AXIS[name], []
    B = cfg.batch_size
    if axis == 'mem_len':                                       # one model, memories of every length
        model, c = common.build(spec, **size)
        model.to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for M in common.int_list(cfg.mem_lens):
            memory = advance(model, model.init_memory(B, device, mem_len=M), M + c.seg_len, ctx, M, B, device)
            points.append(Point(name, M, model, memory, opt, ctx, B, device))
    elif axis == 'cmem_len':                                    # a model per compressed-memory length
        for CM in common.int_list(cfg.cmem_lens):
            model, c = common.build(spec, **size, cmem_len=CM)
            model.to(device).train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            reach = c.mem_len + c.compression_rate * CM
            memory = advance(model, model.init_memory(B, device), reach + c.seg_len, ctx, CM, B, device)
            points.append(Point(name, reach, model, memory, opt, ctx, B, device))
    else:                                                       # one model, snapshots of one stream's state
        model, c = common.build(spec, **size)
        model.to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        memory, read = model.init_memory(B, device), 0
        for H in sorted(common.int_list(cfg.histories)):
            memory = advance(model, memory, H - read, ctx, read, B, device)
            read = H
            points.append(Point(name, H, model, clone(memory), opt, ctx, B, device))
    return points


def peak_bytes(point, device_type):
    """Bytes a training step allocates above what was allocated before it."""
    if device_type == 'cuda':
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        point.step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        point.step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == '[memory]')
    current = peak = 0
    for _, n in events:
        current += n
        peak = max(peak, current)
    return peak


def run(cfg, specs, size, argv=(), skipped=None):
    device, device_type = common.setup(cfg.device)
    dtype = common.train.resolve_dtype(cfg.dtype, device_type)
    ctx = common.autocast(device_type, dtype)
    points = []
    for name, spec in specs.items():
        t0 = time.perf_counter()
        points += make_points(name, spec, size, cfg, device, ctx)
        print(f"{name}: points ready in {time.perf_counter() - t0:.0f} s", flush=True)
    if cfg.compile:
        for p in points:
            p.compiled = common.compile_model(p.model)
    common.run_rounds(points, lambda p: p.step(), cfg.warmup, cfg.steps, device_type, 'scaling')
    for p in points:
        p.peak = peak_bytes(p, device_type)

    series = {}
    for p in points:
        s = series.setdefault(p.series, {'axis': AXIS[p.series], 'points': []})
        s['points'].append({'history': p.history, 'step_s': common.median(p.times), 'step_s_all': p.times,
                            'peak_bytes': p.peak, 'state_bytes': common.memory_bytes(p.memory)})
    for s in series.values():
        first, last = s['points'][0], s['points'][-1]
        s['step_time_ratio_last_to_first'] = last['step_s'] / first['step_s']
        s['history_ratio_last_to_first'] = last['history'] / first['history']
    result = {'config': dataclasses.asdict(cfg), 'size': size, 'specs': specs, 'skipped': skipped or {},
              'device': device, 'dtype': dtype, 'series': series}
    common.write_json(cfg.out, result, 'bench/scaling.py', argv)
    for name, s in series.items():
        pts = ', '.join(f"{p['history']}: {p['step_s'] * 1e3:.0f} ms / {p['peak_bytes'] / 2 ** 20:.0f} MiB"
                        for p in s['points'])
        print(f"{name} ({s['axis']}): {pts}")
    if not cfg.plot:
        return result
    try:
        import plot
        plot.plot_scaling(cfg.out, Path(cfg.out).with_suffix('.png'))
    except plot.NoMatplotlib as e:
        print(e)
    return result


def main(argv=None):
    common.cli(argv, ScalingConfig, run,
               table=lambda cfg: {k: v for k, v in common.variant_table().items() if k in AXIS},
               size=lambda cfg: common.CPU_SIZE)


if __name__ == '__main__':
    main()
