"""Bash scripts read as bash runs them up to a command: comment lines, heredoc bodies that are text, the simple
commands of a line, assignments in order (with what bash would decide only when the script runs named, not guessed),
arrays and parameter expansion. The readers of launch scripts (`helpers.readers.openrlhf`, `launchers`) use it; it
knows nothing of any tool."""

from __future__ import annotations

import re
import shlex


def strip_comments(text: str) -> str:
    """Comment lines emptied, not removed: in bash a comment line ends a command continued onto it (`\\`), and the
    lines after it are commands of their own."""
    return "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())


class Unset(str):
    """A word that is only a variable the script never assigns: bash expands it to no word at all."""


class Unsettled(Exception):
    """A flag's value uses a variable the script does not settle (its Unknown's reason)."""


class Unknown(str):
    """A shell variable whose value the script does not settle before the command (assigned inside an if/case/loop
    block, or from a command's output), or a flag's value that uses one: the text as written, and `why`. The reader
    refuses it where it reads the flag, and lists it as written where it ignores the flag."""
    why: str = ""


def unknown(text: str, why: str) -> Unknown:
    u = Unknown(text)
    u.why = why
    return u


OPENERS, CLOSERS = {"if", "case", "for", "while", "until", "select"}, {"fi", "esac", "done"}
ASSIGN_RE = re.compile(r"([A-Za-z_]\w*)(\+?)=(.*)", re.S)


def commands(line: str) -> list[tuple[str, list[str]]]:
    """The simple commands of one line of shell, each as (the separator before it: '', ';', '&&', '||', '&', '|', ...,
    its words: quotes removed, comments dropped)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split, lex.commenters = True, "#"
    try:
        words = list(lex)
    except ValueError:                       # an unterminated quote: the line is not read
        return []
    out, current, before = [], [], ""
    for w in words:
        if w and set(w) <= set(";&|"):
            out.append((before, current))
            current, before = [], w
        else:
            current.append(w)
    out.append((before, current))
    return [(b, c) for b, c in out if c]


HEREDOC_RE = re.compile(r"^\s*(?::|cat)(?=[\s<])[^<]*<<-?\s*(['\"]?)(\w+)\1")
MAX_VALUE = 10_000                           # characters: longer than any flag value (a doubling bomb stops here)


def drop_heredocs(code: str) -> str:
    """Code with the bodies of `: <<'END'` and `cat <<EOF` heredocs emptied: text, not commands bash runs (a heredoc
    read into a variable, `read -r -d '' cmd <<EOF`, is kept: the command it builds runs)."""
    out, end = [], None
    for line in code.splitlines():
        if end is not None:
            out.append("")
            if line.strip() == end:
                end = None
            continue
        m = HEREDOC_RE.match(line)
        if m:
            end = m.group(2)
        out.append(line)
    return "\n".join(out)


def assignments(text: str) -> dict[str, str]:
    """Shell assignments before the command (NAME=value, NAME+=value, several on a line, export/declare/local/readonly
    NAME=value, unset NAME), in order as bash runs them, for expanding $NAME in flag values. NAME=value before a command
    is that command's alone and is not kept. A value bash would compute (a command's output, arithmetic), one assigned
    inside an if/case/loop block, a function or a { } group (also on one line: `if ...; then MB=8; fi`), after && or ||,
    or one past 10,000 characters, is an Unknown naming why."""
    out: dict[str, str] = {}
    depth = 0
    for line in text.splitlines():
        for before, words in commands(line):
            while words and (words[0] in OPENERS | CLOSERS | {"then", "else", "elif", "do", "{", "}", "function"}
                             or words[0].endswith("()")):
                first = words[0]
                depth += (first in OPENERS or first == "{") - ((first in CLOSERS or first == "}") and depth > 0)
                words = words[1:]
            if words and words[0] == "unset":
                for name in words[1:]:
                    out.pop(name, None)
                continue
            if words and words[0] in ("export", "declare", "local", "readonly", "typeset"):
                words = [w for w in words[1:] if not w.startswith("-")]
            assigns = [ASSIGN_RE.fullmatch(w) for w in words]
            if not words or not all(assigns):        # a command (with its own NAME=value prefix, if any)
                continue
            for m in assigns:
                name, plus, value = m.group(1), m.group(2), m.group(3)
                if value.startswith("("):
                    continue                          # an array: _arrays
                if depth or before in ("&&", "||"):
                    where = "after && or ||" if not depth else "inside an if/case/loop block, a function or a group"
                    out[name] = unknown(f"${name}", f"{name}={value!r} is {where}, so ${name} depends on how the "
                                                    f"script runs")
                elif "$((" in value:
                    out[name] = unknown(f"${name}", f"${name} is shell arithmetic ({name}={value[:60]!r})")
                elif "$(" in value or "`" in value:
                    out[name] = unknown(f"${name}", f"${name} is a command's output ({name}={value[:60]!r})")
                else:
                    try:
                        got = expand(value, out) if "$" in value else value
                    except Unsettled as e:
                        out[name] = unknown(f"${name}", f"${name} is built from {e}")
                        continue
                    if plus and isinstance(out.get(name), Unknown):
                        continue
                    got = (out.get(name) or "") + got if plus else got
                    out[name] = got if len(got) <= MAX_VALUE else unknown(
                        f"${name}", f"${name} grows past {MAX_VALUE:,} characters")
    return out


ARRAY_RE = re.compile(r"^[ \t]*([A-Za-z_]\w*)(\+?)=\((.*?)\)[ \t]*$", re.S | re.M)


def arrays(code: str) -> dict[str, str]:
    """Bash arrays of flags (NAME=( --flag value ... ), one or many lines, and NAME+=( ... ) appending to one), as
    their words joined by spaces, for expanding ${NAME[@]} where the command uses them (OpenRLHF's newer scripts build
    their command so)."""
    out: dict[str, str] = {}
    for m in ARRAY_RE.finditer(code):
        try:
            words = shlex.join(shlex.split(m.group(3), comments=True))     # an element's `# ...` comment
        except ValueError:
            words = " ".join(m.group(3).split())
        out[m.group(1)] = f"{out[m.group(1)]} {words}".strip() if m.group(2) and m.group(1) in out else words
    return out



def expand(value: str, variables: dict[str, str]) -> str:
    """$NAME, ${NAME} and bash's defaults ${NAME:-word} / ${NAME-word} (and := / =, which assign it too) expanded
    with the script's own assignments; a variable it never assigns stays as written (the reader then names it);
    Unsettled where one is assigned but not settled (an Unknown)."""
    def settled(name):
        have = variables.get(name)
        if isinstance(have, Unknown):
            raise Unsettled(have.why)
        return have

    def default(m):
        name, op, word = m.group(1), m.group(2), m.group(3)
        have = settled(name)
        if have is None or (op.startswith(":") and have == ""):
            if op.endswith("="):
                variables[name] = word
            return word
        return have
    value = re.sub(r"\$\{([A-Za-z_]\w*|\d+)(:?[-=])([^}]*)\}", default, value)     # (${1:-4}: a script argument)

    def plain(m):
        have = settled(m.group(1) or m.group(2))
        return m.group(0) if have is None else have
    if re.search(r"\$\{(?![A-Za-z_]\w*\})", value) or "$((" in value:
        raise Unsettled(f"{value[:60]!r} uses a bash expansion not evaluated here (a substring, a length, "
                        f"arithmetic, a case change)")
    return re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", plain, value)
