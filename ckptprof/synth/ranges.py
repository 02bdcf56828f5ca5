"""The valid ranges of the synthetic mode's knobs, in one place.

The CLI's option types (:mod:`ckptprof.cli.options`), :class:`~ckptprof.synth.plan.SynthSpec`
(also when read back from a manifest) and
:meth:`~ckptprof.synth.options.RestoreOptions.validate` all check against these, so a
value is refused the same way wherever it comes from.
"""

from __future__ import annotations

from ckptprof import schema

RANKS = schema.integer(1, 65_536)
RANK = schema.integer(0, 65_535)
FILES = schema.integer(1, 1_000_000)
SCALE = schema.number(maximum=1, above=0)
STEP = schema.integer(0, 10**12)
SEED = schema.integer(0, 2**32 - 1)
CONCURRENCY = schema.integer(1, 1024)
REPEAT = schema.integer(1, 1000)
PART_SIZE = schema.integer(4096, 1 << 30)
MEMORY_BUDGET = schema.integer(8192, 1 << 50)
DAY_S = 86_400.0
# every number has a ceiling a real setting stays under: a value past it is a typo, and
# would only fill a report with digits (100 TB/s of bandwidth, a week of waiting)
STEP_SECONDS = schema.number(minimum=0, maximum=DAY_S)
#: tokens in one step (micro-batch x sequence length): a million is past any job's
STEP_TOKENS = schema.integer(1, 1 << 20)
#: the longest sequence the synthetic first step runs (Llama 2's context); more tokens
#: are more sequences
STEP_SEQ_MAX = 4096
#: the first step's tokens where ``--first-step-tokens`` does not say: on a GPU a
#: sequence the device is busy with (at 32 tokens a 7B step times its kernel launches,
#: not its arithmetic); on a CPU few, as a CPU's arithmetic is slow at any shape
DEFAULT_STEP_TOKENS = {"cuda": STEP_SEQ_MAX, "cpu": 32}
GBPS = schema.number(maximum=100_000, above=0)
SECONDS = schema.number(maximum=7 * DAY_S, above=0)
CACHES = ("cold", "hot")
#: ``--layout``'s choices, each with the class that holds it (imported when used:
#: :func:`ckptprof.synth.layouts.get_layout`); here, below the plan that checks a
#: spec's layout, so that the names are written once
LAYOUTS = {
    "torch": "ckptprof.synth.layouts.torch_save:TorchSaveLayout",
    "safetensors": "ckptprof.synth.layouts.safetensors_hf:SafetensorsLayout",
    "dcp": "ckptprof.synth.layouts.dcp:DcpLayout",
    "deepspeed": "ckptprof.synth.layouts.deepspeed_zero:DeepSpeedLayout",
}
