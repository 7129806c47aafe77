"""
The command line shared by train.py, sample.py and bench/ (configurator.py): --help lists every flag with its
default and the comment written after it in the dataclass; bad values (non-finite floats, the flag LaMemo took
away from model_xl.py, a renamed flag) are one `error: ...` line. pretrained.py's --help lists its verbs.
"""
import dataclasses
import re
import typing
from dataclasses import dataclass

import pytest

import configurator
import pretrained
import sample
import train
from _train_util import assert_one_line_error, run_python


@dataclass
class Parent:
    # the first section
    alpha: int = 1                   # alpha's comment
    beta: str = '# not a comment'    # a '#' inside a string is no comment
    gamma: tuple = (1,
                    2)               # after a value over two lines
    # the second section
    delta: float = 0.5               # a comment that goes on
                                     # on the next line, and
                                     # the one after
    epsilon: bool = False
    # a section comment right after a field without a comment is no continuation
    zeta: typing.Optional[int] = None  # None = off


@dataclass
class Child(Parent):
    eta: str = ''                    # a field of the subclass


def test_field_comments_trailing_continued_and_sections():
    comments = configurator.field_comments(Child)
    assert comments == {
        'alpha': ('the first section', "alpha's comment"),
        'beta': ('', "a '#' inside a string is no comment"),
        'gamma': ('', 'after a value over two lines'),
        'delta': ('the second section', 'a comment that goes on on the next line, and the one after'),
        'epsilon': ('', ''),
        'zeta': ('a section comment right after a field without a comment is no continuation', 'None = off'),
        'eta': ('', 'a field of the subclass')}


def help_of(main, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert err == ''
    return out


def trailing_comments(cls):
    """{field: its comment} read off the source lines with a regex: an independent check of field_comments."""
    import inspect
    found = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+): [^=]+= .*?\s#\s?(.*)$", line)
        if m and "'#" not in line:
            found[m.group(1)] = m.group(2).strip()
    return found


def assert_lists(out, cls):
    """Every field of cls is on a line of its own as --name=default, followed by its comment."""
    lines = out.splitlines()
    comments = trailing_comments(cls)
    for f in dataclasses.fields(cls):
        shown = configurator._shown(f.default if f.default_factory is dataclasses.MISSING else f.default_factory())
        line = [line for line in lines if (line + ' ').startswith(f'  --{f.name}={shown} ')]
        assert len(line) == 1, (f.name, shown)
        if f.name in comments:
            assert comments[f.name] in line[0], (f.name, line[0])


@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_train_help_lists_train_then_model_flags(flag, capsys):
    out = help_of(train.main, [flag], capsys)
    assert out.startswith('usage: python train.py [config/*.py ...] [--name=value ...]')
    assert_lists(out, train.TrainConfig)
    xl = configurator.import_model('xl')
    assert_lists(out, xl.Config)
    assert out.index('--seed=1337') < out.index('--n_layer=16')          # TrainConfig's fields come first
    # a comment continued on the next line is joined, and a section comment heads its fields
    assert "(Infini-attention's paper: each input of 16 segments starts fresh); 0 = never" in out
    assert '# what to train, on what, and where it goes' in out
    line = next(x for x in out.splitlines() if x.lstrip().startswith('--model='))
    for name in configurator.available_models():              # every model file of the repository root is named
        if (configurator.REPO / f'model_{name}.py').exists():
            assert name in re.findall(r'\w+', line.split('model_<model>.py:')[1]), (name, line)


def test_help_shows_the_chosen_models_flags(capsys):
    infini = configurator.import_model('infini')
    for argv in (['--model=infini', '--help'], ['--help', 'config/infini_demo.py']):
        out = help_of(train.main, argv, capsys)
        assert_lists(out, infini.Config)
        assert '--model=infini flags (model_infini.py Config):' in out
        assert '--memory_update=linear' in out and '--mem_len=' not in out      # Infini's Config, not model_xl's


def test_help_with_an_unknown_model_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        train.main(['--model=nope', '--help'])
    assert exc.value.code == 2
    assert_one_line_error(capsys.readouterr().err, "unknown model 'nope'")


