/* Data pointcuts' target (crates/cli/tests/data.rs): globals, a struct, a heap
 * object, written and read in known patterns.
 *
 *   data threads N   4 threads each add 1 to `counter` N times (atomically)
 *   data seq N       `seq` = 1, 2, ..., N
 *   data field N     `pair.b` = 1..N, then `pair.a` = 5 once
 *   data heap N      a heap word's address goes through `got_object`; then, once
 *                    the file argv[3] exists, the word = 1..N
 *   data reads N     reads `source` N times (its sum printed), writes it once
 *   data wait N      waits for a line on stdin, then `counter` += N (plain
 *                    writes); again for each line, until EOF (attach tests);
 *                    `data wait N fork`: after the first round, a child is forked
 *                    that says "child PID" and waits until the parent ends
 *   data pool N      4 threads made at start; for each line on stdin, each adds 1
 *                    to `counter` N times (atomically); "done C" after each round
 *                    (attach tests: the threads exist before weft)
 *   data ownsig N    its own SIGTRAP handler; `seq` = 1..N with a raise(SIGTRAP)
 *                    after each write: prints "own traps N"
 *   data hot N       `shared.hot` += 1 N times, `shared.watched` = i every 100th
 *                    (the two on one page): prints "done HOT WATCHED"
 *   data ownsegv N   its own SIGSEGV handler; `seq` = 1..N with a fault of its own
 *                    (a write through a bad pointer, recovered by siglongjmp)
 *                    after each write: prints "own faults N"
 *   data heapmix N   as heap, with one arena for every thread (M_ARENA_MAX 1: their
 *                    chunks, tcaches and stdio buffers share the watched page);
 *                    once argv[3] exists, 4 threads each add 1 to the word N times
 *                    (atomically) amid malloc/free/memset/memcpy (large: rep
 *                    movs/stos)/snprintf/fprintf traffic: prints "done WORD BAD"
 *                    (BAD: blocks whose contents came out wrong)
 *   data bulk N      `big` (8 KiB, `big.mid` in it) filled N times, alternately by memset and by
 *                    memcpy from a buffer, with byte i in round i (large sizes:
 *                    string instructions or vector stores): prints "done BAD"
 *   data plain N     `counter` += N plain writes (the bench's baseline and its
 *                    watched run), timed: prints "ns_per_write X"
 *   data many N      `many[600]` (of 1024 longs) = 1..N, its neighbours
 *                    `many[599]` = 7 and `many[601]` = 8 once: prints "done N"
 *   data heapbig N   a heap block of 1024 longs whose address goes through
 *                    `got_object`; once argv[3] exists, word 600 = 1..N, word 602
 *                    = 9, word 601 = 5: prints "done N"
 *   data misc N      for i = 1..N: the file's static `file_static` = i, bump()
 *                    (its own static `calls` += 1: the symbol table names it
 *                    `calls.0`), `packed_rec.v` = i (8 bytes at offset 1 of a
 *                    packed struct: unaligned), `nosize` = i (a symbol defined in
 *                    assembly, with no size; `bare`, beside it, is never written
 *                    and has no DWARF either), scale(i) (a parameter `factor` and
 *                    a local `scaled`, in registers): prints "done N N N"
 *   data odd N       as heap, but the object is a packed record whose `long` is
 *                    at offset 1 (unaligned); once argv[3] exists, it = 1..N:
 *                    prints "done N"
 *   data rw N        reads `source` N times (their sum printed), then writes it N
 *                    times (1..N): prints "done SUM N" (one more read)
 *
 * Each mode prints "done" and its result. No mode waits for weft by sleeping: with
 * -c the program starts only once weft is in, and the others wait for a line or a
 * file.
 */
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile long counter;
volatile long seq;
struct pair {
    long a;
    long b;
};
volatile struct pair pair;
volatile long source = 3;
volatile int table[4];
/* Two words on one page (64-aligned, 16 bytes): one watched, one hot. */
struct shared {
    long watched;
    long hot;
} __attribute__((aligned(64)));
volatile struct shared shared;
/* 8 KiB over two or three pages; `mid` watched. */
struct bulk {
    char head[4800];
    long mid;
    char tail[3384];
} big;
static unsigned char bulk_src[sizeof big];
/* Too many elements for weft's DWARF reader to list: `many[600]` is found from
 * the element size. */
volatile long many[1024];

/* The `misc` mode's variables. */
static volatile long file_static;
struct __attribute__((packed)) rec {
    char tag;
    long v;
};
volatile struct rec packed_rec;
/* Objects with no size in the symbol table (no `.size`): `nosize`, whose type
 * DWARF has from the declaration below, and `bare`, which nothing describes. */
