"""One code check, two strengths (targets/codecheck.py): what a loader passing trust_remote_code=False may read
(eaglewire itself, vLLM as eaglewire starts it) and what a converter that trusts code may (llama.cpp's).

The directories carry `.py` files that write a marker when imported; the marker must never appear.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from eaglewire.engines.vllm_server import ServeSpec, VllmServer, free_port
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.codecheck import foreign_code, refuse_foreign_code
from eaglewire.targets.load import checked_dir, resolve_target_dir

pytestmark = pytest.mark.unit

_MARKER_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n"


def _kimi(tmp_path, **config_changes):
    """tiny:kimi_k25 as published (auto_map to code transformers implements), with marker-writing code files."""
    d, marker = tmp_path / "kimi", tmp_path / "marker"
    shutil.copytree(resolve_target_dir("tiny:kimi_k25"), d)
    for f in ("configuration_kimi_k25.py", "modeling_kimi_k25.py", "configuration_deepseek.py", "evil.py"):
        (d / f).write_text(_MARKER_CODE.format(marker=str(marker)))
    raw = json.loads((d / "config.json").read_text())
    for key, value in config_changes.items():
        node = raw
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    (d / "config.json").write_text(json.dumps(raw))
    return d, marker


def test_a_native_familys_published_auto_map_goes_to_vllm_but_never_to_a_converter(tmp_path):
    d, marker = _kimi(tmp_path)
    assert json.loads((d / "config.json").read_text())["auto_map"]  # the published layout keeps it
    assert refuse_foreign_code(d, "vLLM server", strict=False) == d
    assert checked_dir(d) == d  # eaglewire's own loading: the same check
    VllmServer(sys.executable, ServeSpec(target_dir=d, drafter_dir=None, port=free_port()), tmp_path / "log").check_inputs()
    with pytest.raises(EaglewireError, match=rf"^{d}: has custom code \(auto_map in config.json\); convert_hf_to_gguf.py "
                                             "could run it, and eaglewire never runs model code"):
        refuse_foreign_code(d, "convert_hf_to_gguf.py")
    assert not marker.exists()


@pytest.mark.parametrize("change, named", [
    ({"auto_map": {"AutoConfig": "evil.Cfg"}}, "auto_map in config.json"),  # a class only the directory has
    ({"text_config.auto_map": {"AutoModel": "evil.Model"}}, "text_config.auto_map in config.json"),  # one level down
    ({"model_type": "my_secret_arch"}, "auto_map in config.json"),  # a family transformers does not implement
    ({"custom_pipelines": {"x": {"impl": "evil.P"}}}, "custom_pipelines in config.json"),
])
def test_code_no_native_class_stands_for_is_refused_for_vllm_in_one_line(tmp_path, change, named):
    d, marker = _kimi(tmp_path, **change)
    assert foreign_code(d, strict=False) == f"has custom code ({named})"
    server = VllmServer(sys.executable, ServeSpec(target_dir=d, drafter_dir=None, port=free_port()), tmp_path / "log")
    with pytest.raises(EaglewireError) as e:
        server.start(timeout=5)
    assert str(e.value) == (f"{d}: has custom code ({named}); vLLM server could run it, and eaglewire never runs "
                            "model code (use a target that transformers supports natively)")
    assert not (tmp_path / "log").exists() and not marker.exists()


def test_a_vllm_command_that_trusts_code_is_refused_even_for_a_native_family(tmp_path):
    d, marker = _kimi(tmp_path)
    spec = ServeSpec(target_dir=d, drafter_dir=None, port=free_port(), extra=["--trust-remote-code"])
    with pytest.raises(EaglewireError, match="--trust-remote-code is not passed by eaglewire"):
        VllmServer(sys.executable, spec, tmp_path / "log").start(timeout=5)
    assert not (tmp_path / "log").exists() and not marker.exists()


def test_the_strict_check_still_reads_every_config_the_loose_one_skips_unreadable_ones(tmp_path):
    """An unreadable generation_config.json cannot be checked for code: a converter that trusts code is refused
    it; a loader passing trust_remote_code=False reads nothing from it that could run."""
    d = tmp_path / "llama"
    shutil.copytree(resolve_target_dir("tiny:llama"), d)
    (d / "generation_config.json").write_text("{not json")
    assert foreign_code(d, strict=True) == ("generation_config.json cannot be read to check it for custom code "
                                            "(JSONDecodeError)")
    assert foreign_code(d, strict=False) is None


def test_a_tokenizers_own_code_goes_to_eaglewires_loader_but_not_to_vllm(tmp_path):
    """Kimi's tokenizer_config names its own tokenizer code: eaglewire reads tokenizer.json instead (load.py,
    which checks only config.json here); vLLM would need that code, so the directory is refused for it."""
    d = tmp_path / "llama"
    shutil.copytree(resolve_target_dir("tiny:llama"), d)
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tok = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (d / "tokenizer_config.json").write_text(json.dumps({**tc, "auto_map": tok}))
    assert checked_dir(d) == d
    assert foreign_code(d, strict=False) == "has custom code (auto_map in tokenizer_config.json)"
    assert foreign_code(d, strict=True) == "has custom code (auto_map in tokenizer_config.json)"
