/* Fault profiler: with DEX_TRACE=PREFIX every process records each
 * protocol fault it takes (read or write) and each invalidation it serves,
 * and writes them to PREFIX.<node> when the program ends. tools/dex-prof
 * turns the files into a report by source line, page and object.
 *
 * Records go into a preallocated array (lazily backed by the kernel) with
 * an atomic cursor, because they are taken inside the SIGSEGV handler. */
#include "internal.h"

#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

bool dex_tracing;

struct trace_record {
	uint64_t start_ns, duration_ns, ip, addr, tag;
	uint32_t thread;
	char kind;
};

static struct trace_record *records;
static uint64_t capacity, cursor;
static char prefix[512];
static int flushed;

void dex_trace_init(void)
{
	const char *path = getenv("DEX_TRACE");
	if (!path || !*path)
		return;
	snprintf(prefix, sizeof(prefix), "%s", path);
	capacity = dex_env_number("DEX_TRACE_MAX", 1u << 22, 1u << 28);
	records = mmap(NULL, capacity * sizeof(*records), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (records == MAP_FAILED)
		dex_fatal("cannot reserve the trace buffer (DEX_TRACE_MAX=%llu)", (unsigned long long)capacity);
	dex_tracing = true;
}

void dex_trace_record(enum dex_trace_kind kind, uint32_t thread, uint64_t tag, uint64_t ip, uint64_t addr,
		      uint64_t start_ns, uint64_t end_ns)
{
	uint64_t i = __atomic_fetch_add(&cursor, 1, __ATOMIC_RELAXED);
	if (i >= capacity)
		return; /* counted in `cursor`; the file header reports the loss */
	records[i] = (struct trace_record){ start_ns, end_ns - start_ns, ip, addr, tag, thread, (char)kind };
}

static int executable_base(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	*(uintptr_t *)arg = info->dlpi_addr;
	return 1;
}

/* One "# object" line per loaded object with code, so the report can name
 * source lines in shared libraries too. */
static int describe_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	FILE *f = arg;
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
			uintptr_t start = info->dlpi_addr + ph->p_vaddr;
			lo = start < lo ? start : lo;
			hi = start + ph->p_memsz > hi ? start + ph->p_memsz : hi;
		}
	}
	if (hi && info->dlpi_name && info->dlpi_name[0] == '/')
		fprintf(f, "# object %#lx %#lx %#lx %s\n", (unsigned long)info->dlpi_addr, (unsigned long)lo,
			(unsigned long)hi, info->dlpi_name);
	return 0;
}

void dex_trace_flush(void)
{
	if (!dex_tracing || __atomic_exchange_n(&flushed, 1, __ATOMIC_ACQ_REL))
		return;
	char path[600], exe[512] = "";
	snprintf(path, sizeof(path), "%s.%u", prefix, dex_rt.node);
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = 0;
	uintptr_t base = 0;
	dl_iterate_phdr(executable_base, &base);
	FILE *f = fopen(path, "w");
	if (!f) {
		dex_warn("cannot write trace %s", path);
		return;
	}
	uint64_t taken = __atomic_load_n(&cursor, __ATOMIC_ACQUIRE);
	uint64_t kept = taken < capacity ? taken : capacity;
	fprintf(f, "# dex-trace 1 node %u nodes %u exe %s exe_base %#lx records %llu dropped %llu\n", dex_rt.node,
		dex_rt.nodes, exe, (unsigned long)base, (unsigned long long)kept,
		(unsigned long long)(taken - kept));
	for (unsigned i = 0; i < dex_rt.nregions; i++)
		fprintf(f, "# region %#lx %#lx\n", (unsigned long)dex_rt.regions[i].start,
			(unsigned long)dex_rt.regions[i].end);
	dl_iterate_phdr(describe_object, f);
	fprintf(f, "# start_ns node thread kind ip addr duration_ns tag\n");
	for (uint64_t i = 0; i < kept; i++) {
		const struct trace_record *r = &records[i];
		fprintf(f, "%llu %u %d %c %#llx %#llx %llu %llu\n", (unsigned long long)r->start_ns, dex_rt.node,
			r->thread == UINT32_MAX ? -1 : (int)r->thread, r->kind, (unsigned long long)r->ip,
			(unsigned long long)r->addr, (unsigned long long)r->duration_ns, (unsigned long long)r->tag);
	}
	fclose(f);
}
