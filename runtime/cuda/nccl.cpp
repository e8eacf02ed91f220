#include "runtime/cuda/nccl.hpp"

#include "compiler/env.hpp"
#include "ir/error.hpp"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

namespace kiln::cuda {

namespace {

const char* kHowTo = "install NCCL (libnccl2, or the nvidia-nccl wheel) or set KILN_NCCL_LIBRARY to the path of libnccl.so.2";

std::unique_ptr<Nccl> load(const std::string& name) {
    auto n = std::make_unique<Nccl>();
    n->library = name;
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* e = dlerror();
        n->why_not = fmt::format("the NCCL library {} could not be loaded ({}); {}", name, e ? e : "not found", kHowTo);
        return n;
    }
    bool missing = false;
    auto sym = [&](auto& fn, const char* symbol) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
        if (!fn && !missing) {
            missing = true;
            n->why_not = fmt::format("{} has no symbol {}: kiln needs NCCL 2.18 or newer; {}", name, symbol, kHowTo);
        }
    };
    sym(n->ncclGetVersion, "ncclGetVersion");
    sym(n->ncclGetErrorString, "ncclGetErrorString");
    sym(n->ncclGetLastError, "ncclGetLastError");
    sym(n->ncclGetUniqueId, "ncclGetUniqueId");
    sym(n->ncclCommInitRankConfig, "ncclCommInitRankConfig");
    sym(n->ncclCommInitAll, "ncclCommInitAll");
    sym(n->ncclCommSplit, "ncclCommSplit");
    sym(n->ncclCommDestroy, "ncclCommDestroy");
    sym(n->ncclCommAbort, "ncclCommAbort");
    sym(n->ncclCommGetAsyncError, "ncclCommGetAsyncError");
    sym(n->ncclAllReduce, "ncclAllReduce");
    sym(n->ncclAllGather, "ncclAllGather");
    sym(n->ncclReduceScatter, "ncclReduceScatter");
    sym(n->ncclBroadcast, "ncclBroadcast");
    sym(n->ncclGroupStart, "ncclGroupStart");
    sym(n->ncclGroupEnd, "ncclGroupEnd");
    if (missing) {
        dlclose(lib);
        return n;
    }
    n->ncclGetVersion(&n->version);
    if (n->version < kMinNcclVersion) {
        n->why_not = fmt::format("{} is NCCL {}.{}.{}; kiln needs 2.18 or newer; {}", name, n->version / 10000,
                                 n->version / 100 % 100, n->version % 100, kHowTo);
        dlclose(lib);
        return n;
    }
    n->loaded = true;
    return n;  // the library stays loaded for the life of the process
}

} // namespace

const Nccl& nccl() {
    static std::mutex mu;
    static std::map<std::string, std::unique_ptr<Nccl>> loaded;
    std::string name = env::text("KILN_NCCL_LIBRARY").value_or("libnccl.so.2");
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = loaded[name];
    if (!slot) slot = load(name);
    return *slot;
}

std::string describe(ncclResult_t r, const char* call) {
    const Nccl& n = nccl();
    const char* s = n.loaded ? n.ncclGetErrorString(r) : nullptr;
    static const char* names[] = {"ncclSuccess",     "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                                  "ncclInvalidArgument", "ncclInvalidUsage",   "ncclRemoteError", "ncclInProgress"};
    const char* name = (int)r >= 0 && (int)r < 8 ? names[(int)r] : "unknown NCCL result";
    return fmt::format("{}: {} ({})", call, name, s ? s : "no description");
}

} // namespace kiln::cuda
