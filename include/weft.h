/* weft.h — probe points you place in your own C or C++ code, for weft and for every
 * tool that reads USDT (SystemTap SDT) notes: bpftrace, SystemTap, perf, gdb, bcc.
 *
 * Header only; GCC or Clang on Linux x86-64 (C99 or later, C++11 or later). On other
 * targets, or with -DWEFT_DISABLE_PROBES, every macro compiles to nothing (and
 * WEFT_PROBE_ENABLED to 0).
 *
 * USAGE
 *
 *   #include "weft.h"
 *
 *   WEFT_PROBE(provider, name);                 // no arguments
 *   WEFT_PROBE(provider, name, a, b, c);        // up to 12 arguments
 *
 *   // A probe whose arguments are expensive to compute: give it a semaphore, at file
 *   // or namespace scope where WEFT_PROBE_ENABLED can see it (repeating it in several
 *   // files, or putting it in a header, is fine: it is one weak symbol) ...
 *   WEFT_SEMAPHORE(myapp, request_done);
 *   // ... and test it. The test is one load and a not-taken branch while nothing
 *   // is attached; the tracer turns it on by incrementing the semaphore.
 *   if (WEFT_PROBE_ENABLED(myapp, request_done)) {
 *       char *summary = describe(req);          // only runs while traced
 *       WEFT_PROBE(myapp, request_done, req->id, summary);
 *       free(summary);
 *   }
 *
 *   Scripts name the probe `usdt:BINARY:provider:name` (weft, bpftrace), its
 *   arguments are arg0 … arg11.
 *
 * WHAT A PROBE COMPILES TO
 *
 *   * In the code: 5 bytes of NOPs, `nop; nopl 0x0(%rax)` = 90 0f 1f 40 00, and
 *     nothing else (the arguments are operands of the asm statement: the compiler
 *     leaves them where they already are, or materialises them into a register if
 *     they are not yet anywhere). The note's pc is the first byte. Five bytes are
 *     room for weft to write one 5-byte jump while the program runs. They are two
 *     NOPs, not one 5-byte NOP, on purpose: Linux 6.16+ "optimizes" a uprobe on a
 *     5-byte NOP into a `call`, whose return address overwrites the red zone below
 *     %rsp, where the compiler may have put this probe's arguments; on a 1-byte NOP
 *     uprobes (bpftrace, perf, SystemTap) keep using a breakpoint and read the
 *     arguments intact. For the same reason a tracer must never `call` from the
 *     site: it must jump, and move %rsp below the red zone before writing to it.
 *   * In `.note.stapsdt` (not loaded): one note exactly as <sys/sdt.h> writes it:
 *     owner "stapsdt", type 3, and the descriptor
 *         u64 pc          address of the first NOP
 *         u64 base        address of the `.stapsdt.base` section (prelink adjustment)
 *         u64 semaphore   address of the semaphore, or 0
 *         "provider\0" "name\0" "args\0"
 *     where args is one `SIZE@LOCATION` per argument, separated by spaces, in AT&T
 *     syntax: `-4@%edi` (signed 32-bit in edi), `8@-24(%rbp)`, `4@$5`, `8@%rax`. A
 *     negative size means signed. Pointers and arrays are 8 bytes, unsigned; floats
 *     and doubles are recorded as their raw bits (size 4 or 8), without sdt.h's `f`.
 *   * `.stapsdt.base`: a one-byte allocated section, shared (COMDAT) with sdt.h's.
 *   * The semaphore (WEFT_SEMAPHORE): an `unsigned short` named
 *     `provider_name_semaphore` in the `.probes` section, as SDT semaphores are
 *     (weak and hidden, so it may be defined in several files of one binary; the
 *     symbol keeps that C name inside a C++ namespace). A probe
 *     records its semaphore's address when one is defined anywhere in the binary or
 *     library, and 0 otherwise: WEFT_PROBE itself never needs to know.
 *
 * LIMITS
 *
 *   Arguments must be integers, enums, bools, pointers or arrays (passed as their
 *   address), or floating-point values of at most 8 bytes; not structs. The
 *   assembler syntax must be AT&T (the default; not -masm=intel). As with sdt.h, the
 *   constraint for arguments is "nor" (constant, offsettable memory or register);
 *   define WEFT_PROBE_ARG_CONSTRAINT before including this header to change it
 *   (e.g. to "g" if the compiler reports an impossible reload with many arguments).
 *
 *   Provider and probe names are C identifiers (they form the semaphore's name).
 */

