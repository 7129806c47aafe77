"""
Loss by position in the document: does a model's memory make the later tokens of a long document
cheaper than the early ones, and by how much more than a model without memory? (Or by copy distance: how far back
the token could have been copied from, --position=copy below.) For any checkpoints, in one command:

    python bench/longdoc.py --runs=xl:out-xl-s1,out-xl-s2,out-xl-s3 --runs=baseline:out-base-s1,out-base-s2 \\
        --baseline=baseline --split=validation

--runs=LABEL:RUN,RUN,... (repeat the flag, or separate groups with ';'): a RUN is an out_dir holding --ckpt
(ckpt.pt) or the path of a checkpoint file; the runs under one label are seeds of one model and are averaged. A
group without 'LABEL:' is labelled by its first run's directory name. --baseline names the label every other one
is compared with ('' = the first label).

What is read. The checkpoints' dataset (train_config data_dir, else data/<dataset>; --data_dir overrides it), split
--split (validation, test, or validation,test for the documents of both): <split>.bin and <split>_docs.npy, the
token offset where each document starts. Every run must read the same data (same tokens, same positions); the
tokenizer a checkpoint was trained on must be the one the data's meta.json names. Each document is read from its
start with the memory emptied there: documents go in parallel rows (--batch_size of them), each fed seg_len tokens
at a time with the memory carried; when a row's document ends, the rest of that segment is padding (ignored) and
the row takes the next document (longest first) with its memory emptied (model.reset_memory). Every token of
every document after its first is predicted exactly once, from exactly the tokens of its own document before it;
position p is the index in its document of the predicted token (p >= 1; the first token has no context and is not
scored). --max_tokens_per_doc reads only the first N tokens of every document (quick runs), --max_docs the first N
documents. Eval mode, no gradient; --eval_mem_len gives a model that has mem_len another memory length (as
train.py --eval_only --mem_len=... does: the weights are the same). --reset_every=k also empties the memory before
segments k, 2k, ... of every document, as train.py's reset_every does in training and evaluation (Infini-attention's
inputs of k segments); -1 takes each run's own training value.
--reuse=EARLIER.json[,MORE.json...] adds the labels of earlier results of this script to the comparison, from the
per-document sums they kept (doc_nll_sums): checkpoints that are gone can still be compared with, as long as the same
documents are read into the same buckets (checked against its doc_tokens, doc_bytes, bucket_edges, position and
copy_ngram). The runs of one label in several of them are that label's seeds; --runs may then be left out (the
documents are the first result's data_dir, or --data_dir). A checkpoint read under two labels (here and in an
earlier result, with another --eval_mem_len, say) keeps both readings, the earlier result's named 'RUN (LABEL)'.

Buckets of position (--buckets=64,256,1024,4096, the default -> [0,64) [64,256) [256,1024) [1024,4096)
[4096,end)). Per run, per bucket: the mean NLL per token (nats): total NLL / tokens of the bucket over all
documents; and where meta.json names the tokenizer, bits per character (bpc; bits per byte, bpb, on GPT-2 tokens):
total bits / total bytes of text the predicted tokens spell (end-of-document tokens spell 0 bytes); share: the
bucket's fraction of all predicted tokens. --position=segment buckets by the index in its segment of the input that
predicts the token.

Loss by copy distance (--position=copy). What a long memory can buy is concentrated on the tokens that could be
copied from far back in the document (rare names, repeated phrases: Memorizing Transformers, Wu et al. 2022; Sun et
al. 2021, "Do long-range language models actually use long-range context?"), which position buckets dilute among
all the others. So the predicted token p is bucketed by d(p): how far back the n-gram ending at p (tokens p-n+1 ...
p) last occurred in the same document, d = p - q for the largest q < p (q >= n - 1: the earlier n-gram lies wholly
in the document) with tokens q-n+1 ... q the same. A model that sees that far back could copy token p from q: it
follows an earlier occurrence of p's (n-1)-token context. Only the document's own earlier text counts (the memory is
emptied at each document start). Tokens whose n-gram never occurred before (or p < n - 1) are the last bucket,
'first'. --copy_ngram=n, 0 = by meta.json's tokenizer: 2 (a bigram) on GPT-2 tokens (and on data naming none), 6 on
bytes and characters. Buckets [1,e1) [e1,e2) ... [e_last,end) and first; --buckets left empty reads as
64,128,256,512,1024,4096 here. The per-token NLLs are those of the cache below (nothing is read again).

Standard errors. The tokens of one document are correlated (same text, same author, same names), so the token
count overstates the information: the standard error is taken across documents. The bucket mean is a ratio,
R = sum_d S_d / sum_d n_d (S_d: the document's summed NLL in the bucket, n_d its tokens there; for bpc, S_d in bits
and n_d its bytes), i.e. the mean of the per-document means S_d / n_d weighted by n_d. Its standard error treats
the D documents that have tokens in the bucket as independent draws (the ratio estimator's linearisation, a
cluster-robust standard error with documents as clusters):
    se(R)^2 = D / (D - 1) * sum_d (S_d - R n_d)^2 / (sum_d n_d)^2
(None with fewer than 2 documents). With 4 documents it is itself a rough estimate: read it as a scale, not as a
precise interval. A label with several seeds: the per-document sums are averaged over its seeds first (every seed
reads the same documents), so its mean is the mean of the seeds' means and its standard error is across documents
as above; separately, seed_std is the standard deviation (ddof 1) of the seeds' bucket means (training noise:
every seed reads the same documents). The difference of a label to the baseline is paired by document: R on
S_d = S_d(label) - S_d(baseline) with the same n_d, so the documents' shared difficulty cancels; its se is the
formula above on those differences, seed_se = sqrt(seed_std_label^2 / seeds_label + seed_std_base^2 /
seeds_base) (None unless both have 2+ seeds) and se_total = sqrt(se^2 + seed_se^2): the uncertainty of an
architecture's difference over other documents and other training seeds.

Cache. Each run's per-token NLLs are kept next to its checkpoint (<ckpt>.longdoc-<digest>.npz; the digest covers the
checkpoint file's size and modification time, the documents' tokens, --eval_mem_len, the resets, precision,
--batch_size and device), so adding a label or changing --buckets re-reads nothing; --cache=False reads every run
afresh and writes nothing.

Output: the tables (printed), bench/results/longdoc[_NAME].json (--name; --out overrides the path) with per run
and per label the bucket rows and the per-document sums (so other statistics can be computed), runs, data and
files named by paths relative to the repository (common.write_json), and a plot (.png next to the JSON): the
loss against log position (bucket midpoints, error bars: se across documents), and each label's difference to the
baseline (error bars: se_total); by copy distance, against log distance, the 'first' bucket a point of its own to
the right of the line.

Caveat: the sticky ∞-former (sticky=True) draws its memory's sample points from per-row random numbers, so its
per-document numbers depend on which row read the document (every other model's do not: tests/test_longdoc.py).
"""

