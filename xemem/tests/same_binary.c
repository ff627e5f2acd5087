/*
 * same_binary: one statically linked XPMEM program (musl, xpmem.h, libxpmem.a) whose output
 * must be identical on the host (libxpmem -> clowderd's broker) and in the lightweight kernel
 * (libxpmem -> the LWK's /dev/xpmem ioctls). xemem/lwk-test.sh runs it both ways and compares
 * output and exit status. It prints no ids or addresses, only what XPMEM promises.
 *
 * Everything happens in one process (the LWK runs one job): the owner is the main thread or a
 * second thread, the attacher the other one. The last step removes a segment and touches its
 * attachment, which must kill the program with SIGBUS (exit status 135) on both sides.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL

static int failures;

#define CHECK(condition, what)                                                                     \
	do {                                                                                       \
		if (condition)                                                                     \
			printf("ok   %s\n", what);                                                     \
		else {                                                                             \
			printf("FAIL %s (errno %d)\n", what, errno);                               \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

/* A failed call with this errno. */
#define EXPECT_ERROR(call, expected, what)                                                         \
	do {                                                                                       \
		errno = 0;                                                                         \
		long result_ = (long)(call);                                                       \
		printf("%s %s: result %ld errno %s\n", result_ == -1 && errno == (expected) ? "ok  " : "FAIL", \
		       what, result_, errno == EINVAL ? "EINVAL" : errno == ENOENT ? "ENOENT" :     \
		       errno == EACCES ? "EACCES" : errno == 0 ? "0" : "other");                  \
		if (!(result_ == -1 && errno == (expected)))                                       \
			failures++;                                                                \
	} while (0)

/*
 * Fresh private memory, preceded by one read-only page. On the host, Linux may merge a new
 * anonymous mapping with a thread's stack just below it (the stack sits above its PROT_NONE
 * guard), and libxpmem never exports the first 8 MiB above a guard (it takes them for a
 * stack: docs/xemem.md, caveats), so such memory would read as a hole. The read-only page
 * keeps every test buffer a mapping of its own.
 */
static void *map_pages(size_t pages)
{
	char *memory = mmap(NULL, (pages + 1) * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED || mprotect(memory, PAGE, PROT_READ) < 0) {
		perror("mmap");
		exit(2);
	}
	return memory + PAGE;
}

static void unmap_pages(void *memory, size_t pages)
{
	munmap((char *)memory - PAGE, (pages + 1) * PAGE);
}

static void *attach(xpmem_apid_t apid, off_t offset, size_t size)
{
	struct xpmem_addr address = { .apid = apid, .offset = offset };
	return xpmem_attach(address, size, NULL);
}

