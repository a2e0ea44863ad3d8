"""Turn what a user types as MODEL into a ``ModelSpec``.

Order: the shipped catalog (HF id or alias) -> a local ``config.json`` or model directory ->
a ``package.module:function`` factory -> the local Hugging Face cache -> the Hub (config.json
only, and only when online). Offline and not found: a clear error saying how to supply a config.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ModelConfigError, UnknownModel, did_you_mean
from .catalog import catalog, find
from .hf import from_hf_config
from .spec import ModelSpec

__all__ = ["load_model", "find_config", "read_config_json"]


def read_config_json(path: Path) -> dict[str, Any]:
    """Parse a config.json, naming the file, line and column on malformed JSON."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ModelConfigError(f"cannot read {path}: {e.strerror}.") from None
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{path}: not UTF-8 text (byte {e.start}); expected a Hugging "
                               "Face config.json object.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelConfigError(
            f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg}). "
            "Expected a Hugging Face config.json object."
        ) from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: expected a JSON object, got {type(data).__name__}.")
    return data


def _hf_cache_dirs() -> list[Path]:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface" / "hub")
    return dirs


def _from_hf_cache(repo_id: str) -> Path | None:
    folder = "models--" + repo_id.replace("/", "--")
    for base in _hf_cache_dirs():
        snapshots = base / folder / "snapshots"
        if snapshots.is_dir():
            found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
            if found:
                return found[-1]
    return None


def _hub_reachable(timeout_s: float = 1.5) -> bool:
    """Whether a TCP connection to the Hub endpoint (``HF_ENDPOINT``, default huggingface.co)
    opens within ``timeout_s``. Without this probe, huggingface_hub retries an unreachable Hub
    with backoff for ~24 s before giving up; the probe runs in a daemon thread so a hanging
    DNS lookup cannot hold the caller longer either."""
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            ok.append(True)
        except OSError:
            pass

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout_s + 0.5)
    return bool(ok)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def _from_hub(repo_id: str) -> Path | None:
    """Download only config.json, when huggingface_hub is installed, we are not offline
    (``HF_HUB_OFFLINE``) and the Hub answers at once."""
    if _offline():
        return None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    if not _hub_reachable():
        return None
    try:
        return Path(hf_hub_download(repo_id, "config.json"))
    except Exception:  # noqa: BLE001 - any hub failure means "not available here"
        return None


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


MAX_NAME = 1024  # longer than any path or Hub id users pass (PATH_MAX is 4096, a name 255)


def check_name(name: str) -> None:
    """Refuse a MODEL argument no lookup can mean: empty, over ``MAX_NAME`` characters, or
    holding control characters (issue #15: these crashed with OSError/ValueError)."""
    bad = ("is empty" if not name.strip() else
           f"is {len(name):,} characters long (at most {MAX_NAME:,})" if len(name) > MAX_NAME else
           "holds control characters" if any(ord(c) < 32 or c == "\x7f" for c in name) else "")
    if bad:
        raise ModelConfigError(
            f"MODEL {name[:60]!r}{'...' if len(name) > 60 else ''} {bad}. Fix: pass a catalog "
            "id (`memplan models --search TEXT`), a Hub id (org/name), a path to a config.json "
            "or model directory, or a 'package.module:function' factory.")


def find_config(name: str) -> tuple[dict[str, Any], str] | None:
    """The config.json dict behind ``name`` and where it came from, by the same lookup as
    ``load_model`` (catalog, file or directory, HF cache, Hub); None for anything else (a
    ``module:function`` factory, or nothing found: ``load_model`` raises the helpful error)."""
    if not name.strip() or len(name) > MAX_NAME:
        return None
    entry = find(name)
    if entry is not None:
        return _checked(entry.config(), f"catalog:{entry.file}")
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return _checked(read_config_json(path), str(path))
    if ":" not in name and _looks_like_repo_id(name):
        found = _from_hf_cache(name) or _from_hub(name)
        if found is not None:
            return _checked(read_config_json(found), str(found))
    return None


def _checked(data: dict[str, Any], where: str) -> tuple[dict[str, Any], str]:
    """The config's sizes checked (``sanity.check_sizes``) before the tracer hands them to
    transformers, whose own errors are tracebacks."""
    from .sanity import check_sizes

    check_sizes(data, where)
    return data, where


def load_model(name: str) -> ModelSpec:
    """Resolve ``name`` (catalog id, path, ``module:function`` or Hub id) to a ``ModelSpec``.

    Raises:
        UnknownModel: nothing matched; the message lists close catalog matches and the ways
            to supply a config.
        ModelConfigError / UnsupportedModel: the config was found but cannot be described.
    """
    check_name(name)
    entry = find(name)
    if entry is not None:
        return from_hf_config(entry.config(), entry.id, where=f"catalog:{entry.file}",
                              source=f"memplan catalog ({entry.source})")
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelConfigError(f"{name}: directory has no config.json.")
    if path.is_file():
        return from_hf_config(read_config_json(path), name, where=str(path), source=str(path))
    if ":" in name and not name.startswith(("/", ".")):
        from .module import from_factory

        return from_factory(name)
    if _looks_like_repo_id(name):
        found = _from_hf_cache(name) or _from_hub(name)
        if found is not None:
            return from_hf_config(read_config_json(found), name, where=str(found),
                                  source=f"Hugging Face config.json ({found})")
    ids = list(catalog()) + [a for e in catalog().values() for a in e.aliases]
    raise UnknownModel(_not_found_message(name, ids))


def _not_found_message(name: str, ids: list[str]) -> str:
    """What to do when ``name`` is nowhere: the exact download command for a repo id."""
    why = ("HF_HUB_OFFLINE is set" if _offline() else "the Hub is not reachable from here "
           "(or huggingface_hub is not installed)")
    text = (f"model {name!r} is not in the catalog, not a local file, and no config.json for it "
            f"was found in the Hugging Face cache; {why}.{did_you_mean(name, ids)}")
    if _looks_like_repo_id(name):
        folder = name.split("/")[1]
        return text + (
            f" Fix: on a machine with network, run `hf download {name} config.json --local-dir "
            f"{folder}` (older huggingface_hub: `huggingface-cli download {name} config.json "
            f"--local-dir {folder}`), then pass `{folder}/config.json` (or the folder) as MODEL. "
            "`memplan models --search TEXT` searches the offline catalog.")
    return text + (" Fix: pass a path to a config.json or model directory, a Hub id "
                   "(org/name), or a 'package.module:function' factory. `memplan models` lists "
                   "the catalog.")
