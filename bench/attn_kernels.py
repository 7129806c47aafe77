"""
One layer's Transformer-XL relative attention (§3.3) on each path that can compute it, timed alone: forward, and
forward + backward, at the size people train (B 8, H 16, T 512, K = 1024 keys, d_head 64, bf16).

    python bench/attn_kernels.py --device=cuda                         # every path, compiled where it compiles
    python bench/attn_kernels.py --device=cuda --paths=sdpa,triton --iters=50
    python bench/attn_kernels.py --device=cpu --dtype=float32 --quick=True   # a dry run (Triton interpreted)
    python bench/attn_kernels.py --aot=True                             # ptxas on each kernel, no GPU needed
    python bench/attn_kernels.py --aot=True --aot_tiles='64,64,4,2'     # ... at other tiles than the shipped

Paths (the inputs are q, u, v, k, v, W_{k,R} R as a layer makes them; the causal mask with memory):
    einsum  the reference: (q+u)kᵀ + rel_shift((q+v) r_kᵀ), masked softmax, product with v (model_xl.py's einsum path)
    sdpa    today's default: the rel-shifted (b)+(d) as SDPA's additive float bias (model_xl.py's sdpa path)
    flex    FlexAttention: the rel-shift as index arithmetic in a score_mod over the unshifted (b)+(d), a causal
            BlockMask (CUDA only: on the CPU it has no backward)
    triton  rel_attention_triton.py: (b)+(d) inside each tile of one flash-style kernel (attn_kernel='triton'); on the
            CPU interpreted, in float32 only
    flash   the floor: SDPA with no positional term at all (causal_lower_right): what the position term costs
One JSON line per path (triton: one per --triton_tiles entry, triton_<entry>): milliseconds (median over
--iters after --warmup), and the largest difference of its output and its gradients from the einsum path's (flash: no
positions, so not compared), or why it was skipped.
--quick: a tiny size and one iteration, no warm-up, to check that every path runs. --compile compiles einsum, sdpa and flex (the
GPU timings of the models are compiled); triton is its own kernel and flash needs nothing.
--aot: no timing. Every kernel of rel_attention_triton.py is compiled ahead of time for sm_90, sm_80 and sm_100 at the
tiles it ships for each (its TILES: the forward's, the backward's; the ∂r_k kernel at its POSITIONS_STAGES), or at
--aot_tiles, beside a plain causal flash forward and its ∂k, ∂v kernel at the same tiles (bench/flash_yardstick.py), and
the ptxas in the triton wheel says what each costs: one JSON line per kernel and architecture with registers per thread,
spilled bytes per thread (stores, loads), shared memory (Triton's allocation) and the tensor-core instructions of its
PTX by shape (wgmma: sm_90's 64-row products; tcgen05.mma: sm_100's; mma.sync: 16 rows). The arguments are specialised
as the JIT specialises them at the size above (every pointer 16-byte aligned, every integer a multiple of 16).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import train  # noqa: E402

PATHS = ('einsum', 'sdpa', 'flex', 'triton', 'flash')
QUICK = dict(batch_size=1, n_head=2, seg_len=32, keys=64, d_head=16, iters=1, warmup=0)
TRITON_TILES = '64,64,4,2/64,16,4,2;32,32,4,2;64,16,4,2'   # rel_attention_triton.py's TILES for sm_90, sm_80 and sm_100
                                                           # (a test keeps them equal)


@dataclass
class AttnConfig:
    device: str = 'cpu'            # cpu, cuda, auto
    dtype: str = 'bfloat16'        # bfloat16 or float32: the inputs; every path accumulates in float32
    paths: str = ','.join(PATHS)
    batch_size: int = 8
    n_head: int = 16
    seg_len: int = 512             # T queries
    keys: int = 1024               # K = mem_len + seg_len keys
    d_head: int = 64
    iters: int = 20                # timed repetitions: the median is reported
    warmup: int = 5                # untimed repetitions first (compilation happens here)
    compile: bool = True           # torch.compile einsum, sdpa and flex on a CUDA device (the CPU runs them eager)
    triton_tiles: str = TRITON_TILES  # the triton path's tiles, ';' between: block_q,block_k,num_warps[,num_stages]
                                      # for every kernel, or the forward's/the backward's
    quick: bool = False            # QUICK's tiny size and one iteration: does every path run?
    aot: bool = False              # no timing: ptxas's registers, spills and shared memory of each kernel (no GPU)
    aot_tiles: str = ''            # --aot at these tiles (as triton_tiles) on every architecture instead of TILES'

    def __post_init__(self):
        if self.dtype not in ('bfloat16', 'float32'):
            raise ValueError(f"dtype must be bfloat16 or float32, got {self.dtype!r}")
        for p in self.paths.split(','):
            if p not in PATHS:
                raise ValueError(f"unknown path {p!r} in paths; known: {', '.join(PATHS)}")
        for name in ('batch_size', 'n_head', 'seg_len', 'd_head', 'iters'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.keys < self.seg_len:
            raise ValueError(f"keys (memory + segment) must be >= seg_len ({self.seg_len}), got {self.keys}")
        for entry in self.triton_tiles.split(';') + (self.aot_tiles.split(';') if self.aot_tiles else []):
            if parse_tiles(entry) is None:
                raise ValueError(f"triton_tiles and aot_tiles are block_q,block_k,num_warps[,num_stages] (powers of "
                                 f"two but the stages, blocks >= 16), for every kernel or the forward's/the "
                                 f"backward's, separated by ';', got {entry!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")


def parse_tiles(entry):
    """'64,64,4,2/64,16,4,2' (the forward's/the backward's) or '32,32,4' (both; num_stages 2 where left out) ->
    rel_attention's tiles, ((block_q, block_k, num_warps, num_stages), (...)), or None if it is not that."""
    tiles = []
    for part in entry.split('/'):
        numbers = part.split(',')
        if len(numbers) not in (3, 4) or not all(n.isdigit() and int(n) > 0 for n in numbers) \
                or any(int(n) & (int(n) - 1) for n in numbers[:3]) or min(int(n) for n in numbers[:2]) < 16:
            return None
        tiles.append(tuple(int(n) for n in numbers) + (2,) * (4 - len(numbers)))
    return (tiles[0], tiles[0]) if len(tiles) == 1 else tuple(tiles) if len(tiles) == 2 else None


