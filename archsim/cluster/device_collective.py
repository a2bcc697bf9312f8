"""A collective's own kernel on its device: the reduction every received chunk goes through.

NCCL runs a collective as one kernel with a CTA per channel, each CTA on an SM of its own; in a
ring's reduce-scatter steps (and a tree's reduce phase) it reads the chunk a peer sent and the
local one and writes their sum. How fast a device can do that is measured here by the engine: the
grid-stride residual add (a + b -> y in the storage type, ``elementwise.add_kernel``) launched as
the collective's CTAs (``software.collective_ctas`` of ``collective_threads``, each thread loading
``collective_unroll`` vectors before its math as NCCL's reduce-copy loop does; on Sunway, CPEs), on
a probe large enough to stream from DRAM, its buffers shared by every core (on Sunway interleaved
over every core group's memory controller). The rate it reaches (bytes of the received chunk a
second) becomes one more link per device on the flow network (topology.build's reducers): a
reduced chunk crosses its receiver's reducer after the links that carried it, so a collective
whose transfer outruns the device's reduction is held to the reduction's rate, and reductions at
once on one device (two channels, a tensor- and a data-parallel collective) share it max-min
fairly, as any link is shared.
"""

from __future__ import annotations

import dataclasses

from archsim.errors import InputError

PROBE_BYTES = 8 << 20        # choice: 8 MiB an operand, past a GPU's L1s, streaming at its steady rate


def reduce_kernel(machine, dtype: str, ctas: int, threads: int | None = None, unroll: int | None = None,
                  label: str | None = None):
    """The collective's reduction kernel: the residual add over PROBE_BYTES of ``dtype`` a buffer,
    launched as ``ctas`` blocks of ``threads`` threads, each loading ``unroll`` vectors before its
    math (GPU), or on ``ctas`` CPEs (Sunway). Errors name ``label`` (the cluster file)."""
    from archsim.config import capabilities
    from archsim.isa.program import Launch
    from archsim.workloads.emit.common import blocks_per_core

    caps = capabilities(machine)
    es = 4 if dtype == "fp32" else 2
    n = PROBE_BYTES // es
    where = f"{label or machine.name}: software"
    if machine.family != "gpu":
        from archsim.workloads.emit import elementwise_sunway as ES

        if threads is not None or unroll is not None:
            raise InputError(f"{where}.collective_{'threads' if threads is not None else 'unroll'}",
                             "given for a Sunway device", "collective_ctas alone: the CPEs the reduction runs on")
        k = ES.add_kernel(caps, n, dtype)
        return dataclasses.replace(k, launch=dataclasses.replace(
            k.launch, grid=(min(ctas, caps.cores_total, k.launch.grid[0]), 1, 1)))
    from archsim.workloads.emit import elementwise_gpu as EW

    if unroll is not None and unroll > EW.MAX_UNROLL:
        raise InputError(f"{where}.collective_unroll", f"{unroll} vectors a thread", f"1 to {EW.MAX_UNROLL}")
    k = EW.add_kernel(caps, n, dtype, unroll or 1)
    t = threads if threads is not None else k.launch.block[0]
    if t % caps.warp_width or blocks_per_core(caps, k.program, t) < 1:
        raise InputError(f"{where}.collective_threads", f"{t} threads a CTA of {k.program.nregs} registers each",
                         f"a multiple of {caps.warp_width} whose registers fit one core of {machine.name}")
    return dataclasses.replace(k, launch=Launch((min(ctas, caps.cores_total), 1, 1), (t, 1, 1)))


def reduce_rate(machine, dtype: str, ctas: int, threads: int | None = None, unroll: int | None = None) -> float:
    """Bytes of received chunk a second the device reduces on the collective's CTAs, timed by the
    engine (through the kernel cache)."""
    from archsim.engine.timing import shared_buffers, time_kernel

    k = reduce_kernel(machine, dtype, ctas, threads, unroll)
    sizes = k.buffer_bytes()
    args = k.args(**dict(zip(sizes, shared_buffers(machine, list(sizes.values())))))
    t = time_kernel(k.program, machine, k.launch, args)
    seconds = t.cycles / (machine.clock_ghz * 1e9)
    return k.buffer_bytes()["y"] / seconds if seconds > 0 else float("inf")


def device_reduce_rate(cluster, machine, dtype: str) -> float | None:
    """The cluster's collectives' reduction rate on its device for ``dtype`` (fp16, bf16, fp32;
    None: the cluster does not say what its collectives run on, and reductions cost nothing on the
    device)."""
    sw = cluster.software
    if sw.collective_ctas is None:
        return None
    return reduce_rate(machine, dtype, sw.collective_ctas, sw.collective_threads, sw.collective_unroll)


def check_collective_software(cluster, machine, label: str) -> None:
    """The cluster's ``software.collective_*`` against its device, before anything is timed: the
    reduction kernel can be emitted as given and the device less the collective's SMs loads."""
    sw = cluster.software
    if sw.collective_ctas is None:
        return
    reduce_kernel(machine, "fp32", sw.collective_ctas, sw.collective_threads, sw.collective_unroll, label)
    contended_machine(cluster, machine, label)


def contended_machine(cluster, machine, label: str | None = None):
    """The device as a compute kernel sees it while a collective runs: the SMs the collective's
    CTAs hold taken away (NCCL's CTAs do not share an SM with compute kernels). None when the
    cluster does not say what its collectives run on, or on a Sunway device (choice: its
    reductions' CPEs are not taken from the kernels beside them)."""
    from archsim.config.load import load_machine

    ctas = cluster.software.collective_ctas
    if ctas is None or machine.family != "gpu":
        return None
    sms = machine.groups * machine.cores.per_group
    if machine.groups != 1 or ctas >= sms:
        raise InputError(f"{label or cluster.name}: software.collective_ctas",
                         f"{ctas} CTAs on {machine.name}'s {sms} SMs"
                         + (f" in {machine.groups} groups" if machine.groups != 1 else ""),
                         f"fewer than {sms}, one SM a CTA, on a GPU of one group")
    sets = [f"cores.per_group={machine.cores.per_group - ctas}"]
    if machine.clusters is not None:
        gpcs = _gpcs_less(machine.clusters.gpc_sms, ctas)
        sets += [f"clusters.gpc_sms={list(gpcs)}", f"clusters.max_blocks={min(machine.clusters.max_blocks, max(gpcs))}"]
    try:
        return load_machine(cluster.device, sets=sets)
    except InputError as e:
        raise InputError(f"{label or cluster.name}: software.collective_ctas",
                         f"{machine.name} less the collectives' {ctas} SMs: {e.what}", e.allowed) from None


def _gpcs_less(gpcs, n):
    """The GPCs' SM counts with n SMs taken away one at a time from the GPC holding the most
    (the later of equals), as a grid of n one-SM CTAs spreads over the GPCs (choice); emptied
    GPCs are dropped."""
    g = list(gpcs)
    for _ in range(n):
        i = max(range(len(g)), key=lambda j: (g[j], j))
        g[i] -= 1
    return tuple(x for x in g if x > 0)


__all__ = ["PROBE_BYTES", "check_collective_software", "contended_machine", "device_reduce_rate", "reduce_kernel",
           "reduce_rate"]
