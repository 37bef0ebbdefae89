"""Launch scripts evaluated as bash runs them (helpers.readers.shell): quoting, control flow, arrays, functions,
nested shells and the launcher's environment, each case checked against what bash itself does with the script (the
expected values are bash's: each script was run through bash 5.2 with the launcher replaced by a function that
prints its words, see test_the_expected_words_are_bashs)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.readers import ConfigError, read, shell

CMD = "deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B --bf16 --micro_train_batch_size"

# (script, the words bash passes to the command the script runs last)
WORDS = [
    ("MB=4\nARGS=(--mb $MB)\nMB=8\nrun \"${ARGS[@]}\" '$MB' \"$MB\"\n", ["--mb", "4", "$MB", "8"]),
    ("F=\"--a 1 --b 2\"\nrun \"$F\" $F\n", ["--a 1 --b 2", "--a", "1", "--b", "2"]),
    ("A=(x y)\nrun \"${A[*]}\" ${A} ${A[1]} ${#A[@]}\n", ["x y", "x", "y", "2"]),
    ("E=\nrun \"$E\" $E x\n", ["", "x"]),
    ("run $'4\\t5' 4#x \"a\"'b'c\n", ["4\t5", "4#x", "abc"]),
    ("if false; then\n  run 64\nfi\nrun 4\n", ["4"]),
    ("X=1\nif [ \"$X\" = 1 ]; then run a; else run b; fi\n", ["a"]),
    ("X=2\nY=\nif [[ $X -gt 3 ]]; then run a; elif [ -z \"$Y\" ]; then run b; else run c; fi\n", ["b"]),
    ("set -- --mb 4\nrun \"$@\"\n", ["--mb", "4"]),
    ("f() {\n  run \"$@\" $#\n}\nf --x '5 6'\n", ["--x", "5 6", "2"]),
    (": ${MB:=4}\nrun $MB ${MB:?need} ${#MB} $((MB * 2 + 1))\n", ["4", "4", "1", "9"]),
    ("read MB N <<< '7 8'\nrun $MB $N\n", ["7", "8"]),
    ("M=models/llama-3\nrun ${M##*/} ${M%/*} ${M^^}\n", ["llama-3", "models", "MODELS/LLAMA-3"]),
    ("C=\"run --module x --mb 4\"\n$C\n", ["--module", "x", "--mb", "4"]),
    ("C='run a'\neval \"$C b\"\n", ["a", "b"]),
    ("run a \\\n  b `# a comment` c\n", ["a", "b", "c"]),
    ("case x86 in\n  arm*) run a ;;\n  x*|y) run b ;;\nesac\n", ["b"]),
    ("run 1\nexit 0\nrun 2\n", ["1"]),
    ("declare -a A=(p q)\nA+=(r)\nA[0]=z\nrun ${A[@]}\n", ["z", "q", "r"]),
    ("run --t \"a: {}\nb: \"\n", ["--t", "a: {}\nb: "]),
    ("for MB in 1 2; do :; done\nrun $MB\n", ["2"]),
    ("i=0\nwhile [ $i -lt 3 ]; do i=$((i + 1)); done\nrun $i\n", ["3"]),
    ("M=0\n(( MB = 2 * 3 ))\nlet N=MB+1 M++\nrun $MB $N $M\n", ["6", "7", "1"]),
    ("declare -i X=2\nX+=2\ndeclare -u U=abc\nrun $X $U\n", ["4", "ABC"]),
    ("f() { local MB=9; }\nMB=4\nf\nrun $MB\n", ["4"]),
    ("run $((2#100)) $((0x10)) $((010)) $[2*3]\n", ["4", "16", "8", "6"]),
    ("case '*' in\n  \"*\") run lit ;&\n  x) run next ;;\n  *) run no ;;\nesac\n", ["next"]),
    ("A=(4)\nA+=8\nrun ${A[0]}\n", ["48"]),
    ("run --max_len={512,1024} {1..3}\n", ["--max_len=512", "--max_len=1024", "1", "2", "3"]),
    ("run $'\\x41\\101\\u00e9'\n", ["AA\u00e9"]),
    ("IFS=, read A B <<< 'x,y z'\nrun \"$A\" \"$B\"\n", ["x", "y z"]),
    ("F='a b'\nIFS=\nrun $F\n", ["a b"]),
    ("[[ 10 > 9 ]] && run str || run no\n", ["no"]),
    ("[[ abc =~ ^a.c$ ]] && run re\n", ["re"]),
    ("[ 1 = 1 -a 2 = 3 ] || run ao\n", ["ao"]),
    ("read -n 2 X <<< 4567\nrun $X\n", ["45"]),
    ("printf -v X '%s-%d' a 7\nrun $X\n", ["a-7"]),
    ("run 1 | exit 3\nrun 2\n", ["2"]),
    ("f() { run \"${@:2}\"; }\nf a b 'c d'\n", ["b", "c d"]),
    ("IFS=,\nA=(x y)\nrun \"${A[*]}\"\n", ["x,y"]),
    ("for i in 1 2; do for j in 1 2; do continue 2; done; done\nrun $i $j\n", ["2", "1"]),
    ("A=(a)\nA[${#A[@]}]=b\ni=0\nA[$((i+2))]=c\nrun \"${A[@]}\"\n", ["a", "b", "c"]),
    ("case ABC in [[:upper:]]*) run up ;; *) run no ;; esac\n", ["up"]),
    ("shopt -s nocasematch\n[[ ABC == abc ]] && run yes\n", ["yes"]),
    ("trap 'run at-exit' EXIT\nrun first\n", ["at-exit"]),
    ("trap 'exit 1' ERR\nrun before\nfalse\nrun after\n", ["before"]),
    ("set -e\nread -r -d '' C <<'EOF'\nx\nEOF\nrun after\n", None),
    ("while read L; do [ \"$L\" = b ] && continue; run \"$L\"; done <<'EOF'\na\nb\nEOF\n", None),
    ("M=x\nunset -f M\nrun $M\n", ["x"]),
]


def last(script: str) -> list[str] | None:
    runs = shell.run(script).commands
    return [str(w) for w in runs[-1].words[1:]] if runs else None


@pytest.mark.parametrize("script,words", [(s, w) for s, w in WORDS if w is not None])
def test_words_are_bashs(script, words):
    assert last(script) == words


def test_set_e_ends_at_a_read_that_meets_the_end_of_its_input():
    """The `read -r -d '' CMD <<EOF` idiom returns 1 (no NUL before the end): under set -e bash ends there."""
    assert last("set -e\nread -r -d '' C <<'EOF'\nx\nEOF\nrun after\n") is None


def test_a_loop_over_input_it_cannot_read_with_continue_keeps_the_rest():
    runs = shell.run("while read L; do continue; done < list.txt\nrun after\n").commands
    assert [str(w) for w in runs[-1].words] == ["run", "after"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize("script,words", [(s, w) for s, w in WORDS if w is not None])
def test_the_expected_words_are_bashs(script, words):
    """The expected words above are what bash itself passes: run through bash with `run` printing its words."""
    prog = "run() { for w in \"$@\"; do printf '%s\\0' \"$w\"; done; printf '\\1'; }\n" + script
    out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=20).stdout
    assert out.split("\x01")[-2].split("\0")[:-1] == words


@pytest.mark.parametrize("script,why", [
    ("X=$(nproc)\nrun $X\n", "a command's output"),
    ("run $NOPE\n", "not assigned in the script"),
    ("run $1\n", "the script's argument 1"),
    ("for MB in $(seq 2); do :; done\nrun $MB\n", "loop's variable"),
    ("if [ -f x ]; then MB=1; fi\nrun $MB\n", "MB='1' is inside an if/case/loop block"),
    ("read MB\nrun $MB\n", "read from the input"),
    ("source env.sh\nrun $MB\n", "env.sh, which the script sources"),
])
def test_what_the_script_leaves_to_its_run_is_named(script, why):
    word = shell.run(script).commands[-1].words[1]
    assert isinstance(word, (shell.Unknown, shell.Unset)) and why in word.why, word.why


@pytest.mark.parametrize("script,line", [
    ("run 'a\n", 1), ("if true; then\n  run a\n", 1), ("run a )\n", 1), ("A=(a b\n", 1), ("run \"${A\n", 1),
])
def test_a_script_bash_cannot_parse_is_one_error(script, line):
    """A quote never closed stops the reading; a syntax error bash meets further on is kept (bash runs the commands
    before it): either way one line naming where."""
    try:
        error = shell.run(script).error
    except shell.ShellError as e:
        error = e
    assert error is not None and error.line == line and "\n" not in str(error)


def test_nesting_and_doubling_are_bounded():
    bomb = "f() { f; }\nf\n"
    with pytest.raises(shell.ShellError, match="nest deeper"):
        shell.run(bomb)
    doubling = "V=ab\n" + "V=$V$V\n" * 60 + "run $V\n"
    word = shell.run(doubling).commands[-1].words[1]
    assert isinstance(word, shell.Unknown) and "grows past" in word.why


# -- through the OpenRLHF reader ------------------------------------------------------------------------------------

def write(tmp_path: Path, text: str, name: str = "a.sh") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def refused(path: Path, *words: str) -> str:
    with pytest.raises(ConfigError) as e:
        read([path])
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


@pytest.mark.parametrize("script,batch", [
    ("MB=4\nARGS=(--micro_train_batch_size $MB)\nMB=8\n" + CMD.rsplit(" ", 1)[0] + " \"${ARGS[@]}\"\n", 4),
    ("if false; then\n  " + CMD + " 64\nfi\n" + CMD + " 4\n", 4),
    ("set -- 6\n" + CMD + " \"$@\"\n", 6),
    (CMD + " $'4'\n", 4),
    ("N=8\ndeepspeed --num_gpus $N other.py\n" + CMD + " 3\n", 3),
    ("ARGS=(--micro_train_batch_size 4)\nARGS[1]=8\n" + CMD.rsplit(" ", 1)[0] + " \"${ARGS[@]}\"\n", 8),
    ("X=1\nbash -c 'export MB=5; " + CMD + " $MB'\n", 5),
    ("export MB=7\nbash -c '" + CMD + " $MB'\n", 7),
    (CMD + " 2 --input_template \"User: {}\nAssistant: \"\n", 2),
    ("run() {\n  " + CMD + " \"$@\"\n}\nrun 9\n", 9),
    ("if [[ ${1} != \"slurm\" ]]; then\n  " + CMD + " 4\nfi\n", 4),
    (CMD + " 5\nif true; then\n", 5),                          # bash runs it, then stops at the unclosed if
])
def test_the_command_bash_runs_is_read(tmp_path, script, batch):
    assert read([write(tmp_path, script)]).setup.batch == batch


@pytest.mark.parametrize("script,words", [
    (CMD + " '$MB'\n", ("--micro_train_batch_size", "'$MB'", "positive integer")),
    (CMD + " 4#x\n", ("'4#x'",)),
    ("MB=4\nbash -c '" + CMD + " $MB'\n", ("not exported",)),
    ("echo hi\nexit 0\n" + CMD + " 4\n", ("no openrlhf.cli.train_* command that the script runs",)),
    ("if [ -n \"$A\" ]; then\n  " + CMD + " 64\nelse\n  " + CMD + " 4\nfi\n", ("2 openrlhf commands (lines 2, 4)", "inside the if block")),
    (CMD + " 4 && " + CMD + " 64\n", ("2 openrlhf commands (line 1)", "after && or ||")),
    (CMD + " $1\n", ("the script's argument 1",)),
    ("ARGS=(--micro_train_batch_size $MB)\nMB=4\n" + CMD.rsplit(" ", 1)[0] + " \"${ARGS[@]}\"\n",
     ("$MB is not assigned in the script",)),
    ("for MB in $(seq 2); do\n  echo $MB\ndone\n" + CMD + " $MB\n", ("for loop's variable",)),
    ("F=\"--max_len 1024\"\n" + CMD + " 4 \"$F\"\n", ("'--max_len 1024' is one word",)),
])
def test_what_bash_would_do_differently_is_refused(tmp_path, script, words):
    refused(write(tmp_path, script), *words)


@pytest.mark.parametrize("script,gpus", [
    (CMD + " 4\nexport CUDA_VISIBLE_DEVICES=0,1,2,3\n", 1),                 # set after the command: not its own
    ("export CUDA_VISIBLE_DEVICES=0,1\n" + CMD + " 4\n", 2),
    ("CUDA_VISIBLE_DEVICES=0,1 " + CMD.replace("--module", "--num_gpus 4 --module") + " 4\n", 4),
    ("CUDA_VISIBLE_DEVICES= " + CMD + " 4\n", 1),                          # empty: DeepSpeed ignores it
    ("python3 -m deepspeed.launcher.runner --num_gpus 4 " + CMD.split(" ", 1)[1] + " 4\n", 4),
    ("srun --ntasks-per-node 8 " + CMD.replace("--module", "--num_gpus 2 --module") + " 4\n", 2),
])
def test_cuda_visible_devices_as_deepspeeds_runner_reads_it(tmp_path, script, gpus):
    assert read([write(tmp_path, script)]).setup.gpus == gpus


@pytest.mark.parametrize("prefix,words", [
    ("CUDA_VISIBLE_DEVICES=0,1 ", ("CUDA_VISIBLE_DEVICES=0,1", "Cannot specify num_nodes/gpus")),
    ("CUDA_VISIBLE_DEVICES=-1 ", ("GPU -1 is no GPU of localhost",)),
    ("CUDA_VISIBLE_DEVICES=0,,2 ", ("CUDA_VISIBLE_DEVICES=0,,2", "as a number")),
])
def test_cuda_visible_devices_deepspeed_refuses(tmp_path, prefix, words):
    launcher = "--num_nodes 1 --module" if "0,1 " in prefix else "--module"
    refused(write(tmp_path, prefix + CMD.replace("--module", launcher) + " 4\n"), *words)


def test_flags_are_placed_on_the_line_that_runs(tmp_path):
    text = ": <<'OLD'\n" + CMD + " 64\nOLD\nMB=4\n" + CMD + " $MB\n"
    imp = read([write(tmp_path, text)])
    assert imp.setup.batch == 4
    assert next(s.line for s in imp.settings if s.key == "--micro_train_batch_size") == 5


def test_a_flag_takes_what_argparse_int_takes(tmp_path):
    """argparse's type=int is Python's int(): another script's decimal digits are digits (Arabic-Indic four)."""
    assert read([write(tmp_path, CMD + " \u0664\n")]).setup.batch == 4
    refused(write(tmp_path, CMD + " \u00b2\n", "b.sh"), "positive integer")          # a superscript is not


