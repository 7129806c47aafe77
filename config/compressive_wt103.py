"""Compressive Transformer on WikiText-103 at the size and schedule of config/xl_wt103.py (Transformer-XL base:
16 layers, d_model 410, 10 heads of 41, d_inner 2100, segment 150, Adam 2.5e-4 with cosine decay over 400k steps to
1e-6, clip 0.25), so the two compare: the FIFO memory of 150 is kept and a compressed memory of 150 slots at rate
c = 3 (the paper's rate on enwik8) is added, reaching 150 + 3 x 150 = 600 positions back with 300 memory keys. The
paper's own WikiText-103 model is not reproduced here. Evaluation: segments of 63 with a FIFO memory of 639
(config/xl_wt103.py's 64 and 640, rounded down to multiples of c = 3, so every evicted state is compressed).
Differences from the paper as in config/xl_wt103.py (GPT-2 BPE with a full softmax: compare word perplexity).

    python data/wikitext103/prepare.py
    torchrun --nproc_per_node=4 train.py config/compressive_wt103.py --batch_size=15
"""
model = 'compressive'
dataset = 'wikitext103'
out_dir = 'out-compressive-wt103'
n_layer = 16
n_head = 10
n_embd = 410
d_head = 41
d_inner = 2100
dropout = 0.1
dropatt = 0.0
seg_len = 150
mem_len = 150
cmem_len = 150
compression_rate = 3
compression = 'conv'
recon_loss = 'attention'
recon_weight = 1.0
batch_size = 60
learning_rate = 2.5e-4
min_lr = 1e-6
warmup_iters = 0
max_iters = 400000
grad_clip = 0.25
eval_interval = 4000
eval_seg_len = 63
eval_mem_len = 639
eval_batch_size = 10
