"""A model directory's own code never runs through llama.cpp's converter (or vLLM), on any route that hands one over.

The converter here is a stand-in that does what llama.cpp's `convert_hf_to_gguf.py` does with a target's
tokenizer (conversion/base.py and llama.py of llama-cpp-python 0.3.36's tree): `trust_remote_code=True` for a
`HybridDNATokenizer`, the plain `AutoTokenizer.from_pretrained(dir)` (the question on stdin) otherwise. Before
the fix each route below ran the directory's `evil_tok.py` through it (the marker file appeared).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eaglewire.engines import llama_env
from eaglewire.engines.vllm_server import ServeSpec, VllmServer, free_port
from eaglewire.export import gguf
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.infra.errors import EaglewireError
from eaglewire.serve.config import ServeConfig
from eaglewire.serve.serving import run_serve
from eaglewire.targets.load import resolve_target_dir

pytestmark = pytest.mark.unit

FAKE_CONVERTER = '''
import json, sys
from pathlib import Path
from transformers import AutoTokenizer
args = sys.argv[1:]
d = Path(args[args.index("--target-model-dir") + 1] if "--target-model-dir" in args else args[0])
tc = json.loads((d / "tokenizer_config.json").read_text())
if tc.get("tokenizer_class") == "HybridDNATokenizer":
    AutoTokenizer.from_pretrained(d, trust_remote_code=True)
else:
    AutoTokenizer.from_pretrained(d)
Path(args[args.index("--outfile") + 1]).write_bytes(b"GGUF")
'''

# (tokenizer_config.json additions, config.json additions, what the refusal names)
VARIANTS = {
    "hybrid-dna": ({"tokenizer_class": "HybridDNATokenizer",
                    "auto_map": {"AutoTokenizer": ["evil_tok.HybridDNATokenizer", None]}}, {}, "auto_map"),
    "hybrid-dna-class-only": ({"tokenizer_class": "HybridDNATokenizer"}, {}, "HybridDNATokenizer"),
    "auto-map-tokenizer": ({"auto_map": {"AutoTokenizer": ["evil_tok.HybridDNATokenizer", None]}}, {}, "auto_map"),
    "auto-map-config": ({}, {"auto_map": {"AutoTokenizer": ["evil_tok.HybridDNATokenizer", None]}}, "auto_map"),
    "auto-map-nested": ({}, {"text_config": {"auto_map": {"AutoConfig": "evil_tok.Cfg"}}}, "text_config.auto_map"),
    # a model type transformers does not know: its AutoConfig asks on stdin whether to run the directory's code
    "asks-on-stdin": ({}, {"model_type": "evil_llama", "auto_map": {"AutoConfig": "evil_tok.Cfg"}}, "auto_map"),
}


def evil_target(root: Path, variant: str) -> tuple[Path, Path]:
    """A copy of tiny:llama whose configs name `evil_tok.py`, which leaves a marker when imported."""
    d, marker = root / f"evil-{variant}", root / f"RAN-{variant}"
    shutil.copytree(resolve_target_dir("tiny:llama"), d)
    (d / "evil_tok.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('RAN')\n"
                                   "from transformers import PreTrainedTokenizerFast\n"
                                   "class HybridDNATokenizer(PreTrainedTokenizerFast):\n    pass\n"
                                   "Cfg = HybridDNATokenizer\n")
    tok, cfg, _ = VARIANTS[variant]
    for name, extra in (("tokenizer_config.json", tok), ("config.json", cfg)):
        raw = json.loads((d / name).read_text())
        (d / name).write_text(json.dumps({**raw, **extra}))
    return d, marker


@pytest.fixture
def fake_converter(tmp_path, monkeypatch):
    """llama.cpp's tree replaced by the stand-in converter; dynamic modules cached under tmp_path."""
    src = tmp_path / "llama.cpp"
    src.mkdir()
    (src / "convert_hf_to_gguf.py").write_text(FAKE_CONVERTER)
    monkeypatch.setattr(llama_env, "ensure_source", lambda *a, **k: src)
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    return src


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_gguf_refuses_a_verifier_with_code(tiny_drafter, tmp_path, fake_converter, variant):
    d, marker = evil_target(tmp_path, variant)
    out = tmp_path / "out"
    with pytest.raises(EaglewireError) as e:
        run_export(ExportConfig(ckpt=tiny_drafter[0], format="gguf", out=out, verifier=str(d)))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{d}: ") and VARIANTS[variant][2] in msg, msg
    assert "never runs model code" in msg
    assert not marker.exists(), "the directory's code ran"
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


