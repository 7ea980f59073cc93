"""`txl-train` / `python scripts/train.py`: the options of a training run, and `main`, which puts the steps of
`transfoxl.training` in order.

Fine-tuning (`--model-name-or-path`): the run starts from a saved model and its tokenizer instead of a new model and a
tokenizer trained on the data: a run folder of this command, a folder written by `scripts/convert.py` (or a
transformers-v4 Transformer-XL folder itself), any `save_pretrained` folder of this package, or a Hub id (from the
local cache with `HF_HUB_OFFLINE=1`). Its config decides the architecture and its tokenizer the ids, so `--preset`,
`--config`, the architecture options (`--n-layer` ... `--pre-lnorm`) and the tokenizer-training options (`--tokenizer
char|word|bpe`, `--vocab-size`, `--min-freq`, `--lower-case`) are refused; `--tokenizer` may name another saved
tokenizer whose ids fit the model. The training options apply; those not given come from the default preset
(char-small), the segment and memory lengths (training and final evaluation) from the model's config. `--dropout` /
`--dropatt` set the dropout of the fine-tuning. The run folder is that of a new run, and `--resume` continues it the
same way (the model named by `--model-name-or-path` must still be there).

The option names of transformers' `run_clm_no_trainer.py` are accepted too (`--model_name_or_path`, `--output_dir`,
`--learning_rate`, `--train_file`, `--validation_file`, `--dataset_name`, `--dataset_config_name`,
`--max_train_steps`, `--per_device_train_batch_size`, `--gradient_accumulation_steps`, `--weight_decay`,
`--lr_scheduler_type`, `--num_warmup_steps`, `--report_to`, `--seed`); as there,
`--per_device_train_batch_size` counts the columns of one accumulation group of one process.

The final evaluation scores every split whole, except with `--max-eval-tokens N` (the tiny preset's default: 65,536),
which stops after about N targets: the first segments of every column, the same targets at every memory length
(evaluate.py's `--max-eval-tokens` means the same; its `--max-tokens` cuts the split to its first N tokens instead).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from .. import training
from ..checkpoints import local_path_problem
from ..checks_txl import require_integer
from ..configuration_txl import TransfoXLConfig, TxlConfig
from ..files import folder_problem
from ..hub import loading_failure
from ..presets import PRESETS
from ..runs import TRAIN_ARGS, RunFolderError, complete_checkpoints, read_json_object
from ..tokenization import BPE_MIN_VOCAB_SIZE, TOKENIZER_KINDS
from .options import add_corpus_options, library_progress_bars, name_argument, path_argument, program_name

DEFAULT_PRESET = "char-small"
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup", "inverse_sqrt")
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
# The checks of parse_args on integer options: (the least value, the options). None values (not given) pass.
INTEGER_BOUNDS = (
    (1, ("tgt_len", "batch_size", "grad_accum", "steps", "eval_tgt_len", "eval_batch_size", "eval_segments")),
    (0, ("mem_len", "eval_mem_len", "warmup_steps", "sample_len", "min_freq", "checkpoint_every")),
    (0, ("skip_nonfinite_steps", "max_eval_tokens")),
    (1, ("eval_every", "log_every", "keep_checkpoints")),
    (1, ("n_layer", "d_model", "n_head", "d_head", "d_inner", "div_val", "vocab_size", "num_proc")),
)


# ---------------------------------------------------------------------------------------------------------------------
# The parser


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" only where it informs: not to flags (a flag's default is its absence), not to a default of
    None (filled in later, as the help says), not to a help that states its default itself."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.nargs == 0 or action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("train.py"),
        description="Train a Transformer-XL language model (datasets + accelerate) and write a Hub-ready run folder.",
        formatter_class=HelpFormatter,
    )
    preset_help = "; ".join(f"{name}: {preset.description}" for name, preset in PRESETS.items())

    data = parser.add_argument_group("data (default: the built-in Shakespeare corpus, no network)")
    add_corpus_options(data, defaults_from_run=False)
    data.add_argument("--num-proc", type=int, default=None, help="processes for tokenization (datasets map)")

    tok = parser.add_argument_group("tokenizer")
    tok.add_argument(
        "--tokenizer",
        type=name_argument,
        default="char",
        help=f"one of {', '.join(TOKENIZER_KINDS)} (trained on the training split), or a folder / Hub id of a "
        "saved tokenizer",
    )
    tok.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="bpe: vocabulary size, the 256 bytes and the specials included (8000); word, char: at most this many "
        "words / characters, besides <unk>, <eos> (and char's newline)",
    )
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
    model.add_argument(
        "--config",
        type=name_argument,
        default=None,
        help="a TxlConfig JSON file, or a folder with config.json: the architecture (and, where it has them, the "
        "defaults of --tgt-len and --mem-len) instead of the preset's; --preset then sets the training schedule only "
        "(batch size, learning rate, steps, warmup, evaluation lengths)",
    )
    for name in ("--n-layer", "--d-model", "--n-head", "--d-head", "--d-inner"):
        model.add_argument(name, type=int, default=None)
    model.add_argument("--dropout", type=float, default=None)
    model.add_argument("--dropatt", type=float, default=None, help="dropout on attention probabilities")
    model.add_argument("--cutoffs", default=None, help="adaptive softmax cutoffs, comma-separated ('' for none)")
    model.add_argument("--div-val", type=int, default=None, help="adaptive embedding width divisor per cluster")
    model.add_argument("--pre-lnorm", action=argparse.BooleanOptionalAction, default=None)
    model.add_argument("--attn-implementation", choices=("eager", "sdpa"), default=None)

    train = parser.add_argument_group(
        "training (defaults from the preset where shown as None; when fine-tuning, the lengths from the model and "
        f"the rest from {DEFAULT_PRESET}: set --lr for a model pre-trained at a lower rate)"
    )
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
    train.add_argument(
        "--weight-decay", "--weight_decay", type=float, default=0.0, help="AdamW weight decay (matrices only)"
    )
    train.add_argument("--adam-beta1", type=float, default=0.9)
    train.add_argument("--adam-beta2", type=float, default=0.999)
    train.add_argument("--adam-eps", type=float, default=1e-8)
    train.add_argument(
        "--scheduler", "--lr_scheduler_type", choices=SCHEDULERS, default="cosine", help="transformers' schedulers"
    )
    train.add_argument("--warmup-steps", "--num_warmup_steps", type=int, default=None)
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
    evaluation.add_argument(
        "--eval-mem-len",
        type=int,
        default=None,
        help="final evaluation memory length (default: 4 x a given --mem-len, else the preset's; when fine-tuning, "
        "the model's mem_len)",
    )
    evaluation.add_argument("--eval-clamp-len", type=int, default=None, help="final evaluation clamp_len")
    evaluation.add_argument("--eval-same-length", action=argparse.BooleanOptionalAction, default=None)
    evaluation.add_argument("--eval-batch-size", type=int, default=16, help="columns in evaluation")
    evaluation.add_argument(
        "--max-eval-tokens",
        type=int,
        default=None,
        metavar="N",
        help="final evaluation: stop each split after about N targets (whole segments of every column, at least "
        "one; 0: the whole split), as evaluate.py's option of that name. Default: the preset's (tiny: 65536; the "
        "others: 0)",
    )
    evaluation.add_argument("--sample-len", type=int, default=300, help="tokens to sample at the end (0: none)")

    output = parser.add_argument_group("output")
    output.add_argument(
        "--output-dir",
        "--output_dir",
        type=path_argument,
        default=None,
        help="the run folder (default: runs/<preset>-<time>, runs/<model>-finetuned-<time> when fine-tuning)",
    )
    output.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its checkpoint")
    output.add_argument(
        "--checkpoint-every", type=int, default=None, help="steps between checkpoints (0: none; default: --steps / 5)"
    )
    output.add_argument("--keep-checkpoints", type=int, default=2, help="complete checkpoints kept")
    output.add_argument("--log-every", type=int, default=10, help="steps between history entries")
    output.add_argument(
        "--report-to",
        "--report_to",
        choices=("auto", "none", "tensorboard"),
        default="auto",
        help="where the training curves also go (auto: tensorboard when it is installed, else none)",
    )
    output.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return parser


def option_defaults() -> dict[str, Any]:
    """Every option's default as parsed from an empty command line (for a resumed run's options added since)."""
    return vars(build_parser().parse_args([]))


# ---------------------------------------------------------------------------------------------------------------------
# Parsing and checking


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the options; fill what was not given from the preset (`--preset`), or from the model to
    fine-tune (`--model-name-or-path`) and the default preset. Errors exit through `parser.error` (status 2)."""
    parser = build_parser()
    # argparse sets the default of an option only when the namespace it is given lacks it: these start as `not_given`,
    # so that an option given with its default value (`--preset char-small`) is told from one left out.
    not_given = object()
    args = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(DEFAULT_AFTER_PARSING, not_given)))
    given = {name for name in DEFAULT_AFTER_PARSING if getattr(args, name) is not not_given}
    for name in set(DEFAULT_AFTER_PARSING) - given:
        setattr(args, name, parser.get_default(name))

    model_config = None  # the config of the model to fine-tune
    if args.model_name_or_path is not None:
        model_config = check_fine_tuning_options(parser, args, given)
        args.preset = None  # the architecture is the model's; the training defaults are DEFAULT_PRESET's
    read_config_file(parser, args)
    global_batch_size(parser, args)
    # (--resume: what the command line repeats is compared with the run's own options instead, take_the_runs_options)
    if args.scheduler == "constant" and args.warmup_steps and not args.resume:  # the constant schedule: no warmup
        fail(parser, "warmup_steps", args.warmup_steps, "0 with --scheduler constant (use constant_with_warmup)")
    fill_defaults(args, model_config)
    check_values(parser, args)
    check_data_and_output(parser, args, given)
    if args.resume and args.output_dir is not None:
        take_the_runs_options(parser, args, argv)
        check_data_sources(parser, args)
    if args.report_to == "tensorboard" and not training.tensorboard_installed():  # (accelerate would only warn)
        whose = "" if "report_to" in options_given(argv) else f" (the run's own, from its {TRAIN_ARGS})"
        parser.error(
            f"--report-to tensorboard{whose}: tensorboard is not installed (pip install tensorboard); --report-to "
            "none trains without the curves' logs, auto uses tensorboard where it is installed"
        )
    return args


