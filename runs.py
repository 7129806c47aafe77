"""
A training run's life outside its loop, for train.py: where it runs (device, precision, process group), its out_dir
(one run at a time, checked before the first step), checkpoints (atomic, loaded with weights_only=True, refused in
one line when they do not fit), log.jsonl (strict JSON, cut back to the checkpoint on resume), stop signals (Ctrl-C,
SIGTERM), and the few collectives that keep the ranks of a DDP run in step. Any problem a user can fix is a
UserError: one line, no traceback.
"""

import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import typing
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from configurator import RENAMED_FLAGS, UserError, available_models, import_model, renamed_fields

CKPT_FORMAT = 'nanomem-checkpoint-1'
MODEL_KEYS = ('model_name', 'model_config', 'model')                   # enough to rebuild the model (sample.py)
RESUME_KEYS = MODEL_KEYS + ('train_config', 'optimizer', 'scaler', 'step', 'data_position', 'best_val_loss',
                            'world_size', 'rng', 'memory')            # enough to continue exactly
LAST_LAMEMO_IN_XL = 'b4b2c3e'          # the last commit whose train.py loads model_xl.py --lookahead checkpoints


# -----------------------------------------------------------------------------------------------------------
# Where the run runs: device, precision, process group


def resolve_device(name):
    """'auto' -> cuda, then mps, then cpu. Returns (device, device_type)."""
    if name == 'auto':
        name = 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
    try:
        torch.device(name)
    except RuntimeError:
        raise UserError(f"--device={name} is not a torch device (auto, cpu, cuda, cuda:N or mps)") from None
    device_type = 'cuda' if name.startswith('cuda') else 'mps' if name.startswith('mps') else 'cpu'
    if device_type == 'cuda' and not torch.cuda.is_available():
        raise UserError(f"--device={name} but torch sees no CUDA device")
    return name, device_type


def resolve_dtype(dtype, device_type):
    """'auto' -> bfloat16 on CUDA (float16 where bf16 is missing), float32 elsewhere."""
    if dtype != 'auto':
        return dtype
    if device_type == 'cuda':
        return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    return 'float32'


def autocast_context(device_type, dtype):
    """One context for mixed precision, a no-op in float32."""
    if dtype == 'float32':
        return nullcontext()
    return torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))


@dataclass
class Run:
    """How and where this process runs: set up once (setup_run) and handed to every function that needs it."""
    cfg: typing.Any                    # train.py's TrainConfig
    device: str = 'cpu'
    device_type: str = 'cpu'
    dtype: str = 'float32'
    ddp: bool = False
    rank: int = 0
    world_size: int = 1

    @property
    def master(self):
        return self.rank == 0

    @property
    def ctx(self):
        """The autocast context of this run's dtype (a no-op in float32); enter a fresh one each time."""
        return autocast_context(self.device_type, self.dtype)


def setup_run(cfg):
    """The device, precision and (under torchrun) the process group."""
    ddp = int(os.environ.get('RANK', -1)) != -1
    device, device_type = resolve_device(cfg.device)
    rank, world_size = 0, 1
    if ddp:
        if device.startswith('cuda'):   # bind the process group to this rank's GPU (else NCCL's barrier guesses it)
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
            torch.cuda.set_device(device)
            torch.distributed.init_process_group(backend='nccl', device_id=torch.device(device))
        else:
            torch.distributed.init_process_group(backend='gloo')
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return Run(cfg, device, device_type, resolve_dtype(cfg.dtype, device_type), ddp, rank, world_size)


# -----------------------------------------------------------------------------------------------------------
# Checkpoints: tensors and plain Python values only, loadable with torch.load(weights_only=True)


def save_checkpoint(state, path):
    """Atomic: write a temporary file of this process in the same directory, fsync, rename it over the old
    checkpoint. A failed write (a full disk, no permission) removes the temporary file, keeps the old checkpoint
    and is one UserError line."""
    path = Path(path)
    tmp = path.with_name(f'{path.name}.{os.getpid()}.tmp')
    try:
        with open(tmp, 'wb') as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):                 # torch.save may report a full disk as RuntimeError
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:100]
            try:
                reason += f"; {shutil.disk_usage(path.parent).free / 2**30:.1f} GiB free there"
            except OSError:
                pass
            raise UserError(f"cannot write {path} ({reason}); the previous checkpoint there is kept") from None
        raise


