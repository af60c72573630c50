"""Real client: our speculators export loaded by speculators 0.9.0's own Eagle3DraftModel.

The package pins transformers<=5.19, so it runs in a separate venv under the
eaglewire cache (src/eaglewire_testing/speculators_venv.py, built once, reused). The
test skips only when that venv cannot be built (no package index reachable), and fails
instead under CI=true.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eaglewire.drafter import causal_mask
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import parse_points
from eaglewire_testing.ci import cannot_run
from eaglewire_testing.export_helpers import L, make_ckpt

pytestmark = pytest.mark.integration  # speculators' own code, in its pinned venv


def _verifier_stub(d, m):
    """A local verifier directory: speculators 0.9.0 reads its config and final norm / lm_head."""
    c = m.config
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "num_hidden_layers": L,
        "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_norm_eps}))
    g = torch.Generator().manual_seed(3)
    save_file({"model.embed_tokens.weight": m.embed_tokens.weight.detach().clone(),
               "lm_head.weight": torch.randn(c.vocab_size, c.hidden_size, generator=g),
               "model.norm.weight": torch.ones(c.hidden_size)}, str(d / "model.safetensors"))


@torch.no_grad()
def _ours(m, feats, ids):
    """Steps 0 and 1 of TTT as speculators runs them: step 1 feeds back h0, tokens shifted, diagonal keys."""
    T = ids.shape[1]
    pos = torch.arange(T)[None]
    h0, kv0 = m.step(ids, m.project(feats), pos, None, causal_mask(T))
    ids1 = torch.cat([ids[:, 1:], torch.zeros(1, 1, dtype=ids.dtype)], dim=1)
    mask1 = torch.cat([causal_mask(T), torch.eye(T, dtype=torch.bool)[None, None]], dim=-1)
    h1, _ = m.step(ids1, h0, pos + 1, kv0, mask1)
    return [m.logits(h0), m.logits(h1)]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["default", "custom_2layer_fcnorm", "speculators_recipe"])
def test_speculators_loads_export_and_matches_logits(tmp_path, variant):
    """speculators' own Eagle3DraftModel is the reference, step 1 included (what is fed back differs with
    norm_output: the post-norm hidden; norm_before_fc is its recipe's one norm over the fc input)."""
    from eaglewire_testing.speculators_venv import speculators_logits

    kw, pts = {}, None
    if variant == "speculators_recipe":
        kw = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True}
    elif variant != "default":
        kw = {"num_layers": 2, "norm_before_residual": True, "fc_norm": True}
        pts = parse_points(["embed", "layers.3.out", "layers.7.out"], L)  # vLLM ids 0, 4, 8
    ck, m = make_ckpt(tmp_path / "ck", points=pts, **kw)
    _verifier_stub(tmp_path / "verifier", m)
    run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "x", verifier=str(tmp_path / "verifier")))
    g = torch.Generator().manual_seed(1)
    T = 9
    feats = torch.randn(1, T, m.config.num_aux * m.config.target_hidden_size, generator=g)
    ids = torch.randint(0, m.config.vocab_size, (1, T), generator=g)
    try:
        theirs = speculators_logits(tmp_path / "x", feats, ids, tmp_path / "work")
    except EaglewireError as e:
        if "speculators venv" in str(e):
            cannot_run(f"speculators==0.9.0 could not be installed here: {e}")
        raise
    ours = _ours(m, feats, ids)
    assert len(theirs) == 2
    for k in range(2):
        diff = (theirs[k].reshape(ours[k].shape) - ours[k]).abs().max().item()
        print(f"{variant} step {k}: max |logit diff| = {diff:.3e}")
        assert diff < 1e-4, (k, diff)
