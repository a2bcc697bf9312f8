"""One decoder block as an op graph: the operations, their tensors and how much math each does.

The block is pre-norm (GPT-2 / LLaMA style), without biases (LLaMA has none; GPT-2's biases are
left out everywhere, as the seed's FLOP table does)::

    x -> norm1 -> qkv GEMM -> attention -> proj GEMM -> res1 (+ x) = x_mid
      -> norm2 -> ffn1 GEMM -> activation -> ffn2 GEMM -> res2 (+ x_mid) = y

Tensors (row-major; T tokens = batch x seq, or batch in decode):

=================  ====================  ==================================================
name               shape                 meaning
=================  ====================  ==================================================
x, y, x_mid        [T, h]                block input, output, stream after the first residual
x_n1, x_n2         [T, h]                normalised inputs of attention / FFN
qkv                [T, 3h]               Q cols 0..h-1, K h..2h-1, V 2h..3h-1; head i of each
                                         at cols i*d .. i*d+d-1 of its third
attn_out           [T, h]                heads concatenated (head i at cols i*d ..)
proj_out           [T, h]
ffn1_out           [T, f] or [T, 2f]     swiglu: gate cols 0..f-1, up cols f..2f-1
act_out            [T, f]
ffn2_out           [T, h]
w_qkv [h, 3h], w_proj [h, h], w_ffn1 [h, f | 2f], w_ffn2 [f, h]   weights, W as [K, N]
norm1_gamma, norm1_beta, norm2_gamma, norm2_beta [h]   (beta only for layernorm)
k_cache, v_cache   [b, kv_len, h]        decode: the KV cache (heads as in qkv's K / V thirds)
attn_lse           [b, n, s]             train, fused: per-row natural log-sum-exp of the scaled,
                                         masked scores (what the backward recomputes P from)
attn_probs         [b, n, s, s]          train, unfused: the softmax matrix, zeros where masked
gate_logits        [T, E]                mixture of experts (model.moe, E experts, top k, C
route_e, route_w   [T, k]                slots an expert): the gate's scores; each token's
route_slot         [T, k]                experts (int32) and their probabilities (f32); its
slot_token         [E C]                 slots (e C + position, -1: dropped); each slot's token
expert_in          [E C, h]              (-1: empty); the slots' rows of x_n2; the experts'
expert_h, expert_a [E C, f1], [E C, f]   FFN, batched; their outputs, which ``combine``
expert_out         [E C, h]              weighs into ffn2_out
w_gate [h, E], w_expert1 [E, h, f1], w_expert2 [E, f, h]   the router's and experts' weights
d_<name>           as <name>             the gradient of the loss with respect to <name>
                                         (d_qkv in qkv's layout; d_norm*_gamma/beta summed over rows)
d_x_part           [T, h]                norm1.grad's output: the part of d_x through norm1
d_x_mid_part       [T, h]                norm2.grad's output: the part of d_x_mid through norm2
=================  ====================  ==================================================

Decode: the cache holds the ``seq`` earlier tokens; the new token's K and V (its row of qkv, cols
h..3h-1) are stored at cache row ``seq`` before attention runs (in a server the QKV epilogue
writes them there), so ``attn`` reads kv_len = seq + 1 rows and the new token attends to every
earlier token and to itself. Its query sits at position kv_len - 1, so a causal mask hides
nothing.

Norm grads take (input, gamma, d_output) and give (d_input part, d_gamma[, d_beta]); activation
grads take (ffn1_out, d_act_out) and give d_ffn1_out (swiglu: [T, 2f], d_gate then d_up).
``Op.dtype`` is the scenario's (the storage type of activations and weights; accumulation
precision is the emitters' choice).

Causal masking in general: query i of q_len (0-based) sits at position kv_len - q_len + i and
sees keys 0 .. kv_len - q_len + i.

Train = the forward ops, then the backward ops in reverse order. Per weight GEMM Y = X @ W (W as
[K, N]) the backward has ``<name>.dgrad`` dX = dY @ W^T (trans_b) and ``<name>.wgrad`` dW = X^T @
dY (trans_a). Residuals fan a gradient out unchanged, so ``res1.grad`` / ``res2.grad`` are the adds
where the two paths' gradients meet (dx = d_x_part + d_x_mid, d_x_mid = d_y + d_x_mid_part).
Norm and activation gradients recompute what they need from their forward inputs (mean, rstd,
tanh, sigmoid) instead of storing it. ``attn.grad`` (fused, FlashAttention-2 style) recomputes the
scores from Q, K and the saved log-sum-exp; unfused reads the stored softmax matrix.

Dropout (training; ``model.attention_dropout`` and ``hidden_dropout``, Megatron-LM's): unfused
``attn`` drops its probabilities into attn_drop [b, n, s, s], which P V reads, keeping attn_mask
(u8, a byte an element); ``res1`` / ``res2`` become dropout-adds (y = residual + dropout(x), masks
res1_mask / res2_mask [T, h]). Backward, ``res2.dropout.grad`` and ``res1.dropout.grad`` drop d_y
and d_x_mid into d_ffn2_out and d_proj_out (the GEMM grads' dY), and ``attn.grad`` reads
attn_drop for dV and drops dP through attn_mask before the softmax's gradient. A dropout kernel's
flops are ``ELEMENTWISE_FLOPS`` per element of its whole tensor (masked scores included).

``flops`` counts the math the kernels execute:

- GEMM: 2 M N K.
- attention: per (batch, head) and per *unmasked* score element (every element when not causal;
  when causal, exactly the elements at or below the shifted diagonal, counted element by element
  rather than by tile, so a partly masked tile counts only its unmasked part): 2 d for QK^T, 2 d
  for PV, and ``ELEMENTWISE_FLOPS["softmax"]`` for the softmax.
- attention_grad: per unmasked element, matmuls 2 d each: fused 7 (FlashAttention-2's backward as
  the GPU emits it, with no atomics for dQ: the key-block kernel recomputes S = QK^T and dP = dO
  V^T and forms dV = P^T dO, dK = dS^T Q; the query-block kernel recomputes S and dP again and
  forms dQ = dS K), unfused 4 (P is read back); elementwise: fused 8 (P = exp(S - lse): 2 and
  dS = P (dP - D): 2, in each of the two kernels) plus D = rowsum(dO o O) at 2 d per query row;
  unfused 4 (P o dP, its row sum, subtract, multiply).
- elementwise ops: ``ELEMENTWISE_FLOPS[kind]`` per element of [rows, cols].

``model_flops`` is the seed's textbook count: 2 T K N per weight GEMM (dgrad and wgrad each equal
their forward GEMM, so backward = 2 x forward); attention 2 b q_len kv_len h per matmul, two
matmuls, over the full q_len x kv_len even when causal (prefill / train: 4 b s^2 h; decode:
4 b kv_len h); attention_grad twice the forward; elementwise ops 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:                                   # pragma: no cover
    from .model import Workload

# Flops per element, with what each counts (an FMA is 2, a transcendental is 1).
ELEMENTWISE_FLOPS = {
    "add": 1,               # a + b
    "relu": 1,              # max(x, 0)
    "layernorm": 7,         # sum x, x - mean, square, sum of squares, * rstd, * gamma, + beta
    "rmsnorm": 4,           # square, sum of squares, * rstd, * gamma
    "gelu": 9,              # x^2 1, fma(0.044715, x^2, 1) 2, * x 1, * sqrt(2/pi) 1, tanh 1,
                            # 0.5 x 1, fma(0.5x, t, 0.5x) 2
    "swiglu": 5,            # per output element: exp(-g) 1, 1 + 1, reciprocal 1, * g 1, * up 1
    "softmax": 5,           # max, subtract (the 1/sqrt(d) scale folded into it), exp, sum, * 1/sum
    "relu_grad": 1,         # select
    "layernorm_grad": 16,   # recompute mean/rstd/xhat 5, dxhat = dy*gamma 1, dgamma += dy*xhat 2,
                            # dbeta += dy 1, sums of dxhat and dxhat*xhat 3,
                            # dx = rstd (dxhat - m1 - xhat m2) 4
    "rmsnorm_grad": 11,     # recompute rstd/xhat 3, dxhat 1, dgamma += dy*xhat 2, sum dxhat*xhat 2,
                            # dx = rstd (dxhat - xhat m) 3
    "gelu_grad": 18,        # recompute inner and tanh 6; dt = (1 - t^2) c (1 + 3*0.044715 x^2):
                            # t^2 1, 1 - t^2 1, fma 2, two products 2; gelu' = 0.5 (1 + t) 2
                            # + 0.5 x dt (0.5 x 1, fma 2); * dy 1
    "swiglu_grad": 11,      # recompute sigmoid 3, silu 1, d_up = dy*silu 1,
                            # d_gate = dy*up*s*(1 + g (1 - s)) 6
    "dropout": 1,           # x * scale where kept (the mask's hash is integer work)
    "dropout_add": 2,       # a + x * scale
    "dropout_grad": 1,      # dy * scale where kept
}

GEMM_NAMES = ("qkv", "proj", "ffn1", "ffn2")
KINDS = ("gemm", "attention", "attention_grad", "layernorm", "rmsnorm", "gelu", "relu", "swiglu",
         "add", "layernorm_grad", "rmsnorm_grad", "gelu_grad", "relu_grad", "swiglu_grad", "dropout_add",
         "dropout_grad")


@dataclass(frozen=True)
class Op:
    """One operation of the block (see the module docstring for names, layouts and counts).

    ``dims`` by kind: gemm {M, N, K, trans_a, trans_b} (C[M,N] = op(A) @ op(B), A and B being
    ``inputs[0]`` and ``inputs[1]`` as stored); attention / attention_grad {batch, heads, q_len,
    kv_len, head_dim, causal, fused}; norms, activations, add {rows, cols} (swiglu and
    swiglu_grad: cols = f, the width of the activation's output)."""

    name: str
    kind: str
    dims: dict
    dtype: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int
    model_flops: int

    def __hash__(self):                              # dims is a dict: hash its items
        return hash((self.name, self.kind, tuple(sorted(self.dims.items())), self.dtype, self.inputs,
                     self.outputs, self.flops, self.model_flops))


def unmasked_scores(q_len: int, kv_len: int, causal: bool) -> int:
    """Score elements of one (batch, head) that a causal mask leaves (all when not causal).
    Query i sits at position kv_len - q_len + i and sees keys 0 .. kv_len - q_len + i."""
    if not causal:
        return q_len * kv_len
    off = kv_len - q_len                             # >= 0: queries are the last q_len positions
    return q_len * (off + 1) + q_len * (q_len - 1) // 2


@dataclass
class _Builder:
    dtype: str
    ops: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)

    def tensor(self, name: str, shape: tuple) -> str:
        old = self.shapes.setdefault(name, tuple(int(v) for v in shape))
        assert old == tuple(shape), (name, old, shape)
        return name

    def add(self, name, kind, dims, inputs, outputs, flops, model_flops):
        self.ops.append(Op(name, kind, dict(dims), self.dtype, tuple(inputs), tuple(outputs), int(flops),
                           int(model_flops)))

    def gemm(self, name, a, b, c, M, N, K, trans_a=False, trans_b=False, model=True):
        f = 2 * M * N * K
        self.add(name, "gemm", dict(M=M, N=N, K=K, trans_a=trans_a, trans_b=trans_b), (a, b), (c,), f,
                 f if model else 0)

    def eltwise(self, name, kind, rows, cols, inputs, outputs):
        self.add(name, kind, dict(rows=rows, cols=cols), inputs, outputs, ELEMENTWISE_FLOPS[kind] * rows * cols, 0)


