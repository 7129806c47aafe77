"""The paper's sorting task (§4.1, authors' sorting/run_sort_inftyformer.sh): a sequence of tokens drawn from a
distribution over 20 symbols that drifts along the sequence (p = α p₀ + (1 − α) p₁, α going from 0 to 1), followed
by the symbols sorted by decreasing frequency; the model must output that order. Sequences of 4,000, 8,000 or
16,000 tokens; a 3-layer transformer (6 heads of 50, d_model 300, d_inner 300) reads them in segments of 1,024
with an STM of 1,024 and an LTM of N basis functions (the paper: N = 1,024; the run script: 512), the synthetic
basis widths {0.01, 0.05}, τ = 0.75, ridge λ = 1, M = 512 samples (sorting/long_term_attention.py:72-78), the
CNN gate, KL 1e-6 toward σ₀ = 0.05, σ² floored at 1e-6 (their sorting code; 1e-4 in their LM code); Adam 2e-4,
20,000 steps of 8 sequences. Their code empties the LTM at each new sequence (reset_memory here).

Used by bench/ (the data and the accuracy metric live there, not in train.py): a reader takes the model fields
below (the names of model_infformer.Config) and the training fields (seq_len, n_symbols, max_iters, batch_size,
learning_rate) from this file. vocab_size 32 = the 20 symbols plus room for the separator/end markers the
benchmark defines. `python train.py config/infformer_sorting.py` needs a data/sorting/ prepared by bench/.
"""
model = 'infformer'
dataset = 'sorting'
out_dir = 'out-infformer-sorting'
# the task (read by bench/, not train.py flags)
# seq_len = 8000, n_symbols = 20
vocab_size = 32
n_layer = 3
n_head = 6
n_embd = 300
d_head = 50
d_inner = 300
dropout = 0.1
dropatt = 0.0
seg_len = 1024
mem_len = 1024
n_basis = 1024
basis_widths = '0.01,0.05'
tau = 0.75
ridge_lambda = 1.0
n_samples = 512
sticky = False
cnn_gate = True
kl_weight = 1e-6
sigma_sq_min = 1e-6
sigma_0 = 0.05
batch_size = 8
learning_rate = 2e-4
warmup_iters = 0
max_iters = 20000
grad_clip = 0.25
