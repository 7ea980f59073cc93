"""Train a Transformer-XL tokenizer on a text file or a `datasets` corpus and save it as `tokenizer.json`
(`txl-train-tokenizer`, `python scripts/train_tokenizer.py`).

Kinds:
  word  WikiText-style word level with the original Transformer-XL vocabulary semantics: specials first, then words by
        decreasing count, `--min-freq`, at most `--vocab-size` words; `<eos>` ends every line.
  char  character level: every character (space and newline included) is one token; exact round trip.
  bpe   byte-level BPE of `--vocab-size` tokens: open vocabulary, exact round trip of any UTF-8.

The saved folder loads with plain transformers: `AutoTokenizer.from_pretrained(out)`.

    python scripts/train_tokenizer.py --kind word --text-file train.txt --min-freq 3 --out tok-word
    python scripts/train_tokenizer.py --kind bpe --dataset Salesforce/wikitext --config wikitext-2-raw-v1 \\
        --split train --vocab-size 8000 --out tok-bpe
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from ..files import folder_problem
from ..tokenization import BPE_MIN_VOCAB_SIZE, TOKENIZER_KINDS, save_atomically, train_tokenizer
from .options import path_argument, program_name


def read_text_file(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, each with its newline (so character-level training sees newlines). Line ends
    are read as train.py reads them (datasets' text loader): `\r\n` and `\r` become `\n`, so a CRLF file gives no
    `\r` token that the training data never holds."""
    with open(path, encoding="utf-8") as f:
        yield from f


def read_dataset(
    name: str, config: str | None, split: str, column: str, cache_dir: Path | None = None
) -> tuple[Iterable[str], int | None]:
    """The `column` of a `datasets` split (one row per line, as the `text` builder and WikiText store them)."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    from ..data import could_not_build

    try:
        dataset = load_dataset(name, config, split=split, cache_dir=str(cache_dir) if cache_dir else None)
    except DatasetGenerationError as error:
        advice = "A packaged builder (json, csv, text, parquet) reads files: give a local file with --text-file "
        advice += "instead."
        raise ValueError(could_not_build(f"--dataset {name}", error, advice)) from None
    if column not in dataset.column_names:
        raise ValueError(f"--text-column {column!r}: not a column of {name}; columns: {dataset.column_names}")
    return dataset[column], len(dataset)


class TextCounter:
    """Passes the lines through, counting those that hold more than whitespace (an empty corpus is refused)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.lines, self.text_lines = lines, 0

    def __iter__(self) -> Iterator[str]:
        for line in self.lines:
            if isinstance(line, str) and line.strip():
                self.text_lines += 1
            yield line


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Errors that need no reading: numbers out of range, a missing file, options that do not apply."""
    if args.text_file is not None:
        dataset_only = [name for name in ("config", "split", "text_column", "cache_dir") if getattr(args, name)]
        if dataset_only:
            parser.error(f"--{dataset_only[0].replace('_', '-')} applies to --dataset, not to --text-file")
    args.split = args.split or "train"
    args.text_column = args.text_column or "text"
    if args.text_file is not None and not args.text_file.is_file():
        what = "is a folder, not a file" if args.text_file.is_dir() else "no such file"
        parser.error(f"--text-file {args.text_file}: {what}")
    if args.vocab_size is not None:
        least = BPE_MIN_VOCAB_SIZE if args.kind == "bpe" else 1
        if args.vocab_size < least:
            reason = " (256 byte symbols + <eos> + <pad>)" if args.kind == "bpe" else ""
            parser.error(f"--vocab-size must be >= {least} for --kind {args.kind}{reason}, got {args.vocab_size}")
    if args.min_freq is not None and args.min_freq < 1:
        parser.error(f"--min-freq must be >= 1 (the fewest occurrences a kept symbol has), got {args.min_freq}")
    if args.lower_case and args.kind != "word":
        parser.error(f"--lower-case applies to --kind word only, not {args.kind}")
    if problem := folder_problem(args.out):
        parser.error(f"--out {args.out}: {problem}")
    if (Path(args.out) / "config.json").is_file():  # (--overwrite or not: the model's ids are what it learned)
        parser.error(
            f"--out {args.out} holds a model (config.json): a newly trained tokenizer's ids are not those the model "
            "learned; write the tokenizer to another folder"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("train_tokenizer.py"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kind", choices=TOKENIZER_KINDS, required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text-file", type=path_argument, help="a UTF-8 text file, one line of the corpus per line")
    source.add_argument("--dataset", help="a `datasets` name or local path (with --config, --split, --text-column)")
    dataset = parser.add_argument_group("with --dataset")
    dataset.add_argument("--config", default=None, help="dataset configuration, e.g. wikitext-103-raw-v1")
    dataset.add_argument("--split", default=None, help="the split read (default: train)")
    dataset.add_argument("--text-column", default=None, help="the column of text (default: text)")
    dataset.add_argument("--cache-dir", type=path_argument, default=None, help="datasets cache folder (default: HF's)")
    parser.add_argument(
        "--vocab-size", type=int, default=None, help="word/char: most symbols kept; bpe: vocabulary size (8000)"
    )
    parser.add_argument("--min-freq", type=int, default=None, help="fewest occurrences kept (word/char 1, bpe 2)")
    parser.add_argument("--lower-case", action="store_true", help="word level: lower-case the text")
    parser.add_argument("--out", type=path_argument, required=True, help="output folder for tokenizer.json")
    parser.add_argument("--overwrite", action="store_true", help="replace tokenizer files already in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Train and save the tokenizer; 0 on success, 1 with a message on stderr when the text cannot train one, 2 for
    options that make no sense (argparse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)

    source = f"--text-file {args.text_file}" if args.text_file is not None else f"--dataset {args.dataset}"
    try:
        if args.text_file is not None:
            lines, total = read_text_file(args.text_file), None
        else:
            lines, total = read_dataset(args.dataset, args.config, args.split, args.text_column, args.cache_dir)
        counter = TextCounter(lines)
        lines = tqdm(counter, total=total, unit=" lines", desc=f"training {args.kind}", disable=args.no_progress)
        tokenizer = train_tokenizer(
            args.kind, lines, vocab_size=args.vocab_size, min_freq=args.min_freq, lower_case=args.lower_case
        )
    except UnicodeDecodeError as error:
        print(f"error: {source} is not UTF-8 text ({error})", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if counter.text_lines == 0:
        print(
            f"error: {source} holds no text (no line with anything but whitespace): nothing to train on",
            file=sys.stderr,
        )
        return 1
    # Word and char vocabularies keep only symbols seen --min-freq times; with none, every text would be <unk>.
    # (Character level always has the newline; byte-level BPE always has its 256 bytes.)
    learned = set(tokenizer.get_vocab()) - set(tokenizer.all_special_tokens) - {"\n"}
    if args.kind != "bpe" and not learned:
        print(
            f"error: no {'word' if args.kind == 'word' else 'character'} of {source} occurs --min-freq "
            f"{args.min_freq or 1} times or more: the vocabulary would hold only the special tokens",
            file=sys.stderr,
        )
        return 1
    try:
        save_atomically(tokenizer, args.out, overwrite=args.overwrite)
    except FileExistsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{args.kind}: {len(tokenizer)} tokens -> {args.out / 'tokenizer.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
