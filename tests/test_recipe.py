"""
The papers' recipe (a pretrained LM, then a memory, fine-tuned): a GPT-2 that train.py made is a starting point.
`--init_from=gpt2:OUT_DIR` reads its ckpt.pt, and `python pretrained.py export` writes it in the hub format, which
transformers' GPT2LMHeadModel reads with logits equal to ours within 1e-5; from either, every memory form receives
GPT-2's tensors bit for bit. A checkpoint of another model, a damaged one, or an export over an earlier one is one
line. End to end at toy size: bench/demos.py --suite=gpt2 pretrains, fine-tunes a form from it, evaluates it with its
memory emptied; then the fine-tuned form samples with sample.py.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pretrained
import train
from _gpt2_util import write_gpt2_dataset
from _train_util import assert_one_line_error, flags, load, run_main, run_python

transformers = pytest.importorskip('transformers')
pytest.importorskip('safetensors')
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))
import demos  # noqa: E402

GPT2 = dict(model='gpt2', n_layer=2, n_head=2, n_embd=32, n_positions=32, seg_len=16)
FORMS = ('gpt2', 'infformer_gpt2', 'compressive_gpt2', 'infini_gpt2')
# each memory form at a size that fits the tiny GPT-2 (its own fields; GPT-2's come from the checkpoint)
FORM_FIELDS = {'gpt2': {}, 'infformer_gpt2': dict(n_basis=8, n_samples=8, ltm_reset_len=64),
               'compressive_gpt2': dict(cmem_len=8), 'infini_gpt2': {}}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return write_gpt2_dataset(tmp_path_factory.mktemp('data'))


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
    """A tiny GPT-2 trained by train.py for a few steps (weights that are not the init), and its export."""
    out = tmp_path_factory.mktemp('gpt2-run')
    train.train(flags(data_dir, out, GPT2, max_iters=6, eval_interval=6, dropout=0.1))
    hub = out.parent / (out.name + '-hub')
    proc = run_python(['pretrained.py', 'export', f'--out_dir={out}', f'--to={hub}'])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('wrote ') == 2 and 'GPT2LMHeadModel.from_pretrained' in proc.stdout
    return out, hub


def our_model(out_dir):
    ckpt = train.load_checkpoint(Path(out_dir) / 'ckpt.pt')
    return train.model_from_checkpoint(ckpt)[2].eval()


def test_export_is_read_by_transformers_with_equal_logits(trained):
    out, hub = trained
    theirs = transformers.GPT2LMHeadModel.from_pretrained(hub).eval()
    ours = our_model(out)
    idx = torch.randint(0, 50257, (3, GPT2['seg_len']), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(idx).logits
        logits = ours(idx, ours.init_memory(3, 'cpu'))[0]
    assert all(ours.transformer.h[i].attn.c_attn.bias.abs().min() > 0 for i in range(2))   # trained: no zero left
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    config = json.loads((hub / 'config.json').read_text())
    assert {k: config[k] for k in pretrained.GPT2_FIELDS} == {k: getattr(ours.config, k) for k in
                                                               pretrained.GPT2_FIELDS}
    assert config['resid_pdrop'] == 0.1 and config['activation_function'] == 'gelu_new'


@pytest.mark.parametrize('form', FORMS)
@pytest.mark.parametrize('source', ['out_dir', 'export'])
def test_every_form_starts_from_our_gpt2_bit_for_bit(trained, form, source):
    out, hub = trained
    module = train.import_model(form)
    cfg = module.Config(seg_len=GPT2['seg_len'], **FORM_FIELDS[form])
    _, model, note, meta = pretrained.init_from_gpt2(f"gpt2:{out if source == 'out_dir' else hub}", form, module, cfg,
                                                     set(FORM_FIELDS[form]))
    assert ('ckpt.pt' if source == 'out_dir' else 'model.safetensors') in note
    assert meta is None if source == 'export' else meta == load(out / 'ckpt.pt')['tokenizer']   # the tokens they read
    saved = load(out / 'ckpt.pt')['model']
    params = dict(model.named_parameters(remove_duplicate=False))
    names = pretrained.gpt2_names(GPT2['n_layer'])
    for name in names:
        assert torch.equal(params[name], saved[name]), name
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.config.n_embd == GPT2['n_embd'] and model.config.n_positions == GPT2['n_positions']
    left = set(params) - set(names)
    assert bool(left) == (form != 'gpt2')              # the memory's own parameters stay at their init


def test_another_model_a_damaged_checkpoint_or_an_earlier_export_is_one_line(trained, data_dir, tmp_path, capsys):
    out, hub = trained
    other = tmp_path / 'infformer'
    train.train(flags(data_dir, other, dict(model='infformer_gpt2', n_layer=1, n_head=2, n_embd=16, n_positions=16,
                                            seg_len=8, n_basis=4, n_samples=4), max_iters=1))
    damaged = tmp_path / 'damaged'
    damaged.mkdir()
    (damaged / 'ckpt.pt').write_bytes((out / 'ckpt.pt').read_bytes()[:5000])

    def export_error(*args, fragments):
        proc = run_python(['pretrained.py', *args])
        assert proc.returncode == 2, proc.stderr
        assert_one_line_error(proc.stderr, *fragments)

    export_error('export', f'--out_dir={other}', f'--to={tmp_path / "x"}', fragments=["'infformer_gpt2'", 'gpt2'])
    export_error('export', f'--out_dir={damaged}', f'--to={tmp_path / "x"}', fragments=['not a loadable'])
    export_error('export', f'--out_dir={tmp_path / "none"}', f'--to={tmp_path / "x"}', fragments=['no checkpoint'])
    export_error('export', f'--out_dir={out}', f'--to={hub}', fragments=['already holds', '--overwrite=True'])
    export_error('export', f'--out_dir={out}', fragments=['--to=DIR'])
    export_error('export', f'--out_dir={out}', f'--to={hub}', '--bogus=1', fragments=['bogus'])
    export_error('convert', fragments=['usage: python pretrained.py export'])
    assert not (tmp_path / 'x').exists()
    for source, fragments in ((other, ["'infformer_gpt2'", 'not GPT-2 alone']), (damaged, ['not a loadable'])):
        code, _, err = run_main(flags(data_dir, tmp_path / 'ft', dict(model='compressive_gpt2', seg_len=16),
                                      init_from=f'gpt2:{source}'), capsys)
        assert code == 2, err
        assert_one_line_error(err, *fragments)
    proc = run_python(['pretrained.py', 'export', f'--out_dir={out}', f'--to={hub}', '--overwrite=True'])
    assert proc.returncode == 0, proc.stderr


def test_the_recipe_end_to_end_at_toy_size(data_dir, tmp_path):
    """bench/demos.py --suite=gpt2 on one form: pretrain once, fine-tune from it (GPT-2's weights arrive, then move),
    evaluate with the memory emptied, resume nothing twice; then sample.py streams from the fine-tuned form."""
    size = (f' --data_dir={data_dir} --n_layer=1 --n_head=2 --n_embd=16 --n_positions=16 --seg_len=8 --batch_size=2'
            ' --max_iters=3 --eval_interval=3 --eval_tokens=64 --eval_batch_size=2 --device=cpu --compile=False'
            '')
    argv = ['--suite=gpt2', '--variants=gpt2,infformer', '--seeds=1', f'--out_root={tmp_path / "runs"}',
            f'--results={tmp_path / "results"}', '--jobs=1', '--threads=1', '--longdoc=False', f'--overrides={size}']
    demos.main(argv)
    result = json.loads((tmp_path / 'results' / 'demos_gpt2.json').read_text())
    pretrained_loss = result['pretrained']['validation/loss']
    assert pretrained_loss > 0 and set(result['runs']) == {'gpt2', 'infformer'}
    assert result['runs']['infformer']['seeds'] and result['evals']['infformer_emptied']['seeds']
    emptied, kept = result['evals']['infformer_emptied']['mean'], result['runs']['infformer']['mean']
    assert emptied != kept                            # the memory is read: emptying it changes the loss
    start = load(tmp_path / 'runs' / 'pretrain' / 'ckpt.pt')['model']
    tuned = load(tmp_path / 'runs' / 'infformer' / 'seed1' / 'ckpt.pt')
    assert tuned['model_name'] == 'infformer_gpt2' and tuned['step'] == 3
    assert not torch.equal(tuned['model']['transformer.h.0.attn.c_attn.weight'],
                           start['transformer.h.0.attn.c_attn.weight'])   # fine-tuned: GPT-2's weights moved
    assert tuned['model']['transformer.wpe.weight'].shape == start['transformer.wpe.weight'].shape
    mtime = (tmp_path / 'runs' / 'pretrain' / 'ckpt.pt').stat().st_mtime
    demos.main(argv)                                  # everything is done: nothing is trained again
    assert (tmp_path / 'runs' / 'pretrain' / 'ckpt.pt').stat().st_mtime == mtime
    proc = run_python(['sample.py', f'--out_dir={tmp_path / "runs" / "infformer" / "seed1"}',
                       '--start=It was the best', '--max_new_tokens=12', '--device=cpu', '--seed=1'])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith('It was the best') and len(proc.stdout) > len('It was the best\n')


def test_a_byte_gpt2_of_ours_starts_byte_forms_only(data_dir, tmp_path, capsys):
    """--init_from=gpt2:OUT_DIR reads the tokens its checkpoint was trained on (bench/demos.py --suite=code_gpt2
    pretrains on bytes): a byte GPT-2 starts a memory form on byte data with its tensors bit for bit, and sample.py
    samples it with its byte tokenizer; on GPT-2 BPE data, and exported to the hub format (whose GPT-2 reads BPE), it
    is one line."""
    from _train_util import TEXT, write_dataset
    from data.tokenizer import bytes_tokenizer
    tokens = np.frombuffer((TEXT * 4).encode(), dtype=np.uint8).astype(np.uint16)
    byte_data = write_dataset(tmp_path / 'bytes', tokens[:600], tokens[600:], vocab_size=256)
    meta = json.loads((byte_data / 'meta.json').read_text())
    (byte_data / 'meta.json').write_text(json.dumps({**meta, **bytes_tokenizer().describe()}))
    pre = tmp_path / 'pre'
    train.train(flags(byte_data, pre, GPT2, max_iters=2, eval_interval=2))
    saved = load(pre / 'ckpt.pt')
    assert saved['model']['transformer.wte.weight'].shape == (256, GPT2['n_embd'])
    tuned = tmp_path / 'tuned'
    train.train(flags(byte_data, tuned, dict(model='infformer_gpt2', seg_len=16, **FORM_FIELDS['infformer_gpt2']),
                      init_from=f'gpt2:{pre}', max_iters=1, learning_rate=0.0, dropout=0.0))
    start = load(tuned / 'ckpt.pt')['model']
    for name in pretrained.gpt2_names(GPT2['n_layer'])[:-1]:
        assert torch.equal(start[name], saved['model'][name]), name
    code, _, err = run_main(flags(data_dir, tmp_path / 'bpe', dict(model='infformer_gpt2', seg_len=16),
                                  init_from=f'gpt2:{pre}'), capsys)
    assert code == 2
    assert_one_line_error(err, f'--init_from=gpt2:{pre} reads bytes tokens', 'holds gpt2 tokens')
    proc = run_python(['pretrained.py', 'export', f'--out_dir={pre}', f'--to={tmp_path / "hub"}'])
    assert proc.returncode == 2 and not (tmp_path / 'hub').exists()
    assert_one_line_error(proc.stderr, 'trained on bytes tokens', "not GPT-2's BPE")
    proc = run_python(['sample.py', f'--init_from=gpt2:{pre}', '--start=It was', '--max_new_tokens=12',
                       '--device=cpu', '--seed=1'])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith('It was') and len(proc.stdout.encode()) >= len('It was') + 1
