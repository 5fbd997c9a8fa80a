"""Subcommands of the router (registered into the ``asrpool`` command)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    del subparsers  # filled in by the router's issue
