"""Seeing what jaxcoll's calls do: which call site ran which plan, how often and how long (`stats`)."""

from jaxcoll.observe.stats import SiteStats, Stats, stats

__all__ = ["SiteStats", "Stats", "stats"]
