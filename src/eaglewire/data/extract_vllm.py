"""`data extract --engine vllm`: the same dataset, with the target run by a vLLM server.

For targets that no single device holds (DeepSeek-V3 / Kimi-K2.5 class), the
capture runs where the target is served, tensor/expert parallel. Only the
tokenizer, the embedding (for the fingerprint) and the final norm are loaded
here. Everything else is the in-process path's: the same tokenization and
loss masks, shards, manifest, checksums, locking and `--resume`.

What vLLM cannot capture is derived, and said so in the manifest: its ids
reach every residual stream from the embedding (id 0) to the last layer's
output (id L), but not the final norm. Training needs the final norm (the
target's distribution is the frozen head applied to it), so the last layer's
output is captured as well and the target's own norm module (transformers'
class, the checkpoint's weight) is applied to it here, in fp32.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglewire.data.extract import extract
from eaglewire.data.manifest import Manifest, complete_and_intact
from eaglewire.data.recorded import recorded_extract_settings
from eaglewire.engines.vllm_capture import StatesClient, capture_args, plugin_env
from eaglewire.engines.vllm_env import find_python, is_cpu_build, startup_refusal, vllm_version
from eaglewire.engines.vllm_server import ServeSpec, VllmServer, free_port, serve_command
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.codecheck import json_or_none
from eaglewire.targets.families import serving_arch
from eaglewire.targets.load import load_skeleton, resolve_target_dir
from eaglewire.targets.points import (
    EMBED,
    FINAL_NORM,
    Point,
    ids_for_points,
    layer_out,
    parse_points,
    point_option,
)
from eaglewire.targets.registry import VLLM_NO_EMBED_MODEL_TYPES, cpu_only_dtype, pinned_version

STATES_DIR = ".vllm-states"


def capture_plan(pts: list[Point], num_layers: int, model_type: str | None = None) -> tuple[list[int], list[int], int]:
    """(vLLM ids to request, column of each point, column of the last layer's output).

    vLLM sorts and deduplicates the ids, so columns follow the sorted ids. A
    `final_norm` point is derived like the target hidden (column of the last layer).
    """
    if EMBED in pts and model_type in VLLM_NO_EMBED_MODEL_TYPES:
        raise EaglewireError(f"--points embed: vLLM {pinned_version('vllm')} cannot capture the embedding of a {model_type} "
                             "target (its DeepSeek model adds a residual that does not exist yet at id 0, and the "
                             "server dies at startup); capture it in process, or choose layers.<k>.out points")
    last = layer_out(num_layers - 1)
    wanted = [last if p == FINAL_NORM else p for p in pts] + [last]
    ids = ids_for_points(wanted, "vllm", num_layers)
    if any(i is None for i in ids):  # cannot happen for embed/layers; kept as the rule's guard
        raise EaglewireError(f"vLLM cannot capture {[p.name for p, i in zip(wanted, ids) if i is None]}")
    order = sorted(set(ids))
    cols = [order.index(i) for i in ids]
    return order, cols[:-1], cols[-1]


class VllmCapture:
    """Features of a batch from a capture server: ([n, P, H] points, [n, H] final norm) per sample."""

    def __init__(self, client, skeleton, pts: list[Point], provenance: dict, forward_dtype: str):
        self.client, self.pts = client, pts
        self.ids, self.cols, self.last = capture_plan(pts, skeleton.num_layers, skeleton.config.model_type)
        self.norm = skeleton.model.get_decoder().norm
        self.final_slots = [j for j, p in enumerate(pts) if p == FINAL_NORM]
        self.info, self.forward_dtype = provenance, forward_dtype
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="vllm-capture")

    def provenance(self) -> dict:
        return dict(self.info)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    @torch.no_grad()
    def _one(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        states = self.client.states(ids)  # [n, K, H]
        fin = self.norm(states[:, self.last].float())  # [n, H] the target's final norm, applied here
        feats = states[:, self.cols].float()  # [n, P, H]
        for j in self.final_slots:
            feats[:, j] = fin
        return feats, fin

    def __call__(self, batch: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # the whole batch in flight at once: the server batches concurrent requests itself
        return list(self.pool.map(lambda item: self._one(item[1]), batch))


def _vllm_dtype(dtype: str, cpu_build: bool, target_dir: Path | None = None) -> str:
    """vLLM's --dtype for eaglewire's. vLLM 0.32's CPU build runs gated-delta-net linear attention (Qwen3-Next,
    Qwen3.5) in bf16 only (model_executor/layers/mamba/ops/cpu/gdn_attention.py: `assert mixed_qkv.dtype ==
    torch.bfloat16, "CPU GDN attention requires BF16."`, raised on the first request; the registry's
    `cpu_only_dtypes` of vLLM): auto picks bf16 there, and another dtype is refused before a server starts."""
    names = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    only = cpu_only_dtype("vllm", _layer_kinds(target_dir)) if cpu_build and target_dir is not None else None
    if dtype == "auto":
        return names[only[1]] if only else "float32" if cpu_build else "auto"
    if dtype not in names:
        raise EaglewireError(f"--dtype {dtype!r}: expected auto, {', '.join(names)}")
    if only and dtype != only[1]:
        kind, need, words = only
        raise EaglewireError(f"--dtype {dtype}: vLLM {pinned_version('vllm')}'s CPU build runs the "
                             f"{kind.replace('_', ' ')} of {target_dir} in {need} only ('{words}'); use --dtype {need}")
    return names[dtype]


def _layer_kinds(target_dir: Path) -> list:
    """The kinds of the target's language-model layers (its config's layer_types; [] when it names none)."""
    raw = json_or_none(Path(target_dir) / "config.json")
    raw = raw if isinstance(raw, dict) else {}
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    kinds = text.get("layer_types")
    return kinds if isinstance(kinds, list) else []


def server_spec(cfg, target_dir: Path, ids: list[int], states_dir: Path, cpu_build: bool, max_len: int):
    """The managed capture server for `ids`, taking sequences of up to `max_len` tokens."""
    extra = capture_args(ids, states_dir, ours=cpu_build) + _parallel_args(cfg)
    return ServeSpec(target_dir=target_dir, drafter_dir=None, port=free_port(), dtype=_vllm_dtype(cfg.dtype, cpu_build, target_dir),
                     max_model_len=_model_len(target_dir, max_len + 1), memory_fraction=0.3 if cpu_build else 0.0,
                     extra=extra)


def _parallel_args(cfg) -> list[str]:
    """The user's parallelism and extra flags, the same for the generation and the capture server."""
    tp = ["--tensor-parallel-size", str(cfg.tensor_parallel_size)] if cfg.tensor_parallel_size > 1 else []
    return tp + shlex.split(cfg.engine_args)


