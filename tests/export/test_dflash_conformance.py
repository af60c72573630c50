"""DFlash ids executed in the pinned engines' own code, against targets/dflash_ids.py and our exports.

vLLM 0.32.0: every config below goes, in ONE run of the pinned venv's Python, through vLLM's
config loading (`get_config`, and for the speculators layout `SpeculatorsConfig` / `update_dflash`)
and the V1 runner's `_get_eagle3_aux_layers_from_config` (src/eaglewire_testing/dflash_vllm_check.py).
SGLang 0.5.23: `set_dflash_layers_to_capture` of llama.py, qwen3.py, deepseek_v2.py and gpt_oss.py
runs on stub models from the cached wheel, and the model's own forward says which stream each value
captures (the harness of test_engine_conformance.py). Missing engines skip locally, fail under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.dflash_ids import dflash_problems, points_from_dflash_ids, vllm_reads_dflash
from eaglewire.targets.points import PINNED, layer_out
from eaglewire_testing.ci import cannot_run
from eaglewire_testing.dflash_export import POINTS, L, make_dflash_ckpt

CHECK = Path(__file__).resolve().parents[2] / "src" / "eaglewire_testing" / "dflash_vllm_check.py"
ZLAB = [1, 14, 28]

# hand-written stubs of the layouts in the wild (docs/parallel-drafters.md §1-2, vLLM pitfalls)
QWEN3 = {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 50}
STUBS = {
    "both-keys-related": {**QWEN3, "eagle_aux_hidden_state_layer_ids": [2, 15, 29],
                          "dflash_config": {"mask_token_id": 16, "target_layer_ids": ZLAB}},
    "both-keys-collide": {**QWEN3, "eagle_aux_hidden_state_layer_ids": ZLAB,
                          "dflash_config": {"mask_token_id": 16, "target_layer_ids": ZLAB}},
    "eagle-config-without-ids": {**QWEN3, "eagle_config": {"use_aux_hidden_state": True},
                                 "dflash_config": {"mask_token_id": 16, "target_layer_ids": ZLAB}},
    "eagle-config-with-ids": {**QWEN3, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 16, 30]},
                              "dflash_config": {"mask_token_id": 16, "target_layer_ids": ZLAB}},
    "top-level-target-ids-only": {**QWEN3, "target_layer_ids": ZLAB, "mask_token_id": 16},
}


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    """Our exports (z-lab and speculators layouts, and a last-layer drafter only vLLM reaches) plus the stubs."""
    d = tmp_path_factory.mktemp("dflash-conf")
    ckpt, _ = make_dflash_ckpt(d / "ckpt")
    last, _ = make_dflash_ckpt(d / "last", points=("layers.1.out", "layers.29.out"))
    out = {}
    for name, src, fmt in (("export-vllm", ckpt, "vllm"), ("export-sglang", ckpt, "sglang"),
                           ("export-speculators", ckpt, "speculators"), ("export-last-layer", last, "vllm")):
        run_export(ExportConfig(ckpt=src, format=fmt, out=d / name, verifier="org/target"))
        out[name] = d / name
    for name, cfg in STUBS.items():
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps(cfg))
        out[name] = d / name
    return out


@pytest.fixture(scope="module")
def vllm_read(configs, vllm_python) -> dict[str, dict]:
    """What vLLM 0.32.0's code makes of each directory, all in one subprocess."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    r = subprocess.run([str(vllm_python), "-P", str(CHECK)], input=json.dumps([str(p) for p in configs.values()]),
                       capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        pytest.fail(f"vLLM's code did not run: {r.stderr.strip()[-800:]}")
    return dict(zip(configs, json.loads(r.stdout.strip().splitlines()[-1]), strict=True))


def test_vllm_reads_every_config_as_vllm_reads_dflash_predicts(configs, vllm_read):
    for name, path in configs.items():
        got = vllm_read[name]
        assert "error" not in got, (name, got)
        ids, key, pts = vllm_reads_dflash(json.loads((path / "config.json").read_text()), L)
        if got["runner"] is None:  # vLLM then takes the target's EAGLE-3 default
            assert key.startswith("none read"), (name, key)
        else:
            assert got["runner"] == ids, (name, got, ids, key)
            assert points_from_dflash_ids(got["runner"], "vllm", L) == pts, name


