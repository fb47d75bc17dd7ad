"""The strict raw JSON reader every carrier uses (SPEC §6.2).

Owns: decoding provider JSON without losing anything an inspector must see — duplicate keys
(every value kept), exact numbers (floats keep their lexical form), depth and size limits,
strict UTF-8, no lone surrogates, no NaN/Infinity — and the walk that yields every string,
key and number with its RFC 6901 path. The functions below are the reference; when the
native module (_jsonraw_native.c) is built, `loads`, `decode_units` (wire bytes),
`decode_shape` and `decode_texts` use it, with the same results (tests/test_jsonraw_native.py).
Must not: do I/O, or "repair" input. A parse failure raises `JsonError`; callers refuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, cast

from gateway import units
from gateway.units import Path, TextUnit
from gateway.vocab import ReasonCode


class JsonError(ValueError):
    """Input that must not be sent or released. `reason` is a content-free reason code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DupDict(dict[str, Any]):
    """A JSON object that had duplicate keys. The dict holds the last value (what most
    parsers keep); `shadowed` holds every earlier value so nothing escapes inspection."""

    __slots__ = ("shadowed",)

    def __init__(self, data: dict[str, Any], shadowed: list[tuple[str, Any]]) -> None:
        super().__init__(data)
        self.shadowed = shadowed


def without(obj: dict[str, Any], drop: frozenset[str] | set[str] | tuple[str, ...]) -> dict[str, Any]:
    """`obj` less the members named in `drop` (values read apart, or not text at all), for
    collecting units. An object that had duplicate keys stays a `DupDict` with every earlier
    value, dropped names included: a plain dict would lose what the duplicates shadowed, and
    the duplicate itself would go unreported."""
    kept = {k: v for k, v in obj.items() if k not in drop}
    return DupDict(kept, list(obj.shadowed)) if type(obj) is DupDict else kept


class JsonFloat(str):
    """A JSON number with a fraction or exponent, kept as its exact lexical form."""

    __slots__ = ()


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    last: dict[str, int] = {}
    for i, (key, _) in enumerate(pairs):
        last[key] = i
    shadowed = [(k, v) for i, (k, v) in enumerate(pairs) if last[k] != i]
    return DupDict(obj, shadowed)


def _refuse_constant(name: str) -> Any:
    raise JsonError(ReasonCode.JSON_INVALID)  # NaN, Infinity, -Infinity are not JSON


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs_hook, parse_float=JsonFloat, parse_constant=_refuse_constant)
# A \uD800-\uDFFF escape in the raw text: only then can a lone surrogate appear after decoding.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_TEXT = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def surrogates_ok(source: bytes | str, doc: Any) -> bool:
    """No lone surrogate decoded from a \\uD800-\\uDFFF escape in `source`."""
    escape = _SURROGATE_ESCAPE.search(source) if isinstance(source, bytes) else _SURROGATE_ESCAPE_TEXT.search(source)
    return not (escape and any(_SURROGATE.search(s) for _, s, _ in walk(doc)))


def loads_text(text: str, *, max_depth: int, check_depth: bool = True) -> Any:
    """Decode JSON text strictly; see `loads`."""
    try:
        doc = _DECODER.decode(text)
    except JsonError:
        raise
    except RecursionError:
        raise JsonError(ReasonCode.TOO_DEEP) from None
    except ValueError:  # JSONDecodeError, int digit limits, ...
        raise JsonError(ReasonCode.JSON_INVALID) from None
    if check_depth:
        check_shape(doc, max_depth)
    return doc


def loads(raw: bytes, *, max_depth: int, check_depth: bool = True) -> Any:
    """Decode a JSON document from exact wire bytes. Raises JsonError(reason).

    `check_depth=False` is for callers that `collect` the whole document right after
    (collect enforces the same limit in the same pass)."""
    if _native is not None and type(raw) is bytes:
        return _native.loads(raw, max_depth, check_depth)
    return loads_reference(raw, max_depth=max_depth, check_depth=check_depth)


