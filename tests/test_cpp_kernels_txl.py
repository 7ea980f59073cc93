"""The compiled CPU attention kernel (transfoxl/cpp_kernels_txl.py) equals the readable attention, is what CPU
inference takes where it applies, is built once and kept whole, and falls back to the torch path where it cannot be
built or is turned off."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from tests.test_fast_paths import _attention_inputs, _mask
from tests.test_modeling_txl import covering_ids
from tests.utils import LogitsOnly, run_fresh_python, tiny_lm
from transfoxl import cpp_kernels_txl, kernels_txl
from transfoxl.kernels_txl import (
    compiled_attention_applies,
    compiled_one_query_attention,
    compiled_relative_attention,
    compiled_relative_attention_training,
    relative_attention,
)
from transfoxl.modeling_txl import eager_relative_attention


@pytest.fixture
def kernel():
    """The kernel's op where this machine can build it (Linux x86-64 with AVX2): it must build there."""
    if not cpp_kernels_txl.supported_here():
        pytest.skip("the compiled kernel is for Linux on x86-64 with AVX2 (and TRANSFOXL_CPU_KERNEL not 0)")
    operators = cpp_kernels_txl.compiled_operators()
    assert operators is not None, "the kernel failed to build on a machine that supports it (see the warning)"
    return operators


