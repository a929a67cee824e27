/*
 * memlend.h: far memory for C programs.
 *
 * A region is anonymous memory of `size_bytes` of which at most
 * `budget_bytes` is resident; the rest lives on donors (other machines'
 * spare RAM, over TCP) or in a local SSD file, and comes back on the next
 * touch. Use the memory like any other: plain loads and stores.
 *
 *     memlend_config cfg;
 *     memlend_config_init(&cfg);
 *     cfg.size_bytes = 4ull << 30;        // 4 GiB region
 *     cfg.budget_bytes = 1ull << 30;      // 1 GiB of it resident
 *     cfg.donors = "10.0.0.2:7070";       // or NULL: pages go to an SSD file
 *     cfg.key_path = "/etc/memlend/key";
 *     char err[256];
 *     memlend_region *r = memlend_region_create(&cfg, err, sizeof err);
 *     if (!r) { fprintf(stderr, "memlend: %s\n", err); exit(1); }
 *     uint8_t *p = memlend_region_ptr(r);
 *     ... use p[0 .. memlend_region_len(r)) ...
 *     memlend_region_destroy(r);
 *
 * Build: cc prog.c -I include -L target/release -lmemlend \
 *           -Wl,-rpath,"$PWD/target/release"
 * Rules (see docs/api.md):
 *   - Functions return 0 or a negative errno; constructors return NULL and
 *     write the reason into `err`. No function aborts or unwinds on bad
 *     input: NULL pointers, unknown or destroyed handles are errors.
 *   - Every function may be called from any thread. The memory may be
 *     touched from any thread, until memlend_region_destroy() starts:
 *     after it, the addresses are unmapped.
 *   - The memory belongs to the region: never free, munmap, mremap or
 *     mprotect any part of it; give pages back with memlend_region_discard.
 *   - fork(): the region is not copied into the child (MADV_DONTFORK); a
 *     child that touches it gets SIGSEGV, and its inherited handles are
 *     not live (-EBADF). exec() is fine.
 *   - If the store fails (a donor dies), the faulting thread gets SIGBUS
 *     and the reason is logged to stderr; set MEMLEND_LOG=debug for more.
 */
#ifndef MEMLEND_H
#define MEMLEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped only on a change that breaks callers built against an older
 * header; compare with memlend_api_version() at run time. */
#define MEMLEND_API_VERSION 1

/* The page size regions are made of. */
#define MEMLEND_PAGE_SIZE 4096

/* How to make a region. Always start from memlend_config_init(): it sets
 * struct_size and the defaults, so fields added later keep their defaults
 * in programs built against this header. */
typedef struct memlend_config {
    uint32_t struct_size;       /* sizeof(memlend_config): set by init */
    uint32_t insecure;          /* nonzero: donors run without a key */
    uint64_t size_bytes;        /* region size; rounded up to whole pages */
    uint64_t budget_bytes;      /* most bytes resident; >= one page; rounded
                                   down to whole pages; capped at the size */
    const char *donors;         /* "host:port,host:port" (pages are striped
                                   over all), or NULL/"" for no donor */
    const char *ssd_path;       /* with no donor: a new file, a directory (a
                                   fresh file in it) or a block device;
                                   NULL = $MEMLEND_SSD_DIR or /var/tmp. A
                                   file is unlinked as soon as it is open. */
    const char *key_path;       /* the cluster key file (0600), for donors */
    uint32_t evict_batch_pages; /* pages per eviction write; 0 = default */
    uint32_t flags;             /* none defined yet: must be 0 */
    /* Version 2 (64 bytes on LP64): */
    const char *layers;         /* named layers over the store, outermost
                                   first: "checksum,stats" (known: checksum,
                                   crypt, pack, pack-zstd, stats), or NULL/"" for none */
} memlend_config;

/* A region's counters. Set struct_size = sizeof(memlend_stats) before the
 * call; on return it says how many bytes the library filled (an older
 * library fills fewer and zeroes the rest). */
