"""
bench/longdoc.py (loss by position in the document): every token of every document after its first is predicted
exactly once, at the right position, from its own document only (the same NLL as reading the document alone with a
fresh memory, for every model file); the memory is emptied at a document start; the bucket means, standard errors
(across documents), seed spreads and paired differences are the hand-computed ones; end to end on tiny checkpoints
trained by train.py; bad input is a one-line error.
"""

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from _models import MEMORYLESS, TINY_MODELS
from _train_util import TINY_XL, assert_one_line_error, flags, run_python
from data import shards
from data.tokenizer import bytes_tokenizer, chars_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))
import longdoc  # noqa: E402

MODELS = {name: dict(spec, sticky=False) if name == 'infformer' else spec for name, spec in TINY_MODELS.items()
          if name in train.available_models()}
LENGTHS = [37, 8, 9, 1, 2, 25, 17, 40]          # whole segments, a partial last one, 0 and 1 predicted tokens


def key(run):
    """How a result names a run: its path relative to the repository."""
    return longdoc.common.relative_paths(str(run))


def tiny_model(name, seed=0):
    spec = dict(MODELS[name])
    # the ∞-former's sticky points are drawn per row (a hash of the row's index and state), so with them a document's
    # NLLs depend on the row it lands in; reading each document as if alone holds for the deterministic memory
    if 'sticky' in spec:
        spec['sticky'] = False
    module = train.import_model(spec.pop('model'))
    torch.manual_seed(seed)
    return module.Model(module.Config(**spec, init_std=0.3)).eval()


def random_docs(lengths=LENGTHS, vocab=256, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).astype(np.int64) for n in lengths]


@torch.no_grad()
def naive_nll(model, tokens, seg_len):
    """The document alone: batch size 1, a fresh memory, segments of seg_len from its start (the last shorter)."""
    x = torch.from_numpy(tokens)[None]
    memory = model.init_memory(1, 'cpu')
    out = []
    for a in range(0, len(tokens) - 1, seg_len):
        n = min(seg_len, len(tokens) - 1 - a)
        logits, _, memory, _ = model(x[:, a:a + n], memory)
        out.append(torch.nn.functional.cross_entropy(logits[0].float(), x[0, a + 1:a + 1 + n], reduction='none'))
    return torch.cat(out).double().numpy() if out else np.zeros(0)


# -----------------------------------------------------------------------------------------------------------
# Reading documents


@pytest.mark.parametrize('name', list(MODELS))
def test_every_position_matches_reading_the_document_alone(name):
    """Batches of documents (rows refilled with the next document, memory reset) give each document the NLLs it
    gets alone with batch size 1 and a fresh memory, position by position; each position once."""
    model, docs = tiny_model(name), random_docs()
    seg_len = model.config.seg_len
    expected = [naive_nll(model, t, seg_len) for t in docs]
    for batch_size in (3, 1, 16):
        got = longdoc.document_nll(model, docs, seg_len, batch_size, 'cpu')
        for d, (g, e) in enumerate(zip(got, expected)):
            assert g.shape == (max(0, LENGTHS[d] - 1),), (d, g.shape)
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5, err_msg=f"{name} doc {d} batch {batch_size}")


@pytest.mark.parametrize('name', [name for name in MODELS if name not in MEMORYLESS])   # GPT-2 alone: nothing to see
def test_a_document_does_not_see_the_previous_one(name, monkeypatch):
    """Batch size 1: document B after A and B after C score the same; without the reset they would not."""
    model = tiny_model(name)
    a, b, c = random_docs([33, 30, 33], seed=3)          # longest first: B is read after A (after C)
    seg_len = model.config.seg_len
    after_a = longdoc.document_nll(model, [a, b], seg_len, 1, 'cpu')[1]
    after_c = longdoc.document_nll(model, [c, b], seg_len, 1, 'cpu')[1]
    np.testing.assert_allclose(after_a, after_c, rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(model, 'reset_memory', lambda memory, mask: memory)
    leaky_a = longdoc.document_nll(model, [a, b], seg_len, 1, 'cpu')[1]
    leaky_c = longdoc.document_nll(model, [c, b], seg_len, 1, 'cpu')[1]
    assert np.abs(leaky_a - leaky_c).max() > 1e-4       # the check has power: this model's memory matters


@dataclasses.dataclass
class Count:
    seen: torch.Tensor                  # (B,) tokens this row has read since its memory was emptied


class PositionOracle(torch.nn.Module):
    """Knows a token's position only from its memory: predicts token (tokens seen + 1) with logit 20, others 0."""
    vocab = 256

    def init_memory(self, batch_size, device, mem_len=None):
        return Count(torch.zeros(batch_size, dtype=torch.long))

    def reset_memory(self, memory, mask):
        return Count(memory.seen * ~mask)

    def forward(self, idx, memory, targets=None):
        B, T = idx.shape
        nxt = memory.seen[:, None] + torch.arange(1, T + 1)[None]            # the position each input predicts
        logits = 20.0 * torch.nn.functional.one_hot(nxt % self.vocab, self.vocab).float()
        return logits, None, Count(memory.seen + T), {}


def test_positions_are_the_index_in_the_document():
    """Token p of every document is p: the oracle gets every token right only if each is predicted at its own
    position, once, with the count emptied at the document start; a shifted document is all wrong."""
    docs = [np.arange(n, dtype=np.int64) for n in LENGTHS]
    got = longdoc.document_nll(PositionOracle(), docs, 8, 3, 'cpu')
    assert [len(g) for g in got] == [max(0, n - 1) for n in LENGTHS]
    assert all((g < 1e-5).all() for g in got)                         # log(1 + 255 e^-20) = 5e-7 each
    shifted = longdoc.document_nll(PositionOracle(), [np.arange(1, 20)], 8, 1, 'cpu')[0]
    assert (shifted > 19).all()


def test_schedule_gives_each_document_to_one_row_longest_first():
    rows, steps = longdoc.schedule([37, 8, 9, 1, 2, 25], seg_len=8, batch_size=2)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 4, 5]     # document 3 has nothing to predict
    # segments 5, 1, 1, 0, 1, 3; order 0, 5, 2, 1, 4: row 0 reads 0 (steps 0-4) then 4; row 1 reads 5, 2, 1
    assert rows == [[0, 4], [5, 2, 1]] and steps == 6


