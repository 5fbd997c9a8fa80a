"""One way from a settings class to a command's flags, and from the flags back.

``asrpool serve``, ``route`` and ``operator`` each read one pydantic-settings class;
every field of it is a flag (uvicorn's ``auto_envvar_prefix`` does the same for click):

- the flag is ``--`` and the field's name with dashes (``max_head_bytes`` is
  ``--max-head-bytes``); its value lands in the field's name;
- its type comes from the annotation: ``int``, ``float``, ``str``, ``Path``; a ``bool``
  is ``--x`` / ``--no-x``; a ``Literal`` gives the choices; ``X | None`` is ``X``;
- its help is the field's ``description=`` (required: the text lives beside the
  default), then the default and the ``ASRPOOL_*`` variable that sets the same field.

Only the flags given reach the settings class (:func:`settings_from`); the environment
fills in the rest, and a flag wins over its variable.

Not a flag, on purpose: a ``SecretStr`` field, and a field marked
``json_schema_extra={"cli": False}``. A command line is visible to every process of
the host (``ps``, ``/proc/*/cmdline``), so a secret is read from the environment or a
file only. A field the helper cannot type (a list, JSON) is the command's own flag:
the command adds it in ``extras`` with the field's name as ``dest`` and names it in
``own``; any other field it cannot type is an error when the flags are built.

The flags are added when the command's parser first parses or prints help
(:class:`CommandParser`): registering the ``asrpool`` command imports no settings
class, so pydantic and each part's modules load only for the command that runs.

One error convention (:func:`run`): invalid settings or a bad file end the command as
argparse ends one for a bad flag, with a message on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

if TYPE_CHECKING:
    import pydantic_settings
    from pydantic import fields

    SettingsClass = type[pydantic_settings.BaseSettings]
    Settings = TypeVar("Settings", bound=pydantic_settings.BaseSettings)
    Extras = Callable[[argparse.ArgumentParser, type[Settings]], None]

EXIT_BAD_INPUT = 2  # as argparse exits for a bad flag
_METAVARS: dict[type, str] = {int: "N", float: "NUMBER", str: "TEXT", Path: "PATH"}
Prepared = TypeVar("Prepared")


class CommandParser(argparse.ArgumentParser):
    """An argparse parser that runs a hook (adding its settings flags) the first time
    it parses or formats help or usage. The ``asrpool`` command's subparsers are these
    (``add_subparsers(parser_class=CommandParser)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: Callable[[argparse.ArgumentParser], None] | None = None

    def defer(self, hook: Callable[[argparse.ArgumentParser], None]) -> None:
        self._pending = hook

    def _complete(self) -> None:
        hook, self._pending = self._pending, None
        if hook is not None:
            hook(self)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._complete()
        return super().format_help()

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()


def add_command(
    subparsers: argparse._SubParsersAction[Any], name: str, *,
    settings: Callable[[], type[Settings]], own: Collection[str] = (),
    extras: Extras[Settings] | None = None, **parser_options: Any,
) -> argparse.ArgumentParser:
    """A subcommand whose flags are the fields of ``settings()`` (a function, so that the
    class is imported only when the flags are needed), plus ``extras`` for the fields in
    ``own``."""

    def complete(parser: argparse.ArgumentParser) -> None:
        settings_class = settings()
        if extras is not None:
            extras(parser, settings_class)
        add_flags(parser, settings_class, own=own)

    # Flags are spelled in full: a new flag never changes what an abbreviation meant, and
    # ``--redis-password SECRET`` is no ``--redis-password-file``.
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, allow_abbrev=False, **parser_options)
    if isinstance(parser, CommandParser):
        parser.defer(complete)
    else:  # a plain argparse parser (a test's): the flags at once
        complete(parser)
    return parser


def add_flags(parser: argparse.ArgumentParser, settings_class: SettingsClass, *,
              own: Collection[str] = ()) -> None:
    """One flag per field of ``settings_class`` that is a flag and not in ``own``."""
    for name, field in settings_class.model_fields.items():
        if name in own or not is_flag(field):
            continue
        parser.add_argument(flag_name(name), dest=name, default=None,
                            help=help_text(settings_class, name), **_typing(name, field))


