"""The tools every causal LM on transformers works with: Trainer, PEFT, generate()'s idioms, torch.export,
resize_token_embeddings, and remote-code classes beside the package's."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorWithFlattening, GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from tests.utils import tiny_config, tiny_lm
from transfoxl import (
    TransfoXLConfig,
    TxlForCausalLM,
    TxlForQuestionAnswering,
    TxlForSequenceClassification,
    TxlForTokenClassification,
    TxlMemory,
    TxlModel,
    TxlStream,
)
from transfoxl.evaluation import evaluate_stream


def random_ids(*shape: int, seed: int = 0, vocab_size: int = 97) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def lm_dataset(rows: int = 8, length: int = 12) -> Dataset:
    ids = random_ids(rows, length, seed=1)
    return Dataset.from_list([{"input_ids": row, "labels": row} for row in ids.tolist()])


def trainer_arguments(tmp_path, **overrides) -> TrainingArguments:
    values = dict(
        output_dir=str(tmp_path / "trainer"),
        report_to="none",
        use_cpu=True,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return TrainingArguments(**values)


# ---------------------------------------------------------------------------------------------------------------------
# Trainer


def test_trainer_evaluation_reports_the_models_loss_and_gives_logits_to_metrics(tmp_path, one_thread):
    model = tiny_lm()
    dataset = lm_dataset()
    received = {}

    def preprocess(logits, labels):
        received["preprocess"] = tuple(logits.shape)
        return logits.argmax(-1)

    def compute_metrics(prediction):
        received["metrics"] = prediction.predictions.shape
        return {"predicted_tokens": float(prediction.predictions.size)}

    trainer = Trainer(
        model=model,
        args=trainer_arguments(tmp_path),
        eval_dataset=dataset,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess,
    )
    assert trainer.label_names == ["labels"]  # what Trainer reads from forward's signature
    metrics = trainer.evaluate()

    model.eval()
    with torch.no_grad():
        batches = [torch.tensor(dataset["input_ids"][start : start + 4]) for start in range(0, len(dataset), 4)]
        expected = sum(model(batch, labels=batch).loss.item() for batch in batches) / len(batches)
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)
    assert received["preprocess"] == (4, 12, model.config.vocab_size)  # [B, T, V] log-probabilities
    assert received["metrics"] == (8, 12)
    assert metrics["eval_predicted_tokens"] == 8 * 12

    without_preprocessing = Trainer(
        model=model, args=trainer_arguments(tmp_path), eval_dataset=dataset, compute_metrics=compute_metrics
    )
    without_preprocessing.evaluate()
    assert received["metrics"] == (8, 12, model.config.vocab_size)  # logits alone, not the per-token losses


def packed_documents(lengths=(5, 3, 7)) -> tuple[list[list[int]], dict]:
    """Documents of `lengths` and the batch `DataCollatorWithFlattening` makes of them (one row, positions
    restarting at each document, labels hiding each document's first token)."""
    documents = [random_ids(length, seed=length).tolist() for length in lengths]
    batch = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": d, "labels": d} for d in documents])
    return documents, batch


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa", "sdpa-torch"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_sequences_packed_by_position_ids_are_computed_as_if_alone(
    attn_implementation, training, one_thread, monkeypatch
):
    """`DataCollatorWithFlattening` (and TRL's padding-free packing) put several documents in one row and restart
    `position_ids` at each: every document's log-probabilities, its loss and the gradients are what it gives alone,
    on the readable path, the compiled kernels' ("sdpa" on this CPU) and torch's SDPA path (the kernels off), with
    and without gradients."""
    if attn_implementation == "sdpa-torch":
        monkeypatch.setenv("TRANSFOXL_CPU_KERNEL", "0")
    model = tiny_lm(mem_len=0, dropout=0.0)
    model.set_attn_implementation(attn_implementation.removesuffix("-torch"))
    model.train(training)
    documents, batch = packed_documents()
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6]]
    with torch.set_grad_enabled(training):
        packed = model(**batch, return_logits=True)
        if training:
            packed.loss.backward()
            packed_gradients = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
        total, count, start = 0.0, 0, 0
        for document in documents:
            alone = model(torch.tensor([document]), labels=torch.tensor([document]), return_logits=True)
            torch.testing.assert_close(packed.logits[0, start : start + len(document)], alone.logits[0])
            total, count, start = total + alone.losses.sum(), count + len(document) - 1, start + len(document)
        torch.testing.assert_close(packed.loss, total / count)
        if training:
            (total / count).backward()
            for name_and_parameter, gradient in zip(model.named_parameters(), packed_gradients):
                torch.testing.assert_close(gradient, name_and_parameter[1].grad, msg=name_and_parameter[0])


def test_packed_rows_of_a_batch_with_padding_and_a_memory(one_thread):
    """Two rows, each packing two documents, the second row padded: each document is computed alone, except that a
    row's first document continues the memory (as any segment does) and the later ones do not see it. Positions that
    run on (no restart) change nothing."""
    model = tiny_lm(mem_len=8)
    prefix = random_ids(2, 6, seed=9)
    a, b, c, d = (random_ids(1, length, seed=length + 20) for length in (4, 5, 6, 2))
    inputs = torch.cat([torch.cat([a, b], 1), torch.cat([c, d, torch.zeros(1, 1, dtype=torch.long)], 1)])
    positions = torch.tensor([[7, 8, 9, 10, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 0, 1, 0]])
    padding = torch.ones_like(inputs)
    padding[1, -1] = 0
    with torch.no_grad():
        memory = model(prefix).past_key_values
        packed = model(inputs, past_key_values=copy.deepcopy(memory), attention_mask=padding, position_ids=positions)
        first_rows = model(inputs[:, :4], past_key_values=copy.deepcopy(memory)).logits
        torch.testing.assert_close(packed.logits[0, :4], first_rows[0])
        second_row = copy.deepcopy(memory)
        second_row.batch_select_indices(torch.tensor([1]))
        torch.testing.assert_close(packed.logits[1, :6], model(c, past_key_values=second_row).logits[0])
        torch.testing.assert_close(packed.logits[0, 4:], model(b).logits[0])
        torch.testing.assert_close(packed.logits[1, 6:8], model(d).logits[0])
        running_on = torch.arange(9).expand(2, 9) + 3
        plain = model(inputs, past_key_values=copy.deepcopy(memory), attention_mask=padding).logits
        assert torch.equal(
            model(
                inputs, past_key_values=copy.deepcopy(memory), attention_mask=padding, position_ids=running_on
            ).logits,
            plain,
        )


def test_left_padding_with_gpt2_style_positions_keeps_the_memory(one_thread):
    """Positions made as GPT-2's (`cumsum(mask) - 1`, padding filled with 0) restart beside the padding: that starts
    no sequence, so a left-padded row's tokens still see the memory."""
    model = tiny_lm(mem_len=8)
    with torch.no_grad():
        memory = model(random_ids(1, 6, seed=3)).past_key_values
        inputs = torch.cat([torch.zeros(1, 2, dtype=torch.long), random_ids(1, 4, seed=1)], 1)
        mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        with_positions = model(
            inputs, past_key_values=copy.deepcopy(memory), attention_mask=mask, position_ids=positions
        )
        without = model(inputs, past_key_values=copy.deepcopy(memory), attention_mask=mask)
    torch.testing.assert_close(with_positions.logits[0, 2:], without.logits[0, 2:])


def test_trainer_with_the_flattening_collator_evaluates_each_documents_loss(tmp_path, one_thread):
    """Trainer with `DataCollatorWithFlattening`: the evaluation loss is the mean over the documents' own targets
    (each computed alone), and training runs on the packed rows."""
    model = tiny_lm(mem_len=0)
    lengths = (5, 3, 7, 6)
    documents = [random_ids(length, seed=length).tolist() for length in lengths]
    dataset = Dataset.from_list([{"input_ids": d, "labels": d} for d in documents])
    trainer = Trainer(
        model=model,
        args=trainer_arguments(tmp_path, max_steps=2, per_device_eval_batch_size=len(lengths)),
        train_dataset=dataset,
        eval_dataset=dataset,
        data_collator=DataCollatorWithFlattening(),
    )
    metrics = trainer.evaluate()
    with torch.no_grad():
        losses = [model(torch.tensor([d]), labels=torch.tensor([d])).losses.sum() for d in documents]
    assert metrics["eval_loss"] == pytest.approx(float(sum(losses)) / sum(n - 1 for n in lengths), rel=1e-5)
    assert math.isfinite(trainer.train().training_loss)


