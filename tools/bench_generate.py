"""Greedy generation speed: this package against transformers 4.37.2's TransfoXLLMHeadModel, on the same weights.

The mid configuration of the project's benchmarks (6 layers, d_model 256, 8 heads x 32, d_inner 1024, vocab 10000 with
cutoffs [2000, 5000] and div_val 2, mem_len 512), a 512-token prompt and 128 new tokens, at batch 1 and 8. Three
implementations, alternated run after run so that a noisy machine hurts them alike:

- `transfoxl`: `model.generate()` with the memory as cache (projected keys/values kept while decoding);
- `v4`: transformers 4.37.2, in its own virtualenv (created by `tools/v4.py` the first time: needs PyPI), driven as a
  worker process that reads the same weights; both start from v4's zero-filled memory (`memory_init="zeros"`), so
  their tokens must be identical, which the script checks;
- `no memory`: the paper's baseline, a Transformer that recomputes its whole window (the last 512 tokens) for every
  predicted token (fewer new tokens: it is slow).

New tokens per second count the prompt's processing, as a user of generate() sees it; the JSON also has the prefill
and per-token decoding times of transfoxl measured apart.

    python tools/bench_generate.py                     # writes benchmarks/generate.{json,md}
    python tools/bench_generate.py --runs 5 --batch-sizes 1
    python tools/bench_generate.py --skip-v4           # no virtualenv, no network
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import torch
import transformers

import transfoxl
from transfoxl import TxlForCausalLM

if __package__:  # imported (`from tools import bench_generate`) or run with `python -m tools.bench_generate`
    from . import configs, v4
    from .bench_decode import cache_of
else:  # run as a file, `python tools/bench_generate.py`: its folder is the first entry of sys.path
    import configs
    import v4
    from bench_decode import cache_of

REPO = Path(__file__).resolve().parents[1]
MID_CONFIG = configs.model_config("mid", mem_len=512)

# Runs inside the transformers 4.37.2 virtualenv: builds the seeded v4 model (once), then answers timing requests,
# one JSON line in ("batch" and "new_tokens"), one JSON line out.
V4_WORKER = textwrap.dedent(
    """
    import json, sys, time, warnings
    import torch
    warnings.filterwarnings("ignore")
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    config, folder, prompt_len, seed = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(seed)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**config)).eval()
    model.save_pretrained(folder)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        prompt = torch.randint(0, config["vocab_size"], (request["batch"], prompt_len),
                               generator=torch.Generator().manual_seed(seed + 1))
        start = time.perf_counter()
        output = model.generate(prompt, max_new_tokens=request["new_tokens"], do_sample=False, pad_token_id=0,
                                eos_token_id=None)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "tokens": output[:, prompt_len:].tolist()}), flush=True)
    """
)


class V4Worker:
    """transformers 4.37.2 in its own process, timing generate() on request."""

    def __init__(self, python: Path, folder: Path, prompt_len: int, seed: int) -> None:
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
        args = [str(python), "-c", V4_WORKER, json.dumps(MID_CONFIG), str(folder), str(prompt_len), str(seed)]
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ready = self.process.stdout.readline()
        if not ready:
            raise RuntimeError("the transformers 4.37.2 worker did not start (see its error above)")

    def generate(self, batch: int, new_tokens: int) -> tuple[float, list]:
        self.process.stdin.write(json.dumps({"batch": batch, "new_tokens": new_tokens}) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        return answer["seconds"], answer["tokens"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def prompt_for(batch: int, prompt_len: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1)  # the worker draws the same prompt
    return torch.randint(0, MID_CONFIG["vocab_size"], (batch, prompt_len), generator=generator)


@torch.no_grad()
def time_transfoxl(model: TxlForCausalLM, prompt: torch.Tensor, new_tokens: int) -> tuple[float, list]:
    start = time.perf_counter()
    output = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    return time.perf_counter() - start, output[:, prompt.shape[1] :].tolist()


@torch.no_grad()
def time_no_memory(model: TxlForCausalLM, prompt: torch.Tensor, new_tokens: int, window: int) -> float:
    """The vanilla baseline: every predicted token recomputes the last `window` tokens from scratch."""
    sequence = prompt
    start = time.perf_counter()
    for _ in range(new_tokens):
        log_probs = model(sequence[:, -window:], use_cache=False, logits_to_keep=1).logits
        sequence = torch.cat([sequence, log_probs[:, -1].argmax(-1, keepdim=True)], dim=1)
    return time.perf_counter() - start


@torch.no_grad()
def prefill_and_decode_times(model: TxlForCausalLM, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """transfoxl's prompt processing (s) and per-token decoding (s), measured apart with a manual greedy loop."""
    start = time.perf_counter()
    output = model(prompt, logits_to_keep=1)
    prefill = time.perf_counter() - start
    (name, memory), token = cache_of(output), output.logits[:, -1].argmax(-1, keepdim=True)
    start = time.perf_counter()
    for _ in range(new_tokens):
        output = model(token, logits_to_keep=1, **{name: memory})
        token = output.logits[:, -1].argmax(-1, keepdim=True)
    return prefill, (time.perf_counter() - start) / new_tokens


