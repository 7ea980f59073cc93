"""Options that more than one command line takes, written once."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..runs import DEFAULT_VALIDATION_FRACTION

SPLIT_FILE_HELP = {
    "train": "training file(s): plain text, one row per line; .json/.jsonl/.csv: each record's text field",
    "validation": "validation file(s), of the training files' kind (plain text, or .json/.jsonl/.csv)",
    "test": "test file(s), of the training files' kind (plain text, or .json/.jsonl/.csv)",
}


@contextlib.contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """datasets' and transformers' own progress bars (loading, tokenizing, saving) off within the block unless
    `enabled` (then left as the environment set them: never forced on), and as they were after it (main() may run
    inside a test session). datasets is imported only if installed."""
    from transformers.utils import logging as transformers_logging

    libraries: list[Any] = [transformers_logging]  # datasets has the same three functions
    if importlib.util.find_spec("datasets") is not None:
        import datasets

        libraries.append(datasets)
    was_enabled = [library.is_progress_bar_enabled() for library in libraries]

    def switch(library: Any, on: bool) -> None:
        if on:
            library.enable_progress_bar()
        else:
            library.disable_progress_bar()

    if not enabled:
        for library in libraries:
            switch(library, False)
    try:
        yield
    finally:
        for library, on in zip(libraries, was_enabled, strict=True):
            switch(library, on)


def path_argument(value: str) -> Path:
    """argparse's `type` for a file or folder: an empty value (an unset shell variable, say) is refused rather than
    read as the current folder, where `Path("")` would put it."""
    return Path(name_argument(value))


def name_argument(value: str) -> str:
    """argparse's `type` for a path kept as text (saved in train_args.json) or a path-or-Hub-id: not empty."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or folder name (. for the current folder)")
    return value


def program_name(script: str) -> str:
    """The name for usage and error lines: the console command when run as one (`txl-evaluate`), else the script's
    file name (`evaluate.py`), also when `main` is called in-process."""
    command = Path(sys.argv[0]).name if sys.argv else ""
    return command if command.startswith("txl-") else script


def add_corpus_options(group: argparse._ArgumentGroup, *, defaults_from_run: bool) -> None:
    """The text to read (`transfoxl.data.load_corpus`, `tokenize_corpus`): plain-text files per split or a Hub
    dataset, the validation split cut off the training one, the datasets cache, the line ends. The names of
    transformers' run_clm_no_trainer.py are accepted too (`--train_file`, `--dataset_name`...).

    `defaults_from_run`: an option left out is None, and takes the value of the training run being read (evaluate:
    the run folder's train_args.json), else the default; otherwise it is the default (train)."""
    run = "the training run's, else " if defaults_from_run else ""

    def note(shown: str) -> str:  # train's formatter shows the defaults itself
        return f" (default: {run}{shown})" if defaults_from_run else ""

    for split, text in SPLIT_FILE_HELP.items():
        aliases = [f"--{split}_file"] if split != "test" else []
        group.add_argument(f"--{split}-file", *aliases, nargs="+", default=None, metavar="PATH", help=text)
    group.add_argument(
        "--dataset-name", "--dataset_name", default=None, help="a dataset on the Hub, e.g. Salesforce/wikitext"
    )
    group.add_argument(
        "--dataset-config", "--dataset_config_name", default=None, help="its configuration, e.g. wikitext-103-raw-v1"
    )
    group.add_argument(
        "--validation-fraction",
        type=float,
        default=None if defaults_from_run else DEFAULT_VALIDATION_FRACTION,
        help="without a validation split, the last fraction of the training lines becomes one"
        + note(str(DEFAULT_VALIDATION_FRACTION)),
    )
    group.add_argument(
        "--cache-dir",
        type=name_argument,
        default=None,
        help=f"datasets cache folder (default: {run}the datasets default)",
    )
    group.add_argument(
        "--add-eos",
        action=argparse.BooleanOptionalAction,
        default=None if defaults_from_run else True,
        help="end every line with the newline token (char, bpe) or <eos> (word)" + note("yes"),
    )
