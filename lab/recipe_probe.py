"""
What a GPT-2 form's memory does after the recipe's fine-tuning (bench/demos.py --suite=gpt2), read from its weights
and one pass over validation segments:
- Infini-attention (infini_gpt2): each head's gate sigmoid(β) (Eq. 6), 0 = GPT-2's own attention, 1 = the memory's
  read alone; per layer the mean, min and max over heads.
- ∞-former (infformer_gpt2): how loud the LTM's read is, RMS(Z_LTM) / RMS(Z_T) per layer (Eq. 12: Z = Z_T + Z_LTM),
  over the validation segments whose row has an LTM to read.
- Compressive (compressive_gpt2): nothing read from its weights here; its validation loss with the memory emptied is
  in bench/results/demos_gpt2.json (demos_code_gpt2.json for the recipe on code).

    python lab/recipe_probe.py --runs=out-demos-gpt2/infini_linear/seed1,out-demos-gpt2/infformer/seed1 \
        --out=lab/results/recipe_probe.json
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402
from data.loader import load_split  # noqa: E402


@dataclasses.dataclass
class ProbeConfig:
    runs: str = ''               # out_dirs (or checkpoint paths), comma-separated
    segments: int = 64           # validation segments a row reads (infformer_gpt2), the memory carried
    batch_size: int = 8          # rows
    out: str = ''                # also write the report here as JSON ('' = print it only)


def gates(model):
    """[(mean, min, max) of sigmoid(β) over heads] per layer."""
    out = []
    for block in model.transformer.h:
        g = torch.sigmoid(block.attn.beta.detach().float())
        out.append((g.mean().item(), g.min().item(), g.max().item()))
    return out


@torch.no_grad()
def ltm_loudness(model, tokens, seg_len, segments, batch_size):
    """[RMS(Z_LTM) / RMS(Z_T)] per layer, over the segments after the first (a row's LTM is empty before)."""
    sums = [[0.0, 0.0] for _ in model.transformer.h]
    hooks = []
    for n, block in enumerate(model.transformer.h):
        def grab_ltm(module, args, output, n=n):
            sums[n][0] += output[0].float().pow(2).mean().item()
        def grab_attn(module, args, output, n=n):
            sums[n][1] += output.float().pow(2).mean().item()
        hooks += [block.attn.ltm.register_forward_hook(grab_ltm), block.attn.c_proj.register_forward_hook(grab_attn)]
    stream = len(tokens) // batch_size
    rows = torch.stack([torch.from_numpy(tokens[r * stream:(r + 1) * stream].astype('int64'))
                        for r in range(batch_size)])
    memory = model.init_memory(batch_size, 'cpu')
    for s in range(min(segments, stream // seg_len)):
        if s == 1:                                        # from here every row has written its LTM once
            sums = [[0.0, 0.0] for _ in model.transformer.h]
        _, _, memory, _ = model(rows[:, s * seg_len:(s + 1) * seg_len], memory)
    for h in hooks:
        h.remove()
    return [(a / b) ** 0.5 if b else None for a, b in sums]


def main(argv=None):
    def go(argv):
        import common
        cfg = common.parse(argv, ProbeConfig)
        report = {}
        for run in [r for r in cfg.runs.split(',') if r]:
            path = Path(run) / 'ckpt.pt' if Path(run).is_dir() else Path(run)
            ckpt = train.load_checkpoint(path)
            _, config, model = train.model_from_checkpoint(ckpt)
            model.eval()
            name = ckpt['model_name']
            if name == 'infini_gpt2':
                report[run] = {'model': name, 'gate_mean_min_max': gates(model)}
            elif name == 'infformer_gpt2':
                data_dir = ckpt['train_config'].get('data_dir') or f"data/{ckpt['train_config']['dataset']}"
                tokens = load_split(train.REPO / data_dir, 'validation')
                report[run] = {'model': name, 'ltm_rms_over_attention_rms':
                               ltm_loudness(model, tokens, config.seg_len, cfg.segments, cfg.batch_size)}
            else:
                report[run] = {'model': name}
            print(run, json.dumps(report[run]), flush=True)
        if cfg.out:
            common.write_json(cfg.out, {'runs': report}, 'lab/recipe_probe.py', argv)
        return report
    sys.path.insert(0, str(train.REPO / 'bench'))
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
