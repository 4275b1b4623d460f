"""Declarative validation of what users write: fabric specs, transport settings, scenarios and the
endpoint's config all describe their fields as :class:`Rule` s and are checked by one function.

A :class:`Rule` says what a value may be (type, range, choices, an extra check) and, from that,
how to say what is allowed. :func:`check_mapping` checks a mapping against rules and
:func:`build` a frozen dataclass whose fields carry their rule in ``metadata["rule"]`` (see
:func:`rule`). Neither stops at the first problem: each one is added to a :class:`Problems`, and
the caller raises once with every problem of the file (``Problems.raise_if_any``), each naming
the file, the field and what is allowed::

    x.yaml: field 'planes' = 0; allowed: an integer from 1 to 16; unknown field(s) spines; ...
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from mrclab.topologies.errors import BadInput

T = TypeVar("T")
_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
               dict: "a mapping", type(None): "null"}


class Problems:
    """Every problem found in one input (``source``: the file or what stands for it)."""

    def __init__(self, source: str) -> None:
        """No problems yet, for ``source``."""
        self.source = source
        self.items: list[str] = []

    def add(self, text: str) -> None:
        """Record one problem (the text of one already recorded is not added twice)."""
        if text not in self.items:
            self.items.append(text)

    def __bool__(self) -> bool:
        """True when any problem was found."""
        return bool(self.items)

    def __len__(self) -> int:
        """The number of problems found."""
        return len(self.items)

    def raise_if_any(self, exc: type[BadInput] = BadInput) -> None:
        """Raise ``exc`` with every problem on one line, the source first."""
        if self.items:
            raise exc(f"{self.source}: " + "; ".join(self.items))


@dataclass(frozen=True)
class Rule:
    """What one field may hold.

    ``kind``: the Python type(s) a value must have (``float`` also takes an int; ``bool`` is never
    an int here). ``lo``/``hi``: inclusive bounds; ``positive``: above 0 (``lo`` exclusive at 0).
    ``choices``: the allowed values. ``check(value)``: an extra test returning the problem text (no
    field name) or None. ``allowed``: the text after "allowed:", derived from the rest when empty.
    ``required``: the field must be present.
    """

    kind: type | tuple[type, ...] = object
    lo: float | None = None
    hi: float | None = None
    positive: bool = False
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None
    allowed: str = ""
    required: bool = False
    doc: str = ""

    def describe(self) -> str:
        """The text after "allowed:": ``allowed`` when set, else the choices, else the kind and its
        bounds ("an integer from 1 to 16")."""
        if self.allowed:
            return self.allowed
        if self.choices is not None:
            return ", ".join(str(c) for c in self.choices)
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        word = " or ".join(_TYPE_WORDS.get(k, k.__name__) for k in kinds if k is not object) or "a value"
        if self.positive and self.hi is None:
            return f"a positive {word.removeprefix('an ').removeprefix('a ')}"
        if self.lo is not None and self.hi is not None:
            return f"{word} from {_num(self.lo)} to {_num(self.hi)}"
        if self.lo is not None:
            return f"{word} of at least {_num(self.lo)}"
        if self.hi is not None:
            return f"{word} of at most {_num(self.hi)}"
        return word

    def coerce(self, value: Any) -> tuple[Any, bool]:
        """(value as the field holds it, True) or (value, False) when it is not allowed."""
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        if self.choices is not None:
            return value, any(value == c and type(value) is type(c) for c in self.choices)
        if object not in kinds:
            if isinstance(value, bool) and bool not in kinds:
                return value, False
            if float in kinds and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kinds):
                return value, False
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.positive and not value > 0:
                return value, False
            if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
                return value, False
        return value, True


def rule(**kw: Any) -> dict[str, Rule]:
    """Dataclass field metadata carrying a :class:`Rule`: ``field(default=16, metadata=rule(lo=1))``.
    The kind defaults to the type of the field's default."""
    return {"rule": Rule(**kw)}


def _num(x: float) -> str:
    return f"{int(x):,}".replace(",", "") if float(x).is_integer() else f"{x:g}"


def _label(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def suggest(name: str, names: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for a near miss among ``names``, else ''."""
    near = difflib.get_close_matches(str(name), [str(n) for n in names], n=1, cutoff=0.75)
    return f" (did you mean {near[0]!r}?)" if near else ""


def check_value(value: Any, r: Rule, label: str, problems: Problems, *, quote: str = "{label} = {value!r}") -> Any:
    """The value, coerced, or None with a problem added ("``label`` = value; allowed: ...")."""
    v, ok = r.coerce(value)
    if ok and r.check is not None:
        why = r.check(v)
        if why:
            problems.add(f"{quote.format(label=label, value=value)}: {why}")
            return None
    if not ok:
        problems.add(f"{quote.format(label=label, value=value)}; allowed: {r.describe()}")
        return None
    return v


def unknown_keys(data: Mapping, allowed: Iterable[str], where: str, problems: Problems, prefix: str = "") -> None:
    """Adds "``where``: unknown field(s) a, b; allowed: ..." (or "unknown field(s) ``prefix``a"
    when ``where`` is empty), with a "did you mean" for a single near miss."""
    allowed = list(allowed)
    bad = sorted(str(k) for k in set(data) - set(allowed))
    if bad:
        hint = suggest(bad[0], allowed) if len(bad) == 1 else ""
        lead = f"{where}: " if where else ""
        names = ", ".join(prefix + b for b in bad)
        problems.add(f"{lead}unknown field(s) {names}; allowed: {', '.join(sorted(allowed))}{hint}")


def check_mapping(data: Any, rules: Mapping[str, Rule], where: str, problems: Problems,
                  *, quote: str = "{label} = {value!r}", prefix: str = "") -> dict[str, Any]:
    """Check ``data`` against ``rules``: unknown keys, required keys, every value. Returns the valid
    values (coerced); every problem goes to ``problems``. Fields are labelled ``where.key``, or
    ``prefix + key`` when ``where`` is empty."""
    if not isinstance(data, Mapping):
        problems.add(f"{where or prefix.rstrip('.') or 'the file'}: a mapping of fields, got {type(data).__name__}")
        return {}
    unknown_keys(data, rules, where, problems, prefix)
    out: dict[str, Any] = {}
    for key, r in rules.items():
        label = _label(where, key) if where else prefix + key
        if key not in data:
            if r.required:
                problems.add(f"{label}: missing; allowed: {r.describe()}")
            continue
        v = check_value(data[key], r, label, problems, quote=quote)
        if v is not None:
            out[key] = v
    return out


def field_rules(cls: type) -> dict[str, Rule]:
    """The rule of every init field of dataclass ``cls`` (kind from its default when not given)."""
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        r = f.metadata.get("rule")
        if r is None:
            r = Rule()
        if r.kind is object and f.default is not dataclasses.MISSING and f.default is not None:
            r = dataclasses.replace(r, kind=type(f.default))
        out[f.name] = r
    return out


def build(cls: type[T], data: Any, where: str, problems: Problems, *, prefix: str = "", **fixed: Any) -> T | None:
    """An instance of dataclass ``cls`` from ``data`` checked against its fields' rules, or None
    when a problem was found (added to ``problems``). ``fixed`` fields are set as given; labels as
    in :func:`check_mapping`."""
    rules = {k: r for k, r in field_rules(cls).items() if k not in fixed}
    n = len(problems)
    kw = check_mapping(data, rules, where, problems, prefix=prefix)
    if len(problems) > n:
        return None
    return cls(**kw, **fixed)
