"""The prepared GPU check: one command, a few minutes on one GPU, figures for docs/ and for `plan --measured`.

    python benchmarks/gpu_check.py --out gpu_check.json          # on the GPU machine (repo copied there)
    python benchmarks/gpu_check.py --smoke --device cpu --out x.json   # the suite's smoke run, tiny sizes

Three sections, each independent (one that cannot run says why in one line and the others still run):

* train: bf16 (autocast, fp32 master weights and AdamW, as `train` keeps them) TTT steps of a
  Kimi-K2.5-sized drafter (hidden 7,168, MLP 12,288, 64 heads of 128, draft vocab 32,000, target vocab
  163,840, 3 captured layers) on random features: tokens/s and peak device memory. `plan --measured`
  reads this section to time training from a measurement instead of a datasheet bound.
* exact: greedy speculative decoding (chain and tree) of a tiny target with a random drafter on the
  device, token for token against the target's own greedy generate (fp32).
* capture: a tiny family's captured hidden states in bf16 against fp32 on the device (relative error per point).

Needs only torch, transformers and safetensors (the repo's src/ is put on the path); no downloads: the
tiny targets are built locally. Python 3.11 or 3.12.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

FULL = {"hidden": 7168, "intermediate": 12288, "heads": 64, "head_dim": 128, "vocab": 163840, "draft_vocab": 32000,
        "seq_len": 2048, "batch": 1, "ttt_steps": 7, "warmup": 2, "steps": 8, "exact_prompts": 4, "exact_new": 32}
SMOKE = {"hidden": 64, "intermediate": 128, "heads": 4, "head_dim": 16, "vocab": 512, "draft_vocab": 128,
         "seq_len": 32, "batch": 1, "ttt_steps": 3, "warmup": 1, "steps": 2, "exact_prompts": 1, "exact_new": 8}
PROMPTS = ["Hello, how are you today?", "Write a short story about a robot.", "Explain why the sky is blue.",
           "What is 12 plus 30?"]
# Relative error of bf16 capture against fp32: bf16 keeps ~3 significant digits and a dense tiny target's few
# layers stay near 1%; an MoE's router flips a near-tied top-k choice under bf16 for some tokens (~5% measured
# on CPU), which is how bf16 serving routes too, not a capture error.
CAPTURE_REL_TOL = {"llama": 0.05, "qwen3": 0.05, "deepseek_v3": 0.15}


def matmul_parameters(model) -> int:
    """The drafter weights a token's forward multiplies by: what `plan` scales a measured rate with."""
    return sum(p.numel() for n, p in model.named_parameters()
               if n.endswith(".weight") and n != "embed_tokens.weight" and "norm" not in n)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def check_train(dev: torch.device, s: dict) -> dict:
    from eaglewire.drafter import DrafterConfig, Eagle3Drafter, ttt_forward

    cfg = DrafterConfig(hidden_size=s["hidden"], intermediate_size=s["intermediate"], num_attention_heads=s["heads"],
                        num_key_value_heads=s["heads"], head_dim=s["head_dim"], rms_norm_eps=1e-6, rope_theta=1e6,
                        max_position_embeddings=max(4096, s["seq_len"]), target_hidden_size=s["hidden"],
                        vocab_size=s["vocab"], draft_vocab_size=s["draft_vocab"], num_aux=3)
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg).to(dev)
    model.embed_tokens.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))
    B, T, H = s["batch"], s["seq_len"], s["hidden"]
    g = torch.Generator(device=dev).manual_seed(0)
    feats = torch.randn(B, T, 3 * H, device=dev, generator=g)
    hidden = torch.randn(B, T, H, device=dev, generator=g)
    head = torch.randn(s["vocab"], H, device=dev, generator=g) * H ** -0.5
    ids = torch.randint(0, s["vocab"], (B, T), device=dev, generator=g)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    losses, times = [], []
    for i in range(s["warmup"] + s["steps"]):
        _sync(dev)
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = ttt_forward(model, feats, ids, hidden, head, steps=s["ttt_steps"])
            loss = sum(0.8 ** k * lk for k, lk in enumerate(out.step_losses))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync(dev)
        if i >= s["warmup"]:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    secs = sum(times)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    return {"ok": all(map(lambda v: v == v and abs(v) < float("inf"), losses)), "dtype": "bf16",
            "tokens_per_s": B * T * len(times) / secs, "step_s": secs / len(times), "steps_timed": len(times),
            "peak_memory_gib": peak, "matmul_parameters": matmul_parameters(model),
            "parameters": sum(p.numel() for p in model.parameters()), "hidden": H, "intermediate": s["intermediate"],
            "draft_vocab": s["draft_vocab"], "vocab": s["vocab"], "seq_len": T, "batch": B,
            "ttt_steps": s["ttt_steps"], "losses": losses}


