"""Issue 17's benchmarks in one command: the four runs, then one table of the issue's goals (measured, target, holds).

The parts, each run as its own process of this interpreter (each tool starts and measures its own workers):

- `speed`: `tools/bench_speed.py`, the mid configuration's training and evaluation against transformers 4.37.2
  (`speed.{json,md,png}`);
- `speed-wt103`: `tools/bench_speed.py --config wt103 --stem speed-wt103`, training and evaluation of the
  WikiText-103 model against 4.37.2, at the small shapes that tool chooses for it (`speed-wt103.{json,md,png}`);
- `decode`: `tools/bench_decode.py`, the mid configuration's prefill and decode step against GPT-2 and the wt103
  model's against the machine's floors and against 4.37.2 (`decode.{json,md,png}`, `decode.profile.md`);
- `decode-1thread`: `tools/bench_decode.py --skip-wt103 --batch-sizes 1 --threads 1`, the mid part's batch 1
  again with one torch thread (`decode-1thread.{json,md,png}`), rows without a target: what each model costs per
  thread, apart from the phases in which this shared machine slows a second thread's many short parallel regions
  (docs/performance-log.md). `--threads` does not apply to it.

Then it reads the four JSON files from `--out` and writes `summary.md` (the goals: measured value, target, whether
it holds; the date, the machine, the command, and where each figure comes from) and `summary.png` (the ratios against
their targets). A part not run by this command (`--only`, `--summary-only`) is read from the file an earlier run left,
whose date the summary shows; a part without a file, or whose tool failed in this command, gives "not run". The
exit code is 1 when a tool failed (the summary is written all the same).

    python tools/benchmark.py                       # all four parts, into benchmarks/
    python tools/benchmark.py --skip-v4 --threads 1  # no transformers 4.37.2, one torch thread in every part
    python tools/benchmark.py --only decode          # one part; the summary reads the other files as they are
    python tools/benchmark.py --summary-only         # only the summary, from the files in --out
    python tools/benchmark.py --quick --out /tmp/bench   # tiny models, few steps, no v4: seconds (the tests)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__:  # imported (`from tools import benchmark`) or run with `python -m tools.benchmark`
    from .machine import machine_facts, png_bytes
else:  # run as a file, `python tools/benchmark.py`: its folder is the first entry of sys.path
    from machine import machine_facts, png_bytes

REPO = Path(__file__).resolve().parents[1]
TOOLS = Path(__file__).resolve().parent
PARTS = ("speed", "speed-wt103", "decode", "decode-1thread")  # also the stems of their JSON files
ONE_THREAD_PART = "decode-1thread"  # its thread count is what it measures: --threads is not passed on

# The tool and its options for each part; --out, --threads and --skip-v4 are added by `part_command`.
ONE_THREAD_ARGS = ["--skip-wt103", "--skip-profile", "--batch-sizes", "1", "--threads", "1"]
ONE_THREAD_ARGS += ["--stem", "decode-1thread"]
FULL_ARGS = {
    "speed": ["bench_speed.py"],
    "speed-wt103": ["bench_speed.py", "--config", "wt103", "--stem", "speed-wt103"],
    "decode": ["bench_decode.py"],
    "decode-1thread": ["bench_decode.py", *ONE_THREAD_ARGS],
}
# --quick: each tool's smallest run (tiny models, one run, the fewest steps), never transformers 4.37.2.
TINY_SPEED = ["--runs", "1", "--warmup-steps", "1", "--train-steps", "1", "--eval-segments", "1", "--skip-v4"]
QUICK_ARGS = {
    "speed": ["bench_speed.py", "--config", "tiny", "--skip-vanilla", *TINY_SPEED],
    "speed-wt103": ["bench_speed.py", "--config", "tiny_wt103", "--stem", "speed-wt103", *TINY_SPEED],
    "decode": ["bench_decode.py", "--quick"],
    "decode-1thread": ["bench_decode.py", "--quick", *ONE_THREAD_ARGS],
}


def part_command(part: str, args: argparse.Namespace) -> list[str]:
    """The command line of one part, run with this interpreter."""
    script, *options = (QUICK_ARGS if args.quick else FULL_ARGS)[part]
    command = [sys.executable, str(TOOLS / script), *options, "--out", str(args.out)]
    if args.threads is not None and part != ONE_THREAD_PART:
        command += ["--threads", str(args.threads)]
    if args.skip_v4 and not args.quick:  # --quick runs no v4 already
        command.append("--skip-v4")
    return command


# ---------------------------------------------------------------------------------------------------------------------
# The goals


@dataclass(frozen=True)
class Goal:
    """One row of the summary: where its value is in a part's JSON, and the issue's target for it (if any).

    `read` returns the value from that part's results, or None when the part did not measure it (v4 skipped, the
    wt103 part skipped, an older file without the key). `at_least`: the target is a lower bound (else an upper one).
    """

    label: str
    part: str
    where: str  # the key path, for the reader of the summary
    read: Callable[[Mapping[str, Any]], float | None]
    kind: str  # "ratio" (x), "percent" (a fraction shown in %), "rate" (tokens/s)
    target: float | None = None
    at_least: bool = False
    note: str = ""


def dig(data: Any, *keys: str) -> Any:
    """`data[k1][k2]...`, or None where a key is missing or a level is None."""
    for key in keys:
        if not isinstance(data, Mapping) or data.get(key) is None:
            return None
        data = data[key]
    return data


def inverse(value: float | None) -> float | None:
    return None if value is None or value == 0 else 1.0 / value


def mid_batches(decode: Mapping[str, Any] | None) -> list[str]:
    """The batch sizes of the mid part of decode.json (1 and 8 in a full run), or the full run's when it has none."""
    summary = dig(decode, "mid", "summary")
    return list(summary) if summary else ["1", "8"]


