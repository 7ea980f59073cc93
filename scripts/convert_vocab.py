"""Convert a transformers-v4 Transformer-XL vocabulary into a `tokenizer.json` that plain transformers v5 loads.

The input is a v4 folder (holding `vocab.pkl` or `vocab.bin`, optionally v4's `tokenizer_config.json`) or a
vocabulary file. It is read without `pickle.load`: an allow-list unpickler rebuilds only plain data and refuses a
file whose vocabulary needs anything else (see `transfoxl.tokenization.legacy_vocab`). The output folder receives
`tokenizer.json` and `tokenizer_config.json` (ids = v4's `idx2sym` order); each file is written to a temporary file
beside it and moved into place, so a folder never holds a half-written file. The input is never modified.

    python scripts/convert_vocab.py path/to/transfo-xl-wt103 converted/
    python scripts/convert_vocab.py vocab.pkl converted/ --lower-case
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transfoxl.tokenization import LegacyVocabError, save_atomically, tokenizer_from_legacy_vocab
from transfoxl.tokenization.legacy_vocab import find_legacy_vocab_file


def convert(source: Path, out: Path, *, lower_case: bool | None = None, overwrite: bool = False) -> list[Path]:
    """Write the converted tokenizer of `source` into `out`; return the files written.

    Raises `ValueError` if `out` is the input's folder, or (unless `overwrite`) already holds a file it would write;
    `LegacyVocabError` for an unreadable or unsafe vocabulary.
    """
    source_folder = source if source.is_dir() else source.parent
    vocab_file = find_legacy_vocab_file(source) if source.is_dir() else source
    if vocab_file is None or not vocab_file.is_file():
        raise LegacyVocabError(f"{source}: no vocab.pkl or vocab.bin found")
    if out.resolve() == source_folder.resolve():
        raise ValueError(f"--out {out}: is the input's folder; choose another folder (the input is never modified)")
    overrides = {} if lower_case is None else {"lower_case": lower_case}
    tokenizer = tokenizer_from_legacy_vocab(source, **overrides)

    try:
        return save_atomically(tokenizer, out, overwrite=overwrite)
    except FileExistsError as error:
        raise ValueError(f"--out {out}: {error}") from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="v4 folder, or a vocab.pkl / vocab.bin file")
    parser.add_argument("out", type=Path, help="output folder (created if missing; must differ from the input's)")
    parser.add_argument(
        "--lower-case",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lower-case text before lookup (default: tokenizer_config.json, else the vocabulary's own setting)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace tokenizer files already in the output")
    args = parser.parse_args(argv)
    try:
        written = convert(args.source, args.out, lower_case=args.lower_case, overwrite=args.overwrite)
    except (LegacyVocabError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
