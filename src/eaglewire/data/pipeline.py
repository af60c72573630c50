"""The data stages in order: prompts -> target answers -> features -> draft vocab.

Each ``run_*`` takes its command's config, holds the dataset directory's
write lock, records the resolved config next to what it wrote, and returns
the result a script reads (`--json`). ``run_build`` chains them and resumes
at the first unfinished stage.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

from eaglewire.data.answers import check_answer_vocab
from eaglewire.data.config import (
    PROMPTS,
    RESPONSES,
    DataBuildConfig,
    DataExtractConfig,
    DataGenerateConfig,
    DataVocabConfig,
)
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.extract import ExtractSettings, extract, refuse_foreign_shards
from eaglewire.data.extract_vllm import generate_on_vllm, run_vllm_extract
from eaglewire.data.gencapture import GenCapture
from eaglewire.data.gencapture import why_not as why_not_gencapture
from eaglewire.data.generate import GenSettings, generate_responses
from eaglewire.data.jsonl import index_problem, read_jsonl, response_problem, rewrite_jsonl
from eaglewire.data.manifest import (
    Manifest,
    complete_and_intact,
    manifest_hash,
    refuse_unservable_order,
    verify_shards,
)
from eaglewire.data.prompt_files import load_prompts, local_inputs
from eaglewire.data.prompts import (
    Conversation,
    dedupe,
    drop_heldout,
    heldout_prompt_texts,
    self_prompts,
)
from eaglewire.data.recorded import (
    GENERATE_CONFIG,
    GENERATE_KEYS,
    adopt_recorded,
    recorded_generate,
    recorded_settings,
    settings_from_manifest,
)
from eaglewire.data.server import FAILURES, ServerSettings, generate_via_server, is_vllm
from eaglewire.data.sharded import (
    agree,
    check_ranks,
    consolidate_responses,
    gather,
    merge_manifests,
    rank0_lock,
    rank_dir,
    rank_responses,
    seed_rank_file,
    sum_results,
)
from eaglewire.data.topic_prompts import topic_prompts
from eaglewire.data.turns import earlier_turns
from eaglewire.data.vocab import build_draft_vocab, count_tokens, save_vocab
from eaglewire.engines.http import ChatClient
from eaglewire.infra.atomic import read_json
from eaglewire.infra.device import resolve_device, resolve_dtype
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import dir_lock
from eaglewire.infra.options import config_from_dict, save_config
from eaglewire.infra.paths import overlaps, require_exists
from eaglewire.infra.ranks import distributed, is_main, local_device, rank_world
from eaglewire.targets.fingerprint import chat_template_hash
from eaglewire.targets.load import load_target, load_tokenizer, resolve_target_dir
from eaglewire.targets.points import point_option


def _load(cfg):
    dev = local_device(resolve_device(cfg.device))
    return load_target(cfg.target, device=dev, dtype=resolve_dtype(cfg.dtype, dev))


def _prompt_problem(row: dict) -> str | None:
    """Why a prompts.jsonl row (what `data generate` asks the target) is unusable, if it is."""
    if why := index_problem(row):
        return why
    msgs = row.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
        return f"messages is {str(msgs)[:40]}: expected a list of {{role, content}} objects"
    return None


def _collect_prompts(cfg, target) -> tuple[list, dict]:
    path = cfg.out / PROMPTS
    if cfg.resume and path.exists():
        # written whole by the first run (atomically): a cut or empty file is damage, not a run to finish
        rows = read_jsonl(path, tolerate_partial_tail=False, check=_prompt_problem)
        if not rows:
            raise EaglewireError(f"{path}: no prompts (the first run wrote them all before answering; the file was "
                                 "emptied since): start a new --out")
        if [r["index"] for r in rows] != list(range(len(rows))):
            raise EaglewireError(f"{path}: indices are not 0..{len(rows) - 1} in order (the file was edited); "
                                 "start a new --out")
        return [Conversation(messages=r["messages"]) for r in rows], {"resumed": True}
    if cfg.prompts is None and cfg.self_prompts <= 0 and cfg.topic_prompts <= 0:
        raise EaglewireError("give --prompts FILE, --topic-prompts N or --self-prompts N")
    convs, counts = [], {}
    if cfg.prompts is not None:
        loaded = load_prompts(cfg.prompts)
        counts["loaded"] = len(loaded)
        convs += loaded
    generated = []
    if cfg.topic_prompts > 0:
        tp = topic_prompts(cfg.topic_prompts, seed=cfg.seed)
        counts["topic_prompts"] = len(tp)
        generated += tp
    if cfg.self_prompts > 0:
        sp, sp_counts = self_prompts(target, cfg.self_prompts, seed=cfg.seed, batch_size=cfg.batch_size,
                                     max_new_tokens=cfg.self_prompt_tokens)
        counts["self_prompts"] = sp_counts.__dict__ if hasattr(sp_counts, "__dict__") else sp_counts
        generated += sp
    if generated:
        # the user's own files are theirs to choose (the held-out set itself is built that way)
        generated, counts["heldout_near_copies"] = drop_heldout(generated, heldout_prompt_texts())
        convs += generated
    convs, dropped = dedupe(convs)
    counts.update(duplicates=dropped, unique=len(convs))
    rewrite_jsonl(path, [{"index": i, "messages": c.messages} for i, c in enumerate(convs)])
    return convs, counts


def _locked(fn):
    """Run a data stage holding its dataset directory's write lock (re-entrant for `data build`).

    A stage that reads a dataset (`cfg.data`) must find it before the lock
    would create it: a mistyped path is reported as missing, not made.
    """
    @functools.wraps(fn)
    def wrapper(cfg, *args, **kwargs):
        d = getattr(cfg, "out", None) or require_exists(cfg.data, "dataset directory")
        with (rank0_lock if distributed() else dir_lock)(d, f"data {fn.__name__.removeprefix('run_')}"):
            return fn(cfg, *args, **kwargs)
    return wrapper


def refuse_input_inside(cfg) -> None:
    """The dataset directory never is, holds or lies inside the --prompts it is built from (export's rule).

    The stages write `prompts.jsonl` and more into it: a prompts file there
    would be rewritten, a prompts directory around it would read our files back.
    """
    srcs = local_inputs(cfg.prompts) if cfg.prompts is not None else []
    if any(overlaps(cfg.out, src) for src in srcs):
        raise EaglewireError(f"--out {cfg.out}: is, holds or lies inside the input --prompts {cfg.prompts} (the "
                             "dataset directory's files are rewritten); choose an --out apart from the prompts")


@_locked
def run_generate(cfg, target=None, capture=None, managed_server: bool = False) -> dict:
    """`managed_server`: --server is a vLLM server `data build` started for this run; its address is not a setting."""
    refuse_input_inside(cfg)
    if (cfg.out / "manifest.json").exists() and not cfg.resume:
        raise EaglewireError(f"{cfg.out}: already holds a dataset; pass --resume or choose a new --out")
    # an empty answers file is what a run that failed before its first answer leaves: nothing to lose
    for f in [cfg.out / RESPONSES, *sorted(cfg.out.glob("responses.turn*.jsonl"))]:
        if f.is_file() and f.stat().st_size and not cfg.resume:
            raise EaglewireError(f"{f}: already holds responses; pass --resume or choose a new --out")
    if cfg.server is not None and cfg.self_prompts > 0:
        raise EaglewireError("--self-prompts samples from the target in this process; with --server use --prompts or --topic-prompts")
    if cfg.resume:
        recorded = recorded_generate(cfg.out)
        keys = [k for k in GENERATE_KEYS if not (managed_server and k == "server")]
        cfg = adopt_recorded(cfg, {k: recorded.get(k) for k in keys}, cfg.out / GENERATE_CONFIG)
    if cfg.turns > 1 and (cfg.server is not None or distributed()):
        raise EaglewireError(f"--turns {cfg.turns}: the earlier answers are generated in one process holding the "
                             "target; run it without --server and without torchrun")
    cfg.out.mkdir(parents=True, exist_ok=True)
    s = GenSettings(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                    batch_size=cfg.batch_size, seed=cfg.seed, max_prompt_tokens=cfg.max_prompt_tokens)
    if cfg.server is not None:
        return _generate_via_server(cfg, s, managed_server)
    target = target or _load(cfg)
    convs, counts = _prompts_everywhere(cfg, target)
    _record_start(cfg)
    earlier = []
    if cfg.turns > 1:
        convs, earlier = earlier_turns(target, convs, cfg.out, s, cfg.turns, cfg.resume)
    path, share = _answers_file(cfg)
    stats = _agree(generate_responses, target, convs, path, s, resume=cfg.resume, share=share, capture=capture)
    res = _gen_result(counts, stats, {**s.as_dict(), "turns": cfg.turns})
    if earlier:
        res["earlier_turns"] = earlier
    return _finish_generate(cfg, res)


def _record_start(cfg) -> None:
    """The settings are recorded before the first answer: a resume of an interrupted run is checked against them
    (`adopt_recorded`), so one answers file never mixes two targets or two settings."""
    if is_main() and not (cfg.resume and _generation_finished(cfg.out)):
        save_config(cfg, cfg.out / GENERATE_CONFIG)


def _agree(fn, *args, **kwargs):
    return agree(fn, *args, **kwargs)


def _prompts_everywhere(cfg, target) -> tuple[list, dict]:
    """Rank 0 collects (and writes) the prompts; under torchrun the other ranks then read them."""
    if not distributed():
        return _collect_prompts(cfg, target)
    first = _agree(lambda: _collect_prompts(cfg, target) if is_main() else None)
    return first or _collect_prompts(dataclasses.replace(cfg, resume=True), target)


def _answers_file(cfg) -> tuple[Path, tuple[int, int]]:
    """Where this process appends answers: `responses.jsonl`, or its rank's file under torchrun."""
    rank, world = rank_world()

    def fold():  # answers of an interrupted sharded run first go where every rank reads them
        if rank == 0 and any(cfg.out.glob("responses.rank*.jsonl")):
            consolidate_responses(cfg.out)

    if cfg.resume:
        _agree(fold)
    if not distributed():
        return cfg.out / RESPONSES, (0, 1)
    if cfg.resume:
        seed_rank_file(cfg.out, rank, world)
    return rank_responses(cfg.out, rank), (rank, world)


def _finish_generate(cfg, res: dict) -> dict:
    """Under torchrun: rank 0 merges the ranks' answers and writes the summed result."""
    if distributed():
        res = sum_results(gather(res))
        if is_main():
            consolidate_responses(cfg.out)
    if is_main():
        save_config(cfg, cfg.out / GENERATE_CONFIG, {"result": res})
    gather(None)  # nobody returns before the merged answers are on disk
    return res


def _gen_result(counts: dict, stats, settings: dict) -> dict:
    return {"prompts": counts, "responses": stats.done, "resumed": stats.resumed,
            "skipped_empty": stats.skipped_empty, "skipped_long": stats.skipped_long,
            "finish": stats.finish, "new_tokens": stats.new_tokens, "tokens_per_s": round(stats.tokens_per_s, 1),
            "settings": settings}


def _generate_via_server(cfg, s, managed: bool = False) -> dict:
    """Answers from the engine the user serves with; provenance says which, and how it was asked."""
    ss = ServerSettings(url=cfg.server, model=cfg.model, concurrency=cfg.concurrency, reasoning=cfg.reasoning,
                        retries=cfg.retries, timeout_s=cfg.request_timeout)
    client = ChatClient(ss.url, ss.timeout_s, ss.retries, ss.backoff_s)
    ident = client.identity(ss.model)
    ss.token_ids = is_vllm(ident)
    tok = load_tokenizer(cfg.target)
    convs, counts = _prompts_everywhere(cfg, None)
    _record_start(dataclasses.replace(cfg, server=None) if managed else cfg)
    path, share = _answers_file(cfg)
    stats, sst, tpl_reasoning = _agree(generate_via_server, client, ident["model"], tok, convs, path, s, ss,
                                       resume=cfg.resume, share=share)
    settings = {**s.as_dict(), "source": "server", "server": ident, "concurrency": ss.concurrency,
                "reasoning": {"mode": ss.reasoning, "samples_with_reasoning": sst.with_reasoning,
                              "stored_as": "reasoning_content" if tpl_reasoning else "inline <think>"},
                "answer_ids": {"from_server": sst.with_ids, "retokenized_text": stats.done - sst.with_ids},
                "chat_template": {"local_sha": chat_template_hash(tok),
                                  "prompt_tokens_checked": sst.prompt_tokens_checked,
                                  "prompt_tokens_mismatched": sst.prompt_tokens_mismatched}}
    settings.pop("batch_size")
    res = _gen_result(counts, stats, settings)
    res["failed"] = sst.failed
    if sst.prompt_tokens_mismatched:
        res["warnings"] = [f"{sst.prompt_tokens_mismatched} of {sst.prompt_tokens_checked} prompts: the server counted "
                           "a different number of prompt tokens than our chat template gives; it may apply another "
                           "template than the one extraction uses"]
    res = _finish_generate(cfg, res)
    if res["failed"]:
        raise EaglewireError(f"{cfg.out / FAILURES}: {res['failed']} of {res['failed'] + res['responses'] + res['skipped_empty']} "
                             f"requests failed after {ss.retries} retries (each error is listed there; nothing partial "
                             "was written); rerun with --resume to ask again for only those")
    return res


@_locked
def run_extract(cfg, target=None) -> dict:
    """Capture the features of every answer into shards (read from `gencapture/` where generation kept them)."""
    refuse_foreign_shards(cfg.data)
    # every stored answer or an error: a cut last line is damage here, not a row still being written
    rows = [r for r in read_jsonl(cfg.data / RESPONSES, tolerate_partial_tail=False, check=response_problem)
            if "messages" in r]
    if not rows:
        raise EaglewireError(f"{cfg.data / RESPONSES}: no responses (run `eaglewire data generate` first)")
    cfg = settings_from_manifest(cfg)
    if cfg.engine == "vllm":
        if distributed():
            raise EaglewireError("--engine vllm: one process drives the vLLM server (which is parallel itself); "
                                 "run it without torchrun")
        target = None
        num_layers, vocab_size = _config_int(cfg.target, "num_hidden_layers"), _config_int(cfg.target, "vocab_size")
    else:
        target = target or _load(cfg)
        num_layers, vocab_size = target.num_layers, target.vocab_size
    check_answer_vocab(cfg.data / RESPONSES, rows, vocab_size)
    pts = point_option(cfg.points, num_layers)
    refuse_unservable_order(pts, f"{cfg.data}: --points")
    names = [p.name for p in pts]
    gen_cfg = cfg.data / "generate.config.json"
    gen = _generate_settings(gen_cfg)
    s = ExtractSettings(points=names, dtype=cfg.store_dtype, batch_tokens=cfg.batch_tokens,
                        max_seq_len=cfg.max_seq_len, shard_samples=cfg.shard_samples)
    t0 = time.perf_counter()
    if target is None:
        man = run_vllm_extract(cfg, rows, s, gen)
        save_config(cfg, cfg.data / "extract.config.json")
    else:
        man = _extract_everywhere(cfg, target, rows, s, gen)
    return {"num_samples": man.num_samples, "num_tokens": man.num_tokens, "points": man.point_names,
            "dropped": man.dropped, "seconds": round(time.perf_counter() - t0, 1),
            "tokens_per_s": round(man.extract_tokens_per_s or 0.0, 1)}


def _config_int(source: str, key: str) -> int:
    p = resolve_target_dir(source) / "config.json"
    cfg = read_json(p, "no config.json")
    text = cfg.get("text_config") if isinstance(cfg, dict) else None
    n = cfg.get(key, text.get(key) if isinstance(text, dict) else None) if isinstance(cfg, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise EaglewireError(f"{p}: {key} missing or not a positive integer")
    return n


def _extract_everywhere(cfg, target, rows: list[dict], s, gen: dict) -> Manifest:
    """One process writes shards into the dataset; under torchrun each rank writes its share
    under `rank-<r>/` and rank 0 merges the manifests into the one training reads."""
    rank, world = rank_world()
    _agree(check_ranks, cfg.data, world)
    if not distributed():
        man = extract(target, rows, cfg.data, s, gen, resume=cfg.resume)
    else:
        mine = [r for r in rows if r["index"] % world == rank]
        _agree(extract, target, mine, rank_dir(cfg.data, rank), s, gen, resume=cfg.resume)
        _agree(lambda: merge_manifests(cfg.data, world) if rank == 0 else None)
        man = Manifest.load(cfg.data)
    if rank == 0:
        save_config(cfg, cfg.data / "extract.config.json")
    return man


def auto_vocab_size(vocab: int) -> int:
    """8192 covers >97% of assistant tokens on the default target's data while cutting the
    draft lm_head (the largest draft cost on CPU) 6x versus the full 49,152."""
    return min(8192, vocab)


@_locked
def run_vocab(cfg) -> dict:
    """Counted over every sample; under torchrun rank 0 counts and the others read its result."""
    res = _agree(lambda: _vocab(cfg) if is_main() else None)
    return res if is_main() else Manifest.load(cfg.data).vocab


def _vocab(cfg) -> dict:
    man = Manifest.load(cfg.data)
    V = man.target.fingerprint.vocab_size
    if V is None:
        raise EaglewireError(f"{cfg.data}: the manifest does not record the target's vocab size "
                             "(re-import the dataset with --target)")
    ds = FeatureDataset(cfg.data, verify=False)
    ids = [ds[i]["input_ids"].tolist() for i in range(len(ds))]
    masks = [ds[i]["loss_mask"].int().tolist() for i in range(len(ds))]
    counts = count_tokens(ids, masks, V)
    size = cfg.vocab_size or auto_vocab_size(V)
    vocab = build_draft_vocab(counts, size)
    save_vocab(cfg.data, vocab)
    man.vocab = {"size": size, "coverage": vocab.coverage, "num_distinct": int((counts > 0).sum())}
    man.save(cfg.data)
    save_config(cfg, cfg.data / "vocab.config.json")
    return man.vocab


def _generation_finished(d: Path) -> bool:
    p = Path(d) / GENERATE_CONFIG
    try:
        return p.is_file() and "result" in json.loads(p.read_text())
    except ValueError:
        return False


@_locked
def run_build(cfg: DataBuildConfig) -> dict:
    refuse_input_inside(cfg)
    refuse_foreign_shards(cfg.out)  # before hours of generation, not after
    cfg = _recorded_build(cfg)  # before a target is loaded or a file written
    vllm = cfg.engine == "vllm"
    if vllm and distributed():
        raise EaglewireError("--engine vllm: one process drives the vLLM servers (which are parallel themselves); "
                             "run it without torchrun")
    target = None if vllm else _load(cfg)
    L = target.num_layers if target is not None else _config_int(cfg.target, "num_hidden_layers")
    refuse_unservable_order(point_option(cfg.points, L), f"{cfg.out}: --points")  # before hours of generation
    gen_keys = DataGenerateConfig.__dataclass_fields__
    gcfg = config_from_dict(DataGenerateConfig, {k: getattr(cfg, k) for k in gen_keys})
    res = {}
    if not (cfg.resume and Manifest.exists(cfg.out)):
        if vllm and cfg.server is None and cfg.resume and _generation_finished(cfg.out):
            res["generate"] = {"skipped": "finished before"}  # its server's port is gone: asking again would clash
        elif vllm and cfg.server is None:  # the target is vLLM's to hold: answers come from a plain vLLM server

            res["generate"] = generate_on_vllm(
                cfg, lambda url: run_generate(dataclasses.replace(gcfg, server=url), managed_server=True))
        else:
            res["generate"] = run_generate(gcfg, target, capture=_gen_capture(cfg, target))
    ex = {k: getattr(cfg, k) for k in DataExtractConfig.__dataclass_fields__ if k != "data" and hasattr(cfg, k)}
    ecfg = config_from_dict(DataExtractConfig, {**ex, "data": cfg.out})
    if not complete_and_intact(cfg.out):
        res["extract"] = run_extract(ecfg, target)
    res["vocab"] = run_vocab(DataVocabConfig(data=cfg.out, vocab_size=cfg.vocab_size))
    if is_main():
        save_config(cfg, cfg.out / "build.config.json")
    return res


def _recorded_build(cfg: DataBuildConfig) -> DataBuildConfig:
    """A resumed build continues what its records say, every stage's: options left out take the recorded
    values, another value is refused naming both. (A server's address is run_generate's to check: the
    one `--engine vllm` starts changes every run.)"""
    if not cfg.resume:
        return cfg
    gen = recorded_generate(cfg.out)
    cfg = adopt_recorded(cfg, {k: gen.get(k) for k in GENERATE_KEYS if k != "server"}, cfg.out / GENERATE_CONFIG)
    rec, where = recorded_settings(cfg.out)
    return adopt_recorded(cfg, rec, where) if rec else cfg


def _gen_capture(cfg: DataBuildConfig, target) -> GenCapture | None:
    """Features kept while generating (data/gencapture.py), where nothing stands against it."""
    if not cfg.gen_capture or cfg.server is not None or distributed() or why_not_gencapture(target.model.config):
        return None
    return GenCapture(target, cfg.out, point_option(cfg.points, target.num_layers), cfg.store_dtype)


def info(d: Path, verify: bool = True) -> dict:
    man = Manifest.load(d)
    if verify:
        verify_shards(d, man)
    raw = man.to_json()
    return {
        "path": str(d), "complete": man.complete, "points": raw["points"],
        "num_samples": man.num_samples, "num_tokens": man.num_tokens, "num_loss_tokens": man.num_loss_tokens,
        "target": man.target.source, "target_fingerprint": raw["target"]["fingerprint"],
        "chat_template_sha": man.chat_template_sha, "generation": man.generation,
        "answer_tokens": man.answer_tokens or ("not recorded (imported, or extracted before answer ids were stored: "
                                              "then answers were re-tokenised from text)"),
        "store_dtype": man.extract.get("dtype"), "norm_stats": man.norm_stats,
        "vocab": man.vocab, "num_shards": len(man.shards), "dropped": man.dropped,
        "manifest_sha": manifest_hash(d), "checksums_verified": verify,
    }


def _generate_settings(path: Path) -> dict:
    """The settings `data generate` recorded (how the answers were made), or {} when there is no record."""
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:  # bad JSON, bytes that are not UTF-8, nesting too deep
        raise EaglewireError(f"{path}: not valid JSON ({str(e)[:80]}); regenerate the answers or delete this record") from e
    if isinstance(raw, dict) and "result" not in raw:  # recorded at the start of a generation that did not finish
        return {}
    res = raw.get("result", {}) if isinstance(raw, dict) else None
    settings = res.get("settings", {}) if isinstance(res, dict) else None
    if not isinstance(settings, dict):
        raise EaglewireError(f"{path}: expected an object with result.settings (the record `data generate` writes)")
    return settings
