"""
CPU tests for train.py (SPEC §6): learning, exact resume, user errors, checkpoints, NaN handling, DDP (gloo),
torch.compile, the model-agnostic machinery (with a stand-in model, tests/_train_standin.py), data order and
evaluation, config files.

Tiny models (1 layer, n_embd 16, seg_len 8, vocab 256) on tiny datasets written in tmp_path in the real format.
Most runs are in-process (`train.train` / `train.main`); the CLI itself (exit codes, SIGINT, torchrun) runs in
subprocesses. The slow ones are the torch.compile test and the 2-process DDP run.
"""
import dataclasses
import math
import re
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import configurator
import runs
import train
import _train_standin
from _models import TINY_MODELS
from _train_util import (ROOT, TINY_XL, assert_identical, assert_one_line_error, flags, load,
                         make_pattern_dataset, pattern_tokens, read_log, run_main, run_python, signal_after_log_lines,
                         write_dataset)


STEPS = 80     # of the shared `trained` run


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return make_pattern_dataset(tmp_path_factory.mktemp('data'), n_train=4000, n_eval=300)


@pytest.fixture(scope='module')
def trained(tmp_path_factory, data_dir):
    """One short real run, shared read-only: 80 steps of a tiny Transformer-XL, eval + checkpoint every 40."""
    out_dir = tmp_path_factory.mktemp('trained')
    result = train.train(flags(data_dir, out_dir, batch_size=4, max_iters=STEPS, eval_interval=STEPS // 2,
                               log_interval=1, learning_rate=1e-2))
    assert result['step'] == STEPS
    return out_dir


def copy_run(src, tmp_path):
    dst = tmp_path / 'out'
    shutil.copytree(src, dst)
    return dst



# -----------------------------------------------------------------------------------------------------------
# 1. It learns


def test_loss_falls_on_a_tiny_corpus(trained):
    log = read_log(trained)
    train_losses = [r['train/loss'] for r in log if 'train/loss' in r]
    val = [(r['step'], r['validation/loss']) for r in log if 'validation/loss' in r]
    assert len(train_losses) == STEPS and [s for s, _ in val] == [STEPS // 2, STEPS]
    assert train_losses[0] > 5.0                                   # ~ln(256) = 5.55 at the start
    assert np.mean(train_losses[-10:]) < 0.4 * train_losses[0]
    assert val[1][1] < val[0][1] < 0.6 * math.log(256)
    assert all(r['validation/tokens'] == 299 for r in log if 'validation/tokens' in r)


# -----------------------------------------------------------------------------------------------------------
# 2. Exact resume (of every model file: tests/test_models_train.py; here the SIGINT path)


def resume_dataset(path):
    """177 tokens = 4 streams x 44 (+1): 5 segments of 8 per stream, so 6 steps x 2 segments wrap the epoch twice;
    documents start inside the streams so reset_at_doc fires."""
    return write_dataset(path, pattern_tokens(177, seed=3), pattern_tokens(90, seed=4),
                         doc_starts=[0, 13, 50, 71, 100, 130, 150])


RESUME = dict(batch_size=2, gradient_accumulation_steps=2, bptt_segments=2, reset_at_doc=True, dropout=0.1,
              dropatt=0.1, eval_interval=3, lr_decay_iters=6, warmup_iters=2, weight_decay=0.1, learning_rate=3e-3,
              log_interval=1)


def comparable(ckpt):
    return {k: v for k, v in ckpt.items() if k != 'train_config'}


def test_sigint_saves_a_checkpoint_exits_130_then_resumes_exactly(tmp_path, data_dir):
    """Ctrl-C during training: the step finishes, ckpt.pt is written, exit status 130; --init_from=resume continues
    as if nothing had happened (bit-identical to a straight run)."""
    out_dir = tmp_path / 'out'
    schedule = dict(lr_decay_iters=1000, dropout=0.1)                # the same learning rates whatever max_iters
    args = flags(data_dir, out_dir, max_iters=100000, eval_interval=100000, log_interval=1, **schedule)
    code, out, err = signal_after_log_lines([sys.executable, 'train.py'] + args, out_dir, 2, signal.SIGINT)
    assert code == 130, err
    assert 'Traceback' not in err
    assert 'continue with --init_from=resume' in out
    ckpt = load(out_dir / 'ckpt.pt')
    stopped = ckpt['step']
    assert 2 <= stopped < 100000 and ckpt['data_position'] == stopped
    assert read_log(out_dir)[-1]['step'] == stopped
    for out, extra in ((out_dir, dict(init_from='resume')), (tmp_path / 'straight', {})):   # one thread, as above
        proc = run_python(['train.py'] + flags(data_dir, out, max_iters=stopped + 2, **schedule, **extra))
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert load(out_dir / 'ckpt.pt')['step'] == stopped + 2
    assert_identical(comparable(load(out_dir / 'ckpt.pt')), comparable(load(tmp_path / 'straight' / 'ckpt.pt')))


# -----------------------------------------------------------------------------------------------------------
# 3. Bad input: one `error:` line, exit 2, no traceback


BAD_FLAGS = [
    (['--batch_sise=3'], ['unknown flag --batch_sise', 'did you mean --batch_size?']),
    (['--mem_lenn=3'], ['unknown flag --mem_lenn', 'did you mean --mem_len?']),      # a model flag
    (['--batch_size=two'], ['--batch_size takes an int', "'two'"]),
    (['--learning_rate=fast'], ['--learning_rate takes a float']),
    (['--reset_at_doc=maybe'], ['--reset_at_doc takes True or False']),
    (['--dropout=2'], ['dropout must be in [0, 1)']),
    (['--batch_size=0'], ['batch_size must be >= 1']),
    (['--model=nope'], ["unknown model 'nope'", 'available:', 'xl']),
    (['--init_from=somewhere'], ['init_from must be']),
    (['--compile'], ['flags are written --name=value']),
    (['stray'], ["unexpected argument 'stray'"]),
    (['--batch_size=1000'], ['too small']),
]


@pytest.mark.parametrize('bad, fragments', BAD_FLAGS, ids=[bad[0] for bad, _ in BAD_FLAGS])
def test_bad_flags_give_one_line_errors(bad, fragments, data_dir, tmp_path, capsys):
    code, _, err = run_main(flags(data_dir, tmp_path / 'out') + bad, capsys)
    assert code == 2
    assert_one_line_error(err, *fragments)


def test_missing_dataset(tmp_path, capsys):
    base = [f for f in flags(tmp_path, tmp_path / 'out') if not f.startswith('--data_dir')]
    code, _, err = run_main(base + ['--dataset=nope'], capsys)
    assert code == 2
    assert_one_line_error(err, 'no data at', 'nope', 'datasets with a prepare.py')
    code, _, err = run_main(base + [f'--data_dir={tmp_path / "empty"}'], capsys)
    assert code == 2
    assert_one_line_error(err, 'no data at')
    code, _, err = run_main(base + [f'--data_dir={tmp_path / "pg19"}'], capsys)   # a known, unprepared dataset
    assert code == 2
    assert_one_line_error(err, 'no data at', 'run `python data/pg19/prepare.py` first')


def test_unknown_device_is_a_user_error(data_dir, tmp_path, capsys):
    """A mistyped --device is bad input like any other flag value (today: a RuntimeError traceback from torch)."""
    code, _, err = run_main(flags(data_dir, tmp_path / 'out', device='gpu'), capsys)
    assert code == 2
    assert_one_line_error(err, 'gpu')


def test_cli_errors_exit_nonzero_without_traceback(data_dir, tmp_path):
    """The real command line: exit status 2 and one line on stderr."""
    proc = run_python(['train.py'] + flags(data_dir, tmp_path / 'out') + ['--n_layers=2'])
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, 'unknown flag --n_layers', 'did you mean --n_layer?')


