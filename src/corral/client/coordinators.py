"""The coordinators a client may talk to, which one it talks to now, and when a request
that failed may go to another one; without I/O (``Client`` and ``AsyncClient`` send).

A client is given one coordinator URL or several (a list, or one string with commas, as
``CORRAL_URL`` and ``--url`` give them): coordinators on one database, any of which serves
any client. It talks to the one that last answered (at first, the first) and moves on to
the next when a request cannot reach it. A request goes to the next coordinator only when
sending it twice cannot do a thing twice:

* the connection was never made (refused, no route, timed out connecting): the request
  never left, so any request may;
* the coordinator answered ``coordinator_leaving`` (503): it says it did nothing;
* the request failed after it was sent (the connection cut before the answer, a read
  timeout): a read (``GET``) may, and so may a request that creates runs, which carries an
  ``Idempotency-Key`` (sent again, it gets the runs it created: ``Call.idempotency_key``),
  and a write that sent twice does no more than once (a plan ensured, its tasks added,
  started, stopped, paused or resumed; a run or a task cancelled, a runner drained or
  stopped, a token revoked: ``Call.repeatable``); any other write's outcome is unknown (a
  task's retry: it would make another attempt): the client raises ``outcome_unknown``, for
  its caller to look before trying again.

A followed stream (a run's log, the event stream) cut or ended early goes on at the next
coordinator from the last id it passed on. With one URL nothing of this applies: a failure
is raised as it always was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from corral import errors
from corral.client import calls
from corral.client.calls import Call

# Failures that prove the request never reached a coordinator.
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Methods that change nothing, so that a request sent twice does nothing twice.
READS = frozenset({"GET", "HEAD", "OPTIONS"})


def check_url(url: str) -> str:
    """``url`` stripped, if a connection could use it as a coordinator's; else ValueError
    saying why (``127.0.0.1:8765`` alone: with the URL it probably means)."""
    text = url.strip()
    parts = urlsplit(text)
    if not (parts.scheme in ("http", "https") and parts.netloc):
        raise ValueError(f"{text!r} is not an http(s) URL; did you mean http://{text}?")
    try:
        # What a connection would trip on, said now: a port out of range, a host name
        # no resolver takes (an empty label, one over 63 characters).
        parts.port  # noqa: B018 (read for its check)
        (parts.hostname or "").encode("idna")
    except ValueError as exc:  # UnicodeError is one
        raise ValueError(f"{text!r} is not a valid URL: {exc}") from None
    return text


def split_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """``"http://a, http://b/"`` or ``["http://a", "http://b"]`` → ``("http://a", "http://b")``,
    each checked (``check_url``)."""
    items = urls.split(",") if isinstance(urls, str) else urls
    found = tuple(check_url(u).rstrip("/") for u in items if u.strip())
    if not found:
        raise ValueError("no coordinator URL given")
    return found


class Coordinators:
    """The URLs, and the one talked to now. Clients made for one caller may share one
    (the MCP server makes a client per tool call): each starts where the last moved to."""

    def __init__(self, urls: str | Sequence[str]) -> None:
        self.urls = split_urls(urls)
        self._current = 0

    @property
    def current(self) -> str:
        return self.urls[self._current]

    @property
    def several(self) -> bool:
        return len(self.urls) > 1

    def order(self) -> list[str]:
        """Where a request goes: the current coordinator, then each other one once."""
        return [*self.urls[self._current :], *self.urls[: self._current]]

    def answered(self, url: str) -> None:
        """``url`` answered: the next requests go there."""
        self._current = self.urls.index(url)

    def move_on(self, failed: str) -> None:
        """The one after ``failed`` — unless a request that also failed on it moved on
        already (two failing at once must not move twice, skipping one)."""
        if self.current == failed:
            self._current = (self._current + 1) % len(self.urls)

    def refusal(
        self, call: Call[Any], url: str, exc: httpx.TransportError
    ) -> errors.Unavailable | None:
        """The error for ``call`` to ``url`` that failed with ``exc``, or None when it may
        go to the next coordinator (it is moved on to)."""
        if not self.several:
            return errors.Unavailable(f"cannot reach the coordinator at {url}: {exc}")
        resendable = (
            call.method.upper() in READS or call.idempotency_key is not None or call.repeatable
        )
        if not resendable and not isinstance(exc, NEVER_SENT):
            return errors.Unavailable(
                f"lost the coordinator at {url} after sending {call.method} {call.path} "
                f"({exc}): it may have been done, so it is not sent to another coordinator; "
                "look before trying again",
                code="outcome_unknown",
            )
        self.move_on(url)
        return None

    def none_answered(self, failures: Sequence[tuple[str, object]]) -> errors.Unavailable:
        tried = "; ".join(f"{url}: {why}" for url, why in failures)
        return errors.Unavailable(f"cannot reach any coordinator ({tried})")


class Sending:
    """One call's way through the coordinators: the URLs to send it to in turn, the
    request for each, and what each outcome means (``Client._send`` and
    ``AsyncClient._send`` do the sending, each with its own HTTP client)."""

    def __init__(self, coordinators: Coordinators, call: Call[Any]) -> None:
        self.coordinators = coordinators
        self.call = call
        self.urls = coordinators.order()
        self.body: Any = None  # the decoded answer, once ``answered``
        self._failures: list[tuple[str, object]] = []

    def request(self, url: str) -> dict[str, Any]:
        """The arguments of httpx's ``request`` that send the call to ``url``."""
        call = self.call
        return {
            "method": call.method,
            "url": url + call.path,
            "params": call.params or None,
            "json": call.body,
            "headers": call.headers,
        }

    def failed(self, url: str, exc: httpx.TransportError) -> None:
        """It did not reach ``url``, or its answer did not come: raises what the caller
        gets, unless it may go to the next coordinator (``Coordinators.refusal``)."""
        refusal = self.coordinators.refusal(self.call, url, exc)
        if refusal is not None:
            raise refusal from exc
        self._failures.append((url, exc))

    def answered(self, url: str, response: httpx.Response) -> bool:
        """``url``'s answer decoded into ``body`` (an error answer raised); False when
        the coordinator said it is leaving and there is another to go on at."""
        try:
            self.body = calls.decode(response)
        except errors.CoordinatorLeaving as exc:
            if not self.coordinators.several:
                raise
            self.coordinators.move_on(url)
            self._failures.append((url, exc.message))
            return False
        self.coordinators.answered(url)
        return True

    def none_answered(self) -> errors.Unavailable:
        return self.coordinators.none_answered(self._failures)


