"""Convert a transformers-v4 Transformer-XL checkpoint (`model_type: "transfo-xl"`) into a modern `txl` folder.

SOURCE is a v4 folder (a Hub snapshot or a local copy) holding `config.json`, the weights (`model.safetensors`,
`pytorch_model.bin`, or a sharded index of either) and optionally the vocabulary (`vocab.pkl` / `vocab.bin`), or a
Hub repo id, fetched with `huggingface_hub.snapshot_download` (with `HF_HUB_OFFLINE=1`: from the local cache only).
OUT receives a folder that plain transformers v5 loads with `trust_remote_code=True`, and this package natively:

- `config.json` (`model_type: "txl"`, same hyper-parameters, `memory_init` "zeros" by default so that outputs equal
  v4's), `generation_config.json`;
- `model.safetensors` with this package's parameter names (`LEGACY_PARAMETER_RENAMES`);
- `configuration_txl.py`, `modeling_txl.py` (the code `trust_remote_code=True` runs);
- `tokenizer.json`, `tokenizer_config.json` (when SOURCE has a vocabulary): a plain `tokenizers` word-level tokenizer
  with v4's ids;
- `README.md`, a model card saying where the weights come from, what changed and how the conversion was verified.

Safety: weights are read with safetensors or `torch.load(weights_only=True)` (tensors only), the vocabulary through
the allow-list reader of `transfoxl.tokenization.legacy_vocab`; nothing is ever unpickled with `pickle.load`. SOURCE
is only read. OUT is built in a hidden staging folder next to it and renamed into place once complete and verified,
so OUT is either absent, its old self, or the whole new folder.

Verification (default on): the checkpoint is loaded from SOURCE the way this package loads v4 folders (v4 names renamed
on load by transformers, `memory_init="zeros"`) and compared with the converted folder over N segments of seeded random
token ids carrying memory: log-probabilities and memories must agree within 1e-6 (they are normally identical).

    python scripts/convert.py path/to/transfo-xl-wt103 transfo-xl-wt103-txl
    HF_HUB_OFFLINE=1 python scripts/convert.py transfo-xl/transfo-xl-wt103 transfo-xl-wt103-txl
    python scripts/convert.py SOURCE OUT --memory-init empty --verify-segments 5 --overwrite
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import shutil
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import transfoxl
from transfoxl import TransfoXLConfig, TxlConfig, TxlForCausalLM
from transfoxl.checkpoints import WEIGHT_NAMES, CheckpointError, safetensors_problem, torch_load_problem, weight_files
from transfoxl.configuration_txl import MEMORY_INIT_CHOICES
from transfoxl.files import fsync_dir, fsync_tree, write_text_atomically
from transfoxl.modeling_txl import LEGACY_PARAMETER_RENAMES
from transfoxl.tokenization import LegacyVocabError, tokenizer_from_legacy_vocab
from transfoxl.tokenization.legacy_vocab import find_legacy_vocab_file

WEIGHT_FILES = WEIGHT_NAMES  # the order transformers prefers them in (safetensors first), single file before index
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
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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
        return Source(path, *_cache_name(path))
    if not REPO_ID.match(source):
        raise ConversionError(f"SOURCE {source}: no such folder (and not a Hub repo id of the form org/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = Path(snapshot_download(source, revision=revision, allow_patterns=SNAPSHOT_PATTERNS))
    except LocalEntryNotFoundError as error:
        raise ConversionError(
            f"SOURCE {source}: not a local folder, and the Hub repository is not in the local cache while the Hub "
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


def _cache_name(folder: Path) -> tuple[str, str | None]:
    """("org/name", commit) for a folder of the Hub cache (`models--org--name/snapshots/<commit>`), else its name."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/"), parts[-1]
    return folder.resolve().name, None


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
    """The weight files to read: the first of `WEIGHT_FILES` present, an index expanded to its shards."""
    try:
        files = weight_files(folder, strict=True)  # the order transformers reads them in
    except CheckpointError as error:
        raise ConversionError(f"SOURCE {folder.name}: {error}") from error
    if files:
        return files
    found = sorted(path.name for path in folder.iterdir() if path.suffix in (".h5", ".ckpt", ".msgpack", ".pt"))
    hint = f" (found {found}: TensorFlow / Flax / other formats are not read)" if found else ""
    raise ConversionError(f"SOURCE {folder.name}: no weights file, none of {', '.join(WEIGHT_FILES)}{hint}")


