"""
The CPU demo comparison on several seeds: every model trained with its config/*_demo.py (same size,
same 512 tokens a step, same 1000 steps), on seeds 1, 2, 3, then the validation loss mean +- std per model and
the loss by position in the document (bench/longdoc.py) on the held-out plays, averaged over the seeds.

    python bench/demos.py                                  # all variants, seeds 1,2,3, then longdoc
    python bench/demos.py --variants=baseline,xl --seeds=1 --jobs=1
    python bench/demos.py --dry_run=True                   # print the train.py commands only

A run is `python train.py CONFIG --seed=S --out_dir=OUT_ROOT/LABEL/seedS FLAGS` (the table below); --jobs runs
that many at once, each with cores/jobs threads. A finished run (its log.jsonl has the evaluation at max_iters)
is not run again; an unfinished one with a checkpoint resumes. --overrides=' --max_iters=20' appends train.py
flags to every run (quick checks). Results: bench/results/demos[_NAME].json (validation loss per seed, mean, std)
and bench/results/longdoc_demos[_NAME].json/.png (bench/longdoc.py, every label against 'baseline'), plus
longdoc_demos[_NAME]_vs_CONTROL.json for the variants that have a matched control (MATCHED), and
longdoc_demos[_NAME]_ABLATION.json for the same checkpoints read otherwise (ABLATIONS: XL without its memory, Infini
with its memory emptied as in training); --results names another folder.

An ablation's JSON also holds 'vs_as_trained': the ablation minus the same checkpoints read as trained, paired by
document and seed (same_weights).

What a finished run leaves outlives its out_dir: RESULTS/demos[_NAME]_runs/LABEL/seedS holds its last evaluation
(final.json) and, per --split, its readings by bench/longdoc.py (one run each: longdoc[READING].json, written when
the run finishes), and the tables above are built from those (longdoc --reuse), so runs can finish across machines
or sessions and a run whose out_dir is gone still counts as finished and is not trained again.

--suite=bytes runs the byte-level comparison instead (does a memory pay beyond its window at
byte level?): config/xl_bytes_demo.py (vocabulary 256, segment 128, 1,500 steps) without memory, with a memory of 128
and with one of 512, read by position in bytes (BYTE_BUCKETS); the Compressive Transformer reaching as far as the
512 memory with 320 slots (128 + 2 x 192) when named. Runs in OUT_ROOT = out-demos-bytes, results named
demos_bytes*; a longer budget is --overrides=' --max_iters=4500 --eval_interval=1500' with its own --out_root
and --name.

--suite=code runs the code comparison (does an exact long memory read beyond its window where most can be copied?):
config/xl_code_demo.py (SymPy's source as bytes, data/sympy/prepare.py --tokenizer=bytes; segment 128, 6,000 steps)
without memory, with 128 slots (read also with 512: the authors' longer evaluation memory) and trained with 512,
read by position and by copy distance (longdoc --position=copy, CODE_COPY_BUCKETS); by name or --variants=all every
other model at that setting, each trained as its paper trains it (config/*_code_demo.py: LaMemo, Compressive,
Infini-attention linear and delta, the ∞-former with and without sticky memories) and the controls, each also read
with its memory emptied (CODE_ABLATIONS), and XL read with 512 slots beside the runs
(longdoc_demos_code_copy*_with_xl_at512.json); --suite=code_tokens the token demo (config/xl_demo.py) on the same
code. Runs in out-demos-code[-tokens]; add --overrides=' --keep_checkpoints=True' to keep every evaluation's
checkpoint (loss against steps: bench/longdoc.py --ckpt=ckpt_STEP.pt).

--suite=code_gpt2 runs the GPT-2 recipe (--suite=gpt2) on code the pretraining never saw, as bytes: GPT-2 pretrained
on one half of SymPy's train files (config/gpt2_code_pretrain.py, data/sympy_bytes_pretrain/), every form fine-tuned
on the other half (data/sympy_bytes_finetune/; data/sympy/prepare.py --tokenizer=bytes --halves=True), read by copy
distance too; out-demos-code-gpt2.
--pretrain_overrides=' ...' appends train.py flags to a suite's pretraining only (after --overrides).
"""

import concurrent.futures
import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

import common  # noqa: E402  (bench/common.py puts the repository on sys.path)
import longdoc  # noqa: E402
import train  # noqa: E402

# label -> (config file, extra train.py flags). The controls (not run by default, except the baseline):
# - baseline: xl_demo with no memory (mem_len 0);
# - compressive_no_cmem: compressive_demo without the compressed memory (cmem_len 0: XL with eval memory 64);
# - baseline_2x4: the baseline fed as infini_demo is (2 streams x 4 consecutive segments a step): what reading 2
#   streams instead of 8 costs a model with no memory;
# - infini_linear_bptt1: infini_demo with 8 streams and no backpropagation through the memory (bptt 1), the
#   memory still emptied every 4 segments.
VARIANTS = {
    'baseline': ('config/xl_demo.py', ['--mem_len=0', '--eval_mem_len=0']),
    'xl': ('config/xl_demo.py', []),
    'lamemo': ('config/lamemo_demo.py', []),
    'compressive': ('config/compressive_demo.py', []),
    'compressive_no_cmem': ('config/compressive_demo.py', ['--cmem_len=0', '--recon_loss=none']),
    'infini_linear': ('config/infini_demo.py', []),
    'infini_delta': ('config/infini_demo.py', ['--memory_update=delta']),
    'infformer': ('config/infformer_demo.py', []),
    'infformer_sticky': ('config/infformer_demo.py', ['--sticky=True']),
    'baseline_2x4': ('config/xl_demo.py', ['--mem_len=0', '--eval_mem_len=0', '--batch_size=2', '--bptt_segments=4']),
    'infini_linear_bptt1': ('config/infini_demo.py', ['--batch_size=8', '--bptt_segments=1']),
}
CONTROLS = ('compressive_no_cmem', 'baseline_2x4', 'infini_linear_bptt1')
# a control whose data layout matches other variants better than the baseline's: they are compared with it too
MATCHED = {'baseline_2x4': ('infini_linear', 'infini_delta', 'infini_linear_bptt1'),
           'compressive_no_cmem': ('compressive',),
           'xl': ('lamemo', 'compressive', 'infformer', 'infformer_sticky')}   # what they add to XL's memory
