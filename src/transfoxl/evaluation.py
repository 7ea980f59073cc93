"""Evaluation of a Transformer-XL language model over a token stream, the paper's way: in order, with memory.

`evaluate_stream(model, stream, tgt_len=..., mem_len=...)` reads the stream with `StreamBatcher` (segments of
`tgt_len`, `batch_size` contiguous columns), carries a memory of `mem_len` positions from segment to segment, and sums
the negative log-likelihood of every target. Working memory stays bounded whatever the stream's length: one segment of
activations plus the memory. The evaluation options (a memory longer than in training, as in the paper; the original
code's `clamp_len` and `same_length`) apply for the call only (`evaluation_settings`), the model's config is
restored afterwards.

Shape legend: `N` tokens in the stream, `B` columns (`batch_size`), `L` the segment length (`tgt_len`), `M` the memory
length (`mem_len`).
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from .batching import StreamBatcher
from .checks_txl import require_integer, token_id_outside
from .configuration_txl import MEMORY_INIT_CHOICES
from .modeling_txl import TxlMemory, input_vocab_size

__all__ = [
    "StreamEvaluation",
    "bits",
    "evaluate_memory_lengths",
    "evaluate_stream",
    "evaluation_settings",
    "is_character_level",
    "memory_lengths_plot",
    "memory_lengths_table",
    "perplexity",
    "segments_for_targets",
]

LN2 = math.log(2)


def perplexity(loss: float) -> float:
    """exp(loss) of a mean loss in nats; inf beyond float range, nan for nan (no targets)."""
    return math.inf if loss >= 700 else math.exp(loss)


def bits(loss: float) -> float:
    """A mean loss in nats, in bits (per character for a character-level tokenizer)."""
    return loss / LN2


@dataclass
class StreamEvaluation:
    """Sums over the targets of one evaluation; `merge` adds those of other columns or processes.

    `loss` is the mean negative log-likelihood per target in nats, `perplexity = exp(loss)`, `bits_per_token =
    loss / ln 2` (bits per character for a character-level tokenizer).
    """

    nll_sum: float
    num_targets: int
    tgt_len: int
    mem_len: int
    clamp_len: int
    same_length: bool

    @property
    def loss(self) -> float:
        return self.nll_sum / self.num_targets if self.num_targets else math.nan

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)

    @property
    def bits_per_token(self) -> float:
        return bits(self.loss)

    def merge(self, other: StreamEvaluation) -> StreamEvaluation:
        """The evaluation of both sets of targets (same settings; ValueError naming those that differ)."""
        settings = ("tgt_len", "mem_len", "clamp_len", "same_length")
        differing = [name for name in settings if getattr(self, name) != getattr(other, name)]
        if differing:
            raise ValueError(
                "StreamEvaluation.merge: the two evaluations were made with other settings: "
                + ", ".join(f"{name} {getattr(self, name)!r} and {getattr(other, name)!r}" for name in differing)
                + "; a merged loss would mean neither."
            )
        return StreamEvaluation(
            self.nll_sum + other.nll_sum,
            self.num_targets + other.num_targets,
            self.tgt_len,
            self.mem_len,
            self.clamp_len,
            self.same_length,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_token": self.bits_per_token,
        }


def segments_for_targets(max_targets: int, *, batch_size: int, tgt_len: int) -> int | None:
    """`--max-eval-tokens` (train.py and evaluate.py alike) as `evaluate_stream`'s `max_segments`: about
    `max_targets` targets, in whole segments of every column (at least one); 0: None, the whole stream."""
    require_integer(max_targets, "max_targets", minimum=0)
    return max(1, max_targets // (batch_size * tgt_len)) if max_targets else None


def is_character_level(tokenizer: Any) -> bool:
    """Whether every non-special token of `tokenizer` is one character: bits per token are then bits per character.
    Not for a byte-level tokenizer, whose one-symbol tokens are bytes (a byte-level BPE without merges)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and any(
        type(part).__name__ == "ByteLevel" for part in (backend.pre_tokenizer, backend.decoder)
    ):
        return False
    specials = set(getattr(tokenizer, "all_special_tokens", []))
    vocab = tokenizer.get_vocab()
    return all(len(token) == 1 for token in vocab if token not in specials)


