"""The stream client's Opus form of a file (``asrpool stream --opus``)."""

from __future__ import annotations

import numpy as np

from asrpool.client import streaming
from asrpool.common import audio, oggopus, protocol
from asrpool.server import inputs


def test_audio_becomes_ogg_opus_pages_in_order_with_the_markers_kept() -> None:
    pcm = (0.1 * np.sin(np.arange(3 * protocol.SAMPLE_RATE) / 20)).astype(np.float32)
    plain = list(audio.kyutai_file_messages(pcm, marker_id=7))
    sent = list(streaming.as_opus(plain))
    kinds = [m["type"] for m in sent]
    assert set(kinds) == {"OggOpus", "Marker"} and kinds.count("Marker") == 1
    audio_samples = sum(len(m["pcm"]) for m in plain if m["type"] == "Audio")
    paced = sum(m["samples"] for m in sent if m["type"] == "OggOpus")
    assert audio_samples - protocol.FRAME_SIZE < paced <= audio_samples  # a page held back
    data = b"".join(m["data"] for m in sent if m["type"] == "OggOpus")
    assert data.startswith(b"OggS") and oggopus.page_size(data) is not None
    decoder = inputs.StreamInput().opus_decoder()
    decoded = decoder.decode(data, 10**9)
    assert abs(len(decoded) - paced) <= protocol.FRAME_SIZE
    before_marker = sum(m["samples"] for m in sent[:kinds.index("Marker")]
                        if m["type"] == "OggOpus")
    # The file and its silences before the marker, less what the encoder holds back.
    assert before_marker >= (1 + 5) * protocol.SAMPLE_RATE + len(pcm) - protocol.FRAME_SIZE
