"""Write docs/reliability-table.md: the bad inputs tried and the faults injected, with what happened to each.

    python tools/reliability_report.py                 # runs the marked tests, reads the harness JSONs
    python tools/reliability_report.py --slow          # also the slow ones (the 20-kill fault harness)
    python tools/reliability_report.py --no-pytest     # re-render from the last tests' JSON

The rows come from the test suite: every test marked `@pytest.mark.reliability(area, case, expected)` (see
tests/conftest.py) is one row, with the message or figure it recorded and whether it passed. The fault harness
(`fault_harness.py`) and the long runs (`long_runs.py`) add their summaries from the JSON files they write into
`benchmarks/`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", action="store_true", help="include the slow reliability tests")
    parser.add_argument("--no-pytest", action="store_true", help="do not run the tests; use --tests-json as it is")
    parser.add_argument(
        "--tests-json",
        type=Path,
        default=REPO / ".bench" / "reliability_tests.json",
        help="where the marked tests' rows are written and read (an intermediate: not tracked)",
    )
    parser.add_argument("--faults-json", type=Path, default=REPO / "benchmarks" / "faults.json")
    parser.add_argument("--long-runs-json", type=Path, default=REPO / "benchmarks" / "long_runs.json")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reliability-table.md")
    return parser.parse_args(argv)


def run_tests(json_path: Path, slow: bool) -> int:
    """The marked tests, in a child pytest that writes their rows to `json_path`; pytest's exit status."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    marks = "reliability" if slow else "reliability and not slow"
    env = {**os.environ, "TXL_RELIABILITY_JSON": str(json_path)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marks]
    print("running:", " ".join(command), flush=True)
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode


TEMPORARY_PATH = re.compile(r"/(?:private/)?(?:tmp|var/folders)/[^\s'\"]*?pytest-\d+/")


def escape(text: object) -> str:
    """A markdown table cell: one line, pipes escaped, pytest's temporary folders shortened (so that the table is
    the same from run to run), long messages shortened."""
    text = TEMPORARY_PATH.sub("<tmp>/", " ".join(str(text or "").split())).replace("|", "\\|")
    return text if len(text) <= 300 else text[:297] + "..."


def render(rows: list[dict], faults: dict | None, long_runs: dict | None) -> str:
    passed = sum(row["result"] == "passed" for row in rows)
    gaps = sum(row["result"] == "xfailed" for row in rows)
    lines = [
        "# Reliability",
        "",
        "What this package does with bad input, untrusted or damaged files, and faults during training. Every row is "
        "a test of the suite (`@pytest.mark.reliability`), with the message or figure it observed; regenerate with "
        "`python tools/reliability_report.py --slow`.",
        "",
        f"{passed} of {len(rows)} cases hold"
        + (f"; {gaps} are known gaps (tests marked xfail, with the reason in the table)." if gaps else "."),
        "",
    ]
    by_area: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_area[row["area"] or "other"].append(row)
    for area in sorted(by_area):
        heading = area if "." in area else area[:1].upper() + area[1:]  # script names stay as they are
        lines += [
            f"## {heading}",
            "",
            "| case | expected | observed | result |",
            "|---|---|---|---|",
        ]
        for row in by_area[area]:
            if row["result"] == "passed":
                result = "ok"
            elif row["result"] == "xfailed":
                result = f"known gap: {escape(row.get('reason'))}"
            else:
                result = f"**{row['result'].upper()}**"
            lines.append(
                f"| {escape(row['case'])} | {escape(row['expected'])} | {escape(row['observed'])} | {result} |"
            )
        lines.append("")
    if faults is not None:
        lines += ["## Fault harness (`fault_harness.py`)", "", render_faults(faults), ""]
    if long_runs is not None:
        lines += ["## Long runs (`long_runs.py`)", "", fenced(long_runs), ""]
    return "\n".join(lines)


def render_faults(faults: dict) -> str:
    """The harness's verdict and one row per kill."""
    summary, setup = faults["summary"], faults.get("setup", {})
    lines = [
        f"Training (`train.py {' '.join(setup.get('train_options', []))}`) SIGKILLed {summary['kills']} times at "
        f"random moments ({summary['kills_inside_checkpoint_write']} inside a checkpoint write), resumed with "
        f"`--resume` after each: {summary['kills_ok']} of {summary['kills']} kills survived, "
        f"{summary['resumes_ok']} of {summary['resumes_checked']} resumes started from the newest complete "
        f"checkpoint, {summary['checkpoints_verified']} checkpoints checked against the uninterrupted run's "
        f"({summary['corrupt_checkpoints']} corrupt), final weights "
        f"{'bitwise equal' if summary['exact_final_weights'] else 'DIFFERENT'} to the uninterrupted run's, "
        f"metrics {'equal' if summary['metrics_equal'] else 'DIFFERENT'}. Verdict: "
        f"{'passed' if summary['passed'] else '**FAILED**'}.",
        "",
        "| kill | moment | how | where it landed | resumed from | outcome |",
        "|---|---|---|---|---|---|",
    ]
    for kill in faults.get("kills", []):
        lines.append(
            f"| {kill['kill']} | {escape(kill['moment'])} | {escape(kill['killed_by'])} | {escape(kill['landed'])} | "
            f"{escape(kill['resumed_from'])} | {escape(kill['outcome'])} |"
        )
    return "\n".join(lines)


def fenced(results: dict) -> str:
    """A harness's own markdown summary when it wrote one, else its summary as JSON."""
    if isinstance(results.get("markdown"), str):
        return results["markdown"]
    return "```json\n" + json.dumps(results.get("summary", results), indent=1) + "\n```"


def load_json(path: Path) -> dict | None:
    if not path.is_file():
        print(f"note: {path} not found (run its script to add its section)")
        return None
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    status = 0
    if not args.no_pytest:
        status = run_tests(args.tests_json, args.slow)
    if not args.tests_json.is_file():
        print(f"error: {args.tests_json} does not exist: run without --no-pytest first", file=sys.stderr)
        return 2
    rows = json.loads(args.tests_json.read_text())
    from transfoxl.files import write_text_atomically

    text = render(rows, load_json(args.faults_json), load_json(args.long_runs_json))
    write_text_atomically(args.out, text)
    failed = [row for row in rows if row["result"] not in ("passed", "xfailed")]
    gaps = sum(row["result"] == "xfailed" for row in rows)
    print(f"wrote {args.out}: {len(rows)} cases, {gaps} known gaps, {len(failed)} failing")
    return status or (1 if failed else 0)


if __name__ == "__main__":
    raise SystemExit(main())
