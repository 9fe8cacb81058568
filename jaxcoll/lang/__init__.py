"""The collective language: write, check, optimise, import and export plans (docs/lang-tutorial.md).

`check` proves a plan computes its collective; `program` and `chunk` write one like the algorithm on a
whiteboard; `load_msccl_xml` / `to_msccl_xml` / `to_mscclpp_json` speak the formats of the field.
"""

from jaxcoll.lang.check import check
from jaxcoll.lang.msccl import load_msccl_xml, to_msccl_xml
from jaxcoll.lang.mscclpp import to_mscclpp_json
from jaxcoll.lang.program import Chunk, Program, chunk, program
from jaxcoll.plan.errors import PlanError

__all__ = ["Chunk", "PlanError", "Program", "check", "chunk", "load_msccl_xml", "program", "to_msccl_xml",
           "to_mscclpp_json"]
