"""The ∞-former paper's sorting task (§4.1) at the authors' model and optimisation: a config of bench/recall.py
(its fields are RecallConfig's; config/recall/ holds recall.py's configs, config/ train.py's), whose sorting task
writes the data, trains through train.py and scores the answers:

    python bench/recall.py config/recall/infformer_sorting.py                  # one GPU: --device=cuda
    python bench/recall.py config/recall/infformer_sorting.py --lengths=32,16000 --out_dir=out-sorting-16k \
        --out=bench/results/recall_sorting_paper_16k.json

What follows the authors' sorting/run_sort_inftyformer.sh (deep-spin/infinite-former): 3 layers, d_model 300,
6 heads of 50, d_inner 300, dropout 0.1, dropatt 0, segments of 1,024 with an STM of 1,024, N = 512 basis
functions (the paper says 1,024), M = 512 samples, the CNN gate, KL 1e-6 toward σ₀ = 0.05, init N(0, 0.02), Adam
2e-4 with cosine decay to 0 and no warm-up, clip 0.25, the memory emptied at each new sequence, its data_sort_8000
(sequences of 8,000) and its budget: 20,000 steps of 8 sequences of 8 segments (1,024 x 8 x 8 x 20,000 tokens).
bench/recall.py adds the widths {0.01, 0.05}, τ = 0.75, λ = 1 and the σ² floor 1e-6 of their sorting code.
What is recall.py's, not theirs: an optimizer step per segment with the loss on every token (theirs runs a
sequence's segments without gradient and steps on its last segment's loss), the training mix (9 in 10 sequences
fit in one segment, the others 1,024-8,000 tokens, log-uniform; theirs are all 8,000), p0, p1 ~ Dirichlet(1)
(their generate_data.py draws integers 1-9 and normalises), ties sorted by symbol, accuracy on fresh sequences.
--data_tokens=163840000 writes an eighth of the data and reads it 8 times.
"""
tasks = 'sorting'
variants = 'infformer'
lengths = '32,8000'          # 32: sequence and answer in one segment (the skill itself); 8000: data_sort_8000
seg_len = 1024
mem_len = 1024
n_layer = 3
n_embd = 300
overrides = ('n_head=6,d_head=50,d_inner=300,dropout=0.1,dropatt=0.0,init_std=0.02,n_basis=512,n_samples=512,'
             'cnn_gate=True,kl_weight=1e-6,sigma_0=0.05')
batch_size = 8
tokens = 1_310_720_000       # theirs: 20,000 steps x 8 sequences x 8 segments x 1,024 tokens
learning_rate = 2e-4
min_lr = 0.0
warmup_iters = 0
grad_clip = 0.25
out_dir = 'out-recall-sorting'
out = 'bench/results/recall_sorting_paper.json'
