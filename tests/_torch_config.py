"""An autouse fixture for tests/ and lab/tests: every test leaves torch's config modules as it found them.

pytest's `monkeypatch.setattr(torch._dynamo.config, 'error_on_recompile', True)` looks harmless, but a config flag
is not in the module's `__dict__`, so pytest 9 records "no old value" and its undo *deletes* the flag: every later
test that reads it fails with "has no attribute 'error_on_recompile'" (pytest 8 put the value back). The fix is
torch's own `torch._dynamo.config.patch(...)`; this fixture turns any leak of that kind, under any pytest, into a
failure of the test that caused it, naming the flag, instead of a failure of whichever test comes next.
"""
import warnings

import pytest
import torch._dynamo.config
import torch._inductor.config

CONFIG_MODULES = {'torch._dynamo.config': torch._dynamo.config, 'torch._inductor.config': torch._inductor.config}


def config_changes(before):
    """['module.flag: what happened'] between a snapshot `before` ({module name: get_config_copy()}) and now."""
    changes = []
    for name, module in CONFIG_MODULES.items():
        after = module.get_config_copy()                           # a deleted flag is hidden, not removed:
        with warnings.catch_warnings():                            # (reading a deprecated flag warns)
            warnings.simplefilter('ignore')
            gone = {k for k in before[name] if k not in after or not hasattr(module, k)}   # reading it fails
        changes += [f'{name}.{k}: gone' for k in sorted(gone)]
        changes += [f'{name}.{k}: {before[name][k]!r} -> {after[k]!r}' for k in sorted(before[name].keys() - gone)
                    if before[name][k] != after[k]]
    return changes


@pytest.fixture(autouse=True)
def torch_config_unchanged():
    before = {name: module.get_config_copy() for name, module in CONFIG_MODULES.items()}
    yield
    changes = config_changes(before)
    assert not changes, ('the test left torch config changed (use torch._dynamo.config.patch(...), not monkeypatch): '
                         + '; '.join(changes))
