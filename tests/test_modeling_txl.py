"""The model's invariants: relative positions, recurrence, memory, adaptive softmax, losses, heads, round trips; and
bad input to the models' forward (`TxlModel`, `TxlForCausalLM`, `TxlForSequenceClassification`) and the memory
(`TxlMemory`): each case a row of docs/reliability-table.md (`@pytest.mark.reliability`) that records the message it
got (the argument checks are in `transfoxl/checks_txl.py`). A few inputs are accepted on purpose; their rows say so."""

from __future__ import annotations

import contextlib
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache

from tests.utils import ID_ERROR, case, expect_error, ids, memory_of, observe, tiny_config, tiny_lm
from transfoxl import TxlForCausalLM, TxlForSequenceClassification, TxlMemory, TxlModel, TxlStream
from transfoxl.evaluation import evaluate_stream
from transfoxl.modeling_txl import (
    TxlAdaptiveLogSoftmax,
    causal_memory_mask,
    eager_relative_attention,
    relative_shift,
    sinusoid_positions,
)

VARIANTS = {
    "adaptive_post_ln": {},
    "pre_ln_shared_r": {"pre_lnorm": True, "untie_r": False},
    "no_cutoffs_projected": {"cutoffs": [], "div_val": 1, "d_embed": 24, "tie_projs": [True]},
    "div1_clamped": {"cutoffs": [40], "div_val": 1, "d_embed": 16, "clamp_len": 3, "tie_word_embeddings": False},
}


