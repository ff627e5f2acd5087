/*
 * The applications' numeric arguments, taken whole and in range: anything else is named on
 * stderr with what was expected, and the program exits with status 2 (atol and atof read "2e7"
 * as 2 and "20M" as 20 without a word).
 */
#ifndef CLOWDER_APPS_ARGS_H
#define CLOWDER_APPS_ARGS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static inline long arg_integer(const char *program, const char *name, const char *text, long min, long max) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) {
        fprintf(stderr, "%s: %s must be an integer from %ld to %ld, got \"%s\"\n", program, name, min, max, text);
        exit(2);
    }
    return v;
}

static inline double arg_number(const char *program, const char *name, const char *text, double min, double max) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= min && v <= max)) {
        fprintf(stderr, "%s: %s must be a number from %g to %g, got \"%s\"\n", program, name, min, max, text);
        exit(2);
    }
    return v;
}

#endif
