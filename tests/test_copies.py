"""
The single-model-file policy (STYLE.md): code shared between model files is duplicated and marked
`# Copied from model_xl.py (Name)`; the copies must stay textually identical to the class or function `Name` of
model_xl.py. The GPT-2 forms copy GPT-2's blocks the same way from model_gpt2.py (`# Copied from model_gpt2.py (Name)`):
a marker may name any model file, and the copy is compared with that file's definition, found by its name (the source
carries no marker). Name may be a method (`Model._attn_mask`): a marker inside a class guards the method under it (the
class may have another name: a copied method in a modified class). A copy that differs on purpose says how,
`# Copied from model_xl.py (Name) with A->B`; it is not compared, but Name must still exist in the file it names (a
rename there breaks the test). `make fix-copies` rewrites the stale copies from their sources (tests/_copies.py holds
both). Model files import only torch, numpy and the standard library, and rel_attention_triton.py (the Triton kernel
of attn_kernel='triton') inside a function, never at load time.
"""

import ast
import shutil
import sys
from pathlib import Path

import pytest

from _copies import ROOT, by_name, check_copies, fix_copies, main, marked_copies, model_files, report

SOURCE = ROOT / 'model_xl.py'
MODEL_FILES = model_files()
GPT2_SOURCE = ROOT / 'model_gpt2.py'
ALLOWED_THIRD_PARTY = {'torch', 'numpy'}
ALLOWED_LAZILY = {'rel_attention_triton'}   # imported where attn_kernel='triton' asks for it


def verbatim_copies(source=SOURCE):
    """[(model file, Copy)] of the unmodified copies, in the other model files, of blocks of source."""
    return [(path, copy) for path in MODEL_FILES for copy in marked_copies(path.read_text())
            if copy.source == source.name and copy.modification is None]


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
def test_copied_blocks_match_their_source(path):
    problems = check_copies(path)
    assert problems == [], report(problems)


@pytest.mark.parametrize('path', MODEL_FILES, ids=lambda p: p.name)
def test_a_source_carries_no_marker_of_its_own_file(path):
    """model_xl.py holds the originals (model_gpt2.py GPT-2's) and marks only what it copies from another file."""
    assert [copy.line for copy in marked_copies(path.read_text()) if copy.source == path.name] == []


@pytest.mark.parametrize('path', [p for p in MODEL_FILES if p != SOURCE], ids=lambda p: p.name)
def test_every_model_file_copies_the_shared_blocks(path):
    """Every other model file (model_lamemo.py included) copies its shared blocks from model_xl.py instead of
    importing or rewriting them, so the checks above cover it. A GPT-2 form has GPT-2's feed-forward and embeddings,
    not Transformer-XL's: it copies the generation loop from model_xl.py and GPT-2's blocks from model_gpt2.py."""
    marks = marked_copies(path.read_text())
    copied = {copy.name for copy in marks if copy.source == SOURCE.name}
    if 'gpt2' not in path.stem:
        assert {'PositionwiseFF', 'ScaledEmbedding', 'sample_next', 'decode'} <= copied, path.name
        return
    assert {'sample_next', 'decode'} <= copied, path.name
    from_gpt2 = {copy.name for copy in marks if copy.source == GPT2_SOURCE.name}
    assert path == GPT2_SOURCE or 'MLP' in from_gpt2, path.name      # model_gpt2.py holds GPT-2's blocks


def test_checker_detects_modified_copy(tmp_path):
    name = next(copy.name for _, copy in verbatim_copies() if '.' not in copy.name)
    original = by_name(SOURCE.read_text())[name].text
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
    assert 'make fix-copies' in report(problems)

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

    own = tmp_path / 'model_xl.py'                          # a source marking itself
    own.write_text(f"{header}# Copied from model_xl.py ({name})\n{original}\n")
    assert 'its own file' in check_copies(own, root=tmp_path)[0]


def test_checker_guards_methods(tmp_path):
    """A marker inside a class guards the method under it, against the method of the same class in model_xl.py."""
    method = next(copy.name for _, copy in verbatim_copies() if '.' in copy.name)
    cls, _ = method.split('.')
    original = by_name(SOURCE.read_text())[method].text
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


def copy_of_the_model_files(tmp_path):
    for path in MODEL_FILES:
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def hack(path, name, line):
    """Add line (indented as a statement of the block) at the end of the block `name` of path, as a user would."""
    lines = path.read_text().splitlines(keepends=True)
    block = by_name(path.read_text())[name]
    lines.insert(block.end, ' ' * (block.indent + 4) + line + '\n')
    path.write_text(''.join(lines))


def test_fix_copies_rewrites_the_copies_of_a_hacked_source(tmp_path, capsys):
    """A block hacked in its source (a function, a method, a block only modified copies have): `make fix-copies`
    rewrites every verbatim copy, a copy of a copy included, leaves the modified ones alone and lists them; the check
    fails before and passes after, its message naming the command."""
    root = copy_of_the_model_files(tmp_path)
    chain = root / 'model_chain.py'                         # copies model_gpt2.py's copy of sample_next
    gpt2_copy = by_name((root / 'model_gpt2.py').read_text())['sample_next'].text
    chain.write_text(f"import torch\n\n\n# Copied from model_gpt2.py (sample_next)\n{gpt2_copy}\n")
    hack(root / 'model_xl.py', 'sample_next', 'hacked = True')
    hack(root / 'model_xl.py', 'Model.num_params', 'hacked = True')
    hack(root / 'model_xl.py', 'Block', 'hacked = True')
    before = {path.name: path.read_text() for path in model_files(root)}
    stale = [(path.name, copy) for path, copy in verbatim_copies()
             if copy.name in ('sample_next', 'Model.num_params')] + [('model_chain.py', None)]
    assert main([], root=root) == 1 and 'make fix-copies' in capsys.readouterr().err

    assert main(['--fix'], root=root) == 0
    out = capsys.readouterr().out
    assert f"{len(stale)} copies rewritten" in out and 'model_chain.py:4 sample_next' in out
    assert "model_xl.py (Block): model_compressive.py:" in out  # modified on purpose: listed, not rewritten
    assert main([], root=root) == 0
    for path in model_files(root):
        text = path.read_text()
        for copy in marked_copies(text):
            if copy.source == 'model_xl.py' and copy.name in ('sample_next', 'Model.num_params'):
                assert 'hacked = True' in copy.definition.text, (path.name, copy.line)
        if path.name not in {name for name, _ in stale} | {'model_xl.py'}:
            assert text == before[path.name], path.name     # no verbatim copy of the hacked blocks: untouched
    assert fix_copies(root) == ([], [])                     # a second run has nothing to do


def test_fix_copies_changes_nothing_in_the_repository(tmp_path):
    root = copy_of_the_model_files(tmp_path)
    assert fix_copies(root) == ([], [])
    assert [path.read_bytes() for path in model_files(root)] == [path.read_bytes() for path in MODEL_FILES]


def test_make_fix_copies_runs_the_fixer():
    makefile = (ROOT / 'Makefile').read_text()
    phony = next(line for line in makefile.splitlines() if line.startswith('.PHONY:'))
    assert 'fix-copies' in phony.split() and '\nfix-copies:\n\t$(PYTHON) tests/_copies.py --fix\n' in makefile


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
    original = by_name(GPT2_SOURCE.read_text())['MLP'].text
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
