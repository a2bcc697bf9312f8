"""The hardware description: one pydantic v2 tree for both machine families.

A GPU (A100, H100) and the Sunway SW26010-Pro are both "core groups of cores that run warps, a
fabric, memory partitions" (docs/architecture.md); blocks a family lacks are optional and ``None``
when absent (``l1``, ``l2``, ``tensor``, ``dma``, ``rma``, ``mesh``, ``mpe``).

Conventions
- Every model is ``extra="forbid"`` (an unknown key is an error) and ``frozen=True``; mappings are
  ``FrozenDict`` and lists are tuples, so a resolved ``Machine`` is immutable and hashable.
- Units are in field names: ``*_ghz``, ``*_cycles``, ``*_kib``, ``*_bytes``, ``*_gbps``,
  ``bytes_per_cycle``. Cycles are core-clock cycles unless the block says otherwise: ``fabric``
  and ``l2`` count fabric-clock cycles, ``dram.timing`` counts memory-clock cycles. The clocks
  are ``clock_ghz`` and ``clock_ratios`` (fabric and memory clock = ratio x core clock).
- Per-unit rates are per sub-core (``pipes``), per tensor unit (``tensor``), per core (``l1``,
  ``scratchpad``), per slice (``l2``), per engine (``dma``, ``rma``), per channel (``dram``).
  Whole-machine peaks are derived (``archsim.config.derived``), never typed in.

Pipes: ``pipes`` maps a pipe name to what it serves (ISA unit classes), how many lanes of each
dtype it retires per cycle per sub-core (a warp of ``warp_width`` lanes occupies the pipe for
``ceil(warp_width / lanes)`` cycles), and its latency (``latency_cycles``, or a per-latency-key
override). A dtype a pipe does not list runs at its ``b`` rate; a pipe without ``b`` cannot run
dtypes it does not list. ``tensor``, ``dma`` and ``rma`` are served by their blocks, not by pipes.
bf16 arithmetic belongs to unit class ``fp16`` (dtype ``bf16x2``).

Cross-field checks raise ``FieldError`` with the dotted path of the offending field, so the
loader can print one line naming the file, the field and what is allowed.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# ---- fixed vocabularies shared with the ISA (isa/opcodes.yaml) --------------------------------

UNIT_CLASSES = ("int", "fp32", "fp16", "fp64", "mufu", "conv", "shfl", "lsu", "tensor", "ctrl",
                "sync", "dma", "rma")
BLOCK_UNITS = ("tensor", "dma", "rma")          # served by their config blocks, never by a pipe
REQUIRED_UNITS = ("int", "ctrl", "sync")        # every core (and MPE) needs a pipe for these
PIPE_DTYPES = ("i64", "f32", "f16x2", "bf16x2", "f64", "pred", "b")
LATENCY_KEYS = ("int", "int_mul", "int_div", "fp32", "fp16", "fp64", "mufu", "conv", "shfl",
                "s2r", "branch")
TENSOR_DTYPES = ("fp16", "bf16", "tf32", "fp64", "int8", "fp8")
FAMILIES = ("gpu", "sunway")

UnitClass = Literal["int", "fp32", "fp16", "fp64", "mufu", "conv", "shfl", "lsu", "tensor", "ctrl",
                    "sync", "dma", "rma"]
PipeDtype = Literal["i64", "f32", "f16x2", "bf16x2", "f64", "pred", "b"]
LatencyKey = Literal["int", "int_mul", "int_div", "fp32", "fp16", "fp64", "mufu", "conv", "shfl",
                     "s2r", "branch"]
TensorDtype = Literal["fp16", "bf16", "tf32", "fp64", "int8", "fp8"]


class FieldError(ValueError):
    """A cross-field check failed. ``path`` is dotted and relative to the model that raised it;
    ``related`` names other fields the message is about (the loader blames whichever of them the
    user changed last)."""

    def __init__(self, path: str, what: str, allowed: str = "", related: tuple[str, ...] = ()):
        self.path = path
        self.what = what
        self.allowed = allowed
        self.related = tuple(related)
        super().__init__(what)


class FrozenDict(dict):
    """A read-only, hashable, picklable dict (what mapping fields hold after validation)."""

    __slots__ = ()

    def _ro(self, *a, **k):
        raise TypeError("a resolved Machine is frozen; use --set / overlays to change it")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _ro

    def __hash__(self):
        return hash(frozenset(self.items()))

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


K = TypeVar("K")
V = TypeVar("V")
FMap = Annotated[dict[K, V], AfterValidator(FrozenDict)]

# choice: counts and sizes stay below 2^53 (exact as floats, far beyond any machine; a 30-digit
# number would overflow the engine's int64 arrays), and no number is infinite or NaN
MAX_INT = 2 ** 53
PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_INT)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=MAX_INT)]
# choice: a latency or cost in cycles stays below 2^31 (a second at 2 GHz, past any pipe or link;
# the engine keeps latencies in int32 tables)
MAX_CYCLES = 2 ** 31 - 1
PosCycles = Annotated[int, Field(strict=True, gt=0, le=MAX_CYCLES)]
NonNegCycles = Annotated[int, Field(strict=True, ge=0, le=MAX_CYCLES)]
PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]
Text = Annotated[str, Field(strict=True, min_length=1)]


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _check_pipes(pipes: dict, prefix: str, what_core: str) -> None:
    served = set()
    for name, p in pipes.items():
        served.update(p.serves)
    for u in REQUIRED_UNITS:
        if u not in served:
            raise FieldError(prefix, f"no pipe serves unit class {u!r} on the {what_core}",
                             f"every {what_core} needs pipes serving {', '.join(REQUIRED_UNITS)}")


# ---- blocks ---------------------------------------------------------------------------------

class ClockRatios(Frozen):
    """Clock domains relative to the core clock (``clock_ghz``)."""

    fabric: PosFloat        # fabric (crossbar / ring) and L2 clock = fabric x clock_ghz
    memory: PosFloat        # DRAM command clock (the one dram.timing counts) = memory x clock_ghz


class Cores(Frozen):
    kind: Literal["sm", "cpe"]
    per_group: PosInt               # cores in one core group (SMs on a GPU, CPEs per CG)
    warp_width: PosInt              # lanes per warp (32; on a CPE the 512-bit vector)
    warp_slots: PosInt              # resident warps per core
    max_blocks: PosInt              # resident thread blocks per core
    subcores: PosInt                # schedulers per core, each owning warp_slots/subcores warps
    scheduler: Literal["lrr", "gto"]  # loose round robin | greedy-then-oldest
    issue_per_cycle: PosInt         # warp-instructions issued per cycle per sub-core
    # The core's memory side (choices: not published; today's values as defaults)
    mio_queue_entries: PosInt = 8       # memory instructions queued between issue and the data pipe
    load_trackers: PosInt = 512         # loads / async copies in flight per core (L1 MSHRs bound the misses)
    # requests waiting to enter the fabric per core (the data pipe keeps two entries spare)
    miss_queue_entries: Annotated[int, Field(strict=True, ge=3, le=MAX_INT)] = 64
    # A GPU's block launch (engine/core.py dispatch_block): a block's warps issue block_launch_cycles
    # after its slot frees (the block before it retired, or the kernel began), and a core starts at
    # most one block every block_interval_cycles. 0 / 0: a block starts in the cycle its slot frees.
    # A CPE's blocks start as its MPE launches them (mpe.*) and then run on in its thread: 0 there.
    block_launch_cycles: NonNegCycles = 0
    block_interval_cycles: NonNegCycles = 0

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "cpe":
            for f in ("block_launch_cycles", "block_interval_cycles"):
                if getattr(self, f):
                    raise FieldError(f, f"{f} {getattr(self, f)} on a CPE: its blocks start as its MPE launches "
                                        "them (mpe.spawn_cycles_per_cpe) and run on in its thread", "0")
        if self.warp_width > 32 or not _is_pow2(self.warp_width):
            raise FieldError("warp_width", f"warp_width {self.warp_width} is not a power of two <= 32",
                             "1, 2, 4, 8, 16 or 32")
        if self.warp_slots % self.subcores:
            raise FieldError("subcores", f"subcores {self.subcores} does not divide warp_slots "
                             f"{self.warp_slots}", "a divisor of cores.warp_slots", ("warp_slots",))
        if self.max_blocks > self.warp_slots:
            raise FieldError("max_blocks", f"max_blocks {self.max_blocks} exceeds warp_slots "
                             f"{self.warp_slots} (a block needs at least one warp)",
                             f"at most {self.warp_slots}", ("warp_slots",))
        return self


class RegisterFile(Frozen):
    regs_per_core: PosInt           # 32-bit registers per core (SM / CPE)
    max_regs_per_thread: PosInt     # per lane
    banks: PosInt                   # register-file banks per sub-core (operand-collector conflicts)


class Pipe(Frozen):
    serves: Annotated[tuple[UnitClass, ...], Field(min_length=1)]
    lanes_per_cycle: Annotated[FMap[PipeDtype, PosFloat], Field(min_length=1)]  # per sub-core
    latency_cycles: PosCycles          # issue -> result for a dependent instruction
    latency_overrides_cycles: FMap[LatencyKey, PosCycles] = Field(default_factory=FrozenDict)

    @model_validator(mode="after")
    def _check(self):
        for i, u in enumerate(self.serves):
            if u in BLOCK_UNITS:
                raise FieldError(f"serves[{i}]", f"unit class {u!r} is served by the {u} block, not a pipe",
                                 "unit classes other than " + ", ".join(BLOCK_UNITS))
            if u in self.serves[:i]:
                raise FieldError(f"serves[{i}]", f"unit class {u!r} listed twice", "each unit class once")
        return self


class Wgmma(Frozen):
    """Warpgroup MMA (wgmma.mma_async): each warp of a warpgroup runs its 16-row slice on its own
    sub-core's tensor unit at mac_steps_per_cycle, asynchronously to its issue."""
    latency_cycles: NonNegInt       # after the last step until the accumulators are complete
    queue_depth: Annotated[int, Field(strict=True, gt=0, le=64)]   # wgmma a sub-core's tensor unit holds issued
                                    # and unfinished; one more waits


