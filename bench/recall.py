"""
Long-range recall, trained through train.py: passkey retrieval, the ∞-former paper's sorting task, and associative
recall (many key-value pairs per segment, questions about pairs written segments back).

    python bench/recall.py                                   # both tasks, every variant present, CPU
    python bench/recall.py --tasks=passkey --variants=baseline,xl --tokens=500000
    python bench/recall.py --device=cuda                     # bf16 + compile, as train.py does on a GPU
    python bench/recall.py --tasks=passkey --seeds=1,2,3 --bptt_segments=16 --curriculum=0.25   # BPTT as Infini trains
    python bench/recall.py --tasks=assoc --variants=infini_linear --tokens=32000000 --bptt_segments=16 --batch_size=8 --curriculum=0.25
    python bench/recall.py --merge=seed1.json,seed2.json --out=both.json   # runs of other seeds/variants as one
    python bench/recall.py --tasks=passkey --tokens=1000000000 --data_tokens=32000000   # 32M written, read 31 times

For each task the data are written in train.py's format (data/README.md) to a directory under --out_dir, every
variant is trained on it with `train.train([...flags])` (the same token budget for every model), and its
checkpoint is then scored on fresh episodes at fixed depths (passkey) or lengths (sorting): teacher-forced
accuracy of the answer tokens (argmax of the logits), with the memory carried segment by segment, and again with
the memory emptied before every segment (what the memory carries).

Passkey. An episode is: filler, KEY d1 d2 d3 d4 d5, filler, ASK d1 d2 d3 d4 d5, filler. The filler is a fixed
12-token phrase repeated (predictable, so the loss concentrates on the answer), the key 5 random digits. Depth =
distance from KEY to ASK. At evaluation the answer sits at the end of a segment, so a model that sees
seg_len + mem_len tokens back retrieves every digit up to depth seg_len + mem_len - 5 (its window).
Sorting (Martins et al. 2022, §4.1). L symbols of a 20-symbol vocabulary drawn from p = α p0 + (1 − α) p1, α
rising linearly from 0 to 1 over the sequence (p0, p1 ~ Dirichlet(1) per episode), then SEP and the 20 symbols
in decreasing order of frequency in the whole sequence (ties: smaller symbol first).
Associative recall (assoc_episode). Every segment writes `assoc_pairs` pairs (one token each) and asks questions "k? v"
(27 at T = 64) about pairs of this or any earlier segment of the episode; the scored questions (evaluation) ask
pairs written exactly d segments back and asked nowhere since. Depth is counted in segments (`--assoc_depths`).
`--assoc_past_share=p` makes a training question ask an earlier segment with probability p (its own otherwise).
How often training needs the memory is recorded per task: `memory_answers_per_token` in the JSON (answers whose
evidence is only in an earlier segment, per training token; passkey 0.005 by default, assoc 0.16).

The trap, and how the tasks are made learnable. Only the answer depends on the evidence, and with the evidence
segments back a model whose memory is detached gets no gradient saying what to store. So most training episodes
(inside_fraction, 9 in 10 by default: 59% of the passkey tokens, 35% of the sorting tokens) put the evidence where
gradient reaches: the passkey and its question in the same segment (depth < seg_len), sorting sequences short
enough that sequence and answer share a segment. The others spread depths log-uniformly up to `max_depth_factor`
windows (passkey) and lengths up to the longest evaluated (sorting): there the same skill has to be done from the
memory. Episodes start at segment boundaries and `--reset_at_doc=True` empties the memory at each, so the only key
in memory is the episode's own. Every model must solve the in-segment cases (the first column) before its other
columns measure anything: `in_window_learned` in the JSON (>= 0.95). The retrieval skill appears after a plateau
(every digit predicted uniformly). At the language models' init, N(0, 0.02), that plateau lasted thousands of
steps at d_model 64 and its length varied with the model, the seed and the answer digit; at init_std 0.1
(RECALL_SIZE) every model left it on every seed (bench/README.md).
"""

import contextlib
import dataclasses
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from configurator import RENAMED_FLAGS  # noqa: E402

# The recall size: small enough to train in minutes per model on one CPU core.
# init_std 0.1 at n_embd 64 (recall_size scales it as 1/sqrt(n_embd)) instead of the LM default 0.02: at d_model 64
# the 0.02 start leaves the query-key products so small that the in-window lookup sits on a plateau for thousands
# of steps (bench/README.md)
RECALL_SIZE = dict(vocab_size=64, n_layer=2, n_embd=64, n_head=2, d_head=32, d_inner=256, seg_len=64, init_std=0.1)
RECALL_MEMORY = dict(mem_len=64, cmem_len=32, n_basis=64)      # window W = seg_len + mem_len = 128
# the ∞-former's synthetic-task setting (the authors' sorting code; config/recall/infformer_sorting.py: their model)
SYNTHETIC = {'infformer': dict(basis_widths='0.01,0.05', tau=0.75, ridge_lambda=1.0, sigma_sq_min=1e-6)}

