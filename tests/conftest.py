"""Shared test setup: make the repository root importable (model files live there, tests/ has no package), and the
GPT-2 tokenizer as a fixture."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _torch_config import torch_config_unchanged  # noqa: E402,F401  (autouse: torch's config left as found)


@pytest.fixture(scope='session')
def enc():
    """The offline GPT-2 tokenizer (data/tokenizer.py)."""
    from data.tokenizer import get_encoding
    return get_encoding()