@pytest.mark.parametrize('source, fragment', [
    ('import os\n', 'may only contain `name = literal` lines'),
    ("batch_size = __import__('pathlib').Path('{marker}').touch()\n", 'must be a literal'),
    ("open('{marker}', 'w')\n", 'may only contain'),
    ('def f():\n    pass\n', 'may only contain'),
    ('batch_size = 4 +\n', 'syntax error'),
    ("batch_size = 'four'\n", 'batch_size takes an int'),
    ('batch_size = 2.5\n', 'batch_size takes an int'),
], ids=['import', 'call-in-value', 'bare-call', 'def', 'syntax-error', 'str-for-int', 'float-for-int'])
def test_config_file_with_code_is_refused_not_run(source, fragment, data_dir, tmp_path, capsys):
    marker = tmp_path / 'marker'
    config = tmp_path / 'bad_config.py'
    config.write_text(source.format(marker=marker))
    code, _, err = run_main(flags(data_dir, tmp_path / 'out') + [str(config)], capsys)
    assert code == 2
    assert_one_line_error(err, fragment)
    assert not marker.exists()


def test_resume_without_checkpoint(data_dir, tmp_path, capsys):
    code, _, err = run_main(flags(data_dir, tmp_path / 'out', init_from='resume'), capsys)
    assert code == 2
    assert_one_line_error(err, 'no checkpoint at', 'ckpt.pt')


def test_resume_checkpoint_of_another_model(trained, data_dir, tmp_path, capsys):
    out_dir = copy_run(trained, tmp_path)
    ckpt = load(out_dir / 'ckpt.pt')
    ckpt['model_name'] = 'compressive'
    torch.save(ckpt, out_dir / 'ckpt.pt')
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=STEPS + 1), capsys)
    assert code == 2
    assert_one_line_error(err, "holds a 'compressive' model", '--model=xl')


def test_model_from_checkpoint_refuses_unknown_config_fields(trained):
    ckpt = load(trained / 'ckpt.pt')
    module, config, model = train.model_from_checkpoint(ckpt)       # the untouched one loads
    assert_identical(model.state_dict(), ckpt['model'])
    ckpt['model_config']['n_memory_banks'] = 4
    with pytest.raises(train.UserError, match=r"n_memory_banks.*does not know"):
        train.model_from_checkpoint(ckpt, 'forged.pt')
    ckpt['model_config'].pop('n_memory_banks')
    ckpt['model']['layers.0.attn.q_net.weight'] = torch.zeros(3, 3)
    with pytest.raises(train.UserError, match='weights do not fit'):
        train.model_from_checkpoint(ckpt, 'forged.pt')


