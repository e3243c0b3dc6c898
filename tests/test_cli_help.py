"""The command line reference: every option of every subcommand has help text, and every
subcommand ends its help with examples, each of which the parser accepts as written."""

import argparse
import shlex

import pytest

from repcap_fast._cli_parser import EXAMPLES
from repcap_fast.cli import build_parser

PARSER = build_parser()
SUBPARSERS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options(parser):
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _bare(parser):
    return [a.option_strings[0] if a.option_strings else a.dest for a in _options(parser)
            if not (a.help and a.help.strip())]


@pytest.mark.parametrize("command", ["repcap", *SUBPARSERS])
def test_every_option_has_help(command):
    parser = PARSER if command == "repcap" else SUBPARSERS[command]
    assert not _bare(parser), f"repcap {command}: options without help text: {_bare(parser)}"


def test_every_subcommand_has_examples():
    assert set(EXAMPLES) == set(SUBPARSERS)
    for name, sub in SUBPARSERS.items():
        assert sub.format_help().rstrip().endswith(EXAMPLES[name].rstrip()), name
        assert "\nexamples:\n" in sub.format_help()
        long = [line for line in EXAMPLES[name].splitlines() if len(line) > 80]
        assert not long, f"repcap {name}: example lines wider than a terminal: {long}"


EXAMPLE_LINES = [line.split("#")[0].strip() for text in EXAMPLES.values() for line in text.splitlines()]


@pytest.mark.parametrize("line", [line for line in EXAMPLE_LINES if line])
def test_every_example_parses(line):
    words = shlex.split(line.split(">")[0])
    assert words[0] == "repcap"
    args = PARSER.parse_args(words[1:])  # a bad option or value exits with status 2 here
    assert args.command == words[1] and callable(args.func)


def test_a_missing_help_is_caught():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bare")
    parser.add_argument("--blank", help=" ")
    parser.add_argument("--told", help="has help")
    assert _bare(parser) == ["--bare", "--blank"]
