"""Transformer-XL (Dai et al., 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
https://arxiv.org/abs/1901.02860) for transformers v5.

Segment recurrence: each layer attends to its own input for the current segment *and* to a memory of the inputs it
saw for earlier segments (at most `mem_len` positions, detached: no gradient flows into the past). Positions are
relative: a query at distance `d` from a key scores it with a sinusoid `R_d` projected by `W_{k,R}`, plus two learned
biases, u (content) and v (position). The memory travels between calls as `past_key_values`, a `TxlMemory`.

Shape legend, used in every comment of this file:
    B  batch                    Q  query (segment) length     M  memory length      K = M + Q  key length
    H  attention heads          D  head width (d_head)        E  hidden width (d_model)  F  d_inner
    V  vocabulary size          N  number of flattened tokens (B * Q)
    L  rows of the position table (>= K)                      n_i, d_i  size and width of adaptive cluster i
    (A product of sizes is written with spaces, `[H, B Q, D]`; `H*D` is the width of the heads side by side.)

Paper objects and their names here (original code / transformers v4 names in brackets):
    u, v (Sec. 3.3)                        -> content_bias, position_bias          [r_w_bias, r_r_bias]
    R (sinusoid of relative distances)     -> sinusoid_positions(...)              [pos_emb]
    W_{k,R}                                -> TxlRelativeAttention.pos_proj        [r_net]
    W_q, W_{k,E}, W_v (fused)              -> TxlRelativeAttention.qkv_proj        [qkv_net]
    terms (a) + (c) / (b) + (d), Sec. 3.3  -> content_score / position_score       [AC / BD]
    the shift of App. B                    -> relative_shift(...)                  [_rel_shift]
    adaptive input / adaptive softmax      -> TxlAdaptiveEmbedding / TxlAdaptiveLogSoftmax   [word_emb / crit]

    the memory (Sec. 3.2)                  -> TxlMemory, in memory_txl.py          [mems]

Beside this file: `fast_paths_txl.py` (what lets a decoded token skip module calls and per-token checks: bare modules,
weight identities, the results kept across inference calls, the fused decoding steps and their plans) and, with
tensor-only interfaces, `memory_txl.py` (the memory, a transformers `Cache`), `kernels_txl.py` (the hand-written CPU
kernels, each equal to its readable counterpart here), `cpp_kernels_txl.py` (the C++ kernels, compiled on first use:
attention, decoding's layers and softmax, dropout) and `checks_txl.py` (the argument checks of every entry point).
They import only torch, transformers and each other, relatively, so `save_pretrained` copies them all into a model
folder for `trust_remote_code=True`. docs/architecture.md maps the whole package.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutputWithPast,
)
from transformers.utils import logging

# Relative imports: right both inside this package and in a model folder loaded with trust_remote_code (which copies
# the files a model file imports relatively).
from .checks_txl import (
    GENERATION_LENGTHS,
    autocast_on,
    check_attention_mask,
    check_class_labels,
    check_generation_settings,
    check_input_ids,
    check_inputs_embeds,
    check_label_tensor,
    check_memory_fits,
    check_num_items,
    check_position_ids,
    check_positions,
    check_prompt,
    check_span_positions,
    check_stop_strings_tokenizer,
    check_targets,
    check_token_labels,
    check_token_type_ids,
    reject_unknown_arguments,
    require_integer,
    sequence_breaks,
    take_sequence_bounds,
    tracing,
)
from .configuration_txl import TransfoXLConfig, TxlConfig
from .fast_paths_txl import (
    _PLAN,
    KeptPositionTable,
    _dropout,
    _forward_ad_active,
    _is_bare,
    _is_bare_linear,
    _is_plain_linear,
    _layer_norm,
    _linear,
    _project,
    check_kept_position_table,
    decode_one_row,
    decode_token,
    forget_inference_results,
    kept_relative_keys,
    one_row_log_probs,
    projection_version,
    register_fused_kinds,
)
from .kernels_txl import (
    adaptive_nll,
    compiled_attention_applies,
    compiled_one_query_attention,
    compiled_relative_attention,
    compiled_relative_attention_training,
    float32_cpu_training,
    memory_linear,
    memory_linear_applies,
    one_query_attention,
    pad_relative_keys,
    relative_attention,
    relative_attention_applies,
    relative_attention_by_query_blocks,
    relu_dropout,
    shifted_product,
    softmax_dtype,
)
from .kernels_txl import dropout as kernel_dropout
from .memory_txl import LayerMemory, TxlMemory, TxlMemoryLayer, is_txl_memory

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Positions and masks


def sinusoid_positions(
    k_len: int, d_model: int, *, clamp_len: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The paper's R for the distances `K-1, K-2, ..., 0` (row r holds distance K-1-r): `[K, E]`.

    Distances above `clamp_len` (when > 0) reuse the encoding of `clamp_len`.
    """
    # Angles in float32 whatever the model's dtype: a distance of 1000 is not representable in bfloat16.
    # (An integer step: a float one makes a traced length ceil(K / 1.0), which torch.export cannot prove equal to K.)
    distances = torch.arange(k_len - 1, -1, -1, device=device, dtype=torch.float32)  # [K]
    if clamp_len > 0:
        distances = distances.clamp(max=clamp_len)
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, device=device, dtype=torch.float32) / d_model))
    angles = torch.outer(distances, inv_freq)  # [K, E/2]
    # sin and cos as two halves, not interleaved: the original's layout, which trained W_{k,R} weights expect.
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)  # [K, E]


def relative_shift(scores: torch.Tensor) -> torch.Tensor:
    """Re-index `[..., Q, K]` scores from "column r is distance K-1-r" to "column j is key position j" (App. B).

    Query i sits at stream position M + i, so it must score key j with distance M + i - j, which is column
    r = K-1-(M+i-j) = j + (Q-1-i) of the input: each row shifts left by Q-1-i. Padding one zero column in front and
    viewing the buffer with rows of length Q does exactly that. Entries above the diagonal j > M + i receive
    unrelated values; the causal mask hides them.
    """
    *batch_dims, q_len, k_len = scores.shape
    if q_len == 1:  # one query (decoding) is already indexed by key position
        return scores
    padded = F.pad(scores, (1, 0))  # [..., Q, K+1]
    padded = padded.view(*batch_dims, k_len + 1, q_len)  # same buffer, rows of length Q
    return padded[..., 1:, :].reshape(*batch_dims, q_len, k_len)


def shifted_position_scores(query: torch.Tensor, rel_key: torch.Tensor) -> torch.Tensor:
    """`relative_shift(query @ rel_key^T)` without copying the scores: query `[B, H, Q, D]`, rel_key `[H, K, D]` ->
    `[B, H, Q, K]`, a strided view (`kernels_txl.shifted_product`: the pad and copy of `relative_shift` cost about as
    much as the product itself)."""
    batch, heads, q_len, head_dim = query.shape
    if q_len == 1:  # one query (decoding) is already indexed by key position: no padding, no copy of rel_key
        return query @ rel_key.transpose(-1, -2)
    by_head = query.transpose(0, 1).reshape(heads, batch * q_len, head_dim)  # [H, B Q, D]
    return shifted_product(by_head, pad_relative_keys(rel_key), batch).transpose(0, 1)


def causal_memory_mask(
    q_len: int, mem_len_now: int, *, same_length: bool, max_mem_len: int, device: torch.device
) -> torch.Tensor | None:
    """`[Q, K]` bool mask, True where query i must not see key j; None when it would hide nothing.

    Query i (stream position M + i) sees the memory and the current segment up to itself (j <= M + i). With
    `same_length` (the original code's evaluation setting; not in the paper) every query sees the same number of
    keys: itself and the `max_mem_len - 1` positions before it, once the stream is that long. Without a memory
    (`max_mem_len` 0) that window would be empty (docs/legacy.md): the segment is then read causally.
    """
    same_length = same_length and max_mem_len > 0
    k_len = mem_len_now + q_len
    if q_len == 1 and not (same_length and k_len > max_mem_len):  # decoding one token sees every key
        return None
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    future = torch.triu(ones, diagonal=1 + mem_len_now)
    if not same_length:
        return future
    # Hidden too: keys at or before query i - (Q - excess). sym_max, not a branch: an exported graph keeps the
    # lengths symbolic (a branch fixes them at the traced ones); torch.jit.trace's lengths are tensors instead.
    excess = k_len - max_mem_len
    excess = max(excess, 0) if isinstance(excess, torch.Tensor) else torch.sym_max(excess, 0)
    return future | torch.tril(ones, diagonal=excess - q_len)


