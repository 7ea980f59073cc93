"""Publishing a run folder on the Hugging Face Hub: the exact folder to commit, then one commit with huggingface_hub.

`read_run_folder` checks a run folder (`transfoxl.runs.RunFolder`: what `txl-train` writes, or any `save_pretrained`
folder of a `TxlForCausalLM` with its tokenizer) and collects what gets published: the model and its code files (those
`auto_map` names and what they import), the tokenizer, metrics.json, curves.png, eval/ reports and train_args.json.
`write_hub_folder` writes the commit's content into a folder: local paths cut to file names (`sanitize`), the model
card from `transfoxl.model_card`. `upload` sends that folder with `HfApi` (`create_repo`, `upload_folder`) in one
commit; the token is `--token` or huggingface_hub's own `get_token()` (HF_TOKEN, then `hf auth login`'s), and each
of huggingface_hub's errors becomes one line saying what to do (`upload_error_message`).

An eval/ report made with another tokenizer, or on other text, than the run's is found by `eval_report_problems`
(`Publication.eval_mismatches`): the command line refuses it unless told to publish it, and the card then says so
beside it.

Never committed: `checkpoints/` (optimizer and random states), `logs/`, hidden files, `train_args.json` (it holds
absolute local paths; `training_args.json` is its sanitized copy), nor anything else in the run folder.

A run folder that cannot be published raises `transfoxl.runs.RunFolderError` (a `ValueError`); a refusal or failure
while writing or uploading raises `PublishError`. Both messages are one line, for the command line.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import transformers
from huggingface_hub import CommitInfo, HfApi, ModelCard, constants, get_token
from huggingface_hub.errors import (
    BadRequestError,
    HfHubHTTPError,
    LocalTokenNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from tokenizers import Tokenizer
from transformers.dynamic_module_utils import get_relative_imports

from .checkpoints import close_local_paths, did_you_mean
from .configuration_txl import TransfoXLConfig, TxlConfig
from .files import fsync_dir, fsync_tree, write_json_atomically, write_text_atomically
from .model_card import CONVERSION_RECORD, base_model_of, card_for_conversion, card_for_run, percent
from .runs import (
    TEXT_FILE_OPTIONS,
    TRAIN_ARGS,
    RunFolder,
    RunFolderError,
    read_json_object,
    text_files_of,
    vocabulary_digest,
)

try:  # get_token raises it when HF_OIDC_RESOURCE is set and the exchange fails (Trusted Publishers, huggingface_hub 2)
    from huggingface_hub.errors import OIDCError
except ImportError:  # an older huggingface_hub: get_token does not raise
    OIDCError = ()

__all__ = [
    "Publication",
    "PublishError",
    "eval_report_problems",
    "folder_listing",
    "read_run_folder",
    "resolve_token",
    "run_card",
    "sanitize",
    "upload",
    "write_dry_run_folder",
    "write_hub_folder",
]

# Files taken from the run folder as they are (when present); everything else is either generated or left out.
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
EVAL_SUFFIXES = (".json", ".md", ".png")
# train_args.json options that are local paths, whatever their form (relative ones included).
PATH_OPTIONS = {*TEXT_FILE_OPTIONS.values(), "output_dir", "cache_dir", "config"}
# Files checked for local paths before anything is written out or sent.
TEXT_SUFFIXES = {".json", ".md", ".py", ".txt", ".jinja", ".yaml", ".yml"}
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# Weights, code and reports of an earlier commit must not survive next to the new ones: transformers would load a
# stale model.safetensors before a new sharded index.
STALE_PATTERNS = ["*.safetensors", "*.bin", "*.index.json", "*.py", "eval/*"]
ENV_TRUE = {"1", "ON", "YES", "TRUE"}


class PublishError(Exception):
    """Writing or uploading the folder was refused or failed; the message says why and what to do, in one line."""


@dataclass
class Publication:
    """What a run folder publishes. `files` maps a path in the repository to its source file; the JSON files are
    kept as read (`write_hub_folder` writes them sanitized)."""

    run: RunFolder
    config: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)
    metrics: dict[str, Any] | None = None
    train_args: dict[str, Any] | None = None
    eval_reports: dict[str, Any] = field(default_factory=dict)  # "eval/eval-test.json" -> its content
    # The reports whose tokenizer or text is not the run's: "eval/eval-test.json" -> why, in words
    eval_mismatches: dict[str, str] = field(default_factory=dict)
    vocabulary_sha256: str | None = None  # of the run's tokenizer.json (`runs.vocabulary_digest`)
    conversion: dict[str, Any] | None = None  # conversion.json of a folder made by scripts/convert.py
    base: dict[str, Any] | None = None  # the model a training run fine-tuned (`model_card.base_model_of`)
    warnings: list[str] = field(default_factory=list)

    @property
    def source_license(self) -> str | list[str] | None:
        """The licence declared for what this folder derives from: a converted checkpoint's source, or the model a
        run fine-tuned. A Hub id, several, or None (none declared, or neither)."""
        if self.conversion is not None:
            return self.conversion.get("source_license")
        return None if self.base is None else self.base.get("license")

    @property
    def derived(self) -> str | None:
        """What `source_license` is the licence of, in words (None: a model of its own)."""
        if self.conversion is not None:
            return "the converted checkpoint"
        return None if self.base is None else "the fine-tuned base model"

    @property
    def path(self) -> Path:
        return self.run.path


# ---------------------------------------------------------------------------------------------------------------------
# The run folder


def read_run_folder(run_dir: str | os.PathLike[str]) -> Publication:
    """Check `run_dir` and collect what will be published; raises `RunFolderError` naming the problem."""
    run = RunFolder(run_dir)
    if not run.path.exists():
        close = close_local_paths(str(run.path))
        raise RunFolderError(f"RUN_DIR {run.path} does not exist{did_you_mean(close, ' (', ')')}")
    if not run.exists():
        raise RunFolderError(f"RUN_DIR {run.path} is not a folder")
    if not run.has_config():
        raise RunFolderError(
            f"RUN_DIR {run.path} has no config.json: it is not a saved model (scripts/train.py writes one)"
        )
    config = run.config
    check_model_config(run.config_path, config)
    if config.get("model_type") == TransfoXLConfig.model_type:  # a v4 checkpoint: converted, never rewritten here
        raise RunFolderError(
            f"{run.config_path} is a transformers-v4 checkpoint (model_type 'transfo-xl'): convert it first with "
            f"`python scripts/convert.py {run.path} OUT` (verified against v4, with tokenizer and card), then publish "
            "OUT"
        )
    publication = Publication(run=run, config=config)
    publication.files.update({name: run.path / name for name in MODEL_FILES if (run.path / name).is_file()})
    add_weights(publication)
    add_code(publication)
    add_tokenizer(publication)
    check_weights(publication)  # (after the checks that name a more specific cause)

    publication.metrics = run.metrics
    publication.train_args = run.train_args
    publication.base = base_model_of((publication.train_args or {}).get("model_name_or_path"))
    record_path = run.path / CONVERSION_RECORD
    if record_path.is_file() and publication.train_args is None:  # a folder made by scripts/convert.py
        publication.conversion = read_conversion_record(record_path)
        publication.files[CONVERSION_RECORD] = record_path
    elif publication.metrics is None:
        publication.warnings.append("no metrics.json: the model card has no results")
    readme = run.path / "README.md"
    if readme.is_file() and publication.conversion is None:
        warning = f"{readme} is not published: the repository's README.md is the generated model card"
        if "scripts/convert.py" in readme.read_text(encoding="utf-8", errors="replace"):
            warning += "; convert the checkpoint again with this version to publish its conversion card"
        publication.warnings.append(warning)
    if run.curves_path.is_file():
        publication.files[run.curves_path.name] = run.curves_path
    for path in run.eval_files(EVAL_SUFFIXES):
        name = f"{run.eval_dir.name}/{path.name}"
        publication.files[name] = path
        if path.suffix == ".json":
            publication.eval_reports[name] = read_json_object(path)
            if problems := eval_report_problems(publication, publication.eval_reports[name]):
                publication.eval_mismatches[name] = "; ".join(problems)
    return publication


# The licence ids of the Hub's list (https://huggingface.co/docs/hub/repositories-licenses, 2026), for a card's
# `license`: the Hub shows any other as not a licence it knows. (It adds ids now and then: one missing here is warned
# about, not refused.)
HUB_LICENSE_IDS = frozenset(
    [
        "apache-2.0",
        "mit",
        "openrail",
        "bigscience-openrail-m",
        "creativeml-openrail-m",
        "bigscience-bloom-rail-1.0",
        "bigcode-openrail-m",
        "afl-3.0",
        "artistic-2.0",
        "bsl-1.0",
        "bsd",
        "bsd-2-clause",
        "bsd-3-clause",
        "bsd-3-clause-clear",
        "c-uda",
        "cc",
        "cc0-1.0",
        "cc-by-2.0",
        "cc-by-2.5",
        "cc-by-3.0",
        "cc-by-4.0",
        "cc-by-sa-3.0",
        "cc-by-sa-4.0",
        "cc-by-nc-2.0",
        "cc-by-nc-3.0",
        "cc-by-nc-4.0",
        "cc-by-nd-4.0",
        "cc-by-nc-nd-3.0",
        "cc-by-nc-nd-4.0",
        "cc-by-nc-sa-2.0",
        "cc-by-nc-sa-3.0",
        "cc-by-nc-sa-4.0",
        "cdla-sharing-1.0",
        "cdla-permissive-1.0",
        "cdla-permissive-2.0",
        "wtfpl",
        "ecl-2.0",
        "epl-1.0",
        "epl-2.0",
        "etalab-2.0",
        "eupl-1.1",
        "eupl-1.2",
        "agpl-3.0",
        "gfdl",
        "gpl",
        "gpl-2.0",
        "gpl-3.0",
        "lgpl",
        "lgpl-2.1",
        "lgpl-3.0",
        "isc",
        "lppl-1.3c",
        "ms-pl",
        "mpl-2.0",
        "odc-by",
        "odbl",
        "openrail++",
        "osl-3.0",
        "postgresql",
        "ofl-1.1",
        "ncsa",
        "unlicense",
        "zlib",
        "pddl",
        "lgpl-lr",
        "deepfloyd-if-license",
        "llama2",
        "llama3",
        "llama3.1",
        "llama3.2",
        "llama3.3",
        "llama4",
        "gemma",
        "apple-ascl",
        "apple-amlr",
        "unknown",
        "other",
    ]
)


def license_warning(license_id: str) -> str | None:
    """What to say about `license_id` when it is not in the Hub's list (`HUB_LICENSE_IDS`): a likely typo's close
    ids; None when it is listed."""
    if license_id in HUB_LICENSE_IDS:
        return None
    close = difflib.get_close_matches(license_id, sorted(HUB_LICENSE_IDS), n=3, cutoff=0.6)
    return (
        f"licence {license_id!r} is not in the Hub's list of licence ids (as this package knows it"
        f"{did_you_mean(close)}): the Hub "
        "would show the card's licence as one it does not know. A licence of your own: --license other (and its "
        "text in a LICENSE file); the list: https://huggingface.co/docs/hub/repositories-licenses"
    )


def mismatched_reports_message(publication: Publication) -> str:
    """The refusal of the reports in `eval_mismatches`, with what to do, in one line."""
    listed = "; ".join(f"{name}: {why}" for name, why in sorted(publication.eval_mismatches.items()))
    return (
        f"RUN_DIR {publication.path}: evaluation reports that do not measure this run's model with its tokenizer on "
        f"its text would be published beside its results ({listed}). Evaluate again with the run's tokenizer and "
        "data (scripts/evaluate.py RUN_DIR with no --tokenizer or data option), move the report out of eval/, or "
        "pass --include-mismatched-eval to publish it marked as such on the model card"
    )


def eval_report_problems(publication: Publication, report: dict[str, Any]) -> list[str]:
    """How an evaluate.py report's tokenizer or text differs from the run's, in words ([]: none found).

    The tokenizer: its recorded vocabulary digest against the run's tokenizer.json (a report from before digests were
    recorded: its tokenizer's folder against the model's). The text (a run with train_args.json): the report's data
    source against the run's options for that split, and its token count against metrics.json's."""
    problems = []
    tokenizer = report.get("tokenizer") if isinstance(report.get("tokenizer"), dict) else {}
    digest, source = tokenizer.get("vocabulary_sha256"), tokenizer.get("source")
    own_folders = {report.get("model_dir"), str(publication.path.resolve())}
    if digest is not None and publication.vocabulary_sha256 is not None and digest != publication.vocabulary_sha256:
        problems.append(f"made with another tokenizer ({base_name(str(source))}, {tokenizer.get('size')} tokens)")
    elif digest is None and source not in own_folders:
        problems.append(f"made with the tokenizer of {base_name(str(source))}, not recorded as the run's")
    data = report.get("data") if isinstance(report.get("data"), dict) else {}
    split = data.get("split")
    train_args = publication.train_args
    if train_args is None or split not in TEXT_FILE_OPTIONS:
        return problems
    text = other_text(data.get("source") if isinstance(data.get("source"), dict) else {}, train_args, split)
    counted = ((publication.metrics or {}).get("data") or {}).get(split)
    if text is None and isinstance(counted, int) and data.get("split_tokens") not in (None, counted):
        text = f"its {split} split has {data['split_tokens']:,} tokens, the run's had {counted:,}"
    if text is not None:
        problems.append(f"on other text than the run's ({text})")
    return problems


def other_text(source: dict[str, Any], train_args: dict[str, Any], split: str) -> str | None:
    """How an evaluation's data source (`runs.DataSource._asdict()`) reads another `split` than the run of
    `train_args` did, in words; None where it is the run's."""
    run_files = text_files_of(train_args)
    run_dataset = (train_args.get("dataset_name"), train_args.get("dataset_config"))
    if str(source.get("origin", "")).endswith(TRAIN_ARGS) or source.get("origin") == "default":
        # the run's own source (evaluate.py read train_args.json), or the built-in corpus (it found none there)
        if source.get("origin") == "default" and (run_files or run_dataset[0]):
            return "the built-in corpus"
        cut = split != "test" and "validation" not in run_files and run_files
        fraction, run_fraction = source.get("validation_fraction"), train_args.get("validation_fraction")
        if cut and None not in (fraction, run_fraction) and float(fraction) != float(run_fraction):
            return f"--validation-fraction {fraction}, the run's {run_fraction}"
        return None
    if source.get("dataset_name") is not None:
        given = (source.get("dataset_name"), source.get("dataset_config"))
        return None if given == run_dataset else f"dataset {given[0]} ({given[1]})"
    files = (source.get("text_files") or {}).get(split) or []
    resolved = {str(Path(path).resolve()) for path in files}
    if resolved == {str(Path(path).resolve()) for path in run_files.get(split, [])}:
        return None
    return f"{', '.join(base_name(str(path)) for path in files)} as its {split} text"


