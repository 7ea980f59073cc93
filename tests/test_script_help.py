"""Every command-line file of `scripts/` (the user CLIs) and `tools/` (the developer tools) answers `--help` in a
fresh interpreter: exit code 0 and a usage text, whatever the file needs to run (the fixture makers need transformers
4.37.2 and import it only after parsing their options)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A command-line file has a `__main__` block; the tools' shared modules (configs.py, v4.py) have none.
SCRIPTS = sorted(
    path
    for folder in ("scripts", "tools")
    for path in (ROOT / folder).glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text()
)


def test_every_script_answers_help(tmp_path: Path) -> None:
    # the globs found the user CLIs and the developer tools
    assert {path.parent.name for path in SCRIPTS} == {"scripts", "tools"} and len(SCRIPTS) >= 10, SCRIPTS

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


def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    """`--out ""` (an unset shell variable) wrote into the working folder; every path option now refuses it."""
    from transfoxl.cli import convert, convert_vocab, evaluate, publish, train, train_tokenizer

    monkeypatch.chdir(tmp_path)
    cases = [
        (train_tokenizer.main, ["--kind", "char", "--text-file", "x.txt", "--out", ""]),
        (convert_vocab.main, ["v4-folder", ""]),
        (convert.main, ["v4-folder", ""]),
        (evaluate.main, ["run", "--output", ""]),
        (publish.main, ["", "--repo-id", "me/x", "--dry-run"]),
        (train.main, ["--preset", "tiny", "--output-dir", ""]),
        (train.main, ["--preset", "tiny", "--cache-dir", ""]),
        (train.main, ["--preset", "tiny", "--tokenizer", ""]),
        (train.main, ["--preset", "tiny", "--config", ""]),
        (evaluate.main, ["run", "--tokenizer", ""]),
    ]
    for main, argv in cases:
        with pytest.raises(SystemExit) as raised:
            main(argv)
        assert raised.value.code == 2, main
        assert "an empty path: give a file or folder name" in capsys.readouterr().err, main
    assert list(tmp_path.iterdir()) == []
