"""Training and evaluation speed: this package against transformers 4.37.2's TransfoXLLMHeadModel, on the same weights.

By default the mid configuration of the project's benchmarks (6 layers, d_model 256, 8 heads x 32, d_inner 1024, vocab
10000 with cutoffs [2000, 5000] and div_val 2, clamp_len -1, same_length False), fp32 on the CPU. Measured, per
implementation:

- training: batch 8 x 128 tokens, mem_len 128, dropout 0.1, forward + backward + AdamW step (torch's fused AdamW, as
  `train.py` builds it, for both implementations: the optimizer is not the model's), the memory carried from
  step to step, 3 warm-up steps and 10 timed; tokens/s, the peak RSS of the run, and the memory training adds above
  the loaded model and optimizer;
- evaluation: batch 8 x 128 tokens, mem_len 512 (full before timing, then 2 more warm-up segments), 8 timed segments,
  no_grad, loss only; tokens/s;
- model FLOP/s: an analytic count of the model's matrix products per token (`flops_per_token`) times tokens/s, also as
  a fraction of this machine's fp32 matrix-product rate: each run's against the rate its worker measured just before
  and just after its timed steps (the better of the two; the median of those fractions is the summary's), and, more
  conservatively, the median against the best rate measured at any time (before and after all runs, and in every
  worker). On a shared host the rate moves by a third between minutes (165-310 GFLOP/s within one run of this tool);
  a run and the rate beside it see the same host;
- the paper's evaluation-speed comparison (Dai et al., 2019, Table 9), transfoxl only, batch 1: a model without
  memory that recomputes a window of L tokens for every predicted token, against Transformer-XL with segments of 128
  tokens and a full memory of L - 128, so that both attend to L positions. Mid (and tiny) only.

`--config wt103` measures the same on the WikiText-103 model (18 layers, d_model 1024, 16 heads x 64, d_inner 4096,
vocab 267,735 with cutoffs [20000, 40000, 200000] and div_val 4, clamp_len 1000, same_length True; 285M parameters),
random weights, with defaults sized so that a run fits a 2-core CPU (`SHAPES`): training batch 1 x 128 tokens, mem_len
128, 2 warm-up steps (the first without memory, the second allocates AdamW's state) and 4 timed; evaluation batch
1 x 128, mem_len 512, 3 timed segments; 3 runs. Each training process holds the weights, their gradients and AdamW's
two moments (4 x 1.1 GB) and more. `--batch`, `--tgt-len`, `--mem-len`, `--eval-mem-len`, `--warmup-steps`,
`--train-steps`, `--eval-segments`, `--runs` override the defaults of either configuration.

Every training or evaluation run is a fresh worker process (this file, run with `--worker`: one JSON line in, one
out), so that its peak RSS is that run's; the implementations alternate run after run, the order rotating, so that a
noisy machine hurts them alike. transformers 4.37.2 runs in its own virtualenv (`.bench/venv-v4`, created by
`tools/v4.py` the first time: needs PyPI): it builds the seeded model once and saves it; transfoxl loads that folder
(a v4 checkpoint, converted on load). Before the runs both score the same two segments with dropout off, from v4's
zero-filled start memory: the losses must agree (a sanity line in the output).

    python tools/bench_speed.py                      # writes benchmarks/speed.{json,md,png} (about 10-15 minutes)
    python tools/bench_speed.py --skip-v4 --runs 3   # no virtualenv, no network
    python tools/bench_speed.py --tokens zipf --attn-lengths 800 1800 --out /tmp/speed
    python tools/bench_speed.py --config wt103 --stem speed-wt103   # benchmarks/speed-wt103.{json,md,png}
    python tools/bench_speed.py --config tiny --skip-v4 --skip-vanilla --runs 1 --train-steps 2 --out /tmp/speed
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

# Only the standard library, torch and this folder's configs and v4 at the top: the same file is the worker inside the
# transformers 4.37.2 virtualenv, where neither transfoxl nor transformers v5 exists.
if __package__:  # imported (`from tools import bench_speed`) or run with `python -m tools.bench_speed`
    from . import configs, v4
    from .machine import cpu_name, current_rss_mb, machine_facts, peak_rss_mb, png_bytes, written_utc
else:  # run as a file, `python tools/bench_speed.py`: its folder is the first entry of sys.path
    import configs
    import v4
    from machine import cpu_name, current_rss_mb, machine_facts, peak_rss_mb, png_bytes, written_utc

REPO = Path(__file__).resolve().parents[1]
TRAIN_DROPOUT = 0.1  # in the config of every run: training runs in train mode, the others in eval mode
# Default shapes and counts per --config, each an option (`--mem-len` is the training memory). tiny and tiny_wt103
# (the tests) take those of the model they shrink.
SHAPES: dict[str, dict[str, int]] = {
    "mid": dict(batch=8, tgt_len=128, mem_len=128, eval_mem_len=512, warmup_steps=3, train_steps=10, eval_segments=8),
    # 285M parameters on a 2-core CPU: one column, and few steps. The first step runs without memory and the second
    # allocates AdamW's state, so two warm-up steps reach the steady state.
    "wt103": dict(batch=1, tgt_len=128, mem_len=128, eval_mem_len=512, warmup_steps=2, train_steps=4, eval_segments=3),
}
SHAPES["tiny"], SHAPES["tiny_wt103"] = SHAPES["mid"], SHAPES["wt103"]
DEFAULT_RUNS = {"mid": 5, "tiny": 5, "wt103": 3, "tiny_wt103": 3}
WITH_VANILLA = ("mid", "tiny")  # the comparison without memory is the mid configuration's
EVAL_EXTRA_WARMUP = 2  # segments after the one that fills the memory
LEARNING_RATE = 2.5e-4
VANILLA_WINDOWS, XL_SEGMENTS_PER_WINDOW = 3, 3  # timed per attention length, after a warm-up round
MATMUL_SHAPES = [(1024, 256, 1024), (1024, 1024, 256)]  # [m, k] x [k, n]: the feed-forward's two products
PAPER_SPEEDUPS = {3800: 1874, 2800: 1409, 1800: 773, 800: 363}  # Dai et al. 2019, Table 9
SANITY_TOLERANCE = 1e-4
IMPLEMENTATIONS = ("transfoxl", "v4")
LABELS = {"transfoxl": "transfoxl", "v4": "transformers 4.37.2"}


# ---------------------------------------------------------------------------------------------------------------------
# FLOP count


def flops_per_token(
    config: Mapping[str, Any],
    *,
    tgt_len: int,
    mem_len: int,
    cluster_fractions: Sequence[float],
    batch_size: int = 1,
    all_clusters: bool = False,
    training: bool = False,
) -> float:
    """Model FLOPs per token of a segment of `tgt_len` tokens attending to `mem_len` memory positions.

    Counts matrix products only, 2 FLOPs per multiply-add, as the model defines them (not as an implementation happens
    to compute them): per layer, the query projection of the Q segment positions, the key and value projections of
    the K = mem_len + Q memory and segment positions, the projection W_{k,R} of the K relative positions, the content
    and position scores and probabilities @ values over all K keys (masked keys included), the output projection and
    the two feed-forward products; then the adaptive embedding's projection of each token's cluster and the adaptive
    softmax: the head (projection and shortlist + one logit per tail cluster) for every token, a tail cluster
    (projection and logits) for the tokens whose target is in it, or for every token with `all_clusters` (a full
    distribution). `cluster_fractions[i]` is the fraction of tokens (inputs and targets alike) in cluster i. Not
    counted: softmax, layer norms, biases, element-wise operations, the optimizer. `training` multiplies by 3
    (backward ~ twice the forward). The per-segment work is divided by Q; W_{k,R} R, computed once per segment for
    all `batch_size` columns, by B Q.
    """
    width, heads, head_dim = config["d_model"], config["n_head"], config["d_head"]
    inner, q_len, k_len = heads * head_dim, tgt_len, mem_len + tgt_len
    layer = (
        2 * q_len * width * inner  # queries, segment only
        + 2 * k_len * width * 2 * inner  # keys and values over memory + segment
        + 2 * k_len * width * inner / batch_size  # W_{k,R} R for the K distances, shared by the batch
        + 2 * q_len * k_len * inner * 2  # content scores (a)+(c) and position scores (b)+(d)
        + 2 * q_len * k_len * inner  # probabilities @ values
        + 2 * q_len * inner * width  # output projection
        + 2 * q_len * width * config["d_inner"] * 2  # feed-forward, up and down
    ) / q_len

    cutoffs, vocab_size, div_val = list(config["cutoffs"]), config["vocab_size"], config["div_val"]
    bounds = [0, *cutoffs, vocab_size]
    n_clusters = len(bounds) - 1
    if len(cluster_fractions) != n_clusters:
        raise ValueError(f"cluster_fractions needs {n_clusters} values (one per cluster), got {cluster_fractions}.")
    d_embed = config.get("d_embed") or width
    widths = [d_embed // div_val**cluster if div_val > 1 else d_embed for cluster in range(n_clusters)]
    projected = div_val > 1 or d_embed != width  # else embedding and softmax work in d_model directly
    embedding = sum(fraction * 2 * w * width for fraction, w in zip(cluster_fractions, widths)) if projected else 0.0
    head_size = bounds[1] + n_clusters - 1  # shortlist + one logit per tail cluster
    softmax = (2 * width * widths[0] if projected else 0) + 2 * widths[0] * head_size
    for cluster in range(1, n_clusters):
        weight = 1.0 if all_clusters else cluster_fractions[cluster]
        cluster_size = bounds[cluster + 1] - bounds[cluster]
        softmax += weight * ((2 * width * widths[cluster] if projected else 0) + 2 * widths[cluster] * cluster_size)
    forward = config["n_layer"] * layer + embedding + softmax
    return forward * (3 if training else 1)


def cluster_fractions(tokens: torch.Tensor, config: Mapping[str, Any]) -> list[float]:
    """Fraction of `tokens` in each cluster of the adaptive embedding / softmax."""
    bounds = [0, *config["cutoffs"], config["vocab_size"]]
    return [float(((tokens >= low) & (tokens < high)).float().mean()) for low, high in pairwise(bounds)]


# ---------------------------------------------------------------------------------------------------------------------
# Worker (runs in this venv for transfoxl, in the transformers 4.37.2 one for v4)


def load_model(request: dict, *, mem_len: int) -> torch.nn.Module:
    """The request's implementation with the shared weights (v4's saved folder, or the seeded transfoxl model)."""
    if request["impl"] == "v4":
        from transformers import TransfoXLLMHeadModel

        model = TransfoXLLMHeadModel.from_pretrained(request["folder"])
        model.reset_memory_length(mem_len)
        return model
    import transfoxl

    options = {} if request["attn_implementation"] is None else {"attn_implementation": request["attn_implementation"]}
    if request["folder"] is not None:
        model = transfoxl.TxlForCausalLM.from_pretrained(request["folder"], **options)
    else:
        torch.manual_seed(request["seed"])
        model = transfoxl.TxlForCausalLM(transfoxl.TxlConfig(**request["config"], **options))
    model.config.mem_len = mem_len  # memory_init stays what the checkpoint (or the config's default) gives
    return model


def segment(stream: torch.Tensor, index: int, tgt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs `[B, Q]` of segment `index` (Q = `tgt_len`) of `stream` `[B, S]`, and its targets (the next tokens)."""
    start = index * tgt_len
    return stream[:, start : start + tgt_len], stream[:, start + 1 : start + tgt_len + 1]


