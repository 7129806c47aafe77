"""
lab/infini_capacity.py (how many assoc pairs Infini-attention's memory alone can give back): its memory is the
linear-attention memory of Eqs. 3-4 (checked against a naive sum over every written token), its questions ask the
pairs written `depth` segments back, detach_writes cuts the gradient into the writes only, and it learns.
"""


import numpy as np
import pytest
import torch

import model_infini as mi
from lab import infini_capacity as cap

import recall  # noqa: E402  (bench/, which lab/infini_capacity.py puts on sys.path)


def small(**kw):
    fields = dict(seg_len=16, assoc_pairs=4, max_depth=3, depths='1,3', n_head=2, batch_size=32, eval_episodes=128)
    fields.update(kw)
    return cap.CapacityConfig(**fields)


def test_episodes_ask_the_pairs_written_depth_segments_back():
    cfg = small()
    rng = np.random.default_rng(0)
    for depth in (1, 3):
        written, questions, answers = cap.episodes(rng, depth, 8, cfg)
        assert written.shape == (8, depth, cfg.seg_len) and questions.shape == answers.shape == (8, 2)
        for b in range(8):
            for q, a in zip(questions[b].tolist(), answers[b].tolist()):
                key = q - recall.QUESTION0
                pair = recall.N_VALUES * key + a
                assert pair in written[b, 0].tolist()                       # written in the oldest segment
                later = written[b, 1:].flatten().tolist()
                assert all(recall.N_VALUES * key + v not in later for v in range(recall.N_VALUES))
                assert q not in written[b].flatten().tolist()              # asked nowhere before


def test_linear_memory_is_the_naive_sum_over_written_tokens():
    """Eqs. 3-4 over several writes: read = σ(q) Σ σ(k_t) v_tᵀ / σ(q) Σ σ(k_t), t over every written token."""
    torch.manual_seed(0)
    cfg = small()
    model = cap.IsolatedMemory(cfg.n_head, 8, 'linear')
    written, questions, _ = cap.episodes(np.random.default_rng(1), 3, 4, cfg)
    model.readout = torch.nn.Identity()
    got = model(written, questions)                                         # (B, Q, H D) the heads' reads
    reads = []
    for b in range(4):
        tokens = written[b].flatten()
        k, v = mi.sigma(model.key[tokens]), model.value[tokens]             # (n, H, D)
        q = mi.sigma(model.query[questions[b]])                             # (Q, H, D)
        M = torch.einsum('nhd,nhe->hde', k, v)
        z = k.sum(0)                                                        # (H, D)
        read = torch.einsum('qhd,hde->qhe', q, M) / torch.einsum('qhd,hd->qh', q, z)[..., None]
        reads.append(read.flatten(1))
    torch.testing.assert_close(got, torch.stack(reads), rtol=1e-5, atol=1e-6)


def test_delta_rule_changes_what_is_read_after_the_first_write():
    torch.manual_seed(0)
    cfg = small()
    written, questions, _ = cap.episodes(np.random.default_rng(2), 3, 4, cfg)
    linear = cap.IsolatedMemory(cfg.n_head, 8, 'linear')
    delta = cap.IsolatedMemory(cfg.n_head, 8, 'delta')
    delta.load_state_dict(linear.state_dict())
    torch.testing.assert_close(linear(written[:, :1], questions), delta(written[:, :1], questions))
    assert not torch.allclose(linear(written, questions), delta(written, questions))


@pytest.mark.parametrize('detach', [False, True])
def test_detach_writes_cuts_only_the_gradient_into_the_writes(detach):
    cfg = small()
    model = cap.IsolatedMemory(cfg.n_head, 8, 'linear', detach_writes=detach)
    written, questions, answers = cap.episodes(np.random.default_rng(3), 2, 4, cfg)
    torch.nn.functional.cross_entropy(model(written, questions).flatten(0, 1), answers.flatten()).backward()
    assert model.query.grad.abs().sum() > 0
    for p in (model.key, model.value):
        assert (p.grad is None or p.grad.abs().sum() == 0) == detach


def test_the_memory_learns_the_lookup():
    cfg = small(steps=500, max_depth=1, depths='1', learning_rate=1e-2)
    r = cap.train_and_evaluate(cfg, d_head=16, rule='linear', seed=0)
    assert r['accuracy'][1] > 0.4                                           # chance 1/8
    assert r['final_train_loss'] < 1.6                                      # ln 8 = 2.08


def test_config_errors():
    with pytest.raises(ValueError, match='rules'):
        cap.CapacityConfig(rules='hebbian')
    with pytest.raises(ValueError, match='keys'):
        cap.CapacityConfig(max_depth=10)
    with pytest.raises(ValueError, match='steps'):
        cap.CapacityConfig(steps=0)
