#!/usr/bin/env bash
# libdex's exported symbols (nm -D) against the public API: every function
# declared in include/dex.h and include/migrate.h is exported; besides them
# only dex_run_main (for dex_start.o), the libc functions libdex replaces,
# unversioned so that every library binds to them, and what the modules
# libdex loads (libdex-ucx.so, libdex-pmix.so) use; the soname is
# libdex.so.0. Prints what differs.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
lib=$BUILD/libdex.so.0
status=0
differs() { echo "$1:"; sed 's/^/    /' <<<"$2"; status=1; }

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libdex.so.0 ] || differs "soname is not libdex.so.0" "$soname"
[ "$(readlink "$BUILD/libdex.so")" = libdex.so.0 ] || differs "libdex.so is not a link to libdex.so.0" "$(ls -l "$BUILD/libdex.so")"

exported=$(nm -D --defined-only "$lib" | awk '{ print $3 }' | sort)
# the names of the functions the public headers declare
api=$(grep -hoE '^[a-z][a-z_ ]*[ *]([a-z_]+)\(' include/dex.h include/migrate.h | grep -oE '[a-z_]+\($' | tr -d '(' | sort -u)
replaced='malloc calloc realloc free aligned_alloc memalign posix_memalign valloc pvalloc malloc_usable_size
brk sbrk exit pthread_create pthread_exit pthread_join pthread_barrier_init pthread_barrier_wait
pthread_barrier_destroy dex_run_main'
modules=$(for m in "$BUILD/libdex-ucx.so" "$BUILD/libdex-pmix.so"; do
	[ -f "$m" ] && nm -D --undefined-only "$m" | awk '{ print $2 }' | grep '^dex_'
done | sort -u)
allowed=$(printf '%s\n' $api $replaced $modules | sort -u)

missing=$(comm -23 <(echo "$api") <(echo "$exported"))
[ -z "$missing" ] || differs "declared in include/ but not exported" "$missing"
extra=$(comm -13 <(echo "$allowed") <(echo "$exported"))
[ -z "$extra" ] || differs "exported but neither public API, a replaced libc function nor used by a module" "$extra"
versioned=$(grep '@' <<<"$exported")
[ -z "$versioned" ] || differs "versioned (a library asking for glibc's version would miss them)" "$versioned"
[ $status = 0 ] && echo "exports: $(echo "$exported" | wc -l) symbols, as listed"
exit $status
