"""
Train any nanomem model on a prepared token dataset, one segment after another with the memory carried.

    python train.py --model=xl --dataset=gutenberg                     # defaults below, flags override them
    python train.py config/xl_wt103.py --compile=True                  # a config file, then flags
    python train.py config/xl_demo.py --init_from=resume               # continue exactly where it stopped
    python train.py --model=gpt2 --init_from=gpt2                      # start from OpenAI's GPT-2 (pretrained.py)
    torchrun --nproc_per_node=8 train.py config/xl_pg19.py             # DDP: each rank its own streams

Flags are the fields of TrainConfig below plus the fields of the chosen model's Config (model_<name>.py).
Config files hold `name = literal` lines only. An unknown or mistyped flag is an error (configurator.py).

Read it in this order:
    TrainConfig   every flag, its default and what it does;
    train()       claims the out_dir, builds the model (or the checkpoint's), loads the data, then calls fit();
    fit()         the loop: train_step() after train_step(), a log line every log_interval steps, evaluate() and a
                  checkpoint every eval_interval; Ctrl-C or SIGTERM saves and stops (exit status 130 or 143);
    train_step()  one optimizer step: micro-batches of bptt_segments segments each, the memory carried, detached;
    evaluate()    streams the eval split with the memory carried: loss, ppl, word ppl, bpc or bpb.
The helpers they call follow them (memory, model and data, checkpoint contents, optimizer, MFU). Where the run
runs (device, precision, process group), its files (out_dir lock, checkpoints, log.jsonl), the stop signals and
the ranks' agreement: runs.py.

The data are read as Transformer-XL's ordered iterator does (data/loader.py): the token file is cut into
n_streams contiguous streams (batch_size rows x gradient_accumulation_steps micro-batches x world_size ranks), each
read one segment of seg_len tokens after another, so a row's memory always holds the text just before its current
segment.
"""

import dataclasses
import json
import math
import signal
import sys
import time
import typing
from contextlib import nullcontext
from dataclasses import dataclass, asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import configurator
import pretrained
from configurator import REPO, UserError, available_models, import_model, read_config_file, run_cli  # noqa: F401
from data.loader import (EvalSet, StreamLoader, data_tokenizer, eval_set, eval_stream_bounds,  # noqa: F401
                         load_meta, load_split, vocab_from_data)
from runs import (CKPT_FORMAT, MODEL_KEYS, RESUME_KEYS, JsonLog, OutDir, Run, StopSignals,  # noqa: F401
                  all_reduce_sum, autocast_context, finish_ddp, gather_stacked, load_checkpoint, max_over_ranks,
                  model_from_checkpoint, on_rank0, resolve_device, resolve_dtype, save_checkpoint, setup_run,
                  triton_off_cuda)


