"""Shared fixtures."""

from __future__ import annotations

import pytest

from tests.utils import tiny_lm
from transfoxl import TxlForCausalLM


@pytest.fixture
def lm() -> TxlForCausalLM:
    return tiny_lm()
