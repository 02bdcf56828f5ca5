"""The phase vocabulary shared by the synthetic runner and every framework adapter.

See docs/design.md §2: RTO runs from "restore starts" to "first training step after
restore finished", and is made of the six restore phases below, in this order.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

#: the prefix of every span name and attribute key ckptprof writes
NAMESPACE = "ckpt."


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
    STAGE = "stage"  # an async save's blocking copy into its background writer's buffers
    SERIALIZE = "serialize"
    WRITE = "write"
    FSYNC = "fsync"  # written bytes forced to the device
    COMMIT = "commit"
    # interruption
    NOTICE = "notice"
    EMERGENCY_SAVE = "emergency_save"

    @property
    def span_name(self) -> str:
        return NAMESPACE + self.value


RESTORE_PHASES: tuple[Phase, ...] = (
    Phase.LIST,
    Phase.FETCH,
    Phase.VERIFY,
    Phase.DESERIALIZE,
    Phase.RESHARD,
    Phase.FIRST_STEP,
)
SAVE_PHASES: tuple[Phase, ...] = (
    Phase.STAGE,
    Phase.SERIALIZE,
    Phase.WRITE,
    Phase.FSYNC,
    Phase.COMMIT,
)

RESTORE_SPAN = "ckpt.restore"
#: the steps after a resume compared with those before its save (linked to the restore)
AFTER_RESUME_SPAN = "ckpt.after_resume"
SAVE_SPAN = "ckpt.save"
FILE_SPAN = "ckpt.file"
#: the interrupted run's root: its ``ckpt.notice`` and ``ckpt.emergency_save`` are children
INTERRUPTION_SPAN = "ckpt.interruption"
#: one process of a job, from its start to its adapter's close: its steps (goodput)
RUN_SPAN = "ckpt.run"
#: an event on a phase's span: no progress for a while (ckptprof.tracing.watchdog)
STALL_EVENT = "ckpt.stall"
#: an event on rank 0's open operation: another rank still inside a phase the rest left
STRAGGLER_EVENT = "ckpt.straggler"
#: an open save's or restore's in-progress record, a child of its root (which a process
#: killed mid-operation never writes): what the report shows as cut short
PROGRESS_SPAN = "ckpt.progress"
#: one busy stretch of a phase that ran in pieces, a child of the phase's span (whose own
#: span runs from its first start to its last end)
PIECE_SPAN = "ckpt.piece"


def _phase_value(phase: str | Phase) -> str:
    return phase.value if isinstance(phase, Phase) else str(phase)


def span_name(phase: str | Phase) -> str:
    """The span of a phase, known (``Phase``) or an adapter's own (``rotate``)."""
    return NAMESPACE + _phase_value(phase)


