"""
Everything train.py and sample.py offer, with every model file (tests/_models.py lists one tiny configuration per
model variant): bit-exact resume with the memory in the checkpoint, torch.compile compiling once while the memory
fills (and compresses, refreshes, writes its long-term memory...), bf16 autocast, 2-process gloo DDP, sample.py
from a checkpoint with a prompt several segments long, and the generic memory contract (reset, fixed shapes) that
train.py relies on. A variant whose model file is not in the repository is skipped.
"""
import dataclasses
import math

import numpy as np
import pytest
import torch

import train
from _models import MEMORYLESS, TINY_MODELS
from _train_util import (ROOT, TEXT, assert_identical, flags, load, make_pattern_dataset, pattern_tokens, read_log,
                         run_python, write_dataset)


def variant(name):
    """(model module, tiny flags) of a variant; skipped when its model file does not exist."""
    values = dict(TINY_MODELS[name])
    if not (ROOT / f"model_{values['model']}.py").exists():
        pytest.skip(f"model_{values['model']}.py is not in the repository")
    module = train.import_model(values['model'])
    unknown = set(values) - {'model'} - {f.name for f in dataclasses.fields(module.Config)}
    assert not unknown, f"tests/_models.py gives {name} fields its Config does not have: {sorted(unknown)}"
    return module, values


def with_fields(module, values, **extra):
    """values plus those of extra that the model's Config has (dropatt, init_std, ... are not in every model)."""
    known = {f.name for f in dataclasses.fields(module.Config)}
    return {**values, **{k: v for k, v in extra.items() if k in known}}


VARIANTS = list(TINY_MODELS)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return make_pattern_dataset(tmp_path_factory.mktemp('data'), n_train=4000, n_eval=300)


def comparable(ckpt):
    return {k: v for k, v in ckpt.items() if k != 'train_config'}


# -----------------------------------------------------------------------------------------------------------
# The memory contract train.py relies on (save / restore / detach / reset any Memory dataclass of tensors)


