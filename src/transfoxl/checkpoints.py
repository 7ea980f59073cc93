"""Loading checkpoints that may be broken or hostile: clear errors, never a silently half-random model.

`TxlPreTrainedModel.from_pretrained` goes through `load_checked`, which adds to transformers' own loading:

* before loading, a folder without `config.json`, a path that does not exist, a file given for a folder, and (offline)
  a Hub repo id that is not in the local cache are refused with a `CheckpointError` naming the path;
* if loading fails on a weight file, each weight file is examined (`check_weight_file`) and the one that is empty,
  truncated, corrupt or refused is named in a `CheckpointError`, with the original exception as its cause;
* after loading, the weights must fit the model that `config.json` describes: a shape mismatch (unless
  `ignore_mismatched_sizes=True`), a weight the checkpoint lacks, or a checkpoint weight that lands inside the model's
  structure but has no place there (more layers or clusters than configured) raises a `CheckpointMismatchError`
  naming the parameters. transformers only logs the last two and initialises the weights at random. The one
  exception is a task head that is trained from a pre-trained body (`score` of `TxlForSequenceClassification`): it
  may start newly initialised, with transformers' warning, as usual.

Every error is a `CheckpointError`, an `OSError`. Where transformers raises another type for the same problem with
its own models (transformers 5.23, checked with GPT-2 folders broken the same way), the error is an instance of that
type too, so that an `except` written for transformers catches it:

* weights that do not fit config.json: `CheckpointMismatchError`, a `RuntimeError` as transformers raises for
  mismatched shapes (and torch's strict `load_state_dict` for missing and unexpected weights too);
* a truncated or corrupt safetensors file: `CorruptSafetensorsError`, a `safetensors.SafetensorError`;
* a `.bin` that asks for a Python global or is not a torch checkpoint: `RefusedPickleError`, a
  `pickle.UnpicklingError` as `torch.load(weights_only=True)` raises;
* a shard named by the index that is missing: `MissingShardError`, a `FileNotFoundError`;
* a shard index that is not JSON: `ShardIndexError`, a `ValueError` (transformers: its subclass `JSONDecodeError`).

Missing paths and files, and unknown repos offline, are `OSError`s in transformers as here. A truncated `.bin` is a
plain `CheckpointError`: torch raises `OSError`, `RuntimeError` or `EOFError` depending on where the file was cut.

Weight files are never unpickled in full: safetensors holds no code, and `.bin` files go through
`torch.load(weights_only=True)` (tensors and plain containers only; `TxlPreTrainedModel.from_pretrained` refuses
`weights_only=False`). A `.bin` naming any other Python global is refused without anything in it being run.

This module needs only the standard library, torch, safetensors and huggingface_hub. A model folder loaded with
`trust_remote_code=True` where this package is not installed loads without these checks (transformers' own only).
"""

from __future__ import annotations

import difflib
import json
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any

from safetensors import SafetensorError

__all__ = [
    "FRESH_HEADS",
    "CheckpointError",
    "CheckpointMismatchError",
    "CorruptSafetensorsError",
    "MissingShardError",
    "RefusedPickleError",
    "ShardIndexError",
    "TorchLoadProblem",
    "check_loaded_weights",
    "check_safetensors_file",
    "check_torch_file",
    "check_weight_file",
    "close_local_paths",
    "did_you_mean",
    "is_hub_repo_id",
    "load_checked",
    "local_path_problem",
    "safetensors_problem",
    "torch_load_problem",
    "weight_files",
]

# Weight files in transformers' order of preference: safetensors first, a single file before an index.
WEIGHT_NAMES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Task heads trained from a pre-trained body: a checkpoint of another class lacks them, and that is expected.
# Everything else (the body, the language-modelling head) must come from the checkpoint.
FRESH_HEADS: dict[str, tuple[str, ...]] = {
    "TxlForSequenceClassification": ("score",),
    "TxlForTokenClassification": ("classifier",),
    "TxlForQuestionAnswering": ("qa_outputs",),
}
# safetensors refuses larger headers (its own limit), so a larger length prefix is corruption, not a big model.
_MAX_SAFETENSORS_HEADER = 100_000_000
_LISTED = 8  # names shown in a message before "... (N more)"


