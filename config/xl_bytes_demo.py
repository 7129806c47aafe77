"""CPU demo at byte level: a small Transformer-XL on the offline Gutenberg corpus read as UTF-8 bytes (vocabulary 256,
taken from data/gutenberg_bytes/meta.json), reported in bits per character. Minutes on 2 cores.

    python data/gutenberg/prepare.py --tokenizer=bytes
    python train.py config/xl_bytes_demo.py
    python sample.py --out_dir=out-xl-bytes-demo --start="ROMEO. " --max_new_tokens=300
"""
model = 'xl'
dataset = 'gutenberg_bytes'
out_dir = 'out-xl-bytes-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 128
mem_len = 128
batch_size = 8
learning_rate = 2e-3
warmup_iters = 100
max_iters = 1500
eval_interval = 500
eval_tokens = 65536
eval_batch_size = 8
eval_mem_len = 256
grad_clip = 0.25
log_interval = 10
