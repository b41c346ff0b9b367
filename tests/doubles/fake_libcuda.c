/* A stand-in for libcuda's eight per-command entry points (tests/test_cshim.py): each records its
 * arguments, and returns what the test set, so the test sees what backends/cuda/cshim.c passed. */
#include <stddef.h>
#include <string.h>

typedef void *P;
unsigned long long lf_fake_args[16];
int lf_fake_calls;
int lf_fake_result;
unsigned long long lf_fake_ptr = 0xdeadbeef000ULL;

static void note(int n, const unsigned long long *v) {
    memset(lf_fake_args, 0, sizeof lf_fake_args);
    memcpy(lf_fake_args, v, (size_t)n * sizeof *v);
    lf_fake_calls++;
}

int cuLaunchKernel(P f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, P s, P *params, P *extra) {
    unsigned long long v[] = {(unsigned long long)f, gx, gy, gz, bx, by, bz, smem, (unsigned long long)s,
                              (unsigned long long)params, (unsigned long long)extra,
                              params ? *(unsigned long long *)params[0] : 0};
    note(12, v);
    return lf_fake_result;
}
int cuEventRecord(P e, P s) { unsigned long long v[] = {(unsigned long long)e, (unsigned long long)s}; note(2, v); return lf_fake_result; }
int cuEventQuery(P e) { unsigned long long v[] = {(unsigned long long)e}; note(1, v); return lf_fake_result; }
int cuStreamWaitEvent(P s, P e, unsigned fl) {
    unsigned long long v[] = {(unsigned long long)s, (unsigned long long)e, fl}; note(3, v); return lf_fake_result;
}
int cuMemAllocFromPoolAsync(unsigned long long *out, size_t n, P pool, P s) {
    unsigned long long v[] = {n, (unsigned long long)pool, (unsigned long long)s}; note(3, v);
    *out = lf_fake_ptr;
    return lf_fake_result;
}
int cuMemFreeAsync(unsigned long long p, P s) { unsigned long long v[] = {p, (unsigned long long)s}; note(2, v); return lf_fake_result; }
int cuMemcpyDtoDAsync_v2(unsigned long long d, unsigned long long src, size_t n, P s) {
    unsigned long long v[] = {d, src, n, (unsigned long long)s}; note(4, v); return lf_fake_result;
}
int cuMemcpyHtoDAsync_v2(unsigned long long d, const void *src, size_t n, P s) {
    unsigned long long v[] = {d, (unsigned long long)src, n, (unsigned long long)s, n ? *(const unsigned char *)src : 0};
    note(5, v);
    return lf_fake_result;
}
