"""RFC 6902 patches between two JSON values, for document deltas (applied with the `jsonpatch` library).

`jsonpatch.make_patch` looks for moves and minimal list edits; document changes are small edits of small
values (a status, an appended slot), where that search dominated the cost of a commit. This walk emits
`add`/`remove`/`replace` only: objects key by key, lists element by element when their length is kept,
appends and truncations as such, any other list change as one `replace`. Values are compared strictly
(`true` is not `1`), so applying the patch to `src` always gives exactly `dst`.
"""

from __future__ import annotations

from typing import Any

from harness_core._json import INT_MAX, INT_MIN, MAX_DEPTH, _Bad, _bad_key, _copy, _error, _too_deep, _valid

Op = dict[str, Any]


def json_diff(src: Any, dst: Any) -> list[Op]:
    """The operations that turn `src` into `dst` (both strict JSON). Values in the ops are shared with `dst`."""
    ops: list[Op] = []
    _diff(src, dst, "", ops)
    return ops


def same(a: Any, b: Any) -> bool:
    """JSON equality: like `==`, but a boolean never equals a number and an int never equals a float."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(value, b[key]) for key, value in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _pointer(path: str, key: str) -> str:
    return f"{path}/{key.replace('~', '~0').replace('/', '~1')}"


def _diff(src: Any, dst: Any, path: str, ops: list[Op]) -> None:
    if type(src) is dict and type(dst) is dict:
        for key in src:
            if key not in dst:
                ops.append({"op": "remove", "path": _pointer(path, key)})
        for key, value in dst.items():
            if key in src:
                _diff(src[key], value, _pointer(path, key), ops)
            else:
                ops.append({"op": "add", "path": _pointer(path, key), "value": value})
        return
    if type(src) is list and type(dst) is list:
        kept, now = len(src), len(dst)
        if kept == now:
            for index in range(kept):
                _diff(src[index], dst[index], f"{path}/{index}", ops)
        elif now > kept and same(src, dst[:kept]):
            ops.extend({"op": "add", "path": f"{path}/{i}", "value": dst[i]} for i in range(kept, now))
        elif now < kept and same(src[:now], dst):
            ops.extend({"op": "remove", "path": f"{path}/{i}"} for i in range(kept - 1, now - 1, -1))
        else:
            ops.append({"op": "replace", "path": path, "value": dst})
        return
    if not same(src, dst):
        ops.append({"op": "replace", "path": path, "value": dst})


def copy_and_diff(src: Any, dst: Any, where: str, *, limit: int = MAX_DEPTH) -> tuple[Any, list[Op]]:
    """`strict_copy(dst, where)` and `json_diff(src, <that copy>)` in one walk: the same copy, the same ops
    (their values shared with the copy), the same error for a value that is not strict JSON. Every drafted
    document is copied and diffed at each commit; one walk instead of two."""
    ops: list[Op] = []
    try:
        copied = _copy_diff(src, dst, "", ops, 0, limit)
    except _Bad as bad:
        raise _error(where, bad) from None
    return copied, ops


def _copy_diff(src: Any, dst: Any, path: str, ops: list[Op], depth: int, limit: int) -> Any:
    kind = type(dst)
    if kind is dict and type(src) is dict:
        if depth >= limit:
            raise _too_deep(limit)
        for key in src:
            if key not in dst:
                ops.append({"op": "remove", "path": _pointer(path, key)})
        out: dict[str, Any] = {}
        for key, value in dst.items():
            if type(key) is not str or not (key.isascii() or _valid(key)):
                raise _bad_key(key)
            try:
                if key not in src:
                    out[key] = copied = _copy(value, depth + 1, limit)
                    ops.append({"op": "add", "path": _pointer(path, key), "value": copied})
                    continue
                old = src[key]
                leaf = type(value)
                if (
                    (leaf is str and value.isascii())
                    or value is None
                    or leaf is bool
                    or (leaf is int and INT_MIN <= value <= INT_MAX)
                ):
                    out[key] = value
                    if not (leaf is type(old) and old == value):
                        ops.append({"op": "replace", "path": _pointer(path, key), "value": value})
                    continue
                out[key] = _copy_diff(old, value, _pointer(path, key), ops, depth + 1, limit)
            except _Bad as bad:
                bad.parts.append(f".{key}")
                raise
        return out
    if kind is list and type(src) is list and len(src) == len(dst):
        if depth >= limit:
            raise _too_deep(limit)
        items: list[Any] = []
        for index, value in enumerate(dst):
            old = src[index]
            leaf = type(value)
            if (
                (leaf is str and value.isascii())
                or value is None
                or leaf is bool
                or (leaf is int and INT_MIN <= value <= INT_MAX)
            ):
                items.append(value)
                if not (leaf is type(old) and old == value):
                    ops.append({"op": "replace", "path": f"{path}/{index}", "value": value})
                continue
            try:
                items.append(_copy_diff(old, value, f"{path}/{index}", ops, depth + 1, limit))
            except _Bad as bad:
                bad.parts.append(f"[{index}]")
                raise
        return items
    # Anything else: copy it whole, then diff as json_diff does (appends, truncations, replacements).
    copied = _copy(dst, depth, limit)
    _diff(src, copied, path, ops)
    return copied
