"""Parity with transformers 4.37.2's TransfoXL on the committed fixtures (tools/make_legacy_fixtures.py).

Each fixture folder holds a v4 checkpoint as v4 saved it (config.json with model_type "transfo-xl" and v4 parameter
names, in model.safetensors and pytorch_model.bin) and reference.safetensors with v4's outputs. Loaded through the Auto
classes with memory_init="zeros" (v4's zero-filled first memory), this package must reproduce them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from transfoxl import TransfoXLConfig, TxlForCausalLM, TxlMemory

FIXTURES = Path(__file__).parent / "fixtures" / "legacy"
NAMES = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
WEIGHT_FILES = ["model.safetensors", "pytorch_model.bin"]
ATOL, LOGPROB_ATOL = 1e-5, 1e-4


def test_every_fixture_configuration_is_present():
    assert NAMES == [
        "adaptive_div2",
        "div1_dembed_mixed_untied_emb",
        "no_cutoffs_dembed",
        "preln_samelen_clamp_shared_r",
    ]
    total = sum(path.stat().st_size for path in FIXTURES.rglob("*") if path.is_file())
    assert total < 2 * 1024 * 1024


def load_legacy(tmp_path: Path, name: str, weight_file: str) -> TxlForCausalLM:
    """A folder with only config.json and one weight file, as on the Hub, loaded through AutoModelForCausalLM."""
    shutil.copy(FIXTURES / name / "config.json", tmp_path / "config.json")
    shutil.copy(FIXTURES / name / weight_file, tmp_path / Path(weight_file).name)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, memory_init="zeros", output_loading_info=True)
    assert isinstance(model, TxlForCausalLM) and isinstance(model.config, TransfoXLConfig)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


@pytest.fixture(params=[(name, weights) for name in NAMES for weights in WEIGHT_FILES], ids=lambda p: "-".join(p))
def legacy(request, tmp_path):
    name, weight_file = request.param
    return load_legacy(tmp_path, name, weight_file), load_file(FIXTURES / name / "reference.safetensors")


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=atol)


def test_segments_with_memory(legacy):
    model, reference = legacy
    memory = None
    for segment, ids in enumerate(reference["segments.input_ids"]):
        output = model(ids, past_key_values=memory, output_hidden_states=True, output_attentions=True)
        memory = output.past_key_values
        close(output.logits, reference[f"seg{segment}.logprobs"], LOGPROB_ATOL)
        for layer, hidden in enumerate(output.hidden_states):
            close(hidden, reference[f"seg{segment}.hidden_states.{layer}"])
        close(output.hidden_states[-1], reference[f"seg{segment}.last_hidden_state"])
        for layer, weights in enumerate(output.attentions):
            close(weights, reference[f"seg{segment}.attentions.{layer}"])
        for layer, mems in enumerate(memory.to_legacy()):
            close(mems, reference[f"seg{segment}.mems.{layer}"])


def test_losses_with_memory(legacy):
    model, reference = legacy
    memory = None
    for segment, ids in enumerate(reference["segments.input_ids"]):
        output = model(ids, past_key_values=memory, labels=ids)
        memory = output.past_key_values
        close(output.loss, reference[f"seg{segment}.loss"], LOGPROB_ATOL)
        close(output.losses[:, :-1], reference[f"seg{segment}.losses"], LOGPROB_ATOL)


def test_losses_with_ignored_labels(legacy):
    model, reference = legacy
    labels = reference["masked.labels"].clone()
    output = model(reference["segments.input_ids"][0], labels=labels)
    assert torch.equal(labels, reference["masked.labels"])
    close(output.loss, reference["masked.loss"], LOGPROB_ATOL)
    close(output.losses[:, :-1], reference["masked.losses"], LOGPROB_ATOL)


def test_one_call_longer_than_mem_len(legacy):
    model, reference = legacy
    output = model(reference["long.input_ids"])
    close(output.logits, reference["long.logprobs"], LOGPROB_ATOL)
    for layer, mems in enumerate(output.past_key_values.to_legacy()):
        close(mems, reference[f"long.mems.{layer}"])


def test_continuing_from_v4_mems(legacy):
    model, reference = legacy
    mems = [reference[f"seg0.mems.{layer}"] for layer in range(model.config.n_layer)]
    output = model(reference["segments.input_ids"][1], past_key_values=TxlMemory.from_legacy(mems))
    close(output.logits, reference["seg1.logprobs"], LOGPROB_ATOL)


def test_greedy_generation(legacy):
    model, reference = legacy
    generated = model.generate(
        reference["generate.prompt"], max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    assert torch.equal(generated, reference["generate.output"])


def test_the_model_class_itself_reads_a_v4_folder(tmp_path):
    shutil.copy(FIXTURES / "adaptive_div2" / "config.json", tmp_path / "config.json")
    shutil.copy(FIXTURES / "adaptive_div2" / "model.safetensors", tmp_path / "model.safetensors")
    model, info = TxlForCausalLM.from_pretrained(tmp_path, memory_init="zeros", output_loading_info=True)
    assert isinstance(model.config, TransfoXLConfig) and not info["missing_keys"], info
    reference = load_file(FIXTURES / "adaptive_div2" / "reference.safetensors")
    close(model.eval()(reference["segments.input_ids"][0]).logits, reference["seg0.logprobs"], LOGPROB_ATOL)


def test_pre_1_6_torch_format(tmp_path):
    (tmp_path / "weights").mkdir()
    model = load_legacy(tmp_path / "weights", "adaptive_div2", "legacy_format/pytorch_model.bin")
    reference = load_file(FIXTURES / "adaptive_div2" / "reference.safetensors")
    close(model(reference["segments.input_ids"][0]).logits, reference["seg0.logprobs"], LOGPROB_ATOL)


def test_legacy_model_saves_in_the_txl_format(tmp_path):
    model = load_legacy(tmp_path, "preln_samelen_clamp_shared_r", "pytorch_model.bin")
    reference = load_file(FIXTURES / "preln_samelen_clamp_shared_r" / "reference.safetensors")
    ids = reference["segments.input_ids"][0]

    model.save_pretrained(tmp_path / "resaved")
    config = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert config["model_type"] == "txl" and config["auto_map"]["AutoConfig"] == "configuration_txl.TxlConfig"
    saved_keys = load_file(tmp_path / "resaved" / "model.safetensors").keys()
    assert "transformer.content_bias" in saved_keys and "transformer.layers.0.attention.qkv_proj.weight" in saved_keys
    assert not any("dec_attn" in key or "r_w_bias" in key for key in saved_keys)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "resaved").eval()
    assert type(reloaded.config).__name__ == "TxlConfig"
    close(reloaded(ids).logits, model(ids).logits, 0)
    close(reloaded(ids).logits, reference["seg0.logprobs"], LOGPROB_ATOL)
    # The loaded model itself is untouched by saving: still the legacy config, and it saves the same way again.
    assert isinstance(model.config, TransfoXLConfig)
    model.save_pretrained(tmp_path / "again")
    assert load_file(tmp_path / "again" / "model.safetensors").keys() == saved_keys
