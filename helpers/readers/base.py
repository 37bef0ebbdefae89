"""What every reader of a training config returns, and what they share: loading a file with line numbers, finding a
file that another refers to, and one-line errors that name the file.

A reader turns a tool's own config (a DeepSpeed JSON, an axolotl YAML, ...) into the model, a `TrainSetup`, and for
every memory-relevant setting where it came from: a line of a file, or a documented default of the tool (with the
tool and version whose default it is). Nothing that changes memory is dropped silently: what the package cannot
model is listed in `not_modelled` with its value, and keys that do not matter for memory in `ignored`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.errors import InputError
from helpers.training import TrainSetup


class ConfigError(InputError):
    """A config file that cannot be read: the message is one line, `FILE: problem`."""

    def __init__(self, file: str | Path, problem: str):
        problem = " ".join(problem.splitlines())           # one line, whatever a library's message held
        if not str(file).isprintable():
            file = repr(str(file))                         # a name with a newline or a control character, quoted
        if len(problem) > MAX_PROBLEM:           # a value quoted whole (a deep nesting, a long list) is cut, said so
            problem = f"{problem[:MAX_PROBLEM - 60]}... ({len(problem):,} characters in all)"
        super().__init__(f"{file}: {problem}")
        self.file, self.problem = str(file), problem


MAX_PROBLEM = 500


@dataclass(frozen=True)
class Setting:
    """One value read from a file, and the TrainSetup field (or 'model') it sets."""

    file: str
    line: int | None
    key: str
    """The key as the tool spells it, dotted for nested keys (zero_optimization.stage)."""
    value: Any
    sets: str
    """What it sets, as text for a reader: a TrainSetup field with its value (`batch=4`), `model=...`, or several,
    comma-separated, with why where it is not plain."""
    fields: dict = field(default_factory=dict, compare=False)
    """The TrainSetup fields it sets, with their values (what code reads: never `sets`)."""


@dataclass(frozen=True)
class Default:
    """A setting the files leave out, and the tool's documented default that applies."""

    tool: str
    """The tool and version whose default it is (e.g. 'LLaMA-Factory 0.9.3')."""
    key: str
    value: Any
    sets: str
    source: str = ""
    """Where that default is written (docs URL or source file)."""
    fields: dict = field(default_factory=dict, compare=False)
    """The TrainSetup fields it sets, with their values."""


@dataclass(frozen=True)
class NotModelled:
    """A setting that changes memory but that the package does not model: listed with its value, never dropped."""

    file: str
    line: int | None
    key: str
    value: Any
    why: str


@dataclass(frozen=True)
class Ignored:
    """A key that does not matter for memory (learning rate, logging, ...)."""

    file: str
    line: int | None
    key: str
    value: Any


@dataclass
class Imported:
    """What a reader returns: the model (catalogue name, config path, or None when the files name none the catalogue
    knows), the set-up, and where each of its values came from."""

    format: str
    """Which reader read it ('deepspeed', 'axolotl', 'llamafactory', 'torchtitan', 'torchtune', 'litgpt', 'openrlhf',
    'trl', 'accelerate')."""
    model: str | None
    setup: TrainSetup
    files: list[str]
    settings: list[Setting] = field(default_factory=list)
    defaults: list[Default] = field(default_factory=list)
    not_modelled: list[NotModelled] = field(default_factory=list)
    ignored: list[Ignored] = field(default_factory=list)
    model_named: str | None = None
    """The model as the files name it (a hub id or path), also when the catalogue does not know it."""
    more_gpus: str = "ddp"
    """The strategy the tool runs on N > 1 GPUs when the files leave the world size to the launcher (`--gpus N`):
    the Trainer's DDP, torchtune's distributed recipes' FSDP2."""
    per_world: dict | None = None
    """A size the files give for the whole world, split here over the default world of 1 (DeepSpeed's
    train_batch_size): {'field': 'batch' or 'grad_accum', 'total', 'by'}, so that `--gpus N` splits it again:
    field = total // (by x N)."""

    def to_json(self) -> dict:
        """The `imported` object of the CLI's JSON: files, settings, defaults, not_modelled, ignored."""
        plain = lambda xs: [dataclasses.asdict(x) for x in xs]
        return {"format": self.format, "model_named": self.model_named, "files": list(self.files),
                "settings": plain(self.settings), "defaults": plain(self.defaults),
                "not_modelled": plain(self.not_modelled), "ignored": plain(self.ignored)}


# --- loading, with the line of each key ---------------------------------------------------------------------------

