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
import contextlib
import operator
import re
from dataclasses import dataclass, field

MAX_VALUE = 10_000                           # characters: longer than any flag value (a doubling bomb stops here)
MAX_DEPTH = 20                               # nested eval / bash -c / function calls
LAUNCHERS = {"deepspeed", "torchrun", "python", "python3", "ray", "srun", "accelerate", "mpirun", "bash", "sh"}
MAX_NESTING = 150                            # blocks within blocks ({ ( if ...): deeper is refused, not recursed
MAX_LOOPS = 20_000                           # loop iterations walked one by one in a script (then: speculated)
NAME_RE = re.compile(r"[A-Za-z_]\w*")
ASSIGN_RE = re.compile(r"([A-Za-z_]\w*)(\[(?:[^\[\]]|\[[^\[\]]*\])*\])?(\+?)=")
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
    inside a block whose condition is decided when the script runs, ...): the text as written, and `why`; `unset`
    where it comes from a variable the script never assigns (then it may be empty: no word at all)."""
    why: str = ""
    unset: bool = False


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
            elif s.startswith(("<(", ">("), self.i):   # process substitution: a word (a file the command reads)
                self.word_token()
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
        if target is None or not target.raw:
            self.error(f"'{op}' with nothing after it to read or write (bash: syntax error near unexpected token)")
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
            if c in "<>" and s[self.i + 1:self.i + 2] == "(":
                flush()
                end = self.matching(self.i + 1, "(", ")")
                parts.append(("cmd", s[self.i + 2:end], False))
                self.i = end + 1
                continue
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
        """$'...' as bash decodes it: \\n \\t ... , \\xHH, \\NNN (octal), \\uHHHH, \\UHHHHHHHH, \\cX; a NUL ends it."""
        s, i, out = self.s, self.i + 2, []
        while i < len(s) and s[i] != "'":
            if s[i] == "\\" and i + 1 < len(s):
                c = s[i + 1]
                m = (re.match(r"x([0-9a-fA-F]{1,2})", s[i + 1:]) or re.match(r"([0-7]{1,3})", s[i + 1:])
                     or re.match(r"u([0-9a-fA-F]{1,4})", s[i + 1:]) or re.match(r"U([0-9a-fA-F]{1,8})", s[i + 1:]))
                if m:
                    base = 8 if m.group(0)[0] in "01234567" else 16
                    code = int(m.group(1), base)
                    out.append(chr(code) if code < 0x110000 else "")
                    i += 1 + len(m.group(0))
                elif c == "c" and i + 2 < len(s):
                    out.append(chr(ord(s[i + 2].upper()) ^ 0x40))
                    i += 3
                else:
                    out.append(ANSI.get(c, "\\" + c))
                    i += 2
            else:
                self.line += s[i] == "\n"
                out.append(s[i])
                i += 1
        if i >= len(s):
            self.error("a $' quote is not closed before the end of the script")
        self.i = i + 1
        return "".join(out).split("\0", 1)[0]          # (bash's strings end at a NUL)

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
        if s.startswith("$[", i):                      # the old spelling of $(( ... ))
            end = self.matching(i + 1, "[", "]")
            self.i = end + 1
            return ("arith", s[i + 2:end], quoted)
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

    def program(self, done: list | None = None) -> list:
        """The script's commands; `done` receives each top-level command as it is parsed (bash runs those before it
        meets a syntax error further on)."""
        items = self.items(set(), done)
        tok = self.peek()
        if tok[0] != "eof":
            what = self.kw(tok) or (tok[1] if tok[0] == "op" else "?")
            raise ShellError(self.line(), f"unexpected '{what}' (bash: syntax error near unexpected token)")
        return items

    def items(self, stops: set, done: list | None = None) -> list:
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
            if done is not None:
                done.append(out[-1] + (self.line(),))           # (where it ends: the line of what follows it)
            tok = self.peek()
            if tok[0] == "op" and tok[1] in ("&&", "||"):
                conn = tok[1]
                self.k += 1
                self.skip_newlines()
                nxt = self.peek()
                if nxt[0] == "eof" or (nxt[0] == "op" and nxt[1] in (")", ";;", ";", "&")) or self.kw() in (
                        "then", "do", "done", "fi", "esac", "}", "elif", "else"):
                    raise ShellError(tok[2], f"'{conn}' with no command after it (bash: syntax error)")
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
        self.depth = getattr(self, "depth", 0) + 1
        try:
            if self.depth > MAX_NESTING:
                raise ShellError(self.line(), f"blocks nest deeper than {MAX_NESTING} (not read here)")
            return self.compound()
        finally:
            self.depth -= 1

    def compound(self):
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
            words, name, header = None, None, None
            if self.peek()[0] == "op" and self.peek()[1] == "(":
                depth, text = 0, []
                while True:                                  # for (( init; cond; update ))
                    t = self.next()
                    if t[0] in ("eof", "nl"):
                        raise ShellError(line, "'for ((' is not closed")
                    if t[0] == "op" and t[1] in "()":
                        depth += 1 if t[1] == "(" else -1
                        if depth == 0:
                            break
                    text.append(t[1].raw if t[0] == "word" else t[1] if t[0] == "op" else
                                t[1].op + (t[1].target.raw if t[1].target else "") if t[0] == "redir" else "")
                header = " ".join(text[2:-1]).split(";")
                if len(header) != 3:
                    raise ShellError(line, "'for ((' needs init; condition; update")
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
            return Node("for", line, {"name": name, "words": words, "body": body, "kind": kw, "header": header,
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
                end = ";;"
                if self.peek()[0] == "op" and self.peek()[1] in (";;", ";&", ";;&"):
                    end = self.next()[1]
                arms.append((patterns, body, end))
            return Node("case", line, {"subject": subject, "arms": arms, "redirects": self.redirects()})
        if kw == "{":
            self.k += 1
            body = self.items({"}"})
            self.expect("}", "{", line)
            return Node("group", line, {"body": body, "redirects": self.redirects()})
        if tok[0] == "op" and tok[1] == "(":
            self.k += 1
            if self.peek()[0] == "op" and self.peek()[1] == "(":       # (( ... )): an arithmetic command
                depth, text = 1, []
                while depth:
                    t = self.next()
                    if t[0] in ("eof", "nl"):
                        raise ShellError(line, "'((' is not closed")
                    if t[0] == "op" and t[1] in "()":
                        depth += 1 if t[1] == "(" else -1
                    text.append(t[1].raw if t[0] == "word" else t[1] if t[0] == "op" else
                                t[1].op + (t[1].target.raw if t[1].target else "") if t[0] == "redir" else "")
                return Node("arith", line, {"expr": " ".join(text[1:-2]), "redirects": self.redirects()})
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
                a = split_assignment(w) if not words else None
                if a:
                    assigns.append(a)
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
        if words and self.peek()[0] == "op" and self.peek()[1] == "(":
            raise ShellError(line, "unexpected '(' after a command's words (bash: syntax error near unexpected token)")
        return Simple(assigns, words, redirects, line)


# -- evaluation ----------------------------------------------------------------------------------------------------

class _Undecided(Exception):
    def __init__(self, why: str, unset_var: bool = False):
        super().__init__(why)
        self.why, self.unset_var = why, unset_var


class _ArithError(_Undecided):
    """An arithmetic error bash reports (a syntax error, a division by zero, a digit too great for its base): in an
    expansion it ends a script, in (( )), let or [[ ]] it is a failing status."""


class _Stop(Exception):
    """exit, exec, errexit, an endless loop: nothing after it runs (`status`: the shell's exit status, where known)."""

    def __init__(self, status: int | None = 0):
        super().__init__(status)
        self.status = status


class _Return(Exception):
    pass


class _Break(Exception):
    """break N: `levels` loops left to leave."""

    def __init__(self, levels: int = 1):
        super().__init__(levels)
        self.levels = levels


class _Continue(_Break):
    """continue N: leaves N - 1 loops, then goes on with the next round of the Nth."""


def _has_word(items, names: set) -> bool:
    """Whether a command of `items` (at any depth) is one of `names` (break, exit, ...)."""
    def walk(x):
        if isinstance(x, Simple):
            return any(isinstance(w, Word) and w.keyword() in names for w in x.words[:1])
        if isinstance(x, Pipeline):
            return any(walk(c) for c in x.commands)
        if isinstance(x, Node):
            return any(walk(v) for v in x.parts.values())
        if isinstance(x, (list, tuple)):
            return any(walk(v) for v in x)
        return False
    return walk(items)


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
    notes: list = field(default_factory=list)
    error: ShellError | None = None         # a syntax error bash stops at, after running the commands before it


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
        self.attrs: dict[str, set] = {}          # declare -i / -u / -l: NAME -> {"i", "u", "l"}
        self.options: set[str] = set()           # set -e / -o pipefail: "errexit", "pipefail"
        self.aliases: dict[str, str] = {}
        self.traps: dict[str, str] = {}          # trap CODE EXIT / ERR
        self.expand_aliases = False
        self.arg0 = "script"

    def copy(self) -> "_State":
        new = _State()
        new.vars, new.arrays, new.origin = dict(self.vars), dict(self.arrays), dict(self.origin)
        new.exported, new.allexport, new.args = set(self.exported), self.allexport, self.args
        new.funcs, new.hidden = dict(self.funcs), set(self.hidden)
        new.attrs, new.options = {k: set(v) for k, v in self.attrs.items()}, set(self.options)
        new.aliases, new.expand_aliases, new.arg0 = dict(self.aliases), self.expand_aliases, self.arg0
        new.traps = dict(self.traps)
        return new


def _bash_number(m, expr: str) -> int:
    """An integer constant of bash arithmetic: BASE#DIGITS (bases 2-64: 0-9, a-z, A-Z, @, _; up to 36 letters in
    either case), 0xHEX, 0OCTAL, else decimal."""
    if m.group(1):
        base, digits = int(m.group(1)), m.group(2)
        if not 2 <= base <= 64:
            raise _Undecided(f"$(( {expr.strip()} )): {base} is no base bash takes (2 to 64)")
        value = 0
        for ch in digits:
            d = (int(ch) if ch.isdigit() else
                 (ord(ch.lower()) - 87 if base <= 36 or ch.islower() else ord(ch) - 29) if ch.isalpha() else
                 62 if ch == "@" else 63)
            if d >= base:
                raise _ArithError(f"$(( {expr.strip()} )): {m.group(0)} has a digit too great for base {base} (bash "
                                 f"stops)")
            value = value * base + d
        return value
    if m.group(3):
        return int(m.group(3), 16)
    text = m.group(4)
    if re.search("[89]", text):
        raise _ArithError(f"$(( {expr.strip()} )): {text} is octal to bash, and 8 or 9 is too great for it (bash "
                         f"stops)")
    return int(text, 8)


ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: None,
             ast.Div: None, ast.FloorDiv: None, ast.Pow: None, ast.LShift: None, ast.RShift: None,
             ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}
