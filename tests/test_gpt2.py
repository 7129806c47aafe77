"""
GPT-2 alone (model_gpt2.py) and --init_from=gpt2 (pretrained.py), against Hugging Face transformers' GPT2LMHeadModel
on the same weights: a tiny random GPT-2 that tests/_gpt2_util.py writes with save_pretrained, loaded through our
path. The logits of every segment equal transformers' within 1e-5 (float32); `train.py --init_from=gpt2:DIR
--model=gpt2 --eval_only=True` gives transformers' validation loss over the same segments within 1e-4; every way the
loader can fail is one line; a run from gpt2:DIR trains, resumes bit-exactly without the directory, evaluates and
samples; generate() equals forward() segment by segment. (The generic tests over tests/_models.py drive model_gpt2.py
too: tests/test_models_train.py, tests/test_decode.py, tests/test_flops.py.)
"""

import json
import shutil

import numpy as np
import pytest
import torch

import pretrained
import train
from _gpt2_util import hub_dir  # noqa: F401  (a fixture)
from _gpt2_util import train_resume_evaluate_sample, write_gpt2_dataset
from _train_util import ENV, assert_one_line_error, flags, load, run_main, run_python, write_dataset
from data.loader import eval_stream_bounds

transformers = pytest.importorskip('transformers')
model_gpt2 = train.import_model('gpt2')

SIZE = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64)   # write_tiny_gpt2's defaults
T = 16                                                        # seg_len of the tests


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return write_gpt2_dataset(tmp_path_factory.mktemp('data'))


def loaded(directory, **fields):
    """model_gpt2.Model through pretrained.py, in eval mode."""
    cfg = model_gpt2.Config(**{'seg_len': T, **fields})
    cfg, model, _, _ = pretrained.init_from_gpt2(f'gpt2:{directory}', 'gpt2', model_gpt2, cfg, set(fields))
    return model.eval()


def gpt2_flags(data_dir, out_dir, directory, **overrides):
    return flags(data_dir, out_dir, dict(model='gpt2', seg_len=T), init_from=f'gpt2:{directory}', **overrides)


# -----------------------------------------------------------------------------------------------------------
# Equality with transformers


def test_logits_equal_transformers_segment_by_segment(hub_dir):
    """Four segments of T tokens and a short fifth: each read on its own at positions 0..T-1, as GPT2LMHeadModel
    reads it; and the loss is its loss."""
    directory, hf = hub_dir
    model = loaded(directory)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50257, (3, 4 * T + 5), generator=g)
    memory = model.init_memory(3, 'cpu')
    with torch.no_grad():
        for start in range(0, idx.size(1), T):
            x = idx[:, start:start + T]
            y = torch.roll(x, -1, dims=1)
            logits, loss, memory, aux = model(x, memory, y)
            ref = hf(x, labels=None)
            torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-5)
            ref_loss = torch.nn.functional.cross_entropy(ref.logits.reshape(-1, 50257), y.reshape(-1))
            assert abs(loss.item() - ref_loss.item()) < 1e-5 and aux['lm_loss'] == loss
    assert memory.length.tolist() == [idx.size(1)] * 3


def test_init_from_gpt2_copies_every_tensor_transposing_conv1d(hub_dir):
    """Every GPT-2 parameter equals transformers' (Conv1D weights transposed); lm_head stays tied to wte."""
    directory, hf = hub_dir
    model = loaded(directory)
    ours = dict(model.named_parameters(remove_duplicate=False))
    theirs = hf.state_dict()
    assert set(ours) == set(pretrained.gpt2_names(2))
    for name, p in ours.items():
        ref = theirs[name].t() if name.endswith(pretrained.CONV1D) else theirs[name]
        assert torch.equal(p, ref), name
    assert model.lm_head.weight is model.transformer.wte.weight


