"""Transformer workloads: model YAML (+ command-line scenario overrides) -> a frozen ``Workload``.

    w = load_workload("gpt2-small", {"phase": "decode", "batch": 4, "seq": None})
    ops = w.block_ops()          # one decoder block's op graph, in execution order (ops.py)
    w.totals()                   # flops / model_flops of ``layers`` blocks

The schema is that of workloads/*.yaml, with one optional model field: ``model.norm_eps`` (the
normalisation epsilon, default 1e-5, which numpy references and norm kernels need to agree on).
Every bad input becomes one ``InputError`` naming the file (or the command-line option that
supplied the value), the dotted field and what is allowed, in the config loader's style.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from archsim.config import schema_errors as SE
from archsim.config.load import NumberTooLong, load_yaml_text, read_yaml, resolve_file
from archsim.config.schema import MAX_INT, FieldError
from archsim.errors import InputError
from archsim.paths import data_dir

from .ops import Op, build_block

PHASES = ("train", "prefill", "decode")
DTYPES = ("fp16", "bf16", "fp32")
ACTIVATIONS = ("gelu", "relu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
ATTENTIONS = ("fused", "unfused")

MAX_DROPOUT = 0.999         # elementwise_gpu.MAX_DROP: above, nothing is kept worth scaling
PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_INT)]   # as a machine's counts: exact as floats
Bool = Annotated[bool, Field(strict=True)]
Text = Annotated[str, Field(strict=True, min_length=1)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


MAX_EXPERTS = 4096      # choice: experts a layer (the largest published MoE layers have a few thousand)


class MoeSpec(_Frozen):
    """A mixture-of-experts FFN in every block (GShard / Switch Transformer routing): a gate GEMM
    scores the experts for each token, each token goes to its ``top_k`` best, and each expert takes
    at most ``capacity_factor`` x its even share of the routed tokens (the rest are dropped; the
    residual carries them). Each expert is an FFN of ``model.ffn_hidden`` with ``model.activation``."""

    experts: Annotated[int, Field(strict=True, ge=2, le=MAX_EXPERTS)]
    top_k: PosInt
    capacity_factor: Annotated[float, Field(strict=True, gt=0, le=64, allow_inf_nan=False)]

    @model_validator(mode="after")
    def _k_of_experts(self):
        if self.top_k > self.experts:
            raise FieldError("top_k", f"top_k {self.top_k} > experts {self.experts}", f"1 to {self.experts}",
                             related=("experts",))
        return self

    def capacity(self, tokens: int) -> int:
        """Slots of one expert for ``tokens`` tokens: ceil(capacity_factor x tokens x top_k / experts)."""
        return max(1, math.ceil(self.capacity_factor * tokens * self.top_k / self.experts - 1e-9))


class ModelSpec(_Frozen):
    """The architecture: ``layers`` identical pre-norm decoder blocks."""

    layers: PosInt                  # decoder blocks
    hidden: PosInt                  # h
    heads: PosInt                   # n
    head_dim: PosInt                # d (h = n*d)
    ffn_hidden: PosInt              # f: the FFN's inner width (swiglu: of each of gate and up)
    vocab: PosInt                   # not part of the block (embedding and LM head are out of scope)
    activation: Literal["gelu", "relu", "swiglu"]
    norm: Literal["layernorm", "rmsnorm"]
    # Optional: the norm epsilon, so references and kernels agree.
    norm_eps: Annotated[float, Field(strict=False, gt=0, lt=1, allow_inf_nan=False)] = 1e-5
    # Optional: a mixture-of-experts FFN instead of the dense one.
    moe: Optional[MoeSpec] = None
    # Optional: dropout probabilities in training (Megatron-LM's --attention-dropout on attention's
    # probabilities, needing unfused attention, and --hidden-dropout in the residual adds); 0: none.
    attention_dropout: Annotated[float, Field(strict=False, ge=0, le=MAX_DROPOUT, allow_inf_nan=False)] = 0.0
    hidden_dropout: Annotated[float, Field(strict=False, ge=0, le=MAX_DROPOUT, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _heads_times_dim(self):
        if self.hidden != self.heads * self.head_dim:
            raise FieldError("hidden", f"hidden {self.hidden} != heads {self.heads} x head_dim {self.head_dim} "
                             f"= {self.heads * self.head_dim}", "hidden = heads x head_dim",
                             related=("heads", "head_dim"))
        return self


class Scenario(_Frozen):
    """What runs: the phase, the batch and sequence, the precision and the attention kernel."""

    phase: Literal["train", "prefill", "decode"]
    batch: PosInt                   # b (micro-batch)
    seq: PosInt                     # s; decode: tokens already in the KV cache
    causal: Bool
    dtype: Literal["fp16", "bf16", "fp32"]
    attention: Literal["fused", "unfused"]    # fused (flash) | unfused (scores through DRAM)
    # where the tensors live on a machine with private memory segments (Sunway): cross = one shared
    # address space interleaved over every memory controller; private = each core group runs as its
    # own process with its tensors (weights replicated, activations its share) in its own segment.
    # Machines whose memory is interleaved over all channels (GPUs) have only cross.
    placement: Literal["cross", "private"] = "cross"
    # one device's share of a tensor-parallel group of this many devices (Megatron's split): QKV and
    # FFN-in by columns, attention by heads, projection and FFN-out by rows (their outputs are the
    # partial sums the group's all-reduce adds); norms and residual adds whole on every device
    tensor_parallel: PosInt = 1
    # one device's share of an expert-parallel group of this many devices (model.moe): it holds
    # experts / expert_parallel of the experts and, after the all-to-all, computes them over the
    # group's tokens (its slots from every device of the group)
    expert_parallel: PosInt = 1


class Workload(_Frozen):
    name: Text
    model: ModelSpec
    scenario: Scenario

    @model_validator(mode="after")
    def _shardable(self):
        tp, m = self.scenario.tensor_parallel, self.model
        for what, n in (("heads", m.heads), ("ffn_hidden", m.ffn_hidden)):
            if n % tp:
                raise FieldError("scenario.tensor_parallel", f"tensor_parallel {tp} does not divide model.{what} "
                                 f"{n}", f"a divisor of heads {m.heads} and ffn_hidden {m.ffn_hidden}",
                                 related=(f"model.{what}",))
        ep = self.scenario.expert_parallel
        if ep > 1 and (m.moe is None or m.moe.experts % ep):
            raise FieldError("scenario.expert_parallel", f"expert_parallel {ep} " + (
                "without model.moe" if m.moe is None else f"does not divide model.moe.experts {m.moe.experts}"),
                "1 for a dense model, else a divisor of the experts", related=("model.moe",))
        sc = self.scenario
        if m.attention_dropout and sc.phase == "train" and sc.attention == "fused":
            raise FieldError("model.attention_dropout", f"attention_dropout {m.attention_dropout} with fused "
                             "attention: the fused kernels do not drop", "0, or scenario.attention unfused",
                             related=("scenario.attention",))
        if m.moe is not None and tp > 1:
            raise FieldError("scenario.tensor_parallel", f"tensor_parallel {tp} with model.moe: a tensor-parallel "
                             "shard of the experts is not built", "tensor_parallel 1 for a mixture-of-experts model",
                             related=("model.moe",))
        return self

    # ---- the op graph ----

    def block_ops(self) -> list[Op]:
        """The ops of ONE decoder block for the scenario's phase, in execution order."""
        return build_block(self)[0]

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the block's ops name (activations, weights, cache, grads) -> its shape."""
        return build_block(self)[1]

    def tokens(self) -> int:
        """T: rows of the block's activations (batch x seq; decode: batch)."""
        sc = self.scenario
        return sc.batch if sc.phase == "decode" else sc.batch * sc.seq

    def totals(self) -> dict:
        """flops and model_flops of one block and of the whole workload (``layers`` blocks)."""
        ops = self.block_ops()
        bf = sum(o.flops for o in ops)
        bm = sum(o.model_flops for o in ops)
        L = self.model.layers
        return {"layers": L, "block_flops": bf, "block_model_flops": bm, "flops": bf * L, "model_flops": bm * L}

    def summary(self) -> dict:
        """The result JSON's ``workload`` record (docs/records.md: name, phase, batch, seq, layers, ...)."""
        m, sc = self.model, self.scenario
        out = {"name": self.name, "phase": sc.phase, "batch": sc.batch, "seq": sc.seq, "layers": m.layers,
               "dtype": sc.dtype, "attention": sc.attention, "causal": sc.causal, "placement": sc.placement,
               "hidden": m.hidden, "tensor_parallel": sc.tensor_parallel,
               **({"expert_parallel": sc.expert_parallel} if sc.expert_parallel > 1 else {}),
               "heads": m.heads, "head_dim": m.head_dim, "ffn_hidden": m.ffn_hidden,
               "activation": m.activation, "norm": m.norm}
        if m.moe is not None:
            out["moe"] = {**m.moe.model_dump(), "capacity": m.moe.capacity(self.tokens())}
        if m.attention_dropout or m.hidden_dropout:
            out["dropout"] = {"attention": m.attention_dropout, "hidden": m.hidden_dropout}
        return out


