"""`txl-convert-vocab` (scripts/convert_vocab.py): a v4 vocabulary into a `tokenizer.json` for transformers v5.

The logic is `transfoxl.conversion.convert_vocabulary`; this module parses the options and reports the result.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..conversion import convert_vocabulary
from ..tokenization import LegacyVocabError
from .options import path_argument, program_name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("convert_vocab.py"),
        description="Convert a transformers-v4 Transformer-XL vocabulary (vocab.pkl / vocab.bin, read by an "
        "allow-list reader, never unpickled) into tokenizer.json and tokenizer_config.json with v4's ids; each "
        "file is moved into place by a rename. The input is never modified.",
        epilog="example: txl-convert-vocab path/to/transfo-xl-wt103 converted/",
    )
    parser.add_argument("source", type=path_argument, help="v4 folder, or a vocab.pkl / vocab.bin file")
    parser.add_argument(
        "out", type=path_argument, help="output folder (created if missing; must differ from the input's)"
    )
    parser.add_argument(
        "--lower-case",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lower-case text before lookup (default: tokenizer_config.json, else the vocabulary's own setting)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace tokenizer files already in the output")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        written = convert_vocabulary(args.source, args.out, lower_case=args.lower_case, overwrite=args.overwrite)
    except (LegacyVocabError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0
