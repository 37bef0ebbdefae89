"""Property-based tests (hypothesis) of the bash evaluator (helpers.readers.shell) against bash itself: random
scripts of assignments, quoting, arrays, expansions, conditions on settled values, functions and && / || run through
bash with `run` printing its words, and through the evaluator; the words of the last command must be bash's. A script
the evaluator cannot settle must say so (an Unknown/Unset word or a ShellError), never give other words.

Bounded: a fixed number of derandomized examples, no deadline, no example database."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.readers import shell

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")

NAMES = ["A", "B", "MB", "X"]
LITERALS = ["4", "8", "", "a b", "--x 1", "q_proj", "-1", "0", "x*", "a'b", 'a"b', "$", "#c"]


def quoted(text: str, how: str) -> str:
    if how == "single" and "'" not in text:
        return f"'{text}'"
    if how == "double":
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'
    if how == "ansi":
        return "$'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "'" + text.replace("'", "'\\''") + "'"


literal = st.builds(quoted, st.sampled_from(LITERALS), st.sampled_from(["single", "double", "ansi", "plain"]))
name = st.sampled_from(NAMES)
expansion = st.one_of(
    st.builds(lambda n: f"${n}", name), st.builds(lambda n: f'"${n}"', name),
    st.builds(lambda n, d: f"${{{n}:-{d}}}", name, st.sampled_from(["4", "z", ""])),
    st.builds(lambda n, d: f'"${{{n}-{d}}}"', name, st.sampled_from(["4", "z"])),
    st.builds(lambda n: f"${{#{n}}}", name),
    st.builds(lambda n: f'"${{{n}[@]}}"', name), st.builds(lambda n: f"${{{n}[*]}}", name),
    st.builds(lambda n: f"${{{n}[1]}}", name),
    st.builds(lambda n: f"${{{n}^^}}", name), st.builds(lambda n: f"${{{n}%% *}}", name),
    st.builds(lambda a, b: f"$(( {a} * 2 + {b} ))", st.integers(-9, 9), st.integers(0, 9)),
)
word = st.one_of(literal, expansion, st.builds(lambda a, b: a + b, literal, expansion))
assignment = st.one_of(
    st.builds(lambda n, w: f"{n}={w}", name, word),
    st.builds(lambda n, w: f"{n}+={w}", name, literal),
    st.builds(lambda n, ws: f"{n}=({' '.join(ws)})", name, st.lists(word, min_size=0, max_size=3)),
    st.builds(lambda n: f"unset {n}", name),
    st.builds(lambda n, w: f"export {n}={w}", name, literal),
)
condition = st.one_of(
    st.just("true"), st.just("false"), st.just(":"),
    st.builds(lambda n, v: f'[ "${n}" = {v} ]', name, st.sampled_from(["4", "8", "''"])),
    st.builds(lambda n: f'[ -n "${n}" ]', name), st.builds(lambda n: f'[[ -z ${n} ]]', name),
)


arithmetic = st.one_of(
    st.builds(lambda n, v: f"(( {n} = {v} ))", name, st.sampled_from(["3", "2 * 4", "010", "16#ff", "2#101", "-7 / 2"])),
    st.builds(lambda n: f"(( {n}++ ))", st.just("I")), st.builds(lambda n, v: f"let {n}+={v}", st.just("I"),
                                                                     st.sampled_from(["1", "5"])),
    st.builds(lambda n: f"declare -i {n}=2+3", name),
)
loop = st.one_of(
    st.builds(lambda ws, n: f"for {n} in {' '.join(ws)}; do run ${n}; done", st.lists(literal, min_size=0, max_size=3),
              name),
    st.builds(lambda k: f"for ((J=0; J<{k}; J++)); do A=$J; done", st.integers(0, 4)),
    st.builds(lambda k: f"I=0; while [ $I -lt {k} ]; do I=$((I + 1)); done", st.integers(0, 4)),
)
case = st.builds(lambda w, p, q: f"case {w} in {p}) run one ;; {q}) run two ;; *) run other ;; esac",
                 literal, st.sampled_from(["a*", "'a*'", "4|8", '"x y"', "?"]), st.sampled_from(["*", "8", "''"]))
reads = st.builds(lambda n, v: f"read {n} <<< {v}", name, literal)


@st.composite
def statement(draw, depth=0):
    kind = draw(st.sampled_from(["assign", "assign", "assign", "run", "if", "andor", "func", "arith", "loop", "case",
                                 "read", "local"] if depth < 2 else ["assign", "run", "arith"]))
    if kind == "arith":
        return "I=0; " + draw(arithmetic)
    if kind == "loop":
        return draw(loop)
    if kind == "case":
        return draw(case)
    if kind == "read":
        return draw(reads)
    if kind == "local":
        return f"g() {{ local {draw(name)}=9; run ${draw(name)}; }}\ng"
    if kind == "assign":
        return draw(assignment)
    if kind == "run":
        return "run " + " ".join(draw(st.lists(word, min_size=0, max_size=4)))
    if kind == "andor":
        return f"{draw(condition)} {draw(st.sampled_from(['&&', '||']))} {draw(assignment)}"
    if kind == "func":
        body = "; ".join(draw(st.lists(statement(depth + 1), min_size=1, max_size=2)))
        call = draw(st.sampled_from(["f", "f 4 '5 6'", ""]))
        return f"f() {{ {body}; }}\n{call}"
    then = "\n  ".join(draw(st.lists(statement(depth + 1), min_size=1, max_size=2)))
    other = draw(st.one_of(st.none(), st.lists(statement(depth + 1), min_size=1, max_size=2)))
    return (f"if {draw(condition)}; then\n  {then}\n" + ("else\n  " + "\n  ".join(other) + "\n" if other else "")
            + "fi")


script = st.builds(lambda parts, last: "\n".join(parts + [last]),
                   st.lists(statement(), min_size=0, max_size=6),
                   st.builds(lambda ws: "run " + " ".join(ws), st.lists(word, min_size=1, max_size=5)))

RUN = "run() { for w in \"$@\"; do printf '%s\\0' \"$w\"; done; printf '\\1'; }\n"


def bash_words(text: str) -> list[str] | None:
    """The words bash passes to the last `run` it runs (None where it runs none)."""
    out = subprocess.run(["bash", "-c", RUN + text], capture_output=True, timeout=20,
                         env={"PATH": "/usr/bin:/bin"})
    if b"\x01" not in out.stdout:                           # (a syntax error later on: bash ran those before it)
        return None
    last = out.stdout.split(b"\x01")[-2]                   # (each run ends with \x01: the text after is empty)
    return [w.decode("utf-8", "replace") for w in last.split(b"\0")[:-1]]


@settings(max_examples=800, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(script)
def test_the_evaluator_gives_bashs_words_or_says_why_not(text):
    try:
        commands = shell.run(text).commands
    except shell.ShellError:
        return                                              # said: a script this package does not read
    runs = [c for c in commands if c.words and c.words[0] == "run"]
    expected = bash_words(text)
    if not runs:
        return
    last = runs[-1]
    got = [str(w) for w in last.words[1:]]
    odd = [w for w in last.words if isinstance(w, (shell.Unknown, shell.Unset))]
    if odd or last.cond or any(c.cond for c in runs):
        return                                              # said: decided when the script runs
    assert expected is not None, f"bash runs no command, the evaluator gives {got}\n{text}"
    assert got == expected, f"\n{text}\nbash: {expected}\nours: {got}"
