/* What the four applications share besides DEX: their command line
 * ([--naive] then numbers) and the counter-based random numbers that make
 * their results independent of how work is split over threads and nodes. */
#ifndef DEX_APP_H
#define DEX_APP_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64's output function: the n-th random number is app_mix(n). */
static inline uint64_t app_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Sets *naive if the first argument is --naive; the index of the first number. */
static inline int app_naive_flag(int argc, char **argv, int *naive)
{
	*naive = argc > 1 && !strcmp(argv[1], "--naive");
	return 1 + *naive;
}

/* argv[i] as a whole number, or `fallback` if there are fewer arguments;
 * anything else ends the program with status 2, naming the argument. */
static inline long app_number(int argc, char **argv, int i, long fallback)
{
	if (i >= argc)
		return fallback;
	char *end;
	errno = 0;
	long value = strtol(argv[i], &end, 10);
	if (errno || end == argv[i] || *end) {
		fprintf(stderr, "%s: '%s' is not a whole number\n", argv[0], argv[i]);
		exit(2);
	}
	return value;
}

#endif
