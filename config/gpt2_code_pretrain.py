"""The GPT-2 recipe on text the pretraining never saw (bench/demos.py --suite=code_gpt2): GPT-2 alone pretrained on
one half of the code corpus (data/sympy_pretrain/: the train files of half of SymPy's subpackages), then each GPT-2
form fine-tuned from it on the other half (data/sympy_finetune/: config/*_gpt2_demo.py --dataset=sympy_finetune),
both evaluated on the same held-out subpackages (data/sympy's validation and test). Size and steps are for now
config/gpt2_demo.py's (4 layers, d_model 128, segments of 64 tokens, 1,500 steps of 512 tokens: 768K tokens, an
eighth of the half), to be calibrated so that the pretrained model copies well within its window (bench/longdoc.py
--position=copy: the loss at copy distances d < 64). The evaluation reads the first 32,768 validation tokens, as
the fine-tunes and the suite's evaluation of this model do (the whole split is 393,517 tokens).

    python data/sympy/prepare.py --halves=True                           # data/sympy_pretrain/, data/sympy_finetune/
    python train.py config/gpt2_code_pretrain.py                         # out-gpt2-code-pretrain/
    python train.py config/infformer_gpt2_demo.py --dataset=sympy_finetune --init_from=gpt2:out-gpt2-code-pretrain
    python bench/demos.py --suite=code_gpt2                              # or the whole recipe, 3 seeds, resumable
"""
model = 'gpt2'
dataset = 'sympy_pretrain'
out_dir = 'out-gpt2-code-pretrain'
n_layer = 4
n_head = 4
n_embd = 128
n_positions = 128             # room for a longer --seg_len when fine-tuning, as config/gpt2_demo.py
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
eval_tokens = 32768           # the fine-tunes' (config/*_gpt2_demo.py), not gpt2_demo's whole split
eval_batch_size = 8
log_interval = 10
