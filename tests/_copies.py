"""The `# Copied from model_NAME.py (Name)` blocks of the model files: finding them, checking them against their
source (tests/test_copies.py) and rewriting them from it (`make fix-copies`).

A marker names the model file that holds the source and the class or function `Name` there (`Class.method` for a
method); the definition under it must be textually identical to the source's. The source itself carries no marker.
A copy that differs on purpose says how in words, `# Copied from model_xl.py (Name) with A->B`: it is not compared,
only its source must exist, and fix-copies lists it instead of rewriting it.

    python tests/_copies.py          # check: every problem, exit status 1 if any
    python tests/_copies.py --fix    # rewrite every stale copy from its source (make fix-copies)
"""
import ast
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r'^\s*# Copied from (model_\w+\.py) \(([\w.]+)\)(?: with (.+?))?\s*$')
FIX_COMMAND = 'make fix-copies'


@dataclass
class Definition:
    name: str        # qualified: `Class.method` for a method
    start: int       # first line (its first decorator's), 1-based
    end: int         # last line
    indent: int      # the column of its `def` / `class`
    text: str        # the text compared with a copy's


@dataclass
class Copy:
    line: int                # the marker's line
    name: str                # the Name the marker gives
    definition: Definition   # the definition under the marker, or None
    modification: str        # the words after `with`, or None for a verbatim copy
    source: str              # the model file the marker names


def definitions(source):
    """[Definition] of the classes and functions at any depth, decorators included. The text of a nested definition
    keeps its indentation after the first line, so two copies compare equal only at the same depth."""
    lines = source.split('\n')
    found = []

    def segment(node):                                  # ast.get_source_segment's text, without its slow line split
        first, last = lines[node.lineno - 1].encode(), lines[node.end_lineno - 1].encode()
        if node.lineno == node.end_lineno:
            return first[node.col_offset:node.end_col_offset].decode()
        return '\n'.join([first[node.col_offset:].decode()] + lines[node.lineno:node.end_lineno - 1]
                         + [last[:node.end_col_offset].decode()])

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                text = '\n'.join([line.strip() for line in lines[start - 1:node.lineno - 1]]
                                 + [segment(node)])
                found.append(Definition(prefix + node.name, start, node.end_lineno, node.col_offset, text))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + '.')

    visit(ast.parse(source).body, '')
    return found


def by_name(source):
    """{qualified name: Definition} of the classes and functions at any depth; a name defined twice maps to None
    (ambiguous)."""
    found = {}
    for definition in definitions(source):
        found[definition.name] = None if definition.name in found else definition
    return found


def marked_copies(source):
    """[Copy] for every marker. The definition must follow the marker directly (only blank lines or comments
    between)."""
    lines = source.splitlines()
    starts = {definition.start: definition for definition in definitions(source)}
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
        copies.append(Copy(number, match.group(2), following, match.group(3), match.group(1)))
    return copies


def compare(path, root=ROOT):
    """[(Copy, its source's Definition or None, problem or None, stale)] for the markers of path, each compared with
    the model file (in root) that it names; stale: a verbatim copy that differs from its source."""
    path = Path(path)
    text = path.read_text()
    here = by_name(text)
    sources = {}                                        # {model file: by_name of it}, each parsed once
    results = []
    for copy in marked_copies(text):
        stale = False
        where = f"{path.name}:{copy.line}"
        source_path = Path(root) / copy.source
        if copy.source not in sources:
            sources[copy.source] = by_name(source_path.read_text()) if source_path.exists() else {}
        source = sources[copy.source]
        original = source.get(copy.name)
        if copy.source == path.name:
            problem = f"{where}: marks {copy.name} as copied from its own file (a source carries no marker)"
        elif not source_path.exists():
            problem = f"{where}: {copy.source} is not a model file of the repository"
        elif copy.definition is None:
            problem = f"{where}: marker for {copy.name} is followed by no class/def"
        elif copy.name not in source:
            problem = f"{where}: {copy.name} is not a class/def of {copy.source}"
        elif copy.modification is not None:
            problem = None                              # a modified copy: only its source must exist
        elif copy.definition.name.split('.')[-1] != copy.name.split('.')[-1]:   # a method may sit in a renamed class
            problem = f"{where}: marker for {copy.name} is followed by {copy.definition.name}"
        elif original is None or here[copy.definition.name] is None:
            problem = f"{where}: {copy.name} is defined more than once"
        elif copy.definition.text != original.text:
            diff = difflib.unified_diff(original.text.splitlines(), copy.definition.text.splitlines(),
                                        copy.source, path.name, lineterm='')
            stale = True
            problem = f"{where}: {copy.name} differs from the original:\n" + '\n'.join(diff)
        else:
            problem = None
        results.append((copy, original, problem, stale))
    return results


