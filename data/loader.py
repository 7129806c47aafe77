"""
Reading a prepared dataset for training and evaluation (data/README.md has the format; prepare.py writes it):

    tokens = load_split(data_dir, 'train')                 # np.memmap of uint16 tokens, checked
    loader = StreamLoader(tokens, n_streams, first, B, T)  # Transformer-XL's ordered streams
    x, y, reset = loader.get(i)

The data are read as Transformer-XL's ordered iterator does: the token file is cut into n_streams contiguous
streams, each read one segment of seg_len tokens after another, so a row's memory always holds the text just
before its current segment. meta.json names the tokenizer: byte and character data set the model's vocabulary,
and its byte lengths turn an evaluation's summed NLL into bits per character (EvalSet).

Damaged data is refused when it is opened, in one `error: ...` line that names the file: a meta.json that is not
a JSON object or has a field of the wrong type, a .bin that is empty, not whole uint16 tokens, not as long as
meta.json counts, or holding a token >= vocab_size (meta.json's; where it has none, the model's, via load_meta).
"""

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from configurator import REPO, UserError


SPLITS = ('train', 'validation', 'test')
SCAN_CHUNK = 1 << 24              # tokens per read of the vocabulary check (32 MB): a split of any size is checked
_largest = {}                     # (path, size, mtime_ns) -> the largest token of a .bin: each file is scanned once


def prepared_by(name):
    """(the dataset whose prepare.py writes data/<name>/, its flags): NAME[_bytes][_pretrain|_finetune] ->
    (NAME, ' --tokenizer=bytes --halves=True'), the halves only where data/NAME/prepare.py exists (data/sympy's
    --halves=True writes them)."""
    def unbytes(base, flag=''):
        return (base[:-len('_bytes')], ' --tokenizer=bytes' + flag) if base.endswith('_bytes') else (base, flag)
    for half in ('_pretrain', '_finetune'):
        if name.endswith(half):
            base, flag = unbytes(name[:-len(half)], ' --halves=True')
            if (REPO / 'data' / base / 'prepare.py').exists():
                return base, flag
    return unbytes(name)


def load_split(data_dir, split):
    """The tokens of data_dir/{split}.bin as a read-only np.memmap, checked first (one UserError line each): a whole
    number of uint16 tokens, not empty, as many as meta.json counts, and every token below meta.json's vocab_size.
    Without a vocab_size in meta.json, load_meta reports the one the tokens need, which train.py compares with the
    model's."""
    path = Path(data_dir) / f'{split}.bin'
    if not path.exists():
        base, flag = prepared_by(Path(data_dir).name)
        prepare = REPO / 'data' / base / 'prepare.py'
        if prepare.exists():
            raise UserError(f"no data at {path}: run `python {prepare.relative_to(REPO)}{flag}` first")
        known = sorted(p.parent.name for p in (REPO / 'data').glob('*/prepare.py'))
        raise UserError(f"no data at {path}; datasets with a prepare.py: {', '.join(known)}")
    meta = read_meta(data_dir)
    tokens = _open_tokens(path)
    counted = meta.get('splits', {}).get(split, {}).get('tokens')
    if counted is not None and counted != len(tokens):
        raise UserError(f"{path} holds {len(tokens):,} tokens but meta.json counts {counted:,}: the file is "
                        f"truncated or from another preparation (prepare it again)")
    if 'vocab_size' in meta:
        _check_vocab(path, tokens, meta['vocab_size'])
    return tokens


def _open_tokens(path):
    """np.memmap of a .bin, refused in one line if it is not whole uint16 tokens or has none."""
    size = path.stat().st_size
    if size == 0:
        raise UserError(f"{path} is empty: no tokens in this split (prepare the dataset again)")
    if size % np.dtype(np.uint16).itemsize:
        raise UserError(f"{path} has {size:,} bytes, not a whole number of 2-byte tokens: the file is damaged "
                        f"(prepare the dataset again)")
    return np.memmap(path, dtype=np.uint16, mode='r')


