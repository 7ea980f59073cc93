"""TxlConfig: defaults, aliases, legacy v4 config.json files, validation messages, round trips; settings that make
no sense, each a row of docs/reliability-table.md (`@pytest.mark.reliability`), and two accepted on purpose."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig

from tests.utils import case, expect_error, ids, tiny_config, tiny_lm
from transfoxl import TransfoXLConfig, TxlConfig, TxlForCausalLM

V4_DEFAULTS = {  # transformers 4.37.2 TransfoXLConfig defaults
    "vocab_size": 267735,
    "cutoffs": [20000, 40000, 200000],
    "d_model": 1024,
    "d_embed": 1024,
    "n_head": 16,
    "d_head": 64,
    "d_inner": 4096,
    "div_val": 4,
    "pre_lnorm": False,
    "n_layer": 18,
    "mem_len": 1600,
    "clamp_len": 1000,
    "same_length": True,
    "tie_projs": [False, True, True, True],
    "untie_r": True,
    "dropout": 0.1,
    "dropatt": 0.0,
    "init": "normal",
    "init_range": 0.01,
    "proj_init_std": 0.01,
    "init_std": 0.02,
    "layer_norm_epsilon": 1e-5,
    "eos_token_id": 0,
    "tie_word_embeddings": True,
}


def test_new_configs_have_no_end_of_sequence_token_by_default():
    # v4's eos 0 is an ordinary token of a new vocabulary: generation would stop on it.
    assert TxlConfig().eos_token_id is None


def test_legacy_config_has_v4_defaults():
    # v4 omitted default values from config.json, so an empty legacy config must mean v4's defaults.
    config = TransfoXLConfig()
    for name, value in V4_DEFAULTS.items():
        assert getattr(config, name) == value, name


def test_new_config_follows_d_model_for_d_embed():
    assert TxlConfig(d_model=256).d_embed == 256
    assert TxlConfig(d_model=256, d_embed=128).d_embed == 128


def test_standard_aliases_read_and_write_the_txl_fields():
    config = TxlConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, head_dim=32, intermediate_size=99)
    assert (config.d_model, config.n_layer, config.n_head, config.d_head, config.d_inner) == (64, 3, 2, 32, 99)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 3, 2)
    assert config.initializer_range == config.init_std
    assert config.layer_norm_eps == config.layer_norm_epsilon


def test_legacy_config_json_with_old_names_and_extra_keys(tmp_path):
    legacy = {
        "model_type": "transfo-xl",
        "architectures": ["TransfoXLLMHeadModel"],
        "n_token": 1000,
        "cutoffs": [100, 500],
        "d_model": 64,
        "d_embed": 64,
        "n_head": 2,
        "d_head": 32,
        "d_inner": 128,
        "div_val": 2,
        "n_layer": 2,
        "tgt_len": 128,
        "ext_len": 0,
        "mem_len": 32,
        "attn_type": 0,
        "sample_softmax": -1,
        "adaptive": True,
        "tie_weight": False,
        "proj_share_all_but_first": False,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 250}},
    }
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is TransfoXLConfig
    assert config.vocab_size == 1000 and config.tgt_len == 128 and config.mem_len == 32
    assert config.tie_projs == [False, False, False]  # from proj_share_all_but_first=False
    assert config.tie_word_embeddings is False  # from tie_weight
    for gone in ("attn_type", "sample_softmax", "adaptive", "ext_len", "tie_weight"):
        assert not hasattr(config, gone), gone


def test_a_legacy_tie_projs_shorter_than_the_clusters_leaves_the_rest_untied_as_v4_did():
    assert TransfoXLConfig(cutoffs=[10, 20], vocab_size=30, tie_projs=[False, True]).tie_projs == [False, True, False]
    with pytest.raises(ValueError, match="needs one entry per cluster"):
        TxlConfig(cutoffs=[10, 20], vocab_size=30, tie_projs=[False, True])  # (a new config: a slip, refused)


def test_saved_tie_projs_win_over_proj_share_all_but_first():
    assert TxlConfig(cutoffs=[10, 20], vocab_size=30, tie_projs=[True, False, True]).tie_projs == [True, False, True]
    assert TxlConfig(cutoffs=[10, 20], vocab_size=30).tie_projs == [False, True, True]
    assert TxlConfig(cutoffs=[10], vocab_size=30, proj_share_all_but_first=False).tie_projs == [False, False]


def test_round_trip_and_memory_init_override(tmp_path):
    config = TxlConfig(vocab_size=50, cutoffs=[10], d_model=16, n_layer=1, mem_len=4, memory_init="zeros")
    config.save_pretrained(tmp_path)
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert type(reloaded) is TxlConfig
    assert reloaded.to_diff_dict() == config.to_diff_dict()
    assert AutoConfig.from_pretrained(tmp_path, memory_init="empty").memory_init == "empty"


def test_legacy_config_converts_to_txl():
    legacy = TransfoXLConfig(vocab_size=100, cutoffs=[20], d_model=32, n_layer=1)
    config = TxlConfig.from_legacy(legacy)
    assert type(config) is TxlConfig and config.to_dict()["model_type"] == "txl"
    assert type(TxlConfig.from_dict(legacy.to_dict())) is TransfoXLConfig  # a v4 dict read through TxlConfig
    assert config.d_embed == 1024 and config.cutoffs == [20]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cutoffs": [50, 20]}, "`cutoffs` must be strictly increasing"),
        ({"cutoffs": [20, 20]}, "`cutoffs` must be strictly increasing"),
        ({"cutoffs": [20, 100]}, "`cutoffs` must lie strictly between 0 and vocab_size=100"),
        ({"cutoffs": [0, 20]}, "`cutoffs` must lie strictly between 0 and vocab_size=100"),
        ({"div_val": 0}, "`div_val` must be an integer >= 1, got 0"),
        ({"mem_len": -1}, "`mem_len` must be an integer >= 0, got -1"),
        ({"tgt_len": -5}, "`tgt_len` must be an integer >= 0 or None, got -5"),
        ({"d_model": 0}, "`d_model` must be an integer >= 1, got 0"),
        ({"d_model": 33}, "`d_model` must be even"),
        ({"n_layer": 2.5}, "`n_layer` must be an integer >= 1, got 2.5"),
        ({"vocab_size": -3, "cutoffs": []}, "`vocab_size` must be an integer >= 1, got -3"),
        ({"dropout": 1.0}, "`dropout` must be a probability in [0, 1), got 1.0"),
        ({"dropatt": -0.1}, "`dropatt` must be a probability in [0, 1), got -0.1"),
        ({"memory_init": "random"}, "`memory_init` must be one of ('empty', 'zeros'), got 'random'"),
        ({"init": "xavier"}, "`init` must be one of ('normal', 'uniform'), got 'xavier'"),
        ({"tie_projs": [True]}, "`tie_projs` needs one entry per cluster (len(cutoffs) + 1 = 3)"),
        ({"eos_token_id": 100}, "`eos_token_id` must be None or a token id in [0, 100), got 100"),
        ({"d_embed": 8, "div_val": 4}, "gives the last of 3 clusters an embedding of width 0"),
        ({"attn_type": 2}, "attn_type=2 is not supported"),
        ({"sample_softmax": 1000}, "sample_softmax=1000 is not supported"),
    ],
)
def test_bad_configs_fail_at_construction_naming_the_field(overrides, message):
    values = {"vocab_size": 100, "cutoffs": [20, 50], "d_model": 32, "d_embed": 32, "n_layer": 1, **overrides}
    with pytest.raises(ValueError) as error:
        TxlConfig(**values)
    assert message in str(error.value)


def test_unsupported_legacy_options_fail_when_loading_a_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "transfo-xl", "attn_type": 1}))
    with pytest.raises(ValueError, match="attn_type=1 is not supported"):
        AutoConfig.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# Settings that make no sense, and two that look odd but are accepted (rows of the reliability table)
# These tests run on one intra-op thread (`one_thread`, tests/conftest.py).

CONFIG = {"vocab_size": 100, "cutoffs": [20, 50], "d_model": 32, "d_embed": 32, "n_head": 4, "d_head": 8, "n_layer": 1}


def config_case(name: str, overrides: dict, match: str, id: str, expected: str = "ValueError naming the field"):
    return case("config", name, expected, ValueError, match, lambda: TxlConfig(**{**CONFIG, **overrides}), id)


CONFIG_CASES = [
    config_case(
        "cutoffs [50, 20] (not increasing)",
        {"cutoffs": [50, 20]},
        r"`cutoffs` must be strictly increasing, got \[50, 20\]",
        "cutoffs-order",
    ),
    config_case(
        "cutoffs [20, 100] with vocab_size 100",
        {"cutoffs": [20, 100]},
        r"`cutoffs` must lie strictly between 0 and vocab_size=100, got \[20, 100\]",
        "cutoffs-vocab",
    ),
    case(  # a small vocabulary without cutoffs meets WikiText-103's default clusters
        "config",
        "vocab_size 100 and no cutoffs (the default [20000, 40000, 200000])",
        "ValueError naming the default and the way out",
        ValueError,
        r"got \[20000, 40000, 200000\] \(the default, WikiText-103's clusters\); pass cutoffs=\[\] for one full",
        lambda: TxlConfig(**{key: value for key, value in CONFIG.items() if key != "cutoffs"}),
        "cutoffs-default",
    ),
    config_case(
        "cutoffs [0, 20]",
        {"cutoffs": [0, 20]},
        "`cutoffs` must lie strictly between 0 and vocab_size=100",
        "cutoffs-zero",
    ),
    config_case(
        "cutoffs [20.5, 50] (silently truncated to 20 before)",
        {"cutoffs": [20.5, 50]},
        r"`cutoffs` must be a list of integer token ids .* got \[20.5, 50\]",
        "cutoffs-float",
    ),
    config_case(
        "cutoffs=20 (TypeError: not iterable, before)",
        {"cutoffs": 20},
        r"`cutoffs` must be a list of integer token ids .* got 20",
        "cutoffs-int",
    ),
    config_case("div_val 0", {"div_val": 0}, "`div_val` must be an integer >= 1, got 0", "div-val"),
    config_case("mem_len -1", {"mem_len": -1}, "`mem_len` must be an integer >= 0, got -1", "mem-len"),
    config_case("mem_len 2.5", {"mem_len": 2.5}, "`mem_len` must be an integer >= 0, got 2.5", "mem-len-float"),
    config_case(
        "clamp_len 2.5",
        {"clamp_len": 2.5},
        r"`clamp_len` must be an integer \(0 or less: no clamping\)",
        "clamp-len-float",
    ),
    config_case("dropout 1.0", {"dropout": 1.0}, r"`dropout` must be a probability in \[0, 1\), got 1.0", "dropout"),
    config_case(
        "dropatt -0.1", {"dropatt": -0.1}, r"`dropatt` must be a probability in \[0, 1\), got -0.1", "dropatt"
    ),
    config_case(
        "d_model 33 (odd: the sinusoid pairs sin and cos)",
        {"d_model": 33, "d_embed": 32},
        "`d_model` must be even",
        "d-model-odd",
    ),
    config_case("n_layer 0", {"n_layer": 0}, "`n_layer` must be an integer >= 1, got 0", "n-layer"),
    config_case(
        "vocab_size 0", {"vocab_size": 0, "cutoffs": []}, "`vocab_size` must be an integer >= 1, got 0", "vocab-size"
    ),
    config_case(
        "d_embed 8, div_val 4, 3 clusters (last width 0)",
        {"d_embed": 8, "div_val": 4},
        "gives the last of 3 clusters an embedding of width 0",
        "cluster-width",
    ),
    config_case(
        "layer_norm_epsilon 'a' (TypeError before)",
        {"layer_norm_epsilon": "a"},
        "`layer_norm_epsilon` must be > 0, got 'a'",
        "layer-norm-eps",
    ),
    config_case(
        "init_std -1 (RuntimeError in torch's init before)",
        {"init_std": -1.0},
        "`init_std` must be a number >= 0",
        "init-std",
    ),
    config_case(
        "pre_lnorm 'no' (truthy: silently pre-LN before)",
        {"pre_lnorm": "no"},
        "`pre_lnorm` must be a bool, got 'no'",
        "pre-lnorm",
    ),
    config_case(
        "tie_word_embeddings 'no' (bool('no') was True before)",
        {"tie_word_embeddings": "no"},
        "`tie_word_embeddings` must be a bool, got 'no'",
        "tie-word-embeddings",
    ),
    config_case(
        "return_logits 'yes'",
        {"return_logits": "yes"},
        "`return_logits` must be a bool or None, got 'yes'",
        "return-logits",
    ),
    config_case(
        "tie_projs [True] for 3 clusters",
        {"tie_projs": [True]},
        r"`tie_projs` needs one entry per cluster \(len\(cutoffs\) \+ 1 = 3\)",
        "tie-projs-length",
    ),
    config_case(
        "tie_projs ['a', None, 1]",
        {"tie_projs": ["a", None, 1]},
        "`tie_projs` must be a list of bools",
        "tie-projs-values",
    ),
    config_case("num_labels 0", {"num_labels": 0}, "`num_labels` must be an integer >= 1, got 0", "num-labels"),
    config_case(
        "eos_token_id 100 with vocab_size 100",
        {"eos_token_id": 100},
        r"`eos_token_id` must be None or a token id in \[0, 100\), got 100",
        "eos",
    ),
    config_case(
        "memory_init 'random'",
        {"memory_init": "random"},
        r"`memory_init` must be one of \('empty', 'zeros'\), got 'random'",
        "memory-init",
    ),
    config_case("attn_type 2 (legacy)", {"attn_type": 2}, "attn_type=2 is not supported", "attn-type"),
    case(
        "config",
        "attn_implementation='flash_attention_2'",
        "ValueError (transformers): not supported",
        ValueError,
        "does not support Flash Attention 2",
        lambda: TxlForCausalLM._from_config(tiny_config(), attn_implementation="flash_attention_2"),
        "flash",
    ),
    case(
        "config",
        "attn_implementation='bogus'",
        "ValueError (transformers) listing eager and sdpa",
        ValueError,
        'Specified `attn_implementation="bogus"` is not supported',
        lambda: TxlForCausalLM._from_config(tiny_config(), attn_implementation="bogus"),
        "bogus-attention",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), CONFIG_CASES)
@pytest.mark.usefixtures("one_thread")
def test_config_refuses_settings_that_make_no_sense(record_property, error, match, call) -> None:
    expect_error(record_property, error, match, call)


@pytest.mark.reliability(
    "config",
    "n_head * d_head (3 x 5) != d_model (32)",
    "accepted: as in the paper's code, the heads' output is projected back to d_model",
)
@pytest.mark.usefixtures("one_thread")
def test_heads_need_not_multiply_to_d_model(record_property) -> None:
    model = tiny_lm(n_head=3, d_head=5)
    loss = model(ids(), labels=ids()).loss
    loss.backward()
    assert torch.isfinite(loss)
    record_property("outcome", f"accepted: forward and backward run, loss {loss.item():.3f}")


@pytest.mark.reliability("config", "clamp_len -5", "accepted: documented (and v4's) value for no clamping")
@pytest.mark.usefixtures("one_thread")
def test_negative_clamp_len_means_no_clamping(record_property) -> None:
    unclamped, negative = tiny_lm(clamp_len=0), tiny_lm(clamp_len=-5)
    with torch.no_grad():
        difference = (unclamped(ids()).logits - negative(ids()).logits).abs().max().item()
    assert difference == 0
    record_property("outcome", "accepted: the same outputs as clamp_len 0 (no clamping)")