def covering_ids(vocab_size: int, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Random ids that include the first and last id of the vocabulary, so every cluster is used."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, length), generator=generator)
    ids[0, 0], ids[-1, -1] = 0, vocab_size - 1
    return ids


# ---------------------------------------------------------------------------------------------------------------------
# Relative positions


def test_relative_shift_puts_distance_m_plus_i_minus_j_at_key_j():
    batch, heads, q_len, mem_len = 2, 3, 4, 5
    k_len = mem_len + q_len
    by_distance = torch.randn(batch, heads, q_len, k_len)  # column r holds distance K-1-r
    shifted = relative_shift(by_distance)
    for i in range(q_len):
        for j in range(mem_len + i + 1):  # every key that query i may see
            distance = mem_len + i - j
            assert torch.equal(shifted[..., i, j], by_distance[..., i, k_len - 1 - distance])


def direct_relative_attention(query, key, value, position_table, content_bias, position_bias, mem_len, scaling):
    """Eq. 3 of the paper computed entry by entry: R_{M+i-j} looked up by distance, future keys excluded."""
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[2]
    scores = torch.full((batch, heads, q_len, k_len), float("-inf"))
    for i in range(q_len):
        for j in range(mem_len + i + 1):
            distance = mem_len + i - j
            content = ((query[:, :, i] + content_bias) * key[:, :, j]).sum(-1)
            position = ((query[:, :, i] + position_bias) * position_table[:, distance]).sum(-1)
            scores[:, :, i, j] = (content + position) * scaling
    weights = scores.softmax(-1)
    return weights @ value, weights


def test_eager_attention_matches_the_direct_computation_of_the_positional_terms():
    torch.manual_seed(0)
    batch, heads, q_len, mem_len, head_dim = 2, 3, 4, 3, 8
    k_len = q_len + mem_len
    query = torch.randn(batch, heads, q_len, head_dim)
    key, value = torch.randn(batch, heads, k_len, head_dim), torch.randn(batch, heads, k_len, head_dim)
    table_by_distance = torch.randn(heads, k_len, head_dim)  # [H, distance, D]
    rel_key = table_by_distance.flip(1)  # the model's order: row r = distance K-1-r
    content_bias, position_bias = torch.randn(heads, head_dim), torch.randn(heads, head_dim)
    mask = causal_memory_mask(q_len, mem_len, same_length=False, max_mem_len=mem_len, device=query.device)

    output, weights = eager_relative_attention(
        query, key, value, rel_key, content_bias, position_bias, mask, scaling=0.3, dropout=0.0
    )
    expected_output, expected_weights = direct_relative_attention(
        query, key, value, table_by_distance, content_bias, position_bias, mem_len, 0.3
    )
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(output, expected_output, rtol=0, atol=1e-5)


def test_sinusoid_positions_are_ordered_by_decreasing_distance_and_clamped():
    table = sinusoid_positions(6, 8, clamp_len=0, dtype=torch.float32, device=torch.device("cpu"))
    assert table.shape == (6, 8)
    torch.testing.assert_close(table[-1], torch.tensor([0.0] * 4 + [1.0] * 4))  # distance 0: sin 0, cos 0
    clamped = sinusoid_positions(6, 8, clamp_len=2, dtype=torch.float32, device=torch.device("cpu"))
    assert torch.equal(clamped[0], clamped[3])  # distances 5 and 2 both read distance 2
    assert torch.equal(clamped[3:], table[3:])


def test_same_length_mask_gives_every_query_the_same_number_of_keys():
    # With a full memory (M = mem_len), every query sees the mem_len latest positions, itself included.
    mask = causal_memory_mask(4, 6, same_length=True, max_mem_len=6, device=torch.device("cpu"))
    assert (~mask).sum(-1).tolist() == [6, 6, 6, 6]
    assert not mask[3, 9] and mask[0, 7]  # the last query sees itself; the first query does not see the future
    assert mask[0, 0] and not mask[0, 1]  # ... nor the oldest memory position, which is out of its window
    causal = causal_memory_mask(4, 6, same_length=False, max_mem_len=6, device=torch.device("cpu"))
    assert (~causal).sum(-1).tolist() == [7, 8, 9, 10]


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_same_length_without_a_memory_reads_the_segment_causally(attn_implementation):
    """mem_len 0 with same_length (TxlConfig's defaults but the memory, and the wt103 model evaluated without its
    memory): the window of mem_len keys held none, not even the query's own; v4's fill gave every key, the future's
    included, the same weight. A segment is read causally: the logits of a position do not move with a later token,
    the attention of the first query is on itself, and a padded row equals the same row alone."""
    assert torch.equal(
        causal_memory_mask(5, 0, same_length=True, max_mem_len=0, device=torch.device("cpu")),
        causal_memory_mask(5, 0, same_length=False, max_mem_len=0, device=torch.device("cpu")),
    )
    assert causal_memory_mask(1, 0, same_length=True, max_mem_len=0, device=torch.device("cpu")) is None
    lm = tiny_lm(mem_len=0, same_length=True)
    lm.config._attn_implementation = attn_implementation
    tokens = ids(1, 6)
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % lm.config.vocab_size
    with torch.no_grad():
        out = lm(tokens, output_attentions=attn_implementation == "eager")
        torch.testing.assert_close(lm(changed).logits[:, :5], out.logits[:, :5], rtol=0, atol=0)
        if attn_implementation == "eager":
            assert out.attentions[0][0, :, 0, 0].eq(1).all()  # the first query sees only itself
        padded = torch.cat([tokens, torch.zeros(1, 2, dtype=torch.long)], dim=1)
        mask = torch.tensor([[1] * 6 + [0] * 2])
        torch.testing.assert_close(lm(padded, attention_mask=mask).logits[:, :6], out.logits, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# Recurrence and memory


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_two_segments_with_memory_equal_one_pass_over_both(variant, attn_implementation):
    model = tiny_lm(**VARIANTS[variant], mem_len=6)
    model.config._attn_implementation = attn_implementation
    ids = covering_ids(model.config.vocab_size, batch=2, length=11)
    first, second = ids[:, :6], ids[:, 6:]

    whole = model(ids, use_cache=False, output_hidden_states=True)
    memory = model(first).past_key_values
    continued = model(second, past_key_values=memory, output_hidden_states=True)

    torch.testing.assert_close(continued.logits, whole.logits[:, 6:], rtol=0, atol=1e-5)
    for layer_continued, layer_whole in zip(continued.hidden_states, whole.hidden_states):
        torch.testing.assert_close(layer_continued, layer_whole[:, 6:], rtol=0, atol=1e-5)


def test_memory_is_detached_capped_and_holds_the_latest_layer_inputs():
    model = tiny_lm(mem_len=7).train()
    memory, inputs_seen = None, []
    for step in range(3):
        ids = covering_ids(model.config.vocab_size, batch=2, length=5, seed=step)
        output = model(ids, past_key_values=memory, labels=ids, output_hidden_states=True)
        output.loss.backward()
        assert output.past_key_values is (memory or output.past_key_values)  # updated in place
        memory = output.past_key_values
        inputs_seen.append(output.hidden_states[:-1])
        assert memory.get_seq_length() == min(5 * (step + 1), 7)
    with pytest.raises(IndexError, match="layer_idx 2 is not a layer of this memory's 2"):
        memory.get_memory(2)
    for layer_idx in range(model.config.n_layer):
        stored = memory.get_memory(layer_idx)
        assert stored.shape == (2, 7, model.config.d_model) and not stored.requires_grad
        expected = torch.cat([seen[layer_idx] for seen in inputs_seen], dim=1)[:, -7:]
        assert torch.equal(stored, expected.detach())


def test_sliding_window_keeps_the_latest_entries_and_moves_them_rarely():
    """Appends of any size keep exactly the last max_len entries in order; views handed out stay valid; segments
    longer than the default room move the kept entries at most every third append, one token at a time every 64."""
    from transfoxl.memory_txl import SlidingWindow

    length = 960
    for count, max_len, most_moves in ((80, 200, 1 + 12 // 3), (1, 30, 1 + 960 // 64)):
        window, stream = SlidingWindow(dim=1, max_len=max_len), torch.arange(float(length))[None]
        views, moves, buffer = [], 0, None
        for start in range(0, length, count):
            with torch.no_grad():
                views.append((start, window.append(stream[:, start : start + count])))
            moves += window.buffer is not buffer
            buffer = window.buffer
            end = start + count
            assert torch.equal(window.value, stream[:, max(0, end - max_len) : end])
        for start, view in views:  # each returned the entries kept before it, then its own
            assert torch.equal(view, stream[:, max(0, start - max_len) : start + count])
        assert moves <= most_moves
    prompt = SlidingWindow(dim=1, max_len=1000)
    prompt.append(torch.zeros(1, 512))  # a prompt before decoding: only the default room of 64
    assert prompt.buffer.shape[1] == 512 + 64


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "grad", "made_in_inference_mode"])
def test_room_appended_for_an_entry_is_append_without_the_write(mode):
    """`SlidingWindow.append_room` (decoding's room for the entry the compiled step writes) keeps what
    `append(entry)` would once the caller writes the entry: the last max_len entries in order, the room last in the
    view it returns. Into the free room while there is some (the entries move once in a while), into a new buffer
    with gradients on or for a buffer made under inference_mode outside it."""
    from transfoxl.memory_txl import SlidingWindow

    stream = torch.arange(40.0).view(1, 40, 1).expand(1, 40, 3).contiguous()
    window = SlidingWindow(dim=1, max_len=7, room=4)
    with torch.inference_mode() if "inference_mode" in mode else torch.no_grad():
        window.append(stream[:, :5])  # a prompt: room for 4 more
    appending = {"grad": torch.enable_grad, "inference_mode": torch.inference_mode}.get(mode, torch.no_grad)
    moves, buffer = [], window.buffer
    for position in range(5, 20):
        with appending():
            room = window.append_room()
            room[:, -1] = stream[:, position]
        moves.append(window.buffer is not buffer)
        buffer = window.buffer
        kept = stream[:, max(0, position - 6) : position + 1]
        assert torch.equal(window.value, kept) and torch.equal(room[:, -kept.shape[1] :], kept)
    if mode == "grad":
        assert all(moves)
    else:  # (a buffer made under inference_mode is left at once, for one of the process's own)
        assert sum(moves) <= 4 + (mode == "made_in_inference_mode") and moves[0] == (mode == "made_in_inference_mode")


@pytest.mark.parametrize("mode", ["no_grad", "grad", "train", "inference_mode"])
def test_a_deep_copy_of_a_memory_continues_as_the_memory_would(mode):
    """A prompt's memory copied with copy.deepcopy (to continue it more than once) works as the original, whatever
    mode made it: a memory made with gradients on keeps the layer inputs without a copy and checks their version
    when read, which a copy must not inherit. The copy and the original stay independent."""
    import copy

    model = tiny_lm(mem_len=7, cutoffs=[])  # (a plain embedding scales its output in place: version 1)
    prompt, following = ids(2, 5, seed=1), ids(2, 4, seed=2)
    if mode == "train":
        model.train()
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, contextlib.nullcontext)
    with context():
        memory = model(prompt).past_key_values
    model.eval()
    with torch.no_grad():
        copied = copy.deepcopy(memory)  # (before anything reads the memory: reading copies a shared tensor)
        first = model(following, past_key_values=copied).logits
        again = model(following, past_key_values=copy.deepcopy(memory)).logits
        expected = model(following, past_key_values=TxlMemory.from_legacy(memory.to_legacy(), mem_len=7)).logits
    torch.testing.assert_close(first, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(again, first, rtol=0, atol=0)  # the first copy moved on; the original did not
    assert copied.get_seq_length() == 7 and memory.get_seq_length() == 5


@pytest.mark.parametrize("cutoffs", [[], [30, 60]], ids=["softmax", "adaptive"])
def test_a_float64_model_computes_in_float64_and_passes_gradcheck(cutoffs):
    """model.to(torch.float64) computes every softmax in float64 (half precision in float32), so logits and loss are
    float64 and torch.autograd.gradcheck holds through the memory, the attention and the (adaptive) softmax."""
    torch.manual_seed(0)
    config = tiny_config(n_layer=2, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32, mem_len=4, cutoffs=cutoffs)
    model = TxlForCausalLM(config).to(torch.float64).eval()
    tokens = ids(1, 5, seed=3)
    with torch.no_grad():
        memory = model(ids(1, 4, seed=4)).past_key_values
    assert model(tokens).logits.dtype == torch.float64 and model(tokens, labels=tokens).loss.dtype == torch.float64
    embedded = model.get_input_embeddings()(tokens).detach().requires_grad_()

    def log_probs(inputs_embeds):
        return model(inputs_embeds=inputs_embeds, past_key_values=copy.deepcopy(memory)).logits

    assert torch.autograd.gradcheck(log_probs, (embedded,), eps=1e-6, atol=1e-6)


def test_mem_len_zero_keeps_no_memory():
    model = tiny_lm(mem_len=0)
    ids = covering_ids(model.config.vocab_size, batch=2, length=5)
    first = model(ids)
    assert first.past_key_values.get_seq_length() == 0
    second = model(ids, past_key_values=first.past_key_values)
    torch.testing.assert_close(second.logits, first.logits, rtol=0, atol=0)


def test_an_empty_memory_object_is_the_same_as_none():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=5)
    torch.testing.assert_close(
        model(ids, past_key_values=TxlMemory.from_config(model.config)).logits, model(ids).logits, rtol=0, atol=0
    )


def test_memory_init_zeros_attends_to_mem_len_zero_vectors():
    model = tiny_lm(memory_init="zeros", mem_len=6)
    ids = covering_ids(model.config.vocab_size, batch=2, length=4)
    output = model(ids, output_attentions=True)
    assert output.attentions[0].shape == (2, model.config.n_head, 4, 6 + 4)
    assert output.past_key_values.get_seq_length() == 6
    assert not torch.allclose(output.logits, tiny_lm(mem_len=6)(ids).logits)  # the zeros are attended


@pytest.mark.parametrize("change", ["appended", "removed"])
def test_layers_added_or_removed_after_loading_all_run_with_memory(change):
    """A model whose `layers` were changed without `config.n_layer` runs every layer it has, memory and generate()
    included, as a model built with that many layers does (the memory used to follow the config, and the extra
    layers were skipped silently)."""
    changed = tiny_lm()
    layers = changed.transformer.layers
    if change == "appended":
        layers.append(copy.deepcopy(layers[0]))
    else:
        changed.transformer.layers = layers[:1]
    built = tiny_lm(n_layer=len(changed.transformer.layers))
    built.load_state_dict(changed.state_dict())
    prompt = ids(2, 5)
    with torch.no_grad():
        changed_out, built_out = changed(prompt, use_cache=True), built(prompt, use_cache=True)
        torch.testing.assert_close(changed_out.logits, built_out.logits, rtol=0, atol=0)
        follow = ids(2, 3, seed=1)
        torch.testing.assert_close(
            changed(follow, past_key_values=changed_out.past_key_values).logits,
            built(follow, past_key_values=built_out.past_key_values).logits,
            rtol=0,
            atol=0,
        )
    for batch in (1, 2):  # batch 1 decodes every layer in one fused call
        kwargs = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(changed.generate(ids(batch, 5), **kwargs), built.generate(ids(batch, 5), **kwargs))
    # The package's own streams and evaluation make their memories from the model too.
    stream_tokens = TxlStream(changed, segment_len=3).feed(ids(1, 7)).generate(max_new_tokens=3, do_sample=False)
    assert torch.equal(stream_tokens, TxlStream(built, segment_len=3).feed(ids(1, 7)).generate(max_new_tokens=3))
    stream = ids(1, 40)[0]
    assert evaluate_stream(changed, stream, tgt_len=8, mem_len=8).loss == pytest.approx(
        evaluate_stream(built, stream, tgt_len=8, mem_len=8).loss, rel=1e-6
    )


def test_legacy_mems_round_trip():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=3, length=5)
    memory = model(ids).past_key_values
    mems = memory.to_legacy()
    assert [tuple(mem.shape) for mem in mems] == [(5, 3, model.config.d_model)] * model.config.n_layer
    rebuilt = TxlMemory.from_legacy(mems, mem_len=model.config.mem_len)
    follow = covering_ids(model.config.vocab_size, batch=3, length=4, seed=1)
    torch.testing.assert_close(
        model(follow, past_key_values=rebuilt).logits, model(follow, past_key_values=memory).logits, rtol=0, atol=0
    )


