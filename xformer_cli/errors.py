"""The one exception type the CLI turns into a clean one-line error."""


class XfError(Exception):
    """A user-facing error: bad input, bad configuration, a file that is not what it should be.

    The message is complete on its own (it names the file and line where there is one); the CLI
    prints it as ``xf: error: <message>`` and exits non-zero, without a traceback unless --verbose.
    """


class ConfigError(XfError, ValueError):
    """An unknown option, a wrong type or an invalid value in YAML or on the command line.

    Also a ValueError: the options dataclasses raise it from ``__post_init__``, and
    ``config.build_options`` adds the name of the file it came from."""
