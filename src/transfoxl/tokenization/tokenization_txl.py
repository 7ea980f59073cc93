"""Transformer-XL tokenizers on the `tokenizers` library, saved as `tokenizer.json`.

Everything built here is a plain `transformers.TokenizersBackend` (v4 name `PreTrainedTokenizerFast`) over a
`tokenizers.Tokenizer`, so a saved folder loads with plain `AutoTokenizer.from_pretrained(folder)`, without this
package. Three kinds:

* word level, WikiText style (`build_word_level_tokenizer`, `train_word_level`): the vocabulary semantics of the
  original Transformer-XL (`Vocab` / v4's `TransfoXLTokenizer`). See `wikitext_normalizer` and
  `wikitext_pre_tokenizer` for what happens to raw text;
* character level (`train_char_level`): every character one token, newline included;
* byte-level BPE (`train_byte_level_bpe`): open vocabulary, exact round trip of any UTF-8.

`TransfoXLTokenizerFast` is the class registered with `AutoTokenizer` for the model's configs: its `from_pretrained`
loads a folder with `tokenizer.json`, or converts a transformers-v4 folder (`vocab.pkl` / `vocab.bin`, read by the
allow-list unpickler of `legacy_vocab`) on the fly.

Parity with v4's `TransfoXLTokenizer` (checked against fixtures recorded with transformers 4.37.2):

* pre-tokenized (whitespace-separated) text, the form of the corpora: the same ids as v4's vocabulary lookup of the
  split line, with or without special tokens, as v4's `encode`; each newline is `<eos>`, the corpora's line end
  (`add_eos=True` also ends the last line with one, as the corpora's per-line encoding). (v4's `tokenize()` ran Moses
  on such text too and broke WikiText's separators: `role @-@ playing` -> `role @ - @ playing`; kept here.)
* raw text: the same words as v4's Moses pipeline + @-@ rules for hyphenated words (`state-of-the-art` ->
  `state @-@ of @-@ the @-@ art`), numbers (`1,000` -> `1 @,@ 000`, `3.14` -> `3 @.@ 14`, `1-2` -> `1 @-@ 2`),
  punctuation, straight and curly quotes, contractions (`isn't` -> `isn 't`, `I'm` -> `I 'm`), abbreviations and
  nonbreaking prefixes (`U.S.`, `Mr.`), special tokens in the text, lower-casing. Known differences:
  - a clitic standing alone stays one word: `it 's` -> `it 's` (v4: `it ' s`), likewise `n't 'll 're 've 'm 'd 't`;
  - Moses' rule across words, a final period kept before a lower-case word, is not applied:
    `the game. and` -> `the game . and` (v4: `the game. and`); the nonbreaking prefixes are matched in any case
    instead (lower-cased text keeps `mr.` as v4 did by that rule), also where v4 split them: before a capital or at
    the end of a line (`the con.` -> `the con.`, v4: `the con .`); and `No.`, `Art.`, `pp.`, which Moses keeps before
    a number only, are split;
  - only the first apostrophe inside a word splits in Moses: `rock'n'roll` -> `rock 'n 'roll` (v4: `rock 'n'roll`);
  - a newline ends a line with `<eos>` (v4's `tokenize` dropped it): `line one\nline two` ->
    `line one <eos> line two`; pass `eos_per_line=False` for v4's behaviour;
  - Moses' less common normalizations (Penn-style quotes, French quotes, pseudo-spaces, full-width punctuation) are
    not applied, nor its finer splitting of some scripts (Han characters next to kana) and marks;
  - settings: a folder without `tokenizer_config.json` takes `lower_case` from the vocabulary file (v4 ignored it
    there and did not lower-case: a vocabulary built lower-cased then mapped every capitalised word to `<unk>`), and
    v4's `never_split` is not carried over (a warning says so at conversion).
* decoding: words joined by single spaces and WikiText's `@-@ @,@ @.@` undone (`1 @,@ 000` -> `1,000`,
  `role @-@ playing` -> `role-playing`), `<eos>` -> newline. v4 ran Moses' detokenizer instead (no space before
  punctuation, `@-@` left as is): v4 `He said "it was the game" and left.`, here `He said " it was the game " and
  left .`, which encodes back to the same ids.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers as tokenizer_trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging

from ..checkpoints import is_hub_repo_id
from .legacy_vocab import LegacyVocab, LegacyVocabError, find_legacy_vocab_file, load_legacy_vocab

logger = logging.get_logger(__name__)

__all__ = [
    "BPE_MIN_VOCAB_SIZE",
    "BPE_VOCAB_SIZE",
    "DEFAULT_EOS_TOKEN",
    "DEFAULT_UNK_TOKEN",
    "TOKENIZER_KINDS",
    "WIKITEXT_SEPARATORS",
    "TransfoXLTokenizerFast",
    "build_word_level_tokenizer",
    "save_atomically",
    "tokenizer_from_legacy_vocab",
    "train_byte_level_bpe",
    "train_char_level",
    "train_tokenizer",
    "train_word_level",
    "wikitext_decoder",
    "wikitext_normalizer",
    "wikitext_pre_tokenizer",
    "without_loading_state",
]

DEFAULT_UNK_TOKEN = "<unk>"
DEFAULT_EOS_TOKEN = "<eos>"
# v4's TransfoXLTokenizer added "<formula>" as a special token unless told otherwise.
V4_DEFAULT_ADDITIONAL_SPECIAL_TOKENS = ("<formula>",)
# WikiText's split numbers and hyphenated words: "1 @,@ 000", "3 @.@ 14", "state @-@ of @-@ the @-@ art".
WIKITEXT_SEPARATORS = {"@-@": "-", "@,@": ",", "@.@": "."}

# Moses' English nonbreaking prefixes that commonly end in a period (kept whole: "Mr.", "Dr.", "U.S.").
_NONBREAKING_PREFIXES = (
    *("Adj", "Adm", "Adv", "Asst", "Bart", "Bldg", "Brig", "Bros", "Capt", "Cmdr", "Col", "Comdr", "Con", "Corp"),
    *("Cpl", "DR", "Dr", "Drs", "Ens", "Gen", "Gov", "Hon", "Hr", "Hosp", "Insp", "Lt", "MM", "MR", "MRS", "MS"),
    *("Maj", "Messrs", "Mlle", "Mme", "Mr", "Mrs", "Ms", "Msgr", "Op", "Ord", "Pfc", "Ph", "Prof", "Pvt", "Rep"),
    *("Reps", "Res", "Rev", "Rt", "Sen", "Sens", "Sfc", "Sgt", "Sr", "St", "Supt", "Surg", "v", "vs", "i.e", "rev"),
    *("e.g", "Nos", "Nr", "Rs", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
)
# Clitics that WikiText keeps as separate words ("the team 's", "was n't"): whole words, never split further.
_CLITICS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "n't")
# Moses' punctuation normalizer (the replacements that matter for English text).
_PUNCT_NORMALIZATION = (
    ("\r", ""),
    ("„", '"'),
    ("“", '"'),
    ("”", '"'),
    ("–", "-"),
    ("—", " - "),
    ("´", "'"),
    ("‘", "'"),
    ("‚", "'"),
    ("’", "'"),
    ("''", '"'),
    ("…", "..."),
    # English: a quote before a comma or period goes after it ('said "no".' -> 'said "no."')
    ('".', '."'),
    ('",', ',"'),
)


# ---------------------------------------------------------------------------------------------------------------
# The WikiText word-level pipeline
# ---------------------------------------------------------------------------------------------------------------


def wikitext_normalizer(
    *,
    lower_case: bool = False,
    eos_token: str | None = DEFAULT_EOS_TOKEN,
    moses_rules: bool = True,
    drop_final_newline: bool = False,
) -> normalizers.Normalizer:
    """The normalizer of the word-level tokenizer.

    In order: `\\r` dropped and Moses' English punctuation normalization (curly quotes to straight, em dash to
    " - ", ...) when `moses_rules`; optional lower-casing; the number and hyphen rules of WikiText / Moses
    (`1,000` -> `1 @,@ 000`, `3.14` -> `3 @.@ 14`, `e-mail` -> `e @-@ mail`, only between letters or digits, so
    pre-tokenized WikiText is unchanged); then, when `eos_token` is given, every newline becomes ` <eos> ` (with
    `drop_final_newline`, one final newline is dropped first: a post-processor that appends `<eos>` ends the line).
    """
    steps: list[normalizers.Normalizer] = []
    if moses_rules:
        steps += [normalizers.Replace(old, new) for old, new in _PUNCT_NORMALIZATION]
    if lower_case:
        steps.append(normalizers.Lowercase())
    steps += [
        normalizers.Replace(Regex(r"(?<=[\p{L}\p{N}])-(?=[\p{L}\p{N}])"), " @-@ "),
        normalizers.Replace(Regex(r"(?<=\p{N}),(?=\p{N})"), " @,@ "),
        normalizers.Replace(Regex(r"(?<=\p{N})\.(?=\p{N})"), " @.@ "),
    ]
    if eos_token is not None:
        if drop_final_newline:
            steps.append(normalizers.Replace(Regex(r"\n\z"), ""))
        steps.append(normalizers.Replace("\n", f" {eos_token} "))
    return normalizers.Sequence(steps)


def _alternation(words: Iterable[str]) -> str:
    # Longest first (a prefix of another word must not match before it); then alphabetical, so that the regex, and
    # the tokenizer.json that holds it, are the same in every run (a set's order changes with the hash seed).
    return "|".join(re.escape(word) for word in sorted(set(words), key=lambda word: (-len(word), word)))


def wikitext_pre_tokenizer(
    special_tokens: Sequence[str] = (DEFAULT_UNK_TOKEN, DEFAULT_EOS_TOKEN), *, moses_rules: bool = True
) -> pre_tokenizers.PreTokenizer:
    """Whitespace split, then (when `moses_rules`) Moses-like splitting of punctuation off words, in Moses' order:
    first everything but periods, then each piece's final period (`over."` -> `over . "`, `(Mr.` -> `( Mr.`).

    Kept whole: the `special_tokens`, WikiText's `@-@ @,@ @.@`, the clitics `'s 'll n't ...` standing alone,
    abbreviations (`U.S.`, `e.g.`) and Moses' nonbreaking prefixes (`Mr.`, `Dr.`, `Jan.`), `...`. Split off as their
    own word: commas, any other character that is not a letter, digit, mark, `.`, `'`, `` ` `` or `-`, apostrophes
    (`isn't` -> `isn 't`, `1990's` -> `1990 's`, `'quoted'` -> `' quoted '`), runs of periods, then a final period.
    """
    whitespace = pre_tokenizers.WhitespaceSplit()
    if not moses_rules:
        return whitespace
    protected = [re.escape(token) for token in special_tokens if token] + [_alternation(WIKITEXT_SEPARATORS)]
    everything_but_periods = [
        *protected,
        rf"^(?i:{_alternation(_CLITICS)})\z",
        r"\.{2,}",
        r"(?<=\p{L})'\p{L}+",
        r"(?<=\p{N})'[sS]\b",
        r"'",
        r",",
        r"[^\p{L}\p{N}\p{M}\s.'`,\-]",
    ]
    final_periods = [
        *protected,
        r"^\.{2,}\z",
        r"^(?=\S*\p{L})(?:[^.\s]+\.)+[^.\s]*\.\z",  # abbreviation with inner periods: U.S. e.g.
        # Case-insensitive: lower-cased text keeps "mr." too (Moses did, by its next-word-in-lower-case rule).
        rf"^(?:(?i:{_alternation(_NONBREAKING_PREFIXES)})|\p{{Lu}})\.\z",
        r"\.\z",
    ]
    return pre_tokenizers.Sequence(
        [
            whitespace,
            *(
                pre_tokenizers.Split(Regex("|".join(f"(?:{rule})" for rule in rules)), "isolated")
                for rules in (everything_but_periods, final_periods)
            ),
        ]
    )


def wikitext_decoder(eos_token: str | None = DEFAULT_EOS_TOKEN) -> decoders.Decoder:
    """Words joined by spaces; ` @-@ ` -> `-`, ` @,@ ` -> `,`, ` @.@ ` -> `.`; `<eos>` (unless skipped) -> newline."""
    steps: list[decoders.Decoder] = [decoders.Replace(Regex("^"), " "), decoders.Fuse()]
    # Line ends first: a separator's replacement takes the space on each side, that before `<eos>` too (`a @-@ <eos>`
    # came back as `a-<eos>`, where the text was `a @-@` and a newline).
    if eos_token is not None:
        steps += [decoders.Replace(f" {eos_token}", "\n"), decoders.Replace("\n ", "\n")]
    steps += [decoders.Replace(f" {separator} ", plain) for separator, plain in WIKITEXT_SEPARATORS.items()]
    steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


def build_word_level_tokenizer(
    idx2sym: Sequence[str],
    *,
    unk_token: str = DEFAULT_UNK_TOKEN,
    eos_token: str | None = DEFAULT_EOS_TOKEN,
    additional_special_tokens: Sequence[str] = (),
    lower_case: bool = False,
    add_eos: bool = False,
    eos_per_line: bool = True,
    moses_rules: bool = True,
    tokenizer_kwargs: Mapping[str, Any] | None = None,
) -> PreTrainedTokenizerFast:
    """A WikiText-style word-level tokenizer whose id `i` is `idx2sym[i]`.

    Unknown words map to `unk_token` (appended to the vocabulary if `idx2sym` lacks it). `eos_token`,
    `unk_token` and `additional_special_tokens` are special (split out of raw text before anything else, skipped by
    `decode(..., skip_special_tokens=True)`); a special token missing from `idx2sym` gets the next free id, as in v4.
    `eos_per_line`: every newline in the text becomes `eos_token`. So `"a b\\nc\\n"` -> `a b <eos> c <eos>`, the
    original corpora's encoding, and a prompt without a final newline (`"a b"`) ends without one, as v4's `encode`
    and GPT-2's tokenizer do. `add_eos`: encoding with `add_special_tokens=True` (the default) also ends the last line
    with `eos_token` (the corpora's encoding of one line at a time; a prompt would then read as a finished line).
    `lower_case` lower-cases everything but special tokens. `tokenizer_kwargs`: more arguments of
    `PreTrainedTokenizerFast` (`padding_side`, `pad_token`, ...).
    """
    symbols = list(idx2sym)
    if len(set(symbols)) != len(symbols):
        raise ValueError("idx2sym: every symbol must be unique")
    vocab = {symbol: idx for idx, symbol in enumerate(symbols)}
    specials = [token for token in (eos_token, unk_token, *additional_special_tokens) if token]
    for token in specials:  # missing ones get the next ids in v4's order: eos, unk, then the additional ones
        if token not in vocab:
            vocab[token] = len(vocab)  # in the vocabulary: WordLevel maps unknown words to an entry of it
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk_token))
    tokenizer.normalizer = wikitext_normalizer(
        lower_case=lower_case,
        eos_token=eos_token if eos_per_line else None,
        moses_rules=moses_rules,
        drop_final_newline=bool(add_eos and eos_token),
    )
    tokenizer.pre_tokenizer = wikitext_pre_tokenizer(specials, moses_rules=moses_rules)
    tokenizer.decoder = wikitext_decoder(eos_token)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    if add_eos and eos_token:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A:0 {eos_token}:0",
            pair=f"$A:0 {eos_token}:0 $B:1 {eos_token}:1",
            special_tokens=[(eos_token, tokenizer.token_to_id(eos_token))],
        )
    return _wrap(
        tokenizer,
        unk_token=unk_token,
        eos_token=eos_token,
        extra_special_tokens=additional_special_tokens,
        **(tokenizer_kwargs or {}),
    )


def _wrap(
    tokenizer: Tokenizer,
    *,
    unk_token: str | None = None,
    eos_token: str | None = None,
    pad_token: str | None = None,
    extra_special_tokens: Sequence[str] = (),
    **settings: Any,
) -> PreTrainedTokenizerFast:
    kwargs: dict[str, Any] = {"tokenizer_object": tokenizer, **settings}
    for name, token in (("unk_token", unk_token), ("eos_token", eos_token), ("pad_token", pad_token)):
        if token:
            kwargs[name] = token
    if extra_special_tokens:
        kwargs["extra_special_tokens"] = list(extra_special_tokens)
    return PreTrainedTokenizerFast(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Legacy (transformers v4) folders
# ---------------------------------------------------------------------------------------------------------------

# tokenizer_config.json keys of v4's TransfoXLTokenizer that decide how text is tokenized.
_V4_CONFIG_FIELDS = ("lower_case", "delimiter")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise LegacyVocabError(f"{path}: not a readable JSON file ({error})") from error
    if not isinstance(data, dict):
        raise LegacyVocabError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialized as {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_from_legacy_vocab(
    path: str | os.PathLike[str],
    *,
    tokenizer_config: dict[str, Any] | None = None,
    tokenizer_kwargs: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> PreTrainedTokenizerFast:
    """Build the word-level tokenizer of a transformers-v4 Transformer-XL vocabulary (safely: see `legacy_vocab`).

    `path` is a folder (holding `vocab.pkl` or `vocab.bin`, and optionally v4's `tokenizer_config.json`) or a
    vocabulary file. Ids equal v4's `idx2sym` order. Settings, first found wins: `overrides` (`lower_case`,
    `unk_token`, `eos_token`, `additional_special_tokens`, `add_eos`, ...), `tokenizer_config.json`, the
    vocabulary's own fields, v4's defaults (`<unk>`, `<eos>`, additional special token `<formula>`).
    `tokenizer_kwargs`: transformers' tokenizer arguments (`padding_side`, `pad_token`, ...), as `from_pretrained`
    takes them.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    vocab_file = find_legacy_vocab_file(path) if path.is_dir() else path
    if vocab_file is None or not vocab_file.is_file():
        raise LegacyVocabError(f"{path}: no vocab.pkl or vocab.bin found")
    if tokenizer_config is None:
        config_file = folder / "tokenizer_config.json"
        tokenizer_config = _read_json(config_file) if config_file.is_file() else {}
    settings = {key: tokenizer_config[key] for key in _V4_CONFIG_FIELDS if key in tokenizer_config}
    settings.update({key: overrides[key] for key in _V4_CONFIG_FIELDS if key in overrides})
    vocab: LegacyVocab = load_legacy_vocab(vocab_file, overrides=settings)
    if vocab.delimiter == "":
        raise LegacyVocabError(
            f"{vocab_file}: delimiter '' (v4's character-level mode) is not supported by the word-level converter"
        )

    def setting(name: str, default: Any) -> Any:
        if name in overrides:
            return overrides[name]
        return tokenizer_config.get(name, default)

    unk_token = _token_content(setting("unk_token", DEFAULT_UNK_TOKEN)) or DEFAULT_UNK_TOKEN
    if unk_token not in vocab.idx2sym and "<UNK>" in vocab.idx2sym:
        unk_token = "<UNK>"  # v4's fallback for pre-trained vocabularies
    eos_token = _token_content(setting("eos_token", DEFAULT_EOS_TOKEN)) or DEFAULT_EOS_TOKEN
    extra = setting(
        "additional_special_tokens",
        tokenizer_config.get("extra_special_tokens", list(V4_DEFAULT_ADDITIONAL_SPECIAL_TOKENS)),
    )
    extra_tokens = [
        token for token in map(_token_content, extra or []) if token and token not in (unk_token, eos_token)
    ]
    never_split = [
        token
        for token in tokenizer_config.get("never_split") or []
        if isinstance(token, str) and token not in (unk_token, eos_token, *extra_tokens)
    ]
    if never_split:
        logger.warning(
            f"{folder}: v4's never_split {never_split} is not carried over: those words are split as any other text "
            "(to <unk> pieces where the vocabulary lacks them). tokenizer.add_tokens(...) keeps a word whole."
        )
    return build_word_level_tokenizer(
        vocab.idx2sym,
        unk_token=unk_token,
        eos_token=eos_token,
        additional_special_tokens=extra_tokens,
        lower_case=vocab.lower_case,
        add_eos=overrides.get("add_eos", False),
        eos_per_line=overrides.get("eos_per_line", True),
        moses_rules=overrides.get("moses_rules", True),
        tokenizer_kwargs=tokenizer_kwargs,
    )


class TransfoXLTokenizerFast(PreTrainedTokenizerFast):
    """The tokenizer class registered with `AutoTokenizer` for `TxlConfig` and the legacy `TransfoXLConfig`.

    `from_pretrained(folder)` returns a plain `TokenizersBackend`: loaded from `tokenizer.json` when the folder has
    one, else converted from a transformers-v4 `vocab.pkl` / `vocab.bin` (never unpickled with `pickle.load`; see
    `legacy_vocab`). Its name makes v4's `"tokenizer_class": "TransfoXLTokenizer"` resolve to it.
    """

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike[str], *init_inputs: Any, **kwargs: Any
    ) -> PreTrainedTokenizerFast:
        """Load `tokenizer.json` or convert a v4 vocabulary (see the class docstring).

        Raises `OSError` naming the path for a missing folder, a repo id that cannot be fetched (or, offline, is not
        cached), a folder without tokenizer files, and a tokenizer file that is truncated, corrupt or not UTF-8;
        `LegacyVocabError` for a v4 vocabulary that is unreadable or needs anything but plain data.
        """
        folder = Path(pretrained_model_name_or_path).expanduser()
        if not folder.is_dir():
            folder = _fetch_tokenizer_files(pretrained_model_name_or_path, kwargs)
        subfolder = kwargs.pop("subfolder", "") or ""
        folder = folder / subfolder
        if (folder / "tokenizer.json").is_file():
            try:
                return PreTrainedTokenizerFast.from_pretrained(folder, *init_inputs, **kwargs)
            except Exception as error:  # the tokenizers library raises a bare Exception for a file it cannot parse
                bad_file = _broken_tokenizer_file(folder)
                if bad_file is not None:
                    raise bad_file from error
                raise
        if find_legacy_vocab_file(folder) is None:
            raise OSError(f"{folder}: no tokenizer.json, vocab.pkl or vocab.bin")
        accepted = ("lower_case", "unk_token", "eos_token", "additional_special_tokens", "add_eos", "eos_per_line")
        # The rest of transformers' tokenizer arguments (padding_side, pad_token, model_max_length, ...) apply to the
        # converted tokenizer as to a loaded one (they were dropped, silently: a left padding became right padding).
        settings = {key: value for key, value in kwargs.items() if key not in accepted and key not in _LOADING_ONLY}
        tokenizer = tokenizer_from_legacy_vocab(
            folder, tokenizer_kwargs=settings, **{key: kwargs[key] for key in accepted if key in kwargs}
        )
        tokenizer.name_or_path = str(pretrained_model_name_or_path)
        return tokenizer


