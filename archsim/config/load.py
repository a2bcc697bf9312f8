"""YAML + overlays + ``--set`` -> one frozen, validated ``Machine``.

Order: the machine file, then each overlay in order (deep merge: mappings merge key by key, any
other value replaces, ``null`` removes the key so an optional block becomes absent), then each
``--set a.b.c=value`` in order (value parsed as a YAML scalar or flow value; the path must name a
schema field). Every problem becomes one ``InputError`` naming the file (or ``--set``/``--overlay``
option) that supplied the bad value, the dotted field and what is allowed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Sequence, Union

import yaml
from pydantic import BaseModel, ValidationError

from archsim.errors import InputError
from archsim.paths import data_dir

from .schema import MAX_INT, FieldError, Machine

# ---- finding files ----------------------------------------------------------------------------

def builtin_machines() -> list[str]:
    """Names of the machine files shipped in configs/ (e.g. a100, h100, sw26010pro, ...)."""
    return sorted(p.stem for p in data_dir("configs").glob("*.yaml"))


def builtin_overlays() -> list[str]:
    d = data_dir("configs") / "overlays"
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _resolve(arg: str, where: str, kind: str, folder: Path, names: list[str]) -> Path:
    arg = str(arg)
    stem = arg[:-5] if arg.endswith(".yaml") else arg
    if "/" not in arg and stem in names:
        return folder / f"{stem}.yaml"
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    allowed = "a path to a YAML file or one of: " + ", ".join(names)
    if p.is_dir():
        raise InputError(where, f"{arg!r} is a directory, not a {kind} file", allowed)
    if p.exists():  # a FIFO, a device (/dev/null), a socket: nothing a file of settings comes from
        raise InputError(where, f"{arg!r} is not a regular file", allowed)
    if "/" in arg or arg.endswith((".yaml", ".yml")):
        raise InputError(where, f"{kind} file not found: {arg!r}", allowed)
    raise InputError(where, f"unknown {kind} {arg!r}", allowed)


def resolve_hw(hw: str) -> Path:
    """A machine file: a path to a YAML file, or a built-in name found in configs/."""
    return _resolve(hw, "--hw", "machine", data_dir("configs"), builtin_machines())


def resolve_overlay(overlay: str) -> Path:
    """An overlay file: a path, or a built-in name found in configs/overlays/ (e.g. l2-off)."""
    return _resolve(overlay, "--overlay", "overlay", data_dir("configs") / "overlays", builtin_overlays())


def _label(arg: str, path: Path) -> str:
    """How messages name a file: its file name for a built-in, the path as given otherwise."""
    builtin_dirs = (data_dir("configs"), data_dir("configs") / "overlays")
    return path.name if "/" not in str(arg) and path.parent in builtin_dirs else str(arg)


# ---- reading YAML -----------------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """safe_load that refuses duplicate keys (YAML would silently keep the last one)."""


class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The same on libyaml's parser (about ten times faster). A file it refuses is parsed again
    with _Loader, so every error message is the pure-Python parser's, whichever is installed."""


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class NestedTooDeep(yaml.YAMLError):
    """A document nested deeper than the parser's recursion can follow (a yaml error for callers)."""

    problem = "nested too deeply to read (hundreds of levels)"
    problem_mark = None


class ExpandsTooFar(yaml.YAMLError):
    """A document whose aliases expand it beyond MAX_VALUES values (an "anchor bomb")."""

    problem = "its aliases (*name) expand it to more than 1,000,000 values"
    problem_mark = None


MAX_VALUES = 1_000_000   # values a document may hold with every alias expanded (inputs here hold thousands)


def _expanded_values_exceed(data, limit: int) -> bool:
    """Whether ``data``, with every shared (aliased) node counted each time it is reached, holds
    more than ``limit`` values; stops counting at the limit."""
    n = 0
    stack = [data]
    while stack:
        x = stack.pop()
        n += 1
        if n > limit:
            return True
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


def load_yaml_text(text: str):
    """YAML text -> Python data, duplicate keys refused; the errors are yaml's, as _Loader raises them
    (a document nested beyond the recursion limit: NestedTooDeep; one whose aliases expand it
    beyond MAX_VALUES values: ExpandsTooFar)."""
    try:
        try:
            data = yaml.load(text, Loader=_FastLoader)
        except yaml.YAMLError:
            data = yaml.load(text, Loader=_Loader)   # raises again, with the pure-Python parser's message
    except RecursionError:
        raise NestedTooDeep(NestedTooDeep.problem) from None
    if "*" in text and _expanded_values_exceed(data, MAX_VALUES):
        raise ExpandsTooFar(ExpandsTooFar.problem)
    return data


