"""One module per ``xf`` subcommand, over the library in ``xformer_cli``.

A command imports the library, never another command; no library module imports a command
(``tests/test_layout.py`` fails on either). What two commands share moves down into the library.
"""