def load_yaml(path: Path) -> tuple[Any, dict[str, int]]:
    """The parsed YAML and the 1-based line of each dotted key; ConfigError (one line) if it is not valid YAML."""
    import yaml

    text = _text(path)
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(path, f"not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(path, "nested too deeply to be a training config") from None
    except InputError:
        raise
    except ValueError:                           # Python's limit on the digits of an int it converts from text
        raise _too_long_number(path) from None
    seen: dict = {}
    try:
        values = _expanded_size(node, seen, set())
    except _Cycle as c:
        raise ConfigError(path, f"the value at line {c.line} contains itself through an alias (an &anchor used "
                                f"inside its own value): no tool can read an endless value") from None
    if values > MAX_VALUES:
        aliased = values > len(seen)                 # (seen: the distinct nodes; an alias adds a node met again)
        raise ConfigError(path, (f"its aliases expand to {values:,} values" if aliased else f"it holds {values:,} "
                                 f"values") + f", more than any training config has (at most {MAX_VALUES:,} are read)"
                                + (": a YAML alias bomb?" if aliased else ""))
    lines: dict[str, int] = {}
    _node_lines(path, node, "", lines)
    return data, lines


MAX_VALUES = 100_000


def _too_long_number(path) -> ConfigError:
    return ConfigError(path, f"a number too long to be a setting (more than the {sys.get_int_max_str_digits()} digits "
                             f"Python converts: ValueError)")


class _Cycle(Exception):
    def __init__(self, node):
        self.line = node.start_mark.line + 1


def _expanded_size(node, seen: dict, open_: set) -> int:
    """Values the composed YAML holds once every alias is expanded (an alias is the very node it names, so a node
    met again is counted again, from `seen`, without walking it twice); _Cycle where a node contains itself."""
    import yaml

    if node is None:
        return 0
    key = id(node)
    if key in open_:
        raise _Cycle(node)
    if key in seen:
        return seen[key]
    open_.add(key)
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_size(k, seen, open_) + _expanded_size(v, seen, open_) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_size(v, seen, open_) for v in node.value)
    else:
        total = 1
    open_.discard(key)
    seen[key] = min(total, 1 << 62)
    return seen[key]


def _node_lines(path: Path, node, prefix: str, lines: dict[str, int]) -> None:
    """Each dotted key's line; ConfigError on a key given twice in one mapping. PyYAML (TRL, accelerate) silently
    keeps the last, OmegaConf (LLaMA-Factory's `read_args`) and DeepSpeed (`dict_raise_error_on_duplicate_keys`,
    runtime/config_utils.py) refuse it: a value given twice is refused here rather than guessed."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if not (isinstance(key, yaml.ScalarNode) and key.tag in ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")):
                where = f" under {prefix}" if prefix else ""
                raise ConfigError(path, f"key {getattr(key, 'value', key)!r}{where} at line {line} is not a name (a "
                                        f"number, a boolean, a list or a null): option names are text")
            if isinstance(key, yaml.ScalarNode) and key.value != "<<":
                if key.value in seen:
                    raise ConfigError(path, f"key {prefix + '.' if prefix else ''}{key.value} is given twice (lines "
                                            f"{seen[key.value]} and {line}): keep one")
                seen[key.value] = line
            name = f"{prefix}.{key.value}" if prefix else str(key.value)
            lines.setdefault(name, line)
            _node_lines(path, value, name, lines)


def load_json(path: Path) -> tuple[Any, dict[str, int]]:
    """The parsed JSON and the 1-based line of each dotted key; ConfigError if it is not valid JSON."""
    text = _text(path)
    if text.startswith("\ufeff"):
        raise ConfigError(path, "starts with a UTF-8 byte-order mark, which json.load refuses (transformers' and "
                                "accelerate's HfDeepSpeedConfig load the file with it): save it without the BOM")
    try:
        data = json.loads(text, object_pairs_hook=lambda pairs: _unique(path, pairs))
    except json.JSONDecodeError as e:
        raise ConfigError(path, f"not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ConfigError(path, "nested too deeply to be a training config") from None
    except InputError:
        raise
    except ValueError:                           # Python's limit on the digits of an int it converts from text
        raise _too_long_number(path) from None
    try:                                     # JSON is YAML for all our purposes: its composer gives the lines
        _, lines = load_yaml(path)
    except ConfigError:
        lines = {}
    return data, lines


def _unique(path: Path, pairs: list) -> dict:
    """A JSON object with no key given twice: DeepSpeed refuses duplicates (runtime/config.py loads with
    `dict_raise_error_on_duplicate_keys`, DeepSpeed 0.19.8), json.load keeps the last; refused here."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(path, f"key {key!r} is given twice in one object (DeepSpeed refuses duplicate keys): "
                                    f"keep one")
        out[key] = value
    return out


