"""Evaluate a Transformer-XL language model on a split of a corpus, the paper's way, for several memory lengths
(`txl-evaluate`, `python scripts/evaluate.py`).

The split is read as one token stream, in order, in segments of `--tgt-len` tokens; each segment attends to a memory
of the hidden states of the `--mem-len` positions before it (`transfoxl.evaluation.evaluate_stream`). The memory
holds states, not parameters, so any length works with any trained model: evaluating with a longer memory than in
training is how the paper reports its best numbers. One evaluation is run per memory length, and the results go to
the terminal and to the output folder (default `MODEL_DIR/eval`):

- `eval-<split>.json`: the settings, the model and tokenizer (a digest of its vocabulary), the text (its source, its
  token count, its share of `<unk>`), one row per memory length (negative log-likelihood sum, targets, loss,
  perplexity, bits per token, seconds, tokens per second);
- `eval-<split>.md`: the table as Markdown;
- `eval-<split>.png`: bits per token (bpc) against the memory length.

In the run's own `eval/` folder, a report of text given on the command line, or of a tokenizer whose ids are not the
model's, is named after what differs (`eval-test-mytext.json`, `eval-test-tokenizer-<folder>.json`): the run's own
`eval-<split>` report stays, and publish.py refuses the other unless told (`--include-mismatched-eval`).

From the repository root:

    python scripts/evaluate.py runs/<run>                              # the test split, the training memory length
    python scripts/evaluate.py runs/<run> --mem-len 0,128,512          # no memory, the training one, a longer one
    python scripts/evaluate.py runs/<run> --split validation --max-tokens 20000   # a quick look: the first 20,000
    python scripts/evaluate.py runs/<run> --max-eval-tokens 65536      # about 65,536 targets, as train.py's option
    python scripts/evaluate.py runs/<run> --test-file my.txt           # another text, same tokenizer
    python scripts/evaluate.py runs/<run> --device cuda --dtype bfloat16 --batch-size 8
    python scripts/evaluate.py --help

MODEL_DIR is a folder holding a saved `TxlForCausalLM` (`config.json`, `model.safetensors`) and its tokenizer: a
`scripts/train.py` run folder, or any `save_pretrained` output (`--tokenizer` names another tokenizer folder; one
with more tokens than the model has ids is refused, one whose ids differ from the model's own tokenizer's, or whose
size differs from the model's vocabulary, is evaluated with a warning, and the report says so).

The text: with no data option, a run folder's `train_args.json` gives the data source the model was trained on, so
`--split validation` is the very text it was validated on; without one, the built-in corpus (Shakespeare's plays,
split by play, see `transfoxl.data.builtin_corpus`). `--train-file`, `--validation-file`, `--test-file` or
`--dataset-name` choose another one.

The numbers. Every token of the stream but the first is a target, scored exactly once (with `--batch-size B` the
stream is cut into B columns, the first token of each column is not scored, and the last N mod B tokens, which fill
no column, are not read). `--max-tokens N` reads only the first N tokens of the split; `--max-eval-tokens N`, as in
train.py, scores about N targets: the first segments of every column, whole (at least one), the same targets at
every memory length. The loss is the mean negative
log-likelihood per target in nats; perplexity is `exp(loss)`; bits per token are `loss / ln 2`. With a
character-level tokenizer a token is a character and bits per token are bits per character (**bpc**, the unit of the
paper's enwik8 / text8 results; lines end with a newline character, which counts as one). With a word or subword
tokenizer the column is called "bits/token": those numbers are comparable only between models with the same
tokenizer.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .. import TxlConfig, TxlForCausalLM
from ..checkpoints import close_local_paths, did_you_mean, local_path_problem
from ..data import (
    UNKNOWN_SHARE_WARNING,
    StreamBatcher,
    flatten_token_ids,
    load_corpus,
    tokenize_corpus,
    unknown_share,
)
from ..evaluation import (
    evaluate_memory_lengths,
    is_character_level,
    memory_lengths_plot,
    memory_lengths_table,
    segments_for_targets,
)
from ..files import folder_problem, write_bytes_atomically, write_json_atomically, write_text_atomically
from ..runs import (
    TEXT_FILE_OPTIONS,
    WEIGHT_FILES,
    DataSource,
    MissingTextFile,
    RunFolder,
    RunFolderError,
    vocabulary_digest,
)
from .options import (
    add_corpus_options,
    library_progress_bars,
    name_argument,
    path_argument,
    program_name,
)

SPLITS = ("test", "validation", "train")
DEFAULT_TGT_LEN = 128  # when the model's config does not say which segment length it was trained with
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def memory_lengths(text: str) -> list[int]:
    """`"0,128,512"` -> `[0, 128, 512]` (duplicates dropped, order kept); argparse names the option on error."""
    lengths: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            length = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of integers >= 0 ({item!r} is not an integer), "
                "e.g. --mem-len 0,128,512"
            ) from None
        if length < 0:
            raise argparse.ArgumentTypeError(f"memory lengths must be >= 0 (0: no memory), got {length} in {text!r}")
        if length not in lengths:
            lengths.append(length)
    return lengths


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("evaluate.py"), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "model_dir", type=path_argument, metavar="MODEL_DIR", help="folder of the saved model and tokenizer"
    )
    parser.add_argument(
        "--tokenizer",
        type=name_argument,
        default=None,
        metavar="PATH",
        help="load the tokenizer from here (default: MODEL_DIR)",
    )

    data = parser.add_argument_group(
        "data",
        "with none of the files or --dataset-name: MODEL_DIR/train_args.json's source, else the built-in corpus",
    )
    data.add_argument("--split", choices=SPLITS, default="test", help="the split to evaluate (default: %(default)s)")
    add_corpus_options(data, defaults_from_run=True)
    data.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="read only the first N tokens of the split (the stream is cut before it is laid out in columns)",
    )
    data.add_argument(
        "--max-eval-tokens",
        type=int,
        default=None,
        metavar="N",
        help="as train.py's option: stop after about N targets, the first segments of every column, whole (at least "
        "one), the same targets at every memory length; 0: the whole split (default: the whole split)",
    )

    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument(
        "--tgt-len",
        type=int,
        default=None,
        help=f"segment length (default: the config's tgt_len, else {DEFAULT_TGT_LEN})",
    )
    evaluation.add_argument(
        "--mem-len",
        type=memory_lengths,
        default=None,
        metavar="M[,M...]",
        help="memory lengths to evaluate with, comma-separated, e.g. 0,128,512 (default: the config's mem_len)",
    )
    evaluation.add_argument(
        "--clamp-len", type=int, default=None, help="largest relative distance encoded, <= 0: none (default: config's)"
    )
    evaluation.add_argument(
        "--same-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every query attends to the same number of positions (default: the config's)",
    )
    evaluation.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="contiguous columns read in parallel; 1 scores every token but the first (default: a run folder's "
        "--eval-batch-size, so that its own figures are reproduced; else 1)",
    )
    evaluation.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    evaluation.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="float32",
        help="bfloat16 / float16: torch.autocast, CUDA only (default: %(default)s)",
    )

    output = parser.add_argument_group("output")
    output.add_argument(
        "--output", type=path_argument, default=None, metavar="DIR", help="folder (default: MODEL_DIR/eval)"
    )
    output.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Errors that need nothing loaded: numbers out of range, files that do not exist, clashing options."""
    if args.tgt_len is not None and args.tgt_len < 1:
        parser.error(f"--tgt-len must be >= 1, got {args.tgt_len}")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_tokens is not None and args.max_tokens < 2:
        parser.error(f"--max-tokens must be >= 2 (one input and one target), got {args.max_tokens}")
    if args.max_eval_tokens is not None and args.max_eval_tokens < 0:
        parser.error(f"--max-eval-tokens must be >= 0 (0: the whole split), got {args.max_eval_tokens}")
    if args.validation_fraction is not None and not 0 < args.validation_fraction < 1:
        parser.error(f"--validation-fraction must be in (0, 1), got {args.validation_fraction}")
    given_files = [split for split in TEXT_FILE_OPTIONS if getattr(args, f"{split}_file") is not None]
    if given_files and args.dataset_name is not None:
        parser.error(f"--dataset-name and --{given_files[0]}-file exclude each other: give one source")
    if args.dataset_config is not None and args.dataset_name is None:
        parser.error(f"--dataset-config {args.dataset_config!r} needs --dataset-name")
    for split in given_files:
        for path in getattr(args, f"{split}_file"):
            if not Path(path).is_file():
                parser.error(f"--{split}-file {path}: no such file")
            if Path(path).stat().st_size == 0:
                parser.error(f"--{split}-file {path}: the file is empty (0 bytes): it holds no text to evaluate")
    if args.output is not None and (problem := folder_problem(args.output)):
        parser.error(f"--output {args.output}: {problem}")


