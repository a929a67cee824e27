/* A C program that leans on every allocator call memlend run moves to far
 * memory: malloc, calloc, realloc (grow, shrink, across the threshold),
 * posix_memalign, aligned_alloc, anonymous mmap (with a partial munmap),
 * free, and threads writing at once. It checks its own data as it goes and
 * prints one hash of everything it wrote, so a run under memlend must print
 * exactly what a plain run prints. Usage: far_heap TOTAL_MIB */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MIB (1UL << 20)
#define THREADS 4

static void die(const char *what) {
    fprintf(stderr, "far_heap: %s\n", what);
    exit(2);
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return x;
}

static void fill(uint64_t *p, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++) p[i] = mix(seed + i);
}

static uint64_t check(const uint64_t *p, size_t words, uint64_t seed, const char *what) {
    uint64_t h = seed;
    for (size_t i = 0; i < words; i++) {
        if (p[i] != mix(seed + i)) {
            fprintf(stderr, "far_heap: %s: word %zu differs\n", what, i);
            exit(3);
        }
        h = mix(h ^ p[i]);
    }
    return h;
}

struct job { size_t bytes; uint64_t seed; uint64_t hash; };

static void *worker(void *arg) {
    struct job *j = arg;
    uint64_t *p = malloc(j->bytes);
    if (!p) die("thread malloc");
    size_t words = j->bytes / 8;
    fill(p, words, j->seed);
    for (int pass = 0; pass < 2; pass++) j->hash = check(p, words, j->seed, "thread block");
    free(p);
    return NULL;
}

int main(int argc, char **argv) {
    size_t total = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) * MIB;
    uint64_t h = 0;

    /* Big blocks that together exceed any small local budget. */
    size_t nblocks = 8, bsize = total / nblocks;
    uint64_t *blocks[8];
    for (size_t i = 0; i < nblocks; i++) {
        if (!(blocks[i] = malloc(bsize))) die("malloc");
        fill(blocks[i], bsize / 8, 1000 + i);
    }
    for (size_t i = 0; i < nblocks; i++) h = mix(h ^ check(blocks[i], bsize / 8, 1000 + i, "block"));

    /* calloc must be zero, even where a freed block was. */
    free(blocks[3]);
    uint64_t *z = calloc(bsize / 8, 8);
    if (!z) die("calloc");
    for (size_t i = 0; i < bsize / 8; i++) if (z[i]) die("calloc memory is not zero");
    fill(z, bsize / 8, 77);

    /* realloc: grow (contents kept), shrink, then grow again. */
    uint64_t *r = realloc(blocks[5], 2 * bsize);
    if (!r) die("realloc grow");
    h = mix(h ^ check(r, bsize / 8, 1005, "realloc grow"));
    fill(r + bsize / 8, bsize / 8, 2005);
    r = realloc(r, bsize / 2);
    if (!r) die("realloc shrink");
    h = mix(h ^ check(r, bsize / 16, 1005, "realloc shrink"));
    r = realloc(r, 3 * bsize);
    if (!r) die("realloc regrow");
    h = mix(h ^ check(r, bsize / 16, 1005, "realloc regrow"));

    /* A small block grown past the threshold, and a big one shrunk below. */
    uint64_t *s = malloc(4096);
    fill(s, 512, 9);
    s = realloc(s, 4 * MIB);
    if (!s) die("realloc small to big");
    h = mix(h ^ check(s, 512, 9, "small grown big"));
    if (malloc_usable_size(s) < 4 * MIB) die("malloc_usable_size too small");

    /* Aligned allocations. */
    void *a1 = NULL;
    if (posix_memalign(&a1, 1 << 21, 3 * MIB) || ((uintptr_t)a1 & ((1 << 21) - 1))) die("posix_memalign");
    void *a2 = aligned_alloc(65536, 2 * MIB);
    if (!a2 || ((uintptr_t)a2 & 65535)) die("aligned_alloc");
    fill(a1, 3 * MIB / 8, 31);
    fill(a2, 2 * MIB / 8, 32);

    /* Anonymous mmap, its middle unmapped, the ends still good. */
    size_t mlen = 8 * MIB;
    uint64_t *m = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap");
    fill(m, mlen / 8, 55);
    if (munmap((char *)m + 2 * MIB, 4 * MIB)) die("munmap middle");
    h = mix(h ^ check(m, 2 * MIB / 8, 55, "mmap head"));
    h = mix(h ^ check(m + 6 * MIB / 8, 2 * MIB / 8, 55 + 6 * MIB / 8, "mmap tail"));
    if (munmap(m, 2 * MIB) || munmap((char *)m + 6 * MIB, 2 * MIB)) die("munmap ends");

    /* Threads allocating and checking their own blocks at once. */
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (struct job){ bsize, 5000 + i, 0 };
        if (pthread_create(&t[i], NULL, worker, &jobs[i])) die("pthread_create");
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        h = mix(h ^ jobs[i].hash);
    }

    /* Everything written is still there, after all that traffic. */
    for (size_t i = 0; i < nblocks; i++)
        if (i != 3 && i != 5) h = mix(h ^ check(blocks[i], bsize / 8, 1000 + i, "block, again"));
    h = mix(h ^ check(z, bsize / 8, 77, "calloc block"));
    h = mix(h ^ check(a1, 3 * MIB / 8, 31, "posix_memalign block"));
    h = mix(h ^ check(a2, 2 * MIB / 8, 32, "aligned_alloc block"));
    for (size_t i = 0; i < nblocks; i++) if (i != 3 && i != 5) free(blocks[i]);
    free(z); free(r); free(s); free(a1); free(a2);
    printf("far_heap %zu MiB ok %016" PRIx64 "\n", total / MIB, h);
    return 0;
}
