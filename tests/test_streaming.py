"""TxlStream: feeding any length in segments, generating from everything seen, continuing, bounded state; bad
input to TxlStream, each case a row of docs/reliability-table.md (`@pytest.mark.reliability`)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from tests.test_generation import GREEDY, greedy_without_cache
from tests.utils import case, expect_error, ids, tiny_lm
from transfoxl import TxlStream


def test_feed_generate_feed_generate_equals_recomputing_the_whole_stream():
    model = tiny_lm(mem_len=128)
    text, more = ids(1, 23, seed=1), ids(1, 5, seed=2)
    stream = TxlStream(model, segment_len=6)
    stream.feed(text)
    first = stream.generate(max_new_tokens=7, **GREEDY)
    assert torch.equal(first, greedy_without_cache(model, text, 7)[:, 23:])

    stream.feed(more)
    second = stream.generate(max_new_tokens=6, **GREEDY)
    history = torch.cat([text, first, more], dim=1)
    assert torch.equal(second, greedy_without_cache(model, history, 6)[:, history.shape[1] :])
    assert stream.tokens_seen == 23 + 7 + 5 + 6


def test_state_stays_bounded_and_ids_can_come_from_an_iterator():
    model = tiny_lm(mem_len=10)
    text = ids(1, 50)
    by_iterator = TxlStream(model, segment_len=4).feed(int(token) for token in text[0])  # read lazily
    by_tensor = TxlStream(model, segment_len=4).feed(text)
    assert by_iterator.pending.shape[1] <= 4 and by_iterator.memory.get_seq_length() == 10
    assert torch.equal(by_iterator.pending, by_tensor.pending)
    torch.testing.assert_close(by_iterator.memory.get_memory(1), by_tensor.memory.get_memory(1), rtol=0, atol=0)
    by_iterator.generate(max_new_tokens=30, **GREEDY)
    assert by_iterator.memory.get_seq_length() == 10 and by_iterator.pending.shape[1] == 1


def test_beam_search_continues_with_the_best_sequence_of_each_stream():
    model = tiny_lm(mem_len=128)
    text = ids(2, 9, seed=3)
    stream = TxlStream(model, batch_size=2, segment_len=4).feed(text)
    best = stream.generate(max_new_tokens=5, num_beams=3, **GREEDY)
    expected = model.generate(text, max_new_tokens=5, num_beams=3, use_cache=False, **GREEDY)[:, 9:]
    assert torch.equal(best, expected)
    assert stream.memory.batch_size == 2  # the stream's own memory, not the beams
    follow = stream.generate(max_new_tokens=3, **GREEDY)
    assert torch.equal(follow, greedy_without_cache(model, torch.cat([text, best], 1), 3)[:, 14:])


def test_beam_search_set_in_the_generation_config_also_keeps_the_stream_memory():
    model = tiny_lm(mem_len=128)
    model.generation_config.num_beams = 3
    stream = TxlStream(model, segment_len=4).feed(ids(1, 9, seed=3))
    stream.generate(max_new_tokens=4, **GREEDY)
    assert stream.memory.batch_size == 1
    stream.feed(ids(1, 3, seed=4))


def test_beam_search_in_a_generation_config_passed_to_the_call_keeps_the_stream_memory():
    from transformers import GenerationConfig

    model = tiny_lm(mem_len=128)
    text = ids(1, 9, seed=3)
    stream = TxlStream(model, segment_len=4).feed(text)
    settings = GenerationConfig(num_beams=3, max_new_tokens=4, **GREEDY)
    best = stream.generate(generation_config=settings)
    assert stream.memory.batch_size == 1  # the stream's own memory, not the beams
    assert torch.equal(best, model.generate(text, generation_config=settings, use_cache=False)[:, 9:])
    follow = stream.generate(max_new_tokens=3, **GREEDY)
    assert torch.equal(follow, greedy_without_cache(model, torch.cat([text, best], 1), 3)[:, 13:])


def test_tokens_fed_are_all_run_even_when_they_repeat_the_stream():
    """Pending tokens that begin by repeating everything the memory has seen are still new tokens of the stream:
    generate()'s continuation idiom (which would skip such a repeat) is off for the stream's own calls."""
    model = tiny_lm(mem_len=128)
    with torch.no_grad():
        model.adaptive_softmax.output_layers[0].bias[11] += 100.0  # greedy decoding repeats token 11
    stream = TxlStream(model, segment_len=64).feed([11])
    assert stream.generate(max_new_tokens=3, **GREEDY).tolist() == [[11, 11, 11]]  # ran 11 11 11; one pending
    stream.feed([11, 11, 7, 8])  # pending 11 11 11 7 8: begins with exactly what the memory holds
    stream.generate(max_new_tokens=2, **GREEDY)
    whole = torch.tensor([[11, 11, 11, 11, 11, 11, 7, 8, 11]])  # everything run through the model
    assert stream.memory.seen_tokens == whole.shape[1] == stream.tokens_seen - 1  # the last token is pending
    with torch.no_grad():
        expected = model(whole).past_key_values
    torch.testing.assert_close(stream.memory.get_memory(1), expected.get_memory(1), rtol=0, atol=1e-5)


class _Recorder(BaseStreamer):
    """What a streamer is told: each put's ids, and whether it was ended."""

    def __init__(self) -> None:
        self.puts, self.ended = [], False

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended = True


