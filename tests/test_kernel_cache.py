"""The kernel timing cache (archsim.kernel_cache): a hit returns what the simulation returned, any
change of what a launch's timing depends on is a miss, a damaged or stale entry is simulated
again and rewritten, concurrent writers leave whole entries, and bad cache directories are one
line (exit 2)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os

import numpy as np
import pytest

from archsim import kernel_cache
from archsim.cli import main
from archsim.config import load_machine
from archsim.engine.timing import Unbacked, time_kernel
from archsim.isa.program import Launch


@pytest.fixture
def cache(tmp_path):
    d = kernel_cache.configure(tmp_path / "kc")
    for k in kernel_cache.stats:
        kernel_cache.stats[k] = 0
    yield d
    kernel_cache.configure(None, enabled=False)


def _stream(asm=None):
    """The built-in vector_add over 4096 elements, buffers as address space."""
    from archsim.isa.asm import assemble_file
    from archsim.paths import data_dir

    prog = assemble_file(data_dir("isa") / "examples" / "vector_add.s")
    n = 4096
    return prog, Launch((n // 128, 1, 1), (128, 1, 1)), {"x": Unbacked(4 * n), "y": Unbacked(4 * n),
                                                          "out": Unbacked(4 * n), "n": n}


def _same(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y), f.name
        elif f.name == "timeline":
            assert x[0] == y[0] and np.array_equal(x[1], y[1])
        else:
            assert json.dumps(x, sort_keys=True, default=str) == json.dumps(y, sort_keys=True, default=str), f.name


def test_a_hit_returns_what_the_simulation_returned(cache, asm):
    m = load_machine("tiny-gpu")
    prog, launch, args = _stream(asm)
    first = time_kernel(prog, m, launch, args)
    assert kernel_cache.stats["misses"] == 1 and kernel_cache.stats["hits"] == 0
    assert kernel_cache.info(cache)["entries"] == 1
    second = time_kernel(prog, m, launch, args)
    assert kernel_cache.stats["hits"] == 1
    _same(first, second)
    with kernel_cache.disabled():
        _same(first, time_kernel(prog, m, launch, args))


def test_what_the_timing_depends_on_is_in_the_key(cache, asm):
    m = load_machine("tiny-gpu")
    prog, launch, args = _stream(asm)
    base = kernel_cache.key(prog, m, launch, args, (10**9, True, 1024, None, None, "cross"))
    other_machine = load_machine("tiny-gpu", sets=["l2.size_kib=128"])
    variants = [
        kernel_cache.key(prog, other_machine, launch, args, (10**9, True, 1024, None, None, "cross")),
        kernel_cache.key(prog, m, Launch((16, 1, 1), (256, 1, 1)), args, (10**9, True, 1024, None, None, "cross")),
        kernel_cache.key(prog, m, launch, dict(args, n=4095), (10**9, True, 1024, None, None, "cross")),
        kernel_cache.key(prog, m, launch, dict(args, out=Unbacked(4 * 4096, at=1 << 24)),
                         (10**9, True, 1024, None, None, "cross")),
        kernel_cache.key(prog, m, launch, args, (10**9, True, 1024, (0, 8), None, "cross")),
        kernel_cache.key(prog, m, launch, args, (10**9, True, 512, None, None, "cross")),
        kernel_cache.key(dataclasses.replace(prog, nregs=prog.nregs + 1), m, launch, args,
                         (10**9, True, 1024, None, None, "cross")),
    ]
    assert base is not None and len({base, *variants}) == len(variants) + 1
    # the engine's source is in the key: an entry written by other code is never read
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel_cache, "source_digest", lambda: "other code")
        assert kernel_cache.key(prog, m, launch, args, (10**9, True, 1024, None, None, "cross")) != base


def test_a_damaged_entry_is_simulated_again_and_rewritten(cache, asm):
    m = load_machine("tiny-gpu")
    prog, launch, args = _stream(asm)
    first = time_kernel(prog, m, launch, args)
    [entry] = kernel_cache.entries(cache)
    for damage in (entry.read_bytes()[:100], b"", b"not a pickle"):
        entry.write_bytes(damage)
        again = time_kernel(prog, m, launch, args)
        _same(first, again)
        assert len(entry.read_bytes()) > 100          # rewritten whole
    # an entry whose tag is another key's (or another format's) is not believed
    import pickle

    entry.write_bytes(pickle.dumps(((kernel_cache.FORMAT + 1, entry.stem), "stale")))
    _same(first, time_kernel(prog, m, launch, args))


def test_a_launch_that_stops_is_not_cached(cache, asm):
    from archsim.errors import SimulationError

    m = load_machine("tiny-gpu")
    prog, launch, args = _stream(asm)
    with pytest.raises(SimulationError):
        time_kernel(prog, m, launch, args, max_cycles=50)
    assert kernel_cache.entries(cache) == []


def _writer(d: str, k: str, seed: int, n: int) -> int:
    kernel_cache.configure(d)
    value = np.full(200_000, seed, np.int64)
    bad = 0
    for _ in range(n):
        kernel_cache.store(k, value)
        got = kernel_cache.load(k)
        if got is None or not (got == got[0]).all():
            bad += 1
    return bad


def test_concurrent_writers_leave_whole_entries(cache):
    k = "ab" + "0" * 62
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        bad = pool.starmap(_writer, [(str(cache), k, s, 30) for s in range(4)])
    assert bad == [0, 0, 0, 0]
    got = kernel_cache.load(k)
    assert got is not None and len(set(got.tolist())) == 1
    assert not [p for p in (cache / "ab").iterdir() if p.name.startswith(".")]   # no temporary files left


def test_a_run_twice_reads_every_launch_back_and_gives_the_same_document(tmp_path, capsys):
    outs = []
    for i in range(2):
        j = tmp_path / f"r{i}.json"
        assert main(["run", "--hw", "tiny-gpu", "--workload", "tiny", "--workers", "1", "--cache",
                     str(tmp_path / "kc"), "--json", str(j)]) == 0
        outs.append(json.loads(j.read_text()))
    a, b = outs
    ca, cb = a.pop("sim")["kernel_cache"], b.pop("sim")["kernel_cache"]
    assert ca["misses"] > 0 and ca["hits"] == 0
    assert cb["hits"] == ca["misses"] and cb["misses"] == 0
    assert a == b
    capsys.readouterr()
    assert main(["cache", "info", "--cache", str(tmp_path / "kc")]) == 0
    assert f"{ca['misses']} entries" in capsys.readouterr().out
    assert main(["cache", "clear", "--cache", str(tmp_path / "kc")]) == 0
    assert f"removed {ca['misses']} entries" in capsys.readouterr().out
    assert kernel_cache.entries(tmp_path / "kc") == []
    kernel_cache.configure(None, enabled=False)


def test_bad_cache_directories_are_one_line(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    base = ["micro", "latency", "--hw", "tiny-gpu", "--param", "footprint_kib=4"]
    assert main(base + ["--cache", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a directory" in err and "--no-cache" in err
    assert main(base + ["--cache", str(f / "sub")]) == 2
    assert "cannot create" in capsys.readouterr().err
    assert main(base + ["--cache", str(tmp_path), "--no-cache"]) == 2
    assert "not allowed with" in capsys.readouterr().err
    if os.geteuid() != 0:           # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        assert main(base + ["--cache", str(ro)]) == 2
        assert "is not writable" in capsys.readouterr().err
    kernel_cache.configure(None, enabled=False)


def test_the_environment_turns_it_off_and_bench_never_uses_it(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_cache.ENV, "off")
    assert kernel_cache.configure(None) is None
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "env"))
    assert kernel_cache.configure(None) == tmp_path / "env"
    with kernel_cache.disabled():
        assert kernel_cache.directory() is None
    assert kernel_cache.directory() == tmp_path / "env"
    from archsim.bench import run_bench

    run_bench(cases=[("c", "tiny-gpu", "latency", {"footprint_kib": 4})], repeat=1, warmup=[])
    assert kernel_cache.entries(tmp_path / "env") == []
    kernel_cache.configure(None, enabled=False)


def test_the_opcode_table_is_in_the_key(tmp_path, monkeypatch):
    """Latencies and units live in isa/opcodes.yaml, not in the programs: another table is another key."""
    import archsim.paths
    from archsim.paths import data_dir

    real = kernel_cache.source_digest.__wrapped__()
    isa = tmp_path / "isa"
    isa.mkdir()
    text = (data_dir("isa") / "opcodes.yaml").read_text()
    (isa / "opcodes.yaml").write_text(text + "\n# another table\n")
    monkeypatch.setattr(archsim.paths, "data_dir", lambda kind: tmp_path / kind)
    assert kernel_cache.source_digest.__wrapped__() != real


def test_clear_removes_only_the_caches_files(cache, asm):
    m = load_machine("tiny-gpu")
    prog, launch, args = _stream(asm)
    time_kernel(prog, m, launch, args)
    [entry] = kernel_cache.entries(cache)
    (entry.parent / ".archsim-123.tmp").write_text("left by a killed worker")
    others = [cache / "notes.kt", cache / "app" / "Main.kt", cache / "js" / ".eslintrc", entry.parent / "keep.txt"]
    for o in others:
        o.parent.mkdir(exist_ok=True)
        o.write_text("not ours")
    assert kernel_cache.clear(cache) == 1
    assert kernel_cache.entries(cache) == [] and all(o.exists() for o in others)
    assert [p.name for p in entry.parent.iterdir()] == ["keep.txt"]


def test_an_unwritable_default_location_runs_without_a_cache(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    monkeypatch.delenv(kernel_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    assert kernel_cache.configure(None) is None
    assert "no kernel timing cache" in capsys.readouterr().err
    assert main(["micro", "latency", "--hw", "tiny-gpu", "--param", "footprint_kib=4"]) == 0
