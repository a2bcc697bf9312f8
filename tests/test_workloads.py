"""Workloads: model YAMLs, scenario overrides, one decoder block's op graph and its FLOP counts,
bad input, and the float64 references (block, op by op, gradients)."""

import copy
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from archsim.errors import InputError
from archsim.workloads.model import builtin_workloads, load_workload, validate_workload
from archsim.workloads.ops import ELEMENTWISE_FLOPS, unmasked_scores
from archsim.workloads.reference import (causal_mask, execute_ops, random_weights, ref_attention, ref_gelu,
                                         ref_softmax, reference_block, split_heads)

MODELS = ("gpt2-small", "llama2-7b", "gpt3-175b", "bloom-176b", "tiny")
PHASES = ("train", "prefill", "decode")
FORWARD = ("norm1", "qkv", "attn", "proj", "res1", "norm2", "ffn1", "act", "ffn2", "res2")
BACKWARD = ("ffn2.dgrad", "ffn2.wgrad", "act.grad", "ffn1.dgrad", "ffn1.wgrad", "norm2.grad", "res2.grad",
            "proj.dgrad", "proj.wgrad", "attn.grad", "qkv.dgrad", "qkv.wgrad", "norm1.grad", "res1.grad")


def small(activation="gelu", norm="layernorm", phase="prefill", batch=2, seq=3, causal=True, attention="fused",
          h=8, n=2, f=12, layers=2):
    return validate_workload({
        "name": "small",
        "model": {"layers": layers, "hidden": h, "heads": n, "head_dim": h // n, "ffn_hidden": f, "vocab": 10,
                  "activation": activation, "norm": norm},
        "scenario": {"phase": phase, "batch": batch, "seq": seq, "causal": causal, "dtype": "fp32",
                     "attention": attention},
    })


# ---- the built-in models ----------------------------------------------------------------------

def test_builtin_models_and_their_published_sizes():
    assert set(MODELS) <= set(builtin_workloads())
    sizes = {  # layers, hidden, heads, head_dim, ffn, vocab
        "gpt2-small": (12, 768, 12, 64, 3072, 50257), "llama2-7b": (32, 4096, 32, 128, 11008, 32000),
        "gpt3-175b": (96, 12288, 96, 128, 49152, 50257), "bloom-176b": (70, 14336, 112, 128, 57344, 250880),
        "tiny": (2, 64, 2, 32, 256, 512)}
    for name, want in sizes.items():
        m = load_workload(name).model
        assert (m.layers, m.hidden, m.heads, m.head_dim, m.ffn_hidden, m.vocab) == want, name
    llama = load_workload("llama2-7b").model
    assert (llama.activation, llama.norm) == ("swiglu", "rmsnorm")
    assert (load_workload("gpt2-small").model.activation, load_workload("gpt2-small").model.norm) == ("gelu", "layernorm")
    bloom = load_workload("bloom-176b").scenario
    assert (bloom.phase, bloom.batch, bloom.seq) == ("train", 2, 2048)
    gpt2 = load_workload("gpt2-small").scenario
    assert (gpt2.phase, gpt2.batch, gpt2.seq) == ("prefill", 1, 1024)


def seed_formula(w) -> int:
    """The seed's per-layer GEMM + attention count, written out independently of ops.py:
    forward 24 b s h^2 + 4 b s^2 h, generalised to the FFN width f (two h x f matrices; swiglu
    three), backward = 2 x forward; decode: s -> 1 for projections, kv_len = s + 1 for attention."""
    m, sc = w.model, w.scenario
    b, s, h, f = sc.batch, sc.seq, m.hidden, m.ffn_hidden
    ffn_mats = 3 if m.activation == "swiglu" else 2
    if sc.phase == "decode":
        proj_tokens, q, kv = b, 1, s + 1
    else:
        proj_tokens, q, kv = b * s, s, s
    fwd = 2 * proj_tokens * (4 * h * h + ffn_mats * h * f) + 2 * 2 * b * q * kv * h
    return 3 * fwd if sc.phase == "train" else fwd


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("name", MODELS)
def test_model_flops_match_the_seed_formula(name, phase):
    w = load_workload(name, {"phase": phase})
    ops = w.block_ops()
    got = sum(o.model_flops for o in ops if o.kind in ("gemm", "attention", "attention_grad"))
    want = seed_formula(w)
    assert abs(got - want) <= 1e-3 * want, (got, want)
    assert all(o.model_flops == 0 for o in ops if o.kind not in ("gemm", "attention", "attention_grad"))
    m, sc = w.model, w.scenario
    if m.activation != "swiglu" and m.ffn_hidden == 4 * m.hidden and phase == "prefill":
        b, s, h = sc.batch, sc.seq, m.hidden            # the seed's table, literally
        assert got == 24 * b * s * h * h + 4 * b * s * s * h
    t = w.totals()
    assert t["model_flops"] == m.layers * sum(o.model_flops for o in ops)
    assert t["flops"] == m.layers * sum(o.flops for o in ops)
    assert t["flops"] >= t["model_flops"] * 0.5 and t["flops"] > 0