def test_a_streamer_is_told_the_calls_prompt_then_the_new_tokens():
    """As generate() tells a streamer its prompt and then each new token: the stream's generate() passed it the
    pending tokens instead (what earlier feeds left unrun, and the last token of an earlier generate()), so a
    TextStreamer printed a piece of earlier text that depended on segment_len."""
    model = tiny_lm(mem_len=128)
    text, prompt = ids(1, 11, seed=1), ids(1, 6, seed=2)
    stream = TxlStream(model, segment_len=4).feed(text)
    first, told = stream.generate(max_new_tokens=3, streamer=(recorder := _Recorder()), **GREEDY), recorder
    assert told.puts == [[], *([token] for token in first[0].tolist())] and told.ended  # no prompt: an empty one
    second = stream.generate(prompt, max_new_tokens=4, streamer=(recorder := _Recorder()), **GREEDY)
    assert recorder.puts == [prompt[0].tolist(), *([token] for token in second[0].tolist())] and recorder.ended
    iterator = TxlStream(model, segment_len=4).feed(text)  # a prompt from an iterator of ids, fed lazily
    iterator.generate(max_new_tokens=3, **GREEDY)
    third = iterator.generate(
        (int(token) for token in prompt[0]), max_new_tokens=2, streamer=(recorder := _Recorder())
    )
    assert recorder.puts[0] == prompt[0].tolist() and len(recorder.puts) == 3 and torch.equal(third, second[:, :2])


def test_the_stream_leaves_the_model_in_the_mode_it_found():
    model = tiny_lm(mem_len=16, dropout=0.1).train()
    stream = TxlStream(model, segment_len=4).feed(ids(1, 9))
    assert model.training
    stream.generate(max_new_tokens=2, **GREEDY)
    assert model.training


def test_stream_errors_name_the_problem():
    stream = TxlStream(tiny_lm(), batch_size=2)
    with pytest.raises(ValueError, match="nothing to continue from"):
        stream.generate(max_new_tokens=2)
    with pytest.raises(ValueError, match=r"expected ids of shape \[T\] or \[2, T\]"):
        stream.feed(ids(3, 4))
    with pytest.raises(ValueError, match="must be integers"):
        stream.feed(torch.rand(2, 3))
    stream.feed(ids(2, 3))
    with pytest.raises(ValueError, match="num_return_sequences must be 1"):
        stream.generate(max_new_tokens=2, num_return_sequences=2, do_sample=True)
    with pytest.raises(ValueError, match="manages `past_key_values` itself"):
        stream.generate(max_new_tokens=2, past_key_values=None)
    with pytest.raises(ValueError, match="use_cache=False would leave it behind"):
        stream.generate(max_new_tokens=2, use_cache=False)


