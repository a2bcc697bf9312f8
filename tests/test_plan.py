"""Parallel plans: the plan text, the checks against cluster and model (one line each), where
groups sit, how stages split the layers, memory per device and bytes a step by kind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archsim.cluster.plan import (Plan, check_fits, check_plan, device_of, groups, memory_per_device,
                                  parse_plan, stage_layers, step_volumes)
from archsim.cluster.spec import load_cluster
from archsim.errors import InputError
from archsim.workloads.model import load_workload

BLOOM_PLAN = "tp=4,pp=12,dp=8,mb=2,gbs=2048,recompute=full,zero=1"
GB80 = 80 * 2 ** 30


@pytest.fixture(scope="module")
def bloom():
    return load_workload("bloom-176b")


@pytest.fixture(scope="module")
def jean_zay():
    return load_cluster("jean-zay-a100")


def test_parse_plan_fields():
    p = parse_plan("tp=4, pp=12,dp=8,mb=2,gbs=2048,schedule=interleaved:3,recompute=selective,zero=1,sp=on,"
                   "order=tp-pp-dp")
    assert (p.tp, p.pp, p.dp, p.micro_batch, p.global_batch, p.schedule, p.chunks) == (
        4, 12, 8, 2, 2048, "interleaved", 3)
    assert p.recompute == "selective" and p.zero == 1 and p.sequence_parallel and p.order == ("tp", "pp", "dp")
    assert p.devices == 384 and p.micro_batches == 128
    assert parse_plan("dp=4").batch == 4 and parse_plan("dp=4").summary()["schedule"] == "1f1b"


@pytest.mark.parametrize("text,what", [
    ("", "empty plan"), ("tp", "not key=value"), ("tq=2", "unknown key 'tq'"), ("tp=2,tp=4", "tp given twice"),
    ("tp=0", "not a whole number"), ("tp=1.5", "not a whole number"), ("zero=4", "not a whole number from 0 to 3"),
    ("schedule=interleaved", "schedule='interleaved'"), ("schedule=1f1b:2", "schedule="),
    ("schedule=interleaved:1", "not a whole number from 2"), ("recompute=some", "recompute='some'"),
    ("sp=yes", "sp='yes'"), ("order=tp-dp", "not a permutation"), ("tp=" + "9" * 40, "not a whole number"),
])
def test_bad_plan_text_is_one_line(text, what):
    with pytest.raises(InputError) as e:
        parse_plan(text)
    assert e.value.where == "--plan" and what in e.value.what and "\n" not in e.value.line()


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet="tpdmbgsezro=,:-0123456789 abcfilnuv", max_size=40))
def test_any_plan_text_is_a_plan_or_one_line(text):
    try:
        p = parse_plan(text)
    except InputError as e:
        assert "\n" not in e.line()
        return
    assert p.devices >= 1 and p.micro_batch >= 1


@pytest.mark.parametrize("text,what", [
    ("tp=4,pp=12,dp=9,mb=2,gbs=2048", "= 432 devices; cluster jean-zay-a100 has 384"),
    ("tp=3", "tp 3 does not divide bloom-176b's heads 112"),
    ("pp=71", "pp 71 is more stages than bloom-176b's 70 layers"),
    ("mb=3,dp=8,gbs=2048", "micro-batch 3 x dp 8 = 24 does not divide the global batch 2048"),
    ("ep=2", "has no experts"),
    ("pp=12,schedule=interleaved:6", "needs 72 model chunks"),
    ("pp=2,gbs=100000000", "micro-batches a step"),
])
def test_plans_that_do_not_fit_the_cluster_or_model(bloom, jean_zay, text, what):
    with pytest.raises(InputError) as e:
        check_plan(parse_plan(text), jean_zay, bloom)
    assert what in e.value.what


def test_placement_keeps_tensor_parallel_groups_in_a_node(jean_zay):
    p = parse_plan(BLOOM_PLAN)
    tp = groups(p, "tp")
    assert len(tp) == 96 and tp[0] == [0, 1, 2, 3]
    assert all(len({d // jean_zay.node.devices for d in g}) == 1 for g in tp)
    assert groups(p, "dp")[0] == [0, 4, 8, 12, 16, 20, 24, 28] and groups(p, "pp")[0] == list(range(0, 384, 32))
    every = sorted(d for g in groups(p, "pp") for d in g)
    assert every == list(range(384))
    q = parse_plan("tp=2,dp=2,pp=2,order=pp-tp-dp")
    assert device_of(q, 1, 0, 0) == 2 and device_of(q, 0, 1, 0) == 4 and device_of(q, 0, 0, 1) == 1


@pytest.mark.parametrize("layers,pp", [(70, 12), (96, 8), (24, 5), (2, 2), (5, 1), (3, 5)])
def test_stage_layers_counts_the_embedding_and_head(layers, pp):
    s = stage_layers(layers, pp)
    assert sum(s) == layers and len(s) == pp and min(s) >= 0
    units = [b + (1 if i == 0 else 0) + (1 if i == pp - 1 else 0) for i, b in enumerate(s)] if pp > 1 else [layers + 2]
    assert max(units) - min(units) <= 1
    if (layers, pp) == (70, 12):
        assert s == [5] + [6] * 10 + [5]          # BLOOM's split


def test_bloom_states_are_twenty_bytes_a_parameter(bloom):
    # the whole model's weights, gradients and AdamW state on one replica without sharding
    p = Plan()
    mem = memory_per_device(p, bloom, GB80)
    states = mem["weights"] + mem["gradients"] + mem["optimizer"]
    assert states == pytest.approx(176.24e9 * 20, rel=1e-3)       # 3,525 GB
    assert states / GB80 > 41                                       # at least 45 80-GB devices (in GB: 3525/80)


def test_bloom_plan_fits_and_zero_and_recompute_shrink_it(bloom, jean_zay):
    p = parse_plan(BLOOM_PLAN)
    check_plan(p, jean_zay, bloom)
    mem = check_fits(p, bloom, GB80, "a100-80gb")
    assert mem["total"] < GB80 and [s["blocks"] for s in mem["stages"]] == [5] + [6] * 10 + [5]
    base = parse_plan("tp=4,pp=12,dp=8,mb=2,gbs=2048")
    m = {z: memory_per_device(Plan(**{**base.__dict__, "zero": z}), bloom, GB80)["stages"][0] for z in range(4)}
    assert m[0]["optimizer"] == pytest.approx(8 * m[1]["optimizer"]) and m[1]["gradients"] == m[0]["gradients"]
    assert m[2]["gradients"] == pytest.approx(m[1]["gradients"] / 8) and m[3]["weights"] == pytest.approx(
        m[2]["weights"] / 8)
    act = {r: memory_per_device(Plan(**{**base.__dict__, "recompute": r}), bloom, GB80)["activations"]
           for r in ("none", "selective", "full")}
    assert act["full"] < act["selective"] <= act["none"]
    sp = memory_per_device(Plan(**{**base.__dict__, "sequence_parallel": True}), bloom, GB80)["activations"]
    assert sp < act["none"]
    gpipe = memory_per_device(Plan(**{**base.__dict__, "schedule": "gpipe"}), bloom, GB80)["activations"]
    assert gpipe > act["none"]


def test_a_plan_that_does_not_fit_says_by_how_much_and_what_would(bloom):
    with pytest.raises(InputError) as e:
        check_fits(parse_plan("tp=4,pp=12,dp=8,mb=2,gbs=2048"), bloom, GB80, "a100-80gb")
    assert "GB over" in e.value.what and "a100-80gb has 85.9 GB" in e.value.what
    assert e.value.allowed.startswith("what would fit: zero=")


def test_bloom_volumes_rank_as_the_material_says(bloom):
    v = step_volumes(parse_plan(BLOOM_PLAN), bloom)
    # tensor parallel very high, data parallel high, pipeline medium (bytes a device a step)
    assert v["tensor_parallel"]["bytes_per_device"] > v["data_parallel"]["bytes_per_device"] > \
        v["pipeline"]["bytes_per_device"]
    assert v["tensor_parallel"]["bytes_per_call"] == 2 * 2048 * 14336 * 2
    assert v["pipeline"]["bytes_per_call"] == 2 * 2048 * 14336 * 2 / 4


def test_inference_memory_holds_the_kv_cache():
    wl = load_workload("bloom-176b", {"phase": "decode", "batch": 8, "seq": 2048})
    mem = memory_per_device(parse_plan("tp=8,mb=8"), wl, GB80)
    assert mem["gradients"] == mem["optimizer"] == mem["activations"] == 0
    assert mem["kv_cache"] == 2 * 70 * 8 * 2049 * (14336 // 8) * 2


def test_sequence_parallel_splits_only_the_replicated_tensors(bloom):
    """BLOOM at tp 4: ffn1_out and act_out are already tp shards as wide as the model; sequence
    parallelism must not divide them again. Expected bytes of one block's kept tensors, by hand."""
    from archsim.cluster.plan import stored_activations
    from archsim.workloads.model import load_workload as lw

    shard = lw("bloom-176b", {"tensor_parallel": 4, "batch": 1, "layers": 1})
    T, h, f4, e = 2048, 14336, 57344 // 4, 2
    whole_rows = {"x": T * h, "x_n1": T * h, "x_mid": T * h, "x_n2": T * h}
    shards = {"qkv": T * 3 * h // 4, "attn_out": T * h // 4, "ffn1_out": T * f4, "act_out": T * f4,
              "attn_lse": 1 * (112 // 4) * 2048}
    none = stored_activations(shard, "none", False, 4)
    sp = stored_activations(shard, "none", True, 4)
    assert none == e * (sum(whole_rows.values()) + sum(shards.values()))
    assert sp == e * (sum(whole_rows.values()) // 4 + sum(shards.values()))
