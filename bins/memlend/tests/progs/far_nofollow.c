/* fork and exec under memlend run without --follow-fork: a forked
 * child has no far memory (touching the parent's far block faults, SIGSEGV,
 * never silently reads zeroes), its own large allocations work (locally),
 * fork+exec works, and the parent's far data is untouched by all of it. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1UL << 20)

static void segv(int sig) { (void)sig; _exit(42); }

int main(void) {
    size_t n = 32 * MIB / 8;
    uint64_t *p = malloc(n * 8);
    if (!p) return 2;
    for (size_t i = 0; i < n; i++) p[i] = i * 7 + 1;
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t *q = malloc(4 * MIB); /* large, but local in a child */
        if (!q) _exit(3);
        memset(q, 1, 4 * MIB);
        free(q);
        free(p); /* a no-op in the child */
        signal(SIGSEGV, segv);
        volatile uint64_t v = p[n / 2];
        (void)v;
        _exit(4); /* read the parent's far memory: must not happen */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 42) {
        fprintf(stderr, "far_nofollow: child ended with status %d, wanted exit 42 (SIGSEGV)\n", st);
        return 5;
    }
    if (system("exit 0") != 0) return 6; /* fork + exec */
    for (size_t i = 0; i < n; i++)
        if (p[i] != i * 7 + 1) return 7;
    free(p);
    printf("far_nofollow ok\n");
    return 0;
}
