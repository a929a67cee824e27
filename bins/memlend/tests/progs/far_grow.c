/* A program whose memory outside far memory grows while its far data is in
 * use: it fills FAR_MIB of large blocks (far under memlend run), then grows
 * LOCAL_MIB of small allocations (never far) a MiB at a time, re-reading
 * the far blocks between steps, and prints one hash of everything. Under
 * `memlend run --mem` the far budget must shrink as the rest grows.
 * Usage: far_grow FAR_MIB LOCAL_MIB */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MIB (1UL << 20)
#define BLOCK (4 * MIB)
#define SMALL 4000

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return x;
}

int main(int argc, char **argv) {
    size_t far_mib = argc > 1 ? strtoul(argv[1], 0, 10) : 96;
    size_t local_mib = argc > 2 ? strtoul(argv[2], 0, 10) : 24;
    size_t nblocks = far_mib * MIB / BLOCK, words = BLOCK / 8;
    uint64_t **blocks = calloc(nblocks, sizeof *blocks), h = 0;
    for (size_t b = 0; b < nblocks; b++) {
        if (!(blocks[b] = malloc(BLOCK))) return 2;
        for (size_t i = 0; i < words; i++) blocks[b][i] = mix(b * words + i);
    }
    struct timespec pause = {0, 40 * 1000 * 1000};
    for (size_t step = 0; step < local_mib; step++) {
        for (size_t n = 0; n < MIB / SMALL; n++) {
            unsigned char *p = malloc(SMALL);
            if (!p) return 2;
            for (size_t i = 0; i < SMALL; i += 64) p[i] = (unsigned char)(step + i);
            h = mix(h ^ p[0] ^ n);
        }
        nanosleep(&pause, 0);
        size_t b = step % nblocks;
        for (size_t i = 0; i < words; i += 512) {
            if (blocks[b][i] != mix(b * words + i)) {
                fprintf(stderr, "far_grow: block %zu word %zu differs\n", b, i);
                return 3;
            }
            h = mix(h ^ blocks[b][i]);
        }
    }
    for (size_t b = 0; b < nblocks; b++)
        for (size_t i = 0; i < words; i++) {
            if (blocks[b][i] != mix(b * words + i)) return 3;
            h = mix(h ^ blocks[b][i]);
        }
    printf("%016" PRIx64 "\n", h);
    return 0;
}
