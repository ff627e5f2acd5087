// Per-step cost of moving one array from a simulation to an analysis process.
//   adios2_bench writer CONFIG STREAM MIB STEPS [PAUSE_MS]   an ADIOS2 writer (engine from CONFIG)
//   adios2_bench reader CONFIG STREAM MIB STEPS [PAUSE_MS]   an ADIOS2 reader of it
//   adios2_bench zc-reader CONFIG STREAM MIB STEPS [PAUSE_MS] a clowder engine reader that
//                                                 reads in place (clowder_adios2_block_data)
//   adios2_bench raw-writer NAME MIB STEPS        3 named XEMEM segments of MIB MiB each
//   adios2_bench raw-reader NAME MIB STEPS        per step: attach one + read all + detach, and
//                                                 attach one + copy all out + detach
// The writer's step is BeginStep + Put + EndStep (the simulation's data already computed);
// the reader's is BeginStep + Get of the whole array into the analysis's buffer + EndStep;
// the zero-copy reader's is BeginStep + the analysis reading the array where the writer put
// it (the raw reader's sum, over each block's pointer) + EndStep.
// PAUSE_MS is time spent outside the measured step (computing): a writer that pauses finds
// room in the queue, a reader that pauses finds the next step ready, so each measures its own
// cost and not the wait for the other (coupling/bench/run.sh runs both ways).
// The raw reader is the floor: the same bytes attached and read (summed) with libxpmem alone,
// from 3 segments in turn through permits it keeps, as the engine reuses its 3 buffers
// (QueueLimit 2 + 1), so both attach memory whose pages were mapped before. It also copies the
// bytes out into a buffer of its own (memcpy), which is what an ADIOS2 Get does: the floor
// for any reader that gets the data into its own memory. Each role prints
// "ROLE median_ms MEDIAN min_ms MIN" over the steps after the first (which pays for
// connecting) and checks the data it got.
#include <adios2.h>
#include <clowder_adios2_read.h>
#include <xpmem.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace
{
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b)
{
    return std::chrono::duration<double, std::milli>(b - a).count();
}

void Report(const char *role, std::vector<double> ms)
{
    // The first of each kind pays for connecting and first mappings.
    if (ms.size() > 1)
        ms.erase(ms.begin());
    if (ms.empty())
    {
        std::printf("%s no steps\n", role); // the other side failed first: it says why
        std::fflush(stdout);
        return;
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%s median_ms %.3f min_ms %.3f steps %zu\n", role, ms[ms.size() / 2], ms[0],
                ms.size());
    std::fflush(stdout);
}

void Pause(long ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// The analysis: a sum of n doubles, eight side by side (a read at memory speed, not at the
// latency of one chain of adds); n a multiple of 8.
double Sum(const double *d, size_t n)
{
    double part[8] = {};
    for (size_t k = 0; k < n; k += 8)
        for (size_t j = 0; j < 8; ++j)
            part[j] += d[k + j];
    double sum = 0;
    for (double x : part)
        sum += x;
    return sum;
}

int Writer(const char *config, const char *stream, size_t n, size_t steps, long pauseMs)
{
    adios2::ADIOS adios(config);
    adios2::IO io = adios.DeclareIO("Bench");
    auto var = io.DefineVariable<double>("data", {n}, {0}, {n});
    adios2::Engine w = io.Open(stream, adios2::Mode::Write);
    std::vector<double> data(n, 1.0);
    std::vector<double> ms;
    for (size_t s = 0; s < steps; ++s)
    {
        data[0] = double(s); // the reader checks it came from this step
        auto t0 = Clock::now();
        w.BeginStep();
        w.Put(var, data.data(), adios2::Mode::Sync);
        w.EndStep();
        ms.push_back(Ms(t0, Clock::now()));
        Pause(pauseMs);
    }
    w.Close();
    Report("writer", ms);
    return 0;
}

// The step loop both readers share: READ_STEP reads the step BeginStep opened (between it and
// EndStep, timed) and says whether its data are the writer's (step's value first, 1.0 last).
template <typename ReadStep>
int ReadSteps(const char *who, const char *config, const char *stream, size_t steps, long pauseMs,
              ReadStep readStep)
{
    adios2::ADIOS adios(config);
    adios2::IO io = adios.DeclareIO("Bench");
    adios2::Engine r = io.Open(stream, adios2::Mode::Read);
    std::vector<double> ms;
    size_t got = 0;
    while (got < steps)
    {
        Pause(pauseMs);
        auto t0 = Clock::now();
        adios2::StepStatus st = r.BeginStep(adios2::StepMode::Read, 60.0f);
        if (st != adios2::StepStatus::OK)
            break;
        size_t step = r.CurrentStep();
        int verdict = readStep(io, r, step);
        r.EndStep();
        ms.push_back(Ms(t0, Clock::now()));
        if (verdict < 0)
            return 1;
        if (verdict == 0)
        {
            std::fprintf(stderr, "%s: step %zu has wrong data\n", who, step);
            return 1;
        }
        ++got;
    }
    r.Close();
    Report("reader", ms);
    return got == steps ? 0 : 1;
}

// A Get into the analysis's own buffer.
int Reader(const char *config, const char *stream, size_t n, size_t steps, long pauseMs)
{
    std::vector<double> data(n, 0.0); // touched: the analysis's buffer exists already
    return ReadSteps("reader", config, stream, steps, pauseMs,
                     [&](adios2::IO &io, adios2::Engine &r, size_t step) {
                         r.Get(io.InquireVariable<double>("data"), data.data(), adios2::Mode::Sync);
                         return int(data[0] == double(step) && data[n - 1] == 1.0);
                     });
}

// The analysis reading each block in place (clowder_adios2_block_data): the raw reader's sum.
int ZeroCopyReader(const char *config, const char *stream, size_t n, size_t steps, long pauseMs)
{
    return ReadSteps("zc-reader", config, stream, steps, pauseMs, [&](adios2::IO &, adios2::Engine &, size_t step) {
        double sum = 0;
        clowder_adios2_block b;
        for (size_t k = 0, blocks = 1; k < blocks; ++k)
        {
            if (clowder_adios2_block_data("Bench", "data", "double", k, &b) != 0)
            {
                std::fprintf(stderr, "zc-reader: %s\n", clowder_adios2_read_error());
                return -1;
            }
            blocks = b.nblocks;
            sum += Sum(static_cast<const double *>(b.data), b.nbytes / sizeof(double));
        }
        return int(sum == double(step) + double(n - 1));
    });
}

std::string RawName(const char *name, size_t s)
{
    return std::string(name) + "." + std::to_string(s);
}

constexpr size_t kRawSegments = 3;

int RawWriter(const char *name, size_t bytes)
{
    for (size_t s = 0; s < kRawSegments; ++s)
    {
        int fd = memfd_create("raw-bench", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, bytes) != 0)
            return 1;
        void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
            return 1;
        std::fill_n(static_cast<double *>(p), bytes / sizeof(double), 1.0);
        static_cast<double *>(p)[0] = double(s);
        if (xemem_make(p, bytes, RawName(name, s).c_str()) < 0)
        {
            std::perror("raw-writer: xemem_make");
            return 1;
        }
    }
    std::printf("raw-writer ready\n");
    std::fflush(stdout);
    pause(); // until the reader is done and the script ends us
    return 0;
}

