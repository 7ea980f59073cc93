"""The fast paths equal the readable ones: the copy-free shift, the fused ReLU-dropout, the sliced query projection,
the static-shape loss used under torch.compile, and the compiled model itself."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F
import torch.nn.utils.prune

from tests.test_modeling_txl import VARIANTS, covering_ids
from tests.utils import LogitsOnly, tiny_config, tiny_lm
from tools.configs import model_config
from transfoxl import TxlConfig, TxlForCausalLM, TxlMemory, fast_paths_txl, kernels_txl
from transfoxl.cpp_kernels_txl import compiled_operators
from transfoxl.kernels_txl import dropout as kernel_dropout
from transfoxl.kernels_txl import (
    float_mask,
    memory_linear,
    memory_linear_applies,
    one_query_attention,
    one_row_linear,
    relative_attention,
    relative_attention_applies,
    relative_attention_by_query_blocks,
    relu_dropout,
)
from transfoxl.modeling_txl import (
    TxlDropout,
    _memory_of,
    causal_memory_mask,
    eager_relative_attention,
    relative_shift,
    shifted_position_scores,
)


@pytest.mark.parametrize(("q_len", "mem_len"), [(1, 0), (1, 6), (4, 0), (4, 5), (7, 3)])
def test_shifted_position_scores_equal_relative_shift(q_len, mem_len):
    torch.manual_seed(q_len * 10 + mem_len)
    k_len = q_len + mem_len
    query = torch.randn(2, 3, q_len, 8, requires_grad=True)
    rel_key = torch.randn(3, k_len, 8, requires_grad=True)
    expected = relative_shift(query @ rel_key.transpose(-1, -2))
    shifted = shifted_position_scores(query, rel_key)
    assert shifted.shape == (2, 3, q_len, k_len)
    visible = torch.ones(q_len, k_len, dtype=torch.bool).tril(mem_len)  # entries above the diagonal are unspecified
    # The two products sum in different orders: equal up to float32 rounding (1e-5, the issue's bound).
    torch.testing.assert_close(shifted[..., visible], expected[..., visible], rtol=0, atol=1e-5)

    weights = torch.randn(2, 3, q_len, k_len) * visible
    grads = torch.autograd.grad((shifted * weights).sum(), (query, rel_key))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (query, rel_key))
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("q_len", "mem_len", "mask_kind"),
    [(5, 4, "causal"), (5, 0, "causal"), (1, 6, "none"), (4, 3, "padding"), (6, 2, "same_length")],
)
def test_cpu_training_kernel_equals_eager_attention(q_len, mem_len, mask_kind):
    torch.manual_seed(q_len * 10 + mem_len)
    batch, heads, head_dim, k_len = 3, 2, 8, q_len + mem_len
    query = torch.randn(batch, q_len, heads, head_dim).transpose(1, 2).requires_grad_()  # strided, as in the model
    key_value = torch.randn(batch, k_len, 2 * heads, head_dim).transpose(1, 2).requires_grad_()
    rel_key = torch.randn(heads, k_len, head_dim, requires_grad=True)
    content_bias = torch.randn(heads, head_dim, requires_grad=True)
    position_bias = torch.randn(heads, head_dim, requires_grad=True)
    mask = None
    if mask_kind != "none":
        same_length = mask_kind == "same_length"
        mask = causal_memory_mask(q_len, mem_len, same_length=same_length, max_mem_len=mem_len, device="cpu")
    if mask_kind == "padding":  # the first key of sequence 1 is padding: a [B, 1, Q, K] mask
        mask = mask[None, None].repeat(batch, 1, 1, 1)
        mask[1, :, :, 0] = True
    inputs = (query, key_value, rel_key, content_bias, position_bias)
    weights = torch.randn(batch, heads, q_len, head_dim)
    results = []
    for function in (eager_relative_attention, relative_attention):
        key, value = key_value.chunk(2, dim=1)
        options = {"dropout": 0.0} if function is eager_relative_attention else {}
        output = function(query, key, value, rel_key, content_bias, position_bias, mask, scaling=0.3, **options)
        output = output[0] if isinstance(output, tuple) else output
        results.append((output, torch.autograd.grad((output * weights).sum(), inputs)))
    (expected, expected_grads), (output, grads) = results
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize("heads", [1, 2])
def test_cpu_training_kernel_takes_a_query_whose_last_dimension_is_strided(heads):
    """A direct caller's query may be any view: with one head, the backward's head-major query stayed a view that
    could not be reshaped in place ("view size is not compatible"; found by a helper's fuzz)."""
    torch.manual_seed(heads)
    batch, q_len, mem_len, head_dim = 2, 4, 3, 8
    query = torch.randn(batch, heads, head_dim, q_len).transpose(2, 3).requires_grad_()  # [B, H, Q, D], stride(-1) Q
    key, value = torch.randn(2, batch, heads, q_len + mem_len, head_dim)
    rel_key, content_bias, position_bias = (
        torch.randn(heads, q_len + mem_len, head_dim),
        *torch.randn(2, heads, head_dim),
    )
    mask = causal_memory_mask(q_len, mem_len, same_length=False, max_mem_len=mem_len, device="cpu")
    inputs = (query, key, value, rel_key, content_bias, position_bias, mask)
    expected = eager_relative_attention(*inputs, scaling=0.3, dropout=0.0)[0]
    output = relative_attention(*inputs, scaling=0.3)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)
    weights = torch.randn_like(output)
    (grad,) = torch.autograd.grad((output * weights).sum(), query)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), query)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


def test_chunked_training_loss_of_no_rows_has_zero_gradients():
    """`adaptive_nll` of zero rows (a direct caller's empty batch): its backward read the first row's scale."""
    torch.manual_seed(0)
    clusters = [
        (torch.randn(6, 4, requires_grad=True), torch.randn(6, requires_grad=True), None),
        (torch.randn(3, 4, requires_grad=True), torch.randn(3, requires_grad=True), None),
    ]
    hidden_states = torch.randn(0, 4, requires_grad=True)
    targets = torch.zeros(0, dtype=torch.long)
    nll = kernels_txl.adaptive_nll(hidden_states, targets, clusters, [0, 5, 8], ignore_index=-100, chunk_rows=4)
    assert nll.shape == (0,)
    grads = torch.autograd.grad(nll.sum(), [hidden_states, *clusters[0][:2]])
    assert all(not grad.any() for grad in grads)


def _attention_inputs(batch, heads, q_len, mem_len, head_dim=8, seed=0):
    """Query, key, value (strided views, as in the model), rel_key and the biases of a relative attention."""
    torch.manual_seed(seed)
    k_len = q_len + mem_len
    query = torch.randn(batch, q_len, heads, head_dim).transpose(1, 2)
    key, value = torch.randn(batch, k_len, 2 * heads, head_dim).transpose(1, 2).chunk(2, dim=1)
    rel_key = torch.randn(heads, k_len, head_dim)
    return query, key, value, rel_key, torch.randn(heads, head_dim), torch.randn(heads, head_dim)


def _mask(kind, batch, q_len, mem_len, max_mem_len):
    """None, the causal mask, the same_length one, or the causal one with padded keys (row 1's first and last
    memory positions) as a [B, 1, Q, K] mask."""
    if kind == "none":
        return None
    same_length = kind == "same_length"
    mask = causal_memory_mask(q_len, mem_len, same_length=same_length, max_mem_len=max_mem_len, device="cpu")
    if mask is None:  # one query that sees every key
        mask = torch.zeros(q_len, q_len + mem_len, dtype=torch.bool)
    if kind == "padding":
        mask = mask[None, None].repeat(batch, 1, 1, 1)
        mask[1, ..., 0] = True
        mask[1, ..., max(0, mem_len - 1)] = True
    return mask


@pytest.mark.parametrize(
    ("batch", "mem_len", "mask_kind"),
    [
        (3, 0, "none"),
        (3, 9, "none"),
        (3, 9, "padding"),
        (3, 12, "same_length"),
        (1, 9, "none"),
        (1, 12, "same_length"),
    ],
)
def test_one_query_attention_equals_eager_attention(batch, mem_len, mask_kind):
    """Decoding's path (one query, the positional product per head, no SDPA) gives eager's output, also with the
    padding and same_length masks a decoded token may carry, at batch 1 (head-major is batch-major: no layout pass)
    and above (laid out batch-major); gradients too (plain autograd), and without them."""
    heads = 4
    inputs = _attention_inputs(batch, heads, 1, mem_len)
    mask = _mask(mask_kind, batch, 1, mem_len, max_mem_len=8)
    with torch.no_grad():
        expected, _ = eager_relative_attention(*inputs, mask, scaling=0.3, dropout=0.0)
        torch.testing.assert_close(one_query_attention(*inputs, mask, scaling=0.3), expected, rtol=0, atol=1e-5)
    for tensor in inputs:
        tensor.requires_grad_()
    expected, _ = eager_relative_attention(*inputs, mask, scaling=0.3, dropout=0.0)
    output = one_query_attention(*inputs, mask, scaling=0.3)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)
    weights = torch.randn_like(expected)
    grads = torch.autograd.grad((output * weights).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("q_len", "mem_len", "block", "mask_kind"),
    [
        (10, 0, 4, "causal"),
        (10, 7, 3, "causal"),
        (9, 5, 9, "causal"),
        (11, 6, 4, "padding"),
        (12, 8, 5, "same_length"),
        (20, 0, 8, "left_padding"),
    ],
)
def test_attention_by_query_blocks_equals_the_whole_segment(q_len, mem_len, block, mask_kind):
    """A block of queries against the keys up to its last query (a memory of M + s, a segment of e - s) is the
    same relative attention: the blocks together give the whole segment's output, for the causal, padded and
    same_length masks (keys beyond the frontier are hidden by all of them). A left-padded row's padded queries see
    no key: eager's output there is the mean of every value, which the blocks gave over their own keys only."""
    batch, heads = 3, 2
    inputs = _attention_inputs(batch, heads, q_len, mem_len, seed=q_len + mem_len)
    if mask_kind == "left_padding":  # row 1's first 5 tokens are padding, as keys: its first 5 queries see nothing
        mask = _mask("causal", batch, q_len, mem_len, max_mem_len=mem_len)[None, None].repeat(batch, 1, 1, 1)
        mask[1, ..., :5] = True
    else:
        mask = _mask(mask_kind, batch, q_len, mem_len, max_mem_len=mem_len)
    expected, _ = eager_relative_attention(*inputs, mask, scaling=0.3, dropout=0.0)
    output = relative_attention_by_query_blocks(*inputs, mask, scaling=0.3, block=block)
    assert output.shape == expected.shape
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)