def tiles_entry(tiles):
    """parse_tiles' inverse: one block_q,block_k,num_warps,num_stages where the forward's are the backward's."""
    return '/'.join(','.join(map(str, each)) for each in (tiles[:1] if tiles[0] == tiles[1] else tiles))


# -----------------------------------------------------------------------------------------------------------
# The paths: each (q, u, v_bias, k, v, r_k, mask, scale) -> out (B, H, T, D)


def rel_shift(x):
    """model_xl.py's rel_shift: column c (distance K-1-c) of row i moves to column j = c - (T-1-i)."""
    B, H, T, K = x.shape
    x = torch.cat([x.new_zeros(B, H, T, 1), x], dim=-1).view(B, H, K + 1, T)
    return x[:, :, 1:].reshape(B, H, T, K)


def einsum_path(q, u, v_bias, k, v, r_k, mask, scale):
    BD = rel_shift(torch.einsum('bhid,hjd->bhij', q + v_bias, r_k))
    score = (torch.einsum('bhid,bhjd->bhij', q + u, k) + BD) * scale
    prob = F.softmax(score.masked_fill(~mask, float('-inf')).float(), dim=-1).to(v.dtype)
    return torch.einsum('bhij,bhjd->bhid', prob, v)


def sdpa_path(q, u, v_bias, k, v, r_k, mask, scale):
    BD = rel_shift(torch.einsum('bhid,hjd->bhij', q + v_bias, r_k))
    bias = (BD * scale).masked_fill(~mask, float('-inf')).to(k.dtype)
    return F.scaled_dot_product_attention((q + u).to(k.dtype), k, v, attn_mask=bias)


