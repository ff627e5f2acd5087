/*
 * The process's tables (segments made, attachments held, converted backings) and the
 * locks and broker connections that guard and serve them.
 */
#include "xpmem_internal.h"

/* call_lock serialises requests on call_fd; table_lock guards the tables below. Lock order:
 * call_lock before table_lock; the service thread takes only table_lock. */
pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
int call_fd = -1;
int serve_fd = -1;

struct backing *backings;
size_t backing_count, backing_capacity;
struct segment *segments;
size_t segment_count, segment_capacity;
struct attachment *attachments;
size_t attachment_count, attachment_capacity;
int hole_fd = -1;

int grow(void **array, size_t *capacity, size_t count, size_t item)
{
	if (count < *capacity)
		return 0;
	size_t wanted = *capacity ? *capacity * 2 : 16;
	void *bigger = realloc(*array, wanted * item);
	if (!bigger)
		return -1;
	*array = bigger;
	*capacity = wanted;
	return 0;
}