def test_a_model_whose_generation_config_turns_the_cache_off_still_streams():
    """With generation_config.use_cache False, generate() never updated the memory and the stream lost the pending
    tokens and all but the last generated one, silently: the stream generates with its memory whatever the config."""
    model = tiny_lm(mem_len=64)
    tokens = ids(1, 30)
    expected = TxlStream(model, segment_len=8).feed(tokens)
    first = expected.generate(max_new_tokens=4, **GREEDY)
    model.generation_config.use_cache = False
    stream = TxlStream(model, segment_len=8).feed(tokens)
    assert torch.equal(stream.generate(max_new_tokens=4, **GREEDY), first)
    assert (stream.tokens_seen, stream.memory.seen_tokens) == (expected.tokens_seen, expected.memory.seen_tokens)
    assert torch.equal(stream.generate(max_new_tokens=4, **GREEDY), expected.generate(max_new_tokens=4, **GREEDY))


# ---------------------------------------------------------------------------------------------------------------------
# Bad input to TxlStream (rows of the reliability table)
# These tests run on one intra-op thread (`one_thread`, tests/conftest.py).

STREAM_CASES = [
    case(
        "streaming",
        "TxlStream(segment_len=0)",
        "ValueError (the default segment length was used silently before)",
        ValueError,
        "TxlStream: segment_len must be an integer >= 1, got 0",
        lambda lm: TxlStream(lm, segment_len=0),
        "segment-len-zero",
    ),
    case(
        "streaming",
        "TxlStream(segment_len=2.5)",
        "ValueError: an integer",
        ValueError,
        "TxlStream: segment_len must be an integer >= 1, got 2.5",
        lambda lm: TxlStream(lm, segment_len=2.5),
        "segment-len-float",
    ),
    case(
        "streaming",
        "TxlStream(batch_size=0)",
        "ValueError naming batch_size",
        ValueError,
        "TxlStream: batch_size must be an integer >= 1, got 0",
        lambda lm: TxlStream(lm, batch_size=0),
        "batch-size",
    ),
    case(
        "streaming",
        "TxlStream(mem_len=-1)",
        "ValueError naming mem_len",
        ValueError,
        "TxlStream: mem_len must be an integer >= 0, got -1",
        lambda lm: TxlStream(lm, mem_len=-1),
        "mem-len",
    ),
    case(
        "streaming",
        "feed(None)",
        "TypeError asking for token ids",
        TypeError,
        r"TxlStream.feed: expected token ids .* got NoneType",
        lambda lm: TxlStream(lm).feed(None),
        "feed-none",
    ),
    case(
        "streaming",
        "feed('some text')",
        "TypeError: encode the text first",
        TypeError,
        r"got str; encode text first",
        lambda lm: TxlStream(lm).feed("some text"),
        "feed-str",
    ),
    case(
        "streaming",
        "feed([1.5, 2.5])",
        "TypeError naming the value",
        TypeError,
        r"TxlStream.feed: token ids must be integers, got 1.5 \(float\)",
        lambda lm: TxlStream(lm).feed([1.5, 2.5]),
        "feed-floats",
    ),
    case(
        "streaming",
        "feed(float tensor)",
        "ValueError naming the dtype",
        ValueError,
        "TxlStream.feed: token ids must be integers, got dtype torch.float32",
        lambda lm: TxlStream(lm).feed(torch.tensor([1.0, 2.0])),
        "feed-float-tensor",
    ),
    case(
        "streaming",
        "feed([2, T]) to a 1-stream TxlStream",
        "ValueError naming the expected shape",
        ValueError,
        r"expected ids of shape \[T\] or \[1, T\] \(one row per stream\), got \(2, 3\)\. For 2 streams side by "
        r"side, make the stream with TxlStream\(\.\.\., batch_size=N\)",
        lambda lm: TxlStream(lm).feed(ids(2, 3)),
        "feed-rows",
    ),
    case(
        "streaming",
        "generate() before anything was fed",
        "ValueError: feed at least one token",
        ValueError,
        "TxlStream.generate: nothing to continue from",
        lambda lm: TxlStream(lm).generate(max_new_tokens=2),
        "generate-empty",
    ),
    case(
        "streaming",
        "generate(num_return_sequences=2)",
        "ValueError: one continuation per stream",
        ValueError,
        "num_return_sequences must be 1",
        lambda lm: TxlStream(lm).generate([1, 2], num_return_sequences=2, max_new_tokens=2),
        "return-sequences",
    ),
    case(
        "streaming",
        "generate(past_key_values=...)",
        "ValueError: the stream manages its memory",
        ValueError,
        "manages `past_key_values` itself",
        lambda lm: TxlStream(lm).generate([1, 2], past_key_values=None, max_new_tokens=2),
        "own-memory",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), STREAM_CASES)
