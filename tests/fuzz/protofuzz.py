"""Random protobuf messages built from a message descriptor, for fuzzing the daemons' RPCs.

Every field may be set or left unset; scalars take edge values (0, -1, the type's
extremes, NaN, infinities), strings range from empty over unicode and NULs to
over-long ones, enums take values out of range (proto3 enums are open), nested
messages recurse to a bounded depth and repeated fields and maps occasionally
get far more entries than any limit allows. ``realistic`` strings (ids the
daemons know, slice names, profiles) are mixed in so that generated requests
also get past the first validation and reach deeper code.

Not covered: unknown fields and malformed wire bytes (gRPC and protobuf reject
those before a handler runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

Draw = Callable[[st.SearchStrategy[Any]], Any]

#: Largest nesting of messages generated below the request.
MAX_DEPTH = 3
#: A repeated field that is "huge" gets this many entries: past every count limit.
HUGE_COUNT = 5000
#: Realistic strings are drawn by an index modulo the pool's current size.
POOL_INDEXES = 1024

_INT_EDGES = {
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2**64 - 1),
}

_ODD_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "../../etc/passwd",
    "é" * 300,
    "\U0001f680" * 50,
    "x" * 129,
    "y" * 5000,
    "z" * 70_000,
    "\ud7ff\ue000",
    "-1",
    "1e309",
]


def strings(realistic: Sequence[str], wild: bool) -> st.SearchStrategy[str]:
    """Known-good words and short text; in ``wild`` mode as often odd strings (empty, NUL,
    unicode, over-long), else one time in ten."""
    # An index rather than sampled_from: the pool grows as replies teach ids, and the
    # strategy's shape must not change between examples.
    known = st.integers(min_value=0, max_value=POOL_INDEXES - 1).map(
        lambda i: realistic[i % len(realistic)] if realistic else ""
    )
    tame = st.one_of(st.text(max_size=12), known)
    odd = st.sampled_from(_ODD_STRINGS)
    return _mix(tame, odd, 5 if wild else 1)


def _mix(
    tame: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], odd_in_ten: int
) -> st.SearchStrategy[Any]:
    """``odd`` with probability ``odd_in_ten``/10, else ``tame``."""
    return st.integers(min_value=0, max_value=9).flatmap(
        lambda roll: odd if roll < odd_in_ten else tame
    )


def _scalar(field: FieldDescriptor, realistic: Sequence[str], wild: bool) -> st.SearchStrategy[Any]:
    odd_in_ten = 5 if wild else 1
    cpp = field.cpp_type
    if cpp in _INT_EDGES:
        low, high = _INT_EDGES[cpp]
        return _mix(
            st.integers(min_value=max(low, -3), max_value=min(high, 70)),
            st.one_of(
                st.sampled_from([low, high, max(low, 0), min(high, 1 << 20)]),
                st.integers(min_value=low, max_value=high),
            ),
            odd_in_ten,
        )
    if cpp in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        return _mix(
            st.floats(min_value=0, max_value=100),
            st.one_of(
                st.sampled_from([-0.0, -1.0, 1e-9, 1e12, 1e300, -1e300]),
                st.floats(
                    allow_nan=True,
                    allow_infinity=True,
                    width=32 if cpp == FieldDescriptor.CPPTYPE_FLOAT else 64,
                ),
            ),
            odd_in_ten,
        )
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return st.booleans()
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return _mix(st.sampled_from(known), st.integers(min_value=-3, max_value=40), odd_in_ten)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return _mix(st.binary(max_size=16), st.just(b"\xff" * 70_000), odd_in_ten)
    return strings(realistic, wild)


def fill_message(
    draw: Draw, message: Message, realistic: Sequence[str], wild: bool, depth: int = 0
) -> Message:
    """Set a random subset of ``message``'s fields (in place) and return it. ``wild``
    makes odd values common; otherwise most requests are plausible and reach deeper code."""
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        is_repeated = bool(field.is_repeated)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _fill_map(draw, message, field, realistic, wild)
        elif field.message_type is not None:
            if depth >= MAX_DEPTH:
                continue
            if is_repeated:
                container = getattr(message, field.name)
                for _ in range(draw(st.integers(min_value=0, max_value=3))):
                    fill_message(draw, container.add(), realistic, wild, depth + 1)
            else:
                fill_message(draw, getattr(message, field.name), realistic, wild, depth + 1)
                getattr(message, field.name).SetInParent()
        elif is_repeated:
            container = getattr(message, field.name)
            if wild and draw(st.integers(min_value=0, max_value=9)) == 0:
                value = draw(_scalar(field, realistic, wild))
                container.extend([value] * HUGE_COUNT)
            else:
                container.extend(draw(st.lists(_scalar(field, realistic, wild), max_size=4)))
        else:
            setattr(message, field.name, draw(_scalar(field, realistic, wild)))
    return message


def _fill_map(
    draw: Draw, message: Message, field: FieldDescriptor, realistic: Sequence[str], wild: bool
) -> None:
    key_field = field.message_type.fields_by_name["key"]
    value_field = field.message_type.fields_by_name["value"]
    target = getattr(message, field.name)
    if wild and draw(st.integers(min_value=0, max_value=9)) == 0:
        for i in range(HUGE_COUNT // 10):
            target[f"K{i}"] = "v"
        return
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        key = draw(_scalar(key_field, realistic, wild))
        if value_field.message_type is not None:
            fill_message(draw, target[key], realistic, wild, MAX_DEPTH)
        else:
            target[key] = draw(_scalar(value_field, realistic, wild))