def lm_loss(model: Any, impl: str, inputs: torch.Tensor, targets: torch.Tensor | None, memory: Any) -> tuple:
    """One segment through either implementation: (mean loss, the memory for the next segment).

    v4 only takes labels shifted inside (position t predicts input t + 1, the last position predicts nothing).
    transfoxl takes `targets` aligned with the positions, as a stream reader does; with `targets=None`, v4's labels.
    """
    if impl == "v4":
        output = model(input_ids=inputs, labels=inputs, mems=memory)
        loss = output.loss if getattr(output, "loss", None) is not None else output.losses.mean()
        return loss, output.mems
    if targets is None:
        output = model(inputs, labels=inputs, past_key_values=memory)
    else:
        output = model(inputs, shift_labels=targets, past_key_values=memory, return_logits=False)
    return output.loss, output.past_key_values


def phase_save(request: dict) -> dict:
    """v4: build the seeded model and save it where transfoxl and the later v4 workers load it."""
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(request["seed"])
    model = TransfoXLLMHeadModel(TransfoXLConfig(**request["config"], mem_len=request["mem_len"]))
    model.save_pretrained(request["folder"])
    return {"parameters": sum(parameter.numel() for parameter in model.parameters())}


@torch.no_grad()
def phase_check(request: dict) -> dict:
    """Losses of the first two training segments, dropout off, from v4's zero-filled start memory."""
    model = load_model(request, mem_len=request["mem_len"]).eval()
    if request["impl"] == "transfoxl":
        model.config.memory_init = "zeros"  # v4's start: mem_len zero vectors that the first segment attends to
    stream = torch.load(request["tokens"], weights_only=True)["train"]
    losses, memory = [], None
    for index in range(2):
        inputs, _ = segment(stream, index, request["tgt_len"])
        loss, memory = lm_loss(model, request["impl"], inputs, None, memory)
        losses.append(float(loss))
    return {"losses": losses}