def goals(decode: Mapping[str, Any] | None) -> list[Goal]:
    """The rows of the summary, in the issue's order."""
    rows = []
    for name, what in (("step_ms", "decode step"), ("prefill_s", "prefill")):
        for batch in mid_batches(decode):
            rows.append(
                Goal(
                    f"mid {what}, transfoxl / GPT-2, batch {batch}",
                    "decode",
                    f"mid.summary.{batch}.ratio.{name}",
                    lambda data, batch=batch, name=name: dig(data, "mid", "summary", batch, "ratio", name),
                    "ratio",
                    target=1.0,
                    note="generate(), medians over runs",
                )
            )
    for name, what in (("step_ms", "decode step"), ("prefill_s", "prefill")):
        rows.append(
            Goal(
                f"mid {what}, transfoxl / GPT-2, batch 1, one torch thread",
                ONE_THREAD_PART,
                f"mid.summary.1.ratio.{name}",
                lambda data, name=name: dig(data, "mid", "summary", "1", "ratio", name),
                "ratio",
                note="as the row with a target, with torch.set_num_threads(1): the cost per thread",
            )
        )
    rows += [
        Goal(
            "wt103 decode step / bandwidth floor",
            "decode",
            "wt103.ratio_to_floor.forward_step_each_paired",
            lambda data: dig(data, "wt103", "ratio_to_floor", "forward_step_each_paired"),
            "ratio",
            target=1.2,
            note="forward calls, batch 1, each step followed by a 256 MB row_linear reading of the bandwidth; the "
            "median of the steps' ratios (the host's phase changes within a run, so a step is compared with the "
            "reading of its own moment)",
        ),
        Goal(
            "wt103 decode step / bandwidth floor, the steps of the run's fastest quarter of readings",
            "decode",
            "wt103.ratio_to_floor.forward_step_each_paired_fastest_quarter",
            lambda data: dig(data, "wt103", "ratio_to_floor", "forward_step_each_paired_fastest_quarter"),
            "ratio",
            note="as the row above, the steps whose reading after them is in the top quarter of the run's readings "
            "(their range: decode.md): what the host's fastest phase in the run gives",
        ),
        Goal(
            "wt103 decode step / bandwidth floor, each generate() run against the bandwidth read before it",
            "decode",
            "wt103.ratio_to_floor.step_paired",
            lambda data: dig(data, "wt103", "ratio_to_floor", "step_paired"),
            "ratio",
            note="generate(), batch 1; median of the runs' ratios; below 1.0 where the host's phase changed between "
            "the reading and the run",
        ),
        Goal(
            "wt103 decode step / bandwidth floor at the best bandwidth of the process",
            "decode",
            "wt103.ratio_to_floor.step",
            lambda data: dig(data, "wt103", "ratio_to_floor", "step"),
            "ratio",
            note="generate(), batch 1; median step against the best bandwidth measured in the process",
        ),
        Goal(
            "wt103 prefill / compute floor",
            "decode",
            "wt103.ratio_to_floor.prefill",
            lambda data: dig(data, "wt103", "ratio_to_floor", "prefill"),
            "ratio",
            target=1.3,
            note="generate(), batch 1",
        ),
        Goal(
            "wt103 end to end, speed-up over transformers 4.37.2",
            "decode",
            "1 / wt103.v4.ratio.transfoxl_zero_memory.total_s",
            lambda data: inverse(dig(data, "wt103", "v4", "ratio", "transfoxl_zero_memory", "total_s")),
            "ratio",
            note="generate() from v4's zero memory: the same work and tokens",
        ),
        Goal(
            "wt103 peak RSS, transfoxl / transformers 4.37.2",
            "decode",
            "wt103.v4.ratio.transfoxl_zero_memory.peak_rss_mb",
            lambda data: dig(data, "wt103", "v4", "ratio", "transfoxl_zero_memory", "peak_rss_mb"),
            "ratio",
            note="each generate() worker",
        ),
    ]
    for phase, word, speedup in (("train", "training", 2.0), ("eval", "evaluation", 2.5)):
        rows.append(
            Goal(
                f"mid {word}, % of the fp32 matmul rate",
                "speed",
                f"summary.transfoxl.{phase}_fraction_of_matmul",
                lambda data, phase=phase: dig(data, "summary", "transfoxl", f"{phase}_fraction_of_matmul"),
                "percent",
                target=0.6,
                at_least=True,
                note="model FLOPs (flops_per_token) x tokens/s, each run against the matmul rate its worker measured "
                "beside it (median of runs)",
            )
        )
        rows.append(
            Goal(
                f"mid {word}, speed-up over transformers 4.37.2",
                "speed",
                f"summary.ratio.{phase}_tokens_per_s",
                lambda data, phase=phase: dig(data, "summary", "ratio", f"{phase}_tokens_per_s"),
                "ratio",
                target=speedup,
                at_least=True,
                note=f"tokens/s, medians; the issue asks for about {speedup:g}x",
            )
        )
    rows += [
        Goal(
            "mid peak training RSS, transfoxl / transformers 4.37.2",
            "speed",
            "summary.ratio.train_peak_rss_mb",
            lambda data: dig(data, "summary", "ratio", "train_peak_rss_mb"),
            "ratio",
            target=0.8,
            note="each training worker",
        ),
        Goal(
            "mid training memory above the loaded model, transfoxl / transformers 4.37.2",
            "speed",
            "summary.ratio.train_memory_mb",
            lambda data: dig(data, "summary", "ratio", "train_memory_mb"),
            "ratio",
            note="peak RSS minus the worker's RSS once the model is loaded (the same folder; about 350 MB for both)",
        ),
        Goal(
            "wt103 training, tokens/s",
            "speed-wt103",
            "summary.transfoxl.train_tokens_per_s.median",
            lambda data: dig(data, "summary", "transfoxl", "train_tokens_per_s", "median"),
            "rate",
        ),
        Goal(
            "wt103 training, % of the fp32 matmul rate",
            "speed-wt103",
            "summary.transfoxl.train_fraction_of_matmul",
            lambda data: dig(data, "summary", "transfoxl", "train_fraction_of_matmul"),
            "percent",
        ),
        Goal(
            "wt103 training, speed-up over transformers 4.37.2",
            "speed-wt103",
            "summary.ratio.train_tokens_per_s",
            lambda data: dig(data, "summary", "ratio", "train_tokens_per_s"),
            "ratio",
        ),
        Goal(
            "wt103 peak training RSS, transfoxl / transformers 4.37.2",
            "speed-wt103",
            "summary.ratio.train_peak_rss_mb",
            lambda data: dig(data, "summary", "ratio", "train_peak_rss_mb"),
            "ratio",
        ),
    ]
    return rows