@pytest.mark.parametrize("phase", PHASES)
def test_op_graph_order_names_and_wiring(phase):
    for act, norm, attention in (("gelu", "layernorm", "fused"), ("swiglu", "rmsnorm", "unfused"),
                                 ("relu", "layernorm", "unfused")):
        w = small(act, norm, phase, attention=attention)
        ops = w.block_ops()
        names = tuple(o.name for o in ops)
        assert names == (FORWARD + BACKWARD if phase == "train" else FORWARD)
        kinds = {o.name: o.kind for o in ops}
        assert kinds["norm1"] == norm and kinds["act"] == act and kinds["attn"] == "attention"
        if phase == "train":
            assert kinds["norm1.grad"] == norm + "_grad" and kinds["act.grad"] == act + "_grad"
            assert kinds["attn.grad"] == "attention_grad"
        shapes = w.tensor_shapes()
        given = {"x", "w_qkv", "w_proj", "w_ffn1", "w_ffn2", "norm1_gamma", "norm2_gamma", "k_cache", "v_cache",
                 "d_y"} | ({"norm1_beta", "norm2_beta"} if norm == "layernorm" else set())
        made = set()
        for o in ops:
            assert o.dtype == "fp32"
            for name in o.inputs:
                assert name in given or name in made, (o.name, name)
                assert name in shapes
            for name in o.outputs:
                assert name not in made and name in shapes, (o.name, name)
                made.add(name)
        assert "y" in made
        if phase == "train":                           # every weight and norm parameter gets a gradient
            assert {"d_x", "d_w_qkv", "d_w_proj", "d_w_ffn1", "d_w_ffn2", "d_norm1_gamma", "d_norm2_gamma"} <= made


def test_gemm_dims_and_backward_transposes():
    w = small("swiglu", "rmsnorm", "train", batch=3, seq=5, h=8, n=2, f=12)
    T, h, f = 15, 8, 12
    g = {o.name: o for o in w.block_ops() if o.kind == "gemm"}
    assert {k: (o.dims["M"], o.dims["N"], o.dims["K"]) for k, o in g.items() if "." not in k} == {
        "qkv": (T, 3 * h, h), "proj": (T, h, h), "ffn1": (T, 2 * f, h), "ffn2": (T, h, f)}
    for name in ("qkv", "proj", "ffn1", "ffn2"):
        fw, dg, wg = g[name], g[name + ".dgrad"], g[name + ".wgrad"]
        M, N, K = fw.dims["M"], fw.dims["N"], fw.dims["K"]
        assert (dg.dims["M"], dg.dims["N"], dg.dims["K"], dg.dims["trans_a"], dg.dims["trans_b"]) == (M, K, N, False, True)
        assert (wg.dims["M"], wg.dims["N"], wg.dims["K"], wg.dims["trans_a"], wg.dims["trans_b"]) == (K, N, M, True, False)
        for o in (fw, dg, wg):
            assert o.flops == o.model_flops == 2 * o.dims["M"] * o.dims["N"] * o.dims["K"]
    act = next(o for o in w.block_ops() if o.name == "act")
    assert act.dims == {"rows": T, "cols": f} and act.flops == ELEMENTWISE_FLOPS["swiglu"] * T * f


def test_unmasked_scores_count_elements_exactly():
    for q_len, kv_len in ((1, 1), (1, 9), (5, 5), (3, 8), (7, 7), (16, 16)):
        assert unmasked_scores(q_len, kv_len, True) == int(causal_mask(q_len, kv_len).sum())
        assert unmasked_scores(q_len, kv_len, False) == q_len * kv_len


