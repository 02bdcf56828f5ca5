"""``ckptprof synth restore``: the six restore phases for real, cold and hot, per
strategy, over a sweep of concurrency, repeated, with medians and the full environment.

One run is one ``ckpt.restore`` trace recorded through the same
:class:`~ckptprof.tracing.tracer.CheckpointTracer` the framework callbacks use. The
restored state (:mod:`ckptprof.synth.targets`) is what one target rank of the job holds
(``--world-size W --rank R``), or every rank of it in this one process; it is allocated
before the sweep, like a job's model, and every run copies the checkpoint into it with
the chosen strategy (:mod:`ckptprof.synth.strategies`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptprof.errors import StorageError
from ckptprof.preflight import OutputClaim, earlier_results
from ckptprof.synth import ceiling as ceiling_mod
from ckptprof.synth.distributed import Job
from ckptprof.synth.options import RestoreOptions
from ckptprof.synth.results import RunRecord, from_dict, payload, run_line, write_results
from ckptprof.synth.runner import RestoreRunner
from ckptprof.threads import last_words
from ckptprof.units import fmt_bytes, fmt_margin, wrap


def run_restore(
    location: str,
    options: RestoreOptions,
    out_dir: Path,
    trace_dir: Path | None = None,
    echo=print,
    job: Job | None = None,
) -> dict:
    """Probe the ceiling, run the sweep, write results.json/results.csv and traces. As one
    rank of a ``job``, rank 0 gathers every rank's runs and writes the results."""
    from ckptprof.synth.job import traced
    from ckptprof.tracing.trace_file import TRACE_DIR_ENV

    trace_dir = trace_dir or os.environ.get(TRACE_DIR_ENV) or out_dir / "traces"
    tracer_options = {
        "per_file_spans": options.per_file_spans,
        "stall_after_s": options.stall_after_s,
    }
    with traced(trace_dir, job, **tracer_options) as (telemetry, tracer):
        runner = RestoreRunner(location, options, tracer, job)
        try:
            return _run(runner, options, out_dir, telemetry, tracer, echo, job)
        finally:
            runner.state.release()
            if runner.subject.buffers is not None:
                runner.subject.buffers.close()


def _run(runner: RestoreRunner, options: RestoreOptions, out_dir: Path, telemetry, tracer,
         echo, job: Job | None) -> dict:  # fmt: skip
    """The restore's steps, in order: outputs claimed, memory checked, caches prepared, the
    ceiling probed, an interruption simulated, the sweep, the results written."""
    claims: list[OutputClaim] = []
    try:
        trace_dir = telemetry.trace_file.parent if telemetry.trace_file else None
        runner.check_outputs(out_dir, trace_dir)
        if job is None or job.rank == 0:  # the one process that writes the results
            claims.append(OutputClaim(out_dir, "--out"))
            earlier = earlier_results(out_dir / "results.json")
            if earlier is not None:
                echo(earlier)
        if job is None and options.stage_dir is not None:  # a job's ranks share theirs
            claims.append(OutputClaim(Path(options.stage_dir), "--stage", "its downloads"))
        runner.check_memory()
        ceiling = _prepared(runner, options, echo)
        if options.simulate_interruption:
            _simulate_interruption(runner, options, out_dir, telemetry, tracer, echo)
        if runner.caches != tuple(options.caches):
            echo(
                f"{runner.storage.kind}: no local page cache, so only cold runs "
                "(use --stage DIR to restore from a local copy)"
            )

        def keep_partial() -> None:
            """What was measured before an interruption stays."""
            if runner.runs and job is None:
                partial = payload(runner.subject, list(runner.runs), runner.failures, options,
                                  ceiling, telemetry, partial=True)  # fmt: skip
                json_path, _ = _save_results(out_dir, partial, runner.runs, telemetry)
                echo(f"partial results of {len(runner.runs)} runs: {json_path}")

        try:
            with last_words(keep_partial):  # a stop that cannot wait writes them too
                runs, failures = runner.sweep(
                    lambda run: echo(wrap(run_line(run, ceiling), rest="      ")), echo
                )
        except BaseException:
            keep_partial()
            raise
        rank_runs = None
        if job is not None:  # every rank's records to rank 0, which writes the results
            telemetry.flush()
            gathered = _gathered(job, runs, failures)
            if gathered is None:
                return {}
            rank_runs = runs = gathered[0]
            failures = gathered[1]
        attempted = len(runs) + len(failures)
        stats = runner.storage.stats
        result = payload(runner.subject, runs, failures, options, ceiling, telemetry,
                         rank_runs=rank_runs)  # fmt: skip
        json_path, csv_path = _save_results(out_dir, result, runs, telemetry)
        echo(f"results: {json_path} and {csv_path}; {telemetry.describe_trace()}")
        if stats.retries or stats.errors or failures:
            echo(
                f"storage: {stats.requests} requests, {stats.retries} retries, "
                f"{stats.errors} failed attempts; runs succeeded: {len(runs)}/{attempted}"
            )
        if failures:
            raise StorageError(
                f"{len(failures)} of {attempted} runs failed (success rate "
                f"{len(runs) / attempted:.0%}); first: {failures[0]['error']}"
            )
        return result
    finally:
        for claim in claims:
            claim.release()


