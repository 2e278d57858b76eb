/* libweft_memstub.so: the inert access hooks a binary built with
 * `weft memprof --cflags` links against (`weft memprof --ldflags`), so it runs
 * without weft. Under `weft memprof`, libweft_memprof.so is preloaded and its
 * definitions of the same symbols come first. Atomics (gcc's -fsanitize=thread
 * route replaces them by calls) are performed here for real. */
#include <stddef.h>
#include <stdint.h>

#define V __attribute__((visibility("default")))
#define SIZES(X) X(1) X(2) X(4) X(8) X(16)
#define SANCOV(n) V void __sanitizer_cov_load##n(void *a) { (void)a; } \
                  V void __sanitizer_cov_store##n(void *a) { (void)a; }
SANCOV(1) SANCOV(2) SANCOV(4) SANCOV(8) SANCOV(16)
#define TSAN(n) V void __tsan_read##n(void *a) { (void)a; } \
                V void __tsan_write##n(void *a) { (void)a; } \
                V void __tsan_unaligned_read##n(void *a) { (void)a; } \
                V void __tsan_unaligned_write##n(void *a) { (void)a; } \
                V void __tsan_volatile_read##n(void *a) { (void)a; } \
                V void __tsan_volatile_write##n(void *a) { (void)a; }
SIZES(TSAN)
V void __tsan_init(void) {}
V void __tsan_func_entry(void *p) { (void)p; }
V void __tsan_func_exit(void) {}
V void __tsan_read_range(void *a, size_t n) { (void)a; (void)n; }
V void __tsan_write_range(void *a, size_t n) { (void)a; (void)n; }
V void __tsan_vptr_update(void **p, void *v) { (void)p; (void)v; }
V void __tsan_vptr_read(void **p) { (void)p; }

/* What the hooks a clang LTO build inlines (c/hooks.c) read: an empty heap
 * range, so they count nothing. */
V uintptr_t weft_memprof_heap_lo = UINTPTR_MAX, weft_memprof_heap_hi;
V uint32_t **weft_memprof_shadow;
V __thread uint64_t *weft_memprof_ctr __attribute__((tls_model("initial-exec")));
V void weft_memprof_count_slow(uint32_t id, uint64_t bytes, int w) { (void)id; (void)bytes; (void)w; }

#define COUNT_ACCESS(a, n, w) ((void)0)
#include "atomics.h"
