"""Misuse is reported where it happens, as a kiln.Error subclass that is also the standard
exception Python users expect, with a message naming the operation, the shapes and dtypes
involved and what would be valid."""
import numpy as np
import pytest

import kiln


@pytest.fixture
def a():
    return kiln.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.fixture
def ints():
    return kiln.asarray(np.arange(6, dtype=np.int8))


def check(excinfo, *substrings):
    msg = str(excinfo.value)
    for s in substrings:
        assert s in msg, f"{s!r} not in the message: {msg}"
    assert "bad_cast" not in msg


# =============================================================================================
# the exception hierarchy


@pytest.mark.parametrize("cls,std", [
    (kiln.InvalidArgument, ValueError), (kiln.DTypeError, TypeError), (kiln.OutOfBounds, IndexError),
    (kiln.OutOfMemory, MemoryError), (kiln.BackendError, RuntimeError), (kiln.CompileError, RuntimeError),
])
def test_hierarchy(cls, std):
    assert issubclass(cls, kiln.Error)
    assert issubclass(cls, std)
    assert issubclass(kiln.Error, Exception)
    assert cls.__module__ == "kiln"


def test_compile_error_is_a_backend_error():
    assert issubclass(kiln.CompileError, kiln.BackendError)
    assert not issubclass(kiln.InvalidArgument, TypeError)
    assert not issubclass(kiln.DTypeError, ValueError)


def test_raised_errors_are_instances_of_both(a):
    with pytest.raises(kiln.InvalidArgument) as ei:
        a + kiln.ones((3, 2))
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, kiln.Error)
    with pytest.raises(IndexError) as ei:
        a[5]
    assert isinstance(ei.value, kiln.OutOfBounds) and isinstance(ei.value, kiln.Error)
    with pytest.raises(TypeError) as ei:
        kiln.zeros(3, dtype="complex64")
    assert isinstance(ei.value, kiln.DTypeError) and isinstance(ei.value, kiln.Error)


# =============================================================================================
# shapes and broadcasting


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "maximum", "less", "power", "floor_divide",
                                  "remainder", "fmod"])
def test_mismatched_broadcast_names_op_and_shapes(a, name):
    with pytest.raises(kiln.InvalidArgument) as ei:
        getattr(kiln, name)(a, kiln.ones((3, 2)))
    check(ei, name, "(2, 3)", "(3, 2)", "broadcast")


def test_mismatched_broadcast_operator(a):
    with pytest.raises(ValueError) as ei:
        a * kiln.ones(4)
    check(ei, "multiply", "(2, 3)", "(4,)")
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.where(a > 0, a, kiln.ones(4))
    check(ei, "where", "(4,)")


def test_mismatched_broadcast_in_nervanagpu(a):
    ng = kiln.NervanaGPU()
    with pytest.raises(kiln.InvalidArgument) as ei:
        ng.add(a, ng.ones((4, 3)))
    check(ei, "add", "(2, 3)", "(4, 3)")


@pytest.mark.parametrize("value_shape", [(4,), (3, 3), (2, 3, 2)], ids=str)
def test_assigning_wrong_shape(a, value_shape):
    with pytest.raises(kiln.InvalidArgument) as ei:
        a[...] = kiln.ones(value_shape)
    check(ei, "assign", str(value_shape), "(2, 3)")
    with pytest.raises(kiln.InvalidArgument) as ei:
        a[:] = kiln.ones(value_shape) * 2
    check(ei, str(value_shape))


def test_assigning_wrong_shape_to_a_slice(a):
    with pytest.raises(kiln.InvalidArgument) as ei:
        a[0] = kiln.ones(4)
    check(ei, "(4,)", "(3,)")
    np.testing.assert_array_equal(a.get(), np.arange(6).reshape(2, 3))  # untouched


def test_assigning_wrong_shape_from_host(a):
    with pytest.raises(ValueError) as ei:
        a[0] = np.ones(4, dtype=np.float32)
    check(ei, "(4,)", "(3,)")


def test_out_of_wrong_shape(a):
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.add(a, 1, out=kiln.zeros((3, 3)))
    check(ei, "(2, 3)", "(3, 3)")


def test_out_must_be_a_tensor(a):
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.add(a, 1, out=np.zeros((2, 3), dtype=np.float32))
    check(ei, "add", "out=")


@pytest.mark.parametrize("shape", [(4, 2), (7,), (-1, 4)], ids=str)
def test_bad_reshape(a, shape):
    with pytest.raises(kiln.InvalidArgument) as ei:
        a.reshape(shape)
    check(ei, "reshape", "(2, 3)")


def test_two_unknown_reshape_dims(a):
    with pytest.raises(kiln.InvalidArgument) as ei:
        a.reshape(-1, -1)
    check(ei, "-1")


