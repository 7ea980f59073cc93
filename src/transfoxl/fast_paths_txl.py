"""The fast paths' bookkeeping: what lets a decoded token skip module calls and per-token checks.

modeling_txl.py computes Transformer-XL as the paper describes it; where a module call, or the checks that decide
whether a compiled kernel applies, would cost a decoded token more than its arithmetic, it asks this file:

- whether a module is *bare* (its own type, forward, no hooks or adapters: `_is_bare`), so that its parameters say
  what it computes and the call may be skipped (`_project`, `_layer_norm`, `_dropout`, `_linear`);
- whether a call is one row in CPU inference, where the one-row compiled operators apply (`_one_row_inference`);
- a number for each weight object (`_identity`), which results kept across calls (keys and values, projected
  position tables) are tagged with, and a fingerprint of a weight's values (`_weight_fingerprint`);
- the results kept across inference calls: each layer's projected position table (`kept_relative_keys`) and the
  version the memory's keys and values are tagged with (`projection_version`);
- the fused decoding steps, one compiled call each: every layer for a token (`decode_token`), one layer
  (`decode_one_row`), the adaptive softmax of one row (`one_row_log_probs`);
- the plans that keep those checks' findings for many tokens, with a cheap test of whether they still hold
  (`_Watch`; `_DecodePlan` for the layers' fused step, `_RowTensors` for the adaptive softmax's one row).

Every shortcut computes what the module call would (the tests compare them, values and gradients). Like the other
files beside modeling_txl.py, it imports only torch, transformers and its siblings, relatively.
"""

from __future__ import annotations

import itertools
import operator
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .checks_txl import autocast_on, tracing
from .cpp_kernels_txl import compiled_operators
from .kernels_txl import one_row_linear

if TYPE_CHECKING:
    from .memory_txl import LayerMemory, TxlMemoryLayer
    from .modeling_txl import TxlAdaptiveLogSoftmax, TxlDropout, TxlLayer, TxlModel, TxlRelativeAttention

# ---------------------------------------------------------------------------------------------------------------------
# Bare modules, one-row inference, weight identities


def _forward_ad_active() -> bool:
    """Whether a forward-mode AD level is open (`torch.autograd.forward_ad.dual_level`): dual tensors may flow even
    without gradients, and the compiled operators have no forward derivative (their callers then take torch's)."""
    return getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0


