"""What this process may use (memory, CPUs, time) and the one refusal for a run that exceeds it.

Callers estimate what a run needs (`resstream.training.budget` for training, model loading for
analysis, `resstream.simulation.config` for simulations); `check_fits` and `check_duration`
compare the estimate with what is available and refuse with one line that names the value,
the estimate and the limit. Bytes and durations are written for people in one place
(`format_bytes`, `format_duration`).

Memory available to this process (`available_bytes`):

* a CUDA device: its free memory (`torch.cuda.mem_get_info`);
* the host (CPU, and MPS, whose memory is the host's): the smallest of the memory the kernel
  can hand out now (Linux ``MemAvailable``; elsewhere the physical memory from `os.sysconf`),
  the headroom under this process's cgroup memory limit (v2 ``memory.max`` or v1
  ``memory.limit_in_bytes``, minus the usage that cannot be reclaimed), and the headroom under
  its address-space limit (``RLIMIT_AS`` minus the address space already mapped). Where none
  of these can be read, nothing is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from resstream.errors import UsageError

if TYPE_CHECKING:
    import torch

#: A run estimated to take longer than this cannot be what was meant: it is refused.
MAX_RUN_SECONDS = 365 * 24 * 3600

#: Threads per CPU that a CPU thread count may ask for (more only adds switching).
MAX_THREADS_PER_CPU = 4

#: Where cgroup files live (Linux).
CGROUP_ROOT = Path("/sys/fs/cgroup")

#: A cgroup v1 limit this large means "no limit" (the kernel writes 2**63 rounded to a page).
_NO_LIMIT = 2**60

_BYTE_UNITS = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
_DURATION_UNITS = (("s", 1.0), ("min", 60.0), ("h", 3600.0), ("days", 86400.0), ("years", 365 * 86400.0))


def format_bytes(count: float) -> str:
    """Bytes in decimal units for people: ``512 B``, ``12.3 GB``, ``48.0 TB``."""
    value = float(count)
    for unit in _BYTE_UNITS:
        if abs(value) < 1000 or unit == _BYTE_UNITS[-1]:
            break
        value /= 1000
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.1f} {unit}" if abs(value) < 1000 else f"{value:.3g} {unit}"


def format_duration(seconds: float) -> str:
    """A duration for people: ``0.1 ms``, ``40 s``, ``3.5 h``, ``2.1 days``, ``3.2e+08 years``."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    name, size = _DURATION_UNITS[0]
    for unit, unit_seconds in _DURATION_UNITS:
        if seconds >= unit_seconds:
            name, size = unit, unit_seconds
    value = seconds / size
    if name == "s":
        return f"{value:.0f} s"
    return f"{value:.1f} {name}" if value < 1e4 else f"{value:.2g} {name}"


