"""
bench/demos.py (the demo comparison on several seeds): the train.py command of every variant and seed (its config,
seed, own out_dir, controls' flags, resume of an unfinished run, overrides last), which runs count as finished, the
mean and spread over seeds, bad input as a one-line error, and end to end on tiny runs (two variants, two seeds,
then bench/longdoc.py against the baseline).
"""

import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest

import train
from _train_util import assert_bad_input_is_one_line, assert_one_line_error
from test_longdoc import dataset
from data.tokenizer import bytes_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))
import demos  # noqa: E402

TINY = (' --n_layer=1 --n_head=2 --n_embd=16 --d_head=8 --d_inner=32 --seg_len=8 --batch_size=2 --max_iters=2'
        ' --eval_interval=1000 --eval_tokens=64 --eval_batch_size=2 --device=cpu --compile=False --log_interval=1')


def cfg(tmp_path, **kw):
    return demos.DemosConfig(out_root=str(tmp_path / 'runs'), **kw)


def fake_log(out_dir, losses_by_step):
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [{'step': 1, 'train/loss': 9.0}]
    lines += [{'step': step, 'validation/loss': loss} for step, loss in losses_by_step]
    (out_dir / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in lines))


def test_commands(tmp_path):
    c = cfg(tmp_path, overrides=' --max_iters=7 --mem_len=3')
    cmd = demos.command(c, 'baseline', 2)
    assert cmd[:4] == ['train.py', 'config/xl_demo.py', '--seed=2', f'--out_dir={tmp_path}/runs/baseline/seed2']
    assert cmd.index('--mem_len=0') < cmd.index('--mem_len=3')          # overrides come last and win
    assert '--init_from=resume' not in cmd and '--always_save_checkpoint=True' in cmd
    assert demos.command(c, 'infini_delta', 1)[1] == 'config/infini_demo.py'
    assert '--memory_update=delta' in demos.command(c, 'infini_delta', 1)
    assert '--sticky=True' in demos.command(c, 'infformer_sticky', 3)
    (tmp_path / 'runs' / 'xl' / 'seed1').mkdir(parents=True)
    (tmp_path / 'runs' / 'xl' / 'seed1' / 'ckpt.pt').write_bytes(b'')
    assert '--init_from=resume' in demos.command(c, 'xl', 1)             # an unfinished run resumes
    for label, (config, _) in demos.VARIANTS.items():
        assert (demos.common.REPO / config).exists(), label
    assert demos.selected(cfg(tmp_path, variants='all')) == list(demos.VARIANTS)
    assert not set(demos.CONTROLS) & set(demos.selected(cfg(tmp_path)))
    assert cfg(tmp_path).variants.split(',')[:2] == ['baseline', 'xl'] and c.name == ''


def test_gpt2_suite(tmp_path):
    """--suite=gpt2 (the papers' recipe): every form starts from the suite's pretrained GPT-2 unless it resumes, the
    pretraining's own command resumes too, and the emptied-memory evaluations read each finished run's checkpoint."""
    c = demos.DemosConfig(suite='gpt2', out_root=str(tmp_path / 'runs'), overrides=' --max_iters=5')
    assert c.name == 'gpt2' and c.table.baseline == 'gpt2' and 'gpt2_2x4' in c.variants.split(',')
    assert demos.pretrain_command(c) == ['train.py', 'config/gpt2_demo.py', f'--out_dir={tmp_path}/runs/pretrain',
                                         '--always_save_checkpoint=True', '--max_iters=5']
    cmd = demos.command(c, 'infformer_sticky', 2)
    assert cmd[1] == 'config/infformer_gpt2_demo.py' and '--sticky=True' in cmd
    assert f'--init_from=gpt2:{tmp_path}/runs/pretrain' in cmd and cmd[-1] == '--max_iters=5'
    run = tmp_path / 'runs' / 'infformer_sticky' / 'seed2'
    run.mkdir(parents=True)
    (run / 'ckpt.pt').write_bytes(b'')
    cmd = demos.command(c, 'infformer_sticky', 2)
    assert '--init_from=resume' in cmd and not any(f.startswith('--init_from=gpt2') for f in cmd)
    ev = demos.eval_command(c, 'infformer_sticky_emptied', 2)
    assert ev[:3] == ['train.py', 'config/infformer_gpt2_demo.py', '--sticky=True']
    assert {f'--out_dir={run}', '--init_from=resume', '--eval_only=True', '--eval_reset_memory=True'} <= set(ev)
    assert set(demos.GPT2_EVALS) == {f'{v}_emptied' for v in demos.GPT2_VARIANTS if not v.startswith('gpt2')}
    for label, (config, _) in demos.GPT2_VARIANTS.items():
        assert (demos.common.REPO / config).exists(), label
    assert not demos.pretrain_done(c)
    fake_log(tmp_path / 'runs' / 'pretrain', [(5, 6.0)])
    assert demos.pretrain_done(c)


