/* Fills a block that fits the local budget, then waits up to SECONDS for
 * the kernel to report at least half of it in huge pages (memlend collapses
 * full 2 MiB chunks of a region that fits), and checks every word. Prints
 * the AnonHugePages it saw. Exit 0: huge and intact; 4: never huge; 3: a
 * word changed. Usage: far_huge MIB SECONDS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long anon_huge_kib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14)) kib = atol(line + 14);
    if (f) fclose(f);
    return kib;
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 32) << 20, words = bytes / 8;
    unsigned tenths = 10 * (argc > 2 ? strtoul(argv[2], 0, 10) : 10);
    uint64_t *p = malloc(bytes);
    if (!p) return 2;
    for (size_t i = 0; i < words; i++) p[i] = i * 0x9e3779b97f4a7c15ULL;
    long want = (long)(bytes >> 10) / 2, kib = anon_huge_kib();
    for (unsigned t = 0; t < tenths && kib < want; t++) {
        usleep(100000);
        kib = anon_huge_kib();
    }
    for (size_t i = 0; i < words; i++)
        if (p[i] != i * 0x9e3779b97f4a7c15ULL) return 3;
    printf("AnonHugePages %ld kB of %zu kB\n", kib, bytes >> 10);
    free(p);
    return kib >= want ? 0 : 4;
}
