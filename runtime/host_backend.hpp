// The host's memory and ordering, shared by the backends that run kernels on the CPU (the JIT
// and the interpreter): 64-byte aligned allocations, so vector loads of contiguous data align;
// copies are memcpy; launches complete before they return, so there is nothing to order.
#pragma once
#include <chrono>
#include "runtime/backend.hpp"

namespace kiln {

class HostBackend : public DeviceBackend {
public:
    Device device() const override { return Device{DeviceKind::CPU, 0}; }
    std::string name() const override { return "cpu"; }
    std::string description() const override { return "cpu " + target(); }
    std::string target() const override;

    std::shared_ptr<Storage> allocate(size_t nbytes, const char* op) override;
    void write(Storage& s, size_t byte_offset, const void* src, size_t n) override;
    void read(const Storage& s, size_t byte_offset, void* dst, size_t n) override;
    void synchronize() override {}
    uintptr_t stream() const override { return 0; }
    void order_before(uintptr_t) override {}
    void wait_for(uintptr_t) override {}
    std::shared_ptr<void> new_mark() override { return std::make_shared<double>(-1.0); }
    void record_mark(void* mark) override {
        *static_cast<double*>(mark) =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
    void wait_mark(void*) override {}
    double mark_elapsed_ms(void* start, void* end) override {
        return *static_cast<double*>(end) - *static_cast<double*>(start);
    }
};

// The interpreter as a backend (runtime/kir_interpreter.hpp): "compiling" keeps the kernel IR.
std::unique_ptr<DeviceBackend> make_interpreter_backend();

} // namespace kiln
