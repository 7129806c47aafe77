"""CPU demo: a small Compressive Transformer on the offline Gutenberg corpus, the size and budget of
config/xl_demo.py (4 layers, d_model 128, segment 64, 8 streams, 1000 steps) so the two compare.
Memory: 64 FIFO slots (as xl_demo) + 32 compressed slots at rate 2 (conv, attention-reconstruction loss), so
96 keys reach 128 positions back. Evaluated with the memory it was trained with.

    python train.py config/compressive_demo.py --eval_tokens=0
"""
model = 'compressive'
dataset = 'gutenberg'
out_dir = 'out-compressive-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 64
mem_len = 64
cmem_len = 32
compression_rate = 2
compression = 'conv'
recon_loss = 'attention'
recon_weight = 1.0
batch_size = 8
learning_rate = 1e-3
warmup_iters = 50
max_iters = 1000
eval_interval = 500
eval_tokens = 32768
eval_batch_size = 8
eval_mem_len = 64
grad_clip = 0.25
log_interval = 10
