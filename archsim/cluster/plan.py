"""A parallel plan: how a model is split over a cluster's devices, and what that costs in memory
and in bytes sent, before any kernel is timed.

- Plan text: ``tp=4,pp=12,dp=8,mb=2,gbs=2048,schedule=1f1b,recompute=full,zero=1,sp=off``
  (``schedule=interleaved:V`` for V model chunks a stage; ``order=tp-dp-pp`` places groups, the
  first varying fastest over device numbers, so TP groups are neighbours in a node by default).
- Stages: the decoder blocks plus the embedding and the LM head, each counted as one unit, split
  into ``pp`` contiguous balanced parts (Megatron-DeepSpeed's split for BLOOM: 70 blocks over 12
  stages give the first and last stage the embedding or head and 5 blocks, the others 6).
- Memory per device, from the tensor-parallel shard's op graph: weights, gradients and optimizer
  state (mixed-precision AdamW: 2 B weights, 2 B gradients plus a 4-B fp32 accumulation buffer,
  12 B fp32 master weights, momentum and variance = 20 B a parameter; in fp32 4 + 4 + 8), sharded
  over data parallelism by the ZeRO stage; activations are the forward tensors the backward ops
  read (from the op graph), times the micro-batches a schedule keeps in flight, less what the
  recompute rule recomputes; the last stage's logits in fp32; the KV cache for inference.
- Bytes per step by kind of parallelism: tensor parallel all-reduces (two a block forward, two
  backward, two more when recomputing), pipeline sends of activations and their gradients, data
  parallel gradient reduction (and ZeRO's weight gathers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from archsim.errors import InputError

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
KEYS = ("tp", "pp", "dp", "ep", "ep_place", "mb", "gbs", "schedule", "recompute", "zero", "sp", "order",
        "grad_reduce", "grad_accum", "p2p", "tp_async")
EP_PLACES = ("inside", "across")
GRAD_REDUCE = ("overlap", "after")
GRAD_ACCUM = ("fused", "fp32", "fp32_copy", "half")
P2P = ("wait", "overlap")
ON_OFF = ("on", "off")
MAX_DEGREE = 1 << 20
MAX_MICRO_BATCHES = 4096    # choice: a step's micro-batches a pipeline runs (published runs use hundreds)
GIB = 1 << 30


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    micro_batch: int = 1
    global_batch: Optional[int] = None     # default: micro_batch x dp (one micro-batch a step)
    schedule: str = "1f1b"
    chunks: int = 1                        # model chunks a stage (interleaved)
    recompute: str = "none"
    zero: int = 0
    sequence_parallel: bool = False
    order: tuple = ("tp", "dp", "pp")
    # an expert-parallel group: consecutive data-parallel replicas (inside a node or supernode when
    # it fits) or replicas dp / ep apart (across them); the replicas holding the same experts are the rest
    ep_place: str = "inside"
    # the data-parallel gradient reduction: a bucket a block as the last backward finishes it
    # (PyTorch DDP, Megatron-core's overlap_grad_reduce), or one reduction of the stage's gradients
    # after its last backward (Megatron-LM's local DDP, its default until 2023; DeepSpeed's pipeline
    # engine, whose schedule ends with ReduceTiedGrads, ReduceGrads, OptimizerStep)
    grad_reduce: str = "overlap"
    # how a micro-batch's weight gradients join the step's: in the weight-gradient GEMMs into an fp32
    # buffer (Megatron-core's gradient_accumulation_fusion; their fp32 epilogue is not timed), or by
    # a kernel after each backward into an fp32 buffer (Megatron-LM's main_grad hook with fp32
    # accumulation: 10 bytes a parameter; fp32_copy: the gradient first copied to fp32, then added,
    # as DeepSpeed's bf16 update_hp_grads does: 18 bytes) or into the 16-bit gradient itself
    # (PyTorch autograd's accumulation, fp16 Megatron-LM: 6 bytes, and the data-parallel reduction
    # in 16 bits); fp32 training accumulates in fp32 whatever the key says
    grad_accum: str = "fused"
    # a pipeline send: the sending stage's stream waits until its activations (or their gradients)
    # are delivered before its next task (Megatron-LM's p2p exchange ends with a
    # torch.cuda.synchronize(); DeepSpeed's pipeline engine sends with a blocking dist.send), or
    # the send runs beside the next task (Megatron-core's overlap_p2p_comm)
    p2p: str = "wait"
    # the backward's tensor-parallel collectives run beside the next kernel (the input gradient's
    # all-reduce beside the weight-gradient GEMM: Megatron-LM's async tensor-model-parallel
    # all-reduce, opt-in from 2021-09, and Megatron-core), or after it, exposed (Megatron-LM before
    # it, and bigscience's Megatron-DeepSpeed, whose all-reduce is the autograd backward of the
    # column-parallel layer's input copy)
    tp_async: bool = True

    def grad_bytes(self, dtype: str) -> int:
        """Bytes a gradient element has when the data-parallel reduction takes it."""
        return 2 if self.grad_accum == "half" and dtype in ("fp16", "bf16") else 4

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else self.micro_batch * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches each pipeline runs a step (gradient accumulation)."""
        return self.batch // (self.micro_batch * self.dp)

    def summary(self) -> dict:
        sched = f"interleaved:{self.chunks}" if self.schedule == "interleaved" else self.schedule
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "micro_batch": self.micro_batch,
                "global_batch": self.batch, "schedule": sched, "recompute": self.recompute, "zero": self.zero,
                "sequence_parallel": self.sequence_parallel, "order": "-".join(self.order),
                "grad_reduce": self.grad_reduce, "grad_accum": self.grad_accum, "p2p": self.p2p,
                "tp_async": self.tp_async,
                **({"ep_place": self.ep_place} if self.ep > 1 else {})}

    def ep_groups(self) -> list[list[int]]:
        """The data-parallel replicas of each expert-parallel group."""
        n = self.dp // self.ep
        if self.ep_place == "across":
            return [[i * n + g for i in range(self.ep)] for g in range(n)]
        return [[g * self.ep + i for i in range(self.ep)] for g in range(n)]

    def expert_replicas(self) -> list[list[int]]:
        """The replicas holding the same experts (one of each expert-parallel group, at the same place)."""
        groups = self.ep_groups()
        return [[grp[i] for grp in groups] for i in range(self.ep)]