def test_flash_attention_bounds_of_packed_sequences_are_taken_with_their_positions(lm):
    """Packing collators also give flash attention's sequence bounds (`DataCollatorWithFlattening` with
    return_flash_attn_kwargs / return_seq_idx; TRL's padding-free batches always): taken beside position_ids, from
    which the model finds the same sequences; alone, or disagreeing with the positions, they are refused."""
    documents = [random_ids(length, seed=length).tolist() for length in (5, 3, 7)]
    collator = DataCollatorWithFlattening(return_tensors="pt", return_flash_attn_kwargs=True, return_seq_idx=True)
    batch = collator([{"input_ids": d, "labels": d} for d in documents])
    assert {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"} <= set(batch)
    plain = {name: batch[name] for name in ("input_ids", "labels", "position_ids")}
    with torch.no_grad():
        assert torch.equal(lm(**batch).logits, lm(**plain).logits)
        with pytest.raises(ValueError, match="this model finds them from position_ids"):
            lm(**{**batch, "position_ids": None})
        with pytest.raises(ValueError, match=r"cu_seq_lens_q \[0, 5, 15\] does not bound .* \(\[0, 5, 8, 15\]\)"):
            lm(**{**batch, "cu_seq_lens_q": torch.tensor([0, 5, 15], dtype=torch.int32)})


def test_generate_makes_no_position_ids(monkeypatch):
    """generate() makes position_ids for a model whose forward takes them and grows them at every token; here they
    would be unused work (relative positions, nothing packed): none are made, with or without beams."""
    model = tiny_lm()
    seen = []
    update = TxlForCausalLM._update_model_kwargs_for_generation

    def watching(self, outputs, model_kwargs, *args, **kwargs):
        seen.append(model_kwargs.get("position_ids"))
        return update(self, outputs, model_kwargs, *args, **kwargs)

    monkeypatch.setattr(TxlForCausalLM, "_update_model_kwargs_for_generation", watching)
    prompt = random_ids(2, 5)
    for beams in (1, 2):
        model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, num_beams=beams, do_sample=False
        )
    assert seen and all(position_ids is None for position_ids in seen)


@pytest.mark.parametrize(
    ("position_ids", "error", "message"),
    [
        ([[0, 1, 2]], TypeError, "position_ids must be a torch.Tensor"),
        (torch.zeros(1, 3), ValueError, "position_ids must hold integer positions, got dtype torch.float32"),
        (torch.zeros(2, 4, dtype=torch.long), ValueError, r"position_ids must be \[batch, seq_len\] = \(2, 3\)"),
        (torch.zeros(3, dtype=torch.long), ValueError, r"got \(3,\)"),
    ],
)
def test_bad_position_ids_are_refused_clearly(position_ids, error, message, lm):
    with pytest.raises(error, match=message):
        lm(random_ids(2, 3), position_ids=position_ids)


@pytest.mark.parametrize("count", [0, torch.tensor(0)])
def test_a_batch_without_targets_gives_a_nan_loss_and_zero_gradients(count):
    """Trainer passes num_items_in_batch=0 for a batch (or accumulation window) without targets: transformers' causal
    LMs return a nan loss there, and their gradients are 0, not nan (GPT-2 checked the same)."""
    model = tiny_lm().train()
    ids = random_ids(2, 5)
    output = model(ids, labels=torch.full_like(ids, -100), num_items_in_batch=count)
    assert math.isnan(output.loss.item())
    output.loss.backward()
    gradients = [parameter.grad for parameter in model.parameters() if parameter.grad is not None]
    assert gradients and all(bool((gradient == 0).all()) for gradient in gradients)
    # a count of targets still divides the summed loss
    model.zero_grad()
    counted = model(ids, labels=ids, num_items_in_batch=torch.tensor(3)).loss
    torch.testing.assert_close(counted, model(ids, labels=ids).losses.sum() / 3)
    # a fractional count (Trainer divides by tensor/context/sequence parallel sizes) divides as it is
    halved = model(ids, labels=ids, num_items_in_batch=0.5).loss
    torch.testing.assert_close(halved, model(ids, labels=ids).losses.sum() / 0.5)


def test_trainer_evaluates_and_trains_on_rows_without_targets(tmp_path, one_thread):
    """A 1-token row (its only position predicts nothing) in a batch of its own: Trainer's count is 0 there. Training
    goes on with finite weights, and the evaluation's loss is the other batches' mean, as GPT-2's are."""
    rows = [[5, 6, 7, 8], [9], [10, 11, 12]]
    dataset = Dataset.from_list([{"input_ids": row, "labels": row} for row in rows])
    model = tiny_lm()
    args = trainer_arguments(tmp_path, per_device_train_batch_size=1, per_device_eval_batch_size=1, max_steps=3)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, eval_dataset=dataset)
    result = trainer.train()
    assert math.isfinite(result.training_loss)  # Trainer filters the nan step out of its logged loss
    assert all(bool(parameter.isfinite().all()) for parameter in model.parameters())
    metrics = trainer.evaluate()
    model.eval()
    with torch.no_grad():
        losses = [model(torch.tensor([row]), labels=torch.tensor([row])).loss.item() for row in (rows[0], rows[2])]
    assert metrics["eval_loss"] == pytest.approx(sum(losses) / 2, rel=1e-5)  # the batch without targets left out


def test_trainer_keeps_the_best_model_by_eval_loss(tmp_path, one_thread):
    model = tiny_lm().train()
    args = trainer_arguments(
        tmp_path,
        max_steps=4,
        learning_rate=1e-2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
    )
    trainer = Trainer(model=model, args=args, train_dataset=lm_dataset(), eval_dataset=lm_dataset(rows=4))
    trainer.train()
    evaluated = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    assert len(evaluated) == 2 and all(math.isfinite(loss) for loss in evaluated)
    assert trainer.state.best_metric == min(evaluated)


def test_trainer_label_smoothing_shifts_the_labels_as_for_any_causal_lm(tmp_path, one_thread):
    """Trainer shifts the labels for label smoothing only for the class names in transformers' table of causal LMs:
    unshifted, each position was scored against its own token and training learnt to copy its input."""
    from transformers.trainer_pt_utils import LabelSmoother

    model = tiny_lm().train()
    trainer = Trainer(model=model, args=trainer_arguments(tmp_path, label_smoothing_factor=0.1))
    ids = random_ids(2, 8)
    torch.manual_seed(0)
    loss = trainer.compute_loss(model, {"input_ids": ids, "labels": ids})
    torch.manual_seed(0)
    output = model(input_ids=ids)
    smoother = LabelSmoother(epsilon=0.1)
    torch.testing.assert_close(loss, smoother(output, ids, shift_labels=True))
    assert not torch.allclose(loss, smoother(output, ids))


def test_both_model_types_are_in_transformers_table_of_causal_lms():
    """Tools tell a causal LM by its config's model type in transformers' table of them (lm-evaluation-harness warns,
    and guesses, for one missing): a legacy folder's "transfo-xl" is there beside "txl", for the class loading it."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for config in (tiny_config(), TransfoXLConfig(**tiny_config().to_diff_dict())):
        model = AutoModelForCausalLM.from_config(config)
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type] == type(model).__name__ == "TxlForCausalLM"


def test_training_returns_no_logits_unless_asked(lm):
    """The training path's speed: no [B, Q, V] log-probabilities when a loss is computed with gradients."""
    ids = random_ids(2, 6)
    lm.train()
    assert lm(ids, labels=ids).logits is None
    assert lm(ids, labels=ids, return_logits=True).logits.shape == (2, 6, lm.config.vocab_size)
    with torch.no_grad():
        assert lm(ids, labels=ids).logits.shape == (2, 6, lm.config.vocab_size)
    lm.eval()  # gradients on in eval mode (saliency, a probe's training): logits, as from GPT-2
    output = lm(ids, labels=ids)
    assert output.logits.shape == (2, 6, lm.config.vocab_size) and output.logits.requires_grad
    lm.train()
    lm.config.return_logits = True  # (for code that reads them in every step: a metric in Trainer.compute_loss)
    assert lm(ids, labels=ids).logits.shape == (2, 6, lm.config.vocab_size)
    assert lm(ids, labels=ids, return_logits=False).logits is None
    lm.config.return_logits = False  # (as None: it never turns them off where they are returned)
    assert lm(ids, labels=ids).logits is None
    with torch.no_grad():
        assert lm(ids, labels=ids, return_dict=False)[1].shape == (2, 6, lm.config.vocab_size)
    assert lm.eval().generate(ids[:1], max_new_tokens=2).shape == (1, 8)


def test_reading_the_logits_a_training_step_left_out_says_why_once(lm, caplog, tmp_path, one_thread):
    """`outputs.logits` is None in a training step with labels, where GPT-2's has them: code that reads them (an
    accuracy, a distillation loss) failed on None with nothing to say why. Reading them says so, once, naming
    return_logits; a step whose logits nobody reads (Trainer's) says nothing."""
    import logging

    logging.Logger.warning_once.cache_clear()  # (said once per process: another test may have said it)
    ids = random_ids(2, 6)
    lm.train()
    with caplog.at_level(logging.WARNING):
        outputs = [lm(ids, labels=ids) for _ in range(2)]
        dataset = Dataset.from_list([{"input_ids": row, "labels": row} for row in random_ids(4, 6).tolist()])
        Trainer(model=lm, args=trainer_arguments(tmp_path, max_steps=2), train_dataset=dataset).train()
        assert "return_logits" not in caplog.text
        assert lm(ids, labels=ids, return_logits=True).logits is not None
        assert "return_logits" not in caplog.text
        assert all(output.logits is None for output in outputs)
    assert caplog.text.count("returns the loss without logits (outputs.logits is None)") == 1
    assert "model.config.return_logits = True" in caplog.text