class Tma(Frozen):
    """The tensor memory accelerator of an SM (Hopper TMA): bulk tensor copies from global memory into
    the scratchpad, completing on transaction barriers (the ISA's mbarrier.* and cp.async.bulk.tensor)."""
    startup_cycles: NonNegInt        # issue until a copy's first request may leave: descriptor fetch and decode
    requests_per_cycle: Annotated[int, Field(strict=True, gt=0, le=8)]   # line requests the unit generates a cycle
    queue_depth: Annotated[int, Field(strict=True, gt=0, le=64)]   # copies issued and still generating requests;
                                     # one more stalls its warp (pipe busy)
    max_inflight_lines: PosInt       # line requests of the SM's unit in flight at once


class Clusters(Frozen):
    """Thread-block clusters (Hopper): a cluster's blocks run at once on distinct SMs of one GPC
    and reach each other's scratchpads over the SM-to-SM network (the ISA's barrier.cluster,
    ld.dsmem, st.dsmem)."""
    gpc_sms: Annotated[tuple[PosInt, ...], Field(min_length=1)]   # SMs of each GPC, in core order
    # blocks a cluster may have: at most 16 (a TMA multicast's mask has 16 bits [PTX ISA, ctaMask])
    max_blocks: Annotated[PosInt, Field(le=16)]
    dsmem_latency_cycles: PosCycles      # a remote scratchpad access's round trip, no contention
    dsmem_bytes_per_cycle: PosInt        # an SM's port into the SM-to-SM network (accesses it serves)
    gpc_bytes_per_cycle: PosInt          # a GPC's SM-to-SM switch, all its SMs' accesses together
    barrier_cycles: PosCycles            # barrier.cluster: its last arrival until its warps go on


