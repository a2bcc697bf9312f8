// gemm_mma.s -- C[M,N] (f32) = A[M,K] (f16, row-major) @ B[K,N] (f16, row-major), on the tensor
// units with mma.m16n8k16.f32.f16 (fp16 products, fp32 accumulation).
//
// REQUIREMENTS: M and N multiples of 64, K a multiple of 32 (no edge tiles are handled);
// launch grid = (N/64, M/64), block = 128 threads (4 warps); warp width 32 (ldmatrix and mma
// need it). Scratchpad: 16 KiB.
//
// Tiling, as a CUDA programmer writes an Ampere-style GEMM:
//   - thread-block tile 64 x 64 of C, K stepped in tiles of BK = 32; block (x, y) owns
//     C[64y .. 64y+64, 64x .. 64x+64];
//   - 4 warps in a 2 x 2 grid (warp w: wm = w/2, wn = w%2), each owning a 32 x 32 piece of
//     the block tile: 2 (m16) x 4 (n8) mma tiles, so 8 accumulators of 4 f32 registers
//     (32 registers, r32..r63);
//   - per BK tile each warp does 2 k16 steps of 8 mma each.
//
// Scratchpad: two stages of 8192 bytes (double buffering): stage s at 8192*s, `xor 8192`
// flips between them. In a stage:
//   A tile 64 rows (m) x 32 halves (k): 64 bytes a row, at bytes 0 .. 4095
//   B tile 32 rows (k) x 64 halves (n): 128 bytes a row, at bytes 4096 .. 8191
// Rows are stored in 16-byte chunks (8 halves: what one cp.async.16 moves and one ldmatrix
// lane addresses). With plain rows, the 8 row addresses of an ldmatrix would hit the same
// banks (a B row is exactly 32 banks wide): 8-way bank conflicts. So the chunks are XOR
// swizzled, as CUTLASS does (padding rows by 8 halves would also work but needs 19 KiB):
//   A: logical chunk c (0..3) of row r is stored at chunk c ^ ((r/2) % 4)
//   B: logical chunk c (0..7) of row k is stored at chunk c ^ (k % 8)
// Then the 8 rows of every ldmatrix fall on 8 different 4-bank groups: no conflict. Every
// address below is computed with the swizzle; moving to the next 16 k (A) or the next 16 n (B)
// flips logical chunk bit 1, which is the address bit 5: `xor 32`.
//
// Pipeline (the K loop, one iteration per k tile kt; tile 0 is copied before the loop):
//   1. start copying tile kt+1 into the other stage: cp.async.16, each of the 128 threads
//      moving 2 x 16 bytes of A and 2 x 16 bytes of B; close a commit group (an empty one on
//      the last iteration, so that the group count stays regular);
//   2. cp.async.wait 1 (all groups but the newest are done: tile kt has landed), then
//      bar.sync (every thread's copies of tile kt are done, for every warp);
//   3. compute on tile kt: ldmatrix.x4 loads the A fragments (16 x 16 each),
//      ldmatrix.x4.trans the B fragments (B is stored k-major, n along the row; the mma wants
//      each lane's two halves along k: .trans transposes the 8x8 matrices on the way), then
//      the mma;
//   4. bar.sync: nobody may overwrite this stage (next iteration's step 1) while a warp still
//      reads it.
// So the copy of tile kt+1 runs while tile kt is multiplied.
//
// ldmatrix addressing: lane L gives the address of row L%8 of matrix L/8. For A (x4) the four
// 8x8 matrices are (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15): the
// a0..a3 registers of the m16n8k16 A fragment, so lane L points at row L%16, logical chunk
// L/16. For B (x4.trans) they are (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
// (k 8-15, n 8-15): the b0, b1 registers of two neighbouring n8 tiles, so lane L points at
// k-row L%16, logical chunk L/16 (of the warp's n range) -- the same formula.
//
// Epilogue: accumulator register j of lane L (g = L/4, t = L%4) holds C element
// (g + 8*(j/2), 2t + j%2) of its 16 x 8 tile, so registers (0,1) and (2,3) are two adjacent
// f32 each: one 8-byte st.global.v2.b32 per pair.