# -----------------------------------------------------------------------------------------------------------
# Statistics by hand


def test_bucket_means_and_standard_errors_by_hand():
    """Buckets [0,2) [2,4) [4,end); per-token NLL of 3 documents (positions 1 ...)."""
    nlls = [np.array([1., 2, 3, 4, 5]), np.array([2., 4]), np.array([3., 1, 1])]
    tokens = [np.array([9, 0, 1, 0, 1, 1]), np.array([9, 1, 1]), np.array([9, 1, 0, 1])]
    S, N, Y = longdoc.bucket_sums(nlls, tokens, [2, 4], byte_lengths=np.array([0, 2] + [1] * 8))
    np.testing.assert_array_equal(S, [[1, 5, 9], [2, 4, 0], [3, 2, 0]])
    np.testing.assert_array_equal(N, [[1, 2, 2], [1, 1, 0], [1, 2, 0]])
    np.testing.assert_array_equal(Y, [[0, 2, 4], [2, 2, 0], [2, 2, 0]])          # token 0 spells 0 bytes, 1 two
    mean, se = longdoc.ratio_stats(S, N, N > 0)
    assert mean == pytest.approx([2.0, 11 / 5, 4.5])
    # bucket 0: residuals S - R n = -1, 0, 1; bucket 1: 0.6, 1.8, -2.4; bucket 2: one document, no s.e.
    assert se[0] == pytest.approx(math.sqrt(3 / 2 * 2) / 3)
    assert se[1] == pytest.approx(math.sqrt(3 / 2 * 9.36) / 5)
    assert se[2] is None
    rows, _ = longdoc.summarize_label([(S, N, Y)], 'bpc')
    assert rows[1]['bpc'] == pytest.approx(11 / math.log(2) / 6) and rows[0]['tokens'] == 3
    assert rows[2]['documents'] == 1 and rows[0]['nll_seed_std'] is None


def test_position_in_the_segment():
    """seg_len 4: the input of position p sits at index (p - 1) mod 4 of its segment (every document starts one)."""
    nlls = [np.arange(1., 11), np.array([5., 7])]                       # positions 1..10 and 1..2
    tokens = [np.zeros(11, dtype=int), np.zeros(3, dtype=int)]
    S, N, _ = longdoc.bucket_sums(nlls, tokens, [1, 3], seg_len=4)     # [0,1) [1,3) [3,4)
    np.testing.assert_array_equal(N, [[3, 5, 2], [1, 1, 0]])
    np.testing.assert_array_equal(S, [[1 + 5 + 9, 2 + 3 + 6 + 7 + 10, 4 + 8], [5, 7, 0]])
    assert longdoc.midpoints([1, 3], 3, 'segment') == [0, 1.5, 3]


def test_equal_token_counts_give_the_standard_error_of_the_document_means():
    rng = np.random.default_rng(0)
    S, N = rng.random((7, 1)) * 10, np.full((7, 1), 5.0)
    _, se = longdoc.ratio_stats(S, N, N > 0)
    means = S[:, 0] / 5
    assert se[0] == pytest.approx(means.std(ddof=1) / math.sqrt(7))


def test_seeds_are_averaged_and_differences_are_paired_by_document():
    """Two seeds: the label's mean is the mean of the seeds' means, seed_std their std. A label that is the
    baseline plus 0.1 nats on every token differs by exactly 0.1 with s.e. 0 (the documents' difficulty cancels),
    although its own s.e. across documents is large."""
    rng = np.random.default_rng(1)
    N = rng.integers(1, 50, (5, 2)).astype(float)
    Y = N * 2
    base = [(N * rng.random((5, 1)) * 4, N, Y) for _ in range(2)]
    label = [(s + 0.1 * N, N, Y) for s, _, _ in base]
    rows, S = longdoc.summarize_label(label, 'bpc')
    base_rows, base_S = longdoc.summarize_label(base, 'bpc')
    seed_means = [(s.sum(0) / N.sum(0)) for s, _, _ in label]
    assert rows[1]['nll'] == pytest.approx(np.mean([m[1] for m in seed_means]))
    assert rows[1]['nll_seed_std'] == pytest.approx(np.std([m[1] for m in seed_means], ddof=1))
    assert rows[1]['nll_se'] > 0.1
    diff = longdoc.difference(S, base_S, N, Y, rows, base_rows, 2, 2, 'bpc')
    assert diff[0]['diff_nll'] == pytest.approx(0.1) and diff[0]['diff_nll_se'] == pytest.approx(0, abs=1e-12)
    assert diff[0]['diff_bpc'] == pytest.approx(0.1 / math.log(2) / 2)
    seed_se = math.sqrt(rows[0]['nll_seed_std'] ** 2 / 2 + base_rows[0]['nll_seed_std'] ** 2 / 2)
    assert diff[0]['diff_nll_seed_se'] == pytest.approx(seed_se)
    assert diff[0]['diff_nll_se_total'] == pytest.approx(seed_se)


