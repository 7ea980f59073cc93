"""Named model + training presets: a small character-level model for this package's main job, a tiny one for tests,
and the paper's base configurations for WikiText-103 and enwik8 (Dai et al., 2019, and the original repository's
`run_wt103_base.sh` / `run_enwik8_base.sh`).

A preset is a `TxlConfig` without its vocabulary (`model`: everything but `vocab_size`; the cutoffs of the adaptive
softmax are relative to the paper's vocabulary and are dropped when they do not fit a smaller one) and the training
and evaluation settings that go with it (`training`). `scripts/train.py --preset NAME` starts from one, and any
option given on the command line overrides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .configuration_txl import TxlConfig

__all__ = ["PRESETS", "Preset", "config_from_preset"]


@dataclass(frozen=True)
class Preset:
    description: str
    model: Mapping[str, Any]
    training: Mapping[str, Any] = field(default_factory=dict)


_SMALL_MODEL = {"clamp_len": -1, "same_length": False, "cutoffs": [], "div_val": 1, "pre_lnorm": False}

PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        "2 layers of width 32: for tests and smoke runs (seconds on a CPU)",
        model={**_SMALL_MODEL, "n_layer": 2, "d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 64, "dropout": 0.0},
        training={
            "tgt_len": 16,
            "mem_len": 16,
            "batch_size": 4,
            "lr": 3e-3,
            "steps": 20,
            "warmup_steps": 2,
            "eval_tgt_len": 16,
            "eval_mem_len": 64,
            # The final evaluation stops after about this many targets per split (scripts/train.py
            # --max-eval-tokens): a smoke run on the built-in corpus would spend most of its time scoring 340k
            # characters four times. The other presets score every split whole.
            "max_eval_tokens": 65_536,
        },
    ),
    "char-small": Preset(
        "4 layers of width 128, character level: the default, a few minutes of training on 2 CPU cores",
        model={
            **_SMALL_MODEL,
            "n_layer": 4,
            "d_model": 128,
            "n_head": 4,
            "d_head": 32,
            "d_inner": 512,
            "dropout": 0.1,
            "dropatt": 0.0,
        },
        training={
            "tgt_len": 64,
            "mem_len": 64,
            "batch_size": 16,
            "lr": 2e-3,
            "steps": 1500,
            "warmup_steps": 100,
            "eval_tgt_len": 64,
            "eval_mem_len": 256,
        },
    ),
    "wt103-base": Preset(
        "the paper's WikiText-103 base model: 16 layers, d_model 410, 151M parameters with the 267k-word vocabulary",
        model={
            "n_layer": 16,
            "d_model": 410,
            "n_head": 10,
            "d_head": 41,
            "d_inner": 2100,
            "dropout": 0.1,
            "dropatt": 0.0,
            "cutoffs": [20000, 40000, 200000],
            "div_val": 1,
            "pre_lnorm": False,
            "clamp_len": -1,
            "same_length": False,
        },
        training={
            "tgt_len": 150,
            "mem_len": 150,
            "batch_size": 60,
            "lr": 2.5e-4,
            "steps": 200000,
            "warmup_steps": 0,
            "eval_tgt_len": 64,
            "eval_mem_len": 640,
            "eval_clamp_len": 400,
            "eval_same_length": True,
        },
    ),
    "enwik8-base": Preset(
        "the paper's enwik8 base model: 12 layers, d_model 512, 41M parameters, character level",
        model={
            "n_layer": 12,
            "d_model": 512,
            "n_head": 8,
            "d_head": 64,
            "d_inner": 2048,
            "dropout": 0.1,
            "dropatt": 0.0,
            "cutoffs": [],
            "div_val": 1,
            "pre_lnorm": False,
            "clamp_len": -1,
            "same_length": False,
        },
        training={
            "tgt_len": 512,
            "mem_len": 512,
            "batch_size": 22,
            "lr": 2.5e-4,
            "steps": 400000,
            "warmup_steps": 0,
            # The original code's evaluation of this model (pytorch/run_enwik8_base.sh); 3,800 / 1,000, the values
            # here before, are those of its 24-layer model
            "eval_tgt_len": 80,
            "eval_mem_len": 2100,
            "eval_clamp_len": 820,
            "eval_same_length": True,
        },
    ),
}


def config_from_preset(name: str, vocab_size: int, **overrides: Any) -> TxlConfig:
    """The `TxlConfig` of preset `name` for a vocabulary of `vocab_size` tokens, with `overrides` applied.

    Cutoffs at or above `vocab_size` are dropped (the paper's are for a 267k-word vocabulary), and `mem_len` /
    `tgt_len` come from the preset's training settings unless overridden.
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; the presets are {sorted(PRESETS)}.")
    preset = PRESETS[name]
    settings = {
        **preset.model,
        "mem_len": preset.training.get("mem_len", 0),
        "tgt_len": preset.training.get("tgt_len", 128),
    }
    settings.update({key: value for key, value in overrides.items() if value is not None})
    settings["cutoffs"] = [cutoff for cutoff in settings.get("cutoffs", []) if 0 < cutoff < vocab_size]
    if not settings["cutoffs"]:
        settings["div_val"] = 1
    return TxlConfig(vocab_size=vocab_size, **settings)
