"""Tests of the code corpus data/sympy/prepare.py (both tokenizers) on a fixture sdist the tests make themselves: the
real member names, a few lines each. CPU only, no network; the test on the real prepared data skips without it."""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from data import loader, shards  # the repo root is on sys.path (tests/conftest.py)
from data.sympy import prepare as sympy
from data.tokenizer import EOT_TEXT, from_meta
from test_data import error_message, snapshot, split_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = "sympy-1.13.3/"
MAX_BYTES = 2048  # the fixture's stand-in for the real 256 KB limit

# a file must come through byte for byte: non-ASCII UTF-8, tabs, trailing spaces, \r\n, deep indentation, no final \n
TRICKY = ("# -*- coding: utf-8 -*-\n"
          '"""Ünïcödé — “quotes” naïve café 🙂 中文 α→β ∀x∈ℝ"""\n'
          "\n"
          "def f(x):\t# a tab\n"
          "    if x:   \n"            # trailing spaces
          "\t\treturn x  \r\n"      # tabs, \r\n
          "                        return '<|endoftext|>'\n"
          "    return None")        # no newline at the end
SOURCES = {  # the .py files under sympy/ that are kept, by split (in path order)
    "train": {
        "sympy/__init__.py": "from .core import *\n",
        "sympy/core/__init__.py": "from .basic import Basic\n",
        "sympy/core/basic.py": TRICKY,
        "sympy/core/tests/test_basic.py": "from sympy.core.basic import Basic\n\ndef test_basic():\n    Basic()\n",
        "sympy/sets_like.py": "# a name that starts like a held-out subpackage but is not in it\n",
    },
    "validation": {
        "sympy/geometry/__init__.py": "from .point import Point\n",
        "sympy/geometry/point.py": "class Point:\n    pass\n",
        "sympy/geometry/tests/test_point.py": "def test_point():\n    assert Point\n",
        "sympy/sets/sets.py": "class Set:\n    pass\n",
    },
    "test": {
        "sympy/logic/boolalg.py": "class Boolean:\n    pass\n",
        "sympy/logic/tests/test_boolalg.py": "def test_boolean():\n    assert Boolean\n",
        "sympy/ntheory/primetest.py": "def isprime(n):\n    return n > 1\n",
    },
}
TOO_LARGE = {  # over MAX_BYTES: left out wherever they are
    "sympy/polys/benchmarks/bench_solvers.py": "x = 1\n" * 500,
    "sympy/ntheory/tables.py": "t = [0]\n" * 400,
}
IGNORED = {  # not .py files under sympy/
    "setup.py": "IGNORED = 'setup.py'\n",
    "doc/src/conf.py": "IGNORED = 'doc'\n",
    "examples/beginner/basic.py": "IGNORED = 'examples'\n",
    "bin/test": "IGNORED = 'bin'\n",
    "sympy/core/data.txt": "IGNORED = 'txt'\n",
    "sympy/parsing/latex/LaTeX.g4": "IGNORED = 'grammar'\n",
    "sympy/core/basic.pyc": "IGNORED = 'pyc'\n",
    "LICENSE": "IGNORED = 'license'\n",
}
FILES = {**{p: t for split in SOURCES.values() for p, t in split.items()}, **TOO_LARGE, **IGNORED}


