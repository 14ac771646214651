"""The one error hierarchy of nanscope and the exit codes it maps to.

Every failure a user can cause (a bad spec, a missing file, a factory that raises)
is a `NanscopeError`. The CLI turns it into one line on stderr and exit code 2;
anything else is a bug and keeps its traceback.
"""

EXIT_HEALTHY = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class NanscopeError(Exception):
    """Bad input: reported as one line naming the file and field, exit code 2.

    Args:
        message: str. What is wrong, naming the file, the field and the value received.
        hint: str, optional. What to do about it.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message, hint=None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self):
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class SpecError(NanscopeError):
    """The run spec does not parse or does not validate."""


class DataError(NanscopeError):
    """The data cannot be loaded or does not fit the model or the loss."""


class ModelError(NanscopeError):
    """The model cannot be loaded, built or called."""