@pytest.fixture
def fresh_builds(monkeypatch, tmp_path):
    """An empty kernel cache in tmp_path and no build remembered in this process (restored afterwards)."""
    monkeypatch.setenv("TRANSFOXL_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(cpp_kernels_txl, "_built", {})
    return tmp_path / "kernels"


@pytest.mark.parametrize(
    ("batch", "q_len", "mem_len", "head_dim", "mask_kind"),
    [
        (1, 40, 0, 8, "causal"),  # blocks of 16 queries, the last one partial
        (3, 37, 9, 16, "causal"),
        (2, 2, 30, 32, "causal"),  # two queries after a long memory
        (1, 70, 5, 64, "causal"),  # the wt103 head width
        (3, 20, 9, 24, "padding"),  # padded keys: row 1's first and last memory positions
        (3, 19, 12, 8, "same_length"),
        (2, 50, 77, 32, "causal"),  # groups of rows whose position products span several tiles of keys
        (2, 33, 100, 48, "padding"),  # a head width of 16-float vectors and a half (the values' product)
    ],
)
def test_compiled_attention_equals_eager(kernel, batch, q_len, mem_len, head_dim, mask_kind):
    """Values within float32 rounding of the readable attention, for strided keys and values (views of one
    [B, K, 2H, D] buffer, as the memory keeps them), partial blocks and tiles, and every mask the model builds."""
    inputs = _attention_inputs(batch, 3, q_len, mem_len, head_dim=head_dim, seed=q_len + mem_len)
    mask = _mask(mask_kind, batch, q_len, mem_len, max_mem_len=mem_len)
    expected, _ = eager_relative_attention(*inputs, mask, scaling=head_dim**-0.5, dropout=0.0)
    assert compiled_attention_applies(*inputs, mask)
    output = compiled_relative_attention(*inputs, mask, scaling=head_dim**-0.5)
    assert output.shape == expected.shape
    torch.testing.assert_close(output, expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    ("batch", "mem_len", "head_dim", "mask_kind"),
    [
        (1, 0, 8, "none"),  # one key: the tail loop alone
        (1, 40, 32, "none"),  # 41 keys: five steps of 8 (AVX-512, D % 16 == 0: two of 16) and a tail; an odd count
        (3, 23, 16, "padding"),
        (2, 30, 64, "hidden"),  # sequence 0 sees no key: the mean of its values
        (3, 12, 24, "same_length"),
        (1, 20, 136, "none"),  # a head wider than 64: the values in two passes, the second of one register
        (2, 36, 144, "padding"),  # the same in AVX-512 registers: three passes (4, 4 and 1 registers of 16)
    ],
)
def test_compiled_one_query_attention_equals_eager(kernel, batch, mem_len, head_dim, mask_kind):
    """Decoding's kernel: values within float32 rounding of the readable attention, for no mask, the [1, K] and
    [B, 1, 1, K] masks, a sequence whose keys are all hidden, and strided keys and values."""
    inputs = _attention_inputs(batch, 3, 1, mem_len, head_dim=head_dim, seed=mem_len)
    if mask_kind == "hidden":
        mask = torch.zeros(batch, 1, 1, mem_len + 1, dtype=torch.bool)
        mask[0] = True
    else:
        mask = _mask(mask_kind, batch, 1, mem_len, max_mem_len=mem_len)
    expected, _ = eager_relative_attention(*inputs, mask, scaling=0.2, dropout=0.0)
    assert compiled_attention_applies(*inputs, mask)
    output = compiled_one_query_attention(*inputs, mask, scaling=0.2)
    assert output.shape == expected.shape
    torch.testing.assert_close(output, expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    ("batch", "q_len", "mem_len", "head_dim", "mask_kind"),
    [
        (2, 40, 0, 8, "causal"),  # the first segment: no memory; blocks of 16 queries, the last one partial
        (3, 37, 9, 16, "causal"),
        (1, 70, 5, 64, "causal"),  # the wt103 head width
        (3, 20, 9, 24, "padding"),
        (3, 19, 12, 8, "same_length"),
        (2, 20, 6, 16, "hidden"),  # sequence 0's first five queries see no key (left padding)
        (2, 50, 77, 32, "causal"),
    ],
)
def test_compiled_training_attention_equals_the_torch_training_path(
    kernel, batch, q_len, mem_len, head_dim, mask_kind
):
    """Training's compiled forward (it also writes the probabilities) and the shared backward: the output and the
    gradients of the query, keys, values, relative keys and both biases equal the torch training kernel's (and the
    readable attention's where a query sees at least one key) within float32 rounding."""
    leaves = [tensor.detach().requires_grad_() for tensor in _attention_inputs(batch, 3, q_len, mem_len, head_dim)]
    if mask_kind == "hidden":
        mask = _mask("causal", batch, q_len, mem_len, max_mem_len=mem_len)[None, None].repeat(batch, 1, 1, 1)
        mask[0, :, :5] = True
    else:
        mask = _mask(mask_kind, batch, q_len, mem_len, max_mem_len=mem_len)
    grad_output = torch.randn(batch, 3, q_len, head_dim)
    scaling = head_dim**-0.5
    compiled = compiled_relative_attention_training(*leaves, mask, scaling=scaling)
    compiled_grads = torch.autograd.grad(compiled, leaves, grad_output)
    references = [relative_attention(*leaves, mask, scaling=scaling)]
    if mask_kind != "hidden":  # (a query that sees nothing: the readable path's masked_fill passes no gradient)
        references.append(eager_relative_attention(*leaves, mask, scaling=scaling, dropout=0.0)[0])
    for reference in references:
        torch.testing.assert_close(compiled, reference, rtol=0, atol=2e-5)
        for mine, theirs in zip(compiled_grads, torch.autograd.grad(reference, leaves, grad_output)):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_training_forward_writes_exact_zeros_for_hidden_keys(kernel):
    """The probabilities the training forward keeps for backward are exactly 0 for every hidden key, also those a
    padding mask hides among the keys a query may see (the vectorised exp's clamp would leave about 1e-38 there,
    denormal after the division), and each row sums to 1."""
    batch, heads, q_len, mem_len, head_dim = 3, 2, 20, 9, 16
    inputs = _attention_inputs(batch, heads, q_len, mem_len, head_dim=head_dim)
    mask = _mask("padding", batch, q_len, mem_len, max_mem_len=mem_len)[:, 0]  # [B, Q, K]
    _, probs = kernel.relative_attention_training_forward(*inputs, mask, 0.25)
    hidden = mask[None].expand(heads, -1, -1, -1).reshape(heads * batch, q_len, q_len + mem_len)  # head-major
    assert bool((probs[hidden] == 0).all()) and bool((probs[~hidden] > 0).all())
    torch.testing.assert_close(probs.sum(-1), torch.ones(heads * batch, q_len), rtol=0, atol=1e-6)


def test_the_saved_query_key_and_value_hold_no_unused_rows():
    """What the compiled training Function keeps for backward: the query, key and value as they are when their
    storages hold nothing else (the model's own projections), compact copies when they are views of a wider
    projection of [memory; segment] (a hooked or adapted qkv projection), whose memory rows' queries backward does
    not need."""
    from transfoxl.kernels_txl import _compact

    batch, k_len, q_len, heads, head_dim = 2, 12, 5, 3, 8
    key_value = torch.randn(batch, k_len, 2 * heads, head_dim).transpose(1, 2)
    query = torch.randn(batch, q_len, heads, head_dim).transpose(1, 2)
    key, value = key_value.chunk(2, dim=1)
    own = _compact(query, key, value)
    assert all(kept is given for kept, given in zip(own, (query, key, value)))
    qkv = torch.randn(batch, k_len, 3 * heads, head_dim).transpose(1, 2)
    query, key, value = qkv[:, :heads, -q_len:], qkv[:, heads : 2 * heads], qkv[:, 2 * heads :]
    compact = _compact(query, key, value)
    for kept, given in zip(compact, (query, key, value)):
        assert torch.equal(kept, given) and kept.untyped_storage().nbytes() == given.numel() * 4


@pytest.mark.parametrize("kernel_on", [True, False])
def test_training_takes_the_compiled_forward_where_it_applies_with_the_torch_paths_gradients(monkeypatch, kernel_on):
    """Through the whole model (sdpa, training, two segments with a memory, gradient checkpointing on the second
    model): segments of two or more tokens take the compiled forward where the kernel is built and the torch
    training kernel where it is not; the losses and every parameter's gradient equal the torch path's."""
    from transfoxl import modeling_txl

    if kernel_on and not cpp_kernels_txl.supported_here():
        pytest.skip("the compiled kernel is for Linux on x86-64 with AVX2")
    calls = {"compiled": 0, "torch": 0}

    def counting(function, path):
        def counted(*args, **kwargs):
            calls[path] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr(
        modeling_txl,
        "compiled_relative_attention_training",
        counting(modeling_txl.compiled_relative_attention_training, "compiled"),
    )
    monkeypatch.setattr(modeling_txl, "relative_attention", counting(modeling_txl.relative_attention, "torch"))
    ids = covering_ids(97, batch=2, length=24)

    def train(checkpointing: bool):
        model = tiny_lm(mem_len=8, attn_implementation="sdpa", dropout=0.0, dropatt=0.0).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        memory, losses = None, []
        for segment in (ids[:, :12], ids[:, 12:]):
            output = model(segment, labels=segment, past_key_values=memory, use_cache=True)
            output.loss.backward()
            memory, losses = output.past_key_values, [*losses, output.loss.detach()]
        return torch.stack(losses), {name: p.grad for name, p in model.named_parameters()}

    if not kernel_on:
        monkeypatch.setattr(modeling_txl, "compiled_attention_applies", lambda *arguments: False)
    losses, grads = train(checkpointing=False)
    layers = tiny_lm().config.n_layer
    assert calls == ({"compiled": 2 * layers, "torch": 0} if kernel_on else {"compiled": 0, "torch": 2 * layers})
    checkpointed_losses, checkpointed_grads = train(checkpointing=True)
    monkeypatch.setattr(modeling_txl, "compiled_attention_applies", lambda *arguments: False)
    reference_losses, reference_grads = train(checkpointing=False)
    for compared_losses, compared_grads in ((losses, grads), (checkpointed_losses, checkpointed_grads)):
        torch.testing.assert_close(compared_losses, reference_losses, rtol=0, atol=1e-5)
        for name, gradient in reference_grads.items():
            torch.testing.assert_close(compared_grads[name], gradient, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("shape", [(8, 128, 256), (3, 5, 7), (1,), (4099,)])
@pytest.mark.parametrize("p", [0.1, 0.5, 1e-9, 1 - 1e-9])
def test_compiled_dropout_equals_the_torch_path_bit_for_bit(kernel, shape, p):
    """The same mask from the same seed, the same outputs and gradients to the bit (products in the same order), for
    sizes that end inside a word and a block, NaN and negative zero included."""
    inputs = torch.randn(shape)
    inputs.view(-1)[:2] = torch.tensor([float("nan"), -0.0])[: inputs.numel()]
    grad_output = torch.randn(shape)
    seed, threshold, scale = kernels_txl._dropout_seed(), kernels_txl._dropout_threshold(p), 1 / (1 - p)
    keep = kernels_txl._keep_mask(inputs, p, seed)
    output, compiled_keep = kernel.dropout_training_forward(inputs, seed, threshold, scale)
    assert torch.equal(compiled_keep, keep)

    def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))

    assert same_bits(output, torch.mul(inputs, keep.view(torch.uint8)).mul_(scale))
    relu_output = kernel.relu_dropout_training_forward(inputs, seed, threshold, scale)
    assert same_bits(relu_output, torch.mul(inputs, keep.view(torch.uint8)).relu_().mul_(scale))
    assert same_bits(
        kernel.dropout_training_backward(grad_output, keep, scale),
        torch.mul(grad_output, keep.view(torch.uint8)).mul_(scale),
    )
    assert same_bits(
        kernel.dropout_training_backward(grad_output, relu_output, scale),
        torch.ops.aten.threshold_backward(grad_output, relu_output, 0.0).mul_(scale),
    )


