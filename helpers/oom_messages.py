"""What users paste when a run dies of memory, read: torch's CUDA out-of-memory message in every format it has printed
since 1.0, the traceback's frames (which tell the phase), DeepSpeed's `see_memory_usage` lines, nvidia-smi's table,
and the host's signs (the OOM killer's SIGKILL as bash, torchrun and the deepspeed launcher report it, MemoryError,
torch's CPU allocator failing).

`read(text)` returns a Pasted (what was found, with the line each came from); text with none of these is refused with
one line saying what was expected. Figures are kept as printed (`Printed`: bytes, and the half-step of the printed
precision: '224.00 MiB' is 224 MiB +- 0.005 MiB), so a comparison never claims more precision than the message has.

Sources (each pattern's text, read in the library at the release named):
- torch c10/cuda/CUDACachingAllocator.cpp, `malloc`'s OutOfMemoryError and `format_size` (two decimals; bytes up to
  1 KiB, KiB up to 1 MiB, MiB up to 1 GiB, then GiB: '1024.00 MiB' is printed, never '1.00 GiB' for 2^30 bytes);
  the formats by release are listed in FORMATS, each read in the PyPI wheels of torch 1.0.1 to 2.9.0. 'Tried to
  allocate' prints the segment the allocator asked CUDA for, get_allocation_size(round_size(request)): 2 MiB for
  any request up to 1 MiB, 20 MiB up to 10 MiB, else the request rounded up to 2 MiB. Free and total capacity are
  cudaMemGetInfo's; the process lines NVML's (nvmlDeviceGetComputeRunningProcesses: every compute process).
- torch c10/core/impl/alloc_cpu.cpp: "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes".
- DeepSpeed deepspeed/runtime/utils.py `see_memory_usage` (0.19.8): "MA x GB Max_MA x GB CA x GB Max_CA x GB", each
  a torch figure / (1024 * 1024 * 1024) rounded to 2 decimals (Max_CA to a whole number): its "GB" is GiB.
- torch torch/distributed/elastic (torchrun's failure summary "exitcode  : -9"), deepspeed/launcher/launch.py
  ("exits with return code = -9"), bash ("Killed"), the kernel's OOM killer ("Out of memory: Killed process").
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from helpers.errors import InputError
from helpers.units import UNITS

_UNITS = {k: v for k, v in UNITS.items() if k != "GB"}    # torch's binary units (its messages never print GB)
SIZE = r"\d+(?:\.\d+)?\s*(?:bytes|B|KiB|MiB|GiB|TiB|PiB)"

FORMATS = {
    "cached": "torch 1.0-1.3: '(GPU N; X total capacity; Y already allocated; Z free; W cached)', W the memory the "
              "allocator held but had not allocated (pytorch/pytorch#13751)",
    "reserved_in_total": "torch 1.4-2.0: '(GPU N; X total capacity; Y already allocated; Z free; W reserved in total "
                         "by PyTorch)' ('V allowed;' before the last from 1.8 when a memory fraction is set)",
    "parenthesised_cut": "torch 1.x's '(GPU N; X total capacity; Y already allocated; Z free; ...' cut before its "
                         "reserved figure: what it reserved is not read",
    "capacty": "torch 2.1: 'GPU N has a total capacty of X of which Y is free. Process N has Z memory in use. Of the "
               "allocated memory ...' (capacity misspelt)",
    "this_process": "torch 2.2 and later: 'GPU N has a total capacity of X of which Y is free. Including non-PyTorch "
                    "memory, this process has Z memory in use. Of the allocated memory ...' (other processes, if "
                    "any, listed by PID)",
    "process_listed": "torch 2.2 and later: 'GPU N has a total capacity of X of which Y is free. Process N has Z "
                      "memory in use. Of the allocated memory ...', this process too listed by PID (torch knows "
                      "itself by getpid(), which in a container is not the PID NVML reports)",
    "capacity": "torch 2.2 and later, without a process line (no NVML figures: ROCm, XPU, or NVML unavailable)",
    "snapshot": "a memory snapshot's 'oom' trace entry (torch.cuda.memory._dump_snapshot): exact bytes",
    "unreadable_rest": "the first sentence ('Tried to allocate X'); the figures after it are not as any torch "
                       "release prints them (edited, or a figure out of range), so they are not read",
    "requested_only": "the message cut short: its first sentence ('Tried to allocate X'), and the GPU's capacity "
                      "where it gets that far",
}


@dataclass(frozen=True)
class Printed:
    """A figure as a message printed it: its bytes, the half-step of its printed precision (the true value lies
    within +- `half_step`), and the text."""

    bytes: int
    half_step: int
    text: str

    def matches(self, nbytes: int) -> bool:
        return abs(nbytes - self.bytes) <= self.half_step

    def __str__(self) -> str:
        return self.text


def size(text: str) -> Printed:
    """'224.00 MiB' -> Printed(234881024, 5242, '224.00 MiB'): the unit's bytes times the number; the half-step of
    its last printed digit."""
    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*(bytes|B|KiB|MiB|GiB|TiB|PiB)\s*", text)
    if not m:
        raise InputError(f"a size must be a number and a unit (bytes, KiB, MiB, GiB), got {text!r}")
    unit = _UNITS[m.group(3)]
    decimals = len(m.group(2) or "")
    value = float(f"{m.group(1)}.{m.group(2) or 0}")
    return Printed(round(value * unit), round(unit * 0.5 * 10 ** -decimals) if decimals or unit > 1 else 0,
                   f"{m.group(1)}{'.' + m.group(2) if m.group(2) else ''} {m.group(3)}")


@dataclass
class CudaOOM:
    """One CUDA (or HIP) out-of-memory message: what it asked for and what the GPU held, as printed. None where the
    message's format does not print a figure."""

    format: str
    backend: str
    requested: Printed
    line: int
    device_index: int | None = None
    capacity: Printed | None = None
    free: Printed | None = None
    allowed: Printed | None = None
    allocated: Printed | None = None             # by PyTorch (torch.cuda.memory_allocated)
    reserved: Printed | None = None              # in total by PyTorch (1.x), else allocated + unallocated (2.x)
    unallocated: Printed | None = None           # reserved by PyTorch but unallocated (2.x; 1.0-1.3's 'cached')
    private_pools: Printed | None = None         # allocated in private pools (CUDA graphs), 2.x
    this_process: Printed | None = None          # including non-PyTorch memory (2.2+)
    processes: list[tuple[int, Printed]] = field(default_factory=list)    # 'Process N has X memory in use' (2.1+)
    processes_without_figure: int = 0            # listed with 0 bytes or 2^64 bytes: NVML had no figure for them
    this_process_without_figure: bool = False    # 'this process has 0 bytes' (or 2^64): NVML had no figure for it
    rank: int | None = None
    text: str = ""

    @property
    def reserved_bytes(self) -> int | None:
        if self.reserved is not None:
            return self.reserved.bytes
        if self.allocated is not None and self.unallocated is not None:
            return self.allocated.bytes + self.unallocated.bytes
        return None

    @property
    def cached_free_bytes(self) -> int | None:
        """Reserved by PyTorch but not allocated: cached blocks, none of which could hold the request."""
        if self.unallocated is not None:
            return self.unallocated.bytes
        if self.reserved is not None and self.allocated is not None:
            return self.reserved.bytes - self.allocated.bytes
        return None

    def to_json(self) -> dict:
        out = {"format": self.format, "format_meaning": FORMATS[self.format], "backend": self.backend,
               "line": self.line, "rank": self.rank, "device_index": self.device_index}
        for name in ("requested", "capacity", "free", "allowed", "allocated", "reserved", "unallocated",
                     "private_pools", "this_process"):
            v = getattr(self, name)
            out[name] = None if v is None else {"bytes": v.bytes, "plus_minus_bytes": v.half_step, "printed": v.text}
        out["processes"] = [{"pid": pid, "bytes": p.bytes, "printed": p.text} for pid, p in self.processes]
        out["processes_without_figure"] = self.processes_without_figure
        return out


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str = ""


