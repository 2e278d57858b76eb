/* Tracer's binary-tree micro-benchmark (seed 003, section 4), for `bench/run memprof`.
 *   bintree create   N        build a tree of N random keys
 *   bintree read     N OPS    build N keys, then OPS random searches
 *   bintree update   N OPS    build N keys, then OPS (source, destination) pairs: the
 *                             source's value becomes the destination's
 *   bintree traverse N OPS    build N keys, then OPS in-order traversals
 * Prints `ns NANOSECONDS` (the measured phase, timed inside) and a checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct node { long key, value; struct node *left, *right; };

static unsigned long rng = 88172645463325252ul;
static long rnd(long n) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (long)(rng % (unsigned long)n); }

static struct node *insert(struct node *t, long key) {
  struct node **p = &t;
  while (*p) {
    if (key == (*p)->key) return t;
    p = key < (*p)->key ? &(*p)->left : &(*p)->right;
  }
  struct node *n = malloc(sizeof *n);
  n->key = key; n->value = key * 3; n->left = n->right = 0;
  *p = n;
  return t;
}
static struct node *find(struct node *t, long key) {
  while (t && t->key != key) t = key < t->key ? t->left : t->right;
  return t;
}
static long walk(struct node *t) { return t ? walk(t->left) + t->value + walk(t->right) : 0; }
static long now_ns(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1000000000L + ts.tv_nsec; }

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: bintree create|read|update|traverse N [OPS]\n"); return 2; }
  char mode = argv[1][0];
  long n = atol(argv[2]), ops = argc > 3 ? atol(argv[3]) : 0, sum = 0, range = n * 4;
  struct node *t = 0;
  long t0 = now_ns();
  for (long i = 0; i < n; i++) t = insert(t, rnd(range));
  if (mode != 'c') t0 = now_ns();
  for (long i = 0; i < ops; i++) {
    if (mode == 'r') { struct node *f = find(t, rnd(range)); sum += f ? f->value : 0; }
    else if (mode == 'u') { struct node *s = find(t, rnd(range)), *d = find(t, rnd(range)); if (s && d) s->value = d->value; }
    else if (mode == 't') sum += walk(t);
  }
  long t1 = now_ns();
  printf("ns %ld\nsum %ld\n", t1 - t0, sum + walk(t));
  return 0;
}
