"""``parcl-bench`` / ``python -m parcl.bench``: parse the command line, run one benchmark,
print its table, write ``--json`` and ``--plot``.

>>> from parcl.bench.__main__ import main
>>> main(["kernels", "--sizes", "64", "--vector-sizes", "4K", "--conv", "tiny"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import SUBCOMMANDS
from .common import BenchError, add_common_arguments, render, require_matplotlib, write_json

_HELP = {
    "scaling": "samples/s, speedup and efficiency vs replica count, with the split of a step",
    "allreduce": "allreduce time, algbw and busbw (nccl-tests definitions) vs size",
    "kernels": "GEMM/elementwise/reduction/conv throughput vs numpy, launch overhead",
    "compare": "one training step in parcl vs a numpy reference (and PyTorch if installed)",
    "memory": "peak memory of a forward pass with the tape vs under no_grad (and "
              "tp.checkpoint on a GPT: --checkpoint)",
    "overhead": "host time per recorded op of the eager tape (fwd+bwd, no_grad) vs PyTorch",
    "docs": "rerun the benchmarks docs/performance.md quotes (JSON and plots)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parcl-bench",
        description="parcl benchmarks. Every subcommand prints an aligned table; --json FILE "
                    "and --plot FILE (PNG) save it. Timings are medians of --repeat runs after "
                    "discarded warm-up runs, with their spread.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    sub.required = True
    for name in SUBCOMMANDS:
        sp = sub.add_parser(name, help=_HELP[name], description=_HELP[name])
        add_common_arguments(sp)
        _module(name).add_arguments(sp)
    return parser


def _module(name: str):
    return importlib.import_module(f"parcl.bench.{name}")


def main(argv: list[str] | None = None) -> int:
    """Run ``parcl-bench`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    mod = _module(args.command)
    try:
        if args.plot:
            require_matplotlib()          # fail before a long run, not after
        result = mod.run(args)
        result["command"] = "parcl-bench " + " ".join(argv)
        if result.get("rank", 0) != 0:    # under mpiexec only rank 0 reports
            return 0
        print(render(result), flush=True)
        if args.json:
            write_json(args.json, result)
        if args.plot:
            mod.plot(result, args.plot)
    except BenchError as exc:
        print(f"parcl-bench {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