# from_pretrained's arguments that say where and how to load, not what the tokenizer does.
_LOADING_ONLY = frozenset(
    (
        "cache_dir",
        "force_download",
        "local_files_only",
        "token",
        "revision",
        "trust_remote_code",
        "proxies",
        "subfolder",
        "use_fast",
        "config",
        "tokenizer_type",
        "gguf_file",
        "user_agent",
        "use_auth_token",
        "resume_download",
        "_commit_hash",
        "_from_auto",
        "_from_pipeline",
    )
)


# JSON files a saved tokenizer folder may hold, all read by transformers when loading it.
_TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def _fetch_tokenizer_files(name_or_path: str | os.PathLike[str], kwargs: dict[str, Any]) -> Path:
    """The local snapshot of a Hub repo's tokenizer files; `OSError` naming `name_or_path` if there is none."""
    name = os.fspath(name_or_path)
    if not is_hub_repo_id(name):  # anything else that does not exist is a missing local folder
        raise OSError(f"{name}: no such folder (and not a Hub repo id of the form org/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(
                name,
                allow_patterns=["tokenizer.json", "*.json", "vocab.pkl", "vocab.bin"],
                revision=kwargs.get("revision"),
                cache_dir=kwargs.get("cache_dir"),
                token=kwargs.get("token"),
                local_files_only=kwargs.get("local_files_only", False),
            )
        )
    except LocalEntryNotFoundError as error:
        raise OSError(
            f"{name}: not a local folder, and not in the Hugging Face cache while the Hub cannot be reached (offline: "
            "HF_HUB_OFFLINE=1 or local_files_only=True, or no network): download it once online, or give the path "
            "of a local copy"
        ) from error
    except Exception as error:
        raise OSError(f"{name}: not a local folder, and not downloadable ({type(error).__name__}: {error})") from error


