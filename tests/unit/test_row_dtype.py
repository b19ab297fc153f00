"""Row dtypes on the wire: names, numbers, and packing both ways against Tensor.to."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ember.ps_server.errors import InvalidArgumentError, OutOfRangeError
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import (
    TORCH_DTYPES,
    packed_not_finite,
    rows_from_wire,
    rows_to_wire,
)


def test_the_numbers_are_the_protos():
    assert {d.name: d.value for d in RowDtype} == dict(pb.RowDtype.items())


def test_names_parse_and_unknown_numbers_are_invalid_argument():
    assert RowDtype.parse("bfloat16") is RowDtype.BFLOAT16
    with pytest.raises(ValueError, match="one of float32, float16, bfloat16"):
        RowDtype.parse("int8")
    with pytest.raises(InvalidArgumentError, match="unknown row dtype -1"):
        RowDtype.from_wire(-1)
    assert [d.itemsize for d in RowDtype] == [4, 2, 2]


@pytest.mark.parametrize("dtype", list(RowDtype))
def test_rows_travel_as_tensor_to_rounds_them_and_come_back_exactly(dtype):
    rows = torch.randn(37, 5, generator=torch.Generator().manual_seed(1)) * 100
    wire = rows_to_wire(rows, dtype, "rows", np.arange(37))
    assert wire.shape == (37, 5) and wire.nbytes == 37 * 5 * dtype.itemsize
    back = rows_from_wire(wire.tobytes(), dtype, 37, 5, "rows")
    assert back.dtype == np.float32
    assert torch.equal(torch.from_numpy(back), rows.to(TORCH_DTYPES[dtype]).float())


def test_a_value_beyond_the_type_is_refused_naming_its_id():
    rows = torch.zeros(3, 2)
    rows[1, 0] = -7e4
    with pytest.raises(OutOfRangeError, match="row of id 12 holds 70000, beyond .* float16"):
        rows_to_wire(rows, RowDtype.FLOAT16, "grads", np.array([11, 12, 13]))
    rows_to_wire(rows, RowDtype.BFLOAT16, "grads", np.array([11, 12, 13]))  # in range
    rows[2, 1] = float("nan")
    with pytest.raises(OutOfRangeError, match="row of id 13 holds a value that is not finite"):
        rows_to_wire(rows[2:], RowDtype.BFLOAT16, "grads", np.array([13]))


@pytest.mark.parametrize("dtype", [RowDtype.FLOAT16, RowDtype.BFLOAT16])
def test_the_bit_test_names_exactly_the_values_that_are_not_finite(dtype):
    """All 65,536 bit patterns of the packed dtype against torch.isfinite of the same bits."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = torch.from_numpy(bits.view(np.int16).copy()).view(TORCH_DTYPES[dtype])
    expected = ~torch.isfinite(values).numpy()
    assert np.array_equal(packed_not_finite(bits, dtype), expected)
    assert expected.sum() == 2 * (1 << (10 if dtype is RowDtype.FLOAT16 else 7))  # inf, NaNs


@pytest.mark.parametrize("dtype", [RowDtype.FLOAT16, RowDtype.BFLOAT16])
def test_the_first_row_that_packs_to_a_value_that_is_not_finite_is_named(dtype):
    rows = torch.ones(5, 3)
    rows[3, 2], rows[1, 0] = float("inf"), float("nan")  # rows 1 and 3 are refused; 1 first
    with pytest.raises(OutOfRangeError, match="row of id 11 holds a value that is not finite"):
        rows_to_wire(rows, dtype, "grads", np.arange(10, 15))
    rows[1, 0] = -3.4e38  # finite in float32, infinite in both packed types
    with pytest.raises(OutOfRangeError, match=r"row of id 11 holds 3.4e\+38, beyond"):
        rows_to_wire(rows, dtype, "grads", np.arange(10, 15))


def test_a_buffer_of_the_wrong_size_for_its_dtype_is_invalid_argument():
    with pytest.raises(InvalidArgumentError, match="3 ids x dim 2 float16 = 12 bytes, got 24"):
        rows_from_wire(bytes(24), RowDtype.FLOAT16, 3, 2, "grads")
