// vector_add.s -- out[i] = x[i] + y[i] for i < n, all f32.
//
// The "hello world" of the archsim ISA. It shows the parts every kernel has: parameters read
// with ldparam, the thread's global index built from special registers, 64-bit address
// arithmetic, a predicated exit, and a loop.
//
// Work split: a grid-stride loop. Thread g = ctaid.x*ntid.x + tid.x handles elements
// g, g + S, g + 2S, ... where S = nctaid.x*ntid.x is the number of threads in the launch. Any
// n works with any launch (n need not be a multiple of anything): the loop test is the bounds
// check. Consecutive lanes touch consecutive 4-byte words, so every warp load is coalesced.
//
// Registers are 64 bits; an f32 value lives in the low 32 bits (ld.global.b32 zero-extends).

.kernel vector_add
.param x                        // f32[n]  (buffer base address)
.param y                        // f32[n]
.param out                      // f32[n]
.param n                        // element count (scalar)
.launch grid=4 block=128        // 512 threads for 1000 elements: some threads loop twice
.arg x f32[1000] random
.arg y f32[1000] random
.arg out f32[1000] zeros
.arg n = 1000

        s2r     r0, %ctaid.x
        s2r     r1, %ntid.x
        s2r     r2, %tid.x
        mad.i64 r3, r0, r1, r2          // r3 = i = ctaid.x*ntid.x + tid.x
        s2r     r4, %nctaid.x
        mul.i64 r4, r4, r1              // r4 = S = threads in the grid (the stride)
        ldparam r5, n
        ldparam r6, x
        ldparam r7, y
        ldparam r8, out

LOOP:   setp.ge.i64 p0, r3, r5          // i >= n ?
   @p0  exit                            // those lanes are done; the others go on
        shl.b64 r9, r3, 2               // byte offset i*4
        add.i64 r10, r6, r9
        ld.global.b32 r11, [r10]        // x[i]
        add.i64 r10, r7, r9
        ld.global.b32 r12, [r10]        // y[i]
        add.f32 r13, r11, r12
        add.i64 r10, r8, r9
        st.global.b32 [r10], r13        // out[i] = x[i] + y[i]
        add.i64 r3, r3, r4              // i += S
        bra     LOOP