def summary(seconds: list[float], tokens: int) -> dict:
    rates = [tokens / value for value in seconds]
    return {
        "seconds": seconds,
        "tokens_per_s_median": statistics.median(rates),
        "tokens_per_s_min": min(rates),
        "tokens_per_s_max": max(rates),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_generate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per implementation (default: %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--baseline-new-tokens", type=int, default=8, help="new tokens for the no-memory baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--v4-venv", type=Path, default=REPO / ".bench" / "venv-v4")
    parser.add_argument("--skip-v4", action="store_true", help="do not run transformers 4.37.2")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "generate")
    args = parser.parse_args(argv)
    for name in ("runs", "prompt_len", "new_tokens", "baseline_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(batch < 1 for batch in args.batch_sizes):
        parser.error(f"--batch-sizes must all be >= 1, got {args.batch_sizes}")
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; expected a path stem (the script writes its .json and .md)")

    work = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    worker = None
    if args.skip_v4:
        torch.manual_seed(args.seed)
        model = TxlForCausalLM(transfoxl.TransfoXLConfig(**MID_CONFIG, memory_init="zeros"))
    else:
        worker = V4Worker(v4.ensure_venv(args.v4_venv), work / "v4-model", args.prompt_len, args.seed)
        model = TxlForCausalLM.from_pretrained(work / "v4-model", memory_init="zeros")
    model.eval()

    results: dict = {"batches": {}}
    for batch in args.batch_sizes:
        prompt = prompt_for(batch, args.prompt_len, args.seed)
        time_transfoxl(model, prompt[:, :16], 2)  # warm-up
        times: dict[str, list[float]] = {"transfoxl": [], "v4": [], "no_memory": []}
        identical = None
        for _ in range(args.runs):
            seconds, ours = time_transfoxl(model, prompt, args.new_tokens)
            times["transfoxl"].append(seconds)
            if worker is not None:
                seconds, theirs = worker.generate(batch, args.new_tokens)
                times["v4"].append(seconds)
                identical = ours == theirs if identical is None else identical and ours == theirs
            times["no_memory"].append(time_no_memory(model, prompt, args.baseline_new_tokens, args.prompt_len))
        prefill, per_token = prefill_and_decode_times(model, prompt, 32)
        entry = {
            "transfoxl": summary(times["transfoxl"], batch * args.new_tokens),
            "no_memory": summary(times["no_memory"], batch * args.baseline_new_tokens),
            "transfoxl_prefill_s": prefill,
            "transfoxl_decode_ms_per_step": per_token * 1000,
            "tokens_identical_to_v4": identical,
        }
        if worker is not None:
            entry["v4"] = summary(times["v4"], batch * args.new_tokens)
            entry["speedup_vs_v4"] = entry["transfoxl"]["tokens_per_s_median"] / entry["v4"]["tokens_per_s_median"]
        entry["speedup_vs_no_memory"] = (
            entry["transfoxl"]["tokens_per_s_median"] / entry["no_memory"]["tokens_per_s_median"]
        )
        results["batches"][str(batch)] = entry
    if worker is not None:
        worker.close()

    results["setup"] = {
        "config": MID_CONFIG,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "baseline_new_tokens": args.baseline_new_tokens,
        "runs": args.runs,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    table = markdown_table(results)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table + "\n")
    return 0


def rate_cell(entry: dict, name: str) -> str:
    if name not in entry:
        return "not run"
    value = entry[name]
    return f"{value['tokens_per_s_median']:.1f} ({value['tokens_per_s_min']:.1f}-{value['tokens_per_s_max']:.1f})"


def markdown_table(results: dict) -> str:
    setup = results.get("setup", {})
    lines = [
        f"Greedy generate(), mid config, {setup.get('prompt_len')}-token prompt, mem_len 512, "
        f"{setup.get('new_tokens')} new tokens; median new tokens/s over {setup.get('runs')} runs (min-max); "
        f"{setup.get('machine')}.",
        "",
        "| batch | transfoxl | transformers 4.37.2 | speed-up | no memory (recomputes) | speed-up | same tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for batch, entry in results["batches"].items():
        speedup_v4 = f"{entry['speedup_vs_v4']:.1f}x" if "speedup_vs_v4" in entry else "-"
        lines.append(
            f"| {batch} | {rate_cell(entry, 'transfoxl')} | {rate_cell(entry, 'v4')} | {speedup_v4} | "
            f"{rate_cell(entry, 'no_memory')} | {entry['speedup_vs_no_memory']:.1f}x | "
            f"{entry['tokens_identical_to_v4']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
