/*
 * selfish: the selfish-detour noise benchmark (after Beckman et al.), written for clowder.
 * Spins reading the clock for DURATION seconds; every gap between two consecutive readings
 * longer than THRESHOLD (default: 5x the smallest gap seen) is a detour: time the OS took away.
 *
 *   selfish [DURATION_S] [THRESHOLD_NS] [list]
 *
 * Prints the number of detours, the time lost and its fraction, and the largest detour; with
 * `list`, every detour after that as "detour AT_US LENGTH_US" (the first 100,000).
 */
#include <string.h>

#include "../args.h"
#include "detour.h"

int main(int argc, char **argv) {
    int list = argc > 3 && !strcmp(argv[3], "list");
    if ((argc > 3 && !list) || argc > 4) {
        fprintf(stderr, "usage: selfish [DURATION_S 0.001..3600] [THRESHOLD_NS (0: 5x the loop)] [list]\n");
        return 2;
    }
    double duration = argc > 1 ? arg_number("selfish", "DURATION_S", argv[1], 0.001, 3600) : 5.0;
    uint64_t threshold = argc > 2 ? (uint64_t)arg_integer("selfish", "THRESHOLD_NS", argv[2], 0, 1000000000L) : 0;
    static struct detours detours;
    detour_run(&detours, duration, threshold);
    detour_print("selfish", &detours, list);
    return 0;
}
