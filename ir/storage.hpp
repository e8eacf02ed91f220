// A block of memory owned by a backend. ir/ only needs its identity, size and where it lives;
// the runtime subclasses it (host memory, device memory) and owns allocation.
#pragma once
#include <kiln/view.hpp>

#include <atomic>
#include <string>
#include <cstddef>
#include <cstdint>

namespace kiln {

struct Storage {
    void* data = nullptr;
    size_t nbytes = 0;
    Device device;
    // Set by the first write (assignment, upload, fill). Reading a tensor whose storage was
    // never written is a user error kiln can detect cheaply: `empty()` followed by a read.
    std::atomic<bool> written{false};
    // Numerics histograms (include/kiln/hist.hpp): the tag the tensors of this memory are counted
    // under after every write, while their context counts named tensors; empty: not counted.
    std::string hist_tag;
    // Bumped after every write into this storage, so graphs can tell a stale read apart.
    virtual ~Storage() = default;
};

} // namespace kiln