def load_checkpoint(path, device='cpu', keys=MODEL_KEYS):
    """The checkpoint at path, with at least `keys`; anything else (not a file of ours, an older format, a part of
    one, pickled objects that would run code) is a UserError. A model_config field renamed since it was written
    (configurator.RENAMED_FLAGS) comes under its new name."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:                                    # pickled objects, truncated file, not torch at all
        raise UserError(f"{path} is not a loadable nanomem checkpoint ({type(e).__name__})")
    found = ckpt.get('format') if isinstance(ckpt, dict) else None
    if isinstance(found, str) and found.startswith('nanomem-checkpoint-') and found != CKPT_FORMAT:
        raise UserError(f"{path} is a {found} checkpoint and this nanomem reads {CKPT_FORMAT}: load it with the "
                        f"nanomem version that wrote it, or retrain")
    if found != CKPT_FORMAT:
        raise UserError(f"{path} is not a nanomem checkpoint")
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise UserError(f"{path} is incomplete: it has no {', '.join(missing)}")
    config = ckpt['model_config']
    if ckpt['model_name'] == 'xl' and isinstance(config, dict) and 'lookahead' in config:
        made = 'with --lookahead' if config['lookahead'] else 'with the old lookahead field'
        redo = 'retrain with --model=lamemo' if config['lookahead'] else 'retrain'
        raise UserError(f"{path} was made by model_xl.py {made}, before LaMemo had its own file; {redo}, or load "
                        f"it with nanomem at commit {LAST_LAMEMO_IN_XL}")
    if isinstance(config, dict):
        for name in sorted(set(config) & set(RENAMED_FLAGS)):    # written before a field was renamed: say so, in a line
            print(f"note: {path}: {name} was renamed {RENAMED_FLAGS[name]} (read under the new name)", file=sys.stderr)
        ckpt['model_config'] = renamed_fields(config)
    return ckpt


def model_from_checkpoint(ckpt, path='checkpoint', overrides=None):
    """Rebuild the model a checkpoint holds, with config fields replaced by overrides (the weights must still
    fit). -> (module, config, model)"""
    module = import_model(ckpt['model_name'])
    known = {f.name for f in dataclasses.fields(module.Config)}
    saved = dict(ckpt['model_config'])
    if 'use_sdpa' in saved and 'attn_kernel' in known:        # written before attn_kernel took its place
        saved['attn_kernel'] = 'sdpa' if saved.pop('use_sdpa') else 'einsum'
    unknown = set(saved) - known
    if unknown:
        raise UserError(f"{path} has config fields {sorted(unknown)} that model_{ckpt['model_name']}.py "
                        f"does not know (written by another version{moved_to_lab(unknown)})")
    try:
        config = module.Config(**{**saved, **(overrides or {})})
    except ValueError as e:
        raise UserError(f"{path}: {e}")
    model = module.Model(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in ckpt['model'].items()}
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    reshaped = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    if missing or unexpected or reshaped:
        problem = (f"{len(missing)} missing (e.g. {missing[0]})" if missing else
                   f"{len(unexpected)} unexpected (e.g. {unexpected[0]})" if unexpected else
                   f"{reshaped[0]} is {found[reshaped[0]]}, the model expects {expected[reshaped[0]]}")
        raise UserError(f"{path}: the weights do not fit this model_{ckpt['model_name']}.py config: {problem}")
    model.load_state_dict(ckpt['model'])
    return module, config, model


def triton_off_cuda(config, device_type):
    """Why the model's attn_kernel='triton' cannot run on this device, or None: its kernels need CUDA (on the CPU
    Triton's interpreter runs them, with TRITON_INTERPRET=1, in float32 and slowly: the tests' way)."""
    if getattr(config, 'attn_kernel', None) == 'triton' and device_type != 'cuda' \
            and os.environ.get('TRITON_INTERPRET') != '1':
        return f"attn_kernel='triton' runs on CUDA, not on {device_type} (there only with TRITON_INTERPRET=1, float32)"
    return None


def moved_to_lab(fields):
    """'; ... --model=NAME ...' where a lab/ model's Config now holds these fields (a probe that left a paper's
    model file), else ''."""
    for name in available_models():
        module = import_model(name)
        if module.__name__.startswith('lab.') and fields <= {f.name for f in dataclasses.fields(module.Config)}:
            return (f"; {', '.join(sorted(fields))} left the paper's file for lab/model_{name}.py: retrain with "
                    f"--model={name}, or load it with the commit that wrote it")
    return ''


# -----------------------------------------------------------------------------------------------------------
# The out_dir: one run at a time, never another run's checkpoint overwritten by accident


class OutDir:
    """A training run's out_dir, held until close() (or the process's end, even by kill -9): created if needed and
    checked writable before the first step, locked (flock on out_dir/lock: a second live run is refused), cleared of
    the temporary files a killed run left. A new run (init_from=scratch) into a directory that holds a checkpoint
    stops, unless overwrite says to delete it and start over."""

    def __init__(self, path, init_from, overwrite):
        import fcntl
        self.path = path = Path(path)
        if path.exists() and not path.is_dir():
            raise UserError(f"--out_dir={path} is a file, not a directory")
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.lock = open(path / 'lock', 'a')
        except OSError as e:
            raise UserError(f"cannot write to --out_dir={path}: {e.strerror}") from None
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.close()
            raise UserError(f"another run is using --out_dir={path} (it holds {path / 'lock'}); wait for it to "
                            f"end, or choose another --out_dir") from None
        for tmp in [*path.glob('ckpt*.pt*.tmp'), *path.glob('best.pt*.tmp'), *path.glob('log.jsonl*.tmp')]:
            tmp.unlink()                                               # left by a killed run (we hold the lock)
        found = [p for p in (path / 'ckpt.pt', path / 'best.pt') if p.exists()]
        if init_from == 'scratch' and found and not overwrite:
            self.close()
            raise UserError(f"{found[0]} exists: continue that run with --init_from=resume, or delete it and start "
                            f"over with --overwrite=True")
        for p in [*found, *path.glob('ckpt_*.pt')] if init_from == 'scratch' and found else []:
            p.unlink()                                                 # --overwrite=True: start over

    def close(self):
        self.lock.close()                                              # releases the flock


class JsonLog:
    """log.jsonl, one strict-JSON record a line (a NaN or inf is written as null), flushed at once; a no-op on
    ranks other than 0 (path None). Opening it drops the lines after step `resume_step`: a resumed run writes them
    again (after a kill they would be there twice), and a torn last line."""

    def __init__(self, path, resume_step=0):
        self.file = None
        if path is None:
            return
        path = Path(path)
        if path.exists():
            kept = [line + '\n' for line in path.read_text().splitlines() if _step(line) <= resume_step]
            tmp = path.with_name(f'{path.name}.{os.getpid()}.tmp')
            tmp.write_text(''.join(kept))
            os.replace(tmp, path)
        self.file = open(path, 'a')

    def __call__(self, record):
        if self.file is not None:
            self.file.write(json.dumps({k: _finite_or_none(v) for k, v in record.items()}, allow_nan=False) + '\n')
            self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()


def _step(line):
    """The step of a log line; a line that is not a JSON record (torn by a kill) counts as after every step."""
    try:
        return json.loads(line).get('step', 0)
    except (ValueError, AttributeError):
        return math.inf


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return [_finite_or_none(v) for v in value] if isinstance(value, list) else value


# -----------------------------------------------------------------------------------------------------------
# Signals and ranks


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM ask the loop to finish the current step, save and exit; a second one stops at
    once (KeyboardInterrupt(signum)). close() puts the previous handlers back (train() may run in a notebook)."""

    def __init__(self, say):
        self.received, self.say = 0, say
        self.previous = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}

    def __call__(self, signum, frame):
        if self.received:
            raise KeyboardInterrupt(signum)
        self.received = signum
        name, again = ('interrupt', 'Ctrl-C again') if signum == signal.SIGINT else ('SIGTERM', 'a second one')
        self.say(f"\n{name}: finishing this step and saving a checkpoint ({again} to stop now)")

    def close(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def max_over_ranks(value, run):
    """The largest of every rank's value, on every rank (one all_reduce under DDP): ranks agree on a decision."""
    if not run.ddp:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=run.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return type(value)(t.item())


def on_rank0(run, fn):
    """fn() on rank 0 (file work); its UserError stops every rank at the same point (no rank waits forever)."""
    result, problem = None, None
    if run.master:
        try:
            result = fn()
        except UserError as e:
            problem = e
    if max_over_ranks(int(problem is not None), run):
        raise problem or UserError("rank 0 stopped")               # train() lets rank 0 alone print it
    return result


def gather_stacked(tensor, world_size):
    """(...) on every rank -> (world_size, ...) on every rank."""
    if world_size == 1:
        return tensor[None]
    out = [torch.empty_like(tensor) for _ in range(world_size)]
    torch.distributed.all_gather(out, tensor.contiguous())
    return torch.stack(out)


def all_reduce_sum(values, device, world_size):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if world_size > 1:
        torch.distributed.all_reduce(t)
    return t.tolist()


def finish_ddp(ddp, parts=None):
    """End a DDP run: wait for every rank, drop the DDP wrapper (its reducer holds the process group, which would
    otherwise be freed during interpreter exit, when gloo's threads may abort the process), then destroy the group."""
    if ddp:
        torch.distributed.barrier()                              # rank 0 may still be writing the checkpoint
        if parts is not None:
            parts.model = parts.raw_model
            import gc
            gc.collect()
        torch.distributed.destroy_process_group()