# -----------------------------------------------------------------------------------------------------------
# Copy distance


def brute_copy_distances(tokens, n):
    """d(p) by its definition: p - q for the largest q < p (q >= n - 1) with the same n tokens ending at q."""
    tokens, out = list(tokens), []
    for p in range(1, len(tokens)):
        out.append(next((p - q for q in range(p - 1, n - 2, -1) if p >= n - 1
                         and tokens[q - n + 1:q + 1] == tokens[p - n + 1:p + 1]), 0))
    return np.array(out, dtype=np.int64)


def test_copy_distances_are_the_brute_force_ones():
    """Small vocabularies (many repeats), n from 1 to beyond the document; empty and one-token documents."""
    rng = np.random.default_rng(0)
    for length in (0, 1, 2, 3, 7, 40, 90):
        for vocab in (2, 3, 11):
            t = rng.integers(0, vocab, length)
            for n in (1, 2, 3, 6, length, length + 5):
                if n >= 1:
                    got = longdoc.copy_distances(t, n)
                    assert got.dtype == np.int64 and got.shape == (max(0, length - 1),)
                    np.testing.assert_array_equal(got, brute_copy_distances(t, n), err_msg=f"{length} {vocab} {n}")
    np.testing.assert_array_equal(longdoc.copy_distances([5, 5, 5, 7, 5, 5], 1), [1, 1, 0, 2, 1])
    np.testing.assert_array_equal(longdoc.copy_distances([5, 5, 5, 7, 5, 5], 2), [0, 1, 0, 0, 3])
    assert longdoc.copy_ngram(0, {'tokenizer': 'bytes'}) == longdoc.copy_ngram(0, {'tokenizer': 'chars'}) == 6
    assert longdoc.copy_ngram(0, {'tokenizer': 'gpt2'}) == longdoc.copy_ngram(0, None) == 2
    assert longdoc.copy_ngram(3, {'tokenizer': 'bytes'}) == 3


@pytest.mark.parametrize('n', [1, 2, 6])
def test_a_repeated_block_is_copied_from_its_distance(n):
    """A block of distinct tokens, repeated D tokens later: every token of the second copy but its first n - 1 has
    d = D (the n-gram ending there is whole in the copy, and its one earlier occurrence is D back); every token of
    the first copy is a first occurrence (its tokens occur nowhere before)."""
    rng = np.random.default_rng(n)
    block = rng.permutation(3000)[:700]                     # distinct tokens
    a, b = rng.integers(3000, 3010, 50), rng.integers(3000, 3010, 1300)
    b[-1] = a[-1] + 1 if a[-1] < 3009 else 3000                      # the copies follow different tokens
    tokens = np.concatenate([a, block, b, block, rng.integers(3000, 3010, 30)])
    s1, s2 = len(a), len(a) + len(block) + len(b)
    D = s2 - s1
    d = longdoc.copy_distances(tokens, n)
    dist = lambda p0, p1: d[p0 - 1:p1 - 1]                           # d(p) for positions p0 ... p1 - 1
    assert (dist(s2 + n - 1, s2 + len(block)) == D).all()
    assert (dist(s2, s2 + n - 1) != D).all()                        # these n-grams start in b: not a copy of a's
    assert (dist(s1, s1 + len(block)) == 0).all()


def test_buckets_left_empty_read_by_position_and_explicit_ones_as_given():
    edges = lambda **k: longdoc.LongDocConfig(**k).bucket_edges()
    assert edges() == [64, 256, 1024, 4096]
    assert edges(position='copy') == [64, 128, 256, 512, 1024, 4096]
    assert edges(position='copy', buckets='64,256,1024,4096') == [64, 256, 1024, 4096]   # the position default, named


def test_bucket_sums_by_copy_distance_are_the_brute_force_ones():
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 4, n) for n in (1, 2, 30, 61, 9)]
    nlls = [rng.random(max(0, len(t) - 1)) for t in docs]
    byte_lengths = np.array([0, 1, 2, 3])
    edges = [2, 5, 10]                                              # [1,2) [2,5) [5,10) [10,end) first
    S, N, Y = longdoc.bucket_sums(nlls, docs, edges, byte_lengths,
                                  distances=[longdoc.copy_distances(t, 3) for t in docs])
    want = np.zeros((3, len(docs), 5))
    for i, (t, nll) in enumerate(zip(docs, nlls)):
        for p, (dist, x) in enumerate(zip(brute_copy_distances(t, 3), nll), start=1):
            k = 4 if dist == 0 else sum(dist >= e for e in edges)
            want[:, i, k] += [x, 1, byte_lengths[t[p]]]
    for got, w in zip((S, N, Y), want):
        np.testing.assert_allclose(got, w)
    assert N[2:].sum() == 60 + 29 + 8 and N[:, 4].sum() > 0 and N[:, :4].sum() > 0
    assert longdoc.bucket_names(edges, 'copy') == ['[1,2)', '[2,5)', '[5,10)', '[10,end)', 'first']
    assert longdoc.midpoints(edges, 60, 'copy') == pytest.approx([math.sqrt(2), math.sqrt(10), math.sqrt(50),
                                                                  math.sqrt(610), 122])


