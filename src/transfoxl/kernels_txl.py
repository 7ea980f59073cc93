"""Hand-written kernels for Transformer-XL, the fast paths beside the readable ones of `modeling_txl.py`: training's on
a CPU, inference's attention and one-row products on a CPU, and the dropout on any device.

Where autograd's generic code is slow or keeps more than it needs, each function here computes exactly what its
readable counterpart in `modeling_txl.py` computes (tests compare values and gradients), and `modeling_txl.py`
decides where each one applies:

- `relative_attention`: softmax(q_c k^T s + shift(q_p (W_{k,R} R)^T) + mask) v with one saved `[H B, Q, K]` tensor.
  A bias that needs a gradient sends CPU SDPA to its unfused fallback (it masks twice and guards the softmax against
  fully masked rows); this is faster (docs/performance-log.md has the figures).
- `dropout`, `relu_dropout`: the distribution of `nn.Dropout` (on a CPU, p rounded to a multiple of 2^-16) with
  masks of 16 bits per entry from a counter-based stream (torch's `bernoulli_` costs about as much as a matrix
  product of the same size on a CPU, and its generator is serial; the compiled kernel draws this stream in parallel,
  in one pass with the product), and after a ReLU only the output kept for backward.
- `adaptive_nll`: the adaptive softmax's loss with its gradients computed in the forward, a chunk of rows at a time,
  in place in the logits' buffer (no `[N, n_i]` log-probabilities kept).
- `memory_linear`: the keys and values of [memory; segment] whose backward skips the memory rows' input gradient,
  which the stop-gradient would drop anyway.
- Inference: `relative_attention_by_query_blocks` (a long segment a block of queries at a time), `one_query_attention`
  (a decoded token), their compiled forms (`compiled_relative_attention`, `compiled_one_query_attention`, also
  training's forward: `compiled_relative_attention_training`) and `one_row_linear` (a linear layer for one row).

Tensors only: nothing here knows the model's modules or config. It imports torch and the package's tensor-level
modules (`checks_txl`, `cpp_kernels_txl`), relatively, so `save_pretrained` copies it with them into a model folder
beside `modeling_txl.py` for `trust_remote_code=True`.

Shapes, in modeling_txl.py's legend: B batch, H heads, Q queries (segment), M memory, K = M + Q keys, D head width,
N rows (tokens), E width; and C the queries of one block (`relative_attention_by_query_blocks`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .checks_txl import autocast_on, tracing
from .cpp_kernels_txl import compiled_operators


def _first_derivative(kernel: str, *, twice: bool = False) -> Callable:
    """A Function's `backward` made for the first derivative only (as `once_differentiable`), that never lets a second
    one through as zero. Where one may be asked for (backward with `create_graph=True`, which runs in grad mode:
    gradient penalties, Hessian-vector products), with `twice` the Function's `_second(ctx, *grad_outputs)` computes
    the same gradients with differentiable operators; without, the first derivative is returned, and differentiating
    it raises an error that names the way that supports a second one. (torch's `once_differentiable` raises only
    where an incoming gradient requires one: a loss's own does not, and the second derivative through the loss's
    Function came out as zero.)"""
    message = (
        f"a second derivative (backward with create_graph=True, then differentiated) goes through {kernel}, which "
        "computes first derivatives only; the eager attention is differentiable twice: "
        "model.set_attn_implementation('eager') (or attn_implementation='eager' in from_pretrained)"
    ).encode()

    def decorate(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def first_or_second(ctx, *grad_outputs):
            if torch.is_grad_enabled() and twice:
                return ctx._forward_cls._second(ctx, *grad_outputs)
            with torch.no_grad():
                grads = backward(ctx, *grad_outputs)
            if not torch.is_grad_enabled():
                return grads
            raising = torch._C._functions.DelayedError(message, len(grads))
            return raising(*(None if grad is None else grad.detach().requires_grad_() for grad in grads))

        return first_or_second

    return decorate


def float32_cpu_training(*tensors: torch.Tensor) -> bool:
    """Whether a gradient will flow back to `tensors`, all float32 on the CPU, without autocast, outside
    torch.export and torch.jit.trace (which trace with gradients on but record no backward: the kernels' writes into
    views made torch.onnx's tracing exporter's graph compute other numbers) and torch.func transforms (which these
    kernels' autograd Functions do not support): where these kernels apply."""
    return (
        torch.is_grad_enabled()
        and any(tensor.requires_grad for tensor in tensors)
        and all(tensor.device.type == "cpu" and tensor.dtype == torch.float32 for tensor in tensors)
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_exporting()
        and not torch.jit.is_tracing()
        and not torch._C._are_functorch_transforms_active()
    )


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a softmax is computed in: float32 for half precision (bf16 keeps about 3 significant digits), the
    input's own otherwise (a float64 model stays float64 throughout)."""
    return torch.promote_types(dtype, torch.float32)


# ---------------------------------------------------------------------------------------------------------------------
# The relative shift as a view


def pad_relative_keys(rel_key: torch.Tensor) -> torch.Tensor:
    """`[H, K, D]` -> `[H, K + 1, D]`: a zero row, then `rel_key` (row r + 1 = distance K-1-r)."""
    heads, _, head_dim = rel_key.shape
    return torch.cat([rel_key.new_zeros(heads, 1, head_dim), rel_key], dim=1)


def shifted_product(position_query: torch.Tensor, padded_rel_key: torch.Tensor, batch: int) -> torch.Tensor:
    """The relative shift (App. B) of `position_query @ rel_key^T`, computed without copying the scores.

    position_query `[H, B Q, D]` (head-major: one matrix product per head, rel_key being shared by the batch);
    padded_rel_key `[H, K + 1, D]` (`pad_relative_keys`). Returns `[H, B, Q, K]`, a strided view of the product:
    column j of query i is key position j (distance M + i - j). `relative_shift` pads the scores with a zero column
    and re-views them; the zero row of the keys makes the product itself come out padded, so the shift is a view.
    """
    heads, rows, _ = position_query.shape
    q_len, k_len = rows // batch, padded_rel_key.shape[1] - 1
    padded = torch.bmm(position_query, padded_rel_key.transpose(1, 2))  # [H, B Q, K + 1], column 0 is zero
    return padded.view(heads, batch, (k_len + 1) * q_len)[:, :, q_len:].view(heads, batch, q_len, k_len)


# ---------------------------------------------------------------------------------------------------------------------
# Attention


def relative_attention_applies(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rel_key: torch.Tensor, dropout: float
) -> bool:
    """Whether `relative_attention` applies: float32 CPU training without attention dropout (SDPA draws that)."""
    return dropout == 0.0 and float32_cpu_training(query, key, value, rel_key)


def float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`mask` (bool, True = hidden) as the mask added to scores: 0 where visible, dtype's lowest value where hidden.

    Every layer of a forward gets the same mask tensor: its float form is made once and kept on that tensor (an
    attribute, so it lives as long as the mask), with the mask's version and storage, so that a write torch sees
    (in place, through a view, `.data =`) or a copy of the tensor makes it anew. Under `torch.inference_mode()` (no
    versions), while tracing (no attributes) and under torch.func transforms (no storage) it is made afresh at every
    call.
    """
    trackable = not (
        torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or torch.is_inference_mode_enabled()
        or mask.is_inference()
    )
    try:
        key = (mask._version, mask.data_ptr(), dtype) if trackable else None
    except RuntimeError:  # a tensor without storage (a torch.func transform's wrapper): nothing to key on
        trackable, key = False, None
    kept = getattr(mask, "_float_mask", None) if trackable else None
    if kept is not None and kept[0] == key:
        return kept[1]
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, torch.finfo(dtype).min)
    if trackable:
        mask._float_mask = (key, additive)
    return additive


class _RelativeAttentionFunction(torch.autograd.Function):
    """Batched as H B matrices, head-major, so that the positional product of each head is written in a layout whose
    shifted view is already `[H B, Q, K]`. Forward: one pass adds the mask to that view, the content product
    accumulates into it (baddbmm), one softmax in place. The output is laid out `[B, Q, H, D]`, as the output
    projection reads it, and kept: softmax's backward needs, per query, the sum over keys of dL/dp * p, which equals
    the sum over the head width of dL/do * o (o = p v), a `[.., D]` product instead of a `[.., K]` one. Backward: the
    gradient of the scores is computed inside a padded buffer, the transpose of the shift, where the positional
    products read it: one `[H B, Q, K]` temporary. q_p is not kept: it is rebuilt from q_c, whose bias differs by
    v - u."""

    @staticmethod
    def forward(
        ctx,
        content_query: torch.Tensor,  # [H B, Q, D], q + u
        position_query: torch.Tensor,  # [H, B Q, D], (q + v) * scaling
        key: torch.Tensor,  # [H B, K, D]
        value: torch.Tensor,  # [H B, K, D]
        padded_rel_key: torch.Tensor,  # [H, K + 1, D]
        additive_mask: torch.Tensor | None,  # [Q, K] or [B, Q, K]: 0 or a large negative number
        bias_shift: torch.Tensor,  # [H, D], v - u (no gradient: for rebuilding q_p in backward)
        scaling: float,
    ) -> torch.Tensor:
        batch_heads, q_len, _ = content_query.shape
        heads, k_len = padded_rel_key.shape[0], key.shape[1]
        batch = batch_heads // heads
        shifted = shifted_product(position_query, padded_rel_key, batch)  # [H, B, Q, K] view
        scores = torch.empty(heads, batch, q_len, k_len, dtype=key.dtype, device=key.device)
        if additive_mask is None:
            scores.copy_(shifted)
        else:
            torch.add(shifted, additive_mask, out=scores)
        del shifted
        scores = scores.view(batch_heads, q_len, k_len).baddbmm_(content_query, key.transpose(1, 2), alpha=scaling)
        probs = torch._softmax(scores, -1, False, out=scores)  # [H B, Q, K], in place: one such tensor, not two
        del scores
        head_dim = key.shape[2]
        output = key.new_empty(batch, q_len, heads, head_dim)
        output.permute(2, 0, 1, 3).copy_(torch.bmm(probs, value).view(heads, batch, q_len, head_dim))
        ctx.save_for_backward(content_query, key, value, padded_rel_key, bias_shift, probs, output)
        ctx.scaling = scaling
        return output  # [B, Q, H, D]

    @staticmethod
    @_first_derivative("the relative attention's CPU training kernel")
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        content_query, key, value, padded_rel_key, bias_shift, probs, output = ctx.saved_tensors
        grads = _relative_attention_backward(
            grad_output, content_query, key, value, padded_rel_key, bias_shift, probs, output, ctx.scaling
        )
        return *grads, None, None, None


def _relative_attention_backward(
    grad_output: torch.Tensor,  # [B, Q, H, D]
    content_query: torch.Tensor,  # [H B, Q, D], q + u
    key: torch.Tensor,  # [H B, K, D]
    value: torch.Tensor | None,  # [H B, K, D]; None with grad_padded
    padded_rel_key: torch.Tensor,  # [H, K + 1, D]
    bias_shift: torch.Tensor,  # [H, D], v - u
    probs: torch.Tensor,  # [H B, Q, K]
    output: torch.Tensor,  # [B, Q, H, D]
    scaling: float,
    grad_padded: torch.Tensor | None = None,  # [H, B, (K + 1) Q], the score gradient where already computed
) -> tuple[torch.Tensor, ...]:
    """The gradients of the training kernels' relative attention: of content_query `[H B, Q, D]`, of the scaled
    position query `[H, B Q, D]`, of key and value `[H B, K, D]` and of padded_rel_key `[H, K + 1, D]`. `value` is
    read only to compute the score gradient, which the compiled kernel may give instead (`grad_padded`)."""
    batch_heads, q_len, k_len = probs.shape
    heads, head_dim = padded_rel_key.shape[0], key.shape[2]
    batch = batch_heads // heads
    grad_by_head = grad_output.permute(2, 0, 1, 3).reshape(batch_heads, q_len, head_dim)  # [H B, Q, D]
    grad_value = torch.bmm(probs.transpose(1, 2), grad_by_head)  # [H B, K, D]
    # The positional scores were a shifted view of a padded buffer: their gradient is computed in that layout.
    if grad_padded is None:
        assert value is not None, "the score gradient needs the values"
        row_dot = torch.linalg.vecdot(grad_output, output)  # [B, Q, H]: per query, sum_k dL/dp * p
        row_dot = row_dot.permute(2, 0, 1).reshape(batch_heads, q_len)  # [H B, Q]
        grad_padded = torch.empty(heads, batch, (k_len + 1) * q_len, dtype=probs.dtype, device=probs.device)
        grad_padded[:, :, :q_len].zero_()
        grad_scores = grad_padded[:, :, q_len:].view(batch_heads, q_len, k_len)  # a strided view
        grad_scores.baddbmm_(grad_by_head, value.transpose(1, 2), beta=0.0)  # d loss / d probs
        grad_scores.sub_(row_dot[..., None]).mul_(probs)  # the softmax backward, in place
    grad_scores = grad_padded[:, :, q_len:].view(batch_heads, q_len, k_len)
    grad_content_query = torch.bmm(grad_scores, key).mul_(scaling)
    grad_key = torch.bmm(grad_scores.transpose(1, 2), content_query).mul_(scaling)
    # (reshape: content_query may be a strided view of the caller's query, which only a copy makes [H, B Q, D])
    position_query = content_query.reshape(heads, batch * q_len, head_dim).add(bias_shift[:, None]).mul_(scaling)
    grad_padded = grad_padded.view(heads, batch * q_len, k_len + 1)
    grad_position_query = torch.bmm(grad_padded, padded_rel_key)  # [H, B Q, D]
    grad_padded_rel_key = torch.bmm(grad_padded.transpose(1, 2), position_query)  # [H, K + 1, D]
    return grad_content_query, grad_position_query, grad_key, grad_value, grad_padded_rel_key


def relative_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scaling: float,
) -> torch.Tensor:
    """Relative attention without dropout, the contract of `modeling_txl.eager_relative_attention`: query
    `[B, H, Q, D]`, key and value `[B, H, K, D]`, rel_key `[H, K, D]`, content_bias / position_bias (u, v) `[H, D]`,
    mask `[Q, K]` or `[B, 1, Q, K]` (True = hidden) or None. Returns the output `[B, H, Q, D]`."""
    batch, heads, q_len, head_dim = query.shape
    k_len = key.shape[2]
    by_head = query.transpose(0, 1)  # [H, B, Q, D]
    content_query = (by_head + content_bias[:, None, None]).reshape(heads * batch, q_len, head_dim)
    position_query = ((by_head + position_bias[:, None, None]) * scaling).reshape(heads, batch * q_len, head_dim)
    key = key.transpose(0, 1).reshape(heads * batch, k_len, head_dim)
    value = value.transpose(0, 1).reshape(heads * batch, k_len, head_dim)
    additive_mask = None
    if mask is not None:  # [Q, K] or [B, 1, Q, K] -> [Q, K] or [B, Q, K], broadcast over the heads
        additive_mask = float_mask(mask, query.dtype)
        additive_mask = additive_mask if additive_mask.dim() == 2 else additive_mask[:, 0]
    bias_shift = (position_bias - content_bias).detach()
    output = _RelativeAttentionFunction.apply(
        content_query, position_query, key, value, pad_relative_keys(rel_key), additive_mask, bias_shift, scaling
    )
    return output.transpose(1, 2)  # [B, H, Q, D], a view of [B, Q, H, D]


# ---------------------------------------------------------------------------------------------------------------------
# Attention in inference: decoding one token, and long segments a block of queries at a time


def one_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scaling: float,
) -> torch.Tensor:
    """Relative attention for one query per sequence (Q = 1, decoding), without dropout: the contract of
    `modeling_txl.eager_relative_attention` (mask `[1, K]` or `[B, 1, 1, K]` or None), the output `[B, H, 1, D]`.

    One query needs no shift (its scores are already indexed by key position). The positional product is one matrix
    product per head, `[H, B, D] x [H, D, K]`, because W_{k,R} R is shared by the batch: a `[B, H, 1, D] @ [H, D, K]`
    broadcast would copy rel_key once per sequence. A float bias would also send SDPA to its masked kernel; here the
    content product is accumulated into the position scores, scaled in the same call. A decoded token's cost at batch
    1 is mostly per-call overhead (a few microseconds each), so this takes six calls that compute.
    """
    batch, heads, _, head_dim = query.shape
    k_len = key.shape[2]
    if batch == 1:  # [B H] is [H]: the head-major product is already batch-major (fewer calls: a token's cost)
        query = query.reshape(heads, 1, head_dim)
        position_scores = torch.bmm(query + position_bias.unsqueeze(1), rel_key.transpose(1, 2))  # [H, 1, K]
        content_query = query + content_bias.unsqueeze(1)  # [H, 1, D]
    else:
        query = query.reshape(batch, heads, head_dim)
        position_scores = torch.bmm((query + position_bias).transpose(0, 1), rel_key.transpose(1, 2))  # [H, B, K]
        position_scores = position_scores.transpose(0, 1).reshape(batch * heads, 1, k_len)  # a copy
        content_query = (query + content_bias).view(batch * heads, 1, head_dim)
    # The memory's keys and values are [B, H, K, D] views of one buffer each: [B H, K, D] views too.
    key = key.reshape(batch * heads, k_len, head_dim)
    scores = torch.baddbmm(position_scores, content_query, key.transpose(1, 2), beta=scaling, alpha=scaling)
    if mask is not None:  # [1, K] or [B, 1, 1, K]
        scores.view(batch, heads, 1, k_len).masked_fill_(mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=softmax_dtype(scores.dtype)).to(value.dtype)  # (as eager)
    output = torch.bmm(probs, value.reshape(batch * heads, k_len, head_dim))  # [B H, 1, D]
    return output.view(batch, heads, 1, head_dim)


def relative_attention_by_query_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor,
    *,
    scaling: float,
    block: int,
) -> torch.Tensor:
    """Relative attention without dropout, `block` queries at a time, each block against the keys it may see: the
    contract of `modeling_txl.eager_relative_attention` (the output `[B, H, Q, D]`), for inference.

    `mask` must hide every key after a query's own position (j > M + i, as every mask the model builds does):
    queries [s, e) then see keys [0, M + e) only, which is exactly a segment of e - s queries after a memory of M + s:
    the same relative attention over a prefix of the keys and the last M + e rows of rel_key. Skipping the hidden
    keys saves up to half of the score products of a causal segment, and a block's `[B H, e - s, M + e]` scores stay
    in the CPU's caches instead of going through memory several times. A block is computed as the training kernel's
    forward computes a segment (the mask added in the pass that lays out the position scores, the content product
    accumulated into them, one softmax), without what backward would need.
    """
    batch, heads, q_len, head_dim = query.shape
    k_len, dtype = key.shape[2], key.dtype  # (under autocast, the biases may be wider than the projections)
    mem_len = k_len - q_len
    content_query = ((query + content_bias[:, None]) * scaling).to(dtype).contiguous()  # [B, H, Q, D]
    position_query = ((query + position_bias[:, None]) * scaling).to(dtype).transpose(0, 1)  # [H, B, Q, D]
    # Batch-major: the memory's keys and values are [B, H, K, D] views of one buffer each, so these are views too.
    key = key.reshape(batch * heads, k_len, head_dim)  # [B H, K, D]
    value = value.reshape(batch * heads, k_len, head_dim)
    # A block's keys are the last M + e rows of rel_key; `shifted_product` wants a row before them, whose products
    # land only on the hidden entry j = M + i + 1 of each query: any row will do, the padding row for the last block.
    padded_rel_key = pad_relative_keys(rel_key.to(dtype))  # [H, K + 1, D]
    # Added, not selected with torch.where (several times faster on a CPU): [Q, K] or [B, 1, Q, K].
    additive_mask = float_mask(mask, dtype)
    output = value.new_empty(batch, q_len, heads, head_dim)  # the layout the output projection reads
    for start in range(0, q_len, block):
        end = min(q_len, start + block)
        rows, visible = end - start, mem_len + end
        # The position scores come out head-major (rel_key is per head, shared by the batch); the pass that adds
        # the mask lays them out batch-major.
        position_rows = position_query[:, :, start:end].reshape(heads, batch * rows, head_dim)  # [H, B C, D]
        shifted = shifted_product(position_rows, padded_rel_key[:, k_len - visible :], batch)  # [H, B, C, M + e]
        scores = key.new_empty(batch, heads, rows, visible)
        torch.add(shifted.transpose(0, 1), additive_mask[..., start:end, :visible], out=scores)
        content_rows = content_query[:, :, start:end].reshape(batch * heads, rows, head_dim)  # [B H, C, D]
        scores = scores.view(batch * heads, rows, visible).baddbmm_(content_rows, key[:, :visible].transpose(1, 2))
        if scores.dtype == torch.float32:  # in place: one block-sized tensor fewer
            probs = torch._softmax(scores, -1, False, out=scores)
        else:  # (autocast) in float32, as eager attention
            probs = torch.softmax(scores, dim=-1, dtype=softmax_dtype(scores.dtype)).to(value.dtype)
        block_output = torch.bmm(probs, value[:, :visible])  # [B H, C, D]
        output[:, start:end] = block_output.view(batch, heads, rows, head_dim).transpose(1, 2)
    # A query that sees no key at all (a padded position): eager attention's softmax is uniform over all K keys,
    # where a block's would be over the keys it reads; its output, the mean of every value, as eager's.
    unseeing = mask.all(dim=-1).reshape(-1, q_len)  # [1 or B, Q]
    if unseeing.any():
        mean_value = value.mean(dim=1).view(batch, 1, heads, head_dim)  # [B, 1, H, D]
        output = torch.where(unseeing[:, :, None, None], mean_value.to(output.dtype), output)
    return output.transpose(1, 2)  # [B, H, Q, D]


def compiled_attention_applies(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
) -> bool:
    """Whether the compiled kernels (`cpp_kernels_txl`, built on the first call) can compute this attention:
    float32 on the CPU without autocast, a head width that is a multiple of 8, a bool mask or none, not while a
    graph is traced (it must hold portable operators, not this machine's), and the kernel available here. The
    caller decides where the mask and gradients allow them."""
    return (
        (mask is None or mask.dtype == torch.bool)
        and not tracing()
        and query.shape[-1] % 8 == 0
        and all(
            tensor.device.type == "cpu" and tensor.dtype == torch.float32
            for tensor in (query, key, value, rel_key, content_bias, position_bias)
        )
        and not torch.is_autocast_enabled("cpu")
        and compiled_operators() is not None
    )


def _kernel_layouts(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """query, key, value, rel_key, content_bias, position_bias as the kernels read them: the first four with any
    strides but a contiguous last dimension (the model's views are), the `[H, D]` biases contiguous (a no-op for
    parameters)."""
    *attention, content_bias, position_bias = tensors
    attention = [tensor if tensor.stride(-1) == 1 else tensor.contiguous() for tensor in attention]
    return [*attention, content_bias.contiguous(), position_bias.contiguous()]


def _segment_mask(mask: torch.Tensor) -> torch.Tensor:
    """A segment's mask as the compiled kernels read it: `[Q, K]` or `[B, 1, Q, K]` -> `[1 or B, Q, K]` (views)."""
    return mask[None] if mask.dim() == 2 else mask[:, 0]


def compiled_relative_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor,
    *,
    scaling: float,
) -> torch.Tensor:
    """`relative_attention_by_query_blocks`'s contract (inference; `mask` hides every key after a query's own
    position) in one call of the compiled kernel: one parallel region instead of several per block of queries. The
    output `[B, H, Q, D]`, a view of `[B, Q, H, D]`."""
    mask = _segment_mask(mask)
    output = compiled_operators().relative_attention_inference(
        *_kernel_layouts(query, key, value, rel_key, content_bias, position_bias), mask, scaling
    )
    return output.transpose(1, 2)


def _compact(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`tensors` as they are where their storages hold nothing else, else compact copies: a query, key and value
    that are views of one projection of `[memory; segment]` (a hooked or adapted projection) would keep the memory
    rows' unused queries alive until backward."""
    storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes() for tensor in tensors}
    if sum(storages.values()) <= sum(tensor.numel() * tensor.element_size() for tensor in tensors):
        return tensors
    return tuple(tensor.contiguous() for tensor in tensors)


class _CompiledRelativeAttentionFunction(torch.autograd.Function):
    """`relative_attention` with the compiled kernel's forward (`cpp_kernels_txl`: only the keys each query sees,
    no score tensor but the probabilities it writes for backward) and `_RelativeAttentionFunction`'s backward, whose
    score gradient the kernel computes in one pass (`relative_attention_score_grad`). The head-major copies that
    backward reads are made there, from the inputs' views."""

    @staticmethod
    def forward(
        ctx,
        query: torch.Tensor,  # [B, H, Q, D]
        key: torch.Tensor,  # [B, H, K, D]
        value: torch.Tensor,  # [B, H, K, D]
        rel_key: torch.Tensor,  # [H, K, D]
        content_bias: torch.Tensor,  # [H, D]
        position_bias: torch.Tensor,  # [H, D]
        mask: torch.Tensor,  # [1 or B, Q, K] bool, hiding at least every key after a query's own position
        scaling: float,
    ) -> torch.Tensor:
        inputs = _kernel_layouts(query, key, value, rel_key, content_bias, position_bias)
        output, probs = compiled_operators().relative_attention_training_forward(*inputs, mask, scaling)
        ctx.save_for_backward(*_compact(*inputs[:3]), *inputs[3:], probs, output)
        ctx.scaling = scaling
        return output  # [B, Q, H, D]

    @staticmethod
    @_first_derivative("the relative attention's compiled CPU training kernel")
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, rel_key, content_bias, position_bias, probs, output = ctx.saved_tensors
        batch, heads, q_len, head_dim = query.shape
        k_len = key.shape[2]
        content_query = (query.transpose(0, 1) + content_bias[:, None, None]).reshape(heads * batch, q_len, head_dim)
        key = key.transpose(0, 1).reshape(heads * batch, k_len, head_dim)
        padded_rel_key, bias_shift = pad_relative_keys(rel_key), position_bias - content_bias
        # The score gradient in one pass of the kernel (which reads the values where they are). The kernel reads
        # rows with a contiguous last dimension: not an expanded gradient (that of a sum).
        grad_output = grad_output if grad_output.stride(-1) == 1 else grad_output.contiguous()
        grad_padded = compiled_operators().relative_attention_score_grad(grad_output, output, value, probs)
        grads = _relative_attention_backward(
            grad_output, content_query, key, None, padded_rel_key, bias_shift, probs, output, ctx.scaling, grad_padded
        )
        grad_content_query, grad_position_query, grad_key, grad_value, grad_padded_rel_key = grads
        grad_content_query = grad_content_query.view(heads, batch, q_len, head_dim)
        grad_position_query = grad_position_query.view(heads, batch, q_len, head_dim).mul_(ctx.scaling)
        grad_query = (grad_content_query + grad_position_query).transpose(0, 1)  # [B, H, Q, D]
        return (
            grad_query,
            grad_key.view(heads, batch, k_len, head_dim).transpose(0, 1),
            grad_value.view(heads, batch, k_len, head_dim).transpose(0, 1),
            grad_padded_rel_key[:, 1:],
            grad_content_query.sum((1, 2)),
            grad_position_query.sum((1, 2)),
            None,
            None,
        )


def compiled_relative_attention_training(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor,
    *,
    scaling: float,
) -> torch.Tensor:
    """`relative_attention`'s contract (training, no dropout) where `mask` hides every key after a query's own
    position (every mask the model builds for more than one query) and `compiled_attention_applies`: the forward in
    one call of the compiled kernel. The output `[B, H, Q, D]`, a view of `[B, Q, H, D]`."""
    mask = _segment_mask(mask)
    output = _CompiledRelativeAttentionFunction.apply(
        query, key, value, rel_key, content_bias, position_bias, mask, scaling
    )
    return output.transpose(1, 2)


def compiled_one_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_key: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scaling: float,
) -> torch.Tensor:
    """`one_query_attention`'s contract (decoding, inference; mask `[1, K]` or `[B, 1, 1, K]` or None) in one call
    of the compiled kernel instead of six: the output `[B, H, 1, D]`."""
    if mask is not None:
        mask = mask if mask.dim() == 2 else mask[:, 0, 0]  # [1 or B, K]
    return compiled_operators().relative_attention_one_query(
        *_kernel_layouts(query, key, value, rel_key, content_bias, position_bias), mask, scaling
    )


