"""Client-side subcommands: ``stream`` (a file to a server or router), ``up`` and ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asrpool.client.local import LocalPlatform


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_stream(subparsers)
    _add_up(subparsers)
    _add_demo(subparsers)


def _add_stream(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("stream", help="stream an audio file and print words live")
    parser.add_argument("url", help="router or server, e.g. ws://127.0.0.1:8000")
    parser.add_argument("file", nargs="?", help="WAV/FLAC/MP3 file (omit with --mic)")
    parser.add_argument("--rtf", type=float, default=1.0,
                        help="speed in multiples of real time (default 1.0)")
    parser.add_argument("--api-key", default=None, help="sent as the kyutai-api-key header")
    parser.add_argument("--json", action="store_true", help="one JSON message per line")
    parser.add_argument("--mic", action="store_true", help="stream the default microphone")
    parser.add_argument("--opus", action="store_true",
                        help="send the audio as Ogg Opus pages (OggOpus messages), as "
                        "browsers do, instead of PCM")
    parser.set_defaults(handler=_stream)


def _stream(args: argparse.Namespace) -> int:
    from asrpool.client import printing

    if args.rtf <= 0:
        return _fail("--rtf must be positive")
    if args.mic:
        return printing.stream_microphone(args)
    if not args.file:
        return _fail("give an audio FILE, or --mic")
    return printing.stream_file(args)


def _fail(message: str) -> int:
    print(f"asrpool stream: {message}", file=sys.stderr)
    return 1


def _add_up(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up", help="run Redis, N server pods and a router on this machine, with a live table")
    _add_platform_flags(parser)
    parser.set_defaults(handler=_up)


def _add_platform_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=2, help="server processes (default 2)")
    parser.add_argument("--slots-per-pod", type=int, default=2, help="batch size of each pod")
    parser.add_argument("--model", default="tiny", help="tiny, small, a checkpoint dir or repo")
    parser.add_argument("--port", type=int, default=8000, help="the router's port")
    parser.add_argument("--policy", default="pack", choices=["pack", "spread"])


def _up(args: argparse.Namespace) -> int:
    from asrpool.client import local, tables

    try:
        with _stop_on_signals(), _platform(args) as platform:
            tables.show_live(platform)
    except KeyboardInterrupt:
        pass
    except local.PlatformError as exc:
        print(f"asrpool up: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="start the platform locally, stream the sample through the router, stop")
    _add_platform_flags(parser)
    parser.add_argument("--file", default=None, help="audio file (default: the repo's sample)")
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from asrpool.client import demo, local

    try:
        with _stop_on_signals(), _platform(args) as platform:
            return demo.run(platform, Path(args.file) if args.file else local.SAMPLE)
    except KeyboardInterrupt:
        return 130
    except local.PlatformError as exc:
        print(f"asrpool demo: {exc}", file=sys.stderr)
        return 1


def _platform(args: argparse.Namespace) -> LocalPlatform:
    from asrpool.client import local

    return local.LocalPlatform(args.pods, args.slots_per_pod, args.model, args.port,
                               args.policy)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM both raise KeyboardInterrupt and so end in a clean stop.

    SIGINT is set explicitly: a shell starts background jobs with it ignored.
    """
    def _raise(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