def _broken_tokenizer_file(folder: Path) -> OSError | None:
    """After loading `folder` failed: the error naming its first broken tokenizer file, or None if all are sound."""
    for name in _TOKENIZER_JSON_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            raw = path.read_bytes()
            if not raw:
                return OSError(f"{path}: the file is empty (0 bytes). Download it again, or save the tokenizer again")
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            return OSError(
                f"{path}: not UTF-8 text ({error}); tokenizer files are UTF-8 JSON. Was it written in another "
                "encoding (Latin-1, UTF-16)? Save it again as UTF-8"
            )
        except OSError as error:
            return OSError(f"{path}: cannot be read ({error})")
        try:
            data = json.loads(text)
        except ValueError as error:
            # These files are JSON objects: one that does not end with "}" was cut short.
            what = "corrupt" if text.rstrip().endswith("}") else "truncated (it ends early)"
            return OSError(
                f"{path}: not valid JSON ({error}): the file is {what}. Download it again, or save the tokenizer again"
            )
        if not isinstance(data, dict):
            return OSError(f"{path}: holds a JSON {type(data).__name__}, not an object: not a tokenizer file")
        if name == "tokenizer.json":
            try:
                Tokenizer.from_str(text)
            except Exception as error:
                return OSError(
                    f"{path}: valid JSON, but not a tokenizer that the tokenizers library can load ({error}). "
                    "Download it again, or save the tokenizer again"
                )
    return None


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------


