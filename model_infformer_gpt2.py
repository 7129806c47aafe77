"""
∞-former's language-modelling setting (Martins, Marinho and Martins, 2022, "∞-former: Infinite Memory Transformer",
ACL, arXiv 2109.00301, §4.2 and Table 1): GPT-2 small extended with the continuous long-term memory (LTM) and
fine-tuned, as the authors' finetune_gpt2 code does it (github.com/deep-spin/infinite-former, finetune_gpt2/src/
transformers/models/gpt2/: modeling_gpt2.py, long_term_attention.py; "the authors' code" below).

GPT-2 reads one segment of L = seg_len = 512 tokens at a time, positions 0..T-1 (model_gpt2.py). Each layer also keeps
an LTM of the text before the segment, and its LTM read is ADDED to GPT-2's attention output, before the dropout and
the residual (Eq. 12: Z = Z_T + Z_LTM; the authors' Attention.forward: `a += a_long_term`). There is no short-term
memory: what a layer writes to its LTM at the start of a segment is its input of the previous segment (the authors'
Block.mem), so the segment's own tokens are GPT-2's attention's and every earlier token is the LTM's.
  §3.1 A layer's LTM is a signal X̄(t) = Bᵀψ(t), t ∈ [0, 1] (Eq. 7), ψ N = 512 Gaussian RBFs, B (N × C, `ltm_B`)
       fitted by ridge regression (Eq. 5: Bᵀ = XᵀG). Each head reads it with a density N(t; μ, σ²), μ (Eq. 9) and σ²
       (Eq. 10) linear in its query's scores against the keys B W^K (Eq. 8): E_p[V̄(t)] = (B W^V)ᵀ E_p[ψ(t)] (Eq. 11).
  §3.2 Unbounded memory: the old signal, read at M = `n_samples` points, is squeezed into [0, τ] (Eqs. 13-14), the
       new vectors go into ]τ, 1] (Eq. 15), one regression refits B (Eq. 5). The authors' GPT-2 code empties the
       LTM once it holds 2,048 tokens (the paper's "memory threshold"; `ltm_reset_len`).
  §3.3 Sticky memories (`sticky=True`): the M points are drawn from a histogram of the attention the previous segment
       paid to each of 128 bins of [0, 1] (Eqs. 16-17).
  §3.4 A width-3 convolution gates the new vectors (Eq. 18); a KL term pulls every σ² toward σ₀² (Eqs. 20-21).
With the LTM off (`ltm=False`) or empty (a fresh stream's first segment), the logits are GPT-2's, exactly.

Where the authors' GPT-2 code departs from the paper, this file follows the code (tests/test_infformer_gpt2.py checks
the LTM's contribution against a port of their long_term_attention.py):
  - the μ/σ² maps have no bias (the paper's "affine"): LongTermAttention.affines;
  - the KL also pulls μ toward μ₀ = -1 (their configs' mu_0; the paper's Eq. 20 has μ₀ = μ): LongTermMemory.kl;
  - a sticky point is the left edge of its bin; the zeros fitted outside [0, 1] sit where their code puts them.
Ours, not theirs: the sticky draws come from a hash of a state in Memory (rng_seed), not a global generator, and
the histogram's outer edges are 0 and 1 (theirs ±1e-6 beyond); the memory is per row of the batch and lives in Memory
(theirs in the modules, across batches, train and eval alike); a segment shorter than seg_len leaves its vectors
waiting until seg_len have gathered (their code takes only full blocks of 512, which their run_clm.py makes).
Reading order: the LTM's pieces (model_infformer.py's, copied), GPT-2's blocks (model_gpt2.py's, copied) with the
LTM read added, the model (memory, forward, generate), the generic blocks every model file copies from model_xl.py.

Letters: B batch, T tokens of this call, C n_embd (the paper's e), H heads, D = C / H, N n_basis, L seg_len,
M n_samples, K key slots of a decode step; the paper's B is `ltm_B`, its D bins `sticky_bins`.
"""

