"""Legacy (transformers-v4) Transformer-XL vocabularies: safe loading, AutoTokenizer, and parity with v4's ids; and
vocabulary and tokenizer files that are broken or hostile (malicious vocab.pkl / vocab.bin through every loader,
broken tokenizer.json / tokenizer_config.json, missing files), each a row of docs/reliability-table.md (area "files").

The reference (`tests/fixtures/tokenizer/reference.json`) was recorded with transformers 4.37.2 by
`tools/make_tokenizer_fixtures.py`; nothing here imports transformers v4.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
import sys
from collections import Counter, OrderedDict
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.utils import SYSTEM, RunsCommand, named, refused, reliability, v4_tokenizer_folder
from transfoxl import TxlForCausalLM  # registers the configs
from transfoxl.tokenization import (
    LegacyVocabError,
    TransfoXLTokenizerFast,
    build_word_level_tokenizer,
    load_legacy_vocab,
    register_tokenizers,
    safe_load_pickle,
    tokenizer_from_legacy_vocab,
)

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text(encoding="utf-8"))
IDX2SYM = REFERENCE["idx2sym"]
FOLDERS = ("v4_folder", "v4_vocab_only", "hub_dict", "torch_bin")
VOCAB_FILES = ("v4_folder/vocab.pkl", "hub_dict/vocab.pkl", "torch_bin/vocab.bin")

register_tokenizers()

# Raw text where this tokenizer does not reproduce v4's Moses pipeline: text -> our words (v4's are in the fixture).
RAW_DIFFERENCES = {
    # A clitic standing alone (WikiText's own convention) stays one word; Moses split the apostrophe off.
    "it 's the team 's game": ["it", "'s", "the", "team", "'s", "game"],
    # Moses keeps a final period when the next word starts in lower case (a context rule across words).
    "the game. and then it sold": ["the", "game", ".", "and", "then", "it", "sold"],
    # Moses splits only before the first inner apostrophe.
    "rock'n'roll": ["rock", "'n", "'roll"],
    # Every newline ends a line with <eos>, as the corpora were encoded; v4's tokenize dropped newlines.
    "line one\nline two": ["line", "one", "<eos>", "line", "two"],
}


def _words(tokenizer, text: str) -> list[str]:
    backend = tokenizer.backend_tokenizer
    return [word for word, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))]


# ------------------------------------------------------------------------------------------------ safe loading


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_vocab_files_give_v4_idx2sym(name: str) -> None:
    vocab = load_legacy_vocab(FIXTURES / name)
    assert vocab.idx2sym == IDX2SYM
    assert vocab.lower_case is False
    assert vocab.delimiter is None
    assert vocab.special == ["<eos>", "<unk>", "<formula>"]


def test_v4_pickle_skips_foreign_objects_without_importing_them() -> None:
    vocab = load_legacy_vocab(FIXTURES / "v4_folder" / "vocab.pkl")
    # v4's pickled __dict__ names these; none of them is resolved, and sacremoses is not even installed here.
    assert "sacremoses.tokenize.MosesTokenizer" in vocab.skipped_globals
    assert "re._compile" in vocab.skipped_globals
    assert "tokenizers.AddedToken" in vocab.skipped_globals
    assert "sacremoses" not in sys.modules


def test_hub_dict_needs_nothing_outside_the_allow_list() -> None:
    fields, skipped = safe_load_pickle((FIXTURES / "hub_dict" / "vocab.pkl").read_bytes(), strict=True)
    assert skipped == set()
    assert fields["idx2sym"] == IDX2SYM
    assert isinstance(fields["sym2idx"], OrderedDict)


def test_sym2idx_alone_is_enough(tmp_path: Path) -> None:
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps({"sym2idx": OrderedDict((sym, i) for i, sym in enumerate(IDX2SYM))}))
    assert load_legacy_vocab(path).idx2sym == IDX2SYM


# ------------------------------------------------------------------------------------------------ malicious files


class _StartsProcess:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (subprocess.Popen, (["touch", str(self.path)],))


def _malicious_payloads(marker: Path) -> dict[str, object]:
    command = f"touch {marker}"
    return {
        "top_level": RunsCommand(command),
        "in_idx2sym": {"idx2sym": RunsCommand(command), "lower_case": False},
        "in_a_symbol": {"idx2sym": ["<eos>", _StartsProcess(marker)]},
        "in_lower_case": {"idx2sym": ["<eos>", "<unk>"], "lower_case": _StartsProcess(marker)},
    }


def test_the_payload_is_live_under_plain_pickle(tmp_path: Path) -> None:
    """Control: `pickle.loads` (what v4 did) really runs the command, so the refusals below mean something."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(RunsCommand(f"touch {marker}")))
    assert marker.exists()


