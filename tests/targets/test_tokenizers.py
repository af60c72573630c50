"""Kimi's tokenizer (tiktoken.model + its own code named by auto_map) read natively, never importing the code.

The reference is tiktoken itself: a `tiktoken.Encoding` over the same rank file (parsed by tiktoken's own
loader), with Kimi's split pattern and Kimi's special-token numbering (256 reserved ids after the ranks,
named by added_tokens_decoder), exactly what the published `TikTokenTokenizer.__init__` builds.
"""

import json
import shutil

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import AutoTokenizer

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets import tokenizers
from eaglewire.targets.codecheck import foreign_code
from eaglewire.targets.load import load_tokenizer, resolve_target_dir
from eaglewire.targets.tiny_families import CODE_RAN, KIMI_TOKENIZER_AUTO_MAP
from eaglewire_testing.cli import run_cli
from eaglewire_testing.tinydata import build_tiny_dataset

pytestmark = pytest.mark.unit

TEXTS = ["Hello WORLD, it's 12345 apples.\n\n  x", "你好世界abc ÉCOLE école Straße don'T  \t\n",
         "[BOS]<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>ok",
         "a<|reserved_token_700|>b [EOS] emoji 🦅 and\r\nCRLF", ""]
_MARKER_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n"


def _reference(d):
    """tiktoken over d's files as Kimi's TikTokenTokenizer builds it (its __init__ in tokenization_kimi.py)."""
    ranks = load_tiktoken_bpe(str(d / "tiktoken.model"))
    named = {int(k): v["content"] for k, v in json.loads((d / "tokenizer_config.json").read_text())
             ["added_tokens_decoder"].items()}
    special = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(len(ranks), len(ranks) + 256)}
    return tiktoken.Encoding("kimi", pat_str=tokenizers.KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=special)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """A copy of tiny:kimi_k2 (the real tokenizer layout) whose tokenization_kimi.py writes a marker if imported."""
    d = tmp_path_factory.mktemp("kimi") / "kimi_k2"
    shutil.copytree(resolve_target_dir("tiny:kimi_k2"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["auto_map"] == KIMI_TOKENIZER_AUTO_MAP and not (d / "tokenizer.json").exists()  # as published
    marker = d.parent / "marker"
    (d / "tokenization_kimi.py").write_text(_MARKER_CODE.format(marker=str(marker)))
    return d, marker


@pytest.mark.parametrize("arch", ["kimi_k25", "kimi_k2"])
def test_the_tiny_ships_kimis_real_tokenizer_layout(arch):
    d = resolve_target_dir(f"tiny:{arch}")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["auto_map"] == KIMI_TOKENIZER_AUTO_MAP and cfg["tokenizer_class"] == "TikTokenTokenizer"
    assert (d / "tiktoken.model").is_file() and (d / "tokenization_kimi.py").is_file()
    assert not (d / "tokenizer.json").exists()
    n = len(load_tiktoken_bpe(str(d / "tiktoken.model")))
    named = {int(k): v["content"] for k, v in cfg["added_tokens_decoder"].items()}
    assert [named[n + k] for k in (0, 1, 2, 3, 4, 17, 22, 23)] == [  # Kimi-K2's published ids, minus 163584
        "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<think>", "</think>"]


def test_kimis_tokenizer_encodes_and_decodes_as_tiktoken_does(kimi):
    d, marker = kimi
    tok, ref = load_tokenizer(str(d)), _reference(d)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=True)
        assert ids == ref.encode(text, allowed_special="all"), text
        assert tok.decode(ids) == ref.decode(ids) == text
    assert len(tok) == ref.n_vocab and tok.bos_token == "[BOS]" and tok.convert_tokens_to_ids("<think>") == ref.encode(
        "<think>", allowed_special="all")[0]
    assert not marker.exists()


def test_inspect_and_data_build_never_import_the_tokenizer_code(kimi, tmp_path):
    d, marker = kimi
    r = run_cli("inspect", "--target", d, "--json")
    assert r.returncode == 0, r.stderr
    ds = build_tiny_dataset(tmp_path, target=str(d), n=2, max_new_tokens=2, vocab_size=64)
    assert (ds / "manifest.json").is_file() or any(ds.iterdir())
    assert not marker.exists() and not (resolve_target_dir("tiny:kimi_k2") / CODE_RAN).exists()


def test_the_converted_copy_loads_through_autotokenizer_without_code(kimi, tmp_path):
    """What vLLM reads (`--tokenizer`): transformers' AutoTokenizer, trust_remote_code off, no auto_map left."""
    d, marker = kimi
    out = tokenizers.converted_dir(d, tmp_path)
    assert "auto_map" not in json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizers.converted_dir(d, tmp_path) == out  # cached by content
    tok, ref = AutoTokenizer.from_pretrained(out, trust_remote_code=False), _reference(d)
    assert [tok.encode(t) for t in TEXTS] == [ref.encode(t, allowed_special="all") for t in TEXTS]
    assert tok.chat_template == (d / "chat_template.jinja").read_text()
    assert not marker.exists()


def test_codecheck_accepts_only_a_known_tokenizer_family_with_its_file(kimi, tmp_path):
    d, _ = kimi
    assert foreign_code(d, strict=False) is None  # eaglewire and vLLM (--tokenizer) read it natively
    assert foreign_code(d, strict=True).startswith("has custom code (auto_map in ")  # llama.cpp runs code
    other = tmp_path / "other"
    shutil.copytree(d, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    for auto_map in ({"AutoTokenizer": ["tokenization_mine.MyTokenizer", None]},
                     {**KIMI_TOKENIZER_AUTO_MAP, "AutoProcessor": "processing_kimi.KimiProcessor"}):
        (other / "tokenizer_config.json").write_text(json.dumps({**cfg, "auto_map": auto_map}))
        assert foreign_code(other, strict=False) == "has custom code (auto_map in tokenizer_config.json)"
        with pytest.raises(EaglewireError, match=r"^[^\n]*custom code[^\n]*add a tokenizer\.json[^\n]*$"):
            load_tokenizer(str(other))


def test_a_missing_rank_file_is_named_in_one_line(kimi, tmp_path):
    bad = tmp_path / "norank"
    shutil.copytree(kimi[0], bad)
    (bad / "tiktoken.model").unlink()
    assert foreign_code(bad, strict=False) == "has custom code (auto_map in tokenizer_config.json)"
    with pytest.raises(EaglewireError, match=r"^[^\n]*there is no tiktoken\.model[^\n]*copy the checkpoint's tiktoken\.model$"):
        load_tokenizer(str(bad))


@pytest.mark.parametrize("lines,why", [
    (b"IQ== 0\nnot-base64! 1\n", r"line 2: expected `<base64 token> <rank>`"),
    (b"IQ== 0\nIg==\n", r"line 2: expected"),
    (b"IQ== 0\nIQ== 1\n", r"line 2: token b'!' ranked twice"),
    (b"IQ== 0\nIg== 2\n", r"expected ranks 0\.\.1 each once"),
])
def test_a_damaged_rank_file_is_refused_in_one_line_naming_the_line(kimi, tmp_path, lines, why):
    bad = tmp_path / "bad"
    shutil.copytree(kimi[0], bad)
    (bad / "tiktoken.model").write_bytes(lines)
    with pytest.raises(EaglewireError, match=rf"^[^\n]*tiktoken\.model[^\n]*{why}[^\n]*$"):
        load_tokenizer(str(bad))


def test_an_added_token_outside_the_reserved_ids_is_refused(kimi, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(kimi[0], bad)
    cfg = json.loads((bad / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"]["5"] = {"content": "<|oops|>", "special": True}
    (bad / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(EaglewireError, match=r"added_tokens_decoder\['5'\]: expected a token text at an id in"):
        load_tokenizer(str(bad))


@pytest.mark.parametrize("auto_map,known", [
    (KIMI_TOKENIZER_AUTO_MAP, True),
    ({"AutoTokenizer": "tokenization_kimi.TikTokenTokenizer"}, True),
    ({"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", "tokenization_kimi.TikTokenTokenizerFast"]}, False),
    ({"AutoTokenizer": ["tokenization_kimi.Other", None]}, False),
    ({"AutoConfig": "configuration_kimi.KimiConfig"}, False),
    ("tokenization_kimi.TikTokenTokenizer", False),
])
def test_only_kimis_tokenizer_class_is_a_known_family(auto_map, known):
    assert (tokenizers.family_of_auto_map(auto_map) is tokenizers.KIMI) is known


def test_a_token_role_that_is_no_special_token_is_refused(kimi, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(kimi[0], bad)
    cfg = json.loads((bad / "tokenizer_config.json").read_text())
    (bad / "tokenizer_config.json").write_text(json.dumps({**cfg, "eos_token": "<|not_there|>"}))
    with pytest.raises(EaglewireError, match=r"tokenizer_config\.json: field eos_token = '<\|not_there\|>': expected one"):
        load_tokenizer(str(bad))
