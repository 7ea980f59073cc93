"""Read transformers-v4 Transformer-XL vocabularies (`vocab.pkl`, `vocab.bin`) without running anything they name.

v4's `TransfoXLTokenizer` loaded `vocab.pkl` with `pickle.load`, which imports and calls whatever the file names:
that is why transformers deprecated the model. Here `vocab.pkl` is read by `SafeUnpickler`, an allow-list
unpickler: the globals it resolves to real objects are only `dict`, `list`, `tuple`, `set`, `frozenset`, `str`,
`bytes`, `int`, `float`, `complex`, `bool`, `collections.Counter` and `collections.OrderedDict`. Any other global
(`sacremoses...`, `re._compile`, `os.system`, ...) becomes an inert `Opaque` record of its name and of the arguments
and state the file gave it: its module is never imported, and nothing it names is ever called. The fields this package
uses (`idx2sym` / `sym2idx`, `lower_case`, `delimiter`, `special`) must be plain data; if one of them holds an
`Opaque`, loading is refused with an error naming the global. The other fields of v4's pickled tokenizer `__dict__`
(Moses objects, compiled regexes, a `Trie`) are skipped.

`load_legacy_vocab` runs the unpickler in a separate process (`python -I -S`, standard library only) limited in
memory and CPU time, so that what a crafted file can push the pickle machine into (deep nesting that overflows the C
stack, huge allocations, long loops) ends as a `LegacyVocabError`, not as a crash or a hang of the caller.

`vocab.bin` (a `torch.save` of the plain dict) is read with `torch.load(weights_only=True)`, which has its own
allow-list; `collections.Counter` is added to it.
"""

from __future__ import annotations

import io
import json
import pickle
import reprlib
import subprocess
import sys
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LegacyVocab",
    "LegacyVocabError",
    "Opaque",
    "SafeUnpickler",
    "find_legacy_vocab_file",
    "load_legacy_vocab",
    "safe_load_pickle",
]

# The only globals rebuilt as real objects, keyed (module, name) as pickle writes them. All are immutable C types, so
# the BUILD opcode cannot change them for the process (`collections.Counter`, a Python class, is handed out as a fresh
# subclass per unpickler instead). `str`, `bytes` and `bytearray` are left out: a pickle never needs them as globals,
# and called from a pickle they reach the codec registry (imports) or allocate without bound (`bytearray(2**31)`).
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "complex"): complex,
    ("builtins", "bool"): bool,
    ("collections", "OrderedDict"): OrderedDict,
}
# Python 2 module names that protocol 0-2 pickles may use (find_class is called with them untranslated).
_PYTHON2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}
# Limits of the isolated process that reads a vocab.pkl: a hostile file can at worst exhaust these.
READER_MEMORY_BYTES = 4 * 2**30
READER_CPU_SECONDS = 120
# Pre-1.6 torch files start with a pickled magic number (protocol 2, LONG1 of 10 bytes).
_LEGACY_TORCH_PREFIX = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"

# Files this package reads, in the order v4 looked for them.
LEGACY_VOCAB_FILES = ("vocab.pkl", "vocab.bin")


class LegacyVocabError(ValueError):
    """A legacy vocabulary file is missing, unreadable, truncated, or needs something outside the allow-list."""


class Opaque:
    """Inert stand-in for a global outside the allow-list, and for anything the file built from it.

    It records the global's dotted name (`global_name`), the arguments the file passed to it (`args`) and the state
    it set on it (`state`), as plain data. It has no behaviour: building one calls nothing outside this class.
    """

    global_name: str = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        # NEWOBJ / NEWOBJ_EX call cls.__new__(cls, *args); REDUCE calls cls(*args). Both land here.
        instance = object.__new__(cls)
        instance.args = args
        instance.kwargs = kwargs
        instance.state = None
        instance.items = []
        return instance

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:  # BUILD
        self.state = state

    # APPEND(S) / SETITEM(S) on an object of a list or dict subclass outside the allow-list.
    def append(self, item: Any) -> None:
        self.items.append(item)

    def extend(self, items: Any) -> None:
        self.items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))

    def __repr__(self) -> str:
        return f"<Opaque {self.global_name}>"


def _opaque_class(module: str, name: str) -> type[Opaque]:
    return type(f"Opaque[{module}.{name}]", (Opaque,), {"global_name": f"{module}.{name}"})


class SafeUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only `_ALLOWED_GLOBALS`; every other global becomes an `Opaque` class.

    With `strict=True` any global outside the allow-list raises `LegacyVocabError` naming it instead. Persistent
    ids (torch storages and the like) are refused: a vocabulary holds none.
    """

    def __init__(self, file: Any, *, source: str = "<pickle>", strict: bool = False) -> None:
        super().__init__(file, fix_imports=True, encoding="utf-8", errors="strict")
        self.source = source
        self.strict = strict
        self.skipped_globals: set[str] = set()
        self._opaque_classes: dict[str, type[Opaque]] = {}
        self._counter: type[Counter] | None = None

    def find_class(self, module: str, name: str) -> Any:
        # NEVER import `module` or look `name` up: resolve from the table, or hand back an inert class.
        module = _PYTHON2_MODULES.get(module, module)
        if (module, name) == ("collections", "Counter"):
            if self._counter is None:  # a class of this unpickler's own: BUILD on it cannot touch collections.Counter
                self._counter = type("Counter", (Counter,), {})
            return self._counter
        allowed = _ALLOWED_GLOBALS.get((module, name))
        if allowed is not None:
            return allowed
        dotted = f"{module}.{name}"
        if self.strict:
            allowed_names = sorted([*(m + "." + n for m, n in _ALLOWED_GLOBALS), "collections.Counter"])
            raise LegacyVocabError(
                f"{self.source}: refusing to load the global {dotted!r}; only plain data "
                f"({', '.join(allowed_names)}) is allowed"
            )
        self.skipped_globals.add(dotted)
        if dotted not in self._opaque_classes:
            self._opaque_classes[dotted] = _opaque_class(module, name)
        return self._opaque_classes[dotted]

    def persistent_load(self, pid: Any) -> Any:
        raise LegacyVocabError(
            f"{self.source}: holds a persistent reference ({type(pid).__name__}); a vocabulary is plain data"
        )


def safe_load_pickle(data: bytes, *, source: str = "<pickle>", strict: bool = False) -> tuple[Any, set[str]]:
    """Unpickle `data` with `SafeUnpickler`; return the object and the dotted names of the globals made `Opaque`.

    This runs in the calling process: nothing outside the allow-list is imported or called, but a crafted file can
    still exhaust memory, loop or overflow the C stack. `load_legacy_vocab` reads files in an isolated, limited
    process for that reason; use it for files you did not make.

    Raises `LegacyVocabError` (naming `source`) for a truncated or corrupt pickle, and in strict mode for any global
    outside the allow-list.
    """
    unpickler = SafeUnpickler(io.BytesIO(data), source=source, strict=strict)
    try:
        obj = unpickler.load()
    except LegacyVocabError:
        raise
    except EOFError as error:
        raise LegacyVocabError(f"{source}: the pickle ends early (truncated file?)") from error
    except UnicodeDecodeError as error:  # a Python 2 pickle's byte strings are read as UTF-8, as v4 wrote its text
        raise LegacyVocabError(
            f"{source}: holds text that is not UTF-8 ({error}); vocabularies in another encoding (a Python 2 "
            "pickle of Latin-1 byte strings, say) are not supported: rebuild the vocabulary from the UTF-8 corpus"
        ) from error
    except Exception as error:  # any malformed opcode stream: UnpicklingError, ValueError, TypeError, ...
        raise LegacyVocabError(f"{source}: not a readable pickle ({type(error).__name__}: {error})") from error
    return obj, unpickler.skipped_globals


@dataclass
class LegacyVocab:
    """The parts of a v4 Transformer-XL vocabulary this package uses. `idx2sym[i]` is the symbol of id `i`."""

    idx2sym: list[str]
    lower_case: bool = False
    delimiter: str | None = None
    special: list[str] = field(default_factory=list)
    source: str = ""
    skipped_globals: list[str] = field(default_factory=list)

    @property
    def sym2idx(self) -> dict[str, int]:
        return {sym: idx for idx, sym in enumerate(self.idx2sym)}


def _find_opaque(value: Any, depth: int = 0) -> Opaque | None:
    """The first `Opaque` inside `value` (containers searched), or None if it is plain data."""
    if isinstance(value, Opaque):
        return value
    if isinstance(value, type) and issubclass(value, Opaque):  # the bare global (a function or class reference)
        return value  # type: ignore[return-value]
    if depth > 4:  # vocab fields are at most a mapping of strings to ints; deeper nesting is not ours
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _find_opaque(key, depth + 1) or _find_opaque(item, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            found = _find_opaque(item, depth + 1)
            if found is not None:
                return found
    return None


def _plain_field(fields: Mapping[str, Any], key: str, source: str) -> Any:
    value = fields[key]
    opaque = _find_opaque(value)
    if opaque is not None:
        raise LegacyVocabError(
            f"{source}: field {key!r} needs the global {opaque.global_name!r}, which is outside the allow-list of "
            "plain data; refusing to load it"
        )
    return value


def vocab_from_fields(
    fields: Any, *, source: str, skipped_globals: set[str] | None = None, overrides: Mapping[str, Any] | None = None
) -> LegacyVocab:
    """Validate the unpickled fields of a v4 vocabulary and return a `LegacyVocab`.

    `fields` must be a mapping with `idx2sym` (a list of distinct strings) or `sym2idx` (a mapping of strings to the
    ids 0..n-1). `overrides` (from `tokenizer_config.json`) take precedence for `lower_case` and `delimiter`, as in v4.
    """
    if isinstance(fields, Opaque):
        raise LegacyVocabError(
            f"{source}: the file's top-level object is built by the global {fields.global_name!r}, not a plain "
            "dict; refusing to load it"
        )
    if not isinstance(fields, Mapping):
        raise LegacyVocabError(f"{source}: expected a dict of vocabulary fields, found {type(fields).__name__}")
    if "idx2sym" in fields:
        idx2sym = _plain_field(fields, "idx2sym", source)
        if not isinstance(idx2sym, list | tuple) or not all(isinstance(sym, str) for sym in idx2sym):
            raise LegacyVocabError(f"{source}: field 'idx2sym' must be a list of strings")
        idx2sym = list(idx2sym)
    elif "sym2idx" in fields:
        sym2idx = _plain_field(fields, "sym2idx", source)
        if not isinstance(sym2idx, Mapping) or not all(
            isinstance(sym, str) and isinstance(idx, int) for sym, idx in sym2idx.items()
        ):
            raise LegacyVocabError(f"{source}: field 'sym2idx' must map strings to integer ids")
        if sorted(sym2idx.values()) != list(range(len(sym2idx))):
            raise LegacyVocabError(f"{source}: the ids of 'sym2idx' are not 0..{len(sym2idx) - 1}")
        idx2sym = sorted(sym2idx, key=sym2idx.__getitem__)
    else:
        found = sorted(reprlib.repr(key) for key in list(fields)[:50])[:12]
        raise LegacyVocabError(
            f"{source}: no 'idx2sym' or 'sym2idx' field (found {found}); not a Transformer-XL vocabulary"
        )
    if not idx2sym:
        raise LegacyVocabError(f"{source}: the vocabulary is empty")
    if len(set(idx2sym)) != len(idx2sym):
        duplicates = sorted(sym for sym, count in Counter(idx2sym).items() if count > 1)[:5]
        raise LegacyVocabError(f"{source}: 'idx2sym' lists a symbol twice ({duplicates})")

    settings: dict[str, Any] = {"lower_case": False, "delimiter": None, "special": []}
    for key in settings:
        if key in fields:
            settings[key] = _plain_field(fields, key, source)
    for key, value in (overrides or {}).items():
        if key in settings:
            settings[key] = value
    if not isinstance(settings["lower_case"], bool):
        raise LegacyVocabError(f"{source}: 'lower_case' must be a bool, found {settings['lower_case']!r}")
    if settings["delimiter"] is not None and not isinstance(settings["delimiter"], str):
        raise LegacyVocabError(f"{source}: 'delimiter' must be a string or None, found {settings['delimiter']!r}")
    special = settings["special"]
    if not isinstance(special, list | tuple) or not all(isinstance(sym, str) for sym in special):
        raise LegacyVocabError(f"{source}: 'special' must be a list of strings, found {special!r}")
    return LegacyVocab(
        idx2sym=idx2sym,
        lower_case=settings["lower_case"],
        delimiter=settings["delimiter"],
        special=list(special),
        source=source,
        skipped_globals=sorted(skipped_globals or ()),
    )


def _is_legacy_torch_file(data: bytes) -> bool:
    """True for torch's pre-1.6 format: a pickled magic number first (what v4 saw as "an integer")."""
    return data.startswith(_LEGACY_TORCH_PREFIX)


