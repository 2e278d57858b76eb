/* The `./app` of the README's usage examples, so that a test can run every one of
 * them (crates/cli/tests/readme.rs). It has each function the examples probe.
 * usage: app            handle five built-in requests and parse them again (10
 *                       parse calls), then exit 0
 *        app FILE       open FILE (open_file), handle each of its lines as a request
 *        app serve      print "ready", then handle a request every millisecond until
 *                       killed (the examples' `-p 4242`)
 * Each request's answer is written to /dev/null (a system call inside handle()).
 * Built with include/weft.h on the include path: the `app:request` USDT probe with a
 * semaphore, and `app:start`. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weft.h"

WEFT_SEMAPHORE(app, request);

struct point {
  long x;
  const char *name;
};

/* A request's length, or -1 for an empty one. */
__attribute__((noinline)) int parse(const char *s) {
  __asm__ volatile("" ::: "memory"); /* not pure: every call stays */
  size_t n = strlen(s);
  return n ? (int)n : -1;
}

__attribute__((noinline)) int parse_all(char **reqs, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) bad += parse(reqs[i]) < 0;
  return bad;
}

__attribute__((noinline)) long dist(struct point *p) {
  return p->x < 0 ? -p->x : p->x;
}

__attribute__((noinline)) int open_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  fclose(f);
  return 0;
}

static const char *describe(const char *req) {
  return req[0] ? req : "(empty)";
}

/* Where handle() writes its answer (a system call inside a request, for the
 * README's kernel-probe examples). */
static int out_fd = -1;

__attribute__((noinline)) int handle(long id, const char *req) {
  WEFT_PROBE(app, start);
  if (out_fd < 0) out_fd = open("/dev/null", O_WRONLY);
  if (write(out_fd, req, strlen(req)) < 0) return -1;
  if (WEFT_PROBE_ENABLED(app, request)) WEFT_PROBE(app, request, id, describe(req));
  struct point p = {id, req};
  char *copy = malloc(16 + (size_t)(id % 64));
  strcpy(copy, "req");
  long d = dist(&p);
  free(copy);
  return parse(req) + (int)(d & 0);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && strcmp(argv[1], "serve") == 0) {
    printf("ready\n");
    for (long i = 0;; i++) {
      handle(i, i % 3 ? "get" : "put");
      usleep(1000);
    }
  }
  long handled = 0, bad = 0;
  if (argc > 1 && open_file(argv[1]) == 0) {
    FILE *f = fopen(argv[1], "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
      line[strcspn(line, "\n")] = 0;
      bad += handle(handled++, line) < 0;
    }
    if (f) fclose(f);
  } else {
    char *reqs[] = {"get", "put", "", "delete", "scan"};
    for (int i = 0; i < 5; i++) bad += handle(handled++, reqs[i]) < 0;
    if (parse_all(reqs, 5) != bad) return 1;
  }
  printf("handled %ld, %ld bad\n", handled, bad);
  return 0;
}
