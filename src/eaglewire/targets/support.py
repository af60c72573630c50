"""Which target classes each engine can capture EAGLE-3 features from at all, at the pinned versions.

Why: the id rules (`points.py`) say which layer an id names, but an engine first has to
agree to capture. vLLM 0.32.0 stops at startup when the target class lacks its
`SupportsEagle3` interface (v1/worker/gpu_model_runner.py:
`raise RuntimeError("Model does not support EAGLE3 interface but "
"aux_hidden_state_outputs was requested")`; the CPU runner takes that path too), so
`doctor config` must not say OK for, e.g., GLM-4-MoE or Gemma-3 on vLLM. SGLang captures
only through a class's `set_eagle3_layers_to_capture`.

The sets are facts read from the pinned wheels' source (registered architectures,
interfaces through every base class); tests/export/test_vllm_model_files.py derives them
again from the wheels and fails when a pinned version changes them.
"""

from __future__ import annotations

from eaglewire.targets.registry import PUBLISHED_ARCH, engine_spec, pinned_version

# vLLM's runner, verbatim (two literals joined), when the target class lacks SupportsEagle3.
VLLM_REFUSAL = "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"

# vLLM 0.32.0, generation targets (registry.py: _TEXT_GENERATION_MODELS, _MULTIMODAL_MODELS,
# _TRANSFORMERS_SUPPORTED_MODELS, as _VLLM_MODELS merges them), with imports resolved as on CUDA.
# On CPU, DeepseekV4ForConditionalGeneration is a stub class without the interface.
VLLM_EAGLE3_ARCHS = frozenset({
    "AfmoeForCausalLM", "ApertusForCausalLM", "ArceeForCausalLM", "Cohere2MoeForCausalLM",
    "CohereCompassForConditionalGeneration", "Cosmos3ForConditionalGeneration", "CwmForCausalLM",
    "DeepseekForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM",
    "DeepseekV41ForCausalLM", "DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration",
    "Emu3ForConditionalGeneration", "Ernie4_5ForCausalLM", "Exaone4_5_ForConditionalGeneration",
    "FlexOlmoForCausalLM", "GPTBigCodeForCausalLM", "GPTNeoXForCausalLM", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration", "Glm5NextForCausalLM",
    "Glm5NextForConditionalGeneration", "GlmForCausalLM", "GlmMoeDsaForCausalLM", "GptOssForCausalLM",
    "GraniteForCausalLM", "GraniteSWAForCausalLM", "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM",
    "HunYuanVLForConditionalGeneration", "IQuestCoderForCausalLM", "InternLM3ForCausalLM",
    "InternS1ProForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "Jais2ForCausalLM", "K2HorizonForCausalLM",
    "KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration", "KimiLinearForCausalLM",
    "LLaMAForCausalLM", "LagunaForCausalLM", "LightOnOCRForConditionalGeneration", "Llama4ForCausalLM",
    "Llama4ForConditionalGeneration", "LlamaForCausalLM", "LlavaForConditionalGeneration", "MellumForCausalLM",
    "MiMoForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "MiMoV2OmniForCausalLM",
    "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniCPMV4_6ForConditionalGeneration",
    "MiniCPMV4_7ForConditionalGeneration", "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration", "Ministral3ForCausalLM", "Mistral3ForConditionalGeneration",
    "MistralForCausalLM", "MistralLarge3ForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "NanbeigeForCausalLM", "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM", "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2",
    "NemotronH_Omni_Reasoning_V3", "NemotronH_Super_Omni_Reasoning_V3", "Olmo2ForCausalLM", "Olmo3ForCausalLM",
    "OlmoForCausalLM", "OpenCUAForConditionalGeneration", "Phi3ForCausalLM", "PhiForCausalLM",
    "PixtralForConditionalGeneration", "Plamo3ForCausalLM", "Qwen2ForCausalLM",
    "Qwen2_5_VLForConditionalGeneration", "Qwen3ASRForConditionalGeneration", "Qwen3ASRRealtimeGeneration",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3OmniMoeForConditionalGeneration",
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration", "SarvamMLAForCausalLM", "SeedOssForCausalLM", "SmolLM3ForCausalLM",
    "Starcoder2ForCausalLM", "Step1ForCausalLM", "TeleChat2ForCausalLM", "TeleChat3ForCausalLM",
    "TeleFLMForCausalLM", "VaultGemmaForCausalLM", "VibeVoiceAsrForConditionalGeneration"
})
# ... and the registered generation targets whose class lacks SupportsEagle3: refused at startup.
VLLM_NO_EAGLE3_ARCHS = frozenset({
    "AXK1ForCausalLM", "AriaForConditionalGeneration", "AudioFlamingo3ForConditionalGeneration",
    "BagelForConditionalGeneration", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration",
    "BeeForConditionalGeneration", "Blip2ForConditionalGeneration", "BloomForCausalLM",
    "ChatGLMForConditionalGeneration", "ChatGLMModel", "Cohere2ForCausalLM",
    "Cohere2VisionForConditionalGeneration", "CohereAsrForConditionalGeneration", "CohereForCausalLM",
    "Cosmos3EdgeForConditionalGeneration", "DbrxForCausalLM", "DeciLMForCausalLM", "DeepseekOCR2ForCausalLM",
    "DeepseekOCRForCausalLM", "DeepseekVLV2ForCausalLM", "DiffusionGemmaForBlockDiffusion", "Dots3NoteForCausalLM",
    "DotsOCRForCausalLM", "Eagle2_5_VLForConditionalGeneration", "Ernie4_5_MoeForCausalLM",
    "Ernie4_5_VLMoeForConditionalGeneration", "Exaone4ForCausalLM", "ExaoneForCausalLM", "ExaoneMoEForCausalLM",
    "ExaoneMoeForCausalLM", "FalconForCausalLM", "FalconH1ForCausalLM", "FalconMambaForCausalLM",
    "FireRedASR2ForConditionalGeneration", "FunASRForConditionalGeneration", "FunAudioChatForConditionalGeneration",
    "GLM4VForCausalLM", "GPT2LMHeadModel", "GPTJForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration", "Gemma3nForCausalLM", "Gemma3nForConditionalGeneration", "GemmaForCausalLM",
    "Glm4ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration", "GlmAsrForConditionalGeneration", "GlmOcrForConditionalGeneration",
    "Granite4VisionForConditionalGeneration", "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM",
    "GraniteMoeSWAForCausalLM", "GraniteMoeSharedForCausalLM", "GraniteSpeechForConditionalGeneration",
    "GraniteSpeechPlusForConditionalGeneration", "H2OVLChatModel", "HCXVisionV2ForCausalLM", "HYV3ForCausalLM",
    "HYV4ForCausalLM", "HfMoondream", "HrmTextForCausalLM", "HyperCLOVAXForCausalLM", "IQuestLoopCoderForCausalLM",
    "Idefics3ForConditionalGeneration", "InklingForCausalLM", "InklingForConditionalGeneration",
    "InternLM2ForCausalLM", "InternS1ForConditionalGeneration", "InternVLChatModel",
    "InternVLForConditionalGeneration", "IsaacForConditionalGeneration", "JambaForCausalLM",
    "KananaVForConditionalGeneration", "KeyeForConditionalGeneration", "KeyeVL1_5ForConditionalGeneration",
    "KimiVLForConditionalGeneration", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration",
    "Llama_Nemotron_Nano_VL", "LlavaNextForConditionalGeneration", "LlavaNextVideoForConditionalGeneration",
    "LlavaOnevision2ForConditionalGeneration", "LlavaOnevisionForConditionalGeneration", "LongcatFlashForCausalLM",
    "LongcatFlashNgramForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM", "MiDashengLMModel", "MiniCPMO",
    "MiniCPMV", "MixtralForCausalLM", "Molmo2ForConditionalGeneration", "MolmoForCausalLM", "Moondream3ForCausalLM",
    "MoonshotKimiaForCausalLM", "MossAudioModel", "MossTranscribeDiarizeForConditionalGeneration", "NVLM_D",
    "NemotronForCausalLM", "NemotronParseForConditionalGeneration", "OPTForCausalLM", "OlmoHybridForCausalLM",
    "OlmoeForCausalLM", "OpenPanguVLForConditionalGeneration", "OpenVLAForActionPrediction", "OrionForCausalLM",
    "Ovis", "Ovis2_5", "Ovis2_6ForCausalLM", "Ovis2_6_MoeForCausalLM", "PaddleOCRVLForConditionalGeneration",
    "PaliGemmaForConditionalGeneration", "PanguEmbeddedForCausalLM", "PanguProMoEV2ForCausalLM",
    "PanguUltraMoEForCausalLM", "Param2MoEForCausalLM", "Phi3VForCausalLM", "Phi4ForCausalLMV", "Phi4MMForCausalLM",
    "PhiMoEForCausalLM", "QianfanOCRForConditionalGeneration", "Qwen2AudioForConditionalGeneration",
    "Qwen2MoeForCausalLM", "Qwen2VLForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration",
    "Qwen2_5OmniModel", "Qwen4ExpForCausalLM", "RForConditionalGeneration", "Rnj1ForCausalLM",
    "SarvamMoEForCausalLM", "SkyworkR1VChatModel", "SmolVLMForConditionalGeneration", "SolarForCausalLM",
    "StableLmForCausalLM", "Step3TextForCausalLM", "Step3VLForConditionalGeneration", "Step3p5ForCausalLM",
    "Step3p7ForConditionalGeneration", "StepVLForConditionalGeneration", "UltravoxModel", "UnlimitedOCRForCausalLM",
    "VoxtralForConditionalGeneration", "VoxtralRealtimeGeneration", "WhisperForConditionalGeneration",
    "Zamba2ForCausalLM"
})