class CheckpointError(OSError):
    """A checkpoint's files are missing, unreadable, truncated, corrupt, refused, or do not fit its config.json.

    An `OSError`, as transformers raises for files it cannot load; the message names the file or parameters. The
    subclasses below are also instances of what transformers raises for the same problem (module docstring).
    """


class CheckpointMismatchError(CheckpointError, RuntimeError):
    """The checkpoint's weights do not fit the model that config.json describes: shapes, missing or misplaced weights.

    A `RuntimeError`, as transformers raises for mismatched shapes without `ignore_mismatched_sizes=True`.
    """


class CorruptSafetensorsError(CheckpointError, SafetensorError):
    """A safetensors file that is truncated or corrupt: also the `SafetensorError` transformers lets through."""


class RefusedPickleError(CheckpointError, pickle.UnpicklingError):
    """A `.bin` weights file that asks for more than tensors: also the `pickle.UnpicklingError` that
    `torch.load(weights_only=True)` raises in transformers."""


class MissingShardError(CheckpointError, FileNotFoundError):
    """A shard named by the shard index is not in the folder: also a `FileNotFoundError`, as in transformers."""


class ShardIndexError(CheckpointError, ValueError):
    """A shard index that is not JSON or has no weight map: also a `ValueError` (transformers lets a
    `json.JSONDecodeError` through for an index that is not JSON)."""


# ---------------------------------------------------------------------------------------------------------------------
# Weight files


def check_safetensors_file(path: str | os.PathLike[str]) -> None:
    """Raise `CheckpointError` naming `path` if it is not a complete, well-formed safetensors file.

    Checks the layout (8-byte little-endian header length, a JSON header, tensor data exactly covering the rest of the
    file) by reading the header only; then lets safetensors itself open it. Bit flips inside tensor data cannot be
    detected: the format has no checksum.
    """
    path = Path(path)
    problem = safetensors_problem(path)
    if problem is None:
        try:
            from safetensors import safe_open

            with safe_open(path, framework="pt") as file:
                file.keys()
        except Exception as error:
            raise _corrupt_safetensors(path, f"safetensors refuses it ({error})") from error
        return
    raise _corrupt_safetensors(path, problem)


def _corrupt_safetensors(path: Path, problem: str) -> CorruptSafetensorsError:
    return CorruptSafetensorsError(
        f"{path}: truncated or corrupt safetensors file: {problem}. Download it again, or save the model again."
    )


def safetensors_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with the layout of the safetensors file `path`, or None if the layout is sound."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            prefix = file.read(8)
            if size == 0:
                return "the file is empty (0 bytes)"
            if len(prefix) < 8:
                return f"the file holds {size} bytes, fewer than the 8 that give the header's length (cut short)"
            header_length = int.from_bytes(prefix, "little")
            if header_length > size - 8:
                return (
                    f"the header's length prefix says {header_length} bytes but only {size - 8} follow it (the file "
                    "was cut inside its header, or the length prefix is corrupt)"
                )
            if header_length > _MAX_SAFETENSORS_HEADER:
                return f"the header's length prefix says {header_length} bytes, beyond safetensors' limit (corrupt)"
            raw_header = file.read(header_length)
    except OSError as error:
        return f"it cannot be read ({error})"
    try:
        header = json.loads(raw_header.decode("utf-8"))
    except ValueError as error:  # UnicodeDecodeError is a ValueError
        return f"its header is not valid JSON ({error}): a corrupt header or a wrong length prefix"
    if not isinstance(header, dict):
        return f"its header is a JSON {type(header).__name__}, not the table of tensors"
    data_end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"the header's entry for {name!r} has no valid data_offsets (corrupt header)"
        data_end = max(data_end, offsets[1])
    data_size = size - 8 - header_length
    if data_size < data_end:
        return (
            f"the header describes {data_end} bytes of tensor data but the file holds only {data_size} (cut short: "
            "an interrupted download or save)"
        )
    if data_size > data_end:
        return f"{data_size - data_end} bytes follow the tensor data that the header describes (corrupt)"
    return None


