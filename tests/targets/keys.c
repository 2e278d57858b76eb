/* Keyed aggregations on the hot path (crates/cli/tests/hotpath.rs).
 *
 *   keys N K   waits for a line on stdin, then 4 threads each call hit(i, i) for
 *              i in 0..N; then main calls drop_key(3) and each thread calls hit(i, i)
 *              for i in 0..N again. Keys are taken modulo K by the probes.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;
static long n;
static pthread_barrier_t phase;

__attribute__((noinline)) void hit(long k, long v) { sink = k + v; }
__attribute__((noinline)) void drop_key(long k) { sink = k; }

static void *worker(void *arg) {
    (void)arg;
    for (long i = 0; i < n; i++)
        hit(i, i);
    pthread_barrier_wait(&phase);
    pthread_barrier_wait(&phase);
    for (long i = 0; i < n; i++)
        hit(i, i);
    return NULL;
}

int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 1000;
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    pthread_barrier_init(&phase, NULL, 5);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, NULL);
    pthread_barrier_wait(&phase);
    drop_key(3);
    pthread_barrier_wait(&phase);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    printf("done\n");
    return 0;
}