def _one_row_inference(inputs: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `inputs` is one row (decoding a token at batch 1) in float CPU inference, outside autocast, tracing
    (torch.compile, torch.export, torch.jit), functorch transforms (vmap, grad) and forward-mode AD: where
    `kernels_txl.one_row_linear` and the other one-row compiled operators (no rules for those) apply."""
    return (
        inputs.numel() == inputs.shape[-1]
        and inputs.is_cpu
        and inputs.dtype == weight.dtype
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and not tracing()
        and not torch._C._are_functorch_transforms_active()
        and not _forward_ad_active()
    )


def _compiled_float32(tensors) -> bool:
    """Whether every tensor (None allowed) is what the compiled CPU operators take: float32, on the CPU, contiguous."""
    float32 = torch.float32
    for tensor in tensors:  # (a loop, not all() over a generator: every tensor of a decoded token comes here)
        if tensor is not None and not (tensor.dtype is float32 and tensor.is_cpu and tensor.is_contiguous()):
            return False
    return True


def _linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`; one row in CPU inference goes through `one_row_linear` (the same product, read faster)."""
    if _one_row_inference(inputs, weight):
        return one_row_linear(inputs, weight, bias)
    return F.linear(inputs, weight, bias)


# The forward of each module type that `_is_bare` may skip, as torch or modeling_txl.py defines it (a patched class
# keeps its call); the model's sub-layers are added by `register_fused_kinds`.
_PLAIN_FORWARDS = {
    nn.Linear: nn.Linear.forward,
    nn.LayerNorm: nn.LayerNorm.forward,
    nn.Embedding: nn.Embedding.forward,
}


def _is_bare(module: nn.Module, kind: type[nn.Module]) -> bool:
    """Whether `module` is a `kind` itself (`nn.Linear`, `nn.LayerNorm`, the model's sub-layers): not wrapped by an
    adapter, hooked (its own hooks or global module hooks) or replaced, so that its parameters say what it computes
    and nothing watches its call."""
    return _is_unhooked(module, kind) and not _global_module_hooks()


def _is_unhooked(module: nn.Module, kind: type[nn.Module]) -> bool:
    """`_is_bare` without the global hooks (asked once for many modules)."""
    if type(module) is not kind or kind.forward is not _PLAIN_FORWARDS[kind]:
        return False
    # (from the instance's dict: attribute lookups would cost as much again, for a check made per module and token)
    state = module.__dict__
    return not (
        state["_forward_hooks"]
        or state["_forward_pre_hooks"]
        or state["_backward_hooks"]
        or state["_backward_pre_hooks"]
        or "forward" in state  # accelerate's offloading hooks replace forward on the instance
    )


def _global_module_hooks() -> bool:
    """Whether a hook registered for every module is in place (torch.nn.modules.module.register_module_*_hook)."""
    return bool(
        nn.modules.module._global_forward_hooks
        or nn.modules.module._global_forward_pre_hooks
        or nn.modules.module._global_backward_hooks
        or nn.modules.module._global_backward_pre_hooks
    )


def _is_bare_linear(module: nn.Module) -> bool:
    return _is_bare(module, nn.Linear)


def _is_plain_linear(module: nn.Module) -> bool:
    """Whether `module` is a bare `nn.Linear` without bias: its weight alone then says what it computes, so the weight
    may be sliced, and results keyed on it."""
    return _is_bare_linear(module) and module.bias is None


def _project(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """`module(inputs)` for a linear layer. A bare `nn.Linear` is computed by `_linear` without the module call, whose
    machinery costs time that counts when decoding a token; adapters, hooks and everything else keep
    the module call."""
    if _is_bare_linear(module):
        return _linear(inputs, module.weight, module.bias)
    return module(inputs)


def _layer_norm(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """`module(inputs)` for a layer norm; a bare `nn.LayerNorm` without the module call (as `_project`)."""
    if _is_bare(module, nn.LayerNorm):
        return F.layer_norm(inputs, module.normalized_shape, module.weight, module.bias, module.eps)
    return module(inputs)


def _weight_and_bias(module: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`(module.weight, module.bias)` of a bare linear or norm layer, from its parameters' registry."""
    parameters = module._parameters
    return parameters["weight"], parameters["bias"]


def _dropout_acts(module: TxlDropout) -> bool:
    """Whether `module` changes its inputs (training mode, p > 0: training, or MC dropout in an eval model)."""
    return module.training and module.p > 0


def _dropout(module: TxlDropout, inputs: torch.Tensor) -> torch.Tensor:
    """`module(inputs)`, skipped when it would return `inputs` unchanged (evaluation, p = 0): decoding a token
    would otherwise spend a module call per sub-layer on nothing."""
    return module(inputs) if _dropout_acts(module) else inputs


_identities = itertools.count(1)
# The mark each identified weight object carries, by the object's id: a mark counts only where it is this very
# object. (An entry outlives its weight until another object takes the id: a few bytes per id ever identified.)
_marks: dict[int, tuple[int]] = {}


def _identity(weight: torch.Tensor) -> int:
    """A number for the tensor object `weight`, given on first use: unlike its storage address, no other tensor of
    this process has it, also after `weight` is freed. It is kept on the weight as a mark of plain data (a one-number
    tuple: a parameter saved with it still loads with `torch.load(weights_only=True)`), which counts only while it is
    the very object registered for this weight's id. A copy (`copy.copy`; `deepcopy` of a plain tensor, not of a
    Parameter, which carries none) carries the same tuple but lives at another id, and a loaded weight an equal tuple,
    not the one registered, also where it took a freed weight's id: each gets a number of its own (the memory's kept
    keys and values would otherwise be taken as made by it). Nothing
    refers to the weight, not even weakly: a weak reference stops `torch.utils.swap_tensors`, which `model.to()`
    uses for tensor subclasses and under `torch.__future__.set_swap_module_params_on_conversion(True)`."""
    mark = weight.__dict__.get("_txl_identity")
    if mark is None or _marks.get(id(weight)) is not mark:  # (`is`: an equal mark is a copy's)
        mark = weight._txl_identity = (next(_identities),)
        _marks[id(weight)] = mark
    return mark[0]


# A fixed random vector per row width, dtype and device (`_weight_fingerprint`).
_PROBES: dict[tuple, torch.Tensor] = {}


def _weight_fingerprint(weight: torch.Tensor) -> torch.Tensor:
    """`weight` `[N, E]` times a fixed random vector, in float32 or wider (`[N]`, a new tensor): where it stays
    equal, the weight is taken as unchanged by edits that bump no version. Every row's product changes where any of
    its values does (a merged adapter, rows or columns scaled or zeroed through `.data`), short of an edit that keeps
    the row's product with the vector; a sample of the values missed what it did not read. It reads the weight once,
    as projecting a few rows with it would."""
    rows = weight.detach().reshape(weight.shape[0] if weight.dim() else 1, -1)
    if rows.dtype not in (torch.float32, torch.float64):
        rows = rows.float()
    width = int(rows.shape[1])  # (torch.jit.trace gives sizes as tensors)
    key = (width, rows.dtype, rows.device)
    probe = _PROBES.get(key)
    if probe is None:
        generator = torch.Generator().manual_seed(width)
        probe = _PROBES[key] = torch.randn(width, generator=generator, dtype=rows.dtype).to(rows.device)
    return torch.mul(rows, probe).sum(dim=1)  # (not torch.mv: autocast would run that in half precision)


def _inference_caches_apply(projection: nn.Module) -> bool:
    """Whether results of `projection` may be kept across calls, keyed on its weight's storage and version: not for
    an adapter (LoRA's weights are not that weight) and not while tracing (torch.compile, torch.export, where tensors
    have no storage to identify; torch.jit.trace, whose graph would hold a kept result as a constant)."""
    return _is_plain_linear(projection) and not tracing()


# ---------------------------------------------------------------------------------------------------------------------
# Decoding plans


def _one_row_decoding(hidden_states: torch.Tensor, mask: torch.Tensor | None) -> object | None:
    """The compiled operators where a step of the fused decoding kernels may run, as far as the call tells (each
    layer's part: `_layer_decode_step`): one float32 CPU row in inference (no gradients, autocast, tracing or
    functorch transforms), no global module hooks, a bool mask of one row or none; else None."""
    if (
        hidden_states.dtype != torch.float32
        or not _one_row_inference(hidden_states, hidden_states)  # (the weights' types: each layer's part)
        or _global_module_hooks()
        or (mask is not None and (mask.dtype != torch.bool or mask.numel() != mask.shape[-1]))
    ):
        return None
    return compiled_operators()


_DATA_PTR = torch.Tensor.data_ptr
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_VERSION = operator.attrgetter("_version")
_FORWARD = operator.attrgetter("forward")


class LayerTensors(NamedTuple):
    """A layer's tensors for the fused decoding kernels (`decode_layer`, `decode_layers`), in their order after the
    memory's. Only the three linear biases may be None."""

    qkv_weight: torch.Tensor
    content_bias: torch.Tensor  # u
    position_bias: torch.Tensor  # v
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    attn_norm_weight: torch.Tensor
    attn_norm_bias: torch.Tensor
    up_weight: torch.Tensor
    up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None
    ffn_norm_weight: torch.Tensor
    ffn_norm_bias: torch.Tensor

    def complete(self) -> bool:
        """Whether every tensor but the three biases is there."""
        return None not in (*self[:4], *self[5:8], self.down_weight, *self[11:])


def _no_plan() -> None:
    return None


class _Watch:
    """What some checks of modules found, kept so that a later call can ask cheaply whether they would find the same
    (`holds`: a few comparisons of lists, made in C, instead of the checks' attribute lookups and calls, which a
    decoded token pays for at every step). It compares with what it saw:

    - torch's hook count (`RemovableHandle.next_id`: every module or global hook registered takes a number from it);
    - by identity, the entries of the modules' dictionaries the checks read (`watch`): sub-modules and parameters
      (an adapter, a replaced layer or weight), the registries themselves, training flags, an instance `forward`
      (accelerate's hooks), attributes; the modules' types and their classes' forwards;
    - the storage (`data_ptr`: `model.to()`, `.data =`), contiguity and version (in-place edits) of the tensors it
      is given (`watch_storage`): those the compiled operators are handed, and (version) those whose contents
      results were kept from.

    A watch holds the modules it saw: its owner keeps it in its own dictionary (`_PLAN`; not copied or pickled) and
    drops it when it may hold modules replaced since."""

    def __init__(self) -> None:
        self._dicts: list[dict] = []
        self._keys: list[str] = []
        self._seen: list[object] = []
        self._modules: list[nn.Module] = []
        self._types: list[type] = []
        self._stored: list[torch.Tensor] = []
        self._pointers: list[int] = []
        self._versioned: list[torch.Tensor] = []
        self._version_numbers: list[int] = []
        self._hook_count = torch.utils.hooks.RemovableHandle.next_id

    def watch(
        self,
        module: nn.Module,
        *,
        children: tuple[str, ...] = (),
        parameters: tuple[str, ...] = (),
        attributes: tuple[str, ...] = (),
        typed: bool = True,
    ) -> None:
        """Remember the entries of `module`'s dictionaries the checks depend on, as they are now, and (`typed`) its
        type."""
        state = module.__dict__
        if typed:
            self._modules.append(module)
            self._types.append(type(module))
        entries = [(state, name) for name in attributes]
        for registry, names in (("_modules", children), ("_parameters", parameters)):
            if names:
                entries.append((state, registry))
                entries += ((state[registry], name) for name in names)
        for dictionary, key in entries:
            self._dicts.append(dictionary)
            self._keys.append(key)
            self._seen.append(dictionary.get(key))

    def watch_storage(self, tensors: list[torch.Tensor], versions: bool = True) -> None:
        """Remember the storage of each of `tensors`, contiguous now (a new one, `.data =` or `model.to()`, may be
        of another dtype or device; another layout, the same storage's too, is seen as such: the compiled operators
        take neither), and (`versions`: not for tensors made under torch.inference_mode(), which keep none) its
        version."""
        self._stored += tensors
        self._pointers += map(_DATA_PTR, tensors)
        if versions:
            self._versioned += tensors
            self._version_numbers += map(_VERSION, tensors)

    def __reduce__(self):
        return _no_plan, ()  # (a copy or a pickle of the model plans anew: its weights are other tensors)

    def __deepcopy__(self, memo: dict) -> None:
        return None

    def holds(self) -> bool:
        """Whether the checks would still find what they found (see the class docstring)."""
        return (
            torch.utils.hooks.RemovableHandle.next_id == self._hook_count
            and tuple(map(_FORWARD, _FUSED_KINDS)) == _FUSED_FORWARDS
            and all(map(operator.is_, map(dict.get, self._dicts, self._keys), self._seen))
            and list(map(type, self._modules)) == self._types
            and list(map(_DATA_PTR, self._stored)) == self._pointers
            and all(map(_IS_CONTIGUOUS, self._stored))
            and list(map(_VERSION, self._versioned)) == self._version_numbers
        )


class _DecodePlan(_Watch):
    """Decoding's step over all layers (`decode_token`), planned once for many tokens: each layer's tensors
    and scalars for `decode_layers` and its kept position table, as the full checks found them
    (`_layer_decode_parts`, `TxlRelativeAttention._relative_keys`), and what those checks read (`_Watch`): the
    layers' and sub-layers' registries, modes, forwards and the attributes the step reads (scaling, eps, the config,
    the kept position table, the training-phase count); the storage and version of the weights whose results are
    kept (the memory's keys and values, the projected position table: the other weights the kernel reads as they are
    at each token); the number of layers and the model's position table R (a longer stream or another dtype makes a
    new one). At batch 1 the checks cost a small model about a third of its step at every token.

    The memory is checked at every token (`TxlMemoryLayer.token_rooms`): it may be any stream's. The model keeps its
    plan (`_PLAN`) until a forward that does not decode a token, so a module replaced after decoding is freed then."""

    def __init__(self) -> None:
        super().__init__()
        # Per layer: its qkv weight, its other tensors, its kept projected position table `[H, L, D]` (or None), its
        # attention module (where the table is not kept).
        self.layers: list[tuple] = []
        self.scalars: list[float] = []  # scaling and the two norms' eps, per layer
        self.versions: list[tuple] = []  # the projection version each layer's memory must have
        self.pre_lnorm = False
        self.keepable = True  # (else made for this token only)
        self.untie_r = False
        self.table: torch.Tensor | None = None  # the model's position table R the plan was made for
        self.layer_registry: dict = {}  # the layer list's registry, and its length then
        self.layer_count = 0

    @classmethod
    def make(
        cls, model: TxlModel, positions: torch.Tensor, untie_r: bool, sdpa_config: object | None
    ) -> _DecodePlan | None:
        """The plan for `model`'s layers now, or None where a layer cannot take the fused step. Gets each layer's
        relative keys (`_relative_keys`, which keeps the projected table) as this token would."""
        plan = cls()
        parameters = model._parameters
        shared_biases = (None, None) if untie_r else (parameters["content_bias"], parameters["position_bias"])
        layers = model._modules["layers"]
        parts = []
        for layer in layers:
            if (
                not _is_unhooked(layer, _FUSED_KINDS[0])
                or (part := _layer_decode_parts(layer, *shared_biases, sdpa_config)) is None
            ):
                return None
            parts.append(part)
        if not parts or len({pre_lnorm for _, _, pre_lnorm, _ in parts}) != 1:
            return None
        table = positions if positions._base is None else positions._base  # [L, E], as _relative_keys takes it
        plan.pre_lnorm, plan.untie_r, plan.table = parts[0][2], untie_r, table
        # A table made for this call only (dropout on the positions: MC dropout) is never seen again.
        plan.keepable = positions._base is not None
        plan.watch(
            model, children=("layers",), parameters=() if untie_r else ("content_bias", "position_bias"), typed=False
        )
        plan.watch(layers, children=tuple(layers._modules))
        plan.layer_count, plan.layer_registry = len(layers._modules), layers._modules
        for layer, (tensors, scalars, _, version) in zip(layers, parts):
            attention, ffn = layer._modules["attention"], layer._modules["ffn"]
            attention._relative_keys(positions)
            kept = attention._projected_positions
            kept_table = kept.projected if kept is not None and kept.table is table else None
            plan.layers.append((tensors.qkv_weight, tensors[1:], kept_table, attention))
            plan.scalars += scalars
            plan.versions.append(version)
            plan.keepable = plan.keepable and attention.config is model.config
            called = ("training", "forward")  # (a module the step stands in for: its mode and its forward)
            plan.watch(layer, attributes=called, children=("attention", "ffn"))
            plan.watch(
                attention,
                attributes=(*called, "config", "scaling", "pre_lnorm", "_projected_positions", "_training_phases"),
                children=("qkv_proj", "pos_proj", "o_proj", "layer_norm", "dropout"),
                parameters=("content_bias", "position_bias") if untie_r else (),
            )
            plan.watch(
                ffn, attributes=(*called, "pre_lnorm"), children=("up_proj", "down_proj", "layer_norm", "dropout")
            )
            linears = [attention._modules[name] for name in ("qkv_proj", "pos_proj", "o_proj")]
            linears += (ffn._modules[name] for name in ("up_proj", "down_proj"))
            for linear in linears:
                plan.watch(linear, attributes=("forward",), parameters=("weight", "bias"))
            for norm in (attention._modules["layer_norm"], ffn._modules["layer_norm"]):
                plan.watch(norm, attributes=("forward", "eps"), parameters=("weight", "bias"))
            for dropout in (attention._modules["dropout"], ffn._modules["dropout"]):
                plan.watch(dropout, attributes=("training", "p"))  # (`_dropout_acts`: MC dropout's p set later)
            # Results made from these weights are kept (the memory's keys and values, the projected position
            # table): their storage and version. The others the kernel reads as they are at each token (a weight's
            # `.data` replaced: its new values), as long as their storage and layout are what the checks saw.
            kept_from = [tensors.qkv_weight]
            if attention.pre_lnorm:  # (the keys and values are of the normed input)
                kept_from += (tensors.attn_norm_weight, tensors.attn_norm_bias)
            if kept_table is not None:
                kept_from.append(attention._modules["pos_proj"]._parameters["weight"])
            plan.watch_storage(kept_from)
            plan.watch_storage([tensor for tensor in tensors[1:] if tensor is not None], versions=False)
        return plan

    def holds(self, positions: torch.Tensor, untie_r: bool) -> bool:
        """Whether the full checks would still find what they found."""
        table = positions if positions._base is None else positions._base
        return (
            table is self.table
            and untie_r == self.untie_r
            and len(self.layer_registry) == self.layer_count
            and super().holds()
        )

    def rooms(self, memory_layers: list) -> tuple[list[torch.Tensor], list[int]] | None:
        """The memory's room for the token in every layer (`TxlMemoryLayer.token_rooms`: buffers, and where each
        window starts), or None where the memory cannot take the step (keys and values of other weights or another
        dtype, a memory of an older copy of memory_txl.py): nothing changed then."""
        kind = type(memory_layers[0])
        token_rooms = getattr(kind, "token_rooms", None)
        if token_rooms is None or len(memory_layers) != len(self.layers) or len(set(map(type, memory_layers))) != 1:
            return None
        return token_rooms(memory_layers, self.versions)

    def kernel_tensors(self, buffers: list[torch.Tensor], positions: torch.Tensor) -> list[torch.Tensor | None]:
        """`decode_layers`' tensors for this token, with offsets (`rooms`): per layer the buffers of its input, keys
        and values, its weights, and its whole projected position table `[H, L, D]` (the kernel reads its last K
        rows)."""
        tensors = []
        for (qkv_weight, rest, table, attention), layer_input, key, value in zip(
            self.layers, buffers[0::3], buffers[1::3], buffers[2::3]
        ):
            if table is None:  # (not kept: an adapter or hook on pos_proj; it runs for every token, as it should)
                table = attention._relative_keys(positions)  # [H, K, D]
            tensors += (layer_input, qkv_weight, key, value, table, *rest)
        return tensors


# The module types the fused step stands in for, and their plain forwards (`register_fused_kinds`).
_FUSED_KINDS: tuple[type[nn.Module], ...] = ()
_FUSED_FORWARDS: tuple = ()


def register_fused_kinds(layer: type[nn.Module], attention: type[nn.Module], feed_forward: type[nn.Module]) -> None:
    """The model's layer, attention and feed-forward classes (modeling_txl.py, once they are defined): their forwards
    are the ones `_is_bare` may skip, and the fused decoding step stands in for them (and for nn.Linear's and
    nn.LayerNorm's) while none is patched."""
    global _FUSED_KINDS, _FUSED_FORWARDS
    _PLAIN_FORWARDS.update({kind: kind.forward for kind in (layer, attention, feed_forward)})
    _FUSED_KINDS = (layer, attention, feed_forward, nn.Linear, nn.LayerNorm)
    _FUSED_FORWARDS = tuple(_PLAIN_FORWARDS[kind] for kind in _FUSED_KINDS)


# Where a model keeps its decoding plan, and an adaptive softmax its tensors for one row: in the module's own
# dictionary (read without nn.Module's attribute lookup), so that a module and its plan, which may reach each other
# (through a hook's closure, accelerate's forward), are one cycle the garbage collector frees. A plan is neither
# copied nor pickled (`_Watch.__reduce__`).
_PLAN = "_txl_decode_plan"


class _RowTensors(_Watch):
    """An adaptive softmax's tensors for `adaptive_log_softmax_row` (`_row_tensors`), with a
    watch of where they come from: the softmax's registries and the head's tail weight and bias, the output layers
    (each one's weight and bias, and an attribute `weight` beside them: pruning's, computed by its hook at each
    call) and projections, the storage and layout of the tensors; the cluster bounds as they were. (Not kept where
    the tensors are views, slices of one table with div_val 1.)"""

    def __init__(self, softmax: TxlAdaptiveLogSoftmax, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.tensors, self.bounds = tensors, list(softmax.bounds)
        self.watch(
            softmax,
            children=("output_layers", "output_projections"),
            parameters=("cluster_weight", "cluster_bias"),
            attributes=("div_val", "n_clusters"),
            typed=False,
        )
        layers, projections = softmax._modules["output_layers"], softmax._modules["output_projections"]
        self.watch(layers, children=tuple(layers._modules))
        self.watch(projections, parameters=tuple(projections._parameters))
        for layer in layers:
            self.watch(layer, parameters=("weight", "bias"), attributes=("weight", "forward"))
        self.watch_storage([tensor for tensor in tensors if tensor is not None], versions=False)


# ---------------------------------------------------------------------------------------------------------------------
# Results kept across inference calls: the projected position table, the memory's keys and values


class KeptPositionTable(NamedTuple):
    """A layer's W_{k,R} R for the model's whole position table, kept across calls in inference."""

    key: tuple  # the weight's identity, storage and version, and the autocast dtype it was made under
    table: torch.Tensor  # the model's position table `[L, E]` it was projected from
    projected: torch.Tensor  # `[H, L, D]`
    weight_fingerprint: torch.Tensor  # `_weight_fingerprint` of the weight then (edits that bump no version change it)
    weight_dtype: torch.dtype  # the weight's then (the fingerprint's may be wider)


def projection_version(attention: TxlRelativeAttention) -> tuple | None:
    """Identifies the weights that turn `attention`'s memory into keys and values; changes whenever they are
    modified. None where that cannot be told (an adapter or hook on the projection, tracing): nothing is then kept."""
    qkv_proj = attention.qkv_proj
    if not _inference_caches_apply(qkv_proj):
        return None
    if attention.pre_lnorm:  # (the keys and values are of the normed input)
        return _projection_key(attention, qkv_proj.weight, attention.layer_norm.weight, attention.layer_norm.bias)
    return _projection_key(attention, qkv_proj.weight)


def _projection_key(attention: TxlRelativeAttention, *weights: torch.Tensor | None) -> tuple | None:
    """`projection_version` from the weights it names (the projection's, and pre-LN's norm's), for decoding's fused
    step, which has them at hand and has checked the conditions on its own."""
    # (The weight object too: a new model's weight may take a freed one's storage and version.)
    try:
        return (
            *((_identity(weight), weight.data_ptr(), weight._version) for weight in weights if weight is not None),
            attention._training_phases,
        )
    except RuntimeError:  # weights made under torch.inference_mode() keep no version: an edit could not be told
        return None


def forget_inference_results(attention: TxlRelativeAttention) -> None:
    """Drop what inference kept from `attention`'s weights: they may change now without a new version (torch's fused
    optimizers update parameters in place without bumping it), so the memory's keys and values made before are not
    taken as the current weights' either (`_training_phases` is part of their version)."""
    attention._projected_positions = None
    attention._training_phases += 1


def check_kept_position_table(attention: nn.Module) -> None:
    """Drop `attention`'s kept projected position table if its weight's values changed without a new version (an
    edit through `.data`, PEFT's merge_and_unload): the model asks where a new stream starts, not at every token."""
    kept = getattr(attention, "_projected_positions", None)
    if kept is None:
        return
    if not _is_plain_linear(attention.pos_proj):  # (replaced since: an adapter, a quantized layer; nothing is kept)
        attention._projected_positions = None
        return
    weight = attention.pos_proj.weight
    # (A model moved to another device or dtype since: its table is projected again anyway, and a fingerprint there
    # cannot be compared with the kept one.)
    fingerprint = kept.weight_fingerprint
    if (
        fingerprint.device != weight.device
        or kept.weight_dtype != weight.dtype
        or not torch.equal(_weight_fingerprint(weight), fingerprint)
    ):
        attention._projected_positions = None


def kept_relative_keys(attention: TxlRelativeAttention, positions: torch.Tensor) -> torch.Tensor | None:
    """`attention._relative_keys(positions)` `[H, K, D]` in inference, from the whole position table projected once
    and kept (`KeptPositionTable`), instead of all K distances again for every decoded token: `positions` is the
    last K rows of the model's table, and its projection depends only on the weights. None where nothing may be kept
    (training, an adapter or hook on the projection, tracing, weights without versions); in training, what was kept
    is dropped."""
    training = attention.training or torch.is_grad_enabled()
    if training and not torch.compiler.is_compiling():  # (a traced graph would guard on the count: train() does)
        forget_inference_results(attention)
    pos_proj = attention._modules["pos_proj"]
    if training or not _inference_caches_apply(pos_proj):
        return None
    table = positions if positions._base is None else positions._base  # [L, E], L >= K
    weight = pos_proj.weight
    device_type = table.device.type
    autocast = autocast_on(device_type) and torch.get_autocast_dtype(device_type)
    try:
        key = (_identity(weight), weight.data_ptr(), weight._version, autocast)
    except RuntimeError:  # (made under torch.inference_mode(): no version to tell an edit by, nothing kept)
        return None
    kept = attention._projected_positions
    if kept is None or kept.key != key or kept.table is not table:
        projected = pos_proj(table).view(table.shape[0], attention.n_head, attention.d_head).transpose(0, 1)
        # [H, L, D], heads apart
        kept = attention._projected_positions = KeptPositionTable(
            key, table, projected.contiguous(), _weight_fingerprint(weight), weight.dtype
        )
    projected = kept.projected
    return projected[:, projected.shape[1] - positions.shape[0] :]  # rows of distances K-1, ..., 0


# ---------------------------------------------------------------------------------------------------------------------
# The fused decoding steps: a token at batch 1 through every layer, one layer, the adaptive softmax, in one call each


def decode_token(
    model: TxlModel,
    hidden_states: torch.Tensor,
    memory_layers: list[TxlMemoryLayer],
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    untie_r: bool,
) -> torch.Tensor | None:
    """`model`'s layers for one token at batch 1 in one call of the compiled `decode_layers`, where each layer would
    take its fused step (`decode_one_row`) and none is hooked: the same values without a call, its Python and its
    parallel region per layer (a large share of a small model's decoding step). The kernel writes each layer's
    input, key and value into the memory, as the layer loop's updates would. The checks of every layer are made once
    and kept as a plan for the next tokens (`_DecodePlan`).
    `hidden_states` `[1, 1, E]` -> `[1, 1, E]`; None where that does not apply (nothing changed then)."""
    if (operators := _one_row_decoding(hidden_states, mask)) is None:
        return None
    config = model.config
    sdpa_config = config if getattr(config, "_attn_implementation", None) == "sdpa" else None
    state = model.__dict__
    plan = state.get(_PLAN)
    if plan is None or sdpa_config is None or not plan.holds(positions, untie_r):
        plan = _DecodePlan.make(model, positions, untie_r, sdpa_config)
        state[_PLAN] = plan if plan is not None and plan.keepable else None
        if plan is None:
            return None
    if (rooms := plan.rooms(memory_layers)) is None:
        return None
    buffers, firsts = rooms
    output = operators.decode_layers(
        hidden_states.reshape(-1),
        plan.kernel_tensors(buffers, positions),
        None if mask is None else mask.reshape(1, -1),
        plan.scalars,
        plan.pre_lnorm,
        [positions.shape[0], *firsts],
    )  # (an exception on the way: TxlModel.forward puts the memory back as it was)
    return output.view(hidden_states.shape)


def decode_one_row(
    layer: TxlLayer,
    hidden_states: torch.Tensor,
    memory: LayerMemory,
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    content_bias: torch.Tensor | None,
    position_bias: torch.Tensor | None,
) -> torch.Tensor | None:
    """`layer`'s forward for one token at batch 1 whose memory keeps its keys and values, in float32 CPU inference
    with the compiled kernels, bare modules and no dropout: the whole layer in one call of the compiled
    `decode_layer` (the products, the one-query attention, the norms and residuals), instead of the dozen operator
    calls and the choices its forward makes for every other case (decoding pays for each, per layer and token).
    None where that does not apply: the layer then goes its general way, which computes the same values (tests
    compare them). `decode_token` calls all the layers in one call where each would take this step."""
    store = memory.projection_store
    if (
        store is None
        or (operators := _one_row_decoding(hidden_states, mask)) is None
        or (step := _layer_decode_step(layer, store, content_bias, position_bias)) is None
    ):
        return None
    t, (scaling, attn_eps, ffn_eps), pre_lnorm = step  # (t: LayerTensors)
    rel_key = layer._modules["attention"]._relative_keys(positions)  # [H, K, D]
    key, value = store.append_projection_room()  # [1, H, K, D]; decode_layer writes the new position's entry
    output = operators.decode_layer(
        hidden_states.reshape(-1),
        *(t.qkv_weight, key, value, rel_key, t.content_bias, t.position_bias),
        None if mask is None else mask.reshape(1, -1),
        scaling,
        *(t.o_weight, t.o_bias, t.attn_norm_weight, t.attn_norm_bias, attn_eps),
        *(t.up_weight, t.up_bias, t.down_weight, t.down_bias, t.ffn_norm_weight, t.ffn_norm_bias, ffn_eps),
        pre_lnorm,
    )  # (an exception on the way: TxlModel.forward puts the memory back as it was, this entry included)
    return output.view(hidden_states.shape)


def _layer_decode_step(
    layer: TxlLayer, store: TxlMemoryLayer, content_bias: torch.Tensor | None, position_bias: torch.Tensor | None
) -> tuple[LayerTensors, tuple[float, float, float], bool] | None:
    """`layer`'s part of the fused decoding step's conditions (`_one_row_decoding` has the step's):
    `_layer_decode_parts`' (the layer's own), and memory keys and values made by the current weights, in float32.
    Returns `_layer_decode_parts`' tensors, scalars and pre_lnorm, or None where the step does not apply."""
    parts = _layer_decode_parts(layer, content_bias, position_bias)
    if (
        parts is None
        or not hasattr(store, "kept_as")  # (a memory of an older copy of memory_txl.py: no room methods either)
        or not (store.has_projections(parts[3]) and store.kept_as(torch.float32))
    ):
        return None
    return parts[:3]


def _layer_decode_parts(
    layer: TxlLayer,
    content_bias: torch.Tensor | None,
    position_bias: torch.Tensor | None,
    sdpa_config: object | None = None,
) -> tuple[LayerTensors, tuple[float, float, float], bool, tuple] | None:
    """What `layer` itself must be for the fused decoding step: eval mode, bare sub-layers and linear and norm layers
    (no hooks, adapters, replaced forwards), the sdpa implementation, no active dropout, float32 weights whose
    version can be told. Returns the layer's tensors (`LayerTensors`: `decode_layers`' order after the memory's), its
    scaling and the two norms' eps, pre_lnorm, and the projection version the memory's keys and values must have
    (`projection_version`); None where the step does not apply.
    `content_bias`, `position_bias`: the model's shared u and v, or None for the attention's own (untie_r).
    `sdpa_config`: a config the caller has seen ask for sdpa (read once for all layers: config attributes are slow to
    read), or None. (`_DecodePlan` watches everything read here.)"""
    # The sub-modules and parameters from their registries: what attribute access returns for them, without
    # nn.Module.__getattr__'s fallback (paid for each of them, per layer and token); each read only once its module
    # is known to be the model's own kind (an adapter has other children and parameters).
    attention_kind, ffn_kind = _FUSED_KINDS[1:3]
    attention, ffn = layer._modules["attention"], layer._modules["ffn"]
    if layer.training or not (_is_unhooked(attention, attention_kind) and _is_unhooked(ffn, ffn_kind)):
        return None
    qkv_proj, o_proj, attn_norm = (attention._modules[name] for name in ("qkv_proj", "o_proj", "layer_norm"))
    up_proj, down_proj, ffn_norm = (ffn._modules[name] for name in ("up_proj", "down_proj", "layer_norm"))
    if (
        attention.training  # (a sub-layer switched to training on its own: the general path follows its flag)
        or ffn.training
        or not all(_is_unhooked(linear, nn.Linear) for linear in (qkv_proj, o_proj, up_proj, down_proj))
        or not (_is_unhooked(attn_norm, nn.LayerNorm) and _is_unhooked(ffn_norm, nn.LayerNorm))
        or qkv_proj._parameters["bias"] is not None
        or not (
            attention.config is sdpa_config  # (eager: the readable reference)
            or getattr(attention.config, "_attn_implementation", None) == "sdpa"
        )
        or attention.d_head % 8 != 0
        or ffn.pre_lnorm != attention.pre_lnorm  # (the kernel takes one flag for both sub-layers)
        or _dropout_acts(attention._modules["dropout"])
        or _dropout_acts(ffn._modules["dropout"])
    ):
        return None
    if content_bias is None:
        content_bias, position_bias = attention._parameters["content_bias"], attention._parameters["position_bias"]
    tensors = LayerTensors(
        qkv_proj._parameters["weight"],
        content_bias,
        position_bias,
        *_weight_and_bias(o_proj),
        *_weight_and_bias(attn_norm),
        *_weight_and_bias(up_proj),
        *_weight_and_bias(down_proj),
        *_weight_and_bias(ffn_norm),
    )
    if not tensors.complete() or not _compiled_float32(tensors):
        return None
    # projection_version's value: the projection is bare without a bias, nothing traced (`_one_row_decoding`)
    normed = (tensors.attn_norm_weight, tensors.attn_norm_bias) if attention.pre_lnorm else ()
    version = _projection_key(attention, tensors.qkv_weight, *normed)
    if version is None:  # (weights made under torch.inference_mode(): no keys and values are ever kept)
        return None
    return tensors, (attention.scaling, attn_norm.eps, ffn_norm.eps), attention.pre_lnorm, version


def one_row_log_probs(softmax: TxlAdaptiveLogSoftmax, hidden_states: torch.Tensor) -> torch.Tensor | None:
    """`softmax`'s forward for one row (a token decoded at batch 1) in float32 CPU inference, in one call of the
    compiled `adaptive_log_softmax_row` instead of a dozen operator calls: the same log-probabilities within float32
    rounding (where all of a cluster's logits are -inf, tokens banned by their biases, -inf where the readable path
    gives NaN). None where that does not apply. The clusters' tensors are gathered once for many tokens
    (`_row_tensors`)."""
    if (
        hidden_states.dim() != 2
        or hidden_states.dtype != torch.float32
        or not _one_row_inference(hidden_states, hidden_states)  # (the weights' type: `_row_tensors`)
        or (operators := compiled_operators()) is None
        or (tensors := _row_tensors(softmax)) is None
    ):
        return None
    return operators.adaptive_log_softmax_row(hidden_states.reshape(-1).contiguous(), tensors).view(1, -1)


def _row_tensors(softmax: TxlAdaptiveLogSoftmax) -> list[torch.Tensor] | None:
    """`adaptive_log_softmax_row`'s tensors (each cluster's weight, bias and projection, then the head's tail weight
    and bias), or None where they are not all float32 CPU tensors (a projection may be missing). Kept for the next
    tokens with a watch of the modules and parameters they come from (`_RowTensors`)."""
    state = softmax.__dict__
    kept = state.get(_PLAN)
    if kept is not None and kept.bounds == softmax.bounds and kept.holds():
        return kept.tensors
    state[_PLAN] = None
    n_clusters = softmax.n_clusters
    tensors = [tensor for cluster in range(n_clusters) for tensor in softmax._own_parameters(cluster)]
    if n_clusters > 1:
        tensors += (softmax.cluster_weight, softmax.cluster_bias)
    required = [tensor for i, tensor in enumerate(tensors) if i >= 3 * n_clusters or i % 3 != 2]
    if any(tensor is None for tensor in required) or not _compiled_float32(tensors):
        return None
    # Not kept where they are slices of one table (div_val 1): made per call, so that nothing but the model holds a
    # tensor of the model's.
    if all(tensor is None or tensor._base is None for tensor in tensors):
        state[_PLAN] = _RowTensors(softmax, tensors)
    return tensors
