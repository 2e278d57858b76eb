/* Several sessions live at once, their steps interleaved: for the sequence tests
 * whose instances are keyed by something other than the thread.
 *
 *   sessions K R
 *
 * First a stray s_step(99) and s_close(99) (no session 99 was opened). Then
 * s_open(k) for k = 0 .. K-1, then R rounds each calling s_step(k) for every k >= the
 * round's index (session k gets min(R, k + 1) steps, sessions interleaved), then
 * s_close(k) for every k. */
#include <stdlib.h>

__attribute__((noipa)) void s_open(long k) { __asm__ volatile("" ::"r"(k)); }
__attribute__((noipa)) void s_step(long k) { __asm__ volatile("" ::"r"(k)); }
__attribute__((noipa)) void s_close(long k) { __asm__ volatile("" ::"r"(k)); }

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	long k_max = atol(argv[1]), rounds = atol(argv[2]);
	s_step(99);
	s_close(99);
	for (long k = 0; k < k_max; k++)
		s_open(k);
	for (long r = 0; r < rounds; r++)
		for (long k = r; k < k_max; k++)
			s_step(k);
	for (long k = 0; k < k_max; k++)
		s_close(k);
	return 0;
}