# conversion.json's fields and their types (`model_card.conversion_record`); None is allowed for each.
CONVERSION_FIELDS = {
    "title": str,
    "source": str,
    "source_repo_id": str,
    "source_weight_files": list,
    "source_license": (str, list),
    "source_license_name": str,
    "source_license_link": str,
    "parameters": int,
    "tokenizer": str,
    "verification": str,
    "converted_by": str,
}


def read_conversion_record(path: Path) -> dict[str, Any]:
    """conversion.json, checked: the card is rendered from it (`RunFolderError` naming a field of the wrong type)."""
    record = read_json_object(path)
    for name, kind in CONVERSION_FIELDS.items():
        value = record.get(name)
        wrong = value is not None and (not isinstance(value, kind) or isinstance(value, bool))
        if isinstance(value, list) and not all(isinstance(item, str) for item in value):
            wrong = True
        if wrong:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            expected = " or ".join("a list of strings" if k is list else k.__name__ for k in kinds) + " or null"
            raise RunFolderError(f"{path}: {name!r} must be {expected}, got {value!r}; convert the model again")
    return {name: record.get(name) for name in CONVERSION_FIELDS}


def check_model_config(path: Path, config: dict[str, Any]) -> None:
    """A Transformer-XL config that loads: published otherwise, it would fail for everyone who downloads it."""
    model_types = (TxlConfig.model_type, TransfoXLConfig.model_type)
    if config.get("model_type") not in model_types:
        raise RunFolderError(
            f"{path}: model_type {config.get('model_type')!r} is not a Transformer-XL model (expected one of "
            f"{', '.join(map(repr, model_types))})"
        )
    try:
        TxlConfig.from_dict(dict(config))
    except (ValueError, TypeError) as error:
        raise RunFolderError(f"{path} is not a valid Transformer-XL config: {error}") from None


