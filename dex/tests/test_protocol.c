/* Unit and property tests of the pure protocol (src/protocol.c).
 *
 * The property test simulates an origin and several nodes exchanging real
 * protocol decisions over FIFO channels in random interleavings, and checks
 * after every step that (a) at most one node may write a page and never
 * while another can read it, (b) every node allowed to read sees the value
 * of the latest write (sequential consistency at page granularity), and
 * (c) once traffic stops every fault has been answered. Nodes sometimes ask
 * for the following pages too (prefetch), which the origin grants or
 * declines, and sometimes release a page they write (as a migrating thread
 * takes its stack page to the origin), crossing invalidations in flight. */
#include "../src/protocol.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static int checks;

#define CHECK(cond, ...)                                                                                   \
	do {                                                                                               \
		checks++;                                                                                  \
		if (!(cond)) {                                                                             \
			failures++;                                                                        \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                    \
			fprintf(stderr, __VA_ARGS__);                                                      \
			fputc('\n', stderr);                                                               \
		}                                                                                          \
	} while (0)

/* ------------------------------------------------------------ simulation */

#define SIM_NODES 4
#define SIM_PAGES 3
#define SIM_CHANNEL 256

#define SIM_DECLINE (-1) /* a prefetched page declined (DEX_MSG_PAGE_PREFETCH bit clear) */
#define SIM_RELEASE (-2) /* a page given up with its bytes (carried by DEX_MSG_MIGRATE) */

struct sim_msg {
	int type; /* DEX_MSG_PAGE_REQUEST, _GRANT, _INVALIDATE, _INVALIDATE_ACK, SIM_DECLINE, SIM_RELEASE */
	uint32_t page;
	int access; /* for a request: how many following pages it also asks for */
	int flag; /* write / with_data / want_data */
	long value;
};

struct sim_channel {
	struct sim_msg msgs[SIM_CHANNEL];
	int head, count;
};

struct sim {
	unsigned nodes;
	struct dsm_dir dir;
	struct dsm_dir_page pages[SIM_PAGES];
	struct dsm_queued_request pool[64];
	uint8_t state[SIM_NODES][SIM_PAGES];
	uint8_t inflight[SIM_NODES][SIM_PAGES];
	long value[SIM_NODES][SIM_PAGES]; /* node 0's value is its backing memory */
	long latest[SIM_PAGES];
	struct sim_channel to_node[SIM_NODES];
	struct sim_channel to_origin[SIM_NODES];
	long short_grants, data_grants, accesses, prefetch_granted, prefetch_declined, releases, crossings;
	int broken;
};

static void push(struct sim_channel *c, struct sim_msg m)
{
	if (c->count == SIM_CHANNEL) {
		fprintf(stderr, "simulation channel overflow\n");
		exit(2);
	}
	c->msgs[(c->head + c->count++) % SIM_CHANNEL] = m;
}

static struct sim_msg pop(struct sim_channel *c)
{
	struct sim_msg m = c->msgs[c->head];
	c->head = (c->head + 1) % SIM_CHANNEL;
	c->count--;
	return m;
}

static void sim_emit(void *ctx, const struct dsm_action *a)
{
	struct sim *s = ctx;
	switch (a->kind) {
	case DSM_ACT_INVALIDATE:
		push(&s->to_node[a->node], (struct sim_msg){ DEX_MSG_INVALIDATE, a->page, a->access, a->with_data, 0 });
		break;
	case DSM_ACT_GRANT:
		if (a->node == 0) {
			if (dsm_node_grant(&s->state[0][a->page], &s->inflight[0][a->page], a->access) != DSM_OK)
				s->broken = 1;
		} else {
			if (a->with_data)
				s->data_grants++;
			else
				s->short_grants++;
			push(&s->to_node[a->node], (struct sim_msg){ DEX_MSG_PAGE_GRANT, a->page, a->access,
								   a->with_data, s->value[0][a->page] });
		}
		break;
	case DSM_ACT_SET_ORIGIN_ACCESS:
		s->state[0][a->page] = a->access;
		break;
	}
}

static void sim_init(struct sim *s, unsigned nodes)
{
	memset(s, 0, sizeof(*s));
	s->nodes = nodes;
	dsm_dir_init(&s->dir, s->pages, SIM_PAGES, nodes, s->pool, 64);
	for (int p = 0; p < SIM_PAGES; p++)
		s->state[0][p] = DSM_WRITE;
}

