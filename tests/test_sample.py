"""
CPU tests for sample.py (SPEC §6): a tiny GPT-2-vocabulary Transformer-XL checkpoint (vocab_size 50304,
n_embd 16, seg_len 8) made by train.py; string and FILE: prompts, the prompt fed through memory, several samples,
greedy determinism, bad input, and the streaming UTF-8 decoder.

Greedy output is compared with Model.generate over the whole prompt computed here, so a prompt that does not
reach the memory (or reaches it out of order) is caught, not only a crash.
"""
import contextlib
import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import sample
import train
from _train_util import (ENV, ROOT, TEXT, TINY_XL, assert_one_line_error, default_sigint, flags, run_python,
                         write_dataset)
from data.tokenizer import gpt2_tokenizer

# init_std 0.3 and a tiny lr keep the model far from "repeat the likeliest token": its greedy output depends on
# the context, so a prompt that misses the memory changes it
GPT2_XL = dict(TINY_XL, vocab_size=50304, init_std=0.3)
SEPARATOR = '-' * 40 + '\n'


@pytest.fixture(scope='module')
def ckpt_dir(tmp_path_factory, enc):
    """A checkpoint of a tiny GPT-2-vocabulary Transformer-XL trained for 2 steps on GPT-2 tokens."""
    root = tmp_path_factory.mktemp('sample')
    tokens = np.array(enc.encode_ordinary(TEXT * 6), dtype=np.uint16)
    data = write_dataset(root / 'data', tokens, tokens[:100], vocab_size=enc.n_vocab)
    out_dir = root / 'out'
    train.train(flags(data, out_dir, GPT2_XL, max_iters=2, learning_rate=1e-4))
    return out_dir


@pytest.fixture(scope='module')
def model(ckpt_dir):
    _, _, model = train.model_from_checkpoint(train.load_checkpoint(ckpt_dir / 'ckpt.pt'))
    return model.eval()


def decode(enc, tokens):
    """What the Streamer must print for these tokens (ids past GPT-2's 50257 print as U+FFFD)."""
    raw = b''.join(enc.decode_single_token_bytes(t) if t < enc.n_vocab else b'\xef\xbf\xbd' for t in tokens)
    return raw.decode('utf-8', errors='replace')


def greedy(model, tokens, n, memory=None):
    out = model.generate(torch.tensor([tokens]), n, temperature=0.0, memory=memory)
    return out[0, len(tokens):].tolist()


def run_sample(args):
    proc = run_python(['sample.py'] + args, text=False)
    stderr = proc.stderr.decode('utf-8', errors='replace')
    assert proc.returncode == 0, stderr
    assert 'Traceback' not in stderr
    return proc.stdout.decode('utf-8'), stderr


def test_string_prompt_two_greedy_samples(ckpt_dir, model, enc):
    """--start=text: every sample echoes the prompt, then continues it; with temperature 0 both samples are the
    greedy continuation (the second does not see the first's memory)."""
    prompt = 'It was the age of'
    stdout, _ = run_sample([f'--out_dir={ckpt_dir}', f'--start={prompt}', '--num_samples=2', '--temperature=0',
                            '--max_new_tokens=12', '--device=cpu'])
    expected = prompt + decode(enc, greedy(model, enc.encode(prompt), 12)) + '\n'
    assert stdout == expected + SEPARATOR + expected


@pytest.mark.parametrize('flag, device_type, asked', [(True, 'cuda', True), (False, 'cuda', False),
                                                      (True, 'cpu', False)])
def test_cuda_graph_is_asked_for_on_cuda_unless_turned_off(ckpt_dir, monkeypatch, capsys, flag, device_type, asked):
    """--cuda_graph (default True) reaches generate() on CUDA only (the device is faked: the model runs on the CPU)."""
    import model_xl
    seen, generate = [], model_xl.Model.generate

    def recording(self, *args, **kwargs):
        seen.append(kwargs.pop('cuda_graph', False))
        return generate(self, *args, **kwargs)
    monkeypatch.setattr(model_xl.Model, 'generate', recording)
    monkeypatch.setattr(sample, 'resolve_device', lambda name: ('cpu', device_type))
    sample.main([f'--out_dir={ckpt_dir}', '--max_new_tokens=3', '--temperature=0', '--dtype=float32',
                 f'--cuda_graph={flag}'])
    assert seen == [asked]