def read_yaml(path: Union[str, Path], label: str | None = None) -> dict:
    """Parse one YAML file into a dict; syntax errors become ``InputError('<file>:<line>', ...)``."""
    label = label or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(label, f"cannot read file: {e.strerror or e}", "a readable YAML file") from None
    except UnicodeDecodeError as e:
        raise InputError(label, f"not UTF-8 text (byte {e.start})", "a YAML text file") from None
    try:
        data = load_yaml_text(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{label}:{mark.line + 1}" if mark is not None else label
        problem = e.problem or e.context or "invalid YAML"
        col = f" at column {mark.column + 1}" if mark is not None else ""
        raise InputError(where, f"YAML syntax error{col}: {problem}", "valid YAML") from None
    except (NestedTooDeep, ExpandsTooFar) as e:
        raise InputError(label, e.problem, "a YAML document of ordinary size") from None
    except yaml.YAMLError as e:
        raise InputError(label, f"YAML syntax error: {e}", "valid YAML") from None
    if not isinstance(data, dict):
        raise InputError(label, f"expected a mapping of keys at the top level, got {type(data).__name__}",
                         "a YAML mapping such as `name: ...`")
    return data


# ---- merging ----------------------------------------------------------------------------------

def deep_merge(base: Any, over: Any) -> Any:
    """``over`` applied on ``base``: mappings merge recursively, other values replace, and a
    ``None`` value in a mapping removes the key. Returns new containers; inputs are untouched."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _leaf_paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.extend(_leaf_paths(v, prefix + (k,)))
        else:
            out.append(prefix + (k,))
    return out


# ---- walking the schema -----------------------------------------------------------------------

def _unwrap(t):
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


def _is_model(t) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _literal_values(t) -> tuple | None:
    t = _unwrap(t)
    return typing.get_args(t) if typing.get_origin(t) is typing.Literal else None


def _child(t, seg):
    """The type one level down from ``t`` at key/index ``seg`` (None when unknown)."""
    t = _unwrap(t)
    if _is_model(t):
        f = t.model_fields.get(seg)
        return None if f is None else _field_type(f)
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


def _field_type(f):
    """A pydantic FieldInfo's annotation with its metadata put back (for constraint texts)."""
    if f.metadata:
        return typing.Annotated[(f.annotation, *f.metadata)]
    return f.annotation


def _type_at(path: Sequence) -> Any:
    t = Machine
    for seg in path:
        t = _child(t, seg)
        if t is None:
            return None
    return t


def _dotted(path: Sequence) -> str:
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            out += ("." if out else "") + str(seg)
    return out


def _constraints(t) -> dict:
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


def _describe(t) -> str:
    """'an integer > 0', 'a number >= 0', 'one of: lrr, gto', 'a mapping' ... for a type."""
    if t is None:
        return ""
    lits = _literal_values(t)
    if lits is not None:
        return "one of: " + ", ".join(map(str, lits))
    bare = _unwrap(t)
    c = _constraints(t)
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
    if _is_model(bare):
        return "a mapping with keys: " + ", ".join(bare.model_fields)
    origin = typing.get_origin(bare)
    if origin is dict:
        k, v = typing.get_args(bare)
        keys = _literal_values(k)
        return "a mapping" + (f" of {', '.join(keys)}" if keys else "") + (f" to {_describe(v)}" if _describe(v) else "")
    if origin is tuple:
        args = typing.get_args(bare)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0])}".replace("a list of one of:", "a list, each one of:")
        return f"a list of {len(args)} items, each {_describe(args[0])}"
    return ""


def _known_keys(t, data: Any = None) -> list[str]:
    """Keys allowed one level below type ``t`` (model fields, Literal dict keys or existing keys)."""
    t = _unwrap(t)
    if _is_model(t):
        return list(t.model_fields)
    if typing.get_origin(t) is dict:
        keys = _literal_values(typing.get_args(t)[0])
        if keys is not None:
            return list(keys)
        return list(data) if isinstance(data, dict) else []
    return []


def _required_keys(t) -> list[str]:
    t = _unwrap(t)
    return [k for k, f in t.model_fields.items() if f.is_required()] if _is_model(t) else []


def get_value(m: Machine, dotted: str) -> Any:
    """The value at a dotted config path of a resolved Machine (``get_value(m, "dram.channels")``)."""
    cur: Any = m
    for seg in dotted.split("."):
        if isinstance(cur, BaseModel):
            cur = getattr(cur, seg)
        elif isinstance(cur, dict):
            cur = cur[seg]
        else:
            raise KeyError(dotted)
    return cur


