"""``asrpool operator``: flags, environment variables, and no heavy imports to register."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from asrpool.common import processes, settings_cli
from asrpool.operator import cli, running, settings
from tests.operator import checks, emulator
from tests.support import polling, redis_servers


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command", parser_class=settings_cli.CommandParser))
    return parser.parse_args(["operator", *argv])


def test_registering_does_not_import_kopf_or_kubernetes() -> None:
    code = ("import argparse, sys; from asrpool.operator import cli;"
            "from asrpool.common import settings_cli;"
            "p = argparse.ArgumentParser();"
            "cli.register(p.add_subparsers(parser_class=settings_cli.CommandParser));"
            "print(sorted(m for m in ('kopf', 'kubernetes', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_flags_become_settings() -> None:
    args = parse("-n", "a", "--namespace", "b", "--redis-url", "redis://r:6379/1",
                 "--resync-seconds", "5", "--kube-api-url", "http://127.0.0.1:8001")
    config = cli.load_settings(args)
    assert config.namespaces == ["a", "b"]
    assert (config.redis_url, config.resync_seconds) == ("redis://r:6379/1", 5.0)
    assert config.kube_api_url == "http://127.0.0.1:8001"
    assert args.handler is not None


def test_environment_variables_fill_in_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRPOOL_NAMESPACES", "x, y")
    monkeypatch.setenv("ASRPOOL_REDIS_URL", "redis://env:6379/0")
    monkeypatch.setenv("ASRPOOL_DEFAULT_IMAGE", "img:env")
    config = cli.load_settings(parse("--redis-url", "redis://flag:6379/0"))
    assert config.namespaces == ["x", "y"]
    assert config.redis_url == "redis://flag:6379/0"
    assert config.default_image == "img:env"


def test_a_pod_redis_url_with_a_password_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("-n", "x", "--redis-url", "redis://:pw@redis:6379/0")
    assert args.handler(args) == 2
    assert "--redis-password-secret" in capsys.readouterr().err


def test_an_unreadable_password_file_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse("-n", "x", "--redis-password-file", str(tmp_path / "none"))
    assert args.handler(args) == 2
    assert "cannot read the Redis password file" in capsys.readouterr().err


def test_cluster_wide() -> None:
    assert cli.load_settings(parse("-A")).all_namespaces


def test_a_scope_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse()
    assert args.handler(args) == 2
    assert "--namespace NAME" in capsys.readouterr().err


def test_a_bad_namespace_name_is_refused_naming_the_flag_the_command_has(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse("-n", "asr", "-n", "GPU_pools")
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert "namespaces (-n/--namespace or ASRPOOL_NAMESPACES): 'GPU_pools' is not a namespace" \
        " name" in err
    monkeypatch.setenv("ASRPOOL_NAMESPACES", "a," + "b" * 64)
    with pytest.raises(ValueError, match=r"'b{64}' is not a namespace name"):
        cli.load_settings(parse())
    assert settings.OperatorSettings(namespaces=["a", "asr-pools-2"]).namespaces == [
        "a", "asr-pools-2"]


def test_an_own_flag_is_named_as_the_command_spells_it() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        settings.OperatorSettings(all_namespaces=True, liveness_endpoint=8081)
    described = settings_cli.describe(info.value, cli.OWN_FLAGS)
    assert "liveness_endpoint (--liveness or ASRPOOL_LIVENESS_ENDPOINT)" in described
    assert "(--liveness-endpoint" in settings_cli.describe(info.value)  # without the map


def test_namespaced_and_cluster_wide_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse("-A", "-n", "x")
    with pytest.raises(ValueError, match="not both"):
        settings.OperatorSettings(namespaces=["x"], all_namespaces=True)


def test_help_runs() -> None:
    with pytest.raises(SystemExit) as info:
        parse("--help")
    assert info.value.code == 0


async def test_the_command_runs_the_operator_until_sigterm(
    cluster: emulator.Cluster, redis_server: redis_servers.RedisServer, tmp_path: Path
) -> None:
    """``asrpool operator`` as a process: flags, kopf.run, handlers, signal handling."""
    operator = processes.spawn(
        "asrpool operator",
        [sys.executable, "-m", "asrpool.cli", "operator", "--namespace", emulator.NAMESPACE,
         "--kube-api-url", cluster.url, "--redis-url", redis_server.url, "--log-level",
         "warning"], tmp_path / "operator.log")
    try:
        try:
            await cluster.create(checks.manifest())
            await polling.eventually(lambda: checks.children_of(cluster), 60)
        finally:
            operator.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(operator.process.wait, 60)
    finally:
        await asyncio.to_thread(operator.stop, 10)  # what a failed wait left running
    assert code == 0, operator.log.read_text()[-3000:]


def test_messages_never_show_the_redis_password() -> None:
    # The operator's own URL may carry a password (the pods' may not: see above).
    config = settings.OperatorSettings(all_namespaces=True, pod_redis_url="redis://redis/0",
                                       redis_url="redis://:s3cret@redis:6379/0")
    assert config.redis_url_shown == "redis://:***@redis:6379/0"
    named = settings.OperatorSettings(all_namespaces=True, redis_url="redis://op:pw@r:1/0",
                                      pod_redis_url="redis://r:1/0")
    assert named.redis_url_shown == "redis://op:***@r:1/0"
    plain = settings.OperatorSettings(all_namespaces=True, redis_url="redis://r:6379/0")
    assert plain.redis_url_shown == "redis://r:6379/0"


def test_peering_and_network_policy_flags() -> None:
    peer = '[{"podSelector": {"matchLabels": {"app": "router"}}}]'
    config = cli.load_settings(parse("-n", "a", "--peering", "asrpool", "--priority", "7",
                                     "--network-policy-from", peer))
    assert (config.peering, config.priority) == ("asrpool", 7)
    assert config.network_policy_from == [{"podSelector": {"matchLabels": {"app": "router"}}}]
    assert not cli.load_settings(parse("-n", "a", "--no-network-policy")).network_policy
    assert cli.load_settings(parse("-n", "a")).peering is None  # standalone by default


def test_replicas_draw_distinct_priorities_unless_given() -> None:
    """kopf freezes every replica of a tie, so none is left to chance but a given one."""
    given = settings.OperatorSettings(namespaces=["a"], priority=5)
    assert running.priority(given) == 5
    drawn = {running.priority(settings.OperatorSettings(namespaces=["a"])) for _ in range(8)}
    assert len(drawn) == 8 and all(1 <= p <= running.MAX_PRIORITY for p in drawn)


def test_the_routers_address_is_a_websocket_origin(capsys: pytest.CaptureFixture[str]) -> None:
    """--router-url makes each pool's status.url; anything but ws[s]://HOST[:PORT] is
    refused at start, naming the flag."""
    config = cli.load_settings(parse("-n", "a", "--router-url", "wss://asr.example.com"))
    assert config.router_url == "wss://asr.example.com"
    for bad in ("https://asr.example.com", "wss://asr.example.com/", "asr.example.com"):
        args = parse("-n", "a", "--router-url", bad)
        assert args.handler(args) == 2
        assert "router" in capsys.readouterr().err.lower()