import math
from dataclasses import dataclass, is_dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    # GPT-2 small (124M), with its Hugging Face GPT2Config names; --init_from=gpt2... sets the first six.
    vocab_size: int = 50257   # GPT-2's BPE, unpadded: the pretrained embedding has 50257 rows
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024   # learned positions: the longest segment the model can read
    layer_norm_epsilon: float = 1e-5
    seg_len: int = 512        # tokens per segment: §4.2's input L = 512 (the authors' --block_size=512)
    dropout: float = 0.1      # GPT-2's embd_pdrop = attn_pdrop = resid_pdrop (the LTM read has none, as theirs)
    init_std: float = 0.02    # GPT-2's initializer_range: the LTM's weights start N(0, 0.02), as theirs
    # The LTM (§3), defaults as §4.2 and the authors' config.json / long_term_attention.py
    ltm: bool = True                 # False: GPT-2 alone on the same weights (the LTM is neither written nor read)
    n_basis: int = 512               # N Gaussian RBFs (§4.2), centres evenly over [0, 1] crossed with the widths
    basis_widths: str = '0.005,0.01'  # σ_j of the RBFs (their code's LM widths)
    ridge_lambda: float = 0.5        # λ of the ridge regression (Eq. 5; their ridge_penalty)
    unbounded: bool = True           # §3.2: keep the old signal (their infinite_memory; False: each write replaces B)
    tau: float = 0.5                 # τ: the old signal is squeezed into [0, τ] (Eq. 14)
    n_samples: int = 512             # M points of the old signal (Eq. 14; their nb_samples)
    ltm_reset_len: int = 2048        # an LTM this full is emptied before it writes (their mem_threshold, the
                                     # paper's "memory threshold" of 2,048 tokens); 0 = never
    sticky: bool = False             # §3.3 sticky memories (their infinite_memory_transformer_sticky_mem config: True)
    sticky_bins: int = 128           # bins of the attention histogram (the paper's D, Eq. 16)
    cnn_gate: bool = True            # §3.4, Eq. 18: X̃ = sigmoid(Conv1d_k3(X)) ⊙ X (their mask_type='cnn')
    kl_weight: float = 1e-6          # λ_KL of Eq. 21 (their README's --kl_m=.000001); 0 = no KL regulariser
    sigma_0: float = 0.05            # σ₀ of the KL prior
    mu_0: float = -1.0               # μ₀ of the KL prior (their configs' -1); > 0 drops the μ term, as their code,
                                     # which is the paper's Eq. 20 (μ₀ = μ)
    sigma_sq_min: float = 1e-4       # floor of σ² (Eq. 10), their GPT-2 code's
    ltm_lr_mult: float = 5.0         # the LTM's learning rate over GPT-2's: their learning_rate_ltm 2.5e-4 / 5e-5

    # Copied from model_infformer.py (Config.__post_init__) with GPT-2's fields (model_gpt2.py's checks)
    def __post_init__(self):
        lowest = dict.fromkeys(('vocab_size', 'n_layer', 'n_head', 'n_embd', 'n_positions', 'seg_len', 'n_samples',
                                'sticky_bins'), 1)
        for name, low in {**lowest, 'ltm_reset_len': 0, 'kl_weight': 0, 'ltm_lr_mult': 0}.items():
            if not getattr(self, name) >= low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.seg_len > self.n_positions:
            raise ValueError(f"seg_len ({self.seg_len}) must be <= n_positions ({self.n_positions}): "
                             "GPT-2 has no position beyond n_positions - 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        self.d_head = self.n_embd // self.n_head      # D, GPT-2's head width (the LTM read's too)
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
        for name in ('ridge_lambda', 'sigma_0', 'sigma_sq_min', 'layer_norm_epsilon'):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


# Copied from model_infformer.py (Memory) with no STM (no length): the waiting slots only
@dataclass
class Memory:
    """Fixed-shape state. Each layer's inputs wait in 2 seg_len - 1 slots (the newest ltm_pending of them) until the
    next segment writes seg_len of them to the LTM (a full previous segment: its whole input, as the authors')."""
    mem: torch.Tensor          # (n_layer, B, 2 seg_len - 1, n_embd) each layer's input hidden states, oldest first
    ltm_pending: torch.Tensor  # (B,) int64, how many vectors wait for the LTM
    ltm_B: torch.Tensor        # (n_layer, B, n_basis, n_embd) the coefficient matrix of the LTM signal (Eq. 5)
    ltm_written: torch.Tensor  # (B,) int64, vectors written to the LTM since it was last empty (0: term masked)
    ltm_hist: torch.Tensor     # (n_layer, B, sticky_bins) last segment's attention histogram over [0, 1] (Eq. 16)
    ltm_rng: torch.Tensor      # (B,) int64, the state of the sticky memories' random numbers


# --- §3.1 The continuous signal: Gaussian basis functions, the ridge regression (Eq. 5), E_p[ψ] (Eq. 11) -----


# Copied from model_infformer.py (gaussian_basis)
def gaussian_basis(n_basis, widths):
    """Centres μ_j evenly over [0, 1] crossed with the widths σ_j (as the authors' meshgrid). -> (N,), (N,)"""
    centres = torch.linspace(0.0, 1.0, n_basis // len(widths), dtype=torch.float64)
    mu, sigma = torch.meshgrid(centres, torch.tensor(widths, dtype=torch.float64), indexing='ij')
    return mu.flatten(), sigma.flatten()


# Copied from model_infformer.py (evaluate_basis)
def evaluate_basis(t, basis_mu, basis_sigma):
    """ψ_j(t) = N(t; μ_j, σ_j²) at positions t (...,) -> (..., N)."""
    return torch.exp(-0.5 * ((t[..., None] - basis_mu) / basis_sigma) ** 2) / (basis_sigma * math.sqrt(2 * math.pi))


# Copied from model_infformer.py (expected_basis)
def expected_basis(mu, sigma_sq, basis_mu, basis_sigma):
    """E_p[ψ(t)] of Eq. 11 in closed form: E_{N(t; μ, σ²)}[ψ_j(t)] = N(μ; μ_j, σ² + σ_j²). (...,), (...,) -> (..., N)"""
    var = sigma_sq[..., None] + basis_sigma ** 2                                       # (..., N)
    return torch.exp(-0.5 * (mu[..., None] - basis_mu) ** 2 / var) / torch.sqrt(2 * math.pi * var)


# Copied from model_infformer.py (ridge_matrix) with the padding zeros placed as the authors' GPT-2 code (spread)
def ridge_matrix(positions, basis_mu, basis_sigma, ridge_lambda, spread):
    """Eq. 5: Bᵀ = Xᵀ Fᵀ(F Fᵀ + λI)⁻¹ = XᵀG, F = [ψ(t_1), ...] (N × n_pos) -> G (n_pos, N), float64. Zeros are fitted
    outside [0, 1] (their rows dropped) so the signal is 0 there: as the authors' compute_G, at the points of
    linspace(-0.5 + 1/spread, 1.5 - 1/spread, 2 n_pos) outside [0, 1] (spread = 2 L for a first write, their
    2 L + M for an unbounded one: spacing 1/n_pos and about 1/n_pos)."""
    positions = positions.to(torch.float64)
    n_pos = positions.numel()
    grid = torch.linspace(-0.5 + 1 / spread, 1.5 - 1 / spread, 2 * n_pos, dtype=torch.float64)
    left, right = grid[grid < 0], grid[grid > 1]
    padded = torch.cat([left, positions, right])                                           # (n_pos + pads,)
    F_ = evaluate_basis(padded, basis_mu, basis_sigma).T                                   # (N, n_pos + pads)
    G = F_.T @ torch.linalg.inv(F_ @ F_.T + ridge_lambda * torch.eye(F_.size(0), dtype=torch.float64))   # (.., N)
    return G[left.numel():left.numel() + n_pos]


# Copied from model_infformer.py (ridge_positions)
def ridge_positions(config):
    """Eq. 5 positions of a write of L vectors: alone (i + 1/2)/L; unbounded, m τ/M (Eq. 14) then τ + (1 - τ) l/L."""
    L, M, tau = config.seg_len, config.n_samples, config.tau
    first = (torch.arange(L, dtype=torch.float64) + 0.5) / L
    unbounded = torch.cat([torch.arange(1, M + 1, dtype=torch.float64) * tau / M,
                           tau + (1 - tau) * torch.arange(1, L + 1, dtype=torch.float64) / L])
    return first, unbounded


# --- The LTM: each layer's read (§3.1, LongTermAttention, with its CNN gate) and the write of all (§3.2-3.4) ---


# Copied from model_infformer.py (LTMWrite)
class LTMWrite(NamedTuple):
    """Which rows write to their LTM at the start of a step (§3.2) and what they write."""
    rows: torch.Tensor     # (B,) bool, the rows with at least seg_len vectors waiting
    slots: torch.Tensor    # (B, L) Memory.mem slots of each row's oldest L = seg_len waiting vectors
    grow: torch.Tensor     # (B,) bool, the LTM keeps its old signal (it holds something and is not emptied, §3.2)
    written: torch.Tensor  # (B,) int64, Memory.ltm_written after this write


# Copied from model_infformer.py (LTMRead)
class LTMRead(NamedTuple):
    """What one layer's attention needs to read its LTM during a segment (§3.1)."""
    keys: torch.Tensor         # (B, H, N, D) ltm_B W^K (Eq. 8)
    values: torch.Tensor       # (B, H, N, D) ltm_B W^V (Eq. 8)
    written: torch.Tensor      # (B,) bool, the rows whose LTM holds something (the others' term is masked)
    basis_mu: torch.Tensor     # (N,) the centres μ_j of ψ
    basis_sigma: torch.Tensor  # (N,) the widths σ_j of ψ


# Copied from model_infformer.py (LongTermAttention) with affines() without bias
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
        """μ (Eq. 9) and σ² (Eq. 10) linear in the N scores, without bias as the authors' (the paper says affine)."""
        return nn.Linear(config.n_basis, 1, bias=False), nn.Linear(config.n_basis, 1, bias=False)

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


# Copied from model_infformer.py (attention_histogram)
def attention_histogram(mu, sigma_sq, n_bins):
    """Eqs. 16-17: the mass N(μ, σ²) (B, H, T) puts in each of n_bins bins of [0, 1], summed. -> (B, n_bins)"""
    edges = torch.linspace(0.0, 1.0, n_bins + 1, device=mu.device, dtype=mu.dtype)
    scale = (2 * sigma_sq).rsqrt()[..., None]
    erf = torch.erf(torch.addcmul(-mu[..., None] * scale, edges, scale))  # (B, H, T, n_bins+1) 2 Φ(edge) - 1
    return 0.5 * (erf[..., 1:] - erf[..., :-1]).sum(dim=(1, 2))                          # (B, n_bins)


RNG_PRIME = 2 ** 31 - 1


# Copied from model_infformer.py (rng_seed)
def rng_seed(batch_size, device):
    """Per-row states (B,) int64 of the sticky memories' random numbers, from torch.initial_seed() (train.py's --seed
    + rank) and the row: a hash of state in Memory, not a Generator, keeps forward() a function of (tokens, memory)."""
    return (torch.initial_seed() % RNG_PRIME) * 1_000_003 + torch.arange(batch_size, device=device) * 2 ** 20


# Copied from model_infformer.py (counter_uniforms)
def counter_uniforms(state, count):
    """count uniforms in [0, 1) per row of state (B,) int64: multiply mod 2^31 - 1 and xor-shift (no int64 overflow)."""
    x = (state[:, None] % RNG_PRIME + 1) * 7919 + torch.arange(1, count + 1, device=state.device) * 104729
    for a in (48271, 69621, 16807):
        x = (x % RNG_PRIME) * a % RNG_PRIME
        x = x ^ (x >> 13)
    return (x % RNG_PRIME).float() / RNG_PRIME


# Copied from model_infformer.py (sample_sticky_points) with the left edge of the bin, as the authors' GPT-2 code
def sample_sticky_points(hist, uniforms):
    """§3.3: sorted points of [0, 1], the left edge of bin j with probability hist_j / Σ hist (B, n_bins) (the
    authors' bins_cat of one category: t = 0 in the bin)."""
    B, n_bins = hist.shape
    p = hist / hist.sum(-1, keepdim=True)                                  # (B, n_bins) p(d_j), Eq. 16
    cdf = torch.cat([p.new_zeros(B, 1), p.cumsum(-1)], dim=-1)              # (B, n_bins+1)
    u = uniforms.to(hist.dtype).sort(dim=-1).values * cdf[:, -1:]
    j = torch.searchsorted(cdf[:, 1:].contiguous(), u, right=True).clamp(max=n_bins - 1)   # (B, count) bin index
    return j.to(hist.dtype) / n_bins


class LongTermMemory(nn.Module):
    """Every layer's LTM write: ψ and G (Eq. 5; float64, not saved), the update (§3.2-3.3), Memory's ltm_*, the KL."""

    # Copied from model_infformer.py (LongTermMemory.__init__) with ridge_matrix's spread (the authors' padding)
    def __init__(self, config):
        super().__init__()
        self.config = config
        L, M = config.seg_len, config.n_samples
        basis_mu, basis_sigma = gaussian_basis(config.n_basis, config.widths)
        t_first, t_unbounded = ridge_positions(config)
        t_linear = torch.arange(1, M + 1, dtype=torch.float64) / M
        G = lambda t, spread: ridge_matrix(t, basis_mu, basis_sigma, config.ridge_lambda, spread)
        for name, value in (('basis_mu', basis_mu), ('basis_sigma', basis_sigma),
                            ('G_first', G(t_first, 2 * L)),                                   # (L, N)
                            ('G_unbounded', G(t_unbounded, 2 * L + M)),                       # (M + L, N)
                            ('psi_linear', evaluate_basis(t_linear, basis_mu, basis_sigma))):  # ψ(m/M) (M, N)
            self.register_buffer(name, value.float(), persistent=False)

    # Copied from model_infformer.py (LongTermMemory.empty_state)
    def empty_state(self, batch_size, device, dtype):
        """The ltm_* fields of an empty Memory."""
        c = self.config
        zeros = lambda *shape, dt=dtype: torch.zeros(*shape, device=device, dtype=dt)
        return dict(ltm_pending=zeros(batch_size, dt=torch.long), ltm_written=zeros(batch_size, dt=torch.long),
                    ltm_B=zeros(c.n_layer, batch_size, c.n_basis, c.n_embd),
                    ltm_hist=zeros(c.n_layer, batch_size, c.sticky_bins), ltm_rng=rng_seed(batch_size, device))

    # Copied from model_infformer.py (LongTermMemory.next_state)
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

    # Copied from model_infformer.py (LongTermMemory.begin_segment)
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

    # Copied from model_infformer.py (LongTermMemory.due)
    def due(self, memory):
        """The rows with L = seg_len vectors waiting write now (§3.2), emptied first if ltm_reset_len says so."""
        c = self.config
        L, n_wait = c.seg_len, 2 * c.seg_len - 1                                       # n_wait waiting slots
        rows = memory.ltm_pending >= L
        slots = (n_wait - memory.ltm_pending).clamp(max=n_wait - L)[:, None] + torch.arange(L, device=rows.device)
        grow = (memory.ltm_written > 0) & ((memory.ltm_written < c.ltm_reset_len) if c.ltm_reset_len else True)
        return LTMWrite(rows, slots, grow, torch.where(rows, memory.ltm_written * grow + L, memory.ltm_written))

    # Copied from model_infformer.py (LongTermMemory.write)
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

    # Copied from model_infformer.py (LongTermMemory.past_samples)
    def past_samples(self, n, memory, ltm_B):
        """X_past (Eq. 14): ltm_B (B, N, C) at M points m/M or drawn from the histogram (§3.3). -> (B, M, C)"""
        c = self.config
        psi = self.psi_linear.expand(ltm_B.size(0), -1, -1)                            # (B, M, N) ψ(m/M)
        if c.sticky:
            uniforms = counter_uniforms(memory.ltm_rng * c.n_layer + n, c.n_samples)    # (B, M)
            t = sample_sticky_points(memory.ltm_hist[n].to(ltm_B.dtype) + 1e-12, uniforms)   # (B, M)
            psi = evaluate_basis(t, self.basis_mu, self.basis_sigma)                   # (B, M, N)
        return psi @ ltm_B                                                             # x_m = Bᵀψ(t_m)

    # Copied from model_infformer.py (LongTermMemory.flops_per_token)
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
        """Eq. 20 as the authors' GPT-2 code: ½(σ²/σ₀² − log(σ²/σ₀²) − 1 + (μ − μ₀)²/σ₀²), the μ term only when
        mu_0 <= 0 (theirs), meaned over heads, queries and written rows, summed over layers."""
        s0, mu_0 = self.config.sigma_0 ** 2, self.config.mu_0
        pull_mu = lambda mu: (mu - mu_0) ** 2 / s0 if mu_0 <= 0 else 0.0
        kl = sum(0.5 * (s2 / s0 - torch.log(s2 / s0) - 1 + pull_mu(mu)).mean(dim=(1, 2)) for mu, s2 in densities)
        w = (written > 0).to(kl.dtype)                                                 # (B,)
        return (kl * w).sum() / w.sum().clamp(min=1)


# --- GPT-2 (model_gpt2.py's blocks, copied) with each layer's LTM read added to its attention output (Eq. 12) ---


# Copied from model_gpt2.py (MLP)
class MLP(nn.Module):
    """GPT-2's feed-forward: C -> 4C, GELU (its tanh approximation, HF's gelu_new), -> C, dropout."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate='tanh')))


class CausalSelfAttention(nn.Module):
    """GPT-2's multi-head attention, softmax(q kᵀ/√D) v over the segment, plus the layer's LTM read with the same
    queries: Z = Z_T + Z_LTM (Eq. 12), then the dropout (the authors': `a += a_long_term; a = resid_dropout(a)`)."""

    # Copied from model_gpt2.py (CausalSelfAttention.__init__) with the LTM's attention (ltm) added
    def __init__(self, config):
        super().__init__()
        self.n_head, self.d_head = config.n_head, config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)   # W_Q, W_K, W_V side by side
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)       # W_O
        self.attn_dropout_p = config.dropout                        # on the attention probabilities
        self.resid_dropout = nn.Dropout(config.dropout)
        self.ltm = LongTermAttention(config)                         # the read of this layer's LTM (§3.1)

    # Copied from model_gpt2.py (CausalSelfAttention.query_key_value)
    def query_key_value(self, x):
        """Queries, keys and values (B, H, T, D) of the layer's normalised input x (B, T, C)."""
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, self.d_head)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)                 # q, k, v: each (B, H, T, D)

    # Copied from model_gpt2.py (CausalSelfAttention.forward) with Z_LTM added before the dropout
    def forward(self, x, attn_mask=None, cache=None, ltm=None):
        """As model_gpt2.py's, plus ltm: LTMRead or None (no LTM). -> out (B, T, C), (k, v), (μ, σ²) or None"""
        q, k, v = self.query_key_value(x)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)   # (B, H, S+T, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                           dropout_p=self.attn_dropout_p if self.training else 0.0)  # (B, H, T, D)
        B, H, T, D = y.shape
        out = self.c_proj(y.transpose(1, 2).reshape(B, T, H * D))  # Z_T (B, T, C)
        density = None
        if ltm is not None:                                          # masked until the row's LTM holds something
            z_ltm, *density = self.ltm(q, ltm)                       # Z_LTM and (μ, σ²), the queries GPT-2's own
            out = out + z_ltm * ltm.written[:, None, None].to(z_ltm.dtype)   # Z = Z_T + Z_LTM (Eq. 12)
        return self.resid_dropout(out), (k, v), density