def _int(key: str, v: str, where: str, lo: int = 1, hi: int = MAX_DEGREE) -> int:
    # ASCII digits only: int() would also take 2_0, +2 and other scripts' digits
    n = int(v) if v.isascii() and v.isdigit() and len(v) <= 20 else None
    if n is None or not lo <= n <= hi:
        shown = v if len(v) <= 24 else f"{v[:20]}... ({len(v):,} characters)"
        raise InputError(where, f"{key}={shown!r} is not a whole number from {lo} to {hi:,}", f"{key}=N")
    return n


def _word(seen: dict, key: str, choices: tuple, where: str, allowed: str) -> str:
    """A plan key's word, one of ``choices``."""
    if seen[key] not in choices:
        raise InputError(where, f"{key}={seen[key]!r}", allowed)
    return seen[key]


def parse_plan(text: str, where: str = "--plan") -> Plan:
    """``key=value`` pairs, comma-separated, into a Plan; one InputError on anything else."""
    allowed = ("tp, pp, dp, ep, mb, gbs (whole numbers), schedule=gpipe|1f1b|interleaved:V, "
               "recompute=none|selective|full, zero=0..3, sp=on|off, ep_place=inside|across, "
               "order=tp-dp-pp (a permutation), grad_reduce=overlap|after, grad_accum=fused|fp32|fp32_copy|half, "
               "p2p=wait|overlap, tp_async=on|off")
    if not isinstance(text, str) or not text.strip():
        raise InputError(where, "empty plan", allowed)
    seen: dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or not key or not value:
            raise InputError(where, f"{item.strip()!r} is not key=value", allowed)
        if key not in KEYS:
            raise InputError(where, f"unknown key {key!r}", allowed)
        if key in seen:
            raise InputError(where, f"{key} given twice", "each key once")
        seen[key] = value.strip()
    kw: dict = {}
    for key in ("tp", "pp", "dp", "ep"):
        if key in seen:
            kw[key] = _int(key, seen[key], where)
    if "mb" in seen:
        kw["micro_batch"] = _int("mb", seen["mb"], where)
    if "gbs" in seen:
        kw["global_batch"] = _int("gbs", seen["gbs"], where, hi=1 << 40)
    if "schedule" in seen:
        name, colon, v = seen["schedule"].partition(":")
        if name not in SCHEDULES or (name == "interleaved") != bool(colon):
            raise InputError(where, f"schedule={seen['schedule']!r}", "gpipe, 1f1b or interleaved:V (V chunks a stage)")
        kw["schedule"] = name
        if colon:
            kw["chunks"] = _int("interleaved", v, where, lo=2, hi=1024)
    if "recompute" in seen:
        kw["recompute"] = _word(seen, "recompute", RECOMPUTE, where, "none, selective or full")
    if "zero" in seen:
        kw["zero"] = _int("zero", seen["zero"], where, lo=0, hi=3)
    if "ep_place" in seen:
        _word(seen, "ep_place", EP_PLACES, where, "inside or across")
        if kw.get("ep", 1) < 2:
            raise InputError(where, f"ep_place={seen['ep_place']} without expert parallelism", "ep=E (E >= 2) with it")
        kw["ep_place"] = seen["ep_place"]
    if "sp" in seen:
        kw["sequence_parallel"] = _word(seen, "sp", ON_OFF, where, "on or off") == "on"
    if "grad_reduce" in seen:
        _word(seen, "grad_reduce", GRAD_REDUCE, where, "overlap (a bucket a block during the backward) or after "
              "(one reduction after the stage's last backward)")
        if kw.get("zero") == 3 and seen["grad_reduce"] == "after":
            raise InputError(where, "grad_reduce=after with zero=3 (ZeRO 3 reduce-scatters each block's gradients "
                             "as its backward ends, to free them)", "grad_reduce=overlap, or zero=0..2")
        kw["grad_reduce"] = seen["grad_reduce"]
    if "grad_accum" in seen:
        kw["grad_accum"] = _word(seen, "grad_accum", GRAD_ACCUM, where, "fused (in the weight-gradient GEMMs), "
                                 "fp32 (a kernel after each backward into an fp32 buffer), fp32_copy (the gradient "
                                 "copied to fp32, then added) or half (into the 16-bit gradient)")
    if "p2p" in seen:
        kw["p2p"] = _word(seen, "p2p", P2P, where, "wait (a stage waits for its pipeline sends to be delivered) "
                          "or overlap (they run beside its next task)")
    if "tp_async" in seen:
        kw["tp_async"] = _word(seen, "tp_async", ON_OFF, where, "on (the backward's tensor-parallel all-reduce "
                               "beside the weight-gradient GEMM) or off (after it)") == "on"
    if "order" in seen:
        order = tuple(seen["order"].split("-"))
        if sorted(order) != ["dp", "pp", "tp"]:
            raise InputError(where, f"order={seen['order']!r} is not a permutation of tp, dp, pp", "e.g. tp-dp-pp")
        kw["order"] = order
    return Plan(**kw)


