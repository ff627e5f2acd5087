// The zero-copy read (include/clowder_adios2_read.h): the open readers by IO name, the block
// pointers they hand out, and the blocks' list for ADIOS2's Engine::BlocksInfo. The C entry point is how a program reaches the engine
// instance ADIOS2 made for it, since ADIOS2 2.12 passes no zero-copy call to a plugin (the
// header says why); the IO's name is what the caller and the engine both know.
#include "c_api.h"
#include "reader.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace clowder_adios
{

namespace
{
std::mutex registryLock;
std::vector<std::pair<std::string, Reader *>> registry; // IO name, reader
thread_local std::string lastError;
} // namespace

void RegisterReader(const std::string &ioName, Reader *reader)
{
    std::lock_guard<std::mutex> lock(registryLock);
    registry.emplace_back(ioName, reader);
}

void UnregisterReader(Reader *reader)
{
    std::lock_guard<std::mutex> lock(registryLock);
    registry.erase(std::remove_if(registry.begin(), registry.end(),
                                  [&](const auto &e) { return e.second == reader; }),
                   registry.end());
}

void Reader::BlockData(const std::string &name, const char *type, size_t block,
                       clowder_adios2_block &out) const
{
    if (!m_InStep)
        throw std::logic_error("clowder engine: stream '" + m_Name + "': block data of '" +
                               name +
                               "' asked outside BeginStep/EndStep (a step's memory is the "
                               "reader's only until its EndStep)");
    auto it = m_Vars.find(name);
    if (it == m_Vars.end())
        throw std::invalid_argument("clowder engine: variable '" + name + "' is not in step " +
                                    std::to_string(m_Step));
    const Var &var = it->second;
    if (type && var.type != type)
        throw std::invalid_argument("clowder engine: variable '" + name + "' is " + var.type +
                                    ", not " + type);
    if (block >= var.blocks.size())
        throw std::invalid_argument("clowder engine: variable '" + name + "' has " +
                                    std::to_string(var.blocks.size()) + " block(s), not block " +
                                    std::to_string(block));
    const Block &b = var.blocks[block];
    out = clowder_adios2_block{};
    out.data = b.data;
    out.nbytes = b.size;
    out.nblocks = var.blocks.size();
    out.step = m_Step;
    out.ndims = b.count.size(); // ParseStep bounds it by kMaxDims, the header's MAX_DIMS
    for (size_t d = 0; d < out.ndims; ++d)
    {
        out.count[d] = b.count[d];
        out.shape[d] = d < var.shape.size() ? var.shape[d] : 0;
        out.start[d] = d < b.start.size() ? b.start[d] : 0;
    }
}

adios2::MinVarInfo *Reader::MinBlocksInfo(const std::string &varName, const size_t) const
{
    auto it = m_Vars.find(varName);
    const Var *var = it == m_Vars.end() ? nullptr : &it->second;
    if (var && var->type == adios2::GetType<std::string>())
        return nullptr;
    // ADIOS2 copies Shape, Start and Count out at once and deletes the MinVarInfo.
    const bool global = var && var->kind == Kind::GlobalArray;
    auto *info = new adios2::MinVarInfo(var ? int(var->shape.size()) : 0,
                                        global ? var->shape.data() : nullptr);
    info->Step = m_Step;
    info->WasLocalValue = false;
    if (!m_InStep || !var)
        return info; // ADIOS2 documents an empty list where there is no step
    info->IsValue = var->kind == Kind::Value;
    for (size_t k = 0; k < var->blocks.size(); ++k)
    {
        const Block &b = var->blocks[k];
        adios2::MinBlockInfo block{};
        block.BlockID = k;
        block.Start = global ? b.start.data() : nullptr;
        block.Count = b.count.data();
        std::memset(&block.MinMax, 0, sizeof block.MinMax);
        block.BufferP = const_cast<uint8_t *>(b.data); // ADIOS2 reads a value's through it
        info->BlocksInfo.push_back(block);
    }
    return info;
}

static_assert(kMaxDims == CLOWDER_ADIOS2_MAX_DIMS);

} // namespace clowder_adios

extern "C" {

int clowder_adios2_block_data(const char *io, const char *variable, const char *type,
                              size_t block, clowder_adios2_block *out)
{
    using namespace clowder_adios;
    return Guard(lastError, [&] {
        if (!io || !variable || !out)
            throw std::invalid_argument("clowder engine: clowder_adios2_block_data: io, "
                                        "variable and out must not be NULL");
        std::lock_guard<std::mutex> lock(registryLock);
        Reader *found = nullptr;
        size_t n = 0;
        for (const auto &[name, reader] : registry)
            if (name == io)
            {
                found = reader;
                ++n;
            }
        if (n != 1)
            throw std::invalid_argument(
                "clowder engine: " +
                (n ? std::to_string(n) + " clowder readers are" : std::string("no clowder reader is")) +
                " open on IO '" + io + "'");
        found->BlockData(variable, type, block, *out);
    });
}

const char *clowder_adios2_read_error(void) { return clowder_adios::lastError.c_str(); }
}