def test_bad_transpose_and_squeeze(a):
    with pytest.raises(kiln.InvalidArgument) as ei:
        a.transpose(0, 0)
    check(ei, "transpose", "permutation")
    with pytest.raises(kiln.InvalidArgument) as ei:
        a.transpose(0, 1, 2)
    check(ei, "transpose")
    with pytest.raises(kiln.InvalidArgument) as ei:
        a.squeeze(0)
    check(ei, "squeeze", "axis 0", "(2, 3)")
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.expand_dims(a, 5)
    check(ei, "expand_dims", "5")


def test_negative_dimension():
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.empty((-1, 2))
    check(ei, "negative", "(-1, 2)")


# =============================================================================================
# axes


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var", "std", "argmax", "argmin"])
@pytest.mark.parametrize("axis", [2, -3, 2**40, -2**40 - 1, 2**32])   # (past int32: not wrapped into range)
def test_bad_axis(a, name, axis):
    with pytest.raises(kiln.OutOfBounds) as ei:
        getattr(kiln, name)(a, axis=axis)
    check(ei, name, f"axis {axis}", "rank 2")
    assert isinstance(ei.value, IndexError)


def test_bad_axis_in_tuple(a):
    with pytest.raises(kiln.OutOfBounds) as ei:
        kiln.sum(kiln.ones((2, 3, 4)), axis=(0, 3))
    check(ei, "sum", "axis 3")


def test_axis_of_wrong_type(a):
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.sum(a, axis=1.0)
    check(ei, "sum", "axis", "float")
    with pytest.raises(TypeError):
        kiln.sum(a, axis="0")


@pytest.mark.parametrize("axis", [(0, 0), (1, -1), (0, 1, 0)], ids=str)
def test_repeated_axis(a, axis):
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.sum(a, axis=axis)
    check(ei, "sum", "repeated")


def test_repeated_axis_methods(a):
    with pytest.raises(ValueError, match="repeated"):
        a.mean(axis=(0, -2))
    with pytest.raises(kiln.InvalidArgument, match="repeated"):
        kiln.NervanaGPU().max(a, axis=(1, 1))


def test_int_arguments_past_int32_or_of_other_types(a):
    # Refused by name, never wrapped into range or reported as a failed C++ cast.
    for axis in (2**40, 2, -3):
        with pytest.raises(kiln.OutOfBounds) as ei:
            kiln.take(a, kiln.asarray(np.array([0], dtype=np.int32)), axis=axis)
        check(ei, "take: axis", "out of range for a tensor of rank 2")
    for axis in ("0", 1.0, True):
        with pytest.raises(kiln.DTypeError) as ei:
            kiln.take(a, kiln.asarray(np.array([0], dtype=np.int32)), axis=axis)
        check(ei, "take: axis must be an int")
    ctx = kiln.Context("cpu")
    with pytest.raises(kiln.InvalidArgument) as ei:
        ctx.stochastic_round = 2**40
    check(ei, "stochastic_round = 1099511627776 is not a number of mantissa bits")
    with pytest.raises(kiln.DTypeError) as ei:
        ctx.stochastic_round = "7"
    check(ei, "stochastic_round must be an int, got str")
    assert ctx.stochastic_round == 0
    # n past the axis's length: empty at once (each difference was computed, 2**62 times).
    assert kiln.diff(a, n=2**62).shape == (2, 0) and kiln.diff(a, axis=0, n=5).shape == (0, 3)


def test_tile_and_repeat_past_the_element_limit(a):
    # Refused before any list or index array of that size is built.
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.tile(a, (2**62, 1))
    check(ei, "tile: the result (9223372036854775808, 3) has", "at most 2^60")
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.repeat(a, 2**62, axis=0)
    check(ei, "repeat: the result (9223372036854775808,) has", "at most 2^60")
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.repeat(a, np.array([2**62, 2**62, 1]), axis=1)
    check(ei, "repeat: the result (9223372036854775809,) has")


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_over_a_tuple_of_some_axes(name):
    # NumPy's argmax takes an int or None: a tuple is a TypeError, as there
    t = kiln.ones((2, 3, 4))
    with pytest.raises(kiln.DTypeError) as ei:
        getattr(kiln, name)(t, axis=(0, 1))
    assert isinstance(ei.value, TypeError)
    check(ei, name, "an int or None", "not a tuple")


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_over_a_tuple_of_all_axes(a, name):
    # NumPy's argmax takes an int or None only; a tuple is an error even when it names every axis
    with pytest.raises(kiln.Error) as ei:
        getattr(kiln, name)(a, axis=(0, 1))
    check(ei, name)


def test_axis_on_0d():
    s = kiln.asarray(np.array(2.0, dtype=np.float32))
    with pytest.raises(IndexError) as ei:
        kiln.sum(s, axis=0)
    check(ei, "sum", "axis 0")