static void sim_access(struct sim *s, unsigned node, uint32_t page, bool write)
{
	switch (dsm_node_fault(&s->state[node][page], &s->inflight[node][page], write)) {
	case DSM_FAULT_RETRY:
		s->accesses++;
		if (write) {
			s->value[node][page]++;
			s->latest[page] = s->value[node][page];
		} else {
			CHECK(s->value[node][page] == s->latest[page], "node %u page %u read %ld, latest %ld", node,
			      page, s->value[node][page], s->latest[page]);
		}
		break;
	case DSM_FAULT_FOLLOW:
		break;
	case DSM_FAULT_LEAD:
		if (node == 0) {
			int rc = dsm_dir_request(&s->dir, page, 0, write, sim_emit, s);
			CHECK(rc == DSM_OK, "origin request rc %d", rc);
		} else {
			/* Half the time also claim the following pages this node
			 * neither holds well enough nor waits for. */
			int extra = 0;
			while (rand() % 2 && page + 1 + extra < SIM_PAGES &&
			       dsm_node_fault(&s->state[node][page + 1 + extra], &s->inflight[node][page + 1 + extra],
					      write) == DSM_FAULT_LEAD)
				extra++;
			push(&s->to_origin[node], (struct sim_msg){ DEX_MSG_PAGE_REQUEST, page, extra, write, 0 });
		}
		break;
	}
}

static void sim_release(struct sim *s, unsigned node, uint32_t page)
{
	if (node == 0 || dsm_node_release(&s->state[node][page], &s->inflight[node][page]) != DSM_OK)
		return;
	s->releases++;
	push(&s->to_origin[node], (struct sim_msg){ SIM_RELEASE, page, 0, 1, s->value[node][page] });
}

static void sim_deliver_to_origin(struct sim *s, unsigned from)
{
	struct sim_msg m = pop(&s->to_origin[from]);
	int rc;
	if (m.type == SIM_RELEASE) {
		if (dsm_dir_access(&s->dir, m.page, from) == DSM_WRITE)
			s->value[0][m.page] = m.value;
		rc = dsm_dir_release(&s->dir, m.page, from, sim_emit, s);
	} else if (m.type == DEX_MSG_PAGE_REQUEST) {
		rc = dsm_dir_request(&s->dir, m.page, from, m.flag, sim_emit, s);
		for (int i = 1; i <= m.access && rc == DSM_OK; i++) {
			int granted = dsm_dir_prefetch(&s->dir, m.page + (uint32_t)i, from, m.flag, sim_emit, s);
			CHECK(granted >= 0, "prefetch rc %d", granted);
			if (granted > 0) {
				s->prefetch_granted++;
			} else {
				s->prefetch_declined++;
				push(&s->to_node[from], (struct sim_msg){ SIM_DECLINE, m.page + (uint32_t)i, 0, 0, 0 });
			}
		}
	} else {
		if (m.flag)
			s->value[0][m.page] = m.value;
		rc = dsm_dir_ack(&s->dir, m.page, from, m.flag, sim_emit, s);
	}
	CHECK(rc == DSM_OK, "origin rejected %d from node %u page %u rc %d", m.type, from, m.page, rc);
}

static void sim_deliver_to_node(struct sim *s, unsigned node)
{
	struct sim_msg m = pop(&s->to_node[node]);
	int rc;
	if (m.type == DEX_MSG_PAGE_GRANT) {
		if (m.flag)
			s->value[node][m.page] = m.value;
		rc = dsm_node_grant(&s->state[node][m.page], &s->inflight[node][m.page], m.access);
	} else if (m.type == SIM_DECLINE) {
		rc = dsm_node_decline(&s->inflight[node][m.page]);
	} else {
		rc = dsm_node_invalidate(&s->state[node][m.page], &s->inflight[node][m.page], m.access);
		if (rc == DSM_CROSSED) {
			s->crossings++;
			rc = DSM_OK;
		} else {
			push(&s->to_origin[node], (struct sim_msg){ DEX_MSG_INVALIDATE_ACK, m.page, 0, m.flag,
								    s->value[node][m.page] });
		}
	}
	CHECK(rc == DSM_OK, "node %u rejected %d page %u rc %d", node, m.type, m.page, rc);
}

static void sim_check_invariants(struct sim *s)
{
	CHECK(!s->broken, "origin grant rejected");
	for (int p = 0; p < SIM_PAGES; p++) {
		int writers = 0, readers = 0;
		for (unsigned n = 0; n < s->nodes; n++) {
			if (s->state[n][p] == DSM_WRITE)
				writers++;
			else if (s->state[n][p] == DSM_READ)
				readers++;
			if (s->state[n][p] >= DSM_READ)
				CHECK(s->value[n][p] == s->latest[p], "node %u page %d holds %ld, latest %ld", n, p,
				      s->value[n][p], s->latest[p]);
		}
		CHECK(writers <= 1 && !(writers && readers), "page %d: %d writers, %d readers", p, writers, readers);
	}
}