def read_state_dict(files: Sequence[Path]) -> dict[str, torch.Tensor]:
    """All tensors of `files`, read with safetensors or `torch.load(weights_only=True)`; never a full unpickling."""
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            if path.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(path, framework="pt") as file:
                    for key in tqdm(list(file.keys()), desc=f"reading {path.name}", unit="tensor", leave=False):
                        state[key] = file.get_tensor(key)
            else:
                # weights_only: torch's restricted unpickler (tensors and plain containers only). mmap works for the
                # zip format only (torch >= 1.6), not for the older one.
                loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
                if not isinstance(loaded, dict):
                    raise ValueError(f"holds a {type(loaded).__name__}, not a dict of tensors")
                for key, value in tqdm(loaded.items(), desc=f"reading {path.name}", unit="tensor", leave=False):
                    if not isinstance(key, str) or not isinstance(value, torch.Tensor):
                        raise ValueError(f"entry {key!r} is a {type(value).__name__}, not a tensor")
                    state[key] = value
        except Exception as error:
            name = f"SOURCE {path.parent.name}/{path.name}"
            if path.suffix == ".safetensors":
                # safetensors' own words ("incomplete metadata, file not fully covered") do not say what is wrong.
                problem = safetensors_problem(path) or f"{type(error).__name__}: {error}"
                raise ConversionError(f"{name}: cannot be read (truncated or corrupt file?): {problem}") from error
            # torch's message opens with advice to retry with weights_only=False: torch_load_problem drops it.
            problem = torch_load_problem(error)
            if problem.refused:  # a pickle naming a global (code it would run), or not a torch file at all
                raise ConversionError(f"{name}: {problem.text}") from error
            raise ConversionError(f"{name}: cannot be read (truncated or corrupt file?): {problem.text}") from error
    return state


# ---------------------------------------------------------------------------------------------------------------------
# Converting


def rename_legacy_key(key: str) -> str:
    """The txl name of a v4 parameter name, with the renamings transformers applies when loading a v4 folder."""
    for pattern, replacement in LEGACY_PARAMETER_RENAMES.items():
        key = re.sub(pattern, replacement, key, count=1)
    return key


def convert_state_dict(legacy_state: dict[str, torch.Tensor], model: TxlForCausalLM) -> dict[str, torch.Tensor]:
    """The tensors of `legacy_state` under `model`'s names, ready for a strict load.

    Dropped: keys the model ignores on load (v4's stored sinusoid frequencies; per-layer copies of the shared u / v
    of `untie_r=False`, which must equal the shared pair) and tied aliases (which must equal what they are tied to).
    Raises `ConversionError` for a key the model does not know, or a weight it needs that the checkpoint lacks.
    """
    expected = model.state_dict()
    tied = model.get_expanded_tied_weights_keys()  # {alias: source}
    ignored = [re.compile(pattern) for pattern in model._keys_to_ignore_on_load_unexpected or []]
    renamed = {rename_legacy_key(key): key for key in legacy_state}
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for name, key in tqdm(renamed.items(), desc="renaming", unit="tensor", leave=False):
        if name in expected:
            state[name] = legacy_state[key]
        elif any(pattern.search(name) for pattern in ignored):
            # A per-layer copy of the shared bias (transformer.layers.0.attention.content_bias for
            # transformer.content_bias) is dropped only if it really is a copy.
            shared = re.sub(r"layers\.\d+\.attention\.", "", name)
            if shared in renamed and not torch.equal(legacy_state[key], legacy_state[renamed[shared]]):
                raise ConversionError(f"{key}: differs from {renamed[shared]}, the shared bias it should copy")
        else:
            unexpected.append(key)
    if unexpected:
        raise ConversionError(f"the checkpoint holds weights this model does not have: {_listing(unexpected)}")
    for alias, source in tied.items():
        if alias in state and source in state:
            if not torch.equal(state[alias], state[source]):
                raise ConversionError(
                    f"{alias} should be tied to {source} (config: tie_word_embeddings / tie_projs), but the "
                    "checkpoint holds different values for them"
                )
            del state[alias]
    missing = [name for name in expected if name not in state and name not in tied]
    if missing:
        hint = " (a TransfoXLModel checkpoint without the LM head?)" if all("softmax" in m for m in missing) else ""
        raise ConversionError(f"the checkpoint lacks weights the model needs{hint}: {_listing(missing)}")
    return state