def _load_torch_file(path: Path) -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - torch is a dependency of the package
        raise LegacyVocabError(f"{path}: reading a torch-saved vocabulary needs torch") from error
    safe_globals = [Counter, OrderedDict]
    try:
        with torch.serialization.safe_globals(safe_globals):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        # torch's message starts with advice to retry with weights_only=False: keep only the line naming the cause.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        cause = next((line for line in lines if "GLOBAL" in line or "global" in line), lines[0] if lines else "")
        raise LegacyVocabError(
            f"{path}: could not be read with torch.load(weights_only=True), which accepts only plain data: "
            f"{type(error).__name__}: {cause}"
        ) from error


def load_legacy_vocab(path: str | Path, overrides: Mapping[str, Any] | None = None) -> LegacyVocab:
    """Read a v4 Transformer-XL vocabulary file: `vocab.pkl` (pickle) or `vocab.bin` (torch.save).

    A `vocab.pkl` that is really a torch file (v4 accepted both under either name) is read as one. Raises
    `LegacyVocabError` naming the file for a missing, truncated or corrupt file, a missing field, or a needed field
    outside the allow-list; nothing named in the file is imported or called.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise LegacyVocabError(f"{path}: cannot read the vocabulary file ({error})") from error
    if not data:
        raise LegacyVocabError(f"{path}: the vocabulary file is empty")
    if data[:4] == b"PK\x03\x04" and not zipfile.is_zipfile(io.BytesIO(data)):
        raise LegacyVocabError(f"{path}: a torch (zip) file whose end is missing or corrupt (truncated file?)")
    if zipfile.is_zipfile(io.BytesIO(data)) or _is_legacy_torch_file(data):
        fields, skipped = _load_torch_file(path), set()
    elif data[:1] != b"\x80" and data[:1] not in (b"(", b"}", b"]", b"c"):
        # pickle protocol 2+ starts with PROTO (0x80); protocol 0/1 dicts start with '(' '}' ']' or a GLOBAL 'c'.
        raise LegacyVocabError(f"{path}: not a pickle or torch file (starts with {data[:8]!r})")
    else:
        return _load_pickle_vocab_isolated(path, overrides)
    return vocab_from_fields(fields, source=str(path), skipped_globals=skipped, overrides=overrides)


def _load_pickle_vocab(path: str, overrides: Mapping[str, Any] | None) -> LegacyVocab:
    """In this process: unpickle `path` with `SafeUnpickler` and validate its fields."""
    fields, skipped = safe_load_pickle(Path(path).read_bytes(), source=path)
    return vocab_from_fields(fields, source=path, skipped_globals=skipped, overrides=overrides)


# Runs in the isolated reader: this file executed with the standard library only (python -I -S), answering JSON.
# The reader limits itself before reading anything (not a preexec_fn in the parent, which can deadlock the fork of a
# process that runs threads, as torch and tokenizers do); a limit above the inherited hard limit is lowered to it.
_READER = """
import json, runpy, sys
try:
    import resource
