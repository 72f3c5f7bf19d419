"""The e2e modules' shared service (tests/e2e/shared.py): the session fixture, the tests that
use it run together (in their collection order otherwise), and it is stopped after the last of
them rather than at the end of the session (the modules after it measure a machine without an
idle service on it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e import shared
from tests.e2e.shared import SharedService

FIXTURE = "shared_service"


@pytest.fixture(scope="session")
def shared_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedService]:
    """The service shared by the e2e modules whose settings agree: see tests/e2e/shared.py
    (its URL, admin token, users' tokens, and its scriptable loopback upstreams)."""
    holder = SharedService(tmp_path_factory.mktemp("shared-e2e"))
    shared.CURRENT = holder
    try:
        yield holder
    finally:
        shared.CURRENT = None
        holder.close()


def _uses_it(item: pytest.Item | None) -> bool:
    return item is not None and FIXTURE in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared service run one after the other, where the first of them was
    collected: one start for them all. The other tests keep their order."""
    on_it = [item for item in items if _uses_it(item)]
    if not on_it:
        return
    first = items.index(on_it[0])
    others = [item for item in items if not _uses_it(item)]
    items[:] = [*others[:first], *on_it, *others[first:]]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test on it (its modules' fixtures torn down already), stop the service;
    the fakes go with the session."""
    if shared.CURRENT is not None and _uses_it(item) and not _uses_it(nextitem):
        shared.CURRENT.stop()
