"""The in-place KV cache against transformers' concatenating DynamicCache."""

import random

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from eaglewire.targets import kvcache
from eaglewire.targets.kvcache import GrowingLayer, growing_cache, keep_rows
from eaglewire.targets.smallm import smallm_kernel


def _reference_keep(layer, n_new, keep_idx):
    past = layer.keys.shape[-2] - n_new
    idx = torch.tensor(list(range(past)) + [past + i for i in keep_idx])
    layer.keys, layer.values = layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)


@pytest.mark.parametrize("in_place", [True, False], ids=["kernel", "torch"])
def test_random_appends_crops_and_keeps_match_concatenation(in_place, monkeypatch):
    """Every operation the engine and generate() perform, in random order, on both caches; the rollback
    through the kernel's one call (move_rows) where it was built, and through torch's gathers."""
    moved = []
    real = kvcache._move_in_place
    monkeypatch.setattr(kvcache, "_move_in_place", (lambda *a: moved.append(real(*a)) or moved[-1]) if in_place
                        else (lambda *a: False))
    if in_place and smallm_kernel() is None:
        pytest.skip("the CPU kernel could not be built here")
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    ours, ref = GrowingLayer(), DynamicLayer()
    for step in range(300):
        op = rng.random()
        n = ref.keys.shape[-2] if ref.is_initialized and ref.keys is not None and ref.keys.dim() == 4 else 0
        if op < 0.6 or n < 12:
            q = rng.choice([1, 1, 2, 7, 11, 40])
            k = torch.randn(2, 3, q, 8, generator=g)  # [B, Hk, q, D]
            v = torch.randn(2, 3, q, 5, generator=g)  # value head dim differs (MLA)
            ko, vo = ours.update(k, v)
            kr, vr = ref.update(k, v)
            assert torch.equal(ko, kr) and torch.equal(vo, vr)
        elif op < 0.8:
            drop = rng.randint(1, 5)
            ours.crop(-drop)
            ref.crop(-drop)
        else:
            n_new = rng.randint(2, 10)
            keep = sorted(rng.sample(range(n_new), rng.randint(1, n_new)))
            cache_o, cache_r = DynamicCache(), DynamicCache()
            cache_o.layers, cache_r.layers = [ours], [ref]
            keep_rows(cache_o, n_new, keep)
            _reference_keep(ref, n_new, keep)
        assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values), step
    assert ours._kbuf.shape[-2] < 4 * ref.keys.shape[-2] + 128  # capacity stays proportional
    assert any(moved) == in_place  # the kernel's call did the rollbacks (or was never tried)


def test_replaced_tensors_are_adopted():
    """A caller that swaps in new keys (beam reorder, batch select) is followed, not overwritten."""
    layer = GrowingLayer()
    layer.update(torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4, 3))
    layer.batch_select_indices(torch.tensor([1]))
    k, v = torch.randn(1, 1, 2, 3), torch.randn(1, 1, 2, 3)
    before = layer.keys.clone()
    keys, _ = layer.update(k, v)
    assert keys.shape == (1, 1, 6, 3) and torch.equal(keys[:, :, :4], before) and torch.equal(keys[:, :, 4:], k)


def test_generate_with_growing_cache_equals_default(tiny_targets):
    """Greedy batched generation is token-identical and logit-equal with either cache."""
    for arch in ("llama", "deepseek_v3"):
        t = tiny_targets[arch]
        ids = torch.randint(3, t.model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(ids)
        mask[0, :4] = 0  # left padding on one row
        kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                  output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        a = t.model.generate(**kw)
        b = t.model.generate(cache=growing_cache(t.model.config), **kw)
        assert torch.equal(a.sequences, b.sequences), arch
        for la, lb in zip(a.logits, b.logits):
            torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)
