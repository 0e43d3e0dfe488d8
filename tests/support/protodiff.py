"""Wire-level comparison of two compiled protobuf APIs (FileDescriptorSets).

Everything here is pure: descriptors in, plain values out. The comparison looks only at what
decides the bytes on the wire and the gRPC routes: package, syntax, services and methods (names,
request/response types, streaming kinds), messages including nested ones and map entries,
fields (name, number, type, type name, label, oneof membership, proto3 ``optional``,
explicit ``packed``) and enums (value names and numbers). Comments, file names, declaration
order and options that do not change the encoding are ignored.

Typical use::

    diffs = diff_descriptor_sets(upstream_fds, our_fds, "runtime.v1")
    assert not diffs, "\\n".join(diffs)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from google.protobuf import descriptor_pb2

FieldProto = descriptor_pb2.FieldDescriptorProto

_TYPE_NAMES: dict[int, str] = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in FieldProto.Type.items()  # type: ignore[attr-defined]
}
_LABEL_NAMES: dict[int, str] = {
    value: name.removeprefix("LABEL_").lower()
    for name, value in FieldProto.Label.items()  # type: ignore[attr-defined]
}


@dataclass(frozen=True)
class MethodSig:
    """What identifies a gRPC method on the wire."""

    input_type: str
    output_type: str
    client_streaming: bool
    server_streaming: bool

    def describe(self) -> str:
        """Render as ``rpc (stream In) returns (Out)`` for error messages."""
        cs = "stream " if self.client_streaming else ""
        ss = "stream " if self.server_streaming else ""
        return f"({cs}{self.input_type}) returns ({ss}{self.output_type})"


@dataclass(frozen=True)
class FieldSig:
    """What identifies a message field on the wire (and in its generated accessors)."""

    number: int
    type: str
    type_name: str
    label: str
    oneof: str | None
    proto3_optional: bool
    packed: bool | None


@dataclass(frozen=True)
class MessageSig:
    """A message: its fields by name, its (non-synthetic and synthetic) oneofs, map-entry flag."""

    fields: Mapping[str, FieldSig]
    oneofs: tuple[str, ...]
    map_entry: bool


@dataclass(frozen=True)
class ApiView:
    """The wire-relevant content of one protobuf package, keyed by fully-qualified names."""

    syntax: tuple[str, ...]
    services: Mapping[str, Mapping[str, MethodSig]]
    messages: Mapping[str, MessageSig]
    enums: Mapping[str, Mapping[str, int]]


def method_sig(method: descriptor_pb2.MethodDescriptorProto) -> MethodSig:
    """Extract the wire signature of a method descriptor."""
    return MethodSig(
        input_type=method.input_type,
        output_type=method.output_type,
        client_streaming=method.client_streaming,
        server_streaming=method.server_streaming,
    )


def field_sig(field: FieldProto, oneof_names: tuple[str, ...]) -> FieldSig:
    """Extract the wire signature of a field; ``oneof_names`` are its message's oneofs."""
    oneof = oneof_names[field.oneof_index] if field.HasField("oneof_index") else None
    packed = field.options.packed if field.options.HasField("packed") else None
    return FieldSig(
        number=field.number,
        type=_TYPE_NAMES.get(field.type, str(field.type)),
        type_name=field.type_name,
        label=_LABEL_NAMES.get(field.label, str(field.label)),
        oneof=oneof,
        proto3_optional=field.proto3_optional,
        packed=packed,
    )


def message_sig(message: descriptor_pb2.DescriptorProto) -> MessageSig:
    """Extract the wire signature of one message (without its nested types)."""
    oneofs = tuple(o.name for o in message.oneof_decl)
    return MessageSig(
        fields={f.name: field_sig(f, oneofs) for f in message.field},
        oneofs=oneofs,
        map_entry=message.options.map_entry,
    )


def enum_values(enum: descriptor_pb2.EnumDescriptorProto) -> dict[str, int]:
    """Map each value name of an enum to its number."""
    return {v.name: v.number for v in enum.value}


