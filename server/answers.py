"""What a known model says each step besides its words, known without building it.

Two facts: the steps between a stream's audio and its words (``asr_delay_in_tokens``:
markers come back that much later too), and how many values its extra heads give each
step (a ``Step``'s ``prs``; none, and no ``Step``, without extra heads). The presets of
``models.PRESETS`` are built from these, and Kyutai's released repositories answer as the
preset of their architecture (kyutai-labs/delayed-streams-modeling's server
configurations; ``tests/engine/test_presets.py`` holds the presets to them). The paced
engine (``pacing``), which builds no model, answers as these say.

Imports no torch.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Answers:
    delay: int  # asr_delay_in_tokens
    extra_heads: int  # values of Step.prs per step


PRESETS: dict[str, Answers] = {
    "tiny": Answers(delay=6, extra_heads=4),
    "small": Answers(delay=6, extra_heads=4),
    "stt-1b-en_fr": Answers(delay=6, extra_heads=4),
    "stt-2.6b-en": Answers(delay=32, extra_heads=0),
}

# Kyutai's repositories and the preset of their architecture.
KYUTAI_REPOS: dict[str, str] = {
    "kyutai/stt-1b-en_fr": "stt-1b-en_fr",
    "kyutai/stt-2.6b-en": "stt-2.6b-en",
}


def of(model: str) -> Answers | None:
    """A preset's or a Kyutai repository's answers; None for any other model."""
    return PRESETS.get(KYUTAI_REPOS.get(model, model))


def known() -> list[str]:
    return [*PRESETS, *KYUTAI_REPOS]
