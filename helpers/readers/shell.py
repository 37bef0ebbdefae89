"""Bash scripts evaluated as bash runs them, up to the commands they run, without running anything: the script is
lexed as bash lexes it (quotes, escapes, comments, line continuations, heredocs, arrays), parsed into its lists,
pipelines and compound commands (if/case/for/while/until, { } groups, ( ) subshells, functions), and walked in order
with the variables it assigns, so each simple command it reaches comes out with its words expanded as bash expands
them (parameter expansion and its defaults, lengths, substrings, pattern removal and case changes, integer
arithmetic, field splitting of unquoted expansions only, "$@" and "${ARGS[@]}" as separate words).

What bash decides only when the script runs is named, never guessed: a command's output (`$(...)`), a variable the
script never assigns (it would come from the environment), the script's own arguments, a branch whose condition is
not known here (both branches are walked; a variable either assigns becomes Unknown after the block, and the commands
inside carry the reason they may not run). Conditions are decided where they are plain: `true`, `false`, `:`,
`[ ... ]`, `test` and `[[ ... ]]` over settled values. Bounds: a value past MAX_VALUE characters is Unknown (a doubling
bomb stops there) and nested eval / `bash -c` / function calls stop at MAX_DEPTH, so no script hangs the reader.

The readers of launch scripts (`helpers.readers.openrlhf`, `launchers`) use it; it knows nothing of any tool."""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from dataclasses import dataclass, field

MAX_VALUE = 10_000                           # characters: longer than any flag value (a doubling bomb stops here)
MAX_DEPTH = 20                               # nested eval / bash -c / function calls
NAME_RE = re.compile(r"[A-Za-z_]\w*")
ASSIGN_RE = re.compile(r"([A-Za-z_]\w*)(\[[^\]]*\])?(\+?)=")
RESERVED = {"if", "then", "elif", "else", "fi", "case", "esac", "for", "select", "while", "until", "do", "done",
            "{", "}", "function", "!", "[["}
OPERATORS = sorted([";;&", ";;", ";&", "&&", "||", "|&", "&>>", "&>", ">>", "<<<", "<<-", "<<", ">&", "<&", ">|", "<>",
                    ";", "&", "|", "(", ")", "<", ">"], key=len, reverse=True)
REDIRECTS = {"&>>", "&>", ">>", "<<<", "<<-", "<<", ">&", "<&", ">|", "<>", "<", ">"}


class ShellError(Exception):
    """A script this package cannot read (a quote never closed, a block never ended): the line and why."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line


class Text(str):
    """A word of a command after expansion, with the line it was written on (None where a variable built it)."""
    line: int | None = None


class Unknown(Text):
    """A word whose value the script does not settle before the command (a command's output, a variable assigned
    inside a block whose condition is decided when the script runs, ...): the text as written, and `why`."""
    why: str = ""


class Unset(Text):
    """A word that is only a variable the script never assigns, or its own arguments: bash expands it to what the
    environment (or the command line) gives, which the script does not say; the text as written, and `why`."""
    why: str = ""


def text(value: str, line: int | None = None) -> Text:
    t = Text(value)
    t.line = line
    return t


def unknown(value: str, why: str, line: int | None = None) -> Unknown:
    u = Unknown(value)
    u.why, u.line = why, line
    return u


def unset(value: str, why: str, line: int | None = None) -> Unset:
    u = Unset(value)
    u.why, u.line = why, line
    return u


def strip_comments(code: str) -> str:
    """Comment lines emptied (for a quick look at a script's text; the evaluator reads comments itself)."""
    return "\n".join("" if line.lstrip().startswith("#") else line for line in code.splitlines())


# -- lexing --------------------------------------------------------------------------------------------------------

@dataclass
class Word:
    """A word as written: its parts ('lit' unquoted text, 'sq' single- or $'...'-quoted, 'dq' double-quoted text,
    ('var', expression, quoted), ('cmd', text, quoted), ('arith', text, quoted)), the raw text and its line."""
    parts: list
    raw: str
    line: int

    def keyword(self) -> str | None:
        return self.parts[0][1] if len(self.parts) == 1 and self.parts[0][0] == "lit" else None

    def literal(self) -> str | None:
        """The word's text where it has no expansion (quotes removed), else None."""
        if all(p[0] in ("lit", "sq", "dq") for p in self.parts):
            return "".join(p[1] for p in self.parts)
        return None


@dataclass
class Redirect:
    op: str
    target: Word | None
    line: int
    heredoc: str | None = None               # the body of a << heredoc
    quoted: bool = False                     # its delimiter was quoted: the body is not expanded


@dataclass
class ArrayAssign:
    name: str
    plus: bool
    items: list
    raw: str
    line: int


ANSI = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "v": "\v",
        "\\": "\\", "'": "'", '"': '"', "?": "?"}