CMP_OPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
           ast.NotEq: operator.ne}


def split_assignment(w: Word):
    """(NAME, [INDEX] or None, +=?, the value as a Word) where `w` is an assignment (NAME=..., NAME+=...,
    NAME[INDEX]=... with expansions in the index, as ARGS[${#ARGS[@]}]=x), else None."""
    if not w.parts or w.parts[0][0] != "lit":
        return None
    first = w.parts[0][1]
    m = ASSIGN_RE.match(first)
    if m:
        return m.group(1), m.group(2), bool(m.group(3)), Word([("lit", first[m.end():])] + w.parts[1:],
                                                               w.raw[m.end():], w.line)
    head = re.match(r"([A-Za-z_]\w*)\[([^\]]*)$", first)
    if not head:
        return None
    index = [head.group(2)]
    for k in range(1, len(w.parts)):
        p = w.parts[k]
        if p[0] == "lit":
            mm = re.match(r"([^\]]*)\](\+?)=", p[1])
            if not mm:
                return None
            index.append(mm.group(1))
            value = Word([("lit", p[1][mm.end():])] + w.parts[k + 1:], w.raw, w.line)
            return head.group(1), "[" + "".join(index) + "]", bool(mm.group(2)), value
        if p[0] == "var":
            index.append(p[3])
        elif p[0] == "arith":
            index.append(f"$(({p[1]}))")
        else:
            return None
    return None


def _literal_glob(text: str) -> str:
    """`text` as a pattern matching itself (quoted text in a bash pattern)."""
    return re.sub(r"([*?\[\\])", r"\\\1", text)


CLASSES = {"alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
           "space": " \\t\\n\\r\\f\\v", "blank": " \\t", "punct": "!-/:-@\\[-`{-~", "xdigit": "0-9A-Fa-f",
           "word": "a-zA-Z0-9_", "cntrl": "\\x00-\\x1f\\x7f", "print": " -~", "graph": "!-~"}