def test_checkpoint_with_use_sdpa_loads_with_the_attn_kernel_it_meant(trained):
    """Checkpoints written before attn_kernel replaced use_sdpa: True reads as 'sdpa', False as 'einsum'."""
    ckpt = load(trained / 'ckpt.pt')
    for use_sdpa, kernel in ((True, 'sdpa'), (False, 'einsum')):
        config = {k: v for k, v in ckpt['model_config'].items() if k != 'attn_kernel'}
        ckpt['model_config'] = dict(config, use_sdpa=use_sdpa)
        _, loaded, model = train.model_from_checkpoint(ckpt, 'old.pt')
        assert loaded.attn_kernel == kernel and model.layers[0].attn.attn_kernel == kernel
        assert_identical(model.state_dict(), ckpt['model'])


def test_checkpoint_with_a_renamed_field_loads_it_under_the_new_name(tmp_path, capsys):
    """A checkpoint written before ltm_lr_multiplier became ltm_lr_mult (configurator.RENAMED_FLAGS) loads, with
    its value under the new name, and one line says so (a checkpoint cannot be edited: an error would strand it)."""
    module = train.import_model('infformer_gpt2')
    fields = {k: v for k, v in TINY_MODELS['infformer_gpt2'].items() if k != 'model'}
    model = module.Model(module.Config(**fields, ltm_lr_mult=3.0))
    old = {('ltm_lr_multiplier' if k == 'ltm_lr_mult' else k): v for k, v in dataclasses.asdict(model.config).items()}
    torch.save({'format': runs.CKPT_FORMAT, 'model_name': 'infformer_gpt2', 'model_config': old,
                'model': model.state_dict()}, tmp_path / 'ckpt.pt')
    ckpt = train.load_checkpoint(tmp_path / 'ckpt.pt')
    assert 'ltm_lr_multiplier' not in ckpt['model_config'] and ckpt['model_config']['ltm_lr_mult'] == 3.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'ltm_lr_multiplier was renamed ltm_lr_mult' in err[0]
    _, config, loaded = train.model_from_checkpoint(ckpt, tmp_path / 'ckpt.pt')
    assert config.ltm_lr_mult == 3.0 and set(loaded.lr_multipliers().values()) == {3.0}
    assert_identical(loaded.state_dict(), model.state_dict())


def test_resume_may_change_the_attention_kernel(trained, data_dir, tmp_path):
    """attn_kernel says how the attention is computed, not what: a resume may change it (train.RUNTIME_FIELDS)."""
    out_dir = copy_run(trained, tmp_path)
    assert load(out_dir / 'ckpt.pt')['model_config']['attn_kernel'] == 'sdpa'
    result = train.train(flags(data_dir, out_dir, init_from='resume', max_iters=STEPS + 1, batch_size=4,
                               attn_kernel='einsum'))
    assert result['step'] == STEPS + 1
    assert load(out_dir / 'ckpt.pt')['model_config']['attn_kernel'] == 'einsum'


def test_triton_kernel_off_cuda_is_a_one_line_error(data_dir, tmp_path, monkeypatch, capsys):
    """attn_kernel='triton' on the CPU without Triton's interpreter (or without triton at all): one line."""
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    code, _, err = run_main(flags(data_dir, tmp_path / 'out', attn_kernel='triton'), capsys)
    assert code == 2
    assert_one_line_error(err, "attn_kernel='triton'")


def test_resume_with_contradicting_architecture(trained, data_dir, tmp_path, capsys):
    out_dir = copy_run(trained, tmp_path)
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=STEPS + 1, batch_size=4, n_layer=2),
                            capsys)
    assert code == 2
    assert_one_line_error(err, '--n_layer=2 contradicts the checkpoint', 'n_layer=1')
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=STEPS + 1, batch_size=3), capsys)
    assert code == 2
    assert_one_line_error(err, 'resume with the same values')
    # repeating the checkpoint's own architecture flags is fine
    result = train.train(flags(data_dir, out_dir, init_from='resume', max_iters=STEPS + 1, batch_size=4))
    assert result['step'] == STEPS + 1


def test_pickled_object_checkpoint_is_refused_not_executed(data_dir, tmp_path, capsys):
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    marker = tmp_path / 'pwned'
    torch.save({'format': train.CKPT_FORMAT, 'model_name': 'xl', 'payload': _train_standin.Evil(marker)},
               out_dir / 'ckpt.pt')
    torch.load(out_dir / 'ckpt.pt', weights_only=False)              # the forgery does run code when unpickled...
    assert marker.exists()
    marker.unlink()
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume'), capsys)
    assert code == 2
    assert_one_line_error(err, 'is not a loadable nanomem checkpoint')
    assert not marker.exists()                                       # ...but train.py never unpickles it


