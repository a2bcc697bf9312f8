"""DRAM channels with bank and row-buffer timing (Ramulator-style: the rules are ``dram.timing``).

One ``DramState`` (a NamedTuple of numpy arrays, struct of arrays over channels x banks) holds
every channel of the machine. The caller owns the queues (``archsim.engine.queues``): channel
``c`` reads request ids from queue ``q_in_base + c`` and pushes finished ones to
``q_out_base + c``. ``dram_step`` advances every channel by one memory-clock cycle;
``dram_next_event`` says when the next step can change anything (skip-ahead). Python helpers:
``make_dram_state``, ``dram_counters`` (per-channel records), ``dram_map`` / ``dram_address``
(address <-> channel, bank, row, column), ``channel_address`` (a channel's own address ->
address), ``segment_base`` / ``cross_base`` (Sunway buffer placement), ``dram_queue_capacity``,
``refresh_first_due``, ``dram_log`` (command log, tests).

Sub-channels
    A configured channel is one queue, one set of counters and ``dram.banks`` banks. Its data
    rate is ``channel_gbps``; one burst takes ``burst_cycles = burst_bytes / (channel_gbps /
    memory clock)`` on it. When ``burst_cycles < tCCD_S`` one command bus could never reach that
    rate (a100: 0.5 cycle bursts but tCCD_S = 2, so 25 % of peak at best): the channel is really
    several physical channels side by side (a100.yaml: "a 512-bit controller spans 4 HBM2
    channels x 16 banks"). The model therefore splits it into ``S = ceil(tCCD_S /
    burst_cycles)`` sub-channels (a100 4, h100 8, tiny-gpu 2, DDR4 machines 1), each with
    ``banks / S`` banks in ``bank_groups / S`` groups, its own command slot (one command per
    sub-channel per memory cycle), its own data bus of ``channel_gbps / S`` (a burst occupies it
    ``S x burst_cycles`` cycles) and its own tRRD / tFAW / tWTR / refresh state. Bank ``b`` of a
    channel lives in sub-channel ``b // (banks / S)``. ``make_dram_state(..., subchannels=1)``
    forces the literal one-bus model.

Data bus in fixed point
    Bus time is counted in 1/65536 cycle so a rate that is not a whole number of bytes per
    cycle (a100: 127.98 B/cycle) is met exactly and never exceeded. A column command may issue
    when the bus frees within the first cycle of its data slot (RD + tCL, WR + tCWL); its data
    ends at start + burst and the request is complete at that instant rounded up to the cycle
    (ends within 1/100 cycle past a boundary count as on it: the configs' clock ratios carry
    about six digits).

Address mapping (``dram_map``; all divisions, so counts need not be powers of two)
    1. address -> (channel, channel-local address ``la``):
       * ``interleave``: chunk ``i = addr // IL`` (IL = interleave_bytes); channel ``i % C``;
         ``la = (i // C) * IL + addr % IL``.
       * ``partitions`` (GPUs): a channel serves the L2 slices of its memory partition, so the
         channel is the home slice's (``slice_map``: the address's half h and granule q within
         the half, IL the slice granule; slice s of the half's sph). The half's C/halves channels
         take sph / (C/halves) slices each, in order: channel ``h * C/halves + s // spc``,
         ``la = ((q // sph) * spc + s % spc) * IL + addr % IL`` (spc slices a channel). A slice's
         misses and write-backs all reach one controller, as in NVIDIA's frame-buffer
         partitions and GPGPU-Sim's memory partitions. Without an L2: ``interleave``.
       * ``segments`` (Sunway): ``SEG = capacity_gib GiB / groups`` (rounded down to a multiple
         of IL x channels per group). Group g's private segment ``[g*SEG, (g+1)*SEG)`` is
         interleaved in IL chunks over the channels of g's own controller(s) only (controllers
         first, then the channels of a controller); channels are numbered controller-major
         and group-major (group g owns channels ``[g*C/groups, (g+1)*C/groups)``). The cross
         segment starts at ``groups*SEG`` and is interleaved in IL chunks over ALL controllers
         (chunk i -> controller ``i % count``, then its channels); its rows are numbered after
         the private rows of each channel (``la = SEG/cpg + ...``; capacity is not checked).
    2. ``la`` -> bank, row, column, low bits first::

           [ offset within a CH-byte chunk | sub-channel | bank group | bank in group |
             column chunk (row_bytes / CH) | row ]

       with CH = max(burst_bytes, min(address_mapping.row_chunk_bytes, row_bytes)) (128 by
       default): a request of up to CH bytes that is CH-aligned stays in one row of one bank, and
       so do the lines of one interleave granule when CH is the granule (a warp's 512-B access
       brings a channel two lines of one open row), while consecutive chunks of a stream go to
       different sub-channels and bank groups (so tCCD_L and tRRD_L do not serialise a stream)
       and each bank still reads its row from column 0 up (a stream of 128-B requests opens
       each row once per row_bytes / 128 requests: 94 % hits on a100). The flat bank field ``fb`` (sub-channel fastest)
       is XOR-hashed with the row's low bits (``fb ^ (row % banks)``, or ``(fb + row) % banks``
       when banks is not a power of two), which spreads power-of-two strides over banks.
       ``column`` is the byte offset within the row; ``bank`` = sc*(banks/S) + bg*(banks per
       group) + bank in group.
       ``address_mapping.bank_order: columns_low`` moves the column field below the bank in
       group: ``[ chunk offset | sub-channel | bank group | column chunk | bank in group | row ]``
       (the XOR hash then mixes into the sub-channel / bank-group field only). A stream
       still rotates over sub-channels and bank groups from one chunk to the next, but a bank
       reads its open row every S x bank-groups-per-sub-channel chunks instead of every ``banks``
       chunks, so the FR-FCFS queue finds far more row hits (as in Accel-Sim's A100 mapping,
       where the column bits sit right above the bank-group bit).
       ``address_mapping.bank_hash: fold`` mixes every bit above the hashed field into it instead
       of the row's low bits: it adds the sum of the field-sized digits of ``q // field`` (q =
       la // CH), mod the field size (a sum rather than an XOR, so that two consecutive chunks
       never share a sub-channel and bank group). For each value of the higher bits the field is
       still permuted, so a bank row keeps its columns in the same span, but concurrent requests
       that share their low bits (a long stream's drifting warps each keep their own) no longer
       pile onto a few sub-channels while the others idle.
    A request must not cross an interleave chunk; each of its bursts is mapped on its own, so a
    misaligned request may touch two chunks / rows / banks (two rows' worth of commands).

Scheduler (per sub-channel, every memory cycle, at most one command)
    Commands ACT, PRE, RD, WR, PREA (before refresh), all-bank REF and per-bank REFSB, each checked against
    tRCD, tCL, tCWL, tRP, tRAS, tRC, tCCD_S/L, tRRD_S/L, tFAW (last 4 ACTs), tWR, tWTR_S/L,
    tRTP, tRFC / tREFI and the data bus. ``fcfs``: only the oldest request of the sub-channel
    may issue. ``frfcfs``: the oldest request whose next command is a ready row hit, else the
    oldest request whose next command (ACT / PRE) is ready; a PRE that would close a row other
    queued requests still hit waits, unless the bank served 16 hits since its ACT (Ramulator's
    FRFCFS_Cap). ``row_policy: closed`` precharges automatically (RDA / WRA: no command slot)
    after the last queued hit. Refresh: channel c is due first at tREFI + c*tREFI/C (channels
    staggered, ``refresh_first_due``) and then every tREFI; every sub-channel of it then issues
    no request commands, precharges its open banks (PREA) and issues an all-bank REF, which
    blocks ACTs for tRFC. (Staggering the sub-channels of one channel costs twice as much: the
    shared queue fills with requests for the refreshing one.) ``dram.refresh: per_bank`` (HBM2
    REFSB): each sub-channel refreshes its banks in turn, one every ``T = tREFI // banks per
    sub-channel`` cycles (so each bank once per tREFI), the first at ``T + c*T/C``. While bank
    b's refresh is due only requests for bank b wait: the bank is precharged (PRE) if open, then
    REFSB takes the sub-channel's command slot and blocks ACTs to bank b alone for tRFCpb.

Requests: ``R.addr``, ``R.nbytes``, ``R.kind`` (KIND_WRITE writes; reads and atomics read) are
read once, when a step first sees the id in the input queue (its arrival cycle); the state keeps
a shadow of the decoded request per queue slot, so ``R.aux0/aux1`` are left alone and
``dram_next_event`` needs no request table. A request leaves the input queue when its last
column command issues and waits in a per-channel return buffer until its data has transferred;
then it is pushed to the output queue. A full output queue leaves it there: the channel counts a
blocked cycle and stops issuing last bursts once the return buffer is full (nothing dropped).

Row hits / misses / conflicts are counted once per request, by the state of its first burst's
bank when the request first needed it (a column command straight away = hit, an ACT = miss, a PRE
= conflict). Skip-ahead contract: call ``dram_step`` with increasing ``now_mem``; push new
requests only just before a step at the cycle they arrive; jump to ``min(dram_next_event(...,
t + 1), next arrival)`` after stepping cycle t. Results then equal stepping every cycle.

Engine notes (speed): each sub-channel's requests are scanned oldest first from an age list
(kept per sub-channel, in the shadow) and the scan stops at the sub-channel's choice (its first
ready hit, or its first ready ACT / PRE when its column timing rules every hit out); a channel
whose last scan issued nothing sleeps until the cycle that scan named, unless a request arrives
or one retires, and within a channel each sub-channel likewise (``S_WAKE``: until the cycle its
last scan named, an arrival, a request whose next burst moves in, a retirement or its own
command; other sub-channels' commands only delay its candidates); a request leaves the queue
in O(1) (the head entry fills its slot; ages live in the shadow); per-bank row-hit counts are
kept incrementally; the return buffer is a ring sorted by completion. No allocation and no
reference counting in the step (see ``_jit``). The only failure a step can meet, a queue larger
than ``queue_cap``, is flagged in ``chan[:, K_ERR]`` and raised by ``dram_check`` /
``dram_counters``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from archsim.engine import dram_rules as DRR
from archsim.engine import slice_map as SM
from archsim.engine.jit import njit
from archsim.engine.queues import KIND_WRITE

FP = 1 << 16                 # fixed-point units per memory cycle (data-bus time)
TOL = FP // 100              # an end this close past a cycle boundary counts as on it
NEVER = np.int64(1 << 62)

# jit.py's defaults: no reference counting (NRT's atomic increments of every array of D, Q and R
# around each call cost more than the work of a step) and numpy's error model.
_jit = njit()

CMD_ACT, CMD_PRE, CMD_RD, CMD_WR, CMD_REF, CMD_PREA, CMD_REFSB = 1, 2, 3, 4, 5, 6, 7
CMD_NAMES = {CMD_ACT: "ACT", CMD_PRE: "PRE", CMD_RD: "RD", CMD_WR: "WR", CMD_REF: "REF", CMD_PREA: "PREA",
             CMD_REFSB: "REFSB"}

# indices into DramState.prm (int64 parameters)
(P_C, P_S, P_NB, P_NBS, P_BGS, P_BPG, P_MODE, P_IL, P_GROUPS, P_CPG, P_CPGC, P_CPC, P_NCTRL, P_SEG,
 P_CHUNK, P_COLS, P_BB, P_POLICY, P_ROWPOL, P_TCL, P_TCWL, P_TRCD, P_TRP, P_TRAS, P_TRC, P_TCCDS,
 P_TCCDL, P_TRRDS, P_TRRDL, P_TFAW, P_TWR, P_TWTRS, P_TWTRL, P_TRTP, P_TRFC, P_TREFI, P_BFP, P_BINT,
 P_RETCAP, P_HITCAP, P_LOGLEN, P_QCAP, P_POW2, P_COLLOW, P_REFPB, P_TRFCPB, P_TREFIPB, P_FOLD, P_ILH, P_HALVES,
 P_SPH, P_SPHB, P_HG, P_SHASH, P_RMW, P_NPRM) = range(56)
P_BTAB = P_NPRM              # prm[P_BTAB + 2*b], prm[P_BTAB + 2*b + 1]: bank b's sub-channel and bank group

COUNTERS = ("reads", "writes", "bytes_read", "bytes_written", "row_hits", "row_misses", "row_conflicts",
            "activates", "precharges", "refreshes", "queue_occupancy_sum", "queue_max",
            "data_bus_busy_fp", "blocked_cycles", "latency_sum", "latency_count", "rmw_reads")
(C_READS, C_WRITES, C_BYTES_READ, C_BYTES_WRITTEN, C_ROW_HITS, C_ROW_MISSES, C_ROW_CONFLICTS, C_ACTIVATES,
 C_PRECHARGES, C_REFRESHES, C_QUEUE_OCC, C_QUEUE_MAX, C_BUS_BUSY_FP, C_BLOCKED, C_LAT_SUM, C_LAT_COUNT,
 C_RMW_READS) = range(17)

# field indices of the packed arrays (few NamedTuple fields keep numba's compile time down)
B_OPEN, B_ACT, B_PRE, B_RD, B_WR, B_STREAK, B_HITS, B_N = range(8)          # bank[C, NB, :]
G_ACT, G_RD, G_WR, G_N = range(4)                                            # bgrp[C, S*BGS, :]
(S_ACT, S_RD, S_WR, S_BUS, S_REF, S_FAW, S_FAWI, S_SEL, S_SELSEQ, S_REFB, S_OLDEST, S_YOUNGEST, S_WAKE,
 S_N) = (0, 1, 2, 3, 4, 5, 9, 10, 11, 12, 13, 14, 15, 16)                      # sub[C, S, :]
(H_ADDR, H_NBYTES, H_K, H_NB, H_CLS, H_WR, H_BANK, H_ROW, H_ARR, H_SEQ, H_OLDER, H_YOUNGER, H_PART, H_MERGE,
 H_N) = range(15)                                                             # shadow[C, QCAP, :]
F_ID, F_DONE, F_ARR, F_NBYTES, F_WR, F_N = range(6)                          # ret[C, RETCAP, :]
K_INFN, K_RHEAD, K_NSEEN, K_LASTCOUNT, K_LOGN, K_ERR, K_WAKE, K_ASEQ, K_N = range(9)  # chan[C, :]
ERR_QUEUE_CAP = 1                                                            # chan[c, K_ERR] bits
MODE_INTERLEAVE, MODE_SEGMENTS, MODE_PARTITIONS = 0, 1, 2                    # prm[P_MODE]: address_mapping.kind


class DramState(NamedTuple):
    """Every channel's state, struct of arrays (int64 unless said). The packed arrays are indexed
    by the constants above: ``bank[c, b, B_OPEN]`` is bank b's open row (-1 closed) and
    ``B_ACT..B_WR`` the earliest cycle for each command on it; ``bgrp`` the same per bank group
    (tRRD_L, tCCD_L, tWTR_L); ``sub`` per sub-channel (tRRD_S, tCCD_S, tWTR_S, data bus free
    time in 1/FP cycles, next refresh due, the last four ACTs for tFAW, per-bank refresh: the
    bank (within the sub-channel) refreshed next, its age list's ends, and the first cycle its
    last FR-FCFS scan found anything could issue: until then, and until an arrival, a request
    moved in from another sub-channel or a retirement, a scan would find the same); ``shadow``
    the decoded input-queue entries per physical queue slot (address, bytes, next burst, bursts, first-burst
    class 0 none / 1 hit / 2 miss / 3 conflict, write, next burst's bank and row, arrival, age
    sequence number, and the slots of the next older and next younger seen entry of the same
    sub-channel: the seen entries whose next burst goes to sub-channel s form a list in age order
    from ``sub[c, s, S_OLDEST]`` to ``sub[c, s, S_YOUNGEST]`` (-1 ends it); with
    ``dram.partial_writes: rmw``, the write's partial bursts (bit 0 its first, bit 1 its last)
    and, once the read of a read-modify-write has issued, the cycle its data is back (0 none));
    ``ret`` the return buffer; ``cnt[c, C_*]`` the counters (names in
    COUNTERS); ``log[c, i, :]`` = (cycle, command, bank or sub-channel, row / request id)."""

    prm: np.ndarray            # [P_NPRM] parameters
    clk: np.ndarray            # float64 [1] memory clock, GHz
    bank: np.ndarray           # [C, NB, B_N]
    bgrp: np.ndarray           # [C, S*BGS, G_N]
    sub: np.ndarray            # [C, S, S_N]
    shadow: np.ndarray         # [C, QCAP, H_N]
    ret: np.ndarray            # [C, RETCAP, F_N]
    chan: np.ndarray           # [C, K_N]
    last_step: np.ndarray      # [1] cycle of the last step
    cnt: np.ndarray            # [C, 16] counters
    log: np.ndarray            # [C, L, 4] command log ring (log_len=0: off)
    rules: np.ndarray          # [R, 4] the standard's timing rules (dram_rules.compile_rules), by command
    rule_at: np.ndarray        # [CMD_* + 2] the first rule of each command code
    vis: np.ndarray            # [2] channel-cycles stepped, and those in which the channel changed (names.V_DRAM)


# ---------------------------------------------------------------------------- Python side

def dram_subchannels(machine) -> int:
    """Sub-channels per configured channel: ceil(tCCD_S / burst_cycles), a divisor of
    gcd(banks, bank_groups) (the next one up, else the largest one below)."""
    from archsim.config import dram_burst_cycles

    d = machine.dram
    need = max(1, math.ceil(d.timing.tCCD_S / dram_burst_cycles(machine) - 1e-3))
    g = math.gcd(d.banks, d.bank_groups)
    for s in range(need, g + 1):
        if g % s == 0:
            return s
    return max(s for s in range(1, g + 1) if g % s == 0 and s <= need)


def _segment_bytes(machine) -> int:
    d, mc = machine.dram, machine.memory_controllers
    if mc.address_mapping.kind != "segments":
        return 0
    if d.capacity_gib is None:
        raise ValueError("dram.capacity_gib: the segments address mapping needs the capacity (a number of GiB)")
    cpg = d.channels // machine.groups
    unit = mc.address_mapping.interleave_bytes * cpg
    seg = int(d.capacity_gib * (1 << 30)) // machine.groups
    return seg // unit * unit


def segment_base(machine, group: int) -> int:
    """First byte of core group ``group``'s private segment (segments mapping); 0 on an
    interleaved machine, where every address reaches every channel."""
    if not 0 <= group < machine.groups:
        raise ValueError(f"group {group} out of range 0..{machine.groups - 1}")
    return group * _segment_bytes(machine)


def segment_bytes(machine) -> int:
    """Size of one private segment (0 on an interleaved machine)."""
    return _segment_bytes(machine)


def cross_base(machine) -> int:
    """First byte of the cross segment (interleaved over all controllers); 0 when interleaved."""
    return machine.groups * _segment_bytes(machine)


def dram_queue_capacity(machine) -> int:
    """A suggested input-queue capacity per channel: the controller's queue_depth shared by its
    channels."""
    mc = machine.memory_controllers
    return max(1, mc.queue_depth // (machine.dram.channels // mc.count))


def refresh_interval(machine, subchannels: int | None = None) -> int:
    """Memory cycles between two refresh commands of one sub-channel: tREFI (all-bank), or
    tREFI // banks per sub-channel (per-bank: every bank once per tREFI)."""
    t = machine.dram.timing
    if machine.dram.refresh != "per_bank":
        return t.tREFI
    S = int(subchannels) if subchannels else dram_subchannels(machine)
    return t.tREFI // (machine.dram.banks // S)