def test_float_mask_is_made_once_per_mask_and_follows_writes_dtypes_and_inference_tensors():
    """The layers of a forward share one bool mask: its float form is made once and reused, made again after a
    write into the mask or for another dtype, and made afresh for an inference tensor (no version to check)."""

    def expected(mask, dtype):
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(mask, torch.finfo(dtype).min)

    mask = torch.ones(4, 7, dtype=torch.bool).triu_(4)  # 4 queries after 3 memory positions: j > 3 + i hidden
    first = float_mask(mask, torch.float32)
    torch.testing.assert_close(first, expected(mask, torch.float32), rtol=0, atol=0)
    assert float_mask(mask, torch.float32) is first  # the second layer reuses it

    mask[0, :] = True  # a write into the mask is seen
    torch.testing.assert_close(float_mask(mask, torch.float32), expected(mask, torch.float32), rtol=0, atol=0)
    half = float_mask(mask, torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.min() == torch.finfo(torch.bfloat16).min

    float_mask(mask, torch.float32)
    copied = copy.deepcopy(mask)  # carries the attribute into a new storage, whose version starts again
    copied[3, :] = True  # one write: the copy's version now equals the one kept with the original's float form
    torch.testing.assert_close(float_mask(copied, torch.float32), expected(copied, torch.float32), rtol=0, atol=0)

    with torch.inference_mode():
        inference_mask = torch.ones(4, 7, dtype=torch.bool).triu_(4)
        made = float_mask(inference_mask, torch.float32)
        inference_mask[:, 0] = True  # inference tensors have no version: nothing may be kept for them
        torch.testing.assert_close(
            float_mask(inference_mask, torch.float32), expected(inference_mask, torch.float32), rtol=0, atol=0
        )
        assert not torch.equal(made, float_mask(inference_mask, torch.float32))


def test_query_blocks_shrink_to_the_byte_budget_and_still_match_eager(monkeypatch):
    """A block's rows are `query_block` while its [B, H, rows, K] scores fit `block_bytes`, else the multiple of 8
    (at least 8) that fits; the model's logits do not change with the block size."""
    from transfoxl import modeling_txl

    attention = tiny_lm().transformer.layers[0].attention
    query = torch.zeros(2, 4, 1, 8)  # [B, H, ., D]: 32 bytes of scores per key and query row
    assert attention._block_rows(query, 100) == 64  # 64 rows: 200 KB, under 4 MB
    monkeypatch.setattr(modeling_txl.TxlRelativeAttention, "block_bytes", 32 * 100 * 20)
    assert attention._block_rows(query, 100) == 16  # 20 rows fit: down to a multiple of 8
    assert attention._block_rows(query, 1000) == 8  # 2 rows fit: at least 8
    blocks = []

    def recording(*args, block, **kwargs):
        blocks.append(block)
        return relative_attention_by_query_blocks(*args, block=block, **kwargs)

    monkeypatch.setattr(modeling_txl, "relative_attention_by_query_blocks", recording)
    monkeypatch.setenv("TRANSFOXL_CPU_KERNEL", "0")  # the torch path (the compiled kernel has no blocks to size)
    monkeypatch.setattr(modeling_txl.TxlRelativeAttention, "query_block", 16)  # 40 queries: blocks
    monkeypatch.setattr(modeling_txl.TxlRelativeAttention, "block_bytes", 32 * 40 * 12)  # 12 rows of 40 keys fit
    fast = tiny_lm(mem_len=16, attn_implementation="sdpa")
    eager = tiny_lm(mem_len=16, attn_implementation="eager")
    ids = covering_ids(97, batch=2, length=40)
    with torch.no_grad():
        torch.testing.assert_close(fast(ids).logits, eager(ids).logits, rtol=0, atol=1e-5)
    assert blocks == [8] * fast.config.n_layer


def test_cpu_training_kernel_is_taken_only_where_it_applies():
    leaf = torch.randn(2, 3, requires_grad=True)
    plain = torch.randn(2, 3)
    assert relative_attention_applies(leaf, plain, plain, plain, dropout=0.0)
    assert not relative_attention_applies(leaf, plain, plain, plain, dropout=0.1)  # SDPA draws the dropout
    assert not relative_attention_applies(plain, plain, plain, plain, dropout=0.0)  # inference: SDPA's fused kernel
    with torch.no_grad():
        assert not relative_attention_applies(leaf, plain, plain, plain, dropout=0.0)
    assert not relative_attention_applies(leaf.double(), plain, plain, plain, dropout=0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not relative_attention_applies(leaf, plain, plain, plain, dropout=0.0)


def test_relu_dropout_keeps_relu_values_drops_at_rate_p_and_backpropagates_through_kept_units():
    torch.manual_seed(0)
    inputs = torch.randn(64, 512, requires_grad=True)
    p = 0.25
    output = relu_dropout(inputs, p, training=True)
    positive = inputs > 0
    kept = output != 0
    assert not kept[~positive].any()  # ReLU zeros stay zero
    torch.testing.assert_close(output[kept], inputs[kept] / (1 - p))
    drop_rate = 1 - kept[positive].float().mean().item()
    assert abs(drop_rate - p) < 0.02
    grad_output = torch.randn_like(output)
    (grad,) = torch.autograd.grad(output, inputs, grad_output)
    torch.testing.assert_close(grad, torch.where(kept, grad_output / (1 - p), 0.0))


def test_relu_dropout_is_plain_relu_in_evaluation_and_without_dropout():
    inputs = torch.randn(8, 16, requires_grad=True)
    assert torch.equal(relu_dropout(inputs, 0.3, training=False), F.relu(inputs))
    assert torch.equal(relu_dropout(inputs, 0.0, training=True), F.relu(inputs))


def _splitmix64(seed: int, index: int) -> int:
    """Word `index` of splitmix64's stream from `seed` (Steele, Lea and Flood 2014), Python integers, as int64."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) % 2**64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB % 2**64
    z ^= z >> 31
    return z - 2**64 if z >= 2**63 else z


@pytest.mark.parametrize("seed", [0, 1, -1, 2**63 - 1, -(2**63), 0x0123456789ABCDEF])
def test_the_dropout_stream_is_splitmix64(seed):
    """The torch path's words (int64 products wrapping, arithmetic shifts masked into logical ones, processed a pass
    of 65,536 words at a time) equal splitmix64 computed with Python integers, across a pass boundary."""
    words = kernels_txl._stream_words(seed, 65536 + 9)
    for index in (0, 1, 2, 1000, 65535, 65536, 65544):
        assert words[index].item() == _splitmix64(seed, index), index


def test_a_dropout_mask_reads_16_bits_of_the_stream_per_entry():
    """Entry i is kept where bits 16 (i % 4) .. 16 (i % 4) + 15 of word i / 4, as int16, reach the threshold; p is
    rounded to a multiple of 2^-16, and one word of torch's generator picks the stream (manual_seed repeats it)."""
    inputs = torch.empty(3, 7)  # 21 entries: 6 words, the last one partly used
    torch.manual_seed(5)
    seed = kernels_txl._dropout_seed()
    torch.manual_seed(5)
    mask = kernels_txl._keep_mask(inputs, 0.3)
    threshold = round(0.3 * 2**16) - 2**15
    assert kernels_txl._dropout_threshold(0.3) == threshold
    for entry in range(21):
        bits = (_splitmix64(seed, entry // 4) >> (16 * (entry % 4))) & 0xFFFF
        assert mask.flatten()[entry].item() == (bits - 2**16 * (bits >= 2**15) >= threshold), entry
    assert kernels_txl._dropout_threshold(1 - 1e-9) == 2**15 - 1  # p just below 1: one code in 2^16 still keeps


def test_relu_dropout_of_a_non_contiguous_input_backpropagates():
    """A transposed input takes the torch path forward (its output keeps the input's strides); backward then takes
    the torch path too, and the gradient flows through exactly the kept units."""
    inputs = torch.randn(64, 48).t().requires_grad_()
    output = relu_dropout(inputs, 0.3, training=True)
    grad_output = torch.randn(48, 64)
    (grad,) = torch.autograd.grad(output, inputs, grad_output)
    torch.testing.assert_close(grad, torch.where(output > 0, grad_output / 0.7, 0.0))


@pytest.mark.parametrize("p", [1e-3, 1 - 1e-3])
def test_dropout_near_0_or_1_is_torchs_own(p):
    """Rounding p to a multiple of 2^-16 would move p or 1 - p by more than 0.2% there: torch's dropout, whose kept
    units are scaled by 1 / (1 - p) for exactly that p."""
    inputs = torch.randn(4, 8, requires_grad=True)
    assert not kernels_txl._dropout_applies(inputs, p, True)
    assert kernels_txl._dropout_applies(inputs, 2**-8, True) and kernels_txl._dropout_applies(inputs, 1 - 2**-8, True)


def test_txl_dropout_drops_at_rate_p_scales_the_rest_and_backpropagates_through_its_mask():
    torch.manual_seed(0)
    dropout = TxlDropout(0.3).train()
    inputs = torch.randn(64, 512, requires_grad=True)
    output = dropout(inputs)
    kept = output != 0
    assert abs(1 - kept.float().mean().item() - 0.3) < 0.02
    torch.testing.assert_close(output[kept], inputs[kept] / 0.7)
    grad_output = torch.randn_like(output)
    (grad,) = torch.autograd.grad(output, inputs, grad_output)
    torch.testing.assert_close(grad, torch.where(kept, grad_output / 0.7, 0.0))
    assert torch.equal(dropout.eval()(inputs), inputs)  # evaluation: identity, like nn.Dropout
    assert isinstance(dropout, torch.nn.Dropout) and dropout.state_dict() == {}


def _softmax_losses_and_grads(model, hidden_states, targets, reduce, chunked: bool):
    """Per-token losses and the gradients of `reduce(losses)` for the hidden states and every softmax parameter."""
    softmax = model.adaptive_softmax
    losses = softmax.nll(hidden_states, targets) if chunked else softmax._nll(hidden_states, targets)
    parameters = [parameter for parameter in softmax.parameters() if parameter.requires_grad]
    grads = torch.autograd.grad(reduce(losses), [hidden_states, *parameters], allow_unused=True, retain_graph=True)
    return losses, grads, losses


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "weighted", "masked_mean"])
def test_chunked_training_loss_equals_plain_autograd(variant, reduction):
    """The CPU training loss (gradients computed chunk by chunk in the forward) gives autograd's losses and
    gradients, for the mean/sum a trainer takes and for any other use of the per-token losses."""
    model = tiny_lm(**VARIANTS[variant]).train()
    model.adaptive_softmax.loss_chunk_elements = 5 * model.adaptive_softmax.shortlist_size  # 5 rows per chunk
    torch.manual_seed(1)
    hidden_states = torch.randn(23, model.config.d_model, requires_grad=True)
    targets = covering_ids(model.config.vocab_size, 1, 23)[0]
    targets[4] = -100
    weights = torch.rand(23)
    reduce = {
        "mean": lambda losses: losses.sum() / (targets != -100).sum(),
        "sum": lambda losses: losses.sum(),
        "weighted": lambda losses: (losses * weights).sum(),
        "masked_mean": lambda losses: losses[:10].mean(),
    }[reduction]
    expected_losses, expected_grads, _ = _softmax_losses_and_grads(model, hidden_states, targets, reduce, False)
    losses, grads, graph = _softmax_losses_and_grads(model, hidden_states, targets, reduce, True)
    assert graph.grad_fn.name() == "_ChunkedAdaptiveNLLBackward"
    torch.testing.assert_close(losses, expected_losses, rtol=0, atol=1e-5)
    assert losses[4] == 0
    for grad, expected in zip(grads, expected_grads, strict=True):
        expected = torch.zeros_like(grad) if expected is None else expected
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5)
    # retain_graph: a second backward gives the same gradients (the kept ones are not scaled in place)
    again = torch.autograd.grad(reduce(graph), [hidden_states], retain_graph=True)[0]
    torch.testing.assert_close(again, grads[0], rtol=0, atol=0)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chunked_training_loss_gives_the_whole_model_autograds_gradients(variant, monkeypatch):
    """Through the whole model (tied embeddings and projections included), with a memory: every parameter's
    gradient equals the one plain autograd gives."""
    ids = covering_ids(97, 2, 12)
    results = []
    for chunked in (True, False):
        model = tiny_lm(**VARIANTS[variant]).train()
        model.adaptive_softmax.loss_chunk_elements = 7 * model.adaptive_softmax.shortlist_size
        if not chunked:
            monkeypatch.setattr(model.adaptive_softmax, "nll", model.adaptive_softmax._nll)
        memory = model(ids[:, :6], labels=ids[:, :6]).past_key_values
        output = model(ids[:, 6:], labels=ids[:, 6:], past_key_values=memory)
        output.loss.backward()
        results.append((output.loss, {name: parameter.grad for name, parameter in model.named_parameters()}))
    (loss, grads), (expected_loss, expected_grads) = results
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=1e-5, msg=name)


def test_chunked_training_loss_with_frozen_parameters_and_where_it_applies():
    model = tiny_lm().train()
    softmax = model.adaptive_softmax
    softmax.output_layers[0].weight.requires_grad_(False)  # frozen: no gradient asked for it
    hidden_states = torch.randn(9, model.config.d_model, requires_grad=True)
    targets = covering_ids(model.config.vocab_size, 1, 9)[0]
    losses = softmax.nll(hidden_states, targets)
    assert losses.grad_fn.name() == "_ChunkedAdaptiveNLLBackward"
    losses.mean().backward()
    assert softmax.output_layers[0].weight.grad is None and softmax.output_layers[1].weight.grad is not None
    expected = torch.autograd.grad(softmax._nll(hidden_states, targets).mean(), hidden_states)[0]
    torch.testing.assert_close(hidden_states.grad, expected, rtol=0, atol=1e-6)
    # Elsewhere the plain path: no gradient wanted, or hidden states that need none.
    with torch.no_grad():
        assert softmax.nll(hidden_states, targets).grad_fn is None
    assert softmax.nll(hidden_states.detach(), targets).grad_fn.name() != "_ChunkedAdaptiveNLLBackward"