static bool sim_step(struct sim *s, bool allow_access)
{
	int choice = rand() % 12;
	if (allow_access && choice < 4) {
		if (choice == 0)
			sim_release(s, (unsigned)rand() % s->nodes, (uint32_t)rand() % SIM_PAGES);
		else
			sim_access(s, (unsigned)rand() % s->nodes, (uint32_t)rand() % SIM_PAGES, rand() % 2);
		return true;
	}
	/* Deliver from a random non-empty channel; FIFO order within each. */
	int candidates[2 * SIM_NODES], n = 0;
	for (unsigned i = 1; i < s->nodes; i++) {
		if (s->to_origin[i].count)
			candidates[n++] = (int)i;
		if (s->to_node[i].count)
			candidates[n++] = -(int)i;
	}
	if (!n)
		return false;
	int pick = candidates[rand() % n];
	if (pick > 0)
		sim_deliver_to_origin(s, (unsigned)pick);
	else
		sim_deliver_to_node(s, (unsigned)-pick);
	return true;
}

static void test_random_interleavings(void)
{
	long total_short = 0, total_data = 0, total_access = 0, total_prefetched = 0, total_declined = 0;
	long total_releases = 0, total_crossings = 0;
	for (unsigned seed = 1; seed <= 400; seed++) {
		srand(seed);
		struct sim *s = calloc(1, sizeof(*s));
		sim_init(s, 2 + seed % (SIM_NODES - 1));
		for (int step = 0; step < 3000; step++) {
			sim_step(s, true);
			sim_check_invariants(s);
		}
		while (sim_step(s, false))
			sim_check_invariants(s);
		for (unsigned n = 0; n < s->nodes; n++)
			for (int p = 0; p < SIM_PAGES; p++)
				CHECK(!(s->inflight[n][p] & DSM_REQUESTED), "seed %u: node %u page %d fault never answered",
				      seed, n, p);
		total_short += s->short_grants;
		total_data += s->data_grants;
		total_access += s->accesses;
		total_prefetched += s->prefetch_granted;
		total_declined += s->prefetch_declined;
		total_releases += s->releases;
		total_crossings += s->crossings;
		free(s);
		if (failures)
			break;
	}
	/* The run must have exercised both grant kinds, or it proved little. */
	CHECK(total_short > 0 && total_data > 0, "short %ld data %ld", total_short, total_data);
	CHECK(total_prefetched > 0 && total_declined > 0, "prefetched %ld declined %ld", total_prefetched,
	      total_declined);
	CHECK(total_releases > 0 && total_crossings > 0, "releases %ld crossings %ld", total_releases,
	      total_crossings);
	printf("  simulated %ld accesses, %ld data grants, %ld short grants, %ld prefetched pages granted, %ld "
	       "declined, %ld releases (%ld crossed an invalidation)\n",
	       total_access, total_data, total_short, total_prefetched, total_declined, total_releases,
	       total_crossings);
}

/* -------------------------------------------------------------- unit tests */

struct recorder {
	struct dsm_action actions[16];
	int count;
};

static void record(void *ctx, const struct dsm_action *a)
{
	struct recorder *r = ctx;
	if (r->count < 16)
		r->actions[r->count++] = *a;
}

/* A small directory of `npages` pages over 3 nodes, and a recorder for its actions. */
struct small_dir {
	struct dsm_dir dir;
	struct dsm_dir_page pages[3];
	struct dsm_queued_request pool[4];
	struct recorder r;
};

static void small_dir_init(struct small_dir *d, unsigned npages)
{
	memset(d, 0, sizeof(*d)); /* dsm_dir_init wants the pages zeroed */
	dsm_dir_init(&d->dir, d->pages, npages, 3, d->pool, 4);
}

