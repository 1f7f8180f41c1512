"""A long-poll runner's lease on its runs: how long they stay its own without an answer.

The coordinator declares a runner lost once it has not heard from it for its lost
threshold (``lost_after_s``, told at registration), and gives its runs to other runners.
The runner counts the same silence from its side, from when it sent the last registration,
heartbeat or claim that was answered (the coordinator heard it no earlier; a claim writes
the runner's heartbeat), and stops its work a
margin before the lease ends — the time stopping takes (SIGTERM, grace, SIGKILL), at most
a third of the threshold — so that a run never goes on here while another runner starts
it again. The WebSocket runner keeps the same lease in ``corral.protocol.runner``.

Pure: the caller passes the time (``time.monotonic()``) and acts on what it is told.
"""

from __future__ import annotations

# An answer to a heartbeat is awaited at least this long (a loaded coordinator is slow).
MIN_ANSWER_WAIT_S = 1.0
MIN_RETRY_S = 0.1


class Lease:
    def __init__(self, stop_margin_s: float) -> None:
        self.stop_margin_s = stop_margin_s
        self.threshold_s: float | None = None  # unknown: no lease is kept (an old coordinator)
        self.heard_at: float | None = None
        self.lapsed = False  # it ran out, and nothing was answered since

    def heard(self, sent_at: float) -> None:
        """A registration, a heartbeat or a claim sent at ``sent_at`` was answered."""
        if self.heard_at is None or sent_at > self.heard_at:
            self.heard_at = sent_at
            self.lapsed = False

    @property
    def lease_s(self) -> float | None:
        if self.threshold_s is None:
            return None
        return self.threshold_s - min(self.stop_margin_s, self.threshold_s / 3)

    def ends_at(self) -> float | None:
        """When the work must be stopped, unless an answer comes first (None: no lease
        running)."""
        if self.lease_s is None or self.heard_at is None or self.lapsed:
            return None
        return self.heard_at + self.lease_s

    def lapse(self, now: float) -> bool:
        """True once when the lease has run out: stop the work now."""
        ends_at = self.ends_at()
        if ends_at is None or now < ends_at:
            return False
        self.lapsed = True
        return True

    def answer_wait_s(self) -> float | None:
        """How long to wait for the answer to a heartbeat: a request hanging on a dead
        connection must not outlast half the lease (None: the client's default)."""
        lease_s = self.lease_s
        return None if lease_s is None else max(MIN_ANSWER_WAIT_S, lease_s / 2)

    def retry_in(self, now: float, backoff_s: float) -> float:
        """The wait before trying again: the backoff, but at most a quarter of the lease
        left, so that attempts fit inside it."""
        ends_at = self.ends_at()
        if ends_at is None:
            return backoff_s
        return min(backoff_s, max(MIN_RETRY_S, (ends_at - now) / 4))
