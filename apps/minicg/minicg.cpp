// minicg: a conjugate-gradient mini-app in C++ written in the manner of the Mantevo mini-apps
// (HPCCG, miniFE): a 27-point-stencil matrix with a heap block per row, std::vector<double>
// vectors, a timer around every kernel, iostream output. Written for clowder as a stand-in for
// the third-party codes users bring to an enclave, not derived from their sources.
//
//   minicg NX NY NZ [MAX_ITERS]      (MAX_ITERS default 150; tolerance 0, as HPCCG runs)
//
// The timer is the process's CPU time from getrusage, or gettimeofday when built with
// -DWALL_TIMER (mytimer.cpp). Exit status 0 when the solution (all ones) is reproduced to
// 1e-6, 1 otherwise, 2 on bad arguments.
#include <cmath>
#include <iomanip>
#include <iostream>
#include <vector>

#include "../args.h"
#include "SparseMatrix.hpp"
#include "kernels.hpp"
#include "mytimer.hpp"

namespace {

enum { TOTAL, DDOT, WAXPBY, SPARSEMV, NTIMES };

struct Counts {
  double times[NTIMES] = {0, 0, 0, 0};
  double flops[NTIMES] = {0, 0, 0, 0};
};

// HPCCG's loop: every kernel call timed on its own.
int cg_solve(const SparseMatrix &A, const std::vector<double> &b, std::vector<double> &x,
             int max_iter, double tolerance, double &normr, Counts &c) {
  const double n = A.nrows;
  std::vector<double> r(A.nrows), p(A.nrows), Ap(A.nrows);
  double t_begin = mytimer(), t0;
#define TICK() t0 = mytimer()
#define TOCK(what) c.times[what] += mytimer() - t0

  TICK(); waxpby(1.0, x, 0.0, x, p); TOCK(WAXPBY);
  TICK(); sparsemv(A, p, Ap); TOCK(SPARSEMV);
  TICK(); waxpby(1.0, b, -1.0, Ap, r); TOCK(WAXPBY);
  double rtrans = 0.0;
  TICK(); rtrans = ddot(r, r); TOCK(DDOT);
  c.flops[WAXPBY] += 4 * n;
  c.flops[SPARSEMV] += 2.0 * A.nnz;
  c.flops[DDOT] += 2 * n;
  normr = std::sqrt(rtrans);

  int k;
  for (k = 1; k <= max_iter && normr > tolerance; k++) {
    if (k == 1) {
      TICK(); waxpby(1.0, r, 0.0, r, p); TOCK(WAXPBY);
    } else {
      double oldrtrans = rtrans;
      TICK(); rtrans = ddot(r, r); TOCK(DDOT);
      double beta = rtrans / oldrtrans;
      TICK(); waxpby(1.0, r, beta, p, p); TOCK(WAXPBY);
      c.flops[DDOT] += 2 * n;
    }
    normr = std::sqrt(rtrans);
    if (k % 10 == 0) std::cout << "minicg: iteration " << std::setw(4) << k << "  residual " << normr << std::endl;
    TICK(); sparsemv(A, p, Ap); TOCK(SPARSEMV);
    double alpha = 0.0;
    TICK(); alpha = ddot(p, Ap); TOCK(DDOT);
    alpha = rtrans / alpha;
    TICK(); waxpby(1.0, x, alpha, p, x); waxpby(1.0, r, -alpha, Ap, r); TOCK(WAXPBY);
    c.flops[WAXPBY] += 6 * n;
    c.flops[SPARSEMV] += 2.0 * A.nnz;
    c.flops[DDOT] += 2 * n;
  }
#undef TICK
#undef TOCK
  c.times[TOTAL] = mytimer() - t_begin;
  c.flops[TOTAL] = c.flops[DDOT] + c.flops[WAXPBY] + c.flops[SPARSEMV];
  return k - 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 4 || argc > 5) {
    std::cerr << "usage: minicg NX NY NZ [MAX_ITERS]" << std::endl;
    return 2;
  }
  int nx = arg_integer("minicg", "NX", argv[1], 1, 512);
  int ny = arg_integer("minicg", "NY", argv[2], 1, 512);
  int nz = arg_integer("minicg", "NZ", argv[3], 1, 512);
  int max_iter = argc > 4 ? arg_integer("minicg", "MAX_ITERS", argv[4], 1, 100000) : 150;

  SparseMatrix A;
  std::vector<double> x, b, xexact;
  double t0 = mytimer();
  generate_matrix(nx, ny, nz, A, x, b, xexact);
  double t_setup = mytimer() - t0;
  std::cout << "minicg: " << nx << " x " << ny << " x " << nz << " grid, " << A.nrows << " rows, " << A.nnz
            << " nonzeros, timer " << mytimer_name() << std::endl;

  double normr = 0.0;
  Counts c;
  int iters = cg_solve(A, b, x, max_iter, 0.0, normr, c);

  double error = 0.0;
  for (int i = 0; i < A.nrows; i++) error = std::fmax(error, std::fabs(x[i] - xexact[i]));
  const char *names[NTIMES] = {"total", "ddot", "waxpby", "sparsemv"};
  std::cout << "minicg: " << iters << " iterations, residual " << normr << ", max error " << error << std::endl;
  std::cout << std::fixed << std::setprecision(3) << "minicg: setup " << t_setup << " s, times (s):";
  for (int i = 0; i < NTIMES; i++) std::cout << " " << names[i] << " " << c.times[i];
  std::cout << std::endl << std::setprecision(1) << "minicg: MFLOPS:";
  for (int i = 0; i < NTIMES; i++) std::cout << " " << names[i] << " " << (c.times[i] > 0 ? c.flops[i] / c.times[i] / 1e6 : 0.0);
  std::cout << std::endl;
  bool verified = error < 1e-6;
  std::cout << "minicg: solution " << (verified ? "verified" : "NOT verified") << std::endl;
  return verified ? 0 : 1;
}
