"""Bad input at every boundary gets one clear error naming what was wrong and what was expected.

The boundaries: the models' forward (`TxlModel`, `TxlForCausalLM`, `TxlForSequenceClassification`), `generate()`, the
memory (`TxlMemory`), `TxlStream`, `evaluate_stream`, `TxlConfig`, the package's tokenizers loaded with
`AutoTokenizer`, and the command lines evaluate, train_tokenizer, publish (`transfoxl.cli`) and
tools/bench_generate.py. Every case is a row of docs/reliability-table.md (`@pytest.mark.reliability`) and records
the message it got. A few inputs are accepted on purpose (documented settings, not mistakes); their rows say so.
"""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoTokenizer, DynamicCache

from tests.utils import tiny_config, tiny_lm
from tools import bench_generate
from transfoxl import TxlConfig, TxlForCausalLM, TxlForSequenceClassification, TxlMemory, TxlModel, TxlStream
from transfoxl.evaluation import evaluate_stream, evaluation_settings
from transfoxl.presets import config_from_preset
from transfoxl.tokenization.tokenization_txl import train_byte_level_bpe, train_char_level, train_word_level

pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py

VOCAB = 97  # tiny_config's vocabulary


def ids(batch: int = 2, length: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def expect_error(record_property: Callable, error: type[BaseException], match: str, call: Callable[[], object]) -> str:
    """Run `call`, require `error` matching `match`, and record its message as the row's outcome."""
    with pytest.raises(error, match=match) as exc_info:
        call()
    message = f"{exc_info.type.__name__}: {exc_info.value}"
    record_property("outcome", message)
    return message


def observe(call: Callable[[], object]) -> str:
    """What `call` does, in words: for the rows of cases not handled yet (xfail)."""
    try:
        result = call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return f"no error ({type(result).__name__} {result!r:.60})"


def case(area: str, name: str, expected: str, error: type[BaseException], match: str, call: Callable, id: str):
    """A parametrized row: `call` is run with the test's fixtures (see the tests below)."""
    return pytest.param(error, match, call, id=id, marks=pytest.mark.reliability(area, name, expected))


def memory_of(model: TxlForCausalLM, batch: int = 2, length: int = 5) -> TxlMemory:
    with torch.no_grad():
        return model(ids(batch, length), use_cache=True).past_key_values


# ---------------------------------------------------------------------------------------------------------------------
# The models' forward

ID_ERROR = "ValueError naming the id and the vocabulary size"

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
        "num_items_in_batch=0",
        "ValueError: > 0 (no inf/nan loss)",
        ValueError,
        r"num_items_in_batch must be > 0 .* got 0",
        lambda lm: lm(ids(), labels=ids(), num_items_in_batch=0),
        "num-items-zero",
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
def test_classifier_refuses_bad_labels(record_property, error, match, call) -> None:
    expect_error(record_property, error, match, call)


@pytest.mark.reliability(
    "model input",
    "left- and right-padded batch (attention_mask with zeros)",
    "accepted: the real tokens get the same log-probabilities as without padding",
)
@pytest.mark.parametrize("side", ["left", "right"])
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
def test_memory_errors_name_what_differs(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))


@pytest.mark.reliability(
    "memory", "TxlMemory(num_layers=2, mem_len=2.5) / mem_len='4' / mem_len=True", "ValueError: integers expected"
)
@pytest.mark.parametrize("mem_len", [2.5, "4", True], ids=["float", "str", "bool"])
def test_memory_lengths_must_be_integers(record_property, mem_len) -> None:
    record_property("outcome", f"mem_len={mem_len!r}: {observe(lambda: TxlMemory(2, mem_len))}")
    expect_error(record_property, ValueError, "mem_len", lambda: TxlMemory(2, mem_len))


# ---------------------------------------------------------------------------------------------------------------------
# generate()

GREEDY = {"do_sample": False, "pad_token_id": 0, "max_new_tokens": 2}


def three_stream_memory(lm: TxlForCausalLM) -> TxlMemory:
    return memory_of(lm, batch=3)


