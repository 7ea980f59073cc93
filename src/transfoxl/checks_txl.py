"""The checks of what callers pass to Transformer-XL, in one place.

The policy: every public entry point (the config, the models' forward, generate(), streams, evaluation, the CLIs)
checks its arguments once, here, and a bad one raises a `ValueError` (or `TypeError` for a wrong type) that names the
argument, the value and what was expected, before anything deep fails with a stack trace, hangs, or silently computes
something else. Internal functions trust their callers. Tensor values (token ids, masks, targets) are checked on the
host only where that costs no synchronisation (CPU tensors, or once per call), and by an assert that runs with the
kernels elsewhere and inside torch.compile.

This file imports torch alone: `save_pretrained` copies it into a model folder beside `modeling_txl.py`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

# ---------------------------------------------------------------------------------------------------------------------
# Python values


def is_integer(value: Any) -> bool:
    """An integer (numpy's included) that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


GENERATION_LENGTHS = ("max_new_tokens", "max_length", "min_new_tokens", "min_length")  # generate()'s integer settings


def _integral(value: Any) -> bool:
    """An integer, a float of an integer's value, or a 0-d integer tensor (not a bool)."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.dtype.is_floating_point and value.dtype != torch.bool
    return is_integer(value) or (isinstance(value, float) and value.is_integer())


def is_flag(value: Any) -> bool:
    """A bool, or the 0 / 1 some JSON writers use; a string such as "no" would silently count as true."""
    return isinstance(value, bool) or (is_integer(value) and value in (0, 1))


def is_positive_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def require_integer(
    value: Any, name: str, *, minimum: int | None = None, none_ok: bool = False, note: str = ""
) -> None:
    """`ValueError("{name} must be an integer >= {minimum}{note}, got {value!r}.")` unless `value` is one (or None
    with `none_ok`)."""
    if value is None and none_ok:
        return
    if not is_integer(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be an integer{bound}{' or None' if none_ok else ''}{note}, got {value!r}.")


# ---------------------------------------------------------------------------------------------------------------------
# Tensors


def tracing() -> bool:
    """Whether torch.compile, torch.export or torch.jit.trace is tracing this call: a traced graph must hold portable
    operators (not this machine's compiled ones) and keeps no Python state."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()


def autocast_on(device_type: str) -> bool:
    """`torch.is_autocast_enabled(device_type)`; False for a device autocast does not know (meta: a shape-only run,
    for which torch raises)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


def token_id_outside(ids: torch.Tensor, vocab_size: int) -> int | None:
    """A token id of `ids` outside `[0, vocab_size)` (the lowest if negative, else the highest), or None.

    Reads two numbers back to the host: a synchronisation on accelerators.
    """
    if ids.numel() == 1:  # (a decoded token: one number read back, not two reductions)
        token = int(ids)
        return token if token < 0 or token >= vocab_size else None
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        return low
    return high if high >= vocab_size else None


def check_input_ids(input_ids: Any, vocab_size: int, *, synchronize: bool = False) -> None:
    """Token ids `[B, Q]`: a non-empty integer tensor within the vocabulary. The range is checked on the host on CPU,
    or anywhere with `synchronize` (generate() checks its prompt once that way); otherwise, and inside torch.compile
    (where `int(tensor)` would break the graph), by an assert that runs with the kernels."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor of token ids [batch, seq_len], got {type(input_ids).__name__}; "
            "e.g. torch.tensor([[1, 2, 3]]) or tokenizer(text, return_tensors='pt').input_ids."
        )
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}.")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must hold integer token ids (int64), got dtype {input_ids.dtype}.")
    if input_ids.numel() == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}); pass at least one token.")
    if (synchronize or input_ids.device.type == "cpu") and not torch.compiler.is_compiling():
        bad = token_id_outside(input_ids, vocab_size)
        if bad is not None:
            raise ValueError(f"input_ids contains token id {bad}, outside the vocabulary [0, {vocab_size}).")
    else:
        torch._assert_async(
            ((input_ids >= 0) & (input_ids < vocab_size)).all(),
            f"input_ids contains a token id outside the vocabulary [0, {vocab_size}).",
        )


