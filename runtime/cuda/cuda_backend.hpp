// The CUDA backend of a Context: one device, one stream, a caching allocator, host<->device
// copies, and the kernel path kernel IR -> CUDA C (codegen/cuda) -> NVRTC cubin for the
// device's arch -> module -> launch, with the compiled kernels cached in memory by key (and on
// disk, runtime/cache). Every public call makes the device's primary context current on the
// calling thread first, so a Context may be used from any thread (one at a time).
#pragma once
#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/kernel_ir.hpp"
#include "runtime/cuda/allocator.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/kernel_cache.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kiln::cache { class DiskCache; }

namespace kiln::cuda {

struct DeviceInfo {
    int index = 0;
    std::string name;
    int sm = 0;                  // compute capability * 10
    int multiprocessors = 0;
    size_t total_memory = 0;
    int max_shared_optin = 0;    // bytes of dynamic shared memory a block may opt in to
};

struct CudaCounters {
    uint64_t compiles = 0, memory_hits = 0, disk_hits = 0, launches = 0;
    uint64_t cluster_launches = 0;   // launches with a thread-block cluster dimension
    uint64_t aligned_launches = 0;   // launches of a plan's aligned_entry (column vector, row register entries)
    double compile_ms = 0;
};

// A loaded module of a kernel (codegen::CudaModuleId) and its entry points.
struct CudaModule {
    codegen::CudaModuleId id;
    CUmodule module = nullptr;
    std::vector<std::pair<std::string, CUfunction>> entries;
};

// A kernel of the memory cache. Its modules are compiled (or read from disk) and loaded when a
// launch first takes one of their entries: a call compiles only what it runs. Lives as long
// as the backend.
struct CudaKernel {
    kir::Kernel kernel;
    std::string key;
    mutable std::vector<CudaModule> modules;   // loaded so far, in load order
    // The launch plan for the sizes of the last launch, with its entry points resolved: a
    // cached assignment launches with the same sizes every time, so it plans once. Guarded by
    // the backend's one-call-at-a-time rule.
    mutable std::vector<int64_t> planned_sizes;
    mutable codegen::CudaLaunchPlan plan;           // no launches: not planned yet
    mutable std::vector<CUfunction> plan_functions;           // per launch: its entry, null until loaded
    mutable std::vector<CUfunction> plan_aligned_functions;   // per launch: its aligned_entry, null until loaded
};

// How a kernel is launched beyond its grid.
struct LaunchOptions {
    unsigned cluster = 1;       // > 1: thread block clusters of that many blocks along x
    bool cooperative = false;   // every block resident at once (the launch fails rather than run part of the grid)
    // Programmatic stream serialization: the kernel may start before the one before it in
    // the stream has finished, so it must execute griddepcontrol.wait before it touches
    // global memory that kernel may write (kiln's generated kernels and the sm_90 code of its
    // GEMM kernels do; see programmatic_launches).
    bool programmatic = false;
};

class CudaBackend {
public:
    // Throws kiln::Error (Runtime) saying why the device cannot be used.
    explicit CudaBackend(int device_index);
    ~CudaBackend();
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    const DeviceInfo& info() const { return info_; }
    std::string target() const { return "sm_" + std::to_string(info_.sm); }
    CUstream stream() const { return stream_; }
    const std::shared_ptr<Allocator>& allocator() const { return allocator_; }
    void make_current() const;

    // ---- memory (all copies are ordered on the backend's stream; host-side calls return
    // when the data has arrived where the caller can see it)
    void upload(CUdeviceptr dst, const void* src, size_t nbytes);
    void download(void* dst, CUdeviceptr src, size_t nbytes);
    void copy(CUdeviceptr dst, CUdeviceptr src, size_t nbytes);   // asynchronous
    void synchronize();
    // Work submitted to `other` from now on waits for everything submitted here so far.
    void order_before(CUstream other);
    // Work submitted here from now on waits for everything submitted to `other` so far.
    void wait_for(CUstream other);

    // ---- kernels
    // The kernel of `key`, from the memory cache or new; compiles nothing (launch does).
    const CudaKernel* compile(const kir::Kernel& kernel, const std::string& key);
    // Entry `entry` of `k`, its module compiled or read from disk and loaded on first use.
    CUfunction function(const CudaKernel* k, const std::string& entry, codegen::CudaReach reach);
    // Every module of `k` (codegen::cuda_modules) loaded.
    void load_modules(const CudaKernel* k);
    void launch(const CudaKernel* k, const kir::LaunchArgs& args);

