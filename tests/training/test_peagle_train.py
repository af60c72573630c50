"""`eaglewire train --drafter p-eagle` on tiny targets: checkpoint, memorisation, resume, acceptance, refusals."""

import csv
import json

import pytest
import torch

import eaglewire.training.schedule as schedule
from eaglewire.data.dataset import collate
from eaglewire.data.manifest import Manifest
from eaglewire.decoding.peagle import generate_parallel
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.saved.peagle import PEAGLE_KEY
from eaglewire.targets.load import load_target
from eaglewire.targets.shards import load_frozen
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import build_drafter, run_train
from eaglewire.training.offline import setup_offline
from eaglewire.training.peagle_loss import draw_elements
from eaglewire.training.peagle_train import element_generator
from eaglewire_testing.tinydata import build_tiny_dataset

pytestmark = pytest.mark.unit

STEPS, K = 12, 3
# four samples read every step (max_train_samples = batch): a memorisation set; validation at the end only
KW = dict(drafter="p-eagle", device="cpu", max_steps=STEPS, batch_size=4, max_train_samples=4, lr=3e-3,
          warmup_steps=2, max_len=48, val_fraction=0.2, eval_every=STEPS, save_every=6)


def _rows(out, split="train"):
    with open(out / "metrics.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["split"] == split]


@pytest.fixture(scope="module")
def base(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("peagle") / "a"
    res = run_train(TrainConfig(data=tiny_dataset, out=out, **KW))
    return out, res


def _answers(ds) -> set[int]:
    """Token ids at loss positions, read sample by sample (the reference for the refusal)."""
    return {int(t) for i in range(len(ds)) for t in ds[i]["input_ids"][ds[i]["loss_mask"].bool()]}


@torch.no_grad()
def _parallel_draft_validation(model: PEagleDrafter, ds, val_idx, head_w, seed: int, batch_size: int) -> dict:
    """The validation figures re-run element by element through the inference forward: element (a, d) is draft d
    of `parallel_draft` over the real rows 0..a (x[t+1], f[t]) at positions 0..a, its target the target's
    distribution at a+d+1 (argmax over the full vocabulary, KL over the draft vocabulary)."""
    gen = element_generator(seed, 0, 0, "val")  # the draw evaluate() makes, then scored independently
    rows = head_w[model.draft_target_ids()]
    correct, count, kl = torch.zeros(K), torch.zeros(K), 0.0
    for j in range(0, len(val_idx), batch_size):
        b = collate([ds[i] for i in val_idx[j:j + batch_size]])
        el = draw_elements(b["loss_mask"], b["attention_mask"], K, generator=gen)
        feats = b["features"].float().flatten(2)
        for i in range(el.anchor.shape[0]):
            drafts = {}
            for a, d in zip(el.anchor[i][el.weight[i]].tolist(), el.depth[i][el.weight[i]].tolist()):
                if a not in drafts:
                    drafts[a] = model.parallel_draft(b["input_ids"][i:i + 1, 1:a + 2], feats[i:i + 1, :a + 1],
                                                     torch.arange(a + 1)[None], None, K)[0][0].log_softmax(-1)
                th = b["target_hidden"][i, a + d + 1].float()
                p = (rows @ th).softmax(-1)
                kl += float((p * (p.clamp_min(1e-30).log() - drafts[a][d])).sum())
                hit = int(model.draft_to_target(drafts[a][d].argmax()[None])[0]) == int((head_w @ th).argmax())
                correct[d] += hit
                count[d] += 1
    return {"loss": kl / float(count.sum()), "acc": (correct / count).tolist()}


def test_checkpoint_is_a_peagle_drafter_whose_parallel_draft_gives_the_recorded_validation(base, tiny_dataset):
    """The saved weights, drafting through `parallel_draft` (the inference forward, not the training one) on the
    held-out split, give back the loss and per-depth accuracy recorded at the end of training."""
    out, res = base
    model, prov = load_checkpoint(out)
    assert isinstance(model, PEagleDrafter) and model.mask_token_id == res["peagle"]["mask_token_id"]
    assert json.loads((out / "drafter" / "config.json").read_text())[PEAGLE_KEY] == {
        "mask_token_id": model.mask_token_id, "depths": K}
    inputs = setup_offline(TrainConfig(data=tiny_dataset, out=out, max_len=KW["max_len"]))
    head_w = inputs.target.model.get_output_embeddings().weight.detach().float()
    again = _parallel_draft_validation(model, inputs.ds, prov.split["val_indices"], head_w, 0, KW["batch_size"])
    assert again["loss"] == pytest.approx(res["validation"]["loss"], rel=1e-4)
    assert again["acc"] == pytest.approx(res["validation"]["acc"], abs=1e-6)
    assert prov.validation["acc"] == res["validation"]["acc"] and len(again["acc"]) == K


def test_metrics_and_recorded_choices(base, tiny_dataset):
    out, res = base
    rows = _rows(out)
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert {"loss", "acc_0", "acc_1", "acc_2"} <= set(rows[0]) and rows[0]["acc_2"] != ""
    rec = json.loads((out / "train.config.json").read_text())
    mask = rec["peagle"]["mask_token_id"]
    assert rec["config"]["drafter"] == "p-eagle" and rec["peagle"]["depths"] == K and rec["peagle"]["mask_token_why"]
    ds = setup_offline(TrainConfig(data=tiny_dataset, out=out), need_vocab=False).ds
    assert 0 <= mask < 384 and mask not in _answers(ds)
    _, prov = load_checkpoint(out)
    assert prov.training["peagle"] == rec["peagle"] and prov.training["drafter"] == "p-eagle"


def test_loss_decreases_on_a_memorisation_set(base):
    losses = [float(r["loss"]) for r in _rows(base[0])]
    assert sum(losses[-4:]) < sum(losses[:4])
    assert sum(b < a for a, b in zip(losses, losses[1:])) > (len(losses) - 1) / 2


def test_killed_run_resumes_bit_exactly(base, tiny_dataset, tmp_path, monkeypatch):
    out_a, _ = base
    out = tmp_path / "b"
    monkeypatch.setattr(schedule, "_STOP_AFTER", 6)
    with pytest.raises(SystemExit):
        run_train(TrainConfig(data=tiny_dataset, out=out, **KW))
    assert not (out / "drafter").exists() and (out / "state").is_dir()
    monkeypatch.setattr(schedule, "_STOP_AFTER", 0)
    run_train(TrainConfig(data=tiny_dataset, out=out, resume=True, **KW))
    (a, _), (b, _) = load_checkpoint(out_a), load_checkpoint(out)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert [r["loss"] for r in _rows(out)] == [r["loss"] for r in _rows(out_a)]


def test_online_equals_offline_at_step_one(base, tiny_dataset, tmp_path):
    """--online computes the same features in the loop: the same elements drawn, the same first loss."""
    names = Manifest.load(tiny_dataset).point_names
    run_train(TrainConfig(data=tiny_dataset, out=tmp_path / "on", online=True, points=names, store_dtype="fp32",
                          **{**KW, "max_steps": 1, "eval_every": 0}))
    on, off = _rows(tmp_path / "on")[0], _rows(base[0])[0]
    assert float(on["loss"]) == pytest.approx(float(off["loss"]), rel=1e-5)
    assert [float(on[f"acc_{j}"]) for j in range(K)] == pytest.approx([float(off[f"acc_{j}"]) for j in range(K)])


def test_a_non_llama_family_trains(tmp_path_factory):
    """tiny:qwen3 (q/k norms in the target): trains, the checkpoint loads as a P-EAGLE drafter of its points."""
    ds = build_tiny_dataset(tmp_path_factory.mktemp("qwen3ds"), arch="qwen3", n=8, max_new_tokens=16)
    out = tmp_path_factory.mktemp("qwen3run") / "r"
    res = run_train(TrainConfig(data=ds, out=out, **{**KW, "max_steps": 3, "eval_every": 0, "val_fraction": 0.25,
                                                     "max_len": 128}))
    model, prov = load_checkpoint(out)
    assert isinstance(model, PEagleDrafter) and prov.points == Manifest.load(ds).points
    assert model.config.target_hidden_size == load_frozen("tiny:qwen3").hidden_size
    assert len(res["validation"]["acc"]) == K


def test_training_makes_the_parallel_slots_accepted(tmp_path_factory):
    """Trained on tiny:mistral's own greedy answers, the drafter gets more drafts accepted at positions 2..K by
    `generate_parallel` than the same drafter (same seed, same init) before training: the slots learned. Measured on
    these prompts: 40 steps on 8 answers accept none past position 1; 80 steps on these 4, 8 (the untrained: 0)."""
    ds = build_tiny_dataset(tmp_path_factory.mktemp("mistralds"), arch="mistral", n=4, max_new_tokens=24)
    out = tmp_path_factory.mktemp("mistralrun") / "r"
    cfg = TrainConfig(data=ds, out=out, **{**KW, "max_steps": 80, "batch_size": 4, "max_train_samples": 0,
                                           "val_fraction": 0.0, "eval_every": 0, "save_every": 1000, "max_len": 128})
    run_train(cfg)
    trained, prov = load_checkpoint(out)
    inputs = setup_offline(cfg)
    before = build_drafter(cfg, inputs.target, inputs.manifest, inputs.vocab.selected, inputs.ds,
                           trained.mask_token_id).eval()
    target = load_target("tiny:mistral")
    per_pos = {"trained": [0] * K, "before": [0] * K}
    # the prompts of the dataset's first samples (what precedes their answers); fast=False: the plain forward,
    # measured far cheaper than the lean kernel's threads on a loaded 2-core machine (the counts are the same)
    for i in range(2):
        s = inputs.ds[i]
        ids = s["input_ids"][: int(s["loss_mask"].nonzero()[0])].tolist()
        for name, d in (("trained", trained), ("before", before)):
            got = generate_parallel(target, d, prov.points, ids, 24, k=K, fast=False).accepted_per_pos()
            per_pos[name] = [x + y for x, y in zip(per_pos[name], got + [0] * K)]
    assert sum(per_pos["trained"][1:]) > sum(per_pos["before"][1:]) and sum(per_pos["trained"][1:]) > 0, per_pos


def _refused(cfg: TrainConfig, *words: str) -> None:
    with pytest.raises(EaglewireError) as e:
        run_train(cfg)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert not cfg.out.exists()


@pytest.mark.parametrize("drafter,opt,words", [
    ("p-eagle", {"ttt_steps": 3}, ("--ttt-steps", "--drafter eagle3 only", "not --drafter p-eagle")),
    ("p-eagle", {"block_size": 8}, ("--block-size", "--drafter dflash only")),
    ("eagle3", {"parallel_depths": 4}, ("--parallel-depths", "--drafter p-eagle only")),
    ("dflash", {"parallel_depths": 4}, ("--parallel-depths", "not --drafter dflash")),
    ("eagle3", {"mask_token_id": 5}, ("--mask-token-id", "--drafter dflash or p-eagle only")),
    ("p-eagle", {"select": "acceptance"}, ("--select acceptance", "P-EAGLE")),
])
def test_options_p_eagle_does_not_read_are_refused(tiny_dataset, tmp_path, drafter, opt, words):
    _refused(TrainConfig(data=tiny_dataset, out=tmp_path / "r", **{**KW, "drafter": drafter, **opt}), *words)


def test_a_mask_id_in_the_answers_is_refused(tiny_dataset, tmp_path):
    ds = setup_offline(TrainConfig(data=tiny_dataset, out=tmp_path / "x"), need_vocab=False).ds
    used = min(_answers(ds))
    _refused(TrainConfig(data=tiny_dataset, out=tmp_path / "r", **{**KW, "mask_token_id": used}),
             f"--mask-token-id {used}", "answers")
    _refused(TrainConfig(data=tiny_dataset, out=tmp_path / "r", **{**KW, "mask_token_id": 384}), "[0, 384)")
