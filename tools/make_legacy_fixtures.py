"""Record reference outputs of the old transformers-v4 Transformer-XL as test fixtures.

For each small configuration in `FIXTURES` this builds a seeded `TransfoXLLMHeadModel` from transformers 4.37.2,
perturbs every parameter so biases and cluster parameters are non-zero, saves it the ways v4 users saved it
(`model.safetensors`, `pytorch_model.bin`, and for one fixture the pre-1.6 torch pickle format), and records what
v4 returned for fixed inputs in `reference.safetensors` (tensors) and `reference.json` (metadata and a
description of every tensor key). The tests of this package load these files; they never import transformers v4.

This script is run by hand in a throwaway virtualenv with transformers==4.37.2 (the last release that ships
TransfoXL under `models/deprecated`), never in CI. From the repository root:

    python3.11 -m venv /tmp/venv-v4
    /tmp/venv-v4/bin/pip install torch==2.13.0
    /tmp/venv-v4/bin/pip install transformers==4.37.2 sacremoses safetensors
    /tmp/venv-v4/bin/python tools/make_legacy_fixtures.py            # writes tests/fixtures/legacy/
    /tmp/venv-v4/bin/python tools/make_legacy_fixtures.py --out DIR  # or somewhere else

The output is deterministic: running it twice writes byte-identical files, except
`legacy_format/pytorch_model.bin`, whose pre-1.6 writer names storages by memory address (same tensors, other bytes).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors
import safetensors.torch
import torch

if __package__:  # imported, or run with `python -m tools.make_legacy_fixtures`
    from . import v4
else:  # run as a file, `python tools/make_legacy_fixtures.py`: its folder is the first entry of sys.path
    import v4

if TYPE_CHECKING:  # transformers 4.x, imported by main() once the options are parsed (v4.import_transformers)
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

transformers: Any = None  # set by main(): transformers 4.x, the module holding TransfoXLConfig / TransfoXLLMHeadModel

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "legacy"

BATCH_SIZE = 2
SEGMENT_LEN = 5
NUM_SEGMENTS = 3
LONG_LEN = 9  # longer than mem_len, so the returned mems are a strict suffix of the layer inputs
PROMPT_LEN = 4
MAX_NEW_TOKENS = 8
PARAM_NOISE_STD = 0.02
IGNORE_INDEX = -100
# (batch, position) pairs set to IGNORE_INDEX in the `masked.*` case
MASKED_POSITIONS = ((0, 2), (1, 3))

# Shared by every fixture: tiny, so the whole tree stays far below 2 MB.
COMMON_CONFIG: dict[str, Any] = {
    "n_layer": 2,
    "n_head": 2,
    "d_head": 8,
    "d_inner": 32,
    "mem_len": 6,
    "dropout": 0.1,  # recorded in config.json only; the model runs in eval mode
    "dropatt": 0.0,
}


@dataclass(frozen=True)
class FixtureSpec:
    name: str
    seed: int
    description: str
    config: dict[str, Any]
    # expected_proj_ties[i] = j means crit.out_projs[i] must be the same Parameter as word_emb.emb_projs[j]
    expected_proj_ties: dict[int, int] = field(default_factory=dict)
    write_legacy_format: bool = False


FIXTURES: tuple[FixtureSpec, ...] = (
    FixtureSpec(
        name="adaptive_div2",
        seed=1001,
        description="Adaptive input/softmax with div_val 2 (three clusters of shrinking width), only the middle "
        "projection tied, per-layer r biases, post-LN.",
        config={
            "vocab_size": 100,
            "cutoffs": [20, 50],
            "div_val": 2,
            "d_model": 32,
            "d_embed": 32,
            "tie_projs": [False, True, False],
            "untie_r": True,
            "pre_lnorm": False,
            "same_length": False,
            "clamp_len": -1,
        },
        expected_proj_ties={1: 1},
        write_legacy_format=True,
    ),
    FixtureSpec(
        name="preln_samelen_clamp_shared_r",
        seed=1002,
        description="Pre-LN, same_length attention, clamp_len 3, r biases shared by all layers; div_val 1 with "
        "d_model == d_embed, so there are no projections at all (crit.out_projs holds None).",
        config={
            "vocab_size": 80,
            "cutoffs": [30],
            "div_val": 1,
            "d_model": 32,
            "d_embed": 32,
            "pre_lnorm": True,
            "same_length": True,
            "clamp_len": 3,
            "untie_r": False,
        },
    ),
    FixtureSpec(
        name="no_cutoffs_dembed",
        seed=1003,
        description="No cutoffs (plain softmax), d_embed 24 < d_model 32 so the embedding is projected; "
        "tie_projs forced to [True] to exercise v4's div_val == 1 projection tying.",
        config={
            "vocab_size": 60,
            "cutoffs": [],
            "div_val": 1,
            "d_model": 32,
            "d_embed": 24,
            # v4 turns this into tie_projs == [False]; the explicit tie_projs below overrides it
            "proj_share_all_but_first": True,
            "tie_projs": [True],
            "untie_r": True,
            "same_length": False,
            "clamp_len": -1,
        },
        expected_proj_ties={0: 0},
    ),
    FixtureSpec(
        name="div1_dembed_mixed_untied_emb",
        seed=1004,
        description="div_val 1 with d_embed 16 and one cutoff: the tail projection is tied to the single "
        "embedding projection, the head one is not; output embedding untied from the input embedding; "
        "shared r biases; same_length with a clamp_len larger than any distance.",
        config={
            "vocab_size": 90,
            "cutoffs": [40],
            "div_val": 1,
            "d_model": 32,
            "d_embed": 16,
            "tie_projs": [False, True],
            "tie_word_embeddings": False,
            "untie_r": False,
            "same_length": True,
            "clamp_len": 1000,
        },
        expected_proj_ties={1: 0},
    ),
)


def build_model(spec: FixtureSpec) -> TransfoXLLMHeadModel:
    """Seeded v4 model with every parameter nudged away from its init (biases and cluster params start at 0)."""
    torch.manual_seed(spec.seed)
    config = transformers.TransfoXLConfig(**COMMON_CONFIG, **spec.config)
    model = transformers.TransfoXLLMHeadModel(config)
    with torch.no_grad():
        # parameters() yields each tied Parameter once, so tied pairs get the same noise and stay tied
        for param in model.parameters():
            param.add_(torch.randn_like(param) * PARAM_NOISE_STD)
    model.eval()
    # v4 returns per-token losses grouped by cluster unless keep_order is set; it is not saved in config.json
    model.crit.keep_order = True
    return model


def describe_ties(model: TransfoXLLMHeadModel) -> dict[str, Any]:
    """Which output-side parameters are the very same objects as input-side ones (found by identity)."""
    emb = model.transformer.word_emb
    proj_ties: dict[str, str] = {}
    for i, out_proj in enumerate(model.crit.out_projs):
        tied_to = "untied"
        for j, emb_proj in enumerate(emb.emb_projs):
            if out_proj is not None and out_proj is emb_proj:
                tied_to = f"transformer.word_emb.emb_projs.{j}"
        proj_ties[f"crit.out_projs.{i}"] = tied_to if out_proj is not None else "None (no projection)"
    layer_ties = {
        f"crit.out_layers.{i}.weight": (
            f"transformer.word_emb.emb_layers.{i}.weight"
            if i < len(emb.emb_layers) and out_layer.weight is emb.emb_layers[i].weight
            else "untied"
        )
        for i, out_layer in enumerate(model.crit.out_layers)
    }
    shared_r_bias = not model.config.untie_r and all(
        layer.dec_attn.r_w_bias is model.transformer.r_w_bias and layer.dec_attn.r_r_bias is model.transformer.r_r_bias
        for layer in model.transformer.layers
    )
    return {"out_projs": proj_ties, "out_layers": layer_ties, "r_bias_shared_across_layers": shared_r_bias}


def check_ties(model: TransfoXLLMHeadModel, spec: FixtureSpec) -> None:
    emb = model.transformer.word_emb
    for i, out_proj in enumerate(model.crit.out_projs):
        expected = spec.expected_proj_ties.get(i)
        if expected is not None:
            assert out_proj is emb.emb_projs[expected], f"{spec.name}: out_projs[{i}] should be emb_projs[{expected}]"
        else:
            assert all(out_proj is not p for p in emb.emb_projs), f"{spec.name}: out_projs[{i}] should be untied"
    tie_embeddings = model.config.tie_word_embeddings
    for out_layer, emb_layer in zip(model.crit.out_layers, emb.emb_layers, strict=True):
        assert (out_layer.weight is emb_layer.weight) == tie_embeddings, f"{spec.name}: out_layers tying"
    if not model.config.untie_r:
        assert describe_ties(model)["r_bias_shared_across_layers"], f"{spec.name}: r biases should be shared"


def random_ids(generator: torch.Generator, vocab_size: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=generator, dtype=torch.int64)


def contiguous_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone().contiguous()


@torch.no_grad()
def record_segments(model: TransfoXLLMHeadModel, segment_ids: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
    """Unlabelled pass over consecutive segments, carrying mems exactly as v4 users did."""
    mems = None  # v4 replaces None by mem_len zero vectors per layer
    for s, input_ids in enumerate(segment_ids):
        out = model(input_ids, mems=mems, output_hidden_states=True, output_attentions=True, return_dict=True)
        # the LM head output has no last_hidden_state, so ask the base model with the same mems
        base_out = model.transformer(input_ids, mems=mems, return_dict=True)
        assert torch.equal(base_out.last_hidden_state, out.hidden_states[-1]), "hidden_states[-1] differs"
        for new_mem, base_mem in zip(out.mems, base_out.mems, strict=True):
            assert torch.equal(new_mem, base_mem), "base model and LM head disagree on mems"

        tensors[f"seg{s}.logprobs"] = contiguous_copy(out.prediction_scores)
        tensors[f"seg{s}.last_hidden_state"] = contiguous_copy(base_out.last_hidden_state)
        for i, hidden in enumerate(out.hidden_states):
            tensors[f"seg{s}.hidden_states.{i}"] = contiguous_copy(hidden)
        for i, attention in enumerate(out.attentions):
            tensors[f"seg{s}.attentions.{i}"] = contiguous_copy(attention)
        for i, new_mem in enumerate(out.mems):
            tensors[f"seg{s}.mems.{i}"] = contiguous_copy(new_mem)
        mems = out.mems


@torch.no_grad()
def record_labelled_segments(
    model: TransfoXLLMHeadModel, segment_ids: torch.Tensor, tensors: dict[str, torch.Tensor]
) -> None:
    """Same segments with labels = input_ids, mems carried from this labelled run itself."""
    mems = None
    for s, input_ids in enumerate(segment_ids):
        labels = input_ids.clone()
        out = model(input_ids, mems=mems, labels=labels, return_dict=True)
        assert torch.equal(labels, input_ids), "v4 mutated the labels"
        for i, new_mem in enumerate(out.mems):
            assert torch.equal(new_mem, tensors[f"seg{s}.mems.{i}"]), "labels changed the mems"
        # losses[b, t] is the NLL of token t + 1; with keep_order it must match the unlabelled log-probs
        next_tokens = input_ids[:, 1:, None]
        expected = -tensors[f"seg{s}.logprobs"][:, :-1].gather(-1, next_tokens).squeeze(-1)
        torch.testing.assert_close(out.losses, expected, rtol=0, atol=1e-5)
        tensors[f"seg{s}.losses"] = contiguous_copy(out.losses)
        tensors[f"seg{s}.loss"] = contiguous_copy(out.loss)
        mems = out.mems


@torch.no_grad()
def record_masked_labels(
    model: TransfoXLLMHeadModel, input_ids: torch.Tensor, tensors: dict[str, torch.Tensor]
) -> bool:
    """First segment (fresh mems) with some labels ignored; returns whether v4 mutated the labels passed in."""
    labels = input_ids.clone()
    for batch_index, position in MASKED_POSITIONS:
        labels[batch_index, position] = IGNORE_INDEX
    passed_labels = labels.clone()
    out = model(input_ids, labels=passed_labels, return_dict=True)
    tensors["masked.labels"] = labels
    tensors["masked.losses"] = contiguous_copy(out.losses)
    tensors["masked.loss"] = contiguous_copy(out.loss)
    return not torch.equal(passed_labels, labels)


@torch.no_grad()
def greedy_with_mems(model: TransfoXLLMHeadModel, prompt: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Whole prompt with fresh mems, then one token at a time feeding mems back; also returns the smallest
    top-1 minus top-2 log-prob gap, so tests know how robust the greedy choice is to rounding."""
    output_ids = prompt
    next_input = prompt
    mems = None
    min_gap = float("inf")
    for _ in range(MAX_NEW_TOKENS):
        out = model(next_input, mems=mems, return_dict=True)
        last_logprobs = out.prediction_scores[:, -1]
        top2 = last_logprobs.topk(2, dim=-1).values
        min_gap = min(min_gap, (top2[:, 0] - top2[:, 1]).min().item())
        next_input = last_logprobs.argmax(dim=-1, keepdim=True)
        output_ids = torch.cat([output_ids, next_input], dim=1)
        mems = out.mems
    return output_ids, min_gap


