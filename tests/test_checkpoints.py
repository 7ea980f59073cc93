"""Checkpoint files that are broken or hostile (`transfoxl/checkpoints.py`): each is refused with an error naming
the file and the problem, and runs nothing.

Rows of the reliability table (area "files"): truncated or corrupt safetensors, checkpoints whose weights do not fit
config.json, missing files and repo ids not cached offline, malicious or broken `pytorch_model.bin`, and the
exception types compared with transformers' own for a GPT-2 folder broken the same way. Each test records the message
it caught (`record_property("outcome", ...)`). The vocabulary and tokenizer files' rows are in
test_tokenization_legacy.py, the conversion scripts' in test_convert_script.py and test_tokenization_convert.py.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from tests.utils import (
    LEGACY,
    SYSTEM,
    RunsCommand,
    edit_config,
    named,
    refused,
    reliability,
    tiny_config,
    tiny_lm,
    write_bin,
)
from transfoxl import TxlForCausalLM, TxlForSequenceClassification, TxlModel
from transfoxl.checkpoints import (
    CheckpointError,
    CheckpointMismatchError,
    CorruptSafetensorsError,
    MissingShardError,
    RefusedPickleError,
    ShardIndexError,
)

# torch warns that a raw pickle's protocol is newer than its own default before refusing it: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny TxlForCausalLM saved once (config.json, model.safetensors, ...); tests work on copies."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    tiny_lm().save_pretrained(folder)
    return folder


@pytest.fixture
def model_dir(saved: Path, tmp_path: Path) -> Path:
    """A copy of `saved` that a test may break (in this file, in place of conftest.py's `model_dir`)."""
    folder = tmp_path / "model"
    shutil.copytree(saved, folder)
    return folder


# ------------------------------------------------------------------------------------------------ 1. safetensors


def _cut(data: bytes, case: str) -> bytes:
    """`data` (a safetensors file) broken as `case` says."""
    header_length = int.from_bytes(data[:8], "little")
    data_start = 8 + header_length
    return {
        "zero_bytes": b"",
        "inside_length_prefix": data[:4],
        "inside_header": data[: 8 + header_length // 2],
        "after_header": data[:data_start],
        "inside_data": data[: data_start + (len(data) - data_start) // 2],
        "last_byte_missing": data[:-1],
        "garbage_header": data[:8]
        + b"\x00garbage" * (header_length // 8)
        + b"x" * (header_length % 8)
        + data[data_start:],
        "length_prefix_too_large": (2**40).to_bytes(8, "little") + data[8:],
        "length_prefix_too_small": (header_length - 10).to_bytes(8, "little") + data[8:],
        "trailing_bytes": data + b"\x00" * 16,
    }[case]


SAFETENSORS_CASES = [
    ("zero_bytes", r"the file is empty \(0 bytes\)", "zero-byte file"),
    (
        "inside_length_prefix",
        r"holds 4 bytes, fewer than the 8 that give the header's length",
        "cut inside the 8-byte length prefix",
    ),
    ("inside_header", r"only \d+ follow it \(the file was cut inside its header", "truncated inside the JSON header"),
    (
        "after_header",
        r"describes \d+ bytes of tensor data but the file holds only 0 \(cut short",
        "truncated right after the header",
    ),
    (
        "inside_data",
        r"describes \d+ bytes of tensor data but the file holds only \d+ \(cut short",
        "truncated inside the tensor data",
    ),
    (
        "last_byte_missing",
        r"describes (\d+) bytes of tensor data but the file holds only \d+ \(cut short",
        "last byte missing",
    ),
    ("garbage_header", r"its header is not valid JSON .*: a corrupt header", "header replaced by garbage (not JSON)"),
    (
        "length_prefix_too_large",
        r"length prefix says 1099511627776 bytes but only",
        "length prefix corrupt (too large)",
    ),
    (
        "length_prefix_too_small",
        r"its header is not valid JSON .*wrong length prefix",
        "length prefix corrupt (too small)",
    ),
    (
        "trailing_bytes",
        r"16 bytes follow the tensor data that the header describes",
        "extra bytes after the tensor data",
    ),
]


@pytest.mark.parametrize(
    ("case", "detail"),
    [
        pytest.param(
            case,
            detail,
            id=case,
            marks=reliability(
                f"model.safetensors {what}",
                "CorruptSafetensorsError (an OSError and, as in transformers, a SafetensorError) naming the file "
                "as truncated or corrupt, saying what is wrong, suggesting a new download; safetensors' error kept as "
                "the cause",
            ),
        )
        for case, detail, what in SAFETENSORS_CASES
    ],
)
def test_broken_safetensors_is_named(model_dir: Path, record_property, case: str, detail: str) -> None:
    path = model_dir / "model.safetensors"
    path.write_bytes(_cut(path.read_bytes(), case))
    error = refused(
        record_property,
        CorruptSafetensorsError,
        rf"{named(path)}: truncated or corrupt safetensors file: .*{detail}.*Download it again",
        lambda: TxlForCausalLM.from_pretrained(model_dir),
    )
    assert isinstance(error.__cause__, SafetensorError)  # what safetensors said stays available


@reliability("model.safetensors truncated, loaded with AutoModelForCausalLM", "the same error, naming the file")
def test_broken_safetensors_through_the_auto_class(model_dir: Path, record_property) -> None:
    path = model_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    refused(
        record_property,
        OSError,
        rf"{named(path)}: truncated or corrupt safetensors file: .* holds only",
        lambda: AutoModelForCausalLM.from_pretrained(model_dir),
    )


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    folder = tmp_path / "sharded"
    tiny_lm().save_pretrained(folder, max_shard_size="40KB")
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    return folder


@reliability("one shard of a sharded checkpoint truncated", "OSError naming that shard as truncated")
def test_truncated_shard_is_named(sharded: Path, record_property) -> None:
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:1000])
    refused(
        record_property,
        CorruptSafetensorsError,
        rf"{named(shard)}: truncated or corrupt safetensors file",
        lambda: TxlForCausalLM.from_pretrained(sharded),
    )


@reliability("a shard named by model.safetensors.index.json is missing", "OSError naming the index and the shard")
def test_missing_shard_is_named(sharded: Path, record_property) -> None:
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shard.unlink()
    refused(
        record_property,
        MissingShardError,
        rf"{named(sharded / 'model.safetensors.index.json')}: names shard files that are not in .*{shard.name}",
        lambda: TxlForCausalLM.from_pretrained(sharded),
    )


@reliability("model.safetensors.index.json truncated (not JSON)", "OSError naming the index as unreadable")
def test_corrupt_shard_index_is_named(sharded: Path, record_property) -> None:
    index = sharded / "model.safetensors.index.json"
    index.write_text(index.read_text()[:40])
    refused(
        record_property,
        ShardIndexError,
        rf"{named(index)}: not a readable shard index \(JSONDecodeError",
        lambda: TxlForCausalLM.from_pretrained(sharded),
    )


def fake_hub_cache(cache: Path, repo_id: str, files: Path) -> Path:
    """The Hub cache layout (`models--org--name/snapshots/<commit>`, `refs/main`) holding a copy of `files`."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(files, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@reliability("model.safetensors truncated in the Hub cache, loaded by repo id", "OSError naming the cached file")
def test_truncated_file_in_the_hub_cache_is_named(saved: Path, tmp_path: Path, record_property) -> None:
    snapshot = fake_hub_cache(tmp_path / "hub", "txl-org/tiny", saved)
    path = snapshot / "model.safetensors"
    path.write_bytes(path.read_bytes()[:5000])
    refused(
        record_property,
        CheckpointError,
        rf"{named(path)}: truncated or corrupt safetensors file",
        lambda: TxlForCausalLM.from_pretrained("txl-org/tiny", cache_dir=tmp_path / "hub", local_files_only=True),
    )


# ------------------------------------------------------------------------------------------------ 2. weights vs config

# config.json edits that change shapes: (edit, a parameter with its checkpoint and model shapes in the message).
SHAPE_CASES = {
    "d_model": (
        {"d_model": 48},
        r"transformer\.layers\.0\.attention\.qkv_proj\.weight: \[96, 32\] in the checkpoint, \[96, 48\] in the model",
    ),
    "d_inner": (
        {"d_inner": 128},
        r"transformer\.layers\.0\.ffn\.up_proj\.weight: \[64, 32\] in the checkpoint, \[128, 32\] in the model",
    ),
    "n_head": (
        {"n_head": 2},
        r"transformer\.layers\.0\.attention\.qkv_proj\.weight: \[96, 32\] in the checkpoint, \[48, 32\] in the model",
    ),
    "vocab_size": (
        {"vocab_size": 120},
        r"transformer\.word_embeddings\.embeddings\.2\.weight: \[47, 8\] in the checkpoint, \[70, 8\] in the model",
    ),
    "cutoffs": (
        {"cutoffs": [30, 50]},
        r"transformer\.word_embeddings\.embeddings\.0\.weight: \[20, 32\] in the checkpoint, \[30, 32\] in the model",
    ),
    "div_val": (
        {"div_val": 1},
        r"transformer\.word_embeddings\.embeddings\.0\.weight: \[20, 32\] in the checkpoint, \[97, 32\] in the model",
    ),
}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case,
            id=case,
            marks=reliability(
                f"config.json edited to another {case} than the weights'",
                "CheckpointMismatchError (an OSError and, as in transformers, a RuntimeError) naming each "
                "mismatched parameter with both shapes; nothing reinitialised",
            ),
        )
        for case in SHAPE_CASES
    ],
)
def test_shapes_that_do_not_fit_the_config_are_named(model_dir: Path, record_property, case: str) -> None:
    edit, detail = SHAPE_CASES[case]
    edit_config(model_dir, **edit)
    refused(
        record_property,
        CheckpointMismatchError,
        rf"{named(model_dir)}: weights whose shapes do not fit the model \(\d+\): .*{detail}.*config\.json does not "
        "describe these weights",
        lambda: TxlForCausalLM.from_pretrained(model_dir),
    )


@reliability(
    "shapes do not fit config.json, ignore_mismatched_sizes=True (explicit opt-in)",
    "loads; the mismatched weights are newly initialised and listed in the loading info (transformers' behaviour)",
)
def test_mismatched_shapes_load_when_asked_for(model_dir: Path, record_property) -> None:
    edit_config(model_dir, d_inner=128)
    model, info = TxlForCausalLM.from_pretrained(model_dir, ignore_mismatched_sizes=True, output_loading_info=True)
    names = sorted(name for name, _, _ in info["mismatched_keys"])
    record_property("outcome", f"loaded; mismatched_keys: {names}")
    assert "transformer.layers.0.ffn.up_proj.weight" in names
    assert model.config.d_inner == 128


MISSING_CASES = {
    "n_layer_larger": (
        lambda folder: edit_config(folder, n_layer=3),
        "config.json says n_layer=3, the weights have 2 layers",
        r"lacks weights the model needs \(13\), which would be left random: transformer\.layers\.2\.",
    ),
    "tensor_removed": (
        lambda folder: _drop_tensors(folder, "adaptive_softmax.output_layers.1.bias"),
        "model.safetensors lacks one tensor (adaptive_softmax.output_layers.1.bias)",
        r"lacks weights the model needs \(1\), which would be left random: adaptive_softmax\.output_layers\.1\.bias\.",
    ),
    "no_tensors": (
        lambda folder: _drop_tensors(folder, *load_file(folder / "model.safetensors")),
        "model.safetensors holds no tensor at all (a valid, empty file)",
        r"lacks weights the model needs \(\d+\), which would be left random: adaptive_softmax\.cluster_bias",
    ),
    "untied_output_layers": (
        lambda folder: edit_config(folder, tie_word_embeddings=False),
        "config.json unties the output layers from the embedding (as a v4 config's tie_weight false, which "
        "transformers 4.x ignored), the weights hold none",
        r"lacks weights the model needs \(\d+\), which would be left random: "
        r"adaptive_softmax\.output_layers\.0\.weight.*pass tie_word_embeddings=True to from_pretrained",
    ),
    "untie_r_changed": (
        lambda folder: edit_config(folder, untie_r=False),
        "config.json says untie_r=false (shared u, v), the weights have per-layer ones",
        r"lacks weights the model needs \(2\), which would be left random: transformer\.content_bias, "
        r"transformer\.position_bias",
    ),
}


def _drop_tensors(folder: Path, *names: str) -> None:
    state = load_file(folder / "model.safetensors")
    save_file(
        {key: value for key, value in state.items() if key not in names},
        folder / "model.safetensors",
        {"format": "pt"},
    )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case,
            id=case,
            marks=reliability(
                what,
                "CheckpointMismatchError (OSError, RuntimeError) naming the missing weights (transformers: warning, "
                "random weights)",
            ),
        )
        for case, (_, what, _) in MISSING_CASES.items()
    ],
)
def test_missing_weights_are_refused_not_randomised(model_dir: Path, record_property, case: str) -> None:
    breaks, _, detail = MISSING_CASES[case]
    breaks(model_dir)
    refused(
        record_property,
        CheckpointMismatchError,
        rf"{named(model_dir)}: the checkpoint {detail}",
        lambda: TxlForCausalLM.from_pretrained(model_dir),
    )


@reliability(
    "config.json says n_layer=1, the weights have 2 layers",
    "OSError naming the weights that have no place in the model (transformers: warning, weights dropped)",
)
def test_weights_beyond_the_config_are_refused(model_dir: Path, record_property) -> None:
    edit_config(model_dir, n_layer=1)
    refused(
        record_property,
        CheckpointMismatchError,
        rf"{named(model_dir)}: the checkpoint holds weights that have no place in the model \(\d+\): "
        r"transformer\.layers\.1\.",
        lambda: TxlForCausalLM.from_pretrained(model_dir),
    )


@reliability(
    "TxlForCausalLM loaded from a TxlModel checkpoint (no language-modelling head)",
    "OSError naming the missing head weights, not a random head",
)
def test_lm_from_a_headless_checkpoint_is_refused(saved: Path, tmp_path: Path, record_property) -> None:
    TxlModel.from_pretrained(saved).save_pretrained(tmp_path / "base")
    refused(
        record_property,
        CheckpointMismatchError,
        r"lacks weights the model needs \(\d+\).*adaptive_softmax\.cluster_bias.*a TxlModel checkpoint has no "
        "language-modelling head",
        lambda: TxlForCausalLM.from_pretrained(tmp_path / "base"),
    )


@reliability(
    "TxlModel / TxlForSequenceClassification loaded from a TxlForCausalLM checkpoint (another head)",
    "loads: the LM head's weights are dropped, the classification head `score` starts new (transformers' warning)",
)
def test_other_heads_still_load(saved: Path, record_property) -> None:
    _, base_info = TxlModel.from_pretrained(saved, output_loading_info=True)
    _, head_info = TxlForSequenceClassification.from_pretrained(saved, output_loading_info=True)

    def sorted_info(info: dict) -> dict:  # (sets in a fixed order: the table is the same from run to run)
        return {name: sorted(value) if isinstance(value, set) else value for name, value in info.items()}

    record_property(
        "outcome", f"loaded; TxlModel {sorted_info(base_info)}; TxlForSequenceClassification {sorted_info(head_info)}"
    )
    assert not base_info["missing_keys"] and head_info["missing_keys"] == {"score.weight"}


@reliability(
    "a classifier saved with 2 labels, loaded with num_labels=3",
    "CheckpointMismatchError naming the head's number of labels (not the architecture fields)",
)
def test_a_classifier_loaded_with_another_number_of_labels_names_num_labels(tmp_path: Path, record_property) -> None:
    TxlForSequenceClassification(tiny_config(num_labels=2, pad_token_id=0)).save_pretrained(tmp_path / "classifier")
    refused(
        record_property,
        CheckpointMismatchError,
        r"score\.weight: \[2, 32\] in the checkpoint, \[3, 32\] in the model\. The classification head has 3 "
        r"labels \(num_labels, given to from_pretrained or in config\.json\)",
        lambda: TxlForSequenceClassification.from_pretrained(tmp_path / "classifier", num_labels=3),
    )


# ------------------------------------------------------------------------------------------------ 3. missing files


@reliability("a folder without config.json (TxlForCausalLM)", "OSError naming the folder: no config.json")
def test_folder_without_config_through_the_class(model_dir: Path, record_property) -> None:
    (model_dir / "config.json").unlink()
    refused(
        record_property,
        CheckpointError,
        rf"{named(model_dir)}: no config\.json, so not a saved model folder",
        lambda: TxlForCausalLM.from_pretrained(model_dir),
    )


@reliability(
    "a folder without config.json (AutoModelForCausalLM)",
    "transformers' ValueError naming the folder and config.json (AutoConfig runs before this package)",
)
def test_folder_without_config_through_the_auto_class(model_dir: Path, record_property) -> None:
    (model_dir / "config.json").unlink()
    refused(
        record_property,
        ValueError,
        rf"Unrecognized model in {named(model_dir)}\. Should have a `model_type` key in its config\.json",
        lambda: AutoModelForCausalLM.from_pretrained(model_dir),
    )


@pytest.mark.parametrize("loader", [TxlForCausalLM, AutoModelForCausalLM], ids=["class", "auto"])
@pytest.mark.parametrize(
    "content",
    [
        pytest.param(
            b'{"model_type": "txl", "d_mo',
            id="truncated",
            marks=reliability("config.json truncated", "transformers' OSError naming config.json as not valid JSON"),
        ),
        pytest.param(
            b"",
            id="zero_bytes",
            marks=reliability("config.json of 0 bytes", "transformers' OSError naming config.json as not valid JSON"),
        ),
        pytest.param(
            '{"model_type": "t\u00e9l"}'.encode("latin-1"),
            id="latin1",
            marks=reliability(
                "config.json written in Latin-1", "transformers' OSError naming config.json as not valid JSON"
            ),
        ),
    ],
)
def test_broken_config_json_is_named(model_dir: Path, record_property, loader, content: bytes) -> None:
    (model_dir / "config.json").write_bytes(content)
    refused(
        record_property,
        OSError,
        rf"config file at '{named(model_dir / 'config.json')}' is not a valid JSON file",
        lambda: loader.from_pretrained(model_dir),
    )


@reliability("config.json holding a JSON list, not an object (TxlForCausalLM)", "OSError naming config.json")
def test_config_json_that_is_not_an_object(model_dir: Path, record_property) -> None:
    (model_dir / "config.json").write_text("[1, 2]")
    refused(
        record_property,
        CheckpointError,
        rf"{named(model_dir / 'config.json')}: holds a JSON list, not an object of settings",
        lambda: TxlForCausalLM.from_pretrained(model_dir),
    )


@pytest.mark.parametrize("loader", [TxlForCausalLM, AutoModelForCausalLM], ids=["class", "auto"])
@reliability("a folder without weights", "OSError naming the folder and the weight files looked for")
def test_folder_without_weights(model_dir: Path, record_property, loader) -> None:
    (model_dir / "model.safetensors").unlink()
    refused(
        record_property,
        OSError,
        rf"no file named model\.safetensors, or pytorch_model\.bin, found in directory {named(model_dir)}",
        lambda: loader.from_pretrained(model_dir),
    )


@reliability("a path that does not exist (TxlForCausalLM)", "OSError naming the path: no such folder")
def test_nonexistent_path_through_the_class(tmp_path: Path, record_property) -> None:
    refused(
        record_property,
        CheckpointError,
        rf"{named(tmp_path / 'nowhere')}: no such folder",
        lambda: TxlForCausalLM.from_pretrained(tmp_path / "nowhere"),
    )


@reliability(
    "a path that does not exist (AutoModelForCausalLM)",
    "transformers' OSError naming the path (as a repo id: AutoConfig runs before this package)",
)
def test_nonexistent_path_through_the_auto_class(tmp_path: Path, record_property) -> None:
    refused(
        record_property,
        OSError,
        rf"Repo id must be in the form .*{named(tmp_path / 'nowhere')}",
        lambda: AutoModelForCausalLM.from_pretrained(tmp_path / "nowhere"),
    )


@reliability("a file (config.json) given instead of the folder", "OSError naming the file: give the folder")
def test_a_file_instead_of_the_folder(model_dir: Path, record_property) -> None:
    refused(
        record_property,
        CheckpointError,
        rf"{named(model_dir / 'config.json')}: is a file; give the folder",
        lambda: TxlForCausalLM.from_pretrained(model_dir / "config.json"),
    )


@reliability(
    "Hub repo id not in the cache, local_files_only=True (TxlForCausalLM)",
    "OSError naming the repo id and the cache folder: not cached while offline",
)
def test_repo_not_in_the_cache_with_local_files_only(saved: Path, tmp_path: Path, record_property) -> None:
    fake_hub_cache(tmp_path / "hub", "txl-org/tiny", saved)
    TxlForCausalLM.from_pretrained("txl-org/tiny", cache_dir=tmp_path / "hub", local_files_only=True)  # control
    refused(
        record_property,
        CheckpointError,
        rf"txl-org/missing: not a local folder, and not in the Hugging Face cache \({named(tmp_path / 'hub')}\) "
        "while offline",
        lambda: TxlForCausalLM.from_pretrained("txl-org/missing", cache_dir=tmp_path / "hub", local_files_only=True),
    )


# Runs with HF_HUB_OFFLINE=1 and HF_HOME set before huggingface_hub is imported (the constant is read at import).
OFFLINE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import transfoxl
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel
    from transfoxl import TransfoXLTokenizerFast, TxlForCausalLM

    calls = {
        "cached_class": lambda: TxlForCausalLM.from_pretrained("txl-org/tiny"),
        "cached_auto": lambda: AutoModelForCausalLM.from_pretrained("txl-org/tiny"),
        "missing_class": lambda: TxlForCausalLM.from_pretrained("txl-org/missing"),
        "missing_auto": lambda: AutoModelForCausalLM.from_pretrained("txl-org/missing"),
        "missing_tokenizer": lambda: TransfoXLTokenizerFast.from_pretrained("txl-org/missing"),
    }
    outcomes = {}
    for name, call in calls.items():
        try:
            outcomes[name] = ["loaded", type(call()).__name__]
        except Exception as error:
            outcomes[name] = [type(error).__name__, str(error)]
    print(json.dumps(outcomes))
    """
)


@pytest.fixture(scope="module")
def offline_outcomes(saved: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """One fresh process with HF_HUB_OFFLINE=1 and a fake Hub cache holding only txl-org/tiny."""
    home = tmp_path_factory.mktemp("hf_home")
    fake_hub_cache(home / "hub", "txl-org/tiny", saved)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_SCRIPT], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


OFFLINE_CASES = {
    "cached_class": ("Hub repo id in the cache, HF_HUB_OFFLINE=1 (control)", "loads", r"TxlForCausalLM"),
    "cached_auto": (
        "Hub repo id in the cache, HF_HUB_OFFLINE=1, AutoModelForCausalLM (control)",
        "loads",
        r"TxlForCausalLM",
    ),
    "missing_class": (
        "Hub repo id not in the cache, HF_HUB_OFFLINE=1 (TxlForCausalLM)",
        "OSError naming the repo id: not cached while offline",
        r"^txl-org/missing: not a local folder, and not in the Hugging Face cache \(.*hub\) while offline "
        r"\(HF_HUB_OFFLINE=1",
    ),
    "missing_auto": (
        "Hub repo id not in the cache, HF_HUB_OFFLINE=1 (AutoModelForCausalLM)",
        "transformers' OSError: cannot connect and not in the cached files (does not name the repo id: AutoConfig "
        "runs before this package)",
        r"couldn't find them in the cached files",
    ),
    "missing_tokenizer": (
        "Hub repo id not in the cache, HF_HUB_OFFLINE=1 (TransfoXLTokenizerFast)",
        "OSError naming the repo id: not cached while offline",
        r"^txl-org/missing: not a local folder, and not in the Hugging Face cache",
    ),
}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, id=case, marks=reliability(what, expected))
        for case, (what, expected, _) in OFFLINE_CASES.items()
    ],
)
def test_offline_repo_ids(offline_outcomes: dict[str, list[str]], record_property, case: str) -> None:
    kind, message = offline_outcomes[case]
    record_property("outcome", f"{kind}: {message}")
    assert re.search(OFFLINE_CASES[case][2], message), (kind, message)
    if case.startswith("cached"):
        assert kind == "loaded"


