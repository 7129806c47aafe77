"""The pretraining half of the papers' recipe at CPU size (make the GPT-2 that the *_gpt2_demo configs fine-tune):
GPT-2 alone, 4 layers, d_model 128, segments of 64 tokens, 1,500 steps of 512 tokens (768K tokens, a quarter of
the offline corpus) on gutenberg, about 18 minutes on 2 CPU cores. The size is the CPU demos' (config/xl_demo.py),
so the fine-tuned forms stand beside the README's first table, and a fine-tune of 300 steps stays a few minutes.
n_positions = 128: the demos read 64-token segments; 128 leaves room for a longer --seg_len when fine-tuning.
Dropout, AdamW and the schedule are nanoGPT's small-model settings (lr 1e-3, weight decay 0.1, beta2 0.99, clip 1.0).

    python train.py config/gpt2_demo.py                                  # out-gpt2-demo/
    python train.py config/infformer_gpt2_demo.py                        # ... then a memory form from it
    python pretrained.py export --out_dir=out-gpt2-demo --to=gpt2-demo   # Hugging Face's format (config.json, safetensors)
"""
model = 'gpt2'
dataset = 'gutenberg'
out_dir = 'out-gpt2-demo'
n_layer = 4
n_head = 4
n_embd = 128
n_positions = 128
seg_len = 64
dropout = 0.1
batch_size = 8
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 50
weight_decay = 0.1
beta2 = 0.99
grad_clip = 1.0
max_iters = 1500
eval_interval = 500
eval_tokens = 0               # the whole validation split (137,655 predictions)
log_interval = 10
