"""OpenRLHF command lines: a pasted command or a .sh script that launches `openrlhf.cli.train_sft` (or train_dpo,
train_rm, train_ppo_ray) under `deepspeed --module`, `torchrun -m`, `python -m` or `ray job submit ... --`.

OpenRLHF has no config file: its DeepSpeed config is built in code from the flags, so this reader models the flags
directly. Two flag styles exist and both are read:
- classic (`--zero_stage 2 --adam_offload --micro_train_batch_size 4 --max_len 2048 --bf16 --flash_attn ...`), up to
  v0.10.1 (the 2025 scripts of cases 1-3 are in this style);
- dotted (`--ds.zero_stage 2 --train.micro_batch_size 2 --data.max_len 2048 --ds.param_dtype bf16 ...`), since
  commit ed62d0e2 ("dotted config hierarchy", first released in v0.10.2) and the style of the current source.
Sources read (github:OpenRLHF/OpenRLHF): `openrlhf/cli/train_sft.py`, `train_dpo.py`, `train_rm.py`,
`train_ppo_ray.py` at v0.8.5 (classic, `--bf16`/`--flash_attn` era), at 76351db1 (classic, `--param_dtype` /
`--attn_implementation` era) and at 3c3be623 (HEAD, 2026-08-13, dotted); `openrlhf/utils/deepspeed/deepspeed_utils.py`
(`get_train_ds_config`: offload_optimizer pin_memory True, "auto" bucket sizes that DeepSpeed drops to its own
defaults, overlap_comm only with the flag); `openrlhf/utils/deepspeed/deepspeed.py` (gradient accumulation = train
batch x ring x TP // micro batch // world size); `openrlhf/trainer/dpo_trainer.py` (`concatenated_forward`: chosen and
rejected in one forward); `openrlhf/models/actor.py` (log-probs from the full fp32 logits, no labels passed: Liger's
fused linear cross-entropy never runs).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from helpers.models import DATA_DIR
from helpers.readers import hf_names, launchers, model_ref, shell
from helpers.readers.base import ConfigError, Imported, did_you_mean, peft_names, probability
from helpers.readers.provenance import Record, model_from
from helpers.readers.provenance import argparse_int as positive_int

NAME = "openrlhf"
MODULE_RE = re.compile(r"openrlhf\.cli\.(train_sft|train_dpo|train_rm|train_ppo_ray|train_kto|train_prm|train_kd)"
                       r"(?![\w.])")
# commands that print, test or look up their arguments rather than run them
NOT_RUNNING = {"echo", "printf", "cat", "print", "type", "which", "hash", "expr", "grep", "egrep", "fgrep",
               "sed", "awk", "test", "[", "[[", "basename", "dirname", "realpath", "readlink", "ls", "tee", "logger",
               "wc", "head", "tail", "cut", "tr", "sort", "uniq", "touch", "mkdir", "rm", "cp", "mv", "alias"}
CLASSIC = "OpenRLHF v0.8.5 (classic flags)"
CLASSIC_NEW = "OpenRLHF 76351db1 (classic flags, --param_dtype era)"
DOTTED = "OpenRLHF 3c3be623 (dotted flags)"
SRC = "github:OpenRLHF/OpenRLHF openrlhf/cli/{module}.py @{ref}"
DS_UTILS = "github:OpenRLHF/OpenRLHF openrlhf/utils/deepspeed/deepspeed_utils.py (get_train_ds_config)"

# canonical name -> (classic flag, dotted flag); PPO's own spellings are added per module in _names.
FLAGS = {
    "pretrain": ("--pretrain", "--model.model_name_or_path"),
    "zero_stage": ("--zero_stage", "--ds.zero_stage"),
    "micro_batch": ("--micro_train_batch_size", "--train.micro_batch_size"),
    "train_batch": ("--train_batch_size", "--train.batch_size"),
    "max_len": ("--max_len", "--data.max_len"),
    "bf16": ("--bf16", None),
    "param_dtype": ("--param_dtype", "--ds.param_dtype"),
    "flash_attn": ("--flash_attn", None),
    "attn_implementation": ("--attn_implementation", "--ds.attn_implementation"),
    "gradient_checkpointing": ("--gradient_checkpointing", "--model.gradient_checkpointing_enable",
                               "--actor.gradient_checkpointing_enable"),
    "adam_offload": ("--adam_offload", "--ds.adam_offload"),
    "zpg": ("--zpg", "--ds.zpg"),
    "ring_attn_size": ("--ring_attn_size", "--ds.ring_attn_size"),
    "tensor_parallel": ("--ds_tensor_parallel_size", "--ds.tensor_parallel_size"),
    "lora_rank": ("--lora_rank", "--ds.lora.rank"),
    "target_modules": ("--target_modules", "--ds.lora.target_modules"),
    "lora_dropout": ("--lora_dropout", "--ds.lora.dropout"),
    "load_in_4bit": ("--load_in_4bit", "--ds.load_in_4bit"),
    "packing_samples": ("--packing_samples", "--ds.packing_samples"),
    "use_liger_kernel": ("--use_liger_kernel", "--ds.use_liger_kernel"),
    "overlap_comm": ("--overlap_comm", "--ds.overlap_comm"),
    "grad_accum_dtype": ("--grad_accum_dtype", "--ds.grad_accum_dtype"),
    "deepcompile": ("--deepcompile", "--ds.deepcompile"),
    "load_checkpoint": ("--load_checkpoint", "--ckpt.load_enable"),
    "ref_pretrain": ("--ref_pretrain", "--ref.model_name_or_path"),
    "ref_offload": ("--ref_offload", "--ref.offload"),
    "prompt_max_len": ("--prompt_max_len", None),
    "generate_max_len": ("--generate_max_len", None),
    "actor_num_nodes": ("--actor_num_nodes", "--actor.num_nodes"),
    "actor_num_gpus_per_node": ("--actor_num_gpus_per_node", "--actor.num_gpus_per_node"),
    "critic_pretrain": ("--critic_pretrain", "--critic.model_name_or_path"),
    "reward_pretrain": ("--reward_pretrain", "--reward.model_name_or_path"),
    "init_kl_coef": ("--init_kl_coef", "--algo.kl.init_coef"),
    "advantage_estimator": ("--advantage_estimator", "--algo.advantage.estimator"),
    "entropy_coef": ("--entropy_loss_coef", "--actor.entropy_coef"),
    "vllm_num_engines": ("--vllm_num_engines", "--vllm.num_engines"),
    "async_train": ("--async_train", "--train.async_enable"),
    "max_new_tokens": (None, "--rollout.max_new_tokens"),
    "rollout_micro_batch": ("--micro_rollout_batch_size", "--rollout.micro_batch_size"),
    "rollout_max_tokens": (None, "--rollout.max_tokens_per_gpu"),
    "vllm_tp": ("--vllm_tensor_parallel_size", "--vllm.tensor_parallel_size"),
    "ref_reward_offload": ("--ref_reward_offload", None),
}
ROLLOUT_MICRO = {"classic": 8, "dotted": 1}   # --micro_rollout_batch_size (v0.8.5), --rollout.micro_batch_size (3c3be623)
PLACEMENT = ("num_nodes", "num_gpus_per_node", "num_engines", "tensor_parallel_size")   # the --critic./--ref./
#                                            --reward./--vllm. flags that place a process
ESTIMATORS = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo")   # train_ppo_ray's choices
SWITCHES = {"bf16", "flash_attn", "gradient_checkpointing", "adam_offload", "load_in_4bit", "packing_samples",
            "use_liger_kernel", "overlap_comm", "deepcompile", "load_checkpoint", "ref_offload", "async_train",
            "ref_reward_offload"}
# flags that take no value in any module (store_true), so a following token is never taken as their value
OTHER_SWITCHES = {"--save_hf_ckpt", "--disable_ds_ckpt", "--use_ds_universal_ckpt",
                  "--gradient_checkpointing_use_reentrant",
                  "--disable_fast_tokenizer", "--pretrain_mode", "--multiturn", "--apply_chat_template", "--use_ms",
                  "--full_determinism", "--ipo", "--colocate_all_models", "--vllm_enable_sleep",
                  "--deepspeed_enable_sleep", "--enforce_eager", "--enable_prefix_caching", "--normalize_reward",
                  "--colocate_actor_ref", "--colocate_critic_reward", "--ckpt.save_hf", "--ckpt.disable_ds",
                  "--data.apply_chat_template", "--model.pretrain_mode_enable", "--data.multiturn",
                  "--model.gradient_checkpointing_reentrant", "--data.disable_fast_tokenizer",
                  "--ds.use_universal_ckpt", "--actor.gradient_checkpointing_reentrant",
                  "--train.dynamic_batch_enable",
                  "--train.full_determinism_enable", "--model.ipo_enable", "--train.colocate_all",
                  "--vllm.enable_sleep", "--ds.enable_sleep", "--vllm.enforce_eager", "--async_train",
                  "--train.async_enable", "--use_kl_loss", "--algo.kl.use_loss"}
# per module: (micro batch default, max_len default) in the classic (v0.8.5) and dotted (3c3be623) sources
MODULE_DEFAULTS = {
    "train_sft": {"classic": (8, 2048), "dotted": (8, 2048)},
    "train_dpo": {"classic": (8, 512), "dotted": (8, 512)},
    "train_rm": {"classic": (1, 512), "dotted": (1, 512)},
    "train_ppo_ray": {"classic": (4, 2048), "dotted": (1, 2048)},
}
ATTENTION = hf_names.ATTENTION
MAX_TOKENS_PER_GPU = 16192                  # train_ppo_ray.py @3c3be623: --train.max_tokens_per_gpu's default


def claims(path: Path, data) -> bool:
    """A shell script or text whose command runs an openrlhf.cli.train_* module."""
    return isinstance(data, str) and bool(MODULE_RE.search(shell.strip_comments(data)))


def _tokens(path, text: str) -> tuple[str, list[str], list[str], shell.Command, set[int]]:
    """(module, the launcher's words before it, the flag words after it, the command, the script's dead lines) of the
    command that runs an openrlhf.cli module, from the script evaluated as bash runs it (`helpers.readers.shell`):
    its words expanded with what was assigned before it (quotes, arrays, defaults, "$@"), the command found among
    the others of its line, inside `bash -c "..."`, `eval` or a function it calls. Several openrlhf commands where
    one may not run (an if/case block, a loop, after && or ||) are refused: which runs is decided when the script
    runs."""
    try:
        script = shell.run(text, Path(path).parent if Path(path).is_file() else None)
    except shell.ShellError as e:
        raise ConfigError(path, f"bash would not read the script this way, or this package cannot: {e}") from None
    found, loose = [], None
    for c in script.commands:
        if not c.words or str(c.words[0]).rsplit("/", 1)[-1] in NOT_RUNNING:
            continue                                   # a command that prints or tests the module's name
        at = next((i for i, w in enumerate(c.words) if MODULE_RE.fullmatch(w)), None)
        if at is not None:
            found.append((c, at))
        elif loose is None and any(MODULE_RE.search(w) for w in c.words):
            loose = c
    if not found and script.error is not None:
        raise ConfigError(path, f"bash would not read the script this way, or this package cannot: {script.error}")
    if not found:
        if loose is not None:
            raise ConfigError(path, f"line {loose.line}: the openrlhf module is not a word of its own in "
                                    f"{' '.join(loose.words)[:80]!r} (expected e.g. `deepspeed --module "
                                    f"openrlhf.cli.train_sft ...`)")
        raise ConfigError(path, "no openrlhf.cli.train_* command that the script runs (expected e.g. `deepspeed "
                                "--module openrlhf.cli.train_sft --pretrain ...`; a command in a heredoc, a comment "
                                "or an echo is text)" + "".join(f"; {n}" for n in script.notes[:2]))
    if len(found) > 1:
        uniq = list(dict.fromkeys(str(c.line) for c, _ in found))
        lines = ("lines " if len(uniq) > 1 else "line ") + ", ".join(uniq[:8]) + (", ..." if len(uniq) > 8 else "")
        why = next((f"; one runs only {c.cond}" for c, _ in found if c.cond), "")
        raise ConfigError(path, f"the script runs {len(found)} openrlhf commands ({lines}), each a training run "
                                f"of its own{why}; give a script with the one to estimate")
    c, at = found[0]
    odd = next((w for w in c.words[:at] for ch in str(w) if ch.isspace() and ch not in " \t\n"), None)
    if odd is not None:
        raise ConfigError(path, f"line {c.line}: {str(odd)!r} holds a non-ASCII space, which bash reads as part of the "
                                f"word (not a separator), so it runs no such command; write a plain space")
    m = MODULE_RE.fullmatch(c.words[at])
    return m.group(1), c.words[:at], c.words[at + 1:], c, script.dead_lines


@functools.cache
def _argparse_table() -> dict:
    return json.loads((DATA_DIR / "tool_keys" / "openrlhf.json").read_text())


def argparse_flags(module: str, style: str) -> dict[str, dict] | None:
    """The flags openrlhf.cli.`module`'s argparse parser defines in the releases of `style` (classic: v0.8.5 and
    76351db1; dotted: 3c3be623), from data/tool_keys/openrlhf.json: {flag: {switch, nargs, type}}; None for a module
    this package does not read."""
    table = _argparse_table()["refs"]
    refs = ("3c3be623",) if style == "dotted" else ("v0.8.5", "76351db1")
    if module not in table[refs[0]]:
        return None
    out: dict[str, dict] = {}
    for ref in refs:
        out |= table[ref][module]
    return out




def _resolve(path, written: str, known: dict | None, module: str) -> str:
    """The flag argparse takes `written` for: itself, or the one flag it abbreviates (argparse's allow_abbrev, on by
    default in every OpenRLHF parser); ConfigError where argparse stops the run (an ambiguous or unknown flag)."""
    if known is None or written in known:
        return written
    matches = sorted(f for f in known if f.startswith(written))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(path, f"{written} is an ambiguous abbreviation for openrlhf.cli.{module}'s argparse "
                                f"('ambiguous option: {written} could match {', '.join(matches[:6])}'): write the "
                                f"whole flag")
    if " " in written:
        raise ConfigError(path, f"{written!r} is one word (bash does not split a quoted \"$VAR\" or \"${{ARGS[*]}}\"), "
                                f"and no flag of openrlhf.cli.{module}: its argparse parser stops the run; leave the "
                                f"variable unquoted, or use an array as \"${{ARGS[@]}}\"")
    raise ConfigError(path, f"{written} is not a flag of openrlhf.cli.{module}: its argparse parser stops the run "
                            f"('unrecognized arguments: {written}')" + did_you_mean(written, known, 0.75))


def _parse_flags(path, words: list[str], known: dict | None = None,
                 module: str = "") -> tuple[dict[str, object], dict[str, str]]:
    """(flags, how each was written) as argparse parses them: --flag value / --flag (a switch) / --flag=value, in
    order, an abbreviation taken for the one flag it starts, a flag given twice keeping its last value. `words` are
    bash's (`helpers.readers.shell`): a word the script leaves to its run (Unknown) or to the environment or its own
    arguments (Unset) is kept, and named where a flag that matters reads it. With the module's argparse table
    (`known`), what argparse refuses is a ConfigError: an unknown or ambiguous flag, a word no flag takes (the
    `false` of `--bf16 false`), a flag without its value."""
    flags: dict[str, object] = {}
    spelled: dict[str, str] = {}
    lines: dict[str, int] = {}
    i, after_switch = 0, None
    while i < len(words):
        w = words[i]
        if isinstance(w, shell.Unknown) and w.startswith("--") and "=" in w:
            name, _, value = w.partition("=")
            w = shell.unknown(name + "=" + value, w.why, w.line)
        if not w.startswith("--"):
            if known is None or isinstance(w, shell.Unset):
                i += 1                                     # the environment's or the script's own arguments
                continue
            if isinstance(w, shell.Unknown):
                raise ConfigError(path, f"{w!s} in the openrlhf command: the script does not settle it before the "
                                        f"command ({w.why}), so the flags it holds are not known here")
            why = (f"{after_switch} is a switch (store_true) and takes no value" if after_switch else
                   "no flag before it takes it")
            raise ConfigError(path, f"{w!r} in the openrlhf command: {why}; argparse stops the run "
                                    f"('unrecognized arguments: {w}')"
                              + ("; leave the word out (drop the switch for off)" if after_switch else ""))
        name, eq, value = w.partition("=")
        full = _resolve(path, name, known, module)
        spec = (known or {}).get(full)
        spelled[full] = name
        if getattr(w, "line", None):
            lines[full] = w.line
        after_switch = None
        if eq:
            flags[full] = (shell.unknown(w, w.why) if isinstance(w, (shell.Unknown, shell.Unset)) else
                           shell.text(value, getattr(w, "line", None)))
            i += 1
            continue
        values = []
        j = i + 1
        while j < len(words) and not (words[j].startswith("--") and not isinstance(words[j], shell.Unset)):
            values.append(words[j])
            j += 1
        nargs = spec["nargs"] if spec else None
        if (spec["switch"] if spec else w in OTHER_SWITCHES or _canonical(w) in SWITCHES):
            flags[full] = True
            j, after_switch = i + 1, full                        # the words after it are not its own
        elif spec is not None and nargs is None and not values:
            raise ConfigError(path, f"{name} needs a value (argparse: 'argument {full}: expected one argument')")
        elif isinstance(nargs, int) and len(values) < nargs:
            raise ConfigError(path, f"{name} takes {nargs} values, got {len(values)} (argparse: 'argument {full}: "
                                    f"expected {nargs} arguments')")
        elif not values:
            flags[full] = True if spec is None else []
        elif spec is not None and nargs is None:
            flags[full] = values[0]
            j = i + 2                                             # argparse takes one word; the rest are stray
        elif isinstance(nargs, int):
            flags[full] = values[:nargs] if nargs > 1 else values[0]
            j = i + 1 + nargs
        else:
            flags[full] = values[0] if len(values) == 1 and spec is None else values
        i = j
    return flags, spelled, lines

def _canonical(flag: str) -> str | None:
    for name, spellings in FLAGS.items():
        if flag in spellings:
            return name
    return None


class _Reader:
    def __init__(self, path: Path, text: str, flag_lines: dict[str, int] | None = None):
        self.path, self.text = Path(path), text
        self.module, launcher, words, self.command, self.dead = _tokens(path, text)
        self.style = "dotted" if any(w.startswith(("--ds.", "--train.", "--data.", "--model.", "--ckpt."))
                                     for w in words) else "classic"
        self.flags, self.spelled, self.flag_lines = _parse_flags(path, words, argparse_flags(self.module, self.style),
                                                                 self.module)
        self.launcher = launcher
        newer = any(f in self.flags for f in ("--param_dtype", "--attn_implementation"))
        self.tool = DOTTED if self.style == "dotted" else (CLASSIC_NEW if newer else CLASSIC)
        ref = {DOTTED: "3c3be623", CLASSIC_NEW: "76351db1", CLASSIC: "v0.8.5"}[self.tool]
        self.source = SRC.format(module=self.module, ref=ref)
        self.d = Record(NAME, path)
        self.used: set[str] = set()

    def line(self, flag: str) -> int | None:
        """The line the flag is written on: its word's own where the command writes it, else (a flag from a variable
        or an array) the first line of live code that holds it."""
        if flag in self.flag_lines:
            return self.flag_lines[flag]
        flag = self.spelled.get(flag, flag)                     # an abbreviation is found as written
        pattern = re.compile(rf"(?<![\w.-]){re.escape(flag)}(?![\w.-])")
        for n, raw in enumerate(self.text.splitlines(), 1):
            if n not in self.dead and not raw.lstrip().startswith("#") and pattern.search(raw):
                return n
        return None

    def get(self, name: str):
        """(flag as written, value) or (None, None)."""
        for spelled in FLAGS[name]:
            if spelled and spelled in self.flags:
                self.used.add(spelled)
                value = self.flags[spelled]
                for v in value if isinstance(value, list) else [value]:
                    if isinstance(v, shell.Unset):
                        raise ConfigError(self.path, f"{spelled} {v}: {v.why}; assign it in the script before the "
                                                     f"command, or write the flag's value")
                    if isinstance(v, shell.Unknown):
                        raise ConfigError(self.path, f"{spelled} {v}: the script does not settle its value before "
                                                     f"the command ({v.why}); assign it plainly before the command, "
                                                     f"or write the flag's value")
                return spelled, value
        return None, None

    def read(self) -> Imported:
        d, f = self.d, self.path
        if self.module not in MODULE_DEFAULTS:
            raise ConfigError(f, f"openrlhf.cli.{self.module} is not read by this package: train_sft, train_dpo, "
                                 f"train_rm and train_ppo_ray are")
        model, named = self.model()
        world = self.world()
        tp = self.degree("tensor_parallel", "tensor_parallel", "DeepSpeed AutoTP")
        ring = self.degree("ring_attn_size", "context_parallel", "ring attention (context parallel)")
        self.strategy()
        self.sizes(world, tp, ring)
        self.precision()
        self.attention()
        self.switches()
        self.lora()
        self.others()
        for flag, value in self.flags.items():
            if flag not in self.used:
                d.ignored_at(f, self.line(flag), flag, value)
        return d.finish(model, named)

    def model(self):
        d, f = self.d, self.path
        name = "pretrain"
        if self.module == "train_ppo_ray" and self.style == "dotted":
            k, v = "--actor.model_name_or_path", self.flags.get("--actor.model_name_or_path")
            if v is not None:
                self.used.add(k)
            else:
                k = None
        else:
            k, v = self.get(name)
        if k is None or v is True:
            flag = ("--actor.model_name_or_path" if self.module == "train_ppo_ray" and self.style == "dotted" else
                    FLAGS[name][0 if self.style == "classic" else 1])
            raise ConfigError(f, f"the command names no model: give {flag} HUB_ID_OR_PATH (or --model beside "
                                 f"--from)")
        model = model_from(str(v), f, k)
        d.setting(f, self.line(k), k, v, sets=model_ref.sets_words(model))
        return model, str(v)

    def pair(self, flags, sets, dashes: str = "", fields=None):
        """Two flags that together set one field, each (name, default): their values, each recorded as a setting
        or as OpenRLHF's default with `sets(*values)`, the field they make (`fields(*values)`: the TrainSetup fields
        they set, where the caller sets them)."""
        d, f = self.d, self.path
        got = []
        for name, default in flags:
            k, v = self.get(name)
            got.append((k, positive_int(f, k or dashes + name, v if k else default), dashes + name, default))
        values = [v for _, v, _, _ in got]
        made = fields(*values) if fields else {}
        for k, v, key, default in got:
            (d.setting(f, self.line(k), k, v, sets=sets(*values), **made) if k else
             d.default(self.tool, key, default, self.source, sets=sets(*values), **made))
        return values

    def world(self) -> int:
        d, f = self.d, self.path
        self.world_known = True
        if self.module == "train_ppo_ray":
            nodes, per = self.pair((("actor_num_nodes", 1), ("actor_num_gpus_per_node", 8)),
                                   lambda n, p: f"gpus={n * p}, gpus_per_node={p} (actor)",
                                   fields=lambda n, p: {"gpus": n * p, "gpus_per_node": p})
            return nodes * per
        gpus, how = launchers.world_size(f, self.launcher, self.command.env)
        if gpus is None:
            if how:
                key, value, why = how
                d.unmodelled_at(f, self.line(key), key, value, f"{why}: estimated on gpus=1; give --gpus")
            d.gpus_unknown()
            self.world_known = False
            return 1
        d.setting(f, None, "launcher", how, gpus=gpus)
        return gpus

    def degree(self, name: str, field: str, what: str) -> int:
        d, f = self.d, self.path
        k, v = self.get(name)
        if k is None:
            return 1
        v = positive_int(f, k, v)
        d.setting(f, self.line(k), k, v, **{field: v})
        return v

    def strategy(self):
        d, f = self.d, self.path
        k, stage = self.get("zero_stage")
        if k:
            try:
                stage = int(str(stage))                 # argparse's type=int: '00' is 0, '-1' is -1
            except ValueError:
                raise ConfigError(f, f"{k} must be an integer (OpenRLHF's argparse type=int), got {stage!r}") from None
        else:
            stage = 2
        if stage not in (0, 1, 2, 3):
            raise ConfigError(f, f"{k} must be 0, 1, 2 or 3 (a DeepSpeed ZeRO stage), got {stage!r}")
        strategy = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
        if stage == 0:
            d.unmodelled_at(f, self.line(k), k, stage, "ZeRO stage 0 under DeepSpeed (its own optimizer, no sharding) "
                                                      "is modelled as torch DDP")
        (d.setting(f, self.line(k), k, stage, strategy=strategy) if k else
         d.default(self.tool, FLAGS["zero_stage"][self.style == "dotted"], 2, self.source, strategy=strategy))
        d.default("OpenRLHF get_train_ds_config", "reduce_bucket_size, stage3_prefetch_bucket_size, sub_group_size",
                  "auto", f"{DS_UTILS}: 'auto', which DeepSpeed's config model drops (DeepSpeedConfigModel "
                  f"ignores 'auto' values), so DeepSpeed's own defaults apply", sets="DeepSpeed's defaults")
        if stage == 3:
            d.default("OpenRLHF get_train_ds_config", "stage3_gather_16bit_weights_on_model_save", False,
                      f"{DS_UTILS}: not written, so DeepSpeed's default (false) applies; OpenRLHF's checkpoints are "
                      f"engine.save_checkpoint's sharded files (save_ckpt)", save_16bit=False)
            d.default("OpenRLHF create_optimizer", "optimizer parameter groups", "weights, then no-decay",
                      "openrlhf/models/utils.py get_optimizer_grouped_parameters (3c3be623): the weights, then the "
                      "biases and norm weights at weight decay 0, handed to deepspeed.initialize",
                      sets="optimizer_groups='decay' (ZeRO-3 sub-groups per group)", optimizer_groups="decay")
        self.zero = stage

    def sizes(self, world: int, tp: int, ring: int):
        d, f = self.d, self.path
        style = "dotted" if self.style == "dotted" else "classic"
        micro_default, len_default = MODULE_DEFAULTS[self.module][style]
        k, micro = self.get("micro_batch")
        micro = positive_int(f, k or "micro batch", micro if k else micro_default)
        batch = micro                               # (run=dpo and run=rm double the micro batch themselves)
        why = (" pairs (run=dpo: chosen and rejected in one forward)" if self.module == "train_dpo" else
               " pairs (run=rm: chosen and rejected sequences of each pair in one forward, concatenated_forward)"
               if self.module == "train_rm" else "")
        (d.setting(f, self.line(k), k, micro, sets=f"batch={batch}{why}", batch=batch) if k else
         d.default(self.tool, FLAGS["micro_batch"][style == "dotted"], micro_default, self.source,
                   sets=f"batch={batch}{why}", batch=batch))
        if self.module == "train_ppo_ray" and style == "classic":
            prompt, gen = self.pair((("prompt_max_len", 1024), ("generate_max_len", 1024)),
                                    lambda p, g: f"seq={p + g} (prompt + generated), completion={g}", dashes="--")
            d.fields["seq"] = prompt + gen
            d.fields["completion"] = gen
        else:
            k, seq = self.get("max_len")
            seq = positive_int(f, k or "max_len", seq if k else len_default)
            (d.setting(f, self.line(k), k, seq, seq=seq) if k else
             d.default(self.tool, FLAGS["max_len"][style == "dotted"], len_default, self.source, seq=seq))
            if self.module == "train_ppo_ray":
                self.completion(seq)
        if self.module == "train_ppo_ray" and "--train.dynamic_batch_enable" in self.flags:
            self.dynamic_batch(tp, ring)
        k, total = self.get("train_batch")
        total = positive_int(f, k or "train batch", total if k else 128)
        dp_micro = micro * max(world // (tp * ring), 1)
        if (total % dp_micro and tp == ring == 1 and self.world_known
                and "--train.dynamic_batch_enable" not in self.flags and "--use_dynamic_batch" not in self.flags):
            written = k or f"{FLAGS['train_batch'][style == 'dotted']} (default)"
            raise ConfigError(f, f"{written} {total} with micro batch {micro} on {world} GPU(s): DeepSpeed refuses it "
                                 f"before training (deepspeed/runtime/config.py _batch_assertion: the train batch must "
                                 f"be micro batch x GPUs x accumulation steps, and {total} // ({micro} x {world}) = "
                                 f"{total // dp_micro} steps{' with a remainder' if total // dp_micro else ''}): give a "
                                 f"train batch that is a multiple of {dp_micro}")
        accum = max(total // dp_micro, 1)
        sets = (f"grad_accum={accum} (train batch {total} // (micro batch {micro} x data-parallel "
                f"{max(world // (tp * ring), 1)}))")
        (d.setting(f, self.line(k), k, total, sets=sets, grad_accum=accum) if k else
         d.default(self.tool, FLAGS["train_batch"][style == "dotted"], 128, self.source, sets=sets, grad_accum=accum))

    def completion(self, seq: int):
        """--rollout.max_new_tokens (dotted): the completion within --data.max_len (prompt + response); it sizes the
        policy loss's per-token vectors alone (the Actor's logits cover the whole sequence)."""
        d, f = self.d, self.path
        k, new = self.get("max_new_tokens")
        if k is None or new is None or str(new) == "None":
            d.default(self.tool, FLAGS["max_new_tokens"][1], None, self.source + " (None: vLLM's max_tokens per "
                      "prompt, up to --data.max_len; samples_generator.py)", completion=seq - 1,
                      sets=f"completion={seq - 1} (at most the sequence less one prompt token: it sizes the policy "
                           f"loss's per-token vectors alone)")
            return
        new = positive_int(f, k, new)
        d.setting(f, self.line(k), k, new, completion=min(new, seq - 1),
                  sets=f"completion={min(new, seq - 1)} (within seq {seq}: the policy loss's per-token vectors; "
                       f"the logits cover every position)")

    def reinforcement(self):
        """train_ppo_ray's actor as run 'grpo' with OpenRLHF's log-probabilities (helpers.estimate.openrlhf_actor):
        the advantage estimator changes what the advantages hold, not the actor step's memory; the reference that
        shares the actor's GPUs, the vLLM engines that do, and what else shares them (train_ppo_ray.py @3c3be623
        lines 38-125: the placement groups; ppo_trainer.py ppo_train)."""
        d, f = self.d, self.path
        dotted = self.style == "dotted"
        k, est = self.get("advantage_estimator")
        est = str(est) if k else "gae"
        if est not in ESTIMATORS:
            raise ConfigError(f, f"{k} must be one of {', '.join(ESTIMATORS)} (train_ppo_ray's choices), got {est!r}")
        what = ("PPO (gae: a critic model)" if est == "gae" else
                f"{est} (no critic: a baseline from the group of samples)" if est != "reinforce" else
                "REINFORCE++ (no critic)")
        sets = (f"run=grpo, dpo_logps=openrlhf: the actor's policy-gradient step on generated samples ({what}); "
                f"its logits are every position's, copied to fp32 and held through the step (models/actor.py)")
        (d.setting(f, self.line(k), k, est, sets=sets, run="grpo", dpo_logps="openrlhf") if k else
         d.default(self.tool, FLAGS["advantage_estimator"][dotted], "gae", self.source, sets=sets, run="grpo",
                   dpo_logps="openrlhf"))
        ke, coef = self.get("entropy_coef")
        if ke and coef is not None and str(coef) != "None":
            try:
                coef = float(coef)
            except ValueError:
                raise ConfigError(f, f"{ke} must be a number, got {coef!r}") from None
            d.setting(f, self.line(ke), ke, coef, entropy_kept=True,
                      sets="entropy_kept=True (compute_entropy with autograd over the whole logits: its softmax is "
                           "kept with the output)")
            if coef != 0:
                d.unmodelled_at(f, self.line(ke), ke, coef, "a non-zero entropy coefficient puts the entropy in the "
                                                            "loss: its own backward's gradients are not counted, so "
                                                            "the real backward is higher")
        k_all = next((n for n in ("--train.colocate_all", "--colocate_all_models") if n in self.flags), None)
        k_ref = next((n for n in ("--train.colocate_actor_ref", "--colocate_actor_ref") if n in self.flags), None)
        ka, asynch = self.get("async_train")
        kk, kl = self.get("init_kl_coef")
        try:
            kl = float(kl) if kk else 0.01
        except (TypeError, ValueError):
            raise ConfigError(f, f"{kk} must be a number, got {kl!r}") from None
        if kl > 0 and (k_all or k_ref):
            colocated = k_ref or k_all
            self.used.add(colocated)
            d.setting(f, self.line(colocated), colocated, True, reference="copy",
                      sets=f"reference=copy: KL coefficient {kl:g} > 0 loads a reference model, which shares the "
                           f"actor's GPUs (ReferenceModelActor: get_eval_ds_config, stage 3 with the actor's stage 3, "
                           f"else stage 0: whole, bf16)")
        else:
            own = "--ref.num_gpus_per_node" if dotted else "--ref_num_gpus_per_node"
            why = ("no reference model is loaded" if kl <= 0 else
                   f"the reference model runs on GPUs of its own ({own}): not the actor's")
            d.setting(f, self.line(kk) if kk else None, kk or FLAGS["init_kl_coef"][dotted], kl,
                      sets=f"reference=none ({why})", reference="none")
        for name in ("ref_offload", "ref_reward_offload"):
            ko, off = self.get(name)
            if ko and d.fields["reference"] == "copy":
                d.unmodelled_at(f, self.line(ko), ko, off,
                                "the reference's (and reward model's) ZeRO-3 partitions on the host "
                                "(get_ds_eval_config offload_param, stage 3 only); the estimate keeps the "
                                "reference's on the GPU, so the real GPU figure is lower")
            elif ko:
                d.setting(f, self.line(ko), ko, off, sets="the reference (and reward model) offloaded: not on "
                                                          "the actor's GPUs")
        kv, engines = self.get("vllm_num_engines")
        try:
            engines = int(engines) if kv and str(engines) != "None" else 0
        except ValueError:
            raise ConfigError(f, f"{kv} must be an integer, got {engines!r}") from None
        if engines <= 0:
            raise ConfigError(f, f"{FLAGS['vllm_num_engines'][dotted]} is "
                                 f"{'not given' if kv is None else engines}: train_ppo_ray generates with vLLM "
                                 f"engines alone (ppo_utils SamplesGenerator has no other way, v0.8.5 to 3c3be623); "
                                 f"give the number of engines")
        if k_all and not asynch:
            d.setting(f, self.line(k_all), k_all, True, generation="vllm-colocate",
                      sets="generation=vllm-colocate: every vLLM engine shares the actor's GPUs (one worker per GPU: "
                           "num_engines x tensor_parallel_size = the actor's GPUs)")
        else:
            d.setting(f, self.line(kv), kv, engines, generation="vllm-server",
                      sets="generation=vllm-server: the vLLM engines run on GPUs of their own" +
                           (" (--async_train colocates the DeepSpeed models only)" if k_all else ""))
        self.scoring()
        self.colocation(k_all, vllm_colocated=bool(k_all and not asynch), has_critic=est == "gae")

    def scoring(self):
        """make_experience's no-grad forwards (experience_maker.py @3c3be623): --rollout.micro_batch_size sequences
        at a time (v0.8.5 --micro_rollout_batch_size, default 8; 3c3be623 default 1), or with dynamic batching bins of
        --rollout.max_tokens_per_gpu tokens (default the training's) packed into one row."""
        d, f = self.d, self.path
        dotted = self.style == "dotted"
        if "--train.dynamic_batch_enable" in self.flags and self.flags.get("--ds.packing_samples"):
            k, tokens = self.get("rollout_max_tokens")
            if k is None or str(tokens) == "None":
                kt = "--train.max_tokens_per_gpu"
                tokens, k = self.flags.get(kt, MAX_TOKENS_PER_GPU), None
            tokens = positive_int(f, k or "--rollout.max_tokens_per_gpu", tokens)
            n = max(1, -(-tokens // d.fields.get("seq", tokens)))
            why = (f"score_batch={n} (scoring bins of {tokens} tokens, packed: counted as {n} sequence(s) of seq "
                   f"tokens)")
            (d.setting(f, self.line(k), k, tokens, sets=why, score_batch=n) if k else
             d.default(self.tool, "--rollout.max_tokens_per_gpu", None, self.source + " (None: the training's "
                       "--train.max_tokens_per_gpu)", sets=why, score_batch=n))
            km, micro = self.get("rollout_micro_batch")
            if km:
                d.setting(f, self.line(km), km, micro, sets="not used: dynamic batching scores token bins")
            return
        k, n = self.get("rollout_micro_batch")
        style = "dotted" if dotted else "classic"
        n = positive_int(f, k or FLAGS["rollout_micro_batch"][dotted], n if k else ROLLOUT_MICRO[style])
        why = f"score_batch={n} (make_experience's no-grad forwards: the logits of {n} sequences and their fp32 copy)"
        (d.setting(f, self.line(k), k, n, sets=why, score_batch=n) if k else
         d.default(self.tool, FLAGS["rollout_micro_batch"][dotted], ROLLOUT_MICRO[style], self.source, sets=why,
                   score_batch=n))

    def colocation(self, k_all: str | None, vllm_colocated: bool, has_critic: bool):
        """train_ppo_ray's placement flags (@3c3be623 lines 207-251; v0.8.5's spellings): what shares the actor's GPUs
        (`k_all`: the colocate-all flag as written, or None). vLLM's share (colocated) and the reference
        (`reinforcement`) are in the estimate; the critic (`has_critic`: gae), the reward model and each colocated
        process's CUDA context are listed with what they add."""
        d, f = self.d, self.path

        def flag(*names):
            return next(((n, self.flags[n]) for n in names if n in self.flags), (None, None))

        k_sleep, _ = flag("--vllm.enable_sleep", "--vllm_enable_sleep")
        k_ds_sleep, _ = flag("--ds.enable_sleep", "--deepspeed_enable_sleep")
        k_util, util = flag("--vllm.gpu_memory_utilization", "--vllm_gpu_memory_utilization")
        try:
            share = float(util) if k_util else 0.95
        except (TypeError, ValueError):
            raise ConfigError(f, f"{k_util} must be a number between 0 and 1, got {util!r}") from None
        if not 0 < share <= 1:
            raise ConfigError(f, f"{k_util} must be a number between 0 and 1, got {util!r}")
        util_name = "--vllm.gpu_memory_utilization" if self.style == "dotted" else "--vllm_gpu_memory_utilization"
        if k_util:
            self.used.add(k_util)
        if vllm_colocated:
            why = (f"vllm_share={share:g} (each GPU's vLLM worker takes {share:g} of its total memory: "
                   f"vllm_engine.py create_vllm_engines, vLLM's requested_memory)")
            (d.setting(f, self.line(k_util), k_util, share, sets=why, vllm_share=share) if k_util else
             d.default(self.tool, util_name, 0.95, self.source, sets=why, vllm_share=share))
            kt, tp = self.get("vllm_tp")
            if kt:
                tp = positive_int(f, kt, tp)
                d.setting(f, self.line(kt), kt, tp, vllm_tp=tp,
                          sets=f"vllm_tp={tp} (each worker holds 1/{tp} of the weights)")
            if k_sleep:
                self.used.add(k_sleep)
                d.setting(f, self.line(k_sleep), k_sleep, True, vllm_sleep=True,
                          sets="vllm_sleep=True (the engines sleep at level 1 while the actor trains, their weights "
                               "on the host: vllm_engine.py, samples_generator.py)")
        else:
            kt, _ = self.get("vllm_tp")
            for k in (k_util, k_sleep, kt):
                if k:
                    self.used.add(k)
                    d.setting(f, self.line(k), k, self.flags[k],
                              sets="vLLM on GPUs of its own: not the actor's" + (
                                  " (train_ppo_ray turns enable_sleep off without colocate_all)" if k == k_sleep
                                  else ""))
        if k_all:
            self.used.add(k_all)
            for k in [k for k in self.flags if k.startswith(("--critic.", "--ref.", "--reward.", "--vllm."))
                      and k not in self.used and k.endswith(PLACEMENT)]:
                self.used.add(k)
                d.setting(f, self.line(k), k, self.flags[k], sets="placement of a model sharing the actor's GPUs "
                                                                  "(--train.colocate_all)")
        kc, critic = self.get("critic_pretrain")
        kr, rm = self.get("reward_pretrain")
        if not critic:      # train_ppo_ray.py @3c3be623 lines 600-606: the reward model's, or with a remote reward
            remote = any(k in self.flags for k in ("--reward.remote_url", "--remote_rm_url"))   # the actor's
            critic = (self.d.fields.get("model") or self.d.fields.get("named") or "the actor's model") if remote \
                else rm
        if has_critic and k_all:
            d.unmodelled_at(f, self.line(k_all), "critic model (gae)", critic or "(none named)",
                            "the critic shares the actor's GPUs: " + (
                                "with --ds.enable_sleep its optimizer states and master weights are offloaded "
                                "while the actor trains (ppo_train: reload, fit, offload, the critic first), but its "
                                "16-bit parameters stay (offload_deepspeed_states keeps lp_params): the real figure "
                                "is higher by them, not counted" if k_ds_sleep else
                                "without --ds.enable_sleep the critic and the actor train at the same time on the "
                                "same GPUs (ppo_train starts both fits), so the real figure is higher by the critic's "
                                "whole training step, which is not modelled: this estimate is too low"))
        elif has_critic:
            own = "--critic.num_gpus_per_node" if self.style == "dotted" else "--critic_num_gpus_per_node"
            d.setting(f, self.line(kc) if kc else None, kc or "critic model (gae)", critic or "(none named)",
                      sets=f"on GPUs of its own ({own}): not the actor's; those GPUs are not estimated here")
            for k in [k for k in self.flags if k in ("--colocate_critic_reward", "--train.colocate_critic_reward")
                      or k.startswith(("--critic_num_", "--critic.num_", "--reward_num_", "--reward.num_"))]:
                self.used.add(k)
                d.setting(f, self.line(k), k, self.flags[k],
                          sets="the critic's and reward model's GPUs (not the actor's): not estimated here")
        if kr and k_all:
            d.unmodelled_at(f, self.line(kr), kr, rm,
                            "the reward model shares the actor's GPUs: its weights (bf16; ZeRO-3-partitioned with "
                            "stage 3) stay there while the actor trains, so the real figure is higher by them")
        elif kr:
            d.setting(f, self.line(kr), kr, rm, sets="on GPUs of its own: not the actor's")
        others = [w for w, on in (("the reference's", self.d.fields.get("reference") == "copy"),
                                  ("the reward model's", bool(kr and k_all)), ("the critic's", has_critic and k_all),
                                  ("each vLLM worker's", vllm_colocated)) if on]
        if others:
            d.unmodelled_at(f, None, "processes sharing each GPU", ", ".join(others),
                            "each Ray actor sharing the GPU is a process with its own CUDA context (and caching "
                            "allocator): the real figure is higher by one context for each")
        if k_ds_sleep:
            self.used.add(k_ds_sleep)
            d.setting(f, self.line(k_ds_sleep), k_ds_sleep, True, engine_sleep=True,
                      sets="engine_sleep=True (ppo_train: reload_states, fit, offload_states: between steps the "
                           "actor's optimizer states and fp32 master weights wait on the host; no effect with "
                           "--adam_offload)")
        k, v = flag("--actor.freeze_visual_encoder")
        if k:
            self.used.add(k)
            d.unmodelled_at(f, self.line(k), k, v, "a vision-language actor with its vision encoder frozen: the "
                                                   "vision tower is not counted, so the real figure is higher by "
                                                   "its weights")

    def dynamic_batch(self, tp: int, ring: int):
        """--train.dynamic_batch_enable (train_ppo_ray.py @3c3be623): the actor's micro batches are bins of samples of
        at most --train.max_tokens_per_gpu x ring x TP tokens (first fit, utils/seqlen_balancing.py
        get_minimum_num_micro_batch_size; a longer sample gets a bin of its own), then balanced by
        get_seqlen_balanced_partitions. With --ds.packing_samples a bin is one packed row: batch 1 of that many
        tokens, or of --data.max_len where one sample is longer."""
        d, f = self.d, self.path
        k = "--train.dynamic_batch_enable"
        self.used.add(k)
        kt = "--train.max_tokens_per_gpu"
        tokens = positive_int(f, kt, self.flags[kt] if kt in self.flags else MAX_TOKENS_PER_GPU)
        if kt in self.flags:
            self.used.add(kt)
        if not self.flags.get("--ds.packing_samples"):
            d.unmodelled_at(f, self.line(k), k, True, "dynamic batching without --ds.packing_samples pads each bin "
                                                     "to its longest sample: not modelled, estimated with the micro "
                                                     "batch as given")
            return
        seq = max(tokens * ring * tp, d.fields.get("seq", 0))
        d.setting(f, self.line(k), k, True, batch=1, seq=seq,
                  sets=f"batch=1, seq={seq} (one packed bin of at most {kt} {tokens} x ring {ring} x TP {tp} tokens, "
                       f"or one --data.max_len sample: seqlen_balancing.py)")
        (d.setting(f, self.line(kt), kt, tokens, sets="the bin size above") if kt in self.flags else
         d.default(self.tool, kt, MAX_TOKENS_PER_GPU, self.source, sets="the bin size above"))
        d.unmodelled_at(f, self.line(k), k, True, "the balanced partition (get_seqlen_balanced_partitions) may put a "
                                                 "few more tokens than the first-fit bin in one micro batch: the real "
                                                 "peak can be slightly higher")

    def precision(self):
        d, f = self.d, self.path
        kb, bf16 = self.get("bf16")
        kp, dtype = self.get("param_dtype")
        if kp:
            if dtype not in ("bf16", "fp16"):
                raise ConfigError(f, f"{kp} must be bf16 or fp16, got {dtype!r}")
            if dtype == "fp16":
                d.unmodelled_at(f, self.line(kp), kp, dtype, "fp16 training (loss scaling, fp16 copies) is not "
                                                            "modelled: estimated as bf16-mixed, the same sizes")
            d.setting(f, self.line(kp), kp, dtype, precision="bf16-mixed")
        elif kb:
            d.setting(f, self.line(kb), kb, True, precision="bf16-mixed")
        elif self.tool == CLASSIC:
            d.default(self.tool, "--bf16", False, self.source + " (store_true; DeepSpeed bf16.enabled false: fp32)",
                      precision="fp32")
        else:
            d.default(self.tool, FLAGS["param_dtype"][self.style == "dotted"], "bf16", self.source,
                      precision="bf16-mixed")

    def attention(self):
        d, f = self.d, self.path
        kf, flash = self.get("flash_attn")
        ka, impl = self.get("attn_implementation")
        if ka:
            if impl not in ATTENTION and not str(impl).startswith("kernels-community/"):
                raise ConfigError(f, f"{ka} must be one of {', '.join(ATTENTION)} (or a kernels-community/ hub "
                                     f"kernel), got {impl!r}")
            d.setting(f, self.line(ka), ka, impl, attention=ATTENTION.get(impl, "flash"))
        elif kf:
            d.setting(f, self.line(kf), kf, True, attention="flash")
        elif self.tool == CLASSIC and self.get("packing_samples")[0]:
            d.default(self.tool, "--flash_attn", True, "openrlhf/cli/train_*.py (8ff73978, the classic flags' "
                      "releases): --packing_samples without --flash_attn sets args.flash_attn = True",
                      attention="flash")
        elif self.tool == CLASSIC:
            d.default(self.tool, "--flash_attn", False, self.source + " (openrlhf/models/actor.py: eager unless "
                      "--flash_attn)", attention="eager")
        else:
            d.default(self.tool, FLAGS["attn_implementation"][self.style == "dotted"], "flash_attention_2",
                      self.source, attention="flash")

    def switches(self):
        d, f = self.d, self.path
        k, on = self.get("gradient_checkpointing")
        (d.setting(f, self.line(k), k, True, checkpointing="full") if k else
         d.default(self.tool, FLAGS["gradient_checkpointing"][self.style == "dotted"], False, self.source,
                   checkpointing="none"))
        k, on = self.get("adam_offload")
        if k:
            d.setting(f, self.line(k), k, True, offload_optimizer=True)
            d.default("OpenRLHF get_train_ds_config", "zero_optimization.offload_optimizer.pin_memory", True,
                      f"{DS_UTILS}: written as true in code, no flag changes it", pin_memory=True)
        k, on = self.get("overlap_comm")
        if k:
            d.setting(f, self.line(k), k, True, overlap_comm=True)
        else:
            d.default("OpenRLHF get_train_ds_config", "zero_optimization.overlap_comm", "not written",
                      f"{DS_UTILS}: overlap_comm only with the flag; DeepSpeed's default then applies (on for "
                      f"ZeRO-3)", overlap_comm=None)
        k, on = self.get("load_checkpoint")
        if k:
            d.setting(f, self.line(k), k, True, resume=True,
                      sets="resume=True (the checkpoint in ckpt_path is loaded when one exists)")
        k, on = self.get("packing_samples")
        if k:
            d.setting(f, self.line(k), k, True, sets="modelled as batch x seq tokens: a packed row holds at most "
                                                     "micro batch x max_len tokens")

    def lora(self):
        d, f = self.d, self.path
        k, rank = self.get("lora_rank")
        rank = int(rank) if k and (str(rank).lstrip("-").isascii() and str(rank).lstrip("-").isdigit()) else (rank if k else 0)
        if k and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ConfigError(f, f"{k} must be 0 (full fine-tuning) or a positive integer, got {self.flags[k]!r}")
        if k:
            d.setting(f, self.line(k), k, rank, lora_rank=rank or None)
        kt, targets = self.get("target_modules")
        if kt and rank:
            targets = targets if isinstance(targets, list) else [targets]
            joined = "all-linear" if targets == ["all-linear"] else peft_names(f, kt, ",".join(targets))
            d.setting(f, self.line(kt), kt, targets, lora_targets=joined)
        elif kt:
            d.ignored_at(f, self.line(kt), kt, targets)
        elif rank:
            d.default(self.tool, FLAGS["target_modules"][self.style == "dotted"], "all-linear", self.source,
                      lora_targets="all-linear")
        kd, dropout = self.get("lora_dropout")             # argparse default 0 (cli/train_*.py)
        if kd and rank:
            d.setting(f, self.line(kd), kd, dropout, lora_dropout=probability(f, kd, dropout))
        elif kd:
            d.ignored_at(f, self.line(kd), kd, dropout)
        k, on = self.get("load_in_4bit")
        if k and rank:   # (under ZeRO-3 the generic rule lists it as not modelled: base.only_where_modelled)
            d.setting(f, self.line(k), k, True, "base_weights=nf4-dq (openrlhf/models/actor.py: BitsAndBytesConfig "
                      "nf4 with double quantisation, compute dtype bf16)", base_weights="nf4-dq")
        elif k:
            d.unmodelled_at(f, self.line(k), k, True, "a bitsandbytes 4-bit base without LoRA adapters is not "
                            "modelled (4-bit weights take no gradient): estimated with a bf16 base")

    def others(self):
        d, f = self.d, self.path
        for name, why in (("zpg", "ZeRO++ hierarchical partitioning (a secondary copy of the parameters per node "
                                  "group) is not modelled"),
                          ("grad_accum_dtype", "a separate gradient-accumulation dtype buffer is not modelled"),
                          ("deepcompile", "DeepSpeed's deepcompile is not modelled"),
                          ("use_liger_kernel", "Liger's RMSNorm/SwiGLU/RoPE kernels are not modelled; its fused "
                                               "linear cross-entropy never runs in OpenRLHF (the Actor computes "
                                               "log-probs from the full logits)")):
            k, v = self.get(name)
            if k is None or (name == "zpg" and str(v) == "1"):
                if k:
                    d.setting(f, self.line(k), k, v, sets="off (as modelled)")
                continue
            d.unmodelled_at(f, self.line(k), k, v, why)
        if self.module == "train_rm":
            d.setting(f, None, "openrlhf.cli.train_rm", self.module,
                      "run=rm (openrlhf/models/model.py get_llm_for_sequence_regression @3c3be623: the base model "
                      "without its LM head and a value head of one output; trainer/rm_trainer.py concatenated_forward: "
                      "chosen and rejected in one forward)", run="rm")
        if self.module == "train_dpo":
            k, ref = self.get("ref_pretrain")
            ko, off = self.get("ref_offload")
            named = ref if k else "the --pretrain model (ref_pretrain defaults to it)"
            d.setting(f, self.line(k) if k else None, k or FLAGS["ref_pretrain"][self.style == "dotted"], named,
                      "run=dpo, reference=copy (cli/train_dpo.py loads a reference Actor, LoRA or not; ZeRO-3 "
                      "partitioned when zero_stage is 3, else stage 0: whole on every GPU)", run="dpo",
                      reference="copy")
            if ko:
                d.unmodelled_at(f, self.line(ko), ko, off,
                                "--ref_offload puts the reference's ZeRO-3 partitions on the host (offload_param, "
                                "stage 3 only); the estimate keeps them on the GPU, so the real GPU figure is lower")
            d.unmodelled_at(f, None, "log_probs_from_logits", "(OpenRLHF's log-probabilities)",
                            "the Actor takes log-probabilities from fp32 logits with flash-attn's Triton "
                            "cross-entropy where it is installed, else a chunked logsumexp "
                            "(openrlhf/models/utils.py): counted as TRL's per-sequence logsumexp (dpo_logps "
                            "logsumexp), not measured for OpenRLHF")
        if self.module == "train_ppo_ray":
            self.reinforcement()


def read(path: Path, data, lines: dict, given: list[Path]) -> Imported:
    """The set-up of the openrlhf command in a .sh script or a text file."""
    if not isinstance(data, str):
        raise ConfigError(path, "not an OpenRLHF command line or shell script")
    return _Reader(path, data).read()


def read_command(text: str, path: str | Path = "<command>") -> Imported:
    """The set-up of a pasted OpenRLHF command (one string; line continuations allowed). `files` holds `path`."""
    if not isinstance(text, str) or not MODULE_RE.search(text):
        raise ConfigError(path, "no openrlhf.cli.train_* command in the text (expected e.g. `deepspeed --module "
                                "openrlhf.cli.train_sft --pretrain ...`)")
    return _Reader(Path(path), text).read()
