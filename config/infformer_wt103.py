"""∞-former on WikiText-103 trained from scratch: our own setting. The paper trains no language model from scratch
(its §4.1 sorting models are Transformer-XL based; its §4.2 language models fine-tune GPT-2 small with inputs of 512,
N = 512 basis functions and a memory threshold of 2,048 tokens: config/infformer_gpt2_wt103.py). Here the
long-term memory is added to Transformer-XL base (config/xl_wt103.py: 16 layers, d_model 410, 10 heads of 41, d_inner
2100, segment 150, STM 150, u and v per layer) and the whole model trained from random weights, to compare with it.
What it takes from the paper and the authors' code: N = 150 Gaussian RBFs per layer with their language-modelling
basis widths {0.005, 0.01}, τ = 0.5 and ridge λ = 0.5 (finetune_gpt2 long_term_attention.py), the CNN gate, and
the KL regulariser toward σ₀ = 0.05 with weight 1e-6 (their README's --kl_m; the KL is summed over layers as
theirs). M = 150 samples: their code fixes M = 512, equal to their GPT-2 runs' N and L, so here M = N = L.
Optimisation as config/xl_wt103.py (Adam 2.5e-4, cosine over 400k steps to 1e-6, clip 0.25, 60 streams per step).
Not checked against the paper's appendix C.2 (the copy of the paper this project was given lacks it). Their GPT-2
runs also empty the LTM every 2,048 tokens (the paper's "memory threshold"): --ltm_reset_len=2048.
Tokens: GPT-2 BPE with a full softmax (config/xl_wt103.py's; compare word-level perplexity).

    python data/wikitext103/prepare.py
    torchrun --nproc_per_node=4 train.py config/infformer_wt103.py --batch_size=15
    # sticky memories: add --sticky=True; without the LTM on the same weights: --eval_only=True --ltm=False
"""
model = 'infformer'
dataset = 'wikitext103'
out_dir = 'out-infformer-wt103'
n_layer = 16
n_head = 10
n_embd = 410
d_head = 41
d_inner = 2100
dropout = 0.1
dropatt = 0.0
seg_len = 150
mem_len = 150
n_basis = 150
basis_widths = '0.005,0.01'
tau = 0.5
ridge_lambda = 0.5
n_samples = 150
sticky = False
sticky_bins = 128
cnn_gate = True
ltm_reset_len = 0       # the authors' GPT-2 runs: 2048 (long_term_attention.py mem_threshold)
kl_weight = 1e-6
sigma_0 = 0.05
batch_size = 60
learning_rate = 2.5e-4
min_lr = 1e-6
warmup_iters = 0
max_iters = 400000
grad_clip = 0.25
eval_interval = 4000
eval_batch_size = 10
