"""What a training run keeps in its directory besides the drafter: metrics and the resumable state.

metrics.csv is truncated to the resumed step, so a resumed run shows one
clean trajectory; state/ is written whole-or-nothing (`atomic_dir`), so a run
killed while saving resumes from the previous save.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import pickle
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.tensorboard import SummaryWriter

from eaglewire.infra.atomic import atomic_dir, atomic_file, on_disk_full, read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import config_to_dict
from eaglewire.saved.checkpoint import load_state
from eaglewire.training.config import TrainConfig

# options a resumed run may change: how it runs, not what it trains on (a capture server may move or restart:
# its target is checked by content, as the recorded fingerprint)
RESUME_FREE = {"resume", "json", "device", "log_every", "parallel", "engine_url", "states_dir", "vllm_python",
               "startup_timeout", "request_timeout", "tensor_parallel_size"}
# options naming what the run trains on: compared by the content they name (training.identity), not as written
BY_CONTENT = {"data", "target", "points"}


class MetricsLog:
    """metrics.csv (truncated to the resumed step, so a resumed run has one clean trajectory) + TensorBoard."""

    def __init__(self, out: Path, k: int, resume_step: int | None, enabled: bool):
        self.enabled = enabled
        self.path = out / "metrics.csv"
        self.fields = ["split", "step", "epoch", "loss", *[f"acc_{j}" for j in range(k)], "lr", "tokens_per_s", "grad_norm",
                       "mean_acceptance_length"]
        if not enabled:
            return
        rows = []
        if resume_step is not None and self.path.exists():
            try:
                with open(self.path, newline="") as f:
                    rows = [{k: r.get(k, "") for k in self.fields} for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
            except (ValueError, KeyError, TypeError, UnicodeDecodeError, csv.Error) as e:
                raise EaglewireError(f"{self.path}: not a metrics.csv eaglewire wrote ({type(e).__name__}: {e}); move it "
                                     "aside to resume without the earlier rows") from e
        with atomic_file(self.path) as f:  # a full disk keeps the old rows, not half of them
            w = csv.DictWriter(f, self.fields)
            w.writeheader()
            w.writerows(rows)

        self.tb = SummaryWriter(str(out / "tb"))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with on_disk_full(self.path.parent, self.path.name), open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.fields).writerow({k: row.get(k, "") for k in self.fields})
        for k, v in row.items():
            if isinstance(v, (int, float)) and k not in ("step", "epoch"):
                self.tb.add_scalar(f"{row['split']}/{k}", v, row["step"])

    def close(self):
        if self.enabled:
            self.tb.close()


def save_state(out: Path, model_state: dict, opt_state: dict, step: int, extra: dict, selector=None) -> None:
    """Whole state dicts (`Dist.full_states`: gathered under FSDP2), so any mode resumes them. `selector`
    (training.select.Selector) adds the best weights so far, so a resume selects over the whole run."""
    with atomic_dir(out / "state") as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in model_state.items()}, str(tmp / "model.safetensors"))
        torch.save(opt_state, tmp / "optimizer.pt")
        kept = selector.save(tmp) if selector is not None else {}
        (tmp / "meta.json").write_text(json.dumps({"step": step, **extra, **kept}))


def load_run_state(out: Path, model) -> dict:
    """Loads the saved weights into the (not yet sharded) model; returns meta.json (`load_optimizer_state` next)."""
    st = out / "state"
    if not (st / "meta.json").is_file():
        raise EaglewireError(f"{out}: --resume but no saved state in {st}")
    model.load_state_dict(load_state(st / "model.safetensors"), strict=True)
    return read_meta(st / "meta.json")


def load_optimizer_state(out: Path, opt, load=None) -> None:
    """state/optimizer.pt into `opt`, through `load(opt, saved)` (`Dist.load_optimizer` shards it under FSDP2)."""
    st = out / "state"
    try:
        # weights_only: tensors and plain containers only; anything else (a pickled object) is refused
        saved = torch.load(st / "optimizer.pt", weights_only=True)
        (load or type(opt).load_state_dict)(opt, saved)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise EaglewireError(f"{st / 'optimizer.pt'}: not an optimizer state eaglewire wrote (refused: "
                             f"{str(e).splitlines()[0][:160]}); start a new --out or remove {st}") from e


def read_meta(path: Path) -> dict:
    """state/meta.json as {"step": int >= 0, "skipped": int >= 0}: a damaged file is one line naming the field,
    never a resume from a made-up step."""
    raw = read_json(path, "no meta.json")
    if not isinstance(raw, dict):
        raise EaglewireError(f"{path}: expected a JSON object with `step` (the saved state is damaged; "
                             "start a new --out)")
    out = {}
    for key, default in (("step", None), ("skipped", 0)):
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**12:
            raise EaglewireError(f"{path}: field {key} = {v!r}: expected an integer >= 0 (the saved state is "
                                 "damaged; start a new --out)")
        out[key] = v
    return {**raw, **out}


def _same_path(old, new) -> bool:
    """The same directory, however written: relative or absolute, through a symlink."""
    if old is None or new is None or not isinstance(old, str):
        return old == new
    try:
        return old == new or Path(old).resolve() == Path(new).resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare as written
        return False


def check_resume_config(cfg: TrainConfig) -> dict | None:
    """A resumed run continues with the options it was started with; --out is where the run is now (a moved
    run resumes). Returns the recorded identity of the dataset the run started on (None in a run written
    before it was recorded): --data, --target and --points are then compared by content
    (`identity.check_same_dataset`), not here; without one, --data is compared as a directory."""
    p = cfg.out / "train.config.json"
    if not p.is_file():
        raise EaglewireError(f"{cfg.out}: --resume but no train.config.json there")
    raw = read_json(p, "no train.config.json")
    old = raw.get("config") if isinstance(raw, dict) else None
    if not isinstance(old, dict):
        raise EaglewireError(f"{p}: expected an object with a `config` object (the options the run started with)")
    new = config_to_dict(cfg)
    # a key an older eaglewire did not write had that option's default (added later, off by default)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    defaults = {n: f.default for n, f in fields.items() if f.default is not dataclasses.MISSING}
    paths = {n for n, f in fields.items() if "Path" in str(f.type)}
    recorded = raw.get("dataset")
    by_content = BY_CONTENT if recorded is not None else set()
    diff = [k for k in new if k not in RESUME_FREE | {"out"} | by_content
            and not (_same_path if k in paths else lambda a, b: a == b)(old.get(k, defaults.get(k)), new[k])]
    if diff:
        raise EaglewireError(f"{cfg.out}: --resume with a changed config ({', '.join(f'{k}: {old.get(k)!r} -> {new[k]!r}' for k in diff)}); "
                             "start a new --out or resume with the original options")
    return recorded
