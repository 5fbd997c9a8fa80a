"""The batched, rolling-cache streaming engine.

One engine owns a model and ``batch_size`` stream slots, all state allocated when it
starts (Mimi's streaming buffers, the LM's rolling KV caches of ``context`` steps).
Each :meth:`BatchedEngine.step` takes at most one 1920-sample frame per slot, masks
the slots without one (moshi's exec masks: their state does not move), and runs one
batched Mimi encode and one batched LM step. A slot joins or leaves through
:meth:`BatchedEngine.reset_slot`, which resets that slot alone. What is no model's
(frames in, words and markers out) is ``stepping.Engine``'s, which the paced stand-in
(``pacing``) shares.

As in Kyutai's moshi-server, the LM sees each stream's audio one step late: at a
slot's first step it gets the initial (padding) tokens, then the codes of the frame
before. The engine is not thread-safe: one loop owns it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMGen
from moshi.modules.streaming import StreamingModule
from moshi.modules.transformer import RingKVCache

from asrpool.server import models, stepping
from asrpool.server.models import LoadedModel

# The engine's names that ``stepping`` owns, where their users have always found them.
FRAME_SIZE = stepping.FRAME_SIZE
EngineInputError = stepping.EngineInputError
StepResult = stepping.StepResult
check_frame = stepping.check_frame


class BatchedEngine(stepping.Engine):
    def __init__(self, model: LoadedModel, batch_size: int) -> None:
        super().__init__(model.model_id, batch_size, model.asr_delay_in_tokens,
                         model.tokenizer.decode, len(model.lm.extra_heads) > 0)
        if model.lm.is_streaming or model.mimi.is_streaming:
            raise EngineInputError("this model is already owned by another open engine")
        self.model = model
        self.device = model.device
        self.lm_gen = LMGen(model.lm, use_sampling=False, temp=0.0, temp_text=0.0,
                            support_out_of_sync=True)
        self.num_codebooks = model.lm.num_audio_codebooks
        self._stack = contextlib.ExitStack()
        encoder_only(model.mimi)
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

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> BatchedEngine:
        return self

    def _reset_rows(self, rows: list[int]) -> None:
        """One ``reset_streaming(mask)`` on Mimi and LMGen (moshi's reset walks every
        streaming module once, whatever the mask) for these rows alone."""
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        mask[rows] = True
        mask = mask.to(self.device)
        self.model.mimi.reset_streaming(mask)
        self.lm_gen.reset_streaming(mask)
        self._clear_caches(mask)
        self._prev_codes[mask] = self._pad_codes[mask]

    def _clear_caches(self, mask: torch.Tensor) -> None:
        """Zero the rows of ``mask`` in every attention cache. moshi's reset only rewinds
        their offsets, and masked-out positions still enter attention with weight 0:
        a NaN left by the previous stream (0 x NaN) would reach the next one."""
        rows = mask.view(1, -1, 1, 1, 1)
        for cache in self._kv_caches:
            cache.cache.masked_fill_(rows, 0.0)

    def _forward(self, slots: list[int]) -> stepping.Forwarded:
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        mask[slots] = True
        with models.compile_policy(self.device):
            return self._model_step(mask.to(self.device))

    @torch.no_grad()
    def _model_step(self, mask: torch.Tensor) -> stepping.Forwarded:
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

    def state_nbytes(self) -> int:
        """Bytes held by every tensor of the streaming state (constant by design)."""
        seen: set[int] = set()
        states = [*self.model.mimi.get_streaming_state().values(),
                  *self.model.lm.get_streaming_state().values(),
                  *self.lm_gen.get_streaming_state().values()]
        return sum(_tensor_bytes(state, seen) for state in states) + sum(
            _tensor_bytes(t, seen) for t in (self._prev_codes, self._pad_codes))


def encoder_only(mimi: MimiModel) -> None:
    """Speech-to-text never decodes audio: Mimi's decoder side (its upsampling, its
    transformer and its convolutions) keeps no streaming state, allocated for no use
    (8.2 of stt-1b-en_fr's 114.8 MB per slot). moshi's detach leaves a module out of
    its parent's streaming (start, reset, exec mask); the parent's list of streaming
    children is cached at its first use, so it is made again here."""
    for part in (mimi.decoder, mimi.decoder_transformer, getattr(mimi, "upsample", None)):
        if part is None:
            continue
        for module in part.modules():
            if isinstance(module, StreamingModule):
                module.set_streaming_detached(True)
    mimi._cached_children = None


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