@pytest.mark.parametrize("case", ["top_level", "in_idx2sym", "in_a_symbol", "in_lower_case"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path, case: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(_malicious_payloads(marker)[case]))
    with pytest.raises(LegacyVocabError, match=r"(posix|nt)\.system|subprocess\.Popen") as error:
        load_legacy_vocab(path)
    assert str(path) in str(error.value)
    assert not marker.exists()


def test_malicious_object_in_an_unused_field_is_skipped_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps({"idx2sym": IDX2SYM, "moses_tokenizer": RunsCommand(f"touch {marker}")}))
    vocab = load_legacy_vocab(path)
    assert vocab.idx2sym == IDX2SYM
    assert any(name.endswith(".system") for name in vocab.skipped_globals)
    assert not marker.exists()


def test_malicious_folder_through_auto_tokenizer(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    shutil.copy(FIXTURES / "v4_vocab_only" / "config.json", tmp_path / "config.json")
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(RunsCommand(f"touch {marker}")))
    with pytest.raises(LegacyVocabError, match=r"\.system"):
        AutoTokenizer.from_pretrained(tmp_path)
    assert not marker.exists()


def test_strict_mode_refuses_any_foreign_global() -> None:
    with pytest.raises(LegacyVocabError, match=r"re\._compile"):
        safe_load_pickle((FIXTURES / "v4_folder" / "vocab.pkl").read_bytes(), strict=True)


def test_named_modules_are_never_imported() -> None:
    # `this` prints the Zen of Python when imported: a module with a visible side effect that nothing else loads.
    assert "this" not in sys.modules
    data = b"\x80\x02cthis\nrot13\nq\x00X\x01\x00\x00\x00aq\x01\x85q\x02Rq\x03."
    obj, skipped = safe_load_pickle(data)
    assert skipped == {"this.rot13"}
    assert "this" not in sys.modules
    assert type(obj).global_name == "this.rot13"


# ------------------------------------------------------------------------------------------------ broken files


@pytest.mark.parametrize("name", ["v4_folder/vocab.pkl", "hub_dict/vocab.pkl"])
def test_truncated_pickle_gives_a_clear_error(tmp_path: Path, name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    path = tmp_path / "vocab.pkl"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LegacyVocabError, match=r"vocab\.pkl: .*(truncated|not a readable pickle)"):
        load_legacy_vocab(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"this is not a pickle", "not a pickle or torch file"),
        (b"\x80\x04\x95\xff\xff\x00\x00\x00\x00\x00\x00\xde\xad\xbe\xef", "readable pickle|truncated"),
        (pickle.dumps({"vocab": ["a"]}), "no 'idx2sym' or 'sym2idx'"),
        (pickle.dumps(["a", "b"]), "expected a dict"),
        (pickle.dumps({"idx2sym": ["a", "a"]}), "lists a symbol twice"),
        (pickle.dumps({"idx2sym": ["a", 3]}), "list of strings"),
        (pickle.dumps({"idx2sym": []}), "empty"),
        (pickle.dumps({"sym2idx": {"a": 0, "b": 5}}), "not 0..1"),
        (pickle.dumps({"idx2sym": ["a"], "lower_case": "yes"}), "'lower_case' must be a bool"),
    ],
)
def test_corrupt_pickle_gives_a_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "vocab.pkl"
    path.write_bytes(content)
    with pytest.raises(LegacyVocabError, match=message):
        load_legacy_vocab(path)


