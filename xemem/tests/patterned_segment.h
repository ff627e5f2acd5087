/* The patterned segment of the test programs (host processes and LWK jobs): its owner exports
   fresh private pages, page i starting with base + i, and attachers check that pattern. Each
   program prints its own failure messages, as clowderd's tests look for them word for word. */
#ifndef PATTERNED_SEGMENT_H
#define PATTERNED_SEGMENT_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

/* Writes base + i at the start of page i (4096 bytes) of the first `pages` pages of `memory`. */
static inline void fill_with_pattern(volatile uint64_t *memory, unsigned long pages, uint64_t base)
{
	for (unsigned long page = 0; page < pages; page++)
		memory[page * 4096 / 8] = base + page;
}

/* `pages` pages of private memory, page i starting with base + i, exported as the segment
   `name`: the memory, with the segid in *segid (<= 0 when the make failed, errno saying why),
   or NULL when there is no memory. */
static inline volatile uint64_t *make_patterned_segment(unsigned long pages, uint64_t base, const char *name,
							xpmem_segid_t *segid)
{
	volatile uint64_t *memory = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED)
		return NULL;
	fill_with_pattern(memory, pages, base);
	*segid = xemem_make((void *)memory, pages * 4096, name);
	return memory;
}

/* make_patterned_segment that says how it went: the memory after printing "made a segment of
   enclave N" (the enclave the segid names), or NULL after printing "<what> failed: errno N"
   (or "no memory"). */
static inline volatile uint64_t *export_patterned_segment(unsigned long pages, uint64_t base, const char *name,
							  const char *what, xpmem_segid_t *segid)
{
	volatile uint64_t *memory = make_patterned_segment(pages, base, name, segid);
	if (!memory)
		printf("no memory\n");
	else if (*segid <= 0)
		printf("%s failed: errno %d\n", what, errno);
	else
		printf("made a segment of enclave %lld\n", (long long)(*segid >> 32));
	fflush(stdout);
	return memory && *segid > 0 ? memory : NULL;
}

/* How many of the first `pages` pages (4096 bytes each) of `view` start with the pattern,
   page i with base + i. */
static inline int pages_with_pattern(const volatile uint64_t *view, unsigned long pages, uint64_t base)
{
	int matching = 0;
	for (unsigned long page = 0; page < pages; page++)
		matching += view[page * 4096 / 8] == base + page;
	return matching;
}

/* Polls `word` every 10 ms, at most `tries` times, until an attacher writes `value` into it:
   whether it did. */
static inline int wait_for_word(const volatile uint64_t *word, uint64_t value, int tries)
{
	for (int attempt = 0; attempt < tries && *word != value; attempt++)
		usleep(10000);
	return *word == value;
}

/* Spins until an attacher writes `value` into `word`, for at most `seconds`: whether it did.
   For the LWK jobs, which have their core to themselves. */
static inline int spin_for_word(const volatile uint64_t *word, uint64_t value, double seconds)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	double deadline = t.tv_sec + t.tv_nsec * 1e-9 + seconds;
	while (*word != value) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec + t.tv_nsec * 1e-9 >= deadline)
			break;
	}
	return *word == value;
}

/* Says whether an attacher wrote `value` (`written`, from wait_for_word or spin_for_word):
   "<who> wrote VALUE" or "<who> never wrote". Returns `written`. */
static inline int report_write(int written, const char *who, uint64_t value)
{
	if (written)
		printf("%s wrote %llu\n", who, (unsigned long long)value);
	else
		printf("%s never wrote\n", who);
	fflush(stdout);
	return written;
}

#endif