class Block(nn.Module):
    """GPT-2's pre-LN block: x + attn(ln_1(x)) (with the LTM read), then x + mlp(ln_2(x))."""

    # Copied from model_gpt2.py (Block.__init__)
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    # Copied from model_gpt2.py (Block.forward) with the LTM read passed and its density returned
    def forward(self, x, attn_mask=None, cache=None, ltm=None):
        a, kv, density = self.attn(self.ln_1(x), attn_mask, cache, ltm)
        x = x + a
        return x + self.mlp(self.ln_2(x)), kv, density


# Copied from model_infformer.py (SegmentStart) with no STM (its keys and validity removed)
class SegmentStart(NamedTuple):
    """What every position of a segment shares, computed once at its start (Model._begin_segment)."""
    ltm_B: list               # n_layer (B, N, C): each layer's LTM after this step's write (§3.2)
    ltm_read: list            # n_layer LTMRead: what each layer reads of it (None when the LTM is off)
    write: LTMWrite           # the rows that wrote, and Memory.ltm_written after it


# Copied from model_gpt2.py (OpenSegment) with model_infformer.py's start, hids and densities added
@dataclass
class OpenSegment:
    """generate()'s segment, from its first token until decode() closes it into the memory, in buffers of fixed shape
    (forward() takes a whole segment in one call). K = seg_len slots, right-aligned: the tokens so far fill the right
    end and padding the left. A step of T tokens slides the window by T (decode() never lets a valid slot fall off),
    so every token's step has the same shapes and writes in place: decode() can capture it. The LTM, written once at
    the segment's start (§3.2), is read by every step and kept by the close."""
    start: SegmentStart      # the LTM after its write: each layer's LTMRead, ltm_B, the LTMWrite
    t: torch.Tensor          # (1,) int64, the tokens so far: the position of the next one
    key_valid: torch.Tensor  # (B, K) bool
    kv: list                 # per layer (k, v), each (B, H, K, D): the keys and values of the K slots
    hids: torch.Tensor       # (n_layer, B, seg_len, C) the layers' inputs of the segment: what its close leaves waiting
    densities: torch.Tensor  # (2, n_layer, B, H, seg_len) μ and σ² of their LTM reads (Eqs. 9-10), for Eq. 16