GENERATE_CASES = [
    case(
        "generate",
        "prompt holding token id 97 (vocab_size 97)",
        ID_ERROR,
        ValueError,
        r"token id 97, outside the vocabulary \[0, 97\)",
        lambda lm: lm.generate(torch.tensor([[3, 97]]), **GREEDY),
        "prompt-id",
    ),
    case(
        "generate",
        "empty prompt [1, 0]",
        "ValueError: at least one token (IndexError inside transformers before)",
        ValueError,
        r"generate\(\) got an empty prompt \(input_ids of shape \(1, 0\)\): pass at least one token",
        lambda lm: lm.generate(ids(1, 0), **GREEDY),
        "prompt-empty",
    ),
    case(
        "generate",
        "1-D prompt",
        "ValueError asking for [batch, seq_len] (IndexError inside transformers before)",
        ValueError,
        r"input_ids must be \[batch, seq_len\], got shape \(5,\)",
        lambda lm: lm.generate(ids()[0], **GREEDY),
        "prompt-1d",
    ),
    case(
        "generate",
        "prompt as a Python list",
        "TypeError asking for a tensor",
        TypeError,
        "input_ids must be a torch.Tensor",
        lambda lm: lm.generate([[1, 2, 3]], **GREEDY),
        "prompt-list",
    ),
    case(
        "generate",
        "memory of 3 streams, 2 prompts",
        "ValueError naming both counts",
        ValueError,
        r"The memory holds 3 streams but generate\(\) got 2 sequences",
        lambda lm: lm.generate(ids(), past_key_values=three_stream_memory(lm), **GREEDY),
        "memory-batch",
    ),
    case(
        "generate",
        "memory of a 3-layer model",
        "ValueError naming both layer counts",
        ValueError,
        "The memory has 3 layers; this model has 2",
        lambda lm: lm.generate(ids(), past_key_values=memory_of(tiny_lm(n_layer=3)), **GREEDY),
        "memory-layers",
    ),
    case(
        "generate",
        "v4 mems tuple as past_key_values",
        "ValueError (transformers): use a Cache",
        ValueError,
        "Passing a tuple of `past_key_values` is not supported anymore",
        lambda lm: lm.generate(ids(), past_key_values=(torch.zeros(1),), **GREEDY),
        "memory-tuple",
    ),
    case(
        "generate",
        "attention_mask [2, 4] for a prompt [2, 5] (all ones)",
        "ValueError naming both shapes (transformers dropped an all-ones mask unchecked)",
        ValueError,
        r"attention_mask must be \[batch, seq_len\] and cover the prompt \(2, 5\), got \(2, 4\)",
        lambda lm: lm.generate(ids(), attention_mask=torch.ones(2, 4, dtype=torch.long), **GREEDY),
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
        lambda lm: lm.generate(ids(), eos_token_id=97, **GREEDY),
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
def test_generate_refuses_bad_input(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))


# ---------------------------------------------------------------------------------------------------------------------
# TxlStream

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
        r"expected ids of shape \[T\] or \[1, T\] \(one row per stream\), got \(2, 3\)",
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
def test_stream_refuses_bad_input(lm, record_property, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(lm))


@pytest.mark.reliability(
    "streaming",
    "feed([1, 2, 3, 4, 97, 5]) with vocab_size 97 (segments of 4)",
    "ValueError at feed time naming the id; the stream keeps only what came before it",
)
def test_a_bad_id_is_refused_when_fed_and_leaves_the_stream_usable(lm, record_property) -> None:
    stream = TxlStream(lm, segment_len=4)
    expect_error(
        record_property,
        ValueError,
        r"token id 97 is outside the vocabulary \[0, 97\)",
        lambda: stream.feed([1, 2, 3, 4, 97, 5]),
    )
    # Before, 97 waited in `pending` and failed at some later generate(), for good.
    assert stream.tokens_seen == 4 and torch.equal(stream.pending, torch.tensor([[1, 2, 3, 4]]))
    assert stream.generate([6], max_new_tokens=2, do_sample=False).shape == (1, 2)


# ---------------------------------------------------------------------------------------------------------------------
# evaluate_stream / evaluation_settings

STREAM = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(0))

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


# ---------------------------------------------------------------------------------------------------------------------
# TxlConfig