@pytest.mark.parametrize("function", [kernels_txl.dropout, kernels_txl.relu_dropout])
def test_dropout_takes_the_compiled_kernel_with_the_torch_paths_masks_whatever_the_threads(
    kernel, monkeypatch, function
):
    """Through the autograd Functions: with the kernel (one thread or two) and without it, one torch seed gives the
    same outputs and gradients; the kernel is what ran."""
    inputs = torch.randn(16, 300, requires_grad=True)
    grad_output = torch.randn(16, 300)
    calls = []
    real = kernels_txl._compiled_dropout
    monkeypatch.setattr(kernels_txl, "_compiled_dropout", lambda *tensors: calls.append(1) or real(*tensors))

    def run(threads: int) -> tuple[torch.Tensor, torch.Tensor]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            torch.manual_seed(3)
            output = function(inputs, 0.2, True)
            (grad,) = torch.autograd.grad(output, inputs, grad_output)
        finally:
            torch.set_num_threads(before)
        return output, grad

    two, one = run(2), run(1)
    assert len(calls) == 4 and all(real(inputs) is not None for _ in calls)
    monkeypatch.setenv("TRANSFOXL_CPU_KERNEL", "0")
    torch_path = run(2)
    for compiled in (two, one):
        assert all(torch.equal(a, b) for a, b in zip(compiled, torch_path))


def test_training_with_dropout_gives_the_same_losses_with_the_kernel_and_without(monkeypatch):
    """Dropout draws the same masks on both paths: three training steps of a model with dropout (attention's
    forward compiled or not, masks from the kernel or torch) end within float32 rounding of each other."""
    ids = covering_ids(97, batch=2, length=24)

    def losses() -> list[float]:
        torch.manual_seed(0)
        model = tiny_lm(mem_len=8, dropout=0.2).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        memory, result = None, []
        for segment in ids.split(8, dim=1):
            output = model(segment, labels=segment, past_key_values=memory)
            output.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            memory, result = output.past_key_values, [*result, output.loss.item()]
        return result

    compiled = losses()
    monkeypatch.setenv("TRANSFOXL_CPU_KERNEL", "0")
    torch.testing.assert_close(losses(), compiled, rtol=1e-5, atol=0)


