"""One flag name per concept: docs/flags.md is what the CLI defines, old names still work and warn.

The page is generated from the command dataclasses (`eaglewire.flags_doc`);
`RENAMED` in infra/options.py is the one record of old names, for flags and for
the keys of saved configs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.flags_doc import config_commands, flag_rows, flags_markdown
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import (
    RENAMED,
    build_command,
    check_ranges,
    field_aliases,
    load_config_file,
    opt,
)
from eaglewire_testing.cli import run_cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "flags.md"


def test_docs_flags_md_is_what_the_cli_defines():
    assert DOC.read_text() == flags_markdown(app), (
        "docs/flags.md differs from the CLI: regenerate it with "
        "`.venv/bin/python -m eaglewire.flags_doc > docs/flags.md`")


def test_no_command_uses_an_old_name_for_its_concept():
    """An old name is live only where RENAMED says it means another concept (train's --num-layers)."""
    live: dict[str, set[str]] = {}
    for r in flag_rows(app):
        live.setdefault(r.flag, set()).add(r.command)
    for old, r in RENAMED.items():
        assert live.get(old, set()) == set(r.still_on), (old, live.get(old))
        assert r.new in live, f"{old} -> {r.new}: no command takes {r.new}"


def test_every_rename_is_declared_by_a_field_and_each_alias_is_hidden():
    used = {old for _, cls in config_commands(app) for _, old, _ in field_aliases(cls)}
    assert used == set(RENAMED)  # no stale entry, no undeclared alias
    r = CliRunner().invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    assert "--device " in r.output and "--device-type" not in r.output


def test_a_wrong_alias_declaration_fails_when_the_cli_is_built():
    @dataclasses.dataclass
    class Cfg:
        batch: int = opt(1, aliases=("--size",))  # --size is --vocab-size's old name

    with pytest.raises(ValueError, match="--size must be in RENAMED as -> --batch"):
        build_command(typer.Typer(), "x", Cfg, lambda c: c, "x")


def _layers(*args):
    r = run_cli("layers", "1", "14", "26", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr.splitlines()


def test_old_flags_still_work_with_one_line_each():
    new, quiet = _layers("--target-layers", "30", "--layers-from", "sglang")
    old, warned = _layers("--num-layers", "30", "--from", "sglang")
    assert old == new and quiet == []
    assert warned == ["--num-layers is deprecated: use --target-layers; --num-layers means the drafter's "
                      "layer count (train)", "--from is deprecated: use --layers-from"]


def test_old_plan_flags_size_the_same_run():
    common = ["plan", "--target", "tiny:llama", "--samples", "10", "--seq-len", "64", "--json"]
    old = run_cli(*common, "--device-type", "cpu", "--gen-batch", "8", "--train-batch", "2", "--train-max-len", "32",
                  "--draft-vocab", "64")
    new = run_cli(*common, "--device", "cpu", "--gen-batch-size", "8", "--batch-size", "2", "--max-len", "32",
                  "--vocab-size", "64")
    assert old.returncode == new.returncode == 0, old.stderr + new.stderr
    assert json.loads(old.stdout) == json.loads(new.stdout) and new.stderr == ""
    assert old.stderr.splitlines() == [f"{o} is deprecated: use {RENAMED[o].new}" for o in
                                       ("--device-type", "--gen-batch", "--train-batch", "--train-max-len", "--draft-vocab")]


def test_old_and_new_flag_together_is_one_error():
    r = run_cli("layers", "2", "--num-layers", "30", "--target-layers", "30")
    assert r.returncode == 2 and r.stderr.strip() == "error: --num-layers and --target-layers both given: use --target-layers only"
    r = run_cli("layers", "2")  # required, but not to click: --num-layers may give it
    assert r.returncode == 2 and r.stderr.strip().startswith("error: missing --target-layers")


def test_old_config_keys_load(tmp_path, capsys):
    from eaglewire.data.config import DataVocabConfig

    saved = tmp_path / "vocab.config.json"  # as an earlier `data vocab` wrote it
    saved.write_text(json.dumps({"command": "DataVocabConfig", "config": {"data": "ds", "size": 4096, "json": False}}))
    assert load_config_file(DataVocabConfig, saved) == {"data": Path("ds"), "vocab_size": 4096, "json": False}
    assert capsys.readouterr().err.strip() == f"--config {saved}: key 'size' is deprecated: use 'vocab_size'"
    saved.write_text(json.dumps({"data": "ds", "size": 1, "vocab_size": 2}))
    with pytest.raises(EaglewireError, match="both 'size' \\(the old name\\) and 'vocab_size' given"):
        load_config_file(DataVocabConfig, saved)


def test_required_options_may_come_only_from_the_config_file(tmp_path):
    """`train --config F` with --data and --out in F was refused as missing --data, and a path from F stayed a str."""
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"data": str(tmp_path / "nodata"), "out": str(tmp_path / "run")}))
    r = run_cli("train", "--config", cfg)
    assert r.returncode == 2 and r.stderr.strip() == f"error: dataset directory {tmp_path / 'nodata'} does not exist", r.stderr
    r = run_cli("train", "--config", cfg, "--data", tmp_path / "other")  # the flag still wins
    assert r.returncode == 2 and "other does not exist" in r.stderr
    cfg.write_text(json.dumps({"out": str(tmp_path / "run")}))
    r = run_cli("train", "--config", cfg)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: missing --data (on the command line or in --config)")