@pytest.mark.parametrize('content', [b'', b'not a checkpoint at all', 'truncated', 'not-nanomem'],
                         ids=['empty', 'text', 'truncated', 'not-nanomem'])
def test_corrupt_checkpoint(content, trained, data_dir, tmp_path, capsys):
    out_dir = copy_run(trained, tmp_path)
    path = out_dir / 'ckpt.pt'
    if content == 'truncated':
        content = path.read_bytes()[:5000]
    elif content == 'not-nanomem':
        torch.save({'weights': torch.zeros(2)}, path)
        content = path.read_bytes()
    path.write_bytes(content)
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', batch_size=4, max_iters=STEPS + 1), capsys)
    assert code == 2
    assert_one_line_error(err, 'not a', 'nanomem checkpoint')


# -----------------------------------------------------------------------------------------------------------
# 4. Checkpoints


def test_checkpoint_contents(trained):
    ckpt = load(trained / 'ckpt.pt')                                 # weights_only=True
    for key in ('model', 'optimizer', 'model_config', 'train_config', 'step', 'data_position', 'rng', 'memory',
                'model_name', 'format', 'best_val_loss', 'world_size', 'scaler'):
        assert key in ckpt, key
    assert ckpt['step'] == STEPS and ckpt['data_position'] == STEPS and ckpt['model_name'] == 'xl'
    assert not [k for k in ckpt['model'] if k.startswith(('_orig_mod.', 'module.')) or '._orig_mod.' in k]
    assert ckpt['model_config'] == {**ckpt['model_config'], **TINY_XL}
    assert ckpt['train_config']['batch_size'] == 4
    assert ckpt['optimizer']['state'] and ckpt['rng']['cpu'].dtype == torch.uint8
    assert ckpt['rng']['cpu'].shape[0] == 1
    (memory,) = ckpt['memory']                                       # one per micro-batch
    L, B, M, C = 1, 4, TINY_XL['mem_len'], TINY_XL['n_embd']
    assert memory['mem'].shape == (1, L, B, M, C) and memory['length'].tolist() == [[M] * B]
    assert memory['mem'].abs().sum() > 0
    assert load(trained / 'best.pt')['step'] in (STEPS // 2, STEPS)
    assert not list(trained.glob('*.tmp'))


def test_atomic_save_keeps_the_old_checkpoint_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / 'ckpt.pt'
    train.save_checkpoint({'format': train.CKPT_FORMAT, 'step': 1, 'w': torch.ones(1000)}, path)
    before = path.read_bytes()
    assert not list(tmp_path.glob('*.tmp'))
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.seek(0)
        f.truncate(100)                                             # half-written...
        raise OSError(28, 'No space left on device')                # ...then the disk is full

    monkeypatch.setattr(torch, 'save', failing_save)
    with pytest.raises(train.UserError, match='No space left on device'):
        train.save_checkpoint({'format': train.CKPT_FORMAT, 'step': 2, 'w': torch.zeros(1000)}, path)
    assert path.read_bytes() == before
    assert load(path)['step'] == 1


# -----------------------------------------------------------------------------------------------------------
# 5. A NaN loss stops the run and keeps the last good checkpoint


def test_nan_loss_stops_and_keeps_last_checkpoint(trained, data_dir, tmp_path, monkeypatch, capsys):
    out_dir = copy_run(trained, tmp_path)
    before = {name: (out_dir / name).read_bytes() for name in ('ckpt.pt', 'best.pt')}
    import model_xl
    real_forward = model_xl.Model.forward
    calls = {'n': 0}

    def forward(self, idx, memory, targets=None):
        logits, loss, memory, aux = real_forward(self, idx, memory, targets)
        if targets is not None:
            calls['n'] += 1
            if calls['n'] > 3:                                        # 3 good steps, then NaN
                loss = loss * float('nan')
        return logits, loss, memory, aux

    monkeypatch.setattr(model_xl.Model, 'forward', forward)
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', batch_size=4, max_iters=STEPS + 20,
                                  eval_interval=STEPS + 10), capsys)
    assert code == 2
    last = assert_one_line_error(err.splitlines()[-1], 'loss is nan at step', 'ckpt.pt')
    assert re.search(rf'step ({STEPS + 3}|{STEPS + 4})\b', last), last   # the 4th step after the resume
    assert 'Traceback' not in err
    for name, content in before.items():
        assert (out_dir / name).read_bytes() == content, name
    assert not list(out_dir.glob('*.tmp'))


def test_nan_loss_before_any_checkpoint_says_there_is_none(data_dir, tmp_path, capsys):
    """A run that diverges before its first checkpoint must not point to a checkpoint that does not exist."""
    out_dir = tmp_path / 'run'
    code, _, err = run_main(flags(data_dir, out_dir, learning_rate=1e9, max_iters=50, eval_interval=40), capsys)
    assert code == 2
    last = assert_one_line_error(err.splitlines()[-1], 'loss is', 'No checkpoint was written yet')
    assert 'last good checkpoint' not in last and not (out_dir / 'ckpt.pt').exists()


