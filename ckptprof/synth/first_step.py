"""``first_step``: the first training step after the restore, for real where it can run.

Where the model fits and one process holds all of it, a plain-PyTorch Llama of the
preset is built before the sweep (a job's model exists before it restores), the restore
copies the weights straight into its parameters, the restored Adam moments are handed
to its optimizer as they are (part of ``reshard``), and one real forward/backward/AdamW
step runs. Elsewhere (too large, or one rank of a larger job) the step is *estimated*
from 1- and 2-layer steps of the same width, once, outside any restore — and kept
beside the RTO, never inside it — unless the user gives the step time measured in the
real job (``--first-step-s``), which then counts.
"""

from __future__ import annotations

import time
from dataclasses import replace

import psutil

from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr, Phase
from ckptprof.results_schema import STEP_ESTIMATE, STEP_REAL, STEP_SKIPPED, STEP_USER
from ckptprof.synth.plan import GROUP_EXP_AVG, GROUP_EXP_AVG_SQ, GROUP_MODEL
from ckptprof.synth.subject import RestoreSubject
from ckptprof.units import fmt_bytes

MEMORY_HEADROOM = 0.85


class FirstStep:
    """Decides, prepares and runs (or estimates) the first step of one sweep."""

    def __init__(
        self,
        subject: RestoreSubject,
        enabled: bool,
        user_seconds: float | None,
        progress: bool | None = None,
        tokens: int | None = None,
    ) -> None:
        from ckptprof.synth.model import default_step_tokens, step_shape

        self.subject = subject
        self.progress = progress
        batch, seq = step_shape(tokens or default_step_tokens(subject.device))
        self.tokens = batch * seq  # what the step runs: --first-step-tokens, or the device's
        self.tokens_given = tokens is not None
        self.model = self.optimizer = None
        self.steps_run = 0  # real steps this process has run
        self.estimate: tuple[float, str] | None = None
        self.user_seconds = user_seconds
        if not enabled:
            self.mode = STEP_SKIPPED
        elif user_seconds is not None:
            self.mode = STEP_USER
        else:
            self.mode = STEP_REAL if self._fits() else STEP_ESTIMATE
        if self.mode == STEP_ESTIMATE:
            self._check_estimate_fits()

    def _free(self) -> int:
        """The memory a step may take on the state's device."""
        device = self.subject.device
        if device.type == "cuda":
            import torch

            return int(torch.cuda.mem_get_info(device)[0] * MEMORY_HEADROOM)
        return int(psutil.virtual_memory().available * MEMORY_HEADROOM)

    def _fits(self) -> bool:
        from ckptprof.synth.model import step_bytes_beyond_state

        subject = self.subject
        if subject.world_size != 1:
            return False
        need = subject.state.nbytes + step_bytes_beyond_state(subject.plan.preset, self.tokens)
        return need <= self._free()

    def _check_estimate_fits(self) -> None:
        """The estimate's 2-layer step must fit too: refused before the sweep, where a
        step of too many tokens would end it out of memory."""
        from ckptprof.synth.model import ESTIMATE_STATE_BYTES_PER_PARAM, step_bytes_beyond_state

        two = replace(self.subject.plan.preset, layers=2)
        need = two.params * ESTIMATE_STATE_BYTES_PER_PARAM + step_bytes_beyond_state(
            two, self.tokens
        )
        free = self._free()
        if need > free:
            device = self.subject.device
            asked = (
                f"--first-step-tokens {self.tokens}"
                if self.tokens_given
                else f"the first step's {self.tokens} tokens ({device.type}'s default)"
            )
            raise CkptprofError(
                f"{asked}: the first step's estimate runs a 2-layer step of this width, "
                f"which needs {fmt_bytes(need)}, and {device} has {fmt_bytes(free)} to spare; "
                "give fewer with --first-step-tokens, the real job's step time with "
                "--first-step-s, or --no-first-step."
            )

    @property
    def tokens_here(self) -> int | None:
        """The tokens of the step run or estimated here; None where none is (skipped, or
        the user's time)."""
        return self.tokens if self.mode in (STEP_REAL, STEP_ESTIMATE) else None

    @property
    def why_estimated(self) -> str:
        if self.subject.world_size != 1:
            return f"one rank of {self.subject.world_size} cannot step alone"
        return f"the model does not fit in {self.subject.device} memory to train here"

    def prepare(self) -> dict:
        """Before the sweep: build the model (its parameters are returned, keyed like the
        targets, for the restore to fill), or time the estimate once."""
        from ckptprof.synth.model import build_model

        if self.mode == STEP_REAL:
            self.model, self.optimizer = build_model(self.subject.plan.preset, self.subject.device)
            return {(GROUP_MODEL, n): p.data for n, p in self.model.named_parameters()}
        if self.mode == STEP_ESTIMATE:
            self.estimate = (self._estimate_seconds(), self.why_estimated)
        return {}

    def attach(self, op) -> None:
        """``reshard``: hand the restored Adam moments to the model's optimizer as they
        are (no copy, no cast: it steps in their dtype), so the first step trains on the
        restored state itself."""
        import torch

        state = self.subject.state.of_rank(0)
        if self.model is None or (GROUP_EXP_AVG, "model.norm.weight") not in state:
            return
        with op.phase(Phase.RESHARD):
            step = torch.tensor(float(self.subject.spec.step))
            self.optimizer.state.clear()
            for name, param in self.model.named_parameters():
                self.optimizer.state[param] = {
                    "step": step.clone(),
                    "exp_avg": state[(GROUP_EXP_AVG, name)],
                    "exp_avg_sq": state[(GROUP_EXP_AVG_SQ, name)],
                }

    def run(self, op) -> None:
        """The step, inside the restore (real or the user's), or its estimate beside it.
        A real step says whether it is its process's first: that one pays what a resumed
        job's first step pays once (kernels chosen, caches and allocator pools made; on a
        GPU the CUDA context and library handles), the sweep's later runs do not."""
        import torch

        from ckptprof.synth.model import train_step

        if self.mode == STEP_REAL:
            previous = torch.set_flush_denormal(True)
            try:
                first = {
                    Attr.EMULATED: False,
                    Attr.FIRST_STEP_FIRST_IN_PROCESS: not self.steps_run,
                    Attr.FIRST_STEP_TOKENS: self.tokens,
                }
                with (
                    op.phase(Phase.FIRST_STEP, **first),
                    self._bar(
                        3, f"first step ({self.tokens} tokens: forward, backward, AdamW)"
                    ) as bar,
                ):
                    train_step(self.model, self.optimizer, self.tokens, advance=bar.update)
                self.steps_run += 1
            finally:
                torch.set_flush_denormal(previous)
        elif self.mode == STEP_USER:
            start = time.time_ns()  # appended after the restore: the root ends later
            op.add_interval(Phase.FIRST_STEP, start, start + int(self.user_seconds * 1e9))
            op.set_phase_attributes(
                Phase.FIRST_STEP,
                **{Attr.EMULATED: False, Attr.FIRST_STEP_SOURCE: "user (--first-step-s)"},
            )
        elif self.mode == STEP_ESTIMATE and self.estimate is not None:
            seconds, reason = self.estimate
            op.set_attributes(
                {
                    Attr.FIRST_STEP_ESTIMATE_S: round(seconds, 6),
                    Attr.FIRST_STEP_TOKENS: self.tokens,
                    Attr.FIRST_STEP_ESTIMATE_REASON: reason,
                    Attr.RTO_ENDS_AT: "state restored (first step estimated beside it)",
                }
            )

    def _bar(self, steps: int, desc: str):
        from ckptprof.progress import bar

        return bar(steps, desc, self.progress, nbytes=False)

    def _estimate_seconds(self) -> float:
        """1- and 2-layer models of the same width, one timed step each; extrapolated."""
        from ckptprof.synth.model import build_model, train_step

        preset = self.subject.plan.preset
        times = []
        with self._bar(12, "first-step estimate (1- and 2-layer steps)") as bar:
            for layers in (1, 2):
                model, optim = build_model(replace(preset, layers=layers), self.subject.device)
                # warm-up: first-call allocations are not per-layer cost
                train_step(model, optim, self.tokens, advance=bar.update)
                t0 = time.perf_counter()
                train_step(model, optim, self.tokens, advance=bar.update)
                times.append(time.perf_counter() - t0)
                del model, optim
        per_layer = max(0.0, times[1] - times[0])
        return times[0] + per_layer * (preset.layers - 1)


__all__ = ["FirstStep"]
