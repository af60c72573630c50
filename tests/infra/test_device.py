"""One dtype table: option names to torch dtypes and back."""

import pytest
import torch

from eaglewire.infra.device import DTYPES, dtype_from_name, dtype_name, resolve_dtype
from eaglewire.infra.errors import EaglewireError


@pytest.mark.parametrize("name,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_short_names_round_trip(name, dtype):
    assert dtype_from_name(name) is dtype and dtype_name(dtype) == name
    assert dtype_from_name(str(dtype).removeprefix("torch.")) is dtype  # torch's own names are accepted too


def test_other_dtypes_have_no_name():
    assert dtype_name(torch.float64) is None and dtype_name(torch.int32) is None


def test_an_unknown_name_is_one_error_line_naming_the_flag():
    with pytest.raises(EaglewireError, match=r"--store-dtype 'int8': expected one of fp32, bf16, fp16"):
        dtype_from_name("int8", "--store-dtype")


def test_resolve_dtype_auto_follows_the_device():
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    assert set(DTYPES.values()) == {torch.float32, torch.bfloat16, torch.float16}