def test_runs_flags_are_gathered_and_labelled():
    argv = longdoc.gather_runs_flags(['--runs=xl:a,b', '--split=test', '--runs=base:c', '--runs=out/d'])
    assert argv == ['--split=test', '--runs=xl:a,b;base:c;out/d']
    assert longdoc.parse_runs(argv[-1].split('=', 1)[1]) == {'xl': ['a', 'b'], 'base': ['c'], 'd': ['out/d']}
    assert longdoc.bucket_names([64, 256]) == ['[0,64)', '[64,256)', '[256,end)']


# -----------------------------------------------------------------------------------------------------------
# End to end on train.py checkpoints

TEXT = ("ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
        "Arise, fair sun, and kill the envious moon, who is already sick and pale with grief. ")
HELD_OUT = (TEXT[:70], TEXT[20:120], TEXT[5:40] * 2, 'Ay.')     # 71, 101, 71 and 4 bytes with their EOT


def dataset(root, tokenizer):
    def encode(text):
        if tokenizer.name == 'chars':                                   # text8's 27 symbols
            text = ''.join(c for c in text.lower() if c in tokenizer.symbols)
        return shards.encode_doc(text, words=len(text.split()), tokenizer=tokenizer)
    splits = {'train': [TEXT * 20, TEXT * 10], 'validation': list(HELD_OUT), 'test': list(HELD_OUT[:2])}
    shards.write_dataset(str(root), splits, encode, dataset='fixture', source='test', word_rule='split',
                         tokenizer=tokenizer)
    return Path(root)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """Byte data; tiny XL (mem_len 16) and its no-memory baseline, 2 seeds each, 3 steps of train.py."""
    root = tmp_path_factory.mktemp('longdoc')
    data = dataset(root / 'data', bytes_tokenizer())
    model = {k: v for k, v in TINY_XL.items() if k != 'vocab_size'}
    out = {}
    for label, mem_len in (('xl', 16), ('base', 0)):
        for seed in (1, 2):
            out_dir = root / f'{label}-s{seed}'
            train.main(flags(data, out_dir, dict(model, mem_len=mem_len), max_iters=3, seed=seed))
            out.setdefault(label, []).append(out_dir)
    return data, out


def test_end_to_end_on_checkpoints(runs, tmp_path, capsys):
    data, out = runs
    path = tmp_path / 'longdoc_t.json'
    longdoc.main([f"--runs=xl:{','.join(map(str, out['xl']))}", f"--runs=base:{','.join(map(str, out['base']))}",
                  '--baseline=base', '--buckets=4,16,64', '--batch_size=3', '--device=cpu', f'--out={path}'])
    printed = capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result['unit'] == 'bpc' and result['baseline'] == 'base' and list(result['labels']) == ['xl', 'base']
    lengths = [len(t.encode()) + 1 for t in HELD_OUT]
    assert [d['length'] for d in result['documents']] == lengths
    buckets = result['labels']['xl']['buckets']
    assert sum(b['tokens'] for b in buckets) == sum(n - 1 for n in lengths)
    assert [b['tokens'] for b in buckets] == [4 * 3, 3 * 12, 3 * 48, 2 * 7 + 37]       # lengths 71, 101, 71, 4
    assert [b['documents'] for b in buckets] == [4, 3, 3, 3]
    assert all(b['diff_nll'] == 0 and b['diff_nll_se'] in (0, None) for b in result['labels']['base']['buckets'])
    # the runs' per-document sums are document_nll of the checkpoint's model; the label averages its seeds
    sums = []
    for run in out['xl']:
        ckpt = train.load_checkpoint(run / 'ckpt.pt')
        _, cfg, model = train.model_from_checkpoint(ckpt)
        docs = longdoc.read_docs(data, 'validation')
        S, N, _ = longdoc.bucket_sums(longdoc.document_nll(model, docs.tokens, cfg.seg_len, 2, 'cpu'), docs.tokens,
                                      [4, 16, 64])
        np.testing.assert_allclose(result['runs'][key(run)]['doc_nll_sums'], S, rtol=1e-9)
        sums.append(S.sum(0) / N.sum(0))
    assert buckets[1]['nll'] == pytest.approx((sums[0][1] + sums[1][1]) / 2)
    assert buckets[1]['nll_seed_std'] == pytest.approx(abs(sums[0][1] - sums[1][1]) / math.sqrt(2))
    diff = buckets[1]['nll'] - result['labels']['base']['buckets'][1]['nll']
    assert buckets[1]['diff_nll'] == pytest.approx(diff)
    assert 'difference to base' in printed and '[0,4)' in printed and 'bpc' in printed
    pytest.importorskip('matplotlib')
    assert path.with_suffix('.png').stat().st_size > 1000