# -----------------------------------------------------------------------------------------------------------
# 7. Generic machinery, with a stand-in model


@pytest.fixture
def standin(monkeypatch):
    real_import, real_available = train.import_model, train.available_models
    for module in (train, configurator):                              # parse_args lives in configurator.py
        monkeypatch.setattr(module, 'available_models', lambda: sorted(real_available() + ['standin']))
        monkeypatch.setattr(module, 'import_model',
                            lambda name: _train_standin if name == 'standin' else real_import(name))
    monkeypatch.setattr(runs, 'import_model', train.import_model)      # model_from_checkpoint lives in runs.py
    _train_standin.TRACE.clear()
    _train_standin.RESETS.clear()
    yield _train_standin
    _train_standin.TRACE.clear()
    _train_standin.RESETS.clear()


STANDIN = dict(model='standin', vocab_size=256, n_embd=16, seg_len=8)


def test_bptt_keeps_the_graph_over_k_segments_then_detaches(standin, tmp_path):
    """bptt_segments=3: inside a window each segment's incoming state carries the graph of the previous ones and
    receives gradient from the loss; the first segment of every window starts from a detached state. Rows, micro-
    batches and segments read the contiguous slices the stream layout says."""
    tokens = np.arange(2 * 2 * 48 + 1) % 251
    data = write_dataset(tmp_path / 'data', tokens, tokens[:60])
    train.train(flags(data, tmp_path / 'out', STANDIN, batch_size=2, gradient_accumulation_steps=2,
                      bptt_segments=3, max_iters=2))
    trace = standin.TRACE
    assert len(trace) == 2 * 2 * 3                                    # steps x micro-batches x segments
    stream_len, T = 48, 8
    for i, record in enumerate(trace):
        step, g, s = i // 6, (i // 3) % 2, i % 3
        state = record['state']
        if s == 0:
            assert not state.requires_grad, f"step {step} micro {g}: the window must start detached"
        else:
            assert state.grad_fn is not None, f"step {step} micro {g} segment {s}: graph cut inside the window"
            assert state.grad is not None and state.grad.abs().sum() > 0, "no gradient reached the earlier segment"
        position = step * 3 + s
        for b in range(2):
            start = (g * 2 + b) * stream_len + position * T
            assert record['idx'][b].tolist() == tokens[start:start + T].tolist(), (step, g, s, b)


def test_aux_losses_are_logged_by_name(standin, tmp_path, data_dir):
    train.train(flags(data_dir, tmp_path / 'out', STANDIN, max_iters=4, log_interval=2, bptt_segments=2))
    log = [r for r in read_log(tmp_path / 'out') if 'train/loss' in r]
    assert [r['step'] for r in log] == [2, 4]
    for r in log:
        assert r['train/const_aux'] == pytest.approx(standin.CONST_AUX)
        assert r['train/aux_loss'] > 0 and r['train/lm_loss'] > 0
    # train/loss is the total of the last step; with log_interval=1 it equals lm_loss + aux_weight * aux_loss
    train.train(flags(data_dir, tmp_path / 'out1', STANDIN, max_iters=2, log_interval=1))
    for r in [r for r in read_log(tmp_path / 'out1') if 'train/loss' in r]:
        assert r['train/loss'] == pytest.approx(r['train/lm_loss'] + 0.1 * r['train/aux_loss'], rel=1e-5)


def test_aux_may_hold_plain_floats(standin, tmp_path, data_dir):
    """SPEC §1: aux is a "dict of floats/tensors to log"; a Python float must be logged like a tensor
    (today train.py calls v.detach() on every value and crashes with AttributeError)."""
    train.train(flags(data_dir, tmp_path / 'out', dict(STANDIN, float_aux=True), max_iters=2, log_interval=2))
    (record,) = [r for r in read_log(tmp_path / 'out') if 'train/loss' in r]
    assert record['train/float_aux'] == pytest.approx(standin.FLOAT_AUX)
    assert record['train/const_aux'] == pytest.approx(standin.CONST_AUX)


def test_lr_multipliers_give_the_named_parameter_its_own_lr(standin, tmp_path, data_dir):
    """lr_multipliers() = {'gate': 10}: the gate gets its own group at 10x the lr. After one AdamW step from the
    known init (seed 1337) every parameter moved by at most its lr (Adam's first step is lr * sign(g)), so the
    gate moved 10x as far as the others."""
    lr = 1e-3
    train.train(flags(data_dir, tmp_path / 'out', STANDIN, max_iters=1, bptt_segments=2, learning_rate=lr))
    ckpt = load(tmp_path / 'out' / 'ckpt.pt')
    groups = ckpt['optimizer']['param_groups']
    fast = [g for g in groups if g['lr_mult'] == standin.GATE_LR_MULT]
    assert len(fast) == 1 and len(fast[0]['params']) == 1
    assert fast[0]['lr'] == pytest.approx(standin.GATE_LR_MULT * lr)
    assert all(g['lr'] == pytest.approx(lr) for g in groups if g is not fast[0])
    torch.manual_seed(train.TrainConfig().seed)
    init = standin.Model(standin.Config(**{k: v for k, v in STANDIN.items() if k != 'model'})).state_dict()
    moved = {name: (ckpt['model'][name] - init[name]).abs().max().item() for name in init}
    assert moved['gate'] == pytest.approx(standin.GATE_LR_MULT * lr, rel=1e-3)
    for name in ('mix.weight', 'mix.bias', 'head.weight', 'head.bias', 'emb.weight'):
        assert moved[name] == pytest.approx(lr, rel=1e-3), name


