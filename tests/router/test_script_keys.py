"""Every key a Lua script touches is one its caller gave it in ``KEYS``: what Redis
Cluster needs of a script, and what keeps the Python key builders the only place the
key names are written. A real Redis's ``MONITOR`` shows each command a script runs
(right after the ``EVALSHA`` that ran it), and ``COMMAND GETKEYS`` names its keys."""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis import crc

from asrpool.common import registry
from asrpool.router import admissions, keys, leasing, metrics, scripts, tokens
from tests.router import support
from tests.support.redis_servers import RedisServer

ALL_SCRIPTS = (scripts.ADMIT, scripts.LEAVE_QUEUE, scripts.ATTACH, scripts.RENEW_MANY,
               scripts.RENEW_WHOLE, scripts.RELEASE, scripts.DETACH, scripts.RESUME,
               scripts.KEEP_DETACHED, scripts.KEY_RESERVE, scripts.KEY_HOLD, scripts.KEY_DROP)
# (The pods' heartbeat runs no script: registry's transactions; every_script still runs
# them, so that a Redis Cluster test sees them keep to one slot.)
_ARGUMENT = re.compile(r'"((?:[^"\\]|\\.)*)"')
_STOP = "asrpool-test:stop-monitoring"


class Script:
    """One script call as MONITOR saw it: the keys it was given, the commands it ran."""

    def __init__(self, line: list[str]) -> None:
        self.sha = line[1]
        self.declared = set(line[3 : 3 + int(line[2])])
        self.commands: list[list[str]] = []


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def parse(lines: list[str]) -> list[Script]:
    calls: list[Script] = []
    for line in lines:
        args = [a.encode().decode("unicode_escape") for a in _ARGUMENT.findall(line)]
        if " lua] " in line and calls:
            calls[-1].commands.append(args)
        elif args and args[0].upper() == "EVALSHA":
            calls.append(Script(args))
    return calls


def touched(client: redis.Redis, command: list[str]) -> set[str]:
    """The keys of one command, as Redis itself reads them (none for TIME)."""
    try:
        return set(client.command_getkeys(*command))
    except redis.ResponseError:  # a command without keys
        return set()


@contextlib.contextmanager
def monitoring(url: str) -> Iterator[list[str]]:
    lines: list[str] = []
    started = threading.Event()

    def watch() -> None:
        with redis.Redis.from_url(url).monitor() as monitor:
            started.set()
            while _STOP not in (line := monitor.connection.read_response().decode()):
                lines.append(line)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    started.wait(5)
    try:
        yield lines
    finally:
        redis.Redis.from_url(url).get(_STOP)
        thread.join(10)


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield c
    await c.aclose()


async def every_script(client: aioredis.Redis, url: str) -> None:
    """Each router and registry script, down each of its paths (keys, queues, a lost
    record rebuilt, a resume, a release, a pod's withdrawal)."""
    await support.beat(client, "a", total=2)
    store = admissions.Admissions(client, support.config(url, queue_timeout_seconds=5))
    token = tokens.mint("default", tokens.new_session_id())
    ask = admissions.Request("default", "team", 3, token, "c1")
    session = await store.admit(ask, ticket="t1")
    assert isinstance(session, admissions.Session)
    session.pod_resume_token = "pod-token"
    assert await store.attach(session)
    await client.delete(keys.session("default", session.session_id))  # as a Redis restart would
    assert await store.renew([session]) == [True]
    full = admissions.Request("default", "team", 3,
                              tokens.mint("default", tokens.new_session_id()), "c2")
    other = await store.admit(full)
    assert isinstance(other, admissions.Session)
    assert isinstance(await store.admit(full, ticket="t2"), admissions.Refused)  # queued: full
    await store.leave_queue(full, "t2", refused=True)
    await store.detach(session)
    sessions = admissions.Sessions()
    sessions.hold_detached(session, until=1e12)
    await client.delete(keys.session("default", session.session_id))
    await leasing.keep_detached(store, sessions, metrics.Metrics())
    resumed = await store.resume(admissions.Request("", "team", 0, token, "c3"))
    assert isinstance(resumed, admissions.Session)
    await store.release(resumed)
    await store.release(other)
    assert await registry.claim(client, "default", "a", "instance-1")
    assert await registry.remove_pod(client, "a", "default", "instance-1")


async def test_every_key_a_script_touches_was_given_to_it(
        client: aioredis.Redis, redis_server: RedisServer) -> None:
    with monitoring(redis_server.url) as lines:
        await every_script(client, redis_server.url)
    ran = [s for s in parse(lines) if s.commands]
    assert {s.sha for s in ran} >= {_sha(text) for text in ALL_SCRIPTS}, "a script never ran"
    inspect = redis_server.client()
    undeclared = sorted({f"{c[0]} {key}" for s in ran for c in s.commands
                         for key in touched(inspect, c) - s.declared})
    assert undeclared == []
    # what Redis Cluster asks besides: each call's keys are in one hash slot
    slots = [{crc.key_slot(k.encode()) for k in s.declared} for s in ran]
    assert [sorted(s.declared) for s, used in zip(ran, slots, strict=True) if len(used) > 1] == []


def test_the_check_sees_a_key_built_inside_a_script(redis_server: RedisServer) -> None:
    c = redis_server.client()
    with monitoring(redis_server.url) as lines:
        c.register_script("redis.call('SET', KEYS[1] .. ':twin', 1)")(keys=["asrpool:x"])
    (script,) = [s for s in parse(lines) if s.commands]
    assert touched(c, script.commands[0]) - script.declared == {"asrpool:x:twin"}
