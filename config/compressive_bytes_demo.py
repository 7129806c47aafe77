"""CPU demo at byte level: a small Compressive Transformer on the offline Gutenberg corpus read as UTF-8 bytes, with
the paper's enwik8 compression rate c = 3 and its shape seg = mem = cmem (here 96 each: 96 + 3 x 96 = 384 bytes back
per layer, 192 memory keys), conv compression trained by the attention-reconstruction loss. The size and budget of
bench/compression.py, which runs every f_c and the cmem_len=0 control on 3 seeds.

    python data/gutenberg/prepare.py --tokenizer=bytes
    python train.py config/compressive_bytes_demo.py
"""
model = 'compressive'
dataset = 'gutenberg_bytes'
out_dir = 'out-compressive-bytes-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 96
mem_len = 96
cmem_len = 96
compression_rate = 3
compression = 'conv'
recon_loss = 'attention'
recon_weight = 1.0
batch_size = 8
learning_rate = 2e-3
warmup_iters = 100
max_iters = 600
eval_interval = 600
eval_tokens = 0
eval_batch_size = 16
grad_clip = 0.25
log_interval = 10