class Tensor(Frozen):
    units_per_core: PosInt                       # tensor units per core (A100: one per sub-core)
    mac_array: tuple[PosInt, PosInt, PosInt]     # m, n, k of one MAC step (4x4x4 = 64 FMA)
    mac_steps_per_cycle: Annotated[FMap[TensorDtype, PosFloat], Field(min_length=1)]  # per unit
    latency_cycles: PosCycles                       # pipeline fill/drain after the last step
    # per unit, the rate of the ISA's warp-level mma where it is below the unit's own (the peak): Hopper's
    # units reach theirs only from warpgroup wgmma (the ISA's wgmma.*, with `wgmma` below); dtypes left
    # out run at mac_steps_per_cycle
    mma_sync_steps_per_cycle: FMap[TensorDtype, PosFloat] = Field(default_factory=FrozenDict)
    # cycles from an mma's issue during which its sub-core's arithmetic pipes (those serving none of lsu,
    # shfl, ctrl, sync) take no other instruction: the mma's A, B and C operands hold the register-file
    # reads (1: only its own issue cycle)
    operand_hold_cycles: PosCycles = 1
    wgmma: Optional[Wgmma] = None   # the ISA's wgmma.* opcodes run here (Hopper); absent: refused at load

    @model_validator(mode="after")
    def _check(self):
        for dt, rate in self.mma_sync_steps_per_cycle.items():
            peak = self.mac_steps_per_cycle.get(dt)
            if peak is None:
                raise FieldError(f"mma_sync_steps_per_cycle.{dt}", f"{dt} has no mac_steps_per_cycle rate",
                                 "dtypes of mac_steps_per_cycle: " + ", ".join(self.mac_steps_per_cycle),
                                 ("mac_steps_per_cycle",))
            if rate > peak:
                raise FieldError(f"mma_sync_steps_per_cycle.{dt}", f"{rate} exceeds mac_steps_per_cycle.{dt} {peak}",
                                 f"at most {peak}, the unit's own rate", ("mac_steps_per_cycle",))
        return self


class Scratchpad(Frozen):
    kind: Literal["shared", "ldm"]
    size_kib: NonNegInt             # shared memory per SM (the carveout) | LDM per CPE
    banks: PosInt
    bank_width_bytes: PosInt        # banks x bank_width_bytes = bytes per cycle per core
    latency_cycles: PosCycles          # unloaded load-to-use
    carved_from_l1: Bool = False    # shared memory takes size_kib of the unified l1 array
    carveouts_kib: Optional[Annotated[tuple[NonNegInt, ...], Field(min_length=1)]] = None   # allowed size_kib values
    # fixed: every kernel gets size_kib; per_kernel: a kernel gets the smallest allowed carveout
    # (at most size_kib) that holds the blocks its other limits let a core run, as the CUDA driver
    # picks it, and the rest of the array is L1 cache
    carveout: Literal["fixed", "per_kernel"] = "fixed"
    reserved_per_block_bytes: NonNegInt = 0     # shared memory the driver keeps per resident block
    cache_kib: NonNegInt = 0        # LDM part used as a data cache (Sunway)
    cache_options_kib: Optional[tuple[NonNegInt, ...]] = None
    cache_line_bytes: Optional[PosInt] = None
    cache_assoc: Optional[PosInt] = None        # ways of the LDM cache
    cache_mshrs: Optional[PosInt] = None        # LDM-cache lines in flight per CPE
    shared_modes: Optional[tuple[tuple[PosInt, PosInt], ...]] = None  # shared-LDM CPE groups (rows, cols)

    @model_validator(mode="after")
    def _check(self):
        if self.carveouts_kib is not None and self.size_kib not in self.carveouts_kib:
            raise FieldError("size_kib", f"size_kib {self.size_kib} is not an allowed carveout",
                             "one of: " + ", ".join(str(c) for c in self.carveouts_kib), ("carveouts_kib",))
        if self.kind == "shared" and (self.cache_kib or self.cache_options_kib):
            raise FieldError("cache_kib", "shared memory has no cache part (cache_kib is for an LDM)",
                             "cache_kib: 0 and no cache_options_kib")
        if self.kind == "ldm" and self.carved_from_l1:
            raise FieldError("carved_from_l1", "an LDM is not carved from an L1", "false")
        if self.carveout == "per_kernel" and not (self.carved_from_l1 and self.carveouts_kib):
            raise FieldError("carveout", "per_kernel needs shared memory carved from the L1 with carveouts_kib",
                             "fixed, or carved_from_l1: true and a carveouts_kib list", ("carved_from_l1",))
        if self.cache_options_kib is not None and self.cache_kib not in self.cache_options_kib:
            raise FieldError("cache_kib", f"cache_kib {self.cache_kib} is not an allowed LDM cache size",
                             "one of: " + ", ".join(str(c) for c in self.cache_options_kib), ("cache_options_kib",))
        if self.cache_kib and self.cache_kib >= self.size_kib:
            raise FieldError("cache_kib", f"cache_kib {self.cache_kib} leaves no LDM of size_kib {self.size_kib}",
                             f"less than {self.size_kib}", ("size_kib",))
        if self.cache_kib and self.cache_line_bytes is None:
            raise FieldError("cache_line_bytes", "an LDM cache needs cache_line_bytes", "an integer > 0")
        if self.cache_kib and (self.cache_assoc is None or self.cache_mshrs is None):
            missing = "cache_assoc" if self.cache_assoc is None else "cache_mshrs"
            raise FieldError(missing, f"an LDM cache needs {missing}", "an integer > 0")
        if self.cache_kib and self.cache_line_bytes and (self.cache_line_bytes & (self.cache_line_bytes - 1)
                                                         or self.cache_line_bytes < 32):
            raise FieldError("cache_line_bytes", f"cache_line_bytes {self.cache_line_bytes} is not a power of two "
                             ">= 32", "32, 64, 128, 256, ...")
        if self.cache_kib and self.cache_assoc and (self.cache_kib * 1024) % (self.cache_line_bytes * self.cache_assoc):
            raise FieldError("cache_assoc", f"{self.cache_kib} KiB is not a whole number of {self.cache_assoc}-way "
                             f"sets of {self.cache_line_bytes}-B lines", "an associativity dividing the cache")
        return self


