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


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed: Python's MemoryError, torch's CPU allocator
    ("DefaultCPUAllocator: can't allocate memory") or a device's out-of-memory error."""
    if isinstance(e, MemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def memory_detail(e: BaseException) -> str:
    """The first line of an allocation error's message (torch's run to several), at most 160 characters."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return line if len(line) <= 160 else line[:157] + "..."
