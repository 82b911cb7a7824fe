"""Records: what ``@dataclass(frozen=True)`` gives, built without compiling code per class.

Why hand-written: ``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, ``__setattr__`` and ``__delattr__`` as source text and ``exec``s it: ~1.4 ms a
class on the project's machines, and ``specbind bind`` creates some sixty such classes before
its first work (two more per generated block module): most of its start-up cost beyond
``import numpy``. ``@record`` reads the annotations once and installs shared methods that look
the fields up in the class's ``__record__`` (a ``_Spec``): tens of microseconds a class.

What a record does, as a frozen dataclass does: fields in annotation order, a base record's
fields first (a subclass may give one a new default); ``__init__`` by position or keyword,
with defaults, ``field(default_factory=...)``, ``field(init=False)`` and ``__post_init__``;
``__repr__`` ``Name(a=1, b=2)`` over the ``repr`` fields; ``__eq__`` between instances of the
same class over the ``compare`` fields (as one tuple, so ``is`` short-cuts as in a tuple);
``__hash__`` of that tuple when frozen, none when not; ``__match_args__``. A method the class
body defines itself is kept. Assigning or deleting a field of a frozen record raises
``FrozenRecordError``, an ``AttributeError`` (``object.__setattr__`` in ``__post_init__`` still
works). ``replace`` and ``fields`` are this module's ``dataclasses.replace``/``fields``; and
``dataclasses.fields/replace/asdict/is_dataclass`` work on records too: ``__dataclass_fields__``
is built, importing ``dataclasses``, the first time something asks for it.

Traps: annotations are read as text (every module of the project has ``from __future__ import
annotations``): one that starts with ``ClassVar`` is not a field; ``InitVar`` and ``KW_ONLY``
are not supported. Making an instance costs what a dataclass's does when the call gives
every field by position or every field by keyword (the shared ``__init__``'s shortest paths);
a call that leaves fields to their defaults costs ~0.5 us more here (per-tensor planning ~5 us
either way); ``_refuse`` words every refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, NoReturn, TypeVar, dataclass_transform, overload

T = TypeVar("T")
C = TypeVar("C", bound=type)
R = TypeVar("R")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenRecordError(AttributeError):
    """A field of a frozen record was assigned or deleted (``dataclasses.FrozenInstanceError``)."""


class Field:
    """One field of a record: its name, default or default factory, and where it takes part."""

    __slots__ = ("compare", "default", "default_factory", "init", "name", "repr", "type")

    def __init__(
        self,
        default: Any = MISSING,
        default_factory: Any = MISSING,
        init: bool = True,
        repr: bool = True,
        compare: bool = True,
    ) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.type = ""
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return (
            f"Field(name={self.name!r}, type={self.type!r}, default={self.default!r}, "
            f"default_factory={self.default_factory!r}, init={self.init}, repr={self.repr}, "
            f"compare={self.compare})"
        )


@overload
def field(*, default: T, init: bool = True, repr: bool = True, compare: bool = True) -> T: ...
@overload
def field(
    *, default_factory: Callable[[], T], init: bool = True, repr: bool = True, compare: bool = True
) -> T: ...
@overload
def field(*, init: bool = True, repr: bool = True, compare: bool = True) -> Any: ...
def field(
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    init: bool = True,
    repr: bool = True,
    compare: bool = True,
) -> Any:
    """A field with a default, a default factory, or left out of ``__init__``, ``__repr__`` or
    the comparison (``dataclasses.field``)."""
    return Field(default, default_factory, init, repr, compare)


class _Spec:
    """A record class's fields, precomputed for the shared methods."""

    __slots__ = (
        "by_args", "dc_fields", "fields", "frozen", "init", "init_names", "init_set", "key", "n",
        "noinit", "plain", "post_init", "repr_fields", "required",
    )  # fmt: skip

    def __init__(self, fields: tuple[Field, ...], frozen: bool, post_init: bool) -> None:
        self.fields = fields
        self.frozen = frozen
        self.post_init = post_init
        init, noinit, shown, compared = [], [], [], []
        required = 0  # the fields without a default come first (as in a dataclass, see _make)
        for f in fields:
            bare = f.default is MISSING and f.default_factory is MISSING
            if f.init:
                init.append(f)
                required += bare
            elif not bare:
                noinit.append((f.name, f.default, f.default_factory))
            if f.repr:
                shown.append(f.name)
            if f.compare:
                compared.append(f.name)
        self.init = tuple(init)
        self.init_names = tuple([f.name for f in init])
        self.init_set = frozenset(self.init_names)
        self.n = len(init)
        self.required = required
        # by_args[k]: a call with k positional arguments, worked out on the first such call
        self.by_args: list[_ByArgs | None] = [None] * (self.n + 1)
        self.noinit = tuple(noinit)
        self.plain = not noinit and not post_init  # __init__ sets the arguments, and is done
        self.repr_fields = tuple(shown)
        self.key = _key(compared)
        self.dc_fields: dict[str, Any] | None = None

    def args(self, k: int) -> _ByArgs:
        """What a call with ``k`` positional arguments needs; ``0 <= k <= n``."""
        found = self.by_args[k]
        if found is None:
            names, rest = self.init_names, self.init[k:]
            # the fields the arguments fill; those without a default that keywords must give;
            # the other fields' defaults, and their default factories
            found = self.by_args[k] = (
                frozenset(names[:k]),
                frozenset(names[k : self.required]),
                {f.name: f.default for f in rest if f.default is not MISSING},
                tuple((f.name, f.default_factory) for f in rest if _has_factory(f)),
            )
        return found


