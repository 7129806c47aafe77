"""CPU demo on code: a small ∞-former at config/xl_code_demo.py's calibrated setting (SymPy's source as bytes; 4
layers, d_model 128, 4 heads of 32, segments of 128 bytes, 8 streams, 6,000 steps of 1,024 bytes at 2e-3). STM: the
demo XL's 128 bytes, evaluated with it (as config/infformer_demo.py takes xl_demo's); LTM: config/infformer_demo.py's,
N = 150 Gaussian RBFs per layer with the authors' language-modelling settings (widths 0.005 and 0.01, τ = 0.5,
λ = 0.5, KL weight 1e-6 toward σ₀ = 0.05) and M = N = 150 samples, unchanged at bytes (N stays about the STM's
length). --sticky=True adds sticky memories (§3.3).

    python data/sympy/prepare.py --tokenizer=bytes
    python train.py config/infformer_code_demo.py
    python train.py config/infformer_code_demo.py --sticky=True --out_dir=out-infformer-sticky-code-demo
"""
model = 'infformer'
dataset = 'sympy_bytes'
out_dir = 'out-infformer-code-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 128
mem_len = 128
n_basis = 150
basis_widths = '0.005,0.01'
tau = 0.5
ridge_lambda = 0.5
n_samples = 150
sticky = False
kl_weight = 1e-6
sigma_0 = 0.05
batch_size = 8
learning_rate = 2e-3
warmup_iters = 100
max_iters = 6000
eval_interval = 1500
eval_tokens = 65536
eval_batch_size = 8
eval_mem_len = 128
grad_clip = 0.25
log_interval = 10
