/* The bundled demo program: parses a batch of synthetic request lines, checksums
 * each body and keeps the results in heap buffers. `weft demo` weaves into it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct request {
  char method[8];
  char path[48];
  long size;
};

__attribute__((noinline)) long checksum(const char *buf, long len) {
  long s = 0;
  for (long i = 0; i < len; i++) s = s * 31 + (unsigned char)buf[i];
  return s;
}

__attribute__((noinline)) int parse(const char *line, struct request *r) {
  if (sscanf(line, "%7s %47s %ld", r->method, r->path, &r->size) != 3) return -1;
  return (int)strlen(r->path);
}

__attribute__((noinline)) long handle(const struct request *r) {
  char *body = malloc(r->size + 1);
  memset(body, 'a' + (int)(r->size % 26), r->size);
  body[r->size] = 0;
  long c = checksum(body, r->size);
  free(body);
  return c;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2000;
  const char *paths[] = {"/", "/index.html", "/api/v1/users", "/static/app.js", "/favicon.ico"};
  long total = 0;
  char line[128];
  for (int i = 0; i < n; i++) {
    struct request r;
    snprintf(line, sizeof line, "%s %s %d", i % 7 ? "GET" : "POST", paths[i % 5], (i * 37) % 4000 + 1);
    if (parse(line, &r) < 0) continue;
    total += handle(&r);
  }
  printf("demo: handled %d requests, checksum %ld\n", n, total);
  return 0;
}
