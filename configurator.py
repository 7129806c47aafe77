"""
Flags and config files for train.py, sample.py and bench/ (nanoGPT's configurator, without exec):

    cfg, module, model_cfg, given = parse_args(sys.argv[1:], TrainConfig)

Every flag is `--name=value` and names a field of the script's dataclass or of the chosen model's Config
(model_<name>.py); a `config/*.py` argument is a file of `name = literal` lines, parsed with ast, never executed.
Values are converted to the field's type. Anything else (an unknown or mistyped flag, a wrong type, a value the
dataclass's __post_init__ refuses) raises UserError, which run_cli prints as one `error: ...` line.
"""

import ast
import dataclasses
import difflib
import importlib
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent


class UserError(Exception):
    """Bad input from the user: reported as one line, without a traceback."""


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
    if isinstance(value, str) and typ is not str:
        if typ is bool:
            if value.lower() in ('true', '1', 'yes'):
                return True
            if value.lower() in ('false', '0', 'no'):
                return False
            raise UserError(f"--{name} takes True or False, got {value!r}")
        try:
            return typ(value)
        except ValueError:
            raise UserError(f"--{name} takes {_article(typ)}, got {value!r}")
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise UserError(f"{name} takes {_article(typ)}, got {value!r}")
    return value


# Flags whose mechanism left a model file for a file of its own: (model module, flag) -> the one-line error.
MOVED_FLAGS = {('model_xl', 'lookahead'): "--lookahead is gone from model_xl.py: LaMemo is --model=lamemo now"}


def parse_args(argv, train_cls, allow_model_fields=True):
    """argv -> (train_cls config, model module, model config, names the user set). Config files first, then flags.
    train_cls: the script's dataclass of flags (train.py's TrainConfig, sample.py's SampleConfig, a benchmark's);
    allow_model_fields: also accept the fields of model_<--model>.py's Config."""
    overrides = {}
    for arg in argv:
        if arg.startswith('--'):
            if '=' not in arg:
                raise UserError(f"flags are written --name=value, got {arg!r}")
            key, value = arg[2:].split('=', 1)
            overrides[key.replace('-', '_')] = value
        elif arg.endswith('.py'):
            overrides.update(read_config_file(arg))
        else:
            raise UserError(f"unexpected argument {arg!r} (expected a config/*.py file or --name=value)")

    train_fields = {f.name: f for f in dataclasses.fields(train_cls)}
    module, model_fields = None, {}
    if allow_model_fields:
        model_name = overrides.get('model', train_fields['model'].default)
        module = import_model(str(model_name))
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
            if module is not None and (module.__name__, key) in MOVED_FLAGS:
                raise UserError(MOVED_FLAGS[module.__name__, key])
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
    """Run fn(argv); bad input is one line on stderr and exit status 2, never a traceback."""
    try:
        fn(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