CONFIG = {"vocab_size": 100, "cutoffs": [20, 50], "d_model": 32, "d_embed": 32, "n_head": 4, "d_head": 8, "n_layer": 1}


def config_case(name: str, overrides: dict, match: str, id: str, expected: str = "ValueError naming the field"):
    return case("config", name, expected, ValueError, match, lambda: TxlConfig(**{**CONFIG, **overrides}), id)


CONFIG_CASES = [
    config_case(
        "cutoffs [50, 20] (not increasing)",
        {"cutoffs": [50, 20]},
        r"`cutoffs` must be strictly increasing, got \[50, 20\]",
        "cutoffs-order",
    ),
    config_case(
        "cutoffs [20, 100] with vocab_size 100",
        {"cutoffs": [20, 100]},
        r"`cutoffs` must lie strictly between 0 and vocab_size=100, got \[20, 100\]",
        "cutoffs-vocab",
    ),
    config_case(
        "cutoffs [0, 20]",
        {"cutoffs": [0, 20]},
        "`cutoffs` must lie strictly between 0 and vocab_size=100",
        "cutoffs-zero",
    ),
    config_case(
        "cutoffs [20.5, 50] (silently truncated to 20 before)",
        {"cutoffs": [20.5, 50]},
        r"`cutoffs` must be a list of integer token ids .* got \[20.5, 50\]",
        "cutoffs-float",
    ),
    config_case(
        "cutoffs=20 (TypeError: not iterable, before)",
        {"cutoffs": 20},
        r"`cutoffs` must be a list of integer token ids .* got 20",
        "cutoffs-int",
    ),
    config_case("div_val 0", {"div_val": 0}, "`div_val` must be an integer >= 1, got 0", "div-val"),
    config_case("mem_len -1", {"mem_len": -1}, "`mem_len` must be an integer >= 0, got -1", "mem-len"),
    config_case("mem_len 2.5", {"mem_len": 2.5}, "`mem_len` must be an integer >= 0, got 2.5", "mem-len-float"),
    config_case(
        "clamp_len 2.5",
        {"clamp_len": 2.5},
        r"`clamp_len` must be an integer \(0 or less: no clamping\)",
        "clamp-len-float",
    ),
    config_case("dropout 1.0", {"dropout": 1.0}, r"`dropout` must be a probability in \[0, 1\), got 1.0", "dropout"),
    config_case(
        "dropatt -0.1", {"dropatt": -0.1}, r"`dropatt` must be a probability in \[0, 1\), got -0.1", "dropatt"
    ),
    config_case(
        "d_model 33 (odd: the sinusoid pairs sin and cos)",
        {"d_model": 33, "d_embed": 32},
        "`d_model` must be even",
        "d-model-odd",
    ),
    config_case("n_layer 0", {"n_layer": 0}, "`n_layer` must be an integer >= 1, got 0", "n-layer"),
    config_case(
        "vocab_size 0", {"vocab_size": 0, "cutoffs": []}, "`vocab_size` must be an integer >= 1, got 0", "vocab-size"
    ),
    config_case(
        "d_embed 8, div_val 4, 3 clusters (last width 0)",
        {"d_embed": 8, "div_val": 4},
        "gives the last of 3 clusters an embedding of width 0",
        "cluster-width",
    ),
    config_case(
        "layer_norm_epsilon 'a' (TypeError before)",
        {"layer_norm_epsilon": "a"},
        "`layer_norm_epsilon` must be > 0, got 'a'",
        "layer-norm-eps",
    ),
    config_case(
        "init_std -1 (RuntimeError in torch's init before)",
        {"init_std": -1.0},
        "`init_std` must be a number >= 0",
        "init-std",
    ),
    config_case(
        "pre_lnorm 'no' (truthy: silently pre-LN before)",
        {"pre_lnorm": "no"},
        "`pre_lnorm` must be a bool, got 'no'",
        "pre-lnorm",
    ),
    config_case(
        "tie_word_embeddings 'no' (bool('no') was True before)",
        {"tie_word_embeddings": "no"},
        "`tie_word_embeddings` must be a bool, got 'no'",
        "tie-word-embeddings",
    ),
    config_case(
        "tie_projs [True] for 3 clusters",
        {"tie_projs": [True]},
        r"`tie_projs` needs one entry per cluster \(len\(cutoffs\) \+ 1 = 3\)",
        "tie-projs-length",
    ),
    config_case(
        "tie_projs ['a', None, 1]",
        {"tie_projs": ["a", None, 1]},
        "`tie_projs` must be a list of bools",
        "tie-projs-values",
    ),
    config_case("num_labels 0", {"num_labels": 0}, "`num_labels` must be an integer >= 1, got 0", "num-labels"),
    config_case(
        "eos_token_id 100 with vocab_size 100",
        {"eos_token_id": 100},
        r"`eos_token_id` must be None or a token id in \[0, 100\), got 100",
        "eos",
    ),
    config_case(
        "memory_init 'random'",
        {"memory_init": "random"},
        r"`memory_init` must be one of \('empty', 'zeros'\), got 'random'",
        "memory-init",
    ),
    config_case("attn_type 2 (legacy)", {"attn_type": 2}, "attn_type=2 is not supported", "attn-type"),
    case(
        "config",
        "attn_implementation='flash_attention_2'",
        "ValueError (transformers): not supported",
        ValueError,
        "does not support Flash Attention 2",
        lambda: TxlForCausalLM._from_config(tiny_config(), attn_implementation="flash_attention_2"),
        "flash",
    ),
    case(
        "config",
        "attn_implementation='bogus'",
        "ValueError (transformers) listing eager and sdpa",
        ValueError,
        'Specified `attn_implementation="bogus"` is not supported',
        lambda: TxlForCausalLM._from_config(tiny_config(), attn_implementation="bogus"),
        "bogus-attention",
    ),
]


