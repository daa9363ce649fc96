"""One protocol for what a command asks (headlab.request): checked before any model loads, then
run on the loaded model; each request that follows it, built as its command builds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headlab.causal.request import ComposeRequest, PatchRequest
from headlab.errors import InputError
from headlab.experiments.cards import CardsRequest
from headlab.experiments.circuit_request import CircuitRequest
from headlab.experiments.cost_request import CostRequest
from headlab.experiments.kv import KVRequest
from headlab.explore.request import HeadsRequest
from headlab.models.loading import load
from headlab.pruning.results import PruneOptions
from headlab.pruning.workflow import PruneRequest
from headlab.report.request import ReportRequest
from headlab.request import Request, Result
from headlab.roles.workflow import RolesRequest


def test_the_commands_requests_follow_the_protocol(tmp_path: Path) -> None:
    requests = [
        RolesRequest(limit=5, no_gap=True),
        CircuitRequest(model="tiny-shakespeare"),
        PruneRequest(options=PruneOptions(), curve=True),
        ReportRequest(out=str(tmp_path / "report"), limit=5, no_gap=True),
        HeadsRequest(text="The cat sat.", top=2),
        HeadsRequest(trace=True),
        PatchRequest(model="tiny-shakespeare"),
        ComposeRequest(model="tiny-shakespeare", receivers="1.0"),
        CostRequest(quick=True, figure=str(tmp_path / "cost.png")),
        CardsRequest(model="tiny-shakespeare", html=str(tmp_path / "atlas.html")),
        KVRequest(model="tiny-shakespeare", context=128, window=32),
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
        (lambda: ReportRequest(treebank="no-such.conllu"), "cannot read treebank"),
        (lambda: ReportRequest(limit=0), "--limit"),
        (lambda: ReportRequest(text="held-out.txt"), "add --prune"),
        (lambda: HeadsRequest(patch=(1, 2)), "--patch"),
        (lambda: PatchRequest(path="1.0"), "--path names a sender"),
        (lambda: ComposeRequest(figure="x.png"), "--receivers"),
        (lambda: CostRequest(width=64, model="tiny-shakespeare"), "not both"),
        (lambda: HeadsRequest(image="no-such.png"), "does not exist"),
        (lambda: HeadsRequest(audio="no-such.wav", text="A cat."), "no sound file"),
        (lambda: HeadsRequest(trace=True, conllu="no-such.conllu"), "no-such.conllu"),
        (lambda: CardsRequest(position="first"), "--position"),
        (lambda: CardsRequest(no_roles=True, limit=5), "--limit"),
    ],
)
def test_a_request_refuses_before_any_model(make, says: str) -> None:
    with pytest.raises(InputError, match=says):
        make()


def test_heads_and_report_run_to_a_result(tmp_path: Path) -> None:
    """Both run on a loaded model to a result whose JSON is the command's: every head of the
    sentence (4 layers x 4 heads), the trace of the lesson's word, the report's folder."""
    lm = load("tiny-shakespeare")
    for request in (HeadsRequest(text="The cat sat on the mat.", top=2), HeadsRequest(trace=True)):
        result = request.run(lm)
        assert isinstance(result, Result)
        data = result.to_json()
        assert json.loads(json.dumps(data)) == data and result.text()
    assert data["schema"] == "headlab.trace/1" and data["arcs"]  # the trace, last
    rows = HeadsRequest(text="The cat sat on the mat.", top=2).run(lm).to_json()["heads"]
    assert len(rows) == 16 and all(len(row["top"]) == 2 for row in rows)
    out, ledger = tmp_path / "report", tmp_path / "ledger.md"
    report = ReportRequest(
        model="tiny-shakespeare",
        out=str(out),
        roles_only=True,
        limit=5,
        no_gap=True,
        replicates=0,
        ledger_md=str(ledger),
    )
    built = report.run(report.ready(lambda head: load("tiny-shakespeare", with_lm_head=head)))
    assert isinstance(built, Result)
    data = built.to_json()
    assert data["index"] == str(out / "index.html") and Path(data["index"]).is_file()
    assert data["roles"]["model"] == "tiny-shakespeare" and len(data["roles"]["heads"]) == 16
    assert ledger.read_text() == (out / "ledger.md").read_text()
