"""ckptprof: where checkpoint restore time goes, and why.

The core is framework-free and light to import: torch, boto3 and the training
frameworks are imported lazily by the modules that need them.
"""

from ckptprof._version import __version__
from ckptprof.errors import CkptprofError
from ckptprof.phases import Phase
from ckptprof.redact import protect_log
from ckptprof.tracing.tracer import CheckpointTracer

protect_log()  # no ckptprof log line carries a URL's credentials

__all__ = ["CheckpointTracer", "CkptprofError", "Phase", "__version__"]
