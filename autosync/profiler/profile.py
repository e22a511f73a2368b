"""Profile = ModelProfile + NetworkProfile + cluster spec + environment, as versioned JSON."""
from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from autosync.cluster import Cluster, parse_cluster
from autosync.context import Context, device_kind
from autosync.errors import UserError
from autosync.profiler.model import ModelProfile
from autosync.profiler.network import NetworkProfile

PROFILE_VERSION = 1


class ProfileError(UserError):
    """A profile file that cannot be read, or is of another version."""


def environment(network: str = "emulated", backend: str = "gloo", device: str = "cpu", **extra) -> dict:
    """The environment a profile was taken in; ``network``, ``backend`` and ``device`` (cpu | cuda) enter its
    Context; ``extra`` records more of what was real (device name and count, NCCL version, hosts x ranks)."""
    import torch

    return {"torch": torch.__version__, "network": network, "backend": backend, "device": device_kind(device),
            "cores": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(), **extra}



@dataclass
class Profile:
    model: ModelProfile
    network: NetworkProfile
    cluster: Cluster
    env: dict = field(default_factory=environment)

    @property
    def context(self) -> Context:
        """Where this profile was taken (profiles written before the field existed were emulated)."""
        return Context.of(self.model.workload, self.model.batch_size, self.cluster,
                          self.env.get("network", "emulated"), self.env.get("backend", "gloo"),
                          self.env.get("device", "cpu"))

    def path_bps(self) -> tuple[list[list[float]], str]:
        """Host-to-host bandwidths (bit/s) and where they come from: ``"measured"`` (the environment's
        ``path_bps``, one point-to-point transfer per pair of hosts) or ``"spec"`` (the slower of the two links).
        The diagonal is 0 (a host's own ranks use ``intra`` fits)."""
        measured = self.env.get("path_bps") if isinstance(self.env, dict) else None
        if measured:
            return [list(map(float, row)) for row in measured], "measured"
        c = self.cluster
        return [[c.path(a, b)[0] if a != b else 0.0 for b in range(c.nodes)] for a in range(c.nodes)], "spec"

    @property
    def context_id(self) -> str:
        return self.context.id

    def to_dict(self) -> dict:
        return {"autosync_profile": PROFILE_VERSION, "cluster": self.cluster.spec(), "environment": self.env,
                "model": self.model.to_dict(), "network": self.network.to_dict()}

    def save(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)

    @classmethod
    def from_dict(cls, d: dict, source: str = "<profile>") -> "Profile":
        if not isinstance(d, dict) or "autosync_profile" not in d:
            raise ProfileError(f"{source}: not an autosync profile (no 'autosync_profile' version field)")
        if d["autosync_profile"] != PROFILE_VERSION:
            raise ProfileError(f"{source}: profile version {d['autosync_profile']!r} is not supported "
                               f"(this autosync reads version {PROFILE_VERSION}); profile again")
        try:
            return cls(ModelProfile.from_dict(d["model"]), NetworkProfile.from_dict(d["network"]),
                       parse_cluster(d["cluster"]), d.get("environment", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{source}: malformed profile ({type(e).__name__}: {e})") from None


def load_profile(path: str | Path) -> Profile:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile ({e.strerror})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    return Profile.from_dict(d, str(path))
