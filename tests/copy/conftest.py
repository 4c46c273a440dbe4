"""The copy test's timing: each copy's wall time (install and tests), printed at the end of the run."""
import pytest

SECONDS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def copy_seconds(request) -> dict:
    return request.config.stash.setdefault(SECONDS, {})


def pytest_terminal_summary(terminalreporter, config):
    seconds = config.stash.get(SECONDS, {})
    if seconds:
        terminalreporter.write_sep("-", "each copy's wall time: copy, virtualenv, install, its tests")
        for step, s in sorted(seconds.items()):
            terminalreporter.write_line(f"{step}: {s:.0f} s")
