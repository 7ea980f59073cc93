"""The run folder: what `txl-train` (scripts/train.py) writes, and what evaluate and publish read back.

One reader and writer, so that the names and the rules about what counts as complete live in one place:

    <run>/
        config.json, model.safetensors, generation_config.json   the model (save_pretrained)
        configuration_txl.py, modeling_txl.py, ...               its code (trust_remote_code)
        tokenizer.json, tokenizer_config.json                    the tokenizer
        train_args.json                                          the options of the run (compared by --resume)
        metrics.json                                             the results; written last: a finished run has one
        curves.png                                               training and validation curves
        eval/eval-<split>.json|md|png                            scripts/evaluate.py's reports
        checkpoints/step-XXXXXXXX/                               complete checkpoints (trainer_state.json last)
        logs/                                                    tensorboard

    run = RunFolder("runs/a")
    run.train_args            # dict, or None without train_args.json
    run.metrics               # dict, or None before the run finished
    run.latest_checkpoint()   # Path of the newest complete checkpoint, or None
    run.has_model(), run.has_tokenizer(), run.weight_files()

A file that is there but not a JSON object raises `RunFolderError` (a `ValueError` whose message names the file), so
that a CLI reports it in one line (`parser.error(str(error))`). This module reads and writes files only: it imports
neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .files import write_json_atomically

__all__ = [
    "CHECKPOINT_NAME",
    "DEFAULT_VALIDATION_FRACTION",
    "DataSource",
    "MissingTextFile",
    "RunFolder",
    "RunFolderError",
    "checkpoint_name",
    "complete_checkpoints",
    "read_json_object",
    "text_files_of",
    "vocabulary_digest",
]

CONFIG = "config.json"
TRAIN_ARGS = "train_args.json"
METRICS = "metrics.json"
CURVES = "curves.png"
CHECKPOINTS = "checkpoints"
EVAL = "eval"
LOGS = "logs"
TRAINER_STATE = "trainer_state.json"  # in a checkpoint folder: written last, so its presence means complete
# What save_pretrained writes for the weights: one file, or an index of shards.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Both are needed: a tokenizer.json without its tokenizer_config.json loads without its settings (a character-level
# tokenizer would no longer count as one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# The train_args.json keys naming the text files of each split.
TEXT_FILE_OPTIONS = {"train": "train_file", "validation": "validation_file", "test": "test_file"}
# The share of the "train" rows cut off as "validation" where a corpus has no such split (`load_corpus`' default).
DEFAULT_VALIDATION_FRACTION = 0.05
CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")
# What a killed writer may leave behind (files.py and the checkpoint writer): hidden staging and trash folders,
# hidden temporary files.
_LEFTOVER_FOLDER_PREFIXES = (".staging-", ".trash-")


class RunFolderError(ValueError):
    """A run folder file that cannot be read as expected; the message names the file."""


class MissingTextFile(RunFolderError):
    """A text file a run's train_args.json names is not there (`RunFolder.data_source`)."""


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in `path`; `RunFolderError` when it is unreadable, not JSON or not an object."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunFolderError(f"{path} is not readable JSON ({error}); fix or remove it") from None
    if not isinstance(value, dict):
        raise RunFolderError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def checkpoint_name(step: int) -> str:
    """`step-00000042`: zero-padded, so that the names sort as the steps."""
    return f"step-{step:08d}"


