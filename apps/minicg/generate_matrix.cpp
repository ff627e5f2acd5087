#include "SparseMatrix.hpp"

SparseMatrix::~SparseMatrix() {
  for (int i = 0; i < nrows; i++) {
    delete[] vals_in_row[i];
    delete[] inds_in_row[i];
  }
}

void generate_matrix(int nx, int ny, int nz, SparseMatrix &A, std::vector<double> &x,
                     std::vector<double> &b, std::vector<double> &xexact) {
  A.nx = nx;
  A.ny = ny;
  A.nz = nz;
  A.nrows = nx * ny * nz;
  A.nnz = 0;
  A.nnz_in_row.resize(A.nrows);
  A.vals_in_row.resize(A.nrows);
  A.inds_in_row.resize(A.nrows);
  A.diag_in_row.resize(A.nrows);
  x.assign(A.nrows, 0.0);
  b.assign(A.nrows, 0.0);
  xexact.assign(A.nrows, 1.0);

  for (int iz = 0; iz < nz; iz++) {
    for (int iy = 0; iy < ny; iy++) {
      for (int ix = 0; ix < nx; ix++) {
        int row = iz * nx * ny + iy * nx + ix;
        // Each row gets blocks of its own, sized for the full stencil as HPCCG sizes them.
        double *vals = new double[27];
        int *inds = new int[27];
        int n = 0;
        for (int sz = -1; sz <= 1; sz++) {
          for (int sy = -1; sy <= 1; sy++) {
            for (int sx = -1; sx <= 1; sx++) {
              int cx = ix + sx, cy = iy + sy, cz = iz + sz;
              if (cx < 0 || cx >= nx || cy < 0 || cy >= ny || cz < 0 || cz >= nz) continue;
              int col = cz * nx * ny + cy * nx + cx;
              if (col == row) {
                A.diag_in_row[row] = vals + n;
                vals[n] = 27.0;
              } else {
                vals[n] = -1.0;
              }
              inds[n] = col;
              b[row] += vals[n];
              n++;
            }
          }
        }
        A.nnz_in_row[row] = n;
        A.vals_in_row[row] = vals;
        A.inds_in_row[row] = inds;
        A.nnz += n;
      }
    }
  }
}