@pytest.mark.parametrize("script,gpus", [
    ("deepspeed --num_gpus 2 --num_gpus 4 " + CMD.split(" ", 1)[1] + " 4\n", 4),        # argparse keeps the last
    ("export CUDA_VISIBLE_DEVICES=0,1\nenv -u CUDA_VISIBLE_DEVICES " + CMD + " 4\n", 1),
    ("export CUDA_VISIBLE_DEVICES=0,1\nexport -n CUDA_VISIBLE_DEVICES\n" + CMD + " 4\n", 1),
    ("f() { " + CMD + " 4; }\nCUDA_VISIBLE_DEVICES=0,1 f\n", 2),
    ("f() { local CUDA_VISIBLE_DEVICES=0,1,2; }\nf\nexport CUDA_VISIBLE_DEVICES=0\n" + CMD + " 4\n", 1),
])
def test_the_launchers_gpus_as_bash_and_deepspeed_give_them(tmp_path, script, gpus):
    assert read([write(tmp_path, script)]).setup.gpus == gpus


def test_num_gpus_minus_one_is_every_gpu_a_count_the_script_does_not_say(tmp_path):
    imp = read([write(tmp_path, CMD.replace("--module", "--num_gpus -1 --module") + " 4\n")])
    assert imp.setup.gpus == 1 and any(n.key == "--num_gpus" for n in imp.not_modelled)


@pytest.mark.parametrize("script,words", [
    ("alias ds=deepspeed\nds " + CMD.split(" ", 1)[1] + " 4\n", ("'ds' is an alias", "expand_aliases")),
    ("MB=4\nsource ./env.sh\n" + CMD + " $MB\n", ("was assigned before `source ./env.sh`",)),
    ("exec " + CMD + " 4\n" + CMD + " 8\n", None),
    ("set -e\nfalse\n" + CMD + " 4\n", ("no openrlhf.cli.train_* command that the script runs",)),
    ("\u00a0" + CMD + " 4\n", ("non-ASCII space",)),
    ("\ufeff" + CMD + " 4\n", ("byte-order mark",)),
    (CMD + " 4\r\n", ("carriage return",)),
    ("X=1\nwhile true; do :; done\n" + CMD + " 4\n", ("no openrlhf.cli.train_* command that the script runs",)),
])
def test_what_bash_never_runs_or_reads_otherwise(tmp_path, script, words):
    if words is None:                                   # exec: the second command never runs
        assert read([write(tmp_path, script)]).setup.batch == 4
        return
    refused(write(tmp_path, script), *words)
