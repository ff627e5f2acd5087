/* libdex shared regions: the executable's writable data and the heap,
 * each backed by a memfd mapped twice (the application's view and the
 * runtime's alias). */
#include "internal.h"

#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct exe_writable {
	uintptr_t start, end, relro_end;
};

static int find_exe_writable(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct exe_writable *w = arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) {
			w->start = lo;
			w->end = lo + ph->p_memsz;
		} else if (ph->p_type == PT_GNU_RELRO) {
			w->relro_end = lo + ph->p_memsz;
		}
	}
	return 1; /* the first object is the executable */
}

static uintptr_t page_up(uintptr_t x)
{
	return (x + DEX_PAGE_SIZE - 1) & ~(uintptr_t)(DEX_PAGE_SIZE - 1);
}

/* Backs [start, end) with a memfd mapped twice: the application's view at
 * the same address (protected per page by the protocol) and a private alias
 * the runtime reads and writes page bytes through. */
static void add_region(uintptr_t start, uintptr_t end, bool replace_existing, const char *name)
{
	size_t len = end - start;
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0)
		dex_fatal("memfd for %s failed", name);
	if (replace_existing && pwrite(fd, (void *)start, len, 0) != (ssize_t)len)
		dex_fatal("copying %s into its memfd failed", name);
	int flags = MAP_SHARED | (replace_existing ? MAP_FIXED : MAP_FIXED_NOREPLACE);
	void *view = mmap((void *)start, len, PROT_READ | PROT_WRITE, flags, fd, 0);
	if (view != (void *)start)
		dex_fatal("cannot map %s at %#lx (address in use?)", name, (unsigned long)start);
	void *alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (alias == MAP_FAILED)
		dex_fatal("cannot map alias of %s", name);
	struct dsm_region *r = &dex_rt.regions[dex_rt.nregions];
	r->fd = fd; /* kept: the origin allocates heap memory ahead (alloc.c) */
	r->start = start;
	r->end = end;
	r->alias = alias;
	r->first_page = dex_rt.total_pages;
	dex_rt.bounds[dex_rt.nregions] = (struct dex_region_bounds){ start, end };
	dex_rt.total_pages += (uint32_t)(len / DEX_PAGE_SIZE);
	dex_rt.nregions++;
}

static size_t heap_bytes(void)
{
	size_t v = dex_env_number("DEX_HEAP_MB", 1024, 1u << 24);
	return (v ? v : 1024) << 20;
}

void dex_setup_regions(void)
{
	struct exe_writable w = { 0 };
	dl_iterate_phdr(find_exe_writable, &w);
	uintptr_t start = page_up(w.relro_end > w.start ? w.relro_end : w.start);
	uintptr_t end = page_up(w.end);
	if (end > start)
		add_region(start, end, true, "dex-globals");
	add_region(DEX_HEAP_BASE, DEX_HEAP_BASE + heap_bytes(), false, "dex-heap");

	dex_dsm_tables_init();
}

int dex_find_own_text(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	uintptr_t self = (uintptr_t)arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && self >= lo && self < lo + ph->p_memsz) {
			dex_rt.text_start = lo;
			dex_rt.text_end = lo + ph->p_memsz;
			return 1;
		}
	}
	return 0;
}
