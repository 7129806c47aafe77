"""
A run is never lost (train.py with runs.py): DDP resume on every rank, one run per out_dir, no non-finite value in a
checkpoint or in log.jsonl, SIGINT/SIGTERM (also under torchrun) save and exit 130/143, the out_dir checked before the
first step, a failed save keeps the previous checkpoint, incomplete and old checkpoints refused in one line, the log
cut back to the checkpoint on resume.

Tiny models on tiny datasets (tests/_train_util.py); the DDP and signal tests run the real command line.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import runs
import train
from _train_util import (assert_identical, assert_one_line_error, flags, load, make_pattern_dataset,
                         read_log, run_main, run_python, signal_after_log_lines)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return make_pattern_dataset(tmp_path_factory.mktemp('data'), n_train=4000, n_eval=300)



def comparable(ckpt):
    return {k: v for k, v in ckpt.items() if k != 'train_config'}


def logged(out_dir):
    """Every logged value but the timings."""
    return [{k: v for k, v in r.items() if k not in ('tokens_per_sec', 'mfu')} for r in read_log(out_dir)]


def torchrun(args, timeout=300):
    return run_python(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py'] + args,
                      timeout=timeout)


# -----------------------------------------------------------------------------------------------------------
# DDP resume


def test_ddp_resume_is_exact_on_every_rank(data_dir, tmp_path):
    """2 gloo ranks, dropout on: 4 steps straight == 2 steps, stop, resume to 4 (every rank restores its own RNG
    state and memory; before, rank 1's RNG state was a view into the stacked tensor and set_rng_state refused it)."""
    common = dict(max_iters=4, eval_interval=2, dropout=0.1, dropatt=0.1, eval_tokens=64, lr_decay_iters=4)
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    for out_dir, extra in ((straight, {}), (split, dict(max_iters=2)), (split, dict(init_from='resume'))):
        proc = torchrun(flags(data_dir, out_dir, **{**common, **extra}))
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = load(straight / 'ckpt.pt'), load(split / 'ckpt.pt')
    assert a['step'] == 4 and a['world_size'] == 2
    assert not torch.equal(a['rng']['cpu'][0], a['rng']['cpu'][1])
    assert_identical(comparable(a), comparable(b))
    assert logged(straight) == logged(split)


# -----------------------------------------------------------------------------------------------------------
# One run per out_dir


def test_a_new_run_never_overwrites_a_checkpoint(data_dir, tmp_path, capsys):
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, max_iters=2))
    before = (out_dir / 'ckpt.pt').read_bytes()
    code, _, err = run_main(flags(data_dir, out_dir, max_iters=3), capsys)
    assert code == 2
    assert_one_line_error(err, 'ckpt.pt exists', '--init_from=resume', '--overwrite=True')
    assert (out_dir / 'ckpt.pt').read_bytes() == before
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', overwrite=True), capsys)
    assert code == 2
    assert_one_line_error(err, 'overwrite=True starts over')
    assert train.train(flags(data_dir, out_dir, max_iters=1, overwrite=True))['step'] == 1   # starts over
    assert load(out_dir / 'ckpt.pt')['step'] == 1 and [r['step'] for r in read_log(out_dir)] == [1, 1]


def test_keep_checkpoints_keeps_every_eval_and_overwrite_removes_them(data_dir, tmp_path):
    """--keep_checkpoints=True: each evaluation's checkpoint stays as ckpt_STEP.pt (loss against steps), equal to the
    ckpt.pt of a run stopped there; a run started over with --overwrite=True leaves none of the old ones."""
    out_dir, short = tmp_path / 'out', tmp_path / 'short'
    common = dict(eval_interval=2, eval_tokens=64, lr_decay_iters=4)
    train.train(flags(data_dir, out_dir, max_iters=4, keep_checkpoints=True, **common))
    assert sorted(p.name for p in out_dir.glob('ckpt*.pt')) == ['ckpt.pt', 'ckpt_2.pt', 'ckpt_4.pt']
    train.train(flags(data_dir, short, max_iters=2, **common))
    kept, stopped = load(out_dir / 'ckpt_2.pt'), load(short / 'ckpt.pt')
    assert kept['step'] == 2
    assert_identical(kept['model'], stopped['model'])
    assert load(out_dir / 'ckpt_4.pt')['step'] == 4
    assert not list(short.glob('ckpt_*.pt'))                          # off by default
    train.train(flags(data_dir, out_dir, max_iters=1, overwrite=True))
    assert sorted(p.name for p in out_dir.glob('ckpt*.pt')) == ['ckpt.pt']