static void test_directory_basics(void)
{
	struct small_dir d;
	small_dir_init(&d, 2);
	struct dsm_dir *dir = &d.dir;
	struct recorder *r = &d.r;

	/* Read by node 1 from the origin's exclusive page: origin downgrades,
	 * node 1 gets data. */
	CHECK(dsm_dir_request(dir, 0, 1, false, record, r) == DSM_OK, "read");
	CHECK(r->count == 2 && r->actions[0].kind == DSM_ACT_SET_ORIGIN_ACCESS && r->actions[0].access == DSM_READ,
	      "origin downgrade first");
	CHECK(r->actions[1].kind == DSM_ACT_GRANT && r->actions[1].node == 1 && r->actions[1].with_data, "data grant");

	/* Upgrade by the reader: origin drops, grant carries no data (DEX's
	 * short response). */
	r->count = 0;
	CHECK(dsm_dir_request(dir, 0, 1, true, record, r) == DSM_OK, "upgrade");
	CHECK(r->count == 2 && r->actions[1].kind == DSM_ACT_GRANT && !r->actions[1].with_data, "short grant");
	CHECK(dsm_dir_access(dir, 0, 1) == DSM_WRITE && dsm_dir_access(dir, 0, 0) == DSM_NONE, "exclusive");

	/* Node 2 reads: page fetched from node 1, busy until the ack; a
	 * request meanwhile queues. */
	r->count = 0;
	CHECK(dsm_dir_request(dir, 0, 2, false, record, r) == DSM_OK, "read remote-owned");
	CHECK(r->count == 1 && r->actions[0].kind == DSM_ACT_INVALIDATE && r->actions[0].node == 1 &&
		      r->actions[0].access == DSM_READ && r->actions[0].with_data,
	      "fetch from writer");
	r->count = 0;
	CHECK(dsm_dir_request(dir, 0, 0, true, record, r) == DSM_OK && r->count == 0, "queued while busy");
	CHECK(dsm_dir_ack(dir, 0, 2, true, record, r) == DSM_E_UNEXPECTED, "ack from wrong node rejected");
	CHECK(dsm_dir_ack(dir, 0, 1, false, record, r) == DSM_E_UNEXPECTED, "ack without data rejected");
	CHECK(dsm_dir_ack(dir, 0, 1, true, record, r) == DSM_OK, "ack");
	/* Completion grants node 2, then the queued origin write invalidates
	 * both readers. */
	int grants = 0, invalidations = 0;
	for (int i = 0; i < r->count; i++) {
		grants += r->actions[i].kind == DSM_ACT_GRANT;
		invalidations += r->actions[i].kind == DSM_ACT_INVALIDATE;
	}
	CHECK(grants == 1 && invalidations == 2, "grants %d invalidations %d", grants, invalidations);

	/* Nonsense requests are refused. */
	CHECK(dsm_dir_request(dir, 5, 1, false, record, r) == DSM_E_RANGE, "page range");
	CHECK(dsm_dir_request(dir, 1, 7, false, record, r) == DSM_E_RANGE, "node range");
	r->count = 0;
	CHECK(dsm_dir_request(dir, 1, 0, true, record, r) == DSM_E_UNEXPECTED, "writer asking to write");
}

static void test_prefetch(void)
{
	struct small_dir d;
	small_dir_init(&d, 3);
	struct dsm_dir *dir = &d.dir;
	struct recorder *r = &d.r;

	/* Read of an origin page: granted with data, the origin keeps a copy. */
	CHECK(dsm_dir_prefetch(dir, 0, 1, false, record, r) == 1, "read prefetch granted");
	CHECK(r->count == 2 && r->actions[0].kind == DSM_ACT_SET_ORIGIN_ACCESS && r->actions[0].access == DSM_READ &&
		      r->actions[1].kind == DSM_ACT_GRANT && r->actions[1].with_data,
	      "origin downgraded, data grant");
	/* Write by the reader: short grant, the origin drops its copy. */
	r->count = 0;
	CHECK(dsm_dir_prefetch(dir, 0, 1, true, record, r) == 1, "write prefetch granted");
	CHECK(r->count == 2 && r->actions[1].kind == DSM_ACT_GRANT && !r->actions[1].with_data &&
		      dsm_dir_access(dir, 0, 1) == DSM_WRITE,
	      "short grant, exclusive");
	/* A page another node writes, or reads while we want to write, or
	 * one that is busy, is declined without any action. */
	r->count = 0;
	CHECK(dsm_dir_prefetch(dir, 0, 2, false, record, r) == 0 && r->count == 0, "remote writer: declined");
	CHECK(dsm_dir_request(dir, 1, 2, false, record, r) == DSM_OK, "node 2 reads page 1");
	r->count = 0;
	CHECK(dsm_dir_prefetch(dir, 1, 1, true, record, r) == 0 && r->count == 0, "remote reader: declined");
	CHECK(dsm_dir_prefetch(dir, 1, 1, false, record, r) == 1, "but a read copy is granted");
	CHECK(dsm_dir_request(dir, 0, 2, false, record, r) == DSM_OK && dir->pages[0].busy, "page 0 busy");
	r->count = 0;
	CHECK(dsm_dir_prefetch(dir, 0, 2, false, record, r) == 0 && r->count == 0, "busy: declined");
	CHECK(dsm_dir_prefetch(dir, 1, 2, false, record, r) == 0 && r->count == 0, "already held: declined");
	CHECK(dsm_dir_prefetch(dir, 2, 0, false, record, r) == DSM_E_RANGE, "the origin does not prefetch");
	CHECK(dsm_dir_prefetch(dir, 3, 1, false, record, r) == DSM_E_RANGE, "page range");

	/* The origin reads ahead only through idle pages one node alone holds. */
	CHECK(dsm_dir_sole_remote_owner(dir, 0) == 0, "busy page: no sole owner");
	CHECK(dsm_dir_sole_remote_owner(dir, 1) == 0, "shared page: no sole owner");
	CHECK(dsm_dir_sole_remote_owner(dir, 2) == 0, "the origin's own page");
	CHECK(dsm_dir_request(dir, 2, 2, true, record, r) == DSM_OK && dsm_dir_sole_remote_owner(dir, 2) == 2,
	      "node 2 writes page 2: its sole owner");
	CHECK(dsm_dir_sole_remote_owner(dir, 3) == 0, "page out of range");

	/* It batches the invalidations of its writes only through idle pages
	 * it shares with one node alone. */
	CHECK(dsm_dir_sole_remote_reader(dir, 0) == 0, "busy page: no sole reader");
	CHECK(dsm_dir_sole_remote_reader(dir, 1) == 0, "two remote readers: no sole reader");
	CHECK(dsm_dir_sole_remote_reader(dir, 2) == 0, "a remote writer is no reader");
	struct small_dir shared;
	small_dir_init(&shared, 2);
	CHECK(dsm_dir_request(&shared.dir, 0, 1, false, record, r) == DSM_OK && dsm_dir_sole_remote_reader(&shared.dir, 0) == 1,
	      "node 1 reads an origin page: its sole reader");
	CHECK(dsm_dir_sole_remote_reader(&shared.dir, 1) == 0, "the origin's own page");
	CHECK(dsm_dir_sole_remote_reader(&shared.dir, 2) == 0, "page out of range");

	uint8_t inflight = 1;
	CHECK(dsm_node_decline(&inflight) == DSM_OK && !inflight, "decline ends the request");
	CHECK(dsm_node_decline(&inflight) == DSM_E_UNEXPECTED, "decline without a request rejected");
}