def train_word_level(
    texts: Iterable[str],
    *,
    min_freq: int = 1,
    max_size: int | None = None,
    special: Sequence[str] = (DEFAULT_EOS_TOKEN, DEFAULT_UNK_TOKEN),
    unk_token: str = DEFAULT_UNK_TOKEN,
    eos_token: str = DEFAULT_EOS_TOKEN,
    lower_case: bool = False,
    moses_rules: bool = True,
    progress: Any = None,
) -> PreTrainedTokenizerFast:
    """Train a word-level tokenizer with the original Transformer-XL vocabulary semantics.

    Each item of `texts` is one line (a trailing newline is ignored); words are counted as the tokenizer itself
    splits them. The vocabulary is `special` first (in order), then the words by decreasing count (ties: first seen
    first, as `Counter.most_common`), each seen at least `min_freq` times, from the `max_size` most common words
    (specials among them are not repeated): the original code's `build_vocab`. Encoding turns each newline into
    `eos_token` (a text without a final newline ends without one: see `build_word_level_tokenizer`). `progress`
    (optional) is called with the number of lines done after each line.
    """
    if min_freq < 0:
        raise ValueError(f"min_freq must be >= 0, got {min_freq}")
    if max_size is not None and max_size < 0:
        raise ValueError(f"max_size must be >= 0 or None, got {max_size}")
    specials = list(dict.fromkeys([*special, *(t for t in (unk_token, eos_token) if t not in special)]))
    # The tokenizer's own split (normalizer + pre-tokenizer) defines the words counted.
    splitter = build_word_level_tokenizer(
        specials, unk_token=unk_token, eos_token=eos_token, lower_case=lower_case, moses_rules=moses_rules
    ).backend_tokenizer
    counter: Counter[str] = Counter()
    for done, line in enumerate(_checked(texts), start=1):
        line = line.removesuffix("\n").removesuffix("\r")
        normalized = splitter.normalizer.normalize_str(line)
        counter.update(word for word, _ in splitter.pre_tokenizer.pre_tokenize_str(normalized))
        if progress is not None:
            progress(done)
    idx2sym = list(specials)
    for word, count in counter.most_common(max_size):
        if count < min_freq:
            break
        if word not in specials:
            idx2sym.append(word)
    return build_word_level_tokenizer(
        idx2sym, unk_token=unk_token, eos_token=eos_token, lower_case=lower_case, moses_rules=moses_rules
    )