@dataclass
class TrainConfig:
    # what to train, on what, and where it goes
    model: str = 'xl'                  # model_<model>.py: xl, lamemo, compressive, infini, infformer; gpt2 and its
                                       # memory forms infformer_gpt2, compressive_gpt2, infini_gpt2; or lab/'s
    dataset: str = 'gutenberg'         # data/<dataset>/ made by data/<dataset>/prepare.py
    data_dir: str = ''                 # '' = data/<dataset>
    out_dir: str = 'out'               # ckpt.pt (last), best.pt, log.jsonl
    init_from: str = 'scratch'         # 'scratch', 'resume' (from out_dir/ckpt.pt), or GPT-2's weights for a GPT-2
                                       # form (--model=gpt2, ...): gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2:DIR
    overwrite: bool = False            # scratch into an out_dir that holds a checkpoint: delete it and start over
    # batch: tokens per optimizer step = world_size * gradient_accumulation_steps * batch_size * bptt_segments * seg_len
    batch_size: int = 8                # streams per micro-batch (per GPU)
    gradient_accumulation_steps: int = 1  # micro-batches per step, each with its own streams and memories
    bptt_segments: int = 1             # segments whose graph is kept before backward (then the memory is detached)
    reset_at_doc: bool = False         # empty a row's memory when its next segment starts a new document
    reset_every: int = 0               # empty every memory each k segments, in training and evaluation (Infini-
                                       # attention's paper: each input of 16 segments starts fresh); 0 = never
    # AdamW with linear warmup and cosine decay (the paper: Adam, lr 2.5e-4, cosine to 0, clip 0.25)
    learning_rate: float = 2.5e-4
    min_lr: float = 0.0
    max_iters: int = 200000
    warmup_iters: int = 0
    lr_decay_iters: int = 0            # 0 = max_iters
    weight_decay: float = 0.0          # on weight matrices only (not biases, norms, u/v)
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 0.25            # 0 = off
    # evaluation: streams the split with memory carried (Transformer-XL evaluates with a longer memory)
    eval_interval: int = 4000          # also the checkpoint interval
    eval_split: str = 'validation'
    eval_tokens: int = 0               # 0 = the whole split
    eval_batch_size: int = 0           # streams during eval; 0 = batch_size
    eval_seg_len: int = 0              # 0 = seg_len
    eval_mem_len: int = -1             # -1 = mem_len (the model's own memory length)
    eval_only: bool = False            # evaluate the checkpoint in out_dir and exit
    eval_reset_memory: bool = False    # empty the memory before every eval segment (how much does it carry?)
    always_save_checkpoint: bool = True  # save at every eval, not only when the validation loss improves
    keep_checkpoints: bool = False     # also keep every eval's checkpoint as ckpt_STEP.pt (loss against steps)
    log_interval: int = 10             # steps between log.jsonl lines
    # system
    device: str = 'auto'               # auto = cuda, then mps, then cpu
    dtype: str = 'auto'                # auto = bfloat16 on CUDA (float16 where bf16 is missing), float32 elsewhere
    compile: typing.Optional[bool] = None  # torch.compile; None = on for CUDA
    compile_mode: str = 'default'      # reduce-overhead: each compiled graph replayed as a CUDA graph, one launch for
                                       # hundreds of kernels (a host-bound step); on a CPU the same as default
    compile_blocks: bool = False       # compile each layer block, not the unrolled model: identical blocks compile
                                       # once (a shorter first step); the code between blocks runs eager
    seed: int = 1337

    def __post_init__(self):
        positive = ('batch_size', 'gradient_accumulation_steps', 'bptt_segments', 'max_iters', 'eval_interval',
                    'log_interval')
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ('warmup_iters', 'lr_decay_iters', 'eval_tokens', 'eval_batch_size', 'eval_seg_len',
                     'reset_every'):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ('learning_rate', 'min_lr', 'weight_decay', 'grad_clip'):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.eval_mem_len < -1:
            raise ValueError(f"eval_mem_len must be >= 0 (or -1 for mem_len), got {self.eval_mem_len}")
        pretrained.check_init_from(self.init_from)
        if self.overwrite and self.init_from == 'resume':
            raise ValueError("overwrite=True starts over: it goes with init_from=scratch, not resume")
        if self.dtype not in ('auto', 'float32', 'bfloat16', 'float16'):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.eval_split not in ('train', 'validation', 'test'):
            raise ValueError(f"eval_split must be train, validation or test, got {self.eval_split!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        if self.compile is False and (self.compile_mode != 'default' or self.compile_blocks):
            raise ValueError("compile_mode and compile_blocks choose how to compile: they need --compile=True")


COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')


def parse_args(argv, train_cls=TrainConfig, allow_model_fields=True):
    """configurator.parse_args with train.py's TrainConfig by default."""
    return configurator.parse_args(argv, train_cls, allow_model_fields)


def train(argv):
    """Train (or with --eval_only, evaluate) as the flags say; returns a small summary dict."""
    cfg, module, model_cfg, given = parse_args(argv)
    run = setup_run(cfg)
    out_dir = None
    try:
        if not cfg.eval_only:                          # checked and locked before anything is built or trained
            out_dir = on_rank0(run, lambda: OutDir(cfg.out_dir, 'resume' if cfg.init_from == 'resume' else 'scratch',
                                                   cfg.overwrite))
        torch.manual_seed(cfg.seed + run.rank)
        data_dir = Path(cfg.data_dir or REPO / 'data' / cfg.dataset)
        meta = load_meta(data_dir)
        tokenizer = data_tokenizer(meta)
        model_cfg = vocab_from_data(model_cfg, given, tokenizer)
        model_cfg, model, ckpt = build_model(cfg, module, model_cfg, given, tokenizer, data_dir, run.device,
                                             run.master)
        if triton_off_cuda(model_cfg, run.device_type):
            raise UserError(f"{triton_off_cuda(model_cfg, run.device_type)}: use --attn_kernel=sdpa or einsum")
        loaders, evalset = load_data(run, model_cfg, data_dir, meta, tokenizer)
        raw_model = model.to(run.device)
        parts = Parts(raw_model, raw_model, configure_optimizer(raw_model, cfg, run.device_type),
                      torch.amp.GradScaler(run.device_type, enabled=(run.dtype == 'float16')))
        state = TrainState(memories=[raw_model.init_memory(cfg.batch_size, run.device) for _ in loaders])
        if ckpt is not None and not cfg.eval_only:
            restore(ckpt, run, parts, state)
        elif ckpt is not None:
            state.step = ckpt['step']                            # --eval_only: report which step was evaluated
        ckpt = None                                              # free it
        if cfg.eval_only:
            result = evaluate(raw_model, evalset, run, model_cfg)
            if run.master:
                print(json.dumps(eval_record(cfg, state.step, result)))
            finish_ddp(run.ddp)
            return result
        if cfg.compile is None:                                  # on for CUDA, or where a flag says how to compile
            cfg.compile = run.device_type == 'cuda' or cfg.compile_mode != 'default' or cfg.compile_blocks
        if cfg.compile:
            parts.model = compile_model(parts.model, cfg.compile_mode, cfg.compile_blocks)
        if run.ddp:
            parts.model = torch.nn.parallel.DistributedDataParallel(
                parts.model, device_ids=[int(run.device.split(':')[1])] if run.device_type == 'cuda' else None)
        return fit(run, model_cfg, parts, loaders, evalset, state, tokenizer)
    except UserError:
        if not run.master:
            sys.exit(2)                                          # every rank stops; rank 0 says why, once
        raise
    finally:
        if out_dir is not None:
            out_dir.close()                                      # the lock: another run may use out_dir now


def fit(run, model_cfg, parts, loaders, evalset, state, tokenizer):
    """The training loop: steps, log lines, evaluations and checkpoints until max_iters, or until a stop signal
    (Ctrl-C, SIGTERM) reaches any rank: then every rank stops after the same step, and that step is saved.
    -> {'step', 'best_val_loss', 'stopped_by': the signal's number, 0 if none}"""
    from tqdm import tqdm
    cfg, out_dir = run.cfg, Path(run.cfg.out_dir)
    say = tqdm.write if run.master else (lambda *a, **k: None)  # prints above the progress bar
    log = JsonLog(out_dir / 'log.jsonl' if run.master else None, resume_step=state.step)

    def save(is_best, keep=False):
        """Every rank gives its memories and RNG states; rank 0 writes. Non-finite weights are never saved."""
        if not all(torch.isfinite(p).all() for p in parts.raw_model.parameters()):
            raise UserError(f"the weights are not finite after step {state.step}: not saved. {last_good(state, cfg)}"
                            f" (try a lower learning_rate or --dtype=float32)")
        ckpt = checkpoint_state(run, model_cfg, parts, state, tokenizer)

        def write():
            save_checkpoint(ckpt, out_dir / 'ckpt.pt')
            if is_best:
                save_checkpoint(ckpt, out_dir / 'best.pt')
            if keep:
                save_checkpoint(ckpt, out_dir / f'ckpt_{state.step}.pt')
        on_rank0(run, write)
        state.saved_step = state.step

    tokens_per_step = run.world_size * len(loaders) * cfg.batch_size * cfg.bptt_segments * model_cfg.seg_len
    flops_per_token = announce(run, model_cfg, parts.raw_model, loaders, say)
    peak = peak_flops(run.device_type)
    signals = StopSignals(say)
    bar = tqdm(total=cfg.max_iters, initial=state.step, disable=not run.master, dynamic_ncols=True,
               mininterval=1.0 if sys.stderr.isatty() else 30.0)
    aux_meter = AuxMeter()
    stopped_by = 0
    try:
        parts.model.train()
        t0 = time.time()
        while state.step < cfg.max_iters:
            lr = get_lr(state.step, cfg)
            for group in parts.optimizer.param_groups:
                group['lr'] = lr * group['lr_mult']
            loss = train_step(run, parts, loaders, state, aux_meter)
            tokens_per_sec = tokens_per_step / (time.time() - t0)
            t0 = time.time()
            mfu = flops_per_token * tokens_per_sec / (peak * run.world_size) if peak else None
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_sec:,.0f}",
                            **({'mfu': f"{100 * mfu:.1f}%"} if mfu else {}), refresh=False)
            if state.step % cfg.log_interval == 0:
                log({'step': state.step, 'train/loss': loss, 'lr': lr, 'tokens_per_sec': tokens_per_sec,
                     'tokens': state.step * tokens_per_step, **aux_meter.pop(), **({'mfu': mfu} if mfu else {})})
            stopped_by = max_over_ranks(signals.received, run)       # every rank stops after the same step
            if stopped_by:
                save(is_best=False)
                say(f"saved {out_dir / 'ckpt.pt'} at step {state.step}; continue with --init_from=resume")
                break
            if state.step % cfg.eval_interval == 0 or state.step == cfg.max_iters:
                result = evaluate(parts.raw_model, evalset, run, model_cfg)
                say(f"step {state.step}: {cfg.eval_split} {eval_summary(result)}")
                log(eval_record(cfg, state.step, result))
                if not math.isfinite(result['loss']):
                    raise UserError(f"{cfg.eval_split} loss is {result['loss']} at step {state.step}: not saved. "
                                    f"{last_good(state, cfg)} (try a lower learning_rate or --dtype=float32)")
                is_best = result['loss'] < state.best_val_loss
                state.best_val_loss = min(state.best_val_loss, result['loss'])
                if cfg.always_save_checkpoint or is_best or cfg.keep_checkpoints:
                    save(is_best, keep=cfg.keep_checkpoints)
                t0 = time.time()                                  # do not count eval time as training time
    finally:
        bar.close()
        signals.close()
        log.close()
    best = f"{state.best_val_loss:.4f}" if math.isfinite(state.best_val_loss) else "none yet (no evaluation)"
    say(f"done: step {state.step}, best {cfg.eval_split} loss {best}, checkpoint in {out_dir}")
    finish_ddp(run.ddp, parts)
    return {'step': state.step, 'best_val_loss': state.best_val_loss, 'stopped_by': stopped_by}