def _walk_messages(
    prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """Yield ``(full_name, message)`` for messages and, recursively, their nested messages."""
    for message in messages:
        full = f"{prefix}.{message.name}"
        yield full, message
        yield from _walk_messages(full, message.nested_type)


def _walk_enums(
    prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]
) -> Iterator[tuple[str, descriptor_pb2.EnumDescriptorProto]]:
    """Yield ``(full_name, enum)`` for enums nested (at any depth) inside ``messages``."""
    for full, message in _walk_messages(prefix, messages):
        for enum in message.enum_type:
            yield f"{full}.{enum.name}", enum


def api_view(files: Iterable[descriptor_pb2.FileDescriptorProto], package: str) -> ApiView:
    """Collect the wire-relevant content of every file in ``files`` whose package is ``package``.

    Files of other packages (imports such as gogo.proto or descriptor.proto) are ignored.
    Names are fully qualified with a leading dot, as protoc writes ``type_name``.
    """
    syntax: list[str] = []
    services: dict[str, dict[str, MethodSig]] = {}
    messages: dict[str, MessageSig] = {}
    enums: dict[str, dict[str, int]] = {}
    for file in files:
        if file.package != package:
            continue
        syntax.append(file.syntax or "proto2")
        prefix = f".{package}" if package else ""
        for service in file.service:
            services[f"{prefix}.{service.name}"] = {m.name: method_sig(m) for m in service.method}
        for full, message in _walk_messages(prefix, file.message_type):
            messages[full] = message_sig(message)
        for enum in file.enum_type:
            enums[f"{prefix}.{enum.name}"] = enum_values(enum)
        for full, enum in _walk_enums(prefix, file.message_type):
            enums[full] = enum_values(enum)
    return ApiView(tuple(sorted(set(syntax))), services, messages, enums)


def _diff_keys(
    what: Callable[[str], str], upstream: Mapping[str, object], ours: Mapping[str, object]
) -> tuple[list[str], list[str]]:
    """Report keys missing from ``ours`` or extra in it; return (diffs, shared keys sorted).

    ``what`` renders a key for the message, e.g. ``lambda k: f"method {svc}/{k}"``.
    """
    missing = sorted(upstream.keys() - ours.keys())
    extra = sorted(ours.keys() - upstream.keys())
    diffs = [f"missing {what(k)} (upstream has it, ours does not)" for k in missing]
    diffs += [f"extra {what(k)} (ours has it, upstream does not)" for k in extra]
    return diffs, sorted(upstream.keys() & ours.keys())


def diff_services(
    upstream: Mapping[str, Mapping[str, MethodSig]], ours: Mapping[str, Mapping[str, MethodSig]]
) -> list[str]:
    """Differences between two ``{service: {method: MethodSig}}`` maps."""
    diffs, shared = _diff_keys(lambda k: f"service {k}", upstream, ours)
    for service in shared:
        method_diffs, methods = _diff_keys(
            lambda k, s=service: f"method {s}/{k}", upstream[service], ours[service]
        )
        diffs += method_diffs
        for name in methods:
            up, us = upstream[service][name], ours[service][name]
            if up != us:
                diffs.append(
                    f"method {service}/{name} differs: "
                    f"upstream {up.describe()}, ours {us.describe()}"
                )
    return diffs


def diff_fields(message: str, upstream: MessageSig, ours: MessageSig) -> list[str]:
    """Differences between the fields (and oneofs, map-entry flag) of one message."""
    diffs, shared = _diff_keys(lambda k: f"field {message}.{k}", upstream.fields, ours.fields)
    for name in shared:
        up, us = upstream.fields[name], ours.fields[name]
        for attr in FieldSig.__dataclass_fields__:
            a, b = getattr(up, attr), getattr(us, attr)
            if a != b:
                diffs.append(f"field {message}.{name} {attr} differs: upstream {a!r}, ours {b!r}")
    if sorted(upstream.oneofs) != sorted(ours.oneofs):
        diffs.append(
            f"message {message} oneofs differ: upstream {sorted(upstream.oneofs)}, "
            f"ours {sorted(ours.oneofs)}"
        )
    if upstream.map_entry != ours.map_entry:
        diffs.append(
            f"message {message} map_entry differs: upstream {upstream.map_entry}, "
            f"ours {ours.map_entry}"
        )
    return diffs


