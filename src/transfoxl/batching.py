"""`StreamBatcher`: the Transformer-XL layout of a token stream, ordered segments of contiguous columns.

Used by training (`transfoxl.training`, with streams from `transfoxl.data`) and by evaluation (`evaluate_stream`);
it needs torch alone, so evaluation works with the core install.

Shape legend: `N` tokens in the stream, `B` the global batch size (columns), `b = B / world_size` the columns of one
process, `T = N // B` tokens per column, `L` the segment length (`tgt_len`, shorter for the last segment).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from .checks_txl import is_integer, require_integer

__all__ = ["StreamBatcher"]


class StreamBatcher:
    """Ordered Transformer-XL segments of one token stream: `(inputs [b, L], targets [b, L])`, segment after segment.

    Layout (the original Transformer-XL `LMOrderedIterator`): the stream `[N]` is cut into `batch_size` contiguous
    columns `[B, T]`, `T = N // B`; row `c` holds tokens `[c * T, (c + 1) * T)`, and the last `N - B * T` tokens
    (fewer than `B`) are dropped. Segment `i` is positions `[i * L, i * L + L)` of every column, with targets one
    position ahead: `inputs = columns[:, s : s + L]`, `targets = columns[:, s + 1 : s + 1 + L]`. So the last target
    of segment `i` is the first input of segment `i + 1` (pass the targets as `shift_labels=`), every token of a
    column but its first is predicted exactly once per epoch, and `len(self) = ceil((T - 1) / L)` segments; the last
    one is shorter when `L` does not divide `T - 1`. Both tensors are contiguous int64, on `device`.

    Several processes: `batch_size` is the *global* batch size, a multiple of `world_size`; process `rank` owns the
    contiguous block of columns `[rank * b, (rank + 1) * b)`, `b = batch_size // world_size`, and yields only those
    rows. Concatenating the ranks' batches in rank order gives the single-process batch exactly (what
    `accelerator.gather` does), and each column's memory stays in one process.

    Position: iterating (`for inputs, targets in batcher`) yields the segments from the current position to the end
    of the epoch; at the end `epoch` goes up by one and the position goes back to 0, so the next loop reads the next
    epoch. Breaking out keeps the position (the next loop continues after the last segment yielded). `state_dict()`
    / `load_state_dict()` save and restore `(epoch, position)` for an exact resume, also with another `world_size`
    (the position is global). Empty the model's memory whenever a loop starts at position 0 (a new epoch): the first
    segment does not continue the last one.

    Attributes: `columns` (`[b, T]`, this process's columns), `column_len` (`T`), `local_batch_size` (`b`),
    `num_tokens` (`N`), `epoch`, `position` (the next segment of the epoch, `0 <= position <= len(self)`),
    `fingerprint` (a digest of the stream's ids with `fingerprint=True`, else None).
    """

    def __init__(
        self,
        stream: torch.Tensor | Sequence[int] | Any,
        batch_size: int,
        tgt_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
        fingerprint: bool = False,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("tgt_len", tgt_len), ("world_size", world_size)):
            require_integer(value, name, minimum=1)
        if not is_integer(rank) or not 0 <= rank < world_size:  # (is_integer: not a bool)
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}.")
        if batch_size % world_size:
            raise ValueError(
                f"batch_size {batch_size} (the global batch) is not a multiple of world_size {world_size}: every "
                f"process must own the same number of columns."
            )
        datasets = sys.modules.get("datasets")  # a tokenized `datasets.Dataset` (only if datasets is in use)
        if datasets is not None and isinstance(stream, datasets.Dataset):
            from .data import flatten_token_ids

            stream = flatten_token_ids(stream)
        stream = torch.as_tensor(stream)
        if stream.dim() != 1:
            raise ValueError(f"The stream must be 1-D token ids, got shape {tuple(stream.shape)}.")
        n_tokens = stream.numel()
        if n_tokens == 0:
            raise ValueError("The stream is empty: the dataset holds no tokens.")
        if stream.is_floating_point() or stream.is_complex() or stream.dtype == torch.bool:
            raise ValueError(f"The stream must hold integer token ids, got dtype {stream.dtype}.")
        column_len = n_tokens // batch_size
        if column_len < tgt_len + 1:
            raise ValueError(
                f"The stream of {n_tokens} tokens is too short for batch_size {batch_size} x (tgt_len {tgt_len} + 1) "
                f"= {batch_size * (tgt_len + 1)} tokens: each of the {batch_size} columns needs one segment of inputs "
                f"plus the target after it. Use a smaller batch_size or tgt_len, or more text."
            )
        self.batch_size = batch_size
        self.tgt_len = tgt_len
        # A digest of the whole stream (every process hashes the same), for a resume to check its tokens: kept only
        # when asked (a pass over the stream), by a training loop that saves states.
        self.fingerprint = stream_fingerprint(stream) if fingerprint else None
        self.rank = rank
        self.world_size = world_size
        self.num_tokens = n_tokens
        self.column_len = column_len
        self.local_batch_size = batch_size // world_size
        first = rank * self.local_batch_size
        # A block of whole rows of a row-major [B, T] view is itself contiguous: no copy of the stream is made. With
        # several processes the block is copied, so that the other processes' columns can be freed.
        columns = stream[: batch_size * column_len].view(batch_size, column_len)
        block = columns[first : first + self.local_batch_size]
        if world_size > 1:
            block = block.clone()
        self.columns = block.to(device=device, dtype=torch.long, copy=True)  # [b, T]: this process's own copy
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        """Segments per epoch (the same in every process)."""
        return -(-(self.column_len - 1) // self.tgt_len)

    @property
    def dropped_tokens(self) -> int:
        """Tokens at the end of the stream left out of the layout (`N - B * T`, fewer than `batch_size`)."""
        return self.num_tokens - self.batch_size * self.column_len

    @property
    def targets_per_epoch(self) -> int:
        """Targets this process predicts per epoch: `b * (T - 1)`."""
        return self.local_batch_size * (self.column_len - 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment `index` of this process (`0 <= index < len(self)`, negative from the end), without moving."""
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"segment {index} out of range: {len(self)} segments per epoch.")
        start = index * self.tgt_len
        end = min(start + self.tgt_len, self.column_len - 1)
        # Copies, never views: a caller editing its targets in place (masking, say) must not edit the stream.
        return self.columns[:, start:end].clone(), self.columns[:, start + 1 : end + 1].clone()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.position >= len(self):  # restored from a state saved right after the last segment of an epoch
            self._next_epoch()
        while self.position < len(self):
            index = self.position
            # Advance before yielding: while the caller works on segment i, the state already says "next is i + 1",
            # which is what a checkpoint taken after that step must hold.
            self.position += 1
            yield self[index]
        self._next_epoch()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next segment, for step-counted loops: after the last segment of an epoch, the first of the next one.

        After the call, `self.position == 1` means the segment returned starts an epoch (empty the memory first).
        """
        if self.position >= len(self):
            self._next_epoch()
        index = self.position
        self.position += 1
        return self[index]

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.position = 0

    def reset(self, epoch: int = 0) -> None:
        """Go back to the first segment of `epoch` (default 0)."""
        self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict[str, int | str]:
        """`epoch` and `position` (the next segment), plus the layout and stream they refer to, checked when
        loading."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "batch_size": self.batch_size,
            "tgt_len": self.tgt_len,
            "num_tokens": self.num_tokens,
            **({} if self.fingerprint is None else {"fingerprint": self.fingerprint}),
        }

    def load_state_dict(self, state: Mapping[str, int | str]) -> None:
        """Continue where `state_dict()` was taken. The stream and layout must be the same (`world_size` may differ);
        a different one raises `ValueError` naming what changed. The tokens themselves are checked where both this
        batcher and the state keep a fingerprint (`fingerprint=True`; states saved before it existed have none)."""
        for key in ("batch_size", "tgt_len", "num_tokens"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"Cannot resume: the state was saved with {key}={state[key]}, this batcher has "
                    f"{key}={getattr(self, key)}; the segments would not be the same."
                )
        if None not in (state.get("fingerprint"), self.fingerprint) and state["fingerprint"] != self.fingerprint:
            raise ValueError(
                f"Cannot resume: the state was saved on a stream of the same length ({self.num_tokens} tokens) but "
                f"other token ids; the segments would not be the same."
            )
        position = int(state["position"])
        if not 0 <= position <= len(self):
            raise ValueError(f"Cannot resume: position {position} is outside [0, {len(self)}].")
        self.epoch, self.position = int(state["epoch"]), position

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(tokens={self.num_tokens}, batch_size={self.batch_size}, tgt_len={self.tgt_len}, "
            f"rank={self.rank}, world_size={self.world_size}, segments={len(self)}, epoch={self.epoch}, "
            f"position={self.position})"
        )


def stream_fingerprint(stream: torch.Tensor, chunk: int = 1 << 24) -> str:
    """A digest of a 1-D stream's token ids (as int64 bytes, `chunk` ids at a time: no copy of the whole stream): a
    resume checks that it reads the same tokens, not only as many. About a second for WikiText-103's 103M tokens."""
    digest = hashlib.blake2b(digest_size=16)
    for part in stream.detach().split(chunk):
        digest.update(memoryview(part.to(device="cpu", dtype=torch.int64).contiguous().numpy()))
    return digest.hexdigest()
