"""tools/bench_decode.py: a quick run on tiny models (both parts, the profile), the counts by hand, options, and
the comparison with transformers 4.37.2 fed by hand (its virtualenv is never made here)."""

from __future__ import annotations

import ast
import json
import math
import os
import statistics
import sys
from pathlib import Path

import pytest
import torch

from tests.utils import run_fresh_python
from tools import bench_decode, bench_speed, machine
from tools.configs import CONFIGS, model_config
from transfoxl import TxlConfig
from transfoxl.cpp_kernels_txl import compiled_operators


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`--quick`: the mid part on the tiny config against a tiny GPT-2, the profile, and the wt103 part on
    `tiny_wt103` in its worker process; one thread (other tests may share the CPU). The output folder."""
    out = tmp_path_factory.mktemp("decode")
    assert bench_decode.main(["--quick", "--threads", "1", "--out", str(out)]) == 0
    return out


def positive_finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_spread(entry: dict, count: int) -> None:
    assert len(entry["values"]) == count and all(positive_finite(value) for value in entry["values"]), entry
    assert entry["min"] <= entry["median"] <= entry["max"]


def test_quick_run_mid_part(quick_run: Path) -> None:
    results = json.loads((quick_run / "decode.json").read_text())
    assert set(results) >= {"setup", "machine", "mid", "wt103", "wall_s", "written_utc"}
    assert results["setup"]["quick"] and results["machine"]["torch_threads"] == 1
    mid = results["mid"]
    assert mid["config_name"] == "tiny" and mid["config"]["mem_len"] == 16
    assert mid["gpt2_config"]["n_positions"] == 16 + 5 and mid["gpt2_config"]["n_embd"] == CONFIGS["tiny"]["d_model"]
    assert set(mid["summary"]) == {"1", "2"}  # the quick batch sizes
    for batch, entry in mid["summary"].items():
        for impl in ("transfoxl", "gpt2"):
            runs = mid["runs"][batch][impl]
            assert len(runs) == 1
            assert len(runs[0]["steps_s"]) == len(runs[0]["forward_steps_s"]) == 5 - 1  # first token: prefill
            assert runs[0]["same_tokens"] is True  # generate() and the bare forward loop agree
            for name in ("prefill_s", "step_ms", "forward_prefill_s", "forward_step_ms", "total_s"):
                check_spread(entry[impl][name], 1)
            assert entry[impl]["step_ms"]["median"] == pytest.approx(1e3 * runs[0]["step_s"])
            assert entry[impl]["total_s"]["median"] > entry[impl]["prefill_s"]["median"]
            overhead = entry[impl]["step_ms"]["median"] - entry[impl]["forward_step_ms"]["median"]
            assert entry[impl]["generate_overhead_ms"] == pytest.approx(overhead)
        for name, ratio in entry["ratio"].items():  # ratios of the medians
            assert ratio == pytest.approx(entry["transfoxl"][name]["median"] / entry["gpt2"][name]["median"])
        assert entry["paired_ratios"]["step_ms"] == [pytest.approx(entry["ratio"]["step_ms"])]  # one run each

    table = (quick_run / "decode.md").read_text()
    assert "Quick mode" in table and "| 1 | decode step, generate() (ms) |" in table
    assert "| 2 | prefill, forward (s) |" in table
    assert (quick_run / "decode.png").read_bytes().startswith(b"\x89PNG")


def test_fastest_quarter_of_the_readings() -> None:
    assert bench_decode.fastest_quarter([1.0, 5.0, 3.0, 4.0, 2.0, 6.0, 7.0, 8.0]) == [7, 6]
    assert bench_decode.fastest_quarter([3.0, 9.0, 1.0]) == [1]  # at least one
    assert bench_decode.fastest_quarter([2.0]) == [0]


def test_quick_run_wt103_part(quick_run: Path) -> None:
    wt103 = json.loads((quick_run / "decode.json").read_text())["wt103"]
    assert wt103["config_name"] == "tiny_wt103" and wt103["threads"] == 1
    assert wt103["same_tokens"] is True and len(wt103["runs"]) == 1
    for name in ("prefill_s", "forward_prefill_s", "step_ms", "forward_step_ms", "total_s"):
        check_spread(wt103["measured"][name], 1)
    floors = wt103["floors"]
    assert all(positive_finite(value) for value in floors.values()), floors
    measured = wt103["measured"]
    assert wt103["ratio_to_floor"]["prefill"] == pytest.approx(measured["prefill_s"]["median"] / floors["prefill_s"])
    assert wt103["ratio_to_floor"]["step"] == pytest.approx(measured["step_ms"]["median"] / floors["step_ms"])
    # each run against the floor at the bandwidth measured just before it; the process's best is at least that
    (run,) = wt103["runs"]
    run_bandwidth = max(run["mv_gbytes_per_s_before"].values())
    assert wt103["run_floors_ms"] == [pytest.approx(1e3 * wt103["step_bytes"]["total"] / (run_bandwidth * 1e9))]
    assert wt103["ratio_to_floor"]["step_paired"] == pytest.approx(1e3 * run["step_s"] / wt103["run_floors_ms"][0])
    assert wt103["ratio_to_floor"]["forward_step_paired"] == pytest.approx(
        1e3 * run["forward_step_s"] / wt103["run_floors_ms"][0]
    )
    assert wt103["mv_gbytes_per_s_ceiling"] >= run_bandwidth
    # and each bare step against the floor at the bandwidth read right after it: the runs' memory lengths again
    beside = wt103["steps_beside_bandwidth"]
    if compiled_operators() is not None:
        assert len(beside["steps_s"]) == len(beside["gbytes_per_s"]) == wt103["new_tokens"] - 1
        floors_ms = [1e3 * wt103["step_bytes"]["total"] / (rate * 1e9) for rate in beside["gbytes_per_s"]]
        assert wt103["step_floors_ms"] == pytest.approx(floors_ms)
        ratios = [1e3 * step / floor for step, floor in zip(beside["steps_s"], floors_ms)]
        assert wt103["ratio_to_floor"]["forward_step_each_paired"] == pytest.approx(statistics.median(ratios))
        quarter = max(1, len(ratios) // 4)
        fastest = sorted(range(len(ratios)), key=lambda index: beside["gbytes_per_s"][index])[-quarter:]
        assert wt103["ratio_to_floor"]["forward_step_each_paired_fastest_quarter"] == pytest.approx(
            statistics.median(ratios[index] for index in fastest)
        )
        assert wt103["paired_ratios"]["fastest_quarter_gbytes_per_s"]["min"] == pytest.approx(
            min(beside["gbytes_per_s"][index] for index in fastest)
        )
        table = (quick_run / "decode.md").read_text()
        assert "each step / the floor read right after it" in table and "the fastest quarter of those" in table
    else:
        assert beside == {"steps_s": [], "gbytes_per_s": []}
        assert wt103["ratio_to_floor"]["forward_step_each_paired"] is None
        assert wt103["ratio_to_floor"]["forward_step_each_paired_fastest_quarter"] is None
    # the floors are the counts at the best rates the worker measured
    matmul = wt103["matmul_gflops_ceiling"]
    assert matmul == max(
        *wt103["rates_before"]["matmul_gflops"].values(), *wt103["rates_after"]["matmul_gflops"].values()
    )
    assert floors["prefill_s"] == pytest.approx(wt103["prefill_flops"]["total"] / (matmul * 1e9))
    bandwidth = wt103["mv_gbytes_per_s_ceiling"]
    assert floors["step_ms"] == pytest.approx(1e3 * wt103["step_bytes"]["total"] / (bandwidth * 1e9))
    flops = wt103["prefill_flops"]
    assert flops["total"] == pytest.approx(sum(value for name, value in flops.items() if name != "total"))
    assert wt103["prefill_flops_all_positions_scored"]["total"] > flops["total"]  # 16 positions scored, not 1
    # 4 new tokens: the timed steps (2nd-4th) attend to 16, 17, 18 memory positions (mem_len 20 not reached)
    assert wt103["step_bytes"]["mean_memory_length"] == pytest.approx(17)
    assert 0 < wt103["weight_bytes"]["read"] < wt103["weight_bytes"]["all"] == 4 * wt103["parameters"]
    assert wt103["peak_rss_mb"] >= wt103["loaded_rss_mb"] > 0
    assert wt103["peak_includes_bandwidth_probes"] is (not sys.platform.startswith("linux"))
    assert abs(sum(wt103["input_fractions"]) - 1) < 1e-6
    # --quick skips transformers 4.37.2: transfoxl built the seeded model itself
    assert wt103["v4"] is None and wt103["model_source"] == "seeded transfoxl model"
    table = (quick_run / "decode.md").read_text()
    assert "## tiny_wt103 configuration against the machine's floors" in table
    assert "| decode step, generate(), each run / the floor just before it |" in table
    assert "| decode step, generate() (ms) |" in table
    assert "transformers 4.37.2: not run (--skip-v4, or --quick without --with-v4)." in table


def test_quick_run_profile(quick_run: Path) -> None:
    mid = json.loads((quick_run / "decode.json").read_text())["mid"]
    profile = mid["profile"]
    assert mid["profile_threads"] == 1  # the default
    for impl in ("transfoxl", "gpt2"):
        entry = profile[impl]
        assert entry["steps"] == 4
        assert entry["section_calls_per_step"]["model forward"] == 1  # one forward per decode step
        # (transfoxl's layers are not labelled: a hook on them would turn off the model's fused decoding step)
        assert entry["section_calls_per_step"]["layer"] == (CONFIGS["tiny"]["n_layer"] if impl == "gpt2" else 0)
        sections = entry["sections_ms_per_step"]
        assert sections["model forward"] >= sections["stack"] >= sections["layer"] >= 0 and sections["stack"] > 0
        assert entry["operators"] and all(op["name"].startswith(("aten::", "transfoxl_")) for op in entry["operators"])
        assert entry["python_functions"] and entry["python_cumulative"]
    # GPT-2's attention is labelled; transfoxl's is not (a hook on it would turn the fused decoding step off), and
    # the fused step ran: its compiled kernel is among the profile's operators
    assert profile["gpt2"]["sections_ms_per_step"]["attention"] > 0
    assert profile["transfoxl"]["section_calls_per_step"]["attention"] == 0
    assert any(op["name"].endswith("::decode_layers") for op in profile["transfoxl"]["operators"]) or (
        compiled_operators() is None
    )
    text = (quick_run / "decode.profile.md").read_text()
    assert "| operators' own time / calls per step (aten and compiled kernels) |" in text
    assert "### GPT-2 (KV cache)" in text and "- (not labelled: inside the stack's one compiled call)" in text


def test_outputs_of_a_single_part(quick_run: Path) -> None:
    """--skip-mid or --skip-wt103: the table and the plot say what was not run."""
    results = json.loads((quick_run / "decode.json").read_text())
    without_mid = bench_decode.markdown({**results, "mid": None})
    assert "Mid part: not run (--skip-mid)." in without_mid and "| decode step, forward (ms) |" in without_mid
    without_wt103 = bench_decode.markdown({**results, "wt103": None})
    assert "WikiText-103 part: not run (--skip-wt103)." in without_wt103
    for partial in ({**results, "mid": None}, {**results, "wt103": None}):
        assert bench_decode.plot_png(partial).startswith(b"\x89PNG")


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_decode.main(["--help"])
    assert exit_info.value.code == 0
    usage = capsys.readouterr().out
    assert "usage: bench_decode.py" in usage and "--skip-wt103" in usage and "--quick" in usage
    assert "--skip-v4" in usage and "--with-v4" in usage and "--v4-model" in usage


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--new-tokens", "1"], "--new-tokens must be >= 2, got 1"),
        (["--wt103-new-tokens", "0"], "--wt103-new-tokens must be >= 2, got 0"),
        (["--runs", "0"], "--runs must be >= 1, got 0"),
        (["--batch-sizes", "1", "0"], "--batch-sizes must all be >= 1, got [1, 0]"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--profile-threads", "0"], "--profile-threads must be >= 1, got 0"),
        (["--stem", "a/b"], "--stem must be a file name without a folder"),
        (["--skip-v4", "--with-v4"], "--skip-v4 and --with-v4 contradict each other"),
        (["--with-v4", "--wt103-new-tokens", "2"], "--wt103-new-tokens must be >= 3 when transformers 4.37.2 runs"),
    ],
)
def test_option_errors_name_the_option(capsys: pytest.CaptureFixture[str], options: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_decode.main(["--quick", *options])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


def test_prefill_flops_by_hand() -> None:
    """One layer, E 32, 4 heads x 8, d_inner 64, Q 16 new tokens attending to M 8 + Q 16 = K 24 keys, batch 2;
    clusters of widths 32, 16, 8 (div_val 2) holding ids [0, 20), [20, 50), [50, 100), 20%, 30%, 50% of the inputs;
    the full distribution of 3 positions per sequence."""
    config = dict(vocab_size=100, cutoffs=[20, 50], div_val=2, d_model=32, d_embed=32, n_head=4, d_head=8)
    config.update(d_inner=64, n_layer=1)
    fractions = [0.2, 0.3, 0.5]
    parts = bench_decode.forward_flops(
        config, q_len=16, mem_len=8, batch=2, input_fractions=fractions, scored_positions=3
    )
    assert parts["projections"] == 2 * 16 * (2 * 32 * 96 + 2 * 32 * 32)  # q, k, v of the new tokens; output
    assert parts["relative_positions"] == 2 * 24 * 32 * 32  # once for the batch
    assert parts["attention"] == 2 * 3 * 2 * 16 * 24 * 32  # content and position scores, probabilities @ values
    assert parts["feed_forward"] == 2 * 16 * 2 * 2 * 32 * 64
    assert parts["embedding"] == pytest.approx(2 * 16 * (0.2 * 2 * 32 * 32 + 0.3 * 2 * 16 * 32 + 0.5 * 2 * 8 * 32))
    head = 2 * 32 * 32 + 2 * 32 * (20 + 2)  # projection, then 20 shortlist logits + 2 cluster logits
    tails = 2 * 32 * 16 + 2 * 16 * 30 + 2 * 32 * 8 + 2 * 8 * 50
    assert parts["adaptive_softmax"] == 2 * 3 * (head + tails)
    assert parts["total"] == pytest.approx(sum(value for name, value in parts.items() if name != "total"))
    cached = bench_decode.forward_flops(
        config, q_len=1, mem_len=8, batch=1, input_fractions=fractions, scored_positions=1, project_positions=False
    )
    assert cached["relative_positions"] == 0  # a decode step reads the projected table


@pytest.mark.parametrize("name", ["tiny", "mid", "wt103"])
def test_prefill_flops_agree_with_bench_speed(name: str) -> None:
    """Without memory, every position scored: bench_speed's per-token count times the tokens."""
    config = model_config(name)
    fractions = [1 / (len(config["cutoffs"]) + 1)] * (len(config["cutoffs"]) + 1)
    total = bench_decode.forward_flops(
        config, q_len=64, mem_len=0, batch=4, input_fractions=fractions, scored_positions=64
    )["total"]
    per_token = bench_speed.flops_per_token(
        config, tgt_len=64, mem_len=0, cluster_fractions=fractions, batch_size=4, all_clusters=True
    )
    assert total == pytest.approx(4 * 64 * per_token)


