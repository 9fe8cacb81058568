"""The error of the topology layer: a topology (or the file that should become one) is wrong."""


class TopologyError(ValueError):
    """A topology is malformed. The message names the file entry (link index, node name) that is wrong."""
