"""transformers 4.37.2, the reference the benchmarks and the fixture makers compare with: its virtualenv, its import.

Only the standard library at the top: the fixture makers import this module inside that virtualenv.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

VERSION = "4.37.2"  # the last release of transformers with TransfoXL (under models/deprecated)


def ensure_venv(venv: Path) -> Path:
    """The python of a virtualenv with transformers 4.37.2 and this torch version, created if missing (needs PyPI)."""
    import torch

    python = venv / "bin" / "python"
    if not python.exists():
        torch_version = torch.__version__.split("+")[0]
        print(f"creating {venv} (transformers {VERSION}, torch {torch_version}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"torch=={torch_version}"], check=True)
        subprocess.run([*pip, f"transformers=={VERSION}"], check=True)
    return python


def import_transformers(recorded: str, needed: str) -> ModuleType:
    """transformers 4.x holding `needed` (a TransfoXL class), for a script that records what v4's `recorded` does.

    Imported once the script's options are parsed, so that --help works anywhere; anywhere else, the script exits
    with how to run it.
    """
    needs = f"This script records what transformers v4's {recorded} does and needs transformers=={VERSION}"
    how = "Run it in a throwaway virtualenv, as its docstring shows (--help). Nothing was written."
    try:
        import transformers
    except ImportError as error:
        raise SystemExit(f"{needs}, and transformers cannot be imported here ({error}). {how}") from None
    if not hasattr(transformers, needed):
        version = transformers.__version__
        raise SystemExit(f"{needs}; this environment has transformers {version}, without TransfoXL. {how}")
    return transformers