def complete_checkpoints(root: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints in the folder `root`, oldest first (hidden staging folders are not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        path
        for path in root.iterdir()
        if CHECKPOINT_NAME.match(path.name) and path.is_dir() and (path / TRAINER_STATE).is_file()
    ]
    return sorted(found, key=lambda path: path.name)


def text_files_of(train_args: dict[str, Any]) -> dict[str, list[str]]:
    """The text files a run's options name, `{split: [path, ...]}` for the splits they name (a path or a list)."""
    files = {}
    for split, option in TEXT_FILE_OPTIONS.items():
        value = train_args.get(option)
        if value:
            files[split] = [str(value)] if isinstance(value, str) else [str(path) for path in value]
    return files


def vocabulary_digest(vocabulary: Mapping[str, int]) -> str:
    """A SHA-256 of a tokenizer's `{token: id}` (added tokens included): equal digests, the same ids for the same
    text, whatever folder the tokenizer was read from (an evaluation report records it; publishing compares it with
    the run's tokenizer)."""
    items = sorted((str(token), int(index)) for token, index in vocabulary.items())
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


class DataSource(NamedTuple):
    """Where a text comes from: the arguments of `transfoxl.data.load_corpus` and `tokenize_corpus`, and whence they
    were taken (`RunFolder.data_source`; `_asdict()` goes into an evaluation's report)."""

    text_files: dict[str, list[str]] | None
    dataset_name: str | None
    dataset_config: str | None
    validation_fraction: float
    cache_dir: str | None
    add_eos: bool
    origin: str  # "the command line", "<run>/train_args.json" or "default"

    def describe(self) -> str:
        if self.text_files is not None:
            what = "text files " + ", ".join(f"{split}: {paths}" for split, paths in self.text_files.items())
        elif self.dataset_name is not None:
            what = f"dataset {self.dataset_name}" + (f" ({self.dataset_config})" if self.dataset_config else "")
        else:
            what = "the built-in corpus"
        return f"{what} (from {self.origin})"


class RunFolder:
    """A run folder at `path` (which need not exist yet). Reads each file when asked: nothing is cached."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.model_path = self.path  # what to give `from_pretrained`: the run folder itself
        self.config_path = self.path / CONFIG
        self.train_args_path = self.path / TRAIN_ARGS
        self.metrics_path = self.path / METRICS
        self.curves_path = self.path / CURVES
        self.checkpoints_dir = self.path / CHECKPOINTS
        self.eval_dir = self.path / EVAL
        # Set by training when a run starts here: a new run (no train_args.json before it), and whether it made the
        # folder; `discard_new_run` reads them.
        self.new_run = False
        self.made_folder = False

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # -- what is there

    def exists(self) -> bool:
        return self.path.is_dir()

    def is_empty(self) -> bool:
        """No visible entry (hidden leftovers of a killed run do not count); true for a folder not yet made."""
        return not self.path.is_dir() or all(entry.name.startswith(".") for entry in self.path.iterdir())

    def has_config(self) -> bool:
        return self.config_path.is_file()

    def weight_files(self) -> list[str]:
        """The names of WEIGHT_FILES present (a single file or a shard index)."""
        return [name for name in WEIGHT_FILES if (self.path / name).is_file()]

    def has_model(self) -> bool:
        """A saved model: config.json and weights."""
        return self.has_config() and bool(self.weight_files())

    def has_tokenizer(self) -> bool:
        """Both tokenizer files, as save_pretrained writes them."""
        return all((self.path / name).is_file() for name in TOKENIZER_FILES)

    def has_train_args(self) -> bool:
        return self.train_args_path.is_file()

    def is_finished(self) -> bool:
        """metrics.json is written last: its presence means the run went to the end."""
        return self.metrics_path.is_file()

    # -- JSON files

    def _read_optional(self, path: Path) -> dict[str, Any] | None:
        return read_json_object(path) if path.is_file() else None

    @property
    def config(self) -> dict[str, Any] | None:
        """config.json as a dict, or None without one."""
        return self._read_optional(self.config_path)

    @property
    def train_args(self) -> dict[str, Any] | None:
        """train_args.json: the options of the training run (paths absolute), or None without one."""
        return self._read_optional(self.train_args_path)

    @property
    def metrics(self) -> dict[str, Any] | None:
        """metrics.json: `summary`, `evaluation`, `train`, `history`, `model`, `tokenizer`, `data`, `sample`,
        `environment`; None until the run finished."""
        return self._read_optional(self.metrics_path)

    def text_files(self) -> dict[str, list[str]]:
        """The text files the run read, `{split: [path, ...]}` for the splits it named (empty: the built-in corpus
        or a Hub dataset, see `train_args["dataset_name"]`)."""
        return text_files_of(self.train_args or {})

    def data_source(
        self,
        *,
        text_files: dict[str, list[str]] | None = None,
        dataset_name: str | None = None,
        dataset_config: str | None = None,
        validation_fraction: float | None = None,
        cache_dir: str | None = None,
        add_eos: bool | None = None,
        given_by: str = "the command line",
    ) -> DataSource:
        """The text to read: the one given (`text_files` `{split: [path, ...]}` or `dataset_name`); else the one this
        run trained on (train_args.json); else the built-in corpus. `validation_fraction`, `cache_dir` and `add_eos`
        are not sources: given alone they adjust the run's source rather than replace it (a run's `add_eos` applies to
        any text, as the model learned its line ends). `given_by` names where the given source came from. Raises
        `RunFolderError` for a train_args.json that is not a JSON object, or that names a text file not here."""
        run = self.train_args or {}
        run_files = self.text_files()
        run_fraction = None
        if text_files or dataset_name is not None:
            origin = given_by
        elif run_files or run.get("dataset_name"):
            origin = str(self.train_args_path)
            text_files, dataset_name, dataset_config = (
                run_files or None,
                run.get("dataset_name"),
                run.get("dataset_config"),
            )
            for paths in run_files.values():
                for path in paths:
                    if not Path(path).is_file():
                        raise MissingTextFile(f"{origin} names the text file {path}, which does not exist (here)")
            run_fraction = run.get("validation_fraction")
        else:
            origin, text_files, dataset_name, dataset_config = "default", None, None, None
        if validation_fraction is None:
            validation_fraction = float(run_fraction) if run_fraction is not None else DEFAULT_VALIDATION_FRACTION
        return DataSource(
            text_files or None,
            dataset_name,
            dataset_config,
            validation_fraction,
            cache_dir if cache_dir is not None else run.get("cache_dir"),
            add_eos if add_eos is not None else bool(run.get("add_eos", True)),
            origin,
        )

    def write_train_args(self, train_args: dict[str, Any]) -> None:
        write_json_atomically(self.train_args_path, train_args)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        """Write metrics.json; do it last, as its presence means a finished run."""
        write_json_atomically(self.metrics_path, metrics)

    # -- checkpoints

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints, oldest first."""
        return complete_checkpoints(self.checkpoints_dir)

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    @staticmethod
    def trainer_state(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
        """A checkpoint's trainer_state.json (step, tokens seen, data position, history...)."""
        return read_json_object(Path(checkpoint) / TRAINER_STATE)

    # -- results

    def eval_files(self, suffixes: tuple[str, ...] = (".json", ".md", ".png")) -> list[Path]:
        """The evaluation reports in eval/ with one of `suffixes`, sorted: plain files only, no hidden half-written
        temporaries, no links leading out of the run folder."""
        if not self.eval_dir.is_dir():
            return []
        return [
            path
            for path in sorted(self.eval_dir.iterdir())
            if not path.name.startswith(".") and not path.is_symlink() and path.is_file() and path.suffix in suffixes
        ]

    # -- upkeep

    def discard_new_run(self) -> None:
        """Take back what a new run wrote before it stopped (train_args.json, its tokenizer, the folder if the run made
        it and nothing is left in it): the folder held nothing visible when the run started (`is_empty`)."""
        if not self.new_run:
            return
        for path in (self.train_args_path, *(self.path / name for name in TOKENIZER_FILES)):
            path.unlink(missing_ok=True)
        if self.made_folder and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()

    def remove_leftovers(self) -> None:
        """Delete what a killed process left half-written: hidden staging folders, trash, temporary files."""
        for folder in (self.path, self.checkpoints_dir):
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                if path.name.startswith(_LEFTOVER_FOLDER_PREFIXES) and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                elif path.name.startswith(".") and path.name.endswith(".tmp") and path.is_file():
                    path.unlink(missing_ok=True)