def test_step_bytes_by_hand() -> None:
    config = dict(model_config("tiny_wt103"), n_layer=2)  # d_model 64, 4 heads x 16
    lengths = bench_decode.decode_mem_lengths(prompt_len=16, new_tokens=6, mem_len=18)
    assert lengths == [16, 17, 18, 18, 18]  # capped at mem_len
    counted = bench_decode.step_bytes(config, weight_bytes=1000, mem_lengths=lengths, batch=2)
    mean = 87 / 5
    assert counted["keys_values"] == pytest.approx(2 * 2 * 2 * mean * 64 * 4)  # layers, keys+values, batch
    assert counted["positions"] == pytest.approx((mean + 1) * 64 * 4)
    assert counted["total"] == pytest.approx(1000 + counted["keys_values"] + counted["positions"])


def test_weights_read_by_a_step() -> None:
    """Tied tables are read by the softmax; the embedding's own first projection (tie_projs[0] is False) is not."""
    model = bench_decode.build_transfoxl(model_config("tiny_wt103"), mem_len=20, seed=0)
    counted = bench_decode.weights_read_by_a_step(model)
    unique = {p.data_ptr(): p.numel() * 4 for p in model.parameters()}
    assert counted["all"] == sum(unique.values())
    assert counted["all"] - counted["read"] == 64 * 64 * 4  # transformer.word_embeddings.projections.0