def test_legacy_mems_say_what_they_cannot_carry(caplog):
    """v4's mems have no padding flags: a memory with padding is warned on the way out (the rebuilt one attended to
    those positions, silently). A numpy integer is a length like any other."""
    model = tiny_lm()
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0
    padded = model(covering_ids(model.config.vocab_size, batch=2, length=5), attention_mask=mask).past_key_values
    with caplog.at_level("WARNING"):
        model(covering_ids(model.config.vocab_size, batch=2, length=5)).past_key_values.to_legacy()
        assert "holds padding" not in caplog.text
        padded.to_legacy()
    assert "the memory holds padding, which v4's mems cannot mark" in caplog.text
    assert TxlMemory(num_layers=np.int64(2), mem_len=np.int64(8)).mem_len == 8


def test_reset_starts_a_new_stream():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=5)
    memory = model(ids).past_key_values
    memory.reset()
    assert memory.get_seq_length() == 0
    torch.testing.assert_close(model(ids, past_key_values=memory).logits, model(ids).logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# Adaptive softmax and losses


def test_adaptive_log_probs_are_normalised():
    model = tiny_lm()
    log_probs = model(covering_ids(model.config.vocab_size, batch=2, length=5)).logits
    assert log_probs.shape == (2, 5, model.config.vocab_size)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 5), rtol=0, atol=1e-5)


