"""JSON without importing json: the host agent starts for every connection, and json (which imports re and
enum) would double its start-up. `json_loads`/`json_dumps` are json's own C functions (`_json`) with json's
defaults; `json_pretty` indents for files people read.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def _json_codec() -> tuple[Callable[[str | bytes], Any], Callable[[Any], str]]:
    """json.loads and json.dumps (with their defaults) made from the C functions behind them (`_json`), without
    importing json; json itself where `_json` is missing."""
    try:
        import _json
    except ImportError:
        import json

        return json.loads, json.dumps

    class Context:
        strict, object_hook, object_pairs_hook = True, None, None
        parse_float, parse_int, parse_constant = float, int, float

    scan = _json.make_scanner(Context())  # type: ignore[arg-type]  # it reads these attributes

    def not_serializable(obj: Any) -> Any:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    encode = _json.make_encoder(None, not_serializable, _json.encode_basestring_ascii, None, ": ", ", ",
                                False, False, True)

    def loads(text: str | bytes) -> Any:
        if isinstance(text, (bytes, bytearray)):
            text = text.decode()
        text = text.strip(" \t\n\r")
        try:
            obj, end = scan(text, 0)
        except StopIteration as stop:
            raise ValueError(f"not JSON (at character {stop.value})") from None
        if end != len(text):
            raise ValueError(f"not JSON: extra data at character {end}")
        return obj

    def dumps(obj: Any) -> str:
        return "".join(encode(obj, 0))

    return loads, dumps


json_loads, json_dumps = _json_codec()


def json_pretty(obj: Any, level: int = 0) -> str:
    """`json.dumps(obj, indent=2, sort_keys=True)` for string-keyed data, without importing json (it imports re:
    7 ms of a host agent's CPU): files people read, such as state.json."""
    if not obj or not isinstance(obj, (dict, list, tuple)):
        return json_dumps(obj)
    pad = "  " * (level + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json_dumps(k)}: {json_pretty(v, level + 1) if v and isinstance(v, _NESTED) else json_dumps(v)}"
                 for k, v in sorted(obj.items())]
        opening, closing = "{", "}"
    else:
        items = [pad + (json_pretty(v, level + 1) if v and isinstance(v, _NESTED) else json_dumps(v)) for v in obj]
        opening, closing = "[", "]"
    return opening + "\n" + ",\n".join(items) + "\n" + "  " * level + closing


_NESTED = (dict, list, tuple)
