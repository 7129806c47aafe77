"""
Smoke runs of bench/ (speed, scaling, recall, plot) at tiny sizes, for every model variant in the repository, so
the benchmarks never rot; plus checks of what the benchmarks rely on: the passkey and sorting episodes are what
they claim, recomputing the window gives the cached generation's tokens, a Infini / ∞-former state does not grow
with the history, and a model without memory scores the same with its memory emptied.
"""

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'bench'))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import attn_kernels  # noqa: E402
import common  # noqa: E402
import plot  # noqa: E402
import recall  # noqa: E402
import scaling  # noqa: E402
import speed  # noqa: E402
from _models import TINY_MODELS  # noqa: E402

# bench variant -> its tiny config (tests/_models.py), with the variant's own memory fields
TINY_VARIANTS = {
    'baseline': dict(TINY_MODELS['xl'], mem_len=0),
    'xl': TINY_MODELS['xl'],
    'lamemo': TINY_MODELS['lamemo'],
    'compressive': TINY_MODELS['compressive'],
    'infini_linear': dict(TINY_MODELS['infini'], memory_update='linear'),
    'infini_delta': dict(TINY_MODELS['infini'], memory_update='delta'),
    'infformer': dict(TINY_MODELS['infformer'], sticky=False),
    'infformer_sticky': dict(TINY_MODELS['infformer'], sticky=True),
}

# the GPT-2 suite (speed.py --suite=gpt2): GPT-2 alone and its memory forms, tiny, with the suite's training flags
TINY_GPT2_VARIANTS = {
    'gpt2': TINY_MODELS['gpt2'],
    'infformer_gpt2': dict(TINY_MODELS['infformer_gpt2'], sticky=False),
    'compressive_gpt2': TINY_MODELS['compressive_gpt2'],
    'infini_gpt2': dict(TINY_MODELS['infini_gpt2'], bptt_segments=2, reset_every=2),
}


def has_matplotlib():
    try:
        plot._plt()
        return True
    except plot.NoMatplotlib:
        return False


def test_tiny_table_covers_the_bench_table():
    assert set(TINY_VARIANTS) == set(common.variant_table())


# -----------------------------------------------------------------------------------------------------------
# speed


def test_a_missing_model_is_an_error_unless_strict_is_off():
    table = {'baseline': TINY_VARIANTS['baseline'], 'gone': dict(model='nosuchmodel'),
             'renamed': dict(TINY_VARIANTS['xl'], no_such_field=1)}
    for name in ('gone', 'renamed'):
        with pytest.raises(common.train.UserError, match=name):
            common.select(table, ['baseline', name], strict=True)
    specs, skipped = common.select(table, 'all', strict=False)
    assert list(specs) == ['baseline'] and set(skipped) == {'gone', 'renamed'}
    assert speed.SpeedConfig().strict and scaling.ScalingConfig().strict and recall.RecallConfig().strict


@pytest.mark.parametrize('variant', list(TINY_VARIANTS))
def test_speed_smoke(variant, tmp_path):
    names = ['baseline'] + ([variant] if variant != 'baseline' else [])
    cfg = speed.SpeedConfig(modes='eager,bf16', eval_modes='eager', batch_size=2, warmup=1, steps=1,
                            gen_seg_len=8, gen_tokens=4, gen_rounds=1, out=str(tmp_path / 'speed.json'), plot=False,
                            force_bf16=True,      # this CPU may lack native bf16: time it anyway (tiny)
                            peak_size=256)        # a (1024 x 1024) bf16 product there takes seconds
    speed.run(cfg, {n: TINY_VARIANTS[n] for n in names}, {})
    r = json.loads((tmp_path / 'speed.json').read_text())
    for n in names:
        assert r['train'][n]['eager']['tokens_per_s'] > 0 and r['train'][n]['bf16']['tokens_per_s'] > 0
        assert r['eval'][n]['eager']['tokens_per_s'] > 0
        # recomputing the window through forward() picks the cached generate()'s greedy tokens
        assert r['generate'][n]['same_greedy_tokens'], n
    assert r['train']['baseline']['eager']['ratio_to_baseline'] == 1.0
    for n in names:                     # the FLOP ratio and the MFU from the models' own flops_per_token
        e = r['train'][n]['eager']
        assert e['flop_ratio'] == pytest.approx(r['flops_per_token']['baseline'] / r['flops_per_token'][n])
        assert e['ratio_over_flop_ratio'] == pytest.approx(e['ratio_to_baseline'] / e['flop_ratio'])
        peak = r['matmul_peak_flops']['float32']
        assert e['mfu'] == pytest.approx(r['flops_per_token'][n] * e['tokens_per_s'] / peak)
        assert 0 < e['mfu'] < 1.5
        assert e['minor_faults_per_step'] >= 0 if speed.resource else 'minor_faults_per_step' not in e
    assert r['bf16_matmul']['bf16_slowdown'] > 0 and r['bf16_skipped'] is None     # measured; forced: not dropped
    assert 'command' in r and 'date' in r
    plot.table([tmp_path / 'speed.json'])          # the README's markdown
    if variant == 'xl' and has_matplotlib():
        assert plot.plot_speed(tmp_path / 'speed.json', tmp_path / 'speed.png').stat().st_size > 1000


def test_speed_vocab_flag_sets_the_vocabulary(tmp_path, capsys):
    """--vocab=256 measures at byte level: every variant is built with a 256-token output layer."""
    out = tmp_path / 'speed.json'
    speed.main(['--variants=baseline', '--vocab=256', '--size=demo', '--parts=train', '--modes=eager', '--warmup=0',
                '--steps=1', '--batch_size=1', f'--out={out}', '--plot=False'])
    r = json.loads(out.read_text())
    assert r['size']['vocab_size'] == 256 and r['size']['n_embd'] == common.DEMO_SIZE['n_embd']
    with pytest.raises(SystemExit):
        speed.main(['--vocab=-1'])
    assert 'vocab must be' in capsys.readouterr().err


def test_benchmarks_compile_with_static_shapes(monkeypatch):
    """speed.py and scaling.py compile through common.compile_model, which asks for dynamic=False: a second model
    of one file with another memory shape must get its own static graph, not an automatic dynamic one."""
    calls = []
    monkeypatch.setattr(torch, 'compile', lambda model, **kw: calls.append(kw) or model)
    model, _ = common.build(TINY_VARIANTS['xl'])
    with torch._dynamo.config.patch(cache_size_limit=8):      # compile_model raises it for the process: not here
        assert common.compile_model(model) is model and calls == [{'dynamic': False}]
        assert torch._dynamo.config.cache_size_limit == 64
    import inspect
    for module in (speed, scaling):
        source = inspect.getsource(module)
        assert 'common.compile_model(' in source and 'torch.compile(' not in source