    // A precompiled kernel (kernels/): entry `entry` of the module image `image` embedded in the
    // library, loaded on first use and kept for the life of the backend, with its dynamic
    // shared-memory limit raised to at least `dynamic_smem` bytes.
    CUfunction precompiled(const void* image, const std::string& entry, int dynamic_smem);
    // The static shared memory of a function precompiled() returned: the dynamic memory it may
    // be given is the device's opt-in limit less this.
    int static_shared(CUfunction f);
    // Whether kernels whose code waits for the grids before it (griddepcontrol.wait: the
    // generated kernels when compiled for sm_90 or later, kiln's GEMM kernels in their sm_90 code)
    // launch with programmatic stream serialization: on sm_90 and later GPUs unless KILN_PDL=0
    // (read at each call, so that a benchmark can time both ways in one process).
    bool programmatic_launches() const;
    // How many clusters of `cluster` blocks of `f` (`block` threads, `smem` bytes of dynamic
    // shared memory each) the GPU runs at once: the block scheduler places a cluster's blocks on
    // one GPC, so fewer than SMs / cluster where the GPCs' SM counts are not multiples of it.
    // Cached per function and shape. refused_is_none: a query the driver refuses (a non-portable
    // size it does not take) answers 0 rather than throwing.
    int max_active_clusters(CUfunction f, unsigned cluster, unsigned block, unsigned smem, bool refused_is_none = false);
    // The blocks of `f` (`block` threads, `smem` bytes of dynamic shared memory each) that the
    // whole GPU holds at once: one wave. Cached per function and shape; a generated kernel's
    // entries leave the cache when its module is unloaded.
    int64_t resident_blocks(CUfunction f, unsigned block, unsigned smem);
    // The grid of a grid-stride kernel `f` that has `blocks` blocks of work: at most `waves`
    // waves of its resident blocks, at least 1; launched in clusters of `cluster` blocks, waves
    // of the clusters that fit at once (max_active_clusters), at least one cluster.
    int64_t stride_grid(CUfunction f, int64_t blocks, unsigned block, unsigned smem = 0,
                        uint32_t waves = codegen::kGridStrideWaves, unsigned cluster = 1);
    // Launches a precompiled kernel on the backend's stream; `params` as for cuLaunchKernel.
    void launch_precompiled(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block, unsigned smem,
                            void** params, LaunchOptions options = {});

    // At least `nbytes` of device memory that holds zeros whenever no kernel is running:
    // kernels that count in it (the GEMM's bsum turn counters, a full reduction's blocks) set
    // every word they change back to zero before they finish. Zero-filled on the stream when it
    // grows.
    CUdeviceptr zeroed_scratch(size_t nbytes);

    // At least `nbytes` of device memory for 64-bit words tagged in their upper half (the
    // persistent GEMM kernels' bsum partials), and a tag that no word in it holds yet: each call
    // gives a new one. Zero-filled on the stream when it grows and when the tags wrap around.
    struct TaggedScratch {
        CUdeviceptr words;
        uint32_t tag;
    };
    TaggedScratch tagged_scratch(size_t nbytes);

    // The memory cache keeps at most this many kernels (at least 1), evicting the least
    // recently used into a retired list: the caller drops what points at them, then releases.
    void set_kernel_cache_capacity(size_t kernels) { kernels_.set_capacity(kernels); }
    size_t cached_kernels() const { return kernels_.size(); }
    bool has_retired() const { return kernels_.has_retired(); }
    template <class F>
    void for_each_retired(F&& f) const { kernels_.for_each_retired(f); }
    // Unloads the retired kernels' modules (after the stream has finished with them) but those
    // in `keep`, which return to the cache.
    void release_retired(const std::unordered_set<const void*>& keep);

    // With it set, a kernel found in neither cache is an error (KILN_ASSERT_NO_COMPILE).
    void forbid_compiles(bool on) { forbid_compiles_ = on; }

    CudaCounters counters() const { return counters_; }
    void reset_counters() { counters_ = {}; }
    cache::DiskCache* disk_cache() { return disk_.get(); }

private:
    // cuLaunchKernel on the backend's stream, or cuLaunchKernelEx where `options` ask for more
    // (both launch paths, JIT and precompiled, use it).
    void launch_function(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block, unsigned smem,
                         void** params, LaunchOptions options = {});
    // Grows `buf` (of `bytes`) to at least `nbytes`, zero-filled on the stream; false when it
    // was large enough already.
    bool grow_zeroed(CUdeviceptr& buf, size_t& bytes, size_t nbytes);
    void ensure_staging();
    std::vector<char> build(const kir::Kernel& kernel, const std::string& label, const codegen::CudaSource& src,
                            const std::string& key, bool* from_disk, bool use_disk);
    const CudaModule& load_module(const CudaKernel* k, const codegen::CudaModuleId& id);

    DeviceInfo info_;
    codegen::CudaDeviceCaps caps_;
    CUdevice device_ = 0;
    CUcontext ctx_ = nullptr;
    CUstream stream_ = nullptr;
    std::shared_ptr<Allocator> allocator_;
    std::shared_ptr<cache::DiskCache> disk_;  // null: memory-only
    bool dump_source_ = false;
    bool forbid_compiles_ = false;
    // Pinned staging for large copies: pageable memory would make the driver stage it anyway,
    // synchronously and in small pieces.
    void* pinned_[2] = {nullptr, nullptr};
    CUevent pinned_done_[2] = {nullptr, nullptr};
    KernelCache<CudaKernel> kernels_{kernel_cache_capacity_from_env()};
    std::unordered_map<const void*, CUmodule> images_;          // precompiled modules by image
    struct Precompiled {
        CUfunction f;
        int smem_limit;   // its dynamic shared-memory limit: as set, else what 48 KiB leaves beside its static
    };
    std::unordered_map<std::string, Precompiled> precompiled_;   // by entry name
    std::map<std::tuple<CUfunction, unsigned, unsigned, unsigned>, int> max_clusters_;   // max_active_clusters, by its arguments
    std::map<std::tuple<CUfunction, unsigned, unsigned>, int64_t> resident_;                // resident_blocks, by its arguments
    CudaCounters counters_;
    std::vector<uint8_t> arg_bytes_;   // reused for each launch
    CUdeviceptr zeroed_ = 0;           // zeroed_scratch
    size_t zeroed_bytes_ = 0;
    CUdeviceptr tagged_ = 0;           // tagged_scratch
    size_t tagged_bytes_ = 0;
    uint32_t tag_ = 0;                 // the last tag given
};

} // namespace kiln::cuda
