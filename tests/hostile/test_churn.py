"""Connection churn: a client that opens and closes streams as fast as it can is held to
the new-streams rate, on a pod (per process) and on a router (per client address and
per API key). The ones over it get HTTP 429 with ``Retry-After`` before the upgrade
(what a Kyutai client reports, as it does a bad key's 401), a real-time neighbour on
the same pod keeps every word, no slot or session is left behind, and the router's
429s are no demand for the pool (only its ``busy`` answers are).

Before: about 450 streams a second opened and closed against a pod by six connections
delayed its neighbour's results by seconds (p50 8.7 s; ``asrpool bench soak``, the
``churn`` phase, measures it; this test asserts outcomes, not times).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from websockets import exceptions as ws_errors
from websockets.asyncio import client as ws_client

from asrpool.common import protocol, waiting
from tests.hostile import conftest
from tests.router import support
from tests.support import kyutai_client, streams

# New streams per second and burst. The router's are lower than the pod's, so that the
# pod never refuses what the router admits (the router would answer that 'busy').
LIMITS = {"pod": (2.0, 4.0), "router": (1.0, 2.0)}
CHURNERS = 40  # opened at once: over the burst many times
NEIGHBOUR = streams.random_speechlike(3.0, seed=8)


@pytest.fixture(scope="module")
def churned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[conftest.Platform]:
    # Refused requests are held a second before their 429: room for every churner.
    flags = {name: ("--new-streams-per-second", str(rate), "--new-streams-burst", str(burst),
                    "--max-connections", str(4 * CHURNERS))
             for name, (rate, burst) in LIMITS.items()}
    with conftest.running(tmp_path_factory.mktemp("churn"), flags["pod"],
                          flags["router"]) as started:
        yield started


@pytest.fixture(params=["pod", "router"])
def endpoint(request: pytest.FixtureRequest, churned: conftest.Platform) -> str:
    """As the package's, on this module's platform."""
    churned.wait_settled()
    return str(request.param)


async def _churn_once(url: str, headers: dict[str, str]) -> tuple[str, Any]:
    """Open a stream and close it at once: ("ready" | an Error code | "http_<status>",
    and for a refusal before the upgrade, its response)."""
    try:
        ws = await ws_client.connect(url, additional_headers=headers, proxy=None,
                                     compression=None, open_timeout=30)
    except ws_errors.InvalidStatus as exc:
        return f"http_{exc.response.status_code}", exc.response
    async with ws:
        first = msgpack.unpackb(await asyncio.wait_for(ws.recv(decode=False), 30))
    return ("ready" if first["type"] == "Ready" else str(first.get("code"))), None


async def _until_refused(url: str, headers: dict[str, str]) -> tuple[str, Any]:
    """Streams one after another until one is refused (at most 50)."""
    for _ in range(50):
        outcome, response = await _churn_once(url, headers)
        if outcome == "http_429":
            break
    return outcome, response


async def _neighbour_beside_churn(platform: conftest.Platform, endpoint: str
                                  ) -> tuple[list[Any], collections.Counter[str], list[Any],
                                             float]:
    """The neighbour's words while CHURNERS streams open and close at once; what the
    churners were answered, the responses of those refused, and how long it took."""
    url, headers = platform.ws_url(endpoint), platform.headers(endpoint)
    opened = await support.connect(url, headers)  # the neighbour's stream comes first
    try:
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        neighbour = asyncio.create_task(support.finish_stream(opened.ws, NEIGHBOUR, 1.0))
        started = time.monotonic()
        answers = await asyncio.gather(*(_churn_once(url, headers) for _ in range(CHURNERS)))
        elapsed = time.monotonic() - started
        words = kyutai_client.words(await neighbour)
    finally:
        await opened.ws.close()
    outcomes = collections.Counter(outcome for outcome, _ in answers)
    return words, outcomes, [response for _, response in answers if response], elapsed


def _refusals(platform: conftest.Platform) -> int:
    client = platform.redis.client()
    try:
        return int(client.zcard(waiting.refusals_key("default")))
    finally:
        client.close()


async def test_churn_is_held_to_the_rate_and_spares_its_neighbour(
        churned: conftest.Platform, endpoint: str) -> None:
    rate, burst = LIMITS[endpoint]
    alone = kyutai_client.words(await support.transcribe(
        churned.ws_url(endpoint), NEIGHBOUR, churned.headers(endpoint)))
    await asyncio.to_thread(churned.wait_settled)
    await asyncio.sleep(burst / rate)  # the buckets fill up again
    demand = _refusals(churned)
    words, outcomes, refused, elapsed = await _neighbour_beside_churn(churned, endpoint)

    assert alone and words == alone  # every word, none lost or changed
    assert sum(outcomes.values()) == CHURNERS
    admitted = CHURNERS - outcomes["http_429"]
    assert admitted <= burst + rate * elapsed, (outcomes, elapsed)  # the neighbour took one
    assert outcomes["http_429"] >= CHURNERS // 2, outcomes
    assert set(outcomes) <= {"ready", "busy", "http_429"}, outcomes
    for response in refused:
        assert int(response.headers["Retry-After"]) >= 1
        assert response.body.decode().startswith(f"too_many_streams: over {rate:g} new streams")
    await asyncio.to_thread(churned.wait_settled)  # no slot, no session left
    if endpoint == "router":  # the 429s are no demand; the busy answers are
        assert _refusals(churned) - demand == outcomes["busy"]


async def test_a_refused_client_is_served_once_it_waits(
        churned: conftest.Platform, endpoint: str) -> None:
    """A refusal takes no token: a client that honours Retry-After gets its stream."""
    url, headers = churned.ws_url(endpoint), churned.headers(endpoint)
    outcome, response = await _until_refused(url, headers)
    assert outcome == "http_429"
    await asyncio.sleep(int(response.headers["Retry-After"]))
    assert (await _churn_once(url, headers))[0] == "ready"


async def test_a_resume_is_no_new_stream(churned: conftest.Platform) -> None:
    """Over the rate, a resume still reaches the pod (its bad token is answered there)."""
    url, headers = churned.ws_url("pod"), churned.headers("pod")
    assert (await _until_refused(url, headers))[0] == "http_429"
    resuming = {**headers, protocol.RESUME_TOKEN_HEADER: "no-such-token"}
    assert (await _churn_once(url, resuming))[0] == "bad_resume_token"


async def test_forged_resumes_are_held_to_the_routers_rate(churned: conftest.Platform) -> None:
    """Over the rate, a resume with a made-up token is 429 at the router as a new
    stream is: it cost a Redis lookup each and passed the limit (before)."""
    url = churned.ws_url("router")
    resuming = {**churned.headers("router"), protocol.RESUME_TOKEN_HEADER: "a.b"}
    outcome, response = await _until_refused(url, resuming)
    assert outcome == "http_429"
    assert response.body.decode().startswith("too_many_streams: over")


def test_pod_and_router_count_their_refusals(churned: conftest.Platform) -> None:
    count = churned.pod.metric('asr_errors_total{code="too_many_streams"}')
    assert count is not None and count > 0
    _, body = support.http_get(churned.router.url + "/metrics")
    assert b'reason="too_many_streams"' in body


async def test_a_pod_over_its_rate_is_no_demand_through_the_router(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A router without a limit of its own in front of a pod with a low one: the
    streams the pod refuses (429 to the router's link) are told `too_many_streams`
    (after the upgrade, as the pod's other refusals are), not `busy`, and count as no
    demand for the pool."""
    pod_flags = ("--new-streams-per-second", "1", "--new-streams-burst", "1")
    with conftest.running(tmp_path_factory.mktemp("pod-rate"), pod_flags,
                          ("--new-streams-per-second", "0")) as plat:
        url, headers = plat.ws_url("router"), plat.headers("router")
        # One after another: the pod's two slots are never all taken, only its rate.
        answers = [await _churn_once(url, headers) for _ in range(4)]
        outcomes = collections.Counter(outcome for outcome, _ in answers)
        assert outcomes["too_many_streams"] >= 1 and outcomes["ready"] >= 1, outcomes
        assert set(outcomes) <= {"ready", "too_many_streams"}, outcomes
        assert _refusals(plat) == 0
        await asyncio.to_thread(plat.wait_settled)
