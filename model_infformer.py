"""
∞-former (Martins, Marinho and Martins, 2022, "∞-former: Infinite Memory Transformer", ACL, arXiv 2109.00301): a
Transformer-XL (short-term memory, STM: each layer's last `mem_len` hidden states) whose attention also reads a
continuous long-term memory (LTM) of fixed size, however long the text.
  §3.1 A layer's LTM is a signal X̄(t) = Bᵀψ(t), t ∈ [0, 1] (Eq. 7), ψ N Gaussian RBFs, B (N × e, `ltm_B`) fitted to
       the stored vectors by ridge regression (Eq. 5: Bᵀ = XᵀG). Each head reads it with a density N(t; μ, σ²), μ
       (Eq. 9) and σ² (Eq. 10) affine in its query's scores against the keys B W^K (Eq. 8), in closed form:
       E_p[V̄(t)] = (B W^V)ᵀ E_p[ψ(t)] (Eq. 11). W^O makes Z_LTM, added before the residual: Z = Z_T + Z_LTM (Eq. 12).
  §3.2 Unbounded memory: vectors that leave the STM enter the LTM; the old signal, read at M = `n_samples` points, is
       squeezed into [0, τ] (Eqs. 13-14), the new vectors go into ]τ, 1] (Eq. 15), one regression refits B (Eq. 5).
  §3.3 Sticky memories (`sticky=True`): the M points are drawn from a histogram of the attention the previous step
       paid to each bin of [0, 1] (Eqs. 16-17), so the regions that were read keep more room.
  §3.4 A width-3 convolution gates the new vectors (Eq. 18); a KL term pulls every σ² toward σ₀² (Eqs. 20-21).
Equations: arXiv v3's display equations, numbered; "the authors' code": github.com/deep-spin/infinite-former. Naive
references: tests/test_infformer.py; the lab's ablations: lab/model_infformer_probes.py.

Deviations (also in the README):
  - GPT-2 BPE tokens with a full tied softmax, as model_xl.py; the STM is model_xl.py's relative attention.
  - The μ/σ² maps have a bias (the paper's "affine"; the authors' have none): LongTermAttention.affines.
  - The KL pulls σ² alone (the paper's μ₀ = μ; the authors' LM configs also pull μ toward -1): LongTermMemory.kl.
  - Sticky points are uniform in their bin (the authors': its left edge), from a hash of a state in Memory (rng_seed).
  - Fixed shapes: vectors that leave the STM wait in Memory.mem and enter the LTM seg_len at a time (one G).

Letters: B batch, T tokens of this call, C n_embd (the paper's e), H heads, D d_head, N n_basis, L seg_len, M
n_samples, S slots of Memory.mem, K keys of the STM attention; the paper's B is `ltm_B`, its D bins `sticky_bins`.
"""

import importlib.util
import math
from dataclasses import dataclass, is_dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    # Defaults: our own WikiText-103 setting, trained from scratch (Transformer-XL base, STM 150, N = 150). The
    # paper trains no LM from scratch: its §4.1 sorting models are XL-based, its §4.2 LMs fine-tune GPT-2
    # (model_infformer_gpt2.py).
    vocab_size: int = 50304   # GPT-2's 50257 padded to a multiple of 64
    n_layer: int = 16
    n_head: int = 10
    n_embd: int = 410         # d_model (the e of the paper's B ∈ R^{N×e})
    d_head: int = 41          # per-head width, of the STM and the LTM attention
    d_inner: int = 2100       # position-wise feed-forward width
    dropout: float = 0.1      # on embeddings, attention output, feed-forward, final hidden states
    dropatt: float = 0.0      # on the STM attention's probabilities
    seg_len: int = 150        # tokens per segment (L); also how many vectors can leave the STM per step
    mem_len: int = 150        # short-term memory (STM) positions per layer
    clamp_len: int = 0        # relative distances above this share one embedding; 0 = no clamp
    pre_lnorm: bool = False   # False: post-LN as Transformer-XL; True: pre-LN (+ final LayerNorm)
    untie_r: bool = True      # True: u, v (r_w_bias, r_r_bias) per layer; False: one pair shared
    init_std: float = 0.02    # normal init of weights, as the authors' code
    attn_kernel: str = 'sdpa'  # the STM's attention, as model_xl.py's: sdpa, einsum (written out) or triton
    ltm: bool = True                 # False: no LTM term (the STM-only comparison; keeps the weights)
    n_basis: int = 150               # N Gaussian RBFs: centres evenly over [0, 1] crossed with the widths
    basis_widths: str = '0.005,0.01'  # σ_j of the RBFs: {0.005, 0.01} for LM, {0.01, 0.05} for sorting
    ridge_lambda: float = 0.5        # λ of the ridge regression (Eq. 5); the authors use 0.5 (LM) and 1 (sorting)
    unbounded: bool = True           # §3.2: keep the old signal (False: each write replaces B, §3.1 alone)
    tau: float = 0.5                 # τ: the old signal is squeezed into [0, τ] (0.5 LM, 0.75 sorting)
    n_samples: int = 150             # M points of the old signal (Eq. 14); the authors fix 512 (= their LM's N and L)
    sticky: bool = False             # §3.3 sticky memories: sample the M points from the last attention
    sticky_bins: int = 128           # bins of the attention histogram (the paper's D, Eq. 16)
    cnn_gate: bool = True            # §3.4, Eq. 18: X̃ = sigmoid(Conv1d_k3(X)) ⊙ X before the regression
    kl_weight: float = 1e-6          # λ_KL of Eq. 21 (1e-6 in the authors' runs); 0 = off
    sigma_0: float = 0.05            # σ₀ of the KL prior N(μ, σ₀²)
    sigma_sq_min: float = 1e-4       # floor of σ² (Eq. 10): 1e-4 the authors' LM code, 1e-6 their sorting code
    ltm_reset_len: int = 0           # > 0: an LTM this full is emptied before it writes (the authors' mem_threshold)

    def __post_init__(self):
        lowest = dict.fromkeys(('vocab_size', 'n_layer', 'n_head', 'n_embd', 'd_head', 'd_inner', 'seg_len',
                                'n_samples', 'sticky_bins'), 1)
        for name, low in {**lowest, 'mem_len': 0, 'clamp_len': 0, 'ltm_reset_len': 0, 'kl_weight': 0}.items():
            if not getattr(self, name) >= low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        for name in ('dropout', 'dropatt'):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.n_embd % 2:
            raise ValueError(f"n_embd must be even (sinusoid positions), got {self.n_embd}")
        check_attn_kernel(self, ('sdpa', 'einsum', 'triton'))
        try:
            self.widths = tuple(float(w) for w in self.basis_widths.split(','))
        except ValueError:
            self.widths = (0.0,)
        if not all(w > 0 for w in self.widths):
            raise ValueError(f"basis_widths must be floats > 0 like '0.005,0.01', got {self.basis_widths!r}")
        if self.n_basis % len(self.widths) or self.n_basis < 2 * len(self.widths):
            raise ValueError(f"n_basis must be a multiple of the number of basis_widths ({len(self.widths)}) and "
                             f"give at least 2 centres, got {self.n_basis}")
        if not 0.0 < self.tau < 1.0:
            raise ValueError(f"tau must be in (0, 1), got {self.tau}")
        for name in ('ridge_lambda', 'sigma_0', 'sigma_sq_min'):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


