// ycsb_load.c - a YCSB-style closed-loop load generator for redis (RESP) and memcached (text
// protocol); bench/apps.py builds it (cc -O2 -pthread ... -lm) and drives every peer with it.
//
//   ycsb_load --proto redis|memcached [--host 127.0.0.1] --port P --records N
//             [--load] [--threads 16] [--pipeline 1] [--read-pct 95] [--seconds S] [--ops N]
//             [--warm-ops N] [--warm-seconds S] [--zipf 0.99] [--zipf-items ycsb|records]
//             [--value-size 1024] [--values ycsb|text] [--seed 1] [--load-pipeline 64]
//             [--timeout 120]
//
// --load: the load phase. Writes records 0..N-1 (keys "user%012llu", 16 bytes) once each,
//   the key range split evenly across the threads, --load-pipeline SETs in flight per thread.
// Otherwise: an untimed warm-up (--warm-ops operations or --warm-seconds, whichever ends first;
//   none if both are 0), then the timed phase (--ops operations or --seconds, whichever ends
//   first; at least one of them). Each thread holds one blocking TCP connection and keeps
//   --pipeline requests in flight: it sends a batch, reads every reply, sends the next (closed
//   loop). An operation is a GET with probability --read-pct %, else an update: a SET of a fresh
//   value of the same size. A single read-back of K random keys is `--threads 1 --zipf 0
//   --read-pct 100 --ops K`.
//
// Keys: YCSB's ScrambledZipfianGenerator. A zipfian rank is drawn with the Gray et al.
//   algorithm ("Quickly generating billion-record synthetic databases", SIGMOD 1994; YCSB's
//   ZipfianGenerator) over YCSB's 10^10 items (its zeta constant for theta 0.99, computed for
//   any other theta), and the record is fnvhash64(rank) mod N (YCSB's FNV-1a over the rank's 8
//   bytes, then abs), so the hot records are scattered over the key space and over memory.
//   Note what this implies, as in YCSB itself: with 10^10 ranks folded onto N records, only
//   zeta(N)/zeta(10^10) of the draws come from the top N ranks (about 56% at N = 650 K, theta
//   0.99); the rest land nearly uniformly. --zipf-items records draws ranks over N instead (a
//   much hotter head). --zipf 0 is uniform.
//
// Values (exactly --value-size bytes): a 26-byte header "user000000001234:89abcdef:" (the key
//   and a 32-bit hash of the rest of the value), then the body: --values ycsb: printable
//   random bytes as YCSB's RandomByteIterator makes them (' ' + 5 random bits each, so lz4
//   finds nothing to take out); --values text: a JSON-ish record {"field0":"...",...} of words
//   from a fixed vocabulary, which lz4 shrinks about 2-3x page by page (zram with lz4: 2.2x on
//   150 MB of 1 KiB values, 2.3-2.7x in bench/apps.py runs). Values under 32 bytes
//   get no header.
//
// Checks on every GET: the key is found (a miss is counted: after a complete load any miss is
//   an error), the value has --value-size bytes, and its header names the key asked for and
//   matches the body's hash (a wrong, torn or zeroed value counts as bad_values). A reply that
//   breaks the protocol, a server error or a dead connection counts in errors and ends that
//   thread's connection.
//
// Output: one JSON line on stdout: ops, seconds, ops_per_s, reads, updates, misses, bad_values,
//   errors (all of the timed phase; the warm-up's own as warm_*), latency p50/p99/p99.9/mean/max
//   in microseconds per operation (from sending its batch to parsing its reply; an HDR-like
//   histogram of 64 sub-buckets per power of two, so within 1.6%, merged across threads), the
//   client's CPU seconds. Exit status 0 when errors, misses and bad values are all 0, 3 if not,
//   2 on bad usage or when no connection could be made.
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define KEYLEN 16
#define HDRLEN 26 // key ':' 8 hex ':'
#define NBUCKETS 4096
#define YCSB_ITEM_COUNT 10000000000ULL
#define YCSB_ZETAN_099 26.46902820178302 // YCSB's ScrambledZipfianGenerator.ZETAN (theta 0.99)

enum proto { REDIS, MEMCACHED };

static struct {
  const char *host;
  int port;
  enum proto proto;
  int threads, pipeline, load_pipeline;
  uint64_t records;
  int read_pct;
  double seconds, warm_seconds;
  uint64_t ops, warm_ops;
  double theta;
  int zipf_records; // ranks over N instead of YCSB's 10^10
  int value_size;
  int text;
  uint64_t seed;
  int load;
  int timeout_s;
} O = {"127.0.0.1", 0, REDIS, 16, 1, 64, 0, 95, 0, 0, 0, 0, 0.99, 0, 1024, 0, 1, 0, 120};

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

