"""--select: the drafter written is the validation's best by the chosen score, recounted independently."""

import csv
import json

import pytest
import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.decoding.acceptance import chain_stats
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.targets.load import load_target
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train
from eaglewire.training.select import Selector


def _cfg(data, out, **kw):
    base = dict(data=data, out=out, device="cpu", batch_size=2, lr=3e-3, warmup_steps=2, save_every=4, val_fraction=0.3,
                ttt_steps=3, max_len=96, max_steps=16, eval_every=2, seed=1)
    base.update(kw)
    return TrainConfig(**base)


def _val_rows(out):
    with open(out / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["split"] == "val"]


def test_acceptance_keeps_the_best_scored_weights(tiny_dataset, tmp_path):
    out = tmp_path / "acc"
    res = run_train(_cfg(tiny_dataset, out, select="acceptance"))
    rows = _val_rows(out)
    assert len(rows) == 8 and all(r["mean_acceptance_length"] for r in rows)
    scores = [float(r["mean_acceptance_length"]) for r in rows]
    best = max(range(len(rows)), key=lambda i: (scores[i], -i))  # ties keep the earlier step
    assert res["selected"]["by"] == "acceptance" and res["selected"]["step"] == int(rows[best]["step"])
    assert res["selected"]["score"] == pytest.approx(scores[best], abs=1e-12)
    # the written drafter scores exactly what was recorded for its step, counted again by the doctor's walk
    model, prov = load_checkpoint(out / "drafter")
    head = load_target(prov.target.source).model.get_output_embeddings().weight.detach().float()
    ds = FeatureDataset(tiny_dataset)
    again = chain_stats(model, ds, head, 10**6, 3, indices=prov.split["val_indices"])
    assert again["mean_acceptance_length"] == pytest.approx(scores[best], abs=1e-9)
    assert prov.training["selected"]["step"] == res["selected"]["step"]
    assert prov.validation["mean_acceptance_length"] == pytest.approx(scores[best], abs=1e-12)
    assert prov.training["last_validation"]["mean_acceptance_length"] == pytest.approx(scores[-1], abs=1e-12)


def test_loss_keeps_the_lowest_validation_loss_and_last_is_the_default(tiny_dataset, tmp_path):
    res = run_train(_cfg(tiny_dataset, tmp_path / "loss", select="loss"))
    rows = _val_rows(tmp_path / "loss")
    losses = [float(r["loss"]) for r in rows]
    assert res["selected"]["step"] == int(rows[losses.index(min(losses))]["step"])
    last = run_train(_cfg(tiny_dataset, tmp_path / "last"))
    assert last["selected"] == {"by": "last", "step": 16}
    a, _ = load_checkpoint(tmp_path / "last" / "drafter")
    b, _ = load_checkpoint(tmp_path / "loss" / "drafter")
    same = all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert same == (res["selected"]["step"] == 16)  # the same trajectory: equal exactly when the last step won


def test_selection_needs_a_validation_split(tiny_dataset, tmp_path):
    with pytest.raises(EaglewireError, match="--select acceptance: needs a validation split"):
        run_train(_cfg(tiny_dataset, tmp_path / "r", select="acceptance", val_fraction=0.0))


def test_the_kept_weights_survive_a_resume_and_damage_is_named(tmp_path):
    lin = torch.nn.Linear(3, 2)
    sel = Selector("loss", 3, None, [0], None)
    sel.consider(4, lin, {"loss": 1.0})
    kept = {k: v.clone() for k, v in lin.state_dict().items()}
    with torch.no_grad():
        lin.weight.add_(1.0)
    sel.consider(6, lin, {"loss": 2.0})  # worse: the step-4 weights stay
    meta = sel.save(tmp_path)
    meta = json.loads(json.dumps(meta))
    again = Selector("loss", 3, None, [0], None)
    again.restore(tmp_path, meta)
    assert again.apply(lin, 6) == {"by": "loss", "step": 4, "score": -1.0}
    assert all(torch.equal(kept[k], v) for k, v in lin.state_dict().items())
    with pytest.raises(EaglewireError, match=r"meta.json: field best = .*expected an object with an integer step"):
        Selector("loss", 3, None, [0], None).restore(tmp_path, {"best": {"step": "4"}})
