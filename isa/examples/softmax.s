// softmax.s -- row softmax of an f32 matrix x[rows, cols] (row-major) into out[rows, cols]:
//     out[r, j] = exp(x[r, j] - m_r) / sum_k exp(x[r, k] - m_r),   m_r = max_k x[r, k]
//
// One warp per row; a block of W warps handles W consecutive rows, so launch
// grid = ceil(rows / (ntid.x/32)). A warp whose row is past the end leaves at once (the kernel
// has no barrier, so a warp may exit on its own). Inside a row, lane l visits columns
// l, l+32, l+64, ...: cols is any positive number, not necessarily a multiple of 32.
//
// Three passes over the row, as in a numerically stable softmax:
//   1. m = max of the row      (per-lane max, then a butterfly of max.f32 across the warp)
//   2. e = 2^((x - m)*log2 e)  (ex2.f32: the ISA's exponential is base 2, so scale by log2 e;
//                               x - m <= 0 so e is in (0, 1] and nothing overflows), written
//                               to out; s = sum of e (per lane, then a butterfly of add.f32)
//   3. out = e * (1/s)          (one rcp.f32 per row, then a multiply per element)
// Every lane of the warp ends each butterfly holding the full result, so no broadcast is needed.
//
// Needs warp width 32 and ntid.x a multiple of 32 (a lane that never runs would feed its zero
// register into the max).

.kernel softmax
.param x                        // f32[rows, cols]
.param out                      // f32[rows, cols]
.param rows
.param cols
.launch grid=3 block=128        // 4 rows per block: 12 rows, 10 used
.arg x f32[10,100] random
.arg out f32[10,100] zeros
.arg rows = 10
.arg cols = 100

        s2r     r0, %ctaid.x
        s2r     r1, %nwarpid
        s2r     r2, %warpid
        mad.i64 r3, r0, r1, r2          // r3 = row = ctaid.x*nwarpid + warpid
        ldparam r4, rows
        setp.ge.i64 p0, r3, r4
   @p0  exit                            // the whole warp: no row for it
        s2r     r5, %laneid
        ldparam r6, cols
        mul.i64 r7, r3, r6
        shl.b64 r7, r7, 2               // r7 = row*cols*4: byte offset of the row
        shl.b64 r8, r6, 2               // r8 = cols*4: bytes in a row
        shl.b64 r5, r5, 2               // r5 = lane*4: this lane's first column, in bytes
        ldparam r9, x
        add.i64 r9, r9, r7              // r9  = &x[row, 0]
        add.i64 r10, r9, r8             // r10 = &x[row, cols]   (end of the row)
        ldparam r11, out
        add.i64 r11, r11, r7            // r11 = &out[row, 0]
        add.i64 r12, r11, r8            // r12 = &out[row, cols]

        // ---- pass 1: row maximum
        mov.f32 r13, -inf               // r13 = running max of this lane
        add.i64 r14, r9, r5             // r14 = &x[row, lane]
MAX:    setp.ge.i64 p1, r14, r10
   @p1  bra     MAXRED
        ld.global.b32 r15, [r14]
        max.f32 r13, r13, r15
        add.i64 r14, r14, 128           // next column for this lane: +32 columns
        bra     MAX
MAXRED: shfl.bfly.b64 r15, r13, 16
        max.f32 r13, r13, r15
        shfl.bfly.b64 r15, r13, 8
        max.f32 r13, r13, r15
        shfl.bfly.b64 r15, r13, 4
        max.f32 r13, r13, r15
        shfl.bfly.b64 r15, r13, 2
        max.f32 r13, r13, r15
        shfl.bfly.b64 r15, r13, 1
        max.f32 r13, r13, r15           // r13 = m, in every lane

        // ---- pass 2: e = exp(x - m) = 2^((x - m)*log2 e), stored to out; s = sum of e
        mov.f32 r16, 0.0                // r16 = running sum of this lane
        add.i64 r14, r9, r5             // r14 = &x[row, lane]
        add.i64 r17, r11, r5            // r17 = &out[row, lane]
EXP:    setp.ge.i64 p1, r14, r10
   @p1  bra     SUMRED
        ld.global.b32 r15, [r14]
        sub.f32 r15, r15, r13           // x - m  (<= 0)
        mul.f32 r15, r15, 1.4426950408889634   // * log2(e)
        ex2.f32 r15, r15
        add.f32 r16, r16, r15
        st.global.b32 [r17], r15
        add.i64 r14, r14, 128
        add.i64 r17, r17, 128
        bra     EXP
SUMRED: shfl.bfly.b64 r15, r16, 16
        add.f32 r16, r16, r15
        shfl.bfly.b64 r15, r16, 8
        add.f32 r16, r16, r15
        shfl.bfly.b64 r15, r16, 4
        add.f32 r16, r16, r15
        shfl.bfly.b64 r15, r16, 2
        add.f32 r16, r16, r15
        shfl.bfly.b64 r15, r16, 1
        add.f32 r16, r16, r15           // r16 = s (>= 1: the max element contributes 2^0)
        rcp.f32 r16, r16                // r16 = 1/s

        // ---- pass 3: normalise in place in out (each lane rereads only what it wrote)
        add.i64 r17, r11, r5
NORM:   setp.ge.i64 p1, r17, r12
   @p1  bra     DONE
        ld.global.b32 r15, [r17]
        mul.f32 r15, r15, r16
        st.global.b32 [r17], r15
        add.i64 r17, r17, 128
        bra     NORM
DONE:   exit                            // loops leave by a branch to one final exit: the lanes
                                        // that finish early wait here for the others
