// gemm_ffma.s -- C[M,N] = A[M,K] @ B[K,N], all f32 row-major, on the vector FMA units: the
// fallback GEMM for a machine (or a dtype) without tensor units.
//
// REQUIREMENTS: M and N multiples of 64, K a multiple of 16; launch grid = (N/64, M/64),
// block = 256 threads.
//
// The classic shared-memory SGEMM:
//   - block tile 64 x 64 of C, K stepped in tiles of BK = 16;
//   - the 256 threads form a 16 x 16 grid (tx = tid%16, ty = tid/16); thread (tx, ty) owns the
//     4 x 4 micro-tile C[m0 + 4ty .. +4, n0 + 4tx .. +4] in 16 registers;
//   - per k tile, each thread loads 4 floats of A (one 16-byte load) and 4 floats of B into the
//     scratchpad; A is stored transposed, As[k][m], so that a thread's 4 rows at one k are 4
//     consecutive words (one 16-byte scratchpad load, like B's 4 columns);
//   - the inner loop walks k = 0..15: two ld.shared.v4.b32 (a column of A, a row of B) feed
//     16 fma.f32 (an outer product): 16 FMAs per 2 scratchpad loads.
// Single-buffered: bar.sync after the tile is stored (so it is complete) and after the inner
// loop (so nobody overwrites it while another warp still reads it).
//
// Scratchpad: As 16 x 64 f32 (bytes 0..4095, As[k][m] at 256k + 4m), Bs 16 x 64 f32 (bytes
// 4096..8191, Bs[k][n] at 4096 + 256k + 4n).

.kernel gemm_ffma
.param A                        // f32[M, K]
.param B                        // f32[K, N]
.param C                        // f32[M, N] (written)
.param M
.param N
.param K
.shared 8192
.launch grid=2,2 block=256
.arg A f32[128,64] random
.arg B f32[64,128] random
.arg C f32[128,128] zeros
.arg M = 128
.arg N = 128
.arg K = 64

        s2r     r0, %tid.x
        and.b64 r1, r0, 15              // r1 = tx
        shr.u64 r2, r0, 4               // r2 = ty
        s2r     r3, %ctaid.x
        shl.b64 r3, r3, 6               // r3 = n0
        s2r     r4, %ctaid.y
        shl.b64 r4, r4, 6               // r4 = m0
        ldparam r5, N
        ldparam r6, K
        ldparam r28, M
        setp.ge.i64 p0, r4, r28         // blocks past the matrix leave whole, before any barrier
   @p0  exit
        setp.ge.i64 p0, r3, r5
   @p0  exit
        ldparam r7, A
        ldparam r8, B
        ldparam r9, C

        // A tile (64 x 16): thread t loads A[m0 + t/4, k0 + 4(t%4) .. +4] and stores it to
        // As[4(t%4) + j][t/4], j = 0..3
        shr.u64 r10, r0, 2              // arow
        and.b64 r11, r0, 3              // acol4
        add.i64 r12, r4, r10
        mul.i64 r12, r12, r6
        shl.b64 r13, r11, 2
        add.i64 r12, r12, r13
        shl.b64 r12, r12, 2
        add.i64 r12, r7, r12            // r12 = &A[m0 + arow, 4*acol4]      (k tile 0)
        shl.b64 r13, r11, 10            // 4*acol4 rows of As = 1024*acol4 bytes
        shl.b64 r14, r10, 2
        add.i64 r13, r13, r14           // r13 = &As[4*acol4][arow]
        // B tile (16 x 64): thread t loads B[k0 + t/16, n0 + 4(t%16) .. +4], stores it as is
        shr.u64 r14, r0, 4              // brow
        and.b64 r15, r0, 15             // bcol4
        mul.i64 r16, r14, r5
        add.i64 r16, r16, r3
        shl.b64 r17, r15, 2
        add.i64 r16, r16, r17
        shl.b64 r16, r16, 2
        add.i64 r16, r8, r16            // r16 = &B[brow, n0 + 4*bcol4]      (k tile 0)
        shl.b64 r17, r5, 6              // r17 = 16 rows of B = 16*N*4 bytes: B step per k tile
        shl.b64 r18, r14, 8
        shl.b64 r19, r15, 4
        add.i64 r18, r18, r19
        add.i64 r18, r18, 4096          // r18 = &Bs[brow][4*bcol4]
        // what this thread reads in the inner loop, at k = 0
        shl.b64 r20, r2, 4              // r20 = &As[0][4ty]
        shl.b64 r21, r1, 4
        add.i64 r21, r21, 4096          // r21 = &Bs[0][4tx]
        add.i64 r30, r20, 4096          // r30 = &As[16][4ty]: end of the inner loop

        mov.f32 r32, 0.0                // acc[i][j] = r(32 + 4i + j): row i, column j of the micro-tile
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
        shr.u64 r22, r6, 4              // r22 = k tiles left = K/16

