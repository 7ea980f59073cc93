"""`TxlStream`: one Transformer-XL memory kept over a text of any length, fed in segments, generated from, fed again.

The loop it packages (and the off-by-one it hides): `model.generate(new_tokens, past_key_values=memory)` feeds
`new_tokens` to the memory and generates, but the last generated token has not been through the model yet when
generate() returns. The stream keeps such tokens as `pending` and feeds them first next time.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator

import torch
from tqdm.auto import tqdm
from transformers.generation.streamers import BaseStreamer

from .checks_txl import is_integer, require_integer, token_id_outside
from .modeling_txl import TxlForCausalLM, TxlMemory, input_vocab_size


class TxlStream:
    """A memory over a stream of tokens (or `batch_size` parallel streams).

    Example:
        >>> stream = TxlStream(model, segment_len=128, progress=True)
        >>> stream.feed(tokenizer(book, return_tensors="pt").input_ids)   # any length, in segments of 128
        >>> new_ids = stream.generate(max_new_tokens=50, do_sample=True, top_p=0.9)   # continues the book
        >>> stream.feed(tokenizer(" And then", return_tensors="pt").input_ids)        # the story goes on
        >>> more_ids = stream.generate(max_new_tokens=50)

    Memory stays bounded whatever the length fed or generated: the model's memory keeps `mem_len` positions and
    at most `segment_len` tokens wait in `pending`. Feeding and generating run in `torch.no_grad()` with the model in
    eval mode (then back in the mode it was in).

    Args:
        model: a `TxlForCausalLM`.
        batch_size: number of parallel streams; `feed` then takes `[batch_size, T]` tensors.
        segment_len: tokens per forward when feeding (default: `config.tgt_len`, else `mem_len`, else 128).
        mem_len: memory length (default: `config.mem_len`); evaluation often uses a longer one than training.
        progress: show a progress bar while feeding.
    """

    def __init__(
        self,
        model: TxlForCausalLM,
        *,
        batch_size: int = 1,
        segment_len: int | None = None,
        mem_len: int | None = None,
        progress: bool = False,
    ) -> None:
        config = model.config
        # None only means "the default": segment_len=0 is an error, not the default.
        if segment_len is None:
            segment_len = getattr(config, "tgt_len", None) or config.mem_len or 128
        for name, value, least in (
            ("batch_size", batch_size, 1),
            ("segment_len", segment_len, 1),
            ("mem_len", mem_len, 0),
        ):
            if value is not None:  # None: mem_len's default
                require_integer(value, f"TxlStream: {name}", minimum=least)
        self.model, self.batch_size, self.segment_len, self.progress = model, batch_size, segment_len, progress
        self.memory = TxlMemory.for_model(model, mem_len)
        self.device = next(model.parameters()).device
        self.pending = torch.empty(batch_size, 0, dtype=torch.long, device=self.device)  # fed, not yet run
        self.tokens_seen = 0  # per stream, pending included

    def reset(self) -> None:
        """Start over: empty memory, nothing pending."""
        self.memory.reset()
        self.pending = self.pending[:, :0]
        self.tokens_seen = 0

    def feed(self, tokens: torch.Tensor | Iterable[int] | Iterable[torch.Tensor]) -> TxlStream:
        """Append tokens to the stream: a `[T]` or `[batch_size, T]` tensor, a list of ids, or an iterator of ids or
        of such tensors (read lazily, so a text larger than memory can be streamed). Returns the stream. All or
        nothing: an error or an interrupt on the way leaves the stream as it was before the call."""
        return self._feed(tokens)

    def _feed(
        self, tokens: torch.Tensor | Iterable[int] | Iterable[torch.Tensor], kept: list | None = None
    ) -> TxlStream:
        """`feed`; each chunk of tokens `[batch_size, t]` is also appended to `kept`, where given."""
        chunks = self._chunks(tokens)
        bar = tqdm(desc="feeding", unit="tok", disable=not self.progress, total=self._length_hint(tokens))
        with bar, self._all_or_nothing():
            for chunk in chunks:
                if kept is not None:
                    kept.append(chunk)
                self.pending = torch.cat([self.pending, chunk], dim=1)
                self.tokens_seen += chunk.shape[1]
                bar.update(chunk.shape[1])
                self._run_full_segments()
        return self

    def generate(self, prompt: torch.Tensor | Iterable[int] | None = None, **generate_kwargs) -> torch.Tensor:
        """Feed `prompt` (optional), generate from everything seen, and return the new tokens `[batch_size, n]`.

        The generated tokens become part of the stream. `generate_kwargs` go to `model.generate` (max_new_tokens,
        do_sample, top_k, top_p, temperature, num_beams, streamer, stopping criteria, ...). With beam search, the best
        sequence of each stream is what the stream continues with. All or nothing, as `feed`: after an error (a bad
        argument, an interrupt, a streamer that raises) the prompt is not part of the stream. A `streamer` is told
        this call's `prompt` (none: an empty one) and then the new tokens, as generate() tells it a prompt and its
        continuation: not the tokens fed before, which generate() is given too (`pending`).
        """
        with self._all_or_nothing():
            return self._generate(prompt, **generate_kwargs)

    def _generate(self, prompt: torch.Tensor | Iterable[int] | None, **generate_kwargs) -> torch.Tensor:
        streamer = generate_kwargs.get("streamer")
        prompt_chunks = [] if streamer is not None else None
        if prompt is not None:
            self._feed(prompt, prompt_chunks)
        if self.pending.shape[1] == 0:
            raise ValueError("TxlStream.generate: nothing to continue from; feed at least one token first.")
        # What generate() will use: a keyword, else the generation_config passed, else the model's.
        settings = generate_kwargs.get("generation_config") or self.model.generation_config
        if generate_kwargs.get("num_return_sequences", getattr(settings, "num_return_sequences", 1) or 1) != 1:
            raise ValueError("TxlStream.generate returns one continuation per stream: num_return_sequences must be 1.")
        for name in ("input_ids", "past_key_values", "cache", "attention_mask"):
            if name in generate_kwargs:
                raise ValueError(f"TxlStream.generate manages `{name}` itself; pass the prompt as `prompt`.")
        if generate_kwargs.get("use_cache") is False:
            raise ValueError("TxlStream.generate continues its memory: use_cache=False would leave it behind.")
        # (use_cache=True whatever the generation config says: without the memory, the stream would lose the tokens)
        generate_kwargs["use_cache"] = True
        if streamer is not None:
            # (on the CPU, as generate() tells a streamer its prompt: a streamer may call .numpy())
            shown = (torch.cat(prompt_chunks, dim=1) if prompt_chunks else self.pending[:, :0]).cpu()
            generate_kwargs["streamer"] = _PromptShownAs(streamer, shown)
        in_place = generate_kwargs.get("num_beams", getattr(settings, "num_beams", 1) or 1) == 1
        # Beam search leaves the memory holding its running beams, so it works on a copy and the stream then feeds
        # the chosen tokens into its own memory.
        memory = self.memory if in_place else copy.deepcopy(self.memory)
        prompt_len = self.pending.shape[1]
        with self._eval_mode(), memory.input_is_new():  # the pending tokens are new, whatever they repeat
            output = self.model.generate(self.pending, past_key_values=memory, **generate_kwargs)
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        new_tokens = sequences[:, prompt_len:]
        if in_place:
            self.pending = sequences[:, -1:]  # generate() did not run the last token through the model
            self.tokens_seen += new_tokens.shape[1]
        else:
            self.feed(new_tokens)
        return new_tokens

    # -----------------------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """The stream as it was (memory, pending tokens, count) if the block raises: the memory's entries are never
        written over, so its state is a few references, no copy."""
        state = self.memory.state(), self.pending, self.tokens_seen
        try:
            yield
        except BaseException:
            memory_state, self.pending, self.tokens_seen = state
            self.memory.restore_state(memory_state)
            raise

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """The model in eval mode (dropout off) for a call, then back in the mode it was in."""
        training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(training)

    @torch.no_grad()
    def _run_full_segments(self) -> None:
        """Run segments while more than `segment_len` tokens wait, keeping at least one back for generate()."""
        if self.pending.shape[1] <= self.segment_len:
            return
        with self._eval_mode():
            while self.pending.shape[1] > self.segment_len:
                segment, self.pending = self.pending[:, : self.segment_len], self.pending[:, self.segment_len :]
                self.model(segment, past_key_values=self.memory, use_cache=True, return_logits=False)

    def _chunks(self, tokens: torch.Tensor | Iterable) -> Iterator[torch.Tensor]:
        """`[batch_size, n]` long tensors on the model's device, from any of the accepted inputs."""
        if isinstance(tokens, torch.Tensor):
            tokens = [tokens]
        elif isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
            raise TypeError(
                f"TxlStream.feed: expected token ids (a tensor, a list of ints or an iterator), got "
                f"{type(tokens).__name__}; encode text first, e.g. tokenizer(text, return_tensors='pt').input_ids."
            )
        buffer: list[int] = []
        for item in tokens:
            if is_integer(item):  # an iterator of single ids: group them to avoid one forward per id
                buffer.append(int(item))
                if len(buffer) == self.segment_len:
                    yield self._as_batch(torch.tensor(buffer))
                    buffer = []
                continue
            if not isinstance(item, (torch.Tensor, list, tuple)) and not hasattr(item, "__array__"):
                raise TypeError(f"TxlStream.feed: token ids must be integers, got {item!r} ({type(item).__name__}).")
            if buffer:  # the single ids before this chunk come first
                yield self._as_batch(torch.tensor(buffer))
                buffer = []
            yield self._as_batch(torch.as_tensor(item))
        if buffer:
            yield self._as_batch(torch.tensor(buffer))

    def _as_batch(self, chunk: torch.Tensor) -> torch.Tensor:
        if chunk.dim() == 0:  # one id
            chunk = chunk[None]
        if chunk.dim() == 1:
            chunk = chunk[None]
        if chunk.dim() != 2 or chunk.shape[0] != self.batch_size:
            hint = ""
            if chunk.dim() == 2 and self.batch_size == 1:
                hint = (
                    f" For {chunk.shape[0]} streams side by side, make the stream with TxlStream(..., batch_size=N)."
                )
            elif chunk.shape[0] == 1 and self.batch_size > 1:
                hint = (
                    f" Each chunk holds a step of every stream: a [{self.batch_size}, T] tensor (a list of one list "
                    "per stream is read as chunks of one stream each)."
                )
            raise ValueError(
                f"TxlStream.feed: expected ids of shape [T] or [{self.batch_size}, T] (one row per stream), got "
                f"{tuple(chunk.shape)}.{hint}"
            )
        if chunk.is_floating_point() or chunk.is_complex() or chunk.dtype == torch.bool:
            raise ValueError(f"TxlStream.feed: token ids must be integers, got dtype {chunk.dtype}.")
        # Checked here, before anything is kept: a bad id found later, in a forward, would leave it pending for good.
        vocab_size = input_vocab_size(self.model)
        if chunk.numel() > 0:
            bad = token_id_outside(chunk, vocab_size)
            if bad is not None:
                raise ValueError(
                    f"TxlStream.feed: token id {bad} is outside the vocabulary "
                    f"[0, {vocab_size}); nothing of this call was fed (the stream is as it was)."
                )
        return chunk.to(self.device, torch.long)

    @staticmethod
    def _length_hint(tokens: object) -> int | None:
        if isinstance(tokens, torch.Tensor):
            return tokens.shape[-1] if tokens.dim() > 0 else 1
        return len(tokens) if isinstance(tokens, (list, tuple)) and all(isinstance(t, int) for t in tokens) else None


class _PromptShownAs(BaseStreamer):
    """A streamer passed on, told `prompt` `[batch_size, n]` where generate() tells it the prompt (its first `put`),
    then whatever generate() tells it."""

    def __init__(self, streamer: BaseStreamer, prompt: torch.Tensor) -> None:
        self.streamer, self.prompt = streamer, prompt

    def put(self, value: torch.Tensor) -> None:
        prompt, self.prompt = self.prompt, None
        self.streamer.put(value if prompt is None else prompt)

    def end(self) -> None:
        self.streamer.end()
