"""Shared fixtures: one session-wide set of devices, contexts and queues (PoCL builds each
program once per context, so tests share them)."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc


@pytest.fixture(scope="session")
def devices2():
    """The CPU split into two sub-devices (one core each here): two real OpenCL devices."""
    return pc.devices(split=2)


@pytest.fixture(scope="session")
def queue(devices2):
    """A queue on the first sub-device; also made this thread's default queue."""
    q = pc.new_queue(devices2[0])
    pc.set_default_queue(q)
    return q


@pytest.fixture(scope="session")
def queues2(devices2, queue):
    """Two queues, one per sub-device, in the same context as ``queue``."""
    return [queue, pc.new_queue(devices2[1])]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


AWKWARD_SIZES = [1, 7, 33, 257, 1000]
