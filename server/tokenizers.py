"""A small SentencePiece tokenizer, trained in-process from a fixed corpus.

The random test models need a text tokenizer whose ids 0 and 3 play the roles they
have in Kyutai's: 0 ends a word's padding, 3 is padding. Training is deterministic
(one thread, fixed corpus), so every process that builds it gets the same model.
"""

from __future__ import annotations

import io
import random

import sentencepiece

_SYLLABLES = (
    "ka", "ri", "to", "mu", "sa", "ne", "lo", "vi", "pe", "da", "gu", "fi", "no", "ha",
    "ze", "bo", "ly", "wa", "che", "tri", "an", "el", "is", "on", "us", "ar", "en", "ir",
    "or", "ul", "st", "pl", "gr", "br", "sh", "th",
)


def _corpus(sentences: int = 3000, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(400)]
    return [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(sentences)]


def train_tokenizer(vocab_size: int = 256) -> sentencepiece.SentencePieceProcessor:
    """Train the deterministic test tokenizer and return it loaded."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        num_threads=1,
        minloglevel=2,
        character_coverage=1.0,
    )
    return sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