def check_inputs_embeds(inputs_embeds: Any, width: int, dtype: torch.dtype) -> None:
    """Embedded inputs `[B, Q, width]` in the model's `dtype` (or any floating dtype under autocast)."""
    if not isinstance(inputs_embeds, torch.Tensor) or not inputs_embeds.is_floating_point():
        what = inputs_embeds.dtype if isinstance(inputs_embeds, torch.Tensor) else type(inputs_embeds).__name__
        raise TypeError(f"inputs_embeds must be a floating-point torch.Tensor, got {what}.")
    if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != width:
        raise ValueError(f"inputs_embeds must be [batch, seq_len, {width}], got {tuple(inputs_embeds.shape)}.")
    if inputs_embeds.numel() == 0:
        raise ValueError(f"inputs_embeds is empty (shape {tuple(inputs_embeds.shape)}); pass at least one position.")
    # Under autocast the matrix products cast for themselves; otherwise a mismatch fails deep in a layer.
    if inputs_embeds.dtype != dtype and not autocast_on(inputs_embeds.device.type):
        raise ValueError(
            f"inputs_embeds has dtype {inputs_embeds.dtype}, the model's weights {dtype}: convert it with "
            "inputs_embeds.to(model.dtype), or run under torch.autocast."
        )


def check_attention_mask(attention_mask: Any, batch: int, q_len: int) -> None:
    """A `[B, Q]` mask of 1 (token) and 0 (padding) for the new tokens only."""
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(
            f"attention_mask must be a torch.Tensor [batch, seq_len] of 1 (token) and 0 (padding), got "
            f"{type(attention_mask).__name__}."
        )
    if tuple(attention_mask.shape) != (batch, q_len):
        raise ValueError(
            f"attention_mask must be [batch, seq_len] = {(batch, q_len)} like the input, got "
            f"{tuple(attention_mask.shape)}. The memory remembers its own padding: pass the mask of the new tokens "
            "only."
        )
    # Anything but 0 would count as a token: a float or additive (-inf) mask would silently hide no padding.
    checkable = attention_mask.device.type == "cpu" and not torch.compiler.is_compiling()
    if checkable and attention_mask.dtype != torch.bool:
        invalid = (attention_mask != 0) & (attention_mask != 1)
        if bool(invalid.any()):
            raise ValueError(
                "attention_mask must hold 1 (token) or 0 (padding), got the value "
                f"{attention_mask[invalid][0].item()!r}."
            )


def check_position_ids(position_ids: Any, batch: int, q_len: int) -> None:
    """`position_ids`: an integer tensor `[B, Q]` (or `[1, Q]`, for every row) of the new tokens' positions."""
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(
            f"position_ids must be a torch.Tensor [batch, seq_len] of integer positions, got "
            f"{type(position_ids).__name__}."
        )
    if position_ids.is_floating_point() or position_ids.is_complex() or position_ids.dtype == torch.bool:
        raise ValueError(f"position_ids must hold integer positions, got dtype {position_ids.dtype}.")
    if position_ids.dim() != 2 or position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != q_len:
        raise ValueError(
            f"position_ids must be [batch, seq_len] = {(batch, q_len)} (or [1, seq_len]) like the input, got "
            f"{tuple(position_ids.shape)}."
        )


# What packing collators add for flash attention's variable-length kernels (`DataCollatorWithFlattening` with
# return_flash_attn_kwargs / return_seq_idx, TRL's padding-free batches): the sequences' bounds, which the position ids
# give too.
SEQUENCE_BOUND_ARGUMENTS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def sequence_breaks(position_ids: torch.Tensor) -> torch.Tensor:
    """`[B, Q - 1]` bool: True where a position is not the one before plus 1, i.e. where a packed sequence starts
    (transformers' rule for the rows its packing collators make)."""
    return position_ids[..., 1:] != position_ids[..., :-1] + 1