# SGLang 0.5.23: registered classes (a model file's EntryClass) whose own code, or a base's, or a
# wrapped model's, defines set_eagle3_layers_to_capture (MindSporeForCausalLM hands the ids to
# sgl_mindspore, outside SGLang) ...
SGLANG_EAGLE3_ARCHS = frozenset({
    "ApertusForCausalLM", "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "Cosmos3ForConditionalGeneration", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN", "EmbeddingGemmaModel", "ExaoneMoEForCausalLM", "ExaoneMoEForCausalLMMTP",
    "ExaoneMoeForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Gemma4AssistantForCausalLM",
    "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma4UnifiedAssistantForCausalLM",
    "Gemma4UnifiedForConditionalGeneration", "Glm4MoeForCausalLM", "Glm4MoeForCausalLMNextN",
    "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN", "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
    "GptOssForCausalLM", "IQuestCoderForCausalLM", "InternLM3ForCausalLM", "InternS1ProForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "KimiK25ForConditionalGeneration", "Llama4ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM",
    "LlamaForCausalLMEagle", "LlamaForCausalLMEagle3", "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN",
    "MellumForCausalLM", "MindSporeForCausalLM", "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration", "Ministral3ForCausalLM", "MistralForCausalLM",
    "MistralForCausalLMEagle", "MistralLarge3ForCausalLM", "MistralLarge3ForCausalLMEagle", "Phi3ForCausalLM",
    "Qwen2ForCausalLM", "Qwen2ForCausalLMEagle", "Qwen2MoeForCausalLM", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLMMTP", "Qwen3NextForCausalLM",
    "Qwen3NextForCausalLMMTP", "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration", "SarvamMoEForCausalLM",
    "TeleFLMForCausalLM"
})
# ... and the registered classes that do not: SGLang never captures features from them.
SGLANG_NO_EAGLE3_ARCHS = frozenset({
    "AfmoeForCausalLM", "ArceeForCausalLM", "BaichuanForCausalLM", "BailingMM2NativeForConditionalGeneration",
    "BailingMMNativeForConditionalGeneration", "BailingMoeForCausalLMNextN", "BailingMoeV2_5ForCausalLM",
    "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration", "BeamForCausalLM",
    "BertForSequenceClassification", "BertModel", "CLIPModel", "ChatGLMModel", "Cohere2ForCausalLM",
    "Cohere2MoeForCausalLM", "Cohere2VisionForConditionalGeneration", "CohereForCausalLM", "Contriever",
    "Cosmos3EdgeForConditionalGeneration", "DFlash2BeamDraftModel", "DFlash2DraftModel", "DFlashDraftModel",
    "DFlashLagunaForCausalLM", "DSparkDraftModel", "DSparkMiniMaxDraftModel", "DbrxForCausalLM",
    "DeciLMForCausalLM", "DeepseekForCausalLM", "DeepseekOCRForCausalLM", "DeepseekV4ForCausalLM",
    "DeepseekV4ForCausalLMDSpark", "DeepseekV4ForCausalLMNextN", "DeepseekVL2ForCausalLM",
    "DiffusionGemmaForBlockDiffusion", "Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN", "DotsOCRForCausalLM",
    "DotsVLMForCausalLM", "Eagle3DeepseekV2ForCausalLM", "EmbeddingGemma2Model", "Ernie4_5_ForCausalLM",
    "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeForCausalLMMTP", "Ernie4_5_VLMoeForConditionalGeneration",
    "Exaone4ForCausalLM", "ExaoneForCausalLM", "FalconH1ForCausalLM", "FalconMambaForCausalLM", "GPT2LMHeadModel",
    "GPTBigCodeForCausalLM", "GPTJForCausalLM", "Gemma2ForCausalLM", "Gemma2ForSequenceClassification",
    "Gemma3nForCausalLM", "Gemma3nForConditionalGeneration", "GemmaForCausalLM", "GigaChat35ForCausalLM",
    "GigaChat35ForCausalLMNextN", "Glm4ForCausalLM", "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration", "GlmAsrForConditionalGeneration", "GlmImageForConditionalGeneration",
    "GlmOcrForConditionalGeneration", "GlmOcrForConditionalGenerationNextN", "GraniteForCausalLM",
    "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM", "GraniteMoeSWAForCausalLM",
    "GraniteMoeSharedForCausalLM", "GraniteSWAForCausalLM", "Grok1ForCausalLM", "Grok1ModelForCausalLM",
    "HYV3ForCausalLM", "HYV3ForCausalLMNextN", "HYV4ForCausalLM", "HYV4ForCausalLMNextN", "HrmTextForCausalLM",
    "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM", "IQuestLoopCoderForCausalLM", "IQuestQ1ForCausalLM",
    "IQuestQ1MTP", "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP", "InternLM2ForCausalLM",
    "InternLM2ForRewardModel", "InternS1ForConditionalGeneration", "InternVLChatModel", "JetNemotronForCausalLM",
    "JetVLMForConditionalGeneration", "K2HorizonForCausalLM", "KimiK3ForConditionalGeneration",
    "KimiK3LinearForCausalLM", "KimiLinearForCausalLM", "KimiVLForConditionalGeneration", "LLaDA2MoeModelLM",
    "LagunaForCausalLM", "Lfm2BidirectionalModel", "Lfm2DSparkDraftModel", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
    "Lfm2VlForConditionalGeneration", "LiLiCorrDraftModel", "LightOnOCRForConditionalGeneration", "LingDSparkModel",
    "LlamaEmbeddingModel", "LlamaForClassification", "LlamaForSequenceClassification",
    "LlamaForSequenceClassificationWithNormal_Weights", "LlavaForConditionalGeneration", "LlavaLlamaForCausalLM",
    "LlavaMistralForCausalLM", "LlavaQwenForCausalLM", "LlavaVidForCausalLM",
    "LocateAnythingForConditionalGeneration", "Mamba2ForCausalLM", "MambaForCausalLM", "MiDashengLMModel",
    "MiMoForCausalLM", "MiMoMTP", "MiMoV2ASRForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM",
    "MiMoV2MTP", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniCPMO", "MiniCPMSALAForCausalLM", "MiniCPMV",
    "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration", "MiniMaxDFlash2DraftModel",
    "Mistral3ForConditionalGeneration", "MistralModel", "MixtralForCausalLM", "MllamaForConditionalGeneration",
    "MossVLForConditionalGeneration", "MultiModalityCausalLM", "MuseGlimmerAssistantModel",
    "MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
    "NVILAForConditionalGeneration", "NVILALiteForConditionalGeneration", "NanbeigeForCausalLM",
    "NanbeigeForSequenceClassification", "NemotronHForCausalLM", "NemotronHForCausalLMMTP",
    "NemotronHPuzzleForCausalLM", "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2",
    "NemotronH_Omni_Reasoning_V3", "OPTForCausalLM", "Olmo2ForCausalLM", "OlmoForCausalLM", "OlmoeForCausalLM",
    "OrionForCausalLM", "POINTSV15ChatModel", "PaddleOCRVLForConditionalGeneration", "PersimmonForCausalLM",
    "Phi3SmallForCausalLM", "Phi4MMForCausalLM", "PhiForCausalLM", "PhiMoEForCausalLM",
    "PixtralForConditionalGeneration", "PixtralVisionModel", "QWenLMHeadModel", "QuantMixtralForCausalLM",
    "Qwen2AudioForConditionalGeneration", "Qwen2ForRewardModel", "Qwen2ForSequenceClassification",
    "Qwen2VLForConditionalGeneration", "Qwen3ASRForConditionalGeneration", "Qwen3DSparkModel",
    "Qwen3ForRewardModel", "Qwen3ForSequenceClassification", "Qwen3Model", "Qwen3OmniMoeForConditionalGeneration",
    "Qwen3_5ForCausalLMMTP", "Qwen4ExpForCausalLMMTP", "SDARForCausalLM", "SDARMoeForCausalLM",
    "Sarashina2VisionForCausalLM", "SarvamMLAForCausalLM", "SolarForCausalLM", "Spark2_5ForCausalLM",
    "StableLmForCausalLM", "Starcoder2ForCausalLM", "Step3VLForConditionalGeneration", "Step3p5ForCausalLM",
    "Step3p5MTP", "Step3p7ForConditionalGeneration", "StepVLForConditionalGeneration",
    "TorchNativeLlamaForCausalLM", "TorchNativePhi3ForCausalLM", "TransformersEmbeddingModel",
    "TransformersForCausalLM", "TransformersForSequenceClassification", "TransformersMoEEmbeddingModel",
    "TransformersMoEForCausalLM", "TransformersMoEForSequenceClassification",
    "TransformersMultiModalEmbeddingModel", "TransformersMultiModalForCausalLM",
    "TransformersMultiModalForSequenceClassification", "TransformersMultiModalMoEEmbeddingModel",
    "TransformersMultiModalMoEForCausalLM", "TransformersMultiModalMoEForSequenceClassification",
    "UnlimitedOCRForCausalLM", "VoxtralForConditionalGeneration", "WhisperForConditionalGeneration",
    "XLMRobertaForSequenceClassification", "XLMRobertaModel", "XllmForCausalLM", "XverseForCausalLM",
    "XverseMoeForCausalLM", "YiVLForCausalLM", "ZayaForCausalLM"
})