@pytest.mark.parametrize("raw, words", [({"data": 5}, "data = 5: expected a path"),
                                        ({"data": "d", "out": "o", "lr": "fast"}, "lr = 'fast': expected a number"),
                                        ({"data": "d", "out": "o", "max_steps": True}, "max_steps = True: expected an integer")])
def test_a_mistyped_config_value_is_one_line(tmp_path, raw, words):
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps(raw))
    r = run_cli("train", "--config", cfg)
    assert r.returncode == 2 and r.stderr.strip() == f"error: --config {cfg}: {words}", r.stderr


def test_old_config_keys_through_the_cli_and_flags_win(tmp_path):
    cfg = tmp_path / "plan.json"
    cfg.write_text(json.dumps({"target": "tiny:llama", "samples": 10, "seq_len": 64, "device_type": "cpu",
                               "gen_batch": 8, "train_max_len": 32, "gpus": 2}))
    r = run_cli("plan", "--config", cfg, "--gpus", "4", "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)["run"]
    assert (run["device_type"], run["train_tokens_per_epoch"], run["gpus"]) == ("cpu", 320, 4)  # the flag won
    assert len(r.stderr.splitlines()) == 3 and "key 'gen_batch' is deprecated: use 'gen_batch_size'" in r.stderr


def test_a_value_outside_choices_gets_a_did_you_mean():
    from eaglewire.plan.config import PlanConfig

    choices = "auto, cpu, cuda, h100, h200, b200, a100, a100-40gb, l40s, mi300x"  # plan names GPUs (issue 57)
    with pytest.raises(EaglewireError, match=rf"^--device 'cdua': expected one of {choices}; did you mean 'cuda'\?$"):
        check_ranges(PlanConfig(device="cdua"))
    with pytest.raises(EaglewireError, match=rf"^--device 'mps': expected one of {choices}$"):  # nothing close
        check_ranges(PlanConfig(device="mps"))
    r = run_cli("train", "--data", "d", "--out", "o", "--init", "haed")
    assert r.returncode == 2 and "--init 'haed': expected one of random, head, target; did you mean 'head'?" in r.stderr


def test_a_mistyped_flag_name_gets_click_suggestions():
    r = CliRunner().invoke(app, ["plan", "--gpuss", "2"])
    assert r.exit_code == 2 and "No such option: --gpuss" in r.output and "--gpus" in r.output
    r = CliRunner().invoke(app, ["data", "vocab", "ds", "--vocab-sise", "3"])
    assert r.exit_code == 2 and "--vocab-size" in r.output


def test_one_default_per_concept():
    from eaglewire.doctor.config import DoctorOnlineConfig
    from eaglewire.serve.config import ServeConfig
    from eaglewire.targets.config import LayersConfig
    from eaglewire.targets.points import DEFAULT_ENGINE

    shard = {r.default for r in flag_rows(app) if r.flag == "--shard-samples"}
    assert shard == {"`256`"}
    # ids mean nothing without their engine: `layers` never assumes one (a wrong default is an off-by-one layer)
    assert LayersConfig.__dataclass_fields__["layers_from"].default is dataclasses.MISSING
    assert DoctorOnlineConfig.__dataclass_fields__["layers_from"].default == DEFAULT_ENGINE
    assert ServeConfig.__dataclass_fields__["engine"].default == DEFAULT_ENGINE


@pytest.mark.parametrize("record,engine", [({"format": "sglang"}, "sglang"), ({"format": "speculators"}, "speculators"),
                                           ({"format": "sglang", "engine_spec": "sglang==0.5.12"}, "sglang==0.5.12"),
                                           ({"format": "sglang", "engine_spec": "tgi==1"}, "sglang"),
                                           ({"format": "eagle"}, None), ("not json", None), (None, None)])
def test_doctor_config_checks_the_engine_an_export_was_written_for(tmp_path, record, engine):
    from eaglewire.doctor.records import exported_for
    from eaglewire.export.exporter import RECORD

    if record is not None:
        (tmp_path / RECORD).write_text(record if isinstance(record, str) else json.dumps(record))
    assert exported_for(tmp_path) == engine


def test_to_argv_rebuilds_the_config_through_the_cli():
    """What `demo --print-commands` prints parses back to the very config it came from."""
    import typer.main

    from eaglewire.cli import app
    from eaglewire.infra.options import to_argv
    from eaglewire.targets.config import LayersConfig
    from eaglewire.training.config import TrainConfig

    cfg = TrainConfig(data=Path("d"), out=Path("o"), lr=0.0012345678, feature_noise=1234567.0, epochs=3,
                      freeze_head=True, points=["layers.1.out", "layers.5.out"])
    argv = to_argv(cfg)
    assert "0.0012345678" in argv and "1234567.0" in argv and argv.count("--points") == 2
    from eaglewire.infra.options import config_from_dict

    cmd = typer.main.get_command(app).commands["train"]
    params = cmd.make_context("train", list(argv)).params
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()
              if k in {f.name for f in dataclasses.fields(TrainConfig)}}
    assert config_from_dict(TrainConfig, params) == cfg
    assert to_argv(LayersConfig(ids=[2, 30, 58], target_layers=61, layers_from="sglang"))[:3] == ["2", "30", "58"]


