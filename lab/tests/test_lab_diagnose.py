"""
lab/diagnose.py (why a memory does not recall the passkey or the assoc pairs): its Infini-attention read weights
give back the model's own memory read, its ∞-former stages read what the model's LTM attention read (both reads of
lab/model_infformer_probes.py's ltm_read), the assoc losses separate what a memory carries, and bad use is one line.
"""

import json

import numpy as np
import pytest
import torch

from _models import TINY_MODELS
from lab import diagnose

import common  # noqa: E402  (bench/, which lab/diagnose.py puts on sys.path)
import recall  # noqa: E402

TINY_VARIANTS = {'baseline': dict(TINY_MODELS['xl'], mem_len=0), 'xl': TINY_MODELS['xl'],
                 'infini_linear': dict(TINY_MODELS['infini'], memory_update='linear')}


def test_diagnose_gate_history_reads_the_logged_gates(tmp_path):
    """gate_history: evenly spaced rows of the logged σ(β), the first and the last included, lines without gates
    skipped; no log, no rows."""
    rows = [{'step': 10 * i, 'train/gate_head': [i / 100, 1 - i / 100]} for i in range(1, 21)]
    lines = [json.dumps(r) for r in rows] + [json.dumps({'step': 200, 'validation/loss': 1.0})]
    (tmp_path / 'log.jsonl').write_text('\n'.join(lines) + '\n')
    history = diagnose.gate_history(tmp_path, n_points=4)
    assert [step for step, _ in history] == [10, 70, 140, 200]
    assert history[-1][1] == [0.2, 0.8]
    assert diagnose.gate_history(tmp_path, n_points=50) == [(r['step'], r['train/gate_head']) for r in rows]
    assert diagnose.gate_history(tmp_path / 'none') == []


@pytest.mark.parametrize('probe', [{}, dict(model='infini_probes', feature_scale=4.0)], ids=['paper', 'probes'])
def test_diagnose_weights_reproduce_the_infini_memory_read(probe):
    """Σ_j w_j v_j over the tokens in memory, with diagnose's weights, is the model's own A_mem (Eq. 7) for the ASK
    query, at every layer, for the paper's model and for lab/model_infini_probes.py's σ(s x) (feature_scale s);
    the weights are a distribution; the key's share is a number in [0, 1]."""
    import model_infini
    model, c = common.build(dict(TINY_VARIANTS['infini_linear'], seg_len=32, **probe))
    s = probe.get('feature_scale', 1.0)
    model.eval()
    with torch.no_grad():            # keys far from 0, where σ = ELU + 1 is not linear (init keys are ~0.02)
        for layer in model.layers:
            layer.attn.qkv_net.weight.mul_(50)
    body, _ = recall.passkey_eval_episode(np.random.default_rng(0), 40, c.seg_len)   # 2 segments: 1 in memory
    body = body % c.vocab_size
    ask = len(body) - 6
    reads = diagnose.memory_read_weights(model, body, c.seg_len, [ask])
    both = diagnose.memory_read_weights(model, body, c.seg_len, [ask - 1, ask])        # several queries, one pass
    assert set(reads) == set(range(c.n_layer))
    for n, (w, v, M, z) in reads.items():
        assert w.shape == (c.n_head, 1, c.seg_len)
        torch.testing.assert_close(both[n][0][:, 1:], w, atol=1e-6, rtol=1e-5)
        w = w[:, 0]
        assert w.shape == (c.n_head, c.seg_len) and torch.allclose(w.sum(-1), torch.ones(c.n_head))
        h = {}
        hook = model.layers[n].attn.register_forward_hook(lambda m, a, o: h.__setitem__('x', a[0]))
        with torch.no_grad():
            _, _, memory, _ = model(torch.as_tensor(body[None, :c.seg_len]), model.init_memory(1, 'cpu'))
            model(torch.as_tensor(body[None, c.seg_len:]), memory)          # h['x']: this segment's layer input
        hook.remove()
        attn = model.layers[n].attn
        x = attn.layer_norm(h['x']) if attn.pre_lnorm else h['x']
        q = attn.qkv_net(x).view(1, c.seg_len, 3, c.n_head, c.d_head)[0, ask - c.seg_len, 0]      # (H, D)
        a_mem = model_infini.memory_retrieve(model_infini.sigma(s * q)[None, :, None], M, z,
                                             torch.ones(1, 1, 1, 1, dtype=torch.bool))[0, :, 0]   # (H, D)
        torch.testing.assert_close((w[..., None] * v).sum(1), a_mem, atol=1e-5, rtol=1e-4)
    shares, contrast, uniform = diagnose.key_share(model, 40, n_episodes=2)
    assert uniform == 5 / 32 and all(((s >= 0) & (s <= 1)).all() for s in shares.values())
    assert all(((c >= 1) & (c <= 32)).all() for c in contrast.values())      # max weight / (1/32) of 32 tokens


@pytest.mark.parametrize('probe', [dict(model='infformer'), dict(model='infformer_probes', ltm_read='continuous'),
                                   dict(model='infformer_probes', ltm_read='discrete')],
                         ids=['paper', 'probes-continuous', 'probes-discrete'])
