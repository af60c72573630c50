"""Training: overfit, killed-and-resumed trajectory, torchrun DDP == single process, refusals."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train


def _rows(out, split="train"):
    with open(out / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["split"] == split]


def _cfg(data, out, **kw):
    base = dict(data=data, out=out, device="cpu", batch_size=4, lr=2e-3, warmup_steps=2, save_every=3, val_fraction=0.1,
                ttt_steps=3, max_len=96)
    base.update(kw)
    return TrainConfig(**base)


def test_overfits_tiny_dataset(tiny_dataset, tmp_path):
    res = run_train(_cfg(tiny_dataset, tmp_path / "r", max_steps=300, val_fraction=0.0, ttt_steps=2, lr=3e-3))
    last = _rows(tmp_path / "r")[-5:]
    assert sum(float(r["acc_0"]) for r in last) / 5 >= 0.95
    model, prov = load_checkpoint(res["drafter"])
    assert prov.point_names == ["layers.1.out", "layers.3.out", "layers.4.out"]
    assert prov.num_layers == 8 and prov.dataset["manifest_sha"] and not prov.fingerprint.unknown
    assert prov.training["config"]["lr"] == 3e-3
    cfg = json.loads((tmp_path / "r" / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert model.d2t.dtype == torch.int64 and int(model.t2d.sum()) == 200
    same, _ = load_checkpoint(tmp_path / "r")  # a run directory stands for its drafter/
    assert torch.equal(same.fc.weight, model.fc.weight)


def _train_cmd(data, out, extra=()):
    return [sys.executable, "-m", "eaglewire.cli", "train", "--data", str(data), "--out", str(out), "--device", "cpu",
            "--batch-size", "4", "--lr", "2e-3", "--warmup-steps", "2", "--save-every", "3", "--val-fraction", "0.1",
            "--ttt-steps", "3", "--max-len", "96", "--max-steps", "12", *extra]


def test_killed_run_resumes_on_the_same_trajectory(tiny_dataset, tmp_path):
    """Reference and killed run are the same command with one thread each: the float order is the same
    on both sides, so any difference is the resume's (a skipped or repeated batch, a lost optimizer or
    RNG state moves the loss by orders of magnitude more than the tolerance), never thread noise."""
    one_thread = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    ref = tmp_path / "ref"
    r = subprocess.run(_train_cmd(tiny_dataset, ref), capture_output=True, text=True, timeout=300, env=one_thread)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "killed"
    p = subprocess.Popen(_train_cmd(tiny_dataset, out), env=dict(one_thread, EAGLEWIRE_STEP_DELAY="0.5"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline:
        meta = out / "state" / "meta.json"
        if meta.exists() and json.loads(meta.read_text())["step"] >= 6:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    killed_at = json.loads((out / "state" / "meta.json").read_text())["step"]
    assert 6 <= killed_at < 12, f"killed at step {killed_at}: the test must kill mid-run, after step 6"
    assert p.returncode == -signal.SIGKILL and not (out / "drafter").exists()
    r = subprocess.run(_train_cmd(tiny_dataset, out, ["--resume"]), capture_output=True, text=True, timeout=300,
                       env=one_thread)
    assert r.returncode == 0, r.stderr
    a, b = _rows(ref), _rows(out)
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b):
        assert float(x["loss"]) == pytest.approx(float(y["loss"]), rel=1e-5), x["step"]
    ma, _ = load_checkpoint(ref / "drafter")
    mb, _ = load_checkpoint(out / "drafter")
    for (k, va), vb in zip(ma.state_dict().items(), mb.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=1e-5, rtol=1e-4, msg=k)


def test_torchrun_two_processes_match_single(tiny_dataset, tmp_path):
    single = tmp_path / "single"
    run_train(_cfg(tiny_dataset, single, max_steps=4, batch_size=4))
    ddp = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "eaglewire.cli", "train", "--data", str(tiny_dataset), "--out", str(ddp), "--device", "cpu",
           "--batch-size", "2", "--lr", "2e-3", "--warmup-steps", "2", "--save-every", "3", "--val-fraction", "0.1",
           "--ttt-steps", "3", "--max-len", "96", "--max-steps", "4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _rows(single), _rows(ddp)
    assert len(a) == len(b) == 4
    for x, y in zip(a, b):
        assert float(x["loss"]) == pytest.approx(float(y["loss"]), rel=1e-5)
        assert float(x["acc_0"]) == pytest.approx(float(y["acc_0"]), abs=1e-9)
    ma, _ = load_checkpoint(single / "drafter")
    mb, _ = load_checkpoint(ddp / "drafter")
    for (k, va), vb in zip(ma.state_dict().items(), mb.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=2e-5, rtol=1e-4, msg=k)


def test_refusals(tiny_dataset, tmp_path):
    out = tmp_path / "r"
    run_train(_cfg(tiny_dataset, out, max_steps=2))
    with pytest.raises(EaglewireError, match="already holds a training run"):
        run_train(_cfg(tiny_dataset, out, max_steps=2))
    with pytest.raises(EaglewireError, match=r"changed config \(lr"):
        run_train(_cfg(tiny_dataset, out, max_steps=2, lr=1.0, resume=True))
    with pytest.raises(EaglewireError, match="another target"):
        run_train(_cfg(tiny_dataset, tmp_path / "x", max_steps=2, target="tiny:mistral"))


def test_nonfinite_batches_are_counted_or_stop(tiny_dataset, tmp_path, monkeypatch):
    from eaglewire.data.dataset import FeatureDataset

    orig = FeatureDataset.__getitem__

    def poisoned(self, i):
        item = orig(self, i)
        if i == 3:
            item["features"] = item["features"].clone()
            item["features"][0, 0, 0] = float("nan")
        return item

    monkeypatch.setattr(FeatureDataset, "__getitem__", poisoned)
    res = run_train(_cfg(tiny_dataset, tmp_path / "a", max_steps=10, val_fraction=0.0, max_skipped_fraction=0.5))
    _, prov = load_checkpoint(res["drafter"])
    assert prov.training["skipped_batches"] >= 1
    # over the allowed share: the run fails, states the count, and writes no drafter
    with pytest.raises(EaglewireError, match=r"\d+ of 10 steps were skipped"):
        run_train(_cfg(tiny_dataset, tmp_path / "c", max_steps=10, val_fraction=0.0, max_skipped_fraction=0.0))
    assert not (tmp_path / "c" / "drafter").exists()
    with pytest.raises(EaglewireError, match=r"step \d+: non-finite"):
        run_train(_cfg(tiny_dataset, tmp_path / "b", max_steps=10, val_fraction=0.0, nan_policy="stop"))


def test_all_nan_features_fail_instead_of_succeeding_on_nothing(tiny_dataset, tmp_path, monkeypatch):
    from eaglewire.data.dataset import FeatureDataset

    orig = FeatureDataset.__getitem__

    def nan(self, i):
        item = orig(self, i)
        item["features"] = torch.full_like(item["features"], float("nan"))
        return item

    monkeypatch.setattr(FeatureDataset, "__getitem__", nan)
    with pytest.raises(EaglewireError, match="no optimizer step was taken"):
        run_train(_cfg(tiny_dataset, tmp_path / "n", max_steps=4))
    assert not (tmp_path / "n" / "drafter").exists()


@pytest.mark.parametrize("bad, match", [
    ({"max_steps": -1}, r"--max-steps -1: expected a number >= 0"),
    ({"lr": -1.0}, r"--lr -1.0: expected a number > 0"),
    ({"batch_size": 0}, r"--batch-size 0: expected a number >= 1"),
    ({"val_fraction": 1.5}, r"--val-fraction 1.5: expected a number >= 0 and < 1"),
    ({"init": "magic"}, r"--init 'magic': expected one of random, head, target"),
])
def test_numeric_options_are_validated_before_any_work(tiny_dataset, tmp_path, bad, match):
    with pytest.raises(EaglewireError, match=match):
        run_train(_cfg(tiny_dataset, tmp_path / "v", **bad))
    assert not (tmp_path / "v").exists()


def test_a_resumed_run_reads_the_same_samples_in_the_same_order(tiny_dataset, tmp_path, monkeypatch):
    """The data order is a pure function of (seed, step): an interrupted and resumed run consumes the
    exact sample sequence of an uninterrupted one, across an epoch boundary."""
    import eaglewire.training.loop as tr

    orig = tr.train_step
    seen: list[list[int]] = []

    def logging_step(model, opt, ds, ids, *a, **kw):
        seen.append(list(ids))
        return orig(model, opt, ds, ids, *a, **kw)

    monkeypatch.setattr(tr, "train_step", logging_step)
    steps = 2 * (21 // 4) + 2  # 21 training samples, 4 per step: crosses into a third epoch
    run_train(_cfg(tiny_dataset, tmp_path / "a", max_steps=steps, save_every=1))
    full, seen[:] = list(seen), []

    class Stop(Exception):
        pass

    def stopping_step(model, opt, ds, ids, *a, **kw):
        if len(seen) == 7:
            raise Stop  # "killed" after 7 completed (and saved) steps
        return logging_step(model, opt, ds, ids, *a, **kw)

    monkeypatch.setattr(tr, "train_step", stopping_step)
    with pytest.raises(Stop):
        run_train(_cfg(tiny_dataset, tmp_path / "b", max_steps=steps, save_every=1))
    monkeypatch.setattr(tr, "train_step", logging_step)
    run_train(_cfg(tiny_dataset, tmp_path / "b", max_steps=steps, save_every=1, resume=True))
    assert seen == full and len(full) == steps
    assert len({tuple(s) for s in full[:5]}) == 5  # not one batch repeated


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED_BY_OPTIMIZER_PT",))


def test_a_malicious_optimizer_state_is_refused_in_one_line(tiny_dataset, tmp_path, monkeypatch):
    """--resume loads optimizer.pt with weights_only: a pickled object is never run, and the error is one line."""
    import pickle

    from eaglewire.infra.errors import EaglewireError

    out = tmp_path / "r"
    run_train(_cfg(tiny_dataset, out, max_steps=2, save_every=1))
    (out / "drafter").rename(tmp_path / "done")  # keep the state, as a run killed before its end would
    (out / "state" / "optimizer.pt").write_bytes(pickle.dumps(_Evil(), protocol=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EaglewireError, match="optimizer.pt: not an optimizer state eaglewire wrote"):
        run_train(_cfg(tiny_dataset, out, max_steps=2, save_every=1, resume=True))
    assert not (tmp_path / "PWNED_BY_OPTIMIZER_PT").exists()


def test_fc_mix_gives_every_slot_its_share_at_init(tiny_dataset):
    """--fc-mix m: each non-deepest slot adds about m x the deepest slot's RMS to the fc output at init."""
    import torch

    from eaglewire.data.dataset import FeatureDataset
    from eaglewire.data.manifest import Manifest
    from eaglewire.targets.load import load_target
    from eaglewire.training.config import TrainConfig
    from eaglewire.training.loop import build_drafter

    ds = FeatureDataset(tiny_dataset, verify=False)
    man = Manifest.load(tiny_dataset)
    t = load_target("tiny:llama")
    cfg = TrainConfig(data=tiny_dataset, out=tiny_dataset / "unused", init="target", fc_mix=0.25)
    m = build_drafter(cfg, t, man, torch.arange(64), ds)
    x = ds[0]["features"][1:].float()  # [T, P, H]
    ht = m.config.target_hidden_size
    w = m.fc.weight.detach()
    out_rms = [(x[:, j] @ w[:, j * ht:(j + 1) * ht].T).pow(2).mean().sqrt() for j in range(x.shape[1])]
    deep = max(range(len(out_rms)), key=lambda j: out_rms[j])
    for j, r in enumerate(out_rms):
        if j != deep:
            assert 0.1 < float(r / out_rms[deep]) < 0.5, (j, out_rms)
    with pytest.raises(EaglewireError, match="needs --init target"):
        build_drafter(TrainConfig(data=tiny_dataset, out=tiny_dataset / "unused", fc_mix=0.25), t, man, torch.arange(64), ds)


def test_a_run_started_before_an_option_existed_resumes(tiny_dataset, tmp_path):
    """train.config.json written by an older eaglewire lacks the newer options: they count as their defaults."""
    out = tmp_path / "r"
    kw = dict(data=tiny_dataset, out=out, device="cpu", max_steps=4, batch_size=4, ttt_steps=2, max_len=64,
              save_every=2, val_fraction=0.1)
    run_train(TrainConfig(**kw))
    p = out / "train.config.json"
    saved = json.loads(p.read_text())
    for k in ("feature_noise", "fc_mix", "intermediate_size", "max_train_samples"):
        saved["config"].pop(k)
    p.write_text(json.dumps(saved))
    run_train(TrainConfig(**{**kw, "max_steps": 4}, resume=True))
    saved["config"]["lr"] = 1.0  # a real change is still refused
    p.write_text(json.dumps(saved))
    with pytest.raises(EaglewireError, match="changed config"):
        run_train(TrainConfig(**kw, resume=True))
