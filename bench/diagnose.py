"""
Why Infini-attention does not recall the passkey from its memory: for a checkpoint trained by bench/recall.py
(`memory_update=linear`), the share of the ASK position's memory read that falls on the key's 5 digit tokens, per
layer and head, next to the head's gate σ(β), at given depths.

    python bench/diagnose.py out-recall/passkey/infini_linear --depths=96,384

The linear memory's read is Σ_j σ(q)·σ(k_j) v_j / Σ_j σ(q)·σ(k_j) over every token j written to it (Eqs. 7-8), so
token j's weight is σ(q)·σ(k_j), normalised. A uniform read would put 5 / (tokens in memory) on the key; a softmax
head that recalls puts nearly all of its weight there. (With the delta update M is not a weighted sum of the
values, so that model is not decomposed.)
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import recall  # noqa: E402


def memory_read_weights(model, body, T, position):
    """Run the episode `body` (tokens, a multiple of T long) segment by segment through a linear-update Infini
    model; for the query at `position` (in the last segment) return, per layer n, the normalised weights
    w (H, S) = σ(q)·σ(k_j) / Σ_j σ(q)·σ(k_j) over the S tokens in memory, their values v (H, S, D), and the memory
    (M, z) the layer read: Σ_j w_j v_j is the layer's A_mem for that query (Eqs. 7-8)."""
    import model_infini as mi
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
                    if start + T >= len(body):                    # the last segment: the query at `position`
                        keys = torch.cat([kv[0] for kv in past[n]], dim=2)[0]         # (H, S, D)
                        values = torch.cat([kv[1] for kv in past[n]], dim=2)[0]       # (H, S, D)
                        w = (mi.sigma(q[0, :, position - start])[:, None, :] * mi.sigma(keys)).sum(-1)   # (H, S)
                        out[n] = (w / w.sum(-1, keepdim=True), values, memory.M[n], memory.z[n])
                    past[n].append((k, v))
                memory = next_memory
    finally:
        for hk in hooks:
            hk.remove()
    return out


def key_share(model, depth, n_episodes=32, seed=0):
    """Mean share of the ASK query's memory read on the key's 5 digits, per layer (H,), and the uniform share."""
    rng = np.random.default_rng(seed)
    T, shares = model.config.seg_len, {}
    for _ in range(n_episodes):
        body, _ = recall.passkey_eval_episode(rng, depth, T)
        key = int(np.flatnonzero(body == recall.KEY)[0])
        for n, (w, _, _, _) in memory_read_weights(model, body, T, len(body) - 6).items():   # the ASK token
            shares.setdefault(n, []).append(w[:, key + 1:key + 6].sum(-1))
            uniform = 5 / w.size(-1)
    return {n: torch.stack(s).mean(0) for n, s in shares.items()}, uniform


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv

    def go(argv):
        if not argv or argv[0].startswith('--'):
            raise common.train.UserError("usage: python bench/diagnose.py OUT_DIR [--depths=96,384]")
        out_dir = Path(argv[0])
        depths = [int(d) for a in argv[1:] if a.startswith('--depths=') for d in a.split('=', 1)[1].split(',')]
        ckpt = common.train.load_checkpoint(out_dir / 'ckpt.pt', 'cpu')
        _, _, model = common.train.model_from_checkpoint(ckpt, out_dir)
        model.eval()
        if type(model).__module__ != 'model_infini' or model.config.memory_update != 'linear':
            raise common.train.UserError("only Infini-attention with memory_update=linear is decomposed here")
        for depth in depths or [96]:
            shares, uniform = key_share(model, depth, seed=depth)
            for n, share in shares.items():
                gates = ', '.join(f'{g:.2f}' for g in model.layers[n].attn.gate())
                print(f"depth {depth} layer {n}: gate σ(β) {gates} | weight on the key digits "
                      f"{', '.join(f'{v:.3f}' for v in share)} (uniform {uniform:.3f})")
    common.train.run_cli(go, argv)


if __name__ == '__main__':
    main()