def test_diagnose_ltm_read_is_the_infformers_own(probe):
    """The ∞-former's stages: ltm_trace's record of the ASK segment, read as diagnose reads it (ltm_read_states:
    r = Bᵀ E_p[ψ], or Σ_m p_m X̄(m/M) with lab/model_infformer_probes.py's discrete read; then W^V per head),
    for the paper's model and the probes' (its read given by ltm_read), gives the LTM values that
    segment's attention took (Eq. 11, the o_net input), at every layer; the stage means are in range, one per
    head, and {} while the key is in the STM."""
    model, c = common.build(dict(vocab_size=64, n_layer=2, n_embd=32, n_head=2, d_head=16, d_inner=64, seg_len=32,
                                 mem_len=32, n_basis=64, n_samples=64, basis_widths='0.01,0.05', sigma_sq_min=1e-6,
                                 **probe))
    model.eval()
    body, _ = recall.passkey_eval_episode(np.random.default_rng(0), 100, c.seg_len)   # 4 segments: the LTM is written
    inputs, densities, memory = diagnose.ltm_trace(model, body)
    assert int(memory.ltm_written[0]) > 0 and inputs[0].shape == (len(body), c.n_embd)
    for n, layer in enumerate(model.layers):
        seen = {}
        hook = layer.attn.ltm.o_net.register_forward_hook(lambda m, a, o: seen.__setitem__('z', a[0]))
        diagnose.ltm_trace(model, body)
        hook.remove()
        r = diagnose.ltm_read_states(model, n, densities, memory)               # (1, H, T, C)
        w_v = layer.attn.ltm.value_net.weight.view(c.n_head, c.d_head, c.n_embd)
        z = torch.einsum('bhtc,hdc->bthd', r, w_v).reshape(1, c.seg_len, -1)
        torch.testing.assert_close(z, seen['z'], atol=1e-5, rtol=1e-4)
    stages = diagnose.infformer_stages(model, 100, n_episodes=2)
    assert set(stages) == {0, 1}
    for d in stages.values():
        assert -1 <= float(d['write_cos']) <= 1 and d['mu_error'].shape == d['mu'].shape == (c.n_head,)
        assert bool(((d['mu'] >= 0) & (d['mu'] <= 1)).all())
        assert 0 < float(d['gate_digits']) < 1
    assert diagnose.infformer_stages(model, 20, n_episodes=2) == {}           # the key is still in the STM


def test_diagnose_assoc_losses_separate_what_the_memory_carries():
    """assoc_loss_by_kind: with no memory (the baseline) carrying and emptying it give the same losses; with a
    memory (XL, the last 16 tokens of the previous segment) the predictions of later segments change."""
    size = dict(vocab_size=recall.ASSOC_VOCAB, seg_len=64)
    base, _ = common.build(dict(TINY_VARIANTS['baseline'], **size))
    xl, _ = common.build(dict(TINY_VARIANTS['xl'], **size))
    for model in (base, xl):
        model.eval()
    b = diagnose.assoc_loss_by_kind(base, n_segments=3, n_episodes=2)
    assert b['carried'] == b['emptied'] and set(b['carried']) == {'pair', 'question key', 'value'}
    x = diagnose.assoc_loss_by_kind(xl, n_segments=3, n_episodes=2)
    assert all(v > 0 for v in x['carried'].values()) and x['carried'] != x['emptied']
    infini, c = common.build(dict(TINY_VARIANTS['infini_linear'], **size))
    shares, uniform = diagnose.assoc_pair_share(infini.eval(), depth=1, n_episodes=1)
    assert uniform == 1 / 64 and all(s.shape == (c.n_head,) and ((s > 0) & (s < 1)).all() for s in shares.values())


def test_diagnose_rejects_other_models_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        diagnose.main([])
    assert e.value.code == 2 and 'usage' in capsys.readouterr().err
    diagnose.main(['--help'])
    assert 'python lab/diagnose.py OUT_DIR' in capsys.readouterr().out


def test_diagnose_reads_checkpoints_of_the_lab_models_as_the_papers(tmp_path, capsys):
    """A checkpoint of lab/model_infini_probes.py or lab/model_infformer_probes.py (trained by train.py, loaded by
    its --model name) is decomposed as the paper model it extends; a Transformer-XL is a one-line error."""
    import train
    from _train_util import flags
    from data.tokenizer import bytes_tokenizer
    from test_longdoc import dataset
    data = dataset(tmp_path / 'data', bytes_tokenizer())
    models = {'infini': dict(TINY_MODELS['infini'], model='infini_probes', memory_update='linear', seg_len=32,
                             feature_scale=2.0),
              'infformer': dict(TINY_MODELS['infformer'], model='infformer_probes', seg_len=32, mem_len=32,
                                sticky=False, ltm_read='discrete'),
              'xl': dict(TINY_MODELS['xl'], model='xl')}
    for name, model in models.items():
        train.main(flags(data, tmp_path / name, model, max_iters=1))
    capsys.readouterr()
    diagnose.main([str(tmp_path / 'infini'), '--depths=40'])
    assert 'depth 40 layer 0: gate σ(β)' in capsys.readouterr().out
    diagnose.main([str(tmp_path / 'infformer'), '--depths=100'])
    assert 'depth 100 layer 0: gate digits' in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        diagnose.main([str(tmp_path / 'xl')])
    assert e.value.code == 2 and 'decomposed here' in capsys.readouterr().err
