"""The one exception type users see: a single line naming the problem and the fix."""


class PlantbenchError(Exception):
    """A user-facing error. The CLI prints ``plantbench: error: <message>`` and exits 2."""


class ConfigError(PlantbenchError):
    """A bad configuration value, reported before any output is written."""


class ArtifactError(PlantbenchError):
    """A missing, corrupt or mismatched artifact (names the file and what to do)."""


class Preempted(PlantbenchError):
    """Raised after the resumable state was saved because a stop signal arrived."""


EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the job should be retried and will resume
