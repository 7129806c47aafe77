"""CPU demo: a small ∞-former on the offline Gutenberg corpus, the same size and budget as config/xl_demo.py
(4 layers, d_model 128, 4 heads of 32, segment 64, STM 64, 8 streams, 1000 steps), plus a long-term memory of
N = 150 Gaussian RBFs per layer with the authors' language-modelling settings (widths 0.005 and 0.01, τ = 0.5,
λ = 0.5, KL weight 1e-6 toward σ₀ = 0.05) and M = N = 150 samples (their code fixes M = 512, their N).
--sticky=True adds sticky memories (§3.3).

    python train.py config/infformer_demo.py --eval_tokens=0
    python train.py config/infformer_demo.py --eval_only=True --eval_tokens=0 --ltm=False   # same weights, no LTM
"""
model = 'infformer'
dataset = 'gutenberg'
out_dir = 'out-infformer-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 64
mem_len = 64
n_basis = 150
basis_widths = '0.005,0.01'
tau = 0.5
ridge_lambda = 0.5
n_samples = 150
sticky = False
kl_weight = 1e-6
sigma_0 = 0.05
batch_size = 8
learning_rate = 1e-3
warmup_iters = 50
max_iters = 1000
eval_interval = 500
eval_tokens = 32768
eval_batch_size = 8
eval_mem_len = 128
grad_clip = 0.25
log_interval = 10
