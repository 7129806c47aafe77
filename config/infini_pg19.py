"""Infini-attention on PG-19, the paper's long-context LM setting (§4.1): 12 layers, 8 heads of 128, FFN 4096,
segments of N = 2048, trained on inputs of 32,768 tokens so the memory is unrolled over 16 segments (here
bptt_segments = 16: backprop through the memory of all 16, then detach). d_model = 8 x 128 = 1024.
Our choices, not the paper's: AdamW with Transformer-XL-style schedule and clipping (the paper's optimizer
settings are not used), 2 streams per GPU (8 GPUs: 16 streams x 32,768 = 524,288 tokens per step), about as
many tokens in all as config/xl_pg19.py (12,500 steps, ~6.6B tokens), memory emptied at book starts, and
gate_lr_mult = 10: β's total travel, sum over steps of lr x multiplier, is then ~20, far more than the ~5 that
takes sigmoid(β) from 0.5 to 0.01 or 0.99 (with multiplier 1 it would be ~2). Not run here (no GPU).

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
learning_rate = 3e-4
warmup_iters = 1000
max_iters = 12500
grad_clip = 0.1
reset_at_doc = True
eval_interval = 1000