def resolve_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> torch.device:
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        parser.error(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    if args.dtype != "float32" and device.type != "cuda":
        # torch.autocast on CPU does run bfloat16, but without bf16 matrix units it is slower than float32 and only
        # less precise: nothing to gain.
        parser.error(
            f"--dtype {args.dtype} needs a CUDA device (it runs through torch.autocast); on {device.type}, which has "
            "no fast bfloat16/float16 here, use --dtype float32"
        )
    return device


# ---------------------------------------------------------------------------------------------------------------------
# The model folder


def check_model_dir(parser: argparse.ArgumentParser, run: RunFolder) -> None:
    if not run.exists():
        close = close_local_paths(str(run.path)) if not run.path.exists() else []
        parser.error(f"MODEL_DIR {run.path} is not a folder{did_you_mean(close, ' (', ')')}")
    if not run.has_config():
        parser.error(
            f"MODEL_DIR {run.path} has no config.json: not a saved model (a scripts/train.py run folder or the "
            "output of save_pretrained)"
        )
    if not run.weight_files():
        parser.error(f"MODEL_DIR {run.path} has no weights: none of {', '.join(WEIGHT_FILES)}")


def load_tokenizer(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    source = args.tokenizer if args.tokenizer is not None else str(args.model_dir)
    if args.tokenizer is not None and (problem := local_path_problem(args.tokenizer)):
        parser.error(f"--tokenizer {args.tokenizer}: {problem}")  # (not a Hub id: no lookup and its retries)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        if args.tokenizer is None:
            parser.error(f"MODEL_DIR {args.model_dir} has no tokenizer ({error}); pass --tokenizer PATH")
        parser.error(f"--tokenizer {args.tokenizer}: cannot load a tokenizer ({error})")


def load_config(parser: argparse.ArgumentParser, model_dir: Path) -> Any:
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as error:
        parser.error(f"MODEL_DIR {model_dir}: cannot read config.json ({error})")
    if not isinstance(config, TxlConfig):
        parser.error(f"MODEL_DIR {model_dir} holds a {type(config).__name__}, not a Transformer-XL (TxlConfig) model")
    return config


# ---------------------------------------------------------------------------------------------------------------------
# The text


def resolve_data_source(
    parser: argparse.ArgumentParser, args: argparse.Namespace, run_folder: RunFolder
) -> DataSource:
    """The command line's source; else the training run's (`RunFolder.data_source`); else the built-in corpus."""
    text_files = {split: getattr(args, f"{split}_file") for split in TEXT_FILE_OPTIONS}
    # Absolute: the report says which files, from any folder (publish.py compares them with the run's).
    text_files = {split: [str(Path(path).resolve()) for path in paths] for split, paths in text_files.items() if paths}
    try:
        return run_folder.data_source(
            text_files=text_files or None,
            dataset_name=args.dataset_name,
            dataset_config=args.dataset_config,
            validation_fraction=args.validation_fraction,
            cache_dir=args.cache_dir,
            add_eos=args.add_eos,
        )
    except MissingTextFile as error:
        parser.error(f"{error}; pass the data options (--train-file / --validation-file / --test-file) yourself")
    except RunFolderError as error:
        parser.error(str(error))


def load_stream(parser: argparse.ArgumentParser, source: DataSource, split: str, tokenizer: Any) -> torch.Tensor:
    """The token ids of `split`, `[N]` int64: load_corpus, then tokenize_corpus (cached by datasets), flattened."""
    text_files = source.text_files
    if text_files is not None and "train" not in text_files:
        if split not in text_files:
            given = ", ".join(f"--{name}-file" for name in text_files)
            parser.error(f"--split {split}: no --{split}-file was given (only {given})")
        # load_corpus needs a "train" split and cuts "validation" off it when missing; the split to evaluate stands
        # in for both, so that it is read whole and unchanged. Its own name first: load_corpus checks the splits in
        # this order, so a file of blank lines is named as the split given, not as the stand-in "train".
        stand_ins = {name: text_files[split] for name in ("train", "validation") if name not in text_files}
        text_files = {**text_files, **stand_ins}
    try:
        corpus = load_corpus(
            text_files,
            source.dataset_name,
            source.dataset_config,
            source.cache_dir,
            validation_fraction=source.validation_fraction,
        )
    except (OSError, ValueError, ModuleNotFoundError) as error:  # (a file that is not UTF-8: a ValueError)
        parser.error(f"cannot load {source.describe()}: {error}")
    if split not in corpus:
        parser.error(f"--split {split}: {source.describe()} has no {split!r} split (splits: {', '.join(corpus)})")
    tokenized = tokenize_corpus(corpus[split], tokenizer, add_eos=source.add_eos)
    return flatten_token_ids(tokenized)


# ---------------------------------------------------------------------------------------------------------------------
# Outputs


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------------------------------
# Main


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with library_progress_bars(not args.no_progress):
        return run_evaluation(parser, args)


def run_eval_batch_size(run: RunFolder) -> int:
    """The columns a training run evaluated with: its metrics.json's (what its final evaluation used, a resumed run's
    setting included), else its train_args.json's eval_batch_size, else 1."""
    try:
        rows = [row for split in ((run.metrics or {}).get("evaluation") or {}).values() for row in split.values()]
        value = rows[0].get("batch_size") if rows else None
        if value is None:
            value = (run.train_args or {}).get("eval_batch_size")
    except (RunFolderError, AttributeError):  # (a damaged file: said where the data source is read)
        value = None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


class Settings(NamedTuple):
    """How the stream is read: the command line's values, else the model config's (the batch size: else the
    training run's evaluation batch size, else 1)."""

    tgt_len: int
    mem_lens: list[int]
    clamp_len: int
    same_length: bool
    batch_size: int

    @classmethod
    def resolve(cls, args: argparse.Namespace, config: TxlConfig, run: RunFolder) -> Settings:
        tgt_len = args.tgt_len if args.tgt_len is not None else (getattr(config, "tgt_len", None) or DEFAULT_TGT_LEN)
        return cls(
            tgt_len=tgt_len,
            mem_lens=args.mem_len if args.mem_len is not None else [config.mem_len],
            clamp_len=args.clamp_len if args.clamp_len is not None else config.clamp_len,
            same_length=args.same_length if args.same_length is not None else bool(config.same_length),
            batch_size=args.batch_size if args.batch_size is not None else run_eval_batch_size(run),
        )


def run_evaluation(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The work of `main` once the command line is parsed; errors exit through `parser.error`."""
    check_args(parser, args)
    device = resolve_device(parser, args)
    run = RunFolder(args.model_dir)
    check_model_dir(parser, run)
    config = load_config(parser, run.path)
    tokenizer = load_tokenizer(parser, args)
    check_tokenizer_size(parser, args, tokenizer, config)
    mismatch = tokenizer_mismatch(args, run, tokenizer, config)
    settings = Settings.resolve(args, config, run)
    max_segments = segments_for_targets(
        args.max_eval_tokens or 0, batch_size=settings.batch_size, tgt_len=settings.tgt_len
    )
    unit = "bpc" if is_character_level(tokenizer) else "bits/token"

    source = resolve_data_source(parser, args, run)
    stream = load_stream(parser, source, args.split, tokenizer)
    split_tokens = stream.numel()
    if args.max_tokens is not None:
        stream = stream[: args.max_tokens]
    if stream.numel() and int(stream.max()) >= config.vocab_size:
        parser.error(
            f"vocabulary mismatch: split {args.split!r} holds token id {int(stream.max())}, the model's vocab_size is "
            f"{config.vocab_size}; pass the tokenizer the model was trained with (--tokenizer)"
        )
    try:
        batcher = StreamBatcher(stream, settings.batch_size, settings.tgt_len, device=device)
    except ValueError as error:
        hint = " (after --max-tokens)" if args.max_tokens is not None else ""
        parser.error(f"--split {args.split}{hint}: {error}")

    model = load_model(parser, run, config, device)
    n_params = sum(parameter.numel() for parameter in model.parameters())
    print(f"model: {run.path} ({n_params / 1e6:.2f}M parameters), tokenizer: {len(tokenizer)} tokens ({unit})")
    if mismatch is not None:
        print(
            f"warning: --tokenizer {args.tokenizer} may not be the tokenizer the model was trained with: {mismatch}; "
            "the figures then score ids the model learned for other tokens (the report records it: publish.py "
            "refuses a report of another tokenizer than the run's)"
        )
    print(
        f"data: split {args.split!r} of {source.describe()}: {stream.numel():,} tokens"
        + (f" of {split_tokens:,}" if stream.numel() < split_tokens else "")
    )
    share = unknown_share(stream, tokenizer)
    if share > UNKNOWN_SHARE_WARNING:  # the figures would mostly measure how well <unk> is predicted
        print(
            f"warning: {share:.1%} of these tokens are {tokenizer.unk_token} (outside the tokenizer's "
            f"vocabulary): the {unit} below says little about the text; is it the kind of text the model learned?"
        )
    cap = f", at most about {args.max_eval_tokens:,} targets (--max-eval-tokens)" if max_segments is not None else ""
    print(
        f"settings: tgt_len {settings.tgt_len}, batch size {settings.batch_size}, clamp_len {settings.clamp_len}, "
        f"same_length {settings.same_length}, memory lengths {settings.mem_lens}{cap}; {device}, {args.dtype}"
    )
    rows = evaluate_memory_lengths(
        model,
        batcher,
        settings.mem_lens,
        tgt_len=settings.tgt_len,
        clamp_len=settings.clamp_len,
        same_length=settings.same_length,
        autocast_dtype=None if args.dtype == "float32" else DTYPES[args.dtype],
        max_segments=max_segments,
        progress=not args.no_progress and args.split,
    )

    table = memory_lengths_table(rows, unit)
    print()
    print(table, end="")
    if unit == "bpc":
        print("bpc: bits per character (loss / ln 2; the tokenizer is character-level)")
    data = {
        "split": args.split,
        "source": source._asdict(),
        "split_tokens": split_tokens,
        "max_tokens": args.max_tokens,
        "max_eval_tokens": args.max_eval_tokens or 0,
        "num_tokens": stream.numel(),
        "unknown_share": share,
    }
    stem = report_stem(args, run, source, mismatch)
    if stem != f"eval-{args.split}":
        print(f"another text or tokenizer than the run's: reported as {stem}, beside the run's own eval-{args.split}")
    write_reports(args, run, tokenizer, unit, data, settings, device, rows, source.describe(), mismatch, stem)
    return 0


def check_tokenizer_size(
    parser: argparse.ArgumentParser, args: argparse.Namespace, tokenizer: Any, config: TxlConfig
) -> None:
    """Ids at or above the model's vocabulary would index past its embedding; fewer tokenizer ids is harmless."""
    if len(tokenizer) > config.vocab_size:
        tokenizer_source = args.tokenizer if args.tokenizer is not None else f"MODEL_DIR {args.model_dir}"
        parser.error(
            f"vocabulary mismatch: the tokenizer ({tokenizer_source}) has {len(tokenizer)} tokens, the model's "
            f"vocab_size is {config.vocab_size}; pass the tokenizer the model was trained with (--tokenizer)"
        )


def tokenizer_mismatch(args: argparse.Namespace, run: RunFolder, tokenizer: Any, config: TxlConfig) -> str | None:
    """How a `--tokenizer`'s ids may not be the model's, in words (no path: the report keeps it, and is published):
    they differ from MODEL_DIR's own tokenizer's, or, where it has none, its size is not the model's vocab_size. None
    where nothing says so (MODEL_DIR's own tokenizer is the model's: a fine-tuned run may use fewer ids than its base
    had)."""
    if args.tokenizer is None:
        return None
    given = tokenizer.get_vocab()
    try:
        own = AutoTokenizer.from_pretrained(str(run.path)).get_vocab() if run.has_tokenizer() else None
    except (OSError, ValueError):  # (a broken own tokenizer: nothing to compare with)
        own = None
    if own is not None:
        if vocabulary_digest(own) == vocabulary_digest(given):
            return None
        moved = sum(own.get(token) not in (index, None) for token, index in given.items())
        new = sum(token not in own for token in given)
        return (
            f"it gives {moved} of its {len(given)} tokens other ids than MODEL_DIR's own tokenizer does and has {new} "
            f"tokens that one lacks ({len(own)} tokens)"
        )
    if len(tokenizer) != config.vocab_size:
        return f"it has {len(tokenizer)} tokens, the model's vocab_size is {config.vocab_size}"
    return None


def load_model(parser: argparse.ArgumentParser, run: RunFolder, config: TxlConfig, device: torch.device) -> Any:
    """The saved model in float32 on `device`."""
    model = AutoModelForCausalLM.from_pretrained(run.model_path, config=config, dtype=torch.float32).to(device)
    if not isinstance(model, TxlForCausalLM):
        parser.error(f"MODEL_DIR {run.path} loads as a {type(model).__name__}, not a TxlForCausalLM")
    return model


def write_reports(
    args: argparse.Namespace,
    run: RunFolder,
    tokenizer: Any,
    unit: str,
    data: dict[str, Any],
    settings: Settings,
    device: torch.device,
    rows: list[dict[str, Any]],
    source: str,
    mismatch: str | None = None,
    stem: str | None = None,
) -> None:
    """<stem>.json, .md and .png in `--output` (default MODEL_DIR/eval; `stem`: `report_stem`'s, by default
    eval-<split>); `source`: the text, described; `mismatch`: how the tokenizer may not be the model's
    (`tokenizer_mismatch`)."""
    output = args.output if args.output is not None else run.eval_dir
    output.mkdir(parents=True, exist_ok=True)
    character_level = unit == "bpc"
    model_dir = run.path
    report = {
        "model_dir": str(model_dir.resolve()),
        "tokenizer": {
            "source": str(args.tokenizer) if args.tokenizer is not None else str(model_dir.resolve()),
            "kind": "character-level" if character_level else "word/subword-level",
            "class": type(tokenizer).__name__,
            "size": len(tokenizer),
            "vocabulary_sha256": vocabulary_digest(tokenizer.get_vocab()),
            "unk_token": tokenizer.unk_token,
            "mismatch": mismatch,
        },
        "unit": unit,
        "data": data,
        "settings": {
            "tgt_len": settings.tgt_len,
            "mem_lens": settings.mem_lens,
            "batch_size": settings.batch_size,
            "clamp_len": settings.clamp_len,
            "same_length": settings.same_length,
            "device": str(device),
            "dtype": args.dtype,
        },
        "rows": rows,
        "versions": {name: _version(name) for name in ("transfoxl", "torch", "transformers")},
    }
    stem = stem or f"eval-{args.split}"
    replaced = _earlier_report(output / f"{stem}.json")
    write_json_atomically(output / f"{stem}.json", report)
    unit_note = "bpc = bits per character" if character_level else "bits/token = loss / ln 2"
    num_tokens = data["num_tokens"]
    notes = ""
    if data["unknown_share"]:
        notes += f"{data['unknown_share']:.2%} of these tokens are {tokenizer.unk_token} (outside the vocabulary).\n\n"
    if mismatch is not None:
        notes += f"Warning: the tokenizer may not be the one the model was trained with: {mismatch}.\n\n"
    markdown = (
        f"# Evaluation of `{model_dir.name}` on the {args.split} split\n\n"
        f"{num_tokens:,} tokens of {source}; segments of {settings.tgt_len}, batch size {settings.batch_size}, "
        f"clamp_len {settings.clamp_len}, same_length {settings.same_length}; {unit_note}.\n\n"
        f"{notes}{memory_lengths_table(rows, unit)}"
    )
    write_text_atomically(output / f"{stem}.md", markdown)
    title = f"{model_dir.name}: {args.split} split, {num_tokens:,} tokens, segments of {settings.tgt_len}"
    write_bytes_atomically(output / f"{stem}.png", memory_lengths_plot(rows, unit, title))
    print(f"\nwrote {stem}.json, {stem}.md and {stem}.png to {output}{replaced}")


def report_stem(args: argparse.Namespace, run: RunFolder, source: DataSource, mismatch: str | None) -> str:
    """The reports' name: eval-<split> for the run's own evaluation (its text, its tokenizer) or in an `--output`
    folder of the caller's; in the run's eval/ folder, eval-<split>-<what> for other text (a file's or dataset's name)
    or another tokenizer, so that the run's own report stays (publish.py publishes eval/ beside the run's results,
    and refuses such a report unless told)."""
    stem = f"eval-{args.split}"
    if args.output is not None:
        return stem
    if source.origin not in (str(run.train_args_path), "default"):  # text given on the command line
        files = (source.text_files or {}).get(args.split) or []
        if files:
            what = Path(files[0]).stem
        else:  # (a dataset)
            what = "-".join(filter(None, (str(source.dataset_name).split("/")[-1], source.dataset_config)))
    elif mismatch is not None:
        what = f"tokenizer-{Path(str(args.tokenizer)).name}"
    else:
        return stem
    return f"{stem}-{re.sub(r'[^A-Za-z0-9._-]+', '-', what).strip('-.')[:60] or 'other'}"


def _earlier_report(path: Path) -> str:
    """What writing `path` replaces, said (publish.py uploads the eval folder as it is), or "" for a new file."""
    if not path.exists():
        return ""
    try:
        tokens = json.loads(path.read_text(encoding="utf-8"))["data"]["num_tokens"]
        return f", replacing the earlier report ({tokens:,} tokens)"
    except (OSError, ValueError, KeyError, TypeError):
        return ", replacing an earlier report"


if __name__ == "__main__":
    raise SystemExit(main())
