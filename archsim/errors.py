"""The errors users see.

Every bad input (YAML, assembly, workload, command line) becomes one ``InputError`` carrying where
(file, file:line or option), what is wrong, and what is allowed.  The CLI prints it as one line,
``archsim: error: <where>: <what> (<allowed>)``, and exits 2.  A run that cannot finish raises
``SimulationError`` (exit 3); a failed functional check exits 1.
"""

from __future__ import annotations


QUOTE_CAP = 300  # characters of a message's where / what parts; a huge bad value is not printed whole


def _cap(text: str) -> str:
    """One line (a multi-line library message is joined) of at most about QUOTE_CAP characters."""
    if "\n" in text or "\r" in text:
        text = " ".join(text.split())
    return text if len(text) <= QUOTE_CAP else f"{text[:QUOTE_CAP - 40]}... ({len(text):,} characters)"


class ArchsimError(Exception):
    exit_status = 1


class InputError(ArchsimError):
    """Bad input: exit status 2, one line on stderr."""

    exit_status = 2

    def __init__(self, where: str, what: str, allowed: str = ""):
        self.where = _cap(str(where))
        self.what = _cap(str(what))
        self.allowed = " ".join(str(allowed).split()) if "\n" in str(allowed) else str(allowed)
        super().__init__(self.line())

    def __reduce__(self):  # crosses process boundaries (worker pools) whole
        return (type(self), (self.where, self.what, self.allowed))

    def line(self) -> str:
        text = f"{self.where}: {self.what}"
        if self.allowed:
            text += f" ({self.allowed})"
        return text


class SimulationError(ArchsimError):
    """The simulation could not finish (deadlock, cycle limit, run-time fault): exit status 3."""

    exit_status = 3

    def __init__(self, where: str, what: str, partial=None):
        self.where = str(where)
        self.what = str(what)
        self.partial = partial
        super().__init__(self.line())

    def __reduce__(self):
        return (type(self), (self.where, self.what, self.partial))

    def line(self) -> str:
        return f"{self.where}: {self.what}"


class VerificationError(ArchsimError):
    """A functional verification against numpy failed: exit status 1."""

    exit_status = 1


class Terminated(BaseException):
    """The process was asked to end (SIGTERM): raised where it stands, so that every pool of
    workers is shut down on the way out (a BaseException, like KeyboardInterrupt: no task's
    error handling catches it)."""
