"""Convert a transformers-v4 Transformer-XL vocabulary into a `tokenizer.json` that plain transformers v5 loads.

The input is a v4 folder (holding `vocab.pkl` or `vocab.bin`, optionally v4's `tokenizer_config.json`) or a
vocabulary file, read without `pickle.load` (`transfoxl.tokenization.legacy_vocab`). The output folder receives
`tokenizer.json` and `tokenizer_config.json` (ids = v4's `idx2sym` order). The same command is installed as
`txl-convert-vocab`; the logic is `transfoxl.conversion.convert_vocabulary`.

    python scripts/convert_vocab.py path/to/transfo-xl-wt103 converted/
    python scripts/convert_vocab.py vocab.pkl converted/ --lower-case
"""

from transfoxl.cli.convert_vocab import main

if __name__ == "__main__":
    raise SystemExit(main())
