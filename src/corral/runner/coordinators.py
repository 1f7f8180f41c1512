"""The coordinators a runner may reach, and which one it tries next.

``--coordinator`` gives one URL or several (commas). A URL whose host is a name that
resolves to several addresses — one A (or AAAA) record per coordinator, as a headless
Kubernetes service or a round-robin DNS name gives — stands for one coordinator per
address. A round is every URL in the order given, a name's addresses in its place; the
runner talks to one until it fails (or says it is leaving), then to the next. Once a round
is through, the names are resolved again, so that coordinators added or removed are
followed; while the resolver fails, a name keeps the addresses it last had.

Each runner process starts a name's addresses at an offset of its own (random): runners
given one name spread over its coordinators instead of all taking the first.

A transport connects to the address and still names the coordinator in what it sends (the
Host header; for https the TLS server name, which the certificate is checked against): a
coordinator behind a name answers as it does to the name itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from corral.client.coordinators import check_url

log = logging.getLogger("corral.runner")
# A resolver that does not answer by then is taken as failed (the name keeps the addresses
# it last had): the connection attempt after it has its own timeout to spend.
RESOLVE_TIMEOUT_S = 5.0

# A host name → its addresses; raises OSError when it cannot say.
Resolve = Callable[[str], Awaitable[Sequence[str]]]


async def resolve_host(host: str) -> list[str]:
    """The addresses of ``host`` by the system's resolver (in a thread: it blocks)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True, eq=False)
class Coordinator:
    """One coordinator to try: its URL as given, and the address to connect to when the
    URL's name stands for several (None: the URL's host, resolved as it connects).
    Compared by identity: the same address in two rounds is two tries."""

    url: str
    address: str | None = None

    def __str__(self) -> str:
        return self.url if self.address is None else f"{self.url} at {self.address}"


class Coordinators:
    def __init__(
        self,
        urls: Sequence[str],
        *,
        resolve: Resolve = resolve_host,
        rng: random.Random | None = None,
    ) -> None:
        self.urls = tuple(check_url(url) for url in urls)  # ValueError: one no connection can use
        self._resolve = resolve
        self._offset = (rng or random.Random()).randrange(1 << 30)  # modulo a name's count
        self._known: dict[str, tuple[str, ...]] = {}  # a name's coordinators, last resolved
        self._round: list[Coordinator] = []
        self._turn = 0
        self._starting = asyncio.Lock()  # one resolution for calls that find a round through

    def __len__(self) -> int:
        """How many coordinators the current round has (before the first: the URLs)."""
        return len(self._round) or len(self.urls)

    async def current(self) -> Coordinator:
        """The coordinator to talk to now: the round's current one, or once the round is
        through, the first of the next (its names resolved again)."""
        async with self._starting:
            if self._turn >= len(self._round):
                self._round = [c for url in self.urls for c in await self._expand(url)]
                self._turn = 0
            return self._round[self._turn]

    def move_on(self, failed: Coordinator) -> None:
        """The next one — unless a call that also failed on ``failed`` moved on already (a
        poll and a control call cut at once must not move twice, skipping one)."""
        if self._turn < len(self._round) and self._round[self._turn] is failed:
            self._turn += 1

    async def _expand(self, url: str) -> list[Coordinator]:
        """The coordinators ``url`` stands for, this runner's first first."""
        host = urlsplit(url).hostname
        if host is None or _is_address(host):
            return [Coordinator(url)]
        try:
            found = await asyncio.wait_for(self._resolve(host), RESOLVE_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            addresses = self._known.get(host, ())
            kept = f"keeping {', '.join(addresses)}" if addresses else "connecting by its name"
            log.warning("cannot resolve %s (%r): %s", host, exc, kept)
        else:
            addresses = one_per_coordinator(found)
            if addresses != self._known.get(host, ()):
                log.info("coordinators at %s: %s", host, ", ".join(addresses) or "one")
            self._known[host] = addresses
        if not addresses:
            return [Coordinator(url)]
        start = self._offset % len(addresses)
        return [Coordinator(url, a) for a in addresses[start:] + addresses[:start]]


def one_per_coordinator(addresses: Iterable[str]) -> tuple[str, ...]:
    """The addresses of a name that stand for one coordinator each: its IPv4 ones if it has
    several, else its IPv6 ones if several; none when it names one host (an address of each
    family, as ``localhost``: reached by its name as before, the system trying both).
    Sorted: resolvers rotate records, and a runner's offset must keep to one address."""
    unique = sorted(set(addresses))
    v4 = tuple(a for a in unique if ":" not in a)
    v6 = tuple(a for a in unique if ":" in a)
    return v4 if len(v4) > 1 else v6 if len(v6) > 1 else ()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
