"""DRAM timing rules as data, per standard (``dram.kind``): after a command on a bank, how long a
later command must wait at the bank, at its bank group and at its sub-channel (pseudo-channel,
rank). ``dram.py`` turns a standard's table into numbers for one machine (``compile_rules``) and
applies it with one loop at every command it issues; the tFAW window, the data bus, the refresh
schedule and the row-hit accounting are not pairwise rules and stay in dram.py.

A delay is a sum of ``dram.timing`` fields and ``BL``, the data burst's memory cycles on the bus.
The standards the configs use (HBM2 / HBM2e on the A100, HBM3 on the H100, DDR4 on the
SW26010-Pro, DDR5) share JEDEC's pairwise constraints at the level this model keeps (bank groups,
short and long command-to-command delays, write recovery and write-to-read turnaround); a standard
with other rules gets its own table here.
"""

from __future__ import annotations

import numpy as np

SCOPES = ("bank", "group", "sub")
COMMANDS = ("ACT", "PRE", "RD", "WR")

# (command issued, scope, command that waits, delay terms)
JEDEC = (
    ("ACT", "bank", "RD", ("tRCD",)),
    ("ACT", "bank", "WR", ("tRCD",)),
    ("ACT", "bank", "PRE", ("tRAS",)),
    ("ACT", "bank", "ACT", ("tRC",)),
    ("ACT", "group", "ACT", ("tRRD_L",)),
    ("ACT", "sub", "ACT", ("tRRD_S",)),
    ("PRE", "bank", "ACT", ("tRP",)),
    ("RD", "bank", "PRE", ("tRTP",)),
    ("RD", "group", "RD", ("tCCD_L",)),
    ("RD", "group", "WR", ("tCCD_L",)),
    ("RD", "sub", "RD", ("tCCD_S",)),
    ("RD", "sub", "WR", ("tCCD_S",)),
    ("WR", "bank", "PRE", ("tCWL", "BL", "tWR")),
    ("WR", "group", "WR", ("tCCD_L",)),
    ("WR", "group", "RD", ("tCCD_L",)),
    ("WR", "group", "RD", ("tCWL", "BL", "tWTR_L")),
    ("WR", "sub", "WR", ("tCCD_S",)),
    ("WR", "sub", "RD", ("tCCD_S",)),
    ("WR", "sub", "RD", ("tCWL", "BL", "tWTR_S")),
)

RULES = {"hbm2": JEDEC, "hbm2e": JEDEC, "hbm3": JEDEC, "ddr4": JEDEC, "ddr5": JEDEC}


def compile_rules(kind: str, timing, burst_cycles: int, codes: dict, fields: dict) -> tuple[np.ndarray, np.ndarray]:
    """A standard's table for one machine: int64 rows (command code, scope, field of the waiting
    command in that scope's array, delay in memory cycles), sorted by command code, and the first
    row of each command code (``at[code]`` .. ``at[code + 1]``). ``codes``: command name -> code;
    ``fields``: (scope, command name) -> the index of its earliest-cycle field."""
    rows = []
    for cmd, scope, waits, terms in RULES[kind]:
        delay = sum(burst_cycles if t == "BL" else int(getattr(timing, t)) for t in terms)
        rows.append((codes[cmd], SCOPES.index(scope), fields[(scope, waits)], delay))
    rows.sort(key=lambda r: r[0])
    table = np.array(rows, np.int64).reshape(len(rows), 4)
    at = np.zeros(max(codes.values()) + 2, np.int64)
    for code in range(len(at)):
        at[code] = sum(1 for r in rows if r[0] < code)
    return table, at
