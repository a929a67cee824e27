/* A C user of libmemlend, driven by tests/c_abi.rs:
 *
 *   check region ssd DIR SIZE_MIB BUDGET_MIB
 *   check region donor ADDR SIZE_MIB BUDGET_MIB [KEYFILE]
 *       write a pattern to every page from two threads, read it back,
 *       compare, check the counters
 *   check refuse ERROR_SUBSTRING donors|ssd WHERE BUDGET_BYTES [KEYFILE]
 *       creation must fail with a message containing ERROR_SUBSTRING
 *   check misuse DIR
 *       NULLs, bad handles, double destroy, short buffers, struct sizes
 *   check fork DIR
 *       a forked child touching the region dies of SIGSEGV; the parent is fine
 *   check race DIR
 *       destroy while two threads poll the handle's stats
 *
 * Exit 0 when every check passes; each failure is printed.
 */
#include "memlend.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(memlend_config) == 64, "memlend_config v2 is 64 bytes");
_Static_assert(offsetof(memlend_config, layers) == 56, "memlend_config v1 is 56 bytes");
_Static_assert(sizeof(memlend_stats) == 160, "memlend_stats v1 is 160 bytes");

static int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            failures++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
        }                                                                      \
    } while (0)

static uint64_t word(uint64_t page, uint64_t i) {
    uint64_t x = (page + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
    return x ^ (x >> 31);
}

struct span {
    uint64_t *mem;
    uint64_t first, end; /* pages */
    uint64_t bad;
};

static void *fill(void *arg) {
    struct span *s = arg;
    for (uint64_t p = s->first; p < s->end; p++)
        for (uint64_t i = 0; i < MEMLEND_PAGE_SIZE / 8; i++)
            s->mem[p * (MEMLEND_PAGE_SIZE / 8) + i] = word(p, i);
    return NULL;
}

static void *verify(void *arg) {
    struct span *s = arg;
    for (uint64_t p = s->first; p < s->end; p++)
        for (uint64_t i = 0; i < MEMLEND_PAGE_SIZE / 8; i++)
            s->bad += s->mem[p * (MEMLEND_PAGE_SIZE / 8) + i] != word(p, i);
    return NULL;
}

/* Run `fn` over all pages, split between two threads. */
static uint64_t both_halves(void *(*fn)(void *), uint64_t *mem, uint64_t pages) {
    struct span a = {mem, 0, pages / 2, 0}, b = {mem, pages / 2, pages, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, fn, &b) != 0) {
        fn(&b);
        fn(&a);
    } else {
        fn(&a);
        pthread_join(t, NULL);
    }
    return a.bad + b.bad;
}