# the same checkpoints evaluated otherwise (bench/longdoc.py flags): label -> (variant, flags)
# - xl_nomem: XL's weights with the memory taken away (what XL's memory itself is worth, at every position);
# - infini_*_as_trained: Infini with its memory emptied every reset_every segments of a document, as in training
#   (the main table reads every document with one memory from its start).
ABLATIONS = {'xl_nomem': ('xl', ['--eval_mem_len=0']),
             'infini_linear_as_trained': ('infini_linear', ['--reset_every=-1']),
             'infini_delta_as_trained': ('infini_delta', ['--reset_every=-1'])}

# The byte-level suite: the same 4-layer model at vocabulary 256 (config/xl_bytes_demo.py: segment 128, 8 streams,
# 1,500 steps), where a model draws more of its loss from far back (speaker names, repeated words) and the
# attention window is a few dozen words. Every model reads 128 new bytes a step and differs only in what it keeps:
# - baseline: no memory (a token sees at most the 127 bytes before it in its segment);
# - xl: a memory of 128 (a layer attends 128..255 bytes back; through 4 layers up to 4 x 128 + 127);
# - xl_mem512: a memory of 512 (a layer 512..639 bytes back; through 4 layers up to 4 x 512 + 127);
# - compressive: FIFO 128 + compressed memory 192 at the paper's PG-19 rate c = 2 (128 + 384 = 512 bytes behind
#   the segment, as far as xl_mem512, with 320 memory slots instead of 512; the enwik8 rate c = 3 does not divide
#   the segment of 128), conv f_c, attention-reconstruction loss (config/compressive_bytes_demo.py reshaped to
#   segment 128 and xl_bytes_demo's schedule). Run only when named (--variants=all or compressive).
_BYTES = 'config/xl_bytes_demo.py'
BYTE_VARIANTS = {
    'baseline': (_BYTES, ['--mem_len=0', '--eval_mem_len=0']),
    'xl': (_BYTES, ['--eval_mem_len=128']),
    'xl_mem512': (_BYTES, ['--mem_len=512', '--eval_mem_len=512']),
    'compressive': ('config/compressive_bytes_demo.py', [
        '--seg_len=128', '--mem_len=128', '--cmem_len=192', '--compression_rate=2',
        '--max_iters=1500', '--eval_interval=500', '--eval_tokens=65536', '--eval_batch_size=8']),
}
# xl_mem512 and compressive against xl: what the memory beyond XL's 128 slots adds; the same weights with less memory
BYTE_MATCHED = {'xl': ('xl_mem512', 'compressive')}
BYTE_ABLATIONS = {'xl_nomem': ('xl', ['--eval_mem_len=0']),
                  'xl_mem512_at128': ('xl_mem512', ['--eval_mem_len=128']),
                  'xl_mem512_nomem': ('xl_mem512', ['--eval_mem_len=0'])}
# position buckets in bytes: [0,128) inside the first segment, [128,256) within XL's window, [256,640) within
# xl_mem512's and compressive's one-layer reach, then far beyond every window
BYTE_BUCKETS = '128,256,640,2048,8192'


