"""Parse a `vllm serve ...` command line with vLLM's own argument parser; run with the vLLM venv's Python.

Prints the parsed values the tests compare (JSON). A flag vLLM does not know exits non-zero,
so a printed command that a GPU box's `vllm serve` would refuse fails the test here.
"""

import json
import sys

import vllm.entrypoints.cli.serve as serve
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
subparsers = parser.add_subparsers(dest="subparser")
for cmd in serve.cmd_init():
    cmd.subparser_init(subparsers)
args = parser.parse_args(sys.argv[1:])
keys = ("subparser", "model_tag", "host", "port", "dtype", "gpu_memory_utilization", "max_model_len", "speculative_config")
print(json.dumps({k: getattr(args, k, None) for k in keys}, default=str))
