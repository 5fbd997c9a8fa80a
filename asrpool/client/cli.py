"""Client-side subcommands: ``stream`` (a file to a server or router), ``up`` and ``demo``."""

from __future__ import annotations

import argparse
import sys


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
        return _fail(printing.microphone_problem())
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
    from asrpool.client import local

    return local.run_up(args)


def _add_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="start the platform locally, stream the sample through the router, stop")
    _add_platform_flags(parser)
    parser.add_argument("--file", default=None, help="audio file (default: the repo's sample)")
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from asrpool.client import local

    return local.run_demo(args)