def test_adaptive_softmax_without_cutoffs_is_a_plain_softmax():
    config = tiny_config(cutoffs=[], div_val=1)
    softmax = TxlAdaptiveLogSoftmax(config)
    torch.nn.init.normal_(softmax.output_layers[0].weight)
    torch.nn.init.normal_(softmax.output_layers[0].bias)
    hidden = torch.randn(6, config.d_model)
    expected = F.log_softmax(hidden @ softmax.output_layers[0].weight.T + softmax.output_layers[0].bias, dim=-1)
    torch.testing.assert_close(softmax(hidden), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_nll_of_targets_equals_the_full_log_probs_gathered(variant):
    model = tiny_lm(**VARIANTS[variant])
    hidden = torch.randn(12, model.config.d_model)
    targets = covering_ids(model.config.vocab_size, batch=1, length=12)[0]
    targets[3] = -100
    full = model.adaptive_softmax(hidden)
    expected = -full.gather(1, targets.clamp(min=0)[:, None]).squeeze(1)
    expected[3] = 0.0
    torch.testing.assert_close(model.adaptive_softmax.nll(hidden, targets), expected, rtol=0, atol=1e-5)


def test_labels_are_shifted_inside_and_shift_labels_are_not():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=6)
    labels = ids.clone()
    labels[1, 2] = -100
    original = labels.clone()
    with_labels = model(ids, labels=labels, return_logits=True)
    assert torch.equal(labels, original)  # the caller's tensor is untouched

    shifted = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1)
    with_shift = model.train()(ids, shift_labels=shifted)  # (no dropout in the tiny config)
    torch.testing.assert_close(with_shift.loss, with_labels.loss, rtol=0, atol=0)
    assert with_shift.logits is None  # a training step's loss does not materialise the log-probs

    log_probs = with_labels.logits[:, :-1]
    expected = -log_probs.gather(-1, shifted[:, :-1].clamp(min=0)[..., None]).squeeze(-1)
    valid = shifted[:, :-1] != -100
    torch.testing.assert_close(with_labels.loss, expected[valid].mean(), rtol=0, atol=1e-5)
    assert with_labels.losses.shape == (2, 6) and with_labels.losses[1, 1] == 0 and with_labels.losses[0, -1] == 0


def test_loss_over_num_items_in_batch():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=6)
    output = model(ids, labels=ids, num_items_in_batch=20)
    torch.testing.assert_close(output.loss, output.losses.sum() / 20)


def test_all_ignored_targets_are_refused():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=6)
    with pytest.raises(ValueError, match="Every target is -100"):
        model(ids, labels=torch.full_like(ids, -100))
    # ... unless the loss is divided by a count over several batches (gradient accumulation)
    assert model(ids, labels=torch.full_like(ids, -100), num_items_in_batch=10).loss == 0


@pytest.mark.parametrize("bad_target", [97, -1, -101])
def test_targets_outside_the_vocabulary_are_refused(bad_target):
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=6)
    targets = ids.clone()
    targets[1, 3] = bad_target
    with pytest.raises(ValueError, match=rf"Target {bad_target} is neither a token id in \[0, 97\) nor -100"):
        model(ids, shift_labels=targets)


def test_gradients_reach_every_parameter():
    model = tiny_lm(untie_r=False, dropout=0.1, dropatt=0.1).train()
    ids = covering_ids(model.config.vocab_size, batch=4, length=12)
    ids[1] = torch.arange(0, model.config.vocab_size, 8)[:12]  # touches every cluster on both sides
    memory = model(ids).past_key_values
    model(ids, past_key_values=memory, labels=ids).loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("reentrant", [None, False, True], ids=["default", "non-reentrant", "reentrant"])
@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_gradient_checkpointing_gives_the_same_gradients(reentrant, dropout):
    """Also with dropout: reentrant checkpointing runs each layer without a gradient and again with one for backward,
    and the two drew different masks (gradients of another function than the loss's, off by 0.02 in float32)."""
    ids = covering_ids(97, batch=2, length=8)
    grads, losses = [], []
    for checkpointing in (False, True):
        model = tiny_lm(dropout=dropout, dropatt=dropout).train()
        if checkpointing:
            model.activation_checkpointing_enable(None if reentrant is None else {"use_reentrant": reentrant})
        torch.manual_seed(1)
        memory = model(ids).past_key_values
        loss = model(ids, past_key_values=memory, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-6)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# Attention implementations, outputs, heads


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("same_length", [False, True])
def test_sdpa_equals_eager_forward_and_backward(variant, same_length):
    ids = covering_ids(97, batch=2, length=7)
    results = []
    for implementation in ("eager", "sdpa"):
        model = tiny_lm(**VARIANTS[variant], same_length=same_length, mem_len=5)
        model.config._attn_implementation = implementation
        memory = model(ids[:, :4]).past_key_values
        output = model(ids, past_key_values=memory, labels=ids, return_logits=True)
        output.loss.backward()
        results.append((output.logits, {name: p.grad for name, p in model.named_parameters()}))
    (eager_logits, eager_grads), (sdpa_logits, sdpa_grads) = results
    torch.testing.assert_close(sdpa_logits, eager_logits, rtol=0, atol=1e-5)
    for name in eager_grads:
        torch.testing.assert_close(sdpa_grads[name], eager_grads[name], rtol=0, atol=1e-5)


def test_hidden_states_and_attentions_have_the_documented_shapes():
    model = tiny_lm(mem_len=6)
    ids = covering_ids(model.config.vocab_size, batch=2, length=4)
    memory = model(ids).past_key_values
    output = model(ids, past_key_values=memory, output_hidden_states=True, output_attentions=True)
    config = model.config
    assert len(output.hidden_states) == config.n_layer + 1
    assert all(hidden.shape == (2, 4, config.d_model) for hidden in output.hidden_states)
    assert len(output.attentions) == config.n_layer
    assert all(weights.shape == (2, config.n_head, 4, 4 + 4) for weights in output.attentions)
    torch.testing.assert_close(output.attentions[0].sum(-1), torch.ones(2, config.n_head, 4))


def test_base_model_and_tuple_outputs():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=5)
    base_output = model.transformer(ids)
    assert isinstance(model.transformer, TxlModel)
    assert base_output.last_hidden_state.shape == (2, 5, model.config.d_model)
    as_tuple = model(ids, return_dict=False)
    torch.testing.assert_close(as_tuple[0], model(ids).logits)


def test_logits_to_keep_takes_a_tensor_of_positions_as_transformers_causal_lms_do():
    model = tiny_lm()
    prompt = ids(2, 6)
    every = model(prompt).logits
    for positions in ([0, 3], [-1], [5, 5, -6]):
        kept = model(prompt, logits_to_keep=torch.tensor(positions)).logits
        torch.testing.assert_close(kept, every[:, positions], rtol=0, atol=1e-5)
    assert model(prompt, logits_to_keep=torch.tensor([], dtype=torch.long)).logits.shape == (2, 0, 97)
    for bad, match in (
        (torch.tensor([[1]]), r"1-D int64 or int32 positions, got shape \(1, 1\)"),
        (torch.tensor([0.5]), "float32"),
        (torch.tensor([1, 0, 1, 0, 1, 1], dtype=torch.uint8), "uint8"),  # (indexing would read it as a mask)
        (torch.tensor([1], dtype=torch.int16), "int16"),
    ):
        with pytest.raises(ValueError, match=match):
            model(prompt, logits_to_keep=bad)


def test_a_training_steps_tuple_holds_the_logits_where_a_causal_lm_has_them():
    """A training step returns no logits in its dict (the loss reads only the clusters it needs), but a tuple has
    no names: without logits, the memory or the per-token losses took their place."""
    model = tiny_lm().train()
    ids = covering_ids(model.config.vocab_size, batch=2, length=5)
    loss, logits, memory, losses = model(ids, labels=ids, return_dict=False)
    as_dict = model(ids, labels=ids)
    assert as_dict.logits is None
    torch.testing.assert_close(loss, as_dict.loss)
    torch.testing.assert_close(logits, model(ids, labels=ids, return_logits=True).logits)
    assert logits.shape == (2, 5, model.config.vocab_size) and isinstance(memory, TxlMemory)
    assert losses.shape == (2, 5)