class Following:
    """A followed stream's way through the coordinators. A stream cut, or not opened,
    goes on at the next coordinator until every one in turn has failed (one URL: it is
    raised at once, as before); one that opened starts that count again, so a stream lives
    through any number of coordinators stopping one at a time. A stream a coordinator
    closed early (it is stopping) goes on at the next too, unless that happened on every
    one in turn with nothing passed on: then it ends, as with one URL, for the caller to
    look (a coordinator closing every stream at once must not keep it spinning)."""

    def __init__(self, coordinators: Coordinators) -> None:
        self.coordinators = coordinators
        self._failures: list[tuple[str, object]] = []
        self._early_ends = 0

    def opened(self, url: str) -> None:
        self.coordinators.answered(url)
        self._failures.clear()

    def passed(self) -> None:
        """An item of the stream was passed on."""
        self._early_ends = 0

    def lost(self, url: str, exc: httpx.TransportError) -> errors.Unavailable | None:
        """The error to raise for a stream cut or not opened, or None: go on at the next."""
        if not self.coordinators.several:
            return errors.Unavailable(f"lost the coordinator at {url}: {exc}")
        self._failures.append((url, exc))
        self.coordinators.move_on(url)
        if len(self._failures) >= len(self.coordinators.urls):
            return self.coordinators.none_answered(self._failures)
        return None

    def ended_early(self, url: str) -> bool:
        """The coordinator closed the stream before its end: whether to go on at the next
        one (with one URL, no: the stream ends as it always did)."""
        if not self.coordinators.several:
            return False
        self.coordinators.move_on(url)
        self._early_ends += 1
        return self._early_ends < len(self.coordinators.urls)