def test_sample_help_lists_its_flags_only(capsys):
    out = help_of(sample.main, ['--help'], capsys)
    assert_lists(out, sample.SampleConfig)
    assert "--start='\\n'" in out and '--n_layer' not in out


@pytest.mark.parametrize('script, expected', [('train.py', '--eval_mem_len=-1'), ('sample.py', '--top_k=200'),
                                              ('bench/longdoc.py', '--max_docs=0')])
def test_help_from_the_command_line(script, expected):
    """Run as scripts, the dataclasses live in __main__: their source is still found."""
    proc = run_python([script, '--help'])
    assert proc.returncode == 0 and proc.stderr == '', proc.stderr
    assert re.search(rf'^  {re.escape(expected)} +\S', proc.stdout, re.M), proc.stdout


def test_lookahead_is_an_unknown_flag(capsys):
    assert not hasattr(configurator, 'MOVED_FLAGS')
    with pytest.raises(configurator.UserError, match=r'^unknown flag --lookahead$'):
        train.parse_args(['--lookahead=True'])
    with pytest.raises(SystemExit) as exc:
        train.main(['--model=xl', '--lookahead=True'])
    assert exc.value.code == 2
    assert_one_line_error(capsys.readouterr().err, 'unknown flag --lookahead')


def test_a_renamed_flag_is_one_line_naming_the_new_name(capsys):
    with pytest.raises(SystemExit) as exc:
        train.main(['--model=infformer_gpt2', '--ltm_lr_multiplier=5'])
    assert exc.value.code == 2
    line = assert_one_line_error(capsys.readouterr().err)
    assert line == 'error: --ltm_lr_multiplier was renamed --ltm_lr_mult'
    assert train.parse_args(['--model=infformer_gpt2', '--ltm_lr_mult=5'])[2].ltm_lr_mult == 5.0


def test_a_renamed_field_in_a_config_file_names_the_new_name(tmp_path):
    config = tmp_path / 'old.py'
    config.write_text("model = 'infformer_gpt2'\nltm_lr_multiplier = 5.0\n")
    with pytest.raises(configurator.UserError,
                       match=f'^{re.escape(str(config))}:2: ltm_lr_multiplier was renamed ltm_lr_mult$'):
        train.parse_args([str(config)])


def test_renamed_flags_name_a_field_that_is_and_one_that_is_not():
    """Each old name of RENAMED_FLAGS is no field any more (it would shadow it), each new one is a model's field."""
    fields = {f.name for name in configurator.available_models()
              for f in dataclasses.fields(configurator.import_model(name).Config)}
    fields |= {f.name for f in dataclasses.fields(train.TrainConfig)}
    assert configurator.RENAMED_FLAGS
    for old, new in configurator.RENAMED_FLAGS.items():
        assert old not in fields and new in fields, (old, new)


def test_pretrained_help_lists_its_verbs(capsys):
    out = help_of(pretrained.main, ['--help'], capsys)
    assert out.startswith('usage: python pretrained.py VERB [--name=value ...]\n')
    assert set(pretrained.VERBS) == {'export'}
    assert re.search(r'^  export +Write a GPT-2 that train.py made', out, re.M), out
    assert 'python pretrained.py VERB --help' in out


def test_pretrained_export_help_names_the_verb(capsys):
    out = help_of(pretrained.main, ['export', '--help'], capsys)
    assert out.startswith('usage: python pretrained.py export [config/*.py ...] [--name=value ...]\n')
    assert 'pretrained.py export flags (ExportConfig):' in out
    assert_lists(out, pretrained.ExportConfig)


@pytest.mark.parametrize('flag', ['--learning_rate=inf', '--dropout=nan', '--grad_clip=-inf'])
def test_non_finite_floats_are_refused(flag):
    with pytest.raises(configurator.UserError, match=f"^{flag.split('=')[0]} takes a finite float, got '"):
        train.parse_args([flag])


def test_non_finite_float_in_a_config_file_is_refused(tmp_path):
    config = tmp_path / 'inf.py'
    config.write_text('learning_rate = 1e999\n')                      # a literal, and infinite
    with pytest.raises(configurator.UserError, match='^learning_rate takes a finite float, got inf$'):
        train.parse_args([str(config)])