# SGLang 0.5.23's DFLASH captures only through the target class's own `set_dflash_layers_to_capture`
# (model_runner_components/attention_backend_setup.py, configure_aux_hidden_state_capture; a class with only
# `set_dspark_layers_to_capture` serves DSPARK, not DFLASH): the registered classes whose code, or a base's,
# defines it. Every other registered class is refused at startup with SGLANG_DFLASH_REFUSAL.
SGLANG_DFLASH_ARCHS = frozenset({
    "BeamForCausalLM", "Cosmos3ForConditionalGeneration", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN", "Gemma4AssistantForCausalLM", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "Gemma4UnifiedAssistantForCausalLM", "Gemma4UnifiedForConditionalGeneration",
    "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN", "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN", "GptOssForCausalLM",
    "IQuestCoderForCausalLM", "InklingForConditionalGeneration", "InternLM3ForCausalLM",
    "InternS1ProForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "KimiK3LinearForCausalLM", "LagunaForCausalLM", "Lfm2BidirectionalModel", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
    "Lfm2VlForConditionalGeneration", "Llama4ForCausalLM", "LlamaForCausalLM", "LlamaForCausalLMEagle",
    "LlamaForCausalLMEagle3", "MellumForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "MiMoV2MTP",
    "MiniMaxM3SparseForConditionalGeneration", "Ministral3ForCausalLM", "MistralForCausalLM",
    "MistralForCausalLMEagle", "MistralLarge3ForCausalLM", "MistralLarge3ForCausalLMEagle", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration", "NanbeigeForCausalLM",
    "NemotronHForCausalLM", "NemotronHForCausalLMMTP", "NemotronHPuzzleForCausalLM",
    "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2", "NemotronH_Omni_Reasoning_V3", "Phi3ForCausalLM",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLMMTP", "Qwen3NextForCausalLM",
    "Qwen3NextForCausalLMMTP", "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration", "TeleFLMForCausalLM"
})
SGLANG_DFLASH_REFUSAL = ("implements neither set_dspark_layers_to_capture nor set_dflash_layers_to_capture, "
                         "one of which is required for DFLASH/DSPARK")

