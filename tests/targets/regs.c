/* Register preservation across probed calls. check_regs(fn) loads known values into
 * every general-purpose register, xmm0-15 and the arithmetic flags, calls fn (a
 * function that touches none of them, as a -fipa-ra caller may rely on), and
 * returns a bitmask of what changed (0 = everything preserved).
 * usage: regs N   -- runs the check N times against each victim */
#include <stdio.h>
#include <stdlib.h>

long check_regs(void (*fn)(void));
void victim_jump(void);  /* 5-byte nop; ret: a plain jump site */
void victim_short(void); /* ret only: too short, uses the padding or an int3 */
void victim_int3(void);  /* a jump into its own first bytes: must be an int3 site */
void victim_access(void); /* writes regs_var: an access site for set:regs:regs_var */

__asm__(".text\n"
        ".p2align 4\n"
        ".globl victim_jump\n.type victim_jump,@function\n"
        "victim_jump:\n"
        "  nopl 0(%rax,%rax,1)\n"
        "  ret\n"
        ".size victim_jump, .-victim_jump\n"
        ".p2align 4\n"
        ".globl victim_short\n.type victim_short,@function\n"
        "victim_short:\n"
        "  ret\n"
        ".size victim_short, .-victim_short\n"
        ".p2align 4\n"
        ".globl victim_int3\n.type victim_int3,@function\n"
        "victim_int3:\n"
        "  jmp 1f\n"
        "1: nop\n  nop\n  nop\n"
        "  ret\n"
        ".size victim_int3, .-victim_int3\n"
        ".p2align 4\n"
        ".globl victim_access\n.type victim_access,@function\n"
        "victim_access:\n"
        "  movq $7, regs_var(%rip)\n"
        "  ret\n"
        ".size victim_access, .-victim_access\n"
        ".p2align 4\n"
        ".globl check_regs\n.type check_regs,@function\n"
        "check_regs:\n"
        "  push %rbx\n  push %rbp\n  push %r12\n  push %r13\n  push %r14\n  push %r15\n"
        "  sub $8, %rsp\n"              /* align: 6 pushes + return address = 56 */
        "  mov %rdi, %r11\n"
        "  lea xmm_values(%rip), %rax\n"
        "  movdqu 0(%rax), %xmm0\n  movdqu 16(%rax), %xmm1\n  movdqu 32(%rax), %xmm2\n"
        "  movdqu 48(%rax), %xmm3\n  movdqu 64(%rax), %xmm4\n  movdqu 80(%rax), %xmm5\n"
        "  movdqu 96(%rax), %xmm6\n  movdqu 112(%rax), %xmm7\n  movdqu 128(%rax), %xmm8\n"
        "  movdqu 144(%rax), %xmm9\n  movdqu 160(%rax), %xmm10\n  movdqu 176(%rax), %xmm11\n"
        "  movdqu 192(%rax), %xmm12\n  movdqu 208(%rax), %xmm13\n  movdqu 224(%rax), %xmm14\n"
        "  movdqu 240(%rax), %xmm15\n"
        "  mov $0x1010101010101010, %rax\n  mov $0x2020202020202020, %rbx\n"
        "  mov $0x3030303030303030, %rcx\n  mov $0x4040404040404040, %rdx\n"
        "  mov $0x5050505050505050, %rsi\n  mov $0x6060606060606060, %rdi\n"
        "  mov $0x7070707070707070, %rbp\n  mov $0x8080808080808080, %r8\n"
        "  mov $0x9090909090909090, %r9\n  mov $0xa0a0a0a0a0a0a0a0, %r10\n"
        "  mov $0xc0c0c0c0c0c0c0c0, %r12\n  mov $0xd0d0d0d0d0d0d0d0, %r13\n"
        "  mov $0xe0e0e0e0e0e0e0e0, %r14\n  mov $0xf0f0f0f0f0f0f0f0, %r15\n"
        "  mov %r11, saved_fn(%rip)\n"
        "  mov $0xb0b0b0b0b0b0b0b0, %r11\n"
        /* flags: CF=1 ZF=1 SF=0 OF=1 (via a crafted add), then call */
        "  push %rax\n  mov $0x7f, %al\n  add $1, %al\n  stc\n  pop %rax\n"
        "  pushfq\n  pop flags_before(%rip)\n"
        "  mov saved_fn(%rip), %r11\n"
        "  push %r11\n  mov $0xb0b0b0b0b0b0b0b0, %r11\n"
        "  call *(%rsp)\n"
        "  pushfq\n  pop flags_after(%rip)\n"
        "  add $8, %rsp\n"
        /* compare; build the mask in memory so registers stay as they came back */
        "  movq $0, mask(%rip)\n"
        "  mov %rax, saved_rax(%rip)\n"
        "  mov $0x1010101010101010, %rax\n  cmp %rax, saved_rax(%rip)\n  je 1f\n  orq $1, mask(%rip)\n1:\n"
        "  mov $0x2020202020202020, %rax\n  cmp %rax, %rbx\n  je 1f\n  orq $2, mask(%rip)\n1:\n"
        "  mov $0x3030303030303030, %rax\n  cmp %rax, %rcx\n  je 1f\n  orq $4, mask(%rip)\n1:\n"
        "  mov $0x4040404040404040, %rax\n  cmp %rax, %rdx\n  je 1f\n  orq $8, mask(%rip)\n1:\n"
        "  mov $0x5050505050505050, %rax\n  cmp %rax, %rsi\n  je 1f\n  orq $16, mask(%rip)\n1:\n"
        "  mov $0x6060606060606060, %rax\n  cmp %rax, %rdi\n  je 1f\n  orq $32, mask(%rip)\n1:\n"
        "  mov $0x7070707070707070, %rax\n  cmp %rax, %rbp\n  je 1f\n  orq $64, mask(%rip)\n1:\n"
        "  mov $0x8080808080808080, %rax\n  cmp %rax, %r8\n  je 1f\n  orq $128, mask(%rip)\n1:\n"
        "  mov $0x9090909090909090, %rax\n  cmp %rax, %r9\n  je 1f\n  orq $256, mask(%rip)\n1:\n"
        "  mov $0xa0a0a0a0a0a0a0a0, %rax\n  cmp %rax, %r10\n  je 1f\n  orq $512, mask(%rip)\n1:\n"
        "  mov $0xb0b0b0b0b0b0b0b0, %rax\n  cmp %rax, %r11\n  je 1f\n  orq $1024, mask(%rip)\n1:\n"
        "  mov $0xc0c0c0c0c0c0c0c0, %rax\n  cmp %rax, %r12\n  je 1f\n  orq $2048, mask(%rip)\n1:\n"
        "  mov $0xd0d0d0d0d0d0d0d0, %rax\n  cmp %rax, %r13\n  je 1f\n  orq $4096, mask(%rip)\n1:\n"
        "  mov $0xe0e0e0e0e0e0e0e0, %rax\n  cmp %rax, %r14\n  je 1f\n  orq $8192, mask(%rip)\n1:\n"
        "  mov $0xf0f0f0f0f0f0f0f0, %rax\n  cmp %rax, %r15\n  je 1f\n  orq $16384, mask(%rip)\n1:\n"
        "  mov flags_before(%rip), %rax\n  xor flags_after(%rip), %rax\n  and $0x8d5, %rax\n"
        "  je 1f\n  orq $32768, mask(%rip)\n1:\n"
        "  lea xmm_out(%rip), %rax\n"
        "  movdqu %xmm0, 0(%rax)\n  movdqu %xmm1, 16(%rax)\n  movdqu %xmm2, 32(%rax)\n"
        "  movdqu %xmm3, 48(%rax)\n  movdqu %xmm4, 64(%rax)\n  movdqu %xmm5, 80(%rax)\n"
        "  movdqu %xmm6, 96(%rax)\n  movdqu %xmm7, 112(%rax)\n  movdqu %xmm8, 128(%rax)\n"
        "  movdqu %xmm9, 144(%rax)\n  movdqu %xmm10, 160(%rax)\n  movdqu %xmm11, 176(%rax)\n"
        "  movdqu %xmm12, 192(%rax)\n  movdqu %xmm13, 208(%rax)\n  movdqu %xmm14, 224(%rax)\n"
        "  movdqu %xmm15, 240(%rax)\n"
        "  mov mask(%rip), %rax\n"
        "  add $8, %rsp\n"
        "  pop %r15\n  pop %r14\n  pop %r13\n  pop %r12\n  pop %rbp\n  pop %rbx\n"
        "  ret\n"
        ".size check_regs, .-check_regs\n"
        ".data\n.p2align 4\n"
        "xmm_values:\n"
        "  .fill 256, 1, 0x5a\n"
        "xmm_out: .fill 256, 1, 0\n"
        "saved_fn: .quad 0\nsaved_rax: .quad 0\nflags_before: .quad 0\nflags_after: .quad 0\nmask: .quad 0\n"
        ".globl regs_var\n.type regs_var,@object\n.size regs_var, 8\nregs_var: .quad 0\n"
        ".text\n");

extern unsigned char xmm_values[256], xmm_out[256];

static long check(void (*fn)(void)) {
  long m = check_regs(fn);
  for (int i = 0; i < 256; i++) xmm_values[i] = (unsigned char)(i * 7 + 3);
  m = check_regs(fn);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++)
      if (xmm_out[16 * i + j] != xmm_values[16 * i + j]) m |= 1L << (16 + i);
  return m;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100;
  long bad = 0;
  for (long i = 0; i < n; i++) {
    bad |= check(victim_jump);
    bad |= check(victim_short);
    bad |= check(victim_int3);
    bad |= check(victim_access);
  }
  printf("clobbered=%#lx\n", bad);
  return bad != 0;
}
