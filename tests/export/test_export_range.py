"""Exported weights are checked in the type they are written as, before anything is written.

Before: a drafter whose finite fp32 weights exceed f16's range exported with the default `--gguf-type f16`
into a GGUF whose `blk.0.ffn_down.weight` was inf in every value, exit 0.
"""

import pytest
import torch

from eaglewire.export.gguf import check_range
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.weights import check_exported

pytestmark = pytest.mark.unit


def _weights(**over):
    sd = {"layers.0.mlp.down_proj.weight": torch.randn(64, 128), "norm.weight": torch.ones(64),
          "d2t": torch.arange(10)}
    sd.update(over)
    return sd


def test_values_beyond_f16_are_refused_with_the_tensor_and_a_type_that_holds_them():
    sd = _weights(**{"layers.0.mlp.down_proj.weight": torch.full((64, 128), 1e5)})
    assert torch.isinf(sd["layers.0.mlp.down_proj.weight"].half()).all()  # what the GGUF held
    with pytest.raises(EaglewireError) as e:
        check_range(sd, "f16", "ckpt")
    msg = str(e.value)
    assert msg.startswith("ckpt: tensor layers.0.mlp.down_proj.weight cannot be exported as f16: ")
    assert "1e+05" in msg and "65504" in msg and "--gguf-type bf16 or f32" in msg
    check_range(sd, "bf16", "ckpt")
    check_range(sd, "f32", "ckpt")


def test_q8_0_scales_are_f16():
    ok = _weights(**{"layers.0.mlp.down_proj.weight": torch.full((64, 128), 1e5)})
    check_range(ok, "q8_0", "ckpt")  # 1e5 / 127 fits an f16 scale
    big = _weights(**{"layers.0.mlp.down_proj.weight": torch.full((64, 128), 1e8)})
    with pytest.raises(EaglewireError, match="down_proj.weight cannot be exported as q8_0: .*block scale"):
        check_range(big, "q8_0", "ckpt")


def test_one_dimensional_tensors_stay_f32_and_ints_are_not_weights():
    check_range(_weights(**{"norm.weight": torch.full((64,), 1e6), "d2t": torch.full((10,), 10**9)}), "f16", "c")


def test_non_finite_weights_are_refused_in_every_format():
    sd = _weights(**{"norm.weight": torch.tensor([1.0, float("nan")])})
    with pytest.raises(EaglewireError, match="tensor norm.weight cannot be exported as f32: 1 of its 2 values are "
                                             "not finite .*damaged"):
        check_exported(sd, "f32", "ckpt")
    with pytest.raises(EaglewireError, match="norm.weight"):
        check_range(sd, "bf16", "ckpt")


def test_the_export_refuses_before_writing(tiny_drafter, tmp_path):
    """Through `export`: a drafter scaled past f16 is refused, --out never appears; f32 or bf16 would hold it."""
    import shutil

    from safetensors.torch import load_file, save_file

    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export

    ckpt = tmp_path / "drafter"
    shutil.copytree(tiny_drafter[0], ckpt)
    f = next(p for p in ckpt.glob("*.safetensors"))
    sd = load_file(str(f))
    key = next(k for k in sd if "down_proj" in k)
    sd[key] = sd[key] * 0 + 7e4
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(EaglewireError, match="down_proj.weight cannot be exported as f16: .*--gguf-type bf16 or f32"):
        run_export(ExportConfig(ckpt=ckpt, format="gguf", out=tmp_path / "out", verifier="tiny:llama"))
    assert not (tmp_path / "out").exists()
