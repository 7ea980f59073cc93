"""Shared fixtures, and the reliability report.

Tests marked `@pytest.mark.reliability(area, case, expected)` are the rows of the reliability table
(docs/reliability-table.md): a bad input tried or a fault injected, and what must happen. A test may add what
actually happened (the error message it caught, a measured figure) with `record_property("outcome", text)`. With the
environment variable `TXL_RELIABILITY_JSON` set to a path, the run writes those rows there with their results;
`tools/reliability_report.py` runs that and renders the table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.utils import reset_accelerate, tiny_lm
from transfoxl import TxlForCausalLM

_RELIABILITY_ROWS: list[dict] = []


@pytest.fixture
def lm() -> TxlForCausalLM:
    return tiny_lm()


@pytest.fixture
def fresh_accelerate_state() -> Iterator[None]:
    """The test builds its Accelerator as a new process would (accelerate keeps process-wide singletons); modules
    that train use it for every test (`pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")`)."""
    reset_accelerate()
    yield
    reset_accelerate()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: a tiny model gains nothing from more, and other tests may share the CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("reliability")
    if marker is None or not os.environ.get("TXL_RELIABILITY_JSON"):
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        fields = dict(zip(("area", "case", "expected"), marker.args), **marker.kwargs)
        observed = [str(value) for name, value in report.user_properties if name == "outcome"]
        _RELIABILITY_ROWS.append(
            {
                "test": item.nodeid,
                "area": fields.get("area"),
                "case": fields.get("case"),
                "expected": fields.get("expected"),
                "observed": "; ".join(observed),
                # passed / failed / skipped, or xfailed: a known gap, marked xfail(strict=True) with its reason
                "result": "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome,
                "reason": getattr(report, "wasxfail", ""),
            }
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("TXL_RELIABILITY_JSON")
    if path:
        Path(path).write_text(json.dumps(_RELIABILITY_ROWS, indent=1) + "\n")