@torch.no_grad()
def record_generation(
    model: TransfoXLLMHeadModel, prompt: torch.Tensor, tensors: dict[str, torch.Tensor]
) -> dict[str, Any]:
    generate_kwargs: dict[str, Any] = {
        "max_new_tokens": MAX_NEW_TOKENS,
        "do_sample": False,
        "num_beams": 1,
        "pad_token_id": 0,
        "eos_token_id": None,  # config.eos_token_id is 0; without this a generated 0 would stop early
    }
    manual_ids, min_gap = greedy_with_mems(model, prompt)
    info: dict[str, Any] = {
        "generate_kwargs": generate_kwargs,
        "manual_greedy_min_top2_logprob_gap": min_gap,
    }
    try:
        generated = model.generate(prompt, **generate_kwargs)
    except (RuntimeError, TypeError, ValueError, AttributeError, IndexError) as error:
        # a v4 generate failure is a finding to record, not a reason to stop
        info["generate_error"] = f"{type(error).__name__}: {error}"
        info["method"] = "manual greedy loop with mems (model.generate failed)"
        tensors["generate.output"] = manual_ids
        return info
    assert generated.shape == (1, PROMPT_LEN + MAX_NEW_TOKENS), "generate stopped early"
    info["method"] = "model.generate"
    info["generate_matches_manual_greedy_with_mems"] = torch.equal(generated, manual_ids)
    tensors["generate.output"] = contiguous_copy(generated)
    return info


