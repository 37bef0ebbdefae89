"""The errors a reader can cause, each with a message that names the bad value and what is allowed."""


class InputError(ValueError):
    """A bad model name, set-up option or value; the message says what is allowed."""


class MeasurementError(RuntimeError):
    """A measurement that could not complete (a child process failed or ran out of time); the message says why."""
