"""`doctor dataset`'s match tolerance follows the stored dtype (and the forward's precision).

Datasets stored in fp32 and fp16 pass; a perturbation larger than the dtype's
tolerance but inside bf16's is caught for fp32 and fp16 storage and passes for
bf16 storage, so the tolerance is dtype-specific, not one loose number.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.data.config import DataExtractConfig
from eaglewire.data.pipeline import run_extract
from eaglewire.doctor.dataset import UNIT_ROUNDOFF, doctor_dataset, match_tolerance
from eaglewire.infra.checksums import file_sha256


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """One tiny dataset per storage dtype (same prompts, same target)."""
    from eaglewire_testing.tinydata import build_tiny_dataset

    return {dt: build_tiny_dataset(tmp_path_factory.mktemp(f"tol-{dt}"), n=8, max_new_tokens=16, store_dtype=dt)
            for dt in ("fp32", "fp16", "bf16")}


def _check(rep, name):
    return next(c for c in rep.checks if c.name == name)


def _perturb(src, dst, rel: float, slot: int = 0):
    """Copy a dataset with slot `slot` multiplied by (1 +- rel): a relative RMS error of exactly `rel` before storage."""
    shutil.copytree(src, dst)
    man = json.loads((dst / "manifest.json").read_text())
    g = torch.Generator().manual_seed(0)
    for e in man["shards"]:
        p = dst / e["file"]
        t = load_file(str(p))
        f = t["features"].float()
        sign = torch.randint(0, 2, f[:, slot].shape, generator=g).float() * 2 - 1
        f[:, slot] *= 1 + rel * sign
        t["features"] = f.to(t["features"].dtype).contiguous()
        save_file(t, str(p))
        e.update(bytes=p.stat().st_size, sha256=file_sha256(p))  # intact shards: only the values are in question
    (dst / "manifest.json").write_text(json.dumps(man))
    return dst


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_datasets_stored_in_fp32_and_fp16_pass(stored, tiny_targets, dtype):
    rep = doctor_dataset(stored[dtype], tiny_targets["llama"])
    assert not rep.failed and all(c.ok for c in rep.checks), rep.to_dict()
    tol = rep.data["tolerance"]
    # extraction records its fp32 forward, so fp16 storage gets fp16 rounding only, no half-precision forward
    assert tol["store_dtype"] == dtype and tol["forward_dtype"] == "fp32"
    assert tol["tolerance"] == match_tolerance(dtype, "fp32")
    assert max(s["rel_err"] for s in rep.data["slots"]) < tol["tolerance"]


@pytest.mark.parametrize("dtype,rel", [("fp32", 5e-3), ("fp16", 8e-3)])
def test_a_perturbation_beyond_the_dtype_tolerance_is_caught_but_not_for_bf16(stored, tiny_targets, tmp_path, dtype, rel):
    # all three datasets record their fp32 forward: only the storage dtype differs
    assert match_tolerance(dtype, "fp32") < rel < match_tolerance("bf16", "fp32")
    rep = doctor_dataset(_perturb(stored[dtype], tmp_path / dtype, rel), tiny_targets["llama"])
    c = _check(rep, "slot 0")
    assert rep.failed and not c.ok and "matches no target tensor" in c.detail and dtype in c.detail
    assert _check(rep, "slot 1").ok and _check(rep, "target_hidden").ok
    assert rep.data["slots"][0]["best"] == "layers.1.out"  # still the closest: the tolerance made the difference
    rep = doctor_dataset(_perturb(stored["bf16"], tmp_path / "bf16", rel), tiny_targets["llama"])
    assert not rep.failed and all(c.ok for c in rep.checks), rep.to_dict()


def test_an_fp32_store_of_a_bf16_forward_is_recognised(stored, tiny_targets, tmp_path):
    """A bf16 forward stored in fp32 (bf16 numbers in fp32 slots) gets the bf16 allowance, not fp32's."""
    d = tmp_path / "bf16fwd"
    d.mkdir()
    for name in ("prompts.jsonl", "responses.jsonl", "generate.config.json"):
        shutil.copy(stored["fp32"] / name, d / name)
    run_extract(DataExtractConfig(data=d, target="tiny:llama", device="cpu", dtype="bf16", store_dtype="fp32",
                                  shard_samples=8))
    rep = doctor_dataset(d, tiny_targets["llama"])
    tol = rep.data["tolerance"]
    assert tol["store_dtype"] == "fp32" and tol["forward_dtype"] == "bf16"
    # every slot and target_hidden identified, and the bf16-loaded target is recognised as the same target
    assert all(c.ok for c in rep.checks), rep.to_dict()
    worst = max(max(s["rel_err"] for s in rep.data["slots"]), rep.data["target_hidden"]["rel_err"])
    assert worst > match_tolerance("fp32", "fp32")  # the fp32 bound would have failed a correct dataset


@pytest.mark.parametrize("dtype,torch_dtype", [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_rounding_term_bounds_the_real_cast_and_is_not_loose(dtype, torch_dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 576, generator=g, dtype=torch.float64) * torch.logspace(-2, 3, 64, dtype=torch.float64)[:, None]
    x[:, 7] *= 5  # a massive-activation channel (max ~2e4, inside fp16 range, like the default target)
    err = float((x.to(torch_dtype).double() - x).norm() / x.norm())
    u = UNIT_ROUNDOFF[dtype]
    assert u / 16 < err < 4 * u
