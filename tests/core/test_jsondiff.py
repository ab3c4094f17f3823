"""Document deltas: `json_diff` output is RFC 6902 that `jsonpatch` applies to give exactly the new value."""

from __future__ import annotations

import copy
import random
import re
from typing import Any

import jsonpatch
import pytest

from harness_core._json import strict_copy
from harness_core._jsondiff import copy_and_diff, json_diff, same
from harness_core.errors import StrictJsonError

KEYS = ["a", "b", "run", "tools", "~x", "a/b", ""]


def value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -3, 10**12])
    if kind == 3:
        return rng.choice([0.0, 1.0, 2.5])
    if kind == 4:
        return rng.choice(["", "x", "running", "~/"])
    if kind in (5, 6):
        return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [value(rng, depth + 1) for _ in range(rng.randrange(4))]


def mutate(rng: random.Random, doc: Any, depth: int = 0) -> Any:
    """A realistic edit: most of the value kept, a few places changed, appended, removed or retyped."""
    roll = rng.random()
    if roll < 0.15 or depth > 3:
        return value(rng, depth)
    if isinstance(doc, dict):
        out = dict(doc)
        for key in list(out):
            if rng.random() < 0.3:
                out[key] = mutate(rng, out[key], depth + 1)
            elif rng.random() < 0.1:
                del out[key]
        if rng.random() < 0.3:
            out[rng.choice(KEYS)] = value(rng, depth + 1)
        return out
    if isinstance(doc, list):
        out = [mutate(rng, v, depth + 1) if rng.random() < 0.3 else v for v in doc]
        if rng.random() < 0.3:
            out.extend(value(rng, depth + 1) for _ in range(rng.randrange(1, 3)))
        elif out and rng.random() < 0.2:
            del out[rng.randrange(len(out)) :]
        elif len(out) > 1 and rng.random() < 0.2:
            out.insert(0, value(rng, depth + 1))
        return out
    return value(rng, depth)


@pytest.mark.parametrize("seed", range(20))
def test_patch_applies_to_exactly_the_new_value(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        src = value(rng, 0)
        dst = mutate(rng, src)
        before = copy.deepcopy(src)
        ops = json_diff(src, dst)
        assert same(src, before)  # the diff does not touch its inputs
        patched = jsonpatch.apply_patch(copy.deepcopy(src), copy.deepcopy(ops))
        assert same(patched, dst), (src, dst, ops)
        assert (ops == []) == same(src, dst)


def test_small_edits_stay_small() -> None:
    live = {"run": {"task_id": 7, "inputs": [3]}, "tools": [{"call_id": "c1", "status": "pending"}]}
    edited = copy.deepcopy(live)
    edited["tools"][0]["status"] = "done"
    edited["run"]["inputs"].append(9)
    assert json_diff(live, edited) == [
        {"op": "add", "path": "/run/inputs/1", "value": 9},
        {"op": "replace", "path": "/tools/0/status", "value": "done"},
    ]


def test_booleans_and_numbers_are_different_values() -> None:
    assert json_diff({"n": 1}, {"n": True}) == [{"op": "replace", "path": "/n", "value": True}]
    assert json_diff([0], [0.0]) == [{"op": "replace", "path": "/0", "value": 0.0}]
    assert json_diff({"a/b": {"~": 1}}, {"a/b": {"~": 2}}) == [
        {"op": "replace", "path": "/a~1b/~0", "value": 2}
    ]


class _Text(str):
    pass


@pytest.mark.parametrize("seed", range(10))
def test_copy_and_diff_is_strict_copy_then_json_diff(seed: int) -> None:
    # What Tx.prepare does to every drafted document, in one walk: the same copy, ops and errors as the two.
    rng = random.Random(seed)
    offending: list[Any] = [float("nan"), {1}, (1,), _Text("t"), 2.5]
    for _ in range(300):
        src = value(rng, 0)
        dst = mutate(rng, src)
        if isinstance(dst, dict) and rng.random() < 0.2:
            dst = {**dst, rng.choice(KEYS): rng.choice(offending)}
        expected_copy, expected_error = _strict(dst)
        if expected_error is not None:
            with pytest.raises(StrictJsonError, match=f"^{re.escape(expected_error)}$"):
                copy_and_diff(src, dst, "doc")
            continue
        copied, ops = copy_and_diff(src, dst, "doc")
        assert same(copied, expected_copy) and ops == json_diff(src, expected_copy)
        if isinstance(dst, (dict, list)):
            assert copied is not dst


def _strict(value: Any) -> tuple[Any, str | None]:
    try:
        return strict_copy(value, "doc"), None
    except StrictJsonError as exc:
        return None, str(exc)