# Where a tensor-parallel shard's partial sums meet (Megatron): after these ops the group all-reduces
# the named tensor. Forward: the projection's and FFN-out's outputs, which the next op needs at
# once; backward: the input gradients of QKV and FFN-in, which the weight gradient's GEMM (the op
# after) does not read, so the all-reduce runs beside it.
TP_ALL_REDUCE_AFTER = {"proj": ("proj_out", False), "ffn2": ("ffn2_out", False),
                       "ffn1.dgrad": ("d_x_n2", True), "qkv.dgrad": ("d_x_n1", True)}

# Megatron-LM's sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation
# in Large Transformer Models"): outside the tensor-parallel GEMMs the tokens are split over the
# group, so each all-reduce becomes an all-gather of the normalised input before a column-parallel
# GEMM (QKV, FFN-in) and a reduce-scatter of a row-parallel GEMM's output (projection, FFN-out). In
# backward: the output gradient gathered before a row-parallel GEMM's dgrad; the column-parallel
# GEMM's input gathered again beside its dgrad (its weight gradient reads it) and its input
# gradient reduce-scattered beside the weight gradient, as Megatron-LM overlaps them.
# (op, "before" | "after", collective, tensor (its whole [T, h]), runs beside the next kernel)
SP_COLLECTIVES = (("qkv", "before", "all_gather", "x_n1", False),
                  ("proj", "after", "reduce_scatter", "proj_out", False),
                  ("ffn1", "before", "all_gather", "x_n2", False),
                  ("ffn2", "after", "reduce_scatter", "ffn2_out", False),
                  ("ffn2.dgrad", "before", "all_gather", "d_y", False),
                  ("ffn1.dgrad", "before", "all_gather", "x_n2", True),
                  ("ffn1.dgrad", "after", "reduce_scatter", "d_x_n2", True),
                  ("proj.dgrad", "before", "all_gather", "d_x_mid", False),
                  ("qkv.dgrad", "before", "all_gather", "x_n1", True),
                  ("qkv.dgrad", "after", "reduce_scatter", "d_x_n1", True))
