"""The host copies parcl uploads from: a snapshot it owns, or a caller's array it borrows.

An enqueued copy reads its host memory whenever the device gets to it, which may be after the
call that enqueued it returned, so an upload must read memory nobody changes until then.
"""

from __future__ import annotations

import numpy as np

from . import recorder


def snapshot(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` that parcl owns, for a non-blocking upload to read.

    An enqueued copy reads its host memory whenever the device gets to it, which may be after
    the call that enqueued it returned; a loader that refills one buffer for every batch would
    then have the device copy the next batch (or half of it). Copying on the host costs a
    memcpy (~0.1 ms per MB here) and keeps every upload asynchronous."""
    return np.array(array, order="C", copy=True)


def own(array: np.ndarray, borrow: bool = False) -> np.ndarray:
    """What a non-blocking upload of ``array`` reads: a ``snapshot``, or ``array`` itself
    (C-contiguous) when the caller ``borrow``s it, keeping it unchanged until the upload is
    done. A recorded upload (step capture) always gets a snapshot: it is read again at every
    replay."""
    if borrow and recorder.current() is None:
        # np.asarray, not np.ascontiguousarray: that one makes a 0-d array (1,)
        return np.asarray(array, order="C")
    return snapshot(array)