def test_eval_only_gives_transformers_validation_loss(hub_dir, data_dir):
    """The issue's target, as a command: train.py --init_from=gpt2:DIR --model=gpt2 --eval_only=True evaluates the
    pretrained weights; transformers over the same streams and segments gives the same loss within 1e-4."""
    directory, hf = hub_dir
    B = 2
    proc = run_python(['train.py', f'--init_from=gpt2:{directory}', '--model=gpt2', '--eval_only=True',
                       f'--data_dir={data_dir}', f'--seg_len={T}', f'--batch_size={B}', '--device=cpu'])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'loaded GPT-2 weights from {directory}' in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    data = np.fromfile(data_dir / 'validation.bin', dtype=np.uint16).astype(np.int64)
    starts, ends = eval_stream_bounds(len(data), B)
    nll, count = 0.0, 0
    with torch.no_grad():
        for a, b in zip(starts, ends):
            for s in range(a, b, T):
                n = min(T, b - s)
                x, y = torch.from_numpy(data[s:s + n])[None], torch.from_numpy(data[s + 1:s + 1 + n])
                nll += torch.nn.functional.cross_entropy(hf(x).logits[0], y, reduction='sum').item()
                count += n
    assert result['validation/tokens'] == count == len(data) - 1
    assert abs(result['validation/loss'] - nll / count) < 1e-4, (result['validation/loss'], nll / count)


# -----------------------------------------------------------------------------------------------------------
# Generation


def test_generate_equals_forward_segment_by_segment(hub_dir):
    """Greedy generate() over a prompt of 2.5 segments, 2 segments on: every token is forward()'s argmax over its
    own segment so far (a naive loop that recomputes the segment at every token)."""
    directory, _ = hub_dir
    model = loaded(directory)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 50257, (2, 2 * T + T // 2), generator=g)
    out = model.generate(prompt, 2 * T, temperature=0.0)
    expected = prompt
    with torch.no_grad():
        for _ in range(2 * T):
            start = (expected.size(1) - 1) // T * T                 # the segment of the last token
            logits, _, _, _ = model(expected[:, start:], model.init_memory(2, 'cpu'))
            expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, expected)


def test_step_logits_equal_forward_with_every_slot_read(hub_dir):
    """The fixed-shape step (filled=None: every slot read, padding masked, as a CUDA graph replays it) gives
    forward()'s logits at every position of a segment."""
    directory, _ = hub_dir
    model = loaded(directory)
    idx = torch.randint(0, 50257, (2, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _, _, _ = model(idx, model.init_memory(2, 'cpu'))
        logits, seg = model.open_segment(model.init_memory(2, 'cpu'), idx[:, :3])
        steps = [logits]
        for t in range(3, T):
            steps.append(model.step(idx[:, t:t + 1], seg))
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 2:], rtol=0, atol=1e-5)


# -----------------------------------------------------------------------------------------------------------
# train.py and sample.py from gpt2:DIR


def test_train_from_gpt2_resumes_exactly_without_the_directory_then_evaluates_and_samples(hub_dir, data_dir,
                                                                                         tmp_path):
    """6 steps straight == 3 steps, then a resume to 6 with the GPT-2 directory gone (the checkpoint holds it all):
    bit-identical weights, optimizer, memory and logs (dropout on). Then --eval_only on the run and sample.py."""
    train_resume_evaluate_sample(data_dir, tmp_path, hub_dir[0], dict(model='gpt2', seg_len=T))


def test_train_with_lr_0_keeps_the_pretrained_weights(hub_dir, data_dir, tmp_path):
    """train.py's checkpoint after a step at learning rate 0 holds exactly transformers' weights: the loader ran
    inside train.py, and nothing after it changed them."""
    directory, hf = hub_dir
    train.train(gpt2_flags(data_dir, tmp_path / 'out', directory, max_iters=1, learning_rate=0.0, weight_decay=0.0))
    saved = load(tmp_path / 'out' / 'ckpt.pt')['model']
    for name, p in hf.state_dict().items():
        if name in saved:
            assert torch.equal(saved[name], p.t() if name.endswith(pretrained.CONV1D) else p), name


