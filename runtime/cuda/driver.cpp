#include "runtime/cuda/driver.hpp"

#include "ir/error.hpp"

#include <dlfcn.h>

namespace kiln::cuda {

namespace {

Driver load() {
    Driver d;
    void* lib = nullptr;
    for (const char* name : {"libcuda.so.1", "libcuda.so"}) {
        lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (lib) break;
    }
    if (!lib) {
        const char* e = dlerror();
        d.why_not = fmt::format("the NVIDIA driver library libcuda.so.1 could not be loaded ({})", e ? e : "not found");
        return d;
    }
    bool missing = false;
    auto sym = [&](auto& fn, const char* symbol) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
        if (!fn && !missing) {
            missing = true;
            d.why_not = fmt::format("libcuda.so.1 has no symbol {} (driver too old?)", symbol);
        }
    };
    sym(d.cuGetErrorName, "cuGetErrorName");
    sym(d.cuGetErrorString, "cuGetErrorString");
    sym(d.cuInit, "cuInit");
    sym(d.cuDriverGetVersion, "cuDriverGetVersion");
    sym(d.cuDeviceGetCount, "cuDeviceGetCount");
    sym(d.cuDeviceGet, "cuDeviceGet");
    sym(d.cuDeviceGetName, "cuDeviceGetName");
    sym(d.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    sym(d.cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    sym(d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    sym(d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    sym(d.cuCtxSetCurrent, "cuCtxSetCurrent");
    sym(d.cuStreamCreate, "cuStreamCreate");
    sym(d.cuStreamDestroy, "cuStreamDestroy_v2");
    sym(d.cuStreamSynchronize, "cuStreamSynchronize");
    sym(d.cuStreamWaitEvent, "cuStreamWaitEvent");
    sym(d.cuEventCreate, "cuEventCreate");
    sym(d.cuEventDestroy, "cuEventDestroy_v2");
    sym(d.cuEventRecord, "cuEventRecord");
    sym(d.cuEventSynchronize, "cuEventSynchronize");
    sym(d.cuEventQuery, "cuEventQuery");
    sym(d.cuEventElapsedTime, "cuEventElapsedTime");
    sym(d.cuMemAlloc, "cuMemAlloc_v2");
    sym(d.cuMemFree, "cuMemFree_v2");
    sym(d.cuMemGetInfo, "cuMemGetInfo_v2");
    sym(d.cuMemGetAddressRange, "cuMemGetAddressRange_v2");
    sym(d.cuMemAllocHost, "cuMemAllocHost_v2");
    sym(d.cuMemFreeHost, "cuMemFreeHost");
    sym(d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    sym(d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    sym(d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    sym(d.cuMemsetD8Async, "cuMemsetD8Async");
    sym(d.cuModuleLoadData, "cuModuleLoadData");
    sym(d.cuModuleUnload, "cuModuleUnload");
    sym(d.cuModuleGetFunction, "cuModuleGetFunction");
    sym(d.cuFuncSetAttribute, "cuFuncSetAttribute");
    sym(d.cuFuncGetAttribute, "cuFuncGetAttribute");
    sym(d.cuLaunchKernel, "cuLaunchKernel");
    sym(d.cuLaunchKernelEx, "cuLaunchKernelEx");
    sym(d.cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters");
    sym(d.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    sym(d.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");
    sym(d.cuTensorMapEncodeIm2col, "cuTensorMapEncodeIm2col");
    if (missing) return d;
    CUresult r = d.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char* n = nullptr;
        d.cuGetErrorName(r, &n);
        d.why_not = fmt::format("cuInit failed: {} (no usable NVIDIA GPU or driver)", n ? n : "unknown error");
        return d;
    }
    d.cuDriverGetVersion(&d.version);
    d.loaded = true;
    return d;  // the library stays loaded for the life of the process
}

} // namespace

const Driver& driver() {
    static const Driver d = load();
    return d;
}

std::string describe(CUresult r, const char* call) {
    const Driver& d = driver();
    const char* name = nullptr;
    const char* text = nullptr;
    if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
    if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
    return fmt::format("{}: {} ({})", call, name ? name : fmt::format("CUresult {}", (int)r), text ? text : "no description");
}

void check(CUresult r, const char* call) {
    if (r != CUDA_SUCCESS) throw Error("CUDA driver call failed: " + describe(r, call), Error::Kind::Runtime);
}

} // namespace kiln::cuda