def inside_run(publication: Publication, name: Any, named_by: str) -> Path:
    """`path / name` for a relative file name that stays inside the run folder (no `..`, no absolute path, no link
    out): a file name read from a JSON file must not make publishing read or write anywhere else."""
    root = publication.path
    parts = PurePosixPath(name).parts if isinstance(name, str) else ()
    if not parts or name.startswith("/") or "\\" in name or any(part in (".", "..") for part in parts):
        raise RunFolderError(f"{named_by} names {name!r}: expected a file name relative to RUN_DIR {root}")
    path = root / name
    if not path.resolve().is_relative_to(root.resolve()):
        raise RunFolderError(f"{named_by} names {name!r}, which leads outside RUN_DIR {root}")
    return path


def add_weights(publication: Publication) -> None:
    """One weight file, or an index and every shard it names."""
    root = publication.path
    for name in WEIGHT_INDEX_FILES:
        index_path = root / name
        if not index_path.is_file():
            continue
        weight_map = read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise RunFolderError(f"{index_path} has no weight_map")
        publication.files[name] = index_path
        for shard in sorted(set(weight_map.values()), key=str):
            path = inside_run(publication, shard, name)
            if not path.is_file():
                raise RunFolderError(f"RUN_DIR {root}: the shard {shard} named in {name} is missing")
            publication.files[shard] = path
        return
    for name in SINGLE_WEIGHT_FILES:
        if (root / name).is_file():
            publication.files[name] = root / name
            return
    raise RunFolderError(
        f"RUN_DIR {root} has no weights: expected model.safetensors (or {', '.join(SINGLE_WEIGHT_FILES[1:])}, "
        f"or a sharded {' / '.join(WEIGHT_INDEX_FILES)})"
    )