def test_zero_size_reduction_without_identity():
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.max(kiln.zeros((0, 3)), axis=0)
    check(ei, "max", "zero-size", "(0, 3)")
    assert kiln.sum(kiln.zeros((0, 3)), axis=0).get().tolist() == [0, 0, 0]


@pytest.mark.parametrize("name", ["var", "std"])
def test_ddof_too_large(a, name):
    with pytest.raises(kiln.InvalidArgument) as ei:
        getattr(kiln, name)(a, axis=1, ddof=3)
    check(ei, name, "ddof=3", "3")
    with pytest.raises(kiln.InvalidArgument) as ei:
        getattr(kiln, name)(a, ddof=6)
    check(ei, "ddof=6")
    with pytest.raises(ValueError):
        getattr(a, name)(axis=0, ddof=2)
    getattr(kiln, name)(a, axis=1, ddof=2)  # one less is fine


@pytest.mark.parametrize("name", ["sum", "max", "argmax", "mean", "var"])
def test_keepdims_takes_what_numpy_takes_and_names_anything_else(a, name):
    f = getattr(kiln, name)
    ref = f(a, axis=1, keepdims=True).get()
    for truthy in (1, np.bool_(True), np.int64(1)):
        np.testing.assert_array_equal(f(a, axis=1, keepdims=truthy).get(), ref)
    assert f(a, axis=1, keepdims=0).shape == (2,)
    assert getattr(a, name)(axis=1, keepdims=1).shape == (2, 1)   # the Tensor method alike
    for bad, tname in ((None, "NoneType"), ("yes", "str"), (1.0, "float")):
        with pytest.raises(kiln.DTypeError) as ei:
            f(a, axis=1, keepdims=bad)
        check(ei, name, "keepdims must be a bool", tname)
        with pytest.raises(TypeError) as ei:
            getattr(a, name)(axis=1, keepdims=bad)
        check(ei, name, "keepdims must be a bool", tname)


@pytest.mark.parametrize("name", ["var", "std"])
def test_ddof_and_correction_are_real_numbers(a, name):
    ref = np.var(a.get(), axis=1, ddof=0.5)
    ref = ref if name == "var" else np.sqrt(ref)
    np.testing.assert_allclose(getattr(kiln, name)(a, axis=1, ddof=np.float32(0.5)).get(), ref, rtol=1e-6)
    np.testing.assert_allclose(getattr(a, name)(axis=1, ddof=0.5).get(), ref, rtol=1e-6)   # the method: fractional too
    np.testing.assert_allclose(getattr(kiln, name)(a, axis=1, correction=0.5).get(), ref, rtol=1e-6)
    for kw in ("ddof", "correction"):
        with pytest.raises(kiln.DTypeError) as ei:
            getattr(kiln, name)(a, axis=1, **{kw: "1"})
        check(ei, name, f"{kw} must be a real number", "str")
    with pytest.raises(kiln.DTypeError) as ei:
        getattr(a, name)(axis=1, ddof=[1])
    check(ei, name, "ddof must be a real number", "list")


def test_set_hist_buffers_names_a_non_int_and_a_value_past_its_range():
    ctx = kiln.Context("cpu")
    with pytest.raises(kiln.DTypeError) as ei:
        ctx.set_hist_buffers("64")
    check(ei, "set_hist_buffers", "hist_bins must be an int", "str")
    with pytest.raises(kiln.DTypeError) as ei:
        ctx.set_hist_buffers(64, 1.5)
    check(ei, "set_hist_buffers", "hist_offset must be an int", "float")
    with pytest.raises(kiln.InvalidArgument) as ei:
        ctx.set_hist_buffers(2**40)   # past an int: the range check, not a wrapped value
    check(ei, "set_hist_buffers", "hist_bins=1099511627776", "valid: 1 to")
    ctx.set_hist_buffers(np.int64(16), -8)
    assert (ctx.hist_bins, ctx.hist_offset) == (16, -8)


@pytest.mark.parametrize("call,op", [
    (lambda a: kiln.sum(None), "sum"), (lambda a: kiln.exp(None), "exp"), (lambda a: kiln.add(a, None), "add"),
    (lambda a: kiln.where(None, a, 1), "where"),
    (lambda a: kiln.nn.softmax(None), "softmax"), (lambda a: kiln.nn.relu(None), "relu"),
    (lambda a: kiln.nn.sigmoid_grad(None), "activation_grad"), (lambda a: kiln.nn.cross_entropy(None, a), "cross_entropy"),
])
def test_none_as_an_operand_is_named(a, call, op):
    with pytest.raises(kiln.DTypeError) as ei:
        call(a)
    check(ei, op, "operand of type NoneType")
    assert "incompatible function arguments" not in str(ei.value)


