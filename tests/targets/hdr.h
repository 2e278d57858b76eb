/* A header the end-to-end tests include in scripts (`#include "hdr.h"`, -I,
 * --include) and hdr.c is built with: typedef'd integers, an enum, #defines, a
 * struct with a nested struct, an array, bit-fields and a pointer to itself, and
 * what the header reader must skip (an inline function, a prototype). */
#ifndef WEFT_HDR_H
#define WEFT_HDR_H
#include <stdint.h>

#define REC_NAME_LEN 12
#define REC_MAGIC 0x5eed
#define REC_MAX(a, b) ((a) > (b) ? (a) : (b))

typedef uint32_t rec_id_t;
enum rec_kind { REC_SMALL = 1, REC_BIG = 4, REC_HUGE };

struct rec_pos {
  int16_t x;
  int16_t y;
};

struct rec {
  rec_id_t id;
  struct rec_pos pos;
  char name[REC_NAME_LEN];
  unsigned int kind : 3, flags : 5;
  long vals[2];
  struct rec *next;
};

static inline long rec_sum(const struct rec *r) { return r->vals[0] + r->vals[1]; }
int rec_show(struct rec *r) __attribute__((noinline));
#endif