@pytest.mark.parametrize(("error", "match", "call"), CONFIG_CASES)
def test_config_refuses_settings_that_make_no_sense(record_property, error, match, call) -> None:
    expect_error(record_property, error, match, call)


@pytest.mark.reliability(
    "config",
    "n_head * d_head (3 x 5) != d_model (32)",
    "accepted: as in the paper's code, the heads' output is projected back to d_model",
)
def test_heads_need_not_multiply_to_d_model(record_property) -> None:
    model = tiny_lm(n_head=3, d_head=5)
    loss = model(ids(), labels=ids()).loss
    loss.backward()
    assert torch.isfinite(loss)
    record_property("outcome", f"accepted: forward and backward run, loss {loss.item():.3f}")


@pytest.mark.reliability("config", "clamp_len -5", "accepted: documented (and v4's) value for no clamping")
def test_negative_clamp_len_means_no_clamping(record_property) -> None:
    unclamped, negative = tiny_lm(clamp_len=0), tiny_lm(clamp_len=-5)
    with torch.no_grad():
        difference = (unclamped(ids()).logits - negative(ids()).logits).abs().max().item()
    assert difference == 0
    record_property("outcome", "accepted: the same outputs as clamp_len 0 (no clamping)")


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizers (loaded with AutoTokenizer, as users do)

