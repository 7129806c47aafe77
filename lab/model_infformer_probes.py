"""
Four probes of the ∞-former's read, outside the paper: model_infformer.py with four flags, `--model=infformer_probes`
(train.py, sample.py; bench/recall.py with --overrides=model=infformer_probes,...). Each probe overrides one small
method of model_infformer.py's LongTermAttention (density, attend, keys_values) or sets one bias at init; with
every flag at its default this is model_infformer.py, the same weights and outputs. The recall runs that use them
are in lab/LOG.md.

  - sigma_sq_init: every density starts this narrow (Eq. 10's bias = softplus⁻¹ of it); the paper and the
    authors start at bias 0, σ² = softplus(0) ≈ 0.69 of the unit interval.
  - mu_readout='pointer': μ is the basis centres averaged under softmax(scores) instead of Eq. 9's
    sigmoid(affine(scores)): a μ that can point at one token.
  - sigma_sq_anneal='CAP0,CAP1,S0,S1': σ² is capped on a schedule that narrows from wide to sharp over training:
    does a read that starts wide find a token once it narrows? Its count of training segments is a buffer that a
    training forward moves (in the state dict, so resume goes on): that forward is not a function of (tokens, memory).
  - ltm_read='discrete': softmax attention over the signal X̄(m/M) at the M = n_samples points instead of the
    Gaussian read (Eqs. 9-11): every point gets a gradient; it tells the read's limits from the write's.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import model_infformer as paper
from model_infformer import evaluate_basis, gaussian_basis


@dataclass
class Config(paper.Config):
    sigma_sq_init: float = 0.0       # > 0: every density starts this narrow (Eq. 10's bias = softplus⁻¹ of it);
                                     # 0: bias 0, σ² = softplus(0) ≈ 0.69 of the unit interval, as the authors
    mu_readout: str = 'affine'       # μ of Eq. 9: 'affine' = sigmoid(affine(scores)), the paper's; 'pointer' =
                                     # Σ_j softmax(scores)_j μ_j, the basis centres weighted by the query's match
                                     # with their keys (a μ that can point)
    sigma_sq_anneal: str = ''        # 'CAP0,CAP1,S0,S1': σ² ≤ a cap that is CAP0 until the S0-th training segment,
                                     # then falls geometrically to CAP1 at S1 and stays (wide densities first, so
                                     # that μ feels the key, narrow ones last)
    ltm_read: str = 'continuous'     # 'continuous': the paper's Gaussian density (Eqs. 9-11); 'discrete': softmax
                                     # attention over the signal X̄(m/M) at the M = n_samples points, keys and
                                     # values X̄ W^K, X̄ W^V (no density, one score per point, so every point gets a
                                     # gradient)

    def __post_init__(self):
        super().__post_init__()
        if not self.sigma_sq_init >= 0:
            raise ValueError(f"sigma_sq_init must be >= 0, got {self.sigma_sq_init}")
        if self.mu_readout not in ('affine', 'pointer'):
            raise ValueError(f"mu_readout must be 'affine' or 'pointer', got {self.mu_readout!r}")
        if self.ltm_read not in ('continuous', 'discrete'):
            raise ValueError(f"ltm_read must be 'continuous' or 'discrete', got {self.ltm_read!r}")
        if self.ltm_read == 'discrete' and (self.sticky or self.sigma_sq_init or self.mu_readout != 'affine'
                                            or self.sigma_sq_anneal):
            raise ValueError("ltm_read='discrete' has no Gaussian density: it takes no sticky, sigma_sq_init, "
                             "mu_readout or sigma_sq_anneal")
        self.anneal = ()                                   # sigma_sq_anneal as (CAP0, CAP1, S0, S1)
        if self.sigma_sq_anneal:
            try:
                cap0, cap1, s0, s1 = (float(v) for v in self.sigma_sq_anneal.split(','))
            except ValueError:                             # not four numbers
                cap0 = cap1 = s0 = s1 = float('nan')
            if not (cap0 >= cap1 >= self.sigma_sq_min and 0 <= s0 < s1):
                raise ValueError(f"sigma_sq_anneal is 'CAP0,CAP1,S0,S1' with CAP0 >= CAP1 >= sigma_sq_min and "
                                 f"0 <= S0 < S1, got {self.sigma_sq_anneal!r}")
            self.anneal = (cap0, cap1, s0, s1)


class LongTermAttention(paper.LongTermAttention):
    """model_infformer.py's LTM read with the probes: mu_readout and sigma_sq_anneal change density(), ltm_read=
    'discrete' changes keys_values() and attend(). affines() leaves out the maps a probe does not use, in the paper's
    order, so a seed gives the weights the probes' recorded runs started from (with no probe on: the paper's)."""

    def __init__(self, config):
        super().__init__(config)
        self.ltm_read = config.ltm_read
        self.anneal = config.anneal
        if self.anneal:                                    # sigma_sq_anneal: the training segments seen so far
            self.register_buffer('segments_trained', torch.zeros((), dtype=torch.long))
        if config.ltm_read == 'discrete':                  # the M points m/M and ψ there (float64, then float32)
            basis_mu, basis_sigma = gaussian_basis(config.n_basis, config.widths)
            points = torch.arange(1, config.n_samples + 1, dtype=torch.float64) / config.n_samples
            self.register_buffer('points', points.float(), persistent=False)                         # (M,)
            self.register_buffer('psi_points', evaluate_basis(points, basis_mu, basis_sigma).float(),
                                 persistent=False)                                                     # (M, N)

    def affines(self, config):
        """The paper's two maps (called by its __init__); 'pointer' has no μ map, 'discrete' neither."""
        if config.ltm_read == 'discrete':
            return None, None
        if config.mu_readout == 'pointer':                 # made alone: the paper's μ map would draw random numbers
            return None, nn.Linear(config.n_basis, 1)
        return super().affines(config)

    def sigma_sq_cap(self):
        """sigma_sq_anneal's cap on σ² after s training segments: CAP0 up to S0, CAP0 (CAP1/CAP0)^((s - S0)/(S1 - S0))
        between, CAP1 from S1 on."""
        cap0, cap1, s0, s1 = self.anneal
        return cap0 * (cap1 / cap0) ** ((self.segments_trained - s0) / (s1 - s0)).clamp(0.0, 1.0)

    def density(self, scores, read):
        """Eqs. 9-10, or with mu_readout='pointer' μ = Σ_j softmax(scores)_j μ_j (in float32 at least); then with
        sigma_sq_anneal σ² = min(σ², cap). A training forward with sigma_sq_anneal counts one segment in the buffer
        segments_trained (eval and generate do not): that forward is not a pure function of (tokens, memory), it
        moves the schedule, which lives in the state dict (a resumed run goes on from its count)."""
        if self.mu_affine is not None:
            mu, sigma_sq = super().density(scores, read)
        else:
            f32 = torch.promote_types(scores.dtype, torch.float32)
            mu = (torch.softmax(scores.to(f32), dim=-1) * read.basis_mu.to(f32)).sum(-1)
            sigma_in = self.sigma_affine(scores).squeeze(-1).to(f32)
            sigma_sq = F.softplus(sigma_in).clamp(min=self.sigma_sq_min)
        if self.anneal:
            sigma_sq = torch.minimum(sigma_sq, self.sigma_sq_cap())
            if self.training:                              # a training forward reads one segment
                self.segments_trained.add_(1)
        return mu, sigma_sq

    def keys_values(self, ltm_B):
        """ltm_read='discrete': the keys and values of the signal X̄(m/M) = Bᵀψ(m/M) at the M points, (B, M, C) ->
        each (B, H, M, D); otherwise Eq. 8's of ltm_B."""
        if self.ltm_read == 'discrete':
            ltm_B = self.psi_points.to(ltm_B.dtype) @ ltm_B                            # (B, M, C)
        return super().keys_values(ltm_B)

    def attend(self, q, read):
        """ltm_read='discrete': softmax over the M points (no density); the mean and variance of the points under
        it stand for (μ, σ²) (the KL and the aux read them). Otherwise the paper's Gaussian read."""
        if self.ltm_read != 'discrete':
            return super().attend(q, read)
        scores = torch.einsum('bhid,bhmd->bhim', q, read.keys) * self.scale        # (B, H, T, M)
        p = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)
        z = torch.einsum('bhim,bhmd->bhid', p.to(read.values.dtype), read.values)
        mu = (p * self.points).sum(-1)
        sigma_sq = (p * (self.points - mu[..., None]) ** 2).sum(-1).clamp(min=self.sigma_sq_min)
        return z, mu, sigma_sq

    def flops_per_token(self, config):
        """The paper's count, with one affine for the pointer (its μ is no matrix product); 'discrete': q·keys and
        p-weighted values over M points, W^O, and per segment Bᵀψ(m/M) (its backward only with the gate) and the
        keys and values of the M points."""
        c = config
        HD, N, M, C = c.n_head * c.d_head, c.n_basis, c.n_samples, c.n_embd
        if c.ltm_read == 'discrete':
            read = 6 * (2 * HD * M + HD * C)
            per_segment = (4 if c.cnn_gate else 2) * M * N * C + (6 if c.cnn_gate else 4) * M * C * 2 * HD
            return read + per_segment / c.seg_len
        pointer = 6 * c.n_head * N if c.mu_readout == 'pointer' else 0
        return super().flops_per_token(config) - pointer


class Model(paper.Model):
    """model_infformer.py's Model with the probes' LTM read; sigma_sq_init sets every σ² map's bias."""
    long_term_attention = LongTermAttention

    def __init__(self, config: Config):
        super().__init__(config)
        if config.sigma_sq_init > 0:                              # Eq. 10: softplus(bias) = sigma_sq_init
            for layer in self.layers:
                nn.init.constant_(layer.attn.ltm.sigma_affine.bias, math.log(math.expm1(config.sigma_sq_init)))
