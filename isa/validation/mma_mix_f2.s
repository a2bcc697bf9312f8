// ISA twin of scripts/measure_gpu.py mma_mix (mix_f2_l0): each iteration a warp runs 8 mma.sync m16n8k16
// (4 independent chains, twice), each followed by 2 FFMA on 8 rotating accumulators. One block an SM
// (132: H100 SXM5), 8 warps (2 a sub-core) as the curve's points. No memory traffic.
// Registers: A r1-r4, B r5-r6, mma accumulators r10-r25, FFMA r50-r57 (operands r58, r59), loop r40-r41.
.kernel mma_mix_f2
.param iters
.launch grid=132 block=256
.arg iters = 64
        mov.b64 r1, 0
        mov.b64 r2, 0
        mov.b64 r3, 0
        mov.b64 r4, 0
        mov.b64 r5, 0
        mov.b64 r6, 0
        mov.b64 r10, 0
        mov.b64 r11, 0
        mov.b64 r12, 0
        mov.b64 r13, 0
        mov.b64 r14, 0
        mov.b64 r15, 0
        mov.b64 r16, 0
        mov.b64 r17, 0
        mov.b64 r18, 0
        mov.b64 r19, 0
        mov.b64 r20, 0
        mov.b64 r21, 0
        mov.b64 r22, 0
        mov.b64 r23, 0
        mov.b64 r24, 0
        mov.b64 r25, 0
        mov.b64 r50, 0
        mov.b64 r51, 0
        mov.b64 r52, 0
        mov.b64 r53, 0
        mov.b64 r54, 0
        mov.b64 r55, 0
        mov.b64 r56, 0
        mov.b64 r57, 0
        mov.f32 r58, 1.0
        mov.f32 r59, 0.0000001
        ldparam r41, iters
        mov.b64 r40, 0
LOOP:
        mma.m16n8k16.f32.f16 r10, r1, r5, r10
        fma.f32 r50, r50, r58, r59
        fma.f32 r51, r51, r58, r59
        mma.m16n8k16.f32.f16 r14, r1, r5, r14
        fma.f32 r52, r52, r58, r59
        fma.f32 r53, r53, r58, r59
        mma.m16n8k16.f32.f16 r18, r1, r5, r18
        fma.f32 r54, r54, r58, r59
        fma.f32 r55, r55, r58, r59
        mma.m16n8k16.f32.f16 r22, r1, r5, r22
        fma.f32 r56, r56, r58, r59
        fma.f32 r57, r57, r58, r59
        mma.m16n8k16.f32.f16 r10, r1, r5, r10
        fma.f32 r50, r50, r58, r59
        fma.f32 r51, r51, r58, r59
        mma.m16n8k16.f32.f16 r14, r1, r5, r14
        fma.f32 r52, r52, r58, r59
        fma.f32 r53, r53, r58, r59
        mma.m16n8k16.f32.f16 r18, r1, r5, r18
        fma.f32 r54, r54, r58, r59
        fma.f32 r55, r55, r58, r59
        mma.m16n8k16.f32.f16 r22, r1, r5, r22
        fma.f32 r56, r56, r58, r59
        fma.f32 r57, r57, r58, r59
        add.i64 r40, r40, 1
        setp.lt.i64 p0, r40, r41
   @p0  bra LOOP
        exit