def refresh_first_due(machine, channel: int, subchannels: int | None = None) -> int:
    """Memory cycle of a channel's first refresh: T + channel * T / channels with T =
    refresh_interval (channels are staggered; the sub-channels of one channel refresh together,
    as they share its queue)."""
    T = refresh_interval(machine, subchannels)
    return T + channel * T // machine.dram.channels


def make_dram_state(machine, *, queue_cap: int | None = None, subchannels: int | None = None,
                    log_len: int = 0) -> DramState:
    """State for every channel of ``machine`` (reads ``machine.dram``, ``machine.memory_controllers``).
    ``queue_cap``: the largest input-queue capacity the caller will use (default
    memory_controllers.queue_depth); ``subchannels`` overrides the derived split;
    ``log_len`` > 0 keeps the last ``log_len`` commands per channel (tests, traces)."""
    from archsim.config import dram_burst_cycles, memory_clock_ghz

    d, mc, t = machine.dram, machine.memory_controllers, machine.dram.timing
    C = d.channels
    S = int(subchannels) if subchannels else dram_subchannels(machine)
    if d.banks % S or d.bank_groups % S:
        raise ValueError(f"subchannels {S} must divide dram.banks {d.banks} and dram.bank_groups {d.bank_groups}")
    NB, NBS, BGS = d.banks, d.banks // S, d.bank_groups // S
    BPG = NBS // BGS
    chunk = max(d.burst_bytes, min(mc.address_mapping.row_chunk_bytes, d.row_bytes))
    if d.row_bytes % chunk or chunk % d.burst_bytes:
        raise ValueError(f"dram.row_bytes {d.row_bytes} and burst_bytes {d.burst_bytes} do not fit a {chunk}-B chunk")
    qcap = int(queue_cap) if queue_cap else mc.queue_depth
    bfp = math.ceil(S * dram_burst_cycles(machine) * FP - 1e-6)
    bint = (bfp + FP - 1 - TOL) // FP
    # return-buffer ring: room for every burst in flight on every sub-channel, plus one more
    # each, as all S sub-channels may finish a request in the same cycle
    retcap = S * (max(t.tCL, t.tCWL) + bint + 3)
    groups = machine.groups
    segments = mc.address_mapping.kind == "segments"
    mode = {"interleave": MODE_INTERLEAVE, "segments": MODE_SEGMENTS, "partitions": MODE_PARTITIONS}[
        mc.address_mapping.kind]
    if mode == MODE_PARTITIONS and machine.l2 is None:
        mode = MODE_INTERLEAVE               # no slices: the controllers are the endpoints
    cpc = C // mc.count

    prm = np.zeros(P_NPRM + 2 * NB, np.int64)
    vals = {
        P_C: C, P_S: S, P_NB: NB, P_NBS: NBS, P_BGS: BGS, P_BPG: BPG, P_MODE: mode,
        P_IL: mc.address_mapping.interleave_bytes, P_GROUPS: groups, P_CPG: C // groups if segments else C,
        P_CPGC: mc.count // groups if segments else mc.count, P_CPC: cpc, P_NCTRL: mc.count,
        P_SEG: _segment_bytes(machine), P_CHUNK: chunk, P_COLS: d.row_bytes // chunk, P_BB: d.burst_bytes,
        P_POLICY: int(mc.policy == "frfcfs"), P_ROWPOL: int(mc.row_policy == "closed"),
        P_TCL: t.tCL, P_TCWL: t.tCWL, P_TRCD: t.tRCD, P_TRP: t.tRP, P_TRAS: t.tRAS, P_TRC: t.tRC,
        P_TCCDS: t.tCCD_S, P_TCCDL: t.tCCD_L, P_TRRDS: t.tRRD_S, P_TRRDL: t.tRRD_L, P_TFAW: t.tFAW,
        P_TWR: t.tWR, P_TWTRS: t.tWTR_S, P_TWTRL: t.tWTR_L, P_TRTP: t.tRTP, P_TRFC: t.tRFC, P_TREFI: t.tREFI,
        P_BFP: bfp, P_BINT: bint, P_RETCAP: retcap, P_HITCAP: mc.row_hit_cap, P_LOGLEN: int(log_len), P_QCAP: qcap,
        P_FOLD: int(mc.address_mapping.bank_hash == "fold"),
        P_POW2: int(NB & (NB - 1) == 0), P_COLLOW: int(mc.address_mapping.bank_order == "columns_low"),
        P_REFPB: int(d.refresh == "per_bank"), P_TRFCPB: t.tRFCpb or t.tRFC, P_TREFIPB: refresh_interval(machine, S),
        P_RMW: int(d.partial_writes == "rmw"),
    }
    if mode == MODE_PARTITIONS:              # the L2's slice map (slice_map.py), which picks the channel
        l2c = machine.l2
        sph = l2c.slices // l2c.halves
        vals.update({P_ILH: l2c.interleave_bytes, P_HALVES: l2c.halves, P_SPH: sph, P_SPHB: SM.fold_bits(sph),
                     P_SHASH: int(l2c.slice_indexing == "hashed"), P_HG: SM.half_granules(machine)})
    for k, v in vals.items():
        prm[k] = v
    for b in range(NB):
        prm[P_BTAB + 2 * b] = b // NBS
        prm[P_BTAB + 2 * b + 1] = b // BPG
    bank = np.zeros((C, NB, B_N), np.int64)
    bank[:, :, B_OPEN] = -1
    sub = np.zeros((C, S, S_N), np.int64)
    sub[:, :, S_FAW:S_FAW + 4] = -(1 << 40)
    sub[:, :, S_OLDEST] = sub[:, :, S_YOUNGEST] = -1  # the age lists are empty
    for c in range(C):
        sub[c, :, S_REF] = refresh_first_due(machine, c, S)
    fields = {(sc, cmd): f for sc, names in (("bank", (B_ACT, B_PRE, B_RD, B_WR)), ("group", (G_ACT, -1, G_RD, G_WR)),
                                             ("sub", (S_ACT, -1, S_RD, S_WR)))
              for cmd, f in zip(DRR.COMMANDS, names) if f >= 0}
    rules, rule_at = DRR.compile_rules(d.kind, t, bint, {n: c for c, n in CMD_NAMES.items()}, fields)
    return DramState(
        prm=prm, clk=np.array([memory_clock_ghz(machine)], np.float64), bank=bank,
        bgrp=np.zeros((C, S * BGS, G_N), np.int64), sub=sub, shadow=np.zeros((C, qcap, H_N), np.int64),
        ret=np.zeros((C, retcap, F_N), np.int64), chan=np.zeros((C, K_N), np.int64),
        last_step=np.full(1, -1, np.int64), cnt=np.zeros((C, len(COUNTERS)), np.int64),
        log=np.zeros((C, max(1, int(log_len)), 4), np.int64), rules=rules, rule_at=rule_at,
        vis=np.zeros(2, np.int64))


