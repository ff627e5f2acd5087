/* A handler that runs between two instructions of a hand-written loop must leave every
   general register and the SSE registers as they were: the signal arrives at the return of
   a tgkill system call made from assembly, with known values in all registers. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

static void on_usr1(int sig) {
    /* Scribble on registers the compiler may use. */
    volatile double x = sig;
    for (int i = 0; i < 5; i++) x = x * 1.5 + 2;
}

uint64_t out[12];
double xmm_out;
long pid, tid;

int main(void) {
    signal(SIGUSR1, on_usr1);
    pid = getpid();
    tid = syscall(SYS_gettid);
    __asm__ volatile(
        "mov $0x1111, %%rbx\n"
        "mov $0x3333, %%r8\n"
        "mov $0x4444, %%r9\n"
        "mov $0x5555, %%r10\n"
        "mov $0x6666, %%r12\n"
        "mov $0x7777, %%r13\n"
        "mov $0x8888, %%r14\n"
        "mov $0x9999, %%r15\n"
        "mov $0x400c000000000000, %%rax\n" /* 3.5 */
        "movq %%rax, %%xmm7\n"
        "mov pid(%%rip), %%rdi\n"
        "mov tid(%%rip), %%rsi\n"
        "mov $10, %%edx\n"
        "mov $234, %%eax\n"
        "syscall\n"
        "mov %%rax, out+0(%%rip)\n"
        "mov %%rbx, out+8(%%rip)\n"
        "mov %%rdx, out+16(%%rip)\n"
        "mov %%r8, out+24(%%rip)\n"
        "mov %%r9, out+32(%%rip)\n"
        "mov %%r10, out+40(%%rip)\n"
        "mov %%r12, out+48(%%rip)\n"
        "mov %%r13, out+56(%%rip)\n"
        "mov %%r14, out+64(%%rip)\n"
        "mov %%r15, out+72(%%rip)\n"
        "mov %%rdi, out+80(%%rip)\n"
        "mov %%rsi, out+88(%%rip)\n"
        "movsd %%xmm7, xmm_out(%%rip)\n"
        :
        :
        : "rax", "rbx", "rcx", "rdx", "rdi", "rsi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "xmm7", "memory");
    printf("result %lu\n", (unsigned long)out[0]);
    printf("rbx %lx rdx %lx r8 %lx r9 %lx r10 %lx\n", (unsigned long)out[1], (unsigned long)out[2], (unsigned long)out[3],
           (unsigned long)out[4], (unsigned long)out[5]);
    printf("r12 %lx r13 %lx r14 %lx r15 %lx\n", (unsigned long)out[6], (unsigned long)out[7], (unsigned long)out[8],
           (unsigned long)out[9]);
    printf("rdi is pid %d rsi is tid %d xmm7 %.2f\n", out[10] == (uint64_t)pid, out[11] == (uint64_t)tid, xmm_out);
    return 0;
}
