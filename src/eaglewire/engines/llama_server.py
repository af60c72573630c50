"""Start llama.cpp's `llama-server` for a GGUF target and an exported GGUF drafter, and read what it reports.

llama.cpp counts speculation per response (`timings.draft_n`, drafted tokens,
and `timings.draft_n_accepted`), not per draft position as vLLM does, and it
names no rounds. With a fixed depth and no probability gate every round
drafts `depth` tokens, except where the answer's length limit cuts the last
ones, so rounds are counted from tokens instead: every generated token is the
prefill's first one, an accepted draft, or a round's bonus token.
(`doctor live` reads the exact per-position counters of `--metrics` instead.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eaglewire.engines.vllm_server import VllmServer, http_json
from eaglewire.infra.errors import EaglewireError


@dataclass
class LlamaSpec:
    target_gguf: Path
    drafter_gguf: Path | None  # `eaglewire export --format gguf` output's drafter.gguf; None = plain serving
    depth: int = 3  # --spec-draft-n-max
    port: int = 8080
    host: str = "127.0.0.1"
    ctx: int = 4096
    threads: int = 0  # 0 = llama.cpp's own choice
    p_min: float = 0.0  # --spec-draft-p-min: 0 drafts every position (what eaglewire's ungated chain predicts)
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def llama_command(binary: Path | str, spec: LlamaSpec) -> list[str]:
    """The one place the command line is built: what runs here is what `serve --print-command` prints."""
    cmd = [str(binary), "-m", str(spec.target_gguf), "--host", spec.host, "--port", str(spec.port),
           "-c", str(spec.ctx), "-np", "1", "--no-webui", "--metrics"]
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
    """A llama-server process owned by this object (same start/await/stop rules as the vLLM one)."""

    name = "llama-server"

    def __init__(self, binary: Path | str, spec: LlamaSpec, log: Path, env: dict[str, str] | None = None):
        self.python, self.spec, self.log, self.env = binary, spec, Path(log), env or {}
        self.command = llama_command(binary, spec)
        self.proc = None


def _int_field(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise EaglewireError(f"{where}: `{key}` is {v!r}, expected a count (llama-server with a draft model "
                             "reports timings.draft_n and timings.draft_n_accepted)")
    return v


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


def served_acceptance(url: str, prompts: list[list[int]], max_tokens: int) -> dict:
    """Totals over `prompts`: tokens generated, drafted and accepted, and the mean acceptance length.

    Rounds = generated - accepted - prompts (each prompt's first token comes from the prefill);
    the mean acceptance length counts the bonus token: 1 + accepted / rounds, as vLLM's is.
    """
    gen = drafted = accepted = 0
    outputs = []
    for p in prompts:
        toks, t = complete(url, p, max_tokens)
        where = f"{url}/completion timings"
        d, a = _int_field(t, "draft_n", where), _int_field(t, "draft_n_accepted", where)
        if a > d:
            raise EaglewireError(f"{where}: draft_n_accepted {a} exceeds draft_n {d}")
        gen, drafted, accepted = gen + len(toks), drafted + d, accepted + a
        outputs.append(toks)
    rounds = gen - accepted - sum(1 for o in outputs if o)
    return {"generated": gen, "drafted": drafted, "accepted": accepted, "rounds": rounds,
            "mean_acceptance_length": 1.0 + accepted / rounds if rounds else None, "outputs": outputs}