def take_sequence_bounds(kwargs: dict, position_ids: torch.Tensor | None) -> None:
    """Remove the packed sequences' bounds for flash attention from `kwargs`, checked against `position_ids` (from
    which the model finds the sequences itself): the bounds alone are refused, and bounds that disagree with the
    positions."""
    if not kwargs:  # (every decoded token passes here)
        return
    given = {name: kwargs.pop(name) for name in SEQUENCE_BOUND_ARGUMENTS if name in kwargs}
    if not given:
        return
    if position_ids is None:
        raise ValueError(
            f"{', '.join(given)} describe sequences packed for flash attention's kernels; this model finds them from "
            "position_ids (restarting at each sequence): pass those too."
        )
    bounds = given.get("cu_seq_lens_q", given.get("cu_seq_lens_k"))
    if not isinstance(position_ids, torch.Tensor):  # (the forward's own check says what position_ids must be)
        return
    if not isinstance(bounds, torch.Tensor) or bounds.device.type != "cpu" or torch.compiler.is_compiling():
        return
    flat = position_ids.reshape(-1)
    starts = [0, *(sequence_breaks(flat).nonzero().flatten() + 1).tolist(), flat.numel()]
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        if name in given and given[name].tolist() != starts:
            raise ValueError(
                f"{name} {given[name].tolist()} does not bound the sequences that position_ids restart at ({starts})."
            )


def check_memory_fits(held: torch.Tensor, inputs: torch.Tensor, width: int) -> None:
    """The hidden states `[B, M, E]` a memory holds fit this forward's inputs `[B, Q, E]`: batch, width, device,
    dtype (any dtype under autocast, where layers' inputs may legitimately be in another precision)."""
    mem_batch, _, mem_width = held.shape
    batch = inputs.shape[0]
    if mem_batch != batch or mem_width != width:
        raise ValueError(
            f"The memory holds batch {mem_batch} x width {mem_width}; the input needs batch {batch} x width {width}. "
            "Pass the memory returned for this same stream (or reset it)."
        )
    if held.device != inputs.device:
        raise ValueError(
            f"The memory is on device {held.device}; the input is on {inputs.device}. A memory stays on the device "
            "that built it: continue the stream there, or reset the memory."
        )
    if held.dtype != inputs.dtype and not autocast_on(inputs.device.type):
        raise ValueError(
            f"The memory holds {held.dtype} hidden states; this forward's are {inputs.dtype}. Pass a memory built by "
            "this model in its current dtype (convert the model back, or reset the memory)."
        )


def check_label_tensor(given: Any, name: str, batch: int, q_len: int) -> None:
    """`labels` / `shift_labels`: an integer tensor of the input's shape."""
    if not isinstance(given, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor [batch, seq_len] of token ids (-100: ignored), got {type(given).__name__}."
        )
    if given.is_floating_point() or given.is_complex() or given.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids (-100: ignored), got dtype {given.dtype}.")
    if tuple(given.shape) != (batch, q_len):
        raise ValueError(f"{name} must have the input's shape {(batch, q_len)}, got {tuple(given.shape)}.")


def check_positions(positions: torch.Tensor, name: str, q_len: int) -> None:
    """A 1-D integer tensor of positions among `q_len` (negative ones count from the end), as indexing takes them."""
    if positions.dim() != 1 or positions.dtype not in (torch.int64, torch.int32):  # (uint8 would index as a mask)
        raise ValueError(
            f"{name} as a tensor must be 1-D int64 or int32 positions, got shape {tuple(positions.shape)} of "
            f"{positions.dtype}."
        )
    if positions.device.type == "cpu" and not torch.compiler.is_compiling() and positions.numel() > 0:
        low, high = int(positions.min()), int(positions.max())
        if low < -q_len or high >= q_len:
            raise ValueError(
                f"{name} holds position {low if low < -q_len else high}; the input has {q_len} positions."
            )