def compute_reference(
    model: TransfoXLLMHeadModel, spec: FixtureSpec
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    vocab_size = model.config.vocab_size
    # inputs get their own generator so they do not depend on how many draws building the model took
    generator = torch.Generator().manual_seed(spec.seed + 1)
    segment_ids = random_ids(generator, vocab_size, NUM_SEGMENTS, BATCH_SIZE, SEGMENT_LEN)
    long_ids = random_ids(generator, vocab_size, BATCH_SIZE, LONG_LEN)
    prompt = random_ids(generator, vocab_size, 1, PROMPT_LEN)

    tensors: dict[str, torch.Tensor] = {"segments.input_ids": segment_ids}
    record_segments(model, segment_ids, tensors)
    record_labelled_segments(model, segment_ids, tensors)
    labels_mutated = record_masked_labels(model, segment_ids[0], tensors)

    with torch.no_grad():
        long_out = model(long_ids, return_dict=True)
    tensors["long.input_ids"] = long_ids
    tensors["long.logprobs"] = contiguous_copy(long_out.prediction_scores)
    for i, new_mem in enumerate(long_out.mems):
        tensors[f"long.mems.{i}"] = contiguous_copy(new_mem)

    tensors["generate.prompt"] = prompt
    generation_info = record_generation(model, prompt, tensors)
    return tensors, {"masked_labels_mutated_by_v4": labels_mutated, "generation": generation_info}


def describe_tensor(key: str) -> str:
    """Human-readable meaning of a reference.safetensors key (shapes are stored next to it)."""
    fixed = {
        "segments.input_ids": "three consecutive segments of input ids, [segment, batch, seg_len]",
        "masked.labels": "labels for segment 0: its input ids with (0, 2) and (1, 3) set to -100",
        "masked.losses": "per-token NLL of segment 0 (fresh mems) with masked.labels; 0.0 where ignored",
        "masked.loss": "v4 `loss` for masked.labels: mean of the non-zero entries of masked.losses",
        "long.input_ids": "one batch longer than mem_len, run with fresh mems",
        "long.logprobs": "prediction_scores (log-probs) of long.input_ids, [batch, len, vocab]",
        "generate.prompt": "prompt for greedy generation, [1, prompt_len]",
        "generate.output": "prompt + 8 greedy tokens (see generation.method in this file)",
    }
    if key in fixed:
        return fixed[key]
    prefix, _, rest = key.partition(".")
    if prefix == "long":
        return f"new mems of layer {rest.split('.')[1]} after long.input_ids, v4 layout [mem_len, batch, d_model]"
    segment = prefix.removeprefix("seg")
    mems_note = (
        "fresh mems (mem_len zero vectors)" if segment == "0" else f"mems returned for segment {int(segment) - 1}"
    )
    kind, _, index = rest.partition(".")
    per_kind = {
        "logprobs": "prediction_scores (log-probs), no labels, [batch, seg_len, vocab]",
        "last_hidden_state": "base model last_hidden_state (== hidden_states[-1]), [batch, seg_len, d_model]",
        "hidden_states": f"hidden_states[{index}] (0 = scaled embeddings), [batch, seg_len, d_model]",
        "attentions": f"attention probs of layer {index}, [batch, n_head, seg_len, mem_len + seg_len]",
        "mems": f"new mems of layer {index} (input of that layer), v4 layout [mem_len, batch, d_model]",
        "losses": "per-token NLL with labels = input_ids, token order (keep_order), [batch, seg_len - 1]; "
        "mems carried from the labelled run",
        "loss": "v4 `loss` with labels = input_ids: mean of the non-zero entries of losses",
    }
    return f"segment {segment}, {mems_note}: {per_kind[kind]}"


def weight_file_keys(path: Path) -> list[str]:
    if path.suffix == ".safetensors":
        with safetensors.safe_open(str(path), framework="pt") as weights:
            return sorted(weights.keys())
    return sorted(torch.load(path, map_location="cpu", weights_only=True).keys())


@torch.no_grad()
def check_reload(
    weight_path: Path, config: TransfoXLConfig, expected: torch.Tensor, input_ids: torch.Tensor
) -> dict[str, Any]:
    """Reload one saved weight file in v4 and confirm segment 0 log-probs are bit-identical."""
    model_dir = weight_path.parent
    load_kwargs: dict[str, Any] = {"output_loading_info": True}
    if (model_dir / "model.safetensors").exists():
        # both formats sit in the same folder; v4 would pick safetensors unless told otherwise
        load_kwargs["use_safetensors"] = weight_path.suffix == ".safetensors"
    if not (model_dir / "config.json").exists():
        load_kwargs["config"] = config
    reloaded, loading_info = transformers.TransfoXLLMHeadModel.from_pretrained(model_dir, **load_kwargs)
    reloaded.eval()
    logprobs = reloaded(input_ids, return_dict=True).prediction_scores
    return {
        "missing_keys": sorted(loading_info["missing_keys"]),
        "unexpected_keys": sorted(loading_info["unexpected_keys"]),
        "seg0_logprobs_identical": torch.equal(logprobs, expected),
        "ties_after_reload": describe_ties(reloaded),
    }


def write_fixture(spec: FixtureSpec, out_root: Path) -> Path:
    model = build_model(spec)
    check_ties(model, spec)

    fixture_dir = out_root / spec.name
    # start clean so files from an older run of this script cannot linger
    if fixture_dir.exists():
        shutil.rmtree(fixture_dir)
    model.save_pretrained(fixture_dir, safe_serialization=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=False)
        shutil.copyfile(Path(tmp) / "pytorch_model.bin", fixture_dir / "pytorch_model.bin")
    weight_files = [fixture_dir / "model.safetensors", fixture_dir / "pytorch_model.bin"]
    if spec.write_legacy_format:
        legacy_path = fixture_dir / "legacy_format" / "pytorch_model.bin"
        legacy_path.parent.mkdir()
        torch.save(model.state_dict(), legacy_path, _use_new_zipfile_serialization=False)
        assert not zipfile.is_zipfile(legacy_path), "expected the pre-1.6 (non-zip) torch format"
        weight_files.append(legacy_path)

    tensors, findings = compute_reference(model, spec)
    assert all(t.dtype in (torch.float32, torch.int64) and t.is_contiguous() for t in tensors.values())
    safetensors.torch.save_file(tensors, fixture_dir / "reference.safetensors", metadata={"fixture": spec.name})

    reload_checks = {
        str(path.relative_to(fixture_dir)): check_reload(
            path, model.config, tensors["seg0.logprobs"], tensors["segments.input_ids"][0]
        )
        for path in weight_files
    }
    for name, check in reload_checks.items():
        assert check["seg0_logprobs_identical"], f"{spec.name}: reloading {name} in v4 changed the log-probs"
    v4_default_tie_projs = transformers.TransfoXLConfig(
        **{key: value for key, value in spec.config.items() if key != "tie_projs"}
    ).tie_projs
    reference = {
        "fixture": spec.name,
        "description": spec.description,
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "safetensors": safetensors.__version__,
            "python": platform.python_version(),
        },
        "seed": spec.seed,
        "seed_usage": "torch.manual_seed(seed) before building the model and adding noise; "
        "inputs drawn from torch.Generator().manual_seed(seed + 1)",
        "param_noise": f"every parameter p (tied ones once): p += randn_like(p) * {PARAM_NOISE_STD}",
        "config_kwargs": {**COMMON_CONFIG, **spec.config},
        "v4_tie_projs_without_explicit_override": v4_default_tie_projs,
        "crit_keep_order": "set to True on the model before recording; not persisted in config.json",
        "mems_note": "v4 replaces mems=None by mem_len zero vectors per layer, so segment 0 attends to them",
        "ties": describe_ties(model),
        "weight_files": {str(path.relative_to(fixture_dir)): weight_file_keys(path) for path in weight_files},
        "reload_checks": reload_checks,
        **findings,
        "tensors": {
            key: {
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "description": describe_tensor(key),
            }
            for key, tensor in tensors.items()
        },
    }
    (fixture_dir / "reference.json").write_text(json.dumps(reference, indent=2, sort_keys=True) + "\n")
    return fixture_dir


