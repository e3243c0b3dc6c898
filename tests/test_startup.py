"""`import repcap_fast` stays light: the heavy dependencies and the analysis submodules load on first
use (PEP 562), while the custom ops are registered at import. Each check runs in a fresh process."""

import json
import subprocess
import sys

import pytest

NOT_AT_IMPORT = (
    "triton",
    "torch._dynamo",
    "torch._inductor",
    "transformers",
    "matplotlib",
    "scipy",
    "repcap_fast.report",
    "repcap_fast.packing",
    "repcap_fast.fitting",
    "repcap_fast.models",
    "repcap_fast.monitor",
    "repcap_fast.integrations",
    "repcap_fast.plotting",
)


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_import_loads_none_of_the_heavy_modules_and_registers_the_ops():
    got = _fresh(
        "import json, sys, torch, repcap_fast\n"
        f"print(json.dumps({{'loaded': [m for m in {list(NOT_AT_IMPORT)!r} if m in sys.modules],\n"
        "  'ops': [hasattr(torch.ops.repcap_fast, n) for n in ('pairwise_cosine_stats', 'subspace_pga_ranks',\n"
        "          'gram_offdiag_penalty_rows', 'grassmann_normals')]}))"
    )
    assert got["loaded"] == []
    assert all(got["ops"])


def test_the_command_line_parser_loads_none_of_the_heavy_modules():
    got = _fresh(
        "import json, sys, repcap_fast.cli\n"
        "print(json.dumps([m for m in ('triton', 'torch._dynamo', 'transformers', 'matplotlib', 'scipy')\n"
        "  if m in sys.modules]))"
    )
    assert got == []


@pytest.mark.parametrize("name, module", [("capacity", "repcap_fast.capacity"), ("pga", "repcap_fast.pga"),
                                          ("hidden_states", "repcap_fast.models"),
                                          ("RepresentationMonitor", "repcap_fast.monitor")])
def test_a_lazy_name_loads_its_module_on_first_use(name, module):
    got = _fresh(
        f"import json, sys, repcap_fast\nbefore = {module!r} in sys.modules\nvalue = repcap_fast.{name}\n"
        f"print(json.dumps([before, {module!r} in sys.modules, value is getattr(repcap_fast, {name!r})]))"
    )
    assert got == [False, True, True]


def test_an_unknown_attribute_is_an_attribute_error_naming_it():
    import repcap_fast

    with pytest.raises(AttributeError, match="no_such_name"):
        repcap_fast.no_such_name  # noqa: B018
    assert "pga" in dir(repcap_fast) and "monitor" in dir(repcap_fast)