def test_decode_layers_takes_the_memory_s_windows_by_offsets_as_by_views(kernel):
    """`decode_layers` with offsets (the memory's whole buffers, where each window starts, the whole position table)
    computes and writes what it does given the windows as views; offsets outside a buffer are refused."""
    torch.manual_seed(0)
    E, H, D, F, N, K, L = 16, 2, 8, 32, 10, 5, 7
    firsts = [(2, 3, 1), (4, 0, 5)]  # per layer: its input's, key's and value's window start in its buffer

    def layer_tensors() -> list[torch.Tensor]:
        return [
            torch.randn(1, N, E),  # the layer inputs' buffer
            torch.randn(3 * H * D, E),
            torch.randn(1, H, N, D),  # keys
            torch.randn(1, H, N, D),  # values
            torch.randn(H, L, D),  # the position table
            *(torch.randn(H, D) for _ in range(2)),
            torch.randn(E, H * D),
            *(torch.randn(E) for _ in range(3)),
            torch.randn(F, E),
            torch.randn(F),
            torch.randn(E, F),
            *(torch.randn(E) for _ in range(3)),
        ]

    layers = [layer_tensors() for _ in firsts]
    hidden, scalars = torch.randn(E), [D**-0.5, 1e-5, 1e-5] * len(firsts)
    by_views, by_offsets = copy.deepcopy(layers), copy.deepcopy(layers)
    views = []
    for tensors, (input_first, key_first, value_first) in zip(by_views, firsts):
        views += (
            tensors[0].narrow(1, input_first, K),
            tensors[1],
            tensors[2].narrow(2, key_first, K),
            tensors[3].narrow(2, value_first, K),
            tensors[4].narrow(1, L - K, K),
            *tensors[5:],
        )
    expected = kernel.decode_layers(hidden, views, None, scalars, False)
    offsets = [K, *(first for layer_firsts in firsts for first in layer_firsts)]
    buffers = [tensor for tensors in by_offsets for tensor in tensors]
    output = kernel.decode_layers(hidden, buffers, None, scalars, False, offsets)
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    for written, reference in zip(by_offsets, by_views):
        for tensor, expected_tensor in zip(written[:4], reference[:4]):  # (the new entries written alike)
            torch.testing.assert_close(tensor, expected_tensor, rtol=0, atol=0)
    outside = [K, 2, 3, N - K + 1, 4, 0, 5]  # layer 0's value window would end past its buffer
    with pytest.raises(RuntimeError):
        kernel.decode_layers(hidden, buffers, None, scalars, False, outside)
    with pytest.raises(RuntimeError, match="K and three per layer"):
        kernel.decode_layers(hidden, buffers, None, scalars, False, [K, 1])


def test_compiled_attention_takes_biases_of_any_layout(kernel):
    """Biases that are views (a slice of a wider tensor, a transpose) give eager's values in both kernels, not an
    error from inside the operator."""
    query, key, value, rel_key, _, _ = _attention_inputs(2, 3, 9, 4, head_dim=8, seed=1)
    content_bias, position_bias = torch.randn(3, 16)[:, :8], torch.randn(8, 3).t()
    mask = _mask("causal", 2, 9, 4, max_mem_len=4)
    inputs = (query, key, value, rel_key, content_bias, position_bias)
    expected, _ = eager_relative_attention(*inputs, mask, scaling=0.3, dropout=0.0)
    torch.testing.assert_close(compiled_relative_attention(*inputs, mask, scaling=0.3), expected, rtol=0, atol=2e-5)
    one = (query[:, :, -1:], *inputs[1:])
    expected, _ = eager_relative_attention(*one, None, scaling=0.3, dropout=0.0)
    torch.testing.assert_close(compiled_one_query_attention(*one, None, scaling=0.3), expected, rtol=0, atol=2e-5)


