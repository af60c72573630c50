"""vLLM's per-model-file capture rules: pipeline stages, and targets served by its Transformers backend.

Why: `points.py`'s vLLM rule (id i = input of layer i) is what every vLLM 0.32.0 capture loop does on one
stage. Split over pipeline stages they differ: a few decoders relay the first stages' captures to the last
one (`supports_aux_hidden_states_over_pp`, vllm/model_executor/models/interfaces.py EagleModelMixin), the
others feed the drafter only what the LAST stage captured, each numbering its ids its own way. vLLM's V2
model runner (the default with Triton) refuses those outright (vllm/v1/worker/gpu/spec_decode/eagle/
eagle3_utils.py `verify_supports_aux_hidden_states_over_pp`); the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0,
and the CPU build) serves them as encoded here. A 1T target (DeepSeek-V3, Kimi-K2.5) on two 8-GPU nodes
is served with PP 2: its drafter trained on [2, 30, 58] is then fed one slot.

The layers are split as vllm/distributed/utils.py `get_pp_indices` does (VLLM_PP_LAYER_PARTITION honoured).
The rules were executed from the pinned wheel's own model files (vllm/model_executor/models/<file>.py and
vllm/models/deepseek_v32/nvidia/model.py) in tests/export/test_vllm_model_files.py, which fails when this
table and the wheel disagree. The Transformers backend (vllm/model_executor/models/transformers/base.py
`set_aux_hidden_state_layers`) records the OUTPUT of `_layer_names[id - 1]`, a dict keyed 0..L-1: ids
1..L read as elsewhere, id 0 dies at startup (KeyError: -1), and the slots come in the order written.

Ids here are vLLM indices (0 = embedding, v = output of layer v-1); `points.py` names them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.registry import PUBLISHED_ARCH, pinned_version

M = "vllm/model_executor/models/"
# The decoder class whose forward holds the capture loop -> how its last stage numbers the ids.
DECODER_RULES = {
    **{M + f: "relayed" for f in ("llama.py:LlamaModel", "qwen2.py:Qwen2Model", "sarvam.py:SarvamMLAModel")},
    "vllm/models/minimax_m3/nvidia/model.py:MiniMaxM3Model": "relayed",
    **{M + f: "absolute" for f in ("cohere2_moe.py:Cohere2MoeModel", "deepseek_v2.py:DeepseekV2Model",
                                   "gpt_oss.py:GptOssModel", "k2_horizon.py:K2HorizonModel", "laguna.py:LagunaModel",
                                   "muse_glimmer.py:MuseGlimmerModel", "qwen3_moe.py:Qwen3MoeModel",
                                   "qwen3_omni_moe_thinker.py:Qwen3MoeLLMModel", "qwen3_vl_moe.py:Qwen3MoeLLMModel")},
    **{M + f: "stage_local" for f in ("afmoe.py:AfmoeModel", "apertus.py:ApertusModel", "gemma4.py:Gemma4Model",
                                      "granite.py:GraniteModel", "minicpm.py:MiniCPMModel", "minimax_m2.py:MiniMaxM2Model",
                                      "nemotron_h.py:NemotronHModel", "step1.py:StepDecoderModel")},
    M + "mimo_v2.py:MiMoV2Model": "mixed",
    **{M + f: "after_start_and_zero" for f in ("qwen3_vl.py:Qwen3LLMModel", "qwen3_next.py:Qwen3NextModel",
                                               "interns2_mobius.py:InternS2MobiusModel")},
    "vllm/models/deepseek_v32/nvidia/model.py:DeepseekV32Model": "absolute_no_last",
}
# What each rule feeds from the last stage, layers {s}..L-1 of L.
RULE_HELP = {
    "relayed": "the earlier stages' captures are relayed: every id keeps its one-stage meaning",
    "absolute": "only ids {s}..{L} (inside the last stage) are captured, as on one stage; the others feed nothing",
    "absolute_no_last": "only ids {s}..{L1} are captured, as on one stage; the others (and {L}) feed nothing",
    "stage_local": "ids count inside the last stage: id i = input of layer {s}+i; ids above {n} feed nothing",
    "mixed": "id {s} captures the last stage's input and ids 1..{n} the input of layer {s}+i: both at once",
    "after_start_and_zero": "id 0 = the last stage's input (layer {s}), ids {s1}..{L} as on one stage, the rest nothing",
}
# Serving class (HF architecture) -> the decoder that runs its capture loop, read from each model file
# (its `self.model` / `language_model`, or the architecture it registers: kimi_k25.py builds
# DeepseekV2ForCausalLM). A class not listed is not encoded under PP and is refused, never guessed.
SERVED_BY = {
    **dict.fromkeys(("LlamaForCausalLM", "LLaMAForCausalLM", "IQuestCoderForCausalLM", "InternLM3ForCausalLM",
                     "TeleChat2ForCausalLM", "TeleChat3ForCausalLM", "MistralForCausalLM", "Ministral3ForCausalLM",
                     "Phi3ForCausalLM", "Llama4ForCausalLM", "Llama4ForConditionalGeneration"), M + "llama.py:LlamaModel"),
    **dict.fromkeys(("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2_5_VLForConditionalGeneration",
                     "Qwen3ASRForConditionalGeneration", "Qwen3ASRRealtimeGeneration", "OpenCUAForConditionalGeneration",
                     "Exaone4_5_ForConditionalGeneration"), M + "qwen2.py:Qwen2Model"),
    "SarvamMLAForCausalLM": M + "sarvam.py:SarvamMLAModel",
    **dict.fromkeys(("MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"),
                    "vllm/models/minimax_m3/nvidia/model.py:MiniMaxM3Model"),
    **dict.fromkeys(("DeepseekForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                     "KimiK25ForConditionalGeneration", "MistralLarge3ForCausalLM"), M + "deepseek_v2.py:DeepseekV2Model"),
    **dict.fromkeys(("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"), "vllm/models/deepseek_v32/nvidia/model.py:DeepseekV32Model"),
    "Cohere2MoeForCausalLM": M + "cohere2_moe.py:Cohere2MoeModel",
    "GptOssForCausalLM": M + "gpt_oss.py:GptOssModel",
    "K2HorizonForCausalLM": M + "k2_horizon.py:K2HorizonModel",
    "LagunaForCausalLM": M + "laguna.py:LagunaModel",
    **dict.fromkeys(("MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration"),
                    M + "muse_glimmer.py:MuseGlimmerModel"),
    "Qwen3MoeForCausalLM": M + "qwen3_moe.py:Qwen3MoeModel",
    "Qwen3OmniMoeForConditionalGeneration": M + "qwen3_omni_moe_thinker.py:Qwen3MoeLLMModel",
    "Qwen3VLMoeForConditionalGeneration": M + "qwen3_vl_moe.py:Qwen3MoeLLMModel",
    "AfmoeForCausalLM": M + "afmoe.py:AfmoeModel",
    "ApertusForCausalLM": M + "apertus.py:ApertusModel",
    **dict.fromkeys(("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration"),
                    M + "gemma4.py:Gemma4Model"),
    **dict.fromkeys(("GraniteForCausalLM", "GraniteSWAForCausalLM"), M + "granite.py:GraniteModel"),
    **dict.fromkeys(("MiniCPMForCausalLM", "MiniCPM3ForCausalLM"), M + "minicpm.py:MiniCPMModel"),
    "MiniMaxM2ForCausalLM": M + "minimax_m2.py:MiniMaxM2Model",
    **dict.fromkeys(("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"), M + "nemotron_h.py:NemotronHModel"),
    "Step1ForCausalLM": M + "step1.py:StepDecoderModel",
    **dict.fromkeys(("MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "MiMoV2OmniForCausalLM"), M + "mimo_v2.py:MiMoV2Model"),
    "Qwen3VLForConditionalGeneration": M + "qwen3_vl.py:Qwen3LLMModel",
    **dict.fromkeys(("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                     "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                     "InternS2PreviewForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
                     "MiniCPMV4_7ForConditionalGeneration"), M + "qwen3_next.py:Qwen3NextModel"),
    "InternS2MobiusForConditionalGeneration": M + "interns2_mobius.py:InternS2MobiusModel",
}
# Registered targets without a model file of their own, served by the Transformers backend.
TRANSFORMERS_BACKEND_ARCHS = frozenset({
    "ArceeForCausalLM", "CwmForCausalLM", "Emu3ForConditionalGeneration", "FlexOlmoForCausalLM",
    "GPTBigCodeForCausalLM", "GPTNeoXForCausalLM", "GlmForCausalLM", "HunYuanDenseV1ForCausalLM",
    "HunYuanMoEV1ForCausalLM", "HunYuanVLForConditionalGeneration", "Jais2ForCausalLM", "MellumForCausalLM",
    "NanbeigeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoForCausalLM", "PhiForCausalLM",
    "SeedOssForCausalLM", "SmolLM3ForCausalLM", "Starcoder2ForCausalLM", "VaultGemmaForCausalLM",
    "VibeVoiceAsrForConditionalGeneration",
})


@dataclass(frozen=True)
class Stages:
    """vLLM's pipeline stages: (start, end) decoder layers of each, as its `get_pp_indices` splits them."""

    bounds: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return len(self.bounds)

    @property
    def last_start(self) -> int:
        return self.bounds[-1][0]

    def label(self) -> str:
        return f"PP {self.size} (layers " + ", ".join(f"{a}-{b - 1}" for a, b in self.bounds) + ")"