# Copied from model_xl.py (check_attn_kernel)
def check_attn_kernel(config, kernels):
    """The Config check of attn_kernel against the kernels this model's attention can run on."""
    if config.attn_kernel not in kernels:
        raise ValueError(f"attn_kernel must be one of {', '.join(kernels)}, got {config.attn_kernel!r}")
    if config.attn_kernel == 'triton' and config.dropatt > 0:
        raise ValueError(f"attn_kernel='triton' has no attention dropout: set dropatt=0 (got {config.dropatt}) "
                         f"or another attn_kernel")
    if config.attn_kernel == 'triton' and importlib.util.find_spec('triton') is None:
        raise ValueError("attn_kernel='triton' needs the triton package (CUDA builds of torch ship it)")


@dataclass
class Memory:
    """Fixed-shape state. S = (2 seg_len - 1) + mem_len slots per layer: the last mem_len are the STM, the newest
    ltm_pending before them wait for the LTM (a row with ltm_pending >= seg_len writes its oldest seg_len)."""
    mem: torch.Tensor          # (n_layer, B, S, n_embd) each layer's input hidden states, oldest first
    length: torch.Tensor       # (B,) int64, how many of the S slots (the most recent ones) are valid
    ltm_pending: torch.Tensor  # (B,) int64, how many vectors that left the STM wait for the LTM
    ltm_B: torch.Tensor        # (n_layer, B, n_basis, n_embd) the coefficient matrix of the LTM signal (Eq. 5)
    ltm_written: torch.Tensor  # (B,) int64, vectors written to the LTM since it was last empty (0: term masked)
    ltm_hist: torch.Tensor     # (n_layer, B, sticky_bins) last step's attention histogram over [0, 1] (Eq. 16)
    ltm_rng: torch.Tensor      # (B,) int64, the state of the sticky memories' random numbers


# --- §3.1 The continuous signal: Gaussian basis functions, the ridge regression (Eq. 5), E_p[ψ] (Eq. 11) -----


