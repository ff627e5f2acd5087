// The matrix of minicg, stored the way Mantevo's HPCCG and many codes derived from it store
// theirs: one heap block of values and one of column indices per row, reached through arrays
// of row pointers (so the heap holds hundreds of thousands of small blocks, as in real codes).
#ifndef MINICG_SPARSEMATRIX_HPP
#define MINICG_SPARSEMATRIX_HPP

#include <vector>

struct SparseMatrix {
  int nx, ny, nz;
  int nrows;
  long long nnz;
  std::vector<int> nnz_in_row;
  std::vector<double *> vals_in_row;
  std::vector<int *> inds_in_row;
  std::vector<double *> diag_in_row;

  SparseMatrix() : nx(0), ny(0), nz(0), nrows(0), nnz(0) {}
  ~SparseMatrix();
};

// Fills A with the 27-point stencil on nx*ny*nz (27 on the diagonal, -1 off it), and x, b and
// xexact so that A * xexact = b with xexact all ones and x all zeros.
void generate_matrix(int nx, int ny, int nz, SparseMatrix &A, std::vector<double> &x,
                     std::vector<double> &b, std::vector<double> &xexact);

#endif