@dataclass(frozen=True)
class MemoryLine:
    """DeepSpeed's see_memory_usage: MA (allocated), Max_MA, CA (reserved), Max_CA, in GiB as it prints them."""

    line: int
    label: str
    ma: Printed
    max_ma: Printed
    ca: Printed
    max_ca: Printed


@dataclass(frozen=True)
class HostSign:
    """A sign that the host ran out of memory (or a process was killed as if it had): what it says, and its line."""

    kind: str
    line: int
    text: str
    requested: Printed | None = None


@dataclass(frozen=True)
class SmiGPU:
    """One GPU row of nvidia-smi's table: used and total memory (MiB as it prints them)."""

    index: int
    name: str
    used: Printed
    total: Printed


@dataclass
class Pasted:
    """Everything read from a pasted text, each with its line number (1-based)."""

    ooms: list[CudaOOM] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    memory_lines: list[MemoryLine] = field(default_factory=list)
    host: list[HostSign] = field(default_factory=list)
    smi: list[SmiGPU] = field(default_factory=list)
    smi_processes: list[tuple[int, int, str, Printed]] = field(default_factory=list)   # gpu, pid, name, used
    other_errors: list[HostSign] = field(default_factory=list)      # CUDA errors outside the caching allocator
    training: tuple[int, str] | None = None     # (line, text): the log's last progress before the error is a step's

    @property
    def oom(self) -> CudaOOM | None:
        return self.ooms[0] if self.ooms else None

    def phase(self) -> tuple[str, Frame] | None:
        return phase_of(self.frames)

    def to_json(self) -> dict:
        ph = self.phase()
        return {"ooms": [o.to_json() for o in self.ooms],
                "frames": [f.__dict__ for f in self.frames],
                "phase": None if ph is None else {"phase": ph[0], "frame": ph[1].__dict__},
                "memory_lines": [{"line": m.line, "label": m.label, "MA": m.ma.bytes, "Max_MA": m.max_ma.bytes,
                                  "CA": m.ca.bytes, "Max_CA": m.max_ca.bytes} for m in self.memory_lines],
                "host": [{"kind": h.kind, "line": h.line, "text": h.text,
                          "requested": None if h.requested is None else h.requested.bytes} for h in self.host],
                "other_errors": [{"kind": h.kind, "line": h.line, "text": h.text} for h in self.other_errors],
                "nvidia_smi": [{"index": g.index, "name": g.name, "used": g.used.bytes, "total": g.total.bytes}
                               for g in self.smi]}


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_OOM_START = re.compile(r"(?P<backend>CUDA|HIP|XPU) out of memory\.\s*Tried to allocate\s+(?P<req>" + SIZE + r")")
_OLD = re.compile(
    r"\s*\(GPU (?P<dev>\d+); (?P<cap>" + SIZE + r") total capacity; (?P<alloc>" + SIZE + r") already allocated; "
    r"(?P<free>" + SIZE + r") free;(?: (?P<allowed>" + SIZE + r") allowed;)?(?: (?P<res>" + SIZE + r") "
    r"(?P<how>reserved in total by PyTorch|cached)\))?")
