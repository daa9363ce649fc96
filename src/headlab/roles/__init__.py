"""What every head specializes in, measured against gold data the way the literature measures it.

Example:
    >>> from headlab.models import load
    >>> from headlab.datasets import read_conllu, read_gap, sample_path
    >>> from headlab.roles import measure_roles
    >>> report = measure_roles(load(), read_conllu(sample_path("treebank")),
    ...                        gap=read_gap(sample_path("gap")))
    >>> report.role_counts()["unclassified"]  # many heads have no clean role
"""

from headlab.roles.classify import LETTERS, ROLES, Thresholds
from headlab.roles.measure import (
    CoreferenceResult,
    HeadRole,
    RelationRow,
    RoleOptions,
    RoleReport,
    measure_roles,
)

__all__ = [
    "LETTERS",
    "ROLES",
    "CoreferenceResult",
    "HeadRole",
    "RelationRow",
    "RoleOptions",
    "RoleReport",
    "Thresholds",
    "measure_roles",
]
