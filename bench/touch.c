// touch.c - the far-memory micro benchmark's one program (bench/far_micro.py runs it under each peer).
//
//   cc -O2 -o touch bench/touch.c -lm
//   ./touch --size 1G --pattern uniform|zipf|seq [--ops N] [--seconds S] [--warmup N]
//           [--warmup-seconds S] [--write-pct 50] [--seed N] [--sample-every 64] [--zipf-s 0.99] [--verify]
//
// 1. One malloc of --size bytes + 4 KiB (so under `memlend run` it lands in far memory); the
//    region is its page-aligned --size bytes.
// 2. Populate: writes every 4 KiB page in order with a page-index pattern (incompressible
//    pseudo-random words, so zram gets no help from compression); timed and reported apart.
// 3. Warm-up (untimed: --warmup touches, or --warmup-seconds if that ends first), then the
//    timed phase: --ops touches or --seconds, whichever ends first. A touch picks a page
//    (uniform random; zipf(s) over page ranks, the ranks scattered over the region by a
//    bijective hash; or sequential with wrap-around), reads its header and one pattern word,
//    and with probability --write-pct writes it (bumps the page's write counter and reseals
//    its header). About one touch in --sample-every (random gaps, so a periodic pattern
//    cannot alias with it) is timed alone with clock_gettime: p50/p99/p99.9 come from those.
// 4. With --verify: reads back every page and checks the whole page against its index, the
//    header seal, and that the write counters add up to the writes done (a lost write-back
//    shows as a short sum). Any mismatch: message on stderr, "ok": false, exit status 1.
//
// Output: one JSON line on stdout. The checksum folds every value read, so two runs with the
// same --size/--pattern/--seed/--ops/--warmup/--write-pct that both finished all their ops
// must print the same checksum, whatever holds the memory.
//
// Page layout (64-bit words): w[0] = TAG ^ index, w[1] = write count, w[2] = seal(index, count),
// w[3..511] = fill(index, j). All metadata here is < 1 MiB, so it stays local under the shim.
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define PG 4096UL
#define WORDS (PG / 8)
#define TAG 0x6d656d6c656e6421ULL // "memlend!"
#define MAX_SAMPLES 200000        // 800 KB of uint32: below the shim's 1 MiB threshold

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}
static inline uint64_t mix64(uint64_t z) { // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline uint64_t fill_word(uint64_t idx, uint64_t j) { return mix64(idx * WORDS + j + 0x9e3779b97f4a7c15ULL); }
static inline uint64_t seal(uint64_t idx, uint64_t count) { return mix64(idx ^ (count << 40) ^ 0x5ea1ULL); }

static uint64_t rs[2];
static inline uint64_t rnd(void) { // xorshift128+
  uint64_t s1 = rs[0];
  const uint64_t s0 = rs[1];
  rs[0] = s0;
  s1 ^= s1 << 23;
  rs[1] = s1 ^ s0 ^ (s1 >> 18) ^ (s0 >> 5);
  return rs[1] + s0;
}
static inline double rnd01(void) { return (rnd() >> 11) * 0x1.0p-53; }
static inline uint64_t below(uint64_t n) { return (uint64_t)(((unsigned __int128)rnd() * n) >> 64); }

// Zipf over ranks 1..n by rejection-inversion (Hörmann & Derflinger 1996): O(1), no table.
static double zs, z_hx1, z_hn, z_sv;
static double helper1(double x) { return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
static double helper2(double x) { return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x)); }
static double zh(double x) { return exp(-zs * log(x)); }
static double zH(double x) { double l = log(x); return helper2((1 - zs) * l) * l; }
static double zHinv(double x) { double t = x * (1 - zs); if (t < -1) t = -1; return exp(helper1(t) * x); }
static void zipf_init(double s, uint64_t n) {
  zs = s;
  z_hx1 = zH(1.5) - 1;
  z_hn = zH(n + 0.5);
  z_sv = 2 - zHinv(zH(2.5) - zh(2));
}
static uint64_t zipf_rank(uint64_t n) { // 1..n
  for (;;) {
    double u = z_hn + rnd01() * (z_hx1 - z_hn);
    double x = zHinv(u);
    uint64_t k = (uint64_t)(x + 0.5);
    if (k < 1) k = 1; else if (k > n) k = n;
    if (k - x <= z_sv || u >= zH(k + 0.5) - zh(k)) return k;
  }
}
// A bijection on [0, n): a keyed mix on the next power of two, cycle-walked back into range,
// so the hot ranks land all over the region instead of in its first pages.
static uint64_t perm_mask, perm_k1, perm_k2, perm_k3;
static int perm_bits;
static inline uint64_t perm(uint64_t x, uint64_t n) {
  do {
    x = ((x ^ perm_k3) * perm_k1) & perm_mask;
    x ^= x >> (perm_bits / 2 + 1);
    x = (x * perm_k2) & perm_mask;
    x ^= x >> (perm_bits / 3 + 1);
  } while (x >= n);
  return x;
}