class Model(nn.Module):
    gpt2_form = True   # train.py --init_from=gpt2... loads OpenAI's weights into it (the LTM's stay at their init)

    # Copied from model_gpt2.py (Model.__init__) with self.long_term (the LTM's write) added
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, C),               # token embedding, tied to lm_head
            wpe=nn.Embedding(config.n_positions, C),              # learned absolute positions
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(C, eps=config.layer_norm_epsilon),
        ))
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight         # tied, as GPT-2's
        self.apply(self._init_weights)
        self.long_term = LongTermMemory(config)                   # the LTM's basis, ridge matrices and write

    # Copied from model_gpt2.py (Model._init_weights)
    def _init_weights(self, module):
        # As GPT-2's (HF GPT2PreTrainedModel): N(0, init_std) weights and embeddings, zero biases, LayerNorm 1 and 0,
        # and the projections into the residual stream (c_proj) N(0, init_std / sqrt(2 n_layer)).
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, (CausalSelfAttention, MLP)):
            nn.init.normal_(module.c_proj.weight, 0.0, std / math.sqrt(2 * self.config.n_layer))
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    # Copied from model_gpt2.py (Model.embed)
    def embed(self, idx, pos):
        """h^0 (B, T, C) of the tokens idx (B, T) at the positions pos (T,): token + position embedding, dropout."""
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    # Copied from model_gpt2.py (Model.logits)
    def logits(self, h):
        """The output layer on the last block's output h (..., C): final LayerNorm, tied softmax weights."""
        return self.lm_head(self.transformer.ln_f(h))              # (..., V)

    # --- memory -------------------------------------------------------------------------------------------

    # Copied from model_infformer.py (Model.init_memory) with no STM
    def init_memory(self, batch_size, device, mem_len=None):
        """Empty memory for batch_size fresh streams; mem_len (train.py's --eval_mem_len) is ignored: no STM."""
        c = self.config
        dtype = self.transformer.wte.weight.dtype
        mem = torch.zeros(c.n_layer, batch_size, 2 * c.seg_len - 1, c.n_embd, device=device, dtype=dtype)
        return Memory(mem=mem, **self.long_term.empty_state(batch_size, device, dtype))

    # Copied from model_infformer.py (Model.reset_memory) with no STM
    def reset_memory(self, memory, mask):
        """Empty the LTM and the waiting vectors of the rows where mask (B,) is True: fresh streams' rows."""
        fresh = self.init_memory(mask.size(0), mask.device)
        rows = lambda x: mask if x.dim() == 1 else mask.view(1, -1, *[1] * (x.dim() - 2))   # (B,) or (n_layer, B, ..)
        return Memory(**{k: torch.where(rows(v), getattr(fresh, k).to(v.dtype), v) for k, v in vars(memory).items()})

    def _begin_segment(self, memory):
        """The LTM after this segment's write of the previous segment's vectors (§3.2). -> SegmentStart"""
        return SegmentStart(*self.long_term.begin_segment(memory, [block.attn.ltm for block in self.transformer.h]))

    # Copied from model_infformer.py (Model._update_memory) with no STM: every new vector waits for the LTM
    def _update_memory(self, memory, start, hids, densities):
        """The layers' inputs hids (n_layer (B, T, C)) wait for the next segment's write (SG), and the LTM moves on."""
        T = hids[0].size(1)
        new = torch.stack([h.detach() for h in hids]).to(memory.mem.dtype)             # (n_layer, B, T, C)
        mem = torch.cat([memory.mem[:, :, T:], new], dim=2)                            # the last 2L-1 of [old ; new]
        return Memory(mem=mem, **self.long_term.next_state(memory, start, densities, T))

    # --- forward ------------------------------------------------------------------------------------------

    # Copied from model_gpt2.py (Model.forward) with model_infformer.py's LTM write, read and KL (Eq. 21) added
    def forward(self, idx, memory, targets=None):
        """idx: (B, T) tokens, T <= seg_len, at positions 0..T-1; memory: Memory. Returns (logits, loss, new_memory,
        aux). The segment's first job is the LTM's write of the previous segment (§3.2), its last to leave its own
        layer inputs for the next one."""
        c = self.config
        B, T = idx.shape
        if T > c.seg_len:
            raise ValueError(f"segment of {T} tokens is longer than seg_len={c.seg_len}")
        start = self._begin_segment(memory)
        h = self.embed(idx, torch.arange(T, device=idx.device))     # (B, T, C)
        hids, densities = [], []
        for n, block in enumerate(self.transformer.h):
            hids.append(h)                                          # the block's input: what its LTM will store
            h, _, density = block(h, ltm=start.ltm_read[n])         # causal over the segment, plus the LTM
            densities.append(density)
        logits = self.logits(h)                                     # (B, T, V)

        new_memory = self._update_memory(memory, start, hids, densities)
        loss, aux = None, {}
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            aux['lm_loss'] = loss.detach()
            if c.ltm and c.kl_weight > 0:
                kl = self.long_term.kl(densities, start.write.written)              # L = L_NLL + λ_KL L_KL (Eq. 21)
                aux['kl_loss'] = kl.detach()
                loss = loss + c.kl_weight * kl
        return logits, loss, new_memory, aux

    # --- bookkeeping for train.py -------------------------------------------------------------------------

    def lr_multipliers(self):
        """The LTM's parameters learn ltm_lr_mult times faster than GPT-2's, as the authors' optimizer groups."""
        return {name: self.config.ltm_lr_mult for name, _ in self.named_parameters() if '.ltm.' in name}

    # Copied from model_xl.py (Model.num_params)
    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    # Copied from model_gpt2.py (Model.flops_per_token) with the LTM's weights left out and its FLOPs added
    def flops_per_token(self, mem_len=None):
        """Training FLOPs per token for MFU (6 a multiply-add with both gradients, 4 with the weight's alone; memory
        detached): model_gpt2.py's count, plus the LTM's write and read (their flops_per_token)."""
        c = self.config
        matrices = sum(p.numel() for name, p in self.named_parameters()      # the weights of products (biases,
                       if name.endswith('weight') and p.dim() > 1 and '.ltm.' not in name)   # norms: none) but the
        matrices -= self.transformer.wpe.weight.numel()                      # LTM's; wpe is a lookup
        attention = 6 * 2 * c.n_layer * c.n_embd * c.seg_len
        ltm = self.long_term.flops_per_token() + self.transformer.h[0].attn.ltm.flops_per_token(c)   # a layer's LTM
        return 6 * matrices + attention + (c.n_layer * ltm if c.ltm else 0)

    # --- generation ---------------------------------------------------------------------------------------

    # Copied from model_gpt2.py (Model.open_segment) with the LTM's write and the hids and densities buffers
    def open_segment(self, memory, tokens, seg=None):
        """A segment's first tokens (B, T), in a new OpenSegment or in seg's buffers (decode() reuses them).
        The LTM's write (§3.2) happens here. -> the logits (B, V) of the last token, the OpenSegment"""
        c, B, device = self.config, tokens.size(0), tokens.device
        kind = device.type                                              # the slots take the projections' dtype
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.lm_head.weight.dtype
        f32 = torch.promote_types(memory.mem.dtype, torch.float32)
        slots = torch.zeros(B, c.n_head, c.seg_len, c.d_head, dtype=dtype, device=device)
        position = torch.zeros(1, dtype=torch.long, device=device)
        seg = refill(seg, OpenSegment(start=self._begin_segment(memory), t=position,
                                      key_valid=torch.zeros(B, c.seg_len, dtype=torch.bool, device=device),
                                      kv=[(slots.clone(), slots.clone()) for _ in self.transformer.h],
                                      hids=memory.mem.new_zeros(c.n_layer, B, c.seg_len, c.n_embd),
                                      densities=memory.mem.new_zeros(2, c.n_layer, B, c.n_head, c.seg_len, dtype=f32)))
        return self.step(tokens, seg, tokens.size(1)), seg

    # Copied from model_gpt2.py (Model.step) with the LTM read and model_infformer.py's hids and densities kept
    def step(self, tokens, seg, filled=None):
        """The next T tokens (B, T) of the open segment seg, which it updates in place. filled: as model_xl.py's (the
        step skips the seg_len - filled padding slots on the left; None: it reads them too, as a graph wants).
        -> logits (B, V) of the last"""
        T, S = tokens.size(1), 0 if filled is None else self.config.seg_len - filled   # S slots skipped
        K = self.config.seg_len - S                                    # the slots it reads
        key_valid = torch.cat([seg.key_valid[:, S + T:], seg.key_valid.new_ones(tokens.shape)], dim=1)   # (B, K)
        causal = torch.ones(T, K, dtype=torch.bool, device=tokens.device).tril(K - T)   # query i sits at K - T + i
        attn_mask = (causal & key_valid[:, None, :])[:, None]         # (B, 1, T, K)
        h = self.embed(tokens, seg.t + torch.arange(T, device=tokens.device))   # positions t .. t+T-1
        hids, densities = [], []
        for n, block in enumerate(self.transformer.h):
            hids.append(h)
            cache = tuple(x[:, :, S + T:] for x in seg.kv[n])         # the slots it reads, less the T oldest
            h, kv, density = block(h, attn_mask, cache, seg.start.ltm_read[n])
            for old, new in zip(seg.kv[n], kv):
                old[:, :, S:] = new
            densities.append(density)
        seg.key_valid[:, S:] = key_valid
        seg.t.add_(T)
        seg.hids[:, :, S:] = torch.cat([seg.hids[:, :, S + T:], torch.stack(hids).to(seg.hids.dtype)], dim=2)
        if self.config.ltm:                                            # (no LTM: no densities)
            new = torch.stack([torch.stack(d) for d in densities], dim=1).to(seg.densities.dtype)   # (2, .., B, H, T)
            seg.densities[..., S:] = torch.cat([seg.densities[..., S + T:], new], dim=-1)
        return self.logits(h[:, -1])                                   # (B, V) logits of the last position

    # Copied from model_infformer.py (Model.close_segment)
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


# -----------------------------------------------------------------------------------------------------------
# Generic blocks, copied verbatim from model_xl.py (tests/test_copies.py keeps them identical).

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
