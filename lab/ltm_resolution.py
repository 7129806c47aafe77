"""
How much of one token the ∞-former's long-term memory still holds k segments after writing it, from the
LTM's write alone: no training, no model weights. model_infformer.py's own regression (Eq. 5 on N Gaussian RBFs,
ridge_matrix) and unbounded update (Eqs. 13-15: at every write the old signal is read at M points and squeezed into
[0, τ], the L new vectors go into ]τ, 1]) are run on random vectors; the CNN gate is the identity. What a trained
model's read-out can fetch is at most what is measured here, so a depth where this is low is resolution-limited
whatever the training.

    python lab/ltm_resolution.py                                   # every setting, N sweep
    python lab/ltm_resolution.py --n_basis=64,256 --depths=8 --setting=recall

Per depth k (writes since the token's own; k = 0 is the segment just written), over the L tokens of that segment:
- rbf_per_token: the width the token holds in [0, 1], (1 - τ) τ^k / L, over the spacing of the RBF centres;
- recon_cos: the cosine between the token's vector x and the signal at its position, x̂(t) = Bᵀψ(t);
- read_cos@F: the same for the sharpest Gaussian read the model allows (Eq. 11 at μ = t, σ² = F, the floor
  sigma_sq_min: 1e-4 in the authors' LM code, 1e-6 in their sorting code);
- identified@F: the fraction of tokens whose sharpest read is closer (dot product) to their own vector than to any
  other vector ever written: how often a perfect μ could fetch the token itself rather than a blur of neighbours.
Chance for identified is 1 / (tokens written). Vectors are standard normal in d = --dim dimensions; --trials
averages over independent draws. The LTM's first write spreads its L vectors over all of [0, 1]; it is written
before the measured ones and not reported, so every depth k is a write into ]τ, 1] squeezed k times.
"""

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))   # bench/common.py and the benchmarks
import common  # noqa: E402
import model_infformer as mif  # noqa: E402  (common puts the repository on sys.path)
import train  # noqa: E402

LAB_RESULTS = Path(__file__).resolve().parent / 'results'     # the lab's results, beside its LOG

# the recall benchmark's LTM (bench/recall.py: RECALL_MEMORY n_basis 64 with the synthetic-task settings) and the LM
# demo's (config/infformer_demo.py); seg_len is the LTM's L (vectors per write), n_samples its M
SETTINGS = {
    'recall': dict(seg_len=64, n_samples=64, basis_widths='0.01,0.05', tau=0.75, ridge_lambda=1.0),
    'demo': dict(seg_len=64, n_samples=150, basis_widths='0.005,0.01', tau=0.5, ridge_lambda=0.5),
    # the recall setting with RBFs narrower than a token four writes back (0.0039 * 0.75^4 = 0.0012): a candidate fix
    'sharp': dict(seg_len=64, n_samples=64, basis_widths='0.002,0.004', tau=0.75, ridge_lambda=1.0),
}