# The code suite (--suite=code): does a memory read beyond its window where there is the most to copy? SymPy's source as
# bytes (config/xl_code_demo.py: vocabulary 256, segment 128, 8 streams, 6,000 steps), read by copy distance (bench/
# longdoc.py --position=copy: how far back the 6-gram ending at a byte last occurred in its file) and by position.
# Every model at that setting (config/*_code_demo.py: same size, 1,024 new bytes a step), each trained as its paper
# trains it; the default run is the calibration (baseline, xl, xl_mem512), the rest run when named (or --variants=all):
# - baseline: no memory (a byte sees at most the 127 bytes before it);
# - xl: a memory of 128, as long as the segment, as the authors train XL; read also with 512 slots (xl_at512 in
#   CODE_ABLATIONS: their evaluation memory is ~4x the training one), the exact long memory every other is placed
#   against (a layer reads 512..639 bytes back);
# - xl_mem512: trained with 512 slots (4x the segment, not the authors' recipe): at this budget it learns slower;
# - lamemo: LaMemo with xl's memory of 128 (what its look-ahead adds to XL's 128 slots);
# - compressive: FIFO 128 + compressed memory 192 at c = 2, reaching 512 back as xl_at512 (320 slots, not 512);
# - infini_linear, infini_delta: Infini-attention (Eq. 4, Eq. 5) as its paper trains, 2 streams x 4 segments a step,
#   BPTT over the 4, the memory emptied every 4 segments (512 bytes);
# - infformer, infformer_sticky: the ∞-former, STM 128 (xl's) + an LTM of 150 RBFs, without and with sticky memories;
# controls:
# - compressive_no_cmem: compressive without the compressed memory (cmem_len 0: XL's model with memory 128);
# - baseline_2x4: the baseline fed as Infini (2 streams x 4 consecutive segments a step);
# - infini_linear_bptt1: infini_linear with 8 streams and no BPTT (bptt 1), the memory still emptied every 4 segments.
# --suite=code_tokens is the same question at the token demos' setting (config/xl_demo.py on data/sympy: GPT-2 BPE,
# segment 64, 1,000 steps), where XL with 512 slots first came out worse than none (lab/LOG.md, 2026-12-01).
_CODE = 'config/xl_code_demo.py'
CODE_VARIANTS = {
    'baseline': (_CODE, ['--mem_len=0', '--eval_mem_len=0']),
    'xl': (_CODE, ['--mem_len=128', '--eval_mem_len=128']),
    'xl_mem512': (_CODE, ['--mem_len=512', '--eval_mem_len=512']),
    'lamemo': ('config/lamemo_code_demo.py', []),
    'compressive': ('config/compressive_code_demo.py', []),
    'infini_linear': ('config/infini_code_demo.py', []),
    'infini_delta': ('config/infini_code_demo.py', ['--memory_update=delta']),
    'infformer': ('config/infformer_code_demo.py', []),
    'infformer_sticky': ('config/infformer_code_demo.py', ['--sticky=True']),
    'compressive_no_cmem': ('config/compressive_code_demo.py', ['--cmem_len=0', '--recon_loss=none']),
    'baseline_2x4': (_CODE, ['--mem_len=0', '--eval_mem_len=0', '--batch_size=2', '--bptt_segments=4']),
    'infini_linear_bptt1': ('config/infini_code_demo.py', ['--batch_size=8', '--bptt_segments=1']),
}
CODE_MODELS = ('lamemo', 'compressive', 'infini_linear', 'infini_delta', 'infformer', 'infformer_sticky')
CODE_CONTROLS = ('compressive_no_cmem', 'baseline_2x4', 'infini_linear_bptt1')
# besides the baseline: against xl (what each adds to XL's 128 slots; xl_at512 reads the same runs with 512) and the
# controls matched in data layout or model
CODE_MATCHED = {'xl': ('xl_mem512', 'lamemo', 'compressive', 'infformer', 'infformer_sticky'),
                'baseline_2x4': ('infini_linear', 'infini_delta', 'infini_linear_bptt1'),
                'compressive_no_cmem': ('compressive',)}
# the same checkpoints with their memory emptied (bench/longdoc.py flags): --eval_mem_len=0 where the whole memory is
# XL's (mem_len: xl, xl_mem512, lamemo, compressive_no_cmem); --reset_every=1 (model.reset_memory before every segment)
# where more than mem_len holds it: compressive (its compressed memory), Infini (no mem_len), the ∞-former (the STM
# and the LTM; mem_len 0 would still write the LTM). infini_*_as_trained: emptied every 4 segments, as in training.
CODE_ABLATIONS = {'xl_nomem': ('xl', ['--eval_mem_len=0']),
                  'xl_at512': ('xl', ['--eval_mem_len=512']),
                  'xl_mem512_nomem': ('xl_mem512', ['--eval_mem_len=0']),
                  'xl_mem512_at128': ('xl_mem512', ['--eval_mem_len=128']),
                  'lamemo_nomem': ('lamemo', ['--eval_mem_len=0']),
                  'compressive_emptied': ('compressive', ['--reset_every=1']),
                  'compressive_no_cmem_nomem': ('compressive_no_cmem', ['--eval_mem_len=0']),
                  'infini_linear_emptied': ('infini_linear', ['--reset_every=1']),
                  'infini_delta_emptied': ('infini_delta', ['--reset_every=1']),
                  'infini_linear_bptt1_emptied': ('infini_linear_bptt1', ['--reset_every=1']),
                  'infini_linear_as_trained': ('infini_linear', ['--reset_every=-1']),
                  'infini_delta_as_trained': ('infini_delta', ['--reset_every=-1']),
                  'infformer_emptied': ('infformer', ['--reset_every=1']),
                  'infformer_sticky_emptied': ('infformer_sticky', ['--reset_every=1'])}
CODE_TOKEN_VARIANTS = {
    'baseline': ('config/xl_demo.py', ['--dataset=sympy', '--mem_len=0', '--eval_mem_len=0']),
    'xl': ('config/xl_demo.py', ['--dataset=sympy', '--mem_len=64', '--eval_mem_len=64']),
    'xl_mem512': ('config/xl_demo.py', ['--dataset=sympy', '--mem_len=512', '--eval_mem_len=512']),
}
CODE_TOKEN_ABLATIONS = {'xl_mem512_nomem': ('xl_mem512', ['--eval_mem_len=0']),
                        'xl_mem512_at64': ('xl_mem512', ['--eval_mem_len=64'])}
# copy-distance buckets (longdoc_demos_NAME{key}.json: buckets): by bytes as BYTE_BUCKETS ([1,128) inside the segment,
# [128,256) within xl's window, [256,640) within 512 slots' one-layer window, [640,2048) their four layers' reach); and
# the calibration's one bucket: [128,640), beyond the segment and within 512 slots' window, where an exact long memory
# must show it reads (README, "Memory on code"). Tokens: each doubling, as first measured.
CODE_COPY_BUCKETS = {'_copy': BYTE_BUCKETS, '_copy_reach': '128,640,2048,8192'}
CODE_TOKEN_COPY_BUCKETS = {'_copy': '64,128,256,512,1024,4096', '_copy_reach': '64,576,2112'}

