"""Value classes and capability protocols that cost a job step nothing to import.

Every Pegasus job step starts the drop-in, so what its modules import is paid on every job:
``dataclasses`` imports ``inspect`` (and with it ``ast``, ``dis``, ``tokenize``, ``re``,
``enum``), ``typing`` is a large module of its own, and a ``runtime_checkable`` protocol
walks every member on every ``isinstance``. This module stands in for the three at run time:

* :func:`record` makes a frozen value class from a class's annotations, as
  ``dataclass(frozen=True)`` does (``__init__`` with defaults, ``__repr__``, ``__eq__``,
  ``__hash__``, ``__post_init__``, assignment refused); :func:`field` gives a default factory,
  or leaves a field out of ``repr``, ``==`` or ``hash``; :func:`replace` and :func:`fields`
  work on them. Its ``__init__`` binds arguments generically for the class's first instances
  and is generated (compiled) after those, or ahead by :func:`prepare`.
* :class:`Protocol` and :func:`runtime_checkable`: a capability whose ``isinstance`` checks
  that the class has every method (and attribute) the protocol names; the answer is cached
  per class by ``abc``, so a check on a hot path is one dictionary lookup.

Type checkers see ``dataclasses`` and ``typing`` themselves (the ``TYPE_CHECKING`` branch), so
the checked meaning is exactly theirs. Modules on the drop-in's path write
``TYPE_CHECKING = False`` and import ``typing`` names under it (annotations are strings with
``from __future__ import annotations``).
"""

from __future__ import annotations

import abc

# Instances of a record class bound generically before its ``__init__`` is generated.
GENERIC_INSTANCES = 32