def test_wt103_config_is_txl_default() -> None:
    """configs.py's "wt103" is `TxlConfig()` with dropout off (the architecture of transfo-xl-wt103)."""
    ours, default = TxlConfig(**CONFIGS["wt103"]).to_dict(), TxlConfig().to_dict()
    differences = {key for key in ours.keys() | default.keys() if ours.get(key) != default.get(key)}
    assert differences == {"dropout"}


def test_gpt2_config_matches() -> None:
    gpt2 = bench_decode.gpt2_config_for(CONFIGS["mid"], n_positions=576)
    assert (gpt2["n_embd"], gpt2["n_layer"], gpt2["n_head"], gpt2["n_inner"], gpt2["vocab_size"]) == (
        256,
        6,
        8,
        1024,
        10000,
    )
    with pytest.raises(ValueError, match="n_head \\* d_head == d_model"):
        bench_decode.gpt2_config_for(dict(CONFIGS["mid"], d_head=16), n_positions=576)
    prompt = bench_decode.make_prompt(10000, 8, 512, seed=0)
    assert prompt.min() >= 1 and torch.equal(prompt, bench_decode.make_prompt(10000, 8, 512, seed=0))


# ---------------------------------------------------------------------------------------------------------------------
# transformers 4.37.2: what runs without its virtualenv


