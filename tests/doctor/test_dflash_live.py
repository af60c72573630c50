"""`doctor live` on a DFlash drafter, against a stand-in vLLM serving recorded counters: the prediction decodes
blocks (decoding/dflash.py) at the server's depth; a server whose config.json gives the drafter another mask token
than it was trained with accepts less and fails at a position, and the config rows name the mask id to set.

The served counters are those of eaglewire's block engine with the drafter as the stand-in's config says (as
trained, or miswired): what a vLLM serving that config accepts (the real-vLLM check is tests/serve's).

Why the mask token and not the layer ids: on the 8-layer tiny targets a DFlash drafter reads its target features
only weakly (their greedy answers loop, and the bonus token alone predicts the block), so fed every slot one layer
off it accepted [40, 33, 28] of 78 rounds against [40, 34, 28] of 77 as trained (tiny:mistral, 8 held-out
prompts): inside `doctor live`'s tolerance, a void control. The layer-id miswirings are caught statically
(test_dflash_config.py) and, on the default target, by the real-vLLM test. The mask embedding is every mask slot's
whole input, so a wrong mask id moves acceptance far beyond the tolerance (checked by `_require_margin`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.decoding.run import encode_prompt_file
from eaglewire.doctor.commands import live_check
from eaglewire.doctor.dflash_live import DFlashPrediction
from eaglewire.doctor.live import doctor_live, predicted_acceptance, tolerance
from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import save_dflash_checkpoint, zlab_config
from eaglewire.targets.capture import capture
from eaglewire.training.dflash_loss import dflash_forward
from eaglewire_testing.export_helpers import provenance
from eaglewire_testing.fake_vllm import FakeVllm, counters, models

pytestmark = pytest.mark.unit

SOURCE, IDS = "tiny:mistral", (1, 3, 5)  # 8 layers
WRONG_MASK = 3  # a special token of the tiny tokenizer, not the mask the drafter was trained with (its last row)
DEPTH, MAX_NEW, N = 3, 16, 4


def _greedy(target, prompts: list[list[int]], new: int):
    """Training batch: the target's own greedy continuations (transformers generate)."""
    seqs, masks = [], []
    for ids in prompts:
        x = torch.tensor([ids])
        out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new,
                                    eos_token_id=target.eos_ids(), pad_token_id=target.eos_ids()[0])
        seqs.append(out[0].tolist())
        masks.append([0] * len(ids) + [1] * (len(seqs[-1]) - len(ids)))
    t, pad = max(map(len, seqs)), target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    return x, attn, torch.tensor([m + [0] * (t - len(m)) for m in masks])


def _drafter(target, ids) -> DFlashDrafter:
    torch.manual_seed(0)
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=target.vocab_size - 1, block_size=DEPTH + 1,
                                          target_layer_ids=list(ids))
    return DFlashDrafter(cfg).eval()


