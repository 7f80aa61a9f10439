"""Which process am I? Rank and world size of a multi-process (MPI) run.

``mpiexec -n K parcl-launch ...`` starts K processes (ranks); each runs its own replicas and
``ReplicaGroup`` reduces gradients across them. A script uses these helpers to take its share of
the data and to let only rank 0 print and write checkpoints::

    from parcl import distributed as dist
    loader = pc.data.DataLoader((x, y), 64, shuffle=True,
                                rank=dist.rank(), world_size=dist.world_size())
    if dist.is_main():
        pc.save("ckpt.safetensors", group.model, opt, step=step)

Outside MPI every helper answers as for a single process (rank 0 of 1), without importing
mpi4py. Under ``mpiexec`` the rank is read from the environment the MPI launcher sets
(``PMI_RANK``/``PMI_SIZE`` for MPICH's hydra, ``OMPI_COMM_WORLD_*`` for Open MPI, ``PMIX_RANK``
with ``SLURM_STEP_NUM_TASKS`` for Slurm's ``srun --mpi=pmix``),
and mpi4py is imported only when a communicator is actually needed.

>>> rank(), world_size(), is_main()   # a plain single-process run
(0, 1, True)
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["comm", "env_world", "gather", "is_main", "local_rank", "local_size", "rank",
           "set_comm", "world_size"]

_lock = threading.Lock()
_state: dict[str, Any] = {}   # "comm", "local_rank", "local_size" once known

# (rank variable, size variable) pairs, in the order they are tried.
_ENV_PAIRS = (("PMI_RANK", "PMI_SIZE"),                               # MPICH hydra, Intel MPI
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),       # Open MPI
              ("PMIX_RANK", "PMIX_SIZE"),                             # PMIx launchers
              # Slurm's srun --mpi=pmix sets a PMIx rank and no size: the step's tasks are
              # MPI_COMM_WORLD. Without this pair every rank would run alone as rank 0 of 1.
              ("PMIX_RANK", "SLURM_STEP_NUM_TASKS"),
              ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"))         # MVAPICH
_LOCAL_PAIRS = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),               # MPICH hydra
                ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def env_world() -> tuple[int, int]:
    """``(rank, world_size)`` as the MPI launcher's environment says; ``(0, 1)`` outside MPI.
    Cheap: reads environment variables only."""
    for rank_var, size_var in _ENV_PAIRS:
        r, n = _env_int(rank_var), _env_int(size_var)
        if r is not None and n is not None and n >= 1 and 0 <= r < n:
            return r, n
    return 0, 1


def set_comm(communicator) -> None:
    """Used by parcl-launch: the communicator of this run (None for a single process)."""
    with _lock:
        _state.clear()
        _state["comm"] = communicator


def comm():
    """The mpi4py communicator of this run (``MPI.COMM_WORLD``), or None in a single-process
    run. Imports mpi4py only when the environment says there are several ranks."""
    with _lock:
        if "comm" not in _state:
            if env_world()[1] > 1:
                try:
                    from mpi4py import MPI
                except ImportError as e:
                    raise ImportError("this process runs under mpiexec with several ranks but "
                                      "mpi4py is not installed: pip install 'parcl[mpi]'") from e
                _state["comm"] = MPI.COMM_WORLD
            else:
                _state["comm"] = None
        return _state["comm"]


def _world() -> tuple[int, int]:
    # A communicator once set (or found) decides, None included: parcl-launch sets None where
    # the environment looks like MPI but the library runs one process (a launcher's variables
    # inherited by a process it did not start), and the environment's rank 3 of 4 would then
    # have a lone process train a quarter of the data and never checkpoint.
    if "comm" not in _state:
        return env_world()
    c = _state["comm"]
    return (int(c.Get_rank()), int(c.Get_size())) if c is not None else (0, 1)


def rank() -> int:
    """This process's rank (0 outside MPI)."""
    return _world()[0]


def world_size() -> int:
    """The number of processes (1 outside MPI)."""
    return _world()[1]


def is_main() -> bool:
    """True on rank 0: the rank that prints progress and writes checkpoints."""
    return rank() == 0


def _local() -> tuple[int, int]:
    if "local_rank" not in _state:
        _state["local_rank"], _state["local_size"] = _find_local()
    return _state["local_rank"], _state["local_size"]


def _find_local() -> tuple[int, int]:
    if world_size() == 1:      # one process, whatever a launcher's inherited variables say
        return 0, 1
    for rank_var, size_var in _LOCAL_PAIRS:
        r, n = _env_int(rank_var), _env_int(size_var)
        if r is not None and n is not None and 0 <= r < n:
            return r, n
    c = comm()
    if c is None:
        return 0, 1
    from mpi4py import MPI     # ranks that share this node's memory (and so its CPU cores)
    node = c.Split_type(MPI.COMM_TYPE_SHARED)
    found = node.Get_rank(), node.Get_size()
    node.Free()
    return found


def local_rank() -> int:
    """This process's index among the ranks on the same machine (0 outside MPI)."""
    return _local()[0]


def local_size() -> int:
    """How many ranks run on this machine (1 outside MPI)."""
    return _local()[1]


def gather(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` as a list on rank 0 (None on the others); ``[obj]`` outside MPI.
    A collective: every rank must call it. For small JSON-like values (RNG states, counters)."""
    c = comm()
    if c is None:
        return [obj]
    return c.gather(obj, root=0)