def train_char_level(
    texts: Iterable[str],
    *,
    min_freq: int = 1,
    max_size: int | None = None,
    unk_token: str = DEFAULT_UNK_TOKEN,
    eos_token: str | None = DEFAULT_EOS_TOKEN,
    progress: Any = None,
) -> PreTrainedTokenizerFast:
    """Train a character-level tokenizer: every character (space and newline included) is one token.

    Vocabulary: `unk_token`, `eos_token`, then characters by decreasing count (at most `max_size`, each seen at least
    `min_freq` times) and the newline in any case, at its place by count: a text that does not end with one is a line
    read without it (a `datasets` text column), which the stream ends with one (`data.tokenize_corpus`), so one is
    counted for it. (Its place matters to an adaptive softmax, whose clusters are ranges of ids.)
    `decode(encode(text)) == text` for any text made of known characters; unknown characters map
    to `unk_token`. No token is added automatically: append `eos_token_id` yourself where a document ends.
    """
    counter: Counter[str] = Counter()
    unended = 0  # texts without a final newline
    for done, text in enumerate(texts, start=1):
        if not isinstance(text, str):
            raise TypeError(f"texts: expected strings, found {type(text).__name__}")
        counter.update(text)
        unended += not text.endswith("\n")
        if progress is not None:
            progress(done)
    newlines = counter.pop("\n", 0) + unended
    specials = [token for token in (unk_token, eos_token) if token]
    chars = [char for char, count in counter.most_common(max_size) if count >= min_freq and char not in specials]
    chars.insert(sum(counter[char] >= newlines for char in chars), "\n")  # (after the characters as frequent)
    vocab = {token: idx for idx, token in enumerate([*specials, *chars])}
    # BPE without merges over single characters: one token per character, and no pre-tokenizer so whitespace stays.
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=unk_token))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    return _wrap(tokenizer, unk_token=unk_token, eos_token=eos_token)


