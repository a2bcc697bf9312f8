"""The command line: exit statuses, one-line errors, the asm and show-config commands."""

import json
import subprocess
import sys

import pytest

from archsim.cli import main


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_show_config_a100_and_sunway(capsys):
    code, out, _ = cli(capsys, "show-config", "a100")
    assert code == 0 and "108 SMs" in out and "fp16: 312.0" in out
    code, out, _ = cli(capsys, "show-config", "sw26010pro")
    assert code == 0 and "6 core groups x 64 CPEs" in out and "fp16: 55.3" in out


def test_show_config_set_and_json(capsys, tmp_path):
    f = tmp_path / "m.json"
    code, out, _ = cli(capsys, "show-config", "tiny-gpu", "--set", "dram.channels=4", "--json", str(f))
    assert code == 0
    doc = json.loads(f.read_text())
    assert doc["schema"] == "archsim.machine/1" and doc["machine"]["dram"]["channels"] == 4
    assert doc["derived"]["peak_bandwidth_gbps"]["dram"] == pytest.approx(4 * doc["machine"]["dram"]["channel_gbps"])


@pytest.mark.parametrize("argv,line", [
    (["show-config", "nope"], "archsim: error: show-config: unknown machine or cluster 'nope' (a path to a YAML "
                              "file or one of: a100, a100-80gb, h100, sw26010pro, tiny-gpu, tiny-sunway; or a "
                              "cluster: dgx-a100-superpod, jean-zay-a100, sunway-supernodes)"),
    (["asm", "vector_add"], "archsim: error: command line: the following arguments are required: --hw "
                            "(see `archsim asm --help`)"),
    (["asm", "vector_add", "--hw", "tiny-gpu", "--grid", "0"],
     "archsim: error: --grid: bad value '0' (X[,Y,Z] with positive integers)"),
    (["asm", "no_such_kernel", "--hw", "tiny-gpu"],
     "archsim: error: no_such_kernel: no such file or built-in example (a .s path or one of: gemm_ffma, gemm_mma, "
     "layernorm, reduce_sum, softmax, vector_add)"),
    (["asm", "missing.s", "--hw", "tiny-gpu"], "archsim: error: missing.s: no such file (a path to an assembly (.s) file)"),
])
def test_bad_command_lines_exit_2_with_one_line(capsys, argv, line):
    code, _, err = cli(capsys, *argv)
    assert code == 2
    assert one_line_error(err) == line


def test_unknown_command(capsys):
    code, _, err = cli(capsys, "frob")
    line = one_line_error(err)
    assert code == 2
    # argparse quotes the choices differently across Python versions
    assert line.startswith("archsim: error: command line: argument COMMAND: invalid choice: 'frob' (choose from ")
    assert line.endswith("(see `archsim --help`)")