def test_a_second_live_run_in_the_same_out_dir_is_refused(data_dir, tmp_path, capsys):
    import fcntl
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    with open(out_dir / 'lock', 'a') as held:                    # another run holds the out_dir...
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = run_main(flags(data_dir, out_dir), capsys)
        assert code == 2
        assert_one_line_error(err, 'another run is using', str(out_dir))
        assert not (out_dir / 'log.jsonl').exists()
    # ...a run that was killed (-9) holds nothing: the kernel drops its lock
    holder = subprocess.Popen([sys.executable, '-c', 'import fcntl, sys, time; f = open(sys.argv[1], "a"); '
                               'fcntl.flock(f, fcntl.LOCK_EX); print("held", flush=True); time.sleep(600)',
                               str(out_dir / 'lock')], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        code, _, err = run_main(flags(data_dir, out_dir), capsys)
        assert code == 2 and 'another run is using' in err
    finally:
        holder.kill()
        holder.wait()
    assert train.train(flags(data_dir, out_dir, max_iters=1))['step'] == 1
    assert train.train(flags(data_dir, out_dir, max_iters=2, init_from='resume'))['step'] == 2   # released at the end


def test_temporary_files_are_per_process_and_stale_ones_removed(data_dir, tmp_path, monkeypatch):
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, max_iters=1))
    stale = [out_dir / 'ckpt.pt.tmp', out_dir / 'ckpt.pt.999999.tmp', out_dir / 'best.pt.tmp']
    for path in stale:
        path.write_bytes(b'half a checkpoint')                     # what kill -9 during a save leaves
    names = []
    real_save = torch.save
    monkeypatch.setattr(torch, 'save', lambda obj, f, *a, **k: (names.append(f.name), real_save(obj, f, *a, **k)))
    train.train(flags(data_dir, out_dir, max_iters=2, init_from='resume'))
    assert not list(out_dir.glob('*.tmp'))
    assert names and all(name.endswith(f'.{os.getpid()}.tmp') for name in names), names


# -----------------------------------------------------------------------------------------------------------
# Non-finite values never reach a checkpoint or the log


def test_nan_validation_loss_is_not_saved_and_the_log_stays_json(data_dir, tmp_path, capsys):
    """An update that diverges on an eval step: the eval loss is NaN, ckpt.pt keeps the last good weights, the
    message names it with its step, and log.jsonl stays strict JSON (null, not a bare NaN)."""
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, max_iters=4, eval_interval=2))
    before = {name: (out_dir / name).read_bytes() for name in ('ckpt.pt', 'best.pt')}
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=30, learning_rate=1e30,
                                  eval_interval=1), capsys)
    assert code == 2
    last = assert_one_line_error(err.splitlines()[-1], 'at step 5', 'not saved',
                                 f"The last good checkpoint is {out_dir / 'ckpt.pt'} (step 4)")
    assert 'Traceback' not in err, last
    for name, content in before.items():
        assert (out_dir / name).read_bytes() == content, name
    text = (out_dir / 'log.jsonl').read_text()
    records = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in log.jsonl"))
               for line in text.splitlines()]
    assert records[-1]['step'] == 5 and records[-1]['validation/loss'] is None