def physical_memory_bytes() -> int | None:
    """Physical memory of this machine (`os.sysconf`), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def meminfo_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Linux's estimate of the memory a new allocation can get now (``MemAvailable``)."""
    try:
        for line in meminfo.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_headroom_bytes(root: Path = CGROUP_ROOT, membership: str | None = None) -> int | None:
    """Bytes this process's cgroup may still use before its memory limit, or None (no limit,
    or no cgroup). `membership` is the text of /proc/self/cgroup (read when None)."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text(encoding="utf-8")
        except OSError:
            return None
    headrooms = [_cgroup_headroom(directory, files) for directory, files in _cgroup_dirs(root, membership)]
    known = [h for h in headrooms if h is not None]
    return min(known) if known else None


#: (limit file, usage file, reclaimable entry of memory.stat) for cgroup v2 and v1.
_V2_FILES = ("memory.max", "memory.current", "inactive_file")
_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _cgroup_dirs(root: Path, membership: str) -> list[tuple[Path, tuple[str, str, str]]]:
    """The memory cgroup directories of this process: its own path under the mount, and the
    mount itself (inside a container the mount is the container's own cgroup)."""
    found = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            base, files = root, _V2_FILES
        elif "memory" in controllers.split(","):
            base, files = root / "memory", _V1_FILES
        else:
            continue
        for directory in (base / path.lstrip("/"), base):
            if (directory / files[0]).is_file() and (directory, files) not in found:
                found.append((directory, files))
    return found


def _cgroup_headroom(directory: Path, files: tuple[str, str, str]) -> int | None:
    limit_file, usage_file, reclaimable_key = files
    try:
        limit_text = (directory / limit_file).read_text(encoding="ascii").strip()
        if limit_text == "max" or int(limit_text) >= _NO_LIMIT:
            return None
        usage = int((directory / usage_file).read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    return max(int(limit_text) - max(usage - _stat_entry(directory, reclaimable_key), 0), 0)


def _stat_entry(directory: Path, key: str) -> int:
    try:
        for line in (directory / "memory.stat").read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def address_space_headroom_bytes() -> int | None:
    """Bytes of address space left under ``RLIMIT_AS`` (None: no limit, or not POSIX)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(soft - _mapped_bytes(), 0)


def _mapped_bytes() -> int:
    """Address space this process has mapped (Linux VmSize; 0 where unknown)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def host_available_bytes() -> int:
    """Memory this process can still allocate on the host (module docstring); `sys.maxsize`
    where nothing can be read, so that nothing is refused on a guess."""
    general = meminfo_available_bytes() or physical_memory_bytes()
    limits = [general, cgroup_headroom_bytes(), address_space_headroom_bytes()]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else 2**63 - 1


def available_bytes(device: str | torch.device = "cpu") -> int:
    """Memory a run on `device` can still allocate: a CUDA device's free memory, else the host's."""
    import torch  # here, not at the top: `rundir` formats bytes with this module and needs no torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return host_available_bytes()


def device_name(device: str | torch.device) -> str:
    """How messages name the memory of `device`: ``cuda:0``, or ``this machine``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.current_device() if device.index is None else device.index}"
    return "this machine"


def check_fits(
    what: str, need_bytes: float, device: str | torch.device = "cpu", *, purpose: str, remedy: str = ""
) -> None:
    """Refuse (UsageError) when `need_bytes` exceed the memory available on `device`.

    `what` names the values responsible as the message starts them (```n_layer` 1000000000``),
    `purpose` what the bytes are for (``for the weights``): "`n_layer` 1000000000 needs
    ~48.0 TB for the weights; 12.3 GB available on this machine", followed by `remedy` (what
    to lower) where given.
    """
    available = available_bytes(device)
    if need_bytes > available:
        raise UsageError(
            f"{what} needs ~{format_bytes(need_bytes)} {purpose}; "
            f"{format_bytes(available)} available on {device_name(device)}{'; ' + remedy if remedy else ''}"
        )


def check_duration(what: str, seconds: float, *, basis: str, allowed: str = "") -> None:
    """Refuse (UsageError) a run estimated to take longer than `MAX_RUN_SECONDS`.

    `what` names the values responsible, `basis` how the estimate was made (it should be a
    lower bound, so that only runs that surely take too long are refused), `allowed` what
    would pass (e.g. ```max_steps` <= 3153600``).
    """
    if not seconds <= MAX_RUN_SECONDS:
        limit = f"runs estimated under {format_duration(MAX_RUN_SECONDS)}"
        raise UsageError(
            f"{what} would take at least ~{format_duration(seconds)} ({basis}); "
            f"allowed: {allowed + ', ' if allowed else ''}{limit}"
        )


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS tells it, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def check_threads(name: str, threads: int) -> None:
    """Refuse a CPU thread count above `MAX_THREADS_PER_CPU` × the usable CPUs (`name` is the
    parameter, backticked in the message); 0 means the default and always passes."""
    cpus = usable_cpus()
    limit = MAX_THREADS_PER_CPU * cpus
    if threads > limit:
        raise UsageError(
            f"`{name}` {threads} is more than {MAX_THREADS_PER_CPU} per CPU: this process may use "
            f"{cpus} CPU(s); allowed: 0 (torch's default) to {limit}"
        )
