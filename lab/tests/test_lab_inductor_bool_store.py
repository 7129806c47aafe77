"""lab/inductor_bool_store.py: every case timed three ways and written; bad flags are one line."""

import json

import pytest
import torch

from lab import inductor_bool_store


def test_inductor_bool_store_times_every_case_three_ways(monkeypatch, tmp_path, capsys):
    """lab/inductor_bool_store.py: each case eager, compiled, and compiled with inductor's vectorisation off
    (torch.compile is stubbed here: the test checks what is asked of it and what is written, not inductor)."""
    calls = []
    monkeypatch.setattr(torch, 'compile', lambda fn, **kw: calls.append(kw) or fn)
    out = tmp_path / 'bool_store.json'
    inductor_bool_store.main(['--n=64', '--rounds=2', f'--out={out}'])
    r = json.loads(out.read_text())
    assert set(r['results']) == set(inductor_bool_store.CASES) and r['n'] == 64
    for modes in r['results'].values():
        assert modes['compile / eager time'] == pytest.approx(modes['compile'] / modes['eager'])
        assert modes['eager'] > 0 and modes['compile, no vectorisation'] > 0
    n = len(inductor_bool_store.CASES)
    assert calls == [{'dynamic': False, 'options': {}}, {'dynamic': False, 'options': {'cpp.simdlen': 0}}] * n
    with pytest.raises(SystemExit):
        inductor_bool_store.main(['--rounds=0'])
    assert 'must be >= 1' in capsys.readouterr().err
