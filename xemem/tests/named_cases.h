/* What the host-process case programs share (conformance.c, snapshot.c): the failing case's
   name in every FAIL line, and a main that runs one case by name or lists them (test.sh runs
   each case as its own process, so one crash names its case). Include after
   conformance_check.h. */
#ifndef NAMED_CASES_H
#define NAMED_CASES_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct named_case {
	const char *name;
	int (*run)(void);
};

static const char *current_case;

static void fail(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "[%s pid %d] FAIL: ", current_case, getpid());
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));
	exit(1);
}

/* `PROGRAM CASE` runs CASE; `PROGRAM --list` prints every case's name. */
static int run_named_case(const struct named_case *cases, size_t count, int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CASE | --list\n", argv[0]);
		return 2;
	}
	for (size_t i = 0; i < count; i++) {
		if (!strcmp(argv[1], "--list"))
			printf("%s\n", cases[i].name);
		else if (!strcmp(argv[1], cases[i].name)) {
			current_case = cases[i].name;
			return cases[i].run();
		}
	}
	if (!strcmp(argv[1], "--list"))
		return 0;
	fprintf(stderr, "unknown case %s\n", argv[1]);
	return 2;
}

#endif