def gaussian_basis(n_basis, widths):
    """Centres μ_j evenly over [0, 1] crossed with the widths σ_j (as the authors' meshgrid). -> (N,), (N,)"""
    centres = torch.linspace(0.0, 1.0, n_basis // len(widths), dtype=torch.float64)
    mu, sigma = torch.meshgrid(centres, torch.tensor(widths, dtype=torch.float64), indexing='ij')
    return mu.flatten(), sigma.flatten()


def evaluate_basis(t, basis_mu, basis_sigma):
    """ψ_j(t) = N(t; μ_j, σ_j²) at positions t (...,) -> (..., N)."""
    return torch.exp(-0.5 * ((t[..., None] - basis_mu) / basis_sigma) ** 2) / (basis_sigma * math.sqrt(2 * math.pi))


def expected_basis(mu, sigma_sq, basis_mu, basis_sigma):
    """E_p[ψ(t)] of Eq. 11 in closed form: E_{N(t; μ, σ²)}[ψ_j(t)] = N(μ; μ_j, σ² + σ_j²). (...,), (...,) -> (..., N)"""
    var = sigma_sq[..., None] + basis_sigma ** 2                                       # (..., N)
    return torch.exp(-0.5 * (mu[..., None] - basis_mu) ** 2 / var) / torch.sqrt(2 * math.pi * var)


def ridge_matrix(positions, basis_mu, basis_sigma, ridge_lambda, pad=True):
    """Eq. 5: Bᵀ = Xᵀ Fᵀ(F Fᵀ + λI)⁻¹ = XᵀG, F = [ψ(t_1), ...] (N × n_pos) -> G (n_pos, N), float64. pad: zeros fitted
    out to -0.5 and 1.5 (spacing 1/n_pos; their rows dropped), as the authors: the signal is 0 outside [0, 1]."""
    positions = positions.to(torch.float64)
    n_pos = positions.numel()
    n_pad = n_pos // 2 if pad else 0
    steps = torch.arange(1, n_pad + 1, dtype=torch.float64)
    padded = torch.cat([-(steps.flip(0) - 0.5) / n_pos, positions, 1.0 + (steps - 0.5) / n_pos])  # (n_pos + 2 n_pad,)
    F_ = evaluate_basis(padded, basis_mu, basis_sigma).T                                   # (N, n_pos + 2 n_pad)
    G = F_.T @ torch.linalg.inv(F_ @ F_.T + ridge_lambda * torch.eye(F_.size(0), dtype=torch.float64))   # (.., N)
    return G[n_pad:n_pad + n_pos]


def ridge_positions(config):
    """Eq. 5 positions of a write of L vectors: alone (i + 1/2)/L; unbounded, m τ/M (Eq. 14) then τ + (1 - τ) l/L."""
    L, M, tau = config.seg_len, config.n_samples, config.tau
    first = (torch.arange(L, dtype=torch.float64) + 0.5) / L
    unbounded = torch.cat([torch.arange(1, M + 1, dtype=torch.float64) * tau / M,
                           tau + (1 - tau) * torch.arange(1, L + 1, dtype=torch.float64) / L])
    return first, unbounded


# --- The LTM: each layer's read (§3.1, LongTermAttention, with its CNN gate) and the write of all (§3.2-3.4) ---


class LTMWrite(NamedTuple):
    """Which rows write to their LTM at the start of a step (§3.2) and what they write."""
    rows: torch.Tensor     # (B,) bool, the rows with at least seg_len vectors waiting
    slots: torch.Tensor    # (B, L) Memory.mem slots of each row's oldest L = seg_len waiting vectors
    grow: torch.Tensor     # (B,) bool, the LTM keeps its old signal (it holds something and is not emptied, §3.2)
    written: torch.Tensor  # (B,) int64, Memory.ltm_written after this write


class LTMRead(NamedTuple):
    """What one layer's attention needs to read its LTM during a segment (§3.1)."""
    keys: torch.Tensor         # (B, H, N, D) ltm_B W^K (Eq. 8)
    values: torch.Tensor       # (B, H, N, D) ltm_B W^V (Eq. 8)
    written: torch.Tensor      # (B,) bool, the rows whose LTM holds something (the others' term is masked)
    basis_mu: torch.Tensor     # (N,) the centres μ_j of ψ
    basis_sigma: torch.Tensor  # (N,) the widths σ_j of ψ


class LongTermAttention(nn.Module):
    """One layer's read of its LTM (§3.1), and the CNN gate of its write (§3.4)."""

    def __init__(self, config):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.d_head
        self.n_head, self.d_head = H, D
        self.key_net = nn.Linear(C, H * D, bias=False)     # W^K (Eq. 8)
        self.value_net = nn.Linear(C, H * D, bias=False)   # W^V (Eq. 8)
        self.mu_affine, self.sigma_affine = self.affines(config)   # μ (Eq. 9), σ² (Eq. 10)
        self.o_net = nn.Linear(H * D, C, bias=False)       # W^O (§3.1, after Eq. 11)
        # the gate (the authors' mask_net) keeps PyTorch's default Conv1d init, as theirs (Model._init_weights skips it)
        self.gate = nn.Conv1d(C, C, kernel_size=3, padding=1) if config.cnn_gate else None
        self.scale = 1.0 / math.sqrt(D)
        self.sigma_sq_min = config.sigma_sq_min

    def affines(self, config):
        """μ (Eq. 9) and σ² (Eq. 10) affine in the N scores: with a bias (the authors' Linear(N, 1) have none)."""
        return nn.Linear(config.n_basis, 1), nn.Linear(config.n_basis, 1)

    def gated(self, x):
        """Eq. 18: X̃ = sigmoid(Conv1d(X)) ⊙ X (width 3, zero padding), smoothing X (B, L, C) before the regression."""
        return x if self.gate is None else torch.sigmoid(self.gate(x.transpose(1, 2))).transpose(1, 2) * x

    def keys_values(self, ltm_B):
        """Eq. 8: the keys ltm_B W^K and values ltm_B W^V of ltm_B (B, N, C) -> each (B, H, N, D)."""
        B, N, _ = ltm_B.shape
        k = self.key_net(ltm_B).view(B, N, self.n_head, self.d_head).transpose(1, 2)
        v = self.value_net(ltm_B).view(B, N, self.n_head, self.d_head).transpose(1, 2)
        return k, v

    def density(self, scores, read):
        """Eqs. 9-10 from scores (B, H, T, N), in float32 at least; σ² >= sigma_sq_min. -> μ, σ² each (B, H, T)"""
        f32 = torch.promote_types(scores.dtype, torch.float32)
        mu = torch.sigmoid(self.mu_affine(scores).squeeze(-1).to(f32))                                      # Eq. 9
        return mu, F.softplus(self.sigma_affine(scores).squeeze(-1).to(f32)).clamp(min=self.sigma_sq_min)  # Eq. 10

    def attend(self, q, read):
        """Each head's read z = (B W^V)ᵀ E_p[ψ(t)] (Eq. 11). q: (B, H, T, D) -> z (B, H, T, D), μ, σ² (B, H, T)"""
        scores = torch.einsum('bhid,bhnd->bhin', q, read.keys) * self.scale        # (B, H, T, N)  keys q / √d
        mu, sigma_sq = self.density(scores, read)
        expected_psi = expected_basis(mu, sigma_sq, read.basis_mu, read.basis_sigma)   # (B, H, T, N)  E_p[ψ(t)]
        z = torch.einsum('bhin,bhnd->bhid', expected_psi.to(read.values.dtype), read.values)   # (B, H, T, D) Eq. 11
        return z, mu, sigma_sq

    def forward(self, q, read):
        """q: (B, H, T, D) the layer's own queries; read: LTMRead. Returns Z_LTM (B, T, C) and μ, σ² (B, H, T)."""
        B, H, T, D = q.shape
        z, mu, sigma_sq = self.attend(q, read)
        return self.o_net(z.transpose(1, 2).reshape(B, T, H * D)), mu, sigma_sq   # Z_LTM = [z_1 .. z_H] W^O

    def flops_per_token(self, config):
        """The read's FLOPs per token; per segment the new ltm_B's keys and values (Eq. 8; with the gate, their input's
        gradient too)."""
        c, HD, N = config, config.n_head * config.d_head, config.n_basis
        read = 6 * (2 * HD * N + 2 * c.n_head * N + HD * c.n_embd)              # q·keys, values, μ/σ² affines, W^O
        return read + (6 if c.cnn_gate else 4) * N * c.n_embd * 2 * HD / c.seg_len


# --- §3.3 Sticky memories: the attention histogram, and points drawn from it with counter-based random numbers


def attention_histogram(mu, sigma_sq, n_bins):
    """Eqs. 16-17: the mass N(μ, σ²) (B, H, T) puts in each of n_bins bins of [0, 1], summed. -> (B, n_bins)"""
    edges = torch.linspace(0.0, 1.0, n_bins + 1, device=mu.device, dtype=mu.dtype)
    scale = (2 * sigma_sq).rsqrt()[..., None]
    erf = torch.erf(torch.addcmul(-mu[..., None] * scale, edges, scale))  # (B, H, T, n_bins+1) 2 Φ(edge) - 1
    return 0.5 * (erf[..., 1:] - erf[..., :-1]).sum(dim=(1, 2))                          # (B, n_bins)


RNG_PRIME = 2 ** 31 - 1


def rng_seed(batch_size, device):
    """Per-row states (B,) int64 of the sticky memories' random numbers, from torch.initial_seed() (train.py's --seed
    + rank) and the row: a hash of state in Memory, not a Generator, keeps forward() a function of (tokens, memory)."""
    return (torch.initial_seed() % RNG_PRIME) * 1_000_003 + torch.arange(batch_size, device=device) * 2 ** 20


def counter_uniforms(state, count):
    """count uniforms in [0, 1) per row of state (B,) int64: multiply mod 2^31 - 1 and xor-shift (no int64 overflow)."""
    x = (state[:, None] % RNG_PRIME + 1) * 7919 + torch.arange(1, count + 1, device=state.device) * 104729
    for a in (48271, 69621, 16807):
        x = (x % RNG_PRIME) * a % RNG_PRIME
        x = x ^ (x >> 13)
    return (x % RNG_PRIME).float() / RNG_PRIME


def sample_sticky_points(hist, uniforms):
    """§3.3: sorted points of [0, 1], bin j with probability hist_j / Σ hist (B, n_bins), uniform inside it."""
    B, n_bins = hist.shape
    p = hist / hist.sum(-1, keepdim=True)                                  # (B, n_bins) p(d_j), Eq. 16
    cdf = torch.cat([p.new_zeros(B, 1), p.cumsum(-1)], dim=-1)              # (B, n_bins+1)
    u = uniforms.to(hist.dtype).sort(dim=-1).values * cdf[:, -1:]
    j = torch.searchsorted(cdf[:, 1:].contiguous(), u, right=True).clamp(max=n_bins - 1)   # (B, count) bin index
    within = (u - cdf.gather(1, j)) / p.gather(1, j).clamp(min=1e-12)
    return (j + within.clamp(0.0, 1.0)) / n_bins


class LongTermMemory(nn.Module):
    """Every layer's LTM write: ψ and G (Eq. 5; float64, not saved), the update (§3.2-3.3), Memory's ltm_*, the KL."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        basis_mu, basis_sigma = gaussian_basis(config.n_basis, config.widths)
        t_first, t_unbounded = ridge_positions(config)
        t_linear = torch.arange(1, config.n_samples + 1, dtype=torch.float64) / config.n_samples
        for name, value in (('basis_mu', basis_mu), ('basis_sigma', basis_sigma),
                            ('G_first', ridge_matrix(t_first, basis_mu, basis_sigma, config.ridge_lambda)),   # (L, N)
                            ('G_unbounded', ridge_matrix(t_unbounded, basis_mu, basis_sigma, config.ridge_lambda)),
                            ('psi_linear', evaluate_basis(t_linear, basis_mu, basis_sigma))):         # ψ(m/M) (M, N)
            self.register_buffer(name, value.float(), persistent=False)

    def empty_state(self, batch_size, device, dtype):
        """The ltm_* fields of an empty Memory."""
        c = self.config
        zeros = lambda *shape, dt=dtype: torch.zeros(*shape, device=device, dtype=dt)
        return dict(ltm_pending=zeros(batch_size, dt=torch.long), ltm_written=zeros(batch_size, dt=torch.long),
                    ltm_B=zeros(c.n_layer, batch_size, c.n_basis, c.n_embd),
                    ltm_hist=zeros(c.n_layer, batch_size, c.sticky_bins), ltm_rng=rng_seed(batch_size, device))

    def next_state(self, memory, start, densities, left):
        """The ltm_* fields after a segment (SG); densities: n_layer (μ, σ²) each (B, H, T); left: (B,) now waiting."""
        c = self.config
        hist = memory.ltm_hist
        if c.ltm and c.sticky:                   # Eq. 16: p(d_j) ∝ the mass the segment's attention put in bin d_j
            with torch.no_grad():                # (SG: the histogram only picks the next write's points)
                hist = torch.stack([attention_histogram(mu, s2, c.sticky_bins) for mu, s2 in densities])
            hist = hist / hist.sum(-1, keepdim=True)                                   # (n_layer, B, n_bins)
        wrote = start.write.rows.long()
        return dict(ltm_pending=memory.ltm_pending - c.seg_len * wrote + left, ltm_written=start.write.written,
                    ltm_B=torch.stack(start.ltm_B).to(memory.ltm_B.dtype).detach().contiguous(),
                    ltm_hist=hist.to(memory.ltm_hist.dtype).detach().contiguous(), ltm_rng=memory.ltm_rng + wrote)

    def begin_segment(self, memory, attentions):
        """This step's write (§3.2) -> (n_layer ltm_B (B, N, C), n_layer LTMRead (None: no LTM), LTMWrite)"""
        due = self.due(memory)
        if not self.config.ltm:      # the waiting vectors are dropped, the LTM stays as it was, copied (an
            ltm_B, written = memory.ltm_B.clone(), memory.ltm_written.clone()   # OpenSegment's refill writes in it)
            return list(ltm_B), [None] * len(attentions), due._replace(written=written)
        ltm_B = [self.write(n, memory, due, attn.gated) for n, attn in enumerate(attentions)]
        read = [LTMRead(*attn.keys_values(layer_B.to(attn.key_net.weight.dtype)), due.written > 0, self.basis_mu,
                        self.basis_sigma) for attn, layer_B in zip(attentions, ltm_B)]
        return ltm_B, read, due

    def due(self, memory):
        """The rows with L = seg_len vectors waiting write now (§3.2), emptied first if ltm_reset_len says so."""
        c = self.config
        L, n_wait = c.seg_len, 2 * c.seg_len - 1                                       # n_wait waiting slots
        rows = memory.ltm_pending >= L
        slots = (n_wait - memory.ltm_pending).clamp(max=n_wait - L)[:, None] + torch.arange(L, device=rows.device)
        grow = (memory.ltm_written > 0) & ((memory.ltm_written < c.ltm_reset_len) if c.ltm_reset_len else True)
        return LTMWrite(rows, slots, grow, torch.where(rows, memory.ltm_written * grow + L, memory.ltm_written))

    def write(self, n, memory, due, gated):
        """Layer n's ltm_B after the write (B, N, C): of [old signal at M points ; X̃] (Eqs. 14-15, 5), or of X̃ alone
        (empty LTM, or not `unbounded`). gated: the CNN gate (Eq. 18); the old ltm_B is detached."""
        c = self.config
        dtype = torch.promote_types(self.G_first.dtype, torch.float32)
        ltm_B = memory.ltm_B[n].to(dtype)                                              # (B, N, C)
        new = memory.mem[n].gather(1, due.slots[..., None].expand(-1, -1, c.n_embd)).to(dtype)  # (B, L, C) oldest first
        with torch.autocast(device_type=ltm_B.device.type, enabled=False):            # the regression in float32
            x_new = gated(new)                                                         # X̃ (Eq. 18)
            new_ltm_B = self.G_first.T @ x_new                                         # B = GᵀX̃  (Eq. 5)
            if c.unbounded:                      # Eq. 5 over X = [X_past ; X̃] (Eq. 15): G_pastᵀ X_past + G_newᵀ X̃
                G_past, G_new = self.G_unbounded.split([c.n_samples, c.seg_len])       # (M, N), (L, N)
                grown = G_past.T @ self.past_samples(n, memory, ltm_B) + G_new.T @ x_new
                new_ltm_B = torch.where(due.grow[:, None, None], grown, new_ltm_B)
        return torch.where(due.rows[:, None, None], new_ltm_B, ltm_B)                  # (B, N, C)

    def past_samples(self, n, memory, ltm_B):
        """X_past (Eq. 14): ltm_B (B, N, C) at M points m/M or drawn from the histogram (§3.3). -> (B, M, C)"""
        c = self.config
        psi = self.psi_linear.expand(ltm_B.size(0), -1, -1)                            # (B, M, N) ψ(m/M)
        if c.sticky:
            uniforms = counter_uniforms(memory.ltm_rng * c.n_layer + n, c.n_samples)    # (B, M)
            t = sample_sticky_points(memory.ltm_hist[n].to(ltm_B.dtype) + 1e-12, uniforms)   # (B, M)
            psi = evaluate_basis(t, self.basis_mu, self.basis_sigma)                   # (B, M, N)
        return psi @ ltm_B                                                             # x_m = Bᵀψ(t_m)

    def flops_per_token(self):
        """The write's FLOPs per token: the regression (Eqs. 5, 14-15), with the gate its weights' gradient and X̃'s."""
        c = self.config
        T, C, N = c.seg_len, c.n_embd, c.n_basis
        past, grown = (c.n_samples, c.n_samples + T) if c.unbounded else (0, 0)    # X_past, [X_past ; X̃] (Eq. 15)
        flops = 2 * (T + past + grown) * N * C                                     # G_firstᵀX̃, G_pastᵀX_past, ...
        if c.cnn_gate:                                  # Eq. 18 on detached vectors; G_firstᵀX̃ and G_newᵀX̃ backward
            flops += 4 * 3 * C * C * T + 2 * (T + (T if c.unbounded else 0)) * N * C
        return flops / T

    def kl(self, densities, written):
        """Eq. 20: ½(σ²/σ₀² − log(σ²/σ₀²) − 1), meaned over heads, queries and written rows, summed over layers."""
        s0 = self.config.sigma_0 ** 2
        kl = sum(0.5 * (s2 / s0 - torch.log(s2 / s0) - 1).mean(dim=(1, 2)) for _, s2 in densities)   # (B,)
        w = (written > 0).to(kl.dtype)
        return (kl * w).sum() / w.sum().clamp(min=1)


# --- The Transformer-XL around the LTM: model_xl.py's blocks (copied), its attention with Z_LTM added, the model


# Copied from model_xl.py (PositionwiseFF)
class PositionwiseFF(nn.Module):
    """The feed-forward sublayer with its residual and LayerNorm (post-LN, or pre-LN when pre_lnorm)."""

    def __init__(self, n_embd, d_inner, dropout, pre_lnorm):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, d_inner), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(d_inner, n_embd), nn.Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(n_embd)
        self.pre_lnorm = pre_lnorm

    def forward(self, x):
        if self.pre_lnorm:
            return x + self.net(self.layer_norm(x))
        return self.layer_norm(x + self.net(x))


