"""Parity with Kyutai's own moshi-server, behaviour by behaviour, on shared weights.

Builds (once, cached) Kyutai's ``moshi-server`` at a pinned version, writes one seeded
random checkpoint (the ``small`` preset's real Mimi, which moshi-server hard-codes, and
its LM over Mimi's first 4 codebooks: ``parity_weights``) in both weight-name layouts,
then runs the same
catalogue of client behaviours (:mod:`asrpool_harness.bench.parity_cases`) against
moshi-server, an asrpool pod and a router in front of a pod, one server at a time.
Writes ``bench/results/parity.json`` (each behaviour's answers side by side, and a
verdict: ``same``, or ``differs`` with its documented reason) and the table of
``docs/parity.md``. Exits 1 on an undocumented difference or a case that failed.

    asrpool bench parity                 # or `make parity`, which installs Debian's
                                         # build dependencies first
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asrpool_harness.bench import (
    parity_cases,
    parity_padding,
    parity_reports,
    parity_servers,
    parity_weights,
)

Answers = dict[str, dict[str, dict[str, Any]]]  # case -> server -> answer
TABLE_START, TABLE_END = "<!-- parity table: asrpool bench parity -->", "<!-- end of table -->"
API_KEY = "parity-key"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=parity_servers.PINNED_VERSION,
                        help="moshi-server's crate version")
    parser.add_argument("--cache", type=Path, default=parity_servers.default_cache(),
                        help="where moshi-server is built, one folder per version")
    parser.add_argument("--preset", default="small",
                        help="a random preset with Mimi's real architecture")
    parser.add_argument("--batch-size", type=int, default=2, help="slots of every server")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="comma-separated subset of: " + ", ".join(SERVERS))
    parser.add_argument("--cases", default="",
                        help="comma-separated case names to run (default: all; a partial"
                             " run is for debugging, its report is not the committed one)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--report-only", action="store_true",
                        help="run no server: recompute the verdicts and the table from the"
                             " answers in OUT/parity.json (after a documented reason changed)")
    parser.add_argument("--docs", default="docs/parity.md",
                        help="the Markdown file whose table is rewritten (between its"
                             " markers); none: --docs ''")
    return parser.parse_args(argv)


SERVERS = (parity_servers.MOSHI_SERVER, parity_servers.POD, parity_servers.ROUTER)


def chosen_cases(opts: argparse.Namespace) -> list[parity_cases.Case]:
    names = {name.strip() for name in opts.cases.split(",") if name.strip()}
    return [case for case in parity_cases.catalogue(opts.batch_size)
            if not names or case.name in names]


def run_catalogue(target: parity_servers.Target, cases: list[parity_cases.Case],
                  answers: Answers) -> None:
    for case in cases:
        started = time.monotonic()
        answer = asyncio.run(parity_cases.run_case(case, target))
        answers.setdefault(case.name, {})[target.name] = answer
        print(f"  {target.name}: {case.name} ({time.monotonic() - started:.1f} s)"
              + (f" FAILED {answer['failed']}" if "failed" in answer else ""), flush=True)


def run_servers(names: list[str], opts: argparse.Namespace, binary: Path | None,
                shared: parity_weights.SharedCheckpoint, workdir: Path) -> Answers:
    answers: Answers = {}
    cases = chosen_cases(opts)
    for name in names:
        print(f"{name}: starting", flush=True)
        folder = workdir / name.replace(" ", "-")
        folder.mkdir()
        with _server(name, binary, shared, folder, opts.batch_size) as target:
            run_catalogue(target, cases, answers)
    return answers


def _server(name: str, binary: Path | None, shared: parity_weights.SharedCheckpoint,
            folder: Path, batch_size: int) -> contextlib.AbstractContextManager[
                parity_servers.Target]:
    if name == parity_servers.MOSHI_SERVER:
        assert binary is not None
        return parity_servers.moshi_server(binary, shared, folder, batch_size, API_KEY)
    if name == parity_servers.POD:
        return parity_servers.asrpool_pod(shared, folder, batch_size, API_KEY)
    return parity_servers.router(shared, folder, batch_size, API_KEY)


def build_report(answers: Answers, names: list[str], opts: argparse.Namespace,
                 seconds: float) -> dict[str, Any]:
    cases = chosen_cases(opts)
    rows = [parity_reports.row(case.name, case.description,
                               {name: answers[case.name][name] for name in names})
            for case in cases]
    about = {"moshi_server_version": opts.version, "preset": opts.preset,
             "batch_size": opts.batch_size, "servers": names, "seconds": round(seconds),
             "machine": {"python": platform.python_version()}}
    return parity_reports.report(rows, about)


def write_docs_table(path: Path, result: dict[str, Any]) -> bool:
    """Rewrite the table between the markers of ``path``; False when it has none."""
    if not path.is_file():
        return False
    text = path.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        return False
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    table = parity_reports.markdown_table(result["behaviours"], result["servers"])
    path.write_text(f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}")
    return True


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="asrpool-parity-") as folder:
        yield Path(folder)


def rereport(opts: argparse.Namespace) -> int:
    """The verdicts and the table again, from the answers of the last run."""
    last = json.loads((Path(opts.out) / "parity.json").read_text())
    rows = [parity_reports.row(r["behaviour"], r["description"], r["answers"])
            for r in last["behaviours"]]
    about = {key: value for key, value in last.items()
             if key not in ("benchmark", "counts", "behaviours")}
    return _write(parity_reports.report(rows, about), opts)


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if opts.report_only:
        return rereport(opts)
    names = [name.strip() for name in opts.servers.split(",") if name.strip()]
    unknown = [name for name in names if name not in SERVERS]
    if unknown or not names:
        print(f"asrpool bench parity: unknown servers {unknown}: choose from"
              f" {', '.join(SERVERS)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        binary = (parity_servers.ensure_installed(opts.cache, opts.version)
                  if parity_servers.MOSHI_SERVER in names else None)
    except parity_servers.InstallError as exc:
        print(f"asrpool bench parity: {exc}", file=sys.stderr)
        return 1
    with _workdir() as workdir:
        shared = parity_weights.write_shared_checkpoint(opts.preset, workdir / "checkpoint")
        answers = run_servers(names, opts, binary, shared, workdir)
        padded = padding_check(shared, answers, names, opts)
    result = build_report(answers, names, opts, time.monotonic() - started)
    if padded is not None:
        result["first_frame_padding_check"] = padded
    return _write(result, opts)


def padding_check(shared: parity_weights.SharedCheckpoint, answers: Answers,
                  names: list[str], opts: argparse.Namespace) -> dict[str, Any] | None:
    """The engine padded both ways against moshi-server's and the pod's words
    (``parity_padding``), when both ran those cases."""
    moshi, pod = parity_servers.MOSHI_SERVER, parity_servers.POD
    cases = parity_padding.CASES
    if moshi not in names or pod not in names or any(name not in answers for name in cases):
        return None
    return parity_padding.check(parity_padding.engine_words(shared, opts.batch_size),
                                answers, moshi, pod)


def _write(result: dict[str, Any], opts: argparse.Namespace) -> int:
    path = Path(opts.out) / "parity.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    docs = bool(opts.docs) and write_docs_table(Path(opts.docs), result)
    print(f"parity: {result['counts']} -> {path}" + (f", {opts.docs}" if docs else ""))
    for r in result["behaviours"]:
        if r["verdict"] in (parity_reports.UNDOCUMENTED, parity_reports.FAILED):
            print(f"  {r['behaviour']}: {r['verdict']} {r['fields']}")
    return 0 if parity_reports.passed(result) else 1
