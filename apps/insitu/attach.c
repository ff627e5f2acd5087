/*
 * insitu-attach: a host process attaching another enclave's named XEMEM segment over and over,
 * for the attach-noise run (XEMEM's Fig. 7: one attach a second) and the scaling run (Fig. 6:
 * back to back, several pairs at once).
 *
 *   insitu-attach NAME KIB COUNT PERIOD_MS
 *
 * Waits up to 30 s for NAME, then COUNT times: xpmem_get, xpmem_attach of the first KIB KiB,
 * a read of its first word, xpmem_detach, xpmem_release; one every PERIOD_MS (0: back to back).
 * Prints "attach AT_S US" per attach (get + attach, from the first attach's start) and a
 * summary "insitu-attach: KIB KiB COUNT attaches, median US us, GB/S GB/s" (bytes attached per
 * second of get + attach time); exit 0 if every attach succeeded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#include "../args.h"
#include "insitu.h"

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: insitu-attach NAME KIB COUNT PERIOD_MS\n");
        return 2;
    }
    const char *name = argv[1];
    size_t bytes = (size_t)arg_integer("insitu-attach", "KIB", argv[2], 4, 64L << 20) << 10;
    long count = arg_integer("insitu-attach", "COUNT", argv[3], 1, 1000000);
    long period_ms = arg_integer("insitu-attach", "PERIOD_MS", argv[4], 0, 3600000);
    if (bytes % INSITU_PAGE) {
        fprintf(stderr, "insitu-attach: KIB must be a multiple of 4\n");
        return 2;
    }
    double deadline = insitu_now_seconds() + 30;
    xpmem_segid_t segid;
    while ((segid = xemem_lookup_segid(name)) <= 0) {
        if (insitu_now_seconds() > deadline) {
            fprintf(stderr, "insitu-attach: no XEMEM segment named \"%s\": %s\n", name, strerror(errno));
            return 1;
        }
        usleep(10000);
    }
    double *took = calloc(count, sizeof *took), start = insitu_now_seconds(), attaching = 0;
    if (!took) {
        fprintf(stderr, "insitu-attach: out of memory\n");
        return 1;
    }
    for (long i = 0; i < count; i++) {
        if (period_ms) {
            double next = start + i * period_ms / 1e3, now = insitu_now_seconds();
            if (next > now)
                usleep((useconds_t)((next - now) * 1e6));
        }
        double t = insitu_now_seconds();
        xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
        if (apid <= 0) {
            fprintf(stderr, "insitu-attach: xpmem_get: %s\n", strerror(errno));
            return 1;
        }
        struct xpmem_addr address = {.apid = apid, .offset = 0};
        volatile const uint64_t *memory = xpmem_attach(address, bytes, NULL);
        if (memory == (void *)-1) {
            fprintf(stderr, "insitu-attach: xpmem_attach of %zu bytes: %s\n", bytes, strerror(errno));
            return 1;
        }
        took[i] = insitu_now_seconds() - t;
        attaching += took[i];
        (void)memory[0];
        if (xpmem_detach((void *)memory) || xpmem_release(apid)) {
            fprintf(stderr, "insitu-attach: detach/release: %s\n", strerror(errno));
            return 1;
        }
        printf("attach %.6f %.1f\n", t - start, took[i] * 1e6);
    }
    qsort(took, count, sizeof *took, by_value);
    printf("insitu-attach: %zu KiB %ld attaches, median %.1f us, %.3f GB/s\n", bytes >> 10, count, took[count / 2] * 1e6,
           bytes * (double)count / attaching / 1e9);
    return 0;
}