def check_weights(publication: Publication) -> None:
    """The weights load into the model that config.json describes, with the checks of this package's
    `from_pretrained` (no file damaged, no weight missing or left over, every shape right): published otherwise, a
    download would load with plain transformers and a warning, and part of the model random."""
    from . import modeling_txl  # (here: the rest of publishing needs no model code)
    from .checkpoints import CheckpointError

    classes = (
        "TxlForCausalLM",
        "TxlForSequenceClassification",
        "TxlForTokenClassification",
        "TxlForQuestionAnswering",
        "TxlModel",
    )
    named = [name for name in publication.config.get("architectures") or () if name in classes]
    model_class = getattr(modeling_txl, named[0] if named else "TxlForCausalLM")
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        model_class.from_pretrained(publication.path)
    except CheckpointError as error:
        raise RunFolderError(f"RUN_DIR {publication.path}: its weights do not load: {error}") from None
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()


def auto_map_modules(auto_map: dict[str, Any]) -> list[str]:
    """The module names of an `auto_map` ("modeling_txl.TxlModel" -> "modeling_txl"); code kept in another repository
    ("org/repo--module.Class") needs no file here."""
    modules = []
    for value in auto_map.values():
        for reference in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(reference, str) and "--" not in reference and "." in reference:
                modules.append(reference.rsplit(".", 1)[0])
    return sorted(set(modules))


