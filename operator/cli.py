"""Subcommands of the operator (registered into the ``asrpool`` command)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    del subparsers  # filled in by the operator's issue
