/* A handler that sets reserved MXCSR bits in its frame's fpstate: sigreturn refuses the frame
   and the job ends with SIGSEGV (139), as on Linux, where the FXRSTOR/XRSTOR would fault;
   the kernel itself must not. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

static void on_usr1(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
    ucontext_t *uc = context;
    uint32_t mxcsr = 0xffffffffu;
    memcpy((uint8_t *)uc->uc_mcontext.fpregs + 24, &mxcsr, 4);
}

int main(void) {
    struct sigaction action = {0};
    action.sa_sigaction = on_usr1;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &action, NULL);
    printf("raising SIGUSR1; its handler spoils MXCSR in the frame\n");
    fflush(stdout);
    raise(SIGUSR1);
    printf("sigreturn accepted the frame\n");
    return 0;
}
