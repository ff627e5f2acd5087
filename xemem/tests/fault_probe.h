/* Touching memory that may not be there, for the test programs that check which signal an
   access raises (SIGSEGV where nothing is mapped, SIGBUS in a removed or hole-backed
   attachment) and go on. Handlers are installed only around the access. */
#ifndef FAULT_PROBE_H
#define FAULT_PROBE_H

#include <setjmp.h>
#include <signal.h>

static sigjmp_buf fault_jump;
static volatile sig_atomic_t fault_signal;

static void on_fault(int sig)
{
	fault_signal = sig;
	siglongjmp(fault_jump, 1);
}

/* Touches one int at p (reads, or writes 42 when write); returns 0 or the signal it raised. */
static int touch(volatile int *p, int write)
{
	struct sigaction action = { .sa_handler = on_fault, .sa_flags = SA_NODEFER }, old_bus, old_segv;
	sigemptyset(&action.sa_mask);
	sigaction(SIGBUS, &action, &old_bus);
	sigaction(SIGSEGV, &action, &old_segv);
	fault_signal = 0;
	if (sigsetjmp(fault_jump, 1) == 0) {
		if (write)
			*p = 42;
		else
			(void)*p;
	}
	sigaction(SIGBUS, &old_bus, NULL);
	sigaction(SIGSEGV, &old_segv, NULL);
	return fault_signal;
}

#endif