def test_by_position_in_the_segment_reads_the_same_tokens(runs, tmp_path):
    """--position=segment buckets the same per-token NLLs (from the cache) by their index in the segment."""
    data, out = runs
    seg_len = train.load_checkpoint(out['xl'][0] / 'ckpt.pt')['model_config']['seg_len']
    common = [f"--runs=xl:{out['xl'][0]}", f"--runs=base:{out['base'][0]}", '--device=cpu', '--plot=False']
    longdoc.main(common + ['--buckets=4,16,64', f'--out={tmp_path / "d.json"}'])
    longdoc.main(common + ['--position=segment', '--buckets=1', f'--out={tmp_path / "s.json"}'])
    by_doc, by_seg = (json.loads((tmp_path / f).read_text()) for f in ('d.json', 's.json'))
    first, rest = by_seg['labels']['xl']['buckets']
    lengths = [len(t.encode()) + 1 for t in HELD_OUT]
    assert first['tokens'] == sum(-(-(n - 1) // seg_len) for n in lengths)          # one a segment
    assert first['tokens'] + rest['tokens'] == sum(b['tokens'] for b in by_doc['labels']['xl']['buckets'])
    total = lambda r: sum(b['nll'] * b['tokens'] for b in r['labels']['xl']['buckets'])
    assert total(by_seg) == pytest.approx(total(by_doc))
    assert by_seg['midpoints'] == [0, seg_len / 2]
    with pytest.raises(SystemExit):
        longdoc.main(common + ['--position=segment', f'--buckets={seg_len}', f'--out={tmp_path / "x.json"}'])


def test_by_copy_distance_reads_the_same_tokens(runs, tmp_path, capsys):
    """--position=copy buckets the cached per-token NLLs by copy distance (6-grams on bytes), plus 'first'; the
    buckets hold every predicted token once; --reuse checks the position and n-grams."""
    data, out = runs
    common = [f"--runs=xl:{out['xl'][0]}", f"--runs=base:{out['base'][0]}", '--device=cpu', '--baseline=base']
    longdoc.main(common + ['--plot=False', f'--out={tmp_path / "d.json"}'])
    capsys.readouterr()
    path = tmp_path / 'c.json'
    longdoc.main(common + ['--position=copy', '--buckets=8,32,64', f'--out={path}'])
    printed = capsys.readouterr().out
    by_doc, by_copy = json.loads((tmp_path / 'd.json').read_text()), json.loads(path.read_text())
    assert 'cached' in printed and '6-grams' in printed and 'first' in printed
    assert by_copy['bucket_names'] == ['[1,8)', '[8,32)', '[32,64)', '[64,end)', 'first']
    assert by_copy['copy_ngram'] == 6 and by_copy['position'] == 'copy' and len(by_copy['midpoints']) == 5
    buckets = by_copy['labels']['xl']['buckets']
    docs = longdoc.read_docs(data, 'validation')
    d = np.concatenate([longdoc.copy_distances(t, 6) for t in docs.tokens])
    lengths = [len(t.encode()) + 1 for t in HELD_OUT]
    assert sum(b['tokens'] for b in buckets) == len(d) == sum(n - 1 for n in lengths)
    assert [b['tokens'] for b in buckets] == [((d >= a) & (d < b)).sum() for a, b in
                                              ((1, 8), (8, 32), (32, 64), (64, 10 ** 9))] + [(d == 0).sum()]
    assert buckets[2]['tokens'] >= 35 - 5                        # TEXT[5:40] twice: a copy at distance 35
    assert sum(b['share'] for b in buckets) == pytest.approx(1)
    total = lambda r: sum(b['nll'] * b['tokens'] for b in r['labels']['xl']['buckets'] if b['tokens'])
    assert total(by_copy) == pytest.approx(total(by_doc))
    if importlib.util.find_spec('matplotlib'):
        assert path.with_suffix('.png').stat().st_size > 1000
    longdoc.main([common[1], '--device=cpu', '--position=copy', '--buckets=8,32,64', '--plot=False',
                  f'--out={tmp_path / "base.json"}'])
    flags = [common[0], '--device=cpu', '--baseline=base', f'--reuse={tmp_path / "base.json"}', '--plot=False',
             f'--out={tmp_path / "x.json"}']
    longdoc.main(flags + ['--position=copy', '--buckets=8,32,64'])
    reused = json.loads((tmp_path / 'x.json').read_text())['labels']['xl']['buckets']
    assert [b['diff_nll'] for b in reused] == pytest.approx([b['diff_nll'] for b in buckets])
    for other in (['--position=copy', '--buckets=8,32,64', '--copy_ngram=2'], ['--buckets=8,32,64']):
        assert 'other documents or buckets' in error_of(capsys, flags + other)


def test_reuse_compares_with_an_earlier_result_as_if_read_together(runs, tmp_path, capsys):
    data, out = runs
    xl, base = (f"--runs={k}:{','.join(map(str, out[k]))}" for k in ('xl', 'base'))
    common = ['--buckets=4,16,64', '--batch_size=3', '--device=cpu', '--plot=False']
    longdoc.main([xl, base, '--baseline=base', f'--out={tmp_path}/together.json'] + common)
    longdoc.main([base, f'--out={tmp_path}/base.json'] + common)
    longdoc.main([xl, f'--reuse={tmp_path}/base.json', '--baseline=base', f'--out={tmp_path}/reused.json'] + common)
    together, reused = (json.loads((tmp_path / f).read_text()) for f in ('together.json', 'reused.json'))
    assert list(reused['labels']) == ['xl', 'base'] and reused['baseline'] == 'base'
    for label in ('xl', 'base'):
        for a, b in zip(together['labels'][label]['buckets'], reused['labels'][label]['buckets']):
            assert a.keys() == b.keys()
            for k in a:                                           # numbers to rounding, the rest exactly
                if isinstance(a[k], (int, float)) and not isinstance(a[k], bool):
                    assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), (label, k)
                else:
                    assert a[k] == b[k], (label, k)
    assert reused['runs'][key(out['base'][0])]['doc_nll_sums'] == together['runs'][key(out['base'][0])]['doc_nll_sums']
    assert 'other documents or buckets' in error_of(capsys, [xl, f'--reuse={tmp_path}/base.json', '--buckets=4,16',
                                                              f'--out={tmp_path}/x.json'] + common[1:])
    assert "'base' is also in --runs" in error_of(capsys, [base, f'--reuse={tmp_path}/base.json',
                                                           f'--out={tmp_path}/x.json'] + common)
    again = f"--runs=again:{','.join(map(str, out['base']))}"   # the same checkpoints read otherwise, beside the old
    longdoc.main([again, '--eval_mem_len=8', f'--reuse={tmp_path}/base.json', f'--out={tmp_path}/again.json'] + common)
    again = json.loads((tmp_path / 'again.json').read_text())
    assert len(again['runs']) == 2 * len(out['base']) and again['labels']['base']['runs'] == [
        f'{key(r)} (base)' for r in out['base']]
    assert again['runs'][key(out['base'][0])]['mem_len'] == 8 and again['runs'][f"{key(out['base'][0])} (base)"][
        'doc_nll_sums'] == together['runs'][key(out['base'][0])]['doc_nll_sums']      # each its own reading
    assert again['labels']['again']['buckets'][1]['nll'] != again['labels']['base']['buckets'][1]['nll']
    (tmp_path / 'other.json').write_text('{"labels": {}}')
    assert "not a longdoc result (no 'runs')" in error_of(capsys, [xl, f'--reuse={tmp_path}/other.json',
                                                                   f'--out={tmp_path}/x.json'] + common)
    assert 'cannot read it' in error_of(capsys, [xl, f'--reuse={tmp_path}/nothing.json',
                                                 f'--out={tmp_path}/x.json'] + common)


def test_reuse_of_one_result_per_run_is_the_reading_together(runs, tmp_path, capsys):
    """--reuse of several results, each one run (a label's seeds in separate results), without --runs: the same
    labels, runs and numbers as reading every checkpoint together, by position in the segment and by copy distance
    too (the documents and counts are rebuilt from the data); a reading reused twice is an error."""
    data, out = runs
    for position, buckets in (('document', '4,16,64'), ('segment', '2,4'), ('copy', '8,32')):
        common = [f'--buckets={buckets}', f'--position={position}', '--device=cpu', '--plot=False']
        longdoc.main([f"--runs=base:{','.join(map(str, out['base']))}", f"--runs=xl:{','.join(map(str, out['xl']))}",
                      f'--out={tmp_path}/together.json'] + common)
        parts = []
        for label in ('base', 'xl'):
            for i, run in enumerate(out[label]):
                parts.append(tmp_path / f'{label}{i}.json')
                longdoc.main([f'--runs={label}:{run}', f'--out={parts[-1]}'] + common)
        longdoc.main([f"--reuse={','.join(map(str, parts))}", '--baseline=base', f'--out={tmp_path}/merged.json']
                     + common)
        together, merged = (json.loads((tmp_path / f).read_text()) for f in ('together.json', 'merged.json'))
        assert merged['labels'].keys() == together['labels'].keys() and merged['runs'].keys() == together['runs'].keys()
        assert merged['doc_tokens'] == together['doc_tokens'] and merged['bucket_names'] == together['bucket_names']
        for label in ('base', 'xl'):
            assert merged['labels'][label]['runs'] == together['labels'][label]['runs']
            for a, b in zip(together['labels'][label]['buckets'], merged['labels'][label]['buckets']):
                assert a.keys() == b.keys(), (position, label)
                for k in a:
                    if isinstance(a[k], float):
                        assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), (position, label, k)
                    else:
                        assert a[k] == b[k], (position, label, k)
        assert merged['labels']['xl']['buckets'][1]['diff_nll'] not in (0, None)     # the comparison is not empty
    assert 'in an earlier --reuse result too' in error_of(capsys, [f'--reuse={parts[0]},{parts[0]}',
                                                                   f'--out={tmp_path}/x.json'] + common)
    assert '--runs is required' in error_of(capsys, [f'--out={tmp_path}/x.json'] + common)