def test_speed_peak_matrix_size_by_device():
    """The MFU's denominator: 1024 x 1024 products on a CPU, 8192 x 8192 on a GPU (1024 is far from a GPU's peak),
    --peak_size wins; a negative size is an error."""
    assert speed.peak_matrix_size(speed.SpeedConfig(), 'cpu') == 1024
    assert speed.peak_matrix_size(speed.SpeedConfig(), 'cuda') == 8192
    assert speed.peak_matrix_size(speed.SpeedConfig(peak_size=256), 'cuda') == 256
    with pytest.raises(ValueError, match='peak_size'):
        speed.SpeedConfig(peak_size=-1)


def test_slow_bf16_modes_are_dropped_with_a_reason():
    cfg = speed.SpeedConfig()
    slow, fast = {'bf16_slowdown': 50.0}, {'bf16_slowdown': 0.5}
    modes, eval_modes, reason = speed.drop_slow_bf16(cfg, list(speed.MODES), ['eager', 'bf16'], slow)
    assert modes == ['eager', 'compile'] and eval_modes == ['eager'] and '50x' in reason
    assert speed.drop_slow_bf16(cfg, list(speed.MODES), ['bf16'], fast) == (list(speed.MODES), ['bf16'], None)
    forced = speed.SpeedConfig(force_bf16=True)
    assert speed.drop_slow_bf16(forced, list(speed.MODES), [], slow)[0] == list(speed.MODES)


def test_generate_recompute_crosses_segments():
    """The no-cache path commits a full window to memory exactly where generate() does (prompt longer than a
    segment, generation across two more boundaries)."""
    import torch
    model, c = common.build(TINY_VARIANTS['xl'])
    model.eval()
    prompt = common.random_tokens(2, c.seg_len + 3, c.vocab_size, seed=0, device='cpu')
    a = model.generate(prompt, 2 * c.seg_len + 1, temperature=0.0)
    b = speed.generate_recompute(model, prompt, 2 * c.seg_len + 1)
    assert torch.equal(a, b)


def test_gpt2_suite_is_gpt2_and_its_memory_forms_at_the_demo_size():
    """--suite=gpt2: every GPT-2 form of the repository, GPT-2 alone the reference, at the demos' size (seg_len 64,
    generation inside the learned positions); --size names a size of the suite."""
    table = common.gpt2_variant_table()
    assert set(table) == set(TINY_GPT2_VARIANTS) and speed.SUITES['gpt2'].baseline == 'gpt2'
    forms = {n for n in common.train.available_models() if getattr(common.train.import_model(n).Model, 'gpt2_form',
                                                                   False)}
    assert {spec['model'] for spec in table.values()} == forms
    specs, skipped = common.select(table, 'all', strict=True)          # every form builds with these fields
    assert list(specs) == list(table) and not skipped
    cfg = speed.SpeedConfig(suite='gpt2')
    assert cfg.size == 'demo' and cfg.gen_seg_len == common.GPT2_DEMO_SIZE['seg_len'] == 64
    assert speed.SpeedConfig().size == 'matched' and speed.SpeedConfig().gen_seg_len == 512
    for flags, message in ((['--suite=gpt2', '--size=matched'], 'size must be one of demo'),
                           (['--suite=gpt3'], 'suite must be one of')):
        with pytest.raises(common.train.UserError, match=message):
            common.parse(flags, speed.SpeedConfig)


def test_speed_gpt2_suite_smoke(tmp_path):
    """A quick run of the GPT-2 suite writes a row per form, every ratio to GPT-2 alone."""
    cfg = speed.SpeedConfig(suite='gpt2', modes='eager', eval_modes='eager', batch_size=2, warmup=1, steps=1,
                            gen_seg_len=8, gen_tokens=4, gen_rounds=1, peak_size=64, out=str(tmp_path / 's.json'),
                            plot=False)
    speed.run(cfg, TINY_GPT2_VARIANTS, {})
    r = json.loads((tmp_path / 's.json').read_text())
    assert r['baseline'] == 'gpt2' and r['train']['gpt2']['eager']['ratio_to_baseline'] == 1.0
    for n in TINY_GPT2_VARIANTS:
        t, e = r['train'][n]['eager'], r['eval'][n]['eager']
        assert t['tokens_per_s'] > 0 and e['tokens_per_s'] > 0 and 'ratio_to_baseline' in t and 'flop_ratio' in t
        assert r['generate'][n]['same_greedy_tokens'], n
        assert ('eager_vs_baseline>=0.75' in r['targets'][n]) == (n != 'gpt2')
    infini = r['train']['infini_gpt2']['eager']                  # a step of 2 segments: twice the tokens
    assert infini['tokens_per_s'] == pytest.approx(2 * 2 * 8 / infini['step_s_median'])


def test_a_training_step_keeps_the_graph_over_bptt_segments_and_empties_the_memory_every_reset_every():
    """Infini-attention as config/infini_gpt2_pg19.py trains it: 2 segments a step, the memory emptied every 2."""
    model, c = common.build(TINY_GPT2_VARIANTS['infini_gpt2'])
    opt = speed.make_optimizer(model, 'cpu')
    entry = speed.Entry('infini_gpt2', 'eager', model, model, opt, 'float32', 'cpu', 'cpu', 2, bptt_segments=2,
                        reset_every=2)
    for _ in range(2):
        entry.train_step()
        assert entry.memory.length.tolist() == [2 * c.seg_len] * 2 and not entry.memory.M.requires_grad
    carried = speed.Entry('infini_gpt2', 'eager', model, model, opt, 'float32', 'cpu', 'cpu', 2, bptt_segments=2)
    carried.train_step()
    carried.train_step()
    assert carried.memory.length.tolist() == [4 * c.seg_len] * 2


# -----------------------------------------------------------------------------------------------------------
# scaling


