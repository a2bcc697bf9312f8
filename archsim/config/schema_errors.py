"""Pydantic schema errors -> one-line input errors: walking a schema (the type at a dotted path,
its allowed keys, a description of what a value there may be) and explaining a validation
error in those words. The machine loader (config/load.py) and the workload loader
(workloads/model.py) share it; each names the file or option that supplied the value.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, NamedTuple, Sequence, Union

from pydantic import BaseModel, ValidationError

from archsim.config.schema import MAX_INT, FieldError


def unwrap(t):
    """Strip Annotated and Optional: the type a value at this place is validated against."""
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if len(args) != 1:
                return t
            t = args[0]
        else:
            return t


def is_model(t) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def literal_values(t) -> tuple | None:
    t = unwrap(t)
    return typing.get_args(t) if typing.get_origin(t) is typing.Literal else None


def child(t, seg):
    """The type one level down from ``t`` at key/index ``seg`` (None when unknown)."""
    t = unwrap(t)
    if is_model(t):
        f = t.model_fields.get(seg)
        return None if f is None else field_type(f)
    origin = typing.get_origin(t)
    if origin is dict:
        return typing.get_args(t)[1]
    if origin is tuple:
        args = typing.get_args(t)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        if isinstance(seg, int) and 0 <= seg < len(args):
            return args[seg]
    return None


def field_type(f):
    """A pydantic FieldInfo's annotation with its metadata put back (for constraint texts)."""
    if f.metadata:
        return typing.Annotated[(f.annotation, *f.metadata)]
    return f.annotation


def type_at(root, path: Sequence) -> Any:
    """The type at ``path`` below the model ``root`` (None when the path leaves the schema)."""
    t = root
    for seg in path:
        t = child(t, seg)
        if t is None:
            return None
    return t


def dotted(path: Sequence) -> str:
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            out += ("." if out else "") + str(seg)
    return out


def constraints(t) -> dict:
    """gt/ge/lt/le/min_length gathered from Annotated metadata along the way to the bare type."""
    out = {}
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            args = typing.get_args(t)
            for m in args[1:]:
                for attr in ("gt", "ge", "lt", "le", "min_length"):
                    v = getattr(m, attr, None)
                    if v is not None:
                        out.setdefault(attr, v)
                for sub in getattr(m, "metadata", ()) or ():
                    for attr in ("gt", "ge", "lt", "le", "min_length"):
                        v = getattr(sub, attr, None)
                        if v is not None:
                            out.setdefault(attr, v)
            t = args[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if len(args) != 1:
                return out
            t = args[0]
        else:
            return out


def describe(t) -> str:
    """'an integer > 0', 'a number >= 0', 'one of: lrr, gto', 'a mapping' ... for a type."""
    if t is None:
        return ""
    lits = literal_values(t)
    if lits is not None:
        return "one of: " + ", ".join(map(str, lits))
    bare = unwrap(t)
    c = constraints(t)
    rng = " ".join(f"{op} {c[k]}" for k, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
                   if k in c and not (k == "le" and c[k] == MAX_INT))   # the sanity cap: said where it is hit
    if bare is bool:
        return "true or false"
    if bare is int:
        return "an integer" + (f" {rng}" if rng else "")
    if bare is float:
        return "a number" + (f" {rng}" if rng else "")
    if bare is str:
        return "a non-empty string" if c.get("min_length") else "a string"
    if is_model(bare):
        return "a mapping with keys: " + ", ".join(bare.model_fields)
    origin = typing.get_origin(bare)
    if origin is dict:
        k, v = typing.get_args(bare)
        keys = literal_values(k)
        return "a mapping" + (f" of {', '.join(keys)}" if keys else "") + (f" to {describe(v)}" if describe(v) else "")
    if origin is tuple:
        args = typing.get_args(bare)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {describe(args[0])}".replace("a list of one of:", "a list, each one of:")
        return f"a list of {len(args)} items, each {describe(args[0])}"
    return ""


def known_keys(t, data: Any = None) -> list[str]:
    """Keys allowed one level below type ``t`` (model fields, Literal dict keys or existing keys)."""
    t = unwrap(t)
    if is_model(t):
        return list(t.model_fields)
    if typing.get_origin(t) is dict:
        keys = literal_values(typing.get_args(t)[0])
        if keys is not None:
            return list(keys)
        return list(data) if isinstance(data, dict) else []
    return []


def required_keys(t) -> list[str]:
    t = unwrap(t)
    return [k for k, f in t.model_fields.items() if f.is_required()] if is_model(t) else []


TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "dict_type": "a mapping",
    "model_type": "a mapping", "model_attributes_type": "a mapping", "tuple_type": "a list",
    "list_type": "a list", "finite_number": "a finite number",
}


