"""Kernel emitters: operation + target capabilities -> kernels (Program + Launch + arguments).

- ``gemm_gpu``: C = A @ B (or A @ B^T) for the GPU family: tensor-core kernels (mma.m16n8k16
  f16/bf16, m16n8k8 tf32) with cp.async multistage pipelines, XOR-swizzled shared memory and
  ldmatrix, and a vector-FFMA fallback.
- ``elementwise_gpu``: the elementwise and row-reduction kernels of a transformer block for the
  GPU family (softmax with causal masking, layernorm, rmsnorm, GELU, SwiGLU, residual add, and
  their backward kernels): warp or block per row, vector loads, shfl.bfly reductions.
"""

from .elementwise_gpu import (ElementwiseKernel, KernelChain, add_kernel, gelu_grad_kernel, gelu_kernel,
                              layernorm_grad_kernel, layernorm_kernel, rmsnorm_grad_kernel, rmsnorm_kernel,
                              softmax_grad_kernel, softmax_kernel, swiglu_grad_kernel, swiglu_kernel)
from .gemm_gpu import GemmKernel, Tile, choose_tile, gemm_kernel, gemm_reference

__all__ = ["GemmKernel", "Tile", "choose_tile", "gemm_kernel", "gemm_reference", "ElementwiseKernel", "KernelChain",
           "add_kernel", "gelu_grad_kernel", "gelu_kernel", "layernorm_grad_kernel", "layernorm_kernel",
           "rmsnorm_grad_kernel", "rmsnorm_kernel", "softmax_grad_kernel", "softmax_kernel", "swiglu_grad_kernel",
           "swiglu_kernel"]
