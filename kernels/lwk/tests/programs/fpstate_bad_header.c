/* A handler that writes a reserved byte of the XSAVE header in its frame's fpstate: sigreturn
   refuses the frame and the job ends with SIGSEGV (139), as on Linux, where the XRSTOR would
   fault; the kernel itself must not. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

static void on_usr1(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
    ucontext_t *uc = context;
    uint8_t *fpstate = (uint8_t *)uc->uc_mcontext.fpregs;
    uint32_t magic1;
    memcpy(&magic1, fpstate + 464, 4);
    if (magic1 == 0x46505853u) fpstate[512 + 20] = 1; /* inside the header's reserved bytes */
}

int main(void) {
    struct sigaction action = {0};
    action.sa_sigaction = on_usr1;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &action, NULL);
    printf("raising SIGUSR1; its handler spoils the XSAVE header in the frame\n");
    fflush(stdout);
    raise(SIGUSR1);
    printf("sigreturn accepted the frame\n");
    return 0;
}