import dataclasses
import hashlib
import heapq
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import train  # noqa: E402

SPLITS = ('train', 'validation', 'test')
DOCUMENT_BUCKETS = '64,256,1024,4096'       # the bucket edges where --buckets is left empty: by position
COPY_BUCKETS = '64,128,256,512,1024,4096'   # ... and by copy distance
COPY_NGRAM = {'gpt2': 2, 'bytes': 6, 'chars': 6}   # --copy_ngram=0: n by the data's tokenizer (none named: GPT-2's)


@dataclass
class LongDocConfig:
    runs: str = ''                    # LABEL:RUN,RUN,... (repeat --runs, or ';' between groups); RUN: out_dir or ckpt
    baseline: str = ''                # the label the others are compared with; '' = the first label
    ckpt: str = 'ckpt.pt'             # the checkpoint file inside an out_dir
    split: str = 'validation'         # validation, test, or validation,test (the documents of both)
    data_dir: str = ''                # '' = the data the checkpoints were trained on
    buckets: str = ''                 # bucket edges; '' = 64,256,1024,4096 (by copy distance 64,128,...,4096)
    position: str = 'document'        # what the buckets count: the position in the document, (segment) the index
                                      # of the predicted token's input in its segment, 0 ... seg_len - 1, or (copy)
                                      # the copy distance, plus a last bucket 'first' (see the docstring)
    copy_ngram: int = 0               # --position=copy: n of the n-grams; 0 = by the tokenizer (GPT-2 2, bytes 6)
    max_tokens_per_doc: int = 0       # read only the first N tokens of every document; 0 = the whole document
    max_docs: int = 0                 # only the first N documents of the split(s); 0 = all
    batch_size: int = 8               # documents read in parallel (rows)
    eval_mem_len: int = -1            # -1 = the model's own mem_len (only for models with a mem_len)
    reset_every: int = 0              # also empty the memory every k segments of a document (Infini's inputs of k
                                      # segments); 0 = only at document starts; -1 = as each run was trained
    device: str = 'auto'              # auto = cuda, then mps, then cpu
    dtype: str = 'auto'               # auto = bfloat16 on CUDA, float32 elsewhere (as train.py evaluates)
    name: str = ''                    # results in bench/results/longdoc_<name>.json ('' = longdoc.json)
    out: str = ''                     # the JSON path ('' = from --name); the plot goes next to it (.png)
    plot: bool = True
    cache: bool = True                # keep each run's per-token NLLs next to its checkpoint (<ckpt>.longdoc-*.npz)
    reuse: str = ''                   # earlier longdoc JSONs (comma-separated): their labels join the comparison from
                                      # the per-document sums kept, without their checkpoints (same documents and
                                      # buckets only); the runs of one label in several are its seeds

    def __post_init__(self):
        for name in ('max_tokens_per_doc', 'max_docs'):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_tokens_per_doc == 1:
            raise ValueError("max_tokens_per_doc must be 0 (whole documents) or >= 2 (one predicted token)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.eval_mem_len < -1:
            raise ValueError(f"eval_mem_len must be >= 0 (or -1 for mem_len), got {self.eval_mem_len}")
        if self.reset_every < -1:
            raise ValueError(f"reset_every must be >= 0 (or -1 for the run's training value), got {self.reset_every}")
        if self.position not in ('document', 'segment', 'copy'):
            raise ValueError(f"position must be document, segment or copy, got {self.position!r}")
        if self.copy_ngram < 0:
            raise ValueError(f"copy_ngram must be >= 1 (or 0 for the tokenizer's default), got {self.copy_ngram}")
        if self.dtype not in ('auto', 'float32', 'bfloat16', 'float16'):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for s in self.split.split(','):
            if s not in SPLITS:
                raise ValueError(f"split must be validation, test (or train), comma-separated, got {self.split!r}")

    def bucket_edges(self):
        """The bucket edges: --buckets, or where it is empty DOCUMENT_BUCKETS (COPY_BUCKETS by copy distance)."""
        return parse_buckets(self.buckets or (COPY_BUCKETS if self.position == 'copy' else DOCUMENT_BUCKETS))

    def out_path(self):
        if self.out:
            return Path(self.out)
        return common.RESULTS / (f'longdoc_{self.name}.json' if self.name else 'longdoc.json')


# -----------------------------------------------------------------------------------------------------------
# Flags: --runs may be repeated


def gather_runs_flags(argv):
    """train.py's parser keeps the last of a repeated flag: join every --runs=... into one (groups split by ';')."""
    groups = [a.split('=', 1)[1] for a in argv if a.startswith('--runs=')]
    rest = [a for a in argv if not a.startswith('--runs=')]
    return rest + ([f"--runs={';'.join(groups)}"] if groups else [])


def parse_runs(value):
    """'xl:a,b;base:c' -> {'xl': ['a', 'b'], 'base': ['c']} (insertion order). A group without 'LABEL:' gets the
    name of its first run's directory."""
    labels = {}
    for group in value.split(';'):
        group = group.strip()
        if not group:
            continue
        label, sep, paths = group.partition(':')
        if not sep or '/' in label or not label:
            label, paths = None, group
        paths = [p for p in paths.split(',') if p]
        if not paths:
            raise train.UserError(f"--runs: the label {label!r} has no runs (write LABEL:OUT_DIR,OUT_DIR,...)")
        label = label or Path(paths[0]).name
        if label in labels:
            raise train.UserError(f"--runs: the label {label!r} is given twice")
        labels[label] = paths
    seen = [p for paths in labels.values() for p in paths]
    twice = [p for p in seen if seen.count(p) > 1]
    if twice:
        raise train.UserError(f"--runs: {twice[0]} is given twice")
    return labels


def parse_buckets(value):
    edges = common.int_list(value, 'buckets')
    if any(e < 1 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
        raise train.UserError(f"--buckets takes increasing positive edges, got {value!r}")
    return edges


def bucket_names(edges, position='document'):
    """By position [0,e1) ... [e_last,end); by copy distance [1,e1) ... [e_last,end) and 'first'."""
    bounds = [1 if position == 'copy' else 0] + list(edges)
    return ([f'[{a},{b})' for a, b in zip(bounds, bounds[1:])] + [f'[{bounds[-1]},end)']
            + (['first'] if position == 'copy' else []))


# -----------------------------------------------------------------------------------------------------------
# Data and checkpoints


@dataclass
class Docs:
    """The documents to read: the split's tokens and each document's [start, start + length) (capped)."""
    data_dir: Path
    split: str
    tokens: list                      # per document: its tokens (np.ndarray, int64), capped at max_tokens_per_doc
    sources: list                     # per document: (split, index in the split, start offset, full length)
    byte_lengths: np.ndarray = None   # bytes of text per token id (None: meta.json names no tokenizer)
    unit: str = None                  # 'bpc' or 'bpb' (None without byte lengths)
    tokenizer: dict = None            # meta.json's tokenizer, as a checkpoint stores it


def read_docs(data_dir, split, max_tokens_per_doc=0, max_docs=0):
    """The documents of the split(s) (comma-separated) in data_dir. -> Docs"""
    data_dir = Path(data_dir)
    meta = train.load_meta(data_dir)
    tokenizer = train.data_tokenizer(meta)
    tokens, sources, evalset = [], [], None
    for s in split.split(','):
        data = train.load_split(data_dir, s)
        docs_path = data_dir / f'{s}_docs.npy'
        if not docs_path.exists():
            raise train.UserError(f"no document offsets at {docs_path} (the dataset's prepare.py writes them)")
        starts = np.load(docs_path).astype(np.int64)
        if len(starts) == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= max(len(data), 1):
            raise train.UserError(f"{docs_path} is not ascending offsets from 0 into {s}.bin ({len(data)} tokens)")
        ends = np.append(starts[1:], len(data))
        for i, (a, b) in enumerate(zip(starts, ends)):
            n = int(b - a) if not max_tokens_per_doc else min(int(b - a), max_tokens_per_doc)
            tokens.append(np.asarray(data[a:a + n], dtype=np.int64))
            sources.append((s, i, int(a), int(b - a)))
        evalset = train.eval_set(data, meta, s, tokenizer)
    if max_docs:
        tokens, sources = tokens[:max_docs], sources[:max_docs]
    if sum(max(0, len(t) - 1) for t in tokens) == 0:
        raise train.UserError(f"nothing to predict: the {split} documents of {data_dir} have one token or fewer")
    return Docs(data_dir, split, tokens, sources, evalset.byte_lengths, evalset.unit if evalset.byte_lengths
                is not None else None, tokenizer.describe() if tokenizer is not None else None)


def checkpoint_path(run, ckpt_name):
    path = Path(run)
    return path if path.is_file() else path / ckpt_name


def run_data_dir(ckpt, cfg):
    tc = ckpt['train_config']
    return Path(cfg.data_dir or tc.get('data_dir') or train.REPO / 'data' / tc['dataset'])


def load_model(ckpt, path, cfg, docs):
    """The checkpoint's model (eval mode), after checking it reads these data. -> (model, config)"""
    if docs.tokenizer is not None and ckpt.get('tokenizer', docs.tokenizer) != docs.tokenizer:
        raise train.UserError(f"{path} was trained on {ckpt['tokenizer']['tokenizer']} tokens, but {docs.data_dir} "
                              f"holds {docs.tokenizer['tokenizer']} tokens")
    overrides = {}
    if cfg.eval_mem_len != -1:
        if 'mem_len' not in ckpt['model_config']:
            raise train.UserError(f"--eval_mem_len: {path} holds a {ckpt['model_name']!r} model, whose config "
                                  f"has no mem_len")
        overrides['mem_len'] = cfg.eval_mem_len
    _, config, model = train.model_from_checkpoint(ckpt, path, overrides)
    biggest = max(int(t.max()) for t in docs.tokens if len(t))
    if biggest >= config.vocab_size:
        raise train.UserError(f"{docs.data_dir} has token {biggest}, beyond {path}'s vocab_size={config.vocab_size}")
    return model.eval(), config


# -----------------------------------------------------------------------------------------------------------
# Reading the documents


def n_segments(length, seg_len):
    """Segments that predict positions 1 ... length - 1 of a document of `length` tokens."""
    return max(0, math.ceil((length - 1) / seg_len))


def schedule(lengths, seg_len, batch_size):
    """Which documents each row reads, in order: longest first, each to the row that frees first (ties: the lower
    row). -> (rows: list of lists of document indices, total steps)"""
    order = sorted((i for i, n in enumerate(lengths) if n_segments(n, seg_len)), key=lambda i: -lengths[i])
    n_rows = max(1, min(batch_size, len(order)))
    free = [(0, r) for r in range(n_rows)]
    rows = [[] for _ in range(n_rows)]
    for i in order:
        t, r = heapq.heappop(free)
        rows[r].append(i)
        heapq.heappush(free, (t + n_segments(lengths[i], seg_len), r))
    return rows, max(t for t, _ in free)


@torch.no_grad()
def document_nll(model, docs_tokens, seg_len, batch_size, device, ctx=None, progress=None, reset_every=0):
    """Per-token NLL (nats) of every document read from its start with an empty memory, documents in parallel rows;
    with reset_every = k > 0 the memory is also emptied before segments k, 2k, ... of a document.
    docs_tokens: list of int arrays. -> list of float64 arrays, nll[d][p - 1] = NLL of token p of document d
    (p = 1 ... len - 1)."""
    from contextlib import nullcontext
    lengths = [len(t) for t in docs_tokens]
    rows, n_steps = schedule(lengths, seg_len, batch_size)
    B, T = len(rows), seg_len
    out = [np.full(max(0, n - 1), np.nan) for n in lengths]
    was_training = model.training
    model.eval()
    memory = model.init_memory(B, device)
    current = [None] * B                    # per row: [document, next segment] or None when the row is done
    queue = [list(r) for r in rows]
    bar = progress(total=n_steps) if progress else None
    for step in range(n_steps):
        x = torch.zeros(B, T, dtype=torch.long)
        reset = torch.zeros(B, dtype=torch.bool)
        spans = []                          # (row, document, first predicted position, count)
        for b in range(B):
            if current[b] is not None and current[b][1] == n_segments(lengths[current[b][0]], T):
                current[b] = None
            if current[b] is None and queue[b]:
                current[b] = [queue[b].pop(0), 0]
                reset[b] = True
            if current[b] is None:
                continue                    # this row has no document left: padding, ignored
            d, k = current[b]
            if reset_every and k and k % reset_every == 0:
                reset[b] = True             # a new input of reset_every segments within the document
            a = k * T
            n = min(T, lengths[d] - 1 - a)  # inputs a ... a + n - 1 predict positions a + 1 ... a + n
            x[b, :n] = torch.from_numpy(docs_tokens[d][a:a + n])
            spans.append((b, d, a + 1, n))
            current[b][1] += 1
        if step > 0 and reset.any():
            memory = model.reset_memory(memory, reset.to(device))
        with (ctx or nullcontext()):
            logits, _, memory, _ = model(x.to(device), memory)
        targets = torch.full((B, T), -1, dtype=torch.long)                          # -1: padding, ignored
        for b, d, p, n in spans:
            targets[b, :n] = torch.from_numpy(docs_tokens[d][p:p + n])
        nll = F.cross_entropy(logits.float().view(B * T, -1), targets.to(device).view(-1), ignore_index=-1,
                              reduction='none').view(B, T).double().cpu().numpy()
        for b, d, p, n in spans:
            if not np.isnan(out[d][p - 1:p - 1 + n]).all():
                raise RuntimeError(f"document {d}: positions {p} ... {p + n - 1} predicted twice")
            out[d][p - 1:p - 1 + n] = nll[b, :n]
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    model.train(was_training)
    assert not any(np.isnan(o).any() for o in out), "a position was not predicted"
    return out


# -----------------------------------------------------------------------------------------------------------
# Copy distance


def copy_distances(tokens, n):
    """How far back each predicted token of a document could be copied from: d[p - 1] for p = 1 ... len - 1 is
    p - q for the largest q < p, q >= n - 1, with tokens[q-n+1 ... q] == tokens[p-n+1 ... p] (the n-gram ending at
    p occurred before, ending at q); 0 where it did not (its first occurrence, or p < n - 1).
    Vectorised and exact (no hashing): every k-gram gets an id, k = 1 ... n, by np.unique on the pairs (id of the
    (k-1)-gram starting at j, token j + k - 1); a stable sort by id lists each n-gram's occurrences in order of
    position, and the previous occurrence of one is its predecessor there. tokens: int array -> int64 array of
    max(0, len - 1) distances."""
    if n < 1:
        raise ValueError(f"copy_distances: n must be >= 1, got {n}")
    tokens = np.asarray(tokens, dtype=np.int64)
    L = len(tokens)
    d = np.zeros(max(0, L - 1), dtype=np.int64)
    if L - n + 1 < 2:                       # fewer than two n-grams: nothing occurs twice
        return d
    _, tok = np.unique(tokens, return_inverse=True)
    tok = tok.reshape(-1).astype(np.int64)
    ids, U = tok, int(tok.max()) + 1
    for k in range(2, n + 1):               # ids[j]: the (k-1)-gram starting at j -> the k-gram starting at j
        _, ids = np.unique(ids[:L - k + 1] * U + tok[k - 1:], return_inverse=True)    # < L^2: fits int64
        ids = ids.reshape(-1)
    order = np.argsort(ids, kind='stable')  # n-gram starts j, grouped by n-gram, ascending within one
    same = ids[order[1:]] == ids[order[:-1]]
    later, earlier = order[1:][same], order[:-1][same]
    d[later + n - 2] = later - earlier      # the n-gram starting at j ends at p = j + n - 1: d[p - 1]
    return d


def doc_distances(cfg, docs):
    """Each document's copy_distances by --position=copy (None by position)."""
    if cfg.position != 'copy':
        return None
    n = copy_ngram(cfg.copy_ngram, docs.tokenizer)
    return [copy_distances(t, n) for t in docs.tokens]


def copy_ngram(n, tokenizer):
    """--copy_ngram: n itself, or for 0 the n of the data's tokenizer (meta.json's, as Docs.tokenizer holds it)."""
    return n or COPY_NGRAM.get((tokenizer or {}).get('tokenizer', 'gpt2'), 2)


# -----------------------------------------------------------------------------------------------------------
# Statistics


def bucket_sums(nlls, docs_tokens, edges, byte_lengths=None, seg_len=0, distances=None):
    """Per document and bucket: summed NLL, token count, byte count. -> three (D, K) float64 arrays (K = buckets)
    seg_len > 0: bucket by the index in its segment of the input that predicts the token, (p - 1) mod seg_len (every
    document starts a segment), instead of the position p in the document. distances (per document, its
    copy_distances): bucket by copy distance, [1,e1) ... [e_last,end), and a last bucket of first occurrences (0)."""
    K = len(edges) + (2 if distances is not None else 1)
    S, N, Y = (np.zeros((len(nlls), K)) for _ in range(3))
    for d, (nll, tokens) in enumerate(zip(nlls, docs_tokens)):
        pos = np.arange(1, len(nll) + 1)
        pos = (pos - 1) % seg_len if seg_len else pos
        k = np.searchsorted(edges, pos, side='right')
        if distances is not None:
            dist = distances[d][:len(nll)]
            k = np.where(dist > 0, np.searchsorted(edges, dist, side='right'), K - 1)
        S[d] = np.bincount(k, weights=nll, minlength=K)
        N[d] = np.bincount(k, minlength=K)
        if byte_lengths is not None:
            Y[d] = np.bincount(k, weights=byte_lengths[tokens[1:len(nll) + 1]], minlength=K)
    return S, N, Y


def ratio_stats(S, W, present):
    """The ratio R = sum_d S_d / sum_d W_d per column and its standard error across the documents `present` in the
    column (see the module docstring). S, W, present: (D, K). -> (R, se): lists of floats or None."""
    means, ses = [], []
    for k in range(S.shape[1]):
        m = present[:, k]
        s, w = S[m, k], W[m, k]
        if w.sum() <= 0:
            means.append(None)
            ses.append(None)
            continue
        R = s.sum() / w.sum()
        D = int(m.sum())
        means.append(float(R))
        ses.append(float(math.sqrt(D / (D - 1) * ((s - R * w) ** 2).sum()) / w.sum()) if D > 1 else None)
    return means, ses


def std(values):
    values = [v for v in values if v is not None]
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def summarize_label(sums, unit):
    """sums: the runs' (S, N, Y) of one label -> per bucket: mean, se, seed_std (nll and, with a unit, bits)."""
    S = np.mean([s for s, _, _ in sums], axis=0)
    N, Y = sums[0][1], sums[0][2]
    present = N > 0
    rows = [dict() for _ in range(N.shape[1])]
    quantities = [('nll', [s for s, _, _ in sums], S, N)]
    if unit:
        quantities.append((unit, [s / math.log(2) for s, _, _ in sums], S / math.log(2), Y))
    for key, per_run, mean_sums, weights in quantities:
        mean, se = ratio_stats(mean_sums, weights, present)
        per_seed = [ratio_stats(s, weights, present)[0] for s in per_run]
        for k, row in enumerate(rows):
            row[key], row[key + '_se'] = mean[k], se[k]
            row[key + '_seed_std'] = std([p[k] for p in per_seed])
    for k, row in enumerate(rows):
        row['tokens'], row['documents'] = int(N[:, k].sum()), int(present[:, k].sum())
        row['share'] = row['tokens'] / N.sum() if N.sum() else None          # of all predicted tokens
    return rows, S


def paired_quantities(N, Y, unit):
    """What a paired difference reports: (key, scale from summed nats, weights per document and bucket) for nats
    per token and, where the data has a unit, bits per character or byte."""
    return [('nll', 1.0, N)] + ([(unit, 1 / math.log(2), Y)] if unit else [])


def difference(label_S, base_S, N, Y, label_rows, base_rows, n_label, n_base, unit):
    """Per bucket: label minus baseline, paired by document. -> list of dicts diff_<q>, diff_<q>_se, _seed_se,
    _se_total for q = nll (and the unit)."""
    present = N > 0
    rows = [dict() for _ in range(N.shape[1])]
    for key, scale, weights in paired_quantities(N, Y, unit):
        mean, se = ratio_stats((label_S - base_S) * scale, weights, present)
        for k, row in enumerate(rows):
            sa, sb = label_rows[k][key + '_seed_std'], base_rows[k][key + '_seed_std']
            seed_se = math.sqrt(sa ** 2 / n_label + sb ** 2 / n_base) if sa is not None and sb is not None else None
            row[f'diff_{key}'], row[f'diff_{key}_se'] = mean[k], se[k]
            row[f'diff_{key}_seed_se'] = seed_se
            row[f'diff_{key}_se_total'] = (math.sqrt(se[k] ** 2 + seed_se ** 2) if se[k] is not None
                                           and seed_se is not None else se[k])
    return rows


def midpoints(edges, max_position, position='document'):
    """Geometric midpoints of the buckets' positions (the first starts at 1, the last ends at the largest
    position read), for the log-position plot; by position in the segment, the middle index of each bucket; by copy
    distance (at most the largest position), as by position, and 'first' at twice the end of the last bucket (where
    the plot draws it)."""
    if position == 'segment':
        bounds = [0] + list(edges) + [max_position + 1]
        return [(a + b - 1) / 2 for a, b in zip(bounds, bounds[1:])]
    bounds = [1] + list(edges) + [max_position + 1]
    mids = [math.sqrt(max(a, 1) * max(b, a + 1)) for a, b in zip(bounds, bounds[1:])]
    return mids + ([2.0 * max(bounds[-1], bounds[-2] + 1)] if position == 'copy' else [])


# -----------------------------------------------------------------------------------------------------------
# Output


def fmt(v, f='.4f', signed=False):
    return '–' if v is None else f"{v:{'+' if signed else ''}{f}}"


def tables(result):
    names, unit, baseline = result['bucket_names'], result['unit'], result['baseline']
    labels = result['labels']
    head = lambda first: [f"| {first} | seeds | " + ' | '.join(names) + ' |', '|---|---|' + '---|' * len(names)]
    counts = next(iter(labels.values()))['buckets']
    count_row = ('| tokens (documents; share) | | '
                 + ' | '.join(f"{r['tokens']:,} ({r['documents']}; {fmt(r.get('share'), '.1%')})" for r in counts)
                 + ' |')
    out = []
    for key, title in [('nll', 'mean NLL per token (nats)')] + ([(unit, unit)] if unit else []):
        out += ['', f"{title} ± s.e. across documents [std across seeds]"] + head('label') + [count_row]
        for label, lab in labels.items():
            cells = [f"{fmt(r[key])} ± {fmt(r[key + '_se'])}" + (f" [{fmt(r[key + '_seed_std'])}]"
                     if r[key + '_seed_std'] is not None else '') for r in lab['buckets']]
            out.append(f"| {label} | {len(lab['runs'])} | " + ' | '.join(cells) + ' |')
    for key, title in [('nll', 'nats')] + ([(unit, unit)] if unit else []):
        out += ['', f"difference to {baseline} ({title}; negative = better) ± s.e. across documents (paired) "
                    f"[s.e. over seeds]"] + head('label')
        for label, lab in labels.items():
            if label == baseline:
                continue
            cells = [f"{fmt(r[f'diff_{key}'], signed=True)} ± {fmt(r[f'diff_{key}_se'])}"
                     + (f" [{fmt(r[f'diff_{key}_seed_se'])}]" if r[f'diff_{key}_seed_se'] is not None else '')
                     for r in lab['buckets']]
            out.append(f"| {label} | {len(lab['runs'])} | " + ' | '.join(cells) + ' |')
    return '\n'.join(out)


def plot_result(result, path):
    import plot
    plt = plot._plt()
    x, baseline = result['midpoints'], result['baseline']
    position = result['config'].get('position', 'document')
    by_segment, by_copy = position == 'segment', position == 'copy'
    where, scale = {'segment': ('index in the segment', 'linear'), 'copy': ('copy distance (tokens)', 'log')}.get(
        position, ('position in the document', 'log'))
    n = len(result['labels'])
    many = n > 6                                    # one legend, right of both panels, and 20 colours past 10
    fig, (a, b) = plt.subplots(1, 2, figsize=(13 if many else 11, 4))
    colors = plt.get_cmap('tab10' if n <= 10 else 'tab20').colors
    for i, (label, lab) in enumerate(result['labels'].items()):
        rows = lab['buckets']
        keep = [k for k, r in enumerate(rows) if r['nll'] is not None]
        dodge = {k: x[k] * 1.04 ** (i - (n - 1) / 2) if not by_segment else x[k] + 0.3 * (i - (n - 1) / 2)
                 for k in keep}                                     # side by side, so the error bars show
        for ax, key, se in ((a, 'nll', 'nll_se'), (b, 'diff_nll', 'diff_nll_se_total')):
            line = [k for k in keep if not (by_copy and k == len(rows) - 1)]       # 'first': a point of its own
            drawn = ax.errorbar([dodge[k] for k in line], [rows[k][key] for k in line],
                                yerr=[rows[k][se] or 0 for k in line], marker='o', capsize=3, label=label,
                                color=colors[i % len(colors)])
            if by_copy and len(rows) - 1 in keep:
                k = len(rows) - 1
                ax.errorbar([dodge[k]], [rows[k][key]], yerr=[rows[k][se] or 0], marker='s', capsize=3, ls='none',
                            color=drawn[0].get_color())
    kind = 'copy distance' if by_copy else 'position'
    a.set(xscale=scale, xlabel=f'{where} (bucket midpoint)', ylabel='NLL per token (nats)',
          title=f"loss by {kind} ({result['split']}, {len(result['documents'])} documents)")
    b.axhline(0, color='grey', lw=0.8)
    b.set(xscale=scale, xlabel=f'{where} (bucket midpoint)', ylabel=f'NLL − {baseline} (nats)',
          title=f'difference to {baseline} (± s.e., documents and seeds)')
    if many:
        fig.legend(*a.get_legend_handles_labels(), loc='center left', bbox_to_anchor=(0.83, 0.5), fontsize='small')
    for ax in (a, b):
        if not many:
            ax.legend()
        if by_copy:                                 # ticks at the bucket edges, and 'first' where its point is
            ticks = [1] + list(result['bucket_edges'])
            ax.set_xticks(ticks + [x[-1]], [f'{t:,}' for t in ticks] + ['first'])
            ax.set_xticks([], minor=True)
            ax.axvline(math.sqrt(x[-1] * x[-2]), color='grey', lw=0.8, ls=':')
    plot._save(fig, path, rect=(0, 0, 0.83, 1) if many else None)


# -----------------------------------------------------------------------------------------------------------


def clean(value):
    """NaN -> None, numpy scalars -> Python, for strict JSON."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def evaluate(cfg, labels, device, device_type, dtype):
    """Read every run. -> (docs, edges, {run: dict(label, model, step, sums (S, N, Y))})"""
    from tqdm import tqdm
    edges = cfg.bucket_edges()
    docs, first, runs, distances = None, None, {}, None
    for label, paths in labels.items():
        for run in paths:
            path = checkpoint_path(run, cfg.ckpt)
            ckpt = train.load_checkpoint(path)
            data_dir = run_data_dir(ckpt, cfg)
            if docs is None:
                docs, first = read_docs(data_dir, cfg.split, cfg.max_tokens_per_doc, cfg.max_docs), run
            elif data_dir.resolve() != docs.data_dir.resolve():
                raise train.UserError(f"the runs read different data ({first}: {docs.data_dir}, {run}: {data_dir}); "
                                      f"pass --data_dir to read one")
            model, config = load_model(ckpt, path, cfg, docs)
            model.to(device)
            torch.manual_seed(1337)        # the sticky ∞-former's random numbers start from torch.initial_seed()
            desc = f"{label} {run}"
            progress = lambda total: tqdm(total=total, desc=desc, unit='seg', dynamic_ncols=True, leave=False,
                                          mininterval=1.0 if sys.stderr.isatty() else 30.0)
            reset_every = ckpt['train_config'].get('reset_every', 0) if cfg.reset_every == -1 else cfg.reset_every
            cache = cache_path(path, docs, cfg, dtype, device_type, reset_every) if cfg.cache else None
            nlls = read_cache(cache, docs)
            if nlls is None:
                nlls = document_nll(model, docs.tokens, config.seg_len, cfg.batch_size, device,
                                    train.autocast_context(device_type, dtype), progress, reset_every)
                write_cache(cache, nlls)
            if cfg.position == 'segment' and edges and edges[-1] >= config.seg_len:
                raise train.UserError(f"--buckets={','.join(map(str, edges))}: by position in the segment every "
                                      f"edge must be below seg_len ({config.seg_len} in {path})")
            if distances is None:                                 # once: every run reads the same documents
                distances = doc_distances(cfg, docs)
            sums = bucket_sums(nlls, docs.tokens, edges, docs.byte_lengths,
                               config.seg_len if cfg.position == 'segment' else 0, distances)
            runs[run] = dict(label=label, checkpoint=str(path), model=ckpt['model_name'], step=ckpt.get('step'),
                             seg_len=config.seg_len, mem_len=getattr(config, 'mem_len', None),
                             reset_every=reset_every, sums=sums)
            S, N, _ = sums
            print(f"{label} {run}: " + ', '.join(f"{name} {s / n:.4f}" for name, s, n in
                                                 zip(bucket_names(edges, cfg.position), S.sum(0), N.sum(0)) if n),
                  flush=True)
            del model
    return docs, edges, runs


def cache_path(path, docs, cfg, dtype, device_type, reset_every=0):
    """Where a run's per-token NLLs are kept: next to the checkpoint, named by a digest of everything they depend
    on (the checkpoint file's size and time, the documents' tokens, the memory length and resets, precision, rows,
    device)."""
    stat = Path(path).stat()
    key = [stat.st_size, stat.st_mtime_ns, cfg.eval_mem_len, str(dtype), cfg.batch_size, device_type]
    h = hashlib.sha256(json.dumps(key + ([reset_every] if reset_every else [])).encode())   # (no resets: older key)
    for t in docs.tokens:
        h.update(np.int64(len(t)).tobytes())
        h.update(np.ascontiguousarray(t, dtype=np.int64).tobytes())
    return Path(path).with_name(f'{Path(path).name}.longdoc-{h.hexdigest()[:16]}.npz')


def read_cache(cache, docs):
    if cache is None or not cache.exists():
        return None
    with np.load(cache, allow_pickle=False) as f:
        flat, counts = f['nll'], f['counts']
    if list(counts) != [max(0, len(t) - 1) for t in docs.tokens]:
        return None
    print(f"(cached: {cache})", flush=True)
    return np.split(flat, np.cumsum(counts)[:-1])


def write_cache(cache, nlls):
    if cache is not None:
        tmp = cache.with_name(cache.name + '.tmp.npz')
        np.savez(tmp, nll=np.concatenate(nlls) if nlls else np.zeros(0), counts=np.array([len(n) for n in nlls]))
        tmp.replace(cache)


def read_reused(value, labels):
    """--reuse: earlier results of this script (comma-separated paths; their labels must not be those of --runs).
    -> [(path, result)]"""
    out = []
    for path in [p for p in value.split(',') if p]:
        try:
            old = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise train.UserError(f"--reuse={path}: cannot read it ({e})") from None
        missing = [k for k in ('labels', 'runs', 'doc_tokens', 'bucket_edges')
                   if not isinstance(old, dict) or k not in old]
        if missing:
            raise train.UserError(f"--reuse={path}: not a longdoc result (no {missing[0]!r})")
        twice = sorted(set(old['labels']) & set(labels))
        if twice:
            raise train.UserError(f"--reuse={path}: the label {twice[0]!r} is also in --runs")
        out.append((path, old))
    return out


def add_reused(path, old, labels, runs, counts, edges, position='document', ngram=None):
    """Add the labels of an earlier result to labels and runs (a label already there from another earlier result
    gains its runs: more seeds), each run's sums rebuilt from its doc_nll_sums and counts = (N, Y), the token and
    byte counts of this reading, which must be the earlier one's (same documents, same buckets: edges, position or
    copy distance, and its n-grams)."""
    N, Y = counts
    same_bytes = old.get('doc_bytes') is None or np.array_equal(np.asarray(old['doc_bytes']), Y)
    old_position = old.get('position', (old.get('config') or {}).get('position', 'document'))
    if list(old['bucket_edges']) != list(edges) or not np.array_equal(np.asarray(old['doc_tokens']), N) \
            or not same_bytes or (old_position, old.get('copy_ngram')) != (position, ngram):
        by = f"copy distance of {old.get('copy_ngram')}-grams" if old_position == 'copy' else old_position
        raise train.UserError(f"--reuse={path} read other documents or buckets (by {by}, its bucket edges "
                              f"{old['bucket_edges']}; pass the same --split, --position, --copy_ngram, --buckets "
                              f"and --max_* flags)")
    taken = {common.relative_paths(str(run)): info['label'] for run, info in runs.items()}   # key -> its label
    for label, lab in old['labels'].items():
        # a run already read under another label (here, with another --eval_mem_len, say) keeps both readings: this
        # one as 'RUN (LABEL)'; under the same label it would count one seed twice
        twice = [run for run in lab['runs'] if taken.get(run) == label or f'{run} ({label})' in taken]
        if twice:
            raise train.UserError(f"--reuse={path}: {twice[0]} of {label!r} is in an earlier --reuse result too")
        keys = {run: f'{run} ({label})' if run in taken else run for run in lab['runs']}
        labels.setdefault(label, []).extend(keys.values())
        for run, key in keys.items():
            info = old['runs'][run]
            runs[key] = {**{k: v for k, v in info.items() if k not in ('buckets', 'doc_nll_sums')},
                         'sums': (np.asarray(info['doc_nll_sums'], dtype=np.float64), N, Y)}
            taken[key] = label


def reused_counts(cfg, reused, docs):
    """Without --runs: the documents of the first earlier result (or --data_dir) and each document's token and
    byte counts per bucket (N, Y), from its seg_len by position in the segment. -> (docs, (N, Y))"""
    path, first = reused[0]
    docs = read_docs(cfg.data_dir or train.REPO / first['data_dir'], cfg.split, cfg.max_tokens_per_doc, cfg.max_docs)
    seg_len = (next(iter(first['runs'].values())).get('seg_len') or 0) if cfg.position == 'segment' else 0
    distances = doc_distances(cfg, docs)
    zeros = [np.zeros(max(0, len(t) - 1)) for t in docs.tokens]
    _, N, Y = bucket_sums(zeros, docs.tokens, cfg.bucket_edges(), docs.byte_lengths, seg_len, distances)
    return docs, (N, Y)


def result_ngram(cfg, docs):
    """The n of the copy distance's n-grams (None unless --position=copy)."""
    return copy_ngram(cfg.copy_ngram, docs.tokenizer) if cfg.position == 'copy' else None


def build_result(cfg, labels, docs, edges, runs):
    baseline = cfg.baseline or next(iter(labels))
    unit, names = docs.unit, bucket_names(edges, cfg.position)
    _, N, Y = next(iter(runs.values()))['sums']
    summaries = {}
    for label, paths in labels.items():
        rows, S = summarize_label([runs[r]['sums'] for r in paths], unit)
        summaries[label] = (rows, S, len(paths))
    base_rows, base_S, n_base = summaries[baseline]
    out_labels = {}
    for label, (rows, S, n) in summaries.items():
        diffs = difference(S, base_S, N, Y, rows, base_rows, n, n_base, unit)
        out_labels[label] = {'runs': labels[label],
                             'buckets': [{'bucket': name, **r, **d} for name, r, d in
                                         zip(names, rows, diffs)]}
    out_runs = {}
    for run, info in runs.items():
        S = info['sums'][0]
        rows, _ = summarize_label([info['sums']], unit)
        out_runs[run] = {**{k: v for k, v in info.items() if k != 'sums'},
                         'buckets': [{'bucket': name, **{k: v for k, v in r.items() if not k.endswith('seed_std')}}
                                     for name, r in zip(names, rows)],
                         'doc_nll_sums': S.tolist()}
    max_position = max(len(t) for t in docs.tokens) - 1
    if cfg.position == 'segment':
        max_position = max(info.get('seg_len') or 0 for info in runs.values()) - 1
    return {'config': dataclasses.asdict(cfg), 'data_dir': str(docs.data_dir), 'split': docs.split, 'unit': unit,
            'baseline': baseline, 'position': cfg.position, 'copy_ngram': result_ngram(cfg, docs),
            'bucket_edges': edges, 'bucket_names': names, 'midpoints': midpoints(edges, max_position, cfg.position),
            'documents': [{'split': s, 'index': i, 'start': a, 'length': n, 'read': len(t)}
                          for (s, i, a, n), t in zip(docs.sources, docs.tokens)],
            'doc_tokens': N.tolist(), 'doc_bytes': Y.tolist() if unit else None,
            'labels': out_labels, 'runs': out_runs}


def main(argv=None):
    def go(argv):
        cfg = common.parse(gather_runs_flags(argv), LongDocConfig)
        labels = parse_runs(cfg.runs)
        reused = read_reused(cfg.reuse, labels)
        if not labels and not reused:
            raise train.UserError("--runs is required: --runs=LABEL:OUT_DIR,OUT_DIR,... (one out_dir or ckpt per seed),"
                                  " or --reuse=EARLIER.json,...")
        known = list(labels) + [label for _, old in reused for label in old['labels']]
        if cfg.baseline and cfg.baseline not in known:
            raise train.UserError(f"--baseline={cfg.baseline} is not a label of --runs or --reuse ({', '.join(known)})")
        cfg.bucket_edges()
        device, device_type = common.setup(cfg.device)
        dtype = train.resolve_dtype(cfg.dtype, device_type)
        docs, edges, runs = evaluate(cfg, labels, device, device_type, dtype)
        if runs:
            counts = next(iter(runs.values()))['sums'][1:]
        else:
            docs, counts = reused_counts(cfg, reused, docs)
        for path, old in reused:
            add_reused(path, old, labels, runs, counts, edges, cfg.position, result_ngram(cfg, docs))
        result = clean(build_result(cfg, labels, docs, edges, runs))
        n_pred = sum(max(0, len(t) - 1) for t in docs.tokens)
        print(f"\n{docs.split} of {docs.data_dir}: {len(docs.tokens)} documents, {n_pred:,} predicted tokens, "
              f"device {device} {dtype}" + (f"; by copy distance of {result['copy_ngram']}-grams"
                                            if cfg.position == 'copy' else ''))
        print(tables(result))
        out = cfg.out_path()
        common.write_json(out, result, 'bench/longdoc.py', argv)
        if cfg.plot:
            common.try_plot(plot_result, result, out.with_suffix('.png'))
        return result
    train.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
