"""Fuzz the real command line in-process with hypothesis: mutated machine configs, ``--set``
values, assembly files, workload files and sweep specs. Every input must end in exit 0, 2 (one
line on stderr, no traceback) or 3 (a run that cannot finish), within a bounded time. A longer
profile: ``ARCHSIM_FUZZ_EXAMPLES=500 pytest tests/test_fuzz_cli.py``."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import tempfile
from pathlib import Path
from unittest import mock

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archsim import scale_model as SM
from archsim.cli import main
from archsim.paths import data_dir

EXAMPLES = int(os.environ.get("ARCHSIM_FUZZ_EXAMPLES", "0")) or None
SECONDS = 60                   # one input's wall-clock bound (a numba compile may fall in it)


def _settings(n: int):
    return settings(max_examples=EXAMPLES or n, deadline=None, derandomize=EXAMPLES is None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class _TooLong(Exception):
    pass


def _alarm(*_):
    raise _TooLong(f"an input ran past {SECONDS} s")


def run_cli(*argv: str) -> tuple[int, str]:
    """(exit status, stderr) of ``archsim ARGV`` in this process; fails on a traceback, on an exit
    status other than 0, 2 or 3, on more than one stderr line with 2, or past SECONDS."""
    err, out = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(list(argv))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    assert "Traceback" not in text, text
    assert code in (0, 2, 3), (code, argv, text)
    if code == 2:
        lines = [x for x in text.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("archsim: error: "), (argv, text)
    return code, text


def _leaves(tree, path=()):
    """Every (dotted path, value) leaf of a YAML tree (lists by index)."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, path + (str(k),))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, path + (str(i),))
    else:
        yield path, tree


def _put(tree, path, value):
    node = tree
    for k in path[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = path[-1]
    if isinstance(node, list):
        if value is _DELETE:
            node.pop(int(last))
        else:
            node[int(last)] = value
    elif value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value


_DELETE = object()

# values a hostile but fair user types: edges, huge, wrong kinds, nested
values = st.one_of(
    st.integers(-3, 70), st.sampled_from([0, 2**31, 2**53, 2**63, 2**70, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.text(max_size=12), st.lists(st.integers(-2, 8), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(0, 4), max_size=2), st.just(_DELETE))


class _Scale(float):
    """A mutation that keeps a number's kind and scales it (halves, doubles, triples, x1000; the
    other values cover zero, negatives and the wrong kinds)."""


scales = st.sampled_from([0.5, 2.0, 3.0, 1000.0]).map(_Scale)


def _tree_mutations(tree: dict):
    """1-3 (path, value) changes; most of them scale a number already there, so many inputs pass
    the schema and reach the engine with odd but valid values."""
    paths = [p for p, _ in _leaves(tree)]
    return st.lists(st.tuples(st.sampled_from(paths), st.integers(0, 3).flatmap(lambda i: values if i == 0 else scales)), min_size=1,
                    max_size=3)


def _write_yaml(folder: Path, name: str, tree) -> Path:
    p = folder / name
    p.write_text(yaml.safe_dump(tree, sort_keys=False))
    return p


def _mutated(base: dict, muts) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    leaves = dict(_leaves(tree))
    for path, v in muts:
        if isinstance(v, _Scale):
            old = leaves.get(path)
            if isinstance(old, bool) or not isinstance(old, (int, float)):
                continue
            v = type(old)(old * float(v))
        try:
            _put(tree, path, v)
        except (KeyError, IndexError, TypeError, ValueError):
            pass   # an earlier mutation removed the path
    return tree


TINY_GPU = yaml.safe_load((data_dir("configs") / "tiny-gpu.yaml").read_text())
TINY_SUNWAY = yaml.safe_load((data_dir("configs") / "tiny-sunway.yaml").read_text())
TINY_WL = yaml.safe_load((data_dir("workloads") / "tiny.yaml").read_text())
# a short timing run of the memory system: a pointer chase on the mutated machine
CHASE = ("micro", "latency", "--param", "footprint_kib=4", "--param", "loads=8", "--param", "warmup=0",
         "--max-cycles", "200000")


@_settings(40)
@given(st.data())
def test_mutated_machine_configs(data):
    base = data.draw(st.sampled_from([TINY_GPU, TINY_SUNWAY]))
    tree = _mutated(base, data.draw(_tree_mutations(base)))
    with tempfile.TemporaryDirectory() as d:
        hw = _write_yaml(Path(d), "m.yaml", tree)
        if base is TINY_GPU:
            run_cli(*CHASE, "--hw", str(hw))
        else:
            run_cli("micro", "dma", "--hw", str(hw), "--param", "size_bytes=256", "--param", "cpes=2",
                    "--max-cycles", "200000")


set_values = st.one_of(st.sampled_from(["0", "-1", "1e9", "inf", "-inf", "nan", "abc", "[1, 2]", "{a: 1}", "",
                                        "true", "null", "1" * 30, "0x10", "1.5", "&a [*a]", "'", "\x07"]),
                       st.integers(-5, 2**40).map(str), st.text(max_size=8))


@_settings(30)
@given(st.data())
def test_set_values(data):
    path = data.draw(st.sampled_from([".".join(p) for p, _ in _leaves(TINY_GPU)] + ["no.such.key", "cores"]))
    run_cli(*CHASE, "--hw", "tiny-gpu", "--set", f"{path}={data.draw(set_values)}")


VECTOR_ADD = (data_dir("isa") / "examples" / "vector_add.s").read_text()
TOKENS = ["r0", "r3", "r255", "r300", "p0", "p7", "p9", "%tid.x", "%laneid", "[r10]", "[r10+8]", "[r10-4096]",
          "LOOP", "NOWHERE", "0", "-1", "4096", "1e9", "99999999999999999999", "bra", "exit", "bar.sync",
          "ld.global.b32", "st.shared.b64", "add.f32", "mma.m16n8k16.f32.f16", "setp.lt.i64", "@p0", "@!p1",
          ".shared 1000000000", ".param z", ".arg out f32[100000000000] zeros", ".launch grid=0 block=0",
          ".arg q f32[4] unbacked", ",", ":", "//", "\t", "\x00"]


@_settings(40)
@given(st.data())
def test_mutated_assembly(data):
    lines = VECTOR_ADD.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["drop", "dup", "token", "line"]))
        i = data.draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            lines.pop(i)
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "token":
            words = lines[i].split() or [""]
            words[data.draw(st.integers(0, len(words) - 1))] = data.draw(st.sampled_from(TOKENS))
            lines[i] = " ".join(words)
        else:
            lines.insert(i, " ".join(data.draw(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=5))))
        if not lines:
            lines = [""]
    timing = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.s"
        f.write_text("\n".join(lines) + "\n")
        extra = ("--timing", "--max-cycles", "100000") if timing else ("--max-instructions", "200000")
        run_cli("asm", str(f), "--hw", "tiny-gpu", *extra)