def test_a_checkpoint_saved_with_the_triton_kernel_samples_off_cuda(ckpt_dir, model, enc, tmp_path, monkeypatch,
                                                                      capsys):
    """attn_kernel='triton' runs on CUDA only; off it sample.py runs the same attention written out (einsum), also
    where triton is not installed: the same greedy tokens as the checkpoint's own kernel."""
    ckpt = train.load_checkpoint(ckpt_dir / 'ckpt.pt')
    ckpt['model_config']['attn_kernel'] = 'triton'
    (tmp_path / 'out').mkdir()
    torch.save(ckpt, tmp_path / 'out' / 'ckpt.pt')
    import model_xl
    kernels, generate = [], model_xl.Model.generate

    def recording(self, *args, **kwargs):
        kernels.append(self.config.attn_kernel)
        return generate(self, *args, **kwargs)
    monkeypatch.setattr(model_xl.Model, 'generate', recording)
    prompt = 'It was the age of'
    sample.main([f'--out_dir={tmp_path / "out"}', f'--start={prompt}', '--max_new_tokens=6', '--temperature=0',
                 '--dtype=float32', '--device=cpu'])
    assert kernels == ['einsum']
    assert capsys.readouterr().out.startswith(prompt + decode(enc, greedy(model, enc.encode(prompt), 6)))


@pytest.mark.parametrize('mem_len', [-1, 40])
def test_file_prompt_goes_through_memory(ckpt_dir, model, enc, tmp_path, mem_len):
    """A FILE: prompt of ~8 segments is read segment by segment into the memory: greedy output equals generate()
    over the whole prompt, and differs from a model that would see only the last partial segment. --mem_len
    (longer than training's) is the memory used while sampling."""
    path = tmp_path / 'book.txt'
    path.write_text(TEXT[:330], encoding='utf-8')
    tokens = enc.encode(path.read_text(encoding='utf-8'))
    T = model.config.seg_len
    n_full = (len(tokens) - 1) // T
    assert n_full >= 6
    stdout, stderr = run_sample([f'--out_dir={ckpt_dir}', f'--start=FILE:{path}', '--temperature=0',
                                 '--max_new_tokens=16', f'--mem_len={mem_len}', '--device=cpu'])
    assert f'[{n_full * T:,} prompt tokens in memory' in stderr
    memory = model.init_memory(1, 'cpu', **({} if mem_len == -1 else {'mem_len': mem_len}))
    expected = greedy(model, tokens, 16, memory)
    assert stdout == decode(enc, expected) + '\n'                    # FILE: prompts are not echoed
    assert expected != greedy(model, tokens[n_full * T:], 16)          # the memory matters for this prompt
    if mem_len != -1:
        assert expected != greedy(model, tokens, 16)                  # and so does its length


BAD_INPUT = [
    (['--temprature=0.5'], ['unknown flag --temprature', 'did you mean --temperature?']),
    (['--n_layer=2'], ['unknown flag --n_layer']),                     # model flags come from the checkpoint
    (['--num_samples=two'], ['--num_samples takes an int']),
    (['--num_samples=0'], ['num_samples must be >= 1']),
    (['--temperature=-1'], ['temperature']),
    (['--temperature=nan'], ['--temperature takes a finite float']),   # today: NaN probabilities, a traceback
    (['--temperature=inf'], ['--temperature takes a finite float']),
    (['--temperature=1e-40'], ['temperature must be 0 (greedy) or', '>= 0.01']),   # logits / T overflow to inf
    (['--top_k=-1'], ['top_k must be >= 0']),
    (['--mem_len=-2'], ['mem_len >= -1']),
    ([f'--seed={2**70}'], ['seed must be a 64-bit integer']),
    ([f'--mem_len={10**13}'], [f'--mem_len={10**13} does not fit in memory']),
    (['--start=FILE:/nonexistent/book.txt'], ['cannot read prompt file', '/nonexistent/book.txt']),
    (['--ckpt=best_of_all.pt'], ['no checkpoint at', 'best_of_all.pt']),
    (['--device=gpu'], ['gpu']),                                       # today: a RuntimeError traceback
]


@pytest.mark.parametrize('bad, fragments', BAD_INPUT, ids=[bad[0] for bad, _ in BAD_INPUT])
def test_bad_input_gives_one_line_errors(bad, fragments, ckpt_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        sample.main([f'--out_dir={ckpt_dir}', '--max_new_tokens=2', '--device=cpu'] + bad)
    assert exc.value.code == 2
    assert_one_line_error(capsys.readouterr().err, *fragments)


def test_missing_checkpoint_on_the_command_line(tmp_path):
    proc = run_python(['sample.py', f'--out_dir={tmp_path}', '--start=hi'])
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, 'no checkpoint at', str(tmp_path))


def test_checkpoint_without_gpt2_vocabulary_is_refused(tmp_path, capsys):
    tokens = np.arange(300) % 256
    data = write_dataset(tmp_path / 'data', tokens, tokens[:50])
    train.train(flags(data, tmp_path / 'out', TINY_XL, max_iters=1))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        sample.main([f'--out_dir={tmp_path / "out"}', '--device=cpu'])
    assert exc.value.code == 2
    assert_one_line_error(capsys.readouterr().err, 'vocab_size=256', 'GPT-2')


