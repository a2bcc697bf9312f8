"""Names and layouts the engine shares with the records, importable without numba.

The stats layer and the command line read these (stall reasons, the timeline's counter columns,
the raw counters of one timed launch) on paths that must not load the jitted engine: a refused
input is answered before numba is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# stall reasons, in docs/records.md order (warps.R_* are their indices)
STALL_NAMES = ("issued", "not_selected", "wait", "long_scoreboard", "short_scoreboard", "pipe_busy",
               "barrier", "dma_wait", "idle")

# Unit visits (MState.visits rows): each time the tick looks at a unit of a family (a check included),
# and how many of those looks found something to do (the rest are the engine's waste): a scheduler
# that issued; a core's memory side or an L2 slice that moved a request or reply; a channel's DRAM
# path with a finished request or a front-end entry to move; a DRAM channel with an arrival, a
# retirement or a command; a fabric or mesh port that sent a packet; a DMA engine that was due. The
# fabric, the CPE mesh and the DRAM channels keep theirs in their own state (noc.C_VISITS,
# DramState.vis).
VISIT_FAMILIES = ("scheduler", "core_memory", "l2_slice", "dram_path", "dram_channel", "fabric_port", "cpe_mesh",
                  "dma_engine")
(V_SCHED, V_CORE, V_SLICE, V_DRAM_PATH, V_DRAM, V_FABRIC, V_MESH, V_DMA) = range(len(VISIT_FAMILIES))

# Timeline: cumulative counters sampled at every window boundary (machine.py). The machine-wide
# counters come first in a row, then the per-unit ones (unit_timeline: links, channels, slices,
# DMA engines).
TL_BYTES = ("l1", "scratch", "l2", "dram_read", "dram_write", "fabric", "dma")  # MState.bytes[:7]
TL_COUNTERS = ("warp_instructions",) + TL_BYTES + tuple("stall_" + n for n in STALL_NAMES)
TL_UNITS_AT = len(TL_COUNTERS)  # the per-unit columns (unit_timeline) start here


@dataclass
class KernelTiming:
    """What one timed launch leaves: the raw counters the stats layer turns into records."""

    outcome: int
    cycles: int
    warp_instructions: int
    skipped_cycles: int
    stuck_warp: int
    stall: np.ndarray
    flops: int
    pipe_busy_cycles: np.ndarray
    memory: dict
    timeline: tuple = (0, None)  # (window cycles, cumulative counter rows at window ends; last row = end)
    buffers: dict = None         # backed buffer arguments as the kernel left them
    block_start: np.ndarray = None  # per block of the range run: dispatch cycle, retire cycle, core
    block_done: np.ndarray = None
    block_core: np.ndarray = None
    first_block: int = 0            # grid id of the range's first block
    timeline_end: int = -1          # the cycle the timeline rows end at (-1: `cycles`; a sampled
                                    # launch extrapolates `cycles` past its simulated timeline)
    timeline_units: dict | None = None  # unit_timeline.unit_layout: the per-unit columns of the rows
