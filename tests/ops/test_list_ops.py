"""TensorList ops as sequences (a variant cannot be fed to tf.raw_ops from numpy): each sequence is run
in TensorFlow eagerly and with our ops, and every tensor read out must match."""
import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.frontend.tf.tf import import_tf
from ascend_emu.ops import run_op
from ascend_emu.ops.list_ops import TensorList

tf = import_tf()
raw = tf.raw_ops
rng = np.random.default_rng(3)
X = rng.standard_normal((5, 2, 3)).astype(np.float32)
ES = np.array([2, 3], np.int32)
F32 = "float32"


def test_reserve_set_get_stack_length_shape():
    t = raw.TensorListReserve(element_shape=ES, num_elements=4, element_dtype=tf.float32)
    (o,) = run_op("TensorListReserve", ES, np.int32(4), element_dtype=F32)
    assert isinstance(o, TensorList) and np.shape(o) == ()
    for i in (2, 0, 3, 1):
        t = raw.TensorListSetItem(input_handle=t, index=i, item=X[i])
        (o,) = run_op("TensorListSetItem", o, np.int32(i), X[i], element_dtype=F32)
    for i in range(4):
        r = raw.TensorListGetItem(input_handle=t, index=i, element_shape=ES, element_dtype=tf.float32).numpy()
        (g,) = run_op("TensorListGetItem", o, np.int32(i), ES, element_dtype=F32)
        np.testing.assert_array_equal(g, r)
    r = raw.TensorListStack(input_handle=t, element_shape=ES, element_dtype=tf.float32).numpy()
    (g,) = run_op("TensorListStack", o, ES, element_dtype=F32)
    assert g.shape == r.shape == (4, 2, 3) and g.dtype == r.dtype
    np.testing.assert_array_equal(g, r)
    (n,) = run_op("TensorListLength", o)
    assert n == raw.TensorListLength(input_handle=t).numpy() == 4 and n.dtype == np.int32 and n.shape == ()
    (s,) = run_op("TensorListElementShape", o, shape_type="int32")
    np.testing.assert_array_equal(s, raw.TensorListElementShape(input_handle=t, shape_type=tf.int32).numpy())


def test_from_tensor_push_back_and_unset_elements_read_as_zeros():
    t = raw.TensorListFromTensor(tensor=X, element_shape=ES)
    (o,) = run_op("TensorListFromTensor", X, ES, element_dtype=F32)
    t = raw.TensorListPushBack(input_handle=t, tensor=X[0] * 2)
    (o,) = run_op("TensorListPushBack", o, X[0] * 2, element_dtype=F32)
    np.testing.assert_array_equal(run_op("TensorListStack", o, ES, element_dtype=F32)[0],
                                  raw.TensorListStack(input_handle=t, element_shape=ES, element_dtype=tf.float32))
    e = raw.TensorListReserve(element_shape=ES, num_elements=2, element_dtype=tf.float32)
    (p,) = run_op("TensorListReserve", ES, np.int32(2), element_dtype=F32)
    np.testing.assert_array_equal(run_op("TensorListGetItem", p, np.int32(1), ES, element_dtype=F32)[0],
                                  raw.TensorListGetItem(input_handle=e, index=1, element_shape=ES,
                                                        element_dtype=tf.float32))
    (q,) = run_op("EmptyTensorList", ES, np.int32(-1), element_dtype=F32)
    assert run_op("TensorListLength", q)[0] == 0


def test_setting_a_list_leaves_the_old_one_unchanged_and_bad_index_is_an_error():
    (a,) = run_op("TensorListReserve", ES, np.int32(2), element_dtype=F32)
    (b,) = run_op("TensorListSetItem", a, np.int32(0), X[0], element_dtype=F32)
    assert a.items[0] is None and b.items[0] is not None
    with pytest.raises(AscendEmuError, match="index 5 is outside a list of 2 elements"):
        run_op("TensorListGetItem", b, np.int32(5), ES, element_dtype=F32)


def test_pop_back_returns_the_last_element_and_the_shorter_list():
    t = raw.TensorListFromTensor(tensor=X, element_shape=ES)
    (o,) = run_op("TensorListFromTensor", X, ES, element_dtype=F32)
    for _ in range(2):
        t, r = raw.TensorListPopBack(input_handle=t, element_shape=ES, element_dtype=tf.float32)
        o, g = run_op("TensorListPopBack", o, ES, element_dtype=F32)
        np.testing.assert_array_equal(g, r.numpy())
    np.testing.assert_array_equal(run_op("TensorListStack", o, ES, element_dtype=F32)[0],
                                  raw.TensorListStack(input_handle=t, element_shape=ES, element_dtype=tf.float32))
    # an unset element pops as zeros of the element shape, as in TensorFlow
    e = raw.TensorListReserve(element_shape=ES, num_elements=1, element_dtype=tf.float32)
    (p,) = run_op("TensorListReserve", ES, np.int32(1), element_dtype=F32)
    _, r = raw.TensorListPopBack(input_handle=e, element_shape=ES, element_dtype=tf.float32)
    q, g = run_op("TensorListPopBack", p, ES, element_dtype=F32)
    np.testing.assert_array_equal(g, r.numpy())
    with pytest.raises(AscendEmuError, match="empty"):
        run_op("TensorListPopBack", q, ES, element_dtype=F32)
