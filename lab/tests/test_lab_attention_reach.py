"""
lab/attention_reach.py (how far back a Transformer-XL checkpoint looks): the shares by distance equal a naive loop
over the captured softmax, every query's shares sum to 1, nothing lies beyond the memory plus the segment (nor
beyond the segment without memory), a full memory is attended to; end to end on a trained checkpoint, and a
checkpoint of another model is a one-line error.
"""

import json

import numpy as np
import pytest
import torch

import train
from _train_util import TINY_XL, assert_one_line_error, flags, run_python
from data.tokenizer import bytes_tokenizer
from test_longdoc import dataset

import model_xl
from lab import attention_reach


def tiny(mem_len, seed=0):
    torch.manual_seed(seed)
    config = model_xl.Config(**{**TINY_XL, 'n_layer': 2, 'mem_len': mem_len, 'attn_kernel': 'einsum',
                                'init_std': 0.3})
    return model_xl.Model(config).eval()


def stream(n, rows=3, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (rows, n)).astype(np.int64))


def test_shares_equal_a_naive_loop():
    model, edges, warmup, segments = tiny(mem_len=16), [3, 8, 20], 2, 3
    captured = []
    handles = [b.attn.dropatt.register_forward_hook(lambda m, i, o, n=n: captured.append((n, i[0].clone())))
               for n, b in enumerate(model.layers)]
    shares, uniform = attention_reach.attention_by_distance(model, stream(8 * (warmup + segments)), edges, warmup,
                                                            segments)
    for h in handles:
        h.remove()
    naive, naive_uniform = np.zeros_like(shares), np.zeros_like(uniform)
    queries = 0
    for step, (layer, prob) in enumerate(captured):
        if step // 2 < warmup:                          # two layers per segment; the warm-up is not measured
            continue
        B, H, T, K = prob.shape
        queries += B * T if layer == 0 else 0
        for i in range(T):
            for j in range(K):
                d = i + (K - T) - j                     # query i of the segment, key j of [memory; segment]
                bucket = sum(d >= e for e in edges)
                naive[layer, :, bucket] += prob[:, :, i, j].double().sum(0).numpy()
                if layer == 0 and d >= 0:
                    naive_uniform[bucket] += B / (i + (K - T) + 1)   # query i sees i + S + 1 keys
    np.testing.assert_allclose(shares, naive / queries, atol=1e-12)
    np.testing.assert_allclose(uniform, naive_uniform / queries, atol=1e-12)
    np.testing.assert_allclose(shares.sum(-1), 1.0, atol=1e-9)       # every query's softmax sums to 1


@pytest.mark.parametrize('mem_len', [0, 16])
def test_nothing_beyond_what_the_model_can_see(mem_len):
    seg = TINY_XL['seg_len']
    shares, uniform = attention_reach.attention_by_distance(tiny(mem_len), stream(seg * 5), [seg, seg + 16], 2, 3)
    np.testing.assert_allclose(uniform.sum(), 1.0, atol=1e-12)
    assert uniform[2] == 0 and (uniform[1] > 0) == (mem_len > 0)
    np.testing.assert_allclose(shares.sum(-1), 1.0, atol=1e-9)
    assert np.all(shares[..., 2] == 0)                   # distance >= seg + mem_len (= 24): never a key
    if mem_len == 0:
        assert np.all(shares[..., 1] == 0)               # without memory a query sees only its segment
    else:
        assert np.all(shares[..., 1] > 0.1)              # the full memory (2/3 of the keys at init) is attended


def test_end_to_end_and_errors(tmp_path, capsys):
    data = dataset(tmp_path / 'data', bytes_tokenizer())
    for name, model in (('xl', dict(TINY_XL, model='xl')),
                        ('compressive', dict(TINY_XL, model='compressive', cmem_len=4, compression_rate=2))):
        train.main(flags(data, tmp_path / name, model, max_iters=2))
    attention_reach.main([f'--runs=xl:{tmp_path / "xl"}', '--segments=4', '--rows=2', '--distances=8,16',
                          f'--name=test_{tmp_path.name}'])
    out = attention_reach.LAB_RESULTS / f'attention_reach_test_{tmp_path.name}.json'
    try:
        result = json.loads(out.read_text())
    finally:
        out.unlink()
    assert result['buckets'] == ['[0,8)', '[8,16)', '[16,end)']
    label = result['labels']['xl']
    assert label['runs'][0]['warmup'] == 2 and label['runs'][0]['mem_len'] == TINY_XL['mem_len']
    np.testing.assert_allclose(np.sum(label['per_layer'], axis=-1), 1.0, atol=1e-9)
    np.testing.assert_allclose(np.sum(label['uniform']), 1.0, atol=1e-9)
    assert '| 0 |' in capsys.readouterr().out
    r = run_python(['lab/attention_reach.py', f'--runs={tmp_path / "compressive"}'])
    assert r.returncode == 2 and "model xl only" in r.stderr
    assert_one_line_error(r.stderr, 'compressive')
    r = run_python(['lab/attention_reach.py', f'--runs={tmp_path / "xl"}', '--rows=0'])
    assert r.returncode == 2
    assert_one_line_error(r.stderr, 'rows')
