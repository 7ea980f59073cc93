"""tools/long_runs.py: the JSON it writes, its leak check, its bounds; the real sizes under `-m slow`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import long_runs

pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py

RUN_KEYS = {
    "tokens",
    "seconds",
    "tokens_per_s",
    "rss_mb_at_start",
    "rss_mb_after_warmup",
    "rss_mb_at_end",
    "rss_mb_peak_after_warmup",
    "growth_pct",
    "peak_growth_pct",
    "samples",
}
CENSUS_KEYS = {"memories", "memory_layers", "tensors", "tensor_bytes"}


def run(out: Path, *options: str) -> tuple[int, dict]:
    status = long_runs.main(["--out", str(out), *options])
    return status, json.loads(out.read_text())


@pytest.mark.reliability(
    "long runs",
    "repeated evaluate_stream and TxlStream.generate calls (small sizes), then the stream deleted",
    "no TxlMemory / TxlMemoryLayer object and no tensor storage left behind or accumulating",
)
def test_small_long_run_writes_its_figures_and_leaks_nothing(tmp_path, record_property) -> None:
    options = ["--eval-tokens", "20000", "--generate-tokens", "300", "--generate-chunk", "100", "--repeat-calls", "3"]
    status, results = run(tmp_path / "long_runs.json", *options)

    assert set(results) >= {"setup", "evaluation", "generation", "leaks", "passed", "summary", "markdown"}
    for name in ("evaluation", "generation"):
        assert set(results[name]) >= RUN_KEYS, name
        assert results[name]["tokens_per_s"] > 0 and results[name]["samples"]
    assert results["evaluation"]["targets"] == 20000 - 8  # every token but the first of each of the 8 columns
    assert results["generation"]["tokens"] == 300 and results["generation"]["calls"] == 3
    state = results["generation"]["state"]
    assert state["memory_length"] == state["mem_len"] == 128 and state["pending"] == 1  # bounded

    leaks = results["leaks"]
    assert set(leaks["evaluation"]["before"]) == set(leaks["evaluation"]["after"]) == CENSUS_KEYS
    # The census is of the whole process: objects other tests left (torch.compile's caches) may be collected
    # meanwhile, so nothing may grow, rather than everything stay equal.
    before, after = leaks["evaluation"]["before"], leaks["evaluation"]["after"]
    assert all(after[key] <= before[key] for key in CENSUS_KEYS), (before, after)
    generation = leaks["generation"]
    # Counts are of the whole process (earlier tests' tracebacks may hold memories): compare with before the stream.
    before_stream = generation["before_the_stream"]
    assert generation["after_the_first_call"]["memories"] == before_stream["memories"] + 1  # the stream's own
    first, last = generation["after_the_first_call"], generation["after_the_last_call"]
    assert all(last[key] <= first[key] for key in ("memories", "memory_layers", "tensors")), (first, last)
    assert last["tensor_bytes"] <= first["tensor_bytes"]  # buffers are re-sized as the window slides, never grown
    assert generation["after_deleting_the_stream"]["memories"] == before_stream["memories"]
    assert generation["after_deleting_the_stream"]["tensors"] <= before_stream["tensors"]
    assert leaks["verdict"] == {"grown": {"evaluation": [], "generation_calls": [], "deleted_stream": []}, "ok": True}
    # RSS at these sizes is mostly warm-up noise: the bound is checked at the real sizes (slow test below).
    assert status == (0 if results["passed"] else 1)
    assert "| evaluation |" in results["markdown"] and "nothing accumulated" in results["markdown"]
    record_property(
        "outcome",
        f"{leaks['evaluation']['calls']} evaluations: {leaks['evaluation']['after']['memories']} memories and "
        f"{leaks['evaluation']['after']['tensors']} tensors before and after; 3 generate() calls: 1 memory more, "
        f"{generation['after_the_last_call']['tensors']} tensors after the first and the last; stream deleted: "
        f"{generation['after_deleting_the_stream']['memories'] - before_stream['memories']} memories left",
    )


def bad_option(options: list[str], message: str, case: str):
    return pytest.param(
        options, message, id=options[0].lstrip("-"), marks=pytest.mark.reliability("long_runs.py", case, "exit 2")
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        bad_option(
            ["--eval-tokens", "100"],
            "--eval-tokens must be >= --batch-size x (--tgt-len + 1) = 1032",
            "--eval-tokens 100 (less than one segment per column)",
        ),
        bad_option(["--generate-tokens", "0"], "--generate-tokens must be >= 1, got 0", "--generate-tokens 0"),
        bad_option(["--mem-len", "0"], "--mem-len must be >= 1", "--mem-len 0 (no memory to keep bounded)"),
        bad_option(["--warmup", "1.5"], "--warmup must be in [0, 1), got 1.5", "--warmup 1.5"),
    ],
)
def test_bad_options_are_refused(tmp_path, capsys, record_property, options, message) -> None:
    with pytest.raises(SystemExit) as exit_info:
        long_runs.main(["--out", str(tmp_path / "x.json"), *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err
    assert not (tmp_path / "x.json").exists()
    record_property("outcome", f"exit 2: {err}")


@pytest.mark.slow
@pytest.mark.reliability(
    "long runs",
    "streaming evaluation of 1,000,000 tokens and generation of 20,000 tokens with memory",
    "RSS growth under 5% from warm-up to the end; nothing leaks between calls",
)
def test_real_sizes_stay_within_the_memory_bound(tmp_path, record_property) -> None:
    status, results = run(tmp_path / "long_runs.json")
    evaluation, generation = results["evaluation"], results["generation"]

    def figures(name: str, run: dict) -> str:
        return (
            f"{name} of {run['tokens']:,} tokens: RSS growth {run['growth_pct']:+.2f}% (peak "
            f"{run['peak_growth_pct']:+.2f}%), {run['tokens_per_s']:,.0f} tokens/s, {run['seconds']:.0f} s"
        )

    leaks = "none" if results["leaks"]["verdict"]["ok"] else "FOUND"
    record_property(
        "outcome", f"{figures('evaluation', evaluation)}; {figures('generation', generation)}; leaks: {leaks}"
    )
    assert evaluation["tokens"] == 1_000_000 and generation["tokens"] == 20_000
    for name in ("evaluation", "generation"):
        assert results[name]["growth_pct"] < 5, (name, results[name])
    assert results["leaks"]["verdict"]["ok"], results["leaks"]
    assert status == 0 and results["passed"]