def module_file(publication: Publication, module: str, named_by: str) -> str:
    """`"modeling_txl"` -> `"modeling_txl.py"`, for a dotted Python module name only (never a path)."""
    if not MODULE_NAME.fullmatch(module):
        raise RunFolderError(
            f"{named_by} names the module {module!r}: expected a Python module name such as modeling_txl"
        )
    name = f"{module.replace('.', '/')}.py"
    inside_run(publication, name, named_by)
    return name


def add_code(publication: Publication) -> None:
    """The code files that `auto_map` names, and the files they import relatively (what trust_remote_code loads)."""
    config_path = publication.run.config_path
    auto_map = publication.config.get("auto_map")
    if not isinstance(auto_map, dict) or not auto_map:
        raise RunFolderError(
            f"{config_path} has no auto_map: without it plain transformers cannot load the model by its "
            "repository id. Save the model with `import transfoxl` done first (it registers the code files), e.g. "
            "`transfoxl.TxlForCausalLM.from_pretrained(RUN_DIR).save_pretrained(RUN_DIR)`"
        )
    if "AutoModelForCausalLM" not in auto_map:
        raise RunFolderError(f"{config_path}: auto_map has no AutoModelForCausalLM entry ({sorted(auto_map)})")
    pending = [module_file(publication, module, "config.json's auto_map") for module in auto_map_modules(auto_map)]
    while pending:
        name = pending.pop()
        if name in publication.files:
            continue
        path = publication.path / name
        if not path.is_file():
            raise RunFolderError(
                f"RUN_DIR {publication.path} lacks {name}, the code that config.json's auto_map (or its relative "
                "imports) needs for trust_remote_code"
            )
        publication.files[name] = path
        pending.extend(module_file(publication, module, name) for module in get_relative_imports(path))