def test_streamer_holds_a_character_split_across_tokens(enc):
    text = 'a 🙂 naïve 中文 b'
    tokens = enc.encode(text)
    pieces = [enc.decode_single_token_bytes(t) for t in tokens]
    assert any(len(p) and not _is_complete_utf8(p) for p in pieces)   # some character really is split
    out = io.StringIO()
    streamer = sample.Streamer(gpt2_tokenizer(), out)
    for t in tokens:
        streamer(torch.tensor([[t]]))
        assert '\ufffd' not in out.getvalue()                          # never a half character
    streamer.close()
    assert out.getvalue() == text
    # a partial character written first: nothing is printed until it is complete
    first = next(i for i, p in enumerate(pieces) if not _is_complete_utf8(p))
    out = io.StringIO()
    streamer = sample.Streamer(gpt2_tokenizer(), out)
    for t in tokens[:first + 1]:
        streamer(torch.tensor([[t]]))
    assert out.getvalue() == decode(enc, tokens[:first])


def test_streamer_replaces_padding_ids_and_flushes_a_dangling_byte(enc):
    out = io.StringIO()
    streamer = sample.Streamer(gpt2_tokenizer(), out)
    streamer(torch.tensor([[enc.encode('x')[0]]]))
    streamer(torch.tensor([[50300]]))                                # a padding id (vocab_size 50304 > 50257)
    streamer(torch.tensor([[enc.encode('🙂')[0]]]))                   # the first half of an emoji, then the end
    streamer.close()
    assert out.getvalue() == 'x\ufffd\ufffd'


def _is_complete_utf8(raw):
    try:
        raw.decode('utf-8')
        return True
    except UnicodeDecodeError:
        return False


def test_output_follows_sys_stdout(ckpt_dir, model, enc):
    """sample() called in-process writes everything to the current sys.stdout (redirect_stdout, a notebook).
    Today the prompt and separators follow sys.stdout but the streamed text goes to the sys.stdout of import
    time, because Streamer's default `out=sys.stdout` is bound when sample.py is imported."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        sample.sample([f'--out_dir={ckpt_dir}', '--start=It was', '--temperature=0', '--max_new_tokens=5',
                       '--device=cpu'])
    assert buffer.getvalue() == 'It was' + decode(enc, greedy(model, enc.encode('It was'), 5)) + '\n'


def wait_for_torch_import(proc):
    """Until proc is importing torch: sample.py's own Ctrl-C handler is in place by then, and a Ctrl-C is a
    one-line exit from there on (before it, during Python's own start, it would not be). Seen in /proc/PID/maps, once
    torch's first library is mapped; where there is no /proc, 0.3 s."""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with open(f'/proc/{proc.pid}/maps') as maps:
                if 'libtorch' in maps.read():
                    return
        except OSError:
            time.sleep(0.3)
            return
        time.sleep(0.002)


@pytest.mark.parametrize('when', ['while sampling', 'while starting'])
def test_ctrl_c_is_one_line_and_keeps_the_text(when, ckpt_dir, model, enc):
    """Ctrl-C: exit status 130, one line on stderr and no traceback, whether it comes while text streams out or
    while torch is still being imported; the text written so far stays on stdout, and it is the sample's."""
    prompt = 'It was the age of'
    proc = subprocess.Popen([sys.executable, 'sample.py', f'--out_dir={ckpt_dir}', f'--start={prompt}',
                             '--temperature=0', '--max_new_tokens=100000', '--device=cpu'],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)          # Ctrl-C at its default, even under `make test &`
    try:
        if when == 'while sampling':
            head = b''
            while len(head) < len(prompt) + 20:                      # the prompt, then some of the sample
                chunk = os.read(proc.stdout.fileno(), 1000)
                assert chunk, proc.stderr.read().decode()
                head += chunk
        else:
            head = b''
            wait_for_torch_import(proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    out, err = (head + out).decode('utf-8', errors='replace'), err.decode()
    assert proc.returncode == 130, err
    assert 'Traceback' not in err and [line for line in err.splitlines() if line.strip()] == ['interrupted (Ctrl-C)']
    if when == 'while sampling':
        expected = prompt + decode(enc, greedy(model, enc.encode(prompt), 300))
        assert len(out) > len(prompt) and out[:len(expected)] == expected[:len(out)]


def test_output_cut_short_by_its_reader_is_quiet(ckpt_dir):
    """`sample.py ... | head -c 50`: when the reader of stdout goes away, exit 141 (128 + SIGPIPE), no traceback."""
    proc = subprocess.Popen([sys.executable, 'sample.py', f'--out_dir={ckpt_dir}', '--max_new_tokens=100000',
                             '--device=cpu'], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert os.read(proc.stdout.fileno(), 50)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 141 and err == '', err
