"""CPU demo on code: a small LaMemo (model_lamemo.py) at config/xl_code_demo.py's calibrated setting (SymPy's source
as bytes; 4 layers, d_model 128, segments of 128 bytes, 8 streams, 6,000 steps of 1,024 bytes at 2e-3), so it compares
with bench/demos.py --suite=code's XL runs. Memory: 128 bytes, the demo XL's (as config/lamemo_demo.py takes
xl_demo's), evaluated with it: what the look-ahead adds to XL's 128 slots, against XL read with 512 as the ceiling.
attn_kernel: einsum, the default (sdpa returns no log-sum-exps).

    python data/sympy/prepare.py --tokenizer=bytes
    python train.py config/lamemo_code_demo.py
"""
model = 'lamemo'
dataset = 'sympy_bytes'
out_dir = 'out-lamemo-code-demo'
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
max_iters = 6000
eval_interval = 1500
eval_tokens = 65536
eval_batch_size = 8
eval_mem_len = 128
grad_clip = 0.25
log_interval = 10