@_settings(20)
@given(st.data())
def test_mutated_workloads(data):
    tree = _mutated(TINY_WL, data.draw(_tree_mutations(TINY_WL)))
    with tempfile.TemporaryDirectory() as d:
        wl = _write_yaml(Path(d), "w.yaml", tree)
        run_cli("run", "--hw", "tiny-gpu", "--workload", str(wl), "--layers", "1", "--max-cycles", "300000",
                "--max-instructions", "100000000", "--json", str(Path(d) / "r.json"))


@_settings(10)
@given(st.data())
def test_scale_models_of_mutated_machines(data):
    base = data.draw(st.sampled_from([TINY_GPU, TINY_SUNWAY]))
    tree = _mutated(base, data.draw(_tree_mutations(base))) if data.draw(st.booleans()) else base
    n = data.draw(st.sampled_from(["1", "2", "3", "0", "-1", "7", str(2**40), "x"]))
    # every kind allowed at every scale, so the scale models themselves run (the tiny machines
    # have no measured tables)
    allowed = {s: {k: (0.0, 9) for k in SM.KINDS} for s in range(2, 8)}
    with tempfile.TemporaryDirectory() as d, mock.patch.object(SM, "measured_errors", lambda name: allowed):
        hw = _write_yaml(Path(d), "m.yaml", tree)
        run_cli("run", "--hw", str(hw), "--workload", "tiny", "--placement",
                "private" if base is TINY_SUNWAY else "cross", "--scale", n, "--max-cycles", "300000", "--no-cache",
                "--workers", "1")


SPEC = {"hw": "tiny-gpu", "workload": "tiny", "phase": "prefill", "layers": 1, "seq": 5, "max_cycles": 100000,
        "vary": {"dram.channel_gbps": [16, 64]}}


@_settings(15)
@given(st.data())
def test_mutated_sweep_specs(data):
    tree = _mutated(SPEC, data.draw(_tree_mutations(SPEC)))
    if data.draw(st.booleans()):   # a whole top-level key replaced
        key = data.draw(st.sampled_from(["vary", "set", "overlays", "seq", "max_points", "hw", "workload", "scale"]))
        _put(tree, (key,), data.draw(values))
    with tempfile.TemporaryDirectory() as d:
        spec = _write_yaml(Path(d), "s.yaml", tree)
        run_cli("sweep", str(spec), "--out", str(Path(d) / "out"))