def largest_token(path, tokens):
    """max(tokens), read SCAN_CHUNK tokens at a time (a multi-GB split never sits in RAM); remembered for the
    file's (path, size, mtime), so opening the same split again costs nothing."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _largest:
        _largest[key] = max(int(tokens[i:i + SCAN_CHUNK].max()) for i in range(0, len(tokens), SCAN_CHUNK))
    return _largest[key]


def _check_vocab(path, tokens, vocab_size):
    top = largest_token(path, tokens)
    if top >= vocab_size:
        first = next(i + int(np.argmax(tokens[i:i + SCAN_CHUNK] >= vocab_size))
                     for i in range(0, len(tokens), SCAN_CHUNK) if tokens[i:i + SCAN_CHUNK].max() >= vocab_size)
        raise UserError(f"{path} has token {int(tokens[first])} at position {first:,} (largest {top}), outside "
                        f"meta.json's vocab_size={vocab_size}: the tokens and meta.json do not belong together")


# meta.json's fields that the code reads, and the types they must have (a field that is absent is fine)
META_TYPES = {'vocab_size': int, 'tokenizer': str, 'eot_token': (int, type(None)), 'symbols': str, 'dtype': str,
              'splits': dict}
SPLIT_TYPES = {'tokens': int, 'documents': int, 'words': int, 'bytes': int}


def read_meta(data_dir):
    """data_dir/meta.json as written, checked (one UserError line naming the file); {} where there is none."""
    path = Path(data_dir) / 'meta.json'
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: {getattr(e, 'strerror', None) or type(e).__name__}")
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})")
    if not isinstance(meta, dict):
        raise UserError(f"{path} must hold a JSON object, got {type(meta).__name__}")
    _check_types(path, meta, META_TYPES, '')
    for split, counts in meta.get('splits', {}).items():
        if not isinstance(counts, dict):
            raise UserError(f"{path}: splits.{split} must be an object, got {counts!r}")
        _check_types(path, counts, SPLIT_TYPES, f'splits.{split}.')
    if meta.get('vocab_size', 1) < 1:
        raise UserError(f"{path}: vocab_size must be >= 1, got {meta['vocab_size']}")
    if meta.get('dtype', 'uint16') != 'uint16':
        raise UserError(f"{path}: dtype {meta['dtype']!r} is not read here (tokens are uint16)")
    return meta


def _check_types(path, values, types, prefix):
    for name, typ in types.items():
        if name not in values:
            continue
        value = values[name]
        if not isinstance(value, typ) or isinstance(value, bool):
            kind = {int: 'an integer', str: 'a string', dict: 'an object'}.get(typ, 'an integer or null')
            raise UserError(f"{path}: {prefix}{name} must be {kind}, got {value!r}")
        if typ is int and value < 0:
            raise UserError(f"{path}: {prefix}{name} must be >= 0, got {value}")


def load_meta(data_dir):
    """meta.json, checked (read_meta); {} where there is none (hand-made data). Where it gives no vocab_size, the
    vocab_size the tokens need (their largest + 1, over the splits present) stands in for it, so train.py's check
    against the model's vocab_size also covers such data."""
    meta = read_meta(data_dir)
    if 'vocab_size' not in meta:
        paths = [Path(data_dir) / f'{split}.bin' for split in SPLITS]
        tops = [largest_token(path, _open_tokens(path)) for path in paths if path.exists()]
        if tops:
            meta = {**meta, 'vocab_size': max(tops) + 1}
    return meta


def data_tokenizer(meta):
    """The Tokenizer that meta.json names (data/tokenizer.py), or None when it names none (hand-made data)."""
    if 'tokenizer' not in meta:
        return None
    from data.tokenizer import TokenizerError, from_meta     # here: GPT-2's tiktoken only where data need it
    try:
        return from_meta(meta)
    except TokenizerError as e:
        raise UserError(f"meta.json: {e}")


def vocab_from_data(model_cfg, given, tokenizer):
    """Byte and character data set the model's vocabulary (256, 27, ...) unless --vocab_size was given; on GPT-2
    data the model keeps its default (50304: GPT-2's 50257 padded to a multiple of 64; the GPT-2 forms' 50257, the
    rows of OpenAI's embedding, which --init_from=gpt2 loads)."""
    if tokenizer is None or tokenizer.name == 'gpt2' or 'vocab_size' in given:
        return model_cfg
    return dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)


@dataclass
class EvalSet:
    """A split to evaluate: its tokens, and what turns the summed NLL into per-word and per-byte figures."""
    data: np.ndarray
    words: typing.Optional[int] = None           # words of the whole split (meta.json), for word-level perplexity
    byte_lengths: typing.Optional[np.ndarray] = None  # bytes of text per token id (0 for end-of-document)
    unit: str = 'bpb'                            # 'bpc' on byte/character data, 'bpb' (bits per byte) on BPE data


def eval_set(data, meta, split, tokenizer):
    words = meta.get('splits', {}).get(split, {}).get('words')
    if tokenizer is None:
        return EvalSet(data, words)
    unit = 'bpb' if tokenizer.name == 'gpt2' else 'bpc'
    return EvalSet(data, words, tokenizer.byte_lengths(), unit)


class StreamLoader:
    """Rows [first_stream, first_stream + batch_size) of n_streams contiguous streams over a token file.
    get(position) returns the segment number `position` of every row (wrapping around at the end of an epoch),
    with the mask of rows whose memory must be emptied before it (epoch start; document start if asked; every
    reset_every segments if asked)."""

    def __init__(self, data, n_streams, first_stream, batch_size, seg_len, doc_starts=None, reset_every=0):
        self.data, self.seg_len, self.doc_starts, self.reset_every = data, seg_len, doc_starts, reset_every
        stream_len = (len(data) - 1) // n_streams
        self.n_segments = stream_len // seg_len                   # per stream per epoch (the tail is dropped)
        if self.n_segments < 1:
            raise UserError(f"the data ({len(data)} tokens) is too small for {n_streams} streams of "
                            f"seg_len={seg_len}: use a smaller batch_size or seg_len")
        self.starts = (np.arange(first_stream, first_stream + batch_size) * stream_len).astype(np.int64)

    def get(self, position):
        seg = position % self.n_segments
        offsets = self.starts + seg * self.seg_len                                  # (B,)
        index = offsets[:, None] + np.arange(self.seg_len + 1)[None, :]             # (B, T+1)
        chunk = torch.from_numpy(self.data[index].astype(np.int64))
        every = bool(self.reset_every) and position % self.reset_every == 0
        reset = np.full(len(offsets), (seg == 0 or every) and position > 0)
        if self.doc_starts is not None:
            lo = np.searchsorted(self.doc_starts, offsets, side='left')
            hi = np.searchsorted(self.doc_starts, offsets + self.seg_len, side='left')
            reset |= (hi > lo) & (position > 0)
        return chunk[:, :-1], chunk[:, 1:], torch.from_numpy(reset)


def eval_stream_bounds(n_tokens, n_streams):
    """Split the n_tokens - 1 predictions of a split into n_streams contiguous runs, so every token after the
    first is predicted exactly once: stream s reads inputs [a_s, b_s) and predicts tokens [a_s + 1, b_s + 1)."""
    bounds = np.linspace(0, n_tokens - 1, n_streams + 1).round().astype(np.int64)
    return bounds[:-1], bounds[1:]