def _random_drafter(target, seed: int = 0):
    from eaglewire.drafter import DrafterConfig, Eagle3Drafter

    v = target.vocab_size
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=(3 * v) // 4)
    torch.manual_seed(seed)
    model = Eagle3Drafter(cfg)
    model.load_target_embedding(target.model.get_input_embeddings().weight.detach().cpu())
    g = torch.Generator().manual_seed(seed)
    model.set_draft_vocab(torch.sort(torch.randperm(v, generator=g)[:(3 * v) // 4]).values)
    return model.to(target.model.device).eval()


def check_exact(dev: torch.device, s: dict) -> dict:
    from eaglewire.decoding.engine import SpecConfig, SpecEngine
    from eaglewire.targets.load import load_target
    from eaglewire.targets.points import eagle3_default

    target = load_target("tiny:llama", device=dev)
    eng = SpecEngine(target, _random_drafter(target), eagle3_default(target.num_layers))
    rows = []
    for p in PROMPTS[:s["exact_prompts"]]:
        ids = eng.encode(p)
        x = torch.tensor([ids], device=dev)
        ref = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                    max_new_tokens=s["exact_new"], eos_token_id=target.eos_ids(),
                                    pad_token_id=target.eos_ids()[0])[0, len(ids):].tolist()
        for mode in ("chain", "tree"):
            got = eng.generate(ids, SpecConfig(mode=mode, max_new_tokens=s["exact_new"], min_prob=0.0)).token_ids
            rows.append({"prompt": p, "mode": mode, "exact": got == ref, "tokens": len(ref)})
    return {"ok": all(r["exact"] for r in rows), "cases": rows}


def check_capture(dev: torch.device, s: dict) -> dict:
    from eaglewire.targets.capture import capture
    from eaglewire.targets.load import load_target
    from eaglewire.targets.points import eagle3_default

    out = {}
    for fam, tol in CAPTURE_REL_TOL.items():
        ref = load_target(f"tiny:{fam}", device=dev, dtype=torch.float32)
        low = load_target(f"tiny:{fam}", device=dev, dtype=torch.bfloat16)
        pts = eagle3_default(ref.num_layers)
        ids = torch.randint(3, ref.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0)).to(dev)
        a, b = capture(low.model, ids, pts), capture(ref.model, ids, pts)
        rel = {n: float((a[n].float() - b[n]).norm() / b[n].norm().clamp_min(1e-12)) for n in b}
        out[fam] = {"rel_error": rel, "tolerance": tol, "ok": max(rel.values()) < tol}
    return {"ok": all(v["ok"] for v in out.values()), "families": out}


def _run(name: str, fn, dev, sizes) -> dict:
    t0 = time.perf_counter()
    try:
        res = fn(dev, sizes)
    except ModuleNotFoundError as e:
        res = {"ok": None, "skipped": f"missing module {e.name}: this section needs it installed"}
    except Exception as e:  # noqa: BLE001  one section's failure must not lose the others' figures
        res = {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300],
               "trace": traceback.format_exc()[-2000:]}
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    return res


def _line(name: str, r: dict) -> str:
    if r.get("skipped") or r.get("error"):
        return f"{name}: {'SKIPPED' if r.get('skipped') else 'FAILED'} ({r.get('skipped') or r.get('error')})"
    if name == "train":
        mem = f", peak {r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] is not None else ""
        return (f"train: {r['tokens_per_s']:,.0f} tok/s ({r['step_s']:.3f} s/step, {r['dtype']}, hidden {r['hidden']}, "
                f"draft vocab {r['draft_vocab']}, T {r['seq_len']}, TTT {r['ttt_steps']}){mem}")
    if name == "exact":
        n = sum(c["exact"] for c in r["cases"])
        return f"exact: {n}/{len(r['cases'])} greedy speculative decodes equal the target's own generate"
    per = ", ".join(f"{f} {max(v['rel_error'].values()):.1e} (< {v['tolerance']:g}: {'ok' if v['ok'] else 'NO'})"
                    for f, v in r["families"].items())
    return f"capture: bf16 vs fp32 worst relative error per family: {per}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (the suite runs this on CPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--only", choices=("train", "exact", "capture"), action="append",
                    help="run only these sections (repeat); default: all")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    sizes = SMOKE if args.smoke else FULL
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    res = {"device": name, "device_type": dev.type, "smoke": args.smoke, "torch": torch.__version__,
           "python": platform.python_version()}
    if dev.type == "cuda":
        res["device_memory_gib"] = torch.cuda.get_device_properties(dev).total_memory / 2**30
    t0 = time.perf_counter()
    for sec, fn in (("train", check_train), ("exact", check_exact), ("capture", check_capture)):
        if args.only and sec not in args.only:
            continue
        res[sec] = _run(sec, fn, dev, sizes)
        print(_line(sec, res[sec]), flush=True)
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"{name}: wrote {args.out} in {res['wall_s']:.0f} s")
    return 0 if all(res[s].get("ok") is not False for s in ("train", "exact", "capture") if s in res) else 1


if __name__ == "__main__":
    sys.exit(main())