def test_eval_mem_len_and_splits(runs, tmp_path):
    data, out = runs
    path = tmp_path / 'r.json'
    longdoc.main([f"--runs={out['xl'][0]}", '--eval_mem_len=4', '--split=validation,test', '--max_tokens_per_doc=50',
                  '--max_docs=5', '--device=cpu', '--plot=False', f'--out={path}'])
    result = json.loads(path.read_text())
    run = result['runs'][key(out['xl'][0])]
    assert run['mem_len'] == 4 and list(result['labels']) == ['xl-s1']
    assert [(d['split'], d['read']) for d in result['documents']] == [('validation', 50), ('validation', 50),
                                                                      ('validation', 50), ('validation', 4),
                                                                      ('test', 50)]


def test_results_name_paths_relative_to_the_repository(runs, tmp_path):
    """A result names its checkpoints, data and files relative to the repository, never by the absolute paths of the
    machine that ran it: here runs, data and output lie outside the repository, given by absolute paths."""
    data, out = runs
    path = tmp_path / 'r.json'
    longdoc.main([f"--runs=xl:{out['xl'][0]}", f'--data_dir={data}', '--max_docs=2', '--device=cpu', '--plot=False',
                  f'--out={path}'])
    text = path.read_text()
    assert not any(s in text for s in ('"/', "'/", ' /', '=/', ':/', ',/', ';/')), text
    result = json.loads(text)
    repo = longdoc.common.REPO
    (run, info), = result['runs'].items()
    assert result['labels']['xl']['runs'] == [run] and (repo / run).resolve() == out['xl'][0].resolve()
    assert (repo / info['checkpoint']).resolve() == (out['xl'][0] / 'ckpt.pt').resolve()
    assert (repo / result['data_dir']).resolve() == data.resolve()
    assert (repo / result['config']['out']).resolve() == path.resolve()
    assert result['command'].endswith(f"--out={result['config']['out']}")
    relative = longdoc.common.relative_paths
    assert relative({f'{repo}/a': [f'x:{repo}/b,{repo}/c', 'see https://github.com/x/y', 'a / b']}) == \
        {'a': ['x:b,c', 'see https://github.com/x/y', 'a / b']}