# ---- checks, before any kernel is timed ------------------------------------------------------------

def check_plan(plan: Plan, cluster, workload, where: str = "--plan") -> None:
    """The plan against the cluster and the model: one InputError naming what does not fit."""
    m = workload.model
    if plan.devices > cluster.devices:
        raise InputError(where, f"tp {plan.tp} x pp {plan.pp} x dp {plan.dp} = {plan.devices:,} devices; cluster "
                         f"{cluster.name} has {cluster.devices:,}", f"at most {cluster.devices:,} devices")
    if plan.ep > 1 and m.moe is None:
        raise InputError(where, f"ep {plan.ep}: {workload.name} has no experts (expert parallelism splits the "
                         "experts of a mixture-of-experts model)", "ep=1 for a dense model")
    if plan.ep > 1 and (m.moe.experts % plan.ep or plan.dp % plan.ep):
        raise InputError(where, f"ep {plan.ep} with {m.moe.experts} experts and dp {plan.dp}",
                         "ep dividing the experts and dp (expert-parallel groups are data-parallel replicas)")
    if m.moe is not None and plan.tp > 1:
        raise InputError(where, f"tp {plan.tp} with {workload.name}'s experts: a tensor-parallel shard of the "
                         "experts is not built", "tp=1 for a mixture-of-experts model")
    for what, n in (("heads", m.heads), ("hidden", m.hidden), ("ffn_hidden", m.ffn_hidden)):
        if n % plan.tp:
            raise InputError(where, f"tp {plan.tp} does not divide {workload.name}'s {what} {n}",
                             f"a divisor of heads {m.heads}, hidden {m.hidden} and ffn_hidden {m.ffn_hidden}")
    if plan.pp > m.layers:
        raise InputError(where, f"pp {plan.pp} is more stages than {workload.name}'s {m.layers} layers",
                         f"at most {m.layers}")
    if plan.schedule == "interleaved" and plan.pp * plan.chunks > m.layers:
        raise InputError(where, f"interleaved:{plan.chunks} over pp {plan.pp} needs {plan.pp * plan.chunks} model "
                         f"chunks of at least one layer; {workload.name} has {m.layers}",
                         f"pp x V <= {m.layers}")
    per_step = plan.micro_batch * plan.dp
    if plan.batch // per_step > MAX_MICRO_BATCHES:
        raise InputError(where, f"global batch {plan.batch} over micro-batch {plan.micro_batch} x dp {plan.dp} is "
                         f"{plan.batch // per_step:,} micro-batches a step", f"at most {MAX_MICRO_BATCHES:,}")
    if plan.batch % per_step:
        raise InputError(where, f"micro-batch {plan.micro_batch} x dp {plan.dp} = {per_step} does not divide the "
                         f"global batch {plan.batch}", f"a global batch that is a multiple of {per_step}")
    if plan.sequence_parallel and workload.scenario.phase != "decode":
        rows = plan.micro_batch * workload.scenario.seq
        if rows % plan.tp:
            raise InputError(where, f"sequence parallelism splits the {rows} tokens of a micro-batch over tp "
                             f"{plan.tp}", "tp dividing micro-batch x seq")


