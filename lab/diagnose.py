"""
Why a memory does not recall the passkey (or the assoc pairs), for a checkpoint trained by bench/recall.py:

    python lab/diagnose.py out-recall/passkey/infini_linear/seed1 --depths=96,384
    python lab/diagnose.py out-recall/passkey/infformer/seed1 --depths=160,384
    python lab/diagnose.py out-recall/assoc/infini_linear/seed1     # any model trained on the assoc task
    python lab/diagnose.py out-recall/passkey/infini_linear/seed1 --depths=96 --init   # the same model at init

Infini-attention (`memory_update=linear`): the share of the ASK position's memory read that falls on the key's 5
digit tokens, per layer and head, next to the head's gate σ(β). The ∞-former: its long-term memory stage by stage
(the CNN gate, what the write keeps of each digit, where the ASK queries' Gaussians point; infformer_stages).

The linear memory's read is Σ_j σ(q)·σ(k_j) v_j / Σ_j σ(q)·σ(k_j) over every token j written to it (Eqs. 7-8), so
token j's weight is σ(q)·σ(k_j), normalised. A uniform read would put 5 / (tokens in memory) on the key; a softmax
head that recalls puts nearly all of its weight there. (With the delta update M is not a weighted sum of the
values, so that model is not decomposed.)

Associative recall (any model): what the memory lowers the loss on, by the kind of token predicted (a pair, a
question's key, a value), on training-distribution episodes, with the memory carried and emptied before every
segment (assoc_loss_by_kind); for linear Infini-attention also the read's weight on the asked pair at --depths
(in segments; assoc_pair_share). For Infini-attention, the gates σ(β) of every head over training come first,
from log.jsonl (gate_history). The language-model loss rewards a memory for the values (the recall) and for the
questions' keys (which keys the episode has written so far, a bag of keys that needs no binding).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))   # bench/common.py and the benchmarks
import common  # noqa: E402
import model_infformer  # noqa: E402  (common puts the repository on sys.path)
import model_infini  # noqa: E402
import recall  # noqa: E402


def memory_read_weights(model, body, T, positions):
    """Run the episode `body` (tokens, a multiple of T long) segment by segment through a linear-update Infini
    model, once; for the P queries at `positions` (in the last segment) return, per layer n, the normalised weights
    w (H, P, S) = σ(q)·σ(k_j) / Σ_j σ(q)·σ(k_j) over the S tokens in memory, their values v (H, S, D), and the
    memory (M, z) the layer read: Σ_j w_j v_j is the layer's A_mem for each query (Eqs. 7-8). σ is the layer's own
    feature map (InfiniAttention.features: lab/model_infini_probes.py's feature_scale included)."""
    inputs = {}
    hooks = [layer.attn.register_forward_hook(lambda m, a, o, n=n: inputs.__setitem__(n, a[0]))
             for n, layer in enumerate(model.layers)]
    x = torch.as_tensor(body[None])
    memory, past = model.init_memory(1, 'cpu'), {n: [] for n in range(len(model.layers))}
    out = {}
    try:
        with torch.no_grad():
            for start in range(0, len(body), T):
                _, _, next_memory, _ = model(x[:, start:start + T], memory)
                for n, layer in enumerate(model.layers):
                    attn = layer.attn
                    h = attn.layer_norm(inputs[n]) if attn.pre_lnorm else inputs[n]
                    q, k, v = attn.qkv_net(h).view(1, h.size(1), 3, attn.n_head, attn.d_head).permute(2, 0, 3, 1, 4)
                    if start + T >= len(body):                    # the last segment: the queries at `positions`
                        keys = torch.cat([kv[0] for kv in past[n]], dim=2)[0]         # (H, S, D)
                        values = torch.cat([kv[1] for kv in past[n]], dim=2)[0]       # (H, S, D)
                        rows = torch.as_tensor(positions) - start
                        w = attn.features(q[0][:, rows]) @ attn.features(keys).transpose(1, 2)   # (H, P, S)
                        out[n] = (w / w.sum(-1, keepdim=True), values, memory.M[n], memory.z[n])
                    past[n].append((k, v))
                memory = next_memory
    finally:
        for hk in hooks:
            hk.remove()
    return out


def layer_means(values):
    """{name: [tensor, ...]} -> {name: mean tensor}: a per-episode quantity averaged over episodes."""
    return {name: torch.stack(v).mean(0) for name, v in values.items()}


def key_share(model, depth, n_episodes=32, seed=0):
    """The ASK query's memory read, per layer, mean over episodes: its share on the key's 5 digits (H,) and its
    contrast, the largest weight of any token over the uniform weight (H,); and the uniform share of 5 tokens.
    -> ({layer: share}, {layer: contrast}, uniform share)"""
    rng = np.random.default_rng(seed)
    T, shares, contrast = model.config.seg_len, {}, {}
    for _ in range(n_episodes):
        body, _ = recall.passkey_eval_episode(rng, depth, T)
        key = int(np.flatnonzero(body == recall.KEY)[0])
        for n, (w, _, _, _) in memory_read_weights(model, body, T, [len(body) - 6]).items():   # the ASK token
            w = w[:, 0]                                                                         # (H, S)
            shares.setdefault(n, []).append(w[:, key + 1:key + 6].sum(-1))
            contrast.setdefault(n, []).append(w.max(-1).values * w.size(-1))
            uniform = 5 / w.size(-1)
    return layer_means(shares), layer_means(contrast), uniform


def ltm_trace(model, body):
    """Run the episode `body` (tokens, a multiple of seg_len long) segment by segment through an ∞-former from an
    empty memory. -> (per layer its inputs over the whole episode (len(body), C), per layer the (μ, σ²) each
    (1, H, seg_len) of the last segment's LTM attention with its inputs (queries, LTMRead), the memory after it: its
    ltm_B is the LTM that the last segment read, written at its start)"""
    T, n_layer = model.config.seg_len, model.config.n_layer
    inputs, densities = {n: [] for n in range(n_layer)}, {}
    hooks = [layer.register_forward_pre_hook(lambda m, a, n=n: inputs[n].append(a[0][0]))
             for n, layer in enumerate(model.layers)]
    hooks += [layer.attn.ltm.register_forward_hook(lambda m, a, o, n=n: densities.__setitem__(n, (*o[1:], *a)))
              for n, layer in enumerate(model.layers)]
    try:
        with torch.no_grad():
            for _, _, memory in recall.run_segments(model, torch.as_tensor(body[None]), T):
                pass                                                           # the hooks record; keep the last
    finally:
        for hk in hooks:
            hk.remove()
    return {n: torch.cat(v) for n, v in inputs.items()}, densities, memory


def ltm_read_states(model, n, densities, memory):
    """What layer n's LTM attention read in state space, before W^V, from ltm_trace's record: r = Bᵀ E_p[ψ]
    (Eq. 11), or with lab/model_infformer_probes.py's ltm_read='discrete' r = Σ_m p_m X̄(m/M) = Bᵀ Σ_m p_m ψ(m/M).
    -> (1, H, T, C)"""
    mu, s2, queries, read = densities[n]
    ltm = model.layers[n].attn.ltm
    if getattr(ltm, 'ltm_read', 'continuous') == 'continuous':
        lt = model.long_term
        weights = model_infformer.expected_basis(mu, s2, lt.basis_mu, lt.basis_sigma)               # (1, H, T, N)
    else:
        scores = torch.einsum('bhid,bhmd->bhim', queries, read.keys) * ltm.scale
        weights = torch.softmax(scores.float(), -1) @ ltm.psi_points                                 # (1, H, T, N)
    return weights @ memory.ltm_B[n][:, None].float()


def infformer_stages(model, depth, n_episodes=16, seed=0, grid=4096):
    """Where the ∞-former's long-term memory loses the passkey, stage by stage, at one depth. Per layer n, over
    n_episodes episodes and the 5 digits j (means):
      gate       the CNN gate sigmoid(Conv1d(X)) (Eq. 18) on the digits' layer inputs, and on the filler's;
      write      max_t cos(Bᵀψ(t), x̃_j): how well the signal the ASK segment reads (the ridge regression of
                 Eq. 5 after every later write, Eqs. 13-15) gives back the digit's gated state x̃_j anywhere in
                 [0, 1]; t*_j is where, and `basis_in_span` the basis centres in [min_j t*_j, max_j t*_j];
      read       per head, at the query that predicts digit j: μ and |μ − t*_j| (Eq. 9), σ (Eq. 10), and the
                 cosine of what the density reads in state space, r = Bᵀ E_p[ψ] (Eq. 11 before W^V), with x̃_j
                 against its mean cosine with the other 4 digits' states (above it: the read singles out digit j).
                 With the probes' ltm_read='discrete', μ and σ are the mean and spread of the softmax over the M
                 points, and r = Σ_m p_m X̄(m/M).
    The gate is computed over the whole episode (the model gates each write's L vectors: the same but at the
    first and last of them). Episodes whose LTM is still empty at the ASK are left out.
    -> {layer: dict of means} ({} when every episode's LTM was empty: the key is still in the STM)"""
    c, T = model.config, model.config.seg_len
    rng = np.random.default_rng(seed)
    t = torch.linspace(0, 1, grid, dtype=torch.float32)
    psi = model_infformer.evaluate_basis(t, model.long_term.basis_mu, model.long_term.basis_sigma)   # (grid, N)
    acc = {}
    for _ in range(n_episodes):
        body, _ = recall.passkey_eval_episode(rng, depth, T)
        key, ask = int(np.flatnonzero(body == recall.KEY)[0]), len(body) - 6
        inputs, densities, memory = ltm_trace(model, body)
        if not memory.ltm_written[0] > 0:
            continue                                                           # the key has not reached the LTM
        filler = np.ones(len(body), bool)
        filler[key:key + 6] = False
        filler[ask:] = False
        q = torch.arange(ask, ask + 5) - (len(body) - T)                       # the 5 queries, in the segment
        with torch.no_grad():
            for n, layer in enumerate(model.layers):
                X = inputs[n]                                                  # (len(body), C) the layer inputs
                gate = layer.attn.ltm.gate
                g = torch.sigmoid(gate(X.T[None]))[0].T if gate is not None else torch.ones_like(X)   # (L, C)
                xt = F.normalize((g * X)[key + 1:key + 6], dim=-1)             # x̃ of the 5 digits, unit norm
                signal = psi @ memory.ltm_B[n][0].float()                      # (grid, C) Bᵀψ(t)
                best, where = (F.normalize(signal, dim=-1) @ xt.T).max(0)      # cosines (grid, 5) -> best t
                t_star = t[where]
                mu, s2 = densities[n][0][0][:, q], densities[n][1][0][:, q]    # (H, 5) of the ASK segment
                r = F.normalize(ltm_read_states(model, n, densities, memory)[0][:, q], dim=-1)   # (H, 5, C)
                rc = torch.einsum('hjc,ic->hji', r, xt)                        # (H, 5 queries, 5 digits)
                own = rc.diagonal(dim1=1, dim2=2)                              # (H, 5)
                other = (rc.sum(-1) - own) / 4
                lo, hi = t_star.min(), t_star.max()
                in_span = ((model.long_term.basis_mu >= lo) & (model.long_term.basis_mu <= hi)).sum()
                for name, v in (('gate_digits', g[key + 1:key + 6].mean()), ('gate_filler', g[filler].mean()),
                                ('write_cos', best.mean()), ('t_star', t_star.mean()), ('basis_in_span', in_span),
                                ('mu', mu.mean(-1)), ('mu_error', (mu - t_star).abs().mean(-1)),
                                ('sigma', s2.sqrt().mean(-1)),
                                ('read_cos_own', own.mean(-1)), ('read_cos_other', other.mean(-1))):
                    acc.setdefault(n, {}).setdefault(name, []).append(torch.as_tensor(v, dtype=torch.float32))
    return {n: layer_means(d) for n, d in acc.items()}


@torch.no_grad()
def assoc_loss_by_kind(model, n_segments=9, n_episodes=32, n_pairs=8, seed=0):
    """Mean loss per kind of predicted token over segments 1 ... n_segments - 1 of assoc training episodes.
    -> {'carried': {kind: loss}, 'emptied': {kind: loss}} for kinds 'pair', 'question key', 'value'."""
    T = model.config.seg_len
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(np.stack([recall.assoc_episode(rng, n_segments, T, n_pairs)[0] for _ in range(n_episodes)]))
    nxt = torch.cat([x[:, 1:], torch.full((n_episodes, 1), recall.ASSOC_PAD)], 1)       # the predicted tokens
    kinds = {'pair': nxt < recall.QUESTION0, 'question key': (nxt >= recall.QUESTION0) & (nxt < recall.VALUE0),
             'value': (nxt >= recall.VALUE0) & (nxt < recall.ASSOC_SEP)}
    later = (torch.arange(x.size(1)) >= T)[None]                                         # segments 1 ...
    out = {}
    for name, empty in (('carried', False), ('emptied', True)):
        loss = torch.cat([F.cross_entropy(logits.float().transpose(1, 2), nxt[:, start:start + T], reduction='none')
                          for start, logits, _ in recall.run_segments(model, x, T, reset_every_segment=empty)], 1)
        out[name] = {kind: float(loss[mask & later].mean()) for kind, mask in kinds.items()}
    return out


def assoc_pair_share(model, depth=1, n_episodes=16, n_pairs=8, seed=0):
    """Infini-attention (linear) on assoc: the memory read of a scored question d segments after its pair, per layer
    (H,): the weight on the asked pair's token, and the uniform share of one token. -> ({layer: share}, uniform)"""
    rng = np.random.default_rng(seed)
    T, shares = model.config.seg_len, {}
    for _ in range(n_episodes):
        body, targets = recall.assoc_episode(rng, depth + 1, T, n_pairs, depth=depth)
        asked = np.flatnonzero(targets >= 0)                          # the scored questions' "k?" positions
        keys = body[asked] - recall.QUESTION0
        pairs = [int(np.flatnonzero((body < recall.QUESTION0) & (body // recall.N_VALUES == k))[0]) for k in keys]
        for n, (w, _, _, _) in memory_read_weights(model, body, T, asked).items():          # (H, P, S)
            shares.setdefault(n, []).extend(w[:, range(len(pairs)), pairs].T)              # P of (H,)
    return layer_means(shares), 1 / (depth * T)


def gate_history(out_dir, n_points=8):
    """Infini-attention's gates σ(β) per head over training, from train.py's log.jsonl in out_dir: n_points rows
    (step, [σ(β) of every head, layer by layer]) evenly spaced over the logged steps, the last included."""
    path = Path(out_dir) / 'log.jsonl'
    if not path.exists():
        return []
    rows = [r for r in map(json.loads, path.read_text().splitlines()) if 'train/gate_head' in r]
    picks = sorted({round(i * (len(rows) - 1) / max(1, n_points - 1)) for i in range(n_points)}) if rows else []
    return [(rows[i]['step'], rows[i]['train/gate_head']) for i in picks]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv

    def go(argv):
        usage = "usage: python lab/diagnose.py OUT_DIR [--depths=96,384] [--init]"
        if argv[:1] in (['-h'], ['--help']):
            print(f"{usage}\n\n{__doc__.strip()}")
            return
        if not argv or argv[0].startswith('--'):
            raise common.train.UserError(usage)
        out_dir = Path(argv[0])
        depths = [int(d) for a in argv[1:] if a.startswith('--depths=') for d in a.split('=', 1)[1].split(',')]
        ckpt = common.train.load_checkpoint(out_dir / 'ckpt.pt', 'cpu')
        _, _, model = common.train.model_from_checkpoint(ckpt, out_dir)
        if '--init' in argv[1:]:                          # the same model at initialisation (seed 0)
            torch.manual_seed(0)
            model = type(model)(model.config)
        model.eval()
        infini = isinstance(model, model_infini.Model)         # the paper's, or a lab/ subclass of it
        if infini and '--init' not in argv[1:]:
            H = model.config.n_head
            for step, gates in gate_history(out_dir):
                print(f"step {step}: gates σ(β) " + ' | '.join(' '.join(f'{g:.2f}' for g in gates[i:i + H])
                                                             for i in range(0, len(gates), H)))
        if model.config.vocab_size == recall.ASSOC_VOCAB:                  # trained on the assoc task
            for name, losses in assoc_loss_by_kind(model).items():
                print(f"memory {name}: loss on " + ', '.join(f'{k} {v:.3f}' for k, v in losses.items()))
            if infini and model.config.memory_update == 'linear':
                for depth in depths or [1]:
                    shares, uniform = assoc_pair_share(model, depth, seed=depth)
                    for n, share in shares.items():
                        gates = ', '.join(f'{g:.2f}' for g in model.layers[n].attn.gate())
                        print(f"{depth} segment(s) back, layer {n}: gate σ(β) {gates} | read weight on the asked "
                              f"pair {', '.join(f'{v:.4f}' for v in share)} (one token's uniform share {uniform:.4f})")
            return
        if isinstance(model, model_infformer.Model):
            for depth in depths or [384]:
                stages = infformer_stages(model, depth, seed=depth)
                if not stages:
                    print(f"depth {depth}: the LTM is still empty at the ASK (the key is in the STM)")
                for n, d in stages.items():
                    heads = lambda v: ' '.join(f'{x:.3f}' for x in v.reshape(-1))
                    print(f"depth {depth} layer {n}: gate digits {d['gate_digits']:.2f} filler "
                          f"{d['gate_filler']:.2f} | write cos {d['write_cos']:.2f} at t* {d['t_star']:.3f} "
                          f"({d['basis_in_span']:.1f} basis centres in the key's span) | read per head: μ "
                          f"{heads(d['mu'])}, |μ − t*| {heads(d['mu_error'])}, σ {heads(d['sigma'])}, cos own digit "
                          f"{heads(d['read_cos_own'])} vs others {heads(d['read_cos_other'])}")
            return
        if not infini or model.config.memory_update != 'linear':
            raise common.train.UserError("only Infini-attention with memory_update=linear and the ∞-former are "
                                         "decomposed here")
        for depth in depths or [96]:
            shares, contrast, uniform = key_share(model, depth, seed=depth)
            for n, share in shares.items():
                gates = ', '.join(f'{g:.2f}' for g in model.layers[n].attn.gate())
                print(f"depth {depth} layer {n}: gate σ(β) {gates} | weight on the key digits "
                      f"{', '.join(f'{v:.3f}' for v in share)} (uniform {uniform:.3f}) | largest weight / "
                      f"uniform {', '.join(f'{v:.2f}' for v in contrast[n])}")
    common.train.run_cli(go, argv)


if __name__ == '__main__':
    main()
