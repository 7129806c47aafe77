"""The recipe's control: GPT-2 alone (config/gpt2_demo.py's pretrained model) fine-tuned exactly as the memory forms
are (config/*_gpt2_demo.py: same data, steps, learning rate and seeds), so what a memory form gains over it is the
memory's, not the extra training's. It reads every 64-token segment on its own, at positions 0..63.

    python train.py config/gpt2_demo.py                  # pretrain once: out-gpt2-demo/
    python train.py config/gpt2_finetune_demo.py --seed=1   # then this, and each memory form, on seeds 1, 2, 3
    python bench/demos.py --suite=gpt2                   # or the whole recipe, resumable
"""
model = 'gpt2'
out_dir = 'out-gpt2-finetune-demo'
dataset = 'gutenberg'
init_from = 'gpt2:out-gpt2-demo'   # the GPT-2 of config/gpt2_demo.py (its out_dir: ckpt.pt)
seg_len = 64                  # the segment it was pretrained on
dropout = 0.1                 # as pretrained (GPT-2's, and the ∞-former authors' fine-tuning)
batch_size = 8                # 8 streams x 64 tokens = 512 tokens a step, as pretrained
learning_rate = 5e-5          # the ∞-former authors' fine-tuning rate (their Trainer's default); 3e-4 was tried: worse
min_lr = 0.0                  # their linear decay to 0 (here a cosine)
warmup_iters = 0              # their Trainer's default
weight_decay = 0.0            # ditto
beta2 = 0.999                 # ditto
grad_clip = 1.0               # ditto
max_iters = 300               # 153,600 tokens: about 5 minutes on 2 CPU cores
eval_interval = 300           # evaluate (and save) once, at the end
eval_tokens = 32768           # the first 32,768 validation tokens, as the CPU demos (8 streams, the memory carried)
eval_batch_size = 8
log_interval = 10
