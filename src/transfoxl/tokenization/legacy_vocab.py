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

`vocab.bin` (a `torch.save` of the plain dict) is read with `torch.load(weights_only=True)`, which has its own
allow-list; `collections.Counter` is added to it.
"""

from __future__ import annotations

import io
import pickle
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

# The only globals rebuilt as real objects. Keys are (module, name) exactly as pickle writes them; protocol 0-2
# pickles of Python 2 origin write "__builtin__", which pickle's own fix_imports maps to "builtins" before find_class.
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "str"): str,
    ("builtins", "bytes"): bytes,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "complex"): complex,
    ("builtins", "bool"): bool,
    ("collections", "Counter"): Counter,
    ("collections", "OrderedDict"): OrderedDict,
}

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

    def find_class(self, module: str, name: str) -> Any:
        # NEVER import `module` or look `name` up: resolve from the table, or hand back an inert class.
        allowed = _ALLOWED_GLOBALS.get((module, name))
        if allowed is not None:
            return allowed
        dotted = f"{module}.{name}"
        if self.strict:
            raise LegacyVocabError(
                f"{self.source}: refusing to load the global {dotted!r}; only plain data "
                f"({', '.join(sorted(m + '.' + n for m, n in _ALLOWED_GLOBALS))}) is allowed"
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
        raise LegacyVocabError(
            f"{source}: no 'idx2sym' or 'sym2idx' field (found {sorted(map(str, fields))[:12]}); "
            "not a Transformer-XL vocabulary"
        )
    if not idx2sym:
        raise LegacyVocabError(f"{source}: the vocabulary is empty")
    if len(set(idx2sym)) != len(idx2sym):
        duplicates = sorted({sym for sym in idx2sym if idx2sym.count(sym) > 1})[:5]
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
    try:
        first, _ = safe_load_pickle(data[:64], source="", strict=True)
    except LegacyVocabError:
        return False
    return first == 0x1950A86A20F9469CFC6C


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
        fields, skipped = safe_load_pickle(data, source=str(path))
    return vocab_from_fields(fields, source=str(path), skipped_globals=skipped, overrides=overrides)


def find_legacy_vocab_file(folder: str | Path) -> Path | None:
    """The v4 vocabulary file in `folder` (`vocab.pkl`, else `vocab.bin`), or None."""
    folder = Path(folder)
    for name in LEGACY_VOCAB_FILES:
        if (folder / name).is_file():
            return folder / name
    return None