def test_nn_layer_parameters_of_the_wrong_type_are_named():
    x = kiln.asarray(np.random.default_rng(0).random((2, 3, 3, 8), dtype=np.float32))
    for kw, name, tname in (({"slope": "a"}, "slope", "str"), ({"slope": None}, "slope", "NoneType")):
        with pytest.raises(kiln.DTypeError) as ei:
            kiln.nn.relu(x, **kw)
        check(ei, "relu", f"{name} must be a real number", tname)
        with pytest.raises(kiln.DTypeError) as ei:
            kiln.nn.relu_grad(x, x, **kw)
        check(ei, "relu", f"{name} must be a real number", tname)
    for kw, msg in (({"ascale": "a"}, "ascale must be a real number"), ({"bpower": []}, "bpower must be a real number"),
                    ({"size": 2.5}, "J must be an int, got float"), ({"size": None}, "J must be an int, got NoneType")):
        with pytest.raises(kiln.DTypeError) as ei:
            kiln.nn.lrn(x, **kw)
        check(ei, "lrn", msg)
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.nn.lrn(x, size=2**70)
    check(ei, "lrn_layer", "past 64 bits")
    np.testing.assert_allclose(kiln.nn.relu(x, slope=np.float32(0.5)).get(), kiln.nn.relu(x, slope=0.5).get())


@pytest.mark.parametrize("call,op,name", [
    (lambda a: kiln.flip(None), "flip", "x"), (lambda a: kiln.matmul(a, "m"), "matmul", "x2"),
    (lambda a: kiln.matmul(x1=[1.0], x2=a), "matmul", "x1"), (lambda a: kiln.transpose(3.0), "transpose", "a"),
    (lambda a: kiln.take_along_axis(a, [0]), "take_along_axis", "indices"), (lambda a: kiln.tril(None), "tril", "x"),
    (lambda a: kiln.linalg.vector_norm([1.0, 2.0]), "vector_norm", "x"), (lambda a: kiln.linalg.outer(a, 2), "outer", "x2"),
    (lambda a: kiln.broadcast_arrays(a, None), "broadcast_arrays", "arrays[1]"),
    (lambda a: kiln.meshgrid(object()), "meshgrid", "arrays[0]"), (lambda a: kiln.zeros_like(None), "zeros_like", "a"),
    (lambda a: kiln.full_like([1, 2], 3), "full_like", "a"),
])
def test_array_functions_name_an_operand_that_is_not_an_array(a, call, op, name):
    with pytest.raises(kiln.DTypeError) as ei:
        call(a)
    check(ei, f"{op}: {name} is of type")
    assert "has no attribute" not in str(ei.value)


def test_like_functions_take_a_numpy_array():
    z = kiln.zeros_like(np.ones((2, 3), np.float16))
    assert z.shape == (2, 3) and z.dtype == kiln.float16 and not z.get().any()
    assert kiln.full_like(np.ones(4, np.int32), 7, ctx=kiln.Context("cpu")).get().tolist() == [7, 7, 7, 7]


@pytest.mark.parametrize("call,msg", [
    (lambda x: kiln.empty((2.0, 3)), "empty: shape must be an int or a sequence of ints; (2.0, 3) holds a float"),
    (lambda x: kiln.zeros("ab"), "zeros: shape must be an int or a sequence of ints, got str"),
    (lambda x: kiln.ones(None), "ones: shape must be an int or a sequence of ints, got NoneType"),
    (lambda x: kiln.empty(True), "empty: shape must be an int or a sequence of ints, got bool"),
    (lambda x: kiln.reshape(x, [[1]]), "reshape: shape must be an int or a sequence of ints; ([1],) holds a list"),
    (lambda x: kiln.broadcast_to(x, (2, None)), "broadcast_to: shape must be"),
    (lambda x: kiln.tile(x, None), "tile: repetitions must be an int or a sequence of ints"),
    (lambda x: kiln.transpose(x, 1.5), "transpose: axes must be"),
    (lambda x: kiln.permute_dims(x, None), "permute_dims: axes must be"),
    (lambda x: kiln.expand_dims(x, None), "expand_dims: axis must be"),
    (lambda x: kiln.flip(x, "0"), "flip: axis must be an int, got str"),
    (lambda x: kiln.roll(x, 1.5, 0), "roll: shift must be an int, got float"),
    (lambda x: kiln.unstack(x, None), "unstack: axis must be an int, got NoneType"),
    (lambda x: kiln.eye(2.5), "eye: n_rows must be an int, got float"),
    (lambda x: kiln.tril(x, None), "tril: k must be an int, got NoneType"),
    (lambda x: kiln.linspace(0, 1, 2.0), "linspace: num must be an int, got float"),
    (lambda x: kiln.diff(x, n=1.0), "diff: n must be an int, got float"),
    (lambda x: kiln.linalg.matrix_power(x[:2, :2], 2.0), "matrix_power: n must be an int, got float"),
    (lambda x: kiln.concat(None), "concat: arrays is of type NoneType"),
    (lambda x: kiln.stack(3.0), "stack: arrays is of type float"),
])
def test_int_and_shape_arguments_are_named(a, call, msg):
    with pytest.raises(kiln.DTypeError) as ei:
        call(a)
    check(ei, msg)


