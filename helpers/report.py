"""Readable text of a Result: phases x devices in GiB, the categories at each peak, the verdict."""

from __future__ import annotations

from helpers.results import Result
from helpers.units import to_gib
from helpers.vocab import PHASE_LABELS


def verdict(r: Result) -> str:
    """One line: 'fits: 61.2 of 80 GiB per GPU ...' or 'OOM on GPU at the optimizer step (...)'."""
    oom = r.oom
    if oom["device"]:
        d = r.device(oom["device"])
        return (f"OOM on {oom['device'].upper()} at the {PHASE_LABELS[oom['phase']]}: "
                f"{to_gib(d.phases[oom['phase']]):.1f} GiB needed, {to_gib(d.capacity_bytes):.1f} GiB available")
    parts = []
    for name, label in (("gpu", "per GPU"), ("host", "host per node")):
        d = r.device(name)
        cap = f" of {to_gib(d.capacity_bytes):.1f}" if d.capacity_bytes else ""
        parts.append(f"{to_gib(d.peak_bytes):.1f}{cap} GiB {label} (peak at {PHASE_LABELS[d.peak_phase]})")
    return ("fits: " if any(r.device(n).capacity_bytes for n in ("gpu", "host")) else "needs: ") + "; ".join(parts)


def table(r: Result) -> str:
    """The estimate as text, GiB = 2**30 bytes."""
    lines = [f"{r.model}: {r.params:,d} parameters, {r.setup['strategy']} on {r.setup['gpus']} GPU(s), "
             f"{r.setup['precision']}, batch {r.setup['batch']} x seq {r.setup['seq']}   [{r.mode}; GiB = 2^30 bytes]",
             "", f"{'phase':30s}{'GPU (each)':>14s}{'host (node)':>14s}"]
    if r.meta.get("device"):
        lines.insert(1, f"measured on: {r.meta['device']}; {r.meta.get('wall_s', '?')} s; {r.meta.get('date', '')}")
        lines.insert(2, f"engine: {r.meta.get('engine', '?')}" + (f"; {r.meta['note']}" if r.meta.get("note") else ""))
    for phase, gpu_bytes in r.gpu.phases.items():
        lines.append(f"{PHASE_LABELS[phase]:30s}{to_gib(gpu_bytes):14.2f}{to_gib(r.host.phases[phase]):14.2f}")
    for name in ("gpu", "host"):
        d = r.device(name)
        cats = {c: v for c, v in d.categories.items() if v}
        if cats:
            lines += ["", f"{name} at its peak ({PHASE_LABELS[d.peak_phase]}):"]
            lines += [f"  {c:28s}{to_gib(v):14.2f}" for c, v in cats.items()]
    if not any(r.host.phases.values()):
        lines += ["", "host: nothing offloaded (the processes' own RAM, data loaders and the CUDA context are not counted)"]
    lines += ["", verdict(r)]
    return "\n".join(lines)


def items_table(r: Result) -> str:
    """Every named buffer behind the figures: device, GiB, the phases it is alive in, and where it comes from."""
    lines = [f"{'device':7s}{'GiB':>9s}  {'category':18s}{'alive in':36s}buffer"]
    for i in sorted(r.items, key=lambda i: (i["device"] != "gpu", -i["bytes"])):
        lines.append(f"{i['device']:7s}{to_gib(i['bytes']):9.2f}  {i['category']:18s}{','.join(i['phases']):36s}{i['name']}")
        if i["why"]:
            lines.append(f"{'':72s}  ({i['why']})")
    return "\n".join(lines)
