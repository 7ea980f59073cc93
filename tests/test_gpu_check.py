"""tools/gpu_check.py on the CPU, tiny: every check runs and passes, the timings are recorded, the files written.
(On a machine with a GPU the same code checks the CUDA paths; CI has none.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import gpu_check


def test_the_checks_pass_on_the_cpu(tmp_path: Path) -> None:
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "gpu.json").read_text())
    checks = results["checks"]
    assert set(checks) == {
        "logits_vs_cpu",
        "greedy_vs_cpu",
        "training_gradients",
        "checkpointing_dropout",
        "autocast_bf16",
        "bf16_weights",
        "generate_modes",
        "trainer_bf16",
        "peft_lora",
        "torch_export",
        "compiled_training",
    }
    assert all(entry["passed"] and "error" not in entry for entry in checks.values()), checks
    # eager and SDPA are two paths: eager's logits are not SDPA's bit for bit, both within the tolerance
    assert checks["logits_vs_cpu"]["eager"] < 1e-4 and checks["training_gradients"]["eager"] < 1e-3
    timings = results["timings"]
    assert all("error" not in entry for entry in timings.values()), timings
    assert set(timings["mid_vs_gpt2"]) >= {"1", "8"} and timings["mid_training"]["fp32"]["tokens_per_s"] > 0
    compiled = timings["mid_compiled_decoding"]
    assert compiled["backend"] == "aot_eager" and compiled["same_tokens"] is True
    table = (tmp_path / "gpu.md").read_text()
    assert "| logits_vs_cpu | yes |" in table and "| batch 8, decode step (ms) |" in table
    assert "| bf16_autocast |" in table and "| bf16_weights |" in table
    assert "the forward under torch.compile (aot_eager, fullgraph, dynamic)" in table
    # the tables again from the JSON alone (a GPU run's files, rewritten here)
    (tmp_path / "gpu.md").unlink()
    assert gpu_check.main(["--out", str(tmp_path), "--markdown-only"]) == 0
    assert (tmp_path / "gpu.md").read_text() == table


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if gpu_check.torch.cuda.is_available():
        pytest.skip("a GPU is visible: the error is for machines without one")
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", str(tmp_path)])
    assert "no CUDA device is visible" in capsys.readouterr().err
