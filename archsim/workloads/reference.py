"""float64 numpy references: per op kind, one decoder block, and an executor of the op graph.

Emitters' tests import the per-kind references (``ref_layernorm``, ``ref_rmsnorm``, ``ref_gelu``,
``ref_swiglu``, ``ref_softmax``, ``ref_attention``, ``ref_gemm`` and the gradients). The block
level has two independent routes to the same numbers:

- ``reference_block(workload, weights, x)``: the block written out directly (prefill semantics:
  every token of every sequence at once, causal per the scenario);
- ``execute_ops(workload, tensors)``: runs ``workload.block_ops()`` op by op, each through its
  per-kind reference, reading and writing tensors by the op graph's names. This is what emitted
  kernels chained together must reproduce; it covers decode (KV cache) and train (backward) too.

Layouts are the op graph's (ops.py): activations [T, h] row-major with T = batch x tokens, the
sequences one after another; qkv [T, 3h] with Q, K, V thirds and head i at cols i*d of each
third; swiglu's ffn1 output [T, 2f] with gate cols 0..f-1 and up cols f..2f-1. Attention scales
scores by 1/sqrt(head_dim). GELU is the tanh approximation (GPT-2's gelu_new, BLOOM's
bloom_gelu), not the erf form.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:                                   # pragma: no cover
    from .model import Workload

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


# ---- per op kind ------------------------------------------------------------------------------

def ref_gemm(a, b, trans_a: bool = False, trans_b: bool = False) -> np.ndarray:
    """C = op(A) @ op(B) in float64 (op = transpose when the flag is set)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a.T if trans_a else a) @ (b.T if trans_b else b)


def ref_add(a, b) -> np.ndarray:
    return np.asarray(a, np.float64) + np.asarray(b, np.float64)


def ref_softmax(x, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, max-subtracted; rows that are entirely -inf give zeros."""
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def ref_layernorm(x, g, b, eps: float = 1e-5) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * g + b over the last axis (biased variance)."""
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * np.asarray(g, np.float64) + np.asarray(b, np.float64)


def ref_rmsnorm(x, g, eps: float = 1e-5) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * g over the last axis."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(g, np.float64)


def ref_gelu(x) -> np.ndarray:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + _GELU_A * x ** 3)))


def ref_relu(x) -> np.ndarray:
    return np.maximum(np.asarray(x, np.float64), 0.0)


def ref_swiglu(gate, up) -> np.ndarray:
    """silu(gate) * up = gate * sigmoid(gate) * up."""
    g = np.asarray(gate, np.float64)
    return g / (1.0 + np.exp(-g)) * np.asarray(up, np.float64)


def causal_mask(q_len: int, kv_len: int) -> np.ndarray:
    """[q_len, kv_len] booleans, True where query i (at position kv_len - q_len + i) sees key j."""
    pos = np.arange(q_len)[:, None] + (kv_len - q_len)
    return np.arange(kv_len)[None, :] <= pos


def _scores(q, k, causal: bool, scale: float) -> np.ndarray:
    s = np.einsum("...id,...jd->...ij", q, k) * scale
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    return s


def ref_attention(q, k, v, causal: bool, scale: Optional[float] = None, return_lse: bool = False):
    """softmax(q k^T * scale, masked) @ v over the last two axes: q [..., Lq, d], k and v
    [..., Lk, d] (e.g. [batch, heads, L, d]). Causal aligns the queries with the last Lq keys.
    ``scale`` defaults to 1/sqrt(d). With ``return_lse``: (out, log-sum-exp of each row's scaled
    scores [..., Lq])."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = _scores(q, k, causal, scale)
    p = ref_softmax(s)
    out = p @ v
    if not return_lse:
        return out
    m = s.max(-1)
    return out, m + np.log(np.exp(s - m[..., None]).sum(-1))


def ref_attention_probs(q, k, causal: bool, scale: Optional[float] = None) -> np.ndarray:
    """The softmax matrix [..., Lq, Lk] (zeros where masked): what unfused attention stores."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return ref_softmax(_scores(q, k, causal, scale))