#ifndef WEFT_H
#define WEFT_H 1

#define WEFT_H_VERSION 1

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(WEFT_DISABLE_PROBES)

#ifndef WEFT_PROBE_ARG_CONSTRAINT
#define WEFT_PROBE_ARG_CONSTRAINT "nor"
#endif

/* ---- public macros ------------------------------------------------------------ */

/* WEFT_PROBE(provider, name, arg1, ..., argN), 0 <= N <= 12. */
#define WEFT_PROBE(...) _WEFT_CAT(_WEFT_PROBE_, _WEFT_NARGS(__VA_ARGS__))(__VA_ARGS__)

/* Defines the semaphore of probe provider:name (at file scope). */
#define WEFT_SEMAPHORE(provider, name)                                                 \
    unsigned short _WEFT_SEM(provider, name)                                          \
        __asm__(_WEFT_STR(_WEFT_SEM(provider, name)))                                 \
        __attribute__((weak, used, section(".probes"), visibility("hidden"))) = 0

/* Nonzero while a tracer is attached to probe provider:name (needs WEFT_SEMAPHORE). */
#define WEFT_PROBE_ENABLED(provider, name)                                             \
    __builtin_expect(*(volatile unsigned short *)&_WEFT_SEM(provider, name) != 0, 0)

/* ---- implementation ------------------------------------------------------------ */

#define _WEFT_STR_(x) #x
#define _WEFT_STR(x) _WEFT_STR_(x)
#define _WEFT_CAT_(a, b) a##b
#define _WEFT_CAT(a, b) _WEFT_CAT_(a, b)
#define _WEFT_SEM(provider, name) provider##_##name##_semaphore

/* How many arguments WEFT_PROBE got, provider and name included (2..14). */
#define _WEFT_NARGS(...)                                                               \
    _WEFT_NARGS_(__VA_ARGS__, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define _WEFT_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, N, ...) N

/* Size in bytes and signedness of an argument. */
#ifdef __cplusplus
#include <type_traits>
namespace weft_detail {
/* Signed integers, and enums whose underlying type is signed; everything else
   (pointers, floating point, unsigned integers) is unsigned. */
template <typename T, bool = std::is_enum<T>::value> struct is_signed_arg {
    static const bool value = std::is_integral<T>::value && std::is_signed<T>::value;
};
template <typename T> struct is_signed_arg<T, true> {
    static const bool value = std::is_signed<typename std::underlying_type<T>::type>::value;
};
} // namespace weft_detail
#define _WEFT_DECAYED(x) typename std::decay<decltype(x)>::type
#define _WEFT_ARGSIZE(x) ((int)sizeof(_WEFT_DECAYED(x)))
#define _WEFT_ARGSIGNED(x) (weft_detail::is_signed_arg<_WEFT_DECAYED(x)>::value)
#else
/* Integer-like arguments (integers, chars, enums, bools) keep their type; everything
   else is taken as `unsigned int`, i.e. unsigned. Arrays count as pointers. */
#define _WEFT_INTTYPE(x)                                                               \
    __typeof__(__builtin_choose_expr(((__builtin_classify_type(x) + 3) & -4) == 4, (x), 0U))
#define _WEFT_ARGSIGNED(x) (!((_WEFT_INTTYPE(x)) - 1 > (_WEFT_INTTYPE(x))0))
#define _WEFT_ISARRAY(x) (__builtin_classify_type(x) == 14 || __builtin_classify_type(x) == 5)
#define _WEFT_ARGSIZE(x) ((int)(_WEFT_ISARRAY(x) ? sizeof(void *) : sizeof(x)))
#endif