KLOOP:  ld.global.v4.b32 r24, [r12]     // 4 of A (along k)
        ld.global.v4.b32 r48, [r16]     // 4 of B (along n)
        st.shared.b32 [r13], r24        // transposed: As[4*acol4 + j][arow]
        st.shared.b32 [r13+256], r25
        st.shared.b32 [r13+512], r26
        st.shared.b32 [r13+768], r27
        st.shared.v4.b32 [r18], r48
        bar.sync                        // the tile is complete
        mov.b64 r23, r20
        mov.b64 r29, r21
INNER:  ld.shared.v4.b32 r52, [r23]     // As[k][4ty .. +4]: a0..a3 (r52..r55)
        ld.shared.v4.b32 r56, [r29]     // Bs[k][4tx .. +4]: b0..b3 (r56..r59)
        fma.f32 r32, r52, r56, r32
        fma.f32 r33, r52, r57, r33
        fma.f32 r34, r52, r58, r34
        fma.f32 r35, r52, r59, r35
        fma.f32 r36, r53, r56, r36
        fma.f32 r37, r53, r57, r37
        fma.f32 r38, r53, r58, r38
        fma.f32 r39, r53, r59, r39
        fma.f32 r40, r54, r56, r40
        fma.f32 r41, r54, r57, r41
        fma.f32 r42, r54, r58, r42
        fma.f32 r43, r54, r59, r43
        fma.f32 r44, r55, r56, r44
        fma.f32 r45, r55, r57, r45
        fma.f32 r46, r55, r58, r46
        fma.f32 r47, r55, r59, r47
        add.i64 r23, r23, 256           // k + 1
        add.i64 r29, r29, 256
        setp.lt.i64 p1, r23, r30
   @p1  bra     INNER
        bar.sync                        // everyone is done with the tile
        add.i64 r12, r12, 64            // A: 16 columns on
        add.i64 r16, r16, r17           // B: 16 rows down
        sub.i64 r22, r22, 1
        setp.gt.i64 p1, r22, 0
   @p1  bra     KLOOP

        // epilogue: 4 rows of 4 f32, one 16-byte store each
        shl.b64 r10, r2, 2
        add.i64 r10, r10, r4            // row = m0 + 4ty
        shl.b64 r11, r1, 2
        add.i64 r11, r11, r3            // col = n0 + 4tx
        mad.i64 r10, r10, r5, r11
        shl.b64 r10, r10, 2
        add.i64 r10, r9, r10            // &C[row, col]
        shl.b64 r11, r5, 2              // one row of C = N*4 bytes
        st.global.v4.b32 [r10], r32
        add.i64 r10, r10, r11
        st.global.v4.b32 [r10], r36
        add.i64 r10, r10, r11
        st.global.v4.b32 [r10], r40
        add.i64 r10, r10, r11
        st.global.v4.b32 [r10], r44
        exit