def train_step(run, parts, loaders, state, aux_meter):
    """One optimizer step: every micro-batch reads bptt_segments segments with the graph kept, backpropagates,
    and detaches its memory (truncated backprop through time). Returns the mean loss; a NaN/inf loss stops the
    run before the update."""
    cfg, model, raw_model, device = run.cfg, parts.model, parts.raw_model, run.device
    G = len(loaders)
    loss_sum = 0.0
    graphs = cuda_graphs(cfg)
    if graphs:                                                 # a new step: the last step's graph outputs may be
        torch.compiler.cudagraph_mark_step_begin()             # overwritten (its memory was copied out of them)
    for g in range(G):
        sync = not run.ddp or g == G - 1                           # all-reduce gradients on the last micro-batch only
        with (nullcontext() if sync else model.no_sync()):
            total = 0.0
            for s in range(cfg.bptt_segments):
                x, y, reset = loaders[g].get(state.position + s)
                if reset.any():
                    state.memories[g] = raw_model.reset_memory(state.memories[g], reset.to(device))
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with run.ctx:
                    _, loss, state.memories[g], aux = model(x, state.memories[g], y)
                total = total + loss
                aux_meter.add(aux)
            total = total / (G * cfg.bptt_segments)
            parts.scaler.scale(total).backward()
            state.memories[g] = detach_memory(state.memories[g], copy=graphs)
            loss_sum += total.detach()
    if run.ddp:                                                # the mean over ranks: every rank sees a NaN
        torch.distributed.all_reduce(loss_sum)
        loss_sum /= run.world_size
    loss_value = float(loss_sum)
    if not math.isfinite(loss_value):
        raise UserError(f"loss is {loss_value} at step {state.step + 1}: stopping before the update. "
                        f"{last_good(state, cfg)} (try a lower learning_rate or --dtype=float32)")
    if cfg.grad_clip > 0:
        parts.scaler.unscale_(parts.optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    state.position += cfg.bptt_segments
    return loss_value


def force_eager():
    """torch.compiler.set_stance('force_eager') once torch.compile has been used (torch._dynamo is loaded); before,
    nothing is compiled, and importing torch._dynamo only to say so costs every process ~1.5 s."""
    return torch.compiler.set_stance('force_eager') if 'torch._dynamo' in sys.modules else nullcontext()


@torch.no_grad()
def evaluate(model, evalset, run, model_cfg):
    with force_eager():                                        # the raw model, uncompiled, even where --compile_blocks
        return _evaluate(model, evalset, run, model_cfg)       # compiled its blocks in place


def _evaluate(model, evalset, run, model_cfg):
    """Stream the split (or its first eval_tokens + 1 tokens) through the model with memory carried.
    Returns {'loss', 'ppl', 'tokens'}; 'word_ppl' (total NLL / words) when the whole split was read; and where the
    tokenizer is known, 'bpc' or 'bpb': total NLL in bits / bytes of the text the predicted tokens spell."""
    cfg, device, rank, world_size = run.cfg, run.device, run.rank, run.world_size
    data = evalset.data
    lengths = None if evalset.byte_lengths is None else torch.as_tensor(evalset.byte_lengths, device=device)
    n_tokens = len(data) if cfg.eval_tokens == 0 else min(len(data), cfg.eval_tokens + 1)
    B = cfg.eval_batch_size or cfg.batch_size
    T = cfg.eval_seg_len or model_cfg.seg_len
    M = None if cfg.eval_mem_len == -1 else cfg.eval_mem_len
    starts, ends = eval_stream_bounds(n_tokens, B * world_size)
    starts, ends = starts[rank * B:(rank + 1) * B], ends[rank * B:(rank + 1) * B]
    was_training = model.training
    model.eval()
    memory = model.init_memory(B, device) if M is None else model.init_memory(B, device, mem_len=M)
    nll, count, n_bytes = 0.0, 0, 0
    n_steps = int(math.ceil((ends - starts).max() / T)) if len(starts) else 0
    from tqdm import tqdm
    for s in tqdm(range(n_steps), desc=f'eval {cfg.eval_split}', unit='seg', leave=False, dynamic_ncols=True,
                  disable=rank != 0 or n_steps < 50, mininterval=1.0 if sys.stderr.isatty() else 30.0):
        x = torch.zeros(B, T, dtype=torch.long)
        y = torch.full((B, T), -1, dtype=torch.long)
        for b in range(B):
            a = starts[b] + s * T
            n = max(0, min(T, ends[b] - a))
            if n:
                x[b, :n] = torch.from_numpy(data[a:a + n].astype(np.int64))
                y[b, :n] = torch.from_numpy(data[a + 1:a + 1 + n].astype(np.int64))
        x, y = x.to(device), y.to(device)
        if cfg.eval_reset_memory or (cfg.reset_every and s and s % cfg.reset_every == 0):
            memory = model.reset_memory(memory, torch.ones(B, dtype=torch.bool, device=device))
        with run.ctx:
            logits, _, memory, _ = model(x, memory)
        nll += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1),
                               ignore_index=-1, reduction='sum').item()
        count += int((y != -1).sum())
        if lengths is not None:
            n_bytes += int(lengths[y[y != -1]].sum())
    model.train(was_training)
    nll, count, n_bytes = all_reduce_sum([nll, count, n_bytes], device, world_size)
    if count == 0:
        raise UserError(f"nothing to evaluate: the {cfg.eval_split} split has {len(data)} tokens")
    out = {'loss': nll / count, 'ppl': math.exp(min(nll / count, 700)), 'tokens': int(count)}
    if evalset.words and n_tokens == len(data):
        out['word_ppl'] = math.exp(min(nll / evalset.words, 700))
    if n_bytes > 0:
        out[evalset.unit] = nll / math.log(2) / n_bytes
    return out


