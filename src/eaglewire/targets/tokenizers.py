"""Tokenizers that a repository ships only as its own code, read without running that code.

Kimi-K2 and Kimi-K2.5 ship `tiktoken.model` (tiktoken's BPE rank file: one
`base64(token bytes) rank` per line) and `tokenization_kimi.py`, named by
`tokenizer_config.json`'s `auto_map` (`TikTokenTokenizer`), and no
`tokenizer.json`. That class is a `tiktoken.Encoding` over the rank file with
Kimi's split pattern, and 256 reserved special ids right after the ranks,
named by `added_tokens_decoder` (`<|reserved_token_{id}|>` otherwise); it
encodes with every special allowed and adds no BOS. transformers builds the
same BPE natively (`convert_slow_tokenizer.TikTokenConverter`: merges read
back from the ranks, the pattern as a pre-tokenizer, tiktoken's whole-word
lookup), so eaglewire parses the rank file itself (no `tiktoken` package, no
network, nothing of the directory's code), hands it to that converter, and
writes the result as a plain `tokenizer.json` where an engine needs files
(vLLM without trust_remote_code: engines/vllm_server.py). Only an `auto_map`
naming a family listed in FAMILIES is read this way; any other stays refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.atomic import atomic_dir
from eaglewire.infra.checksums import file_sha256
from eaglewire.infra.errors import EaglewireError

CONVERSION_VERSION = 1  # bump when a converted tokenizer directory's contents change
MAX_RANK_BYTES = 256 * 1024 ** 2  # Kimi's tiktoken.model is 2.8 MB; a bigger file is not a rank file


@dataclass(frozen=True)
class TiktokenFamily:
    name: str
    vocab_file: str  # the rank file the class reads (its VOCAB_FILES_NAMES)
    pattern: str  # the class's `pat_str`
    reserved: int  # special ids after the ranks (`num_reserved_special_tokens`)


# Kimi's `TikTokenTokenizer.pat_str` and `num_reserved_special_tokens`, as published in tokenization_kimi.py of
# moonshotai/Kimi-K2-Instruct, Kimi-K2-Thinking and Kimi-K2.5 (Han runs split apart; `&&` is class intersection,
# which tiktoken's fancy-regex and the tokenizers library's Oniguruma both read).
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
KIMI = TiktokenFamily("Kimi's TikTokenTokenizer", "tiktoken.model", KIMI_PATTERN, 256)
FAMILIES = {"tokenization_kimi.TikTokenTokenizer": KIMI}  # auto_map class reference -> family


def family_of_auto_map(auto_map: object) -> TiktokenFamily | None:
    """The family a tokenizer_config `auto_map` names, or None when it names anything else too."""
    if not (isinstance(auto_map, dict) and set(auto_map) == {"AutoTokenizer"}):
        return None
    ref = auto_map["AutoTokenizer"]
    refs = [ref] if isinstance(ref, str) else ref if isinstance(ref, list) else []
    named = [r for r in refs if r is not None]
    if len(refs) not in (1, 2) or len(named) != 1 or not isinstance(named[0], str):
        return None
    return FAMILIES.get(named[0])


def family_of(d: Path) -> TiktokenFamily | None:
    """The known family whose code `d`'s tokenizer_config.json names and whose rank file `d` holds, or None
    (also when `d` has a tokenizer.json: eaglewire reads that one, targets/load.py, and converts nothing)."""
    p = Path(d) / "tokenizer_config.json"
    if (Path(d) / "tokenizer.json").is_file():
        return None
    try:
        raw = json.loads(p.read_text()) if p.is_file() else None
    except (ValueError, OSError, RecursionError):
        return None
    fam = family_of_auto_map(raw.get("auto_map")) if isinstance(raw, dict) else None
    return fam if fam is not None and (Path(d) / fam.vocab_file).is_file() else None


def read_ranks(p: Path) -> dict[bytes, int]:
    """tiktoken's rank file, parsed strictly: each line `base64 rank`, ranks 0..N-1 each once."""
    p = Path(p)
    if p.stat().st_size > MAX_RANK_BYTES:
        raise EaglewireError(f"{p}: {p.stat().st_size} bytes, more than a tiktoken rank file holds "
                             f"({MAX_RANK_BYTES} at most)")
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(p.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            if len(parts) != 2 or not token or rank < 0:
                raise ValueError
        except (ValueError, IndexError, binascii.Error):
            raise EaglewireError(f"{p}: line {n}: expected `<base64 token> <rank>` (tiktoken's rank file)") from None
        if token in ranks:
            raise EaglewireError(f"{p}: line {n}: token {token!r} ranked twice")
        ranks[token] = rank
    if not ranks:
        raise EaglewireError(f"{p}: empty; expected tiktoken's rank file (`<base64 token> <rank>` lines)")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise EaglewireError(f"{p}: expected ranks 0..{len(ranks) - 1} each once (special ids follow the last), "
                             f"got {len(set(ranks.values()))} distinct ranks up to {max(ranks.values(), default=-1)}")
    return ranks


def _content(v) -> str | None:
    return v.get("content") if isinstance(v, dict) else v


def special_tokens(cfg: dict, n_base: int, fam: TiktokenFamily, where: Path) -> list[str]:
    """The reserved special tokens in id order (ids n_base...): `added_tokens_decoder`'s names, the class's
    placeholder for the rest."""
    named: dict[int, str] = {}
    for key, tok in (cfg.get("added_tokens_decoder") or {}).items():
        tid, text = int(key) if str(key).isdigit() else -1, _content(tok)
        if not (n_base <= tid < n_base + fam.reserved) or not isinstance(text, str) or not text:
            raise EaglewireError(f"{where}: added_tokens_decoder[{str(key)[:20]!r}]: expected a token text at an id in "
                                 f"[{n_base}, {n_base + fam.reserved}) (the {fam.reserved} ids after "
                                 f"{fam.vocab_file}'s {n_base} ranks)")
        named[tid] = text
    names = [named.get(i, f"<|reserved_token_{i}|>") for i in range(n_base, n_base + fam.reserved)]
    if len(set(names)) != len(names):
        raise EaglewireError(f"{where}: added_tokens_decoder names one token at two ids")
    return names


def build(ranks: dict[bytes, int], fam: TiktokenFamily, specials: list[str], cfg: dict, chat_template,
          where: Path | str = "tokenizer_config.json"):
    """transformers' own fast tokenizer for the family's encoding (converter: module doc); `cfg`'s token roles
    must name special tokens (`where`: the file they come from)."""
    from transformers import PreTrainedTokenizerFast  # lazy: seconds; codecheck needs none
    from transformers.convert_slow_tokenizer import TikTokenConverter  # lazy: as above

    class _Ranks(TikTokenConverter):
        def load_tiktoken_bpe(self, _path):  # the ranks already parsed (read_ranks), never a path or URL
            return ranks

    tok = _Ranks(pattern=fam.pattern, extra_special_tokens=specials).converted()
    roles = {k: _content(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    for k, v in roles.items():
        if v is not None and v not in specials:
            raise EaglewireError(f"{where}: field {k} = {str(v)[:40]!r}: expected one of the special tokens "
                                 "(added_tokens_decoder or a reserved one)")
    out = PreTrainedTokenizerFast(tokenizer_object=tok, **{k: v for k, v in roles.items() if v is not None},
                                  model_max_length=cfg.get("model_max_length", int(1e30)))
    out.chat_template = chat_template
    return out


def _chat_template(d: Path, cfg: dict):
    jinja = Path(d) / "chat_template.jinja"
    return cfg.get("chat_template") or (jinja.read_text() if jinja.is_file() else None)


def load(d: Path):
    """`d`'s tokenizer as a transformers fast tokenizer, when its code is a known family's (else None)."""
    fam = family_of(d)
    if fam is None:
        return None
    cfg = json.loads((Path(d) / "tokenizer_config.json").read_text())
    ranks = read_ranks(Path(d) / fam.vocab_file)
    specials = special_tokens(cfg, len(ranks), fam, Path(d) / "tokenizer_config.json")
    return build(ranks, fam, specials, cfg, _chat_template(d, cfg), Path(d) / "tokenizer_config.json")


def converted_dir(d: Path, cache: Path) -> Path:
    """A directory with `d`'s tokenizer as tokenizer.json (and a tokenizer_config.json naming no code), for a
    reader that cannot run the family's class: cached under `cache` by the inputs' content."""
    fam = family_of(d)
    if fam is None:
        raise EaglewireError(f"{d}: no tokenizer code of a known family to convert ({', '.join(FAMILIES)})")
    h = hashlib.sha256(f"v{CONVERSION_VERSION}".encode())
    for name in (fam.vocab_file, "tokenizer_config.json", "chat_template.jinja"):
        h.update(f"{name}:{file_sha256(Path(d) / name) if (Path(d) / name).is_file() else '-'};".encode())
    out = Path(cache) / "tokenizers" / h.hexdigest()[:16]
    if not (out / "tokenizer.json").is_file():
        tok = load(d)
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_dir(out) as tmp:
            tok.save_pretrained(tmp)
    return out