def test_shapes_and_axes_take_numpy_integers():
    assert kiln.empty(np.int64(3)).shape == (3,)
    assert kiln.zeros((np.int32(2), 3)).shape == (2, 3)
    x = kiln.ones((2, 3))
    assert kiln.expand_dims(x, -1).shape == (2, 3, 1) and kiln.expand_dims(x, (0, 1)).shape == (1, 1, 2, 3)
    assert kiln.transpose(x, [np.int64(1), 0]).shape == (3, 2)
    assert kiln.tile(x, 2).shape == (2, 6)


def test_histogram_tags_and_neon_layout_helpers_name_bad_arguments():
    x = kiln.ones((2, 3))
    for call, msg in ((lambda: kiln.hist(x, None), "hist: tag must be a str, got NoneType"),
                      (lambda: kiln.hist(None, "t"), "hist: expected a kiln tensor or expression, got NoneType"),
                      (lambda: kiln.set_hist_tag(x, 3), "set_hist_tag: tag must be a str, got int"),
                      (lambda: kiln.set_hist_tag(x * 2, "t"), "set_hist_tag: x must be a kiln Tensor"),
                      (lambda: kiln.hist_tag(None), "hist_tag: x must be a kiln Tensor"),
                      (lambda: kiln.dot(x, None), "dot: expected a kiln tensor or expression, got NoneType"),
                      (lambda: kiln.from_chwn(None), "from_chwn: expected a kiln tensor"),
                      (lambda: kiln.to_chwn(None), "to_chwn: expected a kiln tensor")):
        with pytest.raises(kiln.DTypeError) as ei:
            call()
        check(ei, msg)
    kiln.set_hist_tag(x, "w")
    assert kiln.hist_tag(x) == "w"


def test_all_and_any_take_a_numpy_integer_axis_and_name_a_bad_one():
    x = kiln.asarray(np.array([[1, 0, 2], [3, 4, 5]], np.float32))
    assert kiln.all(x, axis=np.int64(1)).get().tolist() == [False, True]   # a TypeError ("not iterable") before
    assert kiln.any(x, axis=(np.int32(0), 1)).get()
    for f, name in ((kiln.all, "all"), (kiln.any, "any")):
        with pytest.raises(kiln.DTypeError) as ei:
            f(x, axis=1.5)
        check(ei, f"{name}: axis must be an int or a sequence of ints, got float")


def test_tensordot_axes_that_are_neither_an_int_nor_a_pair():
    x = kiln.ones((2, 3))
    for bad in (1.5, None, (1,), ([1], [1], [0])):
        with pytest.raises(kiln.DTypeError) as ei:
            kiln.tensordot(x, x, axes=bad)
        check(ei, "tensordot: axes=", "an int or a pair")
    assert kiln.tensordot(x, x, axes=([1], [1])).shape == (2, 2)


# =============================================================================================
# dtypes


@pytest.mark.parametrize("spelling", ["float64", np.float64, np.dtype("float64"), "f8", "double"], ids=str)
def test_float64_spellings_make_float64(spelling):
    assert kiln.zeros((2,), dtype=spelling).dtype == np.dtype("float64")


@pytest.mark.parametrize("spelling", ["complex64", np.complex64, np.dtype("c8")], ids=str)
def test_a_dtype_kiln_lacks_names_the_valid_dtypes(spelling):
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.zeros((2,), dtype=spelling)
    check(ei, "complex64", "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint64",
          "uint32", "uint16", "uint8", "bool")


@pytest.mark.parametrize("spelling", ["complex64", np.complex128, "float128"], ids=str)
def test_other_unsupported_dtypes(spelling):
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.dtype(spelling)
    check(ei, "float32", "int8")


def test_not_a_dtype():
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.dtype("foo")
    check(ei, "'foo'", "not a dtype", "float32")
    with pytest.raises(TypeError):
        kiln.dtype(object())


def test_astype_to_a_dtype_kiln_lacks(a):
    with pytest.raises(kiln.DTypeError) as ei:
        a.astype(np.complex64)
    check(ei, "complex64", "float64")
    assert a.astype(np.float64).dtype == np.dtype("float64")
    assert a.astype(np.uint64).dtype == np.dtype("uint64")


