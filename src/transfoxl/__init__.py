"""Transformer-XL for Hugging Face transformers v5.

Importing the package registers the model with the Auto classes, for new checkpoints (`model_type: "txl"`) and for
transformers-v4 ones (`model_type: "transfo-xl"`):

    import transfoxl
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path)
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_txl import TransfoXLConfig, TxlConfig
from .modeling_txl import (
    TxlAdaptiveEmbedding,
    TxlAdaptiveLogSoftmax,
    TxlCausalLMOutputWithPast,
    TxlForCausalLM,
    TxlForQuestionAnswering,
    TxlForSequenceClassification,
    TxlForTokenClassification,
    TxlMemory,
    TxlModel,
    TxlPreTrainedModel,
)
from .streaming import TxlStream
from .tokenization import TransfoXLTokenizerFast, register_tokenizers

__version__ = "0.1.0"

_AUTO_CLASSES = {
    AutoModel: TxlModel,
    AutoModelForCausalLM: TxlForCausalLM,
    AutoModelForSequenceClassification: TxlForSequenceClassification,
    AutoModelForTokenClassification: TxlForTokenClassification,
    AutoModelForQuestionAnswering: TxlForQuestionAnswering,
}
for _config_class in (TxlConfig, TransfoXLConfig):
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    for _auto_class, _model_class in _AUTO_CLASSES.items():
        # `register` insists that model_class.config_class is the config class by name; the legacy config is a
        # subclass, so it goes into the same mapping directly.
        _auto_class._model_mapping.register(_config_class, _model_class, exist_ok=True)

register_tokenizers()  # AutoTokenizer for both model types, v4 folders with only vocab.pkl / vocab.bin included

# save_pretrained writes `auto_map` and copies configuration_txl.py / modeling_txl.py, and the files they import
# relatively (memory_txl.py, kernels_txl.py, cpp_kernels_txl.py, checks_txl.py), into the folder, so that plain
# transformers loads it with trust_remote_code=True.
TxlConfig.register_for_auto_class()
TxlModel.register_for_auto_class("AutoModel")
TxlForCausalLM.register_for_auto_class("AutoModelForCausalLM")
TxlForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
TxlForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
TxlForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")

__all__ = [
    "TransfoXLConfig",
    "TransfoXLTokenizerFast",
    "TxlAdaptiveEmbedding",
    "TxlAdaptiveLogSoftmax",
    "TxlCausalLMOutputWithPast",
    "TxlConfig",
    "TxlForCausalLM",
    "TxlForQuestionAnswering",
    "TxlForSequenceClassification",
    "TxlForTokenClassification",
    "TxlMemory",
    "TxlModel",
    "TxlPreTrainedModel",
    "TxlStream",
    "__version__",
]