class L1(Frozen):
    size_kib: PosInt                # the whole SRAM array (unified L1 + shared when carved_from_l1)
    line_bytes: PosInt
    sector_bytes: PosInt
    assoc: PosInt
    mshrs: PosInt                   # outstanding sector misses per core
    hit_latency_cycles: PosCycles
    bytes_per_cycle: PosInt         # per core
    # Write-through without write-allocate, as Accel-Sim's "L:T:m:L:L" L1 (the engine's L1 keeps no
    # dirty lines); the victim policy and the requests one MSHR entry takes are settings
    replacement: Literal["lru", "fifo"] = "lru"
    max_merge: PosInt = 8           # Accel-Sim's tested Volta config (SM7_QV100) "A:512:8"
    # on_miss: a read miss reserves its way at once (a set whose ways all wait on fills refuses the next
    # miss); on_fill: the line takes a way when its data arrives (engine/cache.py)
    allocate: Literal["on_miss", "on_fill"] = "on_miss"

    @model_validator(mode="after")
    def _check(self):
        if not _is_pow2(self.line_bytes):
            raise FieldError("line_bytes", f"line_bytes {self.line_bytes} is not a power of two", "e.g. 128")
        if self.line_bytes % self.sector_bytes:
            raise FieldError("sector_bytes", f"sector_bytes {self.sector_bytes} does not divide line_bytes "
                             f"{self.line_bytes}", "a divisor of line_bytes", ("line_bytes",))
        _check_mshrs(self)
        return self


def _check_mshrs(c) -> None:
    """mshrs counts the sector misses a cache keeps in flight: a miss of a whole line takes one per
    sector at once, so fewer than a line's sectors could never fetch one (the run would wait forever)."""
    per_line = c.line_bytes // c.sector_bytes
    if c.mshrs < per_line:
        raise FieldError("mshrs", f"mshrs {c.mshrs} is fewer than the {per_line} sectors of one line (mshrs counts "
                         "the sector misses in flight)", f"at least line_bytes / sector_bytes = {per_line}",
                         ("line_bytes", "sector_bytes"))


class Dma(Frozen):
    """Bulk copies between main memory and LDM (Sunway DMA), one engine per cluster."""

    engines_per_cluster: PosInt
    piece_bytes: PosInt             # requests are split into aligned pieces of this size
    max_inflight: PosInt            # pieces in flight per engine
    max_inflight_per_transfer: Optional[PosInt] = None  # pieces one transfer (descriptor) may have in flight; None: only the engine limit
    get_startup_cycles: NonNegCycles   # engine-side fixed cost of a get (the memory path adds its own)
    put_startup_cycles: NonNegCycles
    bytes_per_cycle: PosFloat       # per engine
    broadcast_modes: tuple[Literal["row", "column", "array"], ...] = ()
    descriptors_per_engine: PosInt = 8   # transfers queued per engine; a CPE issuing more stalls (choice)


class Rma(Frozen):
    """Remote LDM access between CPEs of one core group over the mesh."""

    engines_per_cluster: PosInt
    latency_cycles: PosCycles          # a small transfer within one cluster (published figure; the model's comes
                                    # out of startup_cycles + the mesh)
    hop_cycles: NonNegCycles           # added per cluster hop in x or y (published figure)
    bytes_per_cycle: PosFloat       # point to point: the engine's port (fixed point, never exceeded)
    # the timing model (archsim/engine/rma.py); optional so older files keep loading
    startup_cycles: Optional[NonNegCycles] = None        # engine-side fixed cost of a transfer (default latency_cycles)
    router_latency_cycles: Optional[PosCycles] = None    # CPE-mesh router traversal (default max(1, hop_cycles // 2):
                                                      # a transfer crosses each router twice, out and back)
    link_bytes_per_cycle: PosInt = 32                 # CPE-mesh link width = flit (choice: not published)
    piece_bytes: PosInt = 128                         # a transfer is split into pieces of at most this size
    max_inflight: PosInt = 16                         # pieces in flight per engine
    buffer_depth: Optional[PosInt] = None             # CPE-mesh buffers, flits (default: two whole pieces,
                                                      # so a stream never waits for a buffer to drain)
    descriptors_per_engine: PosInt = 8                # transfers queued per engine; a CPE issuing more stalls (choice)


class Mesh(Frozen):
    """Cores of a group laid out rows x cols, grouped in clusters of cluster_rows x cluster_cols."""

    rows: PosInt
    cols: PosInt
    cluster_rows: PosInt
    cluster_cols: PosInt

    @model_validator(mode="after")
    def _check(self):
        if self.rows % self.cluster_rows:
            raise FieldError("cluster_rows", f"cluster_rows {self.cluster_rows} does not divide rows {self.rows}",
                             "a divisor of mesh.rows", ("rows",))
        if self.cols % self.cluster_cols:
            raise FieldError("cluster_cols", f"cluster_cols {self.cluster_cols} does not divide cols {self.cols}",
                             "a divisor of mesh.cols", ("cols",))
        return self


