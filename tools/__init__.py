"""Developer tools; the user CLIs are in `scripts/`.

- `benchmark.py`: the one benchmark command (issue 17): runs the three below that it names and writes
  `benchmarks/summary.{md,png}`, the goals against their targets;
- `bench_speed.py` (training and evaluation, mid and wt103), `bench_generate.py`: speed against transformers
  4.37.2, written to `benchmarks/`;
- `bench_decode.py`: prefill and decode step against transformers' GPT-2 of equal size, and at the WikiText-103
  size against the machine's compute and bandwidth floors and against transformers 4.37.2 end to end;
- `long_runs.py`: memory use over a 1,000,000-token evaluation and a 20,000-token generation;
- `reliability_report.py`: the reliability table, `docs/reliability-table.md`, from the marked tests;
- `make_legacy_fixtures.py`, `make_tokenizer_fixtures.py`: the v4 parity fixtures of `tests/fixtures/`;
- `configs.py`: the model configurations of the tests and the tools; `v4.py`: transformers 4.37.2's virtualenv.

Each tool runs as a file from the repository root (`python tools/bench_speed.py --help`) or as a module
(`python -m tools.bench_speed`); the tests import them (`from tools import bench_speed`).
"""
