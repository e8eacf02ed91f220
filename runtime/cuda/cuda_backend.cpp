#include "runtime/cuda/cuda_backend.hpp"

#include "runtime/manifest.hpp"

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/env.hpp"
#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cuda/nvrtc.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

namespace kiln::cuda {

namespace {

// Copies at least this large go through pinned staging buffers of this size, double-buffered
// so the host memcpy of one chunk overlaps the DMA of the other.
constexpr size_t kStagingThreshold = 1u << 20;
constexpr size_t kStagingChunk = 8u << 20;

int attribute(CUdevice dev, CUdevice_attribute a) {
    int v = 0;
    check(driver().cuDeviceGetAttribute(&v, a, dev), "cuDeviceGetAttribute");
    return v;
}

// Where a failed kernel's source goes when there is no usable cache directory.
std::string save_failed_source(const std::string& name, const std::string& code) {
    std::error_code ec;
    auto dir = std::filesystem::temp_directory_path(ec) / "kiln-failed-sources";
    std::filesystem::create_directories(dir, ec);
    auto path = dir / (name + ".cu");
    std::ofstream f(path);
    f << code;
    return f ? path.string() : std::string();
}

} // namespace

CudaBackend::CudaBackend(int device_index) {
    const Driver& d = driver();
    if (!d.loaded) throw Error(d.why_not, Error::Kind::Runtime);
    int count = 0;
    check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0) throw Error("the NVIDIA driver reports no CUDA device", Error::Kind::Runtime);
    if (device_index < 0 || device_index >= count)
        fail(Error::Kind::Value, "cuda:{} does not exist: this machine has {} CUDA device(s), cuda:0..cuda:{}", device_index,
             count, count - 1);
    check(d.cuDeviceGet(&device_, device_index), "cuDeviceGet");
    info_.index = device_index;
    char name[256] = {};
    check(d.cuDeviceGetName(name, sizeof name, device_), "cuDeviceGetName");
    info_.name = name;
    info_.sm = 10 * attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) +
               attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    info_.multiprocessors = attribute(device_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    info_.max_shared_optin = attribute(device_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    // Row kernels' row caches: what 1 KiB of static shared memory leaves (compile lowers an
    // entry's limit where it declares more).
    caps_ = codegen::CudaDeviceCaps{info_.sm, info_.multiprocessors,
                                    (size_t)std::max(info_.max_shared_optin - 1024, 48 * 1024 - 1024)};
    caps_.small_rows = env::flag("KILN_SMALL_ROWS").value_or(true);
    check(d.cuDeviceTotalMem(&info_.total_memory, device_), "cuDeviceTotalMem");
    check(d.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
    make_current();
    check(d.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    allocator_ = std::make_shared<Allocator>(device_index, ctx_);
    dump_source_ = env::flag("KILN_DUMP_SOURCE").value_or(false);
    disk_ = std::make_shared<cache::DiskCache>(cache::DiskCacheOptions{"", KILN_VERSION});
    log_info("cuda:{}: {} (sm_{}, {} SMs, {:.1f} GiB), driver {}.{}, NVRTC {}", device_index, info_.name, info_.sm,
             info_.multiprocessors, info_.total_memory / double(1u << 30), d.version / 1000, d.version % 1000 / 10,
             nvrtc_version());
}

CudaBackend::~CudaBackend() {
    const Driver& d = driver();
    make_current();
    d.cuStreamSynchronize(stream_);
    kernels_.for_each([&](CudaKernel& k) {
        for (const CudaModule& m : k.modules) d.cuModuleUnload(m.module);
    });
    for (auto& [image, module] : images_) d.cuModuleUnload(module);
    for (int i = 0; i < 2; ++i) {
        if (pinned_done_[i]) d.cuEventDestroy(pinned_done_[i]);
        if (pinned_[i]) d.cuMemFreeHost(pinned_[i]);
    }
    d.cuStreamDestroy(stream_);
    if (zeroed_) allocator_->release(zeroed_, zeroed_bytes_);
    if (tagged_) allocator_->release(tagged_, tagged_bytes_);
    // Device tensors may outlive their Context: they share the allocator, which needs the
    // primary context, so it is released only when no tensor holds memory any more.
    if (allocator_.use_count() == 1) {
        allocator_->empty_cache();
        d.cuDevicePrimaryCtxRelease(device_);
    }
}

void CudaBackend::make_current() const { driver().cuCtxSetCurrent(ctx_); }

bool CudaBackend::grow_zeroed(CUdeviceptr& buf, size_t& bytes, size_t nbytes) {
    if (nbytes <= bytes) return false;
    make_current();
    // The old buffer goes back to the allocator: whatever reuses it is ordered after the
    // kernels already queued on this stream.
    if (buf) allocator_->release(buf, bytes);
    bytes = std::max<size_t>({nbytes, 2 * bytes, 4096});
    buf = allocator_->allocate(bytes, "compound_dot");
    check(driver().cuMemsetD8Async(buf, 0, bytes, stream_), "cuMemsetD8Async");
    return true;
}

CUdeviceptr CudaBackend::zeroed_scratch(size_t nbytes) {
    grow_zeroed(zeroed_, zeroed_bytes_, nbytes);
    return zeroed_;
}

CudaBackend::TaggedScratch CudaBackend::tagged_scratch(size_t nbytes) {
    if (grow_zeroed(tagged_, tagged_bytes_, nbytes)) {
        tag_ = 1;
    } else if (++tag_ == 0) {   // every tag used: all words back to tag 0
        make_current();
        check(driver().cuMemsetD8Async(tagged_, 0, tagged_bytes_, stream_), "cuMemsetD8Async");
        tag_ = 1;
    }
    return {tagged_, tag_};
}

// The two pinned staging buffers and their events, made on the first large copy.
void CudaBackend::ensure_staging() {
    const Driver& d = driver();
    for (int i = 0; i < 2; ++i) {
        if (!pinned_[i]) check(d.cuMemAllocHost(&pinned_[i], kStagingChunk), "cuMemAllocHost");
        if (!pinned_done_[i]) check(d.cuEventCreate(&pinned_done_[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
}

void CudaBackend::upload(CUdeviceptr dst, const void* src, size_t n) {
    const Driver& d = driver();
    make_current();
    if (n < kStagingThreshold) {
        // Pageable source: the driver has copied it out before the call returns.
        check(d.cuMemcpyHtoDAsync(dst, src, n, stream_), "cuMemcpyHtoDAsync");
        return;
    }
    ensure_staging();
    const char* s = static_cast<const char*>(src);
    for (size_t off = 0, i = 0; off < n; off += kStagingChunk, ++i) {
        int b = (int)(i % 2);
        size_t len = std::min(kStagingChunk, n - off);
        check(d.cuEventSynchronize(pinned_done_[b]), "cuEventSynchronize");  // its previous DMA is done
        std::memcpy(pinned_[b], s + off, len);
        check(d.cuMemcpyHtoDAsync(dst + off, pinned_[b], len, stream_), "cuMemcpyHtoDAsync");
        check(d.cuEventRecord(pinned_done_[b], stream_), "cuEventRecord");
    }
}

void CudaBackend::download(void* dst, CUdeviceptr src, size_t n) {
    const Driver& d = driver();
    make_current();
    if (n < kStagingThreshold) {
        check(d.cuMemcpyDtoHAsync(dst, src, n, stream_), "cuMemcpyDtoHAsync");
        check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize");
        return;
    }
    ensure_staging();
    char* out = static_cast<char*>(dst);
    // Chunk i is in flight while chunk i-1 is copied out of its staging buffer.
    size_t prev_off = 0, prev_len = 0;
    int prev_b = -1;
    for (size_t off = 0, i = 0; off < n; off += kStagingChunk, ++i) {
        int b = (int)(i % 2);
        size_t len = std::min(kStagingChunk, n - off);
        check(d.cuMemcpyDtoHAsync(pinned_[b], src + off, len, stream_), "cuMemcpyDtoHAsync");
        check(d.cuEventRecord(pinned_done_[b], stream_), "cuEventRecord");
        if (prev_b >= 0) {
            check(d.cuEventSynchronize(pinned_done_[prev_b]), "cuEventSynchronize");
            std::memcpy(out + prev_off, pinned_[prev_b], prev_len);
        }
        prev_b = b, prev_off = off, prev_len = len;
    }
    check(d.cuEventSynchronize(pinned_done_[prev_b]), "cuEventSynchronize");
    std::memcpy(out + prev_off, pinned_[prev_b], prev_len);
}

void CudaBackend::copy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    make_current();
    check(driver().cuMemcpyDtoDAsync(dst, src, n, stream_), "cuMemcpyDtoDAsync");
}

void CudaBackend::synchronize() {
    make_current();
    check(driver().cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

namespace {

// `waiter` waits, on the device, for everything submitted to `signaller` so far.
void stream_wait(CUstream waiter, CUstream signaller) {
    const Driver& d = driver();
    CUevent ev = nullptr;
    check(d.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    CUresult r = d.cuEventRecord(ev, signaller);
    if (r == CUDA_SUCCESS) r = d.cuStreamWaitEvent(waiter, ev, 0);
    d.cuEventDestroy(ev);  // released by the driver once the wait has completed
    check(r, "cuStreamWaitEvent");
}

} // namespace

void CudaBackend::order_before(CUstream other) {
    if (other == stream_) return;
    make_current();
    stream_wait(other, stream_);
}

void CudaBackend::wait_for(CUstream other) {
    if (other == stream_) return;
    make_current();
    stream_wait(stream_, other);
}

std::vector<char> CudaBackend::build(const kir::Kernel& kernel, const std::string& label, const codegen::CudaSource& src,
                                     const std::string& key, bool* from_disk, bool use_disk) {
    *from_disk = false;
    // Everything that changes the cubin: the kernel's key (structure, dtypes, layout, target,
    // kiln version), the source itself (which of the kernel's modules) and the NVRTC options;
    // the cache adds arch and toolchain.
    const cache::DiskCacheKey disk_key = cache::cuda_kernel_key(key, src.code, target(), nvrtc_toolchain(src.fast_compile));
    if (dump_source_ && disk_) disk_->save_source(label, src.code);
    if (disk_ && use_disk) {
        if (std::optional<std::vector<char>> hit = disk_->load(disk_key)) {
            *from_disk = true;
            ++counters_.disk_hits;
            return std::move(*hit);
        }
    }
    if (forbid_compiles_) refuse_compile(kernel, target(), disk_ ? disk_->dir() : std::string("(memory only)"));
    NvrtcResult r = nvrtc_compile(src.code, label + ".cu", info_.sm, true, src.fast_compile);
    if (!r.ok) {
        std::string saved = disk_ ? disk_->save_source(label, src.code) : std::string();
        if (saved.empty()) saved = save_failed_source(label, src.code);
        throw CompileError(fmt::format("NVRTC could not compile kernel {} for sm_{} (options: {}){}:\n{}", kernel.name,
                                       info_.sm, r.options, saved.empty() ? "" : "; source saved to " + saved, r.log),
                           r.log, r.options, numbered_source(src.code));
    }
    ++counters_.compiles;
    counters_.compile_ms += r.milliseconds;
    log_debug("compiled {} for sm_{} in {:.1f} ms", label, info_.sm, r.milliseconds);
    if (disk_) disk_->store(disk_key, r.binary);
    return std::move(r.binary);
}

const CudaKernel* CudaBackend::compile(const kir::Kernel& kernel, const std::string& key) {
    if (const CudaKernel* hit = kernels_.find(key)) {
        ++counters_.memory_hits;
        return hit;
    }
    auto k = std::make_unique<CudaKernel>();
    k->kernel = kernel;
    k->key = key;
    return kernels_.insert(key, std::move(k));
}

const CudaModule& CudaBackend::load_module(const CudaKernel* k, const codegen::CudaModuleId& id) {
    for (const CudaModule& m : k->modules)
        if (m.id == id) return m;
    const Driver& d = driver();
    make_current();
    const kir::Kernel& kernel = k->kernel;
    const std::string label = codegen::cuda_module_label(kernel, id);
    bool from_disk = false;
    codegen::CudaSource src = codegen::emit_cuda_module(kernel, id);
    std::vector<char> cubin = build(kernel, label, src, k->key, &from_disk, true);
    CudaModule m;
    m.id = id;
    CUresult loaded = d.cuModuleLoadData(&m.module, cubin.data());
    if (loaded != CUDA_SUCCESS && from_disk) {
        // Verified on load yet refused by the driver (another driver's cubin, say): compile
        // afresh, which also replaces the file.
        log_warn("the cached binary of kernel {} did not load ({}); compiling it again", label,
                 describe(loaded, "cuModuleLoadData"));
        cubin = build(kernel, label, src, k->key, &from_disk, false);
        loaded = d.cuModuleLoadData(&m.module, cubin.data());
    }
    check(loaded, "cuModuleLoadData");
    for (const std::string& e : src.entry_points) {
        CUfunction f = nullptr;
        check(d.cuModuleGetFunction(&f, m.module, e.c_str()), "cuModuleGetFunction");
        // Row kernels size their shared-memory row cache per launch, up to caps_.max_shared
        // (less a histogram's counters).
        // (Up to what the entry's static shared memory leaves: the plans take at most half.)
        if (codegen::cuda_shape(kernel) == codegen::CudaShape::Row) {
            int fixed = 0;
            check(d.cuFuncGetAttribute(&fixed, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f), "cuFuncGetAttribute");
            const int dynamic = std::min((int)(caps_.max_shared - codegen::cuda_hist_shared_bytes(kernel)),
                                         info_.max_shared_optin - fixed);
            const CUresult set = d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic);
            if (set != CUDA_SUCCESS) d.cuModuleUnload(m.module);
            KILN_CHECK_INTERNAL(set != CUDA_ERROR_INVALID_VALUE,
                                "kernel {} entry {}: the driver refused {} bytes of dynamic shared memory beside "
                                "its {} bytes of static shared memory (the device's opt-in limit {})",
                                label, e, dynamic, fixed, info_.max_shared_optin);
            check(set, "cuFuncSetAttribute");
            // Clusters past the portable 8 blocks (plan_cuda_launch's longest cached rows); a
            // driver that refuses leaves launch to plan within 8.
            if (info_.sm >= 90) (void)d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
        }
        m.entries.emplace_back(e, f);
    }
    k->modules.push_back(std::move(m));
    return k->modules.back();
}

CUfunction CudaBackend::function(const CudaKernel* k, const std::string& entry, codegen::CudaReach reach) {
    const CudaModule& m = load_module(k, codegen::cuda_module_of(k->kernel, entry, reach));
    for (const auto& [name, f] : m.entries)
        if (name == entry) return f;
    throw InternalError(fmt::format("kernel {} has no entry point {}", k->kernel.name, entry));
}

void CudaBackend::load_modules(const CudaKernel* k) {
    for (const codegen::CudaModuleId& id : codegen::cuda_modules(k->kernel)) load_module(k, id);
}

void CudaBackend::release_retired(const std::unordered_set<const void*>& keep) {
    if (!kernels_.has_retired()) return;
    const Driver& d = driver();
    make_current();
    check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize");  // no launch of a retired kernel is pending
    kernels_.release_retired(keep, [&](CudaKernel& k) {
        // The driver may hand an unloaded kernel's function handles to a later module.
        for (const CudaModule& m : k.modules) {
            for (const auto& [name, f] : m.entries) {
                std::erase_if(resident_, [f](const auto& r) { return std::get<0>(r.first) == f; });
                std::erase_if(max_clusters_, [f](const auto& r) { return std::get<0>(r.first) == f; });
            }
            d.cuModuleUnload(m.module);
        }
        k.modules.clear();
    });
}

int CudaBackend::static_shared(CUfunction f) {
    int bytes = 0;
    make_current();
    check(driver().cuFuncGetAttribute(&bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f), "cuFuncGetAttribute");
    return bytes;
}

CUfunction CudaBackend::precompiled(const void* image, const std::string& entry, int dynamic_smem) {
    const Driver& d = driver();
    auto it = precompiled_.find(entry);
    if (it == precompiled_.end()) {
        make_current();
        CUmodule& module = images_[image];
        if (!module) {
            const CUresult r = d.cuModuleLoadData(&module, image);
            if (r != CUDA_SUCCESS) {
                images_.erase(image);
                fail(Error::Kind::Runtime, "loading kiln's precompiled kernels for {} ({}) failed: {}", info_.name, target(),
                     describe(r, "cuModuleLoadData"));
            }
        }
        CUfunction f = nullptr;
        check(d.cuModuleGetFunction(&f, module, entry.c_str()), "cuModuleGetFunction");
        // Without the attribute an entry's static and dynamic shared memory share 48 KiB.
        int fixed = 0;
        check(d.cuFuncGetAttribute(&fixed, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f), "cuFuncGetAttribute");
        it = precompiled_.emplace(entry, Precompiled{f, std::max(0, 48 * 1024 - fixed)}).first;
    }
    if (dynamic_smem > it->second.smem_limit) {
        make_current();
        check(d.cuFuncSetAttribute(it->second.f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem),
              "cuFuncSetAttribute");
        it->second.smem_limit = dynamic_smem;
    }
    return it->second.f;
}

int CudaBackend::max_active_clusters(CUfunction f, unsigned cluster, unsigned block, unsigned smem, bool refused_is_none) {
    const auto key = std::make_tuple(f, cluster, block, smem);
    if (auto it = max_clusters_.find(key); it != max_clusters_.end()) return it->second;
    make_current();
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = cluster, cfg.gridDimY = 1, cfg.gridDimZ = 1;
    cfg.blockDimX = block, cfg.blockDimY = 1, cfg.blockDimZ = 1;
    cfg.sharedMemBytes = smem;
    cfg.hStream = stream_;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    const CUresult r = driver().cuOccupancyMaxActiveClusters(&n, f, &cfg);
    if (r != CUDA_SUCCESS && refused_is_none) n = 0;
    else check(r, "cuOccupancyMaxActiveClusters");
    return max_clusters_[key] = n;
}

int64_t CudaBackend::resident_blocks(CUfunction f, unsigned block, unsigned smem) {
    const auto key = std::make_tuple(f, block, smem);
    if (auto it = resident_.find(key); it != resident_.end()) return it->second;
    make_current();
    int n = 0;
    check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, int(block), smem),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    return resident_[key] = std::max<int64_t>(1, int64_t(n) * info_.multiprocessors);
}

int64_t CudaBackend::stride_grid(CUfunction f, int64_t blocks, unsigned block, unsigned smem, uint32_t waves,
                                 unsigned cluster) {
    if (cluster > 1)
        return std::clamp<int64_t>(blocks, cluster,
                                   int64_t(waves) * cluster * std::max(1, max_active_clusters(f, cluster, block, smem)));
    return std::clamp<int64_t>(blocks, 1, int64_t(waves) * resident_blocks(f, block, smem));
}

bool CudaBackend::programmatic_launches() const {
    if (info_.sm < 90) return false;
    return env::flag("KILN_PDL").value_or(true);
}

void CudaBackend::launch_precompiled(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block,
                                     unsigned smem, void** params, LaunchOptions options) {
    make_current();
    launch_function(f, grid_x, grid_y, grid_z, block, smem, params, options);
}

void CudaBackend::launch_function(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block,
                                  unsigned smem, void** params, LaunchOptions options) {
    if (options.cluster > 1 || options.cooperative || options.programmatic) {
        CUlaunchAttribute attrs[3]{};
        unsigned n = 0;
        if (options.cluster > 1) {
            ++counters_.cluster_launches;
            attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = options.cluster;
            attrs[n].value.clusterDim.y = 1;
            attrs[n++].value.clusterDim.z = 1;
        }
        if (options.cooperative) {
            attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attrs[n++].value.cooperative = 1;
        }
        if (options.programmatic) {
            attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n++].value.programmaticStreamSerializationAllowed = 1;
        }
        CUlaunchConfig cfg{};
        cfg.gridDimX = grid_x, cfg.gridDimY = grid_y, cfg.gridDimZ = grid_z;
        cfg.blockDimX = block, cfg.blockDimY = 1, cfg.blockDimZ = 1;
        cfg.sharedMemBytes = smem;
        cfg.hStream = stream_;
        cfg.attrs = attrs;
        cfg.numAttrs = n;
        check(driver().cuLaunchKernelEx(&cfg, f, params, nullptr), "cuLaunchKernelEx");
    } else {
        check(driver().cuLaunchKernel(f, grid_x, grid_y, grid_z, block, 1, 1, smem, stream_, params, nullptr),
              "cuLaunchKernel");
    }
    ++counters_.launches;
}

void CudaBackend::launch(const CudaKernel* ck, const kir::LaunchArgs& a) {
    make_current();
    if (ck->plan.launches.empty() || ck->planned_sizes != a.sizes ||
        (ck->plan.offsets_32 && !codegen::cuda_offsets_fit_32(ck->kernel, a))) {
        ck->plan = codegen::plan_cuda_launch(ck->kernel, a, caps_);
        // A cluster past the portable size is the device's to refuse (GPCs of fewer SMs, MIG):
        // then the plan is made again within it.
        for (const codegen::CudaLaunch& l : ck->plan.launches)
            if (l.cluster > unsigned(codegen::kCudaPortableCluster) &&
                max_active_clusters(function(ck, l.entry, l.reach), l.cluster, l.block, unsigned(l.shared_bytes), true) == 0) {
                codegen::CudaDeviceCaps portable = caps_;
                portable.max_cluster = codegen::kCudaPortableCluster;
                ck->plan = codegen::plan_cuda_launch(ck->kernel, a, portable);
                break;
            }
        // The entries are looked up (their modules loaded) when a launch first takes them.
        ck->plan_functions.assign(ck->plan.launches.size(), nullptr);
        ck->plan_aligned_functions.assign(ck->plan.launches.size(), nullptr);
        ck->planned_sizes = a.sizes;
        if (log_level() >= LogLevel::Debug)
            log_debug("cuda: {} at sizes [{}]: {}", ck->kernel.name, fmt::join(a.sizes, ", "), codegen::describe(ck->plan));
    }
    codegen::CudaLaunchPlan& plan = ck->plan;
    codegen::pack_cuda_args(ck->kernel, a, arg_bytes_);
    CUdeviceptr scratch = 0;
    if (plan.scratch_bytes) scratch = allocator_->allocate(plan.scratch_bytes, "reduction scratch");
    // The allocator hands the scratch to the next request only after this stream's work on it:
    // every user of the backend's memory is ordered on this one stream.
    struct Release {
        Allocator& alloc;
        CUdeviceptr p;
        size_t n;
        ~Release() {
            if (p) alloc.release(p, n);
        }
    } release{*allocator_, scratch, plan.scratch_bytes};
    CUdeviceptr counters = plan.counters ? zeroed_scratch(plan.counters * sizeof(uint32_t)) : 0;
    const bool programmatic = programmatic_launches();   // one environment read for the plan's launches
    for (size_t li = 0; li < plan.launches.size(); ++li) {
        codegen::CudaLaunch& l = plan.launches[li];
        if (l.grid == 0) continue;
        int param = l.param;
        void* params[4] = {arg_bytes_.data(), &scratch, &param, &counters};   // (an entry of 3 reads 3)
        if (!l.aligned_entry.empty() && l.aligned_grid && codegen::cuda_launch_aligned(ck->kernel, a, l)) {
            CUfunction& f = ck->plan_aligned_functions[li];
            if (!f) f = function(ck, l.aligned_entry, l.aligned_reach);
            ++counters_.aligned_launches;
            param = l.aligned_param;
            launch_function(f, unsigned(l.aligned_grid), 1, 1, unsigned(l.aligned_block), 0, params,
                            {.programmatic = programmatic});
            continue;
        }
        CUfunction& f = ck->plan_functions[li];
        if (!f) {
            f = function(ck, l.entry, l.reach);
            if (l.max_waves)   // the plan's wave limit, in this GPU's resident blocks or clusters
                l.grid = uint32_t(stride_grid(f, l.grid, l.block, unsigned(l.shared_bytes), l.max_waves, l.cluster));
        }
        launch_function(f, unsigned(l.grid), 1, 1, unsigned(l.block), unsigned(l.shared_bytes), params,
                        {.cluster = unsigned(l.cluster), .programmatic = programmatic});
    }
}

} // namespace kiln::cuda
