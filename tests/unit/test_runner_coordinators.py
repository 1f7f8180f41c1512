"""Which coordinator a runner tries next (``corral.runner.coordinators``): a name that
resolves to several addresses stands for one coordinator per address, resolved again each
round; IP literals and names of one host are taken as they are. The resolver is a table
the test changes between rounds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import httpx
import pytest

from corral.runner import coordinators as module
from corral.runner.coordinators import Coordinator, Coordinators, one_per_coordinator
from corral.runner.link import HttpLink, LinkDown

pytestmark = pytest.mark.anyio
URL = "http://corral.test:8765"


class Table:
    """A resolver: ``records[name]`` (a name missing from it fails as an unknown one)."""

    def __init__(self, **records: Sequence[str]) -> None:
        self.records = {name.replace("_", "."): list(a) for name, a in records.items()}
        self.asked: list[str] = []

    async def __call__(self, host: str) -> Sequence[str]:
        self.asked.append(host)
        if host not in self.records:
            raise OSError(f"{host}: unknown name")
        return self.records[host]


async def tried(coordinators: Coordinators, count: int) -> list[str]:
    """Where ``count`` tries go, each failing: the address, or the URL for one by name."""
    out: list[str] = []
    for _ in range(count):
        coordinator = await coordinators.current()
        out.append(coordinator.address or coordinator.url)
        coordinators.move_on(coordinator)
    return out


async def test_each_address_of_a_name_is_a_coordinator_and_changed_records_are_followed() -> None:
    table = Table(corral_test=["10.0.0.2", "10.0.0.1"])
    coordinators = Coordinators([URL], resolve=table, rng=random.Random(0))
    first = await tried(coordinators, 2)
    assert sorted(first) == ["10.0.0.1", "10.0.0.2"] and len(coordinators) == 2
    assert table.asked == ["corral.test"]  # once a round, not once a try
    table.records["corral.test"] = ["10.0.0.3", "10.0.0.1", "10.0.0.2"]  # one added
    assert sorted(await tried(coordinators, 3)) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert len(coordinators) == 3
    table.records["corral.test"] = ["10.0.0.3", "10.0.0.1"]  # one removed
    assert sorted(await tried(coordinators, 2)) == ["10.0.0.1", "10.0.0.3"]
    assert table.asked == ["corral.test"] * 3


async def test_a_runner_stays_with_a_coordinator_until_it_fails() -> None:
    coordinators = Coordinators([URL], resolve=Table(corral_test=["10.0.0.1", "10.0.0.2"]))
    one = await coordinators.current()
    assert await coordinators.current() is one
    coordinators.move_on(one)
    two = await coordinators.current()
    assert two.address != one.address
    coordinators.move_on(one)  # a second call cut on the first: already moved on
    assert await coordinators.current() is two


async def test_runners_start_at_offsets_of_their_own() -> None:
    """Every order of the round is the sorted one turned by the runner's offset; across
    runners, each address comes first for some."""
    addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    firsts = set()
    for seed in range(32):
        table = Table(corral_test=random.Random(seed).sample(addresses, 3))  # any order
        order = await tried(Coordinators([URL], resolve=table, rng=random.Random(seed)), 3)
        start = addresses.index(order[0])
        assert order == addresses[start:] + addresses[:start]
        firsts.add(order[0])
    assert firsts == set(addresses)
    # Given no rng, each runner draws its own offset.
    table = Table(corral_test=addresses)
    assert (
        len({(await Coordinators([URL], resolve=table).current()).address for _ in range(64)}) > 1
    )


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8765", "http://[::1]:8765", "https://[2001:db8::7]/corral"]
)
async def test_an_ip_literal_is_one_coordinator_and_never_resolved(url: str) -> None:
    table = Table()
    coordinators = Coordinators([url], resolve=table)
    assert await tried(coordinators, 3) == [url] * 3
    assert table.asked == []


@pytest.mark.parametrize(
    "records",
    [
        ["10.0.0.1"],
        ["10.0.0.1", "10.0.0.1"],  # the same record twice (two socket types, two answers)
        ["127.0.0.1", "::1"],  # one host by both families: localhost
        [],
    ],
)
async def test_a_name_of_one_host_is_reached_by_its_name(records: list[str]) -> None:
    coordinators = Coordinators([URL], resolve=Table(corral_test=records))
    coordinator = await coordinators.current()
    assert (coordinator.url, coordinator.address) == (URL, None)


def test_addresses_of_the_family_with_several_are_the_coordinators() -> None:
    assert one_per_coordinator(["10.0.0.2", "fd00::1", "10.0.0.1", "fd00::2"]) == (
        "10.0.0.1",
        "10.0.0.2",
    )
    assert one_per_coordinator(["fd00::2", "10.0.0.1", "fd00::1"]) == ("fd00::1", "fd00::2")


async def test_a_comma_list_mixing_names_and_addresses_keeps_its_order() -> None:
    table = Table(a_test=["10.0.0.1", "10.0.0.2"], b_test=["10.0.1.1"])
    urls = ["http://a.test:1", "http://127.0.0.9:2", "http://b.test:3"]
    coordinators = Coordinators(urls, resolve=table, rng=random.Random(0))
    assert len(coordinators) == 3  # before the first round: the URLs
    round_ = await tried(coordinators, 4)
    assert sorted(round_[:2]) == ["10.0.0.1", "10.0.0.2"]
    assert round_[2:] == ["http://127.0.0.9:2", "http://b.test:3"]
    assert len(coordinators) == 4


async def test_a_name_keeps_its_last_addresses_while_the_resolver_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = Table(corral_test=["10.0.0.1", "10.0.0.2"])
    coordinators = Coordinators([URL], resolve=table)
    assert sorted(await tried(coordinators, 2)) == ["10.0.0.1", "10.0.0.2"]
    del table.records["corral.test"]  # the resolver fails
    assert sorted(await tried(coordinators, 2)) == ["10.0.0.1", "10.0.0.2"]

    async def silent(host: str) -> Sequence[str]:
        await asyncio.Event().wait()  # never answers
        raise AssertionError

    monkeypatch.setattr(module, "RESOLVE_TIMEOUT_S", 0.01)
    coordinators._resolve = silent
    assert sorted(await tried(coordinators, 2)) == ["10.0.0.1", "10.0.0.2"]
    # Never resolved: the name as it is.
    assert await tried(Coordinators([URL], resolve=Table()), 1) == [URL]


async def test_concurrent_calls_resolve_once_for_a_new_round() -> None:
    table = Table(corral_test=["10.0.0.1", "10.0.0.2"])
    coordinators = Coordinators([URL], resolve=table)
    got = await asyncio.gather(*(coordinators.current() for _ in range(5)))
    assert len({id(c) for c in got}) == 1 and table.asked == ["corral.test"]


@pytest.mark.parametrize("addresses", [["10.0.0.1", "10.0.0.2"], ["fd00::1", "fd00::2"]])
async def test_the_long_poll_link_connects_to_the_address_and_names_the_coordinator(
    addresses: list[str],
) -> None:
    """Host header and TLS server name (httpx's ``sni_hostname``) stay the URL's name; a
    call that fails there moves the link to the other address."""
    seen: list[tuple[str, str, object]] = []

    async def coordinator(request: httpx.Request) -> httpx.Response:
        seen.append(
            (request.url.host, request.headers["host"], request.extensions.get("sni_hostname"))
        )
        if len(seen) == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"abandon": []})

    client = httpx.AsyncClient(transport=httpx.MockTransport(coordinator))
    table = Table(corral_test=addresses)
    link = HttpLink("https://corral.test:8443/", client=client, resolve=table)
    with pytest.raises(LinkDown):
        await link.heartbeat("rnr_1", [])  # type: ignore[arg-type]
    assert await link.heartbeat("rnr_1", []) == []  # type: ignore[arg-type]
    assert sorted(host for host, _, _ in seen) == addresses
    assert {(name, sni) for _, name, sni in seen} == {("corral.test:8443", "corral.test")}
    await client.aclose()


def test_a_coordinator_says_where_it_is_reached() -> None:
    assert str(Coordinator(URL)) == URL
    assert str(Coordinator(URL, "10.0.0.1")) == f"{URL} at 10.0.0.1"
