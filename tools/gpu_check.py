"""The CUDA paths checked and timed on one GPU, in a few minutes: what the CPU machines cannot run.

    python tools/gpu_check.py --out benchmarks            # on a machine with a GPU: gpu.json and gpu.md
    python tools/gpu_check.py --device cpu --quick --out /tmp/gpu   # the same code on the CPU, tiny (the tests)

Checks (random weights, the mid configuration: adaptive embedding and softmax with div_val 2), each recorded as
passed or failed with its figures, a failure not stopping the others:
- the device's logits against the CPU's (fp32, TF32 off), SDPA and eager attention, a segment after a memory;
- greedy decoding on the device against the CPU (logits of every step, the tokens), a model used on the CPU moved;
- a training step's gradients, SDPA against eager on the device, and against the CPU; with dropout and gradient
  checkpointing (reentrant and not) against the same step without checkpointing;
- bf16 and fp16 autocast: the loss near fp32's, finite gradients (through the adaptive embedding and softmax's
  float32 log-softmax), generate() runs; a model cast to bf16 outright too;
- beam search and a batch with left padding through generate();
- transformers' Trainer with bf16 (and fp16 on a GPU), a PEFT LoRA adapter, torch.export with a memory;
- training under torch.compile with dropout: the gradient through the kept units, the loss falling as eager's.
Timings (CUDA synchronised, medians): the mid decode step and prefill at batch 1 and 8 against transformers' GPT-2 of
the same size (with its KV cache), the same at batch 1 with the forward under torch.compile, the wt103
configuration's decode step and prefill (fp32 and bf16 weights), and mid training tokens/s (fp32, bf16 autocast).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__:
    from . import configs
    from .bench_decode import build_gpt2, build_transfoxl, generate_kwargs, gpt2_config_for, make_prompt, step_clock
else:
    import configs
    from bench_decode import build_gpt2, build_transfoxl, generate_kwargs, gpt2_config_for, make_prompt, step_clock


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def relative_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - e| / max |e|, in float32 on the CPU."""
    actual, expected = actual.detach().float().cpu(), expected.detach().float().cpu()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


# ---------------------------------------------------------------------------------------------------------------------
# Checks


def build_with(config: dict, implementation: str, mem_len: int, device: torch.device) -> torch.nn.Module:
    """The seeded model with attention `implementation` ("sdpa" or "eager"), on `device`."""
    model = build_transfoxl(dict(config, attn_implementation=implementation), mem_len=mem_len, seed=0).to(device)
    if model.config._attn_implementation != implementation:
        raise AssertionError(f"asked for {implementation}, built {model.config._attn_implementation}")
    return model


def check_logits(config: dict, device: torch.device, q_len: int) -> dict:
    """Two segments (the second attends to the first as memory): device against CPU, SDPA and eager."""
    cpu_model = build_transfoxl(config, mem_len=q_len, seed=0)
    tokens = make_prompt(config["vocab_size"], 2, 2 * q_len, seed=0)
    with torch.no_grad():
        memory = cpu_model(tokens[:, :q_len], use_cache=True).past_key_values
        expected = cpu_model(tokens[:, q_len:], past_key_values=memory).logits
    result = {}
    for implementation in ("sdpa", "eager"):
        model = build_with(config, implementation, q_len, device)
        on_device = tokens.to(device)
        with torch.no_grad():
            memory = model(on_device[:, :q_len], use_cache=True).past_key_values
            logits = model(on_device[:, q_len:], past_key_values=memory).logits
        result[implementation] = relative_difference(logits, expected)
    result["passed"] = max(result.values()) < 1e-4
    return result


