"""CPU demo: a small Infini-attention model on the offline Gutenberg corpus, the size and budget of
config/xl_demo.py (4 layers, d_model 128, 4 heads of 32, segments of 64, 8 streams, 1000 steps) so the numbers
compare. There is no mem_len: the compressive memory holds everything since it was last emptied.
Trained as the paper trains it (every input of 16 segments starts with a fresh memory, and the loss
backpropagates through the memory over the whole input), scaled to the demo's 512 tokens per step: inputs of
4 segments (reset_every = 4), each one graph (bptt_segments = 4), 2 streams x 4 segments x 64 tokens per step.
With bptt_segments = 1 the memory's writes get no gradient, and without a reset the memory sums every segment a
stream has read, written by older weights. --bptt_segments=1 --reset_every=0 --batch_size=8 is the old demo.
gate_lr_mult = 100: with Adam at lr 1e-3 for 1000 steps β could move by at most ~0.5 (see Model.lr_multipliers).

    python train.py config/infini_demo.py
    python train.py config/infini_demo.py --memory_update=delta --out_dir=out-infini-delta
"""
model = 'infini'
dataset = 'gutenberg'
out_dir = 'out-infini-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 64
memory_update = 'linear'
gate_init = 0.0
gate_lr_mult = 100.0
batch_size = 2
bptt_segments = 4
reset_every = 4
learning_rate = 1e-3
warmup_iters = 50
max_iters = 1000
eval_interval = 500
eval_tokens = 32768
eval_batch_size = 8
grad_clip = 0.25
log_interval = 10