class _Lexer:
    def __init__(self, code: str, line: int = 1):
        self.s, self.i, self.line = code, 0, line
        self.tokens: list = []
        self.pending: list[Redirect] = []
        self.delims: list[tuple[str, bool]] = []
        self.dead: set[int] = set()          # heredoc body lines: text, not commands

    def error(self, message: str):
        raise ShellError(self.line, message)

    def run(self) -> list:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and s[self.i + 1:self.i + 2] == "\n":
                self.i += 2
                self.line += 1
            elif c == "\n":
                self.tokens.append(("nl", self.line))
                self.i += 1
                self.line += 1
                self.heredocs()
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            else:
                op = next((o for o in OPERATORS if s.startswith(o, self.i)), None)
                if op is not None:
                    self.i += len(op)
                    if op in REDIRECTS:
                        self.redirect(op)
                    else:
                        self.tokens.append(("op", op, self.line))
                else:
                    self.word_token()
        self.tokens.append(("nl", self.line))
        self.heredocs()
        self.tokens.append(("eof", self.line))
        return self.tokens

    def heredocs(self):
        s = self.s
        for r, (delim, strip) in zip(self.pending, self.delims):
            body = []
            while self.i < len(s):
                end = s.find("\n", self.i)
                end = len(s) if end < 0 else end
                raw = s[self.i:end]
                self.i = end + 1
                self.dead.add(self.line)
                self.line += 1
                if (raw.lstrip("\t") if strip else raw) == delim:
                    break
                body.append(raw.lstrip("\t") if strip else raw)
            r.heredoc = "\n".join(body) + "\n"
        self.pending, self.delims = [], []

    def redirect(self, op: str):
        line = self.line
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1
        target = self.word() if self.i < len(self.s) and self.s[self.i] not in "\n;&|()<>" else None
        r = Redirect(op, target, line)
        if op in ("<<", "<<-"):
            if target is None:
                self.error("a heredoc (<<) without its delimiter word")
            r.quoted = any(p[0] in ("sq", "dq") for p in target.parts) or "\\" in target.raw
            delim = "".join(p[1] if p[0] in ("lit", "sq", "dq") else "" for p in target.parts)
            self.pending.append(r)
            self.delims.append((delim, op == "<<-"))
        self.tokens.append(("redir", r))

    def word_token(self):
        start, line = self.i, self.line
        m = ASSIGN_RE.match(self.s, self.i)
        if m and self.s[m.end():m.end() + 1] == "(" and not m.group(2):
            self.i = m.end() + 1
            items = []
            while True:
                while self.i < len(self.s) and self.s[self.i] in " \t\r\n":
                    self.line += self.s[self.i] == "\n"
                    self.i += 1
                if self.i >= len(self.s):
                    raise ShellError(line, f"the array {m.group(1)}=( ... is not closed with )")
                c = self.s[self.i]
                if c == ")":
                    self.i += 1
                    break
                if c == "#":
                    end = self.s.find("\n", self.i)
                    self.i = len(self.s) if end < 0 else end
                    continue
                if c == "\\" and self.s[self.i + 1:self.i + 2] == "\n":
                    self.i += 2
                    self.line += 1
                    continue
                if c in ";&|(<>":
                    raise ShellError(self.line, f"{c!r} inside the array {m.group(1)}=( ... ), which bash refuses")
                items.append(self.word())
            self.tokens.append(("array", ArrayAssign(m.group(1), bool(m.group(3)), items, self.s[start:self.i], line)))
            return
        w = self.word()
        if w.raw.isdigit() and self.i < len(self.s) and self.s[self.i] in "<>":
            return                                   # 2>&1: the descriptor of the redirection that follows
        self.tokens.append(("word", w))

    def word(self, stop: str = " \t\r\n;&|()<>") -> Word:
        s = self.s
        start, line = self.i, self.line
        parts: list = []
        buf: list[str] = []

        def flush():
            if buf:
                parts.append(("lit", "".join(buf)))
                buf.clear()
        while self.i < len(s):
            c = s[self.i]
            if c in stop:
                break
            if c == "\\":
                nxt = s[self.i + 1:self.i + 2]
                if nxt == "\n":
                    self.line += 1
                elif nxt:
                    flush()
                    parts.append(("sq", nxt))
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    self.error("a ' quote is not closed before the end of the script")
                flush()
                parts.append(("sq", s[self.i + 1:end]))
                self.line += s.count("\n", self.i, end)
                self.i = end + 1
            elif c == "$" and s[self.i + 1:self.i + 2] == "'":
                flush()
                parts.append(("sq", self.ansi()))
            elif c == '"' or (c == "$" and s[self.i + 1:self.i + 2] == '"'):
                flush()
                self.i += 1 if c == '"' else 2
                self.double(parts)
            elif c == "$":
                flush()
                parts.append(self.dollar(quoted=False))
            elif c == "`":
                flush()
                parts.append(("cmd", self.backtick(), False))
            else:
                buf.append(c)
                self.i += 1
        flush()
        return Word(parts, s[start:self.i], line)

    def ansi(self) -> str:
        s, i, out = self.s, self.i + 2, []
        while i < len(s) and s[i] != "'":
            if s[i] == "\\" and i + 1 < len(s):
                out.append(ANSI.get(s[i + 1], "\\" + s[i + 1]))
                i += 2
            else:
                self.line += s[i] == "\n"
                out.append(s[i])
                i += 1
        if i >= len(s):
            self.error("a $' quote is not closed before the end of the script")
        self.i = i + 1
        return "".join(out)

    def double(self, parts: list):
        s, buf, first = self.s, [], len(parts)
        while True:
            if self.i >= len(s):
                self.error('a " quote is not closed before the end of the script')
            c = s[self.i]
            if c == '"':
                self.i += 1
                break
            if c == "\\" and s[self.i + 1:self.i + 2] in ("$", "`", '"', "\\", "\n"):
                if s[self.i + 1] == "\n":
                    self.line += 1
                else:
                    buf.append(s[self.i + 1])
                self.i += 2
            elif c in "$`":
                if buf:
                    parts.append(("dq", "".join(buf)))
                    buf = []
                if c == "`":
                    parts.append(("cmd", self.backtick(), True))
                else:
                    p = self.dollar(quoted=True)
                    parts.append(("dq", p[1]) if p[0] == "lit" else p)
            else:
                self.line += c == "\n"
                buf.append(c)
                self.i += 1
        if buf or len(parts) == first:
            parts.append(("dq", "".join(buf)))

    def backtick(self) -> str:
        end = self.s.find("`", self.i + 1)
        if end < 0:
            self.error("a ` command substitution is not closed")
        body = self.s[self.i + 1:end]
        self.line += body.count("\n")
        self.i = end + 1
        return body

    def dollar(self, quoted: bool):
        s, i = self.s, self.i
        if s.startswith("$((", i):
            end = self.matching(i + 1, "(", ")")
            body = s[i + 3:end - 1] if s[end - 1:end] == ")" else s[i + 3:end]
            self.i = end + 1
            return ("arith", body, quoted) if s[end - 1:end] == ")" else ("cmd", s[i + 2:end], quoted)
        if s.startswith("$(", i):
            end = self.matching(i + 1, "(", ")")
            self.i = end + 1
            return ("cmd", s[i + 2:end], quoted)
        if s.startswith("${", i):
            end = self.matching(i + 1, "{", "}")
            self.i = end + 1
            return ("var", s[i + 2:end], quoted, s[i:end + 1])
        m = NAME_RE.match(s, i + 1)
        if m:
            self.i = m.end()
            return ("var", m.group(0), quoted, "$" + m.group(0))
        if i + 1 < len(s) and (s[i + 1].isdigit() or s[i + 1] in "@*#?$!-"):
            self.i = i + 2
            return ("var", s[i + 1], quoted, s[i:i + 2])
        self.i = i + 1
        return ("lit", "$")

    def matching(self, i: int, open_: str, close: str) -> int:
        """The index of the `close` that ends the group opened at i (quotes and nesting skipped)."""
        s, depth, k = self.s, 0, i
        while k < len(s):
            c = s[k]
            if c == "\\":
                k += 2
                continue
            if c == "'" and open_ == "(":
                k = s.find("'", k + 1)
                if k < 0:
                    break
            elif c == '"':
                j = k + 1
                while j < len(s) and s[j] != '"':
                    j += 2 if s[j] == "\\" else 1
                k = j
            elif c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    self.line += s.count("\n", i, k)
                    return k
            k += 1
        self.error(f"a ${open_} ... {close} is not closed before the end of the script")


# -- parsing -------------------------------------------------------------------------------------------------------

@dataclass
class Simple:
    assigns: list                  # (name, index, plus, Word) or ArrayAssign: the command's NAME=value prefixes
    words: list                    # Word or ArrayAssign (declare -a A=(...))
    redirects: list
    line: int


@dataclass
class Pipeline:
    negate: bool
    commands: list


@dataclass
class Node:
    kind: str                      # if, while, until, for, select, case, group, subshell, function, arith
    line: int
    parts: dict = field(default_factory=dict)


