"""CPU demo on code: a small Infini-attention model at config/xl_code_demo.py's calibrated setting (SymPy's source as
bytes; 4 layers, d_model 128, 4 heads of 32, segments of 128 bytes, 6,000 steps of 1,024 bytes at 2e-3). No mem_len:
the compressive memory holds everything since it was last emptied.
Trained as the paper trains it, as config/infini_demo.py scaled to the same 1,024 new bytes a step: inputs of 4
segments (reset_every = 4: 512 bytes, as XL read with 512 slots), each one graph (bptt_segments = 4, the loss
backpropagates through the memory over the input), 2 streams x 4 segments x 128 bytes a step; the validation loss
also empties the memory every 4 segments. --batch_size=8 --bptt_segments=1 is the feeding control (8 streams, no BPTT).
gate_lr_mult = 1 (infini_demo's 100 let β move at all in 1,000 steps at 1e-3): Σ lr_t ≈ 6 over these 6,000 steps
already lets Adam take sigmoid(β) to 0 or 1, and 100 would move it ~0.2 a step.

    python data/sympy/prepare.py --tokenizer=bytes
    python train.py config/infini_code_demo.py
    python train.py config/infini_code_demo.py --memory_update=delta --out_dir=out-infini-delta-code-demo
"""
model = 'infini'
dataset = 'sympy_bytes'
out_dir = 'out-infini-code-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 128
memory_update = 'linear'
gate_init = 0.0
gate_lr_mult = 1.0
batch_size = 2
bptt_segments = 4
reset_every = 4
learning_rate = 2e-3
warmup_iters = 100
max_iters = 6000
eval_interval = 1500
eval_tokens = 65536
eval_batch_size = 8
grad_clip = 0.25
log_interval = 10
