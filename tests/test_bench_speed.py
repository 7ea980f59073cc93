"""tools/bench_speed.py: a tiny run without transformers 4.37.2, the shape options (wt103's defaults, a run at
non-default shapes), the FLOP count by hand, option errors."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from tools import bench_speed
from tools.configs import CONFIGS


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of each phase of the tiny config, workers in fresh processes as in a real run; the output folder."""
    out = tmp_path_factory.mktemp("speed")
    options = ["--skip-v4", "--skip-vanilla", "--config", "tiny", "--runs", "1", "--train-steps", "2"]
    assert bench_speed.main([*options, "--eval-segments", "1", "--out", str(out)]) == 0
    return out


def positive_finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_tiny_run_writes_every_measure(tiny_run: Path) -> None:
    results = json.loads((tiny_run / "speed.json").read_text())
    assert set(results) >= {"setup", "machine", "matmul_gflops", "flops_per_token", "runs", "summary", "vanilla"}
    assert results["sanity"] is None and results["vanilla"] is None  # --skip-v4, --skip-vanilla
    assert set(results["summary"]) == {"transfoxl"}  # no v4, so no ratios either
    summary = results["summary"]["transfoxl"]
    for name in ("train_tokens_per_s", "eval_tokens_per_s", "train_peak_rss_mb", "eval_peak_rss_mb", "train_gflops"):
        assert positive_finite(summary[name]["median"]), (name, summary[name])
        assert summary[name]["min"] <= summary[name]["median"] <= summary[name]["max"]
    assert math.isfinite(summary["train_memory_mb"]["median"])  # peak minus the RSS after loading: may be ~0
    assert 0 < summary["train_fraction_of_matmul"] < 1
    train, evaluation = results["runs"]["transfoxl"]["train"], results["runs"]["transfoxl"]["eval"]
    assert len(train) == len(evaluation) == 1
    assert len(train[0]["seconds"]) == 2 and len(train[0]["losses"]) == 3 + 2  # warm-up steps are not timed
    assert all(positive_finite(loss) for loss in train[0]["losses"])
    assert evaluation[0]["memory_length"] == 512  # timed with a full memory
    assert train[0]["peak_rss_mb"] >= train[0]["loaded_rss_mb"] > 0
    # Each worker measures the rate before and after its timed steps; a run's fraction is against the better of the
    # two, the summary's is the median of the runs', and the best rate seen anywhere is the conservative ceiling.
    matmul = results["matmul_gflops"]
    assert len(matmul["workers"]) == 4 and all(positive_finite(rate) for rate in matmul["workers"])
    assert matmul["ceiling"] == max(*matmul["before"].values(), *matmul["after"].values(), *matmul["workers"])
    for run in (train[0], evaluation[0]):
        assert run["fraction_of_matmul"] == pytest.approx(run["gflops"] / max(run["matmul_gflops"]))
    assert summary["train_fraction_of_matmul"] == train[0]["fraction_of_matmul"]
    assert summary["train_fraction_of_best_matmul"] == pytest.approx(train[0]["gflops"] / matmul["ceiling"])
    assert summary["train_fraction_of_best_matmul"] <= summary["train_fraction_of_matmul"]
    assert results["machine"]["cores"] >= 1 and results["machine"]["transformers_v4"] is None

    table = (tiny_run / "speed.md").read_text()
    assert "| training tokens/s |" in table and "| evaluation tokens/s |" in table
    assert "| training memory above the loaded model (MB) |" in table and "not run" in table
    assert (tiny_run / "speed.png").read_bytes().startswith(b"\x89PNG")


def test_vanilla_comparison(tiny_run: Path, tmp_path: Path) -> None:
    """The no-memory comparison, run in this process (a worker would only add its start-up time)."""
    config = CONFIGS["tiny"]
    shapes = {"vanilla": (1, bench_speed.vanilla_tokens([160], tgt_len=128))}
    tokens = bench_speed.make_tokens("zipf", config["vocab_size"], shapes, seed=0)
    torch.save(tokens, tmp_path / "tokens.pt")
    request = dict(impl="transfoxl", folder=None, seed=0, config=config, attn_implementation="eager")
    request.update(tokens=str(tmp_path / "tokens.pt"), attn_lengths=[160], tgt_len=128, mem_len=128)
    raw = bench_speed.phase_vanilla(request)
    entry = raw["lengths"]["160"]
    assert entry["mem_len"] == entry["memory_length"] == 32  # timed with a full memory of L - 128
    assert len(entry["vanilla_s_per_token"]) == bench_speed.VANILLA_WINDOWS

    results = json.loads((tiny_run / "speed.json").read_text())
    fractions = bench_speed.cluster_fractions(tokens["vanilla"], config)
    results["vanilla"] = bench_speed.summarize_vanilla(raw, config, fractions)
    summary = results["vanilla"]["160"]
    assert positive_finite(summary["speedup"]) and summary["paper_speedup"] is None
    assert summary["vanilla_flops_per_token"] > summary["xl_flops_per_token"] > 0
    assert "| 160 |" in bench_speed.markdown(results)