# -----------------------------------------------------------------------------------------------------------
# Memory helpers: any dataclass of tensors, no model-specific code


def memory_to_dict(memory):
    return {f.name: getattr(memory, f.name) for f in dataclasses.fields(memory)}


def memory_from_dict(template, values):
    return dataclasses.replace(template, **{k: v.to(getattr(template, k).device) for k, v in values.items()})


def detach_memory(memory, copy=False):
    """The memory without its graph; copy: in new tensors (out of a CUDA graph's buffers, which its next replay
    overwrites)."""
    return dataclasses.replace(memory, **{k: v.detach().clone() if copy else v.detach()
                                          for k, v in memory_to_dict(memory).items()})


# -----------------------------------------------------------------------------------------------------------
# What a step updates, what it reads, where it starts


@dataclass
class Parts:
    """What a training step updates: the model forward runs through (compiled and/or DDP-wrapped), the model
    itself, the optimizer and the fp16 grad scaler."""
    model: torch.nn.Module
    raw_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler


RUNTIME_FIELDS = ('attn_kernel',)   # how the attention is computed, not what: a resume may change them


def build_model(cfg, module, model_cfg, given, tokenizer, data_dir, device, master=True):
    """The model to train: a fresh one, GPT-2's weights (--init_from=gpt2..., also with --eval_only), or
    (--init_from=resume, --eval_only) the checkpoint's. On resume the architecture comes from the checkpoint and flags
    may not contradict it, RUNTIME_FIELDS aside; --eval_only may change model flags that keep the weights (clamp_len,
    same_length, mem_len, ...). -> (model_cfg, model, checkpoint or None)"""
    if pretrained.is_gpt2(cfg.init_from):
        model_cfg, model, note, _ = pretrained.init_from_gpt2(cfg.init_from, cfg.model, module, model_cfg, given,
                                                              tokenizer and tokenizer.name, data_dir)
        if master:
            print(note, file=sys.stderr)                         # stdout: --eval_only's JSON
        return model_cfg, model, None
    if cfg.init_from != 'resume' and not cfg.eval_only:
        return model_cfg, module.Model(model_cfg), None
    path = Path(cfg.out_dir) / 'ckpt.pt'
    ckpt = load_checkpoint(path, device, keys=MODEL_KEYS + ('step',) if cfg.eval_only else RESUME_KEYS)
    if ckpt['model_name'] != cfg.model:
        raise UserError(f"{path} holds a {ckpt['model_name']!r} model, not --model={cfg.model}")
    if tokenizer is not None and ckpt.get('tokenizer', tokenizer.describe()) != tokenizer.describe():
        raise UserError(f"{path} was trained on {ckpt['tokenizer']['tokenizer']} tokens, but {data_dir} holds "
                        f"{tokenizer.name} tokens")
    saved = ckpt['model_config']
    clash = [k for k in given if k in saved and saved[k] != getattr(model_cfg, k) and k not in RUNTIME_FIELDS]
    if clash and not cfg.eval_only:
        k = clash[0]
        raise UserError(f"--{k}={getattr(model_cfg, k)} contradicts the checkpoint ({k}={saved[k]}); "
                        f"the architecture is fixed on resume")
    changed = clash + [k for k in given if k in RUNTIME_FIELDS]
    _, model_cfg, model = model_from_checkpoint(ckpt, path, {k: getattr(model_cfg, k) for k in changed})
    return model_cfg, model, ckpt


