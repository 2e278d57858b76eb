/* The kernel-level logger's experiments (seed 002, §4.1–4.2), in user space, for
 * `bench/seeds klas`.
 *
 *   klas lat KIND N           N timed operations of one KIND, each bracketed by two
 *                             TSC reads; prints the minimum and the median in TSC
 *                             cycles and ns, the empty bracket's own cost subtracted,
 *                             then N more back to back, timed as a whole (mean_ns):
 *     call     a call of `klas_call`, an empty non-inlined C function (a 5-byte jump
 *              fits its entry: weft weaves it with a jump)
 *     site     a call of `klas_int3_site`, an empty function whose first five bytes
 *              hold a branch target (see below): weft can only weave it with `int3`
 *     trap     an `int3` handled in-process by this program's own empty SIGTRAP
 *              handler, no weft: the kernel's and the signal's part of an int3 probe
 *     getpid   a getpid() system call (the seed's yardstick: 28,596 cycles)
 *   klas tcp MS KIND K1,K2,... [MBPS]
 *                             for each K in turn: for MS milliseconds, write 1,454-byte
 *                             messages to a loopback TCP connection (a thread of this
 *                             program reads them), calling the hit function K times
 *                             before each write (KIND call: `klas_call`, site:
 *                             `klas_int3_site`); prints one line per K:
 *                             "k=K msgs=M bytes=B ns=T mbps=X" (the time runs until the
 *                             reader has every byte), then "total_hits=H". With MBPS, the
 *                             sender starts message i no earlier than i messages' time at
 *                             MBPS Mbit/s (the seed's 100 Mbit/s Ethernet link, paced): the
 *                             throughput stays at MBPS while the per-message work fits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

__attribute__((noinline)) long klas_call(long x) {
    asm volatile("" : : "r"(x) : "memory");
    return x;
}

/* `xor eax, eax; ret; jmp <the ret>`: five bytes, a `ret` that does not fall through
 * among them and a branch back into them (never run), so no 5-byte jump can cover the
 * entry and weft's planner gives it an int3 — the seed's breakpoint, in-process. */
long klas_int3_site(long x);
asm(".text\n"
    ".globl klas_int3_site\n"
    ".type klas_int3_site, @function\n"
    "klas_int3_site:\n"
    "  xorl %eax, %eax\n"
    "1: ret\n"
    "  jmp 1b\n"
    ".size klas_int3_site, .-klas_int3_site\n");

static volatile long traps;
static void on_trap(int sig) {
    (void)sig;
    traps++;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t tsc_begin(void) {
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
}

static inline uint64_t tsc_end(void) {
    unsigned aux;
    uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static volatile long sink;

/* One sample of KIND ('n': nothing, the bracket alone). */
static uint64_t sample(char kind, long i) {
    uint64_t t0 = tsc_begin();
    switch (kind) {
    case 'c': sink = klas_call(i); break;
    case 's': sink = klas_int3_site(i); break;
    case 't': asm volatile("int3" ::: "memory"); break;
    case 'g': sink = syscall(SYS_getpid); break;
    default: asm volatile("" ::: "memory"); break;
    }
    return tsc_end() - t0;
}

static void stats(char kind, long n, uint64_t *v, double *min, double *med) {
    for (long i = 0; i < n; i++)
        v[i] = sample(kind, i);
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    *min = (double)v[0];
    *med = (double)v[n / 2];
}

static int lat(const char *what, long n) {
    char kind = what[0] == 'g' ? 'g' : what[0] == 't' ? 't' : what[0] == 's' ? 's' : 'c';
    if (kind == 't') {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_trap;
        sigaction(SIGTRAP, &sa, NULL);
    }
    uint64_t *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return 1;
    /* The TSC's rate, against the monotonic clock, over the whole measurement. */
    uint64_t c0 = __rdtsc(), w0 = now_ns();
    double bmin, bmed, min, med;
    stats('n', n, v, &bmin, &bmed);
    stats(kind, n, v, &min, &med);
    /* Back to back, timed as a whole: the amortized cost per operation. */
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        switch (kind) {
        case 'c': sink = klas_call(i); break;
        case 's': sink = klas_int3_site(i); break;
        case 't': asm volatile("int3" ::: "memory"); break;
        default: sink = syscall(SYS_getpid); break;
        }
    }
    uint64_t t1 = now_ns(), c1 = __rdtsc();
    double ghz = (double)(c1 - c0) / (double)(t1 - w0);
    min -= bmin;
    med -= bmed;
    printf("kind=%s n=%ld min_cycles=%.0f median_cycles=%.0f min_ns=%.1f median_ns=%.1f "
           "mean_ns=%.1f bracket_cycles=%.0f tsc_ghz=%.3f traps=%ld\n",
           what, n, min, med, min / ghz, med / ghz, (double)(t1 - t0) / (double)n, bmed, ghz,
           (long)traps);
    free(v);
    return 0;
}

#define MSG 1454

static volatile uint64_t received;
static int listen_fd;

static void *reader(void *arg) {
    (void)arg;
    int fd = accept(listen_fd, NULL, NULL);
    if (fd < 0) {
        perror("accept");
        exit(1);
    }
    char buf[65536];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0)
            break;
        __atomic_add_fetch(&received, (uint64_t)r, __ATOMIC_RELEASE);
    }
    close(fd);
    return NULL;
}