# Expert parallelism (GShard, DeepSpeed-MoE): the group exchanges the slot buffers by all-to-all
# after these ops (forward: the dispatched tokens to their experts, the experts' outputs back;
# backward: the outputs' gradients to the experts, the inputs' gradients back). (op, tensor)
EP_ALL_TO_ALL = (("dispatch", "expert_in"), ("expert2", "expert_out"), ("combine.grad", "d_expert_out"),
                 ("expert1.dgrad", "d_expert_in"))
# the ops that sequence parallelism runs on the device's 1/tp of the tokens
SP_TOKEN_OPS = ("norm1", "res1", "norm2", "res2", "res2.dropout.grad", "norm2.grad", "res2.grad", "res1.dropout.grad",
                "norm1.grad", "res1.grad")
# dropout's seeds (its mask hashes the element's index with the op's seed)
DROPOUT_SEEDS = {"attn": 1, "res1": 2, "res2": 3}


def _moe_sizes(m, T: int, ep: int) -> tuple:
    """(experts E, top_k, capacity C a expert, slots S = E C, the device's experts E / ep, each over
    the expert-parallel group's slots ep C) of model.moe for T tokens a device."""
    E, k = m.moe.experts, m.moe.top_k
    C = m.moe.capacity(T)
    return E, k, C, E * C, E // ep, C * ep


