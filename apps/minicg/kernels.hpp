// The three kernels of a CG iteration, written as the mini-apps write them.
#ifndef MINICG_KERNELS_HPP
#define MINICG_KERNELS_HPP

#include <vector>

#include "SparseMatrix.hpp"

// y = A x
void sparsemv(const SparseMatrix &A, const std::vector<double> &x, std::vector<double> &y);
// x . y
double ddot(const std::vector<double> &x, const std::vector<double> &y);
// w = alpha x + beta y
void waxpby(double alpha, const std::vector<double> &x, double beta, const std::vector<double> &y,
            std::vector<double> &w);

#endif