def test_byte_suite(tmp_path):
    """--suite=bytes: its own variants (same segment and schedule for each), out_root, results name and buckets."""
    c = demos.DemosConfig(suite='bytes')
    assert c.out_root == 'out-demos-bytes' and c.name == 'bytes'
    assert demos.selected(c) == ['baseline', 'xl', 'xl_mem512']
    assert demos.selected(demos.DemosConfig(suite='bytes', variants='all'))[-1] == 'compressive'
    parsed = {label: demos.train.parse_args([str(demos.common.REPO / config), *flags])
              for label, (config, flags) in demos.BYTE_VARIANTS.items()}
    assert {(t.dataset, m.seg_len, m.n_layer, m.n_embd, t.batch_size, t.max_iters, t.learning_rate, t.eval_tokens)
            for t, _, m, _ in parsed.values()} == {('gutenberg_bytes', 128, 4, 128, 8, 1500, 2e-3, 65536)}
    assert {label: m.mem_len for label, (_, _, m, _) in parsed.items()} == {
        'baseline': 0, 'xl': 128, 'xl_mem512': 512, 'compressive': 128}
    m = parsed['compressive'][2]
    assert m.mem_len + m.cmem_len * m.compression_rate == 512          # as far back as xl_mem512's memory
    cmd = demos.command(cfg(tmp_path, suite='bytes'), 'xl_mem512', 3)
    assert cmd[:4] == ['train.py', 'config/xl_bytes_demo.py', '--seed=3', f'--out_dir={tmp_path}/runs/xl_mem512/seed3']
    with pytest.raises(train.UserError, match="'infini_linear' of suite bytes"):
        demos.selected(cfg(tmp_path, suite='bytes', variants='infini_linear'))


