"""tools/benchmark.py: the summary from hand-made results (every row, a target met and one missed, parts not run, a
failed part), the options and the command of each part, and one quick run of a part through the command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tools import benchmark


def spread(median: float) -> dict:
    return {"median": median, "min": median, "max": median, "values": [median]}


def decode_results(*, step_1: float = 0.9, quick: bool = False) -> dict:
    """decode.json as bench_decode writes it, reduced to what the summary reads."""
    mid = {
        batch: {"ratio": {"step_ms": step, "prefill_s": prefill}}
        for batch, step, prefill in (("1", step_1, 0.95), ("8", 0.8, 1.25))
    }
    v4 = {"ratio": {"transfoxl_zero_memory": {"total_s": 0.25, "peak_rss_mb": 0.7}}}
    return {
        "setup": {"quick": quick},
        "machine": {"torch_threads": 1},
        "mid": {"config_name": "mid", "summary": mid},
        "wt103": {
            "config_name": "wt103",
            "ratio_to_floor": {
                "step_paired": 1.1,
                "forward_step_each_paired": 1.15,
                "forward_step_each_paired_fastest_quarter": 1.25,
                "step": 1.3,
                "prefill": 1.4,
            },
            "v4": v4,
        },
        "wall_s": 100.0,
    }


def speed_results(config_name: str = "mid", *, with_v4: bool = True) -> dict:
    """speed.json (or speed-wt103.json) as bench_speed writes it, reduced to what the summary reads."""
    fast = config_name == "mid"
    summary: dict = {
        "transfoxl": {
            "train_tokens_per_s": spread(2500.0 if fast else 40.0),
            "train_fraction_of_matmul": 0.65 if fast else 0.3,
            "eval_fraction_of_matmul": 0.5,
        }
    }
    if with_v4:
        summary["ratio"] = {
            "train_tokens_per_s": 2.1,
            "eval_tokens_per_s": 2.4,
            "train_peak_rss_mb": 0.75,
            "train_memory_mb": 0.6,
        }
    train = {"batch": 8 if fast else 1, "tgt_len": 128, "mem_len": 128}
    return {
        "setup": {"config_name": config_name, "runs": 5 if fast else 3, "train": train},
        "machine": {"torch_threads": 2},
        "summary": summary,
        "wall_s": 300.0,
    }


def one_thread_results() -> dict:
    """decode-1thread.json: bench_decode's mid part at batch 1 with one thread, no wt103 part."""
    mid = {"1": {"ratio": {"step_ms": 0.7, "prefill_s": 0.92}}}
    return {"setup": {}, "machine": {"torch_threads": 1}, "mid": {"config_name": "mid", "summary": mid}, "wall_s": 50}


def all_results() -> dict:
    return {
        "speed": speed_results(),
        "speed-wt103": speed_results("wt103"),
        "decode": decode_results(),
        "decode-1thread": one_thread_results(),
    }


def by_label(rows: list[dict]) -> dict[str, dict]:
    return {row["label"]: row for row in rows}


