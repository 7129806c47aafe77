"""GPT-2 small alone on PG-19, read in segments of L = 512 tokens: the "GPT-2" row of the ∞-former paper's Table 1
(§4.2: GPT-2 small fine-tuned on the first 2,000 books of PG-19, ≈ 200M tokens; the paper reports test perplexity
33.44 for it). What §4.2 leaves open comes from the authors' finetune_gpt2 README command (deep-spin/infinite-former:
run_clm.py --per_device_train_batch_size=1 --block_size=512, the other values the defaults of its transformers
4.5 Trainer: AdamW lr 5e-5, no warmup, no weight decay, gradient clipping 1.0, one epoch, blocks read in order).
One difference: their learning rate decays linearly to 0, ours follows train.py's cosine to 0.
max_iters is one epoch of the paper's ≈ 200M tokens at 512 a step; change it to your copy's train tokens / 512.

    python data/pg19/prepare.py --books=2000          # data/pg19_2000/
    python train.py config/gpt2_pg19.py               # OpenAI's GPT-2 small from the hub (pretrained.py)
"""
model = 'gpt2'
init_from = 'gpt2'
dataset = 'pg19_2000'
out_dir = 'out-gpt2-pg19'
seg_len = 512
dropout = 0.1
batch_size = 1
gradient_accumulation_steps = 1
learning_rate = 5e-5
min_lr = 0.0
warmup_iters = 0
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.999
grad_clip = 1.0
max_iters = 390000
eval_interval = 10000
eval_batch_size = 1
