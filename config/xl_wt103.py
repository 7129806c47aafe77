"""Transformer-XL base on WikiText-103, the paper's setting (kimiyoung/transformer-xl run_wt103_base.sh):
16 layers, d_model 410, 10 heads of 41, d_inner 2100, dropout 0.1, seg 150 / mem 150, Adam lr 2.5e-4 with
cosine decay over 200k steps, clip 0.25, 60 streams per step. Evaluation uses a longer memory (640) on shorter
segments (64), as the paper's eval script does.
Differences from the paper: GPT-2 BPE tokens with a full softmax instead of the 267k-word vocabulary with
adaptive input/softmax (so compare word-level perplexity, which train.py reports from meta.json's word count);
the paper's eval also sets clamp_len=400 and same_length, which are model flags here: use them with
`--eval_only=True --clamp_len=400 --same_length=True` on the trained checkpoint.

    python data/wikitext103/prepare.py
    torchrun --nproc_per_node=4 train.py config/xl_wt103.py --batch_size=15    # 4 x 15 = 60 streams
"""
model = 'xl'
dataset = 'wikitext103'
out_dir = 'out-xl-wt103'
n_layer = 16
n_head = 10
n_embd = 410
d_head = 41
d_inner = 2100
dropout = 0.1
dropatt = 0.0
seg_len = 150
mem_len = 150
batch_size = 60
learning_rate = 2.5e-4
min_lr = 0.0
warmup_iters = 0
max_iters = 200000
grad_clip = 0.25
eval_interval = 4000
eval_seg_len = 64
eval_mem_len = 640
eval_batch_size = 10