@dataclass(frozen=True)
class TorchLoadProblem:
    """What an exception of `torch.load(..., weights_only=True)` means. `refused`: the file asked for something
    outside torch's allow-list (a Python global, or data that is not a torch checkpoint), rather than being damaged."""

    refused: bool
    text: str


def torch_load_problem(error: BaseException) -> TorchLoadProblem:
    """Describe an exception of `torch.load(path, weights_only=True)`, without the path.

    torch's own message opens with advice to retry with `weights_only=False`; that advice is dropped, never passed on.
    """
    text = str(error)
    refused = re.search(r"GLOBAL ([\w.]+)", text)
    if refused:
        return TorchLoadProblem(
            True,
            f"refused: the file asks for the Python global {refused.group(1)!r}, which a weights file never needs "
            "(it could run code on loading; a file naming it is corrupt or malicious). Nothing in it was run: only "
            "tensors are read, with torch.load(weights_only=True). Use a model.safetensors from a source you trust",
        )
    if "Unsupported operand" in text or "Unsupported class" in text:
        detail = next((line.strip() for line in text.splitlines() if "Unsupported" in line), "")
        return TorchLoadProblem(
            True,
            f"refused: not a PyTorch weights file, torch's weights-only loader does not accept its content "
            f"({detail}); nothing in it was run. Use a model.safetensors from a source you trust",
        )
    lines = [line.strip() for line in text.splitlines() if line.strip() and "weights_only" not in line]
    return TorchLoadProblem(False, f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__)


def check_torch_file(path: str | os.PathLike[str]) -> None:
    """Raise `CheckpointError` naming `path` unless `torch.load(path, weights_only=True)` gives a dict of tensors."""
    import torch

    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            magic = file.read(4)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read the weights file ({error})") from error
    if size == 0:
        raise CheckpointError(f"{path}: truncated or corrupt PyTorch weights file: the file is empty (0 bytes)")
    if magic == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path}: truncated or corrupt PyTorch weights file: a zip archive (torch.save's format) whose end is "
            "missing (cut short: an interrupted download or save). Download it again, or save the model again"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        problem = torch_load_problem(error)
        if problem.refused:
            raise RefusedPickleError(f"{path}: {problem.text}") from error
        raise CheckpointError(
            f"{path}: truncated or corrupt PyTorch weights file ({problem.text}). Download it again, or save the "
            "model again"
        ) from error
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a dict of tensors (a state dict)")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor")


def check_weight_file(path: str | os.PathLike[str]) -> None:
    """`check_safetensors_file` or `check_torch_file`, by the file's name."""
    if str(path).endswith(".safetensors"):
        check_safetensors_file(path)
    else:
        check_torch_file(path)


def weight_files(
    folder: str | os.PathLike[str],
    *,
    variant: str | None = None,
    use_safetensors: bool | None = None,
    strict: bool = False,
) -> list[Path]:
    """The weight files transformers reads from `folder`: the first of `WEIGHT_NAMES` present (safetensors skipped if
    `use_safetensors` is False), an index expanded to the shards it names. Empty if there is none.

    With `strict`, an unreadable index or a shard it names that is missing raises `CheckpointError`; otherwise those
    are left out.
    """
    folder = Path(folder)
    for name in WEIGHT_NAMES:
        if use_safetensors is False and "safetensors" in name:
            continue
        if variant:  # as transformers names them: before the last extension (model.safetensors.index.fp16.json)
            stem, _, extension = name.rpartition(".")
            name = f"{stem}.{variant}.{extension}"
        path = folder / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
            if not all(isinstance(shard, str) for shard in shards):
                raise TypeError("a shard name is not a string")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            if not strict:
                return []
            raise ShardIndexError(
                f"{path}: not a readable shard index ({type(error).__name__}: {error}); it must be JSON with a "
                '"weight_map" of parameter names to shard files. Download it again, or save the model again'
            ) from error
        # An index names files of its own folder only: a path elsewhere is refused like a missing shard.
        missing = [shard for shard in shards if Path(shard).name != shard or not (folder / shard).is_file()]
        if missing and strict:
            raise MissingShardError(
                f"{path}: names shard files that are not in {folder}: {_listing(missing)}. The download or copy is "
                "incomplete"
            )
        return [folder / shard for shard in shards if shard not in missing]
    return []


