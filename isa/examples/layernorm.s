// layernorm.s -- row layer normalisation of an f32 matrix x[rows, cols] (row-major):
//     mean_r = sum_j x[r, j] / cols
//     var_r  = sum_j (x[r, j] - mean_r)^2 / cols          (biased, as torch.nn.LayerNorm)
//     out[r, j] = (x[r, j] - mean_r) / sqrt(var_r + 1e-5) * gamma[j] + beta[j]
//
// One block per row (launch grid = rows; extra blocks leave at once); thread t of the block
// visits columns t, t+ntid, t+2*ntid, ... so cols is any positive number (not necessarily a
// multiple of 32 or of the block size). The variance is computed in a second pass over the
// row from the exact mean (two-pass), which is far more accurate in f32 than E[x^2] - mean^2.
//
// Each of the two sums is a block-wide reduction:
//   a. every thread adds its columns;
//   b. a butterfly of shfl.bfly (masks 16, 8, 4, 2, 1) gives every lane its warp's sum;
//   c. lane 0 of each warp writes that to the scratchpad, bar.sync;
//   d. every warp reads all the partials (lane l reads partial l, 0 past the last warp) and
//      runs the butterfly again, so every thread of the block ends with the block's sum.
// The two sums use different scratchpad slots (0..127 and 128..255), so no barrier is needed
// between reading the first and writing the second.
//
// Needs warp width 32 and ntid.x a multiple of 32, at most 1024: in step d every warp needs
// all 32 of its lanes to read the partials, and lanes past the block's last thread never run.
// A block whose row is out of range exits as a whole (before any barrier), so no warp is left
// waiting at bar.sync.

.kernel layernorm
.param x                        // f32[rows, cols]
.param gamma                    // f32[cols]
.param beta                     // f32[cols]
.param out                      // f32[rows, cols]
.param rows
.param cols
.shared 256                     // two sets of 32 f32 warp partials
.launch grid=8 block=128
.arg x f32[8,200] random
.arg gamma f32[200] random
.arg beta f32[200] random
.arg out f32[8,200] zeros
.arg rows = 8
.arg cols = 200

        s2r     r0, %ctaid.x            // r0 = row
        ldparam r1, rows
        setp.ge.i64 p0, r0, r1
   @p0  exit                            // uniform over the block: every warp leaves
        s2r     r2, %tid.x
        s2r     r3, %ntid.x
        s2r     r4, %laneid
        s2r     r5, %warpid
        s2r     r6, %nwarpid
        ldparam r7, cols
        mul.i64 r8, r0, r7
        shl.b64 r8, r8, 2               // r8 = row*cols*4
        ldparam r9, x
        add.i64 r9, r9, r8              // r9 = &x[row, 0]
        ldparam r10, out
        add.i64 r10, r10, r8            // r10 = &out[row, 0]
        shl.b64 r11, r2, 2              // r11 = tid*4: first column of this thread, in bytes
        shl.b64 r12, r7, 2              // r12 = cols*4: end of a row, in bytes
        shl.b64 r13, r3, 2              // r13 = ntid*4: the stride, in bytes
        setp.eq.i64 p1, r4, 0           // p1: lane 0 (writes the warp's partial)
        setp.lt.i64 p2, r4, r6          // p2: lane < nwarpid (reads a partial)
        shl.b64 r14, r5, 2              // r14 = warpid*4: this warp's slot
        shl.b64 r15, r4, 2              // r15 = laneid*4: the slot this lane reads
        cvt.f32.i64 r16, r7
        rcp.f32 r16, r16                // r16 = 1/cols

        // ---- pass 1: sum of x -> mean
        mov.f32 r17, 0.0
        mov.b64 r18, r11                // r18 = column offset j*4
SUM:    setp.ge.i64 p3, r18, r12
   @p3  bra     SUMW
        add.i64 r19, r9, r18
        ld.global.b32 r20, [r19]
        add.f32 r17, r17, r20
        add.i64 r18, r18, r13
        bra     SUM
SUMW:   shfl.bfly.b64 r20, r17, 16
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 8
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 4
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 2
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 1
        add.f32 r17, r17, r20           // the warp's sum
   @p1  st.shared.b32 [r14], r17
        bar.sync
        mov.f32 r17, 0.0
   @p2  ld.shared.b32 r17, [r15]        // partial of warp `lane`
        shfl.bfly.b64 r20, r17, 16
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 8
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 4
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 2
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 1
        add.f32 r17, r17, r20           // the block's sum, in every thread
        mul.f32 r21, r17, r16           // r21 = mean

        // ---- pass 2: sum of (x - mean)^2 -> variance
        mov.f32 r17, 0.0
        mov.b64 r18, r11
SQ:     setp.ge.i64 p3, r18, r12
   @p3  bra     SQW
        add.i64 r19, r9, r18
        ld.global.b32 r20, [r19]
        sub.f32 r20, r20, r21
        fma.f32 r17, r20, r20, r17      // += (x - mean)^2
        add.i64 r18, r18, r13
        bra     SQ
SQW:    shfl.bfly.b64 r20, r17, 16
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 8
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 4
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 2
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 1
        add.f32 r17, r17, r20
   @p1  st.shared.b32 [r14+128], r17    // second set of slots
        bar.sync
        mov.f32 r17, 0.0
   @p2  ld.shared.b32 r17, [r15+128]
        shfl.bfly.b64 r20, r17, 16
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 8
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 4
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 2
        add.f32 r17, r17, r20
        shfl.bfly.b64 r20, r17, 1
        add.f32 r17, r17, r20
        mul.f32 r17, r17, r16           // variance
        add.f32 r17, r17, 1e-5          // + eps
        rsqrt.f32 r22, r17              // r22 = 1/sqrt(var + eps)

        // ---- pass 3: out = (x - mean)*rstd*gamma + beta
        ldparam r23, gamma
        ldparam r24, beta
        mov.b64 r18, r11
NORM:   setp.ge.i64 p3, r18, r12
   @p3  bra     DONE
        add.i64 r19, r9, r18
        ld.global.b32 r20, [r19]
        add.i64 r19, r23, r18
        ld.global.b32 r25, [r19]        // gamma[j]
        add.i64 r19, r24, r18
        ld.global.b32 r26, [r19]        // beta[j]
        sub.f32 r20, r20, r21
        mul.f32 r20, r20, r22
        fma.f32 r20, r20, r25, r26
        add.i64 r19, r10, r18
        st.global.b32 [r19], r20
        add.i64 r18, r18, r13
        bra     NORM
DONE:   exit
