// One MUL_MAT node of test-backend-ops' perf shapes (q4_0 weights 4096 x 14336, one f32
// column: a token's mat-vec), computed on the CPU backend with `threads` threads (what
// test-backend-ops gives the CPU: half the hardware's), `runs` times: traced
// with per-thread op timing, its node wall times are compared with `test-backend-ops perf` for
// the same shape (bench/run.py).
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 20;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    const int64_t m = 4096, n = 1, k = 14336;
    struct ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, k, m);
    struct ggml_tensor *b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    struct ggml_tensor *c = ggml_mul_mat(ctx, a, b);
    struct ggml_cgraph *g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, c);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, threads);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    // Weights: q4_0 blocks of a scale (f16 1.0) and random nibbles; the column: random floats.
    size_t nb = ggml_nbytes(a);
    unsigned char *w = malloc(nb);
    for (size_t i = 0; i < nb; i++) w[i] = (unsigned char)rand();
    for (size_t i = 0; i < nb; i += 18) { w[i] = 0x00; w[i + 1] = 0x3c; }
    ggml_backend_tensor_set(a, w, 0, nb);
    float *x = malloc(ggml_nbytes(b));
    for (int64_t i = 0; i < k * n; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    ggml_backend_tensor_set(b, x, 0, ggml_nbytes(b));
    for (int r = 0; r < runs; r++) ggml_backend_graph_compute(cpu, g);
    float out;
    ggml_backend_tensor_get(c, &out, 0, sizeof out);
    printf("runs=%d threads=%d first=%g\n", runs, threads, out);
    ggml_backend_buffer_free(buf);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    free(w);
    free(x);
    return 0;
}