@pytest.mark.parametrize("causal", [True, False])
def test_attention_flops_executed(causal):
    b, s, n, d = 2, 7, 2, 4
    w = small(batch=b, seq=s, causal=causal)
    attn = next(o for o in w.block_ops() if o.kind == "attention")
    cells = b * n * (s * (s + 1) // 2 if causal else s * s)
    assert attn.flops == cells * (4 * d + ELEMENTWISE_FLOPS["softmax"])
    assert attn.model_flops == 4 * b * s * s * n * d
    dec = next(o for o in small(batch=b, seq=s, causal=causal, phase="decode").block_ops() if o.kind == "attention")
    assert (dec.dims["q_len"], dec.dims["kv_len"]) == (1, s + 1)
    assert dec.flops == b * n * (s + 1) * (4 * d + ELEMENTWISE_FLOPS["softmax"])   # the mask hides nothing
    assert dec.inputs == ("qkv", "k_cache", "v_cache")
    for attention, matmuls, elem, rows in (("fused", 7, 8, b * n * s * 2 * d), ("unfused", 4, 4, 0)):
        ops = {o.name: o for o in small(batch=b, seq=s, causal=causal, phase="train", attention=attention).block_ops()}
        g = ops["attn.grad"]
        assert g.flops == cells * (matmuls * 2 * d + elem) + rows    # rows: D = rowsum(dO o O), fused only
        assert g.model_flops == 2 * ops["attn"].model_flops
        assert ("attn_lse" in ops["attn"].outputs) == (attention == "fused")
        assert ("attn_probs" in g.inputs) == (attention == "unfused")


# ---- bad input --------------------------------------------------------------------------------

def _tiny_dict():
    return yaml.safe_load((Path(__file__).resolve().parents[1] / "workloads" / "tiny.yaml").read_text())


def _error(data=None, overrides=None, tmp_path=None, text=None) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data))
    with pytest.raises(InputError) as e:
        load_workload(str(path), overrides)
    line = str(e.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("where, key, value, words", [
    ("model", "hidden", 65, ["model.hidden", "heads x head_dim"]),
    ("model", "heads", 3, ["model.hidden", "hidden 64 != heads 3 x head_dim 32"]),
    ("model", "layers", 0, ["model.layers", "out of range", "> 0"]),
    ("scenario", "batch", 0, ["scenario.batch", "out of range"]),
    ("scenario", "seq", 0, ["scenario.seq", "out of range"]),
    ("scenario", "seq", 2.5, ["scenario.seq", "expected an integer"]),
    ("scenario", "phase", "inference", ["scenario.phase", "train, prefill, decode"]),
    ("scenario", "dtype", "fp8", ["scenario.dtype", "fp16, bf16, fp32"]),
    ("model", "activation", "tanh", ["model.activation", "gelu, relu, swiglu"]),
    ("model", "norm", "batchnorm", ["model.norm", "layernorm, rmsnorm"]),
    ("scenario", "attention", "flash", ["scenario.attention", "fused, unfused"]),
    ("scenario", "causal", "yes", ["scenario.causal", "true or false"]),
    ("model", "norm_eps", -1.0, ["model.norm_eps", "out of range"]),
    ("scenario", "colour", "red", ["scenario", "unknown key 'colour'", "known keys: phase"]),
])
def test_bad_field_is_one_line_naming_file_and_field(tmp_path, where, key, value, words):
    data = _tiny_dict()
    data[where][key] = value
    line = _error(data, tmp_path=tmp_path)
    assert line.startswith(str(tmp_path / "w.yaml") + ": ")
    for word in words:
        assert word in line, line


def test_missing_key_yaml_syntax_and_non_mapping(tmp_path):
    data = _tiny_dict()
    del data["scenario"]["dtype"]
    assert "missing required key 'dtype'" in _error(data, tmp_path=tmp_path)
    line = _error(tmp_path=tmp_path, text="name: x\nmodel: [1, 2\n")
    assert "YAML syntax error" in line and line.startswith(str(tmp_path / "w.yaml") + ":")
    assert "mapping" in _error(tmp_path=tmp_path, text="- 1\n- 2\n")
    (tmp_path / "w.yaml").write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_workload(str(tmp_path / "w.yaml"))


@pytest.mark.parametrize("overrides, words", [
    ({"batch": 0}, ["--batch", "scenario.batch", "out of range"]),
    ({"seq": -4}, ["--seq", "out of range"]),
    ({"layers": 0}, ["--layers", "model.layers"]),
    ({"phase": "serve"}, ["--phase", "train, prefill, decode"]),
    ({"dtype": "int8"}, ["--dtype", "fp16, bf16, fp32"]),
    ({"attention": "sparse"}, ["--attention", "fused, unfused"]),
    ({"causal": "sometimes"}, ["--causal", "true or false"]),
    ({"heads": 4}, ["overrides", "unknown scenario option 'heads'", "phase, batch"]),
])
def test_bad_override_names_the_option(overrides, words):
    with pytest.raises(InputError) as e:
        load_workload("tiny", overrides)
    line = str(e.value)
    assert "\n" not in line
    for word in words:
        assert word in line, line


def test_overrides_apply_and_none_means_not_given():
    w = load_workload("gpt2-small", {"phase": "decode", "batch": "4", "seq": 100, "layers": 1, "dtype": "bf16",
                                     "attention": "unfused", "causal": "false"})
    assert (w.scenario.phase, w.scenario.batch, w.scenario.seq, w.model.layers, w.scenario.dtype,
            w.scenario.attention, w.scenario.causal) == ("decode", 4, 100, 1, "bf16", "unfused", False)
    assert load_workload("gpt2-small", {"batch": None, "seq": None}) == load_workload("gpt2-small")
    assert w.summary()["phase"] == "decode" and w.tokens() == 4


def test_unknown_builtin_lists_the_builtins():
    with pytest.raises(InputError) as e:
        load_workload("gpt5")
    line = str(e.value)
    assert line.startswith("--workload: unknown workload 'gpt5'")
    for name in MODELS:
        assert name in line
    with pytest.raises(InputError, match="not found"):
        load_workload("no/such/file.yaml")


_value = st.one_of(st.integers(-5, 10 ** 6), st.floats(allow_nan=True), st.booleans(), st.none(),
                   st.text(max_size=6), st.lists(st.integers(), max_size=2),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                   st.sampled_from(["gelu", "swiglu", "relu", "rmsnorm", "layernorm", "train", "decode", "prefill",
                                    "fp16", "bf16", "fp32", "fused", "unfused", "1", "true"]))
_FIELDS = [("name",), ("model",), ("scenario",)] + [("model", k) for k in _tiny_dict()["model"]] + \
          [("scenario", k) for k in _tiny_dict()["scenario"]] + [("model", "extra"), ("scenario", "extra"), ("extra",)]


@given(changes=st.lists(st.tuples(st.sampled_from(_FIELDS), _value | st.just("<delete>")), max_size=4),
       overrides=st.dictionaries(st.sampled_from(["phase", "batch", "seq", "layers", "dtype", "attention", "causal",
                                                  "bogus"]), _value, max_size=3),
       via_file=st.booleans())
def test_loading_raises_only_input_errors(changes, overrides, via_file):
    data = copy.deepcopy(_tiny_dict())
    for path, value in changes:
        parent = data
        for seg in path[:-1]:
            parent = parent.get(seg) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        if value == "<delete>":
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    try:
        if via_file:
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / "w.yaml"
                p.write_text(yaml.safe_dump(data))
                w = load_workload(str(p), overrides)
        else:
            w = validate_workload(data, "w.yaml", overrides)
    except InputError as e:
        assert "\n" not in str(e) and e.where and e.what
        return
    assert w.model.hidden == w.model.heads * w.model.head_dim
    t = w.totals()
    assert t["model_flops"] > 0 and t["flops"] > 0


# ---- references -------------------------------------------------------------------------------

def test_per_kind_references():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 9))
    assert np.allclose(ref_softmax(x).sum(-1), 1.0)
    erf_gelu = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    assert np.abs(ref_gelu(x) - erf_gelu).max() < 2e-3                # tanh approximation of the erf form
    q, k, v = (rng.standard_normal((2, 3, L, 4)) for L in (3, 5, 5))
    out = ref_attention(q, k, v, causal=True)
    for b in range(2):
        for hd in range(3):
            for i in range(3):                      # query i at position 2 + i sees keys 0 .. 2 + i
                s = q[b, hd, i] @ k[b, hd, :3 + i].T / 2.0
                p = np.exp(s - s.max())
                assert np.allclose(out[b, hd, i], p @ v[b, hd, :3 + i] / p.sum())


