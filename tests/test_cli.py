"""Bad input through every command: exit 2, one line naming the file or field, no traceback.

Each row runs the real CLI entry point in-process (``eaglewire.cli.main``)
with a broken input and checks the exit status, that stderr is a single
``error:`` or usage line containing the expected words, and that no
exception escaped. Files a case needs are made by the row's setup.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eaglewire import cli


def _write(path, text: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def _dataset_dir(tmp, manifest: str):
    _write(tmp / "ds" / "manifest.json", manifest)
    return tmp / "ds"


def _drafter_dir(tmp, config: str):
    _write(tmp / "dr" / "config.json", config)
    return tmp / "dr"


# (id, argv builder from tmp_path, words the one-line message must contain)
CASES = [
    ("inspect-bad-target", lambda t: ["inspect", "--target", str(t / "nowhere")], ["nowhere", "tiny:<arch>"]),
    ("layers-out-of-range", lambda t: ["layers", "99", "--target-layers", "30", "--layers-from", "vllm"], ["99"]),
    ("capture-empty-text", lambda t: ["capture", "--text", "", "--out", str(t / "c"), "--target", "tiny:llama",
                                      "--no-chat"], ["--text"]),
    ("data-build-not-utf8", lambda t: ["data", "build", "--target", "tiny:llama", "--out", str(t / "o"), "--prompts",
                                       str(_write(t / "p.jsonl", b'{"prompt": "caf\xe9"}\n'))], ["p.jsonl", "UTF-8"]),
    ("data-build-bad-json", lambda t: ["data", "build", "--target", "tiny:llama", "--out", str(t / "o"), "--prompts",
                                       str(_write(t / "p.jsonl", '{"prompt": "a"}\n{oops\n'))], ["p.jsonl", "2"]),
    ("data-generate-missing-prompts", lambda t: ["data", "generate", "--target", "tiny:llama", "--out", str(t / "o"),
                                                 "--prompts", str(t / "missing.jsonl")], ["missing.jsonl"]),
    ("data-generate-bad-batch", lambda t: ["data", "generate", "--out", str(t / "o"), "--topic-prompts", "4",
                                           "--gen-batch-size", "0"], ["--gen-batch-size"]),
    ("data-extract-no-responses", lambda t: ["data", "extract", str(t / "empty"), "--target", "tiny:llama"],
     ["responses.jsonl"]),
    ("data-vocab-no-manifest", lambda t: ["data", "vocab", str(t / "empty")], ["manifest.json"]),
    ("data-info-truncated-manifest", lambda t: ["data", "info", str(_dataset_dir(t, '{"format_version": 1, "sha'))],
     ["manifest.json"]),
    ("data-import-nothing", lambda t: ["data", "import", str(t / "empty"), "--out", str(t / "imp")], ["empty"]),
    ("train-missing-data", lambda t: ["train", "--data", str(t / "nodata"), "--out", str(t / "r")], ["nodata"]),
    ("train-online-missing-data", lambda t: ["train", "--online", "--target", "tiny:llama", "--data", str(t / "nodata"),
                                             "--out", str(t / "r")], ["nodata", "responses.jsonl"]),
    ("train-online-no-responses", lambda t: ["train", "--online", "--target", "tiny:llama", "--data", str(t / "empty"),
                                             "--out", str(t / "r")], ["empty", "responses.jsonl"]),
    ("train-negative-lr", lambda t: ["train", "--data", str(t), "--out", str(t / "r"), "--lr", "-1"], ["--lr"]),
    ("generate-bad-mode", lambda t: ["generate", "--prompt", "hi", "--target", "tiny:llama", "--mode", "fast"],
     ["--mode", "plain, chain, tree"]),
    ("generate-missing-drafter", lambda t: ["generate", "--prompt", "hi", "--target", "tiny:llama", "--drafter",
                                            str(t / "nodrafter")], ["nodrafter"]),
    ("bench-missing-drafter", lambda t: ["bench", "--drafter", str(t / "nodrafter"), "--target", "tiny:llama"],
     ["nodrafter"]),
    ("export-missing-ckpt", lambda t: ["export", str(t / "nockpt"), "--format", "sglang", "--out", str(t / "e")],
     ["nockpt"]),
    ("export-bad-format", lambda t: ["export", str(t / "nockpt"), "--format", "tensorrt", "--out", str(t / "e")],
     ["tensorrt"]),
    ("import-missing-src", lambda t: ["import", str(t / "nosrc"), "--out", str(t / "i"), "--target-layers", "8"],
     ["nosrc"]),
    ("doctor-dataset-missing", lambda t: ["doctor", "dataset", str(t / "nods")], ["nods"]),
    ("doctor-drafter-missing", lambda t: ["doctor", "drafter", str(t / "nockpt"), "--data", str(t)], ["nockpt"]),
    ("doctor-config-truncated", lambda t: ["doctor", "config", str(_drafter_dir(t, '{"architectures": [')),
                                           "--target-layers", "30", "--engine", "vllm"], ["config.json"]),
    ("doctor-config-id-not-int", lambda t: ["doctor", "config", str(_drafter_dir(t, json.dumps(
        {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": ["a", 2, 3]}}))),
        "--target-layers", "30", "--engine", "sglang"], ["eagle_aux_hidden_state_layer_ids", "integer"]),
    ("doctor-online-missing", lambda t: ["doctor", "online", "--drafter", str(t / "nockpt"), "--data", str(t)],
     ["nockpt"]),
    ("demo-bad-preset", lambda t: ["demo", "--preset", "huge", "--run-dir", str(t / "d")], ["huge"]),
    ("plan-missing-config", lambda t: ["plan", "--model-config", str(t / "nowhere.json")], ["nowhere.json", "no such file"]),
    ("plan-config-not-json", lambda t: ["plan", "--model-config", str(_write(t / "cfg" / "config.json", "{oops"))],
     ["config.json", "JSON"]),
    ("plan-config-no-hidden-size", lambda t: ["plan", "--model-config", str(_write(t / "cfg" / "config.json", json.dumps(
        {"model_type": "llama", "num_hidden_layers": 8, "num_attention_heads": 4, "vocab_size": 100})))],
     ["config.json", "hidden_size"]),
    ("plan-negative-samples", lambda t: ["plan", "--target", "tiny:llama", "--samples", "-5"], ["--samples", ">= 1"]),
    ("data-generate-empty-prompts", lambda t: ["data", "generate", "--target", "tiny:llama", "--out", str(t / "o"),
                                               "--prompts", str(_write(t / "p.jsonl", ""))], ["p.jsonl", "no prompts"]),
    ("doctor-drafter-samples-0", lambda t: ["doctor", "drafter", str(t), "--data", str(t), "--samples", "0"],
     ["--samples", ">= 1"]),
    ("doctor-drafter-samples-negative", lambda t: ["doctor", "drafter", str(t), "--data", str(t), "--samples", "-3"],
     ["--samples", ">= 1"]),
    ("doctor-dataset-samples-0", lambda t: ["doctor", "dataset", str(t), "--samples", "0"], ["--samples", ">= 1"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys):
    _, argv, words = case
    (tmp_path / "empty").mkdir()
    args = argv(tmp_path)
    monkeypatch.setattr(sys, "argv", ["eaglewire", *args])
    monkeypatch.delenv("EAGLEWIRE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr().err
    assert e.value.code == 2, (args, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    message = " ".join(lines)
    assert lines and (lines[0].startswith("error: ") or "Usage:" in message), err
    for w in words:
        assert w in message, (w, err)


def test_building_the_cli_imports_no_torch():
    """`eaglewire --help` and usage errors answer without the ~3 s torch/transformers import."""
    code = "import sys, eaglewire.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_version_matches_the_package_metadata():
    from importlib.metadata import version

    r = subprocess.run([sys.executable, "-m", "eaglewire.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"eaglewire {version('eaglewire')}"