def check_copies(path, root=ROOT):
    """Problems (strings) with the marked copies of path; [] when all is well."""
    return [problem for _, _, problem, _ in compare(path, root) if problem]


def report(problems):
    """The message for a failed check: the problems, then the command that rewrites stale copies."""
    return '\n'.join(problems + [f"A stale copy is rewritten from its source by `{FIX_COMMAND}`."])


def model_files(root=ROOT):
    return sorted(Path(root).glob('model_*.py'))


def fix_once(path, root=ROOT):
    """Rewrite path's stale verbatim copies from their sources (the source's lines replace the copy's). -> the
    rewritten copies, as 'file:line Name'."""
    path = Path(path)
    lines = path.read_text().splitlines(keepends=True)
    rewritten, taken = [], []
    stale = [(copy, original) for copy, original, _, stale in compare(path, root) if stale]
    for copy, original in sorted(stale, key=lambda pair: -pair[0].definition.start):
        target = copy.definition
        if original.indent != target.indent or any(target.start <= end and start <= target.end for start, end in taken):
            continue                                    # at another depth (unfixable) or inside a copy rewritten now
        source_lines = (Path(root) / copy.source).read_text().splitlines(keepends=True)
        lines[target.start - 1:target.end] = source_lines[original.start - 1:original.end]
        taken.append((target.start, target.end))
        rewritten.append(f"{path.name}:{copy.line} {copy.name}")
    if rewritten:
        path.write_text(''.join(lines))
    return rewritten


def fix_copies(root=ROOT):
    """Rewrite every stale verbatim copy of the model files in root from its source, until none changes (a copy of a
    copy follows its source). -> (rewritten copies, problems left: what cannot be rewritten mechanically)."""
    rewritten = []
    for _ in range(len(model_files(root)) + 1):
        done = [fixed for path in model_files(root) for fixed in fix_once(path, root)]
        if not done:
            break
        rewritten += done
    problems = [problem for path in model_files(root) for problem in check_copies(path, root)]
    return rewritten, problems


def modified_copies(root=ROOT):
    """{'model_xl.py (Name)': ['model_lamemo.py:179', ...]}: the copies that differ on purpose (`with ...`)."""
    found = {}
    for path in model_files(root):
        for copy in marked_copies(path.read_text()):
            if copy.modification is not None:
                found.setdefault(f"{copy.source} ({copy.name})", []).append(f"{path.name}:{copy.line}")
    return dict(sorted(found.items()))


def main(argv=None, root=ROOT):
    """Check the copies (exit status 1 on a problem), or with --fix rewrite the stale ones first. -> exit status"""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ['--fix']):
        print("usage: python tests/_copies.py [--fix]", file=sys.stderr)
        return 2
    if argv == ['--fix']:
        rewritten, problems = fix_copies(root)
        for fixed in rewritten:
            print(f"rewritten from its source: {fixed}")
        print(f"{len(rewritten)} copies rewritten. Not rewritten, as they differ from their source on purpose "
              "(`with ...`): carry a change of the source over by hand to")
        for source, copies in modified_copies(root).items():
            print(f"  {source}: {', '.join(copies)}")
    else:
        problems = [problem for path in model_files(root) for problem in check_copies(path, root)]
    if problems:
        print(report(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