# ------------------------------------------------------------------------------------------------ 4. pytorch_model.bin


@reliability("control: the payload used below, unpickled with pickle.loads", "the command runs (the sentinel appears)")
def test_the_payload_is_live(sentinel: Path, record_property) -> None:
    pickle.loads(pickle.dumps(RunsCommand(f"touch {sentinel}")))
    record_property("outcome", f"sentinel created: {sentinel.exists()}")
    assert sentinel.exists()


BIN_CASES = {
    "zip": ("torch.save zip format with an os.system payload", SYSTEM),
    "legacy_torch": ("pre-1.6 torch.save format with an os.system payload", SYSTEM),
    "raw_pickle": ("a raw pickle (protocol 5) whose object runs os.system", r"not a PyTorch weights file"),
    "raw_pickle_protocol2": ("a raw protocol-2 pickle of a dict with an os.system payload", SYSTEM),
}


@pytest.mark.parametrize("loader", [TxlForCausalLM, AutoModelForCausalLM], ids=["class", "auto"])
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(
            kind,
            id=kind,
            marks=reliability(
                f"malicious pytorch_model.bin: {what}",
                "RefusedPickleError (an OSError and, as in transformers, a pickle.UnpicklingError) naming the file "
                "as refused (nothing run: torch.load(weights_only=True)); no sentinel",
            ),
        )
        for kind, (what, _) in BIN_CASES.items()
    ],
)
def test_malicious_weights_are_refused_and_never_run(
    tmp_path: Path, sentinel: Path, record_property, kind: str, loader
) -> None:
    path = write_bin(tmp_path / "v4", kind, sentinel)
    refused(
        record_property,
        RefusedPickleError,
        rf"{named(path)}: refused: .*{BIN_CASES[kind][1]}.*[Nn]othing in it was run",
        lambda: loader.from_pretrained(tmp_path / "v4"),
    )
    assert not sentinel.exists()


