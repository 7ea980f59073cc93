"""Converting a transformers-v4 Transformer-XL checkpoint (`model_type: "transfo-xl"`) into a `txl` folder.

Convert = load through the package, save, verify:

1. SOURCE is a v4 folder, or a Hub repo id fetched with `huggingface_hub.snapshot_download` (with `HF_HUB_OFFLINE=1`:
   from the local cache only). Its config.json must be a v4 Transformer-XL one.
2. `AutoModelForCausalLM.from_pretrained(SOURCE)` loads it as this package loads every v4 folder: v4 parameter names
   renamed on load by transformers' conversion mapping (`modeling_txl.LEGACY_PARAMETER_RENAMES`), weights read with
   safetensors or `torch.load(weights_only=True)`, broken or ill-fitting files refused by `transfoxl.checkpoints`.
   Its `save_pretrained` writes the `txl` format: `TxlConfig`, `txl` parameter names, the code files.
3. The v4 vocabulary (`vocab.pkl` / `vocab.bin`, if any) becomes `tokenizer.json` through the allow-list reader of
   `transfoxl.tokenization.legacy_vocab`; nothing is ever unpickled with `pickle.load`.
4. Verification (default on): SOURCE loaded again and the converted folder, both with `memory_init="zeros"`, over N
   segments of seeded random token ids carrying memory: log-probabilities and memories must agree within 1e-6.
5. The model card (`transfoxl.model_card`) says where the weights come from, what changed and how they were checked.

`convert_vocabulary` (txl-convert-vocab) converts a vocabulary alone: step 3 into a folder of the user's.

SOURCE is only read. OUT is built in a hidden staging folder next to it and renamed into place once complete and
verified, so OUT is either absent, its old self, or the whole new folder; `overwrite` replaces only an earlier
conversion.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import torch
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.dynamic_module_utils import get_relative_import_files

from . import __version__, configuration_txl, modeling_txl
from .checkpoints import (
    WEIGHT_NAMES,
    CheckpointError,
    MissingShardError,
    RefusedPickleError,
    ShardIndexError,
    hub_snapshot_of,
    local_path_problem,
    weight_files,
)
from .configuration_txl import TransfoXLConfig, TxlConfig
from .files import folder_problem, fsync_dir, fsync_tree, write_json_atomically, write_text_atomically
from .model_card import CONVERSION_RECORD, card_for_conversion, conversion_record, declared_license
from .modeling_txl import TxlForCausalLM, _memory_of
from .tokenization import LegacyVocabError, save_atomically, tokenizer_from_legacy_vocab
from .tokenization.legacy_vocab import find_legacy_vocab_file

__all__ = [
    "ConversionError",
    "Result",
    "Source",
    "Verification",
    "VerificationFailed",
    "convert",
    "convert_vocabulary",
]

# What a Hub repo id fetches: the files a v4 checkpoint may hold, and the source card (for its license).
SNAPSHOT_PATTERNS = [
    "config.json",
    "*.bin",
    "*.safetensors",
    "*.index.json",
    "vocab.*",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "README.md",
]
TOLERANCE = 1e-6  # largest |difference| accepted by the verification (identical weights normally give 0)
VERIFY_BATCH, VERIFY_LENGTH, VERIFY_SEED = 2, 16, 0
# How `transfoxl.checkpoints` opens the message about a damaged file; this module says "cannot be read" instead.
_DAMAGED = re.compile(r"^truncated or corrupt [\w ]+? file:? ")


class ConversionError(Exception):
    """A problem with SOURCE or OUT that the user has to fix; the message names the file and the problem."""


class VerificationFailed(Exception):
    """The converted model does not reproduce the legacy one."""


@dataclass
class Source:
    """A resolved SOURCE: the folder to read, and how to name it in the card (never an absolute local path)."""

    folder: Path
    name: str  # "org/name" or the folder's name
    revision: str | None = None  # the commit of a Hub snapshot

    def describe(self) -> str:
        revision = f" (revision `{self.revision}`)" if self.revision else ""
        if "/" in self.name:
            return f"[`{self.name}`](https://huggingface.co/{self.name}){revision}"
        return f"a local folder named `{self.name}`{revision}"


@dataclass
class Verification:
    """The largest differences seen between the legacy and the converted model over `segments` segments."""

    segments: int
    batch: int
    segment_length: int
    seed: int
    max_logprob_diff: float
    max_memory_diff: float

    @property
    def max_diff(self) -> float:
        return max(self.max_logprob_diff, self.max_memory_diff)

    @property
    def passed(self) -> bool:
        return self.max_diff <= TOLERANCE

    def summary(self) -> str:
        return (
            f"{self.segments} segments of {self.batch} x {self.segment_length} random token ids (seed {self.seed}), "
            f"memory carried: max |difference| of log-probabilities {self.max_logprob_diff:.3g}, of memories "
            f"{self.max_memory_diff:.3g} (tolerance {TOLERANCE:g})"
        )


@dataclass
class Result:
    """What `convert` wrote: the files in OUT, the verification (None with --no-verify), notes for the user."""

    files: list[str]
    verification: Verification | None
    notes: list[str]


# ---------------------------------------------------------------------------------------------------------------------
# Reading SOURCE


def resolve_source(source: str, revision: str | None = None) -> Source:
    """A local folder as is; otherwise a Hub repo id, fetched (or found in the cache) with `snapshot_download`."""
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConversionError(f"SOURCE {source}: is a file; give the checkpoint's folder (with config.json)")
        if revision is not None:
            raise ConversionError(f"SOURCE {source} is a local folder: --revision {revision} applies to a Hub repo id")
        return Source(path, *_cache_name(path))
    if problem := local_path_problem(source):  # a mistyped local folder: said now, not after the Hub's retries
        raise ConversionError(f"SOURCE {source}: {problem}")
    if not is_repo_id(source):
        raise ConversionError(f"SOURCE {source}: no such folder (and not a Hub repo id of the form org/name)")
    try:
        folder = Path(huggingface_hub.snapshot_download(source, revision=revision, allow_patterns=SNAPSHOT_PATTERNS))
    except LocalEntryNotFoundError as error:
        cached = "the Hub repository" if revision is None else f"revision {revision} of the Hub repository"
        raise ConversionError(
            f"SOURCE {source}: not a local folder, and {cached} is not in the local cache while the Hub "
            f"cannot be reached (offline mode: HF_HUB_OFFLINE=1, or no network). Download it once online, or give "
            f"the path of a local copy. ({error})"
        ) from error
    except GatedRepoError as error:  # a subclass of RepositoryNotFoundError: the repository exists
        raise ConversionError(
            f"SOURCE {source}: the Hub repository is gated: accept its conditions on its page and log in "
            f"(`hf auth login`) first ({error})"
        ) from error
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:
        raise ConversionError(f"SOURCE {source}: no such Hub repository or revision ({error})") from error
    except Exception as error:  # network, authentication, disk: say which, do not hide it
        message = f"SOURCE {source}: could not fetch it from the Hub ({type(error).__name__}: {error})"
        raise ConversionError(message) from error
    name, commit = _cache_name(folder)
    return Source(folder, source if name == folder.name else name, commit)


def is_repo_id(name: str) -> bool:
    """`org/name`, as huggingface_hub accepts a repository id."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return "/" in name


