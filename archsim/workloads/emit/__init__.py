"""Kernel emitters: operation + target capabilities -> kernels (Program + Launch + arguments).

- ``gemm_gpu``: C = A @ B (or A @ B^T) for the GPU family: tensor-core kernels (mma.m16n8k16
  f16/bf16, m16n8k8 tf32) with cp.async multistage pipelines, XOR-swizzled shared memory and
  ldmatrix, and a vector-FFMA fallback.
- ``attention_gpu``: fused (flash) attention softmax(scale Q K^T + mask) V for the GPU family,
  FlashAttention-2 style (K/V tiles double-buffered in shared memory, online softmax, P fed from
  the S accumulators to the P V mma), causal or not, any lengths, fused-QKV layouts; optionally
  the per-row log-sum-exp for training.
- ``attention_grad_gpu``: its backward (FlashAttention-2): three kernels, attn.grad.pre / .dkdv / .dq.
"""

from .attention_gpu import AttentionKernel, attention_reference, flash_attention_kernel
from .attention_grad_gpu import AttentionGradKernel, flash_attention_grad_kernel
from .gemm_gpu import GemmKernel, Tile, choose_tile, gemm_kernel, gemm_reference

__all__ = ["AttentionGradKernel", "AttentionKernel", "GemmKernel", "Tile", "attention_reference", "choose_tile",
           "flash_attention_grad_kernel", "flash_attention_kernel", "gemm_kernel", "gemm_reference"]