def check_targets(targets: torch.Tensor, vocab_size: int, *, allow_all_ignored: bool, shifted: bool) -> None:
    """Aligned targets `[B, Q]` must be token ids or -100; anything else would silently add a loss of 0."""
    invalid = (targets != -100) & ((targets < 0) | (targets >= vocab_size))
    if targets.device.type == "cpu" and not torch.compiler.is_compiling():
        if bool(invalid.any()):
            bad = int(targets[invalid][0])
            raise ValueError(f"Target {bad} is neither a token id in [0, {vocab_size}) nor -100 (ignored).")
        if not allow_all_ignored and not bool((targets != -100).any()):
            hint = ""
            if shifted and targets.shape[1] == 1:  # the only position predicts labels[:, 1], which is absent
                hint = " With labels (shifted inside) a 1-token segment has no target: pass shift_labels."
            raise ValueError(f"Every target is -100 (ignored): there is nothing to compute a loss on.{hint}")
    else:  # no host synchronisation on accelerators
        torch._assert_async(~invalid.any(), f"a target is neither a token id in [0, {vocab_size}) nor -100.")


def check_num_items(num_items_in_batch: Any) -> None:
    """A negative count is nobody's count of targets; checked when it is on the host. 0 is allowed: Trainer passes it
    for a batch (or an accumulation window) without targets, which transformers' causal LMs answer with a nan loss."""
    count = num_items_in_batch
    if isinstance(count, torch.Tensor) and count.numel() == 1 and count.device.type == "cpu":
        count = count.item()
    if isinstance(count, (int, float)) and not count >= 0:
        raise ValueError(
            f"num_items_in_batch must be >= 0 (the number of targets the summed loss is divided by), got "
            f"{num_items_in_batch!r}."
        )


def _check_classes(labels: torch.Tensor, num_labels: int) -> None:
    """Class ids in [0, num_labels) or -100 (ignored); checked where that costs no device synchronisation."""
    if labels.device.type == "cpu" and not torch.compiler.is_compiling():
        invalid = (labels != -100) & ((labels < 0) | (labels >= num_labels))
        if bool(invalid.any()):
            raise ValueError(
                f"labels contains class {int(labels[invalid][0])}, outside [0, num_labels={num_labels}) "
                "(-100: ignored)."
            )


def check_class_labels(labels: Any, batch: int, num_labels: int, *, single_label: bool) -> None:
    """Class ids must be one per sequence and in range: torch's cross-entropy would raise an IndexError (or assert on
    an accelerator) without naming num_labels. Regression and multi-label targets are left to transformers' loss."""
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor of class ids [batch], got {type(labels).__name__}.")
    if labels.is_floating_point() or labels.dtype == torch.bool or num_labels == 1 or not single_label:
        return
    if labels.numel() != batch:
        raise ValueError(f"labels must hold one class id per sequence, [{batch}], got shape {tuple(labels.shape)}.")
    _check_classes(labels, num_labels)


def check_token_labels(labels: Any, shape: tuple[int, int], num_labels: int) -> None:
    """Token classes must be one per token `[B, Q]` and in range (-100: ignored): torch's cross-entropy would raise
    an IndexError (or assert on an accelerator) without naming num_labels, and a label tensor of another shape would
    be flattened against the wrong tokens."""
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor of class ids [batch, seq_len], got {type(labels).__name__}.")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise TypeError(f"labels must be integer class ids [batch, seq_len] (-100: ignored), got {labels.dtype}.")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"labels must hold one class id per token, {list(shape)}, got shape {tuple(labels.shape)}.")
    _check_classes(labels, num_labels)


