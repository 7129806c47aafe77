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


def infini_key_share(model, body, key_pos, T):
    """Run the episode segment by segment; at the ASK position (the answer's first query) return, per layer and
    head, the normalised linear-attention weight on the key's digit tokens among all tokens in memory."""
    import model_infini as mi
    inputs = {}
    hooks = [layer.attn.register_forward_hook(lambda m, a, o, n=n: inputs.__setitem__(n, a[0]))
             for n, layer in enumerate(model.layers)]
    x = torch.as_tensor(body[None])
    memory, keys = model.init_memory(1, 'cpu'), {n: [] for n in range(len(model.layers))}
    ask = len(body) - 6                                           # the ASK token (its query predicts digit 1)
    with torch.no_grad():
        for start in range(0, len(body), T):
            _, _, next_memory, _ = model(x[:, start:start + T], memory)
            for n, layer in enumerate(model.layers):
                attn = layer.attn
                h = inputs[n]
                h = attn.layer_norm(h) if attn.pre_lnorm else h
                q, k, _ = attn.qkv_net(h).view(1, h.size(1), 3, attn.n_head, attn.d_head).permute(2, 0, 3, 1, 4)
                if start + T >= len(body):                        # the last segment: the ASK query
                    past = torch.cat(keys[n], dim=2)              # (1, H, S, D) keys written to memory
                    w = (mi.sigma(q[:, :, ask - start])[:, :, None, :] * mi.sigma(past)).sum(-1)   # (1, H, S)
                    w = w / w.sum(-1, keepdim=True)
                    share = w[0, :, key_pos + 1:key_pos + 6].sum(-1)
                    yield n, attn.gate(), share, 5 / past.size(2)
                keys[n].append(k)
            memory = next_memory
    for hk in hooks:
        hk.remove()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0])
    depths = [int(d) for a in argv[1:] if a.startswith('--depths=') for d in a.split('=', 1)[1].split(',')] or [96]
    ckpt = common.train.load_checkpoint(out_dir / 'ckpt.pt', 'cpu')
    _, _, model = common.train.model_from_checkpoint(ckpt, out_dir)
    model.eval()
    c = model.config
    if type(model).__module__ != 'model_infini' or c.memory_update != 'linear':
        raise SystemExit("error: only Infini-attention with memory_update=linear is decomposed here")
    for depth in depths:
        rng = np.random.default_rng(depth)
        shares = {}
        for _ in range(32):
            body, _ = recall.passkey_eval_episode(rng, depth, c.seg_len)
            key_pos = int(np.flatnonzero(body == recall.KEY)[0])
            for n, gate, share, uniform in infini_key_share(model, body, key_pos, c.seg_len):
                shares.setdefault(n, []).append(share)
        for n, s in shares.items():
            s = torch.stack(s).mean(0)
            print(f"depth {depth} layer {n}: gate σ(β) {', '.join(f'{g:.2f}' for g in model.layers[n].attn.gate())}"
                  f" | weight on the key digits {', '.join(f'{v:.3f}' for v in s)} (uniform {uniform:.3f})")


if __name__ == '__main__':
    main()
