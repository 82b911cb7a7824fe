"""``core.record``: a record behaves as the frozen dataclass it replaces (the class is built
without compiled code; instances, equality, hashing, repr, immutability and the standard
library's dataclass functions are the same)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Generic, TypeVar

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.core.record import FrozenRecordError, field, fields, is_record, record, replace

T = TypeVar("T")


@record
class Rec:
    a: int
    b: str
    c: tuple[int, ...] = ()
    d: list[int] = field(default_factory=list, compare=False)
    e: int | None = field(default=None, repr=False)
    LIMIT: ClassVar[int] = 3


@dataclasses.dataclass(frozen=True)
class Dc:
    a: int
    b: str
    c: tuple[int, ...] = ()
    d: list[int] = dataclasses.field(default_factory=list, compare=False)
    e: int | None = dataclasses.field(default=None, repr=False)
    LIMIT: ClassVar[int] = 3


CALLS = [
    ((1, "x"), {}),
    ((1, "x", (2,), [3], 4), {}),
    ((), {"a": 1, "b": "x"}),
    ((), {"b": "x", "a": 1, "e": 5}),
    ((1,), {"b": "x", "d": [1]}),
    ((1, "x", (7,)), {"e": 2}),
]
BAD_CALLS = [
    ((), {}),
    ((1,), {}),
    ((1, "x", (), [], 4, 5), {}),
    ((1, "x"), {"a": 2}),
    ((1, "x"), {"f": 2}),
    ((), {"b": "x"}),
    ((1, "x"), {"LIMIT": 2}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_a_record_is_built_from_the_same_calls_as_a_frozen_dataclass(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    r, d = Rec(*args, **kwargs), Dc(*args, **kwargs)  # type: ignore[arg-type]
    assert repr(r).replace("Rec(", "Dc(") == repr(d)
    assert [getattr(r, f.name) for f in fields(r)] == [
        getattr(d, f.name) for f in dataclasses.fields(d)
    ]


@pytest.mark.parametrize(("args", "kwargs"), BAD_CALLS)
def test_a_record_refuses_the_calls_a_frozen_dataclass_refuses(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    with pytest.raises(TypeError):
        Dc(*args, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Rec\.__init__\(\)"):
        Rec(*args, **kwargs)  # type: ignore[arg-type]


@given(
    st.integers(-3, 3), st.sampled_from(["x", "y"]), st.integers(-3, 3),
    st.sampled_from(["x", "y"]), st.lists(st.integers(), max_size=2),
)  # fmt: skip
@settings(max_examples=examples(1), deadline=None)
def test_a_record_is_frozen_and_hashable_like_a_frozen_dataclass(
    a1: int, b1: str, a2: int, b2: str, d: list[int]
) -> None:
    r1, r2 = Rec(a1, b1), Rec(a2, b2, d=d)
    d1, d2 = Dc(a1, b1), Dc(a2, b2, d=d)
    assert (r1 == r2) == (d1 == d2)  # d is left out of the comparison in both
    assert (r1 != r2) == (d1 != d2)
    assert hash(r1) == hash(d1) and hash(r2) == hash(d2)  # the hash of the compared tuple
    assert len({r1, r2}) == len({d1, d2})
    assert r1 != d1  # another class is never equal, even with the same fields
    for victim in (r1, d1):
        with pytest.raises(AttributeError, match="cannot assign to field 'a'"):
            victim.a = 5  # type: ignore[misc]
        with pytest.raises(AttributeError, match="cannot delete field 'b'"):
            del victim.b  # type: ignore[misc]
    with pytest.raises(FrozenRecordError):
        r1.z = 1  # type: ignore[attr-defined]


def test_a_default_factory_makes_a_new_value_for_each_instance() -> None:
    one, two = Rec(1, "x"), Rec(1, "x")
    assert one.d == [] and one.d is not two.d
    assert Rec.c == () and not hasattr(Rec, "d")  # as a dataclass leaves the class attributes
    assert Rec.LIMIT == 3 and [f.name for f in fields(Rec)] == ["a", "b", "c", "d", "e"]


@record
class Checked:
    lo: int
    hi: int
    span: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError(f"{self.lo} > {self.hi}")
        object.__setattr__(self, "span", self.hi - self.lo)


def test_post_init_runs_after_the_fields_are_set_and_may_set_an_init_false_field() -> None:
    c = Checked(2, 5)
    assert c.span == 3 and repr(c) == "Checked(lo=2, hi=5)"
    assert Checked(2, 5) == Checked(hi=5, lo=2)
    with pytest.raises(ValueError, match="6 > 5"):
        Checked(6, 5)
    with pytest.raises(TypeError):
        Checked(1, 2, 3)  # type: ignore[call-arg]
    assert replace(c, hi=9).span == 7  # built again: __post_init__ runs on the copy
    with pytest.raises(ValueError, match="9 > 5"):
        replace(c, lo=9)


@record
class Base:
    x: int
    y: int = 0


@record
class Child(Base):
    z: str = "z"
    y: int = 7  # a new default for an inherited field keeps its place


def test_a_subclass_record_extends_its_base_fields_in_order() -> None:
    assert [f.name for f in fields(Child)] == ["x", "y", "z"]
    assert Child(1) == Child(1, 7, "z") and repr(Child(1)) == "Child(x=1, y=7, z='z')"
    assert Child(1) != Base(1, 7)  # another class
    assert isinstance(Child(1), Base)


def test_a_field_without_a_default_after_one_with_a_default_is_refused() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default"):

        @record
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]


@record
class Box(Generic[T]):
    value: T
    label: str = ""


def test_a_generic_record_is_built_through_its_alias_and_stays_frozen() -> None:
    b = Box[int](3)  # typing sets __orig_class__, which a frozen record refuses quietly
    assert b == Box(3) and b.value == 3 and hash(b) == hash(Box(3, ""))
    assert not hasattr(b, "__orig_class__")


@record(frozen=False)
class Tally:
    names: list[str] = field(default_factory=list)
    count: int = 0


def test_a_mutable_record_can_be_assigned_and_is_not_hashable() -> None:
    t = Tally()
    t.count += 1
    t.names.append("a")
    assert t == Tally(["a"], 1)
    with pytest.raises(TypeError, match="unhashable"):
        hash(t)


def test_replace_and_fields_are_the_dataclass_functions_and_the_stdlib_ones_take_records() -> None:
    r = Rec(1, "x", (2,))
    assert replace(r, b="y") == Rec(1, "y", (2,))
    assert dataclasses.replace(r, b="y") == Rec(1, "y", (2,))
    assert dataclasses.is_dataclass(r) and is_record(r) and is_record(Rec)
    assert not is_record(Dc(1, "x"))
    assert dataclasses.asdict(r) == dataclasses.asdict(Dc(1, "x", (2,)))
    assert [f.name for f in dataclasses.fields(Checked)] == ["lo", "hi", "span"]
    with pytest.raises(TypeError, match="cannot set"):
        replace(r, nope=1)
    with pytest.raises(TypeError, match="cannot set"):
        replace(Checked(1, 2), span=4)  # an init=False field, as dataclasses.replace refuses
    with pytest.raises(TypeError):
        replace(Rec, a=1)  # type: ignore[type-var]


def test_a_record_class_is_built_without_compiling_code() -> None:
    """dataclasses compiles each class's methods (what made start-up slow); a record's
    methods are the ones shared by every record."""
    assert Rec.__init__ is Box.__init__ and Rec.__repr__ is Child.__repr__
    assert Rec.__eq__ is Tally.__eq__ and Rec.__hash__ is Checked.__hash__


def test_a_record_survives_pickle_and_deepcopy_as_an_equal_frozen_copy() -> None:
    import copy
    import pickle

    r = Rec(1, "x", (2,), [3])
    for again in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r), copy.copy(r)):
        assert again == r and again.d == [3] and type(again) is Rec
        with pytest.raises(FrozenRecordError):
            again.a = 2  # type: ignore[misc]
