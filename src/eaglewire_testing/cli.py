"""The real CLI entry point, in-process (a subprocess would re-import torch for every call)."""

import contextlib
import io
import sys
import types


def run_cli(*args):
    from eaglewire import cli

    out, err = io.StringIO(), io.StringIO()
    code = 0
    argv, sys.argv = sys.argv, ["eaglewire", *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
