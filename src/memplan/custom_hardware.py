"""Hardware that is not in the package: a user TOML of ``[[device]]`` and ``[[node]]`` rows
(``--hardware FILE``, checked by the same loader as the built-in tables) and one-field
overrides of a catalog GPU (``--gpu-memory 96GB``, ``--gpu-set hbm_gb_per_s=3900``).

Both register the new rows for the rest of the process, so every later ``get_device`` /
``get_node`` (estimate, trace, timing) sees them by name; nothing in the package is edited.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from .errors import ConfigError, ModelConfigError, did_you_mean
from .hardware import Device, add_devices, get_device, parse_devices
from .hardware.nodes import add_nodes, get_node, parse_nodes
from .host import parse_size
from .units import GB

__all__ = ["load_hardware_file", "custom_gpu", "apply_hardware_options"]

_SETTABLE = {"memory_gb": float, "memory_total_mib": int, "memory_torch_mib": int,
             "hbm_gb_per_s": float, "interconnect_gb_per_s": float, "pcie_gen": int,
             "interconnect": str, "arch": str}
"""Device fields ``--gpu-set`` may override, with their type; ``tflops_<dtype>`` too."""


def load_hardware_file(path: str | Path) -> tuple[list[str], list[str]]:
    """Read a TOML of ``[[device]]`` and/or ``[[node]]`` rows (the schema of the package's
    ``devices.toml`` / ``nodes.toml``) and register them. Devices come first, so a node may
    use a GPU from the same file.

    Returns:
        The names of the devices and of the nodes added.

    Raises:
        ModelConfigError: the file cannot be read or is not TOML.
        ConfigError: any row breaks the schema (all problems at once).
    """
    p = Path(path).expanduser()
    try:
        data = tomllib.loads(p.read_text())
    except OSError as e:
        raise ModelConfigError(f"--hardware {str(p)!r}: cannot read it ({e.strerror}).") from None
    except tomllib.TOMLDecodeError as e:
        raise ModelConfigError(f"--hardware {str(p)!r}: not valid TOML ({e}).") from None
    unknown = [k for k in data if k not in ("device", "node")]
    if unknown or not data:
        raise ConfigError([f"--hardware {str(p)!r}: expected [[device]] and/or [[node]] tables, "
                           f"found {', '.join(map(repr, unknown)) or 'nothing'}."
                           + did_you_mean(unknown[0] if unknown else "", ["device", "node"])])
    new_devices = parse_devices(data.get("device", []), str(p))
    add_devices(new_devices)
    new_nodes = parse_nodes(data.get("node", []), str(p))
    add_nodes(new_nodes)
    return list(new_devices), list(new_nodes)


def custom_gpu(base: str, *, gpu_memory: str | None = None,
               gpu_set: list[str] | tuple[str, ...] = ()) -> Device:
    """A catalog GPU with some fields replaced, registered under a name that says so, e.g.
    ``H100-80GB[memory_gb=96]``. ``gpu_memory`` (a size: ``96GB``, ``94GiB``) sets the
    capacity and drops the measured totals that would otherwise win over it.

    Raises:
        UnknownDevice: ``base`` is not in the catalog.
        ConfigError: a malformed ``field=value``, an unknown field or a bad value (all at once).
    """
    dev = get_device(base)
    changes: dict[str, object] = {}
    tflops = dict(dev.tflops or {})
    problems: list[str] = []
    if gpu_memory is not None:
        try:
            size = parse_size(gpu_memory, "--gpu-memory")
        except ConfigError as e:
            problems.extend(e.problems)
        else:
            changes.update(memory_gb=size / GB, memory_total_mib=None, memory_torch_mib=None)
    for item in gpu_set:
        field, sep, text = item.partition("=")
        field = field.strip()
        choices = [*_SETTABLE, "tflops_<dtype>"]
        if not sep or not field:
            problems.append(f"--gpu-set {item!r}: write FIELD=VALUE, e.g. hbm_gb_per_s=3900.")
            continue
        if field not in _SETTABLE and not field.startswith("tflops_"):
            problems.append(f"--gpu-set {field!r} is not a settable GPU field."
                            f"{did_you_mean(field, _SETTABLE)} Settable: {', '.join(choices)}.")
            continue
        kind = float if field.startswith("tflops_") else _SETTABLE[field]
        try:
            value = kind(text.strip())
        except ValueError:
            problems.append(f"--gpu-set {item!r}: {text!r} is not a {kind.__name__}.")
            continue
        if kind is not str and value <= 0:  # type: ignore[operator]
            problems.append(f"--gpu-set {item!r}: the value must be > 0.")
            continue
        if field.startswith("tflops_"):
            tflops[field.removeprefix("tflops_")] = float(value)  # type: ignore[arg-type]
        else:
            changes[field] = value
            if field == "memory_gb":
                changes.setdefault("memory_total_mib", None)
                changes.setdefault("memory_torch_mib", None)
    if problems:
        raise ConfigError(problems)
    label = ", ".join(
        [f"memory={gpu_memory}"] * (gpu_memory is not None) + [s.strip() for s in gpu_set])
    new = dataclasses.replace(
        dev, name=f"{dev.name}[{label}]", aliases=(), tflops=tflops, **changes,  # type: ignore[arg-type]
        source=f"{dev.source} | overridden on the command line: {label}")
    add_devices({new.name: new})
    return new


def apply_hardware_options(gpu: str | None, *, hardware: Path | None, gpu_memory: str | None,
                           gpu_set: list[str] | None, node: str | None = None,
                           default: str = "H100-80GB") -> tuple[str | None, str | None]:
    """What the CLI calls before resolving ``--gpu`` / ``--node``: load ``--hardware``, then
    apply ``--gpu-memory`` / ``--gpu-set`` to ``--gpu`` (else the node's GPU, else ``default``).
    With a node, the overridden GPU goes into a copy of the node (``DGX-H100[...]``) so the two
    still agree. Returns the GPU and node names to use (unchanged when nothing is overridden)."""
    if hardware is not None:
        load_hardware_file(hardware)
    if gpu_memory is None and not gpu_set:
        return gpu, node
    preset = get_node(node) if node else None
    dev = custom_gpu(gpu if gpu is not None else (preset.gpu if preset else default), gpu_memory=gpu_memory,
                     gpu_set=gpu_set or ())
    if preset is None or (gpu is not None and get_device(gpu).name != preset.gpu):
        return dev.name, node  # a --gpu that differs from the node's: node_hardware says so
    label = dev.name[len(preset.device.name):]
    copy = dataclasses.replace(preset, name=preset.name + label, gpu=dev.name, aliases=())
    add_nodes({copy.name: copy})
    return dev.name, copy.name
