"""The suite's own arrangement holds: tests that share something made once (a server, a
browser, a module's real job) run on one xdist worker (``tests/conftest.py``), so it is
made once. pytest-xdist applies a group by suffixing the test's id; a pytest or xdist
version where that suffix is lost leaves every group ignored, silently, and the suite
makes those jobs on every worker: this test fails instead."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def made_once() -> object:
    return object()


def test_a_test_sharing_a_module_fixture_runs_in_its_group(made_once, request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under xdist with --dist=loadgroup (the README's command is)")
    assert request.node.nodeid.endswith("@test_suite_groups.made_once"), request.node.nodeid
