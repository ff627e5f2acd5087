/*
 * The conjugate-gradient solver of hpccg, shared by apps/hpccg (the benchmark) and
 * apps/insitu/sim.c (the in-situ simulation), so both run the very same numerical kernels.
 *
 * The matrix is a 27-point stencil on an nx*ny*nz grid: 27 on the diagonal and -1 for each of
 * the up to 26 neighbours, so it is symmetric positive definite.
 */
#ifndef CLOWDER_CG_H
#define CLOWDER_CG_H

struct cg_problem {
    long nx, ny, nz, rows;
    /* CSR matrix */
    long *row_start;
    int *cols;
    double *vals;
};

/* The solver's vectors and scalars between iterations; x may live anywhere the caller likes
 * (the in-situ simulation puts it in memory it exports). */
struct cg_state {
    const struct cg_problem *problem;
    const double *b;
    double *x, *r, *dir, *ap;
    double rtr, normr;
};

void *cg_checked_malloc(size_t bytes);
/* Builds the matrix and sets b = A * ones, so the exact solution is all ones. */
void cg_build_problem(struct cg_problem *p, double *b);
void cg_sparse_multiply(const struct cg_problem *p, const double *x, double *y);
double cg_dot(long n, const double *a, const double *b);
/* w = alpha * x + beta * y */
void cg_waxpby(long n, double alpha, const double *x, double beta, const double *y, double *w);
/* Starts a solve of A x = b from the x already in s->x (r = b - A x, dir = r). */
void cg_start(struct cg_state *s);
/* One CG iteration: updates x, r, dir, rtr and normr. */
void cg_iterate(struct cg_state *s);
/* Flops of one iteration: SpMV 2*nnz, 2 dots 4n, 3 waxpby 6n. */
double cg_flops_per_iteration(const struct cg_problem *p);

#endif
