"""Target resolution: default GGUF conversion, tiny archs, bad inputs."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import ARCHS
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets import load
from eaglewire.targets.ggufinfo import gguf_tensor_elements
from eaglewire.targets.load import default_gguf, load_gguf, load_tokenizer, resolve_target_dir

DEFAULT_PARAMS = 134_515_008  # SmolLM2-135M, tied embeddings: the GGUF stores each weight once


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_targets_have_chat_template_and_generate(tiny_targets, arch):
    t = tiny_targets[arch]
    assert t.tokenizer.chat_template
    ids = t.tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}], add_generation_prompt=True,
                                          return_dict=True, return_tensors="pt")["input_ids"]
    out = t.model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=t.eos_ids(),
                           pad_token_id=t.eos_ids()[0])
    new = out[0, ids.shape[1]:].tolist()
    # 4 new tokens, or fewer only because the last one is an end-of-turn token
    assert len(new) == 4 or (1 <= len(new) < 4 and new[-1] in t.eos_ids()), new
    assert t.eos_ids() and all(0 <= e < t.vocab_size for e in t.eos_ids())


def test_tiny_is_deterministic(tmp_path):
    from eaglewire.targets.tiny import build_tiny

    a = build_tiny("qwen3", tmp_path / "a")
    b = build_tiny("qwen3", tmp_path / "b")
    from safetensors.torch import load_file

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


@pytest.mark.parametrize("spec,msg", [
    ("tiny:gpt9", "unknown tiny architecture"),
    ("/nonexistent/model", "not 'default'"),
])
def test_bad_target_names(spec, msg):
    with pytest.raises(EaglewireError, match=msg):
        resolve_target_dir(spec)


def test_non_model_dir_and_corrupt_gguf(tmp_path):
    with pytest.raises(EaglewireError, match="no config.json"):
        resolve_target_dir(str(tmp_path))
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOTGGUF" * 10)
    with pytest.raises(EaglewireError, match="not a GGUF file"):
        resolve_target_dir(str(bad))
    trunc = tmp_path / "t.gguf"
    trunc.write_bytes(default_gguf().read_bytes()[:4096])
    with pytest.raises(EaglewireError, match="cannot be read"):
        resolve_target_dir(str(trunc))


def test_the_tokenizer_of_a_gguf_is_read_without_writing_its_weights(tmp_path, monkeypatch):
    """`data generate --server --target model.gguf` needs the tokenizer only: an 8B Q4 GGUF must not
    become ~30 GiB of fp32 safetensors for it."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(cache))  # no converted copy of the default target
    monkeypatch.setattr(load, "convert_gguf", lambda *a: pytest.fail("the weights were converted"))
    tok = load_tokenizer("default")
    files = [f for f in cache.rglob("*") if f.is_file()]
    assert files and not [f for f in files if f.suffix in (".safetensors", ".bin")]
    assert sum(f.stat().st_size for f in files) < 20 * 2**20  # the tokenizer: ~3.5 MB, not ~500 MB of weights
    assert len(tok) == 49152 and tok.chat_template and tok.pad_token_id is not None
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    monkeypatch.setattr(load, "load_gguf_tokenizer", lambda p: pytest.fail("the GGUF was parsed again"))
    again = load_tokenizer(str(default_gguf()))  # cached: the GGUF is not read twice
    assert again.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True) == ids


def test_a_gguf_conversion_first_says_how_big_and_where(tmp_path, monkeypatch, capsys):
    def stop(path):
        raise EaglewireError("stopped before loading")

    monkeypatch.setattr(load, "load_gguf", stop)
    out = tmp_path / "converted"
    with pytest.raises(EaglewireError, match="stopped"):
        load.convert_gguf(default_gguf(), out)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"~{DEFAULT_PARAMS * 4 / 2**30:.1f} GiB" in err[0] and str(out) in err[0], err
    assert "fp32" in err[0] and not out.exists()


def test_gguf_tensor_elements_reads_the_header(tmp_path):
    assert gguf_tensor_elements(default_gguf()) == DEFAULT_PARAMS
    trunc = tmp_path / "t.gguf"
    trunc.write_bytes(default_gguf().read_bytes()[:4096])
    assert gguf_tensor_elements(trunc) is None  # the size line says "size unknown" instead of failing
    assert gguf_tensor_elements(tmp_path / "missing.gguf") is None


