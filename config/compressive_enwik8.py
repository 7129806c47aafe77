"""Compressive Transformer on enwik8, the paper's memory setting (Rae et al., 2020, §5.3): compression rate c = 3,
the conv compression function trained by the attention-reconstruction loss (Table 5's best on enwik8), gradient
clipping 0.1, a 24-layer model of d_model 1024 with 8 heads. The paper reports 0.97 bpc on the enwik8 test set
(Table 4). Our CPU numbers are not that.
The segment, memory and compressed-memory lengths (768 each) are the ones we read for the paper's enwik8 model;
the text of §5.3 could not be checked here, so verify them against the paper before quoting a reproduction.
Temporal range 768 + 3 x 768 = 3,072 positions per layer with 1,536 memory keys. d_inner, the learning rate and the
schedule are ours (as config/compressive_pg19.py), and 256 byte values are the vocabulary (see config/xl_enwik8.py).

    python data/enwik8/prepare.py
    torchrun --nproc_per_node=8 train.py config/compressive_enwik8.py
"""
model = 'compressive'
dataset = 'enwik8'
out_dir = 'out-compressive-enwik8'
n_layer = 24
n_head = 8
n_embd = 1024
d_head = 128
d_inner = 4096
dropout = 0.1
seg_len = 768
mem_len = 768
cmem_len = 768
compression_rate = 3
compression = 'conv'
recon_loss = 'attention'
recon_weight = 1.0
batch_size = 2
gradient_accumulation_steps = 2
learning_rate = 3e-4
warmup_iters = 2000
max_iters = 200000
grad_clip = 0.1
eval_interval = 5000