# passkey tokens: digit v at place j of the key is token 10 j + v (0 ... 49, see passkey_episode)
KEY, ASK, FILLER0, N_FILLER = 50, 51, 52, 12
# sorting tokens
N_SYMBOLS, SEP, PAD = 20, 20, 21
# associative-recall tokens (its own vocabulary): pair (k, v) is token N_VALUES k + v, question "k?" QUESTION0 + k,
# value v VALUE0 + v
N_KEYS, N_VALUES = 80, 8
QUESTION0 = N_KEYS * N_VALUES
VALUE0 = QUESTION0 + N_KEYS
ASSOC_SEP, ASSOC_PAD = VALUE0 + N_VALUES, VALUE0 + N_VALUES + 1
ASSOC_VOCAB = 768                                   # 730 tokens, padded to a multiple of 64
TASKS = ('passkey', 'sorting', 'assoc')


@dataclass
class RecallConfig:
    tasks: str = 'passkey,sorting'
    variants: str = 'all'
    device: str = 'cpu'
    tokens: int = 4_000_000        # training tokens per model per task (the same budget for every model)
    data_tokens: int = 0           # training tokens written per task and seed; 0 = tokens (one pass). Fewer: train.py
                                   # reads them again (epochs), each epoch starting with the curriculum's share
    batch_size: int = 16
    learning_rate: float = 3e-3
    inside_fraction: float = 0.9   # training episodes whose evidence and question share a segment (see the trap;
                                   # not assoc, whose every segment asks about itself too)
    warmup_iters: int = 100
    min_lr: float = 3e-3           # the cosine schedule's floor (= learning_rate: constant after warm-up)
    grad_clip: float = 1.0
    depths: str = '32,96,160,192,384,768,1024'   # passkey depths evaluated (W = 128 at the recall size)
    max_depth_factor: float = 8.0  # passkey training depths up to this many windows
    lengths: str = '32,1024,2048,4096'       # sorting lengths evaluated (32: sequence and answer in one segment)
    assoc_depths: str = '0,1,2,4,8'          # assoc: segments from the pairs' segment to the scored questions
                                             # (0: the same segment). Training streams hold 1 ... max + 1 segments
    assoc_pairs: int = 8                     # assoc: pairs written per segment (half of them scored)
    assoc_past_share: float = -1.0           # assoc training: a question asks an earlier segment with this
                                             # probability, else its own; -1 = any segment 0 ... s uniformly
    eval_episodes: int = 64        # per depth / length
    out_dir: str = 'out-recall'    # data, checkpoints and logs
    out: str = str(common.RESULTS / 'recall.json')
    seed: int = 1337
    seeds: str = ''                # train every variant once per seed ('1,2,3'); '' = --seed only
    bptt_segments: int = 1         # train.py's: the graph is kept over k segments (Infini-attention's paper: 16).
                                   # Training episodes are then packed so that none crosses a k-segment boundary
    curriculum: float = 0.0        # the first fraction of training reads in-window episodes only, then the mix
    plot: bool = True              # write the plot (needs matplotlib)
    overrides: str = ''            # model Config or train.py fields for every variant, e.g. gate_lr_mult=1,
                                   # reset_every=16 (an ablation; --bptt_segments has its own flag)
    rescore: bool = False          # no training: score the checkpoints under out_dir (an earlier run with the same
                                   # flags) at --depths / --lengths; training records come from the JSON at --out
    strict: bool = True            # a missing model file or Config field is an error (False: skip it)
    merge: str = ''                # no training: combine result JSONs (a,b,...) of runs on other seeds or variants
                                   # (separate processes) into --out, means and stds over all their seeds
    seg_len: int = RECALL_SIZE['seg_len']
    mem_len: int = RECALL_MEMORY['mem_len']
    n_layer: int = RECALL_SIZE['n_layer']
    n_embd: int = RECALL_SIZE['n_embd']

    def __post_init__(self):
        if not 0 <= self.data_tokens <= self.tokens:
            raise ValueError(f"data_tokens must be in [0, tokens={self.tokens}] (0 = tokens), got {self.data_tokens}")
        for name in ('tokens', 'batch_size', 'eval_episodes', 'seg_len', 'n_layer', 'n_embd', 'bptt_segments'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for t in self.tasks.split(','):
            if t not in TASKS:
                raise ValueError(f"unknown task {t!r}; known: {', '.join(TASKS)}")
        if 'assoc' in self.tasks.split(','):
            n_pairs, depth = self.assoc_pairs, max(eval_columns('assoc', self))
            if not 2 <= n_pairs <= (self.seg_len - 3) // 3:
                raise ValueError(f"assoc_pairs must be in [2, {(self.seg_len - 3) // 3}] at seg_len={self.seg_len} "
                                 f"(as many questions as pairs), got {n_pairs}")
            if (depth + 1) * n_pairs > N_KEYS:
                raise ValueError(f"assoc_depths: an episode of {depth + 1} segments of {n_pairs} pairs needs more "
                                 f"than the {N_KEYS} keys; at most {N_KEYS // n_pairs - 1} at seg_len={self.seg_len}")
        if self.overrides and '=' not in self.overrides.split(',')[0]:
            raise ValueError(f"overrides must be field=value,..., got {self.overrides!r}")
        if not (self.assoc_past_share == -1 or 0 <= self.assoc_past_share <= 1):
            raise ValueError(f"assoc_past_share must be in [0, 1] or -1 (uniform), got {self.assoc_past_share}")
        if not 0 <= self.inside_fraction <= 1:
            raise ValueError(f"inside_fraction must be in [0, 1], got {self.inside_fraction}")
        if not 0 <= self.curriculum <= 1:
            raise ValueError(f"curriculum must be in [0, 1], got {self.curriculum}")
        if 'bptt_segments' in dict(common.override_items(self.overrides)):
            raise ValueError("set bptt_segments with --bptt_segments (it also packs the episodes), not --overrides")
        if self.seg_len < 32:
            raise ValueError("seg_len must be >= 32 (a sorting answer of 21 tokens must fit in a segment)")
        self.seed_list()                                   # a one-line error for --seeds=1,x

    def seed_list(self):
        return common.int_list(self.seeds, 'seeds') or [self.seed]


# -----------------------------------------------------------------------------------------------------------
# Episodes. Each returns (tokens, targets): targets[i] is the answer token to predict at position i, -1 elsewhere.


def filler(n, phase=0):
    return FILLER0 + (np.arange(phase, phase + n) % N_FILLER)


def passkey_episode(rng, depth, lead):
    """lead filler tokens, KEY + 5 digits, filler up to `depth` tokens after KEY, ASK + 5 digits.
    The digits are place-tagged: digit v at place j is token 10 j + v, so recalling place j is one content lookup
    ("the place-j token") that one attention layer can learn. With plain digit tokens the answer needs an
    induction circuit (find KEY, step to its successor), and at this size and budget the models stayed on the
    plateau where every digit is predicted uniformly, inside the window too (5M tokens at init_std 0.02: accuracy
    0.10 at depth 32; not re-tried at init_std 0.1).
    """
    digits = 10 * np.arange(5) + rng.integers(0, 10, 5)
    body = np.concatenate([filler(lead), [KEY], digits, filler(depth - 6, phase=lead), [ASK], digits])
    targets = np.full(len(body), -1)
    ask = lead + depth
    targets[ask:ask + 5] = digits                        # position ask + j predicts digit j+1 (next token)
    return body, targets


def passkey_train_episode(rng, T, W, max_depth_factor, inside_fraction=0.5):
    if rng.random() < inside_fraction:                   # inside one segment: gradient reaches the evidence
        depth = int(rng.integers(6, T - 6))
        lead = int(rng.integers(0, T - depth - 6 + 1))
    else:                                                # log-uniform up to max_depth_factor windows
        depth = int(np.exp(rng.uniform(np.log(T), np.log(max_depth_factor * W + 1))))
        lead = int(rng.integers(0, T))
    return passkey_episode(rng, depth, lead)


def passkey_eval_episode(rng, depth, T):
    """The answer's 5 digits are the last 5 tokens of a segment (deterministic visibility)."""
    n_segments = math.ceil((depth + 6) / T)
    lead = n_segments * T - 6 - depth
    return passkey_episode(rng, depth, lead)


def sorting_episode(rng, length):
    p0, p1 = rng.dirichlet(np.ones(N_SYMBOLS), size=2)
    alpha = np.linspace(0.0, 1.0, length)[:, None]
    p = alpha * p0 + (1 - alpha) * p1                     # (L, 20), α rises from 0 to 1
    u = rng.random((length, 1))
    seq = np.minimum((p.cumsum(1) < u).sum(1), N_SYMBOLS - 1)
    counts = np.bincount(seq, minlength=N_SYMBOLS)
    answer = np.lexsort((np.arange(N_SYMBOLS), -counts))  # decreasing count, ties by symbol
    body = np.concatenate([seq, [SEP], answer])
    targets = np.full(len(body), -1)
    targets[length:length + N_SYMBOLS] = answer           # SEP predicts answer[0], answer[j] predicts answer[j+1]
    return body, targets


def sorting_train_episode(rng, T, max_length, inside_fraction=0.5):
    if rng.random() < inside_fraction:                   # sequence and answer in one segment
        length = int(rng.integers(8, T - N_SYMBOLS))
    else:
        length = int(np.exp(rng.uniform(np.log(T), np.log(max_length + 1))))
    return sorting_episode(rng, length)


def assoc_episode(rng, n_segments, T, n_pairs, depth=None, past_share=-1.0):
    """Associative recall over n_segments segments. Segment s: n_pairs pair tokens (key, value), keys new to the
    episode, SEP, then questions "k? v" about keys written in segments 0 ... s (a segment uniformly, then a key of
    it), padding to T. The target at "k?" is v (1 of N_VALUES). A pair is one token, as the passkey's place-tagged
    digits: answering is one content lookup ("the pair with key k"), which one attention layer can learn. With key
    and value as two tokens the answer needs an induction circuit (an earlier version of this task, not kept: XL's
    loss stayed flat, 3.93, over 3M in-segment tokens; in-segment accuracy 0.05 after 4M tokens). Every segment
    asks about every earlier one, so each distance gets gradient from many questions (the passkey has one key per
    episode).
    depth=d (evaluation; n_segments = d + 1): only the last segment's first n_pairs/2 questions are scored, asking
    the keys of segment 0 that no earlier question asked (earlier ones draw on the other half of each segment's
    keys), so a scored value is nowhere in the episode but in its pair, d segments back.
    past_share (training): a question of segment s > 0 asks an earlier segment (uniformly) with this probability and
    its own otherwise, which sets how many answers need the memory; -1: any of 0 ... s uniformly."""
    n_questions = (T - n_pairs - 1) // 2
    keys = rng.choice(N_KEYS, (n_segments, n_pairs), replace=False)
    values = rng.integers(0, N_VALUES, (n_segments, n_pairs))
    free = n_pairs if depth is None else n_pairs // 2    # keys 0 .. free-1 of each segment may be asked freely
    body, targets = [], []
    for s in range(n_segments):
        src = rng.integers(0, s + 1, n_questions)        # the segment each question asks about
        if past_share >= 0 and s > 0:
            src = np.where(rng.random(n_questions) < past_share, rng.integers(0, s, n_questions), s)
        slot = rng.integers(0, free, n_questions)
        scored = np.full(n_questions, depth is None)
        if depth is not None and s == n_segments - 1:
            n_scored = n_pairs - free
            src[:n_scored], slot[:n_scored], scored[:n_scored] = s - depth, free + rng.permutation(n_scored), True
        k, v = keys[src, slot], values[src, slot]
        questions = np.stack([QUESTION0 + k, VALUE0 + v], 1).ravel()
        segment = np.concatenate([N_VALUES * keys[s] + values[s], [ASSOC_SEP], questions])
        body.append(np.concatenate([segment, np.full(T - len(segment), ASSOC_PAD)]))
        target = np.full(T, -1)
        at = n_pairs + 1 + 2 * np.arange(n_questions)     # "k?" predicts its value (the next token)
        target[at[scored]] = VALUE0 + v[scored]
        targets.append(target)
    return np.concatenate(body), np.concatenate(targets)


def assoc_train_episode(rng, T, n_pairs, max_segments, inside_fraction, past_share=-1.0):
    """inside_fraction = 1 (the curriculum): one segment. Otherwise 1 ... max_segments segments, uniformly (every
    multi-segment episode already asks about its own segment in 1/(s + 1) of segment s's questions)."""
    n = 1 if inside_fraction >= 1 else int(rng.integers(1, max_segments + 1))
    return assoc_episode(rng, n, T, n_pairs, past_share=past_share)


def window_reference(rng, length, window, n=2000):
    """Accuracy of sorting by the frequencies in the last `window` symbols only (what a model that sees no further
    back than its window could at best infer from counts), on fresh episodes."""
    correct = 0
    for _ in range(n):
        body, targets = sorting_episode(rng, length)
        seq = body[:length][-window:]
        counts = np.bincount(seq, minlength=N_SYMBOLS)
        guess = np.lexsort((np.arange(N_SYMBOLS), -counts))
        correct += (guess == targets[length:length + N_SYMBOLS]).sum()
    return correct / (n * N_SYMBOLS)


# -----------------------------------------------------------------------------------------------------------
# Data in train.py's format


PAD_TOKEN = {'passkey': None, 'sorting': PAD, 'assoc': ASSOC_PAD}    # None: the filler phrase
VALID_COLUMN = {'passkey': 96, 'sorting': 256, 'assoc': 2}          # train.py's validation episodes


def task_vocab(task):
    return ASSOC_VOCAB if task == 'assoc' else RECALL_SIZE['vocab_size']


def eval_episode(task, rng, column, cfg):
    """One scored episode of a column: a passkey depth, a sorting length or an assoc depth in segments."""
    if task == 'passkey':
        return passkey_eval_episode(rng, column, cfg.seg_len)
    if task == 'sorting':
        return sorting_episode(rng, column)
    return assoc_episode(rng, column + 1, cfg.seg_len, cfg.assoc_pairs, depth=column)


def pad_to(body, targets, T, pad_token):
    n = -len(body) % T
    if n:
        pad = filler(n) if pad_token is None else np.full(n, pad_token)
        body = np.concatenate([body, pad])
        targets = np.concatenate([targets, np.full(n, -1)])
    return body, targets


def write_task_data(task, data_dir, cfg, n_streams, n_segments, seed):
    """n_streams streams of exactly n_segments segments of whole episodes (the last one cut), so every episode
    starts at a segment boundary; train_docs.npy marks the episode starts (for --reset_at_doc).
    The first cfg.curriculum of every stream holds in-window episodes only. With bptt_segments = k > 1 an episode
    of at most k segments that would cross a multiple of k segments starts at the next one instead (filler
    before it), so train.py's graph always holds a whole episode: the answer's gradient reaches the evidence."""
    T, W, k = cfg.seg_len, cfg.seg_len + cfg.mem_len, cfg.bptt_segments
    rng = np.random.default_rng(seed)
    max_length = max(eval_columns('sorting', cfg))
    max_segments = max(eval_columns('assoc', cfg)) + 1
    pad_token = PAD_TOKEN[task]
    streams, starts = [], []
    for s in range(n_streams):
        parts, n = [], 0
        while n < n_segments * T:
            inside = 1.0 if n < cfg.curriculum * n_segments * T else cfg.inside_fraction
            if task == 'passkey':
                body, targets = passkey_train_episode(rng, T, W, cfg.max_depth_factor, inside)
            elif task == 'sorting':
                body, targets = sorting_train_episode(rng, T, max_length, inside)
            else:
                body, targets = assoc_train_episode(rng, T, cfg.assoc_pairs, max_segments, inside,
                                                    cfg.assoc_past_share)
            body, _ = pad_to(body, targets, T, pad_token)
            used, need = (n // T) % k, len(body) // T
            if k > 1 and used + need > k >= need:             # would cross a graph boundary: start at the next
                n_gap = (k - used) * T
                gap = filler(n_gap) if pad_token is None else np.full(n_gap, pad_token)
                parts.append(gap)
                n += len(gap)
            starts.append(s * n_segments * T + n)
            parts.append(body)
            n += len(body)
        streams.append(np.concatenate(parts)[:n_segments * T])
    train_tokens = np.concatenate(streams + [[pad_token or FILLER0]])   # + 1: the last target
    valid = np.concatenate([pad_to(*eval_episode(task, rng, VALID_COLUMN[task], cfg), T, pad_token)[0]
                            for _ in range(16)] + [[0]])
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    train_tokens.astype(np.uint16).tofile(data_dir / 'train.bin')
    for split in ('validation', 'test'):
        valid.astype(np.uint16).tofile(data_dir / f'{split}.bin')
    np.save(data_dir / 'train_docs.npy', np.asarray([s for s in starts if s < len(train_tokens) - 1], np.int64))
    meta = {'dataset': f'recall-{task}', 'vocab_size': task_vocab(task),
            'splits': {k: {'tokens': int(len(v))} for k, v in (('train', train_tokens), ('validation', valid))}}
    (data_dir / 'meta.json').write_text(json.dumps(meta))
    return data_dir


# -----------------------------------------------------------------------------------------------------------
# Training (train.py) and scoring


def memory_answers_per_token(task, cfg, n_episodes=2000, seed=0):
    """How often training asks for the memory: answers whose evidence lies only in an earlier segment (the last
    earlier position that shows the answer: a passkey digit's key digit; an assoc value's pair token, or an
    earlier "k? v" of the same key), per training token, over n_episodes episodes of the mix after the curriculum
    (segments padded as in training). For a memory that reaches one segment back (Infini-attention) these are the
    answers that train what it writes. None for sorting (its evidence is counts over the whole sequence)."""
    if task == 'sorting':
        return None
    T, W = cfg.seg_len, cfg.seg_len + cfg.mem_len
    rng = np.random.default_rng(seed)
    n_answers = n_tokens = 0
    for _ in range(n_episodes):
        if task == 'passkey':
            body, targets = passkey_train_episode(rng, T, W, cfg.max_depth_factor, cfg.inside_fraction)
        else:
            body, targets = assoc_train_episode(rng, T, cfg.assoc_pairs, max(eval_columns('assoc', cfg)) + 1,
                                                cfg.inside_fraction, cfg.assoc_past_share)
        n_tokens += -(-len(body) // T) * T
        for i in np.flatnonzero(targets >= 0):
            y = targets[i]
            if task == 'passkey':
                shows = body[:i] == y
            else:
                pair = N_VALUES * (body[i] - QUESTION0) + (y - VALUE0)
                shows = (body[:i] == pair) | np.append(body[:i - 1] == body[i], False) & (body[1:i + 1] == y)
            n_answers += int(np.flatnonzero(shows)[-1] // T < i // T)
    return n_answers / n_tokens


def model_fields(spec, size, cfg):
    """The variant's Config fields at the recall size (memory lengths from cfg), and --overrides' model fields.
    Overrides that are train.py fields are left to train_overrides."""
    fields = {**spec, **size}
    name = fields.pop('model')
    fields.update(SYNTHETIC.get(name, {}))
    name = dict(common.override_items(cfg.overrides)).get('model', name)   # model=NAME: a lab/ subclass stands in
    module = common.train.import_model(name)
    known = {f.name for f in dataclasses.fields(module.Config)}
    for f in common.ZERO_FIELDS:
        if f in known:
            fields.setdefault(f, 0.0)
    for key, value in common.override_items(cfg.overrides):
        if key in known:
            fields[key] = value                               # a string, parsed by train.py as its flags are
        elif key in RENAMED_FLAGS:
            raise common.train.UserError(f"--overrides: {key} was renamed {RENAMED_FLAGS[key]}")
        elif key not in TRAIN_FIELDS:
            raise common.train.UserError(f"--overrides: {key!r} is neither a field of model_{name}.py's Config "
                                         f"nor a train.py flag")
    return name, fields


TRAIN_FIELDS = {f.name for f in dataclasses.fields(common.train.TrainConfig)}


def train_overrides(cfg):
    """--overrides' train.py fields (reset_every=16, ...) as train.py flags."""
    return [f'--{k}={v}' for k, v in common.override_items(cfg.overrides) if k in TRAIN_FIELDS and k != 'model']


def train_steps(cfg, tokens=None):
    """Optimizer steps (graphs of bptt_segments per stream) in cfg.tokens, or in tokens."""
    return max(1, (tokens or cfg.tokens) // (cfg.batch_size * cfg.seg_len * cfg.bptt_segments))


def train_variant(task, variant, spec, size, cfg, data_dir, out_dir, seed):
    name, fields = model_fields(spec, {**size, 'vocab_size': task_vocab(task)}, cfg)
    steps = train_steps(cfg)
    argv = [f'--model={name}', f'--data_dir={data_dir}', f'--out_dir={out_dir}', f'--device={cfg.device}',
            f'--batch_size={cfg.batch_size}', f'--max_iters={steps}', f'--learning_rate={cfg.learning_rate}',
            f'--warmup_iters={min(cfg.warmup_iters, steps // 10)}', f'--grad_clip={cfg.grad_clip}',
            f'--eval_interval={steps}', '--eval_tokens=2048', f'--log_interval={max(1, min(50, steps // 10))}',
            '--reset_at_doc=True', f'--seed={seed}', f'--min_lr={cfg.min_lr}',
            f'--bptt_segments={cfg.bptt_segments}']
    argv += [f'--{k}={v}' for k, v in fields.items()] + train_overrides(cfg)
    if Path(out_dir).exists():
        shutil.rmtree(out_dir)                           # a fresh run (train.py appends to log.jsonl)
    t0 = time.perf_counter()
    common.train.train(argv)
    return argv, time.perf_counter() - t0, steps


def run_segments(model, x, T, ctx=contextlib.nullcontext(), reset_every_segment=False):
    """Feed tokens x (N, L) to the model segment by segment from an empty memory (emptied again before every
    segment with reset_every_segment). Yields (start, logits of x[:, start:start + T], the memory after them)."""
    memory = model.init_memory(x.size(0), x.device)
    for start in range(0, x.size(1), T):
        if reset_every_segment:
            memory = model.reset_memory(memory, torch.ones(x.size(0), dtype=torch.bool, device=x.device))
        with ctx:
            logits, _, memory, _ = model(x[:, start:start + T], memory)
        yield start, logits, memory


@torch.no_grad()
def score(model, episodes, T, device, ctx, reset_every_segment=False):
    """Teacher-forced accuracy of the answer tokens of equally long episodes [(tokens, targets)], memory carried
    segment by segment from an empty memory (or emptied before every segment).
    -> (token accuracy, exact rate, accuracy of each answer token in order: the places of a passkey)"""
    x = torch.as_tensor(np.stack([e[0] for e in episodes]), dtype=torch.long, device=device)    # (N, L)
    y = torch.as_tensor(np.stack([e[1] for e in episodes]), dtype=torch.long, device=device)    # (N, L)
    correct = torch.zeros(x.size(0), device=device)
    hits = []                                                      # (N,) per answer token, in order
    for start, logits, _ in run_segments(model, x, T, ctx, reset_every_segment):
        target = y[:, start:start + T]
        hit = (logits.argmax(-1) == target) & (target >= 0)
        correct += hit.sum(1)
        hits += [hit[:, i].float() for i in torch.nonzero((target >= 0).any(0)).flatten().tolist()]
    count = (y >= 0).sum(1)
    by_place = [float(h.mean()) for h in hits]
    return float(correct.sum() / count.sum()), float((correct == count).float().mean()), by_place


def eval_columns(task, cfg):
    flag = {'passkey': 'depths', 'sorting': 'lengths', 'assoc': 'assoc_depths'}[task]
    return common.int_list(getattr(cfg, flag), flag)


def evaluate_variant(task, out_dir, cfg, device, device_type):
    ckpt = common.train.load_checkpoint(Path(out_dir) / 'ckpt.pt', device)
    _, _, model = common.train.model_from_checkpoint(ckpt, out_dir)
    model.to(device).eval()
    ctx = common.autocast(device_type, common.train.resolve_dtype('auto', device_type))
    T = cfg.seg_len
    acc, exact, acc_reset, by_place = {}, {}, {}, {}
    for col in eval_columns(task, cfg):
        rng = np.random.default_rng(cfg.seed + col)          # the same episodes for every model
        eps = [pad_to(*eval_episode(task, rng, col, cfg), T, PAD_TOKEN[task]) for _ in range(cfg.eval_episodes)]
        acc[str(col)], exact[str(col)], by_place[str(col)] = score(model, eps, T, device, ctx)
        acc_reset[str(col)], _, _ = score(model, eps, T, device, ctx, reset_every_segment=True)
    return acc, exact, acc_reset, by_place


def final_aux(out_dir):
    """The last logged training values (loss, gates, auxiliary losses) of a run, from its log.jsonl."""
    records = [json.loads(line) for line in (Path(out_dir) / 'log.jsonl').read_text().splitlines()]
    train_records = [r for r in records if 'train/loss' in r]
    evals = [r for r in records if 'validation/loss' in r]
    out = {k: v for k, v in (train_records[-1] if train_records else {}).items() if k.startswith('train/')}
    if evals:
        out['validation/loss'] = evals[-1]['validation/loss']
    return out


def run_dir(cfg, task, variant, seed):
    return Path(cfg.out_dir) / task / variant / f'seed{seed}'


def task_data(task, cfg, seed):
    """The task's training data for this seed (read by every variant): all of --tokens, or --data_tokens of them
    (whole graphs of bptt_segments, so that the episodes stay packed when train.py starts the data again)."""
    n_segments = train_steps(cfg, cfg.data_tokens) * cfg.bptt_segments
    return write_task_data(task, Path(cfg.out_dir) / f'data-{task}-seed{seed}', cfg, cfg.batch_size, n_segments,
                           seed)


def seed_summary(accs):
    """[{column: accuracy} per seed] -> ({column: mean over seeds}, {column: std over seeds})"""
    cols = list(accs[0])
    return ({c: float(np.mean([a[c] for a in accs])) for c in cols},
            {c: float(np.std([a[c] for a in accs])) for c in cols})


def summarize(t, variant, per_seed):
    """Per column: the mean over seeds (what the plot shows), the std, and every seed's value. A passkey variant
    learned the in-window skill on a seed when its first column (in one segment) is >= 0.95."""
    accs = {seed: r[0] for seed, r in per_seed.items()}
    cols = list(next(iter(accs.values())))
    t['accuracy'][variant], t['accuracy_std'][variant] = seed_summary(list(accs.values()))
    t['accuracy_seeds'][variant] = {str(seed): a for seed, a in accs.items()}
    t['exact'][variant] = {c: float(np.mean([r[1][c] for r in per_seed.values()])) for c in cols}
    t['accuracy_memory_emptied'][variant] = {c: float(np.mean([r[2][c] for r in per_seed.values()])) for c in cols}
    t.setdefault('in_window_learned', {})[variant] = {str(seed): a[cols[0]] >= 0.95 for seed, a in accs.items()}
    t.setdefault('accuracy_by_place', {})[variant] = {str(seed): r[3] for seed, r in per_seed.items()}


PER_SEED = ('accuracy_seeds', 'in_window_learned', 'accuracy_by_place', 'runs')   # {variant: {seed: ...}}
SEED_MEANS = ('exact', 'accuracy_memory_emptied')                                    # {variant: {column: mean}}


def merge_results(paths):
    """Result JSONs of one task set trained in separate processes (other seeds of a variant, or other variants)
    as one: every (variant, seed) once, the mean and std over all of a variant's seeds recomputed from the
    per-seed accuracies, and the seed-averaged columns (exact, memory emptied) weighted by each file's seeds.
    The first file's date, torch version and command are dropped (merged_from keeps every file's command)."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    merged = {k: v for k, v in results[0].items() if k not in ('date', 'torch', 'threads', 'command')}
    merged.update(specs={k: v for r in results for k, v in r['specs'].items()}, tasks={},
                  merged_from=[{'file': str(p), 'command': r.get('command')} for p, r in zip(paths, results)])
    for task in dict.fromkeys(t for r in results for t in r['tasks']):
        parts = [(p, r['tasks'][task]) for p, r in zip(paths, results) if task in r['tasks']]
        t = merged['tasks'][task] = {**parts[0][1], **{k: {} for k in PER_SEED + SEED_MEANS + ('accuracy',
                                                                                                 'accuracy_std')}}
        for path, part in parts:
            if part['columns'] != t['columns']:
                raise common.train.UserError(f"--merge: {path} has {task} columns {part['columns']}, "
                                             f"{parts[0][0]} has {t['columns']}")
            for variant, seeds in part['accuracy_seeds'].items():
                clash = sorted(set(seeds) & set(t['accuracy_seeds'].get(variant, {})))
                if clash:
                    raise common.train.UserError(f"--merge: {task} {variant} seed {clash[0]} is in two files")
                for key in PER_SEED:
                    t[key].setdefault(variant, {}).update(part.get(key, {}).get(variant, {}))
                for key in SEED_MEANS:                      # summed, weighted by seeds; divided below
                    sums = t[key].setdefault(variant, {})
                    for c, a in part[key][variant].items():
                        sums[c] = sums.get(c, 0.0) + a * len(seeds)
        for variant, seeds in t['accuracy_seeds'].items():
            t['accuracy'][variant], t['accuracy_std'][variant] = seed_summary(list(seeds.values()))
            for key in SEED_MEANS:
                t[key][variant] = {c: a / len(seeds) for c, a in t[key][variant].items()}
        t['seeds'] = sorted({int(s) for seeds in t['accuracy_seeds'].values() for s in seeds})
    return merged


def run(cfg, specs, size, argv=(), skipped=None):
    if cfg.merge:
        paths = [p for p in cfg.merge.split(',') if p]
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            raise common.train.UserError(f"--merge: no result file {missing[0]}")
        result = merge_results(paths)
        common.write_json(cfg.out, result, 'bench/recall.py', argv)
        plot_results(cfg, specs, result)
        return result
    device, device_type = common.setup(cfg.device)
    W = cfg.seg_len + cfg.mem_len
    result = {'config': dataclasses.asdict(cfg), 'size': size, 'specs': specs, 'skipped': skipped or {},
              'device': device, 'window': W, 'tasks': {}}
    previous = json.loads(Path(cfg.out).read_text()) if cfg.rescore and Path(cfg.out).exists() else {}
    if previous:
        result['trained_by'] = previous.get('trained_by', previous.get('command'))
    seeds = cfg.seed_list()
    for task in [t for t in cfg.tasks.split(',') if t]:
        cols = eval_columns(task, cfg)
        data_dirs = {} if cfg.rescore else {seed: task_data(task, cfg, seed) for seed in seeds}
        t = {'columns': cols, 'seeds': seeds, 'accuracy': {}, 'accuracy_std': {}, 'accuracy_seeds': {},
             'exact': {}, 'accuracy_memory_emptied': {}, 'runs': {},
             'column_label': {'passkey': 'depth (tokens from KEY to ASK)', 'sorting': 'sequence length',
                              'assoc': 'segments from the pairs to the questions'}[task],
             'metric': {'passkey': 'digit accuracy', 'sorting': 'position accuracy', 'assoc': 'value accuracy'}[task],
             'chance': {'passkey': 0.1, 'sorting': 1 / N_SYMBOLS, 'assoc': 1 / N_VALUES}[task]}
        t['memory_answers_per_token'] = memory_answers_per_token(task, cfg)
        if task == 'sorting':
            rng = np.random.default_rng(cfg.seed)
            t['window_reference'] = {f'{w} tokens': {str(L): window_reference(rng, L, w, n=300) for L in cols}
                                     for w in (cfg.seg_len, W)}
        for variant, spec in specs.items():
            per_seed = {}
            for seed in seeds:
                out_dir = run_dir(cfg, task, variant, seed)
                if cfg.rescore:
                    if not (out_dir / 'ckpt.pt').exists():
                        raise common.train.UserError(f"--rescore=True: no checkpoint at {out_dir / 'ckpt.pt'}; "
                                                     "train first (the same command without --rescore)")
                    old = previous.get('tasks', {}).get(task, {}).get('runs', {}).get(variant, {})
                    t['runs'].setdefault(variant, {})[str(seed)] = old.get(str(seed)) or {'final': final_aux(out_dir)}
                else:
                    argv_train, seconds, steps = train_variant(task, variant, spec, size, cfg, data_dirs[seed], out_dir,
                                                               seed)
                    t['runs'].setdefault(variant, {})[str(seed)] = {
                        'train_argv': argv_train, 'train_seconds': seconds, 'steps': steps, 'final': final_aux(out_dir)}
                per_seed[seed] = evaluate_variant(task, out_dir, cfg, device, device_type)
                acc, _, acc_reset, by_place = per_seed[seed]
                first = by_place[str(cols[0])]
                print(f"{task} {variant} seed {seed}: " + ', '.join(f'{c}: {a:.2f}' for c, a in acc.items())
                      + f"  (memory emptied: {', '.join(f'{a:.2f}' for a in acc_reset.values())}; by answer "
                      f"token at {cols[0]}: {' '.join(f'{a:.2f}' for a in first[:N_SYMBOLS])})", flush=True)
            summarize(t, variant, per_seed)
        result['tasks'][task] = t
        common.write_json(cfg.out, result, 'bench/recall.py', argv)   # after every task: partial results survive
    plot_results(cfg, specs, result)
    return result


def plot_results(cfg, specs, result):
    """The accuracy plot next to --out and, after training, the first seed's training loss of every variant."""
    if not cfg.plot:
        return
    try:
        import plot
        plot.plot_recall(cfg.out, Path(cfg.out).with_suffix('.png'))
        for task in ([] if cfg.merge else result['tasks']):
            logs = [run_dir(cfg, task, v, cfg.seed_list()[0]) / 'log.jsonl' for v in specs]   # the first seed's
            out = Path(cfg.out).with_name(f'{Path(cfg.out).stem}_{task}_loss.png')
            plot.plot_loss([p for p in logs if p.exists()], out, labels=[v for v, p in zip(specs, logs) if p.exists()])
    except plot.NoMatplotlib as e:
        print(e)


def recall_size(cfg):
    """RECALL_SIZE at --seg_len, --n_layer, --n_embd; init_std scales as 1/sqrt(n_embd) (0.1 at n_embd 64)."""
    return {**RECALL_SIZE, 'seg_len': cfg.seg_len, 'n_layer': cfg.n_layer, 'n_embd': cfg.n_embd,
            'init_std': RECALL_SIZE['init_std'] * math.sqrt(RECALL_SIZE['n_embd'] / cfg.n_embd)}


def main(argv=None):
    common.cli(argv, RecallConfig, run,
               table=lambda cfg: common.variant_table(mem_len=cfg.mem_len, cmem_len=cfg.mem_len // 2,
                                                      n_basis=cfg.mem_len),
               size=recall_size)


if __name__ == '__main__':
    main()