def add_tokenizer(publication: Publication) -> None:
    root = publication.path
    if not (root / "tokenizer.json").is_file():
        raise RunFolderError(
            f"RUN_DIR {root} has no tokenizer (tokenizer.json): save it next to the model, e.g. "
            "`AutoTokenizer.from_pretrained(...).save_pretrained(RUN_DIR)`"
        )
    check_tokenizer_size(publication)
    publication.files.update({name: root / name for name in TOKENIZER_FILES if (root / name).is_file()})
    tokenizer_config = {}
    if "tokenizer_config.json" in publication.files:
        tokenizer_config = read_json_object(root / "tokenizer_config.json")
    if isinstance(tokenizer_config.get("auto_map"), dict):
        for module in auto_map_modules(tokenizer_config["auto_map"]):
            name = module_file(publication, module, "tokenizer_config.json's auto_map")
            if not (root / name).is_file():
                raise RunFolderError(f"RUN_DIR {root} lacks {name}, which tokenizer_config.json's auto_map names")
            publication.files[name] = root / name
    elif tokenizer_config.get("tokenizer_class"):
        class_name = tokenizer_config["tokenizer_class"]
        if not hasattr(transformers, class_name):
            publication.warnings.append(
                f"tokenizer_config.json names tokenizer_class {class_name!r}, which plain transformers does not have: "
                "AutoTokenizer will need the transfoxl package"
            )


def check_tokenizer_size(publication: Publication) -> None:
    """Ids the tokenizer produces must index the model's vocabulary (fewer tokenizer ids is harmless)."""
    path = publication.path / "tokenizer.json"
    try:
        vocabulary = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception as error:  # the tokenizers library raises its own exception type on a malformed file
        raise RunFolderError(f"{path} is not a readable tokenizer ({error})") from None
    size = len(vocabulary)
    publication.vocabulary_sha256 = vocabulary_digest(vocabulary)
    vocab_size = TxlConfig.from_dict(dict(publication.config)).vocab_size  # v4 files may leave it out: the default
    if size > vocab_size:
        raise RunFolderError(
            f"vocabulary mismatch: {path} has {size} tokens, the model's vocab_size is {vocab_size}: ids past it "
            "would fail in the model. Save the tokenizer the model was trained with"
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


def is_path_value(value: Any, key: str | None) -> bool:
    return isinstance(value, str) and (key in PATH_OPTIONS or is_local_path(value))


def sanitize(value: Any, key: str | None = None) -> Any:
    """`value` with every local path replaced by its base name (recursively); `key` names a path option."""
    if isinstance(value, dict):
        return {name: sanitize(item, name) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(item, key) for item in value]
    return base_name(value) if is_path_value(value, key) else value


def local_paths(value: Any, key: str | None = None) -> set[str]:
    """Every string in `value` that `sanitize` would replace."""
    if isinstance(value, dict):
        return set().union(*(local_paths(item, name) for name, item in value.items()))
    if isinstance(value, (list, tuple)):
        return set().union(*(local_paths(item, key) for item in value))
    return {value} if is_path_value(value, key) and base_name(value) != value else set()


def scrub_text(text: str, paths: set[str]) -> str:
    """`text` with each of `paths` replaced by its base name, the longest first (so no prefix is cut alone)."""
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, base_name(path))
    return text


def check_no_local_paths(folder: Path, paths: set[str]) -> None:
    """Refuse a folder whose text files still name a local path of the run (a safety net behind `sanitize`)."""
    needles = [path.encode() for path in paths if len(path) > 4 and is_local_path(path)]
    for file in sorted(folder.rglob("*")):
        if file.is_file() and file.suffix in TEXT_SUFFIXES:
            content = file.read_bytes()
            for needle in needles:
                if needle in content:
                    raise PublishError(
                        f"{file.relative_to(folder)} would publish the local path {needle.decode()}; nothing was "
                        "written or uploaded. Remove that path from the run folder's file and run again."
                    )


# ---------------------------------------------------------------------------------------------------------------------
# The folder to commit