def test_every_row_from_the_parts_results() -> None:
    rows = by_label(benchmark.summary_rows(all_results()))
    expected = {  # label: (value, holds)
        "mid decode step, transfoxl / GPT-2, batch 1": (0.9, True),
        "mid decode step, transfoxl / GPT-2, batch 8": (0.8, True),
        "mid prefill, transfoxl / GPT-2, batch 1": (0.95, True),
        "mid prefill, transfoxl / GPT-2, batch 8": (1.25, False),
        "mid decode step, transfoxl / GPT-2, batch 1, one torch thread": (0.7, None),
        "mid prefill, transfoxl / GPT-2, batch 1, one torch thread": (0.92, None),
        "wt103 decode step / bandwidth floor": (1.15, True),
        "wt103 decode step / bandwidth floor, the steps of the run's fastest quarter of readings": (1.25, None),
        "wt103 decode step / bandwidth floor, each generate() run against the bandwidth read before it": (1.1, None),
        "wt103 decode step / bandwidth floor at the best bandwidth of the process": (1.3, None),
        "wt103 prefill / compute floor": (1.4, False),
        "wt103 end to end, speed-up over transformers 4.37.2": (4.0, None),  # 1 / time ratio; no target
        "wt103 peak RSS, transfoxl / transformers 4.37.2": (0.7, None),
        "mid training, % of the fp32 matmul rate": (0.65, True),
        "mid training, speed-up over transformers 4.37.2": (2.1, True),
        "mid evaluation, % of the fp32 matmul rate": (0.5, False),
        "mid evaluation, speed-up over transformers 4.37.2": (2.4, False),
        "mid peak training RSS, transfoxl / transformers 4.37.2": (0.75, True),
        "mid training memory above the loaded model, transfoxl / transformers 4.37.2": (0.6, None),
        "wt103 training, tokens/s": (40.0, None),
        "wt103 training, % of the fp32 matmul rate": (0.3, None),
        "wt103 training, speed-up over transformers 4.37.2": (2.1, None),
        "wt103 peak training RSS, transfoxl / transformers 4.37.2": (0.75, None),
    }
    assert list(rows) == list(expected)  # the order
    for label, (value, holds) in expected.items():
        assert rows[label]["value"] == pytest.approx(value), label
        assert rows[label]["holds"] is holds, label
    assert "batch 1 x 128, mem_len 128, 3 runs" in rows["wt103 training, tokens/s"]["note"]

    context = {"date": "2026-01-01 00:00 UTC", "command": "python tools/benchmark.py", "machine": machine()}
    sources = {part: {"data": data, "status": "ran (1 s)", "written": "now"} for part, data in all_results().items()}
    table = benchmark.markdown(benchmark.summary_rows(all_results()), sources, context)
    assert "| mid decode step, transfoxl / GPT-2, batch 1 | 0.90x | <= 1.00x | yes |" in table
    assert "| mid prefill, transfoxl / GPT-2, batch 8 | 1.25x | <= 1.00x | **no** |" in table
    assert "| mid training, % of the fp32 matmul rate | 65% | >= 60% | yes |" in table
    assert "| mid evaluation, speed-up over transformers 4.37.2 | 2.40x | >= 2.50x | **no** |" in table
    assert "| wt103 end to end, speed-up over transformers 4.37.2 | 4.00x | none (measured) | - |" in table
    assert "| wt103 training, tokens/s | 40 tokens/s | none (measured) | - |" in table
    assert "| mid prefill, transfoxl / GPT-2, batch 1, one torch thread | 0.92x | none (measured) | - |" in table
    assert "| decode-1thread | decode-1thread.json (now, 50 s) | ran (1 s) | mid | 1 |" in table
    assert "7 of 11 measured goals with a target hold; 0 rows not run." in table
    assert "2026-01-01 00:00 UTC, `python tools/benchmark.py`" in table and "AMD EPYC, 2 cores" in table
    assert "| not run |" not in table and "Quick mode" not in table
    assert benchmark.plot_png(benchmark.summary_rows(all_results()), "title").startswith(b"\x89PNG")


def machine() -> dict:
    return {"cpu": "AMD EPYC", "cores": 2, "torch": "2.0", "torch_threads": 2, "python": "3.11"}


def test_parts_not_run_give_not_run() -> None:
    nothing = benchmark.summary_rows({part: None for part in benchmark.PARTS})
    assert all(row["value"] is None and row["holds"] is None for row in nothing)
    # without decode.json, the mid rows are those of a full run's batch sizes
    assert [row["label"] for row in nothing[:2]] == [f"mid decode step, transfoxl / GPT-2, batch {b}" for b in (1, 8)]
    sources = {part: {"data": None, "status": "not run", "written": None} for part in benchmark.PARTS}
    context = {"date": "today", "command": "python tools/benchmark.py --summary-only", "machine": machine()}
    table = benchmark.markdown(nothing, sources, context)
    assert "| wt103 prefill / compute floor | not run | <= 1.30x | not run |" in table
    assert "0 of 0 measured goals with a target hold; 23 rows not run." in table
    assert "| speed-wt103 | speed-wt103.json | not run | - | - |" in table
    assert benchmark.plot_png(nothing, "nothing").startswith(b"\x89PNG")

    # parts that ran without v4, or without their wt103 part: only those rows are missing
    results = {"speed": speed_results(with_v4=False), "speed-wt103": None, "decode": decode_results()}
    results["decode"]["wt103"] = None
    rows = by_label(benchmark.summary_rows(results))
    assert rows["mid training, % of the fp32 matmul rate"]["value"] == 0.65
    assert rows["mid training, speed-up over transformers 4.37.2"]["value"] is None
    assert rows["mid decode step, transfoxl / GPT-2, batch 8"]["value"] == 0.8
    assert rows["wt103 decode step / bandwidth floor"]["value"] is None
    results["decode"] = decode_results()
    del results["decode"]["wt103"]["v4"]  # an older decode.json, without the comparison with v4
    rows = by_label(benchmark.summary_rows(results))
    assert rows["wt103 end to end, speed-up over transformers 4.37.2"]["value"] is None
    assert rows["wt103 prefill / compute floor"]["value"] == 1.4


