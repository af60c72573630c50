"""A real tiny dataset (regenerated answers, extracted features, draft vocab) for stage tests."""

import json

USER_PROMPTS = [
    "Write a short story about a robot who learns to paint.", "Explain why the sky is blue.",
    "What is 12 plus 30?", "Give me three ideas for a birthday party.", "Translate this sentence into French.",
    "Can you help me plan a trip to the mountains?", "Summarize the following text in one sentence.",
    "Write a Python function that adds two numbers.", "Hello, how are you today?", "Tell me about the sea.",
    "Why do fishermen go out every morning?", "List three Python data types.",
]


def build_tiny_dataset(root, arch="llama", n=24, max_new_tokens=24, vocab_size=200, store_dtype="fp32", target=None):
    """A real (regenerated + extracted + vocab) dataset on a tiny target (or `target`), for stage tests."""
    target = target or f"tiny:{arch}"
    from eaglewire.data.config import DataExtractConfig, DataGenerateConfig, DataVocabConfig
    from eaglewire.data.pipeline import run_extract, run_generate, run_vocab

    prompts = root / "prompts.in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{USER_PROMPTS[i % len(USER_PROMPTS)]} ({i})"}) + "\n" for i in range(n)))
    out = root / "ds"
    run_generate(DataGenerateConfig(out=out, target=target, prompts=prompts, max_new_tokens=max_new_tokens,
                                batch_size=8, device="cpu"))
    run_extract(DataExtractConfig(data=out, target=target, store_dtype=store_dtype, device="cpu", shard_samples=8))
    run_vocab(DataVocabConfig(data=out, vocab_size=vocab_size))
    return out