# ---- placement --------------------------------------------------------------------------------------

def device_of(plan: Plan, tp: int, dp: int, pp: int) -> int:
    """The device number of the rank at (tp, dp, pp) coordinates: ``order`` varies fastest first."""
    coord = {"tp": tp, "dp": dp, "pp": pp}
    size = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}
    dev, stride = 0, 1
    for axis in plan.order:
        dev += coord[axis] * stride
        stride *= size[axis]
    return dev


def groups(plan: Plan, kind: str) -> list[list[int]]:
    """Every group of one kind (``tp``, ``dp`` or ``pp``) as lists of device numbers."""
    out = []
    axes = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}
    others = [a for a in ("tp", "dp", "pp") if a != kind]
    for i in range(axes[others[0]]):
        for j in range(axes[others[1]]):
            members = []
            for k in range(axes[kind]):
                c = {others[0]: i, others[1]: j, kind: k}
                members.append(device_of(plan, c["tp"], c["dp"], c["pp"]))
            out.append(members)
    return out


def stage_layers(layers: int, pp: int) -> list[int]:
    """Decoder blocks of each pipeline stage: the blocks, the embedding and the head as layers + 2
    units split into pp contiguous balanced parts, the embedding first, the head last."""
    units = layers + 2
    q, r = divmod(units, pp)
    sizes = [q + 1 if s < r else q for s in range(pp)]
    blocks = list(sizes)
    blocks[0] -= 1
    blocks[-1] -= 1
    if pp == 1:
        return [layers]
    return blocks


