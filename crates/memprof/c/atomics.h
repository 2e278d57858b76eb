/* The __tsan_atomic* entry points gcc/clang's -fsanitize=thread emits for atomic
 * operations: each performs the operation (with the strongest order, which is
 * always correct) after COUNT_ACCESS(address, bytes, is_write). */
typedef uint8_t a8;
typedef uint16_t a16;
typedef uint32_t a32;
typedef uint64_t a64;
typedef unsigned __int128 a128;
#define SEQ __ATOMIC_SEQ_CST
#define ATOMICS(n)                                                                        \
  V a##n __tsan_atomic##n##_load(const volatile a##n *p, int mo) {                      \
    (void)mo; COUNT_ACCESS(p, n / 8, 0); return __atomic_load_n(p, SEQ); }              \
  V void __tsan_atomic##n##_store(volatile a##n *p, a##n v, int mo) {                   \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); __atomic_store_n(p, v, SEQ); }                 \
  V a##n __tsan_atomic##n##_exchange(volatile a##n *p, a##n v, int mo) {                \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); return __atomic_exchange_n(p, v, SEQ); }       \
  V a##n __tsan_atomic##n##_fetch_add(volatile a##n *p, a##n v, int mo) {               \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); return __atomic_fetch_add(p, v, SEQ); }        \
  V a##n __tsan_atomic##n##_fetch_sub(volatile a##n *p, a##n v, int mo) {               \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); return __atomic_fetch_sub(p, v, SEQ); }        \
  V a##n __tsan_atomic##n##_fetch_and(volatile a##n *p, a##n v, int mo) {               \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); return __atomic_fetch_and(p, v, SEQ); }        \
  V a##n __tsan_atomic##n##_fetch_or(volatile a##n *p, a##n v, int mo) {                \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); return __atomic_fetch_or(p, v, SEQ); }         \
  V a##n __tsan_atomic##n##_fetch_xor(volatile a##n *p, a##n v, int mo) {               \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); return __atomic_fetch_xor(p, v, SEQ); }        \
  V a##n __tsan_atomic##n##_fetch_nand(volatile a##n *p, a##n v, int mo) {              \
    (void)mo; COUNT_ACCESS(p, n / 8, 1); return __atomic_fetch_nand(p, v, SEQ); }       \
  V int __tsan_atomic##n##_compare_exchange_strong(volatile a##n *p, a##n *e, a##n v,   \
                                                   int mo, int fmo) {                   \
    (void)mo; (void)fmo; COUNT_ACCESS(p, n / 8, 1);                                     \
    return __atomic_compare_exchange_n(p, e, v, 0, SEQ, SEQ); }                         \
  V int __tsan_atomic##n##_compare_exchange_weak(volatile a##n *p, a##n *e, a##n v,     \
                                                 int mo, int fmo) {                     \
    (void)mo; (void)fmo; COUNT_ACCESS(p, n / 8, 1);                                     \
    return __atomic_compare_exchange_n(p, e, v, 0, SEQ, SEQ); }                         \
  V a##n __tsan_atomic##n##_compare_exchange_val(volatile a##n *p, a##n e, a##n v,      \
                                                 int mo, int fmo) {                     \
    (void)mo; (void)fmo; COUNT_ACCESS(p, n / 8, 1);                                     \
    __atomic_compare_exchange_n(p, &e, v, 0, SEQ, SEQ); return e; }
ATOMICS(8) ATOMICS(16) ATOMICS(32) ATOMICS(64)
V void __tsan_atomic_thread_fence(int mo) { (void)mo; __atomic_thread_fence(SEQ); }
V void __tsan_atomic_signal_fence(int mo) { (void)mo; __atomic_signal_fence(SEQ); }