@pytest.mark.slow
def test_default_converted_logits_equal_gguf_logits(default_target):
    gguf_model, tok = load_gguf(default_gguf())
    assert gguf_model.config.num_hidden_layers == 30 and default_target.vocab_size == 49152
    ids = torch.tensor([tok("The capital of France is")["input_ids"]])
    with torch.no_grad():
        a = gguf_model(ids).logits
        b = default_target.model(ids).logits
    assert torch.equal(a, b)
    src = json.loads((default_target.path / "eaglewire_source.json").read_text())
    assert src["kind"] == "gguf" and len(src["sha256"]) == 64
    cfg = json.loads((default_target.path / "config.json").read_text())
    assert "quantization_config" not in cfg


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "eaglewire.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_inspect_json_tiny():
    r = _cli("inspect", "--target", "tiny:deepseek_v3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["num_layers"] == 8 and d["chat_template"] is True
    assert d["default_capture"]["names"] == ["layers.1.out", "layers.3.out", "layers.4.out"]
    assert d["default_capture"]["hf_index"] == [2, 4, 5] and d["default_capture"]["sglang"] == [1, 3, 4]


def test_cli_errors_are_one_line():
    r = _cli("inspect", "--target", "tiny:nope")
    assert r.returncode == 2 and r.stderr.strip().startswith("error:") and "Traceback" not in r.stderr
    r = _cli("layers", "--target-layers", "30", "--layers-from", "sglang", "29")
    assert r.returncode == 2 and "not capturable" in r.stderr


def test_cli_layers_json():
    r = _cli("layers", "--target-layers", "61", "--layers-from", "vllm", "2", "30", "58", "--json")
    d = json.loads(r.stdout)
    assert d["sglang"] == [1, 29, 57] and d["names"][0] == "layers.1.out"


def test_cli_capture_writes_points(tmp_path):
    out = tmp_path / "c.safetensors"
    r = _cli("capture", "--target", "tiny:llama", "--text", "Hello world", "--chat",
             "--points", "embed,layers.2.out", "--points", "final_norm", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file

    d = load_file(out)
    assert set(d) == {"embed", "layers.2.out", "final_norm", "input_ids"}
    assert d["embed"].shape == (d["input_ids"].shape[0], 64)


def _custom_code_target(tmp_path, config_name="config.json"):
    """A tiny target whose config names custom code (auto_map) that would leave a marker when run."""
    from eaglewire.targets.tiny import build_tiny

    d = build_tiny("llama", tmp_path / "custom")
    raw = json.loads((d / config_name).read_text()) if (d / config_name).is_file() else {}
    key = "AutoTokenizer" if config_name == "tokenizer_config.json" else "AutoConfig"
    raw["auto_map"] = {key: "evil.Thing"}
    (d / config_name).write_text(json.dumps(raw))
    (d / "evil.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').write('x')\n")
    return d


@pytest.mark.parametrize("config_name", ["config.json", "tokenizer_config.json"])
def test_a_target_with_custom_code_is_refused_before_transformers_asks(tmp_path, monkeypatch, config_name):
    """Code that names no class transformers implements is refused; a tokenizer's code is refused unless a
    tokenizer.json can be read instead (tests/targets/test_families.py: Kimi's published layout)."""
    import io

    d = _custom_code_target(tmp_path, config_name)
    if config_name == "tokenizer_config.json":
        (d / "tokenizer.json").unlink()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))  # what `echo y |` answers transformers' prompt
    for fn in (load.load_target, load.load_tokenizer, load.load_skeleton):
        with pytest.raises(EaglewireError, match=f"^{d}: has custom code \\(auto_map in {config_name}\\); "
                                                 "eaglewire never runs model code"):
            fn(str(d))
    assert not (tmp_path / "RAN").exists()


def test_inspect_refuses_custom_code_even_when_stdin_says_yes(tmp_path):
    d = _custom_code_target(tmp_path)
    r = subprocess.run([sys.executable, "-m", "eaglewire.cli", "inspect", "--target", str(d)], input="y\ny\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {d}: has custom code (auto_map in config.json); eaglewire never runs model code "
        "(use a target that transformers supports natively)"], r.stderr
    assert not (tmp_path / "RAN").exists()


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_broken_model_safetensors_is_one_line_naming_it(tmp_path, how):
    import shutil

    t = shutil.copytree(load.load_target("tiny:llama").path, tmp_path / "t")
    w = t / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2] if how == "truncated" else b"garbage" * 9)
    for read in (load.load_target, load.load_skeleton, load.load_head_weight):
        with pytest.raises(EaglewireError, match=rf"^target '{t}': {w}: not a whole safetensors file \(.*\); download"):
            read(str(t))
