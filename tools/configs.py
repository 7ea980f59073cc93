"""The model configurations of the tests and the developer tools, in one place.

Plain dicts of keyword arguments for `transfoxl.TxlConfig` that transformers 4.37.2's `TransfoXLConfig` takes too:
the benchmarks build the same model in both and send it to their workers as JSON. Dropout is off, and there is no
`mem_len`: each user sets the memory it measures. Only the standard library: the benchmark workers import this
module inside the transformers 4.37.2 virtualenv.
"""

from __future__ import annotations

import copy
from typing import Any


def _architecture(
    vocab_size: int,
    cutoffs: list[int],
    div_val: int,
    width: int,
    heads: int,
    head_width: int,
    inner: int,
    layers: int,
    *,
    clamp_len: int = -1,
    same_length: bool = False,
) -> dict[str, Any]:
    """A TxlConfig's keyword arguments (dropout off; the caller adds mem_len and what it measures)."""
    return dict(
        vocab_size=vocab_size,
        cutoffs=cutoffs,
        div_val=div_val,
        d_model=width,
        d_embed=width,
        n_head=heads,
        d_head=head_width,
        d_inner=inner,
        n_layer=layers,
        clamp_len=clamp_len,
        same_length=same_length,
        dropout=0.0,
        dropatt=0.0,
    )


CONFIGS: dict[str, dict[str, Any]] = {
    # 2 layers of width 32, an adaptive embedding/softmax of three clusters: the tests' model (tests/utils.py
    # `tiny_config`: seeded tests depend on these values) and `bench_speed.py --config tiny`.
    "tiny": _architecture(97, [20, 50], 2, 32, 4, 8, 64, 2),
    # The benchmarks' model (bench_speed.py, bench_generate.py, bench_decode.py): 6 layers, d_model 256, 8 heads x 32,
    # d_inner 1024, 10,000 token ids in three clusters.
    "mid": _architecture(10000, [2000, 5000], 2, 256, 8, 32, 1024, 6),
    # The WikiText-103 model of the paper and of transformers' `transfo-xl-wt103` (`TxlConfig()`'s defaults, dropout
    # off): 18 layers, d_model 1024, 16 heads x 64, d_inner 4096, 267,735 token ids in four clusters (div_val 4),
    # 285M parameters. bench_decode.py builds it with random weights, with mem_len 1600.
    "wt103": _architecture(
        267735, [20000, 40000, 200000], 4, 1024, 16, 64, 4096, 18, clamp_len=1000, same_length=True
    ),
    # The wt103 model in miniature for the tests (`bench_decode.py --quick`): four clusters with div_val 4,
    # clamp_len and same_length as in wt103; 2 layers of width 64.
    "tiny_wt103": _architecture(300, [20, 40, 200], 4, 64, 4, 16, 128, 2, clamp_len=24, same_length=True),
    # The long runs' model (long_runs.py): 2 layers of width 64, 256 token ids in one cluster; its weights do not
    # matter for memory use.
    "small": _architecture(256, [], 1, 64, 4, 16, 256, 2),
}


def model_config(name: str, **overrides: Any) -> dict[str, Any]:
    """A fresh copy of configuration `name` with `overrides` applied (the caller may change its lists)."""
    return {**copy.deepcopy(CONFIGS[name]), **overrides}
