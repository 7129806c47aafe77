"""∞-former's language-modelling setting on WikiText-103 (Martins et al., 2022, §4.2, Table 1: GPT-2 16.85 -> ∞-former
16.64, with sticky memories 16.61 perplexity): GPT-2 small fine-tuned with the continuous long-term memory. §4.2 gives
L = 512, N = 512 and the memory threshold of 2,048 tokens; the rest is the authors' finetune_gpt2
(deep-spin/infinite-former): its README command (batch 1, block 512, --kl_regularizer --kl_m=.000001), its
config.json and long_term_attention.py constants, and the Hugging Face Trainer defaults that command leaves in place
(AdamW 5e-5, the LTM's parameters 2.5e-4, no warmup, no weight decay, gradient clipping 1.0, one epoch). Differences:
their schedule decays linearly to 0, train.py's by a cosine; they train in float32, train.py in bf16 autocast on
CUDA; the paper's App. C.2 is not in our copy of the paper, so none of this is checked against it. The paper reports
token-level perplexity of GPT-2's BPE (eval's 'ppl'), not word-level.

    python data/wikitext103/prepare.py
    python train.py config/infformer_gpt2_wt103.py                      # Table 1's "∞-former" row
    python train.py config/infformer_gpt2_wt103.py --sticky=True        # "∞-former (SM)" (their README's config)
    python train.py config/infformer_gpt2_wt103.py --ltm=False          # GPT-2 alone, fine-tuned the same way
"""
model = 'infformer_gpt2'
dataset = 'wikitext103'
out_dir = 'out-infformer-gpt2-wt103'
init_from = 'gpt2'            # GPT-2 small (§4.2; their --model_name_or_path=gpt2)
seg_len = 512                 # L = 512 (§4.2; their --block_size=512)
dropout = 0.1                 # GPT-2's embd/attn/resid_pdrop (their config.json)
n_basis = 512                 # N = 512 Gaussian RBFs (§4.2; config.json long_term_attention_basis)
basis_widths = '0.005,0.01'   # long_term_attention.py sigmas
ridge_lambda = 0.5            # long_term_attention.py ridge_penalty
unbounded = True              # config.json infinite_memory
tau = 0.5                     # long_term_attention.py tau
n_samples = 512               # long_term_attention.py nb_samples
ltm_reset_len = 2048          # the memory threshold of 2,048 tokens (§4.2; long_term_attention.py mem_threshold)
sticky = False                # Table 1's "∞-former" row; True: its "(SM)" row (their README's sticky_mem config)
sticky_bins = 128             # long_term_attention.py bins: linspace(0, 1, 129)
cnn_gate = True               # config.json mask=true, mask_type='cnn'
kl_weight = 1e-6              # README --kl_regularizer --kl_m=.000001
sigma_0 = 0.05                # config.json sigma_0
mu_0 = -1.0                   # config.json mu_0
sigma_sq_min = 1e-4           # long_term_attention.py clamp(sigma_sq, min=1e-4)
ltm_lr_mult = 5.0             # training_args.py learning_rate_ltm 2.5e-4 over learning_rate 5e-5
batch_size = 1                # README --per_device_train_batch_size=1
gradient_accumulation_steps = 1   # Trainer default
learning_rate = 5e-5          # Trainer default (the README passes none)
min_lr = 0.0                  # Trainer default: linear decay to 0 (here a cosine)
warmup_iters = 0              # Trainer default
weight_decay = 0.0            # Trainer default
beta1 = 0.9                   # Trainer default adam_beta1
beta2 = 0.999                 # Trainer default adam_beta2
grad_clip = 1.0               # Trainer default max_grad_norm
max_iters = 234000            # one epoch (Trainer's num_train_epochs=1): ≈ 0.12B tokens (data/README.md) / 512
eval_batch_size = 1           # README --per_device_eval_batch_size=1: one stream, the memory carried through it
eval_interval = 10000         # ours (their Trainer evaluates once, after training)
