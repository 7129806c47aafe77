"""
Flags and config files for train.py, sample.py and bench/ (nanoGPT's configurator, without exec):

    cfg, module, model_cfg, given = parse_args(sys.argv[1:], TrainConfig)

Every flag is `--name=value` and names a field of the script's dataclass or of the chosen model's Config
(model_<name>.py); a `config/*.py` argument is a file of `name = literal` lines, parsed with ast, never executed.
Values are converted to the field's type (a float must be finite). Anything else (an unknown or mistyped flag, a
wrong type, a value the dataclass's __post_init__ refuses, an old name of RENAMED_FLAGS: the error gives the new)
raises UserError, which run_cli prints as one `error: ...` line. `--help` (or `-h`) prints every flag with its
default and the comment written after the field in the dataclass's source (for train.py: TrainConfig's, then those
of the --model chosen), and exits with 0.
"""

import ast
import dataclasses
import difflib
import importlib
import inspect
import io
import math
import os
import sys
import textwrap
import tokenize
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent


class UserError(Exception):
    """Bad input from the user: reported as one line, without a traceback."""


# Fields renamed, old name -> new: a flag or a config file's line with the old name is a one-line error naming the
# new one; a checkpoint's saved config is read under the new name (renamed_fields, runs.load_checkpoint).
RENAMED_FLAGS = {
    'ltm_lr_multiplier': 'ltm_lr_mult',      # model_infformer_gpt2.py, as gate_lr_mult and compress_lr_mult
}


def renamed_fields(config):
    """A saved {field: value} with every field of RENAMED_FLAGS under its new name."""
    return {RENAMED_FLAGS.get(name, name): value for name, value in config.items()}


def _model_modules():
    """{name: module path}: the papers' model_<name>.py at the top, and lab/model_<name>.py, the probes outside
    the papers (subclasses of a paper's model), which --model= selects the same way."""
    found = {p.stem[len('model_'):]: p.stem for p in REPO.glob('model_*.py')}
    found.update({p.stem[len('model_'):]: f'lab.{p.stem}' for p in (REPO / 'lab').glob('model_*.py')})
    return found


def available_models():
    return sorted(_model_modules())


def import_model(name):
    modules = _model_modules()
    if name not in modules:
        raise UserError(f"unknown model {name!r}; available: {', '.join(sorted(modules))}")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(modules[name])


def read_config_file(path):
    """A config file is `name = literal` lines (and comments): parsed, never executed."""
    try:
        source = Path(path).read_text()
    except OSError as e:
        raise UserError(f"cannot read config file {path}: {e.strerror}")
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as e:
        raise UserError(f"{path}:{e.lineno}: syntax error in config file")
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue                                                    # a docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise UserError(f"{path}:{node.lineno}: config files may only contain `name = literal` lines")
        if node.targets[0].id in RENAMED_FLAGS:
            raise UserError(f"{path}:{node.lineno}: {node.targets[0].id} was renamed "
                            f"{RENAMED_FLAGS[node.targets[0].id]}")
        try:
            values[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            raise UserError(f"{path}:{node.lineno}: the value of {node.targets[0].id} must be a literal")
    return values


def _article(typ):
    return {int: 'an int', float: 'a float', bool: 'True or False', str: 'a string'}.get(typ, typ.__name__)


def _convert(name, value, typ):
    """Convert a flag string (or check a config-file literal) to the field's type."""
    if typing.get_origin(typ) is typing.Union:                     # Optional[X]
        if value is None or (isinstance(value, str) and value == 'None'):
            return None
        typ = [t for t in typing.get_args(typ) if t is not type(None)][0]
    label, given = name, value                                    # for the message: a flag or a config literal
    if isinstance(value, str) and typ is not str:
        label = f'--{name}'
        if typ is bool:
            if value.lower() in ('true', '1', 'yes'):
                return True
            if value.lower() in ('false', '0', 'no'):
                return False
            raise UserError(f"--{name} takes True or False, got {value!r}")
        try:
            value = typ(value)
        except ValueError:
            raise UserError(f"--{name} takes {_article(typ)}, got {given!r}")
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise UserError(f"{name} takes {_article(typ)}, got {value!r}")
    if typ is float and not math.isfinite(value):
        raise UserError(f"{label} takes a finite float, got {given!r}")
    return value


# -----------------------------------------------------------------------------------------------------------
# --help: every flag, its default and the comment after it in the dataclass's source

HELP_FLAGS = ('--help', '-h')


def field_comments(cls):
    """{field: (section, comment)} from the source of dataclass cls (and of the dataclasses it inherits from).
    comment: the `# ...` after the field, joined with the comment-only lines below it that are indented further
    (continuations); section: a comment-only line at the fields' own indentation just above it, else ''."""
    found = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):                               # defined where no source is at hand
            continue
        comments, code = {}, set()                                 # line -> (column, text); lines with code
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = (tok.start[1], tok.string.lstrip('#').strip())
            elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                code.add(tok.start[0])
        last = 0                                                   # the last line that belongs to a field
        for node in ast.parse(source).body[0].body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above = [text for line, (col, text) in sorted(comments.items())
                     if last < line < node.lineno and line not in code and col <= node.col_offset]
            parts = [comments[node.end_lineno][1]] if node.end_lineno in comments else []
            last = node.end_lineno
            while (last + 1 in comments and last + 1 not in code
                   and comments[last + 1][0] > node.col_offset):       # a continuation of the comment
                last += 1
                parts.append(comments[last][1])
            comment = ' '.join(p for p in parts if p).replace('- ', '-') if parts else ''
            found[node.target.id] = (above[-1] if above else '', comment)
    return found


