"""The families and engines eaglewire covers, as one table the README embeds (a test keeps them equal).

Every cell is computed: the tiny builder's family, the class engines dispatch on,
whether each pinned engine can capture EAGLE-3 features from that class at all
(`support`, read from the engines' own source) and which id rule SGLang applies
to it (`points`). Nothing here is typed by hand, so the README cannot drift.
"""

from __future__ import annotations

from eaglewire.targets.points import Engine
from eaglewire.targets.registry import pinned_version
from eaglewire.targets.support import capture_support
from eaglewire.targets.tiny import ARCHS
from eaglewire.targets.tiny_families import SERVED_AS

_BASE = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
         "deepseek_v3": "DeepseekV3ForCausalLM"}
_RULES = {"sglang": "+1 (id i = output of layer i)", "sglang-first-id": "+1 only when the first id is 1",
          "sglang-last-id-end": "+1, or as written when the largest id is L"}


def rows() -> list[dict]:
    """One row per tiny family: `tiny:<name>`, the served class and each engine's answer."""
    out = []
    for arch in ARCHS:
        served = SERVED_AS.get(arch) or _BASE[arch]
        out.append({"target": f"tiny:{arch}", "served_as": served,
                    "sglang": capture_support("sglang", None, served),
                    "sglang_ids": _RULES.get(Engine("sglang", pinned_version("sglang"), served).rule, "?"),
                    "vllm": capture_support("vllm", None, served)})
    return out


def markdown() -> str:
    head = (f"| target | served as | SGLang {pinned_version('sglang')} EAGLE-3 | SGLang ids | "
            f"vLLM {pinned_version('vllm')} EAGLE-3 |\n"
            "|---|---|---|---|---|\n")
    return head + "".join(f"| `{r['target']}` | `{r['served_as']}` | {r['sglang']} | {r['sglang_ids']} | {r['vllm']} |\n"
                          for r in rows())