def _listing(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def build_converted_model(legacy_state: dict[str, torch.Tensor], config: TxlConfig) -> TxlForCausalLM:
    """A `TxlForCausalLM` of `config` holding the legacy weights (dtype kept)."""
    model = TxlForCausalLM(config)
    dtypes = {tensor.dtype for tensor in legacy_state.values() if tensor.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())
    state = convert_state_dict(legacy_state, model)
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # shapes that do not fit config.json
        raise ConversionError(f"the weights do not fit config.json: {error}") from error
    tied = model.get_expanded_tied_weights_keys()
    missing = [name for name in result.missing_keys if name not in tied]
    if missing or result.unexpected_keys:  # convert_state_dict already checked; this guards the invariant
        raise ConversionError(f"loading left out {_listing(missing + list(result.unexpected_keys))}")
    return model.eval()


def legacy_tokenizer(folder: Path, vocab_size: int) -> tuple[Any | None, str]:
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
        legacy = TxlForCausalLM.from_pretrained(source, memory_init="zeros")
    except CheckpointError as error:
        raise VerificationFailed(
            f"loading SOURCE as a v4 folder failed, so there is no trustworthy reference to compare with: {error}"
        ) from error
    # The converted model's own memory_init may be "empty"; the comparison with v4 needs v4's zeros on both sides.
    model = TxlForCausalLM.from_pretrained(converted, memory_init="zeros")
    legacy.eval()
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    logprob_diff = memory_diff = 0.0
    legacy_memory = memory = None
    for _ in tqdm(range(segments), desc="verifying", unit="segment", leave=False):
        ids = torch.randint(0, model.config.vocab_size, (VERIFY_BATCH, VERIFY_LENGTH), generator=generator)
        expected = legacy(ids, past_key_values=legacy_memory)
        actual = model(ids, past_key_values=memory)
        legacy_memory, memory = expected.past_key_values, actual.past_key_values
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


CONVERTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "configuration_txl.py",
    "modeling_txl.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
}


