"""One protocol for what a command asks (headlab.request): checked before any model loads, then
run on the loaded model; each request that follows it, built as its command builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from headlab.errors import InputError
from headlab.experiments.cards import CardsRequest
from headlab.experiments.circuit_request import CircuitRequest
from headlab.pruning.results import PruneOptions
from headlab.pruning.workflow import PruneRequest
from headlab.request import Request
from headlab.roles.workflow import RolesRequest


def test_the_commands_requests_follow_the_protocol(tmp_path: Path) -> None:
    requests = [
        RolesRequest(limit=5, no_gap=True),
        CircuitRequest(model="tiny-shakespeare"),
        PruneRequest(options=PruneOptions(), curve=True),
        CardsRequest(no_patch=True, tasks=("induction",)),
    ]
    for request in requests:
        assert isinstance(request, Request), type(request).__name__
        request.check()  # again: a request that exists passed it


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: RolesRequest(limit=0), "--limit"),
        (lambda: RolesRequest(replicates=-1, no_gap=True, limit=3), "--replicates"),
        (lambda: PruneRequest(options=PruneOptions()), "--curve"),
        (lambda: PruneRequest(options=PruneOptions(fraction=0.5)), "--out"),
        (lambda: CircuitRequest(steps=3, method="eap"), "--steps"),
        (lambda: CardsRequest(position="first"), "--position"),
        (lambda: CardsRequest(no_roles=True, limit=5), "--limit"),
    ],
)
def test_a_request_refuses_before_any_model(make, says: str) -> None:
    with pytest.raises(InputError, match=says):
        make()
