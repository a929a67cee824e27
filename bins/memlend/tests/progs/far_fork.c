/* fork under memlend run, as docs/run.md defines it: a forked child sees
 * the parent's far memory as it was at the fork, every word of it, while
 * the parent rewrites all of it at once (and so evicts pages the fork
 * shared); the child's own large allocations work (locally); a page the
 * child frees with madvise reads zero; a grandchild has no far memory (a
 * touch is SIGSEGV, not zeroes); fork+exec works; two children at once each
 * see their own moment; the parent's data is its own after all. A child may
 * realloc a far block of its parent's (it gets a copy) and asks its size. */
#include <malloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1UL << 20)
#define PAGE 4096UL

static size_t n;
/* A far block the parent fills once and never changes. */
static uint64_t *r;
#define R_WORDS (2 * MIB / 8)

static void segv(int sig) { (void)sig; _exit(42); }
static uint64_t *p;

static uint64_t want(size_t i, uint64_t seed) { return (i * 7 + 1) ^ (seed << 56); }

static int check(uint64_t seed, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (p[i] != want(i, seed)) {
            fprintf(stderr, "far_fork: word %zu is %#lx, wanted %#lx (seed %lu)\n", i,
                    (unsigned long)p[i], (unsigned long)want(i, seed), (unsigned long)seed);
            return 1;
        }
    return 0;
}

static void fill(uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = want(i, seed);
}

/* A child that checks the moment `seed`, once the parent has rewritten
 * everything (so the store holds the new bytes of most pages), and exits 0
 * if all held. */
static pid_t child(uint64_t seed, int *go) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid != 0) {
        close(fds[0]);
        *go = fds[1];
        return pid;
    }
    close(fds[1]);
    char c;
    if (read(fds[0], &c, 1) != 1) _exit(11);
    uint64_t *q = malloc(4 * MIB); /* large, but local in a child */
    if (!q) _exit(3);
    memset(q, 1, 4 * MIB);
    free(q);
    if (check(seed, 0, n)) _exit(4);
    /* The parent's block: its size, then a grown copy with its bytes. */
    if (malloc_usable_size(p) < n * 8 || malloc_usable_size(r) < R_WORDS * 8) _exit(15);
    uint64_t *r2 = realloc(r, 3 * MIB);
    if (!r2) _exit(16);
    for (size_t i = 0; i < R_WORDS; i++)
        if (r2[i] != want(i, 9)) _exit(17);
    r2[3 * MIB / 8 - 1] = 5;
    uint64_t *r3 = realloc(r2, MIB);
    if (!r3 || r3[R_WORDS / 2 - 1] != want(R_WORDS / 2 - 1, 9)) _exit(18);
    free(r3);
    /* The whole page at or after the middle word (malloc need not align). */
    size_t words = PAGE / 8;
    size_t mid = (((uintptr_t)&p[n / 2] + PAGE - 1) & ~(PAGE - 1)) - (uintptr_t)p;
    mid /= 8;
    if (madvise(&p[mid], PAGE, MADV_DONTNEED) != 0) _exit(10);
    for (size_t i = mid; i < mid + words; i++)
        if (p[i] != 0) _exit(5);
    if (check(seed, 0, mid) || check(seed, mid + words, n)) _exit(6);
    /* A grandchild has no far memory: a touch faults, never reads zeroes. */
    pid_t grandchild = fork();
    if (grandchild == 0) {
        signal(SIGSEGV, segv);
        volatile uint64_t v = p[n - 1];
        (void)v;
        _exit(20);
    }
    int st = 0;
    if (waitpid(grandchild, &st, 0) != grandchild || !WIFEXITED(st) || WEXITSTATUS(st) != 42)
        _exit(7);
    _exit(0);
}

static int reap(pid_t pid, const char *who) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "far_fork: %s child ended with status %#x\n", who, st);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 32;
    n = mib * MIB / 8;
    p = malloc(n * 8);
    r = malloc(R_WORDS * 8);
    if (!p || !r) return 2;
    for (size_t i = 0; i < R_WORDS; i++) r[i] = want(i, 9);
    int go_first, go_second;
    fill(1);
    pid_t first = child(1, &go_first);
    fill(2);
    pid_t second = child(2, &go_second);
    if (first < 0 || second < 0) return 12;
    if (write(go_first, "g", 1) != 1) return 13;
    fill(3);
    if (write(go_second, "g", 1) != 1) return 14;
    if (reap(first, "first") || reap(second, "second")) return 7;
    if (system("exit 0") != 0) return 8; /* fork + exec */
    if (check(3, 0, n)) return 9;
    for (size_t i = 0; i < R_WORDS; i++)
        if (r[i] != want(i, 9)) return 10;
    free(r);
    free(p);
    printf("far_fork ok\n");
    return 0;
}