class _Parser:
    def __init__(self, tokens: list):
        self.t, self.k = tokens, 0

    def peek(self):
        return self.t[self.k]

    def next(self):
        tok = self.t[self.k]
        self.k += 1
        return tok

    def kw(self, tok=None) -> str | None:
        tok = tok or self.peek()
        return tok[1].keyword() if tok[0] == "word" else None

    def line(self) -> int:
        tok = self.peek()
        return tok[1].line if tok[0] in ("word", "redir", "array") else tok[-1] if tok[0] in ("op", "nl", "eof") else 0

    def skip_newlines(self):
        while self.peek()[0] == "nl":
            self.k += 1

    def expect(self, word: str, opened: str, line: int):
        if self.kw() != word:
            raise ShellError(line, f"'{opened}' (line {line}) has no '{word}' where bash expects it")
        self.k += 1

    def program(self) -> list:
        items = self.items(set())
        tok = self.peek()
        if tok[0] != "eof":
            what = self.kw(tok) or (tok[1] if tok[0] == "op" else "?")
            raise ShellError(self.line(), f"unexpected '{what}' (bash: syntax error near unexpected token)")
        return items

    def items(self, stops: set) -> list:
        out, conn = [], ";"
        while True:
            self.skip_newlines()
            tok = self.peek()
            if tok[0] == "eof" or (tok[0] == "op" and tok[1] in stops) or (self.kw() in stops):
                return out
            if tok[0] == "op" and tok[1] in (";", "&"):
                raise ShellError(tok[2], f"'{tok[1]}' with no command before it (bash: syntax error near unexpected "
                                         f"token)")
            if tok[0] == "op" and tok[1] in (")", ";;", ";&", ";;&"):
                return out
            if self.kw() in ("then", "elif", "else", "fi", "do", "done", "esac", "}"):
                raise ShellError(self.line(), f"'{self.kw()}' without the block that opens it")
            out.append((conn, self.pipeline()))
            tok = self.peek()
            if tok[0] == "op" and tok[1] in ("&&", "||"):
                conn = tok[1]
                self.k += 1
                self.skip_newlines()
                continue
            conn = ";"
            if tok[0] == "op" and tok[1] in (";", "&") or tok[0] == "nl":
                self.k += 1

    def pipeline(self) -> Pipeline:
        negate = False
        if self.kw() == "!":
            negate = True
            self.k += 1
        cmds = [self.command()]
        while self.peek()[0] == "op" and self.peek()[1] in ("|", "|&"):
            self.k += 1
            self.skip_newlines()
            cmds.append(self.command())
        return Pipeline(negate, cmds)

    def redirects(self) -> list:
        out = []
        while self.peek()[0] == "redir":
            out.append(self.next()[1])
        return out

    def command(self):
        tok, kw, line = self.peek(), self.kw(), self.line()
        if kw == "if":
            self.k += 1
            branches = []
            cond = self.items({"then"})
            self.expect("then", "if", line)
            body = self.items({"elif", "else", "fi"})
            branches.append((cond, body))
            while self.kw() == "elif":
                self.k += 1
                cond = self.items({"then"})
                self.expect("then", "elif", line)
                branches.append((cond, self.items({"elif", "else", "fi"})))
            other = None
            if self.kw() == "else":
                self.k += 1
                other = self.items({"fi"})
            self.expect("fi", "if", line)
            return Node("if", line, {"branches": branches, "else": other, "redirects": self.redirects()})
        if kw in ("while", "until"):
            self.k += 1
            cond = self.items({"do"})
            self.expect("do", kw, line)
            body = self.items({"done"})
            self.expect("done", kw, line)
            return Node(kw, line, {"cond": cond, "body": body, "redirects": self.redirects()})
        if kw in ("for", "select"):
            self.k += 1
            words, name = None, None
            if self.peek()[0] == "op" and self.peek()[1] == "(":
                depth = 0
                while True:                                  # for (( ... )): arithmetic, not evaluated
                    t = self.next()
                    if t[0] == "eof":
                        raise ShellError(line, "'for ((' is not closed")
                    if t[0] == "op" and t[1] in "()":
                        depth += 1 if t[1] == "(" else -1
                        if depth == 0:
                            break
            else:
                t = self.next()
                if t[0] != "word":
                    raise ShellError(line, f"'{kw}' without its variable name")
                name = t[1].raw
                self.skip_newlines()
                if self.kw() == "in":
                    self.k += 1
                    words = []
                    while self.peek()[0] == "word":
                        words.append(self.next()[1])
            while self.peek()[0] == "nl" or (self.peek()[0] == "op" and self.peek()[1] == ";"):
                self.k += 1
            if self.kw() == "{":
                self.k += 1
                body = self.items({"}"})
                self.expect("}", kw, line)
            else:
                self.expect("do", kw, line)
                body = self.items({"done"})
                self.expect("done", kw, line)
            return Node("for", line, {"name": name, "words": words, "body": body, "kind": kw,
                                      "redirects": self.redirects()})
        if kw == "case":
            self.k += 1
            t = self.next()
            if t[0] != "word":
                raise ShellError(line, "'case' without its word")
            subject = t[1]
            self.skip_newlines()
            self.expect("in", "case", line)
            arms = []
            while True:
                self.skip_newlines()
                if self.kw() == "esac":
                    self.k += 1
                    break
                if self.peek()[0] == "eof":
                    raise ShellError(line, "'case' (line %d) has no 'esac'" % line)
                if self.peek()[0] == "op" and self.peek()[1] == "(":
                    self.k += 1
                patterns = []
                while True:
                    t = self.next()
                    if t[0] != "word":
                        raise ShellError(line, "a case pattern is not followed by ')'")
                    patterns.append(t[1])
                    t = self.next()
                    if t[0] == "op" and t[1] == ")":
                        break
                    if not (t[0] == "op" and t[1] == "|"):
                        raise ShellError(line, "a case pattern is not followed by ')'")
                body = self.items({"esac", ";;", ";&", ";;&"})
                arms.append((patterns, body))
                if self.peek()[0] == "op" and self.peek()[1] in (";;", ";&", ";;&"):
                    self.k += 1
            return Node("case", line, {"subject": subject, "arms": arms, "redirects": self.redirects()})
        if kw == "{":
            self.k += 1
            body = self.items({"}"})
            self.expect("}", "{", line)
            return Node("group", line, {"body": body, "redirects": self.redirects()})
        if tok[0] == "op" and tok[1] == "(":
            self.k += 1
            if self.peek()[0] == "op" and self.peek()[1] == "(":       # (( ... )): arithmetic, not evaluated
                depth = 1
                while depth:
                    t = self.next()
                    if t[0] == "eof":
                        raise ShellError(line, "'((' is not closed")
                    if t[0] == "op" and t[1] in "()":
                        depth += 1 if t[1] == "(" else -1
                return Node("arith", line, {"redirects": self.redirects()})
            body = self.items({")"})
            if not (self.peek()[0] == "op" and self.peek()[1] == ")"):
                raise ShellError(line, "'(' (line %d) is not closed with ')'" % line)
            self.k += 1
            return Node("subshell", line, {"body": body, "redirects": self.redirects()})
        ahead = self.t[self.k + 1:self.k + 3]
        if kw == "function" or (tok[0] == "word" and len(ahead) == 2 and all(t[0] == "op" for t in ahead)
                                and (ahead[0][1], ahead[1][1]) == ("(", ")")):
            if kw == "function":
                self.k += 1
            name = self.next()[1].raw
            if self.peek()[0] == "op" and self.peek()[1] == "(":
                self.k += 2
            self.skip_newlines()
            return Node("function", line, {"name": name, "body": self.command()})
        if kw == "[[":
            self.k += 1
            words = [tok[1]]
            while True:
                t = self.next()
                if t[0] == "eof" or t[0] == "nl":
                    raise ShellError(line, "'[[' is not closed with ']]'")
                if t[0] == "word":
                    words.append(t[1])
                    if t[1].keyword() == "]]":
                        break
                elif t[0] == "op":
                    words.append(Word([("lit", t[1])], t[1], t[2]))
                elif t[0] == "redir":
                    words.append(Word([("lit", t[1].op)], t[1].op, t[1].line))
                    if t[1].target:
                        words.append(t[1].target)
            return Simple([], words, self.redirects(), line)
        return self.simple()

    def simple(self) -> Simple:
        line = self.line()
        assigns, words, redirects = [], [], []
        while True:
            tok = self.peek()
            if tok[0] == "word":
                w = tok[1]
                m = ASSIGN_RE.match(w.parts[0][1]) if not words and w.parts and w.parts[0][0] == "lit" else None
                if m:
                    value = Word([("lit", w.parts[0][1][m.end():])] + w.parts[1:], w.raw[m.end():], w.line)
                    assigns.append((m.group(1), m.group(2), bool(m.group(3)), value))
                else:
                    words.append(w)
            elif tok[0] == "array":
                (words if words else assigns).append(tok[1])
            elif tok[0] == "redir":
                redirects.append(tok[1])
            else:
                break
            self.k += 1
        if not (assigns or words or redirects):
            tok = self.peek()
            what = tok[1] if tok[0] == "op" else "end of file"
            raise ShellError(line, f"unexpected '{what}' (bash: syntax error near unexpected token)")
        return Simple(assigns, words, redirects, line)


