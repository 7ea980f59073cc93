"""Decoding and prefill speed: transfoxl against transformers' GPT-2 of equal size, and the WikiText-103 model against
the machine's compute and bandwidth floors and against transformers 4.37.2 on the same weights. fp32 on the CPU, greedy
`generate()` after a prompt (issue 17, goal 1).

Part 1, the mid configuration (tools/configs.py "mid": 6 layers, d_model 256, 8 heads x 32, d_inner 1024, vocab 10,000
with cutoffs [2000, 5000] and div_val 2; mem_len 512, clamp_len -1, same_length False, dropout 0) against
transformers' own `GPT2LMHeadModel` of the same width, depth, heads, n_inner and vocabulary (n_positions = prompt +
new tokens; its default GELU, full softmax and tied output layer) with its KV cache (`DynamicCache`), both seeded
random weights, both in this process. At each batch size (1 and 8), run after run, the two alternate (the order
rotating), and each of them is timed two ways on the same 512-token prompt:

- `generate()`: greedy, `max_new_tokens = min_new_tokens = N` (64), no end-of-sequence id, so both produce N tokens.
  transformers calls the stopping criteria once per new token, after that step's forward and token choice; a
  criterion that only records `time.perf_counter()` (`StepClock`) gives the **prefill** as the time from the call to
  the first token (generate's set-up, the prompt's forward, the first token's choice: what a user waits for) and the
  **decode step** as the median of the N - 1 intervals between tokens (forward, logits processing, token choice,
  cache and generate() bookkeeping: what each further token costs);
- model forward calls: the same work without `generate()`: the prompt's forward (`logits_to_keep=1`, with the
  all-ones attention mask generate() passes) timed alone, then N - 1 one-token forwards with the cache, each timed
  alone (the mask grown between calls, outside the timing); the median step. The difference to the `generate()` step
  is generate()'s own per-token work (`prepare_inputs_for_generation`, logits processors, `_update_model_kwargs`, the
  stopping checks). The greedy tokens of both loops are compared (`same_tokens`).

Medians over runs (each run's value being that run's median step), min-max, transfoxl / GPT-2 ratios of the
medians and of the runs made back to back. Prompt ids are drawn from [1, vocab): with `pad_token_id=0` absent from
the prompt, generate() infers no padding and passes an all-ones mask to both models.

Part 2, the WikiText-103 configuration (`TxlConfig()` defaults: 18 layers, d_model 1024, 16 heads x 64, d_inner
4096, vocab 267,735 with cutoffs [20000, 40000, 200000] and div_val 4, mem_len 1600, clamp_len 1000, same_length
True; dropout 0), random weights (those transformers 4.37.2 saved, unless v4 is skipped: see below), batch 1, from
an empty memory (transfoxl's default), in a fresh worker process (so that its peak RSS is its own):

- prefill of the 512-token prompt against the **compute floor**: the prefill's matrix products (`forward_flops`: the
  projections, the relative-position product W_{k,R} R, the content and position scores and probabilities @ values
  over all Q x K pairs, the feed-forward, the adaptive embedding's projections, and the full 267,735-token adaptive
  softmax of the last position, the one generate() asks for) divided by the best fp32 `torch.mm` rate this worker
  measures (shapes of the prefill's feed-forward and a square one, before the model is built and after the runs);
- the decode step against the **bandwidth floor**: the bytes one step must read (`step_bytes`: every weight the step's
  products use, i.e. all parameters but the input embedding's own tables (one row is looked up; tied tables are read
  by the softmax anyway), the memory's keys and values, and the sinusoid table R of the K distances once), divided by
  the best bandwidth a large fp32 matrix-vector product (`torch.mv`, the matrix as two halves in one batched
  product, or the compiled kernel's `row_linear`, the form the model uses where it is built; all over 256 MB)
  reaches in the same worker; and each run against the floor
  at the bandwidth measured just before it (the goal's row: the median of those ratios, as the host's other work
  moves the bandwidth from run to run); and, where the compiled kernel is built, bare steps timed again, each against
  the floor at the `row_linear` bandwidth read right after it (`steps_beside_bandwidth`: the host's phase can change
  within a run, which the reading before it does not see);
- peak RSS of the worker (the model, the prefill and the decode steps; the rate measurements' buffers excluded: the
  peak is reset once a run's bandwidth probe is freed, `machine.reset_peak_rss`).

End to end against transformers 4.37.2 (v4), on the same weights (the default; `--skip-v4`, or `--quick` without
`--with-v4`, skips it, and the transfoxl worker then builds the seeded model itself). v4 runs in its own virtualenv
(`.bench/venv-v4`, created by tools/v4.py the first time: needs PyPI), in workers that run this file there: only the
standard library, torch and this folder's configs, machine and v4 are imported at the top. One builds the seeded model
with v4's `TransfoXLLMHeadModel` (mem_len 1600, dropout 0) and saves it (`--v4-model`, by default
`.bench/decode-v4-model-CONFIG`, 1.1 GB for wt103; reused by later runs of the same configuration, mem_len and seed:
a stamp written last says what it holds); the next loads it, times v4's greedy generate() on the same prompt for the
same new tokens run after run (prefill, decode step, end to end, as above), and scores the prompt. Then the transfoxl
worker loads that folder through `AutoModelForCausalLM.from_pretrained` (a legacy `transfo-xl` checkpoint, converted
on load) and, in each run, after the measures above, times generate() again from v4's start: a new v4 stream attends
to mem_len zero vectors (`init_mems`), which transfoxl reproduces with `memory_init="zeros"`. That is the same work as
v4's, whose outputs must come back: the greedy tokens of every run of both (`same_tokens`), and the log-probabilities
of the prompt's last position (max |difference|). The table puts transfoxl from v4's zero memory, transfoxl from its
default empty memory (the runs above) and v4 side by side, with the transfoxl / v4 ratios; peak RSS is each worker's
(transfoxl's ran both ways, and imports transformers v5).

What v4's generate() does, which its figures include: 4.37.2 keeps the memory between steps (its
`prepare_inputs_for_generation` passes the returned `mems` back and feeds the last token only), but the memory holds
hidden states, so every step recomputes the keys and values of all mem_len positions (full from the start: the zeros
fill it), and the prefill scores every position of the prompt (the full [1, 512, 267,735] log-probabilities). Its
stopping criteria are asked through `any(...)` with its own max-length criterion first, which stops generation at the
last token before the clock is asked: v4's decode step is the median of the N - 2 intervals it sees (so
`--wt103-new-tokens` >= 3 when v4 runs).

A profile of the mid configuration's decode step at batch 1 (torch.profiler with each module labelled, and
cProfile; both only over the decode steps, after the prefill; one thread by default, `--profile-threads`) goes to
decode.profile.md: time per step by module, the top operators (aten and the compiled kernels), calls per step, and
the Python functions with the most own time.

Threads: `--threads` (default: the machine's cores) for both parts, recorded. On a CPU shared with other work, a
multi-threaded step can stall: each parallel region waits until its second thread gets a core, a scheduler slice
(we saw whole runs 10-30x slower on the 2-core machine while other work held a core); the per-run load average is
recorded, and the medians over runs are what to read. At batch 1 the mid decode step is as fast with one thread.

    python tools/bench_decode.py                     # writes benchmarks/decode.{json,md,png}, decode.profile.md
    python tools/bench_decode.py --skip-v4           # no transformers 4.37.2: no virtualenv, no network
    python tools/bench_decode.py --skip-wt103        # the mid part and the profile only (about 2 minutes)
    python tools/bench_decode.py --skip-wt103 --skip-profile --threads 1 --runs 5 --stem decode.mid-1thread
    python tools/bench_decode.py --quick --out /tmp/decode   # tiny models, seconds, no v4 (the tests)
    python tools/bench_decode.py --quick --with-v4 --skip-mid --threads 1 --out /tmp/decode   # v4's path, tiny
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib.metadata
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

# Only the standard library, torch and this folder's configs, machine and v4 at the top: the same file is the v4
# worker inside the transformers 4.37.2 virtualenv, where neither transfoxl nor transformers v5 exists.
if __package__:  # imported (`from tools import bench_decode`) or run with `python -m tools.bench_decode`
    from . import configs, v4
    from .machine import cpu_name, current_rss_mb, machine_facts, peak_rss_mb, png_bytes, reset_peak_rss, written_utc
else:  # run as a file, `python tools/bench_decode.py`: its folder is the first entry of sys.path
    import configs
    import v4
    from machine import cpu_name, current_rss_mb, machine_facts, peak_rss_mb, png_bytes, reset_peak_rss, written_utc

REPO = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ("transfoxl", "gpt2")
LABELS = {"transfoxl": "transfoxl", "gpt2": "GPT-2 (KV cache)"}
STALL_SPREAD = 3.0  # max / min of a measure over runs beyond which the table warns that runs stalled
PAD_TOKEN_ID = 0  # never in the prompts (drawn from [1, vocab)), so generate() passes an all-ones mask

# The full run and the quick one (the tests): the same code, on tiny models with tiny prompts.
FULL = dict(
    mid_config="mid",
    wt103_config="wt103",
    mid_mem_len=512,
    wt103_mem_len=1600,
    prompt_len=512,
    new_tokens=64,
    runs=7,
    batch_sizes=[1, 8],
    wt103_new_tokens=16,
    wt103_runs=5,
    profile_steps=32,
    rate_repeats=10,
    matmul_shapes=[(512, 1024, 4096), (512, 4096, 1024), (2048, 2048, 2048)],  # [m, k] x [k, n]
    mv_shapes=[(16384, 4096), (4096, 16384)],  # [rows, cols] x [cols]: 256 MB each
)
QUICK = dict(FULL, mid_config="tiny", wt103_config="tiny_wt103", mid_mem_len=16, wt103_mem_len=20, prompt_len=16)
QUICK.update(new_tokens=5, runs=1, batch_sizes=[1, 2], wt103_new_tokens=4, wt103_runs=1, profile_steps=4)
QUICK.update(rate_repeats=3, matmul_shapes=[(64, 64, 64)], mv_shapes=[(512, 512)])


# ---------------------------------------------------------------------------------------------------------------------
# Analytic counts: FLOPs of a forward, bytes of a decode step


def cluster_widths(config: Mapping[str, Any]) -> list[int]:
    """Embedding width of each cluster of the adaptive embedding / softmax (d_embed / div_val^i)."""
    d_embed, div_val = config.get("d_embed") or config["d_model"], config["div_val"]
    clusters = len(config["cutoffs"]) + 1
    return [d_embed // div_val**cluster if div_val > 1 else d_embed for cluster in range(clusters)]


def cluster_fractions(tokens: torch.Tensor, config: Mapping[str, Any]) -> list[float]:
    """Fraction of `tokens` in each cluster of the adaptive embedding / softmax."""
    bounds = [0, *config["cutoffs"], config["vocab_size"]]
    return [float(((tokens >= low) & (tokens < high)).float().mean()) for low, high in pairwise(bounds)]


def forward_flops(
    config: Mapping[str, Any],
    *,
    q_len: int,
    mem_len: int,
    batch: int,
    input_fractions: Sequence[float],
    scored_positions: int,
    project_positions: bool = True,
) -> dict[str, float]:
    """FLOPs of the matrix products of one forward of `batch` x `q_len` tokens attending to `mem_len` memory
    positions, by part, and their `total`; 2 FLOPs per multiply-add, as the model defines the products.

    Per layer: the query, key, value and output projections of the Q new positions (the memory's keys and values are
    kept from earlier calls), W_{k,R} R for the K = mem_len + Q distances (once per forward, shared by the batch; not
    counted with `project_positions=False`, for a decode step that reads the projected table kept by earlier calls),
    the content and position scores and probabilities @ values over all Q x K pairs (masked pairs included), and the
    two feed-forward products. Then the adaptive embedding's projection of each input token (its cluster's, weighted
    by `input_fractions`) and the full adaptive softmax (head, and every tail cluster with its projection) of
    `scored_positions` positions per sequence. Not counted: softmax, layer norms, biases, element-wise operations.
    """
    width, heads, head_dim = config["d_model"], config["n_head"], config["d_head"]
    inner, k_len, tokens = heads * head_dim, mem_len + q_len, batch * q_len
    n_layer = config["n_layer"]
    widths = cluster_widths(config)
    bounds = [0, *config["cutoffs"], config["vocab_size"]]
    if len(input_fractions) != len(widths):
        raise ValueError(f"input_fractions needs {len(widths)} values (one per cluster), got {input_fractions}.")
    projected = config["div_val"] > 1 or widths[0] != width  # else embedding and softmax work in d_model directly
    head_size = bounds[1] + len(widths) - 1  # shortlist + one logit per tail cluster
    softmax = 0.0
    for cluster, cluster_width in enumerate(widths):
        size = head_size if cluster == 0 else bounds[cluster + 1] - bounds[cluster]
        softmax += (2 * width * cluster_width if projected else 0) + 2 * cluster_width * size
    parts = {
        "projections": n_layer * tokens * (2 * width * 3 * inner + 2 * inner * width),
        "relative_positions": n_layer * 2 * k_len * width * inner if project_positions else 0.0,
        "attention": n_layer * batch * 3 * (2 * q_len * k_len * inner),  # (a)+(c), (b)+(d), probabilities @ values
        "feed_forward": n_layer * tokens * 2 * (2 * width * config["d_inner"]),
        "embedding": tokens * sum(f * 2 * w * width for f, w in zip(input_fractions, widths)) if projected else 0.0,
        "adaptive_softmax": batch * scored_positions * softmax,
    }
    parts["total"] = sum(parts.values())
    return parts


def step_bytes(
    config: Mapping[str, Any], *, weight_bytes: int, mem_lengths: Sequence[int], batch: int, element_size: int = 4
) -> dict[str, float]:
    """Bytes one decode step must read, averaged over steps that attend to `mem_lengths` memory positions.

    `weight_bytes`: the weights the step's products use (`weights_read_by_a_step`). Per layer, the memory's keys and
    values (`[B, M, H*D]` each); once, the sinusoid table R of the K = M + 1 distances, from which a step can get the
    position terms of every layer (W_{k,R}^T (q + v) against R). The implementation reads a projected table
    `[H, K, D]` per layer instead: `relative_keys_read` (not in the floor).
    """
    inner, mean_memory = config["n_head"] * config["d_head"], statistics.fmean(mem_lengths)
    keys_values = config["n_layer"] * 2 * batch * mean_memory * inner * element_size
    positions = (mean_memory + 1) * config["d_model"] * element_size
    return {
        "weights": float(weight_bytes),
        "keys_values": keys_values,
        "positions": positions,
        "total": weight_bytes + keys_values + positions,
        "relative_keys_read": config["n_layer"] * (mean_memory + 1) * inner * element_size,
        "mean_memory_length": mean_memory,
    }


def decode_mem_lengths(*, prompt_len: int, new_tokens: int, mem_len: int) -> list[int]:
    """Memory length seen by each timed decode step (the 2nd to the Nth new token; the 1st comes with the prefill)."""
    return [min(prompt_len + step, mem_len) for step in range(new_tokens - 1)]


# ---------------------------------------------------------------------------------------------------------------------
# Machine rates


def matmul_rates(shapes: Sequence[tuple[int, int, int]], repeats: int) -> dict[str, float]:
    """fp32 `torch.mm` GFLOP/s for each `[m, k] x [k, n]` shape: median of `repeats` after 2 warm-ups."""
    rates = {}
    for m, k, n in shapes:
        left, right, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
        seconds = time_repeated(functools.partial(torch.mm, left, right, out=out), repeats)
        rates[f"[{m}, {k}] x [{k}, {n}]"] = 2 * m * k * n / seconds / 1e9
    return rates


def mv_bandwidths(shapes: Sequence[tuple[int, int]], repeats: int) -> dict[str, float]:
    """GB/s (1e9 bytes/s) at which an fp32 matrix-vector product reads a `[rows, cols]` matrix: median of `repeats`,
    for `torch.mv`, for the matrix as two halves in one batched product (`transfoxl.kernels_txl.one_row_linear`'s
    form without the compiled kernel, which BLAS reads faster on some CPUs) and for the compiled kernel's
    `row_linear` where it is built: the floor is the best of them, so that the model's own way of reading cannot
    beat it."""
    from transfoxl.cpp_kernels_txl import compiled_operators

    operators, rates = compiled_operators(), {}
    for rows, cols in shapes:
        matrix, vector, out = torch.randn(rows, cols), torch.randn(cols), torch.empty(rows)
        seconds = time_repeated(functools.partial(torch.mv, matrix, vector, out=out), repeats)
        rates[f"mv [{rows}, {cols}]"] = matrix.numel() * matrix.element_size() / seconds / 1e9
        halves = matrix.view(2, rows // 2, cols)
        column = vector.view(1, cols).t().expand(2, cols, 1)
        halves_out = torch.empty(2, rows // 2, 1)
        seconds = time_repeated(functools.partial(torch.bmm, halves, column, out=halves_out), repeats)
        rates[f"halves [{rows}, {cols}]"] = matrix.numel() * matrix.element_size() / seconds / 1e9
        if operators is not None:
            seconds = time_repeated(functools.partial(operators.row_linear, vector, matrix, None), repeats)
            rates[f"row_linear [{rows}, {cols}]"] = matrix.numel() * matrix.element_size() / seconds / 1e9
    return rates


def time_repeated(call: Callable[[], object], repeats: int) -> float:
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------------------------------
# Models and timing


def build_transfoxl(config: Mapping[str, Any], *, mem_len: int, seed: int) -> torch.nn.Module:
    import transfoxl

    torch.manual_seed(seed)
    return transfoxl.TxlForCausalLM(transfoxl.TxlConfig(**config, mem_len=mem_len)).eval()


def gpt2_config_for(config: Mapping[str, Any], *, n_positions: int) -> dict[str, Any]:
    """GPT2Config arguments of the same width, depth, heads, inner size and vocabulary as the TXL `config`."""
    if config["n_head"] * config["d_head"] != config["d_model"]:
        raise ValueError("GPT-2's heads split d_model: the configuration needs n_head * d_head == d_model.")
    return dict(
        vocab_size=config["vocab_size"],
        n_positions=n_positions,
        n_embd=config["d_model"],
        n_layer=config["n_layer"],
        n_head=config["n_head"],
        n_inner=config["d_inner"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )


def build_gpt2(gpt2_config: Mapping[str, Any], *, seed: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**gpt2_config)).eval()


def make_prompt(vocab_size: int, batch: int, prompt_len: int, seed: int) -> torch.Tensor:
    """Seeded ids in [1, vocab_size): the pad id 0 is never in a prompt."""
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randint(1, vocab_size, (batch, prompt_len), generator=generator)


def step_clock(
    on_first: Callable[[], None] | None = None,
    *,
    v4_api: bool = False,
    synchronize: Callable[[], None] | None = None,
):
    """A stopping criterion that stops nothing and records when each generate() step ends (`.times`).

    transformers calls the stopping criteria once per new token, after that step's forward and token choice.
    `on_first` runs at the first call (after the prefill): the profiles start there. `v4_api`: answer one Python
    bool for the batch, as transformers 4.37.2 expects (later versions take a `[B]` tensor). `synchronize`: called
    before each time is read (an accelerator's queued work, `tools/gpu_check.py`).
    """
    from transformers import StoppingCriteria

    class StepClock(StoppingCriteria):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None, **kwargs) -> torch.Tensor:
            if synchronize is not None:
                synchronize()
            self.times.append(time.perf_counter())
            if len(self.times) == 1 and on_first is not None:
                on_first()
            if v4_api:
                return False
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StepClock()


def generate_kwargs(new_tokens: int) -> dict[str, Any]:
    return dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_id=None,
    )


def time_generate(
    model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, *, v4_api: bool = False
) -> dict[str, Any]:
    """Greedy generate(): time to the first token (prefill), the intervals between the next ones (steps), the total.

    `v4_api`: transformers 4.37.2's generate(), whose criteria list answers `any(...)` with its own max-length
    criterion first: at the last token that one stops generation and the clock is not asked, so the clock sees
    N - 1 tokens and the steps are the N - 2 intervals between them.
    """
    from transformers import StoppingCriteriaList

    clock = step_clock(v4_api=v4_api)
    start = time.perf_counter()
    output = model.generate(prompt, stopping_criteria=StoppingCriteriaList([clock]), **generate_kwargs(new_tokens))
    total = time.perf_counter() - start
    new = output[:, prompt.shape[1] :]
    if new.shape[1] != new_tokens or len(clock.times) != new_tokens - v4_api:
        raise RuntimeError(f"generate() made {new.shape[1]} tokens in {len(clock.times)} steps, not {new_tokens}")
    steps = [later - earlier for earlier, later in pairwise(clock.times)]
    return {"prefill_s": clock.times[0] - start, "steps_s": steps, "total_s": total, "tokens": new.tolist()}


@torch.no_grad()
def cache_of(output: Mapping[str, Any]) -> tuple[str, Any]:
    """The cache an output holds and its name, which is the models' argument's name too: `cache` since transformers
    5.24, `past_key_values` before (read here without 5.24's warning that the old name is deprecated)."""
    name = "cache" if "cache" in output else "past_key_values"
    return name, output[name]


def time_forward(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    new_tokens: int,
    impl: str,
    after_step: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """The model calls generate() makes, timed alone: the prompt's forward, then one-token forwards with the cache.

    Each gets what generate() passes it: the cache, `logits_to_keep=1` and an all-ones attention mask (GPT-2 takes
    the whole sequence's, transfoxl the new tokens' columns: its memory remembers earlier padding). `after_step`,
    called after each step's timing, gives a number kept beside it (`after_steps`).
    """
    batch = prompt.shape[0]
    mask = torch.ones_like(prompt)
    start = time.perf_counter()
    output = model(input_ids=prompt, attention_mask=mask, use_cache=True, logits_to_keep=1)
    token = output.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
    prefill = time.perf_counter() - start
    tokens, steps, after = [token], [], []
    for _ in range(new_tokens - 1):
        cache_name, cache = cache_of(output)
        if impl == "gpt2":
            mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)  # [B, S + 1]
            step_mask = mask
        else:
            step_mask = mask.new_ones(batch, 1)  # [B, 1]
        start = time.perf_counter()
        output = model(
            input_ids=token, attention_mask=step_mask, use_cache=True, logits_to_keep=1, **{cache_name: cache}
        )
        token = output.logits[:, -1].argmax(-1, keepdim=True)
        steps.append(time.perf_counter() - start)
        tokens.append(token)
        if after_step is not None:
            after.append(after_step())
    return {
        "prefill_s": prefill,
        "steps_s": steps,
        "after_steps": after,
        "tokens": torch.cat(tokens, dim=1).tolist(),
    }


def steps_beside_bandwidth(
    model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, runs: int, probe_shape: Sequence[int], repeats: int
) -> dict[str, list[float]]:
    """`time_forward`'s steps again, `runs` times (the memory lengths the floor counts), each followed by the
    bandwidth of `row_linear` over a `probe_shape` matrix, measured as the floor's (`time_repeated`: the median of
    `repeats` after two warm-ups): a step and the bandwidth of the same moment, where a run's reading before it misses
    a phase of the host that changes within the run. Empty lists where the compiled kernel is not built."""
    from transfoxl.cpp_kernels_txl import compiled_operators

    operators = compiled_operators()
    if operators is None:
        return {"steps_s": [], "gbytes_per_s": []}
    matrix = torch.randn(*probe_shape)
    probe = functools.partial(operators.row_linear, torch.randn(matrix.shape[1]), matrix, None)

    def bandwidth() -> float:
        return matrix.numel() * matrix.element_size() / time_repeated(probe, repeats) / 1e9

    timed = [time_forward(model, prompt, new_tokens, "transfoxl", after_step=bandwidth) for _ in range(runs)]
    return {
        "steps_s": [step for run in timed for step in run["steps_s"]],
        "gbytes_per_s": [rate for run in timed for rate in run["after_steps"]],
    }


def generate_run(generated: dict, load: float) -> dict:
    """One run of `time_generate` as the results keep it: its per-run median step."""
    return {
        "prefill_s": generated["prefill_s"],
        "step_s": statistics.median(generated["steps_s"]),
        "steps_s": generated["steps_s"],
        "total_s": generated["total_s"],
        "tokens": generated["tokens"],
        "load_average_before": load,
    }


def measure(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, impl: str) -> dict[str, Any]:
    """One run of one implementation: generate(), then the bare forward calls; per-run medians of the steps."""
    load = os.getloadavg()[0]  # other processes' load: the cause of most spread on a shared machine
    generated = time_generate(model, prompt, new_tokens)
    forward = time_forward(model, prompt, new_tokens, impl)
    return {
        **generate_run(generated, load),
        "forward_prefill_s": forward["prefill_s"],
        "forward_step_s": statistics.median(forward["steps_s"]),
        "forward_steps_s": forward["steps_s"],
        "same_tokens": generated["tokens"] == forward["tokens"],
    }


# ---------------------------------------------------------------------------------------------------------------------
# Part 1: mid configuration against GPT-2


def run_mid(settings: dict, args: argparse.Namespace) -> dict:
    config = configs.model_config(settings["mid_config"])
    prompt_len, new_tokens = settings["prompt_len"], settings["new_tokens"]
    gpt2_config = gpt2_config_for(config, n_positions=prompt_len + new_tokens)
    models = {
        "transfoxl": build_transfoxl(config, mem_len=settings["mid_mem_len"], seed=args.seed),
        "gpt2": build_gpt2(gpt2_config, seed=args.seed),
    }
    parameters = {impl: sum(p.numel() for p in model.parameters()) for impl, model in models.items()}
    print(
        f"mid: transfoxl {parameters['transfoxl']:,} parameters, GPT-2 {parameters['gpt2']:,}; prompt {prompt_len}, "
        f"{new_tokens} new tokens, batch sizes {settings['batch_sizes']}, {settings['runs']} runs",
        flush=True,
    )
    runs: dict[str, dict[str, list]] = {}
    with torch.no_grad():
        for batch in settings["batch_sizes"]:
            prompt = make_prompt(config["vocab_size"], batch, prompt_len, args.seed)
            for model in models.values():  # warm-up: the full prompt (buffers of its size), a few tokens
                model.generate(prompt, **generate_kwargs(min(3, new_tokens)))
            runs[str(batch)] = {impl: [] for impl in IMPLEMENTATIONS}
            for run in range(settings["runs"]):
                order = IMPLEMENTATIONS[run % 2 :] + IMPLEMENTATIONS[: run % 2]  # rotate who goes first
                for impl in order:
                    result = measure(models[impl], prompt, new_tokens, impl)
                    runs[str(batch)][impl].append(result)
                    print(
                        f"batch {batch} run {run + 1}/{settings['runs']} {LABELS[impl]:17} prefill "
                        f"{result['prefill_s']:.4f} s (forward {result['forward_prefill_s']:.4f}), step "
                        f"{1e3 * result['step_s']:.2f} ms (forward {1e3 * result['forward_step_s']:.2f})  "
                        f"(load average {result['load_average_before']:.1f})",
                        flush=True,
                    )
    profile = None
    if not args.skip_profile:
        prompt = make_prompt(config["vocab_size"], 1, prompt_len, args.seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(args.profile_threads)
        try:
            profile = profile_decode(models, prompt, settings["profile_steps"])
        finally:
            torch.set_num_threads(threads)
    return {
        "config_name": settings["mid_config"],
        "config": {**config, "mem_len": settings["mid_mem_len"]},
        "gpt2_config": gpt2_config,
        "parameters": parameters,
        "attn_implementation": {impl: model.config._attn_implementation for impl, model in models.items()},
        "runs": runs,
        "summary": summarize_mid(runs),
        "profile": profile,
        "profile_threads": None if profile is None else args.profile_threads,
    }


def spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": list(values)}


MID_MEASURES = {  # summary name: (run field, scale to the unit of the name)
    "prefill_s": ("prefill_s", 1.0),
    "step_ms": ("step_s", 1e3),
    "forward_prefill_s": ("forward_prefill_s", 1.0),
    "forward_step_ms": ("forward_step_s", 1e3),
    "total_s": ("total_s", 1.0),
}


def summarize_mid(runs: dict) -> dict:
    """Per batch: medians (min-max) over runs per implementation, transfoxl / GPT-2 ratios of the medians, and the
    ratios of the runs made back to back (run i of each: less exposed to the machine's load drifting)."""
    summary = {}
    for batch, by_impl in runs.items():
        entry: dict[str, Any] = {}
        for impl, results in by_impl.items():
            entry[impl] = {
                name: spread([r[field] * scale for r in results]) for name, (field, scale) in MID_MEASURES.items()
            }
            entry[impl]["generate_overhead_ms"] = (
                entry[impl]["step_ms"]["median"] - entry[impl]["forward_step_ms"]["median"]
            )
            entry[impl]["same_tokens"] = all(r["same_tokens"] for r in results)
        ours, theirs = entry["transfoxl"], entry["gpt2"]
        entry["ratio"] = {name: ours[name]["median"] / theirs[name]["median"] for name in MID_MEASURES}
        entry["paired_ratios"] = {
            name: [mine[field] / other[field] for mine, other in zip(by_impl["transfoxl"], by_impl["gpt2"])]
            for name, (field, _) in MID_MEASURES.items()
        }
        summary[batch] = entry
    return summary


# ---------------------------------------------------------------------------------------------------------------------
# Profile of the mid decode step (batch 1)


def profile_labels(impl: str, model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """The modules whose forwards the profile times, with the name each gets (the same for both models)."""
    if impl == "transfoxl":
        # Not its layers, attention and feed-forward modules: a hook on them would turn off the fused decoding step
        # (fast_paths_txl.decode_token), which computes every layer in one compiled call without calling them.
        stack = model.transformer
        labelled = [(model, "model forward"), (stack, "stack"), (stack.word_embeddings, "embedding")]
        return [*labelled, (model.adaptive_softmax, "output head")]
    stack = model.transformer
    labelled = [(model, "model forward"), (stack, "stack"), (stack.wte, "embedding"), (stack.wpe, "embedding")]
    for block in stack.h:
        labelled += [(block, "layer"), (block.attn, "attention"), (block.mlp, "feed-forward")]
    return [*labelled, (model.lm_head, "output head")]


@contextlib.contextmanager
def labelled_forwards(labelled: Sequence[tuple[torch.nn.Module, str]]):
    """Each module's forward runs inside `torch.profiler.record_function(label)` (hooks: a few us per call)."""
    handles, open_ranges = [], []

    def enter(label: str):
        def hook(module, args):
            scope = torch.profiler.record_function(label)
            scope.__enter__()
            open_ranges.append(scope)

        return hook

    def leave(module, args, output):
        open_ranges.pop().__exit__(None, None, None)

    for module, label in labelled:
        handles.append(module.register_forward_pre_hook(enter(label)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


SECTIONS = ("model forward", "stack", "embedding", "layer", "attention", "feed-forward", "output head")


def profile_decode(models: Mapping[str, torch.nn.Module], prompt: torch.Tensor, steps: int) -> dict:
    """Per implementation: the decode steps of one generate() (after the prefill, which is not profiled) under
    torch.profiler, then under cProfile; plain step times of one generate() without either for reference."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import StoppingCriteriaList

    results = {}
    for impl, model in models.items():
        plain = time_generate(model, prompt, steps + 1)
        profiler = profile(activities=[ProfilerActivity.CPU])
        clock = step_clock(on_first=profiler.start)
        with labelled_forwards(profile_labels(impl, model)):
            model.generate(prompt, stopping_criteria=StoppingCriteriaList([clock]), **generate_kwargs(steps + 1))
        profiler.stop()
        profiled_steps = [later - earlier for earlier, later in pairwise(clock.times)]
        events = profiler.key_averages()
        sections = {name: 0.0 for name in SECTIONS}
        calls = {name: 0 for name in SECTIONS}
        operators = []
        for event in events:
            if event.key in sections:
                sections[event.key] += event.cpu_time_total / 1e3 / steps  # ms per step
                calls[event.key] += event.count
            elif event.key.startswith(("aten::", "transfoxl_")):  # (torch's operators and the compiled kernels)
                operators.append(
                    {
                        "name": event.key,
                        "self_ms_per_step": event.self_cpu_time_total / 1e3 / steps,
                        "total_ms_per_step": event.cpu_time_total / 1e3 / steps,
                        "calls_per_step": event.count / steps,
                    }
                )
        operators.sort(key=lambda op: -op["self_ms_per_step"])

        python = cProfile.Profile()
        clock = step_clock(on_first=python.enable)
        model.generate(prompt, stopping_criteria=StoppingCriteriaList([clock]), **generate_kwargs(steps + 1))
        python.disable()
        cprofile_steps = [later - earlier for earlier, later in pairwise(clock.times)]
        results[impl] = {
            "steps": steps,
            "plain_step_ms": 1e3 * statistics.median(plain["steps_s"]),
            "profiled_step_ms": 1e3 * statistics.fmean(profiled_steps),
            "cprofile_step_ms": 1e3 * statistics.fmean(cprofile_steps),
            "sections_ms_per_step": sections,
            "section_calls_per_step": {name: count / steps for name, count in calls.items()},
            "aten_self_ms_per_step": sum(op["self_ms_per_step"] for op in operators),
            "aten_calls_per_step": sum(op["calls_per_step"] for op in operators),
            "operators": operators[:15],
            "python_functions": python_functions(python, steps),
            "python_cumulative": python_functions(
                python, steps, by="cumulative", within=("transfoxl/", "generation/")
            ),
        }
    return results


def python_functions(
    python: cProfile.Profile, steps: int, top: int = 15, by: str = "own", within: Sequence[str] = ()
) -> list[dict]:
    """The functions with the most own (or cumulative) time under cProfile, per step, optionally only those whose
    file path contains one of `within` (cProfile itself inflates Python-heavy code)."""
    stats = pstats.Stats(python, stream=io.StringIO())
    rows = []
    for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():
        if within and not any(part in filename for part in within):
            continue
        rows.append(
            {
                "function": f"{short_path(filename)}:{line}({function})",
                "calls_per_step": calls / steps,
                "own_ms_per_step": 1e3 * own / steps,
                "cumulative_ms_per_step": 1e3 * cumulative / steps,
            }
        )
    rows.sort(key=lambda row: -row[f"{by}_ms_per_step"])
    return rows[:top]


def short_path(filename: str) -> str:
    for marker in ("site-packages/", "src/", "lib/python"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


# ---------------------------------------------------------------------------------------------------------------------
# Part 2: the WikiText-103 configuration against the floors (a worker process)


def weights_read_by_a_step(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the parameters: all of them (tied ones once), and those a decode step's products read, i.e. all but
    the input embedding's own tensors (the lookup reads one row; tables tied to the softmax are counted there)."""
    unique, read = {}, {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        size = parameter.numel() * parameter.element_size()
        unique[parameter.data_ptr()] = size
        if not name.startswith("transformer.word_embeddings."):
            read[parameter.data_ptr()] = size
    return {"all": sum(unique.values()), "read": sum(read.values())}


@torch.no_grad()
def wt103_worker(request: dict) -> dict:
    """Measure the machine's rates, get the wt103 model (v4's saved folder through the Auto classes, or the seeded
    transfoxl model), time prefill and decode (generate() and forward) from an empty memory, and with
    `zero_memory` also greedy generate() from v4's zero-filled memory, run after run."""
    torch.set_num_threads(request["threads"])
    repeats = request["rate_repeats"]
    rates_before = {
        "matmul_gflops": matmul_rates(request["matmul_shapes"], repeats),
        "mv_gbytes_per_s": mv_bandwidths(request["mv_shapes"], repeats),
    }
    log(f"wt103: rates before: {rates_line(rates_before)}")
    start = time.perf_counter()
    if request["model_folder"] is None:
        model = build_transfoxl(request["config"], mem_len=request["mem_len"], seed=request["seed"])
    else:
        model = load_transfoxl(request["model_folder"])
    build_s = time.perf_counter() - start
    loaded_rss = current_rss_mb()
    parameters = sum(p.numel() for p in model.parameters())
    how = "built" if request["model_folder"] is None else "loaded v4's folder with"
    log(f"wt103: {how} {parameters:,} parameters in {build_s:.1f} s, RSS {loaded_rss:.0f} MB")
    prompt = torch.tensor(request["prompt"])  # [1, prompt_len]
    new_tokens, zero_memory = request["new_tokens"], request["zero_memory"]
    model.config.memory_init = "empty"  # transfoxl's default, which the floors count (a legacy folder's too)
    model.generate(prompt[:, :16], **generate_kwargs(2))  # warm-up, short
    if zero_memory:
        with memory_init(model, "zeros"):
            model.generate(prompt[:, :16], **generate_kwargs(2))
    runs, zero_runs, peaks, peak_is_the_models = [], [], [], True
    for run in range(request["runs"]):
        # The bandwidth just before the run as well: the host's other work moves it from run to run (25-37 GB/s
        # seen in one process), so each run is also compared with the floor of its own moment. Its 256 MB matrices
        # are not the model's memory: the peak so far is kept, and the peak is reset once they are freed.
        peaks.append(peak_rss_mb())
        bandwidth = mv_bandwidths(request["mv_shapes"], max(3, repeats // 2))
        peak_is_the_models = reset_peak_rss() and peak_is_the_models
        result = {**measure(model, prompt, new_tokens, "transfoxl"), "mv_gbytes_per_s_before": bandwidth}
        runs.append(result)
        line = (
            f"wt103 run {run + 1}/{request['runs']}: bandwidth before {max(bandwidth.values()):.1f} GB/s, prefill "
            f"{result['prefill_s']:.3f} s (forward {result['forward_prefill_s']:.3f}), step "
            f"{1e3 * result['step_s']:.1f} ms (forward {1e3 * result['forward_step_s']:.1f})"
        )
        if zero_memory:
            load = os.getloadavg()[0]
            with memory_init(model, "zeros"):
                zero_runs.append(generate_run(time_generate(model, prompt, new_tokens), load))
            line += (
                f"; from v4's zero memory: prefill {zero_runs[-1]['prefill_s']:.3f} s, step "
                f"{1e3 * zero_runs[-1]['step_s']:.1f} ms"
            )
        log(f"{line}  (load average {result['load_average_before']:.1f})")
    if zero_memory:  # v4's scores of the prompt's last position, from the same zero-filled start
        with memory_init(model, "zeros"):
            log_probs = model(prompt, logits_to_keep=1).logits[0, -1]  # [V]
        torch.save(log_probs.clone(), request["log_probs_path"])
    peak = max([*peaks, peak_rss_mb()])  # before the rates' buffers of the second measurement
    weight_bytes = weights_read_by_a_step(model)
    beside = steps_beside_bandwidth(
        model, prompt, new_tokens, request["runs"], request["mv_shapes"][0], max(3, repeats // 2)
    )
    del model
    rates_after = {
        "matmul_gflops": matmul_rates(request["matmul_shapes"], repeats),
        "mv_gbytes_per_s": mv_bandwidths(request["mv_shapes"], repeats),
    }
    log(f"wt103: rates after: {rates_line(rates_after)}")
    return {
        "parameters": parameters,
        "weight_bytes": weight_bytes,
        "build_s": build_s,
        "loaded_rss_mb": loaded_rss,
        "peak_rss_mb": peak,
        "peak_includes_bandwidth_probes": not peak_is_the_models,  # where the peak could not be reset (not Linux)
        "input_fractions": cluster_fractions(prompt, request["config"]),
        "rates_before": rates_before,
        "rates_after": rates_after,
        "runs": runs,
        "steps_beside_bandwidth": beside,
        "zero_memory_runs": zero_runs if zero_memory else None,
        "threads": torch.get_num_threads(),
    }


def load_transfoxl(folder: str) -> torch.nn.Module:
    """The model transformers 4.37.2 saved in `folder` (a legacy `transfo-xl` checkpoint), through the Auto classes:
    converted on load, as a user of v4's checkpoints gets it."""
    from transformers import AutoModelForCausalLM

    import transfoxl  # noqa: F401  (registers the txl and transfo-xl model types with the Auto classes)

    return AutoModelForCausalLM.from_pretrained(folder).eval()


@contextlib.contextmanager
def memory_init(model: torch.nn.Module, value: str):
    """Within the block, new streams start from `value` ("zeros": v4's mem_len zero vectors, which the prompt and
    every step attend to, so that the tokens are v4's)."""
    before = model.config.memory_init
    model.config.memory_init = value
    try:
        yield
    finally:
        model.config.memory_init = before


def v4_save_worker(request: dict) -> dict:
    """transformers 4.37.2: build the seeded wt103 model (dropout 0, the request's mem_len) and save it in `folder`."""
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    torch.set_num_threads(request["threads"])
    start = time.perf_counter()
    torch.manual_seed(request["seed"])
    model = TransfoXLLMHeadModel(TransfoXLConfig(**request["config"], mem_len=request["mem_len"]))
    model.save_pretrained(request["folder"])
    return {"parameters": sum(p.numel() for p in model.parameters()), "save_s": time.perf_counter() - start}


@torch.no_grad()
def v4_generate_worker(request: dict) -> dict:
    """transformers 4.37.2: load the saved folder and time its greedy generate() on the prompt, run after run.

    v4's generate() keeps the memory between steps (its `prepare_inputs_for_generation` passes the returned `mems`
    back and feeds the last token only); a new stream starts from mem_len zero vectors (`init_mems`).
    """
    import transformers
    from transformers import TransfoXLLMHeadModel

    torch.set_num_threads(request["threads"])
    start = time.perf_counter()
    model = TransfoXLLMHeadModel.from_pretrained(request["model_folder"]).eval()
    load_s = time.perf_counter() - start
    loaded_rss = current_rss_mb()
    log(f"wt103, transformers {transformers.__version__}: loaded in {load_s:.1f} s, RSS {loaded_rss:.0f} MB")
    prompt = torch.tensor(request["prompt"])  # [1, prompt_len]
    model.generate(prompt[:, :16], **generate_kwargs(2))  # warm-up, short
    runs = []
    for run in range(request["runs"]):
        load = os.getloadavg()[0]
        runs.append(generate_run(time_generate(model, prompt, request["new_tokens"], v4_api=True), load))
        log(
            f"wt103 run {run + 1}/{request['runs']}, transformers {transformers.__version__}: prefill "
            f"{runs[-1]['prefill_s']:.3f} s, step {1e3 * runs[-1]['step_s']:.1f} ms  (load average {load:.1f})"
        )
    # v4 scores every position of its input: [1, prompt_len, V] log-probabilities, as in its generate()'s prefill.
    log_probs = model(input_ids=prompt).prediction_scores[0, -1]  # [V]
    torch.save(log_probs.clone(), request["log_probs_path"])
    return {
        "transformers": transformers.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "load_s": load_s,
        "loaded_rss_mb": loaded_rss,
        "peak_rss_mb": peak_rss_mb(),
        "runs": runs,
        "threads": torch.get_num_threads(),
    }


def log(line: str) -> None:
    """Progress of the worker: stderr, which the parent passes through (stdout carries the result)."""
    print(line, file=sys.stderr, flush=True)


def rates_line(rates: dict) -> str:
    matmul = ", ".join(f"{shape} {rate:.1f}" for shape, rate in rates["matmul_gflops"].items())
    mv = ", ".join(f"{shape} {rate:.1f}" for shape, rate in rates["mv_gbytes_per_s"].items())
    return f"fp32 matmul GFLOP/s {matmul}; mv GB/s {mv}"


def run_worker(python: Path | str, request: dict) -> dict:
    """One phase in a fresh process of `python` running this file (so that its peak RSS is its own); its result."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers v5's bar while loading weights
    process = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--worker"],
        input=json.dumps(request) + "\n",
        stdout=subprocess.PIPE,  # the result; progress goes to stderr, passed through
        text=True,
        env=env,
        check=False,
    )
    if process.returncode != 0:
        raise RuntimeError(f"the {request['phase']} worker failed (exit {process.returncode}); its error is above")
    return json.loads(process.stdout.strip().splitlines()[-1])


V4_STAMP = "bench_decode.json"  # written last into a saved v4 model's folder: what it holds


def v4_model_stamp(config: Mapping[str, Any], *, mem_len: int, seed: int) -> dict:
    """What a saved v4 model must have been built from to be reused (as JSON gives it back)."""
    return json.loads(json.dumps({"config": config, "mem_len": mem_len, "seed": seed, "transformers": v4.VERSION}))


def saved_model_matches(folder: Path, stamp: Mapping[str, Any]) -> bool:
    """Whether `folder` holds the v4 model of `stamp`, saved whole by an earlier run (the stamp is written last)."""
    try:
        saved = json.loads((folder / V4_STAMP).read_text())
    except (OSError, ValueError):
        return False
    weights = any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    return saved == stamp and (folder / "config.json").is_file() and weights


def ensure_v4_model(python: Path | str, folder: Path, stamp: dict, threads: int) -> dict:
    """The seeded v4 model saved in `folder` by transformers 4.37.2, reused when an earlier run saved the same one.

    Saved into a sibling folder first and renamed, so that an interrupted save is never reused. A `folder` without
    this script's stamp is not replaced (it may be someone's model).
    """
    if saved_model_matches(folder, stamp):
        print(f"wt103: reusing the v4 model saved in {folder}", flush=True)
        return {"saved": False, "save_s": None}
    if folder.exists() and not (folder / V4_STAMP).exists():
        raise RuntimeError(f"{folder} exists and was not saved by bench_decode.py: pass another --v4-model folder")
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"wt103: transformers {v4.VERSION} builds the seeded model and saves it in {folder} ...", flush=True)
    request = {"phase": "v4_save", "folder": str(partial), "threads": threads}
    request.update(config=stamp["config"], mem_len=stamp["mem_len"], seed=stamp["seed"])
    saved = run_worker(python, request)
    (partial / V4_STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return {"saved": True, "save_s": saved["save_s"]}


def run_wt103(settings: dict, args: argparse.Namespace) -> dict:
    """The wt103 part in fresh worker processes (transformers 4.37.2's first, in its virtualenv, unless skipped);
    its result with the floors, the ratios, and the comparison with v4."""
    config = configs.model_config(settings["wt103_config"])
    mem_len = settings["wt103_mem_len"]
    request = {
        "phase": "transfoxl",
        "config_name": settings["wt103_config"],
        "config": config,
        "mem_len": mem_len,
        "prompt_len": settings["prompt_len"],
        "prompt": make_prompt(config["vocab_size"], 1, settings["prompt_len"], args.seed).tolist(),
        "new_tokens": settings["wt103_new_tokens"],
        "runs": settings["wt103_runs"],
        "threads": args.threads,
        "seed": args.seed,
        "rate_repeats": settings["rate_repeats"],
        "matmul_shapes": settings["matmul_shapes"],
        "mv_shapes": settings["mv_shapes"],
        "model_folder": None,
        "zero_memory": False,
    }
    if not args.run_v4:
        return summarize_wt103(run_worker(sys.executable, request), request)
    python = v4.ensure_venv(args.v4_venv)
    folder = args.v4_model or REPO / ".bench" / f"decode-v4-model-{settings['wt103_config']}"
    saving = ensure_v4_model(python, folder, v4_model_stamp(config, mem_len=mem_len, seed=args.seed), args.threads)
    request["model_folder"] = str(folder)
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as work:
        v4_request = {**request, "phase": "v4_generate", "log_probs_path": str(Path(work) / "v4.pt")}
        v4_result = run_worker(python, v4_request)
        ours_request = {**request, "zero_memory": True, "log_probs_path": str(Path(work) / "transfoxl.pt")}
        result = run_worker(sys.executable, ours_request)
        difference = float(
            (torch.load(ours_request["log_probs_path"]) - torch.load(v4_request["log_probs_path"])).abs().max()
        )
    summary = summarize_wt103(result, request)
    summary["v4"] = summarize_v4(v4_result, result, summary, difference)
    summary["v4"].update(model_folder=str(folder), **saving)
    print(f"wt103: {same_weights_line(summary['v4'])}", flush=True)
    return summary


def fastest_quarter(rates: Sequence[float]) -> list[int]:
    """The indices of the fastest quarter of `rates` (at least one), fastest first."""
    order = sorted(range(len(rates)), key=lambda index: rates[index], reverse=True)
    return order[: max(1, len(rates) // 4)]


def summarize_wt103(result: dict, request: dict) -> dict:
    config, runs = request["config"], result["runs"]
    prompt_len, new_tokens, mem_len = request["prompt_len"], request["new_tokens"], request["mem_len"]
    matmul_ceiling = max(
        *result["rates_before"]["matmul_gflops"].values(), *result["rates_after"]["matmul_gflops"].values()
    )
    bandwidth_ceiling = max(  # the best seen in the process, the runs' own measurements included
        *result["rates_before"]["mv_gbytes_per_s"].values(),
        *result["rates_after"]["mv_gbytes_per_s"].values(),
        *(rate for run in runs for rate in run["mv_gbytes_per_s_before"].values()),
    )
    fractions = result["input_fractions"]
    prefill = forward_flops(
        config, q_len=prompt_len, mem_len=0, batch=1, input_fractions=fractions, scored_positions=1
    )
    prefill_all = forward_flops(
        config, q_len=prompt_len, mem_len=0, batch=1, input_fractions=fractions, scored_positions=prompt_len
    )
    mem_lengths = decode_mem_lengths(prompt_len=prompt_len, new_tokens=new_tokens, mem_len=mem_len)
    bytes_ = step_bytes(config, weight_bytes=result["weight_bytes"]["read"], mem_lengths=mem_lengths, batch=1)
    step = forward_flops(
        config,
        q_len=1,
        mem_len=round(bytes_["mean_memory_length"]),
        batch=1,
        input_fractions=fractions,
        scored_positions=1,
        project_positions=False,
    )
    floors = {
        "prefill_s": prefill["total"] / (matmul_ceiling * 1e9),
        "step_ms": 1e3 * bytes_["total"] / (bandwidth_ceiling * 1e9),
        "step_compute_ms": 1e3 * step["total"] / (matmul_ceiling * 1e9),  # far below: a step is bandwidth-bound
    }
    measured = {
        "prefill_s": spread([r["prefill_s"] for r in runs]),
        "forward_prefill_s": spread([r["forward_prefill_s"] for r in runs]),
        "step_ms": spread([1e3 * r["step_s"] for r in runs]),
        "forward_step_ms": spread([1e3 * r["forward_step_s"] for r in runs]),
        "total_s": spread([r["total_s"] for r in runs]),
    }
    # Each run against the floor at the bandwidth measured just before it (the same moment of a shared host).
    run_floors_ms = [1e3 * bytes_["total"] / (max(r["mv_gbytes_per_s_before"].values()) * 1e9) for r in runs]
    paired = {
        "step": spread([1e3 * r["step_s"] / floor for r, floor in zip(runs, run_floors_ms)]),
        "forward_step": spread([1e3 * r["forward_step_s"] / floor for r, floor in zip(runs, run_floors_ms)]),
    }
    # Each bare step against the floor at the bandwidth read right after it (the same moment, step by step).
    beside = result["steps_beside_bandwidth"]
    step_floors_ms = [1e3 * bytes_["total"] / (rate * 1e9) for rate in beside["gbytes_per_s"]]
    if step_floors_ms:
        each = [1e3 * t / f for t, f in zip(beside["steps_s"], step_floors_ms)]
        paired["forward_each_step"] = spread(each)
        # The steps at the run's fastest moments (the top quarter of their readings), where the host's phases make
        # the floor hardest to meet: their ratios and the readings' range say what a fast phase gives.
        fastest = fastest_quarter(beside["gbytes_per_s"])
        paired["forward_each_step_fastest_quarter"] = spread([each[i] for i in fastest])
        paired["fastest_quarter_gbytes_per_s"] = spread([beside["gbytes_per_s"][i] for i in fastest])
    ratios = {
        "prefill": measured["prefill_s"]["median"] / floors["prefill_s"],
        "forward_prefill": measured["forward_prefill_s"]["median"] / floors["prefill_s"],
        "step": measured["step_ms"]["median"] / floors["step_ms"],
        "forward_step": measured["forward_step_ms"]["median"] / floors["step_ms"],
        "step_paired": paired["step"]["median"],
        "forward_step_paired": paired["forward_step"]["median"],
        "forward_step_each_paired": paired["forward_each_step"]["median"] if step_floors_ms else None,
        "forward_step_each_paired_fastest_quarter": (
            paired["forward_each_step_fastest_quarter"]["median"] if step_floors_ms else None
        ),
    }
    return {
        "config_name": request["config_name"],
        "config": {**config, "mem_len": mem_len},
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "runs_requested": request["runs"],
        "parameters": result["parameters"],
        "weight_bytes": result["weight_bytes"],
        "model_source": "seeded transfoxl model" if request["model_folder"] is None else "v4's saved folder, Auto",
        "build_s": result["build_s"],
        "loaded_rss_mb": result["loaded_rss_mb"],
        "peak_rss_mb": result["peak_rss_mb"],
        "peak_includes_bandwidth_probes": result["peak_includes_bandwidth_probes"],
        "threads": result["threads"],
        "rates_before": result["rates_before"],
        "rates_after": result["rates_after"],
        "matmul_gflops_ceiling": matmul_ceiling,
        "mv_gbytes_per_s_ceiling": bandwidth_ceiling,
        "input_fractions": fractions,
        "prefill_flops": prefill,
        "prefill_flops_all_positions_scored": prefill_all,
        "step_flops": step,
        "step_bytes": bytes_,
        "floors": floors,
        "run_floors_ms": run_floors_ms,
        "step_floors_ms": step_floors_ms,
        "paired_ratios": paired,
        "measured": measured,
        "ratio_to_floor": ratios,
        "prefill_tokens_per_s": prompt_len / measured["prefill_s"]["median"],
        "same_tokens": all(r["same_tokens"] for r in runs),
        "runs": runs,
        "steps_beside_bandwidth": beside,
        "v4": None,  # run_wt103 adds summarize_v4's entry when transformers 4.37.2 ran
    }


V4_MEASURES = {  # summary name: (run field, scale to the unit of the name); the measures of generate() alone
    "prefill_s": ("prefill_s", 1.0),
    "step_ms": ("step_s", 1e3),
    "total_s": ("total_s", 1.0),
}


def summarize_v4(v4_result: dict, result: dict, wt103: dict, log_prob_difference: float) -> dict:
    """transformers 4.37.2 against transfoxl on the same weights and prompt: medians (min-max) of v4's generate()
    runs and of transfoxl's from v4's zero-filled memory (`result["zero_memory_runs"]`), transfoxl / v4 ratios of
    the medians, for those and for transfoxl's default empty-memory runs (`wt103["measured"]`), whether every run
    of both chose v4's tokens, and the max |difference| of the prompt's last-position log-probabilities."""
    prompt_len = wt103["prompt_len"]

    def measures(runs: Sequence[dict]) -> dict:
        return {name: spread([r[field] * scale for r in runs]) for name, (field, scale) in V4_MEASURES.items()}

    v4_runs, zero_runs = v4_result["runs"], result["zero_memory_runs"]
    sides = {
        "v4": measures(v4_runs),
        "transfoxl_zero_memory": measures(zero_runs),
        "transfoxl_empty_memory": {name: wt103["measured"][name] for name in V4_MEASURES},
    }
    peaks = {"v4": v4_result["peak_rss_mb"], "transfoxl": wt103["peak_rss_mb"]}
    loaded = {"v4": v4_result["loaded_rss_mb"], "transfoxl": wt103["loaded_rss_mb"]}
    ratios = {}
    for side in ("transfoxl_zero_memory", "transfoxl_empty_memory"):
        ratios[side] = {name: sides[side][name]["median"] / sides["v4"][name]["median"] for name in V4_MEASURES}
        ratios[side]["peak_rss_mb"] = peaks["transfoxl"] / peaks["v4"]
        ratios[side]["loaded_rss_mb"] = loaded["transfoxl"] / loaded["v4"]
    tokens = v4_runs[0]["tokens"]
    return {
        "transformers": v4_result["transformers"],
        "parameters": v4_result["parameters"],
        "load_s": v4_result["load_s"],
        "threads": v4_result["threads"],
        "measured": sides,
        "prefill_tokens_per_s": {side: prompt_len / value["prefill_s"]["median"] for side, value in sides.items()},
        "peak_rss_mb": peaks,
        "loaded_rss_mb": loaded,
        "ratio": ratios,
        "tokens": tokens,
        "same_tokens": all(run["tokens"] == tokens for run in [*v4_runs, *zero_runs]),
        "max_abs_log_prob_difference": log_prob_difference,
        "v4_runs": v4_runs,
        "transfoxl_zero_memory_runs": zero_runs,
    }


WORKERS = {  # request["phase"]: the worker (v4_*: inside the transformers 4.37.2 virtualenv)
    "transfoxl": wt103_worker,
    "v4_save": v4_save_worker,
    "v4_generate": v4_generate_worker,
}


def worker_main() -> int:
    """One JSON request on stdin, one JSON result on stdout; progress on stderr."""
    request = json.loads(sys.stdin.readline())
    if request["phase"] == "transfoxl":
        request["matmul_shapes"] = [tuple(shape) for shape in request["matmul_shapes"]]
        request["mv_shapes"] = [tuple(shape) for shape in request["mv_shapes"]]
    print(json.dumps(WORKERS[request["phase"]](request)), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_decode.py",
        description=__doc__.split("\n\n")[0],
        epilog="Writes STEM.json, STEM.md, STEM.png and STEM.profile.md into --out (STEM: --stem).\n\n"
        + __doc__.rsplit("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, help=f"mid: runs per implementation and batch (default {FULL['runs']})")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help=f"mid (default {FULL['batch_sizes']})")
    parser.add_argument("--prompt-len", type=int, help=f"prompt tokens, both parts (default {FULL['prompt_len']})")
    parser.add_argument(
        "--new-tokens", type=int, help=f"mid: new tokens per generate(), >= 2 (default {FULL['new_tokens']})"
    )
    parser.add_argument("--wt103-runs", type=int, help=f"wt103: runs (default {FULL['wt103_runs']})")
    parser.add_argument(
        "--wt103-new-tokens",
        type=int,
        help=f"wt103: new tokens per generate(), >= 2 (default {FULL['wt103_new_tokens']})",
    )
    parser.add_argument("--profile-steps", type=int, help=f"decode steps profiled (default {FULL['profile_steps']})")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch intra-op threads, both parts (default: the machine's cores, %(default)s)",
    )
    parser.add_argument(
        "--profile-threads",
        type=int,
        default=1,
        help="torch threads of the profile (default %(default)s: on a CPU shared with other work, each parallel "
        "region of a multi-threaded step may wait for a scheduler slice, which swamps what the profile attributes)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-wt103", action="store_true", help="skip the WikiText-103 part (285M parameters, 1.2 GB)"
    )
    parser.add_argument("--skip-profile", action="store_true", help="skip the profile of the mid decode step")
    parser.add_argument("--skip-mid", action="store_true", help="skip the mid part (and its profile)")
    parser.add_argument(
        "--skip-v4",
        action="store_true",
        help=f"wt103: do not run transformers {v4.VERSION} (no virtualenv, no network); transfoxl builds the seeded "
        "model itself",
    )
    parser.add_argument(
        "--with-v4",
        action="store_true",
        help=f"with --quick: run transformers {v4.VERSION} too (--quick alone skips it, as the tests do)",
    )
    parser.add_argument(
        "--v4-venv",
        type=Path,
        default=REPO / ".bench" / "venv-v4",
        help=f"virtualenv with transformers {v4.VERSION}, created if missing (default: %(default)s)",
    )
    parser.add_argument(
        "--v4-model",
        type=Path,
        help="folder of the seeded model transformers 4.37.2 saves, reused by later runs of the same config and seed "
        "(default: .bench/decode-v4-model-CONFIG; wt103: 1.1 GB)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny models, prompt 16, one run, no v4 unless --with-v4: checks that everything runs (seconds)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks", help="output folder (default: %(default)s)")
    parser.add_argument("--stem", default="decode", help="name of the output files, without suffix (default: decode)")
    args = parser.parse_args(argv)
    if args.skip_v4 and args.with_v4:
        parser.error("--skip-v4 and --with-v4 contradict each other")
    # v4 belongs to the wt103 part; --quick (the tests) must not need its virtualenv, nor the network to make it.
    args.run_v4 = not args.skip_wt103 and not args.skip_v4 and (args.with_v4 or not args.quick)
    settings = dict(QUICK if args.quick else FULL)
    for name in ("runs", "batch_sizes", "prompt_len", "new_tokens", "wt103_runs", "wt103_new_tokens", "profile_steps"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    minimums = dict(runs=1, prompt_len=1, new_tokens=2, wt103_runs=1, wt103_new_tokens=2, profile_steps=1)
    minimums_alone = dict(minimums)
    if args.run_v4:  # v4's clock misses the last token (`time_generate`): 3 tokens give one interval
        minimums["wt103_new_tokens"] = 3
    for name, minimum in minimums.items():
        if settings[name] < minimum:
            why = " when transformers 4.37.2 runs (--skip-v4 to skip it)" if minimum > minimums_alone[name] else ""
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}{why}, got {settings[name]}")
    if any(batch < 1 for batch in settings["batch_sizes"]):
        parser.error(f"--batch-sizes must all be >= 1, got {settings['batch_sizes']}")
    for name in ("threads", "profile_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.stem or Path(args.stem).name != args.stem:
        parser.error(f"--stem must be a file name without a folder, got {args.stem!r}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file; expected a folder")
    settings["batch_sizes"] = sorted(set(settings["batch_sizes"]))
    args.settings = settings
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:  # the thread count is process-wide: a caller (a test) gets its own back
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    settings = args.settings
    started = time.perf_counter()
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads",
        flush=True,
    )
    import transformers

    results: dict[str, Any] = {
        "setup": {
            "quick": args.quick,
            "prompt_len": settings["prompt_len"],
            "new_tokens": settings["new_tokens"],
            "runs": settings["runs"],
            "batch_sizes": settings["batch_sizes"],
            "wt103_new_tokens": settings["wt103_new_tokens"],
            "wt103_runs": settings["wt103_runs"],
            "v4": args.run_v4,
            "profile_steps": settings["profile_steps"],
            "seed": args.seed,
            "measurement": (
                "generate(): prefill = call to first token, step = median interval between tokens (StepClock "
                "stopping criterion); forward: the same model calls timed alone"
            ),
            "options": {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()},
        },
        "machine": {
            **machine_facts(),
            "transformers": transformers.__version__,
            "transfoxl": importlib.metadata.version("transfoxl"),
        },
    }
    results["mid"] = None if args.skip_mid else run_mid(settings, args)
    results["wt103"] = None if args.skip_wt103 else run_wt103(settings, args)
    if results["wt103"] is not None and results["wt103"]["v4"] is not None:
        results["machine"]["transformers_v4"] = results["wt103"]["v4"]["transformers"]
    results["wall_s"] = time.perf_counter() - started
    results["written_utc"] = written_utc()

    from transfoxl.files import write_bytes_atomically, write_json_atomically, write_text_atomically

    table = markdown(results)
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    written = [f"{args.stem}.json", f"{args.stem}.md", f"{args.stem}.png"]
    write_json_atomically(args.out / written[0], results)
    write_text_atomically(args.out / written[1], table + "\n")
    write_bytes_atomically(args.out / written[2], plot_png(results))
    if results["mid"] is not None and results["mid"]["profile"] is not None:
        written.append(f"{args.stem}.profile.md")
        write_text_atomically(args.out / written[-1], profile_markdown(results) + "\n")
    print(f"\nwrote {', '.join(written)} into {args.out} ({results['wall_s']:.0f} s)")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Output


def cell(value: dict, digits: int) -> str:
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}-{value['max']:.{digits}f})"


def ratio_cell(value: dict) -> str:
    return f"{value['median']:.2f}x ({value['min']:.2f}-{value['max']:.2f})"


def describe(config: Mapping[str, Any]) -> str:
    return (
        f"{config['n_layer']} layers, d_model {config['d_model']}, {config['n_head']} heads x {config['d_head']}, "
        f"d_inner {config['d_inner']}, vocab {config['vocab_size']:,} (cutoffs {config['cutoffs']}, div_val "
        f"{config['div_val']}), mem_len {config['mem_len']}, clamp_len {config['clamp_len']}, same_length "
        f"{config['same_length']}"
    )


def markdown(results: dict) -> str:
    setup, machine = results["setup"], results["machine"]
    header = [
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['torch_threads']} torch threads, fp32; torch "
        f"{machine['torch']}, transformers {machine['transformers']}; inference attention: "
        f"{machine.get('attention_kernel', 'torch')}."
        + (" **Quick mode: tiny models, not a measurement.**" if setup["quick"] else ""),
    ]
    return "\n\n".join(["\n".join(header), mid_markdown(results), wt103_markdown(results)])


def mid_markdown(results: dict) -> str:
    setup, mid = results["setup"], results["mid"]
    if mid is None:
        return "Mid part: not run (--skip-mid)."
    lines = [
        f"## {mid['config_name']} configuration against GPT-2",
        "",
        f"transfoxl ({describe(mid['config'])}; {mid['parameters']['transfoxl']:,} parameters) against "
        f"transformers' GPT2LMHeadModel of the same width, depth, heads, n_inner and vocabulary "
        f"({mid['parameters']['gpt2']:,} parameters, KV cache), attention {mid['attn_implementation']['transfoxl']} / "
        f"{mid['attn_implementation']['gpt2']}. Greedy generate() after a {setup['prompt_len']}-token prompt, "
        f"{setup['new_tokens']} new tokens. Prefill: generate() call to the first token; decode step: median interval "
        "between tokens; *forward*: the same model calls timed without generate(). Median over "
        f"{setup['runs']} runs (min-max), implementations alternated run after run.",
        "",
        "| batch | measure | transfoxl | GPT-2 | transfoxl / GPT-2 |",
        "|---|---|---|---|---|",
    ]
    rows = [
        ("prefill_s", "prefill, generate() (s)", 4),
        ("forward_prefill_s", "prefill, forward (s)", 4),
        ("step_ms", "decode step, generate() (ms)", 2),
        ("forward_step_ms", "decode step, forward (ms)", 2),
    ]
    for batch, entry in mid["summary"].items():
        for name, label, digits in rows:
            lines.append(
                f"| {batch} | {label} | {cell(entry['transfoxl'][name], digits)} | "
                f"{cell(entry['gpt2'][name], digits)} | {entry['ratio'][name]:.2f}x |"
            )
    lines += [
        "",
        "generate()'s own work per step (generate() step - forward step, ms): "
        + "; ".join(
            f"batch {batch}: transfoxl {entry['transfoxl']['generate_overhead_ms']:.2f}, GPT-2 "
            f"{entry['gpt2']['generate_overhead_ms']:.2f}"
            for batch, entry in mid["summary"].items()
        )
        + ".",
    ]
    lines.append(
        "Decode-step ratios of the runs made back to back: "
        + "; ".join(
            f"batch {batch}: " + ", ".join(f"{value:.2f}" for value in entry["paired_ratios"]["step_ms"])
            for batch, entry in mid["summary"].items()
        )
        + "."
    )
    stalled = {  # batch: how many of its measures spread beyond STALL_SPREAD
        batch: sum(
            entry[impl][name]["max"] > STALL_SPREAD * entry[impl][name]["min"]
            for impl in IMPLEMENTATIONS
            for name in MID_MEASURES
        )
        for batch, entry in mid["summary"].items()
    }
    if any(stalled.values()):
        counts = ", ".join(
            f"batch {batch}: {count} of {2 * len(MID_MEASURES)} measures" for batch, count in stalled.items() if count
        )
        lines.append(
            f"**Runs differ by more than {STALL_SPREAD:g}x** ({counts}): the machine was busy and multi-threaded "
            "steps stalled (see the docstring); a median drawn from stalled runs is not a measurement. Read the min "
            "column, or run again with --threads 1."
        )
    same = all(entry[impl]["same_tokens"] for entry in mid["summary"].values() for impl in IMPLEMENTATIONS)
    lines.append(
        "generate() and the bare forward loop chose the same tokens: "
        + ("yes, for both models." if same else "**no** (see decode.json, `same_tokens`).")
    )
    return "\n".join(lines)


def wt103_markdown(results: dict) -> str:
    wt103 = results["wt103"]
    if wt103 is None:
        return "WikiText-103 part: not run (--skip-wt103)."
    measured, floors, ratio = wt103["measured"], wt103["floors"], wt103["ratio_to_floor"]
    fastest = wt103["paired_ratios"].get("fastest_quarter_gbytes_per_s")
    flops, bytes_ = wt103["prefill_flops"], wt103["step_bytes"]
    probes = " (with the bandwidth probes' buffers: the peak could not be reset)"
    probes = probes if wt103["peak_includes_bandwidth_probes"] else ""
    lines = [
        f"## {wt103['config_name']} configuration against the machine's floors",
        "",
        f"transfoxl ({describe(wt103['config'])}; {wt103['parameters']:,} parameters, random weights), batch 1, "
        f"greedy generate() after a {wt103['prompt_len']}-token prompt, {wt103['new_tokens']} new tokens; median over "
        f"{wt103['runs_requested']} runs (min-max), in a fresh process. Compute floor: the prefill's matrix products, "
        f"{flops['total'] / 1e9:.1f} GFLOP (projections {flops['projections'] / 1e9:.1f}, relative positions "
        f"{flops['relative_positions'] / 1e9:.1f}, scores and values {flops['attention'] / 1e9:.1f}, feed-forward "
        f"{flops['feed_forward'] / 1e9:.1f}, embedding {flops['embedding'] / 1e9:.2f}, the last position's "
        f"{wt103['config']['vocab_size']:,}-token adaptive softmax {flops['adaptive_softmax'] / 1e9:.2f}), at the "
        f"best fp32 matmul rate measured in the same process, {wt103['matmul_gflops_ceiling']:.1f} GFLOP/s. Bandwidth "
        f"floor: the bytes a step reads, {bytes_['total'] / 1e9:.3f} GB (weights {bytes_['weights'] / 1e9:.3f}, "
        f"keys/values of {bytes_['mean_memory_length']:.0f} memory positions {bytes_['keys_values'] / 1e9:.3f}, "
        f"positions {bytes_['positions'] / 1e9:.4f}), at the best matrix-vector bandwidth measured in the process, "
        f'{wt103["mv_gbytes_per_s_ceiling"]:.1f} GB/s; the rows "each run" compare each run with the floor at the '
        "bandwidth measured just before it (the host's other work moves it from run to run), medians of those "
        'ratios; the row "each step" (where the compiled kernel is built) times bare steps again, each followed by '
        "`row_linear` over the floor's first probe matrix (the median of a few calls, as the floor's), and compares "
        "each step with the floor at that reading: the host's phase can change within a run.",
        "",
        "| measure | measured | floor | measured / floor |",
        "|---|---|---|---|",
        f"| prefill, generate() (s) | {cell(measured['prefill_s'], 3)} | {floors['prefill_s']:.3f} | "
        f"{ratio['prefill']:.2f}x |",
        f"| prefill, forward (s) | {cell(measured['forward_prefill_s'], 3)} | {floors['prefill_s']:.3f} | "
        f"{ratio['forward_prefill']:.2f}x |",
        f"| decode step, generate() (ms) | {cell(measured['step_ms'], 1)} | {floors['step_ms']:.1f} | "
        f"{ratio['step']:.2f}x |",
        f"| decode step, forward (ms) | {cell(measured['forward_step_ms'], 1)} | {floors['step_ms']:.1f} | "
        f"{ratio['forward_step']:.2f}x |",
        f"| decode step, generate(), each run / the floor just before it | | "
        f"{cell(spread(wt103['run_floors_ms']), 1)} | {ratio_cell(wt103['paired_ratios']['step'])} |",
        f"| decode step, forward, each run / the floor just before it | | "
        f"{cell(spread(wt103['run_floors_ms']), 1)} | {ratio_cell(wt103['paired_ratios']['forward_step'])} |",
        *(
            [
                f"| decode step, forward, each step / the floor read right after it | "
                f"{cell(spread([1e3 * t for t in wt103['steps_beside_bandwidth']['steps_s']]), 1)} | "
                f"{cell(spread(wt103['step_floors_ms']), 1)} | "
                f"{ratio_cell(wt103['paired_ratios']['forward_each_step'])} |",
                f"| decode step, forward, the steps of the fastest quarter of those readings "
                f"(read at {fastest['min']:.1f}-{fastest['max']:.1f} GB/s) | | | "
                f"{ratio_cell(wt103['paired_ratios']['forward_each_step_fastest_quarter'])} |",
            ]
            if wt103["step_floors_ms"]
            else []
        ),
        "",
        f"Prefill {wt103['prefill_tokens_per_s']:.0f} tokens/s; generate() end to end ({wt103['prompt_len']} + "
        f"{wt103['new_tokens']} tokens) {cell(measured['total_s'], 2)} s. A decode step's products are "
        f"{wt103['step_flops']['total'] / 1e9:.2f} GFLOP ({floors['step_compute_ms']:.1f} ms at the matmul rate): it "
        f"is bound by reading the weights. Peak RSS {wt103['peak_rss_mb']:.0f} MB{probes} (after building the model: "
        f"{wt103['loaded_rss_mb']:.0f} MB; the weights are {wt103['weight_bytes']['all'] / 2**20:.0f} MiB). Rates: "
        f"before {rates_line(wt103['rates_before'])}; after {rates_line(wt103['rates_after'])}.",
        "",
        v4_markdown(wt103),
    ]
    return "\n".join(lines)


def same_weights_line(entry: dict) -> str:
    """Whether transfoxl reproduced v4's outputs (tokens, last-position log-probabilities)."""
    count = len(entry["tokens"][0])
    tokens = (
        f"the same {count} greedy tokens in every run of both"
        if entry["same_tokens"]
        else "**different greedy tokens** (see the JSON: `v4_runs`, `transfoxl_zero_memory_runs`)"
    )
    return (
        f"v4's outputs reproduced from its zero-filled memory: {tokens}; log-probabilities of the prompt's last "
        f"position differ by at most {entry['max_abs_log_prob_difference']:.1e}"
    )


def v4_markdown(wt103: dict) -> str:
    entry = wt103.get("v4")
    if entry is None:
        return f"transformers {v4.VERSION}: not run (--skip-v4, or --quick without --with-v4)."
    measured, ratio, tokens_per_s = entry["measured"], entry["ratio"], entry["prefill_tokens_per_s"]
    sides = ("transfoxl_zero_memory", "transfoxl_empty_memory", "v4")
    mem_len, new_tokens = wt103["config"]["mem_len"], wt103["new_tokens"]

    def row(label: str, values: Sequence[str], name: str) -> str:
        ratios = [f"{ratio[side][name]:.2f}x" for side in sides[:2]]
        return f"| {label} | {' | '.join(values)} | {' | '.join(ratios)} |"

    def timed(name: str, digits: int) -> list[str]:
        return [cell(measured[side][name], digits) for side in sides]

    def rss(name: str) -> list[str]:
        return [f"{entry[name]['transfoxl']:.0f}"] * 2 + [f"{entry[name]['v4']:.0f}"]

    prefill_rates = [f"{tokens_per_s[side]:.0f}" for side in sides]
    lines = [
        f"### End to end against transformers {entry['transformers']}",
        "",
        f"The same weights: transformers {entry['transformers']} built the seeded model ({entry['parameters']:,} "
        f"parameters) and saved it; transfoxl loaded that folder through AutoModelForCausalLM (converted on load). "
        f"The same prompt, greedy generate() for {new_tokens} new tokens, each in its own process (v4's runs, then "
        "transfoxl's), median over runs (min-max). v4 starts a stream from mem_len "
        f"{mem_len} zero vectors, which the prompt and every step attend to, and recomputes the keys and values of "
        "its whole memory at every step; transfoxl is timed from that zero memory too (the same work, v4's tokens) "
        "and from its default empty memory (the runs of the table above). Peak RSS: of each process (transfoxl's "
        "ran both).",
        "",
        f"| measure | transfoxl, v4's zero memory | transfoxl, empty memory | transformers {entry['transformers']} | "
        "transfoxl zero / v4 | transfoxl empty / v4 |",
        "|---|---|---|---|---|---|",
        row("prefill, generate() (s)", timed("prefill_s", 3), "prefill_s"),
        f"| prefill (tokens/s) | {' | '.join(prefill_rates)} | "
        + " | ".join(f"{tokens_per_s[side] / tokens_per_s['v4']:.2f}x" for side in sides[:2])
        + " |",
        row("decode step, generate() (ms)", timed("step_ms", 1), "step_ms"),
        row(
            f"end to end, generate() ({wt103['prompt_len']} + {new_tokens} tokens, s)", timed("total_s", 2), "total_s"
        ),
        row("RSS after loading (MB)", rss("loaded_rss_mb"), "loaded_rss_mb"),
        row("peak RSS (MB)", rss("peak_rss_mb"), "peak_rss_mb"),
        "",
        same_weights_line(entry) + ".",
    ]
    return "\n".join(lines)


def profile_markdown(results: dict) -> str:
    mid, setup = results["mid"], results["setup"]
    profile = mid["profile"]
    steps = next(iter(profile.values()))["steps"]
    lines = [
        f"Generated by tools/bench_decode.py: the decode steps of the {mid['config_name']} configuration at batch 1 "
        f"after a {setup['prompt_len']}-token prompt, {steps} steps of greedy generate() per model (the prefill is "
        f"not profiled), {mid['profile_threads']} torch thread(s). Milliseconds per step. The profilers "
        "slow the steps down (the labels' hooks, the recording of each operator; cProfile far more for Python-heavy "
        "code): compare shares and counts, and the plain step time for absolute numbers.",
        "",
        "| | transfoxl | GPT-2 |",
        "|---|---|---|",
    ]

    def row(label: str, value: Callable[[dict], str]) -> str:
        return f"| {label} | {value(profile['transfoxl'])} | {value(profile['gpt2'])} |"

    lines += [
        row("step, no profiler (median)", lambda p: f"{p['plain_step_ms']:.2f}"),
        row("step, under torch.profiler (mean)", lambda p: f"{p['profiled_step_ms']:.2f}"),
        row(
            "operators' own time / calls per step (aten and compiled kernels)",
            lambda p: f"{p['aten_self_ms_per_step']:.2f} / {p['aten_calls_per_step']:.0f}",
        ),
        row(
            "outside operators (Python, dispatch, profiler)",
            lambda p: f"{p['profiled_step_ms'] - p['aten_self_ms_per_step']:.2f}",
        ),
        row(
            "generate() outside the model's forward",
            lambda p: f"{p['profiled_step_ms'] - p['sections_ms_per_step']['model forward']:.2f}",
        ),
    ]
    for name in SECTIONS:
        lines.append(
            row(
                f"{name} (calls per step)",
                lambda p, name=name: (
                    f"{p['sections_ms_per_step'][name]:.2f} ({p['section_calls_per_step'][name]:.0f})"
                    if p["section_calls_per_step"][name]
                    else "- (not labelled: inside the stack's one compiled call)"
                ),
            )
        )
    for impl in IMPLEMENTATIONS:
        entry = profile[impl]
        lines += [
            "",
            f"### {LABELS[impl]}: top operators by own time",
            "",
            "| operator | own ms/step | total ms/step | calls/step |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {op['name']} | {op['self_ms_per_step']:.3f} | {op['total_ms_per_step']:.3f} | "
            f"{op['calls_per_step']:.0f} |"
            for op in entry["operators"]
        ]
        lines += [
            "",
            f"### {LABELS[impl]}: Python functions by own time (cProfile; step {entry['cprofile_step_ms']:.2f} ms "
            "under it)",
            "",
            "| function | own ms/step | cumulative ms/step | calls/step |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| `{fn['function']}` | {fn['own_ms_per_step']:.3f} | {fn['cumulative_ms_per_step']:.3f} | "
            f"{fn['calls_per_step']:.1f} |"
            for fn in entry["python_functions"]
        ]
        lines += [
            "",
            f"### {LABELS[impl]}: transfoxl and transformers.generation functions by cumulative time (cProfile)",
            "",
            "| function | cumulative ms/step | own ms/step | calls/step |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| `{fn['function']}` | {fn['cumulative_ms_per_step']:.3f} | {fn['own_ms_per_step']:.3f} | "
            f"{fn['calls_per_step']:.1f} |"
            for fn in entry["python_cumulative"]
        ]
    return "\n".join(lines)


def plot_png(results: dict) -> bytes:
    """Mid: decode step and prefill of both models per batch; wt103: measured / floor, and transfoxl / v4 when v4
    ran (a fourth panel)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    against_v4 = None if results["wt103"] is None else results["wt103"]["v4"]
    figure = Figure(figsize=(13 if against_v4 is None else 17, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    step_axes, prefill_axes, floor_axes, *v4_axes = figure.subplots(1, 3 if against_v4 is None else 4)
    summary = {} if results["mid"] is None else results["mid"]["summary"]
    batches = list(summary)
    for axes, name, unit in ((step_axes, "step_ms", "decode step (ms)"), (prefill_axes, "prefill_s", "prefill (s)")):
        if not batches:
            axes.set_axis_off()
            continue
        for offset, impl in enumerate(IMPLEMENTATIONS):
            values = [summary[batch][impl][name] for batch in batches]
            medians = [value["median"] for value in values]
            errors = [
                [value["median"] - value["min"] for value in values],
                [value["max"] - value["median"] for value in values],
            ]
            positions = [index + (offset - 0.5) * 0.4 for index in range(len(batches))]
            bars = axes.bar(positions, medians, 0.4, yerr=errors, capsize=3, label=LABELS[impl])
            axes.bar_label(bars, fmt="%.3g", padding=2, fontsize=8)
        labels = [f"batch {batch}\n({summary[batch]['ratio'][name]:.2f}x)" for batch in batches]
        axes.set_xticks(range(len(batches)), labels)
        axes.set_ylabel(f"{unit}, median (min-max)")
        axes.set_title(f"{results['mid']['config_name']} config, generate(): {unit.split(' (')[0]}")
        axes.legend()
    wt103 = results["wt103"]
    if wt103 is None:
        floor_axes.set_axis_off()
    else:
        ratio = wt103["ratio_to_floor"]
        names = ["prefill", "forward_prefill", "step", "forward_step"]
        labels = ["prefill\ngenerate()", "prefill\nforward", "decode step\ngenerate()", "decode step\nforward"]
        bars = floor_axes.bar(range(len(names)), [ratio[name] for name in names], 0.6, color=["C2", "C2", "C4", "C4"])
        floor_axes.bar_label(bars, fmt="%.2fx", padding=2, fontsize=8)
        floor_axes.axhline(1.0, color="black", linewidth=1)
        floor_axes.set_xticks(range(len(names)), labels)
        floor_axes.set_ylabel("measured / floor (1 = at the floor)")
        floor_axes.set_title(f"{wt103['config_name']} config, batch 1, against the floors")
    if against_v4 is not None:
        names = ["prefill_s", "step_ms", "total_s", "peak_rss_mb"]
        labels = ["prefill", "decode step", "end to end", "peak RSS"]
        sides = {"transfoxl_zero_memory": "transfoxl, v4's zero memory", "transfoxl_empty_memory": "transfoxl, empty"}
        highest = 1.0
        for offset, (side, label) in enumerate(sides.items()):
            positions = [index + (offset - 0.5) * 0.4 for index in range(len(names))]
            values = [against_v4["ratio"][side][name] for name in names]
            highest = max(highest, *values)
            bars = v4_axes[0].bar(positions, values, 0.4, label=label)
            v4_axes[0].bar_label(bars, fmt="%.2fx", padding=2, fontsize=8)
        v4_axes[0].axhline(1.0, color="black", linewidth=1)
        v4_axes[0].set_ylim(0, 1.35 * highest)  # room for the legend above the bars
        v4_axes[0].set_xticks(range(len(names)), labels)
        v4_axes[0].set_ylabel(f"transfoxl / transformers {against_v4['transformers']} (1 = as v4)")
        v4_axes[0].set_title(f"{wt103['config_name']}: transfoxl / v4 (same weights)")
        v4_axes[0].legend(fontsize=8, loc="upper left", ncols=2)
    return png_bytes(figure)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        raise SystemExit(worker_main())
    raise SystemExit(main())