class Mpe(Frozen):
    """Sunway management core(s): a separate in-order core per group with its own clock and pipes.

    The launch model (archsim/engine/mpe.py): at kernel start the group's MPE (the first one when
    ``per_group`` > 1) sends each CPE of its group that has work a launch message over the CPE mesh
    from its port at cluster ``attach_cluster`` (header + ``launch_message_bytes``), one every
    ``spawn_cycles_per_cpe`` MPE cycles; a CPE starts when its message has arrived. Each CPE sends
    a completion (a header) back when it has no block left; the MPE takes one every
    ``join_cycles_per_cpe`` MPE cycles, and the kernel ends when every MPE has taken all of its own.
    MPE cycles are ``clock_ghz`` cycles (a clock domain of its own)."""

    per_group: PosInt
    clock_ghz: PosFloat
    pipes: Annotated[FMap[Text, Pipe], Field(min_length=1)]
    # the launch / join model; optional with defaults so older files keep loading (choices: see
    # configs/sw26010pro.yaml)
    attach_cluster: tuple[NonNegInt, NonNegInt] = (0, 0)  # (cluster row, cluster col) of the mesh router of the MPE's port
    launch_message_bytes: PosInt = 32                    # launch payload (entry, arguments, CPE id); the mesh header is extra
    spawn_cycles_per_cpe: PosCycles = 8                     # MPE cycles to issue one CPE's launch message
    join_cycles_per_cpe: PosCycles = 4                      # MPE cycles to take one CPE's completion

    @model_validator(mode="after")
    def _check(self):
        _check_pipes(self.pipes, "pipes", "MPE")
        return self


class Fabric(Frozen):
    kind: Literal["crossbar", "ring", "mesh"]
    link_bytes_per_cycle: PosInt    # per link per direction, fabric clock (= flit size)
    buffer_depth: PosInt            # flits (credits) per input buffer
    router_latency_cycles: PosCycles   # per router / ring stop traversal, fabric clock
    bidirectional: Bool = True      # ring: links in both directions
    port_bytes_per_cycle: Optional[PosInt] = None  # ring: a stop's local ports (its core group / controller); None: the links arriving at it (2 x link width when bidirectional)
    # Packets behind a router input port's head that the port may send instead when the head
    # waits for a busy or full output (head-of-line blocking relief, a virtual-output-queue-like
    # input port). 0: a FIFO port. Packets for one output never pass each other.
    lookahead_packets: NonNegInt = 0
    lookahead_rounds: PosInt = 3    # offer / grant rounds per cycle when ports look ahead (choice)
    header_bytes: PosInt = 8        # request / response packet header, on every fabric and mesh link (choice)


class L2(Frozen):
    size_kib: PosInt
    slices: PosInt
    halves: PosInt                  # partitions; addresses interleave over them in interleave_bytes
    interleave_bytes: PosInt
    line_bytes: PosInt
    sector_bytes: PosInt
    assoc: PosInt
    mshrs: PosInt                   # per slice
    hit_latency_cycles: PosCycles      # slice tag + data pipeline (the fabric adds its own)
    bytes_per_cycle: PosInt         # per slice, fabric clock
    far_half_extra_cycles: NonNegCycles  # added when the data lives in the other half
    # Which slice of its half an address goes to: consecutive (interleave granules round-robin
    # over the half's slices) or hashed (the granule index within each group of slices-per-half
    # granules is permuted by an XOR fold of the higher address bits, so large or power-of-two
    # strides spread over every slice instead of camping on a few). The half is always chosen
    # by interleave_bytes.
    slice_indexing: Literal["consecutive", "hashed"] = "consecutive"
    # Each half also caches the other half's lines for its own SMs (a read from an SM goes to the
    # slice of its own half that mirrors the address's home slice; a miss there looks the line up
    # in its home slice, far_half_extra_cycles away, then in DRAM; a write goes to the home slice
    # and drops the copies). With false, every line lives in its home slice only.
    near_replicas: Bool = False
    # Write-back, write-allocate at sector granularity, as Accel-Sim's "L:B:m:L:P" L2; the victim
    # policy and the requests one MSHR entry takes are settings
    replacement: Literal["lru", "fifo"] = "lru"
    max_merge: PosInt = 4           # Accel-Sim's tested Volta config (SM7_QV100) "A:192:4"
    # A slice's DRAM retry queue holds every sector its MSHRs fetch plus this many writebacks; the
    # slice takes no new request while all but 8 of them wait (choice)
    retry_spare_entries: Annotated[int, Field(strict=True, ge=16, le=MAX_INT)] = 256

    @model_validator(mode="after")
    def _check(self):
        if self.slices % self.halves:
            raise FieldError("halves", f"halves {self.halves} does not divide slices {self.slices}",
                             "a divisor of l2.slices", ("slices",))
        if self.line_bytes % self.sector_bytes:
            raise FieldError("sector_bytes", f"sector_bytes {self.sector_bytes} does not divide line_bytes "
                             f"{self.line_bytes}", "a divisor of line_bytes", ("line_bytes",))
        _check_mshrs(self)
        per_slice = self.size_kib * 1024 / self.slices
        if per_slice % (self.line_bytes * self.assoc):
            raise FieldError("size_kib", f"size_kib {self.size_kib} does not split into {self.slices} slices "
                             f"of whole {self.assoc}-way sets of {self.line_bytes}-B lines",
                             "a multiple of slices x assoc x line_bytes / 1024", ("slices", "assoc", "line_bytes"))
        return self


