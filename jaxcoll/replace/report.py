"""What `replace_collectives` did to a traced program (or `replacing_collectives` to the programs lowered in its
block): each jax.lax collective it met, where, and whether jaxcoll runs it (with which algorithm) or XLA does
(and why). `print(report)` shows a table."""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class Entry:
    """One collective of the traced program.

    collective: the jax.lax name ("psum", "all_gather", ...; "pvary" for the invariant->varying cast, whose
      transpose is a psum); primitive: the jaxpr primitive it was met as ("psum_invariant", ...).
    where: the enclosing constructs from the outside in ("shard_map/scan/cond[1]"); "" at the top.
    axes, shape, dtype: the call. replaced: jaxcoll runs it; else XLA does, for `reason`.
    jaxcoll: the jaxcoll call that runs it; algorithm: "auto", a built-in name or a plan's name.
    """

    collective: str
    primitive: str
    where: str
    axes: tuple
    shape: tuple
    dtype: str
    replaced: bool
    jaxcoll: str = ""
    algorithm: str = ""
    reason: str = ""


class Report:
    """The entries of one trace of a transformed function, in program order (a site inside a loop body is one
    entry however often the loop runs; a custom_jvp/custom_vjp rule adds its entries when it is traced, which
    is when the function is differentiated); or those of the calls lowered in a `replacing_collectives` block,
    in the order they were lowered. `source` names which, in the table's title."""

    def __init__(self, entries=(), source: str = "jaxcoll.replace_collectives"):
        self._entries = list(entries)
        self._lock = threading.Lock()
        self.source = source

    def add(self, entry: Entry) -> None:
        with self._lock:
            self._entries.append(entry)

    @property
    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries)

    @property
    def replaced(self) -> list[Entry]:
        return [e for e in self.entries if e.replaced]

    @property
    def left_to_xla(self) -> list[Entry]:
        return [e for e in self.entries if not e.replaced]

    def rows(self) -> list[tuple[Entry, int]]:
        """Equal entries merged, with their count, in order of first appearance."""
        counts: dict[Entry, int] = {}
        for e in self.entries:
            counts[e] = counts.get(e, 0) + 1
        return list(counts.items())

    def __rich__(self):
        """The table: one row per collective site (equal sites merged, with their count); the replaced pvary
        casts, which a program under check_vma has at every meeting of an invariant and a varying value, in one
        row per place ("where") with their axes."""
        from rich.table import Table
        casts = [e for e in self.replaced if e.collective == "pvary"]
        cast_count = f" (and {len(casts)} pvary casts)" if casts else ""
        table = Table(title=f"{self.source}: {len(self.replaced) - len(casts)} collectives replaced{cast_count}, "
                            f"{len(self.left_to_xla)} left to XLA")
        for column in ("collective", "where", "axes", "operand", "runs on", "algorithm / reason", "count"):
            # A long "where" wraps rather than losing its file name to an ellipsis.
            table.add_column(column, justify="right" if column == "count" else "left",
                             overflow="fold" if column == "where" else "ellipsis")
        for e, count in self.rows():
            if e.replaced and e.collective == "pvary":
                continue
            operand = f"{e.dtype}[{','.join(map(str, e.shape))}]"
            runs = e.jaxcoll if e.replaced else "XLA"
            table.add_row(e.collective, e.where or "-", ",".join(map(str, e.axes)), operand, runs,
                          e.algorithm if e.replaced else e.reason, str(count))
        places: dict[str, list[Entry]] = {}
        for e in casts:
            places.setdefault(e.where, []).append(e)
        for where, entries in places.items():
            axes = sorted({a for e in entries for a in e.axes}, key=str)
            table.add_row("pvary", where or "-", ",".join(map(str, axes)), "(casts)", entries[0].jaxcoll,
                          entries[0].algorithm, str(len(entries)))
        return table

    def __str__(self) -> str:
        from rich.console import Console
        console = Console(width=140, record=True, file=_Discard(), color_system=None)
        console.print(self)
        return console.export_text().rstrip()

    def __repr__(self) -> str:
        return f"<Report: {len(self.replaced)} replaced, {len(self.left_to_xla)} left to XLA>"


class _Discard:
    def write(self, _):
        pass

    def flush(self):
        pass