def test_missing_file_gives_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LegacyVocabError, match="cannot read"):
        load_legacy_vocab(tmp_path / "vocab.pkl")
    with pytest.raises(LegacyVocabError, match=r"no vocab\.pkl or vocab\.bin"):
        tokenizer_from_legacy_vocab(tmp_path)


def test_truncated_torch_file_gives_a_clear_error(tmp_path: Path) -> None:
    data = (FIXTURES / "torch_bin" / "vocab.bin").read_bytes()
    path = tmp_path / "vocab.bin"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LegacyVocabError, match=r"vocab\.bin: .*truncated"):
        load_legacy_vocab(path)
    # A zip whose central directory is intact but whose pickle is damaged: torch.load's own error, named.
    damaged = bytearray(data)
    start = damaged.index(b"data.pkl") + 40
    damaged[start : start + 16] = b"\xff" * 16
    path.write_bytes(bytes(damaged))
    with pytest.raises(LegacyVocabError, match=r"vocab\.bin"):
        load_legacy_vocab(path)


def test_torch_file_with_foreign_object_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "vocab.bin"
    torch.save({"idx2sym": IDX2SYM, "x": RunsCommand(f"touch {marker}")}, path)
    with pytest.raises(LegacyVocabError, match=r"weights_only=True.*(posix|nt)\.system"):
        load_legacy_vocab(path)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------ AutoTokenizer


@pytest.mark.parametrize("folder", FOLDERS)
def test_auto_tokenizer_gives_v4_ids_on_pretokenized_text(folder: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / folder)
    reference = REFERENCE["references"]["v4_vocab_only"]
    eos_id = reference["eos_id"]
    assert tokenizer.convert_ids_to_tokens(list(range(len(IDX2SYM)))) == IDX2SYM
    corpus_style = tokenizer_from_legacy_vocab(FIXTURES / folder, add_eos=True)
    for case in reference["pretokenized"]:
        # v4 ids of the whitespace-split line, with or without special tokens: v4's encode appended nothing either
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
        assert tokenizer.encode(case["text"], add_special_tokens=False) == case["ids"], case["text"]
        # the original corpora appended <eos> to every line: add_eos=True does it with add_special_tokens
        assert corpus_style.encode(case["text"]) == [*case["ids"], eos_id], case["text"]
        assert corpus_style.encode(case["text"], add_special_tokens=False) == case["ids"], case["text"]


def test_a_v4_folder_takes_transformers_tokenizer_arguments() -> None:
    """padding_side, pad_token, model_max_length... apply to a converted v4 vocabulary as to a loaded tokenizer.json
    (they were dropped silently: batches for generate() came out padded on the right)."""
    tokenizer = AutoTokenizer.from_pretrained(
        FIXTURES / "v4_vocab_only", padding_side="left", pad_token="<eos>", model_max_length=8, truncation_side="left"
    )
    assert (tokenizer.padding_side, tokenizer.pad_token, tokenizer.model_max_length) == ("left", "<eos>", 8)
    batch = tokenizer(["the", "the the the"], padding=True).input_ids
    eos, the = tokenizer.convert_tokens_to_ids(["<eos>", "the"])
    assert batch == [[eos, eos, the], [the, the, the]]
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only").get_vocab()


