"""tools/bench_generate.py: option errors, refused before the benchmark runs (rows of the reliability table)."""

from __future__ import annotations

import pytest

from tests.utils import expect_cli_error
from tools import bench_generate

pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py


BENCH_CASES = [
    pytest.param(
        ["--batch-sizes", "1", "0"],
        ["--batch-sizes must all be >= 1, got [1, 0]"],
        id="batch-sizes",
        marks=pytest.mark.reliability(
            "bench_generate.py",
            "--batch-sizes 1 0",
            "exit 2 naming the option (a generate() error deep in the run before)",
        ),
    ),
    pytest.param(
        ["--new-tokens", "-3"],
        ["--new-tokens must be >= 1, got -3"],
        id="new-tokens",
        marks=pytest.mark.reliability("bench_generate.py", "--new-tokens -3", "exit 2 naming the option"),
    ),
    pytest.param(
        ["--out", "{tmp}"],
        ["is a folder; expected a path stem"],
        id="out-folder",
        marks=pytest.mark.reliability(
            "bench_generate.py", "--out naming a folder", "exit 2 before the benchmark runs (after it, before)"
        ),
    ),
]


@pytest.mark.parametrize(("options", "fragments"), BENCH_CASES)
def test_bench_generate_script_errors(tmp_path, capsys, record_property, options, fragments) -> None:
    options = [option.format(tmp=tmp_path) for option in [*options, "--skip-v4"]]
    expect_cli_error(record_property, bench_generate.main, options, capsys, *fragments)
