"""Property-based tests (hypothesis) over small random configs and shapes.

Configs: 1-3 layers, 1-3 heads of width 2-8, d_model 8-16, a plain or a projected softmax or an adaptive one (div_val
1 or 2), pre- or post-LN, same_length, clamp_len, shared or per-layer u and v, tied or untied output layers, eager or
SDPA attention. Shapes: batch 1-3, segments of 1-6 tokens, 1-3 segments, mem_len 0-8. The properties:

- forward and backward never crash, and the loss and every gradient are finite (dropout on or off);
- the recurrence: with a memory long enough to hold everything and same_length off, feeding a sequence segment by
  segment gives the logits of one pass over all of it;
- the memory holds exactly the last `min(total, mem_len)` inputs of each layer;
- eager attention equals SDPA, with and without a memory.

Examples are drawn deterministically (`derandomize=True`), so a CI run is reproducible.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transfoxl import TxlConfig, TxlForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py

VOCAB = 50
ATOL = 1e-5  # float32
SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw: st.DrawFn, *, dropout: bool = False, same_length: bool | None = None) -> dict:
    """Keyword arguments of a small `TxlConfig` (mem_len and the attention implementation are chosen apart)."""
    d_model = draw(st.sampled_from([8, 12, 16]))
    softmax = draw(st.sampled_from(["plain", "projected", "adaptive", "adaptive_div2"]))
    cutoffs = [] if softmax in ("plain", "projected") else [10, 30]
    return dict(
        vocab_size=VOCAB,
        cutoffs=cutoffs,
        div_val=2 if softmax == "adaptive_div2" else 1,
        d_model=d_model,
        d_embed=d_model // 2 if softmax == "projected" else d_model,
        n_head=draw(st.integers(1, 3)),
        d_head=draw(st.sampled_from([2, 4, 8])),
        d_inner=draw(st.sampled_from([8, 16])),
        n_layer=draw(st.integers(1, 3)),
        pre_lnorm=draw(st.booleans()),
        same_length=draw(st.booleans()) if same_length is None else same_length,
        clamp_len=draw(st.sampled_from([-1, 0, 1, 3])),
        untie_r=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()),
        dropout=draw(st.sampled_from([0.0, 0.1])) if dropout else 0.0,
        dropatt=draw(st.sampled_from([0.0, 0.1])) if dropout else 0.0,
    )


def build(config: dict, *, mem_len: int, attention: str, seed: int = 0) -> TxlForCausalLM:
    torch.manual_seed(seed)
    model = TxlForCausalLM(TxlConfig(**config, mem_len=mem_len))
    with torch.no_grad():  # no zero biases: every parameter takes part in the comparisons
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.config._attn_implementation = attention
    return model


def token_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def split(length: int, pieces: int) -> list[int]:
    """`length` cut into at most `pieces` segment lengths >= 1, as even as possible."""
    pieces = min(pieces, length)
    return [length // pieces + (index < length % pieces) for index in range(pieces)]


@pytest.mark.reliability(
    "properties",
    "forward and backward over random small configs, shapes, memories, dropout and attention",
    "never a crash; loss and every gradient finite",
)
def test_forward_and_backward_never_crash_and_stay_finite(record_property) -> None:
    seen: list[str] = []

    @settings(max_examples=100, **SETTINGS)
    @given(
        config=configs(dropout=True),
        attention=st.sampled_from(["eager", "sdpa"]),
        batch=st.integers(1, 3),
        lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
        mem_len=st.integers(0, 8),
        seed=st.integers(0, 2**16),
    )
    def check(config, attention, batch, lengths, mem_len, seed) -> None:
        model = build(config, mem_len=mem_len, attention=attention, seed=seed).train()
        stream = token_ids(batch, sum(lengths) + 1, seed)
        memory, start = None, 0
        for length in lengths:
            inputs, targets = stream[:, start : start + length], stream[:, start + 1 : start + length + 1]
            output = model(inputs, shift_labels=targets.contiguous(), past_key_values=memory, use_cache=True)
            assert torch.isfinite(output.loss), output.loss
            model.zero_grad()
            output.loss.backward()
            for name, parameter in model.named_parameters():
                assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name
            memory, start = output.past_key_values, start + length
            assert memory.get_seq_length() == min(start, mem_len)
        seen.append(attention)

    check()
    record_property(
        "outcome",
        f"{len(seen)} examples ({seen.count('eager')} eager, {seen.count('sdpa')} sdpa), segments of 1-6 tokens, "
        "mem_len 0-8: no crash, loss and gradients finite",
    )


@pytest.mark.reliability(
    "properties",
    "segment by segment with a memory holding everything (same_length off) vs one pass",
    f"the same logits (|difference| <= {ATOL}) and the same layer inputs in the memory",
)
def test_segments_with_a_full_memory_equal_one_pass(record_property) -> None:
    largest = [0.0]

    @settings(max_examples=60, **SETTINGS)
    @given(
        config=configs(same_length=False),
        attention=st.sampled_from(["eager", "sdpa"]),
        batch=st.integers(1, 3),
        total=st.integers(1, 12),
        pieces=st.integers(1, 3),
        with_grad=st.booleans(),  # without: the memory also keeps its projected keys and values (inference path)
        seed=st.integers(0, 2**16),
    )
    def check(config, attention, batch, total, pieces, with_grad, seed) -> None:
        model = build(config, mem_len=total, attention=attention, seed=seed).eval()
        stream = token_ids(batch, total, seed)
        with torch.set_grad_enabled(with_grad):
            whole = model(stream, use_cache=False, output_hidden_states=True)
            memory, logits, start = None, [], 0
            for length in split(total, pieces):
                output = model(stream[:, start : start + length], past_key_values=memory, use_cache=True)
                memory, start = output.past_key_values, start + length
                logits.append(output.logits)
        difference = (torch.cat(logits, dim=1) - whole.logits).abs().max().item()
        largest[0] = max(largest[0], difference)
        assert difference <= ATOL, difference
        assert memory.get_seq_length() == total
        for layer, layer_input in zip(memory.layers, whole.hidden_states):  # hidden_states: each layer's input
            torch.testing.assert_close(layer.hidden, layer_input, rtol=0, atol=ATOL)

    check()
    record_property("outcome", f"60 examples: largest |logit difference| {largest[0]:.1e}")


@pytest.mark.reliability(
    "properties",
    "a bounded memory (mem_len 0-8) over 1-3 segments",
    "it holds exactly the last min(total, mem_len) inputs of each layer",
)
def test_a_bounded_memory_holds_exactly_the_last_mem_len_layer_inputs(record_property) -> None:
    @settings(max_examples=60, **SETTINGS)
    @given(
        config=configs(),
        attention=st.sampled_from(["eager", "sdpa"]),
        batch=st.integers(1, 3),
        lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
        mem_len=st.integers(0, 8),
        with_grad=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def check(config, attention, batch, lengths, mem_len, with_grad, seed) -> None:
        model = build(config, mem_len=mem_len, attention=attention, seed=seed).eval()
        stream = token_ids(batch, sum(lengths), seed)
        memory, layer_inputs, start = None, [], 0
        with torch.set_grad_enabled(with_grad):
            for length in lengths:
                output = model(
                    stream[:, start : start + length],
                    past_key_values=memory,
                    use_cache=True,
                    output_hidden_states=True,
                )
                memory, start = output.past_key_values, start + length
                layer_inputs.append(output.hidden_states[:-1])  # the last entry is the stack's output
        kept = min(start, mem_len)
        assert memory.get_seq_length() == kept
        for index, layer in enumerate(memory.layers):
            if kept == 0:
                assert layer.hidden is None
                continue
            seen = torch.cat([inputs[index] for inputs in layer_inputs], dim=1)  # [B, total, E]
            assert not layer.hidden.requires_grad
            torch.testing.assert_close(layer.hidden, seen[:, start - kept :], rtol=0, atol=0)

    check()
    record_property("outcome", "60 examples: memory length min(total, mem_len), contents equal the last layer inputs")


@pytest.mark.reliability(
    "properties",
    "eager vs SDPA attention over random configs, memories, same_length and clamp_len",
    f"the same logits (|difference| <= {ATOL})",
)
def test_eager_attention_equals_sdpa(record_property) -> None:
    largest = [0.0]

    @settings(max_examples=60, **SETTINGS)
    @given(
        config=configs(),
        batch=st.integers(1, 3),
        lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
        mem_len=st.integers(0, 8),
        seed=st.integers(0, 2**16),
    )
    def check(config, batch, lengths, mem_len, seed) -> None:
        stream = token_ids(batch, sum(lengths), seed)
        results = []
        for attention in ("eager", "sdpa"):
            model = build(config, mem_len=mem_len, attention=attention, seed=seed).eval()
            memory, logits, start = None, [], 0
            with torch.no_grad():
                for length in lengths:
                    output = model(stream[:, start : start + length], past_key_values=memory, use_cache=True)
                    memory, start = output.past_key_values, start + length
                    logits.append(output.logits)
            results.append(torch.cat(logits, dim=1))
        difference = (results[0] - results[1]).abs().max().item()
        largest[0] = max(largest[0], difference)
        assert difference <= ATOL, difference

    check()
    record_property("outcome", f"60 examples: largest |logit difference| {largest[0]:.1e}")
