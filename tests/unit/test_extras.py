"""The line a command prints when an optional package is missing (mooncake_cli/extras.py):
real ModuleNotFoundErrors, mapped through requirement lines like those of an installed wheel."""

from __future__ import annotations

import importlib

import pytest

from mooncake_cli import extras

GONE = "mooncake_absent_pkg"  # no such distribution anywhere
REQUIRES = [
    "numpy>=1.24",
    f'{GONE.replace("_", "-")}>=1; extra == "torch"',
    f'{GONE.replace("_", "-")}>=1; extra == "models"',
    f'{GONE.replace("_", "-")}>=1; extra == "test"',
]


def _raised(name: str) -> ImportError:
    with pytest.raises(ImportError) as info:
        importlib.import_module(name)
    return info.value


def test_a_missing_optional_package_names_the_extra_to_install() -> None:
    line = extras.missing_line(_raised(GONE), REQUIRES)
    assert line == (f"this command needs {GONE}, which is not installed: "
                    "pip install 'mooncake-cli[models]'")
    assert extras.missing_line(_raised(f"{GONE}.sub"), REQUIRES) == line  # a submodule of it


def test_the_line_is_found_behind_the_error_that_wrapped_it() -> None:
    try:
        try:
            importlib.import_module(GONE)
        except ImportError as e:
            raise RuntimeError("loading the model failed") from e
    except RuntimeError as wrapped:
        assert "mooncake-cli[models]" in (extras.missing_line(wrapped, REQUIRES) or "")


def test_a_plain_dependency_says_to_reinstall() -> None:
    line = extras.missing_line(_raised(GONE), [f'{GONE.replace("_", "-")}>=1'])
    assert line is not None and "pip install --force-reinstall mooncake-cli" in line


@pytest.mark.parametrize("exc", [
    _raised("numpy.no_such_submodule"),  # numpy is installed: a mismatch, not a missing extra
    _raised("mooncake_cli.no_such_module"),  # ours: a bug
    ImportError("cannot import name 'x' from 'numpy'"),  # no module named: not a missing one
    ValueError("unrelated"),
])
def test_everything_else_is_left_to_the_usual_handling(exc: BaseException) -> None:
    assert extras.missing_line(exc, REQUIRES) is None


def test_a_package_only_the_test_extra_declares_names_no_extra() -> None:
    only_test = [f'{GONE.replace("_", "-")}>=1; extra == "test"']
    assert extras.missing_line(_raised(GONE), only_test) is None
    assert extras.missing_line(_raised("mooncake_undeclared_pkg"), REQUIRES) is None
