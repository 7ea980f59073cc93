"""The README's snippets that claim to run do run: each section with code that needs no download, as one script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def section_code(heading: str) -> str:
    """The ```python blocks of the README section `## heading`, joined in order."""
    text = README.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, f"no python block under '## {heading}'"
    return "\n".join(blocks)


def test_the_transformers_tools_section_runs(tmp_path, monkeypatch, one_thread):
    pytest.importorskip("peft")
    monkeypatch.chdir(tmp_path)  # Trainer writes its run folder in the working directory
    code = section_code("With transformers' tools")
    namespace: dict = {"__name__": "readme"}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["model"].config.vocab_size == 1001  # the last snippet ran
    assert (tmp_path / "trainer-run").is_dir()


def test_the_quick_start_runs(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)  # it saves "my-txl" in the working directory
    namespace: dict = {"__name__": "readme"}
    exec(compile(section_code("Quick start"), str(README), "exec"), namespace)
    assert namespace["log_probs"].shape == (8, 16, 10000)
    assert torch.isfinite(namespace["out"].loss)
    assert (tmp_path / "my-txl" / "config.json").is_file()


def test_the_generation_with_memories_section_runs(one_thread):
    from transfoxl import TxlConfig, TxlForCausalLM
    from transfoxl.tokenization import train_char_level

    book = "It was the best of times, it was the worst of times. " * 20
    tokenizer = train_char_level([book])
    config = TxlConfig(vocab_size=len(tokenizer), cutoffs=[], d_model=32, n_head=2, d_head=16, d_inner=64, n_layer=2)
    namespace: dict = {"__name__": "readme", "model": TxlForCausalLM(config).eval(), "tokenizer": tokenizer}
    namespace["book"] = book
    exec(compile(section_code("Generation with memories"), str(README), "exec"), namespace)
    stream = namespace["stream"]
    assert namespace["new_ids"].shape[-1] == 50 and namespace["more_ids"].shape[-1] == 50
    assert stream.memory.get_seq_length() > 0
