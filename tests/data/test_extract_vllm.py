"""`data extract --engine vllm` without a vLLM: the id plan, the derived final norm and each way a reply is wrong.

The real engine is exercised in tests/engines/test_vllm_capture.py; here a fake server
answers like vLLM's connector (a path in kv_transfer_params to a safetensors file) or
unlike it, and each fault must be one error naming the file and what was expected.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest
import torch
from safetensors.torch import save_file

from eaglewire.data.extract_vllm import VllmCapture, capture_plan
from eaglewire.engines.vllm_capture import StatesClient, capture_args
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import EMBED, FINAL_NORM, layer_out, parse_points


def test_capture_plan_sorts_ids_like_vllm_and_maps_each_point_to_its_column():
    pts = [layer_out(7), EMBED, layer_out(3)]  # L = 8: vLLM ids 8, 0, 4
    ids, cols, last = capture_plan(pts, 8)
    assert ids == [0, 4, 8]  # vLLM sorts and deduplicates: column j is the j-th sorted id
    assert cols == [2, 0, 1] and last == 2  # the last layer is both a point and the final norm's input


def test_capture_plan_derives_final_norm_from_the_last_layer():
    ids, cols, last = capture_plan([layer_out(1), FINAL_NORM], 8)
    assert ids == [2, 8] and cols == [0, 1] and last == 1


def test_capture_args_name_the_ids_and_the_connector():
    args = capture_args([2, 4, 8], "/s", ours=True)
    spec = json.loads(args[args.index("--speculative-config") + 1])
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert spec["method"] == "extract_hidden_states" and spec["num_speculative_tokens"] == 1
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 8]
    assert kv["kv_connector"] == "CpuHiddenStatesConnector" and kv["kv_connector_module_path"]
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == "/s"
    up = json.loads(capture_args([2], "/s", ours=False)[3])
    assert up["kv_connector"] == "ExampleHiddenStatesConnector" and "kv_connector_module_path" not in up
    assert "--no-enable-chunked-prefill" in args


class _Fake(http.server.BaseHTTPRequestHandler):
    reply = staticmethod(lambda body: {})

    def do_GET(self):  # noqa: N802
        self._send({"data": [{"id": "m"}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send(type(self).reply(body))

    def _send(self, obj):
        raw = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *a):
        pass


@pytest.fixture
def fake(tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", tmp_path
    srv.shutdown()


def _serving(tmp_path, states_fn, tokens_fn=lambda ids: ids, path=None):
    """The fake answers each request by writing `states_fn(n)` to a file, as vLLM's connector does."""
    def reply(body):
        ids = body["prompt"]
        p = path or str(tmp_path / f"req-{len(ids)}.safetensors")
        if path is None:
            save_file({"hidden_states": states_fn(len(ids)), "token_ids": torch.tensor(tokens_fn(ids))}, p)
        return {"choices": [{"text": "x"}], "kv_transfer_params": {"hidden_states_path": p}}
    _Fake.reply = staticmethod(reply)


def test_states_are_read_checked_and_removed(fake):
    url, tmp = fake
    want = torch.randn(5, 3, 8)
    _serving(tmp, lambda n: want[:n])
    got = StatesClient(url, None, 3, 8, states_dir=tmp).states([1, 2, 3, 4, 5])
    assert torch.equal(got, want)
    assert not (tmp / "req-5.safetensors").exists()


@pytest.mark.parametrize("states,tokens,path,msg", [
    (lambda n: torch.zeros(n, 2, 8), None, None, r"hidden_states \[5, 2, 8\], expected \[5, 3, 8\]"),
    (lambda n: torch.zeros(n, 3, 8), lambda ids: [1, 2, 9, 4, 5], None, r"other tokens than were sent .*position 2"),
    (None, None, "{tmp}/gone.safetensors", r"cannot read; give the server a --states-dir both machines share"),
])
def test_a_wrong_reply_is_one_error_naming_the_file(fake, states, tokens, path, msg):
    url, tmp = fake
    _serving(tmp, states, tokens or (lambda ids: ids), path and path.format(tmp=tmp))
    with pytest.raises(EaglewireError, match=msg):
        StatesClient(url, None, 3, 8, states_dir=tmp).states([1, 2, 3, 4, 5])


@pytest.mark.parametrize("name", ["../victim.safetensors", "link.safetensors", "/etc/hostname", "notes.txt"])
def test_a_reply_naming_a_file_outside_the_states_dir_is_refused_before_reading_or_removing(fake, name):
    """The server's path is input: only a .safetensors file in the directory we gave it is read, then removed."""
    url, tmp = fake
    states = tmp / "states"
    states.mkdir()
    victim = tmp / "victim.safetensors"
    save_file({"hidden_states": torch.zeros(5, 3, 8), "token_ids": torch.tensor([1, 2, 3, 4, 5])}, str(victim))
    (tmp / "victim.safetensors.lock").write_text("")
    (states / "link.safetensors").symlink_to(victim)
    (states / "notes.txt").write_text("x")
    path = name if name.startswith("/") else str(states / name)
    _serving(tmp, None, path=path)
    with pytest.raises(EaglewireError, match="hidden_states_path") as e:
        StatesClient(url, None, 3, 8, states_dir=states).states([1, 2, 3, 4, 5])
    assert "\n" not in str(e.value)
    assert victim.is_file() and (tmp / "victim.safetensors.lock").is_file() and (states / "notes.txt").is_file()


