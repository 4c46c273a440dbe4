"""The copy test's timing: each copy's wall time, and how much of it the copy and install took (a wheel another
copy was building is waited for there), printed at the end of the run."""
import pytest

SECONDS = pytest.StashKey[dict]()
INSTALL_SECONDS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def copy_seconds(request) -> dict:
    return request.config.stash.setdefault(SECONDS, {})


@pytest.fixture(scope="session")
def install_seconds(request) -> dict:
    return request.config.stash.setdefault(INSTALL_SECONDS, {})


def pytest_terminal_summary(terminalreporter, config):
    seconds, installs = config.stash.get(SECONDS, {}), config.stash.get(INSTALL_SECONDS, {})
    if seconds:
        terminalreporter.write_sep("-", "each copy's wall time: copy, virtualenv and install, then its tests")
        for step, s in sorted(seconds.items()):
            terminalreporter.write_line(f"{step}: {s:.0f} s ({installs[step]:.0f} s to install, "
                                        f"{s - installs[step]:.0f} s of tests)")