_NEW = re.compile(
    r"\.?\s*GPU (?P<dev>\d+) has a total (?P<cap_word>capacity|capacty) of (?P<cap>" + SIZE + r")(?: of which "
    r"(?P<free>" + SIZE + r") is free)?\.(?P<middle>.*?)Of the allocated memory (?P<alloc>" + SIZE + r") is allocated "
    r"by PyTorch,(?: with (?P<pools>" + SIZE + r") allocated in private pools \(e\.g\., (?:CUDA|HIP) Graphs\),)? and "
    r"(?P<unalloc>" + SIZE + r") is reserved by PyTorch but unallocated\.", re.S)
_HEAD = re.compile(r"\.?\s*GPU (?P<dev>\d+) has a total capac(?:i)?ty of (?P<cap>" + SIZE + r")(?: of which "
                   r"(?P<free>" + SIZE + r") is free)?")
_PROCESS = re.compile(r"Process (?P<pid>\d+) has (?P<size>" + SIZE + r") memory in use\.")
_THIS = re.compile(r"Including non-PyTorch memory, this process has (?P<size>" + SIZE + r") memory in use\.")
_ALLOWED = re.compile(r"(?P<size>" + SIZE + r") allowed;")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')       # Python's tracebacks
_IPY8_FRAME = re.compile(r"File (?P<file>\S+\.py):(?P<line>\d+), in (?P<func>[\w<>.]+)")      # IPython 8's
_RICH_FRAME = re.compile(r"^[\s│|]*(?P<file>\S+\.py):(?P<line>\d+) in (?P<func>\S+?)\s*[│|]?\s*$")   # rich's
_IPY_FRAME = re.compile(r"^\[?(?P<file>[^\s\[\]()]+\.py|<ipython-input-[^>]*>)\]?(?:\([^)\s]*\))?\s+in\s+"
                        r"(?P<func><cell line: \d+>|[\w<>]+)\(")                                       # IPython's