def test_a_server_without_the_capture_flags_is_named(fake):
    url, _ = fake
    _Fake.reply = staticmethod(lambda body: {"choices": [{"text": "x"}]})
    with pytest.raises(EaglewireError, match="no kv_transfer_params.hidden_states_path.*--print-command"):
        StatesClient(url, None, 3, 8, states_dir=_).states([1, 2])


class _Client:
    def __init__(self, states):
        self.s = states

    def states(self, ids):
        return self.s[: len(ids)]


def test_the_final_norm_is_the_targets_own_norm_of_the_last_layer():
    from eaglewire.targets.load import load_skeleton, load_target

    skel, full = load_skeleton("tiny:llama"), load_target("tiny:llama")
    pts = parse_points(["layers.1.out", "final_norm"], 8)
    states = torch.randn(6, 2, skel.hidden_size)  # columns: vLLM ids [2, 8]
    feats, fin = VllmCapture(_Client(states), skel, pts, {}, "fp32")([(0, list(range(6)), [1] * 6)])[0]
    ref = full.model.get_decoder().norm(states[:, 1])
    torch.testing.assert_close(fin, ref)
    torch.testing.assert_close(feats[:, 0], states[:, 0])
    torch.testing.assert_close(feats[:, 1], ref)


def test_the_skeleton_has_the_full_targets_fingerprint_without_its_layers():
    from eaglewire.targets.fingerprint import TargetFingerprint
    from eaglewire.targets.load import load_skeleton, load_target

    for arch in ("llama", "deepseek_v3"):
        skel = load_skeleton(f"tiny:{arch}")
        assert TargetFingerprint.of(skel) == TargetFingerprint.of(load_target(f"tiny:{arch}"))
        assert all(p.is_meta for p in skel.model.get_decoder().layers.parameters())


def test_resume_with_another_engine_is_refused(tmp_path):
    from eaglewire_testing.cli import run_cli
    from eaglewire_testing.tinydata import build_tiny_dataset

    ds = build_tiny_dataset(tmp_path, n=4, max_new_tokens=8)
    r = run_cli("data", "extract", ds, "--resume", "--engine", "vllm")
    assert r.returncode == 2 and "--engine 'vllm' (recorded: 'transformers')" in r.stderr, r.stderr


def test_print_command_is_the_upstream_connector_with_parallel_flags(tmp_path):
    from eaglewire_testing.cli import run_cli

    r = run_cli("data", "extract", tmp_path, "--target", "tiny:llama", "--engine", "vllm", "--print-command",
                "--tensor-parallel-size", "8", "--engine-args", "--enable-expert-parallel")
    assert r.returncode == 0, r.stderr
    cmd, note = r.stdout.strip().splitlines()
    assert cmd.startswith("vllm serve ") and "--host 127.0.0.1" in cmd and "0.0.0.0" not in r.stdout
    assert note.startswith("# ") and "--host" in note and "trusted network" in note
    assert "--tensor-parallel-size 8" in cmd and "--enable-expert-parallel" in cmd
    assert "ExampleHiddenStatesConnector" in cmd and "[2, 4, 5, 8]" in cmd


def test_linear_attention_runs_bf16_on_vllms_cpu_build_and_another_dtype_is_refused_before_a_start():
    """vLLM 0.32's CPU GDN kernel asserts bf16 on the first request (after minutes of startup): auto picks bf16
    for a target with linear-attention layers, fp32 is one line up front; plain targets and GPU builds unchanged."""
    from eaglewire.data.extract_vllm import _vllm_dtype
    from eaglewire.targets.load import resolve_target_dir

    hybrid, plain = resolve_target_dir("tiny:qwen3_next"), resolve_target_dir("tiny:llama")
    assert _vllm_dtype("auto", True, hybrid) == "bfloat16" and _vllm_dtype("bf16", True, hybrid) == "bfloat16"
    assert _vllm_dtype("auto", True, plain) == "float32" and _vllm_dtype("auto", False, hybrid) == "auto"
    assert _vllm_dtype("fp32", False, hybrid) == "float32"
    with pytest.raises(EaglewireError) as e:
        _vllm_dtype("fp32", True, hybrid)
    assert str(e.value) == (f"--dtype fp32: vLLM 0.32.0's CPU build runs the linear attention of {hybrid} in bf16 "
                            "only ('CPU GDN attention requires BF16.'); use --dtype bf16")


def test_what_stops_vllm_at_startup_is_said_before_starting_it(tmp_path):
    """A venv without torchvision cannot import the Qwen3-VL/Qwen3.5/Llama-4 model files; Kimi-K2.5's image
    processor is loaded at startup. The real engine's refusals: tests/engines/test_vllm_capture.py."""
    import shutil

    from eaglewire.engines.vllm_env import startup_refusal
    from eaglewire.targets.load import resolve_target_dir

    bare = tmp_path / "python"  # a Python that finds no module
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(0o755)
    vl = resolve_target_dir("tiny:qwen3_vl")
    assert "cannot run Qwen3VLForConditionalGeneration: its model file imports torchvision" in startup_refusal(
        bare, vl, "Qwen3VLForConditionalGeneration")
    assert startup_refusal(bare, vl, "Qwen3MoeForCausalLM") is None
    kimi = tmp_path / "kimi"
    shutil.copytree(resolve_target_dir("tiny:kimi_k25"), kimi)
    assert startup_refusal(bare, kimi, "KimiK25ForConditionalGeneration") == (
        f"{kimi}: vLLM 0.32.0 loads the image processor of KimiK25ForConditionalGeneration at startup, and there "
        "is no preprocessor_config.json (copy the checkpoint's)")
    (kimi / "preprocessor_config.json").write_text("{}")
    assert startup_refusal(bare, kimi, "KimiK25ForConditionalGeneration") is None
