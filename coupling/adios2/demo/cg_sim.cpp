// A CG-like simulation that publishes its solution through ADIOS2: conjugate gradients on the
// 7-point Laplacian of an NX x NY x NZ grid (zero boundary, right-hand side 1), the solution
// vector "x" (a global 3-D array of doubles), "iteration" and "residual" written every
// INTERVAL iterations. The engine comes from the XML configuration, as in any ADIOS2 code.
// cg_sim CONFIG NX NY NZ ITERATIONS INTERVAL
#include <adios2.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace
{
struct Grid
{
    size_t nx, ny, nz;
    size_t At(size_t i, size_t j, size_t k) const { return (k * ny + j) * nx + i; }
};

// y = A p for the 7-point Laplacian with a zero boundary.
void Apply(const Grid &g, const std::vector<double> &p, std::vector<double> &y)
{
    for (size_t k = 0; k < g.nz; ++k)
        for (size_t j = 0; j < g.ny; ++j)
            for (size_t i = 0; i < g.nx; ++i)
            {
                double s = 6 * p[g.At(i, j, k)];
                if (i > 0) s -= p[g.At(i - 1, j, k)];
                if (i + 1 < g.nx) s -= p[g.At(i + 1, j, k)];
                if (j > 0) s -= p[g.At(i, j - 1, k)];
                if (j + 1 < g.ny) s -= p[g.At(i, j + 1, k)];
                if (k > 0) s -= p[g.At(i, j, k - 1)];
                if (k + 1 < g.nz) s -= p[g.At(i, j, k + 1)];
                y[g.At(i, j, k)] = s;
            }
}

double Dot(const std::vector<double> &a, const std::vector<double> &b)
{
    double s = 0;
    for (size_t n = 0; n < a.size(); ++n)
        s += a[n] * b[n];
    return s;
}
} // namespace

int main(int argc, char **argv)
{
    if (argc != 7)
    {
        std::fprintf(stderr, "usage: cg_sim CONFIG NX NY NZ ITERATIONS INTERVAL\n");
        return 2;
    }
    const Grid g{std::strtoul(argv[2], nullptr, 10), std::strtoul(argv[3], nullptr, 10),
                 std::strtoul(argv[4], nullptr, 10)};
    const long iterations = std::strtol(argv[5], nullptr, 10);
    const long interval = std::strtol(argv[6], nullptr, 10);
    if (g.nx == 0 || g.ny == 0 || g.nz == 0 || iterations < 1 || interval < 1)
    {
        std::fprintf(stderr,
                     "cg_sim: sizes, ITERATIONS and INTERVAL must be whole numbers from 1\n");
        return 2;
    }
    try
    {
        adios2::ADIOS adios(argv[1]);
        adios2::IO io = adios.DeclareIO("SimulationOutput");
        auto vx = io.DefineVariable<double>("x", {g.nz, g.ny, g.nx}, {0, 0, 0}, {g.nz, g.ny, g.nx});
        auto vit = io.DefineVariable<int32_t>("iteration");
        auto vres = io.DefineVariable<double>("residual");
        io.DefineAttribute<std::string>("solver", "CG, 7-point Laplacian, b = 1");
        adios2::Engine out = io.Open("cg.bp", adios2::Mode::Write);

        const size_t n = g.nx * g.ny * g.nz;
        std::vector<double> x(n, 0.0), r(n, 1.0), p(r), ap(n);
        double rr = Dot(r, r);
        for (long it = 1; it <= iterations; ++it)
        {
            Apply(g, p, ap);
            double alpha = rr / Dot(p, ap);
            for (size_t m = 0; m < n; ++m)
            {
                x[m] += alpha * p[m];
                r[m] -= alpha * ap[m];
            }
            double next = Dot(r, r);
            for (size_t m = 0; m < n; ++m)
                p[m] = r[m] + next / rr * p[m];
            rr = next;
            if (it % interval == 0 || it == iterations)
            {
                out.BeginStep();
                out.Put(vx, x.data());
                out.Put(vit, int32_t(it));
                out.Put(vres, std::sqrt(rr));
                out.EndStep();
            }
        }
        out.Close();
        std::printf("cg_sim: %ld iterations on %zux%zux%zu, residual %.3e\n", iterations, g.nx,
                    g.ny, g.nz, std::sqrt(rr));
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "cg_sim: %s\n", e.what());
        return 1;
    }
    return 0;
}
