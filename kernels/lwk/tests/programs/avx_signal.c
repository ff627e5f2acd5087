/* AVX registers across a signal handler: ymm8 holds a value while a signal arrives (the
   system call that sends it is the instruction in between); the handler finds the full
   XSAVE area in its frame (UC_FP_XSTATE, FP_XSTATE_MAGIC1/2, the AVX bit in xstate_bv,
   ymm8's upper half where CPUID leaf 0xd says), starts with ymm8 cleared, clobbers it, and
   sigreturn brings the saved value back; a second time the handler edits the upper half in
   the frame and sigreturn loads the edited value. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* Linux's values (glibc's headers define them, musl's do not). */
#define MAGIC1 0x46505853u
#define MAGIC2 0x46505845u
#define UC_FP_XSTATE_FLAG 1

static uint8_t value[32], result[32], edited_upper[16];
static unsigned ymm_upper_offset;
static volatile int edit_frame;
static volatile int has_xstate_flag, magic1_ok, magic2_ok, avx_in_use, frame_upper_matches, zero_at_entry;

static void on_usr1(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
    uint8_t at_entry[32], zero[32] = {0};
    __asm__ volatile("vmovdqu %%ymm8, %0" : "=m"(at_entry));
    zero_at_entry = memcmp(at_entry, zero, 32) == 0;
    ucontext_t *uc = context;
    uint8_t *fpstate = (uint8_t *)uc->uc_mcontext.fpregs;
    uint32_t magic1, xstate_size, magic2;
    uint64_t xstate_bv;
    memcpy(&magic1, fpstate + 464, 4);
    memcpy(&xstate_size, fpstate + 464 + 16, 4);
    memcpy(&xstate_bv, fpstate + 512, 8);
    has_xstate_flag = !!(uc->uc_flags & UC_FP_XSTATE_FLAG);
    magic1_ok = magic1 == MAGIC1;
    memcpy(&magic2, fpstate + xstate_size, 4);
    magic2_ok = magic2 == MAGIC2;
    avx_in_use = !!(xstate_bv & 4);
    uint8_t *upper = fpstate + ymm_upper_offset + 8 * 16;
    frame_upper_matches = memcmp(upper, value + 16, 16) == 0;
    if (edit_frame) memcpy(upper, edited_upper, 16);
    __asm__ volatile("vpcmpeqd %%ymm8, %%ymm8, %%ymm8" ::: "xmm8");
}

/* Loads `value` into ymm8, sends SIGUSR1 to this thread, stores ymm8 into `result`. */
static void signal_with_ymm8_live(void) {
    long number = SYS_tgkill;
    __asm__ volatile("vmovdqu %[in], %%ymm8\n\t"
                     "syscall\n\t"
                     "vmovdqu %%ymm8, %[out]"
                     : [out] "=m"(result), "+a"(number)
                     : [in] "m"(value), "D"((long)getpid()), "S"((long)syscall(SYS_gettid)), "d"((long)SIGUSR1)
                     : "rcx", "r11", "memory", "xmm8");
}

int main(void) {
    unsigned eax, ebx, ecx, edx;
    __cpuid(1, eax, ebx, ecx, edx);
    unsigned xcr0_low = 0;
    if (ecx & (1u << 27)) __asm__("xgetbv" : "=a"(xcr0_low) : "c"(0) : "edx");
    if (!(ecx & (1u << 28)) || (xcr0_low & 6) != 6) {
        printf("AVX is not enabled\n");
        return 0;
    }
    __cpuid_count(0xd, 2, eax, ebx, ecx, edx);
    ymm_upper_offset = ebx;
    for (int i = 0; i < 32; i++) value[i] = 0x11 * (i % 15) + i;
    for (int i = 0; i < 16; i++) edited_upper[i] = 0xa0 + i;

    struct sigaction action = {0};
    action.sa_sigaction = on_usr1;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &action, NULL);

    signal_with_ymm8_live();
    printf("frame: UC_FP_XSTATE %d, magic1 %d, magic2 %d, AVX in xstate_bv %d, ymm8 upper half in the frame %d\n",
           has_xstate_flag, magic1_ok, magic2_ok, avx_in_use, frame_upper_matches);
    printf("handler started with ymm8 cleared: %d\n", zero_at_entry);
    printf("ymm8 survived the handler: %d\n", memcmp(result, value, 32) == 0);

    edit_frame = 1;
    signal_with_ymm8_live();
    printf("ymm8 after an edited frame: lower half kept %d, upper half edited %d\n",
           memcmp(result, value, 16) == 0, memcmp(result + 16, edited_upper, 16) == 0);
    return 0;
}
