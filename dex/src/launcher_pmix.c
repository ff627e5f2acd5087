/* The PMIx client, built as libdex-pmix.so and loaded by libdex (dlopen)
 * only when a PMIx launcher started the process (mpirun, prterun, srun
 * --mpi=pmix: PMIX_RANK and PMIX_NAMESPACE in the environment). The
 * launcher's PMIx server gives each process its rank, which is its node
 * number (rank 0 is the origin), and the job's size; rank 0's listening
 * address, and each rank's transport address if the transport has one
 * (UCX's worker), reach the others through PMIx_Put, Commit, Fence and
 * Get, in place of dexrun's DEX_BOOT and the transport's own exchange. Every connection to the origin still proves
 * the run's secret (auth.h), which the launcher passes to all ranks in the
 * environment: PMIx carries only an address, so whoever can read it still
 * cannot join.
 *
 * PMIx is finalised before the application runs, so that its threads and
 * sockets do not outlive start-up; libdex calls in here with
 * dex_tls_runtime_thread set, so threads PMIx creates are runtime threads. */
#include "internal.h"

#include <pmix.h>
#include <stdio.h>

#define ORIGIN_KEY "dex.origin"
#define ADDRESS_KEY "dex.transport"

static pmix_proc_t self;
static uint32_t size;

const char *dex_pmix_start(unsigned *rank, unsigned *job_size)
{
	pmix_status_t rc = PMIx_Init(&self, NULL, 0);
	if (rc != PMIX_SUCCESS)
		return PMIx_Error_string(rc);
	pmix_proc_t job;
	PMIX_LOAD_PROCID(&job, self.nspace, PMIX_RANK_WILDCARD);
	pmix_value_t *value = NULL;
	rc = PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &value);
	if (rc != PMIX_SUCCESS || value->type != PMIX_UINT32) {
		if (rc == PMIX_SUCCESS)
			PMIX_VALUE_RELEASE(value);
		PMIx_Finalize(NULL, 0);
		return "the launcher gave no job size";
	}
	size = *job_size = value->data.uint32;
	*rank = self.rank;
	PMIX_VALUE_RELEASE(value);
	if (size == 1) /* a run of one: nothing to exchange */
		PMIx_Finalize(NULL, 0);
	return NULL;
}

typedef int (*dex_pmix_got_fn)(unsigned rank, const void *address, size_t length);

static pmix_status_t put(const char *key, pmix_value_t value)
{
	return PMIx_Put(PMIX_GLOBAL, key, &value);
}

/* The transport addresses this rank needs: the origin needs every node's,
 * a node the origin's. */
static const char *get_addresses(dex_pmix_got_fn got)
{
	for (uint32_t rank = 0; rank < size; rank++) {
		if (rank == self.rank || (self.rank != 0 && rank != 0))
			continue;
		pmix_proc_t peer;
		PMIX_LOAD_PROCID(&peer, self.nspace, rank);
		pmix_value_t *value = NULL;
		pmix_status_t rc = PMIx_Get(&peer, ADDRESS_KEY, NULL, 0, &value);
		if (rc != PMIX_SUCCESS)
			return PMIx_Error_string(rc);
		int bad = value->type != PMIX_BYTE_OBJECT || got(rank, value->data.bo.bytes, value->data.bo.size) != 0;
		PMIX_VALUE_RELEASE(value);
		if (bad)
			return "a rank's transport address is unusable";
	}
	return NULL;
}

/* Rank 0 gives `mine` (NULL elsewhere); every rank gets rank 0's into
 * `origin`. With `address` (every rank's transport address, if the
 * transport takes one), `got` receives the addresses this rank needs.
 * Collective: returns once all ranks have called it; PMIx is finalised. */
const char *dex_pmix_share_origin(const char *mine, char *origin, size_t origin_len, const void *address,
				  size_t address_length, dex_pmix_got_fn got)
{
	const char *why = NULL;
	pmix_status_t rc = PMIX_SUCCESS;
	if (mine)
		rc = put(ORIGIN_KEY, (pmix_value_t){ .type = PMIX_STRING, .data.string = (char *)mine });
	if (rc == PMIX_SUCCESS && address)
		rc = put(ADDRESS_KEY, (pmix_value_t){ .type = PMIX_BYTE_OBJECT,
						       .data.bo = { .bytes = (char *)address, .size = address_length } });
	if (rc == PMIX_SUCCESS)
		rc = PMIx_Commit();
	if (rc == PMIX_SUCCESS) {
		pmix_proc_t job;
		PMIX_LOAD_PROCID(&job, self.nspace, PMIX_RANK_WILDCARD);
		pmix_info_t collect;
		bool yes = true;
		PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
		rc = PMIx_Fence(&job, 1, &collect, 1);
		PMIX_INFO_DESTRUCT(&collect);
	}
	pmix_value_t *value = NULL;
	if (rc == PMIX_SUCCESS) {
		pmix_proc_t zero;
		PMIX_LOAD_PROCID(&zero, self.nspace, 0);
		rc = PMIx_Get(&zero, ORIGIN_KEY, NULL, 0, &value);
	}
	if (rc != PMIX_SUCCESS)
		why = PMIx_Error_string(rc);
	else if (value->type != PMIX_STRING || snprintf(origin, origin_len, "%s", value->data.string) >= (int)origin_len)
		why = "rank 0's address is not a short string";
	if (value)
		PMIX_VALUE_RELEASE(value);
	if (!why && address)
		why = get_addresses(got);
	PMIx_Finalize(NULL, 0);
	return why;
}