def _shown(value):
    """A default as it would be typed after --name= (quoted where a shell or the eye would lose it)."""
    if isinstance(value, str) and (not value or not value.isprintable() or ' ' in value):
        return repr(value)
    return str(value)


def _flag_lines(cls):
    comments = field_comments(cls)
    rows = []                                                          # (section, flag, comment)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            flag = f'--{f.name}={_shown(f.default)}'
        elif f.default_factory is not dataclasses.MISSING:
            flag = f'--{f.name}={_shown(f.default_factory())}'
        else:
            flag = f'--{f.name}=  (required)'
        rows.append((*comments.get(f.name, ('', '')), flag))
    width = min(max((len(flag) for _, _, flag in rows), default=0), 40)
    lines = []
    for section, comment, flag in rows:
        if section:
            lines.append(f'  # {section}')
        lines.append(f'  {flag:<{width}}  {comment}'.rstrip())
    return lines


def help_text(argv, train_cls, allow_model_fields=True, command=None):
    """Usage, the script's summary, then every flag of train_cls (and, with allow_model_fields, of the Config of
    the model that argv's --model= or config file chooses) with its default and its comment. command: the verb
    argv follows (`pretrained.py export`), whose summary is train_cls's docstring."""
    script = sys.modules.get(train_cls.__module__)
    path = Path(getattr(script, '__file__', None) or sys.argv[0])
    name = f"{path.name} {command}" if command else path.name
    doc = train_cls.__doc__ if command else getattr(script, '__doc__', None)
    summary = ((doc or '').strip().split('\n\n') or [''])[0]
    lines = [f"usage: python {name} [config/*.py ...] [--name=value ...]", '']
    if summary:
        lines += [inspect.cleandoc(summary), '']
    lines += [f"{name} flags ({train_cls.__name__}):", *_flag_lines(train_cls)]
    if allow_model_fields:
        name = model_name(read_overrides(argv), train_cls)
        module = import_model(name)
        lines += ['', f"--model={name} flags ({module.__name__.replace('.', '/')}.py Config):",
                  *_flag_lines(module.Config)]
    lines += ['', "Config files hold `name = literal` lines; flags given after them override them."]
    return '\n'.join(lines)


def read_overrides(argv):
    """{name: value} from config files (literals) and --name=value flags (strings), later ones winning."""
    overrides = {}
    for arg in argv:
        if arg.startswith('--'):
            if '=' not in arg:
                raise UserError(f"flags are written --name=value, got {arg!r} (--help lists them)")
            key, value = arg[2:].split('=', 1)
            key = key.replace('-', '_')
            if key in RENAMED_FLAGS:
                raise UserError(f"--{key} was renamed --{RENAMED_FLAGS[key]}")
            overrides[key] = value
        elif arg.endswith('.py'):
            overrides.update(read_config_file(arg))
        else:
            raise UserError(f"unexpected argument {arg!r} (expected a config/*.py file or --name=value)")
    return overrides


def model_name(overrides, train_cls):
    """The --model the arguments choose (a config file's or a flag's), else train_cls's default."""
    return str(overrides.get('model', {f.name: f for f in dataclasses.fields(train_cls)}['model'].default))


def parse_args(argv, train_cls, allow_model_fields=True, command=None):
    """argv -> (train_cls config, model module, model config, names the user set). Config files first, then flags.
    train_cls: the script's dataclass of flags (train.py's TrainConfig, sample.py's SampleConfig, a benchmark's);
    allow_model_fields: also accept the fields of model_<--model>.py's Config; command: the verb argv follows, for
    --help (pretrained.py's export).
    --help (or -h) anywhere prints every flag with its default and comment (help_text), then exits with status 0."""
    if any(arg in HELP_FLAGS for arg in argv):
        print(help_text([arg for arg in argv if arg not in HELP_FLAGS], train_cls, allow_model_fields, command))
        sys.exit(0)
    overrides = read_overrides(argv)
    train_fields = {f.name: f for f in dataclasses.fields(train_cls)}
    module, model_fields = None, {}
    if allow_model_fields:
        module = import_model(model_name(overrides, train_cls))
        model_fields = {f.name: f for f in dataclasses.fields(module.Config)}
    train_types = typing.get_type_hints(train_cls)
    model_types = typing.get_type_hints(module.Config) if module else {}

    train_kw, model_kw = {}, {}
    for key, value in overrides.items():
        if key in train_fields:
            train_kw[key] = _convert(key, value, train_types[key])
        elif key in model_fields:
            model_kw[key] = _convert(key, value, model_types[key])
        else:
            known = list(train_fields) + list(model_fields)
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise UserError(f"unknown flag --{key}{hint}")
    try:
        train_cfg = train_cls(**train_kw)
        model_cfg = module.Config(**model_kw) if module else None
    except ValueError as e:
        raise UserError(str(e))
    return train_cfg, module, model_cfg, set(overrides)


def run_cli(fn, argv=None):
    """Run fn(argv); bad input is one line on stderr and exit status 2, never a traceback. When whatever reads
    stdout goes away (`| head`), stop quietly with status 141 (128 + SIGPIPE), as Unix tools do."""
    try:
        fn(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error when Python exits
        sys.exit(141)
