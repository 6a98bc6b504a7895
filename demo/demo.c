/* burstyd's bundled demo target: a small CPU-bound program with a known
 * shape, built with -O2 -fomit-frame-pointer so that profiles must come from
 * CFI unwinding, not frame pointers.
 *
 *   main -> run_workload -> hash_blocks -> mix
 *                        -> sort_records -> qsort (libc) -> cmp_records -> strcmp
 *                                        -> snprintf (libc)
 *                        -> matmul
 *
 * About 3 s of CPU at the default scale (argument 1, default 8).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

static uint64_t state = 88172645463325252ull;
static uint64_t next_rand(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

NOINLINE static uint64_t mix(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        v = (v << 7) | (v >> 57);
    }
    return h;
}

NOINLINE static uint64_t hash_blocks(const uint64_t *buf, size_t n, int rounds) {
    uint64_t h = 0;
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < n; i++)
            h = mix(h, buf[i]);
    return h;
}

struct record { uint64_t key; char name[24]; };

NOINLINE static int cmp_records(const void *a, const void *b) {
    const struct record *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return strcmp(x->name, y->name);
}

NOINLINE static uint64_t sort_records(size_t n, int rounds) {
    struct record *r = malloc(n * sizeof *r);
    uint64_t sum = 0;
    for (int k = 0; k < rounds; k++) {
        for (size_t i = 0; i < n; i++) {
            r[i].key = next_rand() % 1000;
            snprintf(r[i].name, sizeof r[i].name, "rec%zu", i);
        }
        qsort(r, n, sizeof *r, cmp_records);
        sum += r[n / 2].key;
    }
    free(r);
    return sum;
}

NOINLINE static double matmul(int n, int rounds) {
    double *a = malloc(sizeof(double) * n * n), *b = malloc(sizeof(double) * n * n),
           *c = calloc((size_t)n * n, sizeof(double));
    for (int i = 0; i < n * n; i++) { a[i] = (double)(i % 7); b[i] = (double)(i % 5); }
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++)
            for (int k = 0; k < n; k++)
                for (int j = 0; j < n; j++)
                    c[i * n + j] += a[i * n + k] * b[k * n + j];
    double t = c[n + 1];
    free(a); free(b); free(c);
    return t;
}

NOINLINE static void run_workload(int scale) {
    static uint64_t buf[4096];
    for (size_t i = 0; i < 4096; i++) buf[i] = next_rand();
    uint64_t h = hash_blocks(buf, 4096, 900 * scale);
    uint64_t s = sort_records(200000, 4 * scale);
    double m = matmul(200, 6 * scale);
    printf("hash=%016llx sort=%llu matmul=%.1f\n", (unsigned long long)h,
           (unsigned long long)s, m);
}

int main(int argc, char **argv) {
    int scale = argc > 1 ? atoi(argv[1]) : 8;
    run_workload(scale > 0 ? scale : 1);
    return 0;
}
