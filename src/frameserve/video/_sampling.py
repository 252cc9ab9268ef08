"""Sampling policies: which decoded frames a :class:`~frameserve.video.VideoSource` returns.

The selection logic is a pure function of (display index, exact presentation time), kept apart
from decoding so it can be tested on hand-written timestamp lists.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from frameserve.errors import PipelineSpecError

__all__ = ["FrameSelector", "Sampling", "select_indices", "timestamp_targets"]

SamplingKind = Literal["all", "every", "fps", "keyframes", "timestamps"]

_ACCEPTED = (
    '"all" (every frame), "every:N" (frames with index % N == 0, N >= 1), '
    '"fps:R" (R frames per second of stream time, R > 0, e.g. "fps:2.5"), '
    '"keyframes" (key frames only; non-key frames are not decoded), '
    '"timestamps:T1,T2,..." (for each time T >= 0 in seconds on the stream\'s pts clock, the frame '
    'displayed at T, e.g. "timestamps:0.5,1.25,3")'
)


@dataclass(frozen=True)
class Sampling:
    """Which frames to return.

    Attributes:
        kind: ``"all"``; ``"every"`` (index % n == 0); ``"fps"`` (``rate`` frames per second on the
            stream's pts timeline: ticks at ``t0 + k / rate``, ``t0`` the first frame's pts; for each
            tick the first frame at or after it is returned, once even if it covers several ticks);
            ``"keyframes"`` (only key frames are decoded and returned); ``"timestamps"`` (for each
            time ``t`` in ``times``, the frame displayed at ``t``: the last frame whose
            ``pts_s <= t``, or the first frame when ``t`` is before it; no frame when ``t`` is
            at or after the end of the last frame's display interval (its ``pts_s`` plus its
            duration), as ``ffmpeg -ss t`` gives none, and the source names such times in its
            warnings; times are on the same clock as ``Frame.pts_s`` — the stream's raw pts, so
            a stream with ``start_s == 1.4`` shows its first frame at 1.4; a frame is returned
            once, in display order, however many times map to it; the source seeks to the key
            frame before a time that is far ahead and decodes forward to the exact frame).
        n: the step for ``"every"`` (>= 1), else ``None``.
        rate: frames per second for ``"fps"`` (> 0, finite), else ``None``.
        times: seconds for ``"timestamps"`` (finite, >= 0, at least one, as given), else ``None``.

    Raises:
        PipelineSpecError: an unknown kind or a missing / out-of-range parameter; the message lists
            the accepted forms.
    """

    kind: SamplingKind
    n: int | None = None
    rate: float | None = None
    times: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("all", "every", "fps", "keyframes", "timestamps"):
            raise PipelineSpecError(f"unknown sampling kind {self.kind!r}; accepted: {_ACCEPTED}")
        if self.kind == "every":
            if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
                raise PipelineSpecError(f"sampling 'every' needs an integer n >= 1, got {self.n!r}")
        elif self.n is not None:
            raise PipelineSpecError(f"sampling {self.kind!r} takes no n (got {self.n!r})")
        if self.kind == "fps":
            if (
                isinstance(self.rate, bool)
                or not isinstance(self.rate, (int, float))
                or not math.isfinite(self.rate)
                or self.rate <= 0
            ):
                raise PipelineSpecError(f"sampling 'fps' needs a finite rate > 0 frames per second, got {self.rate!r}")
            object.__setattr__(self, "rate", float(self.rate))
        elif self.rate is not None:
            raise PipelineSpecError(f"sampling {self.kind!r} takes no rate (got {self.rate!r})")
        if self.kind == "timestamps":
            times = self.times
            if (
                times is None
                or isinstance(times, (str, bytes))
                or len(times) == 0
                or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) for t in times)
            ):
                raise PipelineSpecError(
                    f"sampling 'timestamps' needs one or more finite times in seconds, got {times!r}"
                )
            negative = [t for t in times if t < 0]
            if negative:
                listed = ", ".join(repr(float(t)) for t in negative)
                raise PipelineSpecError(
                    f"sampling 'timestamps' got negative time(s) {listed}; times are seconds >= 0 on "
                    'the stream\'s pts clock (e.g. "timestamps:0,0.5,2")'
                )
            object.__setattr__(self, "times", tuple(float(t) for t in times))
        elif self.times is not None:
            raise PipelineSpecError(f"sampling {self.kind!r} takes no times (got {self.times!r})")

    @classmethod
    def parse(cls, text: str) -> Sampling:
        """Parse ``"all"``, ``"every:N"``, ``"fps:R"``, ``"keyframes"`` or ``"timestamps:T1,T2,..."``
        (case and spaces ignored; times in seconds, comma-separated).

        Raises:
            PipelineSpecError: anything else; the message lists the accepted forms.
        """
        if not isinstance(text, str):
            raise PipelineSpecError(f"sampling must be a string, got {text!r}; accepted: {_ACCEPTED}")
        s = text.strip().lower()
        head, sep, arg = s.partition(":")
        head, arg = head.strip(), arg.strip()
        if not sep and head in ("all", "keyframes"):
            return cls(head)  # type: ignore[arg-type]
        if sep and head == "every":
            try:
                n = int(arg)
            except ValueError:
                n = None
            if n is not None and n >= 1:
                return cls("every", n=n)
        if sep and head == "fps":
            try:
                rate = float(arg)
            except ValueError:
                rate = math.nan
            if math.isfinite(rate) and rate > 0:
                return cls("fps", rate=rate)
        if sep and head == "timestamps":
            try:
                times = tuple(float(part) for part in arg.split(","))
            except ValueError:
                times = ()
            if times and all(math.isfinite(t) for t in times):
                return cls("timestamps", times=times)
        raise PipelineSpecError(f"bad sampling {text!r}; accepted: {_ACCEPTED}")

    def __str__(self) -> str:
        if self.kind == "every":
            return f"every:{self.n}"
        if self.kind == "fps":
            return f"fps:{self.rate:g}"
        if self.kind == "timestamps":
            assert self.times is not None
            return "timestamps:" + ",".join(repr(t) for t in self.times)
        return self.kind


class FrameSelector:
    """Decides, frame by frame in display order, whether a frame is returned.

    Call :meth:`select` once per decoded frame, in display order, with the frame's 0-based display
    index and its exact presentation time in seconds (``Fraction(pts) * time_base``). Exact
    arithmetic keeps ``fps:R`` from drifting on rates such as 30000/1001.

    For ``"keyframes"`` every frame offered is selected: the decoder already skips non-key frames.
    For ``"timestamps"`` too: which frame is displayed at ``t`` depends on the *next* frame's time,
    so the choice is made up front from all the stream's timestamps (:func:`timestamp_targets`) and
    the source offers only those frames.
    """

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        # "fps:29.97" means exactly 2997/100, not the nearest binary float.
        self._rate = Fraction(repr(sampling.rate)) if sampling.rate is not None else None
        self._t0: Fraction | None = None
        self._next_tick = 0  # index k of the next tick t0 + k / rate not yet served

    def select(self, index: int, pts_s: Fraction) -> bool:
        """Whether the frame at display ``index`` with time ``pts_s`` (seconds) is returned."""
        kind = self.sampling.kind
        if kind in ("all", "keyframes", "timestamps"):
            return True
        if kind == "every":
            assert self.sampling.n is not None
            return index % self.sampling.n == 0
        assert self._rate is not None
        if self._t0 is None:
            self._t0 = pts_s
        elapsed = pts_s - self._t0
        if elapsed < self._next_tick / self._rate:
            return False
        # this frame serves every tick up to its own time; the next one is strictly after it
        self._next_tick = math.floor(elapsed * self._rate) + 1
        return True


def select_indices(
    sampling: Sampling, pts_s: Iterable[Fraction | int | float], *, end_s: Fraction | float | None = None
) -> list[int]:
    """The display indices selected from a sequence of presentation times (display order).

    A convenience over :class:`FrameSelector` for planning and tests; ``pts_s`` in seconds
    (floats are converted exactly with ``Fraction``). ``end_s``: for ``"timestamps"``, where the
    last frame's display interval ends (see :func:`timestamp_targets`).
    """
    if sampling.kind == "timestamps":
        times = [Fraction(t) for t in pts_s]
        return sorted({i for i in timestamp_targets(sampling, times, end_s=end_s) if i is not None})
    selector = FrameSelector(sampling)
    return [i for i, t in enumerate(pts_s) if selector.select(i, Fraction(t))]


def timestamp_targets(
    sampling: Sampling, pts_s: Sequence[Fraction], *, end_s: Fraction | float | None = None
) -> list[int | None]:
    """For each time of a ``"timestamps"`` sampling, the display index of the frame shown then.

    Args:
        sampling: a ``"timestamps"`` sampling.
        pts_s: every frame's exact presentation time in seconds, sorted (display order).
        end_s: where the last frame's display interval ends, seconds: its ``pts_s`` plus its
            duration (``[pts_s[-1], end_s)``); ``None`` when not known, the last frame then
            being taken as displayed for ever.

    Returns:
        One entry per requested time, in the order given: the display index of the last frame
        with ``pts_s <= t`` (0 when ``t`` is before the first frame), or ``None`` when
        ``t >= end_s`` (past the end: no frame is displayed then). Empty when ``pts_s`` is.
    """
    assert sampling.kind == "timestamps" and sampling.times is not None
    if not pts_s:
        return []
    end = Fraction(end_s) if end_s is not None else None
    targets: list[int | None] = []
    for t in sampling.times:
        # "0.1" means exactly 1/10, not the nearest binary float.
        exact = Fraction(repr(t))
        if end is not None and exact >= end and exact > pts_s[-1]:
            targets.append(None)
        else:
            targets.append(max(bisect_right(pts_s, exact) - 1, 0))
    return targets