def test_an_exponential_length_penalty_is_warned_to_act_on_log_probabilities(caplog):
    """transformers' exponential_decay_length_penalty adds a multiple of the end token's absolute score: on this
    model's log-probabilities (far below 0) more than on raw logits, so generation stops sooner than GPT-2's at the
    same setting (a helper's trial: 10 tokens against 17). generate() says so, once."""
    import logging

    logging.Logger.warning_once.cache_clear()
    model, prompt = tiny_lm(), random_ids(1, 4)
    with caplog.at_level(logging.WARNING):
        model.generate(prompt, max_new_tokens=2, do_sample=False, eos_token_id=1)
        assert "exponential_decay_length_penalty" not in caplog.text
        for _ in range(2):
            model.generate(
                prompt, max_new_tokens=2, do_sample=False, eos_token_id=1, exponential_decay_length_penalty=(1, 1.2)
            )
    assert caplog.text.count("exponential_decay_length_penalty raises the end token's score") == 1


def test_models_without_the_language_model_head_load_its_folder_without_unexpected_keys(tmp_path):
    """The base model and the classifier, loaded from a language model's folder, leave its head out quietly (as
    GPT-2's do: its tied head saves nothing of its own); the load report called the head's biases and tail weights
    unexpected. The language model itself still loads every one of them."""
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    model = tiny_lm()
    model.save_pretrained(tmp_path)
    for auto in (
        AutoModel,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoModelForQuestionAnswering,
    ):
        _, info = auto.from_pretrained(tmp_path, output_loading_info=True)
        assert not info["unexpected_keys"], auto.__name__
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values())
    for name, parameter in model.adaptive_softmax.named_parameters():
        torch.testing.assert_close(loaded.adaptive_softmax.get_parameter(name), parameter, rtol=0, atol=0)


def test_trainer_trains_the_classification_head(tmp_path, one_thread):
    torch.manual_seed(0)
    model = TxlForSequenceClassification(tiny_config(num_labels=3, pad_token_id=0))
    ids = random_ids(8, 10, seed=2)
    dataset = Dataset.from_list([{"input_ids": row, "labels": index % 3} for index, row in enumerate(ids.tolist())])
    before = model.score.weight.detach().clone()
    args = trainer_arguments(tmp_path, max_steps=3, learning_rate=1e-2, gradient_accumulation_steps=2)
    result = Trainer(model=model, args=args, train_dataset=dataset).train()
    assert math.isfinite(result.training_loss)
    assert not torch.equal(model.score.weight, before)


def test_the_token_classifier_loads_a_language_models_body_and_tags_every_token(tmp_path):
    """AutoModelForTokenClassification, as for GPT-2: the body from a language model's folder (only the new head
    missing), logits `[B, Q, num_labels]`, transformers' token-classification loss (-100 ignored), and a text in
    segments with the memory tagged as in one piece."""
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    lm = TxlForCausalLM(tiny_config(mem_len=16, same_length=False))
    lm.save_pretrained(tmp_path / "lm")
    tagger, info = AutoModelForTokenClassification.from_pretrained(
        tmp_path / "lm", num_labels=5, output_loading_info=True
    )
    assert type(tagger) is TxlForTokenClassification
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"} and not info["unexpected_keys"]
    for name, parameter in lm.transformer.named_parameters():
        torch.testing.assert_close(tagger.transformer.get_parameter(name), parameter, rtol=0, atol=0)
    tagger.eval()
    ids, labels = random_ids(2, 8, seed=4), torch.randint(0, 5, (2, 8), generator=torch.Generator().manual_seed(5))
    labels[0, :3] = -100
    output = tagger(ids, labels=labels)
    assert output.logits.shape == (2, 8, 5)
    expected = torch.nn.functional.cross_entropy(output.logits.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(output.loss, expected)
    with torch.no_grad():
        first = tagger(ids[:, :5], use_cache=True)
        second = tagger(ids[:, 5:], past_key_values=first.past_key_values)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), output.logits, rtol=1e-5, atol=1e-5)


def test_the_token_classifier_refuses_labels_that_do_not_fit_and_trains_under_trainer(tmp_path, one_thread):
    """Labels of another shape (they would be flattened against the wrong tokens), out of range, or not integers
    get one clear error naming what was expected; Trainer trains the head with gradient accumulation."""
    torch.manual_seed(0)
    model = TxlForTokenClassification(tiny_config(num_labels=3))
    ids = random_ids(2, 6)
    for labels, message in (
        (torch.zeros(2, 5, dtype=torch.long), r"one class id per token, \[2, 6\], got shape \(2, 5\)"),
        (torch.full((2, 6), 3), r"class 3, outside \[0, num_labels=3\)"),
        (torch.zeros(2, 6), "integer class ids"),
    ):
        with pytest.raises((ValueError, TypeError), match=message):
            model(ids, labels=labels)
    rows = random_ids(8, 10, seed=2).tolist()
    dataset = Dataset.from_list([{"input_ids": row, "labels": [token % 3 for token in row]} for row in rows])
    before = model.classifier.weight.detach().clone()
    args = trainer_arguments(tmp_path, max_steps=3, learning_rate=1e-2, gradient_accumulation_steps=2)
    result = Trainer(model=model, args=args, train_dataset=dataset).train()
    assert math.isfinite(result.training_loss)
    assert not torch.equal(model.classifier.weight, before)


def test_the_span_head_loads_a_language_models_body_and_scores_start_and_end(tmp_path):
    """AutoModelForQuestionAnswering, as for GPT-2: the body from a language model's folder (only `qa_outputs`
    missing), a start and an end logit per token, transformers' span loss (the mean of the two cross-entropies, an
    index past the input ignored), and clear errors for a span given by half or by floats."""
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(0)
    TxlForCausalLM(tiny_config()).save_pretrained(tmp_path / "lm")
    reader, info = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "lm", output_loading_info=True)
    assert type(reader) is TxlForQuestionAnswering
    assert info["missing_keys"] == {"qa_outputs.weight", "qa_outputs.bias"} and not info["unexpected_keys"]
    ids = random_ids(3, 7, seed=6)
    starts, ends = torch.tensor([1, 4, 9]), torch.tensor([2, 6, 9])  # (the third row's span lies past the input)
    output = reader.eval()(ids, start_positions=starts, end_positions=ends)
    assert output.start_logits.shape == output.end_logits.shape == (3, 7)
    cross_entropy = torch.nn.functional.cross_entropy
    expected = (
        cross_entropy(output.start_logits, starts.clamp(0, 7), ignore_index=7)
        + cross_entropy(output.end_logits, ends.clamp(0, 7), ignore_index=7)
    ) / 2
    torch.testing.assert_close(output.loss, expected)
    with pytest.raises(ValueError, match="start_positions was given without end_positions"):
        reader(ids, start_positions=starts)
    with pytest.raises(TypeError, match=r"end_positions must be a tensor of integer token indices \[batch\]"):
        reader(ids, start_positions=starts, end_positions=ends.float())
    with pytest.raises(ValueError, match=r"one token index per sequence, \[3\], got \(2,\)"):
        reader(ids, start_positions=starts[:2], end_positions=ends[:2])


def test_trainer_scales_the_token_heads_loss_over_gradient_accumulation(tmp_path, one_thread):
    """Trainer passes a model that takes it the count of labelled tokens over the accumulation group, and then does
    not divide the loss by the accumulation steps itself: the token head's loss is their sum divided by that count
    (a mean per micro-batch would be twice too large with two steps). With learning rate 0, one step's logged loss is
    the mean over its four rows."""
    torch.manual_seed(0)
    rows = random_ids(4, 6, seed=8)
    model = TxlForTokenClassification(tiny_config(num_labels=3))
    records = [{"input_ids": row, "labels": [token % 3 for token in row]} for row in rows.tolist()]
    args = trainer_arguments(
        tmp_path, max_steps=1, learning_rate=0.0, per_device_train_batch_size=2, gradient_accumulation_steps=2
    )
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(records))
    assert trainer.model_accepts_loss_kwargs
    result = trainer.train()
    with torch.no_grad():
        expected = model.train()(rows, labels=rows % 3).loss
    assert result.training_loss == pytest.approx(float(expected), rel=1e-5)


def test_the_classifier_takes_running_position_ids_and_refuses_packed_rows():
    torch.manual_seed(0)
    model = TxlForSequenceClassification(tiny_config(num_labels=3, pad_token_id=0)).eval()
    ids = random_ids(2, 6, seed=3) + 1  # (no pad id)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    plain = model(ids, attention_mask=mask).logits
    running = torch.arange(6).expand(2, 6)
    gpt2_style = (mask.cumsum(-1) - 1).clamp(min=0)  # (left padding's positions: a restart beside padding only)
    for position_ids in (running, running[:1], gpt2_style):
        torch.testing.assert_close(model(ids, attention_mask=mask, position_ids=position_ids).logits, plain)
    packed = torch.tensor([[0, 1, 2, 0, 1, 2]]).expand(2, 6)
    with pytest.raises(ValueError, match=r"position_ids restart in row 0 at column 3 .* classifies one token per row"):
        model(ids, attention_mask=mask, position_ids=packed)
    with pytest.raises(ValueError, match="position_ids must hold integer positions"):
        model(ids, position_ids=torch.zeros(2, 6))