# ---------------------------------------------------------------------------------------------------------------------
# from_pretrained


def load_checked(load: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`load(*args, **kwargs)` (transformers' `from_pretrained`) with the checks of the module docstring.

    Returns what `from_pretrained` returns: the model, or `(model, loading_info)` with `output_loading_info=True`.
    Raises `CheckpointError` (an `OSError`) naming the path, file or parameters.
    """
    source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
    subfolder = kwargs.get("subfolder") or ""
    if source is not None and kwargs.get("state_dict") is None and not kwargs.get("gguf_file"):
        _check_source(source, subfolder=subfolder, kwargs=kwargs)
    wants_info = bool(kwargs.pop("output_loading_info", False))
    accept_mismatch = bool(kwargs.pop("ignore_mismatched_sizes", False))
    try:
        # Mismatched shapes are let through here so that the loading info lists them; they are refused below, with
        # the shapes in the message (transformers' own error only points at a log).
        model, info = load(*args, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except CheckpointError:
        raise
    except Exception as error:
        bad_file = _diagnose_weight_files(source, subfolder=subfolder, kwargs=kwargs)
        if bad_file is not None:
            raise bad_file from error
        raise
    check_loaded_weights(model, info, source=source, ignore_mismatched_sizes=accept_mismatch)
    return (model, info) if wants_info else model


def hub_snapshot_of(folder: Path) -> tuple[str, str] | None:
    """("org/name", commit) for a snapshot folder of the Hub cache (`models--org--name/snapshots/<commit>`), else
    None."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/"), parts[-1]
    return None


def is_hub_repo_id(name: str) -> bool:
    """Whether `name` is a valid Hub repo id (`name` or `org/name`), by huggingface_hub's own rules."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def did_you_mean(close: Sequence[str], before: str = "; ", after: str = "") -> str:
    """ "did you mean a or b?" for the close names of a near miss, between `before` and `after`; "" for none."""
    return f"{before}did you mean {' or '.join(close)}?{after}" if close else ""


def close_local_paths(name: str) -> list[str]:
    """Existing paths spelt like `name`, which does not exist: its nearest existing folder's entries closest to the
    first missing part (`runs/mrun` -> `runs/myrun`), as typed; [] where none is close."""
    parts = Path(name).parts
    depth = len(parts) - 1
    while depth > 0 and not Path(*parts[:depth]).expanduser().is_dir():
        depth -= 1
    folder = Path(*parts[:depth]).expanduser() if depth else Path(".")
    try:
        entries = sorted(entry.name for entry in folder.iterdir())
    except OSError:
        return []
    matches = difflib.get_close_matches(parts[depth] if parts else name, entries, n=3, cutoff=0.6)
    return [os.path.join(*parts[:depth], match) for match in matches]


def local_path_problem(name: str) -> str | None:
    """ "no such folder ..." where `name` does not exist and clearly is a local path, not a Hub id: it starts with
    `./`, `../`, `~` or `/`, is not a valid repo id, or its first part is a folder here (`runs/mrun` beside `runs/`,
    a mistyped `runs/myrun`, which the Hub would otherwise be asked for, retries included). None: it exists, or may be
    a Hub id."""
    if Path(name).expanduser().exists():
        return None
    parts = Path(name).parts
    marked = name.startswith(("./", "../", "~", "/", ".\\", "..\\")) or PureWindowsPath(name).is_absolute()
    if marked or name in (".", "..") or not is_hub_repo_id(name):
        first_is_folder = False
    elif len(parts) > 1 and Path(parts[0]).is_dir():  # an owner/name that is also a path into a folder here
        first_is_folder = True
    else:
        return None
    why = f" ({parts[0]} is a folder here, so it is not looked up on the Hub)" if first_is_folder else ""
    return f"no such folder{why}{did_you_mean(close_local_paths(name))}"


def _check_source(source: Any, *, subfolder: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse, before transformers tries, what it would report confusingly (or not at all)."""
    path = Path(os.fspath(source)).expanduser()
    has_config = kwargs.get("config") is not None  # a config object, or where to read one
    if path.is_dir():
        folder = path / subfolder
        if not folder.is_dir():
            raise CheckpointError(f"{path}: has no subfolder {subfolder!r}")
        if not has_config:
            _check_config_file(folder)
        # A corrupt index or a missing shard, named here: transformers reports a bare JSONDecodeError or file name.
        weight_files(folder, variant=kwargs.get("variant"), use_safetensors=kwargs.get("use_safetensors"), strict=True)
        return
    if path.is_file():
        if not has_config:
            raise CheckpointError(
                f"{path}: is a file; give the folder that holds config.json and the weights (model.safetensors)"
            )
        return
    name = os.fspath(source)
    if not is_hub_repo_id(name):
        raise CheckpointError(f"{name}: no such folder (and not a Hub repo id of the form org/name)")
    if _offline(kwargs):
        from huggingface_hub import constants, try_to_load_from_cache

        config_name = f"{subfolder}/config.json" if subfolder else "config.json"
        cache_dir = kwargs.get("cache_dir") or constants.HF_HUB_CACHE
        cached = try_to_load_from_cache(name, config_name, cache_dir=cache_dir, revision=kwargs.get("revision"))
        if not isinstance(cached, str):
            raise CheckpointError(
                f"{name}: not a local folder, and not in the Hugging Face cache ({cache_dir}) while offline "
                "(HF_HUB_OFFLINE=1 or local_files_only=True): download it once with network access, or give the "
                "path of a local copy"
            )


def _check_config_file(folder: Path) -> None:
    """`folder` must hold a config.json that is a JSON object (for invalid JSON, transformers names the file)."""
    path = folder / "config.json"
    if not path.is_file():
        found = sorted(entry.name for entry in folder.iterdir())[:_LISTED]
        raise CheckpointError(
            f"{folder}: no config.json, so not a saved model folder (save_pretrained writes config.json and "
            f"model.safetensors; found {found or 'nothing'})"
        )
    try:
        config = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(config).__name__}, not an object of settings (corrupt)")


