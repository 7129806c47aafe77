"""
Byte-level data end to end: the vocabulary comes from meta.json, evaluation reports bits per character
(bits per byte on GPT-2 data) computed by hand here, checkpoints carry their tokenizer, sample.py decodes byte and
character checkpoints, every model file trains on bytes unchanged, and bench/evalspeed.py's two evaluations agree
where they must.
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import sample
import train
from _models import TINY_MODELS
from _train_util import assert_one_line_error, flags, read_log
from data import shards
from data.tokenizer import EOT, bytes_tokenizer, chars_tokenizer, get_encoding, gpt2_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))
import evalspeed  # noqa: E402

TEXT = ("ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
        "Arise, fair sun, and kill the envious moon, who is already sick and pale with grief. ")


def byte_dataset(root, texts=(TEXT * 30, TEXT * 20), validation=(TEXT * 3,), tokenizer=None):
    """A prepared dataset in the real format, written by data/shards.py with the byte tokenizer."""
    tokenizer = tokenizer or bytes_tokenizer()

    def encode(text):
        return shards.encode_doc(text, words=len(text.split()), tokenizer=tokenizer)

    splits = {'train': list(texts), 'validation': list(validation), 'test': list(validation)}
    shards.write_dataset(str(root), splits, encode, dataset='fixture', source='test', word_rule='split',
                         tokenizer=tokenizer)
    return Path(root)


class ZeroLogits(nn.Module):
    """Uniform predictions over `vocab` tokens: every target costs ln(vocab) nats."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def init_memory(self, batch_size, device, mem_len=None):
        return None

    def forward(self, x, memory, targets=None):
        return torch.zeros(*x.shape, self.vocab), None, memory, {}


def evaluate(model, evalset):
    cfg = train.TrainConfig(batch_size=1, eval_batch_size=1)
    model_cfg = train.import_model('xl').Config(vocab_size=256, n_layer=1, n_head=1, n_embd=8, d_head=8,
                                                 d_inner=8, seg_len=4, mem_len=0)
    return train.evaluate(model, evalset, train.Run(cfg), model_cfg)


# -----------------------------------------------------------------------------------------------------------
# bits per character, by hand


def test_bpc_on_bytes_is_total_bits_over_text_bytes():
    """'ab' EOT 'cde' EOT: 6 targets (b, EOT, c, d, e, EOT), 4 of them text bytes, 8 bits each at uniform 256."""
    data = np.array([97, 98, 0, 99, 100, 101, 0], dtype=np.uint16)
    tok = bytes_tokenizer()
    out = evaluate(ZeroLogits(256), train.EvalSet(data, byte_lengths=tok.byte_lengths(), unit='bpc'))
    assert out['tokens'] == 6 and out['loss'] == pytest.approx(math.log(256))
    assert out['bpc'] == pytest.approx(6 * 8 / 4) and 'bpb' not in out


def test_bpb_on_gpt2_tokens_counts_the_bytes_each_token_spells():
    """'Hello world' EOT = [15496, 995, 50256]: targets ' world' (6 bytes) and EOT (0 bytes)."""
    data = np.array(get_encoding().encode_ordinary('Hello world') + [EOT], dtype=np.uint16)
    assert data.tolist() == [15496, 995, EOT]
    out = evaluate(ZeroLogits(50257), train.EvalSet(data, byte_lengths=gpt2_tokenizer().byte_lengths(), unit='bpb'))
    assert out['bpb'] == pytest.approx(2 * math.log2(50257) / 6) and 'bpc' not in out


def test_bpc_of_a_character_table():
    """text8's 27 symbols: every character is one byte, there is no end-of-document token."""
    tok = chars_tokenizer()
    data = np.array(tok.encode('the cat'), dtype=np.uint16)
    out = evaluate(ZeroLogits(27), train.EvalSet(data, byte_lengths=tok.byte_lengths(), unit='bpc'))
    assert out['bpc'] == pytest.approx(math.log2(27))


def test_no_tokenizer_in_meta_gives_no_bits_per_byte():
    data = np.arange(1, 20, dtype=np.uint16)
    out = evaluate(ZeroLogits(256), train.EvalSet(data))
    assert 'bpc' not in out and 'bpb' not in out


# -----------------------------------------------------------------------------------------------------------
# train.py on byte data


@pytest.fixture(scope='module')
def bytes_dir(tmp_path_factory):
    return byte_dataset(tmp_path_factory.mktemp('bytes'))


def test_vocabulary_comes_from_meta_and_eval_reports_bpc(bytes_dir, tmp_path, capsys):
    model = {k: v for k, v in TINY_MODELS['xl'].items() if k not in ('model', 'vocab_size')}
    out_dir = tmp_path / 'out'
    train.train(flags(bytes_dir, out_dir, model, max_iters=4, eval_interval=2))
    printed = capsys.readouterr()
    ckpt = torch.load(out_dir / 'ckpt.pt', weights_only=True)
    assert ckpt['model_config']['vocab_size'] == 256                  # not the GPT-2 default 50304
    assert ckpt['tokenizer'] == {'tokenizer': 'bytes', 'vocab_size': 256, 'eot_token': 0}
    evals = [r for r in read_log(out_dir) if 'validation/loss' in r]
    # the validation split is TEXT * 3 then EOT: every byte but the first is a target, and so is the EOT (0 bytes)
    n_bytes = len(TEXT * 3) - 1
    assert evals and all(r['validation/tokens'] == n_bytes + 1 for r in evals)
    for r in evals:
        assert r['validation/bpc'] == pytest.approx(r['validation/loss'] * (n_bytes + 1) / math.log(2) / n_bytes)
    assert 'bpc' in (printed.out + printed.err)