def test_sample_from_gpt2_dir(hub_dir):
    """sample.py --init_from=gpt2:DIR samples GPT-2's own weights: greedy text is generate()'s."""
    directory, _ = hub_dir
    proc = run_python(['sample.py', f'--init_from=gpt2:{directory}', '--start=It was the best',
                       '--max_new_tokens=6', '--temperature=0', '--device=cpu'])
    assert proc.returncode == 0, proc.stderr[-3000:]
    from data.tokenizer import gpt2_tokenizer
    tokenizer = gpt2_tokenizer()
    model = loaded(directory, seg_len=64)
    prompt = tokenizer.encode('It was the best')
    out = model.generate(torch.tensor([prompt]), 6, temperature=0.0)[0, len(prompt):].tolist()
    text = b''.join(tokenizer.token_bytes(t) for t in out).decode('utf-8', errors='replace')
    assert proc.stdout == 'It was the best' + text + '\n'


# -----------------------------------------------------------------------------------------------------------
# One line for every failure


def rewrite(directory, target, drop=(), change=None, config=None):
    """A copy of the hub directory in target with tensors dropped or replaced, or config.json fields changed."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(directory, target)
    tensors = load_file(target / 'model.safetensors')
    for name in drop:
        del tensors[name]
    tensors.update(change or {})
    save_file(tensors, target / 'model.safetensors', metadata={'format': 'pt'})
    if config:
        hf = json.loads((target / 'config.json').read_text())
        (target / 'config.json').write_text(json.dumps({**hf, **config}))
    return target


def test_loader_errors_are_one_line(hub_dir, data_dir, tmp_path, capsys):
    directory, hf = hub_dir

    def error(init_from, *fragments, model='gpt2', **extra):
        argv = flags(data_dir, tmp_path / 'out', dict(model=model, seg_len=T), init_from=init_from,
                     overwrite=True, **extra)
        code, _, err = run_main(argv, capsys)
        assert code == 2, err
        return assert_one_line_error(err, *fragments)

    error('gpt3', 'init_from must be')
    error(f'gpt2:{tmp_path / "nowhere"}', 'has no model.safetensors or config.json')
    error(f'gpt2:{directory}', 'model xl has no GPT-2 form', 'use --model=gpt2 or ', 'infini_gpt2', model='xl')
    error(f'gpt2:{directory}', '--n_layer=3 contradicts', 'n_layer=2', n_layer=3)
    error(f'gpt2:{directory}', 'seg_len (128) must be <= n_positions (64)', seg_len=128)
    name = 'transformer.h.1.attn.c_attn.weight'
    shape = hf.state_dict()[name].shape
    bad = rewrite(directory, tmp_path / 'shape', change={name: torch.zeros(shape[0], shape[1] - 3)})
    error(f'gpt2:{bad}', name, 'has shape (93, 32)', 'the model\'s is (96, 32)')
    missing = rewrite(directory, tmp_path / 'missing', drop=['transformer.h.0.ln_2.bias', 'transformer.ln_f.weight'])
    error(f'gpt2:{missing}', 'has no tensor transformer.h.0.ln_2.bias (and 1 more)')
    broken = rewrite(directory, tmp_path / 'broken')
    (broken / 'config.json').write_text('{"n_layer": 2')
    error(f'gpt2:{broken}', 'cannot read', 'config.json')
    for text in ('{"n_layer": 2}', '[1, 2]', '7'):
        (broken / 'config.json').write_text(text)
        error(f'gpt2:{broken}', 'is not a GPT-2 config.json')
    (broken / 'config.json').write_text((directory / 'config.json').read_text())
    (broken / 'model.safetensors').write_bytes(b'not a safetensors file')
    error(f'gpt2:{broken}', 'cannot read', 'model.safetensors')


def test_bytes_data_is_refused(hub_dir, tmp_path, capsys):
    directory, _ = hub_dir
    data = write_dataset(tmp_path / 'bytes', np.arange(300) % 256, np.arange(100) % 256, vocab_size=256)
    meta = json.loads((data / 'meta.json').read_text())
    (data / 'meta.json').write_text(json.dumps({**meta, 'tokenizer': 'bytes', 'eot_token': None}))
    code, _, err = run_main(gpt2_flags(data, tmp_path / 'out', directory), capsys)
    assert code == 2
    assert_one_line_error(err, 'reads GPT-2 BPE tokens', 'bytes tokens')


def test_missing_packages_are_one_line(hub_dir, data_dir, tmp_path, capsys, monkeypatch):
    directory, _ = hub_dir
    monkeypatch.setitem(__import__('sys').modules, 'safetensors', None)
    code, _, err = run_main(gpt2_flags(data_dir, tmp_path / 'a', directory), capsys)
    assert code == 2
    assert_one_line_error(err, 'needs the safetensors package')
    monkeypatch.setitem(__import__('sys').modules, 'huggingface_hub', None)
    code, _, err = run_main(flags(data_dir, tmp_path / 'b', dict(model='gpt2'), init_from='gpt2'), capsys)
    assert code == 2
    assert_one_line_error(err, 'needs the huggingface_hub package', 'gpt2:DIR')


def test_hub_name_offline_without_a_cached_copy_is_one_line(data_dir, tmp_path):
    """No network and an empty cache: one line saying what to download and where to put it."""
    pytest.importorskip('huggingface_hub')
    env = dict(ENV, HF_HUB_OFFLINE='1', HF_HOME=str(tmp_path / 'hf'), HF_HUB_CACHE=str(tmp_path / 'hf' / 'hub'))
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, 'train.py', '--model=gpt2', '--init_from=gpt2-medium',
                           f'--data_dir={data_dir}', f'--out_dir={tmp_path / "out"}', '--device=cpu'],
                          cwd=train.REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, 'gpt2-medium', 'huggingface.co/openai-community/gpt2-medium',
                          'model.safetensors and config.json', '--init_from=gpt2:DIR')


def test_a_hub_name_is_read_from_the_local_cache(hub_dir, tmp_path, monkeypatch):
    """--init_from=gpt2 takes the files huggingface_hub finds in its cache (here: a snapshot_download stand-in)."""
    huggingface_hub = pytest.importorskip('huggingface_hub')
    directory, _ = hub_dir
    asked = []

    def snapshot_download(repo_id, allow_patterns, local_files_only):
        asked.append((repo_id, local_files_only))
        return str(directory)
    monkeypatch.setattr(huggingface_hub, 'snapshot_download', snapshot_download)
    assert pretrained.locate('gpt2') == directory
    assert asked == [('openai-community/gpt2', True)]                # the cache first, no download


def test_a_memory_forms_own_parameters_are_left_at_init(hub_dir):
    """A GPT-2 form with a parameter of its own: the GPT-2 part is loaded, the extra is untouched and reported."""
    directory, _ = hub_dir

    class WithMemory(model_gpt2.Model):
        def __init__(self, config):
            super().__init__(config)
            self.memory_gate = torch.nn.Parameter(torch.full((3,), 0.5))

    class module:
        Model, Config = WithMemory, model_gpt2.Config
    _, model, note, _ = pretrained.init_from_gpt2(f'gpt2:{directory}', 'gpt2', module, model_gpt2.Config(seg_len=T),
                                               set())
    assert torch.equal(model.memory_gate, torch.full((3,), 0.5))
    assert note.endswith('left at init: memory_gate')


def test_config_checks():
    for bad, fragment in ((dict(seg_len=2048), 'seg_len (2048) must be <= n_positions (1024)'),
                          (dict(n_embd=100, n_head=12), 'multiple of n_head'), (dict(dropout=1.0), 'dropout'),
                          (dict(n_layer=0), 'n_layer must be >= 1')):
        with pytest.raises(ValueError, match=fragment.replace('(', r'\(').replace(')', r'\)')):
            model_gpt2.Config(**bad)
