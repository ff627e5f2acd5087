/* Two threads sharing one CPU, each keeping its own values in every YMM register (and, where
   the CPU and XCR0 have AVX-512, in ZMM16-31 and the opmask registers k1-k7) across many
   sched_yield calls and time slices, then checking them: a kernel that switches threads with
   FXSAVE only lets the upper halves and the AVX-512 state of one thread leak into the other.
   The second thread also moves itself between CPUs 0 and 1 every eight yields (where there is
   no CPU 1 it stays), so its state travels between cores. The values stay in registers inside
   one assembly block; the output is the same whether or not AVX-512 or a second CPU is there. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define YIELDS 200
/* Every eighth yield, a spin of about 10 ms on the host: the other thread's time slice ends. */
#define SPIN 20000000

struct state {
    uint8_t ymm[16][32];
    uint8_t zmm[16][64]; /* zmm16-31 */
    uint64_t k[7];       /* k1-k7 */
};

static int has_avx512;
/* CPU 0 alone, CPU 1 alone: where the second thread moves. */
static cpu_set_t move_masks[2];

#define LOAD_YMM(n) "vmovdqu " #n "*32(%[in]), %%ymm" #n "\n\t"
#define STORE_YMM(n) "vmovdqu %%ymm" #n ", " #n "*32(%[out])\n\t"
#define ALL16(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
/* r14: the two affinity masks (CPU 0, CPU 1), or 0 for a thread that does not move. */
#define YIELD_LOOP                                                                                 \
    "mov %[masks], %%r14\n\t"                                                                      \
    "mov %[yields], %%r12d\n\t"                                                                    \
    "1: mov $24, %%eax\n\t" /* sched_yield */                                                      \
    "syscall\n\t"                                                                                  \
    "test $7, %%r12d\n\t"                                                                          \
    "jnz 2f\n\t"                                                                                   \
    "mov %[spin], %%r13\n\t"                                                                       \
    "3: dec %%r13\n\t"                                                                             \
    "jnz 3b\n\t"                                                                                   \
    "test %%r14, %%r14\n\t"                                                                        \
    "jz 2f\n\t"                                                                                    \
    "mov %%r12d, %%edx\n\t" /* bit 3 of the count picks the CPU */                                \
    "and $8, %%edx\n\t"                                                                            \
    "shl $4, %%edx\n\t"                                                                            \
    "add %%r14, %%rdx\n\t"                                                                         \
    "mov $203, %%eax\n\t" /* sched_setaffinity(0, 128, mask) */                                    \
    "xor %%edi, %%edi\n\t"                                                                         \
    "mov $128, %%esi\n\t"                                                                          \
    "syscall\n\t"                                                                                  \
    "2: dec %%r12d\n\t"                                                                            \
    "jnz 1b\n\t"
#define CLOBBERS "rax", "rcx", "rdx", "rsi", "rdi", "r11", "r12", "r13", "r14", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", \
    "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

/* AVX-512 registers, written out (zmm16-31 at in->zmm, k1-k7 at in->k). */
#define LOAD_ZMM(n) "vmovdqu64 (" #n "-16)*64+512(%[in]), %%zmm" #n "\n\t"
#define STORE_ZMM(n) "vmovdqu64 %%zmm" #n ", (" #n "-16)*64+512(%[out])\n\t"
#define ZMM16(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#define LOAD_K(n) "kmovq (" #n "-1)*8+1536(%[in]), %%k" #n "\n\t"
#define STORE_K(n) "kmovq %%k" #n ", (" #n "-1)*8+1536(%[out])\n\t"
#define K7(M) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

static void keep_registers(const struct state *in, struct state *out, const cpu_set_t *masks) {
    _Static_assert(offsetof(struct state, zmm) == 512 && offsetof(struct state, k) == 1536, "layout");
    if (has_avx512)
        __asm__ volatile(ALL16(LOAD_YMM) ZMM16(LOAD_ZMM) K7(LOAD_K) YIELD_LOOP ALL16(STORE_YMM) ZMM16(STORE_ZMM) K7(STORE_K)
                         : : [in] "r"(in), [out] "r"(out), [yields] "i"(YIELDS), [spin] "i"(SPIN), [masks] "r"(masks) : CLOBBERS);
    else
        __asm__ volatile(ALL16(LOAD_YMM) YIELD_LOOP ALL16(STORE_YMM)
                         : : [in] "r"(in), [out] "r"(out), [yields] "i"(YIELDS), [spin] "i"(SPIN), [masks] "r"(masks) : CLOBBERS);
}

static void *thread_main(void *arg) {
    int id = (int)(intptr_t)arg;
    static struct state in[2], out[2];
    uint8_t *bytes = (uint8_t *)&in[id];
    for (size_t i = 0; i < sizeof in[id]; i++) bytes[i] = (uint8_t)(i * 7 + 1 + id * 0x55);
    keep_registers(&in[id], &out[id], id == 1 ? move_masks : NULL);
    int bad = 0;
    for (int r = 0; r < 16; r++) bad += memcmp(in[id].ymm[r], out[id].ymm[r], 32) != 0;
    if (has_avx512) {
        for (int r = 0; r < 16; r++) bad += memcmp(in[id].zmm[r], out[id].zmm[r], 64) != 0;
        for (int r = 0; r < 7; r++) bad += in[id].k[r] != out[id].k[r];
    }
    return (void *)(intptr_t)bad;
}

int main(void) {
    unsigned eax, ebx, ecx, edx, xcr0 = 0;
    __cpuid(1, eax, ebx, ecx, edx);
    if (ecx & (1u << 27)) __asm__("xgetbv" : "=a"(xcr0) : "c"(0) : "edx");
    if (!(ecx & (1u << 28)) || (xcr0 & 6) != 6) {
        printf("AVX is not enabled\n");
        return 1;
    }
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    has_avx512 = (ebx & (1u << 16)) && (xcr0 & 0xe0) == 0xe0;

    CPU_SET(0, &move_masks[0]);
    CPU_SET(1, &move_masks[1]);
    if (sched_setaffinity(0, sizeof move_masks[0], &move_masks[0]) != 0) {
        printf("sched_setaffinity failed\n");
        return 1;
    }
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, thread_main, (void *)(intptr_t)i);
    int failures = 0;
    for (int i = 0; i < 2; i++) {
        void *bad;
        pthread_join(threads[i], &bad);
        printf("thread %d: %s\n", i, bad ? "registers changed" : "registers kept");
        failures += bad != NULL;
    }
    printf("%s\n", failures ? "vector state leaked between threads" : "vector state kept per thread");
    return failures != 0;
}