# -- evaluation ----------------------------------------------------------------------------------------------------

class _Undecided(Exception):
    def __init__(self, why: str, unset_var: bool = False):
        super().__init__(why)
        self.why, self.unset_var = why, unset_var


class _Stop(Exception):
    """exit (or return at the top), run whatever the script's state: nothing after it runs."""


class _Return(Exception):
    pass


@dataclass
class Command:
    """A simple command the script runs: its words expanded (Text, Unknown, Unset), its line, why it may not run
    (None: it runs whenever the script gets there), and the environment it sees (exported variables and its own
    NAME=value prefixes)."""
    words: list
    line: int
    cond: str | None
    env: dict


@dataclass
class Script:
    commands: list
    variables: dict
    dead_lines: set
    sourced: list


class _State:
    def __init__(self):
        self.vars: dict[str, str] = {}
        self.arrays: dict[str, list | Unknown] = {}
        self.origin: dict[str, str] = {}         # NAME -> the assignment as written, for messages
        self.exported: set[str] = set()
        self.allexport = False
        self.args: list | None = None            # None: the script's own arguments, given when it runs
        self.funcs: dict[str, Node] = {}
        self.hidden: set[str] = set()            # assigned in an outer script but not exported to this one

    def copy(self) -> "_State":
        new = _State()
        new.vars, new.arrays, new.origin = dict(self.vars), dict(self.arrays), dict(self.origin)
        new.exported, new.allexport, new.args = set(self.exported), self.allexport, self.args
        new.funcs, new.hidden = dict(self.funcs), set(self.hidden)
        return new


ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: None,
             ast.Div: None, ast.FloorDiv: None, ast.Pow: None, ast.LShift: None, ast.RShift: None,
             ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}
CMP_OPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
           ast.NotEq: operator.ne}


