"""K-loop sampling (sample._time_k_loop, --sample-k-loop): a GEMM timed from its k-loop cut short."""

from __future__ import annotations

import pytest

from archsim.cli import main
from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.timing import shared_buffers
from archsim.options import RunOptions, check_options
from archsim.errors import InputError
from archsim.runner import emit_block, kernel_timer
from archsim.sample import k_loop_cuts, sampled_record, time_sampled
from archsim.workloads.emit import gemm_kernel
from archsim.workloads.emit.gemm_sunway import gemm_kernel as sunway_gemm_kernel
from archsim.workloads.model import load_workload


def _gemm(hw: str, M: int, N: int, K: int):
    machine = load_machine(hw)
    emit = sunway_gemm_kernel if machine.family == "sunway" else gemm_kernel
    g = emit(capabilities(machine), M, N, K, "fp16", "f32")
    return machine, g, g.args(*shared_buffers(machine, [M * K * 2, K * N * 2, M * N * 4]))


def test_cuts_are_doublings_of_the_longest_first_tile_count_that_fits():
    assert k_loop_cuts(63) is None
    assert k_loop_cuts(64) == (4, 8, 16) and k_loop_cuts(127) == (4, 8, 16)
    assert k_loop_cuts(128) == (8, 16, 32) and k_loop_cuts(768) == (8, 16, 32)


@pytest.mark.parametrize("hw", ["tiny-gpu", "tiny-sunway"])
def test_a_long_loop_is_answered_within_its_estimate_with_exact_instructions(hw):
    machine, g, args = _gemm(hw, 64, 64, 8192)
    whole = time_sampled(g.program, machine, g.launch, args, sample=False)
    got = time_sampled(g.program, machine, g.launch, args, k_tile=g.tile.BK)
    info = got.k_loop
    assert got.sampled and "refused" not in info
    assert info["k_tiles"] == 8192 // g.tile.BK and [p["k_tiles"] for p in info["points"]] == \
        list(k_loop_cuts(info["k_tiles"]))
    assert 0 < got.error_est <= 0.03
    assert abs(got.timing.cycles / whole.timing.cycles - 1) <= got.error_est
    # the loop is all K changes: instructions, flops and DRAM bytes are carried exactly
    assert got.timing.warp_instructions == whole.timing.warp_instructions
    assert got.timing.flops == whole.timing.flops
    assert got.timing.memory["bytes"]["dram_read"] == whole.timing.memory["bytes"]["dram_read"]
    # the cuts cost far less than the loop
    assert got.simulated_warp_instructions < 0.5 * whole.timing.warp_instructions


def test_the_record_says_how_and_an_estimate_above_the_threshold_times_it_as_usual():
    machine, g, args = _gemm("tiny-gpu", 64, 64, 8192)
    rec = sampled_record("g", g.program, machine, g.launch, args, k_tile=g.tile.BK)
    assert rec["sample_method"] == "k_loop" and rec["sample_error_est"] == rec["sample_k_loop"]["error_est"]
    usual = sampled_record("g", g.program, machine, g.launch, args)
    strict = sampled_record("g", g.program, machine, g.launch, args, k_tile=g.tile.BK, max_error=1e-6)
    assert "refused" in strict["sample_k_loop"] and strict["cycles"] == usual["cycles"]
    assert usual["sample_method"] == "whole" and strict["sample_method"] == "whole_after_fallback"
    # what the refused cuts ran is counted
    assert strict["simulated_warp_instructions"] == (usual["simulated_warp_instructions"]
                                                    + strict["sample_k_loop"]["simulated_warp_instructions"])


def test_a_short_loop_is_not_cut():
    machine, g, args = _gemm("tiny-gpu", 64, 64, 1024)
    got = time_sampled(g.program, machine, g.launch, args, k_tile=g.tile.BK)
    assert got.k_loop is None
    assert got.timing.cycles == time_sampled(g.program, machine, g.launch, args).timing.cycles


def test_runs_pass_the_k_tile_of_gemms_only_when_asked():
    machine = load_machine("tiny-gpu")
    wl = load_workload("tiny", {"phase": "train"})
    kernels = emit_block(machine, wl)
    _, off = kernel_timer(machine, RunOptions(), wl, kernels)
    assert all(v == {} for v in off.values())
    _, on = kernel_timer(machine, RunOptions(k_loop=True), wl, kernels)
    gemms = {k.name for k in kernels if k.k_tile}
    assert gemms and {n for n, v in on.items() if v} == gemms
    assert {"qkv", "ffn1", "ffn2", "qkv.wgrad"} <= gemms and not {"attn", "norm1", "act"} & gemms


def test_k_loop_sampling_with_sampling_off_is_one_line(capsys):
    with pytest.raises(InputError):
        check_options(RunOptions(k_loop=True, sample=False))
    assert main(["run", "--hw", "tiny-gpu", "--workload", "tiny", "--no-sample", "--sample-k-loop"]) == 2
    err = capsys.readouterr().err
    assert "--sample-k-loop" in err and len(err.strip().splitlines()) == 1


def test_a_gpu_launch_of_several_waves_is_not_cut():
    # at short K the L2 would keep one wave's operand panels for the next
    machine, g, args = _gemm("tiny-gpu", 256, 256, 2048)
    assert g.launch.blocks > 8 and 2048 // g.tile.BK >= 64
    got = time_sampled(g.program, machine, g.launch, args, k_tile=g.tile.BK)
    assert got.k_loop is None