# llama.cpp 0.3.36 (the tree llama-cpp-python 0.3.36 vendors): the graph its converter maps each HF class to
# (conversion/*.py `ModelBase.register`), for the classes of the families eaglewire builds, and whether that
# graph marks the layer inputs its EAGLE-3 reads (`res->t_layer_inp[il]` in src/models/<graph>.cpp; without
# it the first decode aborts in src/llama-graph.cpp with "layer input tensor is null").
LLAMA_CPP_GRAPHS = {
    "LlamaForCausalLM": ("llama", True), "MistralForCausalLM": ("llama", True), "Qwen3ForCausalLM": ("qwen3", True),
    "Qwen3MoeForCausalLM": ("qwen3moe", True), "GptOssForCausalLM": ("openai-moe", True),
    "MiniMaxM2ForCausalLM": ("minimax-m2", True), "Qwen3NextForCausalLM": ("qwen3next", True),
    "Qwen3_5ForConditionalGeneration": ("qwen35", True), "Qwen3_5MoeForConditionalGeneration": ("qwen35moe", True),
    "KimiK25ForConditionalGeneration": ("deepseek2", False), "DeepseekV2ForCausalLM": ("deepseek2", False),
    "DeepseekV3ForCausalLM": ("deepseek2", False), "DeepseekV32ForCausalLM": ("deepseek32", False),
    "Glm4MoeForCausalLM": ("glm4-moe", False), "Llama4ForConditionalGeneration": ("llama4", False),
    "Llama4ForCausalLM": ("llama4", False), "Qwen3VLForConditionalGeneration": ("qwen3vl", False),
    "Qwen3VLMoeForConditionalGeneration": ("qwen3vlmoe", False), "Gemma3ForConditionalGeneration": ("gemma3", False),
    "Gemma3ForCausalLM": ("gemma3", False),
}

