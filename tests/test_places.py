"""advisor/places.py: where the user's files live, as platformdirs says it on every platform."""

import sys

import platformdirs
import pytest

from advisor.places import user_dir


@pytest.mark.skipif(sys.platform != "linux", reason="the cases spelled out by hand are Linux's")
@pytest.mark.parametrize(
    "xdg, home",
    [
        ("/data/xdg", "/home/me"),
        ("/data/xdg/", "/home/me"),
        ("//data//xdg", "/home/me"),
        (None, "/home/me"),
        (None, "/home/me/"),
        (None, "/"),
        ("", "/home/me"),
        ("   ", "/home/me"),
        ("relative/xdg", "/home/me"),
        (" /leading-space", "/home/me"),
        (None, "relative-home"),
        (None, None),
    ],
)
def test_the_data_folder_is_the_one_platformdirs_names(monkeypatch, xdg, home):
    for name, value in (("XDG_DATA_HOME", xdg), ("HOME", home)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    try:
        expected = platformdirs.user_data_path("advisor", appauthor=False)
    except RuntimeError:  # no home platformdirs can name: advisor says the same
        with pytest.raises(RuntimeError):
            user_dir()
        return
    assert user_dir() == expected
