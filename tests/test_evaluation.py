"""`transfoxl.evaluation.evaluate_stream`: the memory gives exactly the long-context result theory predicts, every
target is scored once, ranks add up, and the call leaves the model as it found it; bad input to `evaluate_stream` and
`evaluation_settings`, each case a row of docs/reliability-table.md (`@pytest.mark.reliability`)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.utils import VOCAB, case, expect_error, tiny_lm
from transfoxl import TxlForCausalLM
from transfoxl.data import StreamBatcher
from transfoxl.evaluation import (
    StreamEvaluation,
    evaluate_memory_lengths,
    evaluate_stream,
    evaluation_settings,
    is_character_level,
    memory_lengths_plot,
    memory_lengths_table,
)
from transfoxl.presets import config_from_preset
from transfoxl.tokenization.tokenization_txl import train_byte_level_bpe, train_char_level, train_word_level

N_TOKENS = 65


pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py


def random_stream(vocab_size: int, n_tokens: int = N_TOKENS, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(seed))


def plain_lm() -> TxlForCausalLM:
    """The "tiny" preset: one softmax over the vocabulary (tiny_lm has an adaptive softmax of three clusters)."""
    torch.manual_seed(0)
    return TxlForCausalLM(config_from_preset("tiny", 50)).eval()


MODELS = {"adaptive_softmax": tiny_lm, "plain_softmax": plain_lm}


@pytest.mark.parametrize("make_model", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("tgt_len", [1, 7, 16])
def test_full_memory_equals_one_long_forward(make_model, tgt_len: int) -> None:
    # same_length False, clamp_len -1, dropout 0 (both models): a query at stream position p attends to positions
    # 0..p through the memory exactly as in one causal pass over the stream, at the same relative distances.
    model = make_model()
    assert (model.config.same_length, model.config.clamp_len, model.config.dropout) == (False, -1, 0.0)
    stream = random_stream(model.config.vocab_size)
    one_call = evaluate_stream(model, stream, tgt_len=N_TOKENS - 1, mem_len=0)
    with torch.no_grad():
        forward = model(stream[None, :-1], shift_labels=stream[None, 1:], use_cache=False)
    assert one_call.nll_sum == pytest.approx(forward.losses.sum().item(), rel=1e-6)

    for mem_len in (N_TOKENS, 4 * N_TOKENS):
        segments = evaluate_stream(model, stream, tgt_len=tgt_len, mem_len=mem_len)
        assert segments.num_targets == one_call.num_targets == N_TOKENS - 1
        assert segments.loss == pytest.approx(one_call.loss, abs=1e-5)


@pytest.mark.parametrize("make_model", MODELS.values(), ids=MODELS.keys())
def test_short_memory_differs_and_no_memory_is_each_segment_alone(make_model) -> None:
    model = make_model()
    stream = random_stream(model.config.vocab_size)
    full = evaluate_stream(model, stream, tgt_len=8, mem_len=N_TOKENS)
    short = evaluate_stream(model, stream, tgt_len=8, mem_len=4)  # later segments lose all but 4 positions of context
    assert abs(short.loss - full.loss) > 1e-5

    none = evaluate_stream(model, stream, tgt_len=8, mem_len=0)
    independent = 0.0
    with torch.no_grad():
        for inputs, targets in StreamBatcher(stream, 1, 8):
            independent += model(inputs, shift_labels=targets, use_cache=False).losses.sum().item()
    assert none.nll_sum == pytest.approx(independent, rel=1e-6)
    assert abs(none.loss - short.loss) > 1e-5


def test_no_memory_ignores_a_zero_memory_init() -> None:
    # memory_init="zeros" (v4's) starts a stream with mem_len zero vectors; mem_len=0 must still mean no memory at all,
    # as it did in v4, not config.mem_len zeros in front of every segment.
    zeros, empty = tiny_lm(memory_init="zeros"), tiny_lm(memory_init="empty")
    stream = random_stream(zeros.config.vocab_size)
    with torch.no_grad():
        inputs, targets = stream[None, :8], stream[None, 1:9]
        attended = zeros(inputs, shift_labels=targets, use_cache=False).losses.sum().item()
        alone = empty(inputs, shift_labels=targets, use_cache=False).losses.sum().item()
    assert attended != pytest.approx(alone, rel=1e-6)  # the zeros do change a forward without memory
    result = evaluate_stream(zeros, stream, tgt_len=8, mem_len=0)
    assert result.nll_sum == pytest.approx(evaluate_stream(empty, stream, tgt_len=8, mem_len=0).nll_sum, rel=1e-6)
    assert zeros.config.memory_init == "zeros"


def test_every_target_scored_once(lm: TxlForCausalLM) -> None:
    stream = random_stream(lm.config.vocab_size)
    assert evaluate_stream(lm, stream, tgt_len=8, mem_len=8).num_targets == N_TOKENS - 1
    for batch_size in (2, 3):
        column_len = N_TOKENS // batch_size
        result = evaluate_stream(lm, stream, tgt_len=8, mem_len=8, batch_size=batch_size)
        assert result.num_targets == batch_size * (column_len - 1)


def test_ranks_merge_to_the_single_process_result() -> None:
    # float64, so that the comparison checks which targets each rank scores, not float32 rounding of batched matmuls.
    model = tiny_lm().double()
    stream = random_stream(model.config.vocab_size)
    single = evaluate_stream(model, stream, tgt_len=8, mem_len=8, batch_size=4)
    ranks = [evaluate_stream(model, stream, tgt_len=8, mem_len=8, batch_size=4, rank=r, world_size=2) for r in (0, 1)]
    assert ranks[0].num_targets == ranks[1].num_targets == single.num_targets // 2
    assert ranks[0].nll_sum != pytest.approx(ranks[1].nll_sum, rel=1e-6)  # different columns
    merged = ranks[0].merge(ranks[1])
    assert merged.num_targets == single.num_targets
    assert merged.nll_sum == pytest.approx(single.nll_sum, rel=1e-9)
    assert merged.loss == pytest.approx(single.loss, rel=1e-9)


def position_sensitive_lm(**overrides):
    """`tiny_lm` whose attention weights are large enough for clamp_len to move the loss clearly (a tiny random
    model's attention barely changes its outputs)."""
    model = tiny_lm(**overrides)
    with torch.no_grad():
        for layer in model.transformer.layers:
            for projection in (layer.attention.pos_proj, layer.attention.qkv_proj, layer.attention.o_proj):
                projection.weight.mul_(10)
    return model


def test_overrides_apply_during_the_call_and_are_restored() -> None:
    model = position_sensitive_lm()
    stream = random_stream(model.config.vocab_size)
    seen = []
    model.register_forward_pre_hook(
        lambda module, args: seen.append((module.config.clamp_len, module.config.same_length))
    )

    overridden = evaluate_stream(model, stream, tgt_len=8, mem_len=16, clamp_len=3, same_length=True)
    assert set(seen) == {(3, True)}
    assert (model.config.clamp_len, model.config.same_length) == (-1, False)
    assert (overridden.clamp_len, overridden.same_length) == (3, True)  # the settings used are recorded
    # The same numbers as a model configured that way, and other numbers than without the overrides.
    configured = position_sensitive_lm(clamp_len=3, same_length=True)
    assert overridden.nll_sum == pytest.approx(
        evaluate_stream(configured, stream, tgt_len=8, mem_len=16).nll_sum, rel=1e-6
    )
    plain = evaluate_stream(model, stream, tgt_len=8, mem_len=16)
    assert (plain.clamp_len, plain.same_length) == (-1, False)
    assert plain.nll_sum != pytest.approx(overridden.nll_sum, rel=1e-6)
    only_clamp = evaluate_stream(model, stream, tgt_len=8, mem_len=16, clamp_len=3)  # each override counts alone
    assert (only_clamp.clamp_len, only_clamp.same_length) == (3, False)
    assert only_clamp.nll_sum != pytest.approx(plain.nll_sum, rel=1e-6)
    assert only_clamp.nll_sum != pytest.approx(overridden.nll_sum, rel=1e-6)


def test_settings_and_training_flag_restored_when_the_call_raises() -> None:
    model = tiny_lm(memory_init="zeros")
    model.train()
    seen = []

    def fail_in_second_segment(module: TxlForCausalLM, args: tuple) -> None:
        seen.append((module.training, module.config.clamp_len, module.config.same_length, module.config.memory_init))
        if len(seen) == 2:
            raise RuntimeError("out of memory, say")

    model.register_forward_pre_hook(fail_in_second_segment)
    with pytest.raises(RuntimeError, match="out of memory"):
        evaluate_stream(model, random_stream(97), tgt_len=8, mem_len=0, clamp_len=5, same_length=True)
    assert seen[0] == (False, 5, True, "empty")  # evaluated in eval mode, with the overrides (mem_len 0: no zeros)
    assert model.training
    assert (model.config.clamp_len, model.config.same_length, model.config.memory_init) == (-1, False, "zeros")

    with evaluation_settings(model, clamp_len=7, same_length=True, memory_init="empty"):
        assert (model.config.clamp_len, model.config.same_length, model.config.memory_init) == (7, True, "empty")
    assert (model.config.clamp_len, model.config.same_length, model.config.memory_init) == (-1, False, "zeros")
    # A refused value leaves none of the others set (they stayed on the config, and every later evaluation used them).
    with pytest.raises(ValueError, match="same_length must be a bool"):
        evaluate_stream(model, random_stream(97), tgt_len=8, mem_len=16, clamp_len=2, same_length="yes")
    with pytest.raises(ValueError, match="memory_init must be one of"):
        evaluation_settings(model, clamp_len=5, same_length=True, memory_init="bad").__enter__()
    assert (model.config.clamp_len, model.config.same_length, model.config.memory_init) == (-1, False, "zeros")


def test_training_flag_restored(lm: TxlForCausalLM) -> None:
    modes = []
    lm.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    stream = random_stream(lm.config.vocab_size)
    lm.train()
    evaluate_stream(lm, stream, tgt_len=16, mem_len=16)
    assert lm.training and modes and not any(modes)
    lm.eval()
    evaluate_stream(lm, stream, tgt_len=16, mem_len=16)
    assert not lm.training


def test_max_segments_stops_early(lm: TxlForCausalLM) -> None:
    stream = random_stream(lm.config.vocab_size)
    calls = []
    lm.register_forward_pre_hook(lambda module, args: calls.append(1))
    early = evaluate_stream(lm, stream, tgt_len=8, mem_len=8, max_segments=2)
    assert len(calls) == 2 and early.num_targets == 2 * 8
    # The first two segments are the whole evaluation of the first 2 * 8 + 1 tokens.
    prefix = evaluate_stream(lm, stream[: 2 * 8 + 1], tgt_len=8, mem_len=8)
    assert early.nll_sum == pytest.approx(prefix.nll_sum, rel=1e-6)
    assert evaluate_stream(lm, stream, tgt_len=8, mem_len=8, max_segments=100).num_targets == N_TOKENS - 1
    with pytest.raises(ValueError, match="max_segments"):
        evaluate_stream(lm, stream, tgt_len=8, mem_len=8, max_segments=0)


def test_a_stream_batcher_is_read_from_its_start_and_left_where_it_was(lm: TxlForCausalLM) -> None:
    stream = random_stream(lm.config.vocab_size)
    batcher = StreamBatcher(stream, 2, 8)
    batcher.next_batch()
    batcher.next_batch()
    state = batcher.state_dict()
    from_batcher = evaluate_stream(lm, batcher, tgt_len=8, mem_len=16)
    assert batcher.state_dict() == state
    from_stream = evaluate_stream(lm, stream, tgt_len=8, mem_len=16, batch_size=2)
    assert from_batcher.num_targets == from_stream.num_targets == 2 * (N_TOKENS // 2 - 1)
    assert from_batcher.nll_sum == pytest.approx(from_stream.nll_sum, rel=1e-6)
    with pytest.raises(ValueError, match="tgt_len 8"):
        evaluate_stream(lm, batcher, tgt_len=4, mem_len=16)
    with pytest.raises(ValueError, match="The StreamBatcher has batch_size 2, evaluate_stream got 4"):
        evaluate_stream(lm, batcher, tgt_len=8, mem_len=16, batch_size=4)  # its layout is not silently kept
    with pytest.raises(ValueError, match="The StreamBatcher has world_size 1, evaluate_stream got 2"):
        evaluate_stream(lm, batcher, tgt_len=8, mem_len=16, world_size=2)
    assert evaluate_stream(lm, batcher, tgt_len=8, mem_len=16, batch_size=2).nll_sum == from_batcher.nll_sum


@pytest.mark.parametrize("mem_len", [-1, 2.5, True, None])
def test_bad_memory_lengths_refused(lm: TxlForCausalLM, mem_len: object) -> None:
    with pytest.raises(ValueError, match="mem_len must be an integer >= 0"):
        evaluate_stream(lm, random_stream(97), tgt_len=8, mem_len=mem_len)


def test_too_short_stream_refused(lm: TxlForCausalLM) -> None:
    with pytest.raises(ValueError, match="too short"):
        evaluate_stream(lm, random_stream(97, n_tokens=8), tgt_len=8, mem_len=0)
    with pytest.raises(ValueError, match="too short"):
        evaluate_stream(lm, random_stream(97, n_tokens=17), tgt_len=8, mem_len=0, batch_size=2)
    assert evaluate_stream(lm, random_stream(97, n_tokens=9), tgt_len=8, mem_len=0).num_targets == 8


def test_stream_evaluation_figures() -> None:
    result = StreamEvaluation(nll_sum=30.0, num_targets=12, tgt_len=8, mem_len=4, clamp_len=-1, same_length=False)
    assert result.loss == 2.5
    assert result.perplexity == pytest.approx(math.exp(2.5))
    assert result.bits_per_token == pytest.approx(2.5 / math.log(2))
    other = StreamEvaluation(nll_sum=10.0, num_targets=8, tgt_len=8, mem_len=4, clamp_len=-1, same_length=False)
    assert result.merge(other).loss == 2.0 and result.merge(other).num_targets == 20
    assert result.to_dict() == {
        "nll_sum": 30.0,
        "num_targets": 12,
        "tgt_len": 8,
        "mem_len": 4,
        "clamp_len": -1,
        "same_length": False,
        "loss": 2.5,
        "perplexity": pytest.approx(math.exp(2.5)),
        "bits_per_token": pytest.approx(2.5 / math.log(2)),
    }
    empty = StreamEvaluation(nll_sum=0.0, num_targets=0, tgt_len=8, mem_len=4, clamp_len=-1, same_length=False)
    assert math.isnan(empty.loss) and math.isnan(empty.perplexity)  # no targets: no figure, not an infinite one
    longer = StreamEvaluation(nll_sum=10.0, num_targets=8, tgt_len=8, mem_len=16, clamp_len=-1, same_length=False)
    with pytest.raises(ValueError, match="other settings: mem_len 4 and 16"):
        result.merge(longer)
    assert StreamEvaluation(8000.0, 10, 8, 4, -1, False).perplexity == math.inf  # exp(800) overflows a float


def test_is_character_level() -> None:
    text = "the cat sat on the mat\nthe dog sat\n"
    assert is_character_level(train_char_level([text]))
    assert not is_character_level(train_word_level(text.splitlines()))
    # A byte-level BPE without merges has one symbol per token too, but its tokens are bytes: "été" is 5 of them.
    assert not is_character_level(train_byte_level_bpe(["été, straße, 日本\n" * 20], vocab_size=258))


# ---------------------------------------------------------------------------------------------------------------------
# Bad input to evaluate_stream / evaluation_settings (rows of the reliability table)

STREAM = random_stream(VOCAB, n_tokens=200)

EVALUATION_CASES = [
    case(
        "evaluation",
        "stream holding token id 150 (vocab_size 97)",
        "ValueError before the first segment, naming the id and the vocabulary",
        ValueError,
        r"The stream holds token id 150, outside the model's vocabulary \[0, 97\)",
        lambda lm: evaluate_stream(lm, torch.cat([STREAM, torch.tensor([150])]), tgt_len=8, mem_len=4),
        "id-out-of-vocab",
    ),
    case(
        "evaluation",
        "stream=None",
        "TypeError asking for token ids",
        TypeError,
        r"`stream` must be token ids .* got NoneType",
        lambda lm: evaluate_stream(lm, None, tgt_len=8, mem_len=4),
        "none",
    ),
    case(
        "evaluation",
        "empty stream",
        "ValueError: empty",
        ValueError,
        "The stream is empty",
        lambda lm: evaluate_stream(lm, STREAM[:0], tgt_len=8, mem_len=4),
        "empty",
    ),
    case(
        "evaluation",
        "stream of 5 tokens for tgt_len 8",
        "ValueError: too short, with the numbers",
        ValueError,
        r"The stream of 5 tokens is too short for batch_size 1 x \(tgt_len 8 \+ 1\) = 9 tokens",
        lambda lm: evaluate_stream(lm, STREAM[:5], tgt_len=8, mem_len=4),
        "too-short",
    ),
    case(
        "evaluation",
        "2-D stream",
        "ValueError: 1-D token ids",
        ValueError,
        r"The stream must be 1-D token ids, got shape \(2, 100\)",
        lambda lm: evaluate_stream(lm, STREAM.view(2, 100), tgt_len=8, mem_len=4),
        "2d",
    ),
    case(
        "evaluation",
        "float stream",
        "ValueError naming the dtype",
        ValueError,
        "The stream must hold integer token ids, got dtype torch.float32",
        lambda lm: evaluate_stream(lm, STREAM.float(), tgt_len=8, mem_len=4),
        "float",
    ),
    case(
        "evaluation",
        "tgt_len=0",
        "ValueError naming tgt_len",
        ValueError,
        "tgt_len must be an integer >= 1, got 0",
        lambda lm: evaluate_stream(lm, STREAM, tgt_len=0, mem_len=4),
        "tgt-len",
    ),
    case(
        "evaluation",
        "mem_len=-1",
        "ValueError naming mem_len",
        ValueError,
        "mem_len must be an integer >= 0, got -1",
        lambda lm: evaluate_stream(lm, STREAM, tgt_len=8, mem_len=-1),
        "mem-len",
    ),
    case(
        "evaluation",
        "max_segments=2.5",
        "ValueError: an integer (TypeError deep in range() before)",
        ValueError,
        "max_segments must be an integer >= 1 or None, got 2.5",
        lambda lm: evaluate_stream(lm, STREAM, tgt_len=8, mem_len=4, max_segments=2.5),
        "max-segments",
    ),
    case(
        "evaluation",
        "evaluation_settings(memory_init='random')",
        "ValueError naming the choices (kept before)",
        ValueError,
        r"memory_init must be one of \('empty', 'zeros'\), got 'random'",
        lambda lm: evaluation_settings(lm, memory_init="random").__enter__(),
        "memory-init",
    ),
    case(
        "evaluation",
        "evaluation_settings(same_length='no')",
        "ValueError (bool('no') was True before)",
        ValueError,
        "same_length must be a bool, got 'no'",
        lambda lm: evaluation_settings(lm, same_length="no").__enter__(),
        "same-length",
    ),
    case(
        "evaluation",
        "evaluation_settings(clamp_len='x')",
        "ValueError naming clamp_len",
        ValueError,
        r"clamp_len must be an integer \(<= 0: no clamping\), got 'x'",
        lambda lm: evaluation_settings(lm, clamp_len="x").__enter__(),
        "clamp-len",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), EVALUATION_CASES)
def test_evaluation_refuses_bad_input(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))


@pytest.mark.reliability(
    "evaluation",
    "mem_len 16 on a model trained with mem_len 0",
    "accepted: the memory holds hidden states, not parameters, so any length works",
)
def test_a_memory_for_a_model_trained_without_one_is_accepted(record_property) -> None:
    model = tiny_lm(mem_len=0)
    result = evaluate_stream(model, STREAM, tgt_len=8, mem_len=16)
    assert result.mem_len == 16 and result.num_targets == 199 and torch.isfinite(torch.tensor(result.loss))
    assert model.config.mem_len == 0  # the model is unchanged
    record_property("outcome", f"accepted: {result.num_targets} targets, loss {result.loss:.3f} nats")


def test_memory_lengths_give_evaluate_streams_row_for_each_length_a_table_and_a_plot(lm: TxlForCausalLM) -> None:
    stream = torch.randint(0, VOCAB, (90,), generator=torch.Generator().manual_seed(3))
    rows = evaluate_memory_lengths(lm, stream, [0, 8, 24], tgt_len=6, clamp_len=-1, same_length=False)
    for row, mem_len in zip(rows, [0, 8, 24], strict=True):
        alone = evaluate_stream(lm, stream, tgt_len=6, mem_len=mem_len, clamp_len=-1, same_length=False)
        assert row["mem_len"] == mem_len and row["num_targets"] == alone.num_targets == 89
        assert math.isclose(row["loss"], alone.loss, rel_tol=1e-9) and row["tokens_per_second"] > 0
    table = memory_lengths_table(rows, "bpc").splitlines()
    assert table[0] == "| memory length | targets | loss (nats) | perplexity | bpc |" and len(table) == 2 + 3
    assert table[3].startswith("| 8 | 89 | ")
    assert memory_lengths_plot(rows, "bpc", "title").startswith(b"\x89PNG")