def load_toml(path: Path) -> tuple[dict, dict[str, int]]:
    """The parsed TOML and the 1-based line of each dotted key (tables and `key =` lines); ConfigError if invalid."""
    text = _text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, f"not valid TOML: {e}") from None
    except RecursionError:                       # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(path, "nested too deeply to be a training config") from None
    lines: dict[str, int] = {}
    table = ""
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if m := re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?", line):
            table = m.group(1).replace('"', "")
            lines.setdefault(table, n)
        elif m := re.match(r"([A-Za-z0-9_\-.\"]+)\s*=", line):
            key = m.group(1).replace('"', "")
            lines.setdefault(f"{table}.{key}" if table else key, n)
    return data, lines


MAX_BYTES = 1 << 20
"""The largest config file read (1 MiB): real training configs are a few KiB; a bigger file is refused unread
rather than parsed for minutes (PyYAML's pure-Python parser)."""


def file_problem(path: Path) -> str | None:
    """Why `path` is not a regular file that can be read (one phrase), or None: stat's own reasons named (a loop of
    symbolic links, a name too long), never a traceback."""
    import errno
    import stat

    try:
        st = Path(path).stat()
    except OSError as e:
        return {errno.ENOENT: "no such file", errno.ENOTDIR: "no such file (a part of its path is not a folder)",
                errno.ELOOP: "a loop of symbolic links, not a file",
                errno.ENAMETOOLONG: "file name too long (the system allows 255 bytes per name)"}.get(
            e.errno, f"cannot be read: {e.strerror or e}")
    except ValueError as e:                                   # e.g. a NUL character in the name
        return f"not a usable file name ({e})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a config file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    return None