// ---- random numbers: xoshiro256** per thread, seeded by splitmix64 ----------------------------

typedef struct {
  uint64_t s[4];
} rng_t;
static inline uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static void rng_seed(rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t rng_next(rng_t *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}
static inline double rng01(rng_t *r) { return (rng_next(r) >> 11) * 0x1.0p-53; }
static inline uint64_t rng_below(rng_t *r, uint64_t n) {
  return (uint64_t)(((unsigned __int128)rng_next(r) * n) >> 64);
}

// ---- YCSB's ScrambledZipfianGenerator ----------------------------------------------------------

static struct {
  double items, theta, zetan, zeta2, alpha, eta, half_pow;
} Z;

// sum_{i=1..n} i^-theta: exact up to 10^6, then Euler-Maclaurin for the tail (error far below
// a double's precision at that start); checked against YCSB's constant for 10^10 at 0.99.
static double zeta(double n, double theta) {
  double m = n < 1e6 ? n : 1e6, s = 0;
  for (double i = 1; i <= m; i++) s += pow(i, -theta);
  if (n <= m) return s;
  double tail = (theta == 1.0 ? log(n / m) : (pow(n, 1 - theta) - pow(m, 1 - theta)) / (1 - theta));
  tail += (pow(n, -theta) - pow(m, -theta)) / 2;
  tail += (-theta * pow(n, -theta - 1) + theta * pow(m, -theta - 1)) / 12;
  return s + tail;
}

static void zipf_init(void) {
  Z.theta = O.theta;
  Z.items = O.zipf_records ? (double)O.records : (double)YCSB_ITEM_COUNT;
  if (O.theta == 0) return;
  Z.zeta2 = zeta(2, O.theta);
  Z.zetan = (!O.zipf_records && O.theta == 0.99) ? YCSB_ZETAN_099 : zeta(Z.items, O.theta);
  Z.alpha = 1.0 / (1.0 - O.theta);
  Z.eta = (1 - pow(2.0 / Z.items, 1 - O.theta)) / (1 - Z.zeta2 / Z.zetan);
  Z.half_pow = 1.0 + pow(0.5, O.theta);
}

static inline uint64_t fnvhash64(uint64_t val) { // YCSB Utils.fnvhash64
  uint64_t h = 0xCBF29CE484222325ULL;
  for (int i = 0; i < 8; i++) {
    h ^= val & 0xff;
    val >>= 8;
    h *= 1099511628211ULL;
  }
  int64_t s = (int64_t)h;
  return (uint64_t)(s < 0 ? -s : s); // Math.abs (Long.MIN_VALUE stays itself; mod below is unsigned)
}

static inline uint64_t next_key(rng_t *r) {
  if (Z.theta == 0) return rng_below(r, O.records);
  double u = rng01(r), uz = u * Z.zetan;
  uint64_t rank;
  if (uz < 1.0)
    rank = 0;
  else if (uz < Z.half_pow)
    rank = 1;
  else
    rank = (uint64_t)(Z.items * pow(Z.eta * u - Z.eta + 1, Z.alpha));
  return fnvhash64(rank) % O.records;
}

// ---- values ----------------------------------------------------------------------------------

static inline uint64_t body_hash(const char *p, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  for (; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 32);
}

static const char *WORDS[] = {
    "the", "of", "and", "to", "in", "is", "for", "that", "with", "on", "as", "by", "this", "from", "at", "or",
    "be", "are", "was", "it", "an", "which", "not", "have", "has", "but", "all", "can", "more", "one", "new",
    "their", "will", "about", "other", "been", "into", "time", "only", "some", "over", "such", "also", "after",
    "first", "two", "most", "these", "would", "where", "there", "when", "who", "than", "what", "then", "its",
    "people", "years", "could", "state", "under", "world", "between", "during", "system", "government",
    "school", "city", "market", "water", "company", "service", "history", "research", "music", "family",
    "house", "order", "account", "customer", "product", "address", "street", "country", "number", "status",
    "shipping", "payment", "pending", "delivered", "invoice", "quantity", "price", "discount", "review",
    "rating", "comment", "message", "session", "profile", "settings", "language", "english", "german",
    "french", "spanish", "mobile", "desktop", "browser", "android", "linux", "windows", "version", "update",
    "release", "feature", "request", "response", "server", "client", "network", "storage", "memory", "cache",
    "database", "table", "record", "index", "query", "result", "error", "warning", "notice", "event", "user",
    "admin", "group", "member", "owner", "public", "private", "shared", "active", "inactive", "blocked",
    "verified", "created", "modified", "deleted", "archived", "monday", "tuesday", "wednesday", "thursday",
    "friday", "saturday", "sunday", "january", "february", "march", "april", "june", "july", "august",
    "september", "october", "november", "december", "morning", "evening", "night", "today", "yesterday",
    "tomorrow", "north", "south", "east", "west", "central", "river", "mountain", "valley", "garden", "park",
    "station", "airport", "hotel", "restaurant", "coffee", "bread", "cheese", "apple", "orange", "banana",
    "chicken", "salad", "pizza", "pasta", "red", "green", "blue", "yellow", "black", "white", "small", "large",
    "medium", "quick", "brown", "fox", "jumps", "lazy", "dog", "good", "great", "best", "better", "little",
    "long", "high", "old", "young", "big", "right", "left", "open", "closed", "free", "full", "empty",
    "ready", "simple", "strong", "light", "heavy", "fast", "slow", "early", "late", "order_id", "user_id",
    "item_id", "total", "amount", "currency", "euro", "dollar", "tax", "card", "visa", "email", "phone",
    "name", "first_name", "last_name", "city_name", "zip", "region", "note", "tags", "category", "books",
    "sports", "games", "toys", "tools", "health", "beauty", "kitchen", "office", "electronics", "camera"};
#define NWORDS (sizeof(WORDS) / sizeof(WORDS[0]))
#ifndef NPHRASES
#define NPHRASES 256
#endif
// The text's units: NPHRASES fixed phrases of 2-5 words (made once from WORDS with a fixed
// seed), chosen by Zipf's law (p ~ 1/rank). Repeated multi-word phrases are what makes
// real text and JSON compress; words alone at random (tried) gave lz4 only 1.5-1.7x a page.
static char *PHR[NPHRASES];
static uint8_t PLEN[NPHRASES];
static double PCDF[NPHRASES];

static void words_init(void) {
  rng_t r;
  rng_seed(&r, 0x746578742121ULL);
  double tot = 0, cum = 0;
  for (int i = 0; i < NPHRASES; i++) tot += 1.0 / (double)(i + 1);
  for (int i = 0; i < NPHRASES; i++) {
    char b[128];
    int n = 0, nw = 2 + (int)rng_below(&r, 4);
    for (int j = 0; j < nw; j++)
      n += snprintf(b + n, sizeof b - (size_t)n, "%s%s", j ? " " : "", WORDS[rng_below(&r, NWORDS)]);
    PHR[i] = strdup(b);
    PLEN[i] = (uint8_t)n;
    cum += 1.0 / (double)(i + 1) / tot;
    PCDF[i] = cum;
  }
  PCDF[NPHRASES - 1] = 1.0;
}

// One value for key k into out[0..vs): header, then the body.
static void make_value(rng_t *r, uint64_t k, char *out) {
  int vs = O.value_size, start = vs >= 32 ? HDRLEN : 0;
  char *p = out + start, *end = out + vs;
  if (!O.text) {
    while (p < end) {
      uint64_t x = rng_next(r);
      for (int j = 0; j < 12 && p < end; j++, x >>= 5) *p++ = (char)(' ' + (x & 31));
    }
  } else {
    int field = 0;
    *p++ = '{';
    while (p < end) {
      char f[24];
      int n = snprintf(f, sizeof f, "%s\"field%d\":\"", field ? "," : "", field);
      field++;
      for (int j = 0; j < n && p < end; j++) *p++ = f[j];
      char *fend = p + 90; // ~100 bytes a field, like YCSB's ten fields of 100 bytes
      int first = 1;
      while (p < fend && p < end) {
        double u = rng01(r);
        unsigned lo = 0, hi = NPHRASES - 1;
        while (lo < hi) {
          unsigned mid = (lo + hi) / 2;
          if (PCDF[mid] < u)
            lo = mid + 1;
          else
            hi = mid;
        }
        if (!first && p < end) *p++ = ' ';
        first = 0;
        for (int j = 0; j < PLEN[lo] && p < end; j++) *p++ = PHR[lo][j];
      }
      if (p < end) *p++ = '"';
    }
    if (vs - start >= 2) end[-1] = '}';
  }
  if (start) {
    char h[HDRLEN + 1];
    snprintf(h, sizeof h, "user%012llu:%08x:", (unsigned long long)k,
             (unsigned)body_hash(out + HDRLEN, (size_t)(vs - HDRLEN)));
    memcpy(out, h, HDRLEN);
  }
}

// 0 if value v (n bytes) is a good value of key k
static int check_value(uint64_t k, const char *v, long n) {
  if (n != O.value_size) return 1;
  if (n < 32) return 0;
  char h[HDRLEN + 1];
  snprintf(h, sizeof h, "user%012llu:%08x:", (unsigned long long)k,
           (unsigned)body_hash(v + HDRLEN, (size_t)(n - HDRLEN)));
  return memcmp(h, v, HDRLEN) != 0;
}

// ---- histogram ---------------------------------------------------------------------------------

static inline int hbucket(uint64_t v) {
  if (v < 128) return (int)v;
  int msb = 63 - __builtin_clzll(v), shift = msb - 6;
  return (shift + 1) * 64 + (int)((v >> shift) - 64);
}
static double hvalue(int b) { // the bucket's midpoint
  if (b < 128) return b;
  int shift = b / 64 - 1;
  uint64_t sub = (uint64_t)(b % 64 + 64);
  return (double)(sub << shift) + (double)((1ULL << shift) / 2);
}

// ---- connections -----------------------------------------------------------------------------

typedef struct {
  int fd;
  char *buf;
  size_t cap, off, len; // unread bytes: buf[off .. off+len)
} conn_t;

static int conn_open(conn_t *c) {
  char port[16];
  snprintf(port, sizeof port, "%d", O.port);
  struct addrinfo hints = {0}, *res;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(O.host, port, &hints, &res) != 0) return -1;
  c->fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (c->fd < 0 || connect(c->fd, res->ai_addr, res->ai_addrlen) != 0) {
    freeaddrinfo(res);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    return -1;
  }
  freeaddrinfo(res);
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct timeval tv = {O.timeout_s, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  c->cap = 256 * 1024 + 4 * (size_t)O.value_size;
  c->buf = malloc(c->cap);
  c->off = c->len = 0;
  return c->buf ? 0 : -1;
}

static int send_all(conn_t *c, const char *p, size_t n) {
  while (n) {
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

// make at least n unread bytes available; -1 on EOF/error/timeout
static int need(conn_t *c, size_t n) {
  if (c->len >= n) return 0;
  if (n > c->cap) {
    size_t cap = n * 2;
    char *b = malloc(cap);
    if (!b) return -1;
    memcpy(b, c->buf + c->off, c->len);
    free(c->buf);
    c->buf = b;
    c->cap = cap;
    c->off = 0;
  } else if (c->off + n > c->cap) {
    memmove(c->buf, c->buf + c->off, c->len);
    c->off = 0;
  }
  while (c->len < n) {
    ssize_t r = recv(c->fd, c->buf + c->off + c->len, c->cap - c->off - c->len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = 0; // EOF
    if (r <= 0) return -1;
    c->len += (size_t)r;
  }
  return 0;
}

// one "\r\n"-terminated line (without it); NULL on EOF/error
static char *read_line(conn_t *c, size_t *n) {
  size_t scanned = 0;
  for (;;) {
    char *s = c->buf + c->off;
    for (size_t i = scanned; i + 1 < c->len; i++)
      if (s[i] == '\r' && s[i + 1] == '\n') {
        s[i] = 0;
        *n = i;
        c->off += i + 2;
        c->len -= i + 2;
        return s;
      }
    scanned = c->len ? c->len - 1 : 0;
    if (c->len > 1 << 20) return NULL; // no line end in 1 MiB: not our protocol
    if (need(c, c->len + 1) < 0) return NULL;
  }
}

static char *take(conn_t *c, size_t n) { // n raw bytes
  if (need(c, n) < 0) return NULL;
  char *p = c->buf + c->off;
  c->off += n;
  c->len -= n;
  return p;
}

// ---- per-thread work ---------------------------------------------------------------------------

typedef struct {
  uint64_t ops, reads, updates, misses, bad, errors;
} counts_t;

typedef struct {
  int id;
  pthread_t th;
  conn_t c;
  rng_t rng;
  int connected;
  counts_t warm, timed, load;
  uint64_t hist[NBUCKETS];
  double lat_sum_ns;
  uint64_t lat_max_ns;
  uint64_t lat_max_at_ns;  // CLOCK_MONOTONIC when the slowest op was sent
  char err[200];
  // a batch: the ops and their keys
  uint64_t *keys;
  uint8_t *is_get;
  char *out;
  size_t out_cap;
} thr_t;

static pthread_barrier_t BAR;
static atomic_uint_fast64_t CLAIMED;
static uint64_t PHASE_LIMIT; // 0: no op bound
static volatile uint64_t DEADLINE_NS;

static void seterr(thr_t *t, const char *fmt, const char *detail) {
  if (!t->err[0]) snprintf(t->err, sizeof t->err, fmt, detail);
}

static size_t put(char *p, const char *s, size_t n) {
  memcpy(p, s, n);
  return n;
}

// append one request for key k to the thread's output buffer; returns its length
static size_t encode(thr_t *t, size_t at, int get, uint64_t k) {
  char key[KEYLEN + 1], *p = t->out + at, *p0 = p;
  snprintf(key, sizeof key, "user%012llu", (unsigned long long)k);
  if (O.proto == REDIS) {
    if (get) {
      p += put(p, "*2\r\n$3\r\nGET\r\n$16\r\n", 18);
      p += put(p, key, KEYLEN);
      p += put(p, "\r\n", 2);
    } else {
      p += put(p, "*3\r\n$3\r\nSET\r\n$16\r\n", 18);
      p += put(p, key, KEYLEN);
      p += sprintf(p, "\r\n$%d\r\n", O.value_size);
      make_value(&t->rng, k, p);
      p += O.value_size;
      p += put(p, "\r\n", 2);
    }
  } else {
    if (get) {
      p += put(p, "get ", 4);
      p += put(p, key, KEYLEN);
      p += put(p, "\r\n", 2);
    } else {
      p += put(p, "set ", 4);
      p += put(p, key, KEYLEN);
      p += sprintf(p, " 0 0 %d\r\n", O.value_size);
      make_value(&t->rng, k, p);
      p += O.value_size;
      p += put(p, "\r\n", 2);
    }
  }
  return (size_t)(p - p0);
}

// read the reply to one op; 0 ok, -1 protocol/connection error (ends the connection)
static int reply(thr_t *t, int get, uint64_t k, counts_t *n) {
  conn_t *c = &t->c;
  size_t len;
  char *line = read_line(c, &len);
  if (!line) {
    seterr(t, "connection lost or timed out (%s)", errno ? strerror(errno) : "EOF");
    return -1;
  }
  if (O.proto == REDIS) {
    if (!get) {
      if (strcmp(line, "+OK") == 0) return 0;
      seterr(t, "SET: unexpected reply %.120s", line);
      return line[0] == '-' ? 1 : -1;
    }
    if (line[0] == '-') {
      seterr(t, "GET: error reply %.120s", line);
      return 1;
    }
    if (line[0] != '$') {
      seterr(t, "GET: unexpected reply %.120s", line);
      return -1;
    }
    long vlen = strtol(line + 1, NULL, 10);
    if (vlen < 0) {
      n->misses++;
      return 0;
    }
    char *v = take(c, (size_t)vlen + 2);
    if (!v) {
      seterr(t, "GET: connection lost in a value (%s)", errno ? strerror(errno) : "EOF");
      return -1;
    }
    if (check_value(k, v, vlen)) n->bad++;
    return 0;
  }
  // memcached
  if (!get) {
    if (strcmp(line, "STORED") == 0) return 0;
    seterr(t, "set: unexpected reply %.120s", line);
    return strncmp(line, "SERVER_ERROR", 12) == 0 ? 1 : -1;
  }
  if (strcmp(line, "END") == 0) {
    n->misses++;
    return 0;
  }
  unsigned flags;
  long vlen;
  char rkey[64];
  if (sscanf(line, "VALUE %63s %u %ld", rkey, &flags, &vlen) != 3 || vlen < 0) {
    seterr(t, "get: unexpected reply %.120s", line);
    return strncmp(line, "SERVER_ERROR", 12) == 0 ? 1 : -1;
  }
  char *v = take(c, (size_t)vlen + 2);
  if (!v) {
    seterr(t, "get: connection lost in a value (%s)", errno ? strerror(errno) : "EOF");
    return -1;
  }
  if (check_value(k, v, vlen)) n->bad++;
  line = read_line(c, &len);
  if (!line || strcmp(line, "END") != 0) {
    seterr(t, "get: no END after the value (%.100s)", line ? line : "EOF");
    return -1;
  }
  return 0;
}

// claim up to `want` ops of the phase; 0 when the phase is over
static int claim(int want) {
  if (now_ns() >= DEADLINE_NS) return 0;
  if (!PHASE_LIMIT) return want;
  uint64_t prev = atomic_fetch_add(&CLAIMED, (uint64_t)want);
  if (prev >= PHASE_LIMIT) return 0;
  return (int)(PHASE_LIMIT - prev < (uint64_t)want ? PHASE_LIMIT - prev : (uint64_t)want);
}

// ops until the phase ends; timed: record latencies
static void run_phase(thr_t *t, counts_t *n, int timed) {
  if (!t->connected) return;
  int got;
  while ((got = claim(O.pipeline)) > 0) {
    size_t at = 0;
    for (int i = 0; i < got; i++) {
      uint64_t k = next_key(&t->rng);
      int get = (int)rng_below(&t->rng, 100) < O.read_pct;
      t->keys[i] = k;
      t->is_get[i] = (uint8_t)get;
      at += encode(t, at, get, k);
    }
    uint64_t t0 = now_ns();
    if (send_all(&t->c, t->out, at) < 0) {
      seterr(t, "send failed (%s)", strerror(errno));
      n->errors++;
      t->connected = 0;
      close(t->c.fd);
      return;
    }
    for (int i = 0; i < got; i++) {
      int r = reply(t, t->is_get[i], t->keys[i], n);
      if (r < 0) {
        n->errors++;
        t->connected = 0;
        close(t->c.fd);
        return;
      }
      if (r > 0) {
        n->errors++;
        continue;
      }
      n->ops++;
      if (t->is_get[i])
        n->reads++;
      else
        n->updates++;
      if (timed) {
        uint64_t d = now_ns() - t0;
        t->hist[hbucket(d)]++;
        t->lat_sum_ns += (double)d;
        if (d > t->lat_max_ns) {
          t->lat_max_ns = d;
          t->lat_max_at_ns = t0;
        }
      }
    }
  }
}

static void load_range(thr_t *t) {
  uint64_t lo = O.records * (uint64_t)t->id / (uint64_t)O.threads;
  uint64_t hi = O.records * (uint64_t)(t->id + 1) / (uint64_t)O.threads;
  if (!t->connected) return;
  for (uint64_t k = lo; k < hi;) {
    int got = (int)(hi - k < (uint64_t)O.load_pipeline ? hi - k : (uint64_t)O.load_pipeline);
    size_t at = 0;
    for (int i = 0; i < got; i++) at += encode(t, at, 0, k + (uint64_t)i);
    if (send_all(&t->c, t->out, at) < 0) {
      seterr(t, "send failed (%s)", strerror(errno));
      t->load.errors++;
      t->connected = 0;
      return;
    }
    for (int i = 0; i < got; i++) {
      int r = reply(t, 0, k + (uint64_t)i, &t->load);
      if (r < 0) {
        t->load.errors++;
        t->connected = 0;
        close(t->c.fd);
        return;
      }
      if (r > 0)
        t->load.errors++;
      else
        t->load.ops++, t->load.updates++;
    }
    k += (uint64_t)got;
  }
}

static void *thread_main(void *arg) {
  thr_t *t = arg;
  t->connected = conn_open(&t->c) == 0;
  if (!t->connected) seterr(t, "connect failed (%s)", strerror(errno));
  pthread_barrier_wait(&BAR); // all connected
  if (O.load) {
    pthread_barrier_wait(&BAR); // go
    load_range(t);
    return NULL;
  }
  pthread_barrier_wait(&BAR); // warm-up starts
  run_phase(t, &t->warm, 0);
  pthread_barrier_wait(&BAR); // warm-up over
  pthread_barrier_wait(&BAR); // timed phase starts
  run_phase(t, &t->timed, 1);
  return NULL;
}

static uint64_t parse_count(const char *s) {
  char *e;
  double v = strtod(s, &e);
  if (*e == 'k' || *e == 'K') v *= 1e3;
  if (*e == 'm' || *e == 'M') v *= 1e6;
  return (uint64_t)v;
}

static void usage(void) {
  fprintf(stderr,
          "usage: ycsb_load --proto redis|memcached --port P --records N [--host H] [--load] [--threads T]\n"
          "       [--pipeline P] [--read-pct R] [--seconds S] [--ops N] [--warm-ops N] [--warm-seconds S]\n"
          "       [--zipf THETA] [--zipf-items ycsb|records] [--value-size B] [--values ycsb|text] [--seed N]\n"
          "       [--load-pipeline P] [--timeout S]\n");
  exit(2);
}

static void sum(counts_t *a, const counts_t *b) {
  a->ops += b->ops, a->reads += b->reads, a->updates += b->updates;
  a->misses += b->misses, a->bad += b->bad, a->errors += b->errors;
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 32)
      printf("\\u%04x", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

int main(int argc, char **argv) {
  static struct option lo[] = {{"proto", 1, 0, 'P'},        {"host", 1, 0, 'h'},          {"port", 1, 0, 'p'},
                               {"threads", 1, 0, 't'},      {"pipeline", 1, 0, 'l'},      {"records", 1, 0, 'n'},
                               {"read-pct", 1, 0, 'r'},     {"seconds", 1, 0, 's'},       {"ops", 1, 0, 'o'},
                               {"warm-ops", 1, 0, 'w'},     {"warm-seconds", 1, 0, 'W'},  {"zipf", 1, 0, 'z'},
                               {"zipf-items", 1, 0, 'Z'},   {"value-size", 1, 0, 'v'},    {"values", 1, 0, 'V'},
                               {"seed", 1, 0, 'S'},         {"load", 0, 0, 'L'},          {"load-pipeline", 1, 0, 'q'},
                               {"timeout", 1, 0, 'T'},      {"help", 0, 0, '?'},          {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'P':
      if (!strcmp(optarg, "redis"))
        O.proto = REDIS;
      else if (!strcmp(optarg, "memcached"))
        O.proto = MEMCACHED;
      else
        usage();
      break;
    case 'h': O.host = optarg; break;
    case 'p': O.port = atoi(optarg); break;
    case 't': O.threads = atoi(optarg); break;
    case 'l': O.pipeline = atoi(optarg); break;
    case 'n': O.records = parse_count(optarg); break;
    case 'r': O.read_pct = atoi(optarg); break;
    case 's': O.seconds = atof(optarg); break;
    case 'o': O.ops = parse_count(optarg); break;
    case 'w': O.warm_ops = parse_count(optarg); break;
    case 'W': O.warm_seconds = atof(optarg); break;
    case 'z': O.theta = atof(optarg); break;
    case 'Z':
      if (!strcmp(optarg, "records"))
        O.zipf_records = 1;
      else if (strcmp(optarg, "ycsb"))
        usage();
      break;
    case 'v': O.value_size = atoi(optarg); break;
    case 'V':
      if (!strcmp(optarg, "text"))
        O.text = 1;
      else if (strcmp(optarg, "ycsb"))
        usage();
      break;
    case 'S': O.seed = strtoull(optarg, NULL, 0); break;
    case 'L': O.load = 1; break;
    case 'q': O.load_pipeline = atoi(optarg); break;
    case 'T': O.timeout_s = atoi(optarg); break;
    default: usage();
    }
  }
  if (!O.port || !O.records || O.threads < 1 || O.pipeline < 1 || O.load_pipeline < 1 || O.value_size < 1 ||
      O.read_pct < 0 || O.read_pct > 100 || O.theta < 0 || O.theta >= 1 || O.records >= 1000000000000ULL)
    usage();
  if (!O.load && O.seconds <= 0 && O.ops == 0) {
    fprintf(stderr, "ycsb_load: give --seconds and/or --ops (or --load)\n");
    usage();
  }
  signal(SIGPIPE, SIG_IGN);
  words_init();
  zipf_init();

  int batch = O.load ? O.load_pipeline : O.pipeline;
  thr_t *T = calloc((size_t)O.threads, sizeof(thr_t));
  for (int i = 0; i < O.threads; i++) {
    thr_t *t = &T[i];
    t->id = i;
    rng_seed(&t->rng, O.seed * 0x100000001b3ULL + (uint64_t)i * 0x9e3779b97f4a7c15ULL + 1);
    t->keys = calloc((size_t)batch, sizeof(uint64_t));
    t->is_get = calloc((size_t)batch, 1);
    t->out_cap = (size_t)batch * ((size_t)O.value_size + 96);
    t->out = malloc(t->out_cap);
  }
  pthread_barrier_init(&BAR, NULL, (unsigned)O.threads + 1);
  DEADLINE_NS = UINT64_MAX;
  for (int i = 0; i < O.threads; i++) pthread_create(&T[i].th, NULL, thread_main, &T[i]);
  pthread_barrier_wait(&BAR); // all connected
  int nconn = 0;
  for (int i = 0; i < O.threads; i++) nconn += T[i].connected;

  struct rusage ru0, ru1;
  getrusage(RUSAGE_SELF, &ru0);
  uint64_t t0, t1, w0 = 0, w1 = 0;
  if (O.load) {
    t0 = now_ns();
    pthread_barrier_wait(&BAR);
    for (int i = 0; i < O.threads; i++) pthread_join(T[i].th, NULL);
    t1 = now_ns();
  } else {
    int warm = O.warm_ops > 0 || O.warm_seconds > 0;
    PHASE_LIMIT = warm ? O.warm_ops : 0;
    atomic_store(&CLAIMED, 0);
    w0 = now_ns();
    DEADLINE_NS = !warm ? 0 : O.warm_seconds > 0 ? w0 + (uint64_t)(O.warm_seconds * 1e9) : UINT64_MAX;
    pthread_barrier_wait(&BAR); // warm-up starts
    pthread_barrier_wait(&BAR); // warm-up over
    w1 = now_ns();
    PHASE_LIMIT = O.ops;
    atomic_store(&CLAIMED, 0);
    getrusage(RUSAGE_SELF, &ru0);
    t0 = now_ns();
    DEADLINE_NS = O.seconds > 0 ? t0 + (uint64_t)(O.seconds * 1e9) : UINT64_MAX;
    pthread_barrier_wait(&BAR); // timed phase starts
    for (int i = 0; i < O.threads; i++) pthread_join(T[i].th, NULL);
    t1 = now_ns();
  }
  getrusage(RUSAGE_SELF, &ru1);
  double cpu = (ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) + (ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
               (ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) + (ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;

  counts_t warm = {0}, timed = {0}, load = {0};
  static uint64_t hist[NBUCKETS];
  double lat_sum = 0;
  uint64_t lat_max = 0, lat_max_at = 0;
  const char *err = "";
  for (int i = 0; i < O.threads; i++) {
    sum(&warm, &T[i].warm);
    sum(&timed, &T[i].timed);
    sum(&load, &T[i].load);
    for (int b = 0; b < NBUCKETS; b++) hist[b] += T[i].hist[b];
    lat_sum += T[i].lat_sum_ns;
    if (T[i].lat_max_ns > lat_max) {
      lat_max = T[i].lat_max_ns;
      lat_max_at = T[i].lat_max_at_ns;
    }
    if (!err[0] && T[i].err[0]) err = T[i].err;
  }
  double secs = (double)(t1 - t0) / 1e9;
  counts_t *m = O.load ? &load : &timed;
  printf("{\"mode\":\"%s\",\"proto\":\"%s\",\"threads\":%d,\"connected\":%d,\"pipeline\":%d,\"records\":%llu,"
         "\"read_pct\":%d,\"zipf\":%g,\"zipf_items\":%.0f,\"zipf_zetan\":%.6f,\"value_size\":%d,\"values\":\"%s\","
         "\"seed\":%llu,",
         O.load ? "load" : "run", O.proto == REDIS ? "redis" : "memcached", O.threads, nconn, batch,
         (unsigned long long)O.records, O.read_pct, O.theta, Z.items, Z.zetan, O.value_size, O.text ? "text" : "ycsb",
         (unsigned long long)O.seed);
  printf("\"ops\":%llu,\"seconds\":%.4f,\"ops_per_s\":%.1f,\"reads\":%llu,\"updates\":%llu,\"misses\":%llu,"
         "\"bad_values\":%llu,\"errors\":%llu,",
         (unsigned long long)m->ops, secs, secs > 0 ? m->ops / secs : 0, (unsigned long long)m->reads,
         (unsigned long long)m->updates, (unsigned long long)m->misses, (unsigned long long)m->bad,
         (unsigned long long)m->errors);
  if (!O.load) {
    uint64_t total = 0;
    for (int b = 0; b < NBUCKETS; b++) total += hist[b];
    double q[3] = {0.50, 0.99, 0.999}, v[3] = {0, 0, 0};
    for (int j = 0; j < 3; j++) {
      uint64_t want = (uint64_t)ceil(q[j] * (double)total), cum = 0;
      for (int b = 0; b < NBUCKETS && total; b++) {
        cum += hist[b];
        if (cum >= want) {
          v[j] = hvalue(b);
          break;
        }
      }
    }
    printf("\"p50_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,\"mean_us\":%.2f,\"max_us\":%.1f,", v[0] / 1e3,
           v[1] / 1e3, v[2] / 1e3, total ? lat_sum / (double)total / 1e3 : 0, lat_max / 1e3);
    // the wall clock of the slowest op's send, to line it up with a trace taken beside the run
    struct timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    double mono_to_real_s = (double)real.tv_sec + real.tv_nsec / 1e9 - (double)now_ns() / 1e9;
    printf("\"max_at_unix_s\":%.3f,", lat_max ? mono_to_real_s + (double)lat_max_at / 1e9 : 0.0);
    printf("\"warm_ops\":%llu,\"warm_seconds\":%.3f,\"warm_misses\":%llu,\"warm_bad_values\":%llu,"
           "\"warm_errors\":%llu,",
           (unsigned long long)warm.ops, (double)(w1 - w0) / 1e9, (unsigned long long)warm.misses,
           (unsigned long long)warm.bad, (unsigned long long)warm.errors);
  }
  printf("\"client_cpu_s\":%.3f,\"first_error\":", cpu);
  json_str(err);
  printf("}\n");
  fflush(stdout);
  if (nconn == 0) return 2;
  counts_t all = *m;
  sum(&all, &warm);
  return (all.errors || all.misses || all.bad || nconn < O.threads) ? 3 : 0;
}