static int tcp(long ms, const char *what, char *ks, double mbps) {
    uint64_t gap = mbps > 0 ? (uint64_t)(MSG * 8 * 1000.0 / mbps) : 0; /* ns per message */
    long (*hit)(long) = what[0] == 's' ? klas_int3_site : klas_call;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) || listen(listen_fd, 1) ||
        getsockname(listen_fd, (struct sockaddr *)&a, &alen)) {
        perror("listen");
        return 1;
    }
    pthread_t th;
    pthread_create(&th, NULL, reader, NULL);
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    /* One segment per write, as the seed's 1,454-byte writes were on Ethernet (loopback's
     * MSS is 64 KiB: Nagle would hold the small writes back for the reader's ACK). */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        perror("connect");
        return 1;
    }
    static char msg[MSG];
    memset(msg, 'k', sizeof msg);
    uint64_t sent = 0;
    long total_hits = 0;
    for (char *k = strtok(ks, ","); k; k = strtok(NULL, ",")) {
        long hits = atol(k), msgs = 0;
        uint64_t t0 = now_ns(), end = t0 + (uint64_t)ms * 1000000u, t;
        do {
            if (gap)
                while (now_ns() < t0 + (uint64_t)msgs * gap)
                    ;
            for (long j = 0; j < hits; j++)
                sink = hit(j);
            for (size_t off = 0; off < MSG;) {
                ssize_t w = write(fd, msg + off, MSG - off);
                if (w <= 0) {
                    perror("write");
                    return 1;
                }
                off += (size_t)w;
            }
            msgs++;
            t = now_ns();
        } while (t < end);
        sent += (uint64_t)msgs * MSG;
        while (__atomic_load_n(&received, __ATOMIC_ACQUIRE) < sent)
            ;
        t = now_ns();
        total_hits += msgs * hits;
        printf("k=%ld msgs=%ld bytes=%ld ns=%llu mbps=%.1f\n", hits, msgs, msgs * MSG,
               (unsigned long long)(t - t0), (double)msgs * MSG * 8 * 1000.0 / (double)(t - t0));
        fflush(stdout);
    }
    close(fd);
    pthread_join(th, NULL);
    printf("total_hits=%ld\n", total_hits);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "lat"))
        return lat(argv[2], atol(argv[3]));
    if (argc >= 5 && !strcmp(argv[1], "tcp"))
        return tcp(atol(argv[2]), argv[3], argv[4], argc > 5 ? atof(argv[5]) : 0);
    fprintf(stderr, "usage: klas lat call|site|trap|getpid N | klas tcp MS call|site K1,K2,... [MBPS]\n");
    return 2;
}