# ---- --set ------------------------------------------------------------------------------------

_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)$")


def parse_set(item: str) -> tuple[tuple, Any, str]:
    """``'a.b.c=value'`` -> (('a','b','c'), parsed value, 'a.b.c')."""
    item = str(item)
    if "=" not in item:
        raise InputError(f"--set {item}", "expected PATH=VALUE", "e.g. --set dram.channel_gbps=200")
    dotted, raw = item.split("=", 1)
    dotted = dotted.strip()
    path = tuple(dotted.split("."))
    if not dotted or any(not seg for seg in path):
        raise InputError(f"--set {item}", f"bad config path {dotted!r}", "dotted keys such as l2.size_kib")
    try:
        value = load_yaml_text(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        shown = raw if len(raw) <= 60 else raw[:50] + f"... ({len(raw):,} characters)"
        raise InputError(f"--set {dotted}", f"cannot parse value {shown!r}: {problem}",
                         "a YAML scalar or flow value, e.g. 4, 1.5, true, lrr, [4, 4, 4], {f32: 16}") from None
    t = _type_at(path)
    bare = _unwrap(t) if t is not None else None
    if bare is str and value is not None and not isinstance(value, str) and not isinstance(value, (dict, list)):
        value = raw.strip()                                  # name=123 means the string "123"
    elif bare in (float, int) and isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        value = float(value)                                 # YAML 1.1 reads 1e3 as a string
        if bare is int and value.is_integer():
            value = int(value)
    return path, value, dotted


def _check_set_path(path: tuple, dotted: str, data: dict) -> None:
    t: Any = Machine
    cur: Any = data
    for i, seg in enumerate(path):
        here = _dotted(path[:i]) or "the top level"
        bare = _unwrap(t)
        if _is_model(bare) or typing.get_origin(bare) is dict:
            keys = _known_keys(bare, cur)
            if seg not in keys:
                raise InputError(f"--set {dotted}", f"unknown key {seg!r} in {here}",
                                 "known keys: " + (", ".join(keys) if keys else "none"))
            t = _child(bare, seg)
            cur = cur.get(seg) if isinstance(cur, dict) else None
        else:
            raise InputError(f"--set {dotted}", f"{_dotted(path[:i])} is a value, not a block",
                             f"set {_dotted(path[:i])} itself")


def apply_set(data: dict, path: tuple, value: Any) -> dict:
    """A copy of ``data`` with ``value`` at ``path`` (intermediate blocks created; None removes)."""
    if len(path) == 1:
        out = dict(data)
        if value is None:
            out.pop(path[0], None)
        else:
            out[path[0]] = copy.deepcopy(value)
        return out
    head = data.get(path[0])
    out = dict(data)
    out[path[0]] = apply_set(head if isinstance(head, dict) else {}, path[1:], value)
    return out


# ---- validation errors -> one line ------------------------------------------------------------

def _origin(paths: Sequence[tuple], origins: list[tuple[tuple, str]], base: str) -> tuple[str, tuple]:
    """The source that last wrote any of ``paths`` (or a block containing one), and which of
    ``paths`` it wrote; the base file and ``paths[0]`` when no overlay or --set touched them."""
    for opath, label in reversed(origins):
        for p in paths:
            sp = tuple(s for s in p if isinstance(s, str))
            n = min(len(sp), len(opath))
            if sp[:n] == opath[:n]:
                return label, p
    return base, paths[0]


_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "dict_type": "a mapping",
    "model_type": "a mapping", "model_attributes_type": "a mapping", "tuple_type": "a list",
    "list_type": "a list", "finite_number": "a finite number",
}