__all__ = ["Buffer", "Headers", "Protocol", "asdict", "field", "fields", "logger", "prepare", "record", "replace",
           "runtime_checkable"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from dataclasses import asdict as asdict, dataclass as record, field as field, fields as fields, replace as replace
    from logging import Logger
    from typing import Protocol as Protocol, runtime_checkable as runtime_checkable

    def prepare(cls: type) -> bool: ...
else:
    _MISSING = object()

    class Field:
        """One field of a record: name, default (or factory), whether ``repr`` shows it, ``==``
        compares it and ``hash`` uses it (None: as ``compare``, as in ``dataclasses``)."""

        __slots__ = ("name", "default", "default_factory", "repr", "compare", "hash")

        def __init__(self, default=_MISSING, default_factory=_MISSING, repr=True, compare=True,  # noqa: A002
                     hash=None):  # noqa: A002
            self.name = ""
            self.default = default
            self.default_factory = default_factory
            self.repr = repr
            self.compare = compare
            self.hash = hash

    def field(*, default=_MISSING, default_factory=_MISSING, repr=True, compare=True, hash=None):  # noqa: A002
        return Field(default, default_factory, repr, compare, hash)

    def fields(cls_or_obj):
        return cls_or_obj.__record_fields__

    def asdict(obj):
        """The fields of a flat record as a dict (records here hold no nested records)."""
        return {f.name: getattr(obj, f.name) for f in obj.__record_fields__}

    def replace(obj, **changes):
        values = {f.name: getattr(obj, f.name) for f in obj.__record_fields__}
        values.update(changes)
        return type(obj)(**values)

    class FrozenInstanceError(AttributeError):
        """Assignment to a field of a frozen record."""

    def record(cls=None, *, frozen=False, eq=True):
        """``@record`` / ``@record(frozen=True)``: see the module docstring."""
        if cls is None:
            return lambda c: _build(c, frozen)
        return _build(cls, frozen)

    def _own_fields(cls):
        found = []
        for name in cls.__dict__.get("__annotations__", {}):
            value = cls.__dict__.get(name, _MISSING)
            spec = value if isinstance(value, Field) else Field(default=value)
            spec.name = name
            if isinstance(value, Field):
                if value.default is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, value.default)
            found.append(spec)
        return found

    def _build(cls, frozen):
        inherited = [f for base in cls.__mro__[-1:0:-1] for f in base.__dict__.get("__record_fields__", ())]
        by_name = {f.name: f for f in inherited}
        for spec in _own_fields(cls):
            by_name[spec.name] = spec
        specs = tuple(by_name.values())
        cls.__init__ = _deferred_init(cls, specs, frozen)
        cls.__record_fields__ = specs
        cls.__record_key__ = tuple(f.name for f in specs if f.compare)
        cls.__record_hash__ = tuple(f.name for f in specs if (f.compare if f.hash is None else f.hash))
        cls.__record_repr__ = tuple(f.name for f in specs if f.repr)
        cls.__match_args__ = tuple(f.name for f in specs)
        for name, method in (("__repr__", _repr), ("__eq__", _eq)):
            if name not in cls.__dict__:
                setattr(cls, name, method)
        if frozen:
            cls.__hash__ = _hash
            cls.__setattr__ = _refuse_set
            cls.__delattr__ = _refuse_delete
        elif "__hash__" not in cls.__dict__ or cls.__dict__["__hash__"] is None:
            cls.__hash__ = None
        return cls

    def _deferred_init(cls, specs, frozen):
        """Stands in for the generated ``__init__``: binds the first :data:`GENERIC_INSTANCES`
        instances generically (:func:`_bind`, the generated method's meaning), then generates
        it. A job step creates few instances of the record classes it uses, and generating a
        method costs a compile (about 0.25 ms each; a one-file job step used to compile ten);
        a batch of thousands of files gets the generated one, several times faster per instance."""
        names = frozenset(f.name for f in specs)
        defaulted = False
        for f in specs:  # refused when the class is made, as dataclasses does (the compile would be)
            if f.default is not _MISSING or f.default_factory is not _MISSING:
                defaulted = True
            elif defaulted:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
        made = [0]  # instances bound generically so far (a race costs a few more, never a wrong one)

        def generate():
            init = cls.__dict__["__init__"]
            if init is __init__:  # not yet generated (another thread may just have done it)
                init = _init(cls, specs, frozen)
                cls.__init__ = init
            return init

        def __init__(self, *args, **kwargs):
            if made[0] >= GENERIC_INSTANCES:
                generate()(self, *args, **kwargs)
                return
            made[0] += 1
            _bind(cls, specs, names, frozen, self, args, kwargs)

        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        __init__.__record_generate__ = generate
        return __init__

    def prepare(cls):
        """Generate now the ``__init__`` of record class ``cls`` (a process that forks copies
        to run jobs, the node stager, does it once for all of them); True when it was still
        to be generated, False for a generated one or a class that is not a record."""
        generate = getattr(cls.__dict__.get("__init__"), "__record_generate__", None)
        if generate is None:
            return False
        generate()
        return True

    def _bind(cls, specs, names, frozen, obj, args, kwargs):
        """What the generated ``__init__`` does, by a loop over the fields: positional then
        keyword arguments, defaults and default factories, the TypeErrors of a bad call, the
        frozen assignment, ``__post_init__``."""
        where = f"{cls.__qualname__}.__init__()"
        if len(args) > len(specs):
            least = sum(1 for f in specs if f.default is _MISSING and f.default_factory is _MISSING)
            takes = f"{len(specs) + 1}" if least == len(specs) else f"from {least + 1} to {len(specs) + 1}"
            raise TypeError(f"{where} takes {takes} positional arguments but {len(args) + 1} were given")
        for name in kwargs:
            if name not in names:
                raise TypeError(f"{where} got an unexpected keyword argument {name!r}")
        for f in specs[:len(args)]:
            if f.name in kwargs:
                raise TypeError(f"{where} got multiple values for argument {f.name!r}")
        missing = [f"{f.name!r}" for f in specs[len(args):] if f.name not in kwargs
                   and f.default is _MISSING and f.default_factory is _MISSING]
        if missing:
            listed = missing[0] if len(missing) == 1 else (
                f"{missing[0]} and {missing[1]}" if len(missing) == 2 else f"{', '.join(missing[:-1])}, and {missing[-1]}")
            raise TypeError(f"{where} missing {len(missing)} required positional argument"
                            f"{'s' if len(missing) > 1 else ''}: {listed}")
        assign = object.__setattr__ if frozen else setattr
        for position, f in enumerate(specs):
            if position < len(args):
                value = args[position]
            elif f.name in kwargs:
                value = kwargs[f.name]
            elif f.default_factory is not _MISSING:
                value = f.default_factory()
            else:
                value = f.default
            assign(obj, f.name, value)
        if hasattr(cls, "__post_init__"):
            obj.__post_init__()

    def _init(cls, specs, frozen):
        """The one generated method (as ``dataclasses`` does): a plain ``__init__`` is several
        times faster per instance than one that binds arguments generically."""
        scope = {"__object_setattr": object.__setattr__, "__missing": _MISSING}
        params, body = [], []
        for f in specs:
            if f.default_factory is not _MISSING:
                scope[f"__factory_{f.name}"] = f.default_factory
                params.append(f"{f.name}=__missing")
                value = f"__factory_{f.name}() if {f.name} is __missing else {f.name}"
            else:
                if f.default is not _MISSING:
                    scope[f"__default_{f.name}"] = f.default
                params.append(f.name if f.default is _MISSING else f"{f.name}=__default_{f.name}")
                value = f.name
            body.append(f"__object_setattr(self, {f.name!r}, {value})" if frozen else f"self.{f.name} = {value}")
        if hasattr(cls, "__post_init__"):
            body.append("self.__post_init__()")
        exec(f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body or ["pass"]), scope)  # noqa: S102
        init = scope["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        return init

    def _values(obj, names):
        return tuple([getattr(obj, name) for name in names])

    def _repr(self):
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
        return f"{type(self).__qualname__}({shown})"

    def _eq(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _values(self, self.__record_key__) == _values(other, self.__record_key__)

    def _hash(self):
        return hash(_values(self, self.__record_hash__))

    def _refuse_set(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def _refuse_delete(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    class _ProtocolMeta(abc.ABCMeta):
        def __instancecheck__(cls, instance):
            if not cls.__dict__.get("_is_protocol"):
                return super().__instancecheck__(instance)
            return cls.__subclasscheck__(type(instance)) and all(hasattr(instance, a) for a in cls._attributes)

    class Protocol(metaclass=_ProtocolMeta):
        """A capability: ``isinstance(x, P)`` is true when ``type(x)`` has all of ``P``'s methods
        (checked once per class) and ``x`` all of its annotated attributes."""

        __slots__ = ()
        _is_protocol = False
        _methods: "tuple[str, ...]" = ()
        _attributes: "tuple[str, ...]" = ()

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            cls._is_protocol = Protocol in cls.__bases__
            if cls._is_protocol:
                bases = [b for b in cls.__mro__[1:] if b.__dict__.get("_is_protocol")]
                methods = [m for b in bases for m in b._methods] + [
                    name for name in cls.__dict__ if not name.startswith("_")]
                attributes = [a for b in bases for a in b._attributes] + [
                    name for name in cls.__dict__.get("__annotations__", {}) if not name.startswith("_")]
                cls._methods = tuple(dict.fromkeys(methods))
                cls._attributes = tuple(dict.fromkeys(attributes))

        @classmethod
        def __subclasshook__(cls, other):
            if not cls.__dict__.get("_is_protocol"):
                return NotImplemented
            for name in cls._methods:
                if not any(name in base.__dict__ for base in other.__mro__):
                    return NotImplemented
            return True

    def runtime_checkable(cls):
        return cls


class _LazyLogger:
    """``logging.getLogger(name)``, imported on the first message: the modules that log only
    on rare paths (a cache that cannot be used, a bundle set aside) then cost a job nothing."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> object:
        import logging
        return getattr(logging.getLogger(self._name), attribute)


# Type aliases used at run time too (in signatures of modules that do not import typing):
# objects at run time, the real unions for type checkers.
if TYPE_CHECKING:
    from typing import List, Tuple, Union

    Buffer = Union[bytes, bytearray, memoryview]
    Headers = List[Tuple[str, str]]
else:
    Buffer = Headers = object


def logger(name: str) -> "Logger":
    """A stand-in for ``logging.getLogger(name)`` that imports ``logging`` when first used."""
    return _LazyLogger(name)  # type: ignore[return-value]