__asm__(".pushsection .data\n.globl nosize\n.type nosize, @object\n.balign 8\n"
        "nosize: .quad 0\n.globl bare\n.type bare, @object\nbare: .quad 0\n"
        ".popsection\n");
extern volatile long nosize;

__attribute__((noinline)) static long bump(void) {
    static volatile long calls;
    calls = calls + 1;
    return calls;
}

__attribute__((noinline)) long scale(long factor) {
    long scaled = factor * 3;
    __asm__ volatile("" : "+r"(scaled));
    return scaled + 1;
}

static long per_thread;
static pthread_barrier_t start_round, end_round;

static void *pool_worker(void *arg) {
    (void)arg;
    for (;;) {
        pthread_barrier_wait(&start_round);
        for (long i = 0; i < per_thread; i++)
            __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        pthread_barrier_wait(&end_round);
    }
    return NULL;
}

static void *worker(void *arg) {
    (void)arg;
    for (long i = 0; i < per_thread; i++)
        __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    return NULL;
}

static volatile long *mix_word;
static long mix_bad[4];

static void *heap_worker(void *arg) {
    long id = (long)arg, bad = 0;
    FILE *f = fopen("/dev/null", "w");
    char line[64];
    for (long i = 0; i < per_thread; i++) {
        __atomic_fetch_add(mix_word, 1, __ATOMIC_RELAXED);
        size_t sa = 16 + (size_t)(i % 64) * 8, sb = 2048 + (size_t)(i % 8) * 512;
        unsigned char *a = malloc(sa), *b = malloc(sb), *c = calloc(1, sb);
        memset(a, (int)(i & 0xff), sa);
        memset(b, (int)((i + id) & 0xff), sb);
        memcpy(c, b, sb);
        for (size_t j = 0; j < sb; j += 97)
            bad += c[j] != (unsigned char)((i + id) & 0xff);
        bad += a[sa - 1] != (unsigned char)(i & 0xff);
        snprintf(line, sizeof line, "%ld:%ld", id, i);
        fprintf(f, "%s %zu\n", line, sa);
        free(c);
        free(a);
        free(b);
    }
    fclose(f);
    mix_bad[id] = bad;
    return NULL;
}

__attribute__((noinline)) void got_object(long *p) {
    __asm__ volatile("" : : "r"(p) : "memory");
}

static volatile int own_traps;

static void on_own_trap(int sig) {
    (void)sig;
    own_traps++;
}

static sigjmp_buf own_jmp;
static volatile int own_faults;

