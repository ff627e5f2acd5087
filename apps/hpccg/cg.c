/* The CG kernels of hpccg (see cg.h); optional OpenMP, static-link friendly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cg.h"

void *cg_checked_malloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "cg: out of memory allocating %zu bytes\n", bytes);
        exit(2);
    }
    return p;
}

void cg_build_problem(struct cg_problem *p, double *b) {
    p->rows = p->nx * p->ny * p->nz;
    p->row_start = cg_checked_malloc((p->rows + 1) * sizeof(long));
    p->cols = cg_checked_malloc(p->rows * 27 * sizeof(int));
    p->vals = cg_checked_malloc(p->rows * 27 * sizeof(double));
    long n = 0;
    for (long z = 0; z < p->nz; z++)
        for (long y = 0; y < p->ny; y++)
            for (long x = 0; x < p->nx; x++) {
                long row = (z * p->ny + y) * p->nx + x;
                p->row_start[row] = n;
                double sum = 0;
                for (int dz = -1; dz <= 1; dz++)
                    for (int dy = -1; dy <= 1; dy++)
                        for (int dx = -1; dx <= 1; dx++) {
                            long cx = x + dx, cy = y + dy, cz = z + dz;
                            if (cx < 0 || cy < 0 || cz < 0 || cx >= p->nx || cy >= p->ny || cz >= p->nz)
                                continue;
                            double v = (dx == 0 && dy == 0 && dz == 0) ? 27.0 : -1.0;
                            p->cols[n] = (int)((cz * p->ny + cy) * p->nx + cx);
                            p->vals[n] = v;
                            sum += v; /* A * ones */
                            n++;
                        }
                b[row] = sum;
            }
    p->row_start[p->rows] = n;
}

void cg_sparse_multiply(const struct cg_problem *p, const double *x, double *y) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < p->rows; r++) {
        double s = 0;
        for (long k = p->row_start[r]; k < p->row_start[r + 1]; k++)
            s += p->vals[k] * x[p->cols[k]];
        y[r] = s;
    }
}

double cg_dot(long n, const double *a, const double *b) {
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (long i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void cg_waxpby(long n, double alpha, const double *x, double beta, const double *y, double *w) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        w[i] = alpha * x[i] + beta * y[i];
}

void cg_start(struct cg_state *s) {
    long n = s->problem->rows;
    cg_sparse_multiply(s->problem, s->x, s->ap);
    cg_waxpby(n, 1.0, s->b, -1.0, s->ap, s->r);
    cg_waxpby(n, 1.0, s->r, 0.0, s->r, s->dir);
    s->rtr = cg_dot(n, s->r, s->r);
    s->normr = sqrt(s->rtr);
}

void cg_iterate(struct cg_state *s) {
    long n = s->problem->rows;
    cg_sparse_multiply(s->problem, s->dir, s->ap);
    double alpha = s->rtr / cg_dot(n, s->dir, s->ap);
    cg_waxpby(n, 1.0, s->x, alpha, s->dir, s->x);
    cg_waxpby(n, 1.0, s->r, -alpha, s->ap, s->r);
    double rtr_new = cg_dot(n, s->r, s->r);
    cg_waxpby(n, 1.0, s->r, rtr_new / s->rtr, s->dir, s->dir);
    s->rtr = rtr_new;
    s->normr = sqrt(s->rtr);
}

double cg_flops_per_iteration(const struct cg_problem *p) {
    return 2.0 * p->row_start[p->rows] + 10.0 * p->rows;
}