def test_memory_of_any_shape_is_saved_and_restored(standin, tmp_path, data_dir):
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, STANDIN, max_iters=3, gradient_accumulation_steps=2))
    ckpt = load(out_dir / 'ckpt.pt')
    assert [sorted(m) for m in ckpt['memory']] == [['seen', 'state'], ['seen', 'state']]
    for m in ckpt['memory']:
        assert m['state'].shape == (1, 2, 16) and not m['state'].requires_grad
        assert m['seen'].tolist() == [[3, 3]]
    standin.TRACE.clear()
    train.train(flags(data_dir, out_dir, STANDIN, max_iters=4, gradient_accumulation_steps=2, init_from='resume'))
    first = standin.TRACE[:2]                                        # step 4, micro-batches 0 and 1
    for g in range(2):
        assert torch.equal(first[g]['state'].detach(), ckpt['memory'][g]['state'][0])
        assert torch.equal(first[g]['seen'], ckpt['memory'][g]['seen'][0])


def test_resume_is_exact_for_another_memory_type(standin, tmp_path):
    data = resume_dataset(tmp_path / 'data')
    cfg = {k: v for k, v in RESUME.items() if k != 'dropatt'}
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    train.train(flags(data, straight, STANDIN, max_iters=6, **cfg))
    train.train(flags(data, split, STANDIN, max_iters=3, **cfg))
    train.train(flags(data, split, STANDIN, max_iters=6, init_from='resume', **cfg))
    assert_identical(comparable(load(straight / 'ckpt.pt')), comparable(load(split / 'ckpt.pt')))


@pytest.mark.parametrize('reset_at_doc,reset_every', [(False, 0), (True, 0), (False, 3), (True, 4)])
def test_memory_is_reset_at_epoch_wrap_and_document_starts(reset_at_doc, reset_every, standin, tmp_path):
    """2 streams of 40 tokens = 5 segments of 8 each. Documents start at 16 (row 0, segment 2) and 64 (row 1,
    segment 3). A row's memory must be empty exactly when its segment begins the epoch again, (reset_at_doc) a
    new document, or (reset_every = k) every k segments read; never at the very first step (it is empty already)."""
    tokens = np.arange(81) % 251
    data = write_dataset(tmp_path / 'data', tokens, tokens[:40], doc_starts=[0, 16, 40, 64])
    train.train(flags(data, tmp_path / 'out', STANDIN, batch_size=2, max_iters=12, reset_at_doc=reset_at_doc,
                      reset_every=reset_every))
    seen, expected_seen, expected_resets = np.zeros(2, dtype=int), [], []
    for position in range(12):
        seg = position % 5
        every = reset_every > 0 and position % reset_every == 0
        reset = np.array([(seg == 0 or every) and position > 0] * 2)
        if reset_at_doc:
            reset |= np.array([seg == 2, seg == 3])
        if reset.any():
            expected_resets.append(reset.tolist())
        seen[reset] = 0
        expected_seen.append(seen.tolist())
        seen += 1
    assert [r['seen'].tolist() for r in standin.TRACE] == expected_seen
    assert [m.tolist() for m in standin.RESETS] == expected_resets


# -----------------------------------------------------------------------------------------------------------
# 8. Data order and evaluation


def test_stream_loader_rows_are_contiguous_disjoint_streams():
    """world 2 x micro 2 x batch 3 streams over data[i] = i: each row reads its own contiguous run, segment after
    segment; targets are the inputs shifted by one; no token is read as an input by two rows."""
    n, T, W, G, B = 1000, 7, 2, 2, 3
    data = np.arange(n, dtype=np.uint16)
    n_streams = W * G * B
    loaders = [train.StreamLoader(data, n_streams, (r * G + g) * B, B, T) for r in range(W) for g in range(G)]
    n_segments = loaders[0].n_segments
    assert n_segments == ((n - 1) // n_streams) // T
    inputs_seen = []
    for loader in loaders:
        previous = None
        for p in range(n_segments):
            x, y, reset = loader.get(p)
            assert x.shape == y.shape == (B, T) and x.dtype == torch.long
            assert torch.equal(y, x + 1)                                # targets = inputs shifted by one
            assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(B, T - 1, dtype=torch.long))
            if previous is not None:
                assert torch.equal(x[:, 0], previous[:, -1] + 1)       # segment p+1 starts where p ended
            assert not reset.any()
            previous = x
            inputs_seen.append(x.flatten())
    seen = torch.cat(inputs_seen)
    assert seen.unique().numel() == seen.numel() == n_streams * n_segments * T   # disjoint
    assert int(seen.max()) + 1 < n


