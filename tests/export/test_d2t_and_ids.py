"""Issue 58 / 55: an imported drafter's ids and d2t are read as its engine reads them, or refused; a d2t that maps
two draft ids to one target id is refused at import and export (llama.cpp's converter refuses it too)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire_testing.export_helpers import L, make_ckpt, make_drafter, provenance

pytestmark = pytest.mark.unit


def _export(tmp_path, fmt="vllm", model=None):
    ck = tmp_path / "ck"
    if model is None:
        make_ckpt(ck)
    else:
        from eaglewire.saved.checkpoint import save_checkpoint
        from eaglewire.targets.points import eagle3_default

        save_checkpoint(ck, model, provenance([p.name for p in eagle3_default(L)], L))
    run_export(ExportConfig(ckpt=ck, format=fmt, out=tmp_path / fmt))
    d = tmp_path / fmt
    (d / "eaglewire.export.json").unlink()  # another tool's directory: only config.json and the weights speak
    return d


def _edit_weights(d, fn):
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"))


def _imp(d, tmp_path):
    return run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=L))


def test_top_level_and_nested_ids_that_disagree_are_refused_naming_both(tmp_path):
    d = _export(tmp_path, "vllm")
    cfg = json.loads((d / "config.json").read_text())
    top = cfg["eagle_aux_hidden_state_layer_ids"]
    cfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EaglewireError, match=rf"vllm/config.json: .* = {re.escape(str(top))} at the top level "
                                             r".*\[1, 2, 3\] under eagle_config") as e:
        _imp(d, tmp_path)
    assert "\n" not in str(e.value) and not (tmp_path / "imp").exists()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = top  # the same list in both places is one answer
    (d / "config.json").write_text(json.dumps(cfg))
    assert _imp(d, tmp_path)["ids_found"] == top


def _drafter_on(ids: list[int]):
    m = make_drafter()
    m.set_draft_vocab(torch.tensor(ids))
    return m


def test_absolute_d2t_in_range_without_t2d_is_refused_not_read_as_offsets(tmp_path):
    """Sorted absolute ids read as offsets give other, equally valid ids: nothing in the file tells them apart."""
    ids = [i for i in range(57) if i % 7 != 3][:40]  # neighbours included; ids[i] + i stays below 97
    d = _export(tmp_path, model=_drafter_on(ids))
    _edit_weights(d, lambda sd: (sd.__setitem__("d2t", torch.tensor(ids)), sd.pop("t2d")))
    with pytest.raises(EaglewireError, match=r"d2t reads both as offsets .* and as absolute target ids .* add the t2d"):
        _imp(d, tmp_path)
    assert not (tmp_path / "imp").exists()


def test_absolute_d2t_that_cannot_be_offsets_is_recognised(tmp_path):
    ids = list(range(40, 80))  # as offsets, the last draft ids would leave the 97-token vocabulary
    d = _export(tmp_path, model=_drafter_on(ids))
    _edit_weights(d, lambda sd: (sd.__setitem__("d2t", torch.tensor(ids)), sd.pop("t2d")))
    res = _imp(d, tmp_path)
    assert any("absolute target ids" in n for n in res["inferred"])
    model, _ = load_checkpoint(tmp_path / "imp")
    assert model.draft_target_ids().tolist() == ids


def test_offsets_without_t2d_still_read_as_offsets(tmp_path):
    ids = list(range(10, 50))  # offsets all 10: as absolute ids they would repeat
    d = _export(tmp_path, model=_drafter_on(ids))
    _edit_weights(d, lambda sd: sd.pop("t2d"))
    _imp(d, tmp_path)
    assert load_checkpoint(tmp_path / "imp")[0].draft_target_ids().tolist() == ids


def _duplicate(m):
    """Draft ids 0 and 1 both map to target id 10; t2d then marks one id fewer (as index_fill makes it)."""
    ids = list(range(10, 50))
    m.set_draft_vocab(torch.tensor(ids))
    with torch.no_grad():
        m.d2t[1] = 9  # 1 + 9 = 10
        m.t2d.zero_()
        m.t2d[m.draft_target_ids()] = True
    return m


def test_a_d2t_with_a_repeated_target_id_is_refused_at_import(tmp_path):
    d = _export(tmp_path, "vllm")
    dup = _duplicate(make_drafter())
    _edit_weights(d, lambda sd: sd.update(d2t=dup.d2t.clone(), t2d=dup.t2d.clone()))
    with pytest.raises(EaglewireError, match="d2t maps two draft ids to target id 10"):
        _imp(d, tmp_path)
    assert not (tmp_path / "imp").exists()


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators", "gguf"])
def test_a_d2t_with_a_repeated_target_id_is_refused_at_export(tmp_path, fmt):
    from eaglewire.saved.checkpoint import save_checkpoint
    from eaglewire.targets.points import eagle3_default

    ck = tmp_path / "ck"
    save_checkpoint(ck, _duplicate(make_drafter()), provenance([p.name for p in eagle3_default(L)], L))
    with pytest.raises(EaglewireError, match=r"ck: d2t maps two draft ids to target id 10"):
        run_export(ExportConfig(ckpt=ck, format=fmt, out=tmp_path / "out", verifier="org/target"))
    assert not (tmp_path / "out").exists()