def _r(v) -> str:
    """repr of an input value, a long one cut (a 5,000-digit number is not echoed whole)."""
    r = repr(v)
    return r if len(r) <= 80 else f"{r[:40]}... ({len(r)} characters)"


class Explained(NamedTuple):
    loc: tuple          # the field the error is about
    paths: list         # it and the fields it was checked against (for naming who set them)
    what: str
    allowed: str
    is_field_error: bool  # raised by a model's own check (schema.FieldError), not by a field's type


def explain(exc: ValidationError, root, full_path: bool = True) -> Explained:
    """The first error of a pydantic validation of model ``root``, in words. ``full_path``: a
    model's own check that names its field (``FieldError``) names it by its dotted path from
    ``root`` (the machine loader's wording) rather than as the check wrote it."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    typ = err["type"]
    ctx = err.get("ctx") or {}
    val = err.get("input")
    what, allowed, paths, is_field_error = None, "", [loc], False

    if typ == "value_error" and isinstance(ctx.get("error"), FieldError):
        fe = ctx["error"]

        base_loc = loc

        def below(p):  # a FieldError's dotted path, below the model that raised it
            return base_loc + tuple(int(s) if s.isdigit() else s for s in re.split(r"\.|\[|\]\.?", p) if s)
        loc = below(fe.path)
        paths = [loc] + [below(r) for r in fe.related]
        what, allowed, is_field_error = fe.what, fe.allowed, True
        if full_path and base_loc and what.startswith(fe.path + " "):   # name the field by its full path
            what = dotted(loc) + what[len(fe.path):]
    elif loc and loc[-1] == "[key]":
        loc = loc[:-1]
        key = loc[-1]
        keys = known_keys(type_at(root, loc[:-1]))
        what, allowed = f"unknown key {key!r}", "known keys: " + ", ".join(keys)
    elif typ == "extra_forbidden":
        parent = type_at(root, loc[:-1])
        what = f"unknown key {loc[-1]!r}"
        allowed = "known keys: " + ", ".join(known_keys(parent))
    elif typ == "missing" and loc and isinstance(loc[-1], int):
        loc = loc[:-1]
        what = f"too few items in {dotted(loc)}"
        allowed = describe(type_at(root, loc))
    elif typ == "missing":
        paths = [loc, loc[:-1]] if len(loc) > 1 else [loc]   # a --set that created the block via a sibling
        t = type_at(root, loc)
        kind = "block" if t is not None and is_model(unwrap(t)) else "key"
        what = f"missing required {kind} {loc[-1]!r}"
        here = f"in {dotted(loc[:-1])}" if len(loc) > 1 else "at the top level"
        allowed = f"required {here}: " + ", ".join(required_keys(type_at(root, loc[:-1])))
    elif typ in ("literal_error", "enum"):
        what = f"unknown value {_r(val)}"
        exp = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        allowed = "one of: " + ", ".join(exp) if exp else describe(type_at(root, loc))
    elif typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        what = f"value {_r(val)} out of range"
        allowed = describe(type_at(root, loc))
        if typ == "less_than_equal" and ctx.get("le") is not None and "<=" not in allowed:
            allowed += f", at most {ctx['le']}"
    elif typ in TYPE_WORDS:
        what = f"expected {TYPE_WORDS[typ]}, got {_r(val)}"
        allowed = describe(type_at(root, loc)) or TYPE_WORDS[typ]
    elif typ in ("too_short", "string_too_short"):
        what = f"{_r(val)} is empty" if not val else f"{_r(val)} is too short"
        allowed = describe(type_at(root, loc)) if typ == "string_too_short" else \
            f"at least {ctx.get('min_length', 1)} item(s)"
    elif typ == "too_long" or typ == "tuple_too_long":
        what = f"{_r(val)} is too long"
        allowed = describe(type_at(root, loc))
    else:
        what = f"{err['msg']}, got {_r(val)}"
        allowed = describe(type_at(root, loc))
    return Explained(loc, paths, what, allowed, is_field_error)


__all__ = ["Explained", "TYPE_WORDS", "child", "describe", "dotted", "explain", "is_model", "known_keys",
           "required_keys", "type_at", "unwrap"]
