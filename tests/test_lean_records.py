"""transfer.lean.record's two ways of binding an instance: generically (a class's first
GENERIC_INSTANCES instances, no compile) and by its generated ``__init__`` (after those, or
after ``prepare``): the same fields, the same defaults and factories, the same TypeErrors, the
same frozen refusal and ``__post_init__``."""

from __future__ import annotations

from typing import Callable, List, Optional

import pytest

from transfer.lean import GENERIC_INSTANCES, field, fields, prepare, record

CALLS = [
    ((1, "b"), {}),
    ((1,), {"b": "kw"}),
    ((), {"a": 2, "b": "both kw", "c": 7}),
    ((3, "b", None, 2.5, ["given"]), {}),
    ((4, "b"), {"e": ["kw factory"], "d": 1.0}),
]
BAD_CALLS = [
    ((1, "b", 2, 3.0, [], "extra"), {}),
    ((1, "b"), {"nope": 1}),
    ((1, "b"), {"a": 1}),
    ((), {"b": "no a"}),
    ((), {}),
]


def make_class() -> type:
    @record(frozen=True)
    class Sample:
        a: int
        b: str
        c: Optional[int] = None
        d: float = 0.0
        e: List[str] = field(default_factory=list)

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative a")

    return Sample


def values(obj: object) -> tuple:
    return tuple((f.name, getattr(obj, f.name)) for f in fields(obj))


def test_generic_and_generated_instances_are_the_same() -> None:
    generic, generated = make_class(), make_class()
    assert prepare(generated) is True
    for args, kwargs in CALLS:
        one, other = generic(*args, **kwargs), generated(*args, **kwargs)
        assert values(one) == values(other)
        assert repr(one).split("(", 1)[1] == repr(other).split("(", 1)[1]
    first, second = generic(1, "b"), generic(1, "b")
    assert first.e == [] and first.e is not second.e  # a fresh default per instance
    assert prepare(generic) is True  # still generic: fewer than GENERIC_INSTANCES made


def make_required() -> type:
    @record
    class Three:
        x: int
        y: int
        z: int

    return Three


@pytest.mark.parametrize("make,args,kwargs", [(make_class, args, kwargs) for args, kwargs in BAD_CALLS] + [
    (make_required, args, kwargs) for args, kwargs in [((1, 2, 3, 4), {}), ((), {}), ((1,), {}), ((1, 2), {"x": 1})]])
def test_a_bad_call_is_the_same_type_error_both_ways(make: Callable[[], type], args: tuple, kwargs: dict) -> None:
    generic, generated = make(), make()
    prepare(generated)
    with pytest.raises(TypeError) as from_generic:
        generic(*args, **kwargs)
    with pytest.raises(TypeError) as from_generated:
        generated(*args, **kwargs)
    assert str(from_generic.value) == str(from_generated.value)


def test_post_init_and_frozen_hold_for_generic_instances() -> None:
    cls = make_class()
    with pytest.raises(ValueError, match="negative a"):
        cls(-1, "b")
    obj = cls(1, "b")
    with pytest.raises(AttributeError, match="cannot assign"):
        obj.a = 2  # type: ignore[misc]
    assert values(obj) == (("a", 1), ("b", "b"), ("c", None), ("d", 0.0), ("e", []))


def test_the_init_is_generated_after_the_generic_instances() -> None:
    cls = make_class()
    deferred = cls.__dict__["__init__"]
    for n in range(GENERIC_INSTANCES):
        cls(n, "b")
    assert cls.__dict__["__init__"] is deferred
    cls(GENERIC_INSTANCES, "b")
    assert cls.__dict__["__init__"] is not deferred and prepare(cls) is False
    assert values(cls(5, "x", e=["y"])) == (("a", 5), ("b", "x"), ("c", None), ("d", 0.0), ("e", ["y"]))


def test_a_required_field_after_a_default_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="non-default argument 'late' follows default argument"):
        @record
        class Bad:
            early: int = 0
            late: int


def test_a_field_left_out_of_hash_is_still_compared_as_in_dataclasses() -> None:
    import dataclasses

    @record(frozen=True)
    class Lean:
        name: str
        tags: Optional[dict] = field(default=None, hash=False)

    @dataclasses.dataclass(frozen=True)
    class Stock:
        name: str
        tags: Optional[dict] = dataclasses.field(default=None, hash=False)

    for cls in (Lean, Stock):  # an unhashable value hashes; == still tells the values apart
        assert hash(cls("a", {"x": "1"})) == hash(cls("a", {"y": "2"})) == hash(cls("a"))
        assert cls("a", {"x": "1"}) == cls("a", {"x": "1"}) != cls("a", {"y": "2"})