static void test_release(void)
{
	struct small_dir d;
	small_dir_init(&d, 2);
	struct dsm_dir *dir = &d.dir;
	struct recorder *r = &d.r;

	CHECK(dsm_dir_release(dir, 0, 1, record, r) == DSM_E_UNEXPECTED, "release of a page not held");
	CHECK(dsm_dir_request(dir, 0, 1, true, record, r) == DSM_OK, "node 1 writes page 0");
	r->count = 0;
	CHECK(dsm_dir_release(dir, 0, 1, record, r) == DSM_OK, "idle release");
	CHECK(r->count == 1 && r->actions[0].kind == DSM_ACT_SET_ORIGIN_ACCESS && r->actions[0].access == DSM_WRITE &&
		      dsm_dir_access(dir, 0, 0) == DSM_WRITE && dsm_dir_access(dir, 0, 1) == DSM_NONE,
	      "the origin alone holds it, writable");
	CHECK(dsm_dir_release(dir, 0, 1, record, r) == DSM_E_UNEXPECTED, "released twice");

	/* Node 2 reads while node 1 writes: the release answers the
	 * invalidation, and node 1 keeps no copy. */
	CHECK(dsm_dir_request(dir, 1, 1, true, record, r) == DSM_OK, "node 1 writes page 1");
	r->count = 0;
	CHECK(dsm_dir_request(dir, 1, 2, false, record, r) == DSM_OK && r->count == 1 &&
		      r->actions[0].kind == DSM_ACT_INVALIDATE,
	      "fetch from node 1");
	CHECK(dsm_dir_release(dir, 1, 2, record, r) == DSM_E_UNEXPECTED, "release by a node not holding it");
	r->count = 0;
	CHECK(dsm_dir_release(dir, 1, 1, record, r) == DSM_OK, "release crossing the invalidation");
	CHECK(dsm_dir_access(dir, 1, 2) == DSM_READ && dsm_dir_access(dir, 1, 1) == DSM_NONE &&
		      dsm_dir_access(dir, 1, 0) == DSM_READ && !dir->pages[1].busy,
	      "node 2 and the origin read, node 1 holds nothing");
	CHECK(dsm_dir_ack(dir, 1, 1, true, record, r) == DSM_E_UNEXPECTED, "no acknowledgement expected any more");
	/* A reader's release drops its copy; the origin keeps serving it. */
	r->count = 0;
	CHECK(dsm_dir_release(dir, 1, 2, record, r) == DSM_OK && r->count == 0 && dsm_dir_access(dir, 1, 2) == DSM_NONE &&
		      dsm_dir_access(dir, 1, 0) == DSM_READ,
	      "read-only copy released");
	CHECK(dsm_dir_release(dir, 1, 0, record, r) == DSM_E_RANGE, "the origin does not release");
}