static int cmpu(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}
static uint64_t parse_size(const char *s) {
  char *e;
  double v = strtod(s, &e);
  switch (*e) {
  case 'k': case 'K': v *= 1024; break;
  case 'm': case 'M': v *= 1 << 20; break;
  case 'g': case 'G': v *= 1 << 30; break;
  case 't': case 'T': v *= (double)(1ULL << 40); break;
  }
  return (uint64_t)v;
}
static void usage(const char *a0) {
  fprintf(stderr,
          "usage: %s --size SIZE --pattern uniform|zipf|seq [--ops N] [--seconds S] [--warmup N]\n"
          "          [--warmup-seconds S] [--write-pct P] [--seed N] [--sample-every K] [--zipf-s S]\n"
          "          [--verify]\n",
          a0);
  exit(2);
}

enum { UNIFORM, ZIPF, SEQ };
static const char *pnames[] = {"uniform", "zipf", "seq"};
static char *base;
static uint64_t np, seq_pos, checksum, bad, writes;
static int pattern, wpct;

static inline uint64_t next_page(void) {
  switch (pattern) {
  case UNIFORM: return below(np);
  case ZIPF: return perm(zipf_rank(np) - 1, np);
  default: { uint64_t p = seq_pos++; if (seq_pos == np) seq_pos = 0; return p; }
  }
}
static inline void touch(uint64_t pg, uint64_t r) {
  volatile uint64_t *w = (volatile uint64_t *)(base + pg * PG);
  uint64_t h = w[0];
  uint64_t j = 3 + (r >> 8) % (WORDS - 3);
  uint64_t v = w[j];
  if (h != (TAG ^ pg)) bad++;
  checksum = mix64(checksum ^ h ^ v);
  if ((int)(r % 100) < wpct) {
    uint64_t c = w[1] + 1;
    w[1] = c;
    w[2] = seal(pg, c);
    writes++;
  }
}

