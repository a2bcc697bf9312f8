"""Micro-benchmarks (`archsim micro`): real ISA programs run on the timing model, as a GPU
micro-benchmarker writes them (pointer chase, streaming, MMA throughput, tiled GEMM).

Each benchmark builds a kernel, times it with the engine and reads its figure either from the
run (cycles, bytes) or from what the kernel itself measured with `%clock` and stored in a backed
buffer. Nothing here is a formula for the figure: the program runs and the model times it.

The probes used only by `archsim validate` (dependent FFMA chain, shared-memory chase, L1 and
L2 bandwidth) live here too, so that every measurement shares one kernel style.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from archsim.config.derived import capabilities, l1_cache_kib, peak_bandwidth_gbps
from archsim.isa.tensor_map import TensorMap, tensor_map_words
from archsim.engine.timing import Unbacked, blocks_per_core, buffer_addresses, shared_buffers, time_kernel
from archsim.engine.machine import KernelTiming
from archsim.errors import InputError, SimulationError
from archsim.resources import check_device
from archsim.isa.asm import assemble
from archsim.isa.program import Launch, Program
from archsim import kernel_cache, stats

SCHEMA = "archsim.micro/1"


@dataclass
class MicroResult:
    name: str
    params: dict
    value: float
    unit: str
    kernels: list = field(default_factory=list)   # stats.kernel_record of each timed launch
    wall_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    max_cycles: int = 10**9
    complete: bool = True
    pool: object = field(default=None, repr=False)  # workers.Pool the launches are timed on (None: this process)
    spent: dict = None             # what its tasks spent (workers.run_task counts)
    setup_extra: float = 0.0       # this process's own set-up seconds outside the tasks

    def document(self, machine) -> dict:
        res = stats.result(machine, {"name": f"micro {self.name}", "params": self.params}, self.kernels,
                           self.wall_seconds, complete=self.complete, spent=self.spent,
                           setup_extra=self.setup_extra)
        return {"schema": SCHEMA, "name": self.name, "machine": machine.name, "params": self.params,
                "value": self.value if self.complete else None, "unit": self.unit, **self.extra,
                "complete": self.complete, "result": res}


from archsim.micro_params import PARAMS, UNITS, asm_path, check_machine, parse_params, unit_of  # noqa: F401


def _need(cond: bool, where: str, what: str, allowed: str) -> None:
    if not cond:
        raise InputError(where, what, allowed)


def _gpu_only(machine, name: str) -> None:
    _need(machine.family == "gpu", f"micro {name}", f"{machine.name} is a {machine.family} machine; this "
          "micro-benchmark is written for SM cores (the Sunway variants use DMA)", "a GPU machine")


# ----------------------------------------------------------------------------- kernels
def _time(prog: Program, machine, launch: Launch, args: dict, name: str, out: MicroResult, sample: bool = False):
    """Time one launch and keep its record; a run that cannot finish keeps its partial record
    and carries the whole MicroResult up (the CLI writes it with complete: false). ``sample``:
    a launch of many waves is timed from its first waves (archsim.sample)."""
    return _time_many([(prog, launch, args, name)], machine, out, sample)[0]


def _measure(prog: Program, machine, launch: Launch, args: dict, sample: bool, max_cycles: int):
    """The launch's Sampled outcome (``sample``) or KernelTiming; on a worker of out.pool."""
    from archsim.sample import time_sampled

    if sample:
        return time_sampled(prog, machine, launch, args, max_cycles=max_cycles)
    return time_kernel(prog, machine, launch, args, max_cycles=max_cycles)


def _time_many(launches: list, machine, out: MicroResult, sample: bool = False) -> list:
    """``_time`` of independent launches ((prog, launch, args, name) each), timed on out.pool's
    workers at once; records in the order given."""
    from archsim.sample import DEFAULT_MAX_ERROR, sample_fields
    from archsim.workers import Pool

    pool = out.pool if out.pool is not None and len(launches) > 1 else Pool(1)
    futs = [pool.submit(_measure, prog, machine, launch, args, sample, out.max_cycles)
            for prog, launch, args, _name in launches]
    times = []
    for (prog, launch, args, name), fut in zip(launches, futs):
        try:
            got = fut.result()
        except SimulationError as e:
            if isinstance(e.partial, KernelTiming):
                out.kernels.append(stats.kernel_record(name, machine, launch, e.partial))
                e.partial = out
            raise
        if sample:
            t = got.timing
            rec = stats.kernel_record(name, machine, launch, t, sampled=got.sampled,
                                      sample_error_est=round(got.error_est, 5))
            sample_fields(rec, got, DEFAULT_MAX_ERROR)
        else:
            t = got
            rec = stats.kernel_record(name, machine, launch, t, sampled=False, sample_error_est=0.0)
            rec["simulated_warp_instructions"] = t.warp_instructions
        out.kernels.append(rec)
        times.append(t)
    return times


PCHASE_GLOBAL = """.kernel pchase
.param table                    // u64[n]: table[i] = address of the next element (a random cycle)
.param warm                     // loads before timing (fills the caches)
.param loads                    // timed loads
.param start                    // byte offset of the first element in the cycle
.param out                      // i64[2]: timed cycles, final pointer
        ldparam r0, table
        ldparam r9, start
        add.i64 r0, r0, r9
        ldparam r1, warm
        ldparam r2, loads
        ldparam r3, out
        mov.b64 r4, r0
        mov.b64 r5, 0
        setp.ge.i64 p0, r5, r1
   @p0  bra TIMED
WARM:   ld.global.b64 r4, [r4]
        add.i64 r5, r5, 1
        setp.lt.i64 p0, r5, r1
   @p0  bra WARM
TIMED:  add.i64 r6, r4, 0               // waits for the last warm-up load
        s2r r7, %clock
        mov.b64 r5, 0
LOOP:   ld.global.b64 r4, [r4]          // each load needs the one before: pure latency
        add.i64 r5, r5, 1
        setp.lt.i64 p0, r5, r2
   @p0  bra LOOP
        add.i64 r6, r4, 0               // waits for the last timed load
        s2r r8, %clock
        sub.i64 r8, r8, r7
        st.global.b64 [r3], r8
        st.global.b64 [r3+8], r4
        exit
"""


LOADED_WARM_LOADS = 8   # chase loads left out of the timing while the streams beside it ramp up


def _loaded_chase_kernel() -> str:
    """Latency under load: block 0's thread 0 follows the chase of PCHASE_GLOBAL while every other
    block runs the read stream of _stream_kernel (4 loads in flight a thread) over `b`, with the
    block index and grid size taken without block 0 (the CUDA twin: measure_gpu.py loaded_chase)."""
    chase = PCHASE_GLOBAL.split("\n")
    body = chase[chase.index("        ldparam r0, table"):chase.index("        exit") + 1]
    stream = _stream_kernel("read").split("\n")
    head = [ln for ln in stream if ln.startswith(".param")] + chase[1:6]
    start = stream.index("        s2r r2, %tid.x") + 1
    at = body.index("        s2r r8, %clock")
    body.insert(at + 1, "        st.global.b64 [r3+16], r8          // the chase's end, to check the streams outlast it")
    lines = [".kernel pchase_loaded"] + head + [
        "        s2r r20, %ctaid.x",
        "        setp.ne.i64 p1, r20, 0",
        "   @p1  bra STREAM",
        "        s2r r21, %tid.x",
        "        setp.ne.i64 p1, r21, 0",
        "   @p1  exit"] + body + [
        "STREAM: s2r r0, %ctaid.x", "        s2r r1, %ntid.x", "        s2r r2, %tid.x",
        "        sub.i64 r0, r0, 1                 // streaming blocks are numbered from block 1"]
    for ln in stream[start:]:
        lines.append(ln.replace("LOOP", "SLOOP"))
        if ln.startswith("        s2r r4, %nctaid.x"):
            lines.append("        sub.i64 r4, r4, 1")
    return "\n".join(ln for ln in lines if ln) + "\n"


