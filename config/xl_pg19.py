"""Transformer-XL on PG-19 with the Compressive Transformer paper's segment and memory lengths (seg 512, mem 512;
gradient clipping 0.1). The model size is our choice for one 8-GPU node, not a number from a paper.

    python data/pg19/prepare.py
    torchrun --nproc_per_node=8 train.py config/xl_pg19.py
"""
model = 'xl'
dataset = 'pg19'
out_dir = 'out-xl-pg19'
n_layer = 16
n_head = 8
n_embd = 1024
d_head = 128
d_inner = 4096
dropout = 0.1
seg_len = 512
mem_len = 512
batch_size = 4
gradient_accumulation_steps = 2
learning_rate = 3e-4
warmup_iters = 2000
max_iters = 200000
grad_clip = 0.1
reset_at_doc = True
eval_interval = 5000
eval_mem_len = 1024
