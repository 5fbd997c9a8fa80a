"""The parity report: verdicts from answers side by side, the Markdown table, and the
pure pieces of the catalogue's answers (no server, no cargo)."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import numpy as np

from asrpool.common import audio, protocol
from asrpool_harness.bench import parity, parity_cases, parity_padding, parity_reports

SERVERS = ("moshi-server", "asrpool pod")


def test_equal_answers_are_the_same() -> None:
    answers = {s: {"words": [["Word", "a", 0.0]], "close": "x"} for s in SERVERS}
    assert parity_reports.verdict("file client", answers) == {
        "verdict": "same", "fields": [], "reason": None}


def test_a_documented_difference_carries_its_reason() -> None:
    answers = {"moshi-server": {"status": None, "close": "close 1005", "messages": [1]},
               "asrpool pod": {"status": None, "close": "close 1013", "messages": [2]}}
    found = parity_reports.verdict("full server", answers)
    assert found["verdict"] == "differs"
    assert found["fields"] == ["close", "messages"]
    assert found["reason"] == parity_reports.DOCUMENTED["full server"].reason


def test_a_difference_beyond_the_documented_fields_is_undocumented() -> None:
    answers = {"moshi-server": {"close": "a", "results_back": True},
               "asrpool pod": {"close": "b", "results_back": False}}
    found = parity_reports.verdict("17 MiB frame behind audio", answers)
    assert (found["verdict"], found["fields"]) == ("undocumented", ["close", "results_back"])
    assert parity_reports.verdict("file client", answers)["verdict"] == "undocumented"


def test_a_measured_time_is_kept_but_not_compared() -> None:
    answers = {"moshi-server": {"next_client": "Ready", "seconds_until_free": 0.3},
               "asrpool pod": {"next_client": "Ready", "seconds_until_free": 10.2}}
    assert parity_reports.verdict("clean close after marker", answers)["verdict"] == "same"
    row = parity_reports.row("clean close after marker", "d", answers)
    assert "10.2" in parity_reports.markdown_table([row], list(answers))


def test_words_differ_by_the_first_frames_padding() -> None:
    answers = {"moshi-server": {"words": [1]}, "asrpool pod": {"words": [2]}}
    assert parity_reports.verdict("file client", answers)["reason"] == parity_reports.PADDING


def test_a_missing_field_differs_and_a_failed_case_fails() -> None:
    assert parity_reports.differing_fields({"a": {"x": 1}, "b": {}}) == ["x"]
    failed = {"a": {"x": 1}, "b": {"failed": "TimeoutError: "}}
    assert parity_reports.verdict("Ready", failed)["verdict"] == "failed"


def test_the_report_counts_and_passes_only_without_surprises() -> None:
    same = parity_reports.row("Ready", "d", {s: {"x": 1} for s in SERVERS})
    odd = parity_reports.row("Ready", "d", {"moshi-server": {"x": 1}, "asrpool pod": {"x": 2}})
    good = parity_reports.report([same], {})
    assert good["counts"] == {"same": 1, "differs": 0, "undocumented": 0, "failed": 0}
    assert parity_reports.passed(good)
    assert not parity_reports.passed(parity_reports.report([same, odd], {}))
    unexplained = dict(good, first_frame_padding_check={"file client": {
        "zeros_equal_moshi_server": False, "replicate_equals_pod": True}})
    assert not parity_reports.passed(unexplained)


def test_the_padding_check_compares_each_padding_with_its_server() -> None:
    found = {"file client": {"zeros": [["Word", "a", 0.0]], "replicate": [["Word", "b", 0.0]]}}
    answers = {"file client": {"ms": {"words": [["Word", "a", 0.0]]},
                               "pod": {"words": [["Word", "c", 0.0]]}}}
    assert parity_padding.check(found, answers, "ms", "pod") == {"file client": {
        "zeros_equal_moshi_server": True, "replicate_equals_pod": False}}


def test_the_table_shows_each_server_and_escapes_pipes() -> None:
    rows = [parity_reports.row("no API key", "d", {"moshi-server": {"status": 401, "body": ""},
                                                   "asrpool pod": {"status": 401,
                                                                   "body": "a|b"}})]
    table = parity_reports.markdown_table(rows, SERVERS)
    lines = table.splitlines()
    assert lines[0] == "| behaviour | moshi-server | asrpool pod | verdict |"
    assert lines[2].startswith('| no API key | `{"body": ""}` | `{"body": "a\\|b"}` | differs')
    assert len(parity_reports.cell({"x": "y" * 500}, [])) < 200


def test_the_docs_table_is_rewritten_between_its_markers(tmp_path: Path) -> None:
    docs = tmp_path / "parity.md"
    docs.write_text(f"intro\n{parity.TABLE_START}\nold\n{parity.TABLE_END}\nafter\n")
    result = parity_reports.report(
        [parity_reports.row("Ready", "d", {s: {"x": 1} for s in SERVERS})], {})
    result["servers"] = list(SERVERS)
    assert parity.write_docs_table(docs, result)
    text = docs.read_text()
    assert text.startswith(f"intro\n{parity.TABLE_START}\n| behaviour |")
    assert "old" not in text and text.endswith(f"{parity.TABLE_END}\nafter\n")
    assert not parity.write_docs_table(tmp_path / "none.md", result)


def test_a_step_packed_as_moshi_server_packs_it_is_float32() -> None:
    step = {"type": "Step", "step_idx": 3, "prs": [0.25, 0.5], "buffered_pcm": 0}
    assert parity_cases.float_width(protocol.encode(step)) == 32
    assert parity_cases.float_width(msgpack.packb(step)) == 64
    assert parity_cases.float_width(msgpack.packb({"type": "Ready"})) == 32  # no float


def test_words_and_markers_are_read_from_the_messages() -> None:
    messages = [{"type": "Ready"}, {"type": "Step"}, {"type": "Word", "text": "a",
                                                       "start_time": 0.5},
                {"type": "Step"}, {"type": "EndWord", "stop_time": 0.75},
                {"type": "Marker", "id": 4}]
    assert parity_cases.words(messages) == [["Word", "a", 0.5], ["EndWord", 0.75]]
    assert parity_cases.steps_before_markers(messages) == [[4, 2]]
    assert parity_cases.type_sequence(messages) == ["Ready", "Word", "EndWord", "Marker"]


def test_the_wav_posted_holds_the_samples_streamed() -> None:
    pcm = parity_cases.speech(0.5)
    decoded = audio.decode_audio_bytes(parity_cases.wav_bytes(pcm))
    assert np.array_equal(decoded, pcm)
    message = msgpack.unpackb(parity_cases.audio_frames(pcm)[0])
    assert len(message["pcm"]) == protocol.FRAME_SIZE
    assert np.array_equal(np.asarray(message["pcm"], dtype=np.float32),
                          pcm[:protocol.FRAME_SIZE])


def test_report_only_recomputes_the_verdicts_from_the_last_answers(tmp_path: Path) -> None:
    stale = parity_reports.report([{"behaviour": "no API key", "description": "d",
                                    "answers": {"moshi-server": {"body": ""},
                                                "asrpool pod": {"body": "x"}},
                                    "verdict": "undocumented", "fields": ["body"],
                                    "reason": None}], {"servers": list(SERVERS)})
    (tmp_path / "parity.json").write_text(json.dumps(stale))
    assert parity.main(["--report-only", "--out", str(tmp_path), "--docs", ""]) == 0
    fresh = json.loads((tmp_path / "parity.json").read_text())
    assert fresh["counts"]["differs"] == 1
    assert fresh["behaviours"][0]["label"] == "401 body"
    assert fresh["servers"] == list(SERVERS)
