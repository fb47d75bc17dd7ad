# The native path of gateway.carriers.jsonraw (_jsonraw_native.c); see jsonraw.py.
from typing import Any

def configure(
    json_error: type[Exception],
    dup_dict: type[dict[str, Any]],
    json_float: type[str],
    text_unit: type[tuple[Any, ...]],
    json_invalid: str,
    too_deep: str,
    kind_string: str,
    kind_key: str,
    kind_number: str,
    /,
) -> None: ...
def decode_units(raw: bytes, base: tuple[str | int, ...], max_depth: int, /) -> tuple[Any, list[Any], list[Any]]: ...
def loads(raw: bytes, max_depth: int, check_depth: bool, /) -> Any: ...
def decode_shape(text: str, max_depth: int, /) -> Any: ...
def decode_texts(text: str, max_depth: int, /) -> Any: ...
def sse_parse_all(data: bytes, event_cls: type[Any], /) -> tuple[list[Any], bool]: ...
