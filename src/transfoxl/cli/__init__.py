"""The command lines: argument parsing and the order of the work, over the package's modules.

    transfoxl.cli.train             python scripts/train.py            over transfoxl.training and transfoxl.runs
    transfoxl.cli.evaluate          python scripts/evaluate.py         over transfoxl.evaluation and transfoxl.runs
    transfoxl.cli.train_tokenizer   python scripts/train_tokenizer.py  over transfoxl.tokenization
    transfoxl.cli.publish           python scripts/publish.py          over transfoxl.hub and transfoxl.runs
    transfoxl.cli.convert           python scripts/convert.py          over transfoxl.conversion
    transfoxl.cli.convert_vocab     python scripts/convert_vocab.py    over transfoxl.conversion (tokenization)

Each module has `main(argv=None) -> int` (the console entry points `txl-train`, `txl-evaluate`, ... call it) and
builds its parser in `build_parser()`; the scripts are shims that call `main`. Training and evaluation need the
training extra (`pip install transfoxl[train]`: datasets, accelerate, matplotlib, the built-in corpus); publish and
convert need only the core install.
"""