# The papers' recipe (--suite=gpt2): a pretrained LM gets a memory and is fine-tuned. GPT-2 alone is pretrained once
# (config/gpt2_demo.py, in OUT_ROOT/pretrain), then every GPT-2 form starts from it (--init_from=gpt2:OUT_ROOT/pretrain)
# and is fine-tuned with the same data, steps and learning rate (config/*_gpt2_demo.py, 300 steps at 5e-5):
# - gpt2: GPT-2 alone fine-tuned the same way (the control every form is compared with);
# - gpt2_2x4: GPT-2 alone fed as Infini-attention is (2 streams x 4 segments a step): Infini's matched control.
# GPT2_EVALS: the same checkpoints evaluated by train.py --eval_only with their memory emptied before every segment
# (what the fine-tuned weights are worth without the memory). Not read by position: add GPT2_ABLATIONS entries such as
# 'infformer_emptied': ('infformer', ['--reset_every=1']) for that (each reads every document once more).
GPT2_VARIANTS = {
    'gpt2': ('config/gpt2_finetune_demo.py', []),
    'infformer': ('config/infformer_gpt2_demo.py', []),
    'infformer_sticky': ('config/infformer_gpt2_demo.py', ['--sticky=True']),
    'compressive': ('config/compressive_gpt2_demo.py', []),
    'infini_linear': ('config/infini_gpt2_demo.py', []),
    'infini_delta': ('config/infini_gpt2_demo.py', ['--memory_update=delta']),
    'gpt2_2x4': ('config/gpt2_finetune_demo.py', ['--batch_size=2', '--bptt_segments=4', '--reset_every=4']),
}
GPT2_MEMORIES = ('infformer', 'infformer_sticky', 'compressive', 'infini_linear', 'infini_delta')
GPT2_EVALS = {f'{v}_emptied': (v, ['--eval_reset_memory=True']) for v in GPT2_MEMORIES}
GPT2_ABLATIONS = {}

# The GPT-2 recipe on text the pretraining never saw (--suite=code_gpt2). The gpt2 suite's fine-tune re-reads the
# Gutenberg text its pretraining read; here GPT-2 alone is pretrained once on one half of the code corpus, as bytes
# (config/gpt2_code_pretrain.py: data/sympy_bytes_pretrain/, the code suite's size, segment and steps), and every form
# of GPT2_VARIANTS (the control gpt2, gpt2_2x4, the ∞-former with and without sticky memories, Compressive, Infini
# linear and delta) is fine-tuned from it on the other half (data/sympy_bytes_finetune/), with the same steps, data and
# rates. The halves are disjoint by subpackage (data/sympy/prepare.py --tokenizer=bytes --halves=True), so the
# fine-tune reads code the pretrained model has never seen; both evaluate on the same held-out subpackages.
# CODE_GPT2_FLAGS move every form to the pretraining's segment of 128 bytes (1,024 bytes a step, as pretrained: 8
# streams, or Infini's 2 x 4 segments) and the code suite's evaluation, and fine-tune 1,500 steps (1.5M bytes, an
# eighth of the half; after the gpt2 suite's 300 the ∞-former's memory was not read, emptying it cost 0.0004 nats:
# lab/LOG.md, 2026-12-02), at the configs' rates (5e-5, the ∞-former authors'); CODE_GPT2_SCALED scale each memory
# with the segment as its gpt2 config scales it to 64 tokens: the ∞-former's N = L = 128 basis functions and M = 2N
# samples (its LTM still emptied at 512 = 4 segments, the paper's threshold), Compressive's 128 compressed slots (N's
# count) at rate 2, reaching 256 back. The same evaluations (GPT2_EVALS: each memory emptied), read by position, in
# the segment, and by copy distance (longdoc --position=copy, each form paired with gpt2), in two bucket sets:
# - '_copy': the code suite's byte buckets;
# - '_copy_reach': where each memory can reach behind a 128-byte segment: [1,128) the window (GPT-2 alone copies
#   there), [128,384) within Compressive's 256 bytes, [384,640) within the ∞-former's LTM (up to 512 bytes, then
#   emptied), [640,...) beyond every bounded memory (only Infini's, never emptied as longdoc reads a document, reaches
#   there).
CODE_GPT2_FLAGS = ['--dataset=sympy_bytes_finetune', '--seg_len=128', '--eval_tokens=65536', '--max_iters=1500',
                   '--eval_interval=500']
_CODE_GPT2_LTM = ['--n_basis=128', '--n_samples=256']
CODE_GPT2_SCALED = {'infformer': _CODE_GPT2_LTM, 'infformer_sticky': _CODE_GPT2_LTM, 'compressive': ['--cmem_len=128']}
CODE_GPT2_VARIANTS = {label: (config, [*CODE_GPT2_FLAGS, *flags, *CODE_GPT2_SCALED.get(label, [])])
                      for label, (config, flags) in GPT2_VARIANTS.items()}
CODE_GPT2_COPY_BUCKETS = {'_copy': BYTE_BUCKETS, '_copy_reach': '128,384,640'}


