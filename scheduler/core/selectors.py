"""Kubernetes label selectors and node selector terms, matched exactly as the API machinery does.

- ``Requirement``: one ``key operator values`` test on a label set (``In``, ``NotIn``, ``Exists``,
  ``DoesNotExist``, and for node selectors ``Gt`` / ``Lt``, which compare the label as a base-10
  int64 and never match a label that is not one);
- ``LabelSelector``: ``matchLabels`` + ``matchExpressions``, ANDed. A missing (``null``) selector
  matches nothing, an empty one (``{}``) everything (``metav1.LabelSelectorAsSelector``);
- ``NodeSelectorTerm``: ``matchExpressions`` on the node's labels AND ``matchFields`` on its
  ``metadata.name``; an empty term matches nothing, and a term that does not parse (a bad label
  value, ``Gt`` with a non-integer) matches nothing instead of failing the pod, as kube-scheduler's
  lazy node selector does; ``NodeSelector`` ORs its terms.

``parse_label_selector`` and ``parse_node_selector_term`` read the API's JSON form; what cannot be
read raises ``SelectorError`` with a message naming the field.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_NAME_RE = re.compile(_NAME)
_VALUE_RE = re.compile(f"({_NAME})?")
_DNS1123_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INT_RE = re.compile(r"[+-]?[0-9]+")
NODE_NAME_FIELD = "metadata.name"


class SelectorError(ValueError):
    """A selector or term that cannot be parsed; the message names the offending part."""


class Op(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


LABEL_OPS = frozenset({Op.IN, Op.NOT_IN, Op.EXISTS, Op.DOES_NOT_EXIST})
NODE_OPS = LABEL_OPS | {Op.GT, Op.LT}
FIELD_OPS = frozenset({Op.IN, Op.NOT_IN})


def valid_label_key(key: str) -> bool:
    """A qualified name: ``[prefix/]name``, the prefix a DNS subdomain of at most 253 characters,
    the name at most 63 alphanumerics, ``-``, ``_``, ``.``, beginning and ending alphanumeric."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_RE.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _NAME_RE.fullmatch(name) is not None


def valid_label_value(value: str) -> bool:
    """At most 63 characters, empty or alphanumeric at both ends with ``-``, ``_``, ``.`` inside."""
    return len(value) <= 63 and _VALUE_RE.fullmatch(value) is not None