_IPY_LINE = re.compile(r"^-+>\s*(?P<line>\d+)\s+(?P<code>.*)$")
_SEE = re.compile(r"MA (?P<ma>[\d.]+) GB\s+Max_MA (?P<maxma>[\d.]+) GB\s+CA (?P<ca>[\d.]+) GB\s+Max_CA (?P<maxca>[\d.]+) GB")
_SMI_GPU = re.compile(r"^\|\s+(?P<idx>\d+)\s+(?P<name>.+?)\s+(?:On|Off)\s+\|")
_SMI_MEM = re.compile(r"\|\s+(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s+\|")
_SMI_PROC = re.compile(r"^\|\s+(?P<gpu>\d+)\s+(?:N/A\s+N/A\s+)?(?P<pid>\d+)\s+[CGM+]+\s+(?P<name>\S+)\s+(?P<used>\d+)MiB\s*\|")
_HOST = (
    ("oom_killer", re.compile(r"Out of memory: Kill(?:ed)? process \d+")),
    ("killed", re.compile(r"^(?:.*\s)?Killed(?:\s+.*)?$")),
    ("sigkill", re.compile(r"exitcode\s*:\s*-9\b|exit(?:s with return)? code\s*=?\s*-9\b|Signals?\.SIGKILL|"
                           r"[Ss]ignal 9 \(SIGKILL\)|SIGKILL|exit(?:ed with)? (?:code|status) 137\b|"
                           r"non-zero exit status 137\b|exitcode: -9\b")),
    ("memory_error", re.compile(r"^MemoryError\b|\bMemoryError:|std::bad_alloc")),
    ("cpu_allocator", re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to "
                                 r"allocate (?P<n>\d+) bytes")),
)
_OTHER = (
    ("mps", re.compile(r"MPS backend out of memory")),
    ("cuda_error", re.compile(r"CUDA error: out of memory")),
    ("cublas_alloc", re.compile(r"CUBLAS_STATUS_ALLOC_FAILED")),
    ("nccl", re.compile(r"NCCL (?:WARN )?.*(?:Cuda failure 'out of memory'|out of memory)|"
                        r"^Cuda failure \d+ 'out of memory'")),      # NCCL's 'Last error:' line (its CUDACHECK)
)

EXPECTED = ("torch's 'CUDA out of memory. Tried to allocate ...' message (any torch release), a Python traceback, "
            "DeepSpeed's see_memory_usage lines ('MA x GB Max_MA x GB CA x GB Max_CA x GB'), nvidia-smi's table, or "
            "a host kill ('Killed', exit code -9 or 137, MemoryError, 'DefaultCPUAllocator: can't allocate memory')")
MAX_CHARS = 20_000_000


def _clean(text: str) -> tuple[list[str], list[int | None], int | None]:
    """Lines without launchers' prefixes and colours, the rank each prefix named, and the width the text was folded
    at (a terminal or a pager cuts lines at a fixed width, mid-word: the longest length, met on two lines or more),
    or None."""
    lines, ranks, widths = [], [], []
    for raw in text.splitlines():
        raw = _ANSI.sub("", raw)
        widths.append(len(raw))
        m = re.match(r"^\s*\[(?:rank|default)(\d+)\]:\s?", raw)
        ranks.append(int(m.group(1)) if m else None)
        lines.append(raw[m.end():] if m else raw)
    widest = max(widths, default=0)
    folded = widest if widest >= 60 and widths.count(widest) >= 2 else None
    lines = [x + "\0" if folded and w == folded else x for x, w in zip(lines, widths)]   # \0: joined with no space
    return lines, ranks, folded