def test_code_suites(tmp_path):
    """--suite=code (bytes of SymPy's source) and code_tokens (the token demo on it): the same model and schedule for
    every variant, only the memory differs; read by copy distance too (longdoc --position=copy)."""
    for suite, variants, dataset, seg_len, steps, mems in (
            ('code', demos.CODE_VARIANTS, 'sympy_bytes', 128, 6000, {'baseline': 0, 'xl': 128, 'xl_mem512': 512}),
            ('code_tokens', demos.CODE_TOKEN_VARIANTS, 'sympy', 64, 1000, {'baseline': 0, 'xl': 64, 'xl_mem512': 512})):
        c = demos.DemosConfig(suite=suite)
        assert c.out_root == f"out-demos-{suite.replace('_', '-')}" and c.name == suite and c.table.copy_buckets
        assert demos.selected(c) == list(mems)
        parsed = {label: demos.train.parse_args([str(demos.common.REPO / config), *flags])
                  for label, (config, flags) in variants.items()}
        assert {(t.dataset, m.seg_len, m.n_layer, m.n_embd, t.batch_size * t.bptt_segments, t.max_iters,
                 t.learning_rate, t.eval_tokens) for t, _, m, _ in parsed.values()} == {
            (dataset, seg_len, 4, 128, 8, steps, parsed['baseline'][0].learning_rate, 32768 * seg_len // 64)}
        assert {label: (parsed[label][2].mem_len, parsed[label][0].eval_mem_len) for label in mems} == {
            label: (mem, mem) for label, mem in mems.items()}            # each evaluated with its own memory
        for label, (variant, flags) in c.table.ablations.items():
            assert variant in variants and flags[0].startswith(('--eval_mem_len=', '--reset_every=')), label
        for control, others in c.table.matched.items():
            assert {control, *others} <= set(variants), control


def test_code_suite_every_model():
    """--suite=code's other models (named, or --variants=all), each trained as its paper trains it at the calibrated
    setting: 1,024 new bytes a step (Infini: 2 streams x 4 segments, BPTT over them, emptied every 4), the memories
    placed against XL's 128 slots, read with 128 and (the authors' longer evaluation memory) 512, the feeding and
    compressed-memory controls; each one's memory emptied by an ablation."""
    c = demos.DemosConfig(suite='code')
    assert c.variants == 'baseline,xl,xl_mem512'                          # a default run is the calibration
    assert set(demos.selected(demos.DemosConfig(suite='code', variants='all'))) == set(demos.CODE_VARIANTS) == {
        'baseline', 'xl', 'xl_mem512', *demos.CODE_MODELS, *demos.CODE_CONTROLS}
    p = {label: demos.train.parse_args([str(demos.common.REPO / config), *flags])
         for label, (config, flags) in demos.CODE_VARIANTS.items()}
    assert {label: t.model for label, (t, _, _, _) in p.items()} == {
        'baseline': 'xl', 'xl': 'xl', 'xl_mem512': 'xl', 'lamemo': 'lamemo', 'compressive': 'compressive',
        'infini_linear': 'infini', 'infini_delta': 'infini', 'infformer': 'infformer', 'infformer_sticky': 'infformer',
        'compressive_no_cmem': 'compressive', 'baseline_2x4': 'xl', 'infini_linear_bptt1': 'infini'}
    model = lambda label: p[label][2]
    train_cfg = lambda label: p[label][0]
    xl = train_cfg('xl')
    for label, (t, _, m, _) in p.items():                           # the calibrated setting, but for the memory
        assert (t.dataset, m.seg_len, m.n_layer, m.n_head, m.d_head, m.d_inner, m.dropout) == (
            'sympy_bytes', 128, 4, 4, 32, 512, 0.1), label
        assert t.batch_size * t.bptt_segments * m.seg_len == 1024, label
        assert (t.max_iters, t.learning_rate, t.warmup_iters, t.min_lr, t.grad_clip, t.eval_interval, t.eval_tokens,
                t.eval_batch_size) == (xl.max_iters, xl.learning_rate, xl.warmup_iters, xl.min_lr, xl.grad_clip,
                                       xl.eval_interval, xl.eval_tokens, xl.eval_batch_size), label
        if hasattr(m, 'mem_len'):
            assert t.eval_mem_len in (-1, m.mem_len), label             # evaluated with its own memory
    for label in ('lamemo', 'compressive', 'compressive_no_cmem', 'infformer', 'infformer_sticky'):
        assert model(label).mem_len == model('xl').mem_len == 128, label   # XL's, as long as the segment
    m = model('compressive')
    assert (m.cmem_len, m.compression_rate, m.compression, m.recon_loss) == (192, 2, 'conv', 'attention')
    assert m.mem_len + m.cmem_len * m.compression_rate == 512 == model('xl_mem512').mem_len   # as far as 512 slots
    assert demos.CODE_ABLATIONS['xl_at512'] == ('xl', ['--eval_mem_len=512'])   # XL read with them (the authors' way)
    assert (model('compressive_no_cmem').cmem_len, model('compressive_no_cmem').recon_loss) == (0, 'none')
    for label, update, streams, bptt in (('infini_linear', 'linear', 2, 4), ('infini_delta', 'delta', 2, 4),
                                         ('infini_linear_bptt1', 'linear', 8, 1)):
        t = train_cfg(label)
        assert (model(label).memory_update, t.batch_size, t.bptt_segments, t.reset_every) == (
            update, streams, bptt, 4), label                           # inputs of 4 segments, a fresh memory each
    assert (train_cfg('baseline_2x4').batch_size, train_cfg('baseline_2x4').bptt_segments,
            model('baseline_2x4').mem_len) == (2, 4, 0)                 # the baseline fed as Infini
    assert (model('infformer').sticky, model('infformer_sticky').sticky) == (False, True)
    assert (model('infformer').n_basis, model('infformer').n_samples) == (150, 150)
    assert not set(demos.CODE_MODELS + demos.CODE_CONTROLS) & set(demos.selected(c))
    # every model with a memory read with it emptied: mem_len 0 where XL's memory is all of it, otherwise a reset
    # before every segment (the compressed memory, Infini's, the ∞-former's STM and LTM: test_ablations_empty_...)
    reset = ('compressive', 'infini_linear', 'infini_delta', 'infini_linear_bptt1', 'infformer', 'infformer_sticky')
    emptied = {variant: flags for variant, flags in demos.CODE_ABLATIONS.values()
               if flags not in (['--reset_every=-1'], ['--eval_mem_len=128'], ['--eval_mem_len=512'])}
    assert emptied == {**{v: ['--eval_mem_len=0'] for v in ('xl', 'xl_mem512', 'lamemo', 'compressive_no_cmem')},
                       **{v: ['--reset_every=1'] for v in reset}}
    assert set(emptied) == {label for label in p if getattr(model(label), 'mem_len', 1)}   # none forgotten
    for label, (variant, flags) in demos.CODE_ABLATIONS.items():
        assert variant in p and (flags[0].startswith('--reset_every=') or hasattr(model(variant), 'mem_len')), label
    assert demos.CODE_MATCHED['baseline_2x4'] == ('infini_linear', 'infini_delta', 'infini_linear_bptt1')
    assert demos.CODE_MATCHED['compressive_no_cmem'] == ('compressive',)
    assert set(demos.CODE_MODELS) - {'infini_linear', 'infini_delta'} <= set(demos.CODE_MATCHED['xl'])


def test_code_ablations_empty_every_memory():
    """Each code ablation that empties a memory reads a document as if every segment were a document of its own (its
    memory fresh), on tiny random models of each variant's config: the carried memory does change the losses (the
    check is not empty), and the ∞-former's --eval_mem_len=0 would still read its LTM (so it is reset instead)."""
    import dataclasses
    import numpy as np
    import torch
    T, doc = 8, np.random.RandomState(0).randint(0, 256, 5 * 8 + 1).astype(np.int64)   # 5 segments
    tiny = dict(n_layer=2, n_head=2, n_embd=16, d_head=8, d_inner=32, seg_len=T, vocab_size=256, mem_len=8,
                cmem_len=4, n_basis=8, n_samples=8)                     # (those > 0 in the config: not cmem 0's)
    read = lambda model, reset_every=0: np.concatenate(demos.longdoc.document_nll(
        model, [doc], T, 1, 'cpu', reset_every=reset_every))
    same_mem_len = lambda model, mem_len: module.Model(dataclasses.replace(model.config, mem_len=mem_len)).eval()
    seen = set()
    for label, (variant, flags) in demos.CODE_ABLATIONS.items():
        if flags not in (['--eval_mem_len=0'], ['--reset_every=1']):
            continue
        config, train_flags = demos.CODE_VARIANTS[variant]
        _, module, model_cfg, _ = train.parse_args([str(demos.common.REPO / config), *train_flags])
        model_cfg = dataclasses.replace(model_cfg, **{k: v for k, v in tiny.items() if getattr(model_cfg, k, 0)})
        if (repr(model_cfg), *flags) in seen:                            # e.g. xl_mem512's at this size is xl's
            continue
        seen.add((repr(model_cfg), *flags))
        torch.manual_seed(0)
        model = module.Model(model_cfg).eval()
        fresh = np.concatenate([demos.longdoc.document_nll(model, [doc[a:a + T + 1]], T, 1, 'cpu')[0]
                                for a in range(0, len(doc) - 1, T)])          # every segment a document
        if flags == ['--reset_every=1']:
            emptied = read(model, reset_every=1)
        else:                                                  # bench/longdoc.py's --eval_mem_len: same weights
            without = same_mem_len(model, 0)
            without.load_state_dict(model.state_dict())
            emptied = read(without)
        assert np.abs(emptied - fresh).max() < 1e-6, label
        assert np.abs(read(model) - fresh).max() > 1e-5, label          # the memory matters in this document
        if model_cfg.__module__ == 'model_infformer':                    # no STM, but the LTM still read
            stm0 = same_mem_len(model, 0)
            stm0.load_state_dict(model.state_dict())
            assert np.abs(read(stm0) - fresh).max() > 1e-5, label
    assert len(seen) >= 8


def test_finished_runs_and_summary(tmp_path):
    c = cfg(tmp_path, overrides=' --max_iters=20')
    assert demos.max_iters(c, 'xl') == 20 and demos.max_iters(cfg(tmp_path), 'xl') == 1000
    fake_log(tmp_path / 'runs' / 'xl' / 'seed1', [(10, 5.0), (20, 4.5)])
    fake_log(tmp_path / 'runs' / 'xl' / 'seed2', [(10, 5.0), (20, 4.1)])
    fake_log(tmp_path / 'runs' / 'xl' / 'seed3', [(10, 4.0)])          # stopped at step 10: not finished
    assert [demos.is_done(c, 'xl', s) for s in (1, 2, 3, 4)] == [True, True, False, False]
    r = demos.summary(c, ['xl', 'lamemo'], [1, 2, 3])
    assert r['xl']['seeds'] == {1: 4.5, 2: 4.1}
    assert r['xl']['mean'] == pytest.approx(4.3) and r['xl']['std'] == pytest.approx(statistics.stdev([4.5, 4.1]))
    assert r['lamemo']['mean'] is None and r['lamemo']['seeds'] == {}
    assert r['xl']['command'].startswith('python train.py config/xl_demo.py --seed={seed}')


def test_a_run_kept_counts_as_finished_and_a_retrained_one_replaces_its_readings(tmp_path):
    """What a finished run kept (final.json) makes it finished once its out_dir is gone; trained again (another last
    evaluation in its out_dir), its old readings and evaluations are dropped and the new evaluation kept."""
    c = cfg(tmp_path, overrides=' --max_iters=20', results=str(tmp_path / 'results'), longdoc=False)
    fake_log(tmp_path / 'runs' / 'xl' / 'seed1', [(20, 4.5)])
    demos.keep_results(c, 'xl', 1)
    assert demos.kept_eval(c, 'xl', 1) == {'step': 20, 'validation/loss': 4.5}
    stale = [demos.reading_path(c, 'xl', 1, ''), demos.record_dir(c, 'xl', 1) / 'eval_xl_nomem.json']
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{}')
    shutil.rmtree(tmp_path / 'runs')
    assert demos.is_done(c, 'xl', 1) and demos.summary(c, ['xl'], [1])['xl']['seeds'] == {1: 4.5}
    demos.keep_results(c, 'xl', 1)                                       # nothing to replace
    assert all(path.exists() for path in stale)
    fake_log(tmp_path / 'runs' / 'xl' / 'seed1', [(20, 4.25)])          # trained again
    demos.keep_results(c, 'xl', 1)
    assert demos.kept_eval(c, 'xl', 1)['validation/loss'] == 4.25 and not any(path.exists() for path in stale)
    assert not demos.is_done(cfg(tmp_path, overrides=' --max_iters=40', results=str(tmp_path / 'results')), 'xl', 1)
    shutil.rmtree(tmp_path / 'runs')
    (demos.record_dir(c, 'xl', 1) / 'final.json').write_text('{"step": 2')
    with pytest.raises(train.UserError, match='damaged'):
        demos.is_done(c, 'xl', 1)


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert_bad_input_is_one_line('bench/demos.py', demos.main, [f'--out_root={tmp_path}'], [
        (['--variants=xl,nope'], "'nope'"), (['--jobs=0'], 'jobs'), (['--threads=-1'], 'threads'),
        (['--seeds=1,x'], 'seeds'), (['--suite=chars'], 'suite'), (['--nonsense=1'], 'nonsense')], capsys)


def test_end_to_end(tmp_path, capsys):
    """Two variants x two seeds of tiny train.py runs in subprocesses, then the summary and longdoc; a second call
    trains nothing (every run is finished)."""
    data = dataset(tmp_path / 'data', bytes_tokenizer())
    argv = ['--variants=baseline,xl', '--seeds=1,2', f'--out_root={tmp_path / "runs"}', '--jobs=2',
            f'--overrides={TINY} --data_dir={data}', f'--results={tmp_path}', '--split=validation']
    demos.main(argv)
    result = json.loads((tmp_path / 'demos.json').read_text())['runs']
    assert sorted(result) == ['baseline', 'xl'] and all(len(r['seeds']) == 2 for r in result.values())
    longdoc_result = json.loads((tmp_path / 'longdoc_demos.json').read_text())
    assert longdoc_result['baseline'] == 'baseline' and list(longdoc_result['labels']) == ['baseline', 'xl']
    nomem = json.loads((tmp_path / 'longdoc_demos_xl_nomem.json').read_text())    # XL's weights, memory 0
    assert nomem['config']['eval_mem_len'] == 0 and len(nomem['labels']['xl_nomem']['runs']) == 2
    assert all(r['mem_len'] == 0 for r in nomem['runs'].values())
    # the same weights paired by document and seed: the difference of the two reads' bucket means, with an se
    pairs = zip(nomem['vs_as_trained'], nomem['labels']['xl_nomem']['buckets'],
                longdoc_result['labels']['xl']['buckets'])
    for same, without, with_memory in pairs:
        if with_memory['tokens'] == 0:                                   # a bucket past every document's end
            assert same['diff_nll'] is None and without['nll'] is None
            continue
        assert same['diff_nll'] == pytest.approx(without['nll'] - with_memory['nll'], abs=1e-12)
        assert same['diff_bpc'] == pytest.approx(without['bpc'] - with_memory['bpc'], abs=1e-12)
    assert any(same['diff_nll'] not in (0, None) for same in nomem['vs_as_trained'])   # memory changes later tokens
    assert not (tmp_path / 'longdoc_demos_vs_xl.json').exists()          # nothing to compare with XL
    ckpt = train.load_checkpoint(tmp_path / 'runs' / 'baseline' / 'seed2' / 'ckpt.pt')
    assert ckpt['model_config']['mem_len'] == 0 and ckpt['step'] == 2 and ckpt['train_config']['seed'] == 2
    capsys.readouterr()
    demos.main(argv + ['--longdoc=False'])
    assert 'runs,' not in capsys.readouterr().out                      # nothing left to train
    # what the runs kept outlives their out_dirs: the same results from the kept readings, nothing trained again
    kept = demos.DemosConfig(out_root=str(tmp_path / 'runs'), results=str(tmp_path), split='validation')
    assert demos.kept_eval(kept, 'xl', 2)['step'] == 2 and sorted(
        p.name for p in demos.reading_path(kept, 'xl', 2, '').parent.iterdir()) == [
        'longdoc.json', 'longdoc_xl_nomem.json']
    before = {name: json.loads((tmp_path / name).read_text()) for name in ('demos.json', 'longdoc_demos.json',
                                                                          'longdoc_demos_xl_nomem.json')}
    shutil.rmtree(tmp_path / 'runs')
    demos.main(argv)
    assert 'runs,' not in capsys.readouterr().out
    for name, old in before.items():
        new = json.loads((tmp_path / name).read_text())
        assert new['runs'] == old['runs'] and new.get('labels') == old.get('labels') and new.get(
            'vs_as_trained') == old.get('vs_as_trained'), name
    demos.reading_path(kept, 'xl', 1, '_xl_nomem').unlink()            # a reading lost with its checkpoint
    with pytest.raises(SystemExit):
        demos.main(argv)
    assert "no reading longdoc_xl_nomem.json kept" in assert_one_line_error(capsys.readouterr().err)


def test_code_suite_end_to_end(tmp_path):
    """--suite=code on a toy byte corpus: tiny runs, then longdoc by position and by copy distance (both bucket
    sets), with the first occurrences as a bucket of their own and every predicted token in one bucket."""
    data = dataset(tmp_path / 'data', bytes_tokenizer())
    demos.main(['--suite=code', '--variants=baseline,xl', '--seeds=1', f'--out_root={tmp_path / "runs"}',
                '--jobs=2', f'--overrides={TINY} --data_dir={data}', f'--results={tmp_path}', '--split=validation'])
    by_position = json.loads((tmp_path / 'longdoc_demos_code.json').read_text())
    predicted = sum(b['tokens'] for b in by_position['labels']['baseline']['buckets'])
    for name, edges in demos.CODE_COPY_BUCKETS.items():
        result = json.loads((tmp_path / f'longdoc_demos_code{name}.json').read_text())
        assert result['position'] == 'copy' and result['copy_ngram'] == 6 and list(result['labels']) == [
            'baseline', 'xl'] and result['bucket_edges'] == [int(e) for e in edges.split(',')]
        buckets = result['labels']['xl']['buckets']
        assert buckets[-1]['bucket'] == 'first' and sum(b['tokens'] for b in buckets) == predicted
    for name in ('', *demos.CODE_COPY_BUCKETS):       # the memory emptied, and 512 slots: by position and copy distance
        for ablation, mem_len in (('xl_nomem', 0), ('xl_at512', 512)):
            read = json.loads((tmp_path / f'longdoc_demos_code_{ablation}{name}.json').read_text())
            assert len(read['vs_as_trained']) == len(read['bucket_names']) and all(
                r['mem_len'] == mem_len for r in read['runs'].values())
    for name in demos.CODE_COPY_BUCKETS:                             # 512 slots beside the runs, by copy distance
        joined = json.loads((tmp_path / f'longdoc_demos_code{name}_with_xl_at512.json').read_text())
        assert list(joined['labels']) == ['xl_at512', 'baseline', 'xl'] and joined['baseline'] == 'baseline'
        assert [joined['runs'][r]['mem_len'] for r in joined['labels']['xl_at512']['runs']] == [512]


def test_code_suite_every_model_trains(tmp_path):
    """Every code variant beyond the calibration trains (2 steps, tiny: TINY at 2 layers, LaMemo's least) on a toy
    byte corpus from its suite command, in-process, and its checkpoint keeps its own feeding and memory."""
    data = dataset(tmp_path / 'data', bytes_tokenizer())
    c = demos.DemosConfig(suite='code', out_root=str(tmp_path / 'runs'),
                          overrides=f'{TINY} --n_layer=2 --data_dir={data}')
    for label in (*demos.CODE_MODELS, *demos.CODE_CONTROLS):
        cmd = demos.command(c, label, 1)
        train.main([str(demos.common.REPO / cmd[1]), *cmd[2:]])
        assert demos.is_done(c, label, 1), label
        ckpt = train.load_checkpoint(demos.run_dir(c, label, 1) / 'ckpt.pt')
        tc, mc = ckpt['train_config'], ckpt['model_config']
        assert (ckpt['step'], mc['n_layer'], mc['seg_len'], tc['dataset']) == (2, 2, 8, 'sympy_bytes'), label
        if label.startswith('infini'):
            assert (tc['bptt_segments'], tc['reset_every'], mc['memory_update']) == (
                1 if label.endswith('bptt1') else 4, 4, 'delta' if 'delta' in label else 'linear'), label
        else:
            assert mc['mem_len'] == (0 if label == 'baseline_2x4' else 128), label
        assert mc.get('cmem_len', 192) == (0 if label == 'compressive_no_cmem' else 192), label
        assert mc.get('sticky', label == 'infformer_sticky') == (label == 'infformer_sticky'), label


def test_matched_control(tmp_path):
    """Infini's demo reads 2 streams x 4 segments a step: it is also compared with the baseline fed the same way."""
    data = dataset(tmp_path / 'data', bytes_tokenizer())
    demos.main(['--variants=baseline_2x4,infini_linear', '--seeds=1', f'--out_root={tmp_path / "runs"}', '--jobs=2',
                f'--overrides={TINY} --data_dir={data}', f'--results={tmp_path}', '--split=validation'])
    ckpt = train.load_checkpoint(tmp_path / 'runs' / 'baseline_2x4' / 'seed1' / 'ckpt.pt')
    assert (ckpt['train_config']['batch_size'], ckpt['train_config']['bptt_segments']) == (2, 4)
    matched = json.loads((tmp_path / 'longdoc_demos_vs_baseline_2x4.json').read_text())
    assert matched['baseline'] == 'baseline_2x4' and list(matched['labels']) == ['baseline_2x4', 'infini_linear']
    as_trained = json.loads((tmp_path / 'longdoc_demos_infini_linear_as_trained.json').read_text())
    assert [r['reset_every'] for r in as_trained['runs'].values()] == [4]   # infini_demo's inputs of 4 segments


# the code_gpt2 suite's toy end to end: code as bytes, the pretraining and the fine-tunes on different train texts
CODE_A = "def area(width, height):\n    return width * height\n\n\nprint(area(3, 4))\n"
CODE_B = "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n\n"
CODE_HELD_OUT = ("def norm(vector):\n    return sum(v * v for v in vector) ** 0.5\n" * 3,
                 "import math\n\n\ndef angle(a, b):\n    return math.atan2(b, a)\n" * 2)
TINY_GPT2 = ' --n_layer=1 --n_head=2 --n_embd=16 --n_positions=80'       # the pretraining's: the checkpoint fixes it
TINY_FINETUNE = (' --seg_len=80 --batch_size=2 --max_iters=2 --eval_interval=1000 --eval_tokens=64 --eval_batch_size=2'
                 ' --device=cpu --compile=False --log_interval=1')    # every run's (seg_len above the segment buckets)


def code_dataset(root, train_text):
    """A byte dataset, as the suite's: two training documents of train_text, CODE_HELD_OUT as validation and test."""
    from data import shards
    from data.tokenizer import bytes_tokenizer
    tokenizer = bytes_tokenizer()
    splits = {'train': [train_text * 12, train_text * 6], 'validation': list(CODE_HELD_OUT),
              'test': list(CODE_HELD_OUT)}
    shards.write_dataset(str(root), splits, lambda text: shards.encode_doc(text, words=len(text.split()),
                                                                           tokenizer=tokenizer),
                         dataset='fixture', source='test', word_rule='split', tokenizer=tokenizer)
    return Path(root)


def test_code_gpt2_suite(tmp_path):
    """--suite=code_gpt2: GPT-2 pretrained once on one half of the code as bytes (config/gpt2_code_pretrain.py,
    sympy_bytes_pretrain, the code suite's size, segment and steps), every GPT-2 form of the gpt2 suite fine-tuned from
    it on the other half (sympy_bytes_finetune) at the pretraining's segment and bytes a step, each memory scaled with
    the segment as its gpt2 config scales it, the same evaluations, copy-distance buckets within the forms' reach;
    --pretrain_overrides reach the pretraining only."""
    c = demos.DemosConfig(suite='code_gpt2', out_root=str(tmp_path / 'runs'), overrides=' --max_iters=5',
                          pretrain_overrides=' --max_iters=7 --data_dir=pre')
    assert (c.name, c.out_root, c.table.baseline) == ('code_gpt2', str(tmp_path / 'runs'), 'gpt2')
    assert demos.DemosConfig(suite='code_gpt2').out_root == 'out-demos-code-gpt2'
    assert c.variants.split(',') == list(demos.GPT2_VARIANTS)
    assert demos.pretrain_command(c) == ['train.py', 'config/gpt2_code_pretrain.py',
                                         f'--out_dir={tmp_path}/runs/pretrain', '--always_save_checkpoint=True',
                                         '--max_iters=5', '--max_iters=7', '--data_dir=pre']   # its own flags last
    fake_log(tmp_path / 'runs' / 'pretrain', [(5, 6.0)])
    assert not demos.pretrain_done(c)                                    # its max_iters is pretrain_overrides' 7
    suite, gpt2 = c.table, demos.SUITES['gpt2']
    parse = lambda config, *flags: demos.train.parse_args([str(demos.common.REPO / config), *flags])
    pre, _, pre_model, _ = parse(suite.pretrain)
    code, _, code_model, _ = parse('config/xl_code_demo.py')
    assert (pre.model, pre.dataset) == ('gpt2', 'sympy_bytes_pretrain')      # vocab_size: the data's, 256
    assert (pre_model.n_layer, pre_model.n_head, pre_model.n_embd, pre_model.seg_len) == (
        code_model.n_layer, code_model.n_head, code_model.n_embd, code_model.seg_len)     # the code suite's size
    assert (pre.max_iters, pre.batch_size) == (code.max_iters, code.batch_size)
    seg = pre_model.seg_len
    forms = {}
    for label, (config, flags) in demos.CODE_GPT2_VARIANTS.items():      # the gpt2 suite's, reading the other half
        assert (config, flags) == (gpt2.variants[label][0], [*demos.CODE_GPT2_FLAGS, *gpt2.variants[label][1],
                                                             *demos.CODE_GPT2_SCALED.get(label, [])])
        cmd = demos.command(c, label, 1)
        assert f'--init_from=gpt2:{tmp_path}/runs/pretrain' in cmd and '--data_dir=pre' not in cmd
        t, _, m, _ = parse(config, *flags)
        assert (t.dataset, m.seg_len, t.eval_tokens) == ('sympy_bytes_finetune', seg, code.eval_tokens), label
        assert t.batch_size * t.bptt_segments * m.seg_len == pre.batch_size * seg, label   # bytes a step, as pretrained
        own = parse(config)[0]
        assert (t.max_iters, t.learning_rate) == (5 * own.max_iters, own.learning_rate), label   # 1,500 at its rate
        assert m.seg_len <= pre_model.n_positions, label
        forms[label] = m
    # each memory scaled from its gpt2 config's 64-token segment to 128 bytes as that config scales it to 64
    inf, comp = forms['infformer'], forms['compressive']
    token_inf = parse('config/infformer_gpt2_demo.py')[2]
    assert (inf.n_basis, inf.n_samples, inf.ltm_reset_len) == (seg, 2 * seg, 4 * seg)
    assert (token_inf.n_basis, token_inf.n_samples) == (token_inf.seg_len, 2 * token_inf.seg_len)
    assert forms['infformer_sticky'].n_basis == inf.n_basis and forms['infformer_sticky'].sticky
    assert (comp.cmem_len, comp.mem_len, comp.compression_rate) == (inf.n_basis, 0, 2)
    assert (suite.evals, suite.matched) == (gpt2.evals, gpt2.matched)
    assert (suite.buckets, suite.segment_buckets) == (demos.BYTE_BUCKETS, '4,16,64')
    assert int(suite.segment_buckets.split(',')[-1]) < seg
    # the reach buckets: the window, then Compressive's, the ∞-former's and beyond, for each form's memory
    assert suite.copy_buckets['_copy_reach'] == ','.join(map(str, (
        seg, seg + comp.mem_len + comp.cmem_len * comp.compression_rate, seg + inf.ltm_reset_len)))
    assert suite.copy_buckets['_copy'].split(',')[0] == str(seg)


def test_code_gpt2_end_to_end(tmp_path):
    """--suite=code_gpt2 on toy code: a tiny pretraining on one toy corpus (--pretrain_overrides' --data_dir), GPT-2
    alone and the ∞-former fine-tuned from it on another, then the summary (the pretrained model evaluated as the
    control, the ∞-former with its memory emptied) and longdoc by position, in the segment and by copy distance."""
    pre, fine = code_dataset(tmp_path / 'pre', CODE_A), code_dataset(tmp_path / 'fine', CODE_B)
    runs = tmp_path / 'runs'
    demos.main(['--suite=code_gpt2', '--variants=gpt2,infformer', '--seeds=1', f'--out_root={runs}', '--jobs=2',
                f'--overrides={TINY_FINETUNE} --data_dir={fine}', f'--pretrain_overrides={TINY_GPT2} --data_dir={pre}',
                f'--results={tmp_path}', '--split=validation'])
    pretrain = train.load_checkpoint(runs / 'pretrain' / 'ckpt.pt')
    assert pretrain['train_config']['data_dir'] == str(pre) and pretrain['model_config']['n_embd'] == 16
    for label in ('gpt2', 'infformer'):
        ckpt = train.load_checkpoint(runs / label / 'seed1' / 'ckpt.pt')
        t = ckpt['train_config']
        assert (t['data_dir'], t['dataset'], t['init_from']) == (str(fine), 'sympy_bytes_finetune',
                                                                 f'gpt2:{runs}/pretrain')
        assert ckpt['step'] == 2 and ckpt['model_config']['n_embd'] == 16
    result = json.loads((tmp_path / 'demos_code_gpt2.json').read_text())
    assert sorted(result['runs']) == ['gpt2', 'infformer']
    assert all(len(r['seeds']) == 1 for r in result['runs'].values())
    assert result['pretrained']['validation/loss'] > 0 and 'gpt2_finetune_demo.py' in result['pretrained']['command']
    assert list(result['evals']) == ['infformer_emptied'] and result['evals']['infformer_emptied']['mean'] > 0
    by_position = json.loads((tmp_path / 'longdoc_demos_code_gpt2.json').read_text())
    assert by_position['baseline'] == 'gpt2' and list(by_position['labels']) == ['gpt2', 'infformer']
    assert json.loads((tmp_path / 'longdoc_demos_code_gpt2_segment.json').read_text())['position'] == 'segment'
    predicted = sum(b['tokens'] for b in by_position['labels']['gpt2']['buckets'])
    for name, edges in demos.CODE_GPT2_COPY_BUCKETS.items():
        copy = json.loads((tmp_path / f'longdoc_demos_code_gpt2{name}.json').read_text())
        assert copy['position'] == 'copy' and copy['baseline'] == 'gpt2' and list(copy['labels']) == [
            'gpt2', 'infformer'] and copy['bucket_edges'] == [int(e) for e in edges.split(',')]
        buckets = copy['labels']['infformer']['buckets']
        assert buckets[-1]['bucket'] == 'first' and sum(b['tokens'] for b in buckets) == predicted
        assert buckets[0]['tokens'] > 0                                  # the toy code repeats within the window