def test_sequence_classification_pools_the_last_non_padding_token():
    config = tiny_config(num_labels=3, pad_token_id=1)
    torch.manual_seed(0)
    model = TxlForSequenceClassification(config).eval()
    ids = torch.tensor([[5, 6, 7, 1, 1], [8, 9, 10, 11, 12]])
    output = model(ids, labels=torch.tensor([0, 2]))
    assert output.logits.shape == (2, 3) and output.loss.ndim == 0 and math.isfinite(output.loss.item())
    alone = model(ids[:1, :3]).logits
    torch.testing.assert_close(output.logits[0], alone[0], rtol=0, atol=1e-5)
    # The attention mask, where given, tells the padding: padded with another id than the config's (a tokenizer's
    # own pad), or a real token equal to pad_token_id, the last real token is still the one pooled.
    other_pad = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 1, 11, 12]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    masked = model(other_pad, attention_mask=mask).logits
    torch.testing.assert_close(masked[0], alone[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(masked[1], model(other_pad[1:]).logits[0], rtol=0, atol=1e-5)


def test_sequence_classification_of_embeddings_pools_by_the_attention_mask():
    """inputs_embeds carry no pad ids: the attention mask tells the padding (the last position, padding, was
    classified before, 0.36 off in a helper's check; GPT-2 does that with a warning)."""
    for pad_token_id in (1, None):
        model = TxlForSequenceClassification(tiny_config(num_labels=3, pad_token_id=pad_token_id)).eval()
        ids = torch.tensor([[5, 6, 7, 1, 1], [8, 9, 10, 11, 12]])
        mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
        embedded = model(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask).logits
        alone = model(ids[:1, :3]).logits
        torch.testing.assert_close(embedded[0], alone[0], rtol=0, atol=1e-5)


def test_sequence_classification_needs_a_pad_token_for_batches():
    model = TxlForSequenceClassification(tiny_config(num_labels=2)).eval()
    with pytest.raises(ValueError, match="pad_token_id"):
        model(covering_ids(97, batch=2, length=4))


def test_output_layers_and_projections_are_tied_as_configured():
    model = tiny_lm(tie_projs=[False, True, False])
    embedding, softmax = model.transformer.word_embeddings, model.adaptive_softmax
    for cluster in range(3):
        assert softmax.output_layers[cluster].weight is embedding.embeddings[cluster].weight
    assert softmax.output_projections[1] is embedding.projections[1]
    assert softmax.output_projections[0] is not embedding.projections[0]
    assert softmax.output_projections[2] is not embedding.projections[2]
    untied = tiny_lm(tie_word_embeddings=False)
    assert (
        untied.adaptive_softmax.output_layers[0].weight is not untied.transformer.word_embeddings.embeddings[0].weight
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_save_and_load_round_trip(tmp_path, variant):
    model = tiny_lm(**VARIANTS[variant])
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is TxlForCausalLM
    ids = covering_ids(model.config.vocab_size, batch=2, length=6)
    # Equal to float32 rounding, not bitwise: loaded weights lie at another alignment (safetensors maps the file),
    # and BLAS's products of a few rows (the adaptive embedding's per-cluster ones) may then sum in another order.
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=1.3e-6, atol=1e-6)
    for target, source in model._tied_weights_keys.items():
        assert reloaded.get_parameter(target) is reloaded.get_parameter(source)


def test_weights_only_false_is_refused(tmp_path):
    tiny_lm().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="weights_only=False is refused"):
        TxlForCausalLM.from_pretrained(tmp_path, weights_only=False)


# ---------------------------------------------------------------------------------------------------------------------
# Errors at the boundary


def test_bad_inputs_get_clear_errors():
    model = tiny_lm()
    ids = covering_ids(model.config.vocab_size, batch=2, length=5)
    with pytest.raises(ValueError, match=r"token id 97, outside the vocabulary \[0, 97\)"):
        model(torch.tensor([[1, 97]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 3]]))
    for bad in (-1, 97):  # one token (decoding): read back alone
        with pytest.raises(ValueError, match=rf"token id {bad}, outside the vocabulary \[0, 97\)"):
            model(torch.tensor([[bad]]))
    with pytest.raises(ValueError, match="must be \\[batch, seq_len\\]"):
        model(ids[0])
    with pytest.raises(ValueError, match="input_ids is empty"):
        model(ids[:, :0])
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model()
    with pytest.raises(TypeError, match="past_key_values must be a TxlMemory"):
        model(ids, past_key_values=[torch.zeros(3, 2, 32)])
    memory = model(ids).past_key_values
    with pytest.raises(ValueError, match="The memory holds batch 2"):
        model(ids[:1], past_key_values=memory)
    with pytest.raises(ValueError, match="labels must have the input's shape"):
        model(ids, labels=ids[:, :3])
    with pytest.raises(ValueError, match=r"either labels .* or shift_labels"):
        model(ids, labels=ids, shift_labels=ids)
    with pytest.raises(TypeError, match="`mems` is transformers v4's name"):
        model(ids, mems=memory.to_legacy())
    with pytest.raises(TypeError, match=r"Unexpected arguments .*\['head_mask'\]"):
        model.transformer(ids, head_mask=torch.ones(4))


def test_token_types_of_one_segment_are_taken_and_a_second_type_is_refused():
    """A tokenizer made for BERT-like models returns token_type_ids (all 0 for one text), which GPT-2 takes and a
    pipeline passes on: they were refused as an unexpected argument. A second type (a text pair's 1s) has no
    embedding here: refused, saying what to do."""
    model = tiny_lm()
    tokens = ids(2, 5)
    with torch.no_grad():
        expected = model(tokens).logits
        torch.testing.assert_close(model(tokens, token_type_ids=torch.zeros_like(tokens)).logits, expected)
        classifier = TxlForSequenceClassification(tiny_config(num_labels=2, pad_token_id=0)).eval()
        classifier(tokens, token_type_ids=torch.zeros_like(tokens))
        with pytest.raises(ValueError, match=r"token_type_ids marks tokens of a second type .*return_token_type_ids"):
            model(tokens, token_type_ids=torch.ones_like(tokens))
    # generate(**tokenizer(...)) as with GPT-2: generate() refused them as a keyword the forward does not name.
    greedy = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    given = model.generate(tokens, token_type_ids=torch.zeros_like(tokens), **greedy)
    assert torch.equal(given, model.generate(tokens, **greedy))
    with pytest.raises(ValueError, match=r"token_type_ids marks tokens of a second type"):
        model.generate(tokens, token_type_ids=torch.ones_like(tokens), **greedy)
    with pytest.raises(ValueError, match=r"token_type_ids of shape \[1, 2\] do not go with the input ids of shape"):
        model.generate(tokens, token_type_ids=torch.zeros(1, 2, dtype=torch.long), **greedy)
    with pytest.raises(
        ValueError, match=r"token_type_ids of shape \[2, 3\] do not go with the input ids of shape \[2, 5\]"
    ):
        model(tokens, token_type_ids=torch.zeros(2, 3, dtype=torch.long))  # (GPT-2 fails on them too)