.kernel gemm_mma
.param A                        // f16[M, K] row-major
.param B                        // f16[K, N] row-major
.param C                        // f32[M, N] row-major (written)
.param M
.param N
.param K
.shared 16384                   // 2 stages x (4096 A + 4096 B) bytes
.launch grid=2,2 block=128
.arg A f16[128,64] random
.arg B f16[64,128] random
.arg C f32[128,128] zeros
.arg M = 128
.arg N = 128
.arg K = 64

        s2r     r0, %tid.x
        s2r     r1, %laneid
        s2r     r2, %warpid
        s2r     r3, %ctaid.x
        shl.b64 r3, r3, 6               // r3 = n0 = 64*ctaid.x: first column of the block tile
        s2r     r4, %ctaid.y
        shl.b64 r4, r4, 6               // r4 = m0 = 64*ctaid.y: first row
        ldparam r5, N
        ldparam r6, K
        ldparam r28, M
        setp.ge.i64 p0, r4, r28         // a block past the matrix leaves as a whole,
   @p0  exit                            // before any barrier
        setp.ge.i64 p0, r3, r5
   @p0  exit
        ldparam r7, A
        ldparam r8, B
        ldparam r9, C

        // ---- copy addresses. A tile: 64 rows x 4 chunks = 256 chunks, 2 per thread: thread t
        // copies logical chunk t%4 of rows t/4 and t/4 + 32 (both have the same swizzle).
        shr.u64 r24, r0, 2              // arow = tid/4
        and.b64 r25, r0, 3              // achunk = tid%4
        add.i64 r26, r4, r24
        mul.i64 r26, r26, r6            // (m0 + arow)*K
        shl.b64 r27, r25, 3
        add.i64 r26, r26, r27           // + 8*achunk        (in halves)
        shl.b64 r26, r26, 1
        add.i64 r10, r7, r26            // r10 = &A[m0 + arow, 8*achunk]   (k tile 0)
        shl.b64 r27, r6, 6              // 32 rows of A = 32*K*2 bytes
        add.i64 r11, r10, r27           // r11 = &A[m0 + arow + 32, 8*achunk]
        shr.u64 r27, r24, 1
        and.b64 r27, r27, 3
        xor.b64 r25, r25, r27           // stored chunk = achunk ^ ((arow/2) % 4)
        shl.b64 r14, r24, 6
        shl.b64 r27, r25, 4
        add.i64 r14, r14, r27           // r14 = arow*64 + 16*stored chunk   (in a stage)
        // B tile: 32 rows x 8 chunks = 256 chunks: thread t copies logical chunk t%8 of rows
        // t/8 and t/8 + 16 (same swizzle).
        shr.u64 r24, r0, 3              // brow = tid/8
        and.b64 r25, r0, 7              // bchunk = tid%8
        mul.i64 r26, r24, r5            // brow*N
        add.i64 r26, r26, r3            // + n0
        shl.b64 r27, r25, 3
        add.i64 r26, r26, r27           // + 8*bchunk
        shl.b64 r26, r26, 1
        add.i64 r12, r8, r26            // r12 = &B[brow, n0 + 8*bchunk]   (k tile 0)
        shl.b64 r27, r5, 5              // 16 rows of B = 16*N*2 bytes
        add.i64 r13, r12, r27           // r13 = &B[brow + 16, n0 + 8*bchunk]
        and.b64 r27, r24, 7
        xor.b64 r25, r25, r27           // stored chunk = bchunk ^ (brow % 8)
        shl.b64 r15, r24, 7
        shl.b64 r27, r25, 4
        add.i64 r15, r15, r27
        add.i64 r15, r15, 4096          // r15 = 4096 + brow*128 + 16*stored chunk
        shl.b64 r21, r5, 6              // r21 = 32 rows of B = 32*N*2 bytes: B step per k tile

        // ---- ldmatrix addresses (in a stage), for the first k16 step
        and.b64 r24, r1, 15             // lane%16: the row (A) / k-row (B) this lane points at
        shr.u64 r25, r1, 4              // lane/16: its logical chunk
        shr.u64 r26, r2, 1              // wm
        shl.b64 r26, r26, 5
        add.i64 r26, r26, r24           // A row = 32*wm + lane%16
        shr.u64 r27, r24, 1
        and.b64 r27, r27, 3
        xor.b64 r27, r27, r25           // stored chunk = lane/16 ^ ((row/2) % 4)
        shl.b64 r16, r26, 6
        shl.b64 r27, r27, 4
        add.i64 r16, r16, r27           // r16 = A fragment address (rows 32*wm .., k 0..15)
        and.b64 r26, r2, 1              // wn
        shl.b64 r26, r26, 2
        add.i64 r26, r26, r25           // logical chunk of B = 4*wn + lane/16
        and.b64 r27, r24, 7
        xor.b64 r26, r26, r27           // stored chunk = that ^ (k-row % 8)
        shl.b64 r17, r24, 7
        shl.b64 r26, r26, 4
        add.i64 r17, r17, r26
        add.i64 r17, r17, 4096          // r17 = B fragment address (k 0..15, n 32*wn .. +15)

        // ---- accumulators
        mov.f32 r32, 0.0                // acc[mi][ni] = r(32 + 16*mi + 4*ni), 4 registers each
        mov.f32 r33, 0.0
        mov.f32 r34, 0.0
        mov.f32 r35, 0.0
        mov.f32 r36, 0.0
        mov.f32 r37, 0.0
        mov.f32 r38, 0.0
        mov.f32 r39, 0.0
        mov.f32 r40, 0.0
        mov.f32 r41, 0.0
        mov.f32 r42, 0.0
        mov.f32 r43, 0.0
        mov.f32 r44, 0.0
        mov.f32 r45, 0.0
        mov.f32 r46, 0.0
        mov.f32 r47, 0.0
        mov.f32 r48, 0.0
        mov.f32 r49, 0.0
        mov.f32 r50, 0.0
        mov.f32 r51, 0.0
        mov.f32 r52, 0.0
        mov.f32 r53, 0.0
        mov.f32 r54, 0.0
        mov.f32 r55, 0.0
        mov.f32 r56, 0.0
        mov.f32 r57, 0.0
        mov.f32 r58, 0.0
        mov.f32 r59, 0.0
        mov.f32 r60, 0.0
        mov.f32 r61, 0.0
        mov.f32 r62, 0.0
        mov.f32 r63, 0.0

        // ---- prologue: tile 0 -> stage 0
        cp.async.16 [r14], [r10]
        cp.async.16 [r14+2048], [r11]   // +32 rows of 64 bytes
        cp.async.16 [r15], [r12]
        cp.async.16 [r15+2048], [r13]   // +16 rows of 128 bytes
        cp.async.commit
        shr.u64 r20, r6, 5              // r20 = number of k tiles = K/32
        mov.b64 r19, 1                  // r19 = next tile to load (= the one computed + 1)
        mov.b64 r18, 0                  // r18 = stage being computed (0 or 8192)

        // ---- main loop, one iteration per k tile
