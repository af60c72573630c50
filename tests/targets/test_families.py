"""The families people serve load through transformers' native classes, and capture what transformers computes.

References are transformers' own models of the whole checkpoint (the wrapper's
class, with its own weight-name conversion), run with output_hidden_states:
eaglewire's grafted language model must capture exactly those states and give
exactly those logits. The Kimi directories carry their published `auto_map`;
code files that would write a marker prove none of it is ever imported.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers as tf

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture, decoder_stack
from eaglewire.targets.load import load_head_weight, load_skeleton, load_target, resolve_target_dir
from eaglewire.targets.points import Engine, Point, points_from_ids
from eaglewire.targets.tiny_families import SERVED_AS, TEMPLATES

FAMILIES = sorted(TEMPLATES)
# The class transformers itself builds the whole published checkpoint with (the independent reference).
REFERENCE = {"kimi_k25": tf.Kimi_K25ForConditionalGeneration, "gemma3": tf.Gemma3ForConditionalGeneration,
             "llama4": tf.Llama4ForConditionalGeneration, "qwen3_vl": tf.Qwen3VLForConditionalGeneration,
             "gpt_oss": tf.GptOssForCausalLM, "qwen3_5": tf.Qwen3_5ForConditionalGeneration}
DEPTH = {"kimi_k25": 61}


@pytest.fixture(scope="module")
def loaded():
    return {a: load_target(f"tiny:{a}") for a in FAMILIES}


def _reference(arch: str):
    d = resolve_target_dir(f"tiny:{arch}")
    if arch == "kimi_k2":  # published as model_type kimi_k2 (remote code); transformers' DeepSeek-V3 is the class
        raw = json.loads((d / "config.json").read_text())
        cfg = tf.DeepseekV3Config(**{k: v for k, v in raw.items() if k not in ("model_type", "auto_map")})
        return tf.DeepseekV3ForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32).eval()
    return REFERENCE.get(arch, tf.AutoModelForCausalLM).from_pretrained(d, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", FAMILIES)
def test_capture_and_logits_equal_transformers_whole_checkpoint(loaded, arch):
    t = loaded[arch]
    ref = _reference(arch)
    msgs = [{"role": "user", "content": "Explain why the sky is blue."}]
    ids = torch.tensor([t.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)])  # [1, T]
    L = t.num_layers
    assert L == DEPTH.get(arch, 8) and len(decoder_stack(t.model).layers) == L
    pts = [Point.parse(n) for n in ("embed", "layers.1.out", f"layers.{L // 2}.out", f"layers.{L - 2}.out")]
    got = capture(t.model, ids, pts)
    if arch == "llama4":  # transformers 5.24's wrapper forward fails on text alone (image_outputs): its LM
        ref = ref.language_model
    with torch.no_grad():
        want = ref(input_ids=ids, output_hidden_states=True)
        mine = t.model(input_ids=ids)
    hs = want.hidden_states  # [L + 1] x [1, T, H]: embed, then each layer's output (the last one normed)
    for p in pts:
        k = 0 if p.kind == "embed" else p.layer + 1
        torch.testing.assert_close(got[p.name], hs[k], rtol=1e-5, atol=1e-5, msg=f"{arch} {p.name}")
    torch.testing.assert_close(mine.logits, want.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", FAMILIES)
def test_records_keep_the_serving_class_and_the_language_models_geometry(loaded, arch):
    t = loaded[arch]
    assert t.arch == SERVED_AS[arch]
    assert t.hidden_size == 64 and t.vocab_size == t.model.get_output_embeddings().weight.shape[0]
    # The head alone, read from the shards under the wrapper's names, is the loaded model's head.
    torch.testing.assert_close(load_head_weight(f"tiny:{arch}"), t.model.get_output_embeddings().weight)


@pytest.mark.parametrize("arch", ["kimi_k25", "gemma3", "qwen3_vl", "qwen3_5"])
def test_skeleton_reads_a_wrappers_embedding_and_norm(loaded, arch):
    t, s = loaded[arch], load_skeleton(f"tiny:{arch}")
    for name in ("embed_tokens.weight", "norm.weight"):
        torch.testing.assert_close(decoder_stack(s.model).get_parameter(name),
                                   decoder_stack(t.model).get_parameter(name))
    assert s.arch == SERVED_AS[arch] and s.num_layers == t.num_layers


_MARKER_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n"


def test_published_auto_map_loads_natively_and_never_imports_the_code(tmp_path):
    d = tmp_path / "kimi"
    shutil.copytree(resolve_target_dir("tiny:kimi_k25"), d)
    marker = tmp_path / "marker"
    for f in ("configuration_kimi_k25.py", "modeling_kimi_k25.py", "tokenization_kimi.py"):
        (d / f).write_text(_MARKER_CODE.format(marker=str(marker)))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    t = load_target(str(d))
    assert t.num_layers == 61 and t.arch == "KimiK25ForConditionalGeneration"
    assert not marker.exists()


def test_unknown_family_with_custom_code_stays_refused(tmp_path):
    d = tmp_path / "custom"
    shutil.copytree(resolve_target_dir("tiny:kimi_k2"), d)
    raw = json.loads((d / "config.json").read_text())
    raw["model_type"] = "my_secret_arch"
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(EaglewireError, match="custom code"):
        load_target(str(d))


def test_an_empty_tiktoken_model_is_named_in_one_line(tmp_path):
    """Kimi's tokenizer is read natively from tiktoken.model (targets/tokenizers.py); an empty one is refused."""
    d = tmp_path / "kimi"
    shutil.copytree(resolve_target_dir("tiny:kimi_k25"), d)
    (d / "tiktoken.model").write_text("")
    with pytest.raises(EaglewireError, match=r"tiktoken\.model: empty"):
        load_target(str(d))


