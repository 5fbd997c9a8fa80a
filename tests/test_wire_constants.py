"""The audio wire constants have one owner, ``asrpool.common.protocol``: no product or
benchmark module writes the sample rate, the frame size or the frame rate as a number
of its own (a twin that could drift from the protocol's)."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from asrpool.common import protocol

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("asrpool", "server", "router", "operator", "bench", "plan")  # pyproject's folders
OWNER = ROOT / "asrpool" / "common" / "protocol.py"
# Numbers that are these constants wherever product code writes them.
WIRE_NUMBERS = {
    protocol.SAMPLE_RATE: "protocol.SAMPLE_RATE",
    protocol.FRAME_SIZE: "protocol.FRAME_SIZE",
    protocol.FRAME_RATE: "protocol.FRAME_RATE",
    10 * protocol.SAMPLE_RATE: "10 s of samples: 10 * protocol.SAMPLE_RATE",
}
# Where such a number means something else: Opus frame lengths counted at 48 kHz (1920 is
# 40 ms there), which belong to the Opus format, not to the model's frame.
ELSEWHERE = {ROOT / "asrpool" / "common" / "oggopus.py": {1920}}


def wire_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each number token in ``source`` equal to a wire constant."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NUMBER and _value(token.string) in WIRE_NUMBERS:
            found.append((token.start[0], token.string))
    return found


def _value(text: str) -> float | None:
    try:
        return float(text.replace("_", ""))
    except ValueError:  # hex, octal, complex: none of them is a wire constant
        return None


def test_the_scanner_finds_a_twin_in_any_spelling_and_not_in_text() -> None:
    source = ('RATE = 24_000\nframe = 1920\nhz = 12.5\nsilence = 240000\n'
              'note = "24000 in a string"  # and 1920 in a comment\nother = 2400\n')
    assert wire_literals(source) == [(1, "24_000"), (2, "1920"), (3, "12.5"), (4, "240000")]


def test_no_module_but_the_protocol_writes_a_wire_constant_as_a_number() -> None:
    twins = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == OWNER:
                continue
            allowed = ELSEWHERE.get(path, set())
            for line, text in wire_literals(path.read_text()):
                if _value(text) not in allowed:
                    value = _value(text)
                    assert value is not None
                    twins.append(f"{path.relative_to(ROOT)}:{line}: {text} "
                                 f"(use {WIRE_NUMBERS[value]})")
    assert twins == []
