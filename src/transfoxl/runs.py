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

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from .files import write_json_atomically

__all__ = [
    "CHECKPOINT_NAME",
    "RunFolder",
    "RunFolderError",
    "checkpoint_name",
    "complete_checkpoints",
    "read_json_object",
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
CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")
# What a killed writer may leave behind (files.py and the checkpoint writer): hidden staging and trash folders,
# hidden temporary files.
_LEFTOVER_FOLDER_PREFIXES = (".staging-", ".trash-")


class RunFolderError(ValueError):
    """A run folder file that cannot be read as expected; the message names the file."""


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
        train_args = self.train_args or {}
        files = {}
        for split, option in TEXT_FILE_OPTIONS.items():
            value = train_args.get(option)
            if value:
                files[split] = [str(value)] if isinstance(value, str) else [str(path) for path in value]
        return files

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
