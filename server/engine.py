"""The batched, rolling-cache streaming engine.

One engine owns a model and ``batch_size`` stream slots, all state allocated when it
starts (Mimi's streaming buffers, the LM's rolling KV caches of ``context`` steps).
Each :meth:`BatchedEngine.step` takes at most one 1920-sample frame per slot, masks
the slots without one (moshi's exec masks: their state does not move), and runs one
batched Mimi encode and one batched LM step. A slot joins or leaves through
:meth:`BatchedEngine.reset_slot`, which resets that slot alone.

As in Kyutai's moshi-server, the LM sees each stream's audio one step late: at a
slot's first step it gets the initial (padding) tokens, then the codes of the frame
before. The engine is not thread-safe: one loop owns it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from moshi.models.lm import LMGen
from moshi.modules.transformer import RingKVCache
from numpy.typing import NDArray

from asrpool.common import protocol
from asrpool.server import events as ev
from asrpool.server import models
from asrpool.server.models import LoadedModel

FRAME_SIZE = protocol.FRAME_SIZE


class EngineInputError(ValueError):
    """A frame or slot the engine cannot take; nothing was changed."""


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one batched step produced: events per slot, and the raw tokens (for tests)."""

    events: dict[int, list[ev.Event]]
    text_tokens: dict[int, int]
    audio_codes: dict[int, list[int]]