# Copied from model_xl.py (ScaledEmbedding)
class ScaledEmbedding(nn.Module):
    """Token embedding times sqrt(n_embd), as the Transformer-XL code's AdaptiveEmbedding with a single cluster.
    Its weight is tied to the output layer."""

    def __init__(self, vocab_size, n_embd):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, n_embd))
        self.scale = n_embd ** 0.5

    def forward(self, idx):
        return F.embedding(idx, self.weight) * self.scale


# Copied from model_xl.py (PositionalEmbedding)
class PositionalEmbedding(nn.Module):
    """The fixed sinusoid R of §3.3 (Vaswani et al.'s, without learnable parameters), evaluated at any positions."""

    def __init__(self, n_embd):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, n_embd, 2.0) / n_embd))
        self.register_buffer('inv_freq', inv_freq, persistent=False)

    def forward(self, pos_seq):                                   # pos_seq: (K,) float
        sinusoid = torch.outer(pos_seq, self.inv_freq)            # (K, n_embd/2)
        return torch.cat([sinusoid.sin(), sinusoid.cos()], -1)    # (K, n_embd)


# Copied from model_xl.py (rel_shift)
def rel_shift(x):
    """The rel-shift trick of the Transformer-XL code (its appendix B computes the same thing).

    In: x[..., i, c] = score of query i with the relative embedding of distance K-1-c (columns in the order of
    R_{K-1}, ..., R_0). Out: y[..., i, j] = score of query i with distance (K-T+i) - j, i.e. the distance between
    query i (which sits at position K-T+i of the K keys) and key j. Pad one zero column on the left, view the
    (T, K+1) block as (K+1, T), drop the first row, view back as (T, K). Entries with j > K-T+i (keys in the
    query's future) come out as garbage and must be masked, as they always are.
    """
    B, H, T, K = x.shape
    x_padded = torch.cat([x.new_zeros(B, H, T, 1), x], dim=-1)    # (B, H, T, K+1)
    x_padded = x_padded.view(B, H, K + 1, T)
    return x_padded[:, :, 1:].reshape(B, H, T, K)                 # y[i, j] = x[i, j + T-1-i]