TEXT = ["the cat sat on the mat", "a dog ran", "the end"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("tokenizers")
    trained = {
        "word": train_word_level(TEXT),
        "char": train_char_level(TEXT),
        "bpe": train_byte_level_bpe(TEXT * 5, vocab_size=300),
    }
    loaded = {}
    for kind, tokenizer in trained.items():
        tokenizer.save_pretrained(folder / kind)
        loaded[kind] = AutoTokenizer.from_pretrained(folder / kind)
    return loaded


KINDS = ["word", "char", "bpe"]
KIND_NAMES = {"word": "word-level", "char": "character-level", "bpe": "byte-level BPE"}

NON_TEXT = [  # (case, expected, error, message, call, id)
    (
        "encode(None)",
        "ValueError (transformers) listing the accepted types",
        ValueError,
        "text input must be of type `str`",
        lambda tokenizer: tokenizer.encode(None),
        "encode-none",
    ),
    (
        "encode(5)",
        "ValueError (transformers) listing the accepted types",
        ValueError,
        "text input must be of type `str`",
        lambda tokenizer: tokenizer.encode(5),
        "encode-int",
    ),
    (
        "tokenizer(None)",
        "ValueError (transformers): text is needed",
        ValueError,
        "You need to specify either `text` or `text_target`",
        lambda tokenizer: tokenizer(None),
        "call-none",
    ),
    (
        "tokenizer(['a', None])",
        "TypeError (tokenizers) naming the accepted input",
        TypeError,
        "TextEncodeInput must be",
        lambda tokenizer: tokenizer(["a", None]),
        "batch-with-none",
    ),
]
TOKENIZER_CASES = [
    pytest.param(
        kind,
        error,
        match,
        call,
        id=f"{kind}-{id}",
        marks=pytest.mark.reliability("tokenizer", f"{KIND_NAMES[kind]} tokenizer: {name}", expected),
    )
    for name, expected, error, match, call, id in NON_TEXT
    for kind in KINDS
]


@pytest.mark.parametrize(("kind", "error", "match", "call"), TOKENIZER_CASES)
def test_tokenizers_refuse_non_text(tokenizers, record_property, kind, error, match, call) -> None:
    expect_error(record_property, error, match, lambda: call(tokenizers[kind]))


@pytest.mark.reliability(
    "tokenizer", "decode of an id past the vocabulary / of id -1", "ValueError naming the id and the vocabulary size"
)
@pytest.mark.xfail(
    strict=True,
    reason="transformers' TokenizersBackend, which AutoTokenizer returns so that saved folders load without this "
    "package, drops an unknown id in decode and raises OverflowError for -1; a checking subclass would have to be "
    "named in tokenizer_config.json, and folders would then need this package to load.",
)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("offset", [0, -1], ids=["past-the-end", "minus-one"])
def test_tokenizers_refuse_ids_outside_the_vocabulary(tokenizers, record_property, kind, offset) -> None:
    tokenizer = tokenizers[kind]
    bad = len(tokenizer) + 5 if offset == 0 else -1
    record_property("outcome", f"{kind}, decode([1, {bad}]): {observe(lambda: tokenizer.decode([1, bad]))}")
    expect_error(record_property, ValueError, rf"{bad}.*{len(tokenizer)}", lambda: tokenizer.decode([1, bad]))


# ---------------------------------------------------------------------------------------------------------------------
# Command lines


def cli_error(main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 2):
    """The last line of stderr of a `main(argv)` that fails with exit status `code` (argparse's is 2)."""
    with pytest.raises(SystemExit) as exit_info:
        result = main(argv)
        raise SystemExit(result)  # a main() that returns its status instead of exiting
    assert exit_info.value.code == code, capsys.readouterr()
    err = capsys.readouterr().err.strip()
    return err.splitlines()[-1] if err else ""


def expect_cli_error(record_property, main, argv, capsys, *fragments: str, code: int = 2) -> None:
    message = cli_error(main, argv, capsys, code)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    record_property("outcome", f"exit {code}: {message}")


@pytest.fixture(scope="module")
def scripts() -> dict[str, ModuleType]:
    return {
        name: importlib.import_module(f"transfoxl.cli.{name}") for name in ("evaluate", "train_tokenizer", "publish")
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny model (tgt_len 8, mem_len 8) with its character tokenizer, and texts next to it."""
    root = tmp_path_factory.mktemp("cli")
    tokenizer = train_char_level(["the cat sat on the mat\n"])
    torch.manual_seed(0)
    model = TxlForCausalLM(config_from_preset("tiny", len(tokenizer), tgt_len=8, mem_len=8))
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "ok.txt").write_text("the cat sat on the mat\n" * 20, encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "blank.txt").write_text("\n  \n\n", encoding="utf-8")
    (root / "short.txt").write_text("cat\n", encoding="utf-8")
    (root / "binary.txt").write_bytes(b"\xff\xfe\x00\x01binary")
    return root / "model"


def evaluate_argv(model_dir: Path, *options: str) -> list[str]:
    root = model_dir.parent
    return [
        str(model_dir),
        "--cache-dir",
        str(root / "cache"),
        "--output",
        str(root / "out"),
        "--no-progress",
        *options,
    ]


EVALUATE_CASES = [
    pytest.param(
        ["--tgt-len", "0"],
        ["--tgt-len must be >= 1, got 0"],
        id="tgt-len",
        marks=pytest.mark.reliability("evaluate.py", "--tgt-len 0", "exit 2 naming --tgt-len"),
    ),
    pytest.param(
        ["--batch-size", "-1"],
        ["--batch-size must be >= 1, got -1"],
        id="batch-size",
        marks=pytest.mark.reliability("evaluate.py", "--batch-size -1", "exit 2 naming --batch-size"),
    ),
    pytest.param(
        ["--max-tokens", "-5"],
        ["--max-tokens must be >= 2", "got -5"],
        id="max-tokens",
        marks=pytest.mark.reliability("evaluate.py", "--max-tokens -5", "exit 2 naming --max-tokens"),
    ),
    pytest.param(
        ["--mem-len", "0,-4"],
        ["memory lengths must be >= 0", "got -4"],
        id="mem-len",
        marks=pytest.mark.reliability("evaluate.py", "--mem-len 0,-4", "exit 2 naming --mem-len"),
    ),
    pytest.param(
        ["--test-file", "{root}/missing.txt"],
        ["--test-file", "missing.txt: no such file"],
        id="missing",
        marks=pytest.mark.reliability(
            "evaluate.py", "--test-file that does not exist", "exit 2 naming the option and the file"
        ),
    ),
    pytest.param(
        ["--test-file", "{root}/empty.txt"],
        ["empty.txt", "is empty", "hold no text"],
        id="empty",
        marks=pytest.mark.reliability("evaluate.py", "--test-file of 0 bytes", "exit 2: the split is empty"),
    ),
    pytest.param(
        ["--test-file", "{root}/short.txt"],
        ["--split test", "The stream of 4 tokens is too short"],
        id="too-short",
        marks=pytest.mark.reliability(
            "evaluate.py", "--test-file of 4 tokens for segments of 8", "exit 2: too short, with the numbers"
        ),
    ),
    pytest.param(
        ["--test-file", "{root}/binary.txt"],
        ["binary.txt", "UnicodeDecodeError", "is it UTF-8 text?"],
        id="binary",
        marks=pytest.mark.reliability(
            "evaluate.py",
            "--test-file holding binary bytes",
            "exit 2 naming the file and the decoding error (DatasetGenerationError trace before)",
        ),
    ),
]


@pytest.mark.parametrize(("options", "fragments"), EVALUATE_CASES)
def test_evaluate_script_errors(scripts, model_dir, capsys, record_property, options, fragments) -> None:
    options = [option.format(root=model_dir.parent) for option in options]
    expect_cli_error(record_property, scripts["evaluate"].main, evaluate_argv(model_dir, *options), capsys, *fragments)


@pytest.mark.reliability(
    "evaluate.py", "MODEL_DIR that does not exist / has no weights", "exit 2 naming MODEL_DIR and what is missing"
)
def test_evaluate_script_model_folder_errors(scripts, model_dir, tmp_path, capsys, record_property) -> None:
    main = scripts["evaluate"].main
    missing = cli_error(main, evaluate_argv(tmp_path / "nowhere"), capsys)
    assert "MODEL_DIR" in missing and "is not a folder" in missing
    no_weights = Path(shutil.copytree(model_dir, tmp_path / "model"))
    (no_weights / "model.safetensors").unlink()
    message = cli_error(main, evaluate_argv(no_weights), capsys)
    assert "has no weights" in message
    record_property("outcome", f"exit 2: {missing} / {message}")


@pytest.fixture
def tokenizer_argv(model_dir: Path, tmp_path: Path) -> Callable[..., list[str]]:
    def argv(kind: str, text_file: str = "ok.txt", *options: str) -> list[str]:
        return [
            "--kind",
            kind,
            "--text-file",
            str(model_dir.parent / text_file),
            "--out",
            str(tmp_path / "tok"),
            "--no-progress",
            *options,
        ]

    return argv


TRAIN_TOKENIZER_CASES = [
    pytest.param(
        ("word", "missing.txt"),
        2,
        ["--text-file", "missing.txt: no such file"],
        id="missing",
        marks=pytest.mark.reliability(
            "train_tokenizer.py",
            "--text-file that does not exist",
            "exit 2 naming the option (a bare OSError line, exit 1, before)",
        ),
    ),
    pytest.param(
        ("word", "."),
        2,
        ["--text-file", "is a folder, not a file"],
        id="folder",
        marks=pytest.mark.reliability("train_tokenizer.py", "--text-file naming a folder", "exit 2 naming the option"),
    ),
    pytest.param(
        ("word", "empty.txt"),
        1,
        ["empty.txt holds no text", "nothing to train on"],
        id="empty",
        marks=pytest.mark.reliability(
            "train_tokenizer.py",
            "--text-file of 0 bytes",
            "exit 1: no text (a tokenizer of special tokens only was saved before)",
        ),
    ),
    pytest.param(
        ("char", "blank.txt"),
        1,
        ["blank.txt holds no text"],
        id="blank",
        marks=pytest.mark.reliability("train_tokenizer.py", "--text-file of blank lines only", "exit 1: no text"),
    ),
    pytest.param(
        ("bpe", "binary.txt", "--vocab-size", "300"),
        1,
        ["binary.txt is not UTF-8 text"],
        id="binary",
        marks=pytest.mark.reliability(
            "train_tokenizer.py", "--text-file holding binary bytes", "exit 1 naming the file as not UTF-8"
        ),
    ),
    pytest.param(
        ("word", "ok.txt", "--vocab-size", "0"),
        2,
        ["--vocab-size must be >= 1 for --kind word, got 0"],
        id="vocab-size-zero",
        marks=pytest.mark.reliability(
            "train_tokenizer.py", "--vocab-size 0 (word)", "exit 2 (specials-only vocabulary before)"
        ),
    ),
    pytest.param(
        ("char", "ok.txt", "--vocab-size", "-5"),
        2,
        ["--vocab-size must be >= 1 for --kind char, got -5"],
        id="vocab-size-negative",
        marks=pytest.mark.reliability("train_tokenizer.py", "--vocab-size -5 (char)", "exit 2 (accepted before)"),
    ),
    pytest.param(
        ("bpe", "ok.txt", "--vocab-size", "10"),
        2,
        ["--vocab-size must be >= 258 for --kind bpe"],
        id="vocab-size-bpe",
        marks=pytest.mark.reliability(
            "train_tokenizer.py", "--vocab-size 10 (bpe)", "exit 2 naming the minimum, 256 bytes + 2"
        ),
    ),
    pytest.param(
        ("bpe", "ok.txt", "--min-freq", "-1"),
        2,
        ["--min-freq must be >= 1", "got -1"],
        id="min-freq",
        marks=pytest.mark.reliability(
            "train_tokenizer.py", "--min-freq -1 (bpe)", "exit 2 (OverflowError inside tokenizers before)"
        ),
    ),
    pytest.param(
        ("word", "ok.txt", "--min-freq", "1000"),
        1,
        ["no word of", "occurs --min-freq 1000 times"],
        id="min-freq-too-high",
        marks=pytest.mark.reliability(
            "train_tokenizer.py",
            "--min-freq 1000 on a small text",
            "exit 1: the vocabulary would hold only special tokens (saved before)",
        ),
    ),
    pytest.param(
        ("char", "ok.txt", "--lower-case"),
        2,
        ["--lower-case applies to --kind word only"],
        id="lower-case",
        marks=pytest.mark.reliability(
            "train_tokenizer.py", "--lower-case with --kind char", "exit 2 (silently ignored before)"
        ),
    ),
]


@pytest.mark.parametrize(("argv", "code", "fragments"), TRAIN_TOKENIZER_CASES)
def test_train_tokenizer_script_errors(scripts, tokenizer_argv, capsys, record_property, argv, code, fragments):
    kind, text_file, *options = argv
    main = scripts["train_tokenizer"].main
    expect_cli_error(record_property, main, tokenizer_argv(kind, text_file, *options), capsys, *fragments, code=code)


@pytest.mark.reliability("train_tokenizer.py", "--out naming an existing file", "exit 2 naming --out")
def test_train_tokenizer_script_refuses_a_file_as_output(scripts, model_dir, capsys, record_property) -> None:
    argv = [
        "--kind",
        "word",
        "--text-file",
        str(model_dir.parent / "ok.txt"),
        "--out",
        str(model_dir.parent / "ok.txt"),
    ]
    expect_cli_error(record_property, scripts["train_tokenizer"].main, argv, capsys, "exists and is not a folder")


@pytest.fixture
def run_dir(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the saved model folder that a test may change (what publish.py reads)."""
    return Path(shutil.copytree(model_dir, tmp_path / "run"))


def edit_config(run_dir: Path, **changes: object) -> None:
    config = json.loads((run_dir / "config.json").read_text())
    config.update(changes)
    (run_dir / "config.json").write_text(json.dumps(config))


def publish_argv(run_dir: Path, *options: str) -> list[str]:
    return [str(run_dir), "--repo-id", "org/txl", "--dry-run", "--dry-run-dir", str(run_dir.parent / "dry"), *options]


@pytest.mark.reliability("publish.py", "--commit-message ''", "exit 2 asking for a message")
def test_publish_refuses_an_empty_commit_message(scripts, run_dir, capsys, record_property) -> None:
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(run_dir, "--commit-message", " "),
        capsys,
        "--commit-message: expected a message",
    )


@pytest.mark.reliability(
    "publish.py", "RUN_DIR whose config.json is a BERT config", "exit 2 naming the model_type (published as is before)"
)
def test_publish_refuses_another_model_type(scripts, run_dir, capsys, record_property) -> None:
    edit_config(run_dir, model_type="bert")
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(run_dir),
        capsys,
        "model_type 'bert' is not a Transformer-XL model",
    )