def train_byte_level_bpe(
    texts: Iterable[str],
    *,
    vocab_size: int = 1000,
    min_freq: int = 2,
    special_tokens: Sequence[str] = (DEFAULT_EOS_TOKEN, "<pad>"),
    eos_token: str | None = DEFAULT_EOS_TOKEN,
    pad_token: str | None = "<pad>",
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer: open vocabulary (never unknown), `decode(encode(s)) == s` for any string.

    The vocabulary holds `special_tokens`, the 256 byte symbols, then merges up to `vocab_size`. No token is added
    automatically.
    """
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size must be >= {256 + len(special_tokens)} (256 bytes + specials), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    # No prefix space and no regex-level trimming: the byte sequence is kept exactly, so the round trip is exact.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = tokenizer_trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_freq,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(_checked(texts), trainer=trainer)
    return _wrap(tokenizer, eos_token=eos_token, pad_token=pad_token)


TOKENIZER_KINDS = ("char", "word", "bpe")  # what `train_tokenizer` trains
BPE_VOCAB_SIZE = 8000  # a byte-level BPE trained by `train_tokenizer` without a vocab_size
BPE_MIN_VOCAB_SIZE = 256 + 2  # a byte-level BPE's 256 byte symbols and its two special tokens (<eos>, <pad>)


def train_tokenizer(
    kind: str,
    texts: Iterable[str],
    *,
    vocab_size: int | None = None,
    min_freq: int | None = None,
    lower_case: bool = False,
    progress: Any = None,
) -> PreTrainedTokenizerFast:
    """Train a tokenizer of `kind` on `texts` (each a line; char and word count it the same with or without its
    newline, while a BPE learns merges of the newlines it is given), as the command lines do: "char"
    (`train_char_level`), "word" (`train_word_level`; `lower_case`) or "bpe" (`train_byte_level_bpe`, of
    `BPE_VOCAB_SIZE` tokens unless `vocab_size` says). `vocab_size`: bpe, the vocabulary's size (its 256 bytes and
    specials included); word, char: the most words / characters kept besides the special tokens (and char's
    newline). `min_freq`: the fewest occurrences a kept token has (None: each kind's default). `progress` (char and
    word) is called with the lines done."""
    if kind == "char":
        return train_char_level(texts, min_freq=min_freq or 1, max_size=vocab_size, progress=progress)
    if kind == "word":
        return train_word_level(
            texts, min_freq=min_freq or 1, max_size=vocab_size, lower_case=lower_case, progress=progress
        )
    if kind == "bpe":
        return train_byte_level_bpe(texts, vocab_size=vocab_size or BPE_VOCAB_SIZE, min_freq=min_freq or 2)
    raise ValueError(f"kind {kind!r}: expected one of {', '.join(TOKENIZER_KINDS)}")


def save_atomically(tokenizer: PreTrainedTokenizerFast, out: str | os.PathLike[str], *, overwrite: bool = False):
    """`tokenizer.save_pretrained` into `out`, atomically per file; return the paths written.

    Files are saved into a temporary folder inside `out`, then moved into place with `os.replace`, so `out` never
    holds a half-written file. Raises `FileExistsError` naming the files if `out` already holds one and not
    `overwrite`.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".saving-", dir=out))
    try:
        tokenizer.save_pretrained(staging)
        names = sorted(path.name for path in staging.iterdir() if path.is_file())
        clashes = [name for name in names if (out / name).exists()]
        if clashes and not overwrite:
            raise FileExistsError(f"{out}: already holds {clashes}; pass overwrite=True (--overwrite) to replace them")
        for name in names:
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out / name for name in names]


# What transformers' from_pretrained (5.24) adds to a tokenizer's settings about where it was read from; its
# save_pretrained writes them into tokenizer_config.json, where they describe a folder, not the tokenizer.
LOADING_STATE_KEYS = ("is_local", "local_files_only")


def without_loading_state(tokenizer: Any) -> Any:
    """`tokenizer` (changed in place) without the loading state of `LOADING_STATE_KEYS`, so that saving a loaded
    tokenizer writes the tokenizer_config.json of a freshly trained one."""
    for key in LOADING_STATE_KEYS:
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def _checked(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts: expected strings, found {type(text).__name__}")
        yield text