def test_name_picks_the_results_file():
    assert longdoc.LongDocConfig(name='pg19').out_path() == longdoc.common.RESULTS / 'longdoc_pg19.json'
    assert longdoc.LongDocConfig().out_path().name == 'longdoc.json'


# -----------------------------------------------------------------------------------------------------------
# One-line errors


def error_of(capsys, argv):
    capsys.readouterr()                                                 # what came before (dataset progress bars)
    with pytest.raises(SystemExit) as e:
        longdoc.main(argv)
    assert e.value.code == 2
    return assert_one_line_error(capsys.readouterr().err)


def test_bad_input_is_a_one_line_error(runs, tmp_path, capsys):
    data, out = runs
    run = str(out['xl'][0])
    chars = dataset(tmp_path / 'chars', chars_tokenizer())
    no_docs = tmp_path / 'no_docs'
    no_docs.mkdir()
    for f in ('validation.bin', 'meta.json'):
        (no_docs / f).write_bytes((data / f).read_bytes())
    cases = [([f'--runs={run}', f'--data_dir={tmp_path / "missing"}'], 'no data at'),
             ([f'--runs={run}', f'--data_dir={chars}'], 'was trained on bytes tokens'),
             ([f'--runs={run}', f'--data_dir={no_docs}'], 'validation_docs.npy'),
             ([f'--runs={tmp_path / "nowhere"}'], 'no checkpoint at'),
             ([f'--runs=a:{run}', '--baseline=b'], '--baseline=b is not a label'),
             ([f'--runs=a:{run}', '--buckets=64,16'], '--buckets'),
             ([f'--runs=a:{run}', f'--runs=b:{run}'], 'given twice'),
             (['--split=dev'], 'split'),
             ([f'--runs={run}', '--reset_every=-2'], 'reset_every'),
             ([f'--runs={run}', '--copy_ngram=-1'], 'copy_ngram'),
             ([f'--runs={run}', '--position=copy', '--buckets=64,64'], '--buckets'),
             ([f'--runs={run}', '--position=distance'], 'position'),
             ([], '--runs is required')]
    for argv, fragment in cases:
        assert fragment in error_of(capsys, argv + ['--device=cpu', '--plot=False', f'--out={tmp_path / "x.json"}'])


def test_eval_mem_len_needs_a_model_with_mem_len(tmp_path, capsys):
    data = dataset(tmp_path / 'data', bytes_tokenizer())
    spec = {k: v for k, v in TINY_MODELS['infini'].items() if k != 'vocab_size'}
    train.main(flags(data, tmp_path / 'infini', spec, max_iters=1))
    message = error_of(capsys, [f'--runs={tmp_path / "infini"}', '--eval_mem_len=8', '--device=cpu', '--plot=False',
                                f'--out={tmp_path / "x.json"}'])
    assert 'has no mem_len' in message


def test_command_line_error_in_a_fresh_process(tmp_path):
    r = run_python(['bench/longdoc.py', f'--runs=a:{tmp_path}', '--device=cpu'])
    assert r.returncode == 2
    assert_one_line_error(r.stderr, 'no checkpoint at')


