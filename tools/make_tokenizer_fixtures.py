"""Record what the transformers-v4 `TransfoXLTokenizer` did, as small test fixtures for the tokenizer of this package.

It builds a small word-level `TransfoXLTokenizer` (transformers 4.37.2) from the WikiText-style text in `CORPUS`,
saves its vocabulary the three ways found in the wild, and records v4's output in `reference.json`:

* `v4_folder/`: what v4's `save_pretrained` wrote (`vocab.pkl` = a pickle of the tokenizer's `__dict__`, which names
  sacremoses classes, `re._compile`, a transformers `Trie` and `tokenizers.AddedToken`), plus `tokenizer_config.json`,
  `special_tokens_map.json` and a `config.json` of model_type "transfo-xl";
* `v4_vocab_only/`: `config.json` + that same `vocab.pkl` and nothing else;
* `hub_dict/`: `config.json` + a `vocab.pkl` holding only plain data (builtins, Counter, OrderedDict), the form of the
  vocabularies on the Hub;
* `torch_bin/`: `config.json` + `vocab.bin`, the plain dict saved with `torch.save`.

`reference.json` holds the vocabulary (`idx2sym`), v4's ids for pre-tokenized lines (the symbols of a whitespace-split
line looked up in the vocabulary, as the original Transformer-XL corpora were encoded; `<eos>` is appended by the
caller per line), and v4's tokens and ids for raw-text cases (Moses tokenization + the @-@ number rules), cased and
lower-cased.

Run by hand in the throwaway virtualenv with transformers==4.37.2 (the same one as `make_legacy_fixtures.py`), never
in CI. From the repository root:

    /tmp/venv-v4/bin/pip install transformers==4.37.2 sacremoses torch
    /tmp/venv-v4/bin/python tools/make_tokenizer_fixtures.py             # writes tests/fixtures/tokenizer/
    /tmp/venv-v4/bin/python tools/make_tokenizer_fixtures.py --out DIR   # or somewhere else

The output is deterministic: running it twice writes byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import shutil
import tempfile
import warnings
from collections import Counter, OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if __package__:  # imported, or run with `python -m tools.make_tokenizer_fixtures`
    from . import v4
else:  # run as a file, `python tools/make_tokenizer_fixtures.py`: its folder is the first entry of sys.path
    import v4

if TYPE_CHECKING:  # transformers 4.x, imported by main() once the options are parsed (v4.import_transformers)
    from transformers import TransfoXLTokenizer

transformers: Any = None  # set by main(): transformers 4.x, the module holding TransfoXLTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "tokenizer"

# WikiText style: pre-tokenized, numbers split as @,@ @.@ @-@, <unk> already in the text.
CORPUS = "".join(
    [
        " = Valkyria Chronicles III =\n",
        " Senjō no Valkyria 3 : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア3 , lit ."
        " Valkyria of the Battlefield 3 ) , commonly"
        " referred to as Valkyria Chronicles III outside Japan , is a tactical role @-@ playing video game .\n",
        " The game began development in 2010 , carrying over a large"
        " portion of the work done on Valkyria Chronicles II .\n",
        " It sold 1 @,@ 000 copies in its first week , and 3 @.@ 14 million by the end of the year .\n",
        " The state @-@ of @-@ the @-@ art engine was n't ready , and the"
        " team 's director said it \" was n't the game we wanted \" .\n",
        " He said that the e @-@ mail from Mr. Smith and Dr. Jones in the U.S. was the first of 10 % of them .\n",
        " In 1 @-@ 2 weeks the game 's sales grew by $ 5 @,@ 000 , or 2 @.@ 5 % ; they were ( as expected ) high !\n",
        " What is it ? It is a game : a role @-@ playing game that the team made in 2010 ... and it sold .\n",
        " the The THE game Game\n",
    ]
)

PRETOKENIZED_LINES = [
    "The game began development in 2010 , carrying over a large portion of the work done .",
    "It sold 1 @,@ 000 copies and 3 @.@ 14 million , a role @-@ playing game .",
    "The team 's director said it was n't ready ( in 2010 ) .",
    "<unk> zebra Valkyria quokka <eos> <formula> the",
    "戦場のヴァルキュリア3 Senjō , lit . $ 5 % ; ! ? ...",
    "",
]

RAW_CASES = [
    "The state-of-the-art game",
    "an e-mail in 1-2 weeks",
    "It sold 1,000 copies and 3.14 million",
    "He paid $5,000.50 for 10% of it.",
    "What is it? It is a game: a role-playing game; they were (as expected) high!",
    'He said "it was the game" and left.',
    "the team's director said it wasn't ready",
    "don't can't I'm you're it's",
    "it 's the team 's game",
    "Mr. Smith and Dr. Jones in the U.S. met.",
    "The <unk> game and <formula> in the <eos> end",
    "The game... and it sold.",
    "“curly quotes” and ‘single’ — a dash – here",
    "  leading and   trailing spaces  ",
    "THE Game the",
    # A final period before a closing quote or bracket, prefixes after an opening one (Moses splits periods last).
    'He said "It was over." (in 2010.) Wait.. (Mr. Smith) and (e.g. the game)',
    "It sold in Jan. and Dec. of 2010.",
    # Known differences (see tests/test_tokenization_legacy.py): Moses' context rules and multi-line text.
    "the game. and then it sold",
    "rock'n'roll",
    "line one\nline two",
]

TOKENIZER_KWARGS = {
    # Specials first, as the original code does; "<formula>" is v4's default additional special token.
    "special": ["<eos>", "<unk>", "<formula>"],
    "min_freq": 1,
    "lower_case": False,
}


def build_tokenizer(corpus_path: Path) -> TransfoXLTokenizer:
    tokenizer = transformers.TransfoXLTokenizer(**TOKENIZER_KWARGS)
    with open(corpus_path, encoding="utf-8") as f:
        # Pre-tokenized corpora were counted by splitting on whitespace (the original code's `line.split()`).
        tokenizer.count_sents([[*line.split(), "<eos>"] for line in f])
    tokenizer.build_vocab()
    return tokenizer


def write_config(folder: Path, vocab_size: int) -> None:
    config = {"model_type": "transfo-xl", "vocab_size": vocab_size, "cutoffs": [], "eos_token_id": 0}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def record(tokenizer: TransfoXLTokenizer) -> dict:
    eos_id = tokenizer.convert_tokens_to_ids("<eos>")
    pretokenized = [
        {
            "text": line,
            "ids": tokenizer.convert_tokens_to_ids(line.split()),
            "v4_tokenize": tokenizer.tokenize(line),  # what v4's Moses pipeline made of the same line
        }
        for line in PRETOKENIZED_LINES
    ]
    raw = [
        {"text": text, "tokens": tokenizer.tokenize(text), "ids": tokenizer.encode(text), "decoded": None}
        for text in RAW_CASES
    ]
    for case in raw:
        case["decoded"] = tokenizer.decode(case["ids"])
    return {"eos_id": eos_id, "pretokenized": pretokenized, "raw": raw}


def main(argv: list[str] | None = None) -> None:
    global transformers
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    transformers = v4.import_transformers("TransfoXLTokenizer", "TransfoXLTokenizer")  # before --out is emptied
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)

    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = Path(tmp) / "train.txt"
        corpus_path.write_text(CORPUS, encoding="utf-8")
        built = build_tokenizer(corpus_path)

    folder = out / "v4_folder"
    built.save_pretrained(folder)
    vocab_size = len(built.idx2sym)
    write_config(folder, vocab_size)

    vocab_only = out / "v4_vocab_only"
    vocab_only.mkdir()
    shutil.copy(folder / "vocab.pkl", vocab_only / "vocab.pkl")
    write_config(vocab_only, vocab_size)

    plain = {
        "special": list(built.special),
        "counter": Counter(built.counter),
        "min_freq": built.min_freq,
        "max_size": built.max_size,
        "lower_case": built.lower_case,
        "delimiter": built.delimiter,
        "vocab_file": None,
        "idx2sym": list(built.idx2sym),
        "sym2idx": OrderedDict(built.sym2idx),
        "eos_idx": built.sym2idx["<eos>"],
        "unk_idx": built.sym2idx["<unk>"],
    }
    hub = out / "hub_dict"
    hub.mkdir()
    with open(hub / "vocab.pkl", "wb") as f:
        pickle.dump(plain, f, protocol=2)
    write_config(hub, vocab_size)

    torch_bin = out / "torch_bin"
    torch_bin.mkdir()
    torch.save(plain, torch_bin / "vocab.bin")
    write_config(torch_bin, vocab_size)

    os.environ["TRUST_REMOTE_CODE"] = "True"  # v4 refuses to unpickle without it; these are our own files
    references = {}
    for name in ("v4_folder", "v4_vocab_only"):
        loaded = transformers.TransfoXLTokenizer.from_pretrained(out / name)
        references[name] = record(loaded)
    lower = transformers.TransfoXLTokenizer.from_pretrained(out / "v4_folder", lower_case=True)
    references["v4_folder_lower_case"] = record(lower)

    reference = {
        "transformers_version": transformers.__version__,
        "tokenizer_kwargs": TOKENIZER_KWARGS,
        "idx2sym": list(built.idx2sym),
        "references": references,
    }
    (out / "reference.json").write_text(
        json.dumps(reference, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8"
    )
    print(f"wrote {out} ({vocab_size} symbols)")


if __name__ == "__main__":
    main()
