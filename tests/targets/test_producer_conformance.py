"""SpecForge's id convention (`eaglewire.targets.producers`) against SpecForge's own code, per PyPI release.

What a SpecForge drafter's `eagle_aux_hidden_state_layer_ids` mean is decided by two codebases:
SpecForge's (which ids it takes, and whom it hands them to) and the SGLang its release installs
(which layers those ids capture). Both are executed here from the releases themselves, downloaded
once into the eaglewire cache like the engine wheels (src/eaglewire_testing/engine_code.py), with
nothing installed or imported from them:

- 0.2.0's wheel: its `Requires-Dist: sglang==` pin, `resolve_eagle_capture_layers` (config ids,
  else [1, L//2-1, L-4]) and `OfflineSGLangCaptureBackend.set_capture_layers`, whose ids then run
  through that SGLang release's own `set_eagle3_layers_to_capture` on Kimi-K2.5 and on Llama;
- 0.1.0 (an sdist only): `OnlineEagle3Model._prepare_data`, which indexes transformers'
  hidden_states at fixed positions and reads no ids.

A release whose pin or capture changes fails here: update `SPECFORGE_SGLANG`.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest

from eaglewire.targets.load import cache_dir
from eaglewire.targets.points import layer_out
from eaglewire.targets.producers import SPECFORGE_SGLANG, Producer, trained_points
from eaglewire_testing.engine_code import (
    SET_LAYERS,
    Package,
    compile_function,
    sglang_layers_to_capture,
    sources,
    wheel,
)

pytestmark = pytest.mark.integration  # SpecForge's and SGLang's own code, from their PyPI releases

L = 61  # Kimi-K2.5
KIMI = "KimiK25ForConditionalGeneration"


def specforge_release(version: str) -> tuple[dict[str, str], list[str]]:
    """(module path -> source, Requires-Dist lines) of a SpecForge release, fetched once by pip.

    0.1.0 exists only as an sdist whose setup.py cannot build (it reads a requirements.txt the sdist
    lacks), so pip fails after unpacking it; `--no-clean` keeps the unpacked tree to read.
    """
    d = cache_dir() / "engine-wheels" / f"specforge-{version}"
    whl = sorted(d.glob("*.whl"))
    tree = d / "src"
    if not whl and not tree.is_dir():
        d.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d), f"specforge=={version}"]
        r = subprocess.run([*pip, "--only-binary", ":all:", "--python-version", "3.11"], capture_output=True, text=True,
                           timeout=600)
        whl = sorted(d.glob("*.whl"))
        if not whl:
            tmp = d / "tmp"
            tmp.mkdir(exist_ok=True)
            r = subprocess.run([*pip, "--no-binary", ":all:", "--no-clean"], capture_output=True, text=True,
                               timeout=600, env={**os.environ, "TMPDIR": str(tmp)})
            found = sorted(tmp.glob("pip-download-*/specforge*/PKG-INFO"))
            if not found:
                pytest.fail(f"could not fetch specforge=={version}: {r.stderr.strip()[-400:]}")
            found[0].parent.rename(tree)
    if whl:
        src = sources(whl[0], "specforge")
        meta = next(v for k, v in _zip_texts(whl[0]).items() if k.endswith(".dist-info/METADATA"))
        return src, Parser().parsestr(meta).get_all("Requires-Dist") or []
    src = {str(p.relative_to(tree)): p.read_text() for p in tree.rglob("*.py") if "egg-info" not in str(p)}
    req = tree / "specforge.egg-info" / "requires.txt"
    return src, [ln.strip() for ln in req.read_text().splitlines() if ln.strip() and not ln.startswith("[")]


def _zip_texts(whl: Path) -> dict[str, str]:
    with zipfile.ZipFile(whl) as z:
        return {n: z.read(n).decode() for n in z.namelist() if n.endswith("METADATA")}


def _function(src: dict[str, str], path: str, name: str, cls: str | None = None, env: dict | None = None):
    tree = ast.parse(src[path])
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body if cls else tree.body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    return compile_function(src[path], path, node, env)


def _sglang_pin(requires: list[str]) -> str | None:
    pins = [m.group(1) for r in requires if (m := re.match(r"^sglang\s*==\s*([\w.]+)", r))]
    assert len(pins) <= 1 and not any(r.startswith("sglang") and "==" not in r for r in requires), requires
    return pins[0] if pins else None


@pytest.mark.parametrize("version", sorted(SPECFORGE_SGLANG))
def test_the_sglang_each_specforge_release_pins(version):
    _, requires = specforge_release(version)
    assert _sglang_pin(requires) == SPECFORGE_SGLANG[version], requires


@pytest.fixture(scope="module")
def specforge_020():
    return specforge_release("0.2.0")[0]


@pytest.fixture(scope="module")
def sglang_pinned():
    """The SGLang SpecForge 0.2.0 installs, its model files as a Package."""
    src = sources(wheel("sglang", SPECFORGE_SGLANG["0.2.0"]), "sglang/srt/models/")
    return Package.parse({k: v.lstrip("\ufeff") for k, v in src.items()}, "sglang.srt.models")  # a file opens with a BOM


def _target_class(pk: Package, name: str):
    for mod, entry in pk.entries:
        ci = pk.lookup(mod, entry)
        if ci is not None and ci.name == name and pk.resolve(ci, SET_LAYERS) is not None:
            return ci
    raise AssertionError(f"{name} is not a registered SGLang target with {SET_LAYERS}")


def _specforge_capture(src: dict[str, str], pk: Package, target: str, draft_config: dict, override=None) -> list:
    """Draft config -> SpecForge 0.2.0's resolved ids -> its capture backend -> SGLang's target class ->
    the points captured (value v of layers_to_capture hooks the stream entering layer v: the output of
    layer v-1, as tests/export/test_engine_conformance.py executes for the capture sites)."""
    resolve = _function(src, "specforge/algorithms/model_providers.py", "resolve_eagle_capture_layers")
    cfg = SimpleNamespace(model=SimpleNamespace(aux_hidden_state_layer_ids=override))
    ids = resolve(cfg, draft_config, SimpleNamespace(text_config=SimpleNamespace(num_hidden_layers=L)))
    ci, seen = _target_class(pk, target), {}

    class Model:  # SGLang's target class, its own method run on a stub by sglang_layers_to_capture
        def set_eagle3_layers_to_capture(self, layer_ids):
            seen["ids"] = layer_ids
            seen["values"], _ = sglang_layers_to_capture(pk, ci, layer_ids, L)

    setter = _function(src, "specforge/offline_capture/sglang_backend/capture.py", "set_capture_layers",
                       "OfflineSGLangCaptureBackend")
    setter(SimpleNamespace(model_runner=SimpleNamespace(model=Model())), ids, capture_method="eagle3")
    assert seen["ids"] == ids  # handed over unchanged
    return [layer_out(v - 1) for v in sorted(set(seen["values"]))]


@pytest.mark.parametrize("target, arch", [(KIMI, "kimi_k25"), ("LlamaForCausalLM", "LlamaForCausalLM")])
@pytest.mark.parametrize("ids", [[2, 30, 58], [1, 29, 57], [3, 31, 59], None])
def test_specforge_0_2_0_ids_mean_what_its_sglang_captures(specforge_020, sglang_pinned, target, arch, ids):
    draft = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids} if ids is not None else {}}
    got = _specforge_capture(specforge_020, sglang_pinned, target, draft)
    ours, _ = trained_points(draft, Producer("specforge", "0.2.0"), L, arch)
    assert ours == got, (target, ids, got)


def test_the_seeds_ids_through_specforge_0_2_0_on_kimi(specforge_020, sglang_pinned):
    """[2, 30, 58] trained through SpecForge 0.2.0 on Kimi-K2.5 are outputs of layers 1, 29, 57 (SGLang 0.5.14
    reads them without the +1): what SGLang 0.5.23 serves them as, and not what the seeds' classic capture took."""
    draft = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    got = _specforge_capture(specforge_020, sglang_pinned, KIMI, draft)
    assert [p.name for p in got] == ["layers.1.out", "layers.29.out", "layers.57.out"]
    # a run override beats the config's ids (SpecForge's cfg.model.aux_hidden_state_layer_ids)
    assert [p.name for p in _specforge_capture(specforge_020, sglang_pinned, KIMI, draft, [1, 29, 57])] == [
        "layers.1.out", "layers.29.out", "layers.57.out"]


@pytest.mark.parametrize("num_layers", [61, 32, 7])
def test_specforge_0_1_0_captures_fixed_layers_and_reads_no_ids(num_layers):
    src, _ = specforge_release("0.1.0")
    picked = []
    torch = SimpleNamespace(cat=lambda parts, dim: picked.extend(parts) or "features")
    prepare = _function(src, "specforge/core/eagle3.py", "_prepare_data", "OnlineEagle3Model", {"torch": torch})
    states = [f"hf{i}" for i in range(num_layers + 1)]  # transformers: embeddings, then each layer's output
    target = lambda **kw: SimpleNamespace(hidden_states=states, logits=MagicMock())  # noqa: E731
    prepare(SimpleNamespace(target_model=target), input_ids=MagicMock(), attention_mask=None, loss_mask=MagicMock())
    got = [layer_out(int(s[2:]) - 1) for s in picked]  # HF index k: the output of layer k-1
    for ids in ([2, 30, 58], None):
        draft = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
        assert trained_points(draft, Producer("specforge", "0.1.0"), num_layers, None)[0] == got
