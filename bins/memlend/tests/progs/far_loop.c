/* Fills a block many times the local budget, then checks it pass after
 * pass, printing "pass N" after each, forever or for PASSES passes. Used to
 * kill a donor under it. Usage: far_loop MIB [PASSES] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20, words = bytes / 8;
    unsigned passes = argc > 2 ? strtoul(argv[2], 0, 10) : 0;
    uint64_t *p = malloc(bytes);
    if (!p) return 2;
    for (size_t i = 0; i < words; i++) p[i] = i * 0x9e3779b97f4a7c15ULL;
    for (unsigned pass = 1; passes == 0 || pass <= passes; pass++) {
        for (size_t i = 0; i < words; i += 512)
            if (p[i] != i * 0x9e3779b97f4a7c15ULL) return 3;
        printf("pass %u\n", pass);
        fflush(stdout);
    }
    free(p);
    return 0;
}
