"""One training step on a cluster, as a discrete-event simulation.

Every kernel is timed by the engine: the tensor-parallel shard of one decoder block (forward and
backward kernels, run_workload on the device machine, the kernel cache keeping repeats free) and,
on the last stage, the LM head's GEMMs (micro gemm). What runs between them is simulated:

- one compute stream per pipeline stage and data-parallel replica (its TP ranks run the same
  kernels at the same time); a stream runs its schedule's tasks (forward or backward of one
  micro-batch over the stage's blocks) in order, each after its input has arrived;
- a task's time is its kernels, the idle gap between kernels (``software.kernel_gap_us``) and its
  tensor-parallel all-reduces: after the projection and FFN-out in forward (the next kernel waits),
  after the QKV and FFN-in input gradients in backward (beside the weight-gradient GEMM that
  follows), or with sequence parallelism the all-gathers and reduce-scatters that replace them
  (ops.SP_COLLECTIVES) and the norms and residual adds on 1/tp of the tokens; a kernel beside a
  collective runs on the SMs the collective's own kernel leaves (device_collective.py); full
  recompute runs a block's forward again before its backward, selective the attention forward;
- pipeline sends (each TP rank its 1/tp slice of the activations or their gradients; with
  ``p2p=wait`` the sending stream waits until its send is delivered, from the end of the task that
  made it: the receiver's readiness is not waited for, since in 1F1B the partner's matching
  receive comes in the same exchange; a stream's last send runs beside its data-parallel tail) and the
  data-parallel gradient reductions (one bucket a block, started when every replica's last backward
  has finished that block, or with ``grad_reduce=after`` one reduction of the stage's gradients
  after its last backward and the tied embedding's sum; ZeRO 1-2 reduce-scatter, then all-gather
  the updated weights; ZeRO 3
  reduce-scatters and gathers each block's weights before every forward and backward of it) are
  transfers on the cluster's flow network, so they share links max-min fairly and slow each other.

Choices: a tensor-parallel collective is timed once per kind and size as the collective alone on the
topology (inside a node it crosses only the devices' own NVSwitch ports, which the pipeline and
data-parallel traffic reach only on its way to the NICs), not re-simulated for every call; an
expert-parallel all-to-all likewise, as every EP group of a stage runs it at once (they cross the
NICs and uplinks, where they slow each other; the pipeline and data-parallel traffic is left out); the
embedding lookup and the loss are not timed; the optimizer's update is (AdamW on the parameters
whose state the device holds, after the stage's last gradient reduction, run.optimizer_times), and
with ``grad_accum`` other than ``fused`` the gradient accumulation after each backward
(run.grad_accum_times), but not the copy of the updated fp32 master weights into the
half-precision ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from archsim.errors import InputError

from . import collectives as C
from .network import Events
from .plan import Plan, block_parameters, device_of, stage_layers, with_scenario
from .topology import Topology, link_name


@dataclass
class BlockTimes:
    """One block's shard on one device, in seconds, its ops in order with the tensor-parallel
    collectives between them: ("k", seconds, launches, seconds beside a collective or None) and
    ("c", collective, bytes, runs beside the next kernel, group: "tp" | "ep")."""
    forward: list
    backward: list
    attention_forward: float         # what selective recompute runs again
    kernels: list                    # the run's kernel entries (archsim.result/1)
    attention_launches: int = 1      # its kernel launches


def _op_seconds(kernels: list) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds each op of the block takes and the kernels it launches: the kernels emitted for it
    (a kernel shared by several identical ops counts for each)."""
    out: dict[str, float] = {}
    launches: dict[str, int] = {}
    for k in kernels:
        for op in [k["op"]] + list(k.get("also_ops", [])):
            out[op] = out.get(op, 0.0) + float(k["seconds"])
            launches[op] = launches.get(op, 0) + 1
    return out, launches


def block_layout(shard, sp: bool = False, tp_async: bool = True) -> list:
    """The shard's ops in order, ("k", op), with its collectives between them, ("c", collective,
    tensor, beside-next, group): tensor-parallel all-reduces (ops.TP_ALL_REDUCE_AFTER) or, with
    sequence parallelism, all-gathers and reduce-scatters (ops.SP_COLLECTIVES), on group "tp";
    expert parallelism's all-to-alls (ops.EP_ALL_TO_ALL) on group "ep". Without ``tp_async`` no
    tensor-parallel collective runs beside the next kernel."""
    from archsim.workloads.ops import EP_ALL_TO_ALL, SP_COLLECTIVES, TP_ALL_REDUCE_AFTER

    tp, ep = shard.scenario.tensor_parallel, shard.scenario.expert_parallel
    a2a = dict(EP_ALL_TO_ALL) if ep > 1 else {}
    out = []
    def sp_items(op, side):
        return [("c", kind, tensor, beside and tp_async, "tp")
                for name, where, kind, tensor, beside in SP_COLLECTIVES
                if name == op.name and where == side] if tp > 1 and sp else []

    for op in shard.block_ops():
        out += sp_items(op, "before")
        out.append(("k", op.name))
        out += sp_items(op, "after")
        if tp > 1 and not sp and op.name in TP_ALL_REDUCE_AFTER:
            tensor, beside = TP_ALL_REDUCE_AFTER[op.name]
            out.append(("c", "all_reduce", tensor, beside and tp_async, "tp"))
        if op.name in a2a:
            out.append(("c", "all_to_all", a2a[op.name], False, "ep"))
    return out


