"""Tiny seeded configs and models for the tests (CPU, float32, seconds), and the helpers of the reliability rows.

Every test marked `@pytest.mark.reliability(area, case, expected)` is a row of docs/reliability-table.md (see
tests/conftest.py); the rows live with the tests of the module they exercise, and the helpers below are shared by
them: `case` / `expect_error` / `observe` for bad arguments, `cli_error` / `expect_cli_error` for the command lines,
`reliability` / `refused` / `named` and the malicious-pickle writers for damaged or hostile files.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import transfoxl  # noqa: F401  (registers the Auto classes)
from tools.configs import model_config
from transfoxl import TxlConfig, TxlForCausalLM, TxlMemory

VOCAB = 97  # tiny_config's vocabulary
LEGACY = Path(__file__).parent / "fixtures" / "legacy"
TOKENIZER_FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"


def tiny_config(**overrides) -> TxlConfig:
    """A 2-layer model with an adaptive embedding/softmax of three clusters (tools/configs.py), mem_len 8; dropout
    off unless overridden."""
    return TxlConfig(**model_config("tiny", **{"mem_len": 8, **overrides}))


def tiny_lm(seed: int = 0, **overrides) -> TxlForCausalLM:
    """A seeded tiny LM in eval mode, with every parameter perturbed so that no bias or cluster weight is zero."""
    torch.manual_seed(seed)
    model = TxlForCausalLM(tiny_config(**overrides))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


class LogitsOnly(torch.nn.Module):
    """`model`'s logits for `ids` alone, without a memory: a module torch.jit.trace takes (one tensor in and out)."""

    def __init__(self, model: TxlForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, use_cache=False).logits


def reset_accelerate() -> None:
    """Forget accelerate's process-wide singletons, so the next Accelerator is built as in a new process."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def ids(batch: int = 2, length: int = 5, seed: int = 0, low: int = 0) -> torch.Tensor:
    """Seeded random token ids `[batch, length]` in `[low, VOCAB)`."""
    return torch.randint(low, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def memory_of(model: TxlForCausalLM, batch: int = 2, length: int = 5) -> TxlMemory:
    with torch.no_grad():
        return model(ids(batch, length), use_cache=True).past_key_values


def edit_config(folder: Path, **values) -> None:
    """Change (or add) fields of `folder`/config.json."""
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


# ---------------------------------------------------------------------------------------------------------------------
# Bad arguments: one clear error naming what was wrong and what was expected

ID_ERROR = "ValueError naming the id and the vocabulary size"


def expect_error(record_property: Callable, error: type[BaseException], match: str, call: Callable[[], object]) -> str:
    """Run `call`, require `error` matching `match`, and record its message as the row's outcome."""
    with pytest.raises(error, match=match) as exc_info:
        call()
    message = f"{exc_info.type.__name__}: {exc_info.value}"
    record_property("outcome", message)
    return message


def observe(call: Callable[[], object]) -> str:
    """What `call` does, in words: for the rows of cases not handled yet (xfail)."""
    try:
        result = call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return f"no error ({type(result).__name__} {result!r:.60})"


def case(area: str, name: str, expected: str, error: type[BaseException], match: str, call: Callable, id: str):
    """A parametrized row: `call` is run with the test's fixtures (see the tests that use it)."""
    return pytest.param(error, match, call, id=id, marks=pytest.mark.reliability(area, name, expected))


def cli_error(main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 2):
    """The last line of stderr of a `main(argv)` that fails with exit status `code` (argparse's is 2)."""
    with pytest.raises(SystemExit) as exit_info:
        result = main(argv)
        raise SystemExit(result)  # a main() that returns its status instead of exiting
    assert exit_info.value.code == code, capsys.readouterr()
    err = capsys.readouterr().err.strip()
    return err.splitlines()[-1] if err else ""


def expect_cli_error(record_property, main, argv, capsys, *fragments: str, code: int = 2) -> None:
    message = cli_error(main, argv, capsys, code)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    record_property("outcome", f"exit {code}: {message}")


# ---------------------------------------------------------------------------------------------------------------------
# Damaged or hostile files: refused with an error naming the file and the problem, running nothing

SYSTEM = r"'(posix|nt)\.system'"  # what os.system is pickled as


def reliability(case: str, expected: str) -> pytest.MarkDecorator:
    """A row of the area "files"."""
    return pytest.mark.reliability("files", case, expected)


def refused(record_property, exception: type[BaseException], match: str, call: Callable[[], object]) -> BaseException:
    """Run `call`, which must raise `exception` with a message matching `match`; record the message."""
    with pytest.raises(exception, match=match) as exc_info:
        call()
    record_property("outcome", str(exc_info.value))
    return exc_info.value


def named(path: Path) -> str:
    return re.escape(str(path))


class RunsCommand:
    """Unpickling this with `pickle.load` (or torch.load(weights_only=False)) runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def legacy_state() -> dict[str, torch.Tensor]:
    return load_file(LEGACY / "adaptive_div2" / "model.safetensors")


def write_bin(folder: Path, kind: str, sentinel: Path) -> Path:
    """A v4 folder (config.json) with a malicious pytorch_model.bin of `kind`."""
    folder.mkdir(exist_ok=True)
    shutil.copy(LEGACY / "adaptive_div2" / "config.json", folder / "config.json")
    path = folder / "pytorch_model.bin"
    payload = RunsCommand(f"touch {sentinel}")
    if kind == "zip":  # torch.save's format since torch 1.6: a zip holding data.pkl
        torch.save({**legacy_state(), "extra": payload}, path)
    elif kind == "legacy_torch":  # torch.save's format before 1.6: pickles one after the other
        torch.save({**legacy_state(), "extra": payload}, path, _use_new_zipfile_serialization=False)
    elif kind == "raw_pickle":  # a bare pickle, newest protocol
        path.write_bytes(pickle.dumps(payload))
    else:  # a bare protocol-2 pickle of a dict holding the payload
        path.write_bytes(pickle.dumps({"weight": payload}, protocol=2))
    return path


def v4_tokenizer_folder(folder: Path, vocab_name: str, sentinel: Path) -> Path:
    """A v4 folder (config.json of model_type transfo-xl) whose vocabulary carries an os.system payload."""
    folder.mkdir(exist_ok=True)
    shutil.copy(TOKENIZER_FIXTURES / "v4_vocab_only" / "config.json", folder / "config.json")
    path = folder / vocab_name
    payload = {"idx2sym": RunsCommand(f"touch {sentinel}"), "lower_case": False}
    if vocab_name == "vocab.pkl":
        path.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, path)
    return path


def run_fresh_python(code: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `code` with `args` in a fresh interpreter (stdin closed); it must succeed (its stderr is shown if not)."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result