@pytest.mark.parametrize(
    ("options", "run_v4"),
    [
        ([], True),  # the full benchmark compares with v4
        (["--skip-v4"], False),
        (["--skip-wt103"], False),  # v4 belongs to the wt103 part
        (["--quick"], False),  # the tests: no virtualenv, no network
        (["--quick", "--with-v4"], True),
        (["--quick", "--with-v4", "--skip-wt103"], False),
    ],
)
def test_which_runs_compare_with_v4(options: list[str], run_v4: bool) -> None:
    args = bench_decode.parse_args(options)
    assert args.run_v4 is run_v4
    assert bench_decode.parse_args([*options, "--wt103-new-tokens", "3"]).settings["wt103_new_tokens"] == 3


def test_top_level_imports_work_in_the_v4_virtualenv() -> None:
    """The v4 workers run this file in a virtualenv with torch and transformers 4.37.2 only: at the top, nothing but
    the standard library, torch and this folder's configs, machine and v4 (transfoxl is imported inside functions)."""
    tree = ast.parse(Path(bench_decode.__file__).read_text())
    names = set()
    for node in ast.walk(
        ast.Module(body=[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))])
    ):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else node.module.split(".")[0])
    assert names - set(sys.stdlib_module_names) == {"torch", ".", "configs", "v4", "machine"}


