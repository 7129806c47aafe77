"""lab/ab_step.py: a model file at a git revision against the working tree, with the same weights."""

import dataclasses
import json

import pytest
import torch

from _models import TINY_MODELS
from lab import ab_step

import common  # noqa: E402  (bench/, which lab/ab_step.py puts on sys.path)

ROOT = common.REPO


def test_ab_step_times_a_revision_against_the_working_tree(tmp_path, capsys):
    """lab/ab_step.py: side A is the model file at a git revision with B's weights (the same logits when the file
    has not changed since), both timed; a field or parameter the old file lacks, a bad revision or variant: one line."""
    import subprocess
    out = tmp_path / 'ab.json'
    ab_step.main(['--variant=xl', '--rev=HEAD', '--size=demo', '--batch_size=1', '--warmup=0', '--rounds=1',
                  f'--out={out}'])
    r = json.loads(out.read_text())
    assert r['seconds']['A'] > 0 and r['seconds']['B'] > 0
    assert r['speedup'] == pytest.approx(r['seconds']['A'] / r['seconds']['B'])
    model, _ = common.build(dict(model='xl', mem_len=8), **dict(TINY_MODELS['xl'], mem_len=8))
    old = ab_step.same_weights(ab_step.module_at('HEAD', 'xl', tmp_path), model)
    assert type(old).__module__ == 'model_xl_at_rev'
    unchanged = subprocess.run(['git', 'diff', '--quiet', 'HEAD', '--', 'model_xl.py'], cwd=ROOT).returncode == 0
    if unchanged:
        idx = torch.randint(0, model.config.vocab_size, (2, 4))
        logits = [m.eval()(idx, m.init_memory(2, 'cpu'))[0] for m in (old, model)]
        assert torch.equal(*logits)
    fields = [(f.name, f.type, f) for f in dataclasses.fields(model.config) if f.name != 'same_length']
    older = type('Older', (), {'Config': dataclasses.make_dataclass('Config', fields), 'Model': None})
    model.config.same_length = True                    # a non-default value of a field the older file lacks
    with pytest.raises(common.train.UserError, match='no Config field same_length'):
        ab_step.same_weights(older, model)
    model.config.same_length = False
    model.extra = torch.nn.Parameter(torch.zeros(1))   # a parameter the file at HEAD does not have
    with pytest.raises(common.train.UserError, match='other parameters'):
        ab_step.same_weights(ab_step.module_at('HEAD', 'xl', tmp_path), model)
    capsys.readouterr()
    fields = ab_step.parse_overrides('mem_len=8,same_length=true,clamp_len=0', {'model': 'xl', 'seg_len': 16})
    assert fields == {'mem_len': 8, 'same_length': True, 'clamp_len': 0}
    for bad in (['--variant=nope'], ['--rev=no-such-revision'], ['--rounds=0'], ['--overrides=nope=1'],
                ['--overrides=mem_len=x'], ['--overrides=x'], ['--overrides=learning_rate=1']):
        with pytest.raises(SystemExit) as e:
            ab_step.main(bad + ['--size=demo'])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('error:') and '\n' not in err, err