typedef struct memlend_stats {
    uint32_t struct_size;
    uint32_t reserved;
    uint64_t page_size;             /* MEMLEND_PAGE_SIZE */
    uint64_t region_pages;          /* size of the region in pages */
    uint64_t budget_pages;          /* most pages resident */
    uint64_t faults_zero_filled;    /* first touches: zero page, no I/O */
    uint64_t faults_from_store;     /* pages read back from the store */
    uint64_t faults_already_mapped; /* threads racing on one page */
    uint64_t eviction_batches;      /* eviction rounds */
    uint64_t pages_written_back;    /* dirty pages written to the store */
    uint64_t pages_zero_dropped;    /* all-zero victims: dropped, no write */
    uint64_t pages_clean_dropped;   /* unchanged victims: dropped, no write */
    uint64_t faults_write_protect;  /* first writes to pages read back */
    uint64_t pages_poisoned;        /* store reads that failed (SIGBUS) */
    uint64_t pages_resident;        /* pages mapped now (<= budget_pages) */
    uint64_t remove_events;         /* madvise(DONTNEED/REMOVE/FREE) ranges,
                                       memlend_region_discard included */
    uint64_t unmap_events;          /* munmap of region memory */
    uint64_t remap_events;          /* mremap of region memory (unsupported) */
    uint64_t pages_discarded;       /* pages in those ranges: store copies
                                       dropped */
    uint64_t store_discard_failures; /* store discards that failed (logged) */
    uint64_t faults_deferred;       /* faults put off behind a queued event */
} memlend_stats;

/* Opaque. A handle is checked on every call: a destroyed or made-up handle
 * is an error, not a crash. */
typedef struct memlend_region memlend_region;

/* Defaults and struct_size into *cfg (NULL: no-op). */
void memlend_config_init(memlend_config *cfg);

/* Make a region: reserve its store (on the donors or the SSD), map it and
 * start its fault handler thread. NULL on failure, with the reason in err
 * (always NUL-terminated, cut to err_len; err may be NULL): a bad config
 * names the field, an unreachable donor its address, a wrong key says so. */
memlend_region *memlend_region_create(const memlend_config *cfg, char *err,
                                      size_t err_len);

/* Start of the region's memory (page-aligned); NULL for a bad handle. */
void *memlend_region_ptr(const memlend_region *r);

/* Length in bytes (whole pages); 0 for a bad handle. */
size_t memlend_region_len(const memlend_region *r);

/* Counters into *out. 0, -EINVAL (out NULL, struct_size < 8), -EBADF (bad
 * handle), -EIO (internal error). */
int memlend_region_stats(const memlend_region *r, memlend_stats *out);

/* Give back len bytes at offset (both multiples of MEMLEND_PAGE_SIZE,
 * inside the region): afterwards the range reads zero, holds no resident
 * budget and nothing in the store (madvise MADV_DONTNEED, followed by the
 * handler). Safe while other threads touch other pages. 0, -EINVAL (not
 * whole pages or outside), -EBADF (bad handle), or -errno from madvise. */
int memlend_region_discard(const memlend_region *r, size_t offset, size_t len);

/* Where the pages go ("donor 10.0.0.2:7070", "2 donors, striped",
 * "file /var/tmp/memlend-12-34.pages (unlinked)"), like snprintf: returns
 * the full length without the NUL, writes at most len bytes (buf may be
 * NULL with len 0); -EBADF for a bad handle. */
int memlend_region_placement(const memlend_region *r, char *buf, size_t len);

/* Stop the handler, unmap the memory, release the store. 0 (also for
 * NULL); -EBADF for a handle already destroyed. No thread may touch the
 * memory once this starts. */
int memlend_region_destroy(memlend_region *r);

/* "0.1.0": a static string. */
const char *memlend_version(void);

/* MEMLEND_API_VERSION of the library that is loaded. */
uint32_t memlend_api_version(void);

#ifdef __cplusplus
}
#endif

#endif /* MEMLEND_H */