class AddressMapping(Frozen):
    """interleave: addresses spread over all channels in interleave_bytes chunks.
    partitions (GPUs): each channel serves the L2 slices of its memory partition (the half's
    slices in order, slices / channels of them a channel), so an address's channel is its home
    slice's; interleave_bytes is the slice granule. Without an L2, as interleave.
    segments (Sunway): each core group owns a private segment on its own controller, plus a cross
    segment interleaved over all controllers in interleave_bytes chunks."""

    kind: Literal["interleave", "partitions", "segments"]
    interleave_bytes: PosInt
    # Order of the bank and column fields in a channel-local address, low bits first (dram.py):
    # banks_low: [chunk | sub-channel | bank group | bank in group | column | row] (a stream visits
    # every bank before a row's next column); columns_low: [chunk | sub-channel | bank group | column
    # | bank in group | row] (a stream reads a row's columns while rotating over sub-channels and
    # bank groups: more row hits, the same tCCD_S / tRRD_S spacing).
    bank_order: Literal["banks_low", "columns_low"] = "banks_low"
    # bytes of a channel-local address kept in one bank row below the sub-channel and bank fields
    # (a power of two dividing dram.row_bytes; dram.py "Address mapping")
    row_chunk_bytes: PosInt = 128
    # What the bank hash mixes into the sub-channel / bank-group field (columns_low) or the flat
    # bank field (banks_low): row: XOR of the row's low bits (permutation-based page interleaving,
    # Zhang et al., MICRO 2000); fold: the sum of every field-sized digit of the bits above the
    # field, as real controllers' bank functions combine many address bits (DRAMA, Pessl et al.,
    # USENIX Security 2016), so that concurrent requests sharing their low bits do not pile onto a
    # few sub-channels (dram.py "Address mapping").
    bank_hash: Literal["row", "fold"] = "row"


class MemoryControllers(Frozen):
    count: PosInt
    queue_depth: PosInt             # requests per controller
    policy: Literal["fcfs", "frfcfs"]
    row_policy: Literal["open", "closed"]
    address_mapping: AddressMapping
    # Controller front end between the L2 miss queue and the DRAM scheduler queue (request decode,
    # address mapping, PHY): a pipeline of this many fabric cycles that never limits throughput.
    # 0: none.
    frontend_latency_cycles: NonNegCycles = 0
    row_hit_cap: PosInt = 16        # FR-FCFS: row hits served before a waiting conflict may close the row (choice)


class DramTiming(Frozen):
    """DDR/HBM timing rules in memory-clock cycles (Ramulator-style, as data). The data-bus time of
    one burst is derived: burst_bytes / (channel_gbps / memory clock)."""

    tCL: PosInt       # read command -> data
    tCWL: PosInt      # write command -> data
    tRCD: PosInt      # activate -> read/write
    tRP: PosInt       # precharge -> activate
    tRAS: PosInt      # activate -> precharge
    tRC: PosInt       # activate -> activate, same bank
    tCCD_S: PosInt    # column -> column, different bank group
    tCCD_L: PosInt    # column -> column, same bank group
    tRRD_S: PosInt    # activate -> activate, different bank group
    tRRD_L: PosInt    # activate -> activate, same bank group
    tFAW: PosInt      # window for four activates
    tWR: PosInt       # write recovery
    tWTR_S: PosInt    # write -> read, different bank group
    tWTR_L: PosInt    # write -> read, same bank group
    tRTP: PosInt      # read -> precharge
    tRFC: PosInt      # refresh cycle (all-bank refresh)
    tREFI: PosInt     # refresh interval (every bank is refreshed once per tREFI)
    tRFCpb: Optional[PosInt] = None   # per-bank refresh cycle (dram.refresh: per_bank)

    @model_validator(mode="after")
    def _check(self):
        if self.tRC < self.tRAS + self.tRP:
            raise FieldError("tRC", f"tRC {self.tRC} is less than tRAS + tRP = {self.tRAS + self.tRP}",
                             f">= {self.tRAS + self.tRP}", ("tRAS", "tRP"))
        if self.tCCD_L < self.tCCD_S:
            raise FieldError("tCCD_L", f"tCCD_L {self.tCCD_L} is less than tCCD_S {self.tCCD_S}",
                             f">= {self.tCCD_S}", ("tCCD_S",))
        if self.tRRD_L < self.tRRD_S:
            raise FieldError("tRRD_L", f"tRRD_L {self.tRRD_L} is less than tRRD_S {self.tRRD_S}",
                             f">= {self.tRRD_S}", ("tRRD_S",))
        if self.tREFI <= self.tRFC:
            raise FieldError("tREFI", f"tREFI {self.tREFI} is not longer than tRFC {self.tRFC}",
                             f"> {self.tRFC}", ("tRFC",))
        if self.tRFCpb is not None and self.tRFCpb > self.tRFC:
            raise FieldError("tRFCpb", f"tRFCpb {self.tRFCpb} is longer than the all-bank tRFC {self.tRFC}",
                             f"<= {self.tRFC}", ("tRFC",))
        return self