def check_span_positions(start_positions: Any, end_positions: Any, batch: int) -> None:
    """An answer span's start and end, one token index each per sequence `[B]` (or `[B, 1]`): given together, as
    integers (an index past the sequence is ignored, as in transformers' question-answering heads)."""
    if (start_positions is None) != (end_positions is None):
        given, missing = ("start", "end") if end_positions is None else ("end", "start")
        raise ValueError(f"{given}_positions was given without {missing}_positions: an answer span needs both.")
    for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
        if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.dtype == torch.bool:
            kind = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise TypeError(f"{name} must be a tensor of integer token indices [batch], got {kind}.")
        if positions.numel() != batch or positions.dim() > 2:
            raise ValueError(
                f"{name} must hold one token index per sequence, [{batch}], got {tuple(positions.shape)}."
            )


# ---------------------------------------------------------------------------------------------------------------------
# generate()


def check_prompt(prompt: Any, vocab_size: int, attention_mask: Any) -> None:
    """generate()'s prompt and mask: transformers would otherwise fail deep inside (an IndexError for an empty or 1-D
    prompt) or assert on an accelerator. One synchronisation per call, not per step."""
    if isinstance(prompt, torch.Tensor) and prompt.dim() == 2 and prompt.shape[1] == 0:
        raise ValueError(
            f"generate() got an empty prompt (input_ids of shape {tuple(prompt.shape)}): pass at least one token. "
            "To continue from a memory, pass the last token not yet fed to it (TxlStream keeps it back for you)."
        )
    check_input_ids(prompt, vocab_size, synchronize=True)
    # transformers drops an all-ones mask without looking at its shape; a longer mask may also cover tokens already
    # in the memory (only the prompt's columns are used).
    if isinstance(attention_mask, torch.Tensor) and (
        attention_mask.dim() != 2
        or attention_mask.shape[0] != prompt.shape[0]
        or attention_mask.shape[1] < prompt.shape[1]
    ):
        raise ValueError(
            f"attention_mask must be [batch, seq_len] and cover the prompt {tuple(prompt.shape)}, got "
            f"{tuple(attention_mask.shape)}."
        )


def check_generation_settings(setting: Callable[[str], Any], vocab_size: int) -> None:
    """generate()'s settings (`setting(name)` gives each one's value for this call) that the memory cannot honour,
    or that would never stop or pad with an id the model cannot produce."""
    # Speculative decoding drafts several tokens and rolls the cache back to the last accepted one; the memory's
    # oldest states fall off when new ones enter, so it cannot roll back (and transformers would fail deep inside).
    for name in ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp"):
        value = setting(name)
        if value is not None and value is not False:
            raise ValueError(
                f"generate({name}=...): assisted, prompt-lookup and other speculative decoding are not supported by "
                "Transformer-XL. They roll the cache back to the last accepted token, and the memory cannot return to "
                "an earlier state (the states that left it are gone). Generate without it."
            )
    if setting("is_assistant"):  # another model's generate(assistant_model=<this model>) drafting with it
        raise ValueError(
            "A Transformer-XL model cannot be another model's assistant_model: assisted decoding crops the "
            "assistant's cache back to the last accepted token, and the memory cannot return to an earlier state. "
            "Generate without assistant_model, or use an assistant with a key/value cache."
        )
    cache_implementation = setting("cache_implementation")
    if cache_implementation not in (None, "dynamic"):  # ("dynamic", a cache that grows: what the memory does)
        raise ValueError(
            f"generate(cache_implementation={cache_implementation!r}) cannot be honoured: Transformer-XL's cache is "
            "its memory of hidden states (TxlMemory, created by generate() or passed as past_key_values), not a "
            "key/value cache. Leave cache_implementation unset."
        )
    for name in GENERATION_LENGTHS:
        value = setting(name)
        if value is not None and not _integral(value):  # (3.0 and a 0-d integer tensor run as 3, as for GPT-2)
            raise ValueError(f"{name} must be an integer, got {value!r}.")
    for name in ("eos_token_id", "pad_token_id"):
        value = setting(name)
        if value is None:
            continue
        ids = value.flatten().tolist() if isinstance(value, torch.Tensor) else value
        for token_id in ids if isinstance(ids, (list, tuple)) else [ids]:
            if not is_integer(token_id) or not 0 <= token_id < vocab_size:
                consequence = (
                    "Generation would never stop on it."
                    if name == "eos_token_id"
                    else "Finished sequences would be padded with it."
                )
                raise ValueError(
                    f"{name}={value!r}: {token_id!r} is not a token id of this model, [0, {vocab_size}). {consequence}"
                )


