"""
Reading a prepared dataset for training and evaluation (data/README.md has the format; prepare.py writes it):

    tokens = load_split(data_dir, 'train')                 # np.memmap of uint16 tokens
    loader = StreamLoader(tokens, n_streams, first, B, T)  # Transformer-XL's ordered streams: x, y, reset = loader.get(i)

The data are read as Transformer-XL's ordered iterator does: the token file is cut into n_streams contiguous
streams, each read one segment of seg_len tokens after another, so a row's memory always holds the text just
before its current segment. meta.json names the tokenizer: byte and character data set the model's vocabulary,
and its byte lengths turn an evaluation's summed NLL into bits per character (EvalSet).
"""

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from configurator import REPO, UserError


def load_split(data_dir, split):
    path = Path(data_dir) / f'{split}.bin'
    if not path.exists():
        name = Path(data_dir).name
        base, flag = (name[:-len('_bytes')], ' --tokenizer=bytes') if name.endswith('_bytes') else (name, '')
        prepare = REPO / 'data' / base / 'prepare.py'
        if prepare.exists():
            raise UserError(f"no data at {path}: run `python {prepare.relative_to(REPO)}{flag}` first")
        known = sorted(p.parent.name for p in (REPO / 'data').glob('*/prepare.py'))
        raise UserError(f"no data at {path}; datasets with a prepare.py: {', '.join(known)}")
    return np.memmap(path, dtype=np.uint16, mode='r')


def load_meta(data_dir):
    path = Path(data_dir) / 'meta.json'
    return json.loads(path.read_text()) if path.exists() else {}


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
    data the model keeps its default (50304: GPT-2's 50257 padded to a multiple of 64)."""
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
