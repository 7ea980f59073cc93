"""End-to-end check of `scripts/demo.py`: a tiny run trains, evaluates, samples, saves, and the model reloads."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import transfoxl
from tests.utils import load_script
from transfoxl.data import StreamBatcher


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run on one intra-op thread: a tiny model gains nothing from more, and on a busy machine (tests in parallel)
    multi-threaded CPU kernels slow down more than tenfold waiting for each other's threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_demo_runs_saves_and_reloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = load_script("demo")
    # The demo lays its stream out with the package's batcher (its layout is tested in tests/test_data.py).
    assert demo.StreamBatcher is StreamBatcher

    # Keep a handle on the trained model: the reloaded one must give exactly its log-probabilities.
    saved_models = []
    save_model_atomically = demo.save_model_atomically

    def save_and_keep(model: transfoxl.TxlForCausalLM, out: Path) -> None:
        saved_models.append(model)
        save_model_atomically(model, out)

    monkeypatch.setattr(demo, "save_model_atomically", save_and_keep)
    out = tmp_path / "run"
    argv = ["--steps", "3", "--batch-size", "4", "--tgt-len", "16", "--mem-len", "16", "--eval-mem-len", "32"]
    argv += ["--d-model", "32", "--n-layer", "1", "--sample-len", "20", "--out", str(out)]

    assert demo.main(argv) == 0

    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert set(metrics["valid_bpc"]) == {"no_memory", "train_memory", "long_memory"}
    for mode, bpc in metrics["valid_bpc"].items():
        assert isinstance(bpc, float) and math.isfinite(bpc) and bpc > 0, (mode, bpc)
    assert metrics["memory_lengths"] == {"no_memory": 0, "train_memory": 16, "long_memory": 32}
    assert len(metrics["sample"]) == 20
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert not list(out.glob(".*")), "temporary files left behind"

    (trained,) = saved_models
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(reloaded, transfoxl.TxlForCausalLM)
    assert reloaded.config.vocab_size == len(vocab)
    trained.eval()
    reloaded.eval()
    input_ids = demo.encode("Shall I compare thee", vocab)[None]
    with torch.no_grad():
        expected = trained(input_ids, use_cache=False).logits
        actual = reloaded(input_ids, use_cache=False).logits
    assert torch.equal(actual, expected)
