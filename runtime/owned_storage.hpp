// Storage that knows the Context that allocated it, so an expression can find where to run
// (kiln::eval) and an assignment can refuse operands that live on another device.
#pragma once
#include "ir/storage.hpp"

namespace kiln {

class Context;

struct OwnedStorage : Storage {
    Context* owner = nullptr;
};

} // namespace kiln