def load_data(run, model_cfg, data_dir, meta, tokenizer):
    """This rank's StreamLoaders over the train split (one per micro-batch) and the EvalSet of the eval split."""
    cfg = run.cfg
    train_data = load_split(data_dir, 'train')
    eval_data = load_split(data_dir, cfg.eval_split)
    if meta.get('vocab_size', 0) > model_cfg.vocab_size:
        raise UserError(f"the data's vocabulary ({meta['vocab_size']}) is larger than "
                        f"vocab_size={model_cfg.vocab_size}")
    doc_starts = None
    if cfg.reset_at_doc:
        docs_path = data_dir / 'train_docs.npy'
        if not docs_path.exists():
            raise UserError(f"--reset_at_doc=True needs {docs_path} (made by the dataset's prepare.py)")
        doc_starts = np.load(docs_path)
    G, B = cfg.gradient_accumulation_steps, cfg.batch_size
    n_streams = run.world_size * G * B
    loaders = [StreamLoader(train_data, n_streams, (run.rank * G + g) * B, B, model_cfg.seg_len, doc_starts,
                            cfg.reset_every) for g in range(G)]
    return loaders, eval_set(eval_data, meta, cfg.eval_split, tokenizer)


@dataclass
class TrainState:
    """What a checkpoint restores besides the weights, the optimizer and the grad scaler."""
    step: int = 0
    position: int = 0                  # segments read by every stream
    best_val_loss: float = float('inf')
    memories: list = None              # one Memory per micro-batch
    saved_step: typing.Optional[int] = None  # step of the checkpoint in out_dir (None: there is none yet)


