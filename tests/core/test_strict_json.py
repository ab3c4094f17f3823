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


class _Mode(str, enum.Enum):  # noqa: UP042 (the mixin is the case: StrEnum.__str__ gives the value)
    FAST = "fast"


class _Shouting(str):
    def __str__(self) -> str:
        return self.upper()


def test_a_str_subclass_is_copied_as_its_string_value_not_its_str() -> None:
    # json.dumps writes a str subclass's own characters; str() of a (str, Enum) member is "_Mode.FAST" (and
    # a subclass may override __str__), so converting with str() silently stored a different value.
    from harness_core._jsondiff import copy_and_diff

    source = {"mode": _Mode.FAST, "loud": [_Shouting("quiet")]}
    expected = {"mode": "fast", "loud": ["quiet"]}
    copied = strict_copy(source)
    assert copied == expected and type(copied["mode"]) is str and type(copied["loud"][0]) is str
    final, ops = copy_and_diff({"mode": "slow", "loud": ["x"]}, source, "doc")
    assert final == expected
    assert ops == [
        {"op": "replace", "path": "/mode", "value": "fast"},
        {"op": "replace", "path": "/loud/0", "value": "quiet"},
    ]
