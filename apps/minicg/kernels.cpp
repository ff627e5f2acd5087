#include "kernels.hpp"

void sparsemv(const SparseMatrix &A, const std::vector<double> &x, std::vector<double> &y) {
  for (int i = 0; i < A.nrows; i++) {
    const double *vals = A.vals_in_row[i];
    const int *inds = A.inds_in_row[i];
    int n = A.nnz_in_row[i];
    double sum = 0.0;
    for (int j = 0; j < n; j++) sum += vals[j] * x[inds[j]];
    y[i] = sum;
  }
}

double ddot(const std::vector<double> &x, const std::vector<double> &y) {
  double result = 0.0;
  for (std::size_t i = 0; i < x.size(); i++) result += x[i] * y[i];
  return result;
}

void waxpby(double alpha, const std::vector<double> &x, double beta, const std::vector<double> &y,
            std::vector<double> &w) {
  if (alpha == 1.0) {
    for (std::size_t i = 0; i < x.size(); i++) w[i] = x[i] + beta * y[i];
  } else if (beta == 1.0) {
    for (std::size_t i = 0; i < x.size(); i++) w[i] = alpha * x[i] + y[i];
  } else {
    for (std::size_t i = 0; i < x.size(); i++) w[i] = alpha * x[i] + beta * y[i];
  }
}
