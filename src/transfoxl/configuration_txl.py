"""Configuration of Transformer-XL (Dai et al., 2019, https://arxiv.org/abs/1901.02860) for transformers v5.

`TxlConfig` keeps the hyper-parameter names of the paper and of the original code (`d_model`, `n_layer`, `mem_len`,
...) and answers to the standard transformers names too (`hidden_size`, `num_hidden_layers`, ...) through
`attribute_map`. The defaults are those of transformers v4's `TransfoXLConfig` (the WikiText-103 large model), because
v4 wrote `config.json` files without the values equal to its defaults: reading those files right needs the same
defaults. The one exception is `d_embed`, which follows `d_model` when not given (v4: 1024 whatever `d_model` was);
the legacy class `TransfoXLConfig` keeps v4's 1024.

`TransfoXLConfig` (model_type `"transfo-xl"`) reads the `config.json` of any transformers-v4 Transfo-XL checkpoint
unchanged, old key names and ignored keys included.
"""

from __future__ import annotations

import inspect
from dataclasses import field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import transformers

if int(transformers.__version__.split(".")[0]) < 5:  # (a model folder's copy of this file, loaded by transformers 4)
    raise ImportError(
        f"This Transformer-XL code needs transformers 5 (installed: {transformers.__version__}); "
        "pip install -U 'transformers>=5.23'."
    )

from transformers import PreTrainedConfig
from transformers.utils import logging

from .checks_txl import is_flag, is_integer, is_positive_number, require_integer

if TYPE_CHECKING:
    # Never imported at run time. transformers names a local folder's remote-code module after the folder's name and
    # a hash of the file and its relative imports: through this line the config's hash covers the model's files too,
    # so two folders of one name whose model code differs (a checkpoint-N, say) each get their own classes.
    from .modeling_txl import TxlPreTrainedModel  # noqa: F401

logger = logging.get_logger(__name__)

MEMORY_INIT_CHOICES = ("empty", "zeros")
INIT_CHOICES = ("normal", "uniform")
DEFAULT_CUTOFFS = (20000, 40000, 200000)  # WikiText-103's clusters (Dai et al., 2019; v4's default)
BOOLEAN_FIELDS = ("pre_lnorm", "same_length", "untie_r", "use_cache", "tie_word_embeddings")


