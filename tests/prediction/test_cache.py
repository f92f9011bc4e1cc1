"""The prediction cache's key reads the libraries' versions by hand (`installed_version`, sparing a cached
answer importlib.metadata's import): it must say what importlib.metadata says, everywhere."""

import importlib.metadata as metadata
import sys

import pytest

from advisor.prediction.cache import installed_version


def test_every_installed_distribution_has_the_version_importlib_metadata_gives():
    names = {d.metadata["Name"] for d in metadata.distributions()}
    assert len(names) > 20
    assert {n: installed_version(n) for n in names} == {n: metadata.version(n) for n in names}
    assert installed_version("no-such-package-here") is None


def dist_info(folder, name: str, version: str, header: str | None = None):
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        header or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nText\n"
    )
    return info


@pytest.mark.parametrize(
    "layout",
    ["shadowed", "two side by side", "an egg", "no version header", "a zip", "a dotted name"],
)
def test_an_unusual_layout_says_what_importlib_metadata_says(tmp_path, monkeypatch, layout):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    name = "advisor_probe_pkg"
    dist_info(second, name, "2.0")
    if layout == "shadowed":  # the first folder on sys.path wins, as importlib.metadata finds it
        dist_info(first, name, "1.0")
    elif layout == "two side by side":
        dist_info(first, name, "1.0")
        dist_info(first, name, "1.5")
    elif layout == "an egg":
        (first / f"{name}.egg-info").mkdir()
        (first / f"{name}.egg-info" / "PKG-INFO").write_text(f"Name: {name}\nVersion: 0.9\n")
    elif layout == "no version header":
        dist_info(first, name, "1.0", header=f"Name: {name}\n\nVersion: 1.0\n")
    elif layout == "a zip":
        (first / "archive.zip").write_bytes(b"PK\x05\x06" + b"\x00" * 18)  # an empty zip on sys.path
        monkeypatch.syspath_prepend(str(first / "archive.zip"))
    else:
        name = "advisor.probe-Pkg"
        dist_info(first, "advisor_probe_pkg", "3.0")
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    if layout == "a zip":
        sys.path.remove(str(first / "archive.zip"))
        sys.path.insert(0, str(first / "archive.zip"))
    assert installed_version(name) == metadata.version(name)