@pytest.fixture(scope="module")
def wired(tiny_targets, tmp_path_factory):
    """(checkpoint, the export the miswired server loaded, acceptance as trained, acceptance miswired)."""
    t = tiny_targets["mistral"]
    prompts = encode_prompt_file(DFlashPrediction(t, _drafter(t, IDS)), heldout_prompts_path(), N)[0]
    x, attn, lm = _greedy(t, prompts, 24)
    drafter = _drafter(t, IDS)
    store = capture(t.model, x, drafter.config.points, attention_mask=attn)
    feats = torch.cat([store[p.name] for p in drafter.config.points], -1)
    embed, head = t.model.get_input_embeddings().weight.detach(), t.model.get_output_embeddings().weight.detach()
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):  # a fixed step count: every machine gets the same drafter
        out = dflash_forward(drafter, feats, x, embed, head, lm, num_anchors=8, attention_mask=attn, generator=gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    drafter.eval()
    wrong = DFlashDrafter(dataclasses.replace(drafter.config, mask_token_id=WRONG_MASK)).eval()
    wrong.load_state_dict(drafter.state_dict())  # the same weights and layers, another mask token
    root = tmp_path_factory.mktemp("dflash_live")
    ckpt = save_dflash_checkpoint(root / "ckpt", drafter, provenance(drafter.config.points, t.num_layers, "mistral"))
    export = root / "served"
    export.mkdir()
    (export / "config.json").write_text(json.dumps(zlab_config(wrong.config, t.num_layers)))
    (export / "eaglewire.export.json").write_text(json.dumps({"source": str(ckpt)}))  # where the trained mask is
    good, bad = DFlashPrediction(t, drafter), DFlashPrediction(t, wrong)
    g, b = (predicted_acceptance(e, prompts, DEPTH, MAX_NEW) for e in (good, bad))
    _require_margin(g, b)
    return ckpt, export, g, b


def _require_margin(g, b) -> None:
    """The control means something only when the miswired drafter accepts, at some position, more than twice
    `doctor live`'s tolerance below the drafter as trained (the pattern of test_live_sglang.py)."""
    tol = [tolerance(c, g.drafts) for c in g.accepted_per_pos]
    if not any(x - y > 2 * d for x, y, d in zip(g.rates(), b.rates(), tol)):
        pytest.fail(f"negative control void: the tiny DFlash drafter accepts {g.accepted_per_pos}/{g.drafts} per "
                    f"position as trained and {b.accepted_per_pos}/{b.drafts} with mask token {WRONG_MASK}, within twice "
                    f"doctor live's tolerance {[round(d, 3) for d in tol]}")


def _serving(acc):
    return FakeVllm(served=models(SOURCE), metrics=[counters(0, [0] * DEPTH), counters(acc.drafts, acc.accepted_per_pos)])


def _check(srv, ckpt, export):
    return live_check(srv.url, ckpt, SOURCE, prompts=None, num_prompts=N, max_new_tokens=MAX_NEW,
                      served_drafter=export, quiet=True)


def test_a_dflash_server_wired_as_trained_passes(wired):
    """Before: the checkpoint was read as an EAGLE-3 drafter (`config.json: not written by eaglewire`), exit 2."""
    ckpt, export, g, _ = wired
    with _serving(g) as srv:
        rep = _check(srv, ckpt, export)
    assert rep.exit_code() == 0, rep.to_dict()
    assert rep.data["predicted"]["accepted_per_pos"] == g.accepted_per_pos and rep.data["depth"] == DEPTH
    assert g.accepted_per_pos[0] > 0


def test_a_dflash_server_with_another_mask_token_fails_and_names_the_trained_one(wired):
    ckpt, export, g, b = wired
    with _serving(b) as srv:
        rep = _check(srv, ckpt, export)
    rows = {c.name: c for c in rep.checks}
    failed = [c.name for c in rep.checks if not c.ok and c.level == "error"]
    assert rep.exit_code() == 1 and any(n.startswith("position ") for n in failed), rep.to_dict()
    assert rep.data["served"]["accepted_per_pos"] == b.accepted_per_pos
    assert rep.data["predicted"]["accepted_per_pos"] == g.accepted_per_pos
    # the static rows come from doctor config on what the server loaded: the layers are right, the mask is not
    assert rows["points"].ok and not rows["mask token"].ok
    assert f"dflash_config.mask_token_id = {WRONG_MASK}" in rows["mask token"].detail
    assert rows["mask token"].fix == 'set "mask_token_id": 383 inside dflash_config'  # tiny:mistral's last row


def test_a_served_depth_beyond_the_block_is_one_line(wired):
    ckpt, export, g, _ = wired
    with FakeVllm(served=models(SOURCE), metrics=[counters(0, [0] * 4), counters(4, [2, 1, 1, 0])]) as srv:
        with pytest.raises(EaglewireError, match=r"--depth 4: a DFlash drafter with block_size 4 drafts 1\.\.3"):
            _check(srv, ckpt, export)


def test_doctor_drafter_names_what_checks_a_dflash_drafter(wired):
    from eaglewire_testing.cli import run_cli

    r = run_cli("doctor", "drafter", wired[0], "--data", wired[1])
    assert r.returncode == 2 and "a DFlash drafter" in r.stderr and "doctor live" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_server_not_speculating_is_told_the_dflash_method():
    """Before: told to start vLLM with method eagle3, which cannot load a DFlash drafter."""
    import types

    with FakeVllm(served=models(SOURCE), metrics=[counters(0, [0] * DEPTH)]) as srv:
        rep = doctor_live(srv.url, types.SimpleNamespace(method="dflash"), [[1, 2]], 4, say=lambda m: None)
    (check,) = [c for c in rep.checks if not c.ok]
    assert check.name == "speculation" and "(method dflash)" in check.fix
