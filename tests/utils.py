"""Tiny seeded configs and models for the tests (CPU, float32, seconds)."""

from __future__ import annotations

import torch

import transfoxl  # noqa: F401  (registers the Auto classes)
from tools.configs import model_config
from transfoxl import TxlConfig, TxlForCausalLM


def tiny_config(**overrides) -> TxlConfig:
    """A 2-layer model with an adaptive embedding/softmax of three clusters (tools/configs.py), mem_len 8; dropout
    off unless overridden."""
    return TxlConfig(**model_config("tiny", **{"mem_len": 8, **overrides}))


def tiny_lm(seed: int = 0, **overrides) -> TxlForCausalLM:
    """A seeded tiny LM in eval mode, with every parameter perturbed so that no bias or cluster weight is zero."""
    torch.manual_seed(seed)
    model = TxlForCausalLM(tiny_config(**overrides))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def reset_accelerate() -> None:
    """Forget accelerate's process-wide singletons, so the next Accelerator is built as in a new process."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
