"""
torch.compile's CPU backend (inductor) writes bool tensors far more slowly than eager PyTorch: the minimal example
behind compile / eager ratios below 1 on the CPU (lab/LOG.md, 2026-11-25). A compiled training graph saves bool
masks for the backward pass (which entries of a ReLU, or of a clamp, let the gradient through), so every model with
a feed-forward ReLU pays this, the no-memory baseline included.

    python lab/inductor_bool_store.py                     # 2^20 float32 values, eager against compiled
    python lab/inductor_bool_store.py --n=4096 --rounds=5 --out=/tmp/bool_store.json

Each case runs eagerly, compiled (dynamic=False), and compiled with inductor's vectorisation off
(config.cpp.simdlen = 0, scalar C++ loops), interleaved round by round; medians in milliseconds.
"""

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))   # bench/common.py and the benchmarks
import common  # noqa: E402

LAB_RESULTS = Path(__file__).resolve().parent / 'results'     # the lab's results, beside its LOG

def relu_and_mask(x):
    y = torch.relu(x)
    return y, y <= 0


CASES = {
    'x <= 0 (bool out)': lambda x: x <= 0,
    'relu(x) and relu(x) <= 0 (what a compiled ReLU saves)': relu_and_mask,
    '(x <= 0).float() (float out)': lambda x: (x <= 0).float(),
    'relu(x) (float out)': torch.relu,
}


@dataclass
class BoolStoreConfig:
    n: int = 1 << 20           # float32 elements
    rounds: int = 50           # timed rounds (after 3 untimed ones, where compilation happens)
    out: str = str(LAB_RESULTS / 'inductor_bool_store.json')

    def __post_init__(self):
        if self.n < 1 or self.rounds < 1:
            raise ValueError(f"n and rounds must be >= 1, got {self.n} and {self.rounds}")


def compiled(fn, simdlen=None):
    """fn compiled with dynamic=False; simdlen=0: with inductor's vectorisation off (scalar C++ loops)."""
    return torch.compile(fn, dynamic=False, options={} if simdlen is None else {'cpp.simdlen': simdlen})


def measure(cfg):
    x = torch.randn(cfg.n, generator=torch.Generator().manual_seed(0))
    entries = {}
    for name, fn in CASES.items():
        entries[(name, 'eager')] = fn
        entries[(name, 'compile')] = compiled(fn)
        entries[(name, 'compile, no vectorisation')] = compiled(fn, simdlen=0)
    times = {key: [] for key in entries}
    for r in range(3 + cfg.rounds):
        for key, fn in entries.items():
            start = time.perf_counter()
            fn(x)
            if r >= 3:
                times[key].append(time.perf_counter() - start)
    out = {}
    for (name, mode), ts in times.items():
        out.setdefault(name, {})[mode] = 1e3 * common.median(ts)
    for name, modes in out.items():
        modes['compile / eager time'] = modes['compile'] / modes['eager']
    return out


def main(argv=None):
    def go(argv):
        cfg = common.parse(argv, BoolStoreConfig)
        result = measure(cfg)
        print(f"{cfg.n:,} float32 values, medians of {cfg.rounds} rounds, ms: eager | compile | compile without "
              f"vectorisation | compile / eager")
        for name, m in result.items():
            print(f"  {name:55s} {m['eager']:7.3f} | {m['compile']:7.3f} | {m['compile, no vectorisation']:7.3f} | "
                  f"{m['compile / eager time']:5.1f}x")
        common.write_json(cfg.out, {'n': cfg.n, 'rounds': cfg.rounds, 'cpu_capability':
                                    torch.backends.cpu.get_cpu_capability(), 'results': result},
                          'lab/inductor_bool_store.py', argv)
    common.train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
