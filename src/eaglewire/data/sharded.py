"""The data stages under torchrun: every rank takes a disjoint share, one dataset results.

Why: a target that needs a GPU per copy makes a single process the bottleneck
of generation and extraction. Under ``torchrun --nproc_per_node N -m
eaglewire.cli data build ...`` rank r handles the prompts whose index is r
modulo N: it appends its answers to ``responses.rank{r}.jsonl`` and writes its
feature shards under ``rank-{r}/`` with a manifest of its own, so each rank
resumes exactly as a single process does. Rank 0 holds the directory's write
lock for the whole job, merges the answers into ``responses.jsonl`` and the
rank manifests into the one ``manifest.json`` that training, ``data info`` and
the doctor read. A failure on any rank is raised on every rank, so none waits
forever at a collective.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch.distributed as dist

from eaglewire.data.config import RESPONSES
from eaglewire.data.jsonl import read_jsonl, rewrite_jsonl
from eaglewire.data.manifest import MANIFEST, Manifest
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import dir_lock
from eaglewire.infra.ranks import distributed, is_main, rank, world_size


def _group():
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # control messages only: gloo works next to CUDA too
    return dist


def leave() -> None:
    """Every rank leaves the control group together once its command has succeeded.

    Why: a rank that exits while a peer still holds its gloo connection makes
    the peer abort at interpreter exit (SIGABRT, seen under `torchrun ...
    data extract` when rank 0 was still printing the dataset's summary).
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def gather(obj) -> list:
    if not distributed():
        return [obj]
    dist = _group()
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def agree(fn, *args, **kwargs):
    """Run `fn` on every rank; an expected error on any rank is raised on all of them."""
    err, res = None, None
    try:
        res = fn(*args, **kwargs)
    except EaglewireError as e:
        err = str(e)
    errors = [(r, e) for r, e in enumerate(gather(err)) if e]
    if errors:
        r, e = errors[0]
        raise EaglewireError(e if r == rank() else f"rank {r}: {e}")
    return res


@contextmanager
def rank0_lock(d: Path, what: str):
    """The job holds the directory's lock through rank 0; a second job's ranks all stop."""
    stack = ExitStack()

    def take():
        if is_main():
            stack.enter_context(dir_lock(d, what))

    agree(take)
    try:
        yield
    finally:
        stack.close()


def rank_responses(out: Path, rank: int) -> Path:
    return out / f"responses.rank{rank}.jsonl"


def rank_dir(out: Path, rank: int) -> Path:
    return out / f"rank-{rank:05d}"


def consolidate_responses(out: Path) -> int:
    """Fold every `responses.rank*.jsonl` into `responses.jsonl` (one row per index, sorted); returns rows."""
    rows = {r["index"]: r for r in read_jsonl(out / RESPONSES)}
    parts = sorted(out.glob("responses.rank*.jsonl"))
    for p in parts:
        rows.update({r["index"]: r for r in read_jsonl(p)})
    rewrite_jsonl(out / RESPONSES, [rows[i] for i in sorted(rows)])
    fails = sorted(out.glob("failures.rank*.jsonl"))
    if fails:
        rewrite_jsonl(out / "failures.jsonl", sorted((f for p in fails for f in read_jsonl(p)), key=lambda f: f["index"]))
    for p in parts + fails:
        p.unlink()
    return len(rows)


def seed_rank_file(out: Path, rank: int, world: int) -> Path:
    """This rank's answer file, holding what `responses.jsonl` already has of its share (for --resume)."""
    path = rank_responses(out, rank)
    rows = {r["index"]: r for r in read_jsonl(out / RESPONSES) if r["index"] % world == rank}
    rows.update({r["index"]: r for r in read_jsonl(path)})
    rewrite_jsonl(path, [rows[i] for i in sorted(rows)])
    return path


def sum_results(results: list[dict]) -> dict:
    """Per-rank generation results as one: counts add up, rates add up (ranks run at once)."""
    out = dict(results[0])
    for k in ("responses", "resumed", "skipped_empty", "skipped_long", "new_tokens", "tokens_per_s", "failed"):
        if k in out:
            out[k] = sum(r[k] for r in results)
    out["tokens_per_s"] = round(out["tokens_per_s"], 1)
    finish: dict = {}
    for r in results:
        for k, v in r["finish"].items():
            finish[k] = finish.get(k, 0) + v
    out["finish"] = finish
    out["ranks"] = len(results)
    return out


def merge_manifests(out: Path, world: int) -> Manifest:
    """One manifest over the ranks' shards (paths relative to `out`), exact sums of counts and norms."""
    parts = [Manifest.load(rank_dir(out, r)) for r in range(world)]
    shards = [{**e, "file": f"{rank_dir(out, r).name}/{e['file']}"} for r, p in enumerate(parts) for e in p.shards]
    first = parts[0]
    man = dataclasses.replace(
        first, shards=shards, complete=all(p.complete for p in parts), ranks=world,
        dropped={k: sum((p.dropped or {}).get(k, 0) for p in parts) for k in (first.dropped or {})},
        extract_tokens_per_s=sum(p.extract_tokens_per_s or 0.0 for p in parts),
        answer_tokens=_sum_counts([p.answer_tokens for p in parts]),
        norm_stats=_merge_norms([p.norm_stats or [] for p in parts]))
    man.recount()
    man.save(out)
    return man


def _sum_counts(parts: list[dict | None]) -> dict | None:
    """Per-key sums of the ranks' counts; None when a rank recorded none (made before the record existed)."""
    if not parts or any(p is None for p in parts):
        return None
    return {k: sum(p.get(k, 0) for p in parts) for k in parts[0]}


def _merge_norms(per_rank: list[list[dict]]) -> list[dict]:
    per_rank = [s for s in per_rank if s]
    if not per_rank:
        return []
    out = []
    for j, first in enumerate(per_rank[0]):
        n = sum(s[j]["num_tokens"] for s in per_rank)
        tot = sum(s[j]["sum_norm"] for s in per_rank)
        out.append({**first, "sum_norm": tot, "num_tokens": n, "mean_norm": tot / max(n, 1),
                    "max_norm": max(s[j]["max_norm"] for s in per_rank)})
    return out


def _ranks_fit(out: Path, ranks: list[str], world: int) -> bool:
    """Each rank directory holds only the samples rank r of `world` ranks would extract (index % world == r)."""
    for name in ranks:
        r = int(name.split("-")[1])
        if r >= world or any(i % world != r for i in Manifest.load(Path(out) / name).sample_indices()):
            return False
    return True


def check_ranks(out: Path, world: int) -> None:
    """A dataset extracted by N ranks resumes under N ranks: each rank owns its shard directory."""
    if not Manifest.exists(out):
        # killed before rank 0 merged: the rank directories say how many ranks made it
        ranks = sorted(p.name for p in Path(out).glob("rank-*") if Manifest.exists(p))
        if ranks and (world == 1 or not _ranks_fit(out, ranks, world)):  # one process never writes rank directories
            least = 1 + max(int(n.split("-")[1]) for n in ranks)
            raise EaglewireError(f"{out}: holds the unmerged shards of a torchrun extraction ({', '.join(ranks)}), "
                                 f"resumed with {world} process(es); resume it under torchrun with the ranks it was "
                                 f"started with: torchrun --nproc_per_node N -m eaglewire.cli data extract {out} "
                                 f"--resume (N >= {max(least, 2)}; or remove those directories to start over)")
        return
    path = out / MANIFEST
    made = Manifest.load(out).ranks or 1
    if made != world:
        how = f"torchrun --nproc_per_node {made} -m eaglewire.cli" if made > 1 else "a single process"
        raise EaglewireError(f"{path}: extracted by {made} rank(s), resumed with {world}; resume it with {how}")