# Copied from model_xl.py (Model._attn_mask) with the method->causal_mask, same_length (not in Config) removed
def causal_mask(key_valid, T):
    """key_valid: (B, K) bool, the last T keys being the queries themselves; causal. -> (B, 1, T, K)"""
    K = key_valid.size(1)
    i = torch.arange(T, device=key_valid.device)[:, None]
    j = torch.arange(K, device=key_valid.device)[None, :]
    return ((K - T + i - j >= 0)[None] & key_valid[:, None, :])[:, None]


# Copied from model_xl.py (RelMultiHeadAttn) with ->RelMultiHeadAttnLTM, its LTM attention (ltm) and Z_LTM added
class RelMultiHeadAttnLTM(nn.Module):
    """model_xl.py's relative multi-head attention over [STM ; segment], plus Z_LTM before the residual (Eq. 12)."""

    def __init__(self, config, long_term_attention):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.d_head
        self.n_head, self.d_head = H, D
        self.q_net = nn.Linear(C, H * D, bias=False)
        self.kv_net = nn.Linear(C, 2 * H * D, bias=False)
        self.r_net = nn.Linear(C, H * D, bias=False)
        self.o_net = nn.Linear(H * D, C, bias=False)
        self.layer_norm = nn.LayerNorm(C)
        self.drop = nn.Dropout(config.dropout)
        self.dropatt = nn.Dropout(config.dropatt)
        self.dropatt_p = config.dropatt
        self.scale = 1.0 / math.sqrt(D)
        self.pre_lnorm = config.pre_lnorm
        self.attn_kernel = config.attn_kernel
        if config.attn_kernel == 'triton':   # the one import beyond torch, and only here: triton ships with CUDA torch
            from rel_attention_triton import rel_attention
            self.rel_attention = rel_attention
        self.ltm = long_term_attention(config)

    # Copied from model_xl.py (RelMultiHeadAttn.keys_values)
    def keys_values(self, h):
        """Keys and values (B, H, S, D) of hidden states h (B, S, C). A position's key and value depend on that
        position alone (positions enter only through R), so the memory's can be computed once and cached."""
        B, S, _ = h.shape
        if self.pre_lnorm:
            h = self.layer_norm(h)
        kv = self.kv_net(h).view(B, S, 2, self.n_head, self.d_head)
        return kv.permute(2, 0, 3, 1, 4).unbind(0)               # k, v: each (B, H, S, D)

    # Copied from model_xl.py (RelMultiHeadAttn.project_positions)
    def project_positions(self, r):
        """W_{k,R} R (H, K, D) of the relative embeddings R (K, C): the keys of the distances (§3.3)."""
        return self.r_net(r).view(r.size(0), self.n_head, self.d_head).transpose(0, 1)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, ltm):
        """As model_xl.py's, plus ltm: LTMRead or None. -> output, keys/values (B, H, K, D), (μ, σ²) or None"""
        B, T, C = h.shape
        H, D = self.n_head, self.d_head
        x = self.layer_norm(h) if self.pre_lnorm else h
        q = self.q_net(x).view(B, T, H, D).transpose(1, 2)       # (B, H, T, D)
        k_new, v_new = self.keys_values(h)
        k = torch.cat([mem_kv[0], k_new], dim=2)                  # (B, H, K, D)
        v = torch.cat([mem_kv[1], v_new], dim=2)
        r_k = self.project_positions(r) if r.dim() == 2 else r   # (H, K, D)
        q_u, q_v = q + r_w_bias[:, None], q + r_r_bias[:, None]         # (q_i + u), (q_i + v)
        if self.attn_kernel == 'einsum':
            BD = rel_shift(torch.einsum('bhid,hjd->bhij', q_v, r_k))     # (B, H, T, K)
            score = (torch.einsum('bhid,bhjd->bhij', q_u, k) + BD) * self.scale
            score = score.masked_fill(~attn_mask, float('-inf'))
            prob = self.dropatt(F.softmax(score.float(), dim=-1).to(v.dtype))
            attn_vec = torch.einsum('bhij,bhjd->bhid', prob, v)           # (B, H, T, D)
        elif self.attn_kernel == 'sdpa':
            BD = rel_shift(torch.einsum('bhid,hjd->bhij', q_v, r_k))     # (B, H, T, K)
            bias = (BD * self.scale).masked_fill(~attn_mask, float('-inf')).to(k.dtype)
            attn_vec = F.scaled_dot_product_attention(q_u.to(k.dtype), k, v, attn_mask=bias,
                                                      dropout_p=self.dropatt_p if self.training else 0.0)
        else:                                                             # 'triton'
            attn_vec, _ = self.rel_attention(q, r_w_bias, r_r_bias, k, v, r_k, attn_mask, self.scale)   # (B, H, T, D)
        attn_out = self.o_net(attn_vec.transpose(1, 2).reshape(B, T, H * D))   # Z_T (B, T, C)

        density = None
        if ltm is not None:                                       # masked until the row's LTM holds something
            z_ltm, *density = self.ltm(q, ltm)                    # Z_LTM and (μ, σ²)
            attn_out = attn_out + z_ltm * ltm.written[:, None, None].to(z_ltm.dtype)   # Z = Z_T + Z_LTM (Eq. 12)
        attn_out = self.drop(attn_out)
        out = h + attn_out if self.pre_lnorm else self.layer_norm(h + attn_out)
        return out, (k, v), density