def test_our_exports_feed_the_trained_points_in_vllm(configs, vllm_read):
    trained = [layer_out(int(p.split(".")[1])) for p in POINTS]
    for name in ("export-vllm", "export-sglang", "export-speculators"):
        got = vllm_read[name]
        assert got["runner"] == [2, 15, 29], name  # vLLM's input-of-layer ids of layers.1/14/28.out
        assert points_from_dflash_ids(got["runner"], "vllm", L) == trained
        assert got["architectures"] == ["DFlashDraftModel"], name
        assert got["dflash_config"]["target_layer_ids"] == ZLAB and got["dflash_config"]["mask_token_id"] == 16
    assert vllm_read["export-vllm"]["eagle_aux_hidden_state_layer_ids"] is None  # one key, no collision
    # speculators -> vLLM (update_dflash): both keys in the +1 relation, and the block left bidirectional
    spec = vllm_read["export-speculators"]
    assert spec["eagle_aux_hidden_state_layer_ids"] == [2, 15, 29] and spec["dflash_config"]["causal"] is False
    assert vllm_read["export-last-layer"]["runner"] == [2, 30]  # layers.29.out: id L, the last layer's output


def test_the_pitfalls_read_as_the_design_note_says(vllm_read):
    assert vllm_read["both-keys-related"]["runner"] == [2, 15, 29]
    assert vllm_read["both-keys-collide"]["runner"] == ZLAB  # read as is: one layer shallower than trained
    assert vllm_read["eagle-config-without-ids"]["runner"] is None  # the target's default, silently
    assert vllm_read["eagle-config-with-ids"]["runner"] == [3, 16, 30]
    assert vllm_read["top-level-target-ids-only"]["runner"] is None


# --- SGLang 0.5.23 ---------------------------------------------------------------------------------

SGLANG_MODELS = {"llama.py": ("LlamaForCausalLM", "LlamaModel"), "qwen3.py": ("Qwen3ForCausalLM", "Qwen3Model"),
                 "deepseek_v2.py": ("DeepseekV2ForCausalLM", "DeepseekV2Model"),
                 "gpt_oss.py": ("GptOssForCausalLM", "GptOssModel")}
SET_DFLASH = "set_dflash_layers_to_capture"


@pytest.fixture(scope="module")
def sglang():
    import zipfile

    from eaglewire_testing.engine_code import Package, wheel

    try:
        whl = wheel("sglang", PINNED["sglang"])
    except EaglewireError as e:
        cannot_run(f"no SGLang {PINNED['sglang']} wheel: {e}")
    with zipfile.ZipFile(whl) as z:
        names = [f"sglang/srt/models/{f}" for f in (*SGLANG_MODELS, "qwen2.py")]
        return Package.parse({n: z.read(n).decode() for n in names}, "sglang.srt.models")


def _sglang_points(pk, outer: str, inner: str, ids: list[int]) -> list:
    """The streams SGLang's own code captures for DFlash ids: the setter, then the model's forward."""
    from eaglewire.targets.points import EMBED
    from eaglewire_testing.engine_code import _stub, run_capture

    ci = next(c for c in pk.classes.values() if c.name == outer)
    s = _stub(pk, ci, L)
    pk.function(pk.resolve(ci, SET_DFLASH), SET_DFLASH)(s, list(ids))
    model = next(c for c in pk.classes.values() if c.name == inner and "layers_to_capture" in pk.src[c.module])
    got = run_capture(pk, model, s.model.layers_to_capture, L)
    return [EMBED if x.index == 0 else layer_out(x.index - 1) for x in got]


@pytest.mark.parametrize("file", list(SGLANG_MODELS))
def test_sglang_dflash_setter_is_the_zlab_numbering(sglang, file):
    outer, inner = SGLANG_MODELS[file]
    assert SET_DFLASH in sglang.resolve(next(c for c in sglang.classes.values() if c.name == outer), SET_DFLASH).methods
    lists = [ZLAB, [0], [1, 9, 17, 25], list(range(0, L - 1, 3))]
    for ids in lists:
        assert _sglang_points(sglang, outer, inner, ids) == points_from_dflash_ids(ids, "zlab", L), (file, ids)
    # the last layer's output (z-lab id L-1): SGLang captures nothing, and our rules refuse it for SGLang
    assert _sglang_points(sglang, outer, inner, [L - 1]) == []
    assert dflash_problems([layer_out(L - 1)], "sglang", L) and not dflash_problems([layer_out(L - 1)], "vllm", L)