@pytest.mark.parametrize('variant', list(scaling.AXIS))
def test_scaling_smoke(variant, tmp_path):
    cfg = scaling.ScalingConfig(batch_size=2, warmup=1, steps=1, mem_lens='8,16', cmem_lens='4,8',
                                histories='16,48', out=str(tmp_path / 'scaling.json'), plot=False)
    scaling.run(cfg, {variant: TINY_VARIANTS[variant]}, {})
    s = json.loads((tmp_path / 'scaling.json').read_text())['series'][variant]
    assert len(s['points']) == 2
    assert all(p['step_s'] > 0 and p['peak_bytes'] > 0 for p in s['points'])
    sizes = [p['state_bytes'] for p in s['points']]
    if s['axis'] == 'tokens read':
        assert sizes[0] == sizes[1]                 # a fixed-size state, whatever has been read
    else:
        assert sizes[0] < sizes[1]                  # the memory grows with the history it covers
    plot.table([tmp_path / 'scaling.json'])
    if variant == 'xl' and has_matplotlib():
        assert plot.plot_scaling(tmp_path / 'scaling.json', tmp_path / 'scaling.png').stat().st_size > 1000


# -----------------------------------------------------------------------------------------------------------
# recall: the tasks, then a smoke run through train.py


def test_passkey_eval_episode_puts_the_answer_at_the_end_of_a_segment():
    rng = np.random.default_rng(0)
    T = 32
    for depth in (10, 26, 40, 100):
        body, targets = recall.passkey_eval_episode(rng, depth, T)
        assert len(body) % T == 0
        answer = np.flatnonzero(targets >= 0)
        assert list(answer) == list(range(len(body) - 6, len(body) - 1))     # predicted from the last 6 inputs
        key = int(np.flatnonzero(body == recall.KEY)[0])
        ask = int(np.flatnonzero(body == recall.ASK)[0])
        assert ask - key == depth
        assert list(body[key + 1:key + 6]) == list(targets[answer]) == list(body[ask + 1:ask + 6])
        assert (body == recall.KEY).sum() == 1 and (body == recall.ASK).sum() == 1
        assert list(body[key + 1:key + 6] // 10) == [0, 1, 2, 3, 4]                 # place-tagged digits


def test_passkey_training_mixes_in_segment_and_long_depths():
    rng = np.random.default_rng(0)
    T, W = 32, 64
    inside = 0
    for _ in range(200):
        body, _ = recall.passkey_train_episode(rng, T, W, 8.0)
        key, ask = int(np.flatnonzero(body == recall.KEY)[0]), int(np.flatnonzero(body == recall.ASK)[0])
        inside += key // T == (ask + 5) // T                      # key and whole answer in one segment
        assert ask - key <= 8 * W + 1
    assert 70 < inside < 130


def test_overrides_set_a_config_field_of_the_variants_that_have_it():
    cfg = recall.RecallConfig(overrides='gate_lr_mult=1,gate_init=-2')
    _, fields = recall.model_fields(TINY_VARIANTS['infini_linear'], {}, cfg)
    assert fields['gate_lr_mult'] == '1' and fields['gate_init'] == '-2'
    with pytest.raises(common.train.UserError, match='gate_lr_mult'):
        recall.model_fields(TINY_VARIANTS['xl'], {}, cfg)
    with pytest.raises(ValueError, match='field=value'):
        recall.RecallConfig(overrides='gate_lr_mult')


def test_run_rounds_rotates_the_first_entry_and_times_every_entry_once_per_round():
    """Round r starts at entry r mod n; round 0 (untimed warm-up, first_step_s) keeps the given order; every entry
    gets one timing per timed round."""
    class E:
        def __init__(self, name):
            self.name, self.times = name, []
    entries, calls = [E('a'), E('b'), E('c')], []
    common.run_rounds(entries, lambda e: calls.append(e.name), warmup=1, steps=3, device_type='cpu', label='t')
    assert ''.join(calls) == 'abc' + 'bca' + 'cab' + 'abc'
    assert all(len(e.times) == 3 and e.first_step_s >= 0 for e in entries)


def test_overrides_take_a_list_value_and_the_recall_init():
    """basis_widths is itself comma-separated: 'n_basis=1024,basis_widths=0.002,0.004,tau=0.5' is three fields.
    Every variant starts from the recall size's init_std (0.1, not the LM's 0.02: see RECALL_SIZE)."""
    assert common.override_items('n_basis=1024,basis_widths=0.002,0.004,tau=0.5') == [
        ('n_basis', '1024'), ('basis_widths', '0.002,0.004'), ('tau', '0.5')]
    cfg = recall.RecallConfig(overrides='n_basis=1024,basis_widths=0.002,0.004')
    _, fields = recall.model_fields(TINY_VARIANTS['infformer'], recall.RECALL_SIZE, cfg)
    assert fields['basis_widths'] == '0.002,0.004' and fields['n_basis'] == '1024' and fields['init_std'] == 0.1
    with pytest.raises(ValueError, match='seg_len'):
        recall.RecallConfig(seg_len=16)
    assert recall.recall_size(recall.RecallConfig())['init_std'] == 0.1                  # the measured setting
    assert recall.recall_size(recall.RecallConfig(n_embd=256))['init_std'] == pytest.approx(0.05)   # 1/sqrt(n_embd)


def test_overrides_pass_train_flags_to_train_py():
    """A train.py field in --overrides reaches train.py's argv (not the model's Config); bptt_segments has its own
    flag because it also packs the episodes."""
    cfg = recall.RecallConfig(overrides='gate_init=-2,reset_every=16')
    _, fields = recall.model_fields(TINY_VARIANTS['infini_linear'], {}, cfg)
    assert fields['gate_init'] == '-2' and 'reset_every' not in fields
    assert recall.train_overrides(cfg) == ['--reset_every=16']
    with pytest.raises(common.train.UserError, match='neither'):
        recall.model_fields(TINY_VARIANTS['xl'], {}, recall.RecallConfig(overrides='no_such_flag=1'))
    with pytest.raises(common.train.UserError, match='ltm_lr_multiplier was renamed ltm_lr_mult'):
        recall.model_fields(TINY_VARIANTS['xl'], {}, recall.RecallConfig(overrides='ltm_lr_multiplier=5'))
    with pytest.raises(ValueError, match='--bptt_segments'):
        recall.RecallConfig(overrides='bptt_segments=4')
    assert recall.train_steps(recall.RecallConfig(tokens=64 * 16 * 100, bptt_segments=4)) == 25
    with pytest.raises(ValueError, match='data_tokens'):
        recall.RecallConfig(tokens=1000, data_tokens=2000)
    assert recall.RecallConfig(seeds='3,4').seed_list() == [3, 4] and recall.RecallConfig(seed=7).seed_list() == [7]
    with pytest.raises(common.train.UserError, match='--seeds'):
        recall.RecallConfig(seeds='1,x')


def test_data_tokens_writes_whole_bptt_graphs_of_that_many_tokens_and_train_reads_them_again(tmp_path):
    """--data_tokens writes fewer training tokens than --tokens (whole graphs of bptt_segments per stream, so the
    packing holds when train.py starts the data again); 0 writes them all."""
    T, k, B = 32, 4, 2
    cfg = recall.RecallConfig(seg_len=T, mem_len=16, bptt_segments=k, batch_size=B, tokens=B * T * k * 10,
                              max_depth_factor=2.0, out_dir=str(tmp_path))
    for data_tokens, graphs in ((0, 10), (B * T * k * 3, 3), (B * T * k * 3 + T, 3)):
        d = recall.task_data('passkey', dataclasses.replace(cfg, data_tokens=data_tokens), seed=0)
        assert np.fromfile(d / 'train.bin', dtype=np.uint16).size == B * graphs * k * T + 1


@pytest.mark.parametrize('task', ['passkey', 'sorting'])
def test_episodes_do_not_cross_a_bptt_window_and_the_curriculum_starts_inside(task, tmp_path):
    """With bptt_segments = k every episode of at most k segments lies inside one window of k segments (so the
    graph train.py keeps holds all of it), and with curriculum = 0.5 the first half of every stream holds
    in-window episodes only (evidence and question or answer in one segment)."""
    T, k, n_segments = 32, 4, 48
    cfg = recall.RecallConfig(seg_len=T, mem_len=16, bptt_segments=k, curriculum=0.5, inside_fraction=0.0,
                              max_depth_factor=2.0, lengths='16,100')
    d = recall.write_task_data(task, tmp_path, cfg, n_streams=2, n_segments=n_segments, seed=0)
    tokens = np.fromfile(d / 'train.bin', dtype=np.uint16)
    starts = np.load(d / 'train_docs.npy').tolist() + [2 * n_segments * T]
    question = recall.ASK if task == 'passkey' else recall.SEP
    answer_len = 6 if task == 'passkey' else recall.N_SYMBOLS + 1
    long_first_half, spans_later, checked = 0, [], 0
    for a, b in zip(starts[:-1], starts[1:]):
        asks = np.flatnonzero(tokens[a:b] == question)
        if len(asks) == 0:
            continue                                              # cut by the end of its stream
        end = a + asks[0] + answer_len                            # one past the episode's last answer token
        if -(-(end - a) // T) <= k:
            assert a // (k * T) == (end - 1) // (k * T), (a, end)  # one window
            checked += 1
        first_half = a % (n_segments * T) < n_segments * T // 2
        long_first_half += first_half and a // T != (end - 1) // T
        if not first_half:
            spans_later.append((end - 1) // T - a // T)
    assert checked > 10
    assert long_first_half <= 1            # at most the episode that straddles the half
    assert max(spans_later) > 0            # afterwards: evidence segments back (inside_fraction = 0)
    assert len(tokens) == 2 * n_segments * T + 1


def test_sorting_answer_is_decreasing_frequency():
    rng = np.random.default_rng(0)
    body, targets = recall.sorting_episode(rng, 500)
    seq, answer = body[:500], targets[500:520]
    counts = np.bincount(seq, minlength=recall.N_SYMBOLS)
    assert sorted(answer) == list(range(recall.N_SYMBOLS))
    assert all(counts[answer[i]] >= counts[answer[i + 1]] for i in range(recall.N_SYMBOLS - 1))
    assert body[500] == recall.SEP and (targets[:500] == -1).all()
    # the distribution drifts: the first and last halves disagree on the most frequent symbol more often than not
    firsts = [np.bincount(recall.sorting_episode(rng, 400)[0][:200], minlength=20).argmax() !=
              np.bincount(recall.sorting_episode(rng, 400)[0][200:400], minlength=20).argmax() for _ in range(50)]
    assert np.mean(firsts) > 0.5


def assoc_pairs_of(segment, n_pairs):
    """{key: value} of a segment's pair tokens."""
    return {int(t) // recall.N_VALUES: int(t) % recall.N_VALUES for t in segment[:n_pairs]}


def test_assoc_eval_episode_scores_only_keys_written_depth_segments_back():
    """depth d: d + 1 segments; only the last segment has targets, T/16 of them, each the value paired with its key
    in segment 0; a scored key's question occurs once in the episode and its pair token once, in segment 0, so
    nothing closer than d segments holds the answer."""
    rng = np.random.default_rng(0)
    T, n_pairs = 64, 8
    for depth in (0, 1, 3):
        body, targets = recall.assoc_episode(rng, depth + 1, T, n_pairs, depth=depth)
        assert len(body) == (depth + 1) * T and (targets[:depth * T] == -1).all()
        scored = np.flatnonzero(targets >= 0)
        assert len(scored) == n_pairs // 2 and (scored > depth * T + n_pairs).all()
        pairs = assoc_pairs_of(body[:T], n_pairs)
        for i in scored:
            key = int(body[i]) - recall.QUESTION0
            assert targets[i] == body[i + 1] == recall.VALUE0 + pairs[key]
            assert (body == body[i]).sum() == 1                                  # asked once
            assert (body // recall.N_VALUES == key)[body < recall.QUESTION0].sum() == 1   # one pair, in segment 0


def test_assoc_training_questions_ask_keys_already_written_with_their_values():
    rng = np.random.default_rng(1)
    T, n_pairs = 64, 8
    for n in (1, 5):
        body, targets = recall.assoc_episode(rng, n, T, n_pairs)
        assert body.max() < recall.ASSOC_VOCAB
        written = {}
        for s in range(n):
            seg, tgt = body[s * T:(s + 1) * T], targets[s * T:(s + 1) * T]
            assert seg[n_pairs] == recall.ASSOC_SEP and seg[-1] == recall.ASSOC_PAD
            new = assoc_pairs_of(seg, n_pairs)
            assert not set(new) & set(written)                             # keys are new to the episode
            written.update(new)
            asked = np.flatnonzero(tgt >= 0)
            assert len(asked) == (T - n_pairs - 1) // 2
            assert all(tgt[i] == seg[i + 1] == recall.VALUE0 + written[int(seg[i]) - recall.QUESTION0] for i in asked)
    with pytest.raises(ValueError, match='assoc_depths'):
        recall.RecallConfig(tasks='assoc', assoc_depths='0,16')
    with pytest.raises(ValueError, match='assoc_pairs'):
        recall.RecallConfig(tasks='assoc', assoc_pairs=30)
    with pytest.raises(common.train.UserError, match='--assoc_depths'):
        recall.eval_columns('assoc', recall.RecallConfig(assoc_depths='1,x'))


def test_assoc_past_share_sets_how_many_questions_ask_an_earlier_segment():
    """past_share 0: every question asks its own segment; 1: every question after the first segment asks an earlier
    one; 0.25: about a quarter of them do. Every answer is still a value written in the episode."""
    T, n_pairs = 64, 8
    for share, lo, hi in ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.25, 0.18, 0.32)):
        rng, past, total = np.random.default_rng(2), 0, 0
        for _ in range(20):
            body, targets = recall.assoc_episode(rng, 4, T, n_pairs, past_share=share)
            written = {}
            for s in range(4):
                seg, tgt = body[s * T:(s + 1) * T], targets[s * T:(s + 1) * T]
                own = assoc_pairs_of(seg, n_pairs)
                written.update(own)
                for i in np.flatnonzero(tgt >= 0):
                    key = int(seg[i]) - recall.QUESTION0
                    assert tgt[i] == recall.VALUE0 + written[key]
                    if s > 0:
                        past, total = past + (key not in own), total + 1
        assert lo <= past / total <= hi, (share, past / total)
    with pytest.raises(ValueError, match='assoc_past_share'):
        recall.RecallConfig(tasks='assoc', assoc_past_share=1.5)


def test_memory_answers_per_token_counts_answers_whose_evidence_is_segments_back():
    """In-window passkeys and assoc questions about their own segment need no memory (0); a passkey whose key is
    always in an earlier segment has 5 such answers per episode; assoc asks far more often than the passkey."""
    count = recall.memory_answers_per_token
    assert count('passkey', recall.RecallConfig(inside_fraction=1.0), n_episodes=200) == 0
    assert count('assoc', recall.RecallConfig(tasks='assoc', assoc_past_share=0.0), n_episodes=100) == 0
    assert count('sorting', recall.RecallConfig()) is None
    cfg = recall.RecallConfig(inside_fraction=0.0)
    rng, tokens = np.random.default_rng(0), 0                  # the same episodes the count draws
    for _ in range(200):
        body, _ = recall.passkey_train_episode(rng, cfg.seg_len, cfg.seg_len + cfg.mem_len, cfg.max_depth_factor, 0.0)
        tokens += -(-len(body) // cfg.seg_len) * cfg.seg_len
    assert count('passkey', cfg, n_episodes=200) == pytest.approx(5 * 200 / tokens, rel=0.02)   # depth 64: rarely 4
    assoc = count('assoc', recall.RecallConfig(tasks='assoc'), n_episodes=100)
    assert assoc > 10 * count('passkey', recall.RecallConfig(), n_episodes=200)


def test_task_data_streams_start_episodes_at_segment_boundaries(tmp_path):
    cfg = recall.RecallConfig(seg_len=32, mem_len=16)
    for task in recall.TASKS:
        d = recall.write_task_data(task, tmp_path / task, cfg, n_streams=3, n_segments=20, seed=0)
        tokens = np.fromfile(d / 'train.bin', dtype=np.uint16)
        docs = np.load(d / 'train_docs.npy')
        assert len(tokens) == 3 * 20 * 32 + 1
        assert (docs % 32 == 0).all() and {0, 20 * 32, 40 * 32} <= set(docs.tolist())
        assert tokens.max() < json.loads((d / 'meta.json').read_text())['vocab_size']


@pytest.mark.parametrize('variant', list(TINY_VARIANTS))
def test_recall_smoke(variant, tmp_path):
    cfg = recall.RecallConfig(tasks='passkey,sorting,assoc', tokens=1024, batch_size=2, seg_len=32, mem_len=16,
                              depths='16,40', lengths='16,40', assoc_depths='0,2', eval_episodes=2,
                              out_dir=str(tmp_path / 'runs'), out=str(tmp_path / 'recall.json'), plot=False)
    recall.run(cfg, {variant: TINY_VARIANTS[variant]}, {'seg_len': 32})
    r = json.loads((tmp_path / 'recall.json').read_text())
    assert r['tasks']['passkey']['memory_answers_per_token'] > 0
    assert r['tasks']['sorting']['memory_answers_per_token'] is None
    for task in ('passkey', 'sorting'):
        t = r['tasks'][task]
        acc = t['accuracy'][variant]
        assert set(acc) == {'16', '40'} and all(0 <= a <= 1 for a in acc.values())
        run = t['runs'][variant][str(cfg.seed)]
        assert run['steps'] == 1024 // (2 * 32) and '--bptt_segments=1' in run['train_argv']
        assert 'train/loss' in run['final']
        assert t['accuracy_std'][variant] == {'16': 0.0, '40': 0.0}           # one seed
        if variant == 'baseline':                   # no memory: emptying it changes nothing
            assert t['accuracy_memory_emptied'][variant] == acc
    plot.table([tmp_path / 'recall.json'])
    if variant == 'xl' and has_matplotlib():
        assert plot.plot_recall(tmp_path / 'recall.json', tmp_path / 'recall.png').stat().st_size > 1000
    if variant == 'xl':                             # --rescore: the same checkpoints at other depths, no training
        ckpt = recall.run_dir(cfg, 'passkey', variant, cfg.seed) / 'ckpt.pt'
        before = ckpt.stat().st_mtime_ns
        recall.run(dataclasses.replace(cfg, rescore=True, depths='16,24,40', tasks='passkey'),
                   {variant: TINY_VARIANTS[variant]}, {'seg_len': 32})
        again = json.loads((tmp_path / 'recall.json').read_text())['tasks']['passkey']
        assert ckpt.stat().st_mtime_ns == before
        assert set(again['accuracy'][variant]) == {'16', '24', '40'}
        assert again['accuracy'][variant]['40'] == r['tasks']['passkey']['accuracy'][variant]['40']
        assert again['runs'][variant] == r['tasks']['passkey']['runs'][variant]
        with pytest.raises(common.train.UserError, match='no checkpoint'):
            recall.run(dataclasses.replace(cfg, rescore=True, out_dir=str(tmp_path / 'none')),
                       {variant: TINY_VARIANTS[variant]}, {'seg_len': 32})


def test_recall_seeds_are_averaged_and_bptt_reaches_train_py(tmp_path):
    """--seeds=1,2 trains the variant once per seed (its own data and checkpoint), reports the mean and std of the
    seeds' accuracies; --bptt_segments and --overrides' train fields reach train.py."""
    cfg = recall.RecallConfig(tasks='passkey', tokens=2048, batch_size=2, seg_len=32, mem_len=16, depths='16,40',
                              eval_episodes=4, out_dir=str(tmp_path / 'runs'), out=str(tmp_path / 'recall.json'),
                              plot=False, seeds='1,2', bptt_segments=2, overrides='reset_every=2')
    recall.run(cfg, {'infini_linear': TINY_VARIANTS['infini_linear']}, {'seg_len': 32})
    t = json.loads((tmp_path / 'recall.json').read_text())['tasks']['passkey']
    per_seed = t['accuracy_seeds']['infini_linear']
    assert set(per_seed) == {'1', '2'} and set(t['runs']['infini_linear']) == {'1', '2'}
    for c in ('16', '40'):
        values = [per_seed[s][c] for s in ('1', '2')]
        assert t['accuracy']['infini_linear'][c] == pytest.approx(np.mean(values))
        assert t['accuracy_std']['infini_linear'][c] == pytest.approx(np.std(values))
    for seed in ('1', '2'):             # the 5 digits' accuracies, whose mean is the column's accuracy
        for c in ('16', '40'):
            places = t['accuracy_by_place']['infini_linear'][seed][c]
            assert len(places) == 5 and np.mean(places) == pytest.approx(per_seed[seed][c])
    argv = t['runs']['infini_linear']['1']['train_argv']
    assert '--bptt_segments=2' in argv and '--reset_every=2' in argv and '--seed=1' in argv
    assert t['runs']['infini_linear']['1']['steps'] == 2048 // (2 * 32 * 2)
    for seed in (1, 2):
        assert (recall.run_dir(cfg, 'passkey', 'infini_linear', seed) / 'ckpt.pt').exists()
    plot.table([tmp_path / 'recall.json'])
    # --merge: the seeds scored in separate processes combine into what one run over both seeds reports
    parts = [str(tmp_path / f'seed{s}.json') for s in (1, 2)]
    for seed, part in zip((1, 2), parts):
        recall.run(dataclasses.replace(cfg, rescore=True, seeds=str(seed), out=part),
                   {'infini_linear': TINY_VARIANTS['infini_linear']}, {'seg_len': 32})
    merged = recall.run(dataclasses.replace(cfg, merge=','.join(parts), out=str(tmp_path / 'merged.json')), {}, {})
    m = json.loads((tmp_path / 'merged.json').read_text())['tasks']['passkey']
    assert m == merged['tasks']['passkey'] and m['seeds'] == [1, 2]
    for key in ('accuracy', 'accuracy_std', 'exact', 'accuracy_memory_emptied'):
        assert m[key]['infini_linear'] == pytest.approx(t[key]['infini_linear']), key
    for key in ('accuracy_seeds', 'in_window_learned', 'accuracy_by_place'):
        assert m[key]['infini_linear'] == t[key]['infini_linear'], key
    with pytest.raises(common.train.UserError, match='no result file'):
        recall.run(dataclasses.replace(cfg, merge=str(tmp_path / 'none.json')), {}, {})


def test_recall_merge_combines_seeds_and_variants(tmp_path):
    """merge_results: a variant's seeds from two files give the mean and std over all of them, the seed-averaged
    columns are weighted by each file's seeds, a variant of one file only is kept, and clashes are one-line errors."""
    def result(path, seeds_a, variant_b=False, columns=('1', '2')):
        accs = {'a': {str(s): {c: s / 10 + int(c) / 100 for c in columns} for s in seeds_a}}
        if variant_b:
            accs['b'] = {'7': {c: 0.5 for c in columns}}
        t = {'columns': list(columns), 'accuracy_seeds': accs,
             'exact': {v: {c: len(a) * 0.1 for c in columns} for v, a in accs.items()},
             'accuracy_memory_emptied': {v: {c: float(min(map(int, a))) for c in columns} for v, a in accs.items()},
             'in_window_learned': {v: {s: True for s in a} for v, a in accs.items()},
             'accuracy_by_place': {v: {s: {} for s in a} for v, a in accs.items()},
             'runs': {v: {s: {'steps': 1} for s in a} for v, a in accs.items()}}
        path.write_text(json.dumps({'command': f'made {path.name}', 'specs': {v: {} for v in accs},
                                    'tasks': {'assoc': t}}))
        return path
    one, two = result(tmp_path / 'one.json', [1]), result(tmp_path / 'two.json', [2, 3], variant_b=True)
    t = recall.merge_results([one, two])['tasks']['assoc']
    values = {s: s / 10 + 0.01 for s in (1, 2, 3)}                   # column '1' of seed s
    assert t['seeds'] == [1, 2, 3, 7] and set(t['accuracy']) == {'a', 'b'}
    assert t['accuracy']['a']['1'] == pytest.approx(np.mean(list(values.values())))
    assert t['accuracy_std']['a']['1'] == pytest.approx(np.std(list(values.values())))
    assert t['exact']['a']['1'] == pytest.approx((1 * 0.1 + 2 * 0.2) / 3)            # weighted by seeds
    assert t['accuracy_memory_emptied']['a']['2'] == pytest.approx((1 * 1 + 2 * 2) / 3)
    assert t['accuracy']['b'] == {'1': 0.5, '2': 0.5} and t['accuracy_std']['b'] == {'1': 0.0, '2': 0.0}
    assert set(t['runs']['a']) == {'1', '2', '3'}
    with pytest.raises(common.train.UserError, match='seed 2 is in two files'):
        recall.merge_results([two, two])
    with pytest.raises(common.train.UserError, match='columns'):
        recall.merge_results([one, result(tmp_path / 'other.json', [4], columns=('1', '4'))])


# -----------------------------------------------------------------------------------------------------------
# plot


def test_plot_without_matplotlib_is_one_clear_message(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith('matplotlib'):
            raise ImportError(name)
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, '__import__', no_matplotlib)
    with pytest.raises(plot.NoMatplotlib, match='pip install matplotlib'):
        plot.plot_speed('unused.json', 'unused.png')


def test_plot_loss_curves(tmp_path):
    pytest.importorskip('matplotlib')
    logs = []
    for name, offset in (('a', 0.0), ('b', 0.5)):
        (tmp_path / name).mkdir()
        lines = [{'step': s, 'train/loss': 5 - s / 10 + offset, 'tokens': s * 64} for s in range(1, 11)]
        lines.append({'step': 10, 'validation/loss': 4.5 + offset})
        (tmp_path / name / 'log.jsonl').write_text('\n'.join(json.dumps(x) for x in lines))
        logs.append(tmp_path / name / 'log.jsonl')
    out = plot.plot_loss(logs, tmp_path / 'loss.png')
    assert out.stat().st_size > 1000



def test_gpu_check_script_uses_flags_that_exist():
    """bench/gpu_check.sh is run once per GPU lease, with no second try: every --flag it gives train.py, sample.py
    and bench/speed.py must be a field of that script's config (train.py: TrainConfig or the model's Config), every
    config file it names must exist, and every model it trains must have a demo config."""
    import re
    import sample
    text = (common.REPO / 'bench' / 'gpu_check.sh').read_text()
    text = re.sub(r'\\\n', ' ', text)                                  # join continued lines
    model_fields = set()
    for name in common.train.available_models():
        model_fields |= {f.name for f in dataclasses.fields(common.train.import_model(name).Config)}
    fields = {'train.py': {f.name for f in dataclasses.fields(common.train.TrainConfig)} | model_fields,
              'sample.py': {f.name for f in dataclasses.fields(sample.SampleConfig)},
              'bench/speed.py': {f.name for f in dataclasses.fields(speed.SpeedConfig)}}
    seen = {k: 0 for k in fields}
    for script, args in re.findall(r'(train\.py|sample\.py|bench/speed\.py)((?:\s+(?:--|config/)\S+)+)', text):
        seen[script] += 1
        for flag in re.findall(r'--(\w+)=', args):
            assert flag in fields[script], f"gpu_check.sh: {script} has no --{flag}"
        for cfg in re.findall(r'config/\S+\.py', args):
            models = re.search(r'for m in ([\w ]+); do', text).group(1).split() if '${m}' in cfg else [None]
            for m in models:
                path = common.REPO / (cfg.replace('${m}', m) if m else cfg)
                assert path.exists(), f"gpu_check.sh names {path.name}, which does not exist"
    assert seen['train.py'] >= 4 and seen['sample.py'] >= 1 and seen['bench/speed.py'] >= 3, seen


def test_gpu_recall_script_uses_flags_that_exist():
    """bench/gpu_recall.sh, like gpu_check.sh, gets one try per lease: every --flag it gives bench/recall.py must be
    a RecallConfig field, and the log field it reads the probe's rate from must be one train.py writes."""
    import re
    text = re.sub(r'\\\n', ' ', (common.REPO / 'bench' / 'gpu_recall.sh').read_text())
    fields = {f.name for f in dataclasses.fields(recall.RecallConfig)}
    calls = re.findall(r'bench/recall\.py((?:\s+--\S+)+)', text)
    assert len(calls) >= 3, calls
    for args in calls:
        for flag in re.findall(r'--(\w+)=', args):
            assert flag in fields, f"gpu_recall.sh: bench/recall.py has no --{flag}"
    assert "'tokens_per_sec'" in text and "'tokens_per_sec'" in (common.REPO / 'train.py').read_text()


def test_generation_targets_without_training_results():
    """A generation-only run (--parts=generate, as bench/gpu_generate.sh runs it) still gets its targets; on CUDA the
    captured step is what must reach 5x recomputing, with the same greedy tokens."""
    generate = {'xl': dict(speedup=1.2, speedup_captured=8.0, same_greedy_tokens=True),
                'lamemo': dict(speedup=6.0, same_greedy_tokens=False)}
    targets = speed.check_targets({'train': {}, 'generate': generate})
    assert targets == {'xl': {'generate_cache>=5x': True, 'generate_same_tokens': True},
                       'lamemo': {'generate_cache>=5x': True, 'generate_same_tokens': False}}


def test_gpu_size_dry_run_runs_the_whole_script(tmp_path):
    """bench/gpu_size.sh gets one call on a lent GPU: DRY_RUN=1 runs every stage of it on the CPU at a tiny size (fill
    in parallel, time each variant alone with a profile, merge, the targets): a results JSON with both variants'
    modes and ratios, the profiles, at most 8 files in $OUT (what a device call brings back), no traceback.
    bench/attn_kernels.py's stage is left out (ATTN=0): its own test runs its dry run."""
    import os
    import subprocess
    out = tmp_path / 'out'
    env = dict(os.environ, DRY_RUN='1', OUT=str(out), PY=sys.executable, OMP_NUM_THREADS='1', ATTN='0')
    proc = subprocess.run(['bash', 'bench/gpu_size.sh'], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and 'Traceback' not in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert {'gpu_size.json', 'gpu_size_profiles.txt', 'log.txt', 'parts.tgz'} <= set(files) and len(files) <= 8, files
    result = json.loads((out / 'gpu_size.json').read_text())
    train = result['train']
    assert set(train) == {'baseline', 'infini_linear'}
    assert set(train['baseline']) == {'eager', 'compile_bf16'}
    assert set(train['infini_linear']) == {'eager', 'compile_bf16', 'graphs_bf16', 'blocks_bf16'}
    c = train['infini_linear']['compile_bf16']
    assert c['tokens_per_s'] > 0 and 0 < c['mfu'] and c['ratio_to_baseline'] > 0 and 0.9 < c['flop_ratio'] < 1.1
    assert 'compile_bf16_vs_eager>=2' in result['targets']['infini_linear']
    profile = result['profile']['infini_linear']
    assert set(profile) == {'compile_bf16', 'graphs_bf16'} and profile['graphs_bf16']['busy'] is None   # a CPU
    assert set(result['parts']['infini_linear']['cold_first_step_s']) == {'compile_bf16', 'graphs_bf16', 'blocks_bf16'}
    assert '== infini_linear' in (out / 'gpu_size_profiles.txt').read_text()
    assert 'MISSED' in proc.stdout or 'met' in proc.stdout


def test_gpu_attn_dry_run_runs_the_whole_script(tmp_path):
    """bench/gpu_attn.sh gets one call on a lent GPU: DRY_RUN=1 runs it on the CPU (the kernels interpreted, one tile,
    the triton path only): the attention paths' lines with the kernel's differences from einsum, XL's step timed on
    attn_kernel='triton', at most 8 files in $OUT, no traceback."""
    import os
    import subprocess
    out = tmp_path / 'out'
    env = dict(os.environ, DRY_RUN='1', OUT=str(out), PY=sys.executable, OMP_NUM_THREADS='1', KERNELS='triton',
               TILES='16,16,4,2')
    proc = subprocess.run(['bash', 'bench/gpu_attn.sh'], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and 'Traceback' not in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ['attn_kernels.jsonl', 'log.txt', 'tests.txt', 'xl_triton.json'], files
    lines = {r['path']: r for r in map(json.loads, (out / 'attn_kernels.jsonl').read_text().splitlines())}
    assert lines['triton_16,16,4,2']['max_abs_diff_grads'] < 1e-4 and lines['sdpa']['fwd_bwd_ms'] > 0
    result = json.loads((out / 'xl_triton.json').read_text())          # gpu_size.py's merge of XL's part
    assert result['parts']['xl']['spec']['attn_kernel'] == 'triton'
    assert result['train']['xl']['eager']['tokens_per_s'] > 0
    assert 'skipped' in (out / 'tests.txt').read_text()             # the GPU cases, on a CPU


def test_gpu_size_targets_are_the_issues():
    """The targets at the size people train: MFU of XL >= 35% and the baseline >= 40% (compile + bf16), every memory
    model >= 0.9x its FLOP ratio next to the baseline, compile + bf16 >= 2x eager fp32, Infini busy >= 90%; the
    ratios across per-variant processes are recomputed from tokens/s and FLOPs per token."""
    import gpu_size

    def part(name, flops, eager, compiled, mfu):
        return {'variant': name, 'flops_per_token': flops,
                'train': {name: {'eager': {'tokens_per_s': eager, 'ratio_to_eager': 1.0},
                                 'compile_bf16': {'tokens_per_s': compiled, 'ratio_to_eager': compiled / eager,
                                                  'mfu': mfu}}}}
    parts = [part('baseline', 100.0, 50.0, 120.0, 0.41), part('xl', 125.0, 45.0, 80.0, 0.34),
             dict(part('infini_linear', 100.0, 40.0, 110.0, 0.2), profile={'compile_bf16': {'busy': 0.5},
                                                                           'graphs_bf16': {'busy': 0.95}})]
    result = gpu_size.merge_parts(parts)
    t = gpu_size.targets(result)
    assert result['train']['xl']['compile_bf16']['flop_ratio'] == 0.8
    assert t['baseline']['compile_bf16_mfu>=40%'] and t['baseline']['compile_bf16_vs_eager>=2']
    assert not t['xl']['compile_bf16_mfu>=35%'] and not t['xl']['compile_bf16_vs_eager>=2']
    assert t['xl']['compile_bf16_vs_flop_ratio>=0.9'] is False                # 80/120 = 0.67x the baseline, 0.83 of 0.8
    assert t['infini_linear']['compile_bf16_vs_flop_ratio>=0.9'] and t['infini_linear']['compile_bf16_vs_eager>=2']
    assert t['infini_linear']['compile_bf16_busy>=90%'] is False and t['infini_linear']['graphs_bf16_busy>=90%']


def test_gpu_size_script_uses_flags_that_exist():
    """Every --flag bench/gpu_size.sh gives bench/gpu_size.py is a SizeConfig field; its modes are gpu_size.py's."""
    import re
    import gpu_size
    text = re.sub(r'\\\n', ' ', (common.REPO / 'bench' / 'gpu_size.sh').read_text())
    fields = {f.name for f in dataclasses.fields(gpu_size.SizeConfig)}
    calls = re.findall(r'bench/gpu_size\.py((?:\s+(?:--\S+|\$COMMON))+)', text)
    assert len(calls) == 3, calls                                             # fill, time, merge
    flags = re.findall(r'--(\w+)=', ' '.join(calls) + re.search(r'COMMON="([^"]+)"', text).group(1))
    assert len(flags) >= 15
    for flag in flags:
        assert flag in fields, f"gpu_size.sh: bench/gpu_size.py has no --{flag}"
    for mode in re.findall(r'(\w+_bf16)', text):
        assert mode in gpu_size.MODES, mode
    attn = common.REPO / 'bench' / 'attn_kernels.py'
    if attn.exists():                                  # the attention paths' script, where it has landed
        import attn_kernels
        fields = {f.name for f in dataclasses.fields(attn_kernels.AttnConfig)}
        (args,) = re.findall(r'bench/attn_kernels\.py((?:\s+--\S+)+)', text)
        for flag in re.findall(r'--(\w+)=', args):
            assert flag in fields, f"gpu_size.sh: bench/attn_kernels.py has no --{flag}"


# -----------------------------------------------------------------------------------------------------------
# attn_kernels: one layer's relative attention on every path


def test_attn_kernels_dry_run_prints_one_json_line_per_path(capsys):
    """--quick on the CPU in float32: einsum, sdpa and flash are timed and sdpa equals the einsum path; triton, where
    it is installed, runs interpreted at each shipped tile (one line each) and equals it too; flex (no backward on the
    CPU) says why it is skipped."""
    import importlib.util
    has_triton = importlib.util.find_spec('triton') is not None
    attn_kernels.main(['--device=cpu', '--dtype=float32', '--quick=True'])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_path = {line['path'].split('_')[0]: line for line in lines}   # triton_64,64,8,2: the last tiles
    tiles = attn_kernels.TRITON_TILES.split(';') if has_triton else []
    assert list(by_path) == list(attn_kernels.PATHS) and len(lines) == len(attn_kernels.PATHS) - 1 + max(1, len(tiles))
    assert [line['path'] for line in lines if line['path'].startswith('triton_')] == [f'triton_{t}' for t in tiles]
    assert all(line['T'] == attn_kernels.QUICK['seg_len'] and line['dtype'] == 'float32' for line in lines)
    timed = [line for line in lines if line['path'] in ('einsum', 'sdpa', 'flash') or line['path'] in
             [f'triton_{t}' for t in tiles]]
    assert len(timed) == 3 + len(tiles)
    for line in timed:
        assert line['fwd_ms'] > 0 and line['fwd_bwd_ms'] > 0, line
        if line['path'] not in ('einsum', 'flash'):               # flash: no positional term, nothing to compare
            assert line['max_abs_diff_out'] < 1e-5 and line['max_abs_diff_grads'] < 1e-4, line
    assert 'skipped' in by_path['flex'] and ('skipped' in by_path['triton']) != has_triton
    with pytest.raises(SystemExit):
        attn_kernels.main(['--paths=einsum,cudnn'])
    assert 'unknown path' in capsys.readouterr().err


def test_code_size_is_the_code_suites():
    """bench/speed.py --size=code times each memory as bench/demos.py --suite=code trains it: the size and every
    memory field of common.variant_table at SIZES['code'] are its config/*_code_demo.py's (vocab_size is the byte
    data's, 256)."""
    import demos
    size, memory = common.SIZES['code']
    assert size['vocab_size'] == 256
    for label, spec in common.variant_table(**memory).items():
        config, flags = demos.CODE_VARIANTS[label]
        t, _, m, _ = common.train.parse_args([str(ROOT / config), *flags])
        assert (t.model, t.dataset) == (spec['model'], 'sympy_bytes'), label
        for k, value in {**size, **spec}.items():
            if k not in ('model', 'vocab_size'):
                assert getattr(m, k) == value, (label, k)
