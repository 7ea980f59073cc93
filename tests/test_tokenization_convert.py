"""`txl-convert-vocab` (`transfoxl.cli.convert_vocab`, `scripts/convert_vocab.py`): a v4 vocabulary -> tokenizer.json
that AutoTokenizer loads with v4's ids; a malicious vocabulary is refused and never runs (a row of
docs/reliability-table.md, area "files")."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.utils import SYSTEM, named, reliability, v4_tokenizer_folder
from transfoxl.cli import convert_vocab

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text(encoding="utf-8"))


def digest(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


@pytest.mark.parametrize("source", ["v4_folder", "hub_dict", "torch_bin/vocab.bin"])
def test_convert_writes_a_tokenizer_with_v4_ids(tmp_path: Path, source: str) -> None:
    input_folder = tmp_path / "input"
    shutil.copytree(FIXTURES / source.split("/")[0], input_folder)
    before = digest(input_folder)
    source_path = input_folder / source.split("/")[1] if "/" in source else input_folder
    out = tmp_path / "out"
    assert convert_vocab.main([str(source_path), str(out)]) == 0
    assert digest(input_folder) == before  # the input is never modified
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
    assert not [name for name in os.listdir(out) if name.startswith(".")]  # staging folder removed
    tokenizer = AutoTokenizer.from_pretrained(out)
    reference = REFERENCE["references"]["v4_vocab_only"]
    for case in reference["pretokenized"]:
        assert tokenizer.encode(case["text"], add_special_tokens=False) == case["ids"]


def test_convert_refuses_the_input_folder_and_existing_files(tmp_path: Path, capsys) -> None:
    script = convert_vocab
    input_folder = tmp_path / "input"
    shutil.copytree(FIXTURES / "v4_folder", input_folder)
    before = digest(input_folder)
    assert script.main([str(input_folder), str(input_folder)]) == 1
    assert "input's folder" in capsys.readouterr().err
    assert digest(input_folder) == before

    out = tmp_path / "out"
    assert script.main([str(input_folder), str(out)]) == 0
    assert script.main([str(input_folder), str(out)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert script.main([str(input_folder), str(out), "--overwrite", "--lower-case"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("THE Game", add_special_tokens=False)) == ["the", "game"]


def test_convert_refuses_a_vocabulary_larger_than_the_model_in_out(tmp_path: Path, capsys) -> None:
    """OUT holding a model of fewer ids than the vocabulary has tokens (review finding: written without a word, the
    mismatch surfaced only at publish); as many or fewer tokens are fine (a padded model)."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "txl", "vocab_size": 100}))
    assert convert_vocab.main([str(FIXTURES / "v4_folder"), str(out)]) == 1  # 111 tokens
    assert "holds a model of vocab_size 100 and this vocabulary has 111 tokens" in capsys.readouterr().err
    assert sorted(path.name for path in out.iterdir()) == ["config.json"]
    (out / "config.json").write_text(json.dumps({"model_type": "txl", "vocab_size": 128}))
    assert convert_vocab.main([str(FIXTURES / "v4_folder"), str(out)]) == 0
    # The same mismatch in the source folder itself (its weights and its vocab.pkl), as convert.py refuses it: the
    # tokenizer was written without a word.
    source = tmp_path / "source"
    shutil.copytree(FIXTURES / "v4_folder", source)
    (source / "config.json").write_text(json.dumps({"model_type": "transfo-xl", "vocab_size": 100}))
    assert convert_vocab.main([str(source), str(tmp_path / "new")]) == 1
    assert f"SOURCE {source} holds a model of vocab_size 100 and this vocabulary has 111" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_convert_names_a_missing_source_and_a_file_as_output(tmp_path: Path, capsys) -> None:
    assert convert_vocab.main([str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 1
    assert "nowhere: no such file or folder" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert convert_vocab.main([str(FIXTURES / "v4_folder"), str(tmp_path / "afile")]) == 1
    assert "OUT " in (err := capsys.readouterr().err) and "afile exists and is not a folder" in err
    assert (tmp_path / "afile").read_text() == "x"


def test_convert_refuses_a_malicious_vocabulary(tmp_path: Path, capsys) -> None:
    marker = tmp_path / "pwned"

    class RunsCommand:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": RunsCommand()}))
    assert convert_vocab.main([str(tmp_path / "vocab.pkl"), str(tmp_path / "out")]) == 1
    assert ".system" in capsys.readouterr().err
    assert not marker.exists()
    assert not (tmp_path / "out" / "tokenizer.json").exists()


# ------------------------------------------------------------------------------------------------ malicious files
# A row of the reliability table (area "files").


@pytest.mark.parametrize("vocab_name", ["vocab.pkl", "vocab.bin"])
@reliability(
    "scripts/convert_vocab.py on a malicious vocabulary", "exit 1, error naming the file and the global; no sentinel"
)
def test_convert_vocab_script_refuses_malicious_files(
    tmp_path: Path, sentinel: Path, capsys, record_property, vocab_name: str
) -> None:
    path = v4_tokenizer_folder(tmp_path / "v4", vocab_name, sentinel)
    assert convert_vocab.main([str(path), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    record_property("outcome", error.strip())
    assert re.search(rf"error: {named(path)}: .*{SYSTEM[1:-1]}", error), error
    assert not sentinel.exists() and not (tmp_path / "out").exists()


def test_a_converted_vocabulary_is_the_same_file_in_every_process(tmp_path: Path) -> None:
    """The pre-tokenizer's regex lists words of equal length in a fixed order: with a set's order (which follows
    the hash seed) each conversion, and each publication of it, wrote another tokenizer.json."""
    digests = set()
    for seed in ("1", "2"):
        out = tmp_path / seed
        script = "import sys; from transfoxl.cli import convert_vocab; sys.exit(convert_vocab.main(sys.argv[1:]))"
        subprocess.run(
            [sys.executable, "-c", script, str(FIXTURES / "v4_folder"), str(out)],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        digests.add(hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest())
    assert len(digests) == 1
