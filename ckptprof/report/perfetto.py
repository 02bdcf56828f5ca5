"""Traces as a Perfetto timeline (ui.perfetto.dev, or ``trace_processor``): each rank a
process, each phase and each stream of file reads a thread, every save, restore, phase
(each busy piece of a phase that ran in pieces) and file read a slice with its ``ckpt.*``
attributes as arguments.

Written with the ``perfetto`` package's own protobuf classes (``TrackEvent`` packets,
native format, offline). A thread's slices must never overlap, so each track's slices are
laid out in as many lanes as overlap at once (a background save beside a restore, the
reads in flight).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES, Attr
from ckptprof.report.timeline import Slice, Timeline, pack_lanes

SEQUENCE_ID = 1  # one writer: every packet is on the same trusted sequence


def _tracks(lines: Sequence[Timeline]) -> dict[tuple[str, int], dict[str, list[Slice]]]:
    """Per process (host, rank): base track name → its slices."""
    tracks: dict[tuple[str, int], dict[str, list[Slice]]] = defaultdict(lambda: defaultdict(list))
    for line in lines:
        process = tracks[(line.host, line.rank)]
        attrs = {**line.attributes, Attr.TRACE_ID: line.trace_id}
        process["operation"].append(
            Slice(line.label(), line.start_ns, line.end_ns, 0, attrs, phase=line.kind)
        )
        for phase in line.phases:  # where it was busy: a phase in pieces, a slice each
            process[f"phase {phase.name}"] += [
                Slice(phase.name, s, e, 0, phase.attributes) for s, e in phase.busy()
            ]
        for item in line.files:
            process[f"{item.phase} reads"].append(item)
    return tracks


def _annotate(event, attributes: dict[str, Any]) -> None:
    for key, value in sorted(attributes.items()):
        note = event.debug_annotations.add()
        note.name = key
        if isinstance(value, bool):
            note.bool_value = value
        elif isinstance(value, int) and -(2**63) <= value < 2**63:
            note.int_value = value
        elif isinstance(value, float):
            note.double_value = value
        else:
            note.string_value = str(value)


def perfetto_trace(lines: Sequence[Timeline]) -> bytes:
    """The serialized Perfetto ``Trace`` of ``lines`` (see the module docstring)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    uuid = iter(range(1, 2**62))
    tid = iter(range(1, 2**31))
    order = ["operation", *(f"phase {p.value}" for p in (*RESTORE_PHASES, *SAVE_PHASES))]
    for pid, ((host, rank), tracks) in enumerate(sorted(_tracks(lines).items()), start=1):
        process_uuid = next(uuid)
        packet = builder.add_packet()
        packet.track_descriptor.uuid = process_uuid
        packet.track_descriptor.process.pid = pid
        packet.track_descriptor.process.process_name = f"rank {rank} ({host})"
        names = sorted(tracks, key=lambda n: (order.index(n) if n in order else len(order), n))
        for name in names:
            for index, lane in enumerate(pack_lanes(tracks[name])):
                track_uuid = next(uuid)
                packet = builder.add_packet()
                packet.track_descriptor.uuid = track_uuid
                packet.track_descriptor.parent_uuid = process_uuid
                packet.track_descriptor.thread.pid = pid
                packet.track_descriptor.thread.tid = next(tid)
                packet.track_descriptor.thread.thread_name = (
                    name if index == 0 else f"{name} {index + 1}"
                )
                for item in lane:
                    begin = builder.add_packet()
                    begin.timestamp = item.start_ns
                    begin.trusted_packet_sequence_id = SEQUENCE_ID
                    begin.track_event.type = TrackEvent.TYPE_SLICE_BEGIN
                    begin.track_event.track_uuid = track_uuid
                    begin.track_event.name = item.name
                    _annotate(begin.track_event, item.attributes)
                    end = builder.add_packet()
                    end.timestamp = item.end_ns
                    end.trusted_packet_sequence_id = SEQUENCE_ID
                    end.track_event.type = TrackEvent.TYPE_SLICE_END
                    end.track_event.track_uuid = track_uuid
    return builder.serialize()


__all__ = ["perfetto_trace"]