@contextlib.contextmanager
def evaluation_settings(
    model: Any,
    *,
    clamp_len: int | None = None,
    same_length: bool | None = None,
    memory_init: str | None = None,
) -> Iterator[None]:
    """Within the block, the model's config uses `clamp_len` / `same_length` / `memory_init` (None: unchanged);
    restored on exit, also when the block raises.

    All are read at every forward, so changing them needs no new weights: the paper evaluates with a longer memory
    than it trains with, and the original code also with `clamp_len` and `same_length`.
    """
    # Every value checked before any is set: a refused one must not leave the others on the model's config.
    if clamp_len is not None:
        require_integer(clamp_len, "clamp_len", note=" (<= 0: no clamping)")
    if same_length is not None and not isinstance(same_length, bool):
        raise ValueError(f"same_length must be a bool, got {same_length!r}.")
    if memory_init is not None and memory_init not in MEMORY_INIT_CHOICES:
        raise ValueError(f"memory_init must be one of {MEMORY_INIT_CHOICES}, got {memory_init!r}.")
    config = model.config
    names = ("clamp_len", "same_length", "memory_init")
    saved = {name: getattr(config, name) for name in names}
    try:
        for name, value in zip(names, (clamp_len, same_length, memory_init)):
            if value is not None:
                setattr(config, name, int(value) if name == "clamp_len" else value)
        yield
    finally:
        for name in names:
            setattr(config, name, saved[name])


@torch.no_grad()
def evaluate_stream(
    model: Any,
    stream: torch.Tensor | Sequence[int] | StreamBatcher,
    *,
    tgt_len: int,
    mem_len: int,
    batch_size: int = 1,
    clamp_len: int | None = None,
    same_length: bool | None = None,
    max_segments: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    progress: bool | str = False,
) -> StreamEvaluation:
    """Negative log-likelihood of a token stream `[N]` read in order with a memory (model put in eval mode).

    The stream is laid out by `StreamBatcher(stream, batch_size, tgt_len, rank=rank, world_size=world_size)`: every
    token of a column but its first is a target, exactly once (with `batch_size=1`, all `N - 1` tokens after the
    first). `mem_len` may differ from the training memory (0: each segment alone). `clamp_len` / `same_length`
    override the config for this call. `max_segments` stops early (a quick estimate during training). With several
    processes each returns the sums of its own columns: add them (`StreamEvaluation.merge`, or an all-reduce).
    A `StreamBatcher` may be passed instead of a stream: it is read from its first segment, its position unchanged.
    """
    require_integer(mem_len, "mem_len", minimum=0)
    require_integer(max_segments, "max_segments", minimum=1, none_ok=True)
    if stream is None or isinstance(stream, (str, bytes)):
        raise TypeError(
            "evaluate_stream: `stream` must be token ids (a 1-D tensor or a list of ints) or a StreamBatcher, got "
            f"{type(stream).__name__}."
        )
    device = next(model.parameters()).device
    if isinstance(stream, StreamBatcher):
        batcher = stream
        # Its own layout holds: a differing argument is refused, not ignored.
        layout = {"tgt_len": tgt_len, "batch_size": batch_size, "rank": rank, "world_size": world_size}
        defaults = {"batch_size": 1, "rank": 0, "world_size": 1}
        for name, value in layout.items():
            has = getattr(batcher, name)
            if value != has and (name == "tgt_len" or value != defaults[name]):
                raise ValueError(f"The StreamBatcher has {name} {has}, evaluate_stream got {value}.")
    else:
        batcher = StreamBatcher(stream, batch_size, tgt_len, rank=rank, world_size=world_size, device=device)
    # Once, before any segment: a bad id would otherwise stop the evaluation wherever it sits in the stream.
    vocab_size = input_vocab_size(model)
    bad = token_id_outside(batcher.columns, vocab_size)
    if bad is not None:
        raise ValueError(
            f"The stream holds token id {bad}, outside the model's vocabulary [0, {vocab_size}): "
            "was it encoded with another tokenizer?"
        )
    n_segments = len(batcher) if max_segments is None else min(max_segments, len(batcher))
    was_training = model.training
    model.eval()
    memory = TxlMemory.for_model(model, mem_len) if mem_len > 0 else None
    nll_sum = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: no host sync per segment
    num_targets = 0
    description = progress if isinstance(progress, str) else f"eval mem_len={mem_len}"
    try:
        # mem_len 0 means each segment alone. Without this, a model with memory_init="zeros" (v4's behaviour) would
        # attend to config.mem_len zero vectors in every segment; v4 itself used no memory at all when mem_len was 0.
        memory_init = "empty" if mem_len == 0 else None
        with evaluation_settings(model, clamp_len=clamp_len, same_length=same_length, memory_init=memory_init):
            for index in tqdm(range(n_segments), desc=description, disable=not progress, leave=False):
                inputs, targets = batcher[index]
                inputs, targets = inputs.to(device), targets.to(device)
                output = model(
                    inputs,
                    past_key_values=memory,
                    use_cache=memory is not None,
                    shift_labels=targets,
                    return_logits=False,
                )
                nll_sum += output.losses.sum(dtype=torch.float64)
                num_targets += targets.numel()
            config = model.config
            settings = {"clamp_len": config.clamp_len, "same_length": bool(config.same_length)}
    finally:
        model.train(was_training)
    return StreamEvaluation(float(nll_sum), num_targets, tgt_len, mem_len, **settings)


