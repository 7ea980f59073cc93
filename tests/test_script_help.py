"""Every script in `scripts/` answers `--help` in a fresh interpreter: exit code 0 and a usage text, whatever the
script needs to run (the fixture scripts need transformers 4.37.2 and import it only after parsing their options)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


def test_every_script_answers_help(tmp_path: Path) -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS  # the glob found the scripts

    def run(script: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), "--help"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=tmp_path,  # from another folder, as a user may run them
            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
            timeout=300,
            check=False,
        )

    # Most of each run is importing torch and transformers (seconds): in parallel, one per core.
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        results = dict(zip(SCRIPTS, pool.map(run, SCRIPTS)))
    failed = {
        script.name: f"exit code {result.returncode}: {result.stderr[-1500:]}"
        for script, result in results.items()
        if result.returncode != 0 or "usage:" not in result.stdout
    }
    assert not failed, failed
    assert not list(tmp_path.iterdir())  # --help writes nothing
