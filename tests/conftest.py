"""Shared test setup: make the repository root importable (model files live there, tests/ has no package), Triton's
interpreter where there is no GPU, and the GPT-2 tokenizer as a fixture."""
import os
import sys
from pathlib import Path

import pytest
import torch

# Where triton is installed and there is no GPU, its kernels (rel_attention_triton.py) run on CPU tensors under its
# interpreter. triton.language decides at its first import, which any test may trigger (torch.compile does), so
# it is set here, before them all. Inductor's CPU code is C++ and does not read it.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

# Under pytest-xdist (`make test` runs the suite on every core, `-n`): the cores shared out among the workers, so that
# two workers' torch threads do not fight over the same cores (subprocesses already get one: _train_util.ENV)
WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '0'))
if WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // WORKERS))

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _torch_config import torch_config_unchanged  # noqa: E402,F401  (autouse: torch's config left as found)


@pytest.fixture(scope='session')
def enc():
    """The offline GPT-2 tokenizer (data/tokenizer.py)."""
    from data.tokenizer import get_encoding
    return get_encoding()
