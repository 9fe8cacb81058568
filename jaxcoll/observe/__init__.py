"""Seeing what jaxcoll's calls do: which call site ran which plan, how often and how long (`stats`), and each step
of each rank's lanes over time (`trace`)."""

from jaxcoll.observe.stats import SiteStats, Stats, stats
from jaxcoll.observe.trace import trace

__all__ = ["SiteStats", "Stats", "stats", "trace"]