SAVING_LOG = re.compile(r"Saving model checkpoint to |\[engine\.py:\d+:save_checkpoint\]|save_16bit_model")
SAVING_NEAR = 20     # a save logged within this many lines before the error is where the run died
# transformers' progress bar while from_pretrained reads the weights (4.x: "Loading checkpoint shards", 5.x:
# core_model_loading.py "Loading weights"), and the progress a run shows once training runs (a tqdm bar of steps, the
# Trainer's logged loss): where the last of them before a kill is the loading bar, the run died loading the model
LOADING_LOG = re.compile(r"Loading (?:checkpoint shards|weights)\s*:\s*\d+%")
PROGRESS_LOG = re.compile(r"\d+%\|.*\|\s*\d+/\d+ \[|\{'loss':|'train_runtime'")

def read(text: str) -> Pasted:
    """Everything `text` says about memory (see the module docstring); InputError when it says nothing this reads."""
    if not isinstance(text, str):
        raise InputError(f"the pasted text must be a string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise InputError(f"the pasted text is {len(text):,} characters; at most {MAX_CHARS:,} are read (paste the "
                         f"part around the error)")
    if not text.strip():
        raise InputError(f"the text is empty: expected {EXPECTED}")
    if re.search(r"Tried to allocate \d+,\d+ ?[KMGT]i?B", text):
        raise InputError("the message's figures have decimal commas ('Tried to allocate 2,00 GiB'): torch prints a "
                         "decimal point in every locale, so the text was retyped or translated; paste it as the log "
                         "printed it")
    lines, ranks, folded = _clean(text)
    out = Pasted()
    _read_ooms(lines, ranks, out, folded)
    lines = [x.rstrip("\0") for x in lines]
    for n, line in enumerate(lines, 1):
        if m := _FRAME.search(line) or _RICH_FRAME.match(line):
            nxt = _FRAME.sub("", lines[n]).strip() if n < len(lines) else ""
            out.frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func"),
                                    "" if _FRAME.search(lines[n] if n < len(lines) else "") or
                                    nxt.startswith("Traceback") else nxt[-300:]))
        elif (m := _IPY8_FRAME.search(line)) or (m := _IPY_FRAME.match(line.strip())):
            # IPython and Colab: 'File path.py:109, in func(args)' (IPython 8) or 'path.py in func(args)', then
            # the failing line as '--> 109     code'
            below = next((x for x in (y.strip() for y in lines[n:n + 20]) if _IPY_LINE.match(x)), None)
            hit = _IPY_LINE.match(below) if below else None
            number = int(m.group("line")) if "line" in m.re.groupindex else int(hit.group("line")) if hit else 0
            out.frames.append(Frame(m.group("file"), number, m.group("func"),
                                    hit.group("code").strip()[:300] if hit else ""))
        if m := _SEE.search(line):
            label = lines[n - 2].strip() if n >= 2 and not _SEE.search(lines[n - 2]) else ""
            out.memory_lines.append(MemoryLine(n, label[:200], *(size(f"{m.group(k)} GiB")
                                                                  for k in ("ma", "maxma", "ca", "maxca"))))
        for kind, pattern in _HOST:
            if (m := pattern.search(line)) and not (kind == "killed" and len(line.strip()) > 200):
                req = size(f"{m.group('n')} bytes") if kind == "cpu_allocator" else None
                out.host.append(HostSign(kind, n, line.strip()[:300], req))
                break
        for kind, pattern in _OTHER:
            if pattern.search(line) and not _OOM_START.search(line):
                out.other_errors.append(HostSign(kind, n, line.strip()[:300]))
                break
        _read_smi(lines, n, line, out)
    first = min([o.line for o in out.ooms] + [h.line for h in out.host], default=None)
    saving = [n for n, line in enumerate(lines, 1) if SAVING_LOG.search(line) and first is not None and n < first]
    if saving and first - saving[-1] <= SAVING_NEAR:   # the Trainer's "Saving model checkpoint to" just before it
        out.frames.append(Frame("<log>", saving[-1], "state_dict", lines[saving[-1] - 1].strip()[:200]))
    progress = [n for n, line in enumerate(lines[:first - 1] if first else [], 1)
                if LOADING_LOG.search(line) or PROGRESS_LOG.search(line)]
    if progress and LOADING_LOG.search(lines[progress[-1] - 1]) and out.phase() is None:   # frames name none
        out.frames.append(Frame("<log>", progress[-1], "from_pretrained", lines[progress[-1] - 1].strip()[:200]))
    elif progress:
        out.training = (progress[-1], lines[progress[-1] - 1].strip()[:200])
    for n, line in enumerate(lines, 1):           # lines that name the phase without a frame of their own
        if saving and first - saving[-1] <= SAVING_NEAR:
            break
        if re.search(r"Failed to clone\(\) tensor with name .* \(?state_dict|_full_post_state_dict_hook", line):
            out.frames.append(Frame("<log>", n, "state_dict", line.strip()[:200]))    # FSDP's state_dict: a save
            break
        if "Calls into the C++ engine to run the backward pass" in line:                # torch's backward's comment
            out.frames.append(Frame("<log>", n, "run_backward", line.strip()[:200]))
            break
    if not (out.ooms or out.memory_lines or out.host or out.smi or out.other_errors):
        for n, line in enumerate(lines, 1):       # an out-of-memory named without its figures
            if re.search(r"out of memory|OutOfMemoryError", line, flags=re.I):
                retyped = re.search(r"Tried to allocate \d+(?:\.\d+)?\s*(?:[KMGT]B|[KMGT]iB?)\b", line) and not \
                    re.search(r"Tried to allocate \d+(?:\.\d+)? (?:KiB|MiB|GiB|TiB|PiB|bytes)", line)
                out.other_errors.append(HostSign("retyped" if retyped else "no_figures", n, line.strip()[:300]))
                break
    if not (out.ooms or out.memory_lines or out.host or out.smi or out.other_errors):
        first = next((x.strip() for x in lines if x.strip()), "")
        last = next((x.strip() for x in reversed(lines) if x.strip()), "")
        if out.frames and re.match(r"^[\w.]*(?:Error|Exception|Interrupt|Exit)\b", last):
            raise InputError(f"a traceback that ends in another error, not an out-of-memory: {last[:80]!r}; "
                             f"expected {EXPECTED}")
        if out.frames:                            # cut before its error line: its frames still tell the phase
            out.other_errors.append(HostSign("cut_traceback", len(lines), last[:300]))
        else:
            raise InputError(f"no out-of-memory report found in the text (it starts {first[:60]!r}): expected "
                             f"{EXPECTED}")
    return out