@dataclasses.dataclass(frozen=True)
class Suite:
    variants: dict     # label -> (config file, extra train.py flags)
    controls: tuple    # labels run only when named (or with --variants=all)
    matched: dict      # control -> the variants also compared with it
    ablations: dict    # label -> (variant, bench/longdoc.py flags): the same checkpoints read otherwise
    buckets: str       # bench/longdoc.py --buckets
    out_root: str      # default OUT_ROOT
    name: str          # default results name
    baseline: str = 'baseline'   # the label the others are compared with
    pretrain: str = ''           # a config trained once, first, into OUT_ROOT/pretrain: every variant starts from it
    evals: dict = None           # label -> (variant, train.py flags): the checkpoints evaluated otherwise (--eval_only)
    segment_buckets: str = ''    # also longdoc by position in the segment (--position=segment) with these buckets
    copy_buckets: dict = None    # also longdoc by copy distance (--position=copy): JSON name -> buckets
    joined: tuple = ()           # ablations also read beside the runs by copy distance (..._with_LABEL.json)


SUITES = {'tokens': Suite(VARIANTS, CONTROLS, MATCHED, ABLATIONS, '64,256,1024,4096', 'out-demos', ''),
          'bytes': Suite(BYTE_VARIANTS, ('compressive',), BYTE_MATCHED, BYTE_ABLATIONS, BYTE_BUCKETS,
                         'out-demos-bytes', 'bytes'),
          'gpt2': Suite(GPT2_VARIANTS, (), {'gpt2_2x4': ('infini_linear', 'infini_delta')}, GPT2_ABLATIONS,
                        '64,256,1024,4096', 'out-demos-gpt2', 'gpt2', baseline='gpt2', pretrain='config/gpt2_demo.py',
                        evals=GPT2_EVALS, segment_buckets='4,16,32'),
          'code': Suite(CODE_VARIANTS, CODE_MODELS + CODE_CONTROLS, CODE_MATCHED, CODE_ABLATIONS, BYTE_BUCKETS,
                        'out-demos-code', 'code', copy_buckets=CODE_COPY_BUCKETS,    # default: the calibration
                        joined=('xl_at512',)),
          'code_tokens': Suite(CODE_TOKEN_VARIANTS, (), {}, CODE_TOKEN_ABLATIONS, '64,256,1024,4096',
                               'out-demos-code-tokens', 'code_tokens', copy_buckets=CODE_TOKEN_COPY_BUCKETS),
          'code_gpt2': Suite(CODE_GPT2_VARIANTS, (), {'gpt2_2x4': ('infini_linear', 'infini_delta')}, GPT2_ABLATIONS,
                             BYTE_BUCKETS, 'out-demos-code-gpt2', 'code_gpt2', baseline='gpt2',
                             pretrain='config/gpt2_code_pretrain.py', evals=GPT2_EVALS, segment_buckets='4,16,64',
                             copy_buckets=CODE_GPT2_COPY_BUCKETS)}


@dataclasses.dataclass
class DemosConfig:
    suite: str = 'tokens'             # tokens (the GPT-2-token demos), bytes, gpt2 (the recipe), code, code_tokens,
                                      # code_gpt2 (the recipe, pretrained and fine-tuned on disjoint halves of code)
    variants: str = ''                # labels of the suite, comma-separated ('' = all but the controls, 'all')
    seeds: str = '1,2,3'
    out_root: str = ''                # runs in OUT_ROOT/LABEL/seedS ('' = out-demos, out-demos-bytes)
    jobs: int = 2                     # runs at once
    threads: int = 0                  # threads per run; 0 = cores // jobs
    overrides: str = ''               # extra train.py flags for every run, e.g. ' --max_iters=20'
    pretrain_overrides: str = ''      # ... and for the suite's pretraining only, after those (' --data_dir=...')
    longdoc: bool = True              # then bench/longdoc.py on the finished runs
    split: str = 'validation,test'    # longdoc's documents
    name: str = ''                    # results: demos[_NAME].json, longdoc_demos[_NAME].json ('' = suite's)
    results: str = ''                 # the folder of those ('' = bench/results)
    dry_run: bool = False             # print the train.py commands and stop
    train: bool = True                # False: only summarise the runs already finished (no training)

    def __post_init__(self):
        if self.jobs < 1 or self.threads < 0:
            raise ValueError(f"jobs must be >= 1 and threads >= 0, got {self.jobs} and {self.threads}")
        if self.suite not in SUITES:
            raise ValueError(f"suite must be one of {', '.join(SUITES)}, got {self.suite!r}")
        suite = SUITES[self.suite]
        self.variants = self.variants or ','.join(v for v in suite.variants if v not in suite.controls)
        self.out_root = self.out_root or suite.out_root
        self.name = self.name or suite.name

    @property
    def table(self):
        return SUITES[self.suite]


def selected(cfg):
    variants = cfg.table.variants
    names = list(variants) if cfg.variants == 'all' else [v for v in cfg.variants.split(',') if v]
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise train.UserError(f"unknown variant {unknown[0]!r} of suite {cfg.suite}; known: {', '.join(variants)}")
    return names


def run_dir(cfg, label, seed):
    return Path(cfg.out_root) / label / f'seed{seed}'


def final_eval(out_dir):
    """The last evaluation record of a run's log.jsonl, or None."""
    path = Path(out_dir) / 'log.jsonl'
    if not path.exists():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals = [r for r in records if 'validation/loss' in r]
    return evals[-1] if evals else None


def results_dir(cfg):
    return Path(cfg.results or common.RESULTS)


def kept_root(cfg):
    return results_dir(cfg) / (f'demos_{cfg.name}_runs' if cfg.name else 'demos_runs')


def record_dir(cfg, label, seed):
    """What a finished run keeps in the results folder: final.json (its last evaluation), eval_*.json (train.py
    --eval_only's, cfg.table.evals) and SPLIT/longdoc[READING].json (its readings, one run each)."""
    return kept_root(cfg) / label / f'seed{seed}'