def _cache_name(folder: Path) -> tuple[str, str | None]:
    """("org/name", commit) for a folder of the Hub cache, else (its name, None)."""
    return hub_snapshot_of(folder) or (folder.resolve().name, None)


def read_legacy_config(folder: Path) -> TransfoXLConfig:
    """The v4 config of `folder`; refuses a folder that is not a v4 Transformer-XL checkpoint, saying what it is."""
    path = folder / "config.json"
    if not path.is_file():
        raise ConversionError(f"SOURCE {folder.name}: no config.json; not a transformers checkpoint folder")
    try:
        config_dict = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConversionError(f"SOURCE {folder.name}/config.json: not readable JSON ({error})") from error
    model_type = config_dict.get("model_type") if isinstance(config_dict, dict) else None
    if model_type == TxlConfig.model_type:
        raise ConversionError(
            f"SOURCE {folder.name}: config.json already has model_type 'txl': it is a modern checkpoint, nothing to "
            "convert (load it with TxlForCausalLM.from_pretrained)"
        )
    if model_type != TransfoXLConfig.model_type:
        raise ConversionError(
            f"SOURCE {folder.name}: config.json has model_type {model_type!r}, not 'transfo-xl'; this converts "
            "transformers-v4 Transformer-XL checkpoints only"
        )
    try:
        return TransfoXLConfig.from_pretrained(folder)
    except (ValueError, TypeError) as error:
        raise ConversionError(f"SOURCE {folder.name}/config.json: {error}") from error