def _pattern_regex(pattern: str) -> str:
    """A bash glob pattern as a regular expression: *, ?, [...] with ! or ^ and the POSIX classes ([[:upper:]]), a
    backslash escaping the next character."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif c == "*":
            out.append(".*")
            i += 1
        elif c == "?":
            out.append(".")
            i += 1
        elif c == "[":
            j = i + 1
            neg = j < n and pattern[j] in "!^"
            j += neg
            body, first = [], True
            while j < n and (pattern[j] != "]" or first):
                m = re.match(r"\[:(\w+):\]", pattern[j:])
                if m and m.group(1) in CLASSES:
                    body.append(CLASSES[m.group(1)])
                    j += m.end()
                elif pattern[j] == "\\" and j + 1 < n:
                    body.append(re.escape(pattern[j + 1]))
                    j += 2
                else:
                    body.append("\\" + pattern[j] if pattern[j] in "\\^]" else pattern[j])
                    j += 1
                first = False
            if j >= n:                                   # no closing ]: a literal [
                out.append(re.escape(c))
                i += 1
                continue
            out.append("[" + ("^" if neg else "") + "".join(body) + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


BRACE_RE = re.compile(r"\{(?:([^{},]*(?:,[^{},]*)+)|(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?|([a-zA-Z])\.\.([a-zA-Z]))\}")


def _braces(w: Word, limit: int = 1000) -> list[Word]:
    """Brace expansion of a word's unquoted text, as bash does it before any other expansion: a{b,c}d is abd acd,
    {1..3} is 1 2 3 (with a step, {a..e}); non-nested groups, at most `limit` words."""
    for k, p in enumerate(w.parts):
        if p[0] != "lit":
            continue
        m = BRACE_RE.search(p[1])
        if not m:
            continue
        if m.group(1) is not None:
            choices = m.group(1).split(",")
        elif m.group(2) is not None:
            a, b = int(m.group(2)), int(m.group(3))
            step = abs(int(m.group(4) or 1)) or 1
            if abs(b - a) // step > limit:
                return [w]
            choices = [str(x) for x in range(a, b + (1 if b >= a else -1), step if b >= a else -step)]
        else:
            a, b = ord(m.group(5)), ord(m.group(6))
            choices = [chr(x) for x in range(a, b + (1 if b >= a else -1), 1 if b >= a else -1)]
        out = []
        for ch in choices:
            lit = p[1][:m.start()] + ch + p[1][m.end():]
            out += _braces(Word(w.parts[:k] + [("lit", lit)] + w.parts[k + 1:], w.raw, w.line), limit)
            if len(out) > limit:
                return [w]
        return out
    return [w]


def _ifs_split(chunk: str, ifs: str, most: int | None) -> list[str]:
    """`chunk` split on IFS as read splits it: IFS whitespace runs and each other IFS character delimit fields; at
    most `most` fields, the last keeping the rest (with its inner separators)."""
    if ifs == "":
        return [chunk]
    space = "".join(ch for ch in ifs if ch in " \t\n")
    other = "".join(ch for ch in ifs if ch not in " \t\n")
    chunk = chunk.strip(space) if space else chunk
    blank = f"[{re.escape(space)}]*" if space else ""
    sep = "|".join(([f"{blank}[{re.escape(other)}]{blank}"] if other else []) +
                   ([f"[{re.escape(space)}]+"] if space else []))
    if most is None:
        return [f for f in re.split(sep, chunk)] if chunk else []
    if most <= 1:
        return [chunk]
    return re.split(sep, chunk, maxsplit=most - 1) if chunk else []


def _split_commas(expr: str) -> list[str]:
    """An arithmetic expression's comma-separated parts (commas inside parentheses kept)."""
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += (ch == "(") - (ch == ")")
        cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


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
        self.arith_depth = 0
        self.exempt = 0                          # inside a condition or before && / ||: errexit does not apply
        self.frames: list[dict] = []             # a called function's local variables: their outer values
        self.notes: list[str] = []               # what bash does that the reader should say (an alias not expanded)
        self.budget = [MAX_LOOPS]                # loop iterations left to walk (shared with nested code)
        self.here = None                         # the script's folder: where a sourced file is looked for
        self.may_stop: list[int] = []            # lines of a speculated block where the script may end

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
                return st.arg0
            if st.args is None:
                return None
            return st.args[n - 1] if n <= len(st.args) else None
        if name in "#?$!-":
            if name == "#" and st.args is not None:
                return str(len(st.args))
            raise _Undecided(f"${name} is decided when the script runs")
        if "trapped" in st.options and (name in st.vars or name in st.arrays):
            raise _Undecided(f"${name} may be changed by the script's DEBUG or RETURN trap, not evaluated here")
        if name in st.vars:
            v = st.vars[name]
            if isinstance(v, Unknown):
                raise _Undecided(v.why, unset_var=v.unset and name not in st.arrays)
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
            odd = next((v for v in items if isinstance(v, (Unknown, Unset))), None)
            if index == "*" and odd is not None:
                raise _Undecided(odd.why, unset_var=isinstance(odd, Unset))
            return items if index == "@" else self.ifs_join(items)
        if name in ("@", "*") and (not rest or re.fullmatch(r":\s*\d+(:\s*\d+)?\s*", rest)):
            items = self.elements(name)
            if rest:                                     # ${@:N[:M]}: from the Nth ($0 at 0), M of them
                n, _, m = rest[1:].partition(":")
                items = [self.st.arg0] + items
                items = items[int(n):] if not m else items[int(n):int(n) + int(m)]
            return items if name == "@" else self.ifs_join(items)
        have = self.index(name, index, raw) if index is not None else self.value(name)
        known = (name in self.st.vars or name in self.st.arrays        # (an element it lacks is empty, not the env's;
                 or (index is not None and index.strip() not in ("0", "")))  # nor an element past 0 of the env's)
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
            offset = self.arith(spec[0], line) if spec[0].strip() else 0
            count = self.arith(spec[1], line) if len(spec) > 1 else None
            if offset < 0:
                offset = max(0, len(value) + offset)
            if count is None:
                return value[offset:]
            if count < 0:
                return value[offset:len(value) + count] if len(value) + count >= offset else ""
            return value[offset:offset + count]
        raise _Undecided(f"{raw!r} uses a bash expansion not evaluated here (a transformation)")

    def ifs_join(self, items: list) -> str:
        """"$*" / "${A[*]}": the words joined with IFS's first character (none where IFS is empty)."""
        ifs = self.st.vars.get("IFS", " \t\n")
        if isinstance(ifs, Unknown):
            raise _Undecided(ifs.why)
        return (ifs[:1]).join(items)

    def index(self, name: str, index: str, raw: str) -> str | None:
        if name not in self.st.arrays:
            if index.strip() in ("0", ""):
                return self.value(name)
            return None
        a = self.st.arrays[name]
        if isinstance(a, Unknown):
            raise _Undecided(a.why)
        k = self.arith(self.fragment(index, 0) if "$" in index else index, None)
        if k < 0:
            k += len(a)
        return a[k] if 0 <= k < len(a) else None

    @staticmethod
    def remove(value: str, pattern: str, op: str, raw: str) -> str:
        if len(value) > 1000:
            raise _Undecided(f"{raw!r}: a pattern removal over a value this long is not evaluated here")
        rx = re.compile(_pattern_regex(pattern), re.S)
        cuts = range(len(value) + 1)
        if op.startswith("#"):
            order = cuts if op == "#" else reversed(cuts)
            for k in order:
                if rx.fullmatch(value[:k]):
                    return value[k:]
        else:
            order = reversed(cuts) if op == "%" else cuts
            for k in order:
                if rx.fullmatch(value[k:]):
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
        if "$" in body and "$(" not in expr and "`" not in expr:
            raise _ArithError(f"$(( {expr.strip()} )) is not arithmetic bash evaluates (bash stops there)")
        if "$" in body or "`" in body or re.search(r"\+\+|--|(?<![<>=!])=(?!=)|\?", body):
            what = ("a conditional (?:)" if "?" in body else "a command" if "$" in body or "`" in body else
                    "an assignment")
            raise _Undecided(f"$(( {expr.strip()} )) is arithmetic with {what}, not evaluated here")
        body = body.replace("&&", " and ").replace("||", " or ")
        body = re.sub(r"!(?!=)", " not ", body)
        body = re.sub(r"(?<![\w#])(\d+)#([0-9A-Za-z@_]+)|(?<![\w#])0[xX]([0-9a-fA-F]+)|(?<![\w#.])(0[0-9]+)(?![\w#])",
                      lambda m: str(_bash_number(m, expr)), body)          # bash's base#digits, 0x.., 0NN (octal)
        try:
            tree = ast.parse(body.strip() or "0", mode="eval")
        except SyntaxError:
            raise _ArithError(f"$(( {expr.strip()} )) is not arithmetic bash evaluates (bash stops there)") from None

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
                if re.fullmatch(r"[+-]?[1-9]\d*|[+-]?0", v):
                    return int(v)
                if self.arith_depth > 16 or not re.fullmatch(r"[\w\s+*/%()<>=!&|^~-]+|[+-]?\d+#\w+", v):
                    raise _Undecided(f"${node.id} is {v[:40]!r}, not a number bash's arithmetic takes")
                self.arith_depth += 1                       # bash evaluates a variable's text as an expression
                try:
                    return self.arith(v, line)
                finally:
                    self.arith_depth -= 1
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)):
                x = ev(node.operand)
                return {ast.USub: -x, ast.UAdd: x, ast.Not: int(not x), ast.Invert: ~x}[type(node.op)]
            if isinstance(node, ast.BinOp) and type(node.op) in ARITH_OPS:
                a, b = ev(node.left), ev(node.right)
                if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
                    if b == 0:
                        raise _ArithError(f"$(( {expr.strip()} )) divides by zero (bash stops there)")
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

    def substitute(self, body: str, line: int) -> None:
        """A command substitution's commands, run as bash runs them (in a subshell: its assignments stay there)."""
        if self.depth >= MAX_DEPTH:
            return
        try:
            items = _Parser(_Lexer(body, line).run()).program()
        except ShellError:
            return
        sub = _Evaluator(self.st.copy(), self.line(line), self.depth + 1, self.cond, self.commands, self.sourced)
        sub.in_function, sub.notes, sub.budget = self.in_function, self.notes, self.budget
        try:
            sub.run(items)
        except (_Stop, _Return, _Break, _Continue, _Undecided):
            pass

    def arith_statement(self, expr: str, line: int | None) -> int:
        """(( ... )) and let: comma-separated expressions, with bash's assignments evaluated (x = e, x += e, ... x++,
        ++x); the value of the last. A variable with the integer attribute (declare -i) is assigned arithmetic."""
        value = 0
        for part in _split_commas(expr):
            m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*([-+*/%]|<<|>>|&|\||\^)?=(?!=)\s*(.+?)\s*", part, re.S)
            inc = re.fullmatch(r"\s*(?:([A-Za-z_]\w*)\s*(\+\+|--)|(\+\+|--)\s*([A-Za-z_]\w*))\s*", part)
            if m:
                name, op, rhs = m.group(1), m.group(2), self.arith(m.group(3), line)
                value = rhs if not op else self.arith(f"{name} {op} ({rhs})", line)
                self.assign_value(name, str(value), f"{name}={part.strip()!r}")
            elif inc:
                name = inc.group(1) or inc.group(4)
                op = inc.group(2) or inc.group(3)
                old = self.arith(name, line)
                new = old + (1 if op == "++" else -1)
                self.assign_value(name, str(new), f"{name}{op}")
                value = old if inc.group(1) else new
            else:
                value = self.arith(part, line)
        return value

    def arith_command(self, expr: str, line: int) -> int | None:
        """The status of (( expr )) / let: 0 where the value is not 0; variables it would assign and cannot are made
        Unknown (their values decided when the script runs)."""
        try:
            return 0 if self.arith_statement(expr, line) else 1
        except _ArithError:
            return 1                                   # bash reports it; the script goes on
        except _Undecided as e:
            for name in set(re.findall(r"([A-Za-z_]\w*)(?:\[[^\]]*\])?\s*(?:[-+*/%^|&]|<<|>>)?=(?!=)|"
                                       r"([A-Za-z_]\w*)(?:\[[^\]]*\])?\s*(?:\+\+|--)|"
                                       r"(?:\+\+|--)\s*([A-Za-z_]\w*)", expr)):
                for n in name:
                    if n:
                        why = (f"${n} is assigned by the arithmetic {expr.strip()!r} (line {self.line(line)}), not "
                               f"evaluated here ({e.why})")
                        self.st.vars[n] = unknown(f"${n}", why)
                        if n in self.st.arrays:
                            self.st.arrays[n] = unknown(f"${{{n}[@]}}", why)
            return None

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
                self.substitute(p[1], w.line)      # (its commands run, in a subshell; its output is not known)
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
                    if isinstance(got, (Unknown, Unset)):   # an element the script does not settle
                        raise _Undecided(got.why, unset_var=isinstance(got, Unset) or got.unset)
                    out.append((got, not p[2] and not joined))
                quoted = quoted or p[2]
        if joined:
            return ["".join(t if isinstance(t, str) else " ".join(t) for t, _ in out)], quoted
        return out, quoted

    def expand(self, w: Word) -> list:
        """The words bash makes of `w`: Text (with its line when written plainly), or one Unknown / Unset."""
        try:
            pieces, quoted = self.pieces(w)
        except _ArithError as e:
            if self.cond is None:
                raise _Stop(1) from None                 # an arithmetic error in an expansion ends the script
            self.may_stop.append(w.line)
            return [unknown(w.raw, e.why, w.line)]
        except _Undecided as e:
            only = len(w.parts) == 1 and w.parts[0][0] == "var"
            if e.unset_var and only:
                return [unset(w.raw, e.why, w.line)]
            u = unknown(w.raw, e.why, w.line)
            u.unset = e.unset_var
            return [u]
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
                        if t == "@@" and not isinstance(v, (Unknown, Unset)) and self.st.vars.get("IFS", " ") not in (
                                " \t\n", " "):
                            raise Taint(f"the script sets IFS, which changes how bash splits {w.raw[:40]!r}; not "
                                        f"evaluated here")
                        words += ([v] if t == "@" or isinstance(v, (Unknown, Unset)) else
                                  [[x] for x in re.split("[ \t\n]+", v) if x])
                    for k, v in enumerate(words):
                        if k:
                            push()
                        add(v[0] if isinstance(v, list) else v)
                elif split:
                    if not t:
                        continue
                    ifs = self.st.vars.get("IFS", " \t\n")
                    if ifs == "":
                        add(t)                                   # IFS= : no splitting at all
                        continue
                    if isinstance(ifs, Unknown) or set(ifs) - set(" \t\n"):
                        raise Taint(f"the script sets IFS to {str(ifs)!r}, which changes how bash splits "
                                    f"{w.raw[:40]!r}; not evaluated here")
                    blanks = re.escape(ifs)
                    if t[0] in ifs and have:
                        push()
                    for k, token in enumerate(x for x in re.split(f"[{blanks}]+", t) if x):
                        if k:
                            push()
                        add(token)
                    if t[-1] in ifs and have:
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
                for b in _braces(w):
                    out += self.expand(b)
        return out

    def may_end(self, line: int | None) -> None:
        """The script may end here (an error bash reports that is not evaluated here): every later command runs only
        if it did not."""
        self.may_stop.append(line or 0)
        if self.cond is None:
            self.cond = f"after line {line or '?'}, where the script may end (an error not evaluated here)"

    def set_scalar(self, name: str, value: str, written: str) -> None:
        """NAME set to `value` as bash sets it through the name's attributes (declare -i: arithmetic, ending the
        script at an error; -u / -l: the case)."""
        attrs = self.st.attrs.get(name, set())
        if "?" in attrs:
            value = unknown(f"${name}", f"${name} has attributes (declare -i / -u / -l) set in a block decided when "
                                        f"the script runs")
            self.may_end(None)
        elif "i" in attrs:
            try:
                value = str(self.arith(value or "0", None))
            except _ArithError:
                if self.cond is None:
                    raise _Stop(1) from None
                value = unknown(f"${name}", f"${name} is an integer variable assigned {value[:40]!r}")
            except _Undecided as e:
                value = unknown(f"${name}", f"${name} is an integer variable assigned {value[:40]!r}: {e.why}")
                if not e.unset_var:
                    self.may_end(None)                   # bash evaluates it, or ends the script at it
        elif attrs & {"u", "l"}:
            value = value.upper() if "u" in attrs else value.lower()
        self.assign_value(name, value, written)

    def assign_value(self, name: str, value: str, written: str):
        if len(value) > MAX_VALUE:
            value = unknown(f"${name}", f"${name} grows past {MAX_VALUE:,} characters")
        arr = self.st.arrays.get(name)
        if isinstance(arr, Unknown):                     # element 0 set; the others stay unknown
            self.st.origin[name] = written
            return
        if isinstance(arr, list) and len(arr) > 1 and not isinstance(value, Unknown):
            self.st.arrays[name] = [text(value)] + arr[1:]          # NAME=x on an array sets its element 0
            self.st.origin[name] = written
            return
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
                    got = self.expand(w)
                    if any(isinstance(g, Unset) or getattr(g, "unset", False) for g in got) and any(
                            p[0] == "var" and not p[2] for p in w.parts):
                        raise _Undecided(next(g.why for g in got if isinstance(g, (Unset, Unknown))) +
                                         " (unquoted, it may make no element or several, so the elements after it "
                                         "are not known either)")
                    items += got
                if "?" in st.attrs.get(a.name, set()):
                    self.may_end(a.line)
                    raise _Undecided(f"{a.name} has attributes set in a block decided when the script runs")
                if "i" in st.attrs.get(a.name, set()):      # declare -i: each element is arithmetic
                    try:
                        items = [text(str(self.arith(str(x) or "0", a.line))) for x in items]
                    except _ArithError:
                        if self.cond is None:
                            raise _Stop(1) from None
                        raise
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
            if isinstance(e, _ArithError) and self.cond is None and local_env is None:
                raise _Stop(1) from None                 # X=$((2+)): bash ends the script at it
            why = e.why
            if any(p[0] == "cmd" for p in w.parts):
                why = f"${name} is a command's output ({name}={w.raw[:60]!r})"
            elif not why.startswith(f"${name} "):
                why = f"${name} is built from {why}"
            value = unknown(f"${name}", why)
            value.unset = e.unset_var
        if local_env is not None:
            local_env[name] = value
            return
        if index:
            try:
                k = self.arith(self.fragment(index[1:-1], w.line) if "$" in index else index[1:-1], w.line)
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
        attrs = st.attrs.get(name, set())
        if "?" in attrs:                                        # declare -i or not: decided when the script runs
            value = unknown(f"${name}", f"${name} has attributes (declare -i / -u / -l) set in a block decided when "
                                        f"the script runs")
            self.may_end(w.line)
        if "i" in attrs and not isinstance(value, Unknown):     # declare -i: the value is arithmetic
            try:
                value = str(self.arith(value or "0", w.line) + (self.arith(st.vars.get(name) or "0", w.line)
                                                               if plus else 0))
                plus = False
            except _Undecided as e:
                if isinstance(e, _ArithError) and self.cond is None:
                    raise _Stop(1) from None             # bash ends the script at it
                value = unknown(f"${name}", f"${name} is an integer variable assigned {w.raw[:40]!r}: {e.why}")
                if not e.unset_var:
                    self.may_end(w.line)
        if plus and name in st.arrays:                          # A+=x on an array appends to its first element
            arr = st.arrays[name]
            if isinstance(arr, Unknown) or isinstance(value, Unknown):
                st.arrays[name] = unknown(f"${{{name}[@]}}", getattr(value, "why", "") or arr.why)
            else:
                st.arrays[name] = [text((arr[0] if arr else "") + value)] + list(arr[1:])
            return
        if plus:
            old = st.vars.get(name, "")
            if isinstance(old, Unknown):
                return
            if not isinstance(value, Unknown):
                value = old + value
        if not isinstance(value, Unknown) and attrs & {"u", "l"}:
            value = value.upper() if "u" in attrs else value.lower()
        self.assign_value(name, value, written)

    # ---- running
    def run(self, items: list) -> int | None:
        status: int | None = 0
        for k, (conn, pipeline) in enumerate(items):
            guarded = k + 1 < len(items) and items[k + 1][0] in ("&&", "||")   # errexit spares a command before these
            if conn in ("&&", "||") and status is None:
                status = self.speculate([lambda p=pipeline: self.pipeline(p)], "after && or ||",
                                        f"after && or || (line {self.pipeline_line(pipeline)})")
                continue
            if conn in ("&&", "||") and (conn == "&&") != (status == 0):
                continue                               # bash skips it
            self.exempt += guarded
            try:
                status = self.pipeline(pipeline)
            finally:
                self.exempt -= guarded
            failed = (status is not None and status != 0 and not self.exempt and not guarded
                      and not pipeline.negate)
            if failed and "ERR" in self.st.traps:        # trap ... ERR runs where a command fails
                self.nested(self.st.traps["ERR"], self.pipeline_line(pipeline), self.st, [])
            if failed and "errexit" in self.st.options:
                raise _Stop(status)                    # set -e: bash exits at a command that fails
        return status

    def condition(self, items: list) -> int | None:
        """An if/while/until condition: run, with errexit spared (as bash spares it)."""
        self.exempt += 1
        try:
            return self.run(items)
        finally:
            self.exempt -= 1

    @staticmethod
    def pipeline_line(p: Pipeline) -> int:
        c = p.commands[0]
        return c.line

    def pipeline(self, p: Pipeline) -> int | None:
        if len(p.commands) == 1:
            status = self.command(p.commands[0])
        else:
            saved, statuses = self.st, []
            last = "lastpipe" in saved.options
            for k, c in enumerate(p.commands):       # each part of a pipeline runs in a subshell (with lastpipe,
                keep = last and k == len(p.commands) - 1      # the last one in this shell)
                self.st = saved if keep else saved.copy()
                try:
                    statuses.append(self.command(c))
                except _Stop as e:                   # (an exit inside a pipeline ends its subshell only)
                    if keep:
                        raise
                    statuses.append(e.status)
                except _Return:
                    statuses.append(None)
            self.st = saved
            status = statuses[-1]
            if "pipefail" in saved.options:
                failed = [x for x in statuses if x != 0]
                status = 0 if not failed else failed[-1] if None not in failed else None
        if p.negate and status is not None:
            status = 1 - (status != 0)
        return status

    def speculate(self, runs: list, where: str, reason: str) -> None:
        """Run each alternative from the same state with `reason` as why its commands may not run; afterwards a
        variable any of them changed is Unknown (bash decides it when the script runs)."""
        before = self.st
        changed: dict[str, str] = {}
        shaky: set[str] = set()                      # names whose attributes (declare -i ...) a branch changed
        funcs = dict(before.funcs)
        for run in runs:
            self.st = before.copy()
            old, self.cond = self.cond, self.cond or reason
            try:
                run()
            except (_Stop, _Return, _Break):
                pass
            finally:
                self.cond = old
            after = self.st
            funcs.update(after.funcs)
            for name in set(after.vars) | set(before.vars) | set(after.arrays) | set(before.arrays):
                if (after.vars.get(name), after.arrays.get(name)) != (before.vars.get(name), before.arrays.get(name)):
                    changed[name] = after.origin.get(name) or f"unset {name}"
            before.exported |= after.exported
            before.options |= after.options
            shaky |= {n for n in set(after.attrs) | set(before.attrs) if after.attrs.get(n) != before.attrs.get(n)}
        self.st = before
        before.funcs = funcs
        for n in shaky:
            before.attrs[n] = {"?"}
        if self.may_stop and self.cond is None:      # every later command runs only if the script did not end there
            self.cond = (f"after line {self.may_stop[0]}, where the script may end (an exit or an error inside a "
                         f"block decided when it runs)")
        for name, written in changed.items():
            nm, _, val = written.partition("=")
            shown = f"{nm}={val!r}" if _ else written
            why = f"{shown} is {where}, so ${name} depends on how the script runs"
            before.arrays[name] = unknown(f"${{{name}[@]}}", why)        # (a scalar or an array, which the
            before.vars[name] = unknown(f"${name}", why)                # branches may make either of)
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
            except _Stop as e:
                return e.status
            finally:
                self.st = saved
        if kind == "arith":
            return self.arith_command(c.parts["expr"], line)
        if kind == "if":
            return self.if_(c)
        if kind in ("while", "until"):
            return self.loop(c)
        if kind == "for":
            return self.for_(c)
        if kind == "case":
            return self.case(c)
        return None

    def loop(self, c: Node) -> int | None:
        """while / until: walked one iteration at a time while its condition is decided (at most MAX_LOOPS), the rest
        speculated; a loop whose condition stays true with no break ends the script (bash never leaves it)."""
        kind, line = c.kind, self.line(c.line)
        while self.budget[0] > 0:
            self.budget[0] -= 1
            status = self.condition(c.parts["cond"])
            if status is None:
                break
            if (status != 0) == (kind == "while"):
                return 0                                # the condition ends it
            try:
                self.run(c.parts["body"])
            except _Break as e:
                if e.levels > 1:
                    raise type(e)(e.levels - 1) from None
                if isinstance(e, _Continue):
                    continue
                return 0
        else:
            if not _has_word(c.parts["body"], {"break", "exit", "return", "exec"}):
                raise _Stop(None)                     # endless: nothing after it runs
        self.speculate([lambda: self.run(c.parts["body"]), lambda: None], "inside an if/case/loop block",
                       f"inside the {kind} loop at line {line}")
        return None

    def for_(self, c: Node) -> int | None:
        """for NAME in WORDS: each word in turn (the loop unrolled, at most MAX_LOOPS words); over words the script
        does not settle, or `for ((...))`, the body is speculated."""
        name, line, what = c.parts["name"], self.line(c.line), c.parts["kind"]
        if c.parts.get("header") is not None:
            return self.arith_for(c, line)
        items = None
        if c.parts["words"] is not None:
            items = self.expand_all(c.parts["words"])
            if not items:
                return 0
        elif name is not None and self.st.args is not None:
            items = list(self.st.args)
        if (what == "for" and name and items is not None and len(items) <= self.budget[0]
                and not any(isinstance(i, (Unknown, Unset)) for i in items)):
            status = 0
            self.budget[0] -= len(items)
            for item in items:
                self.set_scalar(name, str(item), f"{name}={str(item)!r} (the for loop's word)")
                try:
                    status = self.run(c.parts["body"])
                except _Break as e:
                    if e.levels > 1:
                        raise type(e)(e.levels - 1) from None
                    if isinstance(e, _Continue):
                        continue
                    break
            return status
        var_why = f"${name} is the {what} loop's variable (line {line})" if name else ""

        def body():
            if name:
                self.st.vars[name] = unknown(f"${name}", var_why)
                self.st.origin[name] = f"{name}=(the {what} loop's variable)"
            self.run(c.parts["body"])
        self.speculate([body, lambda: None], "inside an if/case/loop block", f"inside the {what} loop at line {line}")
        return None

    def arith_for(self, c: Node, line: int) -> int | None:
        """for (( init; cond; update )): walked as bash runs it while the budget lasts and its arithmetic is settled;
        else the variables it assigns are Unknown and the body is speculated."""
        init, cond, update = c.parts["header"]
        status = 0
        try:
            if init.strip():
                self.arith_statement(init, c.line)
            while self.budget[0] > 0:
                self.budget[0] -= 1
                if cond.strip() and not self.arith_statement(cond, c.line):
                    return status
                try:
                    status = self.run(c.parts["body"])
                except _Break as e:
                    if e.levels > 1:
                        raise type(e)(e.levels - 1) from None
                    if not isinstance(e, _Continue):
                        return 0
                if update.strip():
                    self.arith_statement(update, c.line)
        except _ArithError:
            return 1
        except _Undecided:
            pass
        for n in set(re.findall(r"[A-Za-z_]\w*", init + " " + update)):
            self.st.vars[n] = unknown(f"${n}", f"${n} is assigned by the for (( )) loop at line {line}, not "
                                               f"evaluated here")
        self.speculate([lambda: self.run(c.parts["body"]), lambda: None], "inside an if/case/loop block",
                       f"inside the for loop at line {line}")
        return None

    def if_(self, c: Node) -> int | None:
        branches = list(c.parts["branches"])
        other = c.parts["else"]
        line = self.line(c.line)
        for k, (cond, body) in enumerate(branches):
            status = self.condition(cond)
            if status == 0:
                return self.run(body)
            if status is None:                       # undecided: this branch, and every later one, may run
                runs = [lambda b=body: self.run(b)]
                rest = branches[k + 1:]

                def later(rest=rest):
                    for cond2, body2 in rest:
                        s2 = self.condition(cond2)
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

    def glob(self, w: Word) -> str:
        """The pattern bash makes of a word (a case pattern, the right side of [[ == ]]): its quoted parts match
        themselves, its unquoted text and unquoted expansions are glob patterns; _Undecided propagates."""
        out = []
        for p in w.parts:
            if p[0] == "lit":
                out.append(p[1])
            elif p[0] in ("sq", "dq"):
                out.append(_literal_glob(p[1]))
            else:
                text = self.pieces(Word([p], w.raw, w.line), joined=True)[0][0]
                out.append(_literal_glob(text) if len(p) > 2 and p[2] else text)
        return "".join(out)

    def matches(self, subject: str, pattern: str) -> bool:
        """A bash pattern match (`_pattern_regex`), case-blind under shopt -s nocasematch."""
        flags = re.S | (re.I if "nocasematch" in self.st.options else 0)
        return re.fullmatch(_pattern_regex(pattern), subject, flags) is not None

    def case(self, c: Node) -> int | None:
        """case: the arm whose pattern matches the settled word, with ;& (run the next arm too) and ;;& (test the
        next patterns too); over a word or a pattern the script does not settle, every arm is speculated."""
        arms = c.parts["arms"]
        try:
            subject = self.pieces(c.parts["subject"], joined=True)[0][0]
            matched = [any(self.matches(subject, self.glob(p)) for p in patterns) for patterns, _, _ in arms]
        except _Undecided:
            matched = None
        if matched is not None:
            status, k, fall = 0, 0, False
            while k < len(arms):
                patterns, body, end = arms[k]
                if fall or matched[k]:
                    status = self.run(body)
                    if end == ";;":
                        return status
                    fall = end == ";&"
                k += 1
            return status
        self.speculate([lambda b=b: self.run(b) for _, b, _ in arms] + [lambda: None], "inside an if/case/loop block",
                       f"inside the case block at line {self.line(c.line)}, whose branch is decided when the script "
                       f"runs")
        return None

    def test(self, words: list, raw: list | None = None) -> int | None:
        """[ ... ] / test ... (`words` expanded) and [[ ... ]] (`raw`: its words as written, expanded here without
        splitting, the right side of == and =~ taken as a pattern): 0 true, 1 false, None undecided."""
        dbl = words[0] == "[["
        if dbl:
            args = []
            for w in (raw or [])[1:-1]:
                try:
                    args.append((self.pieces(w, joined=True)[0][0], w))
                except _Undecided:
                    return None
        else:
            if any(isinstance(w, (Unknown, Unset)) for w in words):
                return None
            args = [(str(w), None) for w in words]
            if args[0][0] == "[":
                if args[-1][0] != "]":
                    return None
                args = args[1:-1]
            else:
                args = args[1:]
        try:
            result = self.test_expr(args, dbl)
        except _ArithError:
            return 2
        except _Undecided:
            return None
        return None if result is None else 0 if result else 1

    def test_expr(self, args: list, dbl: bool) -> bool | None:
        """A test expression: ! , ( ), && / || ([[ ]]) or -a / -o ([ ]), unary -z -n, binary = == != < > =~ and the
        integer comparisons (arithmetic in [[ ]], decimal in [ ]); file tests and others are undecided (None)."""
        ors, ands = ("||", "&&") if dbl else ("-o", "-a")
        for op in (ors, ands):                          # lowest precedence first, at the top level of parentheses
            depth = 0
            for k in range(len(args) - 1, -1, -1):
                t = args[k][0] if args[k][1] is None or args[k][1].keyword() else None
                depth += (t == ")") - (t == "(")
                if depth == 0 and t == op and 0 < k < len(args) - 1:
                    left, right = self.test_expr(args[:k], dbl), self.test_expr(args[k + 1:], dbl)
                    if op == ors:
                        return True if left or right else None if left is None or right is None else False
                    return False if left is False or right is False else None if None in (left, right) else True
        words = [a[0] for a in args]
        if words and words[0] == "!" and len(words) > 1:
            got = self.test_expr(args[1:], dbl)
            return None if got is None else not got
        if len(words) >= 2 and words[0] == "(" and words[-1] == ")":
            return self.test_expr(args[1:-1], dbl)
        if not words:
            return False
        if len(words) == 1:
            return words[0] != ""
        if len(words) == 2 and words[0] in ("-z", "-n"):
            return (words[1] == "") == (words[0] == "-z")
        if len(words) == 3:
            a, op, b = words
            if op in ("=", "==", "!="):
                same = self.matches(a, self.glob(args[2][1])) if dbl and args[2][1] is not None else a == b
                return same == (op != "!=")
            if op in ("<", ">"):
                return (a < b) if op == "<" else (a > b)
            if op == "=~" and dbl:
                regex = "".join(re.escape(p[1]) if p[0] in ("sq", "dq") else
                                self.pieces(Word([p], "", 0), joined=True)[0][0] for p in args[2][1].parts)
                try:
                    return re.search(regex, a) is not None
                except re.error:
                    return None
            if op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
                try:
                    x, y = (self.arith(a, None), self.arith(b, None)) if dbl else (int(a), int(b))
                except ValueError:
                    return None
                return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]
        return None

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
        raw = list(c.words)
        first = raw[0].keyword() if isinstance(raw[0], Word) else None
        line = self.line(c.line)
        if first in st.aliases:
            if not st.expand_aliases:                   # bash expands aliases in a script only with expand_aliases
                if first not in LAUNCHERS:              # (a launcher's own name still runs it, unaliased)
                    self.notes.append(f"line {line}: {first!r} is an alias, which bash does not expand in a script "
                                      f"(without shopt -s expand_aliases): it finds no command {first!r}")
                    return 127
            else:
                lexed = [t[1] for t in _Lexer(st.aliases[first], c.line).run() if t[0] == "word"]
                raw = lexed + raw[1:]
        words = self.expand_all(raw)
        if not words:
            return 0
        name = words[0]
        args = words[1:]
        if name in ("export", "declare", "typeset", "local", "readonly"):
            return self.declare(name, raw[1:])
        if name == "unset":
            for w in args:
                if w.startswith("-"):
                    continue
                m = re.fullmatch(r"([A-Za-z_]\w*)\[(.*)\]", w)
                if m:                                   # one element: bash's arrays are sparse after it
                    st.arrays[m.group(1)] = unknown(f"${{{m.group(1)}[@]}}", f"an element of {m.group(1)} is unset "
                                                    f"(line {line}), which leaves a sparse array, not evaluated here")
                    st.vars.pop(m.group(1), None)
                    continue
                if "-f" in args:
                    st.funcs.pop(w, None)
                    continue
                st.vars.pop(w, None)
                st.arrays.pop(w, None)
                st.origin[str(w)] = f"unset {w}"
            return 0
        if name == "set":
            return self.set_(args)
        if name == "shopt":
            on = "-s" in args
            for opt in (a for a in args if not a.startswith("-")):
                if opt == "expand_aliases":
                    st.expand_aliases = on
                elif opt in ("lastpipe", "nocasematch"):
                    (st.options.add if on else st.options.discard)(opt)
            return 0
        if name == "trap":
            if args and str(args[0]) not in ("-p", "-l"):
                code = None if str(args[0]) == "-" else str(args[0])
                for sig in (str(a).upper().removeprefix("SIG") for a in args[1:]):
                    sig = "EXIT" if sig == "0" else sig
                    if sig in ("DEBUG", "RETURN"):       # runs before every command / at every return
                        self.unsettle(f"`trap ... {sig}` (line {line}), which runs code around every command")
                        self.st.options.add("trapped")
                    elif code is None or code == "":
                        self.st.traps.pop(sig, None)
                    else:
                        self.st.traps[sig] = code
            return 0
        if name == "alias":
            for w in args:
                n, eq, v = w.partition("=")
                if eq:
                    st.aliases[n] = v
            return 0
        if name == "unalias":
            for w in args:
                st.aliases.pop(w, None)
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
            return self.test(words, raw)
        if name == "let":
            status = None
            for w in args:
                status = self.arith_command(str(w), c.line)
            return status
        if name in ("break", "continue"):
            n = int(args[0]) if args and str(args[0]).isdigit() and int(args[0]) > 0 else 1
            raise (_Break if name == "break" else _Continue)(n)
        if name in ("exit", "return"):
            code = int(args[0]) if args and str(args[0]).isdigit() else 0
            if name == "return" and self.in_function:
                raise _Return()
            if name == "return":
                return 1                                 # (bash: 'can only return from a function'; it goes on)
            if self.cond is None:
                raise _Stop(code)
            self.may_stop.append(line)
            return None
        if name in ("source", "."):
            found = self.source_file(args[0]) if args and not isinstance(args[0], (Unknown, Unset)) else None
            if found is not None:                      # a file the script's folder holds: run here, as bash does
                with self.arguments([str(a) for a in args[1:]] or None):
                    self.in_function += 1                 # (return ends the sourced file)
                    try:
                        return self.nested(found, line, state=st, words=[])
                    except _Return:
                        return 0
                    finally:
                        self.in_function -= 1
            self.sourced.append(str(args[0]) if args else "?")
            self.unsettle(f"`{name} {args[0] if args else ''}` (line {line})")
            return None
        if name == "read":
            return self.read(c, args, prefix)
        if name in ("mapfile", "readarray"):
            target = next((a for a in reversed(args) if NAME_RE.fullmatch(a)), "MAPFILE")
            st.arrays[target] = unknown(f"${{{target}[@]}}", f"{target} is read from the input by {name} (line "
                                                              f"{line})")
            st.vars.pop(target, None)
            return None
        if name == "printf" and len(args) >= 3 and args[0] == "-v":
            return self.printf_v(args[1], args[2], args[3:], line)
        if name == "eval":
            with self.environment(prefix):
                status = self.nested(" ".join(args), line, state=st, words=args)
            return status
        if name in st.funcs:
            with self.environment(prefix):
                return self.call(name, args, line)
        replaced = name == "exec"                         # exec CMD: CMD replaces the shell, nothing after it runs
        if replaced:
            if not args:
                return 0                                  # exec with redirections only: this shell goes on
            words, name, args = args, args[0], args[1:]
        shell_at = next((k for k, w in enumerate(words) if str(w).rsplit("/", 1)[-1] in ("bash", "sh", "zsh", "dash")),
                        None)
        env = {k: st.vars[k] for k in st.exported if k in st.vars} | prefix
        if shell_at is not None:
            status = self.shell_command(c, words, shell_at, line, env)
            if status is not False:
                return status
        self.commands.append(Command(words, line, self.cond, env))
        if replaced and self.cond is None:
            raise _Stop(None)
        return None

    def source_file(self, name: str) -> str | None:
        """The text of a sourced file found beside the script (or from the working directory), else None."""
        if self.here is None:
            return None
        from pathlib import Path

        for base in (self.here, Path.cwd()):
            try:
                p = (base / name) if not Path(name).is_absolute() else Path(name)
                if p.is_file() and p.stat().st_size <= 2**20:
                    return p.read_bytes().decode("utf-8").replace("\r\n", "\n")
            except (OSError, UnicodeDecodeError, ValueError):
                return None
        return None

    @contextlib.contextmanager
    def arguments(self, args: list | None):
        """source FILE ARGS: the positional parameters for its duration (none given: the script's own)."""
        saved = self.st.args
        if args is not None:
            self.st.args = args
        try:
            yield
        finally:
            if args is not None:
                self.st.args = saved

    @contextlib.contextmanager
    def environment(self, prefix: dict):
        """NAME=value before a function call or eval: set and exported for its duration, then restored."""
        st, saved = self.st, {}
        for k, v in prefix.items():
            saved[k] = (st.vars.get(k), k in st.exported)
            st.vars[k] = v
            st.exported.add(k)
        try:
            yield
        finally:
            for k, (v, exported) in saved.items():
                if v is None:
                    st.vars.pop(k, None)
                else:
                    st.vars[k] = v
                if not exported:
                    st.exported.discard(k)

    def unsettle(self, what: str) -> None:
        """Every variable assigned so far may be changed by `what` (a sourced file, an eval of text the script does
        not settle): each is Unknown after it."""
        st = self.st
        for n in list(st.vars):
            st.vars[n] = unknown(f"${n}", f"${n} was assigned before {what}, which may assign it again; assign it "
                                          f"after that line")
        for n in list(st.arrays):
            st.arrays[n] = unknown(f"${{{n}[@]}}", f"the array {n} was built before {what}, which may change it")

    def set_(self, args: list) -> int:
        st = self.st
        k = 0
        while k < len(args):
            a = str(args[k])
            if a == "--":
                st.args = [str(x) for x in args[k + 1:]]
                return 0
            if a[:1] in "-+" and len(a) > 1:
                on = a[0] == "-"
                letters = a[1:]
                for ch in letters:
                    if ch == "o" and k + 1 < len(args):
                        k += 1
                        opt = str(args[k])
                        (st.options.add if on else st.options.discard)(opt)
                        if opt == "allexport":
                            st.allexport = on
                    elif ch == "e":
                        (st.options.add if on else st.options.discard)("errexit")
                    elif ch == "a":
                        st.allexport = on
            else:
                st.args = [str(x) for x in args[k:]]
                return 0
            k += 1
        return 0

    def declare(self, name: str, raw: list) -> int:
        """export / declare / typeset / local / readonly: their options (-x export, -n unexport, -i integer, -u / -l
        case, -g global, -a array, -A associative) and assignments; in a function, declare and local make the name
        local (its outer value comes back when the function returns)."""
        st = self.st
        flags = set("x") if name == "export" else set()
        unexport = False
        local = name == "local" or (name in ("declare", "typeset") and self.in_function)
        for w in raw:
            if isinstance(w, ArrayAssign):
                if local:
                    self.localize(w.name)
                if "A" in flags:
                    st.arrays[w.name] = unknown(f"${{{w.name}[@]}}", f"{w.name} is an associative array, not "
                                                                     f"evaluated here")
                    continue
                self.assign(w)
                continue
            a = split_assignment(w)
            m = a is not None
            if not m:
                got = [str(x) for x in self.expand(w)]
                if got and got[0][:1] in "-+" and len(got[0]) > 1:
                    letters = set(got[0][1:])
                    if got[0][0] == "-":
                        flags |= letters
                        unexport = unexport or (name == "export" and "n" in letters)
                    if "g" in letters:
                        local = False
                    continue
                targets = got
            else:
                targets = [a[0]]
            for t in targets:
                if local:
                    self.localize(t)
                if "n" in flags and name != "export":
                    st.vars[t] = unknown(f"${t}", f"${t} is a name reference (declare -n), not evaluated here")
                    continue
                for attr in "iul":
                    if attr in flags:
                        st.attrs.setdefault(t, set()).add(attr)
                if "A" in flags and not m:
                    st.arrays[t] = unknown(f"${{{t}[@]}}", f"{t} is an associative array, not evaluated here")
            if m and not ("n" in flags and name != "export"):
                self.assign(a)
            for t in targets:
                if unexport:
                    st.exported.discard(t)
                elif "x" in flags:
                    st.exported.add(t)
        return 0

    def localize(self, name: str) -> None:
        """A function's local NAME: its outer value (or its absence) kept to come back at the return."""
        if self.frames and name not in self.frames[-1]:
            st = self.st
            self.frames[-1][name] = (st.vars.get(name), st.arrays.get(name), name in st.exported,
                                     st.origin.get(name), st.attrs.get(name))
            st.vars.pop(name, None)
            st.arrays.pop(name, None)
            st.attrs.pop(name, None)

    def printf_v(self, target: str, fmt: str, args: list, line: int) -> int | None:
        """printf -v NAME FORMAT ARGS: %s, %d / %i and %% (the format reused while arguments remain)."""
        if isinstance(fmt, (Unknown, Unset)) or any(isinstance(a, (Unknown, Unset)) for a in args) or \
                re.search(r"%(?![sdi%])", fmt):
            self.st.vars[target] = unknown(f"${target}", f"${target} is printf's output (line {line}), not "
                                                         f"evaluated here")
            return None
        out, rest = [], list(args)
        while True:
            def one(m):
                if m.group(0) == "%%":
                    return "%"
                v = rest.pop(0) if rest else ""
                if m.group(0) in ("%d", "%i"):
                    try:
                        return str(self.arith(v or "0", line))
                    except _Undecided as e:
                        raise _Undecided(e.why) from None
                return str(v)
            try:
                out.append(re.sub(r"%[sdi%]", one, fmt.encode().decode("unicode_escape")))
            except (_Undecided, UnicodeDecodeError):
                self.st.vars[target] = unknown(f"${target}", f"${target} is printf's output (line {line}), not "
                                                             f"evaluated here")
                return None
            if not rest or "%" not in fmt.replace("%%", ""):
                break
        self.assign_value(target, "".join(out), f"printf -v {target}")
        return 0

    def shell_command(self, c: Simple, words: list, at: int, line: int, env: dict):
        """`bash [options] -c CODE [name [args]]`, `bash -s <<EOF`, `bash <<EOF`: the code run as a new shell that
        sees only the exported variables; False where the words are another use of bash (a script file)."""
        k, code, reads_stdin = at + 1, None, False
        while k < len(words):
            w = str(words[k])
            if w == "--":
                k += 1
                break
            if w.startswith("--"):
                k += 1
                continue
            if w.startswith("-") and len(w) > 1:
                k += 1
                if "c" in w[1:]:
                    code = words[k] if k < len(words) else None
                    k += 1
                    break
                if "s" in w[1:]:
                    reads_stdin = True
                if "o" in w[1:] and k < len(words):
                    k += 1
                continue
            break
        if code is not None:
            rest = [str(x) for x in words[k:]]
            return self.subshell(code, line, env, rest)
        here = next((r for r in c.redirects if r.op in ("<<", "<<-", "<<<")), None)
        if here is not None and (reads_stdin or k >= len(words)):
            if here.op == "<<<":
                got = self.expand(here.target)
                body = str(got[0]) if len(got) == 1 and not isinstance(got[0], (Unknown, Unset)) else None
                if body is None:
                    return False
            else:
                body = here.heredoc if here.quoted else self.heredoc_text(here)
                if body is None:
                    return False
            return self.subshell(body, line, env, ["bash", *[str(x) for x in words[k:]]])
        return False

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
            return None                                 # (the outer shell expands it: not known here)
        return got[0] if got else ""

    def read(self, c: Simple, args: list, prefix: dict) -> int | None:
        """read [-r] [-a NAME] [-d DELIM] [-n N] [-N N] [-p P] [-s] [-t T] [-u FD] NAMES, from a here-string or a
        heredoc (split on IFS, the command's own IFS= prefix first); from anything else the names are Unknown."""
        names, opts, k = [], {}, 0
        while k < len(args):
            a = str(args[k])
            if a.startswith("-") and len(a) > 1 and not names:
                for j, ch in enumerate(a[1:]):
                    if ch in "adnNptu":
                        val = a[j + 2:] or (str(args[k + 1]) if k + 1 < len(args) else "")
                        if not a[j + 2:]:
                            k += 1
                        opts[ch] = val
                        break
                    opts[ch] = True
            else:
                names.append(a)
            k += 1
        array = opts.get("a")
        names = [n for n in names if NAME_RE.fullmatch(n)] or ([] if array else ["REPLY"])
        given = None
        for r in c.redirects:
            if r.op == "<<<" and r.target is not None:
                got = self.expand(r.target)
                if len(got) == 1 and not isinstance(got[0], (Unknown, Unset)):
                    given = got[0] + "\n"
            elif r.op in ("<<", "<<-") and r.heredoc is not None:
                given = r.heredoc if r.quoted else self.heredoc_text(r)
        line = self.line(c.line)
        status = 0
        targets = names + ([array] if array else [])
        for n in targets:
            self.st.origin[n] = f"read {n}"
        ifs = prefix.get("IFS", self.st.vars.get("IFS", " \t\n"))
        if given is None or isinstance(ifs, Unknown):
            for n in names:
                self.st.vars[n] = unknown(f"${n}", f"${n} is read from the input when the script runs (read, line "
                                                   f"{line})")
            if array:
                self.st.arrays[array] = unknown(f"${{{array}[@]}}", f"{array} is read from the input (line {line})")
            return None
        delim = opts.get("d", "\n") if "d" in opts else "\n"
        chunk = given.split(delim[:1], 1)[0] if delim else given.split("\0", 1)[0]
        if (delim[:1] or "\0") not in given:
            status = 1                                   # read returns 1 at the end of its input (set -e ends there)
        for n_opt in ("n", "N"):
            if n_opt in opts:
                try:
                    chunk = (given if n_opt == "N" else chunk)[:int(opts[n_opt])]
                except ValueError:
                    return 1
        if "N" in opts:                               # -N: exactly N characters, no splitting
            self.assign_value(names[0], chunk, f"read {names[0]}")
            return status
        fields = _ifs_split(chunk, ifs, None if array else len(names))
        if array:
            self.st.arrays[array] = [text(f) for f in fields]
            self.st.vars.pop(array, None)
            return status
        for k, n in enumerate(names):
            self.set_scalar(n, fields[k] if k < len(fields) else "", f"read {n}")
        return status

    def call(self, name: str, args: list, line: int) -> int | None:
        if self.depth >= MAX_DEPTH:
            raise ShellError(line, f"calls nest deeper than {MAX_DEPTH} (function {name})")
        saved_args = self.st.args
        self.st.args = [str(a) for a in args]
        self.depth += 1
        self.in_function += 1
        self.frames.append({})
        try:
            return self.command(self.st.funcs[name])
        except _Return:
            return None
        finally:
            self.depth -= 1
            self.in_function -= 1
            self.st.args = saved_args
            for n, (v, arr, exported, origin, attrs) in self.frames.pop().items():   # locals give back the outer
                st = self.st                                                         # values
                st.vars.pop(n, None)
                st.arrays.pop(n, None)
                st.attrs.pop(n, None)
                if attrs is not None:
                    st.attrs[n] = attrs
                if v is not None:
                    st.vars[n] = v
                if arr is not None:
                    st.arrays[n] = arr
                (st.exported.add if exported else st.exported.discard)(n)
                if origin is not None:
                    st.origin[n] = origin

    def nested(self, code: str, line: int, state: _State, words: list) -> int | None:
        bad = next((w for w in words if isinstance(w, (Unknown, Unset))), None)
        if bad is not None:
            self.commands.append(Command(["eval", *words], line, self.cond, {}))
            self.unsettle(f"eval of text decided when the script runs (line {line})")
            return None
        if self.depth >= MAX_DEPTH:
            raise ShellError(line, f"eval / bash -c nest deeper than {MAX_DEPTH}")
        tokens = _Lexer(code, line).run()
        items = _Parser(tokens).program()
        sub = _Evaluator(state, line, self.depth + 1, self.cond, self.commands, self.sourced)
        sub.in_function, sub.frames, sub.notes, sub.budget = self.in_function, self.frames, self.notes, self.budget
        sub.here, sub.may_stop = self.here, self.may_stop
        return sub.run(items)

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
        st.arg0 = args[0] if args else "bash"
        try:
            return self.nested(code, line, st, [])
        except _Stop:
            return None