# Copied from model_xl.py (Block) with RelMultiHeadAttn->RelMultiHeadAttnLTM and the LTM (its class, ltm) passed
class Block(nn.Module):
    def __init__(self, config, long_term_attention):
        super().__init__()
        self.attn = RelMultiHeadAttnLTM(config, long_term_attention)
        self.ff = PositionwiseFF(config.n_embd, config.d_inner, config.dropout, config.pre_lnorm)

    def forward(self, h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, ltm):
        h, kv, density = self.attn(h, mem_kv, r, r_w_bias, r_r_bias, attn_mask, ltm)
        return self.ff(h), kv, density


class SegmentStart(NamedTuple):
    """What every position of a segment shares, computed once at its start (Model._begin_segment)."""
    stm_kv: list              # n_layer (k, v), each (B, H, mem_len, D): the STM's keys and values
    stm_valid: torch.Tensor   # (B, mem_len) bool, the STM slots that hold something
    ltm_B: list               # n_layer (B, N, C): each layer's LTM after this step's write (§3.2)
    ltm_read: list            # n_layer LTMRead: what each layer reads of it (None when the LTM is off)
    write: LTMWrite           # the rows that wrote, and Memory.ltm_written after it


@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it into the memory, in buffers of fixed shape
    (forward() takes a whole segment in one call). K = mem_len + seg_len slots, right-aligned as Memory's: [STM ;
    tokens so far] fill the right end and padding the left. A step of T tokens slides the window by T (decode() never
    lets a valid slot fall off), so every token's step has the same shapes and writes in place: decode() can capture
    it. The LTM, written once at the segment's start (§3.2), is read by every step and kept by the close."""
    start: SegmentStart      # the LTM after its write: each layer's LTMRead, ltm_B, the LTMWrite (STM keys: in kv)
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of the K slots
    hids: torch.Tensor       # (n_layer, B, seg_len, C) the layers' inputs of the last seg_len tokens: the STM to be
    densities: torch.Tensor  # (2, n_layer, B, H, seg_len) μ and σ² of their LTM reads (Eqs. 9-10), for Eq. 16
    r_k: list                # per layer W_{k,R} R (H, K, D) for the distances K-1, ..., 0


