"""
A/B speed of one variant's training step: its model file as it was at a git revision (A) against the working tree
(B), with the same weights, in one process, interleaved round by round, so a change to a model file is measured
without the between-run noise of two speed.py runs.

    python lab/ab_step.py --variant=lamemo --rev=cd04404                   # byte level, the matched size
    python lab/ab_step.py --variant=infformer_sticky --rev=cd04404 --vocab=0 --rounds=6   # GPT-2 vocabulary
    python lab/ab_step.py --variant=infformer --overrides=n_basis=256,tau=0.75           # + Config fields

Prints and writes the median step time of each side and B's speedup (A's time / B's). The A file must accept the
variant's Config fields and load B's weights (strict): a change of parameters is not an A/B of speed.
"""

import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))   # bench/common.py and the benchmarks
import common  # noqa: E402
import speed  # noqa: E402

train = common.train


@dataclass
class ABConfig:
    variant: str = 'xl'            # a name from common.variant_table()
    rev: str = 'HEAD'              # the git revision of side A's model file
    vocab: int = 256               # vocabulary size; 0 = the size's (GPT-2, 50304)
    size: str = 'matched'          # matched or demo (common.SIZES)
    batch_size: int = 8
    warmup: int = 2                # untimed rounds
    rounds: int = 12               # timed rounds: medians over these
    overrides: str = ''            # the variant's Config fields, name=value,... (as train.py's flags)
    out: str = ''                  # a JSON path ('' = print only)

    def __post_init__(self):
        for name in ('batch_size', 'rounds'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab < 0:
            raise ValueError(f"vocab must be >= 1 (or 0 for the size's vocabulary), got {self.vocab}")
        if self.size not in common.SIZES:
            raise ValueError(f"size must be one of {', '.join(common.SIZES)}, got {self.size!r}")


def module_at(rev, name, directory):
    """model_<name>.py as it was at git revision rev, imported from directory under another name."""
    path = f'model_{name}.py'
    shown = subprocess.run(['git', 'show', f'{rev}:{path}'], cwd=common.REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        why = (shown.stderr.strip() or f"exit status {shown.returncode}").splitlines()[-1]
        raise train.UserError(f"git show {rev}:{path} failed: {why}")
    file = Path(directory) / f'model_{name}_at_rev.py'
    file.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same_weights(module, model):
    """module's Model with model's Config values and weights (side A of the A/B)."""
    known = {f.name for f in dataclasses.fields(module.Config)}
    fields = {f.name: getattr(model.config, f.name) for f in dataclasses.fields(model.config)}
    unknown = sorted(k for k in set(fields) - known if fields[k] != getattr(type(model.config)(), k))
    if unknown:
        raise train.UserError(f"the file at that revision has no Config field {', '.join(unknown)}")
    other = module.Model(module.Config(**{k: v for k, v in fields.items() if k in known}))
    try:
        other.load_state_dict(model.state_dict())
    except RuntimeError as e:
        raise train.UserError(f"the file at that revision has other parameters: {str(e).splitlines()[0]}") from None
    return other


def parse_overrides(overrides, fields):
    """--overrides 'a=1,b=x' -> {'a': 1, 'b': 'x'}: Config fields of the variant's model file, parsed as train.py
    parses its flags, and checked together with the variant's own fields (fields: {'model': name, field: value})."""
    items = common.override_items(overrides)
    model = fields['model']
    flags = [f'--{k}={v}' for k, v in fields.items()] + [f'--{k}={v}' for k, v in items]
    _, module, config, _ = train.parse_args(flags)
    known = {f.name for f in dataclasses.fields(module.Config)}
    for name, _ in items:
        if name not in known:
            raise train.UserError(f"--overrides: model_{model}.py's Config has no field {name!r}")
    return {name: getattr(config, name) for name, _ in items}


def run(cfg, argv):
    table = common.variant_table(**common.SIZES[cfg.size][1])
    if cfg.variant not in table:
        raise train.UserError(f"unknown variant {cfg.variant!r}; known: {', '.join(table)}")
    size = dict(common.SIZES[cfg.size][0], **({'vocab_size': cfg.vocab} if cfg.vocab else {}))
    device, device_type = common.setup('cpu')
    overrides = parse_overrides(cfg.overrides, {**table[cfg.variant], **size})
    model, _ = common.build(table[cfg.variant], **size, **overrides)
    with tempfile.TemporaryDirectory() as directory:
        old = same_weights(module_at(cfg.rev, table[cfg.variant]['model'], directory), model)
    entries = [speed.Entry(side, 'eager', m.train(), m, speed.make_optimizer(m, device_type), 'float32', device,
                           device_type, cfg.batch_size) for side, m in (('A', old), ('B', model))]
    common.run_rounds(entries, speed.Entry.train_step, cfg.warmup, cfg.rounds, device_type, 'train')
    seconds = {e.variant: common.median(e.times) for e in entries}
    speedup = seconds['A'] / seconds['B']
    print(f"{cfg.variant}: A ({cfg.rev}) {seconds['A'] * 1e3:.1f} ms, B (working tree) {seconds['B'] * 1e3:.1f} ms "
          f"per step: B is {speedup:.3f}x A")
    if cfg.out:
        common.write_json(cfg.out, {'config': dataclasses.asdict(cfg), 'seconds': seconds, 'speedup': speedup},
                          'lab/ab_step.py', argv)
    return seconds, speedup


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    train.run_cli(lambda a: run(common.parse(a, ABConfig), a), argv)


if __name__ == '__main__':
    main()