def loads_reference(raw: bytes, *, max_depth: int, check_depth: bool = True) -> Any:
    """`loads` by the pure-Python reference reader."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonError(ReasonCode.JSON_INVALID) from None
    doc = loads_text(text, max_depth=max_depth, check_depth=check_depth)
    if not surrogates_ok(raw, doc):
        raise JsonError(ReasonCode.JSON_INVALID)
    return doc


def decode_shape(text: str, max_depth: int) -> tuple[Any, bool]:
    """Decode `text`, check depth; return the document and whether it had duplicate keys."""
    if _native is not None:
        shape = _native.decode_shape(text, max_depth)
        if shape is not NotImplemented:  # text holding a surrogate: the reference reads it
            return cast(tuple[Any, bool], shape)
    return decode_shape_reference(text, max_depth)


def decode_shape_reference(text: str, max_depth: int) -> tuple[Any, bool]:
    """`decode_shape` by the pure-Python reference reader."""
    doc = loads_text(text, max_depth=max_depth, check_depth=False)
    dups, _ = check_shape(doc, max_depth)
    return doc, dups


def decode_texts(text: str, max_depth: int) -> tuple[Any, list[str], bool]:
    """Decode `text`; return the document, its strings/keys/numbers and whether it had
    duplicate keys (every value of a duplicate included)."""
    if _native is not None:
        decoded = _native.decode_texts(text, max_depth)
        if decoded is not NotImplemented:  # text holding a surrogate: the reference reads it
            return cast(tuple[Any, list[str], bool], decoded)
    return decode_texts_reference(text, max_depth)


def decode_texts_reference(text: str, max_depth: int) -> tuple[Any, list[str], bool]:
    """`decode_texts` by the pure-Python reference reader."""
    doc = loads_text(text, max_depth=max_depth, check_depth=False)
    texts, dups, _ = collect_texts(doc, max_depth)
    return doc, texts, dups


def decode_units(raw: bytes | str, base: Path, max_depth: int) -> tuple[Any, list[TextUnit], list[Path]]:
    """Decode a complete document (wire bytes: strict UTF-8; no lone surrogates) and
    collect its units; duplicate keys keep every value and are reported by path."""
    if _native is not None and type(raw) is bytes:
        return cast(tuple[Any, list[TextUnit], list[Path]], _native.decode_units(raw, base, max_depth))
    return decode_units_reference(raw, base, max_depth)


def decode_units_reference(raw: bytes | str, base: Path, max_depth: int) -> tuple[Any, list[TextUnit], list[Path]]:
    """`decode_units` by the pure-Python reference reader."""
    if isinstance(raw, str):
        doc = loads_text(raw, max_depth=max_depth, check_depth=False)
        if not surrogates_ok(raw, doc):
            raise JsonError(ReasonCode.JSON_INVALID)
    else:
        doc = loads_reference(raw, max_depth=max_depth, check_depth=False)
    items, dups, _ = collect(doc, base, max_depth)
    return doc, items, dups


def check_shape(doc: Any, max_depth: int) -> tuple[bool, int]:
    """Walk the containers only: raise JsonError(too_deep) past `max_depth`; return
    whether any object had duplicate keys, and how many keys the objects hold."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    dups = False
    keys = 0
    while stack:
        node, depth = stack.pop()
        cls = type(node)
        if cls is dict or cls is DupDict:
            children: Any = node.values()
            keys += len(node)
            if cls is DupDict:
                dups = True
                stack.extend((v, depth + 1) for _, v in node.shadowed if isinstance(v, (dict, list)))
        elif cls is list:
            children = node
        else:
            continue
        if depth > max_depth:
            raise JsonError(ReasonCode.TOO_DEEP)
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return dups, keys


KIND_STRING, KIND_KEY, KIND_NUMBER = units.KIND_STRING, units.KIND_KEY, units.KIND_NUMBER


def walk(doc: Any, base: Path = ()) -> Iterator[tuple[Path, str, str]]:
    """Yield (path, text, kind) for every string value, object key and number lexical form
    anywhere in `doc`, including values shadowed by duplicate keys. For a key, `path` is the
    path of the object holding it."""
    stack: list[tuple[Path, Any]] = [(base, doc)]
    while stack:
        path, node = stack.pop()
        cls = type(node)
        if cls is str:
            yield path, node, KIND_STRING
        elif cls is dict or cls is DupDict:
            for key, value in node.items():
                yield path, key, KIND_KEY
                stack.append(((*path, key), value))
            if cls is DupDict:
                for key, value in node.shadowed:
                    stack.append(((*path, key), value))
        elif cls is list:
            stack.extend(((*path, i), v) for i, v in enumerate(node))
        elif cls is JsonFloat or cls is int:
            yield path, str(node), KIND_NUMBER


