"""Strict JSON checks: the offending value is named by its path, subclasses of JSON types are handled as
before, and a copy is detached from its source."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from harness_core._json import check_json, strict_copy
from harness_core.errors import StrictJsonError


class _Code(enum.IntEnum):
    A = 1


class _Name(str):
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"a": [1, {"b": float("nan")}]}, "doc.a[1].b: nan is not JSON (NaN and infinities are not allowed)"),
        ({"a": {"b": {1, 2}}}, "doc.a.b: set is not JSON (use a list)"),
        ([0, [1, (2,)]], "doc[1][1]: tuple is not JSON (use a list)"),
        ({"f": len}, "doc.f: builtin_function_or_method is not JSON (functions cannot be stored)"),
        ({"x": {3: "y"}}, "doc.x: key 3 is not a string"),
        ({"code": _Code.A}, "doc.code: _Code is not JSON (use a plain int)"),
        (float("inf"), "doc: inf is not JSON (NaN and infinities are not allowed)"),
    ],
)
def test_the_error_names_the_path(value: Any, message: str) -> None:
    for check in (strict_copy, check_json):
        with pytest.raises(StrictJsonError) as raised:
            check(value, "doc")
        assert str(raised.value) == message


def test_copy_is_detached_and_normalised() -> None:
    source = {"a": [1, 2.5, True, None, {"b": _Name("n")}], "c": "d"}
    copied = strict_copy(source)
    assert copied == source
    assert copied["a"] is not source["a"] and copied["a"][4] is not source["a"][4]
    assert type(copied["a"][4]["b"]) is str
    check_json(source)  # valid: no error, nothing returned
