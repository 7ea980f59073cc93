"""Long runs: memory use stays flat over a 1,000,000-token streaming evaluation and a 20,000-token generation.

Both run on a small random model (2 layers, d_model 64, vocab 256, mem_len 128; the weights do not matter for memory
use) with a memory carried from segment to segment:

- evaluation: `transfoxl.evaluation.evaluate_stream` over a stream of `--eval-tokens` tokens, in segments of
  `--tgt-len`, `--batch-size` columns, with a memory of `--mem-len` positions;
- generation: `transfoxl.TxlStream.generate` called again and again (`--generate-chunk` new tokens per call) until
  `--generate-tokens` tokens were generated, each call continuing the stream's bounded memory.

The resident set size (RSS, from /proc/self/statm) is read at every forward. Growth is measured from the highest RSS
of warm-up (the first `--warmup` fraction of each run; the allocator makes a steady loop's RSS swing by a few MB) to
the end of the run, which must stay under `--max-growth-pct` (5%); the growth to the peak after warm-up is reported
too (it holds the allocator's swings: about 1-4% here).

The leak check counts, after garbage collection, the live `TxlMemory` / `TxlMemoryLayer` objects and the tensors (and
their storage bytes) before and after repeated calls: nothing may accumulate between calls, and a stream's memory
must be freed with the stream.

    python tools/long_runs.py                                   # the real sizes; writes benchmarks/long_runs.json
    python tools/long_runs.py --eval-tokens 20000 --generate-tokens 300 --generate-chunk 100 --out /tmp/lr.json
    python tools/long_runs.py --help

The exit status is 0 when every bound holds, 1 otherwise. On 2 CPU cores (one thread) the real sizes take about a
minute.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from transfoxl import TxlConfig, TxlForCausalLM, TxlMemory, TxlStream
from transfoxl.evaluation import evaluate_stream
from transfoxl.memory_txl import TxlMemoryLayer

if __package__:  # imported (`from tools import long_runs`) or run with `python -m tools.long_runs`
    from . import configs
else:  # run as a file, `python tools/long_runs.py`: its folder is the first entry of sys.path
    import configs

REPO = Path(__file__).resolve().parents[1]
MODEL = configs.model_config("small")  # 2 layers, d_model 64, vocab 256
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MAX_SAMPLES_KEPT = 200  # RSS samples written to the JSON per run (evenly thinned)
BYTES_SLACK = 0.05  # see leak_verdict


def rss_bytes() -> int:
    """Resident set size of this process (second field of /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


class RssSampler:
    """Reads the RSS at every forward of a model (a forward hook) at a caller-given position (tokens done so far).

    The baseline is the highest reading of warm-up (the readings before `warmup_position`, and the first at or past
    it): the allocator makes the RSS of a steady loop swing by a few MB around its level (freed activation buffers go
    back to the system or not), and a trend above what warm-up reached is what a leak looks like. Keeps that, the peak
    after warm-up and the last reading, and stores only about `MAX_SAMPLES_KEPT` readings for the curve: a list growing
    at every forward would itself leak about 100 bytes a token.
    """

    def __init__(
        self, model: torch.nn.Module, position: Callable[[int], int], *, total: int, warmup_position: float
    ) -> None:
        self.position, self.warmup_position = position, warmup_position
        self.every = max(1, total // MAX_SAMPLES_KEPT)
        self.calls = 0
        self.first = self.last = self.after_warmup = self.peak = None  # (position, rss bytes)
        self.samples: list[tuple[int, int]] = []
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.calls += 1
        reading = (self.position(self.calls), rss_bytes())
        self.first = self.first or reading
        self.last = reading
        if self.peak is None:  # still warming up
            if self.after_warmup is None or reading[1] > self.after_warmup[1]:
                self.after_warmup = reading
            if reading[0] >= self.warmup_position:
                self.peak = reading
        elif reading[1] > self.peak[1]:
            self.peak = reading
        if self.calls % self.every == 0 and len(self.samples) < 2 * MAX_SAMPLES_KEPT:
            self.samples.append(reading)

    def close(self) -> None:
        self.handle.remove()

    def summary(self) -> dict[str, Any]:
        """RSS at the start, after warm-up, at the end and at its peak after warm-up; growths from warm-up."""
        if self.last is None:
            raise RuntimeError("no RSS reading was taken: the model never ran")
        after_warmup = self.after_warmup or self.last
        peak = self.peak or self.last
        mb = 1 / 2**20
        return {
            "rss_mb_at_start": self.first[1] * mb,
            "rss_mb_after_warmup": after_warmup[1] * mb,  # the highest reading of warm-up
            "rss_mb_at_end": self.last[1] * mb,
            "rss_mb_peak_after_warmup": peak[1] * mb,
            "growth_pct": 100 * (self.last[1] - after_warmup[1]) / after_warmup[1],
            "peak_growth_pct": 100 * (peak[1] - after_warmup[1]) / after_warmup[1],
            "warmup_position": self.warmup_position,
            "samples": [[position, round(rss * mb, 2)] for position, rss in self.samples],
        }


def census() -> dict[str, int]:
    """Live memory objects and tensors after a full garbage collection."""
    gc.collect()
    counts = {"memories": 0, "memory_layers": 0, "tensors": 0}
    storages: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance() on some of torch's deprecated module proxies warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, TxlMemory):
                counts["memories"] += 1
            elif isinstance(obj, TxlMemoryLayer):
                counts["memory_layers"] += 1
            elif isinstance(obj, torch.Tensor) and obj.device.type != "meta":
                try:  # tensors without data (torch.compile's fake tensors, left by other code) are not counted
                    storage = obj.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
                except RuntimeError:
                    continue
                counts["tensors"] += 1
    counts["tensor_bytes"] = sum(storages.values())
    return counts


def build_model(mem_len: int, seed: int) -> TxlForCausalLM:
    torch.manual_seed(seed)
    return TxlForCausalLM(TxlConfig(**MODEL, mem_len=mem_len)).eval()


def long_evaluation(model: TxlForCausalLM, args: argparse.Namespace) -> dict[str, Any]:
    """evaluate_stream over `args.eval_tokens` tokens, sampling the RSS at every segment."""
    stream = torch.randint(0, MODEL["vocab_size"], (args.eval_tokens,), generator=torch.Generator().manual_seed(1))
    tokens_per_segment = args.tgt_len * args.batch_size
    sampler = RssSampler(
        model,
        lambda segments: segments * tokens_per_segment,
        total=args.eval_tokens // tokens_per_segment,
        warmup_position=args.warmup * args.eval_tokens,
    )
    started = time.perf_counter()
    try:
        result = evaluate_stream(model, stream, tgt_len=args.tgt_len, mem_len=args.mem_len, batch_size=args.batch_size)
    finally:
        sampler.close()
    seconds = time.perf_counter() - started
    return {
        "tokens": args.eval_tokens,
        "targets": result.num_targets,
        "segments": sampler.calls,
        "seconds": seconds,
        "tokens_per_s": result.num_targets / seconds,
        "loss": result.loss,
        **sampler.summary(),
    }


def long_generation(model: TxlForCausalLM, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """TxlStream.generate, `args.generate_chunk` tokens per call, until `args.generate_tokens` are generated.

    Also the leak check of the calls: a census after the first call and after the last one (nothing may accumulate),
    and one after the stream is deleted (its memory must go with it).
    """
    prompt = torch.randint(0, MODEL["vocab_size"], (1, args.tgt_len), generator=torch.Generator().manual_seed(2))
    generated = [0]
    sampler = RssSampler(  # one forward per generated token (the first of each call is the prompt's)
        model,
        lambda calls: calls,
        total=args.generate_tokens,
        warmup_position=args.warmup * args.generate_tokens,
    )
    before = census()
    stream = TxlStream(model, segment_len=args.tgt_len, mem_len=args.mem_len)
    stream.feed(prompt)
    sampling = dict(do_sample=True, top_k=20, pad_token_id=0, eos_token_id=None)
    censuses = []
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    try:
        while generated[0] < args.generate_tokens:
            count = min(args.generate_chunk, args.generate_tokens - generated[0])
            new = stream.generate(max_new_tokens=count, **sampling)
            generated[0] += new.shape[1]
            if len(censuses) == 0:  # after the first call: the warm-up is over
                censuses.append(census())
        seconds = time.perf_counter() - started
    finally:
        sampler.close()
    censuses.append(census())
    bounded = {
        "memory_length": stream.memory.get_seq_length(),
        "mem_len": args.mem_len,
        "pending": stream.pending.shape[1],
        "tokens_seen": stream.tokens_seen,
    }
    del stream, new
    after_delete = census()
    # The first census is taken before `seconds` stops: its time is left in, it is small next to the run.
    generation = {
        "tokens": generated[0],
        "calls": -(-args.generate_tokens // args.generate_chunk),
        "seconds": seconds,
        "tokens_per_s": generated[0] / seconds,
        "state": bounded,
        **sampler.summary(),
    }
    leaks = {
        "before_the_stream": before,
        "after_the_first_call": censuses[0],
        "after_the_last_call": censuses[-1],
        "after_deleting_the_stream": after_delete,
    }
    return generation, leaks


def evaluation_leaks(model: TxlForCausalLM, args: argparse.Namespace) -> dict[str, Any]:
    """Census before and after repeated evaluate_stream calls (one call first, for the caches they keep)."""
    stream = torch.randint(0, MODEL["vocab_size"], (args.tgt_len * args.batch_size * 4 + 1,))

    def call() -> None:
        evaluate_stream(model, stream, tgt_len=args.tgt_len, mem_len=args.mem_len, batch_size=args.batch_size)

    call()
    before = census()
    for _ in range(args.repeat_calls):
        call()
    return {"calls": args.repeat_calls, "before": before, "after": census()}


def leak_verdict(evaluation: dict[str, Any], generation: dict[str, Any]) -> dict[str, Any]:
    """Which counts grew: between repeated evaluations, between the first and last generate() calls, and what a
    deleted stream left behind (compared with before the stream existed).

    Between generate() calls the stream's memory lives on, and its sliding windows re-size their buffers by a few
    positions as they slide: its storage bytes may differ by a little (up to BYTES_SLACK), its object counts not at
    all. Everything else must come back exactly.
    """
    keys = ("memories", "memory_layers", "tensors", "tensor_bytes")
    first, last = generation["after_the_first_call"], generation["after_the_last_call"]
    grown = {
        "evaluation": [key for key in keys if evaluation["after"][key] > evaluation["before"][key]],
        "generation_calls": [key for key in keys[:3] if last[key] > first[key]]
        + (["tensor_bytes"] if last["tensor_bytes"] > first["tensor_bytes"] * (1 + BYTES_SLACK) else []),
        "deleted_stream": [
            key for key in keys if generation["after_deleting_the_stream"][key] > generation["before_the_stream"][key]
        ],
    }
    return {"grown": grown, "ok": not any(grown.values())}


def markdown(results: dict[str, Any]) -> str:
    limit = results["setup"]["max_growth_pct"]
    lines = [
        "| run | tokens | seconds | tokens/s | RSS of warm-up, peak (MB) | RSS at end (MB) | growth | peak growth | "
        f"within {limit:g}% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in ("evaluation", "generation"):
        run = results[name]
        within = "yes" if run["growth_pct"] < limit else "**NO**"
        lines.append(
            f"| {name} | {run['tokens']:,} | {run['seconds']:.1f} | {run['tokens_per_s']:,.0f} | "
            f"{run['rss_mb_after_warmup']:.1f} | {run['rss_mb_at_end']:.1f} | {run['growth_pct']:+.2f}% | "
            f"{run['peak_growth_pct']:+.2f}% | {within} |"
        )
    leaks = results["leaks"]
    grown = ", ".join(f"{where}: {keys}" for where, keys in leaks["verdict"]["grown"].items() if keys)
    lines += [
        "",
        f"Leak check ({leaks['evaluation']['calls']} repeated evaluate_stream calls; {results['generation']['calls']} "
        "TxlStream.generate calls; the stream deleted): "
        + ("nothing accumulated." if leaks["verdict"]["ok"] else f"**grew**: {grown}."),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="long_runs.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--eval-tokens", type=int, default=1_000_000, help="evaluation stream length (%(default)s)")
    parser.add_argument("--generate-tokens", type=int, default=20_000, help="tokens to generate (%(default)s)")
    parser.add_argument(
        "--generate-chunk", type=int, default=1000, help="new tokens per generate() call (%(default)s)"
    )
    parser.add_argument("--tgt-len", type=int, default=128, help="segment length (%(default)s)")
    parser.add_argument("--mem-len", type=int, default=128, help="memory length (%(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="evaluation columns (%(default)s)")
    parser.add_argument(
        "--warmup", type=float, default=0.1, help="fraction of each run counted as warm-up (%(default)s)"
    )
    parser.add_argument(
        "--max-growth-pct", type=float, default=5.0, help="RSS growth allowed after warm-up (%(default)s)"
    )
    parser.add_argument(
        "--repeat-calls", type=int, default=5, help="evaluate_stream calls of the leak check (%(default)s)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (%(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "long_runs.json", help="JSON written here")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("generate_tokens", "generate_chunk", "tgt_len", "batch_size", "repeat_calls", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.mem_len < 1:
        parser.error(f"--mem-len must be >= 1 (the runs are about a memory kept bounded), got {args.mem_len}")
    least = args.batch_size * (args.tgt_len + 1)
    if args.eval_tokens < least:
        parser.error(
            f"--eval-tokens must be >= --batch-size x (--tgt-len + 1) = {least} (one segment per column), got "
            f"{args.eval_tokens}"
        )
    if not 0 <= args.warmup < 1:
        parser.error(f"--warmup must be in [0, 1), got {args.warmup}")
    if not args.max_growth_pct > 0:
        parser.error(f"--max-growth-pct must be > 0, got {args.max_growth_pct}")
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; expected a .json file path")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        model = build_model(args.mem_len, args.seed)
        with torch.no_grad():
            evaluation = long_evaluation(model, args)
            evaluation_leak = evaluation_leaks(model, args)
        generation, generation_leak = long_generation(model, args)
    finally:
        torch.set_num_threads(threads)

    verdict = leak_verdict(evaluation_leak, generation_leak)
    results: dict[str, Any] = {
        "setup": {
            "model": MODEL,
            "mem_len": args.mem_len,
            "tgt_len": args.tgt_len,
            "batch_size": args.batch_size,
            "generate_chunk": args.generate_chunk,
            "warmup": args.warmup,
            "max_growth_pct": args.max_growth_pct,
            "threads": args.threads,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores",
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "evaluation": evaluation,
        "generation": generation,
        "leaks": {"evaluation": evaluation_leak, "generation": generation_leak, "verdict": verdict},
    }
    within = all(results[name]["growth_pct"] < args.max_growth_pct for name in ("evaluation", "generation"))
    results["passed"] = within and verdict["ok"]
    results["summary"] = {
        name: {
            key: results[name][key] for key in ("tokens", "seconds", "tokens_per_s", "growth_pct", "peak_growth_pct")
        }
        for name in ("evaluation", "generation")
    }
    results["summary"]["leaks_ok"] = verdict["ok"]
    results["markdown"] = markdown(results)
    print(results["markdown"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {args.out}; {'all bounds hold' if results['passed'] else 'A BOUND DOES NOT HOLD'}")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