def test_a_v4_never_split_that_is_not_carried_over_is_said(tmp_path: Path, caplog) -> None:
    """v4 kept the words of `never_split` whole; the converted tokenizer splits them like any other text (to <unk>
    pieces where the vocabulary lacks them): said at conversion, with what keeps a word whole."""
    shutil.copytree(FIXTURES / "v4_folder", tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["never_split"] = ["C++", "<unk>"]  # (a special token needs no note)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with caplog.at_level("WARNING"):
        AutoTokenizer.from_pretrained(tmp_path)
    assert "v4's never_split ['C++'] is not carried over" in caplog.text and "add_tokens" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        AutoTokenizer.from_pretrained(FIXTURES / "v4_folder")
    assert "never_split" not in caplog.text


def test_v4_folder_with_tokenizer_config_matches_vocab_only() -> None:
    with_config = AutoTokenizer.from_pretrained(FIXTURES / "v4_folder")
    vocab_only = AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only")
    assert with_config.get_vocab() == vocab_only.get_vocab()


@pytest.mark.parametrize("broken", ["cutoffs_omitted", "attn_type_2"])
def test_auto_tokenizer_does_not_need_a_valid_model_config(tmp_path: Path, caplog, broken: str) -> None:
    """A v4 config.json that fails validation: without `cutoffs`, v4's WikiText-103 defaults [20000, 40000, 200000]
    apply and do not fit vocab_size=111; or an attention type that is not implemented. The tokenizer needs none of
    it. transformers' AutoTokenizer swallows the config's ValueError and used to fall back to a generic tokenizer that
    failed with "Couldn't instantiate the backend tokenizer ... sentencepiece or tiktoken"."""
    shutil.copy(FIXTURES / "v4_vocab_only" / "vocab.pkl", tmp_path)
    config = json.loads((FIXTURES / "v4_vocab_only" / "config.json").read_text())
    if broken == "cutoffs_omitted":
        del config["cutoffs"]
        problem = r"`cutoffs` must lie strictly between 0 and vocab_size=111, got \[20000, 40000, 200000\]"
    else:
        config["attn_type"] = 2
        problem = r"attn_type=2 is not supported"
    (tmp_path / "config.json").write_text(json.dumps(config))

    with caplog.at_level("WARNING"):
        tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only").get_vocab()
    reference = REFERENCE["references"]["v4_vocab_only"]["pretokenized"][0]
    assert tokenizer.encode(reference["text"], add_special_tokens=False) == reference["ids"]
    assert re.search(rf"config\.json.*{problem}.*the tokenizer does not need it", caplog.text), caplog.text

    # The model config is still refused, with its own message, wherever a model or a config is asked for.
    for load in (AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained, TxlForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match=problem):
            load(tmp_path)


# --- hostile pickles beyond imports (found in review): the reader must stay contained ------------------------------


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "vocab.pkl"
    path.write_bytes(data)
    return path


def test_build_on_an_allowed_class_cannot_change_it_for_the_process(tmp_path: Path) -> None:
    # BUILD on collections.Counter itself would set attributes on the class for everyone.
    data = b"\x80\x02ccollections\nCounter\nN}X\x0b\x00\x00\x00most_commonccollections\nOrderedDict\ns\x86b0}"
    data += b"X\x07\x00\x00\x00idx2sym]X\x01\x00\x00\x00aas."
    assert load_legacy_vocab(write(tmp_path, data)).idx2sym == ["a"]
    assert safe_load_pickle(data)[0]["idx2sym"] == ["a"]  # in this very process, too
    assert Counter("aab").most_common(1) == [("a", 2)]


def test_deep_nesting_is_contained(tmp_path: Path) -> None:
    # A tuple nested 10**6 deep used as a dict key overflows the C stack of the process hashing it.
    data = b"\x80\x04})" + b"\x85" * 10**6 + b"K\x01s."
    with pytest.raises(LegacyVocabError, match=r"vocab\.pkl: (the isolated reader failed|nested or sized beyond)"):
        load_legacy_vocab(write(tmp_path, data))


@pytest.mark.parametrize(
    ("data", "global_name"),
    [
        (b"\x80\x04cbuiltins\nbytearray\nJ\x00\x00\x00\x80\x85R.", "builtins.bytearray"),  # 2 GiB for 31 bytes
        (b"\x80\x04cbuiltins\nstr\nC\x03abcX\x04\x00\x00\x00idna\x86R.", "builtins.str"),  # a codec import
    ],
)
def test_allocating_or_codec_reaching_globals_are_not_resolved(data: bytes, global_name: str) -> None:
    with pytest.raises(LegacyVocabError, match=f"refusing to load the global '{global_name}'"):
        safe_load_pickle(data, strict=True)
    obj, skipped = safe_load_pickle(data)  # lenient mode: an inert placeholder, nothing allocated or imported
    assert skipped == {global_name} and not isinstance(obj, (str, bytes, bytearray))


def test_python2_builtin_names_are_understood(tmp_path: Path) -> None:
    data = pickle.dumps({"idx2sym": ["a", "b"], "special": frozenset()}, protocol=2).replace(
        b"builtins", b"__builtin__"
    )
    assert b"__builtin__" in data
    fields, skipped = safe_load_pickle(data, strict=True)
    assert fields["special"] == frozenset() and not skipped


def test_missing_special_tokens_get_v4s_ids() -> None:
    tokenizer = build_word_level_tokenizer(["the", "game", "a"], additional_special_tokens=["<formula>"])
    assert [tokenizer.convert_tokens_to_ids(token) for token in ("<eos>", "<unk>", "<formula>")] == [3, 4, 5]


def test_v4_moses_pipeline_mangled_pretokenized_text() -> None:
    """Why the parity reference for pre-tokenized text is the vocabulary lookup of the split line (see fixtures)."""
    case = REFERENCE["references"]["v4_vocab_only"]["pretokenized"][1]
    assert "@-@" in case["text"].split()
    assert "@-@" not in case["v4_tokenize"]  # v4's tokenize() turned "@-@" into "@ - @"
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only")
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode(case["text"], add_special_tokens=False)) == (
        case["text"].split()
    )