def run_card(publication: Publication, repo_id: str, license_id: str, datasets: list[str] | None) -> ModelCard:
    """README.md: YAML metadata (with a model-index of metrics.json's results) and the card's text; for a folder made
    by scripts/convert.py, its conversion card (where the model came from, the verification) for `repo_id`."""
    if publication.conversion is not None:
        return card_for_conversion(
            publication.conversion,
            repo_id=repo_id,
            config=publication.config,
            code_files=sorted(name for name in publication.files if name.endswith(".py")),
            license_id=license_id,
            datasets=datasets,
            local=False,
            tokenizer_added="tokenizer.json" in publication.files,  # (publishing requires one: add_tokenizer)
        )
    return card_for_run(
        repo_id=repo_id,
        license_id=license_id,
        datasets=datasets,
        config=publication.config,
        metrics=sanitize(publication.metrics),
        train_args=sanitize(publication.train_args),
        files=sorted(publication.files),
        base=publication.base,
        report_notes=report_notes(publication),
    )


def report_notes(publication: Publication) -> dict[str, str]:
    """What the card says beside each eval/ report (its .md): a tokenizer or text not the run's (published only when
    asked), a share of unknown tokens."""
    notes = {}
    for name, report in publication.eval_reports.items():
        parts = []
        if name in publication.eval_mismatches:
            parts.append(f"not comparable with this model's own results: {publication.eval_mismatches[name]}")
        share = (report.get("data") or {}).get("unknown_share") if isinstance(report.get("data"), dict) else None
        if isinstance(share, (int, float)) and share > 0:
            unk = (report.get("tokenizer") or {}).get("unk_token") or "<unk>"
            parts.append(f"{percent(share)} of its tokens are `{unk}`")
        if parts:
            notes[name.removesuffix(".json") + ".md"] = "; ".join(parts)
    return notes


