"""Start llama.cpp's `llama-server` for a GGUF target and an exported GGUF drafter, and read what it reports.

llama.cpp counts speculation per response (`timings.draft_n`, drafted tokens,
and `timings.draft_n_accepted`), not per draft position as vLLM does, but its
`--metrics` page keeps vLLM's per-position counters (under `llamacpp:`), which
`doctor live` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eaglewire.engines.vllm_server import VllmServer, http_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.depth import DEPTH

# The draft gate eaglewire serves llama.cpp with (`--spec-draft-p-min`): of the gates measured on this CPU
# (0, 0.3, 0.5, 0.7; docs/results.md) 0.5 paid best with the standard drafter, and depth 2 with it.
DEFAULT_P_MIN = 0.5

@dataclass
class LlamaSpec:
    target_gguf: Path
    drafter_gguf: Path | None  # `eaglewire export --format gguf` output's drafter.gguf; None = plain serving
    depth: int = DEPTH  # --spec-draft-n-max
    port: int = 8080
    host: str = "127.0.0.1"
    ctx: int = 4096
    threads: int = 0  # 0 = llama.cpp's own choice
    p_min: float = 0.0  # --spec-draft-p-min: 0 drafts every position (what eaglewire's ungated chain predicts)
    repack: bool | None = None  # llama.cpp's weight repacking (AMX, interleaved layouts); None: off on AMX CPUs
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags as the kernel reports them (empty where there is no /proc/cpuinfo)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def llama_command(binary: Path | str, spec: LlamaSpec, flags: set[str] | None = None) -> list[str]:
    """The one place the command line is built: what runs here is what `serve --print-command` prints.

    WHY ``--no-repack`` on AMX CPUs: the managed build is native, and on a Xeon
    with AMX the llama.cpp of llama-cpp-python 0.3.36 puts quantized weights in
    its AMX buffers, whose matrix product crashes the server at warm-up
    (SIGSEGV in ``ggml_backend_amx_mul_mat``: the shipped Q4_1 target alone, or
    an F32 target with a Q8_0 drafter; F32/F16 weights never take that path).
    Repacking off keeps the plain CPU kernels; plain and drafted servers get
    the same flag, so their comparison is unchanged.
    """
    cmd = [str(binary), "-m", str(spec.target_gguf), "--host", spec.host, "--port", str(spec.port),
           "-c", str(spec.ctx), "-np", "1", "--no-webui", "--metrics"]
    repack = spec.repack if spec.repack is not None else "amx_int8" not in (cpu_flags() if flags is None else flags)
    if not repack:
        cmd.append("--no-repack")
    if spec.threads:
        cmd += ["-t", str(spec.threads), "-tb", str(spec.threads)]
    if spec.drafter_gguf is not None:
        cmd += ["-md", str(spec.drafter_gguf), "--spec-type", "draft-eagle3",
                "--spec-draft-n-max", str(spec.depth), "--spec-draft-n-min", "0",
                "--spec-draft-p-min", f"{spec.p_min:g}"]
        if spec.threads:
            cmd += ["-td", str(spec.threads), "-tbd", str(spec.threads)]
    return cmd + list(spec.extra)


class LlamaServer(VllmServer):
    """A llama-server process owned by this object (same start/await/stop rules as the vLLM one: it dies with
    eaglewire, on SIGTERM or kill -9 too)."""

    name = "llama-server"

    def __init__(self, binary: Path | str, spec: LlamaSpec, log: Path, env: dict[str, str] | None = None):
        self.python, self.spec, self.log, self.env = binary, spec, Path(log), env or {}
        self.command = llama_command(binary, spec)
        self.proc = None

    def model_dirs(self) -> list[Path]:
        return []  # GGUF files: data the server parses, no code (their HF sources were checked when converted)


def complete(url: str, prompt_ids: list[int], max_tokens: int, timeout: float = 600) -> tuple[list[int], dict]:
    """Greedy completion of exact prompt token ids: (generated ids, llama.cpp's timings of this response)."""
    body = {"prompt": prompt_ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "seed": 0,
            "cache_prompt": False, "return_tokens": True, "ignore_eos": False, "n_probs": 0}
    r = http_json(url, "/completion", body, timeout=timeout)
    where = f"{url}/completion"
    toks = r.get("tokens")
    if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
        raise EaglewireError(f"{where}: no list of integer `tokens` in the answer (llama-server with return_tokens)")
    timings = r.get("timings")
    if not isinstance(timings, dict):
        raise EaglewireError(f"{where}: no `timings` object in the answer")
    return toks, timings

