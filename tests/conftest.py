"""Shared fixtures, and the reliability report.

Tests marked `@pytest.mark.reliability(area, case, expected)` are the rows of the reliability table
(docs/reliability-table.md): a bad input tried or a fault injected, and what must happen. A test may add what
actually happened (the error message it caught, a measured figure) with `record_property("outcome", text)`. With the
environment variable `TXL_RELIABILITY_JSON` set to a path, the run writes those rows there with their results;
`tools/reliability_report.py` runs that and renders the table.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.utils import reset_accelerate, tiny_lm
from transfoxl import TxlForCausalLM, cpp_kernels_txl
from transfoxl.presets import config_from_preset
from transfoxl.tokenization.tokenization_txl import train_char_level

_RELIABILITY_ROWS: list[dict] = []


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels_built() -> None:
    """The CPU attention kernel built (or loaded) before any test, where this machine supports it: the build's
    one-time notice would otherwise land in the output of whichever test, maybe a command line's, came first."""
    cpp_kernels_txl.compiled_operators()


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


# ---------------------------------------------------------------------------------------------------------------------
# Shared by the reliability rows of several test files


@pytest.fixture(scope="module")
def scripts() -> dict[str, ModuleType]:
    return {
        name: importlib.import_module(f"transfoxl.cli.{name}") for name in ("evaluate", "train_tokenizer", "publish")
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny model (tgt_len 8, mem_len 8) with its character tokenizer, and texts next to it: what the
    command lines' rows (evaluate, train_tokenizer, publish) run on. test_checkpoints.py has its own `model_dir`."""
    root = tmp_path_factory.mktemp("cli")
    tokenizer = train_char_level(["the cat sat on the mat\n"])
    torch.manual_seed(0)
    model = TxlForCausalLM(config_from_preset("tiny", len(tokenizer), tgt_len=8, mem_len=8))
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "ok.txt").write_text("the cat sat on the mat\n" * 20, encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "blank.txt").write_text("\n  \n\n", encoding="utf-8")
    (root / "short.txt").write_text("cat\n", encoding="utf-8")
    (root / "binary.txt").write_bytes(b"\xff\xfe\x00\x01binary")
    return root / "model"


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    """The file that the payloads create if anything in them runs."""
    return tmp_path / "pwned"


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
