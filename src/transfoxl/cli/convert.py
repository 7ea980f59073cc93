"""`txl-convert` (scripts/convert.py): a transformers-v4 Transformer-XL checkpoint into a verified `txl` folder.

The logic is `transfoxl.conversion`; this module parses the options and reports the result.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..configuration_txl import MEMORY_INIT_CHOICES
from ..conversion import ConversionError, VerificationFailed, convert
from .options import path_argument, program_name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("convert.py"),
        description="Convert a transformers-v4 Transformer-XL checkpoint (model_type 'transfo-xl': a folder, a Hub "
        "snapshot or a Hub repo id) into a txl folder that plain transformers v5 loads with trust_remote_code=True: "
        "the model, its code, tokenizer.json (from vocab.pkl / vocab.bin, never unpickled) and a model card. OUT is "
        "written next to itself and renamed into place once complete and verified.",
        epilog="example: txl-convert transfo-xl/transfo-xl-wt103 transfo-xl-wt103-txl",
    )
    parser.add_argument("source", metavar="SOURCE", help="v4 checkpoint folder, or a Hub repo id (org/name)")
    parser.add_argument(
        "out", metavar="OUT", type=path_argument, help="output folder (absent or empty unless --overwrite)"
    )
    parser.add_argument(
        "--memory-init",
        choices=MEMORY_INIT_CHOICES,
        default="zeros",
        help="how the converted model starts a stream's memory: 'zeros' (default) reproduces v4's outputs, 'empty' "
        "is the original code's start",
    )
    parser.add_argument(
        "--verify-segments", type=int, default=3, metavar="N", help="segments compared by the verification (3)"
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the comparison with the legacy model")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT (SOURCE is never touched)")
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit) when SOURCE is a repo id")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verify_segments < 1:
        parser.error(f"--verify-segments must be >= 1, got {args.verify_segments}")
    try:
        result = convert(
            args.source,
            args.out,
            memory_init=args.memory_init,
            verify_segments=None if args.no_verify else args.verify_segments,
            overwrite=args.overwrite,
            revision=args.revision,
        )
    except ConversionError as error:
        parser.error(str(error))
    except OSError as error:  # permissions, a full disk: one line, not a traceback
        parser.error(f"cannot write {args.out}: {error}")
    except VerificationFailed as error:
        print(f"error: verification failed, nothing was written to {args.out}: {error}", file=sys.stderr)
        return 1
    for note in result.notes:
        print(note)
    if result.verification is None:
        print("verification: skipped (--no-verify)")
    else:
        print(f"verification: passed; {result.verification.summary()}")
    print(f"wrote {args.out}: {', '.join(result.files)}")
    return 0