int main(int argc, char **argv) {
  uint64_t size = 0, ops = 0, warmup = 0, seed = 1, every = 64;
  double seconds = 0, warmup_seconds = 0, zipf_s = 0.99;
  int verify = 0;
  wpct = 50;
  pattern = -1;
  static struct option opts[] = {
      {"size", 1, 0, 's'}, {"pattern", 1, 0, 'p'}, {"ops", 1, 0, 'n'}, {"seconds", 1, 0, 't'},
      {"warmup", 1, 0, 'w'}, {"write-pct", 1, 0, 'W'}, {"seed", 1, 0, 'S'}, {"sample-every", 1, 0, 'e'},
      {"zipf-s", 1, 0, 'z'}, {"warmup-seconds", 1, 0, 'T'}, {"verify", 0, 0, 'v'}, {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", opts, 0)) != -1) {
    switch (c) {
    case 's': size = parse_size(optarg); break;
    case 'p':
      for (int i = 0; i < 3; i++) if (!strcmp(optarg, pnames[i])) pattern = i;
      break;
    case 'n': ops = strtoull(optarg, 0, 0); break;
    case 't': seconds = atof(optarg); break;
    case 'w': warmup = strtoull(optarg, 0, 0); break;
    case 'W': wpct = atoi(optarg); break;
    case 'S': seed = strtoull(optarg, 0, 0); break;
    case 'e': every = strtoull(optarg, 0, 0); break;
    case 'T': warmup_seconds = atof(optarg); break;
    case 'z': zipf_s = atof(optarg); break;
    case 'v': verify = 1; break;
    default: usage(argv[0]);
    }
  }
  if (size < PG || pattern < 0 || (ops == 0 && seconds <= 0) || every == 0 || wpct < 0 || wpct > 100)
    usage(argv[0]);
  if (ops == 0) ops = UINT64_MAX;
  np = size / PG;
  rs[0] = mix64(seed), rs[1] = mix64(seed + 1);
  perm_bits = 1;
  while ((1ULL << perm_bits) < np) perm_bits++;
  perm_mask = (1ULL << perm_bits) - 1;
  perm_k1 = mix64(seed + 7) | 1, perm_k2 = mix64(seed + 11) | 1, perm_k3 = mix64(seed + 13) & perm_mask;
  if (pattern == ZIPF) zipf_init(zipf_s, np);
  seq_pos = 0;

  // One malloc: under `memlend run` this is the far allocation. One page more than the
  // region, so the region can start on a page boundary and a touch is one OS page.
  char *raw = malloc(np * PG + PG);
  if (!raw) {
    fprintf(stderr, "malloc(%llu): %s\n", (unsigned long long)(np * PG + PG), strerror(errno));
    return 1;
  }
  base = (char *)(((uintptr_t)raw + PG - 1) & ~(uintptr_t)(PG - 1));

  uint64_t t0 = now_ns();
  for (uint64_t i = 0; i < np; i++) {
    uint64_t *w = (uint64_t *)(base + i * PG);
    w[0] = TAG ^ i;
    w[1] = 0;
    w[2] = seal(i, 0);
    for (uint64_t j = 3; j < WORDS; j++) w[j] = fill_word(i, j);
  }
  double pop_s = (now_ns() - t0) / 1e9;

  uint64_t t1 = now_ns();
  uint64_t wdone = 0, wdeadline = warmup_seconds > 0 ? t1 + (uint64_t)(warmup_seconds * 1e9) : UINT64_MAX;
  int warm_timed_out = 0;
  for (; wdone < warmup; wdone++) {
    if ((wdone & 255) == 0 && now_ns() >= wdeadline) { warm_timed_out = 1; break; }
    touch(next_page(), rnd());
  }
  double warm_s = (now_ns() - t1) / 1e9;

  static uint32_t lat[MAX_SAMPLES];
  size_t ns = 0;
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  uint64_t n = 0, next_sample = below(every), start = now_ns(), deadline = seconds > 0 ? start + (uint64_t)(seconds * 1e9) : UINT64_MAX;
  int timed_out = 0;
  while (n < ops) {
    if ((n & 255) == 0 && now_ns() >= deadline) { timed_out = 1; break; }
    uint64_t pg = next_page(), r = rnd();
    if (n == next_sample) { // random gaps, mean `every`: no aliasing with a periodic pattern (seq)
      next_sample = n + 1 + below(2 * every - 1);
      uint64_t s = now_ns();
      touch(pg, r);
      uint64_t d = now_ns() - s;
      if (ns == MAX_SAMPLES) { // keep every other sample and halve the sampling rate
        for (size_t i = 0; i < MAX_SAMPLES / 2; i++) lat[i] = lat[2 * i];
        ns = MAX_SAMPLES / 2;
        every *= 2;
      }
      lat[ns++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
    } else {
      touch(pg, r);
    }
    n++;
  }
  double el = (now_ns() - start) / 1e9;
  getrusage(RUSAGE_SELF, &r1);
  double sum = 0;
  for (size_t i = 0; i < ns; i++) sum += lat[i];
  qsort(lat, ns, sizeof lat[0], cmpu);
#define PCT(q) (ns ? lat[(size_t)((ns - 1) * (q))] / 1e3 : 0.0)

  double ver_s = 0;
  uint64_t vbad = 0, wsum = 0;
  if (verify) {
    uint64_t t2 = now_ns();
    for (uint64_t i = 0; i < np; i++) {
      const uint64_t *w = (const uint64_t *)(base + i * PG);
      int page_bad = w[0] != (TAG ^ i) || w[2] != seal(i, w[1]);
      for (uint64_t j = 3; j < WORDS && !page_bad; j++) page_bad = w[j] != fill_word(i, j);
      wsum += w[1];
      if (page_bad && vbad++ < 5)
        fprintf(stderr, "verify: page %llu is wrong (w0=%016llx w1=%llu w2=%016llx)\n", (unsigned long long)i,
                (unsigned long long)w[0], (unsigned long long)w[1], (unsigned long long)w[2]);
    }
    ver_s = (now_ns() - t2) / 1e9;
    if (wsum != writes) {
      fprintf(stderr, "verify: write counters add up to %llu, %llu writes were done\n", (unsigned long long)wsum,
              (unsigned long long)writes);
      vbad++;
    }
  }
  if (bad) fprintf(stderr, "touch: %llu touches read a page header that is not its own\n", (unsigned long long)bad);
  int ok = bad == 0 && vbad == 0;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"size\": %llu, \"pages\": %llu, \"pattern\": \"%s\", \"write_pct\": %d, \"seed\": %llu, "
         "\"populate_s\": %.4f, \"populate_mb_per_s\": %.1f, \"populate_pages_per_s\": %.0f, "
         "\"warmup_ops\": %llu, \"warmup_timed_out\": %s, \"warmup_s\": %.4f, "
         "\"ops\": %llu, \"timed_out\": %s, \"seconds\": %.4f, \"touches_per_s\": %.1f, "
         "\"samples\": %zu, \"sample_every\": %llu, \"lat_mean_us\": %.3f, \"p50_us\": %.3f, \"p90_us\": %.3f, "
         "\"p99_us\": %.3f, \"p999_us\": %.3f, \"max_us\": %.1f, "
         "\"majflt\": %ld, \"minflt\": %ld, \"maxrss_mib\": %.1f, \"writes\": %llu, \"checksum\": \"%016llx\", "
         "\"verified\": %s, \"verify_s\": %.4f, \"bad\": %llu, \"ok\": %s}\n",
         (unsigned long long)(np * PG), (unsigned long long)np, pnames[pattern], wpct, (unsigned long long)seed,
         pop_s, np * PG / pop_s / 1e6, np / pop_s, (unsigned long long)wdone, warm_timed_out ? "true" : "false", warm_s,
         (unsigned long long)n, timed_out ? "true" : "false", el, n / el,
         ns, (unsigned long long)every, ns ? sum / ns / 1e3 : 0.0, PCT(0.5), PCT(0.9), PCT(0.99), PCT(0.999),
         ns ? lat[ns - 1] / 1e3 : 0.0,
         r1.ru_majflt - r0.ru_majflt, r1.ru_minflt - r0.ru_minflt, ru.ru_maxrss / 1024.0, (unsigned long long)writes,
         (unsigned long long)checksum, verify ? "true" : "false", ver_s, (unsigned long long)(bad + vbad),
         ok ? "true" : "false");
  free(raw);
  return ok ? 0 : 1;
}
