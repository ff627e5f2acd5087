/*
 * hpccg: conjugate-gradient solve of a 27-point-stencil problem on an nx*ny*nz grid, in the
 * manner of Mantevo's HPCCG (the mini-app the Hobbes papers run in their enclaves). Written for
 * clowder: one C file, no dependencies, static-link friendly, optional OpenMP.
 *
 *   hpccg NX NY NZ [MAX_ITERS] [TOLERANCE]
 *
 * The matrix has 27 on the diagonal and -1 for each of the up to 26 neighbours, so it is
 * symmetric positive definite; the right-hand side is chosen so the exact solution is all ones,
 * which makes the final error checkable. Prints progress every 10 iterations, then the result.
 * Exit status 0 if the solution error is below 1e-6 (converged), 1 otherwise, 2 on bad input.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct problem {
    long nx, ny, nz, rows;
    /* CSR matrix */
    long *row_start;
    int *cols;
    double *vals;
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long parse_dimension(const char *text, const char *name) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < 1 || v > 1024) {
        fprintf(stderr, "hpccg: %s must be an integer from 1 to 1024, got \"%s\"\n", name, text);
        exit(2);
    }
    return v;
}

static void *checked_malloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "hpccg: out of memory allocating %zu bytes\n", bytes);
        exit(2);
    }
    return p;
}

static void build_problem(struct problem *p, double *b) {
    p->rows = p->nx * p->ny * p->nz;
    p->row_start = checked_malloc((p->rows + 1) * sizeof(long));
    p->cols = checked_malloc(p->rows * 27 * sizeof(int));
    p->vals = checked_malloc(p->rows * 27 * sizeof(double));
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

static void sparse_multiply(const struct problem *p, const double *x, double *y) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < p->rows; r++) {
        double s = 0;
        for (long k = p->row_start[r]; k < p->row_start[r + 1]; k++)
            s += p->vals[k] * x[p->cols[k]];
        y[r] = s;
    }
}

static double dot(long n, const double *a, const double *b) {
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (long i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* w = alpha * x + beta * y */
static void waxpby(long n, double alpha, const double *x, double beta, const double *y, double *w) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        w[i] = alpha * x[i] + beta * y[i];
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: hpccg NX NY NZ [MAX_ITERS] [TOLERANCE]\n");
        return 2;
    }
    struct problem p = {0};
    p.nx = parse_dimension(argv[1], "NX");
    p.ny = parse_dimension(argv[2], "NY");
    p.nz = parse_dimension(argv[3], "NZ");
    long max_iters = argc > 4 ? parse_dimension(argv[4], "MAX_ITERS") : 150;
    double tolerance = argc > 5 ? strtod(argv[5], NULL) : 1e-12;
    long n = p.nx * p.ny * p.nz;

    double *b = checked_malloc(n * sizeof(double));
    double *x = checked_malloc(n * sizeof(double));
    double *r = checked_malloc(n * sizeof(double));
    double *dir = checked_malloc(n * sizeof(double));
    double *ap = checked_malloc(n * sizeof(double));
    double t0 = now_seconds();
    build_problem(&p, b);
    double t_setup = now_seconds() - t0;
    printf("hpccg: %ld x %ld x %ld grid, %ld rows, %ld nonzeros\n", p.nx, p.ny, p.nz, n, p.row_start[n]);

    for (long i = 0; i < n; i++) x[i] = 0;
    t0 = now_seconds();
    /* r = b - A x = b (x = 0); p = r */
    waxpby(n, 1.0, b, 0.0, b, r);
    waxpby(n, 1.0, r, 0.0, r, dir);
    double rtr = dot(n, r, r);
    double normr = sqrt(rtr);
    long iter = 0;
    for (iter = 1; iter <= max_iters && normr > tolerance; iter++) {
        sparse_multiply(&p, dir, ap);
        double alpha = rtr / dot(n, dir, ap);
        waxpby(n, 1.0, x, alpha, dir, x);
        waxpby(n, 1.0, r, -alpha, ap, r);
        double rtr_new = dot(n, r, r);
        waxpby(n, 1.0, r, rtr_new / rtr, dir, dir);
        rtr = rtr_new;
        normr = sqrt(rtr);
        if (iter % 10 == 0)
            printf("hpccg: iteration %4ld  residual %.6e\n", iter, normr);
    }
    double t_solve = now_seconds() - t0;
    double error = 0;
    for (long i = 0; i < n; i++) error = fmax(error, fabs(x[i] - 1.0));
    /* per iteration: SpMV 2*nnz, 2 dots 4n, 3 waxpby 6n */
    double flops = (double)(iter - 1) * (2.0 * p.row_start[n] + 10.0 * n);
    printf("hpccg: %ld iterations, residual %.6e, max error %.3e\n", iter - 1, normr, error);
    printf("hpccg: setup %.3f s, solve %.3f s, %.1f MFLOP/s\n", t_setup, t_solve, flops / t_solve / 1e6);
    int converged = error < 1e-6;
    printf("hpccg: %s\n", converged ? "solution verified" : "solution NOT verified");
    return converged ? 0 : 1;
}