@reliability(
    "weights_only=False passed to AutoModelForCausalLM.from_pretrained (malicious pytorch_model.bin)",
    "ValueError: weights_only=False is refused; no sentinel",
)
def test_weights_only_false_is_refused_through_the_auto_class(tmp_path: Path, sentinel: Path, record_property) -> None:
    write_bin(tmp_path / "v4", "zip", sentinel)
    refused(
        record_property,
        ValueError,
        r"weights_only=False is refused",
        lambda: AutoModelForCausalLM.from_pretrained(tmp_path / "v4", weights_only=False),
    )
    assert not sentinel.exists()


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "legacy_format/pytorch_model.bin"], ids=["zip", "pre_1_6"])
@reliability("benign v4 pytorch_model.bin (control)", "loads through AutoModelForCausalLM, every weight filled")
def test_benign_v4_bin_still_loads(tmp_path: Path, record_property, weights: str) -> None:
    shutil.copy(LEGACY / "adaptive_div2" / "config.json", tmp_path / "config.json")
    shutil.copy(LEGACY / "adaptive_div2" / weights, tmp_path / "pytorch_model.bin")
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    record_property("outcome", f"loaded {type(model).__name__}; {info}")
    assert not any(info.values())


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(
            0, id="zero_bytes", marks=reliability("pytorch_model.bin of 0 bytes", "OSError naming the file as empty")
        ),
        pytest.param(
            0.5,
            id="half",
            marks=reliability("pytorch_model.bin truncated (zip end missing)", "OSError naming the file as truncated"),
        ),
    ],
)
def test_broken_bin_is_named(tmp_path: Path, record_property, cut: float) -> None:
    shutil.copy(LEGACY / "adaptive_div2" / "config.json", tmp_path / "config.json")
    data = (LEGACY / "adaptive_div2" / "pytorch_model.bin").read_bytes()
    (tmp_path / "pytorch_model.bin").write_bytes(data[: int(len(data) * cut)])
    refused(
        record_property,
        CheckpointError,
        rf"{named(tmp_path / 'pytorch_model.bin')}: truncated or corrupt PyTorch weights file: "
        r"(the file is empty|a zip archive .* whose end is missing)",
        lambda: TxlForCausalLM.from_pretrained(tmp_path),
    )