def test_quick_results_take_their_batch_sizes_and_say_so() -> None:
    decode = decode_results(quick=True)
    decode["mid"]["summary"] = {"1": decode["mid"]["summary"]["1"], "2": decode["mid"]["summary"]["8"]}
    rows = benchmark.summary_rows({"speed": None, "speed-wt103": None, "decode": decode})
    assert "mid prefill, transfoxl / GPT-2, batch 2" in by_label(rows)
    sources = {part: {"data": None, "status": "not run", "written": None} for part in benchmark.PARTS}
    sources["decode"] = {"data": decode, "status": "ran (1 s)", "written": "now"}
    context = {"date": "today", "command": "python tools/benchmark.py --quick", "machine": machine()}
    assert "Quick mode (tiny models)" in benchmark.markdown(rows, sources, context)


def test_sources_read_earlier_files_and_drop_a_failed_part(tmp_path: Path) -> None:
    (tmp_path / "speed.json").write_text(json.dumps(speed_results()))
    (tmp_path / "decode.json").write_text(json.dumps(decode_results()))
    sources = benchmark.load_sources(tmp_path, {"decode": {"returncode": 1, "seconds": 2.0}})
    assert sources["speed"]["status"] == "earlier run" and sources["speed"]["data"]["setup"]["config_name"] == "mid"
    assert sources["decode"]["data"] is None and sources["decode"]["status"].startswith("failed (exit 1)")
    assert sources["speed-wt103"] == {"data": None, "written": None, "status": "not run"}

    assert benchmark.main(["--summary-only", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "summary.md").read_text()
    assert "| mid training, speed-up over transformers 4.37.2 | 2.10x | >= 2.00x | yes |" in table
    assert "| mid decode step, transfoxl / GPT-2, batch 1 | 0.90x |" in table  # the earlier decode.json
    assert "`python tools/benchmark.py --summary-only --out " in table
    assert (tmp_path / "summary.png").read_bytes().startswith(b"\x89PNG")


def test_a_files_written_time_is_its_own_not_the_checkouts(tmp_path: Path) -> None:
    """The time a part recorded; for an older file without one, its commit's date while it is as committed (a clone
    sets every file's modification time to the clone's); else its modification time."""
    import os
    import subprocess

    recorded = {**speed_results(), "written_utc": "2026-01-02 03:04 UTC"}
    (tmp_path / "speed.json").write_text(json.dumps(recorded))
    (tmp_path / "decode.json").write_text(json.dumps(decode_results()))
    os.utime(tmp_path / "decode.json", (1_700_000_000, 1_700_000_000))  # 2023-11-14 22:13 UTC
    assert benchmark.load_sources(tmp_path, {})["speed"]["written"] == "2026-01-02 03:04 UTC"
    assert benchmark.load_sources(tmp_path, {})["decode"]["written"] == "2023-11-14 22:13 UTC"  # no git here

    def git(*args: str, when: str = "") -> None:
        env = {**os.environ, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when} if when else None
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, env=env)

    git("init", "-q")
    git("add", "decode.json")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "d", when="2025-05-06T07:08:00+00:00")
    os.utime(tmp_path / "decode.json")  # a checkout's time
    assert benchmark.load_sources(tmp_path, {})["decode"]["written"] == "committed 2025-05-06 07:08 UTC"
    (tmp_path / "decode.json").write_text(json.dumps(decode_results(step_1=0.5)))  # changed since its commit
    os.utime(tmp_path / "decode.json", (1_700_000_000, 1_700_000_000))
    assert benchmark.load_sources(tmp_path, {})["decode"]["written"] == "2023-11-14 22:13 UTC"