static void argument_errors(void)
{
	char *memory = map_pages(4);
	EXPECT_ERROR(xpmem_make(memory + 1, PAGE, XPMEM_PERMIT_MODE, (void *)0600), EINVAL, "make: unaligned address");
	EXPECT_ERROR(xpmem_make(memory, PAGE, 0, (void *)0600), EINVAL, "make: permit type 0");
	EXPECT_ERROR(xpmem_make(memory, PAGE, XPMEM_PERMIT_MODE, (void *)01000), EINVAL, "make: mode above 0777");
	EXPECT_ERROR(xpmem_make(memory, 0, XPMEM_PERMIT_MODE, (void *)0600), EINVAL, "make: size 0");
	EXPECT_ERROR(xpmem_make(memory, PAGE + 1, XPMEM_PERMIT_MODE, (void *)0600), EINVAL, "make: unaligned size");
	EXPECT_ERROR(xpmem_remove(-1), EINVAL, "remove -1");
	EXPECT_ERROR(xpmem_get(-1, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EINVAL, "get -1");
	EXPECT_ERROR(xpmem_get(12345, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EINVAL, "get 12345 (no enclave part: never valid)");
	EXPECT_ERROR(xpmem_get((1LL << 32) | 777777, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT, "get of a well-formed id nobody made");
	EXPECT_ERROR(xpmem_release(-1), EINVAL, "release -1");

	xpmem_segid_t segid = xpmem_make(memory, 4 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(segid > 0, "make 4 pages");
	EXPECT_ERROR(xpmem_get(segid, 9999, XPMEM_PERMIT_MODE, NULL), EINVAL, "get: flags 9999");
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDONLY | XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), EINVAL, "get: RDONLY|RDWR");
	xpmem_apid_t read_only = xpmem_get(segid, XPMEM_RDONLY, XPMEM_PERMIT_MODE, (void *)0666);
	CHECK(read_only > 0, "get RDONLY (permit value ignored)");
	EXPECT_ERROR(attach(read_only, 0, PAGE), EACCES, "attach with a RDONLY permit");
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	CHECK(apid > 0, "get RDWR");
	EXPECT_ERROR(attach(apid, 100, PAGE), EINVAL, "attach: unaligned offset");
	EXPECT_ERROR(attach(apid, 4 * PAGE, PAGE), EINVAL, "attach: past the end");
	EXPECT_ERROR(attach(apid, 0, 5 * PAGE), EINVAL, "attach: larger than the segment");
	EXPECT_ERROR(attach(apid, 0, 0), EINVAL, "attach: size 0");
	EXPECT_ERROR(attach(-1, 0, PAGE), EINVAL, "attach: apid -1");
	CHECK(xpmem_release(read_only) == 0 && xpmem_release(apid) == 0, "release both permits");
	EXPECT_ERROR(xpmem_release(apid), ENOENT, "release again");
	CHECK(xpmem_remove(segid) == 0, "remove");
	EXPECT_ERROR(xpmem_remove(segid), ENOENT, "remove again");
	EXPECT_ERROR(xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL), ENOENT, "get after remove");
	unmap_pages(memory, 4);
}

/* Attach `pages` pages of fresh memory filled with a pattern; check and write back. */
static void share(size_t pages, const char *what)
{
	uint64_t *memory = map_pages(pages);
	size_t words = pages * PAGE / 8;
	for (size_t i = 0; i < words; i++)
		memory[i] = i * 2654435761u;
	xpmem_segid_t segid = xpmem_make(memory, pages * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	uint64_t *view = attach(apid, 0, pages * PAGE);
	char line[128];
	snprintf(line, sizeof line, "%s: make, get, attach", what);
	CHECK(segid > 0 && apid > 0 && view != (void *)-1 && view != (uint64_t *)memory, line);
	if (view == (void *)-1)
		return;
	size_t mismatches = 0;
	for (size_t i = 0; i < words; i++)
		mismatches += view[i] != i * 2654435761u;
	for (size_t page = 0; page < pages; page++)
		view[page * PAGE / 8] += 1;
	for (size_t page = 0; page < pages; page++)
		mismatches += memory[page * PAGE / 8] != page * PAGE / 8 * 2654435761u + 1;
	snprintf(line, sizeof line, "%s: the attachment reads the source, writes reach it (%zu mismatches)", what, mismatches);
	CHECK(mismatches == 0, line);
	snprintf(line, sizeof line, "%s: detach by an inner address, release, remove", what);
	CHECK(xpmem_detach((char *)view + pages * PAGE / 2 + 8) == 0 && xpmem_release(apid) == 0 && xpmem_remove(segid) == 0, line);
	unmap_pages(memory, pages);
}

/* Owner thread and attacher thread. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t changed;
	xpmem_segid_t segid;
	volatile uint64_t *counters;
	int attacher_done;
} shared = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, NULL, 0 };

static void *owner_thread(void *unused)
{
	(void)unused;
	uint64_t *counters = map_pages(8);
	for (int i = 0; i < 8; i++)
		counters[i * PAGE / 8] = 1000 + i;
	xpmem_segid_t segid = xpmem_make(counters, 8 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	pthread_mutex_lock(&shared.lock);
	shared.segid = segid;
	shared.counters = counters;
	pthread_cond_broadcast(&shared.changed);
	while (!shared.attacher_done)
		pthread_cond_wait(&shared.changed, &shared.lock);
	pthread_mutex_unlock(&shared.lock);
	int sum = 0;
	for (int i = 0; i < 8; i++)
		sum += (int)counters[i * PAGE / 8];
	printf("owner thread: sum after the attacher's writes %d\n", sum);
	xpmem_remove(segid);
	return NULL;
}

static void two_threads(void)
{
	pthread_t owner;
	pthread_create(&owner, NULL, owner_thread, NULL);
	pthread_mutex_lock(&shared.lock);
	while (!shared.segid)
		pthread_cond_wait(&shared.changed, &shared.lock);
	xpmem_segid_t segid = shared.segid;
	pthread_mutex_unlock(&shared.lock);
	CHECK(segid > 0, "threads: the owner thread made a segment");
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	uint64_t *view = attach(apid, 2 * PAGE, 6 * PAGE);
	CHECK(view != (void *)-1, "threads: attach at offset 2 pages");
	if (view != (void *)-1) {
		printf("threads: first counter seen through the attachment %d\n", (int)view[0]);
		for (int i = 0; i < 6; i++)
			view[i * PAGE / 8] += 100;
		xpmem_detach(view);
	}
	xpmem_release(apid);
	pthread_mutex_lock(&shared.lock);
	shared.attacher_done = 1;
	pthread_cond_broadcast(&shared.changed);
	pthread_mutex_unlock(&shared.lock);
	pthread_join(owner, NULL);
}

static void whole_address_space(void)
{
	xpmem_segid_t whole = xpmem_make(0, XPMEM_MAXADDR_SIZE, XPMEM_PERMIT_MODE, (void *)0600);
	CHECK(whole > 0, "whole address space: make(0, XPMEM_MAXADDR_SIZE)");
	/* Memory made after the segment is covered; its attach offset is its address. */
	uint64_t *later = map_pages(16);
	for (int i = 0; i < 16; i++)
		later[i * PAGE / 8] = 7 * i;
	xpmem_apid_t apid = xpmem_get(whole, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	uint64_t *view = attach(apid, (off_t)(uintptr_t)later, 16 * PAGE);
	int matches = 0;
	if (view != (void *)-1)
		for (int i = 0; i < 16; i++)
			matches += view[i * PAGE / 8] == (uint64_t)(7 * i);
	printf("whole address space: %d of 16 pages match at offset = address\n", matches);
	CHECK(matches == 16, "whole address space: attach memory mapped after make");
	CHECK(xpmem_detach(view) == 0 && xpmem_release(apid) == 0 && xpmem_remove(whole) == 0, "whole address space: teardown");
	unmap_pages(later, 16);
}

static void detach_rules(void)
{
	char *own = map_pages(1);
	own[0] = 1;
	char *unmapped = map_pages(1);
	unmap_pages(unmapped, 1);
	CHECK(xpmem_detach(unmapped) == 0, "detach of an unmapped address is 0");
	EXPECT_ERROR(xpmem_detach(own), EINVAL, "detach of memory that is not an attachment");
	unmap_pages(own, 1);
}

static void removed_segment_sigbus(void)
{
	uint64_t *memory = map_pages(4);
	memory[0] = 42;
	xpmem_segid_t segid = xpmem_make(memory, 4 * PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	volatile uint64_t *view = attach(apid, 0, 4 * PAGE);
	CHECK(view != (void *)-1 && view[0] == 42, "sigbus: attached, reads the source");
	CHECK(xpmem_remove(segid) == 0 && memory[0] == 42, "sigbus: removed, the owner keeps its data");
	printf("sigbus: touching the attachment after remove (must die of SIGBUS, status 135)\n");
	printf("failures before the last step: %d\n", failures);
	fflush(stdout);
	uint64_t value = view[0];
	printf("FAIL read %llu through a removed segment\n", (unsigned long long)value);
	exit(1);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("version %#x\n", xpmem_version());
	argument_errors();
	share(1, "1 page");
	share(100, "100 pages");
	share(1024, "4 MiB");
	two_threads();
	whole_address_space();
	detach_rules();
	removed_segment_sigbus();
	return 0;
}
