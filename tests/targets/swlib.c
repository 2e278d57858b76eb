/* The library of the system-wide tests: loaded at start-up (sw built -DWITH_LIB)
 * or with dlopen (sw N dlopen LIB). */
__attribute__((noinline)) int g(int x)
{
	__asm__ volatile("");
	return 2 * x;
}
