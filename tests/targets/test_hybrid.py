"""Hybrid targets: the capture points on linear-attention layers are named, with each engine's answer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import transformers as tf

from eaglewire.targets.families import native_config_from_dict, text_config
from eaglewire.targets.hybrid import LINEAR_CAPTURE, describe, linear_capture_points
from eaglewire.targets.points import eagle3_default

pytestmark = pytest.mark.unit
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_configs"


def test_a_qwen3_next_config_names_its_linear_points():
    # transformers' own config: a full-attention layer every 4th (3, 7), gated delta net elsewhere
    cfg = tf.Qwen3NextConfig(num_hidden_layers=8, full_attention_interval=4)
    rows = linear_capture_points(cfg, eagle3_default(8))  # layers.1.out, layers.3.out, layers.4.out
    assert list(rows) == ["layers.1.out", "layers.4.out"]
    assert {r["layer_type"] for r in rows.values()} == {"linear_attention"}
    assert rows["layers.1.out"]["engines"] == {"sglang 0.5.23": "captures", "vllm 0.32.0": "captures",
                                              "llama.cpp 0.3.36": "captures"}
    assert all("layers.1.out is written by a linear_attention layer" in ln for ln in describe(rows)[:1])


def test_the_published_qwen3_5_wrapper_is_read_through_its_text_config():
    raw = json.loads((FIXTURES / "qwen3_5_397b_a17b" / "config.json").read_text())
    text = text_config(native_config_from_dict(raw))
    kinds = raw["text_config"]["layer_types"]
    pts = eagle3_default(60)
    rows = linear_capture_points(text, pts)
    assert list(rows) == [p.name for p in pts if kinds[p.layer] == "linear_attention"] and rows


@pytest.mark.parametrize("cfg", [tf.LlamaConfig(num_hidden_layers=8), tf.GptOssConfig(num_hidden_layers=8)])
def test_attention_only_targets_have_none(cfg):
    # GPT-OSS alternates sliding and full attention: both are attention layers
    assert linear_capture_points(cfg, eagle3_default(8)) == {}


def test_the_vllm_capture_loop_is_unconditional_on_layer_type():
    """The claim for vLLM, re-read from the pinned wheel when it is here: the capture call sits in the plain loop
    over the stack, with no layer-type test around it."""
    from eaglewire.engines.vllm_env import venv_dir

    found = sorted(venv_dir().glob("lib/python*/site-packages/vllm/model_executor/models/qwen3_next.py"))
    if not found:
        pytest.skip(f"no vLLM venv at {venv_dir()}")
    src = found[0].read_text()
    body = src[src.index("class Qwen3NextModel"):]
    body = body[body.index("    def forward("):body.index("    def load_weights(")]
    loop = re.search(r"for layer_idx, layer in enumerate\((?s:.*?)\n        if not get_pp_group", body).group(0)
    assert "_maybe_add_hidden_state" in loop and "layer_type" not in loop and "linear" not in loop
    assert LINEAR_CAPTURE["vllm 0.32.0"][0]


def test_inspect_says_which_default_points_fall_on_linear_attention_layers():
    """`inspect` on a hybrid tiny target: the JSON names each such point and every engine's answer, the
    human output prints it; an attention-only target says nothing."""
    from typer.testing import CliRunner

    from eaglewire.cli import app

    res = CliRunner().invoke(app, ["inspect", "--target", "tiny:qwen3_next", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    kinds = {n: k for n, k in r["layer_types"].items() if k == "linear_attention"}
    assert kinds and set(r["linear_capture"]) == set(kinds)
    assert all(v == "captures" for row in r["linear_capture"].values() for v in row["engines"].values())
    human = CliRunner().invoke(app, ["inspect", "--target", "tiny:qwen3_next"])
    assert f"{next(iter(kinds))} is written by a linear_attention layer" in human.stdout
    plain = CliRunner().invoke(app, ["inspect", "--target", "tiny:llama", "--json"])
    assert json.loads(plain.stdout)["linear_capture"] == {}