@pytest.mark.parametrize("operand", [np.ones(3, dtype=np.float32), np.ones((2, 3)), [1.0, 2.0, 3.0]],
                         ids=["ndarray-f32", "ndarray-f64", "list"])
def test_numpy_array_operand_is_refused(a, operand):
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.add(a, operand)
    check(ei, "add", "kiln.asarray")


def test_numpy_array_operand_in_operators(a):
    h = np.ones(3, dtype=np.float32)
    with pytest.raises(kiln.DTypeError) as ei:
        a + h
    check(ei, "kiln.asarray")
    with pytest.raises(TypeError) as ei:
        h + a  # NumPy defers to kiln (__array_ufunc__ = None), which refuses the host array
    check(ei, "kiln.asarray")
    with pytest.raises(kiln.DTypeError) as ei:
        a.__iadd__(h)
    check(ei, "kiln.asarray")
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.NervanaGPU().multiply(a, h)
    check(ei, "multiply", "kiln.asarray")


def test_floor_division_operators_refuse_host_arrays_and_other_objects(a):
    h = np.ones(3, dtype=np.float32)
    for f in (lambda: a // h, lambda: a % h, lambda: divmod(a, h), lambda: a.__ifloordiv__(h),
              lambda: a.__imod__(h)):
        with pytest.raises(kiln.DTypeError) as ei:
            f()
        check(ei, "kiln.asarray")
    for f in (lambda: h // a, lambda: h % a, lambda: divmod(h, a)):  # NumPy defers to kiln, which refuses
        with pytest.raises(TypeError) as ei:
            f()
        check(ei, "kiln.asarray")
    for f in (lambda: a // "x", lambda: None % a, lambda: divmod(a, object()), lambda: divmod(None, a)):
        with pytest.raises(TypeError):  # Python's own: kiln returns NotImplemented
            f()
    for name in ("floor_divide", "remainder", "mod", "fmod", "divmod"):
        with pytest.raises(kiln.DTypeError) as ei:
            getattr(kiln, name)(a, "x")
        check(ei, name, "str")
    with pytest.raises(kiln.InvalidArgument) as ei:
        a // kiln.ones(4)
    check(ei, "floor_divide", "(2, 3)", "(4,)")
    with pytest.raises(kiln.InvalidArgument) as ei:
        divmod(kiln.ones(4), a)
    check(ei, "floor_divide", "(4,)", "(2, 3)")


def test_non_numeric_operand(a):
    with pytest.raises(TypeError) as ei:
        kiln.add(a, "x")
    check(ei, "add", "str")
    with pytest.raises(TypeError):
        a + object()


def test_integer_operand_too_large(a):
    # NumPy 2: a float tensor takes any Python int as a float value; an integer tensor checks it
    np.testing.assert_array_equal(np.asarray(a + 2 ** 70), np.arange(6, dtype=np.float32).reshape(2, 3) + 2 ** 70)
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.asarray(np.arange(3, dtype=np.int32)) + 2 ** 70
    check(ei, "add", "1180591620717411303424", "int32")
    with pytest.raises(kiln.InvalidArgument) as ei:
        a + 10 ** 400
    check(ei, str(10 ** 400), "beyond every kiln dtype's range")


@pytest.mark.parametrize("dtype,lit", [(np.int8, 1000), (np.int8, -129), (np.uint8, -3), (np.uint8, 256),
                                       (np.int32, 2 ** 31)], ids=str)
def test_integer_literal_out_of_range_for_the_tensor(dtype, lit):
    t = kiln.asarray(np.arange(4, dtype=dtype))
    with pytest.raises(kiln.InvalidArgument) as ei:
        t + lit
    check(ei, "add", str(lit), np.dtype(dtype).name)
    with pytest.raises(kiln.InvalidArgument) as ei:
        t // lit
    check(ei, "floor_divide", str(lit), np.dtype(dtype).name)
    with pytest.raises(kiln.InvalidArgument) as ei:
        lit % t
    check(ei, "remainder", str(lit), np.dtype(dtype).name)
    (t < lit).eval()  # comparisons compare the true values


@pytest.mark.parametrize("values", [[2 ** 31], [-2 ** 31 - 1], [0, 2 ** 40]], ids=str)
def test_int64_values_out_of_int32_range(values):
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.asarray(np.array(values, dtype=np.int64))
    check(ei, "int32", str(max(values, key=abs)))
    with pytest.raises(ValueError):
        kiln.array(values)


@pytest.mark.parametrize("dtype,values", [(np.int8, [300]), (np.uint8, [-1]), (np.int8, [-129, 5])], ids=str)
def test_values_out_of_small_integer_range(dtype, values):
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.array(values, dtype=dtype)
    check(ei, np.dtype(dtype).name)


def test_object_data():
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.array([object(), 1])
    check(ei, "object")


def test_bool_and_integer_restrictions(a, ints):
    assert (ints ** 2).dtype == ints.dtype   # integer powers are integers, as NumPy's
    b = a > 1
    with pytest.raises(kiln.DTypeError) as ei:
        b - b
    check(ei, "subtract", "bool")
    with pytest.raises(kiln.DTypeError) as ei:
        -b
    check(ei, "negative", "bool")
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.sgn(b)
    check(ei, "sgn", "bool")


def test_float_indices(a):
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.take(a, a)
    check(ei, "take", "integer", "float32")
    with pytest.raises(IndexError) as ei:
        a[kiln.asarray(np.array([0.0, 1.0], dtype=np.float32))]
    check(ei, "float32", "integer")


# =============================================================================================
# reading memory that was never written


def test_reading_an_empty_tensor():
    e = kiln.empty((2, 2))
    with pytest.raises(kiln.InvalidArgument) as ei:
        e.get()
    check(ei, "never written", "(2, 2)", "float32")
    with pytest.raises(kiln.InvalidArgument, match="never written"):
        np.asarray(e)
    with pytest.raises(kiln.InvalidArgument, match="never written"):
        float(kiln.empty(()))


def test_using_an_empty_tensor_in_an_expression():
    e = kiln.empty(3, dtype=np.int8)
    out = kiln.zeros(3, dtype=np.int8)
    with pytest.raises(kiln.InvalidArgument) as ei:
        out[...] = e + 1
    check(ei, "never written", "int8")


def test_empty_tensor_is_readable_once_written():
    e = kiln.empty((2, 2))
    e[...] = 1.5
    np.testing.assert_array_equal(e.get(), np.full((2, 2), 1.5, np.float32))
    p = kiln.empty(4, dtype=np.int8)
    p[1:3] = 7
    np.testing.assert_array_equal(p[1:3].get(), [7, 7])


# =============================================================================================
# indexing


@pytest.mark.parametrize("key,text", [(2, "index 2"), (-3, "index -3"), ((0, 3), "index 3"), ((slice(None), -4), "-4")],
                         ids=str)
def test_index_out_of_bounds(a, key, text):
    with pytest.raises(kiln.OutOfBounds) as ei:
        a[key]
    check(ei, text, "out of bounds")
    assert isinstance(ei.value, IndexError)


def test_setitem_out_of_bounds(a):
    with pytest.raises(IndexError) as ei:
        a[2] = 1.0
    check(ei, "out of bounds")


def test_too_many_indices(a):
    with pytest.raises(kiln.OutOfBounds) as ei:
        a[0, 0, 0]
    check(ei, "too many indices", "(2, 3)")
    with pytest.raises(IndexError):
        a[0, ..., 0, 0]


def test_two_ellipses(a):
    with pytest.raises(IndexError) as ei:
        a[..., ...]
    check(ei, "ellipsis")


@pytest.mark.parametrize("key", ["x", 1.5, {1: 2}], ids=str)
def test_invalid_index_type(a, key):
    with pytest.raises(IndexError) as ei:
        a[key]
    check(ei, "not a valid index")


def test_assignment_through_integer_array_index(a):
    with pytest.raises(IndexError) as ei:
        a[kiln.asarray(np.array([0], dtype=np.int32))] = 1.0
    check(ei, "integer-array", "slice")


def test_iteration_past_the_end_stops(a):
    assert len(list(a)) == 2


# =============================================================================================
# Python conversions


def test_bool_of_multi_element(a):
    with pytest.raises(ValueError) as ei:
        bool(a)
    check(ei, "ambiguous", "6 elements")
    with pytest.raises(ValueError):
        if a > 2:
            pass
    with pytest.raises(ValueError):
        bool(a.sum(axis=0))


def test_float_int_of_multi_element(a):
    with pytest.raises(TypeError) as ei:
        float(a)
    check(ei, "size-1", "size 6")
    with pytest.raises(TypeError):
        int(a)


def test_index_of_non_integer():
    with pytest.raises(TypeError):
        [1, 2, 3][kiln.asarray(np.array(1.0, dtype=np.float32))]


def test_len_of_0d():
    with pytest.raises(TypeError) as ei:
        len(kiln.zeros(()))
    check(ei, "0-d")


# =============================================================================================
# contexts


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu", "CPU0"])
def test_unknown_device_string(device):
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.Context(device)
    check(ei, repr(device), "'cpu'", "'cuda'", "'cuda:N'")


def test_cuda_without_a_gpu():
    if kiln.default_context().backend == "cuda":
        pytest.skip("a GPU is present")
    with pytest.raises(kiln.BackendError) as ei:
        kiln.Context("cuda")
    check(ei, "cuda", "cpu")
    assert isinstance(ei.value, RuntimeError)


@pytest.mark.parametrize("bits", [11, -1, 40])
def test_stochastic_round_out_of_range(bits):
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.NervanaGPU(stochastic_round=bits)
    check(ei, "stochastic_round", str(bits), "1 to 10")


def test_stochastic_round_property_out_of_range():
    ng = kiln.NervanaGPU(stochastic_round=5)
    with pytest.raises(kiln.InvalidArgument) as ei:
        ng.stochastic_round = 20
    check(ei, "stochastic_round", "20")
    assert ng.stochastic_round == 5, "a refused value must leave the setting unchanged"


# =============================================================================================
# the seeds' API


def test_onehot_without_out_or_num_classes():
    ng = kiln.NervanaGPU()
    idx = ng.array(np.array([1, 0], dtype=np.int32), dtype=np.int32)
    with pytest.raises(kiln.InvalidArgument) as ei:
        ng.onehot(idx, axis=0)
    check(ei, "onehot", "out=", "num_classes")
    with pytest.raises(TypeError):
        kiln.onehot(idx)  # num_classes is required by the module function


def test_onehot_bad_arguments():
    idx = kiln.asarray(np.array([1, 0], dtype=np.int32))
    with pytest.raises(kiln.DTypeError) as ei:
        kiln.onehot(kiln.ones(2), 3)
    check(ei, "onehot", "integer")
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.onehot(idx, 0)
    check(ei, "onehot", "num_classes", "0")
    ng = kiln.NervanaGPU()
    with pytest.raises(kiln.InvalidArgument) as ei:   # a std::bad_cast RuntimeError before
        ng.onehot(idx, 0, num_classes=2**63)
    check(ei, "onehot", "num_classes")
    with pytest.raises(kiln.DTypeError) as ei:
        ng.onehot(idx, 0, num_classes="3")
    check(ei, "onehot", "num_classes")
    np.testing.assert_array_equal(np.asarray(ng.onehot(idx, 0, num_classes=np.int64(3))),
                                  np.array([[0, 1], [1, 0], [0, 0]], np.float32))


def test_values_with_an_ndim_that_is_not_an_int_are_not_scalars():
    class Odd:   # has the attributes NumPy scalars have, but ndim is not an int
        ndim = "zero"
        dtype = np.dtype(np.float32)
        __module__ = "numpy"
    with pytest.raises(TypeError):
        kiln.asarray(np.ones(3, np.float32)) + Odd()
    with pytest.raises((TypeError, IndexError, kiln.Error)):
        kiln.asarray(np.ones(3, np.float32))[Odd()]

    class OddName:   # a 0-d "NumPy" value whose dtype's name is not a string
        ndim = 0
        dtype = type("D", (), {"name": 5})()
        __module__ = "numpy"
        def __float__(self):
            return 2.5
    with pytest.raises(kiln.DTypeError, match=r"maximum: an operand of type numpy\.\S*OddName is not a kiln tensor"):
        kiln.maximum(kiln.asarray(np.ones(3, np.float32)), OddName())


@pytest.mark.parametrize("keep", [0, 1.5, -0.2])
def test_dropout_keep_out_of_range(keep):
    ng = kiln.NervanaGPU()
    with pytest.raises(kiln.InvalidArgument) as ei:
        ng.dropout(keep)
    check(ei, "dropout", "keep")


def test_clip_without_bounds(a):
    # No bound at all is x itself (the standard; NumPy 2.1 on).
    np.testing.assert_array_equal(np.asarray(kiln.clip(a, None, None)), np.asarray(a))


def test_arange_zero_step():
    with pytest.raises(kiln.InvalidArgument) as ei:
        kiln.arange(0, 5, 0)
    check(ei, "arange", "step")


def test_a_failed_operation_leaves_the_context_usable(a):
    with pytest.raises(kiln.InvalidArgument):
        a[...] = kiln.ones(7)
    with pytest.raises(kiln.InvalidArgument):
        kiln.empty(3).get()
    b = kiln.zeros((2, 3))
    b[...] = a * 2
    np.testing.assert_array_equal(b.get(), np.arange(6).reshape(2, 3) * 2)


def test_python_m_kiln_warmup_is_the_tool(tmp_path):
    import subprocess
    import sys

    from kiln import warmup

    if warmup.tool() is None:
        pytest.skip("kiln-warmup is not installed beside this Python (a development tree; pip install . installs it)")
    r = subprocess.run([sys.executable, "-m", "kiln.warmup", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage: kiln-warmup MANIFEST" in r.stdout
    r = subprocess.run([sys.executable, "-m", "kiln.warmup", str(tmp_path / "none.jsonl")], capture_output=True, text=True)
    assert r.returncode == 2 and "cannot read manifest" in r.stderr