# -----------------------------------------------------------------------------------------------------------
# Checkpoint contents (the files themselves: runs.py)


def restore(ckpt, run, parts, state):
    """Continue exactly where the checkpoint stopped: optimizer, scaler, position, memories, RNG."""
    cfg, rank = run.cfg, run.rank
    layout = (ckpt['world_size'], ckpt['train_config']['gradient_accumulation_steps'],
              ckpt['train_config']['batch_size'])
    if layout != (run.world_size, cfg.gradient_accumulation_steps, cfg.batch_size):
        raise UserError(f"the checkpoint's streams were world_size, gradient_accumulation_steps, batch_size = "
                        f"{layout}; resume with the same values (now "
                        f"{(run.world_size, cfg.gradient_accumulation_steps, cfg.batch_size)})")
    parts.optimizer.load_state_dict(ckpt['optimizer'])
    parts.scaler.load_state_dict(ckpt['scaler'])
    state.step, state.position, state.best_val_loss = ckpt['step'], ckpt['data_position'], ckpt['best_val_loss']
    state.memories = [memory_from_dict(m, {k: v[rank] for k, v in stored.items()})
                      for m, stored in zip(state.memories, ckpt['memory'])]
    state.saved_step = ckpt['step']
    torch.set_rng_state(ckpt['rng']['cpu'][rank].cpu().clone())   # a copy: a row of the stacked tensor is refused
    if run.device_type == 'cuda' and 'cuda' in ckpt['rng']:
        torch.cuda.set_rng_state(ckpt['rng']['cuda'][rank].cpu().clone())


