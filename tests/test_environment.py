"""Settings names are case-sensitive (asrpool.common.environment): only ``ASRPOOL_<FIELD>``
in upper case is read, by every part, so a lower-case twin of a variable the operator
sets cannot win over it."""

from __future__ import annotations

import pytest

from asrpool.operator import settings as operator_settings
from asrpool.router import settings as router_settings
from asrpool.server import settings as server_settings
from tests.support.environs import Environ


@pytest.mark.parametrize("twin", ["asrpool_pool", "Asrpool_Pool", "ASRPOOL_pool"])
def test_a_twin_in_another_case_is_not_a_setting(environ: Environ, twin: str) -> None:
    environ({twin: "other/pool"})
    assert server_settings.ServerSettings().pool == "default"
    environ({"ASRPOOL_POOL": "speech/stt"})
    assert server_settings.ServerSettings().pool == "speech/stt"


def test_every_part_reads_its_upper_case_variables(environ: Environ) -> None:
    environ({"ASRPOOL_REDIS_URL": "redis://127.0.0.1:6390/0",
             "asrpool_redis_url": "redis://198.18.9.9:6379/0"})
    assert server_settings.ServerSettings().redis_url == "redis://127.0.0.1:6390/0"
    assert router_settings.RouterSettings().redis_url == "redis://127.0.0.1:6390/0"
    assert operator_settings.OperatorSettings(all_namespaces=True).redis_url == \
        "redis://127.0.0.1:6390/0"


def test_arguments_still_win_over_the_environment(environ: Environ) -> None:
    environ({"ASRPOOL_BATCH_SIZE": "16"})
    assert server_settings.ServerSettings().batch_size == 16
    assert server_settings.ServerSettings(batch_size=4).batch_size == 4
