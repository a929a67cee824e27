/* A reservation's life as a JVM or Go runtime lives it, with every byte
 * checked: reserve 256 MiB PROT_NONE; commit 128 MiB of it with MAP_FIXED
 * and fill it (more than the budget: pages go out and come back); commit
 * the next 64 MiB with mprotect and fill that; uncommit the first 32 MiB
 * with MAP_FIXED PROT_NONE and commit it again (it must read zero); release
 * it all; a new mapping must be plain read-write memory. Exit 0: all
 * right; 2-7: which step failed. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#define MIB (1UL << 20)

static int filled(uint64_t *p, size_t bytes, uint64_t seed) {
    size_t words = bytes / 8;
    for (size_t i = 0; i < words; i += 512) p[i] = i * seed + 1;
    for (size_t i = 0; i < words; i += 512)
        if (p[i] != i * seed + 1) return 0;
    return 1;
}

static int zero(uint64_t *p, size_t bytes) {
    for (size_t i = 0; i < bytes / 8; i += 512)
        if (p[i]) return 0;
    return 1;
}

int main(void) {
    int rw = PROT_READ | PROT_WRITE, anon = MAP_PRIVATE | MAP_ANONYMOUS;
    char *r = mmap(NULL, 256 * MIB, PROT_NONE, anon | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return 2;
    if (mmap(r, 128 * MIB, rw, anon | MAP_FIXED, -1, 0) != r) return 3;
    if (!filled((uint64_t *)r, 128 * MIB, 3)) return 4;
    if (mprotect(r + 128 * MIB, 64 * MIB, rw) || !filled((uint64_t *)(r + 128 * MIB), 64 * MIB, 5))
        return 5;
    if (!filled((uint64_t *)r, 128 * MIB, 3)) return 4; /* back from the store */
    if (mmap(r, 32 * MIB, PROT_NONE, anon | MAP_FIXED | MAP_NORESERVE, -1, 0) != r) return 6;
    if (mmap(r, 32 * MIB, rw, anon | MAP_FIXED, -1, 0) != r || !zero((uint64_t *)r, 32 * MIB)) return 6;
    if (munmap(r, 256 * MIB)) return 7;
    char *n = mmap(NULL, 64 * MIB, rw, anon, -1, 0);
    if (n == MAP_FAILED || !filled((uint64_t *)n, 64 * MIB, 7)) return 7;
    puts("reservation ok");
    return 0;
}