def make_sdist(path, files=FILES, top=TOP):
    """A .tar.gz like PyPI's: every file under one top directory, with directory entries and a symlink too."""
    with tarfile.open(path, "w:gz") as tar:
        for d in ("", "sympy/"):
            info = tarfile.TarInfo(top + d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(top + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(top + "sympy/link.py")  # not a regular file: ignored
        link.type, link.linkname = tarfile.SYMTYPE, "core/basic.py"
        tar.addfile(link)
    return str(path)


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(sympy, "MAX_BYTES", MAX_BYTES)
    assert all(len(t.encode()) <= MAX_BYTES for s in SOURCES.values() for t in s.values())
    assert all(len(t.encode()) > MAX_BYTES for t in TOO_LARGE.values())


def read_meta(out_dir):
    return json.load(open(os.path.join(out_dir, "meta.json")))


def check_output(out_dir, tokenizer_name):
    """Raw names, splits, bytes and documents in path order, through the tokenizer meta.json names."""
    meta = read_meta(out_dir)
    tok = from_meta(meta)
    assert tok.name == tokenizer_name
    raw = os.path.join(out_dir, "raw")
    assert sorted(os.listdir(raw)) == ["test", "train", "validation"]
    for split, files in SOURCES.items():
        paths = sorted(files)
        names = [p[:-len(".py")].replace("/", ".") + ".txt" for p in paths]
        assert [sympy.raw_name(p) for p in paths] == names and sorted(os.listdir(os.path.join(raw, split))) == names
        for p, n in zip(paths, names):  # the raw files are the sdist's bytes
            assert open(os.path.join(raw, split, n), "rb").read() == files[p].encode("utf-8")
        tokens, starts = split_arrays(out_dir, split)
        assert tokens.max() < tok.vocab_size and starts[0] == 0 and len(starts) == len(paths)
        ends = list(starts[1:]) + [len(tokens)]
        for p, start, end in zip(paths, starts, ends):  # each document: one file, in path order, then the end token
            piece = tokens[start:end].tolist()
            assert piece[-1] == tok.eot and tok.eot not in piece[:-1]
            assert b"".join(tok.token_bytes(i) for i in piece) == files[p].encode("utf-8") + EOT_TEXT
        counts = meta["splits"][split]
        assert counts == {"tokens": len(tokens), "documents": len(paths),  # words: per file (no final \n in TRICKY)
                          "words": sum(len(files[p].split()) for p in paths),
                          "bytes": sum(len(files[p].encode("utf-8")) for p in paths), "replaced": 0}
    assert meta["source"] == "pypi:sympy==1.13.3" and meta["license"] == "BSD-3-Clause"
    assert meta["held_out"] == {"validation": ["sympy/geometry/", "sympy/sets/"],
                                "test": ["sympy/logic/", "sympy/ntheory/"]}
    assert meta["left_out"] == sorted(TOO_LARGE)
    return meta


def test_sympy_layout_held_out_bytes_unchanged_and_rerun(tmp_path, small, capsys):
    sdist, out = make_sdist(tmp_path / "fake.tar.gz"), str(tmp_path / "out")
    sympy.main(["--sdist", sdist, "--out_dir", out, "--num_proc", "2"])
    printed = capsys.readouterr().out
    assert "left out as generated (over 2 KB): sympy/ntheory/tables.py, sympy/polys/benchmarks/bench_solvers.py" \
        in printed and "12 files: train 5, validation 4, test 3" in printed
    meta = check_output(out, "gpt2")
    assert meta["dataset"] == "sympy" and (meta["vocab_size"], meta["eot_token"]) == (50257, 50256)
    corpus = b"".join(open(os.path.join(out, "raw", s, n), "rb").read()
                      for s in SOURCES for n in os.listdir(os.path.join(out, "raw", s)))
    assert b"IGNORED" not in corpus and b"\r\n" in corpus  # no other file; no line changed
    assert sorted(os.listdir(out)) == ["meta.json", "raw", "test.bin", "test_docs.npy", "train.bin",
                                       "train_docs.npy", "validation.bin", "validation_docs.npy"]  # no .tmp left
    # a re-run does nothing; --force redoes it (in one process) into the same bytes
    first = snapshot(out)
    sympy.main(["--sdist", sdist, "--out_dir", out])
    assert "already prepared" in capsys.readouterr().out and snapshot(out) == first
    sympy.main(["--sdist", sdist, "--out_dir", out, "--num_proc", "1", "--force"])
    assert "already prepared" not in capsys.readouterr().out
    assert {n: b for n, (b, _) in snapshot(out).items()} == {n: b for n, (b, _) in first.items()}
    # another sdist is redone
    other = {**FILES, "sympy/core/basic.py": "x = 1\n"}
    sympy.main(["--sdist", make_sdist(tmp_path / "other.tar.gz", other), "--out_dir", out, "--num_proc", "1"])
    assert "already prepared" not in capsys.readouterr().out and read_meta(out)["fingerprint"] != meta["fingerprint"]


def test_sympy_bytes_default_dir_nul_after_every_file(tmp_path, small, monkeypatch, capsys):
    here = tmp_path / "data" / "sympy"  # a stand-in for the repo's data/sympy/
    monkeypatch.setattr(sympy, "HERE", str(here))
    monkeypatch.setattr(sympy, "DOWNLOAD_DIR", str(here / "download"))
    sdist = make_sdist(tmp_path / "fake.tar.gz")
    sympy.main(["--sdist", sdist, "--tokenizer=bytes", "--num_proc", "1"])  # default out_dir: the sibling
    out = tmp_path / "data" / "sympy_bytes"
    assert sorted(os.listdir(tmp_path / "data")) == ["sympy_bytes"]  # not data/sympy/
    meta = check_output(str(out), "bytes")
    assert meta["dataset"] == "sympy_bytes" and (meta["vocab_size"], meta["eot_token"]) == (256, 0)
    for split, files in SOURCES.items():  # the .bin is the files' bytes, each followed by NUL
        tokens, starts = split_arrays(out, split)
        expected = b"".join(files[p].encode("utf-8") + b"\0" for p in sorted(files))
        assert tokens.astype(np.uint8).tobytes() == expected and tokens.max() <= 255
        assert starts.tolist() == [0] + list(np.flatnonzero(tokens == 0)[:-1] + 1)
    capsys.readouterr()
    sympy.main(["--sdist", sdist, "--tokenizer=bytes"])
    assert "already prepared" in capsys.readouterr().out
    # a file holding NUL, the byte-level end-of-document mark, is refused
    nul = make_sdist(tmp_path / "nul.tar.gz", {**FILES, "sympy/core/basic.py": "x = '\0'\n"})
    message = error_message(sympy.main, ["--sdist", nul, "--tokenizer=bytes", "--out_dir", str(tmp_path / "nul"),
                                         "--num_proc", "1"])
    assert "byte 0" in message and not os.path.exists(tmp_path / "nul" / "meta.json")
    monkeypatch.undo()  # the real defaults: data/sympy/download/, next to data/sympy_bytes/
    assert sympy.DOWNLOAD_DIR == os.path.join(ROOT, "data", "sympy", "download")
    assert os.path.dirname(sympy.HERE) == os.path.join(ROOT, "data")
    assert sympy.DATASETS == {"gpt2": "sympy", "bytes": "sympy_bytes"}


def test_sympy_errors(tmp_path, small, monkeypatch, capsys):
    out = str(tmp_path / "out")
    assert "does not exist" in error_message(sympy.main, ["--sdist", str(tmp_path / "nope.tar.gz")])
    (tmp_path / "junk.tar.gz").write_bytes(b"<html>not a tarball</html>")
    assert "cannot read" in error_message(sympy.main, ["--sdist", str(tmp_path / "junk.tar.gz"), "--out_dir", out])
    empty = make_sdist(tmp_path / "empty.tar.gz", IGNORED)
    assert "has no */sympy/**.py files" in error_message(sympy.main, ["--sdist", empty, "--out_dir", out])
    no_ntheory = make_sdist(tmp_path / "partial.tar.gz", {p: t for p, t in FILES.items()
                                                          if not p.startswith("sympy/ntheory/")})
    assert "sympy/ntheory/ is not in the sdist" in error_message(sympy.main, ["--sdist", no_ntheory, "--out_dir", out])
    assert not os.path.exists(os.path.join(out, "meta.json")) and not os.path.exists(os.path.join(out, "raw.tmp"))

    # pip cannot reach PyPI: say which file to put where
    download = os.path.join(out, "download")
    monkeypatch.setattr(sympy, "DOWNLOAD_DIR", download)  # not the repo's real one
    calls = []

    def failing_pip(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Retrying ...\nERROR: No matching distribution "
                                                        "found for sympy==1.13.3\n")
    monkeypatch.setattr(shards.subprocess, "run", failing_pip)
    message = error_message(sympy.main, ["--out_dir", out])
    assert calls and calls[0][-1] == "sympy==1.13.3" and "download" in calls[0] and ":all:" in calls[0]
    assert calls[0][calls[0].index("--dest") + 1] == download
    assert "No matching distribution" in message and "https://pypi.org/project/sympy/1.13.3/" in message
    assert os.path.join(download, "sympy-1.13.3.tar.gz") in message and "--sdist" in message
    # a file at the download path that is not PyPI's sdist
    os.makedirs(download, exist_ok=True)
    make_sdist(os.path.join(download, "sympy-1.13.3.tar.gz"))
    assert "sha256" in error_message(sympy.main, ["--out_dir", out])
    assert len(calls) == 1 and not os.path.exists(os.path.join(out, "meta.json"))

    # bad flags: argparse's one line, exit status 2
    for argv, fragment in [(["--num_proc=0"], "--num_proc must be >= 1, got 0"), (["--bogus"], "--bogus"),
                           (["--tokenizer=chars"], "invalid choice")]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            sympy.main(argv + ["--out_dir", out])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err


def test_sympy_script_error_has_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "data/sympy/prepare.py", "--sdist", str(tmp_path / "nope")],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


def test_missing_sympy_data_names_its_command(tmp_path):
    for name, command in [("sympy", "python data/sympy/prepare.py`"),
                          ("sympy_bytes", "python data/sympy/prepare.py --tokenizer=bytes`"),
                          ("sympy_pretrain", "python data/sympy/prepare.py --halves=True`"),
                          ("sympy_finetune", "python data/sympy/prepare.py --halves=True`"),
                          ("sympy_bytes_pretrain", "python data/sympy/prepare.py --tokenizer=bytes --halves=True`"),
                          ("sympy_bytes_finetune", "python data/sympy/prepare.py --tokenizer=bytes --halves=True`"),
                          ("gutenberg_bytes", "python data/gutenberg/prepare.py --tokenizer=bytes`")]:
        with pytest.raises(loader.UserError, match="no data at") as e:
            loader.load_split(tmp_path / name, "train")
        assert command in str(e.value)


@pytest.mark.parametrize("dataset", ["sympy", "sympy_bytes"])
def test_real_sympy_held_out_splits_have_long_files(dataset):
    """The real prepared data (skipped without it): each held-out split has >= 8 files of >= 8,192 GPT-2 tokens,
    its files are all in its subpackages and none of them is in train."""
    out = os.path.join(ROOT, "data", dataset)
    if not os.path.exists(os.path.join(out, "meta.json")):
        pytest.skip(f"data/{dataset} is not prepared (python data/sympy/prepare.py"
                    f"{' --tokenizer=bytes' if dataset.endswith('_bytes') else ''})")
    meta = read_meta(out)
    assert meta["dataset"] == dataset and meta["fingerprint"] == sympy.SDIST_SHA256[:16]
    assert meta["left_out"] == ["sympy/physics/quantum/tests/test_spin.py", "sympy/polys/benchmarks/bench_solvers.py"]
    names = {split: sorted(os.listdir(os.path.join(out, "raw", split))) for split in sympy.HELD_OUT | {"train": 0}}
    for split, prefixes in sympy.HELD_OUT.items():
        dotted = tuple(p.replace("/", ".") for p in prefixes)
        assert all(n.startswith(dotted) for n in names[split])
        assert not any(n.startswith(dotted) for n in names["train"])
        assert all(any(n.startswith(p) for n in names[split]) for p in dotted)  # every subpackage is there
        if dataset == "sympy":  # GPT-2 tokens per file, its end token left out
            starts = np.load(os.path.join(out, f"{split}_docs.npy"))
            n_tokens = os.path.getsize(os.path.join(out, f"{split}.bin")) // 2
            lengths = np.diff(np.append(starts, n_tokens)) - 1
            assert len(starts) == len(names[split]) == meta["splits"][split]["documents"]
            assert (lengths >= 8192).sum() >= 8, sorted(lengths)[-8:]
    assert len(names["train"]) == meta["splits"]["train"]["documents"]
    # the files in path order: no module sits beside a package of its name, so dotted names sort as paths do
    for files in names.values():
        paths = [n[:-len(".txt")].replace(".", "/") + ".py" for n in files]
        assert paths == sorted(paths) and [sympy.raw_name(p) for p in paths] == files


def test_real_sympy_sdist_is_pypis():
    sdist = os.path.join(sympy.DOWNLOAD_DIR, sympy.SDIST)
    if not os.path.exists(sdist):
        pytest.skip("the real sdist is not downloaded (python data/sympy/prepare.py)")
    assert hashlib.sha256(open(sdist, "rb").read()).hexdigest() == sympy.SDIST_SHA256


# --halves=True: the train files halved by subpackage into <out_dir>_pretrain/ and <out_dir>_finetune/
HALF_EXTRA = {  # more train subpackages (and a top-level module), so that the greedy rule has something to balance
    "sympy/polys/rings.py": "class Ring:\n    pass\n" * 30,                      # sympy/polys/: 960 bytes
    "sympy/polys/tests/test_rings.py": "def test_ring():\n    assert Ring\n" * 10,
    "sympy/printing/str.py": "def sstr(e):\n    return str(e)\n" * 20,          # sympy/printing/: 620
    "sympy/abc.py": "from sympy import Symbol\nx = Symbol('x')\n",                # a group of its own: 41
}
# largest first, each to the lighter half (ties: pretrain): polys 960 -> P; printing 620 -> F; core 302 -> F (922);
# sets_like.py 65 -> F (987); abc.py 41 -> P (1001); __init__.py 20 -> F (1007)
HALF_GROUPS = {"pretrain": ["sympy/abc.py", "sympy/polys/"],
               "finetune": ["sympy/__init__.py", "sympy/core/", "sympy/printing/", "sympy/sets_like.py"]}


def raw_files(out_dir, split):
    directory = os.path.join(out_dir, "raw", split)
    return {n: open(os.path.join(directory, n), "rb").read() for n in sorted(os.listdir(directory))}


def doc_tokens(out_dir, split):
    """{raw name: its tokens, end token included}: the split's documents, in the raw files' (path) order."""
    tokens, starts = split_arrays(out_dir, split)
    ends = list(starts[1:]) + [len(tokens)]
    names = sorted(os.listdir(os.path.join(out_dir, "raw", split)))
    assert len(names) == len(starts)
    return {n: tokens[a:b].tolist() for n, a, b in zip(names, starts, ends)}


def test_sympy_halves_disjoint_by_subpackage_greedy_and_same_held_out(tmp_path, small, capsys):
    files = {**FILES, **HALF_EXTRA}
    sdist = make_sdist(tmp_path / "fake.tar.gz", files)
    plain, out = str(tmp_path / "plain"), str(tmp_path / "out")
    sympy.main(["--sdist", sdist, "--out_dir", plain, "--num_proc", "1"])       # no flag: the full dataset only
    assert sorted(os.listdir(tmp_path)) == ["fake.tar.gz", "plain"]
    capsys.readouterr()
    sympy.main(["--sdist", sdist, "--out_dir", out, "--num_proc", "1", "--halves=True"])
    printed = capsys.readouterr().out
    assert "out_pretrain: the train files" not in printed and "sympy_pretrain: the train files of 2 subpackages" in \
        printed and "sympy_finetune: the train files of 4 subpackages" in printed
    assert sorted(os.listdir(tmp_path)) == ["fake.tar.gz", "out", "out_finetune", "out_pretrain", "plain"]
    # the full dataset is the one the flag does not make: the same bytes
    assert {n: b for n, (b, _) in snapshot(out).items()} == {n: b for n, (b, _) in snapshot(plain).items()}
    train = {p: t.encode() for p, t in files.items() if p in SOURCES["train"] or p in HALF_EXTRA}
    size = {}
    for path, data in train.items():
        size[sympy.group_of(path)] = size.get(sympy.group_of(path), 0) + len(data)
    halves = {h: f"{out}_{h}" for h in ("pretrain", "finetune")}
    metas = {h: read_meta(d) for h, d in halves.items()}
    full_meta, full_docs = read_meta(out), doc_tokens(out, "train")
    assert {h: m["subpackages"] for h, m in metas.items()} == HALF_GROUPS
    # every subpackage in exactly one half; the halves' files disjoint, their union the train split; each half's
    # train files are exactly its subpackages' (file for file, byte for byte, token for token)
    assert sorted(sum(HALF_GROUPS.values(), [])) == sorted(size)
    names = {h: raw_files(d, "train") for h, d in halves.items()}
    assert not set(names["pretrain"]) & set(names["finetune"])
    assert {**names["pretrain"], **names["finetune"]} == raw_files(out, "train")
    for h, d in halves.items():
        assert names[h] == {sympy.raw_name(p): b for p, b in train.items() if sympy.group_of(p) in HALF_GROUPS[h]}
        assert doc_tokens(d, "train") == {n: full_docs[n] for n in names[h]}
    # balanced as the greedy rule says: in size order each group went to the half with fewer bytes (ties: pretrain)
    total = {"pretrain": 0, "finetune": 0}
    for group in sorted(size, key=lambda g: (-size[g], g)):
        half = next(h for h, groups in HALF_GROUPS.items() if group in groups)
        assert total[half] <= total[{"pretrain": "finetune", "finetune": "pretrain"}[half]], group
        assert total["pretrain"] != total["finetune"] or half == "pretrain", group
        total[half] += size[group]
    assert total == {h: m["splits"]["train"]["bytes"] for h, m in metas.items()} == {"pretrain": 1001, "finetune": 1007}
    # validation and test: the full dataset's, byte for byte (raw files, tokens, document offsets, counts)
    for h, d in halves.items():
        for split in ("validation", "test"):
            assert raw_files(d, split) == raw_files(out, split)
            for name in (f"{split}.bin", f"{split}_docs.npy"):
                assert open(os.path.join(d, name), "rb").read() == open(os.path.join(out, name), "rb").read()
            assert metas[h]["splits"][split] == full_meta["splits"][split]
        meta = metas[h]
        assert meta["dataset"] == f"sympy_{h}" and meta["half"] == h and meta["tokenizer"] == "gpt2"
        assert {k: meta[k] for k in ("source", "fingerprint", "license", "held_out", "left_out")} == {
            k: full_meta[k] for k in ("source", "fingerprint", "license", "held_out", "left_out")}
        assert meta["splits"]["train"]["documents"] == len(names[h])
    assert sum(m["splits"]["train"]["tokens"] for m in metas.values()) == full_meta["splits"]["train"]["tokens"]
    # a re-run does nothing; with the full dataset already there, --halves=True makes only the halves
    first = {d: snapshot(d) for d in (out, *halves.values())}
    sympy.main(["--sdist", sdist, "--out_dir", out, "--halves"])
    assert capsys.readouterr().out.count("already prepared") == 3
    assert {d: snapshot(d) for d in first} == first
    sympy.main(["--sdist", sdist, "--out_dir", plain, "--num_proc", "1", "--halves=True"])
    assert capsys.readouterr().out.count("already prepared") == 1
    for h, d in halves.items():                                         # the same bytes as made with the full one
        assert {n: b for n, (b, _) in snapshot(f"{plain}_{h}").items()} == {n: b for n, (b, _) in snapshot(d).items()}


def test_sympy_halves_errors(tmp_path, small, capsys):
    out = str(tmp_path / "out")
    one = make_sdist(tmp_path / "one.tar.gz", {p: t for p, t in FILES.items()     # every train file in sympy/core/
                                               if p not in ("sympy/__init__.py", "sympy/sets_like.py")})
    message = error_message(sympy.main, ["--sdist", one, "--out_dir", out, "--num_proc", "1", "--halves=True"])
    assert "all in sympy/core/" in message and "two subpackages" in message
    assert not os.path.exists(out + "_pretrain") and not os.path.exists(out + "_finetune")
    for value in ("maybe", "1"):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            sympy.main([f"--halves={value}", "--out_dir", out])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "True or False" in err, err
    sdist = make_sdist(tmp_path / "fake.tar.gz")
    sympy.main(["--sdist", sdist, "--out_dir", out, "--num_proc", "1", "--halves=False"])
    assert sorted(os.listdir(tmp_path)) == ["fake.tar.gz", "one.tar.gz", "out"]


@pytest.mark.parametrize("dataset, flags", [("sympy", ""), ("sympy_bytes", " --tokenizer=bytes")])
def test_real_sympy_halves(dataset, flags):
    """The real halves (skipped without them: python data/sympy/prepare.py --halves=True): disjoint by subpackage, their
    union the train split, balanced within the largest subpackage, validation and test data/sympy's own; the same
    files as bytes (--tokenizer=bytes --halves=True)."""
    full = os.path.join(ROOT, "data", dataset)
    halves = {h: os.path.join(ROOT, "data", f"{dataset}_{h}") for h in sympy.HALVES}
    if not all(os.path.exists(os.path.join(d, "meta.json")) for d in (full, *halves.values())):
        pytest.skip(f"data/{dataset}_pretrain and data/{dataset}_finetune are not prepared "
                    f"(python data/sympy/prepare.py{flags} --halves=True)")
    metas = {h: read_meta(d) for h, d in halves.items()}
    train = sorted(os.listdir(os.path.join(full, "raw", "train")))
    names = {h: sorted(os.listdir(os.path.join(d, "raw", "train"))) for h, d in halves.items()}
    assert sorted(names["pretrain"] + names["finetune"]) == train
    groups = {h: {sympy.group_of(n[:-len(".txt")].replace(".", "/") + ".py") for n in files}
              for h, files in names.items()}
    assert not groups["pretrain"] & groups["finetune"]
    assert {h: sorted(g) for h, g in groups.items()} == {h: m["subpackages"] for h, m in metas.items()}
    size = {}
    for n in train:
        group = sympy.group_of(n[:-len(".txt")].replace(".", "/") + ".py")
        size[group] = size.get(group, 0) + os.path.getsize(os.path.join(full, "raw", "train", n))
    assert abs(metas["pretrain"]["splits"]["train"]["bytes"] - metas["finetune"]["splits"]["train"]["bytes"]) \
        <= max(size.values())
    for d in halves.values():
        for name in ("validation.bin", "validation_docs.npy", "test.bin", "test_docs.npy"):
            assert open(os.path.join(d, name), "rb").read() == open(os.path.join(full, name), "rb").read()
