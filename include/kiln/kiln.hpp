// kiln: a runtime JIT compiler for tensor expressions. The whole public C++ API.
//
//   kiln::Context ctx;                       // KILN_BACKEND=cpu|cuda picks the backend
//   auto A = ctx.array(host, {128, 32}, kiln::DType::Float32);
//   auto C = ctx.empty({128, 1});
//   C[kiln::all] = kiln::mean(kiln::square(A - kiln::mean(A, 1)), 1);   // one fused kernel
//   std::vector<float> out = C.to_vector<float>();
#pragma once
#include <kiln/collectives.hpp>
#include <kiln/context.hpp>
#include <kiln/conv.hpp>
#include <kiln/dtype.hpp>
#include <kiln/error.hpp>
#include <kiln/expr.hpp>
#include <kiln/gemm.hpp>
#include <kiln/grad.hpp>
#include <kiln/hist.hpp>
#include <kiln/nn.hpp>
#include <kiln/shape.hpp>
#include <kiln/tensor.hpp>
#include <kiln/view.hpp>