def find_weight_files(folder: Path) -> list[Path]:
    """The weight files transformers will read: the first of `WEIGHT_NAMES` present, an index expanded to its
    shards (named in the card)."""
    try:
        files = weight_files(folder, strict=True)
    except CheckpointError as error:
        raise ConversionError(f"SOURCE {folder.name}: {error}") from error
    if files:
        return files
    found = sorted(path.name for path in folder.iterdir() if path.suffix in (".h5", ".ckpt", ".msgpack", ".pt"))
    hint = f" (found {found}: TensorFlow / Flax / other formats are not read)" if found else ""
    raise ConversionError(f"SOURCE {folder.name}: no weights file, none of {', '.join(WEIGHT_NAMES)}{hint}")


def load_source_model(folder: Path, config: TransfoXLConfig) -> TxlForCausalLM:
    """The v4 checkpoint in `folder` loaded through the package (dtype kept), for saving in the `txl` format."""
    try:
        return AutoModelForCausalLM.from_pretrained(folder, config=config).eval()
    except CheckpointError as error:
        raise source_error(error, folder) from error


def source_error(error: CheckpointError, folder: Path) -> ConversionError:
    """`transfoxl.checkpoints`' error about SOURCE or one of its files, named relative to SOURCE (the card and the
    messages never show an absolute local path)."""
    named, _, detail = str(error).partition(": ")
    if Path(named).parent == folder:
        # A damaged weight file; one that is refused asked for code instead, and an index names its shards.
        if not isinstance(error, (RefusedPickleError, MissingShardError, ShardIndexError)):
            detail = "cannot be read (truncated or corrupt file?): " + _DAMAGED.sub("", detail)
        return ConversionError(f"SOURCE {folder.name}/{Path(named).name}: {detail}")
    return ConversionError(f"SOURCE {folder.name}: {detail if Path(named) == folder else error}")


def legacy_tokenizer(folder: Path, vocab_size: int) -> tuple[PreTrainedTokenizerFast | None, str]:
    """The converted tokenizer of `folder`'s vocabulary (None without one), and a sentence about it for the user."""
    vocab_file = find_legacy_vocab_file(folder)
    if vocab_file is None:
        return None, "SOURCE has no vocabulary (vocab.pkl / vocab.bin): converted the model only, no tokenizer"
    try:
        tokenizer = tokenizer_from_legacy_vocab(folder)
    except LegacyVocabError as error:
        raise ConversionError(f"the vocabulary was refused: {error}") from error
    size = len(tokenizer)
    if size > vocab_size:
        raise ConversionError(
            f"{vocab_file.name} holds {size} tokens but the model has vocab_size={vocab_size}: ids beyond it would "
            "be refused by the model; this vocabulary does not belong to these weights"
        )
    note = f"tokenizer converted from {vocab_file.name} ({size} tokens, v4's ids)"
    if size < vocab_size:
        note += f"; the model has {vocab_size - size} ids that no token maps to"
    return tokenizer, note