@pytest.mark.parametrize("variant", ["hybrid-dna", "auto-map-tokenizer"])
def test_serve_llamacpp_refuses_a_target_with_code_before_anything(tiny_drafter, tmp_path, fake_converter, variant):
    d, marker = evil_target(tmp_path, variant)
    fake_server = tmp_path / "llama-server"
    fake_server.write_text("#!/bin/sh\nexit 1\n")
    fake_server.chmod(0o755)
    cfg = ServeConfig(drafter=tiny_drafter[0], target=str(d), engine="llama.cpp", llama_server=str(fake_server),
                      out=tmp_path / "serve", check_prompts=0, port=free_port())
    with pytest.raises(EaglewireError, match=f"^{d}: .*never runs model code"):
        run_serve(cfg)
    assert not marker.exists(), "the directory's code ran"
    assert not (tmp_path / "serve").exists()


def test_the_target_conversion_route_refuses_too(tmp_path, fake_converter, monkeypatch):
    """`serve --target-gguf f32` and the demo convert the target itself (`target_gguf`)."""
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path / "cache"))
    d, marker = evil_target(tmp_path, "hybrid-dna")
    with pytest.raises(EaglewireError, match="HybridDNATokenizer|auto_map"):
        gguf.target_gguf(str(d), "f32")
    with pytest.raises(EaglewireError, match="auto_map"):
        gguf.convert(tmp_path / "stage-like", tmp_path / "x.gguf", "f16", target_dir=d)
    assert not marker.exists()


def test_vllm_is_handed_no_directory_with_code(tiny_drafter, tmp_path):
    d, marker = evil_target(tmp_path, "auto-map-config")
    spec = ServeSpec(target_dir=d, drafter_dir=None, port=free_port())
    with pytest.raises(EaglewireError, match=f"^{d}: has custom code .*vLLM server could run it"):
        VllmServer(sys.executable, spec, tmp_path / "log").start(timeout=10)
    assert not (tmp_path / "log").exists()
    cfg = ServeConfig(drafter=tiny_drafter[0], target=str(d), engine="vllm", vllm_python=sys.executable,
                      out=tmp_path / "serve", check_prompts=0)
    with pytest.raises(EaglewireError, match="never runs model code"):
        run_serve(cfg)
    assert not (tmp_path / "serve").exists() and not marker.exists()


def test_a_clean_target_passes_the_check(tmp_path):
    d = tmp_path / "t"
    shutil.copytree(resolve_target_dir("tiny:llama"), d)
    assert gguf.checked_for_converter(d) == d


def test_the_guard_stops_a_converter_that_trusts_remote_code(tmp_path, monkeypatch):
    """Were a directory ever to slip past the checks: the converter's interpreter refuses to import its module,
    and reads no stdin (a `y` there is never an answer)."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    d, marker = evil_target(tmp_path, "asks-on-stdin")
    script = tmp_path / "conv.py"
    script.write_text("import sys\nfrom transformers import AutoConfig\n"
                      "AutoConfig.from_pretrained(sys.argv[1], **({'trust_remote_code': True} if sys.argv[2] == 'yes' "
                      "else {}))\n")
    for trust, says in (("yes", "refused to import a model directory's own code"), ("ask", "trust_remote_code")):
        r = gguf.run_converter(script, [str(d), trust], timeout=120, cwd=tmp_path)
        assert r.returncode != 0 and not marker.exists(), (trust, r.stderr[-500:])
        assert says in r.stderr, r.stderr[-500:]


def test_the_cli_refuses_with_y_on_stdin(tiny_drafter, tmp_path):
    """The reported case end to end: the converter inherited our stdin and a `y` there ran the code."""
    cache = tmp_path / "cache"
    src = cache / "engines" / f"llama.cpp-{llama_env.LLAMA_CPP_PYTHON}"
    (src / "src" / "vendor" / "llama.cpp").mkdir(parents=True)
    (src / "src" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").write_text(FAKE_CONVERTER)
    (src / ".source-ready").write_text("x\n")
    d, marker = evil_target(tmp_path, "asks-on-stdin")
    env = {**os.environ, "EAGLEWIRE_CACHE": str(cache), "HF_MODULES_CACHE": str(tmp_path / "hf_modules")}
    r = subprocess.run([sys.executable, "-m", "eaglewire.cli", "export", str(tiny_drafter[0]), "--format", "gguf",
                        "--verifier", str(d), "--out", str(tmp_path / "out")], input="y\ny\n", capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 2 and not marker.exists(), r.stderr[-800:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {d}: ") and "auto_map" in lines[-1], r.stderr[-800:]
