"""The ∞-former paper's Compressive baseline on PG-19 (Martins et al. 2022, §4.2, Table 1: perplexity 33.09 against
GPT-2's 33.44): GPT-2 small fine-tuned with a compressed memory of 512 slots and ALiBi's bias on them, inputs of
L = 512 tokens, on the first 2,000 books of PG-19's training split (≈ 200M tokens). §4.2 gives L and the memory's
size; the rest is the authors' finetune_gpt2 (deep-spin/infinite-former): their README's run_clm.py command
(batch 1, block 512), their trainer's defaults and its compression switches. Their compressive model's own code is
not in the repository: mem_len = 0 and conv compression are ours (model_compressive_gpt2.py's docstring says why).
Their schedule is linear decay to 0; train.py's is cosine to min_lr.

    python data/pg19/prepare.py --books=2000          # data/pg19_2000/
    python train.py config/compressive_gpt2_pg19.py
"""
model = 'compressive_gpt2'
init_from = 'gpt2'           # the paper fine-tunes GPT-2 small (--model_name_or_path=gpt2)
dataset = 'pg19_2000'        # data/pg19/prepare.py --books=2000: the paper's subset
out_dir = 'out-compressive-gpt2-pg19'
seg_len = 512                # §4.2: input size L = 512 (--block_size=512)
cmem_len = 512               # §4.2: "a compressed memory of size 512"
mem_len = 0                  # ours: §4.2 names no uncompressed memory (the budget of the ∞-former's N = 512)
compression_rate = 2         # finetune_gpt2/infinite_memory_transformer/config.json: compression_rate 2
compression = 'conv'         # ours: Rae et al.'s best (their Table 5); the authors' choice is not published
recon_loss = 'attention'     # ours, as compression: Rae et al.'s attention-reconstruction loss (Algorithm 2)
recon_weight = 1.0           # their trainer: (loss + c_loss).backward()
compress_lr_mult = 5.0       # their trainer: "compress" parameters at learning_rate_ltm 2.5e-4 = 5 x 5e-5
dropout = 0.1                # config.json: embd_pdrop = attn_pdrop = resid_pdrop = 0.1
batch_size = 1               # README: --per_device_train_batch_size=1
gradient_accumulation_steps = 1   # TrainingArguments' default
learning_rate = 5e-5         # TrainingArguments' default (the README command sets none)
min_lr = 0.0                 # their linear schedule ends at 0
warmup_iters = 0             # TrainingArguments' default warmup_steps 0
max_iters = 390000           # their num_train_epochs 1.0: one pass over ≈ 200M tokens at 512 a step
                             # (config/gpt2_pg19.py's figure; set it to your copy's train tokens / 512)
weight_decay = 0.0           # TrainingArguments' default
beta1 = 0.9                  # TrainingArguments' default adam_beta1
beta2 = 0.999                # TrainingArguments' default adam_beta2
grad_clip = 1.0              # TrainingArguments' default max_grad_norm
reset_at_doc = False         # run_clm.py concatenates the books into one stream of blocks, read in order
eval_batch_size = 1          # README: --per_device_eval_batch_size=1
eval_interval = 10000        # ours (their README evaluates once, after training)
