"""What vLLM's own code reads from DFlash drafter directories; run by the pinned vLLM venv's Python.

Why in that interpreter: vLLM pins its own transformers. Each directory goes
through vLLM's config loading as a `--speculative-config '{"method": "dflash"}'`
draft does (`transformers_utils/config.py` `get_config`, which runs
`SpeculatorsConfig` and its `update_dflash` for a speculators layout, then
`EAGLEConfig(..., method="dflash")` as `config/speculative.py` wraps any other),
and the V1 runner's `_get_eagle3_aux_layers_from_config` is compiled from
`v1/worker/gpu_model_runner.py` and called on a stub runner holding that config
(importing the runner module needs a GPU stack; the method reads only the config).

Input: a JSON list of directories on stdin. Output: one JSON object per directory, in order.
Standard library plus vLLM only: eaglewire is not importable in that venv.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

RUNNER = "v1/worker/gpu_model_runner.py"
METHOD = "_get_eagle3_aux_layers_from_config"


def runner_method():
    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    path = root / RUNNER
    tree = ast.parse(path.read_text())
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == METHOD:
                fn.decorator_list, fn.returns = [], None
                for a in fn.args.args:
                    a.annotation = None
                ns: dict = {}
                exec(compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), str(path), "exec"), ns)
                return ns[METHOD]
    raise SystemExit(f"{METHOD} not found in {path}")


def _jsonable(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


def read(d: str, method) -> dict:
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

    try:
        hf = get_config(d, trust_remote_code=False)
        if not isinstance(hf, (EAGLEConfig, SpeculatorsConfig)):
            hf = EAGLEConfig(hf, method="dflash", model_type="eagle")
    except Exception as e:  # what vLLM says, for the test to show
        return {"error": f"{type(e).__name__}: {e}"}
    stub = SimpleNamespace(speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf)))
    ids = method(stub)
    return {"runner": list(ids) if ids is not None else None,
            "architectures": _jsonable(getattr(hf, "architectures", None)),
            "dflash_config": _jsonable(getattr(hf, "dflash_config", None)),
            "eagle_aux_hidden_state_layer_ids": _jsonable(getattr(hf, "eagle_aux_hidden_state_layer_ids", None))}


def main() -> None:
    dirs = json.loads(sys.stdin.read())
    method = runner_method()
    print(json.dumps([read(d, method) for d in dirs]))


if __name__ == "__main__":
    main()