class _Evaluator:
    def __init__(self, state: _State | None = None, line: int | None = None, depth: int = 0, cond: str | None = None,
                 commands: list | None = None, sourced: list | None = None):
        self.st = state or _State()
        self.at_line = line                      # nested code (eval, bash -c): its commands are on this line
        self.depth = depth
        self.cond = cond
        self.commands = [] if commands is None else commands
        self.sourced = [] if sourced is None else sourced
        self.in_function = 0

    # ---- values
    def line(self, n: int) -> int:
        return self.at_line or n

    def from_env_why(self, name: str) -> str:
        if name in self.st.hidden:
            return (f"${name} is assigned in the outer script but not exported, so the `bash -c` command does not "
                    f"see it")
        also = f" or from {', '.join(self.sourced)}, which the script sources" if self.sourced else ""
        return f"${name} is not assigned in the script before the command (it would come from the environment{also})"

    def value(self, name: str) -> str | None:
        """A variable's value, None where unset; raises _Undecided where the script does not settle it."""
        st = self.st
        if name.isdigit():
            n = int(name)
            if n == 0:
                return "script"
            if st.args is None:
                return None
            return st.args[n - 1] if n <= len(st.args) else None
        if name in "#?$!-":
            if name == "#" and st.args is not None:
                return str(len(st.args))
            raise _Undecided(f"${name} is decided when the script runs")
        if name in st.vars:
            v = st.vars[name]
            if isinstance(v, Unknown):
                raise _Undecided(v.why)
            return v
        if name in st.arrays:
            a = st.arrays[name]
            if isinstance(a, Unknown):
                raise _Undecided(a.why)
            if a and isinstance(a[0], (Unknown, Unset)):
                raise _Undecided(a[0].why, unset_var=isinstance(a[0], Unset))
            return a[0] if a else None                  # (an empty array's ${A} is unset: ${A-4} is 4)
        return None

    def must(self, name: str, raw: str) -> str:
        v = self.value(name)
        if v is None:
            if name.isdigit():
                raise _Undecided(f"${name} is the script's argument {name}, given when it runs", unset_var=True)
            raise _Undecided(self.from_env_why(name), unset_var=True)
        return v

    def elements(self, name: str) -> list:
        st = self.st
        if name in ("@", "*"):
            if st.args is None:
                raise _Undecided(f"${name} is the script's arguments, given when it runs", unset_var=True)
            return list(st.args)
        if name in st.arrays:
            a = st.arrays[name]
            if isinstance(a, Unknown):
                raise _Undecided(a.why)
            return list(a)
        v = self.value(name)
        return [] if v is None else [v]

    def fragment(self, code: str, line: int) -> str:
        """A word inside ${NAME:-word} etc., expanded as one string."""
        lex = _Lexer(code, line)
        w = lex.word(stop="")
        return "".join(self.pieces(w, joined=True)[0])

    def param(self, expr: str, raw: str, line: int):
        """${...}/$NAME: a str, or a list of separate words ("$@", "${A[@]}")."""
        m = re.match(r"(#)?(!)?([A-Za-z_]\w*|\d+|[@*#?$!-])(\[([^\]]*)\])?(.*)", expr, re.S)
        if not m or m.group(2):
            raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here (an indirect or unusual one)")
        length, _, name, _, index, rest = m.groups()
        if length and name == "#" and not index and not rest:     # ${##}: the length of $#
            length, name = None, "#"
        if length:
            if rest:
                raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here")
            if index in ("@", "*") or (name in ("@", "*") and index is None):
                return str(len(self.elements(name)))
            return str(len(self.index(name, index, raw) if index is not None else self.must(name, raw)))
        if index in ("@", "*"):
            items = self.elements(name)
            if rest:
                raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here (an operation on an array)")
            return items if index == "@" else " ".join(items)
        if name in ("@", "*") and not rest:
            items = self.elements(name)
            return items if name == "@" else " ".join(items)
        have = self.index(name, index, raw) if index is not None else self.value(name)
        known = name in self.st.vars or name in self.st.arrays        # (an element it lacks is empty, not the env's)
        if not rest:
            if have is None:
                return "" if known else self.must(name, raw)
            return have
        op = re.match(r"(:?[-=+?])|(##?|%%?)|(\^\^?|,,?)|(//?|/#|/%)|(:)|(@)", rest)
        if not op:
            raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here")
        arg = rest[op.end():]
        if op.group(1):
            o = op.group(1)
            missing = have is None or (o.startswith(":") and have == "")
            if o.endswith("-"):
                return self.fragment(arg, line) if missing else have
            if o.endswith("="):
                if missing:
                    got = self.fragment(arg, line)
                    self.assign_value(name, text(got), f"{name}={arg!r}")
                    return got
                return have
            if o.endswith("+"):
                return "" if missing else self.fragment(arg, line)
            if missing:
                if have is None:
                    raise _Undecided(self.from_env_why(name) + f" (and bash stops there: {raw})", unset_var=True)
                raise _Undecided(f"${name} is empty, so bash stops at {raw}")
            return have
        value = ("" if known else self.must(name, raw)) if have is None else have
        if op.group(2):
            pattern = self.fragment(arg, line)
            return self.remove(value, pattern, op.group(2), raw)
        if op.group(3):
            o = op.group(3)
            if arg:
                raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here (a case change by pattern)")
            up = o.startswith("^")
            if len(o) == 2:
                return value.upper() if up else value.lower()
            return (value[:1].upper() if up else value[:1].lower()) + value[1:]
        if op.group(4):
            raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here (a pattern replacement)")
        if op.group(5):
            spec = arg.split(":", 1)
            try:
                offset = self.arith(spec[0], line) if spec[0].strip() else 0
                count = self.arith(spec[1], line) if len(spec) > 1 else None
            except _Undecided:
                raise
            if offset < 0:
                offset = max(0, len(value) + offset)
            if count is None:
                return value[offset:]
            if count < 0:
                return value[offset:len(value) + count] if len(value) + count >= offset else ""
            return value[offset:offset + count]
        raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here (a transformation)")

    def index(self, name: str, index: str, raw: str) -> str | None:
        if name not in self.st.arrays:
            if index.strip() in ("0", ""):
                return self.value(name)
            return None
        a = self.st.arrays[name]
        if isinstance(a, Unknown):
            raise _Undecided(a.why)
        k = self.arith(index, None)
        if k < 0:
            k += len(a)
        return a[k] if 0 <= k < len(a) else None

    @staticmethod
    def remove(value: str, pattern: str, op: str, raw: str) -> str:
        if len(value) > 1000:
            raise _Undecided(f"{raw!r}: a pattern removal over a value this long is not evaluated here")
        rx = re.compile(fnmatch.translate(pattern), re.S)
        cuts = range(len(value) + 1)
        if op.startswith("#"):
            order = cuts if op == "#" else reversed(cuts)
            for k in order:
                if rx.match(value[:k]):
                    return value[k:]
        else:
            order = reversed(cuts) if op == "%" else cuts
            for k in order:
                if rx.match(value[k:]):
                    return value[:k]
        return value

    def arith(self, expr: str, line: int | None) -> int:
        """Bash integer arithmetic over settled values: + - * / % ** << >> & | ^, comparisons, unary +/-, names."""
        def sub(m):
            got = self.param(m.group(1) or m.group(2), m.group(0), line or 0)
            if isinstance(got, list):
                raise _Undecided(f"$(( {expr.strip()} )) uses an array as a number")
            return got
        body = re.sub(r"\$\{([^}]*)\}|\$([A-Za-z_]\w*|\d)", sub, expr)
        if "$" in body or "`" in body or re.search(r"\+\+|--|(?<![<>=!])=(?!=)|\?", body):
            raise _Undecided(f"$(( {expr.strip()} )) is arithmetic with a command or an assignment, not evaluated here")
        body = body.replace("&&", " and ").replace("||", " or ")
        try:
            tree = ast.parse(body.strip() or "0", mode="eval")
        except SyntaxError:
            raise _Undecided(f"$(( {expr.strip()} )) is not arithmetic bash evaluates") from None

        def ev(node) -> int:
            if isinstance(node, ast.Expression):
                return ev(node.body)
            if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
                return node.value
            if isinstance(node, ast.Name):
                v = self.value(node.id)
                if v is None:
                    raise _Undecided(self.from_env_why(node.id), unset_var=True)
                if v == "":
                    return 0
                v = v.strip()
                if re.fullmatch(r"[+-]?\d+", v):
                    return int(v)
                raise _Undecided(f"${node.id} is {v[:40]!r}, not a number bash's arithmetic takes")
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)):
                x = ev(node.operand)
                return {ast.USub: -x, ast.UAdd: x, ast.Not: int(not x), ast.Invert: ~x}[type(node.op)]
            if isinstance(node, ast.BinOp) and type(node.op) in ARITH_OPS:
                a, b = ev(node.left), ev(node.right)
                if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
                    if b == 0:
                        raise _Undecided(f"$(( {expr.strip()} )) divides by zero (bash stops there)")
                    q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
                    return a - q * b if isinstance(node.op, ast.Mod) else q
                if isinstance(node.op, ast.Pow):
                    if b < 0 or (abs(a) > 1 and b > 63):
                        raise _Undecided(f"$(( {expr.strip()} )) is out of bash's 64-bit range")
                    return a ** b
                if isinstance(node.op, (ast.LShift, ast.RShift)):
                    if not 0 <= b < 64:
                        raise _Undecided(f"$(( {expr.strip()} )) shifts out of bash's 64-bit range")
                    return a << b if isinstance(node.op, ast.LShift) else a >> b
                out = ARITH_OPS[type(node.op)](a, b)
                if abs(out) >= 2 ** 63:
                    raise _Undecided(f"$(( {expr.strip()} )) is out of bash's 64-bit range")
                return out
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in CMP_OPS:
                return int(CMP_OPS[type(node.ops[0])](ev(node.left), ev(node.comparators[0])))
            if isinstance(node, ast.BoolOp):
                vals = [ev(v) for v in node.values]
                return int(all(vals) if isinstance(node.op, ast.And) else any(vals))
            raise _Undecided(f"$(( {expr.strip()} )) is not arithmetic evaluated here")
        return ev(tree)

    def pieces(self, w: Word, joined: bool = False) -> tuple[list, bool]:
        """([(text, split?) or ('@', [words])], whether the word had quotes); _Undecided propagates."""
        out, quoted = [], False
        for p in w.parts:
            kind = p[0]
            if kind == "lit":
                out.append((p[1], False))
            elif kind in ("sq", "dq"):
                out.append((p[1], False))
                quoted = True
            elif kind == "cmd" and not strip_comments(p[1]).strip():
                out.append(("", not p[2] and not joined))           # `# a comment`: no output, no word
            elif kind == "cmd":
                raise _Undecided(f"{w.raw[:60]!r} is a command's output ($(...) or backquotes), decided when the "
                                 f"script runs")
            elif kind == "arith":
                out.append((str(self.arith(p[1], w.line)), not p[2] and not joined))
                quoted = quoted or p[2]
            else:
                got = self.param(p[1], p[3], w.line)
                if isinstance(got, list):
                    odd = next((v for v in got if isinstance(v, (Unknown, Unset))), None)
                    if joined and odd is not None:
                        raise _Undecided(odd.why)
                    if joined:
                        out.append((" ".join(got), False))
                    else:
                        out.append(("@" if p[2] else "@@", got))
                else:
                    out.append((got, not p[2] and not joined))
                quoted = quoted or p[2]
        if joined:
            return ["".join(t if isinstance(t, str) else " ".join(t) for t, _ in out)], quoted
        return out, quoted

    def expand(self, w: Word) -> list:
        """The words bash makes of `w`: Text (with its line when written plainly), or one Unknown / Unset."""
        try:
            pieces, quoted = self.pieces(w)
        except _Undecided as e:
            only = len(w.parts) == 1 and w.parts[0][0] == "var"
            if e.unset_var and only:
                return [unset(w.raw, e.why, w.line)]
            return [unknown(w.raw, e.why, w.line)]
        plain = all(p[0] in ("lit", "sq", "dq") for p in w.parts)
        fields: list = []
        cur, have, odd = "", False, None         # odd: the current field is exactly this Unknown/Unset element
        lines: dict[str, int] = {}

        class Taint(Exception):
            pass

        def add(t):
            nonlocal cur, have, odd
            if isinstance(t, (Unknown, Unset)):
                if cur or odd is not None:
                    raise Taint(t.why)
                odd = t
            elif t:
                if odd is not None:
                    raise Taint(odd.why)
                cur += t
            have = True

        def push():
            nonlocal cur, have, odd
            fields.append(odd if odd is not None else cur)
            cur, have, odd = "", False, None
        try:
            for t, split in pieces:
                if t in ("@", "@@") and isinstance(split, list):
                    lines.update((v, v.line) for v in split if isinstance(v, Text) and v.line)
                    words = []
                    for v in split:                  # unquoted: each element split; an Unknown one stays a word
                        words += [v] if t == "@" or isinstance(v, (Unknown, Unset)) else [[x] for x in v.split()]
                    for k, v in enumerate(words):
                        if k:
                            push()
                        add(v[0] if isinstance(v, list) else v)
                elif split:
                    if not t:
                        continue
                    if t[0] in " \t\n" and have:
                        push()
                    for k, token in enumerate(t.split()):
                        if k:
                            push()
                        add(token)
                    if t[-1] in " \t\n" and have:
                        push()
                else:
                    add(t)
        except Taint as e:
            return [unknown(w.raw, str(e), w.line)]
        if have or (quoted and not fields and not any(t in ("@", "@@") for t, _ in pieces)):
            push()
        out = []
        for f in fields:
            if isinstance(f, (Unknown, Unset)):
                out.append(f)
            elif len(f) > MAX_VALUE:
                out.append(unknown(w.raw, f"{w.raw[:40]!r} grows past {MAX_VALUE:,} characters", w.line))
            else:
                out.append(text(f, w.line if plain else lines.get(f)))
        return out

    def expand_all(self, words: list) -> list:
        out = []
        for w in words:
            if isinstance(w, ArrayAssign):
                out.append(text(w.raw, w.line))
            else:
                out += self.expand(w)
        return out

    def assign_value(self, name: str, value: str, written: str):
        if len(value) > MAX_VALUE:
            value = unknown(f"${name}", f"${name} grows past {MAX_VALUE:,} characters")
        self.st.vars[name] = value
        self.st.arrays.pop(name, None)
        self.st.origin[name] = written
        self.st.hidden.discard(name)
        if self.st.allexport:
            self.st.exported.add(name)

    def assign(self, a, local_env: dict | None = None):
        """NAME=value, NAME+=value, NAME[i]=value or NAME=( ... ): into the script's variables, or into a command's
        own environment (local_env)."""
        st = self.st
        if isinstance(a, ArrayAssign):
            if local_env is not None:
                return
            try:
                items = []                       # (an element the script does not settle stays one Unknown word)
                for w in a.items:
                    items += self.expand(w)
                old = st.arrays.get(a.name, [st.vars[a.name]] if a.name in st.vars else [])
                if a.plus and isinstance(old, Unknown):
                    raise _Undecided(old.why)
                st.arrays[a.name] = (list(old) if a.plus else []) + items
            except _Undecided as e:
                st.arrays[a.name] = unknown(f"${{{a.name}[@]}}", f"the array {a.name} is built from {e.why}")
            st.vars.pop(a.name, None)
            st.origin[a.name] = a.raw[:60]
            return
        name, index, plus, w = a
        written = f"{name}{index or ''}{'+' if plus else ''}={w.raw}"
        try:
            value = self.pieces(w, joined=True)[0][0]
        except _Undecided as e:
            why = e.why
            if any(p[0] == "cmd" for p in w.parts):
                why = f"${name} is a command's output ({name}={w.raw[:60]!r})"
            elif not why.startswith(f"${name} "):
                why = f"${name} is built from {why}"
            value = unknown(f"${name}", why)
        if local_env is not None:
            local_env[name] = value
            return
        if index:
            try:
                k = self.arith(index[1:-1], w.line)
                arr = st.arrays.get(name)
                if isinstance(arr, Unknown) or isinstance(value, Unknown):
                    raise _Undecided(getattr(arr, "why", "") or value.why)
                arr = list(arr or ([st.vars[name]] if name in st.vars else []))
                arr += [""] * (k + 1 - len(arr))
                arr[k] = (arr[k] + value) if plus else value
                st.arrays[name] = arr
                st.vars.pop(name, None)
            except (_Undecided, IndexError) as e:
                st.arrays[name] = unknown(f"${{{name}[@]}}", f"the array {name} is built from "
                                          f"{getattr(e, 'why', 'a negative index')}")
            return
        if plus:
            old = st.vars.get(name, "")
            if isinstance(old, Unknown):
                return
            if not isinstance(value, Unknown):
                value = old + value
        self.assign_value(name, value, written)

    # ---- running
    def run(self, items: list) -> int | None:
        status: int | None = 0
        for conn, pipeline in items:
            if conn in ("&&", "||") and status is None:
                status = self.speculate([lambda p=pipeline: self.pipeline(p)], "after && or ||",
                                        f"after && or || (line {self.pipeline_line(pipeline)})")
                continue
            if conn in ("&&", "||") and (conn == "&&") != (status == 0):
                continue                               # bash skips it
            status = self.pipeline(pipeline)
        return status

    @staticmethod
    def pipeline_line(p: Pipeline) -> int:
        c = p.commands[0]
        return c.line

    def pipeline(self, p: Pipeline) -> int | None:
        if len(p.commands) == 1:
            status = self.command(p.commands[0])
        else:
            saved = self.st
            for c in p.commands:                    # each part of a pipeline runs in a subshell
                self.st = saved.copy()
                status = self.command(c)
            self.st = saved
        if p.negate and status is not None:
            status = 1 - (status != 0)
        return status

    def speculate(self, runs: list, where: str, reason: str) -> None:
        """Run each alternative from the same state with `reason` as why its commands may not run; afterwards a
        variable any of them changed is Unknown (bash decides it when the script runs)."""
        before = self.st
        changed: dict[str, str] = {}
        funcs = dict(before.funcs)
        for run in runs:
            self.st = before.copy()
            old, self.cond = self.cond, self.cond or reason
            try:
                run()
            except (_Stop, _Return):
                pass
            finally:
                self.cond = old
            after = self.st
            funcs.update(after.funcs)
            for name in set(after.vars) | set(before.vars) | set(after.arrays) | set(before.arrays):
                if (after.vars.get(name), after.arrays.get(name)) != (before.vars.get(name), before.arrays.get(name)):
                    changed[name] = after.origin.get(name) or f"unset {name}"
            before.exported |= after.exported
        self.st = before
        before.funcs = funcs
        for name, written in changed.items():
            nm, _, val = written.partition("=")
            shown = f"{nm}={val!r}" if _ else written
            why = f"{shown} is {where}, so ${name} depends on how the script runs"
            if name in before.arrays or (name not in before.vars and written.startswith(f"{name}=(")):
                before.arrays[name] = unknown(f"${{{name}[@]}}", why)
                before.vars.pop(name, None)
            else:
                before.vars[name] = unknown(f"${name}", why)
                before.arrays.pop(name, None)
        return None

    def command(self, c) -> int | None:
        if isinstance(c, Simple):
            return self.simple(c)
        kind, line = c.kind, c.line
        if kind == "function":
            self.st.funcs[c.parts["name"]] = c.parts["body"]
            return 0
        if kind == "group":
            return self.run(c.parts["body"])
        if kind == "subshell":
            saved = self.st
            self.st = saved.copy()
            try:
                return self.run(c.parts["body"])
            except _Stop:
                return None
            finally:
                self.st = saved
        if kind == "arith":
            return None
        if kind == "if":
            return self.if_(c)
        if kind in ("while", "until"):
            status = self.run(c.parts["cond"])
            if status is not None and (status != 0) == (kind == "while"):
                return 0                                # the body never runs
            self.speculate([lambda: self.run(c.parts["body"]), lambda: None], "inside an if/case/loop block",
                           f"inside the {kind} loop at line {self.line(line)}")
            return None
        if kind == "for":
            name = c.parts["name"]
            if c.parts["words"] is not None:
                items = self.expand_all(c.parts["words"])
                if not items:
                    return 0
            var_why = f"${name} is the {c.parts['kind']} loop's variable (line {self.line(line)})" if name else ""

            def body():
                if name:
                    self.st.vars[name] = unknown(f"${name}", var_why)
                    self.st.origin[name] = f"{name}=(the {c.parts['kind']} loop's variable)"
                self.run(c.parts["body"])
            self.speculate([body, lambda: None], "inside an if/case/loop block",
                           f"inside the {c.parts['kind']} loop at line {self.line(line)}")
            return None
        if kind == "case":
            return self.case(c)
        return None

    def if_(self, c: Node) -> int | None:
        branches = list(c.parts["branches"])
        other = c.parts["else"]
        line = self.line(c.line)
        for k, (cond, body) in enumerate(branches):
            status = self.run(cond)
            if status == 0:
                return self.run(body)
            if status is None:                       # undecided: this branch, and every later one, may run
                runs = [lambda b=body: self.run(b)]
                rest = branches[k + 1:]

                def later(rest=rest):
                    for cond2, body2 in rest:
                        s2 = self.run(cond2)
                        if s2 == 0:
                            self.run(body2)
                            return
                        if s2 is None:
                            self.run(body2)          # (walked; its changes are Unknown after the block)
                    if other is not None:
                        self.run(other)
                runs.append(later)
                self.speculate(runs, "inside an if/case/loop block", f"inside the if block at line {line}, whose "
                                                                     f"condition is decided when the script runs")
                return None
        if other is not None:
            return self.run(other)
        return 0

    def case(self, c: Node) -> int | None:
        subject = self.expand(c.parts["subject"])
        word = subject[0] if len(subject) == 1 and not isinstance(subject[0], (Unknown, Unset)) else None
        arms = c.parts["arms"]
        if word is not None:
            for patterns, body in arms:
                pats = []
                for p in patterns:
                    got = self.expand(p)
                    if len(got) != 1 or isinstance(got[0], (Unknown, Unset)):
                        pats = None
                        break
                    pats.append(got[0])
                if pats is None:
                    break
                if any(fnmatch.fnmatchcase(word, p) for p in pats):
                    return self.run(body)
            else:
                return 0
        self.speculate([lambda b=b: self.run(b) for _, b in arms] + [lambda: None], "inside an if/case/loop block",
                       f"inside the case block at line {self.line(c.line)}, whose branch is decided when the script "
                       f"runs")
        return None

    def test(self, words: list) -> int | None:
        """[ ... ], test ... and [[ ... ]] over settled words: 0 true, 1 false, None undecided."""
        if any(isinstance(w, (Unknown, Unset)) for w in words):
            return None
        args = list(words)
        if args[0] == "[":
            if args[-1] != "]":
                return None
            args = args[1:-1]
        elif args[0] == "[[":
            args = args[1:-1]
        else:
            args = args[1:]
        neg = False
        while args and args[0] == "!":
            neg, args = not neg, args[1:]
        result: bool | None
        if not args:
            result = False
        elif len(args) == 1:
            result = args[0] != ""
        elif len(args) == 2 and args[0] in ("-z", "-n"):
            result = (args[1] == "") == (args[0] == "-z")
        elif len(args) == 3 and args[1] in ("=", "==", "!="):
            same = (fnmatch.fnmatchcase(args[0], args[2]) if words[0] == "[[" else args[0] == args[2])
            result = same == (args[1] != "!=")
        elif len(args) == 3 and args[1] in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
            try:
                a, b = int(args[0]), int(args[2])
            except ValueError:
                return None
            result = {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[args[1]]
        else:
            return None
        return 0 if result != neg else 1

    def simple(self, c: Simple) -> int | None:
        st = self.st
        if not c.words:
            status = 0
            for a in c.assigns:
                self.assign(a)
                if isinstance(a, tuple) and any(p[0] == "cmd" for p in a[3].parts):
                    status = None
            return status
        prefix: dict[str, str] = {}
        for a in c.assigns:
            self.assign(a, prefix)
        words = self.expand_all(c.words)
        if not words:
            return 0
        name = words[0]
        args = words[1:]
        line = self.line(c.line)
        if name in ("export", "declare", "typeset", "local", "readonly"):
            exporting = name == "export"
            for raw in c.words[1:]:
                if isinstance(raw, ArrayAssign):
                    self.assign(raw)
                    continue
                m = ASSIGN_RE.match(raw.parts[0][1]) if raw.parts and raw.parts[0][0] == "lit" else None
                if m:
                    value = Word([("lit", raw.parts[0][1][m.end():])] + raw.parts[1:], raw.raw[m.end():], raw.line)
                    self.assign((m.group(1), m.group(2), bool(m.group(3)), value))
                    targets = [m.group(1)]
                else:
                    targets = [str(w) for w in self.expand(raw)]
                    if targets and targets[0].startswith("-"):
                        exporting = exporting or ("x" in targets[0] and name != "export")
                        continue
                if exporting:
                    st.exported.update(targets)
            return 0
        if name == "unset":
            for w in args:
                if not w.startswith("-"):
                    st.vars.pop(w, None)
                    st.arrays.pop(w, None)
                    if "-f" in args:
                        st.funcs.pop(w, None)
                    st.origin[str(w)] = f"unset {w}"
            return 0
        if name == "set":
            if "--" in args:
                st.args = list(args[args.index("--") + 1:])
            elif args and not args[0].startswith(("-", "+")):
                st.args = list(args)
            if "-a" in args or ("-o" in args and "allexport" in args):
                st.allexport = True
            return 0
        if name == "shift":
            if st.args is not None:
                try:
                    n = int(args[0]) if args else 1
                except ValueError:
                    return None
                st.args = st.args[n:]
            return None if st.args is None else 0
        if name in ("true", ":"):
            return 0
        if name == "false":
            return 1
        if name in ("[", "test", "[["):
            return self.test(words)
        if name in ("exit", "return"):
            if name == "return" and self.in_function:
                raise _Return()
            if self.cond is None:
                raise _Stop()
            return None
        if name in ("source", "."):
            self.sourced.append(str(args[0]) if args else "?")
            return None
        if name == "read":
            return self.read(c, args)
        if name == "eval":
            return self.nested(" ".join(args), line, state=st, words=args)
        if name in st.funcs:
            return self.call(name, args, line)
        basename = name.rsplit("/", 1)[-1]
        inner = next((k for k, w in enumerate(words[:-1]) if w == "-c" and k and
                      words[k - 1].rsplit("/", 1)[-1] in ("bash", "sh", "zsh")), None)
        env = {k: st.vars[k] for k in st.exported if k in st.vars} | prefix
        if inner is not None:
            return self.subshell(words[inner + 1], line, env, list(words[inner + 2:]))
        here = next((r for r in c.redirects if r.op in ("<<", "<<-") and r.heredoc is not None), None)
        if basename in ("bash", "sh") and len(words) == 1 and here is not None:
            body = here.heredoc if here.quoted else self.heredoc_text(here)
            return self.subshell(body, line, env, [])
        self.commands.append(Command(words, line, self.cond, env))
        return None

    def heredoc_text(self, r: Redirect) -> str:
        lex = _Lexer(r.heredoc, r.line)
        lex.i = 0
        parts: list = []
        s = r.heredoc
        buf = []
        while lex.i < len(s):                           # as inside double quotes, without the quotes
            ch = s[lex.i]
            if ch == "\\" and s[lex.i + 1:lex.i + 2] in ("$", "`", "\\", "\n"):
                buf.append(s[lex.i + 1] if s[lex.i + 1] != "\n" else "")
                lex.i += 2
            elif ch in "$`":
                parts.append(("dq", "".join(buf)))
                buf = []
                parts.append(("cmd", lex.backtick(), True) if ch == "`" else lex.dollar(quoted=True))
            else:
                buf.append(ch)
                lex.i += 1
        parts.append(("dq", "".join(buf)))
        w = Word([p if p[0] != "lit" else ("dq", p[1]) for p in parts], s, r.line)
        got = self.expand(w)
        if len(got) == 1 and isinstance(got[0], (Unknown, Unset)):
            return s
        return got[0] if got else ""

    def read(self, c: Simple, args: list) -> int | None:
        names = [a for a in args if not a.startswith("-")]
        whole = "-d" in args
        if "-a" in args or "-d" in args and names and names[0] == "":
            names = names[1:] if names and names[0] == "" else names
        names = [n for n in names if NAME_RE.fullmatch(n)]
        given = None
        for r in c.redirects:
            if r.op == "<<<" and r.target is not None:
                got = self.expand(r.target)
                if len(got) == 1 and not isinstance(got[0], (Unknown, Unset)):
                    given = got[0] + "\n"
            elif r.op in ("<<", "<<-") and r.heredoc is not None:
                given = r.heredoc if r.quoted else self.heredoc_text(r)
        for n in names:
            self.st.origin[n] = f"read {n}"
        if given is None:
            for n in names:
                self.st.vars[n] = unknown(f"${n}", f"${n} is read from the input when the script runs (read, line "
                                                   f"{self.line(c.line)})")
            return None
        chunk = given.rstrip("\n") if whole else given.split("\n", 1)[0]
        if "-a" in args and names:
            self.st.arrays[names[0]] = chunk.split()
            return 0
        fields = chunk.split(None, max(len(names) - 1, 0)) if names else []
        for k, n in enumerate(names):
            self.assign_value(n, fields[k].strip() if k < len(fields) else "", f"read {n}")
        return 0

    def call(self, name: str, args: list, line: int) -> int | None:
        if self.depth >= MAX_DEPTH:
            raise ShellError(line, f"calls nest deeper than {MAX_DEPTH} (function {name})")
        saved_args = self.st.args
        self.st.args = list(args)
        self.depth += 1
        self.in_function += 1
        try:
            return self.command(self.st.funcs[name])
        except _Return:
            return None
        finally:
            self.depth -= 1
            self.in_function -= 1
            self.st.args = saved_args

    def nested(self, code: str, line: int, state: _State, words: list) -> int | None:
        bad = next((w for w in words if isinstance(w, (Unknown, Unset))), None)
        if bad is not None:
            self.commands.append(Command(["eval", *words], line, self.cond, {}))
            return None
        if self.depth >= MAX_DEPTH:
            raise ShellError(line, f"eval / bash -c nest deeper than {MAX_DEPTH}")
        tokens = _Lexer(code, line).run()
        items = _Parser(tokens).program()
        sub = _Evaluator(state, line, self.depth + 1, self.cond, self.commands, self.sourced)
        sub.in_function = self.in_function
        try:
            return sub.run(items)
        except _Stop:
            raise

    def subshell(self, code: str, line: int, env: dict, args: list) -> int | None:
        """`bash -c CODE name args...`: a new shell that sees only the exported variables."""
        if isinstance(code, (Unknown, Unset)):
            self.commands.append(Command(["bash", "-c", code], line, self.cond, env))
            return None
        st = _State()
        st.vars = {k: v for k, v in env.items()}
        st.exported = set(env)
        st.hidden = set(self.st.vars) - set(env)
        st.args = list(args[1:])
        try:
            return self.nested(code, line, st, [])
        except _Stop:
            return None


def run(code: str) -> Script:
    """Evaluate a bash script as far as it can be without running anything (see the module's docstring): the simple
    commands it runs, in order, with their words expanded. ShellError where bash itself would not parse it, or where
    this package cannot."""
    lexer = _Lexer(code.replace("\r\n", "\n"))
    tokens = lexer.run()
    items = _Parser(tokens).program()
    ev = _Evaluator()
    try:
        ev.run(items)
    except _Stop:
        pass
    except _Return:
        pass
    return Script(ev.commands, ev.st.vars, lexer.dead, ev.sourced)
