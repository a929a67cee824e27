/* Fills MIB of far memory with text (words from a short list, so it
 * compresses about 2x under lz4 and 4x under zstd), then touches its pages
 * in a skewed order (a quarter of them take three touches in four),
 * rewriting one touch in eight, and prints one hash of everything: under
 * `memlend run --compress` pages come back from the compressed pool.
 * Usage: far_text MIB TOUCHES */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 4096

static uint64_t state = 88172645463325252ULL;
static uint64_t next(void) {
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return state;
}

static const char *words[] = {"page", "donor", "fault", "memory", "store", "lend",
                              "borrow", "the", "a", "of", "reclaim", "tier"};

/* A page of words, the first eight bytes its number and version. */
static void write_page(char *p, uint64_t page, uint64_t version) {
    size_t at = 16;
    while (at < PAGE) {
        const char *w = words[next() % (sizeof words / sizeof *words)];
        size_t n = strlen(w);
        if (at + n + 1 > PAGE) break;
        memcpy(p + at, w, n);
        p[at + n] = ' ';
        at += n + 1;
    }
    memset(p + at, '.', PAGE - at);
    memcpy(p, &page, 8);
    memcpy(p + 8, &version, 8);
}

static uint64_t mix(uint64_t h, const char *p) {
    for (size_t i = 0; i < PAGE; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
    }
    return h;
}

int main(int argc, char **argv) {
    size_t pages = (argc > 1 ? strtoul(argv[1], 0, 10) : 32) * (1 << 20) / PAGE;
    size_t touches = argc > 2 ? strtoul(argv[2], 0, 10) : 20000;
    char *mem = malloc(pages * PAGE);
    if (!mem) return 2;
    for (size_t p = 0; p < pages; p++) write_page(mem + p * PAGE, p, 0);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t t = 0; t < touches; t++) {
        uint64_t r = next();
        size_t p = (r & 3) ? (r >> 8) % (pages / 4) : (r >> 8) % pages;
        char *page = mem + p * PAGE;
        uint64_t number;
        memcpy(&number, page, 8);
        if (number != p) {
            fprintf(stderr, "far_text: page %zu holds page %" PRIu64 "\n", p, number);
            return 3;
        }
        if (t % 8 == 0) {
            uint64_t version;
            memcpy(&version, page + 8, 8);
            write_page(page, p, version + 1);
        }
        h = mix(h, page);
    }
    for (size_t p = 0; p < pages; p++) h = mix(h, mem + p * PAGE);
    printf("%016" PRIx64 "\n", h);
    return 0;
}
