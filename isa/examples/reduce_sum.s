// reduce_sum.s -- partial sums: out[b] = sum of block b's chunk of x (f32).
//
// The input x[0..n) is cut into nctaid.x contiguous chunks of C = ceil(n / nctaid.x) elements
// (the last one may be shorter or empty); block b sums x[b*C .. min((b+1)*C, n)) and writes one
// f32 to out[b]. Summing out (on the host, or with a second launch of this kernel on out with
// one block) gives the total. out must have nctaid.x elements.
//
// Three levels, the classic GPU block reduction:
//   1. per thread: a block-stride loop over the chunk (thread t adds elements t, t+ntid, ...;
//      consecutive lanes read consecutive words, so the loads are coalesced);
//   2. per warp: a butterfly (shfl.bfly with lane masks 16, 8, 4, 2, 1); after it every lane
//      holds the warp's sum;
//   3. per block: lane 0 of each warp writes its warp's sum to the scratchpad, bar.sync, then
//      warp 0 reads the (at most 32) partials, one per lane, and reduces them with a second
//      butterfly; lane 0 of warp 0 stores the result.
//
// Needs warp width 32 (the shuffle masks) and ntid.x <= 1024 (at most 32 warps). The block
// size need not be a multiple of 32: lanes past the block's last thread never run, hold 0 and
// so add nothing when a shuffle reads them. Any n >= 0 and any grid work.
// The summation order is not numpy's, so the result differs from a float64 sum by f32 rounding.

.kernel reduce_sum
.param x                        // f32[n]
.param out                      // f32[nctaid.x]
.param n                        // element count
.shared 128                     // one f32 partial per warp (32 warps at most)
.launch grid=4 block=256
.arg x f32[5000] random
.arg out f32[4] zeros
.arg n = 5000

        s2r     r0, %tid.x
        s2r     r1, %ntid.x
        s2r     r2, %ctaid.x
        s2r     r3, %nctaid.x
        ldparam r4, n
        // chunk bounds: C = (n + nctaid - 1) / nctaid, [start, end) = [b*C, min(b*C + C, n))
        add.i64 r5, r4, r3
        sub.i64 r5, r5, 1
        div.i64 r5, r5, r3              // r5 = C
        mul.i64 r6, r2, r5              // r6 = start
        add.i64 r7, r6, r5
        min.i64 r7, r7, r4              // r7 = end
        // walk with byte pointers: p = &x[start + tid], stop at &x[end], step ntid*4
        ldparam r8, x
        add.i64 r9, r6, r0
        shl.b64 r9, r9, 2
        add.i64 r9, r8, r9              // r9 = p
        shl.b64 r10, r7, 2
        add.i64 r10, r8, r10            // r10 = &x[end]
        shl.b64 r11, r1, 2              // r11 = step in bytes
        mov.f32 r12, 0.0                // r12 = this thread's running sum

        // ---- 1. per-thread loop (lanes leave it at different times and reconverge at WARP)
LOOP:   setp.ge.i64 p0, r9, r10
   @p0  bra     WARP
        ld.global.b32 r13, [r9]
        add.f32 r12, r12, r13
        add.i64 r9, r9, r11
        bra     LOOP

        // ---- 2. warp butterfly: after step k every lane holds the sum of a group of 2^k lanes
WARP:   shfl.bfly.b64 r13, r12, 16
        add.f32 r12, r12, r13
        shfl.bfly.b64 r13, r12, 8
        add.f32 r12, r12, r13
        shfl.bfly.b64 r13, r12, 4
        add.f32 r12, r12, r13
        shfl.bfly.b64 r13, r12, 2
        add.f32 r12, r12, r13
        shfl.bfly.b64 r13, r12, 1
        add.f32 r12, r12, r13           // r12 = the warp's sum, in every lane

        // ---- 3. across warps through the scratchpad
        s2r     r14, %laneid
        s2r     r15, %warpid
        setp.eq.i64 p1, r14, 0
        shl.b64 r16, r15, 2             // this warp's slot: warpid*4
   @p1  st.shared.b32 [r16], r12
        bar.sync                        // every partial is written (all warps get here)
        setp.ne.i64 p2, r15, 0
   @p2  exit                            // only warp 0 goes on; no barrier follows
        s2r     r17, %nwarpid
        setp.lt.i64 p3, r14, r17        // lane < number of warps: that lane owns a partial
        shl.b64 r18, r14, 2
        mov.f32 r19, 0.0
   @p3  ld.shared.b32 r19, [r18]
        shfl.bfly.b64 r13, r19, 16
        add.f32 r19, r19, r13
        shfl.bfly.b64 r13, r19, 8
        add.f32 r19, r19, r13
        shfl.bfly.b64 r13, r19, 4
        add.f32 r19, r19, r13
        shfl.bfly.b64 r13, r19, 2
        add.f32 r19, r19, r13
        shfl.bfly.b64 r13, r19, 1
        add.f32 r19, r19, r13           // r19 = the block's sum
        ldparam r20, out
        shl.b64 r21, r2, 2
        add.i64 r20, r20, r21
   @p1  st.global.b32 [r20], r19        // lane 0: out[ctaid.x]
        exit