def phase_train(request: dict) -> dict:
    """Training steps with the memory carried; seconds per timed step, RSS after loading and at the peak."""
    impl = request["impl"]
    model = load_model(request, mem_len=request["mem_len"]).train()
    if request.get("gradient_checkpointing") and impl == "transfoxl":
        model.activation_checkpointing_enable()  # layers recompute their activations in backward: memory for time
    # Fused: one pass over the parameters (what train.py runs), not torch's per-parameter CPU default.
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
    # Static shapes: one graph per memory length while the memory fills, then none (as train.py --compile).
    forward = torch.compile(model, dynamic=False) if request["compile"] and impl == "transfoxl" else model
    stream = torch.load(request["tokens"], weights_only=True)["train"]
    gc.collect()
    loaded_rss = current_rss_mb()
    seconds, losses, memory = [], [], None
    rate_before = None
    for step in range(request["warmup"] + request["steps"]):
        if step == request["warmup"]:
            rate_before = max(matmul_rates(request.get("matmul_repeats", 30)).values())
        inputs, targets = segment(stream, step, request["tgt_len"])
        start = time.perf_counter()
        loss, memory = lm_loss(forward, impl, inputs, targets, memory)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        losses.append(float(loss))
        if step >= request["warmup"]:
            seconds.append(elapsed)
    rate_after = max(matmul_rates(request.get("matmul_repeats", 30)).values())
    return {
        "seconds": seconds,
        "losses": losses,
        "loaded_rss_mb": loaded_rss,
        "matmul_gflops": [rate_before, rate_after],
    }


@torch.no_grad()
def phase_eval(request: dict) -> dict:
    """Evaluation segments (loss only) once the memory is full; seconds per timed segment."""
    impl = request["impl"]
    mem_len, tgt_len = request["eval_mem_len"], request["tgt_len"]
    model = load_model(request, mem_len=mem_len).eval()
    forward = model  # --compile is for training: inference keeps projected keys/values, which graphs cannot track
    stream = torch.load(request["tokens"], weights_only=True)["eval"]
    memory = None
    if impl == "transfoxl":
        from transfoxl import TxlMemory

        memory = TxlMemory.from_config(model.config, mem_len)  # as transfoxl.evaluation.evaluate_stream does
    warmup = eval_warmup_segments(mem_len=mem_len, tgt_len=tgt_len)
    seconds, rate_before = [], None
    for index in range(warmup + request["segments"]):
        if index == warmup:
            rate_before = max(matmul_rates(request.get("matmul_repeats", 30)).values())
        inputs, targets = segment(stream, index, tgt_len)
        start = time.perf_counter()
        _, memory = lm_loss(forward, impl, inputs, targets, memory)
        elapsed = time.perf_counter() - start
        if index >= warmup:
            seconds.append(elapsed)
    memory_length = memory.get_seq_length() if impl == "transfoxl" else memory[0].shape[0]
    rate_after = max(matmul_rates(request.get("matmul_repeats", 30)).values())
    return {"seconds": seconds, "memory_length": memory_length, "matmul_gflops": [rate_before, rate_after]}


