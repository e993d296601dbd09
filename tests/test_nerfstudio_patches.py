"""nerfstudio_patches.py's start-up change: nerfstudio's external-method placeholders ask a cheap stack."""

from __future__ import annotations

import inspect
import subprocess
import sys

from bytesplat_ns.nerfstudio_patches import StackNamesOnly


def _names_both_ways() -> tuple[list[str], list[str]]:
    return [f.function for f in StackNamesOnly().stack()], [f.function for f in inspect.stack()]


def test_the_cheap_stack_names_the_same_functions_as_inspect():
    cheap, full = _names_both_ways()
    assert cheap == full
    assert cheap[:2] == ["_names_both_ways", "test_the_cheap_stack_names_the_same_functions_as_inspect"]
    assert StackNamesOnly().getmodule is inspect.getmodule  # the rest is the inspect module's


def test_ns_train_lists_external_methods_through_the_cheap_stack():
    """As ns-train starts (a fresh process, bytesplat loaded as a plugin): the placeholders were made with the
    cheap stack, and none of them took itself for a user's choice (that one would have exited)."""
    code = (
        "from nerfstudio.scripts.train import entrypoint\n"
        "from nerfstudio.configs import external_methods, method_configs\n"
        "assert type(external_methods.inspect).__name__ == 'StackNamesOnly', external_methods.inspect\n"
        "assert 'bytesplat' in method_configs.all_methods\n"
        "external = [m for m in method_configs.all_methods.values()\n"
        "            if isinstance(m, external_methods.ExternalMethodDummyTrainerConfig)]\n"
        "print(len(external))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip().splitlines()[-1]) > 0