_ByArgs = tuple[
    frozenset[str], frozenset[str], dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]
]


def _has_factory(f: Field) -> bool:
    return f.default_factory is not MISSING


def _key(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The compared fields of an instance as one tuple."""
    if len(names) >= 2:
        return attrgetter(*names)
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda o: (get(o),)
    return lambda o: ()


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    # zip without strict=: its keyword costs every call, and the lengths are checked first
    spec: _Spec = self.__record__
    n = len(args)
    if not kwargs and n == spec.n:  # every field by position
        self.__dict__.update(zip(spec.init_names, args))  # noqa: B905
        if spec.plain:
            return
    elif not n and len(kwargs) == spec.n and kwargs.keys() == spec.init_set:  # all by keyword
        self.__dict__.update(kwargs)
        if spec.plain:
            return
    elif not kwargs and spec.required <= n < spec.n:  # the rest from their defaults
        by = spec.by_args[n] or spec.args(n)
        d = self.__dict__
        d.update(zip(spec.init_names, args))  # noqa: B905
        d.update(by[2])
        for name, factory in by[3]:
            d[name] = factory()
    else:
        _keywords(self, spec, args, kwargs)
    if spec.noinit:
        d = self.__dict__
        for name, default, factory in spec.noinit:
            d[name] = default if factory is MISSING else factory()
    if spec.post_init:
        self.__post_init__()


def _keywords(self: Any, spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``_init`` for a call with keywords (or one to refuse)."""
    n = len(args)
    if n > spec.n:
        _refuse(type(self), spec, args, kwargs)
    heads, need, defaults, factories = spec.by_args[n] or spec.args(n)
    keys = kwargs.keys()
    if not (keys <= spec.init_set and need <= keys and keys.isdisjoint(heads)):
        _refuse(type(self), spec, args, kwargs)
    d = self.__dict__
    if n:
        d.update(zip(spec.init_names, args))  # noqa: B905
    d.update(defaults)
    d.update(kwargs)
    for name, factory in factories:
        if name not in kwargs:
            d[name] = factory()


def _refuse(cls: type, spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> NoReturn:
    """Refuse a call ``cls(*args, **kwargs)`` that does not fit the record's ``__init__``, as
    Python refuses one to a function (``TypeError``)."""
    who = f"{cls.__qualname__}.__init__()"
    names = spec.init_names
    if len(args) > len(names):
        raise TypeError(
            f"{who} takes {len(names) + 1} positional arguments but {len(args) + 1} were given"
        )
    for k in kwargs:
        if k in names[: len(args)]:
            raise TypeError(f"{who} got multiple values for argument {k!r}")
        if k not in spec.init_set:
            raise TypeError(f"{who} got an unexpected keyword argument {k!r}")
    missing = ", ".join(repr(k) for k in names[len(args) : spec.required] if k not in kwargs)
    raise TypeError(f"{who} missing required argument(s): {missing}")


def _repr(self: Any) -> str:
    names = self.__record__.repr_fields
    inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
    return f"{type(self).__qualname__}({inner})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = self.__record__.key
        return key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self.__record__.key(self))


def _setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenRecordError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise FrozenRecordError(f"cannot delete field {name!r}")


class _DataclassFields:
    """``__dataclass_fields__`` on first access: real ``dataclasses.Field`` objects, so the
    standard library's ``fields``, ``replace``, ``asdict`` and ``is_dataclass`` take records."""

    def __get__(self, obj: Any, owner: type) -> dict[str, Any]:
        spec: _Spec = owner.__record__  # type: ignore[attr-defined]
        if spec.dc_fields is None:
            import dataclasses

            def std(v: Any) -> Any:
                return dataclasses.MISSING if v is MISSING else v

            out = {}
            for f in spec.fields:
                d = dataclasses.field(
                    default=std(f.default), default_factory=std(f.default_factory),
                    init=f.init, repr=f.repr, compare=f.compare,
                )  # fmt: skip
                d.name, d.type = f.name, f.type
                d._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
                out[f.name] = d
            spec.dc_fields = out
        return spec.dc_fields


_DC_FIELDS = _DataclassFields()


_CLASSVAR = ("ClassVar", "typing.ClassVar", "t.ClassVar")


def _make(cls: C, frozen: bool) -> C:
    own = cls.__dict__
    fields: dict[str, Field] = {}
    for base in cls.__mro__[-2:0:-1]:  # the bases, the farthest first
        spec = base.__dict__.get("__record__")
        if spec is not None:
            fields.update([(f.name, f) for f in spec.fields])
    annotations = own.get("__annotations__", {})  # inspect.get_annotations: inspect is heavy
    for name, annotation in annotations.items():
        text = annotation if type(annotation) is str else repr(annotation)
        if text.startswith(_CLASSVAR):  # a class variable, not a field
            continue
        value = own.get(name, MISSING)
        if type(value) is Field:  # the class attribute becomes the default, or goes
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:  # the class attribute is the default already
            f = Field(value)
        f.name, f.type = name, annotation
        fields[name] = f  # an inherited field keeps its place
    ordered = tuple(fields.values())
    seen_default = False
    for f in ordered:
        if f.init:
            if f.default is MISSING and f.default_factory is MISSING:
                if seen_default:
                    raise TypeError(
                        f"{cls.__qualname__}: non-default argument {f.name!r} follows default"
                    )
            else:
                seen_default = True
    spec = cls.__record__ = _Spec(ordered, frozen, hasattr(cls, "__post_init__"))  # type: ignore[attr-defined]
    cls.__dataclass_fields__ = _DC_FIELDS  # type: ignore[attr-defined]
    cls.__match_args__ = spec.init_names  # type: ignore[attr-defined,misc]
    for name, method in (("__init__", _init), ("__repr__", _repr), ("__eq__", _eq)):
        if name not in own:
            setattr(cls, name, method)
    if frozen:
        for name, method in (("__setattr__", _setattr), ("__delattr__", _delattr)):
            if name in own:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
            setattr(cls, name, method)
        # as dataclasses: a __hash__ of the class's own is kept, unless it is the None that
        # Python sets for a class body that defines __eq__ alone
        explicit = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
        if not explicit:
            cls.__hash__ = _hash  # type: ignore[assignment]
    elif "__hash__" not in own:
        cls.__hash__ = None  # type: ignore[assignment]  # mutable and compared: unhashable
    return cls


@overload
def record(cls: C, /) -> C: ...
@overload
def record(*, frozen: bool = True) -> Callable[[C], C]: ...
@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(cls: C | None = None, /, *, frozen: bool = True) -> C | Callable[[C], C]:
    """``@record`` (frozen) or ``@record(frozen=False)``: the class as a dataclass."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order (``dataclasses.fields``)."""
    spec = getattr(obj, "__record__", None)
    if not isinstance(spec, _Spec):
        raise TypeError(f"{obj!r} is not a record class or instance")
    return spec.fields


def is_record(obj: Any) -> bool:
    return isinstance(getattr(obj, "__record__", None), _Spec)


def replace(obj: R, /, **changes: Any) -> R:
    """A copy of the record ``obj`` with ``changes`` (``dataclasses.replace``): built through
    ``__init__``, so defaults of ``init=False`` fields and ``__post_init__`` run again."""
    cls = type(obj)
    spec = getattr(cls, "__record__", None)
    if not isinstance(spec, _Spec) or isinstance(obj, type):
        raise TypeError("replace() should be called on record instances")
    if not changes.keys() <= spec.init_set:
        bad = sorted(set(changes) - spec.init_set)
        raise TypeError(f"{cls.__qualname__}: replace() got fields it cannot set: {bad}")
    values = {n: getattr(obj, n) for n in spec.init_names}
    values.update(changes)
    return cls(**values)
