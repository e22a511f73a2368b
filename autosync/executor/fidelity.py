"""What this machine can emulate faithfully, and the one line that says when a cluster is beyond it.

Two limits, both of this machine:

- **Ranks**: at most ``RANKS_PER_CORE`` (2) ranks per core. Beyond, each rank gets less than half a
  core and gloo's threads starve: step times stop describing the cluster.
- **Links**: the rate the emulated network can carry at all (and, for a link with a latency, the rate its
  delay line moves: a second probe, through a TAP pair and a delay line holding each frame 1 ms). A quick probe (two namespaces, one
  veth, no tc, the best of three 0.5 s TCP streams between two Python processes) measures it once per machine and
  caches it (``$AUTOSYNC_CACHE_DIR`` or ``~/.cache/autosync``, ``fidelity.json``, keyed by host
  name, cores and kernel); a link is faithful up to ``RATE_SHARE`` (0.6) of it, where the emulator's
  own benchmark (``bench/emulation_fidelity.py``) measures 0.95 of the configured rate (on the
  machines of this project the stream carries 17-21 Gbit/s: 10 gbit is faithful, 25 gbit is not).

:func:`beyond` names what a cluster exceeds (empty when nothing); an emulated cluster beyond the
range warns in one line, and its measurements carry the Context network ``emulated-beyond``, so
they are labelled in every table and never filed with faithful ones. ``tune`` and ``collect``
refuse to measure such a cluster unless asked (``--beyond-range``) and point to ``--measure 0``.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from autosync.cluster import Cluster
from autosync.executor.netns import PREFIX, EmulationError
from autosync.executor.netns import run as _run

log = logging.getLogger(__name__)
RANKS_PER_CORE = 2
RATE_SHARE = 0.6
PROBE_SECONDS = 0.5
DELAY_PROBE_S = 0.001  # the one-way delay of the delay line's rate probe
PROBES = 3            # the best of three short streams: a busy moment must not shrink the range for good

_SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("{addr}", 5201)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t0 = None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    if t0 is None:
        t0 = time.perf_counter()
    n += k
print(n * 8 / (time.perf_counter() - t0), flush=True)
"""
_CLIENT = """
import socket, time
c = socket.create_connection(("{addr}", 5201)); data = bytes(4 << 20); t0 = time.perf_counter()
while time.perf_counter() - t0 < {seconds}:
    c.sendall(data)
c.close()
"""


def cache_path() -> Path:
    root = os.environ.get("AUTOSYNC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "autosync")
    return Path(root) / "fidelity.json"


def machine_key() -> str:
    return f"{platform.node()}|{os.cpu_count()}cores|{platform.release()}"


def probe_rate(seconds: float = PROBE_SECONDS, delay_s: float | None = None) -> float:
    """Bit/s one TCP stream carries between two network namespaces over an unshaped veth; with ``delay_s``, over a
    TAP pair through a delay line (:mod:`autosync.executor.delayline`) holding each frame ``delay_s``."""
    import json

    base = f"{PREFIX}{os.getpid()}-0-probe"
    a, b = f"{base}a", f"{base}b"
    line = None
    try:
        _run("ip", "netns", "add", a)
        _run("ip", "netns", "add", b)
        if delay_s is None:
            _run("ip", "-n", a, "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb", "netns", b)
        else:
            config = {"links": [{"host_ns": a, "host_dev": "pa", "switch_ns": b, "switch_dev": "pb",
                                 "latency_s": 2 * delay_s}], "namespaces": [a, b]}
            line = subprocess.Popen([sys.executable, "-m", "autosync.executor.delayline", json.dumps(config)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if line.stdout.readline().strip() != "ready":
                raise EmulationError("the delay line of the link-rate probe did not start")
        for ns, dev, addr in ((a, "pa", "198.19.0.1/24"), (b, "pb", "198.19.0.2/24")):
            _run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", a, sys.executable, "-c", _SERVER.format(addr="198.19.0.1")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            if server.stdout.readline().strip() != "ready":
                raise EmulationError("the link-rate probe's receiver did not start")
            subprocess.run(["ip", "netns", "exec", b, sys.executable, "-c",
                            _CLIENT.format(addr="198.19.0.1", seconds=seconds)], check=True, timeout=60)
            return float(server.communicate(timeout=30)[0].strip())
        finally:
            server.kill()
    finally:
        if line is not None:
            line.communicate("down\n", timeout=10)
        for ns in (a, b):
            _run("ip", "netns", "delete", ns, check=False)


def faithful_range(probe: bool = True) -> dict:
    """``{"max_ranks", "carried_bps", "max_rate_bps", "delayed_carried_bps", "max_delayed_rate_bps"}`` of this
    machine: from the cache, else probed (and cached). ``delayed_*`` are the same for a link with a latency, whose
    frames a delay line moves (:data:`DELAY_PROBE_S` each way).

    With ``probe=False`` and nothing cached, the rate limits are unknown (``None``)."""
    path = cache_path()
    key = machine_key()
    try:
        cached = json.loads(path.read_text()).get(key)
    except (OSError, ValueError):
        cached = None
    cores = os.cpu_count() or 1
    if probe and (cached is None or "delayed_carried_bps" not in cached):
        log.info("measuring the link rate this machine can emulate (once; cached in %s)", path)
        cached = dict(cached or {})
        if "carried_bps" not in cached:
            cached["carried_bps"] = max(probe_rate() for _ in range(PROBES))
        cached["delayed_carried_bps"] = max(probe_rate(delay_s=DELAY_PROBE_S) for _ in range(PROBES))
        cached["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            known = json.loads(path.read_text()) if path.exists() else {}
            known[key] = cached
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(known, indent=1))
            os.replace(tmp, path)
        except (OSError, ValueError) as e:
            log.warning("could not cache the emulation range in %s: %s", path, e)
    cached = cached or {}
    carried, delayed = cached.get("carried_bps"), cached.get("delayed_carried_bps")
    return {"max_ranks": RANKS_PER_CORE * cores, "carried_bps": carried,
            "max_rate_bps": carried * RATE_SHARE if carried else None, "delayed_carried_bps": delayed,
            "max_delayed_rate_bps": delayed * RATE_SHARE if delayed else None}


def beyond(cluster: Cluster, limits: dict | None = None) -> list[str]:
    """What of ``cluster`` this machine cannot emulate faithfully, one phrase each ([] = all of it)."""
    limits = limits or faithful_range()
    out = []
    cores = os.cpu_count() or 1
    if cluster.world_size > limits["max_ranks"]:
        out.append(f"{cluster.world_size} ranks on {cores} cores (faithful up to {limits['max_ranks']}: "
                   f"{RANKS_PER_CORE} per core)")
    links = [cluster.link_of(k) for k in range(cluster.nodes)]
    rate = max(link.rate_bps for link in links)
    delayed = [link.rate_bps for link in links if link.latency_s or link.jitter_s]
    if limits["max_rate_bps"] and rate > limits["max_rate_bps"]:
        out.append(f"{rate / 1e9:g} Gbit/s links (this machine carries {limits['carried_bps'] / 1e9:.1f} Gbit/s "
                   f"between namespaces; faithful up to {limits['max_rate_bps'] / 1e9:.1f})")
    elif delayed and limits.get("max_delayed_rate_bps") and max(delayed) > limits["max_delayed_rate_bps"]:
        out.append(f"{max(delayed) / 1e9:g} Gbit/s links with a latency (its delay line carries "
                   f"{limits['delayed_carried_bps'] / 1e9:.1f} Gbit/s here; faithful up to "
                   f"{limits['max_delayed_rate_bps'] / 1e9:.1f})")
    return out