class Dram(Frozen):
    kind: Literal["hbm2", "hbm2e", "hbm3", "ddr4", "ddr5"]
    channels: PosInt                # independent channels (each with its own data bus and banks)
    channel_gbps: PosFloat          # peak data rate of one channel
    capacity_gib: Optional[PosFloat] = None
    banks: PosInt                   # per channel
    bank_groups: PosInt             # per channel
    row_bytes: PosInt               # row-buffer (page) size per bank
    burst_bytes: PosInt             # bytes moved by one column command
    timing: DramTiming              # memory-clock cycles
    # all_bank: every tREFI a channel precharges all banks and refreshes them together (tRFC);
    # per_bank: the banks take turns (one every tREFI / banks-per-command-bus), each blocked for
    # timing.tRFCpb while the others keep serving requests (HBM2 REFSB, LPDDR REFpb).
    refresh: Literal["all_bank", "per_bank"] = "all_bank"
    # masked: a write that covers part of a burst writes only its bytes (data-mask pins);
    # rmw: the controller reads the burst, merges the new bytes and writes the whole burst back
    # (ECC memory without data masks: the check bits cover the whole burst)
    partial_writes: Literal["masked", "rmw"] = "masked"

    @model_validator(mode="after")
    def _check(self):
        if self.refresh == "per_bank" and self.timing.tRFCpb is None:
            raise FieldError("timing.tRFCpb", "dram.refresh per_bank needs timing.tRFCpb (the per-bank "
                             "refresh cycle)", "a number of memory cycles", ("refresh",))
        if self.banks % self.bank_groups:
            raise FieldError("bank_groups", f"bank_groups {self.bank_groups} does not divide banks {self.banks}",
                             "a divisor of dram.banks", ("banks",))
        if self.row_bytes % self.burst_bytes:
            raise FieldError("burst_bytes", f"burst_bytes {self.burst_bytes} does not divide row_bytes "
                             f"{self.row_bytes}", "a divisor of dram.row_bytes", ("row_bytes",))
        return self


# ---- the machine ------------------------------------------------------------------------------