def test_step_clock_answers_v4_with_one_bool() -> None:
    """transformers 4.37.2 takes `any(...)` of its criteria: one bool for the batch; later versions a [B] tensor."""
    ids = torch.zeros(2, 3, dtype=torch.long)
    assert bench_decode.step_clock(v4_api=True)(ids, None) is False
    answer = bench_decode.step_clock()(ids, None)
    assert answer.dtype == torch.bool and answer.shape == (2,) and not answer.any()


def save_by_hand(folder: Path, stamp: dict | None) -> None:
    """What a v4 save leaves: config.json, the weights, and last the stamp (None: an interrupted save)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    if stamp is not None:
        (folder / bench_decode.V4_STAMP).write_text(json.dumps(stamp))


def test_saved_v4_model_is_reused_only_when_it_matches(tmp_path: Path) -> None:
    config = model_config("tiny_wt103")
    stamp = bench_decode.v4_model_stamp(config, mem_len=20, seed=0)
    assert stamp["transformers"] == "4.37.2" and stamp["config"] == config
    folder = tmp_path / "model"
    assert not bench_decode.saved_model_matches(folder, stamp)  # nothing there
    save_by_hand(folder, stamp)
    assert bench_decode.saved_model_matches(folder, stamp)
    for other in (
        bench_decode.v4_model_stamp(config, mem_len=20, seed=1),
        bench_decode.v4_model_stamp(config, mem_len=24, seed=0),
        bench_decode.v4_model_stamp(model_config("tiny_wt103", n_layer=3), mem_len=20, seed=0),
    ):
        assert not bench_decode.saved_model_matches(folder, other)
    (folder / "model.safetensors").unlink()
    assert not bench_decode.saved_model_matches(folder, stamp)  # no weights
    save_by_hand(tmp_path / "interrupted", None)
    assert not bench_decode.saved_model_matches(tmp_path / "interrupted", stamp)


def test_ensure_v4_model_saves_reuses_and_protects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new save goes through a sibling folder renamed at the end; a matching one is reused without a worker; a
    folder this script did not save is left alone."""
    requests = []

    def fake_worker(python: str, request: dict) -> dict:
        requests.append(request)
        save_by_hand(Path(request["folder"]), None)
        return {"parameters": 1, "save_s": 0.5}

    monkeypatch.setattr(bench_decode, "run_worker", fake_worker)
    stamp = bench_decode.v4_model_stamp(model_config("tiny_wt103"), mem_len=20, seed=0)
    folder = tmp_path / "decode-v4-model-tiny_wt103"
    assert bench_decode.ensure_v4_model("v4-python", folder, stamp, 1) == {"saved": True, "save_s": 0.5}
    assert requests[0]["phase"] == "v4_save" and requests[0]["folder"] == str(folder) + ".partial"
    assert (requests[0]["mem_len"], requests[0]["seed"], requests[0]["threads"]) == (20, 0, 1)
    assert bench_decode.saved_model_matches(folder, stamp) and not (tmp_path / (folder.name + ".partial")).exists()
    assert bench_decode.ensure_v4_model("v4-python", folder, stamp, 1) == {"saved": False, "save_s": None}
    assert len(requests) == 1  # reused
    other = bench_decode.v4_model_stamp(model_config("tiny_wt103"), mem_len=20, seed=1)
    assert bench_decode.ensure_v4_model("v4-python", folder, other, 1)["saved"]  # replaced: it was ours
    assert bench_decode.saved_model_matches(folder, other) and len(requests) == 2
    foreign = tmp_path / "someone's model"
    save_by_hand(foreign, None)
    with pytest.raises(RuntimeError, match=r"was not saved by bench_decode\.py"):
        bench_decode.ensure_v4_model("v4-python", foreign, stamp, 1)
    assert (foreign / "config.json").exists() and len(requests) == 2


