"""
The single-model-file policy (STYLE.md): code shared between model files is duplicated and marked
`# Copied from model_xl.py (Name)`; the copies must stay textually identical to the class or function `Name` of
model_xl.py. The GPT-2 forms copy GPT-2's blocks the same way from model_gpt2.py (`# Copied from model_gpt2.py (Name)`):
a marker may name any model file, and the copy is compared with that file's definition. Name may be a method
(`Model._attn_mask`): a marker inside a class guards the method under it (the class may have another name: a copied
method in a modified class). A copy that differs on purpose says how,
`# Copied from model_xl.py (Name) with A->B`; it is not compared, but Name must still exist in the file it names (a
rename there breaks the test). Model files import only torch, numpy and the standard library, and
rel_attention_triton.py (the Triton kernel of attn_kernel='triton') inside a function, never at load time.
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
MARKER = re.compile(r'^\s*# Copied from (model_\w+\.py) \(([\w.]+)\)(?: with (.+?))?\s*$')
GPT2_SOURCE = ROOT / 'model_gpt2.py'
ALLOWED_THIRD_PARTY = {'torch', 'numpy'}
ALLOWED_LAZILY = {'rel_attention_triton'}   # imported where attn_kernel='triton' asks for it


def definitions(source):
    """[(qualified name, first line, text)] of the classes and functions at any depth, decorators included;
    a method's name is `Class.method`. The text of a nested definition keeps its indentation after the first
    line, so two copies compare equal only at the same depth."""
    lines = source.splitlines()
    found = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                text = '\n'.join([line.strip() for line in lines[start - 1:node.lineno - 1]]
                                 + [ast.get_source_segment(source, node)])
                found.append((prefix + node.name, start, text))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + '.')

    visit(ast.parse(source).body, '')
    return found


def blocks_by_name(source):
    """{name: text} of the classes and functions at any depth (`Class.method` for methods); a name defined twice
    maps to None (ambiguous)."""
    blocks = {}
    for name, _, text in definitions(source):
        blocks[name] = None if name in blocks else text
    return blocks


def marked_copies(source):
    """[(line number, Name, qualified name of the definition that follows the marker or None, modification or
    None, the model file it names)] for every marker. The definition must follow the marker directly (only blank
    lines or comments between)."""
    lines = source.splitlines()
    starts = {start: name for name, start, _ in definitions(source)}
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
                break                                   # a statement that is not a definition
        copies.append((number, match.group(2), following, match.group(3), match.group(1)))
    return copies


def check_copies(path):
    """Problems (strings) with the `# Copied from model_NAME.py (Name)` blocks of path, each compared with the
    model file its marker names; [] when all is well."""
    text = Path(path).read_text()
    blocks = blocks_by_name(text)
    problems = []
    for number, name, following, modification, source in marked_copies(text):
        where = f"{Path(path).name}:{number}"
        source_path = ROOT / source
        source_blocks = blocks_by_name(source_path.read_text()) if source_path.exists() else {}
        if not source_path.exists():
            problems.append(f"{where}: {source} is not a model file of the repository")
        elif following is None:
            problems.append(f"{where}: marker for {name} is followed by no class/def")
        elif name not in source_blocks:
            problems.append(f"{where}: {name} is not a class/def of {Path(source_path).name}")
        elif modification is not None:
            continue                                    # a modified copy: only its source must exist
        elif following.split('.')[-1] != name.split('.')[-1]:   # a method may sit in a renamed class
            problems.append(f"{where}: marker for {name} is followed by {following}")
        elif source_blocks[name] is None or blocks[following] is None:
            problems.append(f"{where}: {name} is defined more than once")
        elif blocks[following] != source_blocks[name]:
            diff = difflib.unified_diff(source_blocks[name].splitlines(), blocks[following].splitlines(),
                                        Path(source_path).name, Path(path).name, lineterm='')
            problems.append(f"{where}: {name} differs from the original:\n" + '\n'.join(diff))
    return problems


def disallowed_imports(path):
    """Imported modules other than torch, numpy and the standard library (relative imports included); one of
    ALLOWED_LAZILY counts where the module imports it at load time, not inside a function."""
    tree = ast.parse(Path(path).read_text())
    in_functions = {id(inner) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for inner in ast.walk(node)}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ['.' * node.level + (node.module or '')]
        else:
            continue
        for name in names:
            top = name.split('.')[0]
            lazy = top in ALLOWED_LAZILY and id(node) in in_functions
            if name.startswith('.') or not (top in ALLOWED_THIRD_PARTY or top in sys.stdlib_module_names or lazy):
                bad.append(name)
    return bad


# -----------------------------------------------------------------------------------------------------------


def test_model_xl_is_found():
    assert SOURCE in MODEL_FILES


@pytest.mark.parametrize('path', MODEL_FILES, ids=lambda p: p.name)
def test_copied_blocks_match_model_xl(path):
    assert check_copies(path) == []


@pytest.mark.parametrize('source', [SOURCE, GPT2_SOURCE], ids=lambda p: p.name)
def test_model_xl_marks_its_shared_blocks(source):
    """model_xl.py (and model_gpt2.py, for GPT-2's blocks) holds the originals and marks them; whatever another file
    copies from it must be marked there."""
    if not source.exists():
        pytest.skip(f"{source.name} is not in the repository")
    marked_in_source = {name for _, name, _, _, _ in marked_copies(source.read_text())}
    assert marked_in_source, f"{source.name} marks no shared blocks"
    for path in MODEL_FILES:
        copied = {name for _, name, _, _, of in marked_copies(path.read_text()) if of == source.name}
        assert copied <= marked_in_source, (path.name, copied - marked_in_source)


@pytest.mark.parametrize('path', [p for p in MODEL_FILES if p != SOURCE], ids=lambda p: p.name)
def test_every_model_file_copies_the_shared_blocks(path):
    """Every other model file (model_lamemo.py included) copies its shared blocks from model_xl.py instead of
    importing or rewriting them, so the checks above cover it. A GPT-2 form has GPT-2's feed-forward and embeddings,
    not Transformer-XL's: it copies the generation loop from model_xl.py and GPT-2's blocks from model_gpt2.py."""
    marks = marked_copies(path.read_text())
    copied = {name for _, name, _, _, source in marks if source == SOURCE.name}
    if 'gpt2' not in path.stem:
        assert {'PositionwiseFF', 'ScaledEmbedding', 'sample_next', 'decode'} <= copied, path.name
        return
    assert {'sample_next', 'decode'} <= copied, path.name
    from_gpt2 = {name for _, name, _, _, source in marks if source == GPT2_SOURCE.name}
    assert 'MLP' in from_gpt2, path.name


def test_checker_detects_modified_copy(tmp_path):
    name = next(name for _, name, _, _, _ in marked_copies(SOURCE.read_text()) if '.' not in name)
    original = blocks_by_name(SOURCE.read_text())[name]
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
    assert 'not a class/def' in check_copies(missing)[0]

    modified = tmp_path / 'model_modified.py'               # a modified copy is not compared, but its source must exist
    modified.write_text(f"{header}# Copied from model_xl.py ({name}) with a->b\n{altered}\n")
    assert check_copies(modified) == []
    modified.write_text(f"{header}# Copied from model_xl.py (NoSuchBlock) with a->b\n{altered}\n")
    assert 'not a class/def' in check_copies(modified)[0]


def test_checker_guards_methods(tmp_path):
    """A marker inside a class guards the method under it, against the method of the same class in model_xl.py."""
    method = next(name for _, name, _, modified, _ in marked_copies(SOURCE.read_text()) if '.' in name and not modified)
    cls, _ = method.split('.')
    original = blocks_by_name(SOURCE.read_text())[method]
    header = f"import torch\n\n\nclass {cls}:\n    # Copied from model_xl.py ({method})\n    "

    good = tmp_path / 'model_good.py'
    good.write_text(header + original + '\n')
    assert check_copies(good) == []

    bad = tmp_path / 'model_bad.py'
    bad.write_text(header + original + '\n        pass\n')
    problems = check_copies(bad)
    assert len(problems) == 1 and 'differs' in problems[0]

    statement = tmp_path / 'model_statement.py'             # a marker over something that is not a definition
    statement.write_text(f"import torch\n\n\nclass {cls}:\n    # Copied from model_xl.py ({method})\n    x = 1\n")
    assert 'no class/def' in check_copies(statement)[0]


@pytest.mark.parametrize('path', MODEL_FILES, ids=lambda p: p.name)
def test_model_files_import_only_torch_numpy_stdlib(path):
    assert disallowed_imports(path) == []


def test_import_checker_flags_other_modules(tmp_path):
    path = tmp_path / 'model_x.py'
    path.write_text("import math\nimport torch.nn as nn\nfrom numpy import linalg\nfrom dataclasses import field\n"
                    "import einops\nfrom transformers import AutoModel\nfrom . import helpers\n"
                    "def f():\n    import requests\n    from rel_attention_triton import rel_attention\n"
                    "import rel_attention_triton\n")
    assert sorted(disallowed_imports(path)) == sorted(['einops', 'transformers', '.', 'requests',
                                                       'rel_attention_triton'])   # at load time, not in f()


def test_checker_compares_with_the_file_the_marker_names(tmp_path):
    """A `# Copied from model_gpt2.py (Name)` block is compared with model_gpt2.py's Name, not model_xl.py's."""
    if not GPT2_SOURCE.exists():
        pytest.skip("model_gpt2.py is not in the repository")
    original = blocks_by_name(GPT2_SOURCE.read_text())['MLP']
    good = tmp_path / 'model_good.py'
    good.write_text(f"import torch\n\n\n# Copied from model_gpt2.py (MLP)\n{original}\n")
    assert check_copies(good) == []
    bad = tmp_path / 'model_bad.py'
    bad.write_text(f"import torch\n\n\n# Copied from model_gpt2.py (MLP)\n{original.replace('tanh', 'none')}\n")
    problems = check_copies(bad)
    assert len(problems) == 1 and 'differs' in problems[0]
    wrong_file = tmp_path / 'model_wrong.py'                # MLP is model_gpt2.py's, not model_xl.py's
    wrong_file.write_text(f"import torch\n\n\n# Copied from model_xl.py (MLP)\n{original}\n")
    assert 'not a class/def of model_xl.py' in check_copies(wrong_file)[0]
    unknown = tmp_path / 'model_unknown.py'
    unknown.write_text(f"import torch\n\n\n# Copied from model_nosuch.py (MLP)\n{original}\n")
    assert 'not a model file' in check_copies(unknown)[0]