def _moe_ffn(B: _Builder, m, T: int, h: int, f: int, f1: int, ep: int = 1) -> None:
    """The mixture-of-experts FFN (model.moe), GShard-style with a fixed capacity C a expert:

    - ``gate``: gate_logits [T, E] = x_n2 @ w_gate [h, E];
    - ``route``: per token the softmax over the experts and its top_k (route_e [T, k], int32;
      route_w [T, k], f32: the chosen experts' probabilities), then each expert's slots filled in
      priority order (every token's first choice before any second choice, tokens in order):
      route_slot [T, k] = e * C + position, or -1 when the expert is full (the choice is dropped);
      slot_token [E C] = the token in each slot, or -1;
    - ``dispatch``: expert_in [E C, h], each slot's token's row of x_n2 (zeros for an empty slot);
    - ``expert1``, ``expert_act``, ``expert2``: every expert's FFN over its C slots, batched over the
      experts (w_expert1 [E, h, f1], w_expert2 [E, f, h]) into expert_out [E C, h];
    - ``combine``: ffn2_out [T, h] = sum over a token's kept choices of route_w x its slot's row.

    Expert parallelism over ``ep`` devices: a device holds E / ep experts; the group's all-to-all
    (EP_ALL_TO_ALL, outside the op graph) brings it the slots of its experts from every device, so
    its expert GEMMs run E / ep experts over ep x C slots each (the same rows in all).

    flops count the padded slots the kernels compute; model_flops the T x top_k routed tokens."""
    t = B.tensor
    E, k, C, S, El, Cg = _moe_sizes(m, T, ep)
    B.gemm("gate", "x_n2", t("w_gate", (h, E)), t("gate_logits", (T, E)), T, E, h)
    B.add("route", "moe_route", dict(tokens=T, experts=E, top_k=k, capacity=C), ["gate_logits"],
          [t("route_e", (T, k)), t("route_w", (T, k)), t("route_slot", (T, k)), t("slot_token", (S,))],
          ELEMENTWISE_FLOPS["softmax"] * T * E, 0)
    B.add("dispatch", "moe_dispatch", dict(tokens=T, hidden=h, slots=S), ["x_n2", "slot_token"],
          [t("expert_in", (S, h))], 0, 0)
    _moe_gemm(B, "expert1", "expert_in", t("w_expert1", (El, h, f1)), t("expert_h", (S, f1)), El, Cg, f1, h,
              model_flops=2 * T * k * f1 * h)
    B.eltwise("expert_act", m.activation, S, f, ["expert_h"], [t("expert_a", (S, f))])
    _moe_gemm(B, "expert2", "expert_a", t("w_expert2", (El, f, h)), t("expert_out", (S, h)), El, Cg, h, f,
              model_flops=2 * T * k * h * f)
    B.add("combine", "moe_combine", dict(tokens=T, hidden=h, top_k=k, slots=S),
          ["expert_out", "route_slot", "route_w"], [t("ffn2_out", (T, h))], 2 * T * k * h, 0)


