"""The dynamic batcher's queue and batch-forming rule, as plain logic with explicit times.

No threads and no clock here: the scheduler thread calls :meth:`BatchQueue.expire` and
:meth:`BatchQueue.form` with the current time and sleeps until the time they return, so the
rule itself is tested with hand-written times.

The rule (Triton's dynamic batcher, ``docs/user_guide/batcher.md``):

- Requests queue per priority level (level 1 first); within a level in arrival order, and
  requests whose timeout passed with action ``DELAY`` after those that have not timed out.
- A batch is a prefix of that order: it stops before a request that would take it past
  ``max_batch_size`` or whose non-batch input shapes differ from the first request's.
- A prefix whose size is a preferred batch size (or that cannot grow without passing the
  largest preferred size, ``max_batch_size`` when none is given) is sent at once; otherwise the
  batch waits until its oldest request has waited ``max_queue_delay_us`` and then goes as it
  is. With a delay of 0 whatever is queued goes at once.
- Without dynamic batching each request is its own batch, in the same order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from frameserve.errors import ResourceExhaustedError
from frameserve.scheduler._policy import BatchingPolicy
from frameserve.scheduler._request import QueuedRequest

__all__ = ["BatchQueue"]


class BatchQueue:
    """The queued requests of one model version.

    Args:
        policy: batching and queue policy.
        check_shapes: batch only requests whose non-batch input shapes match (off for
            sessions that take requests one by one).
        model: the model's name, for messages.
    """

    def __init__(self, policy: BatchingPolicy, *, check_shapes: bool = True, model: str = "") -> None:
        self.policy = policy
        self.check_shapes = check_shapes
        self.model = model
        self._ready: dict[int, deque[QueuedRequest]] = {lv: deque() for lv in policy.levels}
        self._delayed: dict[int, deque[QueuedRequest]] = {lv: deque() for lv in policy.levels}
        self._count = 0
        self._next_seq = 0

    def __len__(self) -> int:
        return self._count

    def level_size(self, level: int) -> int:
        """Requests queued at ``level`` (timed-out delayed ones included)."""
        return len(self._ready[level]) + len(self._delayed[level])

    def add(self, request: QueuedRequest) -> None:
        """Queue ``request`` (its ``arrival_ns`` already set); sets its level, deadline and seq.

        Raises:
            ResourceExhaustedError: its level holds ``max_queue_size`` requests already.
        """
        level = self.policy.level_of(request.priority)
        rule = self.policy.policy(level)
        if self.level_size(level) >= rule.max_queue_size:
            raise ResourceExhaustedError(
                f"model {self.model!r}: queue full ({rule.max_queue_size} requests queued at priority level "
                f"{level}); retry later"
            )
        timeout_us = rule.timeout_us(request.timeout_us)
        request.level = level
        request.deadline_ns = request.arrival_ns + timeout_us * 1000 if timeout_us else None
        request.seq = self._next_seq
        self._next_seq += 1
        self._ready[level].append(request)
        self._count += 1

    def admit_alone(self, request: QueuedRequest) -> bool:
        """Whether ``request`` goes at once as a batch of its own because nothing is queued and
        the rule sends it without waiting (no dynamic batching; its size is a preferred size or
        reaches the largest one, ``max_batch_size`` when none is given; or no queue delay):
        then it gets its level, deadline and seq as :meth:`add` gives them, without being
        queued, and the caller dispatches it. ``False``: nothing changed; :meth:`add` it."""
        if self._count:
            return False
        policy = self.policy
        if policy.dynamic and policy.max_queue_delay_us:
            preferred = policy.preferred_batch_sizes
            size = request.batch_size
            if size not in preferred and size < (preferred[-1] if preferred else policy.max_batch_size):
                return False
        level = policy.level_of(request.priority)
        timeout_us = policy.policy(level).timeout_us(request.timeout_us)
        request.level = level
        request.deadline_ns = request.arrival_ns + timeout_us * 1000 if timeout_us else None
        request.seq = self._next_seq
        self._next_seq += 1
        return True

    def _order(self) -> Iterator[QueuedRequest]:
        for level in self.policy.levels:
            yield from self._ready[level]
            yield from self._delayed[level]

    def expire(self, now_ns: int) -> list[QueuedRequest]:
        """Apply the timeout action to every request whose deadline is ``<= now_ns``.

        ``REJECT``: removed and returned (the caller answers them). ``DELAY``: moved behind its
        level's requests that have not timed out (its deadline cleared); not returned.
        Cancelled requests (their future cancelled by the caller) are removed and returned too.
        """
        out: list[QueuedRequest] = []
        for level, ready in self._ready.items():
            if not any(r.future.cancelled() or (r.deadline_ns is not None and r.deadline_ns <= now_ns) for r in ready):
                continue
            keep: deque[QueuedRequest] = deque()
            for r in ready:
                if r.future.cancelled():
                    out.append(r)
                elif r.deadline_ns is not None and r.deadline_ns <= now_ns:
                    if self.policy.policy(level).timeout_action == "DELAY":
                        r.deadline_ns = None
                        self._delayed[level].append(r)
                    else:
                        out.append(r)
                else:
                    keep.append(r)
            self._ready[level] = keep
        for level, delayed in self._delayed.items():
            if any(r.future.cancelled() for r in delayed):
                out += [r for r in delayed if r.future.cancelled()]
                self._delayed[level] = deque(r for r in delayed if not r.future.cancelled())
        self._count -= len(out)
        return out

    def next_deadline_ns(self) -> int | None:
        """The earliest deadline among queued requests, or ``None``."""
        deadlines = [r.deadline_ns for q in self._ready.values() for r in q if r.deadline_ns is not None]
        return min(deadlines) if deadlines else None

    def form(self, now_ns: int, *, flush: bool = False) -> tuple[list[QueuedRequest], int | None]:
        """Take the next batch if it should go now (call :meth:`expire` first).

        Args:
            now_ns: the current time.
            flush: send whatever can be batched now, without waiting for the queue delay
                (used while draining).

        Returns:
            ``(batch, wake_ns)``: a non-empty batch (removed from the queue) and ``None``; or an
            empty list and when to look again (``None`` = only when a request arrives).
        """
        order = self._order()
        first = next(order, None)
        if first is None:
            return [], None
        if not self.policy.dynamic:
            return self._take(1), None
        mbs = self.policy.max_batch_size
        preferred = self.policy.preferred_batch_sizes
        max_preferred = preferred[-1] if preferred else mbs
        key = first.shape_key() if self.check_shapes else None
        count, size, best, full = 1, first.batch_size, 0, False
        if size in preferred:
            best = 1
        for r in order:
            if size + r.batch_size > max_preferred and not best:
                best = count  # cannot grow past the largest preferred size: this is the batch
            if size + r.batch_size > mbs or (key is not None and r.shape_key() != key):
                full = True
                break
            count += 1
            size += r.batch_size
            if size in preferred:
                best = count
        delay_ns = self.policy.max_queue_delay_us * 1000
        oldest_ns = min(r.arrival_ns for r in self._peek(count))
        delay_passed = delay_ns > 0 and now_ns - oldest_ns >= delay_ns
        if best and not delay_passed:
            return self._take(best), None
        if full or size >= max_preferred or delay_passed or delay_ns == 0 or flush:
            return self._take(count), None
        return [], oldest_ns + delay_ns

    def _peek(self, n: int) -> list[QueuedRequest]:
        out: list[QueuedRequest] = []
        for r in self._order():
            if len(out) == n:
                break
            out.append(r)
        return out

    def _take(self, n: int) -> list[QueuedRequest]:
        out: list[QueuedRequest] = []
        for level in self.policy.levels:
            for q in (self._ready[level], self._delayed[level]):
                while q and len(out) < n:
                    out.append(q.popleft())
        self._count -= len(out)
        return out

    def drain_all(self) -> list[QueuedRequest]:
        """Remove and return every queued request (in queue order)."""
        return self._take(self._count)