/* Operand pair of argument n: its signed size (printed with %c, e.g. -4) and value. */
#define _WEFT_OPS(n, x)                                                                \
    [_weft_s##n] "n"(_WEFT_ARGSIGNED(x) ? -_WEFT_ARGSIZE(x) : _WEFT_ARGSIZE(x)),       \
        [_weft_a##n] WEFT_PROBE_ARG_CONSTRAINT(x)
#define _WEFT_FMT(n) "%c[_weft_s" #n "]@%[_weft_a" #n "]"

/* The probe: its 5 bytes of NOPs, its note, and `.stapsdt.base`. */
#define _WEFT_ASM(provider, name, fmt)                                                 \
    "990:\t.byte 0x90, 0x0f, 0x1f, 0x40, 0x00\n"                                       \
    "\t.pushsection .note.stapsdt,\"?\",\"note\"\n"                                    \
    "\t.balign 4\n"                                                                    \
    "\t.4byte 992f-991f, 994f-993f, 3\n"                                               \
    "991:\t.asciz \"stapsdt\"\n"                                                       \
    "992:\t.balign 4\n"                                                                \
    "993:\t.8byte 990b\n"                                                              \
    "\t.8byte _.stapsdt.base\n"                                                        \
    "\t.weak " _WEFT_STR(_WEFT_SEM(provider, name)) "\n"                              \
    "\t.hidden " _WEFT_STR(_WEFT_SEM(provider, name)) "\n"                            \
    "\t.8byte " _WEFT_STR(_WEFT_SEM(provider, name)) "\n"                             \
    "\t.asciz \"" #provider "\"\n"                                                     \
    "\t.asciz \"" #name "\"\n"                                                         \
    "\t.asciz \"" fmt "\"\n"                                                           \
    "994:\t.balign 4\n"                                                                \
    "\t.popsection\n"                                                                  \
    "\t.ifndef _.stapsdt.base\n"                                                       \
    "\t.pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"          \
    "\t.weak _.stapsdt.base\n"                                                         \
    "\t.hidden _.stapsdt.base\n"                                                       \
    "_.stapsdt.base:\t.space 1\n"                                                      \
    "\t.size _.stapsdt.base, 1\n"                                                      \
    "\t.popsection\n"                                                                  \
    "\t.endif\n"

#define _WEFT_EMIT(provider, name, fmt, ...)                                           \
    do {                                                                               \
        __asm__ __volatile__(_WEFT_ASM(provider, name, fmt) : : __VA_ARGS__);          \
    } while (0)

#define _WEFT_F1 _WEFT_FMT(1)
#define _WEFT_F2 _WEFT_F1 " " _WEFT_FMT(2)
#define _WEFT_F3 _WEFT_F2 " " _WEFT_FMT(3)
#define _WEFT_F4 _WEFT_F3 " " _WEFT_FMT(4)
#define _WEFT_F5 _WEFT_F4 " " _WEFT_FMT(5)
#define _WEFT_F6 _WEFT_F5 " " _WEFT_FMT(6)
#define _WEFT_F7 _WEFT_F6 " " _WEFT_FMT(7)
#define _WEFT_F8 _WEFT_F7 " " _WEFT_FMT(8)
#define _WEFT_F9 _WEFT_F8 " " _WEFT_FMT(9)
#define _WEFT_F10 _WEFT_F9 " " _WEFT_FMT(10)
#define _WEFT_F11 _WEFT_F10 " " _WEFT_FMT(11)
#define _WEFT_F12 _WEFT_F11 " " _WEFT_FMT(12)

#define _WEFT_PROBE_2(p, n)                                                            \
    do {                                                                               \
        __asm__ __volatile__(_WEFT_ASM(p, n, ""));                                     \
    } while (0)
#define _WEFT_PROBE_3(p, n, a1) _WEFT_EMIT(p, n, _WEFT_F1, _WEFT_OPS(1, a1))
#define _WEFT_PROBE_4(p, n, a1, a2)                                                    \
    _WEFT_EMIT(p, n, _WEFT_F2, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2))
#define _WEFT_PROBE_5(p, n, a1, a2, a3)                                                \
    _WEFT_EMIT(p, n, _WEFT_F3, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3))
#define _WEFT_PROBE_6(p, n, a1, a2, a3, a4)                                            \
    _WEFT_EMIT(p, n, _WEFT_F4, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),   \
               _WEFT_OPS(4, a4))
#define _WEFT_PROBE_7(p, n, a1, a2, a3, a4, a5)                                        \
    _WEFT_EMIT(p, n, _WEFT_F5, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),   \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5))
#define _WEFT_PROBE_8(p, n, a1, a2, a3, a4, a5, a6)                                    \
    _WEFT_EMIT(p, n, _WEFT_F6, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),   \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5), _WEFT_OPS(6, a6))
#define _WEFT_PROBE_9(p, n, a1, a2, a3, a4, a5, a6, a7)                                \
    _WEFT_EMIT(p, n, _WEFT_F7, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),   \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5), _WEFT_OPS(6, a6), _WEFT_OPS(7, a7))