def test_weights_gone_non_finite_are_not_saved_at_an_interrupt(data_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C right after a diverging update (its loss was still finite): the checkpoint is not overwritten."""
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, max_iters=2))
    before = (out_dir / 'ckpt.pt').read_bytes()
    real_step = train.train_step

    def step(run, parts, *args):
        loss = real_step(run, parts, *args)
        with torch.no_grad():
            next(parts.raw_model.parameters()).fill_(float('inf'))
        signal.raise_signal(signal.SIGINT)
        return loss

    monkeypatch.setattr(train, 'train_step', step)
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=10), capsys)
    assert code == 2
    assert_one_line_error(err.splitlines()[-1], 'weights are not finite after step 3', 'not saved', '(step 2)')
    assert (out_dir / 'ckpt.pt').read_bytes() == before


# -----------------------------------------------------------------------------------------------------------
# Signals


def test_sigterm_saves_and_exits_143(data_dir, tmp_path):
    out_dir = tmp_path / 'out'
    code, out, err = signal_after_log_lines(
        [sys.executable, 'train.py'] + flags(data_dir, out_dir, max_iters=100000, eval_interval=100000), out_dir, 2,
        signal.SIGTERM)
    assert code == 143, err
    assert 'Traceback' not in err and 'SIGTERM: finishing this step' in out
    ckpt = load(out_dir / 'ckpt.pt')
    assert ckpt['step'] == ckpt['data_position'] == read_log(out_dir)[-1]['step'] >= 2


def test_a_second_signal_stops_at_once_in_one_line(data_dir, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, max_iters=2))
    before = (out_dir / 'ckpt.pt').read_bytes()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    real_step = train.train_step

    def step(*args):
        signal.raise_signal(signal.SIGTERM)                         # finish this step and save...
        signal.raise_signal(signal.SIGTERM)                         # ...no: stop now
        return real_step(*args)

    monkeypatch.setattr(train, 'train_step', step)
    code, out, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=10), capsys)
    assert code == 143
    assert 'Traceback' not in err
    assert err.strip().splitlines()[-1] == ("SIGTERM: stopped at once, without saving (the checkpoints in out_dir "
                                            "are kept)")
    assert (out_dir / 'ckpt.pt').read_bytes() == before and not list(out_dir.glob('*.tmp'))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    monkeypatch.undo()
    assert train.train(flags(data_dir, out_dir, init_from='resume', max_iters=3))['step'] == 3   # lock released


def test_sigint_under_torchrun_saves_once(data_dir, tmp_path):
    """Ctrl-C to torchrun, which forwards SIGINT to the workers: they agree on the step, rank 0 saves it, no
    worker prints a traceback (torchrun itself still reports the signal), and the run resumes."""
    out_dir = tmp_path / 'out'
    args = flags(data_dir, out_dir, max_iters=100000, eval_interval=100000, lr_decay_iters=1000)
    code, out, err = signal_after_log_lines([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                             '--nproc_per_node=2', 'train.py'] + args, out_dir, 3, signal.SIGINT,
                                            timeout=120)
    assert code != 0
    assert out.count('continue with --init_from=resume') == 1, out
    assert 'train.py", line' not in err and 'runs.py", line' not in err, err[-3000:]
    ckpt = load(out_dir / 'ckpt.pt')
    stopped = ckpt['step']
    assert stopped == ckpt['data_position'] == read_log(out_dir)[-1]['step'] >= 3
    assert ckpt['memory'][0]['mem'].shape[0] == 2
    proc = torchrun(flags(data_dir, out_dir, max_iters=stopped + 1, init_from='resume', lr_decay_iters=1000))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load(out_dir / 'ckpt.pt')['step'] == stopped + 1


# -----------------------------------------------------------------------------------------------------------
# The out_dir before the first step, the disk at save time


@pytest.mark.parametrize('case', ['file', 'under-a-file', 'read-only', 'proc'])
def test_an_unusable_out_dir_is_one_line_before_training(case, data_dir, tmp_path, capsys):
    if case == 'read-only' and os.geteuid() == 0:
        pytest.skip('root may write anywhere')
    if case == 'proc' and not os.path.isdir('/proc/self'):
        pytest.skip('no /proc')
    (tmp_path / 'a_file').write_text('x')
    out_dir = {'file': tmp_path / 'a_file', 'under-a-file': tmp_path / 'a_file' / 'out',
               'read-only': tmp_path / 'ro', 'proc': Path('/proc/self')}[case]     # a directory no one may write in
    if case == 'read-only':
        out_dir.mkdir(mode=0o555)
    code, out, err = run_main(flags(data_dir, out_dir), capsys)
    assert code == 2
    assert_one_line_error(err, str(out_dir))
    assert 'parameters' not in out                                  # nothing was built or trained


def test_a_full_disk_at_save_time_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / 'out'
    train.train(flags(data_dir, out_dir, max_iters=2))
    before = (out_dir / 'ckpt.pt').read_bytes()
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):                         # what torch.save raises on a full disk
        real_save(obj, f, *args, **kwargs)
        f.truncate(100)
        raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598')

    monkeypatch.setattr(torch, 'save', full_disk)
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume', max_iters=4), capsys)
    assert code == 2
    assert_one_line_error(err.splitlines()[-1], 'cannot write', 'ckpt.pt', 'GiB free',
                          'previous checkpoint there is kept')
    assert (out_dir / 'ckpt.pt').read_bytes() == before and not list(out_dir.glob('*.tmp'))


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
def test_save_checkpoint_on_a_full_device_is_a_user_error(tmp_path):
    """The kernel's ENOSPC, for real: the temporary file is a link to /dev/full."""
    path = tmp_path / 'ckpt.pt'
    runs.save_checkpoint({'format': runs.CKPT_FORMAT, 'step': 1}, path)
    before = path.read_bytes()
    (tmp_path / f'ckpt.pt.{os.getpid()}.tmp').symlink_to('/dev/full')
    with pytest.raises(train.UserError, match='No space left on device'):
        runs.save_checkpoint({'format': runs.CKPT_FORMAT, 'step': 2, 'w': torch.zeros(10000)}, path)
    assert path.read_bytes() == before and not list(tmp_path.glob('*.tmp'))


# -----------------------------------------------------------------------------------------------------------
# Checkpoints that cannot be resumed, and the log on resume


def test_an_incomplete_or_other_format_checkpoint_is_one_line(data_dir, tmp_path, capsys):
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    torch.save({'format': runs.CKPT_FORMAT}, out_dir / 'ckpt.pt')
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume'), capsys)
    assert code == 2
    assert_one_line_error(err, 'is incomplete', 'model_name', 'model_config')
    torch.save({'format': 'nanomem-checkpoint-0', 'model': {}}, out_dir / 'ckpt.pt')
    code, _, err = run_main(flags(data_dir, out_dir, init_from='resume'), capsys)
    assert code == 2
    assert_one_line_error(err, 'nanomem-checkpoint-0', f'reads {runs.CKPT_FORMAT}')


def test_resume_cuts_the_log_back_to_the_checkpoint(data_dir, tmp_path):
    """Killed after logging steps the checkpoint does not hold (and in the middle of a line): the resumed run's
    log.jsonl is the straight run's, with no step twice."""
    common = dict(max_iters=6, eval_interval=3, dropout=0.1, lr_decay_iters=6)
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    train.train(flags(data_dir, straight, **common))
    train.train(flags(data_dir, split, **dict(common, max_iters=3)))
    with open(split / 'log.jsonl', 'a') as f:                        # what a kill at step 5 leaves behind
        f.write('{"step": 4, "train/loss": 1.0}\n{"step": 5, "train/loss": 1.0}\n{"step": 5, "tra')
    train.train(flags(data_dir, split, **dict(common, init_from='resume')))
    assert logged(split) == logged(straight)
