"""The README's snippets that claim to run do run: the section "With transformers' tools", as one script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
