"""The project's exceptions: one root and a few specific kinds people can act on.

Every message names the bad value with ``!r``, says what was allowed and how to fix it,
and fits on one line, so the CLI can print it as-is.
"""


class StatefulStreamsError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(StatefulStreamsError):
    """A setting is missing, unknown or has a value outside what is allowed."""


class BrokerError(StatefulStreamsError):
    """The broker could not be started, reached or used."""


class SourceError(StatefulStreamsError):
    """The Pulsar source got options or offsets it cannot work with."""


class InputDataError(StatefulStreamsError):
    """A file given as input (CSV, TOML, …) is missing or malformed."""


class ControlError(StatefulStreamsError):
    """A control action (savepoint, replay, re-drive) cannot be carried out."""


class SinkError(StatefulStreamsError):
    """A sink or checkpoint path cannot be written; the message names the path."""