@pytest.mark.usefixtures("one_thread")
def test_stream_refuses_bad_input(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))


@pytest.mark.reliability(
    "streaming",
    "feed([1, 2, 3, 4, 97, 5]) with vocab_size 97 (segments of 4)",
    "ValueError at feed time naming the id; the stream as it was before the call",
)
@pytest.mark.usefixtures("one_thread")
def test_a_bad_id_is_refused_when_fed_and_leaves_the_stream_usable(lm, record_property) -> None:
    stream = TxlStream(lm, segment_len=4)
    stream.feed([7, 8])
    expect_error(
        record_property,
        ValueError,
        r"token id 97 is outside the vocabulary \[0, 97\); nothing of this call was fed",
        lambda: stream.feed([1, 2, 3, 4, 97, 5]),
    )
    # Before, 97 waited in `pending` and failed at some later generate(), for good; then the ids before it stayed.
    assert stream.tokens_seen == 2 and torch.equal(stream.pending, torch.tensor([[7, 8]]))
    assert stream.memory.get_seq_length() == 0
    assert stream.generate([6], max_new_tokens=2, do_sample=False).shape == (1, 2)


def _stream_fingerprint(stream: TxlStream) -> tuple:
    return stream.tokens_seen, stream.pending.tolist(), stream.memory.seen_tokens, stream.memory.get_seq_length()


@pytest.mark.parametrize("where", ["generate's arguments", "a streamer", "the second segment's forward"])
@pytest.mark.usefixtures("one_thread")
def test_an_error_half_way_leaves_the_stream_as_it_was(lm, where, monkeypatch) -> None:
    """feed() and generate() are all or nothing: the prompt was fed before generate()'s arguments were checked (a
    retry then had it twice), a segment run before an interrupt was lost from `pending` while the memory was put
    back, and a streamer that raised left the pending tokens both in the memory and in `pending`."""
    stream = TxlStream(lm, segment_len=4)
    stream.feed(ids(1, 6))
    before = _stream_fingerprint(stream)
    reference = TxlStream(lm, segment_len=4).feed(ids(1, 6))
    if where == "generate's arguments":
        call = lambda: stream.generate(ids(1, 5, seed=1), max_new_tokens=0)  # noqa: E731
    elif where == "a streamer":

        class Failing(BaseStreamer):
            def put(self, value):
                if value.numel() == 1:  # (the first put is the prompt)
                    raise KeyboardInterrupt

            def end(self):
                pass

        call = lambda: stream.generate(ids(1, 5, seed=1), max_new_tokens=4, streamer=Failing())  # noqa: E731
    else:
        calls = []
        forward = type(lm).forward

        def failing_forward(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return forward(self, *args, **kwargs)

        monkeypatch.setattr(type(lm), "forward", failing_forward)
        call = lambda: stream.feed(ids(1, 10, seed=1))  # noqa: E731
    with pytest.raises((ValueError, KeyboardInterrupt)):
        call()
    monkeypatch.undo()
    assert _stream_fingerprint(stream) == before
    continued = stream.generate(ids(1, 3, seed=2), max_new_tokens=3, do_sample=False)
    assert torch.equal(continued, reference.generate(ids(1, 3, seed=2), max_new_tokens=3, do_sample=False))


@pytest.mark.usefixtures("one_thread")
def test_single_ids_and_chunks_are_fed_in_their_order(lm) -> None:
    """An iterator may mix single ids and chunks; the single ids waiting to be grouped went after the chunk."""
    mixed, plain = TxlStream(lm, segment_len=8), TxlStream(lm, segment_len=8)
    mixed.feed(iter([5, 6, torch.tensor([7, 8]), 9, [10]]))
    plain.feed(torch.tensor([5, 6, 7, 8, 9, 10]))
    assert torch.equal(mixed.pending, plain.pending)
    one = TxlStream(lm)
    one.feed(torch.tensor(5))  # a 0-d tensor: one id
    assert one.tokens_seen == 1