def generate_run_by_hand(prefill: float, steps: list[float], total: float, tokens: list[int]) -> dict:
    return bench_decode.generate_run(
        {"prefill_s": prefill, "steps_s": steps, "total_s": total, "tokens": [tokens]}, load=0.5
    )


def test_comparison_with_v4_summary_table_and_plot(quick_run: Path) -> None:
    """summarize_v4, its rows in the table and its panel in the plot, from the quick run's wt103 part (no v4) and
    v4 results made by hand."""
    results = json.loads((quick_run / "decode.json").read_text())
    wt103 = results["wt103"]
    v4_result = {
        "transformers": "4.37.2",
        "parameters": wt103["parameters"],
        "load_s": 0.1,
        "loaded_rss_mb": 200.0,
        "peak_rss_mb": 250.0,
        "threads": 1,
        "runs": [
            generate_run_by_hand(0.04, [0.004, 0.008], 0.06, [5, 6, 7, 8]),
            generate_run_by_hand(0.02, [0.006], 0.05, [5, 6, 7, 8]),
            generate_run_by_hand(0.03, [0.002, 0.004, 0.009], 0.07, [5, 6, 7, 8]),
        ],
    }
    zero_runs = [generate_run_by_hand(0.01, [0.002, 0.003, 0.004], 0.02, [5, 6, 7, 8])]
    entry = bench_decode.summarize_v4(v4_result, {"zero_memory_runs": zero_runs}, wt103, 2.5e-6)
    measured = entry["measured"]
    assert (
        measured["v4"]["prefill_s"]["values"] == [0.04, 0.02, 0.03] and measured["v4"]["prefill_s"]["median"] == 0.03
    )
    assert measured["v4"]["step_ms"]["values"] == pytest.approx([6.0, 6.0, 4.0])  # each run's median step
    assert measured["transfoxl_zero_memory"]["total_s"]["median"] == 0.02
    assert measured["transfoxl_empty_memory"]["step_ms"] == wt103["measured"]["step_ms"]  # the floors' runs
    ratio = entry["ratio"]
    assert ratio["transfoxl_zero_memory"]["prefill_s"] == pytest.approx(0.01 / 0.03)
    assert ratio["transfoxl_zero_memory"]["step_ms"] == pytest.approx(3.0 / 6.0)
    assert ratio["transfoxl_empty_memory"]["total_s"] == pytest.approx(wt103["measured"]["total_s"]["median"] / 0.06)
    assert ratio["transfoxl_zero_memory"]["peak_rss_mb"] == pytest.approx(wt103["peak_rss_mb"] / 250.0)
    assert entry["prefill_tokens_per_s"]["v4"] == pytest.approx(16 / 0.03)  # the quick prompt
    assert entry["same_tokens"] is True and entry["tokens"] == [[5, 6, 7, 8]]
    assert entry["max_abs_log_prob_difference"] == 2.5e-6

    with_v4 = {**results, "wt103": {**wt103, "v4": entry}}
    table = bench_decode.markdown(with_v4)
    assert "### End to end against transformers 4.37.2" in table
    zero_prefill = measured["transfoxl_zero_memory"]["prefill_s"]
    assert f"| prefill, generate() (s) | {bench_decode.cell(zero_prefill, 3)} |" in table
    assert (
        f"| prefill (tokens/s) | 1600 | {entry['prefill_tokens_per_s']['transfoxl_empty_memory']:.0f} | 533 |" in table
    )
    assert "| decode step, generate() (ms) | 3.0 (3.0-3.0) |" in table and "| 0.50x |" in table
    assert "| end to end, generate() (16 + 4 tokens, s) |" in table
    assert f"| peak RSS (MB) | {wt103['peak_rss_mb']:.0f} | {wt103['peak_rss_mb']:.0f} | 250 |" in table
    assert "the same 4 greedy tokens in every run of both" in table and "at most 2.5e-06" in table
    assert bench_decode.plot_png(with_v4).startswith(b"\x89PNG")

    zero_runs[0]["tokens"] = [[5, 6, 7, 9]]
    differing = bench_decode.summarize_v4(v4_result, {"zero_memory_runs": zero_runs}, wt103, 0.3)
    assert differing["same_tokens"] is False
    assert "**different greedy tokens**" in bench_decode.same_weights_line(differing)


