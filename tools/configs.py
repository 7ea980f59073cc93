"""The model configurations of the tests and the developer tools, in one place.

Plain dicts of keyword arguments for `transfoxl.TxlConfig` that transformers 4.37.2's `TransfoXLConfig` takes too:
the benchmarks build the same model in both and send it to their workers as JSON. Dropout is off, and there is no
`mem_len`: each user sets the memory it measures. Only the standard library: the benchmark workers import this
module inside the transformers 4.37.2 virtualenv.
"""

from __future__ import annotations

import copy
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    # 2 layers of width 32, an adaptive embedding/softmax of three clusters: the tests' model (tests/utils.py
    # `tiny_config`: seeded tests depend on these values) and `bench_speed.py --config tiny`.
    "tiny": dict(
        vocab_size=97,
        cutoffs=[20, 50],
        div_val=2,
        d_model=32,
        d_embed=32,
        n_head=4,
        d_head=8,
        d_inner=64,
        n_layer=2,
        clamp_len=-1,
        same_length=False,
        dropout=0.0,
        dropatt=0.0,
    ),
    # The benchmarks' model (bench_speed.py, bench_generate.py): 6 layers, d_model 256, 8 heads x 32, d_inner 1024,
    # 10,000 token ids in three clusters.
    "mid": dict(
        vocab_size=10000,
        cutoffs=[2000, 5000],
        div_val=2,
        d_model=256,
        d_embed=256,
        n_head=8,
        d_head=32,
        d_inner=1024,
        n_layer=6,
        clamp_len=-1,
        same_length=False,
        dropout=0.0,
        dropatt=0.0,
    ),
    # The WikiText-103 model of the paper and of transformers' `transfo-xl-wt103` (`TxlConfig()`'s defaults, dropout
    # off): 18 layers, d_model 1024, 16 heads x 64, d_inner 4096, 267,735 token ids in four clusters (div_val 4),
    # 285M parameters. bench_decode.py builds it with random weights, with mem_len 1600.
    "wt103": dict(
        vocab_size=267735,
        cutoffs=[20000, 40000, 200000],
        div_val=4,
        d_model=1024,
        d_embed=1024,
        n_head=16,
        d_head=64,
        d_inner=4096,
        n_layer=18,
        clamp_len=1000,
        same_length=True,
        dropout=0.0,
        dropatt=0.0,
    ),
    # The wt103 model in miniature for the tests (`bench_decode.py --quick`): four clusters with div_val 4,
    # clamp_len and same_length as in wt103; 2 layers of width 64.
    "tiny_wt103": dict(
        vocab_size=300,
        cutoffs=[20, 40, 200],
        div_val=4,
        d_model=64,
        d_embed=64,
        n_head=4,
        d_head=16,
        d_inner=128,
        n_layer=2,
        clamp_len=24,
        same_length=True,
        dropout=0.0,
        dropatt=0.0,
    ),
    # The long runs' model (long_runs.py): 2 layers of width 64, 256 token ids in one cluster; its weights do not
    # matter for memory use.
    "small": dict(
        vocab_size=256,
        cutoffs=[],
        div_val=1,
        d_model=64,
        n_head=4,
        d_head=16,
        d_inner=256,
        n_layer=2,
        clamp_len=-1,
        same_length=False,
        dropout=0.0,
    ),
}


def model_config(name: str, **overrides: Any) -> dict[str, Any]:
    """A fresh copy of configuration `name` with `overrides` applied (the caller may change its lists)."""
    return {**copy.deepcopy(CONFIGS[name]), **overrides}
