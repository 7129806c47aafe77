"""The ∞-former's language-model recipe (Martins et al. 2022, §4.2: GPT-2 fine-tuned with the long-term memory) at
CPU size: config/gpt2_demo.py's pretrained GPT-2 plus an LTM in every layer, fine-tuned as config/gpt2_finetune_demo.py
(the control). §4.2's L = N = M = 512 with a 2,048-token threshold, scaled to the demo's segment of L = 64:
N = 64 basis functions (N = L, as the paper), M = 128 samples of the old signal, the memory emptied once it holds
512 tokens (8 segments; the paper's threshold is 4 segments). The LTM learns 5x faster (the authors' 2.5e-4 over
5e-5). --sticky=True: sticky memories (§3.3, Table 1's "∞-former (SM)").

    python train.py config/infformer_gpt2_demo.py --seed=1
    python train.py config/infformer_gpt2_demo.py --seed=1 --sticky=True --out_dir=out-infformer-sticky-gpt2-demo
    python train.py config/infformer_gpt2_demo.py --eval_only=True --eval_reset_memory=True   # its LTM emptied
"""
model = 'infformer_gpt2'
out_dir = 'out-infformer-gpt2-demo'
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
n_basis = 64                  # N = L (the paper's N = L = 512)
n_samples = 128               # M, scaled from the paper's 512 with N (their code fixes M = 512)
ltm_reset_len = 512           # the paper's memory threshold (2,048 = 4 segments), here 8 segments of 64
sticky = False
ltm_lr_mult = 5.0             # the authors' learning_rate_ltm 2.5e-4 / learning_rate 5e-5