def test_a_model_reads_its_vocabulary_from_its_own_modules_not_a_shared_config():
    """Two models built from one config object (`Cls(model.config)`): resizing one's vocabulary writes the shared
    config's vocab_size, and the other's logits were then viewed with it (a RuntimeError about a shape)."""
    model = tiny_lm()
    resized = TxlForCausalLM(model.config).eval()
    config = model.config
    tokens = ids(1, 6)
    with torch.no_grad():
        expected = model(tokens, labels=tokens)
        resized.resize_token_embeddings(config.vocab_size + 10)
        assert model.config.vocab_size == resized.config.vocab_size == expected.logits.shape[-1] + 10
        again = model(tokens, labels=tokens)
    torch.testing.assert_close(again.logits, expected.logits, rtol=0, atol=0)
    torch.testing.assert_close(again.loss, expected.loss, rtol=0, atol=0)
    assert model.generate(tokens, max_new_tokens=2, do_sample=False).shape == (1, 8)
    # An id the resized model has and this one lacks is refused by this one's own count, with gradients too (the
    # masked embedding path would clamp it), and by a stream and an evaluation of it.
    outside = torch.tensor([[1, model.input_vocab_size() + 3]])
    with pytest.raises(ValueError, match=rf"outside the vocabulary.*\b{model.input_vocab_size()}\b"):
        model(outside)
    with pytest.raises(ValueError, match="outside"):
        TxlStream(model).feed(outside)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        evaluate_stream(model, torch.cat([outside, tokens], dim=1).reshape(-1), tgt_len=2, mem_len=4)


# ---------------------------------------------------------------------------------------------------------------------
# Bad input to the models' forward and the memory (rows of the reliability table)
# These tests run on one intra-op thread (`one_thread`, tests/conftest.py).

