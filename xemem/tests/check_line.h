/* The "ok <what>" / "FAIL <what>" line of the LWK job programs (lwk_fork_device.c, lwk_snapshot.c):
   xemem/lwk-test.sh reads these lines from the enclave's console, so each is flushed at once. */
#ifndef CHECK_LINE_H
#define CHECK_LINE_H

#include <stdio.h>

static int failures;

static void check(int ok, const char *what)
{
	printf("%s %s\n", ok ? "ok" : "FAIL", what);
	fflush(stdout);
	if (!ok)
		failures++;
}

#endif