# ---- loading ----------------------------------------------------------------------------------

# Command-line scenario options -> (field path, option name shown in errors).
OVERRIDES = {
    "phase": (("scenario", "phase"), "--phase"),
    "batch": (("scenario", "batch"), "--batch"),
    "seq": (("scenario", "seq"), "--seq"),
    "layers": (("model", "layers"), "--layers"),
    "dtype": (("scenario", "dtype"), "--dtype"),
    "attention": (("scenario", "attention"), "--attention"),
    "causal": (("scenario", "causal"), "--causal"),
    "placement": (("scenario", "placement"), "--placement"),
    "tensor_parallel": (("scenario", "tensor_parallel"), "--tp"),
    "expert_parallel": (("scenario", "expert_parallel"), "--ep"),
}


def builtin_workloads() -> list[str]:
    """Names of the workload files shipped in workloads/ (gpt2-small, llama2-7b, ..., tiny)."""
    return sorted(p.stem for p in data_dir("workloads").glob("*.yaml"))


def resolve_workload(arg: str) -> Path:
    """A workload file: a path to a YAML file, or a built-in name found in workloads/."""
    return resolve_file(arg, "--workload", "workload", data_dir("workloads"), builtin_workloads())


def _convert(exc: ValidationError, label: str, origins: Mapping[tuple, str]) -> InputError:
    """A pydantic error -> one InputError (the first error, in the config loader's words)."""
    loc, paths, what, allowed, _ = SE.explain(exc, Workload, full_path=False)
    for p in paths:                                  # a value from the command line: name the option
        if p in origins:
            field = SE.dotted(p)
            if not what.startswith((field, field.split(".")[-1])):
                what = f"{field}: {what}"
            return InputError(origins[p], what, allowed)
    return InputError(f"{label}: {SE.dotted(loc)}" if loc else label, what, allowed)