FORWARD_CASES = [
    case(
        "model input",
        "token id 97 with vocab_size 97",
        ID_ERROR,
        ValueError,
        r"token id 97, outside the vocabulary \[0, 97\)",
        lambda lm: lm(torch.tensor([[1, 97]])),
        "id-at-vocab-size",
    ),
    case(
        "model input",
        "token id -1",
        ID_ERROR,
        ValueError,
        r"token id -1, outside the vocabulary \[0, 97\)",
        lambda lm: lm(torch.tensor([[-1, 3]])),
        "negative-id",
    ),
    case(
        "model input",
        "token id 10^6 into the base model (TxlModel)",
        ID_ERROR,
        ValueError,
        r"token id 1000000, outside the vocabulary \[0, 97\)",
        lambda lm: TxlModel(tiny_config())(torch.tensor([[1, 10**6]])),
        "base-model-id",
    ),
    case(
        "model input",
        "token id 500 into TxlForSequenceClassification",
        ID_ERROR,
        ValueError,
        r"token id 500, outside the vocabulary \[0, 97\)",
        lambda lm: TxlForSequenceClassification(tiny_config())(torch.tensor([[500]])),
        "classifier-id",
    ),
    case(
        "model input",
        "input_ids as a Python list",
        "TypeError asking for a tensor [batch, seq_len]",
        TypeError,
        r"input_ids must be a torch.Tensor of token ids \[batch, seq_len\], got list",
        lambda lm: lm([[1, 2, 3]]),
        "ids-list",
    ),
    case(
        "model input",
        "float input_ids",
        "ValueError naming the dtype",
        ValueError,
        r"input_ids must hold integer token ids \(int64\), got dtype torch.float32",
        lambda lm: lm(ids().float()),
        "ids-float",
    ),
    case(
        "model input",
        "1-D input_ids",
        "ValueError asking for [batch, seq_len]",
        ValueError,
        r"input_ids must be \[batch, seq_len\], got shape \(5,\)",
        lambda lm: lm(ids()[0]),
        "ids-1d",
    ),
    case(
        "model input",
        "empty input_ids [2, 0]",
        "ValueError: empty",
        ValueError,
        r"input_ids is empty \(shape \(2, 0\)\); pass at least one token",
        lambda lm: lm(ids()[:, :0]),
        "ids-empty",
    ),
    case(
        "model input",
        "both input_ids and inputs_embeds",
        "ValueError: exactly one",
        ValueError,
        "Pass exactly one of input_ids or inputs_embeds",
        lambda lm: lm(ids(), inputs_embeds=torch.zeros(2, 5, 32)),
        "ids-and-embeds",
    ),
    case(
        "model input",
        "integer inputs_embeds",
        "TypeError asking for floats",
        TypeError,
        "inputs_embeds must be a floating-point torch.Tensor, got torch.int64",
        lambda lm: lm(inputs_embeds=torch.zeros(2, 5, 32, dtype=torch.long)),
        "embeds-int",
    ),
    case(
        "model input",
        "float64 inputs_embeds into a float32 model",
        "ValueError naming both dtypes",
        ValueError,
        "inputs_embeds has dtype torch.float64, the model's weights torch.float32",
        lambda lm: lm(inputs_embeds=torch.zeros(2, 5, 32, dtype=torch.float64)),
        "embeds-dtype",
    ),
    case(
        "model input",
        "inputs_embeds of width 16 (d_model 32)",
        "ValueError naming the expected shape",
        ValueError,
        r"inputs_embeds must be \[batch, seq_len, 32\], got \(2, 5, 16\)",
        lambda lm: lm(inputs_embeds=torch.zeros(2, 5, 16)),
        "embeds-width",
    ),
    case(
        "model input",
        "empty inputs_embeds [2, 0, 32]",
        "ValueError: empty",
        ValueError,
        r"inputs_embeds is empty \(shape \(2, 0, 32\)\)",
        lambda lm: lm(inputs_embeds=torch.zeros(2, 0, 32)),
        "embeds-empty",
    ),
    case(
        "model input",
        "attention_mask [2, 6] for input_ids [2, 5]",
        "ValueError naming both shapes",
        ValueError,
        r"attention_mask must be \[batch, seq_len\] = \(2, 5\) like the input, got \(2, 6\)",
        lambda lm: lm(ids(), attention_mask=torch.ones(2, 6)),
        "mask-shape",
    ),
    case(
        "model input",
        "4-D attention_mask [2, 1, 5, 5]",
        "ValueError: a [batch, seq_len] mask is expected",
        ValueError,
        r"attention_mask must be \[batch, seq_len\] = \(2, 5\) like the input, got \(2, 1, 5, 5\)",
        lambda lm: lm(ids(), attention_mask=torch.ones(2, 1, 5, 5)),
        "mask-4d",
    ),
    case(
        "model input",
        "attention_mask holding 0.5",
        "ValueError: 1 (token) or 0 (padding)",
        ValueError,
        r"attention_mask must hold 1 \(token\) or 0 \(padding\), got the value 0.5",
        lambda lm: lm(ids(), attention_mask=torch.full((2, 5), 0.5)),
        "mask-fraction",
    ),
    case(
        "model input",
        "additive attention_mask (0 / -inf)",
        "ValueError: 1 (token) or 0 (padding)",
        ValueError,
        r"attention_mask must hold 1 \(token\) or 0 \(padding\), got the value -inf",
        lambda lm: lm(ids(), attention_mask=torch.tensor([[0.0, 0, 0, 0, float("-inf")]] * 2)),
        "mask-additive",
    ),
    case(
        "model input",
        "attention_mask as a Python list",
        "TypeError asking for a tensor",
        TypeError,
        "attention_mask must be a torch.Tensor",
        lambda lm: lm(ids(), attention_mask=[[1] * 5] * 2),
        "mask-list",
    ),
    case(
        "model input",
        "labels all -100",
        "ValueError: nothing to compute a loss on",
        ValueError,
        r"Every target is -100 \(ignored\): there is nothing to compute a loss on",
        lambda lm: lm(ids(), labels=torch.full((2, 5), -100)),
        "labels-all-ignored",
    ),
    case(
        "model input",
        "labels on a 1-token segment (shifted: no target left)",
        "ValueError pointing to shift_labels",
        ValueError,
        "a 1-token segment has no target: pass shift_labels",
        lambda lm: lm(ids(2, 1), labels=ids(2, 1)),
        "labels-one-token",
    ),
    case(
        "model input",
        "label 97 with vocab_size 97",
        "ValueError naming the target and the vocabulary",
        ValueError,
        r"Target 97 is neither a token id in \[0, 97\) nor -100",
        lambda lm: lm(ids(), labels=torch.full((2, 5), 97)),
        "labels-out-of-vocab",
    ),
    case(
        "model input",
        "float labels",
        "ValueError naming the dtype",
        ValueError,
        r"labels must hold integer token ids \(-100: ignored\), got dtype torch.float32",
        lambda lm: lm(ids(), labels=ids().float()),
        "labels-float",
    ),
    case(
        "model input",
        "labels [5] for input_ids [2, 5]",
        "ValueError naming both shapes",
        ValueError,
        r"labels must have the input's shape \(2, 5\), got \(5,\)",
        lambda lm: lm(ids(), labels=ids()[0]),
        "labels-shape",
    ),
    case(
        "model input",
        "labels and shift_labels together",
        "ValueError: one or the other",
        ValueError,
        r"Pass either labels \(shifted inside\) or shift_labels \(pre-aligned\), not both",
        lambda lm: lm(ids(), labels=ids(), shift_labels=ids()),
        "labels-both",
    ),
    case(
        "model input",
        "logits_to_keep=-1",
        "ValueError: an integer >= 0",
        ValueError,
        r"logits_to_keep must be an integer >= 0 \(0: every position\), got -1",
        lambda lm: lm(ids(), logits_to_keep=-1),
        "logits-to-keep",
    ),
    case(
        "model input",
        "logits_to_keep=torch.tensor([5]) for 5 positions / a 2-D or float tensor",
        "ValueError naming the position and the input's length / the shape and dtype expected",
        ValueError,
        r"logits_to_keep holds position 5; the input has 5 positions",
        lambda lm: lm(ids(), logits_to_keep=torch.tensor([5])),
        "logits-to-keep-positions",
    ),
    case(
        "model input",
        "num_items_in_batch=-1",
        "ValueError: >= 0 (0 is Trainer's count for a batch without targets)",
        ValueError,
        r"num_items_in_batch must be >= 0 .* got -1",
        lambda lm: lm(ids(), labels=ids(), num_items_in_batch=-1),
        "num-items-negative",
    ),
    case(
        "model input",
        "v4's mems= argument",
        "TypeError pointing to past_key_values=TxlMemory",
        TypeError,
        "`mems` is transformers v4's name: pass the memory as past_key_values=TxlMemory",
        lambda lm: lm(ids(), mems=[torch.zeros(4, 2, 32)] * 2),
        "mems-kwarg",
    ),
    case(
        "model input",
        "a misspelt argument (head_mask)",
        "TypeError naming it",
        TypeError,
        r"Unexpected arguments for a Transformer-XL forward: \['head_mask'\]",
        lambda lm: lm(ids(), head_mask=None),
        "unknown-kwarg",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), FORWARD_CASES)
@pytest.mark.usefixtures("one_thread")
def test_forward_refuses_bad_input(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))


def classifier(**overrides) -> TxlForSequenceClassification:
    return TxlForSequenceClassification(tiny_config(**overrides)).eval()


CLASSIFIER_CASES = [
    case(
        "model input",
        "class label 5 with num_labels 3",
        "ValueError naming the label and num_labels",
        ValueError,
        r"labels contains class 5, outside \[0, num_labels=3\)",
        lambda: classifier(num_labels=3, pad_token_id=0)(ids(), labels=torch.tensor([5, 1])),
        "class-label-range",
    ),
    case(
        "model input",
        "3 class labels for 2 sequences",
        "ValueError naming the expected shape",
        ValueError,
        r"labels must hold one class id per sequence, \[2\], got shape \(3,\)",
        lambda: classifier(num_labels=3, pad_token_id=0)(ids(), labels=torch.tensor([1, 1, 1])),
        "class-label-shape",
    ),
    case(
        "model input",
        "a batch of 2 sequences without pad_token_id (classifier)",
        "ValueError: pad_token_id is needed to find each last token",
        ValueError,
        "Batches of more than one sequence need config.pad_token_id",
        lambda: classifier()(ids()),
        "classifier-pad",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), CLASSIFIER_CASES)
@pytest.mark.usefixtures("one_thread")
def test_classifier_refuses_bad_labels(record_property, error, match, call) -> None:
    expect_error(record_property, error, match, call)


@pytest.mark.reliability(
    "model input",
    "left- and right-padded batch (attention_mask with zeros)",
    "accepted: the real tokens get the same log-probabilities as without padding",
)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.usefixtures("one_thread")
def test_padding_leaves_the_real_tokens_unchanged(lm, record_property, side: str) -> None:
    tokens = ids(1, 5, seed=1) + 1  # no id 0, the padding id here
    pad, ones = torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 5, dtype=torch.long)
    padded = torch.cat([pad, tokens] if side == "left" else [tokens, pad], dim=1)
    mask = torch.cat([pad, ones] if side == "left" else [ones, pad], dim=1)
    with torch.no_grad():
        alone = lm(tokens, use_cache=False).logits
        logits = lm(padded, attention_mask=mask, use_cache=False).logits
    real = logits[:, 3:] if side == "left" else logits[:, :5]
    difference = (real - alone).abs().max().item()
    assert torch.isfinite(logits).all() and difference < 1e-5
    record_property("outcome", f"{side} padding: max |difference| {difference:.1e}, every logit finite")


