"""`txl-convert` (`transfoxl.cli.convert`, `scripts/convert.py`): a transformers-v4 checkpoint -> a `txl` folder that
reproduces v4 and loads on its own.

The acceptance tests convert each v4 fixture of `tests/fixtures/legacy` (saved by transformers 4.37.2), load the result
natively and run the parity checks of `tests/test_legacy_parity.py` on it, against the outputs v4 recorded. The
error tests name every problem and write nothing; those of malicious or truncated files are rows of
docs/reliability-table.md (area "files").
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file, save_file

import tests.test_legacy_parity as parity
from tests.utils import SYSTEM, RunsCommand, reliability, write_bin
from transfoxl import TxlConfig, TxlForCausalLM, conversion
from transfoxl.cli import convert, convert_vocab, publish
from transfoxl.tokenization import tokenizer_from_legacy_vocab

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "tests" / "fixtures" / "legacy"
TOKENIZER_FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"
TOKENIZER_REFERENCE = json.loads((TOKENIZER_FIXTURES / "reference.json").read_text(encoding="utf-8"))
NAMES = sorted(path.name for path in LEGACY.iterdir() if path.is_dir())
# The code files save_pretrained copies: the model and config modules and the modules they import relatively.
CODE_FILES = {path.name for path in (ROOT / "src" / "transfoxl").glob("*_txl.py")}
MODEL_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "README.md",
    "conversion.json",
    *CODE_FILES,
}
# The comparisons of tests/test_legacy_parity.py, each called with (model, reference).
PARITY_CHECKS = (
    parity.test_segments_with_memory,
    parity.test_losses_with_memory,
    parity.test_losses_with_ignored_labels,
    parity.test_one_call_longer_than_mem_len,
    parity.test_continuing_from_v4_mems,
    parity.test_greedy_generation,
)
VERIFIED = re.compile(r"log-probabilities ([0-9.e+-]+|inf), of memories ([0-9.e+-]+|inf)")


def legacy_folder(tmp_path: Path, name: str = "adaptive_div2", weight_file: str = "model.safetensors") -> Path:
    """A v4 folder as on the Hub: config.json and one weight file of fixture `name`."""
    folder = tmp_path / "src"
    folder.mkdir()
    shutil.copy(LEGACY / name / "config.json", folder / "config.json")
    shutil.copy(LEGACY / name / weight_file, folder / Path(weight_file).name)
    return folder


def digest(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`, with the files' SHA-256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        for path in folder.rglob("*")
    }


def small_vocab_pickle(size: int) -> bytes:
    """A v4 vocab.pkl (plain data, as the Hub's) of the tokenizer fixture's first `size` symbols."""
    idx2sym = TOKENIZER_REFERENCE["idx2sym"][:size]
    fields = {
        "idx2sym": idx2sym,
        "sym2idx": {sym: idx for idx, sym in enumerate(idx2sym)},
        "special": ["<eos>", "<unk>", "<formula>"],
        "lower_case": False,
        "delimiter": None,
    }
    return pickle.dumps(fields, protocol=2)


def reported_diffs(printed: str) -> tuple[float, float]:
    match = VERIFIED.search(printed)
    assert match, printed
    return float(match.group(1)), float(match.group(2))


# ------------------------------------------------------------------------------------------------ acceptance


@pytest.mark.parametrize(
    ("name", "weight_file"),
    [(name, weights) for name in NAMES for weights in parity.WEIGHT_FILES]
    + [("adaptive_div2", "legacy_format/pytorch_model.bin")],
    ids=lambda value: value.replace("/", "-"),
)
def test_converted_folder_reproduces_v4(tmp_path: Path, capsys, name: str, weight_file: str) -> None:
    source = legacy_folder(tmp_path, name, weight_file)
    before = digest(source)
    out = tmp_path / "out"
    assert convert.main([str(source), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verification: passed" in printed and "no vocabulary" in printed
    assert max(reported_diffs(printed)) <= 1e-6

    assert digest(source) == before  # SOURCE is only read
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]  # no staging folder left behind
    assert set(os.listdir(out)) == MODEL_FILES  # model only: the source has no vocabulary
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "txl" and config["memory_init"] == "zeros"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_txl.TxlForCausalLM"
    keys = set(load_file(out / "model.safetensors"))
    assert "transformer.layers.0.attention.qkv_proj.weight" in keys and "adaptive_softmax.output_layers.0.bias" in keys
    assert not [key for key in keys if re.search(r"dec_attn|pos_ff|word_emb\.|^crit\.|inv_freq|r_w_bias", key)]

    model, info = TxlForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(model.config) is TxlConfig and model.config.memory_init == "zeros"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    reference = load_file(LEGACY / name / "reference.safetensors")
    for check in PARITY_CHECKS:
        check((model.eval(), reference))

    card = (out / "README.md").read_text()
    front_matter = card.split("---\n")[1]
    assert "library_name: transformers" in front_matter and "pipeline_tag: text-generation" in front_matter
    assert "- transformer-xl" in front_matter and "- custom_code" in front_matter
    assert "license" not in front_matter  # the source states none
    assert f"`{Path(weight_file).name}`" in card and "a local folder named `src`" in card
    assert 'memory_init: "zeros"' in card and "max |difference| of log-probabilities" in card
    assert str(tmp_path) not in card  # no absolute local paths


def test_sharded_checkpoint(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(LEGACY / "adaptive_div2" / "config.json", source)
    tensors = load_file(LEGACY / "adaptive_div2" / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({key: tensors[key] for key in keys}, source / shard, metadata={"format": "pt"})
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (source / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    assert convert.main([str(source), str(tmp_path / "out")]) == 0
    model = TxlForCausalLM.from_pretrained(tmp_path / "out").eval()
    parity.test_segments_with_memory((model, load_file(LEGACY / "adaptive_div2" / "reference.safetensors")))
    assert "`model-00002-of-00002.safetensors`" in (tmp_path / "out" / "README.md").read_text()


# ------------------------------------------------------------------------------------------------ without the package

# Runs in a fresh interpreter where this package cannot be imported: only the converted folder defines the model.
LOADER = textwrap.dedent(
    """
    import json, sys
    for name in ("transfoxl", "configuration_txl", "modeling_txl"):
        sys.modules[name] = None  # `import transfoxl` now raises ImportError
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, ids, texts = sys.argv[1], torch.tensor(json.loads(sys.argv[2])), json.loads(sys.argv[3])
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        first = model(ids[:, :5])
        second = model(ids[:, 5:], past_key_values=first.past_key_values)
        memory = model(ids[:, :-1]).past_key_values  # the model card's recipe: generate from a memory
        generated = model.generate(ids[:, -1:], past_key_values=memory, max_new_tokens=4, do_sample=False)
    tokenizer = AutoTokenizer.from_pretrained(folder)  # no trust_remote_code: stdin is closed, no prompt waits
    trusting = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    print()  # the trust_remote_code prompt of the first AutoTokenizer call leaves the line open
    print(json.dumps({
        "module": type(model).__module__,
        "logits": torch.cat([first.logits, second.logits], 1).tolist(),
        "generated": generated.tolist(),
        "tokenizer": type(tokenizer).__name__,
        "ids": [tokenizer.encode(text, add_special_tokens=False) for text in texts],
        "trusting_ids": [trusting.encode(text, add_special_tokens=False) for text in texts],
    }))
    """
)


def test_converted_folder_with_tokenizer_loads_without_the_package(tmp_path: Path, capsys) -> None:
    source = legacy_folder(tmp_path, "adaptive_div2", "model.safetensors")
    # The tokenizer fixtures hold 111 symbols, the model 100 ids: a v4 vocabulary of the first 100 symbols.
    (source / "vocab.pkl").write_bytes(small_vocab_pickle(100))
    shutil.copy(TOKENIZER_FIXTURES / "v4_folder" / "tokenizer_config.json", source)
    out = tmp_path / "out"
    assert convert.main([str(source), str(out)]) == 0
    assert "tokenizer converted from vocab.pkl (100 tokens" in capsys.readouterr().out
    assert set(os.listdir(out)) == MODEL_FILES | {"tokenizer.json", "tokenizer_config.json"}
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "auto_map" not in tokenizer_config and "TransfoXL" not in tokenizer_config["tokenizer_class"]
    assert "AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)" in (out / "README.md").read_text()

    # v4's own ids (recorded with 4.37.2) for the texts whose words all lie in the first 100 symbols.
    v4_cases = [
        case
        for case in TOKENIZER_REFERENCE["references"]["v4_folder"]["pretokenized"]
        if case["text"] and max(case["ids"]) < 100
    ]
    assert len(v4_cases) >= 3
    texts = [case["text"] for case in v4_cases] + ["The state-of-the-art game sold 1,000 copies in the U.S."]
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    result = subprocess.run(
        [sys.executable, "-c", LOADER, str(out), json.dumps(ids.tolist()), json.dumps(texts)],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote["module"].startswith("transformers_modules"), remote["module"]

    model = TxlForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        first = model(ids[:, :5])
        second = model(ids[:, 5:], past_key_values=first.past_key_values)
        memory = model(ids[:, :-1]).past_key_values
        generated = model.generate(ids[:, -1:], past_key_values=memory, max_new_tokens=4, do_sample=False)
    expected = torch.cat([first.logits, second.logits], 1)
    # Not bitwise: the other process may run with another number of threads, which changes the order of sums.
    torch.testing.assert_close(torch.tensor(remote["logits"]), expected, rtol=0, atol=1e-6)
    assert remote["generated"] == generated.tolist()

    legacy_tokenizer = tokenizer_from_legacy_vocab(source)  # the package's reading of the v4 vocabulary
    legacy_ids = [legacy_tokenizer.encode(text, add_special_tokens=False) for text in texts]
    assert remote["ids"] == legacy_ids and remote["trusting_ids"] == legacy_ids
    assert [case["ids"] for case in v4_cases] == remote["ids"][: len(v4_cases)]
    assert max(max(row) for row in legacy_ids) < model.config.vocab_size


# ------------------------------------------------------------------------------------------------ Hub snapshots

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(tmp_path: Path, repo_id: str = "someorg/tiny-transfo-xl") -> Path:
    """HF_HOME with `repo_id` cached as huggingface_hub lays it out: refs/main -> snapshots/<commit>/."""
    hf_home = tmp_path / "hf_home"
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    shutil.copy(LEGACY / "adaptive_div2" / "config.json", snapshot)
    shutil.copy(LEGACY / "adaptive_div2" / "model.safetensors", snapshot)
    (snapshot / "README.md").write_text("---\nlicense: mit\nlanguage: en\n---\n\n# A tiny v4 Transformer-XL\n")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return hf_home


def test_hub_repo_id_from_the_offline_cache(tmp_path: Path) -> None:
    hf_home = hub_cache(tmp_path)
    out = tmp_path / "converted"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "convert.py"), "someorg/tiny-transfo-xl", str(out)],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home), "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verification: passed" in result.stdout
    card = (out / "README.md").read_text()
    assert "[`someorg/tiny-transfo-xl`](https://huggingface.co/someorg/tiny-transfo-xl)" in card
    assert f"(revision `{COMMIT}`)" in card and "license: mit" in card.split("---\n")[1]
    assert str(tmp_path) not in card
    model = TxlForCausalLM.from_pretrained(out).eval()
    parity.test_segments_with_memory((model, load_file(LEGACY / "adaptive_div2" / "reference.safetensors")))


def test_hub_snapshot_folder_given_as_a_path_is_named_by_repo_and_commit(tmp_path: Path) -> None:
    snapshot = hub_cache(tmp_path) / "hub" / "models--someorg--tiny-transfo-xl" / "snapshots" / COMMIT
    assert convert.main([str(snapshot), str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"[`someorg/tiny-transfo-xl`](https://huggingface.co/someorg/tiny-transfo-xl) (revision `{COMMIT}`)" in card
    assert str(tmp_path) not in card


def test_a_tokenizer_added_after_the_conversion_is_on_the_published_card(tmp_path: Path, capsys) -> None:
    """A source without a vocabulary is converted without a tokenizer; docs/hub.md adds one with convert_vocab.py.
    The published card said "No tokenizer" and used random ids in its example (conversion.json says none)."""
    source = legacy_folder(tmp_path, NAMES[0], parity.WEIGHT_FILES[0])
    out = tmp_path / "out"
    assert convert.main([str(source), str(out), "--no-verify"]) == 0
    assert json.loads((out / "conversion.json").read_text())["tokenizer"] is None
    vocab = tmp_path / "vocab.pkl"
    vocab.write_bytes(small_vocab_pickle(TxlConfig.from_pretrained(out).vocab_size))
    assert convert_vocab.main([str(vocab), str(out)]) == 0
    dry = tmp_path / "dry"
    assert publish.main([str(out), "--repo-id", "me/tiny-txl", "--dry-run", "--dry-run-dir", str(dry)]) == 0
    card = (dry / "README.md").read_text()
    assert "No tokenizer" not in card and "no tokenizer here" not in card
    assert "**Tokenizer**: `tokenizer.json`, put in the folder after the conversion" in card
    assert "tokenizer = AutoTokenizer.from_pretrained(repo_id" in card
    capsys.readouterr()


def test_a_converted_folder_is_published_with_its_conversion_card(tmp_path: Path, capsys) -> None:
    """publish.py on a folder made by convert.py renders the conversion card again for the Hub id (where the model came
    from, the verification, memory_init), from the conversion.json written beside the model, and takes the source's
    licence unless --license is given; a conversion.json edited into nonsense is refused by name."""
    snapshot = hub_cache(tmp_path) / "hub" / "models--someorg--tiny-transfo-xl" / "snapshots" / COMMIT
    (snapshot / "vocab.pkl").write_bytes(small_vocab_pickle(100))  # publishing needs a tokenizer
    out = tmp_path / "out"
    assert convert.main([str(snapshot), str(out)]) == 0
    record = json.loads((out / "conversion.json").read_text())
    assert record["source_license"] == "mit" and record["source_weight_files"] == ["model.safetensors"]
    assert record["parameters"] > 0 and "max |difference|" in record["verification"]
    capsys.readouterr()

    dry = tmp_path / "dry"
    assert publish.main([str(out), "--repo-id", "me/tiny-txl", "--dry-run", "--dry-run-dir", str(dry)]) == 0
    assert "licence: mit, the converted checkpoint's own" in capsys.readouterr().out
    card = (dry / "README.md").read_text()
    front_matter = card.split("---\n")[1]
    assert "license: mit" in front_matter and "- custom_code" in front_matter
    assert "base_model: someorg/tiny-transfo-xl" in front_matter  # the Hub's lineage: the v4 repo converted
    assert "Converted from [`someorg/tiny-transfo-xl`](https://huggingface.co/someorg/tiny-transfo-xl)" in card
    assert 'memory_init: "zeros"' in card and "max |difference| of log-probabilities" in card
    assert 'repo_id = "me/tiny-txl"\n' in card  # the Hub id, without the converted folder's comment
    assert "Saved with transfoxl" not in card and str(tmp_path) not in card
    # v4's config records no training segment (tgt_len): the card does not call mem_len one
    assert "the segment the model reads at a time" in card and "training segment" not in card
    assert json.loads((dry / "conversion.json").read_text()) == record  # published with the model

    assert (
        publish.main(
            [
                str(out),
                "--repo-id",
                "me/tiny-txl",
                "--license",
                "apache-2.0",
                "--dry-run",
                "--dry-run-dir",
                str(tmp_path / "dry2"),
            ]
        )
        == 0
    )
    assert "license: apache-2.0" in (tmp_path / "dry2" / "README.md").read_text().split("---\n")[1]

    # the default dry run writes OUT/hub-dry-run: converting again with --overwrite still replaces the folder
    assert publish.main([str(out), "--repo-id", "me/tiny-txl", "--dry-run"]) == 0
    assert (out / "hub-dry-run" / "README.md").is_file()
    assert convert.main([str(snapshot), str(out), "--overwrite"]) == 0
    assert not (out / "hub-dry-run").exists()
    capsys.readouterr()

    (out / "conversion.json").write_text(json.dumps({**record, "parameters": "many"}))
    with pytest.raises(SystemExit) as raised:
        publish.main([str(out), "--repo-id", "me/tiny-txl", "--dry-run", "--dry-run-dir", str(tmp_path / "dry3")])
    assert raised.value.code == 2
    assert "conversion.json: 'parameters' must be int or null, got 'many'" in capsys.readouterr().err
    assert not (tmp_path / "dry3").exists()


@pytest.mark.parametrize(
    ("front_matter", "expected_license", "printed"),
    [
        ("license: MIT", "license: mit", "licence: mit, the converted checkpoint's own"),
        (
            "license: other\nlicense_name: my-research-licence\nlicense_link: https://example.org/licence",
            "license: other\nlicense_name: my-research-licence\nlicense_link: https://example.org/licence",
            "licence: other, the converted checkpoint's own",
        ),
        (
            "license:\n- mit\n- apache-2.0",
            "license: apache-2.0",
            "declares several licences (mit, apache-2.0): pass --license to choose one; apache-2.0",
        ),
        ("language: en", "license: apache-2.0", "declares no licence: apache-2.0"),
    ],
    ids=["upper-case", "other-with-name", "list", "none"],
)
def test_the_sources_licence_is_read_as_the_hub_writes_it(
    tmp_path: Path, capsys, front_matter, expected_license, printed
):
    """A licence id in capitals is the Hub's lower-case id; `other` keeps its name and link; several licences or none
    are said as such (review finding: `MIT` was replaced by apache-2.0, a list read as no licence)."""
    source = legacy_folder(tmp_path)
    (source / "vocab.pkl").write_bytes(small_vocab_pickle(100))
    (source / "README.md").write_text(f"---\n{front_matter}\n---\n\n# a v4 model\n")
    assert convert.main([str(source), str(tmp_path / "out")]) == 0
    capsys.readouterr()
    dry = tmp_path / "dry"
    assert publish.main([str(tmp_path / "out"), "--repo-id", "me/l", "--dry-run", "--dry-run-dir", str(dry)]) == 0
    assert printed in capsys.readouterr().out
    assert expected_license in (dry / "README.md").read_text().split("---\n")[1]


def test_hub_repo_id_offline_and_not_cached(tmp_path: Path, monkeypatch, capsys) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE / HF_HOME once at import: patch what it read.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache(tmp_path) / "hub"))
    with pytest.raises(SystemExit) as raised:
        convert.main(["someorg/not-downloaded", str(tmp_path / "out")])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert "someorg/not-downloaded: not a local folder, and the Hub repository is not in the local cache" in error
    assert "HF_HUB_OFFLINE" in error
    assert not (tmp_path / "out").exists()
    # A cached repository at a revision that is not: the message says the revision is missing, not the repository.
    with pytest.raises(SystemExit):
        convert.main(["someorg/tiny-transfo-xl", str(tmp_path / "out"), "--revision", "nope"])
    error = capsys.readouterr().err
    assert "not a local folder, and revision nope of the Hub repository is not in the local cache" in error


def test_hub_repo_id_gated_says_how_to_get_access(tmp_path: Path, monkeypatch, capsys) -> None:
    import httpx2  # huggingface_hub 2.4's HTTP library
    from huggingface_hub.errors import GatedRepoError

    def gated(*args, **kwargs):
        request = httpx2.Request("GET", "https://huggingface.co/api/models/someorg/gated")
        response = httpx2.Response(403, request=request)
        raise GatedRepoError("403: access to model someorg/gated is restricted", response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", gated)
    with pytest.raises(SystemExit) as raised:
        convert.main(["someorg/gated", str(tmp_path / "out")])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert "someorg/gated: the Hub repository is gated: accept its conditions" in error and "hf auth login" in error
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ errors


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _set_config(folder: Path, **values) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def prepare_error(case: str, source: Path, tmp: Path) -> list[str]:
    """Break `source` (or set up OUT) for `case`; return the command line."""
    out = tmp / "out"
    if case == "missing_source":
        return [str(tmp / "nowhere"), str(out)]
    if case == "source_is_a_file":
        return [str(source / "config.json"), str(out)]
    if case == "no_config":
        (source / "config.json").unlink()
    elif case == "already_modern":
        _set_config(source, model_type="txl")
    elif case == "other_model":
        _set_config(source, model_type="gpt2")
    elif case == "unsupported_config":
        _set_config(source, attn_type=2)
    elif case == "no_weights":
        (source / "model.safetensors").unlink()
    elif case == "truncated_safetensors":
        _truncate(source / "model.safetensors")
    elif case == "truncated_bin":
        (source / "model.safetensors").unlink()
        shutil.copy(LEGACY / "adaptive_div2" / "pytorch_model.bin", source)
        _truncate(source / "pytorch_model.bin")
    elif case == "vocabulary_of_another_model":
        shutil.copy(TOKENIZER_FIXTURES / "v4_folder" / "vocab.pkl", source)  # 111 symbols, the model has 100 ids
    elif case == "out_is_source":
        return [str(source), str(source)]
    elif case == "out_inside_source":
        return [str(source), str(source / "converted")]
    elif case == "out_contains_source":
        return [str(source), str(tmp), "--overwrite"]
    elif case == "out_is_a_file":
        out.write_text("x")
    elif case == "out_not_empty":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    elif case == "overwrite_foreign_files":  # --overwrite must not delete what a user keeps there
        out.mkdir()
        (out / "config.json").write_text('{"model_type": "txl"}')
        (out / "my-notes.txt").write_text("x")
        return [str(source), str(out), "--overwrite"]
    elif case == "out_is_a_link":
        (tmp / "elsewhere").mkdir()
        out.symlink_to(tmp / "elsewhere")
    elif case == "bad_segment_count":
        return [str(source), str(out), "--verify-segments", "0"]
    elif case == "revision_of_a_folder":
        return [str(source), str(out), "--revision", "v1.0"]
    elif case == "out_inside_a_file":
        out.write_text("x")
        return [str(source), str(out / "sub")]
    return [str(source), str(out)]


ERROR_MESSAGES = {
    "missing_source": r"nowhere: no such folder",
    "source_is_a_file": r"is a file",
    "no_config": r"SOURCE src: no config\.json",
    "already_modern": r"already has model_type 'txl': it is a modern checkpoint",
    "other_model": r"model_type 'gpt2', not 'transfo-xl'",
    "unsupported_config": r"attn_type=2 is not supported",
    "no_weights": r"SOURCE src: no weights file, none of model\.safetensors",
    "truncated_safetensors": r"src/model\.safetensors: cannot be read \(truncated or corrupt file\?\)",
    "truncated_bin": r"src/pytorch_model\.bin: cannot be read \(truncated or corrupt file\?\)",
    "vocabulary_of_another_model": r"vocab\.pkl holds 111 tokens but the model has vocab_size=100",
    "out_is_source": r"is SOURCE or inside it",
    "out_inside_source": r"is SOURCE or inside it",
    "out_contains_source": r"contains SOURCE",
    "out_is_a_file": r"exists and is not a folder",
    "out_not_empty": r"exists and is not empty; pass --overwrite",
    "overwrite_foreign_files": r"--overwrite replaces only an earlier conversion, and this folder holds files this",
    "out_is_a_link": r"is a symbolic link",
    "bad_segment_count": r"--verify-segments must be >= 1, got 0",
    "out_inside_a_file": r"OUT .*out/sub: .*out is a file",
    "revision_of_a_folder": r"SOURCE .*src is a local folder: --revision v1\.0 applies to a Hub repo id",
}


@pytest.mark.parametrize("case", sorted(ERROR_MESSAGES))
def test_errors_name_the_problem_and_write_nothing(tmp_path: Path, capsys, case: str) -> None:
    source = legacy_folder(tmp_path)
    argv = prepare_error(case, source, tmp_path)
    before = digest(tmp_path)
    with pytest.raises(SystemExit) as raised:
        convert.main(argv)
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert re.search(ERROR_MESSAGES[case], error), error
    assert digest(tmp_path) == before  # nothing written, SOURCE and an existing OUT untouched


def test_a_mistyped_local_source_is_not_looked_up_on_the_hub(tmp_path: Path, capsys, monkeypatch) -> None:
    """SOURCE `models/sr` beside `models/src` has the form of a Hub id and was fetched from the Hub (retries, then
    no "no such folder"); a path into a folder here is local: refused at once with the close names. (Offline here,
    so that the old code fails fast.)"""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "models").mkdir()
    legacy_folder(tmp_path / "models")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as raised:
        convert.main(["models/sr", "out"])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert "SOURCE models/sr: no such folder" in error and "did you mean models/src?" in error
    assert not (tmp_path / "out").exists()


def test_malicious_vocabulary_is_refused_and_never_runs(tmp_path: Path, capsys) -> None:
    source = legacy_folder(tmp_path)
    marker = tmp_path / "pwned"
    (source / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": RunsCommand(f"touch {marker}")}))
    with pytest.raises(SystemExit):
        convert.main([str(source), str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert "the vocabulary was refused" in error and ".system" in error
    assert not marker.exists()
    assert sorted(os.listdir(tmp_path)) == ["src"]


# torch warns that a raw pickle's protocol is newer than its own default before refusing it: expected here.
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@pytest.mark.parametrize("kind", ["zip", "raw_pickle"])
@reliability(
    "scripts/convert.py on a v4 folder with a malicious pytorch_model.bin",
    "exit 2, error naming the file as refused; nothing written; no sentinel",
)
def test_convert_script_refuses_malicious_weights(
    tmp_path: Path, sentinel: Path, capsys, record_property, kind: str
) -> None:
    write_bin(tmp_path / "src", kind, sentinel)
    with pytest.raises(SystemExit) as exit_info:
        convert.main([str(tmp_path / "src"), str(tmp_path / "out")])
    error = capsys.readouterr().err
    record_property("outcome", error.strip().splitlines()[-1])
    assert exit_info.value.code == 2
    assert re.search(r"SOURCE src/pytorch_model\.bin: refused: .*[Nn]othing in it was run", error), error
    assert not sentinel.exists() and not (tmp_path / "out").exists()


@reliability(
    "scripts/convert.py on a v4 folder with a malicious vocab.pkl",
    "exit 2, error naming the vocabulary as refused; nothing written; no sentinel",
)
def test_convert_script_refuses_a_malicious_vocabulary(
    tmp_path: Path, sentinel: Path, capsys, record_property
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(LEGACY / "adaptive_div2" / "config.json", source)
    shutil.copy(LEGACY / "adaptive_div2" / "model.safetensors", source)
    (source / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": RunsCommand(f"touch {sentinel}")}))
    with pytest.raises(SystemExit):
        convert.main([str(source), str(tmp_path / "out")])
    error = capsys.readouterr().err
    record_property("outcome", error.strip().splitlines()[-1])
    assert re.search(rf"the vocabulary was refused: .*vocab\.pkl: field 'idx2sym' needs the global {SYSTEM}", error)
    assert not sentinel.exists() and not (tmp_path / "out").exists()


@reliability(
    "scripts/convert.py on a v4 folder with a truncated model.safetensors",
    "exit 2, error naming the file and saying how it is cut",
)
def test_convert_script_names_a_truncated_safetensors(tmp_path: Path, capsys, record_property) -> None:
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(LEGACY / "adaptive_div2" / "config.json", source)
    data = (LEGACY / "adaptive_div2" / "model.safetensors").read_bytes()
    (source / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit):
        convert.main([str(source), str(tmp_path / "out")])
    error = capsys.readouterr().err
    record_property("outcome", error.strip().splitlines()[-1])
    assert re.search(
        r"SOURCE src/model\.safetensors: cannot be read \(truncated or corrupt file\?\): the header describes \d+ "
        r"bytes of tensor data but the file holds only \d+",
        error,
    ), error


def test_verification_mismatch_fails_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    original = conversion.load_source_model

    def perturbed(folder, config):
        model = original(folder, config)
        # Not a constant shift: a layer norm after the residual sum would remove that (post-LN fixture).
        weight = model.transformer.layers[0].ffn.up_proj.weight
        with torch.no_grad():
            weight += 1e-3 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0))
        return model

    monkeypatch.setattr(conversion, "load_source_model", perturbed)
    source = legacy_folder(tmp_path)
    assert convert.main([str(source), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert "verification failed, nothing was written" in error
    logprob_diff, memory_diff = reported_diffs(error)
    assert logprob_diff > 1e-6 and memory_diff > 1e-6
    assert sorted(os.listdir(tmp_path)) == ["src"]  # neither OUT nor the staging folder


def test_what_killed_conversions_left_is_cleared_or_named(tmp_path: Path, capsys) -> None:
    """A conversion killed outright (SIGKILL: no `finally`) left its staging folder, a whole model, hidden beside OUT,
    and each retry another. A later conversion into OUT removes those of processes that no longer run; one of a
    running process, or of a name without a process id, is left alone; an OUT moved aside for --overwrite whose
    process died is kept and named (it holds the earlier conversion)."""
    source = legacy_folder(tmp_path)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)  # (a process that has exited: its id names no process, bar a rare reuse)
    leftovers = {
        "dead": tmp_path / f".out.converting-{dead}-0a1b2c3d",
        "alive": tmp_path / f".out.converting-{os.getpid()}-0a1b2c3d",
        "unnamed": tmp_path / ".out.converting-0a1b2c3d",
        "replaced": tmp_path / f".out.replaced-{dead}-0a1b2c3d",
        "other": tmp_path / f".other.converting-{dead}-0a1b2c3d",
    }
    for folder in leftovers.values():
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
    assert convert.main([str(source), str(tmp_path / "out"), "--no-verify"]) == 0
    assert not leftovers["dead"].exists()
    assert all(leftovers[name].exists() for name in ("alive", "unnamed", "replaced", "other"))
    assert f"note: {leftovers['replaced']} holds what {tmp_path / 'out'} held before" in capsys.readouterr().out


def test_overwrite_replaces_the_folder_and_memory_init_empty(tmp_path: Path, capsys) -> None:
    source = legacy_folder(tmp_path)
    out = tmp_path / "out"
    assert convert.main([str(source), str(out), "--no-verify"]) == 0  # an earlier conversion
    (out / "tokenizer.json").write_text("{}")  # a file an earlier conversion may have had, not this one
    capsys.readouterr()
    assert convert.main([str(source), str(out), "--overwrite", "--memory-init", "empty"]) == 0
    assert "verification: passed" in capsys.readouterr().out  # compared with v4's zeros on both sides
    assert set(os.listdir(out)) == MODEL_FILES  # the old folder is gone, not merged
    assert json.loads((out / "config.json").read_text())["memory_init"] == "empty"
    assert 'memory_init: "empty"' in (out / "README.md").read_text()
    assert TxlForCausalLM.from_pretrained(out).config.memory_init == "empty"

    assert convert.main([str(source), str(out), "--overwrite", "--no-verify"]) == 0
    assert "verification: skipped" in capsys.readouterr().out
    assert "Not verified (`--no-verify` was given)." in (out / "README.md").read_text()
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]
