"""What a run trains on: the features, their manifest, the target and the draft vocabulary, found offline or online."""

from __future__ import annotations

from dataclasses import dataclass

from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.manifest import Manifest
from eaglewire.data.vocab import DraftVocab
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.load import Target


@dataclass
class TrainInputs:
    """What a run trains on, as `_setup` (offline) or `setup_online` finds it."""

    ds: FeatureDataset  # or an online_features.OnlineDataset: the same samples, computed instead of read
    manifest: Manifest
    target: Target | None  # for the drafter's init and the frozen head; dropped once those are taken
    vocab: DraftVocab | None  # None: the drafter reads the target's whole vocabulary (DFlash)
    prov: Provenance  # what the checkpoint records; training adds its config, metrics and split
    identity: dict | None = None  # the dataset by content (training.identity), recorded in train.config.json