def test_compiled_attention_averages_the_values_where_a_row_hides_every_key(kernel):
    """A query whose keys are all hidden (a padded row) gets the mean of all the values, as the readable softmax
    over equal scores gives it; the other rows are unaffected."""
    batch, q_len, mem_len = 2, 20, 6
    inputs = _attention_inputs(batch, 2, q_len, mem_len, head_dim=16, seed=3)
    mask = _mask("causal", batch, q_len, mem_len, max_mem_len=mem_len)[None, None].repeat(batch, 1, 1, 1)
    mask[0, :, :5] = True  # the first five queries of sequence 0 see nothing
    expected, _ = eager_relative_attention(*inputs, mask, scaling=0.25, dropout=0.0)
    output = compiled_relative_attention(*inputs, mask, scaling=0.25)
    torch.testing.assert_close(output, expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(output[0, :, 0], inputs[2][0].mean(dim=1), rtol=0, atol=2e-5)


def test_compiled_attention_keeps_nan_where_eager_gives_it(kernel):
    """A NaN in a key the queries see makes their outputs NaN, as in the readable attention (a clamp in the
    vectorised exp must not turn a NaN score into a zero probability), in both kernels."""
    inputs = list(_attention_inputs(1, 2, 6, 10, head_dim=16, seed=5))
    inputs[1] = inputs[1].clone()
    inputs[1][0, 0, 3, 0] = float("nan")  # memory key 3 of head 0: every query sees it
    mask = _mask("causal", 1, 6, 10, max_mem_len=10)
    expected, _ = eager_relative_attention(*inputs, mask, scaling=0.25, dropout=0.0)
    output = compiled_relative_attention(*inputs, mask, scaling=0.25)
    assert expected[0, 0].isnan().all() and not expected[0, 1].isnan().any()
    torch.testing.assert_close(output, expected, rtol=0, atol=2e-5, equal_nan=True)
    one = [inputs[0][:, :, -1:], *inputs[1:]]
    expected_one, _ = eager_relative_attention(*one, None, scaling=0.25, dropout=0.0)
    torch.testing.assert_close(
        compiled_one_query_attention(*one, None, scaling=0.25), expected_one, rtol=0, atol=2e-5, equal_nan=True
    )


def test_compiled_attention_does_not_apply_where_the_kernel_cannot(kernel):
    """Float64, a head width not a multiple of 8, a float mask, CPU autocast: the torch paths."""
    inputs = _attention_inputs(1, 2, 9, 3, head_dim=8)
    mask = _mask("causal", 1, 9, 3, max_mem_len=3)
    assert compiled_attention_applies(*inputs, mask)
    assert not compiled_attention_applies(*(tensor.double() for tensor in inputs), mask)
    assert not compiled_attention_applies(*_attention_inputs(1, 2, 9, 3, head_dim=12), mask)
    assert not compiled_attention_applies(*inputs, mask.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not compiled_attention_applies(*inputs, mask)


@pytest.mark.parametrize("kernel_on", [True, False])
def test_inference_takes_the_compiled_kernel_or_the_torch_paths_and_matches_eager(monkeypatch, kernel_on):
    """Through the whole model (sdpa, inference): with the kernel, every segment of two or more tokens takes it and
    every decoded token its one-query loop; with TRANSFOXL_CPU_KERNEL=0, long segments take the query blocks, short
    ones SDPA, decoded tokens the one-query path. The logits equal the eager model's, segment after segment."""
    from transfoxl import modeling_txl

    if kernel_on and not cpp_kernels_txl.supported_here():
        pytest.skip("the compiled kernel is for Linux on x86-64 with AVX2")
    if not kernel_on:
        monkeypatch.setenv("TRANSFOXL_CPU_KERNEL", "0")
    paths = {
        "compiled_relative_attention": "compiled",
        "compiled_one_query_attention": "compiled_one_query",
        "relative_attention_by_query_blocks": "blocks",
        "sdpa_relative_attention": "sdpa",
        "one_query_attention": "one_query",
    }
    taken = dict.fromkeys(paths.values(), 0)
    paths_on, paths_off = ("compiled", "compiled_one_query"), ("blocks", "sdpa", "one_query")

    def counting(function, path):
        def counted(*args, **kwargs):
            taken[path] += 1
            return function(*args, **kwargs)

        return counted

    for name, path in paths.items():
        monkeypatch.setattr(modeling_txl, name, counting(getattr(modeling_txl, name), path))
    monkeypatch.setattr(modeling_txl.TxlRelativeAttention, "query_block", 5)
    fast = tiny_lm(mem_len=16, attn_implementation="sdpa")
    eager = tiny_lm(mem_len=16, attn_implementation="eager")
    ids = covering_ids(97, batch=2, length=26)
    with torch.no_grad():
        memories = [None, None]
        for segment in (ids[:, :12], ids[:, 12:13], ids[:, 13:14], ids[:, 14:17], ids[:, 17:]):
            outputs = []
            for index, model in enumerate((fast, eager)):
                output = model(segment, past_key_values=memories[index], use_cache=True)
                memories[index] = output.past_key_values
                outputs.append(output.logits)
            torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=1e-5)
    layers = fast.config.n_layer
    if kernel_on:  # the 12-, 3- and 9-token segments, and the two decoded tokens
        assert taken == {"compiled": 3 * layers, "compiled_one_query": 2 * layers, **dict.fromkeys(paths_off, 0)}
    else:  # 12 and 9 tokens: blocks of 5; 3 tokens: SDPA; the decoded tokens: the one-query path
        assert taken == {"blocks": 2 * layers, "sdpa": layers, "one_query": 2 * layers, **dict.fromkeys(paths_on, 0)}


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")  # (tracing's own)
def test_a_traced_model_holds_no_compiled_operator(kernel):
    """torch.jit.trace records the portable torch path, not this machine's compiled operators: a traced model saved
    here must load where the kernel was never built."""
    model = tiny_lm(mem_len=8, attn_implementation="sdpa")

    ids = covering_ids(97, batch=2, length=12)
    with torch.no_grad():
        traced = torch.jit.trace(LogitsOnly(model), ids, check_trace=False)
        expected = model(ids, use_cache=False).logits
    assert not [node.kind() for node in traced.inlined_graph.nodes() if "transfoxl" in node.kind()]
    with torch.no_grad():
        torch.testing.assert_close(traced(ids), expected, rtol=0, atol=1e-5)


BUILD = textwrap.dedent(
    """
    import sys, torch
    from transfoxl.cpp_kernels_txl import compiled_operators
    operators = compiled_operators()
    assert operators is not None, "no kernel"
    query = torch.randn(1, 2, 3, 8)
    mask = torch.ones(3, 3, dtype=torch.bool).triu(1)[None]
    bias = torch.zeros(2, 8)
    output = operators.relative_attention_inference(query, query, query, torch.randn(2, 3, 8), bias, bias, mask, 1.0)
    print(tuple(output.shape))
    """
)


AVX2_CHECK = textwrap.dedent(
    """
    import torch
    from tests.test_fast_paths import _attention_inputs, _mask
    from transfoxl.cpp_kernels_txl import compiled_operators
    from transfoxl.kernels_txl import (
        compiled_one_query_attention,
        compiled_relative_attention,
        compiled_relative_attention_training,
        relative_attention,
    )
    from transfoxl.modeling_txl import eager_relative_attention

    assert torch.backends.cpu.get_cpu_capability() == "AVX2" and compiled_operators() is not None
    worst = 0.0
    cases = [(2, 37, 9, 32, "padding"), (1, 70, 5, 64, "causal"), (3, 1, 20, 16, "none")]
    for batch, q_len, mem_len, head_dim, kind in cases:
        inputs = _attention_inputs(batch, 3, q_len, mem_len, head_dim=head_dim, seed=q_len)
        mask = _mask(kind, batch, q_len, mem_len, max_mem_len=mem_len)
        expected, _ = eager_relative_attention(*inputs, mask, scaling=0.3, dropout=0.0)
        compiled = compiled_one_query_attention if q_len == 1 else compiled_relative_attention
        worst = max(worst, (compiled(*inputs, mask, scaling=0.3) - expected).abs().max().item())
    # training's forward, and the gradient of the query through the probabilities it writes
    leaves = [t.detach().requires_grad_() for t in _attention_inputs(2, 3, 37, 9, head_dim=32, seed=1)]
    mask = _mask("padding", 2, 37, 9, max_mem_len=9)
    grad_output = torch.randn(2, 3, 37, 32)
    for attention in (compiled_relative_attention_training, relative_attention):
        output = attention(*leaves, mask, scaling=0.3)
        gradients = torch.autograd.grad(output, leaves, grad_output)  # every input's, the score gradient's kernel
        if attention is compiled_relative_attention_training:
            compiled_output, compiled_gradients = output, gradients
    worst = max(worst, (compiled_output - output).abs().max().item())
    for mine, theirs in zip(compiled_gradients, gradients):
        worst = max(worst, (mine - theirs).abs().max().item() / max(1.0, theirs.abs().max().item()))
    # decoding's one-row product (rows of any length in four streams: the sixteen-row path is AVX-512's), relative
    for out_features, in_features in [(37, 16), (1000, 64), (130, 1030)]:
        weight, row, bias = torch.randn(out_features, in_features), torch.randn(in_features), torch.randn(out_features)
        expected = torch.nn.functional.linear(row, weight, bias)
        product = compiled_operators().row_linear(row, weight, bias)
        worst = max(worst, (product - expected).abs().max().item() / expected.abs().max().item())
    # decoding's fused steps (the model's decode_layers, each layer's decode_layer) against the general path, post-LN
    # and pre-LN
    from tests.utils import tiny_lm
    from transfoxl import modeling_txl

    model_step, layer_step, taken = modeling_txl.decode_token, modeling_txl.decode_one_row, []
    off = lambda *args: None
    for pre_lnorm in (False, True):
        model = tiny_lm(pre_lnorm=pre_lnorm)
        ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
        results = []
        for steps_on in ("model", "layer", None):
            modeling_txl.decode_token = (
                (lambda *args: taken.append(model_step(*args)) or taken[-1]) if steps_on == "model" else off
            )
            modeling_txl.decode_one_row = (
                (lambda *args: taken.append(layer_step(*args)) or taken[-1]) if steps_on == "layer" else off
            )
            with torch.no_grad():
                memory = model(ids[:, :5], use_cache=True).past_key_values
                steps = [model(ids[:, i : i + 1], past_key_values=memory, use_cache=True).logits for i in range(5, 9)]
            results.append(torch.cat(steps, dim=1))
        worst = max(worst, *((fused - results[-1]).abs().max().item() for fused in results[:2]))
    assert len(taken) == 2 * 4 * (1 + model.config.n_layer) and all(result is not None for result in taken)
    # the adaptive softmax of one row (one compiled call) against its readable path
    softmax, hidden = model.adaptive_softmax, 3 * torch.randn(1, model.config.d_model)
    with torch.no_grad():
        one_call = softmax(hidden)
        modeling_txl.one_row_log_probs = off
        worst = max(worst, (one_call - softmax(hidden)).abs().max().item())
    print(worst)
    """
)


def test_the_avx2_build_equals_eager(kernel, tmp_path):
    """On a CPU without AVX-512 the kernel is built for AVX2 (2-query tiles: 16 registers); here torch is told to
    dispatch as on such a CPU (ATEN_CPU_CAPABILITY=avx2), in a fresh process, and that build equals eager too (the
    attention's forward, decoding and gradients; the one-row product; decoding's fused steps, the model's and each
    layer's; the adaptive softmax of one row)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("this machine's own build is the AVX2 one (the other tests run it)")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "TRANSFOXL_KERNEL_CACHE": str(tmp_path / "kernels")}
    result = run_fresh_python(AVX2_CHECK, cwd=Path(__file__).parent.parent, env=env)
    assert float(result.stdout.strip().splitlines()[-1]) < 2e-5


def test_the_kernel_is_built_once_into_its_cache_and_loaded_from_there(kernel, tmp_path):
    """A first process compiles into the cache folder (moved in whole: one library, no partial file or build folder
    left); a later process loads that library, with no compiler to be found."""
    cache = tmp_path / "kernels"
    env = {**os.environ, "TRANSFOXL_KERNEL_CACHE": str(cache)}
    env.pop("CXX", None)
    first = run_fresh_python(BUILD, cwd=tmp_path, env=env)
    assert first.stdout.strip().splitlines()[-1] == "(1, 3, 2, 8)"
    assert [path.suffix for path in cache.iterdir()] == [".so"]
    library = next(cache.iterdir())
    built = library.stat().st_mtime_ns
    second = run_fresh_python(BUILD, cwd=tmp_path, env={**env, "PATH": ""})  # `c++` cannot be run now
    assert second.stdout.strip().splitlines()[-1] == "(1, 3, 2, 8)"
    assert list(cache.iterdir()) == [library] and library.stat().st_mtime_ns == built


def _kernel_warnings(caplog) -> list[str]:
    return [
        record.getMessage() for record in caplog.records if "CPU kernels (attention, dropout)" in record.getMessage()
    ]


@pytest.mark.reliability(
    "model input",
    "a C++ compiler that fails to build the CPU kernels (attention, dropout; $CXX exits 1)",
    "the build's notice, then one warning naming the cause and TRANSFOXL_CPU_KERNEL=0; the failure kept, so a later "
    "process does not compile again; no library under the kernel's name; the torch path's outputs",
)
def test_a_failed_build_warns_once_is_not_retried_and_inference_uses_the_torch_path(
    fresh_builds, monkeypatch, caplog, record_property
):
    """A compiler that fails (here: $CXX names a program that exits 1): a notice that it builds, one warning with
    the cause and the off switch, the model's outputs from the torch path, unchanged; the failure is kept beside
    where the library would be, so a later process says so at once instead of compiling again."""
    if not cpp_kernels_txl.supported_here():
        pytest.skip("the compiled kernel is for Linux on x86-64 with AVX2")
    monkeypatch.setenv("CXX", "false")  # a different compiler: a different build key, never built
    caplog.set_level(logging.WARNING)
    model, eager = tiny_lm(mem_len=8, attn_implementation="sdpa"), tiny_lm(mem_len=8, attn_implementation="eager")
    ids = covering_ids(97, batch=2, length=20)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, eager(ids).logits, rtol=0, atol=1e-5)
        model(ids)
    building, unavailable = _kernel_warnings(caplog)  # exactly these two, once each
    assert building.startswith("transfoxl: building") and "false exited with status 1" in unavailable
    assert "TRANSFOXL_CPU_KERNEL=0" in unavailable
    assert [path.suffix for path in fresh_builds.iterdir()] == [".failed"]  # no library, no build folder
    assert cpp_kernels_txl.compiled_operators() is None
    record_property("outcome", unavailable.splitlines()[0])

    caplog.clear()
    monkeypatch.setattr(cpp_kernels_txl, "_built", {})  # as a new process

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again after a kept failure")

    monkeypatch.setattr(cpp_kernels_txl.subprocess, "run", no_compiler)
    assert cpp_kernels_txl.compiled_operators() is None
    (again,) = _kernel_warnings(caplog)
    assert "failed earlier" in again and ".failed" in again


@pytest.mark.parametrize("fault", ["no compiler", "unwritable cache"])
def test_no_compiler_or_an_unwritable_cache_is_said_in_one_warning(fresh_builds, monkeypatch, caplog, fault):
    """No compiler to be found, or a cache folder that cannot be made: one warning naming that (not a build that
    never starts), nothing written, the torch path."""
    if not cpp_kernels_txl.supported_here():
        pytest.skip("the compiled kernel is for Linux on x86-64 with AVX2")
    if fault == "no compiler":
        monkeypatch.setenv("CXX", "/nonexistent/c++")
        expected = "no C++ compiler: '/nonexistent/c++' not found"
    else:
        blocker = fresh_builds.parent / "a-file"
        blocker.write_text("")
        monkeypatch.setenv("TRANSFOXL_KERNEL_CACHE", str(blocker / "kernels"))
        monkeypatch.setenv("CXX", "c++ -DUNBUILT")  # a build this process has not loaded (another key)
        expected = f"cannot write the kernel cache {blocker / 'kernels'}"
    caplog.set_level(logging.WARNING)
    assert cpp_kernels_txl.compiled_operators() is None
    (warning,) = _kernel_warnings(caplog)
    assert expected in warning and "TRANSFOXL_CPU_KERNEL=0" in warning
    if fault == "unwritable cache":
        assert "TRANSFOXL_KERNEL_CACHE" in warning
    assert not fresh_builds.exists()


def test_a_library_that_registers_no_operators_falls_back_with_a_warning(kernel, monkeypatch, caplog):
    """A library that loads but whose operators are not under the build's namespace (before torch 2.11,
    TORCH_LIBRARY stringised the namespace macro unexpanded, so every forward raised AttributeError) is refused at
    load time: one warning and the torch path, the model's outputs unchanged."""
    monkeypatch.setattr(cpp_kernels_txl, "_built", {})
    monkeypatch.setattr(cpp_kernels_txl, "_registered", lambda namespace: None)  # the library's ops are elsewhere
    caplog.set_level(logging.WARNING)
    assert cpp_kernels_txl.compiled_operators() is None
    (warning,) = _kernel_warnings(caplog)
    assert "loaded but registered no transfoxl_" in warning and "TRANSFOXL_CPU_KERNEL=0" in warning
    model = tiny_lm(mem_len=4, attn_implementation="sdpa")
    ids = covering_ids(97, batch=2, length=12)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, tiny_lm(mem_len=4, attn_implementation="eager")(ids).logits)