def _moe_gemm(B: _Builder, name, a, b, c, E, M, N, K, trans_a=False, trans_b=False, model_flops=0):
    """C[e] = op(A[e]) @ op(B[e]) for each expert e (moe_gemm: batched over the experts); C is
    [E, M, N] (a weight gradient: ``stacked``) or the experts' rows one after another [E M, N]."""
    stacked = len(B.shapes[c]) == 3
    B.add(name, "moe_gemm", dict(experts=E, M=M, N=N, K=K, trans_a=trans_a, trans_b=trans_b, stacked=stacked),
          [a, b], [c], 2 * E * M * N * K, model_flops)


def _moe_ffn_grad(B: _Builder, m, T: int, h: int, f: int, ep: int = 1, dy: str = "d_y") -> None:
    """The mixture-of-experts FFN's backward from ``dy`` (the gradient of ffn2_out: d_y, or
    d_ffn2_out under hidden dropout):

    - ``combine.grad``: d_route_w [T, k] (a kept choice: its slot's row of expert_out . d_y[t]) and
      d_expert_out [E C, h] (a slot: its choice's weight x d_y of its token; zeros when empty);
    - each expert's FFN backward, batched over the experts (``expert2.dgrad`` / ``.wgrad``,
      ``expert_act.grad``, ``expert1.dgrad`` / ``.wgrad``);
    - ``dispatch.grad``: d_x_n2_experts [T, h], the sum of the token's slots' rows of d_expert_in;
    - ``route.grad``: d_gate_logits [T, E] through the softmax (only the chosen probabilities
      carry a gradient; the top-k choice itself has none);
    - ``gate.dgrad`` / ``gate.wgrad``, and ``moe_in.grad`` adding the two paths into d_x_n2."""
    t = B.tensor
    E, k, C, S, El, Cg = _moe_sizes(m, T, ep)
    f1 = B.shapes["expert_h"][1]

    def grad(name):
        return t("d_" + name, B.shapes[name])

    B.add("combine.grad", "moe_combine_grad", dict(tokens=T, hidden=h, top_k=k, slots=S),
          [dy, "expert_out", "route_slot", "route_w", "slot_token"], [grad("route_w"), grad("expert_out")],
          2 * T * k * h + S * h, 0)
    _moe_gemm(B, "expert2.dgrad", "d_expert_out", "w_expert2", grad("expert_a"), El, Cg, f, h, trans_b=True,
              model_flops=2 * T * k * h * f)
    _moe_gemm(B, "expert2.wgrad", "expert_a", "d_expert_out", grad("w_expert2"), El, f, h, Cg, trans_a=True,
              model_flops=2 * T * k * h * f)
    B.eltwise("expert_act.grad", m.activation + "_grad", S, f, ["expert_h", "d_expert_a"], [grad("expert_h")])
    _moe_gemm(B, "expert1.dgrad", "d_expert_h", "w_expert1", grad("expert_in"), El, Cg, h, f1, trans_b=True,
              model_flops=2 * T * k * h * f1)
    _moe_gemm(B, "expert1.wgrad", "expert_in", "d_expert_h", grad("w_expert1"), El, h, f1, Cg, trans_a=True,
              model_flops=2 * T * k * h * f1)
    B.add("dispatch.grad", "moe_dispatch_grad", dict(tokens=T, hidden=h, top_k=k, slots=S),
          ["d_expert_in", "route_slot"], [t("d_x_n2_experts", (T, h))], T * k * h, 0)
    B.add("route.grad", "moe_route_grad", dict(tokens=T, experts=E, top_k=k),
          ["gate_logits", "route_e", "d_route_w"], [grad("gate_logits")], 4 * T * E, 0)
    B.gemm("gate.dgrad", "d_gate_logits", "w_gate", t("d_x_n2_gate", (T, h)), T, h, E, trans_b=True)
    B.gemm("gate.wgrad", "x_n2", "d_gate_logits", grad("w_gate"), h, E, T, trans_a=True)
    B.eltwise("moe_in.grad", "add", T, h, ["d_x_n2_experts", "d_x_n2_gate"], [t("d_x_n2", (T, h))])


