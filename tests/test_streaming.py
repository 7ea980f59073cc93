"""TxlStream: feeding any length in segments, generating from everything seen, continuing, bounded state."""

from __future__ import annotations

import pytest
import torch

from tests.test_generation import GREEDY, greedy_without_cache, ids
from tests.utils import tiny_lm
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