# ------------------------------------------------------------------------------------------------ 5. exception types

# A tiny GPT-2 of transformers' own, broken the same way as a TxlForCausalLM folder, shows what transformers raises.
# The error here must be an instance of that type (so that an `except` written for transformers catches it) and still
# a CheckpointError (an OSError).

MODELS = {"gpt2": GPT2LMHeadModel, "txl": TxlForCausalLM}


@pytest.fixture(scope="module")
def gpt2_saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpt2") / "model"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=32)).save_pretrained(folder)
    return folder


def _second_shard(folder: Path) -> Path:
    return sorted(folder.glob("model-*.safetensors"))[1]


def _bin_instead(folder: Path, *, malicious: bool = False, cut_in_half: bool = False) -> None:
    """Replace model.safetensors by a pytorch_model.bin of the same tensors (torch.save's zip format)."""
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    path = folder / "pytorch_model.bin"
    torch.save({**state, "extra": RunsCommand(f"touch {folder / 'pwned'}")} if malicious else state, path)
    if cut_in_half:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# case: (how to break a folder, given the model's key in MODELS; whether the folder is sharded; the type both errors
# must be instances of, None for the very type transformers raised)
TYPE_CASES: dict[str, tuple[Callable[[Path, str], object], bool, type[BaseException] | None]] = {
    "shapes_do_not_fit_config": (
        lambda folder, model: edit_config(folder, **{"gpt2": {"n_inner": 128}, "txl": {"d_inner": 128}}[model]),
        False,
        None,
    ),
    **{
        f"safetensors_{case}": (
            lambda folder, model, case=case: (folder / "model.safetensors").write_bytes(
                _cut((folder / "model.safetensors").read_bytes(), case)
            ),
            False,
            None,
        )
        for case, _, _ in SAFETENSORS_CASES
    },
    "shard_truncated": (lambda folder, model: _second_shard(folder).write_bytes(b"\x00" * 1000), True, None),
    "shard_missing": (lambda folder, model: _second_shard(folder).unlink(), True, None),
    # transformers lets json's JSONDecodeError through; what is promised here is its base class, ValueError.
    "shard_index_not_json": (
        lambda folder, model: (folder / "model.safetensors.index.json").write_text('{"metadata": {"total_si'),
        True,
        ValueError,
    ),
    "malicious_bin": (lambda folder, model: _bin_instead(folder, malicious=True), False, None),
    "bin_cut_in_half": (lambda folder, model: _bin_instead(folder, cut_in_half=True), False, None),
    "no_weights": (lambda folder, model: (folder / "model.safetensors").unlink(), False, None),
}