class Model(nn.Module):
    long_term_attention = LongTermAttention   # each layer's LTM read (lab/model_infformer_probes.py replaces it)

    # Copied from model_xl.py (Model.__init__) with the layers' LTM attention class and self.long_term (the LTM) added
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        C, H, D = config.n_embd, config.n_head, config.d_head
        self.word_emb = ScaledEmbedding(config.vocab_size, C)
        self.pos_emb = PositionalEmbedding(C)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([Block(config, self.long_term_attention) for _ in range(config.n_layer)])
        n_bias = config.n_layer if config.untie_r else 1
        self.r_w_bias = nn.Parameter(torch.empty(n_bias, H, D))   # u, per layer (untie_r) or shared
        self.r_r_bias = nn.Parameter(torch.empty(n_bias, H, D))   # v
        self.ln_f = nn.LayerNorm(C) if config.pre_lnorm else nn.Identity()
        self.apply(self._init_weights)
        nn.init.normal_(self.r_w_bias, 0.0, config.init_std)
        nn.init.normal_(self.r_r_bias, 0.0, config.init_std)
        self.long_term = LongTermMemory(config)                   # the LTM's basis, ridge matrices and write

    # Copied from model_xl.py (Model._init_weights)
    def _init_weights(self, module):
        # As the paper's code (weights_init with init='normal'): N(0, init_std) weights, zero biases,
        # LayerNorm gains N(1, init_std).
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, ScaledEmbedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.normal_(module.weight, 1.0, std)
            nn.init.zeros_(module.bias)

    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams; mem_len overrides config.mem_len (the STM) at eval."""
        c = self.config
        mem_len = c.mem_len if mem_len is None else mem_len
        dtype = self.word_emb.weight.dtype
        mem = torch.zeros(c.n_layer, batch_size, 2 * c.seg_len - 1 + mem_len, c.n_embd, device=device, dtype=dtype)
        return Memory(mem=mem, length=torch.zeros(batch_size, dtype=torch.long, device=device),
                      **self.long_term.empty_state(batch_size, device, dtype))

    def reset_memory(self, memory, mask):
        """Empty the STM and the LTM of the rows where mask (B,) is True: they become fresh streams' rows."""
        fresh = self.init_memory(mask.size(0), mask.device, memory.mem.size(2) - (2 * self.config.seg_len - 1))
        rows = lambda x: mask if x.dim() == 1 else mask.view(1, -1, *[1] * (x.dim() - 2))   # (B,) or (n_layer, B, ..)
        return Memory(**{k: torch.where(rows(v), getattr(fresh, k).to(v.dtype), v) for k, v in vars(memory).items()})

    def _begin_segment(self, memory):
        """The STM's keys/values and validity, and the LTM after this step's write (§3.2). -> SegmentStart"""
        S = memory.mem.size(2)
        n_wait = 2 * self.config.seg_len - 1                                           # slots before the STM
        valid = torch.arange(S, device=memory.mem.device)[None, :] >= (S - memory.length)[:, None]   # (B, S)
        stm_kv = [layer.attn.keys_values(memory.mem[n][:, n_wait:]) for n, layer in enumerate(self.layers)]
        ltm = self.long_term.begin_segment(memory, [layer.attn.ltm for layer in self.layers])
        return SegmentStart(stm_kv, valid[:, n_wait:], *ltm)

    def _update_memory(self, memory, start, hids, densities):
        """The STM keeps the last mem_len of [old ; hids (n_layer (B, T, C))] (SG); the valid ones pushed out wait."""
        S, T = memory.mem.size(2), hids[0].size(1)
        mem_len = S - (2 * self.config.seg_len - 1)
        new = torch.stack([h.detach() for h in hids]).to(memory.mem.dtype)             # (n_layer, B, T, C)
        mem = torch.cat([memory.mem[:, :, T:], new], dim=2)                            # the last S of [old ; new]
        left = (memory.length.clamp(max=mem_len) + T - mem_len).clamp(min=0)           # (B,) valid, left the STM
        return Memory(mem=mem, length=(memory.length + T).clamp(max=S),
                      **self.long_term.next_state(memory, start, densities, left))

    # Copied from model_xl.py (Model._relative_positions)
    def _relative_positions(self, K, device):
        """R for the distances K-1, ..., 0 (clamped at clamp_len), with dropout as in the paper's code."""
        pos_seq = torch.arange(K - 1, -1, -1.0, device=device)
        if self.config.clamp_len > 0:
            pos_seq = pos_seq.clamp(max=self.config.clamp_len)
        return self.drop(self.pos_emb(pos_seq).to(self.word_emb.weight.dtype))   # (K, C)

    # Copied from model_xl.py (Model._u_v)
    def _u_v(self, i):
        n = i if self.config.untie_r else 0
        return self.r_w_bias[n], self.r_r_bias[n]

    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len; memory: Memory. Returns (logits, loss, new_memory, aux)."""
        c = self.config
        B, T = idx.shape
        if T > c.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={c.seg_len}")
        start = self._begin_segment(memory)
        key_valid = torch.cat([start.stm_valid, start.stm_valid.new_ones(B, T)], dim=1)   # (B, K), K = mem_len+T
        attn_mask = causal_mask(key_valid, T)                                        # (B, 1, T, K)
        r = self._relative_positions(key_valid.size(1), idx.device)

        h = self.drop(self.word_emb(idx))                                            # (B, T, C)
        hids, densities = [], []
        for n, layer in enumerate(self.layers):
            hids.append(h)
            h, _, density = layer(h, start.stm_kv[n], r, *self._u_v(n), attn_mask, start.ltm_read[n])
            densities.append(density)
        h = self.drop(self.ln_f(h))
        logits = F.linear(h, self.word_emb.weight)                                   # (B, T, V)

        new_memory = self._update_memory(memory, start, hids, densities)
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
            if c.ltm:
                kl = self.long_term.kl(densities, start.write.written)              # L = L_NLL + λ_KL L_KL (Eq. 21)
                aux['kl_loss'] = kl.detach()
                loss = loss + c.kl_weight * kl
        return logits, loss, new_memory, aux

    # Copied from model_xl.py (Model.num_params)
    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, mem_len=None):
        """Training FLOPs per token for MFU (6 a multiply-add with both gradients, 4 with the weight's alone; memory
        detached): model_xl.py's count for the STM, plus the LTM's write and read (their flops_per_token)."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()      # the weights of products (biases,
                       if name.endswith('weight') and p.dim() > 1 and '.ltm.' not in name)   # ...: none) but the LTM's
        mem_len = c.mem_len if mem_len is None else mem_len
        T, K, C, HD, L = c.seg_len, mem_len + c.seg_len, c.n_embd, c.n_head * c.d_head, c.n_layer
        stm = 6 * 3 * L * HD * K + 4 * L * mem_len * C * 2 * HD / T       # attention; [SG(m)]'s keys and values
        flops = 6 * (matrices - L * C * HD) + stm                          # every weight but W_{k,R} and the LTM's
        ltm = self.long_term.flops_per_token() + self.layers[0].attn.ltm.flops_per_token(c)   # a layer's LTM
        return flops + (L * ltm if c.ltm else 0)

    # --- generation ---------------------------------------------------------------------------------------

    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T) on memory, in a new OpenSegment or in seg's buffers (decode() reuses them).
        The LTM's write (§3.2) happens here. -> the logits (B, V) of the last token, the OpenSegment"""
        c, B, f32 = self.config, tokens.size(0), torch.promote_types(memory.mem.dtype, torch.float32)
        start = self._begin_segment(memory)
        pad, K = (0, 0, c.seg_len, 0), start.stm_valid.size(1) + c.seg_len   # seg_len empty slots on the left
        r = self._relative_positions(K, tokens.device)                 # (K, C)
        seg = refill(seg, OpenSegment(start=start._replace(stm_kv=[]), key_valid=F.pad(start.stm_valid, pad[2:]),
                                      kv=[tuple(F.pad(x, pad) for x in xs) for xs in start.stm_kv],
                                      hids=memory.mem.new_zeros(c.n_layer, B, c.seg_len, c.n_embd),
                                      densities=memory.mem.new_zeros(2, c.n_layer, B, c.n_head, c.seg_len, dtype=f32),
                                      r_k=[layer.attn.project_positions(r) for layer in self.layers]))
        return self.step(tokens, seg, tokens.size(1)), seg

    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg, which it updates in place. filled: as model_xl.py's (the
        step skips the seg_len - filled padding slots on the left; None: it reads them too, as a graph wants).
        -> logits (B, V) of the last"""
        T, S = tokens.size(1), 0 if filled is None else self.config.seg_len - filled   # S slots skipped
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K-S)
        attn_mask = causal_mask(key_valid, T)                          # (B, 1, T, K-S)
        h = self.drop(self.word_emb(tokens))                           # (B, T, C)
        hids, densities = [], []
        for n, layer in enumerate(self.layers):
            hids.append(h)
            k, v = (x[:, :, S:] for x in seg.kv[n])                    # the slots it reads, less the T oldest below
            h, (k_new, v_new), density = layer(h, (k[:, :, T:], v[:, :, T:]), seg.r_k[n][:, S:], *self._u_v(n),
                                               attn_mask, seg.start.ltm_read[n])
            k.copy_(k_new)
            v.copy_(v_new)
            densities.append(density)
        seg.key_valid[:, S:] = key_valid
        seg.hids[:, :, S:] = torch.cat([seg.hids[:, :, S + T:], torch.stack(hids).to(seg.hids.dtype)], dim=2)
        if self.config.ltm:                                            # (no LTM: no densities)
            new = torch.stack([torch.stack(d) for d in densities], dim=1).to(seg.densities.dtype)   # (2, .., B, H, T)
            seg.densities[..., S:] = torch.cat([seg.densities[..., S + T:], new], dim=-1)
        return F.linear(self.ln_f(h[:, -1]), self.word_emb.weight)    # (B, V) logits of the last position

    def close_segment(self, memory, seg):
        """The memory after the open segment's seg_len tokens, as forward() makes it (with the LTM of its start)."""
        return self._update_memory(memory, seg.start, seg.hids.unbind(0), list(zip(*seg.densities)))

    # Copied from model_xl.py (Model.generate)
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, memory=None, callback=None, cuda_graph=False):
        """Continue idx (B, T0) by max_new_tokens tokens after memory (optional; else a fresh one), as decode() says;
        callback(tokens (B, 1)) after each new token; cuda_graph: replay each token's step as one CUDA graph."""
        memory = self.init_memory(idx.size(0), idx.device) if memory is None else memory
        return decode(self, idx, memory, max_new_tokens, temperature, top_k, callback, cuda_graph)