def checkpoint_state(run, model_cfg, parts, state, tokenizer=None):
    """Everything to continue exactly, as tensors and plain values, and the tokenizer sample.py decodes with.
    Collective under DDP: every rank calls it (memories and RNG states are gathered from all ranks)."""
    cfg, device, world_size = run.cfg, run.device, run.world_size
    rng = {'cpu': gather_stacked(torch.get_rng_state().to(device), world_size).cpu()}
    if run.device_type == 'cuda':
        rng['cuda'] = gather_stacked(torch.cuda.get_rng_state().to(device), world_size).cpu()
    return {
        'format': CKPT_FORMAT,
        'model_name': cfg.model,
        'model_config': asdict(model_cfg),
        'train_config': asdict(cfg),
        'model': parts.raw_model.state_dict(),
        'optimizer': parts.optimizer.state_dict(),
        'scaler': parts.scaler.state_dict(),
        'step': state.step,
        'data_position': state.position,
        'best_val_loss': state.best_val_loss,
        'world_size': world_size,
        'rng': rng,
        'memory': [{k: gather_stacked(v, world_size).cpu() for k, v in memory_to_dict(m).items()}
                   for m in state.memories],
        **({'tokenizer': tokenizer.describe()} if tokenizer is not None else {}),
    }


def last_good(state, cfg):
    """Where a run that went wrong can go back to: the checkpoint this run saved or resumed from, if any."""
    path = Path(cfg.out_dir) / 'ckpt.pt'
    if state.saved_step is None:
        return f"No checkpoint was written yet ({path})"
    return f"The last good checkpoint is {path} (step {state.saved_step})"


# -----------------------------------------------------------------------------------------------------------
# Compiling


def compile_model(model, mode='default', blocks=False, **options):
    """torch.compile the whole model (the default), or with blocks=True each of model.layers in place: identical
    blocks then share one compiled graph, so 16 layers compile as fast as one (the unrolled model traces and lowers
    every layer), while the code between the blocks (memory keys and values, updates, the output layer) runs eager.
    options go to torch.compile (tests pass backend=). -> what the training step calls"""
    kw = dict(options, **({} if mode == 'default' else {'mode': mode}))
    if not blocks:
        return torch.compile(model, **kw)
    if not isinstance(getattr(model, 'layers', None), torch.nn.ModuleList):
        raise UserError(f"--compile_blocks=True compiles model.layers, which {type(model).__name__} does not have")
    for block in model.layers:
        block.compile(**kw)
    return model


def cuda_graphs(cfg):
    """Whether the compiled step replays as CUDA graphs (--compile_mode=reduce-overhead or max-autotune; inductor
    skips them on a CPU, where what train_step does for them changes nothing). One optimizer step is one generation of
    graphs: it starts with torch.compiler.cudagraph_mark_step_begin(), its bptt_segments forwards and backwards (and
    micro-batches) run inside it, and the memory it carries to the next step is copied out of the graphs' buffers,
    which the next step's replay overwrites."""
    return bool(cfg.compile) and cfg.compile_mode in ('reduce-overhead', 'max-autotune')


# -----------------------------------------------------------------------------------------------------------
# Optimizer, schedule, what is logged


