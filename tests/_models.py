"""Tiny configurations of every model, for the tests that run train.py / sample.py over every model file
(tests/test_models_train.py). One entry per model variant: 'model' names model_<model>.py, the rest are its Config
fields. Every architecture field that matters is given, so nothing depends on the paper-sized defaults.
A variant whose model file is not in the repository is skipped."""

TINY_XL = dict(vocab_size=256, n_layer=1, n_head=2, n_embd=16, d_head=8, d_inner=32, seg_len=8, mem_len=16,
               dropout=0.0, dropatt=0.0)

TINY_MODELS = {
    'xl': dict(model='xl', **TINY_XL),
    'lamemo': dict(TINY_XL, model='lamemo', n_layer=2),                      # LaMemo needs >= 2 layers
    'compressive': dict(model='compressive', vocab_size=256, n_layer=1, n_head=2, n_embd=16, d_head=8, d_inner=32,
                        seg_len=8, mem_len=8, cmem_len=8, compression_rate=2, dropout=0.0, dropatt=0.0),
    'infini': dict(model='infini', vocab_size=256, n_layer=1, n_head=2, n_embd=16, d_head=8, d_inner=32, seg_len=8,
                   dropout=0.0, dropatt=0.0, memory_update='linear'),
    'infformer': dict(model='infformer', vocab_size=256, n_layer=1, n_head=2, n_embd=16, d_head=8, d_inner=32,
                      seg_len=8, mem_len=8, n_basis=16, n_samples=16, basis_widths='0.05,0.1', sticky=True,
                      dropout=0.0, dropatt=0.0),
    'gpt2': dict(model='gpt2', vocab_size=256, n_layer=2, n_head=2, n_embd=16, n_positions=16, seg_len=8,
                 dropout=0.0),                                                 # GPT-2 alone, no memory
    # 2 layers: one layer's untrained LTM read (a near-flat density) moves sample.py's greedy tokens too little
    'infformer_gpt2': dict(model='infformer_gpt2', vocab_size=256, n_layer=2, n_head=2, n_embd=16, n_positions=16,
                           seg_len=8, n_basis=16, n_samples=16, basis_widths='0.05,0.1', ltm_reset_len=24,
                           sticky=True, dropout=0.0),
    'compressive_gpt2': dict(model='compressive_gpt2', vocab_size=256, n_layer=1, n_head=2, n_embd=16, n_positions=8,
                             seg_len=8, mem_len=0, cmem_len=8, compression_rate=2, dropout=0.0),
    'infini_gpt2': dict(model='infini_gpt2', vocab_size=256, n_layer=1, n_head=2, n_embd=16, n_positions=8, seg_len=8,
                        dropout=0.0, memory_update='linear'),
}

# Variants that carry nothing across segments (the GPT-2 baseline): the tests that check that the memory changes the
# logits, or holds values, skip that check for them.
MEMORYLESS = {'gpt2'}