def is_flag(field: fields.FieldInfo) -> bool:
    """Not a secret (``SecretStr``) and not marked ``json_schema_extra={"cli": False}``."""
    import pydantic

    extra = field.json_schema_extra
    if isinstance(extra, dict) and extra.get("cli") is False:
        return False
    return _without_none(field.annotation) not in (pydantic.SecretStr, pydantic.SecretBytes)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def environment_name(settings_class: SettingsClass, field_name: str) -> str:
    return (str(settings_class.model_config.get("env_prefix", "")) + field_name).upper()


# A field whose default_factory reads a fixed value (not the machine's), which --help shows.
SHOW_DEFAULT = "show_default"


def help_text(settings_class: SettingsClass, field_name: str) -> str:
    """The field's description, its default (unless computed) and its variable."""
    import pydantic_core

    field = settings_class.model_fields[field_name]
    if not field.description:
        raise TypeError(f"{settings_class.__name__}.{field_name} has no description= for its"
                        " --help")
    text = field.description
    if field.default not in (None, pydantic_core.PydanticUndefined):
        text += f" (default: {field.default})"
    elif isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get(SHOW_DEFAULT):
        text += f" (default: {field.get_default(call_default_factory=True)})"
    return f"{text} [{environment_name(settings_class, field_name)}]".replace("%", "%%")


def _typing(name: str, field: fields.FieldInfo) -> dict[str, Any]:
    kind = _without_none(field.annotation)
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        return {"type": type(choices[0]), "choices": choices}
    if kind in _METAVARS:
        return {"type": kind, "metavar": _METAVARS[kind]}
    words = _number_or_words(kind)
    if words:  # pydantic reads the text: a number, or one of the words
        return {"type": str, "metavar": "|".join(["N", *words])}
    raise TypeError(f"settings field {name!r} of type {field.annotation!r} has no flag type:"
                    " add its flag as the command's own, or mark it"
                    " json_schema_extra={'cli': False}")


def _number_or_words(annotation: Any) -> list[str]:
    """The words of ``int | Literal[...]`` (an int constrained with ``Annotated`` too);
    none for any other type."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return []
    numbers: list[Any] = []
    words: list[str] = []
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is Literal:
            words.extend(str(word) for word in typing.get_args(arg))
        else:
            numbers.append(typing.get_args(arg)[0] if typing.get_origin(arg) is Annotated
                           else arg)
    return words if numbers == [int] and words else []


def _without_none(annotation: Any) -> Any:
    """``X`` for ``X | None`` (and ``Optional[X]``); anything else as it is."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def settings_from(args: argparse.Namespace, settings_class: type[Prepared]) -> Prepared:
    """The settings: the flags given (fields whose value is not ``None``), the
    ``ASRPOOL_*`` environment for the rest, then the defaults."""
    fields_of: dict[str, fields.FieldInfo] = settings_class.model_fields  # type: ignore[attr-defined]
    given = {name: getattr(args, name) for name, field in fields_of.items()
             if is_flag(field) and getattr(args, name, None) is not None}
    return settings_class(**given)


def run(command: str, prepare: Callable[[], Prepared], start: Callable[[Prepared], int],
        *bad_files: type[Exception], own_flags: Mapping[str, str] | None = None) -> int:
    """``start(prepare())``; invalid settings (a pydantic ``ValidationError``) or one of
    ``bad_files`` raised by ``prepare`` is a message on stderr and exit status 2.
    ``own_flags``: the flag of each field whose flag the command adds itself."""
    import pydantic

    bad_input: tuple[type[Exception], ...] = (pydantic.ValidationError, *bad_files)
    try:
        prepared = prepare()
    except bad_input as exc:
        print(f"asrpool {command}: {describe(exc, own_flags)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return start(prepared)


def describe(exc: BaseException, own_flags: Mapping[str, str] | None = None) -> str:
    """What to fix: each invalid field named as its flag and its variable."""
    import pydantic

    if not isinstance(exc, pydantic.ValidationError):
        return str(exc)
    flags = own_flags or {}
    return "invalid settings: " + "; ".join(_one_error(error, flags) for error in exc.errors())


def _one_error(error: Any, own_flags: Mapping[str, str]) -> str:
    location, message = error["loc"], str(error["msg"]).removeprefix("Value error, ")
    if not location:  # a check of the whole settings (a model validator)
        return message
    name = str(location[0])
    where = ".".join(str(part) for part in location)
    flag = own_flags.get(name) or flag_name(name)
    return f"{where} ({flag} or ASRPOOL_{name.upper()}): {message}"