def test_stream_loader_wraps_around_with_a_reset():
    data = np.arange(200, dtype=np.uint16)
    loader = train.StreamLoader(data, 4, 0, 4, 8)                      # 49 tokens per stream: 6 segments
    assert loader.n_segments == 6
    x0, y0, r0 = loader.get(0)
    assert not r0.any()
    for p in range(1, 6):
        assert not loader.get(p)[2].any()
    x6, y6, r6 = loader.get(6)
    assert torch.equal(x6, x0) and torch.equal(y6, y0) and r6.all()
    assert torch.equal(loader.get(13)[0], loader.get(1)[0]) and not loader.get(13)[2].any()
    with pytest.raises(train.UserError, match='too small'):
        train.StreamLoader(data, 30, 0, 30, 8)


@dataclasses.dataclass
class LastToken:
    last: torch.Tensor   # (B,) the last input token of the previous segment, -1 when empty


class ScoringModel(nn.Module):
    """logits = -w + 5 * onehot(x + 1): a fixed, input-dependent prediction, so the total NLL over a set of
    (input, target) pairs identifies the set. Records its inputs and checks that memory is carried in-stream."""

    def __init__(self, vocab=256):
        super().__init__()
        self.w = torch.randn(vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
        self.vocab, self.calls, self.mem_lens = vocab, [], []

    def init_memory(self, batch_size, device, mem_len=None):
        self.mem_lens.append(mem_len)
        return LastToken(last=torch.full((batch_size,), -1, dtype=torch.long))

    def logits_for(self, x):
        return -self.w + 5.0 * F.one_hot((x + 1) % self.vocab, self.vocab).float()

    def forward(self, x, memory, targets=None):
        self.calls.append((x.clone(), memory.last.clone()))
        return self.logits_for(x), None, LastToken(last=x[:, -1]), {}


@pytest.mark.parametrize('eval_batch_size', [1, 3, 7, 64])
@pytest.mark.parametrize('n_tokens', [200, 201])
def test_eval_predicts_every_token_once(eval_batch_size, n_tokens):
    data = (np.arange(n_tokens) + 1).astype(np.uint16)                  # distinct values, 0 never occurs
    model = ScoringModel()
    cfg = train.TrainConfig(batch_size=2, eval_batch_size=eval_batch_size)
    model_cfg = train.import_model('xl').Config(**TINY_XL)
    out = train.evaluate(model, train.EvalSet(data, words=50), train.Run(cfg), model_cfg)
    assert out['tokens'] == n_tokens - 1
    read = torch.cat([x.flatten() for x, _ in model.calls])
    assert sorted(read[read != 0].tolist()) == list(range(1, n_tokens))   # every input but the last, once
    x = torch.from_numpy(data[:-1].astype(np.int64))
    y = torch.from_numpy(data[1:].astype(np.int64))
    total = F.cross_entropy(model.logits_for(x).double(), y, reduction='sum').item()
    assert out['loss'] * out['tokens'] == pytest.approx(total, rel=1e-6)
    assert out['word_ppl'] == pytest.approx(math.exp(total / 50), rel=1e-6)
    assert out['ppl'] == pytest.approx(math.exp(out['loss']))
    for x, last in model.calls[1:]:                                     # memory is carried along each stream
        for b in range(x.size(0)):
            if last[b] > 0 and x[b, 0] > 0:
                assert x[b, 0] == last[b] + 1


def test_eval_tokens_reads_a_prefix_without_word_ppl():
    data = (np.arange(200) + 1).astype(np.uint16)
    cfg = train.TrainConfig(batch_size=3, eval_tokens=50)
    model_cfg = train.import_model('xl').Config(**TINY_XL)
    out = train.evaluate(ScoringModel(), train.EvalSet(data, words=50), train.Run(cfg), model_cfg)
    assert out['tokens'] == 50 and 'word_ppl' not in out


def test_eval_only_reproduces_the_logged_validation_loss(trained, data_dir, tmp_path, capsys):
    """--eval_only=True evaluates the checkpoint exactly as the run did at its last step, changes nothing, and
    may use a longer eval memory."""
    out_dir = copy_run(trained, tmp_path)
    before = (out_dir / 'ckpt.pt').read_bytes()
    logged = [r for r in read_log(trained) if 'validation/loss' in r][-1]
    result = train.train(flags(data_dir, out_dir, batch_size=4, eval_only=True))
    assert result['loss'] == logged['validation/loss'] and result['tokens'] == logged['validation/tokens']
    longer = train.train(flags(data_dir, out_dir, batch_size=4, eval_only=True, eval_mem_len=64))
    assert longer['tokens'] == result['tokens'] and longer['loss'] != result['loss']
    assert (out_dir / 'ckpt.pt').read_bytes() == before
    assert read_log(out_dir) == read_log(trained)


def test_eval_stream_bounds_partition_the_predictions():
    for n_tokens in (2, 10, 101, 1000):
        for n_streams in (1, 2, 3, 8, 16):
            starts, ends = train.eval_stream_bounds(n_tokens, n_streams)
            assert len(starts) == len(ends) == n_streams
            assert starts[0] == 0 and ends[-1] == n_tokens - 1
            assert np.all(starts[1:] == ends[:-1]) and np.all(ends >= starts)
            assert (ends - starts).max() - (ends - starts).min() <= 1


def test_eval_with_a_longer_memory_than_training(trained):
    ckpt = load(trained / 'ckpt.pt')
    _, model_cfg, model = train.model_from_checkpoint(ckpt)
    data = np.fromfile(Path(ckpt['train_config']['data_dir']) / 'validation.bin', dtype=np.uint16)
    results = {}
    for eval_mem_len in (-1, 0, 4 * model_cfg.mem_len):
        cfg = train.TrainConfig(batch_size=2, eval_mem_len=eval_mem_len)
        results[eval_mem_len] = train.evaluate(model, train.EvalSet(data, words=100), train.Run(cfg),
                                               model_cfg)
        assert results[eval_mem_len]['tokens'] == len(data) - 1
        assert math.isfinite(results[eval_mem_len]['loss'])
    assert len({r['loss'] for r in results.values()}) == 3            # the memory length is really used


# -----------------------------------------------------------------------------------------------------------
# 9. Flags and config files


def test_config_file_then_flags(tmp_path):
    config = tmp_path / 'my_config.py'
    config.write_text('"""a demo config"""\n# comment\nbatch_size = 6\nn_layer = 3\ncompile = None\n'
                      "dataset = 'pg19'\nlearning_rate = 1\nreset_at_doc = True\n")
    cfg, module, model_cfg, given = train.parse_args([str(config), '--batch_size=5', '--mem_len=7'])
    assert module.__name__ == 'model_xl'
    assert cfg.batch_size == 5                                           # the flag after the file wins
    assert model_cfg.n_layer == 3 and model_cfg.mem_len == 7              # model fields from file and flag
    assert cfg.dataset == 'pg19' and cfg.compile is None and cfg.reset_at_doc is True
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert given == {'batch_size', 'n_layer', 'compile', 'dataset', 'learning_rate', 'reset_at_doc', 'mem_len'}
    cfg, _, model_cfg, _ = train.parse_args(['--batch_size=5', str(config)])
    assert cfg.batch_size == 6                                           # later wins, whatever the kind


@pytest.mark.parametrize('config', sorted((ROOT / 'config').glob('*.py')), ids=lambda p: p.name)
def test_shipped_config_files_parse(config):
    cfg, module, model_cfg, given = train.parse_args([str(config)])
    assert given and module.__name__ == f'model_{cfg.model}'


@pytest.mark.parametrize('value, expected', [('None', None), ('True', True), ('False', False), ('true', True),
                                             ('0', False)])
def test_compile_flag_parses(value, expected):
    cfg, _, _, _ = train.parse_args([f'--compile={value}'])
    assert cfg.compile is expected
    assert train.parse_args([])[0].compile is None


def test_flag_values_are_typed():
    cfg, _, model_cfg, _ = train.parse_args(['--learning-rate=3e-4', '--max_iters=7', '--dropout=0.25',
                                             '--same_length=True', '--out_dir=x=y'])
    assert cfg.learning_rate == 3e-4 and cfg.max_iters == 7 and cfg.out_dir == 'x=y'
    assert model_cfg.dropout == 0.25 and model_cfg.same_length is True


def test_train_leaves_the_signal_handlers_as_it_found_them(data_dir, tmp_path):
    """train() called in-process (a notebook, this test suite) must not leave its Ctrl-C / SIGTERM handlers
    installed: afterwards the first Ctrl-C would be swallowed by a finished run."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    train.train(flags(data_dir, tmp_path / 'out', max_iters=1))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# -----------------------------------------------------------------------------------------------------------
# 10. LaMemo left model_xl.py: the old flag and the old checkpoints are one line that says what to do


def test_lookahead_flag_on_xl_is_a_one_line_error(data_dir, tmp_path, capsys):
    code, _, err = run_main(flags(data_dir, tmp_path / 'out', lookahead=True), capsys)
    assert code == 2
    assert_one_line_error(err, '--lookahead')


@pytest.mark.parametrize('lookahead', [True, False])
def test_checkpoints_from_before_the_move_are_one_line_errors(lookahead, data_dir, tmp_path, capsys):
    """A checkpoint written by model_xl.py with its lookahead field (model_name 'xl'; with lookahead=True it holds
    a LaMemo model) is no longer upgraded: resuming or loading it says what to do, in one line."""
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, max_iters=1))
    ckpt = load(out_dir / 'ckpt.pt')
    torch.save(dict(ckpt, model_config=dict(ckpt['model_config'], lookahead=lookahead)), out_dir / 'ckpt.pt')
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=2), capsys)
    assert code == 2
    line = assert_one_line_error(err, 'made by model_xl.py', 'before LaMemo had its own file', 'commit b4b2c3e')
    assert ('--model=lamemo' in line) == lookahead
    with pytest.raises(train.UserError, match='commit b4b2c3e'):
        train.load_checkpoint(out_dir / 'ckpt.pt')
