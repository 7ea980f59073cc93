"""Tokenizers for Transformer-XL on the `tokenizers` library, and safe loading of transformers-v4 vocabularies.

`register_tokenizers()` registers `TransfoXLTokenizerFast` with `AutoTokenizer` for `TxlConfig` and the legacy
`TransfoXLConfig`, so that `AutoTokenizer.from_pretrained(folder)` loads a folder with `tokenizer.json` or converts a
transformers-v4 folder holding only `config.json` and `vocab.pkl` / `vocab.bin`.
"""

from __future__ import annotations

from .legacy_vocab import LegacyVocab, LegacyVocabError, SafeUnpickler, load_legacy_vocab, safe_load_pickle
from .tokenization_txl import (
    BPE_MIN_VOCAB_SIZE,
    BPE_VOCAB_SIZE,
    TOKENIZER_KINDS,
    WIKITEXT_SEPARATORS,
    TransfoXLTokenizerFast,
    build_word_level_tokenizer,
    save_atomically,
    tokenizer_from_legacy_vocab,
    train_byte_level_bpe,
    train_char_level,
    train_tokenizer,
    train_word_level,
)


def register_tokenizers() -> None:
    """Register `TransfoXLTokenizerFast` with `AutoTokenizer` for both configs of the package (idempotent)."""
    from transformers import AutoTokenizer

    from ..configuration_txl import TransfoXLConfig, TxlConfig

    for config_class in (TxlConfig, TransfoXLConfig):
        AutoTokenizer.register(config_class, tokenizer_class=TransfoXLTokenizerFast, exist_ok=True)


__all__ = [
    "BPE_MIN_VOCAB_SIZE",
    "BPE_VOCAB_SIZE",
    "TOKENIZER_KINDS",
    "WIKITEXT_SEPARATORS",
    "LegacyVocab",
    "LegacyVocabError",
    "SafeUnpickler",
    "TransfoXLTokenizerFast",
    "build_word_level_tokenizer",
    "load_legacy_vocab",
    "register_tokenizers",
    "safe_load_pickle",
    "save_atomically",
    "tokenizer_from_legacy_vocab",
    "train_byte_level_bpe",
    "train_char_level",
    "train_tokenizer",
    "train_word_level",
]
