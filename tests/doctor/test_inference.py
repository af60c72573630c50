"""doctor online: our engine's inference features equal training features; a shifted wiring is named."""

from eaglewire.doctor.inference import doctor_online
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.targets.points import points_from_ids


def test_online_correct_wiring_is_clean(tiny_drafter, tiny_targets):
    ckpt, data = tiny_drafter
    model, prov = load_checkpoint(ckpt)
    rep = doctor_online(tiny_targets["llama"], model, prov, data, num_samples=3, max_new_tokens=16)
    assert all(c.ok for c in rep.checks if c.name.startswith("slot")), rep.to_dict()
    assert max(rep.data["slot_rel_err"]) < 1e-4


def test_online_seed_bug_embed_first_is_named(tiny_drafter, tiny_targets):
    ckpt, data = tiny_drafter
    model, prov = load_checkpoint(ckpt)
    t = tiny_targets["llama"]
    # seeds' wrong fix: ids an engine reads as [embed, layers.1.out, layers.3.out]
    serve = points_from_ids([0, 2, 4], "vllm", t.num_layers)
    rep = doctor_online(t, model, prov, data, serve_points=serve, num_samples=2, max_new_tokens=16)
    assert rep.failed
    slot0 = next(c for c in rep.checks if c.name == "slot 0")
    assert "feeds embed" in slot0.detail and "layers.1.out" in slot0.detail