class Attr:
    """Span attribute keys (the ``ckpt.`` namespace of docs/design.md §3)."""

    # ---- restore / save root (one operation: ``ckpt.restore``, ``ckpt.save``)
    FRAMEWORK = "ckpt.framework"  # who recorded it: synthetic, lightning, transformers, …
    RUN_ID = "ckpt.run_id"  # the run; with REPEAT (and STEP) it groups the ranks of one restore
    REPEAT = "ckpt.repeat"
    STEP = "ckpt.step"  # a save's training step; a restore's: the step its first step reached
    RESTORED_STEP = "ckpt.restored_step"  # the training step the checkpoint was saved at
    WALL_S = "ckpt.wall_s"  # the operation's wall time (the RTO of a restore)
    PHASE_SUM_S = "ckpt.phase_sum_s"  # the sum of its phases' BUSY_S (above WALL_S: overlap)
    OUTSIDE_S = "ckpt.outside_s"  # the time no phase interval covers (tracing/sampling.py)
    OUTSIDE_NAMED_S = "ckpt.outside.named_s"  # of it, sampled with a function on top
    OUTSIDE_FUNCTIONS = "ckpt.outside.functions"  # the functions that took most: "f (file:line)"
    OUTSIDE_FUNCTION_S = "ckpt.outside.function_s"  # their seconds, in that order
    OUTSIDE_SAMPLE_EVERY_S = "ckpt.outside.sample_every_s"  # how often the stack was looked at
    RTO_ENDS_AT = "ckpt.rto.ends_at"  # what the RTO ends with where no first step ran
    RESTORE_CEILING_GBPS = "ckpt.restore.ceiling_gbps"  # synth restore: its read ceiling
    FORMAT = "ckpt.format"
    LAYOUT = "ckpt.layout"
    MODEL = "ckpt.model"
    STRATEGY = "ckpt.strategy"  # how the state was restored (synthetic) or parallelised
    CONCURRENCY = "ckpt.concurrency"  # requests in flight the reader was allowed
    PATH = "ckpt.path"  # the checkpoint's path (a ``ckpt.file`` span: the file's)
    CHECKPOINT_BYTES = "ckpt.checkpoint_bytes"  # what the checkpoint holds (read amplification)
    STATE_BYTES = "ckpt.state_bytes"  # the bytes of the state the restore built
    RETRIES = "ckpt.retries"  # storage requests retried
    ERRORS = "ckpt.errors"  # storage attempts that failed
    REQUESTS = "ckpt.requests"  # storage requests made
    LINK = "ckpt.link"  # on a span link: why it links (saved_by, interrupted_by)
    TRACE_ID = "ckpt.trace_id"  # an export's slice argument: the trace it came from

    # ---- storage and page cache (root)
    STORAGE_KIND = "ckpt.storage.kind"  # posix, s3, …
    STORAGE_URI = "ckpt.storage.uri"
    CACHE = "ckpt.cache"  # cold | hot | mixed: the page cache before the restore
    CACHE_RESIDENT_FRACTION = "ckpt.cache.resident_fraction"  # of the checkpoint, before
    CACHE_METHOD = "ckpt.cache.method"  # how the cache state was made (posix_fadvise, read)

    # ---- any phase span (``ckpt.<phase>``)
    BUSY_S = "ckpt.busy_s"  # union of the phase's active intervals (not first-to-last)
    BYTES = "ckpt.bytes"
    FILES = "ckpt.files"
    FILE_LATENCY_MIN_S = "ckpt.file.latency.min_s"
    FILE_LATENCY_MEDIAN_S = "ckpt.file.latency.median_s"
    FILE_LATENCY_MAX_S = "ckpt.file.latency.max_s"
    THROUGHPUT_GBPS = "ckpt.throughput_gbps"  # BYTES / BUSY_S, in GB/s
    #: the phase ran in pieces: this many ``ckpt.piece`` children, one per busy stretch
    PIECES = "ckpt.pieces"
    PIECES_INTERVALS = "ckpt.pieces.intervals"  # the busy stretches there were
    PIECES_CAPPED = "ckpt.pieces.capped"  # true: more than the cap, the closest joined
    PIECE_OF = "ckpt.piece.of"  # a ``ckpt.piece``: the phase it is a stretch of
    EMULATED = "ckpt.emulated"  # the phase's time is an estimate, not a measurement
    EMULATION_REASON = "ckpt.emulation_reason"
    #: the phases that ran as this one interval, joined with "+", optionally a space and a
    #: parenthesised detail: "fetch+deserialize (the reader's own)",
    #: "deserialize+reshard (dcp.load)"; read it with :func:`fused_phases`
    FUSED = "ckpt.fused"

    # ---- the restore's loader (a framework's or library's reader)
    LOADER = "ckpt.loader"  # the library that read the checkpoint
    LOADER_VERSION = "ckpt.loader.version"
    LOADER_CONCURRENCY = "ckpt.loader.concurrency"
    LOADER_PART_SIZE = "ckpt.loader.part_size"  # bytes per request
    LOADER_STREAMED_S = "ckpt.loader.streamed_s"  # the loader's own streaming time

    # ---- list
    LIST_REQUESTS = "ckpt.list.requests"  # storage requests the listing made

    # ---- fetch
    #: the loader reads pages on demand (mmap): the fetch interval only warms the cache and
    #: some reads happen later, inside deserialize (so its GB/s is no storage rate)
    FETCH_LAZY = "ckpt.fetch.lazy"
    FETCH_DIRECT_IO = "ckpt.fetch.direct_io"  # read with O_DIRECT (page cache bypassed)
    FETCH_SLOWEST_REQUEST_S = "ckpt.fetch.slowest_request_s"  # the longest single request
    FETCH_SLOWEST_REQUEST = "ckpt.fetch.slowest_request"  # what that request read
    FETCH_REPEATED_READS = "ckpt.fetch.repeated_reads"  # files read more than once
    FETCH_REPEATED_BYTES = "ckpt.fetch.repeated_bytes"  # the bytes of those second reads
    FETCH_STAGE_DIR = "ckpt.fetch.stage_dir"  # staged strategy: the local copy's folder
    FETCH_STAGE_DOWNLOAD_S = "ckpt.fetch.stage_download_s"  # staged: storage → local copy
    FETCH_STAGE_READ_S = "ckpt.fetch.stage_read_s"  # staged: local copy → memory
    # the request planner's decision (ckptprof.io.requests)
    FETCH_REQUESTS = "ckpt.fetch.requests"  # storage requests the read plan made
    FETCH_REQUEST_BYTES = "ckpt.fetch.request_bytes"  # bytes those requests asked for
    FETCH_READ_BEYOND_BYTES = "ckpt.fetch.read_beyond_bytes"  # asked for beyond the needed ranges

    # ---- verify
    VERIFY_MODE = "ckpt.verify.mode"  # full | sample | size | none
    VERIFY_OF_BYTES = "ckpt.verify.of_bytes"  # bytes of the files verified: coverage's whole
    VERIFY_METHOD = "ckpt.verify.method"  # what was checked against (record, zip directory)
    VERIFY_PROBLEM = "ckpt.verify.problem"  # the first problem found
    VERIFY_PROBLEMS = "ckpt.verify.problems"  # how many were found
    VERIFY_WEIGHTS_CONVERTED = "ckpt.verify.weights_converted"  # weight files converted first

    # ---- deserialize
    DESERIALIZE_WHAT = "ckpt.deserialize.what"  # what was parsed (e.g. each file's index)

    # ---- reshard
    RESHARD_INCLUDES = "ckpt.reshard.includes"  # other work inside the interval
    RESHARD_PLACED_BY_READS_BYTES = "ckpt.reshard.placed_by_reads_bytes"  # placed while read

    # ---- first_step
    FIRST_STEP_SOURCE = "ckpt.first_step.source"  # measured, estimated or the user's
    FIRST_STEP_ESTIMATE_S = "ckpt.first_step.estimate_s"
    FIRST_STEP_ESTIMATE_REASON = "ckpt.first_step.estimate_reason"
    FIRST_STEP_SETUP_S = "ckpt.first_step.setup_s"  # the loop's start-up
    FIRST_STEP_BATCH_S = "ckpt.first_step.batch_s"  # the first batch's fetch
    FIRST_STEP_COMPUTE_S = "ckpt.first_step.compute_s"  # the rest: forward, backward, step
    FIRST_STEP_BATCH_IDX = "ckpt.first_step.batch_idx"
    FIRST_STEP_BATCH_INCLUDES = "ckpt.first_step.batch_includes"  # what batch_s also holds
    FIRST_STEP_SKIPPED_BATCHES = "ckpt.first_step.skipped_batches"  # data skipped to resume
    FIRST_STEP_FIRST_IN_PROCESS = "ckpt.first_step.first_in_process"  # pays one-time set-up
    FIRST_STEP_TOKENS = "ckpt.first_step.tokens"  # the synthetic step's batch x sequence

    # ---- a stall (``ckpt.stall`` events on the phase that was open)
    STALL_IDLE_S = "ckpt.stall.idle_s"  # seconds without progress when it was said
    STALL_MESSAGE = "ckpt.stall.message"  # the warning's text
    STALL_STACKS = "ckpt.stall.stacks"  # every thread's Python stack
    STALL_WARNING = "ckpt.stall.warning"  # 1 for the first warning of the stall, then 2, …
    STRAGGLER_RANK = "ckpt.straggler.rank"  # the rank the rest of the job waits on
    STRAGGLER_PHASE = "ckpt.straggler.phase"  # the phase it is still in

    # ---- an open operation's in-progress record (``ckpt.progress``, with its root's keys)
    PROGRESS_OF = "ckpt.progress.of"  # restore | save
    PROGRESS_REASON = "ckpt.progress.reason"  # phase (one began or ended), stall, bytes
    PROGRESS_ELAPSED_S = "ckpt.progress.elapsed_s"  # since the operation began
    PROGRESS_OPEN_PHASE = "ckpt.progress.open_phase"  # the latest begun of those open now
    PROGRESS_PHASES = "ckpt.progress.phases"  # the phases begun so far, in order
    PROGRESS_PHASE_BUSY_S = "ckpt.progress.phase_busy_s"  # their busy seconds so far
    PROGRESS_BYTES = "ckpt.progress.bytes"  # moved so far
    PROGRESS_IN_FLIGHT = "ckpt.progress.in_flight"  # storage requests in flight now
    PROGRESS_WAITING_ON = "ckpt.progress.waiting_on"  # the oldest of them: its file or object

    # ---- a process of the job (``ckpt.run``: the goodput report's input)
    RUN_PID = "ckpt.run.pid"
    RUN_STEPS = "ckpt.run.steps"  # steps timed (from the first step end seen)
    RUN_STEP_S = "ckpt.run.step_s"  # their seconds, less the saves and restores inside
    RUN_STEP_MEDIAN_S = "ckpt.run.step_median_s"  # without a background save running
    RUN_BACKGROUND_STEPS = "ckpt.run.background_steps"  # while a background save wrote
    RUN_BACKGROUND_STEP_S = "ckpt.run.background_step_s"
    RUN_FIRST_STEP = "ckpt.run.first_step"  # the global step the timing began at
    RUN_LAST_STEP = "ckpt.run.last_step"  # the last step this process trained
    RUN_FINAL = "ckpt.run.final"  # false: written at a save, the process went on after
    RUN_JOB = "ckpt.run.job"  # the job across its restarts: its checkpoint folder, or run id

    # ---- save (root ``ckpt.save`` and its phases)
    SAVE_BACKGROUND = "ckpt.save.background"  # the background half of an async save
    SAVE_FSYNC = "ckpt.save.fsync"  # synth save: every file forced to the device first
    SAVE_DIRECT_IO = "ckpt.save.direct_io"  # parallel: written with O_DIRECT (no page cache)
    SAVE_CEILING_GBPS = "ckpt.save.ceiling_gbps"  # synth save: its write ceiling (probed)
    SAVE_STEP_MEDIAN_S = "ckpt.save.step_median_s"  # training steps before this save
    WRITE_ASYNC = "ckpt.write.async"  # write is only the blocking part of an async write
    COMMIT_WAITS_FOR_WRITER = "ckpt.commit.waits_for_writer"
    ROTATE_LIMIT = "ckpt.rotate.limit"  # save_total_limit
    ROTATE_REMOVED = "ckpt.rotate.removed"  # old checkpoints deleted

    # ---- after the resume (``ckpt.after_resume``, linked to the restore; its keys join it)
    BEFORE_SAVE_STEP_MEDIAN_S = "ckpt.before_save.step_median_s"  # steps before its save
    AFTER_RESUME_STEPS = "ckpt.after_resume.steps"
    AFTER_RESUME_STEP_MEDIAN_S = "ckpt.after_resume.step_median_s"
    AFTER_RESUME_BEFORE_SAVE_STEP_MEDIAN_S = "ckpt.after_resume.before_save_step_median_s"
    AFTER_RESUME_SLOWDOWN = "ckpt.after_resume.slowdown"  # step after / step before

    # ---- interruption (``ckpt.interruption``, ``ckpt.notice`` and the linked restore)
    INTERRUPTION_SOURCE = "ckpt.interruption.source"  # who gave notice (aws, gcp, signal, peer)
    INTERRUPTION_RUN_ID = "ckpt.interruption.run_id"
    INTERRUPTION_STEP = "ckpt.interruption.step"  # the training step at the notice
    INTERRUPTION_DETAIL = "ckpt.interruption.detail"
    INTERRUPTION_DEADLINE_S = "ckpt.interruption.deadline_s"  # notice → the deadline
    INTERRUPTION_DEADLINE_ASSUMED = "ckpt.interruption.deadline_assumed"
    INTERRUPTION_OUTCOME = "ckpt.interruption.outcome"  # of the emergency save
    INTERRUPTION_CHECKPOINT_STEP = "ckpt.interruption.checkpoint_step"  # the step it saved
    INTERRUPTION_MARGIN_S = "ckpt.interruption.margin_s"  # save end → deadline (< 0: late)
    #: when the notice came (ISO, as span times), from the record: the resumed restore has
    #: it where the interrupted process, killed, left no span
    INTERRUPTION_NOTICE_AT = "ckpt.interruption.notice_at"
    INTERRUPTION_LAST_STEP = "ckpt.interruption.last_step"  # the last step it trained (record)
    INTERRUPTION_LAST_STEP_AT = "ckpt.interruption.last_step_at"  # when that step ended (ISO)
    #: notice → this process started: the wind-down and the downtime together (the
    #: downtime alone is the report's: report/recovery.py)
    INTERRUPTION_NOTICE_TO_START_S = "ckpt.interruption.notice_to_start_s"
    INTERRUPTION_STARTUP_S = "ckpt.interruption.startup_s"  # process started → restore began
    INTERRUPTION_RECOVERY_S = "ckpt.interruption.recovery_s"  # notice → first step done
    INTERRUPTION_RESTORED_STEP = "ckpt.interruption.restored_step"
    INTERRUPTION_STEPS_LOST = "ckpt.interruption.steps_lost"
    INTERRUPTION_COST_PER_HOUR = "ckpt.interruption.cost_per_hour"
    INTERRUPTION_NOTICE_TO_START_COST = "ckpt.interruption.notice_to_start_cost"  # that, priced
    INTERRUPTION_RESTORE_COST = "ckpt.interruption.restore_cost"

    # ---- environment: ranks, hosts, devices (root)
    RANK = "ckpt.rank"
    RANKS = "ckpt.ranks"  # the ranks one process stands for, comma-separated
    LOCAL_RANK = "ckpt.local_rank"
    WORLD_SIZE = "ckpt.world_size"
    SAVED_WORLD_SIZE = "ckpt.saved_world_size"  # the world size the checkpoint was saved by
    NODE = "ckpt.node"
    HOST = "ckpt.host"
    DIST_BACKEND = "ckpt.dist.backend"  # torch.distributed's (gloo, nccl)
    DEVICE = "ckpt.device"  # where the state was placed (cpu, cuda:0 with the GPU's name)
    DEVICE_NOTE = "ckpt.device.note"  # why no device copy was timed

    # ---- memory (root; a phase's peak on the phase)
    MEMORY_PEAK_RSS_BYTES = "ckpt.memory.peak_rss_bytes"
    MEMORY_START_RSS_BYTES = "ckpt.memory.start_rss_bytes"
    MEMORY_DEVICE_PEAK_BYTES = "ckpt.memory.device_peak_bytes"  # CUDA memory at the peak
    #: what the caching allocator held from the driver at its peak: what another process
    #: (or the next allocation) could not have, however little of it tensors used
    MEMORY_DEVICE_RESERVED_PEAK_BYTES = "ckpt.memory.device_reserved_peak_bytes"
    #: on a restore: the resident memory of the process that saved, while it trained
    MEMORY_TRAINING_RSS_BYTES = "ckpt.memory.training_rss_bytes"
    MEMORY_WINDOW_BYTES = "ckpt.memory.window_bytes"  # the read window's buffers
    MEMORY_WINDOW_PINNED = "ckpt.memory.window_pinned"  # page-locked (a DMA to the device)

    # ---- framework specifics
    DCP = "ckpt.dcp"  # torch.distributed.checkpoint ran inside another adapter's operation
    DCP_STORAGE = "ckpt.dcp.storage"  # its StorageReader / StorageWriter class
    DEEPSPEED_PATH = "ckpt.deepspeed.path"  # DeepSpeed's folder, nested in another's restore
    UNIVERSAL = "ckpt.universal"  # a DeepSpeed universal checkpoint

    @staticmethod
    def phase_prefix(phase: str | Phase) -> str:
        """``ckpt.<phase>.``: the prefix of a phase's own keys (``ckpt.fetch.``)."""
        return f"{NAMESPACE}{_phase_value(phase)}."

    @staticmethod
    def phase_key(phase: str | Phase, name: str) -> str:
        """A key of a phase's own, built at run time: ``phase_key("write", "model_s")`` is
        ``ckpt.write.model_s`` (the report reads them as the phase's details)."""
        return Attr.phase_prefix(phase) + name


FUSED_SEPARATOR = "+"


def fused_phases(value: str) -> tuple[str, ...]:
    """The phases an :attr:`Attr.FUSED` value names, in its order:
    ``"deserialize+reshard (dcp.load)"`` → ``("deserialize", "reshard")``."""
    head = str(value).split("(", 1)[0]
    return tuple(p.strip() for p in head.split(FUSED_SEPARATOR) if p.strip())


def fused_detail(value: str) -> str | None:
    """The parenthesised detail of an :attr:`Attr.FUSED` value (``"dcp.load"``), if any."""
    _, paren, rest = str(value).partition("(")
    detail = rest.rsplit(")", 1)[0].strip() if paren else ""
    return detail or None


def fused_value(phases: Iterable[str | Phase], detail: str | None = None) -> str:
    """An :attr:`Attr.FUSED` value: ``fused_value((FETCH, DESERIALIZE), "dcp.load")`` is
    ``"fetch+deserialize (dcp.load)"``."""
    joined = FUSED_SEPARATOR.join(_phase_value(p) for p in phases)
    return f"{joined} ({detail})" if detail else joined
