"""The one error type of the planning side: a plan (or a file that should become one) is wrong."""


class PlanError(ValueError):
    """A plan is malformed or does not compute its collective. The message names the rank, lane and step (or
    the file element) that is wrong and what was expected there."""
