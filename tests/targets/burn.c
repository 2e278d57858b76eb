/* Two busy threads for profile:hz tests: main in hot_a, a worker in hot_b.
 * usage: burn SECONDS -- each thread runs until it has used SECONDS of CPU time (its
 * own clock, the one profile:hz samples on), however busy the machine is. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double cpu(void){ struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+t.tv_nsec*1e-9; }
__attribute__((noinline)) long hot_a(long n){ long s=0; for(long i=0;i<n;i++){ __asm__ volatile(""); s+=i*i; } return s; }
__attribute__((noinline)) long hot_b(long n){ long s=0; for(long i=0;i<n;i++){ __asm__ volatile(""); s^=i*3; } return s; }
static void *worker(void *a){ double end=cpu()+(long)a*0.1; long s=0; while(cpu()<end) s+=hot_b(100000); return (void*)s; }
int main(int argc,char**argv){ double secs=argc>1?atof(argv[1]):1.0; pthread_t t; pthread_create(&t,0,worker,(void*)(long)(secs*10)); double end=cpu()+secs; long s=0; while(cpu()<end) s+=hot_a(100000); pthread_join(t,0); printf("done %ld\n",s!=0); return 0; }
