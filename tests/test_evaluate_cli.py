"""`transfoxl.cli.evaluate` (scripts/evaluate.py), run in-process on a tiny saved model: files written, numbers equal
to `evaluate_stream`, and every error naming the option at fault (the rows of docs/reliability-table.md for
evaluate.py, `@pytest.mark.reliability`, run on conftest.py's `model_dir`)."""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import datasets
import huggingface_hub.constants
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

import transfoxl  # noqa: F401  (registers the Auto classes)
from tests.utils import cli_error, expect_cli_error
from transfoxl import TxlForCausalLM
from transfoxl.cli import evaluate as evaluate_cli
from transfoxl.cli.options import library_progress_bars
from transfoxl.evaluation import evaluate_stream, segments_for_targets
from transfoxl.presets import config_from_preset
from transfoxl.runs import vocabulary_digest
from transfoxl.tokenization.tokenization_txl import train_char_level, train_word_level

WORDS = ["the", "a", "of", "to", "and", "in", "that", "it", "with", "was", "on", "is", "by", "his", "be", "or"]
TGT_LEN = 8  # the saved model's config.tgt_len and mem_len, so that the script's defaults can be checked
MEM_LEN = 8


def make_text(seed: int, lines: int) -> str:
    """Seeded lines of words, each ending with a newline (no blank line)."""
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + "\n" for _ in range(lines))


@dataclass
class Run:
    """A saved model folder (model + character tokenizer) and the text files of its three splits."""

    model_dir: Path
    files: dict[str, Path]
    texts: dict[str, str]
    cache_dir: Path

    def data_args(self, *splits: str) -> list[str]:
        argv = ["--cache-dir", str(self.cache_dir), "--no-progress"]
        for split in splits or ("train", "validation", "test"):
            argv += [f"--{split}-file", str(self.files[split])]
        return argv


pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py


@pytest.fixture(scope="module")
def evaluate() -> ModuleType:
    return evaluate_cli


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("evaluate")
    texts = {"train": make_text(0, 60), "validation": make_text(1, 12), "test": make_text(2, 12)}
    files = {}
    for split, text in texts.items():
        files[split] = root / f"{split}.txt"
        files[split].write_text(text, encoding="utf-8")
    tokenizer = train_char_level([texts["train"]])
    torch.manual_seed(0)
    model = TxlForCausalLM(config_from_preset("tiny", len(tokenizer), tgt_len=TGT_LEN, mem_len=MEM_LEN))
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return Run(model_dir, files, texts, root / "cache")


def copy_model_dir(run: Run, tmp_path: Path) -> Path:
    """A copy of the model folder that a test may change."""
    return Path(shutil.copytree(run.model_dir, tmp_path / "model"))