static void print_stats(const memlend_stats *s) {
    printf("stats: pages %llu budget %llu zero_filled %llu from_store %llu "
           "already_mapped %llu batches %llu written_back %llu zero_dropped %llu "
           "clean_dropped %llu wp %llu poisoned %llu resident %llu removes %llu "
           "discarded %llu\n",
           (unsigned long long)s->region_pages, (unsigned long long)s->budget_pages,
           (unsigned long long)s->faults_zero_filled,
           (unsigned long long)s->faults_from_store,
           (unsigned long long)s->faults_already_mapped,
           (unsigned long long)s->eviction_batches,
           (unsigned long long)s->pages_written_back,
           (unsigned long long)s->pages_zero_dropped,
           (unsigned long long)s->pages_clean_dropped,
           (unsigned long long)s->faults_write_protect,
           (unsigned long long)s->pages_poisoned,
           (unsigned long long)s->pages_resident,
           (unsigned long long)s->remove_events,
           (unsigned long long)s->pages_discarded);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int region(int argc, char **argv) {
    if (argc < 4) return 2;
    memlend_config cfg;
    memlend_config_init(&cfg);
    CHECK(cfg.struct_size == sizeof cfg, "init sets struct_size");
    cfg.size_bytes = strtoull(argv[2], NULL, 10) << 20;
    cfg.budget_bytes = strtoull(argv[3], NULL, 10) << 20;
    if (strcmp(argv[0], "ssd") == 0) {
        cfg.ssd_path = argv[1];
    } else {
        cfg.donors = argv[1];
        if (argc > 4 && argv[4][0]) cfg.key_path = argv[4];
        else cfg.insecure = 1;
    }
    /* argv[5]: named layers, or "v1": a caller built against version 1. */
    if (argc > 5 && strcmp(argv[5], "v1") == 0) {
        cfg.struct_size = offsetof(memlend_config, layers);
    } else if (argc > 5) {
        cfg.layers = argv[5];
    }
    char err[512];
    memlend_region *r = memlend_region_create(&cfg, err, sizeof err);
    if (!r) {
        fprintf(stderr, "FAIL: memlend_region_create: %s\n", err);
        return 1;
    }
    CHECK(err[0] == 0, "err is emptied on success: %s", err);
    char where[128];
    int n = memlend_region_placement(r, where, sizeof where);
    CHECK(n > 0 && (size_t)n == strlen(where), "placement %d %s", n, where);
    printf("placement: %s\n", where);

    uint64_t *mem = memlend_region_ptr(r);
    size_t len = memlend_region_len(r);
    CHECK(mem != NULL && ((uintptr_t)mem % MEMLEND_PAGE_SIZE) == 0, "ptr %p", (void *)mem);
    CHECK(len == cfg.size_bytes, "len %zu", len);
    uint64_t pages = len / MEMLEND_PAGE_SIZE;

    double t0 = now();
    both_halves(fill, mem, pages);
    double t1 = now();
    uint64_t bad = both_halves(verify, mem, pages);
    double t2 = now();
    CHECK(bad == 0, "%llu words differ after the first read back", (unsigned long long)bad);
    bad = both_halves(verify, mem, pages);
    CHECK(bad == 0, "%llu words differ after the second read back", (unsigned long long)bad);
    printf("rates: fill %.0f pages/s (%.0f MiB/s), read back %.0f pages/s (%.0f MiB/s)\n",
           (double)pages / (t1 - t0), (double)len / (1 << 20) / (t1 - t0),
           (double)pages / (t2 - t1), (double)len / (1 << 20) / (t2 - t1));

    memlend_stats st = {.struct_size = sizeof st};
    CHECK(memlend_region_stats(r, &st) == 0, "stats");
    print_stats(&st);
    CHECK(st.struct_size == sizeof st, "stats fills %u", st.struct_size);
    CHECK(st.page_size == MEMLEND_PAGE_SIZE, "page size");
    CHECK(st.region_pages == pages, "region_pages %llu", (unsigned long long)st.region_pages);
    CHECK(st.budget_pages == cfg.budget_bytes / MEMLEND_PAGE_SIZE, "budget_pages");
    CHECK(st.pages_written_back > 0, "pages were written back");
    CHECK(st.faults_from_store > 0, "pages were read back");
    CHECK(st.pages_resident <= st.budget_pages, "resident %llu over budget %llu",
          (unsigned long long)st.pages_resident, (unsigned long long)st.budget_pages);
    CHECK(st.pages_poisoned == 0, "no page poisoned");

    /* Give the second half back: it reads zero, the first half is intact. */
    size_t half = (size_t)(pages / 2) * MEMLEND_PAGE_SIZE;
    CHECK(memlend_region_discard(r, half, len - half) == 0, "discard");
    CHECK(memlend_region_discard(r, 1, MEMLEND_PAGE_SIZE) == -EINVAL, "misaligned");
    CHECK(memlend_region_discard(r, 0, len + MEMLEND_PAGE_SIZE) == -EINVAL, "outside");
    CHECK(memlend_region_discard(r, len, 0) == 0, "empty range at the end");
    uint64_t nonzero = 0;
    for (size_t i = half / 8; i < len / 8; i++) nonzero += mem[i] != 0;
    CHECK(nonzero == 0, "%llu words of the discarded half are not zero",
          (unsigned long long)nonzero);
    struct span first = {mem, 0, pages / 2, 0};
    verify(&first);
    CHECK(first.bad == 0, "%llu words of the kept half differ", (unsigned long long)first.bad);
    memlend_stats after = {.struct_size = sizeof after};
    CHECK(memlend_region_stats(r, &after) == 0, "stats");
    print_stats(&after);
    CHECK(after.remove_events > 0, "the discard was seen");
    CHECK(after.pages_discarded >= pages / 2 - st.budget_pages, "discarded %llu",
          (unsigned long long)after.pages_discarded);
    CHECK(after.pages_resident <= after.budget_pages, "resident");
    CHECK(memlend_region_destroy(r) == 0, "destroy");
    return failures ? 1 : 0;
}

static int refuse(int argc, char **argv) {
    if (argc < 4) return 2;
    memlend_config cfg;
    memlend_config_init(&cfg);
    cfg.size_bytes = 16 << 20;
    cfg.budget_bytes = strtoull(argv[3], NULL, 10);
    if (strcmp(argv[1], "donors") == 0) {
        cfg.donors = argv[2];
        if (argc > 4) cfg.key_path = argv[4];
        else cfg.insecure = 1;
    } else {
        cfg.ssd_path = argv[2];
    }
    if (argc > 5) cfg.layers = argv[5];
    char err[512] = "untouched";
    memlend_region *r = memlend_region_create(&cfg, err, sizeof err);
    printf("error: %s\n", err);
    CHECK(r == NULL, "creation should fail");
    CHECK(strstr(err, argv[0]) != NULL, "message \"%s\" should name \"%s\"", err, argv[0]);
    memlend_region_destroy(r);
    return failures ? 1 : 0;
}

static int misuse(int argc, char **argv) {
    if (argc < 1) return 2;
    char err[256];

    memlend_config_init(NULL);
    CHECK(memlend_region_create(NULL, err, sizeof err) == NULL, "NULL config");
    CHECK(strstr(err, "NULL") != NULL, "%s", err);
    CHECK(memlend_region_create(NULL, NULL, 0) == NULL, "NULL config, NULL err");

    memlend_config cfg;
    memset(&cfg, 0, sizeof cfg); /* forgot memlend_config_init */
    cfg.size_bytes = 1 << 20;
    cfg.budget_bytes = 1 << 16;
    CHECK(memlend_region_create(&cfg, err, sizeof err) == NULL, "struct_size 0");
    CHECK(strstr(err, "memlend_config_init") != NULL, "%s", err);

    memlend_config_init(&cfg);
    cfg.size_bytes = 0;
    cfg.budget_bytes = 1 << 16;
    CHECK(memlend_region_create(&cfg, err, sizeof err) == NULL, "size 0");
    CHECK(strstr(err, "size_bytes") != NULL, "%s", err);

    /* A short buffer gets a cut, terminated message. */
    cfg.size_bytes = 1 << 20;
    cfg.budget_bytes = 0;
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    CHECK(memlend_region_create(&cfg, tiny, sizeof tiny) == NULL, "budget 0");
    CHECK(tiny[7] == 0 && strlen(tiny) == 7, "cut message");

    /* A good region, then every way to hold it wrong. */
    cfg.budget_bytes = 1 << 16;
    cfg.ssd_path = argv[0];
    memlend_region *r = memlend_region_create(&cfg, err, sizeof err);
    CHECK(r != NULL, "%s", err);
    if (!r) return 1;
    memlend_region *fake = (memlend_region *)(uintptr_t)0x1234;
    CHECK(memlend_region_ptr(NULL) == NULL, "ptr(NULL)");
    CHECK(memlend_region_ptr(fake) == NULL, "ptr(fake)");
    CHECK(memlend_region_len(fake) == 0, "len(fake)");
    memlend_stats st = {.struct_size = sizeof st};
    CHECK(memlend_region_stats(r, NULL) == -EINVAL, "stats(NULL)");
    CHECK(memlend_region_stats(fake, &st) == -EBADF, "stats(fake)");
    memlend_stats zero = {0};
    CHECK(memlend_region_stats(r, &zero) == -EINVAL, "stats struct_size 0");

    /* An older caller's short struct: only its bytes are written. */
    struct {
        memlend_stats head;
        uint64_t canary;
    } small;
    memset(&small, 0xAB, sizeof small);
    small.head.struct_size = 32; /* up to budget_pages */
    CHECK(memlend_region_stats(r, &small.head) == 0, "short stats");
    CHECK(small.head.struct_size == 32 && small.head.budget_pages == 16, "short stats filled");
    CHECK(small.head.faults_zero_filled == 0xABABABABABABABABull, "wrote past struct_size");

    /* A newer caller's long struct: the unknown tail is zeroed. */
    memset(&small, 0xAB, sizeof small);
    small.head.struct_size = sizeof small;
    CHECK(memlend_region_stats(r, &small.head) == 0, "long stats");
    CHECK(small.head.struct_size == sizeof(memlend_stats), "filled %u", small.head.struct_size);
    CHECK(small.canary == 0, "unknown tail zeroed");

    CHECK(memlend_region_placement(r, NULL, 0) > 0, "placement length");
    CHECK(memlend_region_placement(fake, NULL, 0) == -EBADF, "placement(fake)");
    CHECK(memlend_region_discard(fake, 0, MEMLEND_PAGE_SIZE) == -EBADF, "discard(fake)");

    CHECK(memlend_region_destroy(NULL) == 0, "destroy(NULL)");
    CHECK(memlend_region_destroy(fake) == -EBADF, "destroy(fake)");
    CHECK(memlend_region_destroy(r) == 0, "destroy");
    CHECK(memlend_region_destroy(r) == -EBADF, "destroy twice");
    CHECK(memlend_region_ptr(r) == NULL, "ptr after destroy");
    CHECK(memlend_region_stats(r, &st) == -EBADF, "stats after destroy");

    CHECK(memlend_api_version() == MEMLEND_API_VERSION, "api version");
    CHECK(memlend_version() && memlend_version()[0], "version");
    printf("misuse: memlend %s, api %u\n", memlend_version(), memlend_api_version());
    return failures ? 1 : 0;
}

static int forked(int argc, char **argv) {
    if (argc < 1) return 2;
    memlend_config cfg;
    memlend_config_init(&cfg);
    cfg.size_bytes = 4 << 20;
    cfg.budget_bytes = 1 << 20;
    cfg.ssd_path = argv[0];
    char err[256];
    memlend_region *r = memlend_region_create(&cfg, err, sizeof err);
    CHECK(r != NULL, "%s", err);
    if (!r) return 1;
    volatile uint8_t *p = memlend_region_ptr(r);
    size_t len = memlend_region_len(r);
    for (size_t i = 0; i < len; i += MEMLEND_PAGE_SIZE) p[i] = (uint8_t)(i / MEMLEND_PAGE_SIZE + 1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* The inherited handle is not live in the child... */
        memlend_stats cs = {.struct_size = sizeof cs};
        if (memlend_region_ptr(r) != NULL || memlend_region_stats(r, &cs) != -EBADF ||
            memlend_region_destroy(r) != -EBADF)
            _exit(5);
        /* ...and page 0 (far by now) is not there: SIGSEGV, not a 0. */
        _exit(p[0] == 1 ? 3 : 4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
          "child should die of SIGSEGV, status %#x", status);
    uint64_t bad = 0;
    for (size_t i = 0; i < len; i += MEMLEND_PAGE_SIZE)
        bad += p[i] != (uint8_t)(i / MEMLEND_PAGE_SIZE + 1);
    CHECK(bad == 0, "parent reads its pages after the fork");
    CHECK(memlend_region_destroy(r) == 0, "the parent's handle is still live");
    printf("fork: child status %#x\n", status);
    return failures ? 1 : 0;
}

struct racer {
    memlend_region *r;
    volatile int stop;
    uint64_t ok, gone;
};

static void *poll_stats(void *arg) {
    struct racer *x = arg;
    while (!x->stop) {
        memlend_stats st = {.struct_size = sizeof st};
        int rc = memlend_region_stats(x->r, &st);
        if (rc == 0) x->ok++;
        else if (rc == -EBADF) x->gone++;
        else abort();
        if (rc == -EBADF && x->gone > 1000) break;
    }
    return NULL;
}

/* Destroy while other threads call into the same handle: each call either
 * sees the live region or -EBADF, never a crash. */
static int race(int argc, char **argv) {
    if (argc < 1) return 2;
    for (int round = 0; round < 20; round++) {
        memlend_config cfg;
        memlend_config_init(&cfg);
        cfg.size_bytes = 1 << 20;
        cfg.budget_bytes = 1 << 16;
        cfg.ssd_path = argv[0];
        char err[256];
        struct racer x = {0};
        x.r = memlend_region_create(&cfg, err, sizeof err);
        CHECK(x.r != NULL, "%s", err);
        if (!x.r) return 1;
        pthread_t t[2];
        for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, poll_stats, &x);
        usleep(1000);
        CHECK(memlend_region_destroy(x.r) == 0, "destroy");
        usleep(1000);
        x.stop = 1;
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        CHECK(memlend_region_stats(x.r, NULL) == -EINVAL, "NULL out first");
        if (round == 19) printf("race: %llu live calls, %llu after destroy\n",
                                (unsigned long long)x.ok, (unsigned long long)x.gone);
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *mode = argv[1];
    if (strcmp(mode, "region") == 0) return region(argc - 2, argv + 2);
    if (strcmp(mode, "refuse") == 0) return refuse(argc - 2, argv + 2);
    if (strcmp(mode, "misuse") == 0) return misuse(argc - 2, argv + 2);
    if (strcmp(mode, "fork") == 0) return forked(argc - 2, argv + 2);
    if (strcmp(mode, "race") == 0) return race(argc - 2, argv + 2);
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
