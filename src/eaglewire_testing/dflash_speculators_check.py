"""Load an eaglewire DFlash export with speculators 0.9.0's own `DFlashDraftModel.from_pretrained`.

Executed by the speculators venv's Python (see speculators_venv.py), never imported by eaglewire: that
venv has no eaglewire. Offline: the verifier named in the export must be a local directory.
Prints one JSON object: the ids and block the model reads, and per tensor of the file whether the
loaded parameter equals it (a renamed tensor would be left at its initial value, not an error).
"""

from __future__ import annotations

import json
import sys

from safetensors.torch import load_file


def main(d: str) -> None:
    from speculators.models.dflash.core import DFlashDraftModel

    m = DFlashDraftModel.from_pretrained(d)
    theirs = m.state_dict()
    ours = load_file(f"{d}/model.safetensors")
    print(json.dumps({
        "target_layer_ids": list(m.target_layer_ids), "block_size": m.block_size, "mask_token_id": m.mask_token_id,
        "equal": {k: k in theirs and theirs[k].shape == v.shape and bool((theirs[k].float() == v.float()).all())
                  for k, v in ours.items()},
        "not_in_file": sorted(k for k in theirs if k not in ours),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