def chase_table(nbytes: int, stride: int, base: int, keep=None, seed: int = 1) -> tuple[np.ndarray, int]:
    """A u64 table over `nbytes` whose elements `stride` apart (those whose address `keep`
    accepts) form one random cycle of absolute addresses (a random visiting order, closed). Returns the
    table and the offset of the first element of the cycle."""
    n = max(nbytes // stride, 1)
    addr = base + np.arange(n, dtype=np.int64) * stride
    idx = np.flatnonzero(keep(addr)) if keep is not None else np.arange(n)
    rng = np.random.default_rng(seed)
    m = len(idx)
    perm = rng.permutation(m)        # visiting order; each element points at the next one in it
    order = np.empty(m, np.int64)
    order[perm] = np.roll(perm, -1)
    table = np.zeros(n * (stride // 8), np.uint64)
    words = stride // 8
    table[idx * words] = addr[idx[order]].astype(np.uint64)
    return table, int(idx[0]) * stride


def micro_latency(machine, p: dict, out: MicroResult) -> float:
    _need(p["footprint_kib"] > 0, "--param footprint_kib", f"{p['footprint_kib']} is not a size", "a size > 0")
    _need(p["stride_bytes"] >= 8 and p["stride_bytes"] % 8 == 0, "--param stride_bytes",
          f"{p['stride_bytes']} is not a multiple of 8", "8, 16, ... bytes")
    _need(p["loads"] > 0 and p["warmup"] >= 0, "--param loads", "loads must be > 0 and warmup >= 0",
          "loads >= 1, warmup >= 0")
    prog = assemble(PCHASE_GLOBAL)
    nbytes = int(p["footprint_kib"] * 1024) // p["stride_bytes"] * p["stride_bytes"]
    _need(nbytes >= p["stride_bytes"], "--param footprint_kib", "footprint smaller than one stride",
          f">= {p['stride_bytes']} bytes")
    _need(p["half"] in ("all", "near", "far"), "--param half", f"{p['half']!r}", "all, near or far")
    check_device(machine, nbytes, "the chase table", "--param footprint_kib", "a smaller footprint")
    keep = None
    if p["half"] != "all":
        _gpu_only(machine, "latency half=" + p["half"])
        from archsim.engine.mem_state import l2_half_of, near_half_of_core

        near = near_half_of_core(machine, 0)  # block 0 runs on core 0
        keep = (lambda a: l2_half_of(machine, a) == near) if p["half"] == "near" else \
            (lambda a: l2_half_of(machine, a) != near)
    occ = p["beside_occupancy"]
    _need(0 <= occ <= 1, "--param beside_occupancy", f"{occ} is out of range", "0 (alone) or 0 < x <= 1")
    launch = Launch((1, 1, 1), (1, 1, 1))
    probe = {"table": np.zeros(nbytes // 8, np.uint64), "warm": 0, "loads": 0, "start": 0,
             "out": np.zeros(2, np.int64)}
    if occ > 0:
        _gpu_only(machine, "latency beside_occupancy")
        _need(p["warmup"] == 0, "--param warmup", f"{p['warmup']} passes beside streams would need streams as long "
              "as the passes (the chase's first 8 loads are left out of the timing instead)",
              "warmup=0 with beside_occupancy")
        prog = assemble(_loaded_chase_kernel())
        streams = _occupancy_launch(machine, occ, prog)
        launch = Launch((streams.blocks + 1, 1, 1), streams.block)
        threads = streams.blocks * streams.threads_per_block
        # each stream iteration waits for a DRAM round trip at least as long as one chase load, so
        # streams of (chase loads + 8) iterations are still running when the chase ends
        chunks = threads * 4 * (LOADED_WARM_LOADS + p["loads"] + 8)
        probe.update(a=0, c=0, b=Unbacked(chunks * 16), chunks=chunks, out=np.zeros(3, np.int64))
    base = buffer_addresses(prog, probe)["table"]
    table, start = chase_table(nbytes, p["stride_bytes"], base, keep)
    n = int(np.count_nonzero(table))
    warm = LOADED_WARM_LOADS if occ > 0 else p["warmup"] * n
    args = dict(probe, table=table, warm=warm, loads=p["loads"], start=start)
    t = _time(prog, machine, launch, args, "pchase_loaded" if occ > 0 else "pchase", out)
    out.extra["loads_timed"] = p["loads"]
    if occ > 0:
        out.extra["stream_gbps"] = chunks * 16 / stats.seconds(machine, t.cycles) / 1e9
        out.extra["stream_warps_per_core"] = threads // machine.cores.warp_width // (
            machine.groups * machine.cores.per_group)
        out.extra["chase_end_cycle"] = int(t.buffers["out"][2])
    return float(t.buffers["out"][0]) / p["loads"]


def _stream_kernel(kind: str, unroll: int = 4) -> str:
    """Grid-stride streaming over 16-byte chunks, `unroll` independent chunks per thread per
    iteration (so several loads are in flight per warp, as a bandwidth benchmark does). Each
    chunk takes 4 registers (8 for triad's two operands) from r16 on: read, write and copy use
    32 registers a thread, as their CUDA twins (scripts/measure_gpu.py) compile to, so a full
    machine of 256-thread blocks fits the register file."""
    step = 8 if kind == "triad" else 4
    lines = [f".kernel stream_{kind}", ".param a", ".param b", ".param c", ".param chunks",
             "        s2r r0, %ctaid.x", "        s2r r1, %ntid.x", "        s2r r2, %tid.x",
             "        mad.i64 r3, r0, r1, r2            // i = global thread index",
             "        s2r r4, %nctaid.x", "        mul.i64 r4, r4, r1                // S = threads in the grid",
             "        shl.b64 r3, r3, 4                 // byte offset of chunk i",
             "        shl.b64 r5, r4, 4                 // byte stride between a thread's chunks",
             "        ldparam r6, chunks", "        shl.b64 r6, r6, 4                 // bytes in each array",
             "        ldparam r7, a", "        ldparam r8, b", "        ldparam r9, c",
             "        mov.f32 r11, 1.0", "        mov.f32 r12, 0.0"]
    if kind == "write":  # the values stored: defined once
        lines += [f"        mov.f32 r{16 + step * u + j}, 1.0" for u in range(unroll) for j in range(4)]
    # chunk u: regs 16 + step*u .. (4 for b, then triad's 4 for c)
    lines.append("LOOP:   setp.ge.i64 p0, r3, r6")
    lines.append("   @p0  exit")
    for u in range(unroll):
        off = "r3" if u == 0 else "r13"
        if u:
            lines.append(f"        mad.i64 r13, r5, {u}, r3")
        if kind in ("read", "copy", "triad"):
            lines.append(f"        add.i64 r14, r8, {off}")
            lines.append(f"        ld.global.v4.b32 r{16 + step * u}, [r14]")
        if kind == "triad":
            lines.append(f"        add.i64 r14, r9, {off}")
            lines.append(f"        ld.global.v4.b32 r{20 + step * u}, [r14]")
    for u in range(unroll):
        off = "r3" if u == 0 else "r13"
        v = 16 + step * u
        if u:
            lines.append(f"        mad.i64 r13, r5, {u}, r3")
        if kind == "read":
            lines.append(f"        add.f32 r12, r12, r{v}")
        elif kind == "triad":
            for j in range(4):
                lines.append(f"        fma.f32 r{v + j}, r11, r{v + 4 + j}, r{v + j}")
        if kind == "write":
            lines.append(f"        add.i64 r14, r7, {off}")
            lines.append(f"        st.global.v4.b32 [r14], r{v}")
        elif kind in ("copy", "triad"):
            lines.append(f"        add.i64 r14, r7, {off}")
            lines.append(f"        st.global.v4.b32 [r14], r{v}")
    lines.append(f"        mad.i64 r3, r5, {unroll}, r3")
    lines.append("        bra LOOP")
    return "\n".join(lines) + "\n"


STREAM_BYTES_PER_CHUNK = {"read": 16, "write": 16, "copy": 32, "triad": 48}
STREAM_ARRAYS = {"read": 1, "write": 1, "copy": 2, "triad": 3}   # arrays a kernel moves (b | a | b->a | b,c->a)
F64_123 = 0x405EC00000000000   # the bits of 123.0: gpu-stream's read stores only a value it never holds


def _thread_stream_kernel(kind: str, shared_bytes: int) -> str:
    """gpu-benches' gpu-stream kernels: thread i moves element i (8 bytes) of each array and exits;
    read: load b[i], store it to a[i] only when it is 123.0 (never: the load is consumed, nothing
    written); write (gpu-stream's init): a[i] = 0.23; copy (scale): a[i] = 1.2 b[i]; triad: a[i] =
    1.2 b[i] + c[i]. `shared_bytes` of shared memory a block that nothing touches (its "spoiler")
    bound the blocks a core holds."""
    lines = [f".kernel gpu_stream_{kind}", f".shared {shared_bytes}", ".param a", ".param b", ".param c",
             ".param n",
             "        s2r r0, %ctaid.x", "        s2r r1, %ntid.x", "        s2r r2, %tid.x",
             "        mad.i64 r3, r0, r1, r2            // i: one element a thread",
             "        ldparam r6, n", "        setp.ge.i64 p0, r3, r6", "   @p0  exit",
             "        shl.b64 r3, r3, 3", "        ldparam r7, a", "        add.i64 r7, r7, r3"]
    if kind != "write":
        lines += ["        ldparam r8, b", "        add.i64 r8, r8, r3", "        ld.global.b64 r16, [r8]"]
    if kind == "triad":
        lines += ["        ldparam r9, c", "        add.i64 r9, r9, r3", "        ld.global.b64 r17, [r9]",
                  "        fma.f64 r16, r16, 1.2, r17"]
    if kind == "read":
        lines += [f"        setp.eq.i64 p1, r16, {F64_123}", "   @p1  st.global.b64 [r7], r16"]
    elif kind == "write":
        lines += ["        mov.f64 r16, 0.23", "        st.global.b64 [r7], r16"]
    else:
        if kind == "copy":
            lines.append("        mul.f64 r16, r16, 1.2")
        lines.append("        st.global.b64 [r7], r16")
    lines.append("        exit")
    return "\n".join(lines) + "\n"


def _thread_stream(machine, p: dict, out: MicroResult) -> float:
    """GB/s of gpu-stream's shape: a launch of one element a thread over footprint_mib per array,
    blocks of `block` threads, `blocks_per_core` of them on a core at once (each takes just over
    1 / (blocks_per_core + 1) of the largest shared-memory carve-out). Timed from its first waves
    (archsim.sample) when it has many."""
    kind, block, bpc = p["kind"], p["block"], p["blocks_per_core"]
    c = machine.cores
    _need(p["occupancy"] == 1.0 and p["unroll"] == 4, "--param occupancy / unroll",
          "with block > 0 the occupancy is block x blocks_per_core and a thread moves one element",
          "leave occupancy and unroll out")
    _need(bpc >= 1, "--param blocks_per_core", f"{bpc} is not a count", ">= 1")
    _need(block % c.warp_width == 0 and block // c.warp_width * bpc <= c.warp_slots, "--param block",
          f"{block} threads x {bpc} blocks", f"a multiple of {c.warp_width} with block x blocks_per_core "
                                              f"<= {c.warp_slots * c.warp_width} threads a core")
    sp = machine.scratchpad
    largest = max([k for k in (sp.carveouts_kib or ()) if k <= sp.size_kib] or [sp.size_kib]) * 1024
    reserved = sp.reserved_per_block_bytes if sp.kind == "shared" else 0
    shared = -(-(largest // (bpc + 1) + 1 - reserved) // 128) * 128
    prog = assemble(_thread_stream_kernel(kind, max(shared, 128)))
    n = max(int(p["footprint_mib"] * 2**20) // 8, block)
    launch = Launch((-(-n // block), 1, 1), (block, 1, 1))
    held = blocks_per_core(prog, machine, launch)
    _need(held == bpc, "--param blocks_per_core", f"a core holds {held} blocks of {block} threads of this kernel",
          f"{held} here (warp slots, registers and block slots bound it)")
    nb = n * 8
    args = {"a": Unbacked(nb), "b": Unbacked(nb), "c": Unbacked(nb), "n": n}
    t = _time(prog, machine, launch, args, f"gpu_stream_{kind}", out, sample=True)
    gbps = n * 8 * STREAM_ARRAYS[kind] / stats.seconds(machine, t.cycles) / 1e9
    out.extra["peak_dram_gbps"] = peak_bandwidth_gbps(machine)["dram"]
    out.extra["share_of_peak"] = gbps / out.extra["peak_dram_gbps"]
    out.extra["warps_per_core"] = bpc * block // c.warp_width
    return gbps


def _occupancy_launch(machine, occupancy: float, prog: Program, max_block_warps: int = 8) -> Launch:
    """Blocks filling `occupancy` of every core's warp slots, spread over all cores: at most as
    many per core as it holds at once (registers, block slots), so that a grid-stride kernel runs
    as one wave instead of leaving a second, partial one for the end."""
    c = machine.cores
    cores = machine.groups * c.per_group
    warps = max(1, int(round(occupancy * c.warp_slots)))
    per_block = min(warps, max_block_warps)
    while warps % per_block:
        per_block -= 1
    launch = Launch((cores * (warps // per_block), 1, 1), (per_block * c.warp_width, 1, 1))
    fit = blocks_per_core(prog, machine, launch)
    return launch if warps // per_block <= fit else Launch((cores * fit, 1, 1), launch.block)


def micro_bandwidth(machine, p: dict, out: MicroResult) -> float:
    kind = p["kind"]
    _need(kind in STREAM_BYTES_PER_CHUNK, "--param kind", f"{kind!r} is not a kernel", "read, write, copy or triad")
    _need(0 < p["occupancy"] <= 1, "--param occupancy", f"{p['occupancy']} is out of range", "0 < occupancy <= 1")
    _need(p["footprint_mib"] > 0, "--param footprint_mib", f"{p['footprint_mib']} is not a size", "> 0")
    _need(p["placement"] in ("private", "cross"), "--param placement", f"{p['placement']!r}", "private or cross")
    _need(p["unroll"] in (1, 2, 4, 8), "--param unroll", f"{p['unroll']} is not offered", "1, 2, 4 or 8")
    if machine.dma is not None:
        _need(p["unroll"] == 4, "--param unroll", "a Sunway stream moves DMA blocks", "leave unroll out")
        _need(p["cores"] == 0, "--param cores", "a Sunway stream runs on every CPE", "leave cores out")
        _need(p["block"] == 0, "--param block", "a Sunway stream runs on every CPE", "leave block out")
        return _sunway_bandwidth(machine, p, out)
    _gpu_only(machine, "bandwidth")
    all_cores = machine.groups * machine.cores.per_group
    _need(0 <= p["cores"] <= all_cores, "--param cores", f"{p['cores']} is out of range", f"0 .. {all_cores}")
    if p["cores"]:  # the cores left out would idle: a machine without them streams the same
        machine = machine.model_copy(update={"cores": machine.cores.model_copy(update={"per_group": p["cores"]})})
    _need(p["block"] >= 0, "--param block", f"{p['block']} is not a block size", "0 or a thread count")
    if p["block"]:
        return _thread_stream(machine, p, out)
    prog = assemble(_stream_kernel(kind, p["unroll"]))
    launch = _occupancy_launch(machine, p["occupancy"], prog)
    threads = launch.blocks * launch.threads_per_block
    # the footprint is the bytes moved; each thread does whole unrolled iterations
    per_iter = threads * p["unroll"]
    chunks = max(int(p["footprint_mib"] * 2**20) // STREAM_BYTES_PER_CHUNK[kind] // per_iter, 1) * per_iter
    nb = chunks * 16
    args = {"a": Unbacked(nb), "b": Unbacked(nb), "c": Unbacked(nb), "chunks": chunks}
    t = _time(prog, machine, launch, args, f"stream_{kind}", out)
    useful = chunks * STREAM_BYTES_PER_CHUNK[kind]
    gbps = useful / stats.seconds(machine, t.cycles) / 1e9
    out.extra["peak_dram_gbps"] = peak_bandwidth_gbps(machine)["dram"]
    out.extra["share_of_peak"] = gbps / out.extra["peak_dram_gbps"]
    out.extra["warps_per_core"] = launch.blocks * launch.threads_per_block // machine.cores.warp_width // (
        machine.groups * machine.cores.per_group)
    return gbps


# ----------------------------------------------------------------------------- Sunway streaming


def sw_stream_kernel(kind: str, per_group: int, blk: int) -> str:
    """The Sunway streaming kernel: every active CPE moves its own contiguous part of the arrays
    through its LDM in blocks of `blk` bytes with DMA, as an athread kernel does. CPE k of core
    group g (``%coreid``) works on ``buf + g*gstride + k*per_cpe`` (+ ``astride`` per array:
    a, b, c); CPEs with k >= ``active`` exit. read: get b, sum it from the LDM (double
    buffered: block i+1 is on its way while block i is read); write: put a from the LDM (two puts
    in flight); copy: a = b; triad: a = b + 2 c (get b / c block i+1 while block i is computed
    and put). LDM: b slots at 0 and blk, c slots at 2 blk and 3 blk."""
    B = blk
    rows = blk // 512          # 32 lanes x 16 B per LDM access
    head = [f".kernel swstream_{kind}", f".shared {4 * B if kind == 'triad' else 2 * B}",
            ".param buf", ".param gstride", ".param astride", ".param active", ".param per_cpe", ".param nblk",
            "        s2r r0, %coreid",
            f"        div.i64 r1, r0, {per_group}       // core group",
            f"        rem.i64 r2, r0, {per_group}       // CPE in its group",
            "        ldparam r3, active",
            "        setp.ge.i64 p0, r2, r3",
            "   @p0  exit",
            "        ldparam r4, buf",
            "        ldparam r5, gstride",
            "        mad.i64 r4, r1, r5, r4            // the group's region",
            "        ldparam r6, per_cpe",
            "        mad.i64 r4, r2, r6, r4            // this CPE's part of a",
            "        ldparam r7, astride",
            "        add.i64 r8, r4, r7                // b",
            "        add.i64 r9, r8, r7                // c",
            "        ldparam r10, nblk",
            f"        mov.b64 r11, {B}",
            "        mov.b64 r12, 0                    // block i",
            "        s2r r13, %laneid",
            "        shl.b64 r13, r13, 4               // the lane's 16 B of a 512-B LDM row",
            "        mov.f32 r14, 0.0",
            "        mov.f32 r15, 2.0",
            "        mov.b64 r30, 0"]
    L = head
    if kind == "read":
        L += ["        dma.get [r30], [r8], r11",
              "LOOP:   add.i64 r16, r12, 1",
              "        setp.ge.i64 p1, r16, r10",
              "   @p1  bra LAST",
              "        and.b64 r17, r16, 1",
              f"        mul.i64 r17, r17, {B}",
              f"        mul.i64 r18, r16, {B}",
              "        add.i64 r18, r18, r8",
              "        dma.get [r17], [r18], r11       // block i+1 on its way",
              "        dma.wait 1                       // block i is in",
              "        bra BODY",
              "LAST:   dma.wait 0",
              "BODY:   and.b64 r19, r12, 1",
              f"        mul.i64 r19, r19, {B}",
              "        add.i64 r19, r19, r13"]
        for u in range(rows):
            L += [f"        ld.shared.v4.b32 r20, [r19+{u * 512}]", "        add.f32 r14, r14, r20"]
        L += ["        mov.b64 r12, r16", "        setp.lt.i64 p0, r12, r10", "   @p0  bra LOOP", "        exit"]
    elif kind == "write":
        L += ["LOOP:   and.b64 r17, r12, 1",
              f"        mul.i64 r17, r17, {B}",
              f"        mul.i64 r18, r12, {B}",
              "        add.i64 r18, r18, r4",
              "        dma.put [r18], [r17], r11",
              "        dma.wait 1",
              "        add.i64 r12, r12, 1", "        setp.lt.i64 p0, r12, r10", "   @p0  bra LOOP",
              "        dma.wait 0", "        exit"]
    else:
        L += ["        dma.get [r30], [r8], r11"]
        if kind == "triad":
            L += [f"        mov.b64 r31, {2 * B}", "        dma.get [r31], [r9], r11"]
        L += ["LOOP:   dma.wait 0                       // block i is in, the put of i-1 is out",
              "        add.i64 r16, r12, 1",
              "        setp.ge.i64 p1, r16, r10",
              "   @p1  bra BODY",
              "        and.b64 r17, r16, 1",
              f"        mul.i64 r17, r17, {B}",
              f"        mul.i64 r18, r16, {B}",
              "        add.i64 r21, r18, r8",
              "        dma.get [r17], [r21], r11       // b block i+1"]
        if kind == "triad":
            L += ["        add.i64 r21, r18, r9",
                  f"        add.i64 r17, r17, {2 * B}",
                  "        dma.get [r17], [r21], r11       // c block i+1"]
        L += ["BODY:   and.b64 r19, r12, 1",
              f"        mul.i64 r19, r19, {B}           // b slot of block i"]
        if kind == "triad":
            L += ["        add.i64 r22, r19, r13"]
            for u in range(rows):
                o = u * 512
                L += [f"        ld.shared.v4.b32 r24, [r22+{o}]", f"        ld.shared.v4.b32 r28, [r22+{2 * B + o}]"]
                L += [f"        fma.f32 r{24 + j}, r15, r{28 + j}, r{24 + j}" for j in range(4)]
                L += [f"        st.shared.v4.b32 [r22+{o}], r24"]
        L += [f"        mul.i64 r18, r12, {B}",
              "        add.i64 r18, r18, r4",
              "        dma.put [r18], [r19], r11       // a block i",
              "        mov.b64 r12, r16", "        setp.lt.i64 p0, r12, r10", "   @p0  bra LOOP",
              "        dma.wait 0", "        exit"]
    return "\n".join(L) + "\n"


def sw_stream_setup(machine, p: dict, buf_at=None):
    """(program, launch, args, layout) of `micro bandwidth` on a Sunway machine (see
    _sunway_bandwidth); ``buf_at`` overrides the buffer argument (a backed array in tests)."""
    from archsim.config.derived import scratch_usable_kib
    from archsim.engine import dram as DR
    from archsim.engine.launch import ALIGN, GLOBAL_BASE

    kind = p["kind"]
    pg, groups = machine.cores.per_group, machine.groups
    ldm = scratch_usable_kib(machine) * 1024
    slots = 4 if kind == "triad" else 2
    blk = 8192                 # choice: 8 KiB per transfer, the size athread kernels stream in ([M] rates are for >= 8 KiB)
    while slots * blk > ldm and blk > 512:
        blk //= 2
    active = max(1, int(round(p["occupancy"] * pg)))
    workers = groups * active
    narr = STREAM_ARRAYS[kind]
    per_array = int(p["footprint_mib"] * 2**20) // narr
    nblk = max(1, per_array // (workers * blk))
    per_cpe = nblk * blk
    astride = -(-active * per_cpe // ALIGN) * ALIGN
    region = 3 * astride
    if p["placement"] == "private":
        seg = DR.segment_bytes(machine)
        _need(seg > 0, "--param placement", f"{machine.name} has no private segments", "cross")
        at, gstride = GLOBAL_BASE, seg   # group g's region in its own segment, at the same offset
        _need(at + region <= seg, "--param footprint_mib", f"a group's {region} bytes do not fit its private "
              f"segment of {seg} bytes", "a smaller footprint")
    else:
        at, gstride = max(DR.cross_base(machine), GLOBAL_BASE), region
    span = (groups - 1) * gstride + region
    buf = buf_at if buf_at is not None else Unbacked(span, at=at)
    args = {"buf": buf, "gstride": gstride, "astride": astride, "active": active, "per_cpe": per_cpe, "nblk": nblk}
    prog = assemble(sw_stream_kernel(kind, pg, blk))
    launch = Launch((groups * pg, 1, 1), (machine.cores.warp_width, 1, 1))
    layout = {"block_bytes": blk, "cpes_per_group": active, "blocks_per_cpe": nblk, "address": at,
              "group_stride_bytes": gstride, "array_stride_bytes": astride,
              "moved_bytes": narr * workers * per_cpe}
    return prog, launch, args, layout


def _sunway_bandwidth(machine, p: dict, out: MicroResult) -> float:
    """`micro bandwidth` on a Sunway: CPEs stream with DMA through their LDM (sw_stream_kernel);
    ``occupancy`` is the share of each core group's CPEs taking part; ``placement`` private puts
    each group's arrays in its own segment (its own controller, no ring hop), cross puts them in
    the cross segment, interleaved over every controller (most traffic crosses the ring)."""
    prog, launch, args, lay = sw_stream_setup(machine, p)
    t = _time(prog, machine, launch, args, prog.name, out)
    moved = lay["moved_bytes"]
    gbps = moved / stats.seconds(machine, t.cycles) / 1e9
    workers = machine.groups * lay["cpes_per_group"]
    fab = t.memory["fabric"]
    ring = [x for x in fab["links"] if x["name"].split(" ", 1)[-1].startswith("ring ")]  # stop-to-stop links
    out.extra.update({k: v for k, v in lay.items() if k != "address"})
    out.extra["peak_dram_gbps"] = peak_bandwidth_gbps(machine)["dram"]
    out.extra["share_of_peak"] = gbps / out.extra["peak_dram_gbps"]
    out.extra["per_cpe_gbps"] = gbps / workers
    out.extra["ring_link_util_max"] = max((x["util"] for x in ring), default=0.0)
    out.extra["ring_link_util_mean"] = sum(x["util"] for x in ring) / len(ring) if ring else 0.0
    out.extra["ring_blocked_cycles"] = sum(x["blocked_cycles"] for x in ring)
    return gbps


MMA_FORMS = {  # dtype -> (mnemonic, A regs, B regs, C regs, flops per warp op)
    "fp16": ("mma.m16n8k16.f32.f16", 4, 2, 4, 2 * 16 * 8 * 16),
    "bf16": ("mma.m16n8k16.f32.bf16", 4, 2, 4, 2 * 16 * 8 * 16),
    "tf32": ("mma.m16n8k8.f32.tf32", 4, 2, 4, 2 * 16 * 8 * 8),
    "fp64": ("mma.m8n8k4.f64", 1, 1, 2, 2 * 8 * 8 * 4),
}


def mma_kernel(dtype: str, chains: int = 8) -> str:
    """A loop of `chains` independent MMAs per iteration (independent accumulators, so the
    tensor units, not the MMA latency, bound the rate)."""
    mn, na, nb, nc, _ = MMA_FORMS[dtype]
    lines = [f".kernel mma_{dtype}", ".param iters"]
    for r in range(na + nb):
        lines.append(f"        mov.b64 r{r}, 0")
    acc0 = 16
    for i in range(chains * nc):
        lines.append(f"        mov.b64 r{acc0 + i}, 0")
    lines += ["        ldparam r8, iters", "        mov.b64 r9, 0", "LOOP:"]
    for i in range(chains):
        c = acc0 + i * nc
        lines.append(f"        {mn} r{c}, r0, r{na}, r{c}")
    lines += ["        add.i64 r9, r9, 1", "        setp.lt.i64 p0, r9, r8", "   @p0  bra LOOP", "        exit"]
    return "\n".join(lines) + "\n"


def micro_mma(machine, p: dict, out: MicroResult) -> float:
    dt = p["dtype"]
    _need(dt in MMA_FORMS, "--param dtype", f"{dt!r} has no MMA form", ", ".join(MMA_FORMS))
    caps = capabilities(machine)
    _need(dt in caps.tensor_dtypes, f"micro mma on {machine.name}", f"the machine's tensor units do not run {dt}",
          ", ".join(caps.tensor_dtypes) or "none: the machine has no tensor units")
    _need(p["iterations"] > 0, "--param iterations", "must be > 0", ">= 1")
    prog = assemble(mma_kernel(dt))
    c = machine.cores
    warps = min(c.warp_slots, 2 * c.subcores)  # two warps per scheduler hide the issue gaps
    launch = Launch((machine.groups * c.per_group, 1, 1), (warps * c.warp_width, 1, 1))
    t = _time(prog, machine, launch, {"iters": p["iterations"]}, f"mma_{dt}", out)
    return t.flops / stats.seconds(machine, t.cycles) / 1e12


WGMMA_N = (16, 32, 64, 96, 128, 192, 256)


def wgmma_kernel(dtype: str, n: int, registers: bool) -> str:
    """Each warpgroup of the block issues 4 wgmma.m64nNk16 a loop iteration into one accumulator,
    commits them as a group and waits for the one before (wait_group 1), as a GEMM's main loop
    does: the tensor units (or the operands' shared-memory reads) bound the rate. The operands lie
    in the scratchpad as 128-byte swizzled rows (A 64 of them, B N); their values do not matter."""
    src = "f16" if dtype == "fp16" else "bf16"
    op = f"wgmma.m64n{n}k16.f32.{src}" + (".rs" if registers else "")
    kmaj = (1024 >> 4) << 32 | 1 << 62
    lines = [f".kernel wgmma_{dtype}_n{n}{'_rs' if registers else ''}", ".param iters", f".regs {n // 2 + 16}",
             f".shared {8192 + 128 * n}"]
    lines += [f"        mov.b64 r{r}, 0" for r in range(4)]              # the .rs A fragment
    lines += [f"        mov.b64 r4, {kmaj}", f"        mov.b64 r5, {kmaj | 8192 >> 4}"]
    lines += [f"        mov.f32 r{16 + i}, 0.0" for i in range(n // 2)]
    lines += ["        ldparam r8, iters", "        mov.b64 r9, 0", "        wgmma.fence", "LOOP:"]
    lines += [f"        {op} r16, {'r0' if registers else 'r4'}, r5, 0"] * 4
    lines += ["        wgmma.commit_group", "        wgmma.wait_group 1", "        add.i64 r9, r9, 1",
              "        setp.lt.i64 p0, r9, r8", "   @p0  bra LOOP", "        wgmma.wait_group 0", "        exit"]
    return "\n".join(lines) + "\n"


def micro_wgmma(machine, p: dict, out: MicroResult) -> float:
    """Warpgroup MMA throughput (machines with tensor.wgmma): every core runs ``warpgroups``
    warpgroups of wgmma_kernel's loop."""
    _gpu_only(machine, "wgmma")
    caps = capabilities(machine)
    _need("wgmma" in caps.features, f"micro wgmma on {machine.name}", "the machine has no warpgroup MMA",
          "a machine with tensor.wgmma (h100)")
    _need(p["dtype"] in ("fp16", "bf16"), "--param dtype", repr(p["dtype"]), "fp16 or bf16")
    _need(p["n"] in WGMMA_N, "--param n", str(p["n"]), ", ".join(map(str, WGMMA_N)))
    _need(p["a"] in ("shared", "registers"), "--param a", repr(p["a"]), "shared or registers")
    _need(p["iterations"] > 0, "--param iterations", "must be > 0", ">= 1")
    c = machine.cores
    _need(1 <= p["warpgroups"] <= c.warp_slots // 4, "--param warpgroups", str(p["warpgroups"]),
          f"1 to {c.warp_slots // 4} (the warp slots of a core)")
    prog = assemble(wgmma_kernel(p["dtype"], p["n"], p["a"] == "registers"))
    launch = Launch((machine.groups * c.per_group, 1, 1), (4 * p["warpgroups"] * c.warp_width, 1, 1))
    t = _time(prog, machine, launch, {"iters": p["iterations"]}, prog.name, out)
    return t.flops / stats.seconds(machine, t.cycles) / 1e12


TMA_DTYPES = {"fp16": 2, "fp32": 4}


def tma_kernel(rank: int, stages: int, stage_bytes: int) -> str:
    """One warp a block streams boxes of a tensor into ``stages`` scratchpad buffers with
    cp.async.bulk.tensor, each completing on its own mbarrier: box i of block b is tile
    b + i * nctaid of the tensor's tiles (tiles_x across), loaded into stage i % stages once the
    box before it there has landed (the wait on that stage's barrier), so ``stages`` copies are in
    flight. out[b] gets the cycles from the first copy's issue to the last one's landing. With
    rank 1 the tensor is a row of tiles; rank 2 a grid of tiles_x across."""
    lines = [f".kernel tma_stream_{rank}d", ".param map", ".param out", ".param copies", ".param tiles_x",
             ".param box_x", ".param box_y", ".param tbytes", ".param tensor",
             f".shared {1024 + stages * stage_bytes}",
             "        s2r r0, %ctaid.x", "        s2r r1, %nctaid.x", "        ldparam r2, map",
             "        ldparam r3, copies", "        ldparam r14, tbytes", "        mov.b64 r4, 0", "        mov.b64 r6, 1",
             "INIT:   shl.b64 r5, r4, 3", "        mbarrier.init [r5], r6", "        add.i64 r4, r4, 1",
             f"        setp.lt.i64 p0, r4, {stages}", "   @p0  bra INIT",
             "        ldparam r15, tiles_x", "        ldparam r16, box_x", "        ldparam r17, box_y",
             "        s2r r30, %clock", "        mov.b64 r4, 0",
             f"LOOP:   rem.i64 r5, r4, {stages}", f"        div.i64 r6, r4, {stages}", "        shl.b64 r7, r5, 3",
             f"        mul.i64 r8, r5, {stage_bytes}", "        add.i64 r8, r8, 1024",
             f"        setp.lt.i64 p0, r4, {stages}", "   @p0  bra ISSUE",
             "        sub.i64 r9, r6, 1", "        and.b64 r9, r9, 1", "        mbarrier.wait [r7], r9",
             "ISSUE:  mad.i64 r10, r4, r1, r0", "        rem.i64 r11, r10, r15", "        div.i64 r13, r10, r15",
             "        mul.i64 r12, r11, r16", "        mul.i64 r13, r13, r17",
             "        mbarrier.arrive.expect_tx [r7], r14",
             f"        cp.async.bulk.tensor.{rank}d [r8], [r7], r2, r12",
             "        add.i64 r4, r4, 1", "        setp.lt.i64 p0, r4, r3", "   @p0  bra LOOP",
             # the last use of each stage: stage s was used u = (copies - s + stages - 1) / stages times
             "        mov.b64 r4, 0",
             f"DRAIN:  sub.i64 r5, r3, r4", f"        add.i64 r5, r5, {stages - 1}", f"        div.i64 r5, r5, {stages}",
             "        setp.le.i64 p0, r5, 0", "   @p0  bra NEXT", "        sub.i64 r9, r5, 1", "        and.b64 r9, r9, 1",
             "        shl.b64 r7, r4, 3", "        mbarrier.wait [r7], r9",
             "NEXT:   add.i64 r4, r4, 1", f"        setp.lt.i64 p0, r4, {stages}", "   @p0  bra DRAIN",
             "        s2r r31, %clock", "        sub.i64 r31, r31, r30", "        ldparam r20, out",
             "        shl.b64 r21, r0, 3", "        add.i64 r20, r20, r21", "        st.global.b64 [r20], r31", "        exit"]
    return "\n".join(lines) + "\n"


def micro_tma(machine, p: dict, out: MicroResult) -> float:
    """Bulk tensor copy bandwidth (and, with one block of one stage, latency): ``blocks_per_core``
    one-warp blocks on every core (or ``cores``) each stream ``copies`` boxes of box_cols x
    box_rows elements of a tensor that holds each box once (tma_kernel), ``stages`` in flight a
    block. The value: box bytes a second over the launch; extra: cycles a copy in block 0 (issue
    to landed, ``stages`` overlapping) and the TMA units' mean copy latency."""
    _gpu_only(machine, "tma")
    _need("tma" in capabilities(machine).features, f"micro tma on {machine.name}",
          "the machine has no tensor memory accelerator", "a machine with tma (h100)")
    _need(p["dtype"] in TMA_DTYPES, "--param dtype", repr(p["dtype"]), ", ".join(TMA_DTYPES))
    eb = TMA_DTYPES[p["dtype"]]
    bx, by = p["box_cols"], p["box_rows"]
    _need(1 <= bx <= 256 and bx * eb % 16 == 0, "--param box_cols", str(bx),
          "1 .. 256 elements whose bytes are a multiple of 16")
    _need(1 <= by <= 256, "--param box_rows", str(by), "1 .. 256")
    _need(p["copies"] >= 1, "--param copies", str(p["copies"]), ">= 1")
    _need(1 <= p["stages"] <= 16, "--param stages", str(p["stages"]), "1 .. 16")
    all_cores = machine.groups * machine.cores.per_group
    _need(0 <= p["cores"] <= all_cores, "--param cores", str(p["cores"]), f"0 .. {all_cores}")
    _need(1 <= p["blocks_per_core"] <= machine.cores.max_blocks, "--param blocks_per_core",
          str(p["blocks_per_core"]), f"1 .. {machine.cores.max_blocks}")
    box = bx * by * eb
    stage = -(-box // 128) * 128
    _need(1024 + p["stages"] * stage <= machine.scratchpad.size_kib * 1024, "--param stages",
          f"{p['stages']} stages of {stage} bytes", f"at most {machine.scratchpad.size_kib} KiB of scratchpad")
    if p["cores"]:  # the cores left out would idle: a machine without them streams the same
        machine = machine.model_copy(update={"cores": machine.cores.model_copy(update={"per_group": p["cores"]})})
        all_cores = p["cores"]
    blocks = all_cores * p["blocks_per_core"]
    tiles = blocks * p["copies"]
    tiles_x = 8 if by > 1 else tiles                       # rank 1: one row of boxes
    rank = 2 if by > 1 else 1
    rows = -(-tiles // tiles_x) * by
    cols = tiles_x * bx
    check_device(machine, rows * cols * eb, "the tensor", "--param copies", "fewer copies or smaller boxes")
    sw = bx * eb if bx * eb in (32, 64, 128) else 0
    prog = assemble(tma_kernel(rank, p["stages"], stage))
    # out is backed (placed before the tensor, address space only)
    args = {"map": TensorMap("tensor", tensor_map_words([cols, rows][:rank], eb, [bx, by][:rank], sw)),
            "out": np.zeros(blocks, np.int64), "copies": p["copies"], "tiles_x": tiles_x, "box_x": bx,
            "box_y": by if rank == 2 else 0, "tbytes": box, "tensor": shared_buffers(machine, [rows * cols * eb])[0]}
    t = _time(prog, machine, Launch((blocks, 1, 1), (machine.cores.warp_width, 1, 1)), args, prog.name, out)
    out.extra["cycles_per_copy"] = float(t.buffers["out"][0]) / p["copies"]
    out.extra["copy_latency_mean_cycles"] = t.memory["tma"]["latency_mean_cycles"]
    out.extra["box_bytes"] = box
    out.extra["peak_dram_gbps"] = peak_bandwidth_gbps(machine)["dram"]
    return tiles * box / stats.seconds(machine, t.cycles) / 1e9


def dsmem_kernel(kind: str, cluster: int, loads: int) -> str:
    """Distributed shared memory. latency: warp 0 of rank 0 chases ``loads`` dependent 4-byte
    ld.dsmem in the scratchpad of rank cluster-1 (zeros: each address is the word it reads);
    bandwidth: every warp of every block reads ``loads`` (a multiple of 4, four in flight) 16-byte
    words a lane from the next rank's scratchpad (a ring), the last ones awaited. Both end with barrier.cluster, which keeps every
    scratchpad until its readers are done."""
    lines = [f".kernel dsmem_{kind}", ".param out", ".shared 16384", "        s2r r0, %cluster_ctarank",
             "        mov.b64 r5, 0"]
    if kind == "latency":
        lines += [f"        mov.b64 r2, {cluster - 1}", "        mov.b64 r1, 0", "        s2r r3, %tid.x",
                  "        setp.ne.i64 p1, r3, 0", "        setp.ne.i64 p2, r0, 0", "        or.pred p1, p1, p2",
                  "  @p1   bra DONE",
                  "LOOP:   ld.dsmem.b32 r1, [r1], r2", "        add.i64 r5, r5, 1",
                  f"        setp.lt.i64 p0, r5, {loads}", "  @p0   bra LOOP", "        mov.b64 r6, r1"]
    else:
        lines += ["        add.i64 r2, r0, 1", f"        rem.i64 r2, r2, {cluster}", "        s2r r3, %tid.x",
                  "        and.b64 r3, r3, 511", "        shl.b64 r3, r3, 4", "LOOP:"]
        lines += [f"        ld.dsmem.v4.b32 r{8 + 4 * i}, [r3], r2" for i in range(4)]   # 4 in flight a warp
        lines += ["        add.i64 r5, r5, 4", f"        setp.lt.i64 p0, r5, {loads}", "  @p0   bra LOOP",
                  "        mov.b64 r6, r8", "        mov.b64 r7, r20"]
    lines += ["DONE:   barrier.cluster", "        exit"]
    return "\n".join(lines) + "\n"


def micro_dsmem(machine, p: dict, out: MicroResult) -> float:
    """Distributed shared memory between the blocks of thread-block clusters (machines with
    clusters). ``kind`` latency: cycles a remote load (a dependent chain in one cluster, the slope
    over ``loads`` and 2 x loads); bandwidth: GB/s over every SM, clusters of ``cluster`` one-block-
    an-SM (the scratchpad), ``warps`` warps a block each reading its ring neighbour (the slope)."""
    _gpu_only(machine, "dsmem")
    cl = machine.clusters
    _need(cl is not None, f"micro dsmem on {machine.name}", "the machine has no thread-block clusters",
          "a machine with clusters (h100)")
    _need(p["kind"] in ("latency", "bandwidth"), "--param kind", repr(p["kind"]), "latency or bandwidth")
    _need(2 <= p["cluster"] <= cl.max_blocks, "--param cluster", str(p["cluster"]), f"2 .. {cl.max_blocks}")
    _need(p["loads"] >= 1 and (p["kind"] == "latency" or p["loads"] % 4 == 0), "--param loads", str(p["loads"]),
          ">= 1 (bandwidth: a multiple of 4)")
    _need(1 <= p["warps"] <= machine.cores.warp_slots, "--param warps", str(p["warps"]),
          f"1 .. {machine.cores.warp_slots}")
    k = p["cluster"]
    if p["kind"] == "latency":
        launch = Launch((k, 1, 1), (32, 1, 1), cluster=k)
    else:
        clusters = sum(n // k for n in cl.gpc_sms)          # one block an SM: as many as the GPCs hold
        launch = Launch((clusters * k, 1, 1), (32 * p["warps"], 1, 1), cluster=k)
    runs = [(assemble(dsmem_kernel(p["kind"], k, n)), launch, {"out": np.zeros(1, np.int64)}, f"dsmem_{n}")
            for n in (p["loads"], 2 * p["loads"])]
    t1, t2 = _time_many(runs, machine, out)
    extra = t2.cycles - t1.cycles
    out.extra["cycles"] = [int(t1.cycles), int(t2.cycles)]
    if p["kind"] == "latency":
        return extra / p["loads"]
    moved = launch.blocks * p["warps"] * 32 * 16 * p["loads"]
    out.extra["blocks"] = launch.blocks
    return moved / stats.seconds(machine, extra) / 1e9


def micro_gemm(machine, p: dict, out: MicroResult) -> float:
    """C = A @ B (C in ``out``: f32, or f16 / bf16 for fp16 / bf16 inputs) with the workload GEMM
    emitter's kernel for this machine and shape (archsim.workloads.emit.gemm_gpu: the tile rule's
    block tile or ``tile``'s, a multistage cp.async pipeline, swizzled shared memory, ldmatrix and
    mma; FFMA where the tensor units lack the dtype)."""
    from archsim.workloads.emit import gemm_kernel
    from archsim.workloads.emit.gemm_gpu import KERNEL_NAMES, KERNELS

    if machine.family == "sunway":
        return _micro_gemm_sunway(machine, p, out)
    _gpu_only(machine, "gemm")
    M, N, K = p["m"], p["n"], p["k"]
    _need(min(M, N, K) > 0, "--param m/n/k", f"{M}x{N}x{K}", "m, n, k > 0")
    _need(p["dtype"] in GEMM_DTYPES, "--param dtype", repr(p["dtype"]), ", ".join(GEMM_DTYPES))
    _need(p["kernel"] == "auto" or p["kernel"] in KERNELS[1:], "--param kernel", repr(p["kernel"]),
          "auto, " + KERNEL_NAMES)
    outs = ("f32",) + {"fp16": ("f16",), "bf16": ("bf16",)}.get(p["dtype"], ())
    _need(p["out"] in outs, "--param out", f"{p['out']!r} with dtype {p['dtype']}", " or ".join(outs))
    g = gemm_kernel(capabilities(machine), M, N, K, p["dtype"], p["out"], tile=_gemm_tile(p["tile"]),
                    kernel=None if p["kernel"] == "auto" else p["kernel"])
    args = g.args(*shared_buffers(machine, g.buffer_bytes().values()))   # the cross segment
    t = _time(g.program, machine, g.launch, args, g.program.name, out, sample=p["sample"])
    out.kernels[-1]["model_flops"] = g.flops
    tf = g.flops / stats.seconds(machine, t.cycles) / 1e12
    peak = stats.machine_record(machine)["peak_tflops"]
    out.extra["warps"] = g.tile.warps
    out.extra["tile"] = [g.tile.BM, g.tile.BN, g.tile.BK]
    out.extra["stages"] = g.tile.stages
    out.extra["kernel"] = ("tma_pingpong" if g.pingpong else g.kind) + ("_multicast" if g.cluster > 1 else "")
    pk = peak.get(g.dtype if g.kind in ("mma", "wgmma", "tma") else "fp32")
    if pk:
        out.extra["share_of_peak"] = tf / pk
    return tf


def _gemm_tile(text: str):
    """micro gemm's ``tile``: None for auto (the tile rule), else the Tile BMxBNxBK/warps/stages."""
    from archsim.workloads.emit.gemm_gpu import Tile

    if text == "auto":
        return None
    allowed = "auto or BMxBNxBK/warps/stages with BM, BN powers of two from 16 to 256, BK 32 or 64, 4 or 8 warps, " \
              "2-8 stages (as 128x128x64/4/4)"
    try:
        dims, warps, stages = text.split("/")
        bm, bn, bk = (int(v) for v in dims.lower().split("x"))
        warps, stages = int(warps), int(stages)
    except ValueError:
        raise InputError("--param tile", repr(text), allowed) from None
    _need(min(bm, bn) >= 16 and max(bm, bn) <= 256 and bm & (bm - 1) == 0 and bn & (bn - 1) == 0 and bk in (32, 64) and warps in (4, 8)
          and 2 <= stages <= 8, "--param tile", repr(text), allowed)
    return Tile(bm, bn, bk, warps, stages)


GEMM_DTYPES = ("fp16", "bf16", "tf32", "fp32")
SUNWAY_GEMM_DTYPES = ("fp16", "bf16", "fp32")


def _micro_gemm_sunway(machine, p: dict, out: MicroResult) -> float:
    """C = A @ B (f32 out) with the Sunway GEMM emitter (archsim.workloads.emit.gemm_sunway: one
    CPE a C tile in LDM, double-buffered DMA panels, f16x2 / bf16x2 / f32 vector FMA; where the
    machine has row and column DMA broadcast, a core group's mesh shares A panels along its rows
    and B panels along its columns: extra ``layout`` "broadcast", else "tile").
    Share of peak against the dtype's vector peak (the CPEs' f16x2 rate for fp16 / bf16)."""
    from archsim.workloads.emit.gemm_sunway import gemm_kernel

    M, N, K = p["m"], p["n"], p["k"]
    _need(min(M, N, K) > 0, "--param m/n/k", f"{M}x{N}x{K}", "m, n, k > 0")
    _need(p["dtype"] in SUNWAY_GEMM_DTYPES, "--param dtype", repr(p["dtype"]), ", ".join(SUNWAY_GEMM_DTYPES))
    _need(p["tile"] == "auto", "--param tile", f"{p['tile']} on {machine.name}",
          "auto (the Sunway GEMM's tile is its CPE's C tile in LDM)")
    _need(p["out"] == "f32", "--param out", f"{p['out']!r} on {machine.name}", "f32 (the Sunway GEMM stores f32)")
    g = gemm_kernel(capabilities(machine), M, N, K, p["dtype"], "f32")
    args = g.args(*shared_buffers(machine, g.buffer_bytes().values()))   # the cross segment
    t = _time(g.program, machine, g.launch, args, g.program.name, out, sample=p["sample"])
    out.kernels[-1]["model_flops"] = g.flops
    tf = g.flops / stats.seconds(machine, t.cycles) / 1e12
    out.extra["tile"] = [g.tile.BM, g.tile.BN, g.tile.BK]
    out.extra["stages"] = g.tile.stages
    out.extra["kernel"] = g.kind
    out.extra["blocks"] = g.launch.blocks
    out.extra["layout"] = "broadcast" if g.program.name.endswith("_bcast") else "tile"
    pk = stats.machine_record(machine)["peak_tflops"].get(g.dtype)
    if pk:
        out.extra["share_of_peak"] = tf / pk
    return tf


def micro_attention(machine, p: dict, out: MicroResult) -> float:
    """Forward attention softmax(Q K^T / sqrt(d) [+ causal mask]) V over batch x heads x seq x seq.
    Both forms are the kernels a decoder block's attention op is emitted as
    (archsim.workloads.emit.block.attention_kernels), reading Q, K, V in place from a fused QKV
    buffer [batch*seq, 3*heads*head_dim]:
    fused=true: one flash-attention kernel (K/V tiles in shared memory, running max and sum in
    registers, no seq x seq matrix in memory; on Sunway K/V blocks staged in the LDM); fused=false: S = Q K^T (a batched GEMM), P =
    softmax(S / sqrt(d)) (a row kernel, causal mask), O = P V (a batched GEMM), with S and P going
    through the memory hierarchy. The value is TFLOP/s of the math executed over the kernels'
    summed time (4*d per unmasked (query, key) pair plus the softmax, the
    result's ``flops``); ``model_flops`` holds the full seq x seq count. Big launches are timed
    from their first waves (archsim.sample)."""
    from archsim.runner import timing_args
    from archsim.workloads.emit.block import attention_kernels

    for k in ("batch", "heads", "seq"):
        _need(p[k] > 0, f"--param {k}", f"{p[k]}", "> 0")
    _need(p["kernel"] in ("auto", "mma", "wgmma"), "--param kernel", repr(p["kernel"]), "auto, mma or wgmma")
    _need(p["kernel"] == "auto" or (p["fused"] and machine.family == "gpu"), "--param kernel",
          f"{p['kernel']} with fused={str(p['fused']).lower()} on {machine.name}",
          "kernel=auto, or a fused attention on a GPU")
    ks = attention_kernels(capabilities(machine), p["batch"], p["heads"], p["seq"], p["head_dim"], p["dtype"],
                           p["causal"], p["fused"], kernel=None if p["kernel"] == "auto" else p["kernel"])
    cycles = 0
    times = _time_many([(k.program, k.launch, timing_args(machine, k.params), k.name) for k in ks], machine, out,
                       sample=True)
    for k, t, rec in zip(ks, times, out.kernels[-len(ks):]):
        rec.update(flops=k.flops, model_flops=k.model_flops,
                   tflops=round(k.flops / stats.seconds(machine, t.cycles) / 1e12, 4))
        cycles += t.cycles
    flops = sum(k.flops for k in ks)
    tf = flops / stats.seconds(machine, cycles) / 1e12
    out.extra["kernels"] = [{"name": k.name, "program": k.program.name, "grid": list(k.launch.grid),
                             "block": list(k.launch.block)} for k in ks]
    out.extra["cycles"] = cycles
    out.extra["dram_bytes"] = sum(r["bytes"]["dram_read"] + r["bytes"]["dram_write"] for r in out.kernels)
    pk = stats.machine_record(machine)["peak_tflops"].get(p["dtype"])
    if pk:
        out.extra["share_of_peak"] = tf / pk
    return tf


def dma_kernel(direction: str, ldm_bytes: int) -> str:
    """Each CPE (one block per CPE) moves `reps` transfers of `size` bytes between global memory
    and its LDM, waiting for each (as a blocking athread get/put does). CPE i's transfer r
    starts at buf + offset + i * spacing + r * stride."""
    op = "dma.get [r8], [r1], r4" if direction == "get" else "dma.put [r1], [r8], r4"
    return f""".kernel dma_{direction}
.shared {ldm_bytes}
.param buf
.param offset
.param spacing
.param stride
.param size
.param reps
        s2r r0, %ctaid.x
        ldparam r1, buf
        ldparam r2, spacing
        mad.i64 r1, r0, r2, r1
        ldparam r3, offset
        add.i64 r1, r1, r3
        ldparam r4, size
        ldparam r5, reps
        ldparam r6, stride
        mov.b64 r7, 0
        mov.b64 r8, 0
LOOP:   {op}
        dma.wait 0
        add.i64 r1, r1, r6
        add.i64 r7, r7, 1
        setp.lt.i64 p0, r7, r5
   @p0  bra LOOP
        exit
"""


def micro_dma(machine, p: dict, out: MicroResult) -> float:
    """Aggregate DMA bandwidth of one core group: `cpes` CPEs of group 0 each move `reps`
    transfers of `size_bytes`; the value is all bytes moved over the kernel's cycles."""
    from archsim.config.derived import scratch_usable_kib
    from archsim.engine.dma import pieces

    check_machine("dma", machine)
    _need(p["direction"] in ("get", "put"), "--param direction", repr(p["direction"]), "get or put")
    ldm = scratch_usable_kib(machine) * 1024
    size, cpes = p["size_bytes"], p["cpes"]
    _need(0 < size <= ldm, "--param size_bytes", f"a transfer of {size} bytes does not fit the LDM of "
          f"{ldm} bytes" if size > 0 else f"{size} is not a size", f"1 .. {ldm}")
    per_group = machine.cores.per_group
    _need(1 <= cpes <= per_group, "--param cpes", f"{cpes} CPEs", f"1 .. {per_group}")
    _need(p["offset_bytes"] >= 0, "--param offset_bytes", f"{p['offset_bytes']}", ">= 0")
    spacing = size if p["spacing_bytes"] == -1 else p["spacing_bytes"]
    _need(spacing >= 0, "--param spacing_bytes", f"{spacing}", ">= 0")
    p["spacing_bytes"] = spacing  # the record shows the value used
    _need(p["reps"] >= 1, "--param reps", f"{p['reps']}", ">= 1")
    piece = machine.dma.piece_bytes
    stride = -(-max(cpes * spacing, size) // piece) * piece  # every rep keeps the same alignment
    reps = p["reps"]
    nbytes = p["offset_bytes"] + (cpes - 1) * spacing + (reps - 1) * stride + size
    prog = assemble(dma_kernel(p["direction"], (size + 7) // 8 * 8))
    args = {"buf": Unbacked(nbytes), "offset": p["offset_bytes"], "spacing": spacing, "stride": stride,
            "size": size, "reps": reps}
    t = _time(prog, machine, Launch((cpes, 1, 1), (machine.cores.warp_width, 1, 1)), args,
              f"dma_{p['direction']}", out)
    moved = cpes * reps * size
    base = buffer_addresses(prog, args)["buf"] + p["offset_bytes"]
    out.extra["bytes_moved"] = moved
    out.extra["gbps"] = moved / stats.seconds(machine, t.cycles) / 1e9
    out.extra["pieces_per_transfer_cpe0"] = pieces(base, size, piece)
    out.extra["transfer_latency_mean_cycles"] = t.memory["dma"]["latency_mean_cycles"]
    return moved / t.cycles


def rma_kernel(direction: str, ldm_bytes: int) -> str:
    """CPE `src` (block src) moves `reps` transfers of `size` bytes to / from CPE `dst`, waiting
    for each (as a blocking athread RMA), between two %clock reads; every block then meets at
    bar.grid so that the target stays resident while it is addressed. A first bar.grid starts the
    timed loop after every block has started (on a Sunway the MPE's launch reaches the CPEs over
    the mesh at different cycles: its messages stay out of the timed region)."""
    op = "rma.put [r2], [r2], r3, r11" if direction == "put" else "rma.get [r2], [r2], r3, r11"
    return f""".kernel rma_{direction}
.shared {ldm_bytes}
.param out
.param size
.param src
.param dst
.param reps
        bar.grid
        s2r r0, %ctaid.x
        ldparam r10, src
        setp.ne.i64 p0, r0, r10
   @p0  bra END
        ldparam r9, out
        ldparam r3, size
        ldparam r11, dst
        ldparam r6, reps
        mov.b64 r2, 0
        mov.b64 r7, 0
        s2r r4, %clock
LOOP:   {op}
        rma.wait 0
        add.i64 r7, r7, 1
        setp.lt.i64 p1, r7, r6
   @p1  bra LOOP
        s2r r5, %clock
        sub.i64 r5, r5, r4
        st.global.b64 [r9], r5
END:    bar.grid
        exit
"""


def micro_rma(machine, p: dict, out: MicroResult) -> float:
    """Mean cycles per blocking RMA transfer of `size_bytes` from CPE `src` to CPE `dst` of core
    group 0 (the kernel times its own loop with %clock)."""
    from archsim.config.derived import scratch_usable_kib

    check_machine("rma", machine)
    _need(p["direction"] in ("get", "put"), "--param direction", repr(p["direction"]), "put or get")
    per_group = machine.cores.per_group
    for k in ("src", "dst"):
        _need(0 <= p[k] < per_group, f"--param {k}", f"CPE {p[k]} does not exist in a core group of "
              f"{per_group} CPEs", f"0 .. {per_group - 1}")
    ldm = scratch_usable_kib(machine) * 1024
    size = p["size_bytes"]
    _need(0 < size <= ldm, "--param size_bytes", f"a transfer of {size} bytes does not fit the LDM of "
          f"{ldm} bytes" if size > 0 else f"{size} is not a size", f"1 .. {ldm}")
    _need(p["reps"] >= 1, "--param reps", f"{p['reps']}", ">= 1")
    prog = assemble(rma_kernel(p["direction"], (size + 7) // 8 * 8))
    args = {"out": np.zeros(2, np.int64), "size": size, "src": p["src"], "dst": p["dst"], "reps": p["reps"]}
    blocks = max(p["src"], p["dst"]) + 1
    t = _time(prog, machine, Launch((blocks, 1, 1), (machine.cores.warp_width, 1, 1)), args,
              f"rma_{p['direction']}", out)
    per = float(t.buffers["out"][0]) / p["reps"]
    m = machine.mesh
    ccols = m.cols // m.cluster_cols
    cl = [(k // m.cols) // m.cluster_rows * ccols + (k % m.cols) // m.cluster_cols for k in (p["src"], p["dst"])]
    out.extra["cluster_hops"] = abs(cl[0] // ccols - cl[1] // ccols) + abs(cl[0] % ccols - cl[1] % ccols)
    out.extra["bytes_per_cycle"] = size / per
    out.extra["transfer_latency_mean_cycles"] = t.memory["rma"]["latency_mean_cycles"]
    return per


def micro_asm(machine, p: dict, out: MicroResult) -> float:
    """The steady-state cost of one iteration of an ISA kernel's loop, by the slope method of
    micro-benchmarks: the kernel (its .launch, its .arg data) runs with its scalar ``.arg iters`` at
    i and at 2i, and the difference of the two runs' cycles over i x per_iter is what a unit of the
    loop's work costs once the caches are warm and every pipeline is full: the launch, the first
    (cold) pass over the kernel's data and the drain cancel. This is how validate times the ISA
    twins of chip micro-benchmarks (isa/validation/*.s), which time their loop with clock64 over
    data the host left in the L2."""
    from archsim.engine.launch import default_args, resolve_launch
    from archsim.isa.asm import assemble_file
    from archsim.isa.check import check
    from archsim.resources import check_asm_args

    _need(p["n"] >= 0, "--param n", f"{p['n']}", "an integer >= 0")
    _need(p["iters"] >= 1, "--param iters", f"{p['iters']}", "an integer >= 1")
    _need(p["per_iter"] > 0, "--param per_iter", f"{p['per_iter']}", "a number > 0")
    path = asm_path(p["file"].replace("{n}", str(p["n"])))
    prog = assemble_file(path, {"{n}": str(p["n"])})
    caps = capabilities(machine)
    check(prog, caps)
    spec = {a.name: a for a in prog.args}
    _need("iters" in spec and not spec["iters"].is_buffer, str(path), "the kernel has no scalar .arg iters",
          ".param iters and .arg iters = N: the loop count micro asm sets")
    launch = resolve_launch(prog, None)
    if p["threads"]:
        launch = Launch(launch.grid, (p["threads"], 1, 1), cluster=launch.cluster)
    tpb = launch.threads_per_block
    _need(0 < tpb <= caps.warp_slots * caps.warp_width, "--param threads", f"{tpb} threads per block",
          f"1 .. {caps.warp_slots * caps.warp_width} (what one core of {caps.name} holds)")
    check_asm_args(machine, prog, True)
    args = default_args(prog, timing=True)
    runs = []
    for it in (p["iters"], 2 * p["iters"]):
        a = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
        a["iters"] = it
        runs.append((prog, launch, a, f"{prog.name}_iters{it}"))
    t1, t2 = _time_many(runs, machine, out)
    _need(t2.cycles > t1.cycles, str(path), f"{t1.cycles} cycles at iters {p['iters']} and {t2.cycles} at "
          f"{2 * p['iters']}: the time does not grow with iters", "a kernel whose loop runs .arg iters times")
    out.extra["cycles"] = [int(t1.cycles), int(t2.cycles)]
    out.extra["file"] = str(path)
    return (t2.cycles - t1.cycles) / (p["iters"] * p["per_iter"])


MICROS = {"latency": micro_latency, "bandwidth": micro_bandwidth, "mma": micro_mma, "wgmma": micro_wgmma,
          "tma": micro_tma, "dsmem": micro_dsmem,
          "gemm": micro_gemm,
          "attention": micro_attention, "dma": micro_dma, "rma": micro_rma, "asm": micro_asm}


def run_micro(name: str, machine, params: list[str] | dict, max_cycles: int = 10**9, workers: int = 1) -> MicroResult:
    """``workers``: processes the benchmark's independent launches are timed on (results identical)."""
    from archsim.workers import Pool

    check_machine(name, machine)
    p = parse_params(name, params)
    out = MicroResult(name=name, params=p, value=0.0, unit=unit_of(name, p), max_cycles=int(max_cycles))
    t0 = time.perf_counter()
    before = dict(kernel_cache.stats)
    try:
        with Pool(workers) as out.pool:
            out.value = float(MICROS[name](machine, p, out))
    finally:
        out.pool = None
        out.wall_seconds = time.perf_counter() - t0
        out.spent = kernel_cache.changes_since(before)
        out.setup_extra = max(out.wall_seconds - out.spent["task_seconds"], 0.0) if workers <= 1 else 0.0
    return out


# ----------------------------------------------------------------------------- validate probes
def ffma_latency(machine, out: MicroResult, n: int = 64) -> float:
    """Dependent FFMA latency: (T(2n) - T(n)) / n of a straight chain timed with %clock."""
    def kernel(m: int) -> str:
        body = "\n".join("        fma.f32 r1, r1, r2, r3" for _ in range(m))
        return (f".kernel ffma_chain\n.param out\n        ldparam r0, out\n        mov.f32 r1, 1.0\n"
                f"        mov.f32 r2, 1.0\n        mov.f32 r3, 0.0\n        s2r r4, %clock\n{body}\n"
                "        s2r r5, %clock\n        sub.i64 r5, r5, r4\n        st.global.b64 [r0], r5\n        exit\n")
    ts = []
    for m in (n, 2 * n):
        t = _time(assemble(kernel(m)), machine, Launch((1, 1, 1), (1, 1, 1)), {"out": np.zeros(1, np.int64)},
                  f"ffma_chain_{m}", out)
        ts.append(int(t.buffers["out"][0]))
    return (ts[1] - ts[0]) / n


def shared_latency(machine, out: MicroResult, n: int = 256) -> float:
    """Pointer chase in the scratchpad: one thread builds a cycle of 8-byte slots, then follows it."""
    text = f""".kernel shared_chase
.param loads
.param out
.shared {n * 8}
        ldparam r0, loads
        ldparam r1, out
        mov.b64 r2, 0
BUILD:  add.i64 r3, r2, 1
        rem.i64 r3, r3, {n}
        shl.b64 r3, r3, 3
        shl.b64 r4, r2, 3
        st.shared.b64 [r4], r3
        add.i64 r2, r2, 1
        setp.lt.i64 p0, r2, {n}
   @p0  bra BUILD
        ld.shared.b64 r5, [0]
        add.i64 r6, r5, 0
        s2r r7, %clock
        mov.b64 r2, 0
LOOP:   ld.shared.b64 r5, [r5]
        add.i64 r2, r2, 1
        setp.lt.i64 p0, r2, r0
   @p0  bra LOOP
        add.i64 r6, r5, 0
        s2r r8, %clock
        sub.i64 r8, r8, r7
        st.global.b64 [r1], r8
        exit
"""
    loads = 1024
    t = _time(assemble(text), machine, Launch((1, 1, 1), (1, 1, 1)), {"loads": loads, "out": np.zeros(1, np.int64)},
              "shared_chase", out)
    return int(t.buffers["out"][0]) / loads


def l1_bandwidth(machine, out: MicroResult, iters: int = 64) -> float:
    """Bytes per cycle one core's L1 delivers: a full block re-reads a 16 KiB buffer with
    16-byte loads (after a warm-up pass), timed between two barriers."""
    c = machine.cores
    threads = min(c.warp_slots, 32) * c.warp_width
    text = f""".kernel l1_stream
.param buf
.param iters
.param out
        ldparam r0, buf
        ldparam r1, iters
        ldparam r2, out
        s2r r3, %tid.x
        shl.b64 r3, r3, 4
        and.b64 r3, r3, 16383
        add.i64 r3, r3, r0
        ld.global.v4.b32 r8, [r3]        // warm-up: the buffer is now in L1
        add.i64 r20, r8, 0
        bar.sync
        s2r r4, %clock
        mov.b64 r5, 0
LOOP:   ld.global.v4.b32 r8, [r3]
        ld.global.v4.b32 r12, [r3]
        ld.global.v4.b32 r16, [r3]
        ld.global.v4.b32 r24, [r3]
        add.i64 r5, r5, 1
        setp.lt.i64 p0, r5, r1
   @p0  bra LOOP
        add.i64 r20, r8, r12
        add.i64 r20, r16, r24
        bar.sync
        s2r r6, %clock
        sub.i64 r6, r6, r4
        s2r r7, %tid.x
        setp.ne.i64 p1, r7, 0
   @p1  exit
        st.global.b64 [r2], r6
        exit
"""
    t = _time(assemble(text), machine, Launch((1, 1, 1), (threads, 1, 1)),
              {"buf": Unbacked(16384), "iters": iters, "out": np.zeros(1, np.int64)}, "l1_stream", out)
    return threads * 16 * 4 * iters / int(t.buffers["out"][0])


def l2_bandwidth(machine, out: MicroResult, iters: int = 8) -> float:
    """Bytes per core cycle the whole L2 delivers, in the shape of gpu-benches' gpu-l2-cache
    kernel (the reference row's source): full occupancy, block b of the grid owns rows b, b + B,
    b + 2B, ... (B blocks; a row is one 16-byte chunk per thread), so the blocks read different
    lines spread over every slice. A warm-up pass brings each block's rows into the L2; after a
    grid barrier, iteration k of block b reads four rows of block (b + kP) mod B (another block's
    data each time, as gpu-benches' blocks read rows other blocks read before them, so the L1
    never holds them; P blocks share a core, so neighbours never read the same rows), four
    independent 16-byte loads per thread in flight; timed between two grid barriers."""
    c = machine.cores
    cores = machine.groups * c.per_group
    warps = min(c.warp_slots, 32)
    threads = warps * c.warp_width
    per_core = max(1, min(c.warp_slots // warps, c.max_blocks))
    blocks = cores * per_core
    row = threads * 16
    # the cache part of the L1; all of the array at most when the carveout follows the kernel
    per_kernel = machine.l1 is not None and machine.scratchpad.carveout == "per_kernel"
    l1 = (machine.l1.size_kib if per_kernel else l1_cache_kib(machine)) * 1024
    nrows = 4                   # rows per block, a power of two: all rows together are >= 4 L1s
    while nrows * row * blocks < 4 * l1:
        nrows *= 2
    text = f""".kernel l2_stream
.param buf
.param iters
.param out
        ldparam r0, buf
        ldparam r1, iters
        ldparam r2, out
        s2r r3, %ctaid.x
        s2r r4, %nctaid.x
        s2r r5, %tid.x
        shl.b64 r5, r5, 4
        add.i64 r5, r5, r0                // this thread's chunk in row 0
        mul.i64 r6, r4, {row}             // bytes from one of a block's rows to the next
        mul.i64 r11, r3, {row}
        add.i64 r11, r11, r5
        mov.b64 r7, 0
WARM:   mul.i64 r9, r7, r6                // warm-up: the block reads each of its rows once
        add.i64 r9, r9, r11
        ld.global.v4.b32 r12, [r9]
        add.i64 r7, r7, 1
        setp.lt.i64 p0, r7, {nrows}
   @p0  bra WARM
        add.i64 r20, r12, 0
        bar.grid
        s2r r10, %clock
        mov.b64 r23, r3                   // the block whose rows this iteration reads (not r13: the
                                          // v4 load into r12 writes r12..r15)
        mov.b64 r7, 0                     // the first of its four rows
        mov.b64 r8, 0                     // iterations done
LOOP:   add.i64 r23, r23, {per_core}           // blocks side by side on a core never read the same rows
        setp.ge.i64 p1, r23, r4
   @p1  sub.i64 r23, r23, r4
        mul.i64 r9, r7, r6
        mul.i64 r11, r23, {row}
        add.i64 r9, r9, r11
        add.i64 r9, r9, r5
        ld.global.v4.b32 r12, [r9]
        add.i64 r9, r9, r6
        ld.global.v4.b32 r16, [r9]
        add.i64 r9, r9, r6
        ld.global.v4.b32 r24, [r9]
        add.i64 r9, r9, r6
        ld.global.v4.b32 r28, [r9]
        add.i64 r7, r7, 4
        and.b64 r7, r7, {nrows - 1}
        add.i64 r8, r8, 1
        setp.lt.i64 p0, r8, r1
   @p0  bra LOOP
        add.i64 r20, r12, r16
        add.i64 r20, r24, r28
        bar.grid
        s2r r21, %clock
        sub.i64 r21, r21, r10
        s2r r22, %tid.x
        or.b64 r22, r22, r3
        setp.ne.i64 p1, r22, 0
   @p1  exit
        st.global.b64 [r2], r21
        exit
"""
    t = _time(assemble(text), machine, Launch((blocks, 1, 1), (threads, 1, 1)),
              {"buf": Unbacked(nrows * blocks * row), "iters": iters, "out": np.zeros(1, np.int64)},
              "l2_stream", out)
    return blocks * iters * 4 * row / int(t.buffers["out"][0])


# ----------------------------------------------------------------------------- Sunway validate probes
def dma_startup(machine, out: MicroResult, direction: str, nbytes: int = 8) -> float:
    """Cycles one CPE spends on a blocking DMA transfer of `nbytes` (issue to the end of
    ``dma.wait``), timed with %clock around the pair, as [M] measures the start-up."""
    _need(machine.dma is not None, f"dma_{direction}_startup", f"{machine.name} has no DMA engines", "a Sunway machine")
    op = "dma.get [r2], [r1], r3" if direction == "get" else "dma.put [r1], [r2], r3"
    text = f""".kernel dma_{direction}_startup
.shared {max(nbytes, 8)}
.param buf
.param out
.param n
        ldparam r1, buf
        ldparam r9, out
        ldparam r3, n
        mov.b64 r2, 0
        s2r r4, %clock
        {op}
        dma.wait 0
        s2r r5, %clock
        sub.i64 r5, r5, r4
        st.global.b64 [r9], r5
        exit
"""
    args = {"buf": Unbacked(max(nbytes, 256)), "out": np.zeros(1, np.int64), "n": nbytes}
    t = _time(assemble(text), machine, Launch((1, 1, 1), (machine.cores.warp_width, 1, 1)), args,
              f"dma_{direction}_startup", out)
    return float(t.buffers["out"][0])


def dma_stream_rate(machine, out: MicroResult, direction: str, small: int = 16384, large: int = 32768) -> float:
    """One CPE's streaming rate in bytes per core cycle: the extra bytes over the extra cycles of
    one blocking transfer of `large` bytes against one of `small` (start-up and launch cancel)."""
    c = []
    for size in (small, large):
        r = MicroResult("dma", {}, 0.0, "B/cycle", max_cycles=out.max_cycles)
        micro_dma(machine, parse_params("dma", {"direction": direction, "size_bytes": size, "cpes": 1, "reps": 1}), r)
        out.kernels += r.kernels
        c.append(r.kernels[0]["cycles"])
    return (large - small) / (c[1] - c[0])


def dma_group_gbps(machine, out: MicroResult, cpes: int = 16, size: int = 8192, reps: int = 2) -> float:
    """GB/s of one core group's DMA: `cpes` CPEs of group 0 each get `reps` blocks of `size` bytes
    from the group's own segment (its controller)."""
    micro_dma(machine, parse_params("dma", {"direction": "get", "size_bytes": size, "cpes": cpes, "reps": reps}), out)
    return out.extra["gbps"]


def vector_fma_tflops(machine, out: MicroResult, dtype: str, chains: int = 8, unroll: int = 8,
                      iters: int = 8) -> float:
    """TFLOP/s of the whole machine's cores running vector FMAs of `dtype` (f32, f16x2): a loop of
    `unroll` x `chains` independent FMAs per iteration (enough chains to cover the FMA latency, as
    a peak-FLOPS benchmark unrolls), on every core; the value is the extra flops over the extra
    time of 2 x `iters` iterations against `iters` (the launch and the tail cancel)."""
    body = "\n".join(f"        fma.{dtype} r{1 + i % chains}, r{1 + i % chains}, r20, r21" for i in range(chains * unroll))
    init = "\n".join(f"        mov.b64 r{1 + i}, 0" for i in range(chains))
    text = f""".kernel vfma_{dtype}
.param iters
        ldparam r30, iters
        mov.b64 r31, 0
        mov.b64 r20, 0
        mov.b64 r21, 0
{init}
LOOP:
{body}
        add.i64 r31, r31, 1
        setp.lt.i64 p0, r31, r30
   @p0  bra LOOP
        exit
"""
    c = machine.cores
    launch = Launch((machine.groups * c.per_group, 1, 1), (c.warp_width, 1, 1))
    prog = assemble(text)
    t1 = _time(prog, machine, launch, {"iters": iters}, f"vfma_{dtype}_{iters}", out)
    t2 = _time(prog, machine, launch, {"iters": 2 * iters}, f"vfma_{dtype}_{2 * iters}", out)
    return (t2.flops - t1.flops) / stats.seconds(machine, t2.cycles - t1.cycles) / 1e12