@pytest.mark.parametrize("arch", ["KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration", "kimi_k2"])
def test_kimi_names_read_sglang_ids_by_the_deepseek_rule(arch):
    """transformers' class name, the published one and Kimi-K2's model_type all get SGLang 0.5.23's rule."""
    pts = points_from_ids([2, 30, 58], Engine("sglang", "0.5.23", arch), 61)
    assert [p.name for p in pts] == ["layers.1.out", "layers.29.out", "layers.57.out"]


def test_inspect_a_weights_free_published_config(tmp_path):
    """A config.json alone (Kimi-K2.5's shape, as published): described on the meta device, the serving class
    and the language model's 61 layers, no shard read."""
    from typer.testing import CliRunner

    from eaglewire.cli import app

    shutil.copy(resolve_target_dir("tiny:kimi_k25") / "config.json", tmp_path / "config.json")
    res = CliRunner().invoke(app, ["inspect", "--target", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["architecture"] == "KimiK25ForConditionalGeneration" and out["num_layers"] == 61
    assert out["weights"] is False and out["language_model"].startswith("DeepseekV3ForCausalLM")
    assert out["default_capture"]["names"] == ["layers.1.out", "layers.29.out", "layers.57.out"]


def test_inspect_names_the_engine_that_cannot_capture_from_the_family():
    from typer.testing import CliRunner

    from eaglewire.cli import app

    res = CliRunner().invoke(app, ["inspect", "--target", "tiny:glm4_moe", "--json"])
    assert res.exit_code == 0, res.output
    eng = json.loads(res.stdout)["engines"]
    assert eng["vllm 0.32.0"]["support"] == "no" and "SupportsEagle3" not in eng["vllm 0.32.0"]["refusal"]
    assert "does not support EAGLE3 interface" in eng["vllm 0.32.0"]["refusal"]
    assert eng["sglang 0.5.23"] == {"support": "yes", "refusal": None}


def test_layers_with_an_arch_names_the_engine_that_cannot_capture_from_it():
    from typer.testing import CliRunner

    from eaglewire.cli import app

    args = ["layers", "--target-layers", "92", "--layers-from", "vllm", "2", "46", "89", "--json", "--arch"]
    got = json.loads(CliRunner().invoke(app, [*args, "Glm4MoeForCausalLM"]).stdout)["warnings"]
    assert any("vllm 0.32.0 cannot capture" in w and "Glm4MoeForCausalLM" in w for w in got)
    got = json.loads(CliRunner().invoke(app, [*args, "Qwen3MoeForCausalLM"]).stdout)["warnings"]
    assert not any("cannot capture" in w for w in got)