# ---------------------------------------------------------------------------------------------------------------------
# PEFT


def test_peft_all_linear_merges_to_the_adapter_models_outputs():
    peft = pytest.importorskip("peft")
    model = tiny_lm()
    ids = random_ids(2, 10)
    with torch.no_grad():  # the base model keeps its projected position table, which merging changes in place
        model(ids)
    adapted = peft.get_peft_model(model, peft.LoraConfig(target_modules="all-linear", r=4, init_lora_weights=False))
    wrapped = {name.rsplit(".", 1)[-1] for name, module in adapted.named_modules() if hasattr(module, "lora_A")}
    # The output clusters share their weights with the input embedding: an adapter merged there would change both.
    assert wrapped == {"qkv_proj", "pos_proj", "o_proj", "up_proj", "down_proj"}
    adapted.eval()
    with torch.no_grad():
        adapter_logits = adapted(ids).logits
        merged = adapted.merge_and_unload()
        torch.testing.assert_close(merged(ids).logits, adapter_logits, rtol=0, atol=1e-4)
    assert not torch.allclose(adapter_logits, tiny_lm()(ids).logits, atol=1e-3)  # the adapter did change something


@pytest.mark.parametrize("target", ["qkv_proj", "o_proj", "up_proj", "down_proj"])
def test_an_adapted_model_decodes_at_batch_one_as_its_merged_weights(target):
    """Decoding one token at batch 1 takes the fused layer step for bare layers only; with a LoRA adapter on any of
    a layer's products the layer goes its general way (the adapter's own call), and greedy generate() scores every
    step as the merged model does (which takes the fused step)."""
    peft = pytest.importorskip("peft")
    model = tiny_lm(mem_len=8)
    model.config._attn_implementation = "sdpa"
    prompt = random_ids(1, 5)
    config = peft.LoraConfig(target_modules=[target], r=4, init_lora_weights=False)
    adapted = peft.get_peft_model(model, config).eval()
    settings = {"max_new_tokens": 6, "min_new_tokens": 6, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        adapter_run = adapted.generate(input_ids=prompt, **settings)
        merged_run = adapted.merge_and_unload().generate(prompt, **settings)
    assert torch.equal(adapter_run.sequences, merged_run.sequences)
    for adapter_scores, merged_scores in zip(adapter_run.scores, merged_run.scores):
        torch.testing.assert_close(adapter_scores, merged_scores, rtol=0, atol=1e-4)


def test_an_adapter_change_is_seen_by_a_memory_that_keeps_projections():
    """In inference the memory keeps its keys and values, keyed on the projection's weight. An adapter's weights are
    not that weight, so nothing is kept for a wrapped projection: after the adapter changes, a memory that went
    through inference continues as one whose hidden states are projected again."""
    peft = pytest.importorskip("peft")
    model = tiny_lm(mem_len=32)
    config = peft.LoraConfig(target_modules=["qkv_proj", "pos_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(model, config).eval()
    with torch.no_grad():
        kept = adapted(input_ids=random_ids(1, 6), use_cache=True).past_key_values
        reprojected = copy.deepcopy(kept)
        for layer in reprojected.layers:
            layer.drop_projections()
        for module in adapted.modules():  # the adapter changes (a training step would do this)
            if hasattr(module, "lora_B"):
                for parameter in module.lora_B.parameters():
                    parameter.add_(0.5)
        new_tokens = random_ids(1, 3, seed=5)
        continued = adapted(input_ids=new_tokens, past_key_values=kept).logits
        expected = adapted(input_ids=new_tokens, past_key_values=reprojected).logits
    torch.testing.assert_close(continued, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["IA3", "LoHa", "LoKr", "DoRA"])
def test_other_peft_adapters_train_the_adapter_only_and_merge_to_its_outputs(method):
    peft = pytest.importorskip("peft")
    targets = ["qkv_proj", "o_proj", "up_proj", "down_proj"]
    config = {
        "IA3": lambda: peft.IA3Config(target_modules=targets, feedforward_modules=["up_proj", "down_proj"]),
        "LoHa": lambda: peft.LoHaConfig(target_modules=targets, r=4, init_weights=False),
        "LoKr": lambda: peft.LoKrConfig(target_modules=targets, r=4, init_weights=False),
        "DoRA": lambda: peft.LoraConfig(target_modules=targets, r=4, use_dora=True, init_lora_weights=False),
    }[method]()
    adapted = peft.get_peft_model(tiny_lm(), config)
    ids = random_ids(2, 8)
    adapted.train()
    adapted(input_ids=ids, labels=ids).loss.backward()
    assert {name for name, p in adapted.named_parameters() if p.grad is not None} == {
        name for name, p in adapted.named_parameters() if p.requires_grad
    }
    assert all(not p.requires_grad for name, p in adapted.named_parameters() if "base_layer" in name)
    adapted.eval()
    with torch.no_grad():
        if method == "IA3":  # (IA3 starts as the identity: move it)
            for name, parameter in adapted.named_parameters():
                if "ia3_l" in name:
                    parameter.add_(0.3)
        adapter_logits = adapted(input_ids=ids).logits
        torch.testing.assert_close(adapted.merge_and_unload()(ids).logits, adapter_logits, rtol=0, atol=1e-4)
    assert not torch.allclose(adapter_logits, tiny_lm()(ids).logits, atol=1e-3)


def test_peft_trainable_tokens_name_one_table_of_the_adaptive_embedding():
    peft = pytest.importorskip("peft")
    with pytest.raises(AttributeError, match=r"TxlAdaptiveEmbedding has no single weight: .*`embeddings.N` by name"):
        peft.get_peft_model(tiny_lm(), peft.LoraConfig(target_modules=["o_proj"], trainable_token_indices=[3, 60]))
    config = peft.LoraConfig(target_modules=["o_proj"], trainable_token_indices={"embeddings.0": [3, 7]})
    adapted = peft.get_peft_model(tiny_lm(), config)
    ids = random_ids(2, 8)
    adapted.train()
    adapted(input_ids=ids, labels=ids).loss.backward()
    assert any("trainable_tokens" in name for name, p in adapted.named_parameters() if p.grad is not None)


def test_new_tokens_train_through_the_tied_tables_beside_an_adapter_and_merge_to_its_outputs(tmp_path):
    """docs/generation.md's way to train new tokens: the tables the output layers share, unfrozen beside LoRA, train
    both sides; the merged model, saved and loaded, gives the adapter model's outputs."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    adapted = peft.get_peft_model(tiny_lm().train(), peft.LoraConfig(target_modules="all-linear", r=4))
    for parameter in adapted.base_model.model.transformer.word_embeddings.parameters():
        parameter.requires_grad_(True)
    optimizer = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-2)
    ids = random_ids(2, 8)
    table = adapted.base_model.model.transformer.word_embeddings.embeddings[0].weight
    before = table.detach().clone()
    for _ in range(2):
        adapted(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(table, before)
    adapted.eval()
    with torch.no_grad():
        expected = adapted(input_ids=ids).logits
        merged = adapted.merge_and_unload()
        merged.save_pretrained(tmp_path / "merged")
        loaded = TxlForCausalLM.from_pretrained(tmp_path / "merged")
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("div_val", [2, 1])
def test_peft_prompt_tuning_trains_the_virtual_tokens_and_generates_after_them(div_val, tmp_path):
    """PEFT's prompt tuning finds the input embedding at `embeddings.word_embeddings`. Before, it found nothing with
    the adaptive embedding (a TypeError in every call) and, with one table (div_val 1), took that table alone: real
    tokens entered without the sqrt(d_model) scale, silently. The virtual tokens come before the real ones, the
    gradient reaches them only, and generate() continues as greedy full forwards over [virtual; prompt] do."""
    peft = pytest.importorskip("peft")
    model = tiny_lm(div_val=div_val, mem_len=32)
    adapted = peft.get_peft_model(model, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    assert adapted.word_embeddings is model.get_input_embeddings()
    assert "embeddings" not in dict(model.named_children())  # (a property: the module tree and state dict as before)
    ids = random_ids(2, 6)
    adapted.train()
    adapted(input_ids=ids, labels=ids).loss.backward()
    trained = {name for name, parameter in adapted.named_parameters() if parameter.grad is not None}
    assert trained == {"prompt_encoder.default.embedding.weight"}
    adapted.eval()
    with torch.no_grad():
        virtual = adapted.get_prompt(batch_size=1)  # [1, 4, E]

        def next_token(tokens):
            embedded = torch.cat([virtual, model.get_input_embeddings()(tokens)], dim=1)
            return model(inputs_embeds=embedded).logits[:, -1].argmax(-1, keepdim=True)

        expected = ids[:1]
        for _ in range(4):
            expected = torch.cat([expected, next_token(expected)], dim=1)
        generated = adapted.generate(input_ids=ids[:1], max_new_tokens=4, do_sample=False)
        assert torch.equal(generated, expected)
        logits = adapted(input_ids=ids).logits  # [2, 4 + 6, V]: the virtual tokens' positions first
        assert not torch.allclose(logits[:, 4:], model(ids).logits, atol=1e-3)  # the real tokens see the virtual ones
        adapted.save_pretrained(tmp_path)
        reloaded = peft.PeftModel.from_pretrained(tiny_lm(div_val=div_val, mem_len=32), tmp_path).eval()
        torch.testing.assert_close(reloaded(input_ids=ids).logits, logits, rtol=0, atol=0)
    with pytest.raises(AttributeError, match=r"no single num_embeddings: an adaptive embedding .*='RANDOM'"):
        peft.get_peft_model(
            tiny_lm(),
            peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4, prompt_tuning_init="SAMPLE_VOCAB"),
        )
    assert not hasattr(model.get_input_embeddings(), "weight")  # (still no attribute: hasattr / getattr probes)


def test_peft_p_tuning_trains_and_prefix_tuning_is_refused_clearly():
    """P-tuning finds the embedding as prompt tuning does. Prefix tuning hands the model per-layer key/value
    prefixes, which Transformer-XL's memory of hidden states cannot hold: refused saying so in forward and in
    generate() (which failed in PEFT with an AttributeError: the memory had no max_cache_len)."""
    peft = pytest.importorskip("peft")
    config = peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=4, encoder_hidden_size=16)
    adapted = peft.get_peft_model(tiny_lm(), config)
    ids = random_ids(2, 6)
    adapted.train()
    loss = adapted(input_ids=ids, labels=ids).loss
    loss.backward()
    assert math.isfinite(loss.item())
    assert {name for name, p in adapted.named_parameters() if p.grad is not None} <= {
        name for name, p in adapted.named_parameters() if name.startswith("prompt_encoder.")
    }
    prefix = peft.get_peft_model(tiny_lm(), peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    prefix.eval()
    message = r"got \w*Cache\. .*not keys and values.* PEFT's prefix tuning, which makes one, does not apply"
    with pytest.raises(TypeError, match=message):
        prefix(input_ids=ids)
    with pytest.raises(TypeError, match=message):  # (PEFT widens the mask by the prefix: the memory is said first)
        prefix(input_ids=ids, attention_mask=torch.ones_like(ids))
    with pytest.raises(TypeError, match=message):
        prefix.generate(input_ids=ids[:1], max_new_tokens=2)


# ---------------------------------------------------------------------------------------------------------------------
# generate() idioms


@pytest.mark.parametrize(
    "settings",
    [{}, {"do_sample": True, "top_k": 5}, {"prefill_chunk_size": 2}, {"repetition_penalty": 1.3}],
    ids=["greedy", "sampling", "chunked-prefill", "repetition-penalty"],
)
def test_continuation_idiom_equals_one_longer_call(settings):
    model = tiny_lm(mem_len=6)
    prompt = random_ids(2, 5)
    torch.manual_seed(3)
    longer = model.generate(prompt, max_new_tokens=12, min_new_tokens=12, **settings)
    torch.manual_seed(3)
    first = model.generate(prompt, max_new_tokens=5, min_new_tokens=5, return_dict_in_generate=True, **settings)
    memory = first.past_key_values
    assert memory.seen_tokens == 5 + 5 - 1  # everything but the last generated token
    second = model.generate(first.sequences, past_key_values=memory, max_new_tokens=7, min_new_tokens=7, **settings)
    assert torch.equal(second, longer)
    assert memory.seen_tokens == 5 + 12 - 1 and memory.get_seq_length() == 6  # the memory was not fed twice


def test_continuation_idiom_with_left_padding():
    model = tiny_lm(mem_len=16)
    prompt = random_ids(2, 6)
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    longer = model.generate(prompt, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
    first = model.generate(
        prompt, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, pad_token_id=0, return_dict_in_generate=True
    )
    full_mask = torch.cat([mask, torch.ones(2, 3, dtype=mask.dtype)], dim=1)
    second = model.generate(
        first.sequences,
        attention_mask=full_mask,
        past_key_values=first.past_key_values,
        max_new_tokens=5,
        min_new_tokens=5,
        pad_token_id=0,
    )
    assert torch.equal(second, longer)
    assert first.past_key_values.get_seq_length() == 6 + 8 - 1  # the sequence was not fed to the memory again


def test_a_mask_of_the_whole_stream_is_taken_where_it_agrees_with_the_memory():
    """A GPT-2-style decoding loop passes the attention mask of the whole sequence so far, and transformers'
    classifier-free guidance (`guidance_scale`) does so for its unconditional pass: both were refused ("pass the mask
    of the new tokens only"). A mask of `seen_tokens + Q` columns whose columns over the memory agree with the padding
    it remembers is taken (its new tokens' columns); one that disagrees is still refused."""
    model = tiny_lm(mem_len=16)
    prompt = random_ids(2, 5)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0  # left padding, which the memory remembers
    with torch.no_grad():
        memory = model(prompt, attention_mask=mask).past_key_values
        token = random_ids(2, 1, seed=9)
        expected = model(token, past_key_values=copy.deepcopy(memory), attention_mask=torch.ones(2, 1)).logits
        whole = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        torch.testing.assert_close(
            model(token, past_key_values=copy.deepcopy(memory), attention_mask=whole).logits, expected
        )
        disagreeing = whole.clone()
        disagreeing[1, 0] = 0  # row 1 had no padding
        with pytest.raises(ValueError, match=r"pass the mask of the new tokens only"):
            model(token, past_key_values=copy.deepcopy(memory), attention_mask=disagreeing)
        classifier = TxlForSequenceClassification(tiny_config(num_labels=3, pad_token_id=0, mem_len=16)).eval()
        held = classifier(prompt, attention_mask=mask).past_key_values  # (pools the new tokens' columns too)
        torch.testing.assert_close(
            classifier(token, past_key_values=copy.deepcopy(held), attention_mask=whole).logits,
            classifier(token, past_key_values=copy.deepcopy(held), attention_mask=torch.ones(2, 1)).logits,
        )
        for negative in (None, random_ids(2, 3, seed=7)):
            settings = {"guidance_scale": 1.5, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
            guided = model.generate(prompt, negative_prompt_ids=negative, **settings)
            recomputed = model.generate(prompt, negative_prompt_ids=negative, use_cache=False, **settings)
            assert torch.equal(guided, recomputed)  # (prompt and new tokens within mem_len: the same context)


def test_a_repetition_penalty_is_warned_to_act_on_log_probabilities(caplog):
    """transformers' repetition penalty, made for raw logits, multiplies this model's log-probabilities: far weaker
    than on GPT-2 at the same value, which a user would not see (a helper measured 0.86 -> 0.81 repeated tokens at
    2.0, GPT-2 0.73 -> 0.03). generate() says so, once."""
    import logging

    logging.Logger.warning_once.cache_clear()
    model, prompt = tiny_lm(), random_ids(1, 4)
    with caplog.at_level(logging.WARNING):
        model.generate(prompt, max_new_tokens=2, do_sample=False)
        assert "repetition_penalty" not in caplog.text
        for _ in range(2):
            model.generate(prompt, max_new_tokens=2, do_sample=False, repetition_penalty=1.3)
    assert caplog.text.count("repetition_penalty acts on this model's scores, log-probabilities") == 1


def test_new_tokens_after_a_fed_memory_are_all_fed():
    """The package's own convention still holds: tokens the memory has not seen are fed, even when they are more
    than the memory has seen."""
    model = tiny_lm(mem_len=32)
    context, question = random_ids(1, 4, seed=1), random_ids(1, 9, seed=2)
    memory = TxlMemory.from_config(model.config)
    with torch.no_grad():
        model(context, past_key_values=memory)
    continued = model.generate(question, past_key_values=memory, max_new_tokens=5, min_new_tokens=5)
    whole = model.generate(torch.cat([context, question], dim=1), max_new_tokens=5, min_new_tokens=5)
    assert torch.equal(continued[:, question.shape[1] :], whole[:, 13:])
    assert memory.seen_tokens == 4 + 9 + 4


def test_tokens_already_seen_is_told_by_the_ids():
    model = tiny_lm(mem_len=4)
    memory = TxlMemory.from_config(model.config)
    stream = random_ids(1, 10)
    with torch.no_grad():
        model(stream[:, :6], past_key_values=memory)
    assert memory.seen_tokens == 6
    assert memory.tokens_already_seen(stream) == 6  # the memory's last 4 ids sit at positions 2-5
    assert memory.tokens_already_seen(stream[:, :6]) == 0  # nothing new: not the idiom
    other = stream.clone()
    other[0, 5] = (other[0, 5] + 1) % 97
    assert memory.tokens_already_seen(other) == 0
    embedded = TxlMemory.from_config(model.config)
    with torch.no_grad():
        model(inputs_embeds=model.get_input_embeddings()(stream[:, :6]), past_key_values=embedded)
    assert embedded.seen_tokens == 6 and embedded.tokens_already_seen(stream) == 0  # ids unknown: nothing skipped
    memory.reset()
    assert memory.seen_tokens == 0 and memory.tokens_already_seen(stream) == 0


@pytest.mark.parametrize(
    "settings",
    [
        {"assistant": True},
        {"assistant": True, "do_sample": True},
        {"assistant": True, "repetition_penalty": 1.2},
        {"prompt_lookup_num_tokens": 3},
    ],
    ids=["assisted", "assisted-sampling", "assisted-repetition-penalty", "prompt-lookup"],
)
def test_speculative_decoding_is_refused_up_front(settings):
    model = tiny_lm()
    settings = dict(settings)
    if settings.pop("assistant", False):
        settings["assistant_model"] = tiny_lm(seed=1)
    with pytest.raises(ValueError, match="speculative decoding are not supported"):
        model.generate(random_ids(1, 5), max_new_tokens=4, **settings)


@pytest.mark.parametrize("implementation", ["static", "offloaded", "quantized"])
def test_cache_implementations_are_refused(implementation):
    with pytest.raises(ValueError, match=f"cache_implementation='{implementation}'. cannot be honoured"):
        tiny_lm().generate(random_ids(1, 5), max_new_tokens=2, cache_implementation=implementation)


def test_generate_takes_what_gpt2s_takes_for_lengths_and_a_dynamic_cache():
    """Integral lengths of other types (3.0, a 0-d tensor) and cache_implementation="dynamic" (a cache that grows,
    as the memory does) run as GPT-2's generate() runs them; a length of 2.5 is refused."""
    model, ids = tiny_lm().eval(), random_ids(1, 5)
    expected = model.generate(ids, max_new_tokens=3, do_sample=False)
    for settings in ({"max_new_tokens": 3.0}, {"max_new_tokens": torch.tensor(3), "cache_implementation": "dynamic"}):
        assert torch.equal(model.generate(ids, do_sample=False, **settings), expected)
    # transformers' own processors and beam search take them too once they are ints (GPT-2's fail on 2.0 and 3.0)
    beams = model.generate(ids, max_new_tokens=3, num_beams=2, do_sample=False)
    assert torch.equal(model.generate(ids, max_new_tokens=3.0, num_beams=2, do_sample=False), beams)
    at_least = model.generate(ids, max_new_tokens=3, min_new_tokens=2, eos_token_id=int(expected[0, 5]))
    assert torch.equal(
        model.generate(ids, max_new_tokens=3, min_new_tokens=2.0, eos_token_id=int(expected[0, 5])), at_least
    )
    memory = model.transformer.empty_memory()  # ("dynamic" with a memory of the caller's: transformers refused both)
    with memory.input_is_new():
        model.generate(ids, past_key_values=memory, max_new_tokens=3, do_sample=False, cache_implementation="dynamic")
    assert memory.seen_tokens == 5 + 2
    with pytest.raises(ValueError, match=r"max_new_tokens must be an integer, got 2\.5"):
        model.generate(ids, max_new_tokens=2.5)


def test_generate_from_inputs_embeds():
    model = tiny_lm(mem_len=8)
    prompt = random_ids(2, 5)
    embeds = model.get_input_embeddings()(prompt).detach()
    from_ids = model.generate(prompt, max_new_tokens=6, min_new_tokens=6)
    from_embeds = model.generate(inputs_embeds=embeds, max_new_tokens=6, min_new_tokens=6)
    assert torch.equal(from_embeds, from_ids[:, 5:])  # only the new tokens, as transformers returns them
    chunked = model.generate(inputs_embeds=embeds, max_new_tokens=6, min_new_tokens=6, prefill_chunk_size=2)
    assert torch.equal(chunked, from_embeds)


@pytest.mark.parametrize("mem_len", [4, 32], ids=["memory-shorter-than-the-context", "memory-holds-it-all"])
def test_continuation_idiom_with_inputs_embeds_equals_one_longer_call(mem_len):
    """transformers' idiom passes the whole sequence's embeddings again with the cache: the memory's part is skipped
    (it was fed twice, silently, before), while embeddings new to the memory are all fed (the package's
    convention)."""
    model = tiny_lm(mem_len=mem_len)
    with torch.no_grad():  # weights far from their initial values: a context fed twice changes the tokens
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    embed = model.get_input_embeddings()
    embeds = embed(random_ids(2, 6)).detach()
    kwargs = {"min_new_tokens": 0, "pad_token_id": 0, "return_dict_in_generate": True, "output_logits": True}
    longer = model.generate(inputs_embeds=embeds, max_new_tokens=10, **kwargs)
    first = model.generate(inputs_embeds=embeds, max_new_tokens=4, **kwargs)
    memory = first.past_key_values
    whole = torch.cat([embeds, embed(first.sequences).detach()], dim=1)  # 6 + 4 positions, 9 of them in the memory
    assert memory.embeddings_already_seen(whole) == 9 and memory.embeddings_already_seen(whole[:, :9]) == 0
    second = model.generate(inputs_embeds=whole, past_key_values=memory, max_new_tokens=6, **kwargs)
    assert torch.equal(second.sequences, longer.sequences[:, 4:])
    torch.testing.assert_close(second.logits[0], longer.logits[4], rtol=0, atol=1e-4)
    assert memory.seen_tokens == 6 + 10 - 1  # the memory was not fed twice
    other = whole.clone()
    other[:, 7] += 1.0  # not the memory's embeddings: every one of them is new to it
    assert memory.embeddings_already_seen(other) == 0


def test_the_memory_is_taken_by_either_name_of_the_cache_argument():
    """transformers 5.24 renamed the cache argument `cache` (`past_key_values` deprecated): generate() passes the
    memory to the model by the installed version's name, and callers may use either, in generate() and in forward;
    both at once is refused. (Before, generate() from a memory failed on 5.24: "model_kwargs are not used by the
    model: ['cache']".)"""
    model = tiny_lm()
    prompt, follow = random_ids(1, 4), random_ids(1, 3, seed=1)
    results = {}
    for name in ("past_key_values", "cache"):
        with torch.no_grad():
            memory = model(prompt).past_key_values
            logits = model(follow, **{name: memory}).logits
            memory = model(prompt).past_key_values
            generated = model.generate(follow, max_new_tokens=3, do_sample=False, **{name: memory})
        results[name] = (logits, generated)
    torch.testing.assert_close(results["cache"][0], results["past_key_values"][0], rtol=0, atol=0)
    assert torch.equal(results["cache"][1], results["past_key_values"][1])
    with torch.no_grad():
        memory = model(prompt).past_key_values
        expected = model(torch.cat([prompt, follow], 1)).logits[:, -3:]
    torch.testing.assert_close(results["cache"][0], expected, rtol=0, atol=1e-5)
    for call in (model, model.generate):
        with pytest.raises(TypeError, match="Pass the memory once"):
            call(follow, past_key_values=memory, cache=memory)
        call(follow, past_key_values=memory, cache=None)  # (an unset one of the two names is no second memory)
        for name in ("past_key_values", "cache"):  # a wrong memory: the error names the argument the caller used
            with pytest.raises(TypeError, match=rf"^{name} must be a TxlMemory .* got tuple"):
                call(follow, **{name: (torch.zeros(1),)})


def test_being_another_models_assistant_is_refused():
    """Assisted decoding crops its assistant's cache; as an assistant, the model was handed the prompt's last token
    only and drafted from a memory without the prompt (or failed in the middle of the main model's loop)."""
    torch.manual_seed(0)
    gpt2_config = GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    main_model = GPT2LMHeadModel(gpt2_config).eval()
    for length in (1, 5):
        with pytest.raises(ValueError, match="cannot be another model's assistant_model"):
            main_model.generate(random_ids(1, length), max_new_tokens=6, assistant_model=tiny_lm(), pad_token_id=0)


# ---------------------------------------------------------------------------------------------------------------------
# torch.export


def export_and_run(model, ids, **kwargs):
    program = torch.export.export(model, (ids,), kwargs)
    return program.module()(ids, **kwargs)


def test_device_map_may_offload_the_layers_but_not_the_adaptive_embedding_or_softmax(tmp_path):
    """`from_pretrained(device_map=...)` with the layers offloaded to disk (accelerate loads each layer's weights
    around its call) generates the model's tokens; offloading the adaptive embedding or softmax, which read their
    projections directly, is refused at load with what to do instead of a meta-tensor error at the first token."""
    model = tiny_lm(mem_len=8)
    model.save_pretrained(tmp_path / "model")
    prompt = random_ids(1, 6, seed=3)
    greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = model.generate(prompt, **greedy)
    own = {f"transformer.{name}": "cpu" for name, _ in model.transformer.named_parameters(recurse=False)}
    places = {"transformer.word_embeddings": "cpu", "transformer.layers": "disk", "adaptive_softmax": "cpu", **own}
    offloaded = TxlForCausalLM.from_pretrained(
        tmp_path / "model", device_map=places, offload_folder=str(tmp_path / "offload")
    )
    assert offloaded.transformer.layers[0].attention.qkv_proj.weight.is_meta  # (loaded only around each call)
    assert torch.equal(offloaded.generate(prompt, **greedy), expected)
    for name in ("adaptive_softmax", "transformer.word_embeddings"):
        with pytest.raises(ValueError, match=f"device_map offloads {re.escape(name)} "):
            TxlForCausalLM.from_pretrained(
                tmp_path / "model", device_map={**places, name: "disk"}, offload_folder=str(tmp_path / name)
            )
    with pytest.raises(ValueError, match=r"device_map offloads transformer\.word_embeddings "):  # (all on disk)
        TxlForCausalLM.from_pretrained(
            tmp_path / "model", device_map="auto", max_memory={"cpu": "1KB"}, offload_folder=str(tmp_path / "auto")
        )
    with pytest.raises(ValueError, match=r"offloads word_embeddings .* the layers \(layers\) may be offloaded"):
        TxlModel.from_pretrained(tmp_path / "model", device_map={"": "disk"}, offload_folder=str(tmp_path / "base"))
    with pytest.raises(ValueError, match=r"device_map offloads transformer\.word_embeddings "):  # (its parent)
        TxlForCausalLM.from_pretrained(
            tmp_path / "model",
            device_map={"transformer": "disk", "adaptive_softmax": "cpu"},
            offload_folder=str(tmp_path / "parent"),
        )


@pytest.mark.parametrize(
    "model_class",
    [TxlModel, TxlForCausalLM, TxlForSequenceClassification, TxlForTokenClassification, TxlForQuestionAnswering],
)
def test_each_class_names_only_modules_it_has_as_not_to_be_split(model_class):
    """`_no_split_modules` is what FSDP's auto-wrap (through accelerate) and device maps read: every name must be a
    module class of that model (accelerate's lookup refuses one it cannot find), and the layers and the adaptive
    modules are among them."""
    from accelerate.utils.dataclasses import get_module_class_from_name

    model = model_class(tiny_config())
    names = set(model._no_split_modules)
    assert {"TxlLayer", "TxlAdaptiveEmbedding"} <= names
    assert ("TxlAdaptiveLogSoftmax" in names) == (model_class is TxlForCausalLM)
    for name in names:
        assert get_module_class_from_name(model, name) is not None, name


def test_set_attn_implementation_switches_a_built_model_between_eager_and_sdpa(monkeypatch):
    """`set_attn_implementation` (transformers' way to switch a loaded model's attention) takes effect: a stream
    switched between two tokens continues by the new implementation's path, with the values of a model built with it
    continuing the same memory, and back; an implementation the model lacks is refused."""
    from transfoxl import modeling_txl

    eager_calls = []
    eager = modeling_txl.eager_relative_attention
    monkeypatch.setattr(
        modeling_txl, "eager_relative_attention", lambda *a, **k: eager_calls.append(1) or eager(*a, **k)
    )
    tokens = random_ids(1, 9, seed=2)
    built = {name: tiny_lm(attn_implementation=name, mem_len=8) for name in ("eager", "sdpa")}
    model = tiny_lm(mem_len=8)
    assert model.config._attn_implementation == "sdpa"

    def stream(prompt_model, next_model, switch_to=None):
        with torch.no_grad():
            memory = prompt_model(tokens[:, :6], use_cache=True).past_key_values
            if switch_to is not None:
                next_model.set_attn_implementation(switch_to)
            eager_calls.clear()
            return torch.cat([next_model(tokens[:, i : i + 1], past_key_values=memory).logits for i in range(6, 9)], 1)

    for first, second in (("sdpa", "eager"), ("eager", "sdpa")):
        expected = stream(built[first], built[second])
        model.set_attn_implementation(first)
        torch.testing.assert_close(stream(model, model, switch_to=second), expected)
        assert bool(eager_calls) == (second == "eager")  # (three tokens by the eager path, or none)
        assert model.transformer.layers[0].attention.config._attn_implementation == second
    with pytest.raises(ValueError, match="Flash Attention 2"):
        model.set_attn_implementation("flash_attention_2")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    "model_class", [TxlModel, TxlForCausalLM, TxlForSequenceClassification, TxlForTokenClassification]
)
def test_torch_export_without_memory_equals_eager(model_class, one_thread):
    torch.manual_seed(0)
    model = model_class(tiny_config(pad_token_id=0)).eval()
    ids = random_ids(2, 6)
    exported = export_and_run(model, ids, use_cache=False)
    eager = model(ids, use_cache=False)
    name = "last_hidden_state" if model_class is TxlModel else "logits"
    torch.testing.assert_close(exported[name], eager[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "model_class", [TxlModel, TxlForCausalLM, TxlForSequenceClassification, TxlForTokenClassification]
)
def test_torch_export_with_a_memory_equals_eager(model_class, one_thread):
    torch.manual_seed(0)
    model = model_class(tiny_config(pad_token_id=0)).eval()
    ids = random_ids(2, 6)
    with torch.no_grad():
        first = model(random_ids(2, 5, seed=4), use_cache=True)
    memory = first.past_key_values
    exported = export_and_run(model, ids, past_key_values=memory)
    eager = model(ids, past_key_values=memory)
    name = "last_hidden_state" if model_class is TxlModel else "logits"
    torch.testing.assert_close(exported[name], eager[name], rtol=1e-5, atol=1e-5)
    returned = exported["past_key_values"]  # the exported program returns the updated memory (a new object)
    assert type(returned) is TxlMemory
    assert returned.seen_tokens is None  # a traced forward does not count tokens (unknown, not wrong)
    for kept, expected in zip(returned.layers, eager["past_key_values"].layers):
        torch.testing.assert_close(kept.hidden, expected.hidden, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_a_program_exported_with_a_dynamic_length_equals_eager_at_every_length(attn_implementation, one_thread):
    """Exported from 6 tokens with the batch and length dynamic, the program must compute every other length as
    eager does (or refuse it). With same_length (mem_len 8), the mask's window was a branch on the length, fixed at
    the traced one (an ONNX export, which drops torch.export's checks, was 0.05-0.23 off past mem_len tokens); with
    sdpa the heads' output was reshaped as a view the exported graph could not keep (the ONNX export failed)."""
    torch.manual_seed(0)
    model = TxlForCausalLM(tiny_config(mem_len=8, same_length=True)).eval()
    model.config._attn_implementation = attn_implementation
    dims = {"input_ids": {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}}
    program = torch.export.export(
        model, (), {"input_ids": random_ids(2, 6), "use_cache": False}, dynamic_shapes={**dims, "use_cache": None}
    ).module()
    for batch, length in ((2, 6), (2, 3), (3, 9), (2, 20)):  # (a batch of 1 fails a guard of the program)
        ids = random_ids(batch, length, seed=length)
        with torch.no_grad():
            eager = model(ids, use_cache=False).logits
        torch.testing.assert_close(program(input_ids=ids, use_cache=False)["logits"], eager, rtol=1e-5, atol=1e-5)


def test_torch_export_takes_named_dims_for_the_batch_and_the_length(one_thread):
    """Named dims (`Dim("seq", min=2, max=64)`, what export tutorials and transformers' own exporters use) are checked
    by torch.export against every guard the trace adds. The sinusoid's distances were an arange with a float step,
    whose length torch traces as ceil(K / 1.0): guards no length satisfies, and export refused the dims."""
    torch.manual_seed(0)
    model = TxlForCausalLM(tiny_config(mem_len=8)).eval()
    batch, seq = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(
        model,
        (),
        {"input_ids": random_ids(2, 6), "use_cache": False},
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "use_cache": None},
    ).module()
    for size, length in ((2, 2), (3, 9), (8, 64)):
        ids = random_ids(size, length, seed=length)
        with torch.no_grad():
            eager = model(ids, use_cache=False).logits
        torch.testing.assert_close(program(input_ids=ids, use_cache=False)["logits"], eager, rtol=1e-5, atol=1e-5)


def test_an_exported_program_takes_back_the_memory_it_returns(one_thread):
    """A decode loop over an exported program: each call takes the memory the previous one returned (the memory's
    pytree context is its structure only, not the token count a traced forward cannot keep), and the logits follow
    the eager loop's."""
    torch.manual_seed(0)
    model = TxlForCausalLM(tiny_config(mem_len=8)).eval()
    with torch.no_grad():
        memory = model(random_ids(1, 12, seed=3)).past_key_values  # full: 8 positions, 12 tokens seen
    token = random_ids(1, 1, seed=5)
    program = torch.export.export(model, (token,), {"past_key_values": copy.deepcopy(memory)}).module()
    exported_memory = copy.deepcopy(memory)
    for _ in range(3):
        with torch.no_grad():
            eager = model(token, past_key_values=memory)
        exported = program(token, past_key_values=exported_memory)
        torch.testing.assert_close(exported["logits"], eager.logits, rtol=1e-5, atol=1e-5)
        exported_memory = exported["past_key_values"]
        assert exported_memory.seen_tokens is None
        token = eager.logits[:, -1:].argmax(-1)


class LogitsOnly(torch.nn.Module):
    """The model's log-probabilities for a segment without a memory: what an ONNX graph of it computes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, use_cache=False).logits


@pytest.mark.parametrize(("dynamo", "attn_implementation"), [(True, "eager"), (True, "sdpa"), (False, "sdpa")])
def test_an_onnx_graph_computes_what_the_model_does(dynamo, attn_implementation, tmp_path, one_thread):
    """torch.onnx.export, then onnxruntime, against eager. The dynamo exporter with dynamic batch and length: with
    same_length (mem_len 8) the mask's window was fixed at the traced length (0.05-0.23 off past 8 tokens, silently:
    ONNX keeps none of torch.export's checks), and with sdpa the export failed on a view of the heads' output. The
    tracing exporter (dynamo=False), gradients on as by default: the training kernels were traced, whose writes into
    views ONNX does not keep (0.4-0.5 off at the traced shape, silently)."""
    pytest.importorskip("onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = TxlForCausalLM(tiny_config(mem_len=8, same_length=True)).eval()
    model.config._attn_implementation = attn_implementation
    path = tmp_path / "model.onnx"
    if dynamo:
        dims = {"input_ids": {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}}
        torch.onnx.export(LogitsOnly(model), (random_ids(2, 6),), str(path), dynamo=True, dynamic_shapes=dims)
        shapes = ((2, 6), (2, 3), (3, 9), (2, 20))
    else:
        torch.onnx.export(LogitsOnly(model), (random_ids(2, 6),), str(path), dynamo=False, input_names=["input_ids"])
        shapes = ((2, 6),)
    session = onnxruntime.InferenceSession(str(path))
    for batch, length in shapes:
        ids = random_ids(batch, length, seed=length)
        with torch.no_grad():
            expected = model(ids, use_cache=False).logits
        (computed,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
        torch.testing.assert_close(torch.from_numpy(computed), expected, rtol=1e-5, atol=1e-5)


def test_weights_made_under_inference_mode_meta_weights_and_a_count_as_a_tensor():
    """Where tools put a model: built or copied under torch.inference_mode() (its weights keep no version, which the
    kept projections were keyed on: every forward raised), on the meta device for shapes only (autocast's check
    raised for it), and logits_to_keep as a 0-d tensor (what torch.onnx's tracing exporter passes; refused)."""
    model = tiny_lm()
    ids = random_ids(2, 5)
    with torch.no_grad():
        expected = model(ids).logits
        greedy = model.generate(ids[:1], max_new_tokens=4, do_sample=False)
    with torch.inference_mode():
        copied = copy.deepcopy(model)
        built = TxlForCausalLM(tiny_config()).eval()
        built.load_state_dict(model.state_dict())
    for made in (copied, built):
        with torch.no_grad():
            torch.testing.assert_close(made(ids).logits, expected, rtol=0, atol=1e-6)
            assert torch.equal(made.generate(ids[:1], max_new_tokens=4, do_sample=False), greedy)
    on_meta = copy.deepcopy(model).to("meta")
    assert on_meta(ids.to("meta")).logits.shape == expected.shape
    with torch.no_grad():
        torch.testing.assert_close(model(ids, logits_to_keep=torch.tensor(0)).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(
            model(ids, logits_to_keep=torch.tensor(2)).logits, expected[:, -2:], rtol=0, atol=1e-6
        )


def test_dynamic_quantization_after_inference_computes_and_decodes():
    """torch.ao's dynamic quantization replaces the linear layers (their weight becomes a method): a model that had
    run inference kept a projected position table, whose check read the replaced layer's weight (AttributeError)."""
    model = tiny_lm()
    ids = random_ids(1, 6)
    with torch.no_grad():
        expected = model(ids).logits
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():
        torch.testing.assert_close(quantized(ids).logits, expected, rtol=0, atol=0.05)
        assert quantized.generate(ids, max_new_tokens=4, do_sample=False).shape == (1, 10)


# ---------------------------------------------------------------------------------------------------------------------
# Remote-code classes beside the package's


def test_remote_code_model_works_with_the_packages_memory_and_streams(tmp_path):
    model = tiny_lm()
    model.save_pretrained(tmp_path / "model")
    remote_class = get_class_from_dynamic_module("modeling_txl.TxlForCausalLM", str(tmp_path / "model"))
    assert remote_class is not TxlForCausalLM and remote_class.__module__.startswith("transformers_modules")
    remote = remote_class.from_pretrained(tmp_path / "model").eval()
    ids = random_ids(1, 30)

    streams = [TxlStream(each, segment_len=8) for each in (remote, model)]
    generated = [stream.feed(ids).generate(max_new_tokens=5) for stream in streams]
    assert torch.equal(*generated)
    losses = [evaluate_stream(each, ids[0], tgt_len=8, mem_len=8).loss for each in (remote, model)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)

    with torch.no_grad():
        package_memory = TxlMemory.from_config(model.config)
        remote(ids[:, :8], past_key_values=package_memory)
        remote_memory = remote(ids[:, :8]).past_key_values  # the remote module's own TxlMemory
        assert type(remote_memory) is not TxlMemory
        from_remote = model(ids[:, 8:12], past_key_values=remote_memory).logits
        from_package = model(ids[:, 8:12], past_key_values=package_memory).logits
    torch.testing.assert_close(from_remote, from_package, rtol=0, atol=0)


def test_other_caches_are_still_refused(lm):
    from transformers import DynamicCache

    with pytest.raises(TypeError, match="past_key_values must be a TxlMemory"):
        lm(random_ids(1, 3), past_key_values=DynamicCache())


# ---------------------------------------------------------------------------------------------------------------------
# resize_token_embeddings


@pytest.mark.parametrize(
    "overrides",
    [{"cutoffs": [], "div_val": 1}, {}, {"div_val": 1}, {"tie_word_embeddings": False}],
    ids=["plain-softmax", "adaptive-div2", "adaptive-div1", "untied"],
)
def test_resize_token_embeddings_grows_the_last_cluster(overrides, tmp_path):
    model = tiny_lm(**overrides)
    ids = random_ids(2, 7)
    before = model(ids).logits.detach()
    start = model.config.cluster_bounds[-2]
    model.resize_token_embeddings(101)
    assert model.config.vocab_size == 101 and model.config.cutoffs == tiny_lm(**overrides).config.cutoffs
    after = model(ids).logits.detach()
    assert after.shape == (2, 7, 101)
    torch.testing.assert_close(after.exp().sum(-1), torch.ones(2, 7), rtol=0, atol=1e-5)
    # Tokens before the last cluster keep their probabilities; the last cluster's old tokens keep their ratios.
    torch.testing.assert_close(after[..., :start], before[..., :start], rtol=0, atol=1e-5)
    shift = after[..., start:97] - before[..., start:]
    torch.testing.assert_close(shift, shift[..., :1].expand_as(shift), rtol=0, atol=1e-5)
    embeddings, softmax = model.transformer.word_embeddings, model.adaptive_softmax
    tied = model.config.tie_word_embeddings
    assert (embeddings.embeddings[-1].weight is softmax.output_layers[-1].weight) == tied

    model.train()
    new_tokens = torch.tensor([[97, 98, 100, 3, 99]])
    model(new_tokens, labels=new_tokens).loss.backward()
    assert embeddings.embeddings[-1].weight.grad[-4:].abs().sum() > 0
    model.save_pretrained(tmp_path / "resized")
    reloaded = TxlForCausalLM.from_pretrained(tmp_path / "resized").eval()
    # (to float32 rounding: the loaded weights' alignment may change BLAS's sums of a few rows, see test_modeling_txl)
    torch.testing.assert_close(reloaded(ids).logits, model.eval()(ids).logits, rtol=1.3e-6, atol=1e-6)


@pytest.mark.parametrize(
    "model_class",
    [TxlForCausalLM, TxlModel, TxlForSequenceClassification, TxlForTokenClassification, TxlForQuestionAnswering],
)
def test_an_input_embedding_the_config_cannot_describe_runs_but_does_not_save(model_class, tmp_path):
    """transformers' set_input_embeddings takes any module, and the model runs with it; but from_pretrained would
    build the config's adaptive embedding and refuse the folder, so save_pretrained refuses first, writing nothing."""
    model = model_class(tiny_config())
    model.set_input_embeddings(torch.nn.Embedding(97, model.config.d_model))
    assert model(random_ids(1, 5))[0].shape[0] == 1  # (it runs)
    with pytest.raises(TypeError, match=r"the input embedding is a Embedding, which the config cannot describe"):
        model.save_pretrained(tmp_path / "replaced")
    assert not (tmp_path / "replaced").exists()
    assert model.get_output_embeddings() is None  # the adaptive softmax's clusters have no single matrix


def test_resize_token_embeddings_shrinks_and_pads_and_refuses_inner_clusters():
    model = tiny_lm()
    model.resize_token_embeddings(60)
    assert model(torch.tensor([[59, 1]])).logits.shape == (1, 2, 60)
    model.resize_token_embeddings(61, pad_to_multiple_of=8)
    assert model.config.vocab_size == 64
    with pytest.raises(ValueError, match=r"only the last cluster .* starts at token 50"):
        model.resize_token_embeddings(50)
    with pytest.raises(ValueError, match=r"new_num_tokens must be a positive integer, got 1\.5"):
        model.resize_token_embeddings(1.5)
    assert model.resize_token_embeddings() is model.get_input_embeddings() and model.config.vocab_size == 64