def test_shape_defaults_per_config() -> None:
    """mid keeps the shapes of every earlier run; wt103 gets its small ones and never the no-memory comparison;
    an option overrides either."""
    shape_names = ("batch", "tgt_len", "mem_len", "eval_mem_len", "warmup_steps", "train_steps", "eval_segments")

    def shapes(args) -> tuple:
        return tuple(getattr(args, name) for name in shape_names)

    mid = bench_speed.parse_args([])
    assert shapes(mid) == (8, 128, 128, 512, 3, 10, 8) and mid.runs == 5 and mid.run_vanilla
    assert mid.stem == "speed" and mid.threads is None
    wt103 = bench_speed.parse_args(["--config", "wt103"])
    assert shapes(wt103) == (1, 128, 128, 512, 2, 4, 3) and wt103.runs == 3 and not wt103.run_vanilla
    # the comparison without memory is not run for wt103, so its lengths are not checked against the segment
    assert not bench_speed.parse_args(["--config", "wt103", "--attn-lengths", "64"]).run_vanilla
    given = ["--config", "wt103", "--batch", "2", "--tgt-len", "64", "--mem-len", "32", "--eval-mem-len", "96"]
    given += ["--warmup-steps", "1", "--train-steps", "5", "--eval-segments", "6", "--runs", "2", "--threads", "1"]
    overridden = bench_speed.parse_args(given)
    assert shapes(overridden) == (2, 64, 32, 96, 1, 5, 6) and overridden.runs == 2 and overridden.threads == 1
    assert not bench_speed.parse_args(["--skip-vanilla"]).run_vanilla
    # configs.py builds what --config names, in both transformers (same_length, clamp_len reach v4's config)
    assert set(bench_speed.SHAPES) <= set(CONFIGS)
    assert CONFIGS["wt103"]["same_length"] and CONFIGS["wt103"]["clamp_len"] == 1000