def _offline(kwargs: Mapping[str, Any]) -> bool:
    if kwargs.get("local_files_only"):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _diagnose_weight_files(source: Any, *, subfolder: str, kwargs: Mapping[str, Any]) -> CheckpointError | None:
    """After loading failed: the error for the first weight file that is broken, or None if none is."""
    if source is None:
        return None
    path = Path(os.fspath(source)).expanduser()
    if path.is_dir():
        files = weight_files(
            path / subfolder, variant=kwargs.get("variant"), use_safetensors=kwargs.get("use_safetensors")
        )
    elif path.is_file():
        files = [path]
    else:
        files = _cached_weight_files(os.fspath(source), subfolder=subfolder, kwargs=kwargs)
    for file in files:
        try:
            check_weight_file(file)
        except CheckpointError as error:
            return error
    return None


def _cached_weight_files(repo_id: str, *, subfolder: str, kwargs: Mapping[str, Any]) -> list[Path]:
    """The weight files of a Hub repo id that the local cache holds (what transformers just tried to read)."""
    if not is_hub_repo_id(repo_id):
        return []
    from huggingface_hub import try_to_load_from_cache

    for name in WEIGHT_NAMES:
        cached = try_to_load_from_cache(
            repo_id,
            f"{subfolder}/{name}" if subfolder else name,
            cache_dir=kwargs.get("cache_dir"),
            revision=kwargs.get("revision"),
        )
        if isinstance(cached, str):
            return weight_files(Path(cached).parent) if name.endswith(".index.json") else [Path(cached)]
    return []


