// far_straddle MIB: two MIB-MiB blocks (far memory under memlend run), and
// at every page boundary of the first an 8-byte load that straddles it,
// stored straddling the same boundary of the second: each such instruction
// needs two far pages of each block mapped at once. Prints the sum of what
// it copied, which a plain run prints too.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  size_t len = (size_t)(argc > 1 ? atoi(argv[1]) : 8) << 20;
  unsigned char *a = malloc(len), *b = malloc(len);
  if (!a || !b) return 1;
  for (size_t i = 0; i < len; i++) a[i] = (unsigned char)(i * 7 + i / 4096);
  memset(b, 0, len);
  uint64_t sum = 0;
  for (size_t at = 4096 - 4; at + 8 <= len; at += 4096) {
    uint64_t v;
    // volatile: one 8-byte load and one 8-byte store, not split by the compiler.
    v = *(volatile uint64_t *)(a + at);
    *(volatile uint64_t *)(b + at) = v;
    sum += v;
  }
  uint64_t check = 0;
  for (size_t at = 4096 - 4; at + 8 <= len; at += 4096) check += *(uint64_t *)(b + at);
  printf("%llu %s\n", (unsigned long long)sum, check == sum ? "same" : "DIFFERENT");
  return check == sum ? 0 : 2;
}