KLOOP:  setp.lt.i64 p0, r19, r20        // is there a next tile?
        add.i64 r10, r10, 64            // A: 32 columns further (64 bytes)
        add.i64 r11, r11, 64
        add.i64 r12, r12, r21           // B: 32 rows further
        add.i64 r13, r13, r21
        xor.b64 r22, r18, 8192          // the other stage
        add.i64 r24, r22, r14
        add.i64 r25, r22, r15
   @p0  cp.async.16 [r24], [r10]
   @p0  cp.async.16 [r24+2048], [r11]
   @p0  cp.async.16 [r25], [r12]
   @p0  cp.async.16 [r25+2048], [r13]
        cp.async.commit
        cp.async.wait 1                 // tile r19-1 has landed (only the prefetch may pend)
        bar.sync                        // ... for every thread of the block
        add.i64 r22, r18, r16           // A fragments, k 0..15 of the tile
        xor.b64 r23, r22, 32            //              k 16..31 (logical chunk + 2)
        add.i64 r24, r18, r17           // B fragments, n +0..15 of the warp's 32
        xor.b64 r25, r24, 32            //              n +16..31 (logical chunk + 2)

        // k16 step 0 (k 0..15 of the tile)
        ldmatrix.x4 r64, [r22]                  // A rows 32*wm + 0..15
        ldmatrix.x4 r68, [r22+1024]             // A rows 32*wm + 16..31 (+16 rows of 64 bytes)
        ldmatrix.x4.trans r72, [r24]            // B n8 tiles 0, 1 (r72,r73 and r74,r75)
        ldmatrix.x4.trans r76, [r25]            // B n8 tiles 2, 3 (r76,r77 and r78,r79)
        mma.m16n8k16.f32.f16 r32, r64, r72, r32   // C rows +0, cols +0
        mma.m16n8k16.f32.f16 r36, r64, r74, r36   // C rows +0, cols +8
        mma.m16n8k16.f32.f16 r40, r64, r76, r40   // C rows +0, cols +16
        mma.m16n8k16.f32.f16 r44, r64, r78, r44   // C rows +0, cols +24
        mma.m16n8k16.f32.f16 r48, r68, r72, r48   // C rows +16, cols +0
        mma.m16n8k16.f32.f16 r52, r68, r74, r52   // C rows +16, cols +8
        mma.m16n8k16.f32.f16 r56, r68, r76, r56   // C rows +16, cols +16
        mma.m16n8k16.f32.f16 r60, r68, r78, r60   // C rows +16, cols +24

        // k16 step 1 (k 16..31): A's other chunk pair, B 16 rows down (+16*128 bytes)
        ldmatrix.x4 r64, [r23]
        ldmatrix.x4 r68, [r23+1024]
        ldmatrix.x4.trans r72, [r24+2048]
        ldmatrix.x4.trans r76, [r25+2048]
        mma.m16n8k16.f32.f16 r32, r64, r72, r32   // C rows +0, cols +0
        mma.m16n8k16.f32.f16 r36, r64, r74, r36   // C rows +0, cols +8
        mma.m16n8k16.f32.f16 r40, r64, r76, r40   // C rows +0, cols +16
        mma.m16n8k16.f32.f16 r44, r64, r78, r44   // C rows +0, cols +24
        mma.m16n8k16.f32.f16 r48, r68, r72, r48   // C rows +16, cols +0
        mma.m16n8k16.f32.f16 r52, r68, r74, r52   // C rows +16, cols +8
        mma.m16n8k16.f32.f16 r56, r68, r76, r56   // C rows +16, cols +16
        mma.m16n8k16.f32.f16 r60, r68, r78, r60   // C rows +16, cols +24

        bar.sync                        // all warps are done with this stage
        xor.b64 r18, r18, 8192          // compute on the other stage next
        add.i64 r19, r19, 1
        setp.le.i64 p1, r19, r20        // the tile just prefetched exists?
   @p1  bra     KLOOP

        // ---- epilogue: store the warp's 32 x 32 f32 tile
        shr.u64 r24, r1, 2              // g = lane/4
        and.b64 r25, r1, 3              // t = lane%4
        shr.u64 r26, r2, 1
        shl.b64 r26, r26, 5
        add.i64 r26, r26, r4
        add.i64 r26, r26, r24           // row = m0 + 32*wm + g
        and.b64 r27, r2, 1
        shl.b64 r27, r27, 5
        add.i64 r27, r27, r3
        shl.b64 r25, r25, 1
        add.i64 r27, r27, r25           // col = n0 + 32*wn + 2t
        mad.i64 r26, r26, r5, r27
        shl.b64 r26, r26, 2
        add.i64 r24, r9, r26            // r24 = &C[row, col]
        shl.b64 r25, r5, 5              // 8 rows of C = 8*N*4 bytes
        add.i64 r26, r24, r25           // r26 = &C[row + 8, col]
        add.i64 r27, r26, r25           // r27 = &C[row + 16, col]
        add.i64 r28, r27, r25           // r28 = &C[row + 24, col]
        // tile (mi, ni) is at rows +16*mi, columns +8*ni (+32 bytes)
        st.global.v2.b32 [r24], r32        // tile (0,0), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r26], r34        // tile (0,0), row g+8
        st.global.v2.b32 [r24+32], r36     // tile (0,1), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r26+32], r38     // tile (0,1), row g+8
        st.global.v2.b32 [r24+64], r40     // tile (0,2), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r26+64], r42     // tile (0,2), row g+8
        st.global.v2.b32 [r24+96], r44     // tile (0,3), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r26+96], r46     // tile (0,3), row g+8
        st.global.v2.b32 [r27], r48        // tile (1,0), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r28], r50        // tile (1,0), row g+8
        st.global.v2.b32 [r27+32], r52     // tile (1,1), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r28+32], r54     // tile (1,1), row g+8
        st.global.v2.b32 [r27+64], r56     // tile (1,2), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r28+64], r58     // tile (1,2), row g+8
        st.global.v2.b32 [r27+96], r60     // tile (1,3), row g:   cols 2t, 2t+1
        st.global.v2.b32 [r28+96], r62     // tile (1,3), row g+8
        exit
