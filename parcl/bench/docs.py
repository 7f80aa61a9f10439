"""``parcl-bench docs``: rerun every benchmark that docs/performance.md quotes, writing the JSON
into ``--out`` (docs/bench-results) and the plots into ``--img`` (docs/img).

Each run is its own process (``python -m parcl.bench ...``), one after another, so the
benchmarks do not share a PoCL context or BLAS threads; the commands are listed in the table
it prints and in the JSON, and are the ones docs/performance.md gives. ``--quick`` runs the
same list at smoke-test sizes (for tests; its figures mean nothing).

>>> main(["docs", "--out", "docs/bench-results", "--img", "docs/img"])   # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from .common import BenchError, add_table, new_result

# name -> (arguments, arguments for --quick, has a plot in docs/img)
RUNS = {
    "kernels": (["kernels", "--sizes", "256,1024", "--repeat", "7"],
                ["kernels", "--sizes", "64", "--vector-sizes", "4K", "--conv", "tiny",
                 "--conv-ext", "tiny_dw,tiny_tconv", "--vocab", "8x1000", "--launches", "50",
                 "--chain", "5", "--repeat", "2"], True),
    "allreduce": (["allreduce", "--sizes", "4K,256K,4M,25M", "--repeat", "9"],
                  ["allreduce", "--sizes", "4K", "--repeat", "2"], True),
    "compare": (["compare", "--model", "mlp,cnn,mobilenet", "--devices", "cpu:2", "--repeat", "7"],
                ["compare", "--model", "mlp", "--devices", "cpu:2", "--steps", "1",
                 "--repeat", "1", "--batch", "8"], True),
    "compare_capture": (["compare", "--model", "mlp,cnn", "--devices", "cpu:2", "--capture",
                         "--no-numpy", "--repeat", "7"],
                        ["compare", "--model", "mlp", "--devices", "cpu:2", "--capture",
                         "--no-numpy", "--steps", "2", "--repeat", "1", "--batch", "8"], False),
    "scaling_mlp": (["scaling", "--model", "mlp", "--capture", "--ceiling", "--steps", "10",
                     "--repeat", "21"],
                    ["scaling", "--model", "mlp", "--capture", "--steps", "1", "--repeat", "1",
                     "--batch-per-replica", "8", "--no-numpy"], True),
    "scaling_mlp_eager": (["scaling", "--model", "mlp", "--steps", "10", "--repeat", "21",
                           "--no-numpy"],
                          ["scaling", "--model", "mlp", "--steps", "1", "--repeat", "1",
                           "--batch-per-replica", "8", "--no-numpy"], True),
    "scaling_cnn": (["scaling", "--model", "cnn", "--capture", "--ceiling", "--steps", "10",
                     "--repeat", "21"],
                    ["scaling", "--model", "cnn", "--capture", "--steps", "1", "--repeat", "1",
                     "--batch-per-replica", "4", "--no-numpy"], True),
    "scaling_cnn_eager": (["scaling", "--model", "cnn", "--steps", "10", "--repeat", "21",
                           "--no-numpy"],
                          ["scaling", "--model", "cnn", "--steps", "1", "--repeat", "1",
                           "--batch-per-replica", "4", "--no-numpy"], True),
    "scaling_digits": (["scaling", "--model", "digits", "--capture", "--ceiling", "--steps",
                        "20", "--repeat", "21"],
                       ["scaling", "--model", "digits", "--capture", "--steps", "1",
                        "--repeat", "1", "--batch-per-replica", "4", "--no-numpy"], True),
    "memory": (["memory", "--model", "resnet18,mlp,gpt", "--checkpoint", "4x128x64,12x128x256"],
               ["memory", "--model", "mlp", "--batch", "4", "--checkpoint", "1x32x8",
                "--repeat", "1", "--warmup", "0"], True),
    "overhead": (["overhead", "--repeat", "15"],
                 ["overhead", "--depth", "1", "--passes", "1", "--repeat", "1", "--warmup", "0",
                  "--op-calls", "2", "--guard-models", ""], True),
    "compare_gpt": (["compare", "--model", "gpt", "--devices", "cpu:2", "--repeat", "5"],
                    ["compare", "--model", "gpt", "--devices", "cpu:2", "--steps", "1",
                     "--repeat", "1", "--batch", "2"], False),
    "compare_gpt_capture": (["compare", "--model", "gpt", "--devices", "cpu:2", "--capture",
                             "--repeat", "5"],
                            ["compare", "--model", "gpt", "--devices", "cpu:2", "--capture",
                             "--steps", "2", "--repeat", "1", "--batch", "2"], False),
    "scaling_gpt": (["scaling", "--model", "gpt", "--capture", "--steps", "5", "--repeat", "11"],
                    ["scaling", "--model", "gpt", "--capture", "--steps", "1", "--repeat", "1",
                     "--batch-per-replica", "2"], True),
    "scaling_gpt_eager": (["scaling", "--model", "gpt", "--steps", "5", "--repeat", "11"],
                          ["scaling", "--model", "gpt", "--steps", "1", "--repeat", "1",
                           "--batch-per-replica", "2"], True),
    "scaling_resnet18_syncbn": (["scaling", "--model", "resnet18", "--steps", "2", "--repeat",
                                 "5", "--sync-batchnorm"],
                                ["scaling", "--model", "digits", "--steps", "1", "--repeat", "1",
                                 "--batch-per-replica", "4", "--sync-batchnorm"], False),
    "scaling_resnet18": (["scaling", "--model", "resnet18", "--steps", "2", "--repeat", "5"],
                         ["scaling", "--model", "digits", "--steps", "1", "--repeat", "1",
                          "--batch-per-replica", "4"], False),
}


def add_arguments(p) -> None:
    p.add_argument("--out", default="docs/bench-results", help="directory for the JSON")
    p.add_argument("--img", default="docs/img", help="directory for the plots")
    p.add_argument("--only", default="", help="comma-separated names of the runs to do "
                   f"(default all: {', '.join(RUNS)})")
    p.add_argument("--quick", action="store_true", help="smoke-test sizes (figures meaningless)")


def run(args) -> dict:
    names = [n for n in args.only.split(",") if n] or list(RUNS)
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        raise BenchError(f"docs: unknown runs {unknown}; choose from {', '.join(RUNS)}")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.img, exist_ok=True)
    result = new_result("docs", {"out": args.out, "img": args.img, "quick": args.quick})
    rows = []
    for name in names:
        full, quick, has_plot = RUNS[name]
        argv = list(quick if args.quick else full)
        argv += ["--json", os.path.join(args.out, f"{name}.json")]
        if has_plot:
            argv += ["--plot", os.path.join(args.img, f"{name}.png")]
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "parcl.bench", *argv],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BenchError(f"docs: 'parcl-bench {' '.join(argv)}' failed "
                             f"({done.returncode}): {done.stderr.strip()[-400:]}")
        rows.append({"name": name, "command": "parcl-bench " + " ".join(argv),
                     "seconds": time.perf_counter() - t0})
    add_table(result, "runs", "benchmarks behind docs/performance.md",
              [("name", "run", "s"), ("seconds", "s", ".0f"), ("command", "command", "s")], rows)
    return result


def plot(result: dict, path: str) -> None:
    raise BenchError("docs: each run writes its own plot into --img")