# Copied from model_xl.py (sample_next)
def sample_next(logits, temperature=1.0, top_k=None):
    """Sample one token per row from (B, V) logits; temperature 0 means greedy."""
    if temperature == 0.0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], float('-inf'))
    return torch.multinomial(F.softmax(logits.float(), dim=-1), num_samples=1)   # (B, 1)


# Copied from model_xl.py (decode)
def decode(model, idx, memory, max_new_tokens, temperature=1.0, top_k=None, callback=None, cuda_graph=False):
    """The sampling loop of every model's generate(). The prompt idx (B, T0) goes in as pieces that never cross a
    segment boundary, then max_new_tokens tokens are sampled one at a time (sample_next), each fed back. The model
    keeps the open segment in buffers of fixed shape (its OpenSegment): model.open_segment(memory, tokens, seg) starts
    one with its first tokens, model.step(tokens, seg, filled) adds the next, each returning the logits (B, V) of the
    last token, and model.close_segment(memory, seg) turns it into the memory once it holds seg_len tokens (here is
    the only place that counts them), as forward() does. Opening and closing happen once a segment, a step at every
    token. With cuda_graph the step is recorded once as a CUDA graph and replayed: it then reads every slot, the same
    shapes at every token; without, it reads only the slots in use (filled: the segment's tokens with these)."""
    if idx.size(1) == 0:
        raise ValueError("generate needs at least one token in idx")
    if cuda_graph and idx.device.type != 'cuda':
        raise ValueError(f"cuda_graph=True needs the model and idx on a CUDA device, not {idx.device}")
    seg_len, seg_pos, seg = model.config.seg_len, 0, None         # seg_pos: tokens of the open segment so far
    captured = CapturedStep(model.step) if cuda_graph else None

    def feed(tokens):
        nonlocal memory, seg_pos, seg
        if seg_pos == 0:
            logits, seg = model.open_segment(memory, tokens, seg)  # in seg's old buffers, which a graph reads
        elif captured:                                             # every slot, the same shapes at every token
            logits = captured(tokens, seg)
        else:                                                      # the slots in use
            logits = model.step(tokens, seg, seg_pos + tokens.size(1))
        seg_pos = (seg_pos + tokens.size(1)) % seg_len
        if seg_pos == 0:
            memory = model.close_segment(memory, seg)
        return logits

    for start in range(0, idx.size(1), seg_len):
        logits = feed(idx[:, start:start + seg_len])
    for i in range(max_new_tokens):
        idx_next = sample_next(logits, temperature, top_k)
        idx = torch.cat([idx, idx_next], dim=1)
        if callback is not None:
            callback(idx_next)
        if i + 1 < max_new_tokens:
            logits = feed(idx_next)
    return idx


# Copied from model_xl.py (refill)
def refill(seg, new):
    """new; or, when seg is an OpenSegment already, seg with new's values copied in (a captured step reads seg)"""
    if seg is None:
        return new

    def tensors(x):                                               # of a dataclass, list or tuple, in order
        if torch.is_tensor(x):
            return [x]
        items = vars(x).values() if is_dataclass(x) else x if isinstance(x, (list, tuple)) else []
        return [t for item in items for t in tensors(item)]

    for old, value in zip(tensors(seg), tensors(new), strict=True):
        old.copy_(value)
    return seg


# Copied from model_xl.py (CapturedStep)
class CapturedStep:
    """A model's step(tokens, seg) as a CUDA graph: one launch for the hundreds of kernels of a token, whose Python
    and launch overhead otherwise cost more than their arithmetic at batch 1. The first call runs the step, as the
    warm-up capture wants (on a side stream), then records it; later calls copy their tokens into the recorded input
    and replay. step must keep its shapes and write only into seg's buffers (OpenSegment)."""

    def __init__(self, step):
        self.step, self.graph = step, None

    def __call__(self, tokens, seg):
        if self.graph is not None:
            self.tokens.copy_(tokens)
            self.graph.replay()
            return self.logits
        # the weights' autocast copies are made inside the graph, not cached outside it (and freed under it)
        with torch.autocast('cuda', torch.get_autocast_dtype('cuda'), torch.is_autocast_enabled('cuda'),
                            cache_enabled=False):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                logits = self.step(tokens, seg)                   # this token's step, and the warm-up
            torch.cuda.current_stream().wait_stream(stream)
            self.tokens, self.graph = tokens.clone(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self.step(self.tokens, seg)         # recorded, not run
        return logits
