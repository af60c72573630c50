"""Re-run issue 26's hostile-user probe set ("Hardening, second pass") against the real CLI.

Every case of the issue's items 1-7 (data loss with --force, mixing targets,
server transport faults, deadlines and Ctrl-C, tracebacks on bad files, silent
acceptance of broken weights and ids, permissions) runs as a real `eaglewire`
subprocess with a timeout, on tiny targets and artifacts built in a temporary
directory, against a fake OpenAI-compatible server where a case needs one. Each
outcome lands in exactly one class:

  right           the expected result, verified (data kept, answer stored, 0755/0644 ...)
  error-line      exit 2 with exactly one `error:` line naming the file / field
  traceback       a Python traceback (or a process killed by a signal)
  silently-wrong  exit 0, or a wrong message, where an error or another result was expected
  hang            the case's timeout passed
  lost-data       a file that existed before is gone or changed when it should not be

  python benchmarks/probe_hardening.py [--only SUBSTR] [--json PATH] [--keep]

Issue 36's cases ("Hardening, third pass": paths read from input that lead
out of their directory, foreign files in --out, custom model code, ...) are
named `i36-*` (`--only i36-`).

Issues 55 and 58's cases ("Hardening, fourth pass" and "hand-offs": a resumed run's dataset identity, hostile
records and server counters, cached builds, code handed to llama.cpp's converter, runs resumed with other
settings, servers that outlive `serve`) are named `i55-*` and `i58-*` (`--only i55-`, `--only i58-`).

Issue 36's generator (`_probe_mutations.py`) mutates every file eaglewire reads
back from an artifact (a dataset's manifest.json, vocab.json, responses.jsonl,
prompts.jsonl, generate.config.json; saved configs for --config and --resume; a
run's state/meta.json; a checkpoint's config.json and eaglewire.json; an
export's config.json and eaglewire.export.json; a target's config.json and
tokenizer_config.json; the serve record; a GGUF drafter): keys removed, wrong
types, null, 10 000-deep nesting, huge numbers, truncation, non-UTF-8, empty
files, paths leading outside. Those cases are named `mut-<file>-<mutation>`
(`--only mut-`, or `--only mut-manifest` for one file; `mut-<file>-intact` is
the output the others are compared with): 343 cases, about 37 minutes.

Prints a table and the counts per class; exits 1 when any case is traceback,
silently-wrong, hang or lost-data. About 5 minutes (72 cases) on a 2-core CPU
without the `mut-` cases.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _probe_cases import Case, Wrong, item1, item2, items34  # noqa: E402
from _probe_cases_36 import issue36  # noqa: E402
from _probe_cases_55a import issue55a  # noqa: E402
from _probe_cases_55b import issue55b  # noqa: E402
from _probe_cases_58a import issue58a  # noqa: E402
from _probe_cases_58b import issue58b  # noqa: E402
from _probe_cases_files import item5, item6, item7  # noqa: E402
from _probe_mutations import mutation_cases  # noqa: E402
from _probe_world import Res, World, cli, lost, snapshot  # noqa: E402

CLASSES = ["right", "error-line", "traceback", "silently-wrong", "hang", "lost-data"]
BAD = {"traceback", "silently-wrong", "hang", "lost-data"}


def all_cases() -> list[Case]:
    return [*item1(), *item2(), *items34(), *item5(), *item6(), *item7(), *issue36(), *issue55a(), *issue55b(),
            *issue58a(), *issue58b(), *mutation_cases()]


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]


def error_line(case: Case, res: Res, d: Path) -> str:
    """The one `error:` line, holding every word (raises Wrong otherwise), with a note of other stderr lines."""
    lines = _lines(res.stderr)
    errors = [ln for ln in lines if ln.startswith("error:")]
    if len(errors) != 1:
        raise Wrong(f"exit 2 with {len(errors)} `error:` lines: {lines[-1:]}")
    line = errors[0]
    for word in case.words:
        options = [o.format(d=d) for o in (word if isinstance(word, tuple) else (word,))]
        if not any(o in line for o in options):
            raise Wrong(f"error line lacks {' or '.join(options)!r}: {line}")
    extra = [ln for ln in lines if ln != line]
    if case.strict and extra:  # one message over several lines: noted, not a class of its own
        return f"{line} [NOTE: +{len(extra)} more stderr line(s): {extra[0][:70]}]"
    return line


def classify(case: Case, res: Res, w: World, d: Path, gone: list[str]) -> tuple[str, str]:
    """(class, one-line detail) of one outcome."""
    if gone:
        return "lost-data", "; ".join(gone[:3])
    if res.timed_out:
        return "hang", f"killed after {res.seconds:.0f} s"
    tb = "Traceback (most recent call last)"
    if tb in res.stderr or tb in res.stdout or (res.rc is not None and res.rc < 0):
        last = (_lines(res.stderr) or [f"killed by signal {-res.rc}"])[-1]
        return "traceback", last
    try:
        if case.words is not None and res.rc == 2:
            line = error_line(case, res, d)
            more = case.post(res, w, d) if case.post else None
            return "error-line", more if isinstance(more, str) else line
        if case.check is not None:
            return "right", case.check(res, w, d)
    except Wrong as e:
        return "silently-wrong", str(e)
    except Exception as e:  # noqa: BLE001  a check reading a broken artifact: the artifact is wrong
        return "silently-wrong", f"{type(e).__name__}: {e}"
    last = (_lines(res.stderr) or _lines(res.stdout) or [""])[-1]
    return "silently-wrong", f"exit {res.rc} where an error was expected: {last}"


def run_case(case: Case, w: World) -> dict:
    d = w.case_dir(case.name)
    t0 = time.monotonic()
    noise = io.StringIO()  # progress bars of the in-process builds
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            args = case.prep(w, d)
    except Exception as e:  # noqa: BLE001  in-process eaglewire code building the inputs
        return _row(case, "traceback", f"SETUP FAILED {type(e).__name__}: {e}", None, time.monotonic() - t0)
    before = snapshot([d / p for p in case.protect])
    if case.run:
        res = case.run(w, d, args)
    else:
        res = cli(args, d, case.timeout, case.umask, case.mem_gib)
    gone = lost(before, snapshot([d / p for p in case.protect]))
    cls, detail = classify(case, res, w, d, gone)
    detail = detail.replace(f"{d}/", "").replace(str(d), ".").replace(str(w.tmp), "$TMP")
    return _row(case, cls, detail, res, time.monotonic() - t0)


def _row(case: Case, cls: str, detail: str, res: Res | None, seconds: float) -> dict:
    return {"case": case.name, "item": case.item, "class": cls, "detail": " ".join(detail.split()),
            "rc": None if res is None else res.rc, "seconds": round(seconds, 1),
            "command": None if res is None else " ".join(["eaglewire", *res.cmd[3:]]),
            "stderr_tail": None if res is None else res.stderr[-800:]}


def report(rows: list[dict], seconds: float) -> dict[str, int]:
    width = max(len(r["case"]) for r in rows)
    print(f"\n{'case':<{width}}  item  {'class':<14}  detail")
    for r in rows:
        print(f"{r['case']:<{width}}  {r['item']:>4}  {r['class']:<14}  {r['detail'][:110]}")
    counts = {c: sum(r["class"] == c for r in rows) for c in CLASSES}
    print(f"\n{len(rows)} cases in {seconds:.0f} s: " + ", ".join(f"{c} {n}" for c, n in counts.items()))
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run the cases whose name contains this (several: comma-separated)")
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    a = ap.parse_args()
    cases = [c for c in all_cases() if any(part in c.name for part in a.only.split(","))]
    if not cases:
        ap.error(f"--only {a.only!r} matches no case")
    tmp = Path(tempfile.mkdtemp(prefix="probe-hardening-"))
    w, rows, t0 = World(tmp), [], time.monotonic()
    try:
        for c in cases:
            rows.append(run_case(c, w))
            r = rows[-1]
            print(f"[{len(rows)}/{len(cases)}] {r['case']}: {r['class']} ({r['seconds']} s)", flush=True)
    finally:
        w.close()
        if a.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.monotonic() - t0
    counts = report(rows, seconds)
    if a.json:
        a.json.write_text(json.dumps({"seconds": round(seconds, 1), "counts": counts, "cases": rows}, indent=2) + "\n")
    return 1 if any(r["class"] in BAD for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
