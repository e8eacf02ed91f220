// kiln: a runtime JIT compiler for tensor expressions. The whole public C++ API.
//
//   kiln::Context ctx;                       // KILN_BACKEND=cpu|cuda picks the backend
//   auto A = ctx.array(host, {128, 32}, kiln::DType::Float32);
//   auto C = ctx.empty({128, 1});
//   C[kiln::all] = kiln::mean(kiln::square(A - kiln::mean(A, 1)), 1);   // one fused kernel
//   std::vector<float> out = C.to_vector<float>();
#pragma once
#include "ir/dtype.hpp"
#include "ir/error.hpp"
#include "ir/expr.hpp"
#include "ir/shape.hpp"
#include "ir/view_ops.hpp"
#include "runtime/context.hpp"
#include "runtime/tensor.hpp"
#include "kernels/gemm.hpp"
