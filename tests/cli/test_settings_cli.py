"""The one settings-to-flags helper (asrpool.common.settings_cli) and the three commands
built on it: every settings field reaches its command's flags, unless excluded on purpose."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Literal

import pydantic
import pydantic_settings
import pytest

from asrpool import cli
from asrpool.common import seeds, settings_cli
from asrpool.operator import settings as operator_settings
from asrpool.router import settings as router_settings
from asrpool.server import settings as server_settings


class Sample(pydantic_settings.BaseSettings):
    model_config = pydantic_settings.SettingsConfigDict(env_prefix="ASRPOOL_", extra="ignore")

    sample_count: int = pydantic.Field(default=1, ge=1, description="how many")
    sample_ratio: float = pydantic.Field(default=0.5, description="a share of 100%")
    sample_name: str | None = pydantic.Field(default=None, description="a name")
    sample_file: Path | None = pydantic.Field(default=None, description="a file")
    sample_loud: bool = pydantic.Field(default=False, description="shout")
    sample_mode: Literal["fast", "slow"] = pydantic.Field(default="fast", description="the mode")
    sample_password: pydantic.SecretStr | None = pydantic.Field(default=None,
                                                                description="a secret")
    sample_internal: str = pydantic.Field(default="x", description="not for users",
                                          json_schema_extra={"cli": False})


def _parser(settings_class: type[pydantic_settings.BaseSettings] = Sample,
            ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sample")
    settings_cli.add_flags(parser, settings_class)
    return parser


def _settings(*argv: str) -> Sample:
    return settings_cli.settings_from(_parser().parse_args(argv), Sample)


@pytest.fixture(autouse=True)
def _no_sample_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Sample.model_fields:
        monkeypatch.delenv(f"ASRPOOL_{name.upper()}", raising=False)


def test_each_flag_is_typed_from_its_annotation() -> None:
    config = _settings("--sample-count", "3", "--sample-ratio", "0.25", "--sample-name", "n",
                       "--sample-file", "/tmp/keys.yaml", "--sample-loud", "--sample-mode", "slow")
    assert (config.sample_count, config.sample_ratio, config.sample_name) == (3, 0.25, "n")
    assert config.sample_file == Path("/tmp/keys.yaml")
    assert config.sample_loud is True and config.sample_mode == "slow"


def test_defaults_apply_when_nothing_is_given() -> None:
    config = _settings()
    assert (config.sample_count, config.sample_name, config.sample_loud) == (1, None, False)


def test_a_boolean_has_a_negative_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRPOOL_SAMPLE_LOUD", "true")
    assert _settings().sample_loud is True
    assert _settings("--no-sample-loud").sample_loud is False


def test_a_literal_offers_its_choices_and_refuses_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["--sample-mode", "medium"])
    assert info.value.code == 2
    assert "invalid choice: 'medium'" in capsys.readouterr().err


def test_a_value_of_the_wrong_type_is_refused_by_its_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["--sample-count", "many"])
    assert info.value.code == 2
    assert "--sample-count: invalid int value: 'many'" in capsys.readouterr().err


def test_flags_win_over_the_environment_which_fills_in_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASRPOOL_SAMPLE_COUNT", "5")
    monkeypatch.setenv("ASRPOOL_SAMPLE_RATIO", "0.75")
    config = _settings("--sample-count", "2")
    assert (config.sample_count, config.sample_ratio) == (2, 0.75)


def test_secrets_and_marked_fields_are_no_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _parser().format_help()
    assert "--sample-password" not in shown and "--sample-internal" not in shown
    with pytest.raises(SystemExit):
        _parser().parse_args(["--sample-password", "hunter2"])
    monkeypatch.setenv("ASRPOOL_SAMPLE_PASSWORD", "hunter2")  # the environment still may
    assert _settings().sample_password == pydantic.SecretStr("hunter2")


def test_the_help_shows_the_description_default_and_variable() -> None:
    shown = " ".join(_parser().format_help().split())
    assert "how many (default: 1) [ASRPOOL_SAMPLE_COUNT]" in shown
    assert "a share of 100% (default: 0.5) [ASRPOOL_SAMPLE_RATIO]" in shown
    assert "--sample-mode {fast,slow}" in shown


def test_an_invalid_value_exits_2_naming_its_flag_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    started: list[Sample] = []
    code = settings_cli.run("sample", lambda: _settings("--sample-count", "0"),
                            lambda config: started.append(config) or 0)
    assert (code, started) == (2, [])
    err = capsys.readouterr().err
    assert err.startswith("asrpool sample: invalid settings: sample_count")
    assert "(--sample-count or ASRPOOL_SAMPLE_COUNT)" in err and "greater than or equal" in err


def test_an_invalid_variable_exits_2_as_well(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ASRPOOL_SAMPLE_RATIO", "half")
    assert settings_cli.run("sample", _settings, lambda config: 0) == 2
    assert "sample_ratio (--sample-ratio or ASRPOOL_SAMPLE_RATIO)" in capsys.readouterr().err


def test_a_bad_file_exits_2_and_other_errors_pass_through(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def unreadable() -> Sample:
        raise FileNotFoundError("keys.yaml: no such file")

    assert settings_cli.run("sample", unreadable, lambda config: 0, FileNotFoundError) == 2
    assert capsys.readouterr().err == "asrpool sample: keys.yaml: no such file\n"
    with pytest.raises(FileNotFoundError):
        settings_cli.run("sample", unreadable, lambda config: 0)


def test_a_field_without_a_flag_type_must_be_the_commands_own() -> None:
    class Listed(pydantic_settings.BaseSettings):
        names: list[str] = pydantic.Field(default_factory=list, description="names")

    with pytest.raises(TypeError, match="'names'"):
        _parser(Listed)
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", dest="names", action="append")
    settings_cli.add_flags(parser, Listed, own=("names",))
    assert settings_cli.settings_from(parser.parse_args(["--name", "a"]), Listed).names == ["a"]


def test_a_flag_needs_a_description() -> None:
    class Undocumented(pydantic_settings.BaseSettings):
        level: int = 3

    with pytest.raises(TypeError, match=r"Undocumented\.level has no description"):
        _parser(Undocumented)


def test_the_settings_class_loads_only_when_the_command_parses() -> None:
    loaded: list[str] = []

    def settings() -> type[Sample]:
        loaded.append("Sample")
        return Sample

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command", parser_class=settings_cli.CommandParser)
    settings_cli.add_command(subparsers, "sample", settings=settings)
    subparsers.add_parser("other")
    assert parser.parse_args(["other"]).command == "other" and loaded == []
    assert parser.parse_args(["sample", "--sample-count", "4"]).sample_count == 4
    assert parser.parse_args(["sample"]).sample_count is None and loaded == ["Sample"]


# Every flag each command had before the helper; the chart, the operator's pods, the
# local platform, tests and docs pass them.
EARLIER_FLAGS = {
    "serve": "--advertise-address --api-keys-file --batch-size --context --device"
    " --drain-grace-seconds --dtype --handshake-timeout-seconds --heartbeat-interval-seconds"
    " --host --idle-timeout-seconds --log-level --max-buffer-seconds --max-connections"
    " --max-head-bytes --max-headers --max-message-bytes --max-messages-per-second"
    " --max-pending-markers --max-upload-bytes --max-url-bytes --message-burst --model"
    " --model-revision --ping-interval-seconds --ping-timeout-seconds --pod-id"
    " --pool --port --redis-password-file --redis-url --resume-grace-seconds"
    " --send-timeout-seconds --torch-threads",
    "route": "--api-keys-file --default-pool --gpu-hour-price --gpus-per-pod"
    " --handshake-timeout-seconds --host --log-level --max-connections --max-head-bytes"
    " --max-headers --max-message-bytes --max-upload-bytes --max-url-bytes"
    " --ping-interval-seconds --ping-timeout-seconds --policy --pool-namespace"
    " --port --queue-max --queue-max-per-key --queue-timeout-seconds --redis-password-file"
    " --redis-url --resume-grace-seconds --router-id --send-timeout-seconds"
    " --session-lease-ms --workers",
    # --default-pod-token-secret and --default-pod-token-key went with the one pod token
    # shared by every namespace: each pool's own now comes from ASRPOOL_POD_TOKEN_SEED.
    "operator": "-n --namespace -A --all-namespaces --default-image"
    " --kube-api-url --liveness --log-level --network-policy"
    " --no-network-policy --network-policy-from --peering --pod-redis-url --priority"
    " --redis-password-file --redis-password-secret --redis-password-secret-key"
    " --redis-timeout-seconds --redis-url --resync-seconds --termination-margin-seconds",
}
COMMANDS = {
    "serve": server_settings.ServerSettings,
    "route": router_settings.RouterSettings,
    "operator": operator_settings.OperatorSettings,
}
# Fields that are no flag, on purpose (secrets: a command line is visible on the host).
# --pod-token was a flag until it became a SecretStr: ASRPOOL_POD_TOKEN only.
NOT_FLAGS = {"redis_password", "pod_token", "pod_token_seed", "redis_password_seed"}


def _help(command: str, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "400")  # one line per flag: variables are not wrapped
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_settings_field_reaches_the_commands_help(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    settings_class = COMMANDS[command]
    shown = _help(command, monkeypatch, capsys)
    variables = set(re.findall(r"\[(ASRPOOL_[A-Z_]+)\]", shown))
    fields = {settings_cli.environment_name(settings_class, name) for name in
              settings_class.model_fields if name not in NOT_FLAGS}
    assert fields - variables == set(), "settings fields without a flag"
    assert {name for name, field in settings_class.model_fields.items()
            if not settings_cli.is_flag(field)} == NOT_FLAGS & set(settings_class.model_fields)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_earlier_flag_still_exists(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    shown = set(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", _help(command, monkeypatch, capsys)))
    assert set(EARLIER_FLAGS[command].split()) - shown == set()


def test_no_command_takes_the_redis_password_as_a_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in COMMANDS:
        with pytest.raises(SystemExit) as info:
            cli.build_parser().parse_args([command, "--redis-password", "hunter2"])
        assert info.value.code == 2
    assert "unrecognized arguments: --redis-password" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "flag"), [
    ("serve", "--pod-token"), ("route", "--pod-token"), ("route", "--pod-token-seed"),
    ("operator", "--pod-token-seed")])
def test_no_command_takes_a_pod_token_or_its_seed_as_a_flag(
    command: str, flag: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args([command, "-A", flag, "hunter2"] if command == "operator"
                                      else [command, flag, "hunter2"])
    assert info.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_a_router_takes_one_pod_token_or_a_seed_not_both() -> None:
    both = {"pod_token": "t", "pod_token_seed": "s"}
    with pytest.raises(pydantic.ValidationError, match="not both"):
        router_settings.RouterSettings.model_validate(both)
    seeded = router_settings.RouterSettings.model_validate({"pod_token_seed": "s"})
    assert seeded.pod_token_for("a/stt") == seeds.pod_token("s", "a/stt")
    assert seeded.pod_token_for("b/stt") != seeded.pod_token_for("a/stt")
    assert router_settings.RouterSettings.model_validate(
        {"pod_token": "t"}).pod_token_for("a/stt") == "t"
    assert router_settings.RouterSettings().pod_token_for("a/stt") is None