def _model_len(target_dir: Path, want: int) -> int:
    """vLLM refuses a --max-model-len past the target's positions; a longer sample then fails by name."""
    c = json.loads((Path(target_dir) / "config.json").read_text())
    limit = c.get("max_position_embeddings") or (c.get("text_config") or {}).get("max_position_embeddings")
    return min(want, int(limit)) if isinstance(limit, (int, float)) and limit > 0 else want


def _provenance(version: str | None, cfg, ids: list[int], num_layers: int, url: str | None) -> dict:
    return {"engine": "vllm", "version": version, "server": url or "managed", "vllm_ids": ids,
            "tensor_parallel_size": cfg.tensor_parallel_size, "engine_args": cfg.engine_args,
            "target_hidden": f"derived: the target's final norm applied to layers.{num_layers - 1}.out "
                             f"(vLLM id {num_layers}), in fp32 by eaglewire"}


def run_vllm_extract(cfg, rows: list[dict], s, gen: dict):
    """Start (or reach) a capture server and extract through it; returns the manifest."""
    if cfg.resume and complete_and_intact(cfg.data):
        man = Manifest.load(cfg.data)
        if {r["index"] for r in rows} <= set(man.sample_indices()):
            return man  # nothing to capture: start no server
    skeleton = load_skeleton(cfg.target)
    pts = parse_points(s.points, skeleton.num_layers)
    with vllm_capture(cfg, skeleton, pts, CaptureSite(Path(cfg.states_dir or cfg.data / STATES_DIR).resolve(),
                                                      cfg.states_dir is None, cfg.data / "vllm-capture.log",
                                                      s.max_seq_len, "finished shards are kept: rerun with --resume",
                                                      "extract")) as cap:
        return extract(skeleton, rows, cfg.data, s, gen, resume=cfg.resume, capture_with=cap)


@dataclass
class CaptureSite:
    """Where a capture session keeps its files, and what its messages say."""

    states_root: Path  # the server writes each request's states under here (a server at --engine-url: exactly here)
    own_root: bool  # the root is this command's own (its lock is held): files left by killed runs are removed
    log: Path  # a managed server's log
    max_len: int  # the longest token sequence a request sends
    after_death: str  # what is kept and how to continue, when the server dies mid-run
    stage: str  # the progress lines' prefix


