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
import sys
import typing
from pathlib import Path
from typing import Any, Sequence, Union

import yaml
from pydantic import BaseModel, ValidationError

from archsim.errors import InputError
from archsim.paths import data_dir

from .schema import Machine
from . import schema_errors as SE

# ---- finding files ----------------------------------------------------------------------------

def builtin_machines() -> list[str]:
    """Names of the machine files shipped in configs/ (e.g. a100, h100, sw26010pro, ...)."""
    return sorted(p.stem for p in data_dir("configs").glob("*.yaml"))


def builtin_overlays() -> list[str]:
    d = data_dir("configs") / "overlays"
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def resolve_file(arg: str, where: str, kind: str, folder: Path, names: list[str]) -> Path:
    """A file named by ``arg``: a path, or one of the built-in ``names`` (stems of YAML files in
    ``folder``); otherwise one InputError naming ``where`` and what is allowed."""
    arg = str(arg)
    allowed = "a path to a YAML file or one of: " + ", ".join(names)
    if not arg.strip():
        raise InputError(where, f"an empty {kind} name", allowed)
    stem = arg[:-5] if arg.endswith(".yaml") else arg
    if "/" not in arg and stem in names:
        return folder / f"{stem}.yaml"
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        raise InputError(where, f"{arg!r} is a directory, not a {kind} file", allowed)
    if p.exists():  # a FIFO, a device (/dev/null), a socket: nothing a file of settings comes from
        raise InputError(where, f"{arg!r} is not a regular file", allowed)
    if "/" in arg or arg.endswith((".yaml", ".yml")):
        raise InputError(where, f"{kind} file not found: {arg!r}", allowed)
    raise InputError(where, f"unknown {kind} {arg!r}", allowed)


def resolve_hw(hw: str) -> Path:
    """A machine file: a path to a YAML file, or a built-in name found in configs/."""
    return resolve_file(hw, "--hw", "machine", data_dir("configs"), builtin_machines())


def resolve_overlay(overlay: str) -> Path:
    """An overlay file: a path, or a built-in name found in configs/overlays/ (e.g. l2-off)."""
    return resolve_file(overlay, "--overlay", "overlay", data_dir("configs") / "overlays", builtin_overlays())


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
        try:
            hash(key)
        except TypeError:       # `? [a, b] : 1`: YAML allows it, a Python dict does not
            raise yaml.constructor.ConstructorError(
                None, None, f"a {type(key).__name__} as a mapping key", key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


class NumberTooLong(yaml.constructor.ConstructorError):
    """An integer of more digits than Python reads from text (sys.get_int_max_str_digits)."""


def _construct_int(loader, node):
    try:
        v = yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
    except ValueError:      # past the digit limit: int() refuses it
        v = None
    # a hex or binary one reads, but could not be printed in decimal (repr refuses it)
    if v is None or abs(v).bit_length() > int(sys.get_int_max_str_digits() * 3.32):   # log2(10) bits a digit
        raise NumberTooLong(None, None, f"an integer too large to read ({len(node.value)} characters)",
                            node.start_mark)
    return v


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_FastLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


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
    except NumberTooLong as e:
        mark = e.problem_mark
        raise InputError(f"{label}:{mark.line + 1}", f"{e.problem} at column {mark.column + 1}",
                         f"numbers of at most {sys.get_int_max_str_digits()} decimal digits") from None
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
    t = SE.type_at(Machine, path)
    bare = SE.unwrap(t) if t is not None else None
    if bare is str and value is not None and not isinstance(value, str) and not isinstance(value, (dict, list)):
        value = raw.strip()                                  # name=123 means the string "123"
    elif bare in (float, int) and isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        value = float(value)                                 # YAML 1.1 reads 1e3 as a string
        if bare is int and value.is_integer():
            value = int(value)
    return path, value, dotted


def check_set_path(path: tuple, option: str, data: dict) -> None:
    """A ``--set`` path names a schema field: every key on the way is known, no value is used as a block."""
    t: Any = Machine
    cur: Any = data
    for i, seg in enumerate(path):
        here = SE.dotted(path[:i]) or "the top level"
        bare = SE.unwrap(t)
        if SE.is_model(bare) or typing.get_origin(bare) is dict:
            keys = SE.known_keys(bare, cur)
            if seg not in keys:
                raise InputError(f"--set {option}", f"unknown key {seg!r} in {here}",
                                 "known keys: " + (", ".join(keys) if keys else "none"))
            t = SE.child(bare, seg)
            cur = cur.get(seg) if isinstance(cur, dict) else None
        else:
            raise InputError(f"--set {option}", f"{SE.dotted(path[:i])} is a value, not a block",
                             f"set {SE.dotted(path[:i])} itself")


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


def _convert(exc: ValidationError, origins: list, base: str) -> InputError:
    loc, paths, what, allowed, is_field_error = SE.explain(exc, Machine)
    label, blamed = _origin(paths, origins, base)
    if is_field_error:
        loc = blamed                  # name the related field the user actually changed
    field = SE.dotted(loc)
    if label.startswith("--set "):
        if not is_field_error and field and field != label[len("--set "):]:
            what = f"{field}: {what}"
        return InputError(label, what, allowed)
    return InputError(f"{label}: {field}" if field else label, what, allowed)


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
        check_set_path(spath, dotted, data)
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
    "apply_set", "builtin_machines", "check_set_path", "builtin_overlays", "deep_merge", "get_value", "load_machine",
    "load_machine_dict", "machine_fingerprint", "parse_set", "read_yaml", "resolve_file", "resolve_hw", "resolve_overlay",
    "validate_machine",
]
