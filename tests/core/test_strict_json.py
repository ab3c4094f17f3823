"""Strict JSON checks: the offending value is named by its path, subclasses of JSON types are handled as
before, and a copy is detached from its source."""

from __future__ import annotations

import datetime
import decimal
import enum
import math
from typing import Any

import pytest

from harness_core._json import check_json, clean_json, clean_text, strict_copy
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


class _Mode(str, enum.Enum):  # noqa: UP042 (the mixin is the case: a str subclass that is an enum)
    FAST = "fast"


class _Shouting(str):
    def __str__(self) -> str:
        return self.upper()


def test_a_str_subclass_is_copied_as_its_string_value_not_its_str() -> None:
    # json.dumps writes a str subclass's own characters; a subclass may override __str__, so converting with
    # str() silently stored a different value.
    from harness_core._jsondiff import copy_and_diff

    source = {"loud": [_Shouting("quiet")]}
    expected = {"loud": ["quiet"]}
    copied = strict_copy(source)
    assert copied == expected and type(copied["loud"][0]) is str
    final, ops = copy_and_diff({"loud": ["x"]}, source, "doc")
    assert final == expected
    assert ops == [{"op": "replace", "path": "/loud/0", "value": "quiet"}]


def test_enum_members_are_refused_even_when_they_are_strings() -> None:
    # Stored as its value, a member would read back as a plain string: not what was written.
    from harness_core._jsondiff import copy_and_diff

    with pytest.raises(StrictJsonError, match=r"^doc\.mode: _Mode is not JSON \(store its value: 'fast'\)$"):
        strict_copy({"mode": _Mode.FAST}, "doc")
    with pytest.raises(StrictJsonError, match=r"^doc\.mode: _Mode is not JSON"):
        copy_and_diff({"mode": "slow"}, {"mode": _Mode.FAST}, "doc")


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value] if levels % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"a": ["ok", "broken \ud83d emoji"]}, "doc.a[1]: string is not valid Unicode"),
        ({"a": {"\udc00": 1}}, "doc.a: key '\\udc00' is not valid Unicode"),
        ({"n": 2**63}, "doc.n: int 9223372036854775808 is outside the 64-bit range"),
        ([-(2**63) - 1], "doc[0]: int -9223372036854775809 is outside the 64-bit range"),
        ({"n": 10**400}, "doc.n: int with 401 digits is outside the 64-bit range"),
        ({"b": b"x"}, "doc.b: bytes is not JSON (store text, or base64 for binary data)"),
        ({"t": datetime.datetime(2026, 1, 1)}, "doc.t: datetime is not JSON"),
        ({"d": decimal.Decimal("1.5")}, "doc.d: Decimal is not JSON"),
        (_nested(129), "nesting deeper than 128 levels"),
        (_nested(200), "nesting deeper than 128 levels"),
    ],
)
def test_new_rules_name_the_path(value: Any, message: str) -> None:
    from harness_core._jsondiff import copy_and_diff

    for check in (strict_copy, check_json, lambda v, w: copy_and_diff({}, v, w)):
        with pytest.raises(StrictJsonError) as raised:
            check(value, "doc")
        text = str(raised.value)
        assert text.startswith(message) or message in text, text
        text.encode("utf-8")  # the message itself never carries the bad character


def test_edges_that_are_kept_exactly() -> None:
    value = {
        "max": 2**63 - 1,
        "min": -(2**63),
        "neg_zero": -0.0,
        "emoji": "\U0001f600 ü",
        "long": "x" * 1_000_000,
        "deep": _nested(127),  # with the outer object: 128 levels
    }
    copied = strict_copy(value)
    assert copied == value
    assert math.copysign(1.0, copied["neg_zero"]) == -1.0
    check_json(value)
    assert strict_copy(_nested(128)) == _nested(128)


def test_a_float_subclass_is_copied_as_a_plain_float() -> None:
    class _Meters(float):
        pass

    copied = strict_copy([_Meters(1.5)])
    assert copied == [1.5] and type(copied[0]) is float


def test_clean_text_replaces_unpaired_surrogates_and_joins_split_pairs() -> None:
    assert clean_text("plain") == "plain"
    assert clean_text("ü \U0001f600") == "ü \U0001f600"
    assert clean_text("broken \ud83d emoji") == "broken \ufffd emoji"
    assert clean_text("\ude00\ud83d") == "\ufffd\ufffd"
    assert clean_text("\ud83d" + "\ude00") == "\U0001f600"  # a pair that arrived in two pieces
    assert clean_text("end \ud83d") == "end \ufffd"


def test_clean_json_cleans_strings_and_keys_and_stays_strict_otherwise() -> None:
    source = {"t\udc00": ["a\ud83d", {"x": "\ud83d\ude00"}], "n": 1, "f": 0.5, "b": True, "z": None}
    assert clean_json(source) == {
        "t\ufffd": ["a\ufffd", {"x": "\U0001f600"}],
        "n": 1,
        "f": 0.5,
        "b": True,
        "z": None,
    }
    with pytest.raises(StrictJsonError, match=r"^payload\.t\[0\]: nan is not JSON"):
        clean_json({"t": [float("nan")]}, "payload")
    with pytest.raises(StrictJsonError, match="nesting deeper than 128"):
        clean_json(_nested(129))


def test_clean_helpers_are_public() -> None:
    import harness_core

    assert harness_core.clean_text is clean_text
    assert harness_core.clean_json is clean_json