def take_the_runs_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None
) -> None:
    """`--resume`: the options not on the command line are the run's own (its train_args.json), so that
    `--output-dir R --resume` continues R as it was started. Those given are kept and compared with the run's when it
    resumes (`training.check_resumable`: the ones that change the training must be the same)."""
    given = options_given(argv)
    train_args = Path(args.output_dir) / TRAIN_ARGS
    if not train_args.is_file():
        if not given & RUN_DEFINING_OPTIONS:
            # (a mistyped folder would otherwise start the default run, on other data, where the user expects theirs)
            parser.error(
                f"--resume: {args.output_dir} holds no run (no {TRAIN_ARGS}), and no option says what a new one there "
                "would train (--train-file, --dataset-name, --preset, --config, --model-name-or-path, --tokenizer): "
                "give the folder of a run started by train.py, or drop --resume to start a new run there"
            )
        return  # no run there yet, but its options given: a new one starts (training.open_run_folder says so)
    try:
        saved = read_json_object(train_args)
    except RunFolderError as error:
        parser.error(f"--resume: {error}")
    given.add("progress")  # this terminal's, not the run's: --no-progress has no opposite to turn bars back on
    for key, value in saved.items():
        if key not in given and hasattr(args, key):
            setattr(args, key, value)


# What says which run a new one is: its data, model and tokenizer (not its logging, seed or checkpoint options).
RUN_DEFINING_OPTIONS = {"train_file", "dataset_name", "preset", "config", "model_name_or_path", "tokenizer"}


