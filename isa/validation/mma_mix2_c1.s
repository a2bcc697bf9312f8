// ISA twin of scripts/measure_gpu.py mma_mix2 (mix2_b0_c1): each round a warp runs 8 mma.sync
// m16n8k16 (4 independent chains, twice), then one cp.async of 16 B a lane from an L2-resident window into
// a 16 KiB ring of shared memory, a commit group a round and wait_group 6. One block of 4 warps an SM
// (132: H100 SXM5). The chip's window is 4 MiB that the host's memset left in the L2; here 256 KiB, and
// micro asm's slope (iters and 2 x iters) leaves the cold first pass out. Registers: A r1-r4, B r5-r6,
// accumulators r10-r25, addresses r30-r35, loop r40-r41.
.kernel mma_mix2_c1
.param src
.param iters
.shared 16384
.launch grid=132 block=128
.arg src f32[65536] zeros
.arg iters = 64
        s2r r36, %tid.x
        shl.b64 r31, r36, 4            // global byte offset: thread x 16
        mov.b64 r32, r31               // ring offset
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
        ldparam r30, src
        ldparam r41, iters
        mov.b64 r40, 0
LOOP:
        mma.m16n8k16.f32.f16 r10, r1, r5, r10
        mma.m16n8k16.f32.f16 r14, r1, r5, r14
        mma.m16n8k16.f32.f16 r18, r1, r5, r18
        mma.m16n8k16.f32.f16 r22, r1, r5, r22
        mma.m16n8k16.f32.f16 r10, r1, r5, r10
        mma.m16n8k16.f32.f16 r14, r1, r5, r14
        mma.m16n8k16.f32.f16 r18, r1, r5, r18
        mma.m16n8k16.f32.f16 r22, r1, r5, r22
        and.b64 r33, r31, 262143
        add.i64 r34, r30, r33
        and.b64 r35, r32, 16383
        cp.async.16 [r35], [r34]
        add.i64 r31, r31, 2048
        add.i64 r32, r32, 2048
        cp.async.commit
        cp.async.wait 6
        add.i64 r40, r40, 1
        setp.lt.i64 p0, r40, r41
   @p0  bra LOOP
        cp.async.wait 0
        exit