@pytest.mark.parametrize("act, norm", [("gelu", "layernorm"), ("swiglu", "rmsnorm")])
def test_reference_block_shape_and_causality(act, norm):
    w = small(act, norm, batch=2, seq=6)
    W = random_weights(w, seed=1)
    x = np.random.default_rng(2).standard_normal((12, 8))
    y = reference_block(w, W, x)
    assert y.shape == (12, 8) and y.dtype == np.float64 and np.isfinite(y).all()
    x2 = x.copy()
    x2[3] += np.linspace(-1.0, 2.0, 8)             # token 3 of sequence 0 (not a constant shift,
                                                   # which a layernorm would remove)
    y2 = reference_block(w, W, x2)
    assert np.array_equal(y2[:3], y[:3])           # earlier tokens ignore the future
    assert not np.allclose(y2[4:6], y[4:6])        # later ones see it
    assert np.array_equal(y2[6:], y[6:])           # the other sequence is untouched
    wnc = small(act, norm, batch=2, seq=6, causal=False)
    assert not np.allclose(reference_block(wnc, W, x2)[:3], reference_block(wnc, W, x)[:3])
    # the op graph run op by op gives the same block output
    env = execute_ops(w, dict(W, x=x))
    assert np.allclose(env["y"], y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act, norm", [("gelu", "layernorm"), ("swiglu", "rmsnorm")])
def test_decode_against_the_cache_equals_the_last_prefill_token(act, norm):
    b, s, h, n = 2, 5, 8, 2
    full = small(act, norm, batch=b, seq=s + 1)
    W = random_weights(full, seed=3)
    x = np.random.default_rng(4).standard_normal((b * (s + 1), h))
    T = {}
    y = reference_block(full, W, x, T)
    kv = T["qkv"].reshape(b, s + 1, 3 * h)
    dec = small(act, norm, batch=b, seq=s, phase="decode")
    last = x.reshape(b, s + 1, h)[:, -1]
    env = execute_ops(dec, dict(W, x=last, k_cache=kv[:, :, h:2 * h], v_cache=kv[:, :, 2 * h:]))
    assert np.allclose(env["qkv"][:, h:], kv[:, -1, h:])       # the new token's K/V is the cache's row s
    assert np.allclose(env["y"], y.reshape(b, s + 1, h)[:, -1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act, norm, attention, causal", [
    ("gelu", "layernorm", "fused", True), ("swiglu", "rmsnorm", "unfused", True),
    ("relu", "layernorm", "unfused", False), ("swiglu", "layernorm", "fused", False)])
def test_train_backward_matches_finite_differences(act, norm, attention, causal):
    w = small(act, norm, "train", batch=2, seq=3, causal=causal, attention=attention, h=8, n=2, f=6)
    fwd = small(act, norm, "prefill", batch=2, seq=3, causal=causal, h=8, n=2, f=6)
    rng = np.random.default_rng(5)
    W = random_weights(w, seed=6)
    x = rng.standard_normal((6, 8))
    dy = rng.standard_normal((6, 8))
    env = execute_ops(w, dict(W, x=x, d_y=dy))

    def loss(params, xx):
        return float((reference_block(fwd, params, xx) * dy).sum())

    eps = 1e-6

    def numeric(name, idx):
        p = {k: v.copy() for k, v in W.items()}
        xx = x.copy()
        t = xx if name == "x" else p[name]
        t[idx] += eps
        up = loss(p, xx)
        t[idx] -= 2 * eps
        return (up - loss(p, xx)) / (2 * eps)

    for name in ["x"] + sorted(W):
        grad = env["d_" + name]
        assert grad.shape == (x if name == "x" else W[name]).shape
        flat = list(np.ndindex(grad.shape))
        picks = flat if len(flat) <= 48 else [flat[i] for i in rng.choice(len(flat), 24, replace=False)]
        for idx in picks:
            assert abs(grad[idx] - numeric(name, idx)) <= 1e-6 * (1 + abs(grad[idx])), (name, idx)


def test_split_heads_layout():
    b, L, n, d = 2, 3, 2, 4
    t = np.arange(b * L * n * d).reshape(b * L, n * d)
    s = split_heads(t, b, n)
    assert s.shape == (b, n, L, d)
    assert s[1, 1, 2, 3] == t[1 * L + 2, 1 * d + 3]     # sequence 1, head 1, token 2, dim 3


def test_a_models_own_check_names_its_field_once():
    """A model check's message (FieldError) keeps its own wording under the file and dotted field."""
    from archsim.paths import data_dir
    from archsim.workloads.model import validate_workload

    d = yaml.safe_load((data_dir("workloads") / "gpt2-small.yaml").read_text())
    d["model"]["hidden"] = 65
    with pytest.raises(InputError) as e:
        validate_workload(d, "w.yaml")
    assert str(e.value) == "w.yaml: model.hidden: hidden 65 != heads 12 x head_dim 64 = 768 (hidden = heads x head_dim)"


# ---- tensor parallelism: one device's shard of the block -------------------------------------------

def test_tensor_parallel_shard_shapes_and_flops():
    from archsim.workloads.model import load_workload

    whole = load_workload("bloom-176b", {"phase": "prefill"})
    shard = load_workload("bloom-176b", {"phase": "prefill", "tensor_parallel": 4})
    h, f = 14336, 57344
    sh = shard.tensor_shapes()
    assert sh["w_qkv"] == (h, 3 * h // 4) and sh["w_proj"] == (h // 4, h)
    assert sh["w_ffn1"] == (h, f // 4) and sh["w_ffn2"] == (f // 4, h) and sh["proj_out"] == (4096, h)
    split = {o.name: o.flops for o in shard.block_ops()}
    full = {o.name: o.flops for o in whole.block_ops()}
    for name in ("qkv", "attn", "proj", "ffn1", "act", "ffn2"):
        assert split[name] * 4 == pytest.approx(full[name], rel=1e-12), name
    for name in ("norm1", "res1", "norm2", "res2"):      # whole on every device
        assert split[name] == full[name]


def test_tensor_parallel_partial_sums_add_up_to_the_whole():
    """Megatron's split: each shard's projection output is a partial sum; the all-reduce of the
    shards' partial sums is the whole block's projection output."""
    from archsim.workloads import reference as R
    from archsim.workloads.model import load_workload

    tp = 2
    whole = load_workload("tiny")
    w = R.random_weights(whole, seed=3)
    h = whole.model.hidden
    x = np.random.default_rng(4).standard_normal((13, h))
    env = R.execute_ops(whole, {"x": x, **w})
    shard_wl = load_workload("tiny", {"tensor_parallel": tp})
    a, f = h // tp, whole.model.ffn_hidden // tp
    total = np.zeros_like(env["proj_out"])
    for k in range(tp):
        cols = np.arange(k * a, (k + 1) * a)
        ws = dict(w)
        ws["w_qkv"] = np.concatenate([w["w_qkv"][:, i * h + cols] for i in range(3)], axis=1)
        ws["w_proj"] = w["w_proj"][cols, :]
        ws["w_ffn1"] = w["w_ffn1"][:, k * f:(k + 1) * f]
        ws["w_ffn2"] = w["w_ffn2"][k * f:(k + 1) * f, :]
        part = R.execute_ops(shard_wl, {"x": x, **ws})
        total += part["proj_out"]
    np.testing.assert_allclose(total, env["proj_out"], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_tensor_parallel_ffn_partial_sums_add_up(activation):
    """The FFN's split: FFN-in by columns (swiglu: the same columns of gate and of up), FFN-out by
    rows; from the whole block's x_n2, the shards' ffn2 outputs add up to the whole's."""
    from archsim.paths import data_dir
    from archsim.workloads import reference as R
    from archsim.workloads.model import validate_workload

    doc = yaml.safe_load((data_dir("workloads") / "tiny.yaml").read_text())
    doc["model"]["activation"] = activation
    whole = validate_workload(doc, "tiny")
    tp = 2
    doc["scenario"]["tensor_parallel"] = tp
    shard_wl = validate_workload(doc, "tiny")
    w = R.random_weights(whole, seed=5)
    x = np.random.default_rng(6).standard_normal((13, whole.model.hidden))
    env = R.execute_ops(whole, {"x": x, **w})
    f = whole.model.ffn_hidden
    fl = f // tp
    ops = {o.name: o for o in shard_wl.block_ops()}
    total = np.zeros_like(env["ffn2_out"])
    for k in range(tp):
        cols = np.arange(k * fl, (k + 1) * fl)
        w1 = w["w_ffn1"][:, cols] if activation != "swiglu" else np.concatenate(
            [w["w_ffn1"][:, cols], w["w_ffn1"][:, f + cols]], axis=1)
        part = {"x_n2": env["x_n2"], "w_ffn1": w1, "w_ffn2": w["w_ffn2"][cols, :]}
        for name in ("ffn1", "act", "ffn2"):
            part.update(R.run_op(ops[name], part, whole.model.norm_eps))
        total += part["ffn2_out"]
    np.testing.assert_allclose(total, env["ffn2_out"], rtol=1e-10, atol=1e-10)


def test_tensor_parallel_must_divide_heads_and_ffn():
    from archsim.errors import InputError
    from archsim.workloads.model import load_workload

    with pytest.raises(InputError) as e:
        load_workload("tiny", {"tensor_parallel": 3})
    assert e.value.where == "--tp" and "does not divide model.heads 2" in e.value.what
