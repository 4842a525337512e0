"""The one exception type users see: a single line naming the problem and the fix."""

import errno


class PlantbenchError(Exception):
    """A user-facing error. The CLI prints ``plantbench: error: <message>`` and exits 2."""


class ConfigError(PlantbenchError):
    """A bad configuration value, reported before any output is written."""


class ArtifactError(PlantbenchError):
    """A missing, corrupt or mismatched artifact (names the file and what to do)."""


class Preempted(PlantbenchError):
    """Raised after the resumable state was saved because a stop signal arrived."""


EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the job should be retried and will resume


_OS_FIX = {
    errno.ENOSPC: "free disk space and rerun",
    errno.EDQUOT: "free disk space (or raise the quota) and rerun",
    errno.EACCES: "fix the permissions and rerun",
    errno.EPERM: "fix the permissions and rerun",
    errno.EROFS: "write to a writable file system",
    errno.ENOTDIR: "a folder on that path is a regular file: choose another path",
    errno.EISDIR: "it is a folder: give the path of a file",
    errno.EEXIST: "it is a file where a folder belongs: choose another path or move the file",
    errno.ENOENT: "run the step that makes it, or fix the path",
}


def describe_os_error(exc: OSError, command: str) -> str:
    """One line for an operating-system error of a step: what failed, where, and the fix that
    fits its cause (a full disk, a permission, a file where a folder belongs, ...)."""
    where = f" '{exc.filename}'" if exc.filename else ""
    fix = _OS_FIX.get(exc.errno or 0, "fix the cause and rerun")
    return f"{exc.strerror or exc}{where} while running '{command}'; {fix}"