int RawReader(const char *name, size_t bytes, size_t steps)
{
    std::vector<double> ms, copyMs;
    std::vector<double> copy(bytes / sizeof(double), 0.0);
    xpmem_apid_t apids[kRawSegments];
    for (size_t s = 0; s < kRawSegments; ++s)
    {
        xpmem_segid_t segid;
        while ((segid = xemem_lookup_segid(RawName(name, s).c_str())) < 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        apids[s] = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, nullptr);
    }
    for (size_t s = 0; s < steps; ++s)
    {
        auto t0 = Clock::now();
        xpmem_apid_t apid = apids[s % kRawSegments];
        void *p = xpmem_attach(xpmem_addr{apid, 0}, bytes, nullptr);
        if (apid < 0 || p == reinterpret_cast<void *>(-1))
        {
            std::perror("raw-reader: attach");
            return 1;
        }
        double sum = Sum(static_cast<const double *>(p), bytes / sizeof(double));
        xpmem_detach(p);
        ms.push_back(Ms(t0, Clock::now()));
        if (sum != double(s % kRawSegments) + double(bytes / sizeof(double) - 1))
        {
            std::fprintf(stderr, "raw-reader: step %zu has wrong data\n", s);
            return 1;
        }
        t0 = Clock::now();
        p = xpmem_attach(xpmem_addr{apid, 0}, bytes, nullptr);
        if (p == reinterpret_cast<void *>(-1))
            return 1;
        std::memcpy(copy.data(), p, bytes);
        xpmem_detach(p);
        copyMs.push_back(Ms(t0, Clock::now()));
        if (copy[0] != double(s % kRawSegments))
            return 1;
    }
    Report("raw-reader", ms);
    Report("raw-copy", copyMs);
    return 0;
}
} // namespace

int main(int argc, char **argv)
{
    const std::string role = argc > 1 ? argv[1] : "";
    const bool adios = role == "writer" || role == "reader" || role == "zc-reader";
    if (!(adios && (argc == 6 || argc == 7)) &&
        !((role == "raw-writer" || role == "raw-reader") && argc == 5))
    {
        std::fprintf(stderr,
                     "usage: adios2_bench writer|reader|zc-reader CONFIG STREAM MIB STEPS "
                     "[PAUSE_MS]\n"
                     "       adios2_bench raw-writer|raw-reader NAME MIB STEPS\n");
        return 2;
    }
    const int last = adios ? 5 : argc - 1; // STEPS
    const size_t mib = std::strtoul(argv[last - 1], nullptr, 10);
    const size_t steps = std::strtoul(argv[last], nullptr, 10);
    const long pauseMs = adios && argc == 7 ? std::strtol(argv[6], nullptr, 10) : 0;
    if (mib == 0 || steps == 0)
    {
        std::fprintf(stderr, "adios2_bench: MIB and STEPS must be whole numbers from 1\n");
        return 2;
    }
    const size_t bytes = mib << 20;
    try
    {
        if (role == "writer")
            return Writer(argv[2], argv[3], bytes / sizeof(double), steps, pauseMs);
        if (role == "reader")
            return Reader(argv[2], argv[3], bytes / sizeof(double), steps, pauseMs);
        if (role == "zc-reader")
            return ZeroCopyReader(argv[2], argv[3], bytes / sizeof(double), steps, pauseMs);
        if (role == "raw-writer")
            return RawWriter(argv[2], bytes);
        return RawReader(argv[2], bytes, steps);
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "adios2_bench %s: %s\n", role.c_str(), e.what());
        return 1;
    }
}
