"""Kernel emitters: operation + target capabilities -> kernels (Program + Launch + arguments).

- ``gemm_gpu``: C = A @ B (or A @ B^T) for the GPU family: tensor-core kernels (mma.m16n8k16
  f16/bf16, m16n8k8 tf32) with cp.async multistage pipelines, XOR-swizzled shared memory and
  ldmatrix, and a vector-FFMA fallback; leading dimensions, a 2-level (batch, head) batch over
  grid.z, A^T (ldmatrix.trans) and an alpha scale, so attention and training GEMMs read their
  operands in place (QKV columns, per-head slices).
"""

from .gemm_gpu import GemmKernel, Tile, choose_tile, gemm_kernel, gemm_reference

__all__ = ["GemmKernel", "Tile", "choose_tile", "gemm_kernel", "gemm_reference"]