#define _WEFT_PROBE_10(p, n, a1, a2, a3, a4, a5, a6, a7, a8)                           \
    _WEFT_EMIT(p, n, _WEFT_F8, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),   \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5), _WEFT_OPS(6, a6), _WEFT_OPS(7, a7), \
               _WEFT_OPS(8, a8))
#define _WEFT_PROBE_11(p, n, a1, a2, a3, a4, a5, a6, a7, a8, a9)                       \
    _WEFT_EMIT(p, n, _WEFT_F9, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),   \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5), _WEFT_OPS(6, a6), _WEFT_OPS(7, a7), \
               _WEFT_OPS(8, a8), _WEFT_OPS(9, a9))
#define _WEFT_PROBE_12(p, n, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)                  \
    _WEFT_EMIT(p, n, _WEFT_F10, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),  \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5), _WEFT_OPS(6, a6), _WEFT_OPS(7, a7), \
               _WEFT_OPS(8, a8), _WEFT_OPS(9, a9), _WEFT_OPS(10, a10))
#define _WEFT_PROBE_13(p, n, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11)             \
    _WEFT_EMIT(p, n, _WEFT_F11, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),  \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5), _WEFT_OPS(6, a6), _WEFT_OPS(7, a7), \
               _WEFT_OPS(8, a8), _WEFT_OPS(9, a9), _WEFT_OPS(10, a10),                 \
               _WEFT_OPS(11, a11))
#define _WEFT_PROBE_14(p, n, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12)        \
    _WEFT_EMIT(p, n, _WEFT_F12, _WEFT_OPS(1, a1), _WEFT_OPS(2, a2), _WEFT_OPS(3, a3),  \
               _WEFT_OPS(4, a4), _WEFT_OPS(5, a5), _WEFT_OPS(6, a6), _WEFT_OPS(7, a7), \
               _WEFT_OPS(8, a8), _WEFT_OPS(9, a9), _WEFT_OPS(10, a10),                 \
               _WEFT_OPS(11, a11), _WEFT_OPS(12, a12))

#else /* not x86-64 GCC/Clang, or WEFT_DISABLE_PROBES */

#define WEFT_PROBE(...) do { } while (0)
#define WEFT_SEMAPHORE(provider, name) extern int weft_no_semaphore_##provider##_##name
#define WEFT_PROBE_ENABLED(provider, name) 0

#endif

/* WEFT MEMPROF: a program's own view of its heap objects' access counts (Tracer's
 * mem_access_count / mem_access_stat), for online memory-management experiments.
 *
 *   unsigned long n = weft_mem_access_count(p);   // reads + writes of the object
 *                                                 // holding address p, so far
 *   unsigned long r, w; weft_mem_access_counts(p, &r, &w);
 *   struct weft_mem_stats st; weft_mem_stat(&st);  // returns the objects tracked
 *
 * Under `weft memprof` (counted mode) these read the counters libweft_memprof.so
 * keeps; without weft, or in sampled mode, they return 0 (the weak references are
 * null) and weft_mem_stat zeroes *st. Calling them is not counted as an access. */
struct weft_mem_stats {
    unsigned long objects;      /* allocated since the program started */
    unsigned long live_objects; /* not freed yet */
    unsigned long live_bytes;
    unsigned long reads;        /* over every object */
    unsigned long writes;
};
#ifdef __cplusplus
extern "C" {
#endif
extern unsigned long weft_memprof_access_count(const void *, unsigned long *,
                                               unsigned long *) __attribute__((weak));
extern unsigned long weft_memprof_stat(struct weft_mem_stats *) __attribute__((weak));
#ifdef __cplusplus
}
#endif
static inline unsigned long weft_mem_access_counts(const void *p, unsigned long *reads,
                                                   unsigned long *writes) {
    if (weft_memprof_access_count) return weft_memprof_access_count(p, reads, writes);
    if (reads) *reads = 0;
    if (writes) *writes = 0;
    return 0;
}
static inline unsigned long weft_mem_access_count(const void *p) {
    return weft_mem_access_counts(p, (unsigned long *)0, (unsigned long *)0);
}
static inline unsigned long weft_mem_stat(struct weft_mem_stats *st) {
    if (weft_memprof_stat) return weft_memprof_stat(st);
    if (st) st->objects = st->live_objects = st->live_bytes = st->reads = st->writes = 0;
    return 0;
}

#endif /* WEFT_H */
