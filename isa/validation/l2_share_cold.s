// ISA twin of scripts/measure_gpu.py l2_share, cold part: one block of 16 warps an SM (132: H100 SXM5), blocks in
// groups of {n} consecutive ones reading the same 1 MiB window (window w at buf + w MiB) in step, 4 loads of 16 B
// a thread in flight an iteration (32 KiB a block), each iteration's loads consumed before the next. On the chip
// the windows had been pushed out of the L2 by other reads; here the run starts cold. Every first read of a line
// misses with up to {n} - 1 other SMs right behind it: how the L2 takes many misses of one line at once.
// micro asm's slope (16 and 32 iterations: half and all of the window) leaves the launch and first latency out.
// Registers: window base r4, byte position r5, loads r10-r25, xor sink r30, loop r8-r9.
.kernel l2_share_cold
.param buf
.param group
.param iters
.launch grid=132 block=512
.arg buf f32[34603008] unbacked
.arg group = {n}
.arg iters = 16
        s2r r1, %ctaid.x
        ldparam r2, group
        div.i64 r3, r1, r2
        shl.b64 r3, r3, 20              // window index x 1 MiB
        ldparam r4, buf
        add.i64 r4, r4, r3
        s2r r5, %tid.x
        shl.b64 r5, r5, 4               // byte position: thread x 16
        mov.b64 r30, 0
        ldparam r9, iters
        mov.b64 r8, 0
LOOP:
        and.b64 r6, r5, 1048575
        add.i64 r7, r4, r6
        ld.global.v4.b32 r10, [r7]
        add.i64 r6, r5, 8192            // the next 16 B of every thread: + 512 threads x 16 B
        and.b64 r6, r6, 1048575
        add.i64 r7, r4, r6
        ld.global.v4.b32 r14, [r7]
        add.i64 r6, r5, 16384
        and.b64 r6, r6, 1048575
        add.i64 r7, r4, r6
        ld.global.v4.b32 r18, [r7]
        add.i64 r6, r5, 24576
        and.b64 r6, r6, 1048575
        add.i64 r7, r4, r6
        ld.global.v4.b32 r22, [r7]
        xor.b64 r30, r30, r10
        xor.b64 r30, r30, r14
        xor.b64 r30, r30, r18
        xor.b64 r30, r30, r22
        add.i64 r5, r5, 32768
        add.i64 r8, r8, 1
        setp.lt.i64 p0, r8, r9
   @p0  bra LOOP
        exit