@pytest.mark.reliability(
    "publish.py",
    "RUN_DIR whose config.json has mem_len -1",
    "exit 2 naming the field (a repository nobody could load was published before)",
)
def test_publish_refuses_an_invalid_config(scripts, run_dir, capsys, record_property) -> None:
    edit_config(run_dir, mem_len=-1)
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(run_dir),
        capsys,
        "is not a valid Transformer-XL config",
        "`mem_len` must be an integer >= 0, got -1",
    )


@pytest.mark.reliability(
    "publish.py",
    "tokenizer with more tokens than the model's vocab_size",
    "exit 2: vocabulary mismatch, with both sizes",
)
def test_publish_refuses_a_tokenizer_larger_than_the_model(scripts, run_dir, capsys, record_property) -> None:
    config = json.loads((run_dir / "config.json").read_text())
    smaller = config["vocab_size"] - 1
    edit_config(run_dir, vocab_size=smaller)
    expect_cli_error(
        record_property,
        scripts["publish"].main,
        publish_argv(run_dir),
        capsys,
        "vocabulary mismatch",
        f"the model's vocab_size is {smaller}",
    )


BENCH_CASES = [
    pytest.param(
        ["--batch-sizes", "1", "0"],
        ["--batch-sizes must all be >= 1, got [1, 0]"],
        id="batch-sizes",
        marks=pytest.mark.reliability(
            "bench_generate.py",
            "--batch-sizes 1 0",
            "exit 2 naming the option (a generate() error deep in the run before)",
        ),
    ),
    pytest.param(
        ["--new-tokens", "-3"],
        ["--new-tokens must be >= 1, got -3"],
        id="new-tokens",
        marks=pytest.mark.reliability("bench_generate.py", "--new-tokens -3", "exit 2 naming the option"),
    ),
    pytest.param(
        ["--out", "{tmp}"],
        ["is a folder; expected a path stem"],
        id="out-folder",
        marks=pytest.mark.reliability(
            "bench_generate.py", "--out naming a folder", "exit 2 before the benchmark runs (after it, before)"
        ),
    ),
]


@pytest.mark.parametrize(("options", "fragments"), BENCH_CASES)
def test_bench_generate_script_errors(tmp_path, capsys, record_property, options, fragments) -> None:
    options = [option.format(tmp=tmp_path) for option in [*options, "--skip-v4"]]
    expect_cli_error(record_property, bench_generate.main, options, capsys, *fragments)