# ---- memory -----------------------------------------------------------------------------------------

def with_scenario(workload, layers: int | None = None, **scenario):
    """The workload with scenario fields (and, given, its layer count) changed, validated again:
    a plan's shard (tensor_parallel, batch = the micro-batch) or one block of it (layers=1)."""
    from archsim.workloads.model import validate_workload

    data = workload.model_dump(mode="json")
    if layers is not None:
        data["model"] = {**data["model"], "layers": layers}
    data["scenario"] = {**data["scenario"], **scenario}
    return validate_workload(data, workload.name)


def _elem(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def block_parameters(shard, experts_only: bool = False) -> int:
    """Parameters of one block on one device: the weights and norm scales of the shard's op graph
    (``experts_only``: its experts' weights, which expert parallelism splits)."""
    shapes = shard.tensor_shapes()
    n = 0
    for name, shape in shapes.items():
        if name.startswith("w_expert") if experts_only else (name.startswith("w_") or name.endswith(("_gamma",
                                                                                                      "_beta"))):
            size = 1
            for s in shape:
                size *= s
            n += size
    return n


# the tensors every device of a tensor-parallel group holds whole (the residual stream and the norms'
# outputs); sequence parallelism splits them over the group by tokens
REPLICATED = ("x", "x_n1", "x_mid", "x_n2", "y", "res1_mask", "res2_mask")


def stored_activations(train_shard, recompute: str, sp: bool, tp: int) -> int:
    """Bytes one block keeps from forward to backward for one micro-batch: the forward tensors its
    backward ops read. ``full`` keeps the block's input only; ``selective`` recomputes attention's
    internals (its probabilities or log-sum-exp); sequence parallelism splits the tensors every
    device otherwise holds whole (the ones as wide as the model) over tp."""
    ops = train_shard.block_ops()
    shapes = train_shard.tensor_shapes()
    e = _elem(train_shard.scenario.dtype)
    produced_fwd, read_bwd = set(), set()
    backward = False
    for op in ops:
        if "." in op.name:
            backward = True
        if backward:
            read_bwd.update(i for i in op.inputs if not i.startswith("d_"))
        else:
            produced_fwd.update(op.outputs)
    kept = {"x"} | (read_bwd & produced_fwd) if recompute != "full" else {"x"}
    if recompute == "selective":
        kept -= {"attn_probs", "attn_lse", "attn_drop", "attn_mask"}
    total = 0
    for name in kept:
        size = 1
        for s in shapes[name]:
            size *= s
        if sp and name in REPLICATED:
            size //= tp
        total += size * (1 if name.endswith("_mask") else e)     # dropout masks: a byte an element
    return total


def _in_flight(plan: Plan, stage: int) -> float:
    """Micro-batches whose activations a stage holds at its peak."""
    m = plan.micro_batches
    if plan.schedule == "gpipe":
        return m
    held = min(plan.pp - stage, m)
    if plan.schedule == "interleaved":        # Narayanan et al. 2021: the first stage holds this much more
        held *= 1 + (plan.pp - 1) / (plan.pp * plan.chunks)
    return held


def optimizer_parameters(plan: Plan, workload) -> list[float]:
    """Per stage, the parameters whose optimizer state (and update) one device holds: all of the
    stage's on its TP shard, or under ZeRO 1-3 its share of them over the devices that hold each
    (a dense parameter over dp, an expert's over dp / ep)."""
    m = workload.model
    shard = with_scenario(workload, tensor_parallel=plan.tp, expert_parallel=plan.ep, batch=plan.micro_batch)
    per_block = block_parameters(shard)
    expert_block = block_parameters(shard, experts_only=True)
    embed = m.vocab * m.hidden // plan.tp          # vocab-parallel; the tied head keeps a copy on the last stage
    out = []
    for s, nb in enumerate(stage_layers(m.layers, plan.pp)):
        params = nb * per_block + (embed if s == 0 or s == plan.pp - 1 else 0)
        spread = params - nb * expert_block + nb * expert_block * plan.ep
        out.append(float(params) if plan.zero < 1 else spread / plan.dp)
    return out


def memory_per_device(plan: Plan, workload, capacity_bytes: float) -> dict:
    """Bytes a device of each stage needs, and the largest: weights, gradients, optimizer state,
    activations, KV cache, against ``capacity_bytes``."""
    m, sc = workload.model, workload.scenario
    e = _elem(sc.dtype)
    train = sc.phase == "train"
    shard = with_scenario(workload, tensor_parallel=plan.tp, expert_parallel=plan.ep, batch=plan.micro_batch)
    per_block = block_parameters(shard)
    expert_block = block_parameters(shard, experts_only=True)
    embed = m.vocab * m.hidden // plan.tp          # vocab-parallel; the tied head keeps a copy on the last stage
    blocks = stage_layers(m.layers, plan.pp)
    grad_b, opt_b = (2 + 4, 12) if e == 2 else (4, 8)
    d = plan.dp
    act_block = stored_activations(shard, plan.recompute, plan.sequence_parallel, plan.tp) if train else 0
    work_block = stored_activations(shard, "none", plan.sequence_parallel, plan.tp) if train else 0
    opt_params = optimizer_parameters(plan, workload)
    stages = []
    for s, nb in enumerate(blocks):
        params = nb * per_block + (embed if s == 0 or s == plan.pp - 1 else 0)
        # ZeRO shards a parameter over the devices that hold it: an expert's over dp / ep replicas
        spread = params - nb * expert_block + nb * expert_block * plan.ep
        w = params * e if plan.zero < 3 else spread * e / d
        g = (params * grad_b if plan.zero < 2 else spread * grad_b / d) if train else 0.0
        o = opt_params[s] * opt_b if train else 0.0
        act = 0.0
        if train:
            act = act_block * nb * _in_flight(plan, s)
            if plan.recompute == "full":
                act += work_block            # one block's tensors while its backward recomputes them
            if s == plan.pp - 1:             # the logits, in fp32 for the loss
                act += plan.micro_batch * sc.seq * m.vocab / plan.tp * 4
        kv = 0.0
        if sc.phase in ("prefill", "decode"):
            kv_len = sc.seq + 1 if sc.phase == "decode" else sc.seq
            kv = 2 * nb * plan.micro_batch * kv_len * (m.hidden // plan.tp) * e
        total = w + g + o + act + kv
        stages.append({"stage": s, "blocks": nb, "parameters": params, "weights": w, "gradients": g,
                       "optimizer": o, "activations": act, "kv_cache": kv, "total": total})
    worst = max(stages, key=lambda x: x["total"])
    return {"stages": stages, "worst_stage": worst["stage"], "capacity": float(capacity_bytes),
            **{k: worst[k] for k in ("weights", "gradients", "optimizer", "activations", "kv_cache", "total")}}


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def check_fits(plan: Plan, workload, capacity_bytes: float, device: str, where: str = "--plan") -> dict:
    """The memory of ``plan``; an InputError saying by how much it does not fit and what would."""
    mem = memory_per_device(plan, workload, capacity_bytes)
    if mem["total"] <= capacity_bytes:
        return mem
    parts = ", ".join(f"{k} {_gb(mem[k])}" for k in ("weights", "gradients", "optimizer", "activations", "kv_cache")
                      if mem[k])
    hints = []
    for change in ({"zero": 1}, {"zero": 2}, {"zero": 3}, {"recompute": "full"}, {"zero": 1, "recompute": "full"},
                   {"zero": 3, "recompute": "full"}):
        alt = replace(plan, **change)
        if alt == plan or (alt.zero < plan.zero):
            continue
        t = memory_per_device(alt, workload, capacity_bytes)["total"]
        if t <= capacity_bytes:
            hints.append(",".join(f"{k}={v}" for k, v in change.items()) + f" ({_gb(t)})")
            break
    if not hints:
        hints.append("more pipeline or tensor parallelism, or a smaller micro-batch")
    raise InputError(where, f"stage {mem['worst_stage']} needs {_gb(mem['total'])} a device ({parts}); {device} "
                     f"has {_gb(capacity_bytes)}: {_gb(mem['total'] - capacity_bytes)} over",
                     "what would fit: " + "; ".join(hints))


# ---- bytes sent a step --------------------------------------------------------------------------------

def step_volumes(plan: Plan, workload) -> dict:
    """Bytes each kind of parallelism moves in one training step (inference: one forward), per
    device of the busiest stage and over the whole cluster, with the collective each uses."""
    m, sc = workload.model, workload.scenario
    e = _elem(sc.dtype)
    train = sc.phase == "train"
    rows = plan.micro_batch * (1 if sc.phase == "decode" else sc.seq)
    act = rows * m.hidden * e                          # one micro-batch's hidden state
    mbs = plan.micro_batches if train else 1
    blocks = max(stage_layers(m.layers, plan.pp))
    out = {}
    if plan.tp > 1:
        calls = 2 + (2 + (2 if plan.recompute == "full" else 0) if train else 0)
        per_dev = blocks * mbs * calls * act
        out["tensor_parallel"] = {"collective": "reduce_scatter+all_gather" if plan.sequence_parallel
                                  else "all_reduce", "calls_per_device": blocks * mbs * calls,
                                  "bytes_per_call": act, "bytes_per_device": per_dev,
                                  "bytes_total": per_dev * plan.devices}
    if plan.ep > 1:
        # the slot buffer (experts x capacity rows of h) goes by all-to-all after the dispatch and
        # after the experts, and their gradients back in backward; (ep - 1) / ep of it leaves the device
        buf = m.moe.experts * m.moe.capacity(rows) * m.hidden * e
        calls = 2 + (2 + (2 if plan.recompute == "full" else 0) if train else 0)
        per_dev = blocks * mbs * calls * buf * (plan.ep - 1) / plan.ep
        out["expert_parallel"] = {"collective": "all_to_all", "calls_per_device": blocks * mbs * calls,
                                  "bytes_per_call": buf, "bytes_per_device": per_dev,
                                  "bytes_total": per_dev * plan.devices}
    if plan.pp > 1:
        # a micro-batch crosses pp - 1 stage boundaries a model chunk, and pp * v - 1 in all with v
        # chunks a stage (the last stage feeds the first between chunks); a device sends once a chunk
        v = plan.chunks if plan.schedule == "interleaved" else 1
        per_dev = mbs * v * act / plan.tp * (2 if train else 1)   # each TP rank sends its 1/tp slice
        out["pipeline"] = {"collective": "send_recv", "calls_per_device": mbs * v * (2 if train else 1),
                           "bytes_per_call": act / plan.tp, "bytes_per_device": per_dev,
                           "bytes_total": mbs * act * (2 if train else 1) * plan.dp * (plan.pp * v - 1)}
    if plan.dp > 1 and train:
        per_block = block_parameters(with_scenario(workload, tensor_parallel=plan.tp, expert_parallel=plan.ep))
        embed = m.vocab * m.hidden // plan.tp
        params = max(b * per_block + (embed if s in (0, plan.pp - 1) else 0)
                     for s, b in enumerate(stage_layers(m.layers, plan.pp)))
        grad = params * plan.grad_bytes(sc.dtype)       # gradients reduced in their accumulation type
        kind = "all_reduce" if plan.zero == 0 else "reduce_scatter+all_gather"
        per_dev = grad + (params * e if plan.zero in (1, 2) else 0)     # ZeRO 1-2: the updated weights once
        if plan.zero == 3:
            per_dev += 2 * mbs * params * e             # weights gathered for every forward and backward
        out["data_parallel"] = {"collective": kind, "calls_per_device": 1, "bytes_per_call": grad,
                                "bytes_per_device": per_dev, "bytes_total": per_dev * plan.devices}
    return out


__all__ = ["KEYS", "Plan", "RECOMPUTE", "SCHEDULES", "check_fits", "check_plan", "device_of", "groups",
           "memory_per_device", "parse_plan", "stage_layers", "step_volumes", "with_scenario"]
