import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("ARCHSIM_HYPOTHESIS", "ci"))

# every test simulates: the kernel timing cache is off unless a test turns it on (tests/test_kernel_cache.py);
# subprocesses the tests start inherit this
os.environ["ARCHSIM_CACHE_DIR"] = "off"
# commands run in one process unless a test asks for workers (tests/test_workers.py): the test run
# already uses both cores
os.environ["ARCHSIM_WORKERS"] = "1"


@pytest.fixture(scope="module")
def h100():
    """The h100 machine config, loaded once a test module."""
    from archsim.config import load_machine

    return load_machine("h100")


@pytest.fixture
def asm():
    """Assemble a snippet: asm(text) -> Program (source name 'k.s')."""
    from archsim.isa.asm import assemble

    return lambda text, name="k.s": assemble(text, name)


@pytest.fixture(autouse=True)
def _no_kernel_cache_after_a_test():
    """A test that turned the kernel timing cache on (cli --cache, kernel_cache.configure) leaves
    it off for the tests after it in the same process."""
    yield
    from archsim import kernel_cache

    kernel_cache.configure(None, enabled=False)
    os.environ["ARCHSIM_CACHE_DIR"] = "off"