def options_given(argv: Sequence[str] | None) -> set[str]:
    """The options on the command line (their dests), defaults aside."""
    probe = build_parser()  # the same options, none with a default: what it returns is what was given
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    return set(vars(probe.parse_args(argv)))


def check_data_sources(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Evaluation files belong to a training file, a dataset configuration to a dataset; a training file and a
    dataset exclude each other."""
    if args.train_file is None and (args.validation_file or args.test_file):
        parser.error("--validation-file / --test-file need a --train-file")
    if args.train_file is not None and args.dataset_name is not None:
        parser.error("pass either --train-file or --dataset-name, not both")
    if args.dataset_config is not None and args.dataset_name is None:
        parser.error(f"--dataset-config {args.dataset_config} needs a --dataset-name")


def fail(parser: argparse.ArgumentParser, option: str, value: Any, expected: str) -> None:
    """`--option value: expected ...` through `parser.error` (exit status 2)."""
    parser.error(f"--{option.replace('_', '-')} {value}: expected {expected}")


def read_config_file(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--config`: its content as `args.config_values` (part of the options a resume compares), its path resolved."""
    args.config_values = None
    if args.config is None:
        return
    path = Path(args.config).resolve()
    path = path / "config.json" if path.is_dir() else path
    try:
        args.config_values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        fail(parser, "config", args.config, f"a TxlConfig JSON file or a folder with config.json ({error})")
    if not isinstance(args.config_values, dict):
        fail(parser, "config", args.config, "a JSON object")
    problem = config_file_problem(args.config_values)
    if problem:
        fail(parser, "config", args.config, problem)
    args.config = str(path)


def global_batch_size(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--per-device-train-batch-size` (run_clm_no_trainer.py's batch: one group of one process) as `--batch-size`,
    which says it all (and is what a resume compares)."""
    if args.per_device_train_batch_size is not None:
        if args.batch_size is not None:
            parser.error("pass either --batch-size (all processes) or --per-device-train-batch-size, not both")
        check_integers(parser, args, 1, ("per_device_train_batch_size", "grad_accum"))
        world_size = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun and accelerate launch
        args.batch_size = args.per_device_train_batch_size * args.grad_accum * world_size
    del args.per_device_train_batch_size


def fill_defaults(args: argparse.Namespace, model_config: TxlConfig | None) -> None:
    """The options left out: from a config file's or the fine-tuned model's lengths, else from the preset."""
    preset = PRESETS[args.preset].training if args.preset is not None else {}
    defaults = PRESETS[args.preset or DEFAULT_PRESET].training
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
    if args.warmup_steps is None:  # the preset's warmup, shortened for a short run (none in a constant schedule)
        args.warmup_steps = 0 if args.scheduler == "constant" else min(defaults["warmup_steps"], args.steps // 10)
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


def check_integers(
    parser: argparse.ArgumentParser, args: argparse.Namespace, least: int, names: Sequence[str]
) -> None:
    """Each of the options `names` is None (not given) or an integer >= `least`."""
    for name in names:
        value = getattr(args, name)
        try:
            require_integer(value, name, minimum=least, none_ok=True)
        except ValueError:
            fail(parser, name, value, f"an integer >= {least}")


def check_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Numbers in range, and options that fit together."""
    for least, names in INTEGER_BOUNDS:
        check_integers(parser, args, least, names)
    for name in ("dropout", "dropatt"):
        value = getattr(args, name)
        if value is not None and not 0 <= value < 1:
            fail(parser, name, value, "a probability in [0, 1)")
    if not (math.isfinite(args.lr) and args.lr > 0):
        fail(parser, "lr", args.lr, "a positive number")
    if not (math.isfinite(args.max_grad_norm) and args.max_grad_norm >= 0):
        fail(parser, "max_grad_norm", args.max_grad_norm, "a number >= 0 (0: no clipping)")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        fail(parser, "weight_decay", args.weight_decay, "a number >= 0")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            fail(parser, name, getattr(args, name), "a number in [0, 1)")
    # AdamW's first step moves a weight by up to lr / (1 - beta1): beyond float32's range torch fails with an
    # overflow error, not a message. A huge lr below it is accepted: it ends in a non-finite loss, which stops the run.
    first_step = args.lr / (1 - args.adam_beta1)
    if first_step >= torch.finfo(torch.float32).max:
        fail(
            parser,
            "lr",
            args.lr,
            f"an AdamW first step (--lr / (1 - --adam-beta1) = {first_step:.3g}) within float32 (3.4e38)",
        )
    if not (math.isfinite(args.adam_eps) and args.adam_eps > 0):
        fail(parser, "adam_eps", args.adam_eps, "a positive number")
    if not 0 < args.validation_fraction < 1:
        fail(parser, "validation_fraction", args.validation_fraction, "a fraction in (0, 1)")
    if args.warmup_steps > args.steps:
        fail(parser, "warmup_steps", args.warmup_steps, f"at most --steps {args.steps}")
    if args.batch_size % args.grad_accum:
        fail(
            parser,
            "grad_accum",
            args.grad_accum,
            f"a divisor of the per-process batch (--batch-size {args.batch_size})",
        )
    if args.cutoffs is not None:
        try:
            args.cutoffs = [int(part) for part in args.cutoffs.split(",") if part.strip()]
        except ValueError:
            fail(parser, "cutoffs", repr(args.cutoffs), "comma-separated integers, e.g. 2000,10000")


def check_data_and_output(parser: argparse.ArgumentParser, args: argparse.Namespace, given: set[str]) -> None:
    """The data files exist, the tokenizer is a kind, a folder or a Hub id, fp16 has a GPU, the output folder is a
    folder; local paths are made absolute, so that train_args.json means the same files from any folder."""
    if not args.resume:  # (a resume takes the run's own --train-file / --dataset-name first: checked after)
        check_data_sources(parser, args)
    for option in ("train_file", "validation_file", "test_file"):
        for path in getattr(args, option) or []:
            if not Path(path).is_file():
                fail(parser, option, path, "an existing text file")
        if getattr(args, option):
            setattr(args, option, [str(Path(path).resolve()) for path in getattr(args, option)])
    if args.model_name_or_path is not None and "tokenizer" not in given:
        args.tokenizer = args.model_name_or_path  # the model's own tokenizer
    if args.tokenizer not in TOKENIZER_KINDS:
        if Path(args.tokenizer).exists():
            args.tokenizer = str(Path(args.tokenizer).resolve())
        else:
            # A near miss of a kind ("chars", "BPE") is a typo, not a Hub id: refused now, not after the Hub's retries;
            # so is a mistyped local folder (runs/mrun beside runs/).
            near = difflib.get_close_matches(args.tokenizer.lower(), TOKENIZER_KINDS, n=1, cutoff=0.6)
            problem = local_path_problem(args.tokenizer)
            if near or problem:
                hint = f" (did you mean {near[0]}?)" if near else ""
                found = "" if near else f": {problem}"
                fail(
                    parser,
                    "tokenizer",
                    args.tokenizer,
                    f"one of {', '.join(TOKENIZER_KINDS)}{hint}, a tokenizer folder or a Hub id{found}",
                )
    if args.model_name_or_path is None and not args.resume:  # (fine-tuning refuses them all; a resume compares)
        check_tokenizer_options(parser, args, given)
    if args.mixed_precision == "fp16" and (args.cpu or not torch.cuda.is_available()):
        fail(parser, "mixed_precision", "fp16", "bf16 or no on a CPU (fp16 autocast needs a GPU)")
    if args.output_dir is not None and (problem := folder_problem(args.output_dir)):
        fail(parser, "output_dir", args.output_dir, f"a folder ({problem})")
    if args.resume and args.output_dir is None:
        parser.error("--resume needs the --output-dir of the run to continue")


# The tokenizer kinds each training option of a tokenizer applies to (transfoxl.training.build_tokenizer).
TOKENIZER_OPTION_KINDS = {"lower_case": ("word",), "min_freq": ("word", "char"), "vocab_size": TOKENIZER_KINDS}


def check_tokenizer_options(parser: argparse.ArgumentParser, args: argparse.Namespace, given: set[str]) -> None:
    """--lower-case, --min-freq and --vocab-size shape a tokenizer trained here: refused where they would be ignored
    (another kind, or a saved tokenizer loaded as it is)."""
    for name, kinds in TOKENIZER_OPTION_KINDS.items():
        value = getattr(args, name)
        if (name in given or name == "vocab_size") and value not in (None, False) and args.tokenizer not in kinds:
            which = f"--tokenizer {' or '.join(kinds)}" if args.tokenizer in TOKENIZER_KINDS else "a tokenizer trained"
            loaded = "" if args.tokenizer in TOKENIZER_KINDS else f" (--tokenizer {args.tokenizer} is loaded as saved)"
            parser.error(f"{spelled(name, value)} applies to {which} here only{loaded}: leave it out")
    if args.tokenizer == "bpe" and args.vocab_size is not None and args.vocab_size < BPE_MIN_VOCAB_SIZE:
        parser.error(
            f"--vocab-size {args.vocab_size}: a byte-level BPE needs at least {BPE_MIN_VOCAB_SIZE} (its 256 bytes "
            "and its special tokens)"
        )


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
    elif problem := local_path_problem(source):  # (a mistyped local folder: said now, not after the Hub's retries)
        parser.error(
            f"--model-name-or-path {source}: expected an existing model folder or a Hub id (owner/name): {problem}"
        )
    try:
        config = AutoConfig.from_pretrained(args.model_name_or_path)
    except (OSError, ValueError) as error:
        parser.error(
            f"--model-name-or-path {source}: expected a saved model, a folder with its config.json or a Hub id in "
            f"the local cache (HF_HUB_OFFLINE=1) or on the Hub ({loading_failure(error, source)})"
        )
    if not isinstance(config, TxlConfig):
        parser.error(
            f"--model-name-or-path {source}: expected a Transformer-XL model (model_type {TxlConfig.model_type!r} or "
            f"{TransfoXLConfig.model_type!r}); this one is model_type {config.model_type!r}"
        )
    return config


def config_file_problem(values: dict[str, Any]) -> str | None:
    """What is wrong with a `--config` file's content for training (None: nothing found).

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
    fields = [*TxlConfig.__annotations__, "proj_share_all_but_first"]  # its own fields, and a legacy option
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


# ---------------------------------------------------------------------------------------------------------------------
# Main


def main(argv: Sequence[str] | None = None) -> int:
    """Train, evaluate and write the run folder; 0 on success. Refusals exit with a message (SystemExit)."""
    started = time.perf_counter()
    args = parse_args(argv)
    with library_progress_bars(args.progress):
        return _train(args, started)


def _train(args: argparse.Namespace, started: float) -> int:
    state = training.start_processes(args)
    run = trainer = None
    try:
        run = training.open_run_folder(args, state, option_defaults())
        with training.discarded_if_stopped(run, state):  # a new run stopped by its data leaves nothing behind
            tokenizer, streams = training.load_data(args, state, run)
            config = training.model_config(args, len(tokenizer))
            training.check_layouts(args, streams, state)
        trainer = training.Trainer(args, config, run, tokenizer, streams)
        trainer.resume()
        trainer.describe()
        trainer.train()
        trainer.save_model()
        results = trainer.evaluate_final()
        trainer.write_results(results, started)
        trainer.finish()
    except SystemExit as stop:
        if isinstance(stop.code, str) and not state.is_main_process:  # every process stops; one says why
            raise SystemExit(1) from None
        raise
    except KeyboardInterrupt:  # (Ctrl-C: a message, not a traceback; checkpoints are written whole or not at all)
        if state.is_main_process:
            print(_interrupted_message(args, run, trainer), file=sys.stderr)
        raise SystemExit(130) from None
    return 0


def _interrupted_message(args: argparse.Namespace, run: training.RunFolder | None, trainer: object | None) -> str:
    """What an interrupted run left and how to go on."""
    again = "run the same command again" if args.resume else "run the same command with --resume"
    if run is None or trainer is None:  # (a new run's files were taken back: `discarded_if_stopped`)
        return "txl-train: interrupted before training began; run the same command again."
    checkpoints = complete_checkpoints(run.checkpoints_dir)
    if not checkpoints:
        return (
            f"txl-train: interrupted before the first checkpoint (--checkpoint-every {args.checkpoint_every}); "
            f"{again} to start {run.path} from the beginning."
        )
    return f"txl-train: interrupted; {again} to continue {run.path} from {checkpoints[-1].name}."


if __name__ == "__main__":
    raise SystemExit(main())