# engine -> version -> (can capture, registered but cannot); read at each engine's pinned release
_FACTS = {
    "vllm": {pinned_version("vllm"): (VLLM_EAGLE3_ARCHS, VLLM_NO_EAGLE3_ARCHS)},
    "sglang": {pinned_version("sglang"): (SGLANG_EAGLE3_ARCHS, SGLANG_NO_EAGLE3_ARCHS)},
    "llama.cpp": {pinned_version("llama.cpp"): (frozenset(a for a, (_, ok) in LLAMA_CPP_GRAPHS.items() if ok),
                                                frozenset(a for a, (_, ok) in LLAMA_CPP_GRAPHS.items() if not ok))},
}
_HOW = {
    "vllm": f"vLLM refuses at startup: \"{VLLM_REFUSAL}\"",
    "sglang": "SGLang has no set_eagle3_layers_to_capture for it and never captures its layers",
    "llama.cpp": "its {graph} graph marks no layer inputs (t_layer_inp), and the first decode aborts with "
                 "\"layer input tensor is null\"",
}


def _engine(engine: str) -> str:
    """The engine whose code runs for this name (specforge: SGLang's), as the facts are keyed."""
    spec = engine_spec(engine)
    return spec.runtime if spec and spec.runtime else engine.strip().lower().partition("==")[0].strip()