def fill(model, memory, n_segments, batch_size=2, seed=0):
    """memory after reading n_segments random segments of batch_size rows."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_segments):
        idx = torch.randint(0, model.config.vocab_size, (batch_size, model.config.seg_len), generator=g)
        _, _, memory, _ = model(idx, memory)
    return memory


@pytest.mark.parametrize('name', VARIANTS)
def test_memory_is_fixed_shape_float_or_int_tensors(name):
    """Every Memory field is a tensor whose shape, dtype and strides stay what init_memory made, however many
    segments have been read (compile guards on all three); no bool fields (gloo all_gathers them)."""
    module, values = variant(name)
    torch.manual_seed(0)
    model = module.Model(module.Config(**{k: v for k, v in values.items() if k != 'model'})).eval()
    fresh = model.init_memory(2, 'cpu')
    layout = {k: (v.shape, v.dtype, v.stride()) for k, v in train.memory_to_dict(fresh).items()}
    assert layout
    with torch.no_grad():
        for n in (1, 5):
            memory = fill(model, model.init_memory(2, 'cpu'), n)
            for k, v in train.memory_to_dict(memory).items():
                assert torch.is_tensor(v), k
                assert (v.shape, v.dtype, v.stride()) == layout[k], (n, k)
                assert v.dtype != torch.bool and v.is_contiguous(), k
                assert not v.requires_grad, k


@pytest.mark.parametrize('name', VARIANTS)
def test_reset_memory_equals_a_fresh_memory_for_the_masked_rows(name):
    """reset_memory(mask) empties exactly the masked rows: their next logits equal those of a fresh memory; the
    other rows keep theirs. (train.py resets at epoch wraps and documents, and --eval_reset_memory at every
    segment.)"""
    module, values = variant(name)
    torch.manual_seed(0)
    model = module.Model(module.Config(**{k: v for k, v in values.items() if k != 'model'})).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.seg_len))
    with torch.no_grad():
        memory = fill(model, model.init_memory(2, 'cpu'), 3)
        used, _, _, _ = model(idx, memory)
        fresh, _, _, _ = model(idx, model.init_memory(2, 'cpu'))
        assert name in MEMORYLESS or not torch.allclose(used, fresh, atol=1e-5), "the memory does not change the logits"
        reset, _, _, _ = model(idx, model.reset_memory(memory, torch.tensor([True, False])))
    torch.testing.assert_close(reset[0], fresh[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(reset[1], used[1], rtol=0, atol=1e-6)


# -----------------------------------------------------------------------------------------------------------
# train.py


def resume_dataset(path):
    """177 tokens = 4 streams x 44 (+1): 5 segments of 8 per stream, so 6 steps x 2 segments wrap the epoch twice;
    documents start inside the streams so reset_at_doc fires."""
    return write_dataset(path, pattern_tokens(177, seed=3), pattern_tokens(90, seed=4),
                         doc_starts=[0, 13, 50, 71, 100, 130, 150])


RESUME = dict(batch_size=2, gradient_accumulation_steps=2, bptt_segments=2, reset_at_doc=True, eval_interval=3,
              lr_decay_iters=6, warmup_iters=2, weight_decay=0.1, learning_rate=3e-3, log_interval=1)


@pytest.mark.parametrize('name', VARIANTS)
def test_resume_is_exact(name, tmp_path):
    """6 steps straight == 3 steps, stop, resume to 6: weights, optimizer, memory, data position, RNG and every
    logged value are bit-identical (dropout on, 2 micro-batches, BPTT over 2 segments, resets at documents)."""
    module, values = variant(name)
    model = with_fields(module, values, dropout=0.1, dropatt=0.1)
    data = resume_dataset(tmp_path / 'data')
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    train.train(flags(data, straight, model, max_iters=6, **RESUME))
    train.train(flags(data, split, model, max_iters=3, **RESUME))
    train.train(flags(data, split, model, max_iters=6, init_from='resume', **RESUME))
    a, b = load(straight / 'ckpt.pt'), load(split / 'ckpt.pt')
    assert a['step'] == 6 and a['data_position'] == 12
    assert name in MEMORYLESS or any(v.abs().sum() > 0 for m in a['memory'] for v in m.values()
                                     if v.is_floating_point())
    assert_identical(comparable(a), comparable(b))
    def logged(out_dir):                             # every logged value but the timings
        return [{k: v for k, v in r.items() if k not in ('tokens_per_sec', 'mfu')} for r in read_log(out_dir)]
    assert logged(straight) == logged(split)


@pytest.mark.parametrize('name', VARIANTS)
def test_compile_runs_with_a_single_compilation(name, data_dir, tmp_path):
    """4 steps from an empty memory (it fills, and whatever the model does when it is full -- roll, compress,
    refresh, write the long-term memory -- happens): dynamo compiles the model once, with no graph break."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    module, values = variant(name)
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            result = train.train(flags(data_dir, tmp_path / 'out', with_fields(module, values, dropout=0.1),
                                       max_iters=4, compile=True, eval_tokens=16))
        assert result['step'] == 4
        assert counters['stats']['unique_graphs'] == 1, dict(counters['stats'])
    finally:
        torch._dynamo.reset()
    ckpt = load(tmp_path / 'out' / 'ckpt.pt')
    assert ckpt['train_config']['compile'] is True
    assert not [k for k in ckpt['model'] if '_orig_mod' in k]


@pytest.mark.parametrize('name', VARIANTS)
def test_bf16_autocast_trains_and_keeps_the_memory_in_float32(name, data_dir, tmp_path):
    """--dtype=bfloat16 on CPU: the losses stay finite and close to float32's at the start, the memory the model
    carries stays float32 (the state is accumulated in full precision), and the checkpoint evaluates."""
    module, values = variant(name)
    runs = {}
    for dtype in ('float32', 'bfloat16'):
        out = tmp_path / dtype
        result = train.train(flags(data_dir, out, values, max_iters=6, dtype=dtype, eval_tokens=64, eval_interval=6))
        assert result['step'] == 6 and math.isfinite(result['best_val_loss'])
        runs[dtype] = [r['train/loss'] for r in read_log(out) if 'train/loss' in r]
        for memory in load(out / 'ckpt.pt')['memory']:
            for k, v in memory.items():
                assert not v.is_floating_point() or v.dtype == torch.float32, (k, v.dtype)
    assert all(math.isfinite(x) for x in runs['bfloat16'])
    assert abs(runs['bfloat16'][0] - runs['float32'][0]) < 0.05, runs