def flex_path(flex_attention, block_mask):
    def path(q, u, v_bias, k, v, r_k, mask, scale):
        T, K = q.size(2), k.size(2)
        BD = torch.einsum('bhid,hjd->bhij', q + v_bias, r_k)     # (B, H, T, K) unshifted: column c = distance K-1-c

        def score_mod(score, b, h, i, j):                          # score = scale (q+u)·k_j already
            c = torch.clamp(j + (T - 1) - i, max=K - 1)            # the rel-shift; c > K-1 only where masked
            return score + BD[b, h, i, c] * scale
        return flex_attention((q + u).to(k.dtype), k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return path


def flash_path(q, u, v_bias, k, v, r_k, mask, scale):
    from torch.nn.attention.bias import causal_lower_right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.size(2), k.size(2)), scale=scale)


def triton_path(rel_attention, tiles):
    def path(q, u, v_bias, k, v, r_k, mask, scale):
        return rel_attention(q, u[:, 0], v_bias[:, 0], k, v, r_k, mask, scale, tiles)[0]
    return path


def build_paths(cfg, device_type, T, K):
    """{name: callable or the reason it is skipped}"""
    compiled = cfg.compile and device_type == 'cuda'
    maybe_compile = torch.compile if compiled else (lambda fn: fn)
    paths = {'einsum': maybe_compile(einsum_path), 'sdpa': maybe_compile(sdpa_path), 'flash': flash_path}
    try:
        if device_type != 'cuda':
            raise RuntimeError("it has no backward on the CPU")
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        block_mask = create_block_mask(lambda b, h, i, j: (K - T) + i - j >= 0, None, None, T, K,
                                       device=device_type)
        paths['flex'] = maybe_compile(flex_path(maybe_compile(flex_attention), block_mask))
    except Exception as e:                                         # an older torch, a device flex does not serve
        paths['flex'] = f"FlexAttention unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    try:
        from rel_attention_triton import rel_attention
        for entry in cfg.triton_tiles.split(';'):
            paths[f'triton_{entry}'] = triton_path(rel_attention, parse_tiles(entry))
    except ImportError as e:
        paths['triton'] = f"triton unavailable: {e}"
    if device_type != 'cuda' and cfg.dtype != 'float32':
        paths = {n: p for n, p in paths.items() if not n.startswith('triton')}
        paths['triton'] = "Triton's interpreter (the CPU) has no bf16 arithmetic: --dtype=float32"
    wanted = [n for n in PATHS if n in cfg.paths.split(',')]                # einsum first: the reference
    return {n: p for w in wanted for n, p in paths.items() if n.split('_')[0] == w}


# -----------------------------------------------------------------------------------------------------------
# Timing


def inputs(cfg, device, dtype):
    """Leaves q, u, v, k, v, r_k (the scale of a trained layer's) and the causal mask with K - T memory slots."""
    B, H, T, K, D = cfg.batch_size, cfg.n_head, cfg.seg_len, cfg.keys, cfg.d_head
    g = torch.Generator().manual_seed(0)
    shapes = [(B, H, T, D), (H, 1, D), (H, 1, D), (B, H, K, D), (B, H, K, D), (H, K, D)]
    leaves = [torch.randn(*s, generator=g).to(device, dtype).requires_grad_() for s in shapes]
    i, j = torch.arange(T, device=device)[:, None], torch.arange(K, device=device)[None]
    return leaves, ((K - T) + i - j >= 0)[None, None].expand(B, 1, T, K)


def time_ms(fn, cfg, device_type):
    """Median milliseconds of fn() over cfg.iters runs after cfg.warmup."""
    times = []
    for n in range(cfg.warmup + cfg.iters):
        common.sync(device_type)
        t0 = time.perf_counter()
        fn()
        common.sync(device_type)
        if n >= cfg.warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(name, path, leaves, mask, scale, grad_out, reference, cfg, device_type):
    """One path's JSON line: times, and its differences from the reference (out, gradients) where it has one."""
    def forward():
        with torch.no_grad():
            return path(*leaves, mask, scale)

    def forward_backward():
        out = path(*leaves, mask, scale)
        return out, torch.autograd.grad(out, leaves, grad_out, allow_unused=True)

    out, grads = forward_backward()
    line = dict(path=name)
    if reference is not None and name != 'flash':
        ref_out, ref_grads = reference
        line['max_abs_diff_out'] = (out.float() - ref_out.float()).abs().max().item()
        line['max_abs_diff_grads'] = max((a.float() - b.float()).abs().max().item()
                                         for a, b in zip(grads, ref_grads) if a is not None and b is not None)
    line['fwd_ms'] = time_ms(forward, cfg, device_type)
    line['fwd_bwd_ms'] = time_ms(forward_backward, cfg, device_type)
    return line, (out, grads)