static void on_own_segv(int sig) {
    (void)sig;
    own_faults++;
    siglongjmp(own_jmp, 1);
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: data MODE N [FILE]\n");
        return 2;
    }
    const char *mode = argv[1];
    long n = atol(argv[2]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "threads")) {
        pthread_t t[4];
        per_thread = n;
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, worker, NULL);
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        printf("done %ld\n", counter);
    } else if (!strcmp(mode, "seq")) {
        for (long i = 1; i <= n; i++)
            seq = i;
        printf("done %ld\n", seq);
    } else if (!strcmp(mode, "field")) {
        for (long i = 1; i <= n; i++)
            pair.b = i;
        pair.a = 5;
        table[2] = 9;
        table[1] = 8;
        printf("done %ld %ld\n", pair.a, pair.b);
    } else if (!strcmp(mode, "heap")) {
        long *p = malloc(sizeof *p);
        *p = 0;
        got_object(p);
        printf("object %p\n", (void *)p);
        while (argc > 3 && access(argv[3], F_OK) != 0)
            usleep(1000);
        for (long i = 1; i <= n; i++)
            *(volatile long *)p = i;
        printf("done %ld\n", *p);
    } else if (!strcmp(mode, "heapmix")) {
        mallopt(M_ARENA_MAX, 1);
        /* stdout's buffer first: the word is then followed, on its page, by the
         * top of the heap, where the threads' first blocks go. */
        printf("heapmix\n");
        long *p = malloc(sizeof *p);
        *p = 0;
        got_object(p);
        printf("object %p\n", (void *)p);
        while (argc > 3 && access(argv[3], F_OK) != 0)
            usleep(1000);
        pthread_t t[4];
        per_thread = n;
        mix_word = p;
        for (long i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, heap_worker, (void *)i);
        long bad = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(t[i], NULL);
            bad += mix_bad[i];
        }
        printf("done %ld %ld\n", *p, bad);
    } else if (!strcmp(mode, "bulk")) {
        long bad = 0;
        for (long i = 1; i <= n; i++) {
            if (i & 1) {
                memset(&big, (int)i, sizeof big);
            } else {
                memset(bulk_src, (int)i, sizeof bulk_src);
                memcpy(&big, bulk_src, sizeof big);
            }
            __asm__ volatile("" : : "r"(&big) : "memory");
            for (size_t j = 0; j < sizeof big; j += 97)
                bad += ((unsigned char *)&big)[j] != (unsigned char)i;
        }
        printf("done %ld\n", bad);
    } else if (!strcmp(mode, "reads")) {
        long sum = 0;
        for (long i = 0; i < n; i++)
            sum += source;
        source = 4;
        printf("done %ld\n", sum);
    } else if (!strcmp(mode, "wait")) {
        char line[64];
        printf("ready\n");
        int fork_once = argc > 3 && !strcmp(argv[3], "fork");
        int pipefd[2];
        while (fgets(line, sizeof line, stdin)) {
            for (long i = 0; i < n; i++)
                counter = counter + 1;
            printf("done %ld\n", counter);
            if (fork_once) {
                fork_once = 0;
                if (pipe(pipefd) != 0)
                    return 1;
                pid_t c = fork();
                if (c == 0) {
                    char b;
                    /* Printed by the child: its atfork handlers have run. */
                    printf("child %d\n", (int)getpid());
                    close(pipefd[1]);
                    while (read(pipefd[0], &b, 1) > 0) {
                    }
                    _exit(0);
                }
                close(pipefd[0]);
            }
        }
    } else if (!strcmp(mode, "pool")) {
        char line[64];
        pthread_t t[4];
        per_thread = n;
        pthread_barrier_init(&start_round, NULL, 5);
        pthread_barrier_init(&end_round, NULL, 5);
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, pool_worker, NULL);
        printf("ready\n");
        while (fgets(line, sizeof line, stdin)) {
            pthread_barrier_wait(&start_round);
            pthread_barrier_wait(&end_round);
            printf("done %ld\n", counter);
        }
    } else if (!strcmp(mode, "ownsig")) {
        signal(SIGTRAP, on_own_trap);
        for (long i = 1; i <= n; i++) {
            seq = i;
            raise(SIGTRAP);
        }
        printf("done %ld\nown traps %d\n", seq, own_traps);
    } else if (!strcmp(mode, "hot")) {
        for (long i = 1; i <= n; i++) {
            shared.hot = shared.hot + 1;
            if (i % 100 == 0)
                shared.watched = i;
        }
        printf("done %ld %ld\n", shared.hot, shared.watched);
    } else if (!strcmp(mode, "ownsegv")) {
        signal(SIGSEGV, on_own_segv);
        for (long i = 1; i <= n; i++) {
            seq = i;
            if (!sigsetjmp(own_jmp, 1))
                *(volatile long *)(uintptr_t)(16 + (i & 1)) = i;
        }
        printf("done %ld\nown faults %d\n", seq, own_faults);
    } else if (!strcmp(mode, "many")) {
        for (long i = 1; i <= n; i++)
            many[600] = i;
        many[599] = 7;
        many[601] = 8;
        printf("done %ld\n", many[600]);
    } else if (!strcmp(mode, "heapbig")) {
        printf("heapbig\n");
        volatile long *p = calloc(1024, sizeof *p);
        got_object((long *)p);
        printf("object %p\n", (void *)p);
        while (argc > 3 && access(argv[3], F_OK) != 0)
            usleep(1000);
        for (long i = 1; i <= n; i++)
            p[600] = i;
        p[602] = 9;
        p[601] = 5;
        printf("done %ld\n", p[600]);
    } else if (!strcmp(mode, "misc")) {
        long b = 0, sc = 0;
        for (long i = 1; i <= n; i++) {
            file_static = i;
            b = bump();
            packed_rec.v = i;
            nosize = i;
            sc += scale(i);
        }
        printf("done %ld %ld %ld %ld\n", file_static, b, packed_rec.v, sc > 0 ? nosize : 0);
    } else if (!strcmp(mode, "odd")) {
        void *mem = calloc(1, sizeof(struct rec));
        struct rec *r = mem;
        got_object(mem);
        printf("object %p\n", (void *)r);
        while (argc > 3 && access(argv[3], F_OK) != 0)
            usleep(1000);
        for (long i = 1; i <= n; i++)
            ((volatile struct rec *)r)->v = i;
        printf("done %ld\n", ((volatile struct rec *)r)->v);
    } else if (!strcmp(mode, "rw")) {
        long sum = 0;
        for (long i = 0; i < n; i++)
            sum += source;
        for (long i = 1; i <= n; i++)
            source = i;
        printf("done %ld %ld\n", sum, source);
    } else if (!strcmp(mode, "plain")) {
        long t0 = now_ns();
        for (long i = 0; i < n; i++)
            counter = counter + 1;
        long t1 = now_ns();
        printf("done %ld\nns_per_write %.1f\n", counter, (double)(t1 - t0) / (double)n);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
