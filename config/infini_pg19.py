"""Infini-attention on PG-19 as the paper trains its long-context language models (§4.1, "Long-context language
modeling"; its PG-19 and Arxiv-math runs): 12 layers, 8 heads of 128, FFN 4096, segments of N = 2048, inputs of
32,768 tokens, so the memory is unrolled over 16 segments. Here every input of 16 segments starts with a fresh
memory (reset_every = 16, as an input does in the paper) and the loss backpropagates through the memory over all
16 of them (bptt_segments = 16). d_model = 8 x 128 = 1024. The paper's 1M passkey and 500K book summarisation
runs (1B and 8B LLMs, continual pre-training) are other settings. (The copy of the paper this project was given
is a summary without §4: check these numbers against §4.1 before quoting a reproduction.)
Our choices, not the paper's: AdamW with Transformer-XL-style schedule and clipping (the paper's optimizer
settings are not used), 2 streams per GPU (8 GPUs: 16 streams x 32,768 = 524,288 tokens per step), about as
many tokens in all as config/xl_pg19.py (12,500 steps, ~6.6B tokens), the memory also emptied at book starts
(reset_at_doc: no input reads two books through one memory), and gate_lr_mult = 10: β's total travel, sum over
steps of lr x multiplier, is then ~20, far more than the ~5 that takes sigmoid(β) from 0.5 to 0.01 or 0.99 (with
multiplier 1 it would be ~2). Evaluation resets the memory every 16 segments too (train.py's reset_every applies
to both). Not run here (no GPU).

    python data/pg19/prepare.py
    torchrun --nproc_per_node=8 train.py config/infini_pg19.py
"""
model = 'infini'
dataset = 'pg19'
out_dir = 'out-infini-pg19'
n_layer = 12
n_head = 8
n_embd = 1024
d_head = 128
d_inner = 4096
dropout = 0.1
seg_len = 2048
memory_update = 'linear'
gate_init = 0.0
gate_lr_mult = 10.0
pre_lnorm = True
batch_size = 2
bptt_segments = 16
reset_every = 16
learning_rate = 3e-4
warmup_iters = 1000
max_iters = 12500
grad_clip = 0.1
reset_at_doc = True
eval_interval = 1000
