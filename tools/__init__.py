"""Developer tools; the user CLIs are in `scripts/`.

- `bench_speed.py`, `bench_generate.py`: speed against transformers 4.37.2, written to `benchmarks/`;
- `long_runs.py`: memory use over a 1,000,000-token evaluation and a 20,000-token generation;
- `reliability_report.py`: the reliability table, `docs/reliability-table.md`, from the marked tests;
- `make_legacy_fixtures.py`, `make_tokenizer_fixtures.py`: the v4 parity fixtures of `tests/fixtures/`;
- `configs.py`: the model configurations of the tests and the tools; `v4.py`: transformers 4.37.2's virtualenv.

Each tool runs as a file from the repository root (`python tools/bench_speed.py --help`) or as a module
(`python -m tools.bench_speed`); the tests import them (`from tools import bench_speed`).
"""
