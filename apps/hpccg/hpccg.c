/*
 * hpccg: conjugate-gradient solve of a 27-point-stencil problem on an nx*ny*nz grid, in the
 * manner of Mantevo's HPCCG (the mini-app the Hobbes papers run in their enclaves). Written for
 * clowder: the solver in cg.c (shared with apps/insitu), no dependencies, static-link friendly, optional OpenMP.
 *
 *   hpccg NX NY NZ [MAX_ITERS] [TOLERANCE]
 *
 * The matrix has 27 on the diagonal and -1 for each of the up to 26 neighbours, so it is
 * symmetric positive definite; the right-hand side is chosen so the exact solution is all ones,
 * which makes the final error checkable. Prints progress every 10 iterations, then the result.
 * Exit status 0 if the solution error is below 1e-6 (converged), 1 otherwise, 2 on bad input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../args.h"
#include "cg.h"

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: hpccg NX NY NZ [MAX_ITERS] [TOLERANCE]\n");
        return 2;
    }
    struct cg_problem p = {0};
    p.nx = arg_integer("hpccg", "NX", argv[1], 1, 1024);
    p.ny = arg_integer("hpccg", "NY", argv[2], 1, 1024);
    p.nz = arg_integer("hpccg", "NZ", argv[3], 1, 1024);
    long max_iters = argc > 4 ? arg_integer("hpccg", "MAX_ITERS", argv[4], 1, 1024) : 150;
    double tolerance = argc > 5 ? arg_number("hpccg", "TOLERANCE", argv[5], 0, 1) : 1e-12;
    long n = p.nx * p.ny * p.nz;

    double *b = cg_checked_malloc(n * sizeof(double));
    struct cg_state cg = {
        .problem = &p,
        .b = b,
        .x = cg_checked_malloc(n * sizeof(double)),
        .r = cg_checked_malloc(n * sizeof(double)),
        .dir = cg_checked_malloc(n * sizeof(double)),
        .ap = cg_checked_malloc(n * sizeof(double)),
    };
    double t0 = now_seconds();
    cg_build_problem(&p, b);
    double t_setup = now_seconds() - t0;
    printf("hpccg: %ld x %ld x %ld grid, %ld rows, %ld nonzeros\n", p.nx, p.ny, p.nz, n, p.row_start[n]);

    for (long i = 0; i < n; i++) cg.x[i] = 0;
    t0 = now_seconds();
    cg_start(&cg);
    long iter = 0;
    for (iter = 1; iter <= max_iters && cg.normr > tolerance; iter++) {
        cg_iterate(&cg);
        if (iter % 10 == 0)
            printf("hpccg: iteration %4ld  residual %.6e\n", iter, cg.normr);
    }
    double t_solve = now_seconds() - t0;
    double error = 0;
    for (long i = 0; i < n; i++) error = fmax(error, fabs(cg.x[i] - 1.0));
    double flops = (double)(iter - 1) * cg_flops_per_iteration(&p);
    printf("hpccg: %ld iterations, residual %.6e, max error %.3e\n", iter - 1, cg.normr, error);
    printf("hpccg: setup %.3f s, solve %.3f s, %.1f MFLOP/s\n", t_setup, t_solve, flops / t_solve / 1e6);
    int converged = error < 1e-6;
    printf("hpccg: %s\n", converged ? "solution verified" : "solution NOT verified");
    return converged ? 0 : 1;
}