def check_greedy(config: dict, device: torch.device, prompt_len: int, new_tokens: int) -> dict:
    """greedy generate() on the device against the CPU: the scores of every step and the tokens. One model, used on
    the CPU and then moved, as a pipeline moves it (what it kept from the CPU must not be read on the device)."""
    prompt = make_prompt(config["vocab_size"], 2, prompt_len, seed=1)
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, output_scores=True, return_dict_in_generate=True)
    kwargs.update(pad_token_id=0)
    model = build_transfoxl(config, mem_len=prompt_len, seed=0)
    cpu = model.generate(prompt, **kwargs)
    gpu = model.to(device).generate(prompt.to(device), **kwargs)
    same = int((gpu.sequences.cpu() == cpu.sequences).all(dim=0).sum()) - prompt_len
    first_steps = min(len(cpu.scores), len(gpu.scores))
    # Until the first differing token both decode the same stream: their scores must agree there.
    agree = next(
        (
            i
            for i in range(new_tokens)
            if not torch.equal(gpu.sequences[:, prompt_len + i].cpu(), cpu.sequences[:, prompt_len + i])
        ),
        new_tokens,
    )
    scores = max(relative_difference(gpu.scores[i], cpu.scores[i]) for i in range(min(first_steps, agree + 1)))
    return {"same_new_tokens": same, "new_tokens": new_tokens, "scores": scores, "passed": scores < 1e-4}


def check_training_gradients(config: dict, device: torch.device, q_len: int) -> dict:
    """One training segment after a memory, dropout off: gradients of SDPA against eager on the device, and the
    device's against the CPU's."""
    tokens = make_prompt(config["vocab_size"], 2, 2 * q_len + 1, seed=2)

    def gradients(model: torch.nn.Module, on: torch.device) -> dict[str, torch.Tensor]:
        model.train()
        ids = tokens.to(on)
        memory = model(ids[:, :q_len], use_cache=True).past_key_values
        loss = model(ids[:, q_len : 2 * q_len], labels=ids[:, q_len : 2 * q_len], past_key_values=memory).loss
        loss.backward()
        return {name: p.grad.detach().float().cpu() for name, p in model.named_parameters() if p.grad is not None}

    quiet = dict(config, dropout=0.0, dropatt=0.0)
    expected = gradients(build_transfoxl(quiet, mem_len=q_len, seed=0), torch.device("cpu"))
    result = {}
    for implementation in ("sdpa", "eager"):
        grads = gradients(build_with(quiet, implementation, q_len, device), device)
        if grads.keys() != expected.keys():
            raise AssertionError(f"{implementation}: gradients of {sorted(grads.keys() ^ expected.keys())} differ")
        result[implementation] = max(relative_difference(grads[name], expected[name]) for name in expected)
    result["passed"] = max(result.values()) < 1e-3
    return result