def test_vocab_size_flag_still_wins(bytes_dir, tmp_path):
    model = {k: v for k, v in TINY_MODELS['xl'].items() if k != 'model'}
    train.train(flags(bytes_dir, tmp_path / 'out', dict(model, vocab_size=320), max_iters=1))
    assert torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)['model_config']['vocab_size'] == 320


def test_resume_on_data_of_another_tokenizer_is_refused(bytes_dir, tmp_path, capsys):
    model = {k: v for k, v in TINY_MODELS['xl'].items() if k != 'model'}
    out_dir = tmp_path / 'out'
    train.train(flags(bytes_dir, out_dir, model, max_iters=1))
    chars = byte_dataset(tmp_path / 'chars', texts=('the cat sat on the mat ' * 40,), validation=('a cat ' * 20,),
                         tokenizer=chars_tokenizer())
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        train.main(flags(chars, out_dir, model, max_iters=2, init_from='resume'))
    assert exc.value.code == 2
    assert_one_line_error(capsys.readouterr().err, 'trained on bytes tokens', 'chars tokens')


def test_missing_byte_dataset_names_the_bytes_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.main(flags(tmp_path / 'gutenberg_bytes', tmp_path / 'out', TINY_MODELS['xl']))
    assert_one_line_error(capsys.readouterr().err, 'python data/gutenberg/prepare.py --tokenizer=bytes')


@pytest.mark.parametrize('name', sorted(TINY_MODELS))
def test_every_model_trains_at_byte_level(name, bytes_dir, tmp_path):
    """Each model file, unchanged, at the vocabulary meta.json gives: the loss falls, bpc is reported."""
    spec = dict(TINY_MODELS[name])
    if spec['model'] not in train.available_models():
        pytest.skip(f"model_{spec['model']}.py is not in the repository")
    spec.pop('vocab_size')
    out_dir = tmp_path / 'out'
    train.train(flags(bytes_dir, out_dir, spec, max_iters=40, eval_interval=40, learning_rate=3e-3))
    log = read_log(out_dir)
    losses = [r['train/loss'] for r in log if 'train/loss' in r]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
    final = [r for r in log if 'validation/bpc' in r][-1]
    assert 0 < final['validation/bpc'] < 8                            # below a uniform guess over 256 bytes
    assert torch.load(out_dir / 'ckpt.pt', weights_only=True)['model_config']['vocab_size'] == 256


# -----------------------------------------------------------------------------------------------------------
# sample.py


