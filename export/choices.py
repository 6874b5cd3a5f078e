"""The streaming runtime's chunk-graph choices, kept per graph and machine so only the first session measures.

`StreamingSession` chooses among its chunk graphs by a timed probe on its first push at each batch size
(0.2–0.4 s on the 2-core Xeon). The choice depends on the graph, the machine and the runtime, not on the
tokens, so it is written to `<cache>/streaming-choices.json` keyed by

    sha256 of the step graph | the graphs the session may use | batch | CPU model, cores, threads | onnxruntime
    version and providers

and a later session on the same machine reads it instead of probing. The file is untrusted input like any
cache: at most MAX_BYTES, a JSON object of keys to [graph, tokens per run] with a known graph and a positive
run length; anything else is ignored (and rewritten on the next probe). Writes go through a temporary file
renamed over the old one (zoo.storage.atomic). ICL_ZOO_STREAMING_CHOICES=0 turns the cache off.
"""

from __future__ import annotations

import json
import os
import platform

from zoo.science.paths import cache_dir
from zoo.storage.atomic import write_text

FILE = "streaming-choices.json"
MAX_BYTES = 1 << 20
MAX_ENTRIES = 4096  # past this, the oldest choices are dropped when a new one is written
MAX_RUN_TOKENS = 1 << 24


def enabled() -> bool:
    return os.environ.get("ICL_ZOO_STREAMING_CHOICES", "1") != "0"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        return cpu


def machine(threads: int | None, providers: list[str], ort_version: str) -> str:
    """What a choice depends on besides the graph and batch."""
    return f"{cpu_model()}; {os.cpu_count()} cores; threads {threads or 'default'}; onnxruntime {ort_version} {','.join(providers)}"


def key(graph_sha256: str, graphs: tuple[str, ...], batch: int, machine_key: str) -> str:
    return f"{graph_sha256}|{','.join(graphs)}|{batch}|{machine_key}"


def _read(known: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    path = cache_dir() / FILE
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_BYTES:
            return {}
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    kept = {}
    for k, v in raw.items():
        if (isinstance(k, str) and len(k) < 1000 and isinstance(v, list) and len(v) == 2 and v[0] in known
                and isinstance(v[1], int) and not isinstance(v[1], bool) and 1 <= v[1] <= MAX_RUN_TOKENS):
            kept[k] = (v[0], v[1])
    return kept


def recall(choice_key: str, known: tuple[str, ...]) -> tuple[str, int] | None:
    """The choice stored under `choice_key`, if the cache holds a valid one (naming one of the `known` graphs)."""
    if not enabled():
        return None
    return _read(known).get(choice_key)


def remember(choice_key: str, choice: tuple[str, int], known: tuple[str, ...]) -> None:
    """Store `choice`; a cache that cannot be written (read-only home, full disk) is simply not used."""
    if not enabled():
        return
    choices = _read(known)
    choices.pop(choice_key, None)
    choices[choice_key] = choice
    kept = dict(list(choices.items())[-MAX_ENTRIES:])
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_text(cache_dir() / FILE, json.dumps({k: list(v) for k, v in kept.items()}, indent=0))
    except OSError:
        pass
