"""Helpers shared by tests/test_train.py and tests/test_sample.py: tiny datasets in the real on-disk format, flag
lists for tiny models, subprocess runs of the scripts, and exact comparison of checkpoints."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent

# A tiny Transformer-XL: every architecture flag given, so nothing depends on model_xl.py's (paper-sized) defaults.
TINY_XL = dict(vocab_size=256, n_layer=1, n_head=2, n_embd=16, d_head=8, d_inner=32, seg_len=8, mem_len=16,
               dropout=0.0, dropatt=0.0)


def pattern_tokens(n, vocab=256, period=16, noise=0.05, seed=0):
    """A learnable stream: one random period-`period` motif (the same for every split) repeated, with a fraction
    `noise` of random tokens (drawn with `seed`)."""
    motif = np.random.default_rng(12345).integers(0, vocab, period)
    rng = np.random.default_rng(seed)
    tokens = motif[np.arange(n) % period]
    flip = rng.random(n) < noise
    tokens[flip] = rng.integers(0, vocab, int(flip.sum()))
    return tokens.astype(np.uint16)


def write_dataset(data_dir, train, validation, test=None, doc_starts=None, vocab_size=256, words=None):
    """The layout data/<name>/prepare.py writes: <split>.bin (flat uint16), train_docs.npy (int64 document starts),
    meta.json with vocab_size and splits.<split>.words."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    test = validation if test is None else test
    splits = {}
    for name, tokens in (('train', train), ('validation', validation), ('test', test)):
        tokens = np.asarray(tokens, dtype=np.uint16)
        tokens.tofile(data_dir / f'{name}.bin')
        splits[name] = {'tokens': len(tokens), 'words': int(words[name]) if words else max(1, len(tokens) // 3)}
    if doc_starts is None:
        doc_starts = np.arange(0, len(train), 100)
    np.save(data_dir / 'train_docs.npy', np.asarray(doc_starts, dtype=np.int64))
    (data_dir / 'meta.json').write_text(json.dumps({'vocab_size': vocab_size, 'splits': splits}))
    return data_dir


def make_pattern_dataset(data_dir, n_train=4000, n_eval=500, **kw):
    return write_dataset(data_dir, pattern_tokens(n_train, **kw), pattern_tokens(n_eval, seed=1, **kw),
                         pattern_tokens(n_eval, seed=2, **kw))


def flags(data_dir, out_dir, model=TINY_XL, **overrides):
    """--name=value flags for a tiny run: model fields, then quiet train defaults, then overrides."""
    values = dict(model)
    values.update(data_dir=str(data_dir), out_dir=str(out_dir), batch_size=2, max_iters=4, eval_interval=1000,
                  log_interval=1, learning_rate=1e-3, device='cpu', compile=False)
    values.update(overrides)
    return [f'--{k}={v}' for k, v in values.items()]


# A prompt/training text for the GPT-2-vocabulary checkpoints of tests/test_sample.py and test_models_train.py
TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
        "it was the season of Darkness, it was the spring of hope, it was the winter of despair. ")


ENV = dict(os.environ, PYTHONUNBUFFERED='1', PYTHONIOENCODING='utf-8', OMP_NUM_THREADS='1')


def default_sigint():
    """preexec_fn of a child the test sends SIGINT: Ctrl-C at its default, as in a terminal, even where the suite
    runs with SIGINT ignored (`make test &`, nohup, a job runner), which the child would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_python(args, timeout=120, text=True):
    """`python args...` in a fresh process, in the repository root (where train.py and sample.py live).
    text=False returns stdout as bytes (no newline translation)."""
    return subprocess.run([sys.executable] + list(args), cwd=ROOT, env=ENV, capture_output=True, text=text,
                          timeout=timeout)


def assert_one_line_error(stderr, *fragments):
    """A user error is reported as one `error: ...` line, never a traceback."""
    assert 'Traceback' not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith('error: '), stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def load(path):
    return torch.load(path, map_location='cpu', weights_only=True)


def read_log(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / 'log.jsonl').read_text().splitlines()]


def assert_identical(a, b, where='ckpt'):
    """Bit-identical nested structures of tensors and plain values (NaN-free)."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a, b), f"{where} differs (max abs diff {(a.double() - b.double()).abs().max()})"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (where, sorted(a.keys() ^ b.keys(), key=str))
        for k in a:
            assert_identical(a[k], b[k], f'{where}[{k!r}]')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f'{where}[{i}]')
    else:
        assert a == b, (where, a, b)


def run_main(argv, capsys, main=None):
    """train.main (or another script's main) in-process -> (exit code, stdout, stderr of this call only); user errors
    must exit with 2. A fresh process costs seconds of imports: one command-line case per script is enough."""
    import pytest
    import train
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        (main or train.main)(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def assert_bad_input_is_one_line(script, main, base_args, cases, capsys):
    """Each (args, fragment) of cases exits 2 with one `error:` line naming fragment: the first from the command line
    (a fresh process: `python script ...`), the others in-process through main, which costs no imports."""
    (args, fragment), *rest = cases
    r = run_python([script, *base_args, *args])
    assert r.returncode == 2
    assert_one_line_error(r.stderr, fragment)
    for args, fragment in rest:
        code, _, err = run_main([*base_args, *args], capsys, main)
        assert code == 2
        assert_one_line_error(err, fragment)


def signal_after_log_lines(command, out_dir, n_lines, signum, timeout=60, start_timeout=120):
    """Run command (a list, from the repository root) until out_dir/log.jsonl has n_lines lines (training has
    started, the signal handlers are set), send it signum, and wait. -> (exit status, stdout, stderr)"""
    import time
    proc = subprocess.Popen(command, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    log = Path(out_dir) / 'log.jsonl'
    try:
        deadline = time.time() + start_timeout
        while not (log.exists() and log.read_text().count('\n') >= n_lines):
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "training did not start"
            time.sleep(0.1)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err
