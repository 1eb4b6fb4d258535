"""One module per ``unitscale`` subcommand: its flags (``add_command``) and its run (``run``).

``unitscale.cli`` builds the parser from them and is the one error path; ``common`` holds
what several share (a server's config source and signal handling, a profile by name).
Each module imports its role's packages inside ``run``: every command parses without
loading the others' dependencies.
"""