def kept_eval(cfg, label, seed):
    """The last evaluation a finished run kept in record_dir (final.json), or None."""
    path = record_dir(cfg, label, seed) / 'final.json'
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except ValueError:
        raise train.UserError(f"{path} is damaged (not JSON): remove it to train the run again") from None


def max_iters(cfg, label):
    """max_iters of a run as train.py will see it (config file, then --overrides)."""
    config, flags = cfg.table.variants[label]
    tcfg, _, _, _ = train.parse_args([str(common.REPO / config), *flags, *shlex.split(cfg.overrides)])
    return tcfg.max_iters


def is_done(cfg, label, seed):
    """Has the run finished: its out_dir's log, or the last evaluation it kept (its out_dir may be gone), has the
    evaluation at max_iters?"""
    record = final_eval(run_dir(cfg, label, seed)) or kept_eval(cfg, label, seed)
    return record is not None and record['step'] >= max_iters(cfg, label)


def reading_sets(cfg, ablation=False):
    """{READING: bench/longdoc.py flags}: by position, in the segment (not for an ablation), by copy distance."""
    t = cfg.table
    sets = {'': [f'--buckets={t.buckets}']}
    if t.segment_buckets and not ablation:
        sets['_segment'] = ['--position=segment', f'--buckets={t.segment_buckets}']
    sets.update({name: ['--position=copy', f'--buckets={b}'] for name, b in (t.copy_buckets or {}).items()})
    return sets


def readings(cfg, label):
    """The bench/longdoc.py readings a run of label keeps: [(READING, label read as, flags)]: reading_sets, and
    for each ablation of it (cfg.table.ablations) reading_sets(ablation=True) with the ablation's flags."""
    out = [(name, label, flags) for name, flags in reading_sets(cfg).items()]
    for ablation, (variant, flags) in cfg.table.ablations.items():
        if variant == label:
            out += [(f'_{ablation}{name}', ablation, [*flags, *more])
                    for name, more in reading_sets(cfg, ablation=True).items()]
    return out


def reading_path(cfg, label, seed, reading):
    return record_dir(cfg, label, seed) / cfg.split.replace(',', '+') / f'longdoc{reading}.json'


def keep_results(cfg, label, seed, threads=0):
    """Keep what a finished run leaves in record_dir: its last evaluation and (with --longdoc) its readings by
    bench/longdoc.py, each in a subprocess of `threads` threads (0 = every core). A run trained again (its out_dir's
    last evaluation is no longer the kept one) has its old readings replaced. Readings already kept are not read
    again; one whose out_dir is gone cannot be read: a one-line error."""
    out, record = run_dir(cfg, label, seed), record_dir(cfg, label, seed)
    final = final_eval(out)
    if final is not None and final['step'] >= max_iters(cfg, label) and final != kept_eval(cfg, label, seed):
        for path in [*record.glob('*/longdoc*.json'), *record.glob('eval_*.json')]:   # another run's readings
            path.unlink()
        record.mkdir(parents=True, exist_ok=True)
        (record / 'final.json').write_text(json.dumps(final) + '\n')
    if not cfg.longdoc:
        return
    for reading, as_label, flags in readings(cfg, label):
        path = reading_path(cfg, label, seed, reading)
        if path.exists():
            continue
        if not (out / 'ckpt.pt').exists():
            raise train.UserError(f"{label} seed {seed}: no reading {path.name} kept in {path.parent}, and "
                                  f"{out / 'ckpt.pt'} is gone: train the run again to read it")
        cmd = ['bench/longdoc.py', f'--runs={as_label}:{out}', *flags, f'--split={cfg.split}', '--plot=False',
               f'--out={path}']
        code = launch(cmd, threads or os.cpu_count() or 1, out / 'longdoc.out')      # its log stays with the run
        if code or not path.exists():
            raise train.UserError(f"{shlex.join(cmd)} failed (exit {code}): see {out / 'longdoc.out'}")
        path.write_text(json.dumps(json.loads(path.read_text()), separators=(',', ':')) + '\n')   # kept: compact


def pretrain_dir(cfg):
    return Path(cfg.out_root) / 'pretrain'


def pretrain_done(cfg):
    """Has the suite's pretraining finished (its log has the evaluation at its max_iters)?"""
    record = final_eval(pretrain_dir(cfg))
    tcfg = train.parse_args([str(common.REPO / cfg.table.pretrain), *pretrain_overrides(cfg)])[0]
    return record is not None and record['step'] >= tcfg.max_iters


def pretrain_overrides(cfg):
    """The pretraining's flags after its config: --overrides, then --pretrain_overrides."""
    return [*shlex.split(cfg.overrides), *shlex.split(cfg.pretrain_overrides)]


def pretrain_command(cfg):
    out = pretrain_dir(cfg)
    resume = ['--init_from=resume'] if (out / 'ckpt.pt').exists() else []
    return ['train.py', cfg.table.pretrain, f'--out_dir={out}', '--always_save_checkpoint=True', *resume,
            *pretrain_overrides(cfg)]


def command(cfg, label, seed):
    config, flags = cfg.table.variants[label]
    out = run_dir(cfg, label, seed)
    start = [f'--init_from=gpt2:{pretrain_dir(cfg)}'] if cfg.table.pretrain else []   # the suite's pretrained LM
    resume = ['--init_from=resume'] if (out / 'ckpt.pt').exists() else start
    return ['train.py', config, f'--seed={seed}', f'--out_dir={out}',
            '--always_save_checkpoint=True', *flags, *resume, *shlex.split(cfg.overrides)]


