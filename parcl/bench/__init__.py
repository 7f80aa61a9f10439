"""``parcl-bench``: throughput, allreduce, kernel, comparison and memory benchmarks.

Each subcommand is one module (``scaling``, ``allreduce``, ``kernels``, ``compare``,
``memory``, ``overhead``) with ``add_arguments(parser)``, ``run(args) -> result`` and
``plot(result, path)``; ``common`` holds timing, tables, JSON and plots, ``trace`` the
Chrome-trace writer. Run ``parcl-bench --help`` (or ``python -m parcl.bench --help``); figures
measured on the reference machine are in docs/performance.md.

>>> from parcl.bench.__main__ import main
>>> main(["allreduce", "--sizes", "4K", "--repeat", "2"])   # doctest: +SKIP
0
"""

SUBCOMMANDS = ("scaling", "allreduce", "kernels", "compare", "memory", "overhead", "docs")

__all__ = ["SUBCOMMANDS"]