class TxlConfig(PreTrainedConfig):
    r"""
    Configuration of a Transformer-XL model ([`TxlModel`], [`TxlForCausalLM`], [`TxlForSequenceClassification`],
    [`TxlForTokenClassification`], [`TxlForQuestionAnswering`]).

    Args:
        vocab_size (`int`, *optional*, defaults to 267735):
            Number of tokens in the vocabulary. Old name: `n_token`.
        cutoffs (`list[int]`, *optional*, defaults to `[20000, 40000, 200000]`):
            Boundaries of the frequency clusters of the adaptive input embedding and adaptive softmax: token ids below
            `cutoffs[0]` form the head, `[cutoffs[i], cutoffs[i+1])` the tail clusters. `[]` means one full softmax.
        d_model (`int`, *optional*, defaults to 1024):
            Width of the hidden states (alias `hidden_size`).
        d_embed (`int`, *optional*):
            Width of the head cluster's embeddings, projected to `d_model`. Defaults to `d_model`.
        n_head (`int`, *optional*, defaults to 16):
            Number of attention heads (alias `num_attention_heads`).
        d_head (`int`, *optional*, defaults to 64):
            Width of one head (alias `head_dim`). `n_head * d_head` need not equal `d_model`.
        d_inner (`int`, *optional*, defaults to 4096):
            Width of the feed-forward layer (alias `intermediate_size`).
        div_val (`int`, *optional*, defaults to 4):
            Cluster `i` of the adaptive embedding has width `d_embed // div_val**i`; 1 gives one embedding table.
        pre_lnorm (`bool`, *optional*, defaults to `False`):
            Layer norm before each sub-layer (pre-LN) instead of after the residual sum (post-LN, the paper's).
        n_layer (`int`, *optional*, defaults to 18):
            Number of layers (alias `num_hidden_layers`).
        mem_len (`int`, *optional*, defaults to 1600):
            Number of cached hidden states kept per layer as memory. 0 disables the memory.
        clamp_len (`int`, *optional*, defaults to 1000):
            Relative distances above `clamp_len` use the encoding of `clamp_len`; 0 or less disables clamping.
        same_length (`bool`, *optional*, defaults to `True`):
            Every query attends to the same number of positions (the original code's evaluation setting, not in
            the paper): itself and the `mem_len - 1` positions before it, also within one long segment (a query does
            not see further back than that). No effect with `mem_len` 0. The default is v4's (its WikiText-103
            model's); the original code trains with it off, as the training presets do: pass `same_length=False` to
            train a model of your own, or a segment longer than `mem_len` sees less than its whole past.
        tie_projs (`list[bool]`, *optional*):
            Per cluster, whether the adaptive softmax shares the input embedding's projection. Derived from
            `proj_share_all_but_first` when not given.
        proj_share_all_but_first (`bool`, *optional*, defaults to `True`):
            v4's way of setting `tie_projs`: `[False] + [True] * len(cutoffs)` (or all `False`). Only read when
            `tie_projs` is not given; not stored.
        untie_r (`bool`, *optional*, defaults to `True`):
            Whether each layer has its own biases u and v (`content_bias`, `position_bias`) or all layers share one
            pair.
        dropout (`float`, *optional*, defaults to 0.1):
            Dropout on embeddings, positional encodings, sub-layer outputs and the last hidden state.
        dropatt (`float`, *optional*, defaults to 0.0):
            Dropout on attention probabilities (alias `attention_dropout`).
        init (`str`, *optional*, defaults to `"normal"`):
            `"normal"` (std `init_std`) or `"uniform"` (in `[-init_range, init_range]`) for weight matrices.
        init_range (`float`, *optional*, defaults to 0.01):
            Range of the uniform initialisation.
        init_std (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation (alias `initializer_range`).
        proj_init_std (`float`, *optional*, defaults to 0.01):
            Standard deviation of the adaptive embedding and softmax projections.
        layer_norm_epsilon (`float`, *optional*, defaults to 1e-5):
            Epsilon of the layer norms (alias `layer_norm_eps`).
        memory_init (`str`, *optional*, defaults to `"empty"`):
            How a stream's memory starts. `"empty"`: no memory at all, as in the original code. `"zeros"`: `mem_len`
            zero vectors that the first segment attends to, as transformers v4 did; use it to reproduce v4 outputs.
        tgt_len (`int`, *optional*):
            Segment length the model was trained with (informative; scripts use it as their default).
        use_cache (`bool`, *optional*, defaults to `True`):
            Whether forward returns the updated memory as `past_key_values`.
        return_logits (`bool`, *optional*):
            True: `TxlForCausalLM.forward` returns `logits` in training steps too (a loss computed with gradients in
            train mode), unless its `return_logits` argument says otherwise: for code that reads `outputs.logits`
            there (a metric or a distillation loss in `compute_loss`). None or False (the default): a training step
            computes only the clusters of the adaptive softmax that hold a target, and every other call returns
            logits.
        eos_token_id (`int`, *optional*):
            End-of-sequence id (`<eos>` ends every line in Transformer-XL corpora); generation stops on it. v4's
            default was 0, which `TransfoXLConfig` keeps.
        pad_token_id (`int`, *optional*), bos_token_id (`int`, *optional*):
            Padding and beginning-of-sequence ids.
        tie_word_embeddings (`bool`, *optional*):
            Whether the adaptive softmax's output layers share the input embedding tables. Defaults to v4's
            `tie_weight` when a legacy config has it, else `True`.

    Legacy keys that are read and checked but have no effect: `attn_type` (only 0, the paper's relative attention,
    exists; any other value is refused), `sample_softmax` (values > 0 are refused), `adaptive`, `ext_len`, `tie_weight`
    (mapped to `tie_word_embeddings`).
    """

    model_type = "txl"
    # Trainer's evaluation hands every other output to `compute_metrics` as predictions: the memory and the
    # per-token losses are not predictions (logits are).
    keys_to_ignore_at_inference = ["past_key_values", "cache", "losses"]  # (the memory's name before and since 5.24)
    attribute_map = {
        "n_token": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "head_dim": "d_head",
        "intermediate_size": "d_inner",
        "initializer_range": "init_std",
        "layer_norm_eps": "layer_norm_epsilon",
        "attention_dropout": "dropatt",
    }

    vocab_size: int = 267735
    # Any sequence of ids is accepted (a tuple, a numpy array) and stored as a list; None means [].
    cutoffs: list[int] | None = field(default_factory=lambda: list(DEFAULT_CUTOFFS))
    d_model: int = 1024
    d_embed: int | None = None  # None: d_model
    n_head: int = 16
    d_head: int = 64
    d_inner: int = 4096
    div_val: int = 4
    pre_lnorm: bool = False
    n_layer: int = 18
    mem_len: int = 1600
    clamp_len: int = 1000
    same_length: bool = True
    tie_projs: list[bool] | None = None  # None: from proj_share_all_but_first
    untie_r: bool = True
    dropout: float = 0.1
    dropatt: float = 0.0
    init: str = "normal"
    init_range: float = 0.01
    init_std: float = 0.02
    proj_init_std: float = 0.01
    layer_norm_epsilon: float = 1e-5
    memory_init: str = "empty"
    tgt_len: int | None = None
    use_cache: bool = True
    return_logits: bool | None = None  # None: all but a training step's
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    tie_word_embeddings: bool | None = None  # None: v4's tie_weight when a legacy config has it, else True

    def __post_init__(self, **kwargs: Any) -> None:
        # `kwargs` holds what is not a field: standard aliases (`hidden_size=`), transformers' generic keys, and the
        # legacy options, which are read and checked here.
        kwargs.pop("model_type", None)  # the class says which it is; a legacy dict's "transfo-xl" must not stick
        legacy_options = _pop_legacy_options(kwargs)
        proj_share_all_but_first = kwargs.pop("proj_share_all_but_first", True)
        if self.tie_word_embeddings is None:
            self.tie_word_embeddings = legacy_options["tie_weight"]
        if self.tie_word_embeddings is not None and not is_flag(self.tie_word_embeddings):
            raise ValueError(f"TxlConfig: `tie_word_embeddings` must be a bool, got {self.tie_word_embeddings!r}.")
        self.tie_word_embeddings = True if self.tie_word_embeddings is None else bool(self.tie_word_embeddings)
        if self.return_logits is not None and not is_flag(self.return_logits):
            raise ValueError(f"TxlConfig: `return_logits` must be a bool or None, got {self.return_logits!r}.")
        self.return_logits = None if self.return_logits is None else bool(self.return_logits)
        cutoffs = self.cutoffs
        self.cutoffs = [] if cutoffs is None else list(cutoffs) if _is_sequence(cutoffs) else cutoffs
        self.tie_projs = list(self.tie_projs) if _is_sequence(self.tie_projs) else self.tie_projs
        # The base class sets the remaining kwargs, standard aliases included (`hidden_size=` lands in `d_model`),
        # so derived values and checks come after it.
        super().__post_init__(**kwargs)

        _check_cutoffs(self.cutoffs)
        self.cutoffs = [int(cutoff) for cutoff in self.cutoffs]
        if self.d_embed is None:
            self.d_embed = self.d_model
        if self.tie_projs is None:
            self.tie_projs = [False] + [bool(proj_share_all_but_first)] * len(self.cutoffs)
        self.validate_architecture()

    def validate(self) -> None:
        """What transformers runs before saving: the fields are checked again (they may be set after construction)."""
        self.validate_architecture()

    def validate_architecture(self) -> None:
        """Check every hyper-parameter; raise a `ValueError` naming the field, the value and what was expected."""
        for name in ("vocab_size", "d_model", "d_embed", "n_head", "d_head", "d_inner", "n_layer", "div_val"):
            require_integer(getattr(self, name), f"TxlConfig: `{name}`", minimum=1)
        require_integer(self.mem_len, "TxlConfig: `mem_len`", minimum=0)
        require_integer(self.tgt_len, "TxlConfig: `tgt_len`", minimum=0, none_ok=True)
        require_integer(self.clamp_len, "TxlConfig: `clamp_len`", note=" (0 or less: no clamping)")

        cutoffs = self.cutoffs
        _check_cutoffs(cutoffs)
        if any(later <= earlier for earlier, later in pairwise(cutoffs)):
            raise ValueError(f"TxlConfig: `cutoffs` must be strictly increasing, got {cutoffs}.")
        if cutoffs and (cutoffs[0] <= 0 or cutoffs[-1] >= self.vocab_size):
            default = " (the default, WikiText-103's clusters)" if tuple(cutoffs) == DEFAULT_CUTOFFS else ""
            raise ValueError(
                f"TxlConfig: `cutoffs` must lie strictly between 0 and vocab_size={self.vocab_size}, got "
                f"{cutoffs}{default}; pass cutoffs=[] for one full softmax, or cluster bounds below vocab_size."
            )
        if self.d_model % 2:
            raise ValueError(
                f"TxlConfig: `d_model` must be even (the sinusoid of relative positions pairs sin and cos), got "
                f"{self.d_model}."
            )
        smallest_width = self.d_embed // self.div_val ** len(cutoffs) if self.div_val > 1 else self.d_embed
        if smallest_width < 1:
            raise ValueError(
                f"TxlConfig: d_embed={self.d_embed} with div_val={self.div_val} gives the last of {len(cutoffs) + 1} "
                "clusters an embedding of width 0; lower `div_val` or raise `d_embed`."
            )
        if not isinstance(self.tie_projs, list) or not all(is_flag(tie) for tie in self.tie_projs):
            raise ValueError(
                f"TxlConfig: `tie_projs` must be a list of bools (one per cluster), got {self.tie_projs!r}."
            )
        if self.model_type == "transfo-xl" and len(self.tie_projs) < len(cutoffs) + 1:
            # v4 read a shorter list as it went, leaving the clusters after it untied
            self.tie_projs = self.tie_projs + [False] * (len(cutoffs) + 1 - len(self.tie_projs))
        if len(self.tie_projs) != len(cutoffs) + 1:
            raise ValueError(
                f"TxlConfig: `tie_projs` needs one entry per cluster (len(cutoffs) + 1 = {len(cutoffs) + 1}), "
                f"got {self.tie_projs}."
            )
        for name in ("dropout", "dropatt"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"TxlConfig: `{name}` must be a probability in [0, 1), got {value!r}.")
        if self.memory_init not in MEMORY_INIT_CHOICES:
            raise ValueError(
                f"TxlConfig: `memory_init` must be one of {MEMORY_INIT_CHOICES}, got {self.memory_init!r}."
            )
        if self.init not in INIT_CHOICES:
            raise ValueError(f"TxlConfig: `init` must be one of {INIT_CHOICES}, got {self.init!r}.")
        if not is_positive_number(self.layer_norm_epsilon):
            raise ValueError(f"TxlConfig: `layer_norm_epsilon` must be > 0, got {self.layer_norm_epsilon!r}.")
        for name in ("init_std", "init_range", "proj_init_std"):
            value = getattr(self, name)
            if not (is_positive_number(value) or value == 0) or isinstance(value, bool):
                raise ValueError(
                    f"TxlConfig: `{name}` must be a number >= 0 (a spread of initial weights), got {value!r}."
                )
        for name in BOOLEAN_FIELDS:
            value = getattr(self, name)
            if not is_flag(value):
                raise ValueError(f"TxlConfig: `{name}` must be a bool, got {value!r}.")
        require_integer(self.num_labels, "TxlConfig: `num_labels`", minimum=1)
        for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 0 <= value < self.vocab_size):
                raise ValueError(
                    f"TxlConfig: `{name}` must be None or a token id in [0, {self.vocab_size}), got {value!r}."
                )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, **kwargs: Any) -> TxlConfig:
        # A v4 folder read through TxlConfig is a TransfoXLConfig (see from_dict); going there directly also spares
        # transformers' warning about instantiating a "txl" model from a "transfo-xl" config.
        if cls is TxlConfig:
            config_dict, _ = cls.get_config_dict(pretrained_model_name_or_path, **dict(kwargs))
            if config_dict.get("model_type") == TransfoXLConfig.model_type:
                return TransfoXLConfig.from_pretrained(pretrained_model_name_or_path, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> TxlConfig:
        # A transformers-v4 config.json read through TxlConfig (e.g. `TxlForCausalLM.from_pretrained(v4_folder)`)
        # becomes a TransfoXLConfig, so that its v4 defaults and parameter names apply as with the Auto classes.
        if cls is TxlConfig and config_dict.get("model_type") == TransfoXLConfig.model_type:
            return TransfoXLConfig.from_dict(config_dict, **kwargs)
        try:
            return super().from_dict(config_dict, **kwargs)
        except ValueError as error:
            if kwargs.get("return_unused_kwargs") or not _read_by_auto_tokenizer():
                raise
            # AutoTokenizer reads config.json only to pick the tokenizer class by the config's type; when the config
            # is invalid it falls back, silently, to a generic tokenizer that cannot read a v4 vocab.pkl ("Couldn't
            # instantiate the backend tokenizer ... sentencepiece"). The tokenizer needs none of these values, so
            # AutoTokenizer gets a default config of this type, which only routes it to TransfoXLTokenizerFast.
            logger.warning(
                f"{kwargs.get('name_or_path', '')}/config.json: not a valid model config ({str(error).rstrip('.')}); "
                "the tokenizer does not need it, so AutoTokenizer goes on; no model will load from this folder until "
                "it is fixed."
            )
            config = cls()
            if "name_or_path" in kwargs:
                config.name_or_path = kwargs["name_or_path"]
            return config

    @classmethod
    def from_legacy(cls, config: TxlConfig) -> TxlConfig:
        """The `txl` config of a legacy (`transfo-xl`) one: same hyper-parameters, `model_type` "txl"."""
        values = {key: value for key, value in config.to_dict().items() if key not in ("model_type", "auto_map")}
        return cls(**values)

    @property
    def cluster_bounds(self) -> list[int]:
        """`[0, *cutoffs, vocab_size]`: cluster `i` holds the token ids in `[bounds[i], bounds[i + 1])`."""
        return [0, *self.cutoffs, self.vocab_size]

    def cluster_width(self, cluster: int) -> int:
        """Embedding width of cluster `cluster` of the adaptive embedding and softmax."""
        return self.d_embed // (self.div_val**cluster)


def _read_by_auto_tokenizer() -> bool:
    """Whether `AutoTokenizer.from_pretrained` is among the callers (it reads a config only to pick a tokenizer)."""
    frame = inspect.currentframe()
    while frame is not None:
        if (
            frame.f_code.co_name == "from_pretrained"
            and frame.f_globals.get("__name__") == "transformers.models.auto.tokenization_auto"
        ):
            return True
        frame = frame.f_back
    return False


def _is_sequence(value: Any) -> bool:
    return value is not None and not isinstance(value, (str, bytes, dict)) and hasattr(value, "__iter__")


def _check_cutoffs(cutoffs: Any) -> None:
    if not isinstance(cutoffs, list) or not all(is_integer(cutoff) for cutoff in cutoffs):
        raise ValueError(
            f"TxlConfig: `cutoffs` must be a list of integer token ids (cluster boundaries, [] for one softmax), got "
            f"{cutoffs!r}."
        )


def _pop_legacy_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the v4 / original-code keys that have no field here from `kwargs`, refusing unsupported values."""
    attn_type = kwargs.pop("attn_type", 0)
    if attn_type != 0:
        raise ValueError(
            f"TxlConfig: attn_type={attn_type!r} is not supported. Only attn_type=0, the relative positional "
            "attention of the paper, is implemented (as in every released Transformer-XL checkpoint); types 1-3 of "
            "the original code (Shaw et al., absolute, Al-Rfou et al.) are not."
        )
    sample_softmax = kwargs.pop("sample_softmax", -1)
    if sample_softmax is not None and sample_softmax > 0:
        raise ValueError(
            f"TxlConfig: sample_softmax={sample_softmax!r} is not supported. Sampled softmax was a training-time "
            "option of the original code that no released checkpoint uses; set it to -1 (the adaptive softmax)."
        )
    ext_len = kwargs.pop("ext_len", 0)
    if ext_len:
        logger.warning(f"TxlConfig: ext_len={ext_len} is ignored (transformers v4 ignored it too).")
    # `adaptive` was always on in v4 whatever its value; `cutoffs=[]` is the plain softmax.
    kwargs.pop("adaptive", None)
    return {"tie_weight": kwargs.pop("tie_weight", None)}


class TransfoXLConfig(TxlConfig):
    """`TxlConfig` for the `config.json` of transformers-v4 checkpoints (`"model_type": "transfo-xl"`).

    It only differs from `TxlConfig` by its model type and by two defaults, v4's: `d_embed` 1024 and `eos_token_id`
    0 (v4 did not write default values to `config.json`). A model loaded with it saves in the `txl` format
    (`TxlPreTrainedModel.save_pretrained` writes `TxlConfig.from_legacy(config)` and the `txl` parameter names).
    """

    model_type = "transfo-xl"

    d_embed: int | None = 1024
    eos_token_id: int | None = 0