static void test_node_faults(void)
{
	uint8_t state = DSM_NONE, inflight = 0;
	CHECK(dsm_node_fault(&state, &inflight, false) == DSM_FAULT_LEAD, "first fault leads");
	CHECK(dsm_node_fault(&state, &inflight, true) == DSM_FAULT_FOLLOW, "second follows");
	CHECK(dsm_node_grant(&state, &inflight, DSM_READ) == DSM_OK && state == DSM_READ && !inflight, "grant");
	CHECK(dsm_node_grant(&state, &inflight, DSM_READ) == DSM_E_UNEXPECTED, "unrequested grant rejected");
	CHECK(dsm_node_fault(&state, &inflight, false) == DSM_FAULT_RETRY, "read satisfied");
	CHECK(dsm_node_invalidate(&state, &inflight, DSM_READ) == DSM_E_UNEXPECTED, "non-lowering invalidate rejected");
	CHECK(dsm_node_invalidate(&state, &inflight, DSM_NONE) == DSM_OK && state == DSM_NONE, "invalidate");
	CHECK(dsm_node_invalidate(&state, &inflight, DSM_NONE) == DSM_E_UNEXPECTED, "invalidate of nothing held");

	/* Release: a page held, with no request in flight; an invalidation
	 * that crossed it is dropped, once. */
	CHECK(dsm_node_release(&state, &inflight) == DSM_E_UNEXPECTED, "release of nothing held");
	CHECK(dsm_node_fault(&state, &inflight, true) == DSM_FAULT_LEAD, "write fault");
	CHECK(dsm_node_release(&state, &inflight) == DSM_E_UNEXPECTED, "release with a request in flight");
	CHECK(dsm_node_grant(&state, &inflight, DSM_WRITE) == DSM_OK, "write grant");
	CHECK(dsm_node_release(&state, &inflight) == DSM_OK && state == DSM_NONE, "release");
	CHECK(dsm_node_invalidate(&state, &inflight, DSM_NONE) == DSM_CROSSED, "crossed invalidation dropped");
	CHECK(dsm_node_invalidate(&state, &inflight, DSM_NONE) == DSM_E_UNEXPECTED, "only once");
}

