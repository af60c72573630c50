"""vLLM gets Kimi's tokenizer as eaglewire's converted copy (`--tokenizer`), never the directory's code.

vLLM 0.32.0 loads its tokenizer with transformers' AutoTokenizer from `--tokenizer` (default: the model
directory; vllm/tokenizers/registry.py `get_tokenizer`, vllm/tokenizers/hf.py `CachedHfTokenizer`), with
trust_remote_code as the command says (eaglewire never passes it): Kimi's auto_map would be refused there.
The command line is checked here; what vLLM does with the converted directory (AutoTokenizer, no code) is
tests/targets/test_tokenizers.py's.
"""

import json
import shutil

import pytest

from eaglewire.engines.vllm_server import ServeSpec, VllmServer, engine_command, serve_command
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets import tokenizers
from eaglewire.targets.load import cache_dir, resolve_target_dir

pytestmark = pytest.mark.unit


def _arg(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_a_kimi_target_is_served_with_the_converted_tokenizer(tmp_path):
    d = resolve_target_dir("tiny:kimi_k2")
    spec = ServeSpec(target_dir=d, drafter_dir=None)
    got = _arg(engine_command("python", spec), "--tokenizer")
    assert got == str(tokenizers.converted_dir(d, cache_dir())) == _arg(serve_command(spec), "--tokenizer")
    cfg = json.loads((tokenizers.converted_dir(d, cache_dir()) / "tokenizer_config.json").read_text())
    assert "auto_map" not in cfg and (tokenizers.converted_dir(d, cache_dir()) / "tokenizer.json").is_file()
    VllmServer("python", spec, tmp_path / "log").check_inputs()  # accepted: the code is never vLLM's to run


def test_other_targets_and_a_callers_tokenizer_are_left_alone():
    assert "--tokenizer" not in engine_command("python", ServeSpec(resolve_target_dir("tiny:llama"), None))
    spec = ServeSpec(resolve_target_dir("tiny:kimi_k2"), None, extra=["--tokenizer=/mine"])
    assert [a for a in engine_command("python", spec) if a.startswith("--tokenizer")] == ["--tokenizer=/mine"]


def test_an_unknown_tokenizer_code_stays_refused_for_vllm(tmp_path):
    d = tmp_path / "t"
    shutil.copytree(resolve_target_dir("tiny:kimi_k2"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoTokenizer": ["tok_mine.Mine", None]}}))
    spec = ServeSpec(target_dir=d, drafter_dir=None)
    assert "--tokenizer" not in engine_command("python", spec)
    with pytest.raises(EaglewireError, match=r"auto_map in tokenizer_config\.json.*vLLM server could run it"):
        VllmServer("python", spec, tmp_path / "log").check_inputs()
