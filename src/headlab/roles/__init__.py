"""What every head specializes in, measured against gold data the way the literature measures it.

Example:
    >>> from headlab.models import load
    >>> from headlab.datasets import read_conllu, read_gap, sample_path
    >>> from headlab.roles import measure_roles
    >>> report = measure_roles(load(), read_conllu(sample_path("treebank")),
    ...                        gap=read_gap(sample_path("gap")))
    >>> report.role_counts()["unclassified"]  # many heads have no clean role
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.roles.classify import LETTERS as LETTERS
    from headlab.roles.classify import ROLES as ROLES
    from headlab.roles.classify import Thresholds as Thresholds
    from headlab.roles.measure import CoreferenceResult as CoreferenceResult
    from headlab.roles.measure import HeadRole as HeadRole
    from headlab.roles.measure import RelationRow as RelationRow
    from headlab.roles.measure import RoleOptions as RoleOptions
    from headlab.roles.measure import RoleReport as RoleReport
    from headlab.roles.measure import measure_roles as measure_roles

__getattr__, __dir__, __all__ = attach(__name__, __file__)
