"""Which of the compiled CPU kernels' refusals crash the process, by build variant: a probe for other toolchains.

    python tools/kernel_error_probe.py --out DIR                      # every variant; kernel_errors.{json,md}
    python tools/kernel_error_probe.py --variants default --out DIR   # the build the package makes (the test)
    python tools/kernel_error_probe.py --out DIR --backtrace          # and the first crash again under cuda-gdb/gdb

Each case calls one compiled operator with input it must refuse (a `TORCH_CHECK` that fails), in a process of its own,
and records whether the process raised the RuntimeError or died (its signal). Each variant is the package's build
command with one change, built into the kernel cache under its own key; `torch-extension` builds the same source
through `torch.utils.cpp_extension.load` (torch's own flags and libraries); `after-inductor` calls the default build
after a `torch.compile` (inductor) in the same process; `torch_mm_shape` is torch's own operator refusing its input.
Written for GPU machines' images: there (torch 2.11.0+cu130, GCC 13.3) the one-row softmax's refusal crashed a test
worker while the other operators' refusals raised (docs/performance.md, GPU paths). A C++ error captures a stack trace
(c10::Error), and the unwinder walking it has been seen to crash where a library's registered unwind tables went
stale (pytorch/pytorch#117597): if every cell raises here but the suite crashes, what ran before in the worker is the
suspect, not the build.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = ("default", "after-inductor", "c++17", "c++20", "no-openmp", "O1", "torch-extension")


def _case_inputs() -> dict:
    """Each case: the operator and arguments it must refuse."""
    hidden, weight, bias, projection = torch.randn(8), torch.randn(5, 4), torch.randn(5), torch.randn(8, 4)
    return {
        "softmax_row_count": ("adaptive_log_softmax_row", (hidden, [weight, bias])),
        "softmax_row_shape": ("adaptive_log_softmax_row", (hidden, [weight, bias, projection.t().contiguous()])),
        "softmax_row_width": ("adaptive_log_softmax_row", (hidden, [weight, bias, None])),
        "row_linear_dtype": ("row_linear", (hidden.double(), weight, None)),
        "dropout_backward_shape": (
            "dropout_training_backward",
            (hidden, torch.zeros(3, dtype=torch.uint8), 1.0),
        ),
        "decode_layers_count": ("decode_layers", (hidden[None], [weight], None, [], False, [])),
        "torch_mm_shape": (None, (hidden, weight)),  # (a control: torch's own operator refusing its input)
    }


CASES = tuple(_case_inputs())


def _operators(variant: str) -> object:
    """The compiled operators of `variant` (built on first use)."""
    from transfoxl import cpp_kernels_txl as kernels

    if variant == "torch-extension":
        from torch.utils import cpp_extension

        namespace = "transfoxl_probe_" + hashlib.sha256(kernels.SOURCE.encode()).hexdigest()[:12]
        folder = kernels.cache_folder() / namespace
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "kernel.cpp"
        if not source.is_file():
            source.write_text(kernels.SOURCE)
        vectors = ["-mavx2", "-mfma"]
        if torch.backends.cpu.get_cpu_capability() == "AVX512":
            vectors += ["-mavx512f", "-mavx512vl", "-mavx512dq"]
        cpp_extension.load(
            name=namespace,
            sources=[str(source)],
            extra_cflags=["-O3", "-fopenmp", *vectors, f"-DTXL_NAMESPACE={namespace}"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            build_directory=str(folder),
        )
        return getattr(torch.ops, namespace)
    flags = kernels._compile_flags
    changes = {
        "default": lambda found: found,
        "after-inductor": lambda found: found,
        "c++17": lambda found: tuple("-std=c++17" if flag.startswith("-std=") else flag for flag in found),
        "c++20": lambda found: tuple("-std=c++20" if flag.startswith("-std=") else flag for flag in found),
        "no-openmp": lambda found: tuple(flag for flag in found if flag != "-fopenmp"),
        "O1": lambda found: tuple("-O1" if flag == "-O3" else flag for flag in found),
    }
    kernels._compile_flags = lambda capability: changes[variant](flags(capability))
    if not kernels.supported_here():
        raise RuntimeError(
            "the compiled kernels are off or unsupported here (TRANSFOXL_CPU_KERNEL=0, or not Linux on x86-64 with "
            "AVX2): nothing to probe"
        )
    operators = kernels.compiled_operators()
    if operators is None:
        raise RuntimeError(f"the {variant} build is not available here (the warning above says why)")
    return operators


def worker(variant: str, case: str) -> int:
    """Run in a process of its own: build (case "build") or call one refusal; print one JSON line."""
    import faulthandler

    faulthandler.enable()
    operators = _operators(variant)
    if case == "build":
        print(json.dumps({"built": True}), flush=True)
        return 0
    if variant == "after-inductor":  # the default build, called after torch.compile has loaded a library of its own
        compiled = torch.compile(lambda inputs: (inputs.sin() * 2).sum(), backend="inductor")
        compiled(torch.randn(64))
    name, arguments = _case_inputs()[case]
    try:
        (torch.ops.aten.mm if name is None else getattr(operators, name))(*arguments)
    except RuntimeError as error:
        print(json.dumps({"raised": str(error).splitlines()[0][:200]}), flush=True)
        return 0
    print(json.dumps({"raised": None}), flush=True)
    return 0


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # (a real-time signal, or one this platform does not name)
        return f"signal {number}"


def _run(variant: str, case: str, timeout: float) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", variant, case]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)
    except subprocess.TimeoutExpired:
        return {"outcome": "timed out"}
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode == 0 and lines:
        found = json.loads(lines[-1])
        if "built" in found:
            return {"outcome": "built"}
        return {"outcome": "raised" if found["raised"] else "no error", "message": found["raised"]}
    code = completed.returncode
    died = f"killed by {_signal_name(-code)}" if code < 0 else f"exit status {code}"
    if code == 134:
        died = "aborted (exit status 134)"
    return {"outcome": died, "stderr": completed.stderr.strip().splitlines()[-12:]}


def backtrace(variant: str, case: str) -> list[str] | None:
    """The crash of `variant`/`case` again under cuda-gdb or gdb (whichever is on PATH), its backtrace."""
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    if debugger is None:
        return None
    command = [debugger, "-q", "-batch", "-ex", "run", "-ex", "bt 30", "-ex", "x/8i $pc-16"]
    command += ["--args", sys.executable, str(Path(__file__).resolve()), "--worker", variant, case]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    except subprocess.TimeoutExpired:
        return ["(the debugger timed out)"]
    noise = ("[New Thread", "[Thread", "Detaching", "warning:", "[Inferior")
    return [line for line in completed.stdout.splitlines() if not line.startswith(noise)][-60:]


def markdown(results: dict) -> str:
    facts = results["facts"]
    lines = [
        "# Compiled kernels' refusals (`tools/kernel_error_probe.py`)",
        "",
        f"torch {facts['torch']}, {facts['compiler']}. Each cell: one refusal called in a fresh process.",
        "",
        "| variant | build | " + " | ".join(CASES) + " |",
        "|---|---|" + "---|" * len(CASES),
    ]
    for variant, entry in results["variants"].items():
        cells = [entry["cases"].get(case, {}).get("outcome", "-") for case in CASES]
        lines.append(f"| {variant} | {entry['build']['outcome']} | " + " | ".join(cells) + " |")
    if results.get("backtrace"):
        lines += ["", f"Backtrace of {results['backtrace']['of']}:", "", "```", *results["backtrace"]["lines"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for kernel_errors.json and kernel_errors.md (required)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--backtrace", action="store_true", help="run the first crash again under cuda-gdb or gdb")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for one process (a build included)")
    parser.add_argument("--worker", nargs=2, metavar=("VARIANT", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    variants = [name for name in args.variants.split(",") if name]
    if unknown := sorted(set(variants) - set(VARIANTS)):
        parser.error(f"--variants: unknown {', '.join(unknown)}; expected some of {', '.join(VARIANTS)}")
    if not variants:
        parser.error(f"--variants: none given; expected some of {', '.join(VARIANTS)}")
    if args.out is None:
        parser.error("--out is required")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    compiler = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()
    results: dict = {
        "facts": {"torch": torch.__version__, "compiler": compiler[0] if compiler else "no c++ on PATH"},
        "variants": {},
    }
    workers = max(1, min(len(variants) * len(CASES), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        builds = {variant: pool.submit(_run, variant, "build", args.timeout) for variant in variants}
        for variant in variants:
            results["variants"][variant] = {"build": builds[variant].result(), "cases": {}}
        calls = {
            (variant, case): pool.submit(_run, variant, case, args.timeout)
            for variant in variants
            if results["variants"][variant]["build"]["outcome"] == "built"
            for case in CASES
        }
        for (variant, case), call in calls.items():
            results["variants"][variant]["cases"][case] = call.result()
    # A case fails where the call did not raise: "no error" is a check that let bad input through.
    failed = [key for key, call in calls.items() if call.result()["outcome"] != "raised"]
    crashed = [key for key in failed if calls[key].result()["outcome"] != "no error"]
    unbuilt = [variant for variant, entry in results["variants"].items() if entry["build"]["outcome"] != "built"]
    if args.backtrace and crashed:
        results["backtrace"] = {"of": "/".join(crashed[0]), "lines": backtrace(*crashed[0]) or ["(no debugger)"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_errors.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "kernel_errors.md").write_text(markdown(results))
    print(markdown(results))
    for variant in unbuilt:
        print(f"{variant}: not built: " + " ".join(results["variants"][variant]["build"].get("stderr", [])[-1:]))
    for variant, case in failed:
        print(f"{variant}/{case}: {results['variants'][variant]['cases'][case]['outcome']} (expected: raised)")
    return 1 if failed or unbuilt else 0


if __name__ == "__main__":
    sys.exit(main())