# ---- gradients (each checked against finite differences in tests/test_workloads.py) -----------

def ref_layernorm_grad(x, g, dy, eps: float = 1e-5):
    """(dx, dgamma, dbeta) of ref_layernorm; dgamma and dbeta summed over rows."""
    x, g, dy = (np.asarray(t, np.float64) for t in (x, g, dy))
    mu = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xh = (x - mu) * rstd
    dxh = dy * g
    dx = rstd * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return dx, (dy * xh).sum(rows), dy.sum(rows)


def ref_rmsnorm_grad(x, g, dy, eps: float = 1e-5):
    """(dx, dgamma) of ref_rmsnorm; dgamma summed over rows."""
    x, g, dy = (np.asarray(t, np.float64) for t in (x, g, dy))
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xh = x * rstd
    dxh = dy * g
    dx = rstd * (dxh - xh * (dxh * xh).mean(-1, keepdims=True))
    return dx, (dy * xh).sum(tuple(range(x.ndim - 1)))


def ref_gelu_grad(x, dy) -> np.ndarray:
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    t = np.tanh(_GELU_C * (x + _GELU_A * x ** 3))
    dt = (1.0 - t * t) * _GELU_C * (1.0 + 3.0 * _GELU_A * x * x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * dt)


def ref_relu_grad(x, dy) -> np.ndarray:
    return np.where(np.asarray(x) > 0, np.asarray(dy, np.float64), 0.0)


def ref_swiglu_grad(gate, up, dy):
    """(dgate, dup) of ref_swiglu."""
    g, u, dy = (np.asarray(t, np.float64) for t in (gate, up, dy))
    s = 1.0 / (1.0 + np.exp(-g))
    return dy * u * s * (1.0 + g * (1.0 - s)), dy * g * s