static void test_codec(void)
{
	struct dex_region_bounds region = { 0x600000000000, 0x600000100000 };
	struct dex_validation_limits lim = { .nodes = 3, .max_threads = 64, .max_workers = 64, .regions = &region,
					     .nregions = 1 };
	struct dex_msg_header h;
	struct dex_msg_page_request req = { .address = 0x600000001000, .write = 1 };

	dex_msg_fill_header(&h, DEX_MSG_PAGE_REQUEST, 1, sizeof(req), 1);
	CHECK(dex_msg_check(&h, &req, &lim) == NULL, "valid request");
	req.address += 8;
	CHECK(dex_msg_check(&h, &req, &lim) != NULL, "unaligned address");
	req.address = 0x500000000000;
	CHECK(dex_msg_check(&h, &req, &lim) != NULL, "address outside regions");
	req.address = 0x600000001000;
	req.write = 2;
	CHECK(dex_msg_check(&h, &req, &lim) != NULL, "bad flag");

	req.write = 0;
	req.extra = DEX_PREFETCH_MAX;
	CHECK(dex_msg_check(&h, &req, &lim) == NULL, "request with extra pages");
	req.extra = DEX_PREFETCH_MAX + 1;
	CHECK(dex_msg_check(&h, &req, &lim) != NULL, "too many extra pages");
	req.address = 0x6000000ff000;
	req.extra = 1;
	CHECK(dex_msg_check(&h, &req, &lim) != NULL, "extra pages past the region");
	req.extra = 0;
	CHECK(dex_msg_check(&h, &req, &lim) == NULL, "last page alone");

	struct {
		struct dex_msg_page_prefetch p;
		char data[2 * DEX_PAGE_SIZE];
	} prefetch = { { .address = 0x600000003000, .count = 3, .access = DSM_READ, .granted = 5, .with_data = 5 },
		       { 0 } };
	dex_msg_fill_header(&h, DEX_MSG_PAGE_PREFETCH, 0, sizeof(prefetch), 2);
	CHECK(dex_msg_check(&h, &prefetch, &lim) == NULL, "prefetch answer, two pages with data");
	prefetch.p.with_data = 4;
	CHECK(dex_msg_check(&h, &prefetch, &lim) != NULL, "prefetch length mismatch");
	dex_msg_fill_header(&h, DEX_MSG_PAGE_PREFETCH, 0, sizeof(prefetch.p) + DEX_PAGE_SIZE, 2);
	CHECK(dex_msg_check(&h, &prefetch, &lim) == NULL, "one page with data, one short");
	prefetch.p.with_data = 2;
	CHECK(dex_msg_check(&h, &prefetch, &lim) != NULL, "data for a declined page");
	prefetch.p.with_data = 4;
	prefetch.p.granted = 13;
	CHECK(dex_msg_check(&h, &prefetch, &lim) != NULL, "granted bit past count");
	prefetch.p.granted = 5;
	prefetch.p.count = DEX_PREFETCH_MAX + 1;
	CHECK(dex_msg_check(&h, &prefetch, &lim) != NULL, "count too large");
	prefetch.p.count = 3;
	prefetch.p.access = DSM_NONE;
	CHECK(dex_msg_check(&h, &prefetch, &lim) != NULL, "prefetch granting no access");
	prefetch.p.access = DSM_READ;
	prefetch.p.address = 0x6000000ff000;
	CHECK(dex_msg_check(&h, &prefetch, &lim) != NULL, "prefetch run past the region");

	struct dex_msg_invalidate inval = { .address = 0x600000004000, .access = DSM_READ, .want_data = 1,
					    .count = DEX_PREFETCH_MAX };
	dex_msg_fill_header(&h, DEX_MSG_INVALIDATE, 0, sizeof(inval), 3);
	CHECK(dex_msg_check(&h, &inval, &lim) == NULL, "invalidation of a run");
	inval.count = 0;
	CHECK(dex_msg_check(&h, &inval, &lim) != NULL, "invalidation of no page");
	inval.count = DEX_PREFETCH_MAX + 1;
	CHECK(dex_msg_check(&h, &inval, &lim) != NULL, "invalidation run too long");
	inval.count = 2;
	inval.address = 0x6000000ff000;
	CHECK(dex_msg_check(&h, &inval, &lim) != NULL, "invalidation run past the region");
	static struct {
		struct dex_msg_invalidate_ack a;
		char data[3 * DEX_PAGE_SIZE];
	} ack = { { .address = 0x600000004000, .with_data = 1, .count = 3 }, { 0 } };
	dex_msg_fill_header(&h, DEX_MSG_INVALIDATE_ACK, 1, sizeof(ack), 3);
	CHECK(dex_msg_check(&h, &ack, &lim) == NULL, "acknowledgement of a run with data");
	ack.a.count = 2;
	CHECK(dex_msg_check(&h, &ack, &lim) != NULL, "acknowledgement shorter than its data");
	ack.a.with_data = 0;
	dex_msg_fill_header(&h, DEX_MSG_INVALIDATE_ACK, 1, sizeof(ack.a), 3);
	CHECK(dex_msg_check(&h, &ack, &lim) == NULL, "acknowledgement without data");
	ack.a.count = 0;
	CHECK(dex_msg_check(&h, &ack, &lim) != NULL, "acknowledgement of no page");

	h.magic = 0x1234;
	CHECK(dex_msg_check_header(&h, &lim) != NULL, "bad magic");
	dex_msg_fill_header(&h, 99, 1, 0, 1);
	CHECK(dex_msg_check_header(&h, &lim) != NULL, "unknown type");
	dex_msg_fill_header(&h, DEX_MSG_PAGE_REQUEST, 5, sizeof(req), 1);
	CHECK(dex_msg_check_header(&h, &lim) != NULL, "sender out of range");
	dex_msg_fill_header(&h, DEX_MSG_PAGE_REQUEST, 1, 4, 1);
	CHECK(dex_msg_check_header(&h, &lim) != NULL, "short payload");
	dex_msg_fill_header(&h, DEX_MSG_SYSCALL, 1, DEX_MAX_PAYLOAD + 1, 1);
	CHECK(dex_msg_check_header(&h, &lim) != NULL, "oversized payload");

	struct {
		struct dex_msg_page_grant g;
		char data[DEX_PAGE_SIZE];
	} grant = { { .address = 0x600000002000, .access = DSM_READ, .with_data = 1 }, { 0 } };
	dex_msg_fill_header(&h, DEX_MSG_PAGE_GRANT, 0, sizeof(grant), 2);
	CHECK(dex_msg_check(&h, &grant, &lim) == NULL, "grant with data");
	grant.g.with_data = 0;
	CHECK(dex_msg_check(&h, &grant, &lim) != NULL, "grant length mismatch");

	struct dex_msg_syscall sc = { .thread = 1, .worker = 2, .number = 1, .data_length = 10 };
	dex_msg_fill_header(&h, DEX_MSG_SYSCALL, 2, sizeof(sc) + 9, 3);
	CHECK(dex_msg_check(&h, &sc, &lim) != NULL, "syscall data length mismatch");
	sc.thread = 1000;
	dex_msg_fill_header(&h, DEX_MSG_SYSCALL, 2, sizeof(sc) + 10, 3);
	CHECK(dex_msg_check(&h, &sc, &lim) != NULL, "thread id out of range");

	struct dex_msg_hello hello = { .version = DEX_PROTOCOL_VERSION, .node = 2, .nodes = 3 };
	dex_msg_fill_header(&h, DEX_MSG_HELLO, 2, sizeof(hello), 0);
	CHECK(dex_msg_check(&h, &hello, &lim) == NULL, "hello");
	hello.nodes = 4;
	CHECK(dex_msg_check(&h, &hello, &lim) != NULL, "hello with wrong cluster size");

	dex_msg_fill_header(&h, DEX_MSG_PING, 0, 0, 5);
	CHECK(dex_msg_check(&h, &region, &lim) == NULL, "ping");
	dex_msg_fill_header(&h, DEX_MSG_PONG, 1, 8, 5);
	CHECK(dex_msg_check(&h, &region, &lim) != NULL, "pong with a payload");

	struct dex_msg_migrate mig = { .thread = 3, .target = 1, .context = { .rsp = 0x7000, .rip = 0x401000 } };
	dex_msg_fill_header(&h, DEX_MSG_MIGRATE, 0, sizeof(mig), 4);
	CHECK(dex_msg_check(&h, &mig, &lim) == NULL, "migrate");
	mig.target = 3;
	CHECK(dex_msg_check(&h, &mig, &lim) != NULL, "migrate target out of range");
	static struct {
		struct dex_msg_migrate m;
		char pages[2 * DEX_PAGE_SIZE];
	} carrying = { { .thread = 3, .target = 0, .context = { .rsp = 0x7000, .rip = 0x401000 },
			 .carried_address = 0x600000005000, .carried_pages = 2 },
		       { 0 } };
	dex_msg_fill_header(&h, DEX_MSG_MIGRATE, 1, sizeof(carrying), 4);
	CHECK(dex_msg_check(&h, &carrying, &lim) == NULL, "migrate home carrying two stack pages");
	carrying.m.target = 2;
	CHECK(dex_msg_check(&h, &carrying, &lim) != NULL, "pages carried to a node other than the origin");
	carrying.m.target = 0;
	carrying.m.carried_pages = 1;
	CHECK(dex_msg_check(&h, &carrying, &lim) != NULL, "migrate length does not match its pages");
	carrying.m.carried_pages = 3;
	dex_msg_fill_header(&h, DEX_MSG_MIGRATE, 1, sizeof(carrying.m) + 3 * DEX_PAGE_SIZE, 4);
	CHECK(dex_msg_check(&h, &carrying, &lim) != NULL, "too many carried pages");
	carrying.m.carried_pages = 1;
	carrying.m.carried_address = 0x700000000000;
	dex_msg_fill_header(&h, DEX_MSG_MIGRATE, 1, sizeof(carrying.m) + DEX_PAGE_SIZE, 4);
	CHECK(dex_msg_check(&h, &carrying, &lim) != NULL, "carried page outside the shared regions");

	struct dex_msg_vma_revoke revoke = { .start = 0x600000010000, .length = 3 * DEX_PAGE_SIZE, .rights = 4 | DSM_READ,
					     .generation = 7 };
	dex_msg_fill_header(&h, DEX_MSG_VMA_REVOKE, 0, sizeof(revoke), 6);
	CHECK(dex_msg_check(&h, &revoke, &lim) == NULL, "vma revoke");
	revoke.length = 100;
	CHECK(dex_msg_check(&h, &revoke, &lim) != NULL, "vma revoke of a partial page");
	revoke.length = 0x100000;
	CHECK(dex_msg_check(&h, &revoke, &lim) != NULL, "vma revoke past the shared region");
	revoke.length = DEX_PAGE_SIZE;
	revoke.rights = 9;
	CHECK(dex_msg_check(&h, &revoke, &lim) != NULL, "vma revoke with unknown rights");
	struct dex_msg_vma_revoke_ack revoke_ack = { .generation = 7 };
	dex_msg_fill_header(&h, DEX_MSG_VMA_REVOKE_ACK, 2, sizeof(revoke_ack), 6);
	CHECK(dex_msg_check(&h, &revoke_ack, &lim) == NULL, "vma revoke ack");
}

int main(void)
{
	test_directory_basics();
	test_node_faults();
	test_prefetch();
	test_release();
	test_codec();
	test_random_interleavings();
	printf("test_protocol: %d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
