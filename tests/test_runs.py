"""The run folder (`transfoxl.runs.RunFolder`): what train writes and evaluate and publish read back, with the rules
of what counts as complete; no training here (the runs of tests/test_training.py write real folders)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from transfoxl.runs import (
    CHECKPOINT_NAME,
    DEFAULT_VALIDATION_FRACTION,
    RunFolder,
    RunFolderError,
    checkpoint_name,
    complete_checkpoints,
    read_json_object,
    vocabulary_digest,
)


def make_checkpoint(root: Path, step: int, *, complete: bool = True) -> Path:
    folder = root / checkpoint_name(step)
    folder.mkdir(parents=True)
    if complete:
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}), encoding="utf-8")
    return folder


def test_a_folder_not_yet_made_reads_as_an_empty_run(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "new")
    assert not run.exists() and run.is_empty()
    assert run.train_args is None and run.metrics is None and run.config is None
    assert run.checkpoints() == [] and run.latest_checkpoint() is None
    assert not run.has_model() and not run.has_tokenizer() and not run.is_finished()
    assert run.eval_files() == [] and run.text_files() == {}
    assert run.model_path == tmp_path / "new" and repr(run) == f"RunFolder({str(tmp_path / 'new')!r})"


def test_written_files_read_back(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    run.write_train_args({"steps": 20, "train_file": ["/data/a.txt", "/data/b.txt"], "test_file": "/data/t.txt"})
    run.write_metrics({"summary": {"unit": "bpc", "validation": float("nan")}})
    assert run.train_args["steps"] == 20 and run.has_train_args()
    assert run.metrics == {"summary": {"unit": "bpc", "validation": None}}  # NaN written as null
    assert run.is_finished() and not run.is_empty()
    assert run.text_files() == {"train": ["/data/a.txt", "/data/b.txt"], "test": ["/data/t.txt"]}


def test_a_model_needs_its_config_and_weights_a_tokenizer_both_files(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert run.has_config() and not run.has_model()
    (tmp_path / "model.safetensors.index.json").write_text("{}", encoding="utf-8")
    assert run.weight_files() == ["model.safetensors.index.json"] and run.has_model()
    (tmp_path / "tokenizer.json").write_text("{}", encoding="utf-8")
    assert not run.has_tokenizer()  # a tokenizer.json without its settings (a run killed between the two renames)
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    assert run.has_tokenizer()


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "is not readable JSON"), ("[1, 2]", "must hold a JSON object, got list"), ("", "not readable")],
)
def test_a_file_that_is_not_a_json_object_is_named(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "train_args.json").write_text(content, encoding="utf-8")
    with pytest.raises(RunFolderError, match=message) as raised:
        _ = RunFolder(tmp_path).train_args
    assert str(tmp_path / "train_args.json") in str(raised.value)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(RunFolderError):
        read_json_object(tmp_path / "train_args.json")


def test_only_complete_checkpoints_count_oldest_first(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    root = run.checkpoints_dir
    make_checkpoint(root, 12)
    make_checkpoint(root, 4)
    make_checkpoint(root, 16, complete=False)  # its trainer_state.json (written last) is missing
    (root / ".staging-step-00000020").mkdir()
    (root / "step-8").mkdir()  # not the name the training writes
    assert [path.name for path in run.checkpoints()] == ["step-00000004", "step-00000012"]
    assert run.latest_checkpoint() == root / "step-00000012"
    assert complete_checkpoints(root) == run.checkpoints()
    assert run.trainer_state(run.latest_checkpoint()) == {"step": 12}
    assert checkpoint_name(3) == "step-00000003" and CHECKPOINT_NAME.match(checkpoint_name(10**7))


def test_remove_leftovers_deletes_only_what_a_killed_writer_leaves(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    kept = [make_checkpoint(run.checkpoints_dir, 2), tmp_path / "model.safetensors", tmp_path / ".gitignore"]
    for path in kept[1:]:
        path.write_text("x", encoding="utf-8")
    leftovers = [tmp_path / ".staging-abc", run.checkpoints_dir / ".staging-step-00000004", tmp_path / ".trash-x"]
    for path in leftovers:
        path.mkdir()
        (path / "model.safetensors").write_text("half", encoding="utf-8")
    temporary = tmp_path / ".model.safetensors.x1y2.tmp"
    temporary.write_text("partial", encoding="utf-8")
    assert not run.is_empty()
    run.remove_leftovers()
    assert all(path.exists() for path in kept)
    assert not any(path.exists() for path in [*leftovers, temporary])


def test_eval_files_are_plain_visible_files_of_the_given_suffixes(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    run.eval_dir.mkdir()
    for name in ("eval-test.json", "eval-test.md", "eval-test.png", "notes.txt", ".eval-test.json.x.tmp"):
        (run.eval_dir / name).write_text("{}", encoding="utf-8")
    (run.eval_dir / "sub.json").mkdir()
    outside = tmp_path / "secret.json"
    outside.write_text("{}", encoding="utf-8")
    os.symlink(outside, run.eval_dir / "link.json")
    names = [path.name for path in run.eval_files()]
    assert names == ["eval-test.json", "eval-test.md", "eval-test.png"]
    assert [path.name for path in run.eval_files((".json",))] == ["eval-test.json"]


def test_the_data_source_is_the_given_one_else_the_runs_else_the_built_in_corpus(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run")
    default = run.data_source()  # no train_args.json
    assert (default.text_files, default.dataset_name, default.origin) == (None, None, "default")
    assert default.validation_fraction == DEFAULT_VALIDATION_FRACTION and default.add_eos
    train = tmp_path / "train.txt"
    train.write_text("a b\n", encoding="utf-8")
    run.path.mkdir()
    run.write_train_args({"train_file": [str(train)], "validation_fraction": 0.2, "add_eos": False})
    own = run.data_source(cache_dir="cache")  # (not a source: it adjusts the run's)
    assert own.text_files == {"train": [str(train)]} and own.origin == str(run.train_args_path)
    assert (own.validation_fraction, own.add_eos, own.cache_dir) == (0.2, False, "cache")
    given = run.data_source(dataset_name="some/dataset")
    assert given.text_files is None and given.dataset_name == "some/dataset" and given.origin == "the command line"
    assert given.add_eos is False  # (the model learned its line ends so)
    train.unlink()
    with pytest.raises(RunFolderError, match=r"names the text file .*train.txt, which does not exist \(here\)"):
        run.data_source()


def test_the_vocabulary_digest_is_the_ids_not_their_order() -> None:
    """What an evaluation report records of its tokenizer, and publish.py compares with the run's."""
    vocabulary = {"<unk>": 0, "a": 1, "b": 2}
    assert vocabulary_digest(vocabulary) == vocabulary_digest(dict(reversed(vocabulary.items())))
    assert vocabulary_digest(vocabulary) != vocabulary_digest({"<unk>": 0, "a": 2, "b": 1})
    assert vocabulary_digest(vocabulary) != vocabulary_digest({**vocabulary, "c": 3})
