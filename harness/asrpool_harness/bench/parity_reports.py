"""The parity report: each behaviour's answers side by side, and a verdict.

A behaviour's answers (one dict per server) are compared field by field. All equal:
``same``. Otherwise ``differs``, with the fields that differ and, where every one of
them is a documented, deliberate difference of that behaviour (:data:`DOCUMENTED`),
its reason; a difference with no reason is ``undocumented`` and fails the run, as does
a case that could not run (``failed``). The report is JSON
(``bench/results/parity.json``) and a Markdown table (``docs/parity.md``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

SAME, DIFFERS, UNDOCUMENTED, FAILED = "same", "differs", "undocumented", "failed"
FAILURE_FIELD = "failed"
ERRORS_AND_CLOSES = (
    "asrpool sends `Error` with a stable `code` and closes with a status (1008 bad input,"
    " 1009 too large); moshi-server sends no `Error` and drops the TCP connection, no"
    " close frame. Deliberate: a client learns why (docs/reference/protocol.md)")

PADDING = (
    "first-frame padding: moshi-server zero-pads a stream's first frame in Mimi's"
    " downsampling convolution, Python moshi (and asrpool) replicate-pads it; that"
    " convolution follows Mimi's encoder and transformer, whose output is not zero even"
    " for silence, so every stream's first codes differ and a random LM answers other"
    " words from there on. Checked in every run: asrpool's engine padded with zeros says"
    " moshi-server's words exactly (first_frame_padding_check)")

STEP_COUNTERS = (
    "moshi-server's `step_idx` is one counter of its whole batch and its `buffered_pcm`"
    " the slot's leftover samples; asrpool counts each stream's steps from 1 and all of"
    " its audio waiting in the pod. No Kyutai client reads either"
    " (docs/internals/engine.md)")
BUSY = ("asrpool's `Error` adds `code: busy` (a plain client ignores it) and closes 1013 (try"
        " again); moshi-server closes with a close frame without a status (1005). Deliberate")
UNAUTHORIZED_BODY = ("asrpool's 401 says `unauthorized` in its body, moshi-server's is empty;"
                     " Kyutai's clients read the status alone")
MODULES = ("extra string fields (`model`, `draining` on pods; `pool` on routers, one module per"
           " pool); moshi-server's fields are all there")
ERRORS_AND_WORDS = f"{ERRORS_AND_CLOSES}. Words: {PADDING}"
LABELS = {PADDING: "first-frame padding", ERRORS_AND_CLOSES: "explicit Error and close",
          ERRORS_AND_WORDS: "explicit Error and close; first-frame padding",
          STEP_COUNTERS: "per-stream Step counters", BUSY: "explicit Error and close",
          UNAUTHORIZED_BODY: "401 body", MODULES: "extra fields"}


@dataclasses.dataclass(frozen=True)
class Documented:
    """A deliberate difference: the fields it may change, and why (``label``: the
    table's short name of the reason, which docs/parity.md explains)."""

    fields: frozenset[str]
    reason: str
    label: str


def _documented(fields: Sequence[str], reason: str) -> Documented:
    return Documented(frozenset(fields), reason, LABELS[reason])


DOCUMENTED: dict[str, Documented] = {
    "Step counters": _documented(["first_step_idx", "buffered_pcm_first"], STEP_COUNTERS),
    "speech first": _documented(["words"], PADDING),
    "file client": _documented(["words"], PADDING),
    "markers": _documented(["words"], PADDING),
    "Init mid-stream": _documented(["sequence", "words"], PADDING),
    "POST a WAV": _documented(["body"], PADDING),
    "text frame": _documented(["words"], PADDING),
    "full server": _documented(["messages", "close"], BUSY),
    "unknown type": _documented(["after", "error", "close", "words"], ERRORS_AND_WORDS),
    "malformed MessagePack": _documented(["after", "error", "close", "words"],
                                         ERRORS_AND_WORDS),
    "17 MiB frame": _documented(["after", "error", "close", "words"], ERRORS_AND_WORDS),
    "unknown type behind audio": _documented(["error", "close"], ERRORS_AND_CLOSES),
    "17 MiB frame behind audio": _documented(["error", "close"], ERRORS_AND_CLOSES),
    "no API key": _documented(["body"], UNAUTHORIZED_BODY),
    "bad API key": _documented(["body"], UNAUTHORIZED_BODY),
    "modules_info": _documented(["fields", "count"], MODULES),
}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


# Fields that measure (a time on this machine) rather than answer: shown, never compared.
MEASURED = frozenset({"seconds_until_free"})


def differing_fields(answers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The fields whose values are not the same in every answer (absent counts), but
    for :data:`MEASURED` ones."""
    fields = sorted({field for answer in answers.values() for field in answer} - MEASURED)
    return [field for field in fields
            if len({canonical(answer.get(field)) for answer in answers.values()}) > 1]


def verdict(behaviour: str, answers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``verdict``, the ``fields`` that differ and the ``reason`` for a documented one."""
    if any(FAILURE_FIELD in answer for answer in answers.values()):
        return {"verdict": FAILED, "fields": [], "reason": None}
    fields = differing_fields(answers)
    if not fields:
        return {"verdict": SAME, "fields": [], "reason": None}
    documented = DOCUMENTED.get(behaviour)
    if documented is not None and set(fields) <= documented.fields:
        return {"verdict": DIFFERS, "fields": fields, "reason": documented.reason,
                "label": documented.label}
    return {"verdict": UNDOCUMENTED, "fields": fields, "reason": None}


def row(behaviour: str, description: str, answers: Mapping[str, Mapping[str, Any]]
        ) -> dict[str, Any]:
    return {"behaviour": behaviour, "description": description,
            "answers": {name: dict(answer) for name, answer in answers.items()},
            **verdict(behaviour, answers)}


def report(rows: Sequence[Mapping[str, Any]], about: Mapping[str, Any]) -> dict[str, Any]:
    counts = {kind: sum(r["verdict"] == kind for r in rows)
              for kind in (SAME, DIFFERS, UNDOCUMENTED, FAILED)}
    return {"benchmark": "parity", **about, "counts": counts, "behaviours": list(rows)}


def passed(result: Mapping[str, Any]) -> bool:
    """No undocumented difference, no failed case, and the first-frame padding check (when
    it ran) explains the word differences."""
    counts = result["counts"]
    checks = result.get("first_frame_padding_check", {})
    explained = all(all(check.values()) for check in checks.values())
    return bool(counts[UNDOCUMENTED] == 0 and counts[FAILED] == 0 and explained)


# Markdown.

CELL_CHARS = 160


def cell(answer: Mapping[str, Any], fields: Sequence[str]) -> str:
    """An answer in a table cell: the differing fields (all when none differ), short."""
    shown = {field: answer.get(field) for field in fields} if fields else dict(answer)
    text = canonical(shown)
    if len(text) > CELL_CHARS:
        text = text[:CELL_CHARS - 3] + "..."
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def markdown_table(rows: Sequence[Mapping[str, Any]], servers: Sequence[str]) -> str:
    lines = ["| behaviour | " + " | ".join(servers) + " | verdict |",
             "| --- | " + " | ".join("---" for _ in servers) + " | --- |"]
    for r in rows:
        cells = [cell(r["answers"].get(name, {}), r["fields"]) for name in servers]
        lines.append(f"| {r['behaviour']} | " + " | ".join(cells) + f" | {_verdict_cell(r)} |")
    return "\n".join(lines)


def _verdict_cell(r: Mapping[str, Any]) -> str:
    if r["verdict"] == DIFFERS:
        return f"differs ({', '.join(r['fields'])}): {r.get('label') or r['reason']}"
    if r["verdict"] == UNDOCUMENTED:
        return f"**differs, undocumented** ({', '.join(r['fields'])})"
    return str(r["verdict"])