def check_stop_strings_tokenizer(tokenizer: Any) -> None:
    """generate(stop_strings=..., tokenizer=...): transformers' StopStringCriteria spells every token after a probe
    text it encodes; a tokenizer that cannot encode it (a word-level vocabulary, wt103's, makes it an unknown word)
    fails there with "substring not found". Checked the same way first, for a message that says what to do."""
    probe = "abcdef"  # (StopStringCriteria.clean_tokenizer_vocab's)
    try:
        ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
        spelled = tokenizer.convert_tokens_to_string([tokenizer._convert_id_to_token(token) for token in ids])
    except Exception:  # (another kind of tokenizer: transformers says what it needs)
        return
    if probe not in spelled:
        raise ValueError(
            f"generate(stop_strings=...) needs a tokenizer that spells back the text transformers probes it with, "
            f"{probe!r}, and this one gives {spelled!r}: its vocabulary cannot (a word-level one has only its words, "
            "a character-level one only its characters). Stop on token ids instead: eos_token_id=[ids] or a "
            "StoppingCriteria; or use a tokenizer that spells any text, such as a byte-level BPE."
        )


def check_token_type_ids(token_types: object, ids_shape: tuple | None = None) -> None:
    """Tokenizers made for BERT-like models return token types (all 0 for one text), and GPT-2 takes them (in its
    forward and in generate()): so is a single segment's. Transformer-XL has no token-type embedding to give a second
    one (a pair's 1s). `ids_shape`: the `[B, Q]` of the ids they go with, where known (GPT-2 fails on others)."""
    if token_types is None:
        return
    token_types = torch.as_tensor(token_types)
    if ids_shape is not None and tuple(token_types.shape) != tuple(ids_shape):
        raise ValueError(
            f"token_type_ids of shape {list(token_types.shape)} do not go with the input ids of shape "
            f"{list(ids_shape)}: one type per token expected (all 0)."
        )
    if bool(token_types.ne(0).any()):
        raise ValueError(
            "token_type_ids marks tokens of a second type (a text pair?): Transformer-XL has no token-type "
            "embedding to tell them apart. Join the texts in one sequence, or call the tokenizer with "
            "return_token_type_ids=False."
        )


def reject_unknown_arguments(kwargs: dict, input_ids: Any = None, inputs_embeds: Any = None) -> None:
    """A misspelt or v4-only argument must not be dropped silently (v4's `mems=` would lose the memory). The inputs:
    for the shape of the token types (all 0) taken alongside."""
    if "mems" in kwargs:
        raise TypeError(
            "`mems` is transformers v4's name: pass the memory as past_key_values=TxlMemory (convert a v4 list of "
            "[mem_len, batch, d_model] tensors with TxlMemory.from_legacy(mems))."
        )
    inputs = input_ids if input_ids is not None else inputs_embeds
    shape = getattr(inputs, "shape", None)
    check_token_type_ids(kwargs.pop("token_type_ids", None), None if shape is None else tuple(shape)[:2])
    if kwargs:
        raise TypeError(f"Unexpected arguments for a Transformer-XL forward: {sorted(kwargs)}.")