@torch.no_grad()
def phase_vanilla(request: dict) -> dict:
    """Seconds per predicted token (batch 1) at each attention length L: no memory, recomputing a window of L tokens
    for each, against segments of Q = `tgt_len` with a full memory of L - Q. Both compute full log-probabilities.

    Once the memory is full, rounds of one vanilla window and `XL_SEGMENTS_PER_WINDOW` segments alternate, so that a
    busy machine slows both alike; the first round warms up.
    """
    from transfoxl import TxlMemory

    tgt_len = request["tgt_len"]
    model = load_model(request, mem_len=request["mem_len"]).eval()
    model.config.memory_init = "empty"  # the vanilla model sees its window and nothing else
    stream = torch.load(request["tokens"], weights_only=True)["vanilla"]  # [1, N]
    results = {}
    for length in request["attn_lengths"]:
        mem_len = length - tgt_len
        model.config.mem_len = mem_len
        memory = TxlMemory.from_config(model.config, mem_len)
        position = 0  # next segment of the stream for Transformer-XL

        def xl_segment() -> float:
            nonlocal memory, position
            inputs, _ = segment(stream, position, tgt_len)
            position += 1
            start = time.perf_counter()
            memory = model(inputs, past_key_values=memory).past_key_values  # log-probs [1, Q, V] computed
            return (time.perf_counter() - start) / tgt_len

        for _ in range(math.ceil(mem_len / tgt_len)):
            xl_segment()
        vanilla, xl = [], []
        for window in range(1 + VANILLA_WINDOWS):
            start = time.perf_counter()
            model(stream[:, window : window + length], past_key_values=None, use_cache=False, logits_to_keep=1)
            vanilla.append(time.perf_counter() - start)
            xl.append([xl_segment() for _ in range(XL_SEGMENTS_PER_WINDOW)])
        results[str(length)] = {
            "vanilla_s_per_token": vanilla[1:],
            "xl_s_per_token": [seconds for round_ in xl[1:] for seconds in round_],
            "mem_len": mem_len,
            "tgt_len": tgt_len,
            "memory_length": memory.get_seq_length(),
        }
    return {"lengths": results}


PHASES = {
    "save": phase_save,
    "check": phase_check,
    "train": phase_train,
    "eval": phase_eval,
    "vanilla": phase_vanilla,
}