def _text(path: Path) -> str:
    path = Path(path)
    problem = file_problem(path)
    if problem:
        raise ConfigError(path, problem)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ConfigError(path, f"{size / 2**20:,.1f} MiB is too large for a training config (at most "
                                f"{MAX_BYTES // 2**20} MiB is read)")
    try:
        text = path.read_bytes().decode("utf-8")    # (line endings as written: bash reads a CR as text)
    except UnicodeDecodeError as e:
        raise ConfigError(path, f"not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(path, f"cannot be read: {e.strerror or e}") from None
    if "\x00" in text:
        raise ConfigError(path, f"not a text file (a NUL byte at character {text.index(chr(0))})")
    return text


def companion(ref: str, referring: Path, given: list[Path], what: str = "file") -> Path:
    """The file that `referring` names as `ref` (e.g. an axolotl `deepspeed:` path, usually relative to the tool's own
    repository): relative to the referring file, then among the other files given, by name; ConfigError if neither."""
    if not ref.strip():
        raise ConfigError(referring, f"its {what} is an empty path")
    candidate = (Path(referring).parent / ref)
    for place in {candidate, Path(ref)} if Path(ref).is_absolute() else {candidate}:
        problem = file_problem(place)
        if problem and not problem.startswith("no such file"):
            raise ConfigError(referring, f"its {what} {ref!r}: {problem.removeprefix('is ')}")
    if candidate.is_file() and candidate.resolve() == Path(referring).resolve():
        raise ConfigError(referring, f"its {what} {ref!r} is this file itself")
    if candidate.is_file():
        return candidate
    if Path(ref).is_absolute() and Path(ref).is_file():
        return Path(ref)
    for g in given:
        if Path(g).name == Path(ref).name and Path(g).resolve() != Path(referring).resolve():
            return Path(g)
    if not Path(ref).is_absolute() and len(Path(ref).parts) > 1:
        # A path with folders is usually relative to where the tool runs: the working directory, or the root of the
        # tool's repository the file sits in (LLaMA-Factory's examples name examples/deepspeed/ds_z3_config.json).
        for root in [Path.cwd(), *Path(referring).resolve().parents]:
            if (root / ref).is_file() and (root / ref).resolve() != Path(referring).resolve():
                return root / ref
    raise ConfigError(referring, f"its {what} {ref!r} was found neither beside it ({candidate}) nor among the files "
                                 f"given (pass it too: --from {Path(ref).name})")


STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT")


def fsdp_sharded_save(path, key: str, value) -> bool:
    """FSDP's state_dict_type as accelerate's plugin takes it (a name, any case): False for FULL_STATE_DICT (the
    Trainer's default: the whole model gathered on rank 0 at a save), True for the sharded kinds; one line otherwise."""
    if not isinstance(value, str) or value.upper() not in STATE_DICT_TYPES:
        raise ConfigError(path, f"{key} must be {', '.join(STATE_DICT_TYPES[:-1])} or {STATE_DICT_TYPES[-1]}, "
                                f"got {value!r}")
    return value.upper() != "FULL_STATE_DICT"


def get(data: dict, dotted: str, default=None):
    """data['a']['b'] for 'a.b' (None-safe)."""
    cur = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


_ABSENT = object()


def lookup(data: dict, dotted: str, default) -> tuple[bool, Any]:
    """(present, value): the file's value of a dotted key (None included, as written), or (False, default)."""
    v = get(data, dotted, _ABSENT)
    return (False, default) if v is _ABSENT else (True, v)


def leaves(data: dict, prefix: str = "", opaque: tuple[str, ...] = ()):
    """(dotted key, value) of every leaf of a nested mapping; a key in `opaque` is one leaf, its mapping whole."""
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value and name not in opaque:
            yield from leaves(value, name, opaque)
        else:
            yield name, value


def probability(file, key: str, value) -> float:
    """A dropout probability in [0, 1) as a tool reads it (a number, or its text from a command line); one-line
    ConfigError naming the file and key otherwise."""
    try:
        p = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    except ValueError:
        p = None
    if p is None or not 0 <= p < 1:
        raise ConfigError(file, f"{key} must be a probability in [0, 1), got {value!r}")
    return p


# Settings the package models with some strategies only: (TrainSetup field, its off value, the registry's test).
WITH_SOME_STRATEGIES = (
    ("tensor_parallel", 1, "model_parallel", "torch's DTensor plan"),
    ("context_parallel", 1, "model_parallel", "torch's context parallel"),
    ("base_weights", None, "qlora", "a bitsandbytes 4-bit base"),
)


def only_where_modelled(fields: dict, settings: list[Setting], defaults: list | None = None) -> list[NotModelled]:
    """A setting read from a file that the package models only with some strategies (tensor/context parallel with
    ddp and fsdp2; a 4-bit base with single, ddp, zero1 and zero2), under a strategy without it (OpenRLHF's ring attention or a
    QLoRA run over ZeRO): the field is reset to off, its Setting removed from `settings` (and the tool defaults that
    set it from `defaults`), and the NotModelled entries returned — the estimate runs without it, and says so, instead of refusing the whole file."""
    from helpers import strategies

    strategy = fields.get("strategy", "single")
    if strategy not in strategies.NAMES:
        return []
    st = strategies.get(strategy)
    out = []
    for name, off, test, what in WITH_SOME_STRATEGIES:
        if fields.get(name, off) == off or getattr(st, test, False):
            continue
        fields[name] = off
        for d in [d for d in defaults or [] if name in d.fields]:
            defaults.remove(d)                     # (a tool default that only refines the setting: gone with it)
        for s in [s for s in settings if name in s.fields]:
            settings.remove(s)
            out.append(NotModelled(s.file, s.line, s.key, s.value,
                                   f"{what} under {strategy} is not modelled (it is with "
                                   f"{strategies.listing(lambda x: getattr(x, test, False), 'and')}): estimated "
                                   f"without it ({name}={off!r})"))
    return out


def fp16_where_modelled(fields: dict, settings: list[Setting]) -> list[NotModelled]:
    """fp16 mixed precision read from a file (precision 'fp16-mixed': torch autocast with GradScaler) under a
    strategy that trains it its own way (DeepSpeed's fp16 optimizer with its loss scaler, FSDP with
    ShardedGradScaler) or with tensor/context parallelism: estimated as bf16-mixed, which keeps the same bytes per
    value, the Settings that set it moved to the NotModelled entries returned."""
    from helpers import strategies

    if fields.get("precision") != "fp16-mixed":
        return []
    strategy = fields.get("strategy", "single")
    st = strategies.get(strategy) if strategy in strategies.NAMES else None
    parallel = fields.get("tensor_parallel", 1) * fields.get("context_parallel", 1) > 1
    if st is None or ("fp16-mixed" in st.precisions and not parallel):
        return []
    fields["precision"] = "bf16-mixed"
    out = []
    for s in [s for s in settings if s.fields.get("precision") == "fp16-mixed"]:
        settings.remove(s)
        where = "with tensor or context parallelism" if parallel else f"under {strategy}"
        out.append(NotModelled(s.file, s.line, s.key, s.value,
                               f"fp16 mixed precision {where} (its own loss scaling and overflow checks) is not "
                               f"modelled: estimated as bf16-mixed, the same bytes per value"))
    return out


def fused_ce_where_modelled(fields: dict, settings: list[Setting], defaults: list | None = None) -> list[NotModelled]:
    """A fused/chunked linear cross-entropy (Liger, Cut Cross-Entropy) read from a file that also shards the model by
    tensor or context parallelism, which the package models only without it: estimated with the loss over the
    logits (loss parallel's sharded logits under TP), fused_ce's Settings and tool defaults moved to the NotModelled
    entries returned. The fused loss never materialises those logits, so the real figure is lower."""
    if not fields.get("fused_ce") or fields.get("tensor_parallel", 1) * fields.get("context_parallel", 1) == 1:
        return []
    fields["fused_ce"] = False
    out = []
    why = ("a fused linear cross-entropy with tensor or context parallelism is not modelled: estimated with the loss "
           "over the logits, which the fused loss never materialises, so the real figure is lower")
    for s in [s for s in settings if s.fields.get("fused_ce")]:
        settings.remove(s)
        out.append(NotModelled(s.file, s.line, s.key, s.value, why))
    for d in [d for d in defaults or [] if d.fields.get("fused_ce")]:
        defaults.remove(d)
        out.append(NotModelled(d.source, None, d.key, d.value, why))
    return out


SHORT_NAMES = ("q", "k", "v", "o", "up", "down")     # this package's --lora-targets shorthand (models.LORA_ALIASES)


def peft_names(path, key: str, joined: str) -> str:
    """A file's LoRA target names, which peft matches as written: a short name (q, v, ...) is this package's own
    --lora-targets shorthand, and peft finds no module called q in a decoder (it fails when no name matches); refused
    with the name peft needs. ('gate' is a real module name: an MoE's router.)"""
    short = [n for n in joined.split(",") if n.strip() in SHORT_NAMES]
    if short:
        raise ConfigError(path, f"{key} names {', '.join(map(repr, short))}: peft matches module names as written, and "
                                f"the projections are called q_proj, k_proj, v_proj, o_proj, up_proj, down_proj (q is "
                                f"only this package's --lora-targets shorthand); write {short[0]}_proj")
    return joined


def peft_regex(path, key: str, pattern: str, model: str | None, note: str = "") -> str:
    """A target_modules that reaches peft as one string (not "all-linear"): peft full-matches it, as a regular
    expression, against each module's whole name (peft tuners_utils.py check_target_module_exists:
    re.fullmatch(target_modules, key)), so 'q_proj' alone matches nothing and peft stops (NoMatchingPeftModuleError).
    The linear modules of `model` whose decoder-layer name (model.layers.0.self_attn.NAME, model.layers.0.mlp.NAME) the
    pattern matches, comma-joined (estimated in every layer: a pattern that picks some layers only is over-counted);
    ConfigError where it matches none."""
    from helpers import models

    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ConfigError(path, f"{key} {pattern!r} reaches peft as a regular expression, and it is not one ({e})"
                          ) from None
    spec = models.spec(model) if model else None
    if spec is None:
        raise ConfigError(path, f"{key} {pattern!r} reaches peft as a regular expression over module names; "
                                f"without a model the catalogue knows it is not read here: pass --model")
    paths = {t.name.rsplit(".", 1)[0] for t in spec.tensors if t.linear and t.group.startswith("layer.")}
    # the same modules under a multimodal model's prefixes (Gemma 3, Llava, Qwen-VL: the text model inside)
    paths |= {p.replace("model.", alt, 1) for p in set(paths) if p.startswith("model.")
              for alt in ("model.language_model.", "language_model.model.", "model.text_model.", "model.model.")}
    names = sorted({p.rsplit(".", 1)[-1] for p in paths if rx.fullmatch(p)})
    if not names:
        raise ConfigError(path, f"{key} is the one string {pattern!r}{note}: peft reads one string as a regular "
                                f"expression it full-matches against each module's whole name "
                                f"(model.layers.0.self_attn.q_proj), so it matches no module and peft stops "
                                f"(NoMatchingPeftModuleError); write a list of names, or a pattern such as "
                                f"'.*(q_proj|v_proj)'")
    return ",".join(names)


def did_you_mean(name, options, cutoff: float = 0.6, prefix: str = "") -> str:
    """'; did you mean PREFIX+OPTION?' for the option nearest `name` (difflib, at least `cutoff` alike), or ''."""
    import difflib

    near = difflib.get_close_matches(str(name), list(options), n=1, cutoff=cutoff)
    return f"; did you mean {prefix}{near[0]}?" if near else ""
