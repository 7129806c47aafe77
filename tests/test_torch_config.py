"""torch's config modules across tests in one process. `monkeypatch.setattr(torch._dynamo.config, flag, value)`
is undone under pytest 9 by deleting the flag (it is not in the module's __dict__), so every later test that reads
it fails. The suite patches torch's config with torch's own `config.patch(...)`, and an autouse fixture
(tests/_torch_config.py) fails the test that leaves a flag changed or gone. Here: the fixture's check, and the same
tests run twice in one pytest process, as the suite runs them."""
import subprocess
import sys
import textwrap

import torch._dynamo.config

from _torch_config import CONFIG_MODULES, config_changes

TESTS_DIR = __import__('pathlib').Path(__file__).resolve().parent


def test_config_changes_names_a_flag_that_changed_or_went():
    before = {name: module.get_config_copy() for name, module in CONFIG_MODULES.items()}
    assert config_changes(before) == []
    with torch._dynamo.config.patch(error_on_recompile=not torch._dynamo.config.error_on_recompile):
        assert [c.split(':')[0] for c in config_changes(before)] == ['torch._dynamo.config.error_on_recompile']
    before['torch._dynamo.config']['no_such_flag'] = 1                 # as if a test had deleted it
    assert config_changes(before) == ['torch._dynamo.config.no_such_flag: gone']


INNER = '''
import pytest
import torch
import torch._dynamo
from _torch_config import torch_config_unchanged  # noqa: F401


def compile_once():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2, backend='eager')
    assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))


@pytest.mark.parametrize('run', [1, 2])
def test_torch_patch(run):
    with torch._dynamo.config.patch(error_on_recompile=True):
        compile_once()


@pytest.mark.parametrize('run', [1, 2])
def test_monkeypatch(run, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, 'error_on_recompile', True)
    compile_once()
'''


def test_the_same_tests_twice_in_one_process(tmp_path):
    """torch's patch works any number of times in one process. Where this pytest's monkeypatch deletes the flag on
    undo, the fixture fails the first test that did it, naming the flag; where it restores it, all four pass."""
    (tmp_path / 'test_inner.py').write_text(textwrap.dedent(INNER))
    env = {**__import__('os').environ, 'PYTHONPATH': str(TESTS_DIR)}
    run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-rA', '-p', 'no:cacheprovider', 'test_inner.py'],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    for run in (1, 2):
        assert f'PASSED test_inner.py::test_torch_patch[{run}]' in out, out
    if 'error_on_recompile: gone' in out:                              # pytest >= 9: monkeypatch deletes the flag
        assert 'ERROR test_inner.py::test_monkeypatch[1]' in out, out  # ... and the fixture names the culprit
    else:
        assert '4 passed' in out, out
