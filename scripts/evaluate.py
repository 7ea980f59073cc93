"""Evaluate a saved Transformer-XL model on a split of a corpus for several memory lengths: a table, JSON, Markdown
and a plot in MODEL_DIR/eval (`txl-evaluate` once installed; the code: `transfoxl.cli.evaluate`).

    python scripts/evaluate.py runs/<run>                              # the test split, the training memory length
    python scripts/evaluate.py runs/<run> --mem-len 0,128,512          # no memory, the training one, a longer one
    python scripts/evaluate.py runs/<run> --split validation --max-tokens 20000   # a quick look
    python scripts/evaluate.py runs/<run> --test-file my.txt           # another text, same tokenizer
    python scripts/evaluate.py runs/<run> --device cuda --dtype bfloat16 --batch-size 8
    python scripts/evaluate.py --help                                  # the data, the numbers and every option
"""

from transfoxl.cli.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main())