@pytest.mark.parametrize('name', VARIANTS)
def test_ddp_two_processes_on_cpu(name, data_dir, tmp_path):
    module, values = variant(name)
    out_dir = tmp_path / 'out'
    proc = run_python(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py']
                      + flags(data_dir, out_dir, values, max_iters=3, gradient_accumulation_steps=2), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = load(out_dir / 'ckpt.pt')
    assert ckpt['step'] == 3 and ckpt['world_size'] == 2 and ckpt['data_position'] == 3
    assert not [k for k in ckpt['model'] if k.startswith(('module.', '_orig_mod.'))]
    assert len(ckpt['memory']) == 2                                  # one per micro-batch
    template = train.memory_to_dict(module.Model(module.Config(
        **{k: v for k, v in values.items() if k != 'model'})).init_memory(2, 'cpu'))
    for memory in ckpt['memory']:
        assert memory.keys() == template.keys()
        for k, v in memory.items():
            assert v.shape == (2,) + template[k].shape, k            # (ranks, ...) gathered from both ranks
        floats = [v for v in memory.values() if v.is_floating_point()]
        assert name in MEMORYLESS or any(not torch.equal(v[0], v[1]) for v in floats)   # each rank its own streams
    assert [r['validation/tokens'] for r in read_log(out_dir) if 'validation/tokens' in r] == [299]


def test_eval_reset_memory_evaluates_without_memory(data_dir, tmp_path):
    """--eval_reset_memory empties the memory before every eval segment: for Transformer-XL that is exactly an
    evaluation with no memory (--eval_mem_len=0), and it differs from the evaluation with memory."""
    module, values = variant('xl')
    out = tmp_path / 'out'
    train.train(flags(data_dir, out, values, max_iters=30, eval_interval=30, learning_rate=1e-2))
    loss = {}
    for key, extra in (('memory', {}), ('reset', {'eval_reset_memory': True}), ('none', {'eval_mem_len': 0})):
        loss[key] = train.train(flags(data_dir, out, values, eval_only=True, **extra))['loss']
    assert loss['reset'] == pytest.approx(loss['none'], abs=1e-6)
    assert abs(loss['reset'] - loss['memory']) > 1e-3
    # --reset_every=1 empties it before every segment too; --reset_every=k (> the segments a row reads) never
    loss['every 1'] = train.train(flags(data_dir, out, values, eval_only=True, reset_every=1))['loss']
    loss['every 1000'] = train.train(flags(data_dir, out, values, eval_only=True, reset_every=1000))['loss']
    assert loss['every 1'] == pytest.approx(loss['none'], abs=1e-6)
    assert loss['every 1000'] == pytest.approx(loss['memory'], abs=1e-6)


# -----------------------------------------------------------------------------------------------------------
# sample.py




@pytest.mark.parametrize('name', VARIANTS)
def test_sample_feeds_a_long_prompt_through_memory(name, enc, tmp_path):
    """sample.py on a tiny GPT-2-vocabulary checkpoint of this model: a FILE: prompt of several segments goes
    through forward() segment by segment, then generate() continues; greedy output equals generate() over the
    whole prompt (whose cache must agree with forward), and the memory matters for it."""
    module, values = variant(name)
    tokens = np.array(enc.encode_ordinary(TEXT * 6), dtype=np.uint16)
    data = write_dataset(tmp_path / 'data', tokens, tokens[:100], vocab_size=enc.n_vocab)
    out_dir = tmp_path / 'out'
    gpt2 = with_fields(module, dict(values, vocab_size=50304), init_std=0.3)
    train.train(flags(data, out_dir, gpt2, max_iters=2, learning_rate=1e-4))
    _, _, model = train.model_from_checkpoint(train.load_checkpoint(out_dir / 'ckpt.pt'))
    model.eval()

    path = tmp_path / 'book.txt'
    path.write_text(TEXT[:330], encoding='utf-8')
    prompt = enc.encode(path.read_text(encoding='utf-8'))
    T = model.config.seg_len
    n_full = (len(prompt) - 1) // T
    assert n_full >= 6
    proc = run_python(['sample.py', f'--out_dir={out_dir}', f'--start=FILE:{path}', '--temperature=0',
                       '--max_new_tokens=12', '--device=cpu'], text=False)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert f'[{n_full * T:,} prompt tokens in memory'.encode() in proc.stderr

    def greedy(tokens):
        out = model.generate(torch.tensor([tokens]), 12, temperature=0.0)
        return out[0, len(tokens):].tolist()

    def decode(ids):                  # what sample.py's Streamer prints (ids past GPT-2's 50257 print as U+FFFD)
        raw = b''.join(enc.decode_single_token_bytes(t) if t < enc.n_vocab else b'\xef\xbf\xbd' for t in ids)
        return raw.decode('utf-8', errors='replace')

    expected = greedy(prompt)
    assert proc.stdout.decode('utf-8') == decode(expected) + '\n'
    if name in MEMORYLESS:                                            # nothing crosses a segment
        assert expected == greedy(prompt[n_full * T:])
    else:
        assert expected != greedy(prompt[n_full * T:])                # the memory matters for this prompt