def check_out(out: Path, *, overwrite: bool) -> None:
    """Refuse an OUT that is a file or a link, or a non-empty folder unless `overwrite` and it holds an earlier
    conversion and nothing else (--overwrite replaces the whole folder: it must never delete a user's other files)."""
    if out.is_symlink():
        raise ConversionError(f"OUT {out}: is a symbolic link; give the folder itself")
    if out.exists() and not out.is_dir():
        raise ConversionError(f"OUT {out}: exists and is not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ConversionError(f"OUT {out}: exists and is not empty; pass --overwrite to replace it")
    foreign = sorted(path.name for path in out.iterdir() if path.name not in CONVERTED_FILES)
    try:
        model_type = json.loads((out / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if foreign or model_type != "txl":
        what = f"files this script does not write: {_listing(foreign)}" if foreign else "no converted config.json"
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


def model_card(
    *,
    source: Source,
    out_name: str,
    config: TxlConfig,
    weight_files: Sequence[Path],
    tokenizer_note: str | None,
    verification: Verification | None,
    license_name: str | None,
) -> str:
    """The README.md of the converted folder: YAML front matter, provenance, changes, usage, verification.

    `tokenizer_note` is None when no tokenizer was converted.
    """
    has_tokenizer = tokenizer_note is not None
    front = ["library_name: transformers", "pipeline_tag: text-generation", "tags:"]
    front += [f"- {tag}" for tag in ("transformer-xl", "txl", "custom_code", "text-generation")]
    if license_name:
        front.append(f"license: {license_name}")
    title = source.name.split("/")[-1]
    weights = ", ".join(f"`{path.name}`" for path in weight_files)
    if config.memory_init == "zeros":
        memory_line = (
            '`memory_init: "zeros"`: a new stream starts with `mem_len` zero vectors that the first segment attends '
            'to, as in transformers v4, so the outputs equal v4\'s. Pass `memory_init="empty"` to `from_pretrained` '
            "for the original code's empty start (outputs then differ from v4's)."
        )
    else:
        memory_line = (
            '`memory_init: "empty"`: a new stream starts with no memory, as in the original code; outputs differ '
            'from transformers v4\'s (which attended to zeros). Pass `memory_init="zeros"` to `from_pretrained` to '
            "reproduce v4."
        )
    tokenizer_line = (
        "- **Tokenizer**: `tokenizer.json` (a plain `tokenizers` word-level tokenizer with v4's ids), converted from "
        "the v4 vocabulary by an allow-list reader that rebuilds only plain data (v4 unpickled `vocab.pkl`, which can "
        "run arbitrary code)."
        if has_tokenizer
        else "- **No tokenizer**: the source had no vocabulary (`vocab.pkl` / `vocab.bin`); use the original one's."
    )
    if verification is None:
        verified = "Not verified (`--no-verify` was given)."
    else:
        verified = (
            f"Checked at conversion: the source loaded as a v4 checkpoint by `transfoxl` (v4 names renamed on load, "
            f'`memory_init="zeros"`) and this folder, {verification.summary()}. `transfoxl` itself reproduces '
            "transformers 4.37.2's outputs on its test checkpoints (log-probabilities within 1e-4, the rest within "
            "1e-5)."
        )
    usage = [
        "```python",
        "import torch",
        "from transformers import AutoModelForCausalLM" + (", AutoTokenizer" if has_tokenizer else ""),
        "",
        f'path = "{out_name}"  # this folder, or its Hub repo id',
        "model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()",
    ]
    if has_tokenizer:
        usage += [
            "tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)",
            "",
            "# add_special_tokens=True (the default) ends each line with <eos>, as in the training corpus.",
            'text = "The game began development in 2010 , carrying over a large portion of the work"',
            'ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids',
        ]
    else:
        usage += ["", "ids = torch.randint(0, model.config.vocab_size, (1, 256))  # token ids of your text"]
    usage += [
        "# Read the text in segments; the memory (hidden states of the last mem_len positions, per layer) carries",
        "# the context. The last token is held back: generate() takes only tokens the memory has not seen.",
        "memory = None",
        "with torch.no_grad():",
        "    for segment in ids[:, :-1].split(128, dim=1):",
        "        memory = model(segment, past_key_values=memory).past_key_values",
        "out = model.generate(ids[:, -1:], past_key_values=memory, max_new_tokens=20, do_sample=False)",
        *(["print(tokenizer.decode(out[0]))"] if has_tokenizer else []),
        "```",
    ]
    lines = [
        "---",
        *front,
        "---",
        "",
        f"# {title} (Transformer-XL for transformers v5)",
        "",
        f"Transformer-XL (Dai et al., 2019, https://arxiv.org/abs/1901.02860) converted from {source.describe()}, a "
        f'transformers-v4 checkpoint (`model_type: "transfo-xl"`, read from {weights}), by `scripts/convert.py` of '
        f"`transfoxl` {transfoxl.__version__}. transformers v5 no longer ships Transformer-XL; this folder carries "
        "its own code.",
        "",
        "## What changed",
        "",
        "- **Weights**: `model.safetensors` (no pickle); same values, renamed to `transfoxl`'s parameter names "
        "(`dec_attn.qkv_net` -> `attention.qkv_proj`, `r_w_bias` / `r_r_bias` -> `content_bias` / `position_bias`, "
        "`crit.out_layers` -> `adaptive_softmax.output_layers`, ...). v4's stored sinusoid frequencies are dropped "
        "(recomputed); tied weights are stored once.",
        f'- **Config**: `model_type: "txl"`, the same hyper-parameters; {memory_line}',
        "- **Code**: `configuration_txl.py` and `modeling_txl.py` next to the weights, run with "
        "`trust_remote_code=True` (or install `transfoxl`, which loads this folder natively).",
        tokenizer_line,
        "- **Outputs**: `logits` are log-probabilities (adaptive softmax, as v4's `prediction_scores`); the memory is "
        "`past_key_values`, a batch-first `TxlMemory` (v4: `mems`, sequence-first).",
        "",
        "## Usage",
        "",
        *usage,
        "",
        "## Verification",
        "",
        verified,
    ]
    if tokenizer_note:
        lines += ["", f"Tokenizer: {tokenizer_note}."]
    return "\n".join(lines) + "\n"


def source_license(folder: Path) -> str | None:
    """The `license` of SOURCE's model card (README.md front matter) or config.json, if either names one."""
    card = folder / "README.md"
    if card.is_file():
        try:
            from huggingface_hub.repocard import metadata_load

            value = (metadata_load(card) or {}).get("license")
            if isinstance(value, str) and value.strip():
                return value.strip()
        except Exception:  # a malformed card says nothing about the license; the conversion goes on without it
            pass
    try:
        value = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("license")
    except (OSError, ValueError, AttributeError):
        return None
    return value.strip() if isinstance(value, str) and value.strip() else None


def publish(staging: Path, out: Path) -> None:
    """Move the complete `staging` folder to `out` by renames; an old `out` is moved aside first, then deleted."""
    fsync_tree(staging)
    previous = None
    if out.is_dir():
        if any(out.iterdir()):  # --overwrite (checked before): keep the old folder until the new one is in place
            previous = out.parent / f".{out.name}.replaced-{secrets.token_hex(4)}"
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
    weight_files = find_weight_files(source.folder)
    tokenizer, tokenizer_note = legacy_tokenizer(source.folder, legacy_config.vocab_size)  # fails fast on a bad vocab

    config = TxlConfig.from_legacy(legacy_config)
    config.memory_init = memory_init
    model = build_converted_model(read_state_dict(weight_files), config)

    out.parent.mkdir(parents=True, exist_ok=True)
    # Next to OUT (same file system: the final rename is atomic); mkdir gives it the umask's mode, which OUT keeps.
    staging = out.parent / f".{out.name}.converting-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        model.save_pretrained(staging)  # config, generation config, safetensors, and the two code files
        del model
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        verification = None
        if verify_segments is not None:
            verification = verify(source.folder, staging, segments=verify_segments)
            if not verification.passed:
                raise VerificationFailed(f"the converted model differs from the legacy one: {verification.summary()}")
        card = model_card(
            source=source,
            out_name=out.name,
            config=config,
            weight_files=weight_files,
            tokenizer_note=tokenizer_note if tokenizer is not None else None,
            verification=verification,
            license_name=source_license(source.folder),
        )
        write_text_atomically(staging / "README.md", card)
        file_mode = staging.stat().st_mode & 0o666  # transformers writes model.safetensors as 0600
        for path in staging.iterdir():
            os.chmod(path, file_mode)
        files = sorted(path.name for path in staging.iterdir())
        publish(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Result(files, verification, [tokenizer_note])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="SOURCE", help="v4 checkpoint folder, or a Hub repo id (org/name)")
    parser.add_argument("out", metavar="OUT", type=Path, help="output folder (absent or empty unless --overwrite)")
    parser.add_argument(
        "--memory-init",
        choices=MEMORY_INIT_CHOICES,
        default="zeros",
        help="how the converted model starts a stream's memory: 'zeros' (default) reproduces v4's outputs, 'empty' "
        "is the original code's start",
    )
    parser.add_argument(
        "--verify-segments", type=int, default=3, metavar="N", help="segments compared by the verification (3)"
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the comparison with the legacy model")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT (SOURCE is never touched)")
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit) when SOURCE is a repo id")
    args = parser.parse_args(argv)
    if args.verify_segments < 1:
        parser.error(f"--verify-segments must be >= 1, got {args.verify_segments}")

    try:
        result = convert(
            args.source,
            args.out,
            memory_init=args.memory_init,
            verify_segments=None if args.no_verify else args.verify_segments,
            overwrite=args.overwrite,
            revision=args.revision,
        )
    except ConversionError as error:
        parser.error(str(error))
    except OSError as error:  # permissions, a full disk: one line, not a traceback
        parser.error(f"cannot write {args.out}: {error}")
    except VerificationFailed as error:
        print(f"error: verification failed, nothing was written to {args.out}: {error}", file=sys.stderr)
        return 1
    for note in result.notes:
        print(note)
    if result.verification is None:
        print("verification: skipped (--no-verify)")
    else:
        print(f"verification: passed; {result.verification.summary()}")
    print(f"wrote {args.out}: {', '.join(result.files)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
