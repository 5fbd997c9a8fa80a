"""Settings read from ``ASRPOOL_*`` environment variables, by their exact names.

pydantic-settings matches variable names without regard to case by default, so a
lower-case twin (``asrpool_pool``) of a variable the operator sets (``ASRPOOL_POOL``)
could win over it, depending only on the order of the process's environment. Here only
the documented, upper-case spelling is read; any other spelling is not a setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pydantic_settings
from pydantic_settings.sources import utils as source_utils

PREFIX = "ASRPOOL_"


class ExactNames(pydantic_settings.EnvSettingsSource):
    """The environment source, blind to every variable not spelled in upper case."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        spelled = {name: value for name, value in os.environ.items() if name == name.upper()}
        return source_utils.parse_env_vars(spelled, False, self.env_ignore_empty,
                                           self.env_parse_none_str)


class Settings(pydantic_settings.BaseSettings):
    """The base of every part's settings: ``ASRPOOL_<FIELD>``, exactly."""

    model_config = pydantic_settings.SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[pydantic_settings.BaseSettings],
        init_settings: pydantic_settings.PydanticBaseSettingsSource,
        env_settings: pydantic_settings.PydanticBaseSettingsSource,
        dotenv_settings: pydantic_settings.PydanticBaseSettingsSource,
        file_secret_settings: pydantic_settings.PydanticBaseSettingsSource,
    ) -> tuple[pydantic_settings.PydanticBaseSettingsSource, ...]:
        return init_settings, ExactNames(settings_cls), dotenv_settings, file_secret_settings