def test_tiny_wt103_run_uses_the_given_shapes(tmp_path: Path) -> None:
    """Every shape option reaches the workers, the JSON, the FLOP count and the table; --stem names the files."""
    options = ["--config", "tiny_wt103", "--skip-v4", "--runs", "1", "--threads", "1", "--stem", "speed-small"]
    options += ["--batch", "2", "--tgt-len", "32", "--mem-len", "16", "--eval-mem-len", "48"]
    options += ["--warmup-steps", "1", "--train-steps", "2", "--eval-segments", "1", "--out", str(tmp_path)]
    threads = torch.get_num_threads()
    assert bench_speed.main(options) == 0
    assert torch.get_num_threads() == threads  # --threads is given back to the caller
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == ["speed-small.json", "speed-small.md", "speed-small.png"]
    results = json.loads((tmp_path / "speed-small.json").read_text())
    setup = results["setup"]
    assert setup["config_name"] == "tiny_wt103" and setup["config"]["same_length"] and setup["threads"] == 1
    assert setup["train"] | {"optimizer": None} == dict(
        batch=2, tgt_len=32, mem_len=16, optimizer=None, warmup_steps=1, timed_steps=2
    )
    assert setup["eval"] == dict(batch=2, tgt_len=32, mem_len=48, warmup_segments=48 // 32 + 1 + 2, timed_segments=1)
    assert results["vanilla"] is None and setup["vanilla"] == "mid only"
    train, evaluation = results["runs"]["transfoxl"]["train"][0], results["runs"]["transfoxl"]["eval"][0]
    assert len(train["losses"]) == 1 + 2 and len(train["seconds"]) == 2 and train["threads"] == 1
    assert evaluation["memory_length"] == 48
    assert train["tokens_per_s"] == pytest.approx(statistics.median(2 * 32 / s for s in train["seconds"]))
    config, fractions = setup["config"], setup["cluster_fractions"]
    count = bench_speed.flops_per_token
    assert results["flops_per_token"] == pytest.approx(
        {
            "train": count(config, tgt_len=32, mem_len=16, cluster_fractions=fractions, batch_size=2, training=True),
            "eval": count(config, tgt_len=32, mem_len=48, cluster_fractions=fractions, batch_size=2),
        }
    )
    table = (tmp_path / "speed-small.md").read_text()
    assert "Training: batch 2 x 32, mem_len 16," in table and "evaluation: batch 2 x 32, mem_len 48," in table


def test_zipf_tokens_favour_small_ids() -> None:
    tokens = bench_speed.make_tokens("zipf", 10000, {"train": (8, 1000)}, seed=0)["train"]
    again = bench_speed.make_tokens("zipf", 10000, {"train": (8, 1000)}, seed=0)["train"]
    assert torch.equal(tokens, again)  # seeded: both implementations read the same ids
    fractions = bench_speed.cluster_fractions(tokens, CONFIGS["mid"])
    assert fractions[0] > 0.8 and abs(sum(fractions) - 1) < 1e-6  # ~H(2000) / H(10000)


def test_flop_count_by_hand() -> None:
    """One layer, E 32, 4 heads x 8, d_inner 64, Q 16 attending to M 8 + Q 16 = K 24 keys; clusters of widths 32,
    16, 8 (div_val 2) holding ids [0, 20), [20, 50), [50, 100) and 20%, 30%, 50% of the tokens."""
    config = dict(vocab_size=100, cutoffs=[20, 50], div_val=2, d_model=32, d_embed=32, n_head=4, d_head=8)
    config.update(d_inner=64, n_layer=1)
    layer = (
        2 * 16 * 32 * 32  # queries of the 16 segment positions
        + 2 * 24 * 32 * 64  # keys and values of the 24 positions
        + 2 * 24 * 32 * 32  # relative positions, 24 distances
        + 2 * 16 * 24 * 32 * 2  # content and position scores
        + 2 * 16 * 24 * 32  # probabilities @ values
        + 2 * 16 * 32 * 32  # output projection
        + 2 * 16 * 32 * 64 * 2  # feed-forward
    ) / 16
    assert layer == 26112
    embedding = 0.2 * 2 * 32 * 32 + 0.3 * 2 * 16 * 32 + 0.5 * 2 * 8 * 32
    head = 2 * 32 * 32 + 2 * 32 * (20 + 2)  # projection, then 20 shortlist logits + 2 cluster logits
    tails = [2 * 32 * 16 + 2 * 16 * 30, 2 * 32 * 8 + 2 * 8 * 50]  # projection + logits of clusters 1 and 2
    forward = layer + embedding + head + 0.3 * tails[0] + 0.5 * tails[1]
    assert forward == pytest.approx(31792.0)

    count = bench_speed.flops_per_token
    fractions = [0.2, 0.3, 0.5]
    assert count(config, tgt_len=16, mem_len=8, cluster_fractions=fractions) == pytest.approx(forward)
    assert count(config, tgt_len=16, mem_len=8, cluster_fractions=fractions, training=True) == pytest.approx(
        3 * forward
    )
    full = layer + embedding + head + sum(tails)  # every cluster for every token: a full distribution
    assert count(config, tgt_len=16, mem_len=8, cluster_fractions=fractions, all_clusters=True) == pytest.approx(full)
    # W_{k,R} R is computed once per segment for all the columns of a batch
    shared = 2 * 24 * 32 * 32 / 16
    batched = count(config, tgt_len=16, mem_len=8, cluster_fractions=fractions, batch_size=4)
    assert batched == pytest.approx(forward - shared + shared / 4)
    with pytest.raises(ValueError, match="cluster_fractions"):
        count(config, tgt_len=16, mem_len=8, cluster_fractions=[1.0])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--attn-lengths", "64"], "--attn-lengths must be > the segment length 128, got 64"),
        (["--runs", "0"], "--runs must be >= 1, got 0"),
        (["--train-steps", "-1"], "--train-steps must be >= 1"),
        (["--eval-segments", "0"], "--eval-segments must be >= 1"),
        (["--tokens", "normal"], "--tokens"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["--eval-mem-len", "0"], "--eval-mem-len must be >= 1, got 0"),
        (["--config", "wt103", "--tgt-len", "0"], "--tgt-len must be >= 1, got 0"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--stem", "a/b"], "--stem must be a file name without a folder"),
        (["--config", "big"], "--config"),
    ],
)
def test_option_errors_name_the_option(capsys: pytest.CaptureFixture[str], options: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_speed.main(["--skip-v4", *options])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err