class Machine(Frozen):
    name: Text
    family: Literal["gpu", "sunway"]
    description: Optional[str] = None
    sources: FMap[Text, Text] = Field(default_factory=FrozenDict)   # citation tags used in comments
    clock_ghz: PosFloat             # core clock
    clock_ratios: ClockRatios
    groups: PosInt                  # core groups (1 on a GPU, 6 on the SW26010-Pro)
    cores: Cores
    register_file: RegisterFile
    pipes: Annotated[FMap[Text, Pipe], Field(min_length=1)]
    tensor: Optional[Tensor] = None
    scratchpad: Scratchpad
    l1: Optional[L1] = None
    async_copy: Bool = False        # GPU cp.async: global -> shared without registers
    tma: Optional[Tma] = None       # GPU tensor memory accelerator (mbarrier, cp.async.bulk.tensor); absent: refused
    clusters: Optional[Clusters] = None   # GPU thread-block clusters and distributed shared memory; absent: refused
    dma: Optional[Dma] = None
    rma: Optional[Rma] = None
    mesh: Optional[Mesh] = None
    mpe: Optional[Mpe] = None
    fabric: Fabric
    l2: Optional[L2] = None
    memory_controllers: MemoryControllers
    dram: Dram

    @model_validator(mode="after")
    def _check(self):
        fam = self.family
        want_core, want_scratch = ("sm", "shared") if fam == "gpu" else ("cpe", "ldm")
        if self.cores.kind != want_core:
            raise FieldError("cores.kind", f"cores.kind {self.cores.kind!r} does not fit family {fam!r}",
                             f"{want_core} for family {fam}", ("family",))
        if self.scratchpad.kind != want_scratch:
            raise FieldError("scratchpad.kind", f"scratchpad.kind {self.scratchpad.kind!r} does not fit "
                             f"family {fam!r}", f"{want_scratch} for family {fam}", ("family",))
        if fam == "sunway" and self.mesh is None:
            raise FieldError("mesh", "a sunway machine needs a mesh block (CPE layout and clusters)",
                             "mesh: {rows, cols, cluster_rows, cluster_cols}")
        _check_pipes(self.pipes, "pipes", "core")
        ww = self.cores.warp_width
        rf = self.register_file
        if rf.max_regs_per_thread * ww > rf.regs_per_core:
            raise FieldError("register_file.max_regs_per_thread",
                             f"register_file.max_regs_per_thread {rf.max_regs_per_thread} x warp_width {ww} "
                             f"exceeds register_file.regs_per_core {rf.regs_per_core}",
                             f"at most {rf.regs_per_core // ww}", ("register_file.regs_per_core",))
        sp = self.scratchpad
        if sp.carved_from_l1:
            if self.l1 is None:
                raise FieldError("scratchpad.carved_from_l1", "scratchpad.carved_from_l1 is true but there is no l1",
                                 "false, or add an l1 block", ("l1",))
            if sp.size_kib > self.l1.size_kib:
                raise FieldError("scratchpad.size_kib",
                                 f"scratchpad.size_kib {sp.size_kib} exceeds l1.size_kib {self.l1.size_kib}, "
                                 f"the unified L1/shared array", f"at most {self.l1.size_kib} KiB", ("l1.size_kib",))
            if sp.carveouts_kib is not None:
                over = [c for c in sp.carveouts_kib if c > self.l1.size_kib]
                if over:
                    raise FieldError("scratchpad.carveouts_kib",
                                     f"carveout {over[0]} exceeds l1.size_kib {self.l1.size_kib}",
                                     f"carveouts of at most {self.l1.size_kib}", ("l1.size_kib",))
        if self.l1 is not None:
            cache_bytes = (self.l1.size_kib - (sp.size_kib if sp.carved_from_l1 else 0)) * 1024
            if cache_bytes % (self.l1.line_bytes * self.l1.assoc):
                raise FieldError("l1.assoc", f"the {cache_bytes // 1024} KiB L1 cache is not a whole number of "
                                 f"{self.l1.assoc}-way sets of {self.l1.line_bytes}-B lines",
                                 "an assoc dividing the cache lines", ("l1.size_kib", "scratchpad.size_kib"))
        if self.mesh is not None:
            m = self.mesh
            if m.rows * m.cols != self.cores.per_group:
                raise FieldError("mesh.rows", f"mesh {m.rows}x{m.cols} does not hold cores.per_group "
                                 f"{self.cores.per_group}", f"rows x cols = {self.cores.per_group}",
                                 ("mesh.cols", "cores.per_group"))
            for i, (r, c) in enumerate(sp.shared_modes or ()):
                if m.rows % r or m.cols % c:
                    raise FieldError(f"scratchpad.shared_modes[{i}]", f"shared-LDM mode {r}x{c} does not tile "
                                     f"the {m.rows}x{m.cols} mesh", "rows and cols dividing the mesh's",
                                     ("mesh.rows", "mesh.cols"))
        if self.tma is not None and (fam != "gpu" or self.l1 is None or self.cores.warp_width != 32):
            raise FieldError("tma", "a TMA unit belongs to a GPU SM with 32-lane warps and an L1 (its copies "
                             "take the SM's path to L2)", "tma: null, or family gpu, warp_width 32, an l1 block",
                             ("family", "l1", "cores.warp_width"))
        cl = self.clusters
        if cl is not None:
            if fam != "gpu":
                raise FieldError("clusters", "thread-block clusters belong to a GPU", "clusters: null, or family gpu",
                                 ("family",))
            if sum(cl.gpc_sms) != self.groups * self.cores.per_group:
                raise FieldError("clusters.gpc_sms", f"the GPCs hold {sum(cl.gpc_sms)} SMs, the machine has "
                                 f"{self.groups * self.cores.per_group}", "SMs per GPC summing to cores.per_group",
                                 ("cores.per_group",))
            if cl.max_blocks > max(cl.gpc_sms):
                raise FieldError("clusters.max_blocks", f"a cluster of {cl.max_blocks} blocks fits no GPC (the "
                                 f"largest has {max(cl.gpc_sms)} SMs)", f"at most {max(cl.gpc_sms)}",
                                 ("clusters.gpc_sms",))
        for blk in ("dma", "rma"):
            if getattr(self, blk) is not None and self.mesh is None:
                raise FieldError(blk, f"a {blk} block needs a mesh block (its engines are per cluster)",
                                 f"add mesh, or {blk}: null", ("mesh",))
        if self.mpe is not None and self.mesh is not None:
            if self.rma is None:
                raise FieldError("mpe", "the MPE launches and joins the CPEs over the CPE mesh, whose links "
                                 "the rma block describes", "add rma, or mpe: null", ("rma",))
            m = self.mesh
            crows, ccols = m.rows // m.cluster_rows, m.cols // m.cluster_cols
            r, c = self.mpe.attach_cluster
            if r >= crows or c >= ccols:
                raise FieldError("mpe.attach_cluster", f"cluster ({r}, {c}) is not in the {crows}x{ccols} "
                                 "clusters of the mesh", f"row 0..{crows - 1}, col 0..{ccols - 1}",
                                 ("mesh.rows", "mesh.cols"))
        mc = self.memory_controllers
        if self.dram.channels % mc.count:
            raise FieldError("dram.channels", f"dram.channels {self.dram.channels} is not a multiple of "
                             f"memory_controllers.count {mc.count}", f"a multiple of {mc.count}",
                             ("memory_controllers.count",))
        rc = mc.address_mapping.row_chunk_bytes
        if rc & (rc - 1) or self.dram.row_bytes % rc:
            raise FieldError("memory_controllers.address_mapping.row_chunk_bytes", f"{rc} is not a power of two "
                             f"dividing dram.row_bytes {self.dram.row_bytes}",
                             f"a power of two dividing {self.dram.row_bytes}", ("dram.row_bytes",))
        if mc.address_mapping.kind == "partitions":
            self._check_partitions()
        if mc.address_mapping.kind == "segments" and mc.count % self.groups:
            raise FieldError("memory_controllers.count", f"segments mapping needs the {mc.count} controllers "
                             f"to split evenly over {self.groups} groups", f"a multiple of groups ({self.groups})",
                             ("groups", "memory_controllers.address_mapping.kind"))
        return self

    def _check_partitions(self) -> None:
        """The partitions mapping: every half's slices split evenly over that half's channels, and
        the slice map numbers a half's granules as slice_map.half_granule does."""
        where = "memory_controllers.address_mapping.kind"
        l2, ch = self.l2, self.dram.channels
        if l2 is None:
            return                          # no slices: the controllers are the endpoints (interleave)
        sph = l2.slices // l2.halves
        if ch % l2.halves or sph % (ch // l2.halves):
            raise FieldError(where, f"partitions needs each half's {sph} L2 slices split evenly over its "
                             f"{ch} / {l2.halves} channels", "dram.channels a multiple of l2.halves dividing "
                             "the slices", ("dram.channels", "l2.slices", "l2.halves"))
        il = self.memory_controllers.address_mapping.interleave_bytes
        if l2.halves > 1 and (l2.interleave_bytes % il or (
                l2.slice_indexing != "hashed" and (l2.interleave_bytes // il) % sph)):
            raise FieldError(where, f"partitions needs l2.interleave_bytes {l2.interleave_bytes} to hold a whole "
                             f"number of {il}-B granules (with consecutive slices, a multiple of the {sph} "
                             "slices a half)", "interleave, or l2.interleave_bytes a multiple of that",
                             ("l2.interleave_bytes", "memory_controllers.address_mapping.interleave_bytes"))


__all__ = [
    "AddressMapping", "BLOCK_UNITS", "ClockRatios", "Cores", "Dma", "Dram", "DramTiming", "FAMILIES", "Fabric",
    "FieldError", "FrozenDict", "L1", "L2", "LATENCY_KEYS", "Machine", "MemoryControllers", "Mesh", "Mpe",
    "PIPE_DTYPES", "Pipe", "REQUIRED_UNITS", "RegisterFile", "Rma", "Scratchpad", "TENSOR_DTYPES", "Tensor",
    "UNIT_CLASSES",
]