def evaluate_memory_lengths(
    model: Any,
    stream: torch.Tensor | Sequence[int] | StreamBatcher,
    mem_lens: Sequence[int],
    *,
    tgt_len: int,
    clamp_len: int | None = None,
    same_length: bool | None = None,
    autocast_dtype: torch.dtype | None = None,
    max_segments: int | None = None,
    progress: bool | str = False,
) -> list[dict[str, Any]]:
    """`evaluate_stream` once per memory length (the paper's table: the same text, longer memories), one row each:
    `StreamEvaluation.to_dict()` with `seconds` and `tokens_per_second`. `autocast_dtype` (bf16, fp16) runs each
    evaluation under `torch.autocast` on the model's device; `max_segments` stops each one early (the same targets
    at every length); `progress` (a str: its label) shows a bar per length."""
    device = next(model.parameters()).device
    rows = []
    for mem_len in mem_lens:
        autocast = (
            torch.autocast(device.type, dtype=autocast_dtype)
            if autocast_dtype is not None
            else contextlib.nullcontext()
        )
        label = f"{progress} mem_len={mem_len}" if isinstance(progress, str) else progress
        started = time.perf_counter()
        with autocast:
            result = evaluate_stream(
                model,
                stream,
                tgt_len=tgt_len,
                mem_len=mem_len,
                clamp_len=clamp_len,
                same_length=same_length,
                max_segments=max_segments,
                progress=label,
            )
        seconds = time.perf_counter() - started  # (float(nll_sum) inside evaluate_stream waited for the device)
        rows.append({**result.to_dict(), "seconds": seconds, "tokens_per_second": result.num_targets / seconds})
    return rows


def memory_lengths_table(rows: Sequence[dict[str, Any]], unit: str) -> str:
    """`evaluate_memory_lengths`' rows as a Markdown table: memory length | targets | loss (nats) | perplexity |
    `unit` (bits per token: "bpc" for a character-level tokenizer)."""
    header = ["memory length", "targets", "loss (nats)", "perplexity", unit]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    for row in rows:
        cells = [
            str(row["mem_len"]),
            f"{row['num_targets']:,}",
            f"{row['loss']:.4f}",
            f"{row['perplexity']:.3f}",
            f"{row['bits_per_token']:.4f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def memory_lengths_plot(rows: Sequence[dict[str, Any]], unit: str, title: str) -> bytes:
    """`unit` (bits per token) against the memory length, as PNG bytes. Drawn on its own Agg canvas, not through
    pyplot: no display and no global pyplot state (matplotlib, of the training extra, is imported here)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = sorted((row["mem_len"], row["bits_per_token"]) for row in rows)
    figure = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([x for x, _ in points], [y for _, y in points], marker="o")
    for x, y in points:
        axes.annotate(f"{y:.4f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    if len(points) <= 8:  # the lengths evaluated as the ticks, while they do not crowd the axis
        axes.set_xticks([x for x, _ in points])
    axes.ticklabel_format(axis="y", useOffset=False)  # plain values: "4.2678", not "1e-5 + 4.267" and offsets
    axes.set_xlabel("memory length (positions)")
    axes.set_ylabel(unit)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
