"""CPU demo on code: a small Compressive Transformer at config/xl_code_demo.py's calibrated setting (SymPy's source as
bytes; 4 layers, d_model 128, segments of 128 bytes, 8 streams, 6,000 steps of 1,024 bytes at 2e-3). Memory: the demo
XL's 128 FIFO slots + 192 compressed slots at the paper's PG-19 rate c = 2 (128 + 2 x 192 = 512 bytes back per layer,
as far as XL read with 512 slots, with 320 slots instead of 512; bench/demos.py BYTE_VARIANTS' compressive; c = 3
does not divide the segment), conv f_c trained by the attention-reconstruction loss, as config/compressive_demo.py.
Evaluated with the memory it was trained with. --cmem_len=0 --recon_loss=none is its control (XL's model, memory 128).

    python data/sympy/prepare.py --tokenizer=bytes
    python train.py config/compressive_code_demo.py
"""
model = 'compressive'
dataset = 'sympy_bytes'
out_dir = 'out-compressive-code-demo'
n_layer = 4
n_head = 4
n_embd = 128
d_head = 32
d_inner = 512
dropout = 0.1
seg_len = 128
mem_len = 128
cmem_len = 192
compression_rate = 2
compression = 'conv'
recon_loss = 'attention'
recon_weight = 1.0
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
