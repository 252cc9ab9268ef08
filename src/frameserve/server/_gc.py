"""The garbage collector of a serving process, settled once it has loaded what it serves.

Serving allocates few reference cycles per request (bench/README.md, "Figures behind design
choices", has the count), but every collection of the oldest generation walks every tracked object the
process holds: the loaded frameworks, the models, the application (some 10^5 to 10^6 objects,
tens of milliseconds). :func:`settle_heap` collects once, then moves every surviving object to
the permanent generation (``gc.freeze``, Python docs: "gc.freeze ... move all objects tracked by
the garbage collector into a permanent generation, i.e. ignore them in all the future
collections"), and raises the first threshold so collections come rarer: a pause that was a
wobble in the throughput becomes a few microseconds.
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "settle_heap"]

GC_THRESHOLDS = (10_000, 20, 20)
"""Allocations (minus deallocations) before a young collection, then young collections before
the next generation's (CPython's defaults: 700, 10, 10)."""


def settle_heap() -> None:
    """Collect, freeze the survivors and raise the thresholds (call once what the process
    serves is loaded; objects created later are collected as usual)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
