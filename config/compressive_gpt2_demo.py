"""The ∞-former paper's Compressive baseline (§4.2: GPT-2 fine-tuned with a compressed memory of 512 slots at L = 512,
ALiBi's bias on the memory) at CPU size: config/gpt2_demo.py's pretrained GPT-2 plus a compressed memory, fine-tuned
as config/gpt2_finetune_demo.py (the control). Scaled to the demo's segment of 64: 64 compressed slots (as many as the
∞-former demo's N = 64, as the paper matches 512 with 512) at rate 2, so the memory reaches 128 tokens back; no FIFO
memory (mem_len = 0, as config/compressive_gpt2_pg19.py), conv f_c with the attention-reconstruction loss, f_c and
its decoder at 5x the learning rate (the authors' LTM group).

    python train.py config/compressive_gpt2_demo.py --seed=1
"""
model = 'compressive_gpt2'
out_dir = 'out-compressive-gpt2-demo'
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
cmem_len = 64
mem_len = 0
compression_rate = 2
compression = 'conv'
recon_loss = 'attention'
compress_lr_mult = 5.0