def run(cfg):
    if cfg.quick:
        cfg = AttnConfig(**{**asdict(cfg), **QUICK})
    device, device_type = common.setup(cfg.device)
    if device_type != 'cuda':          # Triton's kernels run interpreted (slowly); set before anything imports triton
        os.environ['TRITON_INTERPRET'] = '1'
    dtype = getattr(torch, cfg.dtype)
    leaves, mask = inputs(cfg, device, dtype)
    scale = cfg.d_head ** -0.5
    grad_out = torch.randn(leaves[0].shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    head = dict(device=torch.cuda.get_device_name() if device_type == 'cuda' else 'cpu', torch=torch.__version__,
                dtype=cfg.dtype, B=cfg.batch_size, H=cfg.n_head, T=cfg.seg_len, K=cfg.keys, D=cfg.d_head,
                compiled=cfg.compile and device_type == 'cuda', iters=cfg.iters)
    reference = None
    for name, path in build_paths(cfg, device_type, cfg.seg_len, cfg.keys).items():
        if isinstance(path, str):
            line = dict(path=name, skipped=path)
        else:
            try:
                line, result = measure(name, path, leaves, mask, scale, grad_out, reference, cfg, device_type)
                if name == 'einsum':
                    reference = result
            except Exception as e:                                 # one path failing does not stop the others
                line = dict(path=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        print(json.dumps({**line, **head}), flush=True)


# -----------------------------------------------------------------------------------------------------------
# --aot: what ptxas makes of each kernel, without a GPU

AOT_ARCHS = (90, 80, 100)   # Hopper, Ampere, Blackwell (rel_attention_triton.tiles_for)
AOT_TYPES = {'MASK_ptr': '*i1', 'LSE': '*fp32', 'DELTA': '*fp32', 'DR': '*fp32', 'G_KEYS': '*fp32', 'G_ROWS': '*fp32',
             'scale': 'fp32', 'B': 'i32',
             'stride_mb': 'i32', 'stride_mt': 'i32', 'H': 'i32', 'T': 'i32', 'K': 'i32', 'D': 'i32'}   # others: bf16


def ptxas_path():
    """The ptxas that ships in triton's wheel, or why there is none."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError as e:
        return None, f"triton unavailable: {e}"
    ptxas = Path(triton.__file__).parent / 'backends' / 'nvidia' / 'bin' / 'ptxas'
    return (ptxas, None) if ptxas.exists() else (None, f"triton has no nvidia backend ptxas ({ptxas} is missing)")


def ptxas_report(ptxas, fn, cc, constexprs, num_warps, num_stages):
    """fn compiled for sm_<cc> with the JIT's specialisation at the training size -> what ptxas -v says of it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = {n: 'constexpr' if n in constexprs else AOT_TYPES.get(n, '*bf16') for n in fn.arg_names}
    aligned = {(i,): [['tt.divisibility', 16]] for i, n in enumerate(fn.arg_names)
               if signature[n] not in ('constexpr', 'fp32')}
    kernel = triton.compile(ASTSource(fn, signature, constexprs, aligned), target=GPUTarget('cuda', cc, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / 'kernel.ptx'
        ptx.write_text(kernel.asm['ptx'])
        gpu = re.search(r'^\.target\s+(\w+)', kernel.asm['ptx'], re.M).group(1)   # sm_90a (wgmma), sm_100a, sm_80
        blackwell = ptxas.with_name('ptxas-blackwell')          # the wheel's ptxas for sm_100 and up, where it has one
        exe = blackwell if cc >= 100 and blackwell.exists() else ptxas
        log = subprocess.run([str(exe), '-v', f'--gpu-name={gpu}', str(ptx), '-o', str(Path(tmp) / 'kernel.cubin')],
                             capture_output=True, text=True, check=True).stderr
    number = lambda pattern: int(re.search(pattern, log).group(1))
    return dict(regs=number(r'Used (\d+) registers'), spill_stores=number(r'(\d+) bytes spill stores'),
                spill_loads=number(r'(\d+) bytes spill loads'), smem=kernel.metadata.shared,
                tensor_cores=tensor_core_instructions(kernel.asm['ptx']))


def tensor_core_instructions(ptx):
    """The tensor-core instructions in a kernel's PTX by kind and shape, counted as written (not as run): wgmma (sm_90's
    warpgroup products, 64 rows), mma.sync (a warp's 16 rows: sm_80's, and sm_90's for a product of fewer than 64
    rows) or tcgen05.mma (sm_100's, its shape in a descriptor, not in the instruction), e.g. {'wgmma m64n16k16': 24}."""
    found = [f"{'wgmma' if kind.startswith('wgmma') else 'mma.sync'} {shape}" for kind, shape in
             re.findall(r'\b(wgmma\.mma_async|mma\.sync)(?:\.\w+)*?\.(m\d+n\d+k\d+)\b', ptx)]
    return dict(Counter(found + ['tcgen05.mma'] * len(re.findall(r'\btcgen05\.mma\.', ptx))))


def aot_plan(cfg):
    """What --aot compiles: (cc, kernel name, tiles) for each architecture, at TILES' (or at each --aot_tiles entry),
    each yardstick beside the kernel it measures: the forward's tiles for the forward, the backward's for the rest (the
    ∂r_k kernel with POSITIONS_STAGES)."""
    import rel_attention_triton as rel
    plan = []
    for cc in AOT_ARCHS:
        entries = [parse_tiles(e) for e in cfg.aot_tiles.split(';')] if cfg.aot_tiles else [rel.tiles_for(cc)]
        for forward, backward in entries:
            plan += [(cc, 'flash_yardstick', forward), (cc, 'forward', forward),
                     (cc, 'flash_yardstick_keys', backward), (cc, 'backward_keys', backward),
                     (cc, 'backward_queries', backward),
                     (cc, 'backward_positions', (*backward[:3], rel.POSITIONS_STAGES))]
    return plan


def aot(cfg):
    """One JSON line per kernel and architecture (aot_plan's order)."""
    ptxas, why = ptxas_path()
    if ptxas is None:
        print(json.dumps(dict(aot='skipped', reason=why)), flush=True)
        return
    import flash_yardstick
    import rel_attention_triton as rel
    kernels = dict(flash_yardstick=flash_yardstick.flash_forward_kernel, forward=rel._forward_kernel,
                   flash_yardstick_keys=flash_yardstick.flash_backward_keys_kernel,
                   backward_keys=rel._backward_keys_kernel, backward_queries=rel._backward_queries_kernel,
                   backward_positions=rel._backward_positions_kernel)
    D = cfg.d_head
    for cc, name, (BQ, BK, num_warps, stages) in aot_plan(cfg):
        fn = kernels[name]
        shapes = dict(BQ=BQ, BK=BK, S=BK, BD=max(16, 1 << (D - 1).bit_length()), PRECISION='tf32')
        constexprs = {n: v for n, v in shapes.items() if n in fn.arg_names}
        line = dict(kernel=name, arch=f'sm_{cc}', tiles=f'{BQ},{BK},{num_warps},{stages}', D=D)
        print(json.dumps({**line, **ptxas_report(ptxas, fn, cc, constexprs, num_warps, stages)}), flush=True)


def main(argv=None):
    def go(argv):
        cfg = common.parse(argv, AttnConfig)
        if not cfg.aot:
            return run(cfg)
        if os.environ.get('TRITON_INTERPRET') == '1':   # the interpreter's kernels do not compile: a process that
            env = {n: v for n, v in os.environ.items() if n != 'TRITON_INTERPRET'}     # imports triton afresh does
            sys.stdout.flush()
            subprocess.run([sys.executable, __file__, *argv], env=env, check=True)
        else:
            aot(cfg)
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
