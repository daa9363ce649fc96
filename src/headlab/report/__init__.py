"""``headlab report``: a self-contained HTML explorer of every head, and PNG figures.

- :mod:`headlab.report.request`: what ``headlab report`` is asked, checked before a model loads.
- :mod:`headlab.report.build`: its inputs, the stages (roles, what the ledger needs, the page).
- :mod:`headlab.report.data`: the page's data, gathered from the measurements.
- :mod:`headlab.report.folder`: the folder written atomically (index.html, figures, ledger).
- :mod:`headlab.report.causal`: what the page shows of a patching result and a circuit, each
  in its section, and the heads patching ranks high that the circuit leaves out.
- :mod:`headlab.report.full`: what the report measures beside the roles (pruning, cost, one
  head against many).
- :mod:`headlab.report.figures`, :mod:`headlab.report.decoder`, :mod:`headlab.report.ledger`:
  the PNG figures, the decoder's companion report, the ledger of the lesson's claims.
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.report.build import build_report as build_report
    from headlab.report.folder import write_report as write_report
    from headlab.report.request import ReportRequest as ReportRequest

__getattr__, __dir__, __all__ = attach(__name__, __file__)