def packed_sequence_breaks(position_ids: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, Q - 1]` bool: True where a packed sequence starts, a break of the positions that is not beside padding
    (`padding` `[B, Q]`, True = padding)."""
    breaks = sequence_breaks(position_ids)
    if padding is not None:
        breaks = breaks & ~(padding[:, 1:] | padding[:, :-1])
    return breaks


def packed_sequences_mask(
    position_ids: torch.Tensor, mem_len_now: int, padding: torch.Tensor | None = None
) -> torch.Tensor | None:
    """`[B, 1, Q, K]` bool, True where a query must not see a key because they belong to different sequences packed
    in one row; None when each row is one sequence. `position_ids` `[B or 1, Q]`.

    A new sequence starts wherever a position is not the one before plus 1, as transformers finds the sequences that
    `DataCollatorWithFlattening` and TRL's padding-free packing put in one row (positions restarting at 0). The
    positions are used for nothing else: Transformer-XL's are relative. The row's first sequence continues the memory,
    as any segment does; each later one sees neither the memory nor the sequences before it. A break beside padding
    (`padding` `[B, Q]`, True = padding) starts nothing: padding's positions (GPT-2's `cumsum(mask) - 1`, filled) do
    not cut a left-padded row's tokens off its memory."""
    breaks = packed_sequence_breaks(position_ids, padding)  # [B, Q - 1]
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) and not bool(breaks.any()):
        return None
    sequence = F.pad(breaks.cumsum(dim=1), (1, 0))  # [B, Q]: 0 for the row's first sequence
    other_sequence = sequence[:, :, None] != sequence[:, None, :]  # [B, Q, Q]
    memory_hidden = (sequence != 0)[:, :, None].expand(-1, -1, mem_len_now)  # [B, Q, M]
    return torch.cat([memory_hidden, other_sequence], dim=2)[:, None]


# ---------------------------------------------------------------------------------------------------------------------
# Attention: one readable eager function and one fused SDPA function, selected by config._attn_implementation


def eager_relative_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scaling: float,
    dropout: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative multi-head attention, the four terms of Sec. 3.3 of the paper.

    The paper's score of query i and key j: (a) q_i k_j + (b) q_i W_{k,R} R_{i-j} + (c) u k_j + (d) v W_{k,R} R_{i-j}.
    (a) + (c) = (q_i + u) k_j and (b) + (d) = (q_i + v) W_{k,R} R_{i-j}: two products give all four. The sum is
    scaled by 1/sqrt(D) as in the original code (the paper's formula has no scaling).

    query `[B, H, Q, D]`; key, value `[B, H, K, D]`; rel_key `[H, K, D]` (W_{k,R} R, row r = distance K-1-r);
    content_bias, position_bias `[H, D]` (u, v); mask `[Q, K]` or `[B, 1, Q, K]` bool, True = hidden, or None.
    Returns the output `[B, H, Q, D]` and the attention probabilities `[B, H, Q, K]`.
    """
    content_score = (query + content_bias[:, None]) @ key.transpose(-1, -2)  # (a) + (c): [B, H, Q, K]
    position_score = relative_shift((query + position_bias[:, None]) @ rel_key.transpose(-1, -2))  # (b) + (d)
    scores = (content_score + position_score).mul_(scaling)  # in place: [B, H, Q, K] tensors are the big ones
    if mask is not None:
        scores.masked_fill_(mask, torch.finfo(scores.dtype).min)
    attn_weights = torch.softmax(scores, dim=-1, dtype=softmax_dtype(scores.dtype)).to(value.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=dropout > 0)
    return attn_weights @ value, attn_weights  # [B, H, Q, D], [B, H, Q, K]


def sdpa_relative_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scaling: float,
    dropout: float,
) -> torch.Tensor:
    """Same contract as `eager_relative_attention` (the output only), with softmax, dropout and the product with
    values fused.

    SDPA adds a float mask to its scaled q.k, so the positional term goes in, pre-scaled, as that mask. This fuses
    the rest but does not remove the `[B, H, Q, K]` positional tensor: memory stays O(Q K) per head.
    """
    # Scaled on the [B, H, Q, D] side, shifted as a view, masked in the one pass that materialises the bias.
    position_score = shifted_position_scores((query + position_bias[:, None]) * scaling, rel_key)  # [B, H, Q, K]
    if mask is None:
        attn_bias = position_score
    else:
        attn_bias = torch.where(mask, torch.finfo(position_score.dtype).min, position_score)
    return F.scaled_dot_product_attention(
        query + content_bias[:, None], key, value, attn_mask=attn_bias, dropout_p=dropout, scale=scaling
    )


# transformers 5.24 renamed the cache argument of generate() and of models' forward, and outputs' field, `cache`
# (`past_key_values` deprecated there, with a warning): the models take both names; generate()'s keyword arguments
# and the outputs hold the installed version's.
_GENERATE_TAKES_CACHE = tuple(int(part) for part in re.findall(r"\d+", transformers.__version__)[:2]) >= (5, 24)
_CACHE_KWARG = "cache" if _GENERATE_TAKES_CACHE else "past_key_values"


_UNKNOWN_COUNT = (
    "generate() was given a memory whose count of tokens seen is unknown (a compiled or exported forward updated it "
    "outside generate(), or it was rebuilt from its tensors): every token of the input is taken as new to it. If the "
    "input repeats text the memory has already seen (transformers' continuation idiom), pass only the new tokens; "
    "`with memory.input_is_new():` says that you do, and silences this warning."
)


def _memory_of(outputs: transformers.utils.ModelOutput) -> TxlMemory | None:
    """The memory an output holds, under the installed transformers' name for it."""
    return getattr(outputs, _CACHE_KWARG)


def _check_memory_type(memory: object, argument: str = "past_key_values") -> None:
    """A memory passed by the caller as `argument` is a TxlMemory (or None)."""
    if memory is not None and not is_txl_memory(memory):
        if isinstance(memory, Cache):  # (a key/value cache: another model's, or PEFT's prefix tuning's prefixes)
            advice = (
                "Transformer-XL's memory holds the hidden states that entered each layer (projected again with "
                "relative positions), not keys and values, so no key/value cache can stand in for it; PEFT's prefix "
                "tuning, which makes one, does not apply (prompt tuning, P-tuning and LoRA do)."
            )
        else:
            advice = "Convert v4 `mems` with TxlMemory.from_legacy(mems)."
        raise TypeError(
            f"{argument} must be a TxlMemory (the memory returned by a previous call), got "
            f"{type(memory).__name__}. {advice}"
        )


_SECOND_MEMORY = "Pass the memory once: as past_key_values or as cache (its transformers 5.24 name)."


_MEMORIES_KEPT: set[int] = set()  # id() of the memories whose state a forward running now will put back on error


def _memory_kept_on_error(forward):
    """Wraps a model's `forward(input_ids, past_key_values, ...)`: when it raises (an interrupt, an out-of-memory
    error, a label check after the layers ran), the memory passed in is put back as it was before the call
    (`TxlMemory.state`, no copy), rather than left with some layers or positions updated and others not, which later
    segments would attend to as if a stream had made it. Nothing to restore where no memory is passed (a new one is
    made), while tracing (a graph keeps no Python state), or for a memory of an older copy of memory_txl.py."""

    @functools.wraps(forward)
    def kept_on_error(self, *args, **kwargs):
        if (cache := kwargs.pop("cache", None)) is not None:  # transformers 5.24's name (generate(), its tools)
            if kwargs.get("past_key_values") is not None or (len(args) > 1 and args[1] is not None):
                raise TypeError(_SECOND_MEMORY)
            _check_memory_type(cache, "cache")
            kwargs["past_key_values"] = cache
        memory = kwargs["past_key_values"] if "past_key_values" in kwargs else args[1] if len(args) > 1 else None
        if (
            memory is None
            or torch.compiler.is_compiling()
            or not hasattr(memory, "restore_state")
            or id(memory) in _MEMORIES_KEPT  # (an outer call, TxlForCausalLM's, keeps its state already)
        ):
            return forward(self, *args, **kwargs)
        saved = memory.state()
        _MEMORIES_KEPT.add(id(memory))
        try:
            return forward(self, *args, **kwargs)
        except BaseException:
            memory.restore_state(saved)
            raise
        finally:
            _MEMORIES_KEPT.discard(id(memory))

    return kept_on_error


class TxlRelativeAttention(nn.Module):
    """Multi-head attention over `[memory; segment]` with relative positions, plus its residual and layer norm."""

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.config = config
        self.n_head, self.d_head = config.n_head, config.d_head
        self.pre_lnorm = config.pre_lnorm
        inner = config.n_head * config.d_head
        # Rows of the fused weight: [0, inner) query, [inner, 2 inner) key, [2 inner, 3 inner) value (the original's).
        self.qkv_proj = nn.Linear(config.d_model, 3 * inner, bias=False)
        self.pos_proj = nn.Linear(config.d_model, inner, bias=False)  # W_{k,R}
        self.o_proj = nn.Linear(inner, config.d_model, bias=False)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = TxlDropout(config.dropout)
        self.scaling = config.d_head**-0.5
        if config.untie_r:  # else the model owns one shared pair and passes it in
            self.content_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))  # u
            self.position_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))  # v
        self._projected_positions: KeptPositionTable | None = None  # kept_relative_keys (fast_paths_txl.py)
        # Results kept across inference calls are keyed on the weights (the objects themselves, their storage and
        # version), and on this count of training phases: torch's fused optimizers (`AdamW(fused=True)`, as train.py
        # builds it) update parameters in place without bumping their version, so a training forward or `train()`
        # starts anew. Edits through `.data` (PEFT's merge_and_unload) bump no version either: where a new stream
        # starts, the position table is also checked against a sample of its weight (`check_kept_position_table`).
        self._training_phases = 0

    # Where the compiled kernel does not apply, long segments in inference on a CPU attend up to `query_block` queries
    # at a time (`kernels_txl`'s `relative_attention_by_query_blocks`), fewer where a block's `[B, H, rows, K]` scores
    # would pass `block_bytes`: each block's scores stay in cache, the keys after its last query are skipped, and its
    # tensors stay below the size from which glibc maps fresh pages for every allocation (docs/performance-log.md).
    query_block = 64
    block_bytes = 4 * 2**20

    def _block_rows(self, query: torch.Tensor, k_len: int) -> int:
        """Queries per block: `query_block`, or the multiple of 8 (at least 8) whose scores fit `block_bytes`."""
        batch, heads = query.shape[:2]
        fitting = self.block_bytes // (batch * heads * k_len * query.element_size())
        return min(self.query_block, max(8, fitting // 8 * 8))

    @staticmethod
    def _cpu_inference(arguments: tuple, dropout: float) -> bool:
        """Whether the attention is inference on a CPU: no input needs a gradient, no dropout, no tracing (a traced
        or exported graph must hold portable operators, not this machine's compiled ones). There the compiled
        kernels (no backward) or the query blocks (out= passes) may apply. `arguments`: those of
        `eager_relative_attention`."""
        return (
            dropout == 0.0
            and arguments[0].device.type == "cpu"
            and not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in arguments[:-1]))
            and not tracing()
            and not torch._C._are_functorch_transforms_active()  # (vmap, grad: the compiled operators have no rules)
            and not _forward_ad_active()
        )

    def train(self, mode: bool = True) -> TxlRelativeAttention:
        if mode:  # (inference keeps results in eval mode only: switching back to it needs nothing)
            forget_inference_results(self)
        return super().train(mode)

    def _relative_keys(self, positions: torch.Tensor) -> torch.Tensor:
        """W_{k,R} R for the K distances of `positions` `[K, E]` (row r = distance K-1-r): `[H, K, D]`. In inference
        the whole position table is projected once and kept (`kept_relative_keys`)."""
        if (kept := kept_relative_keys(self, positions)) is not None:
            return kept
        k_len = positions.shape[0]
        return self._modules["pos_proj"](positions).view(k_len, self.n_head, self.d_head).transpose(0, 1)

    def forward(
        self,
        hidden_states: torch.Tensor,
        memory: LayerMemory | None,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        content_bias: torch.Tensor | None,
        position_bias: torch.Tensor | None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from the segment to `[memory; segment]`.

        hidden_states `[B, Q, E]`; memory: what this layer reads of the memory for this segment, or None; positions
        `[K, E]`; mask `[Q, K]` or `[B, 1, Q, K]`, True = hidden, or None; content_bias, position_bias (u, v) `[H, D]`:
        the model's shared ones, or None for this attention's own (untie_r).
        Returns the new hidden states `[B, Q, E]` and the probabilities `[B, H, Q, K]` (with `output_attentions`).
        """
        if content_bias is None:
            content_bias, position_bias = self.content_bias, self.position_bias
        batch, q_len, _ = hidden_states.shape
        hidden_memory = None if memory is None else memory.hidden  # [B, M, E]
        store = None if memory is None else memory.projection_store
        version = None if store is None else projection_version(self)
        if store is not None and version is None:  # the kept keys could not be kept in step with the weights
            store.drop_projections()
        kept = version is not None and hidden_memory is not None and store.has_projections(version)

        implementation = getattr(self.config, "_attn_implementation", None) or "eager"
        if output_attentions or implementation not in ("sdpa", "eager"):
            implementation = "eager"
        query, key, value = self._project_qkv(hidden_states, hidden_memory, kept, implementation)  # [B, H, Q|K, D]
        if kept:
            key, value = store.append_projections(key, value)  # [B, H, K, D], views: no memory copy
        elif version is not None:
            store.store_projections(key, value, version)
        rel_key = self._relative_keys(positions)  # [H, K, D]
        arguments = (query, key, value, rel_key, content_bias, position_bias, mask)
        attn_output, attn_weights = self._attend(arguments, implementation)  # [B, H, Q, D]
        attn_output = attn_output.transpose(1, 2)  # [B, Q, H, D]
        if torch.compiler.is_exporting():
            # SDPA's output traced contiguous after the transpose, so the reshape was recorded as a view; the ONNX
            # exporter decomposes SDPA into products whose output is not, and the view then fails. A copy always.
            attn_output = attn_output.clone(memory_format=torch.contiguous_format)
        attn_output = attn_output.reshape(batch, q_len, self.n_head * self.d_head)  # [B, Q, H*D]
        attn_output = _dropout(self.dropout, _project(self.o_proj, attn_output))  # [B, Q, E]
        if self.pre_lnorm:
            return hidden_states + attn_output, attn_weights
        return _layer_norm(self.layer_norm, hidden_states + attn_output), attn_weights

    def _project_qkv(
        self,
        hidden_states: torch.Tensor,
        hidden_memory: torch.Tensor | None,
        kept: bool,
        implementation: str,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The segment's queries `[B, H, Q, D]` and the keys and values `[B, H, K, D]` of `[memory; segment]`, or of
        the segment alone where the memory's are `kept`: W_q, W_{k,E} and W_v of Sec. 3.3 (one fused projection).
        hidden_states `[B, Q, E]`, hidden_memory `[B, M, E]` or None."""
        batch, q_len, _ = hidden_states.shape
        inner = self.n_head * self.d_head
        # Training after post-LN: the memory is a stop-gradient, so the keys and values of [memory; segment] come
        # from `memory_linear`, whose backward skips the memory rows' input gradient (autograd would compute it and
        # drop it at the concatenation); it concatenates them itself. Not on the eager path, the readable reference,
        # which is differentiable twice (a gradient penalty, Hessian-vector products: the dropout and loss kernels
        # give their second derivatives; the attention kernels and this one raise where one is asked of them).
        sliced = (
            not kept and hidden_memory is not None and hidden_memory.shape[1] > 0 and _is_plain_linear(self.qkv_proj)
        )
        use_memory_linear = (
            sliced
            and not self.pre_lnorm
            and implementation != "eager"
            and memory_linear_applies(hidden_memory, hidden_states)
        )
        if kept or hidden_memory is None:  # kept: the memory's keys and values are there, only the segment is new
            context = hidden_states  # [B, Q, E]
        elif not use_memory_linear:
            # Project [memory; segment], the paper's concatenation (Sec. 3.2); the memory's states are stored
            # detached (its stop-gradient SG: TxlMemoryLayer.update in memory_txl.py).
            context = torch.cat([hidden_memory, hidden_states], dim=1)  # [B, K, E]
        if self.pre_lnorm:
            context = _layer_norm(self.layer_norm, context)

        if sliced:
            # Only the segment needs queries: slicing the weight spares the memory rows' (1/6 of the projection's
            # FLOPs when M = Q). Hooks, adapters (LoRA) and quantised layers keep the module call below.
            # (post-LN: the segment's rows are `hidden_states` itself, which F.linear reads without copying the slice)
            segment = context[:, -q_len:] if self.pre_lnorm else hidden_states
            query = F.linear(segment, self.qkv_proj.weight[:inner])  # [B, Q, H*D]
            query = query.view(batch, q_len, self.n_head, self.d_head).transpose(1, 2)  # [B, H, Q, D]
            if use_memory_linear:
                key_value = memory_linear(hidden_memory, hidden_states, self.qkv_proj.weight[inner:])
            else:
                key_value = F.linear(context, self.qkv_proj.weight[inner:])  # [B, K, 2 H*D]
            k_len = key_value.shape[1]
            key_value = key_value.view(batch, k_len, 2 * self.n_head, self.d_head).transpose(1, 2)
            key, value = key_value.chunk(2, dim=1)  # [B, H, K, D] each
        else:  # the module call; the memory's queries, if any, are computed and dropped
            qkv = _project(self.qkv_proj, context).view(batch, context.shape[1], 3 * self.n_head, self.d_head)
            query, key, value = qkv.transpose(1, 2).chunk(3, dim=1)  # [B, H, K or Q, D] each
            query = query[:, :, -q_len:]  # [B, H, Q, D]
        return query, key, value

    def _attend(self, arguments: tuple, implementation: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention output `[B, H, Q, D]` (and the probabilities `[B, H, Q, K]` on the eager path, else None) for
        `arguments`, those of `eager_relative_attention`: query, key, value, rel_key, content_bias, position_bias,
        mask."""
        query, key, value, rel_key, _, _, mask = arguments
        q_len = query.shape[2]
        attn_weights = None
        # The one place where the computation path is chosen: eager (the readable reference, and the only one that
        # returns probabilities), CPU training (the compiled forward where it is built, with the torch kernel's
        # backward, else the torch kernel), decoding's one-query path, CPU inference's compiled kernel
        # (cpp_kernels_txl.py) or query blocks, or SDPA. (Decoding a token at batch 1 does not come here: TxlModel's
        # `decode_token` or the layer's `decode_one_row`, in fast_paths_txl.py, run whole layers in one compiled call.)
        dropout = self.config.dropatt if self.training else 0.0
        if implementation == "eager":
            attn_output, attn_weights = eager_relative_attention(*arguments, scaling=self.scaling, dropout=dropout)
        elif relative_attention_applies(query, key, value, rel_key, dropout):
            if (
                mask is not None  # (causal: every mask the model builds for more than one query)
                and q_len > 1
                and compiled_attention_applies(*arguments)
            ):
                attn_output = compiled_relative_attention_training(*arguments, scaling=self.scaling)
            else:
                attn_output = relative_attention(*arguments, scaling=self.scaling)
        elif q_len == 1 and dropout == 0.0:  # decoding
            if self._cpu_inference(arguments, dropout) and compiled_attention_applies(*arguments):
                attn_output = compiled_one_query_attention(*arguments, scaling=self.scaling)
            else:
                attn_output = one_query_attention(*arguments, scaling=self.scaling)
        # Longer segments: the mask is causal (every mask the model builds for more than one query), which the
        # compiled kernel and the query blocks rely on.
        elif (causal := mask is not None and self._cpu_inference(arguments, dropout)) and compiled_attention_applies(
            *arguments
        ):
            attn_output = compiled_relative_attention(*arguments, scaling=self.scaling)
        elif causal and q_len > self.query_block:
            block = self._block_rows(query, key.shape[2])
            attn_output = relative_attention_by_query_blocks(*arguments, scaling=self.scaling, block=block)
        else:
            attn_output = sdpa_relative_attention(*arguments, scaling=self.scaling, dropout=dropout)
        return attn_output, attn_weights


class TxlDropout(nn.Dropout):
    """`nn.Dropout` (same `p`, same distribution, no state) with the cheaper mask of `kernels_txl.dropout`."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return super().forward(inputs) if self.inplace else kernel_dropout(inputs, self.p, self.training)


class TxlFeedForward(nn.Module):
    """Position-wise feed-forward sub-layer with its residual and layer norm (pre- or post-LN)."""

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.pre_lnorm = config.pre_lnorm
        self.up_proj = nn.Linear(config.d_model, config.d_inner)
        self.down_proj = nn.Linear(config.d_inner, config.d_model)
        self.dropout = TxlDropout(config.dropout)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`[B, Q, E]` -> `[B, Q, E]`."""
        inputs = _layer_norm(self.layer_norm, hidden_states) if self.pre_lnorm else hidden_states
        inner = _project(self.up_proj, inputs)  # [B, Q, F]
        if torch.is_grad_enabled() or (self.training and self.dropout.p > 0) or not _is_bare_linear(self.up_proj):
            inner = relu_dropout(inner, self.dropout.p, self.training)
        else:  # inference: the product's own output (no hook holds it) is rectified in place
            inner = inner.relu_()
        output = _dropout(self.dropout, _project(self.down_proj, inner))
        if self.pre_lnorm:
            return hidden_states + output
        return _layer_norm(self.layer_norm, hidden_states + output)


class TxlLayer(GradientCheckpointingLayer):
    """One Transformer-XL layer: relative attention over `[memory; segment]`, then the feed-forward sub-layer."""

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.attention = TxlRelativeAttention(config)
        self.ffn = TxlFeedForward(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        memory: LayerMemory | None,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        content_bias: torch.Tensor | None,
        position_bias: torch.Tensor | None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Same arguments and results as `TxlRelativeAttention.forward`, through the feed-forward sub-layer too
        (`content_bias`, `position_bias`: the model's shared u and v, or None for the attention's own)."""
        if (
            hidden_states.numel() == hidden_states.shape[-1]  # one row: a token decoded at batch 1
            and memory is not None
            and not output_attentions
            and (decoded := decode_one_row(self, hidden_states, memory, positions, mask, content_bias, position_bias))
            is not None
        ):
            return decoded, None
        hidden_states, attn_weights = self.attention(
            hidden_states, memory, positions, mask, content_bias, position_bias, output_attentions
        )
        return self.ffn(hidden_states), attn_weights


register_fused_kinds(TxlLayer, TxlRelativeAttention, TxlFeedForward)


# ---------------------------------------------------------------------------------------------------------------------
# Adaptive input embedding and adaptive softmax (Baevski & Auli, 2019; Grave et al., 2017)


class TxlAdaptiveEmbedding(nn.Module):
    """Token ids `[B, Q]` -> embeddings `[B, Q, E]`, scaled by sqrt(E).

    Cluster i (token ids in `[bounds[i], bounds[i+1])`) has a table of width `d_embed // div_val**i`, projected to E.
    With `div_val == 1` there is one table for the whole vocabulary, projected only when `d_embed != d_model`.
    """

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.scale = config.d_model**0.5
        self.bounds = config.cluster_bounds
        self.embeddings = nn.ModuleList()
        self.projections = nn.ParameterList()  # [E, d_i] each
        if config.div_val == 1:
            self.embeddings.append(nn.Embedding(config.vocab_size, config.d_embed))
            if config.d_embed != config.d_model:
                self.projections.append(nn.Parameter(torch.empty(config.d_model, config.d_embed)))
        else:
            for cluster in range(len(self.bounds) - 1):
                width = config.cluster_width(cluster)
                self.embeddings.append(nn.Embedding(self.bounds[cluster + 1] - self.bounds[cluster], width))
                self.projections.append(nn.Parameter(torch.empty(config.d_model, width)))

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("weight", "num_embeddings", "embedding_dim"):  # (what code written for nn.Embedding reads)
                raise AttributeError(
                    f"TxlAdaptiveEmbedding has no single {name}: an adaptive embedding splits the vocabulary into "
                    "clusters, each a table of its own width (`embeddings[i].weight`) projected to d_model "
                    "(`projections[i]`). PEFT: prompt tuning needs prompt_tuning_init='RANDOM'; LoRA targets the "
                    "tables `embeddings.N` by name; new tokens train with the tables unfrozen beside the adapter (the "
                    "output layers share them: docs/generation.md, PEFT)."
                ) from None
            raise

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids `[B, Q]` -> `[B, Q, E]`, in the tables' dtype: under autocast a projection's output would be
        bf16 / fp16, and the whole residual stream after it, where a plain embedding's keeps the weights' dtype (and
        a memory made under autocast could then not be continued outside it)."""
        embeddings = self._embed(input_ids)
        if autocast_on(input_ids.device.type):  # (else a dtype lookup for every token)
            embeddings = embeddings.to(self.embeddings[0].weight.dtype)
        return embeddings

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if len(self.embeddings) == 1:
            embeddings = self.embeddings[0](input_ids)  # [B, Q, d_embed]
            if len(self.projections) > 0:
                embeddings = F.linear(embeddings, self.projections[0])  # [B, Q, E]
            return embeddings * self.scale
        if (
            input_ids.device.type == "cpu"
            and input_ids.numel() > 0
            and not torch.is_grad_enabled()
            and not tracing()
            and not torch._C._are_functorch_transforms_active()  # (vmap, grad: the compiled operators have no rules)
        ):
            return self._embed_by_cluster(input_ids) * self.scale
        return self._embed_masked(input_ids) * self.scale

    def _embed_masked(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Unscaled embeddings `[B, Q, E]`: every cluster embeds every token (ids outside it clamped to a valid row)
        and a mask keeps its own, a little extra arithmetic instead of a host synchronisation to find each cluster's
        tokens (accelerators, tracing). Used whenever gradients are on: every cluster's parameters then get a
        gradient, zero where no token fell, on every device (DistributedDataParallel expects every parameter used,
        and AdamW keeps moving a parameter whose gradient is zero, not one whose gradient is None)."""
        embeddings = None
        for cluster, (table, projection) in enumerate(zip(self.embeddings, self.projections)):
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            in_cluster = ((input_ids >= low) & (input_ids < high)).unsqueeze(-1)  # [B, Q, 1]
            cluster_embeddings = F.linear(table((input_ids - low).clamp(0, high - low - 1)), projection)  # [B, Q, E]
            if embeddings is None:
                embeddings = cluster_embeddings * in_cluster
            else:
                embeddings = torch.where(in_cluster, cluster_embeddings, embeddings)
        return embeddings

    def _embed_by_cluster(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Unscaled embeddings `[B, Q, E]`, each token through its own cluster only, for CPU inference: finding a
        cluster's tokens costs no synchronisation there, and the other clusters are neither computed nor read (a
        decoded token reads one table row and one projection, instead of every projection). The same values as the
        masked path (to float32 rounding: BLAS may sum a few rows in another order)."""
        if input_ids.numel() == 1:  # one token (decoding at batch 1): its cluster, found on the host
            token = int(input_ids)
            cluster = bisect.bisect_right(self.bounds, token) - 1
            if not 0 <= cluster < len(self.embeddings):
                raise IndexError(f"Token id {token} is outside the vocabulary [0, {self.bounds[-1]}).")
            table = self.embeddings._modules[str(cluster)]
            projection = self.projections[cluster]  # (by attribute: pruning or a parametrization may supply it)
            if _is_bare(table, nn.Embedding) and table.max_norm is None:  # (max_norm rescales rows on lookup)
                row = table.weight[token - self.bounds[cluster]]  # [d_i], a view
                return _linear(row, projection).view(*input_ids.shape, self.d_model)  # (one row)
            return _linear(table(input_ids - self.bounds[cluster]), projection)
        flat = input_ids.reshape(-1)
        embeddings, embedded = None, 0
        for cluster, (table, projection) in enumerate(zip(self.embeddings, self.projections)):
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            rows = ((flat >= low) & (flat < high)).nonzero().squeeze(1)  # positions of this cluster's tokens
            if rows.shape[0] == 0:
                continue
            cluster_embeddings = F.linear(table(flat.index_select(0, rows) - low), projection)  # [len(rows), E]
            if embeddings is None:
                embeddings = cluster_embeddings.new_zeros(flat.shape[0], self.d_model)
            embeddings.index_copy_(0, rows, cluster_embeddings)
            embedded += rows.shape[0]
        if embedded != flat.shape[0]:
            raise IndexError(
                f"Token ids outside the vocabulary [0, {self.bounds[-1]}): {int(flat.min())} to {int(flat.max())}."
            )
        return embeddings.view(*input_ids.shape, self.d_model)


class TxlOutputLayer(nn.Module):
    """The logits of one cluster of the adaptive softmax, `x W^T + b`: an `nn.Linear` in all but its type.

    Its own type keeps it out of PEFT's `target_modules="all-linear"` (all linear layers but the output ones): its
    weight is usually the input embedding's (tied), so merging an adapter into it would change the embedding too.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))  # [n_i, d_i]
        self.bias = nn.Parameter(torch.empty(out_features))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return F.linear(inputs, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def _float_log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last dimension in float32 whatever the model's or autocast's half precision (bf16 keeps
    about 3 significant digits: a loss or a sampling distribution would lose them); a float64 model's in float64."""
    return torch.log_softmax(logits, dim=-1, dtype=softmax_dtype(logits.dtype))


class TxlAdaptiveLogSoftmax(nn.Module):
    """Projected adaptive log-softmax: hidden states `[N, E]` -> log-probabilities `[N, V]`, or NLL of targets `[N]`.

    The head scores the `cutoffs[0]` frequent tokens plus one logit per tail cluster; a tail token's log-probability
    is its cluster's head log-probability plus its log-probability inside the cluster. Each cluster has its own
    projection from E to its width (and may share it with the input embedding, `tie_projs`) and its own bias, which is
    why torch's `nn.AdaptiveLogSoftmaxWithLoss` (no projections, no tail biases) is not a drop-in replacement.
    """

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.bounds = config.cluster_bounds
        self.n_clusters = len(self.bounds) - 1
        self.shortlist_size = self.bounds[1]
        self.div_val = config.div_val
        if self.n_clusters > 1:  # the head's extra logits, one per tail cluster
            self.cluster_weight = nn.Parameter(torch.empty(self.n_clusters - 1, config.d_embed))
            self.cluster_bias = nn.Parameter(torch.empty(self.n_clusters - 1))
        self.output_layers = nn.ModuleList()
        self.output_projections = nn.ParameterList()  # [E, d_i] each, or none
        if config.div_val == 1:
            self.output_layers.append(TxlOutputLayer(config.d_embed, config.vocab_size))
            if config.d_embed != config.d_model:
                for _ in range(self.n_clusters):
                    self.output_projections.append(nn.Parameter(torch.empty(config.d_model, config.d_embed)))
        else:
            for cluster in range(self.n_clusters):
                width = config.cluster_width(cluster)
                self.output_projections.append(nn.Parameter(torch.empty(config.d_model, width)))
                self.output_layers.append(TxlOutputLayer(width, self.bounds[cluster + 1] - self.bounds[cluster]))

    def _own_parameters(self, cluster: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Weight `[n_i, d_i]`, bias `[n_i]` and projection `[E, d_i]` (or None) of the tokens of cluster `cluster`
        (views of the parameters: no copy)."""
        if self.div_val == 1:
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            weight, bias = self.output_layers[0].weight[low:high], self.output_layers[0].bias[low:high]
        else:
            weight, bias = self.output_layers[cluster].weight, self.output_layers[cluster].bias
        projection = self.output_projections[cluster] if len(self.output_projections) > 0 else None
        return weight, bias, projection

    def _cluster_parameters(self, cluster: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`_own_parameters`, the head's weight and bias followed by one row per tail cluster (one tensor each, for
        the training kernel: a copy of the head's weight)."""
        weight, bias, projection = self._own_parameters(cluster)
        if cluster == 0 and self.n_clusters > 1:
            weight = torch.cat([weight, self.cluster_weight], dim=0)
            bias = torch.cat([bias, self.cluster_bias], dim=0)
        return weight, bias, projection

    def _cluster_logits(self, hidden_states: torch.Tensor, cluster: int) -> torch.Tensor:
        """Logits `[N, n_i]` of cluster `cluster` (for cluster 0, the head: shortlist plus one per tail cluster)."""
        weight, bias, projection = self._own_parameters(cluster)
        if projection is not None:
            hidden_states = _linear(hidden_states, projection.t())  # [N, d_i]
        logits = _linear(hidden_states, weight, bias)
        if cluster == 0 and self.n_clusters > 1:  # the tail clusters' logits: concatenated, not the head's weight
            tail_logits = F.linear(hidden_states, self.cluster_weight, self.cluster_bias)  # [N, clusters - 1]
            logits = torch.cat([logits, tail_logits], dim=-1)
        return logits

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the whole vocabulary: `[N, E]` -> `[N, V]`."""
        if (log_probs := one_row_log_probs(self, hidden_states)) is not None:  # (a decoded token: one call)
            return log_probs
        if not torch.compiler.is_compiling():  # (a traced graph keeps no state)
            self.__dict__.pop(_PLAN, None)  # (not a decoded token: what the plan holds may go)
        head_logprobs = _float_log_softmax(self._cluster_logits(hidden_states, 0))  # [N, shortlist + tails]
        if self.n_clusters == 1:
            return head_logprobs
        pieces = [head_logprobs[:, : self.shortlist_size]]
        for cluster in range(1, self.n_clusters):
            tail_logprobs = _float_log_softmax(self._cluster_logits(hidden_states, cluster))  # [N, n_i]
            pieces.append(head_logprobs[:, self.shortlist_size + cluster - 1, None] + tail_logprobs)
        return torch.cat(pieces, dim=-1)  # [N, V]

    # Training on a CPU computes the loss a chunk of rows at a time (`kernels_txl.adaptive_nll`): about this many head
    # logits per chunk (4 MB in float32). Smaller chunks save little more memory and run slower.
    loss_chunk_elements = 2**20

    def nll(self, hidden_states: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Negative log-likelihood of `targets` `[N]` under `[N, E]` hidden states: `[N]`, 0 where ignored.

        Only the clusters that hold a target are computed, and only on the rows whose target they hold. When a
        gradient will flow back to float32 CPU hidden states (no autocast, not compiling), through
        `kernels_txl.adaptive_nll`: the same values and gradients, faster and in less memory.
        """
        if float32_cpu_training(hidden_states) and not torch.compiler.is_compiling():
            clusters = [self._cluster_parameters(cluster) for cluster in range(self.n_clusters)]
            chunk_rows = max(1, self.loss_chunk_elements // (self.shortlist_size + self.n_clusters - 1))
            return adaptive_nll(
                hidden_states, targets, clusters, self.bounds, ignore_index=ignore_index, chunk_rows=chunk_rows
            )
        return self._nll(hidden_states, targets, ignore_index)

    def _nll(self, hidden_states: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """`nll` by plain autograd (the readable path)."""
        head_logprobs = _float_log_softmax(self._cluster_logits(hidden_states, 0))  # [N, shortlist + tails]
        in_head = (targets >= 0) & (targets < self.shortlist_size)
        safe_targets = torch.where(in_head, targets, 0)
        nll = -head_logprobs.gather(1, safe_targets[:, None]).squeeze(1) * in_head  # [N]
        for cluster in range(1, self.n_clusters):
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            in_cluster = (targets >= low) & (targets < high)
            if torch.compiler.is_compiling():  # static shapes: every row, the targets of other clusters masked out
                tail_logprobs = _float_log_softmax(self._cluster_logits(hidden_states, cluster))
                target_logprobs = tail_logprobs.gather(1, torch.where(in_cluster, targets - low, 0)[:, None]).squeeze(
                    1
                )
                cluster_nll = -(head_logprobs[:, self.shortlist_size + cluster - 1] + target_logprobs)
                nll = torch.where(in_cluster, cluster_nll, nll)
                continue
            rows = in_cluster.nonzero().squeeze(1)  # host sync: skip clusters not needed
            if rows.numel() == 0:
                continue
            tail_logprobs = _float_log_softmax(self._cluster_logits(hidden_states[rows], cluster))
            target_logprobs = tail_logprobs.gather(1, (targets[rows] - low)[:, None]).squeeze(1)
            nll = nll.index_put((rows,), -(head_logprobs[rows, self.shortlist_size + cluster - 1] + target_logprobs))
        return torch.where(targets == ignore_index, 0.0, nll)


# ---------------------------------------------------------------------------------------------------------------------
# Models


_NO_TRAINING_LOGITS = (
    "A training step with labels returns the loss without logits (outputs.logits is None): the [B, Q, V] "
    "log-probabilities cost a step more than the loss. Pass return_logits=True, or set model.config.return_logits = "
    "True, for code that reads them in training steps (a metric, a distillation loss)."
)


@dataclass
class TxlCausalLMOutputWithPast(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the per-token losses.

    `logits` are normalised log-probabilities `[B, Q, V]` (what an adaptive softmax yields; softmax of them gives the
    same probabilities). `losses` `[B, Q]` is the NLL of each target (0 where ignored), aligned with the targets.
    """

    losses: torch.Tensor | None = None


@dataclass
class _TrainingStepOutput(TxlCausalLMOutputWithPast):
    """The output of an eager training step that left its logits out: reading them (None) says why, once. (Not for a
    traced forward: torch.compile does not build classes that define attribute access.)"""

    def __getattribute__(self, name: str):
        value = super().__getattribute__(name)
        if value is None and name == "logits":
            logger.warning_once(_NO_TRAINING_LOGITS)
        return value


def _offload_refused(name: str, prefix: str) -> ValueError:
    return ValueError(
        f"device_map offloads {name} (offloaded weights are loaded only around each call of their own modules, and "
        "the adaptive embedding and softmax read their projections directly). Keep it on a device: more max_memory, "
        f"or a device_map that gives {name!r} a device; the layers ({prefix}layers) may be offloaded."
    )


def _check_device_map(device_map: object, prefix: str) -> None:
    """A `device_map` dict that puts the adaptive embedding or softmax on disk is refused before loading (see
    `_refuse_offloaded_adaptive_modules`). `prefix`: the base model's path in the class loaded ("transformer." or
    "")."""
    if isinstance(device_map, dict):
        for key, place in device_map.items():
            for name in (f"{prefix}word_embeddings", "adaptive_softmax"):
                holds = key in ("", name) or name.startswith(f"{key}.")  # the module or one that holds it
                if place == "disk" and (holds or key.startswith(f"{name}.")):
                    raise _offload_refused(name if holds else key, prefix)


def _refuse_offloaded_adaptive_modules(loaded: nn.Module | tuple) -> nn.Module | tuple:
    """`from_pretrained`'s result (the model, or the model and its loading info), unless `device_map` offloaded (to
    disk, or to the CPU beside accelerators) the model's adaptive embedding or softmax: accelerate's offloading loads
    a module's weights only around that module's own call, and these read their clusters' projections (parameter
    lists, never called) directly. The layers may be offloaded."""
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    for name, module in model.named_modules():
        if not isinstance(module, (TxlAdaptiveEmbedding, TxlAdaptiveLogSoftmax)):
            continue
        for part in module.modules():
            hook = part.__dict__.get("_hf_hook")
            if any(getattr(each, "offload", False) for each in getattr(hook, "hooks", (hook,))):
                raise _offload_refused(name, "" if isinstance(model, TxlModel) else "transformer.")
    return loaded


def input_vocab_size(model: nn.Module) -> int:
    """`model.input_vocab_size()`, also for a model of older code (a model folder's remote code) without it: its
    input embedding's own count of token ids, else `config.vocab_size`."""
    embedding = model.get_input_embeddings()
    bounds = getattr(embedding, "bounds", None)  # (a TxlAdaptiveEmbedding's; else an nn.Embedding's count)
    count = bounds[-1] if bounds else getattr(embedding, "num_embeddings", None)
    return count if isinstance(count, int) else model.config.vocab_size


class TxlPreTrainedModel(PreTrainedModel):
    config_class = TxlConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    # The modules a device map keeps whole, per class (transformers gathers a model's from its sub-models; FSDP's
    # auto-wrap refuses a name its model lacks). The adaptive embedding and softmax whole: their tied tables and
    # projections stay together, and transformers' device map cannot place a tied parameter of a split ParameterList.
    _no_split_modules = ["TxlLayer", "TxlAdaptiveEmbedding"]
    _supports_sdpa = True
    _supports_attention_backend = False

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """`set_attn_implementation("eager" | "sdpa")` may switch a built model: its attention reads
        `config._attn_implementation` at every forward. (transformers guesses otherwise from the module's source: it
        looks for its attention-function registry, which these two paths do not use.)"""
        return True

    # v4 stored the sinusoid's frequencies as a buffer (recomputed here), and its `.bin` files of untie_r=False
    # models hold the shared u and v again under every layer (the same tensors, as the layers referenced them).
    _keys_to_ignore_on_load_unexpected = [r"pos_emb\.inv_freq", r"layers\.\d+\.attention\.(content|position)_bias"]
    # The models without the language model's head (the base model, the classifiers) leave its keys out quietly:
    # their load report would call its biases and tail weights unexpected (GPT-2's tied head saves nothing of its own).
    _keys_to_ignore_without_the_head = [
        *_keys_to_ignore_on_load_unexpected,
        r"(^|\.)adaptive_softmax\.",
        r"(^|\.)crit\.",
    ]

    @property
    def embeddings(self) -> TxlModel:
        """The base model, which holds `word_embeddings`: `embeddings.word_embeddings` is the path where PEFT's prompt
        tuning and P-tuning look for the input embedding (else they guess a parameter of vocab_size rows: the adaptive
        embedding has none, or one whose output lacks the sqrt(d_model) scale). Not a sub-module of its own: the
        state dict and the module tree are unchanged."""
        return self.base_model

    def input_vocab_size(self) -> int:
        """The token ids the input embedding takes, `[0, n)`: its own count, not `config.vocab_size`, which a config
        shared with a model resized since (`Cls(model.config)`, then `resize_token_embeddings`) no longer says."""
        return input_vocab_size(self)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        _check_device_map(kwargs.get("device_map"), "" if issubclass(cls, TxlModel) else "transformer.")
        # Legacy `.bin` checkpoints are pickles: only ever read them with torch's restricted (weights-only) loader.
        if kwargs.get("weights_only") is False:
            raise ValueError(
                "weights_only=False is refused: a pickled checkpoint could run arbitrary code. Checkpoints load "
                "with weights_only=True (tensors only); convert anything else to safetensors first."
            )
        # The package's checked loading (clear errors for missing, corrupt or ill-fitting files) for its own classes
        # only: a remote-code copy importing an installed `transfoxl` would register the package's classes with the
        # Auto classes, and later loads of the repository would run the installed code instead of its own.
        # (Absolute, in a try: transformers copies a file's relative imports into model folders and requires the
        # packages of its other imports, outside try blocks, to be installed.)
        if __name__ != "transfoxl.modeling_txl":
            return _refuse_offloaded_adaptive_modules(super().from_pretrained(*args, **kwargs))
        try:
            from transfoxl.checkpoints import load_checked
        except ImportError:
            return _refuse_offloaded_adaptive_modules(super().from_pretrained(*args, **kwargs))
        return _refuse_offloaded_adaptive_modules(load_checked(super().from_pretrained, *args, **kwargs))

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, always in the `txl` format: a model loaded from a legacy (`transfo-xl`)
        folder is saved with its `TxlConfig` and the `txl` parameter names, so that the folder loads with plain
        transformers and `trust_remote_code=True` (whose model classes expect a `TxlConfig`)."""
        legacy_config = self.config if isinstance(self.config, TransfoXLConfig) else None
        if legacy_config is None:
            return self._save_txl(save_directory, *args, **kwargs)
        models = [module for module in self.modules() if isinstance(module, PreTrainedModel)]
        configs = [model.config for model in models]
        conversions = [model.__dict__.get("_weight_conversions") for model in models]
        modern_config = TxlConfig.from_legacy(legacy_config)
        try:
            for model in models:
                model.config = modern_config if model.config is legacy_config else model.config
                model._weight_conversions = None  # do not rename the parameters back to v4's names
            return self._save_txl(save_directory, *args, **kwargs)
        finally:
            for model, config, conversion in zip(models, configs, conversions):
                model.config = config
                if conversion is None:
                    model.__dict__.pop("_weight_conversions", None)
                else:
                    model._weight_conversions = conversion

    def _save_txl(self, save_directory, *args, **kwargs):
        embedding = self.get_input_embeddings()
        if not isinstance(embedding, TxlAdaptiveEmbedding):  # (before anything is written)
            raise TypeError(
                f"save_pretrained: the input embedding is a {type(embedding).__name__}, which the config cannot "
                "describe: from_pretrained builds a TxlAdaptiveEmbedding from vocab_size, cutoffs and div_val, so the "
                "folder would not load. Put a TxlAdaptiveEmbedding back with set_input_embeddings "
                "(resize_token_embeddings changes the vocabulary)."
            )
        # transformers records only the saved class in `auto_map`; list every head so that AutoModel and every
        # AutoModelFor... class of a head here load the folder with trust_remote_code.
        auto_map = {
            "AutoConfig": f"configuration_txl.{type(self.config).__name__}",
            "AutoModel": "modeling_txl.TxlModel",
            "AutoModelForCausalLM": "modeling_txl.TxlForCausalLM",
            "AutoModelForSequenceClassification": "modeling_txl.TxlForSequenceClassification",
            "AutoModelForTokenClassification": "modeling_txl.TxlForTokenClassification",
            "AutoModelForQuestionAnswering": "modeling_txl.TxlForQuestionAnswering",
        }
        self.config.auto_map = {**auto_map, **(getattr(self.config, "auto_map", None) or {})}
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _init_matrix(self, weight: torch.Tensor) -> None:
        if self.config.init == "uniform":
            init.uniform_(weight, -self.config.init_range, self.config.init_range)
        else:
            init.normal_(weight, mean=0.0, std=self.config.init_std)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The original code's initialisation (kept by v4), dispatched on the module that owns each tensor."""
        if isinstance(module, (nn.Linear, nn.Embedding, TxlOutputLayer)):
            self._init_matrix(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.normal_(module.weight, mean=1.0, std=self.config.init_std)
            init.zeros_(module.bias)
        elif isinstance(module, nn.ParameterList):  # adaptive embedding / softmax projections
            for projection in module:
                init.normal_(projection, mean=0.0, std=self.config.proj_init_std)
        elif isinstance(module, TxlAdaptiveLogSoftmax) and hasattr(module, "cluster_weight"):
            self._init_matrix(module.cluster_weight)
            init.zeros_(module.cluster_bias)
        elif isinstance(module, (TxlRelativeAttention, TxlModel)) and hasattr(module, "content_bias"):
            self._init_matrix(module.content_bias)
            self._init_matrix(module.position_bias)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> TxlAdaptiveEmbedding:
        """Grow (or shrink) the vocabulary at its end, as v4 did: the last cluster of the adaptive embedding (the
        whole table with a plain softmax, `cutoffs=[]`) and of the adaptive softmax gain or lose rows; the other
        clusters and `cutoffs` stay. New rows start at the mean of the cluster's rows (`mean_resizing`, the
        default) or as `_init_weights` initialises them. Returns the input embedding module.
        """
        if new_num_tokens is None and pad_to_multiple_of is None:
            return self.get_input_embeddings()
        for name, value in (("new_num_tokens", new_num_tokens), ("pad_to_multiple_of", pad_to_multiple_of)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"resize_token_embeddings: {name} must be a positive integer, got {value!r}.")
        new_num_tokens = self.config.vocab_size if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        last_cluster_start = self.config.cluster_bounds[-2]
        if new_num_tokens <= last_cluster_start:
            raise ValueError(
                f"resize_token_embeddings({new_num_tokens}): only the last cluster of the adaptive embedding can "
                f"change size, and it starts at token {last_cluster_start} (cutoffs {self.config.cutoffs}); the new "
                f"vocabulary must be larger than {last_cluster_start}."
            )
        embeddings = self.get_input_embeddings()
        table = embeddings.embeddings[-1]  # [n_i, d_i]: the last cluster's, or the whole vocabulary's (div_val 1)
        rows = new_num_tokens - (last_cluster_start if len(embeddings.embeddings) > 1 else 0)
        resized = nn.Embedding(rows, table.embedding_dim, device=table.weight.device, dtype=table.weight.dtype)
        resized.weight.data = self._resized_rows(table.weight.data, rows, mean_resizing)
        embeddings.embeddings[-1] = resized
        embeddings.bounds[-1] = new_num_tokens
        self._resize_output(new_num_tokens, rows, mean_resizing)
        self.config.vocab_size = new_num_tokens
        return embeddings

    def _resize_output(self, new_num_tokens: int, rows: int, mean_resizing: bool) -> None:
        """Resize an output head over the vocabulary with the embedding (none here; the LM head has one)."""

    def _resized_rows(self, weight: torch.Tensor, rows: int, mean_resizing: bool) -> torch.Tensor:
        """`weight` `[n, ...]` with `rows` rows: its first ones, then new rows (their mean, or initialised)."""
        if rows <= weight.shape[0]:
            return weight[:rows].clone()
        added = weight.new_empty(rows - weight.shape[0], *weight.shape[1:])
        if mean_resizing:
            added.copy_(weight.mean(dim=0, keepdim=True).expand_as(added))
        elif weight.dim() == 1:
            added.zero_()
        else:
            self._init_matrix(added)
        return torch.cat([weight, added], dim=0)


class TxlModel(TxlPreTrainedModel):
    """The Transformer-XL stack: adaptive embedding, `n_layer` relative-attention layers, memory; no output head."""

    _keys_to_ignore_on_load_unexpected = TxlPreTrainedModel._keys_to_ignore_without_the_head

    def __init__(self, config: TxlConfig) -> None:
        super().__init__(config)
        self.word_embeddings = TxlAdaptiveEmbedding(config)
        self.dropout = TxlDropout(config.dropout)
        if not config.untie_r:  # one u and one v shared by all layers
            self.content_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
        self.layers = nn.ModuleList([TxlLayer(config) for _ in range(config.n_layer)])
        self.gradient_checkpointing = False
        self._sinusoid_table: tuple[tuple, torch.Tensor] | None = None  # see _positions
        self.post_init()

    def get_input_embeddings(self) -> TxlAdaptiveEmbedding:
        return self.word_embeddings

    def set_input_embeddings(self, value: TxlAdaptiveEmbedding) -> None:
        """Any module that maps `[B, Q]` ids to `[B, Q, E]` runs; only a `TxlAdaptiveEmbedding` saves (the config
        describes no other: `save_pretrained` refuses)."""
        self.word_embeddings = value

    def _prepare_memory(
        self, past_key_values: Cache | None, batch: int, hidden_states: torch.Tensor, use_cache: bool
    ) -> TxlMemory | None:
        """The memory to attend to (and update, with use_cache); zero-filled first if `memory_init == "zeros"`.
        `past_key_values` is a TxlMemory or None (`forward` checked it)."""
        memory = past_key_values
        if memory is None and (use_cache or self.config.memory_init == "zeros"):
            memory = self.empty_memory()
        if memory is None:
            return None
        if len(memory.layers) != len(self.layers):
            # (The layers, not config.n_layer: layers appended or removed after loading would be skipped silently.)
            stale = len(self.layers) != self.config.n_layer
            raise ValueError(
                f"The memory has {len(memory.layers)} layers; this model has {len(self.layers)}"
                + (
                    f" while its config.n_layer is {self.config.n_layer}: set config.n_layer to the number of layers "
                    "after adding or removing layers, so that memories made from the config fit."
                    if stale
                    else "."
                )
            )
        if (held := memory.layers[0].read(False).hidden) is not None:
            # Layer 0 only: with a device map, later layers' memories live on their own layers' devices.
            check_memory_fits(held, hidden_states, self.config.d_model)
        elif self.config.memory_init == "zeros" and memory.mem_len > 0:
            # v4 behaviour: a new stream starts with mem_len zero vectors that the first segment attends to.
            zeros = hidden_states.new_zeros(batch, memory.mem_len, self.config.d_model)
            for layer in memory.layers:
                layer.update(zeros)
        return memory

    def empty_memory(self, mem_len: int | None = None) -> TxlMemory:
        """An empty memory for this model's layers (their number, even where layers were added or removed after
        `config.n_layer` was set), `mem_len` positions long (default: `config.mem_len`)."""
        return TxlMemory(len(self.layers), self.config.mem_len if mem_len is None else mem_len)

    def _positions(self, k_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """R for the distances K-1, ..., 0, `[K, E]`: a view of a table kept across calls (it depends on K only)."""
        # A traced forward computes it: an exported program keeps no Python state, and a table the first compiled call
        # kept would fail the guards of the second (one more compilation, on the first request after a warm-up).
        if torch.compiler.is_exporting() or torch.compiler.is_compiling():
            return sinusoid_positions(
                k_len, self.config.d_model, clamp_len=self.config.clamp_len, dtype=dtype, device=device
            )
        key = (dtype, device, self.config.clamp_len)
        kept = self._sinusoid_table
        if (
            kept is None
            or kept[0] != key
            or kept[1].shape[0] < k_len
            # made under torch.inference_mode(): autograd may not save it for backward outside that mode
            or (kept[1].is_inference() and not torch.is_inference_mode_enabled())
        ):
            length = max(k_len, self.config.mem_len + 1)
            table = sinusoid_positions(
                length, self.config.d_model, clamp_len=self.config.clamp_len, dtype=dtype, device=device
            )
            self._sinusoid_table = (key, table)
        table = self._sinusoid_table[1]
        return table[table.shape[0] - k_len :]

    @staticmethod
    def _new_tokens_mask(attention_mask: object, memory: object, q_len: int) -> object:
        """The columns of the new tokens of a mask that covers the whole stream so far (`memory.seen_tokens + Q`
        columns: what a GPT-2-style decoding loop passes, and transformers' classifier-free guidance), where its
        columns over the memory's positions agree with the padding the memory remembers; else the mask as given
        (`check_attention_mask` then says what is expected)."""
        if not (
            isinstance(attention_mask, torch.Tensor)
            and attention_mask.dim() == 2
            and is_txl_memory(memory)
            and memory.seen_tokens is not None
            and attention_mask.shape[1] == memory.seen_tokens + q_len > q_len
            and not torch.compiler.is_compiling()
        ):
            return attention_mask
        held = memory.get_seq_length()
        over_memory = attention_mask[:, attention_mask.shape[1] - q_len - held : attention_mask.shape[1] - q_len] != 0
        remembered = memory.padding
        tokens = torch.ones_like(over_memory) if remembered is None else ~remembered.to(over_memory.device)
        if over_memory.shape != tokens.shape or not torch.equal(over_memory, tokens):
            return attention_mask
        return attention_mask[:, attention_mask.shape[1] - q_len :]

    @staticmethod
    def _key_padding(
        memory: TxlMemory | None, segment_padding: torch.Tensor | None, batch: int, q_len: int, device: torch.device
    ) -> torch.Tensor | None:
        """`[B, K]` bool, True where a key (memory or segment) is padding; None when nothing is padded."""
        memory_padding = None if memory is None else memory.padding
        if memory_padding is None and segment_padding is None:
            return None
        if memory_padding is None:
            memory_padding = torch.zeros(
                batch, memory.get_seq_length() if memory else 0, dtype=torch.bool, device=device
            )
        if segment_padding is None:
            segment_padding = torch.zeros(batch, q_len, dtype=torch.bool, device=device)
        return torch.cat([memory_padding.to(device), segment_padding], dim=1)

    @_memory_kept_on_error
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values: TxlMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`):
                Token ids of the current segment.
            past_key_values (`TxlMemory`, *optional*):
                The memory returned by the previous call for this stream. `None` starts a new stream.
            attention_mask (`torch.Tensor` of shape `(batch_size, seq_len)`, *optional*):
                1 for real tokens, 0 for padding. Padded positions are never attended to, now or later from the
                memory (which remembers them).
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, seq_len, d_model)`, *optional*):
                Embedded inputs instead of `input_ids`.
            use_cache (`bool`, *optional*, defaults to `config.use_cache`):
                Update the memory with this segment and return it as `past_key_values`.
            position_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`, *optional*):
                Only where they restart: sequences packed in one row (`DataCollatorWithFlattening`, padding-free
                packing) attend each to itself, and only the row's first one to the memory (see
                `packed_sequences_mask`). Positions that run on (`arange`) change nothing: they are relative here.
        """
        take_sequence_bounds(kwargs, position_ids)
        reject_unknown_arguments(kwargs, input_ids, inputs_embeds)
        _check_memory_type(past_key_values)  # (before the mask: PEFT's prefix tuning widens it by its prefix)
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        return_dict = return_dict if return_dict is not None else self.config.return_dict

        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if input_ids is not None:
            check_input_ids(input_ids, self.input_vocab_size())
            inputs_embeds = self.word_embeddings(input_ids)  # [B, Q, E]
        else:
            check_inputs_embeds(inputs_embeds, self.config.d_model, self.dtype)
        batch, q_len, _ = inputs_embeds.shape
        segment_padding = None
        if attention_mask is not None:
            attention_mask = self._new_tokens_mask(attention_mask, past_key_values, q_len)
            check_attention_mask(attention_mask, batch, q_len)
            segment_padding = attention_mask.to(inputs_embeds.device) == 0  # [B, Q]

        memory = self._prepare_memory(past_key_values, batch, inputs_embeds, use_cache)
        mem_len_now = 0 if memory is None else memory.get_seq_length()
        k_len = mem_len_now + q_len

        # Built once per forward and shared by every layer.
        mask = causal_memory_mask(
            q_len,
            mem_len_now,
            same_length=self.config.same_length,
            max_mem_len=self.config.mem_len if memory is None else memory.mem_len,  # e.g. a longer evaluation memory
            device=inputs_embeds.device,
        )  # [Q, K] or None
        key_padding = self._key_padding(memory, segment_padding, batch, q_len, inputs_embeds.device)  # [B, K]
        if key_padding is not None:
            causal = (
                mask if mask is not None else torch.zeros(q_len, k_len, dtype=torch.bool, device=key_padding.device)
            )
            mask = causal | key_padding[:, None, None, :]  # [B, 1, Q, K]
        if position_ids is not None:
            check_position_ids(position_ids, batch, q_len)
            packed = packed_sequences_mask(
                position_ids.to(inputs_embeds.device), mem_len_now, segment_padding
            )  # [B or 1, 1, Q, K]
            if packed is not None:
                mask = (packed if mask is None else mask | packed).expand(batch, 1, q_len, k_len)
        positions = _dropout(self.dropout, self._positions(k_len, inputs_embeds.dtype, inputs_embeds.device))  # [K, E]
        if (memory is None or memory.seen_tokens == 0) and not self.training and not torch.compiler.is_compiling():
            for layer in self.layers:  # a new stream: see weight edits that bumped no version (a merged adapter)
                check_kept_position_table(getattr(layer, "attention", None))
        hidden_states = _dropout(self.dropout, inputs_embeds)

        # Inference keeps each layer's projected keys/values in the memory; training re-projects the hidden states.
        keep_projections = use_cache and not self.training and not torch.is_grad_enabled()
        if use_cache:
            memory.update_padding(segment_padding, batch=batch, q_len=q_len, memory_length=mem_len_now)
            memory.update_tokens(input_ids, batch=batch, q_len=q_len, device=inputs_embeds.device)
        layer_inputs, attentions = [], []
        memory_layers = memory.layers if memory is not None else [None] * len(self.layers)
        untie_r = self.config.untie_r  # read once: config attributes are slow to read, per layer and token
        if (
            keep_projections
            and hidden_states.numel() == hidden_states.shape[-1]  # one row: a token decoded at batch 1
            and not (output_attentions or output_hidden_states)
            and (decoded := decode_token(self, hidden_states, memory_layers, positions, mask, untie_r)) is not None
        ):
            hidden_states, memory_layers = decoded, []  # (every layer done, its memory updated)
        elif (q_len > 1 or self.training or torch.is_grad_enabled()) and not torch.compiler.is_compiling():
            self.__dict__.pop(_PLAN, None)  # (not decoding: what a plan holds may go; a traced graph keeps no state)
        for layer, memory_layer in zip(self.layers, memory_layers):
            layer_inputs.append(hidden_states)
            # Untied u and v are read by the attention itself: inside the layer's call, where offloading's hooks
            # (device_map) have loaded its parameters.
            content_bias, position_bias = (None, None) if untie_r else (self.content_bias, self.position_bias)
            layer_memory = None if memory_layer is None else memory_layer.read(keep_projections)
            hidden_states, attn_weights = layer(
                layer_inputs[-1], layer_memory, positions, mask, content_bias, position_bias, output_attentions
            )
            attentions.append(attn_weights)
            if keep_projections:  # after the layer has read its memory; outside it for checkpointing
                memory_layer.update(layer_inputs[-1])
        if use_cache and not keep_projections:
            # Train mode or gradients on: after the last layer, as a copy made between a layer's activations outlives
            # them and splits the space they free (peak RSS, docs/performance.md). Layer inputs the model made and
            # returns to no one may be kept without a copy: not the caller's `inputs_embeds` (the first layer's input
            # without dropout).
            callers = None if input_ids is not None else inputs_embeds
            for memory_layer, layer_input in zip(memory_layers, layer_inputs):
                memory_layer.drop_projections()
                memory_layer.update(layer_input, private=not output_hidden_states and layer_input is not callers)
        hidden_states = _dropout(self.dropout, hidden_states)

        output = BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            **{_CACHE_KWARG: memory if use_cache else None},
            hidden_states=(*layer_inputs, hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


class TxlForCausalLM(TxlPreTrainedModel, GenerationMixin):
    """Transformer-XL with its adaptive softmax language-model head."""

    _no_split_modules = ["TxlAdaptiveLogSoftmax"]  # and the base model's

    def __init__(self, config: TxlConfig) -> None:
        super().__init__(config)
        self.transformer = TxlModel(config)
        self.adaptive_softmax = TxlAdaptiveLogSoftmax(config)
        self._tied_weights_keys = self._tied_parameters(config)
        self.post_init()

    @staticmethod
    def _tied_parameters(config: TxlConfig) -> dict[str, str]:
        """`{target: source}` for the parameters the output head shares with the input embedding."""
        tied = {}
        embedding, softmax = "transformer.word_embeddings", "adaptive_softmax"
        if config.tie_word_embeddings:
            for cluster in range(1 if config.div_val == 1 else len(config.cutoffs) + 1):
                tied[f"{softmax}.output_layers.{cluster}.weight"] = f"{embedding}.embeddings.{cluster}.weight"
        for cluster, tie_projection in enumerate(config.tie_projs):
            if not tie_projection:
                continue
            if config.div_val == 1 and config.d_model != config.d_embed:
                tied[f"{softmax}.output_projections.{cluster}"] = f"{embedding}.projections.0"
            elif config.div_val != 1:
                tied[f"{softmax}.output_projections.{cluster}"] = f"{embedding}.projections.{cluster}"
        return tied

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # transformers ties only when tie_word_embeddings is set; projections follow tie_projs on their own.
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return dict(self._tied_weights_keys)

    def get_output_embeddings(self) -> None:
        """None: an adaptive softmax has no single output embedding matrix (`adaptive_softmax` holds its clusters;
        transformers' resizing and tying take None as "no output embedding"; v4 returned the last cluster)."""
        return None

    def _resize_output(self, new_num_tokens: int, rows: int, mean_resizing: bool) -> None:
        softmax = self.adaptive_softmax
        layer = softmax.output_layers[-1]  # [n_i, d_i] and [n_i]: the last cluster's, or the whole vocabulary's
        resized = TxlOutputLayer(layer.in_features, rows).to(device=layer.weight.device, dtype=layer.weight.dtype)
        tied = self.config.tie_word_embeddings
        source = self.transformer.word_embeddings.embeddings[-1].weight
        resized.weight = source if tied else nn.Parameter(self._resized_rows(layer.weight.data, rows, mean_resizing))
        resized.bias.data = self._resized_rows(layer.bias.data, rows, mean_resizing)
        softmax.output_layers[-1] = resized
        softmax.bounds[-1] = new_num_tokens
        softmax.shortlist_size = softmax.bounds[1]

    @_memory_kept_on_error
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values: TxlMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_logits: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> TxlCausalLMOutputWithPast | tuple:
        r"""
        Args:
            position_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`, *optional*):
                Where they restart, the sequences packed in a row are kept apart (`TxlModel.forward`): with
                `DataCollatorWithFlattening`, whose labels hide each sequence's first token, every sequence's loss
                is its own.
            labels (`torch.LongTensor` of shape `(batch_size, seq_len)`, *optional*):
                Targets, shifted inside (position t predicts `labels[:, t + 1]`), so `labels=input_ids` works; -100
                is ignored. The last position predicts nothing.
            logits_to_keep (`int` or `torch.Tensor`, *optional*, defaults to 0):
                Compute log-probabilities for the last `logits_to_keep` positions only (0: all), or, as a 1-D tensor
                of integers, for the positions it lists (transformers' causal LMs take both).
            return_logits (`bool`, *optional*, defaults to `config.return_logits`):
                Whether to return `logits`. When neither says: `True`, except for a training step (a loss computed
                with gradients in train mode) that returns a dict: the loss then only computes the clusters of the
                adaptive softmax that hold a target, and no `[B, Q, V]` tensor is made. In eval mode, and with
                `return_dict=False` (whose tuple is `(loss, logits, ...)` as any causal LM's), logits come back.
            shift_labels (`torch.LongTensor` of shape `(batch_size, seq_len)`, *optional*, keyword):
                Targets already aligned with the positions (position t predicts `shift_labels[:, t]`): for a stream
                cut into segments, the first target of the next segment is not lost. Passed as a keyword, like the
                loss keywords of transformers' causal LMs, so that Trainer's label detection sees only `labels`.
            num_items_in_batch (`int`, *optional*, keyword):
                Divide the summed loss by this instead of the number of targets (gradient accumulation; Trainer
                passes it). 0 (no target in the batch or accumulation window) gives a nan loss with gradients of 0.
        """
        shift_labels = kwargs.pop("shift_labels", None)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        take_sequence_bounds(kwargs, position_ids)
        reject_unknown_arguments(kwargs, input_ids, inputs_embeds)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if labels is not None and shift_labels is not None:
            raise ValueError("Pass either labels (shifted inside) or shift_labels (pre-aligned), not both.")
        if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dim() == 0:
            logits_to_keep = logits_to_keep.item()  # (a count as a tensor: what torch.onnx's tracing exporter passes)
        if not isinstance(logits_to_keep, torch.Tensor):
            require_integer(logits_to_keep, "logits_to_keep", minimum=0, note=" (0: every position)")
        check_num_items(num_items_in_batch)
        outputs = self.transformer(
            input_ids=input_ids,
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
        )
        hidden_states = outputs.last_hidden_state  # [B, Q, E]
        batch, q_len, _ = hidden_states.shape

        loss = losses = None
        targets = self._aligned_targets(labels, shift_labels, batch, q_len)
        if targets is not None:
            check_targets(
                targets,
                self.adaptive_softmax.bounds[-1],
                allow_all_ignored=num_items_in_batch is not None,
                shifted=labels is not None,
            )
            losses = self.adaptive_softmax.nll(hidden_states.reshape(-1, hidden_states.shape[-1]), targets.reshape(-1))
            losses = losses.view(batch, q_len)
            loss = self._reduce_loss(losses, targets, num_items_in_batch)

        if return_logits is None and self.config.return_logits:  # (the config only turns them on in training steps)
            return_logits = True
        if return_logits is None:  # the [B, Q, V] log-probabilities cost a training step more than the loss
            training_step = self.training and torch.is_grad_enabled() and hidden_states.requires_grad
            # (A tuple keeps them: without, every later entry would move to the place a causal LM's logits take.)
            return_logits = targets is None or not training_step or not return_dict
        logits = None
        if return_logits:
            if isinstance(logits_to_keep, torch.Tensor):
                check_positions(logits_to_keep, "logits_to_keep", q_len)
                kept = hidden_states[:, logits_to_keep.to(hidden_states.device)]
            else:
                kept = hidden_states[:, -logits_to_keep:] if logits_to_keep > 0 else hidden_states
            # (the softmax's own vocabulary: a config shared with a model resized since says another)
            logits = self.adaptive_softmax(kept.reshape(-1, kept.shape[-1])).view(
                batch, kept.shape[1], self.adaptive_softmax.bounds[-1]
            )

        left_out = logits is None and not torch.compiler.is_compiling()
        output = (_TrainingStepOutput if left_out else TxlCausalLMOutputWithPast)(
            loss=loss,
            logits=logits,
            **{_CACHE_KWARG: _memory_of(outputs)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            losses=losses,
        )
        return output if return_dict else output.to_tuple()

    @staticmethod
    def _aligned_targets(
        labels: torch.Tensor | None, shift_labels: torch.Tensor | None, batch: int, q_len: int
    ) -> torch.Tensor | None:
        """Targets aligned with the positions, `[B, Q]`, -100 where nothing is predicted. Never modifies the input."""
        given = labels if labels is not None else shift_labels
        if given is None:
            return None
        check_label_tensor(given, "labels" if labels is not None else "shift_labels", batch, q_len)
        return shift_labels if labels is None else F.pad(labels[:, 1:], (0, 1), value=-100)  # t predicts t + 1

    @staticmethod
    def _reduce_loss(
        losses: torch.Tensor, targets: torch.Tensor, num_items_in_batch: int | torch.Tensor | None
    ) -> torch.Tensor:
        if num_items_in_batch is not None:
            # A count of 0 (Trainer's for a batch or accumulation window without targets) gives a nan loss, as
            # transformers' causal LMs do, but gradients of 0: dividing by it would make them nan, and the step too.
            count = torch.as_tensor(num_items_in_batch, device=losses.device)
            total = losses.sum()
            divisor = torch.where(count > 0, count, torch.ones_like(count))  # (a count under 1 divides as it is)
            return torch.where(count > 0, total / divisor, torch.full_like(total, float("nan")))
        return losses.sum() / (targets != -100).sum()

    # generate() support: the memory replaces the KV cache. Conventions (see README, "Generation with memories"):
    # input_ids holds tokens new to the memory, or repeats those it has seen first (transformers' continuation idiom,
    # told apart by `TxlMemory.tokens_already_seen`); the memory passed in is updated in place and, after generate()
    # returns, holds everything except the last generated token.
    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        if model_kwargs.get(_CACHE_KWARG) is None and generation_config.use_cache is not False:
            model_kwargs[_CACHE_KWARG] = self.transformer.empty_memory()
        else:
            super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def _prepare_position_ids_for_generation(self, inputs_tensor, model_kwargs: dict) -> None:
        # generate() makes position_ids for every model whose forward takes them and grows them at every token; the
        # positions here are relative and generate() packs nothing, so none are made (and none are fed).
        return None

    def _prefill(self, input_ids, generation_config, model_kwargs: dict, is_first_iteration: bool = True):
        memory = model_kwargs.get(_CACHE_KWARG)
        if generation_config.prefill_chunk_size is None or memory is None or memory.get_seq_length() == 0:
            return super()._prefill(input_ids, generation_config, model_kwargs, is_first_iteration)
        # transformers' chunked prefill skips get_seq_length() tokens of input_ids, taking them for tokens already
        # cached; the XL memory holds earlier text that input_ids does not repeat (unless the sequence it has seen is
        # passed again, transformers' continuation idiom), so every token new to it is fed here.
        input_ids = input_ids[:, memory.tokens_already_seen(input_ids) :]
        attention_mask = model_kwargs.get("attention_mask")
        if attention_mask is not None:  # the columns of input_ids (a longer mask also covers earlier tokens)
            attention_mask = attention_mask[:, attention_mask.shape[1] - input_ids.shape[1] :]
        outputs = None
        for start in range(0, input_ids.shape[1], generation_config.prefill_chunk_size):
            end = start + generation_config.prefill_chunk_size
            chunk_kwargs = {**model_kwargs, _CACHE_KWARG: memory}
            if attention_mask is not None:
                chunk_kwargs["attention_mask"] = attention_mask[:, start:end]
            model_inputs = self.prepare_inputs_for_generation(
                input_ids[:, start:end], is_first_iteration=is_first_iteration, **chunk_kwargs
            )
            outputs = self(**model_inputs, return_dict=True)
            memory = _memory_of(outputs)
        return outputs

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        past_key_values: TxlMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool = True,
        is_first_iteration: bool = False,
        next_sequence_length: int | None = None,
        cache: TxlMemory | None = None,
        **kwargs,
    ) -> dict:
        past_key_values = cache if past_key_values is None else past_key_values  # (transformers 5.24's name)
        if past_key_values is not None:
            past_key_values.settle_tokens()  # (the count of a compiled forward before this one)
        # The memory length says nothing about how many of input_ids were consumed, so the default slicing (by
        # get_seq_length) is wrong here: the first call feeds every token new to the memory, later calls the newest.
        if not is_first_iteration and use_cache and past_key_values is not None and past_key_values.mem_len > 0:
            input_ids = input_ids[:, -1:]  # (without memory, mem_len = 0, every step sees the whole sequence)
        elif past_key_values is not None and past_key_values.get_seq_length() > 0:
            if past_key_values.seen_tokens is None and not past_key_values._input_is_new:
                logger.warning_once(_UNKNOWN_COUNT)
            # transformers' continuation idiom passes the sequence the memory has already seen, plus new tokens.
            input_ids = input_ids[:, past_key_values.tokens_already_seen(input_ids) :]
            if is_first_iteration and inputs_embeds is not None:  # (its idiom with embeddings: always all of them)
                inputs_embeds = inputs_embeds[:, past_key_values.embeddings_already_seen(inputs_embeds) :]
            # generate() repeats the inputs for beams / return sequences but not a memory passed by the caller.
            memory_batch, batch = past_key_values.batch_size, input_ids.shape[0]
            if memory_batch != batch:
                if batch % memory_batch != 0:
                    raise ValueError(
                        f"The memory holds {memory_batch} streams but generate() got {batch} sequences; pass one "
                        "prompt per stream of the memory (after beam search it holds every running beam, batch x "
                        "num_beams rows: TxlStream.generate continues with the best one)."
                    )
                past_key_values.batch_repeat_interleave(batch // memory_batch)
        model_inputs = {"input_ids": input_ids, "past_key_values": past_key_values, "use_cache": use_cache}
        if is_first_iteration and inputs_embeds is not None:  # generate(inputs_embeds=...): the prompt is embedded
            model_inputs["input_ids"], model_inputs["inputs_embeds"] = None, inputs_embeds
        new_positions = input_ids.shape[1] if model_inputs["input_ids"] is not None else inputs_embeds.shape[1]
        if attention_mask is not None:  # the memory remembers earlier padding: pass the new tokens' columns only
            model_inputs["attention_mask"] = attention_mask[:, attention_mask.shape[1] - new_positions :]
        for name in ("logits_to_keep", "output_attentions", "output_hidden_states"):
            if name in kwargs:
                model_inputs[name] = kwargs[name]
        if past_key_values is not None and use_cache:
            past_key_values.expect_tokens(
                model_inputs["input_ids"], batch=input_ids.shape[0], q_len=new_positions, device=input_ids.device
            )
        return model_inputs

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs: dict, *args, **kwargs) -> dict:
        if (memory := _memory_of(outputs)) is not None:
            memory.settle_tokens()  # (what a compiled forward could not count)
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)

    def generate(self, inputs: torch.Tensor | None = None, *args, **kwargs):
        """`GenerationMixin.generate`, with the prompt and the generation's token ids checked first: transformers
        would otherwise fail deep inside (an IndexError for an empty or 1-D prompt), assert on an accelerator, or never
        stop (an end-of-sequence id the model cannot produce)."""
        prompt = inputs if inputs is not None else kwargs.get("input_ids")
        # All-zero token types (a BERT-like tokenizer's) are taken, as GPT-2's generate() takes them; nothing reads
        # them after this check, and generate() would refuse them as a keyword its forward does not name.
        check_token_type_ids(
            kwargs.pop("token_type_ids", None), None if prompt is None else getattr(prompt, "shape", None)
        )
        if prompt is not None:
            check_prompt(prompt, self.adaptive_softmax.bounds[-1], kwargs.get("attention_mask"))
        generation_config = (args[0] if args else kwargs.get("generation_config")) or self.generation_config

        def setting(name: str):
            return kwargs[name] if name in kwargs else getattr(generation_config, name, None)

        check_generation_settings(setting, self.adaptive_softmax.bounds[-1])
        for name in GENERATION_LENGTHS:  # 3.0, tensor(3) (checked integral): passed on as 3
            if (value := setting(name)) is not None and not isinstance(value, int):
                kwargs[name] = int(value)
        if setting("cache_implementation") == "dynamic":  # (a cache that grows: the memory is one, passed or made)
            kwargs["cache_implementation"] = None
        if setting("stop_strings") and kwargs.get("tokenizer") is not None:
            check_stop_strings_tokenizer(kwargs["tokenizer"])
        if setting("repetition_penalty") not in (None, 1.0):
            logger.warning_once(
                "repetition_penalty acts on this model's scores, log-probabilities (all <= 0), by multiplying them: "
                "much less than on raw logits (GPT-2's) at the same value. no_repeat_ngram_size and sequence_bias act "
                "alike on both (docs/generation.md)."
            )
        if setting("exponential_decay_length_penalty") is not None:
            logger.warning_once(
                "exponential_decay_length_penalty raises the end token's score by a multiple of its absolute value: "
                "on this model's scores, log-probabilities (all <= 0, the end token's often far below 0), by more "
                "than on raw logits (GPT-2's) at the same setting, so generation stops sooner (docs/generation.md)."
            )
        other = "past_key_values" if _CACHE_KWARG == "cache" else "cache"
        if (memory := kwargs.pop(other, None)) is not None:  # either name, whichever transformers is installed
            if kwargs.get(_CACHE_KWARG) is not None:
                raise TypeError(_SECOND_MEMORY)
            _check_memory_type(memory, other)
            kwargs[_CACHE_KWARG] = memory
        _check_memory_type(kwargs.get(_CACHE_KWARG), _CACHE_KWARG)  # (before transformers: its message is its own)
        try:
            return super().generate(inputs, *args, **kwargs)
        finally:
            # A call cut short between announcing a forward's tokens and counting them leaves nothing to count later.
            if (memory := kwargs.get(_CACHE_KWARG)) is not None:
                memory.settle_tokens()


class TxlForSequenceClassification(TxlPreTrainedModel):
    """Transformer-XL with a linear classifier on the last non-padding token.

    What the pooled token sees: with `same_length` (the wt103 setting) a query attends to itself and the `mem_len - 1`
    positions before it, so a text longer than `mem_len` is classified from its end only; `same_length=False`
    lets the last token see the whole input. A long text can also go in segments, the memory passed from one call to
    the next as for the language model: the logits of each row are those of the segment that holds its last real
    token (a row that is all padding in a later segment has meaningless logits there), and gradients do not reach
    earlier segments.
    """

    # The loss is a mean over the batch, as in transformers' classification heads: Trainer must scale it for gradient
    # accumulation itself rather than pass a count of items.
    accepts_loss_kwargs = False
    _keys_to_ignore_on_load_unexpected = TxlPreTrainedModel._keys_to_ignore_without_the_head

    def __init__(self, config: TxlConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = TxlModel(config)
        self.score = nn.Linear(config.d_model, config.num_labels, bias=False)
        self.post_init()

    @_memory_kept_on_error
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values: TxlMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast | tuple:
        r"""
        Args:
            labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
                Class ids (cross-entropy), or floats for regression when `num_labels == 1`.
            position_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`, *optional*):
                Accepted as every classifier of transformers does; the positions are relative here, so they change
                nothing. Positions that restart (several sequences packed in a row) are refused: one token per row
                is classified.
            num_items_in_batch (*optional*, keyword):
                Accepted and not used, as in transformers' classification heads: the loss is a mean over the batch.
        """
        kwargs.pop("num_items_in_batch", None)
        reject_unknown_arguments(kwargs, input_ids, inputs_embeds)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.transformer(
            input_ids=input_ids,
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            position_ids=position_ids,  # (checked there)
        )
        if position_ids is not None and not torch.compiler.is_compiling():
            self._refuse_packed_rows(position_ids, attention_mask, outputs.last_hidden_state.shape[1])
        logits = self.score(outputs.last_hidden_state)  # [B, Q, num_labels]
        batch = logits.shape[0]
        pad_token_id = self.config.pad_token_id
        not_pad = None  # [B, Q], where the positions are not padding
        if attention_mask is not None:  # (before the pad id: a tokenizer may pad with another id, or a text hold it)
            # (the new tokens' columns: a mask of the whole stream so far is taken with a memory, `_new_tokens_mask`)
            not_pad = attention_mask[:, attention_mask.shape[1] - logits.shape[1] :] != 0
        elif input_ids is not None and pad_token_id is not None:
            not_pad = input_ids != pad_token_id
        if not_pad is None:
            if batch > 1 and pad_token_id is None:
                raise ValueError(
                    "Batches of more than one sequence need config.pad_token_id (or an attention_mask) to find each "
                    "last token."
                )
            if batch > 1:
                logger.warning_once(
                    "TxlForSequenceClassification: inputs_embeds without an attention_mask: padding cannot be told, "
                    "so each row is classified at its last position."
                )
            last_token = torch.full((batch,), logits.shape[1] - 1, device=logits.device)
        else:
            # Last position that is not padding (right padding); a row without padding uses its last position.
            positions = torch.arange(not_pad.shape[-1], device=logits.device, dtype=torch.int32)
            last_token = (positions * not_pad.to(logits.device, torch.int32)).argmax(-1)
        pooled_logits = logits[torch.arange(batch, device=logits.device), last_token]  # [B, num_labels]

        loss = None
        if labels is not None:
            single_label = self.config.problem_type in (None, "single_label_classification")
            check_class_labels(labels, batch, self.config.num_labels, single_label=single_label)
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=pooled_logits, config=self.config)
        output = SequenceClassifierOutputWithPast(
            loss=loss,
            logits=pooled_logits,
            **{_CACHE_KWARG: _memory_of(outputs)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    @staticmethod
    def _refuse_packed_rows(position_ids: torch.Tensor, attention_mask: torch.Tensor | None, q_len: int) -> None:
        padding = None if attention_mask is None else attention_mask[:, attention_mask.shape[1] - q_len :] == 0
        breaks = packed_sequence_breaks(position_ids, None if padding is None else padding.to(position_ids.device))
        if bool(breaks.any()):
            row, column = (int(index) for index in breaks.nonzero()[0])
            raise ValueError(
                f"position_ids restart in row {row} at column {column + 1} (sequences packed in one row, as "
                "DataCollatorWithFlattening makes): TxlForSequenceClassification classifies one token per row, so "
                "it would classify them as one. Give it one sequence per row (padding, e.g. DataCollatorWithPadding)."
            )


@dataclass
class TxlTokenClassifierOutput(SequenceClassifierOutputWithPast):
    """transformers' classifier output with the memory: `logits` `[B, Q, num_labels]`, one row per token."""


class TxlForTokenClassification(TxlPreTrainedModel):
    """Transformer-XL with a linear classifier on every token (tagging: entities, parts of speech), as GPT-2's.

    The model is causal: each token is classified from itself and what came before it, the memory included. A long
    text goes in segments, the memory passed from one call to the next as for the language model.
    """

    _keys_to_ignore_on_load_unexpected = TxlPreTrainedModel._keys_to_ignore_without_the_head

    def __init__(self, config: TxlConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = TxlModel(config)
        dropout = getattr(config, "classifier_dropout", None)  # (transformers' name; else the model's own)
        self.dropout = nn.Dropout(config.dropout if dropout is None else dropout)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    @_memory_kept_on_error
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values: TxlMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> TxlTokenClassifierOutput | tuple:
        r"""
        Args:
            labels (`torch.LongTensor` of shape `(batch_size, seq_len)`, *optional*):
                One class id per token, -100 where no loss is wanted (padding, a word's later sub-tokens).
            num_items_in_batch (*optional*, keyword):
                Trainer's count of labelled tokens over an accumulation group: the loss is their sum divided by it.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        reject_unknown_arguments(kwargs, input_ids, inputs_embeds)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.transformer(
            input_ids=input_ids,
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # [B, Q, num_labels]
        loss = None
        if labels is not None:
            check_token_labels(labels, tuple(logits.shape[:2]), self.config.num_labels)
            loss = self.loss_function(logits, labels, self.config, num_items_in_batch=num_items_in_batch)
        output = TxlTokenClassifierOutput(
            loss=loss,
            logits=logits,
            **{_CACHE_KWARG: _memory_of(outputs)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


class TxlForQuestionAnswering(TxlPreTrainedModel):
    """Transformer-XL with a span head (extractive question answering), as GPT-2's: a start and an end logit per
    token. The model is causal: a token's logits see the question and context before it, not after."""

    _keys_to_ignore_on_load_unexpected = TxlPreTrainedModel._keys_to_ignore_without_the_head

    def __init__(self, config: TxlConfig) -> None:
        super().__init__(config)
        self.transformer = TxlModel(config)
        self.qa_outputs = nn.Linear(config.d_model, 2)
        self.post_init()

    @_memory_kept_on_error
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values: TxlMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        r"""
        Args:
            start_positions, end_positions (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
                The answer span's first and last token (an index past the input is ignored); the loss is the mean
                of the two cross-entropies over the tokens.
        """
        kwargs.pop("num_items_in_batch", None)  # (a mean over the batch, as transformers' span heads)
        reject_unknown_arguments(kwargs, input_ids, inputs_embeds)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.transformer(
            input_ids=input_ids,
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)  # [B, Q, 2]
        start_logits, end_logits = (half.squeeze(-1).contiguous() for half in logits.split(1, dim=-1))  # [B, Q]
        loss = None
        if start_positions is not None or end_positions is not None:
            check_span_positions(start_positions, end_positions, start_logits.shape[0])
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions)
        output = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


# ---------------------------------------------------------------------------------------------------------------------
# transformers-v4 checkpoints: parameter names of `TransfoXL*` (and of the original code), renamed on load.
# Saving always writes the txl layout (`TxlPreTrainedModel.save_pretrained`).

LEGACY_PARAMETER_RENAMES: dict[str, str] = {
    r"word_emb\.emb_layers\.": "word_embeddings.embeddings.",
    r"word_emb\.emb_projs\.": "word_embeddings.projections.",
    r"dec_attn\.qkv_net\.": "attention.qkv_proj.",
    r"dec_attn\.r_net\.": "attention.pos_proj.",
    r"dec_attn\.o_net\.": "attention.o_proj.",
    r"dec_attn\.layer_norm\.": "attention.layer_norm.",
    r"dec_attn\.r_w_bias": "attention.content_bias",
    r"dec_attn\.r_r_bias": "attention.position_bias",
    r"pos_ff\.CoreNet\.0\.": "ffn.up_proj.",
    r"pos_ff\.CoreNet\.3\.": "ffn.down_proj.",
    r"pos_ff\.layer_norm\.": "ffn.layer_norm.",
    r"^transformer\.r_w_bias": "transformer.content_bias",
    r"^transformer\.r_r_bias": "transformer.position_bias",
    r"^crit\.out_layers\.": "adaptive_softmax.output_layers.",
    r"^crit\.out_projs\.": "adaptive_softmax.output_projections.",
    r"^crit\.cluster_": "adaptive_softmax.cluster_",
}

register_checkpoint_conversion_mapping(
    TransfoXLConfig.model_type,
    [WeightRenaming(source, target) for source, target in LEGACY_PARAMETER_RENAMES.items()],
    overwrite=True,
)

# Trainer tells a causal LM by its class name in transformers' own table of them (for label smoothing, whose labels it
# then shifts), which registering with the Auto classes does not fill: without it, label smoothing compares each
# position with its own token and trains a copy of the input. lm-evaluation-harness reads the same table by model type
# (a legacy folder's is "transfo-xl"). Here, so that remote code (no `import transfoxl`) has it.
for _model_type in (TxlConfig.model_type, TransfoXLConfig.model_type):
    transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(_model_type, "TxlForCausalLM")

__all__ = [
    "TxlAdaptiveEmbedding",
    "TxlAdaptiveLogSoftmax",
    "TxlCausalLMOutputWithPast",
    "TxlForCausalLM",
    "TxlForQuestionAnswering",
    "TxlForSequenceClassification",
    "TxlForTokenClassification",
    "TxlMemory",
    "TxlMemoryLayer",
    "TxlModel",
    "TxlPreTrainedModel",
    "causal_memory_mask",
    "eager_relative_attention",
    "is_txl_memory",
    "relative_shift",
    "sdpa_relative_attention",
    "shifted_position_scores",
    "sinusoid_positions",
]