def pp_stages(num_layers: int, pp: int, partition: str | None = None) -> Stages:
    """The split `get_pp_indices` makes: even, the remainder on the stages before the last; or the
    VLLM_PP_LAYER_PARTITION sizes given (`partition`, e.g. "31,30")."""
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise EaglewireError(f"--pipeline-parallel-size {pp!r}: expected a stage count of 1 or more")
    if partition:
        try:
            sizes = [int(x) for x in partition.split(",")]
        except ValueError:
            raise EaglewireError(f"VLLM_PP_LAYER_PARTITION={partition!r}: expected comma-separated layer counts") from None
        if len(sizes) != pp or sum(sizes) != num_layers or min(sizes) < 1:
            raise EaglewireError(f"VLLM_PP_LAYER_PARTITION={partition!r}: expected {pp} positive layer counts summing "
                                 f"to the target's {num_layers} layers (vLLM refuses it at startup)")
    else:
        if pp > num_layers:
            raise EaglewireError(f"--pipeline-parallel-size {pp}: the target has only {num_layers} layers to split")
        sizes = [num_layers // pp] * pp
        for i in range(2, num_layers % pp + 2):
            sizes[-i] += 1
    starts = [sum(sizes[:r]) for r in range(pp)]
    return Stages(tuple((a, a + n) for a, n in zip(starts, sizes)))


# `--pipeline-parallel-size`'s help, for every command that takes it
PP_HELP = ("vLLM pipeline-parallel size the target is served with (the layers split as vLLM splits them, "
           "VLLM_PP_LAYER_PARTITION honoured): some model files then feed other points for the same ids")


def pp_option(num_layers: int, pp: int, engine: str = "vllm") -> Stages | None:
    """`--pipeline-parallel-size` as given to a command: the stages (None: one), split as the server will
    split them, which reads VLLM_PP_LAYER_PARTITION from the same environment."""
    if pp == 1:
        return None
    if engine != "vllm":
        raise EaglewireError(f"--pipeline-parallel-size {pp}: only vLLM's capture over pipeline stages is encoded, "
                             f"not {engine}'s; serve it on one stage or check it as vllm")
    return pp_stages(num_layers, pp, os.environ.get("VLLM_PP_LAYER_PARTITION"))


def _decoder(arch: str | None) -> str:
    rule = SERVED_BY.get(arch or "")
    if rule is None:
        ver = pinned_version("vllm")
        how = ("pass the target's class (config.json architectures[0]) with --arch" if not arch or "For" not in arch
               else "serve it on one stage")
        raise EaglewireError(f"vLLM {ver} under pipeline parallelism: which capture loop serves "
                             f"{arch or 'this target'} is not encoded (each model file numbers ids its own way): {how}")
    return rule


def _capture(rule: str, i: int, s: int, L: int) -> tuple[int, ...]:
    """The vLLM indices id `i` captures in the last stage [s, L) under `rule` (tests/export executes each)."""
    if rule == "absolute":
        return (i,) if s <= i <= L else ()
    if rule == "absolute_no_last":
        return (i,) if s <= i < L else ()
    if rule == "stage_local":
        return (s + i,) if 0 <= i and s + i <= L else ()
    if rule == "mixed":
        return (s,) * (i == s) + (s + i,) * (1 <= i <= L - s)
    if rule == "after_start_and_zero":
        return (s,) if i == 0 else (i,) if s < i <= L else ()
    return (i,) if 0 <= i <= L else ()  # relayed


def captures(ids: list[int], arch: str | None, L: int, stages: Stages | None) -> list[tuple[int, ...]] | None:
    """Per id, the vLLM indices the served class feeds (empty: nothing); None: points.py's one-stage rule."""
    multi, arch = stages is not None and stages.size > 1, PUBLISHED_ARCH.get(arch, arch)
    if arch in TRANSFORMERS_BACKEND_ARCHS:
        if multi:
            raise EaglewireError(f"vLLM {pinned_version('vllm')}'s Transformers backend ({arch}) under pipeline "
                                 "parallelism: its capture was not executed here; serve it on one stage")
        return [(i,) if 1 <= i <= L else () for i in ids]
    if not multi:
        return None
    rule = DECODER_RULES[_decoder(arch)]
    return [_capture(rule, i, stages.last_start, L) for i in ids]


def fed(ids: list[int], arch: str | None, L: int, stages: Stages | None) -> tuple[list[int], int] | None:
    """(the vLLM indices fed, in slot order; how many ids feed nothing); None: points.py's one-stage rule.

    The Transformers backend keeps the written order (one recorder per distinct id); the loops walk the
    layers and feed ascending, deduplicated slots."""
    arch = PUBLISHED_ARCH.get(arch, arch)
    distinct = list(dict.fromkeys(ids)) if arch in TRANSFORMERS_BACKEND_ARCHS else ids
    per_id = captures(distinct, arch, L, stages)
    if per_id is None:
        return None
    lost = sum(not c for c in per_id)
    if arch in TRANSFORMERS_BACKEND_ARCHS:
        return [c[0] for c in per_id if c], lost
    return sorted({v for c in per_id for v in c}), lost


def ids_for(indices: list[int | None], arch: str | None, L: int, stages: Stages | None) -> list[int | None] | None:
    """Per vLLM index wanted, the id that feeds exactly it and nothing else (None: none does); None: the
    one-stage rule applies. Found by search over the forward rule, so it cannot drift from it."""
    if captures([], arch, L, stages) is None:
        return None
    out: list[int | None] = []
    for v in indices:
        cands = [] if v is None else [v, *range(L + 1)]
        out.append(next((i for i in cands if captures([i], arch, L, stages) == [(v,)]), None))
    return out


def v2_refusal(arch: str | None, stages: Stages | None) -> str | None:
    """The line vLLM's default (V2) model runner stops with for this class over these stages, if any."""
    arch = PUBLISHED_ARCH.get(arch, arch)
    if stages is None or stages.size < 2 or arch in TRANSFORMERS_BACKEND_ARCHS:
        return None
    if DECODER_RULES[_decoder(arch)] == "relayed":
        return None
    return f"{arch} does not support eagle3 with pipeline parallelism"


def describe(arch: str | None, stages: Stages) -> str:
    """One line: how vLLM reads ids for this class over these stages; refuses a class not encoded."""
    captures([], arch, stages.bounds[-1][1], stages)
    arch = PUBLISHED_ARCH.get(arch, arch)
    key = _decoder(arch)
    rule = DECODER_RULES[key]
    line = (f"vLLM {pinned_version('vllm')} over {stages.label()}: {arch} captures in {key.rsplit('/', 1)[-1]}, "
            f"where " + RULE_HELP[rule].format(s=(s := stages.last_start), s1=s + 1, L=(L := stages.bounds[-1][1]),
                                               L1=L - 1, n=L - s))
    refusal = v2_refusal(arch, stages)
    return line + (f"; its default V2 model runner refuses: \"{refusal}\" (VLLM_USE_V2_MODEL_RUNNER=0 serves it "
                   "as said)" if refusal else "")