# ---------------------------------------------------------------------------------------------------------------------
# The memory


def meta_memory(lm: TxlForCausalLM) -> TxlMemory:
    """A memory whose tensors sit on the "meta" device (this CPU machine has no other device to put them on)."""
    memory = memory_of(lm)
    for layer in memory.layers:
        layer._apply(lambda tensor: tensor.to("meta"))
    return memory


def appended_layer(lm: TxlForCausalLM) -> TxlForCausalLM:
    lm.transformer.layers.append(copy.deepcopy(lm.transformer.layers[0]))
    return lm


MEMORY_CASES = [
    case(
        "memory",
        "memory of batch 2, input of batch 1",
        "ValueError naming both batch sizes",
        ValueError,
        r"The memory holds batch 2 x width 32; the input needs batch 1 x width 32",
        lambda lm: lm(ids(1, 3), past_key_values=memory_of(lm)),
        "batch",
    ),
    case(
        "memory",
        "memory of a 3-layer model into a 2-layer one",
        "ValueError naming both layer counts",
        ValueError,
        "The memory has 3 layers; this model has 2",
        lambda lm: lm(ids(), past_key_values=memory_of(tiny_lm(n_layer=3))),
        "layers",
    ),
    case(
        "memory",
        "a layer appended to the model, its config.n_layer left at 2, and a memory made from the config",
        "ValueError naming both layer counts and config.n_layer",
        ValueError,
        r"The memory has 2 layers; this model has 3 while its config.n_layer is 2: set config.n_layer",
        lambda lm: appended_layer(lm)(ids(), past_key_values=TxlMemory.from_config(lm.config)),
        "stale-n-layer",
    ),
    case(
        "memory",
        "memory of width 48 into a d_model 32 model",
        "ValueError naming both widths",
        ValueError,
        "The memory holds batch 2 x width 48; the input needs batch 2 x width 32",
        lambda lm: lm(ids(), past_key_values=memory_of(tiny_lm(d_model=48, d_embed=48, d_head=12))),
        "width",
    ),
    case(
        "memory",
        "float64 memory into a float32 model",
        "ValueError naming both dtypes",
        ValueError,
        "The memory holds torch.float64 hidden states; this forward's are torch.float32",
        lambda lm: lm(ids(), past_key_values=memory_of(tiny_lm().double())),
        "dtype",
    ),
    case(
        "memory",
        "memory on another device (meta; the only other device on a CPU machine)",
        "ValueError naming both devices",
        ValueError,
        "The memory is on device meta; the input is on cpu",
        lambda lm: lm(ids(), past_key_values=meta_memory(lm)),
        "device",
    ),
    case(
        "memory",
        "v4 mems (a tuple of tensors) as past_key_values",
        "TypeError pointing to TxlMemory.from_legacy",
        TypeError,
        r"past_key_values must be a TxlMemory .* got tuple\. Convert v4 `mems` with TxlMemory.from_legacy",
        lambda lm: lm(ids(), past_key_values=(torch.zeros(4, 2, 32),) * 2),
        "tuple",
    ),
    case(
        "memory",
        "a DynamicCache (keys/values) as past_key_values",
        "TypeError naming the class",
        TypeError,
        "past_key_values must be a TxlMemory .* got DynamicCache",
        lambda lm: lm(ids(), past_key_values=DynamicCache()),
        "dynamic-cache",
    ),
    case(
        "memory",
        "TxlMemory(num_layers=0, mem_len=4)",
        "ValueError naming both values",
        ValueError,
        "TxlMemory needs integers num_layers >= 1 and mem_len >= 0, got 0 and 4",
        lambda lm: TxlMemory(0, 4),
        "zero-layers",
    ),
    case(
        "memory",
        "TxlMemory(num_layers=2, mem_len=-1)",
        "ValueError naming both values",
        ValueError,
        "TxlMemory needs integers num_layers >= 1 and mem_len >= 0, got 2 and -1",
        lambda lm: TxlMemory(2, -1),
        "negative-mem-len",
    ),
    case(
        "memory",
        "TxlMemory.from_legacy([])",
        "ValueError: one [M, B, E] tensor per layer",
        ValueError,
        r"`mems` is empty; pass one \[M, B, E\] tensor per layer",
        lambda lm: TxlMemory.from_legacy([]),
        "legacy-empty",
    ),
    case(
        "memory",
        "TxlMemory.from_legacy with 2-D tensors",
        "ValueError naming the shapes",
        ValueError,
        r"every layer needs a \[M, B, E\] tensor of one shape, got \{\(3, 4\)\}",
        lambda lm: TxlMemory.from_legacy([torch.zeros(3, 4)]),
        "legacy-2d",
    ),
    case(
        "memory",
        "crop(2) (assisted decoding's rollback)",
        "ValueError: the memory cannot be cropped",
        ValueError,
        "TxlMemory cannot be cropped",
        lambda lm: memory_of(lm).crop(-2),
        "crop",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), MEMORY_CASES)
@pytest.mark.usefixtures("one_thread")
def test_memory_errors_name_what_differs(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))


@pytest.mark.reliability(
    "memory", "TxlMemory(num_layers=2, mem_len=2.5) / mem_len='4' / mem_len=True", "ValueError: integers expected"
)
@pytest.mark.parametrize("mem_len", [2.5, "4", True], ids=["float", "str", "bool"])
@pytest.mark.usefixtures("one_thread")
def test_memory_lengths_must_be_integers(record_property, mem_len) -> None:
    record_property("outcome", f"mem_len={mem_len!r}: {observe(lambda: TxlMemory(2, mem_len))}")
    expect_error(record_property, ValueError, "mem_len", lambda: TxlMemory(2, mem_len))


@pytest.mark.usefixtures("one_thread")
def test_a_key_value_caches_update_is_refused_and_changes_nothing(lm) -> None:
    # transformers' Cache.update(key_states, value_states, layer_idx) would have stored the keys as layer 0's
    # hidden states, then failed part-way.
    memory = memory_of(lm)
    before = [layer.hidden.clone() for layer in memory.layers]
    keys = torch.randn(1, 2, 3, 4)
    for call in (lambda: memory.update(keys, keys, 0), lambda: memory.layers[0].update(keys, keys, {})):
        with pytest.raises(TypeError, match=r"not keys and values, so a key/value cache's update"):
            call()
    assert all(torch.equal(layer.hidden, kept) for layer, kept in zip(memory.layers, before))
