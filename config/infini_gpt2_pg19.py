"""Infini-attention's continual pre-training (the paper's §4.2, "LLM Continual Pre-training"), scaled to GPT-2 small:
OpenAI's GPT-2 (124M) gets the compressive memory in every attention layer and goes on training on PG-19.
The paper replaces the multi-head attention of an existing 1B LLM with Infini-attention and continues pre-training
on PG-19, Arxiv-math and C4 documents longer than 4K tokens: segments of N = 2K, inputs of 4K (two segments, the
memory written once and read once per input), batch 64, 30K steps, before its 1M-token passkey fine-tuning (its 8B
model: inputs of 8K, 30K steps). The copy of the paper this project was given is a summary without §4: these figures
are from the arXiv text as recalled; check them there before quoting a reproduction.
Scaled to GPT-2 small: a segment is GPT-2's whole context, n_positions = 1024 (the paper's 2K would need positions
GPT-2 does not have), and an input is two segments, as the paper's 4K is two of 2K. PG-19 alone (Arxiv-math and C4
are not prepared here). Not the paper's, ours: AdamW at a tenth of GPT-2 small's pre-training learning rate (the
paper's optimiser settings are for its own LLM), GPT-2's clipping and weight decay, dropout off, books never sharing
a memory (reset_at_doc), β's init (the paper gives none: see model_infini_gpt2.py). 8 GPUs: 8 x 8 = 64 inputs of
2 x 1024 tokens a step (131,072 tokens), 3.9B tokens in all. One GPU: --gradient_accumulation_steps=8. Evaluation
resets the memory every 2 segments too, as trained; --reset_every=0 reads each validation book through one memory.
Not run here (no GPU, no network for GPT-2's weights).

    python data/pg19/prepare.py
    torchrun --nproc_per_node=8 train.py config/infini_gpt2_pg19.py
"""
model = 'infini_gpt2'
init_from = 'gpt2'            # the paper starts from an existing LLM; here OpenAI's GPT-2 small (pretrained.py)
dataset = 'pg19'              # the paper: PG-19 + Arxiv-math + C4 (> 4K tokens); here PG-19 alone
out_dir = 'out-infini-gpt2-pg19'
seg_len = 1024                # the paper's N = 2K, scaled: GPT-2's n_positions (its longest context)
bptt_segments = 2             # the paper's 4K inputs = 2 segments of 2K, the loss backpropagated through the memory
reset_every = 2               # ... and every input starts with an empty memory
reset_at_doc = True           # ours: no input reads two books through one memory
memory_update = 'linear'      # the paper's Eq. 4 ('delta' = Eq. 5, the "Linear + Delta" variant)
gate_init = -4.0              # ours (the paper gives none): sigmoid(β) = 0.018, each head within 2% of GPT-2's
gate_lr_mult = 100.0          # ours: β moves up to lr x 100 a step (6e-3 at the peak) and can leave its init
dropout = 0.0                 # ours (the paper does not say): continual pre-training on 3.9B tokens, no repeats
batch_size = 8                # inputs per GPU; x 8 GPUs = the paper's batch of 64
max_iters = 30000             # the paper's 30K steps
warmup_iters = 1000           # the paper's linear warm-up of 1000 steps (§4.1's training details)
learning_rate = 6e-5          # ours: a tenth of GPT-2 small's pre-training 6e-4 (nanoGPT); the paper's Adafactor lr
min_lr = 6e-6                 # ... is not an AdamW one. Cosine decay to a tenth, as the paper's cosine schedule
weight_decay = 0.1            # GPT-2's (nanoGPT's train_gpt2 settings)
beta2 = 0.95                  # ditto
grad_clip = 1.0               # ditto
eval_interval = 1000