def test_bad_yaml_exits_2(capsys, tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text((__import__("archsim.paths", fromlist=["x"]).data_dir("configs") / "tiny-gpu.yaml").read_text()
                 + "\nbogus_key: 1\n")
    code, _, err = cli(capsys, "show-config", str(f))
    assert code == 2
    line = one_line_error(err)
    assert line.startswith(f"archsim: error: {f}: bogus_key: unknown key 'bogus_key' (known keys: ")


def test_asm_runs_and_verifies_builtin_example(capsys, tmp_path):
    f = tmp_path / "r.json"
    code, out, _ = cli(capsys, "asm", "vector_add", "--hw", "tiny-gpu", "--json", str(f))
    assert code == 0
    assert "check out vs numpy" in out and ": ok" in out
    doc = json.loads(f.read_text())
    assert doc["schema"] == "archsim.asm/1" and doc["verification"]["out"]["passed"]
    assert "out" in doc["written"] and doc["warp_instructions"] > 0


def test_asm_rejects_mma_on_sunway(capsys):
    code, _, err = cli(capsys, "asm", "gemm_mma", "--hw", "tiny-sunway")
    assert code == 2
    assert "mma.m16n8k16.f32.f16: the target tiny-sunway has no tensor unit" in one_line_error(err)


def test_asm_syntax_error_names_file_and_line(capsys, tmp_path):
    f = tmp_path / "bad.s"
    f.write_text(".kernel k\n    mov.b64 r1, 1\n    frob r1\n    exit\n")
    code, _, err = cli(capsys, "asm", str(f), "--hw", "tiny-gpu", "--grid", "1", "--block", "32")
    assert code == 2
    assert one_line_error(err) == "archsim: error: bad.s:3: unknown opcode 'frob' (see isa/opcodes.yaml)"


def test_asm_runtime_fault_exits_3(capsys, tmp_path):
    f = tmp_path / "oob.s"
    f.write_text(".kernel k\n.launch grid=1 block=32\n    mov.b64 r0, 16\n    ld.global.b32 r1, [r0]\n    exit\n")
    j = tmp_path / "partial.json"
    code, _, err = cli(capsys, "asm", str(f), "--hw", "tiny-gpu", "--json", str(j))
    assert code == 3
    doc = json.loads(j.read_text())
    assert doc["complete"] is False and doc["error"].startswith("oob.s:4: block 0 warp 0 lane 0")
    assert one_line_error(err) == ("archsim: error: oob.s:4: block 0 warp 0 lane 0: global access of 4 byte(s) "
                                   "at address 0x10 outside global memory")


def test_block_larger_than_a_core(capsys):
    code, _, err = cli(capsys, "asm", "vector_add", "--hw", "tiny-gpu", "--block", "100000")
    assert code == 2
    assert "threads per block exceed what one core of tiny-gpu holds" in one_line_error(err)


def test_entry_point_in_a_subprocess():
    r = subprocess.run([sys.executable, "-m", "archsim", "show-config", "tiny-gpu", "--set", "clock_ghz=0"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert one_line_error(r.stderr).startswith("archsim: error: --set clock_ghz: ")


def test_a_closed_pipe_on_stdout_loses_no_result(tmp_path, monkeypatch):
    """`archsim ... | head`: once the reader has gone, printing stops quietly and the command still
    writes its JSON (no BrokenPipeError traceback, exit 0)."""
    import io
    import sys

    from archsim.cli import main

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    out = tmp_path / "m.json"
    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["show-config", "tiny-gpu", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["schema"] == "archsim.machine/1"


@pytest.mark.parametrize("cmd", [["run", "--hw", "tiny-gpu", "--workload", "tiny", "--layers", "1"],
                                 ["micro", "latency", "--hw", "tiny-gpu", "--param", "footprint_kib=4"]])
def test_output_paths_are_checked_before_any_work(capsys, tmp_path, monkeypatch, cmd):
    import archsim.runner
    import archsim.micro

    def boom(*a, **k):
        raise AssertionError("simulated before the output paths were checked")

    monkeypatch.setattr(archsim.runner, "run_workload", boom)
    monkeypatch.setattr(archsim.micro, "run_micro", boom)
    f = tmp_path / "file"
    f.write_text("x")
    for extra, flag in ((["--json", str(tmp_path)], "--json"), (["--json", str(f / "r.json")], "--json"),
                        (["--out", str(f)], "--out"), (["--out", str(f / "sub")], "--out")):
        code, _, err = cli(capsys, *cmd, *extra)
        assert code == 2 and flag in one_line_error(err), (extra, err)


@pytest.mark.parametrize("cache", ["l1", "l2"])
def test_fewest_mshrs_finish_and_fewer_are_refused(capsys, cache):
    """mshrs counts sector misses in flight: a line's sectors (4 on tiny-gpu) is the fewest that can
    fetch a line, and that many finish the tiny workload; fewer is one line, not a run that waits
    forever."""
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--layers", "1",
                       "--set", f"{cache}.mshrs=4")
    assert code == 0, err
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--set", f"{cache}.mshrs=3")
    assert code == 2 and f"{cache}.mshrs" in one_line_error(err) and "at least" in err


def test_messages_name_what_is_wrong(capsys, tmp_path):
    """issue 20, item 8: a directory or device as --hw, a GPU's DMA benchmark, a reference with
    nothing in it, a reference measured on another machine."""
    code, _, err = cli(capsys, "run", "--hw", str(tmp_path), "--workload", "tiny")
    assert code == 2 and "is a directory" in one_line_error(err)
    code, _, err = cli(capsys, "run", "--hw", "/dev/null", "--workload", "tiny")
    assert code == 2 and "not a regular file" in one_line_error(err)
    for name in ("dma", "rma"):
        code, _, err = cli(capsys, "micro", name, "--hw", "tiny-gpu")
        assert code == 2 and f"no {name.upper()} engines" in one_line_error(err)
    empty = tmp_path / "empty.yaml"
    empty.write_text("machine: tiny-gpu\nrows: []\n")
    code, _, err = cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(empty), "--plot", "none")
    assert code == 2 and "nothing to validate" in one_line_error(err)
    other = tmp_path / "other.yaml"
    other.write_text("machine: a100\nrows:\n  - {quantity: ffma_latency, value: 4.0, unit: cycles, source: test}\n")
    code, out, err = cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(other), "--plot", "none")
    assert code == 0 and "measured on a100" in err and "ffma_latency" in out


def test_deep_nesting_and_huge_values_are_one_short_line(capsys, tmp_path):
    """issue 20, items 2-3: YAML thousands of levels deep in any input is exit 2 with one line, and a
    message quotes at most a few hundred characters of a bad value."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    for argv in (["run", "--hw", str(deep), "--workload", "tiny"],
                 ["run", "--hw", "tiny-gpu", "--workload", str(deep)],
                 ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--overlay", str(deep)],
                 ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--set", "clock_ghz=" + "[" * 5000 + "]" * 5000],
                 ["validate", "--hw", "tiny-gpu", "--reference", str(deep), "--plot", "none"]):
        code, _, err = cli(capsys, *argv)
        line = one_line_error(err)
        assert code == 2 and "nested too deeply" in line, argv
    spec = tmp_path / "spec.yaml"
    spec.write_text("hw: tiny-gpu\nworkload: tiny\nvary: " + "[" * 300 + "]" * 300 + "\n")
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and len(line) < 600 and "characters)" in line


def test_sizes_no_host_holds_and_non_finite_numbers_are_one_line(capsys, tmp_path):
    """issue 20, item 2: a 30-digit count, an infinite rate in YAML, and an L2 of 1 TiB (256 GiB of
    tag state) are one line each, exit 2, not OverflowError / ZeroDivisionError / MemoryError."""
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny",
                       "--set", "cores.per_group=99999999999999999999999999")
    assert code == 2 and "cores.per_group" in one_line_error(err)
    inf = tmp_path / "inf.yaml"
    inf.write_text("dram:\n  channel_gbps: .inf\n")
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--overlay", str(inf))
    assert code == 2 and "finite" in one_line_error(err)
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--layers", "1",
                       "--set", "l2.size_kib=1073741824")
    assert code == 2 and "host memory" in one_line_error(err)


def test_jobs_beyond_the_device_host_or_work_limit_are_refused_before_they_start(capsys, tmp_path, monkeypatch):
    """issue 20, item 5: a workload whose tensors do not fit the machine's DRAM, a micro footprint
    beyond it, .arg buffers beyond it, and a job above --max-instructions are one line naming both
    sizes (or the estimate and the option), before any kernel is emitted or simulated."""
    import archsim.engine.timing
    import archsim.micro      # binds time_kernel at import: import it first, patch both

    def boom(*a, **k):
        raise AssertionError("simulated a job that should have been refused")

    monkeypatch.setattr(archsim.engine.timing, "time_kernel", boom)
    monkeypatch.setattr(archsim.micro, "time_kernel", boom)
    for extra in (["--seq", "10000000"], ["--batch", "100000"], ["--mode", "functional", "--seq", "1000000"]):
        code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", *extra)
        line = one_line_error(err)
        assert code == 2 and "of DRAM tiny-gpu has" in line and "GiB" in line, (extra, line)
    code, _, err = cli(capsys, "compare", "--hw", "a100", "--hw", "tiny-gpu", "--workload", "gpt2-small",
                       "--batch", "1000")
    assert code == 2 and "tiny-gpu" in one_line_error(err)
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--max-instructions", "10")
    line = one_line_error(err)
    assert code == 2 and "--max-instructions" in line and "warp-instructions" in line
    code, _, err = cli(capsys, "micro", "latency", "--hw", "tiny-gpu", "--param", "footprint_kib=4194304")
    assert code == 2 and "4 GiB, more than the 1 GiB of DRAM" in one_line_error(err)
    big = tmp_path / "big.s"
    big.write_text(".kernel big\n.param out\n.launch grid=1 block=32\n.arg out f32[100000000000] unbacked\n"
                   "        exit\n")
    for extra in ([], ["--timing"]):
        code, _, err = cli(capsys, "asm", str(big), "--hw", "tiny-gpu", *extra)
        assert code == 2 and ".arg" in one_line_error(err), (extra, err)


def test_a_functional_loop_stops_at_max_instructions(capsys, tmp_path):
    loop = tmp_path / "loop.s"
    loop.write_text(".kernel spin\n.launch grid=1 block=32\nTOP:    bra TOP\n")
    for engine in ("numba", "reference"):
        code, _, err = cli(capsys, "asm", str(loop), "--hw", "tiny-gpu", "--engine", engine, "--max-instructions",
                           "5000")
        assert code == 3 and "more than 5000 warp-instructions" in err and "--max-instructions" in err, err
    code, _, err = cli(capsys, "asm", str(loop), "--hw", "tiny-gpu", "--max-instructions", "0")
    assert code == 2 and "--max-instructions" in one_line_error(err)


def test_an_interrupted_run_leaves_no_half_written_output(capsys, tmp_path, monkeypatch):
    """issue 20: Ctrl-C during the simulation writes nothing; during the plots, result.json is
    whole (written beside its place and renamed) and no temporary file stays behind."""
    import archsim.runner
    import archsim.report.plots

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    out = tmp_path / "o"
    with monkeypatch.context() as m:
        m.setattr(archsim.runner, "start_timing", interrupted)
        code, _, _ = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--layers", "1", "--out", str(out))
    assert code == 130 and not (out / "result.json").exists()
    real = archsim.report.plots.write_plots

    def half(doc, where, kernel=None):
        real(doc, where, kernel)
        raise KeyboardInterrupt

    monkeypatch.setattr(archsim.report.plots, "write_plots", half)
    code, _, _ = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--layers", "1", "--out", str(out))
    assert code == 130
    assert json.loads((out / "result.json").read_text())["complete"] is True
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_an_interrupt_reaches_python_within_a_long_kernel():
    """The timing loop returns to Python every SLICE_CYCLES cycles: a KeyboardInterrupt raised by a
    signal handler stops a kernel that would run for millions of cycles."""
    import signal
    import time

    from archsim.config import load_machine
    from archsim.micro import run_micro

    machine = load_machine("tiny-gpu")
    run_micro("latency", machine, {"footprint_kib": 4, "loads": 8})      # compiled before the clock starts

    def ctrl_c(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, ctrl_c)
    t0 = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_micro("latency", machine, {"footprint_kib": 4, "loads": 10**9, "warmup": 0})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.perf_counter() - t0 < 20


def test_an_anchor_bomb_is_one_line_at_once(capsys, tmp_path):
    """issue 20, item 3: aliases that expand a few lines into 10^8 values are refused before any
    value is checked (the message once printed the whole expanded list)."""
    rows = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    rows += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    for name, tail in (("hw.yaml", "cores: {per_group: *a7}"), ("wl.yaml", "model: *a7")):
        (tmp_path / name).write_text("\n".join(rows + [tail]) + "\n")
    for argv in (["run", "--hw", "tiny-gpu", "--workload", "tiny", "--overlay", str(tmp_path / "hw.yaml")],
                 ["run", "--hw", "tiny-gpu", "--workload", str(tmp_path / "wl.yaml")],
                 ["show-config", str(tmp_path / "hw.yaml")]):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and "more than 1,000,000 values" in one_line_error(err), argv


def test_a_control_character_in_yaml_is_one_line(capsys, tmp_path):
    bad = tmp_path / "ctl.yaml"
    bad.write_text("name: x\x07y\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("hw: tiny-gpu\nworkload: tiny\n\x01\n")
    for argv in (["run", "--hw", str(bad), "--workload", "tiny"], ["sweep", str(spec), "--out", str(tmp_path / "o")]):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and "#x000" in one_line_error(err), argv


# Inputs refused before the engine is loaded: each answers in one line, exit 2, without importing
# numba (a refused input costs the interpreter's start and the config schema, not the engine).
_REFUSED_EARLY = [
    ["run", "--hw", "nosuch", "--workload", "tiny"],
    ["run", "--hw", "tiny-gpu", "--workload", "nosuch"],
    ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--workers", "0"],
    ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--sample-max-error", "2"],
    ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--set", "clock_ghz=-1"],
    ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--scale", "2"],
    ["compare", "--hw", "tiny-gpu", "--hw", "nosuch", "--workload", "tiny"],
    ["micro", "gemm", "--hw", "tiny-gpu", "--param", "m=x"],
    ["micro", "dma", "--hw", "tiny-gpu", "--param", "size_bytes=8"],
    ["asm", "vector_add", "--hw", "tiny-gpu", "--timing", "--max-cycles", "0"],
    ["validate", "--hw", "tiny-gpu", "--reference", "nosuch.yaml"],
    ["bench", "--repeat", "0"],
    ["run", "--bogus"],
    ["run", "--cluster", "nosuch", "--workload", "tiny", "--plan", "tp=1"],
    ["run", "--cluster", "jean-zay-a100", "--workload", "tiny", "--plan", "tp=3"],
    ["plan", "--cluster", "nosuch", "--workload", "tiny"],
]


def test_refused_inputs_do_not_load_the_engine():
    code = ("import sys; from archsim.cli import main; rc = main(sys.argv[1:]); "
            "print('numba loaded' if 'numba' in sys.modules else 'numba not loaded'); sys.exit(rc)")
    for argv in _REFUSED_EARLY:
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (argv, r.stderr)
        one_line_error(r.stderr)
        assert r.stdout.strip().splitlines()[-1] == "numba not loaded", argv