def _read_ooms(lines: list[str], ranks: list, out: Pasted, folded: int | None = None) -> None:
    """Each 'out of memory. Tried to allocate' message, read over the lines it wraps onto (a line cut at the fold
    width joins the next with no space); the same message printed by several ranks is kept once per rank."""
    whole, starts = "", []                         # the lines joined; where each line starts in it
    for line in lines:
        starts.append(len(whole))
        if line.endswith("\0"):                  # cut at the fold width, mid-word: the next line goes on from it
            whole += line[:-1]
        else:
            whole += " ".join(line.split()) + " "   # runs of spaces (a wrapped, re-indented paste) read as one
    whole = re.sub(" +", " ", whole)
    seen = set()
    for m in _OOM_START.finditer(whole):
        rest = whole[m.end():m.end() + 2000]
        n = bisect.bisect_right(starts, m.start())        # 1-based line of the match
        o = CudaOOM("requested_only", m.group("backend"), size(m.group("req")), n, rank=ranks[n - 1])
        end = 0
        if (old := _OLD.match(rest)) is not None:
            o.format = {"cached": "cached", None: "parenthesised_cut"}.get(old.group("how"), "reserved_in_total")
            o.device_index = int(old.group("dev"))
            o.capacity, o.allocated, o.free = (size(old.group(k)) for k in ("cap", "alloc", "free"))
            o.reserved = size(old.group("res")) if old.group("res") else None
            if o.format == "cached":       # 1.0-1.3's 'cached': held by the allocator but not allocated (#13751)
                o.reserved, o.unallocated = None, o.reserved
            o.allowed = size(old.group("allowed")) if old.group("allowed") else None
            end = old.end()
        elif (new := _NEW.match(rest)) is not None:
            middle = new.group("middle")
            o.device_index = int(new.group("dev"))
            o.capacity = size(new.group("cap"))
            o.free = size(new.group("free")) if new.group("free") else None
            o.allocated, o.unallocated = size(new.group("alloc")), size(new.group("unalloc"))
            o.private_pools = size(new.group("pools")) if new.group("pools") else None
            listed = [(int(p.group("pid")), size(p.group("size"))) for p in _PROCESS.finditer(middle)]
            o.processes = [x for x in listed if 0 < x[1].bytes < 2**63]   # NVML without a figure: 2^64 B or 0
            o.processes_without_figure = len(listed) - len(o.processes)
            this = _THIS.search(middle)
            o.this_process = size(this.group("size")) if this else None
            if o.this_process is not None and not 0 < o.this_process.bytes < 2**63:
                o.this_process = None                 # NVML gave no figure (2^64 B) or none for this PID (0 bytes)
                o.this_process_without_figure = True
            allowed = _ALLOWED.search(middle)
            o.allowed = size(allowed.group("size")) if allowed else None
            o.format = ("capacty" if new.group("cap_word") == "capacty" else
                        "this_process" if this else "process_listed" if o.processes else "capacity")
            end = new.end()
        if end == 0 and (head := _HEAD.match(rest)) is not None:   # a message cut short: what it has, read
            o.device_index = int(head.group("dev"))
            o.capacity = size(head.group("cap"))
            o.free = size(head.group("free")) if head.group("free") else None
            o.processes = [(int(p.group("pid")), size(p.group("size"))) for p in _PROCESS.finditer(rest[:2000])]
            end = head.end()
        if re.search(r"reserved by PyTorch but unallocated|reserved in total by PyTorch|cached\)", rest[:1500]) \
                and o.allocated is None:
            o.format = "unreadable_rest"              # the whole message is there, but not as torch prints it
        o.text = (m.group(0) + rest[:end]).strip()
        key = (o.rank, o.text)
        if key not in seen:
            seen.add(key)
            out.ooms.append(o)