def worker_main() -> int:
    """One JSON request on stdin, one JSON result on stdout (warnings and errors go to stderr)."""
    request = json.loads(sys.stdin.readline())
    if request.get("threads"):
        torch.set_num_threads(request["threads"])
    result = PHASES[request["phase"]](request)
    import transformers

    result.update(
        peak_rss_mb=peak_rss_mb(),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        transformers=transformers.__version__,
    )
    print(json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Parent


def run_worker(python: Path | str, request: dict) -> dict:
    """Run one phase in a fresh process of `python` and return its result."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("PYTHONWARNINGS", "ignore")
    process = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--worker"],
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if process.returncode != 0:
        raise RuntimeError(
            f"the {request['impl']} worker failed in phase {request['phase']!r} (exit {process.returncode}):\n"
            f"{process.stderr[-4000:]}"
        )
    return json.loads(process.stdout.strip().splitlines()[-1])


def matmul_rates(repeats: int = 30) -> dict[str, float]:
    """fp32 `torch.mm` GFLOP/s in this process (its torch threads) for each of `MATMUL_SHAPES`: median of `repeats`."""
    rates = {}
    for m, k, n in MATMUL_SHAPES:
        left, right, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
        for _ in range(3):
            torch.mm(left, right, out=out)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(left, right, out=out)
            times.append(time.perf_counter() - start)
        rates[f"[{m}, {k}] x [{k}, {n}]"] = 2 * m * k * n / statistics.median(times) / 1e9
    return rates


def make_tokens(kind: str, vocab_size: int, shapes: dict[str, tuple[int, int]], seed: int) -> dict[str, torch.Tensor]:
    """Seeded token ids for each phase: uniform over the vocabulary, or Zipf (p proportional to 1 / (id + 1))."""
    tokens = {}
    for offset, (name, shape) in enumerate(sorted(shapes.items())):
        generator = torch.Generator().manual_seed(seed + 1 + offset)
        if kind == "uniform":
            tokens[name] = torch.randint(0, vocab_size, shape, generator=generator)
        else:
            weights = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
            ids = torch.multinomial(weights, shape[0] * shape[1], replacement=True, generator=generator)
            tokens[name] = ids.view(shape)
    return tokens


def vanilla_tokens(attn_lengths: Sequence[int], *, tgt_len: int) -> int:
    """Length of the stream `phase_vanilla` reads: the windows, and the segments that fill the memory and are timed."""
    longest = max(attn_lengths)
    xl_segments = math.ceil(longest / tgt_len) + (1 + VANILLA_WINDOWS) * XL_SEGMENTS_PER_WINDOW
    return max(longest + VANILLA_WINDOWS + 1, xl_segments * tgt_len + 1)


def eval_warmup_segments(*, mem_len: int, tgt_len: int) -> int:
    """Evaluation segments before the timed ones: those that fill the memory, then `EVAL_EXTRA_WARMUP`."""
    return math.ceil(mem_len / tgt_len) + EVAL_EXTRA_WARMUP


def spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": list(values)}


SHAPE_HELP = {
    "batch": "columns of the training and evaluation batches",
    "tgt_len": "segment length, training and evaluation",
    "mem_len": "training memory length",
    "eval_mem_len": "evaluation memory length (filled before timing)",
    "warmup_steps": "training steps per run before the timed ones",
    "train_steps": "timed training steps per run",
    "eval_segments": "timed evaluation segments per run, once the memory is full",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_speed.py",
        description=__doc__.split("\n\n")[0],
        epilog="Writes STEM.json, STEM.md and STEM.png into --out (STEM: --stem).",
    )
    parser.add_argument(
        "--config",
        choices=list(SHAPES),
        default="mid",
        help="model (default: %(default)s; tiny, tiny_wt103: small stand-ins for the tests)",
    )
    parser.add_argument("--runs", type=int, help="runs per implementation and phase (default: mid 5, wt103 3)")
    for name, help_ in SHAPE_HELP.items():
        defaults = ", ".join(f"{config} {SHAPES[config][name]}" for config in ("mid", "wt103"))
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"{help_} (default: {defaults})")
    parser.add_argument(
        "--attn-lengths",
        type=int,
        nargs="+",
        default=[800, 3800],
        help="attention lengths of the comparison with a model without memory, mid only (default: %(default)s)",
    )
    parser.add_argument(
        "--tokens", choices=["uniform", "zipf"], default="uniform", help="token ids (default: uniform)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, help="torch intra-op threads of every process (default: torch's, the machine's cores)"
    )
    parser.add_argument(
        "--attn-implementation", choices=["eager", "sdpa"], default=None, help="transfoxl's (default: the config's)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="transfoxl trains with torch.compile(model, dynamic=False) (minutes of compiling on a CPU; evaluation "
        "stays eager)",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="transfoxl trains with gradient checkpointing (as train.py --gradient-checkpointing); v4 has none",
    )
    parser.add_argument("--skip-v4", action="store_true", help="do not run transformers 4.37.2")
    parser.add_argument(
        "--skip-vanilla",
        action="store_true",
        help="skip the comparison with a model without memory (always skipped for wt103 and tiny_wt103)",
    )
    parser.add_argument("--v4-venv", type=Path, default=REPO / ".bench" / "venv-v4")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks", help="output folder (default: %(default)s)")
    parser.add_argument("--stem", default="speed", help="name of the output files, without suffix (default: speed)")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = DEFAULT_RUNS[args.config]
    for name, default in SHAPES[args.config].items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("runs", *SHAPE_HELP):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    args.run_vanilla = not args.skip_vanilla and args.config in WITH_VANILLA
    if args.run_vanilla:
        for length in args.attn_lengths:
            if length <= args.tgt_len:
                parser.error(f"--attn-lengths must be > the segment length {args.tgt_len}, got {length}")
    args.attn_lengths = sorted(set(args.attn_lengths))
    if not args.stem or Path(args.stem).name != args.stem:
        parser.error(f"--stem must be a file name without a folder, got {args.stem!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = configs.model_config(args.config, dropout=TRAIN_DROPOUT)
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # the matmul rates, measured here, use the workers' thread count
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-speed-"))
    try:
        results = run_benchmark(args, config, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        torch.set_num_threads(threads)  # process-wide: a caller (a test) gets its own back
    results["wall_s"] = time.perf_counter() - started
    results["written_utc"] = written_utc()

    from transfoxl.files import write_bytes_atomically, write_json_atomically, write_text_atomically

    table = markdown(results)
    print("\n" + table)
    written = [f"{args.stem}.json", f"{args.stem}.md", f"{args.stem}.png"]
    write_json_atomically(args.out / written[0], results)
    write_text_atomically(args.out / written[1], table + "\n")
    write_bytes_atomically(args.out / written[2], plot_png(results))
    print(f"\nwrote {', '.join(written)} into {args.out} ({results['wall_s']:.0f} s)")
    return 0


def run_benchmark(args: argparse.Namespace, config: dict, work: Path) -> dict:
    impls = ["transfoxl"] if args.skip_v4 else list(IMPLEMENTATIONS)
    batch, tgt_len = args.batch, args.tgt_len
    eval_warmup = eval_warmup_segments(mem_len=args.eval_mem_len, tgt_len=tgt_len)
    shapes = {
        "train": (batch, (args.warmup_steps + args.train_steps) * tgt_len + 1),
        "eval": (batch, (eval_warmup + args.eval_segments) * tgt_len + 1),
    }
    if args.run_vanilla:
        shapes["vanilla"] = (1, vanilla_tokens(args.attn_lengths, tgt_len=tgt_len))
    tokens = make_tokens(args.tokens, config["vocab_size"], shapes, args.seed)
    torch.save(tokens, work / "tokens.pt")
    fractions = cluster_fractions(tokens["train"], config)
    flops = {
        "train": flops_per_token(
            config,
            tgt_len=tgt_len,
            mem_len=args.mem_len,
            cluster_fractions=fractions,
            batch_size=batch,
            training=True,
        ),
        "eval": flops_per_token(
            config, tgt_len=tgt_len, mem_len=args.eval_mem_len, cluster_fractions=fractions, batch_size=batch
        ),
    }

    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    repeats = 5 if args.config.startswith("tiny") else 30  # tiny: the tests, where seconds count
    matmul_before = matmul_rates(repeats)
    print("fp32 matmul GFLOP/s (before): " + ", ".join(f"{k} {v:.1f}" for k, v in matmul_before.items()), flush=True)

    pythons = {"transfoxl": sys.executable}
    folder = None
    base = {"config": config, "seed": args.seed, "tokens": str(work / "tokens.pt"), "threads": args.threads}
    base["matmul_repeats"] = repeats
    base.update(tgt_len=tgt_len, mem_len=args.mem_len, eval_mem_len=args.eval_mem_len)
    base.update(
        attn_implementation=args.attn_implementation,
        compile=args.compile,
        gradient_checkpointing=args.gradient_checkpointing,
        folder=None,
    )
    sanity = None
    v4_transformers = None
    if not args.skip_v4:
        pythons["v4"] = str(v4.ensure_venv(args.v4_venv))
        folder = work / "v4-model"
        saved = run_worker(pythons["v4"], {**base, "impl": "v4", "phase": "save", "folder": str(folder)})
        v4_transformers = saved["transformers"]
        base["folder"] = str(folder)
        print(f"v4 model saved ({saved['parameters']:,} parameters, transformers {v4_transformers})", flush=True)
        checks = {impl: run_worker(pythons[impl], {**base, "impl": impl, "phase": "check"}) for impl in impls}
        difference = max(abs(a - b) for a, b in zip(checks["transfoxl"]["losses"], checks["v4"]["losses"]))
        sanity = {
            "what": "loss of the first two training segments, dropout off, from v4's zero-filled memory",
            "transfoxl": checks["transfoxl"]["losses"],
            "v4": checks["v4"]["losses"],
            "max_abs_difference": difference,
            "tolerance": SANITY_TOLERANCE,
            "ok": difference <= SANITY_TOLERANCE,
        }
        print(f"sanity: {sanity_line(sanity)}", flush=True)

    runs: dict[str, dict[str, list]] = {impl: {"train": [], "eval": []} for impl in impls}
    phase_options = {"train": {"warmup": args.warmup_steps, "steps": args.train_steps}}
    phase_options["eval"] = {"segments": args.eval_segments}
    for run in range(args.runs):
        order = impls[run % len(impls) :] + impls[: run % len(impls)]  # rotate who goes first
        for phase in ("train", "eval"):
            for impl in order:
                request = {**base, **phase_options[phase], "impl": impl, "phase": phase}
                load = os.getloadavg()[0]  # other processes' load: the cause of most spread on a shared machine
                result = run_worker(pythons[impl], request)
                result["load_average_before"] = load
                rates = [batch * tgt_len / seconds for seconds in result["seconds"]]
                result["tokens_per_s"] = statistics.median(rates)
                result["gflops"] = result["tokens_per_s"] * flops[phase] / 1e9
                result["fraction_of_matmul"] = result["gflops"] / max(result["matmul_gflops"])
                if phase == "train":
                    result["train_memory_mb"] = result["peak_rss_mb"] - result["loaded_rss_mb"]
                runs[impl][phase].append(result)
                memory = (
                    f", peak RSS {result['peak_rss_mb']:.0f} MB (+{result['train_memory_mb']:.0f} MB training)"
                    if phase == "train"
                    else f", peak RSS {result['peak_rss_mb']:.0f} MB"
                )
                print(
                    f"run {run + 1}/{args.runs}  {phase:5}  {LABELS[impl]:20} {result['tokens_per_s']:8.1f} tokens/s"
                    f"{memory}  (load average {load:.1f})",
                    flush=True,
                )

    vanilla = None
    if args.run_vanilla:
        request = {**base, "impl": "transfoxl", "phase": "vanilla", "attn_lengths": args.attn_lengths}
        vanilla = summarize_vanilla(run_worker(pythons["transfoxl"], request), config, fractions)
        for length, entry in vanilla.items():
            print(
                f"attention length {length}: no memory {entry['vanilla_s_per_token']:.4f} s/token, "
                f"XL {entry['xl_s_per_token']:.5f} s/token, speed-up {entry['speedup']:.0f}x",
                flush=True,
            )

    matmul_after = matmul_rates(repeats)
    print("fp32 matmul GFLOP/s (after): " + ", ".join(f"{k} {v:.1f}" for k, v in matmul_after.items()), flush=True)
    worker_rates = [
        rate for impl in impls for phase in runs[impl].values() for run in phase for rate in run["matmul_gflops"]
    ]
    ceiling = max(*matmul_before.values(), *matmul_after.values(), *worker_rates)
    return {
        "setup": {
            "config_name": args.config,
            "config": config,
            "train": {
                "batch": batch,
                "tgt_len": tgt_len,
                "mem_len": args.mem_len,
                "optimizer": f"AdamW(lr={LEARNING_RATE}, fused=True)",
                "warmup_steps": args.warmup_steps,
                "timed_steps": args.train_steps,
            },
            "eval": {
                "batch": batch,
                "tgt_len": tgt_len,
                "mem_len": args.eval_mem_len,
                "warmup_segments": eval_warmup,
                "timed_segments": args.eval_segments,
            },
            "tokens": args.tokens,
            "cluster_fractions": fractions,
            "seed": args.seed,
            "runs": args.runs,
            "threads": args.threads,
            "vanilla": "run" if args.run_vanilla else ("skipped" if args.skip_vanilla else "mid only"),
            "attn_implementation": args.attn_implementation,
            "compile": args.compile,
            "gradient_checkpointing": args.gradient_checkpointing,
            "options": {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()},
        },
        "machine": {
            **machine_facts(),
            "transformers": importlib.metadata.version("transformers"),
            "transformers_v4": v4_transformers,
        },
        "matmul_gflops": {"before": matmul_before, "after": matmul_after, "workers": worker_rates, "ceiling": ceiling},
        "flops_per_token": flops,
        "sanity": sanity,
        "runs": runs,
        "summary": summarize(runs, ceiling),
        "vanilla": vanilla,
    }


def summarize(runs: dict, ceiling: float) -> dict:
    """Median (min-max) over runs of each measure, per implementation, and transfoxl / v4 ratios of the medians."""
    summary: dict[str, Any] = {}
    for impl, phases in runs.items():
        train, evaluation = phases["train"], phases["eval"]
        entry = {
            "train_tokens_per_s": spread([run["tokens_per_s"] for run in train]),
            "eval_tokens_per_s": spread([run["tokens_per_s"] for run in evaluation]),
            "train_peak_rss_mb": spread([run["peak_rss_mb"] for run in train]),
            "train_memory_mb": spread([run["train_memory_mb"] for run in train]),
            "eval_peak_rss_mb": spread([run["peak_rss_mb"] for run in evaluation]),
            "train_gflops": spread([run["gflops"] for run in train]),
            "eval_gflops": spread([run["gflops"] for run in evaluation]),
        }
        # Each run against the rate measured beside it (the goal's figure), and against the best rate seen at all
        for phase, results in (("train", train), ("eval", evaluation)):
            entry[f"{phase}_fraction_of_matmul"] = statistics.median(run["fraction_of_matmul"] for run in results)
            entry[f"{phase}_fraction_of_best_matmul"] = entry[f"{phase}_gflops"]["median"] / ceiling
        summary[impl] = entry
    if "v4" in summary:
        ours, theirs = summary["transfoxl"], summary["v4"]
        summary["ratio"] = {
            name: ours[name]["median"] / theirs[name]["median"]
            for name in ours
            if isinstance(ours[name], dict) and theirs[name]["median"]
        }
        # Run i of each implementation ran back to back, so their ratio is less exposed to the machine's load
        # drifting between runs than the ratio of the medians.
        summary["paired_ratios"] = {
            phase: [
                mine["tokens_per_s"] / other["tokens_per_s"]
                for mine, other in zip(runs["transfoxl"][phase], runs["v4"][phase])
            ]
            for phase in ("train", "eval")
        }
    return summary


def summarize_vanilla(result: dict, config: dict, fractions: list[float]) -> dict:
    summary = {}
    for length, entry in result["lengths"].items():
        vanilla, xl = statistics.median(entry["vanilla_s_per_token"]), statistics.median(entry["xl_s_per_token"])
        summary[length] = {
            **entry,
            "vanilla_s_per_token": vanilla,
            "xl_s_per_token": xl,
            "vanilla_raw": entry["vanilla_s_per_token"],
            "xl_raw": entry["xl_s_per_token"],
            "speedup": vanilla / xl,
            "paper_speedup": PAPER_SPEEDUPS.get(int(length)),
            # the window of L tokens costs a forward over all of them, for one predicted token
            "vanilla_flops_per_token": int(length)
            * flops_per_token(config, tgt_len=int(length), mem_len=0, cluster_fractions=fractions, all_clusters=True),
            "xl_flops_per_token": flops_per_token(
                config,
                tgt_len=entry["tgt_len"],
                mem_len=entry["mem_len"],
                cluster_fractions=fractions,
                all_clusters=True,
            ),
        }
    return summary


# ---------------------------------------------------------------------------------------------------------------------
# Output


def sanity_line(sanity: dict | None) -> str:
    if sanity is None:
        return "not run (--skip-v4)"
    verdict = "same losses" if sanity["ok"] else f"DIFFERENT (tolerance {sanity['tolerance']:g})"
    pairs = ", ".join(f"{a:.6f} / {b:.6f}" for a, b in zip(sanity["transfoxl"], sanity["v4"]))
    return f"{verdict}: transfoxl / v4 {pairs}; max difference {sanity['max_abs_difference']:.2e}"


def cell(entry: dict | None, name: str, digits: int = 1) -> str:
    if entry is None:
        return "not run"
    value = entry[name]
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}-{value['max']:.{digits}f})"


def variant_sentence(setup: dict) -> str:
    """How transfoxl trained, when not the default eager way (both options only change training)."""
    variants = []
    if setup.get("compile"):
        variants.append("torch.compile(dynamic=False)")
    if setup.get("gradient_checkpointing"):
        variants.append("gradient checkpointing (each layer recomputed in backward)")
    return f" transfoxl trains with {' and '.join(variants)}." if variants else ""


def markdown(results: dict) -> str:
    setup, machine, summary = results["setup"], results["machine"], results["summary"]
    ours, theirs, ratio = summary["transfoxl"], summary.get("v4"), summary.get("ratio", {})
    matmul, flops = results["matmul_gflops"], results["flops_per_token"]
    config, train, evaluation = setup["config"], setup["train"], setup["eval"]

    def ratio_cell(name: str) -> str:
        return f"{ratio[name]:.2f}x" if name in ratio else "-"

    worker_rates = matmul.get("workers") or [matmul["ceiling"]]

    def flop_cell(entry: dict | None, phase: str) -> str:
        if entry is None:
            return "not run"
        beside, best = entry[f"{phase}_fraction_of_matmul"], entry.get(f"{phase}_fraction_of_best_matmul")
        best_part = "" if best is None else f"; {100 * best:.0f}% of the best"
        return f"{entry[f'{phase}_gflops']['median']:.1f} ({100 * beside:.0f}%{best_part})"

    lines = [
        f"Transformer-XL, {setup['config_name']} config ({config['n_layer']} layers, d_model {config['d_model']}, "
        f"{config['n_head']} heads x {config['d_head']}, d_inner {config['d_inner']}, vocab {config['vocab_size']}, "
        f"cutoffs {config['cutoffs']}, div_val {config['div_val']}), fp32, {setup['tokens']} token ids. "
        f"Training: batch {train['batch']} x {train['tgt_len']}, mem_len {train['mem_len']}, dropout "
        f"{config['dropout']}, fused AdamW, {train['warmup_steps']} warm-up and {train['timed_steps']} timed steps; "
        f"evaluation: batch {evaluation['batch']} x {evaluation['tgt_len']}, mem_len {evaluation['mem_len']}, loss "
        f"only, {evaluation['warmup_segments']} warm-up and {evaluation['timed_segments']} timed segments. Median "
        f"over {setup['runs']} runs (min-max), each a fresh process, implementations alternated."
        + variant_sentence(setup),
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores ({machine['torch_threads']} torch threads), "
        f"torch {machine['torch']}, transformers {machine['transformers']} (transfoxl) and "
        f"{machine['transformers_v4'] or '4.37.2 (not run)'}; transfoxl's inference attention: "
        f"{machine.get('attention_kernel', 'torch')}. Measured fp32 matmul rate: "
        f"{matmul['ceiling']:.1f} GFLOP/s at best (before and after the runs: "
        + ", ".join(f"{shape} {rate:.1f} / {matmul['after'][shape]:.1f}" for shape, rate in matmul["before"].items())
        + f"; in the workers, beside their timed steps: {min(worker_rates):.1f}-{max(worker_rates):.1f}"
        + "). The % of the rate: each run's against the rate its worker measured beside it (median), then against the "
        "best.",
        "",
        f"Same weights, sanity check ({results['sanity']['what'] if results['sanity'] else 'loss'}): "
        f"{sanity_line(results['sanity'])}.",
        "",
        "| | transfoxl | transformers 4.37.2 | transfoxl / 4.37.2 |",
        "|---|---|---|---|",
        f"| training tokens/s | {cell(ours, 'train_tokens_per_s')} | {cell(theirs, 'train_tokens_per_s')} | "
        f"{ratio_cell('train_tokens_per_s')} |",
        f"| evaluation tokens/s | {cell(ours, 'eval_tokens_per_s')} | {cell(theirs, 'eval_tokens_per_s')} | "
        f"{ratio_cell('eval_tokens_per_s')} |",
        f"| peak RSS, training (MB) | {cell(ours, 'train_peak_rss_mb', 0)} | {cell(theirs, 'train_peak_rss_mb', 0)} | "
        f"{ratio_cell('train_peak_rss_mb')} |",
        f"| training memory above the loaded model (MB) | {cell(ours, 'train_memory_mb', 0)} | "
        f"{cell(theirs, 'train_memory_mb', 0)} | {ratio_cell('train_memory_mb')} |",
        f"| peak RSS, evaluation (MB) | {cell(ours, 'eval_peak_rss_mb', 0)} | {cell(theirs, 'eval_peak_rss_mb', 0)} | "
        f"{ratio_cell('eval_peak_rss_mb')} |",
        f"| model GFLOP/s, training (% of fp32 matmul rate) | {flop_cell(ours, 'train')} | "
        f"{flop_cell(theirs, 'train')} | {ratio_cell('train_gflops')} |",
        f"| model GFLOP/s, evaluation (% of fp32 matmul rate) | {flop_cell(ours, 'eval')} | "
        f"{flop_cell(theirs, 'eval')} | {ratio_cell('eval_gflops')} |",
        "",
        f"Model FLOPs per token (matrix products, `flops_per_token`): training {flops['train'] / 1e6:.1f} M "
        f"(forward + backward), evaluation {flops['eval'] / 1e6:.1f} M.",
    ]
    if "paired_ratios" in summary:
        paired = summary["paired_ratios"]
        lines += [
            "",
            "Tokens/s ratios of the runs made back to back (run i of each implementation): training "
            + ", ".join(f"{value:.2f}" for value in paired["train"])
            + f" (median {statistics.median(paired['train']):.2f}x); evaluation "
            + ", ".join(f"{value:.2f}" for value in paired["eval"])
            + f" (median {statistics.median(paired['eval']):.2f}x).",
        ]
    if results["vanilla"]:
        lines += [
            "",
            "Evaluation speed against a model without memory (Dai et al. 2019, Table 9), transfoxl, batch 1: the "
            "vanilla model recomputes a window of L tokens for each predicted token; Transformer-XL reads segments "
            f"of {train['tgt_len']} with a full memory of L - {train['tgt_len']}. Full log-probabilities for each "
            "predicted token; "
            f"median over {VANILLA_WINDOWS} windows and {VANILLA_WINDOWS * XL_SEGMENTS_PER_WINDOW} segments, "
            "interleaved.",
            "",
            "| attention length | vanilla s/token | Transformer-XL s/token | speed-up | paper (GPU, its models) |",
            "|---|---|---|---|---|",
        ]
        for length, entry in results["vanilla"].items():
            paper = f"{entry['paper_speedup']:,}x" if entry["paper_speedup"] else "-"
            lines.append(
                f"| {int(length):,} | {entry['vanilla_s_per_token']:.4f} | {entry['xl_s_per_token']:.6f} | "
                f"{entry['speedup']:,.0f}x | {paper} |"
            )
    return "\n".join(lines)


def plot_png(results: dict) -> bytes:
    """Tokens/s of both implementations (training, evaluation), and the no-memory speed-ups next to the paper's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    summary = results["summary"]
    impls = [impl for impl in IMPLEMENTATIONS if impl in summary]
    phases = [("train_tokens_per_s", "training"), ("eval_tokens_per_s", "evaluation")]
    bar = 0.8 / len(impls)
    for offset, impl in enumerate(impls):
        medians = [summary[impl][name]["median"] for name, _ in phases]
        errors = [
            [summary[impl][name]["median"] - summary[impl][name]["min"] for name, _ in phases],
            [summary[impl][name]["max"] - summary[impl][name]["median"] for name, _ in phases],
        ]
        positions = [index + (offset - (len(impls) - 1) / 2) * bar for index in range(len(phases))]
        bars = left.bar(positions, medians, bar, yerr=errors, capsize=3, label=LABELS[impl])
        left.bar_label(bars, fmt="%.0f", padding=2, fontsize=8)
    if "ratio" in summary:
        labels = [f"{label}\n({summary['ratio'][name]:.2f}x)" for name, label in phases]
    else:
        labels = [label for _, label in phases]
    left.set_xticks(range(len(phases)), labels)
    left.set_ylabel("tokens/s (median, min-max)")
    train = results["setup"]["train"]
    left.set_title(f"{results['setup']['config_name']} config, batch {train['batch']} x {train['tgt_len']}")
    left.legend()
    if results["vanilla"]:
        lengths = list(results["vanilla"])
        ours = [results["vanilla"][length]["speedup"] for length in lengths]
        paper = [results["vanilla"][length]["paper_speedup"] or 0 for length in lengths]
        positions = range(len(lengths))
        bars = right.bar([p - 0.2 for p in positions], ours, 0.4, label="transfoxl (this machine)")
        right.bar_label(bars, fmt="%.0fx", padding=2, fontsize=8)
        bars = right.bar([p + 0.2 for p in positions], paper, 0.4, label="paper, Table 9")
        right.bar_label(bars, fmt="%.0fx", padding=2, fontsize=8)
        right.set_xticks(list(positions), [f"L = {int(length):,}" for length in lengths])
        right.set_yscale("log")
        right.set_ylabel("speed-up over no memory (log scale)")
        right.set_title("evaluation, batch 1")
        right.legend()
    else:
        right.set_axis_off()
    return png_bytes(figure)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        raise SystemExit(worker_main())
    raise SystemExit(main())