def test_ids_are_never_read_with_a_guessed_engine(tmp_path):
    from eaglewire_testing.cli import run_cli

    r = run_cli("layers", "--target-layers", "61", "2", "30", "58")
    assert r.returncode != 0 and "--layers-from" in (r.stderr + r.stdout)
    d = tmp_path / "foreign"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}))
    r = run_cli("doctor", "config", str(d), "--target-layers", "30")
    assert r.returncode != 0 and "records no export" in r.stderr and "--engine" in r.stderr


def test_doctor_online_names_the_ids_engine_layers_from_and_keeps_engine_as_an_alias(tmp_path):
    """`doctor online --engine` meant what `--layers-from` means elsewhere: the old flag still works, deprecated."""
    from eaglewire.doctor.config import DoctorOnlineConfig

    r = CliRunner().invoke(app, ["doctor", "online", "--help"], env={"COLUMNS": "200"})
    assert "--layers-from" in r.output and "--engine " not in r.output
    saved = tmp_path / "c.json"
    saved.write_text('{"drafter": "d", "data": "x", "engine": "sglang"}')  # a config saved before the rename
    assert load_config_file(DoctorOnlineConfig, saved)["layers_from"] == "sglang"


def test_a_value_out_of_range_in_a_config_file_names_the_file(tmp_path):
    """`--lr -1` in a --config file said `--lr -1: expected ...`, as if typed: the file is named now."""
    cfg = tmp_path / "train.json"
    for lr in (-1, 1e30):
        cfg.write_text(json.dumps({"data": str(tmp_path / "ds"), "out": str(tmp_path / "run"), "lr": lr}))
        r = CliRunner().invoke(app, ["train", "--config", str(cfg)])
        assert str(r.exception) == f"--config {cfg}: --lr {lr!r}: expected a number > 0 and <= 1"
    r = CliRunner().invoke(app, ["train", "--config", str(cfg), "--lr", "2"])  # a flag wins, and is named as typed
    assert str(r.exception) == "--lr 2.0: expected a number > 0 and <= 1"
