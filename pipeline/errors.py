"""The one base class for errors a user can fix: the CLI prints them as one line and exits 2."""


def first_line(exc: BaseException) -> str:
    """An exception as one short line, for a `dynrag: error:` message."""
    return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0][:300]


class QuestionError(Exception):
    """A fault of one question's own input (e.g. a prompt too long for the model): its error row is
    final. Every other error of a question (backend, index, model, I/O) is retried by a rerun."""


class DynragError(Exception):
    """Bad input, a bad config value, a missing model or file: say what and where, in one line."""


class BackendError(DynragError, RuntimeError):
    """A backend cannot be built from the configuration (missing index, model, package) or used any more."""


class EngineDead(BackendError):
    """A backend that can serve nothing more (vLLM's engine core has died): the run's engine stops with it,
    instead of failing every later question. Through Ray the engine actor exits and Ray restarts it."""
