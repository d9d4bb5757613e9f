"""Settings: the option dataclasses of every command (``options``), their ranges, YAML files and
the rules that check them (``config``). Torch-free; imports ``base`` and ``text``."""
