"""
The single-model-file policy (STYLE.md): code shared between model files is duplicated and marked
`# Copied from model_xl.py (Name)`; the copies must stay textually identical to the top-level `class Name` /
`def Name` in model_xl.py. Model files import only torch, numpy and the standard library.
"""

import ast
import difflib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / 'model_xl.py'
MODEL_FILES = sorted(ROOT.glob('model_*.py'))
MARKER = re.compile(r'^# Copied from model_xl\.py \((\w+)\)\s*$')
ALLOWED_THIRD_PARTY = {'torch', 'numpy'}


def top_level_blocks(source):
    """{name: text} of the top-level classes and functions, decorators included; a name defined twice maps to
    None (ambiguous)."""
    lines = source.splitlines()
    blocks = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            text = '\n'.join(lines[start - 1:node.lineno - 1] + [ast.get_source_segment(source, node)])
            blocks[node.name] = None if node.name in blocks else text
    return blocks


def marked_copies(source):
    """[(line number, Name, name of the block that follows the marker or None)] for every marker. The block
    must follow the marker directly (only blank lines or comments between)."""
    lines = source.splitlines()
    starts = {}
    for node in ast.parse(source).body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])
        is_definition = isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        starts[start] = node.name if is_definition else None
    copies = []
    for number, line in enumerate(lines, start=1):
        match = MARKER.match(line)
        if not match:
            continue
        following = None
        for later in range(number + 1, len(lines) + 1):
            if later in starts:
                following = starts[later]
                break
            if lines[later - 1].strip() and not lines[later - 1].lstrip().startswith('#'):
                break                                   # something that is not a top-level statement: nested code
        copies.append((number, match.group(1), following))
    return copies


def check_copies(path, source_path=SOURCE):
    """Problems (strings) with the `# Copied from model_xl.py (Name)` blocks of path; [] when all is well."""
    source_blocks = top_level_blocks(Path(source_path).read_text())
    text = Path(path).read_text()
    blocks = top_level_blocks(text)
    problems = []
    for number, name, following in marked_copies(text):
        where = f"{Path(path).name}:{number}"
        if following != name:
            problems.append(f"{where}: marker for {name} is followed by {following or 'no class/def'}")
        elif name not in source_blocks:
            problems.append(f"{where}: {name} is not a top-level class/def of {Path(source_path).name}")
        elif source_blocks[name] is None or blocks[name] is None:
            problems.append(f"{where}: {name} is defined more than once")
        elif blocks[name] != source_blocks[name]:
            diff = difflib.unified_diff(source_blocks[name].splitlines(), blocks[name].splitlines(),
                                        Path(source_path).name, Path(path).name, lineterm='')
            problems.append(f"{where}: {name} differs from the original:\n" + '\n'.join(diff))
    return problems


def disallowed_imports(path):
    """Imported modules other than torch, numpy and the standard library (relative imports included)."""
    bad = []
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ['.' * node.level + (node.module or '')]
        else:
            continue
        for name in names:
            top = name.split('.')[0]
            if name.startswith('.') or not (top in ALLOWED_THIRD_PARTY or top in sys.stdlib_module_names):
                bad.append(name)
    return bad


# -----------------------------------------------------------------------------------------------------------


def test_model_xl_is_found():
    assert SOURCE in MODEL_FILES


@pytest.mark.parametrize('path', MODEL_FILES, ids=lambda p: p.name)
def test_copied_blocks_match_model_xl(path):
    assert check_copies(path) == []


def test_model_xl_marks_its_shared_blocks():
    """model_xl.py holds the originals and marks them; whatever another file copies must be marked there."""
    marked_in_source = {name for _, name, _ in marked_copies(SOURCE.read_text())}
    assert marked_in_source, "model_xl.py marks no shared blocks"
    for path in MODEL_FILES:
        copied = {name for _, name, _ in marked_copies(path.read_text())}
        assert copied <= marked_in_source, (path.name, copied - marked_in_source)


@pytest.mark.parametrize('path', [p for p in MODEL_FILES if p != SOURCE], ids=lambda p: p.name)
def test_every_model_file_copies_the_shared_blocks(path):
    """Every other model file (model_lamemo.py included) copies its shared blocks from model_xl.py instead of
    importing or rewriting them, so the checks above cover it."""
    copied = {name for _, name, _ in marked_copies(path.read_text())}
    assert {'PositionwiseFF', 'ScaledEmbedding', 'sample_next', 'decode'} <= copied, path.name


def test_checker_detects_modified_copy(tmp_path):
    name = next(name for _, name, _ in marked_copies(SOURCE.read_text()))
    original = top_level_blocks(SOURCE.read_text())[name]
    header = "import torch\n\n\n"

    good = tmp_path / 'model_good.py'
    good.write_text(f"{header}# Copied from model_xl.py ({name})\n{original}\n")
    assert check_copies(good) == []

    altered = original.replace('return', 'return  ', 1) if 'return' in original else original + '\n    pass'
    assert altered != original
    bad = tmp_path / 'model_bad.py'
    bad.write_text(f"{header}# Copied from model_xl.py ({name})\n{altered}\n")
    problems = check_copies(bad)
    assert len(problems) == 1 and 'differs' in problems[0]

    wrong_name = tmp_path / 'model_wrong.py'                # the marker names a block that is not the next one
    wrong_name.write_text(f"{header}# Copied from model_xl.py (NoSuchBlock)\n{original}\n")
    assert len(check_copies(wrong_name)) == 1

    missing = tmp_path / 'model_missing.py'                 # the block does not exist in model_xl.py
    missing.write_text(f"{header}# Copied from model_xl.py (NoSuchBlock)\ndef NoSuchBlock():\n    pass\n")
    assert 'not a top-level' in check_copies(missing)[0]

    nested = tmp_path / 'model_nested.py'                   # a marker inside a class does not count as a copy
    nested.write_text(f"{header}class A:\n    # Copied from model_xl.py ({name})\n    x = 1\n\n\n{original}\n")
    assert check_copies(nested) == []


@pytest.mark.parametrize('path', MODEL_FILES, ids=lambda p: p.name)
def test_model_files_import_only_torch_numpy_stdlib(path):
    assert disallowed_imports(path) == []


def test_import_checker_flags_other_modules(tmp_path):
    path = tmp_path / 'model_x.py'
    path.write_text("import math\nimport torch.nn as nn\nfrom numpy import linalg\nfrom dataclasses import field\n"
                    "import einops\nfrom transformers import AutoModel\nfrom . import helpers\n"
                    "def f():\n    import requests\n")
    assert sorted(disallowed_imports(path)) == sorted(['einops', 'transformers', '.', 'requests'])