def test_a_worker_reports_its_own_peak_rss(tmp_path: Path) -> None:
    """The workers' peak RSS is theirs: on Linux ru_maxrss keeps the parent's peak across exec (this test process,
    with torch loaded, is far larger than a fresh interpreter that imports only tools/machine.py)."""
    tools = Path(bench_decode.__file__).parent
    code = "import sys; sys.path.insert(0, sys.argv[1]); import machine; print(machine.peak_rss_mb())"
    child = float(run_fresh_python(code, str(tools), cwd=tmp_path, env=dict(os.environ)).stdout)
    ours = machine.peak_rss_mb()
    assert 0 < child < ours / 2, (child, ours)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak RSS is reset through /proc (Linux)")
def test_a_probes_buffers_leave_the_peak_once_reset(tmp_path: Path) -> None:
    """The wt103 worker's per-run bandwidth probe allocates 256 MB matrices beside the model: once they are freed
    and the peak reset, the peak the worker reports is the model's again. A fresh interpreter, whose peak is small."""
    tools = Path(bench_decode.__file__).parent
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import machine\n"
        "before = machine.peak_rss_mb()\n"
        "probe = bytearray(256 * 2**20)  # written: resident\n"
        "during = machine.peak_rss_mb()\n"
        "del probe\n"
        "print(before, during, machine.reset_peak_rss(), machine.peak_rss_mb())"
    )
    result = run_fresh_python(code, str(tools), cwd=tmp_path, env=dict(os.environ)).stdout.split()
    before, during, reset, after = float(result[0]), float(result[1]), result[2], float(result[3])
    assert during > before + 200 and reset == "True"
    assert after < before + 50, (before, during, after)