class BatchedEngine:
    def __init__(self, model: LoadedModel, batch_size: int) -> None:
        if batch_size < 1:
            raise EngineInputError(f"batch size must be at least 1, got {batch_size}")
        if model.lm.is_streaming or model.mimi.is_streaming:
            raise EngineInputError("this model is already owned by another open engine")
        self.model = model
        self.batch_size = batch_size
        self.device = model.device
        self.lm_gen = LMGen(model.lm, use_sampling=False, temp=0.0, temp_text=0.0,
                            support_out_of_sync=True)
        self.num_codebooks = model.lm.num_audio_codebooks
        self.has_extra_heads = len(model.lm.extra_heads) > 0
        self._stack = contextlib.ExitStack()
        try:  # an engine that fails to open (out of memory) leaves the model unowned
            self._stack.enter_context(model.mimi.streaming(batch_size))
            self._stack.enter_context(self.lm_gen.streaming(batch_size))
        except BaseException:
            self._stack.close()
            raise
        self._kv_caches = _kv_caches(model.mimi.get_streaming_state(),
                                     model.lm.get_streaming_state())
        self._pad_codes = torch.full((batch_size, self.num_codebooks, 1),
                                     model.lm.initial_token_id, dtype=torch.long,
                                     device=self.device)
        self._prev_codes = self._pad_codes.clone()
        self._pcm = np.zeros((batch_size, 1, FRAME_SIZE), dtype=np.float32)
        self.decoders = [
            ev.WordDecoder(model.asr_delay_in_tokens, model.tokenizer.decode)
            for _ in range(batch_size)
        ]
        self.steps_run = 0

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> BatchedEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def reset_slot(self, slot: int, keep_markers: bool = False) -> None:
        """Start a fresh stream in ``slot``; every other slot is untouched. With
        ``keep_markers`` (a client's ``Init``), its pending markers stay due as many
        steps later as they were."""
        self.reset_slots([slot], keep_markers)

    def reset_slots(self, slots: Iterable[int], keep_markers: bool = False) -> None:
        """:meth:`reset_slot` for several slots in one vectorised reset (moshi's
        ``reset_streaming(mask)`` walks every streaming module once, whatever the mask)."""
        rows = sorted(set(slots))
        for slot in rows:
            self._check_slot(slot)
        if not rows:
            return
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        mask[rows] = True
        mask = mask.to(self.device)
        self.model.mimi.reset_streaming(mask)
        self.lm_gen.reset_streaming(mask)
        self._clear_caches(mask)
        self._prev_codes[mask] = self._pad_codes[mask]
        for slot in rows:
            self.decoders[slot].reset(keep_markers)

    def _clear_caches(self, mask: torch.Tensor) -> None:
        """Zero the rows of ``mask`` in every attention cache. moshi's reset only rewinds
        their offsets, and masked-out positions still enter attention with weight 0:
        a NaN left by the previous stream (0 x NaN) would reach the next one."""
        rows = mask.view(1, -1, 1, 1, 1)
        for cache in self._kv_caches:
            cache.cache.masked_fill_(rows, 0.0)

    def add_marker(self, slot: int, marker_id: int, frames_pending: int) -> None:
        self._check_slot(slot)
        self.decoders[slot].add_marker(marker_id, frames_pending)

    def step(self, frames: Mapping[int, NDArray[np.float32]],
             masked_audio: NDArray[np.floating[Any]] | None = None) -> StepResult:
        """Run one batched step over the slots in ``frames`` (slot -> 1920 samples).

        ``masked_audio`` is what the rows of the other slots carry (zeros by default);
        it must not change any result, and the tests check that.
        """
        self._load_frames(frames, masked_audio)
        if not frames:
            return StepResult({}, {}, {})
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        mask[list(frames)] = True
        with models.compile_policy(self.device):
            text_tokens, prs, codes = self._forward(mask.to(self.device))
        self.steps_run += 1
        return self._decode(sorted(frames), text_tokens, prs, codes)

    def _load_frames(self, frames: Mapping[int, NDArray[np.float32]],
                     masked_audio: NDArray[np.floating[Any]] | None) -> None:
        for slot, frame in frames.items():
            self._check_slot(slot)
            check_frame(frame)
        self._pcm[:] = 0.0 if masked_audio is None else masked_audio.reshape(self._pcm.shape)
        for slot, frame in frames.items():
            self._pcm[slot, 0] = frame

    @torch.no_grad()
    def _forward(
        self, mask: torch.Tensor
    ) -> tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
        pcm = torch.from_numpy(self._pcm).to(self.device, non_blocking=True)
        self.model.mimi.set_exec_mask(mask)
        self.lm_gen.set_exec_mask(mask)
        codes = self.model.mimi.encode(pcm)
        lm_input = self._prev_codes
        self._prev_codes = torch.where(mask[:, None, None], codes, self._prev_codes)
        out = self.lm_gen.step_with_extra_heads(lm_input)
        assert out is not None  # support_out_of_sync: LMGen always answers
        tokens, heads = out
        prs = [head[:, 0, 0].float() for head in heads]
        packed = torch.cat([tokens[:, 0, :1].float(), *(p[:, None] for p in prs),
                            codes[:, :, 0].float()], dim=1).cpu().numpy()  # one host sync
        n_heads = len(prs)
        return (packed[:, 0].astype(np.int64), packed[:, 1:1 + n_heads],
                packed[:, 1 + n_heads:].astype(np.int64))

    def _decode(self, slots: list[int], text_tokens: NDArray[np.int64], prs: NDArray[np.float32],
                codes: NDArray[np.int64]) -> StepResult:
        events: dict[int, list[ev.Event]] = {}
        for slot in slots:
            decoder = self.decoders[slot]
            token = int(text_tokens[slot])
            slot_events = decoder.feed(token)
            if self.has_extra_heads:
                slot_events.insert(0, ev.Step(decoder.step_idx, tuple(map(float, prs[slot]))))
            events[slot] = slot_events
        return StepResult(
            events=events,
            text_tokens={slot: int(text_tokens[slot]) for slot in slots},
            audio_codes={slot: codes[slot].tolist() for slot in slots},
        )

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.batch_size:
            raise EngineInputError(f"slot {slot} is out of range (0..{self.batch_size - 1})")

    def state_nbytes(self) -> int:
        """Bytes held by every tensor of the streaming state (constant by design)."""
        seen: set[int] = set()
        states = [*self.model.mimi.get_streaming_state().values(),
                  *self.model.lm.get_streaming_state().values(),
                  *self.lm_gen.get_streaming_state().values()]
        return sum(_tensor_bytes(state, seen) for state in states) + sum(
            _tensor_bytes(t, seen) for t in (self._prev_codes, self._pad_codes))


def check_frame(frame: NDArray[np.float32]) -> None:
    if not isinstance(frame, np.ndarray) or frame.shape != (FRAME_SIZE,):
        shape = getattr(frame, "shape", type(frame).__name__)
        raise EngineInputError(f"a frame must be {FRAME_SIZE} mono samples, got {shape}")
    problem = protocol.sample_problem(frame)
    if problem is not None:
        raise EngineInputError(f"a frame {problem}")


def _kv_caches(*states: Mapping[str, object]) -> list[RingKVCache]:
    """Every rolling attention cache in these streaming states (Mimi's and the LM's)."""
    found = [getattr(state, "kv_cache", None) for group in states for state in group.values()]
    return [cache for cache in found if isinstance(cache, RingKVCache)]


def _tensor_bytes(obj: object, seen: set[int]) -> int:
    if isinstance(obj, torch.Tensor):
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        return obj.numel() * obj.element_size()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(_tensor_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(item, seen) for item in obj)
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("moshi"):
        return sum(_tensor_bytes(v, seen) for v in vars(obj).values())
    return 0
