"""Every ``manage.py`` command line the docs show parses with the command's own parser: a
documented flag that does not exist (``jobq_apikey create --queues``, issue 36) fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from django.core.management import CommandError, get_commands, load_command_class

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
SPAN = re.compile(r"`([^`\n]*(?:\n[^`\n]*)?manage\.py [^`]*)`")
# Lines showing a form rather than a command: placeholders, optional parts, alternatives.
PLACEHOLDER = re.compile(r"…|\.\.\.|<|>|\[|\||\bN\b")


def documented() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        lines = []
        for block in FENCE.findall(text):
            lines += block.replace("\\\n", " ").splitlines()
        lines += [" ".join(span.split()) for span in SPAN.findall(FENCE.sub("", text))]
        for line in lines:
            _, marker, rest = line.partition("manage.py ")
            command = rest.split("#")[0].strip()
            # A bare name is a mention ("see `manage.py jobq_export`"), not a command line.
            if marker and " " in command and not PLACEHOLDER.search(command):
                found.append((path.name, rest))
    return found


COMMANDS = documented()


def test_the_docs_show_command_lines():
    assert len(COMMANDS) > 20, COMMANDS  # the extraction found them


@pytest.mark.parametrize(("doc", "line"), COMMANDS)
def test_a_documented_command_line_parses(doc, line):
    name, *args = shlex.split(line, comments=True)
    commands = get_commands()
    if name not in commands:  # Django's own (runserver, migrate …) are listed too
        pytest.fail(f"{doc}: no command {name!r}")
    parser = load_command_class(commands[name], name).create_parser("manage.py", name)
    try:
        parser.parse_args(args)
    except CommandError as exc:  # how Django's parser refuses outside a command line
        pytest.fail(f"{doc}: manage.py {line}: {exc}")
    except SystemExit as exc:  # --help's way to succeed
        assert exc.code == 0, f"{doc}: manage.py {line}"