# --- speculators 0.9.0 -------------------------------------------------------------------------------


def _verifier_stub(d: Path) -> Path:
    """A local verifier: speculators' from_pretrained reads its config, final norm and lm_head."""
    import torch
    from safetensors.torch import save_file

    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": L, "vocab_size": 50,
        "rms_norm_eps": 1e-6}))
    g = torch.Generator().manual_seed(3)
    save_file({"model.embed_tokens.weight": torch.randn(50, 32, generator=g),
               "lm_head.weight": torch.randn(50, 32, generator=g), "model.norm.weight": torch.ones(32)},
              str(d / "model.safetensors"))
    return d


@pytest.mark.integration
def test_speculators_loads_our_export_with_every_tensor(tmp_path):
    from eaglewire_testing.speculators_venv import venv_python

    py = venv_python()
    if not py.is_file():
        cannot_run(f"no speculators 0.9.0 venv at {py.parent.parent} (python -m eaglewire_testing.speculators_venv)")
    ckpt, _ = make_dflash_ckpt(tmp_path / "ckpt")
    run_export(ExportConfig(ckpt=ckpt, format="speculators", out=tmp_path / "x",
                            verifier=str(_verifier_stub(tmp_path / "verifier"))))
    script = Path(__file__).resolve().parents[2] / "src" / "eaglewire_testing" / "dflash_speculators_check.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    r = subprocess.run([str(py), str(script), str(tmp_path / "x")], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-1500:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["target_layer_ids"] == [2, 15, 29]  # speculators' numbering: z-lab + 1
    assert points_from_dflash_ids(got["target_layer_ids"], "speculators", L) == [
        layer_out(int(p.split(".")[1])) for p in POINTS]
    assert got["block_size"] == 4 and got["mask_token_id"] == 16
    assert got["equal"] and all(got["equal"].values()), got["equal"]  # every tensor loaded under its own name
    # what speculators takes from the verifier instead, full vocabulary: nothing of the drafter's own
    assert set(got["not_in_file"]) == {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight",
                                       "verifier_norm.weight"}


# --- llama.cpp 0.3.36 ------------------------------------------------------------------------------


@pytest.mark.integration
def test_llamacpp_converter_writes_target_layers_plus_one(tmp_path):
    """Our z-lab directory through llama.cpp's own DFlashModel converter (conversion/qwen.py)."""
    import shutil

    from eaglewire.engines import llama_env
    from eaglewire.targets.load import resolve_tokenizer_dir
    from eaglewire_testing.llamacpp import TOKENIZER_FILES

    if not (llama_env.source_dir() / "convert_hf_to_gguf.py").is_file():
        cannot_run(f"no llama.cpp tree at {llama_env.source_dir()} (its converter writes the GGUF)")
    try:
        tok = resolve_tokenizer_dir("default")
    except EaglewireError as e:
        cannot_run(f"no SmolLM2 tokenizer here (the converter recognises its pre-tokenizer): {e}")
    target = tmp_path / "target"  # the converter reads the target's config and tokenizer, never its weights
    target.mkdir()
    for n in TOKENIZER_FILES:
        if (tok / n).is_file():
            shutil.copy(tok / n, target / n)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": L,
        "vocab_size": 49152, "rms_norm_eps": 1e-5}))
    ckpt, _ = make_dflash_ckpt(tmp_path / "ckpt", vocab_size=49152)
    res = run_export(ExportConfig(ckpt=ckpt, format="gguf", out=tmp_path / "g", verifier=str(target),
                                  gguf_type="f32"))
    from gguf import GGUFReader

    r = GGUFReader(str(tmp_path / "g" / "drafter.gguf"))
    kv = {k: f.contents() for k, f in r.fields.items() if k.startswith(("dflash.", "general.arch", "tokenizer.ggml.mask"))}
    assert kv["general.architecture"] == "dflash" and kv["dflash.block_size"] == 4
    assert kv["tokenizer.ggml.mask_token_id"] == 16
    assert kv["dflash.target_layers"] == [2, 15, 29] == res["ids"]  # llama.cpp: input of layer k+1
    assert points_from_dflash_ids(kv["dflash.target_layers"], "llama.cpp", L) == [
        layer_out(int(p.split(".")[1])) for p in POINTS]
    assert "fc.weight" in {t.name for t in r.tensors} and not (tmp_path / "g" / "eaglewire-dflash").exists()
