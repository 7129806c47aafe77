"""The lab's tests: the repository root importable, as in tests/conftest.py (the shared fixtures live there)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
for path in (ROOT, ROOT / 'tests'):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from _torch_config import torch_config_unchanged  # noqa: E402,F401  (autouse, as in tests/conftest.py)