def test_options_and_the_parts_commands(tmp_path: Path) -> None:
    args = benchmark.parse_args([])
    assert args.parts == list(benchmark.PARTS) and args.out == benchmark.REPO / "benchmarks"
    commands = {part: benchmark.part_command(part, args) for part in args.parts}
    tool = str(benchmark.TOOLS / "bench_speed.py")
    out = str(benchmark.REPO / "benchmarks")
    assert commands["speed"] == [sys.executable, tool, "--out", out]
    assert commands["speed-wt103"] == [
        sys.executable,
        tool,
        "--config",
        "wt103",
        "--stem",
        "speed-wt103",
        "--out",
        out,
    ]
    assert commands["decode"] == [sys.executable, str(benchmark.TOOLS / "bench_decode.py"), "--out", out]
    one_thread = commands["decode-1thread"]
    assert one_thread[one_thread.index("--threads") + 1] == "1" and "--skip-wt103" in one_thread
    assert one_thread[one_thread.index("--batch-sizes") + 1] == "1"
    assert one_thread[one_thread.index("--stem") + 1] == "decode-1thread"

    args = benchmark.parse_args(["--only", "decode", "--only", "speed", "--skip-v4", "--threads", "1"])
    assert args.parts == ["speed", "decode"]  # in the usual order
    for part in args.parts:
        assert benchmark.part_command(part, args)[-3:] == ["--threads", "1", "--skip-v4"]
    assert benchmark.parse_args(["--summary-only"]).parts == []
    # --threads goes to every part but the one whose thread count is what it measures
    assert benchmark.part_command("decode-1thread", args).count("--threads") == 1

    quick = benchmark.parse_args(["--quick", "--out", str(tmp_path), "--threads", "1"])
    speed = benchmark.part_command("speed", quick)
    assert speed[speed.index("--config") + 1] == "tiny" and "--skip-v4" in speed and "--skip-vanilla" in speed
    wt103 = benchmark.part_command("speed-wt103", quick)
    assert wt103[wt103.index("--config") + 1] == "tiny_wt103" and "--skip-v4" in wt103
    assert wt103[wt103.index("--stem") + 1] == "speed-wt103"
    assert benchmark.part_command("decode", quick)[2:] == ["--quick", "--out", str(tmp_path), "--threads", "1"]
    assert benchmark.part_command("decode", benchmark.parse_args(["--quick", "--skip-v4", "--out", "x"]))[-1] == "x"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--summary-only", "--only", "speed"], "--summary-only and --only contradict each other"),
        (["--quick"], "--quick needs --out"),
        (["--only", "train"], "--only"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
    ],
)
def test_option_errors(capsys: pytest.CaptureFixture[str], options: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(options)
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


def test_quick_run_of_one_part(tmp_path: Path) -> None:
    """`--quick --only speed-wt103`: bench_speed in its own process on tiny_wt103, then the summary, which reads an
    earlier decode.json left in the folder."""
    (tmp_path / "decode.json").write_text(json.dumps(decode_results()))
    assert benchmark.main(["--quick", "--only", "speed-wt103", "--threads", "1", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "speed-wt103.json").read_text())
    assert results["setup"]["config_name"] == "tiny_wt103" and results["setup"]["threads"] == 1
    assert results["summary"].keys() == {"transfoxl"}  # no v4 in --quick
    assert results["written_utc"].endswith(" UTC")  # read back as the part's time
    rows = by_label(benchmark.summary_rows({"speed": None, "speed-wt103": results, "decode": None}))
    assert rows["wt103 training, tokens/s"]["value"] > 0
    assert 0 < rows["wt103 training, % of the fp32 matmul rate"]["value"] < 1
    table = (tmp_path / "summary.md").read_text()
    assert "| speed-wt103 | speed-wt103.json (" in table and "| ran (" in table and "tiny_wt103 (quick" in table
    assert "| decode | decode.json (" in table and "| earlier run |" in table
    assert "| mid training, % of the fp32 matmul rate | not run |" in table  # no speed.json
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "decode.json",
        "speed-wt103.json",
        "speed-wt103.md",
        "speed-wt103.png",
        "summary.md",
        "summary.png",
    ]


def test_a_value_that_rounds_to_its_target_shows_one_more_digit() -> None:
    """0.805x against <= 0.80x would read "0.80x ... no": the cell shows 0.805x; elsewhere two decimals."""
    row = dict(value=0.8048, kind="ratio", target=0.8, at_least=False, holds=False)
    assert benchmark.value_cell(row) == "0.805x"
    assert benchmark.value_cell({**row, "value": 0.77, "holds": True}) == "0.77x"
    assert benchmark.value_cell({**row, "kind": "percent", "value": 0.597, "target": 0.6}) == "59.7%"
    assert benchmark.value_cell({**row, "target": None, "holds": None}) == "0.80x"
