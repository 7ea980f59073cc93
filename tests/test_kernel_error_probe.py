"""tools/kernel_error_probe.py: the package's own build refuses bad input with a RuntimeError in every case, and a
process that dies is reported by its signal (the probe is for toolchains where a refusal crashed the process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tools import kernel_error_probe
from transfoxl.cpp_kernels_txl import compiled_operators


def test_every_refusal_of_the_package_s_build_raises(tmp_path: Path) -> None:
    if compiled_operators() is None:
        pytest.skip("the compiled kernels are for Linux on x86-64 with AVX2")
    assert kernel_error_probe.main(["--variants", "default", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "kernel_errors.json").read_text())
    cases = results["variants"]["default"]["cases"]
    assert set(cases) == set(kernel_error_probe.CASES)
    assert all(entry["outcome"] == "raised" and entry["message"] for entry in cases.values()), cases
    assert "3 tensors per cluster" in cases["softmax_row_count"]["message"]
    assert "must be a matrix" in cases["torch_mm_shape"]["message"]
    assert "| default | built | raised |" in (tmp_path / "kernel_errors.md").read_text()


def test_a_process_that_dies_is_reported_by_its_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dies = tmp_path / "dies"
    dies.write_text("#!/bin/sh\nkill -SEGV $$\n")
    dies.chmod(0o755)
    monkeypatch.setattr(kernel_error_probe.sys, "executable", str(dies))
    assert kernel_error_probe._run("default", "softmax_row_count", timeout=30)["outcome"] == "killed by SIGSEGV"


def test_an_unnamed_signal_is_reported_by_its_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dies = tmp_path / "dies"
    dies.write_text("#!/bin/sh\nkill -s RTMIN+3 $$ 2>/dev/null || kill -42 $$\n")
    dies.chmod(0o755)
    monkeypatch.setattr(kernel_error_probe.sys, "executable", str(dies))
    assert kernel_error_probe._run("default", "softmax_row_count", timeout=30)["outcome"].startswith(
        "killed by signal "
    )


def test_a_refusal_that_lets_bad_input_through_is_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case whose call returns instead of raising ("no error") fails the probe like a crash."""
    outcomes = {"build": {"outcome": "built"}, "row_linear_dtype": {"outcome": "no error", "message": None}}
    monkeypatch.setattr(
        kernel_error_probe,
        "_run",
        lambda variant, case, timeout: outcomes.get(case, {"outcome": "raised", "message": "refused"}),
    )
    assert kernel_error_probe.main(["--variants", "default", "--out", str(tmp_path)]) == 1
    assert "default/row_linear_dtype: no error (expected: raised)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--variants", "default,c++23"], "--variants: unknown c++23"),
        (["--variants", ""], "--variants: none given"),
        (["--variants", "default", "--out", os.devnull], "exists and is not a folder"),
        (["--variants", "default"], "--out is required"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(arguments, message, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        kernel_error_probe.main(arguments)
    assert message in capsys.readouterr().err


def test_nothing_probed_is_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the kernels turned off the builds fail: the exit status says so, and the reason is printed."""
    monkeypatch.setenv("TRANSFOXL_CPU_KERNEL", "0")
    assert kernel_error_probe.main(["--variants", "default", "--out", str(tmp_path)]) == 1
    results = json.loads((tmp_path / "kernel_errors.json").read_text())
    assert results["variants"]["default"]["build"]["outcome"] == "exit status 1"
    assert "TRANSFOXL_CPU_KERNEL=0" in results["variants"]["default"]["build"]["stderr"][-1]
