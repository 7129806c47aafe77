"""Transformer-XL base on WikiText-103 as the authors' TensorFlow script trains it (kimiyoung/transformer-xl
tf/scripts/wt103_base_gpu.sh): 16 layers, d_model 410, 10 heads of 41, d_inner 2100, dropout 0.1, dropatt 0,
u and v per layer (--untie_r=True), segment 150 / memory 150, 60 streams per step, Adam 2.5e-4 without warm-up,
cosine decay over 400k steps to 0.004 x 2.5e-4 = 1e-6 (train_gpu.py's min_lr_ratio), clip 0.25 (its default),
a checkpoint every 4,000 steps. Evaluation uses the script's test lengths, segments of 64 with a memory of 640.
(Their PyTorch script, pytorch/run_wt103_base.sh, trains 200k steps with one u, v pair shared by all layers.)
Differences from the script: GPT-2 BPE tokens with a full softmax instead of the 267k-word vocabulary with an
adaptive softmax (so compare word-level perplexity, which train.py reports from meta.json's word count); its test
evaluation also sets clamp_len=400 and same_length, model flags here: `--eval_only=True --eval_split=test
--clamp_len=400 --same_length=True` on the trained checkpoint.

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
untie_r = True
batch_size = 60
learning_rate = 2.5e-4
min_lr = 1e-6
warmup_iters = 0
max_iters = 400000
grad_clip = 0.25
eval_interval = 4000
eval_seg_len = 64
eval_mem_len = 640
eval_batch_size = 10
