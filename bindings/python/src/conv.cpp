// Convolution for Python: the seeds' ng.conv_layer / deconv_layer / fprop_conv / bprop_conv /
// update_conv with neon's names, argument order and defaults (kiln/conv.hpp has the semantics),
// also as Context methods; kiln.conv (the package) is the NumPy-style form over them.
#include "binding.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

namespace kiln::py {

namespace {

using namespace nb::literals;

ConvOptions options(nb::handle X, nb::handle bias, nb::handle bsum, double alpha, double beta, bool relu, bool brelu,
                    double slope, const char* op) {
    ConvOptions o;
    o.X = optional_tensor(X, "X", op);
    o.bias = optional_tensor(bias, "bias", op);
    o.bsum = optional_tensor(bsum, "bsum", op);
    o.alpha = alpha;
    o.beta = beta;
    o.relu = relu;
    o.brelu = brelu;
    o.slope = slope;
    return o;
}

} // namespace

void bind_conv(nb::module_& m, nb::handle context_class) {
    nb::class_<ConvLayer>(m, "ConvLayer",
                          "A convolution's geometry (conv_layer, deconv_layer): pass it to fprop_conv, bprop_conv and "
                          "update_conv.")
        .def_prop_ro("dtype", [](const ConvLayer& l) { return dtype_object(l.dtype); })
        .def_ro("N", &ConvLayer::N)
        .def_ro("C", &ConvLayer::C)
        .def_ro("K", &ConvLayer::K)
        .def_prop_ro("D", [](const ConvLayer& l) { return l.image[0]; })
        .def_prop_ro("H", [](const ConvLayer& l) { return l.image[1]; })
        .def_prop_ro("W", [](const ConvLayer& l) { return l.image[2]; })
        .def_prop_ro("T", [](const ConvLayer& l) { return l.filter[0]; })
        .def_prop_ro("R", [](const ConvLayer& l) { return l.filter[1]; })
        .def_prop_ro("S", [](const ConvLayer& l) { return l.filter[2]; })
        .def_prop_ro("M", [](const ConvLayer& l) { return l.output[0]; })
        .def_prop_ro("P", [](const ConvLayer& l) { return l.output[1]; })
        .def_prop_ro("Q", [](const ConvLayer& l) { return l.output[2]; })
        .def_prop_ro("padding", [](const ConvLayer& l) { return std::tuple(l.pad[0], l.pad[1], l.pad[2]); })
        .def_prop_ro("strides", [](const ConvLayer& l) { return std::tuple(l.stride[0], l.stride[1], l.stride[2]); })
        .def_prop_ro("dilation",
                     [](const ConvLayer& l) { return std::tuple(l.dilation[0], l.dilation[1], l.dilation[2]); })
        .def_ro("deconv", &ConvLayer::deconv)
        .def_prop_ro("dimI", [](const ConvLayer& l) { return shape_tuple(l.input_shape()); }, "The shape fprop reads.")
        .def_prop_ro("dimF", [](const ConvLayer& l) { return shape_tuple(l.filter_shape()); }, "The filter's shape.")
        .def_prop_ro("dimO", [](const ConvLayer& l) { return shape_tuple(l.output_shape()); }, "The shape fprop writes.")
        .def_prop_ro("flops", &ConvLayer::flops, "Multiply-adds times two of one fprop.")
        .def("__repr__", &ConvLayer::str);

    m.def(
        "conv_layer",
        [](nb::handle dtype, int64_t N, int64_t C, int64_t K, int64_t D, int64_t H, int64_t W, int64_t T, int64_t R, int64_t S,
           int64_t pad_d, int64_t pad_h, int64_t pad_w, int64_t str_d, int64_t str_h, int64_t str_w, int64_t dil_d,
           int64_t dil_h, int64_t dil_w) {
            return conv_layer(dtype_arg(dtype, "conv_layer"), N, C, K, {D, H, W}, {T, R, S}, {pad_d, pad_h, pad_w},
                              {str_d, str_h, str_w}, {dil_d, dil_h, dil_w});
        },
        "dtype"_a, "N"_a, "C"_a, "K"_a, "D"_a = 1, "H"_a = 1, "W"_a = 1, "T"_a = 1, "R"_a = 1, "S"_a = 1, "pad_d"_a = 0,
        "pad_h"_a = 0, "pad_w"_a = 0, "str_d"_a = 1, "str_h"_a = 1, "str_w"_a = 1, "dil_d"_a = 1, "dil_h"_a = 1,
        "dil_w"_a = 1,
        "N images of C channels (D x H x W, NDHWC) to K channels with a T x R x S filter (KTRSC): the layer object.");
    m.def(
        "deconv_layer",
        [](nb::handle dtype, int64_t N, int64_t C, int64_t K, int64_t M, int64_t P, int64_t Q, int64_t T, int64_t R, int64_t S,
           int64_t pad_d, int64_t pad_h, int64_t pad_w, int64_t str_d, int64_t str_h, int64_t str_w, int64_t dil_d,
           int64_t dil_h, int64_t dil_w) {
            return deconv_layer(dtype_arg(dtype, "deconv_layer"), N, C, K, {M, P, Q}, {T, R, S}, {pad_d, pad_h, pad_w},
                                {str_d, str_h, str_w}, {dil_d, dil_h, dil_w});
        },
        "dtype"_a, "N"_a, "C"_a, "K"_a, "M"_a, "P"_a, "Q"_a, "T"_a = 1, "R"_a = 1, "S"_a = 1, "pad_d"_a = 0, "pad_h"_a = 0,
        "pad_w"_a = 0, "str_d"_a = 1, "str_h"_a = 1, "str_w"_a = 1, "dil_d"_a = 1, "dil_h"_a = 1, "dil_w"_a = 1,
        "The transposed convolution: an input M x P x Q of K channels to C channels; fprop and bprop exchanged.");
    m.def(
        "fprop_conv",
        [](const ConvLayer& layer, nb::handle I, nb::handle F, nb::handle O, nb::handle X, nb::handle bias, nb::handle bsum,
           double alpha, double beta, bool relu, bool brelu, double slope, int64_t repeat, nb::handle) {
            const char* op = "fprop_conv";
            PyTensor i = value_of(I, op), f = value_of(F, op);
            PyTensor& o = out_tensor(O, "O", op);
            const ConvOptions opts = options(X, bias, bsum, alpha, beta, relu, brelu, slope, op);
            check_repeat(repeat, op);
            repeat_unlocked(owner(o), repeat, [&] {
                fprop_conv(layer, i.t, f.t, o.t, opts);
            });
            return nb::borrow(O);
        },
        "layer"_a, "I"_a, "F"_a, "O"_a, "X"_a.none() = nb::none(), "bias"_a.none() = nb::none(), "bsum"_a.none() = nb::none(),
        "alpha"_a = 1.0, "beta"_a = 0.0, "relu"_a = false, "brelu"_a = false, "slope"_a = 0.0, "repeat"_a = 1,
        "layer_op"_a.none() = nb::none(),
        "O = relu_slope(alpha * conv(I, F) + bias) [* brelu(X)] + beta * X (X defaults to O); bsum gets per-channel sums. "
        "layer_op (neon's layer, for its kernel tuning) is accepted and unused: kiln's selector and KILN_AUTOTUNE choose.");
    m.def(
        "bprop_conv",
        [](const ConvLayer& layer, nb::handle F, nb::handle E, nb::handle grad_I, nb::handle X, nb::handle bias,
           nb::handle bsum, double alpha, double beta, bool relu, bool brelu, double slope, int64_t repeat, nb::handle) {
            const char* op = "bprop_conv";
            PyTensor f = value_of(F, op), e = value_of(E, op);
            PyTensor& g = out_tensor(grad_I, "grad_I", op);
            const ConvOptions opts = options(X, bias, bsum, alpha, beta, relu, brelu, slope, op);
            check_repeat(repeat, op);
            repeat_unlocked(owner(g), repeat, [&] {
                bprop_conv(layer, f.t, e.t, g.t, opts);
            });
            return nb::borrow(grad_I);
        },
        "layer"_a, "F"_a, "E"_a, "grad_I"_a, "X"_a.none() = nb::none(), "bias"_a.none() = nb::none(),
        "bsum"_a.none() = nb::none(), "alpha"_a = 1.0, "beta"_a = 0.0, "relu"_a = false, "brelu"_a = false, "slope"_a = 0.0,
        "repeat"_a = 1, "layer_op"_a.none() = nb::none(),
        "grad_I = the fprop epilogue over the gradient of conv(I, F) with respect to I, from E. layer_op: as fprop_conv's.");
    m.def(
        "update_conv",
        [](const ConvLayer& layer, nb::handle I, nb::handle E, nb::handle grad_F, double alpha, double beta, int64_t repeat,
           nb::handle grad_bias, nb::handle) {
            const char* op = "update_conv";
            PyTensor i = value_of(I, op), e = value_of(E, op);
            PyTensor& g = out_tensor(grad_F, "grad_F", op);
            const std::optional<Tensor> gb = optional_tensor(grad_bias, "grad_bias", op);
            check_repeat(repeat, op);
            repeat_unlocked(owner(g), repeat, [&] {
                update_conv(layer, i.t, e.t, g.t, alpha, beta, gb);
            });
            return nb::borrow(grad_F);
        },
        "layer"_a, "I"_a, "E"_a, "grad_F"_a, "alpha"_a = 1.0, "beta"_a = 0.0, "repeat"_a = 1,
        "grad_bias"_a.none() = nb::none(), "layer_op"_a.none() = nb::none(),
        "grad_F = alpha * (the gradient of conv(I, F) with respect to F, from E) + beta * grad_F; grad_bias (where "
        "given, (channels,) or (channels, 1)) = E summed over every axis but the channel, the bias's gradient. "
        "layer_op: as fprop_conv's.");
    m.def(
        "conv_kernel",
        [](const ConvLayer& layer, const std::string& op, nb::handle ctx) {
            return conv_kernel(context_of(ctx, "conv_kernel").c(), layer, op);
        },
        "layer"_a, "op"_a = "fprop", "ctx"_a.none() = nb::none(),
        "How op ('fprop', 'fprop+bsum': a fprop that also sums the output's channels, 'bprop' or 'update') of the "
        "layer runs on ctx (default: the default context): "
        "'implicit-gemm <kernel>', 'implicit-gemm by phase <kernel>' (a strided bprop, one convolution per phase "
        "of the stride), 'implicit-gemm <kernel> (stride folded into <c> channels)' (a strided layer over its image "
        "folded into c channels, as a stride-1 one), 'implicit-gemm <kernel> (channels padded to <c>)' (channels "
        "padded with zeros to a multiple of 8, or of 64 for TMA), 'implicit-gemm <kernel> (into the strided view)' (a "
        "strided 1x1 bprop as the stride-1 1x1 over E), 'narrow <kernel>' (a stride-1 bprop into at most 8 "
        "channels), 'gemm' or 'im2col+gemm'.");
    m.def(
        "from_chwn",
        [](nb::handle x) {
            PyTensor t = value_of(x, "from_chwn");
            return wrap(from_chwn(t.t), t.ctx);
        },
        "x"_a.none(), "neon's (C, [D,] H, W, N) activations or (C, [T,] R, S, K) filters as kiln's (N, ..., C) / (K, ..., C): a copy.");
    m.def(
        "to_chwn",
        [](nb::handle x) {
            PyTensor t = value_of(x, "to_chwn");
            return wrap(to_chwn(t.t), t.ctx);
        },
        "x"_a.none(), "kiln's (N, ..., C) activations or (K, ..., C) filters in neon's layout (C, ..., N): a copy.");
    // The same as methods of Context (the seeds' ng.conv_layer, ng.fprop_conv, ...).
    nb::object staticmethod = nb::module_::import_("builtins").attr("staticmethod");
    for (const char* name : {"conv_layer", "deconv_layer", "fprop_conv", "bprop_conv", "update_conv"})
        nb::setattr(context_class, name, staticmethod(m.attr(name)));
}

} // namespace kiln::py