def test_training_memory_holds_exactly_its_positions_and_no_view_of_the_inputs():
    """Between training steps each layer keeps a buffer of exactly mem_len positions (no room to append: with
    gradients on it is never appended to), equal to the last mem_len inputs of the layer, and not sharing their
    storage."""
    model = tiny_lm(mem_len=5).train()
    ids = covering_ids(model.config.vocab_size, 2, 12)
    memory = None
    for start in (0, 3, 6):  # segments of 3 and then 6 tokens
        segment = ids[:, start : start + (3 if start < 6 else 6)]
        output = model(segment, labels=segment, past_key_values=memory, output_hidden_states=True)
        output.loss.backward()
        memory = output.past_key_values
        for layer, layer_input in zip(memory.layers, output.hidden_states):
            kept = layer.hidden
            expected_len = min(5, start + segment.shape[1])
            assert kept.shape == (2, expected_len, model.config.d_model)
            assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()
            if segment.shape[1] >= expected_len:
                torch.testing.assert_close(kept, layer_input[:, -expected_len:].detach(), rtol=0, atol=0)
            assert kept.untyped_storage().data_ptr() != layer_input.untyped_storage().data_ptr()


def test_training_memory_keeps_a_segment_long_layer_input_without_a_copy():
    """A memory as long as the segment is the layers' inputs themselves (no copy) and gives the next segment the
    loss a copied memory gives; handed to a caller, it is copied first, so writing into it changes the memory and not
    what backward needs; a write into a kept layer input is an error when the memory is read, not a changed memory;
    the caller's inputs_embeds and a memory shorter than the segment are copied."""
    model = tiny_lm(mem_len=4).train()
    ids = covering_ids(model.config.vocab_size, 2, 8)
    seen = []
    layers = model.transformer.layers
    hooks = [layer.register_forward_pre_hook(lambda _, args: seen.append(args[0])) for layer in layers]
    shared = model(ids[:, :4], labels=ids[:, :4]).past_key_values
    for layer, layer_input in zip(shared.layers, seen):
        assert layer._hidden.value.data_ptr() == layer_input.data_ptr()
    copied = model(ids[:, :4], labels=ids[:, :4], output_hidden_states=True).past_key_values
    assert all(layer._hidden.shared_version is None for layer in copied.layers)
    seen.clear()
    output = model(ids[:, 4:], labels=ids[:, 4:], past_key_values=shared)
    torch.testing.assert_close(output.loss, model(ids[:, 4:], labels=ids[:, 4:], past_key_values=copied).loss)
    shared.get_memory(0).fill_(0.0)  # a caller resetting a memory before backward
    output.loss.backward()  # the layer input autograd kept is untouched
    assert shared.get_memory(0).abs().sum() == 0 and seen[0].abs().sum() > 0
    seen[1].add_(1.0)  # the second segment's layer-1 input, which the memory keeps
    with pytest.raises(RuntimeError, match="modified in place"):
        _ = shared.layers[1].hidden
    for hook in hooks:
        hook.remove()

    embeds = model.transformer.word_embeddings(ids[:, :4]).detach().requires_grad_()  # dropout is off: layer 0 sees it
    memory = model(inputs_embeds=embeds, labels=ids[:, :4]).past_key_values
    assert memory.layers[0]._hidden.value.data_ptr() != embeds.data_ptr()
    assert memory.layers[1]._hidden.shared_version is not None
    memory = tiny_lm(mem_len=3).train()(ids[:, :4], labels=ids[:, :4]).past_key_values
    assert all(layer._hidden.shared_version is None for layer in memory.layers)


@pytest.mark.parametrize("variant", ["adaptive_post_ln", "pre_ln_shared_r"])
def test_sliced_query_projection_equals_the_module_call(variant):
    """With memory, a plain qkv Linear is applied by weight slices; a hooked one is called whole: same results."""
    ids = covering_ids(97, batch=2, length=6)
    results = []
    for hooked in (False, True):
        model = tiny_lm(**VARIANTS[variant])
        calls = []

        def count_call(module, args, output, calls=calls):
            calls.append(1)

        if hooked:
            for layer in model.transformer.layers:
                layer.attention.qkv_proj.register_forward_hook(count_call)
        memory = model(ids[:, :4]).past_key_values
        output = model(ids, past_key_values=memory, labels=ids, return_logits=True)
        output.loss.backward()
        assert len(calls) == (4 if hooked else 0)  # the hook runs: the module was called (2 calls x 2 layers)
        results.append((output.logits, {name: p.grad for name, p in model.named_parameters()}))
    (plain_logits, plain_grads), (hooked_logits, hooked_grads) = results
    torch.testing.assert_close(plain_logits, hooked_logits, rtol=0, atol=1e-5)
    for name in plain_grads:
        torch.testing.assert_close(plain_grads[name], hooked_grads[name], rtol=0, atol=1e-5)


def _train_three_segments(model, ids, compiled=None):
    """Losses and final gradients of three memory-carrying training segments."""
    run = model if compiled is None else compiled
    memory, losses = None, []
    for segment in ids.split(ids.shape[1] // 3, dim=1):
        output = run(segment, labels=segment, past_key_values=memory, use_cache=True)
        memory = output.past_key_values
        losses.append(output.loss)
    sum(losses).backward()
    return torch.stack(losses).detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("weight_trained", [True, False])
def test_memory_linear_equals_the_linear_of_the_concatenation_without_the_memorys_gradient(weight_trained):
    """The keys and values of [memory; segment] with the memory a stop-gradient: values and the segment's and the
    weight's gradients as `F.linear(cat(...))` gives them (a frozen weight gets none), the memory none."""
    generator = torch.Generator().manual_seed(4)
    memory = torch.randn(3, 5, 8, generator=generator)
    segment = torch.randn(3, 4, 8, generator=generator, requires_grad=True)
    weight = torch.randn(12, 8, generator=generator, requires_grad=weight_trained)
    grad_output = torch.randn(3, 9, 12, generator=generator)
    assert memory_linear_applies(memory, segment)
    output = memory_linear(memory, segment, weight)
    expected = F.linear(torch.cat([memory, segment], dim=1), weight)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-6)
    inputs = (segment, weight) if weight_trained else (segment,)
    grads = torch.autograd.grad(output, inputs, grad_output)
    expected_grads = torch.autograd.grad(expected, inputs, grad_output)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


def test_memory_linear_applies_only_where_the_memory_is_a_stop_gradient_in_eager_float_training():
    memory, segment = torch.randn(2, 3, 8), torch.randn(2, 4, 8, requires_grad=True)
    assert memory_linear_applies(memory, segment)
    assert not memory_linear_applies(None, segment)
    assert not memory_linear_applies(memory.requires_grad_(), segment)  # a memory that is not a stop-gradient
    with torch.no_grad():
        assert not memory_linear_applies(torch.randn(2, 3, 8), segment)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not memory_linear_applies(torch.randn(2, 3, 8), segment)


def test_memory_linear_keeps_no_context_for_a_frozen_weight():
    """As F.linear: with the weight frozen (partial fine-tuning), backward needs only the weight, so no copy of
    [memory; segment] is kept until backward."""
    memory, segment = torch.randn(2, 5, 8), torch.randn(2, 4, 8, requires_grad=True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda tensor: kept.append(tuple(tensor.shape)) or tensor, lambda t: t
    ):
        memory_linear(memory, segment, torch.randn(12, 8))
        memory_linear(memory, segment.detach(), torch.randn(12, 8, requires_grad=True))
    assert kept == [(12, 8), (2, 9, 8)]  # the frozen weight's call keeps the weight; the trained one the context


def _penalty_gradients(model, ids, memory=None) -> dict[str, torch.Tensor]:
    """Every parameter's gradient of a gradient penalty, the squared norm of the loss's gradient (create_graph)."""
    model.zero_grad()
    loss = model(ids, labels=ids, past_key_values=memory).loss
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True, allow_unused=True)
    sum((grad**2).sum() for grad in grads if grad is not None).backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.grad is not None}


def test_second_derivatives_through_the_loss_kernel_equal_the_readable_paths(monkeypatch):
    """The adaptive softmax's loss kernel (`adaptive_nll`: gradients computed in its forward) gives the readable
    path's second derivatives: a gradient penalty's gradients are equal, embeddings and projections tied to the
    output layers included (their hidden states depend on the same weights: each input's own gradient, not the
    total). Its first-derivative-only backward let the second derivative through as zero, silently."""
    from transfoxl import modeling_txl

    ids = covering_ids(97, batch=2, length=12)
    model = tiny_lm(attn_implementation="eager").train()
    assert model.config.tie_word_embeddings and len(model.adaptive_softmax.output_layers) > 1
    kernel = _penalty_gradients(model, ids)
    monkeypatch.setattr(modeling_txl, "float32_cpu_training", lambda *tensors: False)  # (the readable `_nll`)
    readable = _penalty_gradients(model, ids)
    assert kernel.keys() == readable.keys() and "adaptive_softmax.cluster_weight" in kernel
    for name in readable:
        torch.testing.assert_close(kernel[name], readable[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("with_relu", [False, True])
def test_the_dropout_kernels_are_differentiable_twice(with_relu):
    """The dropout kernels' gradients are differentiable (linear in the incoming gradient, the mask a constant): the
    second derivative of `sum(y**3)`, y = dropout(x) (or dropout(relu(x))), is `6 y (kept / (1 - p))**2`, computed
    from the kept positions `y != 0`."""
    p = 0.25
    x = torch.randn(4, 64, requires_grad=True)
    y = (kernels_txl.relu_dropout if with_relu else kernel_dropout)(x, p, True)
    assert y.grad_fn is not None and "Dropout" in type(y.grad_fn).__name__  # (the kernel, not torch's)
    (first,) = torch.autograd.grad((y**3).sum(), x, create_graph=True)
    first.sum().backward()
    factor = (y != 0).float() / (1 - p)
    torch.testing.assert_close(first, 3 * y**2 * factor)
    torch.testing.assert_close(x.grad, 6 * y.detach() * factor**2)


def test_a_second_derivative_through_a_first_derivative_only_kernel_raises_naming_the_eager_attention():
    """The sdpa path's CPU training kernels (attention, memory_linear) compute first derivatives only: with
    create_graph=True they give the same first derivatives, and differentiating those raises an error that names the
    eager attention, never a second derivative of zero."""
    ids = covering_ids(97, batch=2, length=12)
    model = tiny_lm(mem_len=6, attn_implementation="sdpa").train()
    memory = model(ids[:, :6], use_cache=True).past_key_values
    loss = model(ids[:, 6:], labels=ids[:, 6:], past_key_values=memory).loss
    plain = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True, allow_unused=True)
    graph = torch.autograd.grad(loss, list(model.parameters()), create_graph=True, allow_unused=True)
    for first, second in zip(plain, graph):
        assert (first is None) == (second is None)
        if first is not None:
            torch.testing.assert_close(first, second.detach())
    penalty = sum((grad**2).sum() for grad in graph if grad is not None)
    with pytest.raises(RuntimeError, match=r"first derivatives only.*set_attn_implementation\('eager'\)"):
        penalty.backward()


def test_eager_attention_keeps_a_second_derivative_through_the_memory():
    """The eager path (the readable reference) stays differentiable twice with a memory and dropout: a gradient
    penalty works; `memory_linear`, whose backward is once-differentiable, is the fast paths' alone."""
    ids = covering_ids(97, batch=2, length=12)
    model = tiny_lm(mem_len=6, dropout=0.1, attn_implementation="eager").train()
    memory = model(ids[:, :6], use_cache=True).past_key_values
    loss = model(ids[:, 6:], labels=ids[:, 6:], past_key_values=memory).loss
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True, allow_unused=True)
    penalty = sum((grad**2).sum() for grad in grads if grad is not None)
    penalty.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_training_with_a_memory_projects_it_without_its_input_gradient_and_the_same_gradients(monkeypatch, pre_lnorm):
    """Post-LN training with a memory takes `memory_linear` in every layer once the memory holds something (pre-LN:
    the layer norm's weights learn from the memory rows, so the concatenation stays); losses and every parameter's
    gradient equal those of the plain projection."""
    from transfoxl import modeling_txl

    ids = covering_ids(97, batch=2, length=18)
    calls = []
    real = modeling_txl.memory_linear
    results = []
    for applies in (modeling_txl.memory_linear_applies, lambda *args: False):
        monkeypatch.setattr(modeling_txl, "memory_linear_applies", applies)
        monkeypatch.setattr(modeling_txl, "memory_linear", lambda *args: calls.append(1) or real(*args))
        model = tiny_lm(mem_len=8, pre_lnorm=pre_lnorm, attn_implementation="sdpa").train()
        results.append(_train_three_segments(model, ids))
    layers = tiny_lm().config.n_layer
    assert len(calls) == (0 if pre_lnorm else 2 * layers)  # segments 2 and 3, with the plain projection: none
    (losses, grads), (plain_losses, plain_grads) = results
    torch.testing.assert_close(losses, plain_losses, rtol=0, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=0, atol=1e-6)


