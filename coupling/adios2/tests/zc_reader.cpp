// An ADIOS2 reader of cxx_writer's stream that reads in place: clowder_adios2_block_data
// (include/clowder_adios2_read.h) points it at each block of "field" in the writer's step
// segment, and it checks every value there against cxx_writer's formula, with no Get, and
// that ADIOS2's Engine::BlocksInfo lists the same blocks.
// zc_reader CONFIG STREAM BLOCK HOLD_MS
//   BLOCK: -1 reads every block (the whole array), else only that block
//   HOLD_MS: holds step 0 that long before EndStep, then checks its values again
// Prints "step S ok blocks N elems E t=MS" per step, "BlocksInfo: ..." for step 0 (MS: CLOCK_MONOTONIC, comparable between
// processes), on step 0 one "refused: ..." line per misuse (another type, a block out of
// range, an unknown variable), after the first EndStep "after EndStep: ...", and with a hold
// "held step 0 for MS ms unchanged, released t=MS". Exit 0 when all checks out.
#include <adios2.h>

#include <clowder_adios2_read.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace
{
double Now()
{
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Values of block b that differ from cxx_writer's: field(s, i, j) = s * 1e6 + i * COLS + j.
size_t Wrong(const clowder_adios2_block &b)
{
    const double *d = static_cast<const double *>(b.data);
    size_t bad = 0;
    for (size_t i = 0; i < b.count[0]; ++i)
        for (size_t j = 0; j < b.count[1]; ++j)
            bad += d[i * b.count[1] + j] != double(b.step) * 1e6 +
                                                double((b.start[0] + i) * b.shape[1] +
                                                       b.start[1] + j);
    return bad;
}

// A misuse must be refused with a message naming it.
bool Refused(const char *what, int rc)
{
    std::printf("refused: %s: %s\n", what, rc == -1 ? clowder_adios2_read_error() : "NOT REFUSED");
    return rc == -1;
}
} // namespace

int main(int argc, char **argv)
{
    if (argc != 5)
    {
        std::fprintf(stderr, "usage: zc_reader CONFIG STREAM BLOCK HOLD_MS\n");
        return 2;
    }
    const long only = std::strtol(argv[3], nullptr, 10);
    const long holdMs = std::strtol(argv[4], nullptr, 10);
    const char *ioName = "SimulationOutput";
    try
    {
        adios2::ADIOS adios(argv[1]);
        adios2::IO io = adios.DeclareIO(ioName);
        adios2::Engine reader = io.Open(argv[2], adios2::Mode::Read);
        size_t steps = 0;
        clowder_adios2_block b;
        while (reader.BeginStep(adios2::StepMode::Read, 10.0f) == adios2::StepStatus::OK)
        {
            if (clowder_adios2_block_data(ioName, "field", "double", 0, &b) != 0)
            {
                std::fprintf(stderr, "zc_reader: %s\n", clowder_adios2_read_error());
                return 1;
            }
            const size_t nblocks = b.nblocks;
            size_t bad = b.step != reader.CurrentStep(), elems = 0;
            for (size_t k = 0; k < nblocks; ++k)
            {
                if (only >= 0 && k != size_t(only))
                    continue;
                if (clowder_adios2_block_data(ioName, "field", "double", k, &b) != 0 ||
                    b.ndims != 2 || b.nbytes != b.count[0] * b.count[1] * sizeof(double))
                {
                    std::fprintf(stderr, "zc_reader: block %zu: %s\n", k,
                                 clowder_adios2_read_error());
                    return 1;
                }
                bad += Wrong(b);
                elems += b.count[0] * b.count[1];
            }
            // ADIOS2's BlocksInfo lists the same blocks (a value's Value too).
            auto field = io.InquireVariable<double>("field");
            auto infos = reader.BlocksInfo(field, b.step);
            bad += infos.size() != nblocks;
            for (size_t k = 0; k < infos.size(); ++k)
            {
                clowder_adios2_block x;
                bad += clowder_adios2_block_data(ioName, "field", "double", k, &x) != 0 ||
                       infos[k].BlockID != k || infos[k].Start != adios2::Dims(x.start, x.start + 2) ||
                       infos[k].Count != adios2::Dims(x.count, x.count + 2);
            }
            auto stepInfo = reader.BlocksInfo(io.InquireVariable<int32_t>("step"), b.step);
            bad += stepInfo.size() != 1 || !stepInfo[0].IsValue || stepInfo[0].Value != int32_t(b.step);
            if (steps == 0 && infos.size() == 2)
                std::printf("BlocksInfo: 2 blocks, block 1 start {%zu,%zu} count {%zu,%zu}\n",
                            infos[1].Start[0], infos[1].Start[1], infos[1].Count[0],
                            infos[1].Count[1]);
            clowder_adios2_block v;
            if (clowder_adios2_block_data(ioName, "step", "int32_t", 0, &v) != 0 ||
                *static_cast<const int32_t *>(v.data) != int32_t(b.step))
                ++bad;
            if (steps == 0)
            {
                bool ok = Refused("float", clowder_adios2_block_data(ioName, "field", "float",
                                                                     0, &v)) &&
                          Refused("block", clowder_adios2_block_data(ioName, "field", "double",
                                                                     nblocks, &v)) &&
                          Refused("name", clowder_adios2_block_data(ioName, "nosuch", nullptr,
                                                                    0, &v)) &&
                          Refused("io", clowder_adios2_block_data("OtherIO", "field", nullptr,
                                                                  0, &v));
                bad += !ok;
            }
            if (steps == 0 && holdMs > 0)
            {
                std::this_thread::sleep_for(std::chrono::milliseconds(holdMs));
                size_t changed = 0;
                for (size_t k = 0; k < nblocks; ++k)
                    if (clowder_adios2_block_data(ioName, "field", "double", k, &b) == 0)
                        changed += Wrong(b);
                std::printf("held step 0 for %ld ms %s, released t=%.1f\n", holdMs,
                            changed ? "CHANGED" : "unchanged", Now());
                bad += changed;
            }
            const size_t step = b.step;
            reader.EndStep();
            std::printf("step %zu %s blocks %zu elems %zu t=%.1f\n", step, bad ? "WRONG" : "ok",
                        nblocks, elems, Now());
            std::fflush(stdout);
            if (steps == 0)
            {
                int rc = clowder_adios2_block_data(ioName, "field", "double", 0, &v);
                std::printf("after EndStep: %s\n",
                            rc == -1 ? clowder_adios2_read_error() : "NOT REFUSED");
                bad += rc != -1;
            }
            if (bad)
                return 1;
            ++steps;
        }
        reader.Close();
        int rc = clowder_adios2_block_data(ioName, "field", nullptr, 0, &b);
        std::printf("after Close: %s\n", rc == -1 ? clowder_adios2_read_error() : "NOT REFUSED");
        std::printf("end of stream after %zu steps\n", steps);
        return rc == -1 ? 0 : 1;
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "zc_reader: %s\n", e.what());
        return 1;
    }
}
