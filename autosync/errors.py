"""The one exception type a user can cause: the CLI prints its message on one line and exits 2."""


class UserError(Exception):
    """Bad input from the user (flag, file, workload, strategy): one clear line, exit status 2."""
