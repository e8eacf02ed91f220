// The CUDA Driver API, loaded at run time with dlopen. libkiln never links libcuda, so it
// loads, and the CPU backend works, on machines without an NVIDIA driver; the CUDA backend
// asks `driver()` and reports why it is unavailable when the library or a device is missing.
// Types come from the toolkit's cuda.h (headers only, no link); each function is looked up by
// its versioned symbol name (cuMemAlloc_v2, ...), the ABI the header's macros select.
#pragma once
#include <cuda.h>

#include <string>

namespace kiln::cuda {

struct Driver {
    bool loaded = false;
    std::string why_not;   // when !loaded: what failed (dlopen error, missing symbol, cuInit status)
    int version = 0;       // cuDriverGetVersion: 1000 * major + 10 * minor

#define KILN_CU_FN(name) decltype(&::name) name = nullptr;
    KILN_CU_FN(cuGetErrorName)
    KILN_CU_FN(cuGetErrorString)
    KILN_CU_FN(cuInit)
    KILN_CU_FN(cuDriverGetVersion)
    KILN_CU_FN(cuDeviceGetCount)
    KILN_CU_FN(cuDeviceGet)
    KILN_CU_FN(cuDeviceGetName)
    KILN_CU_FN(cuDeviceGetAttribute)
    KILN_CU_FN(cuDeviceTotalMem)
    KILN_CU_FN(cuDevicePrimaryCtxRetain)
    KILN_CU_FN(cuDevicePrimaryCtxRelease)
    KILN_CU_FN(cuCtxSetCurrent)
    KILN_CU_FN(cuStreamCreate)
    KILN_CU_FN(cuStreamDestroy)
    KILN_CU_FN(cuStreamSynchronize)
    KILN_CU_FN(cuStreamWaitEvent)
    KILN_CU_FN(cuEventCreate)
    KILN_CU_FN(cuEventDestroy)
    KILN_CU_FN(cuEventRecord)
    KILN_CU_FN(cuEventSynchronize)
    KILN_CU_FN(cuEventQuery)
    KILN_CU_FN(cuEventElapsedTime)
    KILN_CU_FN(cuMemAlloc)
    KILN_CU_FN(cuMemFree)
    KILN_CU_FN(cuMemGetInfo)
    KILN_CU_FN(cuMemGetAddressRange)
    KILN_CU_FN(cuMemAllocHost)
    KILN_CU_FN(cuMemFreeHost)
    KILN_CU_FN(cuMemcpyHtoDAsync)
    KILN_CU_FN(cuMemcpyDtoHAsync)
    KILN_CU_FN(cuMemcpyDtoDAsync)
    KILN_CU_FN(cuMemsetD8Async)
    KILN_CU_FN(cuModuleLoadData)
    KILN_CU_FN(cuModuleUnload)
    KILN_CU_FN(cuModuleGetFunction)
    KILN_CU_FN(cuFuncSetAttribute)
    KILN_CU_FN(cuFuncGetAttribute)
    KILN_CU_FN(cuLaunchKernel)
    KILN_CU_FN(cuLaunchKernelEx)
    KILN_CU_FN(cuOccupancyMaxActiveClusters)
    KILN_CU_FN(cuOccupancyMaxActiveBlocksPerMultiprocessor)
    KILN_CU_FN(cuTensorMapEncodeTiled)   // TMA descriptors of the sm_90 GEMM kernels
    KILN_CU_FN(cuTensorMapEncodeIm2col)  // and of the sm_90 convolutions' image patches
#undef KILN_CU_FN
};

// The process's driver table, loaded (and cuInit called) on first use. Never throws.
const Driver& driver();

// "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
std::string describe(CUresult r, const char* call);

// Throws kiln::Error (Kind::Runtime) naming the call and the driver's error.
void check(CUresult r, const char* call);

} // namespace kiln::cuda
