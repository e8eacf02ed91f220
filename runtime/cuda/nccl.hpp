// NCCL, loaded at run time with dlopen, as the driver is (runtime/cuda/driver.hpp): libkiln
// never links it, so it loads where NCCL is absent, and only a communicator needs it. Types
// come from nccl.h (header only); each function is looked up by name.
//
// Which library: KILN_NCCL_LIBRARY (a path or a file name for dlopen), else libnccl.so.2 from
// the loader's search path. The variable is read at each call, and each library is loaded once,
// so a program (or a test) can point at another one before its first communicator.
#pragma once
#include <nccl.h>

#include <string>

namespace kiln::cuda {

struct Nccl {
    bool loaded = false;
    std::string library;   // what was given to dlopen
    std::string why_not;   // when !loaded: what failed, and how to point kiln at a library
    int version = 0;       // ncclGetVersion: 10000 * major + 100 * minor + patch

#define KILN_NCCL_FN(name) decltype(&::name) name = nullptr;
    KILN_NCCL_FN(ncclGetVersion)
    KILN_NCCL_FN(ncclGetErrorString)
    KILN_NCCL_FN(ncclGetLastError)
    KILN_NCCL_FN(ncclGetUniqueId)
    KILN_NCCL_FN(ncclCommInitRankConfig)
    KILN_NCCL_FN(ncclCommInitAll)
    KILN_NCCL_FN(ncclCommSplit)
    KILN_NCCL_FN(ncclCommDestroy)
    KILN_NCCL_FN(ncclCommAbort)
    KILN_NCCL_FN(ncclCommGetAsyncError)
    KILN_NCCL_FN(ncclAllReduce)
    KILN_NCCL_FN(ncclAllGather)
    KILN_NCCL_FN(ncclReduceScatter)
    KILN_NCCL_FN(ncclBroadcast)
    KILN_NCCL_FN(ncclGroupStart)
    KILN_NCCL_FN(ncclGroupEnd)
#undef KILN_NCCL_FN
};

// The oldest NCCL kiln takes: non-blocking communicators with ncclCommGetAsyncError polling
// (the timeouts), ncclAvg and bfloat16 are all there from 2.18.
inline constexpr int kMinNcclVersion = 21800;

// The library KILN_NCCL_LIBRARY names (else libnccl.so.2), loaded on first use. Never throws.
const Nccl& nccl();

// "ncclAllReduce: ncclRemoteError (remote process exited or there was a network error)".
std::string describe(ncclResult_t r, const char* call);

} // namespace kiln::cuda