def run(code: str, here=None) -> Script:
    """Evaluate a bash script as far as it can be without running anything (see the module's docstring): the simple
    commands it runs, in order, with their words expanded. ShellError where bash itself would not parse it, or where
    this package cannot."""
    if code.startswith("\ufeff"):
        raise ShellError(1, "the script starts with a byte-order mark (U+FEFF), which bash reads as part of its first "
                            "word; save it without one")
    if "\r" in code:
        raise ShellError(code.count("\n", 0, code.index("\r")) + 1,
                         "a carriage return (a Windows line ending): bash reads it as part of the line's last word "
                         "('--bf16\\r', 'then\\r'), so the script fails or says something else; convert it (dos2unix)")
    lexer = _Lexer(code)
    tokens = lexer.run()
    done, error = [], None
    try:
        _Parser(tokens).program(done)
    except ShellError as e:                 # bash runs the commands on the lines before a syntax error, then stops
        error = e
        done = [d for d in done if d[2] < e.line]
        while done and done[-1][0] in ("&&", "||"):
            done.pop()
    items = [(conn, pipeline) for conn, pipeline, _ in done]
    ev = _Evaluator()
    ev.here = here
    try:
        ev.run(items)
    except (_Stop, _Return, _Break, _Continue):
        error = None                        # (it stops before it reaches the error)
    if "EXIT" in ev.st.traps:               # trap CODE EXIT: run as the script ends
        try:
            ev.nested(ev.st.traps.pop("EXIT"), len(code.splitlines()), ev.st, [])
        except (_Stop, _Return, _Break, _Continue, ShellError):
            pass
    return Script(ev.commands, ev.st.vars, lexer.dead, ev.sourced, ev.notes, error)
