"""Infini-attention's continual pre-training (Munkhdalai et al. 2024: an existing LM's attention gets the compressive
memory and goes on training) at CPU size: config/gpt2_demo.py's pretrained GPT-2 plus the memory in every layer,
trained as the paper trains: every input of 4 segments starts with an empty memory and the loss backpropagates
through the memory over the whole input (bptt_segments = reset_every = 4, as config/infini_demo.py). To keep the
recipe's 512 tokens a step that is 2 streams x 4 segments x 64; the control fed the same way is GPT-2 alone with
--batch_size=2 --bptt_segments=4 --reset_every=4 (bench/demos.py --suite=gpt2: gpt2_2x4). Same steps and learning
rate as config/gpt2_finetune_demo.py. The gate β starts at -4 (98% GPT-2's attention) and learns 100x faster (the paper
gives neither). Evaluation empties the memory every 4 segments too, as trained. --memory_update=delta: Eq. 5.

    python train.py config/infini_gpt2_demo.py --seed=1
    python train.py config/infini_gpt2_demo.py --seed=1 --memory_update=delta --out_dir=out-infini-delta-gpt2-demo
"""
model = 'infini_gpt2'
out_dir = 'out-infini-gpt2-demo'
dataset = 'gutenberg'
init_from = 'gpt2:out-gpt2-demo'   # the GPT-2 of config/gpt2_demo.py (its out_dir: ckpt.pt)
seg_len = 64                  # the segment it was pretrained on
dropout = 0.1                 # as pretrained (GPT-2's, and the ∞-former authors' fine-tuning)
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
batch_size = 2                # 2 streams x 4 segments x 64 = 512 tokens a step
bptt_segments = 4             # the loss backpropagates through the memory over an input of 4 segments
reset_every = 4               # ... and every input starts with an empty memory
memory_update = 'linear'
gate_init = -4.0
gate_lr_mult = 100.0
