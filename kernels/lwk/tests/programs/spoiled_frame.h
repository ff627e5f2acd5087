/* What the fpstate_bad_* tests share: SIGUSR1 raised with a handler that spoils the fpstate
   in its own signal frame, after which sigreturn must refuse the frame (the job ends with
   SIGSEGV, 139, as on Linux) and the kernel itself must not fault. */
#ifndef SPOILED_FRAME_H
#define SPOILED_FRAME_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <ucontext.h>

static void (*spoil_frame)(uint8_t *fpstate);

static void on_usr1(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
    ucontext_t *uc = context;
    spoil_frame((uint8_t *)uc->uc_mcontext.fpregs);
}

/* Raises SIGUSR1 with a handler that calls `spoil` on its frame's fpstate (`what` it spoils,
   for the log); returns 0 only if sigreturn accepted the frame. */
static int raise_with_spoiled_frame(void (*spoil)(uint8_t *fpstate), const char *what) {
    spoil_frame = spoil;
    struct sigaction action = {0};
    action.sa_sigaction = on_usr1;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &action, NULL);
    printf("raising SIGUSR1; its handler spoils %s in the frame\n", what);
    fflush(stdout);
    raise(SIGUSR1);
    printf("sigreturn accepted the frame\n");
    return 0;
}

#endif