def token_stream(model_dir: Path, text: str) -> torch.Tensor:
    """`[N]`: the folder's tokenizer applied to the whole text at once (not line by line, as the script does)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])


def reference(model_dir: Path, text: str, **kwargs: int) -> tuple[torch.Tensor, dict[str, float]]:
    """The stream of `text` and `evaluate_stream(saved model, stream, **kwargs)` on it, as a dict."""
    stream = token_stream(model_dir, text)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return stream, evaluate_stream(model, stream, **kwargs).to_dict()


def test_every_memory_length_evaluated_and_written(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = [str(run.model_dir), "--mem-len", "0,4,32", "--tgt-len", "8", "--output", str(out), *run.data_args()]
    bars_enabled = datasets.is_progress_bar_enabled()
    assert evaluate.main(argv) == 0
    assert datasets.is_progress_bar_enabled() == bars_enabled  # --no-progress turned them off for the run only

    report = json.loads((out / "eval-test.json").read_text(encoding="utf-8"))
    assert [row["mem_len"] for row in report["rows"]] == [0, 4, 32]
    for row in report["rows"]:
        stream, expected = reference(run.model_dir, run.texts["test"], tgt_len=8, mem_len=row["mem_len"])
        # The script's data path (load_corpus line by line, tokenize_corpus adding the newlines) gives the same
        # stream as the tokenizer on the whole text, and the same numbers as calling the package directly.
        assert row["num_targets"] == stream.numel() - 1 == expected["num_targets"]
        assert row["loss"] == pytest.approx(expected["loss"], rel=1e-6)
        assert row["bits_per_token"] == pytest.approx(expected["bits_per_token"], rel=1e-6)
        assert row["seconds"] > 0 and row["tokens_per_second"] > 0
        assert (row["tgt_len"], row["clamp_len"], row["same_length"]) == (8, -1, False)  # the tiny preset's
    assert report["rows"][0]["loss"] != report["rows"][2]["loss"]  # the memory is used
    assert report["unit"] == "bpc" and report["tokenizer"]["kind"] == "character-level"
    assert report["data"]["split"] == "test" and report["data"]["source"]["origin"] == "the command line"
    assert report["settings"]["mem_lens"] == [0, 4, 32] and report["settings"]["batch_size"] == 1

    markdown = (out / "eval-test.md").read_text(encoding="utf-8")
    assert "| memory length | targets | loss (nats) | perplexity | bpc |" in markdown
    for row in report["rows"]:
        assert f"| {row['mem_len']} | {row['num_targets']:,} | {row['loss']:.4f} |" in markdown
    assert (out / "eval-test.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(path.name for path in out.iterdir()) == ["eval-test.json", "eval-test.md", "eval-test.png"]
    assert "| memory length | targets | loss (nats) | perplexity | bpc |" in capsys.readouterr().out


def test_defaults_from_the_config_and_train_args(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = copy_model_dir(run, tmp_path)
    # A training run on the train file alone, a quarter of it cut off as validation: evaluating "validation" must
    # read those very lines, with no data option given.
    train_args = {
        "train_file": [str(run.files["train"])],
        "validation_file": None,
        "test_file": None,
        "dataset_name": None,
        "dataset_config": None,
        "validation_fraction": 0.25,
        "cache_dir": str(run.cache_dir),
        "add_eos": True,
        "steps": 3,
    }
    (model_dir / "train_args.json").write_text(json.dumps(train_args), encoding="utf-8")
    assert evaluate.main([str(model_dir), "--split", "validation", "--no-progress"]) == 0

    report = json.loads((model_dir / "eval" / "eval-validation.json").read_text(encoding="utf-8"))
    lines = run.texts["train"].splitlines(keepends=True)
    validation_text = "".join(lines[len(lines) - int(len(lines) * 0.25) :])
    _, expected = reference(model_dir, validation_text, tgt_len=TGT_LEN, mem_len=MEM_LEN)
    assert report["settings"]["tgt_len"] == TGT_LEN and report["settings"]["mem_lens"] == [MEM_LEN]
    assert report["data"]["source"]["origin"] == str(model_dir / "train_args.json")
    (row,) = report["rows"]
    assert row["num_targets"] == expected["num_targets"]
    assert row["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert (model_dir / "eval" / "eval-validation.png").is_file()


def test_the_batch_size_defaults_to_the_columns_the_run_evaluated_with(
    evaluate: ModuleType, run: Run, tmp_path: Path
) -> None:
    """A run folder's own figures come back without options: its final evaluation's columns (metrics.json, which a
    resumed run's setting reaches), else train_args.json's --eval-batch-size; 1 for a plain model folder."""
    model_dir = copy_model_dir(run, tmp_path)
    argv = [str(model_dir), "--split", "test", *run.data_args("train", "test")]
    train_args = {"eval_batch_size": 3}
    (model_dir / "train_args.json").write_text(json.dumps(train_args), encoding="utf-8")
    for metrics, columns in ((None, 3), ({"evaluation": {"test": {"8": {"batch_size": 2}}}}, 2)):
        if metrics is not None:
            (model_dir / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
        assert evaluate.main(argv) == 0
        # (text given on the command line: a report named after it, beside the run's own eval-test)
        report = json.loads((model_dir / "eval" / "eval-test-test.json").read_text(encoding="utf-8"))
        assert report["settings"]["batch_size"] == columns
        stream, expected = reference(
            model_dir, run.texts["test"], tgt_len=TGT_LEN, mem_len=MEM_LEN, batch_size=columns
        )
        assert report["rows"][0]["num_targets"] == expected["num_targets"] < stream.numel() - 1
    assert (
        evaluate.main(
            [
                str(run.model_dir),
                "--split",
                "test",
                *run.data_args("train", "test"),
                "--output",
                str(tmp_path / "plain"),
            ]
        )
        == 0
    )
    assert (
        json.loads((tmp_path / "plain" / "eval-test.json").read_text(encoding="utf-8"))["settings"]["batch_size"] == 1
    )


def test_batch_size_max_tokens_and_eval_overrides(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(run.model_dir), "--split", "validation", "--batch-size", "2", "--max-tokens", "101", "--mem-len", "4"]
    argv += ["--clamp-len", "3", "--same-length", "--output", str(tmp_path), *run.data_args()]
    assert evaluate.main(argv) == 0
    assert "replacing" not in capsys.readouterr().out
    assert evaluate.main(argv) == 0  # again: the report it replaces is named (publish.py uploads the folder)
    assert "replacing the earlier report (101 tokens)" in capsys.readouterr().out
    (row,) = json.loads((tmp_path / "eval-validation.json").read_text(encoding="utf-8"))["rows"]
    stream = token_stream(run.model_dir, run.texts["validation"])
    model = AutoModelForCausalLM.from_pretrained(run.model_dir)
    expected = evaluate_stream(
        model, stream[:101], tgt_len=TGT_LEN, mem_len=4, batch_size=2, clamp_len=3, same_length=True
    )
    assert row["num_targets"] == 2 * (50 - 1) == expected.num_targets  # 2 columns of 50, the 101st token dropped
    assert (row["clamp_len"], row["same_length"]) == (3, True)
    assert row["loss"] == pytest.approx(expected.loss, rel=1e-6)
    plain = evaluate_stream(model, stream[:101], tgt_len=TGT_LEN, mem_len=4, batch_size=2)
    assert row["loss"] != pytest.approx(plain.loss, rel=1e-6)  # the overrides were applied
    assert model.config.clamp_len == -1 and model.config.same_length is False


def test_max_eval_tokens_means_what_train_py_s_option_does(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-eval-tokens N scores about N targets as train.py's final evaluation does (whole segments of every
    column, the same targets at every memory length; 0: the whole split); it was an alias of --max-tokens (the first
    N tokens of the stream), and 0 was refused."""
    argv = [str(run.model_dir), "--batch-size", "2", "--mem-len", "0,4", "--output", str(tmp_path), *run.data_args()]
    assert evaluate.main([*argv, "--max-eval-tokens", "40"]) == 0
    assert "at most about 40 targets" in capsys.readouterr().out
    report = json.loads((tmp_path / "eval-test.json").read_text(encoding="utf-8"))
    segments = segments_for_targets(40, batch_size=2, tgt_len=TGT_LEN)  # what train.py's evaluate_final reads
    assert segments == 2
    stream = token_stream(run.model_dir, run.texts["test"])
    model = AutoModelForCausalLM.from_pretrained(run.model_dir)
    for row in report["rows"]:
        expected = evaluate_stream(
            model, stream, tgt_len=TGT_LEN, mem_len=row["mem_len"], batch_size=2, max_segments=segments
        )
        assert row["num_targets"] == 40 // (2 * TGT_LEN) * (2 * TGT_LEN) == expected.num_targets
        assert row["loss"] == pytest.approx(expected.loss, rel=1e-6)
    assert report["data"]["max_eval_tokens"] == 40 and report["data"]["num_tokens"] == stream.numel()
    assert evaluate.main([*argv, "--max-eval-tokens", "0"]) == 0  # the whole split
    whole = json.loads((tmp_path / "eval-test.json").read_text(encoding="utf-8"))
    assert whole["rows"][0]["num_targets"] == (stream.numel() // 2 - 1) * 2


def test_tokenizer_from_another_folder(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = copy_model_dir(run, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_dir / name).unlink()
    argv = [str(model_dir), "--mem-len", "0", "--output", str(tmp_path / "out"), *run.data_args()]
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(argv)
    assert exit_info.value.code == 2 and "--tokenizer" in capsys.readouterr().err
    assert evaluate.main([*argv, "--tokenizer", str(run.model_dir)]) == 0
    assert (tmp_path / "out" / "eval-test.json").is_file()


def test_a_tokenizer_of_other_ids_than_the_models_is_warned_and_recorded(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --tokenizer whose ids are not those of MODEL_DIR's own tokenizer (it fits the embedding, so nothing failed)
    was evaluated without a word; the report now records the tokenizer's vocabulary digest and the mismatch."""
    other = tmp_path / "other-tokenizer"
    train_char_level(["zyxwvutsrqponm\n"]).save_pretrained(other)
    argv = [str(run.model_dir), "--mem-len", "0", "--output", str(tmp_path / "out"), *run.data_args()]
    assert evaluate.main([*argv, "--tokenizer", str(other)]) == 0
    printed = capsys.readouterr().out
    assert f"warning: --tokenizer {other} may not be the tokenizer the model was trained with" in printed
    report = json.loads((tmp_path / "out" / "eval-test.json").read_text(encoding="utf-8"))
    assert "other ids than MODEL_DIR's own tokenizer" in report["tokenizer"]["mismatch"]
    assert "Warning: the tokenizer may not be" in (tmp_path / "out" / "eval-test.md").read_text(encoding="utf-8")
    own_digest = vocabulary_digest(AutoTokenizer.from_pretrained(run.model_dir).get_vocab())
    assert report["tokenizer"]["vocabulary_sha256"] != own_digest

    copy = Path(shutil.copytree(run.model_dir, tmp_path / "copy"))  # the model's own tokenizer, from elsewhere
    assert evaluate.main([*argv, "--tokenizer", str(copy)]) == 0
    assert "warning" not in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "eval-test.json").read_text(encoding="utf-8"))
    assert report["tokenizer"]["mismatch"] is None and report["tokenizer"]["vocabulary_sha256"] == own_digest


def test_a_mistyped_local_tokenizer_or_model_folder_is_not_looked_up_on_the_hub(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """`runs/mrun` beside `runs/myrun` looks like a Hub id: it was tried on the Hub (half a minute of retries, then
    no "no such folder"); now refused at once, with the close names. (Offline here, so the old code fails fast.)"""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    shutil.copytree(run.model_dir, tmp_path / "runs" / "myrun")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        evaluate.main(["runs/myrun", "--tokenizer", "runs/mrun", *run.data_args()])
    error = capsys.readouterr().err
    assert "--tokenizer runs/mrun: no such folder" in error and "did you mean runs/myrun?" in error
    with pytest.raises(SystemExit):
        evaluate.main(["runs/mrun", *run.data_args()])
    error = capsys.readouterr().err
    assert "MODEL_DIR runs/mrun is not a folder (did you mean runs/myrun?)" in error


def test_word_level_tokenizer_reports_bits_per_token(evaluate: ModuleType, run: Run, tmp_path: Path) -> None:
    tokenizer = train_word_level(run.texts["train"].splitlines())
    torch.manual_seed(0)
    model = TxlForCausalLM(config_from_preset("tiny", len(tokenizer), tgt_len=4, mem_len=4))
    model_dir = tmp_path / "words"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    assert evaluate.main([str(model_dir), "--output", str(tmp_path / "out"), *run.data_args()]) == 0
    report = json.loads((tmp_path / "out" / "eval-test.json").read_text(encoding="utf-8"))
    assert report["unit"] == "bits/token" and report["tokenizer"]["kind"] == "word/subword-level"
    assert "| bits/token |" in (tmp_path / "out" / "eval-test.md").read_text(encoding="utf-8")
    # Every line ends with <eos>: one token per word plus one per line, all but the first scored.
    n_tokens = sum(len(line.split()) + 1 for line in run.texts["test"].splitlines())
    assert report["rows"][0]["num_targets"] == n_tokens - 1


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--mem-len", "0,-4"], ["--mem-len", "-4"]),
        (["--mem-len", "8,x"], ["--mem-len", "'x'"]),
        (["--mem-len", "2.5"], ["--mem-len", "'2.5'"]),
        (["--tgt-len", "0"], ["--tgt-len", "got 0"]),
        (["--batch-size", "0"], ["--batch-size", "got 0"]),
        (["--max-tokens", "1"], ["--max-tokens", "got 1"]),
        (["--tgt-len", "100000"], ["--split test", "too short"]),
        (["--max-tokens", "20", "--batch-size", "4"], ["--split test", "--max-tokens", "too short"]),
        (["--dtype", "bfloat16", "--device", "cpu"], ["--dtype bfloat16", "float32"]),
        (["--device", "nonsense"], ["--device 'nonsense'"]),
        (["--dataset-config", "wikitext-2-raw-v1"], ["--dataset-config", "--dataset-name"]),
        (["--dataset-name", "Salesforce/wikitext"], ["--dataset-name", "exclude"]),
        (["--validation-fraction", "1.5"], ["--validation-fraction", "1.5"]),
        (["--split", "dev"], ["--split", "'dev'"]),
    ],
)
def test_option_errors_name_the_option(
    evaluate: ModuleType, run: Run, capsys: pytest.CaptureFixture[str], options: list[str], expected: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(run.model_dir), *run.data_args(), *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for fragment in expected:
        assert fragment in err, (fragment, err)


def test_text_mostly_outside_the_vocabulary_is_evaluated_with_a_warning(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("αβγδ εζηθ\n" * 40, encoding="utf-8")  # letters the character tokenizer never saw
    argv = [str(run.model_dir), "--test-file", str(foreign), "--output", str(tmp_path / "eval"), "--no-progress"]
    assert evaluate.main([*argv, "--cache-dir", str(run.cache_dir)]) == 0
    assert re.search(r"warning: \d+\.\d% of these tokens are <unk>", capsys.readouterr().out)
    report = json.loads((tmp_path / "eval" / "eval-test.json").read_text(encoding="utf-8"))
    assert report["data"]["unknown_share"] > 0.5 and report["tokenizer"]["unk_token"] == "<unk>"
    assert evaluate.main([str(run.model_dir), "--output", str(tmp_path / "own"), *run.data_args()]) == 0
    assert "warning" not in capsys.readouterr().out  # the model's own kind of text
    assert json.loads((tmp_path / "own" / "eval-test.json").read_text(encoding="utf-8"))["data"]["unknown_share"] == 0


def test_data_errors(evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def error(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            evaluate.main([str(run.model_dir), "--cache-dir", str(run.cache_dir), "--no-progress", *argv])
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    # A split the corpus does not have: train and validation files, no test file.
    message = error(["--train-file", str(run.files["train"]), "--validation-file", str(run.files["validation"])])
    assert "--split test" in message and "no 'test' split" in message
    # Only a test file: enough to evaluate "test" (below), not "validation".
    message = error(["--test-file", str(run.files["test"]), "--split", "validation"])
    assert "--split validation" in message and "--validation-file" in message
    assert "--test-file" in error(["--test-file", str(tmp_path / "missing.txt")])
    # An empty or blank test file is named as such, not as the "train" split it stands in for.
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    message = error(["--test-file", str(tmp_path / "empty.txt")])
    assert f"--test-file {tmp_path / 'empty.txt'}: the file is empty (0 bytes)" in message and "'train'" not in message
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    message = error(["--test-file", str(tmp_path / "blank.txt")])
    assert "split 'test' holds only blank lines" in message and "split 'train'" not in message
    assert evaluate.main([str(run.model_dir), "--test-file", str(run.files["test"]), "--output", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "eval-test.json").read_text(encoding="utf-8"))["rows"]
    assert row["num_targets"] == len(run.texts["test"]) - 1  # the whole test file, one token per character


def test_model_folder_errors(
    evaluate: ModuleType, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def error(model_dir: Path) -> str:
        with pytest.raises(SystemExit) as exit_info:
            evaluate.main([str(model_dir), *run.data_args()])
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    assert "MODEL_DIR" in error(tmp_path / "missing") and "not a folder" in error(tmp_path / "missing")
    model_dir = copy_model_dir(run, tmp_path)
    (model_dir / "model.safetensors").unlink()
    assert "MODEL_DIR" in (message := error(model_dir)) and "no weights" in message
    (model_dir / "config.json").unlink()
    assert "MODEL_DIR" in (message := error(model_dir)) and "config.json" in message

    # A model whose vocabulary is smaller than the tokenizer's: ids past its embedding.
    small = tmp_path / "small"
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    TxlForCausalLM(config_from_preset("tiny", len(tokenizer) - 1)).save_pretrained(small)
    tokenizer.save_pretrained(small)
    message = error(small)
    assert "vocabulary mismatch" in message and f"{len(tokenizer)} tokens" in message and "--tokenizer" in message


# ---------------------------------------------------------------------------------------------------------------------
# The reliability rows of evaluate.py: bad options, files and model folders


def evaluate_argv(model_dir: Path, *options: str) -> list[str]:
    root = model_dir.parent
    return [
        str(model_dir),
        "--cache-dir",
        str(root / "cache"),
        "--output",
        str(root / "out"),
        "--no-progress",
        *options,
    ]


EVALUATE_CASES = [
    pytest.param(
        ["--tgt-len", "0"],
        ["--tgt-len must be >= 1, got 0"],
        id="tgt-len",
        marks=pytest.mark.reliability("evaluate.py", "--tgt-len 0", "exit 2 naming --tgt-len"),
    ),
    pytest.param(
        ["--batch-size", "-1"],
        ["--batch-size must be >= 1, got -1"],
        id="batch-size",
        marks=pytest.mark.reliability("evaluate.py", "--batch-size -1", "exit 2 naming --batch-size"),
    ),
    pytest.param(
        ["--max-tokens", "-5"],
        ["--max-tokens must be >= 2", "got -5"],
        id="max-tokens",
        marks=pytest.mark.reliability("evaluate.py", "--max-tokens -5", "exit 2 naming --max-tokens"),
    ),
    pytest.param(
        ["--mem-len", "0,-4"],
        ["memory lengths must be >= 0", "got -4"],
        id="mem-len",
        marks=pytest.mark.reliability("evaluate.py", "--mem-len 0,-4", "exit 2 naming --mem-len"),
    ),
    pytest.param(
        ["--test-file", "{root}/missing.txt"],
        ["--test-file", "missing.txt: no such file"],
        id="missing",
        marks=pytest.mark.reliability(
            "evaluate.py", "--test-file that does not exist", "exit 2 naming the option and the file"
        ),
    ),
    pytest.param(
        ["--test-file", "{root}/empty.txt"],
        ["--test-file", "empty.txt", "the file is empty (0 bytes)"],
        id="empty",
        marks=pytest.mark.reliability("evaluate.py", "--test-file of 0 bytes", "exit 2: the split is empty"),
    ),
    pytest.param(
        ["--test-file", "{root}/short.txt"],
        ["--split test", "The stream of 4 tokens is too short"],
        id="too-short",
        marks=pytest.mark.reliability(
            "evaluate.py", "--test-file of 4 tokens for segments of 8", "exit 2: too short, with the numbers"
        ),
    ),
    pytest.param(
        ["--output", "{root}/short.txt/eval"],
        ["--output", "short.txt is a file"],
        id="output-inside-a-file",
        marks=pytest.mark.reliability(
            "evaluate.py", "--output inside a file", "exit 2 before evaluating (a NotADirectoryError trace after it)"
        ),
    ),
    pytest.param(
        ["--test-file", "{root}/binary.txt"],
        ["binary.txt", "UnicodeDecodeError", "is it UTF-8 text?"],
        id="binary",
        marks=pytest.mark.reliability(
            "evaluate.py",
            "--test-file holding binary bytes",
            "exit 2 naming the file and the decoding error (DatasetGenerationError trace before)",
        ),
    ),
]


@pytest.mark.parametrize(("options", "fragments"), EVALUATE_CASES)
def test_evaluate_script_errors(scripts, model_dir, capsys, record_property, options, fragments) -> None:
    options = [option.format(root=model_dir.parent) for option in options]
    expect_cli_error(record_property, scripts["evaluate"].main, evaluate_argv(model_dir, *options), capsys, *fragments)


@pytest.mark.reliability(
    "evaluate.py", "MODEL_DIR that does not exist / has no weights", "exit 2 naming MODEL_DIR and what is missing"
)
def test_evaluate_script_model_folder_errors(scripts, model_dir, tmp_path, capsys, record_property) -> None:
    main = scripts["evaluate"].main
    missing = cli_error(main, evaluate_argv(tmp_path / "nowhere"), capsys)
    assert "MODEL_DIR" in missing and "is not a folder" in missing
    no_weights = Path(shutil.copytree(model_dir, tmp_path / "model"))
    (no_weights / "model.safetensors").unlink()
    message = cli_error(main, evaluate_argv(no_weights), capsys)
    assert "has no weights" in message
    record_property("outcome", f"exit 2: {missing} / {message}")


def test_library_progress_bars_switch_off_and_never_force_on() -> None:
    """--no-progress turns datasets' and transformers' bars off for the block; without it they stay as the environment
    set them (HF_*_DISABLE_PROGRESS_BARS), not forced on (review finding)."""
    libraries = (datasets, transformers_logging)
    states = [library.is_progress_bar_enabled() for library in libraries]
    try:
        for library in libraries:
            library.disable_progress_bar()
        with library_progress_bars(True):
            assert not any(library.is_progress_bar_enabled() for library in libraries)
        for library in libraries:
            library.enable_progress_bar()
        with library_progress_bars(False):
            assert not any(library.is_progress_bar_enabled() for library in libraries)
        assert all(library.is_progress_bar_enabled() for library in libraries)
    finally:
        for library, on in zip(libraries, states, strict=True):
            if on:
                library.enable_progress_bar()
            else:
                library.disable_progress_bar()
