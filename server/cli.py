"""Subcommands of the server part: ``serve``, ``fetch-model`` and ``transcribe``."""

from __future__ import annotations

import argparse
import json
import sys

from asrpool.server import fetching, serve_cli


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve_cli.add_parser(subparsers)
    fetching.add_parser(subparsers)
    _add_transcribe(subparsers)


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="tiny",
        help="tiny, small, stt-1b-en_fr, stt-2.6b-en, a checkpoint dir or a Hugging Face repo")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto",
                        help="auto (bfloat16 on CUDA, float32 elsewhere: the server's policy)"
                             " | bfloat16 | float16 | float32")
    parser.add_argument("--context", type=int, default=None,
                        help="rolling KV cache length in steps (default: the model's)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="CPU threads for torch; match the server's to get its exact output")


def _add_transcribe(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("transcribe", help="print the words of an audio file")
    parser.add_argument("file", help="WAV/FLAC/MP3 file, any sample rate")
    _add_model_flags(parser)
    parser.add_argument("--batch-size", type=int, default=1,
                        help="engine batch size (use the server's to get its exact output)")
    parser.add_argument("--json", action="store_true", help="one JSON event per line")
    parser.set_defaults(handler=_transcribe)


def _transcribe(args: argparse.Namespace) -> int:
    import torch

    from asrpool.common import audio
    from asrpool.server import engine, events, models, transcribing

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    try:
        dtype = models.resolve_dtype(args.dtype, args.device)
        pcm = audio.load_audio(args.file)
        model = models.load_model(args.model, device=args.device, dtype=dtype,
                                  context=args.context)
        with engine.BatchedEngine(model, args.batch_size) as eng:
            words = transcribing.words_of(
                transcribing.run_messages(eng, audio.kyutai_file_messages(pcm)))
    except (audio.AudioFileError, models.ModelError, engine.EngineInputError) as exc:
        print(f"asrpool transcribe: {exc}", file=sys.stderr)
        return 2
    for word in words:
        if args.json:
            print(json.dumps(events.to_message(word)))
        elif isinstance(word, events.Word):
            print(f"{word.start_time:7.2f}  {word.text}")
    return 0
