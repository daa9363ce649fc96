"""What ``headlab experiment cost`` is asked, checked before any work, and its run, which writes
the figure (:mod:`headlab.experiments.cost_figure`) where ``figure`` says.

Cost builds its own modules at the width asked and loads no model: ``run`` takes the
protocol's ``lm`` (:class:`headlab.request.Request`) and reads nothing of it (``None``).

Example:
    >>> from headlab.experiments.cost_request import CostRequest
    >>> request = CostRequest(width=64, heads=(1, 4), lengths=(16,), figure="cost.png")
    >>> data = request.run().to_json()  # cost.png written too
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from headlab.experiments.cost import CostOptions, CostResult, run_cost
from headlab.experiments.cost_figure import cost_figure
from headlab.experiments.cost_text import cost_options
from headlab.outputs import check_files
from headlab.progress import NO_PROGRESS, Progress


@dataclass(frozen=True, kw_only=True)
class CostRequest:
    """What ``headlab experiment cost`` is asked, its fields named as the command's flags
    (``None``: the default); checked on creation.

    Attributes:
        width, heads, lengths, batch, device, rounds, model, quick: the grid, as
            :func:`headlab.experiments.cost_text.cost_options` takes them (``model``: take its
            width and add its head count).
        no_backward: time the forward only.
        figure: a PNG of time and memory against heads, written by :meth:`run`.
    """

    width: int | None = None
    heads: tuple[int, ...] | None = None
    lengths: tuple[int, ...] | None = None
    batch: int | None = None
    device: str | None = None
    rounds: int | None = None
    model: str | None = None
    quick: bool = False
    no_backward: bool = False
    figure: str | None = None

    def __post_init__(self) -> None:
        self.check()

    @cached_property
    def options(self) -> CostOptions:
        """The grid measured (:func:`~headlab.experiments.cost_text.cost_options`)."""
        return cost_options(
            width=self.width,
            heads=self.heads,
            lengths=self.lengths,
            batch=self.batch,
            device=self.device,
            rounds=self.rounds,
            backward=not self.no_backward,
            model=self.model,
            quick=self.quick,
        )

    def check(self) -> None:
        """The grid's checks (:class:`~headlab.experiments.cost.CostOptions`, a ``model`` whose
        config is read, not loaded) and the figure's path (not a folder, writable; a folder
        missing on the way is made when it is written), before anything is measured.

        Raises:
            InputError, ConfigError: one line naming the flag.
        """
        # before minutes of measuring (#58); a missing folder is made, as it always was
        check_files([("--figure", self.figure, ".png")], make_folders=True)
        _ = self.options

    def run(self, lm: object = None, progress: Progress = NO_PROGRESS) -> CostResult:
        """Measure the grid (:func:`~headlab.experiments.cost.run_cost`; ``lm`` is not read)
        and write the figure of its JSON where ``figure`` says."""
        result = run_cost(self.options, progress=progress)
        if self.figure:
            cost_figure(result.to_json(), self.figure)
        return result
