"""`eaglewire train --drafter dflash` on tiny targets: checkpoint, memorisation, resume, online, refusals."""

import csv
import json
from types import SimpleNamespace

import pytest
import torch

import eaglewire.training.schedule as schedule
from eaglewire.data.manifest import Manifest
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import is_dflash_checkpoint, load_dflash_checkpoint
from eaglewire.targets.shards import load_frozen
from eaglewire.training.config import TrainConfig
from eaglewire.training.dflash_train import evaluate, used_token_ids
from eaglewire.training.loop import run_train
from eaglewire.training.offline import setup_offline
from eaglewire_testing.tinydata import build_tiny_dataset

pytestmark = pytest.mark.unit

STEPS = 12
# four samples read every step (max_train_samples = batch): a memorisation set; validation at the end only
KW = dict(drafter="dflash", device="cpu", max_steps=STEPS, batch_size=4, max_train_samples=4, lr=3e-3,
          warmup_steps=2, max_len=48, num_anchors=8, val_fraction=0.2, eval_every=STEPS, save_every=6)


def _rows(out, split="train"):
    with open(out / "metrics.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["split"] == split]


@pytest.fixture(scope="module")
def base(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash") / "a"
    res = run_train(TrainConfig(data=tiny_dataset, out=out, **KW))
    return out, res


def test_checkpoint_loads_and_reproduces_its_recorded_validation(base, tiny_dataset):
    """The saved weights, re-run on the held-out split, give back the metrics recorded at the end of training:
    the checkpoint is the trained drafter, every tensor of it (a dropped or re-initialised one would not)."""
    out, res = base
    model, prov = load_dflash_checkpoint(out)  # the run dir stands for drafter/
    man = Manifest.load(tiny_dataset)
    assert list(model.config.target_layer_ids) == [p.layer for p in man.points] and prov.points == man.points
    inputs = setup_offline(TrainConfig(data=tiny_dataset, out=out, max_len=KW["max_len"]), need_vocab=False)
    lm = inputs.target.model
    cfg = TrainConfig(data=tiny_dataset, out=out, **KW)
    run = SimpleNamespace(cfg=cfg, model=model, ds=inputs.ds, val_idx=prov.split["val_indices"], device=torch.device("cpu"),
                          embed_w=lm.get_input_embeddings().weight.float(), head_w=lm.get_output_embeddings().weight.float())
    again = evaluate(run, STEPS)
    assert again["loss"] == pytest.approx(res["validation"]["loss"], rel=1e-6)
    assert again["acc"] == pytest.approx(res["validation"]["acc"], abs=1e-6)
    assert prov.validation["loss"] == res["validation"]["loss"]


def test_metrics_and_resolved_config(base, tiny_dataset):
    out, res = base
    rows = _rows(out)
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert {"loss", "acc_0", "acc_1", "acc_2"} <= set(rows[0])  # block 4: three drafted slots
    v = res["validation"]
    a = v["acc"]
    assert v["mean_acceptance_length"] == pytest.approx(1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2])
    val = _rows(out, "val")[-1]
    assert float(val["mean_acceptance_length"]) == pytest.approx(v["mean_acceptance_length"])
    rec = json.loads((out / "train.config.json").read_text())
    mask = rec["dflash"]["mask_token_id"]
    assert rec["config"]["drafter"] == "dflash" and rec["dflash"]["mask_token_why"]
    # tiny:llama has no mask token and no spare embedding row: an id the training data never holds
    assert 0 <= mask < 384 and mask not in used_token_ids(setup_offline(
        TrainConfig(data=tiny_dataset, out=out), need_vocab=False).ds)
    assert json.loads((out / "drafter" / "config.json").read_text())["dflash_config"]["mask_token_id"] == mask


def test_loss_decreases_on_a_memorisation_set(base):
    losses = [float(r["loss"]) for r in _rows(base[0])]
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first
    # mostly downhill, not one lucky step: more decreasing step pairs than increasing ones
    down = sum(b < a for a, b in zip(losses, losses[1:]))
    assert down > (len(losses) - 1) / 2


def test_killed_run_resumes_bit_exactly(base, tiny_dataset, tmp_path, monkeypatch):
    out_a, _ = base
    out = tmp_path / "b"
    monkeypatch.setattr(schedule, "_STOP_AFTER", 6)
    with pytest.raises(SystemExit):
        run_train(TrainConfig(data=tiny_dataset, out=out, **KW))
    assert not (out / "drafter").exists() and (out / "state").is_dir()
    monkeypatch.setattr(schedule, "_STOP_AFTER", 0)
    run_train(TrainConfig(data=tiny_dataset, out=out, resume=True, **KW))
    a, _ = load_dflash_checkpoint(out_a)
    b, _ = load_dflash_checkpoint(out)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert [r["loss"] for r in _rows(out)] == [r["loss"] for r in _rows(out_a)]


def test_online_equals_offline_at_step_one(base, tiny_dataset, tmp_path):
    names = Manifest.load(tiny_dataset).point_names
    run_train(TrainConfig(data=tiny_dataset, out=tmp_path / "on", online=True, points=names, store_dtype="fp32",
                          **{**KW, "max_steps": 1, "eval_every": 0}))
    on, off = _rows(tmp_path / "on")[0], _rows(base[0])[0]
    assert float(on["loss"]) == pytest.approx(float(off["loss"]), rel=1e-5)
    assert [float(on[f"acc_{j}"]) for j in range(3)] == pytest.approx([float(off[f"acc_{j}"]) for j in range(3)])


def test_a_non_llama_family_trains(tmp_path_factory):
    """tiny:qwen3 (q/k norms in the target): the drafter reads its dataset's points and the checkpoint loads."""
    ds = build_tiny_dataset(tmp_path_factory.mktemp("qwen3ds"), arch="qwen3", n=8, max_new_tokens=16)
    out = tmp_path_factory.mktemp("qwen3run") / "r"
    with pytest.raises(EaglewireError, match="--max-len 48"):  # qwen3's chat prompts are longer than 48 tokens
        run_train(TrainConfig(data=ds, out=out, **{**KW, "max_steps": 3}))
    assert not out.exists()
    res = run_train(TrainConfig(data=ds, out=out, **{**KW, "max_steps": 3, "eval_every": 0, "val_fraction": 0.25,
                                                     "max_len": 128}))
    model, prov = load_dflash_checkpoint(out)
    assert is_dflash_checkpoint(out) and prov.points == Manifest.load(ds).points
    assert model.config.hidden_size == load_frozen("tiny:qwen3").hidden_size
    assert 1.0 <= res["validation"]["mean_acceptance_length"] <= 4.0


def _refused(cfg: TrainConfig, *words: str) -> None:
    with pytest.raises(EaglewireError) as e:
        run_train(cfg)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert not cfg.out.exists()


@pytest.mark.parametrize("points,word", [(["embed", "layers.3.out"], "embed"),
                                         (["layers.1.out", "final_norm"], "final_norm"),
                                         (["layers.4.out", "layers.1.out"], "ascending")])
def test_points_a_dflash_drafter_cannot_read_are_refused(tiny_dataset, tmp_path, points, word):
    _refused(TrainConfig(data=tiny_dataset, out=tmp_path / "r", online=True, points=points, **KW), word)


@pytest.mark.parametrize("drafter,opt", [("dflash", {"ttt_steps": 3}), ("dflash", {"init": "head"}),
                                         ("eagle3", {"block_size": 8})])
def test_an_option_of_the_other_drafter_is_refused(tiny_dataset, tmp_path, drafter, opt):
    flag = "--" + next(iter(opt)).replace("_", "-")
    _refused(TrainConfig(data=tiny_dataset, out=tmp_path / "r", **{**KW, "drafter": drafter, **opt}), flag)


def test_a_mask_id_outside_the_vocabulary_is_refused(tiny_dataset, tmp_path):
    _refused(TrainConfig(data=tiny_dataset, out=tmp_path / "r", **{**KW, "mask_token_id": 384}),
             "--mask-token-id 384", "[0, 384)")


def test_online_without_points_reads_zlab_default_ids(tiny_dataset, tmp_path):
    """--online and no --points: one id per draft layer by z-lab's rule, round(1 + j*(L-4)/(n-1)):
    L = 8, n = 2 -> [1, 5] (worked by hand), not the EAGLE-3 triple point_option defaults to."""
    out = tmp_path / "on"
    run_train(TrainConfig(data=tiny_dataset, out=out, online=True, num_layers=2,
                          **{**KW, "max_steps": 1, "eval_every": 0, "val_fraction": 0.0}))
    model, prov = load_dflash_checkpoint(out)
    assert list(model.config.target_layer_ids) == [1, 5] and prov.point_names == ["layers.1.out", "layers.5.out"]
    assert json.loads((out / "drafter" / "config.json").read_text())["num_hidden_layers"] == 2


class _Tok:
    """A tokenizer as resolve_mask_token reads one: SmolLM2's shape (specials 0..16, only 0..2 listed as such)."""

    def __init__(self, n=49152, mask=None):
        self.n, self.mask_token_id, self.mask_token = n, mask, "<mask>"
        self.all_special_ids = [0, 1, 2]
        self.added_tokens_decoder = {i: SimpleNamespace(special=True) for i in range(17)}

    def __len__(self):
        return self.n

    def convert_ids_to_tokens(self, i):
        return f"<tok{i}>"


@pytest.mark.parametrize("given,tok,rows,used,want", [
    (5, _Tok(), 49152, set(), 5),  # explicit wins
    (-1, _Tok(mask=7), 49152, set(), 7),  # the tokenizer's mask token
    (-1, _Tok(n=100), 128, set(), 100),  # first embedding row past the tokenizer (z-lab's <|MASK|>)
    (-1, _Tok(), 49152, {0, 1, 2}, 16),  # SmolLM2: <empty_output>, the design note's choice
    (-1, _Tok(), 49152, set(range(17)) | {49151}, 49150),  # every special used: highest absent id
])
def test_mask_token_resolution_order(given, tok, rows, used, want):
    from eaglewire.training.dflash_train import resolve_mask_token

    got, why = resolve_mask_token(TrainConfig(data=None, out=None, drafter="dflash", mask_token_id=given), tok, rows, used)
    assert got == want and why