def test_model_traces_as_one_graph_with_equal_losses_and_gradients(one_thread):
    """`torch.compile(fullgraph=True)` (no graph break anywhere, memory filling up) gives the eager results.

    The aot_eager backend traces exactly what inductor compiles, in seconds; the inductor run is the slow test below.
    """
    ids = covering_ids(97, batch=2, length=18)
    eager_losses, eager_grads = _train_three_segments(tiny_lm(mem_len=8).train(), ids)
    model = tiny_lm(mem_len=8).train()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    losses, grads = _train_three_segments(model, ids, compiled)
    torch.testing.assert_close(losses, eager_losses, rtol=0, atol=1e-5)
    for name in eager_grads:
        torch.testing.assert_close(grads[name], eager_grads[name], rtol=0, atol=1e-5)


def test_model_with_dropout_traces_as_one_graph(one_thread):
    """Dropout (16-bit draws in eager CPU training) is torch's own under torch.compile, which has no `random_`:
    training with dropout traces without a graph break, and its losses are finite."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep_graph(graph, example_inputs):
        graphs.append(graph)
        return make_boxed_func(graph)

    ids = covering_ids(97, batch=2, length=18)
    model = tiny_lm(mem_len=8, dropout=0.2, dropatt=0.1).train()
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep_graph, bw_compiler=keep_graph)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    losses, grads = _train_three_segments(model, ids, compiled)
    assert torch.isfinite(losses).all()
    assert all(torch.isfinite(grad).all() for grad in grads.values())
    # Inductor before torch 2.13 cannot lower a bool tensor viewed as another dtype (`--compile` training raised a
    # LoweringException on torch 2.11): the traced graphs hold no such view.
    bool_views = [
        node
        for graph in graphs
        for node in graph.graph.nodes
        if node.target is torch.ops.aten.view.dtype and node.args[0].meta["val"].dtype == torch.bool
    ]
    assert graphs and not bool_views


@pytest.mark.parametrize("function", [kernel_dropout, relu_dropout])
def test_compiled_dropout_backpropagates_through_the_units_its_forward_kept(function, one_thread):
    """Under torch.compile the gradient flows through exactly the units the forward kept, scaled by 1 / (1 - p).
    (torch 2.11's compile gave a zero gradient through the eager path's Functions, whose forward writes its output in
    place: `--compile` training learned nothing.)"""
    inputs = (torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0)).abs() + 0.1).requires_grad_()
    weights = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: function(x, 0.25, True), backend="aot_eager", fullgraph=True)
    output = compiled(inputs)
    (output * weights).sum().backward()
    kept = output != 0
    assert 0.6 < kept.float().mean().item() < 0.9
    torch.testing.assert_close(inputs.grad, weights * kept / 0.75)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_a_training_model_with_dropout_traces_with_torchs_dropout():
    """torch.jit.trace of a model in training mode with dropout: the graph holds torch's dropout, not the Functions
    (a Python op in a graph does not save; and the torch path's view of int64 words as int16 has no TorchScript
    operator: tracing raised an internal assert)."""
    model = tiny_lm(mem_len=8, dropout=0.2).train()
    ids = covering_ids(97, batch=2, length=8)

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(ids, labels=ids, use_cache=False).loss

    traced = torch.jit.trace(Loss(), ids, check_trace=False)
    nodes = list(traced.inlined_graph.nodes())
    python_ops = [node.pyname() for node in nodes if node.kind() == "prim::PythonOp"]
    assert "aten::dropout" in [node.kind() for node in nodes]
    assert not [name for name in python_ops if "Dropout" in name]
    assert torch.isfinite(traced(ids))


def test_generate_through_a_forward_compiled_as_one_graph_gives_the_eager_tokens(one_thread):
    """Decoding traces too: generate() through `torch.compile(model.forward, fullgraph=True)` (the prompt, then one
    token at a time, the memory moved to a new buffer at each) picks the eager model's tokens."""
    ids = covering_ids(97, batch=2, length=9)
    model = tiny_lm(mem_len=16).eval()
    expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(model.generate(ids, max_new_tokens=6, do_sample=False), expected, rtol=0, atol=0)


def test_compiled_decoding_continues_a_memory_made_under_inference_mode(one_thread):
    """A prompt read under `torch.inference_mode()` leaves inference tensors in the memory, which torch forbids writing
    into outside that mode; eager decoding then moves to a new buffer, and so does a traced forward (it cannot ask a
    tensor whether it is one): decoding on under no_grad through the compiled forward gives the eager logits."""
    ids = covering_ids(97, batch=2, length=9)
    model = tiny_lm(mem_len=16).eval()

    def prompt_then_two_tokens(forward):
        with torch.inference_mode():
            output = model(ids, use_cache=True)
        logits = []
        with torch.no_grad():
            for _ in range(2):
                output = forward(output.logits[:, -1:].argmax(-1), past_key_values=output.past_key_values)
                logits.append(output.logits)
        return torch.cat(logits, dim=1)

    expected = prompt_then_two_tokens(model)
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(prompt_then_two_tokens(compiled), expected, rtol=0, atol=1e-5)


def test_compiled_model_still_refuses_bad_token_ids(one_thread):
    model = tiny_lm()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    ids = covering_ids(97, batch=1, length=4)
    ids[0, 2] = 97
    with pytest.raises(RuntimeError, match=r"outside the vocabulary \[0, 97\)"):
        compiled(ids)


@pytest.mark.slow
def test_inductor_compiled_training_equals_eager(one_thread):
    ids = covering_ids(97, batch=2, length=18)
    eager_losses, eager_grads = _train_three_segments(tiny_lm(mem_len=8).train(), ids)
    model = tiny_lm(mem_len=8).train()
    torch._dynamo.reset()
    losses, grads = _train_three_segments(model, ids, torch.compile(model))
    torch.testing.assert_close(losses, eager_losses, rtol=0, atol=1e-4)
    for name in eager_grads:
        torch.testing.assert_close(grads[name], eager_grads[name], rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_autocast_runs_through_the_whole_model(dtype, implementation, one_thread):
    """Mixed precision through the adaptive embedding, both attentions and the adaptive softmax (v4 crashed in its
    embedding, transformers issue 19914). On CPU here; the same autocast code path runs on CUDA."""
    ids = covering_ids(97, batch=2, length=8)
    model = tiny_lm(mem_len=4, attn_implementation=implementation).train()
    reference = model(ids, labels=ids).loss.item()
    memory = None
    with torch.autocast("cpu", dtype=dtype):
        for _ in range(2):  # the second segment attends to a memory written under autocast
            output = model(ids, labels=ids, past_key_values=memory, use_cache=True)
            memory = output.past_key_values
        logits = model(ids[:, :3], past_key_values=memory).logits
    output.loss.backward()
    assert torch.isfinite(logits).all() and logits.dtype == torch.float32
    assert abs(output.loss.item() - reference) < 0.2  # low precision, and one more segment of context
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_inference_takes_the_block_and_one_query_paths(dtype, monkeypatch, one_thread):
    """Inference under autocast: a long prompt by query blocks, then decoded tokens by the one-query attention (the
    one-row product stands aside: it needs float weights and inputs of one dtype); float32 log-probabilities close to
    the float32 model's."""
    from transfoxl import modeling_txl

    monkeypatch.setattr(modeling_txl.TxlRelativeAttention, "query_block", 8)
    model = tiny_lm(mem_len=32, attn_implementation="sdpa")
    ids = covering_ids(97, batch=1, length=23)
    results = []
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=autocast):
            output = model(ids[:, :20], use_cache=True)
            logits = [output.logits]
            for position in range(20, 23):
                output = model(ids[:, position : position + 1], past_key_values=output.past_key_values)
                logits.append(output.logits)
        results.append(torch.cat(logits, dim=1))
    expected, mixed = results
    assert mixed.dtype == torch.float32 and torch.isfinite(mixed).all()
    assert (mixed - expected).abs().max() < 0.25  # low precision