def test_every_operator_is_registered_under_the_builds_namespace(kernel):
    """The built library's operators are under `torch.ops.transfoxl_<key>`, all of them (what `_registered` checks
    before the kernel is used)."""
    namespace = f"transfoxl_{cpp_kernels_txl._build_key()}"
    assert cpp_kernels_txl._registered(namespace) is kernel
    for name in cpp_kernels_txl.OPERATORS:
        assert callable(getattr(kernel, name))


def test_cxx_may_hold_arguments_and_names_a_build_of_its_own(kernel, monkeypatch):
    """CXX="ccache g++" is split as a shell splits it (a compiler and its argument); the compiler and every flag
    are part of the build's name, so another compiler never loads a library built by the first."""
    monkeypatch.setenv("CXX", "env  LC_ALL=C c++")  # a command and its arguments, as ccache would be
    command = cpp_kernels_txl._compile_command(Path("k.cpp"), Path("k.so"), "ns")
    assert command[:3] == ["env", "LC_ALL=C", "c++"]
    with_arguments = cpp_kernels_txl._build_key()
    monkeypatch.delenv("CXX")
    assert cpp_kernels_txl._build_key() != with_arguments


def test_the_kernel_is_built_to_the_cxx_standard_torch_was_built_with(kernel, monkeypatch, tmp_path):
    """torch's extension builder compiles to the standard torch was built with (C++17 for torch 2.11, C++20 for
    2.13 and 2.14); a build to C++20 against torch 2.11 crashed where an operator threw a composed error message (a
    GPU image's GCC 13.3). The standard is read from torch's build configuration; the source compiles to it, and as
    C++17 where torch's headers do (before 2.14)."""
    for version, standard in (("201703", "c++17"), ("202002", "c++20"), ("", "c++17")):
        monkeypatch.setattr(torch.__config__, "show", lambda v=version: f"  - GCC 13.3\n  - C++ Version: {v}\n")
        assert cpp_kernels_txl._cxx_standard() == standard
        assert f"-std={standard}" in cpp_kernels_txl._compile_flags.__wrapped__("AVX2")
    monkeypatch.undo()
    source = tmp_path / "kernel.cpp"
    source.write_text(cpp_kernels_txl.SOURCE)
    standards = {cpp_kernels_txl._cxx_standard()}
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 14):  # (2.14's headers need C++20)
        standards.add("c++17")
    for standard in sorted(standards):
        command = cpp_kernels_txl._compile_command(source, tmp_path / "kernel.so", "syntax_only")
        command = [flag for flag in command if not flag.startswith("-std=")] + [f"-std={standard}", "-fsyntax-only"]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, (standard, completed.stderr[-2000:])


def test_turned_off_by_the_environment_nothing_is_built(fresh_builds, monkeypatch):
    monkeypatch.setenv("TRANSFOXL_CPU_KERNEL", "0")
    assert not cpp_kernels_txl.supported_here()
    assert cpp_kernels_txl.compiled_operators() is None
    assert not os.path.exists(fresh_builds)


def test_compiled_training_attention_backpropagates_an_expanded_gradient(kernel):
    """The gradient of a sum arrives expanded (stride 0 in every dimension); the score gradient's kernel reads rows
    with a contiguous last dimension, so backward gives it a contiguous copy: the gradients equal the torch path's."""
    leaves = [tensor.detach().requires_grad_() for tensor in _attention_inputs(2, 3, 21, 7, head_dim=16)]
    mask = _mask("causal", 2, 21, 7, max_mem_len=7)
    grads = []
    for attention in (compiled_relative_attention_training, relative_attention):
        output = attention(*leaves, mask, scaling=0.25)
        grads.append(torch.autograd.grad(output.sum(), leaves))
    for mine, theirs in zip(*grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