def _read_smi(lines: list[str], n: int, line: str, out: Pasted) -> None:
    """nvidia-smi's table: a GPU's row ('| 0  NVIDIA H100 80GB HBM3  On |') and the memory row under it
    ('| 81000MiB / 81559MiB |'); its process rows."""
    if (g := _SMI_GPU.match(line)) and n < len(lines) and (mem := _SMI_MEM.search(lines[n])):
        out.smi.append(SmiGPU(int(g.group("idx")), g.group("name").strip(), size(f"{mem.group('used')} MiB"),
                              size(f"{mem.group('total')} MiB")))
    elif p := _SMI_PROC.match(line):
        out.smi_processes.append((int(p.group("gpu")), int(p.group("pid")), p.group("name"),
                                  size(f"{p.group('used')} MiB")))


# The phase a traceback shows, from its frames: the first rule (in this order) that any frame meets. The call chain
# holds only active calls, so a save or an evaluation inside the training loop is found before the forward it calls.
PHASE_RULES = (        # (phase, a pattern over a frame's 'path:function', a pattern over its code line or None)
    ("save", r"save_checkpoint|_save_checkpoint|save_model|save_pretrained|_save_to_state_dict|<log>:state_dict$|"
             r"consolidated_16bit_state_dict|_zero3_consolidated|full_state_dict|get_state_dict|dcp\.save|"
             r"\bsave_state\b", r"\.save_(?:checkpoint|model|pretrained)\("),
    ("resume", r"_load_from_checkpoint|_load_optimizer_and_scheduler|load_checkpoint|_load_rng_state|"
               r"load_optimizer_state|:load_state$|dcp\.load", None),
    ("load", r"from_pretrained|_load_pretrained_model|_load_state_dict_into_meta_model|load_state_dict|"
             r"_load_checkpoint_into|:load_model$|dispatch_model|quantize_4bit|replace_with_bnb|"
             r"_process_model_before_weight_loading|set_module_\w*tensor_to_device|:_apply$|:convert$|:cuda$",
     r"\bfrom_pretrained\(|\.to\(['\"]?cuda|\.cuda\(\)"),
    ("generation", r"\bgenerate\b|_generate_and_score|:_sample$|generate_sequences|vllm/", None),
    ("evaluation", r"\bevaluate\b|evaluation_loop|prediction_step|prediction_loop|:_maybe_log_save_evaluate$|"
                   r"\beval_step\b|validation_step|:validate$", None),
    ("setup", r"deepspeed/__init__\.py:initialize$|_configure_zero_optimizer|_configure_optimizer|"
              r"DeepSpeedZeroOptimizer|_create_fp32_partitions|_setup_for_real_optimizer|:_wrap_model$|"
              r"fully_sharded_data_parallel\.py:__init__$|_init_param_handle|fully_shard|:prepare_model$|"
              r"_prepare_deepspeed|_prepare_fsdp|_move_model_to_device|_init_flat_param|_broadcast_model|"
              r"trainer\w*\.py:__init__$",
     r"\bdeepspeed\.initialize\(|\b\w*Trainer\("),
    ("step", r"optim/\w+\.py:(?:step|_init_group|adamw?|_multi_tensor_\w+|_single_tensor_\w+|_fused_\w+)$|"
             r"deepspeed/.*:step$|accelerate/optimizer\.py:step$|:_?optimizer_step$|fused_adam|cpu_adam|"
             r"clip_grad_norm|:unscale_$|get_global_norm|stage_1_and_2\.py:step$|stage3\.py:step$",
     r"\boptimi[sz]er\w*\.step\(|\bopt\.step\(|\bclip_grad_norm_?\("),
    ("backward", r":\w*backward\w*$|run_backward|reduce_ipg_grads|reduce_independent_p_g_buckets|"
                 r"reduce_and_partition_ipg_grads|:_post_backward\w*$|allreduce_gradients",
     r"\.backward\(|run_backward\("),
    ("forward", r":forward$|:compute_loss$|:_call_impl$|:_wrapped_call_impl$|cross_entropy|"
                r"ForCausalLMLoss|convert_to_fp32",             # not training_step: it runs backward too
     r"\bcompute_loss\(|\bmodel\(\*\*inputs|\boutputs = model\("),
)
LAUNCHERS = re.compile(r"torch/distributed/(?:elastic|launcher)/|torch/distributed/run\.py|accelerate/commands/|"
                       r"deepspeed/launcher/|<frozen runpy>|/runpy\.py|site-packages/click/|fire/core\.py")
"""Frames of the launcher around a run (torchrun, accelerate launch, deepspeed): they say nothing of its phase."""
PHASE_WORDS = {
    "save": "checkpoint save", "resume": "resuming from a checkpoint", "load": "loading the model",
    "generation": "generation", "evaluation": "evaluation", "setup": "engine set-up (before the first forward)",
    "step": "optimizer step", "backward": "backward", "forward": "forward",
    "training": "training steps",
}


def phase_of(frames: list[Frame]) -> tuple[str, Frame] | None:
    """(phase, the frame that shows it) for a traceback's frames, or None when no rule applies: the first rule (in
    PHASE_RULES' order) that a frame meets by its path and function, or by the line of code it was running."""
    frames = [f for f in frames if not LAUNCHERS.search(f.file)]
    for phase, where_rule, code_rule in PHASE_RULES:
        rx, code_rx = re.compile(where_rule), re.compile(code_rule) if code_rule else None
        for f in frames:
            where = f"{f.file}:{f.function}"
            if rx.search(where) or (code_rx is not None and code_rx.search(f.code or "")):
                if phase == "step" and "scheduler" in where:
                    continue                            # a learning-rate scheduler's step allocates nothing
                return phase, f
    return None
