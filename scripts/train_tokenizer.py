"""Train a Transformer-XL tokenizer (word, char or byte-level BPE) on a text file or a `datasets` corpus and save it
as `tokenizer.json` (`txl-train-tokenizer` once installed; the code: `transfoxl.cli.train_tokenizer`).

    python scripts/train_tokenizer.py --kind word --text-file train.txt --min-freq 3 --out tok-word
    python scripts/train_tokenizer.py --kind bpe --dataset Salesforce/wikitext --config wikitext-2-raw-v1 \\
        --split train --vocab-size 8000 --out tok-bpe
    python scripts/train_tokenizer.py --help
"""

from transfoxl.cli.train_tokenizer import main

if __name__ == "__main__":
    raise SystemExit(main())
