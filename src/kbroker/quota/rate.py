"""SampledRate: Kafka's ``Rate`` over a ``WindowedSum`` — the measure client quotas bound.

Kafka: ``org.apache.kafka.common.metrics.stats.{Rate, SampledStat, WindowedSum}`` with the
``MetricConfig`` a quota sensor gets (``quota.window.num`` samples of
``quota.window.size.seconds`` each). Values are summed into samples; a sample is complete
once it is a window old, and recording then moves to the next of ``samples + 1`` slots (one
extra for the sample that overlaps the start of the monitored window). Samples with no
event for ``samples`` windows are reset before measuring. The rate is the sum over the
samples divided by the elapsed time since the oldest sample, counted as at least
``samples - 1`` full windows (so a burst right after start-up is not measured over a few
milliseconds) and at least 1 ms.

Consequence (Kafka's too, checked against its Rate/SampledStat line by line): a client that
always has more to send gets (samples - 1) windows' worth of its quota at once whenever the
oldest sample expires (the remaining samples are young, so the window is counted as
samples - 1 windows), and is throttled until that sample expires in turn: a sawtooth of period
about samples x window. Over L seconds a greedy client's average is off by up to
(samples - 1) x window / L (11 x 1 s over 30 s: +-33%); it is accurate to a few % only over
many periods or with few samples (tests/broker/test_quota_accuracy.py, bench/quotas.py).

Not thread-safe: the owner (a quota sensor) serialises calls.
"""
from __future__ import annotations

__all__ = ["SampledRate"]


class _Sample:
    __slots__ = ("value", "event_count", "start_ms", "last_event_ms")

    def __init__(self, now_ms: int):
        self.reset(now_ms)

    def reset(self, now_ms: int) -> None:
        self.value = 0.0
        self.event_count = 0
        self.start_ms = now_ms
        self.last_event_ms = now_ms


class SampledRate:
    """A rate per second of recorded values over ``samples`` windows of ``window_ms``."""

    __slots__ = ("samples", "window_ms", "_samples", "_current")

    def __init__(self, samples: int, window_ms: int):
        if samples < 1 or window_ms < 1:
            raise ValueError("samples and window_ms must be at least 1")
        self.samples = samples
        self.window_ms = window_ms
        self._samples: list[_Sample] = []
        self._current = 0

    def _current_sample(self, now_ms: int) -> _Sample:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return self._samples[self._current]

    def record(self, value: float, now_ms: int) -> None:
        s = self._current_sample(now_ms)
        if now_ms - s.start_ms >= self.window_ms:
            self._current = (self._current + 1) % (self.samples + 1)
            if self._current >= len(self._samples):
                s = _Sample(now_ms)
                self._samples.append(s)
            else:
                s = self._samples[self._current]
                s.reset(now_ms)
        s.value += value
        s.event_count += 1
        s.last_event_ms = now_ms

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        for s in self._samples:
            if now_ms - s.last_event_ms >= expire:
                s.reset(now_ms)

    def window_size_ms(self, now_ms: int) -> int:
        """The elapsed time the rate divides by (Kafka's ``Rate.windowSize``)."""
        self._purge(now_ms)
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        oldest = min(s.start_ms for s in self._samples)
        elapsed = now_ms - oldest
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def measure(self, now_ms: int) -> float:
        """Recorded units per second over the monitored window."""
        window = self.window_size_ms(now_ms)
        return sum(s.value for s in self._samples) / (window / 1000.0)
