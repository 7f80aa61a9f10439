"""A Chrome-trace (``chrome://tracing``, https://ui.perfetto.dev) writer.

One row (``tid``) per track: the main thread, each replica thread and each replica's queue.
Spans are "complete" events (``"ph": "X"``) with microsecond ``ts``/``dur`` counted from the
trace's start; track names are ``thread_name`` metadata events. Host times come from
``time.perf_counter()`` (one clock for every thread of the process). Device times come from
OpenCL event profiling (``profile.start``/``profile.end``, nanoseconds on the device clock),
shifted onto the host clock by an offset measured with a marker; that needs a queue made with
``pc.new_queue(device, profiling=True)``.

>>> from parcl.bench.trace import ChromeTrace
>>> tr = ChromeTrace({"what": "example"})
>>> tid = tr.track("main thread")
>>> t0 = tr.now(); t1 = tr.now()
>>> tr.span(tid, "work", t0, t1)
>>> sorted(tr.to_dict())
['displayTimeUnit', 'otherData', 'traceEvents']
"""

from __future__ import annotations

import json
import os
import time

import pyopencl as cl


class ChromeTrace:
    """Collects spans on named tracks and writes Chrome-trace JSON."""

    def __init__(self, metadata: dict | None = None, process_name: str = "parcl"):
        self.origin = time.perf_counter()
        self.pid = os.getpid()
        self.metadata = dict(metadata or {})
        self.events: list[dict] = [{"name": "process_name", "ph": "M", "pid": self.pid,
                                    "tid": 0, "args": {"name": process_name}}]
        self._tracks: dict[str, int] = {}

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def track(self, name: str) -> int:
        """The tid of the track called ``name`` (created, in order, on first use)."""
        tid = self._tracks.get(name)
        if tid is None:
            tid = len(self._tracks) + 1
            self._tracks[name] = tid
            self.events.append({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid,
                                "args": {"name": name}})
            self.events.append({"name": "thread_sort_index", "ph": "M", "pid": self.pid,
                                "tid": tid, "args": {"sort_index": tid}})
        return tid

    def span(self, tid: int, name: str, start: float, end: float, cat: str = "host",
             args: dict | None = None) -> None:
        """A span from ``start`` to ``end`` (``perf_counter`` seconds) on track ``tid``."""
        ev = {"name": name, "cat": cat, "ph": "X", "pid": self.pid, "tid": tid,
              "ts": round((start - self.origin) * 1e6, 3),
              "dur": round(max(end - start, 0.0) * 1e6, 3)}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def device_span(self, tid: int, name: str, start_ns: int, end_ns: int, offset_s: float,
                    cat: str = "device", args: dict | None = None) -> None:
        """A span in device-clock nanoseconds, moved onto the host clock by ``offset_s``."""
        self.span(tid, name, start_ns * 1e-9 + offset_s, end_ns * 1e-9 + offset_s, cat, args)

    def to_dict(self) -> dict:
        return {"traceEvents": list(self.events), "displayTimeUnit": "ms",
                "otherData": dict(self.metadata)}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)
            f.write("\n")


def clock_offset(queue: cl.CommandQueue) -> float:
    """Seconds to add to ``queue``'s profiling clock (ns * 1e-9) to get ``perf_counter``.

    A marker is enqueued on an idle queue and waited for; its end is taken to be the host time
    half-way through the wait (accurate to the wait's length, tens of microseconds)."""
    queue.finish()
    t0 = time.perf_counter()
    ev = cl.enqueue_marker(queue)
    ev.wait()
    t1 = time.perf_counter()
    return (t0 + t1) / 2 - ev.profile.end * 1e-9


def has_profiling(queue: cl.CommandQueue) -> bool:
    """Whether events on ``queue`` carry profiling timestamps."""
    if getattr(queue, "profiling", False):
        return True
    return bool(queue.properties & cl.command_queue_properties.PROFILING_ENABLE)


def validate(trace: dict) -> list[str]:
    """Problems that would stop chrome://tracing or Perfetto reading ``trace`` (empty: fine)."""
    problems = []
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    for i, ev in enumerate(events):
        for key in ("name", "ph", "pid", "tid"):
            if key not in ev:
                problems.append(f"event {i} lacks {key!r}")
        if ev.get("ph") == "X":
            if not isinstance(ev.get("ts"), (int, float)) or not isinstance(
                    ev.get("dur"), (int, float)):
                problems.append(f"event {i} ({ev.get('name')}) lacks a numeric ts/dur")
            elif ev["dur"] < 0:
                problems.append(f"event {i} ({ev.get('name')}) has a negative duration")
    return problems
