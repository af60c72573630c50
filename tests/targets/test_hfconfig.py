"""A target's config.json and tokenizer_config.json are checked before transformers builds from them: sizes
bounded (10^30 layers hung `inspect`), wrong types and shapes one line naming the file and field."""

import json
import shutil

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.load import load_skeleton, load_target, load_tokenizer


@pytest.fixture
def target_copy(tiny_targets, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(tiny_targets["llama"].path, d)
    return d


def _edit(path, **change):
    raw = json.loads(path.read_text())
    raw.update(change)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**30), ("vocab_size", 10**12), ("hidden_size", "abc"),
                                          ("num_attention_heads", 0), ("model_type", None), ("architectures", 12345)])
def test_config_sizes_and_types_are_checked_first(target_copy, field, value):
    _edit(target_copy / "config.json", **{field: value})
    for load in (load_target, load_skeleton):
        with pytest.raises(EaglewireError, match=rf"{target_copy / 'config.json'}: field {field} = ") as e:
            load(str(target_copy))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("file, text", [("config.json", "[1, 2]"), ("config.json", "[" * 10_000 + "]" * 10_000),
                                        ("tokenizer_config.json", '"a string"'), ("config.json", '{"a": "caf\udcff"}')])
def test_configs_that_are_no_json_object_are_one_line(target_copy, file, text):
    (target_copy / file).write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(EaglewireError, match=rf"^{target_copy / file}: ") as e:
        load_target(str(target_copy))
    assert "\n" not in str(e.value)
    if file == "tokenizer_config.json":
        with pytest.raises(EaglewireError, match=rf"^{target_copy / file}: "):
            load_tokenizer(str(target_copy))


def test_what_transformers_refuses_deep_inside_is_one_line_naming_the_target(target_copy):
    """A field of the wrong shape that only transformers' own validation sees (rope_parameters a list)."""
    _edit(target_copy / "config.json", rope_parameters=[1, 2])
    with pytest.raises(EaglewireError, match=rf"^{target_copy / 'config.json'}: transformers refuses it .*rope_parameters") as e:
        load_target(str(target_copy))
    assert "\n" not in str(e.value)
    _edit(target_copy / "config.json", rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    assert load_target(str(target_copy)).num_layers == json.loads((target_copy / "config.json").read_text())[
        "num_hidden_layers"]


@pytest.mark.parametrize("field, value", [("bos_token", 12345), ("eos_token", [1]), ("tokenizer_class", 5),
                                          ("model_max_length", "big"), ("chat_template", 3)])
def test_tokenizer_config_fields_are_typed(target_copy, field, value):
    """transformers said `Special token bos_token has to be either str or AddedToken`, naming no file."""
    _edit(target_copy / "tokenizer_config.json", **{field: value})
    for load in (load_target, load_tokenizer):
        with pytest.raises(EaglewireError, match=rf"^{target_copy / 'tokenizer_config.json'}: field {field} = ") as e:
            load(str(target_copy))
        assert "\n" not in str(e.value)