def check_checkpointing(config: dict, device: torch.device, q_len: int) -> dict:
    """A training step with dropout (SDPA's attention dropout too) and gradient checkpointing, reentrant and not:
    the gradients of the same seed without checkpointing (a recomputed layer draws the masks its first forward
    drew), far nearer to them than a step with other masks."""
    tokens = make_prompt(config["vocab_size"], 2, 2 * q_len, seed=14).to(device)

    def gradients(checkpointing: dict | None, seed: int) -> dict[str, torch.Tensor]:
        model = build_with(dict(config, dropout=0.1, dropatt=0.1), "sdpa", q_len, device).train()
        if checkpointing is not None:
            model.activation_checkpointing_enable(checkpointing)
        torch.manual_seed(seed)
        memory = model(tokens[:, :q_len], use_cache=True).past_key_values
        model(tokens[:, q_len:], labels=tokens[:, q_len:], past_key_values=memory).loss.backward()
        return {name: p.grad.detach().float().cpu() for name, p in model.named_parameters() if p.grad is not None}

    def farthest(grads: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
        if grads.keys() != expected.keys():
            raise AssertionError(f"gradients of {sorted(grads.keys() ^ expected.keys())} differ")
        return max(relative_difference(grads[name], expected[name]) for name in expected)

    expected = gradients(None, seed=0)
    result = {
        "reentrant": farthest(gradients({"use_reentrant": True}, seed=0), expected),
        "non_reentrant": farthest(gradients({"use_reentrant": False}, seed=0), expected),
        "other_masks": farthest(gradients(None, seed=1), expected),
    }
    result["passed"] = max(result["reentrant"], result["non_reentrant"]) < min(1e-3, result["other_masks"] / 100)
    return result


def check_autocast(config: dict, device: torch.device, q_len: int, dtype: torch.dtype) -> dict:
    """Loss and gradients under autocast against fp32, through the adaptive embedding and softmax; generate()."""
    tokens = make_prompt(config["vocab_size"], 2, q_len, seed=3).to(device)
    model = build_transfoxl(dict(config, dropout=0.0, dropatt=0.0), mem_len=q_len, seed=0).to(device).train()
    with torch.no_grad():
        reference = model(tokens, labels=tokens).loss.item()
    with torch.autocast(device.type, dtype=dtype):
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        generated = model.eval().generate(tokens[:, :8], max_new_tokens=8, do_sample=False, pad_token_id=0)
    finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    difference = abs(loss.item() - reference) / abs(reference)
    return {
        "loss": loss.item(),
        "fp32_loss": reference,
        "loss_dtype": str(loss.dtype),
        "relative_difference": difference,
        "finite_gradients": bool(finite),
        "generated_shape": list(generated.shape),
        "passed": bool(finite) and difference < 2e-2 and list(generated.shape) == [2, 16],
    }


def check_bf16_weights(config: dict, device: torch.device, q_len: int) -> dict:
    tokens = make_prompt(config["vocab_size"], 2, q_len, seed=4).to(device)
    model = build_transfoxl(config, mem_len=q_len, seed=0).to(device)
    with torch.no_grad():
        reference = model(tokens, labels=tokens).loss.item()
        model = model.to(torch.bfloat16)
        loss = model(tokens, labels=tokens).loss.item()
        generated = model.generate(tokens[:, :8], max_new_tokens=8, do_sample=False, pad_token_id=0)
    difference = abs(loss - reference) / abs(reference)
    return {
        "loss": loss,
        "fp32_loss": reference,
        "relative_difference": difference,
        "passed": difference < 3e-2 and list(generated.shape) == [2, 16],
    }


def check_generate_modes(config: dict, device: torch.device, prompt_len: int) -> dict:
    """Beam search, and a batch with left padding (the padded row equals its unpadded self)."""
    model = build_transfoxl(config, mem_len=64, seed=0).to(device)
    prompt = make_prompt(config["vocab_size"], 2, prompt_len, seed=5).to(device)
    beams = model.generate(prompt, max_new_tokens=8, num_beams=3, do_sample=False, pad_token_id=0)
    short = prompt[1:, 3:]
    padded = torch.cat([torch.zeros_like(prompt[1:, :3]), short], dim=1)
    batch = torch.cat([prompt[:1], padded])
    mask = (batch != 0).long()
    together = model.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    alone = model.generate(short, max_new_tokens=8, do_sample=False, pad_token_id=0)
    same = torch.equal(together[1, -8:], alone[0, -8:])
    return {
        "beam_shape": list(beams.shape),
        "padded_row_equals_alone": same,
        "passed": list(beams.shape) == [2, prompt_len + 8] and same,
    }


def check_trainer(config: dict, device: torch.device, q_len: int, dtype: torch.dtype) -> dict:
    """transformers' Trainer on the device with `bf16=True` / `fp16=True` (its autocast and, for fp16, its gradient
    scaler): a few steps train to finite weights and a lower loss; its evaluation loss equals the model's own."""
    import tempfile

    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    rows = make_prompt(config["vocab_size"], 16, q_len, seed=9)
    rows = torch.cat([rows[:, : q_len // 2]] * 2, dim=1)  # a repeated half: learnable in a few steps
    dataset = Dataset.from_list([{"input_ids": row, "labels": row} for row in rows.tolist()])
    model = build_transfoxl(dict(config, dropout=0.0, dropatt=0.0), mem_len=q_len, seed=0).train()
    with tempfile.TemporaryDirectory() as folder:
        args = TrainingArguments(
            output_dir=folder,
            report_to="none",
            use_cpu=device.type == "cpu",
            bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            max_steps=8,
            learning_rate=3e-3,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=dataset, eval_dataset=dataset)
        before = trainer.evaluate()["eval_loss"]
        trainer.train()
        after = trainer.evaluate()["eval_loss"]
    placed = str(next(model.parameters()).device)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
        ids = torch.tensor(dataset["input_ids"], device=next(model.parameters()).device)
        own = sum(model(batch, labels=batch).loss.item() for batch in ids.split(8)) / len(ids.split(8))
    finite = all(bool(p.isfinite().all()) for p in model.parameters())
    return {
        "device": placed,
        "eval_loss_before": before,
        "eval_loss_after": after,
        "models_own_loss": own,
        "finite_weights": finite,
        "passed": finite and after < before and abs(after - own) / own < 1e-2 and placed.startswith(device.type),
    }


def check_peft(config: dict, device: torch.device, q_len: int) -> dict:
    """A LoRA adapter on every linear layer (PEFT), on the device: its outputs differ from the base model's and equal
    the merged model's; a training step updates only the adapter."""
    import peft

    model = build_transfoxl(dict(config, dropout=0.0, dropatt=0.0), mem_len=q_len, seed=0).to(device)
    ids = make_prompt(config["vocab_size"], 2, q_len, seed=10).to(device)
    with torch.no_grad():
        base = model(ids).logits
    adapted = peft.get_peft_model(model, peft.LoraConfig(target_modules="all-linear", r=4, init_lora_weights=False))
    adapted.train()
    adapted(ids, labels=ids).loss.backward()
    trained = {name for name, p in adapted.named_parameters() if p.grad is not None}
    adapted.eval()
    with torch.no_grad():
        adapter_logits = adapted(ids).logits
        merged = adapted.merge_and_unload()(ids).logits
    only_adapter = bool(trained) and all("lora_" in name for name in trained)
    return {
        "merged_vs_adapter": relative_difference(merged, adapter_logits),
        "adapter_vs_base": relative_difference(adapter_logits, base),
        "only_adapter_trained": only_adapter,
        "passed": relative_difference(merged, adapter_logits) < 1e-4
        and relative_difference(adapter_logits, base) > 1e-4
        and only_adapter,
    }


def check_export(config: dict, device: torch.device, q_len: int) -> dict:
    """torch.export of the model on the device, called with a memory: the exported program's logits and returned
    memory equal eager's."""
    model = build_transfoxl(config, mem_len=q_len, seed=0).to(device)
    ids = make_prompt(config["vocab_size"], 2, 2 * q_len, seed=11).to(device)
    with torch.no_grad():
        memory = model(ids[:, :q_len], use_cache=True).past_key_values
        eager = model(ids[:, q_len:], past_key_values=copy.deepcopy(memory))
        program = torch.export.export(model, (ids[:, q_len:],), {"past_key_values": copy.deepcopy(memory)})
        exported = program.module()(ids[:, q_len:], past_key_values=copy.deepcopy(memory))
    logits = relative_difference(exported["logits"], eager.logits)
    memories = max(
        relative_difference(ours.hidden, theirs.hidden)
        for ours, theirs in zip(exported["past_key_values"].layers, eager.past_key_values.layers)
    )
    return {"logits": logits, "memory": memories, "passed": logits < 1e-5 and memories < 1e-5}


def check_compiled_training(config: dict, device: torch.device, q_len: int, backend: str) -> dict:
    """Training under torch.compile (`backend`: inductor on a GPU, aot_eager in the CPU test), dropout on: the
    gradient through each dropout flows through the units its forward kept (torch 2.11's compile gave none), and a
    few compiled steps lower the loss about as much as eager steps do (dropout draws differ)."""
    from transfoxl.kernels_txl import dropout, relu_dropout

    gradient_errors = {}
    for name, function in (("dropout", dropout), ("relu_dropout", relu_dropout)):
        inputs = (make_prompt(50, 4, 256, seed=12).float() + 1.0).to(device).requires_grad_()
        weights = torch.randn(4, 256, device=device)
        torch._dynamo.reset()
        output = torch.compile(lambda x, f=function: f(x, 0.25, True), backend=backend, fullgraph=True)(inputs)
        (output * weights).sum().backward()
        gradient_errors[name] = relative_difference(inputs.grad, weights * (output != 0) / 0.75)
    rows = make_prompt(config["vocab_size"], 8, q_len // 2, seed=13)
    ids = torch.cat([rows, rows], dim=1).to(device)  # a repeated half: learnable in a few steps

    def final_loss(compiled: bool) -> float:
        torch.manual_seed(0)
        model = build_transfoxl(dict(config, dropout=0.1), mem_len=q_len, seed=0).to(device).train()
        run = torch.compile(model, backend=backend) if compiled else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(12):
            loss = run(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.item()

    torch._dynamo.reset()
    eager, compiled = final_loss(False), final_loss(True)
    first = build_transfoxl(config, mem_len=q_len, seed=0).to(device)(ids, labels=ids).loss.item()
    return {
        **{f"{name}_gradient": error for name, error in gradient_errors.items()},
        "first_loss": first,
        "eager_loss": eager,
        "compiled_loss": compiled,
        "passed": max(gradient_errors.values()) < 1e-5 and first - compiled > 0.7 * (first - eager) > 0,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Timings


def time_generate(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, device: torch.device) -> dict:
    """Prefill (the prompt's forward) and the decode step (median interval of greedy generate() tokens), the device
    synchronised before each time is read."""
    from transformers import StoppingCriteriaList

    kwargs = generate_kwargs(new_tokens)
    model.generate(prompt[:, :16], **generate_kwargs(4))  # warm-up
    runs = []
    for _ in range(3):
        clock = step_clock(synchronize=lambda: synchronize(device))
        synchronize(device)
        start = time.perf_counter()
        model.generate(prompt, stopping_criteria=StoppingCriteriaList([clock]), **kwargs)
        steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
        runs.append({"prefill_s": clock.times[0] - start, "step_ms": 1e3 * statistics.median(steps)})
    return {name: statistics.median(run[name] for run in runs) for name in ("prefill_s", "step_ms")}


def time_mid_against_gpt2(device: torch.device, config: dict, prompt_len: int, new_tokens: int, batches) -> dict:
    transfoxl = build_transfoxl(config, mem_len=prompt_len, seed=0).to(device)
    gpt2 = build_gpt2(gpt2_config_for(config, n_positions=prompt_len + new_tokens + 16), seed=0).to(device)
    result = {}
    for batch in batches:
        prompt = make_prompt(config["vocab_size"], batch, prompt_len, seed=6).to(device)
        with torch.no_grad():
            ours, theirs = (
                time_generate(transfoxl, prompt, new_tokens, device),
                time_generate(gpt2, prompt, new_tokens, device),
            )
        result[str(batch)] = {
            "transfoxl": ours,
            "gpt2": theirs,
            "ratio": {name: ours[name] / theirs[name] for name in ours},
        }
    return result


def time_compiled(device: torch.device, config: dict, prompt_len: int, new_tokens: int, backend: str) -> dict:
    """Greedy decoding at batch 1 with the forward under `torch.compile(fullgraph=True, dynamic=True)` (`backend`:
    inductor on a GPU; the tests' quick run on a CPU takes aot_eager): the same tokens as eager, and its times."""
    model = build_transfoxl(config, mem_len=prompt_len, seed=0).to(device)
    prompt = make_prompt(config["vocab_size"], 1, prompt_len, seed=6).to(device)
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        eager = time_generate(model, prompt, new_tokens, device)
        eager_tokens = model.generate(prompt, **kwargs)
        start = time.perf_counter()
        model.forward = torch.compile(model.forward, fullgraph=True, dynamic=True, backend=backend)
        same = torch.equal(model.generate(prompt, **kwargs), eager_tokens)
        first_call_s = time.perf_counter() - start
        compiled = time_generate(model, prompt, new_tokens, device)
    return {
        "backend": backend,
        "eager": eager,
        "compiled": compiled,
        "compile_and_first_generate_s": first_call_s,
        "same_tokens": same,
    }


def time_wt103(device: torch.device, config: dict, prompt_len: int, new_tokens: int) -> dict:
    model = build_transfoxl(config, mem_len=1600 if config["d_model"] >= 1024 else 32, seed=0).to(device)
    prompt = make_prompt(config["vocab_size"], 1, prompt_len, seed=7).to(device)
    result = {"fp32": time_generate(model, prompt, new_tokens, device)}
    result["bf16_weights"] = time_generate(model.to(torch.bfloat16), prompt, new_tokens, device)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    return result


def time_training(device: torch.device, config: dict, batch: int, q_len: int, steps: int) -> dict:
    result = {}
    tokens = make_prompt(config["vocab_size"], batch, q_len * (steps + 3) + 1, seed=8).to(device)
    for name, dtype in (("fp32", None), ("bf16_autocast", torch.bfloat16)):
        model = build_transfoxl(dict(config, dropout=0.1), mem_len=q_len, seed=0).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2.5e-4, fused=device.type == "cuda")
        memory, times = None, []
        for step in range(steps + 2):
            ids = tokens[:, step * q_len : (step + 1) * q_len]
            targets = tokens[:, step * q_len + 1 : (step + 1) * q_len + 1]
            synchronize(device)
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                output = model(ids, shift_labels=targets, past_key_values=memory, return_logits=False)
            output.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            memory = output.past_key_values
            synchronize(device)
            if step >= 2:
                times.append(time.perf_counter() - start)
        result[name] = {
            "tokens_per_s": batch * q_len / statistics.median(times),
            "step_ms": 1e3 * statistics.median(times),
        }
    return result


# ---------------------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # the parity checks compare fp32 to fp32
    torch.backends.cudnn.allow_tf32 = False
    mid = configs.model_config("tiny" if args.quick else "mid")
    wt103 = configs.model_config("tiny_wt103" if args.quick else "wt103")
    q_len = 16 if args.quick else 64
    prompt_len, new_tokens = (16, 4) if args.quick else (512, 64)
    facts = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "quick": args.quick,
    }
    import transformers

    facts["transformers"] = transformers.__version__
    checks: dict[str, Callable[[], dict]] = {
        "logits_vs_cpu": lambda: check_logits(mid, device, q_len),
        "greedy_vs_cpu": lambda: check_greedy(mid, device, q_len, 16 if not args.quick else 4),
        "training_gradients": lambda: check_training_gradients(mid, device, q_len),
        "checkpointing_dropout": lambda: check_checkpointing(mid, device, q_len),
        "autocast_bf16": lambda: check_autocast(mid, device, q_len, torch.bfloat16),
        "autocast_fp16": lambda: check_autocast(mid, device, q_len, torch.float16),
        "bf16_weights": lambda: check_bf16_weights(mid, device, q_len),
        "generate_modes": lambda: check_generate_modes(mid, device, q_len),
        "trainer_bf16": lambda: check_trainer(mid, device, q_len, torch.bfloat16),
        "trainer_fp16": lambda: check_trainer(mid, device, q_len, torch.float16),
        "peft_lora": lambda: check_peft(mid, device, q_len),
        "torch_export": lambda: check_export(mid, device, q_len),
        "compiled_training": lambda: check_compiled_training(
            mid, device, q_len, "inductor" if device.type == "cuda" else "aot_eager"
        ),
    }
    if device.type == "cpu":
        checks.pop("autocast_fp16")  # (fp16 autocast on a CPU: not a path anyone takes)
        checks.pop("trainer_fp16")  # (Trainer refuses fp16 on a CPU)
    timings: dict[str, Callable[[], dict]] = {
        "mid_vs_gpt2": lambda: time_mid_against_gpt2(device, mid, prompt_len, new_tokens, [1, 8]),
        "wt103_generate": lambda: time_wt103(device, wt103, prompt_len, 16 if not args.quick else 4),
        "mid_compiled_decoding": lambda: time_compiled(
            device, mid, prompt_len, new_tokens, "inductor" if device.type == "cuda" else "aot_eager"
        ),
        "mid_training": lambda: time_training(
            device, mid, 8, 128 if not args.quick else 16, 10 if not args.quick else 2
        ),
    }
    results: dict[str, Any] = {"facts": facts, "checks": {}, "timings": {}}
    for group, items in (("checks", checks), ("timings", timings)):
        for name, call in items.items():
            start = time.perf_counter()
            try:
                entry = call()
            except Exception as error:  # recorded: the other checks still run
                entry = {
                    "passed": False,
                    "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc(limit=8),
                }
            entry["seconds"] = time.perf_counter() - start
            results[group][name] = entry
            print(f"{group}/{name}: {json.dumps(entry, default=str)[:600]}", flush=True)
    return results


def timing_lines(timings: dict) -> list[str]:
    """The timings as tables (a part that failed: its error)."""
    lines = []
    mid = timings.get("mid_vs_gpt2", {})
    if "error" in mid:
        lines += [f"mid against GPT-2: failed ({mid['error']})", ""]
    elif mid:
        lines += [
            "| mid, greedy generate() after the prompt | transfoxl | GPT-2 (KV cache) | transfoxl / GPT-2 |",
            "|---|---|---|---|",
        ]
        for batch in sorted((key for key in mid if key.isdigit()), key=int):
            entry = mid[batch]
            for name, unit, scale in (("prefill_s", "prefill (ms)", 1e3), ("step_ms", "decode step (ms)", 1.0)):
                lines.append(
                    f"| batch {batch}, {unit} | {scale * entry['transfoxl'][name]:.2f} | "
                    f"{scale * entry['gpt2'][name]:.2f} | {entry['ratio'][name]:.2f}x |"
                )
        lines.append("")
    compiled = timings.get("mid_compiled_decoding", {})
    if "error" in compiled:
        lines += [f"mid, compiled forward: failed ({compiled['error']})", ""]
    elif compiled:
        lines += [
            f"| mid, batch 1, the forward under torch.compile ({compiled['backend']}, fullgraph, dynamic) | eager | "
            "compiled |",
            "|---|---|---|",
            f"| prefill (ms) | {1e3 * compiled['eager']['prefill_s']:.2f} | "
            f"{1e3 * compiled['compiled']['prefill_s']:.2f} |",
            f"| decode step (ms) | {compiled['eager']['step_ms']:.2f} | {compiled['compiled']['step_ms']:.2f} |",
            "",
            f"Compiling and the first generate(): {compiled['compile_and_first_generate_s']:.0f} s; the same greedy "
            f"tokens as eager: {'yes' if compiled['same_tokens'] else '**no**'}.",
            "",
        ]
    wt103 = timings.get("wt103_generate", {})
    if "error" in wt103:
        lines += [f"wt103: failed ({wt103['error']})", ""]
    elif wt103:
        lines += [
            f"| wt103 configuration ({wt103['parameters']:,} parameters), batch 1 | prefill (ms) | decode step (ms) |",
            "|---|---|---|",
        ]
        for name in ("fp32", "bf16_weights"):
            lines.append(f"| {name} | {1e3 * wt103[name]['prefill_s']:.1f} | {wt103[name]['step_ms']:.2f} |")
        lines.append("")
    training = timings.get("mid_training", {})
    if "error" in training:
        lines += [f"mid training: failed ({training['error']})", ""]
    elif training:
        lines += ["| mid training, batch 8 x 128, mem_len 128, fused AdamW | tokens/s | step (ms) |", "|---|---|---|"]
        for name in ("fp32", "bf16_autocast"):
            lines.append(f"| {name} | {training[name]['tokens_per_s']:,.0f} | {training[name]['step_ms']:.1f} |")
        lines.append("")
    return lines


def markdown(results: dict) -> str:
    facts = results["facts"]
    quick = " (quick: tiny models, not a measurement)" if facts["quick"] else ""
    lines = [
        "# GPU check (`tools/gpu_check.py`)",
        "",
        f"{facts['device']}, torch {facts['torch']}, transformers {facts['transformers']}{quick}. Random weights; "
        "checks in fp32 with TF32 off unless named; timings are medians of 3 runs (CUDA synchronised).",
        "",
        "| check | passed | figures |",
        "|---|---|---|",
    ]
    for name, entry in results["checks"].items():
        figures = ", ".join(
            f"{key} {value:.2e}" if isinstance(value, float) else f"{key} {value}"
            for key, value in entry.items()
            if key not in ("passed", "seconds", "traceback")
        )
        lines.append(f"| {name} | {'yes' if entry['passed'] else '**no**'} | {figures} |")
    lines += ["", *timing_lines(results["timings"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps: seconds (the tests)")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu.json and gpu.md")
    parser.add_argument("--markdown-only", action="store_true", help="run nothing: gpu.md again from --out's gpu.json")
    args = parser.parse_args(argv)
    if args.markdown_only:
        (args.out / "gpu.md").write_text(markdown(json.loads((args.out / "gpu.json").read_text())))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / "gpu.md").write_text(markdown(results))
    failed = [name for name, entry in results["checks"].items() if not entry["passed"]]
    print(markdown(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