def one_row_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(inputs, weight, bias)` for one row (decoding a token at batch 1): `[..., in]` with one row in all ->
    `[..., out]`.

    A product with one row is a matrix-vector product, bound by reading the weight, which BLAS reads at rates that
    differ from CPU to CPU: on some near the memory's rate, on others at half of it, or at half of the rate at which
    it reads the weight as two halves, each multiplied by the row as a column in a batched product (one half per
    thread); docs/performance-log.md has the rates. A float32 weight goes through the compiled kernel where it is built
    (each thread streams its own rows: the memory's rate on both kinds); elsewhere the two halves. Falls back to
    `F.linear` when the rows do not split in two or the weight is not row-major.
    """
    out_features, in_features = weight.shape
    if not weight.is_contiguous():
        return F.linear(inputs, weight, bias)
    if (
        inputs.dtype == weight.dtype == torch.float32
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        and not torch.jit.is_tracing()  # (a traced graph holds portable operators)
        and (operators := compiled_operators()) is not None
    ):
        row = inputs.reshape(in_features).contiguous()  # one row: a view, or a copy of `in` floats when strided
        output = operators.row_linear(row, weight, bias)
        return output.view(*inputs.shape[:-1], out_features)
    if out_features % 2 != 0:
        return F.linear(inputs, weight, bias)
    halves = weight.view(2, out_features // 2, in_features)
    # The row as a column for both halves, strides (0, 1, in): what BLAS reads without a copy; one view, not three
    # (a decoded token makes a few hundred such calls, at about a microsecond each).
    if inputs.stride(-1) == 1:
        column = inputs.as_strided((2, in_features, 1), (0, 1, in_features))
    else:
        column = inputs.reshape(1, in_features).t().expand(2, in_features, 1)
    if bias is None:
        output = torch.bmm(halves, column)  # [2, out / 2, 1]
    else:
        output = torch.baddbmm(bias.view(2, out_features // 2, 1), halves, column)
    return output.view(*inputs.shape[:-1], out_features)


# ---------------------------------------------------------------------------------------------------------------------
# The keys and values of [memory; segment]


class _MemoryLinear(torch.autograd.Function):
    """`F.linear(cat([memory, segment], 1), weight)` whose backward computes the input's gradient for the segment's
    rows only: the memory is a stop-gradient (the paper's SG), so autograd would compute the memory rows' gradient
    and drop it at the concatenation, half of the key and value projection's input gradient when M = Q."""

    @staticmethod
    def forward(ctx, memory: torch.Tensor, segment: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        context = torch.cat([memory, segment], dim=1)  # [B, K, E]
        # (only what backward will read: a frozen weight needs no copy of the context kept, as with F.linear)
        ctx.save_for_backward(
            context if ctx.needs_input_grad[2] else None, weight if ctx.needs_input_grad[1] else None
        )
        ctx.mem_len = memory.shape[1]
        return F.linear(context, weight)  # [B, K, N]

    @staticmethod
    @_first_derivative("the memory's key and value projection (memory_linear)")  # (not on the eager path)
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        context, weight = ctx.saved_tensors
        grad_segment = grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_segment = torch.matmul(grad_output[:, ctx.mem_len :], weight)  # [B, Q, E]
        if ctx.needs_input_grad[2]:
            grad_weight = torch.mm(grad_output.flatten(0, 1).t(), context.flatten(0, 1))  # [N, E]
        return None, grad_segment, grad_weight


def memory_linear_applies(memory: torch.Tensor | None, segment: torch.Tensor) -> bool:
    """Whether `memory_linear` applies: gradients are on and the memory takes none, in eager mode without autocast
    (the Function computes in its inputs' dtype) or functorch transforms."""
    return (
        memory is not None
        and torch.is_grad_enabled()
        and not memory.requires_grad
        and not autocast_on(segment.device.type)
        and not torch.compiler.is_compiling()
        and not torch._C._are_functorch_transforms_active()
    )


def memory_linear(memory: torch.Tensor, segment: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(torch.cat([memory, segment], 1), weight)`, `[B, M + Q, N]`, the memory a stop-gradient: its rows get
    no input gradient (where `memory_linear_applies`)."""
    return _MemoryLinear.apply(memory, segment, weight)


# ---------------------------------------------------------------------------------------------------------------------
# Dropout


# splitmix64 (Steele, Lea and Flood 2014): word n of the stream `seed` is mix(seed + (n + 1) * GOLDEN), every step
# modulo 2^64. The constants as torch's int64 holds them (two's complement).
def _int64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


_GOLDEN, _MIX_1, _MIX_2 = (_int64(value) for value in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))
_WORDS_PER_PASS = 65536  # 512 KB of int64: the torch path's passes over the words stay in cache


def _stream_words(seed: int, count: int) -> torch.Tensor:
    """Words 0..count-1 of the dropout stream `seed`, `[count]` int64: what the compiled kernel's `stream_word`
    computes, in torch operators (arithmetic shifts masked into logical ones; products wrap as in C++)."""
    words = torch.empty(count, dtype=torch.int64)
    steps = torch.arange(1, min(count, _WORDS_PER_PASS) + 1, dtype=torch.int64).mul_(_GOLDEN)  # (n + 1) * GOLDEN
    shifted = torch.empty_like(steps)
    for start in range(0, count, _WORDS_PER_PASS):
        z = words[start : start + _WORDS_PER_PASS]
        t = shifted[: len(z)]
        torch.add(steps[: len(z)], _int64(seed + start * _GOLDEN), out=z)
        for shift, multiplier in ((30, _MIX_1), (27, _MIX_2), (31, None)):
            torch.bitwise_right_shift(z, shift, out=t).bitwise_and_(2 ** (64 - shift) - 1)
            z.bitwise_xor_(t)
            if multiplier is not None:
                z.mul_(multiplier)
    return words


def _dropout_seed() -> int:
    """A dropout mask's stream: one 64-bit draw from torch's CPU generator, so `torch.manual_seed` and a saved
    generator state (a checkpoint's) give the same masks."""
    return torch.empty((), dtype=torch.int64).random_(-(2**63), None).item()


def _dropout_threshold(p: float) -> int:
    """The int16 value from which an entry is kept: p rounded to a multiple of 2^-16 (at most 1 - 2^-16), those
    codes of a 16-bit entry's 2^16 drop it."""
    return min(round(p * 2**16), 2**16 - 1) - 2**15


def _keep_mask(inputs: torch.Tensor, p: float, seed: int | None = None) -> torch.Tensor:
    """A bool mask of `inputs`' shape, each entry True (kept) with probability 1 - p.

    On a CPU, entry i is kept where 16 bits of word i / 4 of the stream `seed` (drawn here if None), read as int16,
    are at least `_dropout_threshold(p)`: p is rounded to a multiple of 2^-16 (off by less than 8e-6). The stream is
    counter-based, so the compiled kernel draws the same mask in parallel, in one pass with the product (torch's
    CPU generator is serial, and a float uniform costs a draw per entry). Elsewhere, float uniforms.
    """
    if inputs.device.type != "cpu":
        return torch.rand_like(inputs) >= p
    count = inputs.numel()
    words = _stream_words(_dropout_seed() if seed is None else seed, (count + 3) // 4)
    return words.view(torch.int16)[:count].view(inputs.shape) >= _dropout_threshold(p)


def _factor(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask as a 0/1 factor to multiply by (the same products). A product with the mask's bytes read as uint8
    runs several times faster on a CPU than with bool, whose conversion to float is slow there; both are faster
    than `torch.where` or `masked_fill`."""
    return mask.view(torch.uint8)


def _compiled_dropout(tensor: torch.Tensor, saved: torch.Tensor | None = None) -> object | None:
    """The compiled kernel's operators where they take `tensor` (contiguous float32 on a CPU) and, in backward, what
    forward saved (contiguous), else None (the torch path, which draws the same mask)."""
    if (
        tensor.device.type == "cpu"
        and tensor.dtype == torch.float32
        and tensor.is_contiguous()
        and (saved is None or saved.is_contiguous())
    ):
        return compiled_operators()
    return None


class _Dropout(torch.autograd.Function):
    """Inverted dropout keeping its bool mask for backward (what `F.dropout` keeps too)."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, p: float) -> torch.Tensor:
        ctx.scale = 1.0 / (1.0 - p)
        if (operators := _compiled_dropout(inputs)) is not None:
            output, keep = operators.dropout_training_forward(
                inputs, _dropout_seed(), _dropout_threshold(p), ctx.scale
            )
        else:
            keep = _keep_mask(inputs, p)
            output = torch.mul(inputs, _factor(keep)).mul_(ctx.scale)
        ctx.save_for_backward(keep)
        return output

    @staticmethod
    def _second(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        """backward's gradient, differentiable: linear in the incoming gradient, the mask a constant."""
        (keep,) = ctx.saved_tensors
        return grad_output * _factor(keep) * ctx.scale, None

    @staticmethod
    @_first_derivative("dropout", twice=True)
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        if (operators := _compiled_dropout(grad_output, keep)) is not None:
            return operators.dropout_training_backward(grad_output, keep, ctx.scale), None
        return torch.mul(grad_output, _factor(keep)).mul_(ctx.scale), None


class _ReluDropout(torch.autograd.Function):
    """`dropout(relu(x))` keeping only its output for backward: where the output is 0, ReLU or dropout zeroed it and
    the gradient is 0 either way; elsewhere it is `1 / (1 - p)`. The output (which the next linear layer keeps
    anyway) replaces ReLU's saved output and dropout's mask: two `[B, Q, d_inner]` tensors fewer per layer."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, p: float) -> torch.Tensor:
        ctx.scale = 1.0 / (1.0 - p)
        if (operators := _compiled_dropout(inputs)) is not None:
            output = operators.relu_dropout_training_forward(inputs, _dropout_seed(), _dropout_threshold(p), ctx.scale)
        else:
            output = torch.mul(inputs, _factor(_keep_mask(inputs, p))).relu_().mul_(ctx.scale)
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def _second(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        """backward's gradient, differentiable: linear in the incoming gradient; where the output is positive a
        constant (ReLU's second derivative is 0)."""
        (output,) = ctx.saved_tensors
        return grad_output * (output > 0) * ctx.scale, None

    @staticmethod
    @_first_derivative("dropout", twice=True)
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (output,) = ctx.saved_tensors
        if (operators := _compiled_dropout(grad_output, output)) is not None:
            return operators.dropout_training_backward(grad_output, output, ctx.scale), None
        # ReLU's own backward (the gradient where the output is positive): one pass, no mask materialised
        return torch.ops.aten.threshold_backward(grad_output, output, 0.0).mul_(ctx.scale), None


def _dropout_applies(inputs: torch.Tensor, p: float, training: bool) -> bool:
    """Whether the Functions above apply: training, in eager mode, p in [2^-8, 1 - 2^-8] (where rounding p to a
    multiple of 2^-16 moves p and 1 - p by at most 0.2%; nearer 0 or 1, torch's own). With or without a gradient:
    reentrant gradient checkpointing runs a layer's forward without one and again with one for backward, and both
    must draw the same mask (torch's own draws another from the same seed). Under
    torch.compile, torch's own dropout (fused there anyway): torch 2.11's compile gave a zero gradient through a
    Function whose forward writes its output in place, as these do (`--compile` training learned nothing), and its
    inductor could not lower the mask's bool-as-uint8 view. Under torch.jit.trace, torch's own too: a traced graph
    holds portable operators, and TorchScript has no view to another dtype."""
    return (
        training
        and 2**-8 <= p <= 1 - 2**-8
        and not torch._C._are_functorch_transforms_active()
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
    )


def dropout(inputs: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(inputs, p, training)`: the same distribution, a cheaper mask (`_dropout_applies`)."""
    return _Dropout.apply(inputs, p) if _dropout_applies(inputs, p, training) else F.dropout(inputs, p, training)


def relu_dropout(inputs: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(F.relu(inputs), p, training)`, keeping only the output for backward (`_dropout_applies`)."""
    if not _dropout_applies(inputs, p, training):
        return F.dropout(F.relu(inputs), p, training)
    return _ReluDropout.apply(inputs, p)


# ---------------------------------------------------------------------------------------------------------------------
# Adaptive softmax loss

ClusterTensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # weight [n_i, d_i], bias [n_i], proj [E, d_i]


def adaptive_nll(
    hidden_states: torch.Tensor,
    targets: torch.Tensor,
    clusters: Sequence[ClusterTensors],
    bounds: Sequence[int],
    *,
    ignore_index: int = -100,
    chunk_rows: int,
) -> torch.Tensor:
    """Negative log-likelihood `[N]` (0 where ignored) of `targets` `[N]` under an adaptive softmax, the contract of
    `TxlAdaptiveLogSoftmax._nll`, with the gradients computed in the forward `chunk_rows` rows at a time.

    `clusters[i]` holds the weight, bias and projection (or None) that give cluster i's logits from the hidden states
    `[N, E]`: `(h @ projection) @ weight^T + bias`. Cluster 0, the head, scores token ids `[0, bounds[1])` and then
    one logit per tail cluster; tail cluster i scores ids `[bounds[i], bounds[i + 1])`. Each cluster is a
    cross-entropy (a tail token's head target is its cluster's logit) whose gradient with respect to its logits,
    softmax - one-hot, is computed in place in the logits' buffer: no `[N, n_i]` tensor is kept for backward. What is
    kept are the gradients of `nll.sum()`, scaled in backward when the incoming gradient is the same for every row (a
    mean or a sum of the losses); any other incoming gradient (weighted losses) runs the chunks again with it as row
    weights. The cluster tensors may be views, slices or concatenations of parameters, and share them (tied weights):
    autograd takes their gradients back to the parameters.
    """
    flat = [tensor for cluster in clusters for tensor in cluster]
    return _ChunkedAdaptiveNLL.apply(targets, ignore_index, chunk_rows, tuple(bounds), hidden_states, *flat)


class _ChunkedAdaptiveNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, targets, ignore_index, chunk_rows, bounds, hidden_states, *flat):
        clusters = [tuple(flat[index : index + 3]) for index in range(0, len(flat), 3)]
        nll, grads = _adaptive_nll_and_grads(hidden_states, targets, clusters, bounds, ignore_index, chunk_rows)
        ctx.ignore_index, ctx.chunk_rows, ctx.bounds = ignore_index, chunk_rows, bounds
        ctx.save_for_backward(hidden_states, targets, *flat, *grads)
        ctx.num_flat = len(flat)
        return nll  # [N]

    @staticmethod
    def _second(ctx, grad_nll: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """backward's gradients, differentiable: the NLL computed again by autograd (`_readable_adaptive_nll`) from
        the saved inputs, which carry their graphs here, and differentiated with `create_graph`."""
        hidden_states, targets, *rest = ctx.saved_tensors
        # Aliases (one node each): the gradient for each input alone. The inputs themselves may depend on each other
        # (hidden states from an embedding tied to an output layer), and autograd.grad would follow those paths too.
        inputs = [
            None if tensor is None else tensor.view_as(tensor) for tensor in (hidden_states, *rest[: ctx.num_flat])
        ]
        wanted = [i for i, tensor in enumerate(inputs) if tensor is not None and ctx.needs_input_grad[4 + i]]
        hidden_states, flat = inputs[0], inputs[1:]
        clusters = [tuple(flat[index : index + 3]) for index in range(0, len(flat), 3)]
        nll = _readable_adaptive_nll(hidden_states, targets, clusters, ctx.bounds, ctx.ignore_index)
        found = torch.autograd.grad(nll, [inputs[i] for i in wanted], grad_nll, create_graph=True, allow_unused=True)
        grads: list[torch.Tensor | None] = [None] * len(inputs)
        for i, grad in zip(wanted, found):
            grads[i] = grad if grad is not None else torch.zeros_like(inputs[i])
        return None, None, None, None, *grads

    @staticmethod
    @_first_derivative("the adaptive softmax's loss", twice=True)
    def backward(ctx, grad_nll: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden_states, targets, *rest = ctx.saved_tensors
        flat, grads = rest[: ctx.num_flat], rest[ctx.num_flat :]
        if grad_nll.numel() == 0:  # no rows: nothing to scale (the gradients of nothing are 0)
            grads = [None if grad is None else torch.zeros_like(grad) for grad in grads]
        elif torch.equal(grad_nll, grad_nll[:1].expand_as(grad_nll)):  # the usual case: one scale for every row
            grads = [None if grad is None else grad * grad_nll[0] for grad in grads]  # not in place: retain_graph
        else:
            clusters = [tuple(flat[index : index + 3]) for index in range(0, len(flat), 3)]
            _, grads = _adaptive_nll_and_grads(
                hidden_states, targets, clusters, ctx.bounds, ctx.ignore_index, ctx.chunk_rows, grad_nll
            )
        return None, None, None, None, *grads


def _readable_adaptive_nll(
    hidden_states: torch.Tensor,
    targets: torch.Tensor,
    clusters: Sequence[ClusterTensors],
    bounds: Sequence[int],
    ignore_index: int,
) -> torch.Tensor:
    """`adaptive_nll`'s values `[N]` by plain autograd, every cluster's log-softmax over every row (for the second
    derivative's rare backward, where its memory does not matter)."""
    shortlist_size = bounds[1]
    valid = targets != ignore_index

    def log_probs(cluster: int) -> torch.Tensor:  # [N, n_i]
        weight, bias, projection = clusters[cluster]
        inputs = hidden_states if projection is None else hidden_states @ projection
        return F.log_softmax(F.linear(inputs, weight, bias).float(), dim=-1)

    head_targets = torch.where(valid & (targets < shortlist_size), targets, 0)
    tail_terms = torch.zeros(hidden_states.shape[0], dtype=torch.float32, device=hidden_states.device)
    for cluster in range(1, len(clusters)):
        low, high = bounds[cluster], bounds[cluster + 1]
        in_cluster = (targets >= low) & (targets < high)
        head_targets = torch.where(in_cluster, shortlist_size + cluster - 1, head_targets)
        inside = log_probs(cluster).gather(1, torch.where(in_cluster, targets - low, 0)[:, None]).squeeze(1)
        tail_terms = tail_terms + torch.where(in_cluster, inside, 0.0)
    head = log_probs(0).gather(1, head_targets[:, None]).squeeze(1)
    return torch.where(valid, -(head + tail_terms), 0.0)


def _adaptive_nll_and_grads(
    hidden_states: torch.Tensor,
    targets: torch.Tensor,
    clusters: Sequence[ClusterTensors],
    bounds: Sequence[int],
    ignore_index: int,
    chunk_rows: int,
    grad_nll: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """The NLL `[N]` and the gradients of `(nll * grad_nll).sum()` (`nll.sum()` when None): hidden states first, then
    each cluster tensor in `clusters`' order (None where a projection is None)."""
    num_rows, shortlist_size, num_clusters = hidden_states.shape[0], bounds[1], len(clusters)
    cluster_grads = [  # None where no gradient is wanted (a frozen output layer: fine-tuning with adapters)
        [torch.zeros_like(tensor) if tensor is not None and tensor.requires_grad else None for tensor in cluster]
        for cluster in clusters
    ]
    nll = torch.zeros(num_rows, dtype=torch.float32, device=hidden_states.device)
    grad_hidden = torch.zeros_like(hidden_states)
    valid = targets != ignore_index
    row_weights = valid.to(hidden_states.dtype) if grad_nll is None else torch.where(valid, grad_nll, 0.0)
    # The head's target: the token itself, or the logit of its tail cluster.
    head_targets = torch.where(valid & (targets < shortlist_size), targets, 0)
    for cluster in range(1, num_clusters):
        in_cluster = (targets >= bounds[cluster]) & (targets < bounds[cluster + 1])
        head_targets = torch.where(in_cluster, shortlist_size + cluster - 1, head_targets)

    for start in range(0, num_rows, chunk_rows):
        rows = slice(start, start + chunk_rows)
        nll[rows], grad_hidden[rows] = _cross_entropy_and_grads(
            hidden_states[rows], head_targets[rows], row_weights[rows], clusters[0], cluster_grads[0]
        )
        chunk_targets = targets[rows]
        for cluster in range(1, num_clusters):
            low, high = bounds[cluster], bounds[cluster + 1]
            cluster_rows = ((chunk_targets >= low) & (chunk_targets < high)).nonzero().squeeze(1) + start
            if cluster_rows.numel() == 0:
                continue
            cluster_nll, cluster_grad = _cross_entropy_and_grads(
                hidden_states[cluster_rows],
                targets[cluster_rows] - low,
                row_weights[cluster_rows],
                clusters[cluster],
                cluster_grads[cluster],
            )
            nll.index_add_(0, cluster_rows, cluster_nll)
            grad_hidden.index_add_(0, cluster_rows, cluster_grad)
    nll.masked_fill_(~valid, 0.0)
    return nll, [grad_hidden, *(grad for grads in cluster_grads for grad in grads)]


def _cross_entropy_and_grads(
    hidden_states: torch.Tensor,  # [n, E]
    targets: torch.Tensor,  # [n], indices into the cluster
    row_weights: torch.Tensor,  # [n]
    cluster: ClusterTensors,
    cluster_grads: list,  # [weight, bias, projection] gradients of the cluster, added to in place
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy `[n]` of one cluster and the gradient of `sum(row_weights * cross-entropy)` for the hidden
    states `[n, E]`; the cluster's own gradients are added to `cluster_grads`."""
    weight, bias, projection = cluster
    inputs = hidden_states if projection is None else hidden_states @ projection  # [n, d_i]
    logits = F.linear(inputs, weight, bias)  # [n, n_i]
    target_logits = logits.gather(1, targets[:, None]).squeeze(1)
    row_max = logits.amax(dim=1)
    exp_logits = logits.sub_(row_max[:, None]).exp_()  # in the logits' buffer, as everything below
    row_sum = exp_logits.sum(dim=1)
    cross_entropy = row_max + row_sum.log() - target_logits
    grad_logits = exp_logits.mul_((row_weights / row_sum)[:, None])  # softmax, times the row weight
    grad_logits.scatter_add_(1, targets[:, None], -row_weights[:, None])  # - one-hot, times the row weight
    grad_weight, grad_bias, grad_projection = cluster_grads
    if grad_weight is not None:
        grad_weight.addmm_(grad_logits.T, inputs)  # [n_i, d_i]
    if grad_bias is not None:
        grad_bias.add_(grad_logits.sum(0))
    grad_inputs = grad_logits @ weight  # [n, d_i]
    if projection is None:
        return cross_entropy, grad_inputs
    if grad_projection is not None:
        grad_projection.addmm_(hidden_states.T, grad_inputs)  # [E, d_i]
    return cross_entropy, grad_inputs @ projection.T
