"""The inputs of an offline run (stored features): the dataset, and the target's frozen parts read by name.

Training never builds the target: the embedding, the head, the final norm and, for `--init target`, the
one decoder layer the warm start copies are read from the shards (`targets.shards.load_frozen`), so a
rank holds those tensors and not the target's weights. The fingerprint is computed from the same config,
tokenizer and embedding the whole target would give, so it equals the one the dataset recorded.
"""

from __future__ import annotations

from pathlib import Path

from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.manifest import Manifest, manifest_hash
from eaglewire.data.vocab import load_vocab
from eaglewire.drafter.warmstart import deepest_layer_slot
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord
from eaglewire.targets.points import Point
from eaglewire.targets.shards import load_frozen
from eaglewire.training.config import TrainConfig
from eaglewire.training.inputs import TrainInputs


def warm_start_layers(cfg: TrainConfig, man: Manifest) -> tuple[int, ...]:
    """The target layer `--init target` copies: the one after the deepest captured point."""
    if cfg.init != "target":
        return ()
    try:
        k = Point.parse(man.point_names[deepest_layer_slot(man.point_names)]).layer + 1
    except ValueError:
        return ()  # no layer point: build_drafter names it in one line
    return (k,)


def setup_offline(cfg: TrainConfig, need_vocab: bool = True) -> TrainInputs:
    """`need_vocab=False` (DFlash: the target's whole vocabulary, no draft vocab) reads no vocab.safetensors."""
    if cfg.points or cfg.vocab_size:
        raise EaglewireError(f"{cfg.data}: --points and --vocab-size apply to --online only (extracted features "
                             "have their points and vocab)")
    ds = FeatureDataset(cfg.data, max_len=cfg.max_len)
    man = ds.manifest
    if man.points is None:
        raise EaglewireError(f"{cfg.data}: the feature slots have no physical labels ({man.point_names}); run "
                             f"`eaglewire doctor dataset {cfg.data} --target T` to identify them, then re-import with --points")
    if man.target_hidden != "final_norm":
        raise EaglewireError(f"{cfg.data}: target_hidden holds {man.target_hidden!r}, training needs the final-norm output "
                             "(re-import with --target so the final norm can be applied)")
    fp = man.target.fingerprint
    if fp.unknown and not cfg.target:
        raise EaglewireError(f"{cfg.data}: the dataset does not record which target made it (imported); pass --target")
    source = cfg.target or man.target.source
    target = load_frozen(source, warm_start_layers(cfg, man))
    mine = TargetFingerprint.of(target)
    if diff := fp.mismatch(mine):
        raise EaglewireError(f"{cfg.data}: dataset was made from another target than {source!r} (fingerprint differs in {', '.join(diff)})")
    P, H = ds[0]["features"].shape[1:]
    if H != target.hidden_size or P != len(man.points):
        raise EaglewireError(f"{cfg.data}: features are [{P} x {H}] but the target has hidden size {target.hidden_size} "
                             f"and the manifest lists {len(man.points)} points")
    vocab = load_vocab(cfg.data) if need_vocab else None  # a missing one is an error that prints the `data vocab` command
    prov = Provenance(points=man.points, target=TargetRecord(source=source, fingerprint=mine),
                      dataset={"path": str(Path(cfg.data).resolve()), "manifest_sha": manifest_hash(cfg.data)},
                      chat_template_sha=man.chat_template_sha, vocab=man.vocab)
    return TrainInputs(ds, man, target, vocab, prov)