@dataclasses.dataclass
class ResolutionConfig:
    setting: str = 'recall,demo,sharp'   # comma-separated names of SETTINGS
    n_basis: str = '64,150,256,512,1024'  # N values (each a multiple of the number of widths)
    samples_equal_basis: bool = True  # M = N (as the recall benchmark and the authors' code); False: the setting's
    tau: str = ''                    # comma-separated τ values to sweep in place of the setting's ('' = its own)
    depths: int = 8                  # k = 0 .. depths
    floors: str = '1e-4,1e-6'        # σ² floors of the sharpest read (Config.sigma_sq_min)
    dim: int = 64                    # dimension of the random vectors
    trials: int = 4
    out: str = str(LAB_RESULTS / 'ltm_resolution.json')

    def __post_init__(self):
        for name in ('depths', 'dim', 'trials'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for s in self.setting.split(','):
            if s not in SETTINGS:
                raise ValueError(f"setting must be one of {', '.join(SETTINGS)}, got {s!r}")


def write_signal(config, segments):
    """The LTM after writing `segments` (list of (L, d) float64 tensors) one per step, oldest first, as the model
    does with the gate off. -> (B (N, d), positions: per segment its tokens' positions in [0, 1] after the last
    write)"""
    mu, sigma = mif.gaussian_basis(config.n_basis, config.widths)
    t_first, t_unbounded = mif.ridge_positions(config)
    G_first = mif.ridge_matrix(t_first, mu, sigma, config.ridge_lambda)
    G_unbounded = mif.ridge_matrix(t_unbounded, mu, sigma, config.ridge_lambda)
    psi_linear = mif.evaluate_basis(torch.arange(1, config.n_samples + 1, dtype=torch.float64) / config.n_samples,
                                    mu, sigma)                                       # (M, N)
    B = G_first.T @ segments[0]                                                      # Eq. 5
    positions = [t_first]
    for x in segments[1:]:
        B = G_unbounded.T @ torch.cat([psi_linear @ B, x])                            # Eqs. 13-15, 5
        positions = [p * config.tau for p in positions] + [t_unbounded[config.n_samples:]]
    return B, positions, (mu, sigma)


def measure(config, depths, dim, trials, floors, seed=0):
    g = torch.Generator().manual_seed(seed)
    L, spacing = config.seg_len, 1.0 / (config.n_basis // len(config.widths) - 1)
    rows = {k: {'recon_cos': 0.0, **{f'{m}@{f:g}': 0.0 for f in floors for m in ('read_cos', 'identified')}}
            for k in range(depths + 1)}
    for _ in range(trials):
        segments = [torch.randn(L, dim, generator=g, dtype=torch.float64) for _ in range(depths + 2)]
        B, positions, (mu, sigma) = write_signal(config, segments)
        everything = torch.cat(segments)                                             # (S L, d)
        for k in range(depths + 1):
            x, t, own = segments[-1 - k], positions[-1 - k], len(segments) - 1 - k
            recon = mif.evaluate_basis(t, mu, sigma) @ B                             # x̂(t) = Bᵀψ(t)
            rows[k]['recon_cos'] += torch.cosine_similarity(recon, x, dim=-1).mean().item() / trials
            for f in floors:
                read = mif.expected_basis(t, torch.full_like(t, f), mu, sigma) @ B  # Eq. 11 at μ = t, σ² = f
                best = (read @ everything.T).argmax(-1)                              # (L,)
                rows[k][f'read_cos@{f:g}'] += torch.cosine_similarity(read, x, dim=-1).mean().item() / trials
                rows[k][f'identified@{f:g}'] += (best == own * L + torch.arange(L)).double().mean().item() / trials
    for k, row in rows.items():
        row['rbf_per_token'] = (1 - config.tau) * config.tau ** k / L / spacing
        row['token_width'] = (1 - config.tau) * config.tau ** k / L
        row['chance'] = 1 / ((depths + 2) * L)
    return rows


def main(argv=None):
    def go(argv):
        cfg = common.parse(argv, ResolutionConfig)
        results = {}
        try:
            floors = [float(f) for f in cfg.floors.split(',') if f]
        except ValueError:
            raise train.UserError(f"--floors takes comma-separated numbers, got {cfg.floors!r}") from None
        try:
            taus = [float(t) for t in cfg.tau.split(',') if t]
        except ValueError:
            raise train.UserError(f"--tau takes comma-separated numbers, got {cfg.tau!r}") from None
        for setting in cfg.setting.split(','):
            for n, tau in [(n, t) for n in common.int_list(cfg.n_basis, 'n_basis') for t in taus or [None]]:
                fields = dict(SETTINGS[setting], n_basis=n, **({} if tau is None else {'tau': tau}))
                if cfg.samples_equal_basis:
                    fields['n_samples'] = n
                try:
                    config = mif.Config(vocab_size=2, **fields)
                except ValueError as e:
                    raise train.UserError(str(e)) from None
                rows = measure(config, cfg.depths, cfg.dim, cfg.trials, floors)
                results[f'{setting}/N{n}' + ('' if tau is None else f'/tau{tau:g}')] = dict(fields=fields, depths=rows)
                print(f"\n{setting}, N = {n}, M = {fields['n_samples']}, τ = {fields['tau']}, "
                      f"widths {fields['basis_widths']}, L = {fields['seg_len']}")
                cols = [c for c in rows[0] if '@' in c]
                print("   k  token width  RBFs/token  recon_cos  " + '  '.join(cols))
                for k, r in rows.items():
                    print(f"  {k:2d}  {r['token_width']:11.5f}  {r['rbf_per_token']:10.3f}  {r['recon_cos']:9.3f}  "
                          + '  '.join(f"{r[c]:{len(c)}.3f}" for c in cols))
        common.write_json(cfg.out, {'results': results},
                          'lab/ltm_resolution.py', argv)
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
