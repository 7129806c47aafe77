"""Compressive Transformer on PG-19 with the paper's memory setting (Rae et al., 2020): segment, memory
and compressed memory of 512 each, compression rate c = 2, gradient clipping 0.1; conv compression trained by
the attention-reconstruction loss (the paper's best, Table 5). Temporal range 512 + 2 x 512 = 1,536 positions
per layer with 1,024 memory keys. The model size is ours (as config/xl_pg19.py, so the two compare), not the
paper's.

    python data/pg19/prepare.py
    torchrun --nproc_per_node=8 train.py config/compressive_pg19.py
"""
model = 'compressive'
dataset = 'pg19'
out_dir = 'out-compressive-pg19'
n_layer = 16
n_head = 8
n_embd = 1024
d_head = 128
d_inner = 4096
dropout = 0.1
seg_len = 512
mem_len = 512
cmem_len = 512
compression_rate = 2
compression = 'conv'
recon_loss = 'attention'
recon_weight = 1.0
batch_size = 4
gradient_accumulation_steps = 2
learning_rate = 3e-4
warmup_iters = 2000
max_iters = 200000
grad_clip = 0.1
reset_at_doc = True
eval_interval = 5000