def ref_attention_grad(q, k, v, dout, causal: bool, scale: Optional[float] = None, probs=None, dropout=None):
    """(dq, dk, dv) of ref_attention. ``probs`` (the stored softmax matrix) is used when given,
    otherwise it is recomputed from q and k. ``dropout``: (dropped probabilities, mask, p) when
    P V read the dropped matrix: dV from it, and dP through the mask."""
    q, k, v, do = (np.asarray(t, np.float64) for t in (q, k, v, dout))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = ref_attention_probs(q, k, causal, scale) if probs is None else np.asarray(probs, np.float64)
    dv = np.swapaxes(p if dropout is None else np.asarray(dropout[0], np.float64), -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    if dropout is not None:
        dp = ref_dropout_grad(dp, dropout[1], dropout[2])
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv


# ---- dropout ----------------------------------------------------------------------------------
# Which elements dropout keeps: a counter-based hash of (element index + seed), a 32-bit
# multiply-xorshift finalizer, kept when it is at least p 2^32. The kernels compute the same in
# integer registers; it stands in for PyTorch's Philox generator (another mask, the same bytes).
HASH_MUL = (0x9E3779B1, 0x85EBCA6B)
HASH_SHIFT = (16, 13)
M32 = 0xFFFFFFFF


def dropout_keep(n: int, p: float, seed: int, start: int = 0) -> np.ndarray:
    """The mask of elements start .. start + n - 1 (flat, row-major): True where kept."""
    thresh = int(round(float(p) * 2.0 ** 32))
    h = (np.arange(start, start + n, dtype=np.uint64) + np.uint64(seed)) & np.uint64(M32)
    for mul, sh in zip(HASH_MUL, HASH_SHIFT):
        h = (h * np.uint64(mul)) & np.uint64(M32)
        h ^= h >> np.uint64(sh)
    return h >= np.uint64(thresh)


def dropout_scale(p: float) -> float:
    """1 / (1 - p) as the kernels hold it (an f32)."""
    return float(np.float32(1.0 / (1.0 - float(p))))


def ref_dropout(x, p: float, seed: int):
    """(x scaled where kept and 0 elsewhere, the mask as 0 / 1)."""
    x = np.asarray(x, np.float64)
    keep = dropout_keep(x.size, p, seed).reshape(x.shape)
    return np.where(keep, x * dropout_scale(p), 0.0), keep.astype(np.float64)


def ref_dropout_grad(dy, mask, p: float):
    return np.where(np.asarray(mask) != 0, np.asarray(dy, np.float64) * dropout_scale(p), 0.0)


# ---- layouts ----------------------------------------------------------------------------------

def ref_moe_route(logits, top_k: int, capacity: int):
    """GShard-style routing of ``logits`` [T, E]: per token the softmax over the experts and its
    top_k by logit (ties to the lower expert), as (route_e [T, k], route_w [T, k]: the chosen
    probabilities); then each expert's ``capacity`` slots filled in priority order, every token's
    j-th choice before any (j+1)-th, tokens in order: route_slot [T, k] = e * capacity + position
    or -1 (dropped), slot_token [E * capacity] = token or -1. Returns the four arrays (float64)."""
    z = np.asarray(logits, np.float64)
    probs = ref_softmax(z, axis=1)
    order = np.argsort(-z, axis=1, kind="stable")[:, :top_k]     # descending, ties to the lower index
    route_w = np.take_along_axis(probs, order, axis=1)
    slot, token = ref_moe_assign(order, z.shape[1], capacity)
    return order.astype(np.float64), route_w, slot, token


def ref_moe_assign(route_e, experts: int, capacity: int):
    """(route_slot [T, k], slot_token [experts * capacity]) of the choices route_e [T, k]: each
    expert's slots filled in priority order, every token's j-th choice before any (j+1)-th, tokens
    in order; a choice past its expert's capacity is dropped (-1), an empty slot holds -1."""
    e_of = np.asarray(route_e).astype(np.int64)
    T, k = e_of.shape
    slot = np.full((T, k), -1, np.int64)
    token = np.full(experts * capacity, -1, np.int64)
    filled = np.zeros(experts, np.int64)
    for j in range(k):
        for t in range(T):
            e = e_of[t, j]
            if filled[e] < capacity:
                slot[t, j] = e * capacity + filled[e]
                token[slot[t, j]] = t
            filled[e] += 1
    return slot.astype(np.float64), token.astype(np.float64)


def ref_moe_route_kept(logits, routing: dict):
    """ref_moe_route's four outputs with the discrete choices taken from ``routing`` (route_e,
    route_slot, slot_token, as kernels made them) and the weights recomputed from the logits."""
    route_e, route_slot, slot_token = (np.asarray(routing[n], np.float64)
                                       for n in ("route_e", "route_slot", "slot_token"))
    route_w = np.take_along_axis(ref_softmax(logits, axis=1), route_e.astype(np.int64), axis=1)
    return route_e, route_w, route_slot, slot_token


def ref_moe_dispatch(x, slot_token) -> np.ndarray:
    """[slots, h]: each slot's token's row of x, zeros for an empty slot (token -1)."""
    x = np.asarray(x, np.float64)
    tok = np.asarray(slot_token).astype(np.int64).reshape(-1)
    out = np.zeros((tok.size, x.shape[1]))
    out[tok >= 0] = x[tok[tok >= 0]]
    return out


def ref_moe_gemm(a, b, experts: int, trans_a: bool = False, trans_b: bool = False,
                 stacked: bool = False) -> np.ndarray:
    """op(A[e]) @ op(B[e]) for each of ``experts``: a and b hold the experts' matrices one after
    another ([E rows, cols] or [E, rows, cols]). The result is [E, M, N] when ``stacked``, else the
    experts' rows one after another [E M, N]."""
    A = np.asarray(a, np.float64)
    Bm = np.asarray(b, np.float64)
    A = A.reshape(experts, -1, A.shape[-1])
    Bm = Bm.reshape(experts, -1, Bm.shape[-1])
    out = np.matmul(A.transpose(0, 2, 1) if trans_a else A, Bm.transpose(0, 2, 1) if trans_b else Bm)
    return out if stacked else out.reshape(-1, out.shape[-1])


def ref_moe_combine_grad(d_y, expert_out, route_slot, route_w, slot_token):
    """(d_route_w [T, k], d_expert_out [slots, h]) of combine: a kept choice's weight gradient is its
    slot's row of expert_out . d_y[t]; a slot's gradient is its choice's weight x d_y[t] (zeros
    when empty)."""
    dy = np.asarray(d_y, np.float64)
    eo = np.asarray(expert_out, np.float64)
    slot = np.asarray(route_slot).astype(np.int64)
    w = np.asarray(route_w, np.float64)
    kept = slot >= 0
    d_w = np.where(kept, np.einsum("th,tkh->tk", dy, eo[np.maximum(slot, 0)]), 0.0)
    d_eo = np.zeros_like(eo)
    t_idx, j_idx = np.nonzero(kept)
    d_eo[slot[t_idx, j_idx]] = w[t_idx, j_idx, None] * dy[t_idx]
    return d_w, d_eo


def ref_moe_route_grad(logits, route_e, d_route_w) -> np.ndarray:
    """d_logits [T, E]: the chosen probabilities' gradient g (scattered to their experts) through the
    softmax, p (g - p . g)."""
    p = ref_softmax(logits, axis=1)
    e = np.asarray(route_e).astype(np.int64)
    g = np.zeros_like(p)
    np.add.at(g, (np.arange(p.shape[0])[:, None].repeat(e.shape[1], 1), e), np.asarray(d_route_w, np.float64))
    return p * (g - (p * g).sum(axis=1, keepdims=True))


def ref_moe_combine(expert_out, route_slot, route_w) -> np.ndarray:
    """[T, h]: the sum over a token's kept choices (slot >= 0) of its weight times its slot's row."""
    eo = np.asarray(expert_out, np.float64)
    slot = np.asarray(route_slot).astype(np.int64)
    w = np.where(slot >= 0, np.asarray(route_w, np.float64), 0.0)
    return np.einsum("tk,tkh->th", w, eo[np.maximum(slot, 0)])


def moe_ffn(workload: "Workload", x_n2, weights: dict, tensors: Optional[dict] = None,
            routing: Optional[dict] = None) -> np.ndarray:
    """The mixture-of-experts FFN of model.moe on x_n2 [T, h] (ops._moe_ffn's steps). ``routing``
    (route_e, route_slot, slot_token): the discrete choices to use instead of computing them (a
    check of kernels whose rounded logits may choose otherwise than float64 would)."""
    m = workload.model
    C = m.moe.capacity(x_n2.shape[0])
    logits = np.asarray(x_n2, np.float64) @ weights["w_gate"]
    route_e, route_w, route_slot, slot_token = ref_moe_route(logits, m.moe.top_k, C) if routing is None else \
        ref_moe_route_kept(logits, routing)
    expert_in = ref_moe_dispatch(x_n2, slot_token)
    E = m.moe.experts // workload.scenario.expert_parallel     # a shard's experts, each over ep x C slots
    expert_h = ref_moe_gemm(expert_in, weights["w_expert1"], E)
    expert_a = _activation(m.activation, expert_h, m.ffn_hidden)
    expert_out = ref_moe_gemm(expert_a, weights["w_expert2"], E)
    out = ref_moe_combine(expert_out, route_slot, route_w)
    if tensors is not None:
        tensors.update(gate_logits=logits, route_e=route_e, route_w=route_w, route_slot=route_slot,
                       slot_token=slot_token, expert_in=expert_in, expert_h=expert_h, expert_a=expert_a,
                       expert_out=expert_out)
    return out


def split_heads(t, batch: int, heads: int) -> np.ndarray:
    """[batch*L, heads*d] (sequences one after another) -> [batch, heads, L, d]."""
    t = np.asarray(t)
    rows, cols = t.shape
    return t.reshape(batch, rows // batch, heads, cols // heads).transpose(0, 2, 1, 3)


def merge_heads(t) -> np.ndarray:
    """[batch, heads, L, d] -> [batch*L, heads*d]."""
    b, n, L, d = t.shape
    return np.ascontiguousarray(t.transpose(0, 2, 1, 3)).reshape(b * L, n * d)


# ---- one block --------------------------------------------------------------------------------

def random_weights(workload: "Workload", seed: int = 0) -> dict[str, np.ndarray]:
    """float64 weights of one block, named as in the op graph: w_qkv [h, 3h], w_proj [h, h],
    w_ffn1 [h, f] (swiglu [h, 2f]), w_ffn2 [f, h] drawn N(0, 1/K) so activations stay O(1);
    norm gammas 1 + N(0, 0.1^2), betas N(0, 0.1^2) (layernorm only)."""
    m = workload.model
    tp = workload.scenario.tensor_parallel
    h, a, f = m.hidden, m.hidden // tp, m.ffn_hidden // tp      # a tensor-parallel shard's widths
    f1 = 2 * f if m.activation == "swiglu" else f
    rng = np.random.default_rng(seed)
    w = {}
    for name, (K, N) in (("w_qkv", (h, 3 * a)), ("w_proj", (a, h)), ("w_ffn1", (h, f1)), ("w_ffn2", (f, h))):
        w[name] = rng.standard_normal((K, N)) / math.sqrt(K)
    if m.moe is not None:
        E = m.moe.experts // workload.scenario.expert_parallel      # an expert-parallel shard's experts
        w["w_gate"] = rng.standard_normal((h, m.moe.experts)) / math.sqrt(h)
        w["w_expert1"] = rng.standard_normal((E, h, f1)) / math.sqrt(h)
        w["w_expert2"] = rng.standard_normal((E, f, h)) / math.sqrt(f)
    for i in (1, 2):
        w[f"norm{i}_gamma"] = 1.0 + 0.1 * rng.standard_normal(h)
        if m.norm == "layernorm":
            w[f"norm{i}_beta"] = 0.1 * rng.standard_normal(h)
    return w


def _norm(workload, x, weights, i):
    m = workload.model
    if m.norm == "layernorm":
        return ref_layernorm(x, weights[f"norm{i}_gamma"], weights[f"norm{i}_beta"], m.norm_eps)
    return ref_rmsnorm(x, weights[f"norm{i}_gamma"], m.norm_eps)


def _activation(kind: str, z, f: int):
    if kind == "gelu":
        return ref_gelu(z)
    if kind == "relu":
        return ref_relu(z)
    return ref_swiglu(z[:, :f], z[:, f:])


def reference_block(workload: "Workload", weights: dict, x, tensors: Optional[dict] = None,
                    routing: Optional[dict] = None) -> np.ndarray:
    """One decoder block forward in float64, prefill semantics: ``x`` is [batch*L, h], the
    scenario's ``batch`` sequences of L tokens each one after another (L = rows / batch), every
    token computed at once, causal per the scenario. Returns y [batch*L, h]. When ``tensors`` is a
    dict it receives the intermediates under the op graph's names (x_n1, qkv, attn_out, ...).
    ``routing``: a mixture-of-experts block's discrete choices, as moe_ffn takes them."""
    m, sc = workload.model, workload.scenario
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] != m.hidden or x.shape[0] % sc.batch:
        raise ValueError(f"x must be [batch*L, {m.hidden}] with batch {sc.batch}, got {x.shape}")
    tp = sc.tensor_parallel                  # a shard: its heads and FFN columns, partial sums added
    b, n, a, f = sc.batch, m.heads // tp, m.hidden // tp, m.ffn_hidden // tp
    x_n1 = _norm(workload, x, weights, 1)
    qkv = x_n1 @ weights["w_qkv"]
    q, k, v = (split_heads(qkv[:, i * a:(i + 1) * a], b, n) for i in range(3))
    attn_out = merge_heads(ref_attention(q, k, v, sc.causal))
    x_mid = x + attn_out @ weights["w_proj"]
    x_n2 = _norm(workload, x_mid, weights, 2)
    if m.moe is not None:
        y = x_mid + moe_ffn(workload, x_n2, weights, tensors, routing)
        if tensors is not None:
            tensors.update(x=x, x_n1=x_n1, qkv=qkv, attn_out=attn_out, x_mid=x_mid, x_n2=x_n2, y=y)
        return y
    ffn1_out = x_n2 @ weights["w_ffn1"]
    act_out = _activation(m.activation, ffn1_out, f)
    y = x_mid + act_out @ weights["w_ffn2"]
    if tensors is not None:
        tensors.update(x=x, x_n1=x_n1, qkv=qkv, attn_out=attn_out, x_mid=x_mid, x_n2=x_n2, ffn1_out=ffn1_out,
                       act_out=act_out, y=y)
    return y


# ---- the op graph, op by op -------------------------------------------------------------------

def _attention_qkv(op, tensors):
    """q, k, v as [batch, heads, L, d] for an attention op (K/V from the cache in decode)."""
    d = op.dims
    b, n = d["batch"], d["heads"]
    qkv = tensors["qkv"]
    h = qkv.shape[1] // 3
    q = split_heads(qkv[:, :h], b, n)
    if "k_cache" in op.inputs:
        kc, vc = tensors["k_cache"], tensors["v_cache"]
        k, v = (c.reshape(b * d["kv_len"], h) for c in (kc, vc))
        return q, split_heads(k, b, n), split_heads(v, b, n)
    return q, split_heads(qkv[:, h:2 * h], b, n), split_heads(qkv[:, 2 * h:], b, n)


def run_op(op, tensors: dict, norm_eps: float = 1e-5) -> dict[str, np.ndarray]:
    """The outputs of one op (name -> float64 array) from ``tensors`` (which must hold its inputs)."""
    ins = [np.asarray(tensors[name], np.float64) for name in op.inputs]
    k, d = op.kind, op.dims
    if k == "gemm":
        outs = [ref_gemm(ins[0], ins[1], d["trans_a"], d["trans_b"])]
    elif k == "add":
        outs = [ref_add(*ins)]
    elif k == "layernorm":
        outs = [ref_layernorm(*ins, eps=norm_eps)]
    elif k == "rmsnorm":
        outs = [ref_rmsnorm(*ins, eps=norm_eps)]
    elif k in ("gelu", "relu"):
        outs = [_activation(k, ins[0], d["cols"])]
    elif k == "swiglu":
        outs = [ref_swiglu(ins[0][:, :d["cols"]], ins[0][:, d["cols"]:])]
    elif k == "layernorm_grad":
        outs = list(ref_layernorm_grad(ins[0], ins[1], ins[2], norm_eps))
    elif k == "rmsnorm_grad":
        outs = list(ref_rmsnorm_grad(ins[0], ins[1], ins[2], norm_eps))
    elif k == "gelu_grad":
        outs = [ref_gelu_grad(*ins)]
    elif k == "relu_grad":
        outs = [ref_relu_grad(*ins)]
    elif k == "swiglu_grad":
        f = d["cols"]
        outs = [np.concatenate(ref_swiglu_grad(ins[0][:, :f], ins[0][:, f:], ins[1]), axis=1)]
    elif k == "attention" and d.get("dropout"):    # unfused, training: P dropped before P V
        from archsim.workloads.ops import DROPOUT_SEEDS
        q, kk, v = _attention_qkv(op, tensors)
        probs = ref_attention_probs(q, kk, d["causal"])
        dropped, mask = ref_dropout(probs, d["dropout"], DROPOUT_SEEDS[op.name])
        outs = [merge_heads(dropped @ v), probs, dropped, mask]
    elif k == "attention":
        q, kk, v = _attention_qkv(op, tensors)
        out, lse = ref_attention(q, kk, v, d["causal"], return_lse=True)
        outs = [merge_heads(out)]
        if "attn_lse" in op.outputs:
            outs.append(lse)
        if "attn_probs" in op.outputs:
            outs.append(ref_attention_probs(q, kk, d["causal"]))
    elif k == "dropout_add":
        dropped, mask = ref_dropout(ins[1], d["p"], d["seed"])
        outs = [ins[0] + dropped, mask]
    elif k == "dropout_grad":
        outs = [ref_dropout_grad(ins[0], ins[1], d["p"])]
    elif k == "moe_route":
        outs = list(ref_moe_route(ins[0], d["top_k"], d["capacity"]))
    elif k == "moe_dispatch":
        outs = [ref_moe_dispatch(*ins)]
    elif k == "moe_gemm":
        outs = [ref_moe_gemm(ins[0], ins[1], d["experts"], d["trans_a"], d["trans_b"], d["stacked"])]
    elif k == "moe_combine":
        outs = [ref_moe_combine(*ins)]
    elif k == "moe_combine_grad":
        outs = list(ref_moe_combine_grad(*ins))
    elif k == "moe_dispatch_grad":
        outs = [ref_moe_combine(ins[0], ins[1], np.ones(np.shape(ins[1])))]
    elif k == "moe_route_grad":
        outs = [ref_moe_route_grad(*ins)]
    elif k == "attention_grad":
        q, kk, v = _attention_qkv(op, tensors)
        b, n = d["batch"], d["heads"]
        do = split_heads(tensors["d_attn_out"], b, n)
        if "attn_lse" in op.inputs:                  # fused: P recomputed from the saved log-sum-exp
            s = _scores(q, kk, d["causal"], 1.0 / math.sqrt(d["head_dim"]))
            probs = np.exp(s - np.asarray(tensors["attn_lse"], np.float64)[..., None])
        else:                                        # unfused: the stored softmax matrix
            probs = tensors["attn_probs"]
        drop = (tensors["attn_drop"], tensors["attn_mask"], d["dropout"]) if d.get("dropout") else None
        grads = ref_attention_grad(q, kk, v, do, d["causal"], probs=probs, dropout=drop)
        outs = [np.concatenate([merge_heads(g) for g in grads], axis=1)]
    else:
        raise ValueError(f"op {op.name}: no reference for kind {k!r}")
    if len(outs) != len(op.outputs):
        raise ValueError(f"op {op.name}: reference made {len(outs)} outputs for {op.outputs}")
    return dict(zip(op.outputs, outs))


def execute_ops(workload: "Workload", tensors: dict) -> dict[str, np.ndarray]:
    """Run ``workload.block_ops()`` in order through the per-kind references. ``tensors`` must hold
    the block's inputs (x, the weights, k_cache/v_cache in decode, d_y in train); returns a new
    dict with every tensor the ops produced added. Each output's shape is checked against
    ``workload.tensor_shapes()``."""
    shapes = workload.tensor_shapes()
    env = dict(tensors)
    for op in workload.block_ops():
        missing = [name for name in op.inputs if name not in env]
        if missing:
            raise KeyError(f"op {op.name}: inputs {missing} are neither given nor produced earlier")
        for name, value in run_op(op, env, workload.model.norm_eps).items():
            if value.shape != shapes[name]:
                raise ValueError(f"op {op.name}: {name} has shape {value.shape}, the graph says {shapes[name]}")
            env[name] = value
    return env


__all__ = ["causal_mask", "dropout_keep", "dropout_scale", "execute_ops", "ref_dropout", "ref_dropout_grad", "merge_heads", "random_weights", "ref_add", "ref_attention",
           "ref_attention_grad", "ref_attention_probs", "ref_gelu", "ref_gelu_grad", "ref_gemm", "ref_layernorm",
           "ref_layernorm_grad", "ref_relu", "ref_relu_grad", "ref_rmsnorm", "ref_rmsnorm_grad", "ref_softmax",
           "ref_swiglu", "ref_swiglu_grad", "reference_block", "run_op", "split_heads"]
