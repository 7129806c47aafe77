"""The GPT-2 recipe on text the pretraining never saw (bench/demos.py --suite=code_gpt2): GPT-2 alone pretrained on
one half of the code corpus (data/sympy_bytes_pretrain/: the train files of half of SymPy's subpackages, as bytes),
then each GPT-2 form fine-tuned from it on the other half (data/sympy_bytes_finetune/), both evaluated on the same
held-out subpackages (data/sympy_bytes' validation and test). Bytes, not GPT-2 BPE: at CPU budgets only the byte
models learn to copy from their memory (README, "Memory on code"; lab/LOG.md, 2026-12-02). Size, segment and steps
are config/xl_code_demo.py's (4 layers, d_model 128, segments of 128 bytes, 8 streams, 6,000 steps of 1,024 bytes:
half an epoch of the half), with nanoGPT's small-model optimizer as config/gpt2_demo.py. n_positions = 256 leaves
room for a longer --seg_len when fine-tuning.

    python data/sympy/prepare.py --tokenizer=bytes --halves=True     # data/sympy_bytes_{pretrain,finetune}/
    python train.py config/gpt2_code_pretrain.py                     # out-gpt2-code-pretrain/
    python bench/demos.py --suite=code_gpt2                          # then the fine-tunes, 3 seeds, resumable
"""
model = 'gpt2'
dataset = 'sympy_bytes_pretrain'
out_dir = 'out-gpt2-code-pretrain'
n_layer = 4
n_head = 4
n_embd = 128
n_positions = 256
seg_len = 128
dropout = 0.1
batch_size = 8
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
weight_decay = 0.1
beta2 = 0.99
grad_clip = 1.0
max_iters = 6000
eval_interval = 1500
eval_tokens = 65536           # the code demos' (config/xl_code_demo.py): the first 65,536 validation bytes
eval_batch_size = 8
log_interval = 10