def eval_command(cfg, label, seed):
    """train.py --eval_only on a finished run of the variant, with the flags of cfg.table.evals[label]."""
    variant, flags = cfg.table.evals[label]
    config, train_flags = cfg.table.variants[variant]
    return ['train.py', config, *train_flags, f'--out_dir={run_dir(cfg, variant, seed)}', '--init_from=resume',
            '--eval_only=True', *flags, *shlex.split(cfg.overrides)]


def eval_only(cmd, path):
    """train.py --eval_only's JSON line, from path, or (the first time) from running cmd and writing path."""
    if not path.exists():
        print('python', shlex.join(cmd), flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, *cmd], cwd=common.REPO, capture_output=True, text=True)
        if proc.returncode:
            raise train.UserError(f"{shlex.join(cmd)}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        path.write_text(proc.stdout.strip().splitlines()[-1] + '\n')
    return json.loads(path.read_text())


def pretrained_eval(cfg):
    """The pretrained model evaluated as the baseline's runs are (its config's evaluation flags)."""
    config, flags = cfg.table.variants[cfg.table.baseline]
    cmd = ['train.py', config, *flags, f'--out_dir={pretrain_dir(cfg)}', '--init_from=resume', '--eval_only=True',
           *shlex.split(cfg.overrides)]
    kept = kept_root(cfg) / 'pretrain' / f'eval_as_{cfg.table.baseline}.json'
    if not pretrain_done(cfg) and not kept.exists():
        return {'validation/loss': None, 'command': ' '.join(['python', *cmd])}
    record = eval_only(cmd, kept)
    return {'validation/loss': record['validation/loss'], 'command': ' '.join(['python', *cmd])}


def evaluate_otherwise(cfg, labels, seeds):
    """{label: {'seeds': {seed: loss}, 'mean', 'std', 'command'}} of cfg.table.evals for the variants in labels,
    each read from (or, the first time, written to) RUN/eval_LABEL.json, train.py --eval_only's JSON line."""
    out = {}
    for label, (variant, _) in (cfg.table.evals or {}).items():
        if variant not in labels:
            continue
        losses = {}
        for s in seeds:
            if not is_done(cfg, variant, s):
                continue
            record = eval_only(eval_command(cfg, label, s), record_dir(cfg, variant, s) / f'eval_{label}.json')
            losses[s] = record['validation/loss']
        values = list(losses.values())
        out[label] = {'seeds': losses, 'mean': sum(values) / len(values) if values else None,
                      'std': longdoc.std(values), 'command': ' '.join(['python', *eval_command(cfg, label, '{seed}')])}
    return out


def launch(cmd, threads, log_path):
    env = {**os.environ, 'OMP_NUM_THREADS': str(threads), 'MKL_NUM_THREADS': str(threads)}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, 'a') as log:
        return subprocess.run([sys.executable, *cmd], cwd=common.REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT).returncode


def train_all(cfg, labels, seeds):
    todo = [(label, s) for s in seeds for label in labels if not is_done(cfg, label, s)]   # seed by seed
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // cfg.jobs)
    if cfg.table.pretrain and not pretrain_done(cfg):           # once, on every core, before anything starts from it
        print('python', shlex.join(pretrain_command(cfg)), flush=True)
        if not cfg.dry_run:
            code = launch(pretrain_command(cfg), os.cpu_count() or 1, pretrain_dir(cfg) / 'train.out')
            if code or not pretrain_done(cfg):
                raise train.UserError(f"the pretraining stopped (exit {code}): see {pretrain_dir(cfg) / 'train.out'}")
    for label, s in todo:
        print('python', shlex.join(command(cfg, label, s)))
    if cfg.dry_run or not todo:
        return
    print(f"{len(todo)} runs, {cfg.jobs} at a time, {threads} threads each; output in OUT/train.out", flush=True)
    def run(label, s):                  # train, then keep its results (and readings) at once, with the same threads
        code = launch(command(cfg, label, s), threads, run_dir(cfg, label, s) / 'train.out')
        if is_done(cfg, label, s):
            keep_results(cfg, label, s, threads)
        return code

    with concurrent.futures.ThreadPoolExecutor(cfg.jobs) as pool:
        futures = {pool.submit(run, label, s): (label, s) for label, s in todo}
        for f in concurrent.futures.as_completed(futures):
            label, s = futures[f]
            record = final_eval(run_dir(cfg, label, s))
            loss = f"{record['validation/loss']:.4f}" if record else 'none'
            print(f"{label} seed {s}: exit {f.result()}, validation loss {loss}", flush=True)


def summary(cfg, labels, seeds):
    """{label: {'seeds': {seed: loss}, 'mean', 'std'}} over the finished runs."""
    out = {}
    for label in labels:
        losses = {s: (final_eval(run_dir(cfg, label, s)) or kept_eval(cfg, label, s))['validation/loss']
                  for s in seeds if is_done(cfg, label, s)}
        values = list(losses.values())
        out[label] = {'seeds': losses, 'mean': sum(values) / len(values) if values else None,
                      'std': longdoc.std(values), 'command': ' '.join(['python', *command(cfg, label, '{seed}')])}
    return out


