"""The SQLite backend stores records without their None fields; that is lossless only while every field that
may be None defaults to None. Guard it for every model a stored record can contain."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

from harness_core.records import Conversation, DocumentContent, DocumentRecord, Entry, Submission, Task

STORED = (Conversation, Entry, Task, Submission, DocumentRecord, DocumentContent)


def models_in(annotation: Any, found: set[type[BaseModel]]) -> None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in found:
            found.add(annotation)
            for field in annotation.model_fields.values():
                models_in(field.annotation, found)
        return
    for argument in typing.get_args(annotation):
        models_in(argument, found)


def allows_none(annotation: Any) -> bool:
    if annotation is Any or annotation is None or annotation is type(None):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return allows_none(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(allows_none(a) for a in typing.get_args(annotation))
    return False


def test_every_field_that_may_be_none_defaults_to_none() -> None:
    models: set[type[BaseModel]] = set()
    for record in STORED:
        models_in(record, models)
    assert Entry in models and len(models) > 10  # messages and their parts are reached too
    offenders = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if allows_none(field.annotation)
        and (field.is_required() or field.get_default(call_default_factory=True) is not None)
    ]
    assert offenders == []


def test_a_record_with_none_fields_round_trips() -> None:
    from harness_core.storage._sqlite import _json

    entry = Entry(
        id=5, conversation_id=1, kind="x.note", data={"kept": None}, head=None, by_task_id=None, seq=3
    )
    text = _json(entry)
    assert '"head"' not in text and '"kept":null' in text
    assert Entry.model_validate_json(text) == entry
