"""JSON text for the documents archsim writes: indented for a person, except that a list of
plain numbers (or strings) stays on one line, so a timeline matrix is one line per window
instead of one line per value.

The text is ``json.dumps(obj, indent=2)`` with every list of scalars (numbers, null, true, false,
strings holding no quote or bracket) joined onto one line; it is built in one pass, the flat lists
by the C encoder, since the indenting encoder is pure Python and slow on large records."""

from __future__ import annotations

import json
import math

_flat_list = json.JSONEncoder(separators=(", ", ": ")).encode
_scalar = json.JSONEncoder().encode


def _key(k) -> str:
    """A dict key as json.dumps writes it (a string; numbers, booleans and None converted)."""
    if isinstance(k, str):
        return _scalar(k)
    if isinstance(k, bool) or k is None:
        return _scalar(_scalar(k))
    if isinstance(k, float):
        return _scalar(float.__repr__(k))
    return _scalar(str(k))


def _flat(items) -> bool:
    """Whether a list stays on one line: every item a finite number, null, a boolean or a string
    without quotes or brackets."""
    for x in items:
        if x is None or isinstance(x, (bool, int)):
            continue
        if isinstance(x, float):
            if math.isnan(x) or math.isinf(x):
                return False
            continue
        if isinstance(x, str) and not any(c in x for c in '"[]{}'):
            continue
        return False
    return True


def _emit(obj, ind: str, out: list) -> None:
    if isinstance(obj, dict):
        if not obj:
            out.append("{}")
            return
        inner = ind + "  "
        sep = "{\n"
        for k, v in obj.items():
            out.append(sep + inner + _key(k) + ": ")
            sep = ",\n"
            _emit(v, inner, out)
        out.append("\n" + ind + "}")
    elif isinstance(obj, (list, tuple)):
        if not obj:
            out.append("[]")
            return
        if _flat(obj):
            out.append(_flat_list(list(obj)))
            return
        inner = ind + "  "
        sep = "[\n"
        for v in obj:
            out.append(sep + inner)
            sep = ",\n"
            _emit(v, inner, out)
        out.append("\n" + ind + "]")
    else:
        out.append(_scalar(obj))


def dumps(obj) -> str:
    out: list = []
    _emit(obj, "", out)
    return "".join(out)
