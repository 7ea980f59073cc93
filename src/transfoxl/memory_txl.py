"""The Transformer-XL memory (Dai et al., 2019, Sec. 3.2), kept as transformers' `past_key_values` cache.

Per layer, `TxlMemory` keeps the hidden states that entered the layer over the latest `mem_len` positions of the
stream, detached (no gradient flows into earlier segments); `modeling_txl.py` attends to them and updates them. In
inference each layer's memory also keeps the keys and values it projected from them, so decoding a token projects
only that token. `SlidingWindow` is the storage both use: appending writes into free room instead of copying.

This file imports torch and transformers alone: `save_pretrained` copies it into a model folder beside
`modeling_txl.py`. Shapes, in its legend: B batch, M memory length, Q segment length, E width, H heads, D head width.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.utils import logging

if TYPE_CHECKING:
    from .configuration_txl import TxlConfig

logger = logging.get_logger(__name__)


_NOT_KEYS_AND_VALUES = (
    "TxlMemory holds the hidden states that entered each layer, not keys and values, so a key/value cache's "
    "update(key_states, value_states, layer_idx) does not apply (nothing was changed). The model's forward with "
    "use_cache=True updates the memory; memory.layers[i].update(hidden_states) appends one layer's input [B, Q, E]."
)


class SlidingWindow:
    """The last `max_len` entries of a sequence that grows along dimension `dim`, stored with room to append.

    Appending writes into the free room after the kept entries, so decoding one token does not copy the whole
    memory; when the room runs out, the kept entries move once to a new buffer with `room` free entries again (or
    room for two more appends as long as the last one, if that is more, up to `max_len`).
    Entries already written are never overwritten, so views handed out stay valid.
    """

    def __init__(self, dim: int, max_len: int, room: int = 64) -> None:
        self.dim, self.max_len, self.room = dim, max_len, room
        self.buffer: torch.Tensor | None = None
        self.start = self.end = 0
        self.shared_version: int | None = None  # the buffer's version when `extend` kept a tensor without copying

    @property
    def value(self) -> torch.Tensor | None:
        """The kept entries (a view), or None when empty."""
        if self.buffer is None or self.end == self.start:
            return None
        if self.shared_version is not None and self.buffer._version != self.shared_version:
            raise RuntimeError(
                "A tensor kept in the memory without a copy was modified in place after the segment that made it "
                "(a layer input seen by a forward hook?); clone it before writing into it."
            )
        return self.buffer.narrow(self.dim, self.start, self.end - self.start)

    def unshare(self) -> None:
        """Copy a tensor `extend` kept without a copy into a buffer of the window's own: before the window is handed
        to a caller, who may write into it (autograd may still hold the shared tensor for backward)."""
        if self.shared_version is not None:
            kept = self.value
            self.buffer, self.start, self.end, self.shared_version = kept.clone(), 0, kept.shape[self.dim], None

    def state(self) -> tuple:
        """What `restore` needs to undo later appends and replacements (no copy: entries written are never
        overwritten, and a buffer replaced is left as it was)."""
        return self.buffer, self.start, self.end, self.shared_version

    def restore(self, state: tuple) -> None:
        self.buffer, self.start, self.end, self.shared_version = state

    def __deepcopy__(self, memo: dict) -> SlidingWindow:
        """A window of its own: the kept entries copied into a buffer of exactly their size (a tensor kept without a
        copy is copied too, so the copy's version check starts afresh)."""
        window = SlidingWindow(self.dim, self.max_len, self.room)
        kept = self.value
        window.replace(None if kept is None else kept.detach().clone())
        memo[id(self)] = window
        return window

    def __len__(self) -> int:
        """How many entries are kept (without making a view: decoding asks once per layer per token)."""
        return self.end - self.start

    def replace(self, tensor: torch.Tensor | None) -> None:
        """Keep exactly `tensor` (its last `max_len` entries), or nothing."""
        if tensor is not None and tensor.shape[self.dim] > self.max_len:
            tensor = tensor.narrow(self.dim, tensor.shape[self.dim] - self.max_len, self.max_len)
        self.buffer, self.start, self.shared_version = tensor, 0, None
        self.end = 0 if tensor is None else tensor.shape[self.dim]

    def append(self, new: torch.Tensor, *, write: bool = True) -> torch.Tensor:
        """Append `new`; return a view of the kept entries followed by `new`, then keep only the last `max_len`.
        `write=False` makes the room for `new`'s entries without writing them: the caller writes them into the last
        entries of the view returned, before anything reads the window (decoding's fused steps, `append_room`)."""
        count = new.shape[self.dim]
        buffer = self.buffer
        # With gradients on, views of the buffer may be saved by autograd (a checkpointed layer's inputs), which
        # forbids writing into it: use a new buffer then. Inference writes in place, except into a buffer made under
        # torch.inference_mode() when that mode is off (torch forbids it), and while tracing (torch.compile), which
        # can ask neither the buffer nor the mode.
        if (
            buffer is None
            or torch.is_grad_enabled()
            or buffer.dtype != new.dtype
            or self.end + count > buffer.shape[self.dim]
            or torch.compiler.is_compiling()
            or (buffer.is_inference() and not torch.is_inference_mode_enabled())
        ):
            kept = self.value
            kept_len = 0 if kept is None else kept.shape[self.dim]
            shape = list(new.shape)
            # Room for `room` entries, or, when entries were kept, for two more appends of this size (at most
            # max_len): segments longer than `room` (evaluation) would move the kept entries at every append. A
            # first append (a prompt, before decoding) gets `room` only.
            room = self.room if kept is None else max(self.room, min(2 * count, self.max_len))
            shape[self.dim] = kept_len + count + room
            buffer = new.new_empty(shape)
            if kept is not None:
                buffer.narrow(self.dim, 0, kept_len).copy_(kept)
            self.buffer, self.start, self.end, self.shared_version = buffer, 0, kept_len, None
        if write:
            buffer.narrow(self.dim, self.end, count).copy_(new)
        self.end += count
        full = buffer.narrow(self.dim, self.start, self.end - self.start)
        self.start = max(self.start, self.end - self.max_len)
        return full

    def append_room(self) -> torch.Tensor:
        """`append(entry, write=False)` for one entry like the kept ones (at least one): the kept entries and the new
        one's room, for a caller that writes it itself. Without making the entry when there is room (decoding asks
        three times per layer and token)."""
        buffer = self.buffer
        if (
            buffer is None
            or self.end + 1 > buffer.shape[self.dim]
            or torch.is_grad_enabled()
            or torch.compiler.is_compiling()
            or (buffer.is_inference() and not torch.is_inference_mode_enabled())
        ):
            return self.append(self.value.narrow(self.dim, 0, 1), write=False)
        self.end += 1
        full = buffer.narrow(self.dim, self.start, self.end - self.start)
        self.start = max(self.start, self.end - self.max_len)
        return full

    def room_at(self, inference_mode: bool) -> tuple[torch.Tensor, int]:
        """`append_room()` as the buffer and the index of the first entry of the view it would return (which ends
        with the new entry): for a caller that hands the buffer on whole (decoding's kernel takes the window itself),
        without making the view. The caller has seen gradients off and nothing traced, and passes
        `torch.is_inference_mode_enabled()` (asked once for every window of a token)."""
        buffer = self.buffer
        if buffer is None or self.end + 1 > buffer.shape[self.dim] or (buffer.is_inference() and not inference_mode):
            count = self.append(self.value.narrow(self.dim, 0, 1), write=False).shape[self.dim]  # (a new buffer)
            return self.buffer, self.end - count
        first = self.start
        self.end += 1
        self.start = max(first, self.end - self.max_len)
        return buffer, first

    def extend(self, new: torch.Tensor, *, private: bool = False) -> None:
        """`append` without handing anything out. With gradients on, the kept entries go into a new buffer of
        exactly their size (autograd may hold views of the old one), so that the memory carried from one training
        step to the next holds nothing but itself.

        `private`: no one but the caller holds `new`, so when the window becomes exactly `new` (a memory as long as
        the segment, the usual training set-up) it is kept without a copy: a copy per layer per step costs its time,
        and its block, outliving the step's activations around it, splits the space they free. Outside tracing only;
        a write into `new` afterwards is caught when the window is read.
        """
        if not torch.is_grad_enabled():
            self.append(new)
            return
        kept = self.value
        take_new = min(new.shape[self.dim], self.max_len)
        take_kept = 0 if kept is None else min(kept.shape[self.dim], self.max_len - take_new)
        if private and take_kept == 0 and take_new == new.shape[self.dim] and not torch.compiler.is_compiling():
            self.buffer, self.start, self.end, self.shared_version = new, 0, take_new, new._version
            return
        pieces = [new.narrow(self.dim, new.shape[self.dim] - take_new, take_new)]
        if take_kept > 0:
            pieces.insert(0, kept.narrow(self.dim, kept.shape[self.dim] - take_kept, take_kept))
        self.buffer = torch.cat(pieces, dim=self.dim)  # a copy even of one piece: never a view of the caller's tensor
        self.start, self.end, self.shared_version = 0, take_kept + take_new, None

    def map(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace the kept entries by `function(kept)` (a batch operation: reorder, repeat, select, move)."""
        kept = self.value
        self.replace(None if kept is None else function(kept))


@dataclass(frozen=True)
class LayerMemory:
    """What one layer reads of the memory for one segment: the hidden states `[B, M, E]` (None while empty) and, in
    inference, the layer's memory itself, which keeps the keys and values of those positions. A fixed value, so that
    a checkpointed layer recomputed in backward sees the memory it saw in forward (the memory moves on after it)."""

    hidden: torch.Tensor | None
    projection_store: TxlMemoryLayer | None = None


class TxlMemoryLayer(CacheLayerMixin):
    """The memory of one layer: the last `mem_len` hidden states that entered the layer, `[B, M, E]`, detached.

    During inference (eval mode, no grad) it also keeps the layer's projected keys and values of those positions,
    `[B, H, M, D]`, so that decoding a token neither projects nor copies the whole memory. They are tagged with the
    version of the weights that made them and are not used (the hidden states are projected again) once those
    weights change.
    """

    is_compileable = False
    is_croppable = False  # states that fell off the front of the memory cannot be brought back
    is_sliding = False

    def __init__(self, mem_len: int) -> None:
        super().__init__()
        self.mem_len = mem_len
        self._hidden = SlidingWindow(dim=1, max_len=mem_len)  # [B, M, E]
        self._keys = SlidingWindow(dim=2, max_len=mem_len)  # [B, H, M, D], inference only
        self._values = SlidingWindow(dim=2, max_len=mem_len)
        self.projection_version: tuple | None = None  # the weights that made _keys / _values

    @property
    def hidden(self) -> torch.Tensor | None:
        """`[B, M, E]`, or None while the memory is empty. The memory's own buffer: writing into it changes the
        memory (a layer input kept without a copy is copied first, `SlidingWindow.unshare`)."""
        self._hidden.unshare()
        return self._hidden.value

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor | None = None) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, hidden_states: torch.Tensor, *key_value_arguments, private: bool = False) -> torch.Tensor | None:
        """Append this layer's input for a segment, `[B, Q, E]`; keep the last `mem_len` positions. `private`: the
        model made `hidden_states` and hands it to no one else, so it may be kept without a copy
        (`SlidingWindow.extend`). A key/value cache's `update(keys, values, ...)` is refused, changing nothing."""
        if key_value_arguments:
            raise TypeError(_NOT_KEYS_AND_VALUES)
        if not self.is_initialized:
            self.lazy_initialization(hidden_states)
        if self.mem_len > 0:
            hidden = hidden_states.detach() if hidden_states.requires_grad else hidden_states
            self._hidden.extend(hidden, private=private)
        return self._hidden.value

    def read(self, keep_projections: bool) -> LayerMemory:
        """This layer's memory for the next segment (with its kept projections in inference), for the model, which
        only reads it."""
        return LayerMemory(self._hidden.value, self if keep_projections else None)

    def has_projections(self, projection_version: tuple) -> bool:
        """Whether keys and values of every memory position are kept, made by weights `projection_version`."""
        kept = len(self._keys)
        # (kept < the memory's length: the hidden states moved on without them)
        return self.projection_version == projection_version and kept > 0 and kept == len(self._hidden)

    def kept_as(self, dtype: torch.dtype) -> bool:
        """Whether the hidden states, keys and values are all kept as `dtype` in CPU memory (a stream continued under
        autocast may keep another type; decoding's compiled step reads float32 only)."""
        for window in (self._hidden, self._keys, self._values):  # (a loop: asked per layer and token)
            buffer = window.buffer
            if buffer is None or buffer.dtype != dtype or not buffer.is_cpu:
                return False
        return True

    def store_projections(self, keys: torch.Tensor, values: torch.Tensor, projection_version: tuple | None) -> None:
        """Keep the projections `[B, H, M + Q, D]` of the memory and a new segment (their last `mem_len`)."""
        if projection_version is None or self.mem_len == 0:
            self.drop_projections()
            return
        self._keys.replace(keys.detach())
        self._values.replace(values.detach())
        self.projection_version = projection_version

    def append_projections(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a segment's keys and values `[B, H, Q, D]`; return memory's and segment's, `[B, H, M + Q, D]`."""
        if keys.requires_grad or values.requires_grad:  # (inference needs no detached views)
            keys, values = keys.detach(), values.detach()
        return self._keys.append(keys), self._values.append(values)

    def append_projection_room(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for one more position's key and value, for a caller that writes them itself
        (`decode_layer`; `token_rooms` for `decode_layers`): `[B, H, M + 1, D]` views of the kept keys and
        values whose last entry is not written yet. Only where `has_projections`."""
        return self._keys.append_room(), self._values.append_room()

    @staticmethod
    def token_rooms(
        layers: Sequence[TxlMemoryLayer], versions: Sequence[tuple]
    ) -> tuple[list[torch.Tensor], list[int]] | None:
        """Room for one more position's layer input, key and value in every layer of a memory at once, for
        decoding's step over all layers (`decode_layers`), whose caller has seen gradients off and nothing traced:
        where each layer keeps float32 CPU keys and values of all its positions, made by the weights `versions[i]`
        (`has_projections`, `kept_as`), the buffers of each layer's input, keys and values and the index of each
        window's first entry (`room_at`: the window is the kept entries and the new one's room), layer 0 first; else
        None, with nothing changed. One call per token and no view made: decoding a small model would spend a large
        share of its step on them."""
        float32 = torch.float32
        for layer, version in zip(layers, versions):
            if not (layer.has_projections(version) and layer.kept_as(float32)):
                return None
        inference_mode = torch.is_inference_mode_enabled()
        buffers, firsts = [], []
        for layer in layers:
            for window in (layer._hidden, layer._keys, layer._values):
                buffer, first = window.room_at(inference_mode)
                buffers.append(buffer)
                firsts.append(first)
        return buffers, firsts

    def state(self) -> tuple:
        """What `restore_state` needs to put this layer's memory back as it is now (no copy)."""
        return self._hidden.state(), self._keys.state(), self._values.state(), self.projection_version

    def restore_state(self, state: tuple) -> None:
        hidden, keys, values, self.projection_version = state
        self._hidden.restore(hidden)
        self._keys.restore(keys)
        self._values.restore(values)

    def drop_projections(self) -> None:
        self._keys.replace(None)
        self._values.replace(None)
        self.projection_version = None

    def get_seq_length(self) -> int:
        return len(self._hidden)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return self.mem_len

    def reset(self) -> None:
        """Forget everything: the next segment starts a new stream."""
        self._hidden.replace(None)
        self.drop_projections()

    def _apply(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch operation to every tensor held."""
        for window in (self._hidden, self._keys, self._values):
            window.map(function)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._apply(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._apply(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._apply(lambda tensor: tensor[indices])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise ValueError(
                "TxlMemory cannot be cropped: the memory keeps only the last mem_len hidden states, so the states "
                "that a rollback would need are gone. Assisted decoding and other rollbacks are not supported."
            )

    def offload(self) -> None:
        self._apply(lambda tensor: tensor.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        hidden = self._hidden.value
        if hidden is not None and hidden.device != self.device:
            self._apply(lambda tensor: tensor.to(self.device, non_blocking=True))

    @property
    def batch_size(self) -> int:
        hidden = self._hidden.value
        return -1 if hidden is None else hidden.shape[0]


class TxlMemory(Cache):
    """Transformer-XL memory, passed to the model as `past_key_values` and returned in its output.

    Contract:
    - Per layer it stores the hidden states that *entered* that layer over the latest positions of the stream:
      `memory.layers[i].hidden` is `[B, M, E]` with `M <= mem_len` (or `None` while empty). Training and the paper use
      only these: each forward projects them again with the layer's current weights. In inference (eval mode, no grad)
      the layers also keep their projected keys and values `[B, H, M, D]`, so decoding a token costs O(M) attention
      instead of re-projecting the memory; the outputs are the same.
    - `padding` `[B, M]` (bool, True = the position was padding, or `None` when nothing was ever padded) is shared by
      the layers; padded positions are never attended to, in the segment or later from the memory.
    - Everything it holds is detached: gradients never flow into earlier segments (truncated back-propagation).
    - A forward with `use_cache=True` (and `generate()`) updates it **in place** and returns the same object: after a
      segment of Q tokens it holds the last `min(M + Q, mem_len)` positions. Older states fall off the front and cannot
      come back, so `crop` refuses to remove anything. A forward cut short (an interrupt, an error) leaves it as it
      was before the call (`state` / `restore_state`).
    - An empty memory (`M = 0`) starts a new stream; `reset()` empties it. `mem_len = 0` keeps nothing.
    - Batch operations for generation (`reorder_cache` for beam search, `batch_repeat_interleave`,
      `batch_select_indices`) apply to every tensor it holds.

    `TxlMemory.from_legacy(mems)` and `to_legacy()` convert to and from transformers v4's `mems`
    (a list of `[M, B, E]` tensors, one per layer).
    """

    def __init__(self, num_layers: int, mem_len: int) -> None:
        # (numbers.Integral: numpy's integers too, which a config or an argument read from an array may hold)
        integers = all(
            isinstance(value, numbers.Integral) and not isinstance(value, bool) for value in (num_layers, mem_len)
        )
        if not integers or num_layers < 1 or mem_len < 0:
            raise ValueError(
                f"TxlMemory needs integers num_layers >= 1 and mem_len >= 0, got {num_layers!r} and {mem_len!r}."
            )
        num_layers, mem_len = int(num_layers), int(mem_len)
        super().__init__(layers=[TxlMemoryLayer(mem_len) for _ in range(num_layers)])
        self.mem_len = mem_len
        self._padding = SlidingWindow(dim=1, max_len=mem_len)  # [B, M] bool, True = padding
        self._token_ids = SlidingWindow(dim=1, max_len=mem_len)  # [B, <= M] ids of the latest tokens, -1 = unknown
        # Tokens of the stream run through the model so far (per row; padding included); None once unknown: a
        # forward traced by torch.compile / torch.export does not count (a Python counter would be a guard that
        # changes every call, recompiling each time).
        self.seen_tokens: int | None = 0
        self._input_is_new = False  # see `input_is_new`
        self._expected: tuple | None = None  # see `expect_tokens`

    def update(self, *arguments, **keywords) -> None:
        """Refused, changing nothing: transformers' `Cache.update(key_states, value_states, layer_idx)` appends keys
        and values, which this memory does not hold. The model's forward (`use_cache=True`) updates it; one layer's
        input is appended with `memory.layers[i].update(hidden_states)`."""
        raise TypeError(_NOT_KEYS_AND_VALUES)

    @classmethod
    def from_config(cls, config: TxlConfig, mem_len: int | None = None) -> TxlMemory:
        """An empty memory for `config`'s layers, `mem_len` positions long (default: `config.mem_len`)."""
        return cls(num_layers=config.n_layer, mem_len=config.mem_len if mem_len is None else mem_len)

    @classmethod
    def for_model(cls, model: Any, mem_len: int | None = None) -> TxlMemory:
        """An empty memory for `model` (a TxlForCausalLM or TxlModel): one layer per layer it has, also where layers
        were added or removed after `config.n_layer` was set; else (another wrapper) as `from_config`."""
        base = getattr(model, "transformer", model)
        if hasattr(base, "empty_memory"):
            return base.empty_memory(mem_len)
        return cls.from_config(model.config, mem_len)

    @classmethod
    def from_legacy(cls, mems: Sequence[torch.Tensor], mem_len: int | None = None) -> TxlMemory:
        """Build a memory from v4's `mems`: one `[M, B, E]` tensor per layer (sequence first).

        `mem_len`: the most positions it keeps; by default the M it is given, right for v4's mems (always `mem_len`
        long: v4 started from zeros). Pass the model's `config.mem_len` for mems that are not full yet (`to_legacy`
        of a memory that has seen fewer tokens), or the memory would stay that short."""
        if not mems:
            raise ValueError("TxlMemory.from_legacy: `mems` is empty; pass one [M, B, E] tensor per layer.")
        shapes = {tuple(mem.shape) for mem in mems}
        if len(shapes) != 1 or any(mem.dim() != 3 for mem in mems):
            raise ValueError(
                f"TxlMemory.from_legacy: every layer needs a [M, B, E] tensor of one shape, got {shapes}."
            )
        memory = cls(num_layers=len(mems), mem_len=mems[0].shape[0] if mem_len is None else mem_len)
        for layer, mem in zip(memory.layers, mems):
            layer.update(mem.transpose(0, 1))  # [B, M, E]
        return memory

    def to_legacy(self) -> list[torch.Tensor] | None:
        """v4's `mems`: one `[M, B, E]` tensor per layer, or `None` while the memory is empty. v4's mems have no
        padding flags: a memory rebuilt from them attends to positions that were padding (warned)."""
        if self.get_seq_length() == 0:
            return None
        if self.padding is not None and bool(self.padding.any()):
            logger.warning(
                "TxlMemory.to_legacy: the memory holds padding, which v4's mems cannot mark; a memory rebuilt from "
                "them (TxlMemory.from_legacy) attends to those positions."
            )
        return [layer.hidden.transpose(0, 1).contiguous() for layer in self.layers]

    def get_memory(self, layer_idx: int) -> torch.Tensor | None:
        """The memory entering layer `layer_idx`, `[B, M, E]`, or `None` while empty."""
        if (
            not isinstance(layer_idx, int)
            or isinstance(layer_idx, bool)
            or not -len(self.layers) <= layer_idx < len(self.layers)
        ):
            raise IndexError(
                f"get_memory: layer_idx {layer_idx!r} is not a layer of this memory's {len(self.layers)}."
            )
        return self.layers[layer_idx].hidden

    def update_padding(
        self, segment_padding: torch.Tensor | None, *, batch: int, q_len: int, memory_length: int
    ) -> None:
        """Append the padding flags `[B, Q]` of a segment (None: no padding) to those of the `memory_length`
        positions held before it, and keep the last `mem_len`."""
        if segment_padding is None and self.padding is None:
            return
        if self.mem_len == 0:  # nothing is kept, padding flags included
            return
        device = (segment_padding if segment_padding is not None else self.padding).device
        if segment_padding is None:
            segment_padding = torch.zeros(batch, q_len, dtype=torch.bool, device=device)
        if self.padding is None:  # first padded segment: the positions already held were not padding
            self._padding.replace(torch.zeros(batch, memory_length, dtype=torch.bool, device=device))
        self._padding.append(segment_padding)

    @property
    def padding(self) -> torch.Tensor | None:
        """`[B, M]` bool, True where a memory position was padding; None when nothing was ever padded."""
        return self._padding.value

    def update_tokens(self, input_ids: torch.Tensor | None, *, batch: int, q_len: int, device: torch.device) -> None:
        """Count a segment of `q_len` tokens as seen and keep the ids of the latest ones (`input_ids` `[B, Q]`, or
        None for embedded inputs, whose ids are unknown)."""
        if torch.compiler.is_compiling():
            self.seen_tokens = None
            return
        if self.seen_tokens is None:
            return
        self.seen_tokens += q_len
        if self.mem_len > 0:
            if input_ids is None:
                input_ids = torch.full((batch, q_len), -1, dtype=torch.long, device=device)
            self._token_ids.append(input_ids.to(torch.long))

    def expect_tokens(self, input_ids: torch.Tensor | None, *, batch: int, q_len: int, device: torch.device) -> None:
        """Note, outside a forward, the segment the next forward will feed (`update_tokens`' arguments), for
        `settle_tokens` to count if that forward is traced (`torch.compile`: the forward cannot count it, see
        `update_tokens`). generate()'s hooks call both around each forward, so that a compiled forward keeps the
        count that its continuation idiom relies on (`tokens_already_seen`)."""
        self._expected = None if self.seen_tokens is None else (self.seen_tokens, input_ids, batch, q_len, device)

    def settle_tokens(self) -> None:
        """After the forward `expect_tokens` announced: where it was traced (the count then unknown), count its
        segment as an eager forward would have."""
        expected, self._expected = self._expected, None
        if expected is not None and self.seen_tokens is None:
            seen, input_ids, batch, q_len, device = expected
            self.seen_tokens = seen
            self.update_tokens(input_ids, batch=batch, q_len=q_len, device=device)

    @contextlib.contextmanager
    def input_is_new(self) -> Iterator[TxlMemory]:
        """While active, `generate()` takes every token of its input as new to this memory, whatever it begins with
        (no continuation idiom, `tokens_already_seen` is 0): for a caller that knows it passes only new tokens.

            with memory.input_is_new():
                model.generate(new_ids, past_key_values=memory, max_new_tokens=20)
        """
        previous, self._input_is_new = self._input_is_new, True
        try:
            yield self
        finally:
            self._input_is_new = previous

    def tokens_already_seen(self, input_ids: torch.Tensor) -> int:
        """How many leading tokens of `input_ids` `[B, L]` this memory has already run through the model.

        transformers' continuation idiom, `generate(out.sequences, past_key_values=out.cache)`, passes the
        whole sequence again, while this package's convention is to pass only tokens that are new to the memory.
        The two are told apart by the ids: when `input_ids` is longer than the `seen_tokens` of the stream and its
        tokens just before position `seen_tokens` are the ones the memory holds (all of them while the stream is
        shorter than `mem_len`), the first `seen_tokens` are the memory's; 0 otherwise, while `seen_tokens` is
        unknown (None: after a compiled or exported forward, until `reset()`), and inside `input_is_new()`.
        """
        return self._seen_prefix(input_ids, self._token_ids.value, lambda given, kept: torch.equal(given.long(), kept))

    def embeddings_already_seen(self, inputs_embeds: torch.Tensor) -> int:
        """`tokens_already_seen` for `generate(inputs_embeds=...)` `[B, L, E]`, whose continuation idiom always
        passes the whole sequence's embeddings again. Told apart from new embeddings by the first layer's memory,
        which holds the embeddings it was given (in eval mode, without dropout): equal within the rounding of an
        embedding computed for another number of tokens."""

        def close(given: torch.Tensor, kept: torch.Tensor) -> bool:
            tolerance = 1e-4 if kept.dtype in (torch.float32, torch.float64) else 2e-2
            scale = float(kept.abs().max()) or 1.0
            return torch.allclose(given.to(kept.dtype), kept, rtol=tolerance, atol=tolerance * scale)

        return self._seen_prefix(inputs_embeds, self.layers[0].read(False).hidden, close)  # (read: no unsharing)

    def _seen_prefix(
        self, given: torch.Tensor, kept: torch.Tensor | None, same: Callable[[torch.Tensor, torch.Tensor], bool]
    ) -> int:
        """`seen_tokens` where `given` `[B, L, ...]` is longer than the stream so far and its entries just before
        position `seen_tokens` are, by `same`, the last ones the memory keeps (`kept` `[B, <= M, ...]`); else 0."""
        seen = self.seen_tokens
        if (
            self._input_is_new
            or not seen
            or kept is None
            or given.shape[1] <= seen
            or kept.shape[0] != given.shape[0]
            or kept.shape[2:] != given.shape[2:]
        ):
            return 0
        count = min(kept.shape[1], seen)
        return seen if same(given[:, seen - count : seen].to(kept.device), kept[:, -count:]) else 0

    def state(self) -> tuple:
        """What `restore_state` needs to put the memory back as it is now (no copy): the model takes it before a
        forward updates the memory and restores it if the forward is cut short."""
        layers = tuple(layer.state() for layer in self.layers)
        return layers, self._padding.state(), self._token_ids.state(), self.seen_tokens

    def restore_state(self, state: tuple) -> None:
        layers, padding, token_ids, self.seen_tokens = state
        self._expected = None  # (the forward it announced was cut short)
        for layer, layer_state in zip(self.layers, layers):
            layer.restore_state(layer_state)
        self._padding.restore(padding)
        self._token_ids.restore(token_ids)

    def reset(self) -> None:
        super().reset()
        self._padding.replace(None)
        self._token_ids.replace(None)
        self.seen_tokens = 0
        self._expected = None

    def _apply_to_rows(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch operation to the per-position flags and ids (the layers apply it to their tensors)."""
        self._padding.map(function)
        self._token_ids.map(function)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._apply_to_rows(lambda rows: rows.index_select(0, beam_idx.to(rows.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._apply_to_rows(lambda rows: rows.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._apply_to_rows(lambda rows: rows[indices])

    @property
    def batch_size(self) -> int:
        return self.layers[0].batch_size

    @property
    def max_cache_len(self) -> int:
        """The most positions the memory keeps (`mem_len`), under the name of a static cache's limit (which PEFT
        reads of any cache but a DynamicCache)."""
        return self.mem_len


def is_txl_memory(value: object) -> bool:
    """Whether `value` is a `TxlMemory`: of this module, or of another copy of this file (a model folder loaded with
    `trust_remote_code=True` defines its own classes, and this package's memory and streams must work with it)."""
    if isinstance(value, TxlMemory):
        return True
    return isinstance(value, Cache) and any(
        cls.__name__ == "TxlMemory" and cls.__module__.rpartition(".")[2] == "memory_txl"
        for cls in type(value).__mro__
    )


def _flatten_memory(memory: TxlMemory) -> tuple[list[torch.Tensor | None], tuple[int, int]]:
    """The tensors of a memory (the hidden states of each layer, the padding flags, the token ids) and what
    rebuilds it around them: a memory is a pytree, so torch.export takes it as an input and gives it as an output.
    The inference-only keys and values are left out (recomputed from the hidden states). The context is the
    structure only: an exported program checks it on every call, and the memory it returns (whose token count a
    traced forward cannot keep) must be one it takes back. A memory rebuilt from its tensors has `seen_tokens` None
    (unknown)."""
    children = [layer.hidden for layer in memory.layers] + [memory.padding, memory._token_ids.value]
    return children, (len(memory.layers), memory.mem_len)


def _unflatten_memory(children: Sequence[torch.Tensor | None], context: tuple[int, int]) -> TxlMemory:
    num_layers, mem_len = context
    memory = TxlMemory(num_layers=num_layers, mem_len=mem_len)
    for layer, hidden in zip(memory.layers, children[:num_layers]):
        if hidden is not None:
            layer.update(hidden)
    memory._padding.replace(children[num_layers])
    memory._token_ids.replace(children[num_layers + 1])
    memory.seen_tokens = None
    return memory


def _flatten_memory_with_keys(memory: TxlMemory) -> tuple[list[tuple], tuple[int, int]]:
    children, context = _flatten_memory(memory)
    return [(pytree.SequenceKey(index), child) for index, child in enumerate(children)], context


pytree.register_pytree_node(
    TxlMemory,
    _flatten_memory,
    _unflatten_memory,
    serialized_type_name=f"{__name__}.TxlMemory",
    flatten_with_keys_fn=_flatten_memory_with_keys,
)
