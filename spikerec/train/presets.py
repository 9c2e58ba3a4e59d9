"""The shipped presets (``spikerec/configs/<name>.toml``): their names, descriptions and files.
Kept free of torch so that ``spikerec train --list`` answers at once."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..errors import ConfigError

__all__ = ["PRESET_DIR", "list_presets", "preset_path", "read_toml"]

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


def list_presets() -> dict[str, str]:
    """``{name: description}`` of the shipped presets."""
    out = {}
    for p in sorted(PRESET_DIR.glob("*.toml")):
        try:
            out[p.stem] = read_toml(p).get("description", "")
        except ConfigError as e:
            out[p.stem] = f"(broken: {e})"
    return out


def preset_path(name_or_path: str | os.PathLike) -> Path:
    """A preset name (``quickstart``) or a path to a ``.toml`` file -> its path."""
    s = os.fspath(name_or_path)
    p = Path(s)
    if s.endswith(".toml") or os.sep in s:
        if not p.is_file():
            raise ConfigError(f"config file '{s}' does not exist")
        return p
    cand = PRESET_DIR / f"{s}.toml"
    if cand.is_file():
        return cand
    names = sorted(list_presets())
    close = difflib.get_close_matches(s, names, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown preset '{s}'.{hint} Available presets: {', '.join(names)} "
                      f"(or give a path to a .toml file)")


def read_toml(path: Path) -> dict:
    """A TOML file as a dict; a :class:`ConfigError` naming the file when it does not parse."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file '{path}': not valid TOML: {e}") from None
