"""The shape of ``save.json``, written by ``ckptprof synth save`` and read by ``report`` and
``compare``: one definition, so the writer and the reader cannot drift apart."""

from __future__ import annotations

from ckptprof import schema

SAVE_NAME = "save.json"
#: bumped when a field changes meaning; a reader refuses a newer one it cannot read
SAVE_SCHEMA_VERSION = 1

_SECONDS = schema.number(minimum=0)
_COUNT = schema.integer(0)
_RECORD = schema.record(
    {
        "repeat": _COUNT,
        "wall_s": _SECONDS,
        "bytes": _COUNT,
        "phases": schema.mapping(schema.text(), _SECONDS),
        "fsync": schema.boolean(),
        "trace_id": schema.text(),
        "strategy": schema.text(),
        "background_s": schema.optional(_SECONDS),
        "rank": schema.optional(_COUNT),
        "ranks": schema.integer(1),
    },
    required=("wall_s", "bytes", "phases"),
)
#: what a save.json holds (unknown keys allowed)
SAVE_SCHEMA = schema.record(
    {
        "schema_version": schema.integer(1, SAVE_SCHEMA_VERSION),
        "spec": schema.record({}),
        "options": schema.record({}),
        "environment": schema.record({}),
        "ceiling": schema.record(
            {"write_gbps": schema.optional(_SECONDS), "source": schema.optional(schema.text())}
        ),
        "saves": schema.items(_RECORD),
        "partial": schema.boolean(),  # the saves an interruption (Ctrl-C, SIGTERM) left
    },
    required=("saves",),
)


def looks_like_save(doc: object) -> bool:
    """A decoded JSON document that is a save.json (its ``saves`` list)."""
    return isinstance(doc, dict) and isinstance(doc.get("saves"), list)


__all__ = ["SAVE_NAME", "SAVE_SCHEMA", "SAVE_SCHEMA_VERSION", "looks_like_save"]
