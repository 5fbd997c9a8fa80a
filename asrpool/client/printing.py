"""`asrpool stream`: words printed live as they arrive, a progress bar on stderr."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from asrpool.client import streaming
from asrpool.common import audio, protocol


def stream_file(args: argparse.Namespace) -> int:
    try:
        pcm = audio.load_audio(args.file)
    except audio.AudioFileError as exc:
        return _fail(str(exc))
    messages = audio.kyutai_file_messages(pcm, marker_id=streaming.MARKER_ID)
    if args.opus:
        messages = streaming.as_opus(messages)
    total = len(pcm) + 6 * protocol.SAMPLE_RATE  # the file plus the silences before the marker
    with _progress(args.json) as progress:
        task = progress.add_task("streaming", total=total)
        printer = _WordPrinter(args.json)
        try:
            result = asyncio.run(streaming.stream_messages(
                args.url, messages, rtf=args.rtf, api_key=args.api_key,
                on_message=printer, on_sent=lambda n: progress.advance(task, n)))
        except streaming.StreamError as exc:
            return _fail(str(exc))
    if not result.marker_seen:
        return _fail("the connection closed before the transcript was complete")
    return 0


def stream_microphone(args: argparse.Namespace) -> int:
    """The microphone's words, live, until Ctrl-C (then the last words, and exit 0)."""
    from asrpool.client import microphone

    problem = microphone.problem()
    if problem is not None:
        return _fail(problem)
    print("listening (Ctrl-C to stop)", file=sys.stderr)

    async def listen() -> streaming.StreamResult:
        stop = asyncio.Event()  # Ctrl-C ends the recording; the last words still come
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        return await streaming.stream_live(args.url, microphone.frames(stop),
                                           api_key=args.api_key,
                                           on_message=_WordPrinter(args.json))

    try:
        asyncio.run(listen())
    except streaming.StreamError as exc:
        return _fail(str(exc))
    return 0


def _progress(quiet: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=quiet, transient=True,
                    redirect_stdout=False, redirect_stderr=False)


class _WordPrinter:
    """Prints each Word as it comes (a line per word), or every message as JSON."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def __call__(self, message: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps(message), flush=True)
        elif message.get("type") == "Word":
            print(f"{message['start_time']:7.2f}  {message['text']}", flush=True)


def _fail(message: str) -> int:
    print(f"asrpool stream: {message}", file=sys.stderr)
    return 1