@pytest.mark.parametrize(("out_features", "bias"), [(12, True), (12, False), (7, True)])
def test_one_row_linear_equals_f_linear(out_features, bias):
    """Decoding's product (the weight's halves by the row as a column, batched) is F.linear, for rows at an offset
    or with a stride too; odd or transposed weights fall back to it."""
    torch.manual_seed(out_features)
    weight = torch.randn(out_features, 9)
    bias_tensor = torch.randn(out_features) if bias else None
    rows = torch.randn(3, 9)  # a row at an offset in its storage, and one with a stride: views the model may pass
    for inputs in (torch.randn(1, 1, 9), torch.randn(1, 9), torch.randn(9), rows[1:2], torch.randn(9, 3)[:, 1]):
        expected = F.linear(inputs, weight, bias_tensor)
        output = one_row_linear(inputs, weight, bias_tensor)
        assert output.shape == expected.shape
        torch.testing.assert_close(output, expected, rtol=0, atol=1e-6)
    transposed = torch.randn(9, out_features).t()
    torch.testing.assert_close(one_row_linear(inputs, transposed), F.linear(inputs, transposed), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("out_features", "in_features"), [(13, 100), (4096, 1024), (1, 33), (1000, 64), (67, 16), (40, 100), (35, 129)]
)
def test_the_compiled_one_row_product_equals_f_linear(out_features, in_features):
    """The compiled matrix-vector kernel (each thread's rows in four streams read side by side, then the rest in one;
    the inputs in vectors, then a tail; rows of at most 128 inputs sixteen at a time, a partial last vector masked):
    F.linear within float32 rounding, with a bias and without. Rows of more than 128 inputs are each summed the same
    way wherever they fall (stream, remainder, thread): any slice of the rows gives the same bits."""
    operators = compiled_operators()
    if operators is None:
        pytest.skip("the compiled kernel is for Linux on x86-64 with AVX2")
    generator = torch.Generator().manual_seed(in_features)
    weight, bias = torch.randn(out_features, in_features, generator=generator), torch.randn(out_features)
    inputs = torch.randn(1, 1, in_features, generator=generator)
    for bias_tensor in (bias, None):
        expected = F.linear(inputs, weight, bias_tensor)
        output = one_row_linear(inputs, weight, bias_tensor)
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=2e-4)
        assert torch.equal(operators.row_linear(inputs.view(-1), weight, bias_tensor), output.view(-1))  # it ran
        if in_features > 128:
            for begin, end in ((1, out_features), (0, out_features - 1), (out_features // 3, out_features // 2 + 1)):
                part = operators.row_linear(
                    inputs.view(-1), weight[begin:end], bias_tensor[begin:end] if bias_tensor is not None else None
                )
                assert torch.equal(part, output.view(-1)[begin:end]), (begin, end)


@pytest.mark.parametrize("offset", [1, 4, 8, 15])
@pytest.mark.parametrize(("out_features", "in_features"), [(100, 1024), (7, 32), (1000, 513)])
def test_the_one_row_product_of_a_weight_off_its_cache_lines(offset, out_features, in_features):
    """A weight that does not start on a cache line (a checkpoint's tensors sit where the file put them, 16 or 32
    bytes off), here a view `offset` floats into a buffer: rows of a multiple of 16 floats are read with a masked first
    and last vector and whole lines between. F.linear within float32 rounding, and any slice of the rows gives the
    same bits as the whole."""
    operators = compiled_operators()
    if operators is None:
        pytest.skip("the compiled kernel is for Linux on x86-64 with AVX2")
    generator = torch.Generator().manual_seed(offset)
    buffer = torch.randn(out_features * in_features + 16, generator=generator)
    weight = buffer[offset : offset + out_features * in_features].view(out_features, in_features)
    row, bias = torch.randn(in_features, generator=generator), torch.randn(out_features, generator=generator)
    assert weight.data_ptr() % 64 != 0 or offset % 16 == 0
    output = operators.row_linear(row, weight, bias)
    expected = (weight.double() @ row.double() + bias.double()).float()
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=2e-4)
    for begin, end in ((1, out_features), (0, out_features - 1), (out_features // 3, out_features // 2 + 1)):
        assert torch.equal(operators.row_linear(row, weight[begin:end], bias[begin:end]), output[begin:end])


def test_decoding_at_batch_one_takes_the_one_row_product_and_matches_eager_logits(monkeypatch):
    """Where the fused layer step does not apply (here: turned off; in use, an adapter or hook on a sub-layer, MC
    dropout), each linear product of a decoded token at batch 1 (projections, feed-forward) goes through
    `one_row_linear`, and the logits equal those of the plain F.linear path."""

    _general_decoding(monkeypatch)
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return one_row_linear(*args, **kwargs)

    model = tiny_lm(mem_len=16)
    ids = covering_ids(97, batch=1, length=9)
    with torch.no_grad():
        memory = model(ids[:, :8], use_cache=True).past_key_values
        monkeypatch.setattr(fast_paths_txl, "one_row_linear", counting)
        fast = model(ids[:, 8:], past_key_values=memory, use_cache=True).logits
        memory = model(ids[:, :8], use_cache=True).past_key_values  # a new stream, same prefix
    layers = model.config.n_layer
    assert len(calls) >= 4 * layers  # qkv, o, up, down per layer (the softmax's clusters: its own one call)
    with torch.no_grad():
        monkeypatch.setattr(fast_paths_txl, "_one_row_inference", lambda inputs, weight: False)
        expected = model(ids[:, 8:], past_key_values=memory, use_cache=True).logits
    torch.testing.assert_close(fast, expected, rtol=0, atol=1e-5)


ONE_ROW_SOFTMAX_VARIANTS = {
    **VARIANTS,
    "div1_unprojected": {"cutoffs": [40], "div_val": 1, "d_embed": 32},  # (tiny's d_model: no projection)
    "no_cutoffs_unprojected": {"cutoffs": [], "div_val": 1, "d_embed": 32},
}


@pytest.mark.parametrize("variant", sorted(ONE_ROW_SOFTMAX_VARIANTS))
def test_the_adaptive_softmax_of_one_row_is_one_compiled_call_equal_to_the_readable_path(monkeypatch, variant):
    """A decoded token's log-probabilities (one row in float32 CPU inference) come from one call of the compiled
    `adaptive_log_softmax_row` (clusters with projections, a div_val 1 layer sliced into clusters, one cluster with
    and without a projection) and equal the readable path's within float32 rounding; a NaN row gives NaN everywhere,
    as it does there. Several rows, a gradient, autocast, float64, vmap and a tensor of another rank keep the
    readable path."""
    from transfoxl import fast_paths_txl, modeling_txl

    operators = compiled_operators()
    if operators is None:
        pytest.skip("the one-row softmax is for the compiled kernels (Linux on x86-64 with AVX2)")
    calls = []

    class Counting:
        def __getattr__(self, name):
            calls.extend([name] if name == "adaptive_log_softmax_row" else [])
            return getattr(operators, name)

    monkeypatch.setattr(fast_paths_txl, "compiled_operators", lambda: Counting())
    model = tiny_lm(**ONE_ROW_SOFTMAX_VARIANTS[variant])
    softmax, width = model.adaptive_softmax, model.config.d_model
    assert (len(softmax.output_projections) == 0) == variant.endswith("_unprojected")

    def readable(hidden):
        with monkeypatch.context() as patch:
            patch.setattr(modeling_txl, "one_row_log_probs", lambda *args: None)
            return softmax(hidden)

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        # (30: log-probabilities far below 0, where a lost digit would show; 1e3: logits whose exp overflows
        # without the maximum subtracted)
        for scale in (1.0, 30.0, 1e3):
            hidden = scale * torch.randn(1, width, generator=generator)
            log_probs = softmax(hidden)
            assert calls == ["adaptive_log_softmax_row"] and log_probs.shape == (1, softmax.bounds[-1])
            torch.testing.assert_close(log_probs, readable(hidden), rtol=1e-6, atol=1e-5 * scale)
            calls.clear()
        nan_row = torch.full((1, width), float("nan"))
        assert torch.isnan(softmax(nan_row)).all() and torch.isnan(readable(nan_row)).all() and calls
        calls.clear()
        rows = torch.randn(3, width, generator=generator)
        torch.testing.assert_close(softmax(rows)[1:2], readable(rows[1:2]), rtol=1e-6, atol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            softmax(rows[:1])
        softmax.double()(rows[:1].double())
        softmax.float()
        torch.testing.assert_close(torch.func.vmap(softmax)(rows[:, None]), readable(rows)[:, None])
        if softmax.n_clusters == 1:  # (the readable path takes any rank where there is one cluster)
            assert softmax(rows[0]).shape == (softmax.bounds[-1],)
    softmax(rows[:1])  # a gradient may be asked for
    assert calls == []


def test_the_one_row_softmax_operator_says_which_input_is_wrong():
    """The compiled `adaptive_log_softmax_row` checks what it is given (the module passes it its parameters): the
    count of tensors, each tensor's shape, a cluster without a projection narrower than the hidden state."""
    operators = compiled_operators()
    if operators is None:
        pytest.skip("the one-row softmax is for the compiled kernels (Linux on x86-64 with AVX2)")
    hidden, weight, bias, projection = torch.randn(8), torch.randn(5, 4), torch.randn(5), torch.randn(8, 4)
    with pytest.raises(RuntimeError, match="3 tensors per cluster"):
        operators.adaptive_log_softmax_row(hidden, [weight, bias])
    with pytest.raises(RuntimeError, match=r"tensor 2 must be a contiguous float32 CPU tensor of shape \[8, 4\]"):
        operators.adaptive_log_softmax_row(hidden, [weight, bias, projection.t().contiguous()])
    with pytest.raises(RuntimeError, match="cluster 0 has no projection, so its width must be the hidden state's"):
        operators.adaptive_log_softmax_row(hidden, [weight, bias, None])
    expected = torch.log_softmax(weight @ (hidden @ projection) + bias, dim=-1)
    torch.testing.assert_close(operators.adaptive_log_softmax_row(hidden, [weight, bias, projection]), expected)


def test_forward_mode_ad_through_a_decoded_token_keeps_its_tangent():
    """A dual input (`torch.autograd.forward_ad`) decoded at batch 1 without gradients keeps its tangent: the compiled
    operators (no forward derivatives: the fused steps, the one-row products and softmax, the attention kernels) step
    aside for torch's, and the logits' tangent is the float64 model's."""
    import torch.autograd.forward_ad as fwAD

    model = tiny_lm(mem_len=16)
    ids = covering_ids(model.config.vocab_size, batch=1, length=9)
    tangents = []
    for dtype in (torch.float32, torch.float64):
        model.to(dtype)
        with torch.no_grad():
            memory = model(ids[:, :8], use_cache=True).past_key_values
            embedded = model.transformer.word_embeddings(ids[:, 8:])
            direction = torch.linspace(-1, 1, embedded.numel(), dtype=dtype).view_as(embedded)
            with fwAD.dual_level():
                dual = fwAD.make_dual(embedded, direction)
                logits = model(inputs_embeds=dual, past_key_values=memory, use_cache=True).logits
                tangents.append(fwAD.unpack_dual(logits).tangent)
    assert tangents[0] is not None and tangents[0].abs().max() > 0
    torch.testing.assert_close(tangents[0].double(), tangents[1], rtol=1e-4, atol=1e-4)


def _general_decoding(patch):
    """Turns both fused decoding steps off: the model's one call for all layers and each layer's own."""
    from transfoxl import modeling_txl

    patch.setattr(modeling_txl, "decode_token", lambda *args: None)
    patch.setattr(modeling_txl, "decode_one_row", lambda *args: None)


def _counting_fused_steps(patch, taken: dict[str, list[bool]], *, model_step: bool = True):
    """Records whether each call of the fused steps (`decode_token`: "model", `decode_one_row`: "layer") was
    taken; `model_step=False` turns the model's off, so that each layer's is what runs."""
    from transfoxl import modeling_txl

    for owner, name, key in (
        (modeling_txl, "decode_token", "model"),
        (modeling_txl, "decode_one_row", "layer"),
    ):
        original = getattr(owner, name)

        def counting(*args, original=original, key=key):
            result = original(*args)
            taken[key].append(result is not None)
            return result

        patch.setattr(owner, name, counting if model_step or key == "layer" else lambda *args: None)


@pytest.mark.parametrize("step", ["model", "layer"])
@pytest.mark.parametrize("variant", [*VARIANTS, "same_length", "mc_dropout", "float64"])
def test_the_fused_decoding_steps_equal_the_general_path(monkeypatch, variant, step):
    """A token decoded at batch 1 with kept keys and values takes the model's fused step (`decode_token`:
    every layer in one call of the compiled `decode_layers`), or where that is off each layer's
    (`decode_one_row`, the compiled `decode_layer`), in post-LN and pre-LN, with shared or own biases,
    clamped distances, a memory that outgrows mem_len, a masked memory with same_length: the same logits and memory
    (hidden states, keys, values) as the general path of `forward`, step after step, and the eager reference's
    logits. Where they do not apply (dropout modules switched back on in an eval model, as MC dropout does; a float64
    model) neither is taken, and the results are the general path's."""
    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    overrides = {
        "same_length": {"same_length": True, "mem_len": 6},
        "mc_dropout": {"dropout": 0.3},
        "float64": {},
        **VARIANTS,
    }[variant]
    model = tiny_lm(**overrides)
    model.config._attn_implementation = "sdpa"
    if variant == "mc_dropout":
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.train()
    if variant == "float64":
        model.double()
    ids = covering_ids(model.config.vocab_size, batch=1, length=14)
    taken = {"model": [], "layer": []}

    def decode(fused: bool) -> tuple[torch.Tensor, TxlMemory]:
        with monkeypatch.context() as patch:
            if fused:
                _counting_fused_steps(patch, taken, model_step=step == "model")
            else:
                _general_decoding(patch)
            torch.manual_seed(0)  # (the same dropout masks for both, MC dropout)
            with torch.no_grad():
                memory = model(ids[:, :5], use_cache=True).past_key_values
                logits = [
                    model(ids[:, i : i + 1], past_key_values=memory, use_cache=True).logits for i in range(5, 14)
                ]
        return torch.cat(logits, dim=1), memory

    fast, fast_memory = decode(fused=True)
    expected, expected_memory = decode(fused=False)
    fusable = variant not in ("mc_dropout", "float64")
    if step == "model":
        assert taken["model"] == [fusable] * 9 and taken["layer"] == (
            [] if fusable else [False] * 9 * model.config.n_layer
        )
    else:
        assert taken["model"] == [] and taken["layer"] == [fusable] * 9 * model.config.n_layer
    torch.testing.assert_close(fast, expected, rtol=0, atol=1e-5)
    for kept, general in zip(fast_memory.layers, expected_memory.layers):
        for window in ("_hidden", "_keys", "_values"):
            torch.testing.assert_close(getattr(kept, window).value, getattr(general, window).value, rtol=0, atol=1e-6)
    model.config._attn_implementation = "eager"  # the readable reference, term by term (never fused)
    eager, _ = decode(fused=True)
    torch.testing.assert_close(fast, eager, rtol=0, atol=1e-5)


def _scale_output(module, args, output):
    return (output[0] * 1.25, output[1])


def _scaled_forward(module):
    forward = module.forward
    module.forward = lambda hidden_states: forward(hidden_states) * 1.25  # (accelerate's hooks replace forward so)


def _new_parameter(module, name, change):
    setattr(module, name, torch.nn.Parameter(change(getattr(module, name).detach())))


def _weight_norm(module):
    torch.nn.utils.parametrizations.weight_norm(module)
    with torch.no_grad():
        module.parametrizations.weight.original0.mul_(1.5)


def _layers(model):
    return model.transformer.layers


# Changes made to a model between two decoded tokens of one stream, each of which changes the next tokens' logits.
_CHANGES_BETWEEN_TOKENS = {
    "forward hook on a layer": lambda model: _layers(model)[1].register_forward_hook(_scale_output),
    "forward replaced on an instance": lambda model: _scaled_forward(_layers(model)[0].ffn),
    "linear layer replaced": lambda model: setattr(
        _layers(model)[1].ffn, "up_proj", copy.deepcopy(_layers(model)[0].ffn.up_proj)
    ),
    "layer replaced": lambda model: _layers(model).__setitem__(1, copy.deepcopy(_layers(model)[0])),
    "layer deleted and appended": lambda model: (
        _layers(model).__delitem__(0),
        _layers(model).append(copy.deepcopy(_layers(model)[0])),
    ),
    "weight replaced": lambda model: _new_parameter(_layers(model)[0].attention.o_proj, "weight", lambda w: w * 1.5),
    "weight replaced in the registry": lambda model: _layers(model)[1].ffn.layer_norm._parameters.__setitem__(
        "weight", torch.nn.Parameter(torch.full_like(_layers(model)[1].ffn.layer_norm.weight, 2.0))
    ),
    "weight's data replaced": lambda model: setattr(
        _layers(model)[0].ffn.down_proj.weight, "data", _layers(model)[0].ffn.down_proj.weight.detach() * 1.5
    ),
    "query-key-value weight edited in place": lambda model: _layers(model)[0].attention.qkv_proj.weight.mul_(1.5),
    "position projection edited in place": lambda model: _layers(model)[1].attention.pos_proj.weight.add_(0.5),
    "position projection's data replaced": lambda model: setattr(
        _layers(model)[1].attention.pos_proj.weight, "data", _layers(model)[1].attention.pos_proj.weight.detach() + 0.5
    ),
    "shared bias replaced": lambda model: _new_parameter(model.transformer, "position_bias", lambda b: b + 1.0),
    "own bias replaced": lambda model: _new_parameter(_layers(model)[1].attention, "content_bias", lambda b: b + 1.0),
    "norm eps changed": lambda model: setattr(_layers(model)[0].attention.layer_norm, "eps", 10.0),
    "weight norm parametrization": lambda model: _weight_norm(_layers(model)[0].attention.o_proj),
    "dropout switched on (MC dropout)": lambda model: _layers(model)[1].ffn.dropout.train(),
    "sub-layer switched to training": lambda model: _layers(model)[0].ffn.train(),
    "eager attention": lambda model: setattr(model.config, "_attn_implementation", "eager"),
    # the adaptive softmax's tensors for one row, kept too
    "output projection replaced": lambda model: model.adaptive_softmax.output_projections.__setitem__(
        1, torch.nn.Parameter(model.adaptive_softmax.output_projections[1].detach() * 3.0)
    ),
    "output layer pruned": lambda model: torch.nn.utils.prune.l1_unstructured(
        model.adaptive_softmax.output_layers[1], "weight", amount=0.5
    ),
    "one output table's data replaced": lambda model: setattr(
        model.adaptive_softmax.output_layers[0].weight, "data", model.adaptive_softmax.output_layers[0].weight * 3.0
    ),
    "output layer's bias removed": lambda model: setattr(model.adaptive_softmax.output_layers[1], "bias", None),
    # (found by a review: MC dropout's modules already in training with p 0, then p set; one sub-layer's pre_lnorm)
    "dropout rate set on a module in training": lambda model: setattr(_layers(model)[1].ffn.dropout, "p", 0.3),
    "a feed-forward's pre_lnorm alone": lambda model: setattr(_layers(model)[0].ffn, "pre_lnorm", True),
    "a square weight's data transposed (its storage kept)": lambda model: setattr(
        _layers(model)[0].attention.o_proj.weight, "data", _layers(model)[0].attention.o_proj.weight.detach().t()
    ),
    # changes of layout only (the same values): the compiled operators take contiguous tensors only
    "a weight's data made non-contiguous": lambda model: setattr(
        _layers(model)[0].attention.o_proj.weight, "data", _non_contiguous(_layers(model)[0].attention.o_proj.weight)
    ),
    "an output projection's data made non-contiguous": lambda model: setattr(
        model.adaptive_softmax.output_projections[1],
        "data",
        _non_contiguous(model.adaptive_softmax.output_projections[1]),
    ),
}
# Made before the stream: the state a change above needs.
_BEFORE_THE_STREAM = {
    "dropout rate set on a module in training": lambda model: (
        setattr(_layers(model)[1].ffn.dropout, "p", 0.0) or _layers(model)[1].ffn.dropout.train()
    ),
}
# Changes that keep the values: seen by where the fused step runs afterwards (the model's, for the layers).
_SAME_VALUES = {"eager attention": False, "a weight's data made non-contiguous": False}
_SAME_VALUES["an output projection's data made non-contiguous"] = True


def _non_contiguous(tensor):
    return tensor.detach().t().contiguous().t()  # (the same values and shape, the transposed layout)


@pytest.mark.parametrize("change", list(_CHANGES_BETWEEN_TOKENS))
def test_the_decoding_plan_sees_every_change_made_between_tokens(monkeypatch, change):
    """The model's fused step keeps its checks of every layer as a plan for the next tokens (`_DecodePlan`), the
    adaptive softmax its tensors for one row (`_RowTensors`). A change to the model between two tokens of one stream
    (a hook, an adapter-like replacement of a layer or weight, an edit in place, a new eps, a parametrization,
    pruning, dropout or training switched on, another attention implementation) is seen at the next token: the
    logits after it are the general path's after the same change, and differ from those without it (so that a plan
    that missed it would fail here); a change that keeps the values (eager attention, a new layout) is seen by where
    the fused step runs afterwards, and raises nothing."""
    from transfoxl import modeling_txl

    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    overrides = {"shared bias replaced": {"untie_r": False}, "one output table's data replaced": {"div_val": 1}}
    original = tiny_lm(dropout=0.3, mem_len=8, **overrides.get(change, {}))
    original.config._attn_implementation = "sdpa"
    _BEFORE_THE_STREAM.get(change, lambda model: None)(original)
    ids = covering_ids(original.config.vocab_size, batch=1, length=12)

    def decode(fused: bool, changed: bool) -> tuple[torch.Tensor, list[bool]]:
        model, taken = copy.deepcopy(original), {"model": [], "layer": []}
        with monkeypatch.context() as patch, torch.no_grad():
            _counting_fused_steps(patch, taken) if fused else _general_decoding(patch)
            if not fused:  # (and the adaptive softmax's readable path)
                patch.setattr(modeling_txl, "one_row_log_probs", lambda *args: None)
            memory = model(ids[:, :4], use_cache=True).past_key_values
            for i in range(4, 8):  # (planned at the first token, the plan used by the next three)
                model(ids[:, i : i + 1], past_key_values=memory)
            if changed:
                _CHANGES_BETWEEN_TOKENS[change](model)
            torch.manual_seed(0)  # (the same dropout masks for both paths where dropout is on)
            logits = [model(ids[:, i : i + 1], past_key_values=memory).logits for i in range(8, 12)]
        return torch.cat(logits, dim=1), taken["model"]

    planned, taken = decode(fused=True, changed=True)
    assert taken[:4] == [True] * 4
    expected, _ = decode(fused=False, changed=True)
    torch.testing.assert_close(planned, expected, rtol=0, atol=1e-5)
    if change in _SAME_VALUES:
        assert taken[4:] == [_SAME_VALUES[change]] * 4
    else:
        unchanged, _ = decode(fused=True, changed=False)
        assert (planned - unchanged).abs().max() > 1e-3


@pytest.mark.parametrize("hooked", [False, True])
def test_the_decoding_plan_holds_neither_the_model_nor_a_replaced_layer_for_long(hooked):
    """The decoding plan (and the softmax's tensors for one row) are kept in the model's own dictionary: a model that
    decoded is freed when its last reference goes, also where a hook on it holds the model (a cycle through the plan,
    which the garbage collector frees). A copy or a pickle of the model holds no plan. A layer replaced after
    decoding is freed at the model's next forward that is not a decoded token (which drops the plan), not for as long
    as the model lives."""
    import functools
    import gc
    import pickle
    import weakref

    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    from transfoxl.fast_paths_txl import _PLAN

    def decoded_model() -> TxlForCausalLM:
        model = tiny_lm(mem_len=8)
        model.config._attn_implementation = "sdpa"
        if hooked:  # (a hook on the base model, whose forward runs the fused step: its closure holds the model)
            model.transformer.register_forward_hook(functools.partial(lambda model, *args: None, model))
        with torch.no_grad():
            memory = model(ids[:, :4], use_cache=True).past_key_values
            for i in range(4, 7):
                model(ids[:, i : i + 1], past_key_values=memory)
        assert model.transformer.__dict__[_PLAN] is not None and model.adaptive_softmax.__dict__[_PLAN] is not None
        return model

    ids = covering_ids(tiny_config().vocab_size, batch=1, length=7)
    model = decoded_model()
    copies = [copy.deepcopy(model)] + ([] if hooked else [pickle.loads(pickle.dumps(model))])
    for other in copies:
        assert other.transformer.__dict__[_PLAN] is None and other.adaptive_softmax.__dict__[_PLAN] is None
    refs = [weakref.ref(module) for module in (model, model.transformer, model.adaptive_softmax)]
    del model, copies, other
    gc.collect()
    assert all(ref() is None for ref in refs)

    model = decoded_model()
    replaced = weakref.ref(model.transformer.layers[1])
    model.transformer.layers[1] = copy.deepcopy(model.transformer.layers[0])
    with torch.no_grad():
        model(ids[:, :4])  # a new stream's segment: not a decoded token
    gc.collect()
    assert replaced() is None


@pytest.mark.parametrize("embedding", ["plain", "adaptive"])
@pytest.mark.parametrize("step", ["model", "layer"])
def test_a_stream_continued_under_autocast_decodes_on_without_the_fused_steps(monkeypatch, step, embedding):
    """A token decoded under CPU autocast (bfloat16) keeps bfloat16 keys and values in the memory (the weights, and so
    the memory's projection version, unchanged). The float32 token after it does not take a fused step, which reads
    float32 only (a C++ check failed at every later token before), but the general path, which keeps the memory in
    float32 again; the tokens after that are fused again, all as the general path decodes them. The adaptive
    embedding's projection returns the tables' dtype under autocast too (its bfloat16 output made the whole residual
    stream bfloat16, and the memory refused the float32 token after it)."""
    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    model = tiny_lm(div_val=1, cutoffs=[]) if embedding == "plain" else tiny_lm()
    model.config._attn_implementation = "sdpa"
    ids = covering_ids(model.config.vocab_size, batch=1, length=9)
    results = []
    for fused in (True, False):
        taken = {"model": [], "layer": []}
        with monkeypatch.context() as patch, torch.no_grad():
            _counting_fused_steps(patch, taken, model_step=step == "model") if fused else _general_decoding(patch)
            memory = model(ids[:, :5], use_cache=True).past_key_values
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(ids[:, 5:6], past_key_values=memory)
                assert model.transformer.word_embeddings(ids[:, 5:6]).dtype == torch.float32
            assert memory.layers[0]._keys.value.dtype == torch.bfloat16
            results.append([model(ids[:, i : i + 1], past_key_values=memory).logits for i in range(6, 9)])
        if fused:  # the autocast token, the first after it (the general path keeps float32 again): not fused
            expected = [False, False, True, True]
            if step == "model":
                assert taken["model"] == expected
            else:
                assert taken["layer"] == [fused for fused in expected for _ in range(model.config.n_layer)]
    for fast, general in zip(*results):
        torch.testing.assert_close(fast, general, rtol=0, atol=1e-5)


@pytest.mark.parametrize("missing", [("token_rooms",), ("token_rooms", "kept_as", "append_room")])
def test_a_memory_of_an_older_copy_decodes_by_the_paths_it_supports(monkeypatch, missing):
    """A memory made by an older copy of memory_txl.py (remote code beside the installed package) lacks the newer
    room methods: the fused steps that need them are not taken (no AttributeError) and decoding goes on as the
    general path, keys and values included."""
    from transfoxl.memory_txl import SlidingWindow, TxlMemoryLayer

    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    model = tiny_lm(mem_len=8)
    model.config._attn_implementation = "sdpa"
    ids = covering_ids(model.config.vocab_size, batch=1, length=9)
    results, taken = [], {"model": [], "layer": []}
    for older in (True, False):
        with monkeypatch.context() as patch, torch.no_grad():
            if older:
                for name in missing:
                    patch.delattr(SlidingWindow if name == "append_room" else TxlMemoryLayer, name)
                _counting_fused_steps(patch, taken)
            else:
                _general_decoding(patch)
            memory = model(ids[:, :6], use_cache=True).past_key_values
            results.append([model(ids[:, i : i + 1], past_key_values=memory).logits for i in range(6, 9)])
    assert not any(taken["model"]) and taken["layer"] == [len(missing) == 1] * 3 * model.config.n_layer
    for older, general in zip(*results):
        torch.testing.assert_close(older, general, rtol=0, atol=1e-5)


def test_decoding_with_hidden_states_or_a_hooked_layer_takes_each_layer_s_fused_step(monkeypatch):
    """The model's one call for all layers is not taken where the caller asks for every layer's hidden states, or a
    hook watches a layer (it must see the layer's call): each layer's fused step is, with the same logits and
    hidden states as the general path, and the hook called for each token."""
    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    model = tiny_lm(mem_len=8)
    model.config._attn_implementation = "sdpa"
    ids = covering_ids(model.config.vocab_size, batch=1, length=9)
    calls = []
    model.transformer.layers[1].register_forward_hook(lambda *args: calls.append(1))
    results = {}
    for fused in (True, False):
        taken = {"model": [], "layer": []}
        with monkeypatch.context() as patch:
            if fused:
                _counting_fused_steps(patch, taken)
            else:
                _general_decoding(patch)
            with torch.no_grad():
                memory = model(ids[:, :6], use_cache=True).past_key_values
                calls.clear()
                outputs = [
                    model(ids[:, i : i + 1], past_key_values=memory, output_hidden_states=i == 6) for i in range(6, 9)
                ]
        assert len(calls) == 3
        results[fused] = outputs
        if fused:
            assert taken["model"] == [False, False]  # declined for the hook (not asked with output_hidden_states)
            assert taken["layer"] == [True] * 3 * model.config.n_layer
    for fast, general in zip(results[True], results[False]):
        torch.testing.assert_close(fast.logits, general.logits, rtol=0, atol=1e-5)
    assert len(results[True][0].hidden_states) == model.config.n_layer + 1
    for fast, general in zip(results[True][0].hidden_states, results[False][0].hidden_states):
        torch.testing.assert_close(fast, general, rtol=0, atol=1e-5)


def _three_tokens_fused_and_general(monkeypatch, model) -> tuple[dict[str, list[bool]], torch.Tensor, torch.Tensor]:
    """Three tokens decoded one at a time after a 5-token prompt, with the fused steps counted, then with them off:
    which fused steps were taken (`_counting_fused_steps`), and the two runs' logits (the same dropout masks)."""
    ids = covering_ids(model.config.vocab_size, batch=1, length=8)
    taken = {"model": [], "layer": []}
    results = []
    for fused in (True, False):
        with monkeypatch.context() as patch:
            if fused:
                _counting_fused_steps(patch, taken)
            else:
                _general_decoding(patch)
            torch.manual_seed(0)
            with torch.no_grad():
                memory = model(ids[:, :5], use_cache=True).past_key_values
                steps = [model(ids[:, i : i + 1], past_key_values=memory).logits for i in range(5, 8)]
        results.append(torch.cat(steps))
    return taken, *results


def test_the_fused_decoding_layer_follows_a_sub_layer_in_training_mode(monkeypatch):
    """A feed-forward sub-layer switched to training on its own (its dropout module left in eval) still drops out in
    the general path (its flag decides): the fused step must not be taken for it, and the logits are the general
    path's, dropout masks included."""
    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    model = tiny_lm(dropout=0.5)
    for layer in model.transformer.layers:
        layer.ffn.train()
        layer.ffn.dropout.eval()
    taken, fused, general = _three_tokens_fused_and_general(monkeypatch, model)
    assert taken["model"] == [False] * 3 and taken["layer"] and not any(taken["layer"])
    torch.testing.assert_close(fused, general, rtol=0, atol=0)


@pytest.mark.parametrize("where", ["model config", "one layer's own config"])
def test_the_fused_decoding_steps_follow_each_attention_s_implementation(monkeypatch, where):
    """The model reads its config's attention implementation once per token for all layers; an attention holding a
    config of its own (a layer built apart) is asked itself. Where one asks for eager (the readable reference), the
    model's fused step is not taken, nor that layer's; the other layers still take theirs; the logits are the
    general path's."""
    if compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    model = tiny_lm(n_layer=3)
    model.config._attn_implementation = "sdpa"
    eager_layers = range(3)
    if where == "model config":
        model.config._attn_implementation = "eager"
    else:
        own = copy.deepcopy(model.config)
        own._attn_implementation = "eager"
        model.transformer.layers[1].attention.config = own
        eager_layers = [1]
    taken, fused, general = _three_tokens_fused_and_general(monkeypatch, model)
    assert taken["model"] == [False] * 3
    assert taken["layer"] == [layer not in eager_layers for _ in range(3) for layer in range(3)]
    torch.testing.assert_close(fused, general, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "where", ["fused model step", "fused step", "general path", "segment", "training", "output head", "labels"]
)
def test_an_interrupted_forward_leaves_the_memory_as_it_was(monkeypatch, where):
    """A forward cut short (an interrupt in the last layer, after the first layer updated its memory; in the output
    head, after every layer did; a label check that fails after the layers ran) leaves every layer's hidden states,
    keys and values, the padding and the token record as they were: a full memory does not keep half a step (or, in
    the fused step, a key and value never written), and the next token decodes as if the interrupted call had never
    been made. In the fused decoding steps (the model's, interrupted after it made room in every layer's memory;
    each layer's), the general path, a segment of several tokens, a training forward."""
    from transfoxl import modeling_txl

    if where.startswith("fused") and compiled_operators() is None:
        pytest.skip("the fused layer is for the compiled kernels (Linux on x86-64 with AVX2)")
    model = tiny_lm(mem_len=4)
    model.config._attn_implementation = "sdpa"  # (the fused steps' implementation)
    assert model.config.n_layer == 2
    ids = covering_ids(model.config.vocab_size, batch=1, length=12)
    interrupted = ids[:, 8:11] if where in ("segment", "training") else ids[:, 8:9]
    with torch.no_grad():  # (a forward with gradients would make the kept keys and values stale: no fused step)
        memory = model(ids[:, :8], use_cache=True).past_key_values  # full: 4 of 8 positions kept
        expected = model(ids[:, 11:], past_key_values=copy.deepcopy(memory)).logits
    before = copy.deepcopy(memory)
    calls, taken = [], []

    def interrupt_the_last_layer(original):
        def wrapped(self, *args, **kwargs):
            calls.append(self)
            if len(calls) == model.config.n_layer:
                raise KeyboardInterrupt
            return original(self, *args, **kwargs)

        return wrapped

    def interrupt(*args, **kwargs):
        calls.extend([None] * model.config.n_layer)
        raise KeyboardInterrupt

    class InterruptedKernel:  # the compiled operators, but for the model's fused step
        def __getattr__(self, name):
            return getattr(compiled_operators(), name)

        def decode_layers(self, *args):
            assert all(now != then for now, then in zip(windows(memory), windows_before))  # (room made in each)
            interrupt()

    def windows(memory: TxlMemory) -> list[tuple]:
        return [
            (id(w.buffer), w.start, w.end)
            for layer in memory.layers
            for w in (layer._hidden, layer._keys, layer._values)
        ]

    windows_before = windows(memory)

    labels = None
    with monkeypatch.context() as patch:
        if where == "fused model step":
            patch.setattr(fast_paths_txl, "compiled_operators", InterruptedKernel)
        elif where == "fused step":
            patch.setattr(modeling_txl, "decode_token", lambda *args: None)
            fused_step = modeling_txl.decode_one_row

            def counted_fused_step(*args):
                result = fused_step(*args)
                taken.append(result is not None)
                return result

            patch.setattr(modeling_txl, "decode_one_row", interrupt_the_last_layer(counted_fused_step))
        elif where == "output head":
            patch.setattr(modeling_txl.TxlAdaptiveLogSoftmax, "forward", interrupt)
        elif where == "labels":
            labels = torch.full_like(interrupted, -100)  # nothing to compute a loss on: refused after the layers
            calls.extend([None] * model.config.n_layer)
        else:
            _general_decoding(patch)
            patch.setattr(
                modeling_txl.TxlFeedForward, "forward", interrupt_the_last_layer(modeling_txl.TxlFeedForward.forward)
            )
        raised = ValueError if where == "labels" else KeyboardInterrupt
        with pytest.raises(raised), torch.set_grad_enabled(where == "training"):
            model.train(where == "training")(interrupted, past_key_values=memory, use_cache=True, labels=labels)
    model.eval()
    assert len(calls) == model.config.n_layer
    assert taken == ([True] if where == "fused step" else [])  # (the first layer's fused step ran)
    for layer, kept in zip(memory.layers, before.layers):
        for window in ("_hidden", "_keys", "_values"):
            now, then = getattr(layer, window).value, getattr(kept, window).value
            assert (now is None) == (then is None) and (now is None or torch.equal(now, then)), window
    assert memory.seen_tokens == before.seen_tokens and torch.equal(memory._token_ids.value, before._token_ids.value)
    torch.testing.assert_close(model(ids[:, 11:], past_key_values=memory).logits, expected, rtol=0, atol=1e-6)


def test_an_interrupted_first_forward_leaves_a_zero_memory_empty(monkeypatch):
    """memory_init="zeros" fills a new stream's memory with zeros before its first segment; if that forward is cut
    short, the memory the caller passed is empty again, as it was."""
    from transfoxl import TxlMemory, modeling_txl

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    model = tiny_lm(memory_init="zeros", mem_len=4)
    memory = TxlMemory.from_config(model.config)
    with monkeypatch.context() as patch:
        patch.setattr(modeling_txl.TxlAdaptiveLogSoftmax, "forward", interrupt)
        with pytest.raises(KeyboardInterrupt), torch.no_grad():
            model(covering_ids(97, batch=1, length=3), past_key_values=memory, use_cache=True)
    assert memory.get_seq_length() == 0 and memory.seen_tokens == 0


def test_a_classification_forward_refused_after_its_layers_leaves_the_memory_as_it_was():
    """The sequence classification head checks its labels after the layers ran (and updated the memory); the error
    leaves the memory as it was."""
    from transfoxl import TxlForSequenceClassification

    torch.manual_seed(0)
    model = TxlForSequenceClassification(tiny_config(num_labels=3, mem_len=4)).eval()
    ids = covering_ids(97, batch=1, length=9)
    with torch.no_grad():
        memory = model(ids[:, :6], use_cache=True).past_key_values
        before = copy.deepcopy(memory)
        with pytest.raises(ValueError, match="num_labels"):
            model(ids[:, 6:], past_key_values=memory, use_cache=True, labels=torch.tensor([7]))
    assert memory.seen_tokens == before.seen_tokens
    for layer, kept in zip(memory.layers, before.layers):
        assert torch.equal(layer.hidden, kept.hidden)


def test_query_blocks_are_not_taken_when_a_position_term_needs_a_gradient(monkeypatch):
    """Training only v (bias tuning) with frozen weights: the queries need no gradient but the position bias does,
    so a long segment must not go by query blocks (their out= passes refuse autograd); eager's gradients."""
    from transfoxl import modeling_txl

    monkeypatch.setattr(modeling_txl.TxlRelativeAttention, "query_block", 4)
    ids = covering_ids(97, batch=2, length=12)
    grads = []
    for implementation in ("sdpa", "eager"):
        model = tiny_lm(attn_implementation=implementation).train()
        model.requires_grad_(False)
        biases = [layer.attention.position_bias.requires_grad_(True) for layer in model.transformer.layers]
        model(ids, labels=ids).loss.backward()
        grads.append([bias.grad for bias in biases])
    for grad, expected in zip(*grads):
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5)


def _watch(kind, module, calls):
    """Make `module` watched by a hook of `kind` (or replaced) that appends to `calls`; returns an undo function."""
    record = lambda *args, **kwargs: calls.append(module)  # noqa: E731  (hooks of every signature)
    global_hooks = torch.nn.modules.module
    if kind == "forward":
        return module.register_forward_hook(record).remove
    if kind == "forward_pre":
        return module.register_forward_pre_hook(record).remove
    if kind == "backward":
        return module.register_full_backward_hook(record).remove
    if kind == "backward_pre":
        return module.register_full_backward_pre_hook(record).remove
    if kind == "global_forward":
        return global_hooks.register_module_forward_hook(lambda m, *a: record() if m is module else None).remove
    if kind == "global_forward_pre":
        return global_hooks.register_module_forward_pre_hook(lambda m, *a: record() if m is module else None).remove
    if kind == "global_backward":
        hook = lambda m, *a: record() if m is module else None  # noqa: E731
        return global_hooks.register_module_full_backward_hook(hook).remove
    if kind == "global_backward_pre":
        hook = lambda m, *a: record() if m is module else None  # noqa: E731
        return global_hooks.register_module_full_backward_pre_hook(hook).remove
    if kind == "instance_forward":  # as accelerate's offloading hooks do
        original = module.forward
        module.forward = lambda *args: (record(), original(*args))[1]
        return lambda: module.__dict__.pop("forward")
    if kind == "class_forward":
        original = type(module).forward
        type(module).forward = lambda self, *args: (record() if self is module else None, original(self, *args))[1]
        return lambda: setattr(type(module), "forward", original)
    raise ValueError(kind)


HOOK_KINDS = [
    "forward",
    "forward_pre",
    "backward",
    "backward_pre",
    "global_forward",
    "global_forward_pre",
    "global_backward",
    "global_backward_pre",
    "instance_forward",
    "class_forward",
]


@pytest.mark.filterwarnings("ignore:For backward hooks to be called", "ignore:Full backward hook is firing")
@pytest.mark.parametrize("kind", HOOK_KINDS)
@pytest.mark.parametrize(
    "module_name", ["attention.o_proj", "ffn.up_proj", "ffn.down_proj", "attention.layer_norm", "attention", "ffn", ""]
)
def test_linear_and_norm_layers_keep_their_module_call_when_watched(kind, module_name):
    """Bare linear and layer-norm layers are computed without their module call (it only costs time), and a decoded
    token at batch 1 skips the sub-layers' calls too (the fused layer step), and the layers' (the model's fused step);
    a module (a layer: "") that a hook of any kind watches, or whose forward is replaced (on the instance or the
    class), keeps its call: in training (forward and backward) and when decoding a token at batch 1, with the same
    outputs."""
    model = tiny_lm(mem_len=8)
    module = model.transformer.layers[0].get_submodule(module_name)
    ids = covering_ids(97, batch=2, length=6)
    expected_loss = model.train()(ids, labels=ids).loss
    with torch.no_grad():
        memory = model.eval()(ids[:1, :5], use_cache=True).past_key_values
        expected_logits = model(ids[:1, 5:], past_key_values=memory, use_cache=True).logits
    calls = []
    undo = _watch(kind, module, calls)
    try:
        loss = model.train()(ids, labels=ids).loss
        loss.backward()
        assert calls, "not called as a module in training"
        calls.clear()
        if not kind.startswith(("backward", "global_backward")):
            with torch.no_grad():
                memory = model.eval()(ids[:1, :5], use_cache=True).past_key_values
                calls.clear()
                logits = model(ids[:1, 5:], past_key_values=memory, use_cache=True).logits
            assert calls, "not called as a module when decoding"
            torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-5)
    finally:
        undo()
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-5)


def test_a_hooked_feed_forward_keeps_what_its_hook_captured():
    """A forward hook's captured output of the feed-forward's first product is not rectified in place in
    inference (the in-place ReLU is for a bare layer only)."""
    model = tiny_lm().eval()
    captured = []
    model.transformer.layers[0].ffn.up_proj.register_forward_hook(
        lambda module, args, output: captured.append((output, output.clone()))
    )
    with torch.no_grad():
        model(covering_ids(97, batch=2, length=6))
    kept, copy = captured[-1]
    assert torch.equal(kept, copy) and (copy < 0).any()  # the hook's tensor still holds negative pre-activations


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:`torch.jit.trace:DeprecationWarning")
@pytest.mark.parametrize("config_name", ["tiny", "tiny_wt103"])
def test_adaptive_embedding_by_cluster_equals_the_masked_path(config_name):
    """In CPU inference each token goes through its own cluster only (one token: found on the host): the masked
    path's values, and ids outside the vocabulary are an IndexError naming them. With gradients on, and while
    tracing, the masked path runs: every cluster's parameters get a gradient (zero where no token fell, as
    DistributedDataParallel and AdamW expect), and a traced embedding holds for tokens of other clusters."""
    model = TxlForCausalLM(TxlConfig(**model_config(config_name), tie_word_embeddings=False))
    embedding = model.transformer.word_embeddings
    vocab = model.config.vocab_size
    torch.manual_seed(0)
    cases = [torch.randint(0, vocab, (3, 7)), torch.tensor([[5, 6, 7]])]  # every cluster, then the first only
    cases += [torch.tensor([[low]]) for low in embedding.bounds[:-1]] + [torch.tensor([[vocab - 1]])]
    with torch.no_grad():
        for ids in cases:
            expected = embedding._embed_masked(ids) * embedding.scale
            torch.testing.assert_close(embedding(ids), expected, rtol=1.3e-6, atol=1e-6)
            torch.testing.assert_close(embedding._embed_by_cluster(ids), expected / embedding.scale, rtol=0, atol=1e-6)
        for bad in (torch.tensor([[vocab]]), torch.tensor([[-1]]), torch.tensor([[1, vocab + 3]])):
            with pytest.raises(IndexError, match=f"outside the vocabulary \\[0, {vocab}\\)"):
                embedding(bad)
        # One token reads its table's row itself, unless the table is hooked or renormalises the rows it looks up
        # (max_norm): the module is called then, its hook runs, the row is rescaled in place.
        calls = []
        token = torch.tensor([[embedding.bounds[1] + 2]])
        expected = embedding._embed_masked(token) * embedding.scale
        handle = embedding.embeddings[1].register_forward_hook(lambda module, inputs, output: calls.append(inputs[0]))
        torch.testing.assert_close(embedding(token), expected)
        handle.remove()
        assert len(calls) == 1 and calls[0].tolist() == [[2]]
        table = embedding.embeddings[0]
        table.max_norm = 0.5 * float(table.weight[3].norm())
        embedding(torch.tensor([[3]]))
        assert float(table.weight[3].norm()) <= table.max_norm * 1.0001
        table.max_norm = None
    # A projection supplied by a parametrization (pruning's mask, say) is what one token is projected with too
    torch.nn.utils.prune.l1_unstructured(embedding.projections, name="1", amount=0.3)
    with torch.no_grad():
        token = torch.tensor([[embedding.bounds[1] + 2]])
        torch.testing.assert_close(embedding(token), embedding._embed_masked(token) * embedding.scale)
    torch.nn.utils.prune.remove(embedding.projections, "1")
    embedding(cases[1]).sum().backward()  # tokens of the first cluster only
    assert all(parameter.grad is not None for parameter in embedding.parameters())
    assert not embedding.embeddings[-1].weight.grad.any()
    with torch.no_grad():
        traced = torch.jit.trace(embedding, cases[1], check_trace=False)
        torch.testing.assert_close(traced(cases[0]), embedding._embed_masked(cases[0]) * embedding.scale)


def test_training_after_an_inference_mode_forward():
    """A forward under torch.inference_mode() keeps nothing that a later training step would save for backward
    (the model's position table was made under that mode): the step's gradients are those of a fresh model."""
    ids = covering_ids(97, batch=2, length=6)
    grads = []
    for warmed in (False, True):
        model = tiny_lm(mem_len=8)
        if warmed:
            with torch.inference_mode():
                model(ids)
        model.train()(ids, labels=ids).loss.backward()
        grads.append({name: parameter.grad for name, parameter in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0)


def test_torch_func_grad_equals_autograd():
    """torch.func.grad over functional_call (per-sample gradients, meta-learning) takes the plain autograd paths
    (the CPU kernels' autograd Functions do not support torch.func transforms) and gives autograd's gradients."""
    model = tiny_lm(mem_len=8, dropout=0.0).train()
    ids = covering_ids(97, batch=2, length=6)
    model(ids, labels=ids).loss.backward()
    expected = {name: parameter.grad for name, parameter in model.named_parameters()}
    params = {name: parameter.detach() for name, parameter in model.named_parameters()}
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (ids,), {"labels": ids}).loss)(params)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-6)


def test_generate_continues_a_memory_through_a_compiled_forward_as_one_longer_call(one_thread):
    """transformers' continuation idiom, `generate(out.sequences, past_key_values=out.cache)`, tells the memory's
    tokens from new ones by the count of tokens seen, which a traced forward cannot keep; generate()'s hooks count
    around it, so a compiled forward continues as the eager model does (it fed the whole sequence again)."""
    ids = covering_ids(97, batch=2, length=9)
    model = tiny_lm(mem_len=32).eval()
    expected = model.generate(ids, max_new_tokens=8, do_sample=False)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="aot_eager", fullgraph=True)
    out = model.generate(ids, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    memory = _memory_of(out)
    assert memory.seen_tokens == ids.shape[1] + 3  # (the last token is not fed yet)
    more = model.generate(out.sequences, past_key_values=memory, max_new_tokens=4, do_sample=False)
    torch.testing.assert_close(more, expected, rtol=0, atol=0)


def test_an_announced_forward_cut_short_leaves_nothing_to_count_later(one_thread):
    """A forward that fails puts the memory back (`restore_state`), its announced tokens with it: a later forward
    traced outside generate() leaves the count unknown, not the stale announcement's."""
    model, ids = tiny_lm(mem_len=32).eval(), covering_ids(97, batch=1, length=6)
    memory = _memory_of(model(ids, past_key_values=model.transformer.empty_memory()))
    memory.expect_tokens(ids, batch=1, q_len=6, device=ids.device)
    with pytest.raises(ValueError):
        model(ids, past_key_values=memory, attention_mask=torch.ones(1, 99))
    memory.seen_tokens = None  # (as a compiled forward outside generate() leaves it)
    memory.settle_tokens()
    assert memory.seen_tokens is None


def test_generate_warns_when_a_compiled_forward_outside_it_left_the_count_unknown(one_thread, caplog):
    ids = covering_ids(97, batch=1, length=9)
    model = tiny_lm(mem_len=32).eval()
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        memory = _memory_of(compiled(ids, past_key_values=model.transformer.empty_memory()))
    assert memory.seen_tokens is None
    logging.Logger.warning_once.cache_clear()  # (said once per process: another test may have said it)
    with caplog.at_level("WARNING"):
        model.generate(ids[:, -2:], past_key_values=memory, max_new_tokens=2, do_sample=False)
    assert "count of tokens seen is unknown" in caplog.text
    caplog.clear()
    logging.Logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"), memory.input_is_new():
        model.generate(ids[:, -2:], past_key_values=memory, max_new_tokens=2, do_sample=False)
    assert "count of tokens seen is unknown" not in caplog.text


def test_a_compiled_forward_is_not_compiled_again_for_a_second_identical_call(one_thread):
    """The model's position table is not kept by a traced forward: the first call's would fail the guards of the
    second, which compiled the forward again."""
    ids = covering_ids(97, batch=1, length=9)
    model = tiny_lm(mem_len=16).eval()
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    model.forward = torch.compile(model.forward, backend=counter, dynamic=True)
    with torch.no_grad():
        model(ids)
        compilations = counter.frame_count
        model(ids)
    assert counter.frame_count == compilations


def test_a_jit_traced_model_projects_the_position_table_from_its_weights():
    """torch.jit.trace records what a forward computes; a position table kept from an earlier eager call would be
    recorded as a constant, and the traced program would go on using it after the weights change (fine-tuning the
    traced module, a loaded state dict). Nothing kept is used while tracing: the traced program follows its weights."""
    model = tiny_lm(mem_len=8).eval()

    ids = covering_ids(97, batch=2, length=12)
    with torch.no_grad():
        model(ids, use_cache=False)  # keeps each layer's projected position table
        assert all(layer.attention._projected_positions is not None for layer in model.transformer.layers)
        traced = torch.jit.trace(LogitsOnly(model), ids, check_trace=False)
        for layer in model.transformer.layers:
            layer.attention.pos_proj.weight.mul_(2.0)
        torch.testing.assert_close(traced(ids), model(ids, use_cache=False).logits, rtol=1e-5, atol=1e-5)