# ---------------------------------------------------------------------------------------------------------------------
# Verifying


@torch.no_grad()
def verify(source: Path, converted: Path, *, segments: int, seed: int = VERIFY_SEED) -> Verification:
    """Compare SOURCE loaded as a v4 folder with the converted folder, both with `memory_init="zeros"`."""
    try:  # from_pretrained refuses missing or mismatched weights (CheckpointError) instead of initialising them
        legacy = TxlForCausalLM.from_pretrained(source, memory_init="zeros").eval()
    except CheckpointError as error:
        raise VerificationFailed(
            f"loading SOURCE as a v4 folder failed, so there is no trustworthy reference to compare with: {error}"
        ) from error
    # The converted model's own memory_init may be "empty"; the comparison with v4 needs v4's zeros on both sides.
    model = TxlForCausalLM.from_pretrained(converted, memory_init="zeros").eval()
    generator = torch.Generator().manual_seed(seed)
    logprob_diff = memory_diff = 0.0
    legacy_memory = memory = None
    for _ in tqdm(range(segments), desc="verifying", unit="segment", leave=False):
        ids = torch.randint(0, model.config.vocab_size, (VERIFY_BATCH, VERIFY_LENGTH), generator=generator)
        expected = legacy(ids, past_key_values=legacy_memory)
        actual = model(ids, past_key_values=memory)
        legacy_memory, memory = _memory_of(expected), _memory_of(actual)
        logprob_diff = max(logprob_diff, _max_abs_diff(actual.logits, expected.logits))
        for layer, expected_layer in zip(memory.to_legacy() or [], legacy_memory.to_legacy() or [], strict=True):
            memory_diff = max(memory_diff, _max_abs_diff(layer, expected_layer))
    return Verification(segments, VERIFY_BATCH, VERIFY_LENGTH, seed, logprob_diff, memory_diff)


def _max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if actual.shape != expected.shape:
        return math.inf
    diff = float((actual.double() - expected.double()).abs().max()) if actual.numel() else 0.0
    return diff if math.isfinite(diff) else math.inf  # NaN must fail, not compare as "not greater"


# ---------------------------------------------------------------------------------------------------------------------
# Writing OUT


def converted_files() -> set[str]:
    """The names of what a conversion writes into OUT: the model, its code files, the tokenizer, the card."""
    code = {
        Path(path).name
        for module in (configuration_txl, modeling_txl)
        for path in [module.__file__, *get_relative_import_files(module.__file__)]
    }
    model = {"config.json", "generation_config.json", "model.safetensors", "README.md", CONVERSION_RECORD}
    model.add("hub-dry-run")  # what `publish.py OUT --dry-run` writes there by default: a conversion's copy
    return model | code | {"tokenizer.json", "tokenizer_config.json"}