def shape_note(part: str, data: Mapping[str, Any] | None) -> str:
    """The training shape of a speed part, for the wt103 rows (`batch 1 x 128, mem_len 128`)."""
    train = dig(data, "setup", "train")
    if part != "speed-wt103" or train is None:
        return ""
    return f"batch {train['batch']} x {train['tgt_len']}, mem_len {train['mem_len']}, {data['setup']['runs']} runs"


def summary_rows(results: Mapping[str, Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """Each goal with its value (None: not run), its target, and `holds`: True, False, or None (not run, or no
    target: a measurement only)."""
    rows = []
    for goal in goals(results.get("decode")):
        data = results.get(goal.part)
        value = None if data is None else goal.read(data)
        if value is not None and not math.isfinite(value):
            value = None
        holds = None
        if value is not None and goal.target is not None:
            holds = value >= goal.target if goal.at_least else value <= goal.target
        note = "; ".join(text for text in (goal.note, shape_note(goal.part, data)) if text)
        rows.append(
            dict(
                label=goal.label,
                part=goal.part,
                where=goal.where,
                kind=goal.kind,
                value=value,
                target=goal.target,
                at_least=goal.at_least,
                holds=holds,
                note=note,
            )
        )
    return rows


def show(value: float | None, kind: str, extra_digit: bool = False) -> str:
    if value is None:
        return "not run"
    if kind == "percent":
        return f"{100 * value:.1f}%" if extra_digit else f"{100 * value:.0f}%"
    if kind == "rate":
        return f"{value:,.0f} tokens/s"
    return f"{value:.3f}x" if extra_digit else f"{value:.2f}x"


def value_cell(row: Mapping[str, Any]) -> str:
    """The measured value, with one more digit where the usual rounding reads as its target (0.805x as "0.80x")."""
    text = show(row["value"], row["kind"])
    if row["target"] is not None and row["value"] is not None and text == show(row["target"], row["kind"]):
        return show(row["value"], row["kind"], extra_digit=True)
    return text


def target_cell(row: Mapping[str, Any]) -> str:
    if row["target"] is None:
        return "none (measured)"
    return f"{'>=' if row['at_least'] else '<='} {show(row['target'], row['kind'])}"


def holds_cell(row: Mapping[str, Any]) -> str:
    if row["value"] is None:
        return "not run"
    if row["holds"] is None:
        return "-"
    return "yes" if row["holds"] else "**no**"


# ---------------------------------------------------------------------------------------------------------------------
# Output


def source_line(part: str, source: Mapping[str, Any]) -> str:
    """One row of the sources table: the file, whether this command ran it, what it holds."""
    data, status = source.get("data"), source["status"]
    name = f"{part}.json"
    if data is None:
        return f"| {part} | {name} | {status} | - | - |"
    setup, machine = data.get("setup", {}), data.get("machine", {})
    if part.startswith("decode"):
        names = [dig(data, section, "config_name") for section in ("mid", "wt103")]
        config = ", ".join(name for name in names if name) or "-"
    else:
        config = setup.get("config_name", "-")
    what = f"{config}{' (quick: not a measurement)' if source_is_quick(data) else ''}"
    threads = machine.get("torch_threads", "-")
    wall = data.get("wall_s")
    wall_text = f", {wall:.0f} s" if isinstance(wall, (int, float)) else ""
    return f"| {part} | {name} ({source['written']}{wall_text}) | {status} | {what} | {threads} |"


def markdown(rows: list[dict[str, Any]], sources: Mapping[str, Mapping[str, Any]], context: Mapping[str, Any]) -> str:
    """summary.md: the goals table, then the date, machine and command, and the sources."""
    machine = context["machine"]
    lines = [
        "# Issue 17: the benchmarks against their goals",
        "",
        f"{context['date']}, `{context['command']}`. Machine: {machine['cpu']}, {machine['cores']} cores, torch "
        f"{machine['torch']}, Python {machine['python']}; fp32 on the CPU; CPU inference attention: "
        f"{machine.get('attention_kernel', 'torch')}; torch threads per part in the sources table below.",
    ]
    if any(source_is_quick(source.get("data")) for source in sources.values()):
        lines += ["", "**Quick mode (tiny models) in at least one part: not a measurement.**"]
    lines += [
        "",
        "| goal | measured | target | holds | from | how |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {value_cell(row)} | {target_cell(row)} | {holds_cell(row)} | "
            f"{row['part']}.json `{row['where']}` | {row['note'] or '-'} |"
        )
    measured = [row for row in rows if row["holds"] is not None]
    lines += [
        "",
        f"{sum(row['holds'] for row in measured)} of {len(measured)} measured goals with a target hold; "
        f"{sum(row['value'] is None for row in rows)} rows not run.",
        "",
        "Sources (the details, each part's own table: `speed.md`, `speed-wt103.md`, `decode.md`, "
        "`decode-1thread.md`):",
        "",
        "| part | file (written) | this command | configuration | torch threads |",
        "|---|---|---|---|---|",
        *(source_line(part, sources[part]) for part in PARTS),
    ]
    return "\n".join(lines)


def source_is_quick(data: Mapping[str, Any] | None) -> bool:
    """Whether a part's results come from tiny models (bench_decode --quick, bench_speed --config tiny*)."""
    if data is None:
        return False
    setup = data.get("setup", {})
    return bool(setup.get("quick")) or str(setup.get("config_name", "")).startswith("tiny")


def plot_png(rows: list[dict[str, Any]], title: str) -> bytes:
    """Horizontal bars on a log scale (speed-ups and fractions of a target side by side): each ratio or percentage
    measured (green: holds, red: missed, grey: no target), its target as a black mark; rows not run are named,
    without a bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = [row for row in rows if row["kind"] != "rate"]  # tokens/s has no scale in common with the ratios
    figure = Figure(figsize=(10, 0.32 * len(shown) + 1.4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    axes.set_xscale("log")
    known = [value for row in shown for value in (row["value"], row["target"]) if value]
    low, high = min([0.5, *known]) / 1.5, max([2.0, *known]) * 2.0  # room for the labels right of the bars
    positions = list(range(len(shown)))[::-1]  # first goal on top
    colors = {True: "tab:green", False: "tab:red", None: "tab:grey"}
    for position, row in zip(positions, shown):
        end = low
        if row["value"]:
            axes.barh(position, row["value"] - low, 0.6, left=low, color=colors[row["holds"]])
            end = row["value"]
        if row["target"] is not None:
            axes.plot([row["target"]] * 2, [position - 0.4, position + 0.4], color="black", linewidth=2)
            end = max(end, row["target"])
        axes.text(end * 1.04, position, value_cell(row), va="center", fontsize=8)
    axes.set_yticks(positions, [row["label"] for row in shown], fontsize=8)
    axes.set_xlim(low, high)
    ticks = [tick for tick in (0.25, 0.5, 1, 2, 4, 8, 16, 32) if low <= tick <= high]
    axes.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    axes.minorticks_off()
    axes.axvline(1.0, color="grey", linewidth=0.5, linestyle=":")
    axes.set_xlabel("measured, log scale (x, or the fraction for a %); black mark: the target")
    axes.set_title(title, fontsize=10)
    return png_bytes(figure)


def written_at(path: Path, data: Mapping[str, Any]) -> str:
    """When a part's file was written: the time the part recorded in it; for a file from before it did, the date of
    the commit that last changed it ("committed ..."), since a checkout's modification times are the checkout's;
    else the file's modification time."""
    if isinstance(data.get("written_utc"), str):
        return data["written_utc"]

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True, timeout=30, check=False)

    try:
        committed = git("log", "-1", "--format=%ct", "--", path.name).stdout.strip()
        unchanged = committed.isdigit() and git("diff", "--quiet", "HEAD", "--", path.name).returncode == 0
    except (OSError, subprocess.TimeoutExpired):  # no git
        unchanged = False
    if unchanged:
        stamp = datetime.datetime.fromtimestamp(int(committed), tz=datetime.UTC)
        return "committed " + stamp.strftime("%Y-%m-%d %H:%M UTC")
    stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def load_sources(out: Path, ran: Mapping[str, dict]) -> dict[str, dict[str, Any]]:
    """Each part's JSON file in `out` with its status: run now, failed now (its file ignored), from an earlier run, or
    absent."""
    sources = {}
    for part in PARTS:
        path = out / f"{part}.json"
        entry: dict[str, Any] = {"data": None, "written": None}
        if part in ran and ran[part]["returncode"] != 0:
            entry["status"] = f"failed (exit {ran[part]['returncode']}): not run"
        elif not path.is_file():
            entry["status"] = "ran, wrote no file" if part in ran else "not run"
        else:
            entry["data"] = json.loads(path.read_text())
            entry["written"] = written_at(path, entry["data"])
            entry["status"] = f"ran ({ran[part]['seconds']:.0f} s)" if part in ran else "earlier run"
        sources[part] = entry
    return sources


def write_summary(out: Path, ran: Mapping[str, dict], command: str) -> list[dict[str, Any]]:
    """Read the parts' files in `out`; write summary.md and summary.png; return the rows."""
    from transfoxl.files import write_bytes_atomically, write_text_atomically

    sources = load_sources(out, ran)
    rows = summary_rows({part: source["data"] for part, source in sources.items()})
    now = datetime.datetime.now(tz=datetime.UTC)
    context = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "command": command, "machine": machine_facts()}
    table = markdown(rows, sources, context)
    print("\n" + table, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / "summary.md", table + "\n")
    title = f"Issue 17 goals, {context['date']}" + (
        " (quick: not a measurement)" if any(source_is_quick(s["data"]) for s in sources.values()) else ""
    )
    write_bytes_atomically(out / "summary.png", plot_png(rows, title))
    print(f"\nwrote summary.md, summary.png into {out}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmark.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.rsplit("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=PARTS,
        help="run this part (repeatable; default: all four); the summary reads the others' existing files",
    )
    parser.add_argument("--summary-only", action="store_true", help="run nothing: the summary of the files in --out")
    parser.add_argument("--skip-v4", action="store_true", help="passed to every part: no transformers 4.37.2")
    parser.add_argument(
        "--threads", type=int, help=f"torch threads, passed to every part but {ONE_THREAD_PART} (default: each tool's)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny models, one run, the fewest steps, no v4 (seconds: the tests); needs --out",
    )
    parser.add_argument("--out", type=Path, help="folder of the parts' files and the summary (default: benchmarks/)")
    args = parser.parse_args(argv)
    if args.summary_only and args.only:
        parser.error("--summary-only and --only contradict each other")
    if args.quick and args.out is None:
        parser.error("--quick needs --out: its tiny runs are no measurement and would replace benchmarks/")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.out is None:
        args.out = REPO / "benchmarks"
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file; expected a folder")
    args.parts = [] if args.summary_only else [part for part in PARTS if not args.only or part in args.only]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shown_argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "tools/benchmark.py", *shown_argv])
    ran: dict[str, dict] = {}
    for part in args.parts:
        part_argv = part_command(part, args)
        print(f"\n=== {part}: {shlex.join(part_argv)}", flush=True)
        started = time.perf_counter()
        process = subprocess.run(part_argv, cwd=REPO, check=False)
        ran[part] = {"returncode": process.returncode, "seconds": time.perf_counter() - started}
        print(f"=== {part}: exit {process.returncode} after {ran[part]['seconds']:.0f} s", flush=True)
    write_summary(args.out, ran, command)
    failed = [part for part, run in ran.items() if run["returncode"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
