"""The pages' floor: the HTML shell of the report (:mod:`headlab.page.html`), the live explorer's
page and the notebook view (:mod:`headlab.page.explorer`), and the scripts and styles they share
(``assets/``), the circuit's page (:mod:`headlab.page.circuit`) and the atlas of head cards
(:mod:`headlab.page.atlas`). Below ``experiments``, ``report``, ``explore`` and ``serve``, which
fill these pages with data; it imports nothing above it."""
