"""A saved model loads with plain transformers (trust_remote_code=True) in a process where this package is absent."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tests.utils import run_fresh_python, tiny_lm
from transfoxl import cpp_kernels_txl

LEGACY_FIXTURES = Path(__file__).parent / "fixtures" / "legacy"

# Runs in a fresh interpreter: importing the package (or its modules) must fail there, so only the files that
# save_pretrained copied next to the weights can define the model.
LOADER = textwrap.dedent(
    """
    import json, sys
    for name in ("transfoxl", "configuration_txl", "modeling_txl"):
        sys.modules[name] = None  # `import transfoxl` now raises ImportError
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    folder, ids = sys.argv[1], torch.tensor(json.loads(sys.argv[2]))
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    with torch.no_grad():
        first = model(ids[:, :4])
        second = model(ids[:, 4:], past_key_values=first.past_key_values)
    generated = model.generate(ids[:1, :3], max_new_tokens=5, do_sample=False, pad_token_id=0)
    base = AutoModel.from_pretrained(folder, trust_remote_code=True)
    kernels = [module for name, module in sys.modules.items() if name.endswith(".cpp_kernels_txl")]
    print(json.dumps({
        "kernel": [module.compiled_operators() is not None for module in kernels],
        "logits": torch.cat([first.logits, second.logits], 1).tolist(),
        "generated": generated.tolist(),
        "config": type(AutoConfig.from_pretrained(folder, trust_remote_code=True)).__name__,
        "base": type(base).__name__,
    }))
    """
)


def test_saved_model_loads_with_remote_code_in_a_fresh_process(tmp_path):
    model = tiny_lm(untie_r=False)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    saved = {path.name for path in folder.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_txl.py", "modeling_txl.py"} <= saved
    assert {"memory_txl.py", "kernels_txl.py", "cpp_kernels_txl.py", "checks_txl.py"} <= saved  # their imports
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoConfig"] == "configuration_txl.TxlConfig"
    assert auto_map["AutoModelForCausalLM"] == "modeling_txl.TxlForCausalLM"
    assert auto_map["AutoModel"] == "modeling_txl.TxlModel"
    assert auto_map["AutoModelForSequenceClassification"] == "modeling_txl.TxlForSequenceClassification"
    assert auto_map["AutoModelForTokenClassification"] == "modeling_txl.TxlForTokenClassification"
    assert auto_map["AutoModelForQuestionAnswering"] == "modeling_txl.TxlForQuestionAnswering"

    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    assert_remote_code_reproduces(model, folder, ids, tmp_path)


def assert_remote_code_reproduces(model, folder, ids: torch.Tensor, tmp_path) -> None:
    """`folder`, loaded in a fresh process without this package, gives `model`'s outputs and generations."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    result = run_fresh_python(LOADER, str(folder), json.dumps(ids.tolist()), cwd=tmp_path, env=env)
    remote = json.loads(result.stdout.strip().splitlines()[-1])

    with torch.no_grad():
        first = model(ids[:, :4])
        second = model(ids[:, 4:], past_key_values=first.past_key_values)
    expected = torch.cat([first.logits, second.logits], 1)
    # Equal to float32 rounding, not bitwise: the loaded weights lie at another alignment (safetensors maps the
    # file), and BLAS's products of a few rows (the adaptive embedding's per-cluster ones) may sum in another order.
    torch.testing.assert_close(torch.tensor(remote["logits"]), expected, rtol=1.3e-6, atol=1e-6)
    generated = model.generate(ids[:1, :3], max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert remote["generated"] == generated.tolist()
    assert remote["config"] == "TxlConfig" and remote["base"] == "TxlModel"
    # the folder's copy of the compiled kernel builds (or is loaded) where this machine supports it
    assert remote["kernel"] == [cpp_kernels_txl.supported_here()]


def test_a_model_loaded_from_a_legacy_folder_saves_a_folder_remote_code_loads(tmp_path):
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(LEGACY_FIXTURES / "adaptive_div2" / name, legacy / name)
    model = AutoModelForCausalLM.from_pretrained(legacy).eval()
    assert type(model.config).__name__ == "TransfoXLConfig"
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["model_type"] == "txl" and saved["auto_map"]["AutoConfig"] == "configuration_txl.TxlConfig"
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    assert_remote_code_reproduces(model, folder, ids, tmp_path)


# Runs in a fresh interpreter where the package is importable (installed) but not imported: loading folders with
# remote code must run each folder's own files.
TWO_FOLDERS = textwrap.dedent(
    """
    import json, sys
    from transformers import AutoConfig, AutoModelForCausalLM

    marks = []
    for folder in sys.argv[1:]:
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        module = sys.modules[type(model).__module__]
        marks.append([getattr(module, "FOLDER_MARK", None), type(model).__module__, type(config).__module__])
    print(json.dumps({"marks": marks, "package_imported": "transfoxl" in sys.modules}))
    """
)


def test_each_folder_runs_its_own_code_where_the_package_is_installed(tmp_path):
    """Two folders of one name (`model`) whose model files differ, loaded in one process where the package is
    installed: each runs its own files. The remote code imported the installed package to check its loading, which
    registered the package's classes with the Auto classes (later loads ran them instead); and the config's module,
    named after the folder and its own files, was shared, so the second folder ran the first one's model code."""
    model = tiny_lm()
    folders = [tmp_path / "a" / "model", tmp_path / "b" / "model"]
    for mark, folder in zip(("a", "b"), folders):
        model.save_pretrained(folder)
        with (folder / "modeling_txl.py").open("a", encoding="utf-8") as file:
            file.write(f"\nFOLDER_MARK = {mark!r}\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    result = run_fresh_python(TWO_FOLDERS, *(str(folder) for folder in [*folders, folders[0]]), cwd=tmp_path, env=env)
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert not outcome["package_imported"]
    assert [mark for mark, _, _ in outcome["marks"]] == ["a", "b", "a"]
    assert all(module.startswith("transformers_modules") for _, *modules in outcome["marks"] for module in modules)


def test_a_model_folders_code_under_transformers_4_says_what_it_needs(monkeypatch):
    """transformers 4 loading a saved folder's code failed with `cannot import name 'PreTrainedConfig'`."""
    import importlib.util

    import pytest
    import transformers

    from transfoxl import configuration_txl

    monkeypatch.setattr(transformers, "__version__", "4.37.2")
    spec = importlib.util.spec_from_file_location("folder_configuration_txl", configuration_txl.__file__)
    with pytest.raises(ImportError, match=r"needs transformers 5 \(installed: 4\.37\.2\); pip install -U"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