def check_out(out: Path, *, overwrite: bool) -> None:
    """Refuse an OUT that is a file or a link, or a non-empty folder unless `overwrite` and it holds an earlier
    conversion and nothing else (--overwrite replaces the whole folder: it must never delete a user's other files)."""
    if out.is_symlink():
        raise ConversionError(f"OUT {out}: is a symbolic link; give the folder itself")
    if problem := folder_problem(out):  # OUT a file, or a folder to be made inside a file
        raise ConversionError(f"OUT {out}: {problem}")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ConversionError(f"OUT {out}: exists and is not empty; pass --overwrite to replace it")
    foreign = sorted(path.name for path in out.iterdir() if path.name not in converted_files())
    try:
        model_type = json.loads((out / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if foreign or model_type != "txl":
        what = f"files this script does not write: {', '.join(foreign)}" if foreign else "no converted config.json"
        raise ConversionError(
            f"OUT {out}: --overwrite replaces only an earlier conversion, and this folder holds {what}; "
            "choose another OUT"
        )


def check_apart(source: Path, out: Path) -> None:
    """Refuse an OUT that is SOURCE, lies inside it, or contains it (replacing OUT must never touch SOURCE)."""
    source_resolved, out_resolved = source.resolve(), out.resolve()
    if out_resolved == source_resolved or source_resolved in out_resolved.parents:
        raise ConversionError(f"OUT {out}: is SOURCE or inside it; choose a folder outside SOURCE (never modified)")
    if out_resolved in source_resolved.parents:
        raise ConversionError(f"OUT {out}: contains SOURCE; choose a folder that does not hold the checkpoint")


def _owner_alive(folder: Path) -> bool:
    """Whether the process whose id a staging folder's name holds (`.OUT.converting-PID-TOKEN`) still runs; True
    where the name holds none (an older version's) or the id cannot be checked: such a folder is left alone."""
    found = re.fullmatch(r"\.(?:.*)\.(?:converting|replaced)-(\d+)-[0-9a-f]+", folder.name)
    if found is None:
        return True
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process (PermissionError), an id out of range
        return True
    return True


def clear_leftovers(out: Path) -> list[str]:
    """Remove what conversions into OUT that were killed (SIGKILL, a power cut) left beside it: their staging folders
    (a whole model each). An OUT moved aside for --overwrite whose process died before the new one was moved in is
    kept, and named in the returned notes (it holds the earlier conversion)."""
    notes = []
    for path in sorted(out.parent.glob(f".{glob.escape(out.name)}.*-*")):
        if not path.is_dir() or path.is_symlink() or _owner_alive(path):
            continue
        if ".converting-" in path.name:
            shutil.rmtree(path, ignore_errors=True)
        elif ".replaced-" in path.name:
            notes.append(
                f"note: {path} holds what {out} held before a conversion that was killed while replacing it; "
                "move it back or delete it"
            )
    return notes


def move_into_place(staging: Path, out: Path) -> None:
    """Move the complete `staging` folder to `out` by renames; an old `out` is moved aside first, then deleted."""
    fsync_tree(staging)
    previous = None
    if out.is_dir():
        if any(out.iterdir()):  # --overwrite (checked before): keep the old folder until the new one is in place
            previous = out.parent / f".{out.name}.replaced-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(out, previous)
        else:
            out.rmdir()
    try:
        os.rename(staging, out)
    except BaseException:
        if previous is not None:
            os.rename(previous, out)
        raise
    fsync_dir(out.parent)
    if previous is not None:
        shutil.rmtree(previous)


def convert(
    source_arg: str,
    out: Path,
    *,
    memory_init: str = "zeros",
    verify_segments: int | None = 3,
    overwrite: bool = False,
    revision: str | None = None,
) -> Result:
    """Convert SOURCE into OUT (see the module docstring); `verify_segments=None` skips the verification.

    Raises `ConversionError` for a problem with the input or output (nothing written), `VerificationFailed` when the
    converted model does not reproduce the legacy one (nothing written either).
    """
    if out.name in ("", ".", "..") or out.resolve() == Path.cwd() or out.resolve() in Path.cwd().parents:
        raise ConversionError(f"OUT {out}: give a folder by name (the output replaces it as a whole)")
    if Path(source_arg).expanduser().is_dir():  # "OUT is SOURCE" says more than "OUT is not empty"
        check_apart(Path(source_arg).expanduser(), out)
    check_out(out, overwrite=overwrite)  # before a download
    source = resolve_source(source_arg, revision)
    check_apart(source.folder, out)
    legacy_config = read_legacy_config(source.folder)
    weights = find_weight_files(source.folder)
    tokenizer, tokenizer_note = legacy_tokenizer(source.folder, legacy_config.vocab_size)  # fails fast on a bad vocab

    legacy_config.memory_init = memory_init
    model = load_source_model(source.folder, legacy_config)
    parameters = model.num_parameters()

    out.parent.mkdir(parents=True, exist_ok=True)
    leftovers = clear_leftovers(out)
    # Next to OUT (same file system: the final rename is atomic); mkdir gives it the umask's mode, which OUT keeps.
    # Its name holds this process's id: a later conversion removes it if this one is killed (`clear_leftovers`).
    staging = out.parent / f".{out.name}.converting-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        model.save_pretrained(staging)  # the txl config, generation config, safetensors, and the code files
        del model
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        verification = None
        if verify_segments is not None:
            verification = verify(source.folder, staging, segments=verify_segments)
            if not verification.passed:
                raise VerificationFailed(f"the converted model differs from the legacy one: {verification.summary()}")
        record = conversion_record(
            title=source.name.split("/")[-1],
            source=source.describe(),
            parameters=parameters,
            weight_files=[path.name for path in weights],
            tokenizer_note=tokenizer_note if tokenizer is not None else None,
            verification=verification.summary() if verification is not None else None,
            declared=declared_license(source.folder),
            source_repo_id=source.name if "/" in source.name else None,
            version=__version__,
        )
        write_json_atomically(staging / CONVERSION_RECORD, record)  # publish.py renders the card again from it
        card = card_for_conversion(
            record,
            repo_id=out.name,
            config=TxlConfig.from_legacy(legacy_config).to_dict(),
            code_files=sorted(path.name for path in staging.glob("*.py")),
            license_id=record["source_license"] if isinstance(record["source_license"], str) else None,
            local=True,
        )
        write_text_atomically(staging / "README.md", str(card))
        file_mode = staging.stat().st_mode & 0o666  # transformers writes model.safetensors as 0600
        for path in staging.iterdir():
            os.chmod(path, file_mode)
        files = sorted(path.name for path in staging.iterdir())
        move_into_place(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Result(files, verification, [*leftovers, tokenizer_note])


def _model_vocab_size(folder: Path) -> int | None:
    """`vocab_size` of the model whose config.json is in `folder` (None: no model there, or no size)."""
    try:
        value = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def convert_vocabulary(
    source: Path, out: Path, *, lower_case: bool | None = None, overwrite: bool = False
) -> list[Path]:
    """Write the converted tokenizer of `source` (a v4 folder, or its vocab.pkl / vocab.bin) into `out`, each file
    moved into place by a rename; return the files written. The input is never modified.

    Raises `ValueError` if `out` is the input's folder, or (unless `overwrite`) already holds a file it would write;
    `LegacyVocabError` for an unreadable or unsafe vocabulary.
    """
    if not source.exists():
        raise LegacyVocabError(f"{source}: no such file or folder")
    source_folder = source if source.is_dir() else source.parent
    vocab_file = find_legacy_vocab_file(source) if source.is_dir() else source
    if vocab_file is None or not vocab_file.is_file():
        raise LegacyVocabError(f"{source}: no vocab.pkl or vocab.bin found")
    if problem := folder_problem(out):
        raise ValueError(f"OUT {out}: {problem}")
    if out.resolve() == source_folder.resolve():
        raise ValueError(f"OUT {out}: is the input's folder; choose another folder (the input is never modified)")
    overrides = {} if lower_case is None else {"lower_case": lower_case}
    tokenizer = tokenizer_from_legacy_vocab(source, **overrides)
    # The model this tokenizer goes with (OUT's, else the source folder's own) must have an id for every token.
    for role, folder in (("OUT", out), ("SOURCE", source_folder)):
        model_vocab_size = _model_vocab_size(folder)
        if model_vocab_size is not None and len(tokenizer) > model_vocab_size:
            raise ValueError(
                f"{role} {folder} holds a model of vocab_size {model_vocab_size} and this vocabulary has "
                f"{len(tokenizer)} tokens: ids past the model's would fail in it. Convert the vocabulary the model "
                "was trained with."
            )
    try:
        return save_atomically(tokenizer, out, overwrite=overwrite)
    except FileExistsError as error:
        raise ValueError(f"OUT {out}: {error}") from error