def build_block(w: "Workload") -> tuple[list[Op], dict[str, tuple]]:
    """(ops in execution order, tensor name -> shape) of one decoder block of ``w``."""
    m, sc = w.model, w.scenario
    tp = sc.tensor_parallel
    # one device's shard: n heads of d (attention width a = n*d) and an FFN of width f; h stays whole
    b, h, n, d, f = sc.batch, m.hidden, m.heads // tp, m.head_dim, m.ffn_hidden // tp
    a = n * d
    decode = sc.phase == "decode"
    train = sc.phase == "train"
    q_len = 1 if decode else sc.seq
    kv_len = sc.seq + 1 if decode else sc.seq
    T = b * q_len
    swiglu = m.activation == "swiglu"
    f1 = 2 * f if swiglu else f                      # ffn1's output width
    fused = sc.attention == "fused"
    layernorm = m.norm == "layernorm"
    # dropout in training only: attention's on its probabilities (unfused), hidden in the residual adds
    pa = m.attention_dropout if train else 0.0
    ph = m.hidden_dropout if train else 0.0
    B = _Builder(sc.dtype)
    t = B.tensor

    def norm_inputs(i, src):
        ins = [src, t(f"norm{i}_gamma", (h,))]
        if layernorm:
            ins.append(t(f"norm{i}_beta", (h,)))
        return ins

    # ---- forward ----
    t("x", (T, h))
    B.eltwise("norm1", m.norm, T, h, norm_inputs(1, "x"), [t("x_n1", (T, h))])
    B.gemm("qkv", "x_n1", t("w_qkv", (h, 3 * a)), t("qkv", (T, 3 * a)), T, 3 * a, h)
    adims = dict(batch=b, heads=n, q_len=q_len, kv_len=kv_len, head_dim=d, causal=sc.causal, fused=fused,
                 dropout=pa)
    cells = b * n * unmasked_scores(q_len, kv_len, sc.causal)
    drops = b * n * q_len * kv_len if pa else 0    # dropout runs over the whole probability matrix
    a_flops = cells * (2 * 2 * d + ELEMENTWISE_FLOPS["softmax"]) + drops * ELEMENTWISE_FLOPS["dropout"]
    a_model = 2 * 2 * b * q_len * kv_len * a
    a_in = ["qkv"]
    if decode:
        a_in += [t("k_cache", (b, kv_len, a)), t("v_cache", (b, kv_len, a))]
    a_out = [t("attn_out", (T, a))]
    if train:
        a_out.append(t("attn_lse", (b, n, sc.seq)) if fused else t("attn_probs", (b, n, sc.seq, sc.seq)))
        if pa:
            a_out += [t("attn_drop", (b, n, sc.seq, sc.seq)), t("attn_mask", (b, n, sc.seq, sc.seq))]
    B.add("attn", "attention", adims, a_in, a_out, a_flops, a_model)
    B.gemm("proj", "attn_out", t("w_proj", (a, h)), t("proj_out", (T, h)), T, h, a)

    def residual(name, a_, x_, out):
        if ph:                                       # Megatron-LM's bias-dropout-add (no bias)
            B.add(name, "dropout_add", dict(rows=T, cols=h, p=ph, seed=DROPOUT_SEEDS[name]), [a_, x_],
                  [t(out, (T, h)), t(f"{name}_mask", (T, h))], ELEMENTWISE_FLOPS["dropout_add"] * T * h, 0)
        else:
            B.eltwise(name, "add", T, h, [a_, x_], [t(out, (T, h))])

    residual("res1", "x", "proj_out", "x_mid")
    B.eltwise("norm2", m.norm, T, h, norm_inputs(2, "x_mid"), [t("x_n2", (T, h))])
    if m.moe is not None:
        _moe_ffn(B, m, T, h, f, f1, sc.expert_parallel)
    else:
        B.gemm("ffn1", "x_n2", t("w_ffn1", (h, f1)), t("ffn1_out", (T, f1)), T, f1, h)
        B.eltwise("act", m.activation, T, f, ["ffn1_out"], [t("act_out", (T, f))])
        B.gemm("ffn2", "act_out", t("w_ffn2", (f, h)), t("ffn2_out", (T, h)), T, h, f)
    residual("res2", "x_mid", "ffn2_out", "y")
    if not train:
        return B.ops, B.shapes

    # ---- backward (reverse order) ----
    def grad(name):
        return t("d_" + name, B.shapes[name])

    grad("y")

    def gemm_grads(name, x, wname, yname):
        (K, N) = B.shapes[wname]
        B.gemm(f"{name}.dgrad", "d_" + yname, wname, grad(x), T, K, N, trans_b=True)
        B.gemm(f"{name}.wgrad", x, "d_" + yname, grad(wname), K, N, T, trans_a=True)

    def norm_grad(i, src, part):
        ins = [src, f"norm{i}_gamma", f"d_x_n{i}"]
        outs = [t(part, (T, h)), grad(f"norm{i}_gamma")] + ([grad(f"norm{i}_beta")] if layernorm else [])
        B.eltwise(f"norm{i}.grad", m.norm + "_grad", T, h, ins, outs)

    def dropped(name, dy, x):
        """The gradient of x, dropped with the residual op's mask (or dy itself)."""
        if not ph:
            return dy[len("d_"):]
        B.add(f"{name}.dropout.grad", "dropout_grad", dict(rows=T, cols=h, p=ph), [dy, f"{name}_mask"], [grad(x)],
              ELEMENTWISE_FLOPS["dropout_grad"] * T * h, 0)
        return x

    d_ffn = dropped("res2", "d_y", "ffn2_out")
    if m.moe is not None:
        _moe_ffn_grad(B, m, T, h, f, sc.expert_parallel, "d_" + d_ffn)
    else:
        gemm_grads("ffn2", "act_out", "w_ffn2", d_ffn)
        B.eltwise("act.grad", m.activation + "_grad", T, f, ["ffn1_out", "d_act_out"], [grad("ffn1_out")])
        gemm_grads("ffn1", "x_n2", "w_ffn1", "ffn1_out")
    norm_grad(2, "x_mid", "d_x_mid_part")
    B.eltwise("res2.grad", "add", T, h, ["d_y", "d_x_mid_part"], [grad("x_mid")])
    gemm_grads("proj", "attn_out", "w_proj", dropped("res1", "d_x_mid", "proj_out"))
    g_in = ["qkv", "attn_out", "attn_lse", "d_attn_out"] if fused else \
        ["qkv", "attn_probs"] + (["attn_drop", "attn_mask"] if pa else []) + ["d_attn_out"]
    mm, ew = (7, 8) if fused else (4, 4)
    g_flops = cells * (mm * 2 * d + ew) + (b * n * q_len * 2 * d if fused else 0) + \
        drops * ELEMENTWISE_FLOPS["dropout_grad"]
    B.add("attn.grad", "attention_grad", adims, g_in, [grad("qkv")], g_flops, 2 * a_model)
    gemm_grads("qkv", "x_n1", "w_qkv", "qkv")
    norm_grad(1, "x", "d_x_part")
    B.eltwise("res1.grad", "add", T, h, ["d_x_mid", "d_x_part"], [grad("x")])
    return B.ops, B.shapes