def collect(doc: Any, base: Path, max_depth: int) -> tuple[list[TextUnit], list[Path], int]:
    """One pass over `doc`, in document order: a unit for everything `walk` yields (each
    distinct key text once, where it first appears), the paths of objects with duplicate
    keys, the number of keys held, and the depth limit (JsonError(too_deep)).

    Document order matters: the engine reads the string units in order, joined, to find a
    configured value split across them. A container whose children are all scalars emits
    them directly; one that holds containers pushes its children (reversed) on the stack."""
    items: list[TextUnit] = []
    dups: list[Path] = []
    keys = 0
    seen_keys: set[str] = set()
    append = items.append
    new = tuple.__new__
    unit = TextUnit
    s_kind, k_kind, n_kind = KIND_STRING, KIND_KEY, KIND_NUMBER
    stack: list[tuple[Path, Any, int]] = [(base, doc, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        path, node, depth = pop()
        cls = type(node)
        if cls is str:
            append(new(unit, (path, node, s_kind)))
        elif cls is dict or cls is DupDict:
            if depth > max_depth:
                raise JsonError(ReasonCode.TOO_DEEP)
            keys += len(node)
            nested = False
            for key, value in node.items():
                if key not in seen_keys:  # a key text is inspected once, where it first appears
                    seen_keys.add(key)
                    append(new(unit, (path, key, k_kind)))
                vcls = type(value)
                if vcls is dict or vcls is list or vcls is DupDict:
                    nested = True
            if nested or cls is DupDict:
                if cls is DupDict:
                    dups.append(path)
                    for key, value in reversed(node.shadowed):
                        push(((*path, key), value, depth + 1))
                for key, value in reversed(node.items()):
                    push(((*path, key), value, depth + 1))
            else:
                for key, value in node.items():
                    vcls = type(value)
                    if vcls is str:
                        append(new(unit, ((*path, key), value, s_kind)))
                    elif vcls is int or vcls is JsonFloat:
                        append(new(unit, ((*path, key), str(value), n_kind)))
        elif cls is list:
            if depth > max_depth:
                raise JsonError(ReasonCode.TOO_DEEP)
            nested = False
            for value in node:
                vcls = type(value)
                if vcls is dict or vcls is list or vcls is DupDict:
                    nested = True
                    break
            if nested:
                for i in range(len(node) - 1, -1, -1):
                    push(((*path, i), node[i], depth + 1))
            else:
                for i, value in enumerate(node):
                    vcls = type(value)
                    if vcls is str:
                        append(new(unit, ((*path, i), value, s_kind)))
                    elif vcls is int or vcls is JsonFloat:
                        append(new(unit, ((*path, i), str(value), n_kind)))
        elif cls is JsonFloat or cls is int:
            append(new(unit, (path, str(node), n_kind)))
    return items, dups, keys


def collect_texts(doc: Any, max_depth: int) -> tuple[list[str], bool, int]:
    """Every string, key and number lexical form in `doc` (no paths), whether any object
    had duplicate keys, and the number of keys held; the depth limit applies. For JSON held
    inside a string, whose parts all carry the path of that string anyway."""
    texts: list[str] = []
    append = texts.append
    dups = False
    keys = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        cls = type(node)
        if cls is str:
            append(node)
        elif cls is dict or cls is DupDict:
            if depth > max_depth:
                raise JsonError(ReasonCode.TOO_DEEP)
            keys += len(node)
            for key, value in node.items():
                append(key)
                push((value, depth + 1))
            if cls is DupDict:
                dups = True
                for _, value in node.shadowed:
                    push((value, depth + 1))
        elif cls is list:
            if depth > max_depth:
                raise JsonError(ReasonCode.TOO_DEEP)
            for value in node:
                vcls = type(value)
                if vcls is str:
                    append(value)
                elif vcls is int:
                    append(str(value))
                elif vcls is not bool and value is not None:
                    push((value, depth + 1))
        elif cls is JsonFloat or cls is int:
            append(str(node))
    return texts, dups, keys


def is_str(value: Any) -> bool:
    """A real JSON string (not a number kept as its lexical form)."""
    return type(value) is str


# --- the native path ------------------------------------------------------------------
# gateway/carriers/_jsonraw_native.c, built by the package's install (setup.py; optional:
# without a C compiler the install succeeds and the reference reader above is used). It
# gives the same results as the reference for wire bytes and for text (which is the
# specification; tests/test_jsonraw_native.py checks them against each other).
_native: Any = None
try:
    from gateway.carriers import _jsonraw_native
except ImportError:  # pragma: no cover - a machine without a C compiler
    NATIVE_AVAILABLE = False
else:
    _jsonraw_native.configure(
        JsonError,
        DupDict,
        JsonFloat,
        TextUnit,
        ReasonCode.JSON_INVALID,
        ReasonCode.TOO_DEEP,
        KIND_STRING,
        KIND_KEY,
        KIND_NUMBER,
    )
    NATIVE_AVAILABLE = True
    _native = _jsonraw_native


def native() -> Any:
    """The native module when it is in use (sse.parse_all uses it too), else None."""
    return _native


def use_native(enabled: bool) -> None:
    """Choose the native path (when it is built) or the reference reader (benchmarks and
    tests compare them)."""
    global _native
    _native = _jsonraw_native if enabled and NATIVE_AVAILABLE else None
