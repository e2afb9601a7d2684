"""``tpusim schema TOPIC``: the JSON Schema of a file format and an example the tools accept.

Usage::

    tpusim schema measurement              # schema, then an example (one record per line)
    tpusim schema measurement --example > my.jsonl   # just the example: a valid file
    tpusim schema hardware --json-schema   # just the JSON Schema

Topics: ``measurement`` (calibration's, through an entry point), ``model``, ``plan``,
``schedule``, ``hardware`` (see :mod:`tpusim.app.schemas`).
"""

from __future__ import annotations

import argparse
import sys

from tpusim.app.schemas import topic_names


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema and an example of a file format",
        description="Print the JSON Schema of a file a user writes (a measurement record, a "
        "model, a sharding plan, a schedule, a chip) followed by an example that the tools "
        "accept, so a valid file can be written from this output alone. Validation errors "
        "elsewhere name the topic to run.",
    )
    topics = topic_names()  # tpusim's own and those of the tpusim.schemas entry points
    parser.add_argument("topic", choices=topics, help="which format: " + ", ".join(topics))
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--example", action="store_true", help="print only the example (default: schema and example)")
    only.add_argument("--json-schema", action="store_true", help="print only the JSON Schema")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.app.schemas import example_text, schema_text, topic

    if args.example:
        sys.stdout.write(example_text(args.topic) + "\n")
        return 0
    if args.json_schema:
        sys.stdout.write(schema_text(args.topic) + "\n")
        return 0
    about = topic(args.topic)
    sys.stdout.write(f"# {args.topic}: {about.description}; file format: {about.file_kind}\n")
    sys.stdout.write("# JSON Schema\n" + schema_text(args.topic) + "\n")
    sys.stdout.write(f"# Example (valid; `tpusim schema {args.topic} --example` prints it alone)\n")
    sys.stdout.write(example_text(args.topic) + "\n")
    return 0