def _convert(exc: ValidationError, origins: list, base: str) -> InputError:
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    typ = err["type"]
    ctx = err.get("ctx") or {}
    val = err.get("input")
    what, allowed, paths, is_field_error = None, "", [loc], False

    if typ == "value_error" and isinstance(ctx.get("error"), FieldError):
        fe = ctx["error"]

        base_loc = loc

        def _abs(p):
            return base_loc + tuple(int(s) if s.isdigit() else s for s in re.split(r"\.|\[|\]\.?", p) if s)
        loc = _abs(fe.path)
        paths = [loc] + [_abs(r) for r in fe.related]
        what, allowed, is_field_error = fe.what, fe.allowed, True
        if base_loc and what.startswith(fe.path + " "):       # name the field by its full path
            what = _dotted(loc) + what[len(fe.path):]
    elif loc and loc[-1] == "[key]":
        loc = loc[:-1]
        key = loc[-1]
        keys = _known_keys(_type_at(loc[:-1]))
        what, allowed = f"unknown key {key!r}", "known keys: " + ", ".join(keys)
    elif typ == "extra_forbidden":
        parent = _type_at(loc[:-1])
        what = f"unknown key {loc[-1]!r}"
        allowed = "known keys: " + ", ".join(_known_keys(parent))
    elif typ == "missing" and loc and isinstance(loc[-1], int):
        loc = loc[:-1]
        what = f"too few items in {_dotted(loc)}"
        allowed = _describe(_type_at(loc))
    elif typ == "missing":
        paths = [loc, loc[:-1]] if len(loc) > 1 else [loc]   # a --set that created the block via a sibling
        t = _type_at(loc)
        kind = "block" if t is not None and _is_model(_unwrap(t)) else "key"
        what = f"missing required {kind} {loc[-1]!r}"
        here = f"in {_dotted(loc[:-1])}" if len(loc) > 1 else "at the top level"
        allowed = f"required {here}: " + ", ".join(_required_keys(_type_at(loc[:-1])))
    elif typ in ("literal_error", "enum"):
        what = f"unknown value {val!r}"
        exp = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        allowed = "one of: " + ", ".join(exp) if exp else _describe(_type_at(loc))
    elif typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        what = f"value {val!r} out of range"
        allowed = _describe(_type_at(loc))
        if typ == "less_than_equal" and ctx.get("le") == MAX_INT:
            allowed += f", at most {MAX_INT}"
    elif typ in _TYPE_WORDS:
        what = f"expected {_TYPE_WORDS[typ]}, got {val!r}"
        allowed = _describe(_type_at(loc)) or _TYPE_WORDS[typ]
    elif typ == "too_short":
        what = f"{val!r} is empty" if not val else f"{val!r} is too short"
        allowed = f"at least {ctx.get('min_length', 1)} item(s)"
    elif typ == "too_long" or typ == "tuple_too_long":
        what = f"{val!r} is too long"
        allowed = _describe(_type_at(loc))
    else:
        what = f"{err['msg']}, got {val!r}"
        allowed = _describe(_type_at(loc))

    label, blamed = _origin(paths, origins, base)
    if is_field_error:
        loc = blamed                  # name the related field the user actually changed
    dotted = _dotted(loc)
    if label.startswith("--set "):
        if not is_field_error and dotted and dotted != label[len("--set "):]:
            what = f"{dotted}: {what}"
        return InputError(label, what, allowed)
    return InputError(f"{label}: {dotted}" if dotted else label, what, allowed)


def validate_machine(data: dict, label: str = "<config>", origins: Sequence = ()) -> Machine:
    """Validate a plain dict into a Machine; errors become one InputError naming ``label``."""
    try:
        return Machine.model_validate(data)
    except ValidationError as e:
        raise _convert(e, list(origins), label) from None


# ---- the entry point --------------------------------------------------------------------------

def load_machine_dict(hw: str, overlays: Sequence[str] = (), sets: Sequence[str] = ()) -> tuple[dict, list, str]:
    """The merged plain dict before validation, with provenance (for ``load_machine``)."""
    path = resolve_hw(hw)
    base_label = _label(hw, path)
    data = read_yaml(path, base_label)
    origins: list[tuple[tuple, str]] = []
    for ov in overlays:
        opath = resolve_overlay(ov)
        olabel = _label(ov, opath)
        odata = read_yaml(opath, olabel)
        data = deep_merge(data, odata)
        origins.extend((p, olabel) for p in _leaf_paths(odata))
    for item in sets:
        spath, value, dotted = parse_set(item)
        _check_set_path(spath, dotted, data)
        data = apply_set(data, spath, value)
        origins.append((spath, f"--set {dotted}"))
    return data, origins, base_label


def load_machine(hw: str, overlays: Sequence[str] = (), sets: Sequence[str] = ()) -> Machine:
    """Resolve ``hw`` (a path or built-in name), apply overlays then ``--set`` items, validate."""
    data, origins, base_label = load_machine_dict(hw, overlays, sets)
    return validate_machine(data, base_label, origins)


def machine_fingerprint(m: Machine) -> str:
    """A stable hex digest of the resolved machine (for result keys and caches)."""
    text = json.dumps(m.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


__all__ = [
    "apply_set", "builtin_machines", "builtin_overlays", "deep_merge", "get_value", "load_machine",
    "load_machine_dict", "machine_fingerprint", "parse_set", "read_yaml", "resolve_hw", "resolve_overlay",
    "validate_machine",
]