def diff_messages(upstream: Mapping[str, MessageSig], ours: Mapping[str, MessageSig]) -> list[str]:
    """Differences between two ``{message: MessageSig}`` maps (nested messages included)."""
    diffs, shared = _diff_keys(lambda k: f"message {k}", upstream, ours)
    for name in shared:
        diffs += diff_fields(name, upstream[name], ours[name])
    return diffs


def diff_enums(
    upstream: Mapping[str, Mapping[str, int]], ours: Mapping[str, Mapping[str, int]]
) -> list[str]:
    """Differences between two ``{enum: {value: number}}`` maps."""
    diffs, shared = _diff_keys(lambda k: f"enum {k}", upstream, ours)
    for enum in shared:
        value_diffs, values = _diff_keys(
            lambda k, e=enum: f"enum value {e}.{k}", upstream[enum], ours[enum]
        )
        diffs += value_diffs
        for value in values:
            a, b = upstream[enum][value], ours[enum][value]
            if a != b:
                diffs.append(f"enum value {enum}.{value} number differs: upstream {a}, ours {b}")
    return diffs


def diff_views(upstream: ApiView, ours: ApiView) -> list[str]:
    """All wire-level differences between two API views, as readable lines (empty = identical)."""
    diffs: list[str] = []
    if not upstream.syntax and not ours.syntax:
        diffs.append("package not found in either descriptor set")
    elif upstream.syntax != ours.syntax:
        diffs.append(f"syntax differs: upstream {list(upstream.syntax)}, ours {list(ours.syntax)}")
    diffs += diff_services(upstream.services, ours.services)
    diffs += diff_messages(upstream.messages, ours.messages)
    diffs += diff_enums(upstream.enums, ours.enums)
    return diffs


def diff_descriptor_sets(
    upstream: descriptor_pb2.FileDescriptorSet,
    ours: descriptor_pb2.FileDescriptorSet,
    package: str,
) -> list[str]:
    """All wire-level differences in ``package`` between two FileDescriptorSets."""
    return diff_views(api_view(upstream.file, package), api_view(ours.file, package))


def diff_subset(upstream: ApiView, ours: ApiView) -> list[str]:
    """Where ``ours`` is a subset of ``upstream`` (an API we only partly use, such as NRI's), every
    service method, message field and enum value ours declares must be upstream's on the wire;
    what upstream has beyond that is allowed (protobuf skips fields it does not know)."""
    diffs: list[str] = []
    if not ours.syntax or not upstream.syntax:
        diffs.append("package not found in one of the descriptor sets")
    elif upstream.syntax != ours.syntax:
        diffs.append(f"syntax differs: upstream {list(upstream.syntax)}, ours {list(ours.syntax)}")
    for service, methods in ours.services.items():
        for name, sig in methods.items():
            up = upstream.services.get(service, {}).get(name)
            if up is None:
                diffs.append(f"extra method {service}/{name} (ours has it, upstream does not)")
            elif up != sig:
                diffs.append(
                    f"method {service}/{name} differs: upstream {up.describe()}, ours {sig.describe()}"
                )
    for message, sig in ours.messages.items():
        up_message = upstream.messages.get(message)
        if up_message is None:
            diffs.append(f"extra message {message} (ours has it, upstream does not)")
            continue
        for name, field in sig.fields.items():
            up_field = up_message.fields.get(name)
            if up_field is None:
                diffs.append(f"extra field {message}.{name} (ours has it, upstream does not)")
                continue
            for attr in FieldSig.__dataclass_fields__:
                a, b = getattr(up_field, attr), getattr(field, attr)
                if a != b:
                    diffs.append(f"field {message}.{name} {attr} differs: upstream {a!r}, ours {b!r}")
        if sig.map_entry != up_message.map_entry:
            diffs.append(
                f"message {message} map_entry differs: upstream {up_message.map_entry}, ours {sig.map_entry}"
            )
    for enum, values in ours.enums.items():
        up_values = upstream.enums.get(enum)
        if up_values is None:
            diffs.append(f"extra enum {enum} (ours has it, upstream does not)")
            continue
        for value, number in values.items():
            if value not in up_values:
                diffs.append(f"extra enum value {enum}.{value} (ours has it, upstream does not)")
            elif up_values[value] != number:
                diffs.append(
                    f"enum value {enum}.{value} number differs: upstream {up_values[value]}, ours {number}"
                )
    return diffs
