"""CPU demo on code: a small Transformer-XL on the offline code corpus (SymPy's source as UTF-8 bytes,
data/sympy/prepare.py), the setting bench/demos.py --suite=code compares memories at: 4 layers, segments of 128
bytes, 6,000 steps of 1,024 bytes, ~30 min on one CPU thread (mem_len=0: ~20 min). Trained as the authors train
Transformer-XL, with a memory as long as the segment (mem_len = seg_len: their WikiText-103 base script trains with
150/150, enwik8's with 512/512), and evaluated with a 4x longer one (eval_mem_len 512: their WikiText-103 evaluation
reads 640 after training with 150), which on this code reads where the copy sources lie (README, "Memory on code").

    python data/sympy/prepare.py --tokenizer=bytes
    python train.py config/xl_code_demo.py                              # XL, evaluated with 512 slots
    python train.py config/xl_code_demo.py --mem_len=0 --eval_mem_len=0 --out_dir=out-code-nomem   # no memory
    python sample.py --out_dir=out-xl-code-demo --start="def " --max_new_tokens=300
"""
model = 'xl'
dataset = 'sympy_bytes'
out_dir = 'out-xl-code-demo'
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
eval_mem_len = 512
grad_clip = 0.25
log_interval = 10