def beside_ops(layout: list) -> list[str]:
    """The ops of a layout that run while a collective runs beside them."""
    return [nxt[1] for it, nxt in zip(layout, layout[1:]) if it[0] == "c" and it[3] and nxt[0] == "k"]


def ops_seconds(machine, shard, ops, opts, pool=None, why: str = "") -> dict[str, float]:
    """Seconds each of ``ops`` of the shard's block takes on ``machine``: their kernels alone, timed
    by the engine as a run times them (the kernel cache keeps repeats free)."""
    from archsim.runner import emit_block, kernel_timer, placement_for, timing_args
    from archsim.workers import Pool

    kernels = [k for k in emit_block(machine, shard) if k.op in ops]
    if not kernels:
        return {}
    timer, how = kernel_timer(machine, opts, shard, kernels)
    placement = placement_for(machine, shard)
    own = Pool(min(opts.workers, len(kernels))) if pool is None else None
    p = pool if pool is not None else own
    try:
        futs = [p.submit(timer, k.name, k.program, machine, k.launch,
                         timing_args(machine, k.params, placement), flops=k.flops, waves=opts.waves,
                         max_error=opts.max_error, max_cycles=opts.max_cycles, sample=opts.sample,
                         placement=placement, interval=opts.interval,
                         label=f"kernel {k.name} on {machine.name}{why}", **how[k.name]) for k in kernels]
        recs = [f.result() for f in futs]
    finally:
        if own is not None:
            own.close()
    out: dict[str, float] = {}
    for k, r in zip(kernels, recs):
        out[k.op] = out.get(k.op, 0.0) + float(r["seconds"])
    return out


