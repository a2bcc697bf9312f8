"""Kernel emitters: operation + target capabilities -> kernels (Program + Launch + arguments).

- ``gemm_gpu``: C = A @ B (or A @ B^T) for the GPU family: tensor-core kernels (mma.m16n8k16
  f16/bf16, m16n8k8 tf32) with cp.async multistage pipelines, XOR-swizzled shared memory and
  ldmatrix, and a vector-FFMA fallback; leading dimensions, a 2-level (batch, head) batch over
  grid.z, A^T (ldmatrix.trans) and an alpha scale, so attention and training GEMMs read their
  operands in place (QKV columns, per-head slices).
- ``attention_gpu``: fused (flash) attention softmax(scale Q K^T + mask) V for the GPU family,
  FlashAttention-2 style (K/V tiles double-buffered in shared memory, online softmax, P fed from
  the S accumulators to the P V mma), causal or not, any lengths, fused-QKV layouts; optionally
  the per-row log-sum-exp for training.
- ``attention_wgmma``: the same forward as FlashAttention-3 runs it on Hopper (TMA, wgmma, a
  producer warp and two consumer warpgroups in ping-pong).
- ``attention_grad_gpu``: its backward (FlashAttention-2): three kernels, attn.grad.pre / .dkdv / .dq.
- ``elementwise_gpu``: the elementwise and row-reduction kernels of a transformer block for the
  GPU family (softmax with causal masking, layernorm, rmsnorm, GELU, SwiGLU, residual add, and
  their backward kernels): warp or block per row, vector loads, shfl.bfly reductions.
- ``gemm_sunway``, ``attention_sunway``, ``attention_grad_sunway``, ``elementwise_sunway``, ``kvcache_sunway``: the same
  contracts for the Sunway family (one CPE a block; DMA into the LDM, vector FMAs): GEMM with an
  f32 C tile in LDM, double-buffered strided / per-row DMA panels and f16x2 / bf16x2 k-pair
  register tiles flushed into f32 per panel; fused attention forward with one lane per query row
  (decode: one lane per key) and its backward (pre; dkdv with one lane per key row; dq with one
  lane per query row); row and flat kernels streaming rows or chunks through the LDM.
- ``block``: a block's op graph -> the kernels above (the target family's emitters), bound to the
  block's tensors.
- ``common``: what the emitters share: the assembler with a register pool (``Asm``), integer and
  address helpers, argument checks and the dtype tables.
"""

from .attention_gpu import AttentionKernel, attention_reference, flash_attention_kernel
from .attention_grad_gpu import AttentionGradKernel, flash_attention_grad_kernel
from .elementwise_gpu import (ElementwiseKernel, KernelChain, add_kernel, gelu_grad_kernel, gelu_kernel,
                              layernorm_grad_kernel, layernorm_kernel, rmsnorm_grad_kernel, rmsnorm_kernel,
                              softmax_grad_kernel, softmax_kernel, swiglu_grad_kernel, swiglu_kernel)
from .gemm_gpu import GemmKernel, Tile, choose_tile, gemm_kernel, gemm_reference
from .block import FamilyEmitters, family_emitters

__all__ = ["FamilyEmitters", "family_emitters", "AttentionGradKernel", "AttentionKernel", "flash_attention_grad_kernel", "ElementwiseKernel", "GemmKernel", "KernelChain", "Tile", "add_kernel",
           "attention_reference", "choose_tile", "flash_attention_kernel", "gelu_grad_kernel", "gelu_kernel",
           "gemm_kernel", "gemm_reference", "layernorm_grad_kernel", "layernorm_kernel", "rmsnorm_grad_kernel",
           "rmsnorm_kernel", "softmax_grad_kernel", "softmax_kernel", "swiglu_grad_kernel", "swiglu_kernel"]
