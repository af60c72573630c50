"""A refusal says what to do: `--format eagle` on points other than the official triple names both ways out.

The official EAGLE code stores no layer ids, so a drafter trained elsewhere can
only be recaptured on [2, L//2, L-3] or written in a format that stores its ids;
the formats it names are checked to accept this very drafter.
"""

from __future__ import annotations

import pytest

from eaglewire.saved.formats import refusals
from eaglewire.targets.points import eagle3_default, parse_points
from eaglewire_testing.export_helpers import tiny_cfg

pytestmark = pytest.mark.unit

L = 12


def test_eagle_refusal_says_how_to_recapture_or_which_format_to_use():
    pts = parse_points(["layers.2.out", "layers.4.out", "layers.6.out"], L)
    why = refusals("eagle", tiny_cfg(), pts, L)
    assert len(why) == 1 and "hard-codes HF indices [2, L//2, L-3]" in why[0] and "\n" not in why[0]
    want = ",".join(p.name for p in eagle3_default(L))
    assert f"eaglewire data build --points {want}" in why[0] and "retrain" in why[0]
    assert why[0].endswith("or export with --format sglang / --format vllm / --format speculators (they store the ids)")
    for fmt in ("sglang", "vllm", "speculators"):  # the advice never leads to another refusal
        assert refusals(fmt, tiny_cfg(), pts, L) == []


def test_eagle_refusal_names_only_formats_that_accept_the_drafter():
    pts = parse_points(["layers.2.out", "layers.4.out", "layers.6.out"], L)
    why = refusals("eagle", tiny_cfg(fc_norm=True), pts, L)  # SGLang has no fc_norm either
    fix = next(w for w in why if "hard-codes" in w)
    assert fix.endswith("or export with --format vllm / --format speculators (they store the ids)")
    assert refusals("sglang", tiny_cfg(fc_norm=True), pts, L)


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_a_full_draft_vocabulary_exports_no_d2t_where_the_loader_registers_none(fmt):
    """vLLM 0.32 refuses to start on a d2t its full-vocabulary drafter has no parameter for (seen serving a
    full-vocabulary drafter in tests/serve/test_vllm_peagle_serving.py); the identity map is what it assumes."""
    import torch

    from eaglewire.saved.formats import to_format_state
    from eaglewire_testing.export_helpers import make_drafter

    full = make_drafter(draft_vocab_size=tiny_cfg().vocab_size)
    sd = full.state_dict()
    assert not sd["d2t"].any()  # a full draft vocabulary is the identity
    assert not {"d2t", "t2d"} & set(to_format_state(fmt, full.config, sd))
    part = make_drafter()
    assert {"d2t", "t2d"} <= set(to_format_state(fmt, part.config, part.state_dict()))
    assert torch.equal(to_format_state("sglang", full.config, sd)["d2t"], sd["d2t"])  # SGLang loads it