def _apply_overrides(data: dict, overrides: Optional[Mapping[str, Any]]) -> tuple[dict, dict]:
    origins: dict[tuple, str] = {}
    if not overrides:
        return data, origins
    if not isinstance(overrides, Mapping):
        raise InputError("overrides", f"expected a mapping, got {type(overrides).__name__}",
                         "a dict of scenario fields")
    data = dict(data)
    for key, value in overrides.items():
        if key not in OVERRIDES:
            raise InputError("overrides", f"unknown scenario option {key!r}", "one of: " + ", ".join(OVERRIDES))
        if value is None:                            # the option was not given
            continue
        path, flag = OVERRIDES[key]
        if isinstance(value, str) and SE.unwrap(SE.type_at(Workload, path)) in (int, bool):
            try:                                     # "4", "true" from a command line
                parsed = load_yaml_text(value)
            except NumberTooLong as e:
                raise InputError(flag, e.problem, f"an integer of at most {MAX_INT}") from None
            except yaml.YAMLError:
                parsed = value
            value = parsed if isinstance(parsed, (int, bool)) else value
        block = data.get(path[0])
        block = dict(block) if isinstance(block, dict) else {}
        block[path[1]] = value
        data[path[0]] = block
        origins[path] = flag
    return data, origins


def validate_workload(data: Any, label: str = "<workload>", overrides: Optional[Mapping[str, Any]] = None
                      ) -> Workload:
    """A plain dict (+ overrides) -> Workload; errors become one InputError naming ``label``."""
    if not isinstance(data, dict):
        raise InputError(label, f"expected a mapping of keys at the top level, got {type(data).__name__}",
                         "a YAML mapping such as `name: ...`")
    data, origins = _apply_overrides(data, overrides)
    try:
        return Workload.model_validate(data)
    except ValidationError as e:
        raise _convert(e, label, origins) from None


def load_workload(name_or_path: str, overrides: Optional[Mapping[str, Any]] = None) -> Workload:
    """Resolve a built-in name or a path, read the YAML, apply command-line scenario overrides
    (keys: phase, batch, seq, layers, dtype, attention, causal, placement; a ``None`` value means "not
    given"), validate. Every problem is one ``InputError``."""
    path = resolve_workload(name_or_path)
    label = path.name if "/" not in str(name_or_path) and path.parent == data_dir("workloads") else str(name_or_path)
    return validate_workload(read_yaml(path, label), label, overrides)


__all__ = ["ACTIVATIONS", "ATTENTIONS", "DTYPES", "NORMS", "OVERRIDES", "PHASES", "ModelSpec", "Op", "Scenario",
           "Workload", "builtin_workloads", "load_workload", "resolve_workload", "validate_workload"]