def write_hub_folder(
    publication: Publication,
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
    paths = local_paths(publication.train_args or {})
    for report in publication.eval_reports.values():
        paths |= local_paths(report)
    paths |= {str(publication.path.resolve()), str(publication.path.absolute())}
    for name, source in sorted(publication.files.items()):
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name in publication.eval_reports:
            write_json_atomically(target, sanitize(publication.eval_reports[name]))
        elif name.startswith("eval/") and name.endswith(".md"):
            write_text_atomically(target, scrub_text(source.read_text(encoding="utf-8"), paths))
        else:
            copy_file(source, target, link=link)
    if publication.metrics is not None:
        write_json_atomically(folder / "metrics.json", sanitize(publication.metrics))
    if publication.train_args is not None:
        write_json_atomically(folder / "training_args.json", sanitize(publication.train_args))
    write_text_atomically(folder / "README.md", str(run_card(publication, repo_id, license_id, datasets)))
    check_no_local_paths(folder, paths)


def copy_file(source: Path, target: Path, *, link: bool) -> None:
    if link:
        try:
            os.link(source, target)
            return
        except OSError:  # another file system, or links not allowed: copy
            pass
    shutil.copyfile(source, target)


def folder_listing(folder: Path) -> list[tuple[str, int]]:
    """(path in the repository, size in bytes) of every file under `folder`, sorted."""
    return sorted(
        (path.relative_to(folder).as_posix(), path.stat().st_size) for path in folder.rglob("*") if path.is_file()
    )


def write_dry_run_folder(build: Callable[[Path], None], destination: Path) -> None:
    """Build the folder in a hidden staging folder next to `destination`, then rename it into place, so that
    `destination` appears complete or not at all. `destination` must be absent or an empty folder."""
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        what = "is a file" if not destination.is_dir() else "exists and is not an empty folder"
        raise PublishError(
            f"--dry-run-dir {destination} {what}: nothing there is replaced. Remove it, or choose another "
            "--dry-run-dir."
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
    """Where to stage the upload: inside the run folder (a hidden `.staging-*` folder, which the run folder's upkeep
    clears if left behind), so that the weights are hard-linked rather than copied; the system's temporary folder if
    the run folder is read-only."""
    return str(run_dir) if os.access(run_dir, os.W_OK) else None


# ---------------------------------------------------------------------------------------------------------------------
# Uploading


def offline_mode() -> bool:
    """huggingface_hub's offline mode as read at its import, or HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE as set now."""
    now = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper() in ENV_TRUE
    return bool(constants.HF_HUB_OFFLINE) or now


def loading_failure(error: BaseException, name: str | os.PathLike[str]) -> str:
    """Why a model or tokenizer `name` could not be loaded, in one line: transformers' first line, or, offline and
    not a local path, that it is not in the local Hub cache (transformers' own message asks to check the internet)."""
    if offline_mode() and not Path(name).expanduser().exists():
        return "offline (HF_HUB_OFFLINE): not a folder, and not in the local Hub cache"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def resolve_token(given: str | None) -> str:
    """`given` (--token), else huggingface_hub's `get_token()`: HF_TOKEN, else the token `hf auth login` stored."""
    try:
        token = given or get_token()
    except OIDCError as error:
        raise PublishError(f"Cannot read the Hugging Face token: {first_line(error)}") from None
    if not token:
        raise PublishError(
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
            errors.append(importlib.import_module(module_name).TransportError)
        except ImportError:
            continue
    return tuple(errors)


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (a server's message can span several), cut at `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def upload_error_message(error: BaseException, repo_id: str, revision: str | None) -> str:
    """One clear line for each of huggingface_hub's errors (and a request that got no answer)."""
    code = getattr(getattr(error, "response", None), "status_code", None)
    server = one_line(getattr(error, "server_message", None) or first_line(error))
    if isinstance(error, OfflineModeIsEnabled):
        message = (
            "Offline mode is on (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE): huggingface_hub refuses every request. "
            "Unset them to publish."
        )
    elif isinstance(error, LocalTokenNotFoundError):
        message = "No Hugging Face token: log in with `hf auth login`, or set HF_TOKEN, or pass --token."
    elif isinstance(error, RevisionNotFoundError):
        message = f"The revision {revision!r} of {repo_id} was not found on the Hub ({first_line(error)})."
    elif isinstance(error, HfHubHTTPError) and code == 401:
        # The Hub also answers 401 for a repository the token cannot see: say both.
        message = (
            f"Authentication failed (HTTP 401) for {repo_id}: the token is invalid or expired, or cannot see that "
            "repository. Log in again with `hf auth login` (a token with write access), or pass another --token."
        )
    elif isinstance(error, RepositoryNotFoundError):
        message = (
            f"Repository {repo_id} not found, or not writable with this token (HTTP {code}): check the namespace, "
            "and that the token has write access to it (`hf auth whoami`)."
        )
    elif isinstance(error, HfHubHTTPError) and code == 403:
        message = (
            f"Permission denied (HTTP 403) for {repo_id}: the token cannot write there (a read-only token, or not a "
            f"member of the organization with write rights). ({server})"
        )
    elif isinstance(error, HfHubHTTPError) and code == 404:
        message = f"Not found (HTTP 404) on the Hub while publishing {repo_id}: {server}"
    elif isinstance(error, BadRequestError):
        message = f"The Hub refused the request (HTTP 400) for {repo_id}: {server}"
    elif isinstance(error, HfHubHTTPError):
        message = f"The Hub answered HTTP {code} for {repo_id}: {server}"
    else:
        message = (
            f"Cannot reach the Hugging Face Hub at {constants.ENDPOINT} ({type(error).__name__}: "
            f"{first_line(error)}): check the network connection, a proxy (HTTPS_PROXY) or HF_ENDPOINT, then run "
            "again."
        )
    return one_line(message, limit=1000)


def upload(
    folder: Path,
    *,
    repo_id: str,
    token: str,
    commit_message: str,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
) -> tuple[str, CommitInfo]:
    """Create the repository (and branch) if needed, commit `folder` in one commit; return the repository's address
    and the commit. Raises `PublishError` with one line for every way it fails."""
    api = HfApi(token=token)
    errors = (OfflineModeIsEnabled, HfHubHTTPError, LocalTokenNotFoundError, *network_errors())
    try:
        # private=None, not False: a new public repository then follows the organization's default visibility.
        repo_url = api.create_repo(repo_id, private=True if private else None, exist_ok=True, repo_type="model")
        # create_repo(exist_ok=True) keeps an existing repository's visibility: never upload publicly by surprise.
        if private and not api.repo_info(repo_id, repo_type="model").private:
            raise PublishError(
                f"--private: {repo_id} already exists and is public; nothing was uploaded. Make it private in its "
                "settings on the Hub (or `HfApi().update_repo_settings(..., private=True)`), or leave out --private "
                "to publish it publicly."
            )
        # A pull request's ref (refs/pr/N) exists already and is not a branch to create.
        if revision not in (None, "main") and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            folder_path=folder,
            repo_id=repo_id,
            repo_type="model",
            revision=revision,
            create_pr=create_pr,
            commit_message=commit_message,
            delete_patterns=STALE_PATTERNS,
        )
    except errors as error:
        raise PublishError(upload_error_message(error, repo_id, revision)) from None
    return str(repo_url), commit