@pytest.fixture(scope='module')
def byte_ckpt(bytes_dir, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp('byte_run')
    model = {k: v for k, v in TINY_MODELS['xl'].items() if k not in ('model', 'vocab_size')}
    train.train(flags(bytes_dir, out_dir, model, max_iters=30, learning_rate=3e-3))
    return out_dir


def run_sample(capsys, *argv):
    sample.main(['--device=cpu', *argv])
    return capsys.readouterr().out


def test_sample_decodes_a_byte_checkpoint_greedily(byte_ckpt, capsys):
    prompt = 'ROMEO. But soft, what light'
    out = run_sample(capsys, f'--out_dir={byte_ckpt}', f'--start={prompt}', '--max_new_tokens=40',
                     '--temperature=0')
    _, _, model = train.model_from_checkpoint(train.load_checkpoint(byte_ckpt / 'ckpt.pt'))
    ids = model.eval().generate(torch.tensor([list(prompt.encode())]), 40, temperature=0.0)[0].tolist()
    assert out == bytes(ids).decode('utf-8', errors='replace') + '\n'


def test_sample_feeds_a_file_prompt_as_raw_bytes(byte_ckpt, capsys, tmp_path):
    """Invalid UTF-8 in the prompt file goes in as the bytes it is; what is printed never raises."""
    raw = (TEXT * 2).encode() + b'\xff\xfe caf\xc3\xa9 \xe2\x82'
    (tmp_path / 'p.bin').write_bytes(raw)
    out = run_sample(capsys, f'--out_dir={byte_ckpt}', f'--start=FILE:{tmp_path / "p.bin"}',
                     '--max_new_tokens=30', '--temperature=0')
    _, _, model = train.model_from_checkpoint(train.load_checkpoint(byte_ckpt / 'ckpt.pt'))
    ids = model.eval().generate(torch.tensor([list(raw)]), 30, temperature=0.0)[0, len(raw):].tolist()
    assert out == bytes(ids).decode('utf-8', errors='replace') + '\n'


def test_streamer_shows_invalid_bytes_as_replacement_characters():
    import io
    out = io.StringIO()
    streamer = sample.Streamer(bytes_tokenizer(), out)
    for b in (0xff, 0x41, 0xe2, 0x82, 0xac, 0xe2):                  # bad byte, 'A', '€' in 3 bytes, a cut '€'
        streamer(torch.tensor([[b]]))
    streamer.close()
    assert out.getvalue() == '\ufffdA€\ufffd'


def test_prompts_for_a_character_table_are_mapped_as_text8_was_made():
    tok = chars_tokenizer()
    assert sample.encode_prompt('Hello, World!\n'.encode(), tok) == tok.encode('hello  world  ')
    with pytest.raises(train.UserError, match='empty'):
        sample.encode_prompt(b'', tok)


# -----------------------------------------------------------------------------------------------------------
# bench/evalspeed.py: memory reused vs the vanilla sliding window


def xl(n_layer):
    module = train.import_model('xl')
    torch.manual_seed(0)
    cfg = module.Config(vocab_size=64, n_layer=n_layer, n_head=2, n_embd=16, d_head=8, d_inner=32, seg_len=32,
                        mem_len=8, dropout=0.0, dropatt=0.0, init_std=0.3)
    return module.Model(cfg).eval()


def test_evalspeed_methods_agree_exactly_with_one_layer():
    """One layer, segments of one token, memory L: each token attends to the embeddings of its L predecessors and
    itself, exactly the vanilla window of L + 1 tokens. With two layers the cached states differ (by design)."""
    tokens = np.random.default_rng(0).integers(0, 64, 80).astype(np.uint16)
    L, start, positions = 12, 20, 16
    reused, _ = evalspeed.memory_reused_nll(xl(1), tokens, start, positions, L, 1, 'cpu')
    vanilla, _ = evalspeed.vanilla_nll(xl(1), tokens, start, positions, L + 1, 5, 'cpu')
    torch.testing.assert_close(reused, vanilla, rtol=1e-5, atol=1e-5)
    wrong, _ = evalspeed.vanilla_nll(xl(1), tokens, start, positions, L, 5, 'cpu')
    assert not torch.allclose(reused, wrong, atol=1e-4)               # one key fewer is seen
    deep_reused, _ = evalspeed.memory_reused_nll(xl(2), tokens, start, positions, L, 1, 'cpu')
    deep_vanilla, _ = evalspeed.vanilla_nll(xl(2), tokens, start, positions, L + 1, 5, 'cpu')
    assert not torch.allclose(deep_reused, deep_vanilla, atol=1e-4)


def test_evalspeed_end_to_end(byte_ckpt, tmp_path):
    out = tmp_path / 'evalspeed.json'
    evalspeed.main([f'--runs={byte_ckpt}', '--lengths=8,16', '--positions=16', f'--out={out}', '--plot=False'])
    result = json.loads(out.read_text())
    assert result['unit'] == 'bpc' and [r['length'] for r in result['summary']] == [8, 16]
    for r in result['summary']:
        assert r['speedup'] > 0 and 0 < r['reused_bpc'] < 8 and 0 < r['vanilla_bpc'] < 8


def test_compression_bench_runs_each_variant_and_resumes(bytes_dir, tmp_path):
    """bench/compression.py through train.py subprocesses: a tiny base config, 2 variants x 1 seed; a second call
    finds the finished runs and trains nothing (their logs are untouched)."""
    import compression
    base = tmp_path / 'base.py'
    fields = dict(TINY_MODELS['compressive'], data_dir=str(bytes_dir), max_iters=3, eval_interval=3, batch_size=2,
                  compression_rate=2, learning_rate=1e-3)
    fields.pop('vocab_size')
    base.write_text(''.join(f'{k} = {v!r}\n' for k, v in fields.items()))
    argv = [f'--base={base}', '--variants=none,conv', '--seeds=1', f'--out_dir={tmp_path / "runs"}',
            f'--out={tmp_path / "c.json"}', '--plot=False']
    compression.main(argv)
    result = json.loads((tmp_path / 'c.json').read_text())
    assert {r['variant'] for r in result['runs']} == {'none', 'conv'}
    assert all(0 < r['bpc'] < 10 for r in result['runs']) and result['summary']['none']['vs_none'] == 0.0
    none_ckpt = torch.load(tmp_path / 'runs' / 'none_s1' / 'ckpt.pt', weights_only=True)
    assert none_ckpt['model_config']['cmem_len'] == 0                 # the control really has no compressed memory
    logs = {p: p.read_bytes() for p in (tmp_path / 'runs').glob('*/log.jsonl')}
    compression.main(argv)
    assert {p: p.read_bytes() for p in logs} == logs
    compression.main(argv + ['--variants=none', '--max_iters=5'])       # an unfinished run resumes its checkpoint
    steps = [json.loads(line)['step'] for line in (tmp_path / 'runs' / 'none_s1' / 'log.jsonl').read_text().splitlines()]
    assert steps[0] == 3 and steps[-1] == 5 and torch.load(tmp_path / 'runs' / 'none_s1' / 'ckpt.pt',
                                                            weights_only=True)['step'] == 5