def check_loaded_weights(
    model: Any, info: Mapping[str, Any], *, source: Any, ignore_mismatched_sizes: bool = False
) -> None:
    """Raise `CheckpointMismatchError` unless the checkpoint filled `model` (see the module docstring).

    `info` is transformers' loading info (`missing_keys`, `unexpected_keys`, `mismatched_keys` as
    `(name, checkpoint shape, model shape)`).
    """
    hint = (
        "config.json does not describe these weights (check n_layer, d_model, n_head, d_head, d_inner, d_embed, "
        "vocab_size, cutoffs, div_val, untie_r, tie_projs against the checkpoint's)"
    )
    mismatched = sorted(info.get("mismatched_keys") or ())
    if mismatched and not ignore_mismatched_sizes:
        shapes = [
            f"{name}: {list(checkpoint_shape)} in the checkpoint, {list(model_shape)} in the model"
            for name, checkpoint_shape, model_shape in mismatched
        ]
        if all(name.split(".")[0] in FRESH_HEADS.get(type(model).__name__, ()) for name, _, _ in mismatched):
            # only the classification head: another number of labels than the checkpoint's
            hint = (
                f"The classification head has {getattr(model.config, 'num_labels', '?')} labels (num_labels, given to "
                "from_pretrained or in config.json), the checkpoint's another number"
            )
        raise CheckpointMismatchError(
            f"{source}: weights whose shapes do not fit the model ({len(shapes)}): {_listing(shapes)}. {hint}; "
            "pass ignore_mismatched_sizes=True only to initialise them anew on purpose"
        )
    fresh = FRESH_HEADS.get(type(model).__name__, ())
    missing = [name for name in info.get("missing_keys") or () if name.split(".")[0] not in fresh]
    if missing:
        untied = ""
        if all(".output_layers." in name for name in missing) and not getattr(model.config, "tie_word_embeddings", 1):
            # transformers 4.x read a legacy config's `tie_weight: false` and tied the weights all the same, so its
            # checkpoints hold no output layers
            untied = (
                " The output layers are the ones missing and the config unties them (tie_word_embeddings false, or "
                "a v4 config's tie_weight false, which transformers 4.x ignored): pass tie_word_embeddings=True to "
                "from_pretrained, or set it in config.json, to tie them to the input embedding as v4 did."
            )
        raise CheckpointMismatchError(
            f"{source}: the checkpoint lacks weights the model needs ({len(missing)}), which would be left random: "
            f"{_listing(missing)}. The weights file is incomplete, belongs to another model (a TxlModel checkpoint "
            f"has no language-modelling head), or {hint}.{untied}"
        )
    misplaced = [name for name in info.get("unexpected_keys") or () if _inside_model(model, name)]
    if misplaced:
        raise CheckpointMismatchError(
            f"{source}: the checkpoint holds weights that have no place in the model ({len(misplaced)}): "
            f"{_listing(misplaced)}. {hint}"
        )


def _inside_model(model: Any, key: str) -> bool:
    """Whether checkpoint key `key` names a place inside `model`'s own modules (a layer or cluster too many), as
    opposed to a module the model does not have at all (another class's head, dropped as transformers does)."""
    first, _, rest = key.partition(".")
    children = _child_names(model)
    prefix = getattr(model, "base_model_prefix", "")
    if first == prefix:  # "transformer.layers.3...": look inside the base model (or, headless, inside the model)
        base = getattr(model, prefix, model)
        return rest.partition(".")[0] in _child_names(base)
    return first in children


def _child_names(module: Any) -> set[str]:
    names = {name for name, _ in module.named_children()}
    names |= {name for name, _ in module.named_parameters(recurse=False)}
    return names | {name for name, _ in module.named_buffers(recurse=False)}


def _listing(names: Sequence[str]) -> str:
    shown = sorted(names)[:_LISTED]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f", ... ({more} more)" if more else "")
