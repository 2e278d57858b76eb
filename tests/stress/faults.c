/* Inputs for advice that faults: bad pointers, zero divisors, many map keys, long
 * strings. usage: faults N [GO DONE]   (each function below is called N times; prints
 * a checksum the test compares with a run without weft). With GO and DONE (FIFOs),
 * the calls start once a byte can be read from GO, and "done" is written to DONE
 * after the last one: the test holds weft stopped in between. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct pt {
  long x, y;
  const char *name;
};

/* Called with a bad pointer on every call. */
__attribute__((noipa)) long bad_ptr(const char *p, long i) {
  __asm__ volatile("");
  return i + (p != 0);
}

/* Called with a bad struct pointer on every call. */
__attribute__((noipa)) long bad_struct(struct pt *p, long i) {
  __asm__ volatile("");
  return i * 2 + (p != 0);
}

/* Called with a divisor of 0 on every call. */
__attribute__((noipa)) long divide(long a, long b) {
  __asm__ volatile("");
  return a + b;
}

/* Called with a new key on every call. */
__attribute__((noipa)) long key(long k) {
  __asm__ volatile("");
  return k ^ 1;
}

/* Called with a 1000-byte string. */
__attribute__((noipa)) long long_string(const char *s) {
  __asm__ volatile("");
  return s[999];
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
  char *none = mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const char *bad[] = {(char *)1, (char *)-8L, (char *)0x1000, none};
  char *big = malloc(1001);
  memset(big, 'a', 1000);
  big[1000] = 0;
  big[999] = 'z';
  if (argc > 3) {
    char c;
    int go = open(argv[2], O_RDONLY);
    if (go < 0 || read(go, &c, 1) != 1)
      return 2;
    close(go);
  }
  for (long i = 0; i < n; i++) {
    sum += bad_ptr(bad[i % 4], i);
    sum += bad_struct((struct pt *)bad[(i + 1) % 4], i);
    sum += divide(i, 0);
    sum += key(i);
    sum += long_string(big);
  }
  if (argc > 3) {
    int done = open(argv[3], O_WRONLY);
    if (done < 0 || write(done, "done", 4) != 4)
      return 2;
    close(done);
  }
  printf("sum=%ld\n", sum);
  return 0;
}