def capture_support(engine: str, version: str | None, arch: str | None) -> str:
    """"yes", "no" or "unknown": can `engine` at `version` (None: the pinned one) capture from `arch`.

    "unknown" when the version's source was not read, or the class is not registered by it.
    """
    eng = _engine(engine)
    facts = _FACTS.get(eng, {}).get(version or pinned_version(eng))
    if facts is None or not arch:
        return "unknown"
    arch = PUBLISHED_ARCH.get(arch, arch)
    yes, no = facts
    return "yes" if arch in yes else "no" if arch in no else "unknown"


def capture_refusal(engine: str, version: str | None, arch: str | None) -> str | None:
    """One line saying why `engine` cannot capture EAGLE-3 features from `arch`; None when it can or
    when that is not known (see `capture_support`)."""
    if capture_support(engine, version, arch) != "no":
        return None
    eng = _engine(engine)
    ver = version or pinned_version(eng)
    shown = PUBLISHED_ARCH.get(arch, arch)
    how = _HOW[eng].format(graph=LLAMA_CPP_GRAPHS.get(shown, ("?",))[0])
    return f"{eng} {ver} cannot capture EAGLE-3 features from {shown}: {how}"


def dflash_capture_refusal(engine: str, version: str | None, arch: str | None) -> str | None:
    """One line saying why `engine` cannot feed a DFlash drafter from `arch`; None when it can or when that is not
    known. vLLM and llama.cpp capture DFlash's target states through their EAGLE-3 hook (`capture_refusal`);
    SGLang through a separate one that fewer classes define (SGLANG_DFLASH_ARCHS)."""
    eng = _engine(engine)
    if eng != "sglang":
        refusal = capture_refusal(engine, version, arch)
        return refusal and f"{refusal} (its DFlash path captures through the same hook)"
    ver = version or pinned_version(eng)
    shown = PUBLISHED_ARCH.get(arch, arch) if arch else None
    known = SGLANG_EAGLE3_ARCHS | SGLANG_NO_EAGLE3_ARCHS
    if ver != pinned_version(eng) or shown not in known or shown in SGLANG_DFLASH_ARCHS:
        return None
    return (f"sglang {ver} cannot feed a DFlash drafter from {shown}: the class has no set_dflash_layers_to_capture "
            f"and SGLang refuses it at startup (\"Model {shown} {SGLANG_DFLASH_REFUSAL}\")")
