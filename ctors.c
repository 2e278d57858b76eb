#include <stdio.h>
#include <stdlib.h>
void lib_touch(void);
static void pre(int argc, char **argv, char **envp) { free(malloc(5555)); }
__attribute__((section(".preinit_array"), used)) static void (*pre_p)(int, char **, char **) = pre;
__attribute__((constructor)) static void ctor(void) { free(malloc(5555)); free(malloc(5555)); }
int main(void) { lib_touch(); free(malloc(5555)); printf("main\n"); return 0; }
