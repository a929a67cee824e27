/* Large memory of every kind `memlend run`'s summary names: 32 MiB from
 * malloc (made far), 64 MiB of shared anonymous memory, a 256 MiB
 * PROT_NONE reservation of which 16 MiB is committed with mprotect (both
 * passed to the kernel today). Each is written and read back; the sum is
 * printed. With "kill" the process ends by SIGKILL instead of exiting, as
 * the OOM killer would end it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static unsigned long fill(unsigned char *p, size_t len, unsigned seed) {
    unsigned long sum = 0;
    for (size_t i = 0; i < len; i += 4096) p[i] = (unsigned char)(i / 4096 * seed);
    for (size_t i = 0; i < len; i += 4096) sum += p[i];
    return sum;
}

int main(int argc, char **argv) {
    size_t mib = 1 << 20;
    unsigned char *heap = malloc(32 * mib);
    unsigned char *shared = mmap(NULL, 64 * mib, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    unsigned char *reserved = mmap(NULL, 256 * mib, PROT_NONE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!heap || shared == MAP_FAILED || reserved == MAP_FAILED) return 1;
    if (mprotect(reserved, 16 * mib, PROT_READ | PROT_WRITE) != 0) return 1;
    unsigned long sum = fill(heap, 32 * mib, 3) + fill(shared, 64 * mib, 5) +
                        fill(reserved, 16 * mib, 7);
    printf("sum %lu\n", sum);
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "kill") == 0) kill(getpid(), SIGKILL);
    return 0;
}
