"""tools/reliability_report.py: the table it renders from the marked tests' rows and the harnesses' JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tools import reliability_report as report

ROWS = [
    {
        "test": "tests/a.py::test_id",
        "area": "model input",
        "case": "token id 97 | vocab 97",
        "expected": "ValueError naming the id",
        "observed": "token id 97, outside the vocabulary [0, 97).",
        "result": "passed",
        "reason": "",
    },
    {
        "test": "tests/a.py::test_gap",
        "area": "tokenizer",
        "case": "decode of id -1",
        "expected": "ValueError",
        "observed": "OverflowError",
        "result": "xfailed",
        "reason": "transformers' backend",
    },
]
FAULTS = {
    "setup": {"train_options": ["--preset", "tiny"]},
    "summary": {
        "kills": 2,
        "kills_ok": 2,
        "kills_inside_checkpoint_write": 1,
        "resumes_checked": 1,
        "resumes_ok": 1,
        "checkpoints_verified": 3,
        "corrupt_checkpoints": 0,
        "exact_final_weights": True,
        "metrics_equal": True,
        "passed": True,
    },
    "kills": [
        {"kill": 1, "moment": "random", "killed_by": "timer", "landed": "training", "resumed_from": "new run"},
        {"kill": 2, "moment": "checkpoint-write", "killed_by": "staging", "landed": "inside", "resumed_from": "s-2"},
    ],
}


def write_inputs(folder: Path, rows: list[dict]) -> list[str]:
    (folder / "rows.json").write_text(json.dumps(rows))
    (folder / "faults.json").write_text(
        json.dumps({**FAULTS, "kills": [{**k, "outcome": "ok"} for k in FAULTS["kills"]]})
    )
    (folder / "long.json").write_text(json.dumps({"markdown": "| evaluation | 1,000,000 | growth -2.81% |"}))
    return [
        "--no-pytest",
        "--tests-json",
        str(folder / "rows.json"),
        "--faults-json",
        str(folder / "faults.json"),
        "--long-runs-json",
        str(folder / "long.json"),
        "--out",
        str(folder / "reliability-table.md"),
    ]


def test_report_renders_every_row_gap_and_harness(tmp_path: Path) -> None:
    assert report.main(write_inputs(tmp_path, ROWS)) == 0  # a known gap is not a failure
    text = (tmp_path / "reliability-table.md").read_text()
    assert "1 of 2 cases hold; 1 are known gaps" in text
    assert "## Model input" in text and "## Tokenizer" in text
    assert "token id 97 \\| vocab 97" in text  # pipes escaped inside cells
    assert "known gap: transformers' backend" in text
    assert "2 of 2 kills survived" in text and "bitwise equal" in text and "| 2 | checkpoint-write |" in text
    assert "growth -2.81%" in text


def test_a_failing_row_fails_the_report(tmp_path: Path) -> None:
    failing = [*ROWS, {**ROWS[0], "test": "tests/a.py::test_broken", "result": "failed"}]
    assert report.main(write_inputs(tmp_path, failing)) == 1
    assert "**FAILED**" in (tmp_path / "reliability-table.md").read_text()


def test_missing_rows_file_is_an_error_not_an_empty_table(tmp_path: Path, capsys) -> None:
    status = report.main(["--no-pytest", "--tests-json", str(tmp_path / "none.json"), "--out", str(tmp_path / "R.md")])
    assert status == 2
    assert "none.json does not exist" in capsys.readouterr().err
    assert not (tmp_path / "R.md").exists()


def test_the_table_is_written_under_docs() -> None:
    assert report.parse_args([]).out == Path(report.REPO) / "docs" / "reliability-table.md"