except ImportError:  # not POSIX: no limits
    resource = None
if resource is not None:
    for limit, value in ((resource.RLIMIT_AS, int(sys.argv[4])), (resource.RLIMIT_CPU, int(sys.argv[5]))):
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
module = runpy.run_path(sys.argv[1])
try:
    vocab = module["_load_pickle_vocab"](sys.argv[2], json.loads(sys.argv[3]))
    answer = {"vocab": {key: getattr(vocab, key) for key in ("idx2sym", "lower_case", "delimiter", "special",
                                                             "skipped_globals")}}
except module["LegacyVocabError"] as error:
    answer = {"error": str(error)}
except (RecursionError, MemoryError) as error:
    answer = {"error": sys.argv[2] + ": nested or sized beyond what a vocabulary needs (" + type(error).__name__ + ")"}
print(json.dumps(answer))
"""


def _load_pickle_vocab_isolated(path: Path, overrides: Mapping[str, Any] | None) -> LegacyVocab:
    """Read a pickled vocabulary in a separate process limited in memory and CPU time (POSIX).

    The allow-list already keeps the file from importing or calling anything; the process boundary also contains
    what the pickle machine itself can be pushed into by a crafted file (C-stack overflow on deep nesting, huge
    allocations, long loops): the caller gets a `LegacyVocabError`, not a crash or a hang.
    """
    limits = [str(READER_MEMORY_BYTES), str(READER_CPU_SECONDS)]
    command = [sys.executable, "-I", "-S", "-c", _READER, __file__, str(path), json.dumps(dict(overrides or {}))]
    try:
        result = subprocess.run(
            [*command, *limits], capture_output=True, text=True, timeout=2 * READER_CPU_SECONDS, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise LegacyVocabError(f"{path}: reading the vocabulary took over {2 * READER_CPU_SECONDS} s") from error
    if result.returncode != 0:
        reason = f"signal {-result.returncode}" if result.returncode < 0 else f"exit code {result.returncode}"
        detail = result.stderr.strip().splitlines()[-1:] or [""]
        raise LegacyVocabError(
            f"{path}: the isolated reader failed ({reason}) {detail[0]}; the file is malformed, hostile or needs more "
            f"than {READER_MEMORY_BYTES / 2**30:g} GiB of memory"
        )
    answer = json.loads(result.stdout)
    if "error" in answer:
        raise LegacyVocabError(answer["error"])
    return LegacyVocab(source=str(path), **answer["vocab"])


def find_legacy_vocab_file(folder: str | Path) -> Path | None:
    """The v4 vocabulary file in `folder` (`vocab.pkl`, else `vocab.bin`), or None."""
    folder = Path(folder)
    for name in LEGACY_VOCAB_FILES:
        if (folder / name).is_file():
            return folder / name
    return None