def parse_int64(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it, or None."""
    if not _INT_RE.fullmatch(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


@dataclass(frozen=True)
class Requirement:
    """``key op values`` on a label set (built by ``Requirement.parse``, which validates it)."""

    key: str
    op: Op
    values: frozenset[str] = frozenset()
    number: int = 0  # the value of Gt / Lt

    @classmethod
    def parse(cls, key: Any, op: Any, values: Any, allowed: frozenset[Op] = NODE_OPS) -> Requirement:
        """A validated requirement (``labels.NewRequirement``'s rules); raise ``SelectorError``."""
        if not isinstance(key, str) or not valid_label_key(key):
            raise SelectorError(f"invalid label key {key!r}")
        try:
            operator = Op(op)
        except ValueError:
            operator = None
        if operator is None or operator not in allowed:
            names = ", ".join(sorted(allowed))
            raise SelectorError(f"{key}: operator {op!r} is not one of {names}")
        if values is None:
            values = []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"{key}: values must be a list of strings")
        number = 0
        if operator in (Op.IN, Op.NOT_IN) and not values:
            raise SelectorError(f"{key} {operator}: values must not be empty")
        if operator in (Op.EXISTS, Op.DOES_NOT_EXIST) and values:
            raise SelectorError(f"{key} {operator}: values must be empty")
        if operator in (Op.GT, Op.LT):
            parsed = parse_int64(values[0]) if len(values) == 1 else None
            if parsed is None:
                raise SelectorError(f"{key} {operator}: needs exactly one integer value, got {values}")
            number = parsed
        for v in values:
            if not valid_label_value(v):
                raise SelectorError(f"{key} {operator}: invalid label value {v!r}")
        return cls(key, operator, frozenset(values), number)

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.op
        if op is Op.IN:
            return self.key in labels and labels[self.key] in self.values
        if op is Op.NOT_IN:
            return self.key not in labels or labels[self.key] not in self.values
        if op is Op.EXISTS:
            return self.key in labels
        if op is Op.DOES_NOT_EXIST:
            return self.key not in labels
        if self.key not in labels:
            return False
        value = parse_int64(labels[self.key])
        if value is None:
            return False
        return value > self.number if op is Op.GT else value < self.number

    def __str__(self) -> str:
        if self.op in (Op.EXISTS, Op.DOES_NOT_EXIST):
            return f"{self.key} {self.op}"
        return f"{self.key} {self.op} [{','.join(sorted(self.values))}]"


@dataclass(frozen=True)
class LabelSelector:
    """Requirements ANDed; ``nothing`` is the selector of a missing (null) LabelSelector."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    @property
    def empty(self) -> bool:
        """Matches every label set (``{}``)."""
        return not self.requirements and not self.nothing

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        return all(r.matches(labels) for r in self.requirements)

    def merged(self, labels: Mapping[str, str], keys: Iterable[str], negate: bool = False) -> LabelSelector:
        """This selector AND ``key In [labels[key]]`` (``NotIn`` if ``negate``) for each of ``keys``
        the label set has (``matchLabelKeys`` / ``mismatchLabelKeys``); a nothing-selector stays one."""
        extra = tuple(
            Requirement(k, Op.NOT_IN if negate else Op.IN, frozenset({labels[k]}))
            for k in keys
            if k in labels
        )
        if self.nothing or not extra:
            return self
        return LabelSelector(self.requirements + extra)


EVERYTHING = LabelSelector()
NOTHING = LabelSelector(nothing=True)


@dataclass(frozen=True)
class NodeSelectorTerm:
    """Label expressions AND ``metadata.name`` fields. ``error`` set: the term did not parse and
    matches nothing (kube-scheduler's lazy errors for required node affinity)."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()
    error: str = ""

    @property
    def empty(self) -> bool:
        return not self.expressions and not self.fields and not self.error

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        if self.error or self.empty:
            return False
        if not all(r.matches(labels) for r in self.expressions):
            return False
        if self.fields and node_name:
            fields = {NODE_NAME_FIELD: node_name}
            return all(r.matches(fields) for r in self.fields)
        return True


@dataclass(frozen=True)
class NodeSelector:
    """Terms ORed; no terms (or only empty ones) match no node."""

    terms: tuple[NodeSelectorTerm, ...] = ()

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        return any(t.matches(node_name, labels) for t in self.terms)


# -- parsing the API's JSON ---------------------------------------------------------------------


def _expressions(raw: Any, allowed: frozenset[Op], where: str) -> tuple[Requirement, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SelectorError(f"{where} must be a list")
    out = []
    for i, expr in enumerate(raw):
        if not isinstance(expr, Mapping):
            raise SelectorError(f"{where}[{i}] must be an object")
        try:
            out.append(Requirement.parse(expr.get("key"), expr.get("operator"), expr.get("values"), allowed))
        except SelectorError as error:
            raise SelectorError(f"{where}[{i}]: {error}") from None
    return tuple(out)


def parse_label_selector(raw: Any, where: str = "labelSelector") -> LabelSelector:
    """A ``metav1.LabelSelector`` (``None``: matches nothing; ``{}``: everything)."""
    if raw is None:
        return NOTHING
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{where} must be an object")
    match_labels = raw.get("matchLabels")
    if match_labels is None:
        match_labels = {}
    if not isinstance(match_labels, Mapping):
        raise SelectorError(f"{where}.matchLabels must be an object")
    reqs = []
    for key, value in sorted(match_labels.items()):
        if not isinstance(value, str):
            raise SelectorError(f"{where}.matchLabels[{key}] must be a string")
        try:
            reqs.append(Requirement.parse(key, Op.IN, [value], LABEL_OPS))
        except SelectorError as error:
            raise SelectorError(f"{where}.matchLabels: {error}") from None
    reqs.extend(_expressions(raw.get("matchExpressions"), LABEL_OPS, f"{where}.matchExpressions"))
    return LabelSelector(tuple(reqs))


def _field_requirements(raw: Any, where: str) -> tuple[Requirement, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SelectorError(f"{where} must be a list")
    out = []
    for i, expr in enumerate(raw):
        if not isinstance(expr, Mapping):
            raise SelectorError(f"{where}[{i}] must be an object")
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values")
        if key != NODE_NAME_FIELD:
            raise SelectorError(f"{where}[{i}]: only the field {NODE_NAME_FIELD} is supported, not {key!r}")
        if op not in FIELD_OPS:
            raise SelectorError(f"{where}[{i}]: operator {op!r} is not one of In, NotIn")
        if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
            raise SelectorError(f"{where}[{i}]: {NODE_NAME_FIELD} {op} needs exactly one value")
        out.append(Requirement(NODE_NAME_FIELD, Op(op), frozenset(values)))
    return tuple(out)


def parse_node_selector_term(
    raw: Any, where: str = "nodeSelectorTerm", lazy: bool = False
) -> NodeSelectorTerm:
    """A ``v1.NodeSelectorTerm``. With ``lazy`` a term that does not parse is returned with its
    ``error`` set (it then matches nothing) instead of raising."""
    try:
        if raw is None:
            return NodeSelectorTerm()
        if not isinstance(raw, Mapping):
            raise SelectorError(f"{where} must be an object")
        return NodeSelectorTerm(
            _expressions(raw.get("matchExpressions"), NODE_OPS, f"{where}.matchExpressions"),
            _field_requirements(raw.get("matchFields"), f"{where}.matchFields"),
        )
    except SelectorError as error:
        if not lazy:
            raise
        return NodeSelectorTerm(error=str(error))
