"""What the benchmarks record about the machine and the process (memory in use, the CPU's name); their plots' bytes.

Only the standard library: bench_speed.py's worker imports this inside the transformers 4.37.2 virtualenv.
"""

from __future__ import annotations

import datetime
import io
import os
import platform
import resource
import sys
from pathlib import Path


def peak_rss_mb() -> float:
    """Peak resident set size of this process, MB: VmHWM on Linux, else ru_maxrss (KB on Linux, bytes on macOS).

    Not ru_maxrss on Linux: a process started by subprocess keeps the parent's peak there (the kernel carries it
    across exec), so a worker started by a large parent would report the parent's peak, not its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**10  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def reset_peak_rss() -> bool:
    """Lower this process's peak (VmHWM) to its current RSS, so that a measurement's own buffers, once freed, do not
    count in the peak read later; False where the system cannot (not Linux, or /proc/self/clear_refs refused)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # reset the peak RSS (Linux 4.0+, man 5 proc)
    except OSError:
        return False
    return True


def current_rss_mb() -> float:
    """Resident set size now, MB (Linux; elsewhere the peak so far)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def cpu_name() -> str:
    """The CPU's model name (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def png_bytes(figure) -> bytes:
    """A matplotlib figure as PNG bytes (written atomically by the caller)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def machine_facts() -> dict[str, object]:
    """The CPU, its cores, the torch version and threads, the Python version, and which CPU inference attention
    transfoxl takes (its compiled kernel, built here if need be, or the torch path): what every benchmark records."""
    import torch

    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "attention_kernel": attention_kernel(),
    }


def attention_kernel() -> str:
    """'compiled' where transfoxl's C++ attention kernel (transfoxl/cpp_kernels_txl.py) runs here, else 'torch'."""
    from transfoxl.cpp_kernels_txl import compiled_operators

    return "compiled" if compiled_operators() is not None else "torch"


def written_utc() -> str:
    """Now, as a part's results record when they were measured (a clone's modification times do not keep it;
    tools/benchmark.py reads this)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