def _prepared(runner: RestoreRunner, options: RestoreOptions, echo) -> ceiling_mod.Ceiling:
    """The state allocated and the ceiling found, each said before it takes time."""
    if runner.first_step.mode == "estimated":
        echo(
            f"first_step will be estimated and shown beside the RTO, not in it "
            f"({runner.first_step.why_estimated}; --first-step-s gives a measured one)."
        )
    runner.prepare()
    if not options.ceiling_gbps:
        echo(
            f"probing the read ceiling: {ceiling_mod.PROBE_PASSES} cold reads of up to "
            f"{fmt_bytes(runner.probe_bytes)} (at most {ceiling_mod.PROBE_SHARE:.0%} of "
            "the sweep's bytes; --ceiling-gbps skips it)"
        )
    ceiling = runner.ceiling()
    echo(ceiling.describe())
    return ceiling


def _simulate_interruption(runner: RestoreRunner, options: RestoreOptions, out_dir: Path,
                           telemetry, tracer, echo) -> None:  # fmt: skip
    """A notice and its emergency save, before the sweep: its first restore recovers."""
    from ckptprof.synth.interruption import simulate

    runner.interruption = simulate(
        runner.first_step,
        tracer,
        runner.spec.step,
        out_dir,
        telemetry,
        options.deadline,
        deadline_assumed=options.deadline_s is None,
    )
    record = runner.interruption.record
    echo(
        f"simulated interruption: emergency save {record.outcome} in "
        f"{(record.save_end_ns - record.save_start_ns) / 1e9:.3f} s, "
        f"{fmt_margin(record.margin_s, f'the {options.deadline:g} s deadline')}; "
        "the first restore below is the recovery"
    )


def _gathered(job: Job, runs: list[RunRecord], failures: list[dict]):
    """Every rank's runs and failures (each failure naming its rank), on rank 0; None on
    the other ranks."""
    gathered = job.gather(([r.to_dict() for r in runs], failures))
    if job.rank != 0:
        return None
    every_run = [from_dict(entry) for found, _ in gathered for entry in found]
    every_failure = [{**f, "rank": rank} for rank, (_, lost) in enumerate(gathered) for f in lost]
    return every_run, every_failure


def _save_results(out_dir: Path, payload: dict, runs: list[RunRecord], telemetry):
    """write_results, or an error that names the file and where the runs still are."""
    telemetry.flush()
    try:
        return write_results(out_dir, payload, runs)
    except OSError as exc:
        kept = (
            f"; the {len(runs)} runs are in {telemetry.trace_file} "
            f"(`ckptprof report {telemetry.trace_file}`)"
            if telemetry.trace_written
            else ""
        )
        raise StorageError(f"could not write the results: {exc}{kept}.") from None