def test_cache_is_reused_and_invalidated(runs, tmp_path, capsys):
    """The per-token NLLs are kept next to the checkpoint: a second read uses them (same result, printed as cached);
    a checkpoint written again (new mtime) or other documents are read afresh; --cache=False writes nothing."""
    import os
    data, out = runs
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'ckpt.pt').write_bytes((out['xl'][0] / 'ckpt.pt').read_bytes())
    args = [f'--runs=a:{run}', '--device=cpu', '--batch_size=2', '--plot=False']
    longdoc.main(args + [f'--out={tmp_path}/1.json'])
    first = json.loads((tmp_path / '1.json').read_text())
    assert 'cached' not in capsys.readouterr().out and len(list(run.glob('ckpt.pt.longdoc-*.npz'))) == 1
    longdoc.main(args + [f'--out={tmp_path}/2.json', '--buckets=8,32'])
    second = json.loads((tmp_path / '2.json').read_text())
    assert 'cached' in capsys.readouterr().out
    assert second['runs'][key(run)]['doc_nll_sums'] != first['runs'][key(run)]['doc_nll_sums']  # other buckets
    assert sum(map(sum, second['runs'][key(run)]['doc_nll_sums'])) == pytest.approx(
        sum(map(sum, first['runs'][key(run)]['doc_nll_sums'])))
    longdoc.main(args + [f'--out={tmp_path}/3.json', '--max_tokens_per_doc=20'])          # other documents
    assert 'cached' not in capsys.readouterr().out and len(list(run.glob('ckpt.pt.longdoc-*.npz'))) == 2
    st = (run / 'ckpt.pt').stat()
    os.utime(run / 'ckpt.pt', ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))               # "trained again"
    longdoc.main(args + [f'--out={tmp_path}/4.json'])
    assert 'cached' not in capsys.readouterr().out and len(list(run.glob('ckpt.pt.longdoc-*.npz'))) == 3
    longdoc.main(args + [f'--out={tmp_path}/5.json', '--cache=False', '--split=test'])
    assert 'cached' not in capsys.readouterr().out and len(list(run.glob('ckpt.pt.longdoc-*.npz'))) == 3
    longdoc.main(args + [f'--out={tmp_path}/6.json', '--reset_every=-1'])       # trained without resets: the same
    assert 'cached' in capsys.readouterr().out
    longdoc.main(args + [f'--out={tmp_path}/7.json', '--reset_every=2'])        # other resets: read afresh
    assert 'cached' not in capsys.readouterr().out and len(list(run.glob('ckpt.pt.longdoc-*.npz'))) == 4
    assert json.loads((tmp_path / '7.json').read_text())['runs'][key(run)]['reset_every'] == 2


@pytest.mark.parametrize('name', ['xl', 'infini'])
def test_reset_every_reads_each_input_of_k_segments_alone(name):
    """reset_every = k: a document's NLLs are those of its inputs of k segments (tokens [i kT, (i + 1) kT], one
    shared with the next input) each read alone with a fresh memory; without the reset they differ."""
    model, docs = tiny_model(name), random_docs()
    T, k = model.config.seg_len, 2
    got = longdoc.document_nll(model, docs, T, 3, 'cpu', reset_every=k)
    for d, t in enumerate(docs):
        chunks = [naive_nll(model, t[a:a + k * T + 1], T) for a in range(0, max(0, len(t) - 1), k * T)]
        expected = np.concatenate(chunks) if chunks else np.zeros(0)
        np.testing.assert_allclose(got[d], expected, rtol=1e-5, atol=1e-5, err_msg=f"{name} doc {d}")
    plain = longdoc.document_nll(model, docs, T, 3, 'cpu')
    assert max(np.abs(g - p).max() for g, p in zip(got, plain) if len(g) > k * T) > 1e-4


@pytest.mark.parametrize('n', [3, 13])
def test_plot_legend_and_colours(n, tmp_path, monkeypatch):
    """Up to 6 labels each panel has its legend; past 6 one legend beside both panels (the code suite's 13 labels
    hid the curves); every label has a colour of its own, on both panels and for its 'first' point."""
    pytest.importorskip('matplotlib')
    import plot
    saved = {}
    monkeypatch.setattr(plot, '_save', lambda fig, path, rect=None: saved.update(fig=fig, rect=rect))
    rows = [{'nll': 1.0, 'nll_se': 0.01, 'diff_nll': -0.1, 'diff_nll_se_total': 0.01} for _ in range(4)]
    result = {'midpoints': [3, 12, 40, 200], 'baseline': 'm0', 'config': {'position': 'copy'}, 'bucket_edges': [8, 32],
              'split': 'validation', 'documents': [0, 1], 'labels': {f'm{i}': {'buckets': rows} for i in range(n)}}
    longdoc.plot_result(result, tmp_path / 'p.png')
    fig = saved['fig']
    a, b = fig.axes
    assert (a.get_legend() is None and b.get_legend() is None and len(fig.legends) == 1) == (n > 6)
    assert (saved['rect'] is None) == (n <= 6)
    labels = (fig.legends[0] if n > 6 else a.get_legend()).get_texts()
    assert [t.get_text() for t in labels] == list(result['labels'])
    for ax in (a, b):
        colours = [tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
                   for line in ax.get_lines() if line.get_marker() in ('o', 's')]
        assert len(colours) == 2 * n and len(set(colours[::2])) == n and colours[::2] == colours[1::2]