def block_times(machine, shard, opts, pool=None, contended=None, sp: bool = False,
                tp_async: bool = True) -> BlockTimes:
    """Time one block of the shard workload (train phase) on ``machine`` and lay its ops out in
    order with the tensor-parallel collectives between them. ``contended``: the device less the
    SMs a collective's kernel holds, on which the ops beside a collective are timed too. ``sp``:
    sequence parallelism, whose norms and residual adds run on the device's 1/tp of the tokens
    (timed at that many rows). ``tp_async``: block_layout's."""
    from archsim.runner import run_workload
    from archsim.workloads.ops import SP_TOKEN_OPS

    res = run_workload(machine, shard, opts, pool=pool)
    secs, launches = _op_seconds(res["kernels"])
    sc = shard.scenario
    tp = sc.tensor_parallel
    layout = block_layout(shard, sp, tp_async)
    if sp and tp > 1:                    # (train or prefill: decode is refused)
        part = with_scenario(shard, batch=1, seq=sc.batch * sc.seq // tp)
        secs.update(ops_seconds(machine, part, SP_TOKEN_OPS, opts, pool, " (its share of the tokens)"))
    slow = ops_seconds(contended, shard, beside_ops(layout), opts, pool, " beside a collective") \
        if contended is not None else {}
    shapes = shard.tensor_shapes()
    e = 4 if sc.dtype == "fp32" else 2
    fwd, bwd = [], []
    back = False
    for it in layout:
        if it[0] == "k":
            back = back or "." in it[1]
            item = ("k", secs.get(it[1], 0.0), launches.get(it[1], 0), slow.get(it[1]))
        else:
            size = 1
            for n in shapes[it[2]]:
                size *= n
            item = ("c", it[1], size * e, it[3], it[4])
        (bwd if back else fwd).append(item)
    return BlockTimes(fwd, bwd, secs.get("attn", 0.0), res["kernels"], launches.get("attn", 1))


def _run_items(items: list, coll_seconds, gap: float) -> tuple[float, float, float]:
    """Seconds a list of items takes on one stream, the kernels' share (with their gaps: one after
    each launch of an op's kernels), and the collectives' exposed share (``coll_seconds(kind,
    bytes, group)``: one collective's time on its group). A collective marked beside-next runs while the
    next kernel runs and is waited for before the kernel after it (or the next collective: one at
    a time on the group). A kernel timed also on the SMs the collective leaves runs at that rate
    while the collective lasts and at its own after: the share of its work done by then is the
    time overlapped over its contended seconds."""
    t = busy = exposed = 0.0
    pending = None                  # end of a collective running beside a kernel
    beside = False                  # the next kernel may run beside it

    def wait():
        nonlocal t, exposed, pending
        if pending is not None and pending > t:
            exposed += pending - t
            t = pending
        pending = None

    for it in items:
        if it[0] == "k":
            if pending is not None and not beside:
                wait()
            d = it[1]
            if pending is not None and beside and len(it) > 3 and it[3]:
                both = pending - t              # the collective's time left, with the kernel beside it
                d = it[3] if both >= it[3] else both + (1.0 - both / it[3]) * it[1]
            d += gap * (it[2] if len(it) > 2 else 1)
            t += d
            busy += d
            beside = False
        else:
            wait()
            d = coll_seconds(it[1], it[2], it[4] if len(it) > 4 else "tp")
            if it[3]:
                pending, beside = t + d, True
            else:
                t += d
                exposed += d
    wait()
    return t, busy, exposed


@dataclass
class Stream:
    stage: int
    replica: int
    tasks: list                        # ("F" | "B", micro-batch, model chunk)
    pos: int = 0
    busy_until: float = 0.0
    compute: float = 0.0               # kernels and the gaps between them
    tasks_seconds: float = 0.0         # tasks' whole durations (kernels and exposed all-reduces)
    tp_exposed: float = 0.0
    pp_exposed: float = 0.0            # waiting for a transfer that had started
    gather_exposed: float = 0.0        # ZeRO 3: waiting for a block's weights to be gathered
    last_end: float = 0.0
    arrived: dict = field(default_factory=dict)   # ("F"|"B", mb) -> arrival time of its input
    spans: list = field(default_factory=list)     # (kind, mb, start, end) of each task (replica 0)


def _interleaved(plan: Plan, stage: int) -> list:
    """Megatron-LM's interleaved 1F1B for one stage holding v model chunks: the k-th forward of the
    stage's m*v runs chunk (k // pp) % v of micro-batch (k // (pp*v))*pp + k % pp (backwards take the
    chunks in reverse); (pp - stage - 1)*2 + (v - 1)*pp forwards warm up (all of them when m = pp),
    then one forward one backward, then the remaining backwards."""
    m, pp, v = plan.micro_batches, plan.pp, plan.chunks
    total = m * v

    def task(kind, k):
        c = (k % (pp * v)) // pp
        return (kind, (k // (pp * v)) * pp + k % pp, c if kind == "F" else v - 1 - c)

    warm = total if m == pp else min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    out = [task("F", k) for k in range(warm)]
    for i in range(total - warm):
        out += [task("F", warm + i), task("B", i)]
    out += [task("B", k) for k in range(total - warm, total)]
    return out


def schedule(plan: Plan, stage: int, train: bool = True) -> list:
    """The order of one stage's tasks, (kind, micro-batch, model chunk): GPipe all forwards then all
    backwards; 1F1B pp - stage - 1 forwards, then one forward one backward, then the remaining
    backwards; interleaved 1F1B over v chunks a stage (_interleaved); inference the forwards.
    Without interleaving every task is of chunk 0."""
    m = plan.micro_batches
    if not train:
        return [("F", i, 0) for i in range(m)]
    if plan.schedule == "interleaved":
        return _interleaved(plan, stage)
    return [(k, i, 0) for k, i in _plain(plan, stage)]


def _plain(plan: Plan, stage: int) -> list:
    m = plan.micro_batches
    if plan.schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(plan.pp - stage - 1, m)
    out = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        out += [("F", warm + i), ("B", i)]
    out += [("B", i) for i in range(m - warm, m)]
    return out


class StepSim:
    """The step's streams, transfers and collectives on one flow network."""

    def __init__(self, topo: Topology, plan: Plan, workload, bt: BlockTimes, head: dict, params_block: int,
                 record_links: bool = True, expert_params_block: int = 0, block_topo: Topology | None = None,
                 optimizer: list | None = None, grad_accum: dict | None = None):
        self.topo, self.plan, self.wl, self.bt, self.head = topo, plan, workload, bt, head
        # grad_accum other than fused: seconds after each backward adding a block's (and the embedding's
        # or tied head's) gradients into the accumulation buffer (run.grad_accum_times)
        self.accum = grad_accum or {"block": 0.0, "embedding": 0.0}
        # per stage, a device's AdamW step (run.optimizer_times): after its last gradient reduction,
        # before ZeRO's gather of the updated weights
        self.optimizer = list(optimizer) if optimizer else [0.0] * plan.pp
        # the tensor- and expert-parallel collectives inside a block are timed on their own network,
        # whose reducers run at the storage type's rate (the step's own reduce fp32 gradients)
        self.block_topo = block_topo or topo
        m, sc = workload.model, workload.scenario
        self.e = 4 if sc.dtype == "fp32" else 2
        self.ge = plan.grad_bytes(sc.dtype)        # a gradient element as the data-parallel reduction takes it
        self.gap = topo.cluster.software.kernel_gap_us * 1e-6
        self.f = C.Fabric(topo, record=record_links)
        self.ev: Events = self.f.ev
        self.blocks = stage_layers(m.layers, plan.pp)
        self.v = plan.chunks if plan.schedule == "interleaved" else 1
        # each stage's blocks split over its model chunks (the first chunks take one more), and
        # where each chunk's blocks start among the stage's
        self.chunk_blocks = {s: [b // self.v + (1 if c < b % self.v else 0) for c in range(self.v)]
                             for s, b in enumerate(self.blocks)}
        self.chunk_first = {s: [sum(cb[:c]) for c in range(self.v)] for s, cb in self.chunk_blocks.items()}
        self.params_block = params_block
        self.expert_params_block = expert_params_block if plan.ep > 1 else 0    # reduced over dp / ep replicas
        self.embed_params = m.vocab * m.hidden // plan.tp
        self.train = sc.phase == "train"
        rows = plan.micro_batch * (1 if sc.phase == "decode" else sc.seq)
        self.act_bytes = rows * m.hidden * self.e / plan.tp
        self.coll_cache: dict[tuple, float] = {}
        # a TP group's ranks; every EP group of a stage (their all-to-alls run at once and may share links)
        self.groups = {"tp": [[device_of(plan, t, 0, 0) for t in range(plan.tp)]],
                       "ep": [[device_of(plan, 0, r, 0) for r in g] for g in plan.ep_groups()]}
        self.f_block = _run_items(bt.forward, self.coll_seconds, self.gap)
        rec_items = list(bt.forward) if plan.recompute == "full" else \
            [("k", bt.attention_forward, bt.attention_launches)] if plan.recompute == "selective" else []
        b_items = rec_items + list(bt.backward)
        self.rec_block = _run_items(rec_items, self.coll_seconds, self.gap)[0] if rec_items else 0.0
        # replica 0's backward spans split block by block while the timeline stays far below what
        # its pictures take (report.cluster.MAX_TASKS); past that, one span a backward
        self.split_spans = 2 * plan.micro_batches * m.layers <= MAX_SPLIT_SPANS
        self.b_items = b_items
        self.b_block = _run_items(b_items, self.coll_seconds, self.gap)
        self.streams = {(s, r): Stream(s, r, schedule(plan, s, self.train)) for s in range(plan.pp)
                        for r in range(plan.dp)}
        # grad_reduce=after: one bucket, the stage's gradients, once every chunk's last backward has
        # ended (grads_left counts them a stream) and, on the first and last stage, the tied
        # embedding's sum; overlap: a bucket a block, and one for the embedding or LM head
        self.after = plan.grad_reduce == "after"
        self.buckets = {s: (1 if self.after else self.blocks[s] + (1 if s in (0, plan.pp - 1) else 0))
                        if self.train else 0 for s in range(plan.pp)}
        self.grads_left = {(s, r): self.v for s in range(plan.pp) for r in range(plan.dp)}
        self.dp_wait = {(s, k): plan.dp for s in range(plan.pp) for k in range(self.buckets[s])}
        self.dp_done = {s: 0 for s in range(plan.pp)}
        self.stage_end = {s: None for s in range(plan.pp)}
        self.opt_span: dict[int, tuple] = {}                  # stage -> (start, end) of its optimizer step
        self.last_compute = {s: 0.0 for s in range(plan.pp)}
        # (collective, bytes, seconds) a call; data-parallel and embedding calls add (stage, start)
        # (an embedding sum serves the first and last stage: None)
        self.log = {"pipeline": [], "data_parallel": [], "embedding": []}
        self.tied_wait: dict[int, int] = {}                   # replica -> embedding copies with their gradient
        self.sync_start: dict[int, float] = {}                # stage -> the last embedding sum's start
        self.gathers: dict = {}                               # ZeRO 3: a block's gather -> replicas waiting

    # ---- times ----
    def coll_seconds(self, kind: str, nbytes: float, group: str = "tp") -> float:
        """One tensor-parallel collective alone on the topology, or one expert-parallel collective
        of every EP group of a stage at once (timed once a kind and size)."""
        groups = self.groups[group]
        if len(groups[0]) < 2:
            return 0.0
        key = (kind, nbytes, group)
        if key not in self.coll_cache:
            self.coll_cache[key] = C.time_concurrent(self.block_topo, kind, groups, nbytes)
        return self.coll_cache[key]

    def task_time(self, stage: int, kind: str, chunk: int = 0) -> tuple[float, float, float]:
        nb = self.chunk_blocks[stage][chunk]
        t, busy, exp = self.f_block if kind == "F" else self.b_block
        t, busy, exp = t * nb, busy * nb, exp * nb
        if stage == self.plan.pp - 1 and chunk == self.v - 1:
            h = self.head["forward"] if kind == "F" else self.head["backward"]
            g = self.gap * (1 if kind == "F" else 2)          # the backward's two GEMMs
            t, busy = t + h + g, busy + h + g
        if kind == "B":                                       # the gradients into the accumulation buffer
            a = nb * self.accum["block"] + (self.accum["embedding"] if self.holds_embedding(stage, chunk) else 0.0)
            t, busy = t + a, busy + a
        return t, busy, exp

    def holds_embedding(self, s: int, c: int) -> bool:
        """Chunk c of stage s holds the embedding (stage 0's first) or the LM head (the last stage's last)."""
        return (s == 0 and c == 0) or (s == self.plan.pp - 1 and c == self.v - 1)

    def stage_params(self, s: int) -> int:
        return self.blocks[s] * self.params_block + (self.embed_params if s in (0, self.plan.pp - 1) else 0)

    def dp_group(self, s: int, t: int) -> list[int]:
        return [device_of(self.plan, t, r, s) for r in range(self.plan.dp)]

    # ---- data-parallel collectives ----
    def dp_collective(self, s: int, kind: str, dense_bytes: float, expert_bytes: float, then) -> None:
        """One data-parallel collective of stage s: the dense part over the whole data-parallel group
        and, with expert parallelism, the experts' part over the replicas that hold each expert; a
        group per TP rank. ``then()`` when every part has ended."""
        plan = self.plan
        expert_groups = plan.expert_replicas() if expert_bytes else []
        done = C.barrier(plan.tp * (1 + len(expert_groups)), then)
        for t in range(plan.tp):
            C.run(self.f, kind, self.dp_group(s, t), dense_bytes, done)
            for reps in expert_groups:
                C.run(self.f, kind, [device_of(plan, t, r, s) for r in reps], expert_bytes, done)

    def bucket_ready(self, s: int, k: int) -> None:
        self.dp_wait[(s, k)] -= 1
        if self.dp_wait[(s, k)]:
            return
        plan, ev = self.plan, self.ev
        if plan.dp == 1:
            self._bucket_done(s)
            return
        n, ne = self.bucket_params(s, k)
        kind = "all_reduce" if plan.zero == 0 else "reduce_scatter"
        t0 = ev.now

        def all_ranks():                   # gradients reduced in their accumulation type
            self.log["data_parallel"].append((kind, n * self.ge, ev.now - t0, s, t0))
            self._bucket_done(s)
        self.dp_collective(s, kind, (n - ne) * self.ge, ne * self.ge, all_ranks)

    def bucket_params(self, s: int, k: int) -> tuple[int, int]:
        """Parameters of stage s's bucket k, and how many of them are experts'."""
        if self.after:
            return self.stage_params(s), self.blocks[s] * self.expert_params_block
        if k == self.blocks[s]:
            return self.embed_params, 0
        return self.params_block, self.expert_params_block

    def embedding_bucket(self, s: int) -> int:
        return 0 if self.after else self.blocks[s]

    def grads_done(self, s: int, r: int) -> None:
        """grad_reduce=after: a chunk of stage s on replica r ran its last backward; after the
        stage's last, its tied embedding's sum (first and last stage) and then its one bucket."""
        self.grads_left[(s, r)] -= 1
        if self.grads_left[(s, r)]:
            return
        if s in (0, self.plan.pp - 1):
            self.embedding_grad(s, r)
        else:
            self.bucket_ready(s, 0)

    def embedding_grad(self, s: int, r: int) -> None:
        """Replica r's first stage has its word embeddings' gradient, or its last stage the tied
        LM head's. With more than one stage the two copies' gradients are summed before either
        enters its data-parallel bucket: an all-reduce of each TP rank's vocabulary shard (in the
        gradients' accumulation type) between its first- and last-stage devices, Megatron-LM's
        embedding group (DeepSpeed's tied-module reduction)."""
        plan, ev = self.plan, self.ev
        last = plan.pp - 1
        if last == 0:
            self.bucket_ready(s, self.embedding_bucket(s))
            return
        self.tied_wait[r] = self.tied_wait.get(r, 0) + 1
        if self.tied_wait[r] < 2:
            return
        t0 = ev.now
        nbytes = self.embed_params * self.ge
        for st in (0, last):            # a stage's tail waits from here, not from its own last compute
            self.sync_start[st] = max(self.sync_start.get(st, 0.0), t0)

        def summed():
            self.log["embedding"].append(("all_reduce", nbytes, ev.now - t0, None, t0))
            self.bucket_ready(0, self.embedding_bucket(0))
            self.bucket_ready(last, self.embedding_bucket(last))
        done = C.barrier(plan.tp, summed)
        for t in range(plan.tp):
            C.run(self.f, "all_reduce", [device_of(plan, t, r, 0), device_of(plan, t, r, last)], nbytes, done)

    def _bucket_done(self, s: int) -> None:
        self.dp_done[s] += 1
        if self.dp_done[s] < self.buckets[s]:
            return
        if self.optimizer[s] > 0:       # every gradient of the stage reduced: the optimizer's kernels
            self.opt_span[s] = (self.ev.now, self.ev.now + self.optimizer[s])
            self.ev.at(self.ev.now + self.optimizer[s], self._updated, s)
        else:
            self._updated(s)

    def _updated(self, s: int) -> None:
        plan, ev = self.plan, self.ev
        if plan.zero in (1, 2) and plan.dp > 1:   # the updated weights, gathered from their shards (ZeRO 3
                                                   # gathers each block's before it runs)
            n = self.stage_params(s)
            ne = self.blocks[s] * self.expert_params_block
            t0 = ev.now

            def gathered():
                self.log["data_parallel"].append(("all_gather", n * self.e, ev.now - t0, s, t0))
                self.stage_end[s] = ev.now
            self.dp_collective(s, "all_gather", (n - ne) * self.e, ne * self.e, gathered)
        else:
            self.stage_end[s] = ev.now

    def gather_weights(self, s: int, key: tuple, dense_bytes: float, expert_bytes: float, then) -> None:
        """ZeRO 3: a replica asks for a block's weights; the all-gather over the data-parallel group
        starts when every replica of the stage has asked (a collective), and ``then`` of each runs
        when it ends."""
        rec = self.gathers.setdefault((s,) + key, [])
        rec.append(then)
        if len(rec) < self.plan.dp:
            return
        t0 = self.ev.now

        def ended():
            self.log["data_parallel"].append(("all_gather", dense_bytes + expert_bytes, self.ev.now - t0, s, t0))
            for cb in self.gathers.pop((s,) + key):
                cb()
        self.dp_collective(s, "all_gather", dense_bytes, expert_bytes, ended)

    # ---- streams ----
    def try_run(self, st: Stream) -> None:
        plan, ev = self.plan, self.ev
        if st.pos >= len(st.tasks) or st.busy_until > ev.now:
            return
        kind, mb, c = st.tasks[st.pos]
        first = st.stage == 0 and c == 0                           # the model's first layers
        last = st.stage == plan.pp - 1 and c == self.v - 1         # its last layers and the head
        if kind == "F" and not first and (kind, mb, c) not in st.arrived:
            return
        if kind == "B" and ((kind, mb, c) if not last else ("F", mb, c)) not in st.arrived:
            return                                  # the last layers' backward follows their own forward
        st.pos += 1
        dur, busy, exp = self.task_time(st.stage, kind, c)
        st.compute += busy
        st.tp_exposed += exp
        if plan.zero == 3 and plan.dp > 1:
            self._gathered_task(st, kind, mb, c, dur)
            return
        st.tasks_seconds += dur
        st.busy_until = ev.now + dur
        self._spans(st, kind, mb, c, ev.now, ev.now + dur)
        ev.at(ev.now + dur, self.finished, st, kind, mb, c)
        if kind == "B" and mb == plan.micro_batches - 1 and self.after:
            ev.at(ev.now + dur, self.grads_done, st.stage, st.replica)
        elif kind == "B" and mb == plan.micro_batches - 1:   # a chunk's last backward: a bucket as each block ends
            s = st.stage
            nb, b0 = self.chunk_blocks[s][c], self.chunk_first[s][c]
            per = dur / max(nb, 1)
            for k in range(nb):
                ev.at(ev.now + per * (k + 1), self.bucket_ready, s, b0 + nb - 1 - k)
            # the embedding's (or the head's) gradient, at the end of the chunk that holds it
            if self.buckets[s] > self.blocks[s] and self.holds_embedding(s, c):
                ev.at(ev.now + dur, self.embedding_grad, s, st.replica)

    def _spans(self, st: Stream, kind: str, mb: int, c: int, t0: float, t1: float) -> None:
        """Replica 0's spans of a task: a backward with recompute as each block's recompute (R) and
        backward (B) in turn, the last B on to the task's end (the LM head's backward, the gradients'
        accumulation, under ZeRO 3 the waits for weights)."""
        if st.replica != 0:
            return
        nb = self.chunk_blocks[st.stage][c]
        if kind != "B" or self.rec_block <= 0.0 or nb == 0 or not self.split_spans:
            st.spans.append((kind, mb, t0, t1))
            return
        t, back = t0, self.b_block[0] - self.rec_block
        for k in range(nb):
            st.spans.append(("R", mb, t, t + self.rec_block))
            t += self.rec_block
            st.spans.append(("B", mb, t, t1 if k == nb - 1 else t + back))
            t += back

    def _gathered_task(self, st: Stream, kind: str, mb: int, c: int, dur: float) -> None:
        """A task under ZeRO 3: each block's weights (fp16, this TP rank's shard of them) are
        all-gathered over the data-parallel group before the block runs (gather_weights: one
        collective of every replica), the next block's gather beside this one's compute (a prefetch
        of one block, as DeepSpeed's; none across tasks, so a task's first block waits for its
        gather); the chunk's embedding or LM head is gathered with its first block. The stream
        waits for a gather that is late."""
        plan, ev = self.plan, self.ev
        s = st.stage
        nb = max(self.chunk_blocks[s][c], 1)
        per = dur / nb
        sizes = [self.params_block * self.e] * nb
        if self.holds_embedding(s, c):
            sizes[0] += self.embed_params * self.e
        last_b = kind == "B" and mb == plan.micro_batches - 1
        b0 = self.chunk_first[s][c]
        t0 = ev.now
        st.busy_until = float("inf")
        g = {"gathered": 0, "done": 0, "in_flight": False, "running": False}

        def maybe_gather():
            j = g["gathered"]
            if g["in_flight"] or j >= nb or j > g["done"] + 1:
                return
            g["in_flight"] = True

            def arrived():
                g["in_flight"] = False
                g["gathered"] = j + 1
                maybe_gather()
                try_compute()
            expert = self.expert_params_block * self.e
            self.gather_weights(s, (kind, mb, c, j), sizes[j] - expert, expert, arrived)

        def try_compute():
            if g["running"] or g["done"] >= g["gathered"]:
                return
            g["running"] = True
            ev.at(ev.now + per, computed)

        def computed():
            g["running"] = False
            g["done"] += 1
            if last_b:                              # a chunk's last backward: this block's bucket
                self.bucket_ready(s, b0 + nb - g["done"])
            maybe_gather()
            if g["done"] < nb:
                try_compute()
                return
            took = ev.now - t0
            st.tasks_seconds += took
            st.gather_exposed += took - dur
            st.busy_until = ev.now
            self._spans(st, kind, mb, c, t0, ev.now)
            if last_b and self.buckets[s] > self.blocks[s] and self.holds_embedding(s, c):
                self.embedding_grad(s, st.replica)
            self.finished(st, kind, mb, c)

        maybe_gather()

    def _next(self, kind: str, s: int, c: int):
        """Where a task's output goes: (stage, chunk) of the task that reads it, or None (the last
        layers' forward feeds their own backward; the first layers' backward feeds nothing)."""
        pp = self.plan.pp
        if kind == "F":
            return (s + 1, c) if s < pp - 1 else ((0, c + 1) if c < self.v - 1 else None)
        return (s - 1, c) if s > 0 else ((pp - 1, c - 1) if c > 0 else None)

    def finished(self, st: Stream, kind: str, mb: int, c: int = 0) -> None:
        plan, ev = self.plan, self.ev
        st.last_end = ev.now
        s, r = st.stage, st.replica
        self.last_compute[s] = max(self.last_compute[s], ev.now)
        to = self._next(kind, s, c)
        if kind == "F" and to is None:
            st.arrived[("F", mb, c)] = ev.now
        elif to is not None:
            nxt, nc = to
            dst = self.streams[(nxt, r)]
            t0 = ev.now
            want = (kind, mb, nc)
            # (a stream's last send runs beside its data-parallel tail, which starts at its last compute)
            wait = plan.p2p == "wait" and st.pos < len(st.tasks)

            def delivered():
                dst.arrived[want] = ev.now
                self.log["pipeline"].append(("send_recv", self.act_bytes, ev.now - t0))
                if dst.pos < len(dst.tasks) and dst.tasks[dst.pos] == want and dst.busy_until <= ev.now:
                    dst.pp_exposed += ev.now - max(t0, dst.busy_until)   # idle while the transfer ran
                if wait:                                # the sender goes on once its send is delivered
                    st.busy_until = st.last_end = ev.now
                    st.pp_exposed += ev.now - t0
                    if st.replica == 0:
                        st.spans.append(("P", mb, t0, ev.now))
                    self.try_run(st)
                self.try_run(dst)
            if wait:
                st.busy_until = float("inf")
            done = C.barrier(plan.tp, delivered)
            for t in range(plan.tp):
                self.f.send(device_of(plan, t, r, s), device_of(plan, t, r, nxt), self.act_bytes, done)
        self.try_run(st)

    def run(self) -> dict:
        t_wall = time.perf_counter()
        for st in self.streams.values():
            self.try_run(st)
        self.ev.run()
        stuck = [k for k, st in self.streams.items() if st.pos < len(st.tasks)]
        if stuck:
            raise RuntimeError(f"step: streams {stuck[:4]} did not finish their schedules")
        ends = {s: (self.stage_end[s] if self.stage_end[s] is not None else self.last_compute[s])
                for s in range(self.plan.pp)}
        return {"step_seconds": max(ends.values()), "stage_end": ends, "event_seconds": time.perf_counter() - t_wall}


def link_timeline(f: "C.Fabric", topo: Topology, step: float, links: list[int], bins: int = 200) -> list[list[float]]:
    """Each link's mean utilization in ``bins`` equal slices of the step, from the network's
    record of rate changes."""
    import numpy as np

    out = np.zeros((len(links), bins))
    if step <= 0 or not links:
        return out.tolist()
    col = {int(x): i for i, x in enumerate(links)}
    edges = np.linspace(0.0, step, bins + 1)
    rate = np.zeros(len(links))
    last = 0.0

    def add(t0, t1):
        if t1 <= t0:
            return
        lo = np.clip(edges[:-1], t0, t1)
        hi = np.clip(edges[1:], t0, t1)
        out[:] += np.outer(rate, hi - lo)

    for t, moved, new in f.net.changes:
        hit = [(col[int(x)], v) for x, v in zip(moved.tolist(), new.tolist()) if int(x) in col]
        if not hit:
            continue
        add(last, min(t, step))
        last = min(t, step)
        for i, v in hit:
            rate[i] = v
    add(last, step)
    cap = topo.capacity[np.asarray(links, dtype=np.int64)][:, None]
    return np.round(out / (cap * (edges[1] - edges[0])), 4).tolist()


def link_table(f: "C.Fabric", topo: Topology, step: float, top: int = 20) -> list[dict]:
    """The busiest links of the step: bytes carried and utilization (bytes / capacity / step)."""
    import numpy as np

    used = np.nonzero(f.net.link_bytes > 0)[0]
    util = f.net.link_bytes[used] / (topo.capacity[used] * step) if step > 0 else f.net.link_bytes[used] * 0
    order = used[np.argsort(-util)][:top]
    return [{"name": link_name(topo, int(i)), "util": round(float(f.net.link_bytes[i] / (topo.capacity[i] * step)),
                                                            4), "bytes": float(f.net.link_bytes[i])}
            for i in order]


MAX_STREAMS = 4096      # choice: stages x replicas the step simulates one by one
MAX_SPLIT_SPANS = 500_000   # choice: recompute and backward spans of the block-by-block timeline
MAX_DP = 1024           # choice: ranks of a data-parallel ring (about 2 million transfers a bucket at most)


def check_step(plan: Plan, workload) -> None:
    if plan.dp > MAX_DP or plan.pp * plan.dp > MAX_STREAMS:
        raise InputError("--plan", f"pp {plan.pp} x dp {plan.dp} = {plan.pp * plan.dp:,} streams: the step simulates "
                         "every replica's stream and ring", f"dp at most {MAX_DP}, pp x dp at most {MAX_STREAMS}")
    if plan.schedule == "interleaved":
        blocks = min(stage_layers(workload.model.layers, plan.pp))
        if workload.scenario.phase != "train":
            raise InputError("--plan", f"interleaved:{plan.chunks} for {workload.scenario.phase}",
                             "a training step (inference runs its micro-batches forward through the stages)")
        if plan.pp < 2:
            raise InputError("--plan", f"interleaved:{plan.chunks} with pp {plan.pp}", "pp >= 2 (chunks of a "
                             "pipeline), or schedule=1f1b")
        if plan.micro_batches % plan.pp:
            raise InputError("--plan", f"interleaved:{plan.chunks} with {plan.micro_batches} micro-batches a replica "
                             f"over pp {plan.pp}", "micro-batches a replica (gbs / (mb x dp)) a multiple of pp, as "
                             "Megatron-LM's interleaved schedule needs")
        if plan.chunks > blocks:
            raise InputError("--plan", f"interleaved:{plan.chunks} with {blocks} blocks on the smallest stage",
                             f"at most {blocks} chunks a stage (a chunk holds a block or more)")
    if plan.sequence_parallel and workload.scenario.phase == "decode":
        raise InputError("--plan", "sequence parallelism in a decode step (one token a sequence: nothing to split "
                         "by tokens)", "sp=off, or a train or prefill step")


__all__ = ["BlockTimes", "StepSim", "block_parameters", "block_times", "check_step", "link_table", "link_timeline",
           "schedule"]
