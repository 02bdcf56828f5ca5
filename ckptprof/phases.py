"""The phase vocabulary shared by the synthetic runner and every framework adapter.

See DESIGN.md §1: RTO runs from "restore starts" to "first training step after
restore finished", and is made of the six restore phases below, in this order.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """A named slice of a save or a restore; spans are called ``ckpt.<value>``."""

    # restore
    LIST = "list"
    FETCH = "fetch"
    VERIFY = "verify"
    DESERIALIZE = "deserialize"
    RESHARD = "reshard"
    FIRST_STEP = "first_step"
    # save
    SERIALIZE = "serialize"
    WRITE = "write"
    UPLOAD = "upload"
    COMMIT = "commit"
    # interruption
    NOTICE = "notice"
    EMERGENCY_SAVE = "emergency_save"

    @property
    def span_name(self) -> str:
        return f"ckpt.{self.value}"


RESTORE_PHASES: tuple[Phase, ...] = (
    Phase.LIST,
    Phase.FETCH,
    Phase.VERIFY,
    Phase.DESERIALIZE,
    Phase.RESHARD,
    Phase.FIRST_STEP,
)
SAVE_PHASES: tuple[Phase, ...] = (Phase.SERIALIZE, Phase.WRITE, Phase.UPLOAD, Phase.COMMIT)

RESTORE_SPAN = "ckpt.restore"
#: the steps after a resume compared with those before its save (linked to the restore)
AFTER_RESUME_SPAN = "ckpt.after_resume"
SAVE_SPAN = "ckpt.save"
FILE_SPAN = "ckpt.file"


class Attr:
    """Span attribute keys (the ``ckpt.`` namespace of DESIGN.md §2)."""

    BYTES = "ckpt.bytes"
    FILES = "ckpt.files"
    BUSY_S = "ckpt.busy_s"
    FILE_LATENCY_MIN_S = "ckpt.file.latency.min_s"
    FILE_LATENCY_MEDIAN_S = "ckpt.file.latency.median_s"
    FILE_LATENCY_MAX_S = "ckpt.file.latency.max_s"
    THROUGHPUT_GBPS = "ckpt.throughput_gbps"
    CONCURRENCY = "ckpt.concurrency"
    STORAGE_KIND = "ckpt.storage.kind"
    STORAGE_URI = "ckpt.storage.uri"
    FORMAT = "ckpt.format"
    STRATEGY = "ckpt.strategy"  # how the state was restored (synthetic) or parallelised
    CACHE = "ckpt.cache"
    CACHE_RESIDENT_FRACTION = "ckpt.cache.resident_fraction"
    CACHE_METHOD = "ckpt.cache.method"
    RETRIES = "ckpt.retries"
    ERRORS = "ckpt.errors"
    RANK = "ckpt.rank"
    WORLD_SIZE = "ckpt.world_size"
    SAVED_WORLD_SIZE = "ckpt.saved_world_size"
    STEP = "ckpt.step"
    RESTORED_STEP = "ckpt.restored_step"  # the training step the checkpoint was saved at
    FRAMEWORK = "ckpt.framework"
    RUN_ID = "ckpt.run_id"
    EMULATED = "ckpt.emulated"
    EMULATION_REASON = "ckpt.emulation_reason"
    VERIFY_MODE = "ckpt.verify.mode"
    VERIFY_OF_BYTES = "ckpt.verify.of_bytes"  # bytes of the files verified: coverage's whole
    MODEL = "ckpt.model"
    LAYOUT = "ckpt.layout"
    REPEAT = "ckpt.repeat"
    PATH = "ckpt.path"
    CHECKPOINT_BYTES = "ckpt.checkpoint_bytes"  # what the checkpoint holds (read amplification)
    PHASE_SUM_S = "ckpt.phase_sum_s"
    WALL_S = "ckpt.wall_s"