@contextmanager
def vllm_capture(cfg, skeleton, pts: list[Point], site: CaptureSite):
    """A `VllmCapture` of `pts` through the server at `cfg.engine_url`, or through one started (and stopped) here.

    Shared by `data extract --engine vllm` and `train --online --engine vllm`: `cfg` gives engine_url, dtype,
    vllm_python, tensor_parallel_size, engine_args, startup_timeout and request_timeout. A managed server's
    start is refused in one line, before anything is written, when its vLLM is known not to run the target.
    """
    ids = capture_plan(pts, skeleton.num_layers, skeleton.config.model_type)[0]
    if cfg.engine_url:
        client = StatesClient(cfg.engine_url, None, len(ids), skeleton.hidden_size, cfg.request_timeout,
                              states_dir=site.states_root)
        version = (client.client.identity(client.model).get("version") or {}).get("version")
        if cfg.dtype != "auto":
            _vllm_dtype(cfg.dtype, False)  # the name is checked; the server's own dtype is the user's to match
        fdtype = None if cfg.dtype == "auto" else cfg.dtype  # auto: unknown, the doctor infers it
        cap = VllmCapture(client, skeleton, pts, _provenance(version, cfg, ids, skeleton.num_layers, cfg.engine_url),
                          fdtype)
        try:
            yield cap
        finally:
            cap.close()
        return
    python = _startable(find_python(cfg.vllm_python), skeleton.path)
    with _run_states_dir(site.states_root, site.own_root) as states_dir:
        cpu = is_cpu_build(python)
        spec = server_spec(cfg, skeleton.path, ids, states_dir, cpu, site.max_len)
        print(f"[{site.stage}] starting vLLM ({'CPU build' if cpu else 'GPU'}; ~3 min), ids {ids}; log {site.log}",
              flush=True)
        with VllmServer(python, spec, site.log, env=plugin_env() if cpu else None).start(timeout=cfg.startup_timeout) as srv:
            client = StatesClient(srv.spec.url, None, len(ids), skeleton.hidden_size, cfg.request_timeout,
                                  states_dir=states_dir)
            fdtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(spec.dtype)  # auto: vLLM's choice
            cap = VllmCapture(client, skeleton, pts, _provenance(vllm_version(python), cfg, ids, skeleton.num_layers,
                                                                 None), fdtype)
            try:
                yield cap
            except EaglewireError as e:
                if srv.proc.poll() is None:
                    raise
                raise EaglewireError(f"vLLM server died during capture (exit {srv.proc.returncode}; log {site.log}: "
                                     f"{srv.log_tail()}); {site.after_death}") from e
            finally:
                cap.close()


@contextmanager
def _run_states_dir(root: Path, own: bool):
    """A directory this run makes under the states directory `root`, for a managed server's files; removed after.

    A --states-dir the user names may hold files of their own: the server writes
    into a fresh directory of ours, and only what that holds is ever removed.
    """
    root.mkdir(parents=True, exist_ok=True)
    if own:  # the dataset's or the run's own (its lock is held): left by runs killed before cleaning up
        for old in root.glob(".eaglewire-*"):
            _clear_states(old)
    d = Path(tempfile.mkdtemp(prefix=".eaglewire-", dir=root))
    try:
        yield d
    finally:
        _clear_states(d)
        if own and root.is_dir() and not any(root.iterdir()):
            root.rmdir()


def _clear_states(states_dir: Path) -> None:
    """State files of requests that were never read (a crash, Ctrl-C) in a run's own directory, then the directory."""
    if states_dir.is_dir() and not states_dir.is_symlink():
        for p in [*states_dir.glob("*.safetensors"), *states_dir.glob("*.safetensors.lock")]:
            p.unlink(missing_ok=True)
        if not any(states_dir.iterdir()):
            states_dir.rmdir()


def _startable(python: Path, target_dir: Path) -> Path:
    """`python` when nothing known stops its vLLM from starting the target; else one line, before any start."""
    why = startup_refusal(python, target_dir, serving_arch(target_dir))
    if why is not None:
        raise EaglewireError(why)
    return python


def generate_on_vllm(cfg, generate):
    """Run `generate(url)` against a plain vLLM server started for the target (`data build --engine vllm`)."""
    python = _startable(find_python(cfg.vllm_python), resolve_target_dir(cfg.target))
    cpu = is_cpu_build(python)
    spec = ServeSpec(target_dir=resolve_target_dir(cfg.target), drafter_dir=None, port=free_port(),
                     dtype=_vllm_dtype(cfg.dtype, cpu, resolve_target_dir(cfg.target)),
                     max_model_len=_model_len(resolve_target_dir(cfg.target), cfg.max_prompt_tokens + cfg.max_new_tokens + 8),
                     memory_fraction=0.3 if cpu else 0.0, extra=_parallel_args(cfg))
    log = cfg.out / "vllm-generate.log"
    cfg.out.mkdir(parents=True, exist_ok=True)
    print(f"[generate] starting vLLM for the answers (~3 min); log {log}", flush=True)
    with VllmServer(python, spec, log).start(timeout=cfg.startup_timeout) as srv:
        return generate(srv.spec.url + "/v1")


def print_command(cfg) -> str:
    """The capture server's command line, for a cluster where the user launches vLLM."""
    cfg = recorded_extract_settings(cfg)  # a dataset's recorded points and target win, as on --resume
    skeleton = load_skeleton(cfg.target)
    pts = parse_points([p.name for p in point_option(cfg.points, skeleton.num_layers)], skeleton.num_layers)
    ids = capture_plan(pts, skeleton.num_layers, skeleton.config.model_type)[0]
    states_dir = Path(cfg.states_dir or cfg.data / STATES_DIR).resolve()
    spec = server_spec(cfg, resolve_target_dir(cfg.target), ids, states_dir, False, cfg.max_seq_len)
    spec.port = 8000  # the host stays loopback, as `serve`'s: the server has no API key
    # `vllm serve` acts on --headless for nodes > 0
    return shlex.join(serve_command(spec)) + "\n" + HOST_NOTE


HOST_NOTE = ("# listens on 127.0.0.1 only (no API key): when eaglewire or other nodes run on another machine, "
             "change --host to an address on a trusted network")
