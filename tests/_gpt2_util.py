"""A tiny random GPT-2 in the Hugging Face hub format, for the tests of the GPT-2 forms (model_gpt2.py and the memory
forms built on it) and of pretrained.py: write_tiny_gpt2(dir) writes model.safetensors and config.json with
transformers' save_pretrained, as the hub's GPT-2 checkpoints are, and returns the GPT2LMHeadModel it wrote (in eval
mode) to compare with. transformers is a test-only dependency (requirements-test.txt)."""

from pathlib import Path

import pytest
import torch


def write_tiny_gpt2(dir, n_layer=2, n_head=2, n_embd=32, n_positions=64, seed=0, vocab_size=50257):
    """Write a random GPT-2 of this size to dir (created if missing); -> the transformers model, in eval mode.
    Its weights are random (N(0, 0.02), and the biases and LayerNorms too, so a transpose or a swapped bias shows)."""
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                                     n_layer=n_layer, n_head=n_head)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('bias') or '.ln_' in name:           # zeros and ones at init: make them random too
                p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(Path(dir), safe_serialization=True)
    return model.eval()


@pytest.fixture(scope='module')
def hub_dir(tmp_path_factory):
    """A tiny random GPT-2 (GPT-2's vocabulary) in the hub format, and the transformers model it is (a fixture: a test
    module imports it by name)."""
    directory = tmp_path_factory.mktemp('tiny-gpt2')
    return directory, write_tiny_gpt2(directory)


def write_gpt2_dataset(directory):
    """GPT-2 BPE tokens of _train_util.TEXT in the prepared layout (400 training tokens, ~180 validation), meta.json
    naming GPT-2's tokenizer: what train.py reads with --init_from=gpt2:DIR. -> the data directory"""
    import json

    import numpy as np

    from _train_util import TEXT, write_dataset
    from data.tokenizer import gpt2_tokenizer
    tokenizer = gpt2_tokenizer()
    tokens = np.array(tokenizer.encode(TEXT * 8), dtype=np.uint16)
    data = write_dataset(Path(directory), tokens[:400], tokens[400:], vocab_size=50257)
    meta = json.loads((data / 'meta.json').read_text())
    (data / 'meta.json').write_text(json.dumps({**meta, **tokenizer.describe()}))
    return data


def train_resume_evaluate_sample(data, tmp_path, hub_dir, fields, max_new_tokens=8, **run):
    """A GPT-2 form end to end from gpt2:DIR (a copy of hub_dir): 6 steps straight equal 3 steps and a resume to 6
    with the directory deleted first (the checkpoint holds all: weights, optimizer, memory and logs bit-identical,
    dropout on); then --eval_only and sample.py on the run. -> the straight run's log records"""
    import shutil

    import numpy as np

    import train
    from _train_util import assert_identical, flags, load, read_log, run_python
    copy = tmp_path / 'gpt2-copy'
    shutil.copytree(hub_dir, copy)
    run = dict(dict(dropout=0.1, eval_interval=3, log_interval=1, learning_rate=1e-3, warmup_iters=2), **run)
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    train.train(flags(data, straight, fields, init_from=f'gpt2:{copy}', max_iters=6, **run))
    train.train(flags(data, split, fields, init_from=f'gpt2:{copy}', max_iters=3, **run))
    shutil.rmtree(copy)
    train.train(flags(data, split, dict(model=fields['model']), init_from='resume', max_iters=6, **run))
    a, b = load(straight / 'ckpt.pt'), load(split / 'ckpt.pt')
    assert a['step'] == 6
    assert_identical({k: v for k, v in a.items() if k != 'train_config'},
                     {k: v for k, v in b.items() if k != 'train_config'})

    def logged(out_dir):                             # every logged value but the timings
        return [{k: v for k, v in r.items() if k not in ('tokens_per_sec', 'mfu')} for r in read_log(out_dir)]
    assert len(logged(straight)) > 6 and logged(straight) == logged(split)

    result = train.train(flags(data, split, dict(model=fields['model']), eval_only=True))
    assert result['loss'] > 0 and result['ppl'] == pytest.approx(np.exp(result['loss']))
    proc = run_python(['sample.py', f'--out_dir={split}', '--start=It was the best',
                       f'--max_new_tokens={max_new_tokens}', '--device=cpu', '--temperature=0'])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith('It was the best') and len(proc.stdout) > len('It was the best\n')
    return read_log(straight)