def print_summary(fixture_dirs: list[Path]) -> None:
    rows = [
        (fixture_dir.name, str(path.relative_to(fixture_dir)), path.stat().st_size)
        for fixture_dir in fixture_dirs
        for path in sorted(fixture_dir.rglob("*"))
        if path.is_file()
    ]
    name_width = max(len("fixture"), *(len(row[0]) for row in rows))
    file_width = max(len("file"), *(len(row[1]) for row in rows))
    print(f"{'fixture':<{name_width}}  {'file':<{file_width}}  {'bytes':>9}")
    for name, file_name, size in rows:
        print(f"{name:<{name_width}}  {file_name:<{file_width}}  {size:>9,}")
    print(f"{'total':<{name_width}}  {'':<{file_width}}  {sum(row[2] for row in rows):>9,}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: tests/fixtures/legacy in the repo)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    global transformers
    args = parse_args(argv)
    transformers = v4.import_transformers("TransfoXL", "TransfoXLLMHeadModel")
    # v4's deprecation notices and "shared tensor removed" messages are expected; the keys are recorded instead
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="transformers")
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    args.out.mkdir(parents=True, exist_ok=True)
    fixture_dirs = [write_fixture(spec, args.out) for spec in FIXTURES]
    print_summary(fixture_dirs)


if __name__ == "__main__":
    main()
