"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.utils import tiny_lm
from transfoxl import TxlForCausalLM


@pytest.fixture
def lm() -> TxlForCausalLM:
    return tiny_lm()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: a tiny model gains nothing from more, and other tests may share the CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
