/* libweft_memhooks.a: clang's load/store hooks as LLVM bitcode, for a counted-mode
 * build with -flto (`weft memprof --cflags` / `--ldflags`): the link-time optimizer
 * inlines them into the program, so an access costs the heap-range test (two
 * compares) and, inside the heap, the shadow lookup and a counter increment — no
 * call. They read the state libweft_memprof.so exports (libweft_memstub.so's
 * inert copy without weft): the same path as memprof.c's count(). */
#include <stdint.h>

extern uintptr_t weft_memprof_heap_lo, weft_memprof_heap_hi;
extern uint32_t **weft_memprof_shadow;
extern __thread uint64_t *weft_memprof_ctr __attribute__((tls_model("initial-exec")));
extern void weft_memprof_count_slow(uint32_t id, uint64_t bytes, int w);

#define L2_SHIFT 22
#define L2_SIZE (1u << (L2_SHIFT - 4))

static inline __attribute__((always_inline)) void count(void *p, uint64_t n, int w) {
  uintptr_t a = (uintptr_t)p;
  if (__builtin_expect(a < __atomic_load_n(&weft_memprof_heap_lo, __ATOMIC_RELAXED) ||
                           a >= __atomic_load_n(&weft_memprof_heap_hi, __ATOMIC_RELAXED),
                       1))
    return;
  uint32_t *l2 = __atomic_load_n(&weft_memprof_shadow[a >> L2_SHIFT], __ATOMIC_RELAXED);
  if (!l2) return;
  uint32_t id = __atomic_load_n(&l2[(a >> 4) & (L2_SIZE - 1)], __ATOMIC_RELAXED);
  if (!id) return;
  uint64_t *c = weft_memprof_ctr;
  if (__builtin_expect(!c, 0)) {
    weft_memprof_count_slow(id, n, w);
    return;
  }
  c += (uint64_t)id * 4;
  c[w] += 1;
  c[2 + w] += n;
}

#define HOOKS(n)                                                          \
  void __sanitizer_cov_load##n(void *a) { count(a, n, 0); }              \
  void __sanitizer_cov_store##n(void *a) { count(a, n, 1); }
HOOKS(1) HOOKS(2) HOOKS(4) HOOKS(8) HOOKS(16)
