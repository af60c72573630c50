"""state/meta.json is typed: a damaged step is one line naming the field, never a resume from a made-up step."""

import json

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import config_to_dict
from eaglewire.training.config import TrainConfig
from eaglewire.training.runstate import check_resume_config, read_meta


@pytest.mark.parametrize("raw, field", [({"step": "abc"}, "step"), ({"step": -1}, "step"), ({"step": True}, "step"),
                                        ({"step": 10**30}, "step"), ({}, "step"), ({"step": 3, "skipped": [1]}, "skipped")])
def test_a_damaged_meta_is_one_line(tmp_path, raw, field):
    p = tmp_path / "meta.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(EaglewireError, match=rf"^{p}: field {field} = ") as e:
        read_meta(p)
    assert "\n" not in str(e.value)


def test_a_whole_meta_reads_with_its_defaults(tmp_path):
    p = tmp_path / "meta.json"
    p.write_text(json.dumps({"step": 4, "other": "kept"}))
    assert read_meta(p) == {"step": 4, "skipped": 0, "other": "kept"}
    p.write_text("[1]")
    with pytest.raises(EaglewireError, match="expected a JSON object"):
        read_meta(p)


def _recorded(tmp_path, cfg):
    (tmp_path / "train.config.json").write_text(json.dumps({"config": config_to_dict(cfg)}))


def test_a_resumed_online_run_may_reach_its_capture_server_elsewhere(tmp_path):
    """The server holding the target may move or restart between the kill and the resume; what the run trains
    on (target, data, points) is compared by content elsewhere, and every other option still may not change."""
    kw = dict(data=tmp_path / "data", out=tmp_path, online=True, engine="vllm", target="tiny:llama",
              points=["layers.0.out", "layers.3.out", "layers.6.out"])
    _recorded(tmp_path, TrainConfig(engine_url="http://a:8000", states_dir=tmp_path / "s1", **kw))
    check_resume_config(TrainConfig(engine_url="http://b:9000", states_dir=tmp_path / "s2", resume=True,
                                    request_timeout=30.0, **kw))
    with pytest.raises(EaglewireError, match="lr"):
        check_resume_config(TrainConfig(engine_url="http://b:9000", resume=True, lr=1e-2, **kw))