def dram_check(D: DramState) -> None:
    """Raise if a step refused a channel (an input queue larger than ``queue_cap``)."""
    bad = [c for c in range(D.chan.shape[0]) if D.chan[c, K_ERR] & ERR_QUEUE_CAP]
    if bad:
        raise ValueError(f"dram: the input queues of channels {bad} are larger than make_dram_state's "
                         f"queue_cap {int(D.prm[P_QCAP])}; those channels were not stepped")


def channel_names(D: DramState) -> list[str]:
    """mc<controller> (one channel a controller) or mc<controller>.ch<channel>."""
    C, cpc = int(D.prm[P_C]), int(D.prm[P_CPC])
    return [f"mc{c // cpc}" if cpc == 1 else f"mc{c // cpc}.ch{c % cpc}" for c in range(C)]


def dram_counters(D: DramState, elapsed_mem_cycles: int | None = None,
                  mem_clock_ghz: float | None = None) -> list[dict]:
    """Per channel a tidy record: docs/records.md's ``memory_controllers`` fields (name, queue_mean,
    queue_max, row_hit_rate, gbps), the raw counters, data_bus_busy_cycles (full-width
    equivalent), data_bus_util and latency_mean (memory cycles). ``elapsed_mem_cycles``
    defaults to the last stepped cycle + 1, the clock to the machine's memory clock."""
    dram_check(D)
    p = D.prm
    S, cpc = int(p[P_S]), int(p[P_CPC])
    elapsed = int(D.last_step[0]) + 1 if elapsed_mem_cycles is None else int(elapsed_mem_cycles)
    ghz = float(D.clk[0]) if mem_clock_ghz is None else float(mem_clock_ghz)
    out = []
    for c, name in enumerate(channel_names(D)):
        rec = {"name": name, "channel": c, "controller": c // cpc}
        for i, k in enumerate(COUNTERS):
            if k != "data_bus_busy_fp":
                rec[k] = int(D.cnt[c, i])
        acc = rec["row_hits"] + rec["row_misses"] + rec["row_conflicts"]
        busy = float(D.cnt[c, C_BUS_BUSY_FP]) / FP / S
        nbytes = rec["bytes_read"] + rec["bytes_written"]
        rec.update(
            row_hit_rate=rec["row_hits"] / acc if acc else 0.0,
            queue_mean=rec["queue_occupancy_sum"] / elapsed if elapsed > 0 else 0.0,
            data_bus_busy_cycles=busy,
            data_bus_util=busy / elapsed if elapsed > 0 else 0.0,
            latency_mean=rec["latency_sum"] / rec["latency_count"] if rec["latency_count"] else 0.0,
            gbps=nbytes * ghz / elapsed if elapsed > 0 else 0.0,
            elapsed_mem_cycles=elapsed,
        )
        out.append(rec)
    return out


def dram_log(D: DramState, channel: int) -> list[tuple[int, str, int, int]]:
    """The logged commands of one channel as (cycle, command, bank or sub-channel, arg) in cycle
    order (needs ``log_len`` > 0). arg: the row for ACT, the request id for RD/WR, -2 for an
    automatic precharge (closed rows), else -1."""
    L = D.log.shape[1]
    n = int(D.chan[channel, K_LOGN])
    rows = [tuple(int(x) for x in D.log[channel, i % L]) for i in range(max(0, n - L), n)]
    return sorted(((t, CMD_NAMES[cmd], b, a) for t, cmd, b, a in rows), key=lambda r: r[0])


def _unmix(p, f, hi, row, m):
    """Inverse of _mix (Python ints): the field value that _mix takes to f."""
    if p[P_FOLD]:
        return (f - int(_fold(hi, m))) % m
    return f ^ (row & (m - 1)) if p[P_POW2] else (f - row) % m


def dram_address(D: DramState, channel: int, bank: int, row: int, column: int = 0) -> int:
    """Inverse of ``dram_map``: the byte address of (channel, bank, row, column). On a segments
    machine a channel's rows below ``private_rows(D)`` belong to its group's private segment and
    the rows from there on to the cross segment."""
    p = [int(x) for x in D.prm]
    S, NB, NBS, BGS, BPG = p[P_S], p[P_NB], p[P_NBS], p[P_BGS], p[P_BPG]
    CH, COLS = p[P_CHUNK], p[P_COLS]
    sc, rest = divmod(bank, NBS)
    bg, bk = divmod(rest, BPG)
    col_hi, off = divmod(column, CH)
    if p[P_COLLOW]:
        lo, SB = sc + S * bg, S * BGS
        hi = (row * BPG + bk) * COLS + col_hi
        la = (hi * SB + _unmix(p, lo, hi, row, SB)) * CH + off
    else:
        fbh = sc + S * (bg + BGS * bk)
        hi = row * COLS + col_hi
        la = (hi * NB + _unmix(p, fbh, hi, row, NB)) * CH + off
    return channel_address(D, channel, la)


def channel_address(D: DramState, channel: int, la: int) -> int:
    """The byte address of channel-local address ``la`` of a channel (the inverse of step 1 of
    the mapping): ``la = 0, 1, 2, ...`` walks the channel's own bytes in its order."""
    p = [int(x) for x in D.prm]
    IL, C = p[P_IL], p[P_C]
    if p[P_MODE] == MODE_INTERLEAVE:
        li, lo = divmod(la, IL)
        return (li * C + channel) * IL + lo
    if p[P_MODE] == MODE_PARTITIONS:
        HV, sph = p[P_HALVES], p[P_SPH]
        cph = C // HV
        spc = sph // cph
        k, lo = divmod(la, IL)
        x, s = divmod(k, spc)
        half, j = divmod(channel, cph)
        q = x * sph + SM.unhash_slice(j * spc + s, x, sph, p[P_SPHB], p[P_SHASH])
        if p[P_HG] == 0:
            return q * IL + lo
        chunk, within = divmod(q, p[P_HG])
        return (chunk * HV + half) * p[P_ILH] + within * IL + lo
    SEG, G, CPG, CPGC, CPC, NCTRL = p[P_SEG], p[P_GROUPS], p[P_CPG], p[P_CPGC], p[P_CPC], p[P_NCTRL]
    if la < SEG // CPG:
        g = channel // CPG
        within = channel - g * CPG
        j = (within % CPC) * CPGC + within // CPC
        li, lo = divmod(la, IL)
        return g * SEG + (li * CPG + j) * IL + lo
    li, lo = divmod(la - SEG // CPG, IL)
    m = (channel % CPC) * NCTRL + channel // CPC
    return G * SEG + (li * C + m) * IL + lo


def private_rows(D: DramState) -> int:
    """Rows per bank of a channel that hold its group's private segment (segments mapping; the
    cross segment's rows follow). 0 on an interleaved machine."""
    p = D.prm
    if p[P_MODE] != MODE_SEGMENTS:
        return 0
    return int(p[P_SEG] // p[P_CPG] // (p[P_CHUNK] * p[P_NB] * p[P_COLS]))


# ---------------------------------------------------------------------------- mapping (numba)

@_jit
def _local(p, addr):
    """address -> (channel, channel-local address)."""
    IL = p[P_IL]
    C = p[P_C]
    if p[P_MODE] == MODE_INTERLEAVE:
        i = addr // IL
        return i % C, (i // C) * IL + addr % IL
    if p[P_MODE] == MODE_PARTITIONS:
        half, q = SM.half_granule(addr, p[P_ILH], p[P_HALVES], p[P_HG], IL)
        sph = p[P_SPH]
        sl = SM.slice_in_half(q, sph, p[P_SPHB], p[P_SHASH])
        cph = C // p[P_HALVES]
        spc = sph // cph
        return half * cph + sl // spc, ((q // sph) * spc + sl % spc) * IL + addr % IL
    SEG = p[P_SEG]
    G = p[P_GROUPS]
    cpg = p[P_CPG]
    cpc = p[P_CPC]
    if addr < G * SEG:
        g = addr // SEG
        off = addr - g * SEG
        i = off // IL
        cpgc = p[P_CPGC]
        j = i % cpg
        return (g * cpgc + j % cpgc) * cpc + j // cpgc, (i // cpg) * IL + off % IL
    off = addr - G * SEG
    i = off // IL
    nctrl = p[P_NCTRL]
    return (i % nctrl) * cpc + (i // nctrl) % cpc, SEG // cpg + (i // C) * IL + off % IL


@_jit
def _fold(x, m):
    """The sum of x's base-m digits, mod m (bank_hash: fold)."""
    h = np.int64(0)
    while x > 0:
        h += x % m
        x //= m
    return h % m


@_jit
def _mix(p, f, hi, row, m):
    """The bank hash of a field value f in [0, m) (address_mapping.bank_hash): fold adds the
    digit sum of the bits above the field (hi); row XORs (m a power of two) or adds the row."""
    if p[P_FOLD]:
        return (f + _fold(hi, m)) % m
    if p[P_POW2]:
        return f ^ (row & (m - 1))
    return (f + row) % m


@_jit
def _bank_row_col(p, la):
    CH = p[P_CHUNK]
    NB = p[P_NB]
    S = p[P_S]
    q = la // CH
    cols = p[P_COLS]
    if p[P_COLLOW]:
        # [sub-channel | bank group | column | bank in group | row]
        SB = S * p[P_BGS]
        rest = q // SB
        col_hi = rest % cols
        bk = rest // cols % p[P_BPG]
        row = rest // cols // p[P_BPG]
        fb = _mix(p, q % SB, q // SB, row, SB) + SB * bk
    else:
        fb = q % NB
        rest = q // NB
        col_hi = rest % cols
        row = rest // cols
        fb = _mix(p, fb, rest, row, NB)
    t = fb // S
    bank = (fb % S) * p[P_NBS] + (t % p[P_BGS]) * p[P_BPG] + t // p[P_BGS]
    return bank, row, col_hi * CH + la % CH


@_jit
def dram_map(D, addr):
    """byte address -> (channel, bank, row, column); see the module docstring for the layout."""
    p = D.prm
    ch, la = _local(p, np.int64(addr))
    bank, row, col = _bank_row_col(p, la)
    return ch, bank, row, col


@_jit
def _burst_loc(p, addr, k):
    bb = p[P_BB]
    ch, la = _local(p, (addr // bb + k) * bb)
    bank, row, col = _bank_row_col(p, la)
    return bank, row


# ---------------------------------------------------------------------------- engine (numba)

@_jit
def _log(D, c, t, cmd, bank, arg):
    L = D.prm[P_LOGLEN]
    if L > 0:
        i = D.chan[c, K_LOGN] % L
        D.log[c, i, 0] = t
        D.log[c, i, 1] = cmd
        D.log[c, i, 2] = bank
        D.log[c, i, 3] = arg
        D.chan[c, K_LOGN] += 1


@njit(inline="always")
def _slot(Q, qi, k):
    s = Q.head[qi] + k
    cap = Q.cap[qi]
    if s >= cap:
        s -= cap
    return s


@_jit
def _arrivals(D, Q, R, c, qi, now):
    """Decode the entries pushed since the last step; their arrival cycle is ``now``."""
    p = D.prm
    n = Q.count[qi]
    bb = p[P_BB]
    H = D.shadow
    for k in range(D.chan[c, K_NSEEN], n):
        sl = _slot(Q, qi, k)
        r = Q.buf[qi, sl]
        addr = R.addr[r]
        nbytes = max(np.int64(1), np.int64(R.nbytes[r]))
        nb = (addr + nbytes - 1) // bb - addr // bb + 1
        wr = 1 if R.kind[r] == KIND_WRITE else 0
        b, row = _burst_loc(p, addr, np.int64(0))
        H[c, sl, H_ADDR] = addr
        H[c, sl, H_NBYTES] = nbytes
        H[c, sl, H_K] = 0
        H[c, sl, H_NB] = nb
        H[c, sl, H_CLS] = 0
        H[c, sl, H_WR] = wr
        H[c, sl, H_BANK] = b
        H[c, sl, H_ROW] = row
        H[c, sl, H_ARR] = now
        part = 0
        if wr and p[P_RMW]:                           # bursts the write covers only in part
            if addr % bb:
                part |= 1
            if (addr + nbytes) % bb:
                part |= 1 if nb == 1 else 2
        H[c, sl, H_PART] = part
        H[c, sl, H_MERGE] = 0
        H[c, sl, H_SEQ] = D.chan[c, K_ASEQ]           # age order (queue positions are not)
        D.chan[c, K_ASEQ] += 1
        _enlist(D, c, p[P_BTAB + 2 * b], sl)
        if D.bank[c, b, B_OPEN] == row:
            D.bank[c, b, B_HITS] += 1
    D.chan[c, K_NSEEN] = n


@njit(inline="always")
def _apply_rules(D, c, b, g, s, cmd, now):
    """Command ``cmd`` issued at ``now`` on bank b (bank group g, sub-channel s): each of the
    standard's rules for it pushes the earliest cycle of a later command at the bank, its group or
    its sub-channel."""
    R = D.rules
    for i in range(D.rule_at[cmd], D.rule_at[cmd + 1]):
        t = now + R[i, 3]
        f = R[i, 2]
        sc = R[i, 1]
        if sc == 0:
            if t > D.bank[c, b, f]:
                D.bank[c, b, f] = t
        elif sc == 1:
            if t > D.bgrp[c, g, f]:
                D.bgrp[c, g, f] = t
        elif t > D.sub[c, s, f]:
            D.sub[c, s, f] = t


@njit(inline="always")
def _partial(part, k, last):
    """Burst k of a write (``last``: its last burst) covers its burst only in part."""
    return (k == 0 and (part & 1) != 0) or (last and (part & 2) != 0)


@njit(inline="always")  # called for every entry a scan visits: no call
def _eval(D, c, sl, b):
    """(command, earliest cycle) for the next command of the request in shadow slot ``sl``."""
    p = D.prm
    row = D.shadow[c, sl, H_ROW]
    orow = D.bank[c, b, B_OPEN]
    s = p[P_BTAB + 2 * b]
    g = p[P_BTAB + 2 * b + 1]
    if orow == row:
        k = D.shadow[c, sl, H_K]
        last = k == D.shadow[c, sl, H_NB] - 1
        if D.shadow[c, sl, H_WR]:
            merge = D.shadow[c, sl, H_MERGE]
            if merge == 0 and _partial(D.shadow[c, sl, H_PART], k, last):
                # read-modify-write: the burst's old data first (its read returns nothing)
                return CMD_RD, max(D.bank[c, b, B_RD], D.bgrp[c, g, G_RD], D.sub[c, s, S_RD],
                                   D.sub[c, s, S_BUS] // FP - p[P_TCL])
            if last and D.chan[c, K_INFN] + p[P_S] > p[P_RETCAP]:
                return CMD_WR, NEVER
            return CMD_WR, max(D.bank[c, b, B_WR], D.bgrp[c, g, G_WR], D.sub[c, s, S_WR],
                               D.sub[c, s, S_BUS] // FP - p[P_TCWL], merge)
        if last and D.chan[c, K_INFN] + p[P_S] > p[P_RETCAP]:
            return CMD_RD, NEVER
        return CMD_RD, max(D.bank[c, b, B_RD], D.bgrp[c, g, G_RD], D.sub[c, s, S_RD],
                           D.sub[c, s, S_BUS] // FP - p[P_TCL])
    if orow < 0:
        return CMD_ACT, max(D.bank[c, b, B_ACT], D.bgrp[c, g, G_ACT], D.sub[c, s, S_ACT],
                            D.sub[c, s, S_FAW + D.sub[c, s, S_FAWI]] + p[P_TFAW])
    return CMD_PRE, D.bank[c, b, B_PRE]


@_jit
def _ref_eval(D, c, s):
    """(command, earliest cycle) for the due refresh of sub-channel s: PREA or REF (all-bank),
    PRE or REFSB of the bank whose turn it is (per-bank)."""
    nbs = D.prm[P_NBS]
    r = D.sub[c, s, S_REF]
    if D.prm[P_REFPB]:
        b = s * nbs + D.sub[c, s, S_REFB]
        if D.bank[c, b, B_OPEN] >= 0:
            return CMD_PRE, max(r, D.bank[c, b, B_PRE])
        return CMD_REFSB, max(r, D.bank[c, b, B_ACT])
    any_open = False
    for b in range(s * nbs, (s + 1) * nbs):
        if D.bank[c, b, B_OPEN] >= 0:
            any_open = True
            r = max(r, D.bank[c, b, B_PRE])
    if any_open:
        return CMD_PREA, r
    for b in range(s * nbs, (s + 1) * nbs):
        r = max(r, D.bank[c, b, B_ACT])
    return CMD_REF, r


@_jit
def _ref_issue(D, c, s, cmd, now):
    p = D.prm
    nbs = p[P_NBS]
    if p[P_REFPB]:
        b = s * nbs + D.sub[c, s, S_REFB]
        if cmd == CMD_PRE:
            D.bank[c, b, B_OPEN] = -1
            D.bank[c, b, B_HITS] = 0
            D.bank[c, b, B_ACT] = max(D.bank[c, b, B_ACT], now + p[P_TRP])
            D.cnt[c, C_PRECHARGES] += 1
        else:
            D.bank[c, b, B_ACT] = max(D.bank[c, b, B_ACT], now + p[P_TRFCPB])
            D.sub[c, s, S_REF] += p[P_TREFIPB]
            D.sub[c, s, S_REFB] = (D.sub[c, s, S_REFB] + 1) % nbs
            D.cnt[c, C_REFRESHES] += 1
        _log(D, c, now, cmd, b, np.int64(-1))
        return
    if cmd == CMD_PREA:
        for b in range(s * nbs, (s + 1) * nbs):
            if D.bank[c, b, B_OPEN] >= 0:
                D.bank[c, b, B_OPEN] = -1
                D.bank[c, b, B_HITS] = 0
                D.bank[c, b, B_ACT] = max(D.bank[c, b, B_ACT], now + p[P_TRP])
                D.cnt[c, C_PRECHARGES] += 1
    else:
        for b in range(s * nbs, (s + 1) * nbs):
            D.bank[c, b, B_ACT] = max(D.bank[c, b, B_ACT], now + p[P_TRFC])
        D.sub[c, s, S_REF] += p[P_TREFI]
        D.cnt[c, C_REFRESHES] += 1
    _log(D, c, now, cmd, s, np.int64(-1))


@_jit
def _ref_blocks(D, c, s, b):
    """While sub-channel s's refresh is due, may bank b not serve requests? All-bank: every bank
    of s; per-bank: only the bank whose turn it is."""
    if D.prm[P_REFPB] == 0:
        return True
    return b == s * D.prm[P_NBS] + D.sub[c, s, S_REFB]


@_jit
def _link(D, c, s, o, y):
    """Make o the next older entry of y in sub-channel s's age list (-1: y is the oldest, o is the
    youngest)."""
    if o >= 0:
        D.shadow[c, o, H_YOUNGER] = y
    else:
        D.sub[c, s, S_OLDEST] = y
    if y >= 0:
        D.shadow[c, y, H_OLDER] = o
    else:
        D.sub[c, s, S_YOUNGEST] = o


@_jit
def _enlist(D, c, s, sl):
    """Put the entry in slot sl into sub-channel s's age list at its age (H_SEQ): at the young end
    for an arrival, further in for a request whose next burst moved it from another sub-channel."""
    H = D.shadow
    seq = H[c, sl, H_SEQ]
    o = D.sub[c, s, S_YOUNGEST]
    y = np.int64(-1)
    D.sub[c, s, S_WAKE] = 0                          # its scheduler looks again
    while o >= 0 and H[c, o, H_SEQ] > seq:
        y = o
        o = H[c, o, H_OLDER]
    _link(D, c, s, o, sl)
    _link(D, c, s, sl, y)


@_jit
def _delist(D, c, sl):
    """Take the entry in slot sl out of its sub-channel's age list."""
    H = D.shadow
    _link(D, c, D.prm[P_BTAB + 2 * H[c, sl, H_BANK]], H[c, sl, H_OLDER], H[c, sl, H_YOUNGER])


@_jit
def _remove(D, Q, c, qi, a):
    """Remove the entry in physical slot ``a`` in O(1): the head entry (and its shadow) moves into
    the hole and the head advances. Seen entries stay in front of unseen ones; their age order
    lives in H_SEQ and the age list, not in their positions (the list follows the moved entry)."""
    cap = Q.cap[qi]
    n = Q.count[qi]
    h = Q.head[qi]
    H = D.shadow
    _delist(D, c, a)
    if a != h:
        Q.buf[qi, a] = Q.buf[qi, h]
        for f in range(H_N):
            H[c, a, f] = H[c, h, f]
        s = D.prm[P_BTAB + 2 * H[c, a, H_BANK]]
        _link(D, c, s, H[c, a, H_OLDER], a)   # its neighbours now find it in slot a
        _link(D, c, s, a, H[c, a, H_YOUNGER])
    h += 1
    if h >= cap:
        h = 0
    Q.head[qi] = h
    Q.count[qi] = n - 1
    D.chan[c, K_NSEEN] -= 1


@_jit
def _issue(D, Q, c, qi, sl, now):
    """Issue the next command of the request in physical queue slot ``sl`` (its readiness was
    checked); True when that was its last burst and the request left the queue."""
    p = D.prm
    H = D.shadow
    b = H[c, sl, H_BANK]
    row = H[c, sl, H_ROW]
    cmd, ready = _eval(D, c, sl, b)
    s = p[P_BTAB + 2 * b]
    g = p[P_BTAB + 2 * b + 1]
    first = H[c, sl, H_K] == 0 and H[c, sl, H_CLS] == 0
    if cmd == CMD_ACT:
        D.bank[c, b, B_OPEN] = row
        hits = 0                                     # queued requests whose next burst hits the new row
        for j in range(Q.count[qi]):
            sj = _slot(Q, qi, j)
            if H[c, sj, H_BANK] == b and H[c, sj, H_ROW] == row:
                hits += 1
        D.bank[c, b, B_HITS] = hits
        _apply_rules(D, c, b, g, s, CMD_ACT, now)
        D.bank[c, b, B_STREAK] = 0
        i = D.sub[c, s, S_FAWI]
        D.sub[c, s, S_FAW + i] = now
        D.sub[c, s, S_FAWI] = (i + 1) & 3
        D.cnt[c, C_ACTIVATES] += 1
        if first:
            H[c, sl, H_CLS] = 2                      # a miss (counted at its column command)
        _log(D, c, now, np.int64(CMD_ACT), b, row)
        return False
    if cmd == CMD_PRE:
        D.bank[c, b, B_OPEN] = -1
        D.bank[c, b, B_HITS] = 0
        _apply_rules(D, c, b, g, s, CMD_PRE, now)
        D.cnt[c, C_PRECHARGES] += 1
        if first:
            H[c, sl, H_CLS] = 3                      # a conflict
        _log(D, c, now, np.int64(CMD_PRE), b, np.int64(-1))
        return False
    # column command (RD / WR) on the open row
    kk = H[c, sl, H_K]
    nb = H[c, sl, H_NB]
    wr = H[c, sl, H_WR]
    if kk == 0 and H[c, sl, H_MERGE] == 0:
        cls = H[c, sl, H_CLS]
        if cls == 0:
            D.cnt[c, C_ROW_HITS] += 1
        elif cls == 2:
            D.cnt[c, C_ROW_MISSES] += 1
        else:
            D.cnt[c, C_ROW_CONFLICTS] += 1
    _apply_rules(D, c, b, g, s, cmd, now)
    lat = p[P_TCL] if cmd == CMD_RD else p[P_TCWL]
    bfp = p[P_BFP]
    end = max(D.sub[c, s, S_BUS], (now + lat) * FP) + bfp
    D.sub[c, s, S_BUS] = end
    D.cnt[c, C_BUS_BUSY_FP] += bfp
    rid = Q.buf[qi, sl]
    _log(D, c, now, cmd, b, np.int64(rid))
    if wr and cmd == CMD_RD:
        # the read of a read-modify-write: the merged burst may be written once its old data is
        # back (the burst stays the request's next one, and its row stays wanted; the pair counts
        # as one hit of the row's streak)
        H[c, sl, H_MERGE] = max(np.int64(1), (end + FP - 1 - TOL) // FP)
        D.cnt[c, C_RMW_READS] += 1
        return False
    H[c, sl, H_MERGE] = 0
    D.bank[c, b, B_STREAK] += 1
    kk += 1
    D.bank[c, b, B_HITS] -= 1                       # this burst no longer waits on the row
    removed = kk == nb
    if removed:                                      # last burst: to the return buffer
        # the return buffer is a ring sorted by completion cycle (ties: issue order)
        done = (end + FP - 1 - TOL) // FP
        F = D.ret
        cap = p[P_RETCAP]
        h = D.chan[c, K_RHEAD]
        pos = D.chan[c, K_INFN]
        while pos > 0:
            prev = (h + pos - 1) % cap
            if F[c, prev, F_DONE] <= done:
                break
            cur = (h + pos) % cap
            for f in range(F_N):
                F[c, cur, f] = F[c, prev, f]
            pos -= 1
        i = (h + pos) % cap
        F[c, i, F_ID] = rid
        F[c, i, F_DONE] = done
        F[c, i, F_ARR] = H[c, sl, H_ARR]
        F[c, i, F_NBYTES] = H[c, sl, H_NBYTES]
        F[c, i, F_WR] = wr
        D.chan[c, K_INFN] += 1
        _remove(D, Q, c, qi, sl)
    else:
        nbk, nrow = _burst_loc(p, H[c, sl, H_ADDR], kk)
        ns = p[P_BTAB + 2 * nbk]
        if ns != s:                                  # a misaligned request's next burst: another list
            _delist(D, c, sl)                        # (found by its old bank)
            _enlist(D, c, ns, sl)
        H[c, sl, H_BANK] = nbk
        H[c, sl, H_ROW] = nrow
        H[c, sl, H_K] = kk
        if D.bank[c, nbk, B_OPEN] == nrow:
            D.bank[c, nbk, B_HITS] += 1
    if p[P_ROWPOL] == 1 and D.bank[c, b, B_HITS] <= 0:   # closed rows: auto-precharge after the last hit
        tp = max(D.bank[c, b, B_PRE], now + 1)
        D.bank[c, b, B_OPEN] = -1
        D.bank[c, b, B_HITS] = 0
        _apply_rules(D, c, b, g, s, CMD_PRE, tp)
        D.cnt[c, C_PRECHARGES] += 1
        _log(D, c, tp, np.int64(CMD_PRE), b, np.int64(-2))
    return removed


@_jit
def _sched(D, Q, c, qi, now, issue):
    """Pick (and with ``issue`` issue) at most one command per sub-channel. Returns the earliest
    cycle at which a command of this channel could issue given the state before this call
    (NEVER if none; with ``issue`` it may be too late for sub-channels that issued) and whether
    anything issued."""
    p = D.prm
    S = p[P_S]
    frfcfs = p[P_POLICY] == 1
    U = D.sub
    H = D.shadow
    ev = NEVER
    issued = False
    for s in range(S):
        U[c, s, S_SEL] = -1
        U[c, s, S_SELSEQ] = NEVER
    n = Q.count[qi]
    if n > 0 and not frfcfs:
        # FCFS: only the oldest request of each sub-channel may issue
        for k in range(n):
            sl = _slot(Q, qi, k)
            s = p[P_BTAB + 2 * H[c, sl, H_BANK]]
            if H[c, sl, H_SEQ] < U[c, s, S_SELSEQ]:
                U[c, s, S_SELSEQ] = H[c, sl, H_SEQ]
                U[c, s, S_SEL] = sl
        for s in range(S):
            sl = U[c, s, S_SEL]
            if sl < 0 or (U[c, s, S_REF] <= now and _ref_blocks(D, c, s, H[c, sl, H_BANK])):
                U[c, s, S_SEL] = -1
                continue
            cmd, ready = _eval(D, c, sl, H[c, sl, H_BANK])
            if ready < ev:
                ev = ready
            if not (issue and ready <= now):
                U[c, s, S_SEL] = -1
    elif n > 0 and issue:
        # FR-FCFS: the oldest ready row hit, else the oldest ready ACT / PRE. Each sub-channel's
        # entries are visited oldest first (its age list), so its first ready hit is its choice,
        # and once it has chosen an ACT / PRE only a hit can still win: none can when the
        # sub-channel's own column timing (tCCD_S, tWTR_S, its data bus) is not ready, and the
        # scan of that sub-channel ends. A sub-channel that chose nothing skipped nothing, so
        # the earliest cycle returned when nothing issues is that of a scan of every entry.
        for s in range(S):
            if U[c, s, S_WAKE] > now:
                # nothing of this sub-channel changed since a scan found nothing could issue before
                # S_WAKE (its own commands, arrivals, requests moved in and retirements wake it)
                if U[c, s, S_WAKE] < ev:
                    ev = U[c, s, S_WAKE]
                continue
            U[c, s, S_WAKE] = NEVER                  # lowered by the scan and the refresh below
            refb = np.int64(-1)                      # the bank whose refresh is due (per-bank)
            if U[c, s, S_REF] <= now:
                if p[P_REFPB] == 0:
                    continue                         # all-bank refresh due: no bank serves requests
                refb = s * p[P_NBS] + U[c, s, S_REFB]
            bus = U[c, s, S_BUS] // FP
            col = min(max(U[c, s, S_RD], bus - p[P_TCL]), max(U[c, s, S_WR], bus - p[P_TCWL])) <= now
            sl = U[c, s, S_OLDEST]
            while sl >= 0:
                nxt = H[c, sl, H_YOUNGER]
                b = H[c, sl, H_BANK]
                hit = D.bank[c, b, B_OPEN] == H[c, sl, H_ROW]
                if b == refb or (U[c, s, S_SEL] >= 0 and not hit):
                    sl = nxt                         # refresh due for its bank; an older ACT / PRE won
                    continue
                cmd, ready = _eval(D, c, sl, b)
                if cmd == CMD_PRE and D.bank[c, b, B_HITS] > 0 and D.bank[c, b, B_STREAK] < p[P_HITCAP]:
                    sl = nxt                         # keep the row open for its queued hits
                    continue
                if ready < ev:
                    ev = ready
                if ready < U[c, s, S_WAKE]:
                    U[c, s, S_WAKE] = ready
                if ready <= now:
                    U[c, s, S_SEL] = sl
                    if hit or not col:
                        break
                sl = nxt
    elif n > 0:
        # FR-FCFS without issuing (dram_next_event): the earliest cycle any entry can go
        for k in range(n):
            sl = _slot(Q, qi, k)
            b = H[c, sl, H_BANK]
            s = p[P_BTAB + 2 * b]
            if U[c, s, S_REF] <= now and _ref_blocks(D, c, s, b):
                continue                             # refresh due: the sub-channel (bank) serves it first
            cmd, ready = _eval(D, c, sl, b)
            if cmd == CMD_PRE and D.bank[c, b, B_HITS] > 0 and D.bank[c, b, B_STREAK] < p[P_HITCAP]:
                continue                             # keep the row open for its queued hits
            if ready < ev:
                ev = ready
    for s in range(S):
        if U[c, s, S_REF] <= now:
            cmd, ready = _ref_eval(D, c, s)
            if issue and ready <= now:
                _ref_issue(D, c, s, cmd, now)
                U[c, s, S_SEL] = -1                  # the refresh took the command slot (per-bank)
                U[c, s, S_WAKE] = now + 1
                issued = True
            else:
                if ready < ev:
                    ev = ready
                if ready < U[c, s, S_WAKE]:
                    U[c, s, S_WAKE] = ready
        else:
            if U[c, s, S_REF] < ev:
                ev = U[c, s, S_REF]
            if U[c, s, S_REF] < U[c, s, S_WAKE]:
                U[c, s, S_WAKE] = U[c, s, S_REF]
    if issue:
        for s in range(S):
            sl = U[c, s, S_SEL]
            if sl < 0:
                continue
            U[c, s, S_WAKE] = now + 1                # (a request it moves to another sub-channel wakes that one)
            h = Q.head[qi]
            if _issue(D, Q, c, qi, sl, now) and sl != h:
                # the request left the queue and the head entry moved into its slot
                for s2 in range(s + 1, S):
                    if U[c, s2, S_SEL] == h:
                        U[c, s2, S_SEL] = sl
            issued = True
    return ev, issued


@_jit
def _retire(D, Q, c, qo, now):
    """Push requests whose data has transferred, earliest first; count a blocked cycle when the
    output queue refuses one."""
    F = D.ret
    cap = D.prm[P_RETCAP]
    while D.chan[c, K_INFN] > 0:
        i = D.chan[c, K_RHEAD]
        if F[c, i, F_DONE] > now:
            return
        if Q.count[qo] >= Q.cap[qo]:
            D.cnt[c, C_BLOCKED] += 1
            return
        Q.buf[qo, _slot(Q, qo, Q.count[qo])] = F[c, i, F_ID]
        Q.count[qo] += 1
        if F[c, i, F_WR]:
            D.cnt[c, C_WRITES] += 1
            D.cnt[c, C_BYTES_WRITTEN] += F[c, i, F_NBYTES]
        else:
            D.cnt[c, C_READS] += 1
            D.cnt[c, C_BYTES_READ] += F[c, i, F_NBYTES]
        D.cnt[c, C_LAT_SUM] += now - F[c, i, F_ARR]
        D.cnt[c, C_LAT_COUNT] += 1
        D.chan[c, K_RHEAD] = (i + 1) % cap
        D.chan[c, K_INFN] -= 1


@_jit
def dram_step(D, Q, R, q_in_base, q_out_base, now_mem):
    """Advance every channel by one memory-clock cycle (cycle ``now_mem``; cycles must increase)."""
    p = D.prm
    now = np.int64(now_mem)
    gap = now - D.last_step[0] - 1
    busy = 0
    for c in range(p[P_C]):
        qi = q_in_base + c
        if Q.cap[qi] > p[P_QCAP]:                    # would overrun the shadow: refuse the channel
            D.chan[c, K_ERR] |= ERR_QUEUE_CAP
            continue
        if gap > 0:
            D.cnt[c, C_QUEUE_OCC] += D.chan[c, K_LASTCOUNT] * gap
        wake = D.chan[c, K_WAKE]
        changed = False
        if Q.count[qi] > D.chan[c, K_NSEEN]:
            _arrivals(D, Q, R, c, qi, now)
            wake = now
            changed = True
        n = Q.count[qi]
        D.cnt[c, C_QUEUE_OCC] += n
        if n > D.cnt[c, C_QUEUE_MAX]:
            D.cnt[c, C_QUEUE_MAX] = n
        if D.chan[c, K_INFN] > 0:
            before = D.chan[c, K_INFN]
            _retire(D, Q, c, q_out_base + c, now)
            if D.chan[c, K_INFN] != before:
                wake = now
                changed = True
                for s in range(p[P_S]):              # room in the return buffer: a last burst may go
                    D.sub[c, s, S_WAKE] = 0
        # the scheduler's state changes only by its own commands, arrivals and retirements, so
        # until the cycle its last scan named nothing can issue: skip the scan
        if now >= wake:
            ev, issued = _sched(D, Q, c, qi, now, np.int64(1))
            D.chan[c, K_WAKE] = now + 1 if issued else ev
            changed |= issued
        D.chan[c, K_LASTCOUNT] = Q.count[qi]
        busy += changed
    D.vis[0] += p[P_C]
    D.vis[1] += busy
    D.last_step[0] = now


@_jit
def dram_next_event(D, Q, q_in_base, now_mem):
    """The earliest memory cycle >= now_mem at which a step can change anything: a command can
    issue, data completes, a refresh falls due; now_mem when a new request waits to be seen or a
    finished one waits on a full output queue."""
    p = D.prm
    now = np.int64(now_mem)
    ev = NEVER
    for c in range(p[P_C]):
        qi = q_in_base + c
        if Q.count[qi] != D.chan[c, K_NSEEN]:
            return now
        if D.chan[c, K_INFN] > 0:
            d = D.ret[c, D.chan[c, K_RHEAD], F_DONE]     # the ring is sorted: its head is due first
            if d <= now:
                return now
            if d < ev:
                ev = d
        e = D.chan[c, K_WAKE]                   # the last scan's answer holds while nothing changed
        if e <= now:
            e, issued = _sched(D, Q, c, qi, now, np.int64(0))
        if e < ev:
            ev = e
    if ev < now:
        ev = now
    return ev