def _raised(call: Callable[[], object]) -> BaseException:
    with pytest.raises(Exception) as exc_info:
        call()
    return exc_info.value


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case,
            id=case,
            marks=reliability(
                f"exception type: {case.replace('_', ' ')} (compared with a GPT-2 folder broken the same way)",
                "an instance of the type transformers raises for its own model, and a CheckpointError (OSError)",
            ),
        )
        for case in TYPE_CASES
    ],
)
def test_errors_are_what_transformers_raises(
    gpt2_saved: Path, saved: Path, tmp_path: Path, record_property, case: str
) -> None:
    breaks, sharded, promised = TYPE_CASES[case]
    errors = {}
    for model, source in (("gpt2", gpt2_saved), ("txl", saved)):
        folder = tmp_path / model
        if sharded:
            MODELS[model].from_pretrained(source).save_pretrained(folder, max_shard_size="20KB")
            assert len(list(folder.glob("model-*.safetensors"))) > 1
        else:
            shutil.copytree(source, folder)
        breaks(folder, model)
        errors[model] = _raised(lambda: MODELS[model].from_pretrained(folder))  # noqa: B023 (called at once)
    theirs, ours = errors["gpt2"], errors["txl"]
    record_property("outcome", f"transformers: {type(theirs).__name__}; here: {type(ours).__name__}: {ours}")
    expected = promised or type(theirs)
    assert isinstance(theirs, expected), repr(theirs)
    assert isinstance(ours, expected), (type(ours).__mro__, ours)
    assert isinstance(ours, CheckpointError) or case == "no_weights", repr(ours)  # no weights: transformers' OSError
    assert not list(tmp_path.glob("*/pwned"))


@pytest.mark.parametrize("case", ["nonexistent", "file_instead_of_folder", "repo_not_cached_offline"])
@reliability(
    "exception type: a missing path, a file for a folder, a repo not cached offline (compared with GPT-2)",
    "an OSError, as transformers raises",
)
def test_missing_paths_are_oserrors_as_in_transformers(
    gpt2_saved: Path, saved: Path, tmp_path: Path, record_property, case: str
) -> None:
    def load(model: str, folder: Path) -> object:
        if case == "nonexistent":
            return MODELS[model].from_pretrained(tmp_path / "nowhere")
        if case == "file_instead_of_folder":
            return MODELS[model].from_pretrained(folder / "config.json")
        return MODELS[model].from_pretrained("txl-org/missing", cache_dir=tmp_path / "hub", local_files_only=True)

    theirs = _raised(lambda: load("gpt2", gpt2_saved))
    ours = _raised(lambda: load("txl", saved))
    record_property("outcome", f"transformers: {type(theirs).__name__}; here: {type(ours).__name__}: {ours}")
    assert type(theirs) is OSError, repr(theirs)
    assert isinstance(ours, CheckpointError)
