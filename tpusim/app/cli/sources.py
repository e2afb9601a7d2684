"""``tpusim sources``: every source tag of the chip catalog with its full citation.

Usage::

    tpusim sources            # every tag ([GC], [INF], [AIC], ...) and what it cites
    tpusim sources INF AIC    # just these
"""

from __future__ import annotations

import argparse

from hwmodels.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "sources", help="expand source tags ([GC], [INF], [AIC], ...) into full citations",
        description="Print the full citation behind each source tag that catalog figures cite "
        "(see `tpusim hardware show NAME` for which figure cites what).")
    parser.add_argument("tags", nargs="*", metavar="TAG", help="tags to print (default: all)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hwmodels.sources import SOURCES

    wanted = [tag.strip("[]").upper() for tag in args.tags] or list(SOURCES)
    unknown = [tag for tag in wanted if tag not in SOURCES]
    if unknown:
        raise InputError(f"unknown source tag {', '.join(unknown)}; known: {', '.join(SOURCES)}")
    for tag in wanted:
        source = SOURCES[tag]
        print(f"[{tag}] {source.title}\n    {source.citation}\n")
    return 0
