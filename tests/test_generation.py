"""generate() with memories: decoding equals recomputation, continuation, batching with padding, beams, errors; bad
input to generate(), each case a row of docs/reliability-table.md (`@pytest.mark.reliability`)."""

from __future__ import annotations

import copy
import io
import pickle
import string

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, TextIteratorStreamer, pipeline

from tests.utils import ID_ERROR, case, expect_error, ids, memory_of, tiny_lm
from transfoxl import TxlForCausalLM, TxlMemory, fast_paths_txl
from transfoxl.fast_paths_txl import _identity, check_kept_position_table
from transfoxl.tokenization import build_word_level_tokenizer

VARIANTS = {
    "post_ln": {},
    "pre_ln_shared_r": {"pre_lnorm": True, "untie_r": False},
    "same_length_clamped": {"same_length": True, "clamp_len": 3},
    "no_cutoffs_projected": {"cutoffs": [], "div_val": 1, "d_embed": 24, "tie_projs": [True]},
}
GREEDY = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}


def greedy_without_cache(model: TxlForCausalLM, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Reference: recompute the whole sequence for every new token (no memory at all)."""
    sequence = prompt
    for _ in range(new_tokens):
        next_token = model(sequence, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
    return sequence


def greedy_segment_wise(model: TxlForCausalLM, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Reference with memory truncation: one token per forward, memory of hidden states re-projected every step."""
    sequence, memory = prompt, None
    with torch.enable_grad():  # gradients on: the memory keeps no projections, so each step re-projects it
        for step in range(new_tokens):
            inputs = sequence if step == 0 else sequence[:, -1:]
            output = model(inputs, past_key_values=memory)
            memory = output.past_key_values
            sequence = torch.cat([sequence, output.logits[:, -1].argmax(-1, keepdim=True).detach()], dim=1)
    return sequence


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_projections_give_the_same_outputs_as_reprojecting_the_memory(variant):
    model = tiny_lm(**VARIANTS[variant], mem_len=5)
    stream = ids(2, 14)
    memories = {"cached": None, "reprojected": None}
    for position in range(0, 14, 2):  # 2 tokens a step: the memory fills, then truncates
        segment = stream[:, position : position + 2]
        with torch.no_grad():
            cached = model(segment, past_key_values=memories["cached"])
        reprojected = model(segment, past_key_values=memories["reprojected"])
        memories = {"cached": cached.past_key_values, "reprojected": reprojected.past_key_values}
        assert memories["cached"].layers[0].projection_version is not None
        assert memories["reprojected"].layers[0].projection_version is None
        torch.testing.assert_close(cached.logits, reprojected.logits.detach(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("tokens", [1, 2])  # one: decoding's fused step, which keys the kept projections itself
@pytest.mark.parametrize("changed", ["qkv weight", "pre-LN norm weight", "pre-LN norm bias"])
def test_cached_projections_are_dropped_when_the_weights_change(changed, tokens):
    """The kept keys and values are made from the memory by the query-key-value weight (and, pre-LN, the attention's
    norm): changed in place, as by an optimizer step, they are made again, for a segment and for one token."""
    model = tiny_lm(mem_len=8, pre_lnorm=changed.startswith("pre-LN"))
    with torch.no_grad():
        with_projections = model(ids(1, 6)).past_key_values
    # The same hidden states without projections (not from a forward with gradients on: that would start a new
    # training phase, which alone drops what inference kept)
    hidden_only = copy.deepcopy(with_projections)
    for layer in hidden_only.layers:
        layer.drop_projections()
    attention = model.transformer.layers[1].attention
    weight = {
        "qkv weight": attention.qkv_proj.weight,
        "pre-LN norm weight": attention.layer_norm.weight,
        "pre-LN norm bias": attention.layer_norm.bias,
    }[changed]
    with torch.no_grad():
        before = model(ids(1, tokens, seed=1), past_key_values=copy.deepcopy(with_projections)).logits
        weight.mul_(1.5).add_(0.1)  # in place, as an optimizer step
        after_change = model(ids(1, tokens, seed=1), past_key_values=with_projections).logits
        reference = model(ids(1, tokens, seed=1), past_key_values=hidden_only).logits
    torch.testing.assert_close(after_change, reference, rtol=0, atol=1e-5)
    assert (after_change - before).abs().max() > 1e-3  # (the change matters)


def test_kept_results_are_dropped_by_training_with_a_fused_optimizer():
    """torch's fused AdamW (train.py's optimizer) updates parameters in place without bumping their version,
    so results kept from the weights (the projected position table, a memory's projected keys and values) cannot be
    keyed on versions alone: a training step's forward drops them, and inference after the step gives what the
    trained weights give (the model stays in eval mode throughout: the forward alone must do it)."""
    model = tiny_lm(mem_len=8).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    with torch.no_grad():
        kept = model(ids(1, 6)).past_key_values  # keeps projections; the position table is projected and kept
    hidden_only = copy.deepcopy(kept)
    for layer in hidden_only.layers:
        layer.drop_projections()
    versions = [parameter._version for parameter in model.parameters()]
    model(ids(2, 6, seed=2), labels=ids(2, 6, seed=2)).loss.backward()
    optimizer.step()
    assert [parameter._version for parameter in model.parameters()] == versions  # what makes versions not enough
    with torch.no_grad():
        after_step = model(ids(1, 2, seed=1), past_key_values=kept).logits
    reference = model(ids(1, 2, seed=1), past_key_values=hidden_only).logits.detach()  # gradients on: nothing kept
    torch.testing.assert_close(after_step, reference, rtol=0, atol=1e-5)

    # A traced (torch.compile) training forward does not count; the switch to training mode drops them too.
    with torch.no_grad():
        model(ids(1, 3))
    attention = model.transformer.layers[0].attention
    assert attention._projected_positions is not None
    model.train()
    assert attention._projected_positions is None


@pytest.mark.parametrize("edit", ["every value", "some columns", "some rows", "one value"])
@pytest.mark.parametrize("start", ["new memory", "reset", "generate"])
def test_an_edit_through_data_is_seen_where_a_new_stream_starts(start, edit):
    """`.data` edits (PEFT's merge_and_unload merges that way) bump no version: the model's kept position table was
    used by new streams too, so the documented remedy, a new memory, did not help. A new stream checks the table
    against a fingerprint of the whole weight (a sample of 64 values missed rows scaled through `.data`, a head's
    ablation, in a model wider than 64 columns)."""
    model = tiny_lm(mem_len=8, d_model=128, d_embed=128)
    assert model.transformer.layers[0].attention.pos_proj.weight.shape[1] > 64
    prompt, follow = ids(1, 5), ids(1, 1, seed=1)
    with torch.no_grad():
        memory = model(prompt).past_key_values  # keeps the position table (and the memory's projections)
        for layer in model.transformer.layers:
            weight = layer.attention.pos_proj.weight.data
            if edit == "every value":
                weight.mul_(1.5)
            elif edit == "some columns":
                weight[:, 1:16].mul_(3.0)
            elif edit == "some rows":
                weight[1:4].mul_(50.0)
            else:
                weight[3, 5] += 20.0
        if start == "generate":
            generated = model.generate(prompt, max_new_tokens=4, output_scores=True, return_dict_in_generate=True)
            scores = torch.stack(generated.scores, dim=1)  # [1, 4, V]
        else:
            if start == "reset":
                memory.reset()
            else:
                memory = model.transformer.empty_memory()
            logits = [model(prompt, past_key_values=memory).logits[:, -1:]]
            logits.append(model(follow, past_key_values=memory).logits)  # the fused one-token step
    with torch.enable_grad():  # gradients on: nothing kept, everything projected again
        reference = model(prompt, use_cache=False).logits[:, -1:].detach()
        if start == "generate":
            assert torch.equal(generated.sequences, greedy_without_cache(model, prompt, 4))
            torch.testing.assert_close(scores[:, :1], reference, rtol=0, atol=1e-5)
            return
        expected = torch.cat([reference, model(torch.cat([prompt, follow], 1)).logits[:, -1:].detach()], 1)
    torch.testing.assert_close(torch.cat(logits, 1), expected, rtol=0, atol=1e-5)


def test_a_model_moved_to_another_device_starts_new_streams():
    """A model used on the CPU and then moved (`.to("cuda")`, as transformers' pipeline does on a GPU machine) kept a
    position table whose weight sample was on the CPU; the check where a new stream starts compared it with the moved
    weight's and raised (devices differ). The table is dropped instead (it is projected again anyway). The meta
    device stands in for a GPU here."""
    model = tiny_lm(mem_len=8)
    with torch.no_grad():
        model(ids(1, 5))
    attentions = [layer.attention for layer in model.transformer.layers]
    assert all(attention._projected_positions is not None for attention in attentions)
    for attention in attentions:
        attention.pos_proj.weight = torch.nn.Parameter(attention.pos_proj.weight.detach().to("meta"))
        check_kept_position_table(attention)
        assert attention._projected_positions is None


def test_kept_results_name_the_weight_object_not_only_its_address():
    """A weight made after another was freed may take its address and version; the kept results' keys name the
    tensor object, and a copy unpickled with the attribute that holds its number gets a number of its own."""
    first, second = torch.zeros(4), torch.zeros(4)
    assert _identity(first) == _identity(first) != _identity(second)
    clone = pickle.loads(pickle.dumps(first))
    assert clone.__dict__["_txl_identity"] == (_identity(first),)  # (the attribute travelled)
    assert _identity(clone) not in (_identity(first), _identity(second))
    for duplicate in (copy.copy(first), copy.deepcopy(first)):  # (the same mark object, at another id)
        assert duplicate.__dict__["_txl_identity"] is first.__dict__["_txl_identity"]
        assert _identity(duplicate) not in (_identity(first), _identity(second), _identity(clone))
    parameter = torch.nn.Parameter(torch.zeros(4))
    number = _identity(parameter)
    for duplicate in (copy.copy(parameter), copy.deepcopy(parameter)):
        assert _identity(duplicate) != number
    saved = io.BytesIO()
    torch.save(first, saved)  # (the attribute is plain data: a weights-only load takes it)
    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=True)
    assert torch.equal(loaded, first) and _identity(loaded) != _identity(first)


def test_a_weight_loaded_where_a_freed_one_was_gets_a_number_of_its_own(monkeypatch: pytest.MonkeyPatch):
    """A weight saved after decoding carries its number's mark; loaded after the original was freed it may take the
    original's id (and its storage address and version): it carries an equal mark, not the very one registered for
    that id, and gets a number of its own, so a memory made with the original is not continued with its keys and
    values. (Python reuses ids at will: the reuse is simulated by registering the original's mark at the copy's id.)"""
    original = torch.nn.Parameter(torch.zeros(4))
    number, mark = _identity(original), original.__dict__["_txl_identity"]
    loaded = pickle.loads(pickle.dumps(original))
    assert loaded.__dict__["_txl_identity"] == mark
    monkeypatch.setitem(fast_paths_txl._marks, id(loaded), mark)  # (as if the original had been here)
    assert _identity(loaded) != number
    assert _identity(original) == number  # (the original, alive, keeps its own)


def test_weights_can_be_swapped_after_decoding_and_the_next_tokens_use_them():
    """`torch.utils.swap_tensors` (what `model.to()` uses for tensor subclasses and under
    `set_swap_module_params_on_conversion`) works on a model that has decoded, whose kept results name its weights:
    nothing holds a weak reference to a weight. The next decoded tokens use the swapped-in values, and a model cast
    to float64 by swapping decodes as a float64 copy made without swapping."""

    def stream_logits(model: TxlForCausalLM, tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            memory = model(tokens[:, :5], use_cache=True).past_key_values
            return torch.cat([model(tokens[:, i : i + 1], past_key_values=memory).logits for i in range(5, 9)], 1)

    model, tokens = tiny_lm(mem_len=8).eval(), ids(1, 9)
    before = stream_logits(model, tokens)  # (kept position tables, plans, keys and values: all made)
    reference = copy.deepcopy(model)
    for layer, copied in zip(model.transformer.layers, reference.transformer.layers):
        for name in ("qkv_proj", "pos_proj"):
            weight = getattr(layer.attention, name).weight
            torch.utils.swap_tensors(weight, torch.nn.Parameter(weight.detach() * 1.5))
            with torch.no_grad():
                getattr(copied.attention, name).weight.mul_(1.5)
    swapped = stream_logits(model, tokens)
    torch.testing.assert_close(swapped, stream_logits(reference, tokens))
    assert not torch.allclose(swapped, before)
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.double()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert model.transformer.layers[0].attention.qkv_proj.weight.dtype == torch.float64
    torch.testing.assert_close(stream_logits(model, tokens), stream_logits(reference.double(), tokens))


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_equals_full_recomputation(variant):
    model = tiny_lm(**VARIANTS[variant], mem_len=64)
    prompt = ids(2, 7)
    generated = model.generate(prompt, max_new_tokens=10, **GREEDY)
    assert torch.equal(generated, greedy_without_cache(model, prompt, 10))


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_with_memory_truncation_equals_the_segment_wise_reference(variant):
    model = tiny_lm(**VARIANTS[variant], mem_len=6)
    prompt = ids(2, 9)
    memory = TxlMemory.from_config(model.config)
    generated = model.generate(prompt, past_key_values=memory, max_new_tokens=12, **GREEDY)
    assert torch.equal(generated, greedy_segment_wise(model, prompt, 12))
    assert memory.get_seq_length() == 6  # bounded whatever the length generated


def test_sampling_and_beam_search_equal_the_no_cache_reference():
    model = tiny_lm(mem_len=64)
    prompt = ids(2, 5)
    results = {}
    for use_cache in (True, False):
        torch.manual_seed(123)
        sampled = model.generate(
            prompt, do_sample=True, top_k=10, top_p=0.9, temperature=1.3, max_new_tokens=8, use_cache=use_cache,
            num_return_sequences=2, pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
        beams = model.generate(
            prompt, num_beams=3, num_return_sequences=2, max_new_tokens=8, use_cache=use_cache, **GREEDY
        )
        results[use_cache] = (sampled, beams)
    assert torch.equal(results[True][0], results[False][0])
    assert torch.equal(results[True][1], results[False][1])


@pytest.mark.parametrize("prefill_chunk_size", [None, 4])
def test_continuation_from_a_memory_equals_recomputing_everything(prefill_chunk_size):
    model = tiny_lm(mem_len=64)
    prefix, prompt = ids(2, 21, seed=1), ids(2, 6, seed=2)
    memory = None
    for segment in prefix.split(8, dim=1):
        memory = model(segment, past_key_values=memory).past_key_values
    generated = model.generate(
        prompt, past_key_values=memory, max_new_tokens=9, prefill_chunk_size=prefill_chunk_size, **GREEDY
    )
    expected = greedy_without_cache(model, torch.cat([prefix, prompt], dim=1), 9)[:, 21:]
    assert torch.equal(generated, expected)
    # in place; everything but the last generated token
    assert memory.get_seq_length() == 21 + 6 + 9 - 1


def test_beam_search_from_a_memory_expands_it():
    model = tiny_lm(mem_len=64)
    prefix, prompt = ids(1, 12, seed=1), ids(1, 4, seed=2)
    memory = model(prefix).past_key_values
    generated = model.generate(prompt, past_key_values=memory, num_beams=3, max_new_tokens=6, **GREEDY)
    reference = model.generate(
        torch.cat([prefix, prompt], dim=1), num_beams=3, max_new_tokens=6, use_cache=False, **GREEDY
    )
    assert torch.equal(generated, reference[:, 12:])
    assert memory.batch_size == 3  # the running beams


def test_prefill_in_chunks_equals_one_prefill():
    model = tiny_lm(mem_len=64)
    prompt = ids(2, 19)
    whole = model.generate(prompt, max_new_tokens=6, **GREEDY)
    assert torch.equal(model.generate(prompt, max_new_tokens=6, prefill_chunk_size=5, **GREEDY), whole)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mem_len", [64, 5])
def test_left_padded_batch_generates_what_each_prompt_generates_alone(variant, mem_len):
    model = tiny_lm(**VARIANTS[variant], mem_len=mem_len)
    prompts = [ids(1, 7, seed=3, low=1)[0], ids(1, 3, seed=4, low=1)[0], ids(1, 1, seed=5, low=1)[0]]
    longest = max(len(prompt) for prompt in prompts)
    batch = torch.stack([torch.cat([torch.zeros(longest - len(p), dtype=torch.long), p]) for p in prompts])
    attention_mask = torch.stack([torch.cat([torch.zeros(longest - len(p)), torch.ones(len(p))]) for p in prompts])
    generated = model.generate(batch, attention_mask=attention_mask.long(), max_new_tokens=10, **GREEDY)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], max_new_tokens=10, **GREEDY)
        assert torch.equal(generated[row, longest:], alone[0, len(prompt) :]), row


def test_padding_with_no_memory_keeps_nothing():
    model = tiny_lm(mem_len=0)
    memory = model(ids(1, 4, low=1), attention_mask=torch.tensor([[0, 1, 1, 1]])).past_key_values
    assert memory.padding is None and memory.get_seq_length() == 0


def test_padding_in_the_memory_is_never_attended():
    model = tiny_lm(mem_len=16)
    real = ids(1, 5, seed=7, low=1)
    padded = torch.cat([torch.full((1, 4), 3), real], dim=1)
    memory = model(padded, attention_mask=torch.tensor([[0] * 4 + [1] * 5])).past_key_values
    assert memory.padding.tolist() == [[True] * 4 + [False] * 5]
    follow = ids(1, 3, seed=8)
    with_padding = model(follow, past_key_values=memory).logits
    without = model(follow, past_key_values=model(real).past_key_values).logits
    torch.testing.assert_close(with_padding, without, rtol=0, atol=1e-5)


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny model's vocabulary: <pad> <unk> <eos> w3 ... w96."""
    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2, **{f"w{index}": index for index in range(3, 97)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")


def test_streamers_and_the_text_generation_pipeline():
    model, tokenizer = tiny_lm(mem_len=32), word_tokenizer()
    prompt = tokenizer("w5 w17 w60 w33", return_tensors="pt")
    assert prompt["input_ids"].tolist() == [[5, 17, 60, 33]]
    generated = model.generate(**prompt, max_new_tokens=5, **GREEDY)
    new_words = tokenizer.decode(generated[0, 4:])

    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    model.generate(**prompt, max_new_tokens=5, streamer=streamer, **GREEDY)
    assert "".join(streamer).split() == new_words.split()

    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    output = generator("w5 w17 w60 w33", max_new_tokens=5, return_full_text=False, **GREEDY)
    assert output[0]["generated_text"].split() == [word for word in new_words.split() if word != "<eos>"]


def test_the_word_level_tokenizer_leaves_a_prompt_open_in_the_pipeline():
    """A prompt is not a finished line: the package's word-level tokenizer appends no <eos> to it (v4's encode and
    GPT-2's tokenizer append nothing either), so the pipeline continues the prompt's line; a newline is still <eos>."""
    tokenizer = build_word_level_tokenizer(["<eos>", "<unk>", *(f"w{index}" for index in range(2, 97))])
    assert tokenizer("w5 w17 w60").input_ids == [5, 17, 60]
    assert tokenizer("w5\nw17\n").input_ids == [5, 0, 17, 0]
    model = tiny_lm(mem_len=32)
    expected = model.generate(torch.tensor([[5, 17, 60]]), max_new_tokens=4, **GREEDY)[0, 3:]
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    output = generator("w5 w17 w60", max_new_tokens=4, return_full_text=False, **GREEDY)
    assert output[0]["generated_text"].split() == tokenizer.decode(expected, skip_special_tokens=True).split()


def test_stop_strings_stop_with_a_tokenizer_that_spells_them_and_a_word_level_one_is_told_what_to_do():
    """generate(stop_strings=...) stops where the text ends with one (a character-level tokenizer); with a word-level
    tokenizer, which cannot spell transformers' probe text, a clear error says what to do instead of transformers'
    "substring not found" (GPT-2 given the same tokenizer fails alike)."""
    from transfoxl.tokenization import train_char_level

    characters = train_char_level([string.ascii_letters])
    model = tiny_lm(mem_len=16, vocab_size=len(characters))
    prompt = torch.tensor([[5, 17, 40]])
    free = model.generate(prompt, max_new_tokens=12, **GREEDY)[0, 3:]
    text = characters.decode(free)
    stop = text[4:6]  # (ends at the sixth new character, or earlier where it occurs before)
    stopped = model.generate(prompt, max_new_tokens=12, stop_strings=[stop], tokenizer=characters, **GREEDY)[0, 3:]
    assert len(text) == len(free)  # (one character a token: the sixth character ends the sixth token)
    assert characters.decode(stopped).endswith(stop) and len(stopped) <= 6
    assert torch.equal(stopped, free[: len(stopped)])
    words = build_word_level_tokenizer(["<eos>", "<unk>", *(f"w{index}" for index in range(2, 97))])
    with pytest.raises(
        ValueError,
        match="needs a tokenizer that spells back the text transformers probes it with, 'abcdef', and this one gives",
    ):
        model.generate(prompt, max_new_tokens=4, stop_strings=["w5"], tokenizer=words, **GREEDY)
    bases = train_char_level(["ACGT" * 8])  # (characters, but not those of the probe)
    with pytest.raises(ValueError, match="a character-level one only its characters"):
        tiny_lm(mem_len=16).generate(prompt, max_new_tokens=4, stop_strings=["AC"], tokenizer=bases, **GREEDY)


def test_a_mismatched_memory_gets_a_clear_error():
    model = tiny_lm(mem_len=8)
    memory = model(ids(3, 4)).past_key_values
    with pytest.raises(ValueError, match="The memory holds 3 streams but generate\\(\\) got 2 sequences"):
        model.generate(ids(2, 4), past_key_values=memory, max_new_tokens=2, **GREEDY)
    with pytest.raises(ValueError, match="The memory has 2 layers; this model has 3"):
        tiny_lm(n_layer=3)(ids(3, 4), past_key_values=memory)
    with pytest.raises(ValueError, match="width 32; the input needs batch 3 x width 48"):
        tiny_lm(d_model=48)(ids(3, 4), past_key_values=memory)
    with pytest.raises(ValueError, match="attention_mask must be \\[batch, seq_len\\]"):
        model(ids(3, 4), attention_mask=torch.ones(3, 9))
    with pytest.raises(ValueError, match="cannot be cropped"):
        memory.crop(-1)


# ---------------------------------------------------------------------------------------------------------------------
# Inference caches and generate() plumbing (found in review)


def test_changing_clamp_len_after_a_forward_takes_effect():
    model = tiny_lm(clamp_len=-1, mem_len=8)
    stream = ids(1, 9)
    with torch.no_grad():
        model(stream)  # fills the inference caches
        model.config.clamp_len = 2
        changed = model(stream).logits
    fresh = tiny_lm(clamp_len=2, mem_len=8)
    torch.testing.assert_close(changed, fresh(stream).logits.detach(), rtol=0, atol=1e-5)


def test_an_autocast_call_does_not_leave_a_low_precision_position_table_behind():
    model = tiny_lm(cutoffs=[], div_val=1, mem_len=8)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(ids(1, 5))
        full_precision = model(ids(1, 5), use_cache=False).logits
    assert full_precision.dtype == torch.float32
    torch.testing.assert_close(full_precision, model(ids(1, 5), use_cache=False).logits.detach(), rtol=0, atol=1e-5)


def test_a_memory_built_in_inference_mode_continues_under_no_grad():
    model = tiny_lm(mem_len=16)
    with torch.inference_mode():
        memory = model(ids(1, 6)).past_key_values
    generated = model.generate(ids(1, 2, seed=1), past_key_values=memory, max_new_tokens=3, **GREEDY)
    assert generated.shape == (1, 5)


def test_chunked_prefill_uses_the_mask_columns_of_the_new_tokens():
    model = tiny_lm(mem_len=32)
    memory = model(ids(1, 6, low=1), attention_mask=torch.tensor([[0, 0, 0, 1, 1, 1]])).past_key_values
    prompt = ids(1, 6, seed=2, low=1)
    full_mask = torch.tensor([[0, 0, 0, 1, 1, 1] + [1] * 6])  # transformers' convention: [earlier; new] columns
    model.generate(prompt, attention_mask=full_mask, past_key_values=memory, max_new_tokens=1, prefill_chunk_size=2)
    assert memory.padding[0, :12].tolist() == [True] * 3 + [False] * 9


def test_generate_returns_attentions_and_hidden_states_when_asked():
    model = tiny_lm(mem_len=16)
    output = model.generate(
        ids(1, 4),
        max_new_tokens=2,
        return_dict_in_generate=True,
        output_attentions=True,
        output_hidden_states=True,
        **GREEDY,
    )
    assert output.attentions[0][0].shape == (1, model.config.n_head, 4, 4)
    assert output.hidden_states[0][0].shape == (1, 4, model.config.d_model)


def test_hooks_on_the_projections_run():
    model = tiny_lm(mem_len=16)
    calls = []
    attention = model.transformer.layers[0].attention
    for module in (attention.qkv_proj, attention.pos_proj, attention.o_proj):
        module.register_forward_hook(lambda module, inputs, output: calls.append(module))
    model(ids(1, 4))
    assert calls == [attention.qkv_proj, attention.pos_proj, attention.o_proj]


# ---------------------------------------------------------------------------------------------------------------------
# Bad input to generate() (rows of the reliability table)
# These tests run on one intra-op thread (`one_thread`, tests/conftest.py).

TWO_GREEDY_TOKENS = {"do_sample": False, "pad_token_id": 0, "max_new_tokens": 2}


def three_stream_memory(lm: TxlForCausalLM) -> TxlMemory:
    return memory_of(lm, batch=3)


GENERATE_CASES = [
    case(
        "generate",
        "prompt holding token id 97 (vocab_size 97)",
        ID_ERROR,
        ValueError,
        r"token id 97, outside the vocabulary \[0, 97\)",
        lambda lm: lm.generate(torch.tensor([[3, 97]]), **TWO_GREEDY_TOKENS),
        "prompt-id",
    ),
    case(
        "generate",
        "empty prompt [1, 0]",
        "ValueError: at least one token (IndexError inside transformers before)",
        ValueError,
        r"generate\(\) got an empty prompt \(input_ids of shape \(1, 0\)\): pass at least one token",
        lambda lm: lm.generate(ids(1, 0), **TWO_GREEDY_TOKENS),
        "prompt-empty",
    ),
    case(
        "generate",
        "1-D prompt",
        "ValueError asking for [batch, seq_len] (IndexError inside transformers before)",
        ValueError,
        r"input_ids must be \[batch, seq_len\], got shape \(5,\)",
        lambda lm: lm.generate(ids()[0], **TWO_GREEDY_TOKENS),
        "prompt-1d",
    ),
    case(
        "generate",
        "prompt as a Python list",
        "TypeError asking for a tensor",
        TypeError,
        "input_ids must be a torch.Tensor",
        lambda lm: lm.generate([[1, 2, 3]], **TWO_GREEDY_TOKENS),
        "prompt-list",
    ),
    case(
        "generate",
        "memory of 3 streams, 2 prompts",
        "ValueError naming both counts",
        ValueError,
        r"The memory holds 3 streams but generate\(\) got 2 sequences",
        lambda lm: lm.generate(ids(), past_key_values=three_stream_memory(lm), **TWO_GREEDY_TOKENS),
        "memory-batch",
    ),
    case(
        "generate",
        "memory of a 3-layer model",
        "ValueError naming both layer counts",
        ValueError,
        "The memory has 3 layers; this model has 2",
        lambda lm: lm.generate(ids(), past_key_values=memory_of(tiny_lm(n_layer=3)), **TWO_GREEDY_TOKENS),
        "memory-layers",
    ),
    case(
        "generate",
        "v4 mems tuple as past_key_values",
        "TypeError: a TxlMemory expected, convert v4 mems with TxlMemory.from_legacy",
        TypeError,
        r"past_key_values must be a TxlMemory .* got tuple\. Convert v4 `mems` with TxlMemory\.from_legacy",
        lambda lm: lm.generate(ids(), past_key_values=(torch.zeros(1),), **TWO_GREEDY_TOKENS),
        "memory-tuple",
    ),
    case(
        "generate",
        "attention_mask [2, 4] for a prompt [2, 5] (all ones)",
        "ValueError naming both shapes (transformers dropped an all-ones mask unchecked)",
        ValueError,
        r"attention_mask must be \[batch, seq_len\] and cover the prompt \(2, 5\), got \(2, 4\)",
        lambda lm: lm.generate(ids(), attention_mask=torch.ones(2, 4, dtype=torch.long), **TWO_GREEDY_TOKENS),
        "mask-shape",
    ),
    case(
        "generate",
        "max_new_tokens=0",
        "ValueError (transformers): must be greater than 0",
        ValueError,
        "`max_new_tokens` must be greater than 0, but is 0",
        lambda lm: lm.generate(ids(), do_sample=False, pad_token_id=0, max_new_tokens=0),
        "max-new-tokens-zero",
    ),
    case(
        "generate",
        "max_new_tokens=-5",
        "ValueError (transformers): must be greater than 0",
        ValueError,
        "`max_new_tokens` must be greater than 0, but is -5",
        lambda lm: lm.generate(ids(), do_sample=False, pad_token_id=0, max_new_tokens=-5),
        "max-new-tokens-negative",
    ),
    case(
        "generate",
        "max_new_tokens=2.5",
        "ValueError: an integer (3 tokens were generated before)",
        ValueError,
        "max_new_tokens must be an integer, got 2.5",
        lambda lm: lm.generate(ids(), do_sample=False, pad_token_id=0, max_new_tokens=2.5),
        "max-new-tokens-float",
    ),
    case(
        "generate",
        "eos_token_id=97 (vocab_size 97)",
        "ValueError: generation would never stop on it",
        ValueError,
        r"eos_token_id=97: 97 is not a token id of this model, \[0, 97\)\. Generation would never stop on it",
        lambda lm: lm.generate(ids(), eos_token_id=97, **TWO_GREEDY_TOKENS),
        "eos-out-of-vocab",
    ),
    case(
        "generate",
        "pad_token_id=-1",
        "ValueError naming the id and the vocabulary",
        ValueError,
        r"pad_token_id=-1: -1 is not a token id of this model, \[0, 97\)",
        lambda lm: lm.generate(ids(), do_sample=False, pad_token_id=-1, max_new_tokens=2),
        "pad-out-of-vocab",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), GENERATE_CASES)
@pytest.mark.usefixtures("one_thread")
def test_generate_refuses_bad_input(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))