def same_weights(ablation_path, main_path):
    """The ablation (checkpoints read otherwise) minus the same checkpoints read as trained (the main longdoc JSON),
    paired by document and by seed, since the weights are the same: per bucket the mean difference (nats, and bits
    per character or byte), its standard error across documents, and the spread (std) of the seeds' differences.
    Written into the ablation's JSON as 'vs_as_trained'. -> the rows"""
    ablation, main = (json.loads(Path(p).read_text()) for p in (ablation_path, main_path))
    N = np.array(ablation['doc_tokens'])
    diffs = [np.array(info['doc_nll_sums']) - np.array(main['runs'][run]['doc_nll_sums'])
             for run, info in ablation['runs'].items()]
    Y = np.array(ablation['doc_bytes']) if ablation['unit'] else None
    rows = [{'bucket': name} for name in ablation['bucket_names']]
    for key, scale, weights in longdoc.paired_quantities(N, Y, ablation['unit']):
        mean, se = longdoc.ratio_stats(np.mean(diffs, axis=0) * scale, weights, N > 0)
        per_seed = [longdoc.ratio_stats(d * scale, weights, N > 0)[0] for d in diffs]
        for k, row in enumerate(rows):
            row[f'diff_{key}'], row[f'diff_{key}_se'] = mean[k], se[k]
            row[f'diff_{key}_seed_std'] = longdoc.std([p[k] for p in per_seed])
    ablation['vs_as_trained'] = rows
    Path(ablation_path).write_text(json.dumps(ablation, indent=1) + '\n')
    return rows


def main(argv=None):
    def go(argv):
        cfg = common.parse(argv, DemosConfig)
        labels, seeds = selected(cfg), common.int_list(cfg.seeds, 'seeds')
        if not seeds or not labels:
            raise train.UserError("--seeds and --variants must name at least one seed and one variant")
        if cfg.train or cfg.dry_run:
            train_all(cfg, labels, seeds)
        if cfg.dry_run:
            return
        done = {label: [s for s in seeds if is_done(cfg, label, s)] for label in labels}
        if not any(done.values()):
            raise train.UserError(f"no finished run of {cfg.variants} (seeds {cfg.seeds}) in {cfg.out_root} or "
                                  f"{kept_root(cfg)}: nothing to summarise")
        for label, kept in done.items():              # runs finished before (or by another bench/demos.py)
            for s in kept:
                keep_results(cfg, label, s)
        result = summary(cfg, labels, seeds)
        print("\nvalidation loss (nats/token) over seeds")
        for label, r in result.items():
            spread = f" +- {r['std']:.4f}" if r['std'] is not None else ''
            mean = f"{r['mean']:.4f}" if r['mean'] is not None else 'no finished run'
            print(f"  {label:20s} {mean}{spread}   ({len(r['seeds'])} seeds)")
        payload = {'runs': result}
        if cfg.table.pretrain:                           # the starting point, and the fine-tuned weights otherwise
            payload['pretrained'] = pretrained_eval(cfg)
            payload['evals'] = evaluate_otherwise(cfg, labels, seeds)
            print(f"  {'pretrained (step 0)':20s} {longdoc.fmt(payload['pretrained']['validation/loss'])}")
            for label, r in payload['evals'].items():
                print(f"  {label:20s} {longdoc.fmt(r['mean'])} +- {longdoc.fmt(r['std'])}   ({len(r['seeds'])} seeds)")
        suffix, results = (f'_{cfg.name}' if cfg.name else ''), results_dir(cfg)
        common.write_json(results / f'demos{suffix}.json', payload, 'bench/demos.py', argv)
        done = {label: seeds for label, seeds in done.items() if seeds}
        base = [f'--baseline={cfg.table.baseline}'] if cfg.table.baseline in done else []

        def kept(label, reading, variant=None):        # the kept readings of a label's finished runs
            return [str(reading_path(cfg, variant or label, s, reading)) for s in done[variant or label]]

        def longdoc_to(name, files, *flags):          # -> longdoc_demos[_NAME]{name}.json, from the kept readings
            longdoc.main([f"--reuse={','.join(files)}", *flags, f'--split={cfg.split}',
                          f'--out={results / f"longdoc_demos{suffix}{name}.json"}'])

        if not cfg.longdoc:
            return
        sets = reading_sets(cfg)
        for reading, flags in sets.items():
            longdoc_to(reading, [f for label in done for f in kept(label, reading)], *base, *flags)
        for control, others in cfg.table.matched.items():   # the same comparison against a matched control
            here = [x for x in (control, *others) if x in done]
            if control in done and len(here) > 1:
                longdoc_to(f'_vs_{control}', [f for x in here for f in kept(x, '')], f'--baseline={control}',
                           *sets[''])
        for label, (variant, flags) in cfg.table.ablations.items():   # the same checkpoints, read otherwise
            if variant not in done:
                continue
            for reading in reading_sets(cfg, ablation=True):
                longdoc_to(f'_{label}{reading}', kept(label, f'_{label}{reading}', variant), *flags, *sets[reading])
                rows = same_weights(results / f'longdoc_demos{suffix}_{label}{reading}.json',
                                    results / f'longdoc_demos{suffix}{reading}.json')
                if not reading:
                    print(f"{label} - {variant} (same weights, nats):",
                          '  '.join(f"{r['bucket']} {longdoc.fmt(r['diff_nll'], '.4f', True)} +- "
                                    f"{longdoc.fmt(r['diff_nll_se'])}" for r in rows))
                if reading and label in cfg.table.joined:       # one comparison (and figure) with the runs
                    longdoc_to(f'{reading}_with_{label}', [*kept(label, f'_{label}{reading}', variant),
                                                           *(f for x in done for f in kept(x, reading))],
                               *base, *flags, *sets[reading])
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
