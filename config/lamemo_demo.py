"""CPU demo: a small LaMemo (model_lamemo.py) on the offline Gutenberg corpus, the size and budget of
config/xl_demo.py (4 layers, d_model 128, segment 64, memory 64, 8 streams, 1000 steps) so the two compare."""
model = 'lamemo'
dataset = 'gutenberg'
out_dir = 'out-lamemo-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 64
mem_len = 64
batch_size = 8
learning_rate = 1e-3
warmup_iters = 50
max_iters = 1000
eval_interval = 500
eval_tokens = 32768
eval_batch_size = 8
eval_mem_len = 128
grad_clip = 0.25
log_interval = 10