def configure_optimizer(model, cfg, device_type):
    """AdamW. Weight decay on weight matrices only; a model may declare lr multipliers with
    model.lr_multipliers() -> {parameter name: multiplier} (e.g. a gate that should learn faster)."""
    multipliers = model.lr_multipliers() if hasattr(model, 'lr_multipliers') else {}
    unknown = set(multipliers) - {n for n, _ in model.named_parameters()}
    assert not unknown, f"lr_multipliers names unknown parameters {unknown}"
    groups = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decay = p.dim() >= 2 and not name.endswith('bias')         # r_w_bias / r_r_bias (u, v) are not decayed
        key = (decay, multipliers.get(name, 1.0))
        groups.setdefault(key, []).append(p)
    param_groups = [{'params': ps, 'weight_decay': cfg.weight_decay if decay else 0.0, 'lr_mult': mult}
                    for (decay, mult), ps in sorted(groups.items())]
    fused = device_type == 'cuda'
    return torch.optim.AdamW(param_groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), fused=fused)


def get_lr(step, cfg):
    """Linear warmup, then cosine decay from learning_rate to min_lr over lr_decay_iters."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    if step >= decay_iters:
        return cfg.min_lr
    ratio = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


# bf16 dense tensor-core peak FLOP/s, for MFU (fp16 is the same on these parts)
PEAK_FLOPS = {'H200': 989e12, 'H100': 989e12, 'A100': 312e12, 'A10G': 125e12, 'L40S': 362e12, 'L4': 121e12,
              'RTX 4090': 165e12, 'RTX 3090': 71e12, 'V100': 125e12, 'T4': 65e12}


def peak_flops(device_type):
    if device_type != 'cuda':
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


class AuxMeter:
    """Means of the model's aux values (floats, or tensors such as a gate per head) between two log lines."""

    def __init__(self):
        self.sums, self.count = {}, 0

    def add(self, aux):
        for k, v in aux.items():
            v = v.detach().float() if torch.is_tensor(v) else float(v)
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.count += 1

    def pop(self):
        """{'train/name': mean} (a list for a vector), and start over."""
        out = {}
        for k, v in self.sums.items():
            v = v / self.count
            out[f'train/{k}'] = v.flatten().tolist() if torch.is_tensor(v) and v.numel() > 1 else float(v)
        self.sums, self.count = {}, 0
        return out


def eval_record(cfg, step, result):
    return {'step': step, **{f'{cfg.eval_split}/{k}': v for k, v in result.items()}}


def eval_summary(result):
    """'loss 1.0234, ppl 2.78, bpc 1.4765 (1,000 tokens)': the eval line, with what the result holds."""
    extra = ''.join(f", {k.replace('_', ' ')} {result[k]:{f}}" for k, f in
                    (('word_ppl', '.2f'), ('bpc', '.4f'), ('bpb', '.4f')) if k in result)
    return f"loss {result['loss']:.4f}, ppl {result['ppl']:.2f}{extra} ({result['tokens']:,} tokens)"


def announce(run, model_cfg, model, loaders, say):
    """Print the model and the batch once; return the training FLOPs per token (for MFU)."""
    cfg, world_size = run.cfg, run.world_size
    n_params = model.num_params() if hasattr(model, 'num_params') else sum(p.numel() for p in model.parameters())
    G, B, T = len(loaders), cfg.batch_size, model_cfg.seg_len
    say(f"model {cfg.model}: {n_params / 1e6:.2f}M parameters | device {run.device} {run.dtype}"
        f"{' compiled' if cfg.compile else ''} | world {world_size}")
    say(f"tokens per step: {world_size * G * B * cfg.bptt_segments * T:,} = {world_size} ranks x {G} micro x "
        f"{B} streams x {cfg.bptt_segments} segments x {T} | data: {len(loaders[0].data):,} train tokens, "
        f"{loaders[0].n_segments:,} segments per stream per epoch")
    return model.flops_per_token() if hasattr(model, 'flops_per_token') else 6 * n_params


def main(argv=None):
    """The command line. Exit status: 0 when done; 2 for a user error (one `error:` line); 128 + the signal's number
    (130 for Ctrl-C, 143 for SIGTERM) when a signal stopped the run: saved, continue with --init_from=resume. A second
    signal, or one before training starts, stops at once without saving, in one line and with the same status."""
    summary = {}
    try:
        run_cli(lambda args: summary.update(train(args)), argv)
    except KeyboardInterrupt as e:
        signum = e.args[0] if e.args else signal.SIGINT
        print(f"{signal.Signals(signum).name}: stopped at once, without saving (the checkpoints in out_dir are kept)",
              file=sys.stderr)
        sys.exit(128 + signum)
    if summary.get('stopped_by'):
        sys.exit(128 + summary['stopped_by'])


if __name__ == '__main__':
    main()