def test_unknown_words_map_to_unk() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only")
    unk_id = IDX2SYM.index("<unk>")
    assert tokenizer.unk_token == "<unk>"
    assert tokenizer.encode("zebra quokka the", add_special_tokens=False) == [unk_id, unk_id, IDX2SYM.index("the")]


def test_special_tokens_are_split_out_of_text() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_folder")
    ids = tokenizer.encode("the<unk>game<eos>", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == ["the", "<unk>", "game", "<eos>"]
    assert tokenizer.eos_token_id == IDX2SYM.index("<eos>")
    assert "<formula>" in tokenizer.all_special_tokens


@pytest.mark.parametrize(("reference_name", "lower_case"), [("v4_folder", False), ("v4_folder_lower_case", True)])
def test_raw_text_matches_v4_or_the_documented_difference(reference_name: str, lower_case: bool) -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_folder", lower_case=lower_case)
    for case in REFERENCE["references"][reference_name]["raw"]:
        ids = tokenizer.encode(case["text"], add_special_tokens=False)
        if case["text"] in RAW_DIFFERENCES:
            assert ids != case["ids"] or _words(tokenizer, case["text"]) != case["tokens"], case["text"]
            assert _words(tokenizer, case["text"]) == RAW_DIFFERENCES[case["text"]], case["text"]
        else:
            assert ids == case["ids"], case["text"]
            assert _words(tokenizer, case["text"]) == case["tokens"], case["text"]
    assert set(RAW_DIFFERENCES) <= {case["text"] for case in REFERENCE["references"][reference_name]["raw"]}


def test_without_eos_per_line_multi_line_text_matches_v4() -> None:
    tokenizer = tokenizer_from_legacy_vocab(FIXTURES / "v4_folder", eos_per_line=False)
    case = next(c for c in REFERENCE["references"]["v4_folder"]["raw"] if "\n" in c["text"])
    assert tokenizer.encode(case["text"], add_special_tokens=False) == case["ids"]


def test_lines_end_with_eos_like_the_corpora() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only")
    eos = IDX2SYM.index("<eos>")
    the, game = IDX2SYM.index("the"), IDX2SYM.index("game")
    # v4's encode_file: every line (empty ones too) gets one <eos>: each newline is one.
    assert tokenizer.encode("the game\n\nthe\n") == [the, game, eos, eos, the, eos]
    # A text without a final newline ends without <eos>: a prompt is not a finished line (v4's encode, GPT-2's too)
    assert tokenizer.encode("the game") == [the, game]
    corpus_style = tokenizer_from_legacy_vocab(FIXTURES / "v4_vocab_only", add_eos=True)
    assert corpus_style.encode("the game") == [the, game, eos]  # each line encoded alone, as the corpora were


def test_decode_reverses_wikitext_conventions() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only")
    text = "It sold 1 @,@ 000 copies and 3 @.@ 14 million , a role @-@ playing game ."
    ids = tokenizer.encode(text + "\nthe game")
    assert tokenizer.decode(ids, skip_special_tokens=True) == (
        "It sold 1,000 copies and 3.14 million , a role-playing game . the game"
    )
    assert tokenizer.decode(ids) == "It sold 1,000 copies and 3.14 million , a role-playing game .\nthe game"
    # Decoding then encoding again gives the same ids: the raw-text rules re-split what the decoder joined.
    assert tokenizer.encode(tokenizer.decode(ids)) == ids
    # A separator at a line end: the newline stays one (it came back as `role-<eos> game`, a literal <eos>).
    ids = tokenizer.encode("a role @-@\ngame @,@\nthe")
    assert tokenizer.decode(ids) == "a role @-@\ngame @,@\nthe" and tokenizer.encode(tokenizer.decode(ids)) == ids


def test_decode_differs_from_v4_moses_detokenizer() -> None:
    """v4 ran Moses' detokenizer (no space before punctuation) and left @-@ alone; here words keep their spaces."""
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_folder")
    case = next(c for c in REFERENCE["references"]["v4_folder"]["raw"] if c["text"].startswith("He said"))
    assert case["decoded"] == 'He said "it was the game" and <unk>.'
    assert tokenizer.decode(case["ids"]) == 'He said " it was the game " and <unk> .'


def test_saved_folder_loads_with_plain_transformers(tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "v4_vocab_only")
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    text = "It sold 1,000 copies of the role-playing game.\nThe <unk> zebra"
    code = (
        "import json, sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "assert 'transfoxl' not in sys.modules; "
        "print(json.dumps([t.encode(sys.argv[2]), t.decode(t.encode(sys.argv[2]))]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), text], capture_output=True, text=True, check=True, timeout=120
    )
    ids, decoded = json.loads(result.stdout.strip().splitlines()[-1])
    assert ids == tokenizer.encode(text)
    assert decoded == tokenizer.decode(tokenizer.encode(text))


def test_auto_tokenizer_prefers_tokenizer_json(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "v4_vocab_only", tmp_path / "folder")
    folder = tmp_path / "folder"
    build_word_level_tokenizer(["<eos>", "<unk>", "x"]).save_pretrained(folder)
    (folder / "tokenizer_config.json").unlink()  # only config.json (transfo-xl), tokenizer.json and vocab.pkl
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == 3


# ------------------------------------------------------------------------------------------------ reliability rows
# Hostile or broken vocabulary and tokenizer files (area "files" of the table): each is refused with an error naming
# the file and the problem, and nothing in it runs.

VOCAB_LOADERS = {
    "AutoTokenizer": lambda folder: AutoTokenizer.from_pretrained(folder),
    "TransfoXLTokenizerFast": lambda folder: TransfoXLTokenizerFast.from_pretrained(folder),
    "tokenizer_from_legacy_vocab": lambda folder: tokenizer_from_legacy_vocab(folder),
}


@pytest.mark.parametrize("loader", list(VOCAB_LOADERS))
@pytest.mark.parametrize(
    ("vocab_name", "detail"),
    [
        pytest.param(
            "vocab.pkl",
            rf"field 'idx2sym' needs the global {SYSTEM}, which is outside the allow-list",
            id="vocab.pkl",
            marks=reliability(
                "malicious v4 vocab.pkl (os.system payload in idx2sym)",
                "LegacyVocabError naming the file and the global; never unpickled with pickle.load; no sentinel",
            ),
        ),
        pytest.param(
            "vocab.bin",
            rf"could not be read with torch\.load\(weights_only=True\).*{SYSTEM[1:-1]}",
            id="vocab.bin",
            marks=reliability(
                "malicious v4 vocab.bin (torch.save with an os.system payload)",
                "LegacyVocabError naming the file and the global; no sentinel",
            ),
        ),
    ],
)
def test_malicious_vocabulary_is_refused_and_never_runs(
    tmp_path: Path, sentinel: Path, record_property, vocab_name: str, detail: str, loader: str
) -> None:
    path = v4_tokenizer_folder(tmp_path / "v4", vocab_name, sentinel)
    refused(
        record_property, LegacyVocabError, rf"{named(path)}: {detail}", lambda: VOCAB_LOADERS[loader](tmp_path / "v4")
    )
    assert not sentinel.exists()


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer saved as this package saves one (tokenizer.json + tokenizer_config.json)."""
    folder = tmp_path_factory.mktemp("tokenizer") / "tok"
    tokenizer_from_legacy_vocab(FIXTURES / "v4_folder").save_pretrained(folder)
    return folder


def _broken_json(text: str, case: str) -> bytes:
    if case == "truncated":
        return text[: len(text) // 2].encode()
    if case == "zero_bytes":
        return b""
    if case == "latin1":  # a symbol with an accent, as a Latin-1 editor would write it
        return text.replace('"<unk>"', '"<unk\u00e9>"').encode("latin-1", errors="replace")
    if case == "utf16":
        return text.encode("utf-16")
    return b'{"model": 3}'  # valid JSON, not a tokenizer


TOKENIZER_CASES = [
    (
        "tokenizer.json",
        "truncated",
        r"not valid JSON .*: the file is truncated \(it ends early\)",
        "tokenizer.json truncated",
    ),
    ("tokenizer.json", "zero_bytes", r"the file is empty \(0 bytes\)", "tokenizer.json of 0 bytes"),
    ("tokenizer.json", "latin1", r"not UTF-8 text .*Latin-1", "tokenizer.json written in Latin-1"),
    ("tokenizer.json", "utf16", r"not UTF-8 text .*UTF-16", "tokenizer.json written in UTF-16"),
    (
        "tokenizer.json",
        "wrong_schema",
        r"valid JSON, but not a tokenizer that the tokenizers library can load",
        "tokenizer.json valid JSON, not a tokenizer",
    ),
    (
        "tokenizer_config.json",
        "truncated",
        r"not valid JSON .*: the file is truncated",
        "tokenizer_config.json truncated",
    ),
    ("tokenizer_config.json", "latin1", r"not UTF-8 text", "tokenizer_config.json written in Latin-1"),
]


@pytest.mark.parametrize(
    ("name", "case", "detail"),
    [
        pytest.param(
            name,
            case,
            detail,
            id=f"{name}-{case}",
            marks=reliability(
                f"{what} (TransfoXLTokenizerFast.from_pretrained)",
                "OSError naming the file and the problem; the library's error kept as the cause",
            ),
        )
        for name, case, detail, what in TOKENIZER_CASES
    ],
)
def test_broken_tokenizer_files_are_named(
    saved_tokenizer: Path, tmp_path: Path, record_property, name: str, case: str, detail: str
) -> None:
    folder = tmp_path / "tok"
    shutil.copytree(saved_tokenizer, folder)
    (folder / name).write_bytes(_broken_json((folder / name).read_text(encoding="utf-8"), case))
    error = refused(
        record_property,
        OSError,
        rf"{named(folder / name)}: {detail}",
        lambda: TransfoXLTokenizerFast.from_pretrained(folder),
    )
    assert error.__cause__ is not None


@reliability(
    "tokenizer.json truncated, loaded with AutoTokenizer from a folder this package saved",
    "known gap: transformers' own JSONDecodeError, without the file name (tokenizer_config.json names "
    "TokenizersBackend, so AutoTokenizer never calls this package)",
)
def test_truncated_tokenizer_json_through_auto_tokenizer_is_transformers_error(
    saved_tokenizer: Path, tmp_path: Path, record_property
) -> None:
    folder = tmp_path / "tok"
    shutil.copytree(saved_tokenizer, folder)
    text = (folder / "tokenizer.json").read_text(encoding="utf-8")
    (folder / "tokenizer.json").write_text(text[: len(text) // 2], encoding="utf-8")
    refused(
        record_property, json.JSONDecodeError, r"line \d+ column \d+", lambda: AutoTokenizer.from_pretrained(folder)
    )


@reliability(
    "v4 vocab.pkl holding Latin-1 byte strings (a Python 2 pickle)",
    "LegacyVocabError naming the file: text not UTF-8, encoding not supported",
)
def test_vocab_pkl_in_another_encoding_is_named(tmp_path: Path, record_property) -> None:
    shutil.copy(FIXTURES / "v4_vocab_only" / "config.json", tmp_path / "config.json")
    # Protocol 0 as Python 2 wrote it: S'...' is a byte string, here "café" in Latin-1.
    (tmp_path / "vocab.pkl").write_bytes(b"(dp0\nS'idx2sym'\np1\n(lp2\nS'caf\xe9'\np3\naS'<unk>'\np4\nas.")
    refused(
        record_property,
        LegacyVocabError,
        rf"{named(tmp_path / 'vocab.pkl')}: holds text that is not UTF-8 .*not supported",
        lambda: AutoTokenizer.from_pretrained(tmp_path),
    )


@reliability(
    "v4 vocab.pkl whose reading exceeds the isolated reader's memory limit (lowered to 8 MiB here)",
    "LegacyVocabError naming the file: the isolated reader failed (MemoryError); the calling process is unharmed",
)
def test_vocab_reader_memory_limit_holds(tmp_path: Path, monkeypatch, record_property) -> None:
    from transfoxl.tokenization import legacy_vocab

    monkeypatch.setattr(legacy_vocab, "READER_MEMORY_BYTES", 8 * 2**20)
    shutil.copy(FIXTURES / "v4_vocab_only" / "vocab.pkl", tmp_path / "vocab.pkl")
    refused(
        record_property,
        LegacyVocabError,
        rf"{named(tmp_path / 'vocab.pkl')}: the isolated reader failed \(exit code 1\) MemoryError",
        lambda: legacy_vocab.load_legacy_vocab(tmp_path / "vocab.pkl"),
    )


@reliability("truncated v4 vocab.pkl through AutoTokenizer", "LegacyVocabError naming the file as truncated")
def test_truncated_vocab_pkl_through_auto_tokenizer(tmp_path: Path, record_property) -> None:
    shutil.copy(FIXTURES / "v4_vocab_only" / "config.json", tmp_path / "config.json")
    data = (FIXTURES / "v4_vocab_only" / "vocab.pkl").read_bytes()
    (tmp_path / "vocab.pkl").write_bytes(data[: len(data) // 2])
    refused(
        record_property,
        LegacyVocabError,
        rf"{named(tmp_path / 'vocab.pkl')}: .*(truncated|not a readable pickle)",
        lambda: AutoTokenizer.from_pretrained(tmp_path),
    )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            "nowhere",
            id="nonexistent",
            marks=reliability(
                "tokenizer path that does not exist (TransfoXLTokenizerFast)", "OSError: no such folder"
            ),
        ),
        pytest.param(
            "empty",
            id="no_tokenizer_files",
            marks=reliability(
                "tokenizer folder without tokenizer files", "OSError naming the folder and the files looked for"
            ),
        ),
    ],
)
def test_missing_tokenizer_files(tmp_path: Path, record_property, case: str) -> None:
    folder = tmp_path / case
    if case == "empty":
        folder.mkdir()
        shutil.copy(FIXTURES / "v4_vocab_only" / "config.json", folder / "config.json")
    detail = "no such folder" if case == "nowhere" else r"no tokenizer\.json, vocab\.pkl or vocab\.bin"
    refused(
        record_property, OSError, rf"{named(folder)}: {detail}", lambda: TransfoXLTokenizerFast.from_pretrained(folder)
    )
