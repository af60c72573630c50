"""Published drafter shapes at import: a drafter whose draft layer is not a Llama layer is refused by name."""

from __future__ import annotations

import json

import pytest

from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.export_helpers import L, make_ckpt

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("arch", ["Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"])
def test_an_mla_drafter_is_refused_by_name_with_the_reason(tmp_path, arch):
    make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=tmp_path / "ck", format="vllm", out=tmp_path / "mla"))
    d = tmp_path / "mla"
    (d / "eaglewire.export.json").unlink()  # another tool's directory
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = [arch]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EaglewireError, match=rf"{arch}.*MLA.*cannot be imported") as e:
        run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=L))
    assert "\n" not in str(e.value) and not (tmp_path / "imp").exists()
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]  # the same weights under the Llama-layer class import
    (d / "config.json").write_text(json.dumps(cfg))
    assert run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=L))["ids_found"]
