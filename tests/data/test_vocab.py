"""Draft vocabulary: selection, offsets convention, padding, identity, persistence."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.data.vocab import build_draft_vocab, count_tokens, load_vocab, save_vocab
from eaglewire.infra.errors import EaglewireError


def _reference(counts: list[int], n: int) -> list[int]:
    """Naive: sort by (-count, id), take n, sort ascending."""
    return sorted(sorted(range(len(counts)), key=lambda i: (-counts[i], i))[:n])


@pytest.mark.parametrize("seed", range(5))
def test_matches_naive_reference_and_offsets(seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 6, (200,), generator=g)  # many ties and zeros
    for n in (1, 7, 50, 199):
        v = build_draft_vocab(counts, n)
        ref = _reference(counts.tolist(), n)
        assert v.selected.tolist() == ref
        assert v.d2t.dtype == torch.int64 and v.t2d.dtype == torch.bool
        assert [d + int(v.d2t[d]) for d in range(n)] == ref  # target = draft + d2t[draft]
        assert torch.nonzero(v.t2d).flatten().tolist() == ref


def test_ties_prefer_lower_id():
    v = build_draft_vocab(torch.tensor([0, 3, 5, 3, 3, 0]), 3)
    assert v.selected.tolist() == [1, 2, 3]
    assert v.d2t.tolist() == [1, 1, 1]


def test_padding_with_lowest_unused_ids():
    counts = torch.zeros(10, dtype=torch.int64)
    counts[7], counts[4] = 5, 2
    v = build_draft_vocab(counts, 5)
    assert v.selected.tolist() == [0, 1, 2, 4, 7]
    assert v.coverage == 1.0


def test_identity_when_draft_size_covers_vocab():
    counts = torch.tensor([3, 0, 1, 9])
    for n in (4, 10):
        v = build_draft_vocab(counts, n)
        assert v.size == 4 and v.d2t.tolist() == [0, 0, 0, 0] and bool(v.t2d.all())


def test_coverage_by_hand():
    counts = torch.tensor([10, 0, 5, 1, 4])  # total 20
    v = build_draft_vocab(counts, 2)  # ids 0 and 2
    assert v.selected.tolist() == [0, 2]
    assert v.coverage == pytest.approx(15 / 20)


def test_count_tokens_uses_only_masked_positions():
    counts = count_tokens([[1, 2, 2, 3], [3, 3]], [[0, 1, 1, 0], [1, 0]], 5)
    assert counts.tolist() == [0, 0, 2, 1, 0]
    with pytest.raises(EaglewireError, match="sample 1"):
        count_tokens([[1], [9]], [[1], [1]], 5)


def test_bad_inputs():
    with pytest.raises(EaglewireError, match="draft_size"):
        build_draft_vocab(torch.tensor([1, 2]), 0)
    with pytest.raises(EaglewireError, match="1-D integer"):
        build_draft_vocab(torch.tensor([1.0, 2.0]), 1)


def test_save_load_roundtrip(tmp_path):
    counts = torch.tensor([4, 0, 7, 7, 1, 0, 2])
    v = build_draft_vocab(counts, 4)
    save_vocab(tmp_path, v)
    meta = json.loads((tmp_path / "vocab.json").read_text())
    assert meta == {"size": 4, "vocab_size": 7, "coverage": pytest.approx(20 / 21),
                    "num_counted_tokens": 21, "num_distinct": 5}
    w = load_vocab(tmp_path)
    assert torch.equal(w.d2t, v.d2t) and torch.equal(w.t2d, v.t2d) and torch.equal(w.counts, v.counts)
    assert w.coverage == pytest.approx(v.coverage)


@pytest.mark.parametrize("tamper,msg", [
    (lambda t: t["d2t"].__setitem__(3, 100), "outside the target vocabulary"),
    (lambda t: t["d2t"].__setitem__(2, -1), "strictly ascending"),
    (lambda t: t["t2d"].__setitem__(1, True), "disagree"),
])
def test_tampered_file_is_rejected(tmp_path, tamper, msg):
    save_vocab(tmp_path, build_draft_vocab(torch.tensor([4, 0, 7, 7, 1, 0, 2]), 4))
    path = tmp_path / "vocab.safetensors"
    t = {k: x.clone() for k, x in load_file(str(path)).items()}
    tamper(t)
    save_file(t, str(path))
    with pytest.raises(EaglewireError, match=msg) as e:
        load_vocab(tmp_path)
    assert "vocab.safetensors" in str(e.value)


def test_a_full_disk_while_writing_the_summary_keeps_the_old_pair(tmp_path, monkeypatch):
    """The tensors used to be renamed into place before the summary was written: a full disk then left new
    tensors beside the old vocab.json (a size mismatch on every later read)."""
    import errno

    from eaglewire.data import vocab as vocab_mod

    counts = torch.arange(200)
    save_vocab(tmp_path, build_draft_vocab(counts, 50))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(vocab_mod.json, "dump", full)
    with pytest.raises(EaglewireError, match=r"disk full while writing vocab.json") as e:
        save_vocab(tmp_path, build_draft_vocab(counts, 20))
    assert "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporaries left either
    monkeypatch.undo()
    assert load_vocab(tmp_path).size == 50
    (tmp_path / "vocab.json").write_text("[1]")
    with pytest.raises(EaglewireError, match=rf"^{tmp_path / 'vocab.json'}: expected a JSON object"):
        load_vocab(tmp_path)
